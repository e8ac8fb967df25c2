//! Loss operators: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss
//! (f32/f64/f16/bf16 scores computed in f64, int32/int64 targets, inputs
//! `[N, C]` or `[N, C, d1..dk]`).
//!
//! Semantics follow the ONNX reference: each sample's weight is
//! `weight[target]` (1 without a weight input) and 0 when the target equals
//! `ignore_index`; `mean` divides the weighted sum by the sum of those
//! weights, so ignored samples count neither in the sum nor in the divisor.

use crate::error::{Error, ErrorKind, Result};
use crate::ops::{kernel, util, KernelIo, OpDef, OutputInfo, PrepareCtx, Prepared};
use crate::DType;
use alloc::vec;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("NegativeLogLikelihoodLoss", 12, prepare_nll),
    OpDef::onnx("NegativeLogLikelihoodLoss", 13, prepare_nll),
    OpDef::onnx("NegativeLogLikelihoodLoss", 22, prepare_nll),
    OpDef::onnx("SoftmaxCrossEntropyLoss", 12, prepare_sce),
    OpDef::onnx("SoftmaxCrossEntropyLoss", 13, prepare_sce),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reduction {
    None,
    Sum,
    Mean,
}

/// Everything prepare fixes for one loss node.
#[derive(Clone, Copy, Debug)]
struct LossGeom {
    n: usize,
    c: usize,
    /// Product of the spatial dims `d1..dk` (1 for `[N, C]`).
    d: usize,
    reduction: Reduction,
    ignore: Option<i64>,
    weighted: bool,
    target_dt: DType,
    /// Element type of the scores, the weights and the outputs.
    dtype: DType,
}

const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];

fn prepare_geom(ctx: &PrepareCtx<'_>, what: &'static str) -> Result<(LossGeom, OutputInfo)> {
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, FLOATS, what)?;
    let xs = x.shape;
    let &[n, c, ref spatial @ ..] = xs else {
        return Err(Error::new(ErrorKind::Rank {
            expected: 2,
            got: xs.len(),
        }));
    };
    let t = ctx.input(1)?;
    util::dtype_in(t.dtype, &[DType::I64, DType::I32], "loss target")?;
    let mut want_t = vec![n];
    want_t.extend_from_slice(spatial);
    if t.shape != want_t.as_slice() {
        return Err(Error::new(ErrorKind::Shape(
            "loss target must have shape [N, d1..dk] of the input [N, C, d1..dk]",
        )));
    }
    let weighted = match ctx.opt_input(2) {
        None => false,
        Some(w) => {
            if w.dtype != x.dtype {
                return Err(Error::new(ErrorKind::DTypeMismatch {
                    expected: x.dtype,
                    got: w.dtype,
                }));
            }
            if w.shape != [c] {
                return Err(Error::new(ErrorKind::Shape(
                    "loss weight must have shape [C]",
                )));
            }
            true
        }
    };
    let reduction = match ctx.attr_str("reduction", "mean")? {
        "none" => Reduction::None,
        "sum" => Reduction::Sum,
        "mean" => Reduction::Mean,
        _ => {
            return Err(Error::new(ErrorKind::Attribute {
                name: "reduction",
                problem: "must be none, sum or mean",
            }))
        }
    };
    let ignore = match ctx.node.attr("ignore_index") {
        None => None,
        Some(_) => Some(ctx.attr_int("ignore_index", 0)?),
    };
    let out_shape: &[usize] = if reduction == Reduction::None {
        t.shape
    } else {
        &[]
    };
    Ok((
        LossGeom {
            n,
            c,
            d: spatial.iter().product(),
            reduction,
            ignore,
            weighted,
            target_dt: t.dtype,
            dtype: x.dtype,
        },
        OutputInfo::new(x.dtype, out_shape),
    ))
}

/// Targets as i64 whatever their stored width.
#[derive(Clone, Copy)]
enum Targets<'a> {
    I64(&'a [i64]),
    I32(&'a [i32]),
}

impl Targets<'_> {
    fn len(&self) -> usize {
        match self {
            Targets::I64(v) => v.len(),
            Targets::I32(v) => v.len(),
        }
    }
    #[inline]
    fn get(&self, i: usize) -> Option<i64> {
        match self {
            Targets::I64(v) => v.get(i).copied(),
            Targets::I32(v) => v.get(i).map(|&t| t as i64),
        }
    }
}

