//! float16 models: the test models (and a small conv net) converted by
//! onnxconverter-common's `float16.convert_float_to_float16`, with f16 input
//! and output (`NAME_f16`) or with f32 ones and Casts at the edges
//! (`NAME_f16io`), through mote and compared with onnxruntime's run of the
//! same f16 model (`scripts/make_f16_models.py`, generated into
//! `MOTE_F16_MODELS` or `.cache/f16-models` on first use).
//!
//! Tolerance: `|got - want| <= atol + rtol * |want|` with rtol 1e-2 and
//! atol 1e-3. Both runtimes round every intermediate tensor to f16, but in
//! different places inside a layer (mote accumulates a whole dot product in
//! f32 and rounds once; ORT's kernels may round partial results or use
//! another summation order), so a layer output can differ by one f16 ulp and
//! the difference travels to the end. The outputs are softmax probabilities
//! or logits of magnitude about 1, where one f16 ulp is 9.8e-4: atol 1e-3
//! covers that for the near-zero outputs, where a pure rtol is meaningless.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;
use std::sync::OnceLock;

use mote_core::{DType, Model, Session, SessionBuilder};
use mote_tests::generated_dir;

/// Counts heap allocations per thread (the test harness allocates on its
/// own threads meanwhile), to check f16 runs allocate nothing either.
struct Counting;

thread_local! {
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

fn allocs() -> usize {
    ALLOCS.with(Cell::get)
}

// SAFETY: forwards to the system allocator, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const RTOL: f64 = 1e-2;
const ATOL: f64 = 1e-3;

fn f16_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        generated_dir(
            "MOTE_F16_MODELS",
            "f16-models",
            "make_f16_models.py",
            "convnet_f16io.expected.npy",
        )
    })
    .clone()
}

/// Plans and runs model `name` of `dir` on its recorded input; returns the
/// output (as f64), its dtype and the planned arena bytes.
fn run(dir: &std::path::Path, name: &str, dims: &[(&str, usize)]) -> (Vec<f64>, DType, usize) {
    let bytes = std::fs::read(dir.join(format!("{name}.onnx"))).expect("model file");
    let model = Model::from_onnx(&bytes)
        .unwrap_or_else(|e| panic!("{name}: {}", Model::default().explain(&e)));
    let input = mote_std::read_npy(dir.join(format!("{name}.input.npy"))).expect("input npy");
    let in_name = model.input_names().next().expect("one input").to_string();
    let mut b = SessionBuilder::new(&model).input_shape(&in_name, input.shape());
    for (d, v) in dims {
        b = b.dim(d, *v);
    }
    let plan = b
        .plan()
        .unwrap_or_else(|e| panic!("{name}: plan: {}", model.explain(&e)));
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&model, &plan, &mut arena).expect("session");
    let feeds = [(in_name.as_str(), input.view())];
    s.run(&feeds)
        .unwrap_or_else(|e| panic!("{name}: run: {}", model.explain(&e)));
    // A second run allocates nothing (f32 staging lives in the arena).
    let before = allocs();
    s.run(&feeds).expect("second run");
    let n = allocs() - before;
    assert_eq!(n, 0, "{name}: Session::run allocated {n} times");
    let out = s.output(0).expect("output");
    let vals: Vec<f64> = (0..out.numel())
        .map(|i| out.f64_at(i).expect("float output"))
        .collect();
    (vals, out.dtype(), plan.arena_bytes())
}

