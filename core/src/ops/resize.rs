//! Resize and Upsample: nearest (any dtype), N-D linear and cubic (f32),
//! by separable per-axis taps precomputed at prepare.

use alloc::vec::Vec;

use crate::error::{Error, ErrorKind, Result};
use crate::ops::{kernel, KernelIo, OpDef, PrepareCtx, Prepared};
use crate::tensor::ChunksOf as _;
use crate::tensor::MAX_RANK;
use crate::DType;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("Resize", 10, prepare_resize),
    OpDef::onnx("Upsample", 7, prepare_upsample),
];

fn attr_err(name: &'static str, problem: &'static str) -> Error {
    Error::new(ErrorKind::Attribute { name, problem })
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coord {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfHalfPixelForNn,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Round {
    PreferFloor,
    PreferCeil,
    Floor,
    Ceil,
    /// Opset-10 Resize and Upsample: floor when upsampling, ceil when
    /// downsampling.
    Simple,
}

#[derive(Clone, Copy, Debug)]
struct Params {
    mode: Mode,
    coord: Coord,
    round: Round,
    cubic_a: f64,
    exclude_outside: bool,
}

/// Input coordinate of output coordinate `x` on one axis.
fn original(c: Coord, x: f64, scale: f64, in_len: usize, out_len: usize) -> f64 {
    match c {
        Coord::HalfPixel => (x + 0.5) / scale - 0.5,
        Coord::HalfPixelSymmetric => {
            let adj = out_len as f64 / (scale * in_len as f64);
            let center = in_len as f64 / 2.0;
            center * (1.0 - adj) + (x + 0.5) / scale - 0.5
        }
        Coord::PytorchHalfPixel => {
            if out_len > 1 {
                (x + 0.5) / scale - 0.5
            } else {
                0.0
            }
        }
        Coord::AlignCorners => {
            // The unrounded output length `scale * in_len`, as the ONNX
            // reference does: with `scales` given, 4 * 0.6 = 2.4, not 2.
            let len = scale * in_len as f64;
            if out_len == 1 || len == 1.0 {
                0.0
            } else {
                x * (in_len as f64 - 1.0) / (len - 1.0)
            }
        }
        Coord::Asymmetric => x / scale,
        Coord::TfHalfPixelForNn => (x + 0.5) / scale,
    }
}

fn cubic_coeffs(r: f64, a: f64) -> [f64; 4] {
    let c = |x: f64| -> f64 {
        let x = libm::fabs(x);
        if x <= 1.0 {
            ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        } else if x < 2.0 {
            ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
        } else {
            0.0
        }
    };
    [c(r + 1.0), c(r), c(1.0 - r), c(2.0 - r)]
}

/// Taps (input index, weight) of every output coordinate of one axis,
/// `k` per coordinate.
fn axis_taps(p: &Params, in_len: usize, out_len: usize, scale: f64) -> (usize, Vec<(usize, f32)>) {
    let last = (in_len as i64).saturating_sub(1);
    let clampi = |i: i64| i.max(0).min(last) as usize;
    let mut v = Vec::new();
    let k = match p.mode {
        Mode::Nearest => 1,
        Mode::Linear => 2,
        Mode::Cubic => 4,
    };
    for o in 0..out_len {
        let x = original(p.coord, o as f64, scale, in_len, out_len);
        match p.mode {
            Mode::Nearest => {
                let fl = libm::floor(x);
                let frac = x - fl;
                let i = match p.round {
                    Round::PreferFloor => {
                        if frac == 0.5 {
                            fl
                        } else {
                            libm::round(x)
                        }
                    }
                    Round::PreferCeil => {
                        if frac == 0.5 {
                            fl + 1.0
                        } else {
                            libm::round(x)
                        }
                    }
                    Round::Floor => fl,
                    Round::Ceil => libm::ceil(x),
                    Round::Simple => {
                        if scale < 1.0 {
                            libm::ceil(x)
                        } else {
                            fl
                        }
                    }
                };
                v.push((clampi(i as i64), 1.0));
            }
            Mode::Linear => {
                let fl = libm::floor(x);
                let r = x - fl;
                let i0 = fl as i64;
                v.push((clampi(i0), (1.0 - r) as f32));
                // A coordinate far out (a huge scale) saturates and clamps.
                v.push((clampi(i0.saturating_add(1)), r as f32));
            }
            Mode::Cubic => {
                let fl = libm::floor(x);
                let r = x - fl;
                let i0 = fl as i64;
                let mut c = cubic_coeffs(r, p.cubic_a);
                let idx = [
                    i0.saturating_sub(1),
                    i0,
                    i0.saturating_add(1),
                    i0.saturating_add(2),
                ];
                if p.exclude_outside {
                    let mut s = 0.0;
                    for (w, &i) in c.iter_mut().zip(&idx) {
                        if i < 0 || i > last {
                            *w = 0.0;
                        }
                        s += *w;
                    }
                    if s != 0.0 {
                        for w in c.iter_mut() {
                            *w /= s;
                        }
                    }
                }
                for (&i, &w) in idx.iter().zip(&c) {
                    v.push((clampi(i), w as f32));
                }
            }
        }
    }
    (k, v)
}

/// One axis of the tap table: where its taps start, taps per output
/// coordinate, output length.
#[derive(Clone, Copy, Debug)]
struct AxisTaps {
    start: usize,
    k: usize,
    len: usize,
}

/// Builds the kernel for output sizes `out` and per-axis scales.
fn build(
    ctx: &PrepareCtx<'_>,
    x_dt: DType,
    in_shape: &[usize],
    out: &[usize],
    scales: &[f64],
    p: Params,
) -> Result<Prepared> {
    let r = in_shape.len();
    // The tap tables: up to 4 (index, weight) pairs per output coordinate
    // of every axis, sized by the output dims before they are planned.
    crate::error::checked_numel(out)?;
    let coords = out
        .iter()
        .try_fold(0usize, |a, &d| a.checked_add(d))
        .ok_or(Error::new(ErrorKind::Overflow))?;
    // Up to 4 taps per coordinate, then the kept ones: twice that.
    const TAP_BYTES: usize = 2 * 4 * core::mem::size_of::<(usize, f32)>();
    ctx.check_alloc(coords, TAP_BYTES)?;
    if r > MAX_RANK {
        return Err(Error::new(ErrorKind::Unsupported("rank above 8")));
    }
    if out.len() != r || scales.len() != r {
        return Err(Error::new(ErrorKind::Internal(
            "Resize: output sizes or scales differ from the rank",
        )));
    }
    if p.mode != Mode::Nearest && x_dt != DType::F32 {
        return Err(Error::new(ErrorKind::UnsupportedDType {
            what: "Resize linear/cubic",
            code: x_dt.onnx_code(),
        }));
    }
    let st = crate::tensor::strides(in_shape)
        .ok_or(Error::new(ErrorKind::Unsupported("rank above 8")))?;
    let mut table: Vec<(usize, f32)> = Vec::new();
    let mut axes: Vec<AxisTaps> = Vec::with_capacity(r);
    for (((&len_in, &len), &scale), &stride) in in_shape.iter().zip(out).zip(scales).zip(&st) {
        if len > 0 && len_in == 0 {
            return Err(Error::new(ErrorKind::Shape("Resize: empty input axis")));
        }
        let (k, taps) = axis_taps(&p, len_in, len, scale);
        // Keep only the first tap where every other one weighs 0.
        let single = k > 1 && taps.chunks(k).all(|c| c.iter().skip(1).all(|t| t.1 == 0.0));
        let start = table.len();
        if single {
            // The first tap of every coordinate's `k`.
            table.extend(
                taps.iter()
                    .step_by(k)
                    .map(|t| (t.0.saturating_mul(stride), t.1)),
            );
        } else {
            // Tap index < axis length: the offset lies inside the input
            // (saturated past usize, a lookup miss at run time).
            table.extend(taps.iter().map(|t| (t.0.saturating_mul(stride), t.1)));
        }
        axes.push(AxisTaps {
            start,
            k: if single { 1 } else { k },
            len,
        });
    }
    let ncombo: usize = axes.iter().map(|a| a.k).product();
    let es = x_dt.size();
    if p.mode == Mode::Nearest {
        return Ok(Prepared::single(
            x_dt,
            out,
            kernel("Resize", move |io: &mut KernelIo<'_>| {
                let src = io.input(0)?.bytes();
                let mut y = io.output(0)?;
                let dst = y.bytes_mut();
                let mut idx_buf = [0usize; MAX_RANK];
                let idx = idx_buf
                    .get_mut(..r)
                    .ok_or(Error::internal("resize range"))?;
                for d in dst.chunks_of_mut(es) {
                    let mut off = 0usize;
                    for (ax, &i) in axes.iter().zip(idx.iter()) {
                        off = off.saturating_add(
                            table
                                .get(ax.start.saturating_add(i))
                                .ok_or(Error::internal("resize range"))?
                                .0,
                        );
                    }
                    d.copy_from_slice(
                        off.checked_mul(es)
                            .and_then(|at| src.get(at..at.checked_add(es)?))
                            .ok_or(Error::internal("resize range"))?,
                    );
                    advance(idx, &axes);
                }
                Ok(())
            }),
        ));
    }
    Ok(Prepared::single(
        x_dt,
        out,
        kernel("Resize", move |io: &mut KernelIo<'_>| {
            let src = io.input(0)?.f32()?;
            let y = io.output(0)?.f32()?;
            let mut idx_buf = [0usize; MAX_RANK];
            let idx = idx_buf
                .get_mut(..r)
                .ok_or(Error::internal("resize range"))?;
            for d in y.iter_mut() {
                let mut acc = 0.0f32;
                for combo in 0..ncombo {
                    let mut c = combo;
                    let mut off = 0usize;
                    let mut w = 1.0f32;
                    for (ax, &i) in axes.iter().zip(idx.iter()).rev() {
                        let (q, k) = crate::ops::util::div_rem(c, ax.k, "Resize taps")?;
                        c = q;
                        let t = table
                            .get(
                                ax.start
                                    .saturating_add(i.saturating_mul(ax.k))
                                    .saturating_add(k),
                            )
                            .ok_or(Error::internal("resize range"))?;
                        off = off.saturating_add(t.0);
                        w *= t.1;
                    }
                    if w != 0.0 {
                        acc += w * *src.get(off).ok_or(Error::internal("resize range"))?;
                    }
                }
                *d = acc;
                advance(idx, &axes);
            }
            Ok(())
        }),
    ))
}

