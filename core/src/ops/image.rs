//! Image sampling and rearrangement: GridSample, AffineGrid, Col2Im,
//! CenterCropPad, RoiAlign, DeformConv.
//!
//! Semantics follow the ONNX reference implementation (which follows
//! PyTorch's `grid_sample` / `affine_grid` / `fold` and torchvision's
//! `roi_align` / `deform_conv2d`); f32 data.

use alloc::vec;
use alloc::vec::Vec;

use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::kern::{win, win_mut};
use crate::ops::util::{div, div_rem, divides, dtype_in, row, row_mut};
use crate::ops::{kernel, OpDef, PrepareCtx, Prepared};
use crate::tensor::ChunksOf as _;
use crate::tensor::MAX_RANK;
use crate::DType;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("GridSample", 16, prepare_grid_sample),
    OpDef::onnx("AffineGrid", 20, prepare_affine_grid),
    OpDef::onnx("Col2Im", 18, prepare_col2im),
    OpDef::onnx("CenterCropPad", 18, prepare_center_crop_pad),
    OpDef::onnx("RoiAlign", 10, prepare_roi_align),
    OpDef::onnx("DeformConv", 19, prepare_deform_conv),
];

fn attr_err(name: &'static str, problem: &'static str) -> Error {
    Error::new(ErrorKind::Attribute { name, problem })
}

fn shape_err(s: &'static str) -> Error {
    Error::new(ErrorKind::Shape(s))
}

fn to_usize(v: i64, what: &'static str) -> Result<usize> {
    usize::try_from(v).map_err(|_| shape_err(what))
}

fn overflow() -> Error {
    Error::new(ErrorKind::Overflow)
}

/// `a * b`, or `Overflow`.
fn mul(a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or(overflow())
}

// ---------------------------------------------------------------- GridSample

#[derive(Clone, Copy, Debug, PartialEq)]
enum Interp {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Pad {
    Zeros,
    Border,
    Reflection,
}

/// Reflects `x` by the nearer border until it lies in `[lo, hi]`.
fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let rng = hi - lo;
    if x < lo {
        let dx = lo - x;
        let n = libm::trunc(dx / rng);
        let r = dx - n * rng;
        if n % 2.0 == 0.0 {
            lo + r
        } else {
            hi - r
        }
    } else if x > hi {
        let dx = x - hi;
        let n = libm::trunc(dx / rng);
        let r = dx - n * rng;
        if n % 2.0 == 0.0 {
            hi - r
        } else {
            lo + r
        }
    } else {
        x
    }
}

/// Keys cubic convolution weights (alpha -0.75) for fractional offset `t`.
fn cubic_coeffs(t: f32) -> [f32; 4] {
    let a = -0.75f32;
    let x = t.abs();
    let x1 = x + 1.0;
    let y = 1.0 - x;
    let y1 = 2.0 - x;
    [
        ((a * x1 - 5.0 * a) * x1 + 8.0 * a) * x1 - 4.0 * a,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
        ((a + 2.0) * y - (a + 3.0)) * y * y + 1.0,
        ((a * y1 - 5.0 * a) * y1 + 8.0 * a) * y1 - 4.0 * a,
    ]
}

/// The element index along one axis of size `d` that integer position `i`
/// reads under `pad`, or `None` for an implicit zero.
fn pixel_index(i: i64, d: usize, pad: Pad, lo: f64, hi: f64) -> Option<usize> {
    // An empty axis has no pixel (and `clamp(0, -1)` panics). An axis
    // longer than i64::MAX (no buffer holds one) clamps at i64::MAX.
    let last = i64::try_from(d.checked_sub(1)?).unwrap_or(i64::MAX);
    match pad {
        Pad::Zeros => (i >= 0 && i <= last).then_some(i as usize),
        Pad::Border => Some(i.clamp(0, last) as usize),
        Pad::Reflection => {
            let r = reflect(i as f64, lo, hi) as i64;
            Some(r.clamp(0, last) as usize)
        }
    }
}

/// One spatial axis of a GridSample input: length, element stride within a
/// plane, and the range `[lo, hi]` the padding modes clamp / reflect into.
#[derive(Clone, Copy, Debug)]
struct GridAxis {
    len: usize,
    stride: usize,
    lo: f64,
    hi: f64,
}

