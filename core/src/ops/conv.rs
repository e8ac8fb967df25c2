//! Convolution operators: Conv and ConvTranspose (f32, f64, f16, bf16 —
//! narrow types accumulate in f32; NCHW layout, 1 to 3 spatial dimensions).
//!
//! Every spatial geometry is normalized to three spatial axes (leading axes
//! of size 1), so one set of loops serves 1-D, 2-D and 3-D. The innermost
//! loop always runs over the (contiguous) last axis with its bounds hoisted.
//! The window geometry helpers here are shared with the pool family.

use alloc::vec;
use alloc::vec::Vec;

use crate::error::{checked_numel, Error, ErrorKind, Result};
#[cfg(target_arch = "x86_64")]
use crate::kern::dconv;
use crate::kern::dwconv;
use crate::kern::par;
use crate::kern::sgemm::{self, MatA};
use crate::ops::activation::Act;
use crate::ops::util::{div, div_rem, divides, rem, Acc, Float};
use crate::ops::{kernel, util, OpDef, PrepareCtx, Prepared};
use crate::tensor::ChunksOf as _;
use crate::DType;
use core::num::NonZeroUsize;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("Conv", 1, prepare_conv),
    OpDef::onnx("ConvTranspose", 1, prepare_conv_transpose),
    OpDef::domain("com.microsoft", "FusedConv", 1, prepare_fused_conv),
];

pub(crate) use crate::kern::{tap_in, valid_range, Geom, MAX_SPATIAL};

fn attr_err(name: &'static str, problem: &'static str) -> Error {
    Error::new(ErrorKind::Attribute { name, problem })
}

fn shape_err(what: &'static str) -> Error {
    Error::new(ErrorKind::Shape(what))
}

fn overflow() -> Error {
    Error::new(ErrorKind::Overflow)
}

/// `a * b`, Overflow past usize.
fn mul(a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or_else(overflow)
}

/// `a + b`, Overflow past usize.
fn add(a: usize, b: usize) -> Result<usize> {
    a.checked_add(b).ok_or_else(overflow)
}

/// `total` split in two halves for SAME_UPPER (the odd one at the end) or
/// SAME_LOWER (at the beginning).
fn same_halves(total: usize, upper: bool) -> (usize, usize) {
    let small = total / 2;
    // small = total / 2 <= total.
    let large = total.wrapping_sub(small);
    if upper {
        (small, large)
    } else {
        (large, small)
    }
}

/// `auto_pad` attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AutoPad {
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

pub(crate) fn auto_pad(ctx: &PrepareCtx<'_>) -> Result<AutoPad> {
    match ctx.attr_str("auto_pad", "NOTSET")? {
        "NOTSET" | "" => Ok(AutoPad::NotSet),
        "SAME_UPPER" => Ok(AutoPad::SameUpper),
        "SAME_LOWER" => Ok(AutoPad::SameLower),
        "VALID" => Ok(AutoPad::Valid),
        _ => Err(attr_err("auto_pad", "unknown value")),
    }
}

/// A per-axis positive attribute of length `n` (or `def` everywhere).
pub(crate) fn axis_attr(
    ctx: &PrepareCtx<'_>,
    name: &'static str,
    n: usize,
    def: usize,
) -> Result<Vec<usize>> {
    match ctx.attr_ints(name)? {
        None => Ok(vec![def; n]),
        Some([]) => Ok(vec![def; n]),
        Some(v) => {
            if v.len() != n {
                return Err(attr_err(
                    name,
                    "length differs from the number of spatial axes",
                ));
            }
            v.iter()
                .map(|&x| {
                    if x >= 1 {
                        Ok(x as usize)
                    } else {
                        Err(attr_err(name, "must be positive"))
                    }
                })
                .collect()
        }
    }
}

/// `pads` of length `2n` (begin..., end...), non-negative; zeros if absent.
pub(crate) fn read_pads(ctx: &PrepareCtx<'_>, n: usize) -> Result<Vec<usize>> {
    let two_n = mul(n, 2)?;
    match ctx.attr_ints("pads")? {
        None => Ok(vec![0; two_n]),
        Some([]) => Ok(vec![0; two_n]),
        Some(v) => {
            if v.len() != two_n {
                return Err(attr_err(
                    "pads",
                    "length must be twice the number of spatial axes",
                ));
            }
            v.iter()
                .map(|&x| {
                    if x >= 0 {
                        Ok(x as usize)
                    } else {
                        Err(Error::new(ErrorKind::Unsupported("negative pads")))
                    }
                })
                .collect()
        }
    }
}

fn check_spatial(n: usize) -> Result<()> {
    if n == 0 || n > MAX_SPATIAL {
        return Err(Error::new(ErrorKind::Unsupported(
            "convolution / pooling over 1 to 3 spatial axes only",
        )));
    }
    Ok(())
}

/// `base` (a [`Geom`] field) with its last `v.len()` axes set to `v`, one
/// value per spatial axis (the leading, unused axes keep `base`).
fn spatial(v: &[usize], base: [usize; MAX_SPATIAL]) -> Result<[usize; MAX_SPATIAL]> {
    check_spatial(v.len())?;
    let mut a = base;
    for (o, &x) in a.iter_mut().rev().zip(v.iter().rev()) {
        *o = x;
    }
    Ok(a)
}

/// `pads` (begin..., end...) split into its halves for `n` spatial axes.
fn pad_halves(pads: &[usize], n: usize) -> Result<(&[usize], &[usize])> {
    pads.split_at_checked(n)
        .ok_or(Error::new(ErrorKind::Internal("pads shorter than 2n")))
}

/// Geometry of a forward window op (Conv, MaxPool, AveragePool) over the
/// spatial input sizes `inp` with kernel `k`.
pub(crate) fn forward_geom(
    ctx: &PrepareCtx<'_>,
    inp: &[usize],
    k: &[usize],
    ceil_mode: bool,
) -> Result<Geom> {
    let n = inp.len();
    check_spatial(n)?;
    if k.len() != n {
        return Err(attr_err(
            "kernel_shape",
            "length differs from the number of spatial axes",
        ));
    }
    let s = axis_attr(ctx, "strides", n, 1)?;
    let d = axis_attr(ctx, "dilations", n, 1)?;
    let ap = auto_pad(ctx)?;
    let pads = if ap == AutoPad::NotSet {
        read_pads(ctx, n)?
    } else {
        vec![0; mul(n, 2)?]
    };
    let (pads_b, pads_e) = pad_halves(&pads, n)?;
    // Output size and padding (begin, end) per axis.
    let (mut out, mut pb, mut pe) = (Vec::new(), Vec::new(), Vec::new());
    let axes = inp.iter().zip(k).zip(&s).zip(&d).zip(pads_b).zip(pads_e);
    for (((((&xi, &ki), &si), &di), &bi), &ei) in axes {
        if ki == 0 {
            return Err(attr_err("kernel_shape", "must be positive"));
        }
        // ki >= 1 (checked above).
        let ek = add(mul(ki.wrapping_sub(1), di)?, 1)?;
        match ap {
            AutoPad::SameUpper | AutoPad::SameLower => {
                if si == 0 {
                    return Err(attr_err("strides", "must be positive"));
                }
                let o = xi.div_ceil(si);
                // (o - 1)·si < xi: the product fits; the reach may not.
                let total = add(o.saturating_sub(1).wrapping_mul(si), ek)?.saturating_sub(xi);
                let (b, e) = same_halves(total, ap == AutoPad::SameUpper);
                out.push(o);
                pb.push(b);
                pe.push(e);
            }
            AutoPad::NotSet | AutoPad::Valid => {
                let (b, e) = (bi, ei);
                let xb = add(xi, b)?;
                let num = add(xb, e)?
                    .checked_sub(ek)
                    .ok_or(shape_err("window larger than the padded input"))?;
                if si == 0 {
                    return Err(attr_err("strides", "must be positive"));
                }
                // ek >= 1, so num < usize::MAX and num / si + 1 (or its
                // ceiling + 1, at most num + 1) fits.
                let o = if ceil_mode {
                    let o = num.div_ceil(si).wrapping_add(1);
                    // o >= 1; a product past usize is past xi + b too.
                    let last = o.wrapping_sub(1);
                    if last.checked_mul(si).is_none_or(|v| v >= xb) {
                        last
                    } else {
                        o
                    }
                } else {
                    div(num, si, "Conv: stride")?.wrapping_add(1)
                };
                out.push(o);
                pb.push(b);
                pe.push(e);
            }
        }
    }
    let g = Geom::unit();
    Ok(Geom {
        inp: spatial(inp, g.inp)?,
        out: spatial(&out, g.out)?,
        k: spatial(k, g.k)?,
        s: spatial(&s, g.s)?,
        d: spatial(&d, g.d)?,
        pb: spatial(&pb, g.pb)?,
        pe: spatial(&pe, g.pe)?,
    })
}

/// Parameters of one Conv / ConvTranspose node.
#[derive(Clone, Copy, Debug)]
struct ConvParams {
    /// Output channels.
    m: usize,
    group: usize,
    g: Geom,
    has_bias: bool,
    sz: ConvSizes,
    /// A FusedConv's activation (f32 only), applied where each path writes
    /// its output while it is still in cache: a Relu or Clip as the blocked
    /// GEMM writes its last k block ([`sgemm::Epilogue`]) and as the
    /// narrow and flat depthwise paths store a plane ([`Act::bounds`]), the
    /// others after each (image, group) GEMM or depthwise plane; after the
    /// whole convolution on the reference loops.
    act: Option<Act>,
}

