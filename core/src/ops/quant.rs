//! Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear.
//!
//! Scale and zero point apply per tensor (one element), per axis (a 1-D
//! tensor along `axis`) or per block (`block_size` consecutive elements
//! along `axis` share one, the scale having the input's rank). The element
//! a value uses is found from its flat index by arithmetic, so kernels need
//! no index tables. Arithmetic follows the ONNX reference (numpy): the
//! quotient `x / scale` is rounded to the promoted type of the two (or to
//! `precision`), then rounded half to even and clipped for integer outputs,
//! or rounded to the float8/float4 grid for those.

use core::num::NonZeroUsize;
use half::{bf16, f16};

use super::{kernel, KernelIo, OpDef, OutputInfo, PrepareCtx, Prepared};
use crate::error::{Error, ErrorKind, Result};
use crate::tensor::{copy_exact, ChunksOf as _};
use crate::DType;

/// The quantization operators.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("QuantizeLinear", 10, prepare_quantize),
    OpDef::onnx("DequantizeLinear", 10, prepare_dequantize),
    OpDef::onnx("DynamicQuantizeLinear", 11, prepare_dynamic_quantize),
];

fn invalid(what: &'static str) -> Error {
    Error::new(ErrorKind::Invalid(what))
}

/// Bytes `[i * s, (i + 1) * s)` of element `i`, `s` bytes wide (`None`
/// past `usize`).
#[inline(always)]
fn elem(i: usize, s: usize) -> Option<core::ops::Range<usize>> {
    let at = i.checked_mul(s)?;
    Some(at..at.checked_add(s)?)
}

/// Element `i` of a little-endian buffer of dtype `dt`, as f64.
#[inline]
fn load(dt: DType, b: &[u8], i: usize) -> f64 {
    let s = dt.size();
    let Some(c) = elem(i, s).and_then(|r| b.get(r)) else {
        return f64::NAN;
    };
    // Every dtype is at most 8 bytes wide: `c` fills the low bytes of `w`.
    let mut w = [0u8; 8];
    for (d, &v) in w.iter_mut().zip(c) {
        *d = v;
    }
    match dt {
        DType::F32 => f32::from_le_bytes([w[0], w[1], w[2], w[3]]) as f64,
        DType::F64 => f64::from_le_bytes(w),
        DType::F16 => f16::from_le_bytes([w[0], w[1]]).to_f64(),
        DType::BF16 => bf16::from_le_bytes([w[0], w[1]]).to_f64(),
        DType::I8 | DType::I4 | DType::I2 => w[0] as i8 as f64,
        DType::I16 => i16::from_le_bytes([w[0], w[1]]) as f64,
        DType::U16 => u16::from_le_bytes([w[0], w[1]]) as f64,
        DType::I32 => i32::from_le_bytes([w[0], w[1], w[2], w[3]]) as f64,
        DType::U32 => u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as f64,
        DType::I64 => i64::from_le_bytes(w) as f64,
        DType::U64 => u64::from_le_bytes(w) as f64,
        d if d.is_minifloat() || d == DType::F8E8M0 => d.minifloat_to_f64(w[0]),
        _ => w[0] as f64,
    }
}

/// `v` rounded to dtype `dt` the way numpy computes in it: half types go
/// through f32, as their ufuncs do.
#[inline]
fn round_to(dt: DType, v: f64) -> f64 {
    match dt {
        DType::F32 => v as f32 as f64,
        DType::F16 => f16::from_f32(v as f32).to_f64(),
        DType::BF16 => bf16::from_f32(v as f32).to_f64(),
        _ => v,
    }
}

