//! Graph IR: what an ONNX model becomes after import.
//!
//! A [`Model`] is immutable once built and shared by any number of sessions
//! (`Send + Sync`). Tensors are named once in [`Graph::tensors`]; nodes refer
//! to them by [`TensorId`]. Weights are stored 8-byte aligned ([`Const`]), so
//! kernels read them in place as typed slices.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;

use crate::error::{Error, ErrorKind, NodeId, Result, TensorId};
use crate::tensor::TensorView;
use crate::DType;

/// Bytes of a constant tensor, 8-byte aligned so that every dtype can be
/// read in place: either owned `u64` words, or a slice of the model buffer
/// that happens to be aligned (no copy at all).
#[derive(Clone, Debug)]
pub enum ConstData {
    /// Owned storage: `len` bytes in `u64` words.
    Owned {
        /// Storage.
        words: Vec<u64>,
        /// Length in bytes.
        len: usize,
    },
    /// A shared, 8-byte-aligned slice of the model's buffer.
    Shared(mote_proto::bytes::Bytes),
}

impl Default for ConstData {
    fn default() -> Self {
        ConstData::Owned {
            words: Vec::new(),
            len: 0,
        }
    }
}

impl ConstData {
    /// Zeroed storage of `len` bytes. `Err` (not abort) if the allocation fails.
    pub fn zeroed(len: usize) -> Result<Self> {
        let n = len.div_ceil(8);
        let mut words = Vec::new();
        words
            .try_reserve_exact(n)
            .map_err(|_| Error::new(ErrorKind::Alloc { bytes: len }))?;
        words.resize(n, 0);
        Ok(ConstData::Owned { words, len })
    }
    /// Copies bytes into aligned storage.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let mut c = Self::zeroed(b.len())?;
        crate::tensor::copy_exact(c.bytes_mut(), b)?;
        Ok(c)
    }
    /// Keeps a shared buffer if it is aligned, else copies it once.
    pub fn from_shared(b: mote_proto::bytes::Bytes) -> Result<Self> {
        if (b.as_ptr() as usize).is_multiple_of(8) {
            Ok(ConstData::Shared(b))
        } else {
            Self::from_bytes(&b)
        }
    }
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            ConstData::Owned { words, len } => {
                let all: &[u8] = bytemuck::cast_slice(words);
                all.get(..*len).unwrap_or(&[])
            }
            ConstData::Shared(b) => b,
        }
    }
    /// The bytes, mutable (a shared buffer is copied first).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        if let ConstData::Shared(b) = self {
            let mut words = alloc::vec![0u64; b.len().div_ceil(8)];
            let len = b.len();
            if let Some(dst) = bytemuck::cast_slice_mut::<u64, u8>(&mut words).get_mut(..len) {
                dst.copy_from_slice(b);
            }
            *self = ConstData::Owned { words, len };
        }
        match self {
            ConstData::Owned { words, len } => {
                let all: &mut [u8] = bytemuck::cast_slice_mut(words);
                all.get_mut(..*len).unwrap_or(&mut [])
            }
            ConstData::Shared(_) => &mut [],
        }
    }
}

/// A constant tensor (initializer, `Constant` node or folded value).
#[derive(Clone, Debug)]
pub struct Const {
    /// Element type.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Little-endian element bytes.
    pub data: ConstData,
}

impl Const {
    /// A view of the constant.
    pub fn view(&self) -> TensorView<'_> {
        // Length and shape agree by construction (every constructor checks).
        TensorView::from_parts(self.dtype, &self.shape, self.data.bytes())
    }
    /// A constant from typed values.
    pub fn from_slice<T: crate::Element>(shape: &[usize], v: &[T]) -> Result<Self> {
        let n = crate::error::checked_numel(shape)?;
        if n != v.len() {
            return Err(Error::new(ErrorKind::Len {
                expected: n as u64,
                got: v.len() as u64,
            }));
        }
        Ok(Const {
            dtype: T::DTYPE,
            shape: shape.into(),
            data: ConstData::from_bytes(bytemuck::cast_slice(v))?,
        })
    }
    /// Size in bytes.
    pub fn byte_len(&self) -> usize {
        self.data.bytes().len()
    }
}

/// One dimension as declared in the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A fixed size.
    Fixed(usize),
    /// A symbolic size (`dim_param`), bound at session build.
    Param(String),
    /// Neither value nor name given.
    Unknown,
}

