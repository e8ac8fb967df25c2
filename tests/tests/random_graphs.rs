//! Random small graphs against onnxruntime: every graph output, including
//! intermediate values that later nodes also read, a Split's second output
//! and a graph input passed through, must come out as onnxruntime computes
//! it. This is where the planner's buffer sharing (in-place steps, views)
//! and the optimizer's fusions can go wrong silently.
//!
//! Cases come from `scripts/make_random_graphs.py` (in `MOTE_RANDOM_GRAPHS`
//! or `.cache/random-graphs`, generated on first use). Each graph runs with
//! the default session options and with in-place steps off; both must match
//! within rtol 1e-4 plus 1e-5 of the output's largest magnitude (f32 sums
//! through up to 14 ops in another order than onnxruntime's).

use std::path::PathBuf;

use mote_core::{Model, Session, SessionBuilder, TensorView};
use mote_tests::generated_dir;

fn cases_dir() -> PathBuf {
    generated_dir(
        "MOTE_RANDOM_GRAPHS",
        "random-graphs",
        "make_random_graphs.py",
        ".complete",
    )
}

fn npy(path: PathBuf) -> (Vec<usize>, Vec<f32>) {
    let t = mote_std::read_npy(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (t.shape().to_vec(), t.to_f32_vec())
}

/// Runs `model` on `inputs` and checks each output against `want`.
fn check(
    name: &str,
    model: &Model,
    in_place: bool,
    inputs: &[(String, Vec<usize>, Vec<f32>)],
    want: &[(Vec<usize>, Vec<f32>)],
) {
    let tag = format!("{name} (in place {in_place})");
    let plan = SessionBuilder::new(model)
        .in_place(in_place)
        .plan()
        .unwrap_or_else(|e| panic!("{tag}: plan: {}", model.explain(&e)));
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(model, &plan, &mut arena).unwrap_or_else(|e| panic!("{tag}: {e}"));
    let feeds: Vec<(&str, TensorView<'_>)> = inputs
        .iter()
        .map(|(n, sh, v)| (n.as_str(), TensorView::new(sh, v).expect("view")))
        .collect();
    s.run(&feeds)
        .unwrap_or_else(|e| panic!("{tag}: run: {}", model.explain(&e)));
    for (k, (shape, w)) in want.iter().enumerate() {
        let out = s
            .output(k)
            .unwrap_or_else(|e| panic!("{tag}: output {k}: {e}"));
        assert_eq!(out.shape(), shape.as_slice(), "{tag}: output {k} shape");
        let got = out
            .f32()
            .unwrap_or_else(|e| panic!("{tag}: output {k}: {e}"));
        let scale = w.iter().fold(1f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs() + 1e-5 * scale,
                "{tag}: output {k}[{i}]: mote {a}, onnxruntime {b}"
            );
        }
    }
}

#[test]
fn random_graphs_match_onnxruntime() {
    let dir = cases_dir();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("cases dir")
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_suffix(".onnx").map(String::from)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 100, "only {} cases", names.len());
    for name in &names {
        let bytes = std::fs::read(dir.join(format!("{name}.onnx"))).expect("model");
        let model = Model::from_onnx(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let inputs: Vec<(String, Vec<usize>, Vec<f32>)> = model
            .input_names()
            .enumerate()
            .map(|(i, n)| {
                let (sh, v) = npy(dir.join(format!("{name}.in{i}.npy")));
                (n.to_string(), sh, v)
            })
            .collect();
        let want: Vec<(Vec<usize>, Vec<f32>)> = (0..model.output_names().count())
            .map(|k| npy(dir.join(format!("{name}.out{k}.npy"))))
            .collect();
        for in_place in [true, false] {
            check(name, &model, in_place, &inputs, &want);
        }
    }
}
