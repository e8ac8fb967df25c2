//! Reductions: ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceProd,
//! ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSumExp, ArgMax, ArgMin.
//!
//! Prepare coalesces the input shape into runs of kept / reduced axes; the
//! kernel walks the outer runs with a strided odometer and the innermost run
//! contiguously (a fold when reduced, an element-wise combine when kept).

use crate::error::{Error, ErrorKind, Result};
use crate::math;
use crate::ops::{kernel, util, OpDef, PrepareCtx, Prepared};
use crate::tensor::{StridedIter, MAX_RANK};
use crate::{DType, Element};
use alloc::vec::Vec;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("ReduceMean", 1, p_mean),
    OpDef::onnx("ReduceMean", 18, p_mean),
    OpDef::onnx("ReduceSum", 1, p_sum),
    OpDef::onnx("ReduceSum", 13, p_sum),
    OpDef::onnx("ReduceMax", 1, p_max),
    OpDef::onnx("ReduceMax", 18, p_max),
    OpDef::onnx("ReduceMin", 1, p_min),
    OpDef::onnx("ReduceMin", 18, p_min),
    OpDef::onnx("ReduceProd", 1, p_prod),
    OpDef::onnx("ReduceProd", 18, p_prod),
    OpDef::onnx("ReduceSumSquare", 1, p_sum_square),
    OpDef::onnx("ReduceSumSquare", 18, p_sum_square),
    OpDef::onnx("ReduceL1", 1, p_l1),
    OpDef::onnx("ReduceL1", 18, p_l1),
    OpDef::onnx("ReduceL2", 1, p_l2),
    OpDef::onnx("ReduceL2", 18, p_l2),
    OpDef::onnx("ReduceLogSumExp", 1, p_lse),
    OpDef::onnx("ReduceLogSumExp", 18, p_lse),
    OpDef::onnx("ArgMax", 1, p_argmax),
    OpDef::onnx("ArgMin", 1, p_argmin),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    SumSquare,
    L1,
    L2,
    LogSumExp,
}

/// The coalesced iteration of one reduction.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Coalesced input dims (rank >= 1).
    dims: [usize; MAX_RANK],
    /// Whether each coalesced dim is reduced.
    red: [bool; MAX_RANK],
    /// Contiguous input strides of the coalesced dims.
    in_strides: [usize; MAX_RANK],
    /// Output strides (0 on reduced dims).
    out_strides: [usize; MAX_RANK],
    rank: usize,
    /// Input and output element counts.
    in_len: usize,
    out_len: usize,
    /// Elements folded into each output.
    count: usize,
}

impl Plan {
    fn new(shape: &[usize], mask: &[bool]) -> Self {
        let mut dims = [1usize; MAX_RANK];
        let mut red = [false; MAX_RANK];
        let mut rank = 0usize;
        let mut count = 1usize;
        for (&d, &r) in shape.iter().zip(mask) {
            if r {
                count *= d;
            }
            if d == 1 {
                continue;
            }
            if rank > 0 && red[rank - 1] == r {
                dims[rank - 1] *= d;
            } else if rank < MAX_RANK {
                dims[rank] = d;
                red[rank] = r;
                rank += 1;
            }
        }
        if rank == 0 {
            rank = 1;
        }
        let mut in_strides = [0usize; MAX_RANK];
        let mut out_strides = [0usize; MAX_RANK];
        let (mut ai, mut ao) = (1usize, 1usize);
        for i in (0..rank).rev() {
            in_strides[i] = ai;
            ai *= dims[i];
            if !red[i] {
                out_strides[i] = ao;
                ao *= dims[i];
            }
        }
        Plan {
            dims,
            red,
            in_strides,
            out_strides,
            rank,
            in_len: ai,
            out_len: ao,
            count,
        }
    }

    /// Folds `x` into `out` (pre-filled with the identity) with
    /// `step(acc, value, out_index)`.
    #[inline]
    fn run<T: Copy>(&self, x: &[T], out: &mut [T], step: impl Fn(T, T, usize) -> T) -> Result<()> {
        if x.len() != self.in_len || out.len() != self.out_len {
            return Err(Error::new(ErrorKind::Internal("reduce sizes")));
        }
        let r = self.rank;
        let d = self.dims[r - 1];
        let last_red = self.red[r - 1];
        let it = StridedIter::new(&self.dims[..r - 1], [self.in_strides, self.out_strides]);
        if self.in_len == 0 {
            return Ok(());
        }
        for [i, o] in it {
            let xs = &x[i..i + d];
            if last_red {
                let mut acc = out[o];
                for &v in xs {
                    acc = step(acc, v, o);
                }
                out[o] = acc;
            } else {
                for (j, (ov, &v)) in out[o..o + d].iter_mut().zip(xs).enumerate() {
                    *ov = step(*ov, v, o + j);
                }
            }
        }
        Ok(())
    }
}

