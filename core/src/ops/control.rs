//! Control flow: If, Loop, Scan.
//!
//! Each body (subgraph) is planned at prepare time like a model of its own,
//! with its input shapes taken from the node's inputs, and its arena is the
//! node's scratch in the outer arena: everything stays in the one
//! caller-provided buffer, nothing is allocated at run time. If plans both
//! branches and reserves the larger arena (a constant condition plans only
//! the branch taken).
//!
//! ```text
//! outer arena: [ ... | If/Loop/Scan scratch = body arena | ... ]
//!                           body inputs, body tensors, body outputs
//! ```
//!
//! Values the body captures from the outer scope arrive as extra node
//! inputs (appended by the importer, see [`crate::model::captured_names`]);
//! constant ones are folded into the body plan, the others are copied into
//! the body's input buffers before each run. Loop-carried values live in the
//! node's outputs between iterations (copied in and out of the body), so
//! their shapes must not change across iterations. A Loop's scan outputs
//! have a data-dependent length: they are planned for the trip count (which
//! must then be known at build time) and report their real length
//! ([`Prepared::dynamic_shapes`]).

use alloc::vec;
use alloc::vec::Vec;

use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::kern::{win, win_mut};
use crate::model::{captured_names, AttrValue, Const, ConstData, Dim, Graph, Model};
use crate::ops::{kernel, util, InputInfo, KernelIo, OpDef, OutputInfo, PrepareCtx, Prepared};
use crate::plan::{Plan, SessionBuilder};
use crate::planner::ALIGN;
use crate::tensor::copy_exact;
use crate::{DType, Session};

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("If", 1, prepare_if),
    OpDef::onnx("Loop", 1, prepare_loop),
    OpDef::onnx("Scan", 9, prepare_scan),
];

/// A planned body.
#[derive(Debug)]
struct Body {
    model: Model,
    plan: Plan,
    /// Per captured outer value: index of the body input it is copied to,
    /// or `None` (a constant folded into the body, or not used by it).
    captured: Vec<Option<usize>>,
}

impl Body {
    fn arena(&self) -> usize {
        // Saturating: an arena past usize::MAX fails planning.
        self.plan.arena_bytes().saturating_add(ALIGN)
    }
    fn session<'s>(&'s self, arena: &'s mut [u8]) -> Result<Session<'s>> {
        Session::new(&self.model, &self.plan, arena)
    }
    /// Copies `src` into body input `i`.
    fn feed(&self, arena: &mut [u8], i: usize, src: &[u8]) -> Result<()> {
        let mut s = self.session(arena)?;
        let mut dst = s.input_mut(i)?;
        let d = dst.bytes_mut();
        if d.len() != src.len() {
            return Err(Error::internal("body input size"));
        }
        d.copy_from_slice(src);
        Ok(())
    }
    fn invoke(&self, arena: &mut [u8]) -> Result<()> {
        self.session(arena)?.invoke()
    }
}

fn graph_attr<'a>(ctx: &PrepareCtx<'a>, name: &'static str) -> Result<&'a Graph> {
    match ctx.node.attr(name) {
        Some(AttrValue::Graph(g)) => Ok(g),
        _ => Err(Error::new(ErrorKind::Attribute {
            name,
            problem: "expected a GRAPH",
        })),
    }
}

