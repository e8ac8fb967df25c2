//! Operators: one file per family, each exporting a table of [`OpDef`].
//!
//! An operator has two halves (the TFLM split):
//! - **prepare** runs once at session build: it validates dtypes, shapes and
//!   attributes, infers the output shapes, sizes its scratch and returns a
//!   [`Kernel`] holding every parameter precomputed;
//! - the **kernel** runs at each inference over arena memory; it does not
//!   allocate, and fails only on what prepare could not have checked.
//!
//! Adding an operator touches its family file (table entry, prepare, kernel,
//! tests) and nothing else. [`find`] picks, among the entries of one op type,
//! the newest `since` not above the node's opset.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::marker::PhantomData;

use crate::error::{Error, ErrorKind, Result, TensorId};
use crate::model::{AttrValue, Const, Graph, Node};
use crate::tensor::{TensorMut, TensorView, MAX_RANK};
use crate::{DType, Element};

pub mod activation;
pub mod attention;
pub mod control;
pub mod conv;
pub mod einsum;
pub mod elementwise;
pub mod image;
pub mod index;
pub mod logic;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod pool;
pub mod qdq;
pub mod qlinear;
pub mod qoperator;
pub mod quant;
pub mod reduce;
pub use crate::kern::requant;
pub mod resize;
pub mod rnn;
pub mod select;
pub mod sequence_models;
pub mod shape;
pub mod signal;

/// Builds an operator's kernel for one node; see the module docs.
pub type PrepareFn = fn(&PrepareCtx<'_>) -> Result<Prepared>;

/// One operator (at one opset range) in a family table.
#[derive(Debug)]
pub struct OpDef {
    /// ONNX op type, e.g. `"Conv"`.
    pub op_type: &'static str,
    /// Domain; `""` is the default `ai.onnx` domain.
    pub domain: &'static str,
    /// First opset version this entry implements.
    pub since: i64,
    /// Validation, shape inference and kernel construction.
    pub prepare: PrepareFn,
}

impl OpDef {
    /// An entry of the default domain.
    pub const fn onnx(op_type: &'static str, since: i64, prepare: PrepareFn) -> Self {
        OpDef {
            op_type,
            domain: "",
            since,
            prepare,
        }
    }
    /// An entry of another domain (`com.microsoft`, mote's own `mote`).
    pub const fn domain(
        domain: &'static str,
        op_type: &'static str,
        since: i64,
        prepare: PrepareFn,
    ) -> Self {
        OpDef {
            op_type,
            domain,
            since,
            prepare,
        }
    }
}

/// Every family's table, in one list.
pub const FAMILIES: &[&[OpDef]] = &[
    elementwise::OPS,
    activation::OPS,
    logic::OPS,
    matmul::OPS,
    conv::OPS,
    pool::OPS,
    norm::OPS,
    shape::OPS,
    index::OPS,
    reduce::OPS,
    resize::OPS,
    attention::OPS,
    rnn::OPS,
    einsum::OPS,
    select::OPS,
    loss::OPS,
    image::OPS,
    signal::OPS,
    control::OPS,
    quant::OPS,
    sequence_models::OPS,
    qlinear::OPS,
    qdq::OPS,
    qoperator::OPS,
];

/// The entry for `op_type` in `domain` that applies at `opset`: the one with
/// the greatest `since <= opset`.
pub fn find(domain: &str, op_type: &str, opset: i64) -> Option<&'static OpDef> {
    let domain = if domain == "ai.onnx" { "" } else { domain };
    let mut best: Option<&'static OpDef> = None;
    for fam in FAMILIES {
        for d in fam.iter() {
            if d.op_type == op_type
                && d.domain == domain
                && d.since <= opset
                && best.is_none_or(|b| d.since > b.since)
            {
                best = Some(d);
            }
        }
    }
    best
}

/// Every (domain, op type) mote has a kernel for, sorted, without repeats.
pub fn supported_ops() -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<_> = FAMILIES
        .iter()
        .flat_map(|f| f.iter().map(|d| (d.domain, d.op_type)))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// What prepare knows of one input.
#[derive(Clone, Copy, Debug)]
pub struct InputInfo<'a> {
    /// Element type.
    pub dtype: DType,
    /// Shape (fully known: bound at session build).
    pub shape: &'a [usize],
    /// The value, when the input is a constant (weights, folded shapes).
    pub value: Option<TensorView<'a>>,
}

impl InputInfo<'_> {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Output of prepare: output types and the kernel.
#[derive(Debug)]
pub struct Prepared {
    /// One entry per node output, in order.
    pub outputs: Vec<OutputInfo>,
    /// The kernel; unused when `alias` or `values` is set.
    pub kernel: Box<dyn Kernel>,
    /// Scratch bytes the kernel needs (planned in the arena, live only
    /// during this step).
    pub scratch: usize,
    /// Output 0 is input 0's bytes under a new shape (Reshape, Flatten,
    /// Squeeze, Unsqueeze, Identity): no kernel runs, no memory is used.
    pub alias: bool,
    /// Output 0 may overwrite input 0's buffer when input 0 dies here (same
    /// byte size); the kernel then sees [`KernelIo::is_inplace`].
    pub inplace: bool,
    /// Output values known at build time from shapes alone (`Shape`, `Size`).
    pub values: Option<Vec<Const>>,
    /// Output shapes depend on input values (NonZero, Unique, Compress,
    /// NonMaxSuppression): `outputs` are upper bounds the arena holds, and
    /// the kernel reports the real shapes with [`KernelIo::set_output_shape`].
    pub dynamic: bool,
    /// Heap bytes the kernel holds: constant weights packed at build time
    /// (made only where [`PrepareCtx::may_pack`]).
    pub heap: usize,
}

