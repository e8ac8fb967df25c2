//! ONNX import: `ModelProto` bytes → [`Model`].
//!
//! Import only translates and validates structure (names, types, constant
//! data); shapes are inferred later, when the session binds input shapes.
//! `Constant` nodes become constant tensors here, so no kernel sees them.

use alloc::boxed::Box;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use mote_proto::bytes::Bytes;
use mote_proto::{tensor_shape_proto::dimension, type_proto, Message};

use crate::error::{Error, ErrorKind, Result, TensorId};
use crate::model::{Attr, AttrValue, Const, ConstData, Dim, Graph, Model, Node, TensorInfo};
use crate::tensor::{copy_exact, ChunksOf as _};
use crate::DType;

/// Oldest default-domain opset mote accepts.
pub const MIN_OPSET: i64 = 7;
/// Newest default-domain opset mote accepts (that of onnx 1.23).
pub const MAX_OPSET: i64 = 28;
/// Bound on subgraph nesting (If/Loop bodies), so hostile files cannot
/// exhaust the stack.
pub const MAX_GRAPH_DEPTH: usize = 32;

impl Model {
    /// Imports an ONNX model from its serialized bytes.
    ///
    /// Weights are copied once, into aligned storage. Use
    /// [`Model::from_onnx_shared`] to share a buffer you already own.
    ///
    /// ```
    /// # fn main() -> Result<(), mote_core::Error> {
    /// let bytes = include_bytes!("../../models/digits_mlp.onnx");
    /// let model = mote_core::Model::from_onnx(bytes)?;
    /// assert_eq!(model.input_names().collect::<Vec<_>>(), ["input"]);
    /// # Ok(()) }
    /// ```
    pub fn from_onnx(bytes: &[u8]) -> Result<Model> {
        // Decoding from a slice copies each `bytes` field out of it; those
        // copies are heap blocks, so `from_shared` usually keeps them as they
        // are: one copy of the weights in all.
        let proto =
            mote_proto::ModelProto::decode(bytes).map_err(|_| Error::new(ErrorKind::Decode))?;
        let mut m = import_model(proto)?;
        crate::optimize::run(&mut m);
        Ok(m)
    }

    /// Imports without graph rewrites: QDQ models then run literally
    /// (dequantize, float op, quantize), and float models node by node as
    /// in the file (no BatchNorm folding, ...), the way onnxruntime does
    /// with graph optimizations disabled.
    pub fn from_onnx_unoptimized(bytes: &[u8]) -> Result<Model> {
        let proto =
            mote_proto::ModelProto::decode(bytes).map_err(|_| Error::new(ErrorKind::Decode))?;
        import_model(proto)
    }

    /// Imports with the chosen rewrites only, e.g. QDQ fusion without the
    /// float passes, to compare their effect.
    ///
    /// ```
    /// # fn main() -> Result<(), mote_core::Error> {
    /// use mote_core::optimize::Options;
    /// let bytes = include_bytes!("../../models/digits_mlp.onnx");
    /// let opts = Options { float: false, ..Options::default() };
    /// let model = mote_core::Model::from_onnx_with(bytes, opts)?;
    /// assert!(model.rewrites.is_empty());
    /// # Ok(()) }
    /// ```
    pub fn from_onnx_with(bytes: &[u8], opts: crate::optimize::Options) -> Result<Model> {
        let mut m = Model::from_onnx_unoptimized(bytes)?;
        crate::optimize::run_with(&mut m, opts);
        Ok(m)
    }

    /// Imports from a shared buffer: weight bytes are sliced out of `bytes`
    /// (no copy) where aligned, copied once where not.
    ///
    ///
    /// The buffer stays alive as long as a weight slices it. Where less
    /// than half of it would stay in use (most weights were not 8-byte
    /// aligned in the file and had to be copied, or the rewrites replace
    /// them: BatchNorm folding makes new convolution weights), the weights
    /// still in it are copied out instead, so that the file's memory is
    /// given back before the rewrites allocate.
    pub fn from_onnx_shared(bytes: Bytes) -> Result<Model> {
        let file = bytes.len();
        let proto = mote_proto::decode_model(bytes).map_err(|_| Error::new(ErrorKind::Decode))?;
        Model::from_proto_sized(proto, file)
    }

