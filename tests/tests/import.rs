//! Import details: graph inputs that are also initializers, Constant nodes;
//! shape tensors fed as graph inputs.

use mote_core::{Model, Session, SessionBuilder, TensorView};
use mote_proto as pb;
use mote_tests::onnx::vi as vi_typed;
use prost::Message;

fn vi(name: &str, dims: &[i64]) -> pb::ValueInfoProto {
    vi_typed(name, 1, dims)
}

#[test]
fn initializer_inputs_and_constant_nodes() {
    // y = (x + w) * c, with w an initializer also declared as a graph input
    // (old exporters do this) and c a Constant node with a float_data tensor.
    let w = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![3],
        data_type: Some(1),
        float_data: vec![1.0, 2.0, 3.0],
        ..Default::default()
    };
    let c = pb::AttributeProto {
        name: Some("value".into()),
        r#type: Some(pb::attribute_proto::AttributeType::Tensor as i32),
        t: Some(pb::TensorProto {
            dims: vec![],
            data_type: Some(1),
            raw_data: Some(2f32.to_le_bytes().to_vec().into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let nodes = vec![
        pb::NodeProto {
            op_type: Some("Constant".into()),
            output: vec!["c".into()],
            attribute: vec![c],
            ..Default::default()
        },
        pb::NodeProto {
            op_type: Some("Add".into()),
            input: vec!["x".into(), "w".into()],
            output: vec!["s".into()],
            ..Default::default()
        },
        pb::NodeProto {
            op_type: Some("Mul".into()),
            input: vec!["s".into(), "c".into()],
            output: vec!["y".into()],
            ..Default::default()
        },
    ];
    let m = pb::ModelProto {
        ir_version: Some(3),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: None,
            version: Some(9),
        }],
        graph: Some(pb::GraphProto {
            node: nodes,
            input: vec![vi("x", &[3]), vi("w", &[3])],
            output: vec![vi("y", &[3])],
            initializer: vec![w],
            ..Default::default()
        }),
        ..Default::default()
    };
    let model = Model::from_onnx(&m.encode_to_vec()).expect("import");
    assert_eq!(
        model.input_names().collect::<Vec<_>>(),
        ["x"],
        "w is a constant, not a fed input"
    );
    let plan = SessionBuilder::new(&model).plan().expect("plan");
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&model, &plan, &mut arena).expect("session");
    let x = [10f32, 20., 30.];
    s.run(&[("x", TensorView::new(&[3], &x).expect("view"))])
        .expect("run");
    assert_eq!(
        s.output(0).expect("y").f32().expect("f32"),
        &[22., 44., 66.]
    );
}

#[test]
fn shape_tensor_input_bound_by_value() {
    // y = Reshape(x, shape) with `shape` a graph input: its value decides
    // y's shape, so the plan needs it at build time.
    let m = pb::ModelProto {
        ir_version: Some(8),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: None,
            version: Some(14),
        }],
        graph: Some(pb::GraphProto {
            node: vec![pb::NodeProto {
                op_type: Some("Reshape".into()),
                input: vec!["x".into(), "shape".into()],
                output: vec!["y".into()],
                ..Default::default()
            }],
            input: vec![vi("x", &[2, 3]), vi_typed("shape", 7, &[2])],
            output: vec![vi("y", &[3, 2])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let model = Model::from_onnx(&m.encode_to_vec()).expect("import");
    let e = SessionBuilder::new(&model)
        .plan()
        .expect_err("needs the value");
    assert!(
        matches!(e.kind, mote_core::ErrorKind::Unsupported(m) if m.contains("known at build time")),
        "{e:?}"
    );
    let shape = [3i64, 2];
    let shape_v = TensorView::new(&[2], &shape).expect("view");
    let plan = SessionBuilder::new(&model)
        .input_value("shape", &shape_v)
        .plan()
        .expect("plan");
    assert_eq!(plan.outputs()[0].shape, [3, 2]);
    assert!(plan.inputs()[1].bound && !plan.inputs()[0].bound);
    // Only x is in the arena (y is a view of it).
    assert_eq!(plan.arena_bytes(), 32);
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&model, &plan, &mut arena).expect("session");
    let x = [1f32, 2., 3., 4., 5., 6.];
    let x_v = TensorView::new(&[2, 3], &x).expect("view");
    s.run(&[("x", x_v), ("shape", shape_v)]).expect("run");
    let y = s.output(0).expect("y");
    assert_eq!(y.shape(), [3, 2]);
    assert_eq!(y.f32().expect("f32"), &x);
    assert!(s.input_mut(1).is_err(), "a bound input has no buffer");
    // Feeding another value than the bound one is an error, not a silent
    // run with the old shape.
    let other = [6i64, 1];
    let e = s
        .run(&[
            ("x", x_v),
            ("shape", TensorView::new(&[2], &other).expect("view")),
        ])
        .expect_err("value differs");
    assert!(matches!(e.kind, mote_core::ErrorKind::Binding(_)), "{e:?}");
}

fn one_node_model(op: &str, extra: Option<&str>) -> Vec<u8> {
    let mut nodes = vec![pb::NodeProto {
        op_type: Some(op.into()),
        input: vec!["x".into()],
        output: vec!["y".into()],
        ..Default::default()
    }];
    let mut out = "y".to_string();
    if let Some(next) = extra {
        nodes.push(pb::NodeProto {
            op_type: Some(next.into()),
            input: vec!["y".into()],
            output: vec!["z".into()],
            ..Default::default()
        });
        out = "z".into();
    }
    let m = pb::ModelProto {
        ir_version: Some(8),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: None,
            version: Some(13),
        }],
        graph: Some(pb::GraphProto {
            node: nodes,
            input: vec![vi("x", &[2, 3])],
            output: vec![vi_typed(&out, 7, &[])],
            ..Default::default()
        }),
        ..Default::default()
    };
    m.encode_to_vec()
}

#[test]
fn data_dependent_output_shape_is_reported_after_run() {
    let model = Model::from_onnx(&one_node_model("NonZero", None)).expect("import");
    let plan = SessionBuilder::new(&model).plan().expect("plan");
    let out = &plan.outputs()[0];
    assert!(out.dynamic);
    assert_eq!(out.shape, [2, 6], "upper bound: every element non-zero");
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(&model, &plan, &mut arena).expect("session");
    let x = [0f32, 5., 0., 7., 0., 9.];
    s.run(&[("x", TensorView::new(&[2, 3], &x).expect("view"))])
        .expect("run");
    let y = s.output(0).expect("y");
    assert_eq!(y.shape(), [2, 3]);
    assert_eq!(y.as_slice::<i64>().expect("i64"), &[0, 1, 1, 1, 0, 2]);
    // The next run has another shape, same arena.
    let x = [1f32, 0., 0., 0., 0., 0.];
    s.run(&[("x", TensorView::new(&[2, 3], &x).expect("view"))])
        .expect("run");
    let y = s.output(0).expect("y");
    assert_eq!(y.shape(), [2, 1]);
    assert_eq!(y.as_slice::<i64>().expect("i64"), &[0, 0]);
}

#[test]
fn data_dependent_shape_feeding_an_op_is_refused() {
    let model = Model::from_onnx(&one_node_model("NonZero", Some("Neg"))).expect("import");
    let e = SessionBuilder::new(&model).plan().expect_err("refused");
    assert!(
        matches!(e.kind, mote_core::ErrorKind::Unsupported(m) if m.contains("depends on values")),
        "{e:?}"
    );
    let text = model.explain(&e).to_string();
    assert!(text.contains("NonZero"), "{text}");
}