/// Dtype and shape of one output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputInfo {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
}

impl OutputInfo {
    /// Output of a dtype and shape.
    pub fn new(dtype: DType, shape: &[usize]) -> Self {
        OutputInfo {
            dtype,
            shape: shape.into(),
        }
    }
}

impl Prepared {
    /// A kernel with these outputs, no scratch, not in place.
    pub fn new(outputs: Vec<OutputInfo>, kernel: impl Kernel + 'static) -> Self {
        Prepared {
            outputs,
            kernel: Box::new(kernel),
            scratch: 0,
            alias: false,
            inplace: false,
            values: None,
            dynamic: false,
            heap: 0,
        }
    }
    /// One output.
    pub fn single(dtype: DType, shape: &[usize], kernel: impl Kernel + 'static) -> Self {
        Self::new(alloc::vec![OutputInfo::new(dtype, shape)], kernel)
    }
    /// Output 0 is a view of input 0 with this shape.
    pub fn alias(dtype: DType, shape: &[usize]) -> Self {
        let mut p = Self::single(dtype, shape, NoKernel);
        p.alias = true;
        p
    }
    /// Outputs known at build time.
    pub fn values(values: Vec<Const>) -> Self {
        let outputs = values
            .iter()
            .map(|c| OutputInfo::new(c.dtype, &c.shape))
            .collect();
        let mut p = Self::new(outputs, NoKernel);
        p.values = Some(values);
        p
    }
    /// Sets the scratch size.
    pub fn with_scratch(mut self, bytes: usize) -> Self {
        self.scratch = bytes;
        self
    }
    /// Holds `bytes` of packed weights ([`Prepared::heap`]).
    pub fn with_heap(mut self, bytes: usize) -> Self {
        self.heap = bytes;
        self
    }
    /// Allows running in place over input 0.
    pub fn in_place(mut self) -> Self {
        self.inplace = true;
        self
    }
    /// Marks the output shapes as upper bounds (see [`Prepared::dynamic`]).
    pub fn dynamic_shapes(mut self) -> Self {
        self.dynamic = true;
        self
    }
}

