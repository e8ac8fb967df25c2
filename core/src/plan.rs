//! Session build: bind shapes, infer every tensor's type and shape, fold
//! what is known at build time, and plan the arena.
//!
//! Stages, in order:
//! 1. **bind**: graph-input shapes from the caller (explicit shapes, or
//!    symbolic dimensions by name; unbound ones default to 1, recorded in
//!    [`Plan::defaulted_dims`]);
//! 2. **prepare** every node in topological order: each op's prepare infers
//!    output shapes and builds its kernel. A node whose inputs are all
//!    constant is evaluated right away (constant folding), which is how the
//!    Shape → Gather → Concat → Reshape subgraphs of exporters disappear;
//! 3. **dead-node removal**: steps whose outputs nobody reads are dropped;
//! 4. **liveness and placement**: tensors become arena buffers (aliases
//!    share their source's, in-place outputs their input's) with lifetimes
//!    in steps, placed by a [`MemoryPlanner`].

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;

use crate::error::{checked_numel, Error, ErrorKind, NodeId, Result, TensorId};
use crate::model::{Const, ConstData, Dim, Model, Node};
use crate::ops::{self, InputInfo, Kernel, KernelIo, Loc, PrepareCtx, Slot};
use crate::planner::{self, Buffer, GreedyBySize, MemoryPlanner, ALIGN};
use crate::tensor::TensorView;
use crate::DType;

/// One kernel invocation of the plan.
#[derive(Debug)]
pub(crate) struct Step {
    pub node: NodeId,
    pub kernel: Box<dyn Kernel>,
    pub inputs: Vec<Option<TensorId>>,
    pub outputs: Vec<Option<TensorId>>,
    pub scratch: (usize, usize),
    pub inplace: bool,
    /// Arena offset of the run-time shape records of a kernel with
    /// data-dependent output shapes (one record per output).
    pub shapes: Option<usize>,
}

/// Name, dtype and shape of a graph input or output of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoInfo {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Bound shape.
    pub shape: Vec<usize>,
    /// Tensor id in the model graph.
    pub id: TensorId,
    /// `shape` is an upper bound: the output's shape depends on input
    /// values (NonZero, Unique, ...) and [`crate::Session::output`] gives
    /// the real one after a run.
    pub dynamic: bool,
    /// The input's value was fixed at build time
    /// ([`SessionBuilder::input_value`]): it is not in the arena and
    /// [`crate::Session::run`] checks that the fed value equals it.
    pub bound: bool,
}

/// Loop iterations a session runs by default before [`ErrorKind::LoopLimit`]
/// (see [`SessionBuilder::max_loop_iterations`]).
pub const DEFAULT_MAX_LOOP_ITERATIONS: u64 = 1 << 24;

/// Heap bytes a session build may allocate for what a model's values and
/// dims decide (constants computed at build time, kernel tables) when no
/// [`SessionBuilder::max_memory`] is given: a model that would take more
/// (a `ConstantOfShape` of 10^12 elements, say) gets
/// [`ErrorKind::OverBudget`] before anything is allocated.
pub const DEFAULT_MAX_BUILD_HEAP: usize = 1 << 30;

/// Bounds a session build enforces on itself and on the kernels it makes
/// (bodies of If/Loop/Scan inherit them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Iterations one Loop node may run per invocation (folding included).
    pub loop_iterations: u64,
    /// Heap bytes the build may still take for constants computed at
    /// build time and tables sized by dims (the caller's
    /// [`SessionBuilder::max_memory`] less what is already held).
    pub heap_bytes: usize,
    /// Whether kernels may keep copies of constant weights packed for
    /// their inner loops ([`crate::ops::Prepared::heap`]; onnxruntime
    /// prepacks the same way). Off under a caller's
    /// [`SessionBuilder::max_memory`], whose budget the copies would
    /// pass.
    pub pack: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            loop_iterations: DEFAULT_MAX_LOOP_ITERATIONS,
            heap_bytes: DEFAULT_MAX_BUILD_HEAP,
            pack: true,
        }
    }
}

impl Limits {
    /// Takes `bytes` of the budget, or refuses before anything is
    /// allocated.
    pub(crate) fn take_heap(&mut self, bytes: usize) -> Result<()> {
        self.heap_bytes =
            self.heap_bytes
                .checked_sub(bytes)
                .ok_or(Error::new(ErrorKind::OverBudget {
                    needed: bytes,
                    budget: self.heap_bytes,
                }))?;
        Ok(())
    }
}

/// Session options: shape bindings, memory budgets and run-time bounds.
///
/// The analogue of onnxruntime's free-dimension overrides and tract's
/// `with_input_fact`.
#[derive(Clone, Debug, Default)]
pub struct SessionBuilder<'m> {
    model: Option<&'m Model>,
    dims: Vec<(String, usize)>,
    shapes: Vec<(String, Vec<usize>)>,
    values: Vec<(String, DType, Vec<u8>)>,
    max_arena: Option<usize>,
    max_memory: Option<usize>,
    max_loop: Option<u64>,
    in_place: bool,
    /// No packed weight copies ([`Limits::pack`]).
    no_pack: bool,
}

