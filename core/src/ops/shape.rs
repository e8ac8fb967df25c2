//! Shape and data-movement operators: zero-copy views (Reshape, Flatten,
//! Squeeze, Unsqueeze, Identity, Dropout), build-time values (Shape, Size,
//! Range), strided copies (Transpose, Slice, Expand, Tile), Concat, Split,
//! Gather, Pad, Cast, ConstantOfShape, Where, comparisons and Not.
//!
//! Data-movement kernels work on raw bytes, so they handle every dtype.

use alloc::vec::Vec;
use core::num::NonZeroUsize;

use crate::dtype::{e8m0_from_f32, E8M0Round};
use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::model::Const;
use crate::ops::{kernel, util, KernelIo, OpDef, PrepareCtx, Prepared};
use crate::tensor::{broadcast_shapes, broadcast_strides, StridedIter, MAX_RANK};
use crate::tensor::{copy_exact, ChunksOf as _};
use crate::{DType, Element};

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("Reshape", 1, prepare_reshape),
    OpDef::onnx("Flatten", 1, prepare_flatten),
    OpDef::onnx("Squeeze", 1, prepare_squeeze),
    OpDef::onnx("Unsqueeze", 1, prepare_unsqueeze),
    OpDef::onnx("Identity", 1, prepare_identity),
    OpDef::onnx("Dropout", 1, prepare_dropout),
    OpDef::onnx("Shape", 1, prepare_shape),
    OpDef::onnx("Size", 1, prepare_size),
    OpDef::onnx("Transpose", 1, prepare_transpose),
    OpDef::onnx("Concat", 1, prepare_concat),
    OpDef::onnx("Split", 1, prepare_split),
    OpDef::onnx("Slice", 1, prepare_slice),
    OpDef::onnx("Gather", 1, prepare_gather),
    OpDef::onnx("Pad", 2, prepare_pad),
    OpDef::onnx("CastLike", 15, prepare_cast_like),
    OpDef::onnx("BitCast", 26, prepare_bit_cast),
    OpDef::onnx("Cast", 6, prepare_cast),
    OpDef::onnx("ConstantOfShape", 9, prepare_constant_of_shape),
    OpDef::onnx("Range", 11, prepare_range),
    OpDef::onnx("Expand", 8, prepare_expand),
    OpDef::onnx("Tile", 6, prepare_tile),
    OpDef::onnx("Where", 9, prepare_where),
    OpDef::onnx("Equal", 7, prepare_equal),
    OpDef::onnx("Less", 7, prepare_less),
    OpDef::onnx("Greater", 7, prepare_greater),
    OpDef::onnx("LessOrEqual", 12, prepare_less_equal),
    OpDef::onnx("GreaterOrEqual", 12, prepare_greater_equal),
    OpDef::onnx("Not", 1, prepare_not),
];

fn shape_err(s: &'static str) -> Error {
    Error::new(ErrorKind::Shape(s))
}

fn attr_err(name: &'static str, problem: &'static str) -> Error {
    Error::new(ErrorKind::Attribute { name, problem })
}

/// Integer list from attribute `name` before `input_since`, from constant
/// input `input` from then on.
fn ints_attr_or_input(
    ctx: &PrepareCtx<'_>,
    name: &'static str,
    input: usize,
    input_since: i64,
) -> Result<Option<Vec<i64>>> {
    if ctx.opset < input_since {
        Ok(ctx.attr_ints(name)?.map(|v| v.to_vec()))
    } else {
        ctx.const_ints(input)
    }
}

/// Normalizes a possibly negative axis; `Err` if outside `[-rank, rank)`.
fn norm_axis(a: i64, rank: usize, name: &'static str) -> Result<usize> {
    let r = rank as i64;
    // a < 0 <= r (a rank, far below i64::MAX): the sum is exact.
    let v = if a < 0 { a.wrapping_add(r) } else { a };
    if v < 0 || v >= r {
        return Err(attr_err(name, "axis out of range"));
    }
    Ok(v as usize)
}

/// Bytes of one element of `dt` holding the value `v` (floats rounded,
/// integers truncated toward zero).
fn value_bytes(dt: DType, v: f64) -> [u8; 8] {
    let mut b = [0u8; 8];
    let iv = v as i128;
    match dt {
        DType::F32 => b[..4].copy_from_slice(&(v as f32).to_le_bytes()),
        DType::F64 => b.copy_from_slice(&v.to_le_bytes()),
        DType::F16 => b[..2].copy_from_slice(&half::f16::from_f64(v).to_le_bytes()),
        DType::BF16 => b[..2].copy_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
        DType::Bool => b[0] = (v != 0.0) as u8,
        _ => b = (iv as u64).to_le_bytes(),
    }
    b
}

// ---------------------------------------------------------------------------
// Zero-copy views.

fn prepare_reshape(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let spec: Vec<i64> = if ctx.opset < 5 {
        ctx.attr_ints("shape")?
            .ok_or(attr_err("shape", "required"))?
            .to_vec()
    } else {
        ctx.const_ints(1)?
            .ok_or(Error::new(ErrorKind::MissingInput { index: 1 }))?
    };
    let allowzero = ctx.opset >= 14 && ctx.attr_int("allowzero", 0)? != 0;
    let numel = x.numel();
    let mut out = Vec::with_capacity(spec.len());
    let mut infer: Option<usize> = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 => {
                if infer.is_some() {
                    return Err(shape_err("Reshape: more than one -1"));
                }
                infer = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(
                *x.shape
                    .get(i)
                    .ok_or(shape_err("Reshape: 0 beyond the input rank"))?,
            ),
            d if d < 0 => return Err(shape_err("Reshape: negative dimension")),
            d => out.push(d as usize),
        }
    }
    let known = checked_numel(&out)?;
    if let Some(i) = infer {
        let known = NonZeroUsize::new(known).ok_or(shape_err("Reshape: cannot infer -1"))?;
        if numel % known != 0 {
            return Err(shape_err("Reshape: cannot infer -1"));
        }
        *out.get_mut(i).ok_or(Error::internal("reshape -1"))? = numel / known;
    }
    if checked_numel(&out)? != numel {
        return Err(shape_err("Reshape: element count differs"));
    }
    Ok(Prepared::alias(x.dtype, &out))
}

fn prepare_flatten(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let r = x.shape.len() as i64;
    let mut a = ctx.attr_int("axis", 1)?;
    if a < 0 {
        a = a.wrapping_add(r); // a < 0 <= r (a rank): exact
    }
    if a < 0 || a > r {
        return Err(attr_err("axis", "axis out of range"));
    }
    let (lead, tail) = x
        .shape
        .split_at_checked(a as usize)
        .ok_or(Error::internal("flatten axis"))?;
    let outer = checked_numel(lead)?;
    let inner = checked_numel(tail)?;
    Ok(Prepared::alias(x.dtype, &[outer, inner]))
}

fn prepare_squeeze(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    let axes = ints_attr_or_input(ctx, "axes", 1, 13)?;
    let mut drop = [false; 64];
    if r > drop.len() {
        return Err(Error::new(ErrorKind::Unsupported("rank above 64")));
    }
    match axes {
        Some(axes) => {
            for &a in &axes {
                let a = norm_axis(a, r, "axes")?;
                let (Some(&d), Some(f)) = (x.shape.get(a), drop.get_mut(a)) else {
                    return Err(Error::internal("squeeze axis"));
                };
                if d != 1 {
                    return Err(shape_err("Squeeze: axis is not of size 1"));
                }
                *f = true;
            }
        }
        None => {
            for (f, &d) in drop.iter_mut().zip(x.shape) {
                *f = d == 1;
            }
        }
    }
    let out: Vec<usize> = x
        .shape
        .iter()
        .zip(&drop)
        .filter(|(_, &dropped)| !dropped)
        .map(|(&d, _)| d)
        .collect();
    Ok(Prepared::alias(x.dtype, &out))
}

fn prepare_unsqueeze(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let axes = ints_attr_or_input(ctx, "axes", 1, 13)?.ok_or(attr_err("axes", "required"))?;
    // Two lengths of in-memory lists, each at most isize::MAX: exact.
    let r = x.shape.len().wrapping_add(axes.len());
    let mut ins = [false; 64];
    if r > ins.len() {
        return Err(Error::new(ErrorKind::Unsupported("rank above 64")));
    }
    for &a in &axes {
        let a = norm_axis(a, r, "axes")?;
        let new = ins.get_mut(a).ok_or(Error::internal("unsqueeze axis"))?;
        if *new {
            return Err(attr_err("axes", "repeated axis"));
        }
        *new = true;
    }
    let mut src = x.shape.iter();
    let mut out = Vec::with_capacity(r);
    for &new in ins.iter().take(r) {
        out.push(if new {
            1
        } else {
            *src.next().ok_or(Error::internal("unsqueeze"))?
        });
    }
    Ok(Prepared::alias(x.dtype, &out))
}

fn prepare_identity(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    Ok(Prepared::alias(x.dtype, x.shape))
}

