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
    meaning: Meaning,
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
        DType::I32 if meaning == Meaning::QLinear => {
            // QLinearConv's B: int32 in the accumulator's scale already.
            for c in 0..m {
                let v = at(c).ok_or(Error::new(ErrorKind::Internal("bias")))?;
                out.push(v.clamp(i32::MIN as f64, i32::MAX as f64) as i32);
            }
        }
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
    /// `x_scale` and the `m` weight scales, as given.
    x: f64,
    w: Vec<f64>,
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
        x: sx,
        w: sw,
    })
}

/// Which operator a `QConv` / `QMatMul` kernel stands for: the two differ in
/// how the requantization multiplier is rounded and in the bias's scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Meaning {
    /// A fused DequantizeLinear → Conv / MatMul / Gemm → QuantizeLinear
    /// chain: the real multiplier `x_scale · w_scale · alpha / y_scale`
    /// (rounded once, to 31 bits); an int32 bias carries its own scale.
    Qdq,
    /// QLinearConv / QLinearMatMul / QGemm: the multiplier `(alpha ·
    /// x_scale · w_scale) / y_scale` rounded to f32 at each step and applied in f32
    /// ([`Requant::f32_product`]), as onnxruntime's kernels do, so that the
    /// outputs are theirs bit for bit; the int32 bias is in the
    /// accumulator's scale.
    QLinear,
}

fn multipliers(s: &Scales, alpha: f64, sy: f64, meaning: Meaning) -> Result<Vec<Requant>> {
    match meaning {
        Meaning::Qdq => s.acc.iter().map(|a| Requant::new(a * alpha / sy)).collect(),
        // onnxruntime's order: alpha · x_scale · w_scale, then / y_scale
        // (QLinearConv and QLinearMatMul have no alpha: 1 · x is x).
        Meaning::QLinear => {
            s.w.iter()
                .map(|&w| {
                    Requant::f32_product(((alpha as f32) * (s.x as f32) * (w as f32)) / sy as f32)
                })
                .collect()
        }
    }
}

// ---------------------------------------------------------------------------
// QConv
// ---------------------------------------------------------------------------

fn prepare_qconv(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    qconv(ctx, Meaning::Qdq)
}

/// QLinearConv on the `QConv` kernels (im2col GEMM, depthwise, VNNI), when
/// its scales, zero points and bias are constants (what onnxruntime's
/// quantizer writes) and its scales finite and > 0. `Ok(None)`: run it on
/// the per-output reference loops instead. Called after QLinearConv's own
/// checks of dtypes and shapes.
pub(crate) fn qlinear_conv(ctx: &PrepareCtx<'_>) -> Result<Option<Prepared>> {
    let constant = |i: usize| ctx.opt_input(i).is_none_or(|t| t.value.is_some());
    if !(1..=8).filter(|&i| i != 3).all(constant) {
        return Ok(None);
    }
    // What the kernels refuse (scales zero, infinite or NaN) the reference
    // loops take: the two compute the same values where both run.
    Ok(qconv(ctx, Meaning::QLinear).ok())
}

fn qconv(ctx: &PrepareCtx<'_>, meaning: Meaning) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let w = ctx.input(3)?;
    let yz = ctx.input(7)?;
    util::dtype_in(x.dtype, &[DType::I8, DType::U8], "QConv x")?;
    util::dtype_in(w.dtype, &[DType::I8, DType::U8], "QConv w")?;
    util::dtype_in(yz.dtype, &[DType::I8, DType::U8], "QConv y")?;
    let (p, shape) = int_conv_geom(ctx, 0, 3)?;
    let s = in_scales(ctx, x.dtype, w.dtype, p.m)?;
    let bias = acc_bias(ctx, 8, &s.acc, 1.0, meaning)?.unwrap_or_else(|| alloc::vec![0; p.m]);
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
            mult: multipliers(&s, 1.0, sy, meaning)?,
            zw: s.zw,
            bias,
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
    qmatmul(ctx, Meaning::Qdq, [8, 6, 7])
}