/// The sizes of a Conv / ConvTranspose, checked once at prepare
/// ([`conv_sizes`], Overflow): every offset in the kernels below is under
/// one of them, so they are taken wrapping by name.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvSizes {
    /// Input, output and kernel plane sizes.
    pub(crate) in_sz: usize,
    pub(crate) out_sz: usize,
    pub(crate) k_sz: usize,
    /// Input and output channels per group.
    pub(crate) cg: usize,
    pub(crate) mg: usize,
    /// One image of X (`c · in_sz`) and of Y (`m · out_sz`).
    pub(crate) xb: usize,
    pub(crate) yb: usize,
    /// One group of an image of X (`cg · in_sz`) and of Y (`mg · out_sz`).
    pub(crate) xg: usize,
    pub(crate) yg: usize,
    /// The weights of one output channel (`cg · k_sz`, forward) and of one
    /// group (`mg · cg · k_sz`, forward; `cg · mg · k_sz`, transposed).
    pub(crate) wk: usize,
    pub(crate) wg: usize,
    /// X, W and Y.
    pub(crate) x: usize,
    pub(crate) w: usize,
    pub(crate) y: usize,
    /// (image, group) pairs, `batch · group`.
    pub(crate) pairs: usize,
}

/// [`ConvSizes`] of a node; also checks the reach of the last window on
/// each axis, `(count - 1)·s + (k - 1)·d` (count: the outputs of a forward
/// Conv, the inputs of a ConvTranspose), so that every `o·s + t·d` of the
/// plane loops (`o < count`, `t < k`) stays under it. Also the sizes of
/// the integer convolutions of `qlinear`.
pub(crate) fn conv_sizes(
    batch: usize,
    c: usize,
    m: usize,
    group: usize,
    g: &Geom,
    dir: ConvDir,
) -> Result<ConvSizes> {
    let count = match dir {
        ConvDir::Forward => &g.out,
        ConvDir::Transpose => &g.inp,
    };
    let axes = count.iter().zip(&g.s).zip(g.k.iter().zip(&g.d));
    for ((&o, &s), (&k, &d)) in axes {
        add(mul(o.saturating_sub(1), s)?, mul(k.saturating_sub(1), d)?)?;
    }
    let (in_sz, out_sz, k_sz) = (
        checked_numel(&g.inp)?,
        checked_numel(&g.out)?,
        checked_numel(&g.k)?,
    );
    let cg = div(c, group, "Conv: group")?;
    let mg = div(m, group, "Conv: group")?;
    let wk = mul(cg, k_sz)?;
    let (xb, yb) = (mul(c, in_sz)?, mul(m, out_sz)?);
    Ok(ConvSizes {
        in_sz,
        out_sz,
        k_sz,
        cg,
        mg,
        xb,
        yb,
        xg: mul(cg, in_sz)?,
        yg: mul(mg, out_sz)?,
        wk,
        wg: mul(mg, wk)?,
        x: mul(batch, xb)?,
        w: match dir {
            ConvDir::Forward => mul(m, wk)?,
            ConvDir::Transpose => mul(mul(c, mg)?, k_sz)?,
        },
        y: mul(batch, yb)?,
        pairs: mul(batch, group)?,
    })
}

/// Reads X, W, B and group; returns (x shape, w shape, group, spatial kernel
/// from W, has bias).
fn conv_inputs<'a>(ctx: &PrepareCtx<'a>) -> Result<(&'a [usize], &'a [usize], usize, bool)> {
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, util::FLOATS, "Conv input")?;
    let w = ctx.input(1)?;
    // W is X's dtype, or f16 against f32 X (`Model::weights_to_f16`).
    if w.dtype != x.dtype && !(x.dtype == DType::F32 && w.dtype == DType::F16) {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: x.dtype,
            got: w.dtype,
        }));
    }
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
        return Err(attr_err("group", "must be positive"));
    }
    let has_bias = ctx.opt_input(2).is_some();
    if has_bias {
        let b = ctx.input_of(2, x.dtype)?;
        if b.shape.len() != 1 {
            return Err(Error::new(ErrorKind::Rank {
                expected: 1,
                got: b.shape.len(),
            }));
        }
    }
    if let Some(ks) = ctx.attr_ints("kernel_shape")? {
        let wk = w
            .shape
            .get(2..)
            .ok_or(Error::new(ErrorKind::Internal("Conv: weight rank")))?;
        if ks.len() != wk.len() || ks.iter().zip(wk).any(|(&a, &b)| a < 0 || a as usize != b) {
            return Err(attr_err("kernel_shape", "differs from the weight shape"));
        }
    }
    Ok((x.shape, w.shape, group as usize, has_bias))
}

fn check_bias(ctx: &PrepareCtx<'_>, m: usize) -> Result<()> {
    if let Some(b) = ctx.opt_input(2) {
        // Rank 1 (`conv_inputs`).
        let got = *b
            .shape
            .first()
            .ok_or(Error::new(ErrorKind::Internal("Conv: bias rank")))?;
        if got != m {
            return Err(Error::new(ErrorKind::Dim {
                axis: 0,
                expected: m as u64,
                got: got as u64,
            }));
        }
    }
    Ok(())
}

fn out_shape(batch: usize, ch: usize, g: &Geom, n: usize) -> Result<Vec<usize>> {
    let mut s = vec![batch, ch];
    s.extend_from_slice(
        g.out
            .get(MAX_SPATIAL.saturating_sub(n)..)
            .filter(|o| o.len() == n)
            .ok_or(Error::new(ErrorKind::Internal("Conv: spatial rank")))?,
    );
    Ok(s)
}

/// X and W as (batch or channels, channels, spatial sizes), rank >= 3 and
/// equal (`conv_inputs`).
fn split_nc<'a>(xs: &'a [usize], ws: &'a [usize]) -> Result<[(usize, usize, &'a [usize]); 2]> {
    match (xs, ws) {
        ([x0, x1, xsp @ ..], [w0, w1, wsp @ ..]) if !xsp.is_empty() => {
            Ok([(*x0, *x1, xsp), (*w0, *w1, wsp)])
        }
        _ => Err(Error::new(ErrorKind::Internal("Conv: input rank"))),
    }
}

fn prepare_conv(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_conv_act(ctx, None)
}

/// [`prepare_conv`], then `act` on each output value (f32 only).
fn prepare_conv_act(ctx: &PrepareCtx<'_>, act: Option<Act>) -> Result<Prepared> {
    let (xs, ws, group, has_bias) = conv_inputs(ctx)?;
    let [(batch, c, xsp), (m, wc, wsp)] = split_nc(xs, ws)?;
    if !divides(c, group) || !divides(m, group) {
        return Err(attr_err("group", "does not divide the channels"));
    }
    if wc.checked_mul(group) != Some(c) {
        return Err(Error::new(ErrorKind::Dim {
            axis: 1,
            expected: div(c, group, "Conv: group")? as u64,
            got: wc as u64,
        }));
    }
    check_bias(ctx, m)?;
    let n = xsp.len();
    let g = forward_geom(ctx, xsp, wsp, false)?;
    let p = ConvParams {
        m,
        group,
        g,
        has_bias,
        sz: conv_sizes(batch, c, m, group, &g, ConvDir::Forward)?,
        act,
    };
    let shape = out_shape(batch, m, &g, n)?;
    conv_kernel(ctx, &shape, p, "Conv", ConvDir::Forward)
}

/// onnxruntime's `com.microsoft.FusedConv` (f32): Conv, then the activation
/// named by `activation` / `activation_params` on each output value. mote's
/// optimizer makes it from Conv → Relu / Clip / LeakyRelu / Sigmoid / Tanh /
/// HardSigmoid / HardSwish (`optimize::float`, pass `activation`); the
/// optional fourth input Z (a sum) is not supported.
fn prepare_fused_conv(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    if ctx.num_inputs() > 3 {
        return Err(Error::new(ErrorKind::Unsupported(
            "FusedConv with a Z (sum) input",
        )));
    }
    Act::check_f32(ctx, "FusedConv")?;
    let params = ctx.attr_floats("activation_params")?.unwrap_or(&[]);
    let act = Act::from_attrs(ctx.attr_str("activation", "")?, params)?;
    prepare_conv_act(ctx, Some(act))
}

/// Which direct form a Conv-like kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConvDir {
    Forward,
    Transpose,
}

/// A Conv-like kernel of X's dtype (W's may be f16 against f32 X).
fn conv_kernel(
    ctx: &PrepareCtx<'_>,
    shape: &[usize],
    p: ConvParams,
    name: &'static str,
    dir: ConvDir,
) -> Result<Prepared> {
    let (dt, wdt) = (ctx.input(0)?.dtype, ctx.input(1)?.dtype);
    if dt == DType::F32 && wdt == DType::F16 {
        return conv_typed::<f32, half::f16>(shape, p, name, dir, None);
    }
    let direct = match (dir, dt, wdt) {
        (ConvDir::Forward, DType::F32, DType::F32) => direct_weights(ctx, &p),
        _ => None,
    };
    util::with_float!(dt, T => conv_typed::<T, T>(shape, p, name, dir, direct),
    other => Err(Error::new(ErrorKind::UnsupportedDType {
        what: name,
        code: other.onnx_code(),
    })))
}

