//! Matrix products: Gemm and MatMul, over one shared [`gemm`] (f32, f64,
//! and f16 / bf16 accumulating in f32; f16 B against f32 A for
//! `Model::weights_to_f16`).

// Integer arithmetic (issue 8): the spans an operand must hold are checked
// once (`needed`, `check_gemm`; `Overflow` past usize), and the index
// arithmetic of the loops below them wraps by name under those bounds.
use crate::error::{Error, ErrorKind, Result};
use crate::kern::sgemm::{self, Dense, MatA, Trans};
use crate::ops::activation::Act;
use crate::ops::util::{Acc, Float};
use crate::ops::{kernel, util, KernelIo, OpDef, PrepareCtx, Prepared};
use crate::tensor::ChunksOf as _;
use crate::tensor::{broadcast_shapes, broadcast_strides, StridedIter, MAX_RANK};
use crate::DType;
use alloc::vec::Vec;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("Gemm", 7, prepare_gemm),
    OpDef::domain("com.microsoft", "FusedGemm", 1, prepare_fused_gemm),
    OpDef::onnx("MatMul", 1, prepare_matmul),
    OpDef::onnx("Det", 11, prepare_det),
];

fn len_err(expected: usize, got: usize) -> Error {
    Error::new(ErrorKind::Len {
        expected: expected as u64,
        got: got as u64,
    })
}

/// Minimum slice length holding a `rows x cols` row-major matrix with
/// leading dimension `ld`; `None` past `usize`.
fn needed(rows: usize, cols: usize, ld: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        Some(0)
    } else {
        rows.wrapping_sub(1).checked_mul(ld)?.checked_add(cols)
    }
}

/// [`needed`], or `Overflow`.
fn span(rows: usize, cols: usize, ld: usize) -> Result<usize> {
    needed(rows, cols, ld).ok_or(Error::new(ErrorKind::Overflow))
}

/// `C = alpha * op(A) * op(B) + beta * C`, row-major, over f32.
///
/// `op(A)` is `m x k`: `A(i, p)` is `a[i * lda + p]`, or `a[p * lda + i]`
/// when `transa`. `op(B)` is `k x n`: `B(p, j)` is `b[p * ldb + j]`, or
/// `b[j * ldb + p]` when `transb`. `C(i, j)` is `c[i * ldc + j]`. With
/// `beta == 0` C is overwritten (never read). Does not allocate.
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    transa: bool,
    b: &[f32],
    ldb: usize,
    transb: bool,
    c: &mut [f32],
    ldc: usize,
    alpha: f32,
    beta: f32,
) -> Result<()> {
    gemm(m, n, k, a, lda, transa, b, ldb, transb, c, ldc, alpha, beta)
}

/// [`sgemm`] over any [`Float`] operands sharing an accumulator: A and B
/// are widened element by element as they are read (f16 / bf16 to f32), C
/// is the accumulator type, so every product and sum is in f32 (f64 for
/// f64) and the caller rounds once when storing.
#[allow(clippy::too_many_arguments)]
pub fn gemm<A: Float, B: Float<Acc = A::Acc>>(
    m: usize,
    n: usize,
    k: usize,
    a: &[A],
    lda: usize,
    transa: bool,
    b: &[B],
    ldb: usize,
    transb: bool,
    c: &mut [A::Acc],
    ldc: usize,
    alpha: A::Acc,
    beta: A::Acc,
) -> Result<()> {
    check_gemm(
        m,
        n,
        k,
        a.len(),
        lda,
        transa,
        b.len(),
        ldb,
        transb,
        c.len(),
        ldc,
    )?;
    if A::DTYPE == DType::F32 && B::DTYPE == DType::F32 && crate::kern::sgemm::enabled() {
        // f32 operands and accumulator: the blocked kernels (same sums,
        // another rounding order).
        if let (Ok(a), Ok(b), Ok(c)) = (
            bytemuck::try_cast_slice::<A, f32>(a),
            bytemuck::try_cast_slice::<B, f32>(b),
            bytemuck::try_cast_slice_mut::<A::Acc, f32>(c),
        ) {
            let (alpha, beta) = (alpha.to_f32(), beta.to_f32());
            let ma = if transa {
                MatA { a, rs: 1, cs: lda }
            } else {
                MatA { a, rs: lda, cs: 1 }
            };
            let done = if transb && !transa && m < sgemm::MR {
                sgemm::dots(m, n, k, a, lda, b, ldb, c, ldc, alpha, beta)
            } else if transb {
                sgemm::sgemm(m, n, k, ma, &Trans { b, ldb }, c, ldc, alpha, beta)
            } else {
                sgemm::sgemm(m, n, k, ma, &Dense { b, ldb }, c, ldc, alpha, beta)
            };
            if done {
                return Ok(());
            }
        }
    }
    reference_loops(m, n, k, a, lda, transa, b, ldb, transb, c, ldc, alpha, beta)
}

/// Checks that A, B and C hold every element a GEMM of these shapes reads.
#[allow(clippy::too_many_arguments)]
fn check_gemm(
    m: usize,
    n: usize,
    k: usize,
    a_len: usize,
    lda: usize,
    transa: bool,
    b_len: usize,
    ldb: usize,
    transb: bool,
    c_len: usize,
    ldc: usize,
) -> Result<()> {
    let need_a = if transa {
        span(k, m, lda)?
    } else {
        span(m, k, lda)?
    };
    let need_b = if transb {
        span(n, k, ldb)?
    } else {
        span(k, n, ldb)?
    };
    let need_c = span(m, n, ldc)?;
    if a_len < need_a {
        return Err(len_err(need_a, a_len));
    }
    if b_len < need_b {
        return Err(len_err(need_b, b_len));
    }
    if c_len < need_c {
        return Err(len_err(need_c, c_len));
    }
    Ok(())
}

/// The `count` elements `s[0], s[ld], ..., s[(count - 1) * ld]`, their span
/// checked once (`None` if `s` is shorter); a zero `ld` repeats `s[0]`.
fn strided<T>(s: &[T], ld: usize, count: usize) -> Option<impl Iterator<Item = &T> + Clone> {
    let span = s.get(..needed(count, 1, ld)?)?;
    // `step_by` yields the `count` elements of the span (one when `ld` is
    // 0, which `cycle` repeats).
    Some(span.iter().step_by(ld.max(1)).cycle().take(count))
}