fn targets<'a>(io: &KernelIo<'a>, dt: DType) -> Result<Targets<'a>> {
    Ok(match dt {
        DType::I32 => Targets::I32(io.input_slice::<i32>(1)?),
        _ => Targets::I64(io.input_slice::<i64>(1)?),
    })
}

// Scores are computed in f64 through norm's `Real`.
use crate::ops::norm::Real;

/// Applies the loss to every sample: `neg_score(n, t, d)` gives
/// `-score[n, t, d]`; per-sample losses go to `y` when not reduced, and the
/// (reduced) result is returned otherwise.
fn accumulate<T: Real>(
    g: &LossGeom,
    t: Targets<'_>,
    w: Option<&[T]>,
    y: &mut [T],
    mut neg_score: impl FnMut(usize, usize, usize) -> Result<f64>,
) -> Result<()> {
    let (n, c, d) = (g.n, g.c, g.d);
    let nd = n.checked_mul(d);
    if Some(t.len()) != nd
        || w.is_some_and(|w| w.len() != c)
        || (g.reduction == Reduction::None && Some(y.len()) != nd)
        || (g.reduction != Reduction::None && y.len() != 1)
    {
        return Err(Error::new(ErrorKind::Internal("loss size")));
    }
    let (mut sum, mut wsum) = (0.0f64, 0.0f64);
    for i in 0..n {
        for j in 0..d {
            // i < n, j < d: below n * d (checked above).
            let k = i.wrapping_mul(d).wrapping_add(j);
            let tv = t.get(k).ok_or(Error::internal("loss target index"))?;
            let loss = if g.ignore == Some(tv) {
                0.0
            } else {
                if tv < 0 || tv >= c as i64 {
                    return Err(Error::new(ErrorKind::Shape("loss target out of [0, C)")));
                }
                let tc = tv as usize;
                let wt = match w {
                    Some(w) => w
                        .get(tc)
                        .ok_or(Error::internal("loss weight index"))?
                        .to_f64(),
                    None => 1.0,
                };
                wsum += wt;
                wt * neg_score(i, tc, j)?
            };
            match g.reduction {
                Reduction::None => {
                    *y.get_mut(k).ok_or(Error::internal("loss output index"))? = T::from_f64(loss)
                }
                _ => sum += loss,
            }
        }
    }
    let total = match g.reduction {
        Reduction::None => return Ok(()),
        Reduction::Sum => sum,
        Reduction::Mean => sum / wsum,
    };
    *y.first_mut().ok_or(Error::internal("loss output index"))? = T::from_f64(total);
    Ok(())
}

fn weight<'a, T: Real>(io: &KernelIo<'a>, g: &LossGeom) -> Result<Option<&'a [T]>> {
    if g.weighted {
        Ok(Some(io.input_slice::<T>(2)?))
    } else {
        Ok(None)
    }
}

fn run_nll<T: Real>(io: &mut KernelIo<'_>, g: &LossGeom) -> Result<()> {
    let x = io.input_slice::<T>(0)?;
    let t = targets(io, g.target_dt)?;
    let w = weight::<T>(io, g)?;
    if Some(x.len()) != idx3(g.c, g.d, g.n, 0, 0) {
        return Err(Error::new(ErrorKind::Internal("loss input size")));
    }
    let y = io.output_slice::<T>(0)?;
    let (c, d) = (g.c, g.d);
    accumulate(g, t, w, y, |i, tc, j| {
        let v = x
            .get(idx3(c, d, i, tc, j).unwrap_or(usize::MAX))
            .ok_or(Error::internal("loss input index"))?;
        Ok(-v.to_f64())
    })
}

fn prepare_nll(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let (g, out) = prepare_geom(ctx, "NegativeLogLikelihoodLoss input")?;
    Ok(Prepared::new(
        vec![out],
        kernel("NegativeLogLikelihoodLoss", move |io| match g.dtype {
            DType::F64 => run_nll::<f64>(io, &g),
            DType::F16 => run_nll::<half::f16>(io, &g),
            DType::BF16 => run_nll::<half::bf16>(io, &g),
            _ => run_nll::<f32>(io, &g),
        }),
    ))
}

