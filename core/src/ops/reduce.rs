//! Reductions: ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceProd,
//! ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSumExp, ReduceLogSum, ArgMax,
//! ArgMin. Floats accumulate in f32 (f16, bf16, f32) or f64; integers wrap.
//!
//! Prepare coalesces the input shape into runs of kept / reduced axes; the
//! kernel walks the outer runs with a strided odometer and the innermost run
//! contiguously (a fold when reduced, an element-wise combine when kept).

use crate::error::{Error, ErrorKind, Result};
use crate::math;
use crate::ops::{kernel, util, OpDef, PrepareCtx, Prepared};
use crate::tensor::ChunksOf as _;
use crate::tensor::{StridedIter, MAX_RANK};
use crate::{DType, Element};
use alloc::vec::Vec;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("ReduceMean", 1, p_mean),
    OpDef::onnx("ReduceMean", 18, p_mean),
    OpDef::onnx("ReduceSum", 1, p_sum),
    OpDef::onnx("ReduceSum", 13, p_sum),
    OpDef::onnx("ReduceMax", 1, p_max),
    OpDef::onnx("ReduceMax", 18, p_max),
    OpDef::onnx("ReduceMin", 1, p_min),
    OpDef::onnx("ReduceMin", 18, p_min),
    OpDef::onnx("ReduceProd", 1, p_prod),
    OpDef::onnx("ReduceProd", 18, p_prod),
    OpDef::onnx("ReduceSumSquare", 1, p_sum_square),
    OpDef::onnx("ReduceSumSquare", 18, p_sum_square),
    OpDef::onnx("ReduceL1", 1, p_l1),
    OpDef::onnx("ReduceL1", 18, p_l1),
    OpDef::onnx("ReduceL2", 1, p_l2),
    OpDef::onnx("ReduceL2", 18, p_l2),
    OpDef::onnx("ReduceLogSumExp", 1, p_lse),
    OpDef::onnx("ReduceLogSumExp", 18, p_lse),
    OpDef::onnx("ReduceLogSum", 1, p_log_sum),
    OpDef::onnx("ReduceLogSum", 18, p_log_sum),
    OpDef::onnx("ArgMax", 1, p_argmax),
    OpDef::onnx("ArgMin", 1, p_argmin),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    SumSquare,
    L1,
    L2,
    LogSumExp,
    LogSum,
}

/// The coalesced iteration of one reduction.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Coalesced input dims (rank >= 1).
    dims: [usize; MAX_RANK],
    /// Whether each coalesced dim is reduced.
    red: [bool; MAX_RANK],
    /// Contiguous input strides of the coalesced dims.
    in_strides: [usize; MAX_RANK],
    /// Output strides (0 on reduced dims).
    out_strides: [usize; MAX_RANK],
    rank: usize,
    /// Input and output element counts.
    in_len: usize,
    out_len: usize,
    /// Elements folded into each output.
    count: usize,
}

impl Plan {
    fn new(shape: &[usize], mask: &[bool]) -> Result<Self> {
        let mut dims = [1usize; MAX_RANK];
        let mut red = [false; MAX_RANK];
        let mut rank = 0usize;
        let mut count = 1usize;
        for (&d, &r) in shape.iter().zip(mask) {
            if r {
                count = count
                    .checked_mul(d)
                    .ok_or(Error::new(ErrorKind::Overflow))?;
            }
            if d == 1 {
                continue;
            }
            let prev = rank.checked_sub(1);
            if prev.is_some_and(|p| red.get(p) == Some(&r)) {
                let p = prev.and_then(|p| dims.get_mut(p));
                let p = p.ok_or(Error::internal("reduce coalesce"))?;
                *p = p.checked_mul(d).ok_or(Error::new(ErrorKind::Overflow))?;
            } else {
                // `setup` refuses a rank above MAX_RANK, and coalescing
                // only merges dims.
                let (dr, rr) = dims
                    .get_mut(rank)
                    .zip(red.get_mut(rank))
                    .ok_or(Error::internal("reduce rank above MAX_RANK"))?;
                *dr = d;
                *rr = r;
                rank = rank.wrapping_add(1); // below MAX_RANK: the get_mut above
            }
        }
        if rank == 0 {
            rank = 1;
        }
        let mut in_strides = [0usize; MAX_RANK];
        let mut out_strides = [0usize; MAX_RANK];
        let (mut ai, mut ao) = (1usize, 1usize);
        for (((&d, &r), is), os) in dims
            .iter()
            .zip(&red)
            .zip(&mut in_strides)
            .zip(&mut out_strides)
            .take(rank)
            .rev()
        {
            *is = ai;
            ai = ai.checked_mul(d).ok_or(Error::new(ErrorKind::Overflow))?;
            if !r {
                *os = ao;
                ao = ao.checked_mul(d).ok_or(Error::new(ErrorKind::Overflow))?;
            }
        }
        Ok(Plan {
            dims,
            red,
            in_strides,
            out_strides,
            rank,
            in_len: ai,
            out_len: ao,
            count,
        })
    }