/// Steps the output index `idx` (one entry per axis) in row-major order.
#[inline]
fn advance(idx: &mut [usize], axes: &[AxisTaps]) {
    for (i, ax) in idx.iter_mut().zip(axes).rev() {
        *i = i.saturating_add(1);
        if *i < ax.len {
            return;
        }
        *i = 0;
    }
}

/// Output sizes and effective scales from scales.
fn from_scales(in_shape: &[usize], s: &[f32]) -> Result<(Vec<usize>, Vec<f64>)> {
    if s.len() != in_shape.len() {
        return Err(Error::new(ErrorKind::Shape(
            "Resize: scales length differs from the rank",
        )));
    }
    let mut out = Vec::with_capacity(s.len());
    for (&d, &sc) in in_shape.iter().zip(s) {
        if sc.is_nan() || sc <= 0.0 || !sc.is_finite() {
            return Err(Error::new(ErrorKind::Shape(
                "Resize: scales must be positive",
            )));
        }
        out.push(libm::floor(d as f64 * sc as f64) as usize);
    }
    Ok((out, s.iter().map(|&v| v as f64).collect()))
}

fn mode_of(s: &str) -> Result<Mode> {
    match s {
        "nearest" => Ok(Mode::Nearest),
        "linear" | "bilinear" => Ok(Mode::Linear),
        "cubic" => Ok(Mode::Cubic),
        _ => Err(attr_err("mode", "unknown resize mode")),
    }
}