/// The flat index of `[i, k, j]` in a `[n, c, d]` tensor (`None` past
/// `usize`); `idx3(c, d, n, 0, 0)` is its element count.
fn idx3(c: usize, d: usize, i: usize, k: usize, j: usize) -> Option<usize> {
    i.checked_mul(c)?
        .checked_add(k)?
        .checked_mul(d)?
        .checked_add(j)
}

/// The elements of plane `i` (`x[i, .., ..]`) of a `[n, c, d]` tensor.
fn plane(c: usize, d: usize, i: usize) -> Option<core::ops::Range<usize>> {
    let start = idx3(c, d, i, 0, 0)?;
    Some(start..start.checked_add(c.checked_mul(d)?)?)
}

/// The `c` elements `x[i, 0..c, j]` of `x` (`[n, c, d]`), `j < d`.
#[inline]
fn lane<T>(
    x: &[T],
    c: usize,
    d: usize,
    i: usize,
    j: usize,
) -> Result<core::iter::StepBy<core::slice::Iter<'_, T>>> {
    let plane = plane(c, d, i)
        .and_then(|r| x.get(r))
        .ok_or(Error::internal("loss input plane"))?;
    if d == 0 {
        return Err(Error::internal("loss lane of an empty plane"));
    }
    Ok(plane
        .get(lane_from(c, j)..)
        .ok_or(Error::internal("loss lane"))?
        .iter()
        .step_by(d))
}

/// Where lane `j` of a `[c, d]` plane starts: at `j`, or at 0 when `c = 0`
/// (an empty plane: every lane is empty).
#[inline]
fn lane_from(c: usize, j: usize) -> usize {
    if c == 0 {
        0
    } else {
        j
    }
}

/// `ln(sum_c exp(x[c]))` over one `lane` (axis 1 at one sample), shifted by
/// the maximum for stability.
#[inline]
fn log_sum_exp<'a, T: Real + 'a>(lane: impl Iterator<Item = &'a T> + Clone) -> f64 {
    let mut mx = f64::NEG_INFINITY;
    for v in lane.clone() {
        let v = v.to_f64();
        if v > mx || v.is_nan() {
            mx = v;
        }
    }
    if mx.is_infinite() {
        mx = if mx > 0.0 { mx } else { 0.0 };
    }
    let mut s = 0.0f64;
    for v in lane {
        s += libm::exp(v.to_f64() - mx);
    }
    libm::log(s) + mx
}

fn run_sce<T: Real>(io: &mut KernelIo<'_>, g: &LossGeom, with_log_prob: bool) -> Result<()> {
    let x = io.input_slice::<T>(0)?;
    let t = targets(io, g.target_dt)?;
    let w = weight::<T>(io, g)?;
    let (n, c, d) = (g.n, g.c, g.d);
    if Some(x.len()) != idx3(c, d, n, 0, 0) {
        return Err(Error::new(ErrorKind::Internal("loss input size")));
    }
    if !with_log_prob {
        let y = io.output_slice::<T>(0)?;
        // Only the target's log-probability is needed: no buffer.
        return accumulate(g, t, w, y, |i, tc, j| {
            let v = x
                .get(idx3(c, d, i, tc, j).unwrap_or(usize::MAX))
                .ok_or(Error::internal("loss input index"))?;
            Ok(log_sum_exp(lane(x, c, d, i, j)?) - v.to_f64())
        });
    }
    let (y, lp) = io.outputs2(0, 1)?;
    let y = y.into_slice::<T>()?;
    let lp = lp.into_slice::<T>()?;
    if lp.len() != x.len() {
        return Err(Error::new(ErrorKind::Internal("log_prob size")));
    }
    for i in 0..n {
        for j in 0..d {
            let xl = lane(x, c, d, i, j)?;
            let l = log_sum_exp(xl.clone());
            let plane = plane(c, d, i)
                .and_then(|r| lp.get_mut(r))
                .ok_or(Error::internal("log_prob plane"))?;
            let lpl = plane
                .get_mut(lane_from(c, j)..)
                .ok_or(Error::internal("log_prob lane"))?;
            for (o, v) in lpl.iter_mut().step_by(d).zip(xl) {
                *o = T::from_f64(v.to_f64() - l);
            }
        }
    }
    let lp: &[T] = lp;
    accumulate(g, t, w, y, |i, tc, j| {
        let v = lp
            .get(idx3(c, d, i, tc, j).unwrap_or(usize::MAX))
            .ok_or(Error::internal("log_prob index"))?;
        Ok(-v.to_f64())
    })
}