    /// Calls `row(xs, o, last_red)` for each innermost run `xs` of `x`
    /// (`d` elements) with the output offset `o` it folds into: one output
    /// when the run is reduced (`last_red`), `d` outputs from `o` otherwise.
    #[inline]
    fn rows<X>(
        &self,
        x: &[X],
        out_len: usize,
        mut row: impl FnMut(&[X], usize, bool) -> Result<()>,
    ) -> Result<()> {
        if x.len() != self.in_len || out_len != self.out_len {
            return Err(Error::internal("reduce sizes"));
        }
        let dims = self
            .dims
            .get(..self.rank)
            .ok_or(Error::internal("reduce rank"))?;
        let (&d, outer) = dims.split_last().ok_or(Error::internal("reduce rank"))?;
        let &last_red = self
            .red
            .get(outer.len())
            .ok_or(Error::internal("reduce rank"))?;
        let it = StridedIter::new(outer, [self.in_strides, self.out_strides]);
        if self.in_len == 0 {
            return Ok(());
        }
        for [i, o] in it {
            let xs = i
                .checked_add(d)
                .and_then(|end| x.get(i..end))
                .ok_or(Error::internal("reduce input run"))?;
            row(xs, o, last_red)?;
        }
        Ok(())
    }

    /// Folds `x` into `out` (pre-filled with the identity) with
    /// `step(acc, value)`.
    #[inline]
    fn run<X: Copy, A: Copy>(
        &self,
        x: &[X],
        out: &mut [A],
        step: impl Fn(A, X) -> A,
    ) -> Result<()> {
        let out_len = out.len();
        self.rows(x, out_len, |xs, o, last_red| {
            if last_red {
                let a = out.get_mut(o).ok_or(Error::internal("reduce output"))?;
                let mut acc = *a;
                for &v in xs {
                    acc = step(acc, v);
                }
                *a = acc;
            } else {
                let os = o
                    .checked_add(xs.len())
                    .and_then(|end| out.get_mut(o..end))
                    .ok_or(Error::internal("reduce output run"))?;
                for (ov, &v) in os.iter_mut().zip(xs) {
                    *ov = step(*ov, v);
                }
            }
            Ok(())
        })
    }

    /// [`Plan::run`] with `step(acc, value, side[out_index])`: `side` is
    /// laid out like `out`.
    #[inline]
    fn run_with<X: Copy, A: Copy, S: Copy>(
        &self,
        x: &[X],
        out: &mut [A],
        side: &[S],
        step: impl Fn(A, X, S) -> A,
    ) -> Result<()> {
        if side.len() != out.len() {
            return Err(Error::internal("reduce side length"));
        }
        let out_len = out.len();
        self.rows(x, out_len, |xs, o, last_red| {
            if last_red {
                let a = out.get_mut(o).ok_or(Error::internal("reduce output"))?;
                let &sv = side.get(o).ok_or(Error::internal("reduce output"))?;
                let mut acc = *a;
                for &v in xs {
                    acc = step(acc, v, sv);
                }
                *a = acc;
            } else {
                let end = o
                    .checked_add(xs.len())
                    .ok_or(Error::internal("reduce output run"))?;
                let (os, ss) = out
                    .get_mut(o..end)
                    .zip(side.get(o..end))
                    .ok_or(Error::internal("reduce output run"))?;
                for ((ov, &v), &sv) in os.iter_mut().zip(xs).zip(ss) {
                    *ov = step(*ov, v, sv);
                }
            }
            Ok(())
        })
    }
}

/// Reads axes / keepdims / noop_with_empty_axes: (mask, output shape, plan).
fn setup(ctx: &PrepareCtx<'_>, input_axes_since: i64) -> Result<(DType, Vec<usize>, Plan)> {
    let x = ctx.input(0)?;
    let shape = x.shape;
    if shape.len() > MAX_RANK {
        return Err(Error::new(ErrorKind::Unsupported("rank above 8")));
    }
    let axes: Vec<i64> = if ctx.opset >= input_axes_since {
        ctx.const_ints(1)?.unwrap_or_default()
    } else {
        ctx.attr_ints("axes")?
            .map(|a| a.to_vec())
            .unwrap_or_default()
    };
    let keep = ctx.attr_int("keepdims", 1)? != 0;
    let noop = ctx.attr_int("noop_with_empty_axes", 0)? != 0;
    let r = shape.len();
    let mut mask = alloc::vec![false; r];
    if axes.is_empty() {
        if !noop {
            mask.iter_mut().for_each(|m| *m = true);
        }
    } else {
        for &a in &axes {
            let ax = util::axis_or_scalar(a, r, "axes")?;
            if r == 0 {
                continue;
            }
            let m = mask.get_mut(ax).ok_or(Error::internal("reduce axis"))?;
            if *m {
                return Err(Error::new(ErrorKind::Attribute {
                    name: "axes",
                    problem: "repeated axis",
                }));
            }
            *m = true;
        }
    }
    let mut out = Vec::with_capacity(r);
    for (&d, &m) in shape.iter().zip(&mask) {
        if !m {
            out.push(d);
        } else if keep {
            out.push(1);
        }
    }
    Ok((x.dtype, out, Plan::new(shape, &mask)?))
}

fn simple<T, S, F>(
    name: &'static str,
    out: &[usize],
    plan: Plan,
    init: T,
    step: S,
    fin: F,
) -> Prepared
where
    T: Element + Copy,
    S: Fn(T, T) -> T + Copy + Send + Sync + 'static,
    F: Fn(T) -> T + Copy + Send + Sync + 'static,
{
    Prepared::single(
        T::DTYPE,
        out,
        kernel(name, move |io| {
            let x = io.input_slice::<T>(0)?;
            let y = io.output_slice::<T>(0)?;
            y.fill(init);
            plan.run(x, y, step)?;
            for v in y.iter_mut() {
                *v = fin(*v);
            }
            Ok(())
        }),
    )
}

