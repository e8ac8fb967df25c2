//! Normalization operators: BatchNormalization (inference), LRN, Softmax,
//! LogSoftmax, InstanceNormalization, LayerNormalization (with its Mean and
//! InvStdDev outputs), RMSNormalization, GroupNormalization, LpNormalization,
//! MeanVarianceNormalization.

use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::kern::win;
use crate::math;
use crate::ops::util::Acc as _;
use crate::ops::{kernel, util, KernelIo, OpDef, OutputInfo, PrepareCtx, Prepared, Unary};
use crate::tensor::ChunksOf as _;
use crate::tensor::MAX_RANK;
use crate::DType;
use alloc::vec;
use alloc::vec::Vec;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("BatchNormalization", 7, prepare_batchnorm),
    OpDef::onnx("BatchNormalization", 9, prepare_batchnorm),
    OpDef::onnx("BatchNormalization", 14, prepare_batchnorm),
    OpDef::onnx("BatchNormalization", 15, prepare_batchnorm),
    OpDef::onnx("LRN", 1, prepare_lrn),
    OpDef::onnx("Softmax", 1, prepare_softmax),
    OpDef::onnx("LogSoftmax", 1, prepare_log_softmax),
    OpDef::onnx("InstanceNormalization", 6, prepare_instance_norm),
    OpDef::onnx("LayerNormalization", 17, prepare_layer_norm),
    OpDef::onnx("RMSNormalization", 23, prepare_rms_norm),
    OpDef::onnx("GroupNormalization", 18, prepare_group_norm),
    OpDef::onnx("GroupNormalization", 21, prepare_group_norm),
    OpDef::onnx("LpNormalization", 1, prepare_lp_norm),
    OpDef::onnx("LpNormalization", 22, prepare_lp_norm),
    OpDef::onnx("MeanVarianceNormalization", 9, prepare_mvn),
    OpDef::onnx("MeanVarianceNormalization", 13, prepare_mvn),
];

fn f32_input<'a>(ctx: &PrepareCtx<'a>, i: usize, what: &'static str) -> Result<&'a [usize]> {
    let x = ctx.input(i)?;
    util::dtype_in(x.dtype, &[DType::F32], what)?;
    Ok(x.shape)
}

/// [`in_out`] over f32 elements.
fn in_out_f32(io: &mut KernelIo<'_>, f: impl FnOnce(&mut [f32]) -> Result<()>) -> Result<()> {
    in_out::<f32>(io, f)
}

/// Element `i` of a parameter whose length the caller checked.
#[inline]
fn at<T: Copy>(v: &[T], i: usize, what: &'static str) -> Result<T> {
    v.get(i).copied().ok_or(Error::internal(what))
}

/// `(N, C, inner)` of an `[N, C, ...]` input: rank at least 2. `inner`
/// and `C · inner` (one image) are checked to fit (Overflow).
fn nc_inner(xs: &[usize]) -> Result<(usize, usize, usize)> {
    match *xs {
        [n, c, ref rest @ ..] => {
            let inner = checked_numel(rest)?;
            c.checked_mul(inner)
                .ok_or(Error::new(ErrorKind::Overflow))?;
            Ok((n, c, inner))
        }
        _ => Err(Error::new(ErrorKind::Rank {
            expected: 2,
            got: xs.len(),
        })),
    }
}

/// `a · b · c`, or `None` on overflow: the element count of an
/// `[a, b, c]` layout, compared once per call with the buffer length.
#[inline]
fn len3(a: usize, b: usize, c: usize) -> Option<usize> {
    a.checked_mul(b)?.checked_mul(c)
}

/// `(outer, n, inner)` of `shape` around axis `a` (`a < shape.len()`);
/// the sizes and `n · inner` (one block) are checked to fit (Overflow).
fn around_axis(shape: &[usize], a: usize) -> Result<(usize, usize, usize)> {
    let (head, rest) = shape.split_at_checked(a).ok_or(Error::internal("axis"))?;
    let (&n, tail) = rest.split_first().ok_or(Error::internal("axis"))?;
    let inner = checked_numel(tail)?;
    n.checked_mul(inner)
        .ok_or(Error::new(ErrorKind::Overflow))?;
    Ok((checked_numel(head)?, n, inner))
}

/// Elements in one block of `n · inner` of an `(outer, n, inner)` layout,
/// at least 1 (an empty buffer has no blocks anyway); `what` names the
/// error, which the checks of [`around_axis`] rule out.
#[inline]
fn block_len(n: usize, inner: usize, what: &'static str) -> Result<usize> {
    Ok(n.checked_mul(inner).ok_or(Error::internal(what))?.max(1))
}

/// The `N` planes of channel `ch` of an `[N, C, inner]` buffer (`ch < C`,
/// the length checked by the caller), in image order.
#[inline]
fn planes<T>(x: &[T], c: usize, inner: usize, ch: usize) -> impl Iterator<Item = &[T]> {
    x.chunks_of(inner).skip(ch).step_by(c.max(1))
}

/// [`planes`], mutable.
#[inline]
fn planes_mut<T>(x: &mut [T], c: usize, inner: usize, ch: usize) -> impl Iterator<Item = &mut [T]> {
    x.chunks_of_mut(inner).skip(ch).step_by(c.max(1))
}

/// Elements `i, i + inner, i + 2 * inner, ...` of `blk` (callers have
/// `i < inner`, so `inner >= 1`).
#[inline]
fn column<T>(blk: &[T], i: usize, inner: usize) -> impl Iterator<Item = &T> {
    blk.iter().skip(i).step_by(inner.max(1))
}

/// [`column`], mutable.
#[inline]
fn column_mut<T>(blk: &mut [T], i: usize, inner: usize) -> impl Iterator<Item = &mut T> {
    blk.iter_mut().skip(i).step_by(inner.max(1))
}

fn check_vec(shape: &[usize], c: usize) -> Result<()> {
    if shape.iter().product::<usize>() != c || shape.len() > 1 {
        return Err(Error::new(ErrorKind::Shape(
            "per-channel parameter must have shape (C)",
        )));
    }
    Ok(())
}

fn prepare_batchnorm(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    if ctx.attr_int("training_mode", 0)? != 0 {
        let xs = f32_input(ctx, 0, "BatchNormalization X")?;
        return prepare_batchnorm_training(ctx, xs);
    }
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, FLOATS, "BatchNormalization X")?;
    let (xs, dt) = (x.shape, x.dtype);
    if ctx.opset < 9 && ctx.attr_int("spatial", 1)? == 0 {
        return Err(Error::new(ErrorKind::Unsupported(
            "BatchNormalization spatial=0",
        )));
    }
    if (1..ctx.num_outputs()).any(|i| ctx.has_output(i)) {
        return Err(Error::new(ErrorKind::Unsupported(
            "BatchNormalization training outputs",
        )));
    }
    let eps = ctx.attr_float("epsilon", 1e-5)?;
    let (n, c, inner) = nc_inner(xs)?;
    for (i, what) in [
        (1, "BatchNormalization scale"),
        (2, "BatchNormalization B"),
        (3, "BatchNormalization mean"),
        (4, "BatchNormalization var"),
    ] {
        let v = ctx.input(i)?;
        util::dtype_in(v.dtype, FLOATS, what)?;
        check_vec(v.shape, c)?;
    }
    // Constant parameters: fold into y = a * x + b per channel.
    let consts = (
        const_floats_opt(ctx, 1),
        const_floats_opt(ctx, 2),
        const_floats_opt(ctx, 3),
        const_floats_opt(ctx, 4),
    );
    let folded: Option<(Vec<f32>, Vec<f32>)> = match consts {
        (Some(s), Some(bb), Some(mean), Some(var)) => {
            if [&s, &bb, &mean, &var].iter().any(|v| v.len() != c) {
                return Err(Error::internal(
                    "BatchNormalization constant parameter size",
                ));
            }
            let mut a = Vec::with_capacity(c);
            let mut b = Vec::with_capacity(c);
            for (((&sv, &bv), &mv), &vv) in s.iter().zip(&bb).zip(&mean).zip(&var) {
                let av = sv / math::sqrt(vv + eps);
                a.push(av);
                b.push(bv - mv * av);
            }
            Some((a, b))
        }
        _ => None,
    };
    if folded.is_none() && (1..5).any(|i| ctx.opt_input(i).is_some_and(|v| v.dtype != dt)) {
        return Err(Error::new(ErrorKind::Unsupported(
            "BatchNormalization run-time parameters of another dtype than X",
        )));
    }
    let bn = BatchNorm {
        n,
        c,
        inner,
        eps,
        folded,
    };
    util::with_float!(dt, T => Ok(Prepared::single(
        dt,
        xs,
        kernel("BatchNormalization", move |io| bn.run::<T>(io)),
    )
    .in_place()), other => Err(Error::new(ErrorKind::UnsupportedDType {
        what: "BatchNormalization X",
        code: other.onnx_code(),
    })))
}

