//! Hostile models (issue 8): each ends in a clean `Err` that says what is
//! wrong, before anything proportional to the lie is allocated, and
//! without a hang. The counting allocator of this test binary checks the
//! "before allocating" part: no test here may allocate more than
//! [`PEAK_LIMIT`] bytes at once.
//!
//! Cycles, self-referencing nodes, duplicate producers, `raw_data` shorter
//! than its shape, dims overflowing `usize` and opsets from the future are
//! in `malformed.rs`; the inputs the fuzzers found are at the end of this
//! file.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use mote_core::{ErrorKind, Model, Session, SessionBuilder, TensorView};
use mote_proto as pb;
use mote_tests::onnx::{
    attr_float, attr_graph, attr_int, attr_ints, attr_str, attr_tensor, elem, graph, model,
    model_proto, node, tensor_f32, tensor_i64, tensor_raw, vi, with_attrs,
};
use prost::Message;

/// The largest single allocation any test here may make.
const PEAK_LIMIT: usize = 64 << 20;

struct Largest;
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, recording the largest request.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LARGEST.fetch_max(n, Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Largest = Largest;

/// `y = x + w` over `n` floats, `w` the initializer given.
fn x_plus_w(w: pb::TensorProto, n: i64) -> Vec<u8> {
    model(
        vec![node("Add", "a", &["x", "w"], &["y"])],
        vec![vi("x", elem::F32, &[n])],
        vec![vi("y", elem::F32, &[n])],
        vec![w],
    )
}

/// Plans `bytes` with defaults; the error of import or plan, explained
/// with the model's names.
fn refused(bytes: &[u8]) -> (mote_core::Error, String) {
    match Model::from_onnx(bytes) {
        Err(e) => (e, mote_core::onnx::explain_import_bytes(bytes, &e)),
        Ok(m) => {
            let e = SessionBuilder::new(&m)
                .plan()
                .expect_err("hostile model was planned");
            (e, m.explain(&e).to_string())
        }
    }
}

fn assert_small_allocations() {
    let l = LARGEST.load(Ordering::SeqCst);
    assert!(
        l <= PEAK_LIMIT,
        "an allocation of {l} bytes (limit {PEAK_LIMIT})"
    );
}

#[test]
fn dims_overflowing_32_bit_sizes() {
    // 65536 × 65536 elements: 2^32, past u32 and a 32-bit usize; on a
    // 64-bit host it is a 16 GiB tensor that a budget refuses.
    let b = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![vi("x", elem::F32, &[65536, 65536])],
        vec![vi("y", elem::F32, &[65536, 65536])],
        vec![],
    );
    let m = Model::from_onnx(&b).expect("import");
    let e = SessionBuilder::new(&m)
        .max_memory(1 << 30)
        .plan()
        .expect_err("over budget");
    assert!(matches!(e.kind, ErrorKind::OverBudget { .. }), "{e:?}");
    // An initializer of 2^32 elements with 4 bytes of data.
    let t = tensor_raw("w", elem::F32, &[65536, 65536], &[0u8; 4]);
    let b = x_plus_w(t, 1);
    let e = Model::from_onnx(&b).expect_err("short data");
    assert!(
        matches!(e.kind, ErrorKind::Len { .. } | ErrorKind::Overflow),
        "{e:?}"
    );
    assert_small_allocations();
}

#[test]
fn negative_and_zero_dims() {
    // A negative dim in a value info is unknown: it defaults to 1 and is
    // reported, as a symbolic dim would be.
    let b = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![vi("x", elem::F32, &[-5, 2])],
        vec![vi("y", elem::F32, &[-5, 2])],
        vec![],
    );
    let m = Model::from_onnx(&b).expect("import");
    let plan = SessionBuilder::new(&m).plan().expect("plan");
    assert_eq!(plan.inputs()[0].shape, [1, 2]);
    assert_eq!(plan.defaulted_dims(), ["x[0]"]);
    // Zero dims are empty tensors: they plan and run.
    let plan = SessionBuilder::new(&m)
        .input_shape("x", &[0, 2])
        .plan()
        .expect("plan");
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&m, &plan, &mut arena).expect("session");
    s.run(&[("x", TensorView::new(&[0, 2], &[0f32; 0]).expect("view"))])
        .expect("run");
    assert_eq!(s.output(0).expect("y").shape(), [0, 2]);
    // A negative dim in tensor data is an error naming the rule.
    let t = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![2, -1],
        data_type: Some(elem::F32),
        ..Default::default()
    };
    let b = x_plus_w(t, 1);
    let e = Model::from_onnx(&b).expect_err("negative dim");
    assert_eq!(
        e.kind,
        ErrorKind::Shape("negative dimension in tensor data")
    );
}