    /// Imports a decoded `ModelProto` (weights sliced out of its buffers
    /// where aligned), with the rewrites of [`Model::from_onnx`]. For a
    /// caller that edits the message first: mote-std fills in tensors
    /// stored in external files this way.
    pub fn from_proto(proto: mote_proto::ModelProto) -> Result<Model> {
        let file = proto.encoded_len();
        Model::from_proto_sized(proto, file)
    }

    fn from_proto_sized(proto: mote_proto::ModelProto, file: usize) -> Result<Model> {
        let mut m = import_model(proto)?;
        if m.graph.shared_const_bytes() < file / 2 {
            m.graph.unshare_consts()?;
        }
        crate::optimize::run(&mut m);
        if m.graph.shared_const_bytes() < file / 2 {
            m.graph.unshare_consts()?;
        }
        Ok(m)
    }
}

fn opset_imports(proto: &mote_proto::ModelProto) -> Vec<(String, i64)> {
    let mut opsets = Vec::new();
    for o in &proto.opset_import {
        let dom = o.domain.clone().unwrap_or_default();
        let dom = if dom == "ai.onnx" { String::new() } else { dom };
        opsets.push((dom, o.version.unwrap_or(0)));
    }
    opsets
}

/// An import error displayed with the names of the node and tensor it
/// points at: `proto` is imported again as far as it goes, which gives
/// the ids of [`Model::from_onnx`]'s errors their names.
pub fn explain_import(proto: mote_proto::ModelProto, e: &Error) -> String {
    let opsets = opset_imports(&proto);
    let mut b = Builder {
        graph: Graph::default(),
    };
    if let Some(g) = proto.graph {
        let _ = import_graph_into(&mut b, g, &opsets, 0);
    }
    crate::model::Explained {
        graph: Some(&b.graph),
        error: e,
    }
    .to_string()
}

/// [`explain_import`] of the model's bytes (as given to
/// [`Model::from_onnx`]).
///
/// ```
/// let bad = b"not a model";
/// let e = mote_core::Model::from_onnx(bad).unwrap_err();
/// assert!(mote_core::onnx::explain_import_bytes(bad, &e).contains("not a valid ONNX model"));
/// ```
pub fn explain_import_bytes(bytes: &[u8], e: &Error) -> String {
    match mote_proto::ModelProto::decode(bytes) {
        Ok(p) => explain_import(p, e),
        Err(_) => e.kind.to_string(),
    }
}

/// Imports a decoded `ModelProto`.
pub fn import_model(proto: mote_proto::ModelProto) -> Result<Model> {
    let opsets = opset_imports(&proto);
    let default = opsets.iter().find(|(d, _)| d.is_empty()).map(|&(_, v)| v);
    match default {
        // ONNX says an absent import means opset 1; ask for a real one
        // rather than guessing.
        None if proto.opset_import.is_empty() => {
            return Err(Error::new(ErrorKind::Invalid("model has no opset_import")));
        }
        Some(v) if v < MIN_OPSET => {
            return Err(Error::new(ErrorKind::Unsupported(
                "default-domain opset below 7",
            )));
        }
        Some(v) if v > MAX_OPSET => {
            return Err(Error::new(ErrorKind::Unsupported(
                "default-domain opset newer than mote knows (max 28)",
            )));
        }
        _ => {}
    }
    let g = proto
        .graph
        .ok_or(Error::new(ErrorKind::Invalid("model has no graph")))?;
    let graph = import_graph(g, &opsets, 0)?;
    Ok(Model {
        producer: proto.producer_name.unwrap_or_default(),
        producer_version: proto.producer_version.unwrap_or_default(),
        ir_version: proto.ir_version.unwrap_or(0),
        opsets,
        graph,
        fusions: Vec::new(),
        io_quant: Vec::new(),
        rewrites: Vec::new(),
    })
}

struct Builder {
    graph: Graph,
}

impl Builder {
    fn id(&mut self, name: &str) -> TensorId {
        if let Some(i) = self.graph.tensor_id(name) {
            return i;
        }
        self.graph.tensors.push(TensorInfo {
            name: name.to_string(),
            dtype: None,
            shape: None,
            value: None,
            onnx_type: 0,
        });
        self.graph.tensors.len().saturating_sub(1) as TensorId
    }
}

