//! Integer kernels of fused QDQ patterns (domain `mote`, produced only by
//! [`crate::optimize`]; not an ONNX operator set).
//!
//! A QDQ model means `DequantizeLinear → float op → QuantizeLinear`. The
//! fusion pass replaces such a chain by one of these nodes, which compute
//! the same thing in integers: 8-bit × 8-bit products summed in i32, the
//! bias added in the accumulator's scale (`x_scale · w_scale`), then
//! fixed-point requantization ([`super::requant`]) to the output scale and
//! a clamp to the output type — narrowed by a fused Relu / Clip, since
//! quantization is monotonic: `Q(clip(v, a, b)) = clamp(Q(v), Q(a), Q(b))`.
//!
//! Every scale, zero point and bias is a constant, read at prepare: the
//! kernels hold per-channel multipliers and biases and use no float.
//!
//! Inputs of `QConv` and `QMatMul` (the QLinearConv order, then the bias):
//! `x, x_scale, x_zp?, w, w_scale, w_zp?, y_scale, y_zp, bias?, bias_scale?,
//! bias_zp?`. The bias is an int32 tensor with its own scale (a
//! dequantized bias), or a float tensor (a float bias). Attributes: those of
//! the original Conv / Gemm, plus `mote_act_min` / `mote_act_max` (floats,
//! real units) for a fused activation. `QRequant` (`x, x_scale, x_zp?,
//! y_scale, y_zp` and the two bounds) is a requantize-and-clamp: a
//! dequantize → Relu / Clip → quantize chain, or a change of scale.

use alloc::vec::Vec;

use crate::compiled::export::{Export, Params};
use crate::compiled::op::OpView;
use crate::error::{Error, ErrorKind, Result};
use crate::kern::qconv::{can_conv_in_place, pack_weights, OutQ};
use crate::kern::requant::Requant;
use crate::ops::qlinear::{int_conv_geom, per_channel, with_qint, QInt};
use crate::ops::{util, InputInfo, OpDef, PrepareCtx, Prepared};
use crate::DType;

/// Domain of the fused kernels.
pub const DOMAIN: &str = "mote";

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::domain(DOMAIN, "QConv", 1, prepare_qconv),
    OpDef::domain(DOMAIN, "QMatMul", 1, prepare_qmatmul),
    OpDef::domain(DOMAIN, "QRequant", 1, prepare_qrequant),
];

fn invalid(what: &'static str) -> Error {
    Error::new(ErrorKind::Invalid(what))
}

/// Values of a constant input as f64 (any numeric dtype).
fn const_vals(ctx: &PrepareCtx<'_>, i: usize, what: &'static str) -> Result<Vec<f64>> {
    let x = ctx.input(i)?;
    let v = x.value.ok_or(Error::new(ErrorKind::Unsupported(what)))?;
    (0..v.numel())
        .map(|k| {
            v.f64_at(k)
                .ok_or(Error::new(ErrorKind::Internal("const read")))
        })
        .collect()
}

/// A per-tensor constant (one element).
fn scalar(ctx: &PrepareCtx<'_>, i: usize, what: &'static str) -> Result<f64> {
    let v = const_vals(ctx, i, what)?;
    match v.as_slice() {
        [x] => Ok(*x),
        _ => Err(Error::new(ErrorKind::Shape(what))),
    }
}

/// The zero point at input `i` (0 when omitted), checked against `dt`.
fn zero_point(ctx: &PrepareCtx<'_>, i: usize, dt: DType, what: &'static str) -> Result<i32> {
    match ctx.opt_input(i) {
        None => Ok(0),
        Some(_) => {
            ctx.input_of(i, dt)?;
            Ok(scalar(ctx, i, what)? as i32)
        }
    }
}