#[test]
fn constant_of_shape_of_a_trillion_elements() {
    let b = model(
        vec![with_attrs(
            node("ConstantOfShape", "big", &["s"], &["y"]),
            vec![attr_tensor("value", tensor_f32("", &[1], &[1.0]))],
        )],
        vec![],
        vec![vi("y", elem::F32, &[1_000_000, 1_000_000])],
        vec![tensor_i64("s", &[2], &[1_000_000, 1_000_000])],
    );
    let (e, msg) = refused(&b);
    assert!(matches!(e.kind, ErrorKind::OverBudget { .. }), "{e:?}");
    assert!(
        msg.contains("budget") && msg.contains("node 'big'"),
        "{msg}"
    );
    // The same with a caller's budget.
    let m = Model::from_onnx(&b).expect("import");
    let e = SessionBuilder::new(&m)
        .max_memory(1 << 20)
        .plan()
        .expect_err("budget");
    assert!(matches!(e.kind, ErrorKind::OverBudget { .. }), "{e:?}");
    // And as a run-time shape (input-dependent): the arena is refused.
    let b = model(
        vec![
            node("Shape", "shape", &["x"], &["s"]),
            node("Mul", "mul", &["s", "k"], &["s2"]),
            node("ConstantOfShape", "big", &["s2"], &["y"]),
        ],
        vec![vi("x", elem::F32, &[1000, 1000])],
        vec![vi("y", elem::F32, &[])],
        vec![tensor_i64("k", &[2], &[1000, 1000])],
    );
    let m = Model::from_onnx(&b).expect("import");
    let e = SessionBuilder::new(&m)
        .max_memory(1 << 30)
        .plan()
        .expect_err("budget");
    assert!(matches!(e.kind, ErrorKind::OverBudget { .. }), "{e:?}");
    assert_small_allocations();
}

#[test]
fn weights_over_the_budget_are_refused_before_planning() {
    let w: Vec<f32> = vec![0.5; 4096];
    let b = x_plus_w(tensor_f32("w", &[4096], &w), 4096);
    let m = Model::from_onnx(&b).expect("import");
    let e = SessionBuilder::new(&m)
        .max_memory(8 << 10)
        .plan()
        .expect_err("16 KiB of weights");
    assert_eq!(
        e.kind,
        ErrorKind::OverBudget {
            needed: 16384,
            budget: 8192
        }
    );
    // Weights and arena together: 16 KiB + 16 KiB (y written over x).
    let plan = SessionBuilder::new(&m)
        .max_memory(32 << 10)
        .plan()
        .expect("fits");
    assert_eq!(plan.arena_bytes(), 16384);
    let e = SessionBuilder::new(&m)
        .max_memory((32 << 10) - 1)
        .plan()
        .expect_err("one byte short");
    assert!(matches!(e.kind, ErrorKind::OverBudget { .. }), "{e:?}");
}

#[test]
fn reshape_to_a_mismatched_count_or_negative_sizes() {
    // x [2, 3] reshaped by the constant `shape`: both refused at plan time,
    // naming the node.
    for shape in [&[7][..], &[-2, -3]] {
        let b = model(
            vec![node("Reshape", "r", &["x", "s"], &["y"])],
            vec![vi("x", elem::F32, &[2, 3])],
            vec![vi("y", elem::F32, &[6])],
            vec![tensor_i64("s", &[shape.len() as i64], shape)],
        );
        let (e, msg) = refused(&b);
        assert!(matches!(e.kind, ErrorKind::Shape(_)), "{shape:?}: {e:?}");
        assert!(msg.contains("node 'r'") && msg.contains("Reshape"), "{msg}");
    }
}

