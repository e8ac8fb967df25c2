//! Operators whose output shape depends on input *values*: NonZero,
//! Compress, Unique, NonMaxSuppression.
//!
//! mote fixes every buffer before the first run, so these plan their
//! outputs at an upper bound computed from input shapes (every element
//! non-zero, every box selected, ...) and report the real shape at run
//! time through [`KernelIo::set_output_shape`] ([`Prepared::dynamic_shapes`]).
//! The data is the row-major prefix of the planned buffer. Such an output
//! may only be a graph output (the plan refuses one that feeds another op);
//! when every input is a constant the op is folded at build time and its
//! shape is exact.

use alloc::vec;
use alloc::vec::Vec;
use core::cmp::Ordering;
use core::num::NonZeroUsize;

use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::ops::{kernel, util, KernelIo, OpDef, OutputInfo, PrepareCtx, Prepared};
use crate::tensor::TensorView;
use crate::DType;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("NonZero", 9, prepare_non_zero),
    OpDef::onnx("Compress", 9, prepare_compress),
    OpDef::onnx("Unique", 11, prepare_unique),
    OpDef::onnx("NonMaxSuppression", 10, prepare_nms),
];

/// Element `i` of `v` is non-zero (NaN counts as non-zero, -0.0 as zero).
fn nonzero_at(v: &TensorView<'_>, i: usize) -> bool {
    if v.dtype().is_float() {
        v.f64_at(i).is_some_and(|x| x != 0.0)
    } else {
        let s = v.dtype().size();
        util::row(v.bytes(), i, s).is_ok_and(|b| b.iter().any(|&x| x != 0))
    }
}

/// Total order of two elements of `v` (numpy's sort order: NaN last).
fn cmp_at(v: &TensorView<'_>, a: usize, b: usize) -> Ordering {
    match v.dtype() {
        DType::U64 => {
            let s = 8;
            let get = |i: usize| {
                util::row(v.bytes(), i, s)
                    .ok()
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u64::from_le_bytes)
            };
            get(a).cmp(&get(b))
        }
        dt if dt.is_float() => {
            let (x, y) = (v.f64_at(a).unwrap_or(0.0), v.f64_at(b).unwrap_or(0.0));
            match (x.is_nan(), y.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                _ => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
            }
        }
        _ => v.int_at(a).cmp(&v.int_at(b)),
    }
}

/// (outer, length, inner) of `shape` split at axis `a` (checked by
/// `util::axis`).
fn split_axis(shape: &[usize], a: usize) -> Result<(usize, usize, usize)> {
    let (head, tail) = shape
        .split_at_checked(a)
        .ok_or(Error::internal("axis split"))?;
    let (&len, rest) = tail.split_first().ok_or(Error::internal("axis split"))?;
    Ok((head.iter().product(), len, rest.iter().product()))
}

/// `base` with axis `a` set to `k`, the run-time shape of a selection, in
/// `buf`.
fn with_axis<'b>(buf: &'b mut [usize], base: &[usize], a: usize, k: usize) -> Result<&'b [usize]> {
    let dims = buf
        .get_mut(..base.len())
        .ok_or(Error::internal("output rank"))?;
    dims.copy_from_slice(base);
    *dims.get_mut(a).ok_or(Error::internal("output axis"))? = k;
    Ok(dims)
}

fn scratch_words(bytes: &mut [u8]) -> Result<&mut [usize]> {
    bytemuck::try_cast_slice_mut(bytes).map_err(|_| Error::internal("scratch alignment"))
}

// ---------------------------------------------------------------------------