/// Inference BatchNormalization: `y = a * x + b` per channel, in f32 (f64
/// for f64), with `(a, b)` folded in prepare when the parameters are
/// constant.
#[derive(Debug)]
struct BatchNorm {
    n: usize,
    c: usize,
    inner: usize,
    eps: f32,
    folded: Option<(Vec<f32>, Vec<f32>)>,
}

impl BatchNorm {
    fn run<T: Real>(&self, io: &mut KernelIo<'_>) -> Result<()> {
        let (n, c, inner, eps) = (self.n, self.c, self.inner, self.eps);
        let params = match &self.folded {
            Some(_) => None,
            None => Some((
                io.input_slice::<T>(1)?,
                io.input_slice::<T>(2)?,
                io.input_slice::<T>(3)?,
                io.input_slice::<T>(4)?,
            )),
        };
        in_out::<T>(io, |y| {
            if Some(y.len()) != len3(n, c, inner) {
                return Err(Error::new(ErrorKind::Internal("BatchNormalization size")));
            }
            const P: &str = "BatchNormalization params";
            for ch in 0..c {
                let (a, b) = match (&self.folded, params) {
                    (Some((fa, fb)), _) => (at(fa, ch, P)?, at(fb, ch, P)?),
                    (None, Some((s, bb, mean, var))) => {
                        let a = at(s, ch, P)?.to_f32() / math::sqrt(at(var, ch, P)?.to_f32() + eps);
                        (a, at(bb, ch, P)?.to_f32() - at(mean, ch, P)?.to_f32() * a)
                    }
                    _ => return Err(Error::new(ErrorKind::Internal("BatchNormalization params"))),
                };
                let (a, b) = (T::Acc::from_f32(a), T::Acc::from_f32(b));
                for plane in planes_mut(y, c, inner, ch) {
                    for v in plane {
                        // a * x + b, rounded after each operation (not fused).
                        *v = T::from_acc(a.times(v.to_acc()).plus(b));
                    }
                }
            }
            Ok(())
        })
    }
}

/// Mean and (population) variance of channel `ch` of `x` (`[n, c, inner]`).
/// The caller checked `x.len()` is `n · c · inner` (and `ch < c`).
fn channel_stats(x: &[f32], n: usize, c: usize, inner: usize, ch: usize) -> Result<(f64, f64)> {
    let cnt = n
        .checked_mul(inner)
        .ok_or(Error::internal("BatchNormalization size"))?
        .max(1) as f64;
    let mut sum = 0.0f64;
    for plane in planes(x, c, inner, ch) {
        sum += plane.iter().map(|&v| v as f64).sum::<f64>();
    }
    let mean = sum / cnt;
    let mut sq = 0.0f64;
    for plane in planes(x, c, inner, ch) {
        sq += plane
            .iter()
            .map(|&v| (v as f64 - mean) * (v as f64 - mean))
            .sum::<f64>();
    }
    Ok((mean, sq / cnt))
}

/// BatchNormalization with `training_mode=1` (opset 14+): normalizes with
/// the batch statistics and outputs the updated running mean and variance
/// `running * momentum + batch * (1 - momentum)`.
fn prepare_batchnorm_training(ctx: &PrepareCtx<'_>, xs: &[usize]) -> Result<Prepared> {
    if ctx.opset < 14 {
        return Err(Error::new(ErrorKind::Unsupported(
            "BatchNormalization training before opset 14",
        )));
    }
    let (n, c, inner) = nc_inner(xs)?;
    for (i, what) in [
        (1, "BatchNormalization scale"),
        (2, "BatchNormalization B"),
        (3, "BatchNormalization mean"),
        (4, "BatchNormalization var"),
    ] {
        check_vec(f32_input(ctx, i, what)?, c)?;
    }
    let eps = ctx.attr_float("epsilon", 1e-5)?;
    let momentum = ctx.attr_float("momentum", 0.9)?;
    let running = [ctx.has_output(1), ctx.has_output(2)];
    let mut outs = vec![OutputInfo::new(DType::F32, xs)];
    if running != [false, false] {
        outs.push(OutputInfo::new(DType::F32, &[c]));
        outs.push(OutputInfo::new(DType::F32, &[c]));
    }
    Ok(Prepared::new(
        outs,
        kernel("BatchNormalization", move |io| {
            let x = io.input_slice::<f32>(0)?;
            let s = io.input_slice::<f32>(1)?;
            let b = io.input_slice::<f32>(2)?;
            let rm = io.input_slice::<f32>(3)?;
            let rv = io.input_slice::<f32>(4)?;
            if Some(x.len()) != len3(n, c, inner) || [s, b, rm, rv].iter().any(|v| v.len() != c) {
                return Err(Error::new(ErrorKind::Internal("BatchNormalization size")));
            }
            {
                let y = io.output_slice::<f32>(0)?;
                if y.len() != x.len() {
                    return Err(Error::new(ErrorKind::Internal("BatchNormalization size")));
                }
                const P: &str = "BatchNormalization size";
                for ch in 0..c {
                    let (mean, var) = channel_stats(x, n, c, inner, ch)?;
                    let a = at(s, ch, P)? / math::sqrt((var + eps as f64) as f32);
                    let sh = at(b, ch, P)? - mean as f32 * a;
                    for (yp, xp) in planes_mut(y, c, inner, ch).zip(planes(x, c, inner, ch)) {
                        for (o, &v) in yp.iter_mut().zip(xp) {
                            *o = a * v + sh;
                        }
                    }
                }
            }
            // Output 1 is the running mean, output 2 the running variance.
            for (&want, k) in running.iter().zip(1..) {
                if !want {
                    continue;
                }
                let prev = if k == 1 { rm } else { rv };
                let o = io.output_slice::<f32>(k)?;
                if o.len() != c {
                    return Err(Error::new(ErrorKind::Internal("BatchNormalization size")));
                }
                for (ch, (ov, &pv)) in o.iter_mut().zip(prev).enumerate() {
                    let st = channel_stats(x, n, c, inner, ch)?;
                    let batch = if k == 1 { st.0 } else { st.1 } as f32;
                    *ov = pv * momentum + batch * (1.0 - momentum);
                }
            }
            Ok(())
        }),
    ))
}

/// Constant f32 input values, or None when absent or not constant.
fn const_floats_opt(ctx: &PrepareCtx<'_>, i: usize) -> Option<Vec<f32>> {
    ctx.opt_input(i)?.value?;
    ctx.const_floats(i).ok().flatten()
}

fn prepare_lrn(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let xs = f32_input(ctx, 0, "LRN X")?;
    let size = ctx.attr_int("size", 0)?;
    if size < 1 {
        return Err(Error::new(ErrorKind::Attribute {
            name: "size",
            problem: "required and must be >= 1",
        }));
    }
    let alpha = ctx.attr_float("alpha", 1e-4)?;
    let beta = ctx.attr_float("beta", 0.75)?;
    let bias = ctx.attr_float("bias", 1.0)?;
    let (n, c, inner) = nc_inner(xs)?;
    let size = size as usize;
    let span = size.wrapping_sub(1); // size >= 1 (checked above)
    let lo = span / 2;
    let hi = span.wrapping_sub(lo); // ceil((size-1)/2), as lo <= span
    let scale = alpha / size as f32;
    // One image; fits (checked in nc_inner).
    let img = c.wrapping_mul(inner);
    Ok(Prepared::single(
        DType::F32,
        xs,
        kernel("LRN", move |io| {
            let x = io.input_slice::<f32>(0)?;
            let y = io.output_slice::<f32>(0)?;
            if Some(x.len()) != len3(n, c, inner) || y.len() != x.len() {
                return Err(Error::new(ErrorKind::Internal("LRN size")));
            }
            if img == 0 {
                return Ok(());
            }
            const P: &str = "LRN size";
            for (xb, yb) in x.chunks_of(img).zip(y.chunks_of_mut(img)) {
                // Channel planes ch of this image (inner >= 1 as img > 0).
                let chans = xb.chunks_of(inner).zip(yb.chunks_of_mut(inner));
                for (ch, (xr, yr)) in chans.enumerate() {
                    // Channels c0..c1 around ch, clamped to the image:
                    // c0 <= ch < c1 <= c, so the offsets stay within
                    // c · inner = img and the products are exact.
                    let c0 = ch.saturating_sub(lo);
                    let c1 = ch.saturating_add(hi).saturating_add(1).min(c);
                    let band = xb
                        .get(c0.wrapping_mul(inner)..c1.wrapping_mul(inner))
                        .ok_or(Error::internal(P))?;
                    for (s, (yv, &xv)) in yr.iter_mut().zip(xr).enumerate() {
                        let sum = column(band, s, inner).fold(0.0f32, |sum, &v| sum + v * v);
                        *yv = xv / math::pow(bias + scale * sum, beta);
                    }
                }
            }
            Ok(())
        }),
    ))
}

