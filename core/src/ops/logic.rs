//! Logic and bit operators: And, Or, Xor over bool; BitShift, BitwiseAnd,
//! BitwiseOr, BitwiseXor, BitwiseNot over every integer width; IsNaN and
//! IsInf over the float types. Binary ones broadcast like numpy.
//!
//! (Equal, Less, ..., Not and Where live in `shape.rs`.)

use crate::error::{Error, ErrorKind, Result};
use crate::ops::elementwise::{binary, unsupported_dtype, with_type, Bcast};
use crate::ops::{kernel, KernelIo, OpDef, PrepareCtx, Prepared};
use crate::{DType, Element};

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("And", 7, |c| prepare_bool(c, Logic::And, "And")),
    OpDef::onnx("Or", 7, |c| prepare_bool(c, Logic::Or, "Or")),
    OpDef::onnx("Xor", 7, |c| prepare_bool(c, Logic::Xor, "Xor")),
    OpDef::onnx("BitShift", 11, prepare_bitshift),
    OpDef::onnx("BitwiseAnd", 18, |c| {
        prepare_bitwise(c, Bit::And, "BitwiseAnd")
    }),
    OpDef::onnx("BitwiseOr", 18, |c| {
        prepare_bitwise(c, Bit::Or, "BitwiseOr")
    }),
    OpDef::onnx("BitwiseXor", 18, |c| {
        prepare_bitwise(c, Bit::Xor, "BitwiseXor")
    }),
    OpDef::onnx("BitwiseNot", 18, prepare_bitwise_not),
    OpDef::onnx("IsNaN", 9, prepare_isnan),
    OpDef::onnx("IsInf", 10, prepare_isinf),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Logic {
    And,
    Or,
    Xor,
}

fn prepare_bool(ctx: &PrepareCtx<'_>, op: Logic, name: &'static str) -> Result<Prepared> {
    let a = ctx.input_of(0, DType::Bool)?;
    let b = ctx.input_of(1, DType::Bool)?;
    let bc = Bcast::new(a.shape, b.shape)?;
    // Any nonzero byte is true; outputs are normalized to 0/1.
    let p = Prepared::single(
        DType::Bool,
        bc.shape()?,
        kernel(name, move |io| match op {
            Logic::And => binary::<u8, u8>(io, &bc, |x, y| (x != 0 && y != 0) as u8),
            Logic::Or => binary::<u8, u8>(io, &bc, |x, y| (x != 0 || y != 0) as u8),
            Logic::Xor => binary::<u8, u8>(io, &bc, |x, y| ((x != 0) != (y != 0)) as u8),
        }),
    );
    Ok(if bc.a_is_out { p.in_place() } else { p })
}

/// Bit operations of one integer type.
trait Bits: Element + Eq {
    fn and(self, o: Self) -> Self;
    fn or(self, o: Self) -> Self;
    fn xor(self, o: Self) -> Self;
    fn not(self) -> Self;
    /// Shift left; a shift amount outside `[0, BITS)` gives 0.
    fn shl_by(self, n: Self) -> Self;
    /// Shift right (arithmetic for signed types); a shift amount outside
    /// `[0, BITS)` gives the sign fill (-1 or 0), as the ONNX reference.
    fn shr_by(self, n: Self) -> Self;
}

macro_rules! bits {
    ($($t:ty: $signed:literal),*) => {$(
        impl Bits for $t {
            fn and(self, o: Self) -> Self {
                self & o
            }
            fn or(self, o: Self) -> Self {
                self | o
            }
            fn xor(self, o: Self) -> Self {
                self ^ o
            }
            fn not(self) -> Self {
                !self
            }
            fn shl_by(self, n: Self) -> Self {
                let n = n as i128;
                if (0..Self::BITS as i128).contains(&n) {
                    self.wrapping_shl(n as u32)
                } else {
                    0
                }
            }
            fn shr_by(self, n: Self) -> Self {
                let n = n as i128;
                if (0..Self::BITS as i128).contains(&n) {
                    self.wrapping_shr(n as u32)
                } else if $signed {
                    self.wrapping_shr(Self::BITS - 1)
                } else {
                    0
                }
            }
        }
    )*};
}