/// Per-channel values of input `i` (one element, or `m`), expanded to `m`.
fn per_ch(ctx: &PrepareCtx<'_>, i: usize, m: usize, what: &'static str) -> Result<Vec<f64>> {
    let x = ctx.input(i)?;
    let pc = per_channel(x.shape, m, what)?;
    let v = const_vals(ctx, i, what)?;
    Ok(if pc {
        v
    } else {
        alloc::vec![v.first().copied().unwrap_or(0.0); m]
    })
}

fn out_q<Y: QInt>(ctx: &PrepareCtx<'_>, ys: usize, yz: usize) -> Result<(f64, OutQ)> {
    let sy = scalar(ctx, ys, "y_scale must be a per-tensor constant")?;
    if !(sy.is_finite() && sy > 0.0) {
        return Err(invalid("y_scale must be finite and > 0"));
    }
    let zy = zero_point(
        ctx,
        yz,
        Y::DTYPE,
        "y_zero_point must be a per-tensor constant",
    )?;
    // Q(a) as QuantizeLinear computes it: a / scale in f32, half to even.
    let q = |a: f32| -> f64 {
        let v = libm::rintf(a / sy as f32) as f64 + zy as f64;
        v.clamp(Y::MIN, Y::MAX)
    };
    let amin = ctx.attr_float("mote_act_min", f32::NEG_INFINITY)?;
    let amax = ctx.attr_float("mote_act_max", f32::INFINITY)?;
    let lo = if amin.is_finite() { q(amin) } else { Y::MIN };
    let hi = if amax.is_finite() { q(amax) } else { Y::MAX };
    if lo > hi {
        return Err(invalid("fused activation: min above max"));
    }
    Ok((
        sy,
        OutQ {
            zy,
            lo: lo as i32,
            hi: hi as i32,
        },
    ))
}

/// Bias in accumulator units (`x_scale · w_scale[c]`), per output channel.
/// `Ok(None)` without a bias.
fn acc_bias(
    ctx: &PrepareCtx<'_>,
    bi: usize,
    acc_scale: &[f64],
    beta: f64,
) -> Result<Option<Vec<i32>>> {
    let Some(b) = ctx.opt_input(bi) else {
        return Ok(None);
    };
    let m = acc_scale.len();
    if b.numel() != m && b.numel() != 1 {
        return Err(Error::new(ErrorKind::Shape(
            "bias must have one element per output channel",
        )));
    }
    let vals = const_vals(ctx, bi, "bias must be a constant")?;
    let at = |c: usize| vals.get(if vals.len() == 1 { 0 } else { c }).copied();
    let mut out = Vec::with_capacity(m);
    match b.dtype {
        DType::I32 => {
            let (si, zi) = (bi.saturating_add(1), bi.saturating_add(2));
            let bs = per_ch(ctx, si, m, "bias scale: one element or one per channel")?;
            let bz = match ctx.opt_input(zi) {
                Some(_) => per_ch(ctx, zi, m, "bias zero point")?,
                None => alloc::vec![0.0; m],
            };
            if bs.len() != m || bz.len() != m {
                return Err(Error::new(ErrorKind::Internal("bias scale length")));
            }
            for (c, ((&acc, &bsc), &bzc)) in acc_scale.iter().zip(&bs).zip(&bz).enumerate() {
                let q = at(c).ok_or(Error::new(ErrorKind::Internal("bias")))? - bzc;
                // A bias quantized at exactly the accumulator's scale (what
                // every quantizer writes) is used as is.
                let same = beta == 1.0 && (bsc as f32) == (acc as f32);
                let v = if same {
                    q
                } else {
                    libm::rint(q * bsc * beta / acc)
                };
                out.push(v.clamp(i32::MIN as f64, i32::MAX as f64) as i32);
            }
        }
        DType::F32 => {
            for (c, s) in acc_scale.iter().enumerate() {
                let v = at(c).ok_or(Error::new(ErrorKind::Internal("bias")))? * beta;
                out.push(libm::rint(v / s).clamp(i32::MIN as f64, i32::MAX as f64) as i32);
            }
        }
        dt => {
            return Err(Error::new(ErrorKind::UnsupportedDType {
                what: "fused bias (int32 or float32)",
                code: dt.onnx_code(),
            }))
        }
    }
    Ok(Some(out))
}

