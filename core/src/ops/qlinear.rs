//! Integer quantized operators: QLinearMatMul, MatMulInteger, ConvInteger,
//! QLinearConv (int8 / uint8 data, int32
//! accumulators).
//!
//! These are plain reference kernels (one output element at a time, no
//! blocking) meant to be the oracle for optimized int8 kernels later, so
//! they follow `onnx/reference/ops/op_*.py` literally:
//! - `(q - zero_point)` is formed in i32, products and sums are i32 and wrap
//!   on overflow like numpy's int32 (the spec allows accumulation overflow
//!   only in 32 bits; a product of two 8-bit differences always fits);
//! - requantization computes the multiplier `s_in * s_w / s_out` in the
//!   scales' own dtype (f32, or f16 / bf16 rounded after each operation, as
//!   numpy does), then `acc * multiplier + y_zero_point` in **f64** —
//!   numpy promotes int32 times float32 to float64, and an f32 product would
//!   move a few near-tie results by one — then rounds half to even and
//!   saturates to the output type;
//! - padding of the integer convolutions adds nothing: a padded x equals its
//!   zero point, so `x - x_zero_point` is 0 there.
//!
//! DynamicQuantizeLinear computes entirely in f32, as its reference does.

use alloc::vec::Vec;

use core::num::NonZeroUsize;

use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::kern::{win, win_mut};
use crate::ops::conv::{self, forward_geom, ConvDir, ConvSizes, Geom, MAX_SPATIAL};
use crate::ops::{kernel, util, KernelIo, OpDef, PrepareCtx, Prepared};
use crate::tensor::ChunksOf as _;
use crate::tensor::{broadcast_shapes, broadcast_strides, StridedIter, MAX_RANK};
use crate::{DType, Element};

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("QLinearMatMul", 10, prepare_qlinear_matmul),
    OpDef::onnx("QLinearMatMul", 21, prepare_qlinear_matmul),
    OpDef::onnx("MatMulInteger", 10, prepare_matmul_integer),
    OpDef::onnx("ConvInteger", 10, prepare_conv_integer),
    OpDef::onnx("QLinearConv", 10, prepare_qlinear_conv),
];

pub(crate) use crate::kern::qconv::IntConv;
pub(crate) use crate::kern::{check_len, QInt};

/// A scale element type (QLinearMatMul-21 allows f16 and bf16 scales).
trait QScale: Element + Copy {
    fn f32(self) -> f32;
    /// Rounds an f32 result to this type's precision. f32 carries more than
    /// twice the significand bits of f16 / bf16 plus two, so one f32
    /// operation then this rounding is the correctly rounded f16 / bf16
    /// operation numpy performs.
    fn narrow(v: f32) -> f32;
}

impl QScale for f32 {
    #[inline]
    fn f32(self) -> f32 {
        self
    }
    #[inline]
    fn narrow(v: f32) -> f32 {
        v
    }
}

impl QScale for half::f16 {
    #[inline]
    fn f32(self) -> f32 {
        self.to_f32()
    }
    #[inline]
    fn narrow(v: f32) -> f32 {
        half::f16::from_f32(v).to_f32()
    }
}

impl QScale for half::bf16 {
    #[inline]
    fn f32(self) -> f32 {
        self.to_f32()
    }
    #[inline]
    fn narrow(v: f32) -> f32 {
        half::bf16::from_f32(v).to_f32()
    }
}

/// `match` on an 8-bit dtype, binding the type alias `$t` in `$body`.
macro_rules! with_qint {
    ($dt:expr, $what:expr, $t:ident => $body:expr) => {
        match $dt {
            DType::I8 => {
                type $t = i8;
                $body
            }
            DType::U8 => {
                type $t = u8;
                $body
            }
            dt => Err(Error::new(ErrorKind::UnsupportedDType {
                what: $what,
                code: dt.onnx_code(),
            })),
        }
    };
}
pub(crate) use with_qint;

pub(crate) fn len_err(expected: usize, got: usize) -> Error {
    Error::new(ErrorKind::Len {
        expected: expected as u64,
        got: got as u64,
    })
}

fn shape_err(what: &'static str) -> Error {
    Error::new(ErrorKind::Shape(what))
}

fn overflow() -> Error {
    Error::new(ErrorKind::Overflow)
}

/// `acc * multiplier`, multiplied and rounded half to even in f32 as
/// onnxruntime's MLAS requantization does, plus the zero point, saturated
/// (the same as [`Requant::f32_product`], which the fast paths use).
///
/// [`Requant::f32_product`]: crate::kern::requant::Requant::f32_product
#[inline]
fn requant<Y: QInt>(acc: i32, multiplier: f32, zero_point: i32) -> Y {
    let v = libm::rintf(acc as f32 * multiplier) as f64 + zero_point as f64;
    Y::sat(v)
}

/// `s_in * s_w / s_out` in the scales' dtype, in the reference's order.
#[inline]
fn multiplier<S: QScale>(s_in: f32, s_w: f32, s_out: f32) -> f32 {
    S::narrow(S::narrow(s_in * s_w) / s_out)
}

// ---------------------------------------------------------------------------
// Matrix products
// ---------------------------------------------------------------------------

/// numpy.matmul geometry of `a @ b` (as the float MatMul).
///
/// Every size the kernels index with is checked here (Overflow): the
/// element counts of A, B and the output, `m·k`, `k·n` and `m·n`. Batch
/// offsets stay under numel(A) and numel(B), row offsets under `m·k`,
/// `k·n` and `m·n`, output blocks under numel(output).
#[derive(Clone, Debug)]
struct MmGeom {
    m: usize,
    k: usize,
    n: usize,
    /// `m·k`, `k·n` and `m·n`: one batch matrix of A, B and the output.
    mk: usize,
    kn: usize,
    mn: usize,
    /// Broadcast batch shape of the output.
    batch: Vec<usize>,
    out_shape: Vec<usize>,
    /// Element strides of one batch step into a and b.
    sa: [usize; MAX_RANK],
    sb: [usize; MAX_RANK],
    a_batch: Vec<usize>,
    b_batch: Vec<usize>,
}