/// [`reference_loops`] for the blocked kernels' tests, which pass operands
/// that fit their shapes.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn reference_gemm<A: Float, B: Float<Acc = A::Acc>>(
    m: usize,
    n: usize,
    k: usize,
    a: &[A],
    lda: usize,
    transa: bool,
    b: &[B],
    ldb: usize,
    transb: bool,
    c: &mut [A::Acc],
    ldc: usize,
    alpha: A::Acc,
    beta: A::Acc,
) {
    reference_loops(m, n, k, a, lda, transa, b, ldb, transb, c, ldc, alpha, beta).unwrap();
}

/// The reference loops of [`gemm`] (every target, every float type); the
/// caller has run [`check_gemm`], so an operand shorter than its shape is
/// an internal error.
#[allow(clippy::too_many_arguments)]
fn reference_loops<A: Float, B: Float<Acc = A::Acc>>(
    m: usize,
    n: usize,
    k: usize,
    a: &[A],
    lda: usize,
    transa: bool,
    b: &[B],
    ldb: usize,
    transb: bool,
    c: &mut [A::Acc],
    ldc: usize,
    alpha: A::Acc,
    beta: A::Acc,
) -> Result<()> {
    let short = Error::new(ErrorKind::Internal("gemm: operand shorter than its shape"));
    let zero = <A::Acc as Acc>::ZERO;
    if m == 0 || n == 0 {
        return Ok(());
    }
    // check_gemm has bounded every index below by an operand's length:
    // i * lda + p and p * lda + i < a.len() (i < m, p < k), p * ldb + j and
    // j * ldb + p < b.len(), i * ldc + j < c.len() (j < n); so the index
    // arithmetic wraps by name, and a short operand is an `Err` (`get`).
    let at = |r: usize, ld: usize, col: usize| r.wrapping_mul(ld).wrapping_add(col);
    let c_row = |i: usize| at(i, ldc, 0)..at(i, ldc, n);
    // Scale C by beta.
    for i in 0..m {
        let row = c.get_mut(c_row(i)).ok_or(short)?;
        if beta == zero {
            row.fill(zero);
        } else if beta != <A::Acc as Acc>::ONE {
            for v in row.iter_mut() {
                *v = v.times(beta);
            }
        }
    }
    if k == 0 {
        return Ok(());
    }
    let a_at = |i: usize, p: usize| -> Result<A::Acc> {
        let ix = if transa { at(p, lda, i) } else { at(i, lda, p) };
        a.get(ix).map(|v| v.to_acc()).ok_or(short)
    };
    // k rounded down to a multiple of 4 (a mask: no arithmetic to check).
    let k4 = k & !3;
    if !transb {
        // i-k-j: the inner loop runs contiguously over a row of B and of C.
        let b_row = |p: usize| b.get(at(p, ldb, 0)..at(p, ldb, n)).ok_or(short);
        for i in 0..m {
            let crow = c.get_mut(c_row(i)).ok_or(short)?;
            for p in (0..k4).step_by(4) {
                // p + 3 < k4 <= k.
                let (p1, p2, p3) = (p | 1, p | 2, p | 3);
                let a0 = alpha.times(a_at(i, p)?);
                let a1 = alpha.times(a_at(i, p1)?);
                let a2 = alpha.times(a_at(i, p2)?);
                let a3 = alpha.times(a_at(i, p3)?);
                let (b0, b1, b2, b3) = (b_row(p)?, b_row(p1)?, b_row(p2)?, b_row(p3)?);
                for ((((cv, &x0), &x1), &x2), &x3) in
                    crow.iter_mut().zip(b0).zip(b1).zip(b2).zip(b3)
                {
                    let sum = a0
                        .times(x0.to_acc())
                        .plus(a1.times(x1.to_acc()))
                        .plus(a2.times(x2.to_acc()))
                        .plus(a3.times(x3.to_acc()));
                    *cv = cv.plus(sum);
                }
            }
            for p in k4..k {
                let a0 = alpha.times(a_at(i, p)?);
                let b0 = b_row(p)?;
                for (cv, &x0) in crow.iter_mut().zip(b0) {
                    *cv = cv.plus(a0.times(x0.to_acc()));
                }
            }
        }
    } else if !transa {
        // Both operands contiguous over k: dot products, 4 accumulators.
        for i in 0..m {
            let arow = a.get(at(i, lda, 0)..at(i, lda, k)).ok_or(short)?;
            let crow = c.get_mut(c_row(i)).ok_or(short)?;
            for (j, cv) in crow.iter_mut().enumerate() {
                let brow = b.get(at(j, ldb, 0)..at(j, ldb, k)).ok_or(short)?;
                let mut s = [zero; 4];
                let mut ac = arow.chunks_of(4);
                let mut bc = brow.chunks_of(4);
                for (x, y) in (&mut ac).zip(&mut bc) {
                    for ((sq, xq), yq) in s.iter_mut().zip(x).zip(y) {
                        *sq = sq.plus(xq.to_acc().times(yq.to_acc()));
                    }
                }
                let [s0, s1, s2, s3] = s;
                let mut t = s0.plus(s1).plus(s2.plus(s3));
                for (x, y) in ac.remainder().iter().zip(bc.remainder()) {
                    t = t.plus(x.to_acc().times(y.to_acc()));
                }
                *cv = cv.plus(alpha.times(t));
            }
        }
    } else {
        // A^T B^T: A(i, p) = a[p*lda + i]; keep the dot over k, 4 columns of
        // C at a time.
        let b_row = |j: usize| b.get(at(j, ldb, 0)..at(j, ldb, k)).ok_or(short);
        for i in 0..m {
            let acol = a.get(i..).and_then(|a| strided(a, lda, k)).ok_or(short)?;
            let crow = c.get_mut(c_row(i)).ok_or(short)?;
            let mut quads = crow.chunks_of_mut(4);
            for (j, cq) in (0..).step_by(4).zip(&mut quads) {
                // j + 3 < n: cq is a whole quad of the row.
                let (b0, b1, b2, b3) = (b_row(j)?, b_row(j | 1)?, b_row(j | 2)?, b_row(j | 3)?);
                let (mut s0, mut s1, mut s2, mut s3) = (zero, zero, zero, zero);
                for ((((av, x0), x1), x2), x3) in acol.clone().zip(b0).zip(b1).zip(b2).zip(b3) {
                    let av = av.to_acc();
                    s0 = s0.plus(av.times(x0.to_acc()));
                    s1 = s1.plus(av.times(x1.to_acc()));
                    s2 = s2.plus(av.times(x2.to_acc()));
                    s3 = s3.plus(av.times(x3.to_acc()));
                }
                for (cv, sv) in cq.iter_mut().zip([s0, s1, s2, s3]) {
                    *cv = cv.plus(alpha.times(sv));
                }
            }
            for (j, cv) in ((n & !3)..).zip(quads.into_remainder()) {
                let mut t = zero;
                for (av, x) in acol.clone().zip(b_row(j)?) {
                    t = t.plus(av.to_acc().times(x.to_acc()));
                }
                *cv = cv.plus(alpha.times(t));
            }
        }
    }
    Ok(())
}