/// Accumulator type of the float reductions: f32 (for f32, f16, bf16) or
/// f64.
trait Acc: bytemuck::Pod + PartialOrd + Send + Sync {
    const ZERO: Self;
    const ONE: Self;
    const INF: Self;
    const NEG_INF: Self;
    fn from_f64(v: f64) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn abs(self) -> Self;
    fn sqrt(self) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn is_nan(self) -> bool;
    fn is_infinite(self) -> bool;
}

impl Acc for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const INF: Self = f32::INFINITY;
    const NEG_INF: Self = f32::NEG_INFINITY;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn add(self, o: Self) -> Self {
        self + o
    }
    fn sub(self, o: Self) -> Self {
        self - o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
    fn abs(self) -> Self {
        math::abs(self)
    }
    fn sqrt(self) -> Self {
        math::sqrt(self)
    }
    fn exp(self) -> Self {
        math::exp(self)
    }
    fn ln(self) -> Self {
        math::ln(self)
    }
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    fn is_infinite(self) -> bool {
        f32::is_infinite(self)
    }
}

impl Acc for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const INF: Self = f64::INFINITY;
    const NEG_INF: Self = f64::NEG_INFINITY;
    fn from_f64(v: f64) -> Self {
        v
    }
    fn add(self, o: Self) -> Self {
        self + o
    }
    fn sub(self, o: Self) -> Self {
        self - o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
    fn abs(self) -> Self {
        libm::fabs(self)
    }
    fn sqrt(self) -> Self {
        libm::sqrt(self)
    }
    fn exp(self) -> Self {
        libm::exp(self)
    }
    fn ln(self) -> Self {
        libm::log(self)
    }
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    fn is_infinite(self) -> bool {
        f64::is_infinite(self)
    }
}

/// Max that propagates NaN (numpy `maximum`).
#[inline]
fn fmax<A: Acc>(a: A, v: A) -> A {
    if v > a || v.is_nan() {
        v
    } else {
        a
    }
}

/// Min that propagates NaN (numpy `minimum`).
#[inline]
fn fmin<A: Acc>(a: A, v: A) -> A {
    if v < a || v.is_nan() {
        v
    } else {
        a
    }
}

/// A float reduction of elements `X` accumulated in `A` (f16 / bf16 in f32,
/// so long sums do not lose the low bits). The accumulators live in scratch
/// and are rounded into the output at the end.
fn float_reduce<X: Element, A: Acc>(
    kind: Kind,
    name: &'static str,
    out: &[usize],
    plan: Plan,
    up: fn(X) -> A,
    down: fn(A) -> X,
) -> Prepared {
    let n = plan.out_len;
    let bufs = if kind == Kind::LogSumExp { 2 } else { 1 };
    let inv = A::from_f64(1.0 / plan.count as f64);
    Prepared::single(
        X::DTYPE,
        out,
        kernel(name, move |io| {
            let x = io.input_slice::<X>(0)?;
            let (y, scratch) = io.output_and_scratch(0)?;
            let y = y.into_slice::<X>()?;
            if n == 0 {
                // Zero-byte scratch is not aligned for A.
                return Ok(());
            }
            let s: &mut [A] = bytemuck::try_cast_slice_mut(scratch)
                .map_err(|_| Error::new(ErrorKind::Internal("scratch alignment")))?;
            let s = s
                .get_mut(..n.saturating_mul(bufs))
                .ok_or(Error::new(ErrorKind::Internal("scratch size")))?;
            let (acc, rest) = s
                .split_at_mut_checked(n)
                .ok_or(Error::new(ErrorKind::Internal("scratch size")))?;
            match kind {
                Kind::Sum | Kind::Mean | Kind::LogSum => {
                    acc.fill(A::ZERO);
                    plan.run(x, acc, |a, v| a.add(up(v)))?;
                }
                Kind::Max => {
                    acc.fill(A::NEG_INF);
                    plan.run(x, acc, |a, v| fmax(a, up(v)))?;
                }
                Kind::Min => {
                    acc.fill(A::INF);
                    plan.run(x, acc, |a, v| fmin(a, up(v)))?;
                }
                Kind::Prod => {
                    acc.fill(A::ONE);
                    plan.run(x, acc, |a, v| a.mul(up(v)))?;
                }
                Kind::SumSquare | Kind::L2 => {
                    acc.fill(A::ZERO);
                    plan.run(x, acc, |a, v| {
                        let u = up(v);
                        a.add(u.mul(u))
                    })?;
                }
                Kind::L1 => {
                    acc.fill(A::ZERO);
                    plan.run(x, acc, |a, v| a.add(up(v).abs()))?;
                }
                Kind::LogSumExp => {
                    // Shift by the maximum so exp cannot overflow; an empty or
                    // all -inf group keeps shift 0 and gives ln(0) = -inf.
                    let m = rest;
                    m.fill(A::NEG_INF);
                    plan.run(x, m, |a, v| fmax(a, up(v)))?;
                    for v in m.iter_mut() {
                        if v.is_infinite() {
                            *v = A::ZERO;
                        }
                    }
                    acc.fill(A::ZERO);
                    let mm: &[A] = m;
                    plan.run_with(x, acc, mm, |a, v, sh| a.add(up(v).sub(sh).exp()))?;
                    for (v, &sh) in acc.iter_mut().zip(mm) {
                        *v = v.ln().add(sh);
                    }
                }
            }
            for (o, &a) in y.iter_mut().zip(acc.iter()) {
                *o = down(match kind {
                    Kind::Mean => a.mul(inv),
                    Kind::L2 => a.sqrt(),
                    Kind::LogSum => a.ln(),
                    _ => a,
                });
            }
            Ok(())
        }),
    )
    // Saturating: a size past usize::MAX fails planning (arena budget).
    .with_scratch(
        n.saturating_mul(bufs)
            .saturating_mul(core::mem::size_of::<A>()),
    )
}