bits!(i8: true, u8: false, i16: true, u16: false, i32: true, u32: false, i64: true, u64: false);

fn int_dtype_check(ctx: &PrepareCtx<'_>, name: &'static str) -> Result<(DType, Bcast)> {
    let a = ctx.input(0)?;
    let b = ctx.input_of(1, a.dtype)?;
    if !a.dtype.is_int() {
        return Err(unsupported_dtype(name, a.dtype));
    }
    Ok((a.dtype, Bcast::new(a.shape, b.shape)?))
}

fn in_place_if(p: Prepared, bc: &Bcast) -> Prepared {
    if bc.a_is_out {
        p.in_place()
    } else {
        p
    }
}

fn shift_kernel<T: Bits>(bc: Bcast, left: bool) -> Result<Prepared> {
    let p = Prepared::single(
        T::DTYPE,
        bc.shape()?,
        kernel("BitShift", move |io| {
            if left {
                binary::<T, T>(io, &bc, T::shl_by)
            } else {
                binary::<T, T>(io, &bc, T::shr_by)
            }
        }),
    );
    Ok(in_place_if(p, &bc))
}

fn prepare_bitshift(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let left = match ctx.attr_str("direction", "")? {
        "LEFT" => true,
        "RIGHT" => false,
        _ => {
            return Err(Error::new(ErrorKind::Attribute {
                name: "direction",
                problem: "must be LEFT or RIGHT",
            }))
        }
    };
    let (dt, bc) = int_dtype_check(ctx, "BitShift")?;
    with_type!(@int dt, T => shift_kernel::<T>(bc, left),
        _ => Err(unsupported_dtype("BitShift", dt)))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bit {
    And,
    Or,
    Xor,
}

fn bitwise_kernel<T: Bits>(bc: Bcast, op: Bit, name: &'static str) -> Result<Prepared> {
    let p = Prepared::single(
        T::DTYPE,
        bc.shape()?,
        kernel(name, move |io| match op {
            Bit::And => binary::<T, T>(io, &bc, T::and),
            Bit::Or => binary::<T, T>(io, &bc, T::or),
            Bit::Xor => binary::<T, T>(io, &bc, T::xor),
        }),
    );
    Ok(in_place_if(p, &bc))
}

fn prepare_bitwise(ctx: &PrepareCtx<'_>, op: Bit, name: &'static str) -> Result<Prepared> {
    let (dt, bc) = int_dtype_check(ctx, name)?;
    with_type!(@int dt, T => bitwise_kernel::<T>(bc, op, name),
        _ => Err(unsupported_dtype(name, dt)))
}

fn not_kernel<T: Bits>(shape: &[usize]) -> Prepared {
    Prepared::single(
        T::DTYPE,
        shape,
        kernel("BitwiseNot", |io| {
            io.unary::<T>()?.map(T::not);
            Ok(())
        }),
    )
    .in_place()
}

fn prepare_bitwise_not(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    with_type!(@int x.dtype, T => Ok(not_kernel::<T>(x.shape)),
        _ => Err(unsupported_dtype("BitwiseNot", x.dtype)))
}

/// A float -> bool element-wise test over the value widened to f64 (exact:
/// widening keeps NaN and infinities).
fn float_test<T: Element>(
    shape: &[usize],
    name: &'static str,
    to_f64: fn(T) -> f64,
    f: impl Fn(f64) -> bool + Copy + Send + Sync + 'static,
) -> Prepared {
    Prepared::single(
        DType::Bool,
        shape,
        kernel(name, move |io: &mut KernelIo<'_>| {
            let x = io.input_slice::<T>(0)?;
            let y = io.output_slice::<u8>(0)?;
            for (o, &v) in y.iter_mut().zip(x) {
                *o = f(to_f64(v)) as u8;
            }
            Ok(())
        }),
    )
}

