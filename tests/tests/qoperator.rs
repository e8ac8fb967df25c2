//! onnxruntime's com.microsoft QOperator kernels against onnxruntime.
//!
//! Cases come from `scripts/make_qop_cases.py` (in `MOTE_QOP_DIR` or
//! `.cache/qop-cases`, generated on first use). Per op: every element within
//! 1 LSB of onnxruntime (f32 QGemm outputs: within 1e-5 relative), and at
//! least 99.9% of elements exactly equal over that op's cases.

use std::collections::BTreeMap;
use std::path::PathBuf;

use mote_std::Session;
use mote_tests::generated_dir;

fn cases_dir() -> PathBuf {
    generated_dir(
        "MOTE_QOP_DIR",
        "qop-cases",
        "make_qop_cases.py",
        ".complete",
    )
}

#[test]
fn qoperator_matches_onnxruntime() {
    let dir = cases_dir();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("cases dir")
        .filter_map(|e| {
            let n = e.ok()?.file_name().into_string().ok()?;
            n.strip_suffix(".onnx").map(String::from)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 60, "only {} cases", names.len());
    // op -> (elements, exact, cases)
    let mut per: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    for name in &names {
        let op = name.split('_').next().unwrap_or("").to_string();
        let mut s = Session::from_file(dir.join(format!("{name}.onnx")))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let in_names: Vec<String> = s.inputs().iter().map(|i| i.name.clone()).collect();
        let mut feeds = Vec::new();
        for (i, n) in in_names.iter().enumerate() {
            let t = mote_std::read_npy(dir.join(format!("{name}.in{i}.npy"))).expect("input npy");
            feeds.push((n.as_str(), t));
        }
        let out = s.run(&feeds).unwrap_or_else(|e| panic!("{name}: run: {e}"));
        let want = mote_std::read_npy(dir.join(format!("{name}.expected.npy"))).expect("npy");
        let got = &out[0];
        assert_eq!(got.shape(), want.shape(), "{name}: shape");
        assert_eq!(got.dtype(), want.dtype(), "{name}: dtype");
        let e = per.entry(op).or_default();
        e.2 += 1;
        let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
        let float = got.dtype() == mote_core::DType::F32;
        for (k, (a, b)) in g.iter().zip(&w).enumerate() {
            e.0 += 1;
            if a == b {
                e.1 += 1;
            } else if float {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "{name}[{k}]: got {a}, onnxruntime {b}"
                );
            } else {
                assert!(
                    (a - b).abs() <= 1.0,
                    "{name}[{k}]: got {a}, onnxruntime {b} (> 1 LSB)"
                );
            }
        }
    }
    let mut bad = Vec::new();
    for (op, (n, exact, cases)) in &per {
        let f = *exact as f64 / (*n).max(1) as f64;
        println!(
            "{op}: {cases} cases, {n} elements, exact {exact} ({:.4}%)",
            100.0 * f
        );
        if f < 0.999 {
            bad.push(op.clone());
        }
    }
    assert_eq!(
        per.len(),
        8,
        "ops covered: {:?}",
        per.keys().collect::<Vec<_>>()
    );
    assert!(bad.is_empty(), "below 99.9% exact: {bad:?}");
}