/// Integer reductions wrap on overflow (numpy's behaviour); the mean divides
/// the integer sum, truncating toward zero like numpy's cast of the mean.
macro_rules! int_reduce {
    ($t:ty, $kind:expr, $name:expr, $out:expr, $plan:expr, $abs:expr) => {{
        let cnt = $plan.count as $t;
        match $kind {
            Kind::Sum => Some(simple(
                $name,
                $out,
                $plan,
                0 as $t,
                |a: $t, v| a.wrapping_add(v),
                |a| a,
            )),
            Kind::Mean => Some(simple(
                $name,
                $out,
                $plan,
                0 as $t,
                |a: $t, v| a.wrapping_add(v),
                move |a| a.checked_div(cnt).unwrap_or(a),
            )),
            Kind::Prod => Some(simple(
                $name,
                $out,
                $plan,
                1 as $t,
                |a: $t, v| a.wrapping_mul(v),
                |a| a,
            )),
            Kind::Max => Some(simple(
                $name,
                $out,
                $plan,
                <$t>::MIN,
                |a: $t, v| a.max(v),
                |a| a,
            )),
            Kind::Min => Some(simple(
                $name,
                $out,
                $plan,
                <$t>::MAX,
                |a: $t, v| a.min(v),
                |a| a,
            )),
            Kind::SumSquare => Some(simple(
                $name,
                $out,
                $plan,
                0 as $t,
                |a: $t, v| a.wrapping_add(v.wrapping_mul(v)),
                |a| a,
            )),
            Kind::L1 => Some(simple(
                $name,
                $out,
                $plan,
                0 as $t,
                |a: $t, v| a.wrapping_add($abs(v)),
                |a| a,
            )),
            _ => None,
        }
    }};
}

/// ReduceMax / ReduceMin of bool (opset 20): any / all. An empty group gives
/// false for max, true for min (the identities).
fn bool_reduce(kind: Kind, name: &'static str, out: &[usize], plan: Plan) -> Option<Prepared> {
    let is_max = match kind {
        Kind::Max => true,
        Kind::Min => false,
        _ => return None,
    };
    Some(Prepared::single(
        DType::Bool,
        out,
        kernel(name, move |io| {
            let x = io.input(0)?.bytes();
            let y = io.output(0)?.into_bytes();
            if is_max {
                y.fill(0);
                plan.run(x, y, |a, v| a | (v != 0) as u8)
            } else {
                y.fill(1);
                plan.run(x, y, |a, v| a & (v != 0) as u8)
            }
        }),
    ))
}

fn prepare_reduce(
    ctx: &PrepareCtx<'_>,
    kind: Kind,
    name: &'static str,
    input_axes_since: i64,
) -> Result<Prepared> {
    let (dt, out, plan) = setup(ctx, input_axes_since)?;
    let small_int = matches!(kind, Kind::Max | Kind::Min);
    let p = match dt {
        DType::F32 => Some(float_reduce::<f32, f32>(
            kind,
            name,
            &out,
            plan,
            |v| v,
            |a| a,
        )),
        DType::F64 => Some(float_reduce::<f64, f64>(
            kind,
            name,
            &out,
            plan,
            |v| v,
            |a| a,
        )),
        DType::F16 => Some(float_reduce::<half::f16, f32>(
            kind,
            name,
            &out,
            plan,
            half::f16::to_f32,
            half::f16::from_f32,
        )),
        DType::BF16 => Some(float_reduce::<half::bf16, f32>(
            kind,
            name,
            &out,
            plan,
            half::bf16::to_f32,
            half::bf16::from_f32,
        )),
        DType::I64 => int_reduce!(i64, kind, name, &out, plan, |v: i64| v.wrapping_abs()),
        DType::I32 => int_reduce!(i32, kind, name, &out, plan, |v: i32| v.wrapping_abs()),
        DType::U64 => int_reduce!(u64, kind, name, &out, plan, |v: u64| v),
        DType::U32 => int_reduce!(u32, kind, name, &out, plan, |v: u32| v),
        DType::I8 if small_int => int_reduce!(i8, kind, name, &out, plan, |v: i8| v),
        DType::U8 if small_int => int_reduce!(u8, kind, name, &out, plan, |v: u8| v),
        DType::Bool if ctx.opset >= 20 => bool_reduce(kind, name, &out, plan),
        _ => None,
    };
    p.ok_or(Error::new(ErrorKind::UnsupportedDType {
        what: name,
        code: dt.onnx_code(),
    }))
}