fn prepare_non_zero(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let rank = x.shape.len();
    let n = checked_numel(x.shape)?;
    let shape: Vec<usize> = x.shape.into();
    Ok(Prepared::single(
        DType::I64,
        &[rank, n],
        kernel("NonZero", move |io: &mut KernelIo<'_>| {
            let x = io.input(0)?;
            let nnz = (0..n).filter(|&i| nonzero_at(&x, i)).count();
            let y = io.output_slice::<i64>(0)?;
            for (j, i) in (0..n).filter(|&i| nonzero_at(&x, i)).enumerate() {
                // Row r of the output holds coordinate r of each hit.
                let mut rem = i;
                for (r, &d) in shape.iter().enumerate().rev() {
                    let d = NonZeroUsize::new(d).unwrap_or(NonZeroUsize::MIN);
                    // r < rank, j < nnz: inside the [rank, nnz] output.
                    *y.get_mut(r.saturating_mul(nnz).saturating_add(j))
                        .ok_or(Error::internal("NonZero out"))? = (rem % d) as i64;
                    rem /= d;
                }
            }
            io.set_output_shape(0, &[rank, nnz])
        }),
    )
    .dynamic_shapes())
}

// ---------------------------------------------------------------------------

fn prepare_compress(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let c = ctx.input_of(1, DType::Bool)?;
    let &[clen] = c.shape else {
        return Err(Error::new(ErrorKind::Rank {
            expected: 1,
            got: c.shape.len(),
        }));
    };
    let es = x.dtype.size();
    // (outer, axis length, inner) of the selection; no axis: flattened.
    let (outer, len, inner, axis) = match ctx.node.attr("axis") {
        None => (1, checked_numel(x.shape)?, 1, None),
        Some(_) => {
            let a = util::axis(ctx.attr_int("axis", 0)?, x.shape.len(), "Compress axis")?;
            let (outer, len, inner) = split_axis(x.shape, a)?;
            (outer, len, inner, Some(a))
        }
    };
    let out_shape = |k: usize| -> Result<Vec<usize>> {
        match axis {
            None => Ok(vec![k]),
            Some(a) => {
                let mut s: Vec<usize> = x.shape.into();
                *s.get_mut(a).ok_or(Error::internal("Compress axis"))? = k;
                Ok(s)
            }
        }
    };
    let bound = len.min(clen);
    // A constant condition gives an exact shape: no run-time shape needed.
    let fixed = c
        .value
        .map(|v| (0..bound).filter(|&i| nonzero_at(&v, i)).count());
    let planned = out_shape(fixed.unwrap_or(bound))?;
    let axis_pos = axis.unwrap_or(0);
    let base: Vec<usize> = planned.clone();
    let p = Prepared::single(
        x.dtype,
        &planned,
        kernel("Compress", move |io: &mut KernelIo<'_>| {
            let x = io.input(0)?.bytes();
            let c = io.input(1)?.bytes();
            let k = (0..bound).filter(|&i| c.get(i) == Some(&1)).count();
            let mut out = io.output(0)?;
            let y = out.bytes_mut();
            // Blocks of `inner` elements: block w of the output is block
            // o * len + j of the input.
            let blk = inner.saturating_mul(es);
            let mut w = 0usize;
            for o in 0..outer {
                for j in (0..bound).filter(|&i| c.get(i) == Some(&1)) {
                    let src = o.saturating_mul(len).saturating_add(j);
                    util::row_mut(y, w, blk)?.copy_from_slice(util::row(x, src, blk)?);
                    w = w.saturating_add(1);
                }
            }
            if fixed.is_none() {
                let mut s = [0usize; crate::tensor::MAX_RANK];
                io.set_output_shape(0, with_axis(&mut s, &base, axis_pos, k)?)?;
            }
            Ok(())
        }),
    );
    Ok(if fixed.is_none() {
        p.dynamic_shapes()
    } else {
        p
    })
}

// ---------------------------------------------------------------------------

/// Unique over `n` items (elements, or slices along an axis) of `x`.
#[derive(Clone, Copy, Debug)]
struct UniqueGeom {
    outer: usize,
    n: usize,
    inner: usize,
}

impl UniqueGeom {
    /// Element index of (outer o, item j, inner i).
    fn at(&self, o: usize, j: usize, i: usize) -> usize {
        // Past the input (saturated), a lookup miss.
        o.saturating_mul(self.n)
            .saturating_add(j)
            .saturating_mul(self.inner)
            .saturating_add(i)
    }
    fn cmp(&self, x: &TensorView<'_>, a: usize, b: usize) -> Ordering {
        for o in 0..self.outer {
            for i in 0..self.inner {
                let c = cmp_at(x, self.at(o, a, i), self.at(o, b, i));
                if c != Ordering::Equal {
                    return c;
                }
            }
        }
        Ordering::Equal
    }
}