fn declare(t: &mut TensorInfo, tp: &Option<mote_proto::TypeProto>) {
    let Some(type_proto::Value::TensorType(tt)) = tp.as_ref().and_then(|t| t.value.as_ref()) else {
        return;
    };
    if let Some(code) = tt.elem_type {
        t.onnx_type = code;
        t.dtype = DType::from_onnx(code);
    }
    if let Some(sh) = &tt.shape {
        let dims = sh
            .dim
            .iter()
            .map(|d| match &d.value {
                Some(dimension::Value::DimValue(v)) if *v >= 0 => Dim::Fixed(*v as usize),
                Some(dimension::Value::DimParam(p)) if !p.is_empty() => Dim::Param(p.clone()),
                _ => Dim::Unknown,
            })
            .collect();
        t.shape = Some(dims);
    }
}

/// An initializer's stored dtype and shape against a declaration of the
/// same name (graph input or value info): a model that says one thing and
/// stores another is refused rather than guessed at.
fn check_declared_const(t: &TensorInfo, tp: &Option<mote_proto::TypeProto>) -> Result<()> {
    let Some(type_proto::Value::TensorType(tt)) = tp.as_ref().and_then(|t| t.value.as_ref()) else {
        return Ok(());
    };
    let Some(c) = t.value.as_ref() else {
        return Ok(());
    };
    if let Some(code) = tt.elem_type.filter(|&c| c != 0) {
        if code != c.dtype.onnx_code() {
            return Err(Error::new(ErrorKind::Invalid(
                "an initializer's stored dtype differs from its declared one",
            )));
        }
    }
    if let Some(sh) = &tt.shape {
        let fixed_mismatch = sh.dim.len() != c.shape.len()
            || sh.dim.iter().zip(&c.shape).any(|(d, &v)| {
                matches!(&d.value, Some(dimension::Value::DimValue(x)) if *x >= 0 && *x as u64 != v as u64)
            });
        if fixed_mismatch {
            return Err(Error::new(ErrorKind::Invalid(
                "an initializer's stored shape differs from its declared one",
            )));
        }
    }
    Ok(())
}

fn import_graph(
    g: mote_proto::GraphProto,
    opsets: &[(String, i64)],
    depth: usize,
) -> Result<Graph> {
    let mut b = Builder {
        graph: Graph::default(),
    };
    import_graph_into(&mut b, g, opsets, depth)?;
    Ok(b.graph)
}