/// A tensor of the graph: name, declared type, and value for constants.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// Name in the ONNX file.
    pub name: String,
    /// Declared element type, if known before shape inference.
    pub dtype: Option<DType>,
    /// Declared shape, if any.
    pub shape: Option<Vec<Dim>>,
    /// Value of initializers and `Constant` outputs.
    pub value: Option<Const>,
    /// The ONNX type code, kept for unsupported types (e.g. strings).
    pub onnx_type: i32,
}

/// An attribute value.
#[derive(Clone, Debug)]
pub enum AttrValue {
    /// `INT`
    Int(i64),
    /// `FLOAT`
    Float(f32),
    /// `STRING` (bytes, usually UTF-8)
    Str(Vec<u8>),
    /// `INTS`
    Ints(Vec<i64>),
    /// `FLOATS`
    Floats(Vec<f32>),
    /// `STRINGS`
    Strings(Vec<Vec<u8>>),
    /// `TENSOR`
    Tensor(Const),
    /// `GRAPH` (control flow bodies)
    Graph(Box<Graph>),
    /// `GRAPHS`
    Graphs(Vec<Graph>),
    /// Types mote does not read (sparse tensors, type protos).
    Other,
}

/// A named attribute.
#[derive(Clone, Debug)]
pub struct Attr {
    /// Name.
    pub name: String,
    /// Value.
    pub value: AttrValue,
}

/// A node of the graph.
#[derive(Clone, Debug)]
pub struct Node {
    /// Node name (may be empty).
    pub name: String,
    /// Operator type, e.g. `Conv`.
    pub op_type: String,
    /// Operator domain; empty for the default `ai.onnx` domain.
    pub domain: String,
    /// Opset version that applies to this node (from the model's imports).
    pub opset: i64,
    /// Inputs; `None` for omitted optional inputs (empty name in ONNX).
    pub inputs: Vec<Option<TensorId>>,
    /// Outputs; `None` for omitted optional outputs.
    pub outputs: Vec<Option<TensorId>>,
    /// Attributes.
    pub attrs: Vec<Attr>,
}