fn prepare_sce(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let (g, out) = prepare_geom(ctx, "SoftmaxCrossEntropyLoss input")?;
    let x = ctx.input(0)?;
    let with_log_prob = ctx.has_output(1);
    let mut outs = vec![out];
    if with_log_prob {
        outs.push(OutputInfo::new(x.dtype, x.shape));
    }
    Ok(Prepared::new(
        outs,
        kernel("SoftmaxCrossEntropyLoss", move |io| match g.dtype {
            DType::F64 => run_sce::<f64>(io, &g, with_log_prob),
            DType::F16 => run_sce::<half::f16>(io, &g, with_log_prob),
            DType::BF16 => run_sce::<half::bf16>(io, &g, with_log_prob),
            _ => run_sce::<f32>(io, &g, with_log_prob),
        }),
    ))
}

#[cfg(test)]
mod tests {
    use crate::math;
    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, rnd, run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;

    fn red(s: &str) -> (&str, AttrValue) {
        ("reduction", AttrValue::Str(s.as_bytes().to_vec()))
    }

    #[test]
    fn nll_by_hand() {
        // x [N=2, C=3]; targets 2 and 0.
        let x = [0.1f32, 0.2, 0.7, 0.5, 0.3, 0.2];
        let tg = [2i64, 0];
        let r = run(
            "NegativeLogLikelihoodLoss",
            13,
            vec![red("none")],
            &[t(&[2, 3], &x), t(&[2], &tg)],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2]);
        assert_close(&vals::<f32>(&r[0]), &[-0.7, -0.5], 0.0);
        let r = run(
            "NegativeLogLikelihoodLoss",
            13,
            vec![red("sum")],
            &[t(&[2, 3], &x), t(&[2], &tg)],
            1,
        )
        .unwrap();
        assert!(r[0].shape.is_empty());
        assert_close(&vals::<f32>(&r[0]), &[-1.2], 0.0);
        // Weighted mean: (-0.7*3 - 0.5*1) / (3 + 1).
        let w = [1.0f32, 2.0, 3.0];
        let r = run(
            "NegativeLogLikelihoodLoss",
            22,
            vec![],
            &[t(&[2, 3], &x), t(&[2], &tg), t(&[3], &w)],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[-2.6 / 4.0], 0.0);
        // Ignored target 0 leaves only sample 0 (weight 3): mean is -0.7.
        let r = run(
            "NegativeLogLikelihoodLoss",
            22,
            vec![("ignore_index", AttrValue::Int(0))],
            &[t(&[2, 3], &x), t(&[2], &tg), t(&[3], &w)],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[-0.7], 0.0);
        // Out-of-range ignored targets are fine; others are errors.
        let r = run(
            "NegativeLogLikelihoodLoss",
            22,
            vec![red("none"), ("ignore_index", AttrValue::Int(-5))],
            &[t(&[2, 3], &x), t(&[2], &[-5i32, 1])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[0.0, -0.3], 0.0);
        assert!(run(
            "NegativeLogLikelihoodLoss",
            22,
            vec![],
            &[t(&[2, 3], &x), t(&[2], &[3i64, 1])],
            1,
        )
        .is_err());
        assert!(run(
            "NegativeLogLikelihoodLoss",
            22,
            vec![],
            &[t(&[2, 3], &x), t(&[3], &[0i64, 1, 1])],
            1,
        )
        .is_err());
    }