/// QLinearMatMul (f32 scales, a 2-D B) and `com.microsoft` QGemm (a
/// quantized output, no transA, a C per column) on the `QMatMul` kernels,
/// when their scales, zero points and C are constants. `slots`: the input
/// positions of the bias, y_scale and y_zero_point (QGemm: C, y_scale,
/// y_zero_point are inputs 6, 7, 8). `Ok(None)`: run the per-output
/// reference loops instead (their own checks have passed).
pub(crate) fn qlinear_matmul(ctx: &PrepareCtx<'_>, slots: [usize; 3]) -> Result<Option<Prepared>> {
    let constant = |i: &usize| ctx.opt_input(*i).is_none_or(|t| t.value.is_some());
    let [bias, ys, _] = slots;
    let f32_scales = [1, 4, ys]
        .iter()
        .all(|&i| ctx.opt_input(i).is_some_and(|t| t.dtype == DType::F32));
    // A per-column bias: every axis but the last of length 1.
    let per_col = ctx.opt_input(bias).is_none_or(|c| {
        c.shape
            .split_last()
            .is_none_or(|(_, lead)| lead.iter().all(|&d| d == 1))
    });
    let b_2d = ctx.input(3)?.shape.len() == 2;
    if !([1, 2, 4, 5].iter().chain(&slots).all(constant) && f32_scales && per_col && b_2d) {
        return Ok(None);
    }
    // Shapes the kernels do not take (per-row A scales, transA) err here:
    // the reference loops run those.
    Ok(qmatmul(ctx, Meaning::QLinear, slots).ok())
}