/// Stores a float result (already rounded to f32 or f64 as numpy would).
#[inline]
fn store_float(dt: DType, out: &mut [u8], i: usize, v: f64) {
    match dt {
        DType::F32 => {
            if let Some(o) = elem(i, 4).and_then(|r| out.get_mut(r)) {
                o.copy_from_slice(&(v as f32).to_le_bytes());
            }
        }
        DType::F16 => {
            if let Some(o) = elem(i, 2).and_then(|r| out.get_mut(r)) {
                o.copy_from_slice(&f16::from_f32(v as f32).to_le_bytes());
            }
        }
        DType::BF16 => {
            if let Some(o) = elem(i, 2).and_then(|r| out.get_mut(r)) {
                o.copy_from_slice(&bf16::from_f32(v as f32).to_le_bytes());
            }
        }
        _ => {}
    }
}

/// Stores an integer already in the range of `dt` (its low bytes, LE).
#[inline]
fn store_int(dt: DType, out: &mut [u8], i: usize, v: i64) {
    let s = dt.size();
    if let Some(o) = elem(i, s).and_then(|r| out.get_mut(r)) {
        // `o` is `s <= 8` bytes: the low bytes of `v`.
        for (d, &b) in o.iter_mut().zip(&v.to_le_bytes()) {
            *d = b;
        }
    }
}

/// `clamp(rint(q) + z, lo, hi)` (NaN → `lo`) for an f32 quotient, as the
/// general f64 path computes it: `q` is clamped to ±1024 first (beyond, the
/// 8-bit clamp decides anyway), then rounded half to even by adding and
/// removing 1.5 · 2^23, which is exact below 2^22.
#[inline(always)]
fn quantize_f32(q: f32, z: i32, lo: i32, hi: i32) -> i32 {
    if q.is_nan() {
        return lo;
    }
    const MAGIC: f32 = 12_582_912.0;
    let r = (q.clamp(-1024.0, 1024.0) + MAGIC) - MAGIC;
    // |r| <= 1024 and z is an 8-bit zero point: exact (saturating all the
    // same, whatever the zero point holds).
    (r as i32).saturating_add(z).clamp(lo, hi)
}

/// Which scale / zero-point element a flat input index uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Tensor,
    /// `len` = input dim at the axis, `inner` = product of the dims after
    /// (non-zero: an empty input takes `Tensor`, it has no element to
    /// index; the divisions below cannot panic).
    Axis {
        inner: NonZeroUsize,
        len: NonZeroUsize,
    },
    /// As `Axis`, with `nb` = ceil(len / bs) blocks along the axis and
    /// `span` = inner × len.
    Block {
        inner: NonZeroUsize,
        len: NonZeroUsize,
        span: NonZeroUsize,
        bs: NonZeroUsize,
        nb: usize,
    },
}

impl Mode {
    #[inline]
    fn index(self, i: usize) -> usize {
        match self {
            Mode::Tensor => 0,
            Mode::Axis { inner, len } => (i / inner) % len,
            Mode::Block {
                inner,
                len,
                span,
                bs,
                nb,
            } => {
                let a = (i / inner) % len;
                let o = i / span;
                // Below the scale's element count for i < numel; past it
                // (saturated), a lookup miss.
                o.saturating_mul(nb)
                    .saturating_add(a / bs)
                    .saturating_mul(inner.get())
                    .saturating_add(i % inner)
            }
        }
    }
}