/// A prepared operator instance, run at every inference.
pub trait Kernel: Send + Sync + core::fmt::Debug {
    /// Computes the outputs. Must not allocate.
    fn run(&self, io: &mut KernelIo<'_>) -> Result<()>;

    /// The kernel as `Any`, for kernels that a compiled model can carry
    /// (`mote compile` looks for them); `None` for all others.
    #[doc(hidden)]
    fn as_any(&self) -> Option<&dyn core::any::Any> {
        None
    }
}

/// Wraps a closure as a [`Kernel`] (`Debug` prints the op name).
pub struct FnKernel<F>(pub &'static str, pub F);

impl<F> core::fmt::Debug for FnKernel<F> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl<F: Fn(&mut KernelIo<'_>) -> Result<()> + Send + Sync> Kernel for FnKernel<F> {
    fn run(&self, io: &mut KernelIo<'_>) -> Result<()> {
        (self.1)(io)
    }
}

/// `Prepared::single(dt, shape, kernel("Relu", move |io| ...))`.
pub fn kernel<F: Fn(&mut KernelIo<'_>) -> Result<()> + Send + Sync + 'static>(
    name: &'static str,
    f: F,
) -> FnKernel<F> {
    FnKernel(name, f)
}

/// The kernel of aliases and build-time values: never runs.
#[derive(Debug)]
pub struct NoKernel;

impl Kernel for NoKernel {
    fn run(&self, _io: &mut KernelIo<'_>) -> Result<()> {
        Err(Error::new(ErrorKind::Internal("NoKernel ran")))
    }
}

/// What prepare sees of a node: attributes, opset and inputs.
#[derive(Debug)]
pub struct PrepareCtx<'a> {
    /// The node.
    pub node: &'a Node,
    /// Opset version of the node's domain.
    pub opset: i64,
    pub(crate) inputs: &'a [Option<InputInfo<'a>>],
    pub(crate) limits: crate::plan::Limits,
}

fn attr_err(name: &'static str, problem: &'static str) -> Error {
    Error::new(ErrorKind::Attribute { name, problem })
}

impl<'a> PrepareCtx<'a> {
    /// A context over explicit inputs (used by tests and by build-time folding).
    pub fn new(node: &'a Node, opset: i64, inputs: &'a [Option<InputInfo<'a>>]) -> Self {
        PrepareCtx {
            node,
            opset,
            inputs,
            limits: crate::plan::Limits::default(),
        }
    }
    /// Refuses, before it is allocated, heap memory of `numel` elements of
    /// `elem_bytes` each that this prepare would take in proportion to a
    /// model's values or dims (window tables, ranges, resize taps) beyond
    /// what the build may still take ([`crate::SessionBuilder::max_memory`],
    /// by default [`crate::plan::DEFAULT_MAX_BUILD_HEAP`]).
    pub fn check_alloc(&self, numel: usize, elem_bytes: usize) -> Result<()> {
        let bytes = numel
            .checked_mul(elem_bytes)
            .ok_or(Error::new(ErrorKind::Overflow))?;
        if bytes > self.limits.heap_bytes {
            return Err(Error::new(ErrorKind::OverBudget {
                needed: bytes,
                budget: self.limits.heap_bytes,
            }));
        }
        Ok(())
    }
    /// Whether the kernel may keep a packed copy of constant weights
    /// ([`Prepared::heap`]): not under a caller's
    /// [`crate::SessionBuilder::max_memory`].
    pub fn may_pack(&self) -> bool {
        self.limits.pack
    }
    /// The same context under the build's bounds.
    pub(crate) fn with_limits(mut self, limits: crate::plan::Limits) -> Self {
        self.limits = limits;
        self
    }
    /// Number of input slots (including omitted optional ones).
    pub fn num_inputs(&self) -> usize {
        self.inputs.len()
    }
    /// Number of output slots the node declares.
    pub fn num_outputs(&self) -> usize {
        self.node.outputs.len()
    }
    /// Whether output `i` is present (named) in the node.
    pub fn has_output(&self, i: usize) -> bool {
        matches!(self.node.outputs.get(i), Some(Some(_)))
    }
    /// Input `i`, required.
    pub fn input(&self, i: usize) -> Result<&InputInfo<'a>> {
        self.opt_input(i)
            .ok_or(Error::new(ErrorKind::MissingInput { index: i }))
    }
    /// Input `i` if present.
    pub fn opt_input(&self, i: usize) -> Option<&InputInfo<'a>> {
        self.inputs.get(i).and_then(|x| x.as_ref())
    }
    /// Input `i`, required, of dtype `dt`.
    pub fn input_of(&self, i: usize, dt: DType) -> Result<&InputInfo<'a>> {
        let x = self.input(i)?;
        if x.dtype != dt {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: dt,
                got: x.dtype,
            }));
        }
        Ok(x)
    }
    /// Value of a constant input read as i64 (any integer dtype); `Err` if
    /// the input is not known at build time.
    pub fn const_ints(&self, i: usize) -> Result<Option<Vec<i64>>> {
        let Some(x) = self.opt_input(i) else {
            return Ok(None);
        };
        let v = x.value.ok_or(Error::new(ErrorKind::Unsupported(
            "input that sets a shape must be known at build time (constant or computed from shapes)",
        )))?;
        if !v.dtype().is_int() {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: DType::I64,
                got: v.dtype(),
            }));
        }
        let mut out = Vec::with_capacity(v.numel());
        for k in 0..v.numel() {
            out.push(
                v.int_at(k)
                    .ok_or(Error::new(ErrorKind::Internal("int read")))?,
            );
        }
        Ok(Some(out))
    }
    /// Value of a constant float input as f32 values (any float dtype).
    pub fn const_floats(&self, i: usize) -> Result<Option<Vec<f32>>> {
        let Some(x) = self.opt_input(i) else {
            return Ok(None);
        };
        let v = x.value.ok_or(Error::new(ErrorKind::Unsupported(
            "input must be known at build time",
        )))?;
        let mut out = Vec::with_capacity(v.numel());
        for k in 0..v.numel() {
            out.push(
                v.f64_at(k)
                    .ok_or(Error::new(ErrorKind::Internal("float read")))? as f32,
            );
        }
        Ok(Some(out))
    }
    fn raw_attr(&self, name: &str) -> Option<&'a AttrValue> {
        self.node.attr(name)
    }
    /// Integer attribute, or `default` if absent.
    pub fn attr_int(&self, name: &'static str, default: i64) -> Result<i64> {
        match self.raw_attr(name) {
            None => Ok(default),
            Some(AttrValue::Int(v)) => Ok(*v),
            Some(_) => Err(attr_err(name, "expected an INT")),
        }
    }
    /// Float attribute, or `default` if absent.
    pub fn attr_float(&self, name: &'static str, default: f32) -> Result<f32> {
        match self.raw_attr(name) {
            None => Ok(default),
            Some(AttrValue::Float(v)) => Ok(*v),
            Some(AttrValue::Int(v)) => Ok(*v as f32),
            Some(_) => Err(attr_err(name, "expected a FLOAT")),
        }
    }
    /// Integer-list attribute, if present.
    pub fn attr_ints(&self, name: &'static str) -> Result<Option<&'a [i64]>> {
        match self.raw_attr(name) {
            None => Ok(None),
            Some(AttrValue::Ints(v)) => Ok(Some(v)),
            Some(_) => Err(attr_err(name, "expected INTS")),
        }
    }
    /// Float-list attribute, if present.
    pub fn attr_floats(&self, name: &'static str) -> Result<Option<&'a [f32]>> {
        match self.raw_attr(name) {
            None => Ok(None),
            Some(AttrValue::Floats(v)) => Ok(Some(v)),
            Some(_) => Err(attr_err(name, "expected FLOATS")),
        }
    }
    /// String attribute as UTF-8, or `default` if absent.
    pub fn attr_str(&self, name: &'static str, default: &'static str) -> Result<&'a str> {
        match self.raw_attr(name) {
            None => Ok(default),
            Some(AttrValue::Str(v)) => {
                core::str::from_utf8(v).map_err(|_| attr_err(name, "not UTF-8"))
            }
            Some(_) => Err(attr_err(name, "expected a STRING")),
        }
    }
    /// Tensor attribute, if present.
    pub fn attr_tensor(&self, name: &'static str) -> Result<Option<&'a Const>> {
        match self.raw_attr(name) {
            None => Ok(None),
            Some(AttrValue::Tensor(t)) => Ok(Some(t)),
            Some(_) => Err(attr_err(name, "expected a TENSOR")),
        }
    }
}

/// Where a planned tensor's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loc {
    /// Not placed yet (during build).
    None,
    /// `len` bytes at `offset` in the arena.
    Arena { offset: usize, len: usize },
    /// The value of a model tensor (initializer or Constant).
    Model(TensorId),
    /// A constant computed at build time.
    Folded(u32),
}