/// Reads axes / keepdims / noop_with_empty_axes: (mask, output shape, plan).
fn setup(ctx: &PrepareCtx<'_>, input_axes_since: i64) -> Result<(DType, Vec<usize>, Plan)> {
    let x = ctx.input(0)?;
    let shape = x.shape;
    if shape.len() > MAX_RANK {
        return Err(Error::new(ErrorKind::Unsupported("rank above 8")));
    }
    let axes: Vec<i64> = if ctx.opset >= input_axes_since {
        ctx.const_ints(1)?.unwrap_or_default()
    } else {
        ctx.attr_ints("axes")?
            .map(|a| a.to_vec())
            .unwrap_or_default()
    };
    let keep = ctx.attr_int("keepdims", 1)? != 0;
    let noop = ctx.attr_int("noop_with_empty_axes", 0)? != 0;
    let r = shape.len();
    let mut mask = alloc::vec![false; r];
    if axes.is_empty() {
        if !noop {
            mask.iter_mut().for_each(|m| *m = true);
        }
    } else {
        for &a in &axes {
            let ax = util::axis(a, r, "axes")?;
            if r == 0 {
                continue;
            }
            if mask[ax] {
                return Err(Error::new(ErrorKind::Attribute {
                    name: "axes",
                    problem: "repeated axis",
                }));
            }
            mask[ax] = true;
        }
    }
    let mut out = Vec::with_capacity(r);
    for (&d, &m) in shape.iter().zip(&mask) {
        if !m {
            out.push(d);
        } else if keep {
            out.push(1);
        }
    }
    Ok((x.dtype, out, Plan::new(shape, &mask)))
}

fn simple<T, S, F>(
    name: &'static str,
    out: &[usize],
    plan: Plan,
    init: T,
    step: S,
    fin: F,
) -> Prepared
where
    T: Element + Copy,
    S: Fn(T, T) -> T + Copy + Send + Sync + 'static,
    F: Fn(T) -> T + Copy + Send + Sync + 'static,
{
    Prepared::single(
        T::DTYPE,
        out,
        kernel(name, move |io| {
            let x = io.input_slice::<T>(0)?;
            let y = io.output_slice::<T>(0)?;
            y.fill(init);
            plan.run(x, y, |a, v, _| step(a, v))?;
            for v in y.iter_mut() {
                *v = fin(*v);
            }
            Ok(())
        }),
    )
}

#[inline]
fn fmax(a: f32, v: f32) -> f32 {
    if v > a || v.is_nan() {
        v
    } else {
        a
    }
}

#[inline]
fn fmin(a: f32, v: f32) -> f32 {
    if v < a || v.is_nan() {
        v
    } else {
        a
    }
}