impl<'m> SessionBuilder<'m> {
    /// Options for `model`.
    pub fn new(model: &'m Model) -> Self {
        SessionBuilder {
            model: Some(model),
            in_place: true,
            ..Default::default()
        }
    }
    /// Binds a symbolic dimension (`dim_param`) such as `batch`.
    pub fn dim(mut self, name: &str, value: usize) -> Self {
        self.dims.push((name.into(), value));
        self
    }
    /// Sets the full shape of a graph input (overrides its declared shape).
    pub fn input_shape(mut self, name: &str, shape: &[usize]) -> Self {
        self.shapes.push((name.into(), shape.into()));
        self
    }
    /// Fixes the value of a graph input at build time (a *shape tensor*, as
    /// TensorRT calls them): the `shape` of a Reshape, the `axes` of a
    /// reduction, the `scales` of a Resize, `k` of TopK. mote plans every
    /// shape before the first run, so an input that decides an output shape
    /// must be known here; the plan then folds what depends only on it.
    /// The input stays a graph input: [`crate::Session::run`] still takes
    /// it and fails if the value fed differs from this one. Sets the
    /// input's shape too.
    pub fn input_value(mut self, name: &str, value: &TensorView<'_>) -> Self {
        self.shapes.retain(|(n, _)| n != name);
        self.shapes.push((name.into(), value.shape().into()));
        self.values.retain(|(n, _, _)| n != name);
        self.values
            .push((name.into(), value.dtype(), value.bytes().into()));
        self
    }
    /// Refuses plans whose arena exceeds `bytes`.
    pub fn max_arena_bytes(mut self, bytes: usize) -> Self {
        self.max_arena = Some(bytes);
        self
    }
    /// Refuses, with [`ErrorKind::OverBudget`] and before allocating it,
    /// a plan whose memory exceeds `bytes`: the model's weights, the
    /// constants folded at build time (each checked before it is
    /// computed) and the arena, together. The budget of a device, or of a
    /// service loading models it does not trust. Kernels then keep no
    /// packed copies of weights (x86_64: the f32 MatMul's constant B and
    /// the direct Conv's weights, as large as the weights): they read the
    /// weights as they are, slower.
    pub fn max_memory(mut self, bytes: usize) -> Self {
        self.max_memory = Some(bytes);
        self.no_pack = true;
        self
    }
    /// Bounds the iterations of every `Loop` node, per run (and when a
    /// Loop is folded at build time): a Loop that would go further fails
    /// with [`ErrorKind::LoopLimit`] instead of running on. Default
    /// [`DEFAULT_MAX_LOOP_ITERATIONS`]; a Loop whose condition never turns
    /// false and has no trip count would otherwise never end.
    pub fn max_loop_iterations(mut self, n: u64) -> Self {
        self.max_loop = Some(n);
        self
    }
    pub(crate) fn with_limits(mut self, l: Limits) -> Self {
        self.max_loop = Some(l.loop_iterations);
        self.max_memory = Some(l.heap_bytes);
        self.no_pack = !l.pack;
        self
    }
    /// Whether element-wise ops may overwrite their dying input (default on).
    pub fn in_place(mut self, on: bool) -> Self {
        self.in_place = on;
        self
    }
    /// Infers shapes, folds constants and plans the arena.
    pub fn plan(&self) -> Result<Plan> {
        let model = self
            .model
            .ok_or(Error::new(ErrorKind::Internal("builder without model")))?;
        build(model, self)
    }
}

/// A planned model: kernels in order, every tensor's shape and arena offset.
///
/// A plan borrows nothing; a [`crate::Session`] pairs it with its model and
/// an arena. Build once, run many times (from several threads, each with
/// its own arena).
#[derive(Debug)]
pub struct Plan {
    pub(crate) slots: Vec<Slot>,
    pub(crate) folded: Vec<Const>,
    pub(crate) steps: Vec<Step>,
    pub(crate) arena_bytes: usize,
    pub(crate) lower_bound: usize,
    pub(crate) scratch_bytes: usize,
    pub(crate) inputs: Vec<IoInfo>,
    pub(crate) outputs: Vec<IoInfo>,
    /// Per graph output: arena offset of its run-time shape record.
    pub(crate) records: Vec<Option<usize>>,
    pub(crate) defaulted: Vec<String>,
    pub(crate) fingerprint: (usize, usize),
    pub(crate) packed_bytes: usize,
}

impl Plan {
    /// Arena bytes the plan needs (with a [`ALIGN`]-aligned arena).
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }
    /// Arena bytes to allocate when the buffer may not be aligned.
    pub fn arena_bytes_unaligned(&self) -> usize {
        self.arena_bytes.saturating_add(ALIGN - 1)
    }
    /// Lower bound: the most bytes alive at any one step (tensors and
    /// scratch, aligned). No placement of these buffers can use less.
    pub fn lower_bound(&self) -> usize {
        self.lower_bound
    }
    /// Heap bytes the steps' kernels hold besides the model's weights:
    /// copies of constant weights packed at build time
    /// ([`SessionBuilder::max_memory`] turns them off).
    pub fn packed_bytes(&self) -> usize {
        self.packed_bytes
    }
    /// Largest scratch of any step (part of `arena_bytes`).
    pub fn scratch_bytes(&self) -> usize {
        self.scratch_bytes
    }
    /// Graph inputs with bound shapes.
    pub fn inputs(&self) -> &[IoInfo] {
        &self.inputs
    }
    /// Graph outputs with inferred shapes.
    pub fn outputs(&self) -> &[IoInfo] {
        &self.outputs
    }
    /// Symbolic (or unknown) dimensions that nobody bound and were set to 1.
    pub fn defaulted_dims(&self) -> &[String] {
        &self.defaulted
    }
    /// Number of kernel steps left after folding and dead-node removal.
    pub fn num_steps(&self) -> usize {
        self.steps.len()
    }
    /// Node ids of the steps, in execution order.
    pub fn step_nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.steps.iter().map(|s| s.node)
    }
    /// Bytes of constants computed at build time.
    pub fn folded_bytes(&self) -> usize {
        self.folded
            .iter()
            .map(Const::byte_len)
            .fold(0, usize::saturating_add)
    }
    /// Bytes of a graph input fixed by [`SessionBuilder::input_value`].
    pub(crate) fn bound_value(&self, id: TensorId) -> Option<&[u8]> {
        match self.slots.get(id as usize)?.loc {
            Loc::Folded(f) => self.folded.get(f as usize).map(|c| c.data.bytes()),
            _ => None,
        }
    }
    /// Inferred dtype and shape of a tensor, if it was reached.
    pub fn tensor_type(&self, id: TensorId) -> Option<(DType, &[usize])> {
        self.slots
            .get(id as usize)
            .filter(|s| s.loc != Loc::None || !s.shape.is_empty())
            .map(|s| (s.dtype, &s.shape[..]))
    }
}