fn prepare_resize(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    let mode = mode_of(ctx.attr_str("mode", "nearest")?)?;
    if ctx.opset < 11 {
        let s = ctx
            .const_floats(1)?
            .ok_or(Error::new(ErrorKind::MissingInput { index: 1 }))?;
        let (out, scales) = from_scales(x.shape, &s)?;
        let p = Params {
            mode,
            coord: Coord::Asymmetric,
            round: Round::Simple,
            cubic_a: -0.75,
            exclude_outside: false,
        };
        return build(ctx, x.dtype, x.shape, &out, &scales, p);
    }
    if ctx.attr_int("antialias", 0)? != 0 {
        return Err(Error::new(ErrorKind::Unsupported("Resize antialias")));
    }
    let coord = match ctx.attr_str("coordinate_transformation_mode", "half_pixel")? {
        "half_pixel" => Coord::HalfPixel,
        "half_pixel_symmetric" => Coord::HalfPixelSymmetric,
        "pytorch_half_pixel" => Coord::PytorchHalfPixel,
        "align_corners" => Coord::AlignCorners,
        "asymmetric" => Coord::Asymmetric,
        "tf_half_pixel_for_nn" => Coord::TfHalfPixelForNn,
        "tf_crop_and_resize" => {
            return Err(Error::new(ErrorKind::Unsupported(
                "Resize tf_crop_and_resize",
            )))
        }
        _ => return Err(attr_err("coordinate_transformation_mode", "unknown")),
    };
    let round = match ctx.attr_str("nearest_mode", "round_prefer_floor")? {
        "round_prefer_floor" => Round::PreferFloor,
        "round_prefer_ceil" => Round::PreferCeil,
        "floor" => Round::Floor,
        "ceil" => Round::Ceil,
        _ => return Err(attr_err("nearest_mode", "unknown")),
    };
    let p = Params {
        mode,
        coord,
        round,
        cubic_a: ctx.attr_float("cubic_coeff_a", -0.75)? as f64,
        exclude_outside: ctx.attr_int("exclude_outside", 0)? != 0,
    };
    // Axes the scales / sizes cover (opset 18), default all.
    let axes: Vec<usize> = match if ctx.opset >= 18 {
        ctx.attr_ints("axes")?
    } else {
        None
    } {
        Some(a) => a
            .iter()
            .map(|&v| {
                let v = if v < 0 { v.saturating_add(r as i64) } else { v };
                if v < 0 || v >= r as i64 {
                    Err(attr_err("axes", "axis out of range"))
                } else {
                    Ok(v as usize)
                }
            })
            .collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    // Input lengths of the covered axes.
    let sub: Vec<usize> = axes
        .iter()
        .map(|&a| {
            x.shape
                .get(a)
                .copied()
                .ok_or(Error::internal("resize range"))
        })
        .collect::<Result<_>>()?;
    let scales = ctx.const_floats(2)?.filter(|s| !s.is_empty());
    let sizes = ctx.const_ints(3)?.filter(|s| !s.is_empty());
    let mut out: Vec<usize> = x.shape.to_vec();
    let mut sc: Vec<f64> = alloc::vec![1.0; r];
    match (scales, sizes) {
        (Some(s), None) => {
            if s.len() != axes.len() {
                return Err(Error::new(ErrorKind::Shape(
                    "Resize: scales length differs from the axes",
                )));
            }
            let (o, f) = from_scales(&sub, &s)?;
            for ((&a, &ok), &fk) in axes.iter().zip(&o).zip(&f) {
                *out.get_mut(a).ok_or(Error::internal("resize range"))? = ok;
                *sc.get_mut(a).ok_or(Error::internal("resize range"))? = fk;
            }
        }
        (None, Some(z)) => {
            if z.len() != axes.len() {
                return Err(Error::new(ErrorKind::Shape(
                    "Resize: sizes length differs from the axes",
                )));
            }
            let policy = if ctx.opset >= 18 {
                ctx.attr_str("keep_aspect_ratio_policy", "stretch")?
            } else {
                "stretch"
            };
            let ratio = |zk: i64, d: usize| zk as f64 / d as f64;
            let common = match policy {
                "stretch" => None,
                "not_larger" => Some(
                    z.iter()
                        .zip(&sub)
                        .map(|(&zk, &d)| ratio(zk, d))
                        .fold(f64::INFINITY, f64::min),
                ),
                "not_smaller" => Some(
                    z.iter()
                        .zip(&sub)
                        .map(|(&zk, &d)| ratio(zk, d))
                        .fold(0.0, f64::max),
                ),
                _ => return Err(attr_err("keep_aspect_ratio_policy", "unknown")),
            };
            for ((&a, &zk), &d) in axes.iter().zip(&z).zip(&sub) {
                if zk < 0 {
                    return Err(Error::new(ErrorKind::Shape("Resize: negative size")));
                }
                let (Some(oa), Some(sa)) = (out.get_mut(a), sc.get_mut(a)) else {
                    return Err(Error::internal("resize range"));
                };
                match common {
                    None => {
                        *oa = zk as usize;
                        *sa = if d == 0 { 1.0 } else { ratio(zk, d) };
                    }
                    Some(c) => {
                        *oa = libm::round(c * d as f64) as usize;
                        *sa = c;
                    }
                }
            }
        }
        (Some(_), Some(_)) => {
            return Err(Error::new(ErrorKind::Invalid(
                "Resize: both scales and sizes given",
            )))
        }
        (None, None) => {
            return Err(Error::new(ErrorKind::Invalid(
                "Resize: neither scales nor sizes given",
            )))
        }
    }
    build(ctx, x.dtype, x.shape, &out, &sc, p)
}

fn prepare_upsample(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let mode = mode_of(ctx.attr_str("mode", "nearest")?)?;
    if mode == Mode::Cubic {
        return Err(attr_err("mode", "Upsample has no cubic mode"));
    }
    let s: Vec<f32> = if ctx.opset < 9 {
        ctx.attr_floats("scales")?
            .ok_or(attr_err("scales", "required"))?
            .to_vec()
    } else {
        ctx.const_floats(1)?
            .ok_or(Error::new(ErrorKind::MissingInput { index: 1 }))?
    };
    let (out, scales) = from_scales(x.shape, &s)?;
    let p = Params {
        mode,
        coord: Coord::Asymmetric,
        round: Round::Simple,
        cubic_a: -0.75,
        exclude_outside: false,
    };
    build(ctx, x.dtype, x.shape, &out, &scales, p)
}

#[cfg(test)]
mod tests {
    use crate::model::{AttrValue, Const};
    use crate::ops::testing::{assert_close, run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;

    fn s(v: &str) -> AttrValue {
        AttrValue::Str(v.into())
    }
    fn x22() -> Option<Const> {
        t(&[1, 1, 2, 2], &[1f32, 2., 3., 4.])
    }

    #[test]
    fn nearest_2x() {
        let r = run(
            "Resize",
            13,
            vec![],
            &[x22(), None, t(&[4], &[1f32, 1., 2., 2.])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 1, 4, 4]);
        assert_eq!(
            vals::<f32>(&r[0]),
            vec![1., 1., 2., 2., 1., 1., 2., 2., 3., 3., 4., 4., 3., 3., 4., 4.]
        );
        // Byte-generic: int64 via sizes, asymmetric.
        let r = run(
            "Resize",
            13,
            vec![("coordinate_transformation_mode", s("asymmetric"))],
            &[
                t::<i64>(&[1, 3], &[7, 8, 9]),
                None,
                None,
                t::<i64>(&[2], &[1, 6]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![7, 7, 8, 8, 9, 9]);
    }

    #[test]
    fn linear_half_pixel() {
        let r = run(
            "Resize",
            13,
            vec![("mode", s("linear"))],
            &[x22(), None, t(&[4], &[1f32, 1., 2., 2.])],
            1,
        )
        .unwrap();
        // Axis map for 2 -> 4: x = (o + .5)/2 - .5 = -.25, .25, .75, 1.25
        // -> weights (clamped) [1 | .75,.25 | .25,.75 | 1] on [a, b].
        let row = |a: f32, b: f32| vec![a, 0.75 * a + 0.25 * b, 0.25 * a + 0.75 * b, b];
        let r0 = row(1., 2.);
        let r1 = row(3., 4.);
        let mut want: Vec<f32> = Vec::new();
        for (wa, wb) in [(1.0, 0.0), (0.75, 0.25), (0.25, 0.75), (0.0, 1.0)] {
            for k in 0..4 {
                want.push(wa * r0[k] + wb * r1[k]);
            }
        }
        assert_close(&vals::<f32>(&r[0]), &want, 1e-6);
        assert_eq!(vals::<f32>(&r[0])[..4], [1.0, 1.25, 1.75, 2.0]);
    }

    #[test]
    fn linear_align_corners_and_downscale() {
        let r = run(
            "Resize",
            13,
            vec![
                ("mode", s("linear")),
                ("coordinate_transformation_mode", s("align_corners")),
            ],
            &[
                t(&[1, 3], &[0f32, 1., 2.]),
                None,
                None,
                t::<i64>(&[2], &[1, 5]),
            ],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[0., 0.5, 1., 1.5, 2.], 1e-6);
        let r = run(
            "Resize",
            13,
            vec![("mode", s("nearest")), ("nearest_mode", s("floor"))],
            &[t(&[4], &[1f32, 2., 3., 4.]), None, t(&[1], &[0.5f32])],
            1,
        )
        .unwrap();
        // half_pixel: x = (o + .5) * 2 - .5 = .5, 2.5 -> floor 0, 2
        assert_eq!(vals::<f32>(&r[0]), vec![1., 3.]);
    }

    #[test]
    fn cubic_identity_and_upsample() {
        let x = t(&[1, 4], &[1f32, 2., 4., 8.]);
        let r = run(
            "Resize",
            13,
            vec![("mode", s("cubic"))],
            &[x.clone(), None, t(&[2], &[1f32, 1.])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[1., 2., 4., 8.], 1e-6);
        let r = run(
            "Resize",
            13,
            vec![("mode", s("cubic"))],
            &[x, None, t(&[2], &[1f32, 2.])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 8]);
        // o = 1: x = 0.25, taps [0, 0, 1, 2] with A = -0.75 coefficients
        // [-0.10546875, 0.87890625, 0.26171875, -0.03515625].
        assert_close(&vals::<f32>(&r[0])[1..2], &[1.15625], 1e-6);
        let r = run(
            "Upsample",
            9,
            vec![],
            &[t(&[1, 2], &[1f32, 2.]), t(&[2], &[1f32, 2.])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![1., 1., 2., 2.]);
        let r = run(
            "Upsample",
            7,
            vec![
                ("mode", s("linear")),
                ("scales", AttrValue::Floats(vec![1., 2.])),
            ],
            &[t(&[1, 2], &[1f32, 2.])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[1., 1.5, 2., 2.], 1e-6);
    }
}