/// Scales of the inputs and weights: returns (x zero point, w zero points,
/// accumulator scales, multipliers) for `m` output channels.
struct Scales {
    zx: i32,
    zw: Vec<i32>,
    acc: Vec<f64>,
}

fn in_scales(ctx: &PrepareCtx<'_>, xdt: DType, wdt: DType, m: usize) -> Result<Scales> {
    let sx = scalar(ctx, 1, "x_scale must be a per-tensor constant")?;
    let zx = zero_point(ctx, 2, xdt, "x_zero_point must be a per-tensor constant")?;
    let sw = per_ch(ctx, 4, m, "w_scale: one element or one per output channel")?;
    let zw = match ctx.opt_input(5) {
        Some(_) => {
            ctx.input_of(5, wdt)?;
            per_ch(
                ctx,
                5,
                m,
                "w_zero_point: one element or one per output channel",
            )?
        }
        None => alloc::vec![0.0; m],
    };
    if !(sx.is_finite() && sx > 0.0) || sw.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
        return Err(invalid("scales must be finite and > 0"));
    }
    Ok(Scales {
        zx,
        zw: zw.iter().map(|&z| z as i32).collect(),
        acc: sw.iter().map(|&s| sx * s).collect(),
    })
}

fn multipliers(acc: &[f64], alpha: f64, sy: f64) -> Result<Vec<Requant>> {
    acc.iter().map(|s| Requant::new(s * alpha / sy)).collect()
}

// ---------------------------------------------------------------------------
// QConv
// ---------------------------------------------------------------------------

fn prepare_qconv(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let w = ctx.input(3)?;
    let yz = ctx.input(7)?;
    util::dtype_in(x.dtype, &[DType::I8, DType::U8], "QConv x")?;
    util::dtype_in(w.dtype, &[DType::I8, DType::U8], "QConv w")?;
    util::dtype_in(yz.dtype, &[DType::I8, DType::U8], "QConv y")?;
    let (p, shape) = int_conv_geom(ctx, 0, 3)?;
    let s = in_scales(ctx, x.dtype, w.dtype, p.m)?;
    let bias = acc_bias(ctx, 8, &s.acc, 1.0)?.unwrap_or_else(|| alloc::vec![0; p.m]);
    let (xdt, wdt, ydt) = (x.dtype, w.dtype, yz.dtype);
    let depthwise = p.is_depthwise();
    // Constant weights are packed once for the host's integer GEMM.
    let packed = match (&w.value, wdt) {
        (Some(v), DType::I8) => pack_weights(v.as_slice::<i8>()?, &p, s.zx, &s.zw),
        (Some(v), DType::U8) => pack_weights(v.as_slice::<u8>()?, &p, s.zx, &s.zw),
        _ => Vec::new(),
    };
    with_qint!(ydt, "QConv y", Y => {
        let (sy, out) = out_q::<Y>(ctx, 6, 7)?;
        let params = Params::Conv {
            dt: [xdt, wdt, ydt],
            p,
            zx: s.zx,
            zw: s.zw,
            bias,
            mult: multipliers(&s.acc, 1.0, sy)?,
            out,
            packed,
        };
        let name = if depthwise { "QConv depthwise" } else { "QConv" };
        let prep = Prepared::single(ydt, &shape, Export::new(name, [0, 3], params));
        // Depthwise keeping the size, or pointwise C -> C: output over input.
        Ok(if xdt == ydt && can_conv_in_place(&p) { prep.in_place() } else { prep })
    })
}

// ---------------------------------------------------------------------------
// QMatMul (MatMul and Gemm with a constant 2-D B)
// ---------------------------------------------------------------------------

