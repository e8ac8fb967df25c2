//! Bad models and bad inputs end in a clean `Err` naming what is wrong,
//! never a panic.

use mote_core::{DType, ErrorKind, Model, Session, SessionBuilder, TensorView};
use mote_proto as pb;
use mote_tests::onnx::{model, node, vi};
use prost::Message;

fn relu_model() -> Vec<u8> {
    model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![vi("x", 1, &[1, 4])],
        vec![vi("y", 1, &[1, 4])],
        vec![],
    )
}

fn plan_err(bytes: &[u8]) -> (Model, mote_core::Error) {
    let m = Model::from_onnx(bytes).expect("import should succeed");
    let e = SessionBuilder::new(&m)
        .plan()
        .expect_err("plan should fail");
    (m, e)
}

#[test]
fn truncated_and_garbage_files() {
    let good = mote_tests::repo().join("models/digits_mlp.onnx");
    let bytes = std::fs::read(good).expect("shipped model");
    for cut in [1, 10, bytes.len() / 3, bytes.len() / 2, bytes.len() - 1] {
        let r = Model::from_onnx(&bytes[..cut]);
        // A prefix can by chance be a valid (smaller) message; then planning
        // it must still not panic.
        if let Ok(m) = r {
            let _ = SessionBuilder::new(&m).plan();
        }
    }
    assert_eq!(
        Model::from_onnx(b"hello world, not onnx").unwrap_err().kind,
        ErrorKind::Decode
    );
    assert!(Model::from_onnx(&[]).is_err(), "empty file has no graph");
}

#[test]
fn cycle_is_an_error_naming_a_node() {
    let b = model(
        vec![
            node("Relu", "a", &["x", "z"], &["y"]),
            node("Add", "b", &["y", "x"], &["z"]),
        ],
        vec![vi("x", 1, &[1])],
        vec![vi("z", 1, &[1])],
        vec![],
    );
    let (m, e) = plan_err(&b);
    assert_eq!(e.kind, ErrorKind::Cycle);
    let msg = m.explain(&e).to_string();
    assert!(msg.contains("cycle") && msg.contains("node '"), "{msg}");
}

#[test]
fn self_loop_is_a_cycle() {
    let b = model(
        vec![node("Relu", "a", &["y"], &["y"])],
        vec![vi("x", 1, &[1])],
        vec![vi("y", 1, &[1])],
        vec![],
    );
    let (_, e) = plan_err(&b);
    assert_eq!(e.kind, ErrorKind::Cycle);
}

#[test]
fn missing_initializer_names_the_tensor() {
    let b = model(
        vec![node("Add", "add", &["x", "w"], &["y"])],
        vec![vi("x", 1, &[1, 4])],
        vec![vi("y", 1, &[1, 4])],
        vec![],
    );
    let (m, e) = plan_err(&b);
    assert_eq!(e.kind, ErrorKind::MissingTensor);
    let msg = m.explain(&e).to_string();
    assert!(msg.contains("'w'") && msg.contains("'add'"), "{msg}");
}

#[test]
fn unsupported_op_names_op_node_and_opset() {
    let b = model(
        vec![node("FancyOp", "mine", &["x"], &["y"])],
        vec![vi("x", 1, &[1])],
        vec![vi("y", 1, &[1])],
        vec![],
    );
    let (m, e) = plan_err(&b);
    assert!(matches!(e.kind, ErrorKind::UnsupportedOp { opset: 13 }));
    let msg = m.explain(&e).to_string();
    assert!(
        msg.contains("FancyOp") && msg.contains("'mine'") && msg.contains("13"),
        "{msg}"
    );
}