/// Plans `graph` with its formal inputs typed `formal` and the outer values
/// `captured` (name, type and maybe value, in [`captured_names`] order).
fn plan_body(
    ctx: &PrepareCtx<'_>,
    graph: &Graph,
    formal: &[(DType, Vec<usize>)],
    captured: &[(&str, &InputInfo<'_>)],
) -> Result<Body> {
    let mut g = graph.clone();
    if g.inputs.len() != formal.len() {
        return Err(Error::new(ErrorKind::Invalid(
            "body inputs do not match the node's inputs",
        )));
    }
    let fixed = |s: &[usize]| Some(s.iter().map(|&d| Dim::Fixed(d)).collect());
    for (&id, (dt, shape)) in g.inputs.clone().iter().zip(formal) {
        let t = g
            .tensors
            .get_mut(id as usize)
            .ok_or(Error::internal("body input"))?;
        t.dtype = Some(*dt);
        t.shape = fixed(shape);
    }
    let free: Vec<alloc::string::String> = graph.free_names().into_iter().map(Into::into).collect();
    let mut caps = Vec::with_capacity(captured.len());
    for (name, info) in captured {
        let id = match g.tensor_id(name) {
            Some(id) if free.iter().any(|f| f == name) => id,
            _ => {
                caps.push(None);
                continue;
            }
        };
        let t = g
            .tensors
            .get_mut(id as usize)
            .ok_or(Error::internal("captured"))?;
        t.dtype = Some(info.dtype);
        t.shape = fixed(info.shape);
        if let Some(v) = info.value {
            t.value = Some(Const {
                dtype: v.dtype(),
                shape: v.shape().into(),
                data: ConstData::from_bytes(v.bytes())?,
            });
            caps.push(None);
        } else {
            caps.push(Some(g.inputs.len()));
            g.inputs.push(id);
        }
    }
    let model = Model {
        graph: g,
        ..Model::default()
    };
    // Errors inside the body name body nodes: drop those indices so they
    // are not read as nodes of the outer graph.
    let plan = SessionBuilder::new(&model)
        .with_limits(ctx.limits)
        .plan()
        .map_err(|e| Error::new(e.kind))?;
    Ok(Body {
        model,
        plan,
        captured: caps,
    })
}

/// (name, info) of the captured outer values: node inputs from `first` on.
fn captured<'c, 'a>(
    ctx: &'c PrepareCtx<'a>,
    first: usize,
    names: &'c [alloc::string::String],
) -> Result<Vec<(&'c str, &'c InputInfo<'a>)>> {
    if Some(ctx.num_inputs()) != first.checked_add(names.len()) {
        return Err(Error::internal("captured inputs"));
    }
    names
        .iter()
        .zip(first..)
        .map(|(n, i)| Ok((n.as_str(), ctx.input(i)?)))
        .collect()
}

/// Copies the captured run-time values (node inputs from `first`) into the
/// body.
fn feed_captured(io: &mut KernelIo<'_>, body: &Body, first: usize) -> Result<()> {
    for (c, k) in body.captured.iter().zip(first..) {
        if let Some(i) = c {
            let src = io.input(k)?.bytes();
            body.feed(io.scratch()?, *i, src)?;
        }
    }
    Ok(())
}

/// Copies body output `j` into node output `out` at byte `at`.
fn read_out(io: &mut KernelIo<'_>, body: &Body, j: usize, out: usize, at: usize) -> Result<()> {
    let (mut y, s) = io.output_and_scratch(out)?;
    let sess = body.session(s)?;
    let v = sess.output(j)?;
    let src = v.bytes();
    let dst = win_mut(y.bytes_mut(), at, src.len()).ok_or(Error::internal("body output size"))?;
    dst.copy_from_slice(src);
    Ok(())
}

/// Copies node output `out` (a loop-carried value) into body input `i`.
fn carry_in(io: &mut KernelIo<'_>, body: &Body, out: usize, i: usize) -> Result<()> {
    let (mut y, s) = io.output_and_scratch(out)?;
    body.feed(s, i, y.bytes_mut())
}

fn out_info(plan: &Plan) -> Vec<OutputInfo> {
    plan.outputs()
        .iter()
        .map(|o| OutputInfo::new(o.dtype, &o.shape))
        .collect()
}

// ---------------------------------------------------------------------------

fn prepare_if(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let cond = ctx.input_of(0, DType::Bool)?;
    let names = captured_names(&ctx.node.attrs);
    let caps = captured(ctx, 1, &names)?;
    let known = cond
        .value
        .map(|v| v.bytes().first().is_some_and(|&b| b != 0));
    let then_b = match known {
        Some(false) => None,
        _ => Some(plan_body(ctx, graph_attr(ctx, "then_branch")?, &[], &caps)?),
    };
    let else_b = match known {
        Some(true) => None,
        _ => Some(plan_body(ctx, graph_attr(ctx, "else_branch")?, &[], &caps)?),
    };
    let outputs = match (&then_b, &else_b) {
        (Some(t), Some(e)) => {
            let (ot, oe) = (out_info(&t.plan), out_info(&e.plan));
            if ot != oe {
                return Err(Error::new(ErrorKind::Unsupported(
                    "If branches whose outputs differ in shape or type",
                )));
            }
            ot
        }
        (Some(b), None) | (None, Some(b)) => out_info(&b.plan),
        (None, None) => return Err(Error::internal("If without branch")),
    };
    let scratch = then_b
        .as_ref()
        .map_or(0, Body::arena)
        .max(else_b.as_ref().map_or(0, Body::arena));
    let n_out = outputs.len();
    Ok(Prepared::new(
        outputs,
        kernel("If", move |io: &mut KernelIo<'_>| {
            let c = io.input(0)?.bytes().first().is_some_and(|&b| b != 0);
            let body = if c { &then_b } else { &else_b }
                .as_ref()
                .ok_or(Error::internal("If branch not planned"))?;
            feed_captured(io, body, 1)?;
            body.invoke(io.scratch()?)?;
            for j in 0..n_out {
                if io.has_output(j) {
                    read_out(io, body, j, j, 0)?;
                }
            }
            Ok(())
        }),
    )
    .with_scratch(scratch))
}

// ---------------------------------------------------------------------------

fn prepare_loop(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let g = graph_attr(ctx, "body")?;
    let n = g
        .inputs
        .len()
        .checked_sub(2)
        .ok_or(Error::new(ErrorKind::Invalid(
            "Loop body needs 2 + N inputs",
        )))?;
    let names = captured_names(&ctx.node.attrs);
    // Node inputs: M, cond, the N carried values (2..2 + N = the body's
    // input count), then the captured values.
    let caps = captured(ctx, g.inputs.len(), &names)?;
    let mut formal = vec![(DType::I64, vec![]), (DType::Bool, vec![])];
    for i in 2..g.inputs.len() {
        let v = ctx.input(i)?;
        formal.push((v.dtype, v.shape.into()));
    }
    let body = plan_body(ctx, g, &formal, &caps)?;
    let outs = body.plan.outputs();
    // Body outputs: cond, the N carried values (1..n1), the K scan outputs.
    let n1 = g.inputs.len().wrapping_sub(1); // 1 + N: the body has 2 + N inputs
    let k_scan = outs
        .len()
        .checked_sub(n1)
        .ok_or(Error::new(ErrorKind::Invalid(
            "Loop body needs 1 + N + K outputs",
        )))?;
    for ((dt, shape), o) in formal.iter().skip(2).zip(outs.iter().skip(1)) {
        if o.dtype != *dt || o.shape != *shape {
            return Err(Error::new(ErrorKind::Unsupported(
                "Loop-carried value whose shape changes across iterations",
            )));
        }
    }
    let trip = ctx
        .opt_input(0)
        .and_then(|m| m.value)
        .map(|v| v.int_at(0).unwrap_or(0).max(0) as usize);
    let bound = match (k_scan, trip) {
        (0, _) => 0,
        (_, Some(t)) => t,
        (_, None) => {
            return Err(Error::new(ErrorKind::Unsupported(
                "Loop with scan outputs needs a trip count known at build time",
            )))
        }
    };
    let mut outputs: Vec<OutputInfo> = formal
        .iter()
        .skip(2)
        .map(|(dt, s)| OutputInfo::new(*dt, s))
        .collect();
    let mut elem_bytes = Vec::with_capacity(k_scan);
    for o in outs.iter().skip(n1) {
        let mut s = vec![bound];
        s.extend_from_slice(&o.shape);
        checked_numel(&s)?;
        let eb = checked_numel(&o.shape)?
            .checked_mul(o.dtype.size())
            .ok_or(Error::new(ErrorKind::Overflow))?;
        elem_bytes.push(eb);
        outputs.push(OutputInfo::new(o.dtype, &s));
    }
    let elem_shapes: Vec<Vec<usize>> = outs.iter().skip(n1).map(|o| o.shape.clone()).collect();
    let has_m = ctx.opt_input(0).is_some();
    let has_cond = ctx.opt_input(1).is_some();
    let scratch = body.arena();
    let n_in = g.inputs.len();
    let limit = ctx.limits.loop_iterations;
    let p = Prepared::new(
        outputs,
        kernel("Loop", move |io: &mut KernelIo<'_>| {
            let max = if has_m {
                io.input(0)?.int_at(0).unwrap_or(0).max(0) as usize
            } else {
                usize::MAX
            };
            let max = if k_scan > 0 { max.min(bound) } else { max };
            let mut cond = !has_cond || io.input(1)?.bytes().first().is_some_and(|&b| b != 0);
            for (k, i) in (0..n).zip(2..) {
                let src = io.input(i)?.bytes();
                copy_exact(io.output(k)?.bytes_mut(), src)?;
            }
            let mut it = 0usize;
            while it < max && cond {
                if it as u64 >= limit {
                    return Err(Error::new(ErrorKind::LoopLimit { limit }));
                }
                body.feed(io.scratch()?, 0, &(it as i64).to_le_bytes())?;
                body.feed(io.scratch()?, 1, &[cond as u8])?;
                for (k, i) in (0..n).zip(2..) {
                    carry_in(io, &body, k, i)?;
                }
                feed_captured(io, &body, n_in)?;
                body.invoke(io.scratch()?)?;
                {
                    let s = body.session(io.scratch()?)?;
                    cond = s.output(0)?.bytes().first().is_some_and(|&b| b != 0);
                }
                for (j, k) in (1..n1).zip(0..) {
                    read_out(io, &body, j, k, 0)?;
                }
                for ((&eb, j), k) in elem_bytes.iter().zip(n1..).zip(n..) {
                    // Iteration `it` < bound: within the output, sized
                    // bound · eb (checked at build).
                    let at = it
                        .checked_mul(eb)
                        .ok_or(Error::internal("Loop scan output"))?;
                    read_out(io, &body, j, k, at)?;
                }
                it = it.wrapping_add(1); // it < max <= usize::MAX
            }
            for (es, k) in elem_shapes.iter().zip(n..) {
                let mut s = [0usize; crate::tensor::MAX_RANK];
                let dims = s.get_mut(..=es.len()).ok_or(Error::internal("Loop rank"))?;
                let (first, rest) = dims.split_first_mut().ok_or(Error::internal("Loop rank"))?;
                *first = it;
                rest.copy_from_slice(es);
                io.set_output_shape(k, dims)?;
            }
            Ok(())
        }),
    )
    .with_scratch(scratch);
    Ok(if k_scan > 0 { p.dynamic_shapes() } else { p })
}