fn bind_input(
    model: &Model,
    id: TensorId,
    opts: &SessionBuilder<'_>,
    defaulted: &mut Vec<String>,
) -> Result<Slot> {
    let t = model.graph.tensor(id)?;
    let dtype = t.dtype.ok_or(
        Error::new(ErrorKind::UnsupportedDType {
            what: "graph input",
            code: t.onnx_type,
        })
        .at_tensor(id),
    )?;
    if let Some((_, s)) = opts.shapes.iter().find(|(n, _)| *n == t.name) {
        if let Some(decl) = &t.shape {
            if decl.len() != s.len() {
                return Err(Error::new(ErrorKind::Rank {
                    expected: decl.len(),
                    got: s.len(),
                })
                .at_tensor(id));
            }
            for (axis, (d, &v)) in decl.iter().zip(s).enumerate() {
                if let Dim::Fixed(f) = d {
                    if *f != v {
                        return Err(Error::new(ErrorKind::Dim {
                            axis,
                            expected: *f as u64,
                            got: v as u64,
                        })
                        .at_tensor(id));
                    }
                }
            }
        }
        checked_numel(s).map_err(|e| e.at_tensor(id))?;
        return Ok(Slot {
            dtype,
            shape: s.clone(),
            loc: Loc::None,
        });
    }
    let decl = t.shape.as_ref().ok_or(
        Error::new(ErrorKind::Binding(
            "graph input has no declared shape: give it one",
        ))
        .at_tensor(id),
    )?;
    let mut shape = Vec::with_capacity(decl.len());
    for (axis, d) in decl.iter().enumerate() {
        shape.push(match d {
            Dim::Fixed(v) => *v,
            Dim::Param(p) => match opts.dims.iter().find(|(n, _)| n == p) {
                Some(&(_, v)) => v,
                None => {
                    if !defaulted.contains(p) {
                        defaulted.push(p.clone());
                    }
                    1
                }
            },
            Dim::Unknown => {
                defaulted.push(alloc::format!("{}[{}]", t.name, axis));
                1
            }
        });
    }
    checked_numel(&shape).map_err(|e| e.at_tensor(id))?;
    Ok(Slot {
        dtype,
        shape,
        loc: Loc::None,
    })
}

/// Entry `i` of one of build's per-tensor or per-step tables. Ids come from
/// the validated graph, so a miss is an internal error, never a panic.
fn at<T>(v: &[T], i: usize) -> Result<&T> {
    v.get(i)
        .ok_or(Error::new(ErrorKind::Internal("plan: table index")))
}

/// Mutable [`at`].
fn at_mut<T>(v: &mut [T], i: usize) -> Result<&mut T> {
    v.get_mut(i)
        .ok_or(Error::new(ErrorKind::Internal("plan: table index")))
}

fn byte_len(s: &Slot) -> Result<usize> {
    checked_numel(&s.shape)?
        .checked_mul(s.dtype.size())
        .ok_or(Error::new(ErrorKind::Overflow))
}

/// The shape in the run-time shape record at byte `at` of `bytes`.
fn read_record(bytes: &[u8], at: usize) -> Result<Vec<usize>> {
    const W: usize = core::mem::size_of::<usize>();
    let word = |k: usize| -> Result<usize> {
        let b = bytes
            .get(
                at.saturating_add(k.saturating_mul(W))
                    ..at.saturating_add(k.saturating_add(1).saturating_mul(W)),
            )
            .ok_or(Error::new(ErrorKind::Internal("shape record")))?;
        let mut a = [0u8; W];
        crate::tensor::copy_exact(&mut a, b)?;
        Ok(usize::from_ne_bytes(a))
    };
    let rank = word(0)?;
    if rank >= ops::SHAPE_RECORD {
        return Err(Error::new(ErrorKind::Internal("shape record rank")));
    }
    (1..=rank).map(word).collect()
}

/// Runs one node on constant inputs with heap buffers (folding; op tests).
#[cfg(test)]
pub(crate) fn eval_const(node: &Node, opset: i64, inputs: &[Option<&Const>]) -> Result<Vec<Const>> {
    eval_const_within(node, opset, inputs, &mut Limits::default())
}