/// (outer, n, inner) of a softmax over `shape` for this opset.
fn softmax_dims(ctx: &PrepareCtx<'_>, shape: &[usize]) -> Result<(usize, usize, usize)> {
    let r = shape.len();
    if ctx.opset < 13 {
        let a = ctx.attr_int("axis", 1)?;
        let r_i = r as i64;
        // a < 0 <= r_i: the sum cannot overflow.
        let v = if a < 0 { a.wrapping_add(r_i) } else { a };
        if v < 0 || v > r_i {
            return Err(Error::new(ErrorKind::Attribute {
                name: "axis",
                problem: "axis out of range",
            }));
        }
        let (head, tail) = shape
            .split_at_checked(v as usize)
            .ok_or(Error::internal("Softmax axis"))?;
        Ok((checked_numel(head)?, checked_numel(tail)?, 1))
    } else {
        if r == 0 {
            return Ok((1, 1, 1));
        }
        let a = util::axis(ctx.attr_int("axis", -1)?, r, "axis")?;
        around_axis(shape, a)
    }
}

/// Softmax / LogSoftmax of non-f32 floats, in f64.
fn softmax_t<T: Real>(
    y: &mut [T],
    (outer, n, inner): (usize, usize, usize),
    log: bool,
) -> Result<()> {
    if Some(y.len()) != len3(outer, n, inner) {
        return Err(Error::new(ErrorKind::Internal("Softmax size")));
    }
    for blk in y.chunks_of_mut(block_len(n, inner, "Softmax size")?) {
        for i in 0..inner {
            let mut mx = f64::NEG_INFINITY;
            for v in column(blk, i, inner) {
                let v = v.to_f64();
                if v > mx || v.is_nan() {
                    mx = v;
                }
            }
            if mx.is_infinite() {
                mx = if mx > 0.0 { mx } else { 0.0 };
            }
            let mut sum = 0.0f64;
            for v in column(blk, i, inner) {
                sum += libm::exp(v.to_f64() - mx);
            }
            let l = libm::log(sum) + mx;
            for v in column_mut(blk, i, inner) {
                let lp = v.to_f64() - l;
                *v = T::from_f64(if log { lp } else { libm::exp(lp) });
            }
        }
    }
    Ok(())
}

fn softmax_common(ctx: &PrepareCtx<'_>, log: bool, name: &'static str) -> Result<Prepared> {
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, FLOATS, name)?;
    let (xs, dt) = (x.shape, x.dtype);
    let dims = softmax_dims(ctx, xs)?;
    let (outer, n, inner) = dims;
    if dt != DType::F32 {
        return Ok(Prepared::single(
            dt,
            xs,
            kernel(name, move |io| match dt {
                DType::F64 => in_out::<f64>(io, |y| softmax_t(y, dims, log)),
                DType::F16 => in_out::<half::f16>(io, |y| softmax_t(y, dims, log)),
                _ => in_out::<half::bf16>(io, |y| softmax_t(y, dims, log)),
            }),
        )
        .in_place());
    }
    Ok(Prepared::single(
        DType::F32,
        xs,
        kernel(name, move |io| {
            in_out_f32(io, |y| {
                if Some(y.len()) != len3(outer, n, inner) {
                    return Err(Error::new(ErrorKind::Internal("Softmax size")));
                }
                // An empty y (n * inner == 0) has no blocks.
                for blk in y.chunks_of_mut(block_len(n, inner, "Softmax size")?) {
                    for i in 0..inner {
                        let mut mx = f32::NEG_INFINITY;
                        for &v in column(blk, i, inner) {
                            if v > mx || v.is_nan() {
                                mx = v;
                            }
                        }
                        if mx.is_infinite() {
                            mx = if mx > 0.0 { mx } else { 0.0 };
                        }
                        if !log && inner == 1 {
                            softmax_row(blk, mx);
                            continue;
                        }
                        let mut sum = 0.0f32;
                        if log {
                            for &v in column(blk, i, inner) {
                                sum += math::exp(v - mx);
                            }
                            let l = math::ln(sum) + mx;
                            for v in column_mut(blk, i, inner) {
                                *v -= l;
                            }
                        } else {
                            for v in column_mut(blk, i, inner) {
                                let e = math::exp(*v - mx);
                                *v = e;
                                sum += e;
                            }
                            let inv = 1.0 / sum;
                            for v in column_mut(blk, i, inner) {
                                *v *= inv;
                            }
                        }
                    }
                }
                Ok(())
            })
        }),
    )
    .in_place())
}

crate::kern::cpu::avx2_variant! {
/// Softmax of one contiguous row `y` (the last axis, a transformer's
/// attention rows) whose maximum is `mx`, in three vectorized passes: the
/// exponentials ([`math::exp_vec`], branch-free where `libm`'s `expf` is a
/// call per value: a tenth of the transformer block's time), their sum in
/// eight partial sums, the scaling; on 8 lanes where the CPU has AVX2
/// (the same operations: no multiply-add is contracted).
fn softmax_row(y: &mut [f32], mx: f32) {
    for v in y.iter_mut() {
        *v = math::exp_vec(*v - mx);
    }
    let sum = util::sum_lanes(y, |v| v);
    let inv = 1.0 / sum;
    for v in y.iter_mut() {
        *v *= inv;
    }
}
}

fn prepare_softmax(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    softmax_common(ctx, false, "Softmax")
}

fn prepare_log_softmax(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    softmax_common(ctx, true, "LogSoftmax")
}

/// Normalizes one block in place to zero mean, unit variance; returns
/// nothing, writes `(v - mean) * inv_std`.
#[inline]
fn normalize_block(blk: &mut [f32], eps: f32) -> f32 {
    let cnt = blk.len().max(1) as f32;
    let mean = blk.iter().sum::<f32>() / cnt;
    let var = blk.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / cnt;
    let inv = 1.0 / math::sqrt(var + eps);
    for v in blk.iter_mut() {
        *v = (*v - mean) * inv;
    }
    inv
}

fn prepare_instance_norm(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let xs = f32_input(ctx, 0, "InstanceNormalization X")?;
    let (n, c, inner) = nc_inner(xs)?;
    check_vec(f32_input(ctx, 1, "InstanceNormalization scale")?, c)?;
    check_vec(f32_input(ctx, 2, "InstanceNormalization B")?, c)?;
    let eps = ctx.attr_float("epsilon", 1e-5)?;
    Ok(Prepared::single(
        DType::F32,
        xs,
        kernel("InstanceNormalization", move |io| {
            let s = io.input_slice::<f32>(1)?;
            let b = io.input_slice::<f32>(2)?;
            in_out_f32(io, |y| {
                if Some(y.len()) != len3(n, c, inner) || s.len() != c || b.len() != c {
                    return Err(Error::new(ErrorKind::Internal(
                        "InstanceNormalization size",
                    )));
                }
                if inner == 0 {
                    return Ok(());
                }
                // Planes in (image, channel) order; s and b have c values.
                for (blk, (&sv, &bv)) in y.chunks_of_mut(inner).zip(s.iter().zip(b).cycle()) {
                    normalize_block(blk, eps);
                    for v in blk.iter_mut() {
                        *v = *v * sv + bv;
                    }
                }
                Ok(())
            })
        }),
    )
    .in_place())
}

/// Index of the parameter element applying to each position of a
/// normalized block (Scale/B broadcast to the block's shape).
#[derive(Debug)]
enum ParamIdx {
    /// Element `j` at position `j`: the parameter has the block's shape.
    Full,
    /// Element 0 everywhere: a single value.
    One,
    /// Partial broadcast, one index per block position (nondecreasing).
    Map(Vec<u32>),
}

impl ParamIdx {
    /// Whether a parameter of `len` elements covers every index.
    fn fits(&self, block: usize, len: usize) -> bool {
        match self {
            ParamIdx::Full => block <= len,
            ParamIdx::One => block == 0 || len >= 1,
            // The map is nondecreasing: its last entry is its largest.
            ParamIdx::Map(m) => m.len() == block && m.last().is_none_or(|&k| (k as usize) < len),
        }
    }