fn prepare_dropout(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    // With ratio 0 training mode drops nothing: the same as inference.
    let zero_ratio = ctx
        .opt_input(1)
        .and_then(|r| r.value)
        .is_some_and(|v| v.numel() == 1 && v.f64_at(0) == Some(0.0));
    if ctx.opset >= 12 && !zero_ratio {
        if let Some(tm) = ctx.opt_input(2) {
            match tm.value {
                Some(v) if v.numel() > 0 && v.f64_at(0).unwrap_or(0.0) != 0.0 => {
                    return Err(Error::new(ErrorKind::Unsupported(
                        "Dropout in training mode",
                    )));
                }
                Some(_) => {}
                // Inference semantics are only right if training_mode is off.
                None => {
                    return Err(Error::new(ErrorKind::Unsupported(
                        "Dropout whose training_mode is known only at run time",
                    )));
                }
            }
        }
    }
    if !ctx.has_output(1) {
        return Ok(Prepared::alias(x.dtype, x.shape));
    }
    let mask_dt = if ctx.opset >= 10 {
        DType::Bool
    } else {
        x.dtype
    };
    let one = value_bytes(mask_dt, 1.0);
    let es = mask_dt.size();
    let outputs = alloc::vec![
        crate::ops::OutputInfo::new(x.dtype, x.shape),
        crate::ops::OutputInfo::new(mask_dt, x.shape),
    ];
    Ok(Prepared::new(
        outputs,
        kernel("Dropout", move |io: &mut KernelIo<'_>| {
            let one = one.get(..es).ok_or(Error::internal("Dropout mask width"))?;
            let src = io.input(0)?.bytes();
            copy_exact(io.output(0)?.bytes_mut(), src)?;
            let mut m = io.output(1)?;
            for c in m.bytes_mut().chunks_of_mut(es) {
                c.copy_from_slice(one);
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------------------
// Build-time values.

fn prepare_shape(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let r = x.shape.len() as i64;
    let clampi = |v: i64| -> usize {
        let v = if v < 0 { v.wrapping_add(r) } else { v }; // v < 0 <= r: exact
        v.max(0).min(r) as usize
    };
    let (s, e) = if ctx.opset >= 15 {
        (
            clampi(ctx.attr_int("start", 0)?),
            clampi(ctx.attr_int("end", r)?),
        )
    } else {
        (0, r as usize)
    };
    let dims: Vec<i64> = if s < e {
        x.shape
            .get(s..e)
            .ok_or(Error::internal("shape start/end"))?
            .iter()
            .map(|&d| d as i64)
            .collect()
    } else {
        Vec::new()
    };
    Ok(Prepared::values(alloc::vec![Const::from_slice::<i64>(
        &[dims.len()],
        &dims
    )?]))
}

fn prepare_size(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    Ok(Prepared::values(alloc::vec![Const::from_slice::<i64>(
        &[],
        &[x.numel() as i64]
    )?]))
}

fn scalar_f64(ctx: &PrepareCtx<'_>, i: usize) -> Result<f64> {
    let x = ctx.input(i)?;
    let v = x.value.ok_or(Error::new(ErrorKind::Unsupported(
        "Range inputs must be known at build time",
    )))?;
    if v.numel() != 1 {
        return Err(shape_err("Range: inputs must be scalars"));
    }
    v.f64_at(0).ok_or(Error::new(ErrorKind::UnsupportedDType {
        what: "Range",
        code: v.dtype().onnx_code(),
    }))
}

fn prepare_range(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let dt = ctx.input(0)?.dtype;
    util::dtype_in(
        dt,
        &[
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I16,
            DType::I32,
            DType::I64,
        ],
        "Range",
    )?;
    for i in 1..3 {
        if ctx.input(i)?.dtype != dt {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: dt,
                got: ctx.input(i)?.dtype,
            }));
        }
    }
    let c = if dt.is_int() {
        let get = |i: usize| -> Result<i128> {
            let v = ctx
                .input(i)?
                .value
                .ok_or(Error::new(ErrorKind::Unsupported(
                    "Range inputs must be constant",
                )))?;
            if v.numel() != 1 {
                return Err(shape_err("Range: inputs must be scalars"));
            }
            v.int_at(0)
                .map(|x| x as i128)
                .ok_or(Error::internal("range int"))
        };
        let (s, l, d) = (get(0)?, get(1)?, get(2)?);
        if d == 0 {
            return Err(shape_err("Range: delta is 0"));
        }
        // s, l and d are i64 values: in i128 their difference, the
        // quotient plus one, and each s + d·k below (k < n, so between s
        // and l) are exact.
        let span = l.wrapping_sub(s);
        let n = if (span > 0) == (d > 0) && span != 0 {
            let q = span.checked_div(d).ok_or(Error::new(ErrorKind::Overflow))?;
            if span.checked_rem(d) != Some(0) {
                q.wrapping_add(1)
            } else {
                q
            }
        } else {
            0
        };
        let n = usize::try_from(n.max(0)).map_err(|_| Error::new(ErrorKind::Overflow))?;
        ctx.check_alloc(n, 8)?;
        let vals = (0..n).map(|k| s.wrapping_add(d.wrapping_mul(k as i128)));
        match dt {
            DType::I64 => {
                Const::from_slice::<i64>(&[n], &vals.map(|v| v as i64).collect::<Vec<_>>())?
            }
            DType::I32 => {
                Const::from_slice::<i32>(&[n], &vals.map(|v| v as i32).collect::<Vec<_>>())?
            }
            _ => Const::from_slice::<i16>(&[n], &vals.map(|v| v as i16).collect::<Vec<_>>())?,
        }
    } else {
        let (s, l, d) = (
            scalar_f64(ctx, 0)?,
            scalar_f64(ctx, 1)?,
            scalar_f64(ctx, 2)?,
        );
        if d == 0.0 {
            return Err(shape_err("Range: delta is 0"));
        }
        let nf = libm::ceil((l - s) / d);
        let n = if nf.is_nan() || nf <= 0.0 {
            0
        } else {
            nf as usize
        };
        if n as u64 > (1u64 << 32) {
            return Err(Error::new(ErrorKind::Overflow));
        }
        ctx.check_alloc(n, 8)?;
        if dt == DType::F32 {
            let (s, d) = (s as f32, d as f32);
            Const::from_slice::<f32>(&[n], &(0..n).map(|k| s + k as f32 * d).collect::<Vec<_>>())?
        } else if dt == DType::F16 || dt == DType::BF16 {
            // Computed in f32, each value rounded once.
            let (s, d) = (s as f32, d as f32);
            let v = (0..n).map(|k| s + k as f32 * d);
            if dt == DType::F16 {
                Const::from_slice(&[n], &v.map(half::f16::from_f32).collect::<Vec<_>>())?
            } else {
                Const::from_slice(&[n], &v.map(half::bf16::from_f32).collect::<Vec<_>>())?
            }
        } else {
            Const::from_slice::<f64>(&[n], &(0..n).map(|k| s + k as f64 * d).collect::<Vec<_>>())?
        }
    };
    Ok(Prepared::values(alloc::vec![c]))
}

// ---------------------------------------------------------------------------
// Strided copies.

const WR: usize = 2 * MAX_RANK;

/// A strided read of the input, written densely in row-major output order.
#[derive(Clone, Copy, Debug)]
struct Walk {
    rank: usize,
    shape: [usize; WR],
    stride: [isize; WR],
    base: isize,
}

impl Walk {
    /// The axes in use: `shape[..rank]` and `stride[..rank]`.
    fn axes(&self) -> Result<(&[usize], &[isize])> {
        let bad = || Error::internal("walk rank");
        Ok((
            self.shape.get(..self.rank).ok_or_else(bad)?,
            self.stride.get(..self.rank).ok_or_else(bad)?,
        ))
    }

    /// Drops size-1 axes and merges axes that are contiguous in the input.
    fn simplify(self) -> Result<Walk> {
        let bad = || Error::internal("walk simplify");
        let mut w = Walk {
            rank: 0,
            shape: [1; WR],
            stride: [0; WR],
            base: self.base,
        };
        let (shape, stride) = self.axes()?;
        for (&n, &st) in shape.iter().zip(stride) {
            if n == 1 {
                continue;
            }
            if n == 0 {
                return Ok(Walk {
                    rank: 1,
                    shape: [0; WR],
                    stride: [0; WR],
                    base: 0,
                });
            }
            if let Some(last) = w.rank.checked_sub(1) {
                let ls = w.shape.get_mut(last).ok_or_else(bad)?;
                let lst = w.stride.get_mut(last).ok_or_else(bad)?;
                if st.checked_mul(n as isize) == Some(*lst) {
                    *ls = ls.checked_mul(n).ok_or(Error::new(ErrorKind::Overflow))?;
                    *lst = st;
                    continue;
                }
            }
            *w.shape.get_mut(w.rank).ok_or_else(bad)? = n;
            *w.stride.get_mut(w.rank).ok_or_else(bad)? = st;
            w.rank = w.rank.wrapping_add(1); // below WR: the get_mut above
        }
        Ok(w)
    }

    /// The least and greatest input offsets (in elements) the walk reads;
    /// every axis must be non-empty.
    fn bounds(&self) -> Result<(isize, isize)> {
        let (shape, stride) = self.axes()?;
        let over = || Error::internal("strided copy out of range");
        shape
            .iter()
            .zip(stride)
            .try_fold((self.base, self.base), |(lo, hi), (&len, &st)| {
                let last = len.checked_sub(1).ok_or_else(over)?;
                let ext = isize::try_from(last)
                    .ok()
                    .and_then(|l| l.checked_mul(st))
                    .ok_or_else(over)?;
                Ok(if ext < 0 {
                    (lo.checked_add(ext).ok_or_else(over)?, hi)
                } else {
                    (lo, hi.checked_add(ext).ok_or_else(over)?)
                })
            })
    }

    fn copy(&self, src: &[u8], dst: &mut [u8], es: usize) -> Result<()> {
        let (shape, stride) = self.axes()?;
        let n = checked_numel(shape)?;
        if n == 0 {
            return Ok(());
        }
        let bad = || Error::internal("strided copy out of range");
        // Checked once here: every element read lies in [lo, hi] with
        // (hi + 1) · es <= src.len(), and the n · es bytes written fit dst.
        // The offsets below are then computed wrapping: exact modulo 2^N,
        // and each one read lies in [lo, hi], so it is the true one (an
        // axis run one past its end is undone the same way). Byte
        // positions stay below src.len() or dst.len(): exact.
        let (lo, hi) = self.bounds()?;
        let src_end = usize::try_from(hi)
            .ok()
            .and_then(|h| h.checked_add(1)?.checked_mul(es));
        let dst_end = n.checked_mul(es);
        if lo < 0 || src_end.is_none_or(|e| e > src.len()) || dst_end.is_none_or(|e| e > dst.len())
        {
            return Err(bad());
        }
        let (inner_len, inner_stride, outer_shape, outer_stride) =
            match (shape.split_last(), stride.split_last()) {
                // Rank 0: one element.
                (None, None) => (1, 1, shape, stride),
                (Some((&len, os)), Some((&st, ost))) => (len, st, os, ost),
                _ => return Err(bad()),
            };
        let mut idx = [0usize; WR];
        let mut off = self.base;
        let mut d = 0usize;
        loop {
            if inner_stride == 1 {
                let s = usize::try_from(off).map_err(|_| bad())?.wrapping_mul(es);
                let len = inner_len.wrapping_mul(es);
                let from = src.get(s..s.wrapping_add(len)).ok_or_else(bad)?;
                dst.get_mut(d..d.wrapping_add(len))
                    .ok_or_else(bad)?
                    .copy_from_slice(from);
                d = d.wrapping_add(len);
            } else {
                let mut o = off;
                for _ in 0..inner_len {
                    let s = usize::try_from(o).map_err(|_| bad())?.wrapping_mul(es);
                    let from = src.get(s..s.wrapping_add(es)).ok_or_else(bad)?;
                    dst.get_mut(d..d.wrapping_add(es))
                        .ok_or_else(bad)?
                        .copy_from_slice(from);
                    d = d.wrapping_add(es);
                    o = o.wrapping_add(inner_stride);
                }
            }
            // Next row: count up the outer axes, the last fastest.
            let mut done = true;
            for ((i, &len), &st) in idx.iter_mut().zip(outer_shape).zip(outer_stride).rev() {
                *i = i.wrapping_add(1); // at most len
                off = off.wrapping_add(st);
                if *i < len {
                    done = false;
                    break;
                }
                off = off.wrapping_sub(st.wrapping_mul(len as isize));
                *i = 0;
            }
            if done {
                return Ok(());
            }
        }
    }
}

fn in_strides(shape: &[usize]) -> Result<[isize; MAX_RANK]> {
    let s =
        crate::tensor::strides(shape).ok_or(Error::new(ErrorKind::Unsupported("rank above 8")))?;
    Ok(s.map(|v| v as isize))
}

fn walk_prepared(name: &'static str, dt: DType, out_shape: &[usize], w: Walk) -> Result<Prepared> {
    let w = w.simplify()?;
    let es = dt.size();
    Ok(Prepared::single(
        dt,
        out_shape,
        kernel(name, move |io: &mut KernelIo<'_>| {
            let src = io.input(0)?.bytes();
            w.copy(src, io.output(0)?.bytes_mut(), es)
        }),
    ))
}

fn prepare_transpose(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    let perm: Vec<usize> = match ctx.attr_ints("perm")? {
        Some(p) => p
            .iter()
            .map(|&a| norm_axis(a, r, "perm"))
            .collect::<Result<_>>()?,
        None => (0..r).rev().collect(),
    };
    if perm.len() != r {
        return Err(attr_err("perm", "length differs from the rank"));
    }
    let mut seen = [false; MAX_RANK];
    let st = in_strides(x.shape)?;
    let mut w = Walk {
        rank: r,
        shape: [1; WR],
        stride: [0; WR],
        base: 0,
    };
    let mut out = Vec::with_capacity(r);
    // perm has r entries, each below r <= MAX_RANK (checked by in_strides).
    for ((ws, wst), &p) in w.shape.iter_mut().zip(&mut w.stride).zip(&perm) {
        let (Some(seen_p), Some(&d), Some(&stride)) = (seen.get_mut(p), x.shape.get(p), st.get(p))
        else {
            return Err(Error::internal("transpose perm"));
        };
        if *seen_p {
            return Err(attr_err("perm", "not a permutation"));
        }
        *seen_p = true;
        *ws = d;
        *wst = stride;
        out.push(d);
    }
    walk_prepared("Transpose", x.dtype, &out, w)
}

fn prepare_slice(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    let (starts, ends, axes, steps) = if ctx.opset < 10 {
        (
            ctx.attr_ints("starts")?
                .ok_or(attr_err("starts", "required"))?
                .to_vec(),
            ctx.attr_ints("ends")?
                .ok_or(attr_err("ends", "required"))?
                .to_vec(),
            ctx.attr_ints("axes")?.map(|v| v.to_vec()),
            None,
        )
    } else {
        (
            ctx.const_ints(1)?
                .ok_or(Error::new(ErrorKind::MissingInput { index: 1 }))?,
            ctx.const_ints(2)?
                .ok_or(Error::new(ErrorKind::MissingInput { index: 2 }))?,
            ctx.const_ints(3)?,
            ctx.const_ints(4)?,
        )
    };
    let n = starts.len();
    if ends.len() != n
        || axes.as_ref().is_some_and(|a| a.len() != n)
        || steps.as_ref().is_some_and(|s| s.len() != n)
    {
        return Err(shape_err(
            "Slice: starts, ends, axes and steps differ in length",
        ));
    }
    let st = in_strides(x.shape)?;
    let mut w = Walk {
        rank: r,
        shape: [1; WR],
        stride: [0; WR],
        base: 0,
    };
    // r <= MAX_RANK (checked by in_strides): the zip covers every axis.
    for ((ws, wst), (&d, &stride)) in w
        .shape
        .iter_mut()
        .zip(&mut w.stride)
        .zip(x.shape.iter().zip(&st))
    {
        *ws = d;
        *wst = stride;
    }
    let bad = || Error::internal("slice axis");
    let mut seen = [false; MAX_RANK];
    for (k, (&start, &end)) in starts.iter().zip(&ends).enumerate() {
        let a = match &axes {
            Some(ax) => norm_axis(*ax.get(k).ok_or_else(bad)?, r, "axes")?,
            None => k,
        };
        // Without axes, k may reach r: an input error, like a repeat (and
        // `get_mut` fails only for a >= MAX_RANK >= r).
        match seen.get_mut(a) {
            Some(seen_a) if a < r && !*seen_a => *seen_a = true,
            _ => return Err(attr_err("axes", "repeated or out of range")),
        }
        let step = match &steps {
            Some(s) => *s.get(k).ok_or_else(bad)?,
            // Steps absent: 1 on every axis, per the spec.
            None => 1,
        };
        if step == 0 {
            return Err(shape_err("Slice: step is 0"));
        }
        let d = *x.shape.get(a).ok_or_else(bad)? as i128;
        let st_a = *st.get(a).ok_or_else(bad)?;
        // In i128, d (a usize), start, end and step (i64 values) and the
        // few sums and differences of them below are exact.
        let (mut s, mut e, step) = (start as i128, end as i128, step as i128);
        if s < 0 {
            s = s.wrapping_add(d);
        }
        if e < 0 {
            e = e.wrapping_add(d);
        }
        // The distance from s toward e (exclusive) and the step's size.
        let (dist, mag) = if step > 0 {
            s = s.max(0).min(d);
            e = e.max(0).min(d);
            (e.wrapping_sub(s), step)
        } else {
            let last = d.wrapping_sub(1);
            s = s.max(0).min(last);
            e = e.max(-1).min(last);
            (s.wrapping_sub(e), step.wrapping_neg())
        };
        // Whole steps, rounded up.
        let len = if dist > 0 {
            let ceil = dist.wrapping_add(mag).wrapping_sub(1);
            ceil.checked_div(mag).ok_or_else(bad)?
        } else {
            0
        };
        let overflow = || Error::new(ErrorKind::Overflow);
        if len > 0 {
            // s is an index on the axis (0 <= s < d).
            let at = isize::try_from(s).ok().and_then(|s| s.checked_mul(st_a));
            w.base = at
                .and_then(|at| w.base.checked_add(at))
                .ok_or_else(overflow)?;
        }
        // Only an axis of two or more elements ever steps (`simplify` drops
        // the others): then |step| < d keeps the stride inside the input.
        let stride = if len > 1 {
            isize::try_from(step)
                .ok()
                .and_then(|step| st_a.checked_mul(step))
                .ok_or_else(overflow)?
        } else {
            0
        };
        *w.stride.get_mut(a).ok_or_else(bad)? = stride;
        *w.shape.get_mut(a).ok_or_else(bad)? = len as usize;
    }
    let out: Vec<usize> = w.axes()?.0.to_vec();
    walk_prepared("Slice", x.dtype, &out, w)
}

fn prepare_expand(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let shape = ctx
        .const_ints(1)?
        .ok_or(Error::new(ErrorKind::MissingInput { index: 1 }))?;
    let shape: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| shape_err("Expand: negative dim")))
        .collect::<Result<_>>()?;
    let mut out = [0usize; MAX_RANK];
    let r = broadcast_shapes(x.shape, &shape, &mut out)?;
    let out = out.get(..r).ok_or(Error::internal("expand rank"))?;
    let bs = broadcast_strides(x.shape, out);
    let mut w = Walk {
        rank: r,
        shape: [1; WR],
        stride: [0; WR],
        base: 0,
    };
    // r <= MAX_RANK < WR: the zip covers every axis.
    for ((ws, wst), (&d, &stride)) in w
        .shape
        .iter_mut()
        .zip(&mut w.stride)
        .zip(out.iter().zip(&bs))
    {
        *ws = d;
        *wst = stride as isize;
    }
    walk_prepared("Expand", x.dtype, out, w)
}