/// Checks the scale (and zero point) shape against the input and picks the
/// mode, as the reference's `reshape_input` does.
fn param_mode(ctx: &PrepareCtx<'_>, x: &[usize], scale: &[usize]) -> Result<Mode> {
    let numel: usize = scale.iter().product();
    if let Some(zp) = ctx.opt_input(2) {
        if zp.shape != scale && !(numel == 1 && zp.numel() == 1) {
            return Err(Error::new(ErrorKind::Shape(
                "zero point shape differs from scale shape",
            )));
        }
    }
    if numel == 1 {
        return Ok(Mode::Tensor);
    }
    if ctx.opset < 13 {
        return Err(invalid("scale must be a scalar before opset 13"));
    }
    let axis = super::util::axis_or_scalar(ctx.attr_int("axis", 1)?, x.len(), "axis")?;
    let len = x.get(axis).copied().unwrap_or(1);
    let inner: usize = x
        .get(axis.saturating_add(1)..)
        .map_or(1, |d| d.iter().product());
    let bs = ctx.attr_int("block_size", 0)?;
    if bs < 0 {
        return Err(invalid("block_size must not be negative"));
    }
    if bs == 0 {
        if *scale != [len] {
            return Err(Error::new(ErrorKind::Shape(
                "per-axis scale must be 1-D of the axis dimension",
            )));
        }
        return Ok(match (NonZeroUsize::new(inner), NonZeroUsize::new(len)) {
            (Some(inner), Some(len)) => Mode::Axis { inner, len },
            _ => Mode::Tensor,
        });
    }
    let bs = NonZeroUsize::new(bs as usize).ok_or(invalid("block_size must not be negative"))?;
    let nb = len.div_ceil(bs.get());
    let ok = scale.len() == x.len()
        && scale
            .iter()
            .zip(x)
            .enumerate()
            .all(|(k, (&s, &d))| if k == axis { s == nb } else { s == d });
    if !ok {
        return Err(Error::new(ErrorKind::Shape(
            "blocked scale must match the input but for ceil(dim / block_size) at the axis",
        )));
    }
    let (Some(inner), Some(len)) = (NonZeroUsize::new(inner), NonZeroUsize::new(len)) else {
        return Ok(Mode::Tensor);
    };
    let span = inner
        .checked_mul(len)
        .ok_or(Error::new(ErrorKind::Overflow))?;
    Ok(Mode::Block {
        inner,
        len,
        span,
        bs,
        nb,
    })
}

const QUANT_OUT: [DType; 13] = [
    DType::U8,
    DType::I8,
    DType::U16,
    DType::I16,
    DType::U4,
    DType::I4,
    DType::U2,
    DType::I2,
    DType::F8E4M3FN,
    DType::F8E4M3FNUZ,
    DType::F8E5M2,
    DType::F8E5M2FNUZ,
    DType::F4E2M1,
];

fn int_range(dt: DType) -> Option<(i64, i64)> {
    match dt {
        DType::U8 => Some((0, 255)),
        DType::I8 => Some((-128, 127)),
        DType::U16 => Some((0, 65535)),
        DType::I16 => Some((-32768, 32767)),
        DType::I32 => Some((i32::MIN as i64, i32::MAX as i64)),
        d => d.small_int_range(),
    }
}

/// numpy's type of `x / scale` (before any `precision`).
fn promoted(x: DType, s: DType) -> DType {
    // Powers of two (E8M0 scales) divide exactly in any float type.
    let s = if s == DType::F8E8M0 { x } else { s };
    if x == DType::I32 || s == DType::I32 {
        DType::F64
    } else if x == s {
        x
    } else {
        DType::F32
    }
}