    /// The values of parameter `p` at the `block` positions of one block.
    fn lane<'a, T: Copy>(&'a self, p: &'a [T], block: usize) -> Result<Lane<'a, T>> {
        let short = Error::internal("normalization parameter size");
        Ok(match self {
            ParamIdx::Full => Lane::Full(p.get(..block).ok_or(short)?.iter()),
            ParamIdx::One => Lane::One(*p.first().ok_or(short)?),
            ParamIdx::Map(m) => Lane::Map(m.iter(), p),
        })
    }
}

/// A parameter's values along one normalized block, as an iterator.
enum Lane<'a, T> {
    Full(core::slice::Iter<'a, T>),
    One(T),
    Map(core::slice::Iter<'a, u32>, &'a [T]),
}

impl<T: Copy> Lane<'_, T> {
    /// Whether every position of the block got its value (an index out of
    /// range would have ended the lane early).
    fn done(&self) -> bool {
        match self {
            Lane::Full(it) => it.len() == 0,
            Lane::One(_) => true,
            Lane::Map(m, _) => m.len() == 0,
        }
    }
}

impl<T: Copy> Iterator for Lane<'_, T> {
    type Item = T;
    #[inline]
    fn next(&mut self) -> Option<T> {
        match self {
            Lane::Full(it) => it.next().copied(),
            Lane::One(v) => Some(*v),
            Lane::Map(m, p) => {
                // Advance only past an index in range, so `done` sees a bad one.
                let v = p.get(*m.as_slice().first()? as usize).copied()?;
                m.next();
                Some(v)
            }
        }
    }
}

/// Broadcasts a parameter shape `ps` against the normalized dims `tail`.
fn param_idx(ps: &[usize], tail: &[usize]) -> Result<ParamIdx> {
    let mut ps = ps;
    // Leading 1s beyond the block's rank broadcast over the outer dims.
    while ps.len() > tail.len() {
        match ps.split_first() {
            Some((1, rest)) => ps = rest,
            _ => break,
        }
    }
    if ps.len() > tail.len() {
        return Err(Error::new(ErrorKind::Unsupported(
            "normalization parameter varying over non-normalized axes",
        )));
    }
    // The trailing dims of the block that the parameter spans (wrapping:
    // ps.len() <= tail.len(), checked above).
    let off = tail.len().wrapping_sub(ps.len());
    let spanned = tail
        .get(off..)
        .ok_or(Error::internal("normalization parameter rank"))?;
    if ps.iter().zip(spanned).any(|(&p, &t)| p != 1 && p != t) {
        return Err(Error::new(ErrorKind::Shape(
            "normalization parameter does not broadcast to the normalized shape",
        )));
    }
    let block = checked_numel(tail)?;
    if ps == spanned {
        return Ok(ParamIdx::Full);
    }
    if ps.iter().all(|&p| p == 1) {
        return Ok(ParamIdx::One);
    }
    let mut map = Vec::with_capacity(block);
    for j in 0..block {
        // Multi-index of j over `tail`, folded into the parameter's index
        // (the dims before `spanned` do not move it). Each p is 1 or its
        // t, so pstride and idx stay within `block`: exact, wrapping.
        let (mut rem, mut idx, mut pstride) = (j, 0usize, 1usize);
        for (&t, &p) in spanned.iter().zip(ps).rev() {
            let (q, k) = util::div_rem(rem, t, "normalization parameter index")?;
            rem = q;
            if p != 1 {
                idx = idx.wrapping_add(k.wrapping_mul(pstride));
            }
            pstride = pstride.wrapping_mul(p);
        }
        map.push(u32::try_from(idx).map_err(|_| Error::new(ErrorKind::Overflow))?);
    }
    Ok(ParamIdx::Map(map))
}

/// Float element types of LayerNormalization / RMSNormalization, whose
/// statistics are computed in f64 (also the loss ops' scores).
pub(crate) use crate::ops::util::Float as Real;

use crate::ops::util::FLOATS;

/// (mean, 1/sqrt(var + eps)) of a block; with `rms`, mean is 0 and the
/// variance is the mean square.
#[inline]
fn row_stats_t<T: Real>(row: &[T], eps: f64, rms: bool) -> (f64, f64) {
    let cnt = row.len().max(1) as f64;
    // f64 sums keep the statistics independent of summation order.
    let mean = if rms {
        0.0
    } else {
        row.iter().map(|&v| v.to_f64()).sum::<f64>() / cnt
    };
    let var = row
        .iter()
        .map(|&v| {
            let d = v.to_f64() - mean;
            d * d
        })
        .sum::<f64>()
        / cnt;
    (mean, 1.0 / libm::sqrt(var + eps))
}

/// [`row_stats_t`] of an f32 block, rounded to f32.
#[inline]
fn row_stats(row: &[f32], eps: f32, rms: bool) -> (f32, f32) {
    let (m, i) = row_stats_t(row, eps as f64, rms);
    (m as f32, i as f32)
}

/// Runs `f` over one slice holding the input (copied to the output first
/// when not in place).
fn in_out<T: crate::Element>(
    io: &mut KernelIo<'_>,
    f: impl FnOnce(&mut [T]) -> Result<()>,
) -> Result<()> {
    match io.unary::<T>()? {
        Unary::InPlace(y) => f(y),
        Unary::Separate(x, y) => {
            if x.len() != y.len() {
                return Err(Error::new(ErrorKind::Len {
                    expected: y.len() as u64,
                    got: x.len() as u64,
                }));
            }
            y.copy_from_slice(x);
            f(y)
        }
    }
}

/// LayerNormalization / RMSNormalization over the trailing `block` elements.
#[derive(Debug)]
struct RowNorm {
    outer: usize,
    block: usize,
    eps: f64,
    rms: bool,
    scale: ParamIdx,
    bias: Option<ParamIdx>,
    /// Whether the Mean and InvStdDev outputs are wanted.
    stats: [bool; 2],
    dtype: DType,
}

impl RowNorm {
    fn apply<T: Real>(&self, y: &mut [T], s: &[T], b: Option<&[T]>) -> Result<()> {
        let block = self.block;
        if Some(y.len()) != self.outer.checked_mul(block) || !self.scale.fits(block, s.len()) {
            return Err(Error::new(ErrorKind::Internal("normalization size")));
        }
        let b = match (b, &self.bias) {
            (Some(b), Some(bi)) if bi.fits(block, b.len()) => Some((b, bi)),
            (None, None) => None,
            _ => return Err(Error::new(ErrorKind::Internal("normalization B size"))),
        };
        if block == 0 {
            return Ok(());
        }
        for blk in y.chunks_of_mut(block) {
            let (mean, inv) = row_stats_t(blk, self.eps, self.rms);
            let norm = |v: &T, sv: T| (v.to_f64() - mean) * inv * sv.to_f64();
            let mut sl = self.scale.lane(s, block)?;
            let ok = match b {
                Some((b, bi)) => {
                    let mut bl = bi.lane(b, block)?;
                    for ((v, sv), bv) in blk.iter_mut().zip(&mut sl).zip(&mut bl) {
                        *v = T::from_f64(norm(v, sv) + bv.to_f64());
                    }
                    bl.done()
                }
                None => {
                    for (v, sv) in blk.iter_mut().zip(&mut sl) {
                        *v = T::from_f64(norm(v, sv));
                    }
                    true
                }
            };
            if !ok || !sl.done() {
                return Err(Error::internal("normalization parameter index"));
            }
        }
        Ok(())
    }

    fn run(&self, io: &mut KernelIo<'_>) -> Result<()> {
        match self.dtype {
            DType::F64 => self.run_t::<f64>(io),
            DType::F16 => self.run_t::<half::f16>(io),
            DType::BF16 => self.run_t::<half::bf16>(io),
            _ => self.run_t::<f32>(io),
        }
    }

    fn run_t<T: Real>(&self, io: &mut KernelIo<'_>) -> Result<()> {
        let s = io.input_slice::<T>(1)?;
        let b = match self.bias {
            Some(_) => Some(io.input_slice::<T>(2)?),
            None => None,
        };
        if self.stats == [false, false] {
            return in_out::<T>(io, |y| self.apply(y, s, b));
        }
        // Not in place here (see prepare): x stays readable for the stats.
        let x = io.input_slice::<T>(0)?;
        {
            let y = io.output_slice::<T>(0)?;
            if y.len() != x.len() {
                return Err(Error::new(ErrorKind::Internal("normalization size")));
            }
            y.copy_from_slice(x);
            self.apply(y, s, b)?;
        }
        let block = self.block.max(1);
        // Output 1 is Mean, output 2 InvStdDev.
        for (&want, k) in self.stats.iter().zip(1..) {
            if !want {
                continue;
            }
            // stash_type 1: the statistics are f32 whatever X's type.
            let o = io.output_slice::<f32>(k)?;
            if o.len() != self.outer {
                return Err(Error::new(ErrorKind::Internal("normalization stats size")));
            }
            for (v, row) in o.iter_mut().zip(x.chunks(block)) {
                let (mean, inv) = row_stats_t(row, self.eps, self.rms);
                *v = if k == 1 { mean } else { inv } as f32;
            }
        }
        Ok(())
    }
}

