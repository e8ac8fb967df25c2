//! The arena planner's buffer sharing, checked on the values: a graph
//! output keeps its value to the end of the run even when later steps read
//! it (in-place steps, views, loop bodies).

use mote_core::{Model, Session, SessionBuilder, TensorView};
use mote_tests::onnx::{
    attr_graph, elem, graph, model, node, tensor_f32, tensor_i64, tensor_raw, vi, with_attrs,
};

/// Runs `onnx` on `x` (f32, shape `[n]`) and returns each output's values.
fn run(onnx: &[u8], x: &[f32]) -> Vec<Vec<f32>> {
    let m = Model::from_onnx(onnx).expect("import");
    let plan = SessionBuilder::new(&m).plan().expect("plan");
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&m, &plan, &mut arena).expect("session");
    s.run(&[("x", TensorView::new(&[x.len()], x).expect("view"))])
        .expect("run");
    (0..m.output_names().count())
        .map(|i| s.output(i).expect("output").f32().expect("f32").to_vec())
        .collect()
}

/// y = x + 1 and z = 2y are both outputs: Add runs in place over x, and
/// Mul must not then run in place over y (it did before the planner
/// carried "holds a graph output" over to the buffer y joined).
#[test]
fn an_output_read_by_a_later_in_place_step_keeps_its_value() {
    let onnx = model(
        vec![
            node("Add", "inc", &["x", "one"], &["y"]),
            node("Mul", "twice", &["y", "two"], &["z"]),
        ],
        vec![vi("x", elem::F32, &[2])],
        vec![vi("y", elem::F32, &[2]), vi("z", elem::F32, &[2])],
        vec![
            tensor_f32("one", &[1], &[1.0]),
            tensor_f32("two", &[1], &[2.0]),
        ],
    );
    assert_eq!(run(&onnx, &[0.0, 10.0]), [vec![1.0, 11.0], vec![2.0, 22.0]]);
}

/// The output is a view (Reshape) of a tensor that a later unary step
/// reads: the view's buffer must survive that step too.
#[test]
fn an_output_view_read_by_a_later_in_place_step_keeps_its_value() {
    let onnx = model(
        vec![
            node("Relu", "relu", &["x"], &["y"]),
            node("Reshape", "view", &["y", "shape"], &["v"]),
            node("Neg", "neg", &["y"], &["w"]),
        ],
        vec![vi("x", elem::F32, &[4])],
        vec![vi("v", elem::F32, &[2, 2]), vi("w", elem::F32, &[4])],
        vec![tensor_i64("shape", &[2], &[2, 2])],
    );
    assert_eq!(
        run(&onnx, &[-1.0, 2.0, -3.0, 4.0]),
        [vec![0.0, 2.0, 0.0, 4.0], vec![0.0, -2.0, 0.0, -4.0]]
    );
}

/// A Loop with a scan output (trip count constant): each iteration's value
/// is stacked along a new first axis. In the body, `v_out` is both a body
/// output and Mul's input: the same rule, planned for the body's arena.
#[test]
fn a_loop_stacks_its_scan_outputs() {
    let body = graph(
        vec![
            node("Identity", "keep", &["cond"], &["cond_out"]),
            node("Add", "inc", &["v", "one"], &["v_out"]),
            node("Mul", "twice", &["v_out", "two"], &["scan"]),
        ],
        vec![
            vi("i", elem::I64, &[]),
            vi("cond", elem::BOOL, &[]),
            vi("v", elem::F32, &[2]),
        ],
        vec![
            vi("cond_out", elem::BOOL, &[]),
            vi("v_out", elem::F32, &[2]),
            vi("scan", elem::F32, &[2]),
        ],
        vec![
            tensor_f32("one", &[1], &[1.0]),
            tensor_f32("two", &[1], &[2.0]),
        ],
    );
    let onnx = model(
        vec![with_attrs(
            node("Loop", "loop", &["m", "c", "x"], &["y", "ys"]),
            vec![attr_graph("body", body)],
        )],
        vec![vi("x", elem::F32, &[2])],
        vec![vi("y", elem::F32, &[2]), vi("ys", elem::F32, &[3, 2])],
        vec![
            tensor_raw("c", elem::BOOL, &[], &[1]),
            tensor_i64("m", &[], &[3]),
        ],
    );
    let m = Model::from_onnx(&onnx).expect("import");
    let plan = SessionBuilder::new(&m).plan().expect("plan");
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&m, &plan, &mut arena).expect("session");
    s.run(&[("x", TensorView::new(&[2], &[0f32, 10.0]).expect("view"))])
        .expect("run");
    assert_eq!(s.output(0).expect("y").f32().expect("f32"), [3.0, 13.0]);
    let ys = s.output(1).expect("ys");
    assert_eq!(ys.shape(), [3, 2]);
    assert_eq!(ys.f32().expect("f32"), [2.0, 22.0, 4.0, 24.0, 6.0, 26.0]);
}