fn p_mean(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::Mean, "ReduceMean", 18)
}
fn p_sum(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::Sum, "ReduceSum", 13)
}
fn p_max(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::Max, "ReduceMax", 18)
}
fn p_min(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::Min, "ReduceMin", 18)
}
fn p_prod(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::Prod, "ReduceProd", 18)
}
fn p_sum_square(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::SumSquare, "ReduceSumSquare", 18)
}
fn p_l1(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::L1, "ReduceL1", 18)
}
fn p_l2(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::L2, "ReduceL2", 18)
}
fn p_lse(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::LogSumExp, "ReduceLogSumExp", 18)
}
fn p_log_sum(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::LogSum, "ReduceLogSum", 18)
}

fn arg_kernel<X: Element + PartialOrd>(
    name: &'static str,
    out: &[usize],
    (outer, n, inner): (usize, usize, usize),
    is_max: bool,
    last: bool,
) -> Prepared {
    Prepared::single(
        DType::I64,
        out,
        kernel(name, move |io| {
            let x = io.input_slice::<X>(0)?;
            let y = io.output_slice::<i64>(0)?;
            let plane = n.checked_mul(inner);
            let sizes = plane
                .and_then(|p| p.checked_mul(outer))
                .zip(outer.checked_mul(inner));
            if sizes != Some((x.len(), y.len())) {
                return Err(Error::new(ErrorKind::Internal("ArgMax sizes")));
            }
            if y.is_empty() {
                // No output (then no input either, as n >= 1).
                return Ok(());
            }
            // One plane of `n * inner` inputs and `inner` outputs per outer
            // index (n >= 1 and inner >= 1 here); lane `i` of a plane is
            // every `inner`-th element from `i`.
            let lanes =
                core::num::NonZeroUsize::new(inner).ok_or(Error::internal("ArgMax lane"))?;
            let plane = plane.ok_or(Error::internal("ArgMax sizes"))?;
            for (xp, yp) in x.chunks_of(plane).zip(y.chunks_of_mut(inner)) {
                for (i, yv) in yp.iter_mut().enumerate() {
                    let mut lane = xp.iter().skip(i).step_by(lanes.get());
                    let Some(&first) = lane.next() else {
                        return Err(Error::internal("ArgMax lane"));
                    };
                    let mut best = first;
                    let mut bi = 0usize;
                    for (j, &v) in (1..).zip(lane) {
                        let better = if is_max {
                            v > best || (last && v == best)
                        } else {
                            v < best || (last && v == best)
                        };
                        if better {
                            best = v;
                            bi = j;
                        }
                    }
                    *yv = bi as i64;
                }
            }
            Ok(())
        }),
    )
}

fn prepare_arg(ctx: &PrepareCtx<'_>, is_max: bool, name: &'static str) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let shape = x.shape;
    if shape.is_empty() {
        return Err(Error::new(ErrorKind::Rank {
            expected: 1,
            got: 0,
        }));
    }
    let axis = util::axis(ctx.attr_int("axis", 0)?, shape.len(), "axis")?;
    let keep = ctx.attr_int("keepdims", 1)? != 0;
    let last = ctx.attr_int("select_last_index", 0)? != 0;
    let (head, tail) = shape
        .split_at_checked(axis)
        .ok_or(Error::internal("ArgMax axis"))?;
    let (&n, rest) = tail.split_first().ok_or(Error::internal("ArgMax axis"))?;
    let outer: usize = head.iter().product();
    let inner: usize = rest.iter().product();
    if n == 0 {
        return Err(Error::new(ErrorKind::Shape(
            "ArgMax/ArgMin over an empty axis",
        )));
    }
    if axis >= shape.len() {
        return Err(Error::internal("ArgMax axis"));
    }
    let out: Vec<usize> = shape
        .iter()
        .enumerate()
        .filter(|&(i, _)| keep || i != axis)
        .map(|(i, &d)| if i == axis { 1 } else { d })
        .collect();
    let g = (outer, n, inner);
    Ok(match x.dtype {
        DType::F32 => arg_kernel::<f32>(name, &out, g, is_max, last),
        DType::F64 => arg_kernel::<f64>(name, &out, g, is_max, last),
        DType::F16 => arg_kernel::<half::f16>(name, &out, g, is_max, last),
        DType::BF16 => arg_kernel::<half::bf16>(name, &out, g, is_max, last),
        DType::I8 => arg_kernel::<i8>(name, &out, g, is_max, last),
        DType::U8 => arg_kernel::<u8>(name, &out, g, is_max, last),
        DType::I16 => arg_kernel::<i16>(name, &out, g, is_max, last),
        DType::U16 => arg_kernel::<u16>(name, &out, g, is_max, last),
        DType::I32 => arg_kernel::<i32>(name, &out, g, is_max, last),
        DType::U32 => arg_kernel::<u32>(name, &out, g, is_max, last),
        DType::I64 => arg_kernel::<i64>(name, &out, g, is_max, last),
        DType::U64 => arg_kernel::<u64>(name, &out, g, is_max, last),
        dt => {
            return Err(Error::new(ErrorKind::UnsupportedDType {
                what: name,
                code: dt.onnx_code(),
            }))
        }
    })
}