/// Input `i`, of X's float dtype `dt`.
fn same_float<'a>(ctx: &PrepareCtx<'a>, i: usize, dt: DType) -> Result<&'a [usize]> {
    Ok(ctx.input_of(i, dt)?.shape)
}

/// Shared prepare of LayerNormalization (`rms` false) and RMSNormalization.
fn prepare_row_norm(ctx: &PrepareCtx<'_>, rms: bool, name: &'static str) -> Result<Prepared> {
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, FLOATS, name)?;
    let (xs, dt) = (x.shape, x.dtype);
    if xs.is_empty() {
        return Err(Error::new(ErrorKind::Rank {
            expected: 1,
            got: 0,
        }));
    }
    if ctx.attr_int("stash_type", 1)? != 1 {
        return Err(Error::new(ErrorKind::Unsupported(
            "normalization stash_type other than float",
        )));
    }
    let axis = util::axis(ctx.attr_int("axis", -1)?, xs.len(), "axis")?;
    let eps = ctx.attr_float("epsilon", 1e-5)? as f64;
    let (head, tail) = xs
        .split_at_checked(axis)
        .ok_or(Error::internal("normalization axis"))?;
    let scale = param_idx(same_float(ctx, 1, dt)?, tail)?;
    let bias = match (rms, ctx.opt_input(2)) {
        (false, Some(_)) => Some(param_idx(same_float(ctx, 2, dt)?, tail)?),
        _ => None,
    };
    let stats = if rms {
        [false, false]
    } else {
        [ctx.has_output(1), ctx.has_output(2)]
    };
    let rn = RowNorm {
        outer: checked_numel(head)?,
        block: checked_numel(tail)?,
        eps,
        rms,
        scale,
        bias,
        stats,
        dtype: dt,
    };
    let mut outs = vec![OutputInfo::new(dt, xs)];
    if stats != [false, false] {
        let mut st: Vec<usize> = head.to_vec();
        st.resize(xs.len(), 1);
        for want in stats {
            // An absent Mean still takes its slot so InvStdDev stays output 2.
            outs.push(OutputInfo::new(DType::F32, if want { &st } else { &[] }));
        }
    }
    let p = Prepared::new(outs, kernel(name, move |io| rn.run(io)));
    Ok(if stats == [false, false] {
        p.in_place()
    } else {
        p
    })
}

fn prepare_layer_norm(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_row_norm(ctx, false, "LayerNormalization")
}

fn prepare_rms_norm(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_row_norm(ctx, true, "RMSNormalization")
}

fn prepare_group_norm(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let xs = f32_input(ctx, 0, "GroupNormalization X")?;
    let (n, c, inner) = nc_inner(xs)?;
    if ctx.attr_int("stash_type", 1)? != 1 {
        return Err(Error::new(ErrorKind::Unsupported(
            "GroupNormalization stash_type other than float",
        )));
    }
    let g = ctx.attr_int("num_groups", 0)?;
    if g < 1 || !util::divides(c, g as usize) {
        return Err(Error::new(ErrorKind::Attribute {
            name: "num_groups",
            problem: "required, positive, and must divide the channel count",
        }));
    }
    let g = g as usize;
    // Opset 18 has one scale/bias per group, opset 21 one per channel.
    let per_channel = ctx.opset >= 21;
    let plen = if per_channel { c } else { g };
    check_vec(f32_input(ctx, 1, "GroupNormalization scale")?, plen)?;
    check_vec(f32_input(ctx, 2, "GroupNormalization bias")?, plen)?;
    let eps = ctx.attr_float("epsilon", 1e-5)?;
    let cpg = util::div(c, g, "GroupNormalization num_groups")?;
    // One group: cpg · inner <= c · inner, which fits (nc_inner).
    let gsize = cpg.wrapping_mul(inner);
    Ok(Prepared::single(
        DType::F32,
        xs,
        kernel("GroupNormalization", move |io| {
            let s = io.input_slice::<f32>(1)?;
            let b = io.input_slice::<f32>(2)?;
            in_out_f32(io, |y| {
                if Some(y.len()) != len3(n, c, inner) || s.len() != plen || b.len() != plen {
                    return Err(Error::new(ErrorKind::Internal("GroupNormalization size")));
                }
                if gsize == 0 {
                    return Ok(());
                }
                const P: &str = "GroupNormalization size";
                for (gi, blk) in y.chunks_of_mut(gsize).enumerate() {
                    let (mean, inv) = row_stats(blk, eps, false);
                    let grp = util::rem(gi, g, P)?;
                    if per_channel {
                        // One (scale, bias) per channel plane of the group;
                        // inner > 0 as gsize > 0. grp < g and g · cpg = c:
                        // the group's first channel is exact, wrapping.
                        let c0 = grp.wrapping_mul(cpg);
                        let sg = win(s, c0, cpg).ok_or(Error::internal(P))?;
                        let bg = win(b, c0, cpg).ok_or(Error::internal(P))?;
                        for ((plane, &sv), &bv) in blk.chunks_of_mut(inner).zip(sg).zip(bg) {
                            for v in plane {
                                *v = (*v - mean) * inv * sv + bv;
                            }
                        }
                    } else {
                        let (sv, bv) = (at(s, grp, P)?, at(b, grp, P)?);
                        for v in blk.iter_mut() {
                            *v = (*v - mean) * inv * sv + bv;
                        }
                    }
                }
                Ok(())
            })
        }),
    )
    .in_place())
}

fn prepare_lp_norm(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let xs = f32_input(ctx, 0, "LpNormalization input")?;
    if xs.is_empty() {
        return Err(Error::new(ErrorKind::Rank {
            expected: 1,
            got: 0,
        }));
    }
    let p = ctx.attr_int("p", 2)?;
    if p != 1 && p != 2 {
        return Err(Error::new(ErrorKind::Attribute {
            name: "p",
            problem: "must be 1 or 2",
        }));
    }
    let a = util::axis(ctx.attr_int("axis", -1)?, xs.len(), "axis")?;
    let (outer, n, inner) = around_axis(xs, a)?;
    Ok(Prepared::single(
        DType::F32,
        xs,
        kernel("LpNormalization", move |io| {
            in_out_f32(io, |y| {
                if Some(y.len()) != len3(outer, n, inner) {
                    return Err(Error::new(ErrorKind::Internal("LpNormalization size")));
                }
                // An empty y (n * inner == 0) has no blocks.
                for blk in y.chunks_of_mut(block_len(n, inner, "LpNormalization size")?) {
                    for i in 0..inner {
                        let mut acc = 0.0f64;
                        for &v in column(blk, i, inner) {
                            let v = v as f64;
                            acc += if p == 1 { v.abs() } else { v * v };
                        }
                        let norm = if p == 1 {
                            acc as f32
                        } else {
                            math::sqrt(acc as f32)
                        };
                        for v in column_mut(blk, i, inner) {
                            // A zero norm gives 0, not 0/0.
                            *v = if norm == 0.0 { 0.0 } else { *v / norm };
                        }
                    }
                }
                Ok(())
            })
        }),
    )
    .in_place())
}