fn prepare_tile(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    let reps = ctx
        .const_ints(1)?
        .ok_or(Error::new(ErrorKind::MissingInput { index: 1 }))?;
    if reps.len() != r {
        return Err(shape_err("Tile: repeats length differs from the rank"));
    }
    let st = in_strides(x.shape)?;
    let mut w = Walk {
        rank: r.wrapping_mul(2), // r <= MAX_RANK (in_strides above)
        shape: [1; WR],
        stride: [0; WR],
        base: 0,
    };
    let mut out = Vec::with_capacity(r);
    // Axis i becomes walk axes 2i (the repeat, stride 0) and 2i + 1; r <=
    // MAX_RANK (checked by in_strides), so the zip covers every axis.
    for (((&rep, (&d, &stride)), ws), wst) in reps
        .iter()
        .zip(x.shape.iter().zip(&st))
        .zip(w.shape.chunks_of_mut(2))
        .zip(w.stride.chunks_of_mut(2))
    {
        let rep = usize::try_from(rep).map_err(|_| shape_err("Tile: negative repeat"))?;
        let ([rep_n, n], [rep_st, st_n]) = (ws, wst) else {
            return Err(Error::internal("tile walk"));
        };
        (*rep_n, *rep_st) = (rep, 0);
        (*n, *st_n) = (d, stride);
        out.push(rep.checked_mul(d).ok_or(Error::new(ErrorKind::Overflow))?);
    }
    walk_prepared("Tile", x.dtype, &out, w)
}