    #[test]
    fn nll_spatial() {
        // [N=2, C=3, d=2]: the target picks x[n, t[n, j], j].
        let x = rnd(12, 3);
        let tg = [0i64, 2, 1, 1];
        let r = run(
            "NegativeLogLikelihoodLoss",
            13,
            vec![red("none")],
            &[t(&[2, 3, 2], &x), t(&[2, 2], &tg)],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 2]);
        let want = [-x[0], -x[5], -x[6 + 2], -x[6 + 3]];
        assert_close(&vals::<f32>(&r[0]), &want, 0.0);
        let r = run(
            "NegativeLogLikelihoodLoss",
            13,
            vec![("ignore_index", AttrValue::Int(1))],
            &[t(&[2, 3, 2], &x), t(&[2, 2], &tg)],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[(want[0] + want[1]) / 2.0], 1e-7);
    }

    fn log_softmax_rows(x: &[f32], c: usize) -> Vec<f32> {
        x.chunks(c)
            .flat_map(|r| {
                let s: f32 = r.iter().map(|v| math::exp(*v)).sum();
                r.iter().map(move |v| v - math::ln(s)).collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn sce_with_log_prob() {
        let x = [1.0f32, 2.0, 3.0, 0.0, 0.0, 0.0];
        let lp = log_softmax_rows(&x, 3);
        let tg = [2i64, 1];
        let w = [0.5f32, 2.0, 1.0];
        let r = run(
            "SoftmaxCrossEntropyLoss",
            13,
            vec![],
            &[t(&[2, 3], &x), t(&[2], &tg), t(&[3], &w)],
            2,
        )
        .unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].shape, vec![2, 3]);
        assert_close(&vals::<f32>(&r[1]), &lp, 1e-6);
        // -(1*lp[2] + 2*lp[4]) / 3 with lp[4] = -ln 3.
        let want = -(lp[2] + 2.0 * lp[4]) / 3.0;
        assert_close(&vals::<f32>(&r[0]), &[want], 1e-6);
        // Without the second output: same loss.
        let r = run(
            "SoftmaxCrossEntropyLoss",
            13,
            vec![red("none"), ("ignore_index", AttrValue::Int(1))],
            &[t(&[2, 3], &x), t(&[2], &tg)],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[-lp[2], 0.0], 1e-6);
        let r = run(
            "SoftmaxCrossEntropyLoss",
            12,
            vec![red("sum")],
            &[t(&[2, 3], &x), t(&[2], &tg)],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[-lp[2] - lp[4]], 1e-6);
    }

    #[test]
    fn other_float_types() {
        // f64 natively: exact log-softmax of [0, ln 3] is [-ln 4, ln 3 - ln 4].
        let x = [0.0f64, 3.0f64.ln()];
        let r = run(
            "SoftmaxCrossEntropyLoss",
            13,
            vec![red("none")],
            &[t(&[1, 2], &x), t(&[1], &[1i64])],
            2,
        )
        .unwrap();
        let want = 4.0f64.ln() - 3.0f64.ln();
        assert!((vals::<f64>(&r[0])[0] - want).abs() < 1e-12);
        assert!((vals::<f64>(&r[1])[0] + 4.0f64.ln()).abs() < 1e-12);
        // f16 through f64 and back; weights share the score type.
        let h = |v: f32| half::f16::from_f32(v);
        let r = run(
            "NegativeLogLikelihoodLoss",
            22,
            vec![],
            &[
                t(&[2, 2], &[h(0.5), h(0.25), h(1.0), h(2.0)]),
                t(&[2], &[0i64, 1]),
                t(&[2], &[h(1.0), h(3.0)]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(r[0].dtype, crate::DType::F16);
        // -(0.5 * 1 + 2 * 3) / 4
        assert_eq!(vals::<half::f16>(&r[0])[0].to_f32(), -1.625);
        assert!(run(
            "NegativeLogLikelihoodLoss",
            22,
            vec![],
            &[
                t(&[2, 2], &[h(0.5), h(0.25), h(1.0), h(2.0)]),
                t(&[2], &[0i64, 1]),
                t(&[2], &[1.0f32, 3.0]),
            ],
            1,
        )
        .is_err());
    }

    #[test]
    fn sce_spatial_stable() {
        // Large logits along C (axis 1, stride d=2) stay finite.
        let x = [1000.0f32, 0.0, 1000.0, 0.0];
        let r = run(
            "SoftmaxCrossEntropyLoss",
            13,
            vec![red("none")],
            &[t(&[1, 2, 2], &x), t(&[1, 2], &[0i64, 1])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[math::ln(2.0), math::ln(2.0)], 1e-5);
    }
}