fn prepare_reduce(
    ctx: &PrepareCtx<'_>,
    kind: Kind,
    name: &'static str,
    input_axes_since: i64,
) -> Result<Prepared> {
    let (dt, out, plan) = setup(ctx, input_axes_since)?;
    if dt == DType::I64 {
        return match kind {
            Kind::Sum => Ok(simple(
                name,
                &out,
                plan,
                0i64,
                |a: i64, v| a.wrapping_add(v),
                |a| a,
            )),
            Kind::Prod => Ok(simple(
                name,
                &out,
                plan,
                1i64,
                |a: i64, v| a.wrapping_mul(v),
                |a| a,
            )),
            Kind::Max => Ok(simple(
                name,
                &out,
                plan,
                i64::MIN,
                |a: i64, v| a.max(v),
                |a| a,
            )),
            Kind::Min => Ok(simple(
                name,
                &out,
                plan,
                i64::MAX,
                |a: i64, v| a.min(v),
                |a| a,
            )),
            _ => Err(Error::new(ErrorKind::UnsupportedDType {
                what: name,
                code: dt.onnx_code(),
            })),
        };
    }
    util::dtype_in(dt, &[DType::F32], name)?;
    let inv = 1.0 / plan.count as f32;
    Ok(match kind {
        Kind::Sum => simple(name, &out, plan, 0.0f32, |a, v| a + v, |a| a),
        Kind::Mean => simple(name, &out, plan, 0.0f32, |a, v| a + v, move |a| a * inv),
        Kind::Max => simple(name, &out, plan, f32::NEG_INFINITY, fmax, |a| a),
        Kind::Min => simple(name, &out, plan, f32::INFINITY, fmin, |a| a),
        Kind::Prod => simple(name, &out, plan, 1.0f32, |a, v| a * v, |a| a),
        Kind::SumSquare => simple(name, &out, plan, 0.0f32, |a, v| a + v * v, |a| a),
        Kind::L1 => simple(name, &out, plan, 0.0f32, |a, v| a + math::abs(v), |a| a),
        Kind::L2 => simple(name, &out, plan, 0.0f32, |a, v| a + v * v, math::sqrt),
        Kind::LogSumExp => {
            let n = plan.out_len;
            Prepared::single(
                DType::F32,
                &out,
                kernel(name, move |io| {
                    let x = io.input_slice::<f32>(0)?;
                    let (y, scratch) = io.output_and_scratch(0)?;
                    let y = y.into_slice::<f32>()?;
                    let m: &mut [f32] = bytemuck::try_cast_slice_mut(scratch)
                        .map_err(|_| Error::new(ErrorKind::Internal("scratch alignment")))?;
                    let m = m
                        .get_mut(..n)
                        .ok_or(Error::new(ErrorKind::Internal("scratch size")))?;
                    m.fill(f32::NEG_INFINITY);
                    plan.run(x, m, |a, v, _| fmax(a, v))?;
                    for v in m.iter_mut() {
                        if v.is_infinite() {
                            *v = 0.0;
                        }
                    }
                    y.fill(0.0);
                    let mm: &[f32] = m;
                    plan.run(x, y, |a, v, o| a + math::exp(v - mm[o]))?;
                    for (v, &s) in y.iter_mut().zip(mm) {
                        *v = math::ln(*v) + s;
                    }
                    Ok(())
                }),
            )
            .with_scratch(n * 4)
        }
    })
}

fn p_mean(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::Mean, "ReduceMean", 18)
}
fn p_sum(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::Sum, "ReduceSum", 13)
}
fn p_max(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::Max, "ReduceMax", 18)
}
fn p_min(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::Min, "ReduceMin", 18)
}
fn p_prod(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::Prod, "ReduceProd", 18)
}
fn p_sum_square(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::SumSquare, "ReduceSumSquare", 18)
}
fn p_l1(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::L1, "ReduceL1", 18)
}
fn p_l2(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::L2, "ReduceL2", 18)
}
fn p_lse(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_reduce(ctx, Kind::LogSumExp, "ReduceLogSumExp", 18)
}

fn prepare_arg(ctx: &PrepareCtx<'_>, is_max: bool, name: &'static str) -> Result<Prepared> {
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, &[DType::F32], name)?;
    let shape = x.shape;
    if shape.is_empty() {
        return Err(Error::new(ErrorKind::Rank {
            expected: 1,
            got: 0,
        }));
    }
    let axis = util::axis(ctx.attr_int("axis", 0)?, shape.len(), "axis")?;
    let keep = ctx.attr_int("keepdims", 1)? != 0;
    let last = ctx.attr_int("select_last_index", 0)? != 0;
    let outer: usize = shape[..axis].iter().product();
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    if n == 0 {
        return Err(Error::new(ErrorKind::Shape(
            "ArgMax/ArgMin over an empty axis",
        )));
    }
    let mut out: Vec<usize> = shape.to_vec();
    if keep {
        out[axis] = 1;
    } else {
        out.remove(axis);
    }
    Ok(Prepared::single(
        DType::I64,
        &out,
        kernel(name, move |io| {
            let x = io.input_slice::<f32>(0)?;
            let y = io.output_slice::<i64>(0)?;
            if x.len() != outer * n * inner || y.len() != outer * inner {
                return Err(Error::new(ErrorKind::Internal("ArgMax sizes")));
            }
            for o in 0..outer {
                for i in 0..inner {
                    let base = o * n * inner + i;
                    let mut best = x[base];
                    let mut bi = 0usize;
                    for j in 1..n {
                        let v = x[base + j * inner];
                        let better = if is_max {
                            v > best || (last && v == best)
                        } else {
                            v < best || (last && v == best)
                        };
                        if better {
                            best = v;
                            bi = j;
                        }
                    }
                    y[o * inner + i] = bi as i64;
                }
            }
            Ok(())
        }),
    ))
}

fn p_argmax(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_arg(ctx, true, "ArgMax")
}
fn p_argmin(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_arg(ctx, false, "ArgMin")
}