/// [`eval_const`] under `limits`; the folded bytes are taken from its
/// budget before they are allocated.
pub(crate) fn eval_const_within(
    node: &Node,
    opset: i64,
    inputs: &[Option<&Const>],
    limits: &mut Limits,
) -> Result<Vec<Const>> {
    let def = ops::find(&node.domain, &node.op_type, opset)
        .ok_or(Error::new(ErrorKind::UnsupportedOp { opset }))?;
    let infos: Vec<Option<InputInfo<'_>>> = inputs
        .iter()
        .map(|c| {
            c.map(|c| InputInfo {
                dtype: c.dtype,
                shape: &c.shape,
                value: Some(c.view()),
            })
        })
        .collect();
    let ctx = PrepareCtx::new(node, opset, &infos).with_limits(*limits);
    let prep = (def.prepare)(&ctx)?;
    if let Some(v) = prep.values {
        limits.take_heap(v.iter().map(Const::byte_len).fold(0, usize::saturating_add))?;
        return Ok(v);
    }
    let mut slots: Vec<Slot> = Vec::new();
    let mut folded: Vec<Const> = Vec::new();
    let mut ins = Vec::new();
    for c in inputs {
        match c {
            Some(c) => {
                folded.push((*c).clone());
                slots.push(Slot {
                    dtype: c.dtype,
                    shape: c.shape.clone(),
                    loc: Loc::Folded(folded.len().saturating_sub(1) as u32),
                });
                ins.push(Some(slots.len().saturating_sub(1) as TensorId));
            }
            None => ins.push(None),
        }
    }
    if prep.alias {
        let o = prep
            .outputs
            .first()
            .ok_or(Error::new(ErrorKind::Internal("alias without output")))?;
        let src = inputs
            .first()
            .copied()
            .flatten()
            .ok_or(Error::new(ErrorKind::MissingInput { index: 0 }))?;
        limits.take_heap(src.byte_len())?;
        return Ok(alloc::vec![Const {
            dtype: o.dtype,
            shape: o.shape.clone(),
            data: src.data.clone()
        }]);
    }
    let mut off = 0usize;
    let mut outs = Vec::new();
    for (i, o) in prep.outputs.iter().enumerate() {
        let s = Slot {
            dtype: o.dtype,
            shape: o.shape.clone(),
            loc: Loc::None,
        };
        let len = byte_len(&s)?;
        let present = matches!(node.outputs.get(i), Some(Some(_))) || node.outputs.is_empty();
        if present {
            slots.push(Slot {
                loc: Loc::Arena { offset: off, len },
                ..s
            });
            outs.push(Some(slots.len().saturating_sub(1) as TensorId));
            off = planner::align_up(
                off.checked_add(len)
                    .ok_or(Error::new(ErrorKind::Overflow))?,
            )
            .ok_or(Error::new(ErrorKind::Overflow))?;
        } else {
            outs.push(None);
        }
    }
    let scratch = (off, prep.scratch);
    let rec_at = planner::align_up(
        off.checked_add(prep.scratch)
            .ok_or(Error::new(ErrorKind::Overflow))?,
    )
    .ok_or(Error::new(ErrorKind::Overflow))?;
    let rec_len = ops::SHAPE_RECORD_BYTES;
    let total = if prep.dynamic {
        rec_at
            .checked_add(
                prep.outputs
                    .len()
                    .checked_mul(rec_len)
                    .ok_or(Error::new(ErrorKind::Overflow))?,
            )
            .ok_or(Error::new(ErrorKind::Overflow))?
    } else {
        off.checked_add(prep.scratch)
            .ok_or(Error::new(ErrorKind::Overflow))?
    };
    limits.take_heap(total)?;
    let mut buf = ConstData::zeroed(total)?;
    let graph = crate::model::Graph::default();
    {
        let bytes = buf.bytes_mut();
        let mut io = KernelIo {
            slots: &slots,
            graph: &graph,
            folded: &folded,
            base: bytes.as_mut_ptr(),
            base_len: bytes.len(),
            inputs: &ins,
            outputs: &outs,
            scratch,
            inplace: false,
            shapes: prep.dynamic.then_some(rec_at),
            _arena: core::marker::PhantomData,
        };
        prep.kernel.run(&mut io)?;
    }
    let mut result = Vec::new();
    for (i, o) in outs.iter().enumerate() {
        let info = prep
            .outputs
            .get(i)
            .ok_or(Error::new(ErrorKind::Internal("outputs")))?;
        match o {
            Some(id) => {
                let Loc::Arena { offset, len } =
                    slots.get(*id as usize).map(|s| s.loc).unwrap_or(Loc::None)
                else {
                    return Err(Error::new(ErrorKind::Internal("fold slot")));
                };
                let mut shape = info.shape.clone();
                let mut len = len;
                if prep.dynamic {
                    shape = read_record(
                        buf.bytes(),
                        rec_at.saturating_add(i.saturating_mul(rec_len)),
                    )?;
                    len = checked_numel(&shape)?
                        .checked_mul(info.dtype.size())
                        .filter(|&l| l <= len)
                        .ok_or(Error::new(ErrorKind::Internal("run-time shape")))?;
                }
                let b = buf
                    .bytes()
                    .get(offset..offset.saturating_add(len))
                    .ok_or(Error::new(ErrorKind::Internal("fold range")))?;
                result.push(Const {
                    dtype: info.dtype,
                    shape,
                    data: ConstData::from_bytes(b)?,
                });
            }
            None => result.push(Const {
                dtype: info.dtype,
                shape: info.shape.clone(),
                data: ConstData::default(),
            }),
        }
    }
    Ok(result)
}