/// Geometry of a Gemm-style product `A' · B'` (+ C broadcast to (M, N)).
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmGeom {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Row strides of A and B as stored.
    pub lda: usize,
    pub ldb: usize,
    pub transa: bool,
    pub transb: bool,
    /// Element strides (row, col) into C, when C is given.
    pub c: Option<(usize, usize)>,
}

/// Validates the shapes of a Gemm (rank-2 A and B, `transA` / `transB`
/// attributes, C unidirectionally broadcastable to (M, N)); dtypes are the
/// caller's.
pub(crate) fn gemm_geom(
    ctx: &PrepareCtx<'_>,
    a: &[usize],
    b: &[usize],
    c: Option<&[usize]>,
) -> Result<GemmGeom> {
    let rank2 = |s: &[usize]| match *s {
        [rows, cols] => Ok((rows, cols)),
        _ => Err(Error::new(ErrorKind::Rank {
            expected: 2,
            got: s.len(),
        })),
    };
    let (a0, a1) = rank2(a)?;
    let (b0, b1) = rank2(b)?;
    let transa = ctx.attr_int("transA", 0)? != 0;
    let transb = ctx.attr_int("transB", 0)? != 0;
    let (m, k) = if transa { (a1, a0) } else { (a0, a1) };
    let (kb, n) = if transb { (b1, b0) } else { (b0, b1) };
    if k != kb {
        return Err(Error::new(ErrorKind::Dim {
            axis: if transb { 1 } else { 0 },
            expected: k as u64,
            got: kb as u64,
        }));
    }
    // C: unidirectional broadcast to (M, N); strides (row, col) into C.
    let c = match c {
        None => None,
        Some(cs) => {
            if cs.len() > 2 {
                return Err(Error::new(ErrorKind::Rank {
                    expected: 2,
                    got: cs.len(),
                }));
            }
            let out = [m, n];
            // C's axes line up with the trailing axes of (M, N).
            for (&d, &o) in cs.iter().rev().zip(out.iter().rev()) {
                if d != 1 && d != o {
                    return Err(Error::new(ErrorKind::Shape(
                        "Gemm C does not broadcast to (M, N)",
                    )));
                }
            }
            let [s0, s1, ..] = broadcast_strides(cs, &out);
            Some((s0, s1))
        }
    };
    Ok(GemmGeom {
        m,
        n,
        k,
        lda: a1,
        ldb: b1,
        transa,
        transb,
        c,
    })
}

/// onnxruntime's `com.microsoft.FusedGemm` (f32): Gemm, then the activation
/// named by `activation` (Relu, LeakyRelu with `activation_alpha`, Sigmoid,
/// Tanh, HardSigmoid with `activation_alpha` / `activation_beta`) on each
/// output value. mote's optimizer makes it from Gemm → one of those
/// (`optimize::float`, pass `activation`).
fn prepare_fused_gemm(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    Act::check_f32(ctx, "FusedGemm")?;
    let act = Act::from_gemm_attrs(
        ctx.attr_str("activation", "")?,
        ctx.attr_float("activation_alpha", f32::NAN)?,
        ctx.attr_float("activation_beta", f32::NAN)?,
    )?;
    Ok(act.fuse("FusedGemm", prepare_gemm(ctx)?))
}

fn prepare_gemm(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let a = ctx.input(0)?;
    let b = ctx.input(1)?;
    util::dtype_in(a.dtype, util::FLOATS, "Gemm A")?;
    let dt = a.dtype;
    // B is A's dtype, or f16 against f32 A (`Model::weights_to_f16`).
    let wide_b = dt == DType::F32 && b.dtype == DType::F16;
    if b.dtype != dt && !wide_b {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: dt,
            got: b.dtype,
        }));
    }
    let c = ctx.opt_input(2);
    if let Some(c) = c {
        if c.dtype != dt {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: dt,
                got: c.dtype,
            }));
        }
    }
    let alpha = ctx.attr_float("alpha", 1.0)?;
    let beta = ctx.attr_float("beta", 1.0)?;
    let GemmGeom {
        m,
        n,
        k,
        lda,
        ldb,
        transa,
        transb,
        c: c_strides,
    } = gemm_geom(ctx, a.shape, b.shape, c.map(|c| c.shape))?;
    let mn = m.checked_mul(n).ok_or(Error::new(ErrorKind::Overflow))?;
    // The span of the broadcast C that the kernel reads.
    let c_span = match c_strides {
        Some((s0, s1)) if m != 0 && n != 0 => m
            .wrapping_sub(1)
            .checked_mul(s0)
            .and_then(|r| n.wrapping_sub(1).checked_mul(s1)?.checked_add(r))
            .and_then(|v| v.checked_add(1))
            .ok_or(Error::new(ErrorKind::Overflow))?,
        _ => 0,
    };
    let g = GemmParams {
        m,
        n,
        mn,
        c_span,
        k,
        lda,
        ldb,
        transa,
        transb,
        alpha,
        beta,
        c_strides,
    };
    if wide_b {
        return Ok(Prepared::single(
            dt,
            &[m, n],
            kernel("Gemm", move |io| run_gemm::<f32, half::f16>(io, &g)),
        ));
    }
    util::with_float!(dt, T => {
        let scratch = util::acc_scratch::<T>(mn)?;
        Ok(Prepared::single(dt, &[m, n], kernel("Gemm", move |io| run_gemm::<T, T>(io, &g)))
            .with_scratch(scratch))
    }, other => Err(Error::new(ErrorKind::UnsupportedDType {
        what: "Gemm",
        code: other.onnx_code(),
    })))
}