#[cfg(test)]
mod tests {
    use crate::math;
    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;

    use crate::ops::testing::rnd;

    /// Naive reduction over `mask` of a row-major `shape`: groups elements by
    /// output index, then applies `f` to each group.
    fn naive(shape: &[usize], x: &[f32], mask: &[bool], f: impl Fn(&[f32]) -> f32) -> Vec<f32> {
        let out_dims: Vec<usize> = shape
            .iter()
            .zip(mask)
            .map(|(&d, &m)| if m { 1 } else { d })
            .collect();
        let on: usize = out_dims.iter().product();
        let mut groups: Vec<Vec<f32>> = vec![Vec::new(); on];
        for (lin, &v) in x.iter().enumerate() {
            let mut rem = lin;
            let mut idx = vec![0; shape.len()];
            for d in (0..shape.len()).rev() {
                idx[d] = rem % shape[d];
                rem /= shape[d];
            }
            let mut o = 0;
            for d in 0..shape.len() {
                o = o * out_dims[d] + if mask[d] { 0 } else { idx[d] };
            }
            groups[o].push(v);
        }
        groups.iter().map(|g| f(g)).collect()
    }

    type RefFn = fn(&[f32]) -> f32;
    const OPS: [(&str, RefFn); 9] = [
        ("ReduceSum", |g| g.iter().sum()),
        ("ReduceMean", |g| g.iter().sum::<f32>() / g.len() as f32),
        ("ReduceMax", |g| {
            g.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        }),
        ("ReduceMin", |g| {
            g.iter().copied().fold(f32::INFINITY, f32::min)
        }),
        ("ReduceProd", |g| g.iter().product()),
        ("ReduceSumSquare", |g| g.iter().map(|v| v * v).sum()),
        ("ReduceL1", |g| g.iter().map(|v| math::abs(*v)).sum()),
        ("ReduceL2", |g| math::sqrt(g.iter().map(|v| v * v).sum())),
        ("ReduceLogSumExp", |g| {
            math::ln(g.iter().map(|v| math::exp(*v)).sum())
        }),
    ];

    #[test]
    fn reductions_axes_keepdims_opsets() {
        let shape = [2usize, 3, 4, 5];
        let x = rnd(120, 1);
        let axes_cases: Vec<Vec<i64>> = vec![
            vec![0],
            vec![1],
            vec![3],
            vec![-1],
            vec![1, 2],
            vec![0, 2],
            vec![-3, -1],
            vec![0, 1, 2, 3],
            vec![],
        ];
        for (op, f) in OPS {
            for axes in &axes_cases {
                let mut mask = vec![axes.is_empty(); 4];
                for &a in axes {
                    mask[(if a < 0 { a + 4 } else { a }) as usize] = true;
                }
                let want = naive(&shape, &x, &mask, f);
                for keep in [0i64, 1] {
                    let want_shape: Vec<usize> = shape
                        .iter()
                        .zip(&mask)
                        .filter_map(|(&d, &m)| {
                            if !m {
                                Some(d)
                            } else if keep == 1 {
                                Some(1)
                            } else {
                                None
                            }
                        })
                        .collect();
                    // Attribute form.
                    let mut attrs = vec![("keepdims", AttrValue::Int(keep))];
                    if !axes.is_empty() {
                        attrs.push(("axes", AttrValue::Ints(axes.clone())));
                    }
                    let r = run(op, 11, attrs, &[t(&shape, &x)], 1).unwrap();
                    assert_eq!(r[0].shape, want_shape, "{op} {axes:?}");
                    assert_close(&vals::<f32>(&r[0]), &want, 1e-5);
                    // Input form.
                    let ax = if axes.is_empty() {
                        None
                    } else {
                        t::<i64>(&[axes.len()], axes)
                    };
                    let r = run(
                        op,
                        18,
                        vec![("keepdims", AttrValue::Int(keep))],
                        &[t(&shape, &x), ax],
                        1,
                    )
                    .unwrap();
                    assert_eq!(r[0].shape, want_shape, "{op} {axes:?} opset 18");
                    assert_close(&vals::<f32>(&r[0]), &want, 1e-5);
                }
            }
        }
    }