// ---------------------------------------------------------------------------
// Concat, Split, Gather.

fn prepare_concat(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x0 = ctx.input(0)?;
    let r = x0.shape.len();
    let axis = norm_axis(
        ctx.attr_int("axis", if ctx.opset < 4 { 1 } else { i64::MAX })?,
        r,
        "axis",
    )?;
    let bad = || Error::internal("concat axis");
    let (lead0, rest0) = x0.shape.split_at_checked(axis).ok_or_else(bad)?;
    let inner = checked_numel(rest0.get(1..).ok_or_else(bad)?)?;
    let mut total = 0usize;
    let es = x0.dtype.size();
    let overflow = || Error::new(ErrorKind::Overflow);
    let mut rows = Vec::with_capacity(ctx.num_inputs());
    for i in 0..ctx.num_inputs() {
        let x = ctx.input(i)?;
        if x.dtype != x0.dtype {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: x0.dtype,
                got: x.dtype,
            }));
        }
        if x.shape.len() != r {
            return Err(Error::new(ErrorKind::Rank {
                expected: r,
                got: x.shape.len(),
            }));
        }
        for (a, (&d, &d0)) in x.shape.iter().zip(x0.shape).enumerate() {
            if a != axis && d != d0 {
                return Err(Error::new(ErrorKind::Dim {
                    axis: a,
                    expected: d0 as u64,
                    got: d as u64,
                }));
            }
        }
        let d = *x.shape.get(axis).ok_or_else(bad)?;
        total = total.checked_add(d).ok_or_else(overflow)?;
        let row = d.checked_mul(inner).and_then(|v| v.checked_mul(es));
        rows.push(row.ok_or_else(overflow)?);
    }
    let mut out: Vec<usize> = x0.shape.to_vec();
    *out.get_mut(axis).ok_or_else(bad)? = total;
    let outer = checked_numel(lead0)?;
    // The output's bytes, outer · out_row, checked: every offset below is
    // at most that (o < outer, acc + row <= out_row), so exact.
    let out_row = rows
        .iter()
        .try_fold(0usize, |a, &r| a.checked_add(r))
        .filter(|&t| outer.checked_mul(t).is_some())
        .ok_or_else(overflow)?;
    Ok(Prepared::single(
        x0.dtype,
        &out,
        kernel("Concat", move |io: &mut KernelIo<'_>| {
            let bad = || Error::internal("concat range");
            let mut acc = 0usize;
            for (i, &row) in rows.iter().enumerate() {
                let src = io.input(i)?.bytes();
                let mut y = io.output(0)?;
                let dst = y.bytes_mut();
                for o in 0..outer {
                    let s0 = o.wrapping_mul(row);
                    let from = src.get(s0..s0.wrapping_add(row)).ok_or_else(bad)?;
                    let d0 = o.wrapping_mul(out_row).wrapping_add(acc);
                    dst.get_mut(d0..d0.wrapping_add(row))
                        .ok_or_else(bad)?
                        .copy_from_slice(from);
                }
                acc = acc.wrapping_add(row);
            }
            Ok(())
        }),
    ))
}

fn prepare_split(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    let axis = norm_axis(ctx.attr_int("axis", 0)?, r, "axis")?;
    let bad = || Error::internal("split axis");
    let (lead, rest) = x.shape.split_at_checked(axis).ok_or_else(bad)?;
    let (&d, tail) = rest.split_first().ok_or_else(bad)?;
    let nout = ctx.num_outputs();
    let split = if ctx.opset < 13 {
        ctx.attr_ints("split")?.map(|v| v.to_vec())
    } else {
        ctx.const_ints(1)?
    };
    let sizes: Vec<usize> = match split {
        Some(s) => {
            let s: Vec<usize> = s
                .iter()
                .map(|&v| usize::try_from(v).map_err(|_| attr_err("split", "negative")))
                .collect::<Result<_>>()?;
            let sum = s.iter().try_fold(0usize, |a, &v| a.checked_add(v));
            if sum != Some(d) || s.len() != nout {
                return Err(attr_err(
                    "split",
                    "sizes do not sum to the axis or count differs from the outputs",
                ));
            }
            s
        }
        None => {
            let n = if ctx.opset >= 18 {
                ctx.attr_int("num_outputs", nout as i64)? as usize
            } else {
                nout
            };
            let parts = NonZeroUsize::new(n)
                .filter(|_| n == nout)
                .ok_or(attr_err("num_outputs", "differs from the node's outputs"))?;
            if ctx.opset >= 18 && ctx.node.attr("num_outputs").is_some() {
                let c = d.div_ceil(n);
                // Past the axis (saturated), an empty part.
                (0..n)
                    .map(|k| c.min(d.saturating_sub(c.saturating_mul(k))))
                    .collect()
            } else {
                if d % parts != 0 {
                    return Err(shape_err("Split: axis not divisible by the output count"));
                }
                alloc::vec![d / parts; n]
            }
        }
    };
    let overflow = || Error::new(ErrorKind::Overflow);
    let inner = checked_numel(tail)?
        .checked_mul(x.dtype.size())
        .ok_or_else(overflow)?;
    let outer = checked_numel(lead)?;
    let mut outputs = Vec::with_capacity(nout);
    let mut rows = Vec::with_capacity(nout);
    for &s in &sizes {
        let mut sh = x.shape.to_vec();
        *sh.get_mut(axis).ok_or_else(bad)? = s;
        outputs.push(crate::ops::OutputInfo::new(x.dtype, &sh));
        rows.push(s.checked_mul(inner).ok_or_else(overflow)?);
    }
    // The input's bytes, outer · in_row, checked: the sizes sum to d, so
    // every offset below is at most that (o < outer, acc + row <= in_row,
    // row <= in_row): exact.
    let in_row = d
        .checked_mul(inner)
        .filter(|&v| outer.checked_mul(v).is_some())
        .ok_or_else(overflow)?;
    Ok(Prepared::new(
        outputs,
        kernel("Split", move |io: &mut KernelIo<'_>| {
            let bad = || Error::internal("split range");
            let src = io.input(0)?.bytes();
            let mut acc = 0usize;
            for (j, &row) in rows.iter().enumerate() {
                if io.has_output(j) {
                    let mut y = io.output(j)?;
                    let dst = y.bytes_mut();
                    for o in 0..outer {
                        let s0 = o.wrapping_mul(in_row).wrapping_add(acc);
                        let from = src.get(s0..s0.wrapping_add(row)).ok_or_else(bad)?;
                        let d0 = o.wrapping_mul(row);
                        dst.get_mut(d0..d0.wrapping_add(row))
                            .ok_or_else(bad)?
                            .copy_from_slice(from);
                    }
                }
                acc = acc.wrapping_add(row);
            }
            Ok(())
        }),
    ))
}