fn prepare_grid_sample(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let g = ctx.input(1)?;
    dtype_in(x.dtype, &[DType::F32], "GridSample X")?;
    dtype_in(g.dtype, &[DType::F32], "GridSample grid")?;
    let r = x.shape.len();
    let nd = match r {
        4 => 2,
        5 => 3,
        _ => {
            return Err(Error::new(ErrorKind::Unsupported(
                "GridSample: only 4-D and 5-D input",
            )))
        }
    };
    let (&[n, c], xsp) = x
        .shape
        .split_first_chunk::<2>()
        .ok_or(Error::internal("image index"))?;
    let grid_err = || shape_err("GridSample: grid must be [N, spatial..., rank-2]");
    let (gn, gsp, glast) = match g.shape {
        [gn, gsp @ .., glast] => (*gn, gsp, *glast),
        _ => return Err(grid_err()),
    };
    if g.shape.len() != r || gn != n || glast != nd {
        return Err(grid_err());
    }
    let default_mode = if ctx.opset >= 20 {
        "linear"
    } else {
        "bilinear"
    };
    let mode = match ctx.attr_str("mode", default_mode)? {
        "nearest" => Interp::Nearest,
        "bilinear" | "linear" => Interp::Linear,
        "bicubic" | "cubic" => Interp::Cubic,
        _ => return Err(attr_err("mode", "unknown interpolation mode")),
    };
    let pad = match ctx.attr_str("padding_mode", "zeros")? {
        "zeros" => Pad::Zeros,
        "border" => Pad::Border,
        "reflection" => Pad::Reflection,
        _ => return Err(attr_err("padding_mode", "unknown padding mode")),
    };
    let align = ctx.attr_int("align_corners", 0)? != 0;
    if xsp.contains(&0) {
        return Err(shape_err("GridSample: empty spatial axis"));
    }
    let mut axes: Vec<GridAxis> = Vec::with_capacity(nd);
    let mut s = 1;
    for &len in xsp.iter().rev() {
        let (lo, hi) = if align {
            (0.0, len as f64 - 1.0)
        } else {
            (-0.5, len as f64 - 0.5)
        };
        axes.push(GridAxis {
            len,
            stride: s,
            lo,
            hi,
        });
        s = mul(s, len)?;
    }
    axes.reverse();
    let plane = s;
    let npts = checked_numel(gsp)?;
    // Per image: input elements, output elements, grid values.
    let (cplane, cnpts, gpts) = (mul(c, plane)?, mul(c, npts)?, mul(npts, nd)?);
    let mut out = vec![n, c];
    out.extend_from_slice(gsp);
    let k: usize = match mode {
        Interp::Nearest => 1,
        Interp::Linear => 2,
        Interp::Cubic => 4,
    };
    let ncombo = k.pow(nd as u32);
    Ok(Prepared::single(
        DType::F32,
        &out,
        kernel("GridSample", move |io| {
            let xs = io.input_slice::<f32>(0)?;
            let gs = io.input_slice::<f32>(1)?;
            let y = io.output_slice::<f32>(0)?;
            // Per grid point, the (plane offset, weight) of every combination
            // of per-axis taps, or None where one reads an implicit zero; the
            // same for every channel. At most 4 taps on 3 axes.
            let mut taps_buf = [None::<(usize, f32)>; 64];
            let taps = taps_buf
                .get_mut(..ncombo)
                .ok_or(Error::internal("image index"))?;
            for b in 0..n {
                let xb = row(xs, b, cplane)?;
                let yb = row_mut(y, b, cnpts)?;
                let gb = row(gs, b, gpts)?;
                for (p, gp) in gb.chunks_of(nd).enumerate() {
                    let mut idx = [[None::<usize>; 4]; 3];
                    let mut wt = [[0f32; 4]; 3];
                    // The grid lists coordinates innermost axis first.
                    for ((ax, (idx_d, wt_d)), &nv) in axes
                        .iter()
                        .zip(idx.iter_mut().zip(wt.iter_mut()))
                        .zip(gp.iter().rev())
                    {
                        let len = ax.len as f32;
                        let mut v = if align {
                            (nv + 1.0) / 2.0 * (len - 1.0)
                        } else {
                            ((nv + 1.0) * len - 1.0) / 2.0
                        };
                        if mode == Interp::Nearest {
                            v = libm::rintf(v);
                        }
                        if (v as f64) < ax.lo || (v as f64) > ax.hi {
                            match pad {
                                // `clamp` panics on an empty range.
                                Pad::Border if len >= 1.0 => {
                                    // As `clamp` (NaN stays NaN), without its
                                    // min <= max assertion.
                                    if v < 0.0 {
                                        v = 0.0;
                                    } else if v > len - 1.0 {
                                        v = len - 1.0;
                                    }
                                }
                                Pad::Border => {}
                                Pad::Reflection => v = reflect(v as f64, ax.lo, ax.hi) as f32,
                                Pad::Zeros => {}
                            }
                        }
                        let at = |i: i64| pixel_index(i, ax.len, pad, ax.lo, ax.hi);
                        (*idx_d, *wt_d) = match mode {
                            Interp::Nearest => {
                                ([at(v as i64), None, None, None], [1.0, 0.0, 0.0, 0.0])
                            }
                            Interp::Linear => {
                                let f = libm::floorf(v);
                                let t = v - f;
                                let i0 = f as i64;
                                (
                                    [at(i0), at(i0.saturating_add(1)), None, None],
                                    [1.0 - t, t, 0.0, 0.0],
                                )
                            }
                            Interp::Cubic => {
                                let f = libm::floorf(v);
                                let i0 = f as i64;
                                (
                                    [
                                        at(i0.saturating_sub(1)),
                                        at(i0),
                                        at(i0.saturating_add(1)),
                                        at(i0.saturating_add(2)),
                                    ],
                                    cubic_coeffs(v - f),
                                )
                            }
                        };
                    }
                    for (combo, tap) in taps.iter_mut().enumerate() {
                        let mut rem = combo;
                        let mut off = Some(0usize);
                        let mut w = 1f32;
                        for ((ax, idx_d), wt_d) in axes.iter().zip(&idx).zip(&wt).rev() {
                            let (q, j) = div_rem(rem, k, "image taps")?;
                            rem = q;
                            let (i, wj) = idx_d
                                .get(j)
                                .zip(wt_d.get(j))
                                .ok_or(Error::internal("image index"))?;
                            // i < ax.len (pixel_index): the offset stays
                            // below plane, checked in prepare.
                            off = off
                                .zip(*i)
                                .map(|(o, i)| o.wrapping_add(i.wrapping_mul(ax.stride)));
                            w *= wj;
                        }
                        *tap = off.map(|o| (o, w));
                    }
                    for (xp, yc) in xb.chunks_of(plane).zip(yb.chunks_of_mut(npts)) {
                        let mut acc = 0f32;
                        for &(off, w) in taps.iter().flatten() {
                            acc += w * *xp.get(off).ok_or(Error::internal("image index"))?;
                        }
                        *yc.get_mut(p).ok_or(Error::internal("image index"))? = acc;
                    }
                }
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------- AffineGrid

/// Normalized sample positions along an axis of `d` pixels.
fn base_coords(d: usize, align: bool) -> Vec<f64> {
    (0..d)
        .map(|i| {
            if align {
                if d == 1 {
                    -1.0
                } else {
                    -1.0 + i as f64 * (2.0 / (d as f64 - 1.0))
                }
            } else {
                let step = 2.0 / d as f64;
                -1.0 + step / 2.0 + i as f64 * step
            }
        })
        .collect()
}

fn prepare_affine_grid(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let th = ctx.input(0)?;
    dtype_in(th.dtype, &[DType::F32], "AffineGrid theta")?;
    let size = ctx
        .const_ints(1)?
        .ok_or(Error::new(ErrorKind::MissingInput { index: 1 }))?;
    let align = ctx.attr_int("align_corners", 0)? != 0;
    // size is [N, C, (D,) H, W].
    let (n, size_sp) = match size.as_slice() {
        [n, _, sp @ ..] if sp.len() == 2 || sp.len() == 3 => (*n, sp),
        _ => return Err(shape_err("AffineGrid: size must have 4 or 5 entries")),
    };
    let nd = size_sp.len();
    // One theta row of nd + 1 (nd is 2 or 3) per output coordinate.
    let cols = nd.wrapping_add(1);
    let n = to_usize(n, "AffineGrid: negative size")?;
    if th.shape != [n, nd, cols] {
        return Err(shape_err(
            "AffineGrid: theta must be [N, 2, 3] or [N, 3, 4]",
        ));
    }
    let mut sp = Vec::new();
    for &v in size_sp {
        sp.push(to_usize(v, "AffineGrid: negative size")?);
    }
    // Axes of `sp` are (D,) H, W; the output's last axis lists x (W) first.
    let axes: Vec<Vec<f64>> = sp.iter().map(|&d| base_coords(d, align)).collect();
    let npts = checked_numel(&sp)?;
    // Per image: theta values, output values.
    let (tl, ypts) = (mul(nd, cols)?, mul(npts, nd)?);
    let mut out = vec![n];
    out.extend_from_slice(&sp);
    out.push(nd);
    Ok(Prepared::single(
        DType::F32,
        &out,
        kernel("AffineGrid", move |io| {
            let t = io.input_slice::<f32>(0)?;
            let y = io.output_slice::<f32>(0)?;
            for b in 0..n {
                let tb = row(t, b, tl)?;
                let yb = row_mut(y, b, ypts)?;
                for (p, yp) in yb.chunks_of_mut(nd).enumerate() {
                    let mut homo = [1f64; 4];
                    let mut rem = p;
                    // homo = [x, y, (z,) 1]: innermost axis first.
                    for (h, ax) in homo.iter_mut().zip(axes.iter().rev()) {
                        let (q, i) = div_rem(rem, ax.len(), "image index")?;
                        rem = q;
                        *h = *ax.get(i).ok_or(Error::internal("image index"))?;
                    }
                    // One theta row of nd + 1 per output coordinate.
                    for (o, trow) in yp.iter_mut().zip(tb.chunks_of(cols)) {
                        let mut acc = 0f64;
                        for (&tv, &hv) in trow.iter().zip(&homo) {
                            acc += tv as f64 * hv;
                        }
                        *o = acc as f32;
                    }
                }
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------- Col2Im

/// One image axis of Col2Im: image and block length, stride, dilation,
/// begin pad, the number of block positions along it, and the element
/// stride of the axis in the image.
#[derive(Clone, Copy, Debug)]
struct Col2ImAxis {
    img: i64,
    blk: i64,
    stride: i64,
    dil: i64,
    pad: i64,
    ncol: i64,
    step: usize,
}

fn prepare_col2im(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    dtype_in(x.dtype, &[DType::F32], "Col2Im")?;
    let img = ctx
        .const_ints(1)?
        .ok_or(Error::new(ErrorKind::MissingInput { index: 1 }))?;
    let blk = ctx
        .const_ints(2)?
        .ok_or(Error::new(ErrorKind::MissingInput { index: 2 }))?;
    let nd = img.len();
    if nd == 0 || blk.len() != nd || nd > MAX_RANK {
        return Err(shape_err(
            "Col2Im: image_shape and block_shape differ in length",
        ));
    }
    let list = |name: &'static str, def: i64, len: usize| -> Result<Vec<i64>> {
        match ctx.attr_ints(name)? {
            Some(v) if v.len() == len => Ok(v.to_vec()),
            Some(_) => Err(attr_err(name, "wrong length")),
            None => Ok(vec![def; len]),
        }
    };
    let dil = list("dilations", 1, nd)?;
    // nd <= MAX_RANK (checked above).
    let pads = list("pads", 0, nd.wrapping_mul(2))?;
    let strides = list("strides", 1, nd)?;
    let &[n, ck, l] = x.shape else {
        return Err(Error::new(ErrorKind::Rank {
            expected: 3,
            got: x.shape.len(),
        }));
    };
    let ksize = blk
        .iter()
        .try_fold(1i64, |a, &b| a.checked_mul(b))
        .ok_or(overflow())?;
    if ksize <= 0 || !divides(ck, ksize as usize) {
        return Err(shape_err(
            "Col2Im: input dim 1 not a multiple of the block size",
        ));
    }
    let ksize = ksize as usize;
    let c = div(ck, ksize, "Col2Im: block size")?;
    // pads are [begin..., end...].
    let (pads0, pads1) = pads
        .split_at_checked(nd)
        .ok_or(Error::internal("image index"))?;
    let mut axes: Vec<Col2ImAxis> = Vec::with_capacity(nd);
    for (((&im, &bk), (&st, &d)), (&p0, &p1)) in img
        .iter()
        .zip(&blk)
        .zip(strides.iter().zip(&dil))
        .zip(pads0.iter().zip(pads1))
    {
        if st <= 0 || d <= 0 || im <= 0 || bk <= 0 {
            return Err(attr_err("strides", "must be positive"));
        }
        let v = im
            .checked_add(p0)
            .and_then(|v| v.checked_add(p1))
            .and_then(|v| v.checked_sub(d.checked_mul(bk.checked_sub(1)?)?.checked_add(1)?))
            .and_then(|v| v.checked_div(st))
            .and_then(|v| v.checked_add(1))
            .ok_or(Error::new(ErrorKind::Overflow))?;
        if v < 1 {
            return Err(shape_err("Col2Im: no sliding blocks"));
        }
        axes.push(Col2ImAxis {
            img: im,
            blk: bk,
            stride: st,
            dil: d,
            pad: p0,
            ncol: v,
            step: 0,
        });
    }
    let nblk = axes
        .iter()
        .try_fold(1i64, |a, ax| a.checked_mul(ax.ncol))
        .ok_or(overflow())?;
    if usize::try_from(nblk).ok() != Some(l) {
        return Err(shape_err(
            "Col2Im: input dim 2 does not match the block count",
        ));
    }
    // Every image length is positive (checked above).
    let img_sz: Vec<usize> = img.iter().map(|&v| v as usize).collect();
    let plane = checked_numel(&img_sz)?;
    let mut step = 1usize;
    for (ax, &len) in axes.iter_mut().zip(&img_sz).rev() {
        ax.step = step;
        step = mul(step, len)?;
    }
    // Per image and channel: input elements (one per table entry).
    let kl = mul(ksize, l)?;
    let nc = mul(n, c)?;
    // For each (kernel offset, block) the image element it adds to.
    let mut table = Vec::with_capacity(kl);
    for kc in 0..ksize {
        for col in 0..l {
            let (mut kr, mut cr) = (kc, col);
            let mut off = Some(0usize);
            for ax in axes.iter().rev() {
                let (blk, ncol) = (ax.blk as usize, ax.ncol as usize);
                let (qk, ko) = div_rem(kr, blk, "Col2Im: block table")?;
                let (qc, co) = div_rem(cr, ncol, "Col2Im: block table")?;
                (kr, cr) = (qk, qc);
                let (ko, co) = (ko as i64, co as i64);
                // The position co * stride - pad + ko * dil, None outside
                // the image. co * stride + ko * dil does not overflow (it
                // is below the padded length checked with ncol); an
                // overflow after the pad means a position far outside.
                let pos = co
                    .checked_mul(ax.stride)
                    .and_then(|v| v.checked_add(ko.checked_mul(ax.dil)?))
                    .and_then(|v| v.checked_sub(ax.pad))
                    .filter(|p| (0..ax.img).contains(p));
                // pos < img: the offset stays below plane (checked above).
                off = off
                    .zip(pos)
                    .map(|(o, p)| o.wrapping_add((p as usize).wrapping_mul(ax.step)));
            }
            table.push(off.unwrap_or(usize::MAX));
        }
    }
    let mut out = vec![n, c];
    out.extend_from_slice(&img_sz);
    Ok(Prepared::single(
        DType::F32,
        &out,
        kernel("Col2Im", move |io| {
            let xs = io.input_slice::<f32>(0)?;
            let y = io.output_slice::<f32>(0)?;
            y.fill(0.0);
            // Image by image, channel by channel: row b * c + ch.
            for bc in 0..nc {
                let src = row(xs, bc, kl)?;
                let dst = row_mut(y, bc, plane)?;
                for (&t, &v) in table.iter().zip(src) {
                    if let Some(o) = dst.get_mut(t) {
                        *o += v;
                    }
                }
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------- CenterCropPad

/// One axis of CenterCropPad: elements copied, and the first input / output
/// element offset (index times stride) and stride.
#[derive(Clone, Copy, Debug)]
struct CropAxis {
    cnt: usize,
    src0: usize,
    ist: usize,
    dst0: usize,
    ost: usize,
}

fn prepare_center_crop_pad(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let shape = ctx
        .const_ints(1)?
        .ok_or(Error::new(ErrorKind::MissingInput { index: 1 }))?;
    let r = x.shape.len();
    if r == 0 || r > MAX_RANK {
        return Err(Error::new(ErrorKind::Unsupported(
            "CenterCropPad: rank 0 or above 8",
        )));
    }
    let axes: Vec<usize> = match ctx.attr_ints("axes")? {
        Some(a) => a
            .iter()
            .map(|&v| crate::ops::util::axis(v, r, "axes"))
            .collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    if axes.len() != shape.len() {
        return Err(shape_err("CenterCropPad: shape and axes differ in length"));
    }
    let mut out = x.shape.to_vec();
    // Per axis: first input index copied, first output index written, count.
    let mut span: Vec<(usize, usize, usize)> = x.shape.iter().map(|&d| (0, 0, d)).collect();
    for (&a, &s) in axes.iter().zip(&shape) {
        let s = to_usize(s, "CenterCropPad: negative shape")?;
        let (Some(o), Some((src0, dst0, cnt))) = (out.get_mut(a), span.get_mut(a)) else {
            return Err(Error::internal("image index"));
        };
        let d = *o;
        *o = s;
        let half = div(d.abs_diff(s), 2, "CenterCropPad: half")?;
        if s < d {
            *src0 = half;
            *cnt = s;
        } else if s > d {
            *dst0 = half;
        }
    }
    let es = x.dtype.size();
    // Byte sizes of input and output: every offset below stays under them.
    mul(checked_numel(x.shape)?, es)?;
    mul(checked_numel(&out)?, es)?;
    // Each axis copies inside both shapes: always so for distinct axes; a
    // repeated axis (undefined by the spec) can leave a span outside, and
    // the kernel then refuses to run rather than read a neighbouring row.
    let inside = span
        .iter()
        .zip(x.shape.iter().zip(&out))
        .all(|(&(s0, d0, n), (&di, &dout))| {
            s0.checked_add(n).is_some_and(|e| e <= di)
                && d0.checked_add(n).is_some_and(|e| e <= dout)
        });
    let ist = crate::tensor::strides(x.shape).ok_or(Error::internal("image index"))?;
    let ost = crate::tensor::strides(&out).ok_or(Error::internal("image index"))?;
    let mut plan: Vec<CropAxis> = span
        .iter()
        .zip(ist.iter().zip(&ost))
        .map(|(&(src0, dst0, cnt), (&ist, &ost))| {
            Ok(CropAxis {
                cnt,
                src0: mul(src0, ist)?,
                ist,
                dst0: mul(dst0, ost)?,
                ost,
            })
        })
        .collect::<Result<_>>()?;
    // Rows of the innermost axis are copied whole.
    let last = plan.pop().ok_or(Error::internal("image index"))?;
    let rows = plan
        .iter()
        .try_fold(1usize, |a, ax| a.checked_mul(ax.cnt))
        .ok_or(overflow())?;
    let row = mul(last.cnt, es)?;
    Ok(Prepared::single(
        x.dtype,
        &out,
        kernel("CenterCropPad", move |io| {
            let xs = io.input(0)?.bytes();
            let mut o = io.output(0)?;
            let y = o.bytes_mut();
            y.fill(0);
            if row == 0 || rows == 0 {
                return Ok(());
            }
            if !inside {
                return Err(Error::internal("image index"));
            }
            for ri in 0..rows {
                let mut rem = ri;
                let mut si = last.src0;
                let mut di = last.dst0;
                for ax in plan.iter().rev() {
                    let (q, i) = div_rem(rem, ax.cnt, "CenterCropPad: rows")?;
                    rem = q;
                    // i < cnt and every span inside its shape: si * es +
                    // row stays within the input's bytes and di * es + row
                    // within the output's, both checked in prepare.
                    si = si.wrapping_add(ax.src0.wrapping_add(i.wrapping_mul(ax.ist)));
                    di = di.wrapping_add(ax.dst0.wrapping_add(i.wrapping_mul(ax.ost)));
                }
                let s = win(xs, si.wrapping_mul(es), row).ok_or(Error::internal("image index"))?;
                win_mut(y, di.wrapping_mul(es), row)
                    .ok_or(Error::internal("image index"))?
                    .copy_from_slice(s);
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------- RoiAlign

/// One bilinear sample of a roi bin: four flat positions and weights
/// (all zero when the point lies outside the feature map). `h * w` must
/// not overflow (prepare checks it).
fn roi_sample(y: f64, x: f64, h: usize, w: usize) -> ([usize; 4], [f64; 4]) {
    if y < -1.0 || y > h as f64 || x < -1.0 || x > w as f64 {
        return ([0; 4], [0.0; 4]);
    }
    // h, w >= 1 (checked in prepare): exact, not saturated.
    let (hl, wl) = (h.saturating_sub(1), w.saturating_sub(1));
    let mut y = y.max(0.0);
    let mut x = x.max(0.0);
    let mut yl = y as usize;
    let mut xl = x as usize;
    let yh;
    let xh;
    // yl < yh <= hl and xl < xh <= wl in the else branches: no wrap.
    if yl >= hl {
        yl = hl;
        yh = yl;
        y = yl as f64;
    } else {
        yh = yl.wrapping_add(1);
    }
    if xl >= wl {
        xl = wl;
        xh = xl;
        x = xl as f64;
    } else {
        xh = xl.wrapping_add(1);
    }
    let ly = y - yl as f64;
    let lx = x - xl as f64;
    let hy = 1.0 - ly;
    let hx = 1.0 - lx;
    // Rows below h, columns below w: flat positions below h * w.
    let at = |r: usize, c: usize| r.wrapping_mul(w).wrapping_add(c);
    (
        [at(yl, xl), at(yl, xh), at(yh, xl), at(yh, xh)],
        [hy * hx, hy * lx, ly * hx, ly * lx],
    )
}

fn prepare_roi_align(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let rois = ctx.input(1)?;
    let bi = ctx.input(2)?;
    dtype_in(x.dtype, &[DType::F32], "RoiAlign X")?;
    dtype_in(rois.dtype, &[DType::F32], "RoiAlign rois")?;
    dtype_in(bi.dtype, &[DType::I64], "RoiAlign batch_indices")?;
    let &[n, c, h, w] = x.shape else {
        return Err(Error::new(ErrorKind::Rank {
            expected: 4,
            got: x.shape.len(),
        }));
    };
    let nr = bi.numel();
    if rois.shape != [nr, 4] {
        return Err(shape_err("RoiAlign: rois must be [num_rois, 4]"));
    }
    let default_ct = if ctx.opset >= 16 {
        "half_pixel"
    } else {
        "output_half_pixel"
    };
    let half = match ctx.attr_str("coordinate_transformation_mode", default_ct)? {
        "half_pixel" => true,
        "output_half_pixel" => false,
        _ => return Err(attr_err("coordinate_transformation_mode", "unknown mode")),
    };
    let avg = match ctx.attr_str("mode", "avg")? {
        "avg" => true,
        "max" => false,
        _ => return Err(attr_err("mode", "must be avg or max")),
    };
    let oh = to_usize(ctx.attr_int("output_height", 1)?, "RoiAlign: output_height")?;
    let ow = to_usize(ctx.attr_int("output_width", 1)?, "RoiAlign: output_width")?;
    let sr = ctx.attr_int("sampling_ratio", 0)?;
    let scale = ctx.attr_float("spatial_scale", 1.0)? as f64;
    if h == 0 || w == 0 {
        return Err(shape_err("RoiAlign: empty feature map"));
    }
    // Per feature map and channel, per roi and channel: elements.
    let (hw, ohw) = (mul(h, w)?, mul(oh, ow)?);
    let (chw, cohw) = (mul(c, hw)?, mul(c, ohw)?);
    Ok(Prepared::single(
        DType::F32,
        &[nr, c, oh, ow],
        kernel("RoiAlign", move |io| {
            let xs = io.input_slice::<f32>(0)?;
            let rs = io.input_slice::<f32>(1)?;
            let bs = io.input_slice::<i64>(2)?;
            let y = io.output_slice::<f32>(0)?;
            let off = if half { 0.5 } else { 0.0 };
            for ri in 0..nr {
                let b = usize::try_from(*bs.get(ri).ok_or(Error::internal("image index"))?)
                    .ok()
                    .filter(|&b| b < n)
                    .ok_or(shape_err("RoiAlign: batch index out of range"))?;
                let [x1, y1, x2, y2] = *row(rs, ri, 4)?
                    .first_chunk::<4>()
                    .ok_or(Error::internal("image index"))?;
                let sw = x1 as f64 * scale - off;
                let sh = y1 as f64 * scale - off;
                let ew = x2 as f64 * scale - off;
                let eh = y2 as f64 * scale - off;
                let (mut rw, mut rh) = (ew - sw, eh - sh);
                if !half {
                    rw = rw.max(1.0);
                    rh = rh.max(1.0);
                }
                let bh = rh / oh as f64;
                let bw = rw / ow as f64;
                let gh = if sr > 0 {
                    sr as usize
                } else {
                    libm::ceil(rh / oh as f64).max(0.0) as usize
                };
                let gw = if sr > 0 {
                    sr as usize
                } else {
                    libm::ceil(rw / ow as f64).max(0.0) as usize
                };
                // Saturating: past usize::MAX the sample loops below could
                // never finish, so no run sees the difference.
                let count = gh.saturating_mul(gw).max(1) as f64;
                let (xb, yr) = (row(xs, b, chw)?, row_mut(y, ri, cohw)?);
                for ch in 0..c {
                    let plane = row(xb, ch, hw)?;
                    let yc = row_mut(yr, ch, ohw)?;
                    for ph in 0..oh {
                        let yrow = row_mut(yc, ph, ow)?;
                        for (pw, yv) in yrow.iter_mut().enumerate() {
                            let mut acc = 0f64;
                            let mut first = true;
                            for iy in 0..gh {
                                let yy = sh + ph as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
                                for ix in 0..gw {
                                    let xx =
                                        sw + pw as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                                    let (pos, wt) = roi_sample(yy, xx, h, w);
                                    // The four weighted corner values.
                                    let mut t = [0f64; 4];
                                    for (tk, (&wk, &pk)) in t.iter_mut().zip(wt.iter().zip(&pos)) {
                                        *tk = wk
                                            * f64::from(
                                                *plane
                                                    .get(pk)
                                                    .ok_or(Error::internal("image index"))?,
                                            );
                                    }
                                    if avg {
                                        for tk in t {
                                            acc += tk;
                                        }
                                    } else {
                                        let [t0, t1, t2, t3] = t;
                                        let v = t0.max(t1).max(t2).max(t3);
                                        acc = if first { v } else { acc.max(v) };
                                        first = false;
                                    }
                                }
                            }
                            if avg {
                                acc /= count;
                            }
                            *yv = acc as f32;
                        }
                    }
                }
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------- DeformConv

/// Bilinear sample of one `h` x `w` plane at (y, x), zero outside; `None`
/// only if `p` is shorter than `h * w`, which must not overflow (prepare
/// checks it).
fn bilinear_zero(p: &[f32], h: usize, w: usize, y: f32, x: f32) -> Option<f32> {
    let fy = libm::floorf(y);
    let fx = libm::floorf(x);
    let (ty, tx) = (y - fy, x - fx);
    let (y0, x0) = (fy as i64, fx as i64);
    let at = |yy: i64, xx: i64| -> Option<f32> {
        if yy >= 0 && (yy as usize) < h && xx >= 0 && (xx as usize) < w {
            // yy < h, xx < w: below h * w.
            p.get((yy as usize).wrapping_mul(w).wrapping_add(xx as usize))
                .copied()
        } else {
            Some(0.0)
        }
    };
    // Saturating: a huge or infinite offset casts to i64::MAX / MIN, and
    // every tap there is outside (zero).
    let (y1, x1) = (y0.saturating_add(1), x0.saturating_add(1));
    let r0 = (1.0 - tx) * at(y0, x0)? + tx * at(y0, x1)?;
    let r1 = (1.0 - tx) * at(y1, x0)? + tx * at(y1, x1)?;
    Some((1.0 - ty) * r0 + ty * r1)
}

/// The sampling geometry of one DeformConv: input plane size, output
/// width, strides, begin pads (top, left) and dilations.
#[derive(Clone, Copy, Debug)]
struct DeformGeo {
    ih: usize,
    iw: usize,
    ow: usize,
    st: [i64; 2],
    pads: [i64; 2],
    dil: [i64; 2],
}

/// Adds kernel tap (a, e) of weight `w` to every output pixel of one
/// output plane `acc`: `acc += x(tap position + offset) * w * mask`, with
/// `dy` / `dx` the tap's offset planes and `plane` one input channel.
/// `acc` holds at most the output plane and (a, e) lies inside the kernel:
/// prepare checked that the tap positions of that range fit in i64.
fn deform_tap(
    acc: &mut [f32],
    plane: &[f32],
    (dy, dx): (&[f32], &[f32]),
    mask: impl Iterator<Item = f32>,
    g: &DeformGeo,
    (a, e, w): (i64, i64, f32),
) -> Result<()> {
    let [st0, st1] = g.st;
    let [pt, pl] = g.pads;
    let [dil0, dil1] = g.dil;
    let ow = g.ow as i64;
    // Output pixel (i, j) of the flat position, stepped row-major.
    let (mut i, mut j) = (0i64, 0i64);
    for (((o, &dy), &dx), m) in acc.iter_mut().zip(dy).zip(dx).zip(mask) {
        // i < oh, j < ow, a < kh, e < kw: i * s + a * d - p lies between
        // -p and (oh - 1) * s + (kh - 1) * d - p (the same for j, e),
        // checked in prepare.
        let py = i
            .wrapping_mul(st0)
            .wrapping_add(a.wrapping_mul(dil0))
            .wrapping_sub(pt) as f64
            + dy as f64;
        let px = j
            .wrapping_mul(st1)
            .wrapping_add(e.wrapping_mul(dil1))
            .wrapping_sub(pl) as f64
            + dx as f64;
        let v = bilinear_zero(plane, g.ih, g.iw, py as f32, px as f32)
            .ok_or(Error::internal("image index"))?;
        *o += v * w * m;
        // j < ow <= i64::MAX (checked in prepare); i < oh likewise.
        j = j.wrapping_add(1);
        if j == ow {
            j = 0;
            i = i.wrapping_add(1);
        }
    }
    Ok(())
}

fn prepare_deform_conv(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let wt = ctx.input(1)?;
    let off = ctx.input(2)?;
    for (i, what) in [
        (0, "DeformConv X"),
        (1, "DeformConv W"),
        (2, "DeformConv offset"),
    ] {
        dtype_in(ctx.input(i)?.dtype, &[DType::F32], what)?;
    }
    let &[n, ic, ih, iw] = x.shape else {
        return Err(Error::new(ErrorKind::Unsupported("DeformConv: only 2-D")));
    };
    let (&[oc, wt_icg, wt_kh, wt_kw], &[off_n, off_c, oh, ow]) = (wt.shape, off.shape) else {
        return Err(shape_err("DeformConv: W and offset must be 4-D"));
    };
    let kdef = [wt_kh as i64, wt_kw as i64];
    let pair = |name: &'static str, def: [i64; 2]| -> Result<[i64; 2]> {
        match ctx.attr_ints(name)? {
            Some(&[a, b]) => Ok([a, b]),
            Some(_) => Err(attr_err(name, "expected 2 values")),
            None => Ok(def),
        }
    };
    let ks = pair("kernel_shape", kdef)?;
    let dil = pair("dilations", [1, 1])?;
    let st = pair("strides", [1, 1])?;
    let pads = match ctx.attr_ints("pads")? {
        Some(&[a, b, c, d]) => [a, b, c, d],
        Some(_) => return Err(attr_err("pads", "expected 4 values")),
        None => [0; 4],
    };
    let group = ctx.attr_int("group", 1)?;
    let og = ctx.attr_int("offset_group", 1)?;
    if group <= 0 || og <= 0 || ks != kdef || st.iter().chain(&dil).any(|&v| v <= 0) {
        return Err(attr_err("group", "invalid DeformConv attributes"));
    }
    let (group, og) = (group as usize, og as usize);
    let [ks0, ks1] = ks;
    let [dil0, dil1] = dil;
    let [st0, st1] = st;
    let [pad_t, pad_l, pad_b, pad_r] = pads;
    let (kh, kw) = (ks0 as usize, ks1 as usize);
    if wt_icg.checked_mul(group) != Some(ic) || !divides(oc, group) || !divides(ic, og) {
        return Err(shape_err("DeformConv: channels do not divide into groups"));
    }
    let extent = |i: usize, p0: i64, p1: i64, k: i64, d: i64, s: i64| {
        (i as i64)
            .checked_add(p0)?
            .checked_add(p1)?
            .checked_sub(k.checked_sub(1)?.checked_mul(d)?.checked_add(1)?)?
            .checked_div(s)?
            .checked_add(1)
    };
    let eh = extent(ih, pad_t, pad_b, ks0, dil0, st0).ok_or(Error::new(ErrorKind::Overflow))?;
    let ew = extent(iw, pad_l, pad_r, ks1, dil1, st1).ok_or(Error::new(ErrorKind::Overflow))?;
    let kk = mul(kh, kw)?;
    let ogkk = mul(og, kk)?;
    if off_n != n || off_c != mul(ogkk, 2)? || eh != oh as i64 || ew != ow as i64 {
        return Err(shape_err(
            "DeformConv: offset shape does not match the output",
        ));
    }
    let has_b = ctx.opt_input(3).is_some();
    if let Some(b) = ctx.opt_input(3) {
        dtype_in(b.dtype, &[DType::F32], "DeformConv B")?;
        if b.numel() != oc {
            return Err(shape_err(
                "DeformConv: B must have one value per output channel",
            ));
        }
    }
    let has_m = ctx.opt_input(4).is_some();
    if let Some(m) = ctx.opt_input(4) {
        dtype_in(m.dtype, &[DType::F32], "DeformConv mask")?;
        if m.shape != [n, ogkk, oh, ow] {
            return Err(shape_err(
                "DeformConv: mask shape does not match the offset",
            ));
        }
    }
    let icg = div(ic, group, "DeformConv: group")?;
    let ocg = div(oc, group, "DeformConv: group")?;
    let icog = div(ic, og, "DeformConv: offset group")?;
    let opl = mul(oh, ow)?;
    // deform_tap's tap positions i * s + a * d - p (i < o, a < k) lie
    // between -p and (o - 1) * s + (k - 1) * d - p, the latter reached
    // through i * s + a * d <= (o - 1) * s + (k - 1) * d: with these in
    // i64, its arithmetic cannot wrap. Without output pixels or taps it
    // computes none.
    let reach = |o: usize, k: i64, s: i64, d: i64, p: i64| -> Option<i64> {
        0i64.checked_sub(p)?;
        i64::try_from(o)
            .ok()?
            .checked_sub(1)?
            .checked_mul(s)?
            .checked_add(k.checked_sub(1)?.checked_mul(d)?)?
            .checked_sub(p)
    };
    if opl > 0
        && kk > 0
        && (reach(oh, ks0, st0, dil0, pad_t).is_none()
            || reach(ow, ks1, st1, dil1, pad_l).is_none())
    {
        return Err(overflow());
    }
    // Sizes of one input channel, one image, the offsets of one offset
    // group and of one image, the masks of the same, one filter.
    let ihw = mul(ih, iw)?;
    let xsz = mul(ic, ihw)?;
    let opl2 = mul(opl, 2)?;
    let og_off = mul(kk, opl2)?;
    let off_sz = mul(og, og_off)?;
    let og_msk = mul(kk, opl)?;
    let msk_sz = mul(og, og_msk)?;
    let wsz = mul(icg, kk)?;
    let ysz = mul(oc, opl)?;
    let geo = DeformGeo {
        ih,
        iw,
        ow,
        st,
        pads: [pad_t, pad_l],
        dil,
    };
    Ok(Prepared::single(
        DType::F32,
        &[n, oc, oh, ow],
        kernel("DeformConv", move |io| {
            let xs = io.input_slice::<f32>(0)?;
            let ws = io.input_slice::<f32>(1)?;
            let os = io.input_slice::<f32>(2)?;
            let bs: &[f32] = if has_b {
                io.input_slice::<f32>(3)?
            } else {
                &[]
            };
            let ms: &[f32] = if has_m {
                io.input_slice::<f32>(4)?
            } else {
                &[]
            };
            let y = io.output_slice::<f32>(0)?;
            if opl == 0 {
                return Ok(());
            }
            // Output plane by plane: bias, then every input channel's taps in
            // order, so each pixel sums in the order of the direct loop.
            for b in 0..n {
                let (xb, ob) = (row(xs, b, xsz)?, row(os, b, off_sz)?);
                let mb = if has_m {
                    Some(row(ms, b, msk_sz)?)
                } else {
                    None
                };
                let yb = row_mut(y, b, ysz)?;
                for o in 0..oc {
                    let g = div(o, ocg, "DeformConv: group")?;
                    let yo = row_mut(yb, o, opl)?;
                    yo.fill(if has_b {
                        *bs.get(o).ok_or(Error::internal("image index"))?
                    } else {
                        0.0
                    });
                    let wo = row(ws, o, wsz)?;
                    // g < group: g * icg + cg < group * icg = ic.
                    let c0 = g.wrapping_mul(icg);
                    for cg in 0..icg {
                        let c = c0.wrapping_add(cg);
                        let ogi = div(c, icog, "DeformConv: offset group")?;
                        let plane = row(xb, c, ihw)?;
                        // Per tap: the dy plane, then the dx plane.
                        let offs = row(ob, ogi, og_off)?;
                        let masks = match mb {
                            Some(mb) => Some(row(mb, ogi, og_msk)?),
                            None => None,
                        };
                        let wk = row(wo, cg, kk)?;
                        for (k, (&wv, dydx)) in wk.iter().zip(offs.chunks_of(opl2)).enumerate() {
                            let dydx = dydx
                                .split_at_checked(opl)
                                .ok_or(Error::internal("image index"))?;
                            let (kh_i, kw_i) = div_rem(k, kw, "DeformConv: kernel")?;
                            let tap = (kh_i as i64, kw_i as i64, wv);
                            match masks {
                                Some(ms) => {
                                    let mk = row(ms, k, opl)?;
                                    deform_tap(yo, plane, dydx, mk.iter().copied(), &geo, tap)?;
                                }
                                None => {
                                    let ones = core::iter::repeat(1.0);
                                    deform_tap(yo, plane, dydx, ones, &geo, tap)?;
                                }
                            }
                        }
                    }
                }
            }
            Ok(())
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, run, t, vals};

    fn s(v: &str) -> AttrValue {
        AttrValue::Str(v.as_bytes().to_vec())
    }

    #[test]
    fn grid_sample_bilinear_center_and_corner() {
        // 2x2 image; grid point (0,0) is the image centre = mean of all four;
        // (-1,-1) without align_corners is the outer corner: a quarter of x00.
        let x = t(&[1, 1, 2, 2], &[1.0f32, 2.0, 3.0, 4.0]);
        let g = t(&[1, 1, 2, 2], &[0.0f32, 0.0, -1.0, -1.0]);
        let y = run("GridSample", 20, vec![], &[x, g], 1).unwrap();
        assert_close(&vals::<f32>(&y[0]), &[2.5, 0.25], 0.0);
    }

    #[test]
    fn grid_sample_nearest_border() {
        // Far outside on the right, border padding clamps to the last column.
        let x = t(&[1, 1, 1, 3], &[1.0f32, 2.0, 3.0]);
        let g = t(&[1, 1, 2, 2], &[5.0f32, 0.0, -0.1, 0.0]);
        let y = run(
            "GridSample",
            20,
            vec![("mode", s("nearest")), ("padding_mode", s("border"))],
            &[x, g],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&y[0]), &[3.0, 2.0], 0.0);
    }

    #[test]
    fn affine_grid_identity() {
        let th = t(&[1, 2, 3], &[1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0]);
        let sz = t(&[4], &[1i64, 1, 1, 2]);
        let y = run(
            "AffineGrid",
            20,
            vec![("align_corners", AttrValue::Int(1))],
            &[th, sz],
            1,
        )
        .unwrap();
        assert_eq!(y[0].shape, vec![1, 1, 2, 2]);
        // H = 1 with align_corners gives y = -1.
        assert_close(&vals::<f32>(&y[0]), &[-1.0, -1.0, 1.0, -1.0], 0.0);
    }

    #[test]
    fn col2im_sums_overlaps() {
        // 1-D image of 3 with block 2 (as 1x2): blocks at 0 and 1 overlap at 1.
        let x = t(&[1, 2, 2], &[1.0f32, 2.0, 10.0, 20.0]);
        let img = t(&[2], &[1i64, 3]);
        let blk = t(&[2], &[1i64, 2]);
        let y = run("Col2Im", 18, vec![], &[x, img, blk], 1).unwrap();
        assert_close(&vals::<f32>(&y[0]), &[1.0, 12.0, 20.0], 0.0);
    }

    #[test]
    fn center_crop_pad_both() {
        // Crop axis 0 from 3 to 2 (start 0), pad axis 1 from 1 to 3 (offset 1).
        let x = t(&[3, 1], &[1.0f32, 2.0, 3.0]);
        let sh = t(&[2], &[2i64, 3]);
        let y = run("CenterCropPad", 18, vec![], &[x, sh], 1).unwrap();
        assert_eq!(vals::<f32>(&y[0]), vec![0.0, 1.0, 0.0, 0.0, 2.0, 0.0]);
    }

    #[test]
    fn roi_align_avg_constant_map() {
        // A constant map averages to the constant wherever the roi lies inside.
        let x = t(&[1, 1, 4, 4], &[3.0f32; 16]);
        let rois = t(&[1, 4], &[0.5f32, 0.5, 2.5, 2.5]);
        let bi = t(&[1], &[0i64]);
        let y = run(
            "RoiAlign",
            16,
            vec![
                ("output_height", AttrValue::Int(2)),
                ("output_width", AttrValue::Int(2)),
                ("sampling_ratio", AttrValue::Int(2)),
            ],
            &[x, rois, bi],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&y[0]), &[3.0; 4], 0.0);
    }

    #[test]
    fn deform_conv_shift_right() {
        // Offset +1 in x on every tap shifts the 2x2 window one column right;
        // taps past the right edge read 0.
        let x = t(
            &[1, 1, 3, 3],
            &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
        );
        let w = t(&[1, 1, 2, 2], &[1.0f32; 4]);
        let mut off = vec![0.0f32; 8 * 4];
        for k in 0..4 {
            off[(k * 2 + 1) * 4..(k * 2 + 2) * 4].fill(1.0);
        }
        let off = t(&[1, 8, 2, 2], &off);
        let y = run(
            "DeformConv",
            19,
            vec![("kernel_shape", AttrValue::Ints(vec![2, 2]))],
            &[x.clone(), w.clone(), off],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&y[0]), &[16.0, 9.0, 28.0, 15.0], 0.0);
        // Zero offsets with bias and a half mask: half the plain conv + bias.
        let off = t(&[1, 8, 2, 2], &[0.0f32; 32]);
        let b = t(&[1], &[1.0f32]);
        let m = t(&[1, 4, 2, 2], &[0.5f32; 16]);
        let y = run("DeformConv", 19, vec![], &[x, w, off, b, m], 1).unwrap();
        assert_close(&vals::<f32>(&y[0]), &[7.0, 9.0, 13.0, 15.0], 0.0);
    }

    #[test]
    fn col2im_block_product_overflow() {
        // 2^32 * 2^32 blocks: Overflow, not a multiplication panic.
        let x = t(&[1, 1, 1], &[0.0f32]);
        let img = t(&[2], &[1i64 << 32, 1i64 << 32]);
        let blk = t(&[2], &[1i64 << 32, 1i64 << 32]);
        let e = run("Col2Im", 18, vec![], &[x, img, blk], 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Overflow);
    }

    #[test]
    fn deform_conv_pad_at_i64_min() {
        // A begin pad of i64::MIN (with i64::MAX at the end, one output
        // row): the tap position 0 - pad does not fit in i64.
        let x = t(&[1, 1, 3, 3], &[1.0f32; 9]);
        let w = t(&[1, 1, 2, 2], &[1.0f32; 4]);
        let off = t(&[1, 8, 1, 2], &[0.0f32; 16]);
        let pads = AttrValue::Ints(vec![i64::MIN, 0, i64::MAX, 0]);
        let e = run("DeformConv", 19, vec![("pads", pads)], &[x, w, off], 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Overflow);
    }
}