fn mm_geom(a: &[usize], b: &[usize]) -> Result<MmGeom> {
    let rank_err = || shape_err("matrix product inputs must have rank >= 1");
    let (ra, rb) = (a.len(), b.len());
    let (m, k, a_batch) = match a {
        [] => return Err(rank_err()),
        &[k] => (1, k, &[][..]),
        [a_batch @ .., m, k] => (*m, *k, a_batch),
    };
    let (kb, n, b_batch) = match b {
        [] => return Err(rank_err()),
        &[kb] => (kb, 1, &[][..]),
        [b_batch @ .., kb, n] => (*kb, *n, b_batch),
    };
    if k != kb {
        return Err(Error::new(ErrorKind::Dim {
            // rb >= 1 here: axis 0 for a vector, rb - 2 otherwise.
            axis: rb.saturating_sub(2),
            expected: k as u64,
            got: kb as u64,
        }));
    }
    let mut bs = [0usize; MAX_RANK];
    let br = broadcast_shapes(a_batch, b_batch, &mut bs)?;
    let batch: Vec<usize> = bs.get(..br).ok_or(Error::internal("batch rank"))?.to_vec();
    let mut out_shape = batch.clone();
    if ra != 1 {
        out_shape.push(m);
    }
    if rb != 1 {
        out_shape.push(n);
    }
    if out_shape.len() > MAX_RANK {
        return Err(Error::new(ErrorKind::Unsupported("rank above 8")));
    }
    checked_numel(a)?;
    checked_numel(b)?;
    checked_numel(&out_shape)?;
    let mk = m.checked_mul(k).ok_or_else(overflow)?;
    let kn = k.checked_mul(n).ok_or_else(overflow)?;
    let mn = m.checked_mul(n).ok_or_else(overflow)?;
    let sa = scaled(broadcast_strides(a_batch, &batch), mk)?;
    let sb = scaled(broadcast_strides(b_batch, &batch), kn)?;
    Ok(MmGeom {
        m,
        k,
        n,
        mk,
        kn,
        mn,
        batch,
        out_shape,
        sa,
        sb,
        a_batch: a_batch.to_vec(),
        b_batch: b_batch.to_vec(),
    })
}

/// `strides` times `by` (element strides of blocks of `by` elements).
fn scaled(mut strides: [usize; MAX_RANK], by: usize) -> Result<[usize; MAX_RANK]> {
    for v in strides.iter_mut() {
        *v = v.checked_mul(by).ok_or_else(overflow)?;
    }
    Ok(strides)
}

/// Where the scale or zero point of one row of A (or column of B) is: at
/// `batch offset + line index * line`.
#[derive(Clone, Copy, Debug)]
struct LineParam {
    /// Strides per output batch axis (0 where the parameter is shared).
    batch: [usize; MAX_RANK],
    /// Stride per row (A) or column (B); 0 when shared.
    line: usize,
    /// Elements the parameter tensor must hold (checked): every offset
    /// `batch offset + line index · line` stays under it.
    numel: usize,
}

/// Validates a per-tensor / per-row (`row`, for A) / per-column (for B)
/// parameter of shape `p` and locates its elements. Accepted: one element;
/// a 1-D vector of `lines` elements; or the N-D form `[..., M, 1]` (A) /
/// `[..., 1, N]` (B) whose leading axes broadcast to the operand's batch.
fn line_param(
    p: &[usize],
    op_batch: &[usize],
    out_batch: &[usize],
    lines: usize,
    row: bool,
) -> Result<LineParam> {
    let numel = checked_numel(p)?;
    let mut lp = LineParam {
        batch: [0; MAX_RANK],
        line: 0,
        numel,
    };
    if numel == 1 {
        return Ok(lp);
    }
    if let &[len] = p {
        if len != lines {
            return Err(shape_err(
                "a 1-D scale / zero point needs one element per row of A or column of B",
            ));
        }
        lp.line = 1;
        return Ok(lp);
    }
    // Rank 0 has one element: rank >= 2 here.
    let &[ref pb @ .., r2, r1] = p else {
        return Err(Error::internal("scale / zero point rank"));
    };
    let (along, across) = if row { (r2, r1) } else { (r1, r2) };
    if across != 1 || (along != 1 && along != lines) {
        return Err(shape_err(
            "scale / zero point must be [..., M, 1] for A or [..., 1, N] for B",
        ));
    }
    if pb.len() > op_batch.len()
        || pb
            .iter()
            .rev()
            .zip(op_batch.iter().rev())
            .any(|(&d, &o)| d != 1 && d != o)
    {
        return Err(shape_err(
            "scale / zero point batch axes do not match the operand",
        ));
    }
    lp.batch = scaled(broadcast_strides(pb, out_batch), along)?;
    lp.line = usize::from(along > 1);
    Ok(lp)
}

/// `sum_p (a[i, p] - za) * (b[p, j] - zb)` over one batch matrix pair,
/// wrapping in i32.
#[inline]
fn dot_int<A: QInt, B: QInt>(
    arow: &[A],
    za: i32,
    b: &[B],
    j: usize,
    n: usize,
    zb: i32,
) -> Result<i32> {
    if arow.is_empty() {
        // k = 0: an empty sum (and `b` is empty).
        return Ok(0);
    }
    // Column j of the k x n matrix `b`: every n-th element from j, checked
    // once (it then has all k = arow.len() elements).
    if j >= n || arow.len().checked_mul(n).is_none_or(|kn| b.len() < kn) {
        return Err(Error::internal("dot_int column"));
    }
    let col = b
        .get(j..)
        .ok_or(Error::internal("dot_int column"))?
        .iter()
        .step_by(n);
    // za and zb are zero points of types A and B (or 0): the differences
    // are at most 255 in magnitude and their product exact in i32; the sum
    // wraps like numpy's int32.
    let mut acc = 0i32;
    for (&av, &bv) in arow.iter().zip(col) {
        let prod = av
            .get()
            .wrapping_sub(za)
            .wrapping_mul(bv.get().wrapping_sub(zb));
        acc = acc.wrapping_add(prod);
    }
    Ok(acc)
}

/// Everything QLinearMatMul's kernel needs: the geometry and where
/// `[a_scale, a_zero_point, b_scale, b_zero_point]` are.
#[derive(Clone, Debug)]
struct QmmParams {
    g: MmGeom,
    q: [LineParam; 4],
}