fn build(model: &Model, opts: &SessionBuilder<'_>) -> Result<Plan> {
    let g = &model.graph;
    for n in opts
        .values
        .iter()
        .map(|v| &v.0)
        .chain(opts.shapes.iter().map(|s| &s.0))
    {
        if !model.input_names().any(|i| i == n) {
            return Err(Error::new(ErrorKind::Binding(
                "input_shape names no graph input",
            )));
        }
    }
    let order = g.topo_order()?;
    let mut limits = Limits {
        loop_iterations: opts.max_loop.unwrap_or(DEFAULT_MAX_LOOP_ITERATIONS),
        heap_bytes: DEFAULT_MAX_BUILD_HEAP,
        pack: !opts.no_pack,
    };
    let weights = g.const_bytes();
    if let Some(budget) = opts.max_memory {
        limits.heap_bytes =
            budget
                .checked_sub(weights)
                .ok_or(Error::new(ErrorKind::OverBudget {
                    needed: weights,
                    budget,
                }))?;
    }
    let mut slots: Vec<Slot> = g
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| match &t.value {
            Some(c) => Slot {
                dtype: c.dtype,
                shape: c.shape.clone(),
                loc: Loc::Model(i as TensorId),
            },
            None => Slot {
                dtype: DType::F32,
                shape: Vec::new(),
                loc: Loc::None,
            },
        })
        .collect();
    let mut known = alloc::vec![false; slots.len()];
    for (k, t) in known.iter_mut().zip(&g.tensors) {
        if t.value.is_some() {
            *k = true;
        }
    }
    let mut defaulted = Vec::new();
    let mut folded: Vec<Const> = Vec::new();
    for &i in &g.inputs {
        let mut s = bind_input(model, i, opts, &mut defaulted)?;
        let name = &g.tensor(i)?.name;
        if let Some((_, dt, bytes)) = opts.values.iter().find(|(n, _, _)| n == name) {
            limits.take_heap(bytes.len()).map_err(|e| e.at_tensor(i))?;
            if *dt != s.dtype {
                return Err(Error::new(ErrorKind::DTypeMismatch {
                    expected: s.dtype,
                    got: *dt,
                })
                .at_tensor(i));
            }
            if bytes.len() != byte_len(&s)? {
                return Err(
                    Error::new(ErrorKind::Binding("input_value and input_shape disagree"))
                        .at_tensor(i),
                );
            }
            folded.push(Const {
                dtype: *dt,
                shape: s.shape.clone(),
                data: ConstData::from_bytes(bytes).map_err(|e| e.at_tensor(i))?,
            });
            s.loc = Loc::Folded(folded.len().saturating_sub(1) as u32);
        }
        *at_mut(&mut slots, i as usize)? = s;
        *at_mut(&mut known, i as usize)? = true;
    }
    let mut steps: Vec<Step> = Vec::new();
    // alias_of[t] = tensor whose buffer t shares (Reshape and friends).
    let mut alias_of: Vec<Option<TensorId>> = alloc::vec![None; slots.len()];
    let mut inplace_ok: Vec<bool> = Vec::new();
    let mut scratch_req: Vec<usize> = Vec::new();
    let mut packed_bytes = 0usize;

    for &ni in &order {
        let node = g.node(ni)?;
        let opset = if node.domain.is_empty() {
            node.opset
        } else {
            node.opset.max(1)
        };
        let def = ops::find(&node.domain, &node.op_type, opset)
            .ok_or(Error::new(ErrorKind::UnsupportedOp { opset }).at_node(ni))?;
        let mut infos: Vec<Option<InputInfo<'_>>> = Vec::with_capacity(node.inputs.len());
        let mut all_const = true;
        for &inp in &node.inputs {
            match inp {
                None => infos.push(None),
                Some(t) => {
                    let s = slots
                        .get(t as usize)
                        .ok_or(Error::new(ErrorKind::Internal("slot")).at_node(ni))?;
                    if !known.get(t as usize).copied().unwrap_or(false) {
                        return Err(Error::new(ErrorKind::MissingTensor)
                            .at_node(ni)
                            .at_tensor(t));
                    }
                    let value = match s.loc {
                        Loc::Model(m) => g
                            .tensors
                            .get(m as usize)
                            .and_then(|t| t.value.as_ref())
                            .map(|c| TensorView::from_parts(s.dtype, &s.shape, c.data.bytes())),
                        Loc::Folded(f) => folded
                            .get(f as usize)
                            .map(|c| TensorView::from_parts(s.dtype, &s.shape, c.data.bytes())),
                        _ => None,
                    };
                    if value.is_none() {
                        all_const = false;
                    }
                    infos.push(Some(InputInfo {
                        dtype: s.dtype,
                        shape: &s.shape,
                        value,
                    }));
                }
            }
        }
        let ctx = PrepareCtx::new(node, opset, &infos).with_limits(limits);
        let prep = (def.prepare)(&ctx).map_err(|e| e.at_node(ni))?;
        if prep.outputs.len()
            < node
                .outputs
                .iter()
                .rposition(|o| o.is_some())
                .map_or(0, |p| p.saturating_add(1))
        {
            return Err(Error::new(ErrorKind::Invalid(
                "node has more outputs than the op defines",
            ))
            .at_node(ni));
        }
        for o in &prep.outputs {
            checked_numel(&o.shape).map_err(|e| e.at_node(ni))?;
        }
        let n_inputs = node.inputs.iter().flatten().count();
        if let Some(values) = prep.values {
            // Known from shapes alone (Shape, Size).
            limits
                .take_heap(
                    values
                        .iter()
                        .map(Const::byte_len)
                        .fold(0, usize::saturating_add),
                )
                .map_err(|e| e.at_node(ni))?;
            for (o, v) in node.outputs.iter().zip(values) {
                if let Some(o) = o {
                    folded.push(v);
                    let c = folded
                        .last()
                        .ok_or(Error::new(ErrorKind::Internal("fold")))?;
                    *at_mut(&mut slots, *o as usize)? = Slot {
                        dtype: c.dtype,
                        shape: c.shape.clone(),
                        loc: Loc::Folded(folded.len().saturating_sub(1) as u32),
                    };
                    *at_mut(&mut known, *o as usize)? = true;
                }
            }
            continue;
        }
        if prep.alias {
            let src = node
                .inputs
                .first()
                .copied()
                .flatten()
                .ok_or(Error::new(ErrorKind::MissingInput { index: 0 }).at_node(ni))?;
            let out_info = prep
                .outputs
                .first()
                .ok_or(Error::new(ErrorKind::Internal("alias output")).at_node(ni))?;
            if let Some(Some(o)) = node.outputs.first() {
                let src_slot = at(&slots, src as usize)?;
                let src_loc = src_slot.loc;
                let src_len = byte_len(src_slot)?;
                let out_slot = Slot {
                    dtype: out_info.dtype,
                    shape: out_info.shape.clone(),
                    loc: Loc::None,
                };
                if byte_len(&out_slot)? != src_len {
                    return Err(
                        Error::new(ErrorKind::Internal("alias changes byte size")).at_node(ni)
                    );
                }
                let loc = match src_loc {
                    Loc::Model(_) | Loc::Folded(_) => src_loc,
                    _ => {
                        *at_mut(&mut alias_of, *o as usize)? = Some(src);
                        Loc::None
                    }
                };
                *at_mut(&mut slots, *o as usize)? = Slot { loc, ..out_slot };
                *at_mut(&mut known, *o as usize)? = true;
            }
            continue;
        }
        if all_const && n_inputs > 0 {
            // Gather constant inputs by reference for evaluation.
            let mut consts: Vec<Option<Const>> = Vec::with_capacity(node.inputs.len());
            for &inp in &node.inputs {
                consts.push(match inp {
                    None => None,
                    Some(t) => {
                        let s = at(&slots, t as usize)?;
                        let data = match s.loc {
                            Loc::Model(m) => g
                                .tensors
                                .get(m as usize)
                                .and_then(|t| t.value.as_ref())
                                .map(|c| c.data.clone()),
                            Loc::Folded(f) => folded.get(f as usize).map(|c| c.data.clone()),
                            _ => None,
                        }
                        .ok_or(Error::new(ErrorKind::Internal("const input")).at_node(ni))?;
                        Some(Const {
                            dtype: s.dtype,
                            shape: s.shape.clone(),
                            data,
                        })
                    }
                });
            }
            let refs: Vec<Option<&Const>> = consts.iter().map(|c| c.as_ref()).collect();
            let values =
                eval_const_within(node, opset, &refs, &mut limits).map_err(|e| e.at_node(ni))?;
            for (o, v) in node.outputs.iter().zip(values) {
                if let Some(o) = o {
                    folded.push(v);
                    let c = folded
                        .last()
                        .ok_or(Error::new(ErrorKind::Internal("fold")))?;
                    *at_mut(&mut slots, *o as usize)? = Slot {
                        dtype: c.dtype,
                        shape: c.shape.clone(),
                        loc: Loc::Folded(folded.len().saturating_sub(1) as u32),
                    };
                    *at_mut(&mut known, *o as usize)? = true;
                }
            }
            continue;
        }
        for (o, info) in node.outputs.iter().zip(&prep.outputs) {
            if let Some(o) = o {
                *at_mut(&mut slots, *o as usize)? = Slot {
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    loc: Loc::None,
                };
                *at_mut(&mut known, *o as usize)? = true;
            }
        }
        inplace_ok.push(prep.inplace);
        scratch_req.push(prep.scratch);
        packed_bytes = packed_bytes.saturating_add(prep.heap);
        steps.push(Step {
            node: ni,
            kernel: prep.kernel,
            inputs: node.inputs.clone(),
            outputs: node
                .outputs
                .iter()
                .take(prep.outputs.len())
                .copied()
                .collect(),
            scratch: (0, 0),
            inplace: false,
            shapes: prep.dynamic.then_some(0),
        });
    }
    for &o in &g.outputs {
        if !known.get(o as usize).copied().unwrap_or(false) {
            return Err(Error::new(ErrorKind::MissingTensor).at_tensor(o));
        }
    }

    // Root buffer of each tensor through alias chains.
    let root = |mut t: TensorId, alias_of: &[Option<TensorId>]| {
        let mut guard = 0usize;
        while let Some(Some(s)) = alias_of.get(t as usize) {
            t = *s;
            guard = guard.saturating_add(1);
            if guard > alias_of.len() {
                break;
            }
        }
        t
    };

    // Dead-node removal: keep steps that (transitively) feed a graph output.
    let mut needed = alloc::vec![false; slots.len()];
    for &o in &g.outputs {
        *at_mut(&mut needed, o as usize)? = true;
        *at_mut(&mut needed, root(o, &alias_of) as usize)? = true;
    }
    let mut keep = alloc::vec![false; steps.len()];
    for (st, k) in steps.iter().zip(keep.iter_mut()).rev() {
        let mut used = false;
        for &o in st.outputs.iter().flatten() {
            used |= *at(&needed, o as usize)?;
        }
        if used {
            *k = true;
            for &i in st.inputs.iter().flatten() {
                *at_mut(&mut needed, i as usize)? = true;
                let r = root(i, &alias_of);
                *at_mut(&mut needed, r as usize)? = true;
            }
        }
    }
    let mut kept_steps = Vec::new();
    let mut kept_inplace = Vec::new();
    let mut kept_scratch = Vec::new();
    for (((st, k), ip), sc) in steps.into_iter().zip(keep).zip(inplace_ok).zip(scratch_req) {
        if k {
            kept_steps.push(st);
            kept_inplace.push(ip);
            kept_scratch.push(sc);
        }
    }
    let mut steps = kept_steps;
    let n_steps = steps.len();

    // A data-dependent shape is only known after its kernel ran, so such a
    // tensor may only be a graph output: nothing planned may read it.
    for st in steps.iter().filter(|st| st.shapes.is_some()) {
        for &o in st.outputs.iter().flatten() {
            let read =
                steps.iter().any(|s| s.inputs.contains(&Some(o))) || alias_of.contains(&Some(o));
            if read || !g.outputs.contains(&o) {
                return Err(Error::new(ErrorKind::Unsupported(
                    "an output whose shape depends on values (NonZero, Unique, ...) feeds another op",
                ))
                .at_node(st.node)
                .at_tensor(o));
            }
        }
    }

    // Liveness per root buffer: first definition and last use, in steps.
    let nt = slots.len();
    let mut first = alloc::vec![usize::MAX; nt];
    let mut last = alloc::vec![0usize; nt];
    let in_arena = |t: TensorId, slots: &[Slot]| {
        matches!(slots.get(t as usize).map(|s| s.loc), Some(Loc::None))
    };
    for &i in &g.inputs {
        let r = root(i, &alias_of);
        *at_mut(&mut first, r as usize)? = 0;
    }
    for (si, st) in steps.iter().enumerate() {
        for &o in st.outputs.iter().flatten() {
            let r = root(o, &alias_of) as usize;
            let f = at_mut(&mut first, r)?;
            *f = (*f).min(si);
            let l = at_mut(&mut last, r)?;
            *l = (*l).max(si);
        }
        for &i in st.inputs.iter().flatten() {
            if in_arena(i, &slots) {
                let r = root(i, &alias_of) as usize;
                let l = at_mut(&mut last, r)?;
                *l = (*l).max(si);
            }
        }
    }
    for &o in &g.outputs {
        if in_arena(o, &slots) {
            let r = root(o, &alias_of) as usize;
            let l = at_mut(&mut last, r)?;
            *l = n_steps.saturating_sub(1).max(*l);
            let f = at_mut(&mut first, r)?;
            if *f == usize::MAX {
                *f = 0;
            }
        }
    }
    let mut is_graph_output_root: Vec<bool> = {
        let mut v = alloc::vec![false; nt];
        for &o in &g.outputs {
            *at_mut(&mut v, root(o, &alias_of) as usize)? = true;
        }
        v
    };

    // In place: output 0 joins input 0's buffer when that buffer dies here.
    if opts.in_place {
        for (si, (step, &ok)) in steps.iter_mut().zip(&kept_inplace).enumerate() {
            if !ok {
                continue;
            }
            let (Some(Some(i0)), Some(Some(o0))) =
                (step.inputs.first().copied(), step.outputs.first().copied())
            else {
                continue;
            };
            if !in_arena(i0, &slots) {
                continue;
            }
            // Input 0 must not appear as another input of the same step.
            if step
                .inputs
                .iter()
                .skip(1)
                .flatten()
                .any(|&t| root(t, &alias_of) == root(i0, &alias_of))
            {
                continue;
            }
            let r = root(i0, &alias_of) as usize;
            if *at(&last, r)? != si
                || *at(&is_graph_output_root, r)?
                || byte_len(at(&slots, i0 as usize)?)? != byte_len(at(&slots, o0 as usize)?)?
            {
                continue;
            }
            let ro = root(o0, &alias_of) as usize;
            if ro != o0 as usize {
                continue;
            }
            *at_mut(&mut alias_of, o0 as usize)? = Some(r as TensorId);
            let mut l = (*at(&last, r)?).max(*at(&last, o0 as usize)?);
            if *at(&is_graph_output_root, o0 as usize)? {
                l = n_steps.saturating_sub(1).max(l);
                // The buffer now holds a graph output: a later step must
                // not overwrite it in place (outputs y = f(x), z = g(y)).
                *at_mut(&mut is_graph_output_root, r)? = true;
            }
            *at_mut(&mut last, r)? = l;
            *at_mut(&mut first, o0 as usize)? = usize::MAX;
            step.inplace = true;
        }
    }

    // Buffers: one per root tensor in the arena, plus one scratch per step.
    let mut bufs: Vec<Buffer> = Vec::new();
    let mut buf_of = alloc::vec![usize::MAX; nt];
    let per_tensor = slots
        .iter()
        .zip(&first)
        .zip(&last)
        .zip(&alias_of)
        .zip(buf_of.iter_mut());
    for ((((slot, &f), &l), alias), b) in per_tensor {
        if f == usize::MAX || !matches!(slot.loc, Loc::None) || alias.is_some() {
            continue;
        }
        *b = bufs.len();
        bufs.push(Buffer {
            size: byte_len(slot)?,
            first: f,
            last: l.max(f),
        });
    }
    let mut scratch_buf = alloc::vec![usize::MAX; n_steps];
    for ((&sc, sb), si) in kept_scratch.iter().zip(scratch_buf.iter_mut()).zip(0..) {
        if sc > 0 {
            *sb = bufs.len();
            bufs.push(Buffer {
                size: sc,
                first: si,
                last: si,
            });
        }
    }
    let record_bytes = ops::SHAPE_RECORD_BYTES;
    let mut shapes_buf = alloc::vec![usize::MAX; n_steps];
    for ((si, st), sb) in steps.iter().enumerate().zip(shapes_buf.iter_mut()) {
        if st.shapes.is_some() {
            *sb = bufs.len();
            bufs.push(Buffer {
                size: st.outputs.len().max(1).saturating_mul(record_bytes),
                first: si,
                last: n_steps.saturating_sub(1),
            });
        }
    }
    let offsets = GreedyBySize.place(&bufs)?;
    let arena_bytes = planner::arena_size(&bufs, &offsets)?;
    let lower_bound = planner::lower_bound(&bufs)?;
    if !planner::check_no_overlap(&bufs, &offsets) {
        return Err(Error::new(ErrorKind::Internal(
            "planner produced overlapping buffers",
        )));
    }
    if let Some(max) = opts.max_arena {
        if arena_bytes > max {
            return Err(Error::new(ErrorKind::OverBudget {
                needed: arena_bytes,
                budget: max,
            }));
        }
    }
    if let Some(budget) = opts.max_memory {
        let folded_bytes: usize = folded
            .iter()
            .map(Const::byte_len)
            .fold(0, usize::saturating_add);
        let needed = weights
            .saturating_add(folded_bytes)
            .saturating_add(arena_bytes);
        if needed > budget {
            return Err(Error::new(ErrorKind::OverBudget { needed, budget }));
        }
    }
    // Offset and size of buffer `b`.
    let placed =
        |b: usize| -> Result<(usize, usize)> { Ok((*at(&offsets, b)?, at(&bufs, b)?.size)) };
    for (t, slot) in slots.iter_mut().enumerate() {
        if !matches!(slot.loc, Loc::None) {
            continue;
        }
        let r = root(t as TensorId, &alias_of) as usize;
        let b = *at(&buf_of, r)?;
        if b == usize::MAX {
            continue; // never produced nor used (dead)
        }
        let len = byte_len(slot)?;
        slot.loc = Loc::Arena {
            offset: placed(b)?.0,
            len,
        };
    }
    let mut scratch_max = 0;
    for ((st, &sb), &hb) in steps.iter_mut().zip(&scratch_buf).zip(&shapes_buf) {
        if sb != usize::MAX {
            let (offset, size) = placed(sb)?;
            st.scratch = (offset, size);
            scratch_max = scratch_max.max(size);
        }
        if hb != usize::MAX {
            st.shapes = Some(placed(hb)?.0);
        }
    }
    // Where each dynamic graph output's shape record is.
    let mut records = alloc::vec![None; g.outputs.len()];
    for st in &steps {
        if let Some(at) = st.shapes {
            for (k, o) in st.outputs.iter().enumerate() {
                for (rec, go) in records.iter_mut().zip(&g.outputs) {
                    if *o == Some(*go) {
                        *rec = Some(at.saturating_add(k.saturating_mul(record_bytes)));
                    }
                }
            }
        }
    }
    let io = |id: TensorId| -> Result<IoInfo> {
        let t = g.tensor(id)?;
        let s = at(&slots, id as usize)?;
        Ok(IoInfo {
            name: t.name.clone(),
            dtype: s.dtype,
            shape: s.shape.clone(),
            id,
            bound: false,
            dynamic: false,
        })
    };
    let inputs = g
        .inputs
        .iter()
        .map(|&i| {
            let mut info = io(i)?;
            info.bound = matches!(at(&slots, i as usize)?.loc, Loc::Folded(_));
            Ok(info)
        })
        .collect::<Result<Vec<_>>>()?;
    let outputs = g
        .outputs
        .iter()
        .zip(&records)
        .map(|(&i, r)| {
            io(i).map(|mut info| {
                info.dynamic = r.is_some();
                info
            })
        })
        .collect::<Result<Vec<_>>>()?;
    for o in &outputs {
        if matches!(at(&slots, o.id as usize)?.loc, Loc::None) {
            return Err(
                Error::new(ErrorKind::Internal("graph output was not placed")).at_tensor(o.id),
            );
        }
    }
    Ok(Plan {
        slots,
        folded,
        steps,
        arena_bytes,
        lower_bound,
        scratch_bytes: scratch_max,
        inputs,
        outputs,
        records,
        defaulted,
        fingerprint: (g.tensors.len(), g.nodes.len()),
        packed_bytes,
    })
}
