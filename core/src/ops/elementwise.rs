//! Element-wise operators: binary arithmetic with numpy broadcasting (Add,
//! Sub, Mul, Div, Mod, Pow) over every numeric dtype, variadic Max, Min, Sum
//! and Mean, and unary math (Sqrt, Exp, Log, Abs, Neg, Reciprocal, Floor,
//! Ceil, Erf, trigonometry, Round, Sign, ...) over f32, f64, f16 and bf16.

use alloc::vec::Vec;

use crate::error::{Error, ErrorKind, Result};
use crate::math;
use crate::ops::{kernel, util, KernelIo, OpDef, PrepareCtx, Prepared};
use crate::tensor::{broadcast_shapes, broadcast_strides, StridedIter, MAX_RANK};
use crate::tensor::{copy_exact, ChunksOf as _};
use crate::{DType, Element};

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("Add", 7, prepare_add),
    OpDef::onnx("Sub", 7, prepare_sub),
    OpDef::onnx("Mul", 7, prepare_mul),
    OpDef::onnx("Div", 7, prepare_div),
    OpDef::onnx("Mod", 10, prepare_mod),
    OpDef::onnx("Pow", 7, prepare_pow),
    OpDef::onnx("Max", 6, prepare_max),
    OpDef::onnx("Min", 6, prepare_min),
    OpDef::onnx("Sum", 6, prepare_sum),
    OpDef::onnx("Mean", 6, prepare_mean),
    OpDef::onnx("Sqrt", 6, prepare_sqrt),
    OpDef::onnx("Exp", 6, prepare_exp),
    OpDef::onnx("Log", 6, prepare_log),
    OpDef::onnx("Abs", 6, prepare_abs),
    OpDef::onnx("Neg", 6, prepare_neg),
    OpDef::onnx("Reciprocal", 6, prepare_reciprocal),
    OpDef::onnx("Floor", 6, prepare_floor),
    OpDef::onnx("Ceil", 6, prepare_ceil),
    OpDef::onnx("Erf", 9, prepare_erf),
    OpDef::onnx("Sin", 7, |c| unary_float(c, "Sin", libm::sinf, libm::sin)),
    OpDef::onnx("Cos", 7, |c| unary_float(c, "Cos", libm::cosf, libm::cos)),
    OpDef::onnx("Tan", 7, |c| unary_float(c, "Tan", libm::tanf, libm::tan)),
    OpDef::onnx("Asin", 7, |c| {
        unary_float(c, "Asin", libm::asinf, libm::asin)
    }),
    OpDef::onnx("Acos", 7, |c| {
        unary_float(c, "Acos", libm::acosf, libm::acos)
    }),
    OpDef::onnx("Atan", 7, |c| {
        unary_float(c, "Atan", libm::atanf, libm::atan)
    }),
    OpDef::onnx("Sinh", 9, |c| {
        unary_float(c, "Sinh", libm::sinhf, libm::sinh)
    }),
    OpDef::onnx("Cosh", 9, |c| {
        unary_float(c, "Cosh", libm::coshf, libm::cosh)
    }),
    OpDef::onnx("Asinh", 9, |c| {
        unary_float(c, "Asinh", libm::asinhf, libm::asinh)
    }),
    OpDef::onnx("Acosh", 9, |c| {
        unary_float(c, "Acosh", libm::acoshf, libm::acosh)
    }),
    OpDef::onnx("Atanh", 9, |c| {
        unary_float(c, "Atanh", libm::atanhf, libm::atanh)
    }),
    OpDef::onnx("Round", 11, |c| {
        unary_float(c, "Round", math::round_even, libm::rint)
    }),
    OpDef::onnx("Sign", 9, |c| prepare_sign_op(c, SignOp::Sign, "Sign")),
    OpDef::onnx("Mish", 18, |c| unary_float(c, "Mish", mish, mish64)),
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
        let out = out_shape.get(..rank).ok_or(rank_err())?;
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
    pub(crate) fn shape(&self) -> Result<&[usize]> {
        self.out_shape.get(..self.rank).ok_or(rank_err())
    }
}

fn rank_err() -> Error {
    Error::new(ErrorKind::Internal("broadcast rank above MAX_RANK"))
}

fn len_err() -> Error {
    Error::new(ErrorKind::Internal("binary operand length"))
}

/// One operand read along an output row (the innermost axis): a contiguous
/// run (stride 1) or one element repeated (stride 0, a broadcast axis).
#[derive(Clone, Copy)]
enum Row<'a, T> {
    Run(&'a [T]),
    Rep(T),
}

impl<'a, T: Copy> Row<'a, T> {
    /// The row of `w` elements of `x` from offset `off`, innermost stride `s`
    /// (broadcast strides are 0 or 1 there); `Err` if it leaves `x`.
    #[inline]
    fn at(x: &'a [T], off: usize, s: usize, w: usize) -> Result<Self> {
        match s {
            0 => x.get(off).map(|&v| Row::Rep(v)),
            1 => off
                .checked_add(w)
                .and_then(|end| x.get(off..end))
                .map(Row::Run),
            _ => None,
        }
        .ok_or(len_err())
    }
}