#[test]
fn duplicate_output_names() {
    // One node naming the same output twice.
    let b = model(
        vec![with_attrs(
            node("Split", "s", &["x"], &["y", "y"]),
            vec![attr_int("axis", 0)],
        )],
        vec![vi("x", elem::F32, &[4])],
        vec![vi("y", elem::F32, &[2])],
        vec![],
    );
    let (e, _) = refused(&b);
    assert!(matches!(e.kind, ErrorKind::Invalid(_)), "{e:?}");
    // A node writing over a graph input.
    let b = model(
        vec![node("Relu", "r", &["x"], &["x"])],
        vec![vi("x", elem::F32, &[4])],
        vec![vi("x", elem::F32, &[4])],
        vec![],
    );
    let (e, _) = refused(&b);
    assert!(
        matches!(e.kind, ErrorKind::Invalid(_) | ErrorKind::Cycle),
        "{e:?}"
    );
    // A node writing over an initializer.
    let b = model(
        vec![node("Relu", "r", &["x"], &["w"])],
        vec![vi("x", elem::F32, &[1])],
        vec![vi("w", elem::F32, &[1])],
        vec![tensor_f32("w", &[1], &[1.0])],
    );
    let (e, _) = refused(&b);
    assert!(matches!(e.kind, ErrorKind::Invalid(_)), "{e:?}");
}

#[test]
fn declared_and_stored_dtypes_disagree() {
    // An initializer stored as int64 but declared (as a graph input of the
    // same name) float.
    let b = model(
        vec![node("Relu", "r", &["w"], &["y"])],
        vec![vi("w", elem::F32, &[2])],
        vec![vi("y", elem::F32, &[2])],
        vec![tensor_i64("w", &[2], &[1, 2])],
    );
    let (e, msg) = refused(&b);
    assert_eq!(
        e.kind,
        ErrorKind::Invalid("an initializer's stored dtype differs from its declared one")
    );
    assert!(msg.contains("'w'"), "{}", msg);
    // A tensor whose data_type says float but whose values are in the
    // int64 field.
    let t = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![2],
        data_type: Some(elem::F32),
        int64_data: vec![1, 2],
        ..Default::default()
    };
    let b = x_plus_w(t, 2);
    let e = Model::from_onnx(&b).expect_err("float tensor with int64 data");
    assert!(matches!(e.kind, ErrorKind::Len { .. }), "{e:?}");
    // An unknown dtype code.
    let t = tensor_raw("w", 99, &[1], &[0; 4]);
    let b = x_plus_w(t, 1);
    let e = Model::from_onnx(&b).expect_err("dtype 99");
    assert!(
        matches!(e.kind, ErrorKind::UnsupportedDType { code: 99, .. }),
        "{e:?}"
    );
}

/// A Loop whose condition stays true and that has no trip count: it would
/// run forever.
fn endless_loop(trip: Option<i64>) -> Vec<u8> {
    let body = graph(
        vec![
            node("Identity", "keep", &["cond"], &["cond_out"]),
            node("Add", "inc", &["v", "one"], &["v_out"]),
        ],
        vec![
            vi("i", elem::I64, &[]),
            vi("cond", elem::BOOL, &[]),
            vi("v", elem::F32, &[1]),
        ],
        vec![
            vi("cond_out", elem::BOOL, &[]),
            vi("v_out", elem::F32, &[1]),
        ],
        vec![tensor_f32("one", &[1], &[1.0])],
    );
    let (ins, mut inits) = (
        ["m", "c", "x"],
        vec![tensor_raw("c", elem::BOOL, &[], &[1])],
    );
    if let Some(t) = trip {
        inits.push(tensor_i64("m", &[], &[t]));
    }
    let ins: Vec<&str> = ins
        .iter()
        .map(|&n| if n == "m" && trip.is_none() { "" } else { n })
        .collect();
    model(
        vec![with_attrs(
            node("Loop", "loop", &ins, &["y"]),
            vec![attr_graph("body", body)],
        )],
        vec![vi("x", elem::F32, &[1])],
        vec![vi("y", elem::F32, &[1])],
        inits,
    )
}

