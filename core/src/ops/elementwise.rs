//! Element-wise operators: binary arithmetic with numpy broadcasting (Add,
//! Sub, Mul, Div, Pow) and unary math (Sqrt, Exp, Log, Abs, Neg, Reciprocal,
//! Floor, Ceil, Erf).

use crate::error::{Error, ErrorKind, Result};
use crate::math;
use crate::ops::{kernel, util, KernelIo, OpDef, PrepareCtx, Prepared};
use crate::tensor::{broadcast_shapes, broadcast_strides, StridedIter, MAX_RANK};
use crate::{DType, Element};

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("Add", 7, prepare_add),
    OpDef::onnx("Sub", 7, prepare_sub),
    OpDef::onnx("Mul", 7, prepare_mul),
    OpDef::onnx("Div", 7, prepare_div),
    OpDef::onnx("Pow", 7, prepare_pow),
    OpDef::onnx("Sqrt", 6, prepare_sqrt),
    OpDef::onnx("Exp", 6, prepare_exp),
    OpDef::onnx("Log", 6, prepare_log),
    OpDef::onnx("Abs", 6, prepare_abs),
    OpDef::onnx("Neg", 6, prepare_neg),
    OpDef::onnx("Reciprocal", 6, prepare_reciprocal),
    OpDef::onnx("Floor", 6, prepare_floor),
    OpDef::onnx("Ceil", 6, prepare_ceil),
    OpDef::onnx("Erf", 9, prepare_erf),
    OpDef::onnx("Sin", 7, |c| unary_f32(c, "Sin", libm::sinf)),
    OpDef::onnx("Cos", 7, |c| unary_f32(c, "Cos", libm::cosf)),
    OpDef::onnx("Tan", 7, |c| unary_f32(c, "Tan", libm::tanf)),
    OpDef::onnx("Asin", 7, |c| unary_f32(c, "Asin", libm::asinf)),
    OpDef::onnx("Acos", 7, |c| unary_f32(c, "Acos", libm::acosf)),
    OpDef::onnx("Atan", 7, |c| unary_f32(c, "Atan", libm::atanf)),
    OpDef::onnx("Sinh", 9, |c| unary_f32(c, "Sinh", libm::sinhf)),
    OpDef::onnx("Cosh", 9, |c| unary_f32(c, "Cosh", libm::coshf)),
    OpDef::onnx("Asinh", 9, |c| unary_f32(c, "Asinh", libm::asinhf)),
    OpDef::onnx("Acosh", 9, |c| unary_f32(c, "Acosh", libm::acoshf)),
    OpDef::onnx("Atanh", 9, |c| unary_f32(c, "Atanh", libm::atanhf)),
    OpDef::onnx("Round", 11, |c| unary_f32(c, "Round", math::round_even)),
    OpDef::onnx("Sign", 9, |c| unary_f32(c, "Sign", sign)),
    OpDef::onnx("Mish", 18, |c| unary_f32(c, "Mish", mish)),
    OpDef::onnx("ThresholdedRelu", 10, prepare_thresholded_relu),
    OpDef::onnx("Shrink", 9, prepare_shrink),
    OpDef::onnx("Celu", 12, prepare_celu),
];

// ---------------------------------------------------------------------------
// Broadcasting binary kernels (shared with activation.rs for PRelu).

/// How the two operands of a binary op line up with the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Both operands have the output's shape.
    Same,
    /// Operand 1 is a single element, operand 0 has the output's shape.
    ScalarB,
    /// Operand 0 is a single element, operand 1 has the output's shape.
    ScalarA,
    /// Anything else: walk broadcast strides.
    General,
}

/// Broadcast plan of a binary op, computed at prepare.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bcast {
    pub mode: Mode,
    pub out_shape: [usize; MAX_RANK],
    pub rank: usize,
    pub sa: [usize; MAX_RANK],
    pub sb: [usize; MAX_RANK],
    pub na: usize,
    pub nb: usize,
    pub n: usize,
    /// Operand 0 has the output's shape (in place is possible).
    pub a_is_out: bool,
}