/// W packed at prepare for the direct f32 Conv ([`dconv::pack`], group by
/// group), where this CPU's kernels take the layer ([`dconv::wanted`]) and
/// W is a constant, and the build allows packed copies
/// ([`PrepareCtx::may_pack`]); onnxruntime packs constant Conv weights at
/// prepare too. The packed copy is as large as W (kept beside it: the
/// other paths read W as it is). `None` otherwise: the layer then runs on
/// the GEMM.
#[cfg(target_arch = "x86_64")]
fn direct_weights(ctx: &PrepareCtx<'_>, p: &ConvParams) -> Option<Vec<f32>> {
    let sz = &p.sz;
    if !ctx.may_pack() || !sgemm::enabled() || sz.mg < 4 || sz.wg == 0 || is_pointwise(p) {
        return None;
    }
    if !dconv::wanted(sz.cg, sz.mg, &p.g) {
        return None;
    }
    let w = ctx.input(1).ok()?.value?.as_slice::<f32>().ok()?;
    if w.len() != sz.w {
        return None;
    }
    let mut out = alloc::vec![0f32; w.len()];
    for (src, dst) in w.chunks_exact(sz.wg).zip(out.chunks_exact_mut(sz.wg)) {
        dconv::pack(src, sz.mg, sz.wk, dst)?;
    }
    Some(out)
}

/// No direct Conv kernel on this architecture.
#[cfg(not(target_arch = "x86_64"))]
fn direct_weights(_: &PrepareCtx<'_>, _: &ConvParams) -> Option<Vec<f32>> {
    None
}

/// Whether the Conv is a GEMM on X as it is: a 1 × 1 window, stride 1, no
/// padding.
fn is_pointwise(p: &ConvParams) -> bool {
    p.sz.k_sz == 1
        && p.g.s == [1; MAX_SPATIAL]
        && p.g.pb == [0; MAX_SPATIAL]
        && p.g.pe == [0; MAX_SPATIAL]
}

/// A Conv-like kernel over X (and B, Y) of `T` and W of `W`, with one output
/// plane of accumulators as scratch when `T` is narrower than its
/// accumulator; `direct`: W packed for the direct f32 kernel
/// ([`direct_weights`]).
fn conv_typed<T: Float, W: Float<Acc = T::Acc>>(
    shape: &[usize],
    p: ConvParams,
    name: &'static str,
    dir: ConvDir,
    direct: Option<Vec<f32>>,
) -> Result<Prepared> {
    let heap = direct.as_deref().map_or(0, core::mem::size_of_val);
    let plane = p.sz.out_sz;
    Ok(Prepared::single(
        T::DTYPE,
        shape,
        kernel(name, move |io| {
            let x = io.input_slice::<T>(0)?;
            let w = io.input_slice::<W>(1)?;
            let b = if p.has_bias {
                Some(io.input_slice::<T>(2)?)
            } else {
                None
            };
            let (y, scratch) = io.output_and_scratch(0)?;
            let y = y.into_slice::<T>()?;
            let acc = if T::IS_ACC {
                &mut []
            } else {
                util::acc_buf::<T>(scratch, plane)?
            };
            match dir {
                ConvDir::Forward => {
                    let applied = conv_forward(x, w, b, y, acc, &p, direct.as_deref())?;
                    match p.act {
                        Some(act) if !applied => act.apply(f32_out(y)?),
                        _ => {}
                    }
                    Ok(())
                }
                ConvDir::Transpose => conv_transpose(x, w, b, y, acc, &p),
            }
        }),
    )
    .with_scratch(util::acc_scratch::<T>(plane)?)
    .with_heap(heap))
}

fn len_err(expected: usize, got: usize) -> Error {
    Error::new(ErrorKind::Len {
        expected: expected as u64,
        got: got as u64,
    })
}

fn check_len(s: usize, want: usize) -> Result<()> {
    if s != want {
        return Err(len_err(want, s));
    }
    Ok(())
}

/// The lengths were checked against the shapes ([`check_len`]): a slice
/// shorter than its part is a bug.
fn short(what: &'static str) -> Error {
    Error::new(ErrorKind::Internal(what))
}

/// Bias of output channel `oc`, zero without B.
fn bias_of<T: Float>(b: Option<&[T]>, oc: usize) -> Result<T::Acc> {
    match b {
        None => Ok(<T::Acc as Acc>::ZERO),
        Some(b) => b
            .get(oc)
            .map(|v| v.to_acc())
            .ok_or(short("Conv: bias shorter than the channels")),
    }
}

/// `y += a * x` over equal-length slices, `x` widened to the accumulator.
#[inline]
fn axpy<W: Float>(y: &mut [W::Acc], x: &[W], a: W::Acc) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = o.plus(a.times(v.to_acc()));
    }
}

/// A FusedConv's output as f32 (its input was checked to be f32 at
/// prepare, `Act::check_f32`).
fn f32_out<T: Float>(y: &mut [T]) -> Result<&mut [f32]> {
    bytemuck::try_cast_slice_mut::<T, f32>(y).map_err(|_| {
        Error::new(ErrorKind::UnsupportedDType {
            what: "FusedConv",
            code: T::DTYPE.onnx_code(),
        })
    })
}

/// Direct convolution; `acc` holds one output plane of accumulators when
/// `T` is narrower than its accumulator (else it is unused). `Ok(true)` if
/// the path taken applied the activation of `p` (the f32 blocked GEMM and
/// depthwise paths do, as they write each part of Y); else the caller
/// applies it to the whole of Y.
fn conv_forward<T: Float, W: Float<Acc = T::Acc>>(
    x: &[T],
    w: &[W],
    b: Option<&[T]>,
    y: &mut [T],
    acc: &mut [T::Acc],
    p: &ConvParams,
    direct: Option<&[f32]>,
) -> Result<bool> {
    let g = &p.g;
    let sz = &p.sz;
    let (in_sz, out_sz, k_sz, cg, mg) = (sz.in_sz, sz.out_sz, sz.k_sz, sz.cg, sz.mg);
    check_len(x.len(), sz.x)?;
    check_len(w.len(), sz.w)?;
    check_len(y.len(), sz.y)?;
    if let Some(b) = b {
        check_len(b.len(), p.m)?;
    }
    if y.is_empty() {
        return Ok(false);
    }
    if in_sz == 0 || cg == 0 {
        // No taps: each output plane is its channel's bias (y is not
        // empty, so neither is a plane).
        for (i, yp) in y.chunks_of_mut(out_sz).enumerate() {
            yp.fill(T::from_acc(bias_of(b, rem(i, p.m, "Conv: channel")?)?));
        }
        return Ok(false);
    }
    let pointwise = is_pointwise(p);
    if T::DTYPE == DType::F32 && W::DTYPE == DType::F32 && sgemm::enabled() {
        if let (Ok(x), Ok(w), Ok(y)) = (
            bytemuck::try_cast_slice::<T, f32>(x),
            bytemuck::try_cast_slice::<W, f32>(w),
            bytemuck::try_cast_slice_mut::<T, f32>(y),
        ) {
            let b = b.and_then(|b| bytemuck::try_cast_slice::<T, f32>(b).ok());
            if mg >= 4 && conv_blocked(x, w, b, y, p, pointwise, direct) {
                return Ok(true);
            }
            if cg == 1 && mg == 1 && conv_depthwise(x, w, b, y, p) {
                return Ok(true);
            }
        }
    }
    for (ni, yb) in y.chunks_of_mut(sz.yb).enumerate() {
        let xb = util::row(x, ni, sz.xb)?;
        for (oc, yp) in yb.chunks_of_mut(out_sz).enumerate() {
            let grp = div(oc, mg, "Conv: group")?;
            let wrow = util::row(w, oc, sz.wk)?;
            let xg = util::row(xb, grp, sz.xg)?;
            let bias = bias_of(b, oc)?;
            let mut res = Ok(());
            util::accumulate_into(yp, acc, |yp| {
                yp.fill(bias);
                if pointwise {
                    // A GEMM row: y[oc, :] += w[oc, ic] * x[ic, :].
                    for (xp, &wv) in xg.chunks_of(in_sz).zip(wrow) {
                        axpy(yp, xp, wv.to_acc());
                    }
                    return;
                }
                res = xg
                    .chunks_of(in_sz)
                    .zip(wrow.chunks_of(k_sz))
                    .try_for_each(|(xp, wk)| conv_plane(yp, xp, wk, g));
            })?;
            res?;
        }
    }
    Ok(false)
}