fn prepare_gather(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let idx = ctx.input(1)?;
    util::dtype_in(idx.dtype, &[DType::I32, DType::I64], "Gather indices")?;
    let r = x.shape.len();
    let axis = norm_axis(ctx.attr_int("axis", 0)?, r, "axis")?;
    let bad = || Error::internal("gather axis");
    let (lead, rest) = x.shape.split_at_checked(axis).ok_or_else(bad)?;
    let (&dim, tail) = rest.split_first().ok_or_else(bad)?;
    let mut out: Vec<usize> = lead.to_vec();
    out.extend_from_slice(idx.shape);
    out.extend_from_slice(tail);
    let es = x.dtype.size();
    let outer = checked_numel(lead)?;
    let overflow = || Error::new(ErrorKind::Overflow);
    let inner = checked_numel(tail)?.checked_mul(es).ok_or_else(overflow)?;
    let nidx = idx.numel();
    // The input's and the output's bytes, outer · dim · inner and outer ·
    // nidx · inner, checked: every offset below is at most one of them
    // (o < outer, 0 <= k < dim, j < nidx), so exact.
    let fits = |n: usize| outer.checked_mul(n)?.checked_mul(inner);
    if fits(dim).is_none() || fits(nidx).is_none() {
        return Err(overflow());
    }
    let dim_i = i64::try_from(dim).map_err(|_| overflow())?;
    Ok(Prepared::single(
        x.dtype,
        &out,
        kernel("Gather", move |io: &mut KernelIo<'_>| {
            let bad = || Error::internal("gather range");
            let src = io.input(0)?.bytes();
            let iv = io.input(1)?;
            let mut y = io.output(0)?;
            let dst = y.bytes_mut();
            let mut d = 0usize;
            for o in 0..outer {
                for j in 0..nidx {
                    let mut k = iv.int_at(j).ok_or_else(bad)?;
                    if k < 0 {
                        k = k.wrapping_add(dim_i); // k < 0 <= dim_i: exact
                    }
                    if k < 0 || k >= dim_i {
                        return Err(shape_err("Gather: index out of range"));
                    }
                    let s0 = o.wrapping_mul(dim).wrapping_add(k as usize);
                    let s0 = s0.wrapping_mul(inner);
                    let from = src.get(s0..s0.wrapping_add(inner)).ok_or_else(bad)?;
                    dst.get_mut(d..d.wrapping_add(inner))
                        .ok_or_else(bad)?
                        .copy_from_slice(from);
                    d = d.wrapping_add(inner);
                }
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------------------
// Pad.

fn prepare_pad(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    if r > MAX_RANK {
        return Err(Error::new(ErrorKind::Unsupported("rank above 8")));
    }
    let dt = x.dtype;
    let es = dt.size();
    let mode = ctx.attr_str("mode", "constant")?;
    let (pads_spec, default_val) = if ctx.opset < 11 {
        let p = ctx
            .attr_ints(if ctx.opset < 2 { "paddings" } else { "pads" })?
            .ok_or(attr_err("pads", "required"))?;
        (
            p.to_vec(),
            value_bytes(dt, ctx.attr_float("value", 0.0)? as f64),
        )
    } else {
        (
            ctx.const_ints(1)?
                .ok_or(Error::new(ErrorKind::MissingInput { index: 1 }))?,
            [0u8; 8],
        )
    };
    let axes: Vec<usize> = match if ctx.opset >= 18 {
        ctx.const_ints(3)?
    } else {
        None
    } {
        Some(a) => a
            .iter()
            .map(|&v| norm_axis(v, r, "axes"))
            .collect::<Result<_>>()?,
        None => (0..r).collect(),
    };
    let na = axes.len();
    if na.checked_mul(2) != Some(pads_spec.len()) {
        return Err(attr_err("pads", "length is not twice the number of axes"));
    }
    let bad = || Error::internal("pad axis");
    let mut begin = [0i64; MAX_RANK];
    let mut end = [0i64; MAX_RANK];
    let (pads_begin, pads_end) = pads_spec.split_at_checked(na).ok_or_else(bad)?;
    for ((&a, &b), &e) in axes.iter().zip(pads_begin).zip(pads_end) {
        // a < r <= MAX_RANK.
        *begin.get_mut(a).ok_or_else(bad)? = b;
        *end.get_mut(a).ok_or_else(bad)? = e;
    }
    #[derive(Clone, Copy, PartialEq)]
    enum M {
        Constant,
        Reflect,
        Edge,
        Wrap,
    }
    let m = match mode {
        "constant" => M::Constant,
        "reflect" => M::Reflect,
        "edge" => M::Edge,
        "wrap" => M::Wrap,
        _ => return Err(attr_err("mode", "unknown pad mode")),
    };
    let st = in_strides(x.shape)?;
    let overflow = || Error::new(ErrorKind::Overflow);
    let mut out = Vec::with_capacity(r);
    // Per axis and output coordinate: input offset (in elements), or -1.
    let mut table: Vec<isize> = Vec::new();
    let mut starts = [0usize; MAX_RANK];
    // The greatest input offset an output element reads: the sum over the
    // axes of their greatest entry.
    let mut reach = 0isize;
    // r <= MAX_RANK: the zip covers every axis.
    for (((&d, &stride), (&b, &e)), start) in x
        .shape
        .iter()
        .zip(&st)
        .zip(begin.iter().zip(&end))
        .zip(&mut starts)
    {
        let d = d as i64;
        let o = d
            .checked_add(b)
            .and_then(|o| o.checked_add(e))
            .ok_or_else(overflow)?;
        if o < 0 {
            return Err(shape_err("Pad: negative output dimension"));
        }
        out.push(o as usize);
        *start = table.len();
        let mut top = 0isize;
        for i in 0..o {
            let c = i.checked_sub(b).ok_or_else(overflow)?;
            let c = if (0..d).contains(&c) {
                c
            } else {
                match m {
                    M::Constant => -1,
                    _ if d == 0 => {
                        return Err(shape_err("Pad: cannot pad an empty axis in this mode"))
                    }
                    M::Edge => c.max(0).min(d.wrapping_sub(1)), // d >= 1 here
                    M::Wrap => c
                        .checked_rem_euclid(d)
                        .ok_or(shape_err("Pad: cannot pad an empty axis in this mode"))?,
                    M::Reflect => {
                        if d == 1 {
                            0
                        } else {
                            // d >= 2 here: d - 1 is exact.
                            let p = d.wrapping_sub(1).checked_mul(2).ok_or_else(overflow)?;
                            let c = c
                                .checked_rem_euclid(p)
                                .ok_or(shape_err("Pad: cannot pad an empty axis in this mode"))?;
                            if c >= d {
                                p.wrapping_sub(c) // d <= c < p: exact
                            } else {
                                c
                            }
                        }
                    }
                }
            };
            let t = if c < 0 {
                -1
            } else {
                isize::try_from(c)
                    .ok()
                    .and_then(|c| c.checked_mul(stride))
                    .ok_or_else(overflow)?
            };
            top = top.max(t);
            table.push(t);
        }
        reach = reach.checked_add(top).ok_or_else(overflow)?;
    }
    // The kernel's byte offsets stay at most (reach + 1) · es: checked here.
    usize::try_from(reach)
        .ok()
        .and_then(|r| r.checked_add(1)?.checked_mul(es))
        .ok_or_else(overflow)?;
    let oshape: [usize; MAX_RANK] = {
        let mut s = [1usize; MAX_RANK];
        copy_exact(s.get_mut(..r).ok_or_else(bad)?, &out)?;
        s
    };
    let has_cv = ctx.opset >= 11 && ctx.opt_input(2).is_some();
    Ok(Prepared::single(
        dt,
        &out,
        kernel("Pad", move |io: &mut KernelIo<'_>| {
            let bad = || Error::internal("pad range");
            let src = io.input(0)?.bytes();
            let mut val = default_val;
            if has_cv {
                if let Some(cv) = io.opt_input(2)? {
                    if cv.numel() > 0 {
                        let b = cv.bytes().get(..es).ok_or_else(bad)?;
                        val.get_mut(..es).ok_or_else(bad)?.copy_from_slice(b);
                    }
                }
            }
            let val = val.get(..es).ok_or_else(bad)?;
            let mut y = io.output(0)?;
            let dst = y.bytes_mut();
            if dst.is_empty() {
                return Ok(());
            }
            let starts = starts.get(..r).ok_or_else(bad)?;
            let oshape = oshape.get(..r).ok_or_else(bad)?;
            let mut idx_all = [0usize; MAX_RANK];
            let idx = idx_all.get_mut(..r).ok_or_else(bad)?;
            // Exact: an axis's entries start at `start` and number its
            // output size (i is below it), off sums at most one entry per
            // axis (at most reach), and (reach + 1) · es was checked.
            for chunk in dst.chunks_of_mut(es) {
                let mut off = 0isize;
                let mut constant = false;
                for (&start, &i) in starts.iter().zip(idx.iter()) {
                    let t = *table.get(start.wrapping_add(i)).ok_or_else(bad)?;
                    if t < 0 {
                        constant = true;
                        break;
                    }
                    off = off.wrapping_add(t);
                }
                if constant {
                    chunk.copy_from_slice(val);
                } else {
                    let s = (off as usize).wrapping_mul(es);
                    chunk.copy_from_slice(src.get(s..s.wrapping_add(es)).ok_or_else(bad)?);
                }
                for (i, &n) in idx.iter_mut().zip(oshape).rev() {
                    *i = i.wrapping_add(1); // at most n
                    if *i < n {
                        break;
                    }
                    *i = 0;
                }
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------------------
// Cast, ConstantOfShape.

#[derive(Clone, Copy)]
enum Num {
    F(f64),
    I(i128),
}

#[inline]
fn read_num(dt: DType, b: &[u8]) -> Num {
    let mut w = [0u8; 8];
    // The first min(len, 8) bytes.
    for (d, &s) in w.iter_mut().zip(b) {
        *d = s;
    }
    match dt {
        DType::F32 => Num::F(f32::from_le_bytes([w[0], w[1], w[2], w[3]]) as f64),
        DType::F64 => Num::F(f64::from_le_bytes(w)),
        DType::F16 => Num::F(half::f16::from_le_bytes([w[0], w[1]]).to_f64()),
        DType::BF16 => Num::F(half::bf16::from_le_bytes([w[0], w[1]]).to_f64()),
        DType::I8 => Num::I(w[0] as i8 as i128),
        DType::U8 | DType::Bool => Num::I(w[0] as i128),
        DType::I16 => Num::I(i16::from_le_bytes([w[0], w[1]]) as i128),
        DType::U16 => Num::I(u16::from_le_bytes([w[0], w[1]]) as i128),
        DType::I32 => Num::I(i32::from_le_bytes([w[0], w[1], w[2], w[3]]) as i128),
        DType::U32 => Num::I(u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as i128),
        DType::I64 => Num::I(i64::from_le_bytes(w) as i128),
        DType::U64 => Num::I(u64::from_le_bytes(w) as i128),
        DType::I4 | DType::I2 => Num::I(w[0] as i8 as i128),
        DType::U4 | DType::U2 => Num::I(w[0] as i128),
        DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::F4E2M1
        | DType::F8E8M0 => Num::F(dt.minifloat_to_f64(w[0])),
    }
}

/// `saturate` and `round` are Cast attributes: only the 8-bit floats look
/// at them.
#[inline]
fn write_num(dt: DType, v: Num, saturate: bool, round: E8M0Round, out: &mut [u8]) {
    let mut w = [0u8; 8];
    let (f, i) = match v {
        Num::F(f) => (f, f as i64 as i128),
        Num::I(i) => (i as f64, i),
    };
    match dt {
        DType::F32 => {
            let x = match v {
                Num::F(f) => f as f32,
                Num::I(i) => i as f32,
            };
            w[..4].copy_from_slice(&x.to_le_bytes())
        }
        DType::F64 => w.copy_from_slice(&f.to_le_bytes()),
        DType::F16 => w[..2].copy_from_slice(&half::f16::from_f64(f).to_le_bytes()),
        DType::BF16 => w[..2].copy_from_slice(&half::bf16::from_f64(f).to_le_bytes()),
        DType::Bool => {
            w[0] = match v {
                Num::F(f) => (f != 0.0) as u8,
                Num::I(i) => (i != 0) as u8,
            }
        }
        DType::U64 => {
            let u = match v {
                // Negative floats wrap through i64 like a C cast on x86.
                Num::F(f) if f >= i64::MAX as f64 => f as u64,
                _ => i as u64,
            };
            w = u.to_le_bytes()
        }
        // The reference converts to f32 first.
        DType::F8E8M0 => w[0] = e8m0_from_f32(f as f32, saturate, round),
        _ if dt.is_minifloat() => w[0] = dt.minifloat_from_f64(f, saturate),
        _ if dt.small_int_range().is_some() => {
            w[0] = match v {
                Num::F(f) => dt.small_int_from_f64(f),
                Num::I(i) => dt.wrap_small_int(i),
            }
        }
        _ => w = (i as u64).to_le_bytes(),
    }
    // `out` is one element of `dt`: `dt.size()` (at most 8) bytes.
    for (o, &b) in out.iter_mut().zip(&w) {
        *o = b;
    }
}

fn prepare_cast(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let code = ctx.attr_int("to", 0)?;
    let to = DType::from_onnx(code as i32).ok_or(Error::new(ErrorKind::UnsupportedDType {
        what: "Cast to",
        code: code as i32,
    }))?;
    cast_to(ctx, to)
}

/// BitCast: the same bytes read as another type of the same width. A view
/// (no copy), except to bool, whose bytes must be normalized to 0 or 1.
/// Sub-byte types are refused: mote stores them unpacked, so their bytes
/// are not the file's bits.
fn prepare_bit_cast(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let code = ctx.attr_int("to", 0)?;
    let to = DType::from_onnx(code as i32).ok_or(Error::new(ErrorKind::UnsupportedDType {
        what: "BitCast to",
        code: code as i32,
    }))?;
    if x.dtype.packed_bits().is_some() || to.packed_bits().is_some() {
        return Err(Error::new(ErrorKind::Unsupported(
            "BitCast of sub-byte types",
        )));
    }
    if x.dtype.size() != to.size() {
        return Err(Error::new(ErrorKind::Invalid(
            "BitCast between types of different widths",
        )));
    }
    if to != DType::Bool {
        return Ok(Prepared::alias(to, x.shape));
    }
    Ok(Prepared::single(
        to,
        x.shape,
        kernel("BitCast", |io: &mut KernelIo<'_>| {
            let src = io.input(0)?.bytes();
            let mut y = io.output(0)?;
            for (o, &i) in y.bytes_mut().iter_mut().zip(src) {
                *o = (i != 0) as u8;
            }
            Ok(())
        }),
    ))
}

/// CastLike: Cast to the dtype of input 1 (whose values are not read).
fn prepare_cast_like(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let to = ctx.input(1)?.dtype;
    cast_to(ctx, to)
}

fn cast_to(ctx: &PrepareCtx<'_>, to: DType) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let from = x.dtype;
    if from == to {
        return Ok(Prepared::alias(to, x.shape));
    }
    let (ei, eo) = (from.size(), to.size());
    let saturate = ctx.attr_int("saturate", 1)? != 0;
    let round = match ctx.attr_str("round_mode", "up")? {
        "up" => E8M0Round::Up,
        "down" => E8M0Round::Down,
        "nearest" => E8M0Round::Nearest,
        _ => return Err(Error::new(ErrorKind::Unsupported("Cast round_mode"))),
    };
    Ok(Prepared::single(
        to,
        x.shape,
        kernel("Cast", move |io: &mut KernelIo<'_>| {
            let src = io.input(0)?.bytes();
            let mut y = io.output(0)?;
            for (i, o) in src.chunks_of(ei).zip(y.bytes_mut().chunks_of_mut(eo)) {
                write_num(to, read_num(from, i), saturate, round, o);
            }
            Ok(())
        }),
    ))
}

fn prepare_constant_of_shape(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let shape = ctx
        .const_ints(0)?
        .ok_or(Error::new(ErrorKind::MissingInput { index: 0 }))?;
    let shape: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| shape_err("ConstantOfShape: negative dim")))
        .collect::<Result<_>>()?;
    let (dt, val) = match ctx.attr_tensor("value")? {
        Some(c) => {
            let mut v = [0u8; 8];
            let es = c.dtype.size();
            let b = c
                .data
                .bytes()
                .get(..es)
                .ok_or(attr_err("value", "empty tensor"))?;
            v.get_mut(..es)
                .ok_or(Error::internal("ConstantOfShape value width"))?
                .copy_from_slice(b);
            (c.dtype, v)
        }
        None => (DType::F32, [0u8; 8]),
    };
    let es = dt.size();
    Ok(Prepared::single(
        dt,
        &shape,
        kernel("ConstantOfShape", move |io: &mut KernelIo<'_>| {
            let val = val
                .get(..es)
                .ok_or(Error::internal("ConstantOfShape value width"))?;
            let mut y = io.output(0)?;
            for c in y.bytes_mut().chunks_of_mut(es) {
                c.copy_from_slice(val);
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------------------
// Where, comparisons, Not.

fn prepare_where(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let c = ctx.input_of(0, DType::Bool)?;
    let x = ctx.input(1)?;
    let y = ctx.input(2)?;
    if x.dtype != y.dtype {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: x.dtype,
            got: y.dtype,
        }));
    }
    let mut t = [0usize; MAX_RANK];
    let r1 = broadcast_shapes(x.shape, y.shape, &mut t)?;
    let mut o = [0usize; MAX_RANK];
    let bad = || Error::internal("where rank");
    let r = broadcast_shapes(c.shape, t.get(..r1).ok_or_else(bad)?, &mut o)?;
    let out: Vec<usize> = o.get(..r).ok_or_else(bad)?.to_vec();
    let strides = [
        broadcast_strides(c.shape, &out),
        broadcast_strides(x.shape, &out),
        broadcast_strides(y.shape, &out),
    ];
    let es = x.dtype.size();
    // x and y's bytes checked: each index StridedIter yields for them is
    // below its element count, so the byte ranges below are exact.
    for s in [x.shape, y.shape] {
        checked_numel(s)?
            .checked_mul(es)
            .ok_or(Error::new(ErrorKind::Overflow))?;
    }
    let shape_c = out.clone();
    Ok(Prepared::single(
        x.dtype,
        &out,
        kernel("Where", move |io: &mut KernelIo<'_>| {
            let bad = || Error::internal("where range");
            let cb = io.input(0)?.bytes();
            let xb = io.input(1)?.bytes();
            let yb = io.input(2)?.bytes();
            let mut out = io.output(0)?;
            let dst = out.bytes_mut();
            for (d, [ic, ix, iy]) in dst
                .chunks_of_mut(es)
                .zip(StridedIter::new(&shape_c, strides))
            {
                let (b, i) = if *cb.get(ic).ok_or_else(bad)? != 0 {
                    (xb, ix)
                } else {
                    (yb, iy)
                };
                let at = i.wrapping_mul(es);
                let src = b.get(at..at.wrapping_add(es));
                copy_exact(d, src.ok_or_else(bad)?)?;
            }
            Ok(())
        }),
    ))
}

fn cmp_typed<T: Element + PartialOrd>(
    a: &[usize],
    b: &[usize],
    name: &'static str,
    f: fn(T, T) -> bool,
) -> Result<Prepared> {
    let mut o = [0usize; MAX_RANK];
    let r = broadcast_shapes(a, b, &mut o)?;
    let out: Vec<usize> = o.get(..r).ok_or(Error::internal("compare rank"))?.to_vec();
    let strides = [broadcast_strides(a, &out), broadcast_strides(b, &out)];
    let shape_c = out.clone();
    Ok(Prepared::single(
        DType::Bool,
        &out,
        kernel(name, move |io: &mut KernelIo<'_>| {
            let bad = || Error::internal("compare range");
            let xa = io.input(0)?.as_slice::<T>()?;
            let xb = io.input(1)?.as_slice::<T>()?;
            let mut y = io.output(0)?;
            for (d, [ia, ib]) in y
                .bytes_mut()
                .iter_mut()
                .zip(StridedIter::new(&shape_c, strides))
            {
                *d = f(*xa.get(ia).ok_or_else(bad)?, *xb.get(ib).ok_or_else(bad)?) as u8;
            }
            Ok(())
        }),
    ))
}

#[derive(Clone, Copy)]
enum Cmp {
    Eq,
    Lt,
    Gt,
    Le,
    Ge,
}

macro_rules! cmp_fn {
    ($c:expr, $t:ty) => {
        match $c {
            Cmp::Eq => (|a: $t, b: $t| a == b) as fn($t, $t) -> bool,
            Cmp::Lt => |a: $t, b: $t| a < b,
            Cmp::Gt => |a: $t, b: $t| a > b,
            Cmp::Le => |a: $t, b: $t| a <= b,
            Cmp::Ge => |a: $t, b: $t| a >= b,
        }
    };
}

fn prepare_cmp(ctx: &PrepareCtx<'_>, name: &'static str, c: Cmp) -> Result<Prepared> {
    let a = ctx.input(0)?;
    let b = ctx.input(1)?;
    if a.dtype != b.dtype {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: a.dtype,
            got: b.dtype,
        }));
    }
    let (sa, sb) = (a.shape, b.shape);
    match a.dtype {
        DType::F32 => cmp_typed::<f32>(sa, sb, name, cmp_fn!(c, f32)),
        DType::F64 => cmp_typed::<f64>(sa, sb, name, cmp_fn!(c, f64)),
        DType::I8 => cmp_typed::<i8>(sa, sb, name, cmp_fn!(c, i8)),
        DType::U8 | DType::Bool => cmp_typed::<u8>(sa, sb, name, cmp_fn!(c, u8)),
        DType::I16 => cmp_typed::<i16>(sa, sb, name, cmp_fn!(c, i16)),
        DType::U16 => cmp_typed::<u16>(sa, sb, name, cmp_fn!(c, u16)),
        DType::I32 => cmp_typed::<i32>(sa, sb, name, cmp_fn!(c, i32)),
        DType::U32 => cmp_typed::<u32>(sa, sb, name, cmp_fn!(c, u32)),
        DType::I64 => cmp_typed::<i64>(sa, sb, name, cmp_fn!(c, i64)),
        DType::U64 => cmp_typed::<u64>(sa, sb, name, cmp_fn!(c, u64)),
        DType::F16 => cmp_typed::<half::f16>(sa, sb, name, cmp_fn!(c, half::f16)),
        DType::BF16 => cmp_typed::<half::bf16>(sa, sb, name, cmp_fn!(c, half::bf16)),
        dt => Err(Error::new(ErrorKind::UnsupportedDType {
            what: name,
            code: dt.onnx_code(),
        })),
    }
}

fn prepare_equal(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_cmp(ctx, "Equal", Cmp::Eq)
}
fn prepare_less(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_cmp(ctx, "Less", Cmp::Lt)
}
fn prepare_greater(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_cmp(ctx, "Greater", Cmp::Gt)
}
fn prepare_less_equal(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_cmp(ctx, "LessOrEqual", Cmp::Le)
}
fn prepare_greater_equal(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_cmp(ctx, "GreaterOrEqual", Cmp::Ge)
}

fn prepare_not(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input_of(0, DType::Bool)?;
    Ok(Prepared::single(
        DType::Bool,
        x.shape,
        kernel("Not", move |io: &mut KernelIo<'_>| {
            let src = io.input(0)?.bytes();
            let mut y = io.output(0)?;
            for (o, &i) in y.bytes_mut().iter_mut().zip(src) {
                *o = (i == 0) as u8;
            }
            Ok(())
        }),
    ))
}

#[cfg(test)]
#[allow(clippy::cloned_ref_to_slice_refs)]
mod tests {
    use crate::model::{AttrValue, Const};
    use crate::ops::testing::{run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;
    use half::f16;

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }
    fn iv(v: &[i64]) -> Option<Const> {
        t::<i64>(&[v.len()], v)
    }
    fn seq(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32).collect()
    }

    #[test]
    fn reshape_zero_and_minus_one() {
        let r = run(
            "Reshape",
            13,
            vec![],
            &[t(&[2, 3, 4], &seq(24)), iv(&[0, -1])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 12]);
        assert_eq!(vals::<f32>(&r[0]), seq(24));
        let r = run(
            "Reshape",
            14,
            vec![("allowzero", AttrValue::Int(1))],
            &[t::<f32>(&[0, 3], &[]), iv(&[3, 0])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![3, 0]);
        assert!(run(
            "Reshape",
            13,
            vec![],
            &[t(&[2, 3], &seq(6)), iv(&[4, 2])],
            1
        )
        .is_err());
    }

    #[test]
    fn flatten_axes() {
        let r = run(
            "Flatten",
            13,
            vec![("axis", AttrValue::Int(-1))],
            &[t(&[2, 3, 4], &seq(24))],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![6, 4]);
        let r = run(
            "Flatten",
            13,
            vec![("axis", AttrValue::Int(0))],
            &[t(&[2, 3], &seq(6))],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 6]);
    }

    #[test]
    fn squeeze_unsqueeze_both_forms() {
        let x = t(&[1, 3, 1, 2], &seq(6));
        let r = run(
            "Squeeze",
            11,
            vec![("axes", ints(&[0, -2]))],
            &[x.clone()],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![3, 2]);
        let r = run("Squeeze", 13, vec![], &[x.clone(), iv(&[2])], 1).unwrap();
        assert_eq!(r[0].shape, vec![1, 3, 2]);
        let r = run("Squeeze", 13, vec![], &[x.clone()], 1).unwrap();
        assert_eq!(r[0].shape, vec![3, 2]);
        assert!(run("Squeeze", 13, vec![], &[x, iv(&[1])], 1).is_err());
        let y = t(&[3, 2], &seq(6));
        let r = run(
            "Unsqueeze",
            11,
            vec![("axes", ints(&[0, -1]))],
            &[y.clone()],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 3, 2, 1]);
        let r = run("Unsqueeze", 13, vec![], &[y, iv(&[1])], 1).unwrap();
        assert_eq!(r[0].shape, vec![3, 1, 2]);
    }

    #[test]
    fn shape_size_identity() {
        let x = t(&[2, 3, 4], &seq(24));
        let r = run(
            "Shape",
            15,
            vec![("start", AttrValue::Int(1))],
            &[x.clone()],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![3, 4]);
        let r = run("Shape", 13, vec![], &[x.clone()], 1).unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![2, 3, 4]);
        let r = run("Size", 13, vec![], &[x.clone()], 1).unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![24]);
        let r = run("Identity", 13, vec![], &[x.clone()], 1).unwrap();
        assert_eq!(vals::<f32>(&r[0]), seq(24));
        let r = run("Dropout", 13, vec![], &[x], 2).unwrap();
        assert_eq!(vals::<f32>(&r[0]), seq(24));
        assert_eq!(r[1].dtype, crate::DType::Bool);
        assert!(r[1].data.bytes().iter().all(|&b| b == 1));
    }

    #[test]
    fn transpose_3d() {
        let r = run(
            "Transpose",
            13,
            vec![("perm", ints(&[2, 0, 1]))],
            &[t(&[2, 3, 4], &seq(24))],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![4, 2, 3]);
        let v = vals::<f32>(&r[0]);
        for k in 0..4 {
            for i in 0..2 {
                for j in 0..3 {
                    assert_eq!(v[k * 6 + i * 3 + j], (i * 12 + j * 4 + k) as f32);
                }
            }
        }
        let r = run(
            "Transpose",
            13,
            vec![],
            &[t::<i64>(&[2, 3], &[1, 2, 3, 4, 5, 6])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![1, 4, 2, 5, 3, 6]);
    }

    #[test]
    fn concat_axis1_with_empty() {
        let a = t::<i32>(&[2, 1], &[1, 2]);
        let b = t::<i32>(&[2, 2], &[3, 4, 5, 6]);
        let e = t::<i32>(&[2, 0], &[]);
        let r = run(
            "Concat",
            13,
            vec![("axis", AttrValue::Int(1))],
            &[a, e, b],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 3]);
        assert_eq!(vals::<i32>(&r[0]), vec![1, 3, 4, 2, 5, 6]);
    }

    #[test]
    fn split_uneven() {
        let x = t(&[2, 5], &seq(10));
        let r = run(
            "Split",
            13,
            vec![("axis", AttrValue::Int(1))],
            &[x.clone(), iv(&[2, 3])],
            2,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![0., 1., 5., 6.]);
        assert_eq!(vals::<f32>(&r[1]), vec![2., 3., 4., 7., 8., 9.]);
        let r = run(
            "Split",
            18,
            vec![
                ("axis", AttrValue::Int(1)),
                ("num_outputs", AttrValue::Int(2)),
            ],
            &[x.clone()],
            2,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 3]);
        assert_eq!(r[1].shape, vec![2, 2]);
        assert_eq!(vals::<f32>(&r[1]), vec![3., 4., 8., 9.]);
        let r = run("Split", 11, vec![("axis", AttrValue::Int(0))], &[x], 2).unwrap();
        assert_eq!(vals::<f32>(&r[1]), vec![5., 6., 7., 8., 9.]);
    }

    #[test]
    fn slice_negative_step_and_clamp() {
        let x = t(&[2, 4], &seq(8));
        let r = run(
            "Slice",
            13,
            vec![],
            &[x.clone(), iv(&[-1]), iv(&[i64::MIN]), iv(&[1]), iv(&[-2])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 2]);
        assert_eq!(vals::<f32>(&r[0]), vec![3., 1., 7., 5.]);
        let r = run(
            "Slice",
            13,
            vec![],
            &[x.clone(), iv(&[1, 1]), iv(&[i64::MAX, 3])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![5., 6.]);
        let r = run(
            "Slice",
            9,
            vec![
                ("starts", ints(&[0])),
                ("ends", ints(&[-1])),
                ("axes", ints(&[1])),
            ],
            &[x],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![0., 1., 2., 4., 5., 6.]);
    }

    #[test]
    fn gather_negative_and_out_of_range() {
        let x = t(&[3, 2], &seq(6));
        let r = run(
            "Gather",
            13,
            vec![],
            &[x.clone(), t::<i64>(&[2], &[-1, 0])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 2]);
        assert_eq!(vals::<f32>(&r[0]), vec![4., 5., 0., 1.]);
        let r = run(
            "Gather",
            13,
            vec![("axis", AttrValue::Int(1))],
            &[x.clone(), t::<i32>(&[], &[1])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![1., 3., 5.]);
        assert!(run("Gather", 13, vec![], &[x, t::<i64>(&[1], &[3])], 1).is_err());
    }

    #[test]
    fn pad_modes() {
        let x = t(&[3], &[1f32, 2., 3.]);
        let p = |mode: &str| {
            let r = run(
                "Pad",
                13,
                vec![("mode", AttrValue::Str(mode.into()))],
                &[x.clone(), iv(&[2, 2])],
                1,
            )
            .unwrap();
            vals::<f32>(&r[0])
        };
        assert_eq!(p("reflect"), vec![3., 2., 1., 2., 3., 2., 1.]);
        assert_eq!(p("edge"), vec![1., 1., 1., 2., 3., 3., 3.]);
        assert_eq!(p("wrap"), vec![2., 3., 1., 2., 3., 1., 2.]);
        let r = run(
            "Pad",
            13,
            vec![],
            &[x.clone(), iv(&[1, -1]), t::<f32>(&[], &[9.])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![9., 1., 2.]);
        let r = run(
            "Pad",
            2,
            vec![
                ("pads", ints(&[0, 1, 0, 1])),
                ("value", AttrValue::Float(7.)),
            ],
            &[t(&[1, 2], &[1f32, 2.])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![7., 1., 2., 7.]);
    }

    #[test]
    fn bit_cast_reinterprets_bytes() {
        let x = t(&[2], &[1.0f32, -2.0]);
        let r = run("BitCast", 26, vec![("to", AttrValue::Int(6))], &[x], 1).unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![0x3f80_0000, 0xc000_0000u32 as i32]);
        let x = t(&[3], &[0u8, 2, 1]);
        let r = run("BitCast", 26, vec![("to", AttrValue::Int(9))], &[x], 1).unwrap();
        assert_eq!(r[0].data.bytes(), &[0, 1, 1]);
        let x = t(&[1], &[1.0f32]);
        assert!(run("BitCast", 26, vec![("to", AttrValue::Int(11))], &[x], 1).is_err());
    }

    #[test]
    fn cast_like_takes_the_dtype_of_input_1() {
        let x = t(&[3], &[1.5f32, -2.5, 3.0]);
        let like = t::<i32>(&[1], &[0]);
        let r = run("CastLike", 15, vec![], &[x, like], 1).unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![1, -2, 3]);
    }

    #[test]
    fn cast_variants() {
        let x = t(&[5], &[1.7f32, -1.7, 0.0, 300.0, -0.0]);
        let r = run("Cast", 13, vec![("to", AttrValue::Int(7))], &[x.clone()], 1).unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![1, -1, 0, 300, 0]);
        let r = run(
            "Cast",
            13,
            vec![("to", AttrValue::Int(10))],
            &[x.clone()],
            1,
        )
        .unwrap();
        let h: Vec<f32> = vals::<f16>(&r[0]).iter().map(|v| v.to_f32()).collect();
        assert_eq!(
            h,
            vec![
                f16::from_f32(1.7).to_f32(),
                f16::from_f32(-1.7).to_f32(),
                0.0,
                300.0,
                0.0
            ]
        );
        let r = run("Cast", 13, vec![("to", AttrValue::Int(9))], &[x.clone()], 1).unwrap();
        assert_eq!(r[0].data.bytes(), &[1, 1, 0, 1, 0]);
        let r = run("Cast", 13, vec![("to", AttrValue::Int(2))], &[x], 1).unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![1, 255, 0, 44, 0]);
        let r = run(
            "Cast",
            13,
            vec![("to", AttrValue::Int(1))],
            &[t::<i64>(&[2], &[-3, 5])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![-3., 5.]);
        let r = run(
            "Cast",
            13,
            vec![("to", AttrValue::Int(6))],
            &[t::<i64>(&[2], &[(1i64 << 32) + 7, -1])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![7, -1]);
        let r = run(
            "Cast",
            13,
            vec![("to", AttrValue::Int(16))],
            &[t(&[1], &[1.5f32])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<half::bf16>(&r[0])[0].to_f32(), 1.5);
        let r = run(
            "Cast",
            13,
            vec![("to", AttrValue::Int(1))],
            &[t(&[1], &[f16::from_f32(2.5)])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![2.5]);
    }

    #[test]
    fn cast_low_precision_types() {
        let cast = |x: &Option<crate::model::Const>, to: i64, sat: i64| {
            let a = vec![
                ("to", AttrValue::Int(to)),
                ("saturate", AttrValue::Int(sat)),
            ];
            run("Cast", 19, a, &[x.clone()], 1).unwrap().remove(0)
        };
        // E4M3FN: 1 = 0x38, 500 overflows to NaN (0x7F) or saturates to
        // 448 (0x7E); E5M2 rounds 500 to 512 (0x60) and overflows to
        // infinity (0x7C).
        let x = t(&[3], &[1f32, 500.0, -1e6]);
        assert_eq!(cast(&x, 17, 1).data.bytes(), &[0x38, 0x7E, 0xFE]);
        assert_eq!(cast(&x, 17, 0).data.bytes(), &[0x38, 0x7F, 0xFF]);
        assert_eq!(cast(&x, 19, 0).data.bytes(), &[0x3C, 0x60, 0xFC]);
        // Back: E4M3FN 0xFE = -448.
        let f8 = cast(&x, 17, 1);
        let back = run("Cast", 19, vec![("to", AttrValue::Int(1))], &[Some(f8)], 1).unwrap();
        assert_eq!(vals::<f32>(&back[0]), vec![1.0, 448.0, -448.0]);
        // INT4 from floats truncates and zeroes what is out of range; from
        // ints it wraps.
        let x = t(&[4], &[-8.7f32, 7.9, 8.0, -9.0]);
        assert_eq!(cast(&x, 22, 1).data.bytes(), &[0xF8, 7, 0, 0]);
        let x = t(&[3], &[9i8, -9, 17]);
        assert_eq!(cast(&x, 22, 1).data.bytes(), &[0xF9, 7, 1]);
        assert_eq!(cast(&x, 21, 1).data.bytes(), &[9, 7, 1]);
    }

    #[test]
    fn range_and_constant_of_shape() {
        let r = run(
            "Range",
            11,
            vec![],
            &[
                t::<f32>(&[], &[1.]),
                t::<f32>(&[], &[2.]),
                t::<f32>(&[], &[0.3]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![4]);
        let r = run(
            "Range",
            11,
            vec![],
            &[
                t::<i64>(&[], &[10]),
                t::<i64>(&[], &[4]),
                t::<i64>(&[], &[-3]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![10, 7]);
        let r = run(
            "Range",
            11,
            vec![],
            &[
                t::<i32>(&[], &[0]),
                t::<i32>(&[], &[-1]),
                t::<i32>(&[], &[1]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![0]);
        let v = Const::from_slice::<i64>(&[1], &[5]).unwrap();
        let r = run(
            "ConstantOfShape",
            9,
            vec![("value", AttrValue::Tensor(v))],
            &[iv(&[2, 2])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![5; 4]);
    }

    #[test]
    fn expand_and_tile() {
        let r = run(
            "Expand",
            13,
            vec![],
            &[t(&[3, 1], &[1f32, 2., 3.]), iv(&[2, 1, 2])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 3, 2]);
        assert_eq!(
            vals::<f32>(&r[0]),
            vec![1., 1., 2., 2., 3., 3., 1., 1., 2., 2., 3., 3.]
        );
        let r = run(
            "Tile",
            13,
            vec![],
            &[t::<i32>(&[2, 2], &[1, 2, 3, 4]), iv(&[1, 2])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![1, 2, 1, 2, 3, 4, 3, 4]);
    }

    #[test]
    fn where_compare_not() {
        let c = Const {
            dtype: crate::DType::Bool,
            shape: vec![2],
            data: crate::model::ConstData::from_bytes(&[1, 0]).unwrap(),
        };
        let r = run(
            "Where",
            16,
            vec![],
            &[Some(c), t(&[2, 1], &[1f32, 2.]), t(&[], &[0f32])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![1., 0., 2., 0.]);
        let r = run(
            "Less",
            13,
            vec![],
            &[t::<i64>(&[3], &[1, 5, 3]), t::<i64>(&[], &[3])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].data.bytes(), &[1, 0, 0]);
        let r = run(
            "Equal",
            13,
            vec![],
            &[t(&[3], &[1f32, 5., 3.]), t(&[], &[3f32])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].data.bytes(), &[0, 0, 1]);
        let r = run("Not", 1, vec![], &[Some(r[0].clone())], 1).unwrap();
        assert_eq!(r[0].data.bytes(), &[1, 1, 0]);
    }
}
