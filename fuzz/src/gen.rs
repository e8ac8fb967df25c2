//! A structured ONNX generator for `graph_run`: one to three nodes of any
//! operator mote registers, with attributes, dtypes, shapes and constant
//! values drawn so that many graphs get past validation and reach the
//! kernels (small integers for shape-like inputs, small dims, the strings
//! ops expect), and some do not (wrong attribute types, odd ranks, omitted
//! inputs, future opsets).

use arbitrary::{Result, Unstructured};
use mote_proto as pb;
use mote_tests::onnx::{self as b, elem};
use prost::Message;

/// A generated model and the bytes to fill its inputs with.
#[derive(Debug)]
pub struct Generated {
    /// The encoded `ModelProto`.
    pub bytes: Vec<u8>,
    /// Input data, cycled over every graph input.
    pub input_bytes: Vec<u8>,
}

const DTYPES: &[i32] = &[
    elem::F32,
    elem::F32,
    elem::F32,
    elem::I64,
    elem::I64,
    elem::I32,
    elem::U8,
    elem::I8,
    elem::BOOL,
    elem::F16,
    11, // f64
    16, // bf16
    5,  // i16
    4,  // u16
    12, // u32
    13, // u64
];

/// Attribute names ops read, with the kind they usually have.
const ATTRS: &[(&str, Kind)] = &[
    ("axis", Kind::Int),
    ("axes", Kind::Ints),
    ("alpha", Kind::Float),
    ("beta", Kind::Float),
    ("gamma", Kind::Float),
    ("epsilon", Kind::Float),
    ("mode", Kind::Str),
    ("kernel_shape", Kind::Ints),
    ("strides", Kind::Ints),
    ("pads", Kind::Ints),
    ("dilations", Kind::Ints),
    ("group", Kind::Int),
    ("auto_pad", Kind::Str),
    ("transA", Kind::Int),
    ("transB", Kind::Int),
    ("to", Kind::Int),
    ("keepdims", Kind::Int),
    ("perm", Kind::Ints),
    ("k", Kind::Int),
    ("num_outputs", Kind::Int),
    ("split", Kind::Ints),
    ("starts", Kind::Ints),
    ("ends", Kind::Ints),
    ("ceil_mode", Kind::Int),
    ("count_include_pad", Kind::Int),
    ("storage_order", Kind::Int),
    ("output_padding", Kind::Ints),
    ("output_shape", Kind::Ints),
    ("blocksize", Kind::Int),
    ("block_size", Kind::Int),
    ("direction", Kind::Str),
    ("hidden_size", Kind::Int),
    ("equation", Kind::Str),
    ("value", Kind::Tensor),
    ("dtype", Kind::Int),
    ("output_dtype", Kind::Int),
    ("saturate", Kind::Int),
    ("reduction", Kind::Str),
    ("noop_with_empty_axes", Kind::Int),
    ("select_last_index", Kind::Int),
    ("largest", Kind::Int),
    ("sorted", Kind::Int),
    ("exclusive", Kind::Int),
    ("reverse", Kind::Int),
    ("batch_dims", Kind::Int),
    ("coordinate_transformation_mode", Kind::Str),
    ("nearest_mode", Kind::Str),
    ("scales", Kind::Floats),
    ("sizes", Kind::Ints),
    ("shape", Kind::Ints),
    ("num_heads", Kind::Int),
    ("num_groups", Kind::Int),
    ("stash_type", Kind::Int),
    ("p", Kind::Int),
    ("size", Kind::Int),
    ("bias", Kind::Float),
    ("lambd", Kind::Float),
    ("min", Kind::Float),
    ("max", Kind::Float),
    ("upper", Kind::Int),
    ("fmod", Kind::Int),
    ("onesided", Kind::Int),
    ("inverse", Kind::Int),
    ("center_point_box", Kind::Int),
    ("activations", Kind::Strs),
    ("linear_before_reset", Kind::Int),
    ("layout", Kind::Int),
    ("allowzero", Kind::Int),
    ("spatial_scale", Kind::Float),
    ("sampling_ratio", Kind::Int),
    ("output_height", Kind::Int),
    ("output_width", Kind::Int),
    ("align_corners", Kind::Int),
    ("padding_mode", Kind::Str),
    ("is_causal", Kind::Int),
    ("scale", Kind::Float),
    ("softcap", Kind::Float),
    ("interleaved", Kind::Int),
    ("rotary_embedding_dim", Kind::Int),
    ("time_axis", Kind::Int),
    ("batch_axis", Kind::Int),
    ("detect_negative", Kind::Int),
    ("detect_positive", Kind::Int),
    ("approximate", Kind::Str),
    ("periodic", Kind::Int),
    ("ignore_index", Kind::Int),
    ("num_scan_inputs", Kind::Int),
];