fn p_argmax(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_arg(ctx, true, "ArgMax")
}
fn p_argmin(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_arg(ctx, false, "ArgMin")
}

#[cfg(test)]
mod tests {
    use crate::math;
    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;

    use crate::ops::testing::rnd;

    /// Naive reduction over `mask` of a row-major `shape`: groups elements by
    /// output index, then applies `f` to each group.
    fn naive(shape: &[usize], x: &[f32], mask: &[bool], f: impl Fn(&[f32]) -> f32) -> Vec<f32> {
        let out_dims: Vec<usize> = shape
            .iter()
            .zip(mask)
            .map(|(&d, &m)| if m { 1 } else { d })
            .collect();
        let on: usize = out_dims.iter().product();
        let mut groups: Vec<Vec<f32>> = vec![Vec::new(); on];
        for (lin, &v) in x.iter().enumerate() {
            let mut rem = lin;
            let mut idx = vec![0; shape.len()];
            for d in (0..shape.len()).rev() {
                idx[d] = rem % shape[d];
                rem /= shape[d];
            }
            let mut o = 0;
            for d in 0..shape.len() {
                o = o * out_dims[d] + if mask[d] { 0 } else { idx[d] };
            }
            groups[o].push(v);
        }
        groups.iter().map(|g| f(g)).collect()
    }

    type RefFn = fn(&[f32]) -> f32;
    const OPS: [(&str, RefFn); 9] = [
        ("ReduceSum", |g| g.iter().sum()),
        ("ReduceMean", |g| g.iter().sum::<f32>() / g.len() as f32),
        ("ReduceMax", |g| {
            g.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        }),
        ("ReduceMin", |g| {
            g.iter().copied().fold(f32::INFINITY, f32::min)
        }),
        ("ReduceProd", |g| g.iter().product()),
        ("ReduceSumSquare", |g| g.iter().map(|v| v * v).sum()),
        ("ReduceL1", |g| g.iter().map(|v| math::abs(*v)).sum()),
        ("ReduceL2", |g| math::sqrt(g.iter().map(|v| v * v).sum())),
        ("ReduceLogSumExp", |g| {
            math::ln(g.iter().map(|v| math::exp(*v)).sum())
        }),
    ];

    #[test]
    fn reductions_axes_keepdims_opsets() {
        let shape = [2usize, 3, 4, 5];
        let x = rnd(120, 1);
        let axes_cases: Vec<Vec<i64>> = vec![
            vec![0],
            vec![1],
            vec![3],
            vec![-1],
            vec![1, 2],
            vec![0, 2],
            vec![-3, -1],
            vec![0, 1, 2, 3],
            vec![],
        ];
        for (op, f) in OPS {
            for axes in &axes_cases {
                let mut mask = vec![axes.is_empty(); 4];
                for &a in axes {
                    mask[(if a < 0 { a + 4 } else { a }) as usize] = true;
                }
                let want = naive(&shape, &x, &mask, f);
                for keep in [0i64, 1] {
                    let want_shape: Vec<usize> = shape
                        .iter()
                        .zip(&mask)
                        .filter_map(|(&d, &m)| {
                            if !m {
                                Some(d)
                            } else if keep == 1 {
                                Some(1)
                            } else {
                                None
                            }
                        })
                        .collect();
                    // Attribute form.
                    let mut attrs = vec![("keepdims", AttrValue::Int(keep))];
                    if !axes.is_empty() {
                        attrs.push(("axes", AttrValue::Ints(axes.clone())));
                    }
                    let r = run(op, 11, attrs, &[t(&shape, &x)], 1).unwrap();
                    assert_eq!(r[0].shape, want_shape, "{op} {axes:?}");
                    assert_close(&vals::<f32>(&r[0]), &want, 1e-5);
                    // Input form.
                    let ax = if axes.is_empty() {
                        None
                    } else {
                        t::<i64>(&[axes.len()], axes)
                    };
                    let r = run(
                        op,
                        18,
                        vec![("keepdims", AttrValue::Int(keep))],
                        &[t(&shape, &x), ax],
                        1,
                    )
                    .unwrap();
                    assert_eq!(r[0].shape, want_shape, "{op} {axes:?} opset 18");
                    assert_close(&vals::<f32>(&r[0]), &want, 1e-5);
                }
            }
        }
    }