#[test]
fn loops_stop_at_the_iteration_bound() {
    for trip in [None, Some(i64::MAX)] {
        let m = Model::from_onnx(&endless_loop(trip)).expect("import");
        let plan = SessionBuilder::new(&m)
            .max_loop_iterations(1000)
            .plan()
            .expect("plan");
        let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
        let mut s = Session::new(&m, &plan, &mut arena).expect("session");
        let e = s
            .run(&[("x", TensorView::new(&[1], &[0f32]).expect("view"))])
            .expect_err("endless");
        assert_eq!(e.kind, ErrorKind::LoopLimit { limit: 1000 }, "{trip:?}");
        let msg = m.explain(&e).to_string();
        assert!(
            msg.contains("1000 iterations") && msg.contains("node 'loop'"),
            "{msg}"
        );
    }
    // Within the bound, the loop runs to its trip count.
    let m = Model::from_onnx(&endless_loop(Some(1000))).expect("import");
    let plan = SessionBuilder::new(&m)
        .max_loop_iterations(1000)
        .plan()
        .expect("plan");
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&m, &plan, &mut arena).expect("session");
    s.run(&[("x", TensorView::new(&[1], &[0f32]).expect("view"))])
        .expect("1000 iterations");
    assert_eq!(s.output(0).expect("y").f32().expect("f32"), [1000.0]);
}

#[test]
fn a_loop_folded_at_build_time_is_bounded_too() {
    // All inputs constant: the Loop is evaluated while planning.
    let mut p = pb::ModelProto::decode(&endless_loop(None)[..]).expect("decode");
    let g = p.graph.as_mut().expect("graph");
    g.input.clear();
    g.initializer.push(tensor_f32("x", &[1], &[0.0]));
    let m = Model::from_onnx(&p.encode_to_vec()).expect("import");
    let e = SessionBuilder::new(&m)
        .max_loop_iterations(50)
        .plan()
        .expect_err("endless loop folded");
    assert_eq!(e.kind, ErrorKind::LoopLimit { limit: 50 });
}

/// `depth` If nodes, each the then-branch of the one above.
fn nested_ifs(depth: usize) -> Vec<u8> {
    let mut inner = graph(
        vec![node("Identity", "leaf", &["x"], &["r0"])],
        vec![],
        vec![vi("r0", elem::F32, &[1])],
        vec![],
    );
    let leaf = inner.clone();
    for k in 1..depth {
        let out = format!("r{k}");
        inner = graph(
            vec![with_attrs(
                node("If", &format!("if{k}"), &["c"], &[&out]),
                vec![
                    attr_graph("then_branch", inner),
                    attr_graph("else_branch", leaf.clone()),
                ],
            )],
            vec![],
            vec![vi(&out, elem::F32, &[1])],
            vec![],
        );
    }
    let last = format!("r{}", depth - 1);
    let mut g = inner;
    g.input = vec![vi("x", elem::F32, &[1]), vi("c", elem::BOOL, &[])];
    g.output = vec![vi(&last, elem::F32, &[1])];
    model_proto(g, 13).encode_to_vec()
}

#[test]
fn deep_subgraph_nesting_is_bounded() {
    // Within mote's bound (32 levels), a nested model imports.
    Model::from_onnx(&nested_ifs(8)).expect("8 levels");
    // Past it: a clean error, from mote's bound or from the protobuf
    // decoder's own recursion bound (100 messages deep: 3 per If level),
    // which answers first; no stack overflow either way.
    for depth in [40, 300] {
        let e = Model::from_onnx(&nested_ifs(depth)).expect_err("too deep");
        assert!(
            matches!(
                e.kind,
                ErrorKind::Decode | ErrorKind::Invalid("subgraphs nested too deeply")
            ),
            "{depth}: {e:?}"
        );
    }
}