/// f32 Conv as one GEMM per image and group, `Y[m, pos] = W[m, (c, k)] ·
/// patches[(c, k), pos]` (+ bias), on the blocked kernels: the patch matrix
/// is packed one panel at a time from X ([`sgemm::Im2col`]), or X itself for
/// a pointwise layer. Lengths were checked by the caller; `false` if the
/// kernels refused them (the caller then runs the direct loops).
///
/// With several workers ([`par`]): many (image, group) GEMMs — grouped
/// layers, batches — are shared out whole, a run of them per task; a few
/// large ones run one after the other, each split inside [`sgemm::sgemm`].
/// Either way each output element is computed as in the single-thread run.
fn conv_blocked(
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    y: &mut [f32],
    p: &ConvParams,
    pointwise: bool,
    direct: Option<&[f32]>,
) -> bool {
    let sz = &p.sz;
    let (pairs, y_len) = (sz.pairs, sz.yg);
    if y_len == 0 {
        return true;
    }
    let workers = par::workers();
    let gemm_macs = y_len.saturating_mul(sz.wk);
    let t = par::tasks(workers, gemm_macs.saturating_mul(pairs), pairs);
    // Exact: workers is far below usize::MAX / 2.
    let outer = t > 1
        && (pairs >= workers.saturating_mul(2) || par::tasks(workers, gemm_macs, usize::MAX) <= 1);
    if !outer {
        for (idx, yg) in y.chunks_of_mut(y_len).take(pairs).enumerate() {
            if !conv_gemm(idx, x, w, b, yg, p, pointwise, direct, false) {
                return false;
            }
        }
        return true;
    }
    let ys = par::SharedMut::new(y);
    let failed = par::Failed::new();
    par::for_each(t, &|ti| {
        let (lo, hi) = par::chunk(pairs, t, ti);
        for idx in lo..hi {
            // idx < pairs: idx · y_len < pairs · mg · out_sz, Y's length
            // (`conv_sizes`).
            let start = idx.wrapping_mul(y_len);
            // SAFETY: pair idx owns y[idx * y_len..][..y_len], and the runs
            // of pairs of the tasks are disjoint.
            let Some(yg) = (unsafe { ys.slice(start, y_len) }) else {
                failed.set();
                return;
            };
            if !conv_gemm(idx, x, w, b, yg, p, pointwise, direct, true) {
                failed.set();
                return;
            }
        }
    });
    !failed.get()
}

/// The GEMM of (image, group) pair `idx` (`image * group + group index`)
/// into its output channels `yg`, or the direct kernel ([`dconv`]) where
/// `direct` holds W packed for it; `serial`: on this thread only.
fn conv_gemm(
    idx: usize,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    yg: &mut [f32],
    p: &ConvParams,
    pointwise: bool,
    direct: Option<&[f32]>,
    serial: bool,
) -> bool {
    let g = &p.g;
    let sz = &p.sz;
    let (in_sz, out_sz, mg, kk) = (sz.in_sz, sz.out_sz, sz.mg, sz.wk);
    // Images are `group × cg` input planes, so pair idx's input channels
    // start at idx * cg planes; its weights are those of its group.
    let Some(grp) = idx.checked_rem(p.group) else {
        return false;
    };
    let (Ok(xg), Ok(wg)) = (util::row(x, idx, sz.xg), util::row(w, grp, sz.wg)) else {
        return false;
    };
    let bias = b.and_then(|b| util::row(b, grp, mg).ok());
    // The direct kernel where W was packed for it at prepare.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = direct;
    #[cfg(target_arch = "x86_64")]
    if let Some(wp) = direct.and_then(|d| util::row(d, grp, sz.wg).ok()) {
        let op = dconv::Conv {
            x: xg,
            w: wp,
            b: bias,
            c: sz.cg,
            m: mg,
            g,
        };
        if op.run(yg, serial) {
            if let Some(act) = p.act {
                act.apply(yg);
            }
            return true;
        }
    }
    let a = MatA {
        a: wg,
        rs: kk,
        cs: 1,
    };
    // A Relu or Clip is applied by the GEMM as it writes Y, the other
    // activations after it, on this group's output.
    let clamp = p.act.and_then(Act::bounds);
    let ep = sgemm::Epilogue { bias, clamp };
    let ok = if pointwise {
        let src = sgemm::Dense { b: xg, ldb: in_sz };
        sgemm::sgemm_out(serial, mg, out_sz, kk, a, &src, yg, out_sz, ep)
    } else {
        let Some(src) = sgemm::Im2col::new(xg, g) else {
            return false;
        };
        sgemm::sgemm_out(serial, mg, out_sz, kk, a, &src, yg, out_sz, ep)
    };
    match p.act {
        Some(act) if ok && clamp.is_none() => act.apply(yg),
        _ => {}
    }
    ok
}

/// f32 depthwise Conv (one input and one output channel per group), plane
/// by plane on [`dwconv::plane`]; `false` (the caller runs the direct
/// loops) when the window is not 2-D. With several workers ([`par`]) the
/// planes are shared out, a run of them per task (each plane is computed
/// whole by one task, as in the single-thread run).
fn conv_depthwise(x: &[f32], w: &[f32], b: Option<&[f32]>, y: &mut [f32], p: &ConvParams) -> bool {
    let g = &p.g;
    let (out_sz, k_sz) = (p.sz.out_sz, p.sz.k_sz);
    if g.k[0] != 1 || g.inp[0] != 1 || g.out[0] != 1 || out_sz == 0 {
        return false;
    }
    let Some(planes) = y.len().checked_div(out_sz) else {
        return false;
    };
    let macs = y.len().saturating_mul(k_sz);
    let t = par::tasks(par::workers(), macs, planes);
    let ys = par::SharedMut::new(y);
    let failed = par::Failed::new();
    let job = DepthwiseJob {
        x,
        w,
        b,
        ys: &ys,
        p,
    };
    let task = |ti: usize| {
        if !depthwise_planes(&job, par::chunk(planes, t, ti)) {
            failed.set();
        }
    };
    if t <= 1 {
        task(0);
    } else {
        par::for_each(t, &task);
    }
    !failed.get()
}

crate::kern::cpu::avx2_variant! {
/// [`DepthwiseJob::planes_body`] over planes `range`, compiled for AVX2 +
/// FMA as well (a function of its own rather than the task closure: a
/// closure does not inherit the target features of its enclosing
/// function). Its loops have no fused multiply-adds to contract, so they
/// give the same bits with or without the wider vectors; planes with rows
/// of at most 8 floats take `dwconv::narrow_avx2` there, whose fused
/// products round differently (within the ONNX tolerance).
fn depthwise_planes(job: &DepthwiseJob<'_, '_>, range: (usize, usize)) -> bool {
    job.planes_body(range)
}
}

/// Fewest values a depthwise task runs its activation on at once (16 KiB,
/// in L1 with the planes that made them).
const ACT_SPAN: usize = 4096;

/// The operands of [`conv_depthwise`], shared by its tasks.
struct DepthwiseJob<'a, 's> {
    x: &'a [f32],
    w: &'a [f32],
    b: Option<&'a [f32]>,
    ys: &'a par::SharedMut<'s, f32>,
    p: &'a ConvParams,
}

impl DepthwiseJob<'_, '_> {
    /// Planes `lo .. hi` (one task's share); runs through
    /// [`depthwise_planes`] so that it is compiled for AVX2 + FMA too.
    #[inline(always)]
    fn planes_body(&self, (lo, hi): (usize, usize)) -> bool {
        let DepthwiseJob { x, w, b, ys, p } = *self;
        let g = &p.g;
        let (in_sz, out_sz, k_sz) = (p.sz.in_sz, p.sz.out_sz, p.sz.k_sz);
        // Built on first use: its buffers are 48 KiB to zero.
        let mut flat: Option<dwconv::Flat> = None;
        // The first plane the activation has not run on.
        let mut act_from = lo;
        #[cfg(target_arch = "x86_64")]
        let avx2 = crate::kern::cpu::kernels() == crate::kern::cpu::Kernels::Avx2Fma;
        // With AVX-512, stride-1 planes with rows as wide as the input's,
        // up to 1024 floats, 16 outputs a vector (masks made once here).
        #[cfg(target_arch = "x86_64")]
        let grid = if crate::kern::cpu::avx512_vnni() {
            // SAFETY: `avx512_vnni` holds only where the CPU has AVX-512 F
            // (`cpu::enable_avx512_vnni`'s contract).
            unsafe { crate::kern::dw512::Grid16::new(g) }
        } else {
            None
        };
        // A Relu / Clip goes into the narrow and flat paths' stores.
        let bounds = p.act.and_then(Act::bounds);
        for i in lo..hi {
            let Some(c) = i.checked_rem(p.m) else {
                return false;
            };
            // i < planes = y.len() / out_sz: i · out_sz < y.len().
            let start = i.wrapping_mul(out_sz);
            // SAFETY: plane i is y[i * out_sz..][..out_sz]; the runs of
            // planes of the tasks are disjoint, and a task holds one plane
            // at a time.
            let (Some(yp), Ok(xp), Ok(wk)) = (
                unsafe { ys.slice(start, out_sz) },
                util::row(x, i, in_sz),
                util::row(w, c, k_sz),
            ) else {
                return false;
            };
            let bias = b.and_then(|b| b.get(c)).copied().unwrap_or(0.0);
            #[cfg(target_arch = "x86_64")]
            let done = match &grid {
                // SAFETY: as for `Grid16::new` above.
                Some(grid) => unsafe { grid.plane(yp, xp, wk, bias, bounds) },
                // SAFETY: `Avx2Fma` is selected only when the CPU has AVX2
                // and FMA.
                None => avx2 && unsafe { dwconv::narrow_avx2(yp, xp, wk, bias, g, bounds) },
            };
            #[cfg(not(target_arch = "x86_64"))]
            let done = false;
            // The narrow and flat paths apply a clamp as they store; the
            // row path (`dwconv::plane`) does not.
            let stored_clamp = done || {
                let flat = flat.get_or_insert_with(|| dwconv::Flat::new(g));
                flat.plane(yp, xp, wk, bias, bounds)
            };
            if !stored_clamp && !dwconv::plane(yp, xp, wk, bias, g) {
                return false;
            }
            // Whether the plane's stores applied the activation.
            let clamped = stored_clamp && bounds.is_some();
            // Otherwise the activation runs on the planes just written,
            // still in cache, in spans of at least ACT_SPAN values (a call
            // per small plane costs more than it saves).
            let next = i.wrapping_add(1);
            // act_from <= i < next <= hi <= planes: the span is planes
            // act_from..next (..i when this one is clamped), inside Y.
            let upto = if clamped { i } else { next };
            let span = upto.wrapping_sub(act_from).wrapping_mul(out_sz);
            if let Some(act) = p.act {
                if clamped || span >= ACT_SPAN || next == hi {
                    if span > 0 {
                        // SAFETY: planes act_from..upto are this task's,
                        // and no slice of them is held any more.
                        let Some(ys) = (unsafe { ys.slice(act_from.wrapping_mul(out_sz), span) })
                        else {
                            return false;
                        };
                        act.apply(ys);
                    }
                    act_from = next;
                }
            }
        }
        true
    }
}