/// Walks a broadcast `shape` one innermost row at a time, for operands with
/// broadcast `strides`: the row width, each operand's innermost stride, and
/// an iterator over each row's start offsets. `None` when the shape has no
/// elements in a row (width 0: nothing to do). A scalar shape is one row of
/// one element.
fn rows<const N: usize>(
    shape: &[usize],
    strides: [[usize; MAX_RANK]; N],
) -> Result<Option<(usize, [usize; N], StridedIter<N>)>> {
    let Some((&w, outer)) = shape.split_last() else {
        return Ok(Some((1, [0; N], StridedIter::new(&[], strides))));
    };
    if w == 0 {
        return Ok(None);
    }
    let mut last = [0usize; N];
    for (l, st) in last.iter_mut().zip(&strides) {
        *l = *st.get(outer.len()).ok_or(rank_err())?;
    }
    Ok(Some((w, last, StridedIter::new(outer, strides))))
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
                let Some((w, [lb], starts)) = rows(bc.shape()?, [bc.sb])? else {
                    return Ok(());
                };
                for (yr, [ob]) in y.chunks_of_mut(w).zip(starts) {
                    match Row::at(b, ob, lb, w)? {
                        Row::Run(br) => {
                            for (o, &bv) in yr.iter_mut().zip(br) {
                                *o = f(*o, bv);
                            }
                        }
                        Row::Rep(bv) => {
                            for o in yr.iter_mut() {
                                *o = f(*o, bv);
                            }
                        }
                    }
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
            let Some((w, [la, lb], starts)) = rows(bc.shape()?, [bc.sa, bc.sb])? else {
                return Ok(());
            };
            for (yr, [oa, ob]) in y.chunks_of_mut(w).zip(starts) {
                match (Row::at(a, oa, la, w)?, Row::at(b, ob, lb, w)?) {
                    (Row::Run(ar), Row::Run(br)) => {
                        for ((o, &av), &bv) in yr.iter_mut().zip(ar).zip(br) {
                            *o = f(av, bv);
                        }
                    }
                    (Row::Run(ar), Row::Rep(bv)) => {
                        for (o, &av) in yr.iter_mut().zip(ar) {
                            *o = f(av, bv);
                        }
                    }
                    (Row::Rep(av), Row::Run(br)) => {
                        for (o, &bv) in yr.iter_mut().zip(br) {
                            *o = f(av, bv);
                        }
                    }
                    (Row::Rep(av), Row::Rep(bv)) => {
                        for o in yr.iter_mut() {
                            *o = f(av, bv);
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Numeric element types.

/// Pow's exponent, read from any numeric dtype.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Exponent {
    /// An integer exponent.
    I(i64),
    /// A float exponent.
    F(f64),
}

/// Arithmetic on one numeric storage type with ONNX semantics: integers
/// wrap, integer division truncates toward zero, and a zero integer divisor
/// gives 0 rather than trapping (numpy gives 0 too, with a warning); f16 and
/// bf16 compute in f32 and round back, as numpy does.
pub(crate) trait Num: Element + PartialOrd {
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    /// Remainder with the divisor's sign (numpy `mod`; Mod with fmod=0).
    fn rem_floor(self, o: Self) -> Self;
    /// Remainder with the dividend's sign (C `fmod`; Mod with fmod=1).
    fn rem_trunc(self, o: Self) -> Self;
    /// `self^e`, as numpy's `power(...).astype(self's dtype)`.
    fn pow(self, e: Exponent) -> Self;
    /// This value as a Pow exponent.
    fn exponent(self) -> Exponent;
    /// A small count (Mean's divisor, Hardmax's 0 and 1).
    fn from_usize(n: usize) -> Self;
}

/// Integer `x^n` by squaring, wrapping like numpy's integer power.
macro_rules! int_pow {
    ($x:expr, $n:expr) => {{
        let (mut acc, mut b, mut n) = (1, $x, $n as u64);
        while n > 0 {
            if n & 1 == 1 {
                acc = b.wrapping_mul(acc);
            }
            b = b.wrapping_mul(b);
            n >>= 1;
        }
        acc
    }};
}

macro_rules! num_common_int {
    () => {
        fn add(self, o: Self) -> Self {
            self.wrapping_add(o)
        }
        fn sub(self, o: Self) -> Self {
            self.wrapping_sub(o)
        }
        fn mul(self, o: Self) -> Self {
            self.wrapping_mul(o)
        }
        fn div(self, o: Self) -> Self {
            // x / 0 is 0 here; MIN / -1 wraps to MIN (= -MIN), as numpy.
            self.checked_div(o)
                .unwrap_or(if o == 0 { 0 } else { self.wrapping_neg() })
        }
        fn rem_trunc(self, o: Self) -> Self {
            // x % 0 is 0 here, and MIN % -1 is 0.
            self.checked_rem(o).unwrap_or(0)
        }
        fn from_usize(n: usize) -> Self {
            n as Self
        }
    };
}

macro_rules! num_signed {
    ($($t:ty),*) => {$(
        impl Num for $t {
            num_common_int!();
            fn rem_floor(self, o: Self) -> Self {
                if o == 0 {
                    return 0;
                }
                let r = self.checked_rem(o).unwrap_or(0);
                if r != 0 && ((r < 0) != (o < 0)) {
                    r.wrapping_add(o)
                } else {
                    r
                }
            }
            fn pow(self, e: Exponent) -> Self {
                match e {
                    // Truncated reciprocal: only |x| = 1 survives.
                    Exponent::I(n) if n < 0 => match self {
                        1 => 1,
                        -1 => if n % 2 == 0 { 1 } else { -1 },
                        _ => 0,
                    },
                    Exponent::I(n) => int_pow!(self, n),
                    Exponent::F(y) => libm::pow(self as f64, y) as Self,
                }
            }
            fn exponent(self) -> Exponent {
                Exponent::I((self as i128) as i64)
            }
        }
    )*};
}

macro_rules! num_unsigned {
    ($($t:ty),*) => {$(
        impl Num for $t {
            num_common_int!();
            fn rem_floor(self, o: Self) -> Self {
                self.rem_trunc(o)
            }
            fn pow(self, e: Exponent) -> Self {
                match e {
                    Exponent::I(n) if n < 0 => (self == 1) as Self,
                    Exponent::I(n) => int_pow!(self, n),
                    Exponent::F(y) => libm::pow(self as f64, y) as Self,
                }
            }
            fn exponent(self) -> Exponent {
                let v = self as u128;
                Exponent::I(if v > i64::MAX as u128 { i64::MAX } else { v as i64 })
            }
        }
    )*};
}

num_signed!(i8, i16, i32, i64);
num_unsigned!(u8, u16, u32, u64);

/// numpy's float `mod`: fmod, moved into the divisor's sign; a zero result
/// takes the divisor's sign too.
macro_rules! py_mod {
    ($a:expr, $b:expr, $fmod:path, $zero:expr) => {{
        let (a, b) = ($a, $b);
        let m = $fmod(a, b);
        if b == $zero {
            m
        } else if m != $zero {
            if (b < $zero) != (m < $zero) {
                m + b
            } else {
                m
            }
        } else {
            $zero.copysign(b)
        }
    }};
}

impl Num for f32 {
    fn add(self, o: Self) -> Self {
        self + o
    }
    fn sub(self, o: Self) -> Self {
        self - o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
    fn div(self, o: Self) -> Self {
        self / o
    }
    fn rem_floor(self, o: Self) -> Self {
        py_mod!(self, o, libm::fmodf, 0.0f32)
    }
    fn rem_trunc(self, o: Self) -> Self {
        libm::fmodf(self, o)
    }
    fn pow(self, e: Exponent) -> Self {
        match e {
            Exponent::I(n) => math::pow(self, n as f32),
            Exponent::F(y) => {
                let y = y as f32;
                // Common exponents without the general power.
                if y == 2.0 {
                    self * self
                } else if y == 1.0 {
                    self
                } else {
                    math::pow(self, y)
                }
            }
        }
    }
    fn exponent(self) -> Exponent {
        Exponent::F(self as f64)
    }
    fn from_usize(n: usize) -> Self {
        n as f32
    }
}

impl Num for f64 {
    fn add(self, o: Self) -> Self {
        self + o
    }
    fn sub(self, o: Self) -> Self {
        self - o
    }
    fn mul(self, o: Self) -> Self {
        self * o
    }
    fn div(self, o: Self) -> Self {
        self / o
    }
    fn rem_floor(self, o: Self) -> Self {
        py_mod!(self, o, libm::fmod, 0.0f64)
    }
    fn rem_trunc(self, o: Self) -> Self {
        libm::fmod(self, o)
    }
    fn pow(self, e: Exponent) -> Self {
        match e {
            Exponent::I(n) => libm::pow(self, n as f64),
            Exponent::F(y) => libm::pow(self, y),
        }
    }
    fn exponent(self) -> Exponent {
        Exponent::F(self)
    }
    fn from_usize(n: usize) -> Self {
        n as f64
    }
}

macro_rules! num_half {
    ($($t:ty),*) => {$(
        impl Num for $t {
            fn add(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() + o.to_f32())
            }
            fn sub(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() - o.to_f32())
            }
            fn mul(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() * o.to_f32())
            }
            fn div(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() / o.to_f32())
            }
            fn rem_floor(self, o: Self) -> Self {
                <$t>::from_f32(Num::rem_floor(self.to_f32(), o.to_f32()))
            }
            fn rem_trunc(self, o: Self) -> Self {
                <$t>::from_f32(libm::fmodf(self.to_f32(), o.to_f32()))
            }
            fn pow(self, e: Exponent) -> Self {
                <$t>::from_f32(Num::pow(self.to_f32(), e))
            }
            fn exponent(self) -> Exponent {
                Exponent::F(self.to_f64())
            }
            fn from_usize(n: usize) -> Self {
                <$t>::from_f32(n as f32)
            }
        }
    )*};
}

num_half!(half::f16, half::bf16);

/// Runs `$body` with `$T` naming the storage type of `$dt`, for the dtypes
/// of a list (`@num`: every numeric dtype, `@float`, `@int`, or an explicit
/// `@list [F32 => f32, ...]`); any other dtype evaluates `$other`.
macro_rules! with_type {
    (@num $dt:expr, $T:ident => $body:expr, _ => $other:expr) => {
        $crate::ops::elementwise::with_type!(@list $dt, [
            F32 => f32, F64 => f64, F16 => half::f16, BF16 => half::bf16,
            I8 => i8, U8 => u8, I16 => i16, U16 => u16,
            I32 => i32, U32 => u32, I64 => i64, U64 => u64
        ], $T => $body, _ => $other)
    };
    (@float $dt:expr, $T:ident => $body:expr, _ => $other:expr) => {
        $crate::ops::elementwise::with_type!(@list $dt, [
            F32 => f32, F64 => f64, F16 => half::f16, BF16 => half::bf16
        ], $T => $body, _ => $other)
    };
    (@int $dt:expr, $T:ident => $body:expr, _ => $other:expr) => {
        $crate::ops::elementwise::with_type!(@list $dt, [
            I8 => i8, U8 => u8, I16 => i16, U16 => u16,
            I32 => i32, U32 => u32, I64 => i64, U64 => u64
        ], $T => $body, _ => $other)
    };
    (@list $dt:expr, [$($d:ident => $ty:ty),*], $T:ident => $body:expr, _ => $other:expr) => {
        match $dt {
            $($crate::DType::$d => {
                #[allow(dead_code)]
                type $T = $ty;
                $body
            })*
            _ => $other,
        }
    };
}
pub(crate) use with_type;

pub(crate) fn unsupported_dtype(what: &'static str, dt: DType) -> Error {
    Error::new(ErrorKind::UnsupportedDType {
        what,
        code: dt.onnx_code(),
    })
}

/// `max` that propagates NaN (numpy `maximum`).
#[inline]
pub(crate) fn max_nan<T: PartialOrd + Copy>(a: T, b: T) -> T {
    match a.partial_cmp(&b) {
        Some(core::cmp::Ordering::Less) => b,
        Some(_) => a,
        None if a.partial_cmp(&a).is_none() => a,
        None => b,
    }
}

/// `min` that propagates NaN (numpy `minimum`).
#[inline]
pub(crate) fn min_nan<T: PartialOrd + Copy>(a: T, b: T) -> T {
    match a.partial_cmp(&b) {
        Some(core::cmp::Ordering::Greater) => b,
        Some(_) => a,
        None if a.partial_cmp(&a).is_none() => a,
        None => b,
    }
}

// ---------------------------------------------------------------------------
// Binary arithmetic.

/// Which arithmetic op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    /// Mod with fmod=0.
    ModFloor,
    /// Mod with fmod=1.
    ModTrunc,
}

fn arith_kernel<T: Num>(bc: Bcast, op: Arith, name: &'static str) -> Result<Prepared> {
    let p = Prepared::single(
        T::DTYPE,
        bc.shape()?,
        kernel(name, move |io| match op {
            Arith::Add => binary::<T, T>(io, &bc, T::add),
            Arith::Sub => binary::<T, T>(io, &bc, T::sub),
            Arith::Mul => binary::<T, T>(io, &bc, T::mul),
            Arith::Div => binary::<T, T>(io, &bc, T::div),
            Arith::ModFloor => binary::<T, T>(io, &bc, T::rem_floor),
            Arith::ModTrunc => binary::<T, T>(io, &bc, T::rem_trunc),
        }),
    );
    Ok(if bc.a_is_out { p.in_place() } else { p })
}

fn prepare_arith(ctx: &PrepareCtx<'_>, op: Arith, name: &'static str) -> Result<Prepared> {
    let a = ctx.input(0)?;
    let dt = a.dtype;
    let b = ctx.input_of(1, dt)?;
    let bc = Bcast::new(a.shape, b.shape)?;
    with_type!(@num dt, T => arith_kernel::<T>(bc, op, name), _ => Err(unsupported_dtype(name, dt)))
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

fn prepare_mod(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let op = match ctx.attr_int("fmod", 0)? {
        0 => Arith::ModFloor,
        1 => Arith::ModTrunc,
        _ => {
            return Err(Error::new(ErrorKind::Attribute {
                name: "fmod",
                problem: "must be 0 or 1",
            }))
        }
    };
    prepare_arith(ctx, op, "Mod")
}

fn pow_kernel<A: Num, B: Num>(bc: Bcast) -> Result<Prepared> {
    let p = Prepared::single(
        A::DTYPE,
        bc.shape()?,
        kernel("Pow", move |io| {
            binary::<A, B>(io, &bc, |x, y| x.pow(y.exponent()))
        }),
    );
    Ok(if bc.a_is_out { p.in_place() } else { p })
}

fn prepare_pow(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let a = ctx.input(0)?;
    let b = ctx.input(1)?;
    let bc = Bcast::new(a.shape, b.shape)?;
    with_type!(@list a.dtype, [
        F32 => f32, F64 => f64, F16 => half::f16, BF16 => half::bf16, I32 => i32, I64 => i64
    ], A => with_type!(@num b.dtype, B => pow_kernel::<A, B>(bc),
        _ => Err(unsupported_dtype("Pow exponent", b.dtype))),
    _ => Err(unsupported_dtype("Pow", a.dtype)))
}

// ---------------------------------------------------------------------------
// Variadic Max, Min, Sum, Mean.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fold {
    Max,
    Min,
    Sum,
    Mean,
}

/// Folds one input into the output: `first` copies, later inputs combine.
/// `strides` is `None` when the input's layout is the output's.
#[inline]
fn fold_into<T: Copy>(
    y: &mut [T],
    x: &[T],
    strides: Option<&[usize; MAX_RANK]>,
    shape: &[usize],
    first: bool,
    f: impl Fn(T, T) -> T,
) -> Result<()> {
    let Some(s) = strides else {
        if first {
            for (o, &v) in y.iter_mut().zip(x) {
                *o = v;
            }
        } else {
            for (o, &v) in y.iter_mut().zip(x) {
                *o = f(*o, v);
            }
        }
        return Ok(());
    };
    let Some((w, [l], starts)) = rows(shape, [*s])? else {
        return Ok(());
    };
    for (yr, [i]) in y.chunks_of_mut(w).zip(starts) {
        match (Row::at(x, i, l, w)?, first) {
            (Row::Run(xr), true) => copy_exact(yr, xr)?,
            (Row::Run(xr), false) => {
                for (o, &v) in yr.iter_mut().zip(xr) {
                    *o = f(*o, v);
                }
            }
            (Row::Rep(v), true) => yr.fill(v),
            (Row::Rep(v), false) => {
                for o in yr.iter_mut() {
                    *o = f(*o, v);
                }
            }
        }
    }
    Ok(())
}

fn fold_kernel<T: Num>(
    out: Vec<usize>,
    strides: Vec<Option<[usize; MAX_RANK]>>,
    lens: Vec<usize>,
    op: Fold,
    name: &'static str,
) -> Prepared {
    let n_out: usize = out.iter().product();
    let shape = out.clone();
    Prepared::single(
        T::DTYPE,
        &out,
        kernel(name, move |io| {
            for (i, (st, &len)) in strides.iter().zip(&lens).enumerate() {
                let x = io.input_slice::<T>(i)?;
                let y = io.output_slice::<T>(0)?;
                if x.len() != len || y.len() != n_out {
                    return Err(len_err());
                }
                let st = st.as_ref();
                match op {
                    Fold::Max => fold_into(y, x, st, &shape, i == 0, max_nan)?,
                    Fold::Min => fold_into(y, x, st, &shape, i == 0, min_nan)?,
                    Fold::Sum | Fold::Mean => fold_into(y, x, st, &shape, i == 0, T::add)?,
                }
            }
            if op == Fold::Mean {
                let d = T::from_usize(lens.len());
                for v in io.output_slice::<T>(0)?.iter_mut() {
                    *v = v.div(d);
                }
            }
            Ok(())
        }),
    )
}

fn prepare_fold(ctx: &PrepareCtx<'_>, op: Fold, name: &'static str) -> Result<Prepared> {
    let x0 = ctx.input(0)?;
    let dt = x0.dtype;
    let mut out: Vec<usize> = x0.shape.to_vec();
    for i in 1..ctx.num_inputs() {
        let x = ctx.input_of(i, dt)?;
        let mut o = [0usize; MAX_RANK];
        let r = broadcast_shapes(&out, x.shape, &mut o)?;
        out = o.get(..r).ok_or(rank_err())?.to_vec();
    }
    let n_out = crate::error::checked_numel(&out)?;
    let mut strides = Vec::with_capacity(ctx.num_inputs());
    let mut lens = Vec::with_capacity(ctx.num_inputs());
    for i in 0..ctx.num_inputs() {
        let x = ctx.input(i)?;
        let len = crate::error::checked_numel(x.shape)?;
        // Same count means only size-1 axes differ: the layouts coincide.
        strides.push((len != n_out).then(|| broadcast_strides(x.shape, &out)));
        lens.push(len);
    }
    match op {
        Fold::Max | Fold::Min => with_type!(@num dt,
            T => Ok(fold_kernel::<T>(out, strides, lens, op, name)),
            _ => Err(unsupported_dtype(name, dt))),
        Fold::Sum | Fold::Mean => with_type!(@float dt,
            T => Ok(fold_kernel::<T>(out, strides, lens, op, name)),
            _ => Err(unsupported_dtype(name, dt))),
    }
}

fn prepare_max(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_fold(ctx, Fold::Max, "Max")
}
fn prepare_min(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_fold(ctx, Fold::Min, "Min")
}
fn prepare_sum(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_fold(ctx, Fold::Sum, "Sum")
}
fn prepare_mean(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_fold(ctx, Fold::Mean, "Mean")
}

// ---------------------------------------------------------------------------
// Unary math.

/// A float element-wise op: `f` for f32 (and f16/bf16, computed in f32 and
/// rounded back), `g` for f64; in place when the planner allows.
pub(crate) fn unary_float<F, G>(
    ctx: &PrepareCtx<'_>,
    name: &'static str,
    f: F,
    g: G,
) -> Result<Prepared>
where
    F: Fn(f32) -> f32 + Copy + Send + Sync + 'static,
    G: Fn(f64) -> f64 + Copy + Send + Sync + 'static,
{
    use half::{bf16, f16};
    let x = ctx.input(0)?;
    let p = match x.dtype {
        DType::F32 => return util::unary_f32(ctx, name, f),
        DType::F64 => Prepared::single(
            DType::F64,
            x.shape,
            kernel(name, move |io| {
                io.unary::<f64>()?.map(g);
                Ok(())
            }),
        ),
        DType::F16 => Prepared::single(
            DType::F16,
            x.shape,
            kernel(name, move |io| {
                io.unary::<f16>()?.map(|v| f16::from_f32(f(v.to_f32())));
                Ok(())
            }),
        ),
        DType::BF16 => Prepared::single(
            DType::BF16,
            x.shape,
            kernel(name, move |io| {
                io.unary::<bf16>()?.map(|v| bf16::from_f32(f(v.to_f32())));
                Ok(())
            }),
        ),
        dt => return Err(unsupported_dtype(name, dt)),
    };
    Ok(p.in_place())
}

fn prepare_sqrt(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_float(ctx, "Sqrt", math::sqrt, libm::sqrt)
}
fn prepare_exp(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_float(ctx, "Exp", math::exp, libm::exp)
}
fn prepare_log(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_float(ctx, "Log", math::ln, libm::log)
}
fn prepare_reciprocal(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_float(ctx, "Reciprocal", |x| 1.0 / x, |x| 1.0 / x)
}
fn prepare_floor(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_float(ctx, "Floor", math::floor, libm::floor)
}
fn prepare_ceil(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_float(ctx, "Ceil", math::ceil, libm::ceil)
}
fn prepare_erf(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    if x.dtype != DType::F32 {
        return unary_float(ctx, "Erf", math::erf, libm::erf);
    }
    Ok(Prepared::single(
        DType::F32,
        x.shape,
        kernel("Erf", |io| {
            erf_f32(io.unary::<f32>()?);
            Ok(())
        }),
    )
    .in_place())
}

/// Erf over f32 values: [`math::erf`] per value (LLVM keeps it a call: its
/// branch on |x| does not vectorize), or with AVX2 + FMA
/// ([`crate::kern::cpu::Kernels::Avx2Fma`]) [`math::erf8_avx2`] on 8
/// lanes, whose fused multiply-adds round differently from the portable
/// form (both within 3 ulp of erf).
#[inline(never)]
fn erf_f32(u: crate::ops::Unary<'_, f32>) {
    #[cfg(target_arch = "x86_64")]
    if crate::kern::cpu::kernels() == crate::kern::cpu::Kernels::Avx2Fma {
        // SAFETY: `Avx2Fma` is selected only when the CPU has AVX2 and FMA.
        return unsafe { map8_avx2(u, |v| math::erf8_avx2(v)) };
    }
    u.map(math::erf);
}

/// Gelu (`approximate = "none"`) over f32 values, as [`erf_f32`]:
/// `0.5 · x · (1 + erf(x / √2))`.
#[inline(never)]
pub(crate) fn gelu_f32(u: crate::ops::Unary<'_, f32>) {
    #[cfg(target_arch = "x86_64")]
    if crate::kern::cpu::kernels() == crate::kern::cpu::Kernels::Avx2Fma {
        // SAFETY: `Avx2Fma` is selected only when the CPU has AVX2 and FMA.
        return unsafe {
            map8_avx2(u, |v| {
                use core::arch::x86_64::*;
                let c = _mm256_set1_ps;
                let e = math::erf8_avx2(_mm256_mul_ps(v, c(core::f32::consts::FRAC_1_SQRT_2)));
                _mm256_mul_ps(_mm256_mul_ps(c(0.5), v), _mm256_add_ps(c(1.0), e))
            })
        };
    }
    u.map(gelu);
}

/// `0.5 · x · (1 + erf(x / √2))` (ONNX Gelu, `approximate = "none"`).
#[inline(always)]
pub(crate) fn gelu(v: f32) -> f32 {
    0.5 * v * (1.0 + math::erf(v * core::f32::consts::FRAC_1_SQRT_2))
}

/// `y = f(x)` 8 floats at a time (a short tail through a zero-padded
/// array).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn map8_avx2(
    u: crate::ops::Unary<'_, f32>,
    f: impl Fn(core::arch::x86_64::__m256) -> core::arch::x86_64::__m256,
) {
    use core::arch::x86_64::*;
    let one = |y: &mut [f32], x: Option<&[f32]>| {
        let mut a = [0f32; 8];
        let n = y.len().min(8);
        let src = x.unwrap_or(y);
        for (d, &s) in a.iter_mut().zip(src.iter().take(n)) {
            *d = s;
        }
        let mut out = [0f32; 8];
        // SAFETY: loads and stores of 8 floats from and into arrays of 8.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), f(_mm256_loadu_ps(a.as_ptr()))) };
        for (d, &s) in y.iter_mut().zip(&out) {
            *d = s;
        }
    };
    match u {
        crate::ops::Unary::Separate(x, y) => {
            let mut yc = y.chunks_exact_mut(8);
            let mut xc = x.chunks_exact(8);
            for (yv, xv) in (&mut yc).zip(&mut xc) {
                if let (Ok(yv), Ok(xv)) = (<&mut [f32; 8]>::try_from(yv), <&[f32; 8]>::try_from(xv))
                {
                    // SAFETY: 8 floats read from and written to arrays of 8.
                    unsafe { _mm256_storeu_ps(yv.as_mut_ptr(), f(_mm256_loadu_ps(xv.as_ptr()))) };
                }
            }
            let y = yc.into_remainder();
            if !y.is_empty() {
                one(y, Some(xc.remainder()));
            }
        }
        crate::ops::Unary::InPlace(y) => {
            let mut yc = y.chunks_exact_mut(8);
            for yv in &mut yc {
                if let Ok(yv) = <&mut [f32; 8]>::try_from(yv) {
                    // SAFETY: 8 floats read and written in an array of 8.
                    unsafe { _mm256_storeu_ps(yv.as_mut_ptr(), f(_mm256_loadu_ps(yv.as_ptr()))) };
                }
            }
            let y = yc.into_remainder();
            if !y.is_empty() {
                one(y, None);
            }
        }
    }
}