#[test]
fn attributes_of_the_wrong_type() {
    let cases: Vec<(&str, pb::NodeProto, &str)> = vec![
        (
            "Conv strides as a float",
            with_attrs(
                node("Conv", "c", &["x", "w"], &["y"]),
                vec![attr_float("strides", 2.0)],
            ),
            "strides",
        ),
        (
            "Softmax axis as a string",
            with_attrs(
                node("Softmax", "c", &["x"], &["y"]),
                vec![attr_str("axis", "1")],
            ),
            "axis",
        ),
        (
            "Transpose perm out of range",
            with_attrs(
                node("Transpose", "c", &["x"], &["y"]),
                vec![attr_ints("perm", &[0, 1, 2, 9])],
            ),
            "perm",
        ),
        (
            "Conv group as a list",
            with_attrs(
                node("Conv", "c", &["x", "w"], &["y"]),
                vec![attr_ints("group", &[1, 2])],
            ),
            "group",
        ),
    ];
    for (what, n, attr) in cases {
        let b = model(
            vec![n],
            vec![vi("x", elem::F32, &[1, 1, 4, 4])],
            vec![vi("y", elem::F32, &[])],
            vec![tensor_f32("w", &[1, 1, 1, 1], &[1.0])],
        );
        let (e, msg) = refused(&b);
        assert!(
            matches!(e.kind, ErrorKind::Attribute { .. }) && msg.contains(attr),
            "{what}: {e:?} {msg}"
        );
        assert!(msg.contains("node 'c'"), "{what}: {msg}");
    }
}

#[test]
fn graph_outputs_that_nothing_produces() {
    let b = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![vi("x", elem::F32, &[1])],
        vec![vi("nobody", elem::F32, &[1])],
        vec![],
    );
    let (e, msg) = refused(&b);
    assert_eq!(e.kind, ErrorKind::MissingTensor);
    assert!(msg.contains("'nobody'"), "{}", msg);
}

// Inputs the fuzzers found (scripts/fuzz.sh), rebuilt here by hand.

#[test]
fn fuzz_window_of_four_billion_values() {
    // graph_run: a BlackmanWindow whose constant size made prepare
    // allocate 32 GB for the window table before anything checked it.
    for op in ["BlackmanWindow", "HannWindow", "HammingWindow"] {
        let b = mote_tests::onnx::model_proto(
            graph(
                vec![node(op, "w", &["n"], &["y"])],
                vec![],
                vec![vi("y", elem::F32, &[])],
                vec![tensor_i64("n", &[], &[1 << 32])],
            ),
            17,
        )
        .encode_to_vec();
        let (e, _) = refused(&b);
        assert!(
            matches!(e.kind, ErrorKind::OverBudget { .. }),
            "{op}: {e:?}"
        );
    }
    assert_small_allocations();
}

#[test]
fn fuzz_resize_taps_for_a_quarter_billion_columns() {
    // graph_run: an Upsample/Resize with a huge constant scale built its
    // per-column tap table (512 MB) in prepare, before the planner saw the
    // output size.
    let b = model(
        vec![with_attrs(
            node("Resize", "up", &["x", "", "s"], &["y"]),
            vec![attr_str("mode", "linear")],
        )],
        vec![vi("x", elem::F32, &[1, 1, 1, 2])],
        vec![vi("y", elem::F32, &[])],
        vec![tensor_f32("s", &[4], &[1.0, 1.0, 1.0, (1 << 27) as f32])],
    );
    let (e, msg) = refused(&b);
    assert!(matches!(e.kind, ErrorKind::OverBudget { .. }), "{e:?}");
    assert!(msg.contains("node 'up'"), "{msg}");
    assert_small_allocations();
}

#[test]
fn fuzz_axis_of_a_scalar() {
    // graph_run: Unique with `axis` on a rank-0 input indexed the empty
    // shape (every op taking an axis now refuses it for a scalar, except
    // those that treat a scalar as one element).
    for (op, attr) in [
        ("Unique", "axis"),
        ("Compress", "axis"),
        ("LayerNormalization", "axis"),
        ("ArgMax", "axis"),
    ] {
        let b = model(
            vec![with_attrs(
                node(op, "n", &["x", "c"], &["y"]),
                vec![attr_int(attr, 0)],
            )],
            vec![vi("x", elem::F32, &[])],
            vec![vi("y", elem::F32, &[])],
            vec![tensor_raw("c", elem::BOOL, &[1], &[1])],
        );
        let (e, msg) = refused(&b);
        assert!(msg.contains("node 'n'"), "{op}: {e:?} {msg}");
    }
}