/// Everything a Gemm kernel needs, fixed in prepare.
#[derive(Clone, Copy, Debug)]
struct GemmParams {
    m: usize,
    n: usize,
    /// `m * n`, checked.
    mn: usize,
    /// Elements of C that the broadcast reads, `(m-1)*s0 + (n-1)*s1 + 1`
    /// (0 without C), checked.
    c_span: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    transa: bool,
    transb: bool,
    alpha: f32,
    beta: f32,
    /// (row, col) strides of the broadcast C, when C is given.
    c_strides: Option<(usize, usize)>,
}

/// Gemm over A, C and Y of `T` and B of `W`.
fn run_gemm<T: Float, W: Float<Acc = T::Acc>>(io: &mut KernelIo<'_>, g: &GemmParams) -> Result<()> {
    let GemmParams {
        m,
        n,
        mn,
        c_span,
        k,
        lda,
        ldb,
        transa,
        transb,
        alpha,
        beta,
        c_strides,
    } = *g;
    let a = io.input_slice::<T>(0)?;
    let b = io.input_slice::<W>(1)?;
    let c = match c_strides {
        Some(s) if beta != 0.0 => Some((io.input_slice::<T>(2)?, s)),
        _ => None,
    };
    let (y, scratch) = io.output_and_scratch(0)?;
    let y = y.into_slice::<T>()?;
    if y.len() < mn {
        return Err(len_err(mn, y.len()));
    }
    let body = |acc: &mut [T::Acc]| -> Result<()> {
        let beta_eff = match c {
            Some((cv, _)) if cv.len() < c_span => return Err(len_err(c_span, cv.len())),
            Some((cv, (s0, s1))) => {
                let beta = T::Acc::from_f32(beta);
                let short = Error::new(ErrorKind::Internal("Gemm: C or scratch too short"));
                // acc holds m rows of n (mn checked in prepare).
                for (i, arow) in acc.chunks_of_mut(n).take(m).enumerate() {
                    // C(i, j) is cv[i * s0 + j * s1] (a zero stride
                    // broadcasts); i * s0 < c_span, checked in prepare.
                    let crow = cv.get(i.wrapping_mul(s0)..).and_then(|r| strided(r, s1, n));
                    let Some(crow) = crow else {
                        return Err(short);
                    };
                    for (o, v) in arow.iter_mut().zip(crow) {
                        *o = beta.times(v.to_acc());
                    }
                }
                <T::Acc as Acc>::ONE
            }
            None => <T::Acc as Acc>::ZERO,
        };
        let alpha = T::Acc::from_f32(alpha);
        gemm(
            m, n, k, a, lda, transa, b, ldb, transb, acc, n, alpha, beta_eff,
        )
    };
    if T::IS_ACC {
        let y = y
            .get_mut(..mn)
            .ok_or(Error::new(ErrorKind::Internal("Gemm output")))?;
        let acc: &mut [T::Acc] = bytemuck::try_cast_slice_mut(y)
            .map_err(|_| Error::new(ErrorKind::Internal("Gemm output")))?;
        body(acc)?;
    } else {
        let acc = util::acc_buf::<T>(scratch, mn)?;
        body(acc)?;
        util::store(y, acc);
    }
    Ok(())
}

fn prepare_matmul(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let a = ctx.input(0)?;
    let b = ctx.input(1)?;
    util::dtype_in(a.dtype, util::FLOATS, "MatMul A")?;
    let dt = a.dtype;
    // B is A's dtype, or f16 against f32 A (`Model::weights_to_f16`).
    let wide_b = dt == DType::F32 && b.dtype == DType::F16;
    if b.dtype != dt && !wide_b {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: dt,
            got: b.dtype,
        }));
    }
    let rank0 = || {
        Err(Error::new(ErrorKind::Shape(
            "MatMul inputs must have rank >= 1",
        )))
    };
    let ra = a.shape.len();
    let rb = b.shape.len();
    let (m, k, a_batch): (usize, usize, &[usize]) = match *a.shape {
        [] => return rank0(),
        [k] => (1, k, &[]),
        [ref batch @ .., m, k] => (m, k, batch),
    };
    let (kb, n, b_batch): (usize, usize, &[usize]) = match *b.shape {
        [] => return rank0(),
        [kb] => (kb, 1, &[]),
        [ref batch @ .., kb, n] => (kb, n, batch),
    };
    if k != kb {
        return Err(Error::new(ErrorKind::Dim {
            axis: rb.saturating_sub(2),
            expected: k as u64,
            got: kb as u64,
        }));
    }
    let mut bs = [0usize; MAX_RANK];
    let br = broadcast_shapes(a_batch, b_batch, &mut bs)?;
    let batch: Vec<usize> = bs
        .get(..br)
        .ok_or(Error::new(ErrorKind::Internal("MatMul: broadcast rank")))?
        .to_vec();
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
    let overflow = || Error::new(ErrorKind::Overflow);
    let (mk, kn, mn) = (
        m.checked_mul(k).ok_or_else(overflow)?,
        k.checked_mul(n).ok_or_else(overflow)?,
        m.checked_mul(n).ok_or_else(overflow)?,
    );
    // Element strides of A's and B's matrices along the batch axes (the
    // last one reached is below the checked element count of A or B).
    let mut sa = broadcast_strides(a_batch, &batch);
    let mut sb = broadcast_strides(b_batch, &batch);
    for (v, size) in sa
        .iter_mut()
        .map(|v| (v, mk))
        .chain(sb.iter_mut().map(|v| (v, kn)))
    {
        *v = v.checked_mul(size).ok_or_else(overflow)?;
    }
    // Y's element count, checked for the kernel's row offsets.
    crate::error::checked_numel(&out_shape)?;
    let p = MatMulParams {
        m,
        n,
        k,
        mk,
        kn,
        mn,
        batch,
        sa,
        sb,
    };
    if wide_b {
        return Ok(Prepared::single(
            dt,
            &out_shape,
            kernel("MatMul", move |io| run_matmul::<f32, half::f16>(io, &p)),
        ));
    }
    // A constant 2-D f32 B is packed once for the blocked kernels (all
    // batch matrices share it) where the build allows packed copies; the
    // kernel falls back to B itself if the reference kernels are selected
    // later.
    let packed = match (dt, rb, b.value) {
        (DType::F32, 2, Some(v)) if sgemm::enabled() && ctx.may_pack() => sgemm::Packed::new(
            &Dense {
                b: v.as_slice::<f32>()?,
                ldb: n,
            },
            k,
            n,
        ),
        _ => None,
    };
    if let Some(pk) = packed {
        let heap = pk.bytes();
        return Ok(Prepared::single(
            dt,
            &out_shape,
            kernel("MatMul", move |io| run_matmul_packed(io, &p, &pk)),
        )
        .with_heap(heap));
    }
    util::with_float!(dt, T => {
        let scratch = util::acc_scratch::<T>(mn)?;
        Ok(Prepared::single(dt, &out_shape, kernel("MatMul", move |io| run_matmul::<T, T>(io, &p)))
            .with_scratch(scratch))
    }, other => Err(Error::new(ErrorKind::UnsupportedDType {
        what: "MatMul",
        code: other.onnx_code(),
    })))
}