fn prepare_unique(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let sorted = ctx.attr_int("sorted", 1)? != 0;
    let numel = checked_numel(x.shape)?;
    let (g, axis) = match ctx.node.attr("axis") {
        None => (
            UniqueGeom {
                outer: 1,
                n: numel,
                inner: 1,
            },
            None,
        ),
        Some(_) => {
            let a = util::axis(ctx.attr_int("axis", 0)?, x.shape.len(), "Unique axis")?;
            let (outer, n, inner) = split_axis(x.shape, a)?;
            (UniqueGeom { outer, n, inner }, Some(a))
        }
    };
    let y_shape: Vec<usize> = match axis {
        None => vec![g.n],
        Some(a) => {
            let mut s: Vec<usize> = x.shape.into();
            *s.get_mut(a).ok_or(Error::internal("Unique axis"))? = g.n;
            s
        }
    };
    let outputs = vec![
        OutputInfo::new(x.dtype, &y_shape),
        OutputInfo::new(DType::I64, &[g.n]),
        OutputInfo::new(DType::I64, &[g.n]),
        OutputInfo::new(DType::I64, &[g.n]),
    ];
    let es = x.dtype.size();
    let axis_pos = axis.unwrap_or(0);
    let has: [bool; 4] = [0, 1, 2, 3].map(|i| ctx.has_output(i));
    let words =
        g.n.checked_add(1)
            .and_then(|n| n.checked_mul(core::mem::size_of::<usize>()))
            .ok_or(Error::new(ErrorKind::Overflow))?;
    Ok(Prepared::new(
        outputs,
        kernel("Unique", move |io: &mut KernelIo<'_>| {
            let x = io.input(0)?;
            // Scratch: first[0..k] = first occurrence of each distinct item.
            let mut k = 0;
            {
                let first = scratch_words(io.scratch()?)?;
                for j in 0..g.n {
                    let seen = first.get(..k).ok_or(Error::internal("Unique scratch"))?;
                    if !seen.iter().any(|&f| g.cmp(&x, f, j) == Ordering::Equal) {
                        *first.get_mut(k).ok_or(Error::internal("Unique scratch"))? = j;
                        k = k.saturating_add(1);
                    }
                }
                if sorted {
                    first
                        .get_mut(..k)
                        .ok_or(Error::internal("Unique scratch"))?
                        .sort_unstable_by(|&a, &b| g.cmp(&x, a, b));
                }
            }
            let xb = x.bytes();
            if has[0] {
                let (mut y, s) = io.output_and_scratch(0)?;
                let first = scratch_words(s)?;
                let first = first.get(..k).ok_or(Error::internal("Unique scratch"))?;
                let y = y.bytes_mut();
                // Blocks of `inner` elements: output block w is input
                // block o * n + f.
                let len = g.inner.saturating_mul(es);
                let mut w = 0usize;
                for o in 0..g.outer {
                    for &f in first {
                        let src = o.saturating_mul(g.n).saturating_add(f);
                        util::row_mut(y, w, len)?.copy_from_slice(util::row(xb, src, len)?);
                        w = w.saturating_add(1);
                    }
                }
                let mut sh = [0usize; crate::tensor::MAX_RANK];
                io.set_output_shape(0, with_axis(&mut sh, &y_shape, axis_pos, k)?)?;
            }
            for (out, &h) in has.iter().enumerate().skip(1) {
                if !h {
                    continue;
                }
                let (mut y, s) = io.output_and_scratch(out)?;
                let first = scratch_words(s)?;
                let first = first.get(..k).ok_or(Error::internal("Unique scratch"))?;
                let y = y.as_slice_mut::<i64>()?;
                match out {
                    1 => {
                        for (d, &f) in y.iter_mut().zip(first) {
                            *d = f as i64;
                        }
                    }
                    2 => {
                        for (j, d) in y.iter_mut().enumerate().take(g.n) {
                            let u = first
                                .iter()
                                .position(|&f| g.cmp(&x, f, j) == Ordering::Equal)
                                .ok_or(Error::internal("Unique inverse"))?;
                            *d = u as i64;
                        }
                    }
                    _ => {
                        for (d, &f) in y.iter_mut().zip(first) {
                            let c = (0..g.n)
                                .filter(|&j| g.cmp(&x, f, j) == Ordering::Equal)
                                .count();
                            *d = c as i64;
                        }
                    }
                }
                io.set_output_shape(out, &[if out == 2 { g.n } else { k }])?;
            }
            Ok(())
        }),
    )
    .with_scratch(words)
    .dynamic_shapes())
}