/// A tensor of the plan: type, shape, location.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub loc: Loc,
}

/// The memory a kernel reads and writes during one step.
///
/// Inputs are read-only views; outputs and scratch are exclusive. The
/// planner guarantees they do not overlap, except that in place
/// ([`Prepared::in_place`]) output 0 *is* input 0.
pub struct KernelIo<'a> {
    pub(crate) slots: &'a [Slot],
    pub(crate) graph: &'a Graph,
    pub(crate) folded: &'a [Const],
    pub(crate) base: *mut u8,
    pub(crate) base_len: usize,
    pub(crate) inputs: &'a [Option<TensorId>],
    pub(crate) outputs: &'a [Option<TensorId>],
    pub(crate) scratch: (usize, usize),
    pub(crate) inplace: bool,
    /// Arena offset of this step's shape records (dynamic steps only).
    pub(crate) shapes: Option<usize>,
    pub(crate) _arena: PhantomData<&'a mut [u8]>,
}

/// Words of one run-time shape record in the arena: rank, then dims.
pub(crate) const SHAPE_RECORD: usize = 1 + MAX_RANK;
/// Bytes of one shape record.
pub(crate) const SHAPE_RECORD_BYTES: usize = SHAPE_RECORD * core::mem::size_of::<usize>();

/// Writes `shape` into a shape record: rank first, then the dims, the rest
/// zero (dims past the record's room are not written).
pub(crate) fn write_shape_record(rec: &mut [usize], shape: &[usize]) {
    rec.fill(0);
    if let Some((rank, dims)) = rec.split_first_mut() {
        *rank = shape.len();
        for (r, &d) in dims.iter_mut().zip(shape) {
            *r = d;
        }
    }
}

impl core::fmt::Debug for KernelIo<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("KernelIo")
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .finish()
    }
}