const STRINGS: &[&str] = &[
    "NOTSET",
    "SAME_UPPER",
    "SAME_LOWER",
    "VALID",
    "constant",
    "reflect",
    "edge",
    "wrap",
    "nearest",
    "linear",
    "cubic",
    "bilinear",
    "half_pixel",
    "asymmetric",
    "align_corners",
    "pytorch_half_pixel",
    "tf_crop_and_resize",
    "round_prefer_floor",
    "round_prefer_ceil",
    "floor",
    "ceil",
    "forward",
    "reverse",
    "bidirectional",
    "Tanh",
    "Sigmoid",
    "Relu",
    "DCR",
    "CRD",
    "mean",
    "sum",
    "none",
    "max",
    "min",
    "mul",
    "add",
    "avg",
    "tanh",
    "zeros",
    "border",
    "reflection",
    "ij,jk->ik",
    "i,i->",
    "ii->i",
    "bij,bjk->bik",
    "...ii->...i",
    "ab->ba",
    "i,j->ij",
    "",
];

#[derive(Clone, Copy, Debug)]
enum Kind {
    Int,
    Ints,
    Float,
    Floats,
    Str,
    Strs,
    Tensor,
    Graph,
}

const KINDS: &[Kind] = &[
    Kind::Int,
    Kind::Ints,
    Kind::Float,
    Kind::Floats,
    Kind::Str,
    Kind::Strs,
    Kind::Tensor,
    Kind::Graph,
];

/// A tensor the next node may take as input.
#[derive(Clone, Debug)]
struct Avail {
    name: String,
}

struct Gen<'u, 'a> {
    u: &'u mut Unstructured<'a>,
    inputs: Vec<pb::ValueInfoProto>,
    inits: Vec<pb::TensorProto>,
    avail: Vec<Avail>,
    next: usize,
}

impl Generated {
    /// Draws a model from `u`.
    pub fn new(u: &mut Unstructured<'_>) -> Result<Self> {
        let ops = mote_core::ops::supported_ops();
        let opset = if u.ratio(1, 16)? {
            u.int_in_range(1..=40)?
        } else {
            u.int_in_range(7..=28)?
        };
        let mut g = Gen {
            u,
            inputs: Vec::new(),
            inits: Vec::new(),
            avail: Vec::new(),
            next: 0,
        };
        let n_nodes = g.u.int_in_range(1..=3)?;
        let mut nodes = Vec::new();
        let mut domains: Vec<&str> = Vec::new();
        let mut last_outs = Vec::new();
        for k in 0..n_nodes {
            let &(domain, op) = g.u.choose(&ops)?;
            if !domain.is_empty() && !domains.contains(&domain) {
                domains.push(domain);
            }
            let n = g.node(op, domain, k, 0)?;
            last_outs = n.output.clone();
            nodes.push(n);
        }
        let mut outputs: Vec<pb::ValueInfoProto> = last_outs
            .iter()
            .filter(|o| !o.is_empty())
            .map(|o| pb::ValueInfoProto {
                name: Some(o.clone()),
                ..Default::default()
            })
            .collect();
        if g.u.ratio(1, 4)? {
            if let Some(a) = g.avail.first() {
                outputs.push(pb::ValueInfoProto {
                    name: Some(a.name.clone()),
                    ..Default::default()
                });
            }
        }
        let mut m = b::model_proto(b::graph(nodes, g.inputs, outputs, g.inits), opset);
        for d in domains {
            m.opset_import.push(pb::OperatorSetIdProto {
                domain: Some(d.into()),
                version: Some(1),
            });
        }
        let input_bytes = g.u.bytes(g.u.len().min(4096))?.to_vec();
        Ok(Generated {
            bytes: m.encode_to_vec(),
            input_bytes,
        })
    }
}