    #[test]
    fn reduce_sum_opset13_noop_and_i64() {
        let x = rnd(24, 2);
        let r = run(
            "ReduceSum",
            13,
            vec![("keepdims", AttrValue::Int(0))],
            &[t(&[2, 3, 4], &x), t::<i64>(&[1], &[1])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 4]);
        let want = naive(&[2, 3, 4], &x, &[false, true, false], |g| g.iter().sum());
        assert_close(&vals::<f32>(&r[0]), &want, 1e-6);
        // noop_with_empty_axes with empty axes: identity.
        let r = run(
            "ReduceSum",
            13,
            vec![("noop_with_empty_axes", AttrValue::Int(1))],
            &[t(&[2, 3, 4], &x), t::<i64>(&[0], &[])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 3, 4]);
        assert_close(&vals::<f32>(&r[0]), &x, 0.0);
        // Empty axes without noop: reduce all.
        let r = run(
            "ReduceMax",
            18,
            vec![("keepdims", AttrValue::Int(0))],
            &[t(&[2, 3, 4], &x), None],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, Vec::<usize>::new());
        assert_close(
            &vals::<f32>(&r[0]),
            &[x.iter().copied().fold(f32::NEG_INFINITY, f32::max)],
            0.0,
        );
        // i64.
        let xi: Vec<i64> = (0..12).map(|v| v * 3 - 7).collect();
        let r = run(
            "ReduceSum",
            13,
            vec![],
            &[t::<i64>(&[3, 4], &xi), t::<i64>(&[1], &[0])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 4]);
        assert_eq!(vals::<i64>(&r[0]), vec![15, 24, 33, 42]);
        let r = run(
            "ReduceMax",
            13,
            vec![("axes", AttrValue::Ints(vec![1]))],
            &[t::<i64>(&[3, 4], &xi)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![2, 14, 26]);
        // Repeated / out-of-range axes.
        assert!(run(
            "ReduceMean",
            13,
            vec![("axes", AttrValue::Ints(vec![1, -2]))],
            &[t(&[2, 3, 4], &x)],
            1
        )
        .is_err());
        assert!(run(
            "ReduceMean",
            13,
            vec![("axes", AttrValue::Ints(vec![3]))],
            &[t(&[2, 3, 4], &x)],
            1
        )
        .is_err());
        // Size-1 and empty-input dims.
        let r = run(
            "ReduceSum",
            11,
            vec![("axes", AttrValue::Ints(vec![1]))],
            &[t(&[2, 1, 3], &x[..6])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &x[..6], 0.0);
        let r = run(
            "ReduceSum",
            11,
            vec![("axes", AttrValue::Ints(vec![1]))],
            &[t::<f32>(&[2, 0], &[])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![0.0, 0.0]);
    }

    #[test]
    fn argmax_argmin() {
        let shape = [3usize, 4, 5];
        let x = rnd(60, 3);
        for axis in [0i64, 1, 2, -1] {
            let a = if axis < 0 { axis + 3 } else { axis } as usize;
            let outer: usize = shape[..a].iter().product();
            let n = shape[a];
            let inner: usize = shape[a + 1..].iter().product();
            for (op, is_max) in [("ArgMax", true), ("ArgMin", false)] {
                let mut want = Vec::new();
                for o in 0..outer {
                    for i in 0..inner {
                        let col: Vec<f32> =
                            (0..n).map(|j| x[o * n * inner + j * inner + i]).collect();
                        let mut bi = 0;
                        for j in 1..n {
                            if (is_max && col[j] > col[bi]) || (!is_max && col[j] < col[bi]) {
                                bi = j;
                            }
                        }
                        want.push(bi as i64);
                    }
                }
                for keep in [0i64, 1] {
                    let r = run(
                        op,
                        13,
                        vec![
                            ("axis", AttrValue::Int(axis)),
                            ("keepdims", AttrValue::Int(keep)),
                        ],
                        &[t(&shape, &x)],
                        1,
                    )
                    .unwrap();
                    let mut ws = shape.to_vec();
                    if keep == 1 {
                        ws[a] = 1;
                    } else {
                        ws.remove(a);
                    }
                    assert_eq!(r[0].shape, ws);
                    assert_eq!(vals::<i64>(&r[0]), want);
                }
            }
        }
        let tie = [1.0f32, 3.0, 3.0, 0.0, 0.0];
        let r = run("ArgMax", 13, vec![], &[t(&[5], &tie)], 1).unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![1]);
        let r = run(
            "ArgMax",
            13,
            vec![("select_last_index", AttrValue::Int(1))],
            &[t(&[5], &tie)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![2]);
        let r = run(
            "ArgMin",
            13,
            vec![
                ("select_last_index", AttrValue::Int(1)),
                ("keepdims", AttrValue::Int(0)),
            ],
            &[t(&[5], &tie)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![4]);
        assert_eq!(r[0].shape, Vec::<usize>::new());
    }

    fn bools(shape: &[usize], v: &[u8]) -> Option<crate::model::Const> {
        Some(crate::model::Const {
            dtype: crate::DType::Bool,
            shape: shape.to_vec(),
            data: crate::model::ConstData::from_bytes(v).unwrap(),
        })
    }

    #[test]
    fn float_dtypes_f64_f16_bf16() {
        // ReduceLogSumExp of the spec's example, axis 1, in f64:
        // ln(e^5 + e^20) = 20.000000305902, ln(e^1 + e^2) = 2.313261687518.
        let x: Vec<f64> = vec![5.0, 1.0, 20.0, 2.0];
        let r = run(
            "ReduceLogSumExp",
            18,
            vec![],
            &[t(&[1, 2, 2], &x), t::<i64>(&[1], &[1])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 1, 2]);
        let got = vals::<f64>(&r[0]);
        assert!((got[0] - 20.000000305902).abs() < 1e-9, "{got:?}");
        assert!((got[1] - 2.313261687518).abs() < 1e-9, "{got:?}");
        // f64 keeps precision f32 would lose: 1e16 + 1 + 1 - 1e16.
        let x: Vec<f64> = vec![1e16, 2.0, 2.0, -1e16];
        let r = run("ReduceSum", 13, vec![], &[t(&[4], &x), None], 1).unwrap();
        assert_eq!(vals::<f64>(&r[0]), vec![4.0]);
        // f16 sums 2048 ones: an f16 accumulator would stall at 2048 + 1.
        let ones = vec![half::f16::ONE; 4096];
        let r = run("ReduceSum", 13, vec![], &[t(&[4096], &ones), None], 1).unwrap();
        assert_eq!(vals::<half::f16>(&r[0]), vec![half::f16::from_f32(4096.0)]);
        // bf16 mean / L2 / max over axis 0 of [[1, -4], [3, 0]].
        let x: Vec<half::bf16> = [1.0f32, -4.0, 3.0, 0.0]
            .iter()
            .map(|&v| half::bf16::from_f32(v))
            .collect();
        for (op, want) in [
            ("ReduceMean", [2.0f32, -2.0]),
            ("ReduceL2", [10f32.sqrt(), 4.0]),
            ("ReduceMax", [3.0, 0.0]),
            ("ReduceL1", [4.0, 4.0]),
        ] {
            let r = run(
                op,
                18,
                vec![("keepdims", AttrValue::Int(0))],
                &[t(&[2, 2], &x), t::<i64>(&[1], &[0])],
                1,
            )
            .unwrap();
            let got: Vec<f32> = vals::<half::bf16>(&r[0])
                .iter()
                .map(|v| v.to_f32())
                .collect();
            assert_close(&got, &want, 1e-2);
        }
    }

    #[test]
    fn reduce_log_sum_opsets() {
        // ln(sum) over axes (2, 1) of 1..=12 in [3, 2, 2] (spec example).
        let x: Vec<f32> = (1..=12).map(|v| v as f32).collect();
        let want = [math::ln(10.0), math::ln(26.0), math::ln(42.0)];
        let r = run(
            "ReduceLogSum",
            13,
            vec![("axes", AttrValue::Ints(vec![2, 1]))],
            &[t(&[3, 2, 2], &x)],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![3, 1, 1]);
        assert_close(&vals::<f32>(&r[0]), &want, 0.0);
        let r = run(
            "ReduceLogSum",
            18,
            vec![("keepdims", AttrValue::Int(0))],
            &[t(&[3, 2, 2], &x), t::<i64>(&[2], &[-1, 1])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![3]);
        assert_close(&vals::<f32>(&r[0]), &want, 0.0);
        // Empty set: ln(0) = -inf.
        let r = run(
            "ReduceLogSum",
            18,
            vec![],
            &[t::<f32>(&[2, 0, 4], &[]), t::<i64>(&[1], &[1])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 1, 4]);
        assert!(vals::<f32>(&r[0]).iter().all(|v| *v == f32::NEG_INFINITY));
        // Integers are refused, not truncated.
        assert!(run(
            "ReduceLogSum",
            18,
            vec![],
            &[t::<i64>(&[2], &[1, 2]), None],
            1
        )
        .is_err());
    }

    #[test]
    fn int_and_bool_dtypes() {
        let x: Vec<i32> = vec![-3, 4, -5, 7, 1, -2];
        let ax = || t::<i64>(&[1], &[1]);
        for (op, want) in [
            ("ReduceSum", vec![-4i32, 6]),
            ("ReduceMean", vec![-1, 2]),
            ("ReduceProd", vec![60, -14]),
            ("ReduceL1", vec![12, 10]),
            ("ReduceSumSquare", vec![50, 54]),
            ("ReduceMin", vec![-5, -2]),
        ] {
            let r = run(op, 18, vec![], &[t(&[2, 3], &x), ax()], 1).unwrap();
            assert_eq!(vals::<i32>(&r[0]), want, "{op}");
        }
        let xu: Vec<u8> = vec![3, 200, 7, 9];
        let r = run("ReduceMax", 18, vec![], &[t(&[2, 2], &xu), ax()], 1).unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![200, 9]);
        assert!(run("ReduceSum", 18, vec![], &[t(&[2, 2], &xu), ax()], 1).is_err());
        // Bool max = any, min = all; an empty group gives the identity.
        let b = [1u8, 0, 0, 0, 1, 1];
        let r = run("ReduceMax", 20, vec![], &[bools(&[3, 2], &b), ax()], 1).unwrap();
        assert_eq!(r[0].dtype, crate::DType::Bool);
        assert_eq!(r[0].data.bytes(), &[1, 0, 1]);
        let r = run("ReduceMin", 20, vec![], &[bools(&[3, 2], &b), ax()], 1).unwrap();
        assert_eq!(r[0].data.bytes(), &[0, 0, 1]);
        let r = run("ReduceMin", 20, vec![], &[bools(&[2, 0], &[]), ax()], 1).unwrap();
        assert_eq!(r[0].data.bytes(), &[1, 1]);
        assert!(run("ReduceMax", 18, vec![], &[bools(&[3, 2], &b), ax()], 1).is_err());
    }

    #[test]
    fn argmax_other_dtypes() {
        let x: Vec<half::f16> = [0.5f32, -1.0, 2.0, 2.0]
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        let r = run("ArgMax", 13, vec![], &[t(&[4], &x)], 1).unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![2]);
        let xi: Vec<i32> = vec![4, -1, 9, -7, 3, 3];
        let r = run(
            "ArgMin",
            13,
            vec![("axis", AttrValue::Int(1))],
            &[t(&[2, 3], &xi)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![1, 0]);
    }
}