#[test]
fn absurd_dims_overflow_cleanly() {
    // Input dims whose product overflows usize.
    let huge = i64::MAX / 2;
    let b = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![vi("x", 1, &[huge, huge, huge])],
        vec![vi("y", 1, &[1])],
        vec![],
    );
    let (_, e) = plan_err(&b);
    assert_eq!(e.kind, ErrorKind::Overflow);
    // An initializer claiming huge dims with little data.
    let t = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![huge, huge],
        data_type: Some(1),
        raw_data: Some(vec![0u8; 16].into()),
        ..Default::default()
    };
    let b = model(
        vec![node("Add", "a", &["x", "w"], &["y"])],
        vec![vi("x", 1, &[1])],
        vec![vi("y", 1, &[1])],
        vec![t],
    );
    assert!(matches!(
        Model::from_onnx(&b).unwrap_err().kind,
        ErrorKind::Overflow | ErrorKind::Len { .. }
    ));
    // Negative dims in data.
    let t = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![-3],
        data_type: Some(1),
        ..Default::default()
    };
    let b = model(
        vec![node("Add", "a", &["x", "w"], &["y"])],
        vec![vi("x", 1, &[1])],
        vec![vi("y", 1, &[1])],
        vec![t],
    );
    assert!(Model::from_onnx(&b).is_err());
}

#[test]
fn raw_data_shorter_than_shape() {
    let t = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![4],
        data_type: Some(1),
        raw_data: Some(vec![0u8; 8].into()),
        ..Default::default()
    };
    let b = model(
        vec![node("Add", "a", &["x", "w"], &["y"])],
        vec![vi("x", 1, &[4])],
        vec![vi("y", 1, &[4])],
        vec![t],
    );
    let e = Model::from_onnx(&b).unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::Len {
            expected: 16,
            got: 8
        }
    );
}

#[test]
fn wrong_input_dtype_and_shape() {
    let m = Model::from_onnx(&relu_model()).expect("import");
    let plan = SessionBuilder::new(&m).plan().expect("plan");
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&m, &plan, &mut arena).expect("session");
    let ints = [1i64, 2, 3, 4];
    let e = s
        .run(&[("x", TensorView::new(&[1, 4], &ints).unwrap())])
        .unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::DTypeMismatch {
            expected: DType::F32,
            got: DType::I64
        }
    );
    let f = [1f32, 2., 3.];
    let e = s
        .run(&[("x", TensorView::new(&[1, 3], &f).unwrap())])
        .unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::Dim {
            axis: 1,
            expected: 4,
            got: 3
        }
    );
    let e = s.run(&[]).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Binding(_)));
    // Binding a fixed dim to another value is refused at plan time.
    let e = SessionBuilder::new(&m)
        .input_shape("x", &[2, 4])
        .plan()
        .unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::Dim {
            axis: 0,
            expected: 1,
            got: 2
        }
    );
}

#[test]
fn arena_too_small_is_an_error() {
    let m = Model::from_onnx(&relu_model()).expect("import");
    let plan = SessionBuilder::new(&m).plan().expect("plan");
    let mut arena = vec![0u8; 4];
    assert!(matches!(
        Session::new(&m, &plan, &mut arena).unwrap_err().kind,
        ErrorKind::ArenaTooSmall { .. }
    ));
    let e = SessionBuilder::new(&m)
        .max_arena_bytes(1)
        .plan()
        .unwrap_err();
    assert!(matches!(e.kind, ErrorKind::OverBudget { .. }));
}

#[test]
fn opset_from_the_future_is_refused() {
    let mut p = pb::ModelProto::decode(&relu_model()[..]).unwrap();
    p.opset_import[0].version = Some(99);
    assert!(matches!(
        Model::from_onnx(&p.encode_to_vec()).unwrap_err().kind,
        ErrorKind::Unsupported(_)
    ));
}

#[test]
fn duplicate_producers_are_refused() {
    let b = model(
        vec![
            node("Relu", "a", &["x"], &["y"]),
            node("Relu", "b", &["x"], &["y"]),
        ],
        vec![vi("x", 1, &[1])],
        vec![vi("y", 1, &[1])],
        vec![],
    );
    let (_, e) = plan_err(&b);
    assert!(matches!(e.kind, ErrorKind::Invalid(_)));
}