fn prepare_quantize(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let s = ctx.input(1)?;
    let zp = ctx.opt_input(2);
    let ins = [DType::F32, DType::F16, DType::BF16, DType::I32];
    super::util::dtype_in(x.dtype, &ins, "QuantizeLinear input")?;
    if !(s.dtype == DType::F8E8M0 && ctx.opset >= 24) {
        super::util::dtype_in(s.dtype, &ins, "QuantizeLinear scale")?;
    }
    let attr_out = ctx.attr_int("output_dtype", 0)? as i32;
    let attr_out = match attr_out {
        0 => None,
        c => Some(
            DType::from_onnx(c).ok_or(Error::new(ErrorKind::UnsupportedDType {
                what: "QuantizeLinear output_dtype",
                code: c,
            }))?,
        ),
    };
    let to = match (zp, attr_out) {
        (Some(z), Some(o)) if z.dtype != o => {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: o,
                got: z.dtype,
            }))
        }
        (Some(z), _) => z.dtype,
        (None, Some(o)) => o,
        (None, None) => DType::U8,
    };
    super::util::dtype_in(to, &QUANT_OUT, "QuantizeLinear output")?;
    let precision = match ctx.attr_int("precision", 0)? as i32 {
        0 => None,
        c => {
            let p = DType::from_onnx(c).ok_or(Error::new(ErrorKind::UnsupportedDType {
                what: "QuantizeLinear precision",
                code: c,
            }))?;
            super::util::dtype_in(p, &[DType::F32, DType::F16, DType::BF16], "precision")?;
            Some(p)
        }
    };
    let calc = precision.unwrap_or(promoted(x.dtype, s.dtype));
    let mode = param_mode(ctx, x.shape, s.shape)?;
    let saturate = ctx.attr_int("saturate", 1)? != 0;
    let range = int_range(to);
    let (xt, st, zt) = (x.dtype, s.dtype, zp.map(|z| z.dtype));
    let n = x.numel();
    let fast_f32 = xt == DType::F32 && st == DType::F32 && precision.is_none();
    Ok(Prepared::single(
        to,
        x.shape,
        kernel("QuantizeLinear", move |io: &mut KernelIo<'_>| {
            let xb = io.input(0)?.bytes();
            let sb = io.input(1)?.bytes();
            let zb = io.opt_input(2)?.map(|z| z.bytes());
            let mut y = io.output(0)?;
            let out = y.bytes_mut();
            let bytes8 = matches!(to, DType::I8 | DType::U8);
            if fast_f32 && bytes8 && mode == Mode::Tensor {
                // The common case (f32 in, one scale, 8-bit out) in f32:
                // the same values as the general loop below.
                let sv = load(st, sb, 0) as f32;
                let z = match (zb, zt) {
                    (Some(b), Some(t)) => load(t, b, 0) as i32,
                    _ => 0,
                };
                let (lo, hi) = if to == DType::I8 {
                    (-128, 127)
                } else {
                    (0, 255)
                };
                if let (Some(xs), Some(out)) =
                    (n.checked_mul(4).and_then(|b| xb.get(..b)), out.get_mut(..n))
                {
                    for (o, x) in out.iter_mut().zip(xs.chunks_of(4)) {
                        let &[b0, b1, b2, b3] = x else {
                            return Err(Error::new(ErrorKind::Internal("QuantizeLinear: chunk")));
                        };
                        let x = f32::from_le_bytes([b0, b1, b2, b3]);
                        *o = quantize_f32(x / sv, z, lo, hi) as u8;
                    }
                    return Ok(());
                }
            }
            for i in 0..n {
                let k = mode.index(i);
                let (mut xv, mut sv) = (load(xt, xb, i), load(st, sb, k));
                if precision.is_some() {
                    xv = round_to(calc, xv);
                    sv = round_to(calc, sv);
                }
                let q = round_to(calc, xv / sv);
                let z = match (zb, zt) {
                    (Some(b), Some(t)) => load(t, b, k),
                    _ => 0.0,
                };
                if let Some((lo, hi)) = range {
                    let r = libm::rint(q) + z;
                    let v = if r.is_nan() {
                        lo
                    } else {
                        // As `clamp`, without its min <= max assertion.
                        r.max(lo as f64).min(hi as f64) as i64
                    };
                    store_int(to, out, i, v);
                } else if let Some(o) = out.get_mut(i) {
                    // float8 zero points are zero by the spec (the reference
                    // ignores them); float4 ones shift in float.
                    *o = if to == DType::F4E2M1 {
                        to.minifloat_from_f64(round_to(DType::F32, q + z), saturate)
                    } else {
                        to.minifloat_from_f64(q, saturate)
                    };
                }
            }
            Ok(())
        }),
    ))
}