impl Bcast {
    /// Multidirectional broadcast of `a` and `b`.
    pub(crate) fn new(a: &[usize], b: &[usize]) -> Result<Self> {
        let mut out_shape = [0usize; MAX_RANK];
        let rank = broadcast_shapes(a, b, &mut out_shape)?;
        let out = &out_shape[..rank];
        let n = crate::error::checked_numel(out)?;
        let na = crate::error::checked_numel(a)?;
        let nb = crate::error::checked_numel(b)?;
        let a_is_out = a == out;
        let b_is_out = b == out;
        let mode = if a_is_out && b_is_out {
            Mode::Same
        } else if a_is_out && nb == 1 {
            Mode::ScalarB
        } else if b_is_out && na == 1 {
            Mode::ScalarA
        } else if na == n && nb == n {
            // Same element count and both broadcast to out: only size-1
            // axes differ, so the row-major layouts coincide.
            Mode::Same
        } else {
            Mode::General
        };
        let sa = broadcast_strides(a, out);
        let sb = broadcast_strides(b, out);
        Ok(Bcast {
            mode,
            out_shape,
            rank,
            sa,
            sb,
            na,
            nb,
            n,
            a_is_out,
        })
    }

    /// The output shape.
    pub(crate) fn shape(&self) -> &[usize] {
        &self.out_shape[..self.rank]
    }
}

fn len_err() -> Error {
    Error::new(ErrorKind::Internal("binary operand length"))
}

/// Runs `y = f(a, b)` over a broadcast plan; output dtype is operand 0's.
/// Handles the in-place case (output 0 holds operand 0).
pub(crate) fn binary<A: Element, B: Element>(
    io: &mut KernelIo<'_>,
    bc: &Bcast,
    f: impl Fn(A, B) -> A,
) -> Result<()> {
    let b = io.input_slice::<B>(1)?;
    if b.len() != bc.nb {
        return Err(len_err());
    }
    if io.is_inplace() {
        if !bc.a_is_out {
            return Err(Error::new(ErrorKind::Internal(
                "in place binary with broadcast operand 0",
            )));
        }
        let y = io.output_slice::<A>(0)?;
        if y.len() != bc.n {
            return Err(len_err());
        }
        match bc.mode {
            Mode::Same => {
                for (o, &bv) in y.iter_mut().zip(b) {
                    *o = f(*o, bv);
                }
            }
            Mode::ScalarB | Mode::ScalarA => {
                if let Some(&bv) = b.first() {
                    for o in y.iter_mut() {
                        *o = f(*o, bv);
                    }
                }
            }
            Mode::General => {
                for (o, [ob]) in y.iter_mut().zip(StridedIter::new(bc.shape(), [bc.sb])) {
                    *o = f(*o, b[ob]);
                }
            }
        }
        return Ok(());
    }
    let a = io.input_slice::<A>(0)?;
    if a.len() != bc.na {
        return Err(len_err());
    }
    let y = io.output_slice::<A>(0)?;
    if y.len() != bc.n {
        return Err(len_err());
    }
    match bc.mode {
        Mode::Same => {
            for ((o, &av), &bv) in y.iter_mut().zip(a).zip(b) {
                *o = f(av, bv);
            }
        }
        Mode::ScalarB => {
            if let Some(&bv) = b.first() {
                for (o, &av) in y.iter_mut().zip(a) {
                    *o = f(av, bv);
                }
            }
        }
        Mode::ScalarA => {
            if let Some(&av) = a.first() {
                for (o, &bv) in y.iter_mut().zip(b) {
                    *o = f(av, bv);
                }
            }
        }
        Mode::General => {
            for (o, [oa, ob]) in y
                .iter_mut()
                .zip(StridedIter::new(bc.shape(), [bc.sa, bc.sb]))
            {
                *o = f(a[oa], b[ob]);
            }
        }
    }
    Ok(())
}

/// Which arithmetic op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
}