fn prepare_mvn(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let xs = f32_input(ctx, 0, "MeanVarianceNormalization input")?;
    let r = xs.len();
    if r > MAX_RANK {
        return Err(Error::new(ErrorKind::Unsupported(
            "MeanVarianceNormalization rank above MAX_RANK",
        )));
    }
    let mut reduced = [false; MAX_RANK];
    let reduce = |reduced: &mut [bool; MAX_RANK], a: usize| -> Result<()> {
        // a < r <= MAX_RANK.
        *reduced
            .get_mut(a)
            .ok_or(Error::internal("MeanVarianceNormalization axes"))? = true;
        Ok(())
    };
    match ctx.attr_ints("axes")? {
        Some(ax) => {
            for &a in ax {
                reduce(&mut reduced, util::axis(a, r, "axes")?)?;
            }
        }
        None => {
            for a in [0usize, 2, 3] {
                if a >= r {
                    return Err(Error::new(ErrorKind::Attribute {
                        name: "axes",
                        problem: "default axes [0, 2, 3] need a rank-4 input",
                    }));
                }
                reduce(&mut reduced, a)?;
            }
        }
    }
    // (size, stride in the index of its (mean, var) group) of each axis;
    // the stride is 0 on reduced axes.
    let mut odo = vec![(0usize, 0usize); r];
    let mut groups = 1usize;
    for (((dim, ks), &red), &x) in odo.iter_mut().zip(&reduced).zip(xs).rev() {
        *dim = x;
        if !red {
            *ks = groups;
            groups = groups
                .checked_mul(x)
                .ok_or(Error::new(ErrorKind::Overflow))?;
        }
    }
    let numel = checked_numel(xs)?;
    // (sum, sum of squares) per group, in f64.
    let acc_len = groups
        .checked_mul(2)
        .ok_or(Error::new(ErrorKind::Overflow))?;
    let per_group = numel.checked_div(groups).unwrap_or(0).max(1) as f64;
    Ok(Prepared::single(
        DType::F32,
        xs,
        kernel("MeanVarianceNormalization", move |io| {
            let x = io.input_slice::<f32>(0)?;
            let (y, scratch) = io.output_and_scratch(0)?;
            let y = y.into_slice::<f32>()?;
            // (sum, sum of squares) of each group, then (mean, 1 / std).
            let acc: &mut [f64] = bytemuck::try_cast_slice_mut(scratch)
                .map_err(|_| Error::new(ErrorKind::Internal("scratch alignment")))?;
            let size = || Error::new(ErrorKind::Internal("MeanVarianceNormalization size"));
            if x.len() != numel || y.len() != numel {
                return Err(size());
            }
            let acc: &mut [[f64; 2]] =
                bytemuck::try_cast_slice_mut(acc.get_mut(..acc_len).ok_or_else(size)?)
                    .map_err(|_| size())?;
            acc.fill([0.0; 2]);
            for (&v, g) in x.iter().zip(group_walk(&odo)) {
                let [sum, sq] = acc.get_mut(g).ok_or_else(size)?;
                let v = v as f64;
                *sum += v;
                *sq += v * v;
            }
            for [sum, sq] in acc.iter_mut() {
                let mean = *sum / per_group;
                let var = (*sq / per_group - mean * mean).max(0.0);
                *sum = mean;
                // Reciprocal of (std + 1e-9), as in the ONNX function body.
                *sq = 1.0 / (math::sqrt(var as f32) as f64 + 1e-9);
            }
            for ((o, &v), g) in y.iter_mut().zip(x).zip(group_walk(&odo)) {
                let &[mean, inv] = acc.get(g).ok_or_else(size)?;
                *o = ((v as f64 - mean) * inv) as f32;
            }
            Ok(())
        }),
    )
    // Saturating: a scratch past usize::MAX fails planning.
    .with_scratch(acc_len.saturating_mul(8)))
}

/// The group of every element in order, by odometer over the shape; `odo`
/// holds (size, group stride) per axis. Endless: zip it with the elements.
///
/// Wrapping: each index stays below its size (`*i + 1 <= dim`), and after
/// every step `grp` is the group of the next element (`< groups`, or 0
/// after the last), which wrapping sums and products reach exactly.
fn group_walk(odo: &[(usize, usize)]) -> impl Iterator<Item = usize> + '_ {
    let mut idx = [0usize; MAX_RANK];
    let mut grp = 0usize;
    core::iter::from_fn(move || {
        let g = grp;
        for (i, &(dim, ks)) in idx.iter_mut().zip(odo).rev() {
            *i = i.wrapping_add(1);
            grp = grp.wrapping_add(ks);
            if *i < dim {
                break;
            }
            grp = grp.wrapping_sub(ks.wrapping_mul(*i));
            *i = 0;
        }
        Some(g)
    })
}

#[cfg(test)]
mod tests {
    use crate::math;
    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;

    /// Uniform in [-2, 2).
    fn rnd(n: usize, seed: u64) -> Vec<f32> {
        crate::ops::testing::rnd(n, seed)
            .into_iter()
            .map(|v| v * 2.0)
            .collect()
    }

    fn naive_softmax(x: &[f32], outer: usize, n: usize, inner: usize, log: bool) -> Vec<f32> {
        let mut y = x.to_vec();
        for o in 0..outer {
            for i in 0..inner {
                let idx = |j: usize| o * n * inner + j * inner + i;
                let mx = (0..n).map(|j| x[idx(j)]).fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = (0..n).map(|j| math::exp(x[idx(j)] - mx)).sum();
                for j in 0..n {
                    let e = math::exp(x[idx(j)] - mx);
                    y[idx(j)] = if log {
                        x[idx(j)] - mx - math::ln(sum)
                    } else {
                        e / sum
                    };
                }
            }
        }
        y
    }