fn prepare_float_test(
    ctx: &PrepareCtx<'_>,
    name: &'static str,
    f: impl Fn(f64) -> bool + Copy + Send + Sync + 'static,
) -> Result<Prepared> {
    let x = ctx.input(0)?;
    Ok(match x.dtype {
        DType::F32 => float_test::<f32>(x.shape, name, |v| v as f64, f),
        DType::F64 => float_test::<f64>(x.shape, name, |v| v, f),
        DType::F16 => float_test::<half::f16>(x.shape, name, half::f16::to_f64, f),
        DType::BF16 => float_test::<half::bf16>(x.shape, name, half::bf16::to_f64, f),
        dt => return Err(unsupported_dtype(name, dt)),
    })
}

fn prepare_isnan(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_float_test(ctx, "IsNaN", f64::is_nan)
}

fn prepare_isinf(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let pos = ctx.attr_int("detect_positive", 1)? != 0;
    let neg = ctx.attr_int("detect_negative", 1)? != 0;
    prepare_float_test(ctx, "IsInf", move |v| {
        (pos && v == f64::INFINITY) || (neg && v == f64::NEG_INFINITY)
    })
}

#[cfg(test)]
mod tests {
    use crate::model::AttrValue;
    use crate::ops::testing::{run, t, vals};
    use crate::DType;
    use alloc::vec;

    fn bools(shape: &[usize], v: &[u8]) -> Option<crate::model::Const> {
        let mut c = t::<u8>(shape, v).unwrap();
        c.dtype = DType::Bool;
        Some(c)
    }