/// Shapes and batch strides of a MatMul, fixed in prepare.
#[derive(Debug)]
struct MatMulParams {
    m: usize,
    n: usize,
    k: usize,
    /// `m * k`, `k * n` and `m * n`, checked.
    mk: usize,
    kn: usize,
    mn: usize,
    batch: Vec<usize>,
    sa: [usize; MAX_RANK],
    sb: [usize; MAX_RANK],
}

/// MatMul over A and Y of `T` and B of `W`.
fn run_matmul<T: Float, W: Float<Acc = T::Acc>>(
    io: &mut KernelIo<'_>,
    p: &MatMulParams,
) -> Result<()> {
    let (m, n, k, mk, kn, mn) = (p.m, p.n, p.k, p.mk, p.kn, p.mn);
    let a = io.input_slice::<T>(0)?;
    let b = io.input_slice::<W>(1)?;
    let (y, scratch) = io.output_and_scratch(0)?;
    let y = y.into_slice::<T>()?;
    if mn == 0 {
        return Ok(());
    }
    // `len` elements from `s` of an operand of `have`.
    let window = |s: usize, len: usize, have: usize| {
        let end = s.checked_add(len).ok_or(Error::new(ErrorKind::Overflow))?;
        if end > have {
            return Err(len_err(end, have));
        }
        Ok(s..end)
    };
    // Y is batch matrices of mn elements, one per batch index.
    let mut ys = y.chunks_of_mut(mn);
    for [oa, ob] in StridedIter::new(&p.batch, [p.sa, p.sb]) {
        let av = a
            .get(window(oa, mk, a.len())?)
            .ok_or(len_err(mk, a.len()))?;
        let bv = b
            .get(window(ob, kn, b.len())?)
            .ok_or(len_err(kn, b.len()))?;
        let yv = ys
            .next()
            .ok_or(Error::new(ErrorKind::Internal("MatMul output")))?;
        let one = <T::Acc as Acc>::ONE;
        let zero = <T::Acc as Acc>::ZERO;
        if T::IS_ACC {
            let acc: &mut [T::Acc] = bytemuck::try_cast_slice_mut(yv)
                .map_err(|_| Error::new(ErrorKind::Internal("MatMul output")))?;
            gemm(m, n, k, av, k, false, bv, n, false, acc, n, one, zero)?;
        } else {
            let acc = util::acc_buf::<T>(scratch, mn)?;
            gemm(m, n, k, av, k, false, bv, n, false, acc, n, one, zero)?;
            util::store(yv, acc);
        }
    }
    Ok(())
}

/// f32 MatMul whose 2-D B was packed at prepare ([`sgemm::Packed`]): each
/// batch matrix of A times it on the blocked kernels, the same operations
/// in the same order as with B packed on every run; [`run_matmul`] when
/// the reference kernels are selected.
fn run_matmul_packed(io: &mut KernelIo<'_>, p: &MatMulParams, pk: &sgemm::Packed) -> Result<()> {
    if !sgemm::enabled() {
        return run_matmul::<f32, f32>(io, p);
    }
    let (m, n, k, mk, mn) = (p.m, p.n, p.k, p.mk, p.mn);
    if pk.k() != k || pk.n() != n {
        return Err(Error::new(ErrorKind::Internal("MatMul: packed B shape")));
    }
    let a = io.input_slice::<f32>(0)?;
    let y = io.output_slice::<f32>(0)?;
    if mn == 0 {
        return Ok(());
    }
    let mut ys = y.chunks_of_mut(mn);
    for [oa, _] in StridedIter::new(&p.batch, [p.sa, p.sb]) {
        let av = oa
            .checked_add(mk)
            .and_then(|end| a.get(oa..end))
            .ok_or(len_err(oa.saturating_add(mk), a.len()))?;
        let yv = ys
            .next()
            .ok_or(Error::new(ErrorKind::Internal("MatMul output")))?;
        let ma = MatA {
            a: av,
            rs: k,
            cs: 1,
        };
        if !sgemm::sgemm(m, n, k, ma, pk, yv, n, 1.0, 0.0) {
            return Err(Error::new(ErrorKind::Internal(
                "MatMul: blocked GEMM bounds",
            )));
        }
    }
    Ok(())
}