fn prepare_arith(ctx: &PrepareCtx<'_>, op: Arith, name: &'static str) -> Result<Prepared> {
    let a = ctx.input(0)?;
    let dt = a.dtype;
    util::dtype_in(dt, &[DType::F32, DType::I32, DType::I64], name)?;
    let b = ctx.input_of(1, dt)?;
    let bc = Bcast::new(a.shape, b.shape)?;
    let shape = bc.shape();
    let p = match dt {
        DType::F32 => Prepared::single(
            dt,
            shape,
            kernel(name, move |io| match op {
                Arith::Add => binary::<f32, f32>(io, &bc, |x, y| x + y),
                Arith::Sub => binary::<f32, f32>(io, &bc, |x, y| x - y),
                Arith::Mul => binary::<f32, f32>(io, &bc, |x, y| x * y),
                Arith::Div => binary::<f32, f32>(io, &bc, |x, y| x / y),
            }),
        ),
        DType::I32 => Prepared::single(
            dt,
            shape,
            kernel(name, move |io| match op {
                Arith::Add => binary::<i32, i32>(io, &bc, |x, y| x.wrapping_add(y)),
                Arith::Sub => binary::<i32, i32>(io, &bc, |x, y| x.wrapping_sub(y)),
                Arith::Mul => binary::<i32, i32>(io, &bc, |x, y| x.wrapping_mul(y)),
                Arith::Div => {
                    binary::<i32, i32>(io, &bc, |x, y| if y == 0 { 0 } else { x.wrapping_div(y) })
                }
            }),
        ),
        DType::I64 => Prepared::single(
            dt,
            shape,
            kernel(name, move |io| match op {
                Arith::Add => binary::<i64, i64>(io, &bc, |x, y| x.wrapping_add(y)),
                Arith::Sub => binary::<i64, i64>(io, &bc, |x, y| x.wrapping_sub(y)),
                Arith::Mul => binary::<i64, i64>(io, &bc, |x, y| x.wrapping_mul(y)),
                Arith::Div => {
                    binary::<i64, i64>(io, &bc, |x, y| if y == 0 { 0 } else { x.wrapping_div(y) })
                }
            }),
        ),
        _ => {
            return Err(Error::new(ErrorKind::UnsupportedDType {
                what: name,
                code: dt.onnx_code(),
            }))
        }
    };
    Ok(if bc.a_is_out { p.in_place() } else { p })
}

fn prepare_add(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_arith(ctx, Arith::Add, "Add")
}
fn prepare_sub(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_arith(ctx, Arith::Sub, "Sub")
}
fn prepare_mul(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_arith(ctx, Arith::Mul, "Mul")
}
fn prepare_div(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_arith(ctx, Arith::Div, "Div")
}

/// `x^n` for an integer exponent, by the float power (matches numpy for f32).
#[inline]
fn powi(x: f32, n: i64) -> f32 {
    math::pow(x, n as f32)
}

fn prepare_pow(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let a = ctx.input_of(0, DType::F32)?;
    let b = ctx.input(1)?;
    let bc = Bcast::new(a.shape, b.shape)?;
    let p = match b.dtype {
        DType::F32 => Prepared::single(
            DType::F32,
            bc.shape(),
            kernel("Pow", move |io| {
                binary::<f32, f32>(io, &bc, |x, y| {
                    // Common exponents without the general power.
                    if y == 2.0 {
                        x * x
                    } else if y == 1.0 {
                        x
                    } else {
                        math::pow(x, y)
                    }
                })
            }),
        ),
        DType::I64 => Prepared::single(
            DType::F32,
            bc.shape(),
            kernel("Pow", move |io| binary::<f32, i64>(io, &bc, powi)),
        ),
        DType::I32 => Prepared::single(
            DType::F32,
            bc.shape(),
            kernel("Pow", move |io| {
                binary::<f32, i32>(io, &bc, |x, n| powi(x, n as i64))
            }),
        ),
        dt => {
            return Err(Error::new(ErrorKind::UnsupportedDType {
                what: "Pow exponent",
                code: dt.onnx_code(),
            }))
        }
    };
    Ok(if bc.a_is_out { p.in_place() } else { p })
}

// ---------------------------------------------------------------------------
// Unary math.

use crate::ops::util::unary_f32;

fn prepare_sqrt(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_f32(ctx, "Sqrt", math::sqrt)
}
fn prepare_exp(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_f32(ctx, "Exp", math::exp)
}
fn prepare_log(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_f32(ctx, "Log", math::ln)
}
fn prepare_reciprocal(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_f32(ctx, "Reciprocal", |x| 1.0 / x)
}
fn prepare_floor(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_f32(ctx, "Floor", math::floor)
}
fn prepare_ceil(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_f32(ctx, "Ceil", math::ceil)
}
fn prepare_erf(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_f32(ctx, "Erf", math::erf)
}

fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        x // 0 stays 0 (with its sign), NaN stays NaN
    }
}

/// x * tanh(softplus(x)), softplus computed without overflow.
fn mish(x: f32) -> f32 {
    let sp = if x > 20.0 {
        x
    } else {
        libm::log1pf(math::exp(x))
    };
    x * math::tanh(sp)
}