/// A model whose weight `w` (4 floats) lives in an external file.
fn external_model(location: &str, offset: Option<u64>, length: Option<u64>) -> Vec<u8> {
    let mut w = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![4],
        data_type: Some(elem::F32),
        data_location: Some(pb::tensor_proto::DataLocation::External as i32),
        ..Default::default()
    };
    let mut kv = |k: &str, v: String| {
        w.external_data.push(pb::StringStringEntryProto {
            key: Some(k.into()),
            value: Some(v),
        })
    };
    kv("location", location.into());
    if let Some(o) = offset {
        kv("offset", o.to_string());
    }
    if let Some(l) = length {
        kv("length", l.to_string());
    }
    model(
        vec![node("Add", "add", &["x", "w"], &["y"])],
        vec![vi("x", elem::F32, &[4])],
        vec![vi("y", elem::F32, &[4])],
        vec![w],
    )
}

#[test]
fn external_data_stays_in_the_model_folder() {
    use mote_std::{load_model, load_model_with, ExternalData};
    let root = mote_tests::repo().join("target/tmp/external-data");
    let _ = std::fs::remove_dir_all(&root);
    let dir = root.join("model");
    std::fs::create_dir_all(dir.join("sub")).expect("dirs");
    // 8 bytes of padding, then the 4 weights.
    let mut data = vec![0xEEu8; 8];
    for v in [1.0f32, 2.0, 3.0, 4.0] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(dir.join("sub/weights.bin"), &data).expect("weights");
    let secret = root.join("secret.bin");
    std::fs::write(&secret, &data).expect("outside file");
    let write = |name: &str, bytes: Vec<u8>| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).expect("model");
        p
    };
    // Inside the folder, with offset and length: loaded and used.
    let good = write(
        "good.onnx",
        external_model("sub/weights.bin", Some(8), Some(16)),
    );
    let m = load_model(&good).expect("external weights inside the folder");
    let plan = SessionBuilder::new(&m).plan().expect("plan");
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&m, &plan, &mut arena).expect("session");
    s.run(&[("x", TensorView::new(&[4], &[10f32; 4]).expect("view"))])
        .expect("run");
    assert_eq!(
        s.output(0).expect("y").f32().expect("f32"),
        [11., 12., 13., 14.]
    );

    let refused = |location: &str, offset, length| -> String {
        let p = write("bad.onnx", external_model(location, offset, length));
        load_model(&p).expect_err(location).to_string()
    };
    let abs = secret.display().to_string();
    for (loc, why) in [
        ("../secret.bin", "leaves the model's folder"),
        ("../../../../../../etc/passwd", "leaves the model's folder"),
        ("sub/../../secret.bin", "leaves the model's folder"),
        (abs.as_str(), "absolute path"),
        ("/etc/passwd", "absolute path"),
        ("sub\\..\\..\\secret.bin", "backslash"),
        ("missing.bin", "cannot be read"),
        ("sub", "not a regular file"),
        ("", "is empty"),
    ] {
        let msg = refused(loc, Some(8), Some(16));
        assert!(
            msg.contains(why) && msg.contains("tensor 'w'"),
            "{loc}: {msg}"
        );
        assert_eq!(msg.lines().count(), 1, "{msg}");
    }
    // Offset and length past the end of the file.
    let msg = refused("sub/weights.bin", Some(20), Some(16));
    assert!(msg.contains("past the end"), "{msg}");
    let msg = refused("sub/weights.bin", Some(u64::MAX), Some(2));
    assert!(msg.contains("past the end"), "{msg}");
    // A length that disagrees with the tensor's shape.
    let msg = refused("sub/weights.bin", Some(8), Some(12));
    assert!(msg.contains("length mismatch"), "{msg}");
    // Symbolic links on the way, to a file or a folder outside: refused,
    // though the lexical path stays inside.
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&secret, dir.join("link.bin")).expect("symlink");
        std::os::unix::fs::symlink(&root, dir.join("up")).expect("symlink");
        for loc in ["link.bin", "up/secret.bin"] {
            let msg = refused(loc, Some(8), Some(16));
            assert!(msg.contains("symbolic link"), "{loc}: {msg}");
        }
        // A caller who trusts the model may allow them.
        let p = write(
            "trusted.onnx",
            external_model("link.bin", Some(8), Some(16)),
        );
        load_model_with(&p, ExternalData::Anywhere).expect("trusted: links followed");
    }
    let p = write("trusted-abs.onnx", external_model(&abs, Some(8), Some(16)));
    load_model_with(&p, ExternalData::Anywhere).expect("trusted: absolute path");
    assert!(load_model(&p).is_err());
}