// ---------------------------------------------------------------------------

fn prepare_nms(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let boxes = ctx.input_of(0, DType::F32)?;
    let scores = ctx.input_of(1, DType::F32)?;
    let (&[nb, nbox, four], &[sb, nc, sn]) = (boxes.shape, scores.shape) else {
        return Err(Error::new(ErrorKind::Shape(
            "NonMaxSuppression: boxes [B, N, 4] and scores [B, C, N]",
        )));
    };
    if four != 4 || sb != nb || sn != nbox {
        return Err(Error::new(ErrorKind::Shape(
            "NonMaxSuppression: boxes [B, N, 4] and scores [B, C, N]",
        )));
    }
    let center = ctx.attr_int("center_point_box", 0)? != 0;
    // Upper bound: every box of every class, or the constant cap.
    let cap = match ctx.opt_input(2).and_then(|i| i.value) {
        Some(v) => v.int_at(0).unwrap_or(0).max(0) as usize,
        None => nbox,
    };
    let bound = nb
        .checked_mul(nc)
        .and_then(|x| x.checked_mul(cap.min(nbox)))
        .ok_or(Error::new(ErrorKind::Overflow))?;
    let words = nbox
        .checked_mul(2)
        .and_then(|n| n.checked_mul(core::mem::size_of::<usize>()))
        .ok_or(Error::new(ErrorKind::Overflow))?;
    Ok(Prepared::single(
        DType::I64,
        &[bound, 3],
        kernel("NonMaxSuppression", move |io: &mut KernelIo<'_>| {
            let boxes = io.input_slice::<f32>(0)?;
            let scores = io.input_slice::<f32>(1)?;
            let max_out = match io.opt_input(2)? {
                Some(v) if v.numel() > 0 => v.int_at(0).unwrap_or(0).max(0) as usize,
                _ => 0,
            };
            let iou_t = match io.opt_input(3)? {
                Some(v) if v.numel() > 0 => v.f64_at(0).unwrap_or(0.0) as f32,
                _ => 0.0,
            };
            let score_t = match io.opt_input(4)? {
                Some(v) if v.numel() > 0 => Some(v.f64_at(0).unwrap_or(0.0) as f32),
                _ => None,
            };
            let max_out = max_out.min(cap).min(nbox);
            let (mut y, s) = io.output_and_scratch(0)?;
            let y = y.as_slice_mut::<i64>()?;
            let s = scratch_words(s)?;
            let (cand, sel) = s
                .split_at_mut_checked(nbox)
                .ok_or(Error::internal("NMS scratch"))?;
            let mut w = 0usize;
            for b in 0..nb {
                let bx = util::row(boxes, b, nbox.saturating_mul(4))?;
                for c in 0..nc {
                    let sc = util::row(scores, b.saturating_mul(nc).saturating_add(c), nbox)?;
                    let mut n = 0usize;
                    for (i, &v) in sc.iter().enumerate() {
                        if score_t.is_none_or(|t| v > t) {
                            *cand.get_mut(n).ok_or(Error::internal("NMS candidates"))? = i;
                            n = n.saturating_add(1);
                        }
                    }
                    let cand = cand.get_mut(..n).ok_or(Error::internal("NMS candidates"))?;
                    // Highest score first; equal scores: lower index first.
                    // (Every candidate indexes `sc`: both sides are `Some`.)
                    cand.sort_unstable_by(|&a, &b| {
                        sc.get(b)
                            .partial_cmp(&sc.get(a))
                            .unwrap_or(Ordering::Equal)
                            .then(a.cmp(&b))
                    });
                    let mut k = 0usize;
                    for &i in cand.iter() {
                        if k >= max_out {
                            break;
                        }
                        let kept = sel.get(..k).ok_or(Error::internal("NMS selection"))?;
                        if kept.iter().all(|&j| !suppress(bx, i, j, center, iou_t)) {
                            *sel.get_mut(k).ok_or(Error::internal("NMS selection"))? = i;
                            k = k.saturating_add(1);
                            util::row_mut(y, w, 3)?
                                .copy_from_slice(&[b as i64, c as i64, i as i64]);
                            w = w.saturating_add(1);
                        }
                    }
                }
            }
            io.set_output_shape(0, &[w, 3])
        }),
    )
    .with_scratch(words)
    .dynamic_shapes())
}