fn prepare_thresholded_relu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let alpha = ctx.attr_float("alpha", 1.0)?;
    unary_f32(
        ctx,
        "ThresholdedRelu",
        move |x| if x > alpha { x } else { 0.0 },
    )
}

fn prepare_shrink(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let lambd = ctx.attr_float("lambd", 0.5)?;
    let bias = ctx.attr_float("bias", 0.0)?;
    unary_f32(ctx, "Shrink", move |x| {
        if x < -lambd {
            x + bias
        } else if x > lambd {
            x - bias
        } else {
            0.0
        }
    })
}

fn prepare_celu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let alpha = ctx.attr_float("alpha", 1.0)?;
    if alpha == 0.0 {
        return Err(Error::new(ErrorKind::Attribute {
            name: "alpha",
            problem: "must not be 0",
        }));
    }
    unary_f32(ctx, "Celu", move |x| {
        let neg = alpha * (math::exp(x / alpha) - 1.0);
        x.max(0.0) + neg.min(0.0)
    })
}

/// Abs / Neg: f32, i32, i64 (integers wrap, as two's complement hardware).
fn prepare_sign_op(ctx: &PrepareCtx<'_>, name: &'static str, neg: bool) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let dt = x.dtype;
    util::dtype_in(dt, &[DType::F32, DType::I32, DType::I64], name)?;
    let p = match dt {
        DType::I32 => Prepared::single(
            dt,
            x.shape,
            kernel(name, move |io| {
                io.unary::<i32>()?.map(|v| {
                    if neg {
                        v.wrapping_neg()
                    } else {
                        v.wrapping_abs()
                    }
                });
                Ok(())
            }),
        ),
        DType::I64 => Prepared::single(
            dt,
            x.shape,
            kernel(name, move |io| {
                io.unary::<i64>()?.map(|v| {
                    if neg {
                        v.wrapping_neg()
                    } else {
                        v.wrapping_abs()
                    }
                });
                Ok(())
            }),
        ),
        _ => Prepared::single(
            dt,
            x.shape,
            kernel(name, move |io| {
                io.unary::<f32>()?
                    .map(|v| if neg { -v } else { math::abs(v) });
                Ok(())
            }),
        ),
    };
    Ok(p.in_place())
}