macro_rules! sign_fn {
    ($name:ident, $t:ty) => {
        fn $name(x: $t) -> $t {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x // 0 stays 0 (with its sign), NaN stays NaN
            }
        }
    };
}
sign_fn!(sign, f32);
sign_fn!(sign64, f64);

/// x * tanh(softplus(x)), softplus computed without overflow.
fn mish(x: f32) -> f32 {
    let sp = if x > 20.0 {
        x
    } else {
        libm::log1pf(math::exp(x))
    };
    x * math::tanh(sp)
}

fn mish64(x: f64) -> f64 {
    let sp = if x > 40.0 {
        x
    } else {
        libm::log1p(libm::exp(x))
    };
    x * libm::tanh(sp)
}

fn prepare_thresholded_relu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let alpha = ctx.attr_float("alpha", 1.0)?;
    let a64 = alpha as f64;
    unary_float(
        ctx,
        "ThresholdedRelu",
        move |x| if x > alpha { x } else { 0.0 },
        move |x| if x > a64 { x } else { 0.0 },
    )
}

fn prepare_shrink(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let lambd = ctx.attr_float("lambd", 0.5)?;
    let bias = ctx.attr_float("bias", 0.0)?;
    let (l64, b64) = (lambd as f64, bias as f64);
    unary_float(
        ctx,
        "Shrink",
        move |x| {
            if x < -lambd {
                x + bias
            } else if x > lambd {
                x - bias
            } else {
                0.0
            }
        },
        move |x| {
            if x < -l64 {
                x + b64
            } else if x > l64 {
                x - b64
            } else {
                0.0
            }
        },
    )
}