fn qmatmul(ctx: &PrepareCtx<'_>, meaning: Meaning, slots: [usize; 3]) -> Result<Prepared> {
    let [bias_at, ys_at, yz_at] = slots;
    let a: &InputInfo<'_> = ctx.input(0)?;
    let b = ctx.input(3)?;
    let yz = ctx.input(yz_at)?;
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
    let bias =
        acc_bias(ctx, bias_at, &s.acc, beta / alpha, meaning)?.unwrap_or_else(|| alloc::vec![0; n]);
    if !(alpha.is_finite() && alpha > 0.0) {
        return Err(Error::new(ErrorKind::Unsupported(
            "QMatMul alpha must be > 0",
        )));
    }
    let (adt, bdt, ydt) = (a.dtype, b.dtype, yz.dtype);
    with_qint!(ydt, "QMatMul y", Y => {
        let (sy, out) = out_q::<Y>(ctx, ys_at, yz_at)?;
        let params = Params::MatMul {
            dt: [adt, bdt, ydt],
            rows,
            k,
            n,
            trans_b,
            za: s.zx,
            mult: multipliers(&s, alpha, sy, meaning)?,
            zb: s.zw,
            bias,
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

#[cfg(test)]
mod tests {
    use alloc::string::String;
    use alloc::vec::Vec;
    use alloc::{format, vec};

    use crate::kern::QInt;
    use crate::model::{AttrValue, Dim, Model};
    use crate::ops::testing::{rnd, TestGraph};
    use crate::{DType, Element, Session, SessionBuilder, TensorId, TensorView};

    /// One QLinearConv / QLinearMatMul / QGemm case.
    struct Case {
        op: &'static str,
        attrs: Vec<(&'static str, AttrValue)>,
        x: Vec<usize>,
        w: Vec<usize>,
        /// Output channels (QLinearConv: w's axis 0; the others: N).
        m: usize,
        /// 8-bit types of x, w, y: u8 when true.
        u8s: [bool; 3],
        per_channel: bool,
        bias: bool,
    }

    fn q8<T: QInt>(v: &[f32]) -> Vec<T> {
        let mid = (T::MIN + T::MAX + 1.0) / 2.0;
        v.iter()
            .map(|&u| T::sat(libm::rint(mid + f64::from(u) * 127.0)))
            .collect()
    }

    fn c8(t: &mut TestGraph, shape: &[usize], u8_: bool, v: &[f32]) -> TensorId {
        if u8_ {
            t.c(shape, &q8::<u8>(v))
        } else {
            t.c(shape, &q8::<i8>(v))
        }
    }

    /// Runs the case with every parameter constant (`runtime_scale`
    /// false: the fast kernels) or with x_scale fed as a graph input (the
    /// reference loops); returns the output and the step's kernel.
    fn run(c: &Case, seed: u64, runtime_scale: bool) -> (Vec<i32>, String) {
        let mut t = TestGraph::new(seed);
        let x = t.tensor("x", None);
        let xdt = if c.u8s[0] { DType::U8 } else { DType::I8 };
        t.g.tensors[x as usize].dtype = Some(xdt);
        t.g.tensors[x as usize].shape = Some(c.x.iter().map(|&d| Dim::Fixed(d)).collect());
        let sx = 0.02f32 + t.rand(1)[0].abs() * 0.01;
        let xs = if runtime_scale {
            t.input("x_scale", &[])
        } else {
            t.cf(&[], &[sx])
        };
        let zx = t.rand(1)[0] * 0.3;
        let xz = c8(&mut t, &[], c.u8s[0], &[zx]);
        let nw: usize = c.w.iter().product();
        let wv = t.rand(nw);
        let w = c8(&mut t, &c.w, c.u8s[1], &wv);
        let ch = if c.per_channel { c.m } else { 1 };
        let sw: Vec<f32> = t.rand(ch).iter().map(|u| 0.004 + u.abs() * 0.003).collect();
        let ws_shape: Vec<usize> = if c.per_channel { vec![c.m] } else { vec![] };
        let ws = t.cf(&ws_shape, &sw);
        let zw: Vec<f32> = if c.u8s[1] {
            t.rand(ch).iter().map(|u| u * 0.1).collect()
        } else {
            vec![0.0; ch]
        };
        let wz = c8(&mut t, &ws_shape, c.u8s[1], &zw);
        // An output scale near the accumulator's spread, so that outputs
        // cover the 8-bit range (and some saturate).
        let k = nw / c.m;
        let sy = sx * sw[0] * 90.0 * libm::sqrtf(k as f32);
        let ys = t.cf(&[], &[sy]);
        let zy = t.rand(1)[0] * 0.2;
        let yz = c8(&mut t, &[], c.u8s[2], &[zy]);
        let b = c.bias.then(|| {
            let bv: Vec<i32> = t.rand(c.m).iter().map(|u| (u * 4000.0) as i32).collect();
            t.c(&[c.m], &bv)
        });
        // The QLinearConv order; QGemm takes C before y_scale, y_zero_point.
        let mut ins = vec![
            Some(x),
            Some(xs),
            Some(xz),
            Some(w),
            Some(ws),
            Some(wz),
            Some(ys),
            Some(yz),
            b,
        ];
        if c.op == "QGemm" {
            if let Some(tail) = ins.get_mut(6..) {
                tail.rotate_right(1);
            }
        }
        let y = t.node_opt(c.op, &ins, c.attrs.clone());
        if c.op == "QGemm" {
            if let Some(n) = t.g.nodes.last_mut() {
                n.domain = "com.microsoft".into();
                n.opset = 1;
            }
        }
        t.g.inputs.insert(0, x);
        t.g.outputs = vec![y];
        let model = Model {
            graph: t.g,
            opsets: vec![(String::new(), 13), ("com.microsoft".into(), 1)],
            ..Model::default()
        };
        let plan = SessionBuilder::new(&model)
            .plan()
            .unwrap_or_else(|e| panic!("{}", model.explain(&e)));
        let kernel = format!("{:?}", plan.steps.last().map(|s| &s.kernel));
        let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
        let mut s = Session::new(&model, &plan, &mut arena).unwrap();
        let nx: usize = c.x.iter().product();
        let xv = rnd(nx, seed + 99);
        let scale = [sx];
        let sv = TensorView::new(&[], &scale).unwrap();
        fn feed<T: QInt + Element>(
            s: &mut Session<'_>,
            shape: &[usize],
            v: &[f32],
            scale: Option<TensorView<'_>>,
        ) {
            let q = q8::<T>(v);
            let mut feeds = vec![("x", TensorView::new(shape, &q).unwrap())];
            if let Some(sv) = scale {
                feeds.push(("x_scale", sv));
            }
            s.run(&feeds).unwrap();
        }
        let scale = runtime_scale.then_some(sv);
        if c.u8s[0] {
            feed::<u8>(&mut s, &c.x, &xv, scale);
        } else {
            feed::<i8>(&mut s, &c.x, &xv, scale);
        }
        let o = s.output(0).unwrap();
        let out = (0..o.numel())
            .map(|i| o.int_at(i).unwrap() as i32)
            .collect();
        (out, kernel)
    }

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    /// The QOperator ops on the fused kernels give the reference loops'
    /// outputs bit for bit (both round the f32 product as onnxruntime).
    #[test]
    fn qlinear_fast_paths_are_the_reference_loops() {
        let conv =
            |c: usize, m: usize, g: usize, k: usize, s: i64, p: i64, d: i64, hw: usize| Case {
                op: "QLinearConv",
                attrs: vec![
                    ("group", AttrValue::Int(g as i64)),
                    ("kernel_shape", ints(&[k as i64, k as i64])),
                    ("strides", ints(&[s, s])),
                    ("pads", ints(&[p; 4])),
                    ("dilations", ints(&[d, d])),
                ],
                x: vec![1, c, hw, hw],
                w: vec![m, c / g, k, k],
                m,
                u8s: [false; 3],
                per_channel: false,
                bias: true,
            };
        let mut cases = vec![
            conv(3, 8, 1, 3, 1, 1, 1, 9),
            conv(8, 8, 8, 3, 1, 1, 1, 10),  // depthwise, in place
            conv(8, 8, 8, 3, 2, 1, 1, 11),  // depthwise, stride 2
            conv(16, 16, 1, 1, 1, 0, 1, 6), // pointwise C -> C, in place
            conv(4, 6, 2, 3, 2, 0, 1, 9),   // grouped
            conv(2, 4, 1, 5, 1, 2, 2, 12),  // dilated 5x5
        ];
        let mut mm = |op: &'static str,
                      attrs: Vec<(&'static str, AttrValue)>,
                      x: &[usize],
                      w: &[usize],
                      m: usize| {
            cases.push(Case {
                op,
                attrs,
                x: x.to_vec(),
                w: w.to_vec(),
                m,
                u8s: [false; 3],
                per_channel: false,
                bias: op == "QGemm",
            })
        };
        mm("QLinearMatMul", vec![], &[5, 40], &[40, 12], 12);
        mm("QLinearMatMul", vec![], &[2, 3, 33], &[33, 7], 7);
        mm("QGemm", vec![], &[4, 50], &[50, 10], 10);
        mm(
            "QGemm",
            vec![
                ("transB", AttrValue::Int(1)),
                ("alpha", AttrValue::Float(0.75)),
            ],
            &[3, 20],
            &[9, 20],
            9,
        );
        let mut n = 0;
        for (i, base) in cases.iter_mut().enumerate() {
            for variant in 0..4u8 {
                base.per_channel = variant & 1 == 1;
                base.u8s = if variant & 2 == 2 {
                    [true, true, true]
                } else {
                    [false, false, false]
                };
                let seed = i as u64 * 10 + u64::from(variant);
                let (fast, fk) = run(base, seed, false);
                let (slow, sk) = run(base, seed, true);
                let want = if base.op == "QLinearConv" {
                    "QConv"
                } else {
                    "QMatMul"
                };
                assert!(fk.contains(want), "{}: fast path not taken: {fk}", base.op);
                assert!(
                    sk.contains(base.op),
                    "{}: reference not taken: {sk}",
                    base.op
                );
                assert_eq!(fast, slow, "{} case {i} variant {variant}", base.op);
                let saturated = fast
                    .iter()
                    .filter(|&&v| v == -128 || v == 127 || v == 0 || v == 255)
                    .count();
                assert!(
                    saturated < fast.len() / 2,
                    "{} case {i}: mostly saturated",
                    base.op
                );
                n += fast.len();
            }
        }
        assert!(n > 3000, "{n} outputs compared");
    }
}