fn prepare_dequantize(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let s = ctx.input(1)?;
    let zp = ctx.opt_input(2);
    let ins = [
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U4,
        DType::I4,
        DType::U2,
        DType::I2,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F4E2M1,
    ];
    super::util::dtype_in(x.dtype, &ins, "DequantizeLinear input")?;
    let floats = [DType::F32, DType::F16, DType::BF16];
    let e8m0 = s.dtype == DType::F8E8M0 && ctx.opset >= 24;
    if !e8m0 {
        super::util::dtype_in(s.dtype, &floats, "DequantizeLinear scale")?;
    }
    let to = match ctx.attr_int("output_dtype", 0)? as i32 {
        0 if e8m0 => return Err(invalid("an E8M0 scale needs output_dtype")),
        0 => s.dtype,
        c => DType::from_onnx(c).ok_or(Error::new(ErrorKind::UnsupportedDType {
            what: "DequantizeLinear output_dtype",
            code: c,
        }))?,
    };
    super::util::dtype_in(to, &floats, "DequantizeLinear output")?;
    // Minifloat zero points must be zero; the reference does not subtract them.
    let use_zp = match zp {
        Some(z) if !x.dtype.is_minifloat() => {
            if z.dtype != x.dtype {
                return Err(Error::new(ErrorKind::DTypeMismatch {
                    expected: x.dtype,
                    got: z.dtype,
                }));
            }
            true
        }
        _ => false,
    };
    let mode = param_mode(ctx, x.shape, s.shape)?;
    // numpy: int32 data meets the f32 scale in f64; the rest in f32.
    let calc = if x.dtype == DType::I32 {
        DType::F64
    } else {
        DType::F32
    };
    let (xt, st) = (x.dtype, s.dtype);
    let n = x.numel();
    Ok(Prepared::single(
        to,
        x.shape,
        kernel("DequantizeLinear", move |io: &mut KernelIo<'_>| {
            let xb = io.input(0)?.bytes();
            let sb = io.input(1)?.bytes();
            let zb = if use_zp {
                io.opt_input(2)?.map(|z| z.bytes())
            } else {
                None
            };
            let mut y = io.output(0)?;
            let out = y.bytes_mut();
            for i in 0..n {
                let k = mode.index(i);
                let z = zb.map_or(0.0, |b| load(xt, b, k));
                // x.astype(float32) first, as the reference does.
                let dx = round_to(calc, load(xt, xb, i) as f32 as f64 - z);
                let v = round_to(calc, dx * load(st, sb, k));
                store_float(to, out, i, v);
            }
            Ok(())
        }),
    ))
}

fn prepare_dynamic_quantize(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input_of(0, DType::F32)?;
    let n = x.numel();
    let outputs = alloc::vec![
        OutputInfo::new(DType::U8, x.shape),
        OutputInfo::new(DType::F32, &[]),
        OutputInfo::new(DType::U8, &[]),
    ];
    Ok(Prepared::new(
        outputs,
        kernel("DynamicQuantizeLinear", move |io: &mut KernelIo<'_>| {
            let xs = io.input_slice::<f32>(0)?;
            // The range always holds 0 so that 0 is exactly representable.
            let (mut lo, mut hi) = (0f32, 0f32);
            for &v in xs.iter().take(n) {
                lo = lo.min(v);
                hi = hi.max(v);
            }
            let scale = if hi == lo { 1.0 } else { hi - lo } / 255.0;
            let zp = libm::rintf((0.0 - lo / scale).clamp(0.0, 255.0));
            for (o, &v) in io.output(0)?.bytes_mut().iter_mut().zip(xs) {
                *o = (libm::rintf(v / scale) + zp).clamp(0.0, 255.0) as u8;
            }
            if io.has_output(1) {
                copy_exact(io.output(1)?.bytes_mut(), &scale.to_le_bytes())?;
            }
            if io.has_output(2) {
                if let Some(o) = io.output(2)?.bytes_mut().first_mut() {
                    *o = zp as u8;
                }
            }
            Ok(())
        }),
    ))
}

