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

use crate::error::{Error, ErrorKind, Result};
use crate::ops::qlinear::{check_len, int_conv_geom, per_channel, with_qint, IntConv, QInt};
use crate::ops::requant::{clamp, Requant};
use crate::ops::{kernel, util, InputInfo, KernelIo, OpDef, PrepareCtx, Prepared};
use crate::{DType, Element};

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

/// Output zero point, type bounds and fused activation bounds.
#[derive(Clone, Copy, Debug)]
struct OutQ {
    zy: i32,
    lo: i32,
    hi: i32,
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
            let bs = per_ch(ctx, bi + 1, m, "bias scale: one element or one per channel")?;
            let bz = match ctx.opt_input(bi + 2) {
                Some(_) => per_ch(ctx, bi + 2, m, "bias zero point")?,
                None => alloc::vec![0.0; m],
            };
            for c in 0..m {
                let q = at(c).ok_or(Error::new(ErrorKind::Internal("bias")))? - bz[c];
                // A bias quantized at exactly the accumulator's scale (what
                // every quantizer writes) is used as is.
                let same = beta == 1.0 && (bs[c] as f32) == (acc_scale[c] as f32);
                let v = if same {
                    q
                } else {
                    libm::rint(q * bs[c] * beta / acc_scale[c])
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

#[derive(Debug)]
struct QConvP {
    p: IntConv,
    zx: i32,
    zw: Vec<i32>,
    bias: Vec<i32>,
    mult: Vec<Requant>,
    out: OutQ,
}

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
    let depthwise = p.group == p.c && p.m == p.c;
    with_qint!(x.dtype, "QConv x", X => {
        with_qint!(w.dtype, "QConv w", W => {
            with_qint!(yz.dtype, "QConv y", Y => {
                let (sy, out) = out_q::<Y>(ctx, 6, 7)?;
                let q = QConvP {
                    p,
                    zx: s.zx,
                    zw: s.zw,
                    bias,
                    mult: multipliers(&s.acc, 1.0, sy)?,
                    out,
                };
                Ok(if depthwise {
                    Prepared::single(Y::DTYPE, &shape, kernel("QConv depthwise", move |io| {
                        qconv_dw::<X, W, Y>(io, &q)
                    }))
                } else {
                    Prepared::single(Y::DTYPE, &shape, kernel("QConv", move |io| {
                        qconv::<X, W, Y>(io, &q)
                    }))
                })
            })
        })
    })
}

/// Kernel taps `[lo, hi)` of spatial axis `ax` that land inside the input
/// for output position `o` (the rest read padding, whose `x - zx` is 0).
#[inline]
fn tap_range(g: &crate::ops::conv::Geom, ax: usize, o: usize) -> (usize, usize) {
    let (s, d, pb, n, k) = (g.s[ax], g.d[ax], g.pb[ax], g.inp[ax], g.k[ax]);
    let start = o * s; // input coordinate of tap 0, plus pb
    let lo = if start >= pb {
        0
    } else {
        (pb - start).div_ceil(d)
    };
    // tap t is inside when start + t·d - pb < n, i.e. t·d < n + pb - start.
    let hi = match (n + pb).checked_sub(start) {
        Some(room) => room.div_ceil(d).min(k),
        None => 0,
    };
    (lo, hi.max(lo))
}

#[inline]
fn finish<Y: QInt>(acc: i32, r: &Requant, o: &OutQ) -> Y {
    Y::sat(clamp(r.apply(acc), o.zy, o.lo, o.hi) as f64)
}

/// `Σ (x - zx)(w - zw)` over one receptive field of `planes` input planes.
#[inline]
#[allow(clippy::too_many_arguments)]
fn field<X: QInt, W: QInt>(
    xg: &[X],
    wk: &[W],
    zx: i32,
    zw: i32,
    g: &crate::ops::conv::Geom,
    o: [usize; 3],
    planes: usize,
) -> i32 {
    let (in_sz, k_sz) = (g.in_size(), g.k_size());
    let r: [(usize, usize); 3] = [
        tap_range(g, 0, o[0]),
        tap_range(g, 1, o[1]),
        tap_range(g, 2, o[2]),
    ];
    let base = [o[0] * g.s[0], o[1] * g.s[1], o[2] * g.s[2]];
    let mut acc = 0i32;
    for c in 0..planes {
        let (xp, wp) = (
            &xg[c * in_sz..(c + 1) * in_sz],
            &wk[c * k_sz..(c + 1) * k_sz],
        );
        for kd in r[0].0..r[0].1 {
            let id = base[0] + kd * g.d[0] - g.pb[0];
            for kh in r[1].0..r[1].1 {
                let ih = base[1] + kh * g.d[1] - g.pb[1];
                let xrow = (id * g.inp[1] + ih) * g.inp[2];
                let wrow = (kd * g.k[1] + kh) * g.k[2];
                for kw in r[2].0..r[2].1 {
                    let iw = base[2] + kw * g.d[2] - g.pb[2];
                    let xv = xp[xrow + iw].get() - zx;
                    let wv = wp[wrow + kw].get() - zw;
                    acc = acc.wrapping_add(xv * wv);
                }
            }
        }
    }
    acc
}

fn check_io<X: QInt, W: QInt>(x: &[X], w: &[W], q: &QConvP) -> Result<()> {
    let p = &q.p;
    let cg = p.c / p.group.max(1);
    check_len(x.len(), p.batch * p.c * p.g.in_size())?;
    check_len(w.len(), p.m * cg * p.g.k_size())?;
    check_len(q.zw.len(), p.m)?;
    check_len(q.bias.len(), p.m)?;
    check_len(q.mult.len(), p.m)
}

fn qconv<X: QInt, W: QInt, Y: QInt>(io: &mut KernelIo<'_>, q: &QConvP) -> Result<()> {
    let x = io.input_slice::<X>(0)?;
    let w = io.input_slice::<W>(3)?;
    check_io(x, w, q)?;
    let p = &q.p;
    let g = &p.g;
    let (in_sz, out_sz, k_sz) = (g.in_size(), g.out_size(), g.k_size());
    let cg = p.c / p.group.max(1);
    let mg = p.m / p.group.max(1);
    let y = io.output_slice::<Y>(0)?;
    check_len(y.len(), p.batch * p.m * out_sz)?;
    let [o0, o1, o2] = g.out;
    for ni in 0..p.batch {
        for oc in 0..p.m {
            let grp = oc / mg.max(1);
            let xg = &x[(ni * p.c + grp * cg) * in_sz..][..cg * in_sz];
            let wk = &w[oc * cg * k_sz..][..cg * k_sz];
            let (zw, b, r) = (q.zw[oc], q.bias[oc], &q.mult[oc]);
            let yo = &mut y[(ni * p.m + oc) * out_sz..][..out_sz];
            let mut i = 0;
            for od in 0..o0 {
                for oh in 0..o1 {
                    for ow in 0..o2 {
                        let acc = field(xg, wk, q.zx, zw, g, [od, oh, ow], cg);
                        yo[i] = finish(acc.wrapping_add(b), r, &q.out);
                        i += 1;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Depthwise convolution (one input plane per output channel): the taps
/// of a row are found once per output row and column, and the weights of
/// one channel stay hot across its whole plane.
fn qconv_dw<X: QInt, W: QInt, Y: QInt>(io: &mut KernelIo<'_>, q: &QConvP) -> Result<()> {
    let x = io.input_slice::<X>(0)?;
    let w = io.input_slice::<W>(3)?;
    check_io(x, w, q)?;
    let p = &q.p;
    let g = &p.g;
    let (in_sz, out_sz, k_sz) = (g.in_size(), g.out_size(), g.k_size());
    let y = io.output_slice::<Y>(0)?;
    check_len(y.len(), p.batch * p.m * out_sz)?;
    let [o0, o1, o2] = g.out;
    for ni in 0..p.batch {
        for c in 0..p.c {
            let xp = &x[(ni * p.c + c) * in_sz..][..in_sz];
            let wp = &w[c * k_sz..][..k_sz];
            let (zw, b, r) = (q.zw[c], q.bias[c], &q.mult[c]);
            let yo = &mut y[(ni * p.c + c) * out_sz..][..out_sz];
            let mut i = 0;
            for od in 0..o0 {
                let rd = tap_range(g, 0, od);
                for oh in 0..o1 {
                    let rh = tap_range(g, 1, oh);
                    for ow in 0..o2 {
                        let rw = tap_range(g, 2, ow);
                        let mut acc = b;
                        for kd in rd.0..rd.1 {
                            let id = od * g.s[0] + kd * g.d[0] - g.pb[0];
                            for kh in rh.0..rh.1 {
                                let ih = oh * g.s[1] + kh * g.d[1] - g.pb[1];
                                let xrow = &xp[(id * g.inp[1] + ih) * g.inp[2]..][..g.inp[2]];
                                let wrow = &wp[(kd * g.k[1] + kh) * g.k[2]..][..g.k[2]];
                                let iw0 = ow * g.s[2] + rw.0 * g.d[2] - g.pb[2];
                                for (t, kw) in (rw.0..rw.1).enumerate() {
                                    let xv = xrow[iw0 + t * g.d[2]].get() - q.zx;
                                    acc = acc.wrapping_add(xv * (wrow[kw].get() - zw));
                                }
                            }
                        }
                        yo[i] = finish(acc, r, &q.out);
                        i += 1;
                    }
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// QMatMul (MatMul and Gemm with a constant 2-D B)
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct QMmP {
    rows: usize,
    k: usize,
    n: usize,
    trans_b: bool,
    za: i32,
    zb: Vec<i32>,
    bias: Vec<i32>,
    mult: Vec<Requant>,
    out: OutQ,
}

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
    if b.shape.len() != 2 || a.shape.is_empty() {
        return Err(Error::new(ErrorKind::Shape(
            "QMatMul: A of rank >= 1 and a 2-D B",
        )));
    }
    let (k, n) = if trans_b {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    let ka = a.shape[a.shape.len() - 1];
    if ka != k {
        return Err(Error::new(ErrorKind::Dim {
            axis: a.shape.len() - 1,
            expected: k as u64,
            got: ka as u64,
        }));
    }
    let rows = a.numel() / k.max(1);
    let mut shape: Vec<usize> = a.shape[..a.shape.len() - 1].to_vec();
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
    with_qint!(a.dtype, "QMatMul a", A => {
        with_qint!(b.dtype, "QMatMul b", B => {
            with_qint!(yz.dtype, "QMatMul y", Y => {
                let (sy, out) = out_q::<Y>(ctx, 6, 7)?;
                let q = QMmP {
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
                Ok(Prepared::single(Y::DTYPE, &shape, kernel("QMatMul", move |io| {
                    qmatmul::<A, B, Y>(io, &q)
                })))
            })
        })
    })
}

fn qmatmul<A: QInt, B: QInt, Y: QInt>(io: &mut KernelIo<'_>, q: &QMmP) -> Result<()> {
    let (k, n) = (q.k, q.n);
    let a = io.input_slice::<A>(0)?;
    let b = io.input_slice::<B>(3)?;
    check_len(a.len(), q.rows * k)?;
    check_len(b.len(), k * n)?;
    for v in [q.zb.len(), q.bias.len(), q.mult.len()] {
        check_len(v, n)?;
    }
    if q.trans_b {
        // B is [N, K]: each output is a contiguous dot product.
        let y = io.output_slice::<Y>(0)?;
        check_len(y.len(), q.rows * n)?;
        for (arow, yrow) in a.chunks_exact(k.max(1)).zip(y.chunks_exact_mut(n.max(1))) {
            for (j, yv) in yrow.iter_mut().enumerate() {
                let brow = &b[j * k..][..k];
                let zb = q.zb[j];
                let mut acc = q.bias[j];
                for (av, bv) in arow.iter().zip(brow) {
                    acc = acc.wrapping_add((av.get() - q.za) * (bv.get() - zb));
                }
                *yv = finish(acc, &q.mult[j], &q.out);
            }
        }
        return Ok(());
    }
    // B is [K, N]: accumulate a strip of up to STRIP sums on the stack,
    // walking B by rows (contiguous reads, no arena scratch).
    const STRIP: usize = 32;
    let y = io.output_slice::<Y>(0)?;
    check_len(y.len(), q.rows * n)?;
    let mut acc = [0i32; STRIP];
    for r in 0..q.rows {
        let arow = &a[r * k..][..k];
        let mut j0 = 0;
        while j0 < n {
            let w = STRIP.min(n - j0);
            let acc = &mut acc[..w];
            acc.copy_from_slice(&q.bias[j0..j0 + w]);
            let zb = &q.zb[j0..j0 + w];
            for (p, av) in arow.iter().enumerate() {
                let av = av.get() - q.za;
                if av == 0 {
                    continue;
                }
                let brow = &b[p * n + j0..][..w];
                for ((s, bv), z) in acc.iter_mut().zip(brow).zip(zb) {
                    *s = s.wrapping_add(av * (bv.get() - z));
                }
            }
            let yrow = &mut y[r * n + j0..][..w];
            for ((yv, s), m) in yrow.iter_mut().zip(acc.iter()).zip(&q.mult[j0..j0 + w]) {
                *yv = finish(*s, m, &q.out);
            }
            j0 += w;
        }
    }
    Ok(())
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
    with_qint!(x.dtype, "QRequant x", X => {
        with_qint!(yz.dtype, "QRequant y", Y => {
            let (sy, out) = out_q::<Y>(ctx, 3, 4)?;
            let r = Requant::new(sx / sy)?;
            let inplace = X::DTYPE == Y::DTYPE;
            let p = Prepared::single(Y::DTYPE, shape, kernel("QRequant", move |io| {
                qrequant::<X, Y>(io, zx, &r, &out)
            }));
            Ok(if inplace { p.in_place() } else { p })
        })
    })
}

fn qrequant<X: QInt, Y: QInt>(io: &mut KernelIo<'_>, zx: i32, r: &Requant, o: &OutQ) -> Result<()> {
    if io.is_inplace() {
        // Same dtype, same buffer (X == Y checked at prepare).
        let y = io.output_slice::<Y>(0)?;
        for v in y.iter_mut() {
            *v = finish(v.get() - zx, r, o);
        }
        return Ok(());
    }
    let x = io.input_slice::<X>(0)?;
    let y = io.output_slice::<Y>(0)?;
    check_len(y.len(), x.len())?;
    for (yv, xv) in y.iter_mut().zip(x) {
        *yv = finish(xv.get() - zx, r, o);
    }
    Ok(())
}