impl<'a> KernelIo<'a> {
    fn slot(&self, id: TensorId) -> Result<&'a Slot> {
        self.slots
            .get(id as usize)
            .ok_or(Error::new(ErrorKind::Internal("slot id")))
    }

    fn const_bytes(&self, loc: Loc) -> Result<&'a [u8]> {
        match loc {
            Loc::Model(t) => self
                .graph
                .tensors
                .get(t as usize)
                .and_then(|t| t.value.as_ref())
                .map(|c| c.data.bytes())
                .ok_or(Error::new(ErrorKind::Internal("model const"))),
            Loc::Folded(i) => self
                .folded
                .get(i as usize)
                .map(|c| c.data.bytes())
                .ok_or(Error::new(ErrorKind::Internal("folded"))),
            _ => Err(Error::new(ErrorKind::Internal("not a constant"))),
        }
    }

    fn arena_range(&self, offset: usize, len: usize) -> Result<*mut u8> {
        match offset.checked_add(len) {
            Some(end) if end <= self.base_len => Ok(self.base.wrapping_add(offset)),
            _ => Err(Error::new(ErrorKind::Internal("arena range"))),
        }
    }

    /// True when output 0 shares input 0's buffer: read input 0 through the
    /// output (see [`KernelIo::unary`]).
    pub fn is_inplace(&self) -> bool {
        self.inplace
    }

    /// Number of input slots of the node.
    pub fn num_inputs(&self) -> usize {
        self.inputs.len()
    }

    /// Input `i`, if present.
    pub fn opt_input(&self, i: usize) -> Result<Option<TensorView<'a>>> {
        if self.inplace && i == 0 {
            return Err(Error::new(ErrorKind::Internal(
                "input 0 is in place: read it through the output",
            )));
        }
        let Some(Some(id)) = self.inputs.get(i) else {
            return Ok(None);
        };
        let s = self.slot(*id)?;
        let data: &'a [u8] = match s.loc {
            Loc::Arena { offset, len } => {
                let p = self.arena_range(offset, len)?;
                // SAFETY: the range is inside the arena (checked above), the
                // arena outlives 'a, and the planner never lets a step's
                // outputs or scratch overlap its (non-in-place) inputs, so no
                // `&mut` to these bytes exists while this view lives.
                unsafe { core::slice::from_raw_parts(p, len) }
            }
            loc => self.const_bytes(loc)?,
        };
        Ok(Some(TensorView::from_parts(s.dtype, &s.shape, data)))
    }

    /// Input `i`, required.
    pub fn input(&self, i: usize) -> Result<TensorView<'a>> {
        self.opt_input(i)?
            .ok_or(Error::new(ErrorKind::MissingInput { index: i }))
    }

    /// Typed elements of input `i`.
    pub fn input_slice<T: Element>(&self, i: usize) -> Result<&'a [T]> {
        self.input(i)?.as_slice()
    }

    /// Reports the real shape of output `i` of a kernel prepared with
    /// [`Prepared::dynamic_shapes`]: same rank as planned, no more elements
    /// than the planned upper bound; the data is the row-major prefix of
    /// the output buffer.
    pub fn set_output_shape(&mut self, i: usize, shape: &[usize]) -> Result<()> {
        let Some(at) = self.shapes else {
            return Err(Error::new(ErrorKind::Internal(
                "set_output_shape on a static kernel",
            )));
        };
        let (s, _, _) = self.out_raw(i)?;
        let n = crate::error::checked_numel(shape)?;
        if shape.len() != s.shape.len() || n > crate::error::checked_numel(&s.shape)? {
            return Err(Error::new(ErrorKind::Internal(
                "run-time shape exceeds the planned upper bound",
            )));
        }
        let off = i
            .checked_mul(SHAPE_RECORD_BYTES)
            .and_then(|o| o.checked_add(at))
            .ok_or(Error::new(ErrorKind::Overflow))?;
        let p = self.arena_range(off, SHAPE_RECORD_BYTES)?;
        // SAFETY: in the arena (checked), aligned (records start on an
        // ALIGN boundary, each is a whole number of words), and the shape
        // records of a step are its own exclusive buffer.
        let rec = unsafe { core::slice::from_raw_parts_mut(p as *mut usize, SHAPE_RECORD) };
        write_shape_record(rec, shape);
        Ok(())
    }

    /// Whether output `i` is present.
    pub fn has_output(&self, i: usize) -> bool {
        matches!(self.outputs.get(i), Some(Some(_)))
    }

    fn out_raw(&self, i: usize) -> Result<(&'a Slot, *mut u8, usize)> {
        let Some(Some(id)) = self.outputs.get(i) else {
            return Err(Error::new(ErrorKind::Internal("output absent")));
        };
        let s = self.slot(*id)?;
        match s.loc {
            Loc::Arena { offset, len } => Ok((s, self.arena_range(offset, len)?, len)),
            _ => Err(Error::new(ErrorKind::Internal("output not in arena"))),
        }
    }

    /// Output `i`.
    pub fn output(&mut self, i: usize) -> Result<TensorMut<'_>> {
        let (s, p, len) = self.out_raw(i)?;
        // SAFETY: inside the arena (checked); `&mut self` makes this the only
        // live mutable view handed out; outputs never overlap inputs (or, in
        // place, input 0 is not handed out) nor each other.
        let data = unsafe { core::slice::from_raw_parts_mut(p, len) };
        Ok(TensorMut::from_parts(s.dtype, &s.shape, data))
    }

    /// Typed elements of output `i`.
    pub fn output_slice<T: Element>(&mut self, i: usize) -> Result<&mut [T]> {
        self.output(i)?.into_slice()
    }

    /// Two distinct outputs at once (e.g. TopK values and indices).
    pub fn outputs2(&mut self, a: usize, b: usize) -> Result<(TensorMut<'_>, TensorMut<'_>)> {
        if a == b {
            return Err(Error::new(ErrorKind::Internal("outputs2 with one index")));
        }
        let (sa, pa, la) = self.out_raw(a)?;
        let (sb, pb, lb) = self.out_raw(b)?;
        // SAFETY: two different outputs occupy disjoint arena ranges.
        let (da, db) = unsafe {
            (
                core::slice::from_raw_parts_mut(pa, la),
                core::slice::from_raw_parts_mut(pb, lb),
            )
        };
        Ok((
            TensorMut::from_parts(sa.dtype, &sa.shape, da),
            TensorMut::from_parts(sb.dtype, &sb.shape, db),
        ))
    }

    /// The step's scratch bytes (empty if none was requested).
    pub fn scratch(&mut self) -> Result<&mut [u8]> {
        let (off, len) = self.scratch;
        if len == 0 {
            return Ok(&mut []);
        }
        let p = self.arena_range(off, len)?;
        // SAFETY: scratch is a planned arena range disjoint from every tensor
        // live at this step.
        Ok(unsafe { core::slice::from_raw_parts_mut(p, len) })
    }

    /// Output `i` and the scratch together.
    pub fn output_and_scratch(&mut self, i: usize) -> Result<(TensorMut<'_>, &mut [u8])> {
        let (s, p, len) = self.out_raw(i)?;
        let (off, slen) = self.scratch;
        let sp = if slen == 0 {
            core::ptr::NonNull::<u8>::dangling().as_ptr()
        } else {
            self.arena_range(off, slen)?
        };
        // SAFETY: output and scratch are disjoint planned ranges.
        let (d, sc) = unsafe {
            (
                core::slice::from_raw_parts_mut(p, len),
                core::slice::from_raw_parts_mut(sp, slen),
            )
        };
        Ok((TensorMut::from_parts(s.dtype, &s.shape, d), sc))
    }

    /// Element-wise unary access: the input and output slices, or one slice
    /// read and written in place.
    pub fn unary<T: Element>(&mut self) -> Result<Unary<'_, T>> {
        if self.inplace {
            return Ok(Unary::InPlace(self.output_slice::<T>(0)?));
        }
        let x = self.input_slice::<T>(0)?;
        Ok(Unary::Separate(x, self.output_slice::<T>(0)?))
    }
}

