//! The four reference models of the foundation issue, through mote and
//! compared with onnxruntime's outputs on the same inputs (max abs error
//! ≤ 1e-4), with their planned arena checked against its lower bound; and
//! `convbn`, whose BatchNormalization nodes the float rewrites fold.

use mote_core::optimize::float::Pass;
use mote_core::{Model, Session, SessionBuilder};
use mote_tests::models_dir;

/// Runs `model` on `input` (one input, one output).
fn run_once(model: &Model, input: &mote_std::Tensor) -> Vec<f32> {
    let in_name = model.input_names().next().expect("one input").to_string();
    let plan = SessionBuilder::new(model)
        .input_shape(&in_name, input.shape())
        .plan()
        .unwrap_or_else(|e| panic!("plan: {}", model.explain(&e)));
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(model, &plan, &mut arena).expect("session");
    s.run(&[(&in_name, input.view())])
        .unwrap_or_else(|e| panic!("run: {}", model.explain(&e)));
    s.output(0).expect("output").f32().expect("f32").to_vec()
}

#[test]
fn convbn_folds_batchnorm_and_matches_onnxruntime() {
    let path = mote_tests::test_model("convbn");
    let bytes = std::fs::read(&path).expect("model file");
    let model = Model::from_onnx(&bytes).expect("import");
    let plain = Model::from_onnx_unoptimized(&bytes).expect("import");
    let dir = models_dir();
    let input = mote_std::read_npy(dir.join("convbn.input.npy")).expect("input");
    let want = mote_std::read_npy(dir.join("convbn.expected.npy"))
        .expect("expected")
        .to_f32_vec();
    let count = |p: Pass| model.rewrites.iter().filter(|r| r.pass == p).count();
    assert_eq!(count(Pass::BatchNorm), 2, "{:#?}", model.rewrites);
    assert_eq!(count(Pass::Identity), 1, "Dropout: {:#?}", model.rewrites);
    assert_eq!(count(Pass::Gemm), 1, "{:#?}", model.rewrites);
    let ops: Vec<&str> = model
        .graph
        .nodes
        .iter()
        .map(|n| n.op_type.as_str())
        .collect();
    assert_eq!(count(Pass::Activation), 2, "{:#?}", model.rewrites);
    assert_eq!(
        ops,
        [
            "FusedConv",
            "FusedConv",
            "GlobalAveragePool",
            "Flatten",
            "Gemm"
        ]
    );
    assert_eq!(plain.graph.nodes.len(), 11);
    for (what, m) in [("optimized", &model), ("unoptimized", &plain)] {
        let got = run_once(m, &input);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-5 + 1e-3 * w.abs(),
                "{what}: {g} vs onnxruntime {w}"
            );
        }
    }
}

fn check(name: &str, dims: &[(&str, usize)]) {
    let dir = models_dir();
    let bytes = std::fs::read(dir.join(format!("{name}.onnx"))).expect("model file");
    let model = Model::from_onnx(&bytes)
        .unwrap_or_else(|e| panic!("{name}: {}", Model::default().explain(&e)));
    let input = mote_std::read_npy(dir.join(format!("{name}.input.npy"))).expect("input npy");
    let expected =
        mote_std::read_npy(dir.join(format!("{name}.expected.npy"))).expect("expected npy");
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
    s.run(&[(&in_name, input.view())])
        .unwrap_or_else(|e| panic!("{name}: run: {}", model.explain(&e)));
    let out = s.output(0).expect("output");
    assert_eq!(out.shape(), expected.shape(), "{name}: output shape");
    let got = out.f32().expect("f32 output").to_vec();
    let want = expected.to_f32_vec();
    let mut worst = 0f32;
    for (g, w) in got.iter().zip(&want) {
        worst = worst.max((g - w).abs());
    }
    let (arena_b, lb) = (plan.arena_bytes(), plan.lower_bound());
    println!(
        "{name}: max abs err {worst:.2e}, arena {arena_b} B, lower bound {lb} B ({:.3}x), {} steps",
        arena_b as f64 / lb.max(1) as f64,
        plan.num_steps()
    );
    assert!(worst <= 1e-4, "{name}: max abs error {worst} > 1e-4");
    assert!(
        arena_b as f64 <= 1.10 * lb as f64,
        "{name}: arena {arena_b} > 1.10 x lower bound {lb}"
    );
    // A second run on the same arena gives the same result.
    s.run(&[(&in_name, input.view())]).expect("second run");
    assert_eq!(s.output(0).expect("output").f32().expect("f32"), &got[..]);
}

#[test]
fn mlp_matches_onnxruntime() {
    check("mlp", &[]);
}

#[test]
fn cnn_matches_onnxruntime() {
    check("cnn", &[]);
}

#[test]
fn mobilenet_matches_onnxruntime() {
    check("mobilenet", &[]);
}

#[test]
fn dynamic_batch_matches_onnxruntime() {
    check("dynamic", &[("batch", 2)]);
}

#[test]
fn dynamic_batch_folds_shape_subgraph() {
    let bytes = std::fs::read(models_dir().join("dynamic.onnx")).expect("model");
    let model = Model::from_onnx(&bytes).expect("import");
    let plan = SessionBuilder::new(&model)
        .dim("batch", 3)
        .plan()
        .expect("plan");
    // Shape, Gather, Unsqueeze, Concat are folded: only Conv, Relu, (Reshape is
    // a view) and Gemm remain as kernels.
    let ops: Vec<&str> = plan
        .step_nodes()
        .map(|n| model.graph.nodes[n as usize].op_type.as_str())
        .collect();
    assert!(
        !ops.iter()
            .any(|o| ["Shape", "Gather", "Unsqueeze", "Concat"].contains(o)),
        "not folded: {ops:?}"
    );
    assert_eq!(plan.outputs()[0].shape, vec![3, 5]);
    assert!(plan.defaulted_dims().is_empty());
    // Unbound: defaults to 1 and says so.
    let plan = SessionBuilder::new(&model).plan().expect("plan");
    assert_eq!(plan.defaulted_dims(), ["batch"]);
    assert_eq!(plan.outputs()[0].shape, vec![1, 5]);
}

#[test]
fn shipped_digits_model_runs() {
    let bytes =
        std::fs::read(mote_tests::repo().join("models/digits_mlp.onnx")).expect("shipped model");
    let model = Model::from_onnx(&bytes).expect("import");
    let x =
        mote_std::read_npy(mote_tests::repo().join("models/digits_sample.npy")).expect("sample");
    let plan = SessionBuilder::new(&model)
        .dim("batch", 1)
        .plan()
        .expect("plan");
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&model, &plan, &mut arena).expect("session");
    s.run(&[("input", x.view())]).expect("run");
    assert_eq!(s.output(0).expect("out").shape(), &[1, 10]);
}