/// Det: determinant of each `[M, M]` matrix in `[*, M, M]`, by LU with
/// partial pivoting in f64 (scratch holds one matrix); f16 / bf16 / f32
/// round the f64 result back.
fn prepare_det(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let (out, n) = match *x.shape {
        [ref batch @ .., rows, cols] if rows == cols => (batch, cols),
        _ => return Err(Error::new(ErrorKind::Shape("Det input must be [*, M, M]"))),
    };
    let nn = n.checked_mul(n).ok_or(Error::new(ErrorKind::Overflow))?;
    let bytes = nn.checked_mul(8).ok_or(Error::new(ErrorKind::Overflow))?;
    macro_rules! typed {
        ($t:ty, $get:expr, $put:expr) => {
            Prepared::single(
                x.dtype,
                out,
                kernel("Det", move |io| {
                    let xs = io.input_slice::<$t>(0)?;
                    let (y, s) = io.output_and_scratch(0)?;
                    let y = y.into_slice::<$t>()?;
                    let a: &mut [f64] = bytemuck::try_cast_slice_mut(
                        s.get_mut(..bytes)
                            .ok_or(Error::new(ErrorKind::Internal("Det scratch")))?,
                    )
                    .map_err(|_| Error::new(ErrorKind::Internal("scratch alignment")))?;
                    let need = y
                        .len()
                        .checked_mul(nn)
                        .ok_or(Error::new(ErrorKind::Overflow))?;
                    if xs.len() != need {
                        return Err(len_err(need, xs.len()));
                    }
                    // A 0 x 0 matrix has determinant 1 (xs is empty then).
                    let mut xms = xs.chunks_of(nn);
                    for yv in y.iter_mut() {
                        let xm = if nn == 0 {
                            &[][..]
                        } else {
                            xms.next()
                                .ok_or(Error::new(ErrorKind::Internal("Det input")))?
                        };
                        for (d, &v) in a.iter_mut().zip(xm) {
                            *d = $get(v);
                        }
                        *yv = $put(lu_det(a, n)?);
                    }
                    Ok(())
                }),
            )
            .with_scratch(bytes)
        };
    }
    Ok(match x.dtype {
        DType::F32 => typed!(f32, |v: f32| v as f64, |d: f64| d as f32),
        DType::F64 => typed!(f64, |v: f64| v, |d: f64| d),
        DType::F16 => typed!(half::f16, half::f16::to_f64, half::f16::from_f64),
        DType::BF16 => typed!(half::bf16, half::bf16::to_f64, half::bf16::from_f64),
        dt => {
            return Err(Error::new(ErrorKind::UnsupportedDType {
                what: "Det",
                code: dt.onnx_code(),
            }))
        }
    })
}

/// Determinant of the row-major `n x n` matrix `a` (destroyed).
fn lu_det(a: &mut [f64], n: usize) -> Result<f64> {
    let short = Error::new(ErrorKind::Internal("Det: scratch shorter than n x n"));
    let nn = n.checked_mul(n).ok_or(Error::new(ErrorKind::Overflow))?;
    let a = a.get_mut(..nn).ok_or(short)?;
    // Row r starts at r * n; every index below is under n * n (r, c < n).
    let row_at = |r: usize| r.wrapping_mul(n);
    let mut det = 1.0f64;
    for c in 0..n {
        // c < n: c + 1 <= n.
        let c1 = c.wrapping_add(1);
        // Largest pivot keeps the elimination stable.
        let mut p = c;
        let mut piv = *a.get(row_at(c).wrapping_add(c)).ok_or(short)?;
        for (i, row) in a.chunks_of(n).enumerate().skip(c1) {
            let v = *row.get(c).ok_or(short)?;
            if v.abs() > piv.abs() {
                p = i;
                piv = v;
            }
        }
        if piv == 0.0 {
            return Ok(0.0);
        }
        // `upper` ends with row c, `lower` holds the rows below it (p among
        // them when p != c).
        let (upper, lower) = a.split_at_mut_checked(row_at(c1)).ok_or(short)?;
        let prow = upper.get_mut(row_at(c)..).ok_or(short)?;
        if p != c {
            // c < p < n: row p of the matrix is row p - c - 1 of `lower`.
            let q = p.wrapping_sub(c1);
            let other = lower
                .get_mut(row_at(q)..row_at(q.wrapping_add(1)))
                .ok_or(short)?;
            for (u, v) in prow.iter_mut().zip(other) {
                core::mem::swap(u, v);
            }
            det = -det;
        }
        det *= piv;
        let tail = prow.get(c1..).ok_or(short)?;
        for row in lower.chunks_of_mut(n) {
            let (head, rest) = row.split_at_mut_checked(c1).ok_or(short)?;
            let f = *head.last().ok_or(short)? / piv;
            if f != 0.0 {
                for (v, &t) in rest.iter_mut().zip(tail) {
                    *v -= f * t;
                }
            }
        }
    }
    Ok(det)
}

#[cfg(test)]
mod det_tests {
    use crate::ops::testing::{assert_close, run, t, vals};
    use crate::ErrorKind;
    use alloc::vec;

    #[test]
    fn empty_operands_with_an_output_past_usize() {
        // [big, 0] x [0, big]: no data, but m * n is past usize (32- and
        // 64-bit targets alike).
        let big = 1usize << (usize::BITS / 2 + 1);
        for op in ["MatMul", "Gemm"] {
            let a = t(&[big, 0], &[0.0f32; 0]);
            let b = t(&[0, big], &[0.0f32; 0]);
            let e = run(op, 13, vec![], &[a, b], 1).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Overflow, "{op}");
        }
    }

    #[test]
    fn det_batched_with_pivoting() {
        // det [[1 2] [3 4]] = -2, [[1 2] [2 1]] = -3; [[0 1] [1 0]] needs a
        // row swap: -1; a singular matrix gives 0.
        let x = t(
            &[4, 2, 2],
            &[
                1.0f32, 2.0, 3.0, 4.0, 1.0, 2.0, 2.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 4.0,
            ],
        );
        let y = run("Det", 11, vec![], &[x], 1).unwrap();
        assert_eq!(y[0].shape, vec![4]);
        assert_close(&vals::<f32>(&y[0]), &[-2.0, -3.0, -1.0, 0.0], 0.0);
        // 3x3 by cofactors: 2(3*2-1*1) - 0 + 1(1*1-3*4) = 10 - 11 = -1.
        let m = t(&[3, 3], &[2.0f64, 0.0, 1.0, 1.0, 3.0, 1.0, 4.0, 1.0, 2.0]);
        let y = run("Det", 11, vec![], &[m], 1).unwrap();
        assert!(y[0].shape.is_empty());
        assert!((vals::<f64>(&y[0])[0] + 1.0).abs() < 1e-12);
        assert!(run("Det", 11, vec![], &[t(&[2, 3], &[0.0f32; 6])], 1).is_err());
    }
}