fn check(name: &str, dims: &[(&str, usize)]) {
    let dir = f16_dir();
    for (suffix, out_dt) in [("f16", DType::F16), ("f16io", DType::F32)] {
        let full = format!("{name}_{suffix}");
        let (got, dt, arena) = run(&dir, &full, dims);
        assert_eq!(dt, out_dt, "{full}: output dtype");
        let want = mote_std::read_npy(dir.join(format!("{full}.expected.npy")))
            .expect("expected npy")
            .to_f64_vec();
        let f32_ref = mote_std::read_npy(dir.join(format!("{full}.f32.npy")))
            .expect("f32 npy")
            .to_f64_vec();
        assert_eq!(got.len(), want.len(), "{full}: output size");
        let (mut worst, mut worst_rel, mut vs_f32) = (0f64, 0f64, 0f64);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let err = (g - w).abs();
            assert!(
                err <= ATOL + RTOL * w.abs(),
                "{full}: element {i}: mote {g}, onnxruntime {w}"
            );
            worst = worst.max(err);
            worst_rel = worst_rel.max(err / w.abs().max(1e-3));
            vs_f32 = vs_f32.max((g - f32_ref[i]).abs());
        }
        // The f32 model's arena, for the storage comparison.
        let (_, _, arena32) = run(&dir, &format!("{name}_f32"), dims);
        println!(
            "{full}: max abs err vs ORT f16 {worst:.2e} (rel {worst_rel:.2e}), \
             vs ORT f32 model {vs_f32:.2e}; arena {arena} B (f32 model {arena32} B)"
        );
        if suffix == "f16" {
            // Every activation is f16 in the arena: well under the f32 plan
            // (the f32 accumulators of one Conv output plane or one Gemm
            // output, as scratch, keep it above 1/2: mlp is at 0.75).
            assert!(
                (arena as f64) < 0.8 * arena32 as f64,
                "{full}: arena {arena} B not below 0.8 x f32 model's {arena32} B"
            );
        }
    }
}

#[test]
fn mlp_f16_matches_onnxruntime() {
    check("mlp", &[]);
}

#[test]
fn cnn_f16_matches_onnxruntime() {
    check("cnn", &[]);
}

#[test]
fn mobilenet_f16_matches_onnxruntime() {
    check("mobilenet", &[]);
}

#[test]
fn dynamic_f16_matches_onnxruntime() {
    check("dynamic", &[("batch", 2)]);
}

#[test]
fn convnet_f16_matches_onnxruntime() {
    check("convnet", &[]);
}

/// `Model::weights_to_f16` on the f32 test models: Conv / MatMul / Gemm
/// weights stored as f16, activations still f32, output close to ORT's f32
/// run (rtol 1e-2, atol 1e-3 as above: the weights' rounding is the f16
/// model's only difference from f32 here).
#[test]
fn f32_models_with_f16_weights() {
    let dir = mote_tests::models_dir();
    for (name, dims) in [
        ("mlp", &[][..]),
        ("cnn", &[][..]),
        ("mobilenet", &[][..]),
        ("dynamic", &[("batch", 2)][..]),
    ] {
        let bytes = std::fs::read(dir.join(format!("{name}.onnx"))).expect("model file");
        let mut model = Model::from_onnx(&bytes).expect("import");
        let (before, after) = model.weights_to_f16();
        let input = mote_std::read_npy(dir.join(format!("{name}.input.npy"))).expect("input");
        let want = mote_std::read_npy(dir.join(format!("{name}.expected.npy")))
            .expect("expected")
            .to_f64_vec();
        let in_name = model.input_names().next().expect("one input").to_string();
        let mut b = SessionBuilder::new(&model).input_shape(&in_name, input.shape());
        for (d, v) in dims {
            b = b.dim(d, *v);
        }
        let plan = b
            .plan()
            .unwrap_or_else(|e| panic!("{name}: plan: {}", model.explain(&e)));
        let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
        let mut s = Session::new(&model, &plan, &mut arena).expect("session");
        let feeds = [(in_name.as_str(), input.view())];
        s.run(&feeds)
            .unwrap_or_else(|e| panic!("{name}: run: {}", model.explain(&e)));
        let before_allocs = allocs();
        s.run(&feeds).expect("second run");
        assert_eq!(allocs(), before_allocs, "{name}: Session::run allocated");
        let out = s.output(0).expect("output");
        assert_eq!(out.dtype(), DType::F32, "{name}: output stays f32");
        let mut worst = 0f64;
        for (i, w) in want.iter().enumerate() {
            let g = out.f64_at(i).expect("float");
            let err = (g - w).abs();
            assert!(
                err <= ATOL + RTOL * w.abs(),
                "{name}: element {i}: mote {g}, onnxruntime f32 {w}"
            );
            worst = worst.max(err);
        }
        println!(
            "{name}: weights {before} B -> {after} B ({:.3}x), max abs err vs ORT f32 {worst:.2e}",
            after as f64 / before as f64
        );
        // Almost all bytes are weights of the four ops (biases and BN
        // parameters stay f32).
        assert!(
            (after as f64) < 0.6 * before as f64,
            "{name}: {after} B not below 0.6 x {before} B"
        );
    }
}

#[test]
fn allocation_counter_counts() {
    let before = allocs();
    let v = std::hint::black_box(vec![1u8; 64]);
    assert!(allocs() > before && v.len() == 64);
}