fn prepare_qlinear_matmul(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let a = ctx.input(0)?;
    let b = ctx.input(3)?;
    let sdt = ctx.input(1)?.dtype;
    let scale_types: &[DType] = if ctx.opset >= 21 {
        &[DType::F32, DType::F16, DType::BF16]
    } else {
        &[DType::F32]
    };
    util::dtype_in(sdt, scale_types, "QLinearMatMul scale")?;
    ctx.input_of(4, sdt)?;
    let ys = ctx.input_of(6, sdt)?;
    util::dtype_in(a.dtype, &[DType::I8, DType::U8], "QLinearMatMul a")?;
    util::dtype_in(b.dtype, &[DType::I8, DType::U8], "QLinearMatMul b")?;
    let az = ctx.input_of(2, a.dtype)?;
    let bz = ctx.input_of(5, b.dtype)?;
    let yz = ctx.input(7)?;
    if ys.numel() != 1 || yz.numel() != 1 {
        return Err(Error::new(ErrorKind::Unsupported(
            "QLinearMatMul: per-tensor y_scale / y_zero_point only",
        )));
    }
    let g = mm_geom(a.shape, b.shape)?;
    if let Some(fast) = super::qdq::qlinear_matmul(ctx, [8, 6, 7])? {
        return Ok(fast);
    }
    let q = [
        line_param(ctx.input(1)?.shape, &g.a_batch, &g.batch, g.m, true)?,
        line_param(az.shape, &g.a_batch, &g.batch, g.m, true)?,
        line_param(ctx.input(4)?.shape, &g.b_batch, &g.batch, g.n, false)?,
        line_param(bz.shape, &g.b_batch, &g.batch, g.n, false)?,
    ];
    let p = QmmParams { g, q };
    with_qint!(a.dtype, "QLinearMatMul a", A => {
        with_qint!(b.dtype, "QLinearMatMul b", B => {
            with_qint!(yz.dtype, "QLinearMatMul y", Y => {
                match sdt {
                    DType::F16 => Ok(build_qmm::<A, B, Y, half::f16>(p)),
                    DType::BF16 => Ok(build_qmm::<A, B, Y, half::bf16>(p)),
                    _ => Ok(build_qmm::<A, B, Y, f32>(p)),
                }
            })
        })
    })
}

fn build_qmm<A: QInt, B: QInt, Y: QInt, S: QScale>(p: QmmParams) -> Prepared {
    let shape = p.g.out_shape.clone();
    Prepared::single(
        Y::DTYPE,
        &shape,
        kernel("QLinearMatMul", move |io| qmm_run::<A, B, Y, S>(io, &p)),
    )
}

fn qmm_run<A: QInt, B: QInt, Y: QInt, S: QScale>(
    io: &mut KernelIo<'_>,
    p: &QmmParams,
) -> Result<()> {
    let g = &p.g;
    let [qas, qaz, qbs, qbz] = p.q;
    let a = io.input_slice::<A>(0)?;
    let a_s = io.input_slice::<S>(1)?;
    let a_z = io.input_slice::<A>(2)?;
    let b = io.input_slice::<B>(3)?;
    let b_s = io.input_slice::<S>(4)?;
    let b_z = io.input_slice::<B>(5)?;
    let y_s = io.input_slice::<S>(6)?;
    let y_z = io.input_slice::<Y>(7)?;
    for (s, q) in [
        (a_s.len(), qas),
        (a_z.len(), qaz),
        (b_s.len(), qbs),
        (b_z.len(), qbz),
    ] {
        check_len(s, q.numel)?;
    }
    let (Some(&ys), Some(&yz)) = (y_s.first(), y_z.first()) else {
        return Err(len_err(1, 0));
    };
    let (ys, yz) = (ys.f32(), yz.get());
    let (m, k, n) = (g.m, g.k, g.n);
    let y = io.output_slice::<Y>(0)?;
    let strides = [g.sa, g.sb, qas.batch, qaz.batch, qbs.batch, qbz.batch];
    // Exact, wrapping by name only, under the sizes `mm_geom` and
    // `line_param` checked: bi < numel(batch) with numel(batch)·m·n the
    // output's count, i < m and j < n, a parameter offset under its numel.
    for (bi, [oa, ob, pas, paz, pbs, pbz]) in StridedIter::new(&g.batch, strides).enumerate() {
        let av = win(a, oa, g.mk).ok_or(len_err(oa.saturating_add(g.mk), a.len()))?;
        let bv = win(b, ob, g.kn).ok_or(len_err(ob.saturating_add(g.kn), b.len()))?;
        let yv = win_mut(y, bi.wrapping_mul(g.mn), g.mn)
            .ok_or(len_err(bi.wrapping_add(1).wrapping_mul(g.mn), 0))?;
        for i in 0..m {
            let sa = a_s
                .get(pas.wrapping_add(i.wrapping_mul(qas.line)))
                .ok_or(Error::internal("a_scale"))?
                .f32();
            let za = a_z
                .get(paz.wrapping_add(i.wrapping_mul(qaz.line)))
                .ok_or(Error::internal("a_zero_point"))?
                .get();
            let arow = win(av, i.wrapping_mul(k), k).ok_or(Error::internal("QLinearMatMul row"))?;
            let yrow =
                win_mut(yv, i.wrapping_mul(n), n).ok_or(Error::internal("QLinearMatMul row"))?;
            for (j, yo) in yrow.iter_mut().enumerate() {
                let sb = b_s
                    .get(pbs.wrapping_add(j.wrapping_mul(qbs.line)))
                    .ok_or(Error::internal("b_scale"))?
                    .f32();
                let zb = b_z
                    .get(pbz.wrapping_add(j.wrapping_mul(qbz.line)))
                    .ok_or(Error::internal("b_zero_point"))?
                    .get();
                let acc = dot_int(arow, za, bv, j, n, zb)?;
                *yo = requant(acc, multiplier::<S>(sa, sb, ys), yz);
            }
        }
    }
    Ok(())
}

/// MatMulInteger: the geometry and where the optional zero points are.
#[derive(Clone, Debug)]
struct MmiParams {
    g: MmGeom,
    az: Option<LineParam>,
    bz: Option<LineParam>,
}

fn prepare_matmul_integer(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let a = ctx.input(0)?;
    let b = ctx.input(1)?;
    util::dtype_in(a.dtype, &[DType::I8, DType::U8], "MatMulInteger A")?;
    util::dtype_in(b.dtype, &[DType::I8, DType::U8], "MatMulInteger B")?;
    let g = mm_geom(a.shape, b.shape)?;
    let az = match ctx.opt_input(2) {
        Some(z) => {
            ctx.input_of(2, a.dtype)?;
            Some(line_param(z.shape, &g.a_batch, &g.batch, g.m, true)?)
        }
        None => None,
    };
    let bz = match ctx.opt_input(3) {
        Some(z) => {
            ctx.input_of(3, b.dtype)?;
            Some(line_param(z.shape, &g.b_batch, &g.batch, g.n, false)?)
        }
        None => None,
    };
    let p = MmiParams { g, az, bz };
    with_qint!(a.dtype, "MatMulInteger A", A => {
        with_qint!(b.dtype, "MatMulInteger B", B => Ok(build_mmi::<A, B>(p)))
    })
}

fn build_mmi<A: QInt, B: QInt>(p: MmiParams) -> Prepared {
    let shape = p.g.out_shape.clone();
    Prepared::single(
        DType::I32,
        &shape,
        kernel("MatMulInteger", move |io| mmi_run::<A, B>(io, &p)),
    )
}