// ---------------------------------------------------------------------------

/// One tensor split along an axis: `outer` blocks of `len` slices of
/// `inner` bytes.
#[derive(Clone, Copy, Debug)]
struct Axis {
    outer: usize,
    len: usize,
    inner: usize,
}

impl Axis {
    fn new(shape: &[usize], a: usize, es: usize) -> Result<Self> {
        let (head, tail) = shape
            .split_at_checked(a)
            .ok_or(Error::internal("Scan axis"))?;
        let (&len, rest) = tail.split_first().ok_or(Error::internal("Scan axis"))?;
        let overflow = || Error::new(ErrorKind::Overflow);
        let outer = checked_numel(head)?;
        let inner = checked_numel(rest)?.checked_mul(es).ok_or_else(overflow)?;
        // The whole tensor's bytes: `blocks` stays below it.
        outer
            .checked_mul(len)
            .and_then(|v| v.checked_mul(inner))
            .ok_or_else(overflow)?;
        Ok(Axis { outer, len, inner })
    }
    /// Byte ranges (in the full tensor, in the slice) of slice `t` < len:
    /// below outer · len · inner (checked in `new`), so the wrapping
    /// operations are exact.
    fn blocks(self, t: usize) -> impl Iterator<Item = (usize, usize)> {
        (0..self.outer).map(move |o| {
            let full = o.wrapping_mul(self.len).wrapping_add(t);
            (full.wrapping_mul(self.inner), o.wrapping_mul(self.inner))
        })
    }
    /// Slice `t` of the sequence, walked backwards when `rev`.
    fn step(self, t: usize, rev: bool) -> usize {
        // t < len: len - 1 - t does not wrap.
        if rev {
            self.len.wrapping_sub(1).wrapping_sub(t)
        } else {
            t
        }
    }
}