    #[test]
    fn and_or_xor_broadcast() {
        // [2,2] op [2]
        let a = bools(&[2, 2], &[0, 1, 1, 0]);
        let b = bools(&[2], &[1, 1]);
        let r = run("And", 7, vec![], &[a.clone(), b.clone()], 1).unwrap();
        assert_eq!(r[0].dtype, DType::Bool);
        assert_eq!(r[0].shape, vec![2, 2]);
        assert_eq!(vals::<u8>(&r[0]), vec![0, 1, 1, 0]);
        let b0 = bools(&[1], &[0]);
        let r = run("Or", 7, vec![], &[a.clone(), b0.clone()], 1).unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![0, 1, 1, 0]);
        let r = run("Xor", 7, vec![], &[a.clone(), b], 1).unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![1, 0, 0, 1]);
        let r = run(
            "Or",
            7,
            vec![],
            &[bools(&[2, 1], &[0, 1]), bools(&[2], &[0, 1])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 2]);
        assert_eq!(vals::<u8>(&r[0]), vec![0, 1, 1, 1]);
        assert!(run("And", 7, vec![], &[t::<u8>(&[1], &[1]), b0], 1).is_err());
    }

    #[test]
    fn bitshift_left_right() {
        let left = || vec![("direction", AttrValue::Str(b"LEFT".to_vec()))];
        let right = || vec![("direction", AttrValue::Str(b"RIGHT".to_vec()))];
        let r = run(
            "BitShift",
            11,
            left(),
            &[t::<u8>(&[3], &[16, 4, 1]), t::<u8>(&[3], &[1, 2, 3])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![32, 16, 8]);
        let r = run(
            "BitShift",
            11,
            right(),
            &[t::<u64>(&[3], &[16, 4, 1]), t::<u64>(&[], &[2])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<u64>(&r[0]), vec![4, 1, 0]);
        // Overflow wraps; out-of-range shifts give 0 (left) or the sign fill.
        let r = run(
            "BitShift",
            11,
            left(),
            &[t::<i8>(&[3], &[-1, 64, 5]), t::<i8>(&[3], &[1, 1, 8])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i8>(&r[0]), vec![-2, -128, 0]);
        let r = run(
            "BitShift",
            11,
            right(),
            &[
                t::<i32>(&[4], &[-16, 16, -3, 7]),
                t::<i32>(&[4], &[2, 2, 40, -1]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![-4, 4, -1, 0]);
        let r = run(
            "BitShift",
            11,
            right(),
            &[t::<u16>(&[2], &[0xffff, 8]), t::<u16>(&[2], &[16, 3])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<u16>(&r[0]), vec![0, 1]);
        assert!(run(
            "BitShift",
            11,
            vec![],
            &[t::<u8>(&[1], &[1]), t::<u8>(&[1], &[1])],
            1
        )
        .is_err());
    }

    #[test]
    fn bitwise_ops() {
        let a = t::<i16>(&[3], &[0b1100, -1, 5]);
        let b = t::<i16>(&[3], &[0b1010, 3, 0]);
        let r = run("BitwiseAnd", 18, vec![], &[a.clone(), b.clone()], 1).unwrap();
        assert_eq!(vals::<i16>(&r[0]), vec![0b1000, 3, 0]);
        let r = run("BitwiseOr", 18, vec![], &[a.clone(), b.clone()], 1).unwrap();
        assert_eq!(vals::<i16>(&r[0]), vec![0b1110, -1, 5]);
        let r = run("BitwiseXor", 18, vec![], &[a.clone(), b], 1).unwrap();
        assert_eq!(vals::<i16>(&r[0]), vec![0b0110, -4, 5]);
        let r = run("BitwiseNot", 18, vec![], &[a], 1).unwrap();
        assert_eq!(vals::<i16>(&r[0]), vec![!0b1100, 0, -6]);
        let r = run("BitwiseNot", 18, vec![], &[t::<u8>(&[2], &[0, 0x0f])], 1).unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![0xff, 0xf0]);
        let r = run(
            "BitwiseAnd",
            18,
            vec![],
            &[t::<u64>(&[2, 1], &[6, 3]), t::<u64>(&[2], &[2, 4])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<u64>(&r[0]), vec![2, 4, 2, 0]);
        assert!(run(
            "BitwiseAnd",
            18,
            vec![],
            &[t::<f32>(&[1], &[1.]), t::<f32>(&[1], &[1.])],
            1
        )
        .is_err());
    }

    #[test]
    fn isnan_isinf() {
        let x = [-1.2f32, f32::NAN, f32::INFINITY, 2.8, f32::NEG_INFINITY];
        let r = run("IsNaN", 13, vec![], &[t(&[5], &x)], 1).unwrap();
        assert_eq!(r[0].dtype, DType::Bool);
        assert_eq!(vals::<u8>(&r[0]), vec![0, 1, 0, 0, 0]);
        let r = run("IsInf", 10, vec![], &[t(&[5], &x)], 1).unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![0, 0, 1, 0, 1]);
        let r = run(
            "IsInf",
            10,
            vec![("detect_negative", AttrValue::Int(0))],
            &[t(&[5], &x)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![0, 0, 1, 0, 0]);
        let r = run(
            "IsInf",
            10,
            vec![("detect_positive", AttrValue::Int(0))],
            &[t(&[5], &x)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![0, 0, 0, 0, 1]);
        let h: alloc::vec::Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
        let r = run("IsInf", 20, vec![], &[t(&[5], &h)], 1).unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![0, 0, 1, 0, 1]);
        let r = run("IsNaN", 20, vec![], &[t(&[5], &h)], 1).unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![0, 1, 0, 0, 0]);
        let d = [f64::NAN, 1.0];
        let r = run("IsNaN", 13, vec![], &[t(&[2], &d)], 1).unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![1, 0]);
        assert!(run("IsNaN", 13, vec![], &[t::<i32>(&[1], &[1])], 1).is_err());
    }
}