#[cfg(test)]
mod tests {
    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, run, t, vals};
    use crate::{model::Const, DType};
    use alloc::vec;
    use alloc::vec::Vec;

    fn bytes_of(dt: DType, shape: &[usize], b: &[u8]) -> Option<Const> {
        let mut c = Const::from_slice(shape, b).unwrap();
        c.dtype = dt;
        Some(c)
    }

    fn raw(c: &Const) -> Vec<u8> {
        c.data.bytes().to_vec()
    }

    #[test]
    fn f32_fast_quantize_is_the_f64_path() {
        let mut vals = alloc::vec![0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 127.5, 128.5, -128.5, 255.5];
        vals.extend([
            f32::NAN,
            f32::INFINITY,
            -f32::INFINITY,
            1e30,
            -1e30,
            0.0,
            -0.0,
        ]);
        let mut seed = 5u32;
        for _ in 0..20000 {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            vals.push(f32::from_bits(seed));
            vals.push((seed >> 8) as f32 / 65536.0 - 128.0);
        }
        for q in vals {
            for (z, lo, hi) in [(0, 0, 255), (128, 0, 255), (-3, -128, 127), (0, -128, 127)] {
                let want = {
                    let r = libm::rint(q as f64) + z as f64;
                    if r.is_nan() {
                        lo as i64
                    } else {
                        r.clamp(lo as f64, hi as f64) as i64
                    }
                };
                assert_eq!(super::quantize_f32(q, z, lo, hi) as i64, want, "{q} z {z}");
            }
        }
    }

    #[test]
    fn quantize_uint8_rounds_half_to_even_and_saturates() {
        // y = saturate(rint(x / 2) + 128)
        let x = t(&[6], &[0f32, 2.0, 3.0, 5.0, 1000.0, -1000.0]);
        let r = run(
            "QuantizeLinear",
            13,
            vec![],
            &[x, t(&[], &[2f32]), t(&[], &[128u8])],
            1,
        )
        .unwrap();
        // 1.5 -> 2, 2.5 -> 2 (half to even)
        assert_eq!(vals::<u8>(&r[0]), [128, 129, 130, 130, 255, 0]);
    }

    #[test]
    fn quantize_per_axis_and_blocked() {
        let x = t(&[2, 4], &[1f32, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0]);
        // per axis 0: scales 1 and 10, zero points 0 and 1
        let r = run(
            "QuantizeLinear",
            21,
            vec![("axis", AttrValue::Int(0))],
            &[x.clone(), t(&[2], &[1f32, 10.0]), t(&[2], &[0i8, 1])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i8>(&r[0]), [1, 2, 3, 4, 2, 3, 4, 5]);
        // blocks of 3 along axis 1: columns 0..3 use scale 1, column 3 scale 2
        let r = run(
            "QuantizeLinear",
            21,
            vec![
                ("axis", AttrValue::Int(1)),
                ("block_size", AttrValue::Int(3)),
            ],
            &[x, t(&[2, 2], &[1f32, 2.0, 10.0, 20.0]), None],
            1,
        )
        .unwrap();
        assert_eq!(vals::<u8>(&r[0]), [1, 2, 3, 2, 1, 2, 3, 2]);
    }

    #[test]
    fn quantize_int4_and_float8() {
        let x = t(&[4], &[-20f32, -3.0, 7.0, 30.0]);
        let r = run(
            "QuantizeLinear",
            21,
            vec![("output_dtype", AttrValue::Int(22))],
            &[x.clone(), t(&[], &[1f32]), None],
            1,
        )
        .unwrap();
        assert_eq!(r[0].dtype, DType::I4);
        assert_eq!(raw(&r[0]), [(-8i8) as u8, (-3i8) as u8, 7, 7]);
        // E4M3FN: 30/2 = 15 = 1.875 * 2^3 -> 0 1010 111; -20/2 = -10 -> 1 1010 010
        let r = run(
            "QuantizeLinear",
            21,
            vec![("output_dtype", AttrValue::Int(17))],
            &[x, t(&[], &[2f32]), None],
            1,
        )
        .unwrap();
        assert_eq!(raw(&r[0])[3], 0b0101_0111);
        assert_eq!(raw(&r[0])[0], 0b1101_0010);
    }

    #[test]
    fn quantize_float4_adds_zero_point_and_precision_rounds_first() {
        // E2M1 grid 0, .5, 1, 1.5, 2, 3, 4, 6; zero point 0.5 (code 1):
        // 1.5 -> 3, 3.1 -> 3.0 (5), 100.5 -> 6 (7), 0.2 -> 0.
        let r = run(
            "QuantizeLinear",
            23,
            vec![],
            &[
                t(&[4], &[1f32, 2.6, 100.0, -0.3]),
                t(&[], &[1f32]),
                bytes_of(DType::F4E2M1, &[], &[1]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(raw(&r[0]), [3, 5, 7, 0]);
        // 2.5 + 2^-10 is a tie in f16 and rounds to 2.5, then to 2 (even);
        // in f32 it stays above 2.5 and rounds to 3.
        let x = t(&[1], &[2.500_976_6f32]);
        let q = |attrs| {
            let r = run(
                "QuantizeLinear",
                23,
                attrs,
                &[x.clone(), t(&[], &[1f32]), t(&[], &[0i8])],
                1,
            );
            vals::<i8>(&r.unwrap()[0])
        };
        assert_eq!(q(vec![]), [3]);
        assert_eq!(q(vec![("precision", AttrValue::Int(10))]), [2]);
    }

    #[test]
    fn dequantize_int_uint4_and_float8() {
        // y = (x - zp) * scale
        let r = run(
            "DequantizeLinear",
            13,
            vec![],
            &[t(&[3], &[0u8, 3, 255]), t(&[], &[2f32]), t(&[], &[128u8])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[-256.0, -250.0, 254.0], 0.0);
        let r = run(
            "DequantizeLinear",
            21,
            vec![],
            &[
                bytes_of(DType::U4, &[2], &[15, 1]),
                t(&[], &[0.5f32]),
                bytes_of(DType::U4, &[], &[1]),
            ],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[7.0, 0.0], 0.0);
        // E5M2 0x3C = 1.0, 0xC2 = -3.0; NaN propagates.
        let r = run(
            "DequantizeLinear",
            19,
            vec![],
            &[
                bytes_of(DType::F8E5M2, &[3], &[0x3C, 0xC2, 0x7E]),
                t(&[], &[2f32]),
            ],
            1,
        )
        .unwrap();
        let v: Vec<f32> = vals(&r[0]);
        assert_eq!(&v[..2], &[2.0, -6.0]);
        assert!(v[2].is_nan());
    }

    #[test]
    fn e8m0_scales_from_opset_24() {
        // E8M0 code 126 = 0.5, 129 = 4.
        let s = bytes_of(DType::F8E8M0, &[2], &[126, 129]);
        let r = run(
            "DequantizeLinear",
            24,
            vec![
                ("axis", AttrValue::Int(0)),
                ("output_dtype", AttrValue::Int(1)),
            ],
            &[t(&[2], &[3i8, -3]), s.clone()],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), [1.5, -12.0]);
        let r = run(
            "QuantizeLinear",
            24,
            vec![("axis", AttrValue::Int(0))],
            &[t(&[2], &[1.5f32, -12.0]), s.clone(), t(&[2], &[0i8, 0])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i8>(&r[0]), [3, -3]);
        // Without output_dtype the output would be E8M0 itself.
        let e = run(
            "DequantizeLinear",
            24,
            vec![("axis", AttrValue::Int(0))],
            &[t(&[2], &[3i8, -3]), s],
            1,
        );
        assert!(matches!(e, Err(e) if matches!(e.kind, crate::ErrorKind::Invalid(_))));
    }

    #[test]
    fn dynamic_quantize_matches_spec_formula() {
        // range [-1, 2]: scale 3/255, zp = rint(1 / scale) = 85
        let r = run(
            "DynamicQuantizeLinear",
            11,
            vec![],
            &[t(&[3], &[-1f32, 0.0, 2.0])],
            3,
        )
        .unwrap();
        assert_eq!(vals::<u8>(&r[0]), [0, 85, 255]);
        assert_close(&vals::<f32>(&r[1]), &[3.0 / 255.0], 0.0);
        assert_eq!(vals::<u8>(&r[2]), [85]);
    }
}