fn mmi_run<A: QInt, B: QInt>(io: &mut KernelIo<'_>, p: &MmiParams) -> Result<()> {
    let g = &p.g;
    let a = io.input_slice::<A>(0)?;
    let b = io.input_slice::<B>(1)?;
    // An absent zero point is 0: one shared element of value 0.
    let none = LineParam {
        batch: [0; MAX_RANK],
        line: 0,
        numel: 1,
    };
    let (qa, qb) = (p.az.unwrap_or(none), p.bz.unwrap_or(none));
    let a_z = match p.az {
        Some(q) => {
            let z = io.input_slice::<A>(2)?;
            check_len(z.len(), q.numel)?;
            Some(z)
        }
        None => None,
    };
    let b_z = match p.bz {
        Some(q) => {
            let z = io.input_slice::<B>(3)?;
            check_len(z.len(), q.numel)?;
            Some(z)
        }
        None => None,
    };
    let (m, k, n) = (g.m, g.k, g.n);
    let y = io.output_slice::<i32>(0)?;
    let strides = [g.sa, g.sb, qa.batch, qb.batch];
    // Offsets exact under the sizes checked at prepare, as in `qmm_run`.
    for (bi, [oa, ob, pa, pb]) in StridedIter::new(&g.batch, strides).enumerate() {
        let av = win(a, oa, g.mk).ok_or(len_err(oa.saturating_add(g.mk), a.len()))?;
        let bv = win(b, ob, g.kn).ok_or(len_err(ob.saturating_add(g.kn), b.len()))?;
        let yv = win_mut(y, bi.wrapping_mul(g.mn), g.mn)
            .ok_or(len_err(bi.wrapping_add(1).wrapping_mul(g.mn), 0))?;
        for i in 0..m {
            // An absent zero point is 0.
            let za = match a_z {
                Some(z) => z
                    .get(pa.wrapping_add(i.wrapping_mul(qa.line)))
                    .ok_or(Error::internal("a_zero_point"))?
                    .get(),
                None => 0,
            };
            let arow = win(av, i.wrapping_mul(k), k).ok_or(Error::internal("MatMulInteger row"))?;
            let yrow =
                win_mut(yv, i.wrapping_mul(n), n).ok_or(Error::internal("MatMulInteger row"))?;
            for (j, yo) in yrow.iter_mut().enumerate() {
                let zb = match b_z {
                    Some(z) => z
                        .get(pb.wrapping_add(j.wrapping_mul(qb.line)))
                        .ok_or(Error::internal("b_zero_point"))?
                        .get(),
                    None => 0,
                };
                *yo = dot_int(arow, za, bv, j, n, zb)?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Convolutions
// ---------------------------------------------------------------------------

/// Validates X (input `xi`) and W (input `wi`), group and kernel_shape;
/// returns the geometry and the output shape.
pub(crate) fn int_conv_geom(
    ctx: &PrepareCtx<'_>,
    xi: usize,
    wi: usize,
) -> Result<(IntConv, Vec<usize>)> {
    let x = ctx.input(xi)?;
    let w = ctx.input(wi)?;
    if x.shape.len() < 3 {
        return Err(Error::new(ErrorKind::Rank {
            expected: 3,
            got: x.shape.len(),
        }));
    }
    if w.shape.len() != x.shape.len() {
        return Err(Error::new(ErrorKind::Rank {
            expected: x.shape.len(),
            got: w.shape.len(),
        }));
    }
    let group = ctx.attr_int("group", 1)?;
    if group < 1 {
        return Err(Error::new(ErrorKind::Attribute {
            name: "group",
            problem: "must be positive",
        }));
    }
    let group = group as usize;
    let (&[batch, c, ref xsp @ ..], &[m, wc, ref wk @ ..]) = (x.shape, w.shape) else {
        return Err(Error::internal("conv rank"));
    };
    if let Some(ks) = ctx.attr_ints("kernel_shape")? {
        if ks.len() != wk.len() || ks.iter().zip(wk).any(|(&a, &b)| a < 0 || a as usize != b) {
            return Err(Error::new(ErrorKind::Attribute {
                name: "kernel_shape",
                problem: "differs from the weight shape",
            }));
        }
    }
    if !util::divides(c, group) || !util::divides(m, group) || wc.checked_mul(group) != Some(c) {
        return Err(Error::new(ErrorKind::Attribute {
            name: "group",
            problem: "does not match the channels of X and W",
        }));
    }
    let g = forward_geom(ctx, xsp, wk, false)?;
    let mut out = alloc::vec![batch, m];
    let osp = MAX_SPATIAL
        .checked_sub(xsp.len())
        .and_then(|from| g.out.get(from..))
        .ok_or(Error::internal("conv spatial rank"))?;
    out.extend_from_slice(osp);
    Ok((
        IntConv {
            batch,
            c,
            m,
            group,
            g,
        },
        out,
    ))
}

/// Whether a scale / zero point of W is per output channel (1-D of `m`
/// elements) rather than per tensor (one element).
pub(crate) fn per_channel(shape: &[usize], m: usize, what: &'static str) -> Result<bool> {
    // A shape whose count overflows has more than one element.
    if checked_numel(shape).is_ok_and(|n| n == 1) {
        Ok(false)
    } else if shape == [m] {
        Ok(true)
    } else {
        Err(Error::new(ErrorKind::Shape(what)))
    }
}

pub(crate) fn per_tensor(shape: &[usize], what: &'static str) -> Result<()> {
    // A shape whose count overflows has more than one element.
    if !checked_numel(shape).is_ok_and(|n| n == 1) {
        return Err(Error::new(ErrorKind::Shape(what)));
    }
    Ok(())
}

/// The sizes the integer convolutions index with, checked once at prepare
/// (Overflow): every offset in [`conv_each`] and [`conv_acc`] stays under
/// one of them.
fn conv_sizes(p: &IntConv) -> Result<ConvSizes> {
    conv::conv_sizes(p.batch, p.c, p.m, p.group, &p.g, ConvDir::Forward)
}

/// One spatial axis of a [`Geom`]: stride, dilation, padding at the
/// beginning and input size.
#[derive(Clone, Copy, Debug)]
struct Axis {
    s: usize,
    d: usize,
    pb: usize,
    inp: usize,
}

/// The three spatial axes of `g`.
#[inline]
fn axes(g: &Geom) -> [Axis; 3] {
    let ([s0, s1, s2], [d0, d1, d2]) = (g.s, g.d);
    let ([pb0, pb1, pb2], [i0, i1, i2]) = (g.pb, g.inp);
    [
        Axis {
            s: s0,
            d: d0,
            pb: pb0,
            inp: i0,
        },
        Axis {
            s: s1,
            d: d1,
            pb: pb1,
            inp: i1,
        },
        Axis {
            s: s2,
            d: d2,
            pb: pb2,
            inp: i2,
        },
    ]
}

/// Input coordinate of output position `o` and kernel tap `t` on spatial
/// axis `a`; `None` inside the padding.
#[inline]
fn tap(a: Axis, o: usize, t: usize) -> Option<usize> {
    // o < out and t < k: o·s + t·d is under the reach `conv_sizes` checked.
    let at = o.wrapping_mul(a.s).wrapping_add(t.wrapping_mul(a.d));
    at.checked_sub(a.pb).filter(|&i| i < a.inp)
}

/// `sum (x - xz) * (w - wz)` over the receptive field of output position
/// `o` (three spatial axes), `xg` being the group's `cg` input planes and
/// `wk` the output channel's `cg` kernels. Wraps in i32. `sz` are `g`'s
/// sizes ([`conv_sizes`]).
fn conv_acc<X: QInt, W: QInt>(
    xg: &[X],
    xz: i32,
    wk: &[W],
    wz: i32,
    g: &Geom,
    sz: &ConvSizes,
    o: [usize; 3],
) -> Result<i32> {
    let (in_sz, k_sz) = (sz.in_sz, sz.k_sz);
    let [_, k1, k2] = g.k;
    let [_, in1, in2] = g.inp;
    let [o0, o1, o2] = o;
    let [a0, a1, a2] = axes(g);
    if in_sz == 0 || k_sz == 0 {
        return Err(Error::internal("conv_acc on an empty plane"));
    }
    // Offsets in a plane are under in_sz, and k1·k2 under k_sz (checked
    // by `conv_sizes`): exact, wrapping by name only.
    let mut acc = 0i32;
    for (xp, wp) in xg.chunks_of(in_sz).zip(wk.chunks_of(k_sz)) {
        // k_sz > 0: k1 and k2 are too.
        for (kd, wd) in wp.chunks_of(k1.wrapping_mul(k2)).enumerate() {
            let Some(id) = tap(a0, o0, kd) else {
                continue;
            };
            for (kh, wr) in wd.chunks_of(k2).enumerate() {
                let Some(ih) = tap(a1, o1, kh) else {
                    continue;
                };
                // The input row (id, ih): `tap` keeps `iw` inside it.
                let at = id.wrapping_mul(in1).wrapping_add(ih).wrapping_mul(in2);
                let xr = win(xp, at, in2).ok_or(Error::internal("conv input row"))?;
                for (kw, &w) in wr.iter().enumerate() {
                    let Some(&x) = tap(a2, o2, kw).and_then(|iw| xr.get(iw)) else {
                        continue;
                    };
                    // 8-bit values less their 8-bit zero points: at most
                    // 255 in magnitude, the product exact in i32; the sum
                    // wraps like numpy's int32.
                    let xv = x.get().wrapping_sub(xz);
                    let wv = w.get().wrapping_sub(wz);
                    acc = acc.wrapping_add(xv.wrapping_mul(wv));
                }
            }
        }
    }
    Ok(acc)
}

/// Runs the integer convolution, handing each output element's flat index,
/// output channel and accumulator to `put`. `wz(oc)` is W's zero point for
/// output channel `oc`; `sz` are `p`'s sizes ([`conv_sizes`]).
fn conv_each<X: QInt, W: QInt>(
    x: &[X],
    xz: i32,
    w: &[W],
    wz: impl Fn(usize) -> Result<i32>,
    p: &IntConv,
    sz: &ConvSizes,
    mut put: impl FnMut(usize, usize, i32) -> Result<()>,
) -> Result<()> {
    let g = &p.g;
    let (in_sz, out_sz, k_sz) = (sz.in_sz, sz.out_sz, sz.k_sz);
    check_len(x.len(), sz.x)?;
    check_len(w.len(), sz.w)?;
    if in_sz == 0 || k_sz == 0 {
        // No input elements: every accumulator is an empty sum.
        let (planes, chans) = (nonzero(out_sz), nonzero(p.m));
        for i in 0..sz.y {
            put(i, (i / planes) % chans, 0)?;
        }
        return Ok(());
    }
    let [o0, o1, o2] = g.out;
    // Exact, wrapping by name only: ni < batch, oc < m, grp < group with
    // grp·cg + cg <= c, and (od, oh, ow) < out, so the group's planes end
    // within batch·c·in_sz = x.len(), the kernels within m·cg·k_sz =
    // w.len() and the output index stays under batch·m·out_sz (all
    // checked by `conv_sizes`).
    for ni in 0..p.batch {
        for oc in 0..p.m {
            let grp = util::div(oc, sz.mg, "QLinearConv: group")?;
            let xa = ni
                .wrapping_mul(p.c)
                .wrapping_add(grp.wrapping_mul(sz.cg))
                .wrapping_mul(in_sz);
            let xg = win(x, xa, sz.xg).ok_or(Error::internal("conv input group"))?;
            let wk =
                win(w, oc.wrapping_mul(sz.wk), sz.wk).ok_or(Error::internal("conv weights"))?;
            let z = wz(oc)?;
            let base = ni.wrapping_mul(p.m).wrapping_add(oc).wrapping_mul(out_sz);
            for od in 0..o0 {
                for oh in 0..o1 {
                    let row = od.wrapping_mul(o1).wrapping_add(oh).wrapping_mul(o2);
                    for ow in 0..o2 {
                        let acc = conv_acc(xg, xz, wk, z, g, sz, [od, oh, ow])?;
                        put(base.wrapping_add(row).wrapping_add(ow), oc, acc)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// `d` as a divisor, 1 for 0 (for the `.max(1)` of an empty dimension).
#[inline]
fn nonzero(d: usize) -> NonZeroUsize {
    NonZeroUsize::new(d).unwrap_or(NonZeroUsize::MIN)
}

/// ConvInteger: geometry and whether each zero point is present / per
/// output channel.
#[derive(Clone, Copy, Debug)]
struct ConvIntParams {
    p: IntConv,
    sz: ConvSizes,
    has_xz: bool,
    /// `None`: no w zero point; `Some(per_channel)`.
    wz: Option<bool>,
}

fn prepare_conv_integer(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let w = ctx.input(1)?;
    util::dtype_in(x.dtype, &[DType::I8, DType::U8], "ConvInteger x")?;
    util::dtype_in(w.dtype, &[DType::I8, DType::U8], "ConvInteger w")?;
    let (p, shape) = int_conv_geom(ctx, 0, 1)?;
    let has_xz = match ctx.opt_input(2) {
        Some(z) => {
            ctx.input_of(2, x.dtype)?;
            per_tensor(z.shape, "ConvInteger x_zero_point must be a scalar")?;
            true
        }
        None => false,
    };
    let wz = match ctx.opt_input(3) {
        Some(z) => {
            ctx.input_of(3, w.dtype)?;
            Some(per_channel(
                z.shape,
                p.m,
                "ConvInteger w_zero_point must be a scalar or have M elements",
            )?)
        }
        None => None,
    };
    let cp = ConvIntParams {
        p,
        sz: conv_sizes(&p)?,
        has_xz,
        wz,
    };
    with_qint!(x.dtype, "ConvInteger x", X => {
        with_qint!(w.dtype, "ConvInteger w", W => Ok(Prepared::single(
            DType::I32,
            &shape,
            kernel("ConvInteger", move |io| conv_integer_run::<X, W>(io, &cp)),
        )))
    })
}

fn conv_integer_run<X: QInt, W: QInt>(io: &mut KernelIo<'_>, cp: &ConvIntParams) -> Result<()> {
    let x = io.input_slice::<X>(0)?;
    let w = io.input_slice::<W>(1)?;
    let xz = if cp.has_xz {
        let z = io.input_slice::<X>(2)?;
        z.first().ok_or(len_err(1, 0))?.get()
    } else {
        0
    };
    let w_z: &[W] = match cp.wz {
        Some(pc) => {
            let z = io.input_slice::<W>(3)?;
            check_len(z.len(), if pc { cp.p.m } else { 1 })?;
            z
        }
        None => &[],
    };
    let per_ch = cp.wz == Some(true);
    // An absent zero point is 0.
    let wz = |oc: usize| match w_z.first() {
        None => Ok(0),
        Some(z0) if !per_ch => Ok(z0.get()),
        Some(_) => Ok(w_z.get(oc).ok_or(Error::internal("w_zero_point"))?.get()),
    };
    let y = io.output_slice::<i32>(0)?;
    check_len(y.len(), cp.sz.y)?;
    conv_each(x, xz, w, wz, &cp.p, &cp.sz, |i, _, acc| {
        *y.get_mut(i).ok_or(Error::internal("ConvInteger output"))? = acc;
        Ok(())
    })
}

/// QLinearConv: geometry, whether W's scale / zero point are per channel,
/// whether the bias is present.
#[derive(Clone, Copy, Debug)]
struct QConvParams {
    p: IntConv,
    sz: ConvSizes,
    ws_pc: bool,
    wz_pc: bool,
    has_bias: bool,
}

fn prepare_qlinear_conv(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let w = ctx.input(3)?;
    util::dtype_in(x.dtype, &[DType::I8, DType::U8], "QLinearConv x")?;
    util::dtype_in(w.dtype, &[DType::I8, DType::U8], "QLinearConv w")?;
    let (p, shape) = int_conv_geom(ctx, 0, 3)?;
    let xs = ctx.input_of(1, DType::F32)?;
    let xz = ctx.input_of(2, x.dtype)?;
    let ws = ctx.input_of(4, DType::F32)?;
    let wz = ctx.input_of(5, w.dtype)?;
    let ys = ctx.input_of(6, DType::F32)?;
    let yz = ctx.input(7)?;
    util::dtype_in(yz.dtype, &[DType::I8, DType::U8], "QLinearConv y")?;
    per_tensor(xs.shape, "QLinearConv x_scale must be a scalar")?;
    per_tensor(xz.shape, "QLinearConv x_zero_point must be a scalar")?;
    per_tensor(ys.shape, "QLinearConv y_scale must be a scalar")?;
    per_tensor(yz.shape, "QLinearConv y_zero_point must be a scalar")?;
    let ws_pc = per_channel(ws.shape, p.m, "QLinearConv w_scale: scalar or M elements")?;
    let wz_pc = per_channel(
        wz.shape,
        p.m,
        "QLinearConv w_zero_point: scalar or M elements",
    )?;
    let has_bias = match ctx.opt_input(8) {
        Some(b) => {
            ctx.input_of(8, DType::I32)?;
            if b.shape != [p.m] {
                return Err(shape_err("QLinearConv B must be 1-D with M elements"));
            }
            true
        }
        None => false,
    };
    if let Some(fast) = super::qdq::qlinear_conv(ctx)? {
        return Ok(fast);
    }
    let qp = QConvParams {
        p,
        sz: conv_sizes(&p)?,
        ws_pc,
        wz_pc,
        has_bias,
    };
    with_qint!(x.dtype, "QLinearConv x", X => {
        with_qint!(w.dtype, "QLinearConv w", W => {
            with_qint!(yz.dtype, "QLinearConv y", Y => Ok(Prepared::single(
                Y::DTYPE,
                &shape,
                kernel("QLinearConv", move |io| qconv_run::<X, W, Y>(io, &qp)),
            )))
        })
    })
}

fn qconv_run<X: QInt, W: QInt, Y: QInt>(io: &mut KernelIo<'_>, qp: &QConvParams) -> Result<()> {
    let m = qp.p.m;
    let first = |s: &[f32]| s.first().copied().ok_or(len_err(1, 0));
    let x = io.input_slice::<X>(0)?;
    let xs = first(io.input_slice::<f32>(1)?)?;
    let xz = io.input_slice::<X>(2)?.first().ok_or(len_err(1, 0))?.get();
    let w = io.input_slice::<W>(3)?;
    let ws = io.input_slice::<f32>(4)?;
    let wz = io.input_slice::<W>(5)?;
    let ys = first(io.input_slice::<f32>(6)?)?;
    let yz = io.input_slice::<Y>(7)?.first().ok_or(len_err(1, 0))?.get();
    check_len(ws.len(), if qp.ws_pc { m } else { 1 })?;
    check_len(wz.len(), if qp.wz_pc { m } else { 1 })?;
    let bias: &[i32] = if qp.has_bias {
        let b = io.input_slice::<i32>(8)?;
        check_len(b.len(), m)?;
        b
    } else {
        &[]
    };
    let (ws_pc, wz_pc) = (qp.ws_pc, qp.wz_pc);
    let y = io.output_slice::<Y>(0)?;
    check_len(y.len(), qp.sz.y)?;
    let wzf = |oc: usize| {
        let z = wz.get(if wz_pc { oc } else { 0 });
        Ok(z.ok_or(Error::internal("w_zero_point"))?.get())
    };
    conv_each(x, xz, w, wzf, &qp.p, &qp.sz, |i, oc, acc| {
        // The bias is already in the accumulator's scale (x_scale * w_scale);
        // an absent bias (empty) adds 0.
        let acc = acc.wrapping_add(bias.get(oc).copied().unwrap_or(0));
        let &wsc = ws
            .get(if ws_pc { oc } else { 0 })
            .ok_or(Error::internal("w_scale"))?;
        let mult = multiplier::<f32>(xs, wsc, ys);
        *y.get_mut(i).ok_or(Error::internal("QLinearConv output"))? = requant(acc, mult, yz);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use crate::model::AttrValue;
    use crate::ops::testing::{run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;
    use half::f16;

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    #[test]
    fn qlinear_matmul_onnx_example_uint8() {
        // The ONNX spec's example (test_qlinearmatmul_2D_uint8_float32).
        let a = t(&[2, 4], &[208u8, 236, 0, 238, 3, 214, 255, 29]);
        let b = t(
            &[4, 3],
            &[152u8, 51, 244, 60, 26, 255, 0, 127, 246, 127, 254, 247],
        );
        let ins = [
            a,
            t(&[1], &[0.0066f32]),
            t(&[1], &[113u8]),
            b,
            t(&[1], &[0.00705f32]),
            t(&[1], &[114u8]),
            t(&[1], &[0.0107f32]),
            t(&[1], &[118u8]),
        ];
        let y = run("QLinearMatMul", 10, vec![], &ins, 1).unwrap();
        assert_eq!(y[0].shape, vec![2, 3]);
        assert_eq!(vals::<u8>(&y[0]), vec![168, 115, 255, 1, 66, 151]);
    }

    /// A = [[3,5],[7,9]] with per-row zero points [1,3] -> [[2,4],[4,6]];
    /// B = [[1,2],[3,4]] with per-column zero points [1,0] -> [[0,2],[2,4]];
    /// A'B' = [[8,20],[12,32]]. Scales a [0.5,1], b [0.25,0.5] give the
    /// multipliers [[1/8,1/4],[1/4,1/2]] / y_scale.
    fn per_line_inputs(
        az_shape: &[usize],
        bz_shape: &[usize],
        ys: f32,
        yz: Option<i8>,
    ) -> Vec<Option<crate::model::Const>> {
        vec![
            t(&[2, 2], &[3u8, 5, 7, 9]),
            t(az_shape, &[0.5f32, 1.0]),
            t(az_shape, &[1u8, 3]),
            t(&[2, 2], &[1u8, 2, 3, 4]),
            t(bz_shape, &[0.25f32, 0.5]),
            t(bz_shape, &[1u8, 0]),
            t(&[], &[ys]),
            match yz {
                Some(z) => t(&[], &[z]),
                None => t(&[], &[10u8]),
            },
        ]
    }

    #[test]
    fn qlinear_matmul_per_row_and_column_ties_to_even() {
        // y_scale 2: C * mult = [[0.5, 2.5], [1.5, 8]]; + 10 then half to
        // even: 10.5 -> 10, 12.5 -> 12, 11.5 -> 12, 18.
        for (az, bz) in [(&[2][..], &[2][..]), (&[2, 1][..], &[1, 2][..])] {
            let y = run(
                "QLinearMatMul",
                21,
                vec![],
                &per_line_inputs(az, bz, 2.0, None),
                1,
            )
            .unwrap();
            assert_eq!(vals::<u8>(&y[0]), vec![10, 12, 12, 18], "{az:?} {bz:?}");
        }
        // int8 output saturates: y_scale 1/8 gives [[8,40],[24,128]] + 100.
        let y = run(
            "QLinearMatMul",
            10,
            vec![],
            &per_line_inputs(&[2], &[2], 0.125, Some(100)),
            1,
        )
        .unwrap();
        assert_eq!(vals::<i8>(&y[0]), vec![108, 127, 124, 127]);
    }

    #[test]
    fn qlinear_matmul_int8_batched_f16_scales() {
        // int8 x int8, batch of 2 broadcast from A [2,1,2] against B [2,1].
        // A'(zp -1) = [[2,3]], [[-1,0]]; B'(zp 2) = [[-3],[1]].
        // Products: 2*-3 + 3 = -3; -1*-3 + 0 = 3. mult = 0.5*1/0.25 = 2 (exact
        // in f16), y_zp -5 -> -11, 1.
        let ins = [
            t(&[2, 1, 2], &[1i8, 2, -2, -1]),
            t(&[], &[f16::from_f32(0.5)]),
            t(&[], &[-1i8]),
            t(&[2, 1], &[-1i8, 3]),
            t(&[], &[f16::from_f32(1.0)]),
            t(&[], &[2i8]),
            t(&[], &[f16::from_f32(0.25)]),
            t(&[], &[-5i8]),
        ];
        let y = run("QLinearMatMul", 21, vec![], &ins, 1).unwrap();
        assert_eq!(y[0].shape, vec![2, 1, 1]);
        assert_eq!(vals::<i8>(&y[0]), vec![-11, 1]);
        // f16 scales are not allowed before opset 21.
        assert!(run("QLinearMatMul", 10, vec![], &ins, 1).is_err());
    }

    #[test]
    fn qlinear_matmul_f16_multiplier_rounds_like_numpy() {
        // numpy computes a_scale * b_scale / y_scale in f16: with these
        // (exact f16) scales the multiplier is 3.482 in f16 but 3.4837 in
        // f32, so acc 30 gives rint(104.47) = 104 where f32 would give 105.
        let s = |v: f32| t(&[], &[f16::from_f32(v)]);
        let ins = [
            t(&[1, 1], &[30u8]),
            s(0.641_113_3),
            t(&[], &[0u8]),
            t(&[1, 1], &[1u8]),
            s(0.277_099_6),
            t(&[], &[0u8]),
            s(0.050_994_873),
            t(&[], &[0u8]),
        ];
        let y = run("QLinearMatMul", 21, vec![], &ins, 1).unwrap();
        assert_eq!(vals::<u8>(&y[0]), vec![104]);
    }

    #[test]
    fn qlinear_matmul_rejects_bad_params() {
        let mut ins = per_line_inputs(&[2], &[2], 1.0, None);
        ins[1] = t(&[3], &[1.0f32, 1.0, 1.0]);
        assert!(run("QLinearMatMul", 10, vec![], &ins, 1).is_err());
        let mut ins = per_line_inputs(&[2], &[2], 1.0, None);
        ins[6] = t(&[2], &[1.0f32, 1.0]);
        assert!(run("QLinearMatMul", 10, vec![], &ins, 1).is_err());
    }

    #[test]
    fn matmul_integer_onnx_example_and_per_row() {
        // ONNX example: A - 12 row 0 = [-1,-5,-9]; . [1,2,3] = -38,
        // . [4,5,6] = -83.
        let a = t(&[4, 3], &[11u8, 7, 3, 10, 6, 2, 9, 5, 1, 8, 4, 0]);
        let b = t(&[3, 2], &[1u8, 4, 2, 5, 3, 6]);
        let y = run(
            "MatMulInteger",
            10,
            vec![],
            &[a, b, t(&[1], &[12u8]), t(&[1], &[0u8])],
            1,
        )
        .unwrap();
        assert_eq!(y[0].shape, vec![4, 2]);
        assert_eq!(
            vals::<i32>(&y[0]),
            vec![-38, -83, -44, -98, -50, -113, -56, -128]
        );
        // int8 A with per-row zero points [1,-1]: A' = [[-2,1],[4,-3]];
        // uint8 B, no zero point: [[10,20],[30,40]].
        let a = t(&[2, 2], &[-1i8, 2, 3, -4]);
        let b = t(&[2, 2], &[10u8, 20, 30, 40]);
        let y = run(
            "MatMulInteger",
            10,
            vec![],
            &[a.clone(), b.clone(), t(&[2], &[1i8, -1])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&y[0]), vec![10, 0, -50, -40]);
        // Per-column B zero point [10, 0]: B' = [[0,20],[20,40]], A'' = A.
        let y = run(
            "MatMulInteger",
            10,
            vec![],
            &[a, b, None, t(&[2], &[10u8, 0])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&y[0]), vec![40, 60, -80, -100]);
    }

    #[test]
    fn conv_integer_onnx_examples() {
        // x - 1 = 1..9 as a 3x3 plane; a 2x2 kernel of ones sums windows.
        let x = t(&[1, 1, 3, 3], &[2u8, 3, 4, 5, 6, 7, 8, 9, 10]);
        let w = t(&[1, 1, 2, 2], &[1u8; 4]);
        let y = run(
            "ConvInteger",
            10,
            vec![],
            &[x.clone(), w, t(&[], &[1u8])],
            1,
        )
        .unwrap();
        assert_eq!(y[0].shape, vec![1, 1, 2, 2]);
        assert_eq!(vals::<i32>(&y[0]), vec![12, 16, 24, 28]);
        // Padding 1 and per-channel w zero points [0, 1]: channel 1 is all
        // zero; channel 0 corners see one element, e.g. (0,0) -> x'(0,0) = 1.
        let w = t(&[2, 1, 2, 2], &[1u8; 8]);
        let y = run(
            "ConvInteger",
            10,
            vec![("pads", ints(&[1, 1, 1, 1]))],
            &[x, w, t(&[], &[1u8]), t(&[2], &[0u8, 1])],
            1,
        )
        .unwrap();
        assert_eq!(y[0].shape, vec![1, 2, 4, 4]);
        let mut want = vec![1, 3, 5, 3, 5, 12, 16, 9, 11, 24, 28, 15, 7, 15, 17, 9];
        want.extend([0; 16]);
        assert_eq!(vals::<i32>(&y[0]), want);
    }

    #[test]
    fn conv_integer_groups_strides_1d_int8() {
        // Two groups, stride 2. ch0 [1,2,3,4] * [1,-1] -> [-1,-1];
        // ch1 [-1,-2,-3,-4] * [2,1] -> [-4,-10].
        let x = t(&[1, 2, 4], &[1i8, 2, 3, 4, -1, -2, -3, -4]);
        let w = t(&[2, 1, 2], &[1i8, -1, 2, 1]);
        let y = run(
            "ConvInteger",
            10,
            vec![("group", AttrValue::Int(2)), ("strides", ints(&[2]))],
            &[x, w],
            1,
        )
        .unwrap();
        assert_eq!(y[0].shape, vec![1, 2, 2]);
        assert_eq!(vals::<i32>(&y[0]), vec![-1, -1, -4, -10]);
    }

    #[test]
    fn qlinear_conv_per_channel_with_bias() {
        // x' = [0,10,20,30]; w' = [2, -1-1] = [2,-2]; bias [1,-3].
        // ch0: [1,21,41,61] * (0.5*0.25/0.25 = 0.5) + 128 = 128.5, 138.5,
        //      148.5, 158.5 -> half to even 128, 138, 148, 158.
        // ch1: [-3,-23,-43,-63] * 1 + 128 = 125, 105, 85, 65.
        let ins = [
            t(&[1, 1, 2, 2], &[10u8, 20, 30, 40]),
            t(&[], &[0.5f32]),
            t(&[], &[10u8]),
            t(&[2, 1, 1, 1], &[2i8, -1]),
            t(&[2], &[0.25f32, 0.5]),
            t(&[2], &[0i8, 1]),
            t(&[], &[0.25f32]),
            t(&[], &[128u8]),
            t(&[2], &[1i32, -3]),
        ];
        let y = run("QLinearConv", 10, vec![], &ins, 1).unwrap();
        assert_eq!(y[0].shape, vec![1, 2, 2, 2]);
        assert_eq!(
            vals::<u8>(&y[0]),
            vec![128, 138, 148, 158, 125, 105, 85, 65]
        );
    }

    #[test]
    fn qlinear_conv_saturates_int8_and_pads_with_zero_point() {
        // 1x1 input 5 (zp 3 -> 2), 3x3 kernel of 1 with pads 1: only the
        // centre tap sees data: acc 2; mult 100 -> 200 saturates to 127.
        let ins = [
            t(&[1, 1, 1, 1], &[5i8]),
            t(&[], &[10.0f32]),
            t(&[], &[3i8]),
            t(&[1, 1, 3, 3], &[1i8; 9]),
            t(&[], &[1.0f32]),
            t(&[], &[0i8]),
            t(&[], &[0.1f32]),
            t(&[], &[0i8]),
        ];
        let y = run(
            "QLinearConv",
            10,
            vec![("pads", ints(&[1, 1, 1, 1]))],
            &ins,
            1,
        )
        .unwrap();
        assert_eq!(vals::<i8>(&y[0]), vec![127]);
    }

    fn dql(x: &[f32]) -> (Vec<u8>, f32, u8) {
        let y = run("DynamicQuantizeLinear", 11, vec![], &[t(&[x.len()], x)], 3).unwrap();
        assert!(y[1].shape.is_empty() && y[2].shape.is_empty());
        (
            vals::<u8>(&y[0]),
            vals::<f32>(&y[1])[0],
            vals::<u8>(&y[2])[0],
        )
    }

    #[test]
    fn dynamic_quantize_linear_ranges() {
        // Range [-1, 3]: scale 4/255; zero point 1/scale = 63.75 -> 64;
        // -63.75 -> -64 + 64 = 0, 0.5 -> 31.875 -> 96, 3 -> 191.25 -> 255.
        let (y, s, z) = dql(&[-1.0, 0.0, 0.5, 3.0]);
        assert_eq!((y, s, z), (vec![0, 64, 96, 255], 4.0f32 / 255.0, 64));
        // Positive only: min is 0, zero point 0; 1 -> 63.75 -> 64.
        let (y, s, z) = dql(&[1.0, 4.0]);
        assert_eq!((y, s, z), (vec![64, 255], 4.0f32 / 255.0, 0));
        // Negative only: max is 0, zero point 255; -1 -> -64 + 255 = 191.
        let (y, _, z) = dql(&[-4.0, -1.0]);
        assert_eq!((y, z), (vec![0, 191], 255));
        // All zero: scale 1/255, zero point 0.
        let (y, s, z) = dql(&[0.0, 0.0]);
        assert_eq!((y, s, z), (vec![0, 0], 1.0f32 / 255.0, 0));
    }
}