/// See [`KernelIo::unary`].
#[derive(Debug)]
pub enum Unary<'a, T> {
    /// Input and output are distinct.
    Separate(&'a [T], &'a mut [T]),
    /// The output holds the input; overwrite it.
    InPlace(&'a mut [T]),
}

impl<T: Copy> Unary<'_, T> {
    /// Applies `f` element by element.
    #[inline]
    pub fn map(self, f: impl Fn(T) -> T) {
        match self {
            Unary::Separate(x, y) => {
                for (o, &i) in y.iter_mut().zip(x) {
                    *o = f(i);
                }
            }
            Unary::InPlace(y) => {
                for o in y.iter_mut() {
                    *o = f(*o);
                }
            }
        }
    }
}

/// Shared helpers for op prepare functions.
pub mod util {
    use super::*;

    /// Row `r` of `n` elements of a row-major buffer.
    pub(crate) fn row<T>(s: &[T], r: usize, n: usize) -> Result<&[T]> {
        s.get(row_range(r, n)?)
            .ok_or(Error::internal("row out of range"))
    }

    /// [`row`], mutable.
    pub(crate) fn row_mut<T>(s: &mut [T], r: usize, n: usize) -> Result<&mut [T]> {
        s.get_mut(row_range(r, n)?)
            .ok_or(Error::internal("row out of range"))
    }

    fn row_range(r: usize, n: usize) -> Result<core::ops::Range<usize>> {
        let start = r
            .checked_mul(n)
            .ok_or(Error::internal("row out of range"))?;
        let end = start
            .checked_add(n)
            .ok_or(Error::internal("row out of range"))?;
        Ok(start..end)
    }

    /// `a / b`; an `Err` naming `what` when `b` is zero (a division by zero
    /// is the one integer operation that panics in a release build).
    #[inline]
    pub(crate) fn div(a: usize, b: usize, what: &'static str) -> Result<usize> {
        a.checked_div(b).ok_or(Error::internal(what))
    }

    /// `a % b`; an `Err` naming `what` when `b` is zero.
    #[inline]
    pub(crate) fn rem(a: usize, b: usize, what: &'static str) -> Result<usize> {
        a.checked_rem(b).ok_or(Error::internal(what))
    }

    /// `(a / b, a % b)`, the next digit of a mixed-radix index; an `Err`
    /// naming `what` when `b` is zero.
    #[inline]
    pub(crate) fn div_rem(a: usize, b: usize, what: &'static str) -> Result<(usize, usize)> {
        Ok((div(a, b, what)?, rem(a, b, what)?))
    }

    /// Whether `b` divides `a` (`false` when `b` is zero).
    #[inline]
    pub(crate) fn divides(a: usize, b: usize) -> bool {
        a.checked_rem(b) == Some(0)
    }

    /// Normalizes a possibly negative axis against `rank`: an index of
    /// the shape (`0 <= axis < rank`; a scalar has none).
    pub fn axis(a: i64, rank: usize, name: &'static str) -> Result<usize> {
        match axis_or_scalar(a, rank, name)? {
            v if v < rank => Ok(v),
            _ => Err(attr_err(name, "axis out of range (the input is a scalar)")),
        }
    }

    /// [`axis`], but a scalar (rank 0) also takes axis 0 or -1, as ops
    /// that treat a scalar as one element do (CumSum, QuantizeLinear,
    /// reductions): the caller must not index the shape with it.
    pub fn axis_or_scalar(a: i64, rank: usize, name: &'static str) -> Result<usize> {
        let r = rank as i64;
        let v = if a < 0 { a.saturating_add(r.max(1)) } else { a };
        if v < 0 || v >= r.max(1) {
            return Err(attr_err(name, "axis out of range"));
        }
        Ok(v as usize)
    }

