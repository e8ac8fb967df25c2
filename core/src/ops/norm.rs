//! Normalization operators: BatchNormalization (inference), LRN, Softmax,
//! LogSoftmax, InstanceNormalization, LayerNormalization.

use crate::error::{Error, ErrorKind, Result};
use crate::math;
use crate::ops::{kernel, util, KernelIo, OpDef, PrepareCtx, Prepared, Unary};
use crate::DType;
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
];

fn f32_input<'a>(ctx: &PrepareCtx<'a>, i: usize, what: &'static str) -> Result<&'a [usize]> {
    let x = ctx.input(i)?;
    util::dtype_in(x.dtype, &[DType::F32], what)?;
    Ok(x.shape)
}

/// Runs `f` over one slice holding the input (copied to the output first
/// when not in place).
fn in_out_f32(io: &mut KernelIo<'_>, f: impl FnOnce(&mut [f32]) -> Result<()>) -> Result<()> {
    match io.unary::<f32>()? {
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

fn check_vec(shape: &[usize], c: usize) -> Result<()> {
    if shape.iter().product::<usize>() != c || shape.len() > 1 {
        return Err(Error::new(ErrorKind::Shape(
            "per-channel parameter must have shape (C)",
        )));
    }
    Ok(())
}

fn prepare_batchnorm(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let xs = f32_input(ctx, 0, "BatchNormalization X")?;
    if ctx.attr_int("training_mode", 0)? != 0 {
        return Err(Error::new(ErrorKind::Unsupported(
            "BatchNormalization training_mode=1",
        )));
    }
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
    if xs.len() < 2 {
        return Err(Error::new(ErrorKind::Rank {
            expected: 2,
            got: xs.len(),
        }));
    }
    let c = xs[1];
    let n = xs[0];
    let inner: usize = xs[2..].iter().product();
    for (i, what) in [
        (1, "BatchNormalization scale"),
        (2, "BatchNormalization B"),
        (3, "BatchNormalization mean"),
        (4, "BatchNormalization var"),
    ] {
        check_vec(f32_input(ctx, i, what)?, c)?;
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
            let mut a = Vec::with_capacity(c);
            let mut b = Vec::with_capacity(c);
            for ch in 0..c {
                let av = s[ch] / math::sqrt(var[ch] + eps);
                a.push(av);
                b.push(bb[ch] - mean[ch] * av);
            }
            Some((a, b))
        }
        _ => None,
    };
    Ok(Prepared::single(
        DType::F32,
        xs,
        kernel("BatchNormalization", move |io| {
            let params = match &folded {
                Some(_) => None,
                None => Some((
                    io.input_slice::<f32>(1)?,
                    io.input_slice::<f32>(2)?,
                    io.input_slice::<f32>(3)?,
                    io.input_slice::<f32>(4)?,
                )),
            };
            in_out_f32(io, |y| {
                if y.len() != n * c * inner {
                    return Err(Error::new(ErrorKind::Internal("BatchNormalization size")));
                }
                for ch in 0..c {
                    let (a, b) = match (&folded, params) {
                        (Some((fa, fb)), _) => (fa[ch], fb[ch]),
                        (None, Some((s, bb, mean, var))) => {
                            let a = s[ch] / math::sqrt(var[ch] + eps);
                            (a, bb[ch] - mean[ch] * a)
                        }
                        _ => {
                            return Err(Error::new(ErrorKind::Internal(
                                "BatchNormalization params",
                            )))
                        }
                    };
                    for img in 0..n {
                        let base = (img * c + ch) * inner;
                        for v in &mut y[base..base + inner] {
                            *v = a * *v + b;
                        }
                    }
                }
                Ok(())
            })
        }),
    )
    .in_place())
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
    if xs.len() < 2 {
        return Err(Error::new(ErrorKind::Rank {
            expected: 2,
            got: xs.len(),
        }));
    }
    let (n, c) = (xs[0], xs[1]);
    let inner: usize = xs[2..].iter().product();
    let size = size as usize;
    let lo = (size - 1) / 2;
    let hi = size - 1 - lo; // ceil((size-1)/2)
    let scale = alpha / size as f32;
    Ok(Prepared::single(
        DType::F32,
        xs,
        kernel("LRN", move |io| {
            let x = io.input_slice::<f32>(0)?;
            let y = io.output_slice::<f32>(0)?;
            if x.len() != n * c * inner || y.len() != x.len() {
                return Err(Error::new(ErrorKind::Internal("LRN size")));
            }
            for img in 0..n {
                let xb = &x[img * c * inner..(img + 1) * c * inner];
                let yb = &mut y[img * c * inner..(img + 1) * c * inner];
                for ch in 0..c {
                    let c0 = ch.saturating_sub(lo);
                    let c1 = (ch + hi).min(c - 1);
                    for s in 0..inner {
                        let mut sum = 0.0f32;
                        for cc in c0..=c1 {
                            let v = xb[cc * inner + s];
                            sum += v * v;
                        }
                        let xv = xb[ch * inner + s];
                        yb[ch * inner + s] = xv / math::pow(bias + scale * sum, beta);
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
        let v = if a < 0 { a + r_i } else { a };
        if v < 0 || v > r_i {
            return Err(Error::new(ErrorKind::Attribute {
                name: "axis",
                problem: "axis out of range",
            }));
        }
        let v = v as usize;
        Ok((shape[..v].iter().product(), shape[v..].iter().product(), 1))
    } else {
        if r == 0 {
            return Ok((1, 1, 1));
        }
        let a = util::axis(ctx.attr_int("axis", -1)?, r, "axis")?;
        Ok((
            shape[..a].iter().product(),
            shape[a],
            shape[a + 1..].iter().product(),
        ))
    }
}

fn softmax_common(ctx: &PrepareCtx<'_>, log: bool, name: &'static str) -> Result<Prepared> {
    let xs = f32_input(ctx, 0, name)?;
    let (outer, n, inner) = softmax_dims(ctx, xs)?;
    Ok(Prepared::single(
        DType::F32,
        xs,
        kernel(name, move |io| {
            in_out_f32(io, |y| {
                if y.len() != outer * n * inner {
                    return Err(Error::new(ErrorKind::Internal("Softmax size")));
                }
                for o in 0..outer {
                    let blk = &mut y[o * n * inner..(o + 1) * n * inner];
                    for i in 0..inner {
                        let mut mx = f32::NEG_INFINITY;
                        for j in 0..n {
                            let v = blk[j * inner + i];
                            if v > mx || v.is_nan() {
                                mx = v;
                            }
                        }
                        if mx.is_infinite() {
                            mx = if mx > 0.0 { mx } else { 0.0 };
                        }
                        let mut sum = 0.0f32;
                        if log {
                            for j in 0..n {
                                sum += math::exp(blk[j * inner + i] - mx);
                            }
                            let l = math::ln(sum) + mx;
                            for j in 0..n {
                                blk[j * inner + i] -= l;
                            }
                        } else {
                            for j in 0..n {
                                let e = math::exp(blk[j * inner + i] - mx);
                                blk[j * inner + i] = e;
                                sum += e;
                            }
                            let inv = 1.0 / sum;
                            for j in 0..n {
                                blk[j * inner + i] *= inv;
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
    if xs.len() < 2 {
        return Err(Error::new(ErrorKind::Rank {
            expected: 2,
            got: xs.len(),
        }));
    }
    let (n, c) = (xs[0], xs[1]);
    check_vec(f32_input(ctx, 1, "InstanceNormalization scale")?, c)?;
    check_vec(f32_input(ctx, 2, "InstanceNormalization B")?, c)?;
    let eps = ctx.attr_float("epsilon", 1e-5)?;
    let inner: usize = xs[2..].iter().product();
    Ok(Prepared::single(
        DType::F32,
        xs,
        kernel("InstanceNormalization", move |io| {
            let s = io.input_slice::<f32>(1)?;
            let b = io.input_slice::<f32>(2)?;
            in_out_f32(io, |y| {
                if y.len() != n * c * inner || s.len() != c || b.len() != c {
                    return Err(Error::new(ErrorKind::Internal(
                        "InstanceNormalization size",
                    )));
                }
                for img in 0..n {
                    for ch in 0..c {
                        let base = (img * c + ch) * inner;
                        let blk = &mut y[base..base + inner];
                        normalize_block(blk, eps);
                        for v in blk.iter_mut() {
                            *v = *v * s[ch] + b[ch];
                        }
                    }
                }
                Ok(())
            })
        }),
    )
    .in_place())
}

fn prepare_layer_norm(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let xs = f32_input(ctx, 0, "LayerNormalization X")?;
    if xs.is_empty() {
        return Err(Error::new(ErrorKind::Rank {
            expected: 1,
            got: 0,
        }));
    }
    if (1..ctx.num_outputs()).any(|i| ctx.has_output(i)) {
        return Err(Error::new(ErrorKind::Unsupported(
            "LayerNormalization Mean/InvStdDev outputs",
        )));
    }
    if ctx.attr_int("stash_type", 1)? != 1 {
        return Err(Error::new(ErrorKind::Unsupported(
            "LayerNormalization stash_type",
        )));
    }
    let axis = util::axis(ctx.attr_int("axis", -1)?, xs.len(), "axis")?;
    let eps = ctx.attr_float("epsilon", 1e-5)?;
    let outer: usize = xs[..axis].iter().product();
    let block: usize = xs[axis..].iter().product();
    // Scale/B broadcast to the normalized shape: full block or scalar.
    let param_stride = |i: usize, what: &'static str| -> Result<Option<usize>> {
        if ctx.opt_input(i).is_none() {
            return Ok(None);
        }
        let s = f32_input(ctx, i, what)?;
        let cnt: usize = s.iter().product();
        if s.len() > xs.len() - axis {
            return Err(Error::new(ErrorKind::Shape(
                "LayerNormalization parameter rank",
            )));
        }
        if cnt == block && xs[xs.len() - s.len()..] == *s {
            Ok(Some(1))
        } else if cnt == 1 {
            Ok(Some(0))
        } else {
            Err(Error::new(ErrorKind::Unsupported(
                "LayerNormalization partial parameter broadcast",
            )))
        }
    };
    let ss = param_stride(1, "LayerNormalization Scale")?
        .ok_or(Error::new(ErrorKind::MissingInput { index: 1 }))?;
    let bs = param_stride(2, "LayerNormalization B")?;
    Ok(Prepared::single(
        DType::F32,
        xs,
        kernel("LayerNormalization", move |io| {
            let s = io.input_slice::<f32>(1)?;
            let b = match bs {
                Some(_) => Some(io.input_slice::<f32>(2)?),
                None => None,
            };
            in_out_f32(io, |y| {
                if y.len() != outer * block || s.len() < (block - 1) * ss + 1 {
                    return Err(Error::new(ErrorKind::Internal("LayerNormalization size")));
                }
                for o in 0..outer {
                    let blk = &mut y[o * block..(o + 1) * block];
                    normalize_block(blk, eps);
                    for (j, v) in blk.iter_mut().enumerate() {
                        *v *= s[j * ss];
                    }
                    if let (Some(b), Some(st)) = (b, bs) {
                        if b.len() < (block - 1) * st + 1 {
                            return Err(Error::new(ErrorKind::Internal(
                                "LayerNormalization B size",
                            )));
                        }
                        for (j, v) in blk.iter_mut().enumerate() {
                            *v += b[j * st];
                        }
                    }
                }
                Ok(())
            })
        }),
    )
    .in_place())
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
        let r = run(
            "BatchNormalization",
            15,
            vec![("training_mode", AttrValue::Int(1))],
            &[
                t(&[n, c, hw], &x),
                t(&[c], &s),
                t(&[c], &b),
                t(&[c], &m),
                t(&[c], &v),
            ],
            1,
        );
        assert!(r.is_err());
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
}