/// Imports `g` into `b`. On error, `b` holds what was imported so far,
/// including the node being imported (so that the error's ids have names).
fn import_graph_into(
    b: &mut Builder,
    g: mote_proto::GraphProto,
    opsets: &[(String, i64)],
    depth: usize,
) -> Result<()> {
    if depth > MAX_GRAPH_DEPTH {
        return Err(Error::new(ErrorKind::Invalid(
            "subgraphs nested too deeply",
        )));
    }
    if !g.sparse_initializer.is_empty() {
        return Err(Error::new(ErrorKind::Unsupported("sparse initializers")));
    }
    // Initializers first: their names shadow graph inputs of the same name.
    for t in g.initializer {
        let name = t.name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(Error::new(ErrorKind::Invalid("initializer without a name")));
        }
        let id = b.id(&name);
        let c = tensor_from_proto(t).map_err(|e| e.at_tensor(id))?;
        let info = b
            .graph
            .tensors
            .get_mut(id as usize)
            .ok_or(Error::new(ErrorKind::Internal("tensor id")))?;
        if info.value.is_some() {
            return Err(Error::new(ErrorKind::Invalid("duplicate initializer")).at_tensor(id));
        }
        info.dtype = Some(c.dtype);
        info.onnx_type = c.dtype.onnx_code();
        info.shape = Some(c.shape.iter().map(|&d| Dim::Fixed(d)).collect());
        info.value = Some(c);
    }
    for vi in &g.input {
        let name = vi.name.clone().unwrap_or_default();
        let id = b.id(&name);
        let info = b
            .graph
            .tensors
            .get_mut(id as usize)
            .ok_or(Error::new(ErrorKind::Internal("tensor id")))?;
        if info.value.is_some() {
            // An initializer with a declared input: a constant here, whose
            // declaration must agree with what is stored.
            check_declared_const(info, &vi.r#type).map_err(|e| e.at_tensor(id))?;
            continue;
        }
        declare(info, &vi.r#type);
        if b.graph.inputs.contains(&id) {
            return Err(Error::new(ErrorKind::Invalid("duplicate graph input")).at_tensor(id));
        }
        b.graph.inputs.push(id);
    }
    for vi in g.value_info.iter() {
        let name = vi.name.clone().unwrap_or_default();
        let id = b.id(&name);
        if let Some(info) = b.graph.tensors.get_mut(id as usize) {
            if info.value.is_none() {
                declare(info, &vi.r#type);
            } else {
                check_declared_const(info, &vi.r#type).map_err(|e| e.at_tensor(id))?;
            }
        }
    }
    for n in g.node {
        let domain = match n.domain.as_deref() {
            None | Some("ai.onnx") => String::new(),
            Some(d) => d.to_string(),
        };
        let opset = opsets
            .iter()
            .find(|(d, _)| *d == domain)
            .map(|&(_, v)| v)
            .unwrap_or(0);
        let op_type = n.op_type.clone().unwrap_or_default();
        let node_id = b.graph.nodes.len() as u32;
        // The node goes in first, bare, so that an error while importing
        // its attributes still names it (see `explain_import`).
        b.graph.nodes.push(Node {
            name: n.name.clone().unwrap_or_default(),
            op_type,
            domain,
            opset,
            inputs: Vec::new(),
            outputs: Vec::new(),
            attrs: Vec::new(),
        });
        let mut attrs = Vec::with_capacity(n.attribute.len());
        for a in n.attribute {
            attrs.push(import_attr(a, opsets, depth).map_err(|e| e.at_node(node_id))?);
        }
        let mut inputs: Vec<Option<TensorId>> = n
            .input
            .iter()
            .map(|s| if s.is_empty() { None } else { Some(b.id(s)) })
            .collect();
        for name in crate::model::captured_names(&attrs) {
            inputs.push(Some(b.id(&name)));
        }
        let outputs: Vec<Option<TensorId>> = n
            .output
            .iter()
            .map(|s| if s.is_empty() { None } else { Some(b.id(s)) })
            .collect();
        let node = b
            .graph
            .nodes
            .last_mut()
            .ok_or(Error::new(ErrorKind::Internal("node")))?;
        node.inputs = inputs;
        node.outputs = outputs;
        node.attrs = attrs;
        if node.op_type == "Constant" && node.domain.is_empty() {
            let out = node.outputs.first().copied().flatten().ok_or(
                Error::new(ErrorKind::Invalid("Constant node without output")).at_node(node_id),
            )?;
            // The value lives on the output tensor; the node goes.
            let c = constant_value(node).map_err(|e| e.at_node(node_id))?;
            let info = b
                .graph
                .tensors
                .get_mut(out as usize)
                .ok_or(Error::new(ErrorKind::Internal("tensor id")))?;
            if info.value.is_some() {
                return Err(Error::new(ErrorKind::Invalid(
                    "Constant output has the name of an initializer",
                ))
                .at_node(node_id)
                .at_tensor(out));
            }
            info.dtype = Some(c.dtype);
            info.shape = Some(c.shape.iter().map(|&d| Dim::Fixed(d)).collect());
            info.value = Some(c);
            b.graph.nodes.pop();
        }
    }
    for vi in &g.output {
        let name = vi.name.clone().unwrap_or_default();
        let id = b.id(&name);
        if let Some(info) = b.graph.tensors.get_mut(id as usize) {
            if info.dtype.is_none() && info.value.is_none() {
                declare(info, &vi.r#type);
            }
        }
        b.graph.outputs.push(id);
    }
    Ok(())
}

fn attr_err(problem: &'static str) -> Error {
    Error::new(ErrorKind::Attribute { name: "?", problem })
}

fn import_attr(
    a: mote_proto::AttributeProto,
    opsets: &[(String, i64)],
    depth: usize,
) -> Result<Attr> {
    use mote_proto::attribute_proto::AttributeType as T;
    let name = a.name.clone().unwrap_or_default();
    if a.ref_attr_name.is_some() {
        return Err(Error::new(ErrorKind::Unsupported(
            "attribute references (functions)",
        )));
    }
    let ty = a.r#type.and_then(|t| T::try_from(t).ok());
    // Old exporters leave `type` unset; infer it from the field present.
    let ty = match ty {
        Some(t) if t != T::Undefined => t,
        _ => {
            if a.t.is_some() {
                T::Tensor
            } else if a.g.is_some() {
                T::Graph
            } else if !a.floats.is_empty() {
                T::Floats
            } else if !a.ints.is_empty() {
                T::Ints
            } else if !a.strings.is_empty() {
                T::Strings
            } else if a.s.is_some() {
                T::String
            } else if a.f.is_some() {
                T::Float
            } else if a.i.is_some() {
                T::Int
            } else {
                T::Undefined
            }
        }
    };
    let value = match ty {
        T::Float => AttrValue::Float(a.f.unwrap_or(0.0)),
        T::Int => AttrValue::Int(a.i.unwrap_or(0)),
        T::String => AttrValue::Str(a.s.map(|b| b.to_vec()).unwrap_or_default()),
        T::Floats => AttrValue::Floats(a.floats),
        T::Ints => AttrValue::Ints(a.ints),
        T::Strings => AttrValue::Strings(a.strings.into_iter().map(|b| b.to_vec()).collect()),
        T::Tensor => AttrValue::Tensor(tensor_from_proto(
            a.t.ok_or(attr_err("TENSOR attribute without tensor"))?,
        )?),
        // Ids inside a subgraph would be read as the outer graph's: an
        // error there keeps its kind and points at the node that holds it.
        T::Graph => AttrValue::Graph(Box::new(
            import_graph(
                a.g.ok_or(attr_err("GRAPH attribute without graph"))?,
                opsets,
                depth.saturating_add(1),
            )
            .map_err(|e| Error::new(e.kind))?,
        )),
        T::Graphs => {
            let mut v = Vec::new();
            for g in a.graphs {
                v.push(
                    import_graph(g, opsets, depth.saturating_add(1))
                        .map_err(|e| Error::new(e.kind))?,
                );
            }
            AttrValue::Graphs(v)
        }
        _ => AttrValue::Other,
    };
    Ok(Attr { name, value })
}

fn constant_value(n: &Node) -> Result<Const> {
    let a = n.attrs.first().ok_or(Error::new(ErrorKind::Invalid(
        "Constant node without value attribute",
    )))?;
    match (&a.name[..], &a.value) {
        ("value", AttrValue::Tensor(t)) => Ok(t.clone()),
        ("value_float", AttrValue::Float(f)) => Const::from_slice(&[], &[*f]),
        ("value_floats", AttrValue::Floats(f)) => Const::from_slice(&[f.len()], f),
        ("value_int", AttrValue::Int(i)) => Const::from_slice(&[], &[*i]),
        ("value_ints", AttrValue::Ints(i)) => Const::from_slice(&[i.len()], i),
        ("value_string" | "value_strings", _) => Err(Error::new(ErrorKind::UnsupportedDType {
            what: "Constant",
            code: 8,
        })),
        ("sparse_value", _) => Err(Error::new(ErrorKind::Unsupported("sparse Constant"))),
        _ => Err(Error::new(ErrorKind::Attribute {
            name: "value",
            problem: "unrecognized Constant attribute",
        })),
    }
}

/// Converts a `TensorProto` (initializer or attribute) to a [`Const`],
/// checking dims, dtype and data length. External data is refused here;
/// mote-std resolves it against the model's folder first.
pub fn tensor_from_proto(t: mote_proto::TensorProto) -> Result<Const> {
    let code = t.data_type.unwrap_or(0);
    let dtype = DType::from_onnx(code).ok_or(Error::new(ErrorKind::UnsupportedDType {
        what: "tensor data",
        code,
    }))?;
    if t.data_location == Some(1) || !t.external_data.is_empty() {
        return Err(Error::new(ErrorKind::Unsupported(
            "external tensor data (load the model from a file)",
        )));
    }
    if t.segment.is_some() {
        return Err(Error::new(ErrorKind::Unsupported("segmented tensors")));
    }
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if d < 0 {
            return Err(Error::new(ErrorKind::Shape(
                "negative dimension in tensor data",
            )));
        }
        shape.push(usize::try_from(d).map_err(|_| Error::new(ErrorKind::Overflow))?);
    }
    let n = crate::error::checked_numel(&shape)?;
    let bytes = n
        .checked_mul(dtype.size())
        .ok_or(Error::new(ErrorKind::Overflow))?;
    let len_err = |got: usize| {
        Error::new(ErrorKind::Len {
            expected: bytes as u64,
            got: got as u64,
        })
    };
    if let Some(bits) = dtype.packed_bits() {
        return unpack_sub_byte(dtype, bits, shape, n, t.raw_data, &t.int32_data);
    }
    if let Some(raw) = t.raw_data {
        if raw.len() != bytes {
            return Err(len_err(raw.len()));
        }
        return Ok(Const {
            dtype,
            shape,
            data: ConstData::from_shared(raw)?,
        });
    }
    // Typed fields: the ONNX rules of which field carries which dtype.
    let count = match dtype {
        DType::F32 => t.float_data.len(),
        DType::F64 => t.double_data.len(),
        DType::I64 => t.int64_data.len(),
        DType::U32 | DType::U64 => t.uint64_data.len(),
        _ => t.int32_data.len(),
    };
    if count != n {
        return Err(len_err(count.saturating_mul(dtype.size())));
    }
    let mut data = ConstData::zeroed(bytes)?;
    let out = data.bytes_mut();
    let sz = dtype.size();
    for (i, chunk) in out.chunks_of_mut(sz).enumerate() {
        // The element's bit pattern; its low `sz` bytes, little-endian, are
        // the stored value. int32_data carries every type of 32 bits or less
        // (f16/bf16 as their bit patterns), uint64_data also u32.
        let bits: u64 = match dtype {
            DType::F32 => u64::from(t.float_data.get(i).copied().unwrap_or(0.0).to_bits()),
            DType::F64 => t.double_data.get(i).copied().unwrap_or(0.0).to_bits(),
            DType::I64 => t.int64_data.get(i).copied().unwrap_or(0) as u64,
            DType::U64 | DType::U32 => t.uint64_data.get(i).copied().unwrap_or(0),
            _ => u64::from(t.int32_data.get(i).copied().unwrap_or(0) as u32),
        };
        copy_exact(chunk, bits.to_le_bytes().get(..sz).unwrap_or(&[]))?;
    }
    Ok(Const { dtype, shape, data })
}

/// Sub-byte types come packed (low bits first, in `raw_data` or one packed
/// byte per `int32_data` entry); mote keeps them one element per byte.
fn unpack_sub_byte(
    dtype: DType,
    bits: u32,
    shape: Vec<usize>,
    n: usize,
    raw: Option<Bytes>,
    int32: &[i32],
) -> Result<Const> {
    let (per, mask): (usize, u8) = match bits {
        2 => (4, 0x03),
        4 => (2, 0x0F),
        _ => {
            return Err(Error::new(ErrorKind::Internal(
                "sub-byte unpack: 2 or 4 bits",
            )))
        }
    };
    let packed = n.div_ceil(per);
    let got = match &raw {
        Some(r) => r.len(),
        None => int32.len(),
    };
    if got != packed {
        return Err(Error::new(ErrorKind::Len {
            expected: packed as u64,
            got: got as u64,
        }));
    }
    let byte = |k: usize| -> u8 {
        match &raw {
            Some(r) => r.get(k).copied().unwrap_or(0),
            None => int32.get(k).copied().unwrap_or(0) as u8,
        }
    };
    let mut data = ConstData::zeroed(n)?;
    for (k, chunk) in data.bytes_mut().chunks_mut(per).enumerate() {
        let mut b = byte(k);
        for o in chunk {
            *o = dtype.unpack_code(b & mask);
            b = b.checked_shr(bits).unwrap_or(0);
        }
    }
    Ok(Const { dtype, shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto(
        code: i32,
        dims: &[i64],
        raw: Option<&[u8]>,
        int32: &[i32],
    ) -> mote_proto::TensorProto {
        mote_proto::TensorProto {
            dims: dims.to_vec(),
            data_type: Some(code),
            raw_data: raw.map(Bytes::copy_from_slice),
            int32_data: int32.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn sub_byte_tensors_are_unpacked_low_bits_first() {
        // INT4 [-8, 7, -1] packed: 0x78, then 0x0F with a padding nibble.
        let c = tensor_from_proto(proto(22, &[3], Some(&[0x78, 0x0F]), &[])).unwrap();
        assert_eq!(c.dtype, DType::I4);
        assert_eq!(c.data.bytes(), [0xF8, 0x07, 0xFF]);
        // UINT4 from int32_data: one packed byte per entry.
        let c = tensor_from_proto(proto(21, &[2], None, &[0xA5])).unwrap();
        assert_eq!(c.data.bytes(), [5, 10]);
        // INT2 [1, -2, -1, 0, 1]: 0b00_11_10_01, then 0b01.
        let c = tensor_from_proto(proto(26, &[5], Some(&[0b0011_1001, 0b01]), &[])).unwrap();
        assert_eq!(c.data.bytes(), [1, 0xFE, 0xFF, 0, 1]);
        // A byte short of the packed length is refused.
        assert!(tensor_from_proto(proto(23, &[3], Some(&[0x11]), &[])).is_err());
        // Float8 is one byte per element, in raw_data or int32_data.
        let c = tensor_from_proto(proto(17, &[2], None, &[0x38, 0x7E])).unwrap();
        assert_eq!(
            (c.dtype, c.data.bytes()),
            (DType::F8E4M3FN, &[0x38u8, 0x7E][..])
        );
    }

    /// Sizes past 32 bits: on a 32-bit target (this suite runs on i686 in
    /// CI) an element count or byte length over `usize::MAX` is an
    /// `Overflow` error, never a wrapped size; on 64-bit hosts the same
    /// tensors are merely large and a budget refuses them.
    #[test]
    fn sizes_past_32_bits() {
        use crate::error::checked_numel;
        let four_g = [65536usize, 65536];
        let r = checked_numel(&four_g);
        if cfg!(target_pointer_width = "32") {
            assert_eq!(r.unwrap_err().kind, ErrorKind::Overflow);
        } else {
            assert_eq!(r.unwrap() as u64, 1u64 << 32);
        }
        // An initializer of 2^30 floats (4 GiB of bytes) with 4 bytes of
        // data: the byte length overflows 32 bits; the data is short
        // everywhere.
        let e = tensor_from_proto(proto(1, &[1 << 15, 1 << 15], Some(&[0; 4]), &[])).unwrap_err();
        if cfg!(target_pointer_width = "32") {
            assert_eq!(e.kind, ErrorKind::Overflow);
        } else {
            assert!(matches!(e.kind, ErrorKind::Len { .. }), "{e:?}");
        }
        // A graph input of 2^32 elements: refused by the plan's checked
        // sizes on 32-bit, by a memory budget on 64-bit.
        use mote_proto::tensor_shape_proto::{dimension::Value, Dimension};
        let vi = |name: &str| mote_proto::ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(mote_proto::TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(1),
                    shape: Some(mote_proto::TensorShapeProto {
                        dim: [65536, 65536]
                            .iter()
                            .map(|&d| Dimension {
                                value: Some(Value::DimValue(d)),
                                denotation: None,
                            })
                            .collect(),
                    }),
                })),
                denotation: None,
            }),
            ..Default::default()
        };
        let p = mote_proto::ModelProto {
            opset_import: alloc::vec![mote_proto::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(13),
            }],
            graph: Some(mote_proto::GraphProto {
                node: alloc::vec![mote_proto::NodeProto {
                    op_type: Some("Relu".into()),
                    input: alloc::vec!["x".into()],
                    output: alloc::vec!["y".into()],
                    ..Default::default()
                }],
                input: alloc::vec![vi("x")],
                output: alloc::vec![vi("y")],
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = import_model(p).unwrap();
        let e = crate::SessionBuilder::new(&m)
            .max_memory(1 << 30)
            .plan()
            .unwrap_err();
        if cfg!(target_pointer_width = "32") {
            assert_eq!(e.kind, ErrorKind::Overflow);
        } else {
            assert!(matches!(e.kind, ErrorKind::OverBudget { .. }), "{e:?}");
        }
    }
}