    /// An f32 element-wise op applying `f`, in place when the planner allows.
    pub fn unary_f32<F>(ctx: &PrepareCtx<'_>, name: &'static str, f: F) -> Result<Prepared>
    where
        F: Fn(f32) -> f32 + Copy + Send + Sync + 'static,
    {
        let x = ctx.input(0)?;
        dtype_in(x.dtype, &[DType::F32], name)?;
        Ok(Prepared::single(
            DType::F32,
            x.shape,
            kernel(name, move |io| {
                io.unary::<f32>()?.map(f);
                Ok(())
            }),
        )
        .in_place())
    }

    /// A float storage type (f32, f64, f16, bf16) read and written through
    /// a wider accumulator: f16, bf16 and f32 compute in f32, f64 in f64.
    /// Kernels generic over it widen each element as they read it and round
    /// once when they store, as onnxruntime's f16 kernels accumulate in f32.
    pub trait Float: Element + PartialOrd {
        /// The accumulator type (`f32`, or `f64` for `f64`).
        type Acc: Acc;
        /// Widens to the accumulator (exact).
        fn to_acc(self) -> Self::Acc;
        /// Rounds an accumulator value to this type (nearest even).
        fn from_acc(v: Self::Acc) -> Self;
        /// As f32 (exact except from f64).
        fn to_f32(self) -> f32;
        /// From f32, rounded.
        fn from_f32(v: f32) -> Self;
        /// As f64 (exact).
        fn to_f64(self) -> f64;
        /// From f64, rounded.
        fn from_f64(v: f64) -> Self;
        /// True when `Self` is its own accumulator (f32, f64): kernels then
        /// accumulate straight into the output.
        const IS_ACC: bool;
    }

    /// An accumulator of [`Float`]: f32 or f64.
    pub trait Acc:
        Float<Acc = Self>
        + core::ops::Add<Output = Self>
        + core::ops::Sub<Output = Self>
        + core::ops::Mul<Output = Self>
        + core::ops::Div<Output = Self>
        + core::ops::AddAssign
        + core::ops::MulAssign
    {
        /// 0.
        const ZERO: Self;
        /// 1.
        const ONE: Self;
        /// `self + o`, by name: on a type parameter clippy cannot tell the
        /// operators from integer arithmetic (`arithmetic_side_effects`).
        fn plus(self, o: Self) -> Self;
        /// `self * o`, by name (see [`Acc::plus`]).
        fn times(self, o: Self) -> Self;
        /// `self / o`, by name (see [`Acc::plus`]).
        fn over(self, o: Self) -> Self;
    }

    impl Float for f32 {
        type Acc = f32;
        const IS_ACC: bool = true;
        #[inline(always)]
        fn to_acc(self) -> f32 {
            self
        }
        #[inline(always)]
        fn from_acc(v: f32) -> Self {
            v
        }
        #[inline(always)]
        fn to_f32(self) -> f32 {
            self
        }
        #[inline(always)]
        fn from_f32(v: f32) -> Self {
            v
        }
        #[inline(always)]
        fn to_f64(self) -> f64 {
            self as f64
        }
        #[inline(always)]
        fn from_f64(v: f64) -> Self {
            v as f32
        }
    }

    impl Float for f64 {
        type Acc = f64;
        const IS_ACC: bool = true;
        #[inline(always)]
        fn to_acc(self) -> f64 {
            self
        }
        #[inline(always)]
        fn from_acc(v: f64) -> Self {
            v
        }
        #[inline(always)]
        fn to_f32(self) -> f32 {
            self as f32
        }
        #[inline(always)]
        fn from_f32(v: f32) -> Self {
            v as f64
        }
        #[inline(always)]
        fn to_f64(self) -> f64 {
            self
        }
        #[inline(always)]
        fn from_f64(v: f64) -> Self {
            v
        }
    }

    macro_rules! half_float {
        ($($t:ty),*) => {$(
            impl Float for $t {
                type Acc = f32;
                const IS_ACC: bool = false;
                #[inline(always)]
                fn to_acc(self) -> f32 {
                    <$t>::to_f32(self)
                }
                #[inline(always)]
                fn from_acc(v: f32) -> Self {
                    <$t>::from_f32(v)
                }
                #[inline(always)]
                fn to_f32(self) -> f32 {
                    <$t>::to_f32(self)
                }
                #[inline(always)]
                fn from_f32(v: f32) -> Self {
                    <$t>::from_f32(v)
                }
                #[inline(always)]
                fn to_f64(self) -> f64 {
                    <$t>::to_f64(self)
                }
                #[inline(always)]
                fn from_f64(v: f64) -> Self {
                    <$t>::from_f64(v)
                }
            }
        )*};
    }
    half_float!(half::f16, half::bf16);

    macro_rules! float_acc {
        ($($t:ty),*) => {$(
            impl Acc for $t {
                const ZERO: Self = 0.0;
                const ONE: Self = 1.0;
                #[inline(always)]
                fn plus(self, o: Self) -> Self {
                    self + o
                }
                #[inline(always)]
                fn times(self, o: Self) -> Self {
                    self * o
                }
                #[inline(always)]
                fn over(self, o: Self) -> Self {
                    self / o
                }
            }
        )*};
    }
    float_acc!(f32, f64);