#[cfg(test)]
mod tests {
    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;

    use crate::ops::testing::rnd;

    #[allow(clippy::too_many_arguments)]
    fn naive_gemm(
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        ta: bool,
        b: &[f32],
        tb: bool,
        alpha: f32,
    ) -> Vec<f32> {
        let mut y = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for p in 0..k {
                    let av = if ta { a[p * m + i] } else { a[i * k + p] };
                    let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                    s += av * bv;
                }
                y[i * n + j] = alpha * s;
            }
        }
        y
    }

    #[test]
    fn gemm_trans_and_c_broadcast() {
        let (m, n, k) = (5, 7, 9);
        let a = rnd(m * k, 1);
        let b = rnd(k * n, 2);
        for ta in [false, true] {
            for tb in [false, true] {
                let ash = if ta { [k, m] } else { [m, k] };
                let bsh = if tb { [n, k] } else { [k, n] };
                let base = naive_gemm(m, n, k, &a, ta, &b, tb, 0.5);
                let attrs = || {
                    vec![
                        ("transA", AttrValue::Int(ta as i64)),
                        ("transB", AttrValue::Int(tb as i64)),
                        ("alpha", AttrValue::Float(0.5)),
                        ("beta", AttrValue::Float(2.0)),
                    ]
                };
                // No C.
                let r = run("Gemm", 13, attrs(), &[t(&ash, &a), t(&bsh, &b)], 1).unwrap();
                assert_eq!(r[0].shape, vec![m, n]);
                assert_close(&vals::<f32>(&r[0]), &base, 1e-5);
                // C forms.
                let forms: Vec<Vec<usize>> = vec![
                    vec![],
                    vec![1],
                    vec![n],
                    vec![1, n],
                    vec![m, 1],
                    vec![m, n],
                    vec![1, 1],
                ];
                for cs in forms {
                    let cn: usize = cs.iter().product();
                    let c = rnd(cn, 7);
                    let want: Vec<f32> = (0..m * n)
                        .map(|idx| {
                            let (i, j) = (idx / n, idx % n);
                            let ci = match cs.as_slice() {
                                [] | [1] | [1, 1] => 0,
                                [x] if *x == n => j,
                                [1, _] => j,
                                [_, 1] => i,
                                _ => idx,
                            };
                            base[idx] + 2.0 * c[ci]
                        })
                        .collect();
                    let r = run(
                        "Gemm",
                        13,
                        attrs(),
                        &[t(&ash, &a), t(&bsh, &b), t(&cs, &c)],
                        1,
                    )
                    .unwrap();
                    assert_close(&vals::<f32>(&r[0]), &want, 1e-5);
                }
            }
        }
        // Bad C shape.
        assert!(run(
            "Gemm",
            13,
            vec![],
            &[t(&[m, k], &a), t(&[k, n], &b), t(&[2, n], &rnd(2 * n, 3))],
            1
        )
        .is_err());
        // Inner dim mismatch.
        assert!(run("Gemm", 13, vec![], &[t(&[m, k], &a), t(&[n, k], &b)], 1).is_err());
    }

    #[test]
    fn sgemm_larger_and_leading_dims() {
        let (m, n, k) = (17, 33, 21);
        let a = rnd(m * k, 4);
        let b = rnd(k * n, 5);
        for ta in [false, true] {
            for tb in [false, true] {
                let mut c = vec![1.0f32; m * n];
                let lda = if ta { m } else { k };
                let ldb = if tb { k } else { n };
                super::sgemm(m, n, k, &a, lda, ta, &b, ldb, tb, &mut c, n, 1.5, 0.5).unwrap();
                let want: Vec<f32> = naive_gemm(m, n, k, &a, ta, &b, tb, 1.5)
                    .iter()
                    .map(|v| v + 0.5)
                    .collect();
                assert_close(&c, &want, 1e-5);
            }
        }
        let mut c = vec![0.0f32; 4];
        assert!(super::sgemm(
            2,
            2,
            2,
            &a[..3],
            2,
            false,
            &b,
            2,
            false,
            &mut c,
            2,
            1.0,
            0.0
        )
        .is_err());
    }

    fn naive_matmul(ash: &[usize], a: &[f32], bsh: &[usize], b: &[f32]) -> (Vec<usize>, Vec<f32>) {
        // Uses explicit broadcasting over rank-3 padded shapes.
        let pa: Vec<usize> = if ash.len() == 1 {
            vec![1, ash[0]]
        } else {
            ash.to_vec()
        };
        let pb: Vec<usize> = if bsh.len() == 1 {
            vec![bsh[0], 1]
        } else {
            bsh.to_vec()
        };
        let r = pa.len().max(pb.len());
        let pad = |s: &[usize]| {
            let mut v = vec![1; r - s.len()];
            v.extend_from_slice(s);
            v
        };
        let (pa, pb) = (pad(&pa), pad(&pb));
        let (m, k, n) = (pa[r - 2], pa[r - 1], pb[r - 1]);
        let batch: Vec<usize> = (0..r - 2).map(|i| pa[i].max(pb[i])).collect();
        let nb: usize = batch.iter().product();
        let mut y = Vec::new();
        for bi in 0..nb {
            // Decompose bi into batch index.
            let mut rem = bi;
            let mut idx = vec![0; batch.len()];
            for d in (0..batch.len()).rev() {
                idx[d] = rem % batch[d];
                rem /= batch[d];
            }
            let off = |s: &[usize], mat: usize| {
                let mut o = 0;
                for d in 0..batch.len() {
                    o = o * s[d] + if s[d] == 1 { 0 } else { idx[d] };
                }
                o * mat
            };
            let oa = off(&pa, m * k);
            let ob = off(&pb, k * n);
            y.extend(naive_gemm(
                m,
                n,
                k,
                &a[oa..oa + m * k],
                false,
                &b[ob..ob + k * n],
                false,
                1.0,
            ));
        }
        let mut shape = batch.clone();
        if ash.len() != 1 {
            shape.push(m);
        }
        if bsh.len() != 1 {
            shape.push(n);
        }
        (shape, y)
    }

    #[test]
    fn matmul_broadcast_and_1d() {
        let cases: Vec<(Vec<usize>, Vec<usize>)> = vec![
            (vec![3, 4], vec![4, 5]),
            (vec![2, 3, 4], vec![4, 5]),
            (vec![3, 4], vec![2, 4, 5]),
            (vec![2, 1, 3, 4], vec![3, 4, 6]),
            (vec![4], vec![4, 5]),
            (vec![3, 4], vec![4]),
            (vec![4], vec![4]),
            (vec![4], vec![2, 4, 5]),
            (vec![2, 3, 4], vec![4]),
            (vec![1, 3, 0], vec![0, 2]),
        ];
        for (i, (ash, bsh)) in cases.iter().enumerate() {
            let a = rnd(ash.iter().product(), 10 + i as u64);
            let b = rnd(bsh.iter().product(), 20 + i as u64);
            let (shape, want) = naive_matmul(ash, &a, bsh, &b);
            let r = run("MatMul", 13, vec![], &[t(ash, &a), t(bsh, &b)], 1).unwrap();
            assert_eq!(r[0].shape, shape, "case {i}");
            assert_close(&vals::<f32>(&r[0]), &want, 1e-5);
        }
        assert!(run(
            "MatMul",
            13,
            vec![],
            &[t(&[3, 4], &rnd(12, 1)), t(&[3, 4], &rnd(12, 2))],
            1
        )
        .is_err());
        assert!(run(
            "MatMul",
            13,
            vec![],
            &[t(&[2, 3, 4], &rnd(24, 1)), t(&[3, 4, 2], &rnd(24, 2))],
            1
        )
        .is_err());
    }

    #[test]
    fn narrow_floats_accumulate_in_f32() {
        use crate::ops::testing::float_types_agree;
        // f16 / bf16 results are the f32 result rounded once; f64 close.
        let (m, n, k) = (5, 7, 33);
        let a = rnd(m * k, 31);
        let b = rnd(k * n, 32);
        let c = rnd(n, 33);
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let ash = if ta { [k, m] } else { [m, k] };
            let bsh = if tb { [n, k] } else { [k, n] };
            float_types_agree(
                "Gemm",
                13,
                vec![
                    ("transA", AttrValue::Int(ta as i64)),
                    ("transB", AttrValue::Int(tb as i64)),
                    ("alpha", AttrValue::Float(0.5)),
                    ("beta", AttrValue::Float(2.0)),
                ],
                &[(&ash, &a), (&bsh, &b), (&[n], &c)],
                1e-5,
            );
        }
        let a = rnd(2 * 3 * 4 * 9, 34);
        let b = rnd(3 * 9 * 6, 35);
        let y = float_types_agree(
            "MatMul",
            13,
            vec![],
            &[(&[2, 3, 4, 9], &a), (&[3, 9, 6], &b)],
            1e-5,
        );
        assert_eq!(y.len(), 2 * 3 * 4 * 6);
        // Mixed dtypes other than f16 weights against f32 are an error.
        let ah: Vec<half::f16> = a.iter().map(|&v| half::f16::from_f32(v)).collect();
        assert!(run(
            "MatMul",
            13,
            vec![],
            &[t(&[2, 3, 4, 9], &ah), t(&[3, 9, 6], &b)],
            1
        )
        .is_err());
        let b64: Vec<f64> = b.iter().map(|&v| v as f64).collect();
        assert!(run(
            "MatMul",
            13,
            vec![],
            &[t(&[2, 3, 4, 9], &a), t(&[3, 9, 6], &b64)],
            1
        )
        .is_err());
    }

    #[test]
    fn f16_weights_against_f32_input() {
        let round = |v: Vec<f32>| -> Vec<f32> {
            v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
        };
        let a = rnd(3 * 4 * 9, 81);
        let b = round(rnd(9 * 5, 82));
        let bh: Vec<half::f16> = b.iter().map(|&v| half::f16::from_f32(v)).collect();
        let want = run(
            "MatMul",
            13,
            vec![],
            &[t(&[3, 4, 9], &a), t(&[9, 5], &b)],
            1,
        )
        .unwrap();
        let got = run(
            "MatMul",
            13,
            vec![],
            &[t(&[3, 4, 9], &a), t(&[9, 5], &bh)],
            1,
        )
        .unwrap();
        // Same products in f32; the f32 × f32 case may run the blocked
        // kernels, whose sums round in another order.
        for (g, w) in vals::<f32>(&got[0]).iter().zip(vals::<f32>(&want[0])) {
            assert!((g - w).abs() <= 1e-6 * (1.0 + w.abs()), "{g} vs {w}");
        }
        let c = rnd(5, 83);
        let attrs = || {
            vec![
                ("transB", AttrValue::Int(1)),
                ("beta", AttrValue::Float(0.5)),
            ]
        };
        let want = run(
            "Gemm",
            13,
            attrs(),
            &[t(&[12, 9], &a), t(&[5, 9], &b), t(&[5], &c)],
            1,
        )
        .unwrap();
        let got = run(
            "Gemm",
            13,
            attrs(),
            &[t(&[12, 9], &a), t(&[5, 9], &bh), t(&[5], &c)],
            1,
        )
        .unwrap();
        for (g, w) in vals::<f32>(&got[0]).iter().zip(vals::<f32>(&want[0])) {
            assert!((g - w).abs() <= 1e-6 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }
}