    #[test]
    fn softmax_both_opsets() {
        let sh = [2, 3, 4];
        let x = rnd(24, 1);
        for log in [false, true] {
            let op = if log { "LogSoftmax" } else { "Softmax" };
            // opset 13: along an axis.
            for (axis, dims) in [
                (-1i64, (6, 4, 1)),
                (1, (2, 3, 4)),
                (0, (1, 2, 12)),
                (-2, (2, 3, 4)),
            ] {
                let r = run(
                    op,
                    13,
                    vec![("axis", AttrValue::Int(axis))],
                    &[t(&sh, &x)],
                    1,
                )
                .unwrap();
                assert_eq!(r[0].shape, vec![2, 3, 4]);
                assert_close(
                    &vals::<f32>(&r[0]),
                    &naive_softmax(&x, dims.0, dims.1, dims.2, log),
                    1e-6,
                );
            }
            let r = run(op, 13, vec![], &[t(&sh, &x)], 1).unwrap();
            assert_close(&vals::<f32>(&r[0]), &naive_softmax(&x, 6, 4, 1, log), 1e-6);
            // opset 11: coerced to 2-D at axis (default 1).
            let r = run(op, 11, vec![], &[t(&sh, &x)], 1).unwrap();
            assert_close(&vals::<f32>(&r[0]), &naive_softmax(&x, 2, 12, 1, log), 1e-6);
            for (axis, dims) in [
                (0i64, (1, 24, 1)),
                (2, (6, 4, 1)),
                (-1, (6, 4, 1)),
                (3, (24, 1, 1)),
            ] {
                let r = run(
                    op,
                    11,
                    vec![("axis", AttrValue::Int(axis))],
                    &[t(&sh, &x)],
                    1,
                )
                .unwrap();
                assert_close(
                    &vals::<f32>(&r[0]),
                    &naive_softmax(&x, dims.0, dims.1, dims.2, log),
                    1e-6,
                );
            }
        }
        // Stability on large inputs.
        let r = run(
            "Softmax",
            13,
            vec![],
            &[t(&[3], &[1000.0f32, 1000.0, 1000.0])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[1.0 / 3.0; 3], 1e-6);
        let r = run("LogSoftmax", 13, vec![], &[t(&[2], &[1000.0f32, 0.0])], 1).unwrap();
        assert_close(&vals::<f32>(&r[0]), &[0.0, -1000.0], 1e-4);
        assert!(run(
            "Softmax",
            13,
            vec![("axis", AttrValue::Int(3))],
            &[t(&sh, &x)],
            1
        )
        .is_err());
    }

    #[test]
    fn softmax_other_float_types() {
        // f64: softmax of [0, ln 3] is exactly [1/4, 3/4].
        let r = run("Softmax", 13, vec![], &[t(&[2], &[0.0f64, 3.0f64.ln()])], 1).unwrap();
        let got = vals::<f64>(&r[0]);
        assert!((got[0] - 0.25).abs() < 1e-12 && (got[1] - 0.75).abs() < 1e-12);
        let r = run(
            "LogSoftmax",
            13,
            vec![],
            &[t(&[2], &[0.0f64, 3.0f64.ln()])],
            1,
        )
        .unwrap();
        assert!((vals::<f64>(&r[0])[0] + 4.0f64.ln()).abs() < 1e-12);
        // f16, opset 11 coerced to 2-D at axis 1.
        let x = rnd(6, 30);
        let xh: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
        let xr: Vec<f32> = xh.iter().map(|v| v.to_f32()).collect();
        let r = run("Softmax", 11, vec![], &[t(&[2, 3], &xh)], 1).unwrap();
        let got: Vec<f32> = vals::<half::f16>(&r[0])
            .iter()
            .map(|v| v.to_f32())
            .collect();
        assert_close(&got, &naive_softmax(&xr, 2, 3, 1, false), 1e-3);
    }

    #[test]
    fn batchnorm_inference() {
        let (n, c, hw) = (2, 3, 5);
        let x = rnd(n * c * hw, 2);
        let s = rnd(c, 3);
        let b = rnd(c, 4);
        let m = rnd(c, 5);
        let v: Vec<f32> = rnd(c, 6).iter().map(|v| v.abs() + 0.1).collect();
        let eps = 1e-3;
        let mut want = vec![0.0; x.len()];
        for i in 0..n {
            for ch in 0..c {
                for k in 0..hw {
                    let idx = (i * c + ch) * hw + k;
                    want[idx] = s[ch] * (x[idx] - m[ch]) / math::sqrt(v[ch] + eps) + b[ch];
                }
            }
        }
        for opset in [7, 9, 14, 15] {
            let r = run(
                "BatchNormalization",
                opset,
                vec![("epsilon", AttrValue::Float(eps))],
                &[
                    t(&[n, c, hw], &x),
                    t(&[c], &s),
                    t(&[c], &b),
                    t(&[c], &m),
                    t(&[c], &v),
                ],
                1,
            )
            .unwrap();
            assert_eq!(r[0].shape, vec![n, c, hw]);
            assert_close(&vals::<f32>(&r[0]), &want, 1e-5);
        }
        // Training mode: batch statistics per channel, running stats
        // updated with momentum.
        let mom = 0.8f32;
        let r = run(
            "BatchNormalization",
            15,
            vec![
                ("training_mode", AttrValue::Int(1)),
                ("epsilon", AttrValue::Float(eps)),
                ("momentum", AttrValue::Float(mom)),
            ],
            &[
                t(&[n, c, hw], &x),
                t(&[c], &s),
                t(&[c], &b),
                t(&[c], &m),
                t(&[c], &v),
            ],
            3,
        )
        .unwrap();
        let mut want = vec![0.0; x.len()];
        let (mut want_m, mut want_v) = (Vec::new(), Vec::new());
        for ch in 0..c {
            let vs: Vec<f32> = (0..n)
                .flat_map(|i| x[(i * c + ch) * hw..][..hw].to_vec())
                .collect();
            let bm = vs.iter().sum::<f32>() / vs.len() as f32;
            let bv = vs.iter().map(|v| (v - bm) * (v - bm)).sum::<f32>() / vs.len() as f32;
            for i in 0..n {
                for k in 0..hw {
                    let idx = (i * c + ch) * hw + k;
                    want[idx] = s[ch] * (x[idx] - bm) / math::sqrt(bv + eps) + b[ch];
                }
            }
            want_m.push(m[ch] * mom + bm * (1.0 - mom));
            want_v.push(v[ch] * mom + bv * (1.0 - mom));
        }
        assert_close(&vals::<f32>(&r[0]), &want, 1e-5);
        assert_eq!(r[1].shape, vec![c]);
        assert_close(&vals::<f32>(&r[1]), &want_m, 1e-6);
        assert_close(&vals::<f32>(&r[2]), &want_v, 1e-6);
        assert!(run(
            "BatchNormalization",
            9,
            vec![("training_mode", AttrValue::Int(1))],
            &[
                t(&[n, c, hw], &x),
                t(&[c], &s),
                t(&[c], &b),
                t(&[c], &m),
                t(&[c], &v),
            ],
            1,
        )
        .is_err());
        let r = run(
            "BatchNormalization",
            15,
            vec![],
            &[
                t(&[n, c, hw], &x),
                t(&[c + 1], &rnd(c + 1, 1)),
                t(&[c], &b),
                t(&[c], &m),
                t(&[c], &v),
            ],
            1,
        );
        assert!(r.is_err());
    }

    #[test]
    fn lrn_window() {
        let (n, c, hw) = (2, 6, 3);
        let x = rnd(n * c * hw, 7);
        for size in [1usize, 2, 3, 4, 5] {
            let (alpha, beta, bias) = (0.02f32, 0.6f32, 1.5f32);
            let mut want = vec![0.0; x.len()];
            for i in 0..n {
                for ch in 0..c {
                    let lo = ch as i64 - ((size as i64 - 1) / 2);
                    let hi = ch as i64 + (size as i64) / 2;
                    for k in 0..hw {
                        let mut sum = 0.0;
                        for cc in lo.max(0)..=hi.min(c as i64 - 1) {
                            let v = x[(i * c + cc as usize) * hw + k];
                            sum += v * v;
                        }
                        let idx = (i * c + ch) * hw + k;
                        want[idx] = x[idx] / math::pow(bias + alpha / size as f32 * sum, beta);
                    }
                }
            }
            let attrs = vec![
                ("size", AttrValue::Int(size as i64)),
                ("alpha", AttrValue::Float(alpha)),
                ("beta", AttrValue::Float(beta)),
                ("bias", AttrValue::Float(bias)),
            ];
            let r = run("LRN", 13, attrs, &[t(&[n, c, hw], &x)], 1).unwrap();
            assert_close(&vals::<f32>(&r[0]), &want, 1e-6);
        }
        assert!(run("LRN", 13, vec![], &[t(&[n, c, hw], &x)], 1).is_err());
    }

    fn naive_norm(x: &[f32], eps: f32) -> Vec<f32> {
        let cnt = x.len() as f32;
        let mean = x.iter().sum::<f32>() / cnt;
        let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / cnt;
        x.iter()
            .map(|v| (v - mean) / math::sqrt(var + eps))
            .collect()
    }

    #[test]
    fn instance_and_layer_norm() {
        let (n, c, hw) = (2, 3, 8);
        let x = rnd(n * c * hw, 8);
        let s = rnd(c, 9);
        let b = rnd(c, 10);
        let mut want = Vec::new();
        for blk in 0..n * c {
            let ch = blk % c;
            want.extend(
                naive_norm(&x[blk * hw..(blk + 1) * hw], 1e-5)
                    .iter()
                    .map(|v| v * s[ch] + b[ch]),
            );
        }
        let r = run(
            "InstanceNormalization",
            6,
            vec![],
            &[t(&[n, c, hw], &x), t(&[c], &s), t(&[c], &b)],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &want, 1e-5);

        // LayerNorm over the last axis and over the last two.
        let ls = rnd(hw, 11);
        let lb = rnd(hw, 12);
        let mut want = Vec::new();
        for blk in 0..n * c {
            want.extend(
                naive_norm(&x[blk * hw..(blk + 1) * hw], 1e-5)
                    .iter()
                    .enumerate()
                    .map(|(j, v)| v * ls[j] + lb[j]),
            );
        }
        let r = run(
            "LayerNormalization",
            17,
            vec![],
            &[t(&[n, c, hw], &x), t(&[hw], &ls), t(&[hw], &lb)],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &want, 1e-5);
        let ls2 = rnd(c * hw, 13);
        let mut want = Vec::new();
        for blk in 0..n {
            let w = c * hw;
            want.extend(
                naive_norm(&x[blk * w..(blk + 1) * w], 1e-3)
                    .iter()
                    .enumerate()
                    .map(|(j, v)| v * ls2[j]),
            );
        }
        let r = run(
            "LayerNormalization",
            17,
            vec![
                ("axis", AttrValue::Int(1)),
                ("epsilon", AttrValue::Float(1e-3)),
            ],
            &[t(&[n, c, hw], &x), t(&[c, hw], &ls2)],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &want, 1e-5);
    }

    #[test]
    fn rms_norm_by_hand() {
        // Rows [3, 4] and [0, 0]: rms 5/sqrt(2), and 0 (-> sqrt(eps)).
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let w = [1.0f32, 2.0];
        let r = run(
            "RMSNormalization",
            23,
            vec![("epsilon", AttrValue::Float(0.0))],
            &[t(&[2, 2], &x), t(&[2], &w)],
            1,
        )
        .unwrap();
        let k = math::sqrt(2.0) / 5.0;
        let got = vals::<f32>(&r[0]);
        assert_close(&got[..2], &[3.0 * k, 8.0 * k], 1e-6);
        assert!(got[2].is_nan());
        // axis 0 with a scalar-broadcast scale [1, 1] and default epsilon.
        let r = run(
            "RMSNormalization",
            23,
            vec![("axis", AttrValue::Int(0))],
            &[t(&[2, 2], &x), t(&[1, 1], &[2.0f32])],
            1,
        )
        .unwrap();
        let inv = 1.0 / math::sqrt(25.0 / 4.0 + 1e-5);
        assert_close(&vals::<f32>(&r[0]), &[6.0 * inv, 8.0 * inv, 0.0, 0.0], 1e-6);
        assert!(run(
            "RMSNormalization",
            23,
            vec![("stash_type", AttrValue::Int(0))],
            &[t(&[2, 2], &x), t(&[2], &w)],
            1,
        )
        .is_err());
    }

    #[test]
    fn layer_norm_stats_and_partial_broadcast() {
        // Rows [1, 3] and [2, 6]: means 2 and 4, variances 1 and 4.
        let x = [1.0f32, 3.0, 2.0, 6.0];
        let r = run(
            "LayerNormalization",
            17,
            vec![("epsilon", AttrValue::Float(0.0))],
            &[
                t(&[2, 2], &x),
                t(&[2], &[1.0f32, 10.0]),
                t(&[2], &[0.5f32, 0.0]),
            ],
            3,
        )
        .unwrap();
        assert_eq!(r.len(), 3);
        assert_close(&vals::<f32>(&r[0]), &[-0.5, 10.0, -0.5, 10.0], 1e-6);
        assert_eq!(r[1].shape, vec![2, 1]);
        assert_close(&vals::<f32>(&r[1]), &[2.0, 4.0], 0.0);
        assert_eq!(r[2].shape, vec![2, 1]);
        assert_close(&vals::<f32>(&r[2]), &[1.0, 0.5], 1e-7);
        // Scale [2, 1] over a normalized [2, 2] block: one value per row.
        let x = rnd(8, 21);
        let s = [2.0f32, -1.0];
        let r = run(
            "LayerNormalization",
            17,
            vec![("axis", AttrValue::Int(1))],
            &[t(&[2, 2, 2], &x), t(&[2, 1], &s)],
            1,
        )
        .unwrap();
        let mut want = Vec::new();
        for blk in x.chunks(4) {
            let nrm = naive_norm(blk, 1e-5);
            want.extend(nrm.iter().enumerate().map(|(j, v)| v * s[j / 2]));
        }
        assert_close(&vals::<f32>(&r[0]), &want, 1e-5);
        // A scale varying over the outer (not normalized) axis is refused.
        assert!(run(
            "LayerNormalization",
            17,
            vec![],
            &[t(&[2, 2, 2], &x), t(&[2, 1, 2], &rnd(4, 1))],
            1,
        )
        .is_err());
    }

    #[test]
    fn row_norms_other_float_types() {
        // f64 natively: rows [1, 3] and [2, 6] normalize to [-1, 1] exactly
        // (eps 0); Mean and InvStdDev stay f32.
        let r = run(
            "LayerNormalization",
            17,
            vec![("epsilon", AttrValue::Float(0.0))],
            &[
                t(&[2, 2], &[1.0f64, 3.0, 2.0, 6.0]),
                t(&[2], &[1.0f64, 2.0]),
            ],
            3,
        )
        .unwrap();
        assert_eq!(vals::<f64>(&r[0]), vec![-1.0, 2.0, -1.0, 2.0]);
        assert_eq!(r[1].dtype, crate::DType::F32);
        assert_eq!(vals::<f32>(&r[2]), vec![1.0, 0.5]);
        // f16 RMSNorm: row [3, 4] has rms 5/sqrt(2).
        let h = |v: f32| half::f16::from_f32(v);
        let r = run(
            "RMSNormalization",
            23,
            vec![("epsilon", AttrValue::Float(0.0))],
            &[t(&[1, 2], &[h(3.0), h(4.0)]), t(&[2], &[h(1.0), h(1.0)])],
            1,
        )
        .unwrap();
        let got: Vec<f32> = vals::<half::f16>(&r[0])
            .iter()
            .map(|v| v.to_f32())
            .collect();
        let k = math::sqrt(2.0) / 5.0;
        assert_close(&got, &[3.0 * k, 4.0 * k], 1e-3);
        // Scale must share X's type.
        assert!(run(
            "RMSNormalization",
            23,
            vec![],
            &[t(&[1, 2], &[h(3.0), h(4.0)]), t(&[2], &[1.0f32, 1.0])],
            1,
        )
        .is_err());
    }

    #[test]
    fn group_norm_opsets() {
        let (n, c, hw, g) = (2, 4, 3, 2);
        let x = rnd(n * c * hw, 22);
        let sc = rnd(c, 23);
        let bc = rnd(c, 24);
        let mut want21 = Vec::new();
        let mut want18 = Vec::new();
        for (gi, blk) in x.chunks(c / g * hw).enumerate() {
            let nrm = naive_norm(blk, 1e-5);
            for (j, v) in nrm.iter().enumerate() {
                let ch = (gi % g) * (c / g) + j / hw;
                want21.push(v * sc[ch] + bc[ch]);
                want18.push(v * sc[gi % g] + bc[gi % g]);
            }
        }
        let attrs = || vec![("num_groups", AttrValue::Int(g as i64))];
        let r = run(
            "GroupNormalization",
            21,
            attrs(),
            &[t(&[n, c, hw], &x), t(&[c], &sc), t(&[c], &bc)],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &want21, 1e-5);
        let r = run(
            "GroupNormalization",
            18,
            attrs(),
            &[t(&[n, c, hw], &x), t(&[g], &sc[..g]), t(&[g], &bc[..g])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &want18, 1e-5);
        assert!(run(
            "GroupNormalization",
            21,
            vec![("num_groups", AttrValue::Int(3))],
            &[t(&[n, c, hw], &x), t(&[c], &sc), t(&[c], &bc)],
            1,
        )
        .is_err());
    }

    #[test]
    fn lp_norm() {
        let x = [3.0f32, -4.0, 0.0, 0.0];
        let r = run("LpNormalization", 22, vec![], &[t(&[2, 2], &x)], 1).unwrap();
        assert_close(&vals::<f32>(&r[0]), &[0.6, -0.8, 0.0, 0.0], 1e-7);
        let r = run(
            "LpNormalization",
            1,
            vec![("p", AttrValue::Int(1)), ("axis", AttrValue::Int(0))],
            &[t(&[2, 2], &[1.0f32, -4.0, 3.0, 4.0])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[0.25, -0.5, 0.75, 0.5], 1e-7);
        assert!(run(
            "LpNormalization",
            1,
            vec![("p", AttrValue::Int(3))],
            &[t(&[2, 2], &x)],
            1
        )
        .is_err());
    }

    #[test]
    fn mvn_axes() {
        // Default axes [0, 2, 3]: one group per channel.
        let (n, c, h, w) = (2, 3, 2, 2);
        let x = rnd(n * c * h * w, 25);
        let r = run(
            "MeanVarianceNormalization",
            13,
            vec![],
            &[t(&[n, c, h, w], &x)],
            1,
        )
        .unwrap();
        let mut want = vec![0.0f32; x.len()];
        for ch in 0..c {
            let idx: Vec<usize> = (0..n)
                .flat_map(|i| (0..h * w).map(move |k| (i * c + ch) * h * w + k))
                .collect();
            let vs: Vec<f32> = idx.iter().map(|&i| x[i]).collect();
            let nrm = naive_norm(&vs, 0.0);
            for (k, &i) in idx.iter().enumerate() {
                want[i] = nrm[k];
            }
        }
        assert_close(&vals::<f32>(&r[0]), &want, 1e-5);
        // axes [1]: normalize along channels.
        let r = run(
            "MeanVarianceNormalization",
            13,
            vec![("axes", AttrValue::Ints(vec![1]))],
            &[t(&[2, 3], &[1.0f32, 2.0, 3.0, 5.0, 5.0, 5.0])],
            1,
        )
        .unwrap();
        let s = math::sqrt(2.0 / 3.0);
        assert_close(
            &vals::<f32>(&r[0]),
            &[-1.0 / s, 0.0, 1.0 / s, 0.0, 0.0, 0.0],
            1e-5,
        );
        assert!(run(
            "MeanVarianceNormalization",
            13,
            vec![],
            &[t(&[2, 3], &x[..6])],
            1
        )
        .is_err());
    }

    #[test]
    fn batchnorm_narrow_floats_accumulate_in_f32() {
        use crate::ops::testing::{float_types_agree, rnd};
        let x = rnd(2 * 4 * 5, 61);
        let s = rnd(4, 62);
        let b = rnd(4, 63);
        let mean = rnd(4, 64);
        let var: Vec<f32> = rnd(4, 65).iter().map(|v| v.abs() + 0.5).collect();
        float_types_agree(
            "BatchNormalization",
            15,
            vec![],
            &[
                (&[2, 4, 5], &x),
                (&[4], &s),
                (&[4], &b),
                (&[4], &mean),
                (&[4], &var),
            ],
            1e-5,
        );
    }
}