    /// Sum of `xs` in the accumulator type with eight partial sums (element
    /// `i` goes to lane `i mod 8`), combined pairwise at the end. The adds of a
    /// lane do not wait on each other's latency and vectorize; the order differs
    /// from a left-to-right sum only by rounding, as in onnxruntime's own
    /// vectorized pools.
    #[inline(always)]
    pub fn sum_lanes<T: Copy, A: Acc>(xs: &[T], widen: impl Fn(T) -> A) -> A {
        let mut lanes = [A::ZERO; 8];
        let mut chunks = xs.chunks_exact(8);
        for c in &mut chunks {
            for (l, &v) in lanes.iter_mut().zip(c) {
                *l = l.plus(widen(v));
            }
        }
        let mut tail = A::ZERO;
        for &v in chunks.remainder() {
            tail = tail.plus(widen(v));
        }
        let [a, b, c, d, e, f, g, h] = lanes;
        let (ae, bf, cg, dh) = (a.plus(e), b.plus(f), c.plus(g), d.plus(h));
        ae.plus(bf).plus(cg.plus(dh)).plus(tail)
    }

    /// The float dtypes of [`Float`].
    pub const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];

    /// `$body` with `$t` bound to the [`Float`] type of dtype `$dt`
    /// (one of [`FLOATS`]); `$else` for any other dtype.
    macro_rules! with_float {
        ($dt:expr, $t:ident => $body:expr, $other:ident => $else:expr) => {
            match $dt {
                $crate::DType::F32 => {
                    type $t = f32;
                    $body
                }
                $crate::DType::F64 => {
                    type $t = f64;
                    $body
                }
                $crate::DType::F16 => {
                    type $t = half::f16;
                    $body
                }
                $crate::DType::BF16 => {
                    type $t = half::bf16;
                    $body
                }
                $other => $else,
            }
        };
    }
    pub(crate) use with_float;

    /// The accumulator view of a typed scratch / output buffer: `out` itself
    /// when `T` is its own accumulator, else the first `n` accumulators of
    /// `scratch` (bytes from prepare's [`acc_scratch`]).
    pub fn acc_buf<T: Float>(scratch: &mut [u8], n: usize) -> Result<&mut [T::Acc]> {
        let s: &mut [T::Acc] = bytemuck::try_cast_slice_mut(scratch)
            .map_err(|_| Error::new(ErrorKind::Internal("scratch alignment")))?;
        s.get_mut(..n)
            .ok_or(Error::new(ErrorKind::Internal("scratch size")))
    }

    /// Scratch bytes for `n` accumulators of `T`, none when `T` is its own
    /// accumulator.
    pub fn acc_scratch<T: Float>(n: usize) -> Result<usize> {
        if T::IS_ACC {
            return Ok(0);
        }
        n.checked_mul(core::mem::size_of::<T::Acc>())
            .ok_or(Error::new(ErrorKind::Overflow))
    }

    /// Runs `f` on accumulators for `out`: `out` itself when `T` is its own
    /// accumulator, else the first `out.len()` of `acc`, rounded into `out`
    /// afterwards (once per element).
    #[inline]
    pub fn accumulate_into<T: Float>(
        out: &mut [T],
        acc: &mut [T::Acc],
        f: impl FnOnce(&mut [T::Acc]),
    ) -> Result<()> {
        if T::IS_ACC {
            let a: &mut [T::Acc] = bytemuck::try_cast_slice_mut(out)
                .map_err(|_| Error::new(ErrorKind::Internal("accumulator cast")))?;
            f(a);
        } else {
            let a = acc
                .get_mut(..out.len())
                .ok_or(Error::new(ErrorKind::Internal("scratch size")))?;
            f(a);
            store(out, a);
        }
        Ok(())
    }

    /// Rounds accumulators into their storage type.
    #[inline]
    pub fn store<T: Float>(out: &mut [T], acc: &[T::Acc]) {
        for (o, &a) in out.iter_mut().zip(acc) {
            *o = T::from_acc(a);
        }
    }

    /// Checks the dtype is one of `allowed`.
    pub fn dtype_in(dt: DType, allowed: &[DType], what: &'static str) -> Result<()> {
        if allowed.contains(&dt) {
            Ok(())
        } else {
            Err(Error::new(ErrorKind::UnsupportedDType {
                what,
                code: dt.onnx_code(),
            }))
        }
    }
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod registry_tests {
    use super::FAMILIES;

    #[test]
    fn no_op_version_is_registered_twice() {
        // Two families defining the same (domain, op, since) would make
        // `find` pick one silently.
        let mut seen = alloc::vec::Vec::new();
        for fam in FAMILIES {
            for d in fam.iter() {
                let key = (d.domain, d.op_type, d.since);
                assert!(!seen.contains(&key), "registered twice: {key:?}");
                seen.push(key);
            }
        }
        assert!(seen.len() > 150, "{} entries", seen.len());
    }
}