/// Accumulates one input plane convolved with one kernel into an output plane.
fn conv_plane<T: Float, W: Float<Acc = T::Acc>>(
    yp: &mut [T::Acc],
    xp: &[T],
    wk: &[W],
    g: &Geom,
) -> Result<()> {
    let short = short("Conv: plane shorter than its geometry");
    let [o0, o1, o2] = g.out;
    let [i0, i1, i2] = g.inp;
    let [k0, k1, k2] = g.k;
    let [s0, s1, s2] = g.s;
    // Strides are positive (checked at prepare); as NonZero, `step_by`
    // below keeps no zero-step assertion.
    let s2_nz = NonZeroUsize::new(s2).ok_or(short)?;
    let [d0, d1, d2] = g.d;
    let [p0, p1, p2] = g.pb;
    // Offsets below wrap by name, each under a bound checked at prepare
    // (`conv_sizes`): a tap `o·s + t·d` (o < out, t < k) is under the reach
    // of its axis; `valid_range` keeps it in `p .. p + inp`, so minus the
    // padding it is an input index; plane offsets are under the plane sizes
    // (`in_sz`, `out_sz`, `k_sz`). A wrong one would fail the `get`.
    for kd in 0..k0 {
        let (od_lo, od_hi) = valid_range(o0, s0, kd.wrapping_mul(d0), p0, i0);
        for kh in 0..k1 {
            let (oh_lo, oh_hi) = valid_range(o1, s1, kh.wrapping_mul(d1), p1, i1);
            // (kd·k1 + kh)·k2 + k2 <= k_sz.
            let w0 = kd.wrapping_mul(k1).wrapping_add(kh).wrapping_mul(k2);
            let wrow = wk.get(w0..w0.wrapping_add(k2)).ok_or(short)?;
            for (kw, wv) in wrow.iter().enumerate() {
                let wv = wv.to_acc();
                let (lo, hi) = valid_range(o2, s2, kw.wrapping_mul(d2), p2, i2);
                if lo >= hi {
                    continue;
                }
                // lo < hi.
                let len = hi.wrapping_sub(lo);
                // Tap of the first output of the row, an input index.
                let iw0 = tap_in(lo, s2, kw, d2, p2);
                // The `len` inputs of a row, `s2` apart: the last one,
                // iw0 + (len - 1)·s2, is an input index too.
                let span = len.wrapping_sub(1).wrapping_mul(s2).wrapping_add(1);
                for od in od_lo..od_hi {
                    let id = tap_in(od, s0, kd, d0, p0);
                    for oh in oh_lo..oh_hi {
                        let ih = tap_in(oh, s1, kh, d1, p1);
                        // (od·o1 + oh)·o2 + lo + len <= out_sz.
                        let y0 = od
                            .wrapping_mul(o1)
                            .wrapping_add(oh)
                            .wrapping_mul(o2)
                            .wrapping_add(lo);
                        let yrow = yp.get_mut(y0..y0.wrapping_add(len)).ok_or(short)?;
                        // (id·i1 + ih)·i2 + iw0 + span <= in_sz.
                        let x0 = id
                            .wrapping_mul(i1)
                            .wrapping_add(ih)
                            .wrapping_mul(i2)
                            .wrapping_add(iw0);
                        let xrow = xp.get(x0..x0.wrapping_add(span)).ok_or(short)?;
                        if s2 == 1 {
                            axpy(yrow, xrow, wv);
                        } else {
                            for (o, &v) in yrow.iter_mut().zip(xrow.iter().step_by(s2_nz.get())) {
                                *o = o.plus(wv.times(v.to_acc()));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn prepare_conv_transpose(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let (xs, ws, group, has_bias) = conv_inputs(ctx)?;
    let [(batch, c, xsp), (wc, wm, wsp)] = split_nc(xs, ws)?;
    if wc != c {
        return Err(Error::new(ErrorKind::Dim {
            axis: 0,
            expected: c as u64,
            got: wc as u64,
        }));
    }
    if !divides(c, group) {
        return Err(attr_err("group", "does not divide the channels"));
    }
    let m = mul(wm, group)?;
    check_bias(ctx, m)?;
    let n = xsp.len();
    check_spatial(n)?;
    let s = axis_attr(ctx, "strides", n, 1)?;
    let d = axis_attr(ctx, "dilations", n, 1)?;
    let ap = auto_pad(ctx)?;
    let pads = if ap == AutoPad::NotSet {
        read_pads(ctx, n)?
    } else {
        vec![0; mul(n, 2)?]
    };
    let opad: Vec<usize> = match ctx.attr_ints("output_padding")? {
        None => vec![0; n],
        Some([]) => vec![0; n],
        Some(v) => {
            if v.len() != n {
                return Err(attr_err(
                    "output_padding",
                    "length differs from the number of spatial axes",
                ));
            }
            v.iter()
                .map(|&x| {
                    if x >= 0 {
                        Ok(x as usize)
                    } else {
                        Err(attr_err("output_padding", "negative"))
                    }
                })
                .collect::<Result<_>>()?
        }
    };
    let oshape: Option<Vec<usize>> = match ctx.attr_ints("output_shape")? {
        None => None,
        Some([]) => None,
        Some(v) => {
            let v = match v.get(2..) {
                Some(spatial) if n.checked_add(2) == Some(v.len()) => spatial,
                _ => v,
            };
            if v.len() != n || v.iter().any(|&x| x < 0) {
                return Err(attr_err(
                    "output_shape",
                    "must hold one size per spatial axis",
                ));
            }
            Some(v.iter().map(|&x| x as usize).collect())
        }
    };
    let (pads_b, pads_e) = pad_halves(&pads, n)?;
    // Output size and padding (begin, end) per axis.
    let (mut out, mut pb, mut pe) = (Vec::new(), Vec::new(), Vec::new());
    let axes = xsp.iter().zip(wsp).zip(&s).zip(&d).zip(&opad);
    let axes = axes.zip(pads_b.iter().zip(pads_e)).enumerate();
    for (i, (((((&inp, &k), &si), &di), &op), (&bi, &ei))) in axes {
        if k == 0 || inp == 0 {
            return Err(shape_err("ConvTranspose: empty input or kernel"));
        }
        // k >= 1 and inp >= 1 (checked above).
        let ek = add(mul(k.wrapping_sub(1), di)?, 1)?;
        let full = add(add(mul(si, inp.wrapping_sub(1))?, op)?, ek)?;
        let target = match (&oshape, ap) {
            (Some(os), _) => Some(*os.get(i).ok_or(Error::new(ErrorKind::Internal(
                "ConvTranspose output_shape",
            )))?),
            (None, AutoPad::SameUpper | AutoPad::SameLower) => Some(mul(inp, si)?),
            _ => None,
        };
        if let Some(os) = target {
            let total = full
                .checked_sub(os)
                .ok_or(Error::new(ErrorKind::Unsupported(
                    "ConvTranspose output_shape larger than the full output",
                )))?;
            let (b, e) = same_halves(total, ap == AutoPad::SameUpper);
            pb.push(b);
            pe.push(e);
            out.push(os);
        } else {
            let (b, e) = if ap == AutoPad::Valid {
                (0, 0)
            } else {
                (bi, ei)
            };
            pb.push(b);
            pe.push(e);
            // Pads past usize exceed the output too.
            out.push(
                b.checked_add(e)
                    .and_then(|be| full.checked_sub(be))
                    .ok_or(shape_err("ConvTranspose: pads exceed the output"))?,
            );
        }
    }
    let u = Geom::unit();
    let g = Geom {
        inp: spatial(xsp, u.inp)?,
        out: spatial(&out, u.out)?,
        k: spatial(wsp, u.k)?,
        s: spatial(&s, u.s)?,
        d: spatial(&d, u.d)?,
        pb: spatial(&pb, u.pb)?,
        pe: spatial(&pe, u.pe)?,
    };
    let p = ConvParams {
        m,
        group,
        g,
        has_bias,
        sz: conv_sizes(batch, c, m, group, &g, ConvDir::Transpose)?,
        act: None,
    };
    let shape = out_shape(batch, m, &g, n)?;
    conv_kernel(ctx, &shape, p, "ConvTranspose", ConvDir::Transpose)
}

/// Scatter-add: `y[n, oc, i*s + k*d - pb] += x[n, ic, i] * w[ic, oc_local, k]`;
/// `acc` as in [`conv_forward`].
fn conv_transpose<T: Float, W: Float<Acc = T::Acc>>(
    x: &[T],
    w: &[W],
    b: Option<&[T]>,
    y: &mut [T],
    acc: &mut [T::Acc],
    p: &ConvParams,
) -> Result<()> {
    let g = &p.g;
    let sz = &p.sz;
    let (in_sz, out_sz, k_sz, cg, mg) = (sz.in_sz, sz.out_sz, sz.k_sz, sz.cg, sz.mg);
    check_len(x.len(), sz.x)?;
    check_len(w.len(), sz.w)?;
    check_len(y.len(), sz.y)?;
    if let Some(b) = b {
        check_len(b.len(), p.m)?;
    }
    if y.is_empty() {
        return Ok(());
    }
    for (ni, yb) in y.chunks_of_mut(sz.yb).enumerate() {
        let xb = util::row(x, ni, sz.xb)?;
        for (oc, yp) in yb.chunks_of_mut(out_sz).enumerate() {
            let (grp, mo) = div_rem(oc, mg, "ConvTranspose: group")?;
            let bias = bias_of(b, oc)?;
            let mut res = Ok(());
            util::accumulate_into(yp, acc, |yp| {
                yp.fill(bias);
                res = (0..cg).try_for_each(|ci| {
                    // grp < group, ci < cg, mo < mg: ic < c and
                    // ic·mg + mo < c·mg, W's rows of k_sz (`conv_sizes`).
                    let ic = grp.wrapping_mul(cg).wrapping_add(ci);
                    let xp = util::row(xb, ic, in_sz)?;
                    let wk = util::row(w, ic.wrapping_mul(mg).wrapping_add(mo), k_sz)?;
                    scatter_plane(yp, xp, wk, g)
                });
            })?;
            res?;
        }
    }
    Ok(())
}

fn scatter_plane<T: Float, W: Float<Acc = T::Acc>>(
    yp: &mut [T::Acc],
    xp: &[T],
    wk: &[W],
    g: &Geom,
) -> Result<()> {
    let short = short("ConvTranspose: plane shorter than its geometry");
    let [o0, o1, o2] = g.out;
    let [i0, i1, i2] = g.inp;
    let [k0, k1, k2] = g.k;
    let [s0, s1, s2] = g.s;
    // Strides are positive (checked at prepare); as NonZero, `step_by`
    // below keeps no zero-step assertion.
    let s2_nz = NonZeroUsize::new(s2).ok_or(short)?;
    let [d0, d1, d2] = g.d;
    let [p0, p1, p2] = g.pb;
    // Offsets wrap by name under the bounds of [`conv_plane`], with the
    // roles of input and output swapped (the reach checked at prepare is
    // that of the inputs, `(inp - 1)·s + (k - 1)·d`).
    for kd in 0..k0 {
        let (id_lo, id_hi) = valid_range(i0, s0, kd.wrapping_mul(d0), p0, o0);
        for kh in 0..k1 {
            let (ih_lo, ih_hi) = valid_range(i1, s1, kh.wrapping_mul(d1), p1, o1);
            // (kd·k1 + kh)·k2 + k2 <= k_sz.
            let w0 = kd.wrapping_mul(k1).wrapping_add(kh).wrapping_mul(k2);
            let wrow = wk.get(w0..w0.wrapping_add(k2)).ok_or(short)?;
            for (kw, wv) in wrow.iter().enumerate() {
                let wv = wv.to_acc();
                let (lo, hi) = valid_range(i2, s2, kw.wrapping_mul(d2), p2, o2);
                if lo >= hi {
                    continue;
                }
                // lo < hi.
                let len = hi.wrapping_sub(lo);
                // Tap of the first input of the row, an output index.
                let ow0 = tap_in(lo, s2, kw, d2, p2);
                // The `len` outputs of a row, `s2` apart: the last one,
                // ow0 + (len - 1)·s2, is an output index too.
                let span = len.wrapping_sub(1).wrapping_mul(s2).wrapping_add(1);
                for id in id_lo..id_hi {
                    let od = tap_in(id, s0, kd, d0, p0);
                    for ih in ih_lo..ih_hi {
                        let oh = tap_in(ih, s1, kh, d1, p1);
                        // (id·i1 + ih)·i2 + lo + len <= in_sz.
                        let x0 = id
                            .wrapping_mul(i1)
                            .wrapping_add(ih)
                            .wrapping_mul(i2)
                            .wrapping_add(lo);
                        let xrow = xp.get(x0..x0.wrapping_add(len)).ok_or(short)?;
                        // (od·o1 + oh)·o2 + ow0 + span <= out_sz.
                        let y0 = od
                            .wrapping_mul(o1)
                            .wrapping_add(oh)
                            .wrapping_mul(o2)
                            .wrapping_add(ow0);
                        let yrow = yp.get_mut(y0..y0.wrapping_add(span)).ok_or(short)?;
                        if s2 == 1 {
                            // Same as axpy with the roles of x and w.
                            for (o, &v) in yrow.iter_mut().zip(xrow) {
                                *o = o.plus(wv.times(v.to_acc()));
                            }
                        } else {
                            for (o, &v) in yrow.iter_mut().step_by(s2_nz.get()).zip(xrow) {
                                *o = o.plus(wv.times(v.to_acc()));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, run, t, vals};

    use crate::ops::testing::rnd;

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    /// Naive 2-D conv: x [n,c,h,w], w [m,c/g,kh,kw], pads [t,l,b,r].
    #[allow(clippy::too_many_arguments)]
    fn naive_conv(
        x: &[f32],
        xs: [usize; 4],
        w: &[f32],
        ws: [usize; 4],
        b: Option<&[f32]>,
        s: [usize; 2],
        d: [usize; 2],
        p: [usize; 4],
        group: usize,
    ) -> (Vec<f32>, [usize; 4]) {
        let [n, c, h, wd] = xs;
        let [m, cg, kh, kw] = ws;
        let oh = (h + p[0] + p[2] - ((kh - 1) * d[0] + 1)) / s[0] + 1;
        let ow = (wd + p[1] + p[3] - ((kw - 1) * d[1] + 1)) / s[1] + 1;
        let mg = m / group;
        let mut y = vec![0f32; n * m * oh * ow];
        for ni in 0..n {
            for oc in 0..m {
                let g = oc / mg;
                for yh in 0..oh {
                    for yw in 0..ow {
                        let mut acc = b.map_or(0.0, |b| b[oc]);
                        for ci in 0..cg {
                            let ic = g * cg + ci;
                            for a in 0..kh {
                                for bb in 0..kw {
                                    let ih = (yh * s[0] + a * d[0]) as isize - p[0] as isize;
                                    let iw = (yw * s[1] + bb * d[1]) as isize - p[1] as isize;
                                    if ih < 0 || iw < 0 || ih >= h as isize || iw >= wd as isize {
                                        continue;
                                    }
                                    acc += x[((ni * c + ic) * h + ih as usize) * wd + iw as usize]
                                        * w[((oc * cg + ci) * kh + a) * kw + bb];
                                }
                            }
                        }
                        y[((ni * m + oc) * oh + yh) * ow + yw] = acc;
                    }
                }
            }
        }
        let _ = c;
        (y, [n, m, oh, ow])
    }

    #[allow(clippy::too_many_arguments)]
    fn check_conv(
        xs: [usize; 4],
        m: usize,
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        p: [usize; 4],
        group: usize,
        bias: bool,
        auto_pad: Option<&str>,
    ) {
        let ws = [m, xs[1] / group, k[0], k[1]];
        let x = rnd(xs.iter().product(), 1);
        let w = rnd(ws.iter().product(), 2);
        let b = rnd(m, 3);
        let (want, ys) = naive_conv(&x, xs, &w, ws, bias.then_some(&b[..]), s, d, p, group);
        let mut attrs = vec![
            ("strides", ints(&[s[0] as i64, s[1] as i64])),
            ("dilations", ints(&[d[0] as i64, d[1] as i64])),
            ("group", AttrValue::Int(group as i64)),
            ("kernel_shape", ints(&[k[0] as i64, k[1] as i64])),
        ];
        match auto_pad {
            Some(a) => attrs.push(("auto_pad", AttrValue::Str(a.as_bytes().to_vec()))),
            None => attrs.push(("pads", ints(&p.map(|v| v as i64)))),
        }
        let mut inputs = vec![t(&xs, &x), t(&ws, &w)];
        if bias {
            inputs.push(t(&[m], &b));
        }
        let out = run("Conv", 11, attrs, &inputs, 1).unwrap();
        assert_eq!(out[0].shape, ys.to_vec());
        assert_close(&vals::<f32>(&out[0]), &want, 1e-5);
    }

    #[test]
    fn conv_basic_pads_bias() {
        check_conv(
            [2, 4, 7, 9],
            6,
            [3, 3],
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            1,
            true,
            None,
        );
        check_conv(
            [1, 3, 5, 5],
            2,
            [3, 3],
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            1,
            false,
            None,
        );
    }

    #[test]
    fn conv_groups_strides_dilations() {
        check_conv(
            [2, 4, 9, 8],
            6,
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 0, 2, 1],
            2,
            true,
            None,
        );
        check_conv(
            [1, 4, 11, 10],
            4,
            [3, 3],
            [1, 1],
            [2, 2],
            [2, 2, 2, 2],
            4,
            true,
            None,
        );
        check_conv(
            [1, 8, 12, 13],
            16,
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            8,
            false,
            None,
        );
        check_conv(
            [1, 3, 10, 11],
            5,
            [2, 3],
            [2, 1],
            [1, 2],
            [0, 0, 0, 0],
            1,
            true,
            None,
        );
        check_conv(
            [1, 3, 10, 11],
            5,
            [3, 2],
            [3, 3],
            [2, 1],
            [0, 1, 2, 0],
            1,
            true,
            None,
        );
    }

    #[test]
    fn conv_pointwise() {
        check_conv(
            [2, 5, 6, 7],
            3,
            [1, 1],
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            1,
            true,
            None,
        );
        check_conv(
            [1, 4, 6, 7],
            6,
            [1, 1],
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            2,
            false,
            None,
        );
        check_conv(
            [1, 4, 6, 7],
            6,
            [1, 1],
            [2, 2],
            [1, 1],
            [0, 0, 0, 0],
            1,
            true,
            None,
        );
        check_conv(
            [1, 4, 6, 7],
            6,
            [1, 1],
            [1, 1],
            [1, 1],
            [1, 0, 0, 1],
            1,
            true,
            None,
        );
    }

    #[test]
    fn conv_auto_pad() {
        // SAME_UPPER, in 9x8, k3, s2: out 5x4, total pads 2 / 1 -> [1,0,1,1].
        check_conv(
            [1, 2, 9, 8],
            3,
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 0, 1, 1],
            1,
            true,
            Some("SAME_UPPER"),
        );
        // SAME_LOWER puts the odd pad at the start.
        check_conv(
            [1, 2, 9, 8],
            3,
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 0],
            1,
            true,
            Some("SAME_LOWER"),
        );
        check_conv(
            [1, 2, 7, 7],
            3,
            [3, 3],
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            1,
            false,
            Some("SAME_UPPER"),
        );
        check_conv(
            [1, 2, 9, 8],
            3,
            [3, 2],
            [2, 2],
            [1, 1],
            [0, 0, 0, 0],
            1,
            true,
            Some("VALID"),
        );
    }

    #[test]
    fn conv_1d_and_3d() {
        // 1-D against the 2-D naive with H = 1.
        let (n, c, w, m, k) = (2, 4, 13, 6, 3);
        let x = rnd(n * c * w, 5);
        let wt = rnd(m * (c / 2) * k, 6);
        let b = rnd(m, 7);
        let (want, _) = naive_conv(
            &x,
            [n, c, 1, w],
            &wt,
            [m, c / 2, 1, k],
            Some(&b),
            [1, 2],
            [1, 2],
            [0, 1, 0, 2],
            2,
        );
        let out = run(
            "Conv",
            11,
            vec![
                ("strides", ints(&[2])),
                ("dilations", ints(&[2])),
                ("pads", ints(&[1, 2])),
                ("group", AttrValue::Int(2)),
            ],
            &[t(&[n, c, w], &x), t(&[m, c / 2, k], &wt), t(&[m], &b)],
            1,
        )
        .unwrap();
        assert_eq!(out[0].shape, vec![n, m, 6]);
        assert_close(&vals::<f32>(&out[0]), &want, 1e-5);
        // 3-D with depth kernel 1 equals 2-D conv per depth slice when D = 1.
        let x = rnd(2 * 5 * 6, 8);
        let wt = rnd(3 * 2 * 3 * 3, 9);
        let (want, ys) = naive_conv(
            &x,
            [1, 2, 5, 6],
            &wt,
            [3, 2, 3, 3],
            None,
            [1, 1],
            [1, 1],
            [1, 1, 1, 1],
            1,
        );
        let out = run(
            "Conv",
            11,
            vec![("pads", ints(&[0, 1, 1, 0, 1, 1]))],
            &[t(&[1, 2, 1, 5, 6], &x), t(&[3, 2, 1, 3, 3], &wt)],
            1,
        )
        .unwrap();
        assert_eq!(out[0].shape, vec![1, 3, 1, ys[2], ys[3]]);
        assert_close(&vals::<f32>(&out[0]), &want, 1e-5);
    }

    #[test]
    fn conv_rejects_bad_shapes() {
        let x = rnd(3 * 4 * 4, 1);
        let w = rnd(2 * 2 * 3 * 3, 2);
        assert!(run(
            "Conv",
            11,
            vec![],
            &[t(&[1, 3, 4, 4], &x), t(&[2, 2, 3, 3], &w)],
            1
        )
        .is_err());
        let w = rnd(2 * 3 * 5 * 5, 2);
        assert!(run(
            "Conv",
            11,
            vec![],
            &[t(&[1, 3, 4, 4], &x), t(&[2, 3, 5, 5], &w)],
            1
        )
        .is_err());
    }

    #[test]
    fn absurd_sizes_overflow() {
        use crate::error::ErrorKind;
        let e: [f32; 0] = [];
        let one = [1f32];
        // An empty batch whose output plane (big · big) is past usize (on
        // 32- and 64-bit targets alike).
        let half = usize::BITS / 2 + 1;
        let big = 1usize << half;
        let err = run(
            "Conv",
            11,
            vec![],
            &[t(&[0, 1, big, big], &e), t(&[1, 1, 1, 1], &one)],
            1,
        )
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Overflow);
        // ConvTranspose: the full output, stride · (inp - 1) + ek, past usize.
        let s = 1i64 << half;
        let err = run(
            "ConvTranspose",
            11,
            vec![("strides", ints(&[s]))],
            &[t(&[0, 1, big], &e), t(&[1, 1, 1], &one)],
            1,
        )
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Overflow);
        // A window reach past usize (dilation usize::MAX / 4 + 1, kernel 8).
        let err = run(
            "Conv",
            11,
            vec![("dilations", ints(&[1i64 << (usize::BITS - 2)]))],
            &[t(&[0, 1, 4], &e), t(&[1, 1, 8], &[0f32; 8])],
            1,
        )
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Overflow);
    }

    /// Naive 2-D transposed conv by scatter; w [c, m/g, kh, kw].
    #[allow(clippy::too_many_arguments)]
    fn naive_convt(
        x: &[f32],
        xs: [usize; 4],
        w: &[f32],
        ws: [usize; 4],
        b: Option<&[f32]>,
        s: [usize; 2],
        d: [usize; 2],
        p: [usize; 4],
        op: [usize; 2],
        group: usize,
    ) -> (Vec<f32>, [usize; 4]) {
        let [n, c, h, wd] = xs;
        let [_, mg, kh, kw] = ws;
        let m = mg * group;
        let cg = c / group;
        let oh = s[0] * (h - 1) + op[0] + (kh - 1) * d[0] + 1 - p[0] - p[2];
        let ow = s[1] * (wd - 1) + op[1] + (kw - 1) * d[1] + 1 - p[1] - p[3];
        let mut y = vec![0f32; n * m * oh * ow];
        for ni in 0..n {
            for oc in 0..m {
                for i in 0..oh * ow {
                    y[(ni * m + oc) * oh * ow + i] = b.map_or(0.0, |b| b[oc]);
                }
            }
            for ic in 0..c {
                let g = ic / cg;
                for ih in 0..h {
                    for iw in 0..wd {
                        let xv = x[((ni * c + ic) * h + ih) * wd + iw];
                        for mo in 0..mg {
                            let oc = g * mg + mo;
                            for a in 0..kh {
                                for bb in 0..kw {
                                    let yh = (ih * s[0] + a * d[0]) as isize - p[0] as isize;
                                    let yw = (iw * s[1] + bb * d[1]) as isize - p[1] as isize;
                                    if yh < 0 || yw < 0 || yh >= oh as isize || yw >= ow as isize {
                                        continue;
                                    }
                                    y[((ni * m + oc) * oh + yh as usize) * ow + yw as usize] +=
                                        xv * w[((ic * mg + mo) * kh + a) * kw + bb];
                                }
                            }
                        }
                    }
                }
            }
        }
        (y, [n, m, oh, ow])
    }

    #[allow(clippy::too_many_arguments)]
    fn check_convt(
        xs: [usize; 4],
        mg: usize,
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        p: [usize; 4],
        op: [usize; 2],
        group: usize,
        extra: Vec<(&str, AttrValue)>,
    ) {
        let ws = [xs[1], mg, k[0], k[1]];
        let m = mg * group;
        let x = rnd(xs.iter().product(), 11);
        let w = rnd(ws.iter().product(), 12);
        let b = rnd(m, 13);
        let (want, ys) = naive_convt(&x, xs, &w, ws, Some(&b), s, d, p, op, group);
        let mut attrs = vec![
            ("strides", ints(&[s[0] as i64, s[1] as i64])),
            ("dilations", ints(&[d[0] as i64, d[1] as i64])),
            ("group", AttrValue::Int(group as i64)),
            ("output_padding", ints(&[op[0] as i64, op[1] as i64])),
        ];
        if extra.is_empty() {
            attrs.push(("pads", ints(&p.map(|v| v as i64))));
        }
        attrs.extend(extra);
        let out = run(
            "ConvTranspose",
            11,
            attrs,
            &[t(&xs, &x), t(&ws, &w), t(&[m], &b)],
            1,
        )
        .unwrap();
        assert_eq!(out[0].shape, ys.to_vec());
        assert_close(&vals::<f32>(&out[0]), &want, 1e-5);
    }

    #[test]
    fn conv_transpose_2d() {
        check_convt(
            [2, 4, 5, 6],
            3,
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            vec![],
        );
        check_convt(
            [1, 4, 5, 6],
            3,
            [3, 3],
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            [0, 0],
            1,
            vec![],
        );
        check_convt(
            [1, 4, 5, 6],
            2,
            [3, 2],
            [2, 3],
            [2, 1],
            [2, 0, 1, 1],
            [1, 2],
            2,
            vec![],
        );
        check_convt(
            [1, 4, 4, 4],
            1,
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            4,
            vec![],
        );
        check_convt(
            [1, 2, 4, 5],
            3,
            [4, 4],
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            [0, 0],
            1,
            vec![],
        );
    }

    #[test]
    fn conv_transpose_output_shape_and_auto_pad() {
        // in 5x6, k3, s2: full 11x13; output_shape 10x12 -> total pads 1: begin 1, end 0.
        check_convt(
            [1, 2, 5, 6],
            3,
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 0, 0],
            [0, 0],
            1,
            vec![("output_shape", ints(&[10, 12]))],
        );
        // SAME_UPPER: output in*s = 10x12, extra pad at the end.
        check_convt(
            [1, 2, 5, 6],
            3,
            [3, 3],
            [2, 2],
            [1, 1],
            [0, 0, 1, 1],
            [0, 0],
            1,
            vec![("auto_pad", AttrValue::Str(b"SAME_UPPER".to_vec()))],
        );
    }

    #[test]
    fn conv_transpose_1d() {
        let (c, w, mg, k) = (3, 7, 2, 3);
        let x = rnd(c * w, 21);
        let wt = rnd(c * mg * k, 22);
        let (want, ys) = naive_convt(
            &x,
            [1, c, 1, w],
            &wt,
            [c, mg, 1, k],
            None,
            [1, 2],
            [1, 1],
            [0, 1, 0, 0],
            [0, 1],
            1,
        );
        let out = run(
            "ConvTranspose",
            11,
            vec![
                ("strides", ints(&[2])),
                ("pads", ints(&[1, 0])),
                ("output_padding", ints(&[1])),
            ],
            &[t(&[1, c, w], &x), t(&[c, mg, k], &wt)],
            1,
        )
        .unwrap();
        assert_eq!(out[0].shape, vec![1, mg, ys[3]]);
        assert_close(&vals::<f32>(&out[0]), &want, 1e-5);
    }

    #[test]
    fn narrow_floats_accumulate_in_f32() {
        use crate::ops::testing::float_types_agree;
        let attrs = |group: i64, s: i64, p: i64| {
            vec![
                ("group", AttrValue::Int(group)),
                ("strides", ints(&[s, s])),
                ("pads", ints(&[p, p, p, p])),
            ]
        };
        let x = rnd(2 * 8 * 9 * 10, 41);
        // Dense 3x3, grouped, depthwise strided, pointwise.
        for (group, m, k, s, p) in [
            (1, 6, 3, 1, 1),
            (2, 4, 3, 1, 0),
            (8, 8, 3, 2, 1),
            (1, 5, 1, 1, 0),
        ] {
            let w = rnd(m * (8 / group) * k * k, 42);
            let b = rnd(m, 43);
            float_types_agree(
                "Conv",
                11,
                attrs(group as i64, s, p),
                &[
                    (&[2, 8, 9, 10], &x),
                    (&[m, 8 / group, k, k], &w),
                    (&[m], &b),
                ],
                1e-5,
            );
        }
        // ConvTranspose, grouped, strided, no bias.
        let w = rnd(8 * 3 * 2 * 3, 44);
        float_types_agree(
            "ConvTranspose",
            11,
            vec![("group", AttrValue::Int(2)), ("strides", ints(&[2, 1]))],
            &[(&[2, 8, 9, 10], &x), (&[8, 3, 2, 3], &w)],
            1e-5,
        );
    }

    #[test]
    fn f16_weights_against_f32_input() {
        // Exactly the f32 result with the weights rounded to f16.
        let x = rnd(2 * 4 * 7 * 6, 71);
        let w: Vec<f32> = rnd(6 * 2 * 3 * 3, 72)
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect();
        let wh: Vec<half::f16> = w.iter().map(|&v| half::f16::from_f32(v)).collect();
        let b = rnd(6, 73);
        let attrs = || vec![("group", AttrValue::Int(2)), ("pads", ints(&[1, 0, 1, 2]))];
        for op in ["Conv", "ConvTranspose"] {
            let ws: &[usize] = if op == "Conv" {
                &[6, 2, 3, 3]
            } else {
                &[4, 3, 3, 3]
            };
            // Both produce 6 output channels.
            let n = 6;
            let want = run(
                op,
                11,
                attrs(),
                &[t(&[2, 4, 7, 6], &x), t(ws, &w), t(&[n], &b)],
                1,
            )
            .unwrap();
            let got = run(
                op,
                11,
                attrs(),
                &[t(&[2, 4, 7, 6], &x), t(ws, &wh), t(&[n], &b)],
                1,
            )
            .unwrap();
            assert_eq!(got[0].shape, want[0].shape);
            assert_eq!(vals::<f32>(&got[0]), vals::<f32>(&want[0]), "{op}");
        }
        // f16 X with f32 W is not a supported pairing.
        let xh: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
        assert!(run(
            "Conv",
            11,
            vec![],
            &[t(&[2, 4, 7, 6], &xh), t(&[6, 4, 3, 3], &rnd(6 * 36, 1))],
            1
        )
        .is_err());
    }

    /// Conv outputs (as bits) with no provider and with 2 and 3 workers
    /// must be equal, and close to the naive loops.
    fn check_split_conv(
        xs: [usize; 4],
        m: usize,
        k: usize,
        s: usize,
        pad: usize,
        group: usize,
        splits: bool,
    ) {
        let ws = [m, xs[1] / group, k, k];
        let x = rnd(xs.iter().product(), 4);
        let w = rnd(ws.iter().product(), 5);
        let b = rnd(m, 6);
        let (want, _) = naive_conv(&x, xs, &w, ws, Some(&b), [s, s], [1, 1], [pad; 4], group);
        let attrs = vec![
            ("strides", ints(&[s as i64, s as i64])),
            ("group", AttrValue::Int(group as i64)),
            ("pads", ints(&[pad as i64; 4])),
        ];
        let inputs = vec![t(&xs, &x), t(&ws, &w), t(&[m], &b)];
        let calls = crate::kern::par::testing::split_calls();
        let runs = crate::kern::par::testing::each(|| {
            let out = run("Conv", 11, attrs.clone(), &inputs, 1).unwrap();
            vals::<f32>(&out[0])
        });
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let what = alloc::format!("x{xs:?} m{m} k{k} s{s} group{group}");
        let split = crate::kern::par::testing::split_calls() > calls;
        // 32-bit targets run the reference loops, which do not split.
        if cfg!(target_pointer_width = "64") {
            assert_eq!(split, splits, "split: {what}");
        }
        assert_eq!(bits(&runs[0]), bits(&runs[1]), "2 workers: {what}");
        assert_eq!(bits(&runs[0]), bits(&runs[2]), "3 workers: {what}");
        assert_close(&runs[0], &want, 1e-4);
    }

    /// Sizes small enough for Miri (`scripts/reliability.sh miri`), where
    /// the split threshold is lowered so that these split: the (image,
    /// group) GEMMs shared out whole, and depthwise planes shared out (the
    /// `unsafe` output views of `conv_groups` and `conv_depthwise`).
    #[test]
    fn split_conv_small() {
        check_split_conv([2, 8, 5, 5], 16, 3, 1, 1, 4, cfg!(miri));
        check_split_conv([1, 4, 6, 6], 4, 3, 1, 1, 4, cfg!(miri));
        check_split_conv([1, 3, 7, 7], 3, 3, 2, 1, 3, cfg!(miri));
    }

    #[test]
    fn split_conv_is_bit_identical() {
        // One large GEMM, split inside sgemm.
        check_split_conv([1, 16, 32, 32], 32, 3, 1, 1, 1, true);
        // Pointwise.
        check_split_conv([1, 64, 16, 16], 64, 1, 1, 0, 1, true);
        // Grouped and batched: (image, group) GEMMs shared out whole.
        check_split_conv([2, 32, 16, 16], 32, 3, 1, 1, 4, true);
        // A few GEMMs, each split inside; strided.
        check_split_conv([3, 8, 41, 41], 16, 3, 2, 1, 1, true);
        // Depthwise, planes shared out: small planes (the flat path) and
        // large ones (row by row), stride 1 and 2.
        check_split_conv([2, 32, 40, 40], 32, 3, 1, 1, 32, true);
        check_split_conv([1, 32, 64, 64], 32, 3, 1, 1, 32, true);
        check_split_conv([1, 24, 96, 96], 24, 3, 2, 1, 24, true);
        // Too small to split.
        check_split_conv([1, 4, 5, 5], 4, 3, 1, 1, 1, false);
    }
}