fn prepare_qmatmul(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let a: &InputInfo<'_> = ctx.input(0)?;
    let b = ctx.input(3)?;
    let yz = ctx.input(7)?;
    util::dtype_in(a.dtype, &[DType::I8, DType::U8], "QMatMul a")?;
    util::dtype_in(b.dtype, &[DType::I8, DType::U8], "QMatMul b")?;
    util::dtype_in(yz.dtype, &[DType::I8, DType::U8], "QMatMul y")?;
    if ctx.attr_int("transA", 0)? != 0 {
        return Err(Error::new(ErrorKind::Unsupported("QMatMul with transA")));
    }
    let trans_b = ctx.attr_int("transB", 0)? != 0;
    let (&[b0, b1], Some((&ka, a_lead))) = (b.shape, a.shape.split_last()) else {
        return Err(Error::new(ErrorKind::Shape(
            "QMatMul: A of rank >= 1 and a 2-D B",
        )));
    };
    let (k, n) = if trans_b { (b1, b0) } else { (b0, b1) };
    if ka != k {
        return Err(Error::new(ErrorKind::Dim {
            axis: a_lead.len(),
            expected: k as u64,
            got: ka as u64,
        }));
    }
    // k = 0: A holds no element, and no row.
    let rows = a.numel().checked_div(k).unwrap_or(0);
    let mut shape: Vec<usize> = a_lead.to_vec();
    shape.push(n);
    let alpha = ctx.attr_float("alpha", 1.0)? as f64;
    let beta = ctx.attr_float("beta", 1.0)? as f64;
    let s = in_scales(ctx, a.dtype, b.dtype, n)?;
    let bias = acc_bias(ctx, 8, &s.acc, beta / alpha)?.unwrap_or_else(|| alloc::vec![0; n]);
    if !(alpha.is_finite() && alpha > 0.0) {
        return Err(Error::new(ErrorKind::Unsupported(
            "QMatMul alpha must be > 0",
        )));
    }
    let (adt, bdt, ydt) = (a.dtype, b.dtype, yz.dtype);
    with_qint!(ydt, "QMatMul y", Y => {
        let (sy, out) = out_q::<Y>(ctx, 6, 7)?;
        let params = Params::MatMul {
            dt: [adt, bdt, ydt],
            rows,
            k,
            n,
            trans_b,
            za: s.zx,
            zb: s.zw,
            bias,
            mult: multipliers(&s.acc, alpha, sy)?,
            out,
        };
        Ok(Prepared::single(ydt, &shape, Export::new("QMatMul", [0, 3], params)))
    })
}

// ---------------------------------------------------------------------------
// QRequant
// ---------------------------------------------------------------------------

fn prepare_qrequant(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let yz = ctx.input(4)?;
    util::dtype_in(x.dtype, &[DType::I8, DType::U8], "QRequant x")?;
    util::dtype_in(yz.dtype, &[DType::I8, DType::U8], "QRequant y")?;
    let sx = scalar(ctx, 1, "x_scale must be a per-tensor constant")?;
    let zx = zero_point(
        ctx,
        2,
        x.dtype,
        "x_zero_point must be a per-tensor constant",
    )?;
    if !(sx.is_finite() && sx > 0.0) {
        return Err(invalid("x_scale must be finite and > 0"));
    }
    let shape = x.shape;
    let (xdt, ydt) = (x.dtype, yz.dtype);
    with_qint!(ydt, "QRequant y", Y => {
        let (sy, out) = out_q::<Y>(ctx, 3, 4)?;
        let r = Requant::new(sx / sy)?;
        let v = OpView::QRequant {
            dt: [xdt, ydt],
            zx,
            r,
            out,
        };
        let p = Prepared::single(ydt, shape, Export::new("QRequant", [0, 0], Params::Plain(v)));
        Ok(if xdt == ydt { p.in_place() } else { p })
    })
}