/// Outer-scope names the subgraph attributes of a node capture, sorted,
/// without repeats. The importer appends them, in this order, to the node's
/// inputs after its ONNX inputs, so the planner sees what a control-flow
/// node reads and keeps it alive.
pub fn captured_names(attrs: &[Attr]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for a in attrs {
        let graphs: &[Graph] = match &a.value {
            AttrValue::Graph(g) => core::slice::from_ref(&**g),
            AttrValue::Graphs(g) => g,
            _ => continue,
        };
        for g in graphs {
            v.extend(g.free_names().into_iter().map(String::from));
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

impl Node {
    /// The attribute of this name.
    pub fn attr(&self, name: &str) -> Option<&AttrValue> {
        self.attrs.iter().find(|a| a.name == name).map(|a| &a.value)
    }
}

/// A computation graph.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// Every tensor named in the graph.
    pub tensors: Vec<TensorInfo>,
    /// Nodes in file order (not necessarily topological).
    pub nodes: Vec<Node>,
    /// Graph inputs that are not initializers (what the caller feeds).
    pub inputs: Vec<TensorId>,
    /// Graph outputs.
    pub outputs: Vec<TensorId>,
}

impl Graph {
    /// Calls `f` on every constant of this graph and of its subgraphs
    /// (initializers, `Constant` values, tensor attributes, bodies).
    pub fn for_each_const_mut(
        &mut self,
        f: &mut dyn FnMut(&mut Const) -> Result<()>,
    ) -> Result<()> {
        for t in &mut self.tensors {
            if let Some(c) = &mut t.value {
                f(c)?;
            }
        }
        for n in &mut self.nodes {
            for a in &mut n.attrs {
                match &mut a.value {
                    AttrValue::Tensor(c) => f(c)?,
                    AttrValue::Graph(g) => g.for_each_const_mut(f)?,
                    AttrValue::Graphs(gs) => {
                        for g in gs {
                            g.for_each_const_mut(f)?;
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Copies every constant that still slices a shared model buffer into
    /// owned storage, so that the buffer can be freed.
    ///
    /// A model imported with [`Model::from_onnx_shared`] keeps the whole
    /// file alive while any weight slices it; after rewrites that replace
    /// most weights (BatchNorm folding makes new convolution weights), that
    /// is the file's size held for a few slices.
    pub fn unshare_consts(&mut self) -> Result<()> {
        self.for_each_const_mut(&mut |c| {
            if let ConstData::Shared(b) = &c.data {
                c.data = ConstData::from_bytes(b)?;
            }
            Ok(())
        })
    }

    /// Bytes of the constants that slice a shared model buffer.
    pub fn shared_const_bytes(&mut self) -> usize {
        let mut n = 0usize;
        let _ = self.for_each_const_mut(&mut |c| {
            if let ConstData::Shared(b) = &c.data {
                n = n.saturating_add(b.len());
            }
            Ok(())
        });
        n
    }

    /// Names this graph reads but neither defines, receives nor holds as
    /// constants: the outer-scope values a control-flow body captures.
    /// Sorted, without repeats.
    pub fn free_names(&self) -> Vec<&str> {
        let mut produced = alloc::vec![false; self.tensors.len()];
        for n in &self.nodes {
            for &o in n.outputs.iter().flatten() {
                if let Some(p) = produced.get_mut(o as usize) {
                    *p = true;
                }
            }
        }
        let read = self
            .nodes
            .iter()
            .flat_map(|n| n.inputs.iter().flatten())
            .chain(self.outputs.iter());
        let mut v: Vec<&str> = Vec::new();
        for &t in read {
            let Some(info) = self.tensors.get(t as usize) else {
                continue;
            };
            if info.value.is_none()
                && !self.inputs.contains(&t)
                && !produced.get(t as usize).copied().unwrap_or(true)
            {
                v.push(&info.name);
            }
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Bytes of the constants (weights) the graph holds.
    pub fn const_bytes(&self) -> usize {
        self.tensors
            .iter()
            .filter_map(|t| t.value.as_ref())
            .fold(0usize, |a, c| a.saturating_add(c.byte_len()))
    }
    /// The tensor of this name.
    pub fn tensor_id(&self, name: &str) -> Option<TensorId> {
        self.tensors
            .iter()
            .position(|t| t.name == name)
            .map(|i| i as TensorId)
    }
    /// Tensor info by id.
    pub fn tensor(&self, id: TensorId) -> Result<&TensorInfo> {
        self.tensors
            .get(id as usize)
            .ok_or(Error::new(ErrorKind::Internal("bad tensor id")).at_tensor(id))
    }
    /// Node by id.
    pub fn node(&self, id: NodeId) -> Result<&Node> {
        self.nodes
            .get(id as usize)
            .ok_or(Error::new(ErrorKind::Internal("bad node id")).at_node(id))
    }

    /// Nodes in a topological order (stable: file order where free). A node
    /// that depends on a tensor nobody produces is an error naming it, and
    /// a cycle is an error naming one node on it.
    pub fn topo_order(&self) -> Result<Vec<NodeId>> {
        let nt = self.tensors.len();
        let mut producer: Vec<Option<NodeId>> = alloc::vec![None; nt];
        for (ni, n) in self.nodes.iter().enumerate() {
            for &o in n.outputs.iter().flatten() {
                let slot = producer
                    .get_mut(o as usize)
                    .ok_or(Error::new(ErrorKind::Internal("tensor id")))?;
                if slot.is_some() {
                    return Err(
                        Error::new(ErrorKind::Invalid("tensor produced by two nodes"))
                            .at_node(ni as NodeId)
                            .at_tensor(o),
                    );
                }
                *slot = Some(ni as NodeId);
            }
        }
        for (ti, t) in self.tensors.iter().enumerate() {
            if t.value.is_some() {
                if let Some(Some(n)) = producer.get(ti) {
                    return Err(Error::new(ErrorKind::Invalid(
                        "node output has the name of an initializer",
                    ))
                    .at_node(*n)
                    .at_tensor(ti as TensorId));
                }
            }
        }
        let mut is_input = alloc::vec![false; nt];
        for &i in &self.inputs {
            if let Some(s) = is_input.get_mut(i as usize) {
                *s = true;
            }
        }
        // Count unresolved dependencies per node; consumers per node.
        let mut pending = alloc::vec![0usize; self.nodes.len()];
        let mut consumers: Vec<Vec<NodeId>> = alloc::vec![Vec::new(); self.nodes.len()];
        for (ni, n) in self.nodes.iter().enumerate() {
            for &i in n.inputs.iter().flatten() {
                let t = self
                    .tensors
                    .get(i as usize)
                    .ok_or(Error::new(ErrorKind::Internal("tensor id")))?;
                match producer.get(i as usize).copied().flatten() {
                    Some(p) => {
                        if p as usize == ni {
                            return Err(Error::new(ErrorKind::Cycle).at_node(p).at_tensor(i));
                        }
                        if let Some(c) = pending.get_mut(ni) {
                            *c = c.saturating_add(1);
                        }
                        if let Some(c) = consumers.get_mut(p as usize) {
                            c.push(ni as NodeId);
                        }
                    }
                    None => {
                        if t.value.is_none() && !is_input.get(i as usize).copied().unwrap_or(false)
                        {
                            return Err(Error::new(ErrorKind::MissingTensor)
                                .at_node(ni as NodeId)
                                .at_tensor(i));
                        }
                    }
                }
            }
        }
        // Kahn's algorithm with a min-heap on file order keeps the order stable.
        let mut ready: alloc::collections::BinaryHeap<core::cmp::Reverse<NodeId>> =
            (0..self.nodes.len())
                .filter(|&i| pending.get(i) == Some(&0))
                .map(|i| core::cmp::Reverse(i as NodeId))
                .collect();
        let mut order = Vec::with_capacity(self.nodes.len());
        while let Some(core::cmp::Reverse(n)) = ready.pop() {
            order.push(n);
            if let Some(cs) = consumers.get(n as usize) {
                for &c in cs {
                    if let Some(p) = pending.get_mut(c as usize) {
                        *p = p.saturating_sub(1);
                        if *p == 0 {
                            ready.push(core::cmp::Reverse(c));
                        }
                    }
                }
            }
        }
        if order.len() != self.nodes.len() {
            let stuck = pending.iter().position(|&p| p > 0).unwrap_or(0);
            return Err(Error::new(ErrorKind::Cycle).at_node(stuck as NodeId));
        }
        for &o in &self.outputs {
            let produced = producer.get(o as usize).copied().flatten().is_some();
            let t = self.tensor(o)?;
            if !produced && t.value.is_none() && !is_input.get(o as usize).copied().unwrap_or(false)
            {
                return Err(Error::new(ErrorKind::MissingTensor).at_tensor(o));
            }
        }
        Ok(order)
    }
}

/// An imported model: metadata and its main graph.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// `producer_name` of the file (e.g. `pytorch`, `skl2onnx`).
    pub producer: String,
    /// `producer_version`.
    pub producer_version: String,
    /// ONNX IR version.
    pub ir_version: i64,
    /// Opset imports: (domain, version); domain `""` is `ai.onnx`.
    pub opsets: Vec<(String, i64)>,
    /// The main graph.
    pub graph: Graph,
    /// What the QDQ fusion pass did, per node that touches Q/DQ
    /// ([`crate::optimize`]); empty for float models.
    pub fusions: Vec<crate::optimize::Fusion>,
    /// Inputs and outputs made 8-bit by [`crate::optimize::int8_io`].
    pub io_quant: Vec<crate::optimize::IoQuant>,
    /// What the float rewrites did ([`crate::optimize::float`]), in order.
    pub rewrites: Vec<crate::optimize::float::Rewrite>,
}

impl Model {
    /// Opset version imported for a domain (`""` or `ai.onnx` is the default).
    pub fn opset(&self, domain: &str) -> Option<i64> {
        let d = if domain == "ai.onnx" { "" } else { domain };
        self.opsets
            .iter()
            .find(|(n, _)| n == d || (d.is_empty() && n == "ai.onnx"))
            .map(|&(_, v)| v)
    }

    /// Names of the graph inputs the caller feeds (not initializers).
    pub fn input_names(&self) -> impl Iterator<Item = &str> {
        self.graph
            .inputs
            .iter()
            .filter_map(|&i| self.graph.tensors.get(i as usize))
            .map(|t| t.name.as_str())
    }

    /// Names of the graph outputs.
    pub fn output_names(&self) -> impl Iterator<Item = &str> {
        self.graph
            .outputs
            .iter()
            .filter_map(|&i| self.graph.tensors.get(i as usize))
            .map(|t| t.name.as_str())
    }

    /// Stores the f32 weights of Conv, ConvTranspose, MatMul and Gemm (and of
    /// the optimizer's FusedConv / FusedGemm) as f16,
    /// halving their bytes: every f32 initializer read only as input 1 (the
    /// weight) of those ops, and not a graph input or output nor named by a
    /// control-flow body, is rounded to f16 (nearest even). Those kernels
    /// take f16 weights against f32 activations, widening each weight as
    /// they read it and accumulating in f32, so results differ from the f32
    /// model only by the weights' rounding (about 2^-11 relative). Returns
    /// the initializer bytes of the whole graph (before, after).
    pub fn weights_to_f16(&mut self) -> (usize, usize) {
        let g = &mut self.graph;
        let bytes = |g: &Graph| -> usize {
            g.tensors
                .iter()
                .filter_map(|t| t.value.as_ref())
                .map(Const::byte_len)
                .sum()
        };
        let before = bytes(g);
        let n = g.tensors.len();
        // Per tensor: read somewhere else than a weight slot of the four ops.
        let mut other_use = alloc::vec![false; n];
        let mut weight_use = alloc::vec![false; n];
        let mut captured: Vec<&str> = Vec::new();
        for node in &g.nodes {
            let weighty = match node.domain.as_str() {
                "" => matches!(
                    node.op_type.as_str(),
                    "Conv" | "ConvTranspose" | "MatMul" | "Gemm"
                ),
                // The optimizer's Conv / Gemm with a fused activation.
                "com.microsoft" => matches!(node.op_type.as_str(), "FusedConv" | "FusedGemm"),
                _ => false,
            };
            for (i, t) in node.inputs.iter().enumerate() {
                if let Some(&t) = t.as_ref() {
                    let slot = if weighty && i == 1 {
                        &mut weight_use
                    } else {
                        &mut other_use
                    };
                    if let Some(u) = slot.get_mut(t as usize) {
                        *u = true;
                    }
                }
            }
            for a in &node.attrs {
                match &a.value {
                    AttrValue::Graph(b) => captured.extend(b.free_names()),
                    AttrValue::Graphs(bs) => {
                        bs.iter().for_each(|b| captured.extend(b.free_names()))
                    }
                    _ => {}
                }
            }
        }
        for &t in g.inputs.iter().chain(&g.outputs) {
            if let Some(u) = other_use.get_mut(t as usize) {
                *u = true;
            }
        }
        let captured: Vec<String> = captured.into_iter().map(String::from).collect();
        for (k, t) in g.tensors.iter_mut().enumerate() {
            if weight_use.get(k) != Some(&true)
                || other_use.get(k) == Some(&true)
                || captured.contains(&t.name)
            {
                continue;
            }
            let Some(c) = t.value.as_ref() else {
                continue;
            };
            if c.dtype != DType::F32 {
                continue;
            }
            let Ok(v) = c.view().as_slice::<f32>() else {
                continue;
            };
            let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
            if let Ok(nc) = Const::from_slice(&c.shape, &h) {
                t.value = Some(nc);
                t.dtype = Some(DType::F16);
                t.onnx_type = DType::F16.onnx_code();
            }
        }
        (before, bytes(g))
    }

    /// Resolves an error's node and tensor indices to names, for display:
    /// `unsupported operator at opset 13: node 'conv1' (Conv)`.
    pub fn explain<'a>(&'a self, e: &'a Error) -> Explained<'a> {
        Explained {
            graph: Some(&self.graph),
            error: e,
        }
    }
}

/// An [`Error`] displayed with the node and tensor names of its graph.
#[derive(Debug)]
pub struct Explained<'a> {
    pub(crate) graph: Option<&'a Graph>,
    pub(crate) error: &'a Error,
}

impl core::fmt::Display for Explained<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let Some(g) = self.graph else {
            return self.error.fmt(f);
        };
        self.error.kind.fmt(f)?;
        if let Some(n) = self.error.node.and_then(|n| g.nodes.get(n as usize)) {
            let dom = if n.domain.is_empty() {
                String::new()
            } else {
                alloc::format!("{}.", n.domain)
            };
            if n.name.is_empty() {
                write!(
                    f,
                    ": node #{} ({dom}{}, opset {})",
                    self.error.node.unwrap_or(0),
                    n.op_type,
                    n.opset
                )?;
            } else {
                write!(
                    f,
                    ": node '{}' ({dom}{}, opset {})",
                    n.name, n.op_type, n.opset
                )?;
            }
        }
        if let Some(t) = self.error.tensor.and_then(|t| g.tensors.get(t as usize)) {
            write!(f, ", tensor '{}'", t.name)?;
        }
        Ok(())
    }
}