impl Gen<'_, '_> {
    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }

    fn node(&mut self, op: &str, domain: &str, k: usize, depth: usize) -> Result<pb::NodeProto> {
        let n_in = self.u.int_in_range(0..=6)?;
        let mut ins = Vec::with_capacity(n_in);
        for i in 0..n_in {
            ins.push(self.input(i)?);
        }
        let n_out = self.u.int_in_range(1..=3)?;
        let outs: Vec<String> = (0..n_out)
            .map(|j| {
                if j > 0 && self.u.ratio(1, 5).unwrap_or(false) {
                    String::new()
                } else {
                    format!("n{k}_{depth}_{j}")
                }
            })
            .collect();
        let mut n = pb::NodeProto {
            op_type: Some(op.into()),
            domain: Some(domain.into()),
            name: Some(format!("node{k}")),
            input: ins,
            output: outs.clone(),
            ..Default::default()
        };
        let n_attr = self.u.int_in_range(0..=4)?;
        for _ in 0..n_attr {
            let &(name, usual) = self.u.choose(ATTRS)?;
            let kind = if self.u.ratio(1, 8)? {
                *self.u.choose(KINDS)?
            } else {
                usual
            };
            n.attribute.push(self.attr(name, kind, depth)?);
        }
        match op {
            "If" if depth < 2 => {
                let t = self.body(0, 1, depth)?;
                let e = self.body(0, 1, depth)?;
                n.attribute.push(b::attr_graph("then_branch", t));
                n.attribute.push(b::attr_graph("else_branch", e));
            }
            "Loop" | "Scan" if depth < 2 => {
                let n_body_in = self.u.int_in_range(1..=4)?;
                let g = self.body(n_body_in, n_body_in, depth)?;
                n.attribute.push(b::attr_graph("body", g));
            }
            _ => {}
        }
        for o in outs.into_iter().filter(|o| !o.is_empty()) {
            self.avail.push(Avail { name: o });
        }
        Ok(n)
    }

    /// A subgraph with `n_in` inputs and `n_out` outputs: one node whose
    /// inputs are the body's inputs or outer values (captured).
    fn body(&mut self, n_in: usize, n_out: usize, depth: usize) -> Result<pb::GraphProto> {
        let mut inputs = Vec::new();
        for i in 0..n_in {
            let name = self.fresh("b");
            let (dt, dims) = if i == 0 {
                (elem::I64, vec![])
            } else if i == 1 {
                (elem::BOOL, vec![])
            } else {
                (*self.u.choose(DTYPES)?, self.dims()?)
            };
            inputs.push(b::vi(&name, dt, &dims));
        }
        let ops = mote_core::ops::supported_ops();
        let &(domain, op) = self.u.choose(&ops)?;
        let mut names: Vec<String> = inputs.iter().filter_map(|v| v.name.clone()).collect();
        names.extend(self.avail.iter().map(|a| a.name.clone()));
        let n_node_in = self.u.int_in_range(0..=3)?;
        let mut node_ins = Vec::new();
        for _ in 0..n_node_in {
            if names.is_empty() {
                break;
            }
            node_ins.push(self.u.choose(&names)?.clone());
        }
        let sub = format!("s{}", self.fresh(""));
        let mut node = pb::NodeProto {
            op_type: Some(op.into()),
            domain: Some(domain.into()),
            input: node_ins,
            output: vec![sub.clone()],
            ..Default::default()
        };
        let n_attr = self.u.int_in_range(0..=2)?;
        for _ in 0..n_attr {
            let &(name, usual) = self.u.choose(ATTRS)?;
            node.attribute.push(self.attr(name, usual, depth + 1)?);
        }
        let mut nodes = vec![node];
        let mut outputs = Vec::new();
        for j in 0..n_out {
            // Loop bodies: the condition first, then carried values.
            let src = if j == 0 && n_in >= 2 && self.u.ratio(3, 4)? {
                names.get(1).cloned().unwrap_or_default()
            } else if j == 0 || n_in == 0 {
                sub.clone()
            } else {
                names.get(j).cloned().unwrap_or_else(|| sub.clone())
            };
            let out = self.fresh("bo");
            nodes.push(b::node("Identity", "", &[&src], &[&out]));
            outputs.push(pb::ValueInfoProto {
                name: Some(out),
                ..Default::default()
            });
        }
        Ok(b::graph(nodes, inputs, outputs, vec![]))
    }

    fn dims(&mut self) -> Result<Vec<i64>> {
        let rank = self.u.int_in_range(0..=4)?;
        let mut dims = Vec::with_capacity(rank);
        let mut numel = 1i64;
        for _ in 0..rank {
            let d = if self.u.ratio(1, 16)? {
                0
            } else {
                self.u.int_in_range(1..=6)?
            };
            if numel * d.max(1) > 4096 {
                dims.push(1);
                continue;
            }
            numel *= d.max(1);
            dims.push(d);
        }
        Ok(dims)
    }

    /// The name of input `i`: omitted, an existing tensor, or a new graph
    /// input or initializer.
    fn input(&mut self, i: usize) -> Result<String> {
        if i > 0 && self.u.ratio(1, 8)? {
            return Ok(String::new());
        }
        if !self.avail.is_empty() && self.u.ratio(1, 3)? {
            return Ok(self.u.choose(&self.avail)?.name.clone());
        }
        let dt = *self.u.choose(DTYPES)?;
        let dims = self.dims()?;
        let name = self.fresh("t");
        if self.u.ratio(1, 2)? {
            let t = self.tensor(&name, dt, &dims)?;
            self.inits.push(t);
        } else {
            self.inputs.push(b::vi(&name, dt, &dims));
        }
        self.avail.push(Avail { name: name.clone() });
        Ok(name)
    }

    fn tensor(&mut self, name: &str, dt: i32, dims: &[i64]) -> Result<pb::TensorProto> {
        let numel: i64 = dims.iter().product();
        let numel = numel.max(0) as usize;
        let size = match dt {
            elem::U8 | elem::I8 | elem::BOOL => 1,
            elem::F16 | 16 | 5 | 4 => 2,
            elem::F32 | elem::I32 | 12 => 4,
            _ => 8,
        };
        let small = self.u.ratio(3, 4)?;
        let mut raw = Vec::with_capacity(numel * size);
        for _ in 0..numel {
            let x: u8 = self.u.arbitrary()?;
            match dt {
                elem::F32 => raw.extend(((x as f32 - 128.0) / 32.0).to_le_bytes()),
                11 => raw.extend(((x as f64 - 128.0) / 32.0).to_le_bytes()),
                elem::BOOL => raw.push(x & 1),
                _ if small => {
                    // Small signed integers: axes, shapes, indices, counts.
                    let v = (x % 12) as i64 - 3;
                    raw.extend(&v.to_le_bytes()[..size]);
                }
                _ => {
                    raw.push(x);
                    for _ in 1..size {
                        raw.push(self.u.arbitrary()?);
                    }
                }
            }
        }
        Ok(b::tensor_raw(name, dt, dims, &raw))
    }

    fn attr(&mut self, name: &str, kind: Kind, depth: usize) -> Result<pb::AttributeProto> {
        Ok(match kind {
            Kind::Int => b::attr_int(name, self.small_int()?),
            Kind::Ints => {
                let n = self.u.int_in_range(0..=6)?;
                let v: Vec<i64> = (0..n).map(|_| self.small_int()).collect::<Result<_>>()?;
                b::attr_ints(name, &v)
            }
            Kind::Float => b::attr_float(name, self.float()?),
            Kind::Floats => {
                let n = self.u.int_in_range(0..=6)?;
                let v: Vec<f32> = (0..n).map(|_| self.float()).collect::<Result<_>>()?;
                b::attr_floats(name, &v)
            }
            Kind::Str => b::attr_str(name, self.u.choose(STRINGS)?),
            Kind::Strs => {
                let mut a = b::attr_str(name, "");
                a.s = None;
                a.r#type = Some(pb::attribute_proto::AttributeType::Strings as i32);
                let n = self.u.int_in_range(0..=3)?;
                for _ in 0..n {
                    a.strings
                        .push(self.u.choose(STRINGS)?.as_bytes().to_vec().into());
                }
                a
            }
            Kind::Tensor => {
                let dt = *self.u.choose(DTYPES)?;
                let dims = self.dims()?;
                let t = self.tensor("", dt, &dims)?;
                b::attr_tensor(name, t)
            }
            Kind::Graph if depth < 2 => {
                let n_in = self.u.int_in_range(0..=3)?;
                let g = self.body(n_in, 1, depth + 1)?;
                b::attr_graph(name, g)
            }
            Kind::Graph => b::attr_int(name, 0),
        })
    }

    fn small_int(&mut self) -> Result<i64> {
        Ok(if self.u.ratio(1, 32)? {
            self.u.arbitrary()?
        } else {
            self.u.int_in_range(-3..=8)?
        })
    }

    fn float(&mut self) -> Result<f32> {
        Ok(if self.u.ratio(1, 16)? {
            f32::from_bits(self.u.arbitrary()?)
        } else {
            (self.u.int_in_range(-64..=64)? as f32) / 16.0
        })
    }
}