/// Box `i` overlaps selected box `j` by more than `t` (intersection over
/// union), as the ONNX reference computes it.
fn suppress(bx: &[f32], i: usize, j: usize, center: bool, t: f32) -> bool {
    let get = |k: usize| -> [f32; 4] {
        let mut b = [0f32; 4];
        if let Ok(s) = util::row(bx, k, 4) {
            b.copy_from_slice(s);
        }
        b
    };
    // (x_min, x_max, y_min, y_max)
    let span = |b: [f32; 4]| -> (f32, f32, f32, f32) {
        if center {
            let (hw, hh) = (b[2] / 2.0, b[3] / 2.0);
            (b[0] - hw, b[0] + hw, b[1] - hh, b[1] + hh)
        } else {
            (
                b[1].min(b[3]),
                b[1].max(b[3]),
                b[0].min(b[2]),
                b[0].max(b[2]),
            )
        }
    };
    let (ax0, ax1, ay0, ay1) = span(get(i));
    let (bx0, bx1, by0, by1) = span(get(j));
    let (ix0, ix1) = (ax0.max(bx0), ax1.min(bx1));
    let (iy0, iy1) = (ay0.max(by0), ay1.min(by1));
    if ix1 <= ix0 || iy1 <= iy0 {
        return false;
    }
    let inter = (ix1 - ix0) * (iy1 - iy0);
    let a1 = (ax1 - ax0) * (ay1 - ay0);
    let a2 = (bx1 - bx0) * (by1 - by0);
    let union = a1 + a2 - inter;
    if inter <= 0.0 || a1 <= 0.0 || a2 <= 0.0 || union <= 0.0 {
        return false;
    }
    inter / union > t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Const, ConstData};
    use crate::ops::testing::{run, t, vals};

    fn bools(v: &[bool]) -> Option<Const> {
        let b: Vec<u8> = v.iter().map(|&x| x as u8).collect();
        Some(Const {
            dtype: DType::Bool,
            shape: vec![v.len()],
            data: ConstData::from_bytes(&b).unwrap(),
        })
    }

    #[test]
    fn non_zero_folds_with_exact_shape() {
        let x = t(&[2, 3], &[0f32, 1., 0., 2., -0.0, 3.]);
        let r = run("NonZero", 13, vec![], &[x], 1).unwrap();
        assert_eq!(r[0].shape, [2, 3]);
        assert_eq!(vals::<i64>(&r[0]), vec![0, 1, 1, 1, 0, 2]);
    }

    #[test]
    fn compress_with_and_without_axis() {
        let x = t(&[3, 2], &[1f32, 2., 3., 4., 5., 6.]);
        let c = bools(&[false, true, true]);
        let r = run(
            "Compress",
            11,
            vec![("axis", crate::model::AttrValue::Int(0))],
            &[x.clone(), c],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, [2, 2]);
        assert_eq!(vals::<f32>(&r[0]), vec![3., 4., 5., 6.]);
        // Flattened, condition shorter than the input.
        let c = bools(&[true, false, true]);
        let r = run("Compress", 11, vec![], &[x, c], 1).unwrap();
        assert_eq!(r[0].shape, [2]);
        assert_eq!(vals::<f32>(&r[0]), vec![1., 3.]);
    }

    #[test]
    fn unique_sorted_with_all_outputs() {
        let x = t(&[6], &[2f32, 1., 1., 3., 4., 3.]);
        let r = run("Unique", 11, vec![], &[x], 4).unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![1., 2., 3., 4.]);
        assert_eq!(vals::<i64>(&r[1]), vec![1, 0, 3, 4]);
        assert_eq!(vals::<i64>(&r[2]), vec![1, 0, 0, 2, 3, 2]);
        assert_eq!(vals::<i64>(&r[3]), vec![2, 1, 2, 1]);
    }

    #[test]
    fn nms_suppresses_overlaps() {
        // Two boxes overlapping by IoU 0.81, one apart; one class.
        let boxes = t(
            &[1, 3, 4],
            &[0f32, 0., 1., 1., 0., 0.1, 1., 1.1, 0., 10., 1., 11.],
        );
        let scores = t(&[1, 1, 3], &[0.9f32, 0.75, 0.6]);
        let r = run(
            "NonMaxSuppression",
            11,
            vec![],
            &[
                boxes,
                scores,
                t::<i64>(&[1], &[3]),
                t(&[1], &[0.5f32]),
                t(&[1], &[0.0f32]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, [2, 3]);
        assert_eq!(vals::<i64>(&r[0]), vec![0, 0, 0, 0, 0, 2]);
    }

    #[test]
    fn compress_non_zero_unique() {
        let x = t(&[3, 2], &[1f32, 2., 3., 4., 5., 6.]);
        let mut c = t(&[3], &[0u8, 1, 1]).unwrap();
        c.dtype = crate::DType::Bool;
        let r = run(
            "Compress",
            11,
            vec![("axis", crate::model::AttrValue::Int(0))],
            &[x.clone(), Some(c.clone())],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 2]);
        assert_eq!(vals::<f32>(&r[0]), vec![3., 4., 5., 6.]);
        // No axis: over the flattened input.
        let r = run("Compress", 11, vec![], &[x.clone(), Some(c)], 1).unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![2., 3.]);
        let r = run("NonZero", 13, vec![], &[t(&[2, 2], &[1i32, 0, 1, 1])], 1).unwrap();
        assert_eq!(r[0].shape, vec![2, 3]);
        assert_eq!(vals::<i64>(&r[0]), vec![0, 1, 1, 0, 0, 1]);
        let u = t(&[6], &[2f32, 1., 1., 3., 4., 3.]);
        let r = run("Unique", 11, vec![], core::slice::from_ref(&u), 4).unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![1., 2., 3., 4.]);
        assert_eq!(vals::<i64>(&r[1]), vec![1, 0, 3, 4]);
        assert_eq!(vals::<i64>(&r[2]), vec![1, 0, 0, 2, 3, 2]);
        assert_eq!(vals::<i64>(&r[3]), vec![2, 1, 2, 1]);
        let r = run(
            "Unique",
            11,
            vec![("sorted", crate::model::AttrValue::Int(0))],
            &[u],
            4,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![2., 1., 3., 4.]);
        assert_eq!(vals::<i64>(&r[1]), vec![0, 1, 3, 4]);
        assert_eq!(vals::<i64>(&r[2]), vec![0, 1, 1, 2, 3, 2]);
        assert_eq!(vals::<i64>(&r[3]), vec![1, 2, 2, 1]);
        // Rows along axis 0: [1 0 0] twice, then [2 3 4].
        let m = t(&[3, 3], &[1f32, 0., 0., 1., 0., 0., 2., 3., 4.]);
        let r = run(
            "Unique",
            11,
            vec![("axis", crate::model::AttrValue::Int(0))],
            &[m],
            4,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 3]);
        assert_eq!(vals::<i64>(&r[2]), vec![0, 0, 1]);
        assert_eq!(vals::<i64>(&r[3]), vec![2, 1]);
    }
}