fn prepare_celu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let alpha = ctx.attr_float("alpha", 1.0)?;
    if alpha == 0.0 {
        return Err(Error::new(ErrorKind::Attribute {
            name: "alpha",
            problem: "must not be 0",
        }));
    }
    let a64 = alpha as f64;
    unary_float(
        ctx,
        "Celu",
        move |x| {
            let neg = alpha * (math::exp(x / alpha) - 1.0);
            x.max(0.0) + neg.min(0.0)
        },
        move |x| {
            let neg = a64 * (libm::exp(x / a64) - 1.0);
            x.max(0.0) + neg.min(0.0)
        },
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SignOp {
    Abs,
    Neg,
    Sign,
}

/// Abs / Neg / Sign on integers (wrapping, as two's complement hardware:
/// `|i64::MIN|` stays `i64::MIN`).
fn int_sign_kernel<T: Num>(shape: &[usize], op: SignOp, name: &'static str) -> Prepared {
    let zero = T::from_usize(0);
    let one = T::from_usize(1);
    Prepared::single(
        T::DTYPE,
        shape,
        kernel(name, move |io| {
            io.unary::<T>()?.map(|v| match op {
                SignOp::Neg => zero.sub(v),
                SignOp::Abs if v < zero => zero.sub(v),
                SignOp::Abs => v,
                SignOp::Sign if v > zero => one,
                SignOp::Sign if v < zero => zero.sub(one),
                SignOp::Sign => zero,
            });
            Ok(())
        }),
    )
    .in_place()
}

fn prepare_sign_op(ctx: &PrepareCtx<'_>, op: SignOp, name: &'static str) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let dt = x.dtype;
    if dt.is_float() {
        return match op {
            SignOp::Abs => unary_float(ctx, name, math::abs, libm::fabs),
            SignOp::Neg => unary_float(ctx, name, |v| -v, |v| -v),
            SignOp::Sign => unary_float(ctx, name, sign, sign64),
        };
    }
    with_type!(@int dt, T => Ok(int_sign_kernel::<T>(x.shape, op, name)),
        _ => Err(unsupported_dtype(name, dt)))
}