    #[test]
    fn reduce_sum_opset13_noop_and_i64() {
        let x = rnd(24, 2);
        let r = run(
            "ReduceSum",
            13,
            vec![("keepdims", AttrValue::Int(0))],
            &[t(&[2, 3, 4], &x), t::<i64>(&[1], &[1])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 4]);
        let want = naive(&[2, 3, 4], &x, &[false, true, false], |g| g.iter().sum());
        assert_close(&vals::<f32>(&r[0]), &want, 1e-6);
        // noop_with_empty_axes with empty axes: identity.
        let r = run(
            "ReduceSum",
            13,
            vec![("noop_with_empty_axes", AttrValue::Int(1))],
            &[t(&[2, 3, 4], &x), t::<i64>(&[0], &[])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 3, 4]);
        assert_close(&vals::<f32>(&r[0]), &x, 0.0);
        // Empty axes without noop: reduce all.
        let r = run(
            "ReduceMax",
            18,
            vec![("keepdims", AttrValue::Int(0))],
            &[t(&[2, 3, 4], &x), None],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, Vec::<usize>::new());
        assert_close(
            &vals::<f32>(&r[0]),
            &[x.iter().copied().fold(f32::NEG_INFINITY, f32::max)],
            0.0,
        );
        // i64.
        let xi: Vec<i64> = (0..12).map(|v| v * 3 - 7).collect();
        let r = run(
            "ReduceSum",
            13,
            vec![],
            &[t::<i64>(&[3, 4], &xi), t::<i64>(&[1], &[0])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 4]);
        assert_eq!(vals::<i64>(&r[0]), vec![15, 24, 33, 42]);
        let r = run(
            "ReduceMax",
            13,
            vec![("axes", AttrValue::Ints(vec![1]))],
            &[t::<i64>(&[3, 4], &xi)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![2, 14, 26]);
        // Repeated / out-of-range axes.
        assert!(run(
            "ReduceMean",
            13,
            vec![("axes", AttrValue::Ints(vec![1, -2]))],
            &[t(&[2, 3, 4], &x)],
            1
        )
        .is_err());
        assert!(run(
            "ReduceMean",
            13,
            vec![("axes", AttrValue::Ints(vec![3]))],
            &[t(&[2, 3, 4], &x)],
            1
        )
        .is_err());
        // Size-1 and empty-input dims.
        let r = run(
            "ReduceSum",
            11,
            vec![("axes", AttrValue::Ints(vec![1]))],
            &[t(&[2, 1, 3], &x[..6])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &x[..6], 0.0);
        let r = run(
            "ReduceSum",
            11,
            vec![("axes", AttrValue::Ints(vec![1]))],
            &[t::<f32>(&[2, 0], &[])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![0.0, 0.0]);
    }

    #[test]
    fn argmax_argmin() {
        let shape = [3usize, 4, 5];
        let x = rnd(60, 3);
        for axis in [0i64, 1, 2, -1] {
            let a = if axis < 0 { axis + 3 } else { axis } as usize;
            let outer: usize = shape[..a].iter().product();
            let n = shape[a];
            let inner: usize = shape[a + 1..].iter().product();
            for (op, is_max) in [("ArgMax", true), ("ArgMin", false)] {
                let mut want = Vec::new();
                for o in 0..outer {
                    for i in 0..inner {
                        let col: Vec<f32> =
                            (0..n).map(|j| x[o * n * inner + j * inner + i]).collect();
                        let mut bi = 0;
                        for j in 1..n {
                            if (is_max && col[j] > col[bi]) || (!is_max && col[j] < col[bi]) {
                                bi = j;
                            }
                        }
                        want.push(bi as i64);
                    }
                }
                for keep in [0i64, 1] {
                    let r = run(
                        op,
                        13,
                        vec![
                            ("axis", AttrValue::Int(axis)),
                            ("keepdims", AttrValue::Int(keep)),
                        ],
                        &[t(&shape, &x)],
                        1,
                    )
                    .unwrap();
                    let mut ws = shape.to_vec();
                    if keep == 1 {
                        ws[a] = 1;
                    } else {
                        ws.remove(a);
                    }
                    assert_eq!(r[0].shape, ws);
                    assert_eq!(vals::<i64>(&r[0]), want);
                }
            }
        }
        let tie = [1.0f32, 3.0, 3.0, 0.0, 0.0];
        let r = run("ArgMax", 13, vec![], &[t(&[5], &tie)], 1).unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![1]);
        let r = run(
            "ArgMax",
            13,
            vec![("select_last_index", AttrValue::Int(1))],
            &[t(&[5], &tie)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![2]);
        let r = run(
            "ArgMin",
            13,
            vec![
                ("select_last_index", AttrValue::Int(1)),
                ("keepdims", AttrValue::Int(0)),
            ],
            &[t(&[5], &tie)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![4]);
        assert_eq!(r[0].shape, Vec::<usize>::new());
    }
}
