//! Hand-built ONNX models for the tests (and the fuzz targets): small
//! builders over `mote-proto`'s messages, so a test states its graph in a
//! few lines.

use mote_proto as pb;
use pb::attribute_proto::AttributeType;
use pb::tensor_shape_proto::{dimension::Value, Dimension};
use prost::Message;

/// The ONNX element-type codes the tests use.
pub mod elem {
    /// float32
    pub const F32: i32 = 1;
    /// uint8
    pub const U8: i32 = 2;
    /// int8
    pub const I8: i32 = 3;
    /// int32
    pub const I32: i32 = 6;
    /// int64
    pub const I64: i32 = 7;
    /// bool
    pub const BOOL: i32 = 9;
    /// float16
    pub const F16: i32 = 10;
}

/// A tensor value info with fixed dims.
pub fn vi(name: &str, elem_type: i32, dims: &[i64]) -> pb::ValueInfoProto {
    vi_dims(
        name,
        elem_type,
        dims.iter().map(|&d| Value::DimValue(d)).collect(),
    )
}

/// A tensor value info with symbolic dims where `dims` has `Err(name)`.
pub fn vi_sym(name: &str, elem_type: i32, dims: &[Result<i64, &str>]) -> pb::ValueInfoProto {
    vi_dims(
        name,
        elem_type,
        dims.iter()
            .map(|d| match d {
                Ok(v) => Value::DimValue(*v),
                Err(p) => Value::DimParam((*p).into()),
            })
            .collect(),
    )
}

fn vi_dims(name: &str, elem_type: i32, dims: Vec<Value>) -> pb::ValueInfoProto {
    pb::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: Some(elem_type),
                shape: Some(pb::TensorShapeProto {
                    dim: dims
                        .into_iter()
                        .map(|v| Dimension {
                            value: Some(v),
                            denotation: None,
                        })
                        .collect(),
                }),
            })),
            denotation: None,
        }),
        ..Default::default()
    }
}

/// A node of the default domain.
pub fn node(op: &str, name: &str, ins: &[&str], outs: &[&str]) -> pb::NodeProto {
    pb::NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// `n` with attributes added.
pub fn with_attrs(mut n: pb::NodeProto, attrs: Vec<pb::AttributeProto>) -> pb::NodeProto {
    n.attribute.extend(attrs);
    n
}

fn attr(name: &str, t: AttributeType) -> pb::AttributeProto {
    pb::AttributeProto {
        name: Some(name.into()),
        r#type: Some(t as i32),
        ..Default::default()
    }
}

/// An `int` attribute.
pub fn attr_int(name: &str, v: i64) -> pb::AttributeProto {
    pb::AttributeProto {
        i: Some(v),
        ..attr(name, AttributeType::Int)
    }
}

/// An `ints` attribute.
pub fn attr_ints(name: &str, v: &[i64]) -> pb::AttributeProto {
    pb::AttributeProto {
        ints: v.to_vec(),
        ..attr(name, AttributeType::Ints)
    }
}

/// A `float` attribute.
pub fn attr_float(name: &str, v: f32) -> pb::AttributeProto {
    pb::AttributeProto {
        f: Some(v),
        ..attr(name, AttributeType::Float)
    }
}

/// A `floats` attribute.
pub fn attr_floats(name: &str, v: &[f32]) -> pb::AttributeProto {
    pb::AttributeProto {
        floats: v.to_vec(),
        ..attr(name, AttributeType::Floats)
    }
}

/// A `string` attribute.
pub fn attr_str(name: &str, v: &str) -> pb::AttributeProto {
    pb::AttributeProto {
        s: Some(v.as_bytes().to_vec().into()),
        ..attr(name, AttributeType::String)
    }
}

/// A `tensor` attribute.
pub fn attr_tensor(name: &str, t: pb::TensorProto) -> pb::AttributeProto {
    pb::AttributeProto {
        t: Some(t),
        ..attr(name, AttributeType::Tensor)
    }
}

/// A `graph` attribute (If branches, Loop and Scan bodies).
pub fn attr_graph(name: &str, g: pb::GraphProto) -> pb::AttributeProto {
    pb::AttributeProto {
        g: Some(g),
        ..attr(name, AttributeType::Graph)
    }
}

/// A tensor of `elem_type` with little-endian `raw` bytes.
pub fn tensor_raw(name: &str, elem_type: i32, dims: &[i64], raw: &[u8]) -> pb::TensorProto {
    pb::TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(elem_type),
        raw_data: Some(raw.to_vec().into()),
        ..Default::default()
    }
}

/// A float32 tensor.
pub fn tensor_f32(name: &str, dims: &[i64], v: &[f32]) -> pb::TensorProto {
    let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    tensor_raw(name, elem::F32, dims, &raw)
}

/// An int64 tensor.
pub fn tensor_i64(name: &str, dims: &[i64], v: &[i64]) -> pb::TensorProto {
    let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    tensor_raw(name, elem::I64, dims, &raw)
}

/// A graph.
pub fn graph(
    nodes: Vec<pb::NodeProto>,
    inputs: Vec<pb::ValueInfoProto>,
    outputs: Vec<pb::ValueInfoProto>,
    inits: Vec<pb::TensorProto>,
) -> pb::GraphProto {
    pb::GraphProto {
        node: nodes,
        name: Some("g".into()),
        input: inputs,
        output: outputs,
        initializer: inits,
        ..Default::default()
    }
}

/// A model of `g` importing the default domain at `opset`.
pub fn model_proto(g: pb::GraphProto, opset: i64) -> pb::ModelProto {
    pb::ModelProto {
        ir_version: Some(8),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(g),
        ..Default::default()
    }
}

/// The bytes of a model at opset 13.
pub fn model(
    nodes: Vec<pb::NodeProto>,
    inputs: Vec<pb::ValueInfoProto>,
    outputs: Vec<pb::ValueInfoProto>,
    inits: Vec<pb::TensorProto>,
) -> Vec<u8> {
    model_proto(graph(nodes, inputs, outputs, inits), 13).encode_to_vec()
}