fn prepare_abs(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_sign_op(ctx, SignOp::Abs, "Abs")
}
fn prepare_neg(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_sign_op(ctx, SignOp::Neg, "Neg")
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
            &[t::<u8>(&[1], &[1]), t::<i8>(&[1], &[1])],
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

    fn bin<T: crate::Element>(op: &str, a: &[T], b: &[T], attrs: Vec<(&str, AttrValue)>) -> Vec<T> {
        let r = run(op, 13, attrs, &[t(&[a.len()], a), t(&[b.len()], b)], 1).unwrap();
        vals::<T>(&r[0])
    }

    #[test]
    fn mod_python_and_c_semantics() {
        let fmod1 = || vec![("fmod", AttrValue::Int(1))];
        // Integers, fmod=0: the divisor's sign (numpy mod).
        assert_eq!(
            bin::<i32>("Mod", &[-4, 7, 5, 4, -7, 8], &[2, -3, 8, -2, 3, 5], vec![]),
            vec![0, -2, 5, 0, 2, 3]
        );
        assert_eq!(
            bin::<i8>("Mod", &[-4, 7, 5, 4, -7, 8], &[2, -3, 8, -2, 3, 5], vec![]),
            vec![0, -2, 5, 0, 2, 3]
        );
        // fmod=1: the dividend's sign (C fmod).
        assert_eq!(
            bin::<i64>("Mod", &[-4, 7, 5, 4, -7, 8], &[2, -3, 8, -2, 3, 5], fmod1()),
            vec![0, 1, 5, 0, -1, 3]
        );
        assert_eq!(
            bin::<u8>("Mod", &[4, 7, 5], &[2, 3, 8], vec![]),
            vec![0, 1, 5]
        );
        // Zero divisors give 0, and MIN % -1 does not trap.
        assert_eq!(bin::<i16>("Mod", &[5, -5], &[0, 0], vec![]), vec![0, 0]);
        assert_eq!(bin::<u64>("Mod", &[5], &[0], fmod1()), vec![0]);
        assert_eq!(bin::<i32>("Mod", &[i32::MIN], &[-1], vec![]), vec![0]);
        // Floats: fmod=1 is C fmod; fmod=0 follows the divisor's sign.
        let x = [-4.3f32, 7.2, 5.0, 4.3, -7.2, 8.0];
        let y = [2.1f32, -3.4, 8.0, -2.1, 3.4, 5.0];
        assert_close(
            &bin::<f32>("Mod", &x, &y, fmod1()),
            &[-0.1, 0.4, 5., 0.1, -0.4, 3.],
            1e-5,
        );
        assert_close(
            &bin::<f32>("Mod", &x, &y, vec![]),
            &[2.0, -3.0, 5., -2.0, 3.0, 3.],
            1e-5,
        );
        let z = bin::<f64>(
            "Mod",
            &[0., -0., -3., 1., f64::INFINITY, 1.],
            &[-2., 2., f64::INFINITY, -f64::INFINITY, 2., 0.],
            vec![],
        );
        assert!(z[0] == 0.0 && z[0].is_sign_negative());
        assert!(z[1] == 0.0 && z[1].is_sign_positive());
        assert_eq!((z[2], z[3]), (f64::INFINITY, f64::NEG_INFINITY));
        assert!(z[4].is_nan() && z[5].is_nan());
        let h =
            |v: &[f32]| -> Vec<half::f16> { v.iter().map(|&x| half::f16::from_f32(x)).collect() };
        let r = bin::<half::f16>("Mod", &h(&[-4.0, 7.0]), &h(&[3.0, -2.0]), vec![]);
        assert_eq!(r, h(&[2.0, -1.0]));
        // Broadcast.
        let r = run(
            "Mod",
            13,
            vec![],
            &[t::<i32>(&[2, 2], &[5, 6, 7, 8]), t::<i32>(&[2], &[3, -4])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![2, -2, 1, 0]);
        assert!(run(
            "Mod",
            13,
            vec![("fmod", AttrValue::Int(2))],
            &[t::<i32>(&[1], &[1]), t::<i32>(&[1], &[1])],
            1
        )
        .is_err());
    }

    #[test]
    fn variadic_max_min_sum_mean() {
        // Three inputs with broadcasting: [2,1], [3], [] -> [2,3].
        let ins = [
            t::<f32>(&[2, 1], &[1., 5.]),
            t::<f32>(&[3], &[0., 3., 6.]),
            t::<f32>(&[], &[2.]),
        ];
        let r = run("Max", 13, vec![], &ins, 1).unwrap();
        assert_eq!(r[0].shape, vec![2, 3]);
        assert_eq!(vals::<f32>(&r[0]), vec![2., 3., 6., 5., 5., 6.]);
        let r = run("Min", 13, vec![], &ins, 1).unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![0., 1., 1., 0., 2., 2.]);
        let r = run("Sum", 13, vec![], &ins, 1).unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![3., 6., 9., 7., 10., 13.]);
        let r = run("Mean", 13, vec![], &ins, 1).unwrap();
        assert_close(
            &vals::<f32>(&r[0]),
            &[1., 2., 3., 7. / 3., 10. / 3., 13. / 3.],
            1e-6,
        );
        // One input is a copy.
        let r = run("Sum", 13, vec![], &[t::<f64>(&[2], &[1.5, -2.])], 1).unwrap();
        assert_eq!(vals::<f64>(&r[0]), vec![1.5, -2.]);
        // NaN propagates from either side (numpy maximum).
        let r = run(
            "Max",
            13,
            vec![],
            &[
                t::<f32>(&[2], &[f32::NAN, 1.]),
                t::<f32>(&[2], &[1., f32::NAN]),
            ],
            1,
        )
        .unwrap();
        assert!(vals::<f32>(&r[0]).iter().all(|v| v.is_nan()));
        // Integers.
        let r = run(
            "Max",
            13,
            vec![],
            &[t::<u16>(&[3], &[1, 60000, 3]), t::<u16>(&[3], &[2, 5, 3])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<u16>(&r[0]), vec![2, 60000, 3]);
        let r = run(
            "Min",
            13,
            vec![],
            &[t::<i8>(&[2], &[-128, 5]), t::<i8>(&[1], &[0])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i8>(&r[0]), vec![-128, 0]);
        // Sum and Mean are float-only; mismatched dtypes fail.
        assert!(run("Sum", 13, vec![], &[t::<i32>(&[1], &[1])], 1).is_err());
        assert!(run(
            "Max",
            13,
            vec![],
            &[t::<f32>(&[1], &[1.]), t::<f64>(&[1], &[1.])],
            1
        )
        .is_err());
    }

    #[test]
    fn int_widths_and_pow_int_base() {
        assert_eq!(bin::<u8>("Add", &[250, 1], &[10, 2], vec![]), vec![4, 3]);
        assert_eq!(bin::<u8>("Sub", &[1], &[2], vec![]), vec![255]);
        assert_eq!(
            bin::<i16>("Mul", &[300, -3], &[300, 7], vec![]),
            vec![24464, -21]
        );
        assert_eq!(
            bin::<i8>("Div", &[-7, 7, 5], &[2, -2, 0], vec![]),
            vec![-3, -3, 0]
        );
        assert_eq!(
            bin::<u64>("Div", &[u64::MAX, 7], &[2, 0], vec![]),
            vec![u64::MAX / 2, 0]
        );
        assert_eq!(bin::<f64>("Div", &[1.], &[3.], vec![]), vec![1. / 3.]);
        let h =
            |v: &[f32]| -> Vec<half::bf16> { v.iter().map(|&x| half::bf16::from_f32(x)).collect() };
        assert_eq!(
            bin::<half::bf16>("Add", &h(&[1.5, 2.]), &h(&[0.25, -4.]), vec![]),
            h(&[1.75, -2.])
        );
        // Pow: integer base with integer and float exponents.
        let r = run(
            "Pow",
            15,
            vec![],
            &[t::<i64>(&[3], &[1, 2, 3]), t::<i64>(&[3], &[4, 5, 6])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![1, 32, 729]);
        let r = run(
            "Pow",
            15,
            vec![],
            &[t::<i32>(&[3], &[2, -1, 3]), t::<i32>(&[3], &[-1, -3, 0])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![0, -1, 1]);
        let r = run(
            "Pow",
            15,
            vec![],
            &[t::<i32>(&[2], &[2, 9]), t::<f32>(&[2], &[1.5, 0.5])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![2, 3]);
        let r = run(
            "Pow",
            15,
            vec![],
            &[t::<f32>(&[2], &[2., 3.]), t::<u64>(&[2], &[3, 2])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![8., 9.]);
        let r = run(
            "Pow",
            15,
            vec![],
            &[t::<f64>(&[1], &[2.]), t::<f64>(&[1], &[0.5])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f64>(&r[0]), vec![core::f64::consts::SQRT_2]);
        assert!(run(
            "Pow",
            15,
            vec![],
            &[t::<u8>(&[1], &[2]), t::<u8>(&[1], &[2])],
            1
        )
        .is_err());
    }

    #[test]
    fn unary_other_float_types() {
        let r = run("Exp", 13, vec![], &[t::<f64>(&[2], &[0., 1.])], 1).unwrap();
        let v = vals::<f64>(&r[0]);
        assert_eq!(v[0], 1.0);
        assert!((v[1] - core::f64::consts::E).abs() < 1e-15);
        let r = run(
            "Log",
            13,
            vec![],
            &[t::<f64>(&[1], &[core::f64::consts::E])],
            1,
        )
        .unwrap();
        assert!((vals::<f64>(&r[0])[0] - 1.0).abs() < 1e-15);
        let r = run(
            "Sqrt",
            13,
            vec![],
            &[t(&[2], &[half::f16::from_f32(4.), half::f16::from_f32(2.)])],
            1,
        )
        .unwrap();
        assert_eq!(
            vals::<half::f16>(&r[0]),
            vec![
                half::f16::from_f32(2.),
                half::f16::from_f32(core::f32::consts::SQRT_2)
            ]
        );
        let r = run(
            "Floor",
            13,
            vec![],
            &[t(
                &[2],
                &[half::bf16::from_f32(-1.5), half::bf16::from_f32(2.5)],
            )],
            1,
        )
        .unwrap();
        assert_eq!(
            vals::<half::bf16>(&r[0]),
            vec![half::bf16::from_f32(-2.), half::bf16::from_f32(2.)]
        );
        let r = run("Sign", 13, vec![], &[t::<f64>(&[3], &[-2., 0., 3.])], 1).unwrap();
        assert_eq!(vals::<f64>(&r[0]), vec![-1., 0., 1.]);
        let r = run("Sign", 13, vec![], &[t::<i32>(&[3], &[-7, 0, 9])], 1).unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![-1, 0, 1]);
        let r = run("Abs", 13, vec![], &[t::<i8>(&[3], &[-7, 0, i8::MIN])], 1).unwrap();
        assert_eq!(vals::<i8>(&r[0]), vec![7, 0, i8::MIN]);
        let r = run("Abs", 13, vec![], &[t::<u8>(&[1], &[200])], 1).unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![200]);
        let r = run("Neg", 13, vec![], &[t::<f64>(&[1], &[2.5])], 1).unwrap();
        assert_eq!(vals::<f64>(&r[0]), vec![-2.5]);
        let r = run(
            "Celu",
            12,
            vec![],
            &[t(
                &[2],
                &[half::f16::from_f32(-1.), half::f16::from_f32(1.)],
            )],
            1,
        )
        .unwrap();
        let v = vals::<half::f16>(&r[0]);
        assert!((v[0].to_f32() - ((-1f32).exp() - 1.0)).abs() < 1e-3);
        assert_eq!(v[1].to_f32(), 1.0);
        assert!(run("Exp", 13, vec![], &[t::<i32>(&[1], &[1])], 1).is_err());
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

    /// Runs `op` with every input unknown at prepare (graph inputs, not
    /// constants), as a session does; returns output 0.
    pub(crate) fn run_with_runtime_inputs(op: &str, opset: i64, inputs: &[Option<Const>]) -> Const {
        use crate::ops::{InputInfo, KernelIo, Loc, PrepareCtx, Slot};
        let n = node(op, inputs.len(), 1, vec![]);
        let infos: Vec<Option<InputInfo<'_>>> = inputs
            .iter()
            .map(|c| {
                c.as_ref().map(|c| InputInfo {
                    dtype: c.dtype,
                    shape: &c.shape,
                    value: None,
                })
            })
            .collect();
        let ctx = PrepareCtx::new(&n, opset, &infos);
        let prep = (crate::ops::find("", op, opset).unwrap().prepare)(&ctx).unwrap();
        let out = &prep.outputs[0];
        let len = out.shape.iter().product::<usize>() * out.dtype.size();
        let mut buf = vec![0u64; len.div_ceil(8).max(1)];
        let mut slots = Vec::new();
        let mut ins = Vec::new();
        let folded: Vec<Const> = inputs.iter().flatten().cloned().collect();
        let mut k = 0u32;
        for c in inputs {
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
        slots.push(Slot {
            dtype: out.dtype,
            shape: out.shape.clone(),
            loc: Loc::Arena { offset: 0, len },
        });
        let outs = [Some(slots.len() as u32 - 1)];
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
            inplace: false,
            shapes: None,
            _arena: core::marker::PhantomData,
        };
        prep.kernel.run(&mut io).unwrap();
        let bytes: &[u8] = bytemuck::cast_slice(&buf);
        let mut c = Const::from_slice::<u8>(&[len], &bytes[..len]).unwrap();
        c.dtype = out.dtype;
        c.shape = out.shape.clone();
        c
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