fn prepare_abs(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_sign_op(ctx, "Abs", false)
}
fn prepare_neg(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_sign_op(ctx, "Neg", true)
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::model::{AttrValue, Const};
    use crate::ops::testing::{assert_close, node, run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;

    fn bin_f(op: &str, sa: &[usize], a: &[f32], sb: &[usize], b: &[f32]) -> (Vec<usize>, Vec<f32>) {
        let r = run(op, 13, vec![], &[t(sa, a), t(sb, b)], 1).unwrap();
        (r[0].shape.clone(), vals::<f32>(&r[0]))
    }

    #[test]
    fn add_same_shape() {
        let (s, v) = bin_f(
            "Add",
            &[2, 2],
            &[1., 2., 3., 4.],
            &[2, 2],
            &[10., 20., 30., 40.],
        );
        assert_eq!(s, vec![2, 2]);
        assert_close(&v, &[11., 22., 33., 44.], 0.0);
    }

    #[test]
    fn sub_scalar_b_and_a() {
        let (s, v) = bin_f("Sub", &[3], &[1., 2., 3.], &[], &[1.5]);
        assert_eq!(s, vec![3]);
        assert_close(&v, &[-0.5, 0.5, 1.5], 0.0);
        let (s, v) = bin_f("Sub", &[1], &[10.], &[2, 2], &[1., 2., 3., 4.]);
        assert_eq!(s, vec![2, 2]);
        assert_close(&v, &[9., 8., 7., 6.], 0.0);
    }

    #[test]
    fn mul_broadcast_general() {
        // [2,1,3] * [4,1] -> [2,4,3]
        let a: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let b = [1., 10., 100., 1000.];
        let (s, v) = bin_f("Mul", &[2, 1, 3], &a, &[4, 1], &b);
        assert_eq!(s, vec![2, 4, 3]);
        let mut want = Vec::new();
        for i in 0..2 {
            for j in 0..4 {
                for k in 0..3 {
                    want.push(a[i * 3 + k] * b[j]);
                }
            }
        }
        assert_close(&v, &want, 0.0);
    }

    #[test]
    fn add_row_and_column() {
        // [3,1] + [1,2] -> [3,2]
        let (s, v) = bin_f("Add", &[3, 1], &[1., 2., 3.], &[1, 2], &[10., 20.]);
        assert_eq!(s, vec![3, 2]);
        assert_close(&v, &[11., 21., 12., 22., 13., 23.], 0.0);
        // channel bias: [1,2,2] + [2,1,1]
        let (s, v) = bin_f("Add", &[1, 2, 2], &[1., 2., 3., 4.], &[2, 1], &[100., 200.]);
        assert_eq!(s, vec![1, 2, 2]);
        assert_close(&v, &[101., 102., 203., 204.], 0.0);
    }

    #[test]
    fn div_f32_and_size1_axes() {
        // Same numel, different size-1 axes: [1,3] / [3] -> [1,3]
        let (s, v) = bin_f("Div", &[1, 3], &[1., 4., 9.], &[3], &[2., 4., 3.]);
        assert_eq!(s, vec![1, 3]);
        assert_close(&v, &[0.5, 1., 3.], 0.0);
        let (_, v) = bin_f("Div", &[1], &[1.], &[1], &[0.]);
        assert!(v[0].is_infinite());
    }

    #[test]
    fn int_ops_and_div_by_zero() {
        let r = run(
            "Div",
            13,
            vec![],
            &[
                t::<i64>(&[4], &[7, -7, 5, 3]),
                t::<i64>(&[4], &[2, 2, 0, -1]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![3, -3, 0, -3]);
        let r = run(
            "Div",
            13,
            vec![],
            &[t::<i32>(&[2], &[i32::MIN, 9]), t::<i32>(&[], &[-1])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![i32::MIN, -9]);
        let r = run(
            "Div",
            13,
            vec![],
            &[t::<i32>(&[2], &[1, 2]), t::<i32>(&[1], &[0])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![0, 0]);
        let r = run(
            "Add",
            14,
            vec![],
            &[t::<i32>(&[2, 1], &[1, 2]), t::<i32>(&[3], &[10, 20, 30])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 3]);
        assert_eq!(vals::<i32>(&r[0]), vec![11, 21, 31, 12, 22, 32]);
        let r = run(
            "Mul",
            14,
            vec![],
            &[t::<i64>(&[3], &[1, -2, 3]), t::<i64>(&[], &[4])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![4, -8, 12]);
        let r = run(
            "Sub",
            14,
            vec![],
            &[t::<i64>(&[], &[4]), t::<i64>(&[3], &[1, -2, 3])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![3, 6, 1]);
    }

    #[test]
    fn mismatch_errors() {
        assert!(run(
            "Add",
            13,
            vec![],
            &[t::<f32>(&[2], &[1., 2.]), t::<f32>(&[3], &[1., 2., 3.])],
            1
        )
        .is_err());
        assert!(run(
            "Add",
            13,
            vec![],
            &[t::<f32>(&[2], &[1., 2.]), t::<i64>(&[2], &[1, 2])],
            1
        )
        .is_err());
        assert!(run(
            "Add",
            13,
            vec![],
            &[t::<u8>(&[1], &[1]), t::<u8>(&[1], &[1])],
            1
        )
        .is_err());
        assert!(run("Sqrt", 13, vec![], &[t::<i64>(&[1], &[1])], 1).is_err());
    }

    #[test]
    fn empty_tensors() {
        let (s, v) = bin_f("Add", &[0, 3], &[], &[1, 3], &[1., 2., 3.]);
        assert_eq!(s, vec![0, 3]);
        assert!(v.is_empty());
        let (s, v) = bin_f("Mul", &[2, 0], &[], &[], &[2.]);
        assert_eq!(s, vec![2, 0]);
        assert!(v.is_empty());
        let (s, v) = bin_f("Add", &[1], &[1.], &[0], &[]);
        assert_eq!(s, vec![0]);
        assert!(v.is_empty());
        let r = run("Exp", 13, vec![], &[t::<f32>(&[0, 2], &[])], 1).unwrap();
        assert_eq!(r[0].shape, vec![0, 2]);
        assert!(vals::<f32>(&r[0]).is_empty());
    }

    #[test]
    fn pow_exponent_types() {
        let (s, v) = bin_f("Pow", &[3], &[2., 3., 4.], &[], &[2.]);
        assert_eq!(s, vec![3]);
        assert_close(&v, &[4., 9., 16.], 0.0);
        let (_, v) = bin_f("Pow", &[3], &[2., 3., 4.], &[3], &[3., 0.5, -1.]);
        assert_close(&v, &[8., 1.7320508, 0.25], 0.0);
        let (s, v) = bin_f("Pow", &[2, 1], &[2., 3.], &[2], &[1., 0.]);
        assert_eq!(s, vec![2, 2]);
        assert_close(&v, &[2., 1., 3., 1.], 0.0);
        let r = run(
            "Pow",
            15,
            vec![],
            &[t::<f32>(&[3], &[2., -3., 0.5]), t::<i64>(&[3], &[3, 2, -2])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[8., 9., 4.], 0.0);
        let r = run(
            "Pow",
            15,
            vec![],
            &[t::<f32>(&[2], &[2., -2.]), t::<i32>(&[], &[3])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[8., -8.], 0.0);
    }

    #[test]
    fn unary_math() {
        let u = |op: &str, x: &[f32]| {
            vals::<f32>(&run(op, 13, vec![], &[t(&[x.len()], x)], 1).unwrap()[0])
        };
        assert_close(
            &u("Sqrt", &[4., 2., 0.]),
            &[2., core::f32::consts::SQRT_2, 0.],
            0.0,
        );
        assert!(u("Sqrt", &[-1.])[0].is_nan());
        assert_close(&u("Exp", &[0., 1., -1.]), &[1., 2.7182817, 0.36787945], 0.0);
        assert_close(
            &u("Log", &[1., 2.7182817, 0.5]),
            &[0., 1., -core::f32::consts::LN_2],
            1e-6,
        );
        assert_close(&u("Abs", &[-1.5, 2., 0.]), &[1.5, 2., 0.], 0.0);
        assert_close(&u("Neg", &[-1.5, 2., 0.]), &[1.5, -2., 0.], 0.0);
        assert_close(&u("Reciprocal", &[2., -4., 0.5]), &[0.5, -0.25, 2.], 0.0);
        assert_close(&u("Floor", &[1.5, -1.5, 2.0]), &[1., -2., 2.], 0.0);
        assert_close(&u("Ceil", &[1.5, -1.5, 2.0]), &[2., -1., 2.], 0.0);
        assert_close(
            &u("Erf", &[0., 1., -0.5]),
            &[0., 0.8427008, -0.5204999],
            1e-6,
        );
        let r = run("Abs", 13, vec![], &[t::<i64>(&[3], &[-3, 4, i64::MIN])], 1).unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![3, 4, i64::MIN]);
        let r = run("Neg", 13, vec![], &[t::<i32>(&[2], &[-3, 4])], 1).unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![3, -4]);
    }

    /// Runs `op` with output 0 written over input 0 (as the planner does when
    /// input 0 dies at this node); returns output 0.
    pub(crate) fn run_inplace(
        op: &str,
        opset: i64,
        x_shape: &[usize],
        x: &[f32],
        rest: &[Option<Const>],
    ) -> Vec<f32> {
        use crate::ops::{InputInfo, KernelIo, Loc, PrepareCtx, Slot};
        use crate::DType;
        let n = node(op, 1 + rest.len(), 1, vec![]);
        let mut infos = vec![Some(InputInfo {
            dtype: DType::F32,
            shape: x_shape,
            value: None,
        })];
        infos.extend(rest.iter().map(|c| {
            c.as_ref().map(|c| InputInfo {
                dtype: c.dtype,
                shape: &c.shape,
                value: Some(c.view()),
            })
        }));
        let ctx = PrepareCtx::new(&n, opset, &infos);
        let prep = (crate::ops::find("", op, opset).unwrap().prepare)(&ctx).unwrap();
        assert!(prep.inplace, "{op} should allow in place");
        assert_eq!(prep.outputs[0].shape, x_shape);
        let mut buf: Vec<f32> = x.to_vec();
        let len = buf.len() * 4;
        let mut slots = vec![Slot {
            dtype: DType::F32,
            shape: x_shape.into(),
            loc: Loc::Arena { offset: 0, len },
        }];
        let folded: Vec<Const> = rest.iter().flatten().cloned().collect();
        let mut ins = vec![Some(0u32)];
        let mut k = 0u32;
        for c in rest {
            match c {
                Some(c) => {
                    slots.push(Slot {
                        dtype: c.dtype,
                        shape: c.shape.clone(),
                        loc: Loc::Folded(k),
                    });
                    k += 1;
                    ins.push(Some(slots.len() as u32 - 1));
                }
                None => ins.push(None),
            }
        }
        let outs = [Some(0u32)];
        let graph = crate::model::Graph::default();
        let mut io = KernelIo {
            slots: &slots,
            graph: &graph,
            folded: &folded,
            base: buf.as_mut_ptr() as *mut u8,
            base_len: len,
            inputs: &ins,
            outputs: &outs,
            scratch: (len, 0),
            inplace: true,
            shapes: None,
            _arena: core::marker::PhantomData,
        };
        prep.kernel.run(&mut io).unwrap();
        buf
    }

    #[test]
    fn in_place_paths() {
        let x = [1., 2., 3., 4., 5., 6.];
        assert_close(
            &run_inplace("Add", 13, &[2, 3], &x, &[t::<f32>(&[2, 3], &[1.; 6])]),
            &[2., 3., 4., 5., 6., 7.],
            0.0,
        );
        assert_close(
            &run_inplace("Mul", 13, &[2, 3], &x, &[t::<f32>(&[], &[2.])]),
            &[2., 4., 6., 8., 10., 12.],
            0.0,
        );
        assert_close(
            &run_inplace("Sub", 13, &[2, 3], &x, &[t::<f32>(&[2, 1], &[1., 2.])]),
            &[0., 1., 2., 2., 3., 4.],
            0.0,
        );
        assert_close(
            &run_inplace("Pow", 15, &[2, 3], &x, &[t::<i64>(&[3], &[0, 1, 2])]),
            &[1., 2., 9., 1., 5., 36.],
            0.0,
        );
        assert_close(
            &run_inplace("Sqrt", 13, &[2], &[4., 9.], &[]),
            &[2., 3.],
            0.0,
        );
    }

    #[test]
    fn opset_lookup() {
        assert!(crate::ops::find("", "Add", 6).is_none());
        assert_eq!(crate::ops::find("", "Add", 21).map(|d| d.since), Some(7));
        assert_eq!(crate::ops::find("", "Erf", 13).map(|d| d.since), Some(9));
    }

    #[test]
    fn trig_and_small_activations() {
        let x = [-2.0f32, -0.5, 0.0, 0.25, 3.0];
        type Case = (&'static str, i64, fn(f32) -> f32);
        let cases: [Case; 5] = [
            ("Sin", 7, |v| (v as f64).sin() as f32),
            ("Atan", 7, |v| (v as f64).atan() as f32),
            ("Cosh", 9, |v| (v as f64).cosh() as f32),
            ("Sign", 9, |v| {
                if v > 0.0 {
                    1.0
                } else if v < 0.0 {
                    -1.0
                } else {
                    0.0
                }
            }),
            ("Mish", 18, |v| {
                let v = v as f64;
                (v * (v.exp().ln_1p()).tanh()) as f32
            }),
        ];
        for (op, opset, f) in cases {
            let out = run(op, opset, vec![], &[t(&[5], &x)], 1).unwrap();
            let want: Vec<f32> = x.iter().map(|&v| f(v)).collect();
            assert_close(&vals::<f32>(&out[0]), &want, 1e-6);
        }
        let r = run(
            "Round",
            11,
            vec![],
            &[t(&[4], &[0.5f32, 1.5, -2.5, 2.4])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![0.0, 2.0, -2.0, 2.0]);
        let s = run(
            "Shrink",
            9,
            vec![
                ("bias", AttrValue::Float(1.5)),
                ("lambd", AttrValue::Float(1.5)),
            ],
            &[t(&[3], &[-2.0f32, 0.0, 2.0])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&s[0]), vec![-0.5, 0.0, 0.5]);
        let c = run(
            "Celu",
            12,
            vec![("alpha", AttrValue::Float(2.0))],
            &[t(&[2], &[-1.0f32, 1.0])],
            1,
        )
        .unwrap();
        assert_close(
            &vals::<f32>(&c[0]),
            &[2.0 * ((-0.5f64).exp() as f32 - 1.0), 1.0],
            1e-6,
        );
    }
}