fn prepare_scan(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let g = graph_attr(ctx, "body")?;
    let m = usize::try_from(ctx.attr_int("num_scan_inputs", 0)?)
        .ok()
        .filter(|&m| m >= 1 && m <= g.inputs.len())
        .ok_or(Error::new(ErrorKind::Attribute {
            name: "num_scan_inputs",
            problem: "must be 1..=body inputs",
        }))?;
    let n = g.inputs.len().wrapping_sub(m); // m <= inputs (filter above)
    let names = captured_names(&ctx.node.attrs);
    let caps = captured(ctx, g.inputs.len(), &names)?;
    let list = |name: &'static str, len: usize| -> Result<Vec<i64>> {
        match ctx.attr_ints(name)? {
            Some(v) if v.len() == len => Ok(v.into()),
            Some(_) => Err(Error::new(ErrorKind::Attribute {
                name,
                problem: "wrong length",
            })),
            None => Ok(vec![0; len]),
        }
    };
    let in_axes = list("scan_input_axes", m)?;
    let in_dirs = list("scan_input_directions", m)?;
    let mut formal = Vec::with_capacity(g.inputs.len());
    for k in 0..n {
        let v = ctx.input(k)?;
        formal.push((v.dtype, Vec::from(v.shape)));
    }
    let mut len = None;
    let mut in_geo = Vec::with_capacity(m);
    for (&ax, i) in in_axes.iter().zip(n..) {
        let v = ctx.input(i)?;
        let a = util::axis(ax, v.shape.len(), "scan_input_axes")?;
        let geo = Axis::new(v.shape, a, v.dtype.size())?;
        let l = geo.len;
        if len.is_some_and(|x| x != l) {
            return Err(Error::new(ErrorKind::Shape(
                "Scan inputs differ in sequence length",
            )));
        }
        len = Some(l);
        let s: Vec<usize> = v
            .shape
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != a)
            .map(|(_, &d)| d)
            .collect();
        formal.push((v.dtype, s));
        in_geo.push(geo);
    }
    let len = len.unwrap_or(0);
    let body = plan_body(ctx, g, &formal, &caps)?;
    let outs = body.plan.outputs();
    let k_scan = outs
        .len()
        .checked_sub(n)
        .ok_or(Error::new(ErrorKind::Invalid(
            "Scan body needs N + K outputs",
        )))?;
    for (k, (dt, shape)) in formal.iter().take(n).enumerate() {
        let o = outs.get(k).ok_or(Error::internal("Scan outputs"))?;
        if o.dtype != *dt || o.shape != *shape {
            return Err(Error::new(ErrorKind::Unsupported(
                "Scan state whose shape changes across iterations",
            )));
        }
    }
    let out_axes = list("scan_output_axes", k_scan)?;
    let out_dirs = list("scan_output_directions", k_scan)?;
    let mut outputs: Vec<OutputInfo> = formal
        .iter()
        .take(n)
        .map(|(dt, s)| OutputInfo::new(*dt, s))
        .collect();
    let mut out_geo = Vec::with_capacity(k_scan);
    for (o, &ax) in outs.iter().skip(n).zip(&out_axes) {
        let rank = o.shape.len().saturating_add(1);
        let a = util::axis(ax, rank, "scan_output_axes")?;
        let mut s = o.shape.clone();
        s.insert(a, len);
        checked_numel(&s)?;
        out_geo.push(Axis::new(&s, a, o.dtype.size())?);
        outputs.push(OutputInfo::new(o.dtype, &s));
    }
    let scratch = body.arena();
    let n_in = g.inputs.len();
    let p = Prepared::new(
        outputs,
        kernel("Scan", move |io: &mut KernelIo<'_>| {
            for k in 0..n {
                let src = io.input(k)?.bytes();
                copy_exact(io.output(k)?.bytes_mut(), src)?;
            }
            for t in 0..len {
                for k in 0..n {
                    carry_in(io, &body, k, k)?;
                }
                for ((geo, &dir), i) in in_geo.iter().zip(&in_dirs).zip(n..) {
                    let tj = geo.step(t, dir != 0);
                    let src = io.input(i)?.bytes();
                    let mut s = body.session(io.scratch()?)?;
                    let mut d = s.input_mut(i)?;
                    let d = d.bytes_mut();
                    for (from, to) in geo.blocks(tj) {
                        let (dd, ss) = win_mut(d, to, geo.inner)
                            .zip(win(src, from, geo.inner))
                            .ok_or(Error::internal("Scan slice"))?;
                        dd.copy_from_slice(ss);
                    }
                }
                feed_captured(io, &body, n_in)?;
                body.invoke(io.scratch()?)?;
                for k in 0..n {
                    read_out(io, &body, k, k, 0)?;
                }
                for ((geo, &dir), j) in out_geo.iter().zip(&out_dirs).zip(n..) {
                    let tj = geo.step(t, dir != 0);
                    let (mut y, s) = io.output_and_scratch(j)?;
                    let sess = body.session(s)?;
                    let v = sess.output(j)?;
                    let src = v.bytes();
                    let y = y.bytes_mut();
                    for (to, from) in geo.blocks(tj) {
                        let (dd, ss) = win_mut(y, to, geo.inner)
                            .zip(win(src, from, geo.inner))
                            .ok_or(Error::internal("Scan output slice"))?;
                        dd.copy_from_slice(ss);
                    }
                }
            }
            Ok(())
        }),
    )
    .with_scratch(scratch);
    Ok(p)
}
