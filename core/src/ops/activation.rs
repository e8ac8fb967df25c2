//! Activation operators: Relu, LeakyRelu, Clip, Sigmoid, HardSigmoid,
//! HardSwish, Tanh, Elu, Selu, Softplus, Softsign, PRelu, Gelu, Swish,
//! Hardmax.

use crate::error::{Error, ErrorKind, Result};
use crate::math::{self, clip};
use crate::ops::elementwise::{binary, unary_float, unsupported_dtype, with_type, Bcast, Num};
use crate::ops::{kernel, OpDef, PrepareCtx, Prepared};
use crate::tensor::ChunksOf as _;
use crate::{DType, Element};

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("Relu", 6, prepare_relu),
    OpDef::onnx("LeakyRelu", 6, prepare_leaky_relu),
    OpDef::onnx("Clip", 6, prepare_clip6),
    OpDef::onnx("Clip", 11, prepare_clip11),
    OpDef::onnx("Sigmoid", 6, prepare_sigmoid),
    OpDef::onnx("HardSigmoid", 6, prepare_hard_sigmoid),
    OpDef::onnx("HardSwish", 14, prepare_hard_swish),
    OpDef::onnx("Tanh", 6, prepare_tanh),
    OpDef::onnx("Elu", 6, prepare_elu),
    OpDef::onnx("Selu", 6, prepare_selu),
    OpDef::onnx("Softplus", 1, prepare_softplus),
    OpDef::onnx("Softsign", 1, prepare_softsign),
    OpDef::onnx("PRelu", 7, prepare_prelu),
    OpDef::onnx("Gelu", 20, prepare_gelu),
    OpDef::onnx("Swish", 24, prepare_swish),
    OpDef::onnx("Hardmax", 1, prepare_hardmax),
];

use crate::ops::util::unary_f32;

fn relu_int<T: Num>(shape: &[usize]) -> Prepared {
    let zero = T::from_usize(0);
    Prepared::single(
        T::DTYPE,
        shape,
        kernel("Relu", move |io| {
            io.unary::<T>()?.map(|v| if v < zero { zero } else { v });
            Ok(())
        }),
    )
    .in_place()
}

fn prepare_relu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    match x.dtype {
        dt if dt.is_int() => with_type!(@list dt, [I8 => i8, I16 => i16, I32 => i32, I64 => i64],
            T => Ok(relu_int::<T>(x.shape)),
            _ => Err(unsupported_dtype("Relu", dt))),
        // NaN stays NaN.
        _ => unary_float(
            ctx,
            "Relu",
            |v| if v < 0.0 { 0.0 } else { v },
            |v| if v < 0.0 { 0.0 } else { v },
        ),
    }
}

fn prepare_leaky_relu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let alpha = ctx.attr_float("alpha", 0.01)?;
    let a64 = alpha as f64;
    unary_float(
        ctx,
        "LeakyRelu",
        move |v| if v < 0.0 { alpha * v } else { v },
        move |v| if v < 0.0 { a64 * v } else { v },
    )
}

/// An activation fused into the op before it (`com.microsoft.FusedConv`,
/// made by the `activation` pass of `optimize::float`): the same f32
/// formulas as the standalone operators.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Act {
    Relu,
    /// `Clip(min, max)`.
    Clip(f32, f32),
    /// `LeakyRelu(alpha)`.
    LeakyRelu(f32),
    Sigmoid,
    Tanh,
    /// `HardSigmoid(alpha, beta)`.
    HardSigmoid(f32, f32),
    HardSwish,
}

impl Act {
    /// From onnxruntime's FusedConv attributes: `activation` and
    /// `activation_params` (Clip: min, max; LeakyRelu: alpha; HardSigmoid:
    /// alpha, beta).
    pub(crate) fn from_attrs(name: &str, params: &[f32]) -> Result<Act> {
        let bad = || {
            Err(Error::new(ErrorKind::Attribute {
                name: "activation_params",
                problem: "wrong count for the activation",
            }))
        };
        Ok(match (name, params) {
            ("Relu", []) => Act::Relu,
            ("Sigmoid", []) => Act::Sigmoid,
            ("Tanh", []) => Act::Tanh,
            ("HardSwish", []) => Act::HardSwish,
            ("Clip", &[lo, hi]) => Act::Clip(lo, hi),
            ("LeakyRelu", &[a]) => Act::LeakyRelu(a),
            ("HardSigmoid", &[a, b]) => Act::HardSigmoid(a, b),
            (
                "Relu" | "Sigmoid" | "Tanh" | "HardSwish" | "Clip" | "LeakyRelu" | "HardSigmoid",
                _,
            ) => return bad(),
            _ => {
                return Err(Error::new(ErrorKind::Attribute {
                    name: "activation",
                    problem:
                        "not one of Relu, Clip, LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish",
                }))
            }
        })
    }

    /// From onnxruntime's FusedGemm attributes: `activation`, and
    /// `activation_alpha` / `activation_beta` (NaN: absent, the operator's
    /// default). No Clip or HardSwish there.
    pub(crate) fn from_gemm_attrs(name: &str, alpha: f32, beta: f32) -> Result<Act> {
        let or = |v: f32, d: f32| if v.is_nan() { d } else { v };
        Ok(match name {
            "Relu" => Act::Relu,
            "Sigmoid" => Act::Sigmoid,
            "Tanh" => Act::Tanh,
            "LeakyRelu" => Act::LeakyRelu(or(alpha, 0.01)),
            "HardSigmoid" => Act::HardSigmoid(or(alpha, 0.2), or(beta, 0.5)),
            _ => {
                return Err(Error::new(ErrorKind::Attribute {
                    name: "activation",
                    problem: "not one of Relu, LeakyRelu, Sigmoid, Tanh, HardSigmoid",
                }))
            }
        })
    }

    /// The attributes [`Act::from_attrs`] reads back.
    pub(crate) fn to_attrs(self) -> (&'static str, alloc::vec::Vec<f32>) {
        match self {
            Act::Relu => ("Relu", alloc::vec![]),
            Act::Sigmoid => ("Sigmoid", alloc::vec![]),
            Act::Tanh => ("Tanh", alloc::vec![]),
            Act::HardSwish => ("HardSwish", alloc::vec![]),
            Act::Clip(lo, hi) => ("Clip", alloc::vec![lo, hi]),
            Act::LeakyRelu(a) => ("LeakyRelu", alloc::vec![a]),
            Act::HardSigmoid(a, b) => ("HardSigmoid", alloc::vec![a, b]),
        }
    }

    /// The activation as a clamp to `(lo, hi)` if it is one (Relu is
    /// `(0, ∞)`): [`math::clip`] with those bounds gives the bits of
    /// [`Act::apply`], so a kernel may apply it as it writes its output
    /// (`sgemm::Epilogue`).
    pub(crate) fn bounds(self) -> Option<(f32, f32)> {
        match self {
            Act::Relu => Some((0.0, f32::INFINITY)),
            Act::Clip(lo, hi) => Some((lo, hi)),
            _ => None,
        }
    }

    /// `p` (a prepared f32 op) with the activation applied to its output 0
    /// after its kernel runs, in the same step (`FusedGemm`; `FusedConv`
    /// applies its activation inside the Conv paths).
    pub(crate) fn fuse(self, name: &'static str, mut p: Prepared) -> Prepared {
        let inner = p.kernel;
        p.kernel = alloc::boxed::Box::new(kernel(name, move |io| {
            inner.run(io)?;
            self.apply(io.output_slice::<f32>(0)?);
            Ok(())
        }));
        p
    }

    /// Errs unless input 0 of the fused op `what` is f32.
    pub(crate) fn check_f32(ctx: &PrepareCtx<'_>, what: &'static str) -> Result<()> {
        match ctx.input(0)?.dtype {
            DType::F32 => Ok(()),
            dt => Err(Error::new(ErrorKind::UnsupportedDType {
                what,
                code: dt.onnx_code(),
            })),
        }
    }

    /// Applies the activation to every value of `y`.
    pub(crate) fn apply(self, y: &mut [f32]) {
        match self {
            // NaN stays NaN.
            Act::Relu => y
                .iter_mut()
                .for_each(|v| *v = if *v < 0.0 { 0.0 } else { *v }),
            Act::Clip(lo, hi) => y.iter_mut().for_each(|v| *v = clip(*v, lo, hi)),
            Act::LeakyRelu(a) => y
                .iter_mut()
                .for_each(|v| *v = if *v < 0.0 { a * *v } else { *v }),
            Act::Sigmoid => y.iter_mut().for_each(|v| *v = math::sigmoid(*v)),
            Act::Tanh => y.iter_mut().for_each(|v| *v = math::tanh(*v)),
            Act::HardSigmoid(a, b) => y.iter_mut().for_each(|v| *v = clip(a * *v + b, 0.0, 1.0)),
            Act::HardSwish => y
                .iter_mut()
                .for_each(|v| *v = *v * clip(*v * (1.0 / 6.0) + 0.5, 0.0, 1.0)),
        }
    }
}

/// Float Clip with constant bounds (f32 values; f64 bounds round to f32,
/// well inside the suite's tolerance).
fn clip_float(ctx: &PrepareCtx<'_>, lo: f32, hi: f32) -> Result<Prepared> {
    if ctx.input(0)?.dtype == DType::F32 && lo == 0.0 && hi == f32::INFINITY {
        return unary_f32(ctx, "Clip", |v| if v < 0.0 { 0.0 } else { v });
    }
    let (l64, h64) = (lo as f64, hi as f64);
    unary_float(
        ctx,
        "Clip",
        move |v| clip(v, lo, hi),
        move |v| clip(v, l64, h64),
    )
}

fn prepare_clip6(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let lo = ctx.attr_float("min", f32::MIN)?;
    let hi = ctx.attr_float("max", f32::MAX)?;
    clip_float(ctx, lo, hi)
}

/// A scalar bound of Clip-11+ (input 1 or 2), as one value.
fn one<T: Copy>(v: Option<alloc::vec::Vec<T>>) -> Result<Option<T>> {
    match v {
        None => Ok(None),
        Some(v) => match v.as_slice() {
            [x] => Ok(Some(*x)),
            _ => Err(Error::new(ErrorKind::Shape(
                "Clip min and max must be scalars",
            ))),
        },
    }
}

fn prepare_clip11(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    for i in [1, 2] {
        if let Some(b) = ctx.opt_input(i) {
            if b.dtype != x.dtype {
                return Err(Error::new(ErrorKind::DTypeMismatch {
                    expected: x.dtype,
                    got: b.dtype,
                }));
            }
            if b.numel() != 1 {
                return Err(Error::new(ErrorKind::Shape(
                    "Clip min and max must be scalars",
                )));
            }
        }
    }
    let runtime = [1, 2]
        .iter()
        .any(|&i| ctx.opt_input(i).is_some_and(|b| b.value.is_none()));
    if runtime {
        let (lo, hi) = (ctx.opt_input(1).is_some(), ctx.opt_input(2).is_some());
        return with_type!(@num x.dtype, T => Ok(clip_runtime::<T>(x.shape, lo, hi)),
            _ => Err(unsupported_dtype("Clip", x.dtype)));
    }
    if x.dtype.is_float() {
        let lo = one(ctx.const_floats(1)?)?.unwrap_or(f32::NEG_INFINITY);
        let hi = one(ctx.const_floats(2)?)?.unwrap_or(f32::INFINITY);
        return clip_float(ctx, lo, hi);
    }
    let lo = one(ctx.const_ints(1)?)?;
    let hi = one(ctx.const_ints(2)?)?;
    with_type!(@int x.dtype, T => Ok(clip_int::<T>(x.shape, lo, hi)),
        _ => Err(unsupported_dtype("Clip", x.dtype)))
}

/// Clip whose bounds are read at each run (graph inputs rather than
/// constants); NaN inputs stay NaN, `min > max` gives `max`.
fn clip_runtime<T: Num>(shape: &[usize], has_lo: bool, has_hi: bool) -> Prepared {
    Prepared::single(
        T::DTYPE,
        shape,
        kernel("Clip", move |io| {
            let bound = |i: usize, present: bool| -> Result<Option<T>> {
                if !present {
                    return Ok(None);
                }
                let v = io.input_slice::<T>(i)?;
                v.first()
                    .copied()
                    .map(Some)
                    .ok_or(Error::new(ErrorKind::Internal("Clip bound")))
            };
            let lo = bound(1, has_lo)?;
            let hi = bound(2, has_hi)?;
            io.unary::<T>()?.map(|v| {
                let y = match lo {
                    Some(l) if v < l => l,
                    _ => v,
                };
                match hi {
                    Some(h) if y > h => h,
                    _ => y,
                }
            });
            Ok(())
        }),
    )
    .in_place()
}

/// Integer Clip; the bounds are constants of the input's dtype, so they
/// convert back exactly.
fn clip_int<T: Element + PartialOrd + TryFrom<i64>>(
    shape: &[usize],
    lo: Option<i64>,
    hi: Option<i64>,
) -> Prepared {
    let lo = lo.and_then(|v| T::try_from(v).ok());
    let hi = hi.and_then(|v| T::try_from(v).ok());
    Prepared::single(
        T::DTYPE,
        shape,
        kernel("Clip", move |io| {
            io.unary::<T>()?.map(|v| {
                let y = match lo {
                    Some(l) if v < l => l,
                    _ => v,
                };
                match hi {
                    Some(h) if y > h => h,
                    _ => y,
                }
            });
            Ok(())
        }),
    )
    .in_place()
}

fn prepare_sigmoid(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_float(ctx, "Sigmoid", math::sigmoid, |v| {
        if v >= 0.0 {
            1.0 / (1.0 + libm::exp(-v))
        } else {
            let e = libm::exp(v);
            e / (1.0 + e)
        }
    })
}

fn prepare_hard_sigmoid(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let alpha = ctx.attr_float("alpha", 0.2)?;
    let beta = ctx.attr_float("beta", 0.5)?;
    let (a64, b64) = (alpha as f64, beta as f64);
    unary_float(
        ctx,
        "HardSigmoid",
        move |v| clip(alpha * v + beta, 0.0, 1.0),
        move |v| clip(a64 * v + b64, 0.0, 1.0),
    )
}

fn prepare_hard_swish(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_float(
        ctx,
        "HardSwish",
        |v| v * clip(v * (1.0 / 6.0) + 0.5, 0.0, 1.0),
        |v| v * clip(v * (1.0 / 6.0) + 0.5, 0.0, 1.0),
    )
}

fn prepare_tanh(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_float(ctx, "Tanh", math::tanh, libm::tanh)
}

fn prepare_elu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let alpha = ctx.attr_float("alpha", 1.0)?;
    let a64 = alpha as f64;
    unary_float(
        ctx,
        "Elu",
        move |v| if v < 0.0 { alpha * libm::expm1f(v) } else { v },
        move |v| if v < 0.0 { a64 * libm::expm1(v) } else { v },
    )
}

fn prepare_selu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let alpha = ctx.attr_float("alpha", 1.673_263_2)?;
    let gamma = ctx.attr_float("gamma", 1.050_701)?;
    let (a64, g64) = (alpha as f64, gamma as f64);
    unary_float(
        ctx,
        "Selu",
        move |v| {
            if v > 0.0 {
                gamma * v
            } else {
                gamma * alpha * libm::expm1f(v)
            }
        },
        move |v| {
            if v > 0.0 {
                g64 * v
            } else {
                g64 * a64 * libm::expm1(v)
            }
        },
    )
}

/// `ln(1 + e^x)` without overflow.
#[inline]
fn softplus(v: f32) -> f32 {
    if v > 0.0 {
        v + libm::log1pf(math::exp(-v))
    } else {
        libm::log1pf(math::exp(v))
    }
}

fn softplus64(v: f64) -> f64 {
    if v > 0.0 {
        v + libm::log1p(libm::exp(-v))
    } else {
        libm::log1p(libm::exp(v))
    }
}

fn prepare_softplus(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_float(ctx, "Softplus", softplus, softplus64)
}

fn prepare_softsign(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    unary_float(
        ctx,
        "Softsign",
        |v| v / (1.0 + math::abs(v)),
        |v| v / (1.0 + libm::fabs(v)),
    )
}

fn prelu_kernel<T: Num>(bc: Bcast) -> Result<Prepared> {
    let zero = T::from_usize(0);
    Ok(Prepared::single(
        T::DTYPE,
        bc.shape()?,
        kernel("PRelu", move |io| {
            binary::<T, T>(io, &bc, |v, s| if v < zero { s.mul(v) } else { v })
        }),
    )
    .in_place())
}

fn prepare_prelu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let slope = ctx.input_of(1, x.dtype)?;
    let bc = Bcast::new(x.shape, slope.shape)?;
    if !bc.a_is_out {
        return Err(Error::new(ErrorKind::Shape(
            "PRelu slope must broadcast to the input shape",
        )));
    }
    with_type!(@num x.dtype, T => prelu_kernel::<T>(bc),
        _ => Err(unsupported_dtype("PRelu", x.dtype)))
}

fn prepare_gelu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    match ctx.attr_str("approximate", "none")? {
        "none" => {
            let x = ctx.input(0)?;
            if x.dtype == DType::F32 {
                // A loop of its own (8 lanes with AVX2 + FMA).
                return Ok(Prepared::single(
                    DType::F32,
                    x.shape,
                    kernel("Gelu", |io| {
                        crate::ops::elementwise::gelu_f32(io.unary::<f32>()?);
                        Ok(())
                    }),
                )
                .in_place());
            }
            unary_float(ctx, "Gelu", crate::ops::elementwise::gelu, |v| {
                0.5 * v * (1.0 + libm::erf(v * core::f64::consts::FRAC_1_SQRT_2))
            })
        }
        "tanh" => {
            // sqrt(2 / pi)
            const K: f32 = 0.797_884_6;
            const K64: f64 = 0.797_884_560_802_865_4;
            unary_float(
                ctx,
                "Gelu",
                |v| 0.5 * v * (1.0 + math::tanh(K * (v + 0.044_715 * v * v * v))),
                |v| 0.5 * v * (1.0 + libm::tanh(K64 * (v + 0.044_715 * v * v * v))),
            )
        }
        _ => Err(Error::new(ErrorKind::Attribute {
            name: "approximate",
            problem: "must be \"none\" or \"tanh\"",
        })),
    }
}

fn prepare_swish(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let alpha = ctx.attr_float("alpha", 1.0)?;
    let a64 = alpha as f64;
    unary_float(
        ctx,
        "Swish",
        move |v| v * math::sigmoid(alpha * v),
        move |v| v / (1.0 + libm::exp(-a64 * v)),
    )
}

/// One-hot of the first maximum along each lane of `len` elements spaced
/// `inner` apart; NaN counts as the maximum (numpy `argmax`).
fn hardmax_kernel<T: Num>(shape: &[usize], outer: usize, len: usize, inner: usize) -> Prepared {
    let zero = T::from_usize(0);
    let one = T::from_usize(1);
    let is_nan = |v: T| v.partial_cmp(&v).is_none();
    Prepared::single(
        T::DTYPE,
        shape,
        kernel("Hardmax", move |io| {
            let x = io.input_slice::<T>(0)?;
            let y = io.output_slice::<T>(0)?;
            let plane = len.checked_mul(inner);
            if x.len() != y.len() || Some(x.len()) != plane.and_then(|p| p.checked_mul(outer)) {
                return Err(Error::new(ErrorKind::Internal("Hardmax length")));
            }
            for v in y.iter_mut() {
                *v = zero;
            }
            if len == 0 || inner == 0 {
                return Ok(());
            }
            // One plane of `len * inner` elements per outer index; lane `i`
            // of a plane is every `inner`-th element from `i`.
            let plane = plane.unwrap_or(0);
            for (xp, yp) in x.chunks_of(plane).zip(y.chunks_of_mut(plane)) {
                for i in 0..inner {
                    let mut lane = xp.iter().skip(i).step_by(inner);
                    let Some(&first) = lane.next() else {
                        return Err(Error::new(ErrorKind::Internal("Hardmax: empty lane")));
                    };
                    let (mut best, mut bv) = (0usize, first);
                    for (k, &v) in (1..).zip(lane) {
                        if v > bv || (is_nan(v) && !is_nan(bv)) {
                            best = k;
                            bv = v;
                        }
                    }
                    // best < len and i < inner: inside the plane.
                    *yp.get_mut(best.saturating_mul(inner).saturating_add(i))
                        .ok_or(Error::new(ErrorKind::Internal(
                            "Hardmax: maximum past the plane",
                        )))? = one;
                }
            }
            Ok(())
        }),
    )
}

fn prepare_hardmax(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let rank = x.shape.len();
    // Before opset 13 the input is coerced to 2-D at `axis` (default 1);
    // from 13 on, the op runs along `axis` alone (default -1).
    let legacy = ctx.opset < 13;
    let r = rank as i64;
    let a = ctx.attr_int("axis", if legacy { 1 } else { -1 })?;
    let a = if a < 0 { a.saturating_add(r) } else { a };
    // The 2-D coercion accepts axis = rank (a trailing size-1 dimension).
    if a < 0 || a > r || (a == r && !legacy) {
        return Err(Error::new(ErrorKind::Attribute {
            name: "axis",
            problem: "axis out of range",
        }));
    }
    let axis = a as usize;
    let (head, tail) = x
        .shape
        .split_at_checked(axis)
        .ok_or(Error::new(ErrorKind::Attribute {
            name: "axis",
            problem: "axis out of range",
        }))?;
    let outer: usize = head.iter().product();
    let (len, inner) = if legacy {
        (tail.iter().product(), 1)
    } else {
        // `a < r` here, so `tail` has the axis first.
        let (&len, rest) = tail.split_first().ok_or(Error::new(ErrorKind::Attribute {
            name: "axis",
            problem: "axis out of range",
        }))?;
        (len, rest.iter().product())
    };
    with_type!(@float x.dtype, T => Ok(hardmax_kernel::<T>(x.shape, outer, len, inner)),
        _ => Err(unsupported_dtype("Hardmax", x.dtype)))
}

#[cfg(test)]
mod tests {
    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;

    fn u(op: &str, opset: i64, attrs: Vec<(&str, AttrValue)>, x: &[f32]) -> Vec<f32> {
        let r = run(op, opset, attrs, &[t(&[x.len()], x)], 1).unwrap();
        assert_eq!(r[0].shape, vec![x.len()]);
        vals::<f32>(&r[0])
    }

    const X: [f32; 5] = [-2.0, -0.5, 0.0, 0.5, 3.0];

    #[test]
    fn relu_family() {
        assert_close(&u("Relu", 14, vec![], &X), &[0., 0., 0., 0.5, 3.], 0.0);
        assert!(u("Relu", 14, vec![], &[f32::NAN])[0].is_nan());
        let r = run("Relu", 14, vec![], &[t::<i64>(&[3], &[-3, 0, 5])], 1).unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![0, 0, 5]);
        let r = run("Relu", 14, vec![], &[t::<i32>(&[2], &[-3, 5])], 1).unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![0, 5]);
        assert_close(
            &u("LeakyRelu", 16, vec![], &X),
            &[-0.02, -0.005, 0., 0.5, 3.],
            0.0,
        );
        assert_close(
            &u("LeakyRelu", 16, vec![("alpha", AttrValue::Float(0.1))], &X),
            &[-0.2, -0.05, 0., 0.5, 3.],
            0.0,
        );
        let r = run("Relu", 14, vec![], &[t::<f32>(&[2, 0], &[])], 1).unwrap();
        assert_eq!(r[0].shape, vec![2, 0]);
    }

    #[test]
    fn clip_attrs_and_inputs() {
        let a = vec![
            ("min", AttrValue::Float(-1.0)),
            ("max", AttrValue::Float(1.0)),
        ];
        assert_close(&u("Clip", 6, a, &X), &[-1., -0.5, 0., 0.5, 1.], 0.0);
        assert_close(
            &u("Clip", 6, vec![("min", AttrValue::Float(0.0))], &X),
            &[0., 0., 0., 0.5, 3.],
            0.0,
        );
        assert_close(&u("Clip", 6, vec![], &X), &X, 0.0);
        // opset 11+: constant inputs; max omitted.
        let r = run(
            "Clip",
            13,
            vec![],
            &[t::<f32>(&[5], &X), t::<f32>(&[], &[-0.25])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[-0.25, -0.25, 0., 0.5, 3.], 0.0);
        // min omitted (None), max given.
        let r = run(
            "Clip",
            13,
            vec![],
            &[t::<f32>(&[5], &X), None, t::<f32>(&[], &[0.5])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[-2., -0.5, 0., 0.5, 0.5], 0.0);
        // Relu6.
        let r = run(
            "Clip",
            13,
            vec![],
            &[
                t::<f32>(&[5], &X),
                t::<f32>(&[], &[0.]),
                t::<f32>(&[], &[6.]),
            ],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[0., 0., 0., 0.5, 3.], 0.0);
        // min > max -> max.
        let r = run(
            "Clip",
            13,
            vec![],
            &[
                t::<f32>(&[2], &[-1., 5.]),
                t::<f32>(&[], &[2.]),
                t::<f32>(&[], &[1.]),
            ],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[1., 1.], 0.0);
        // No bounds.
        let r = run("Clip", 11, vec![], &[t::<f32>(&[5], &X)], 1).unwrap();
        assert_close(&vals::<f32>(&r[0]), &X, 0.0);
        // Integer clip.
        let r = run(
            "Clip",
            13,
            vec![],
            &[
                t::<i64>(&[3], &[-5, 2, 9]),
                t::<i64>(&[], &[0]),
                t::<i64>(&[], &[4]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![0, 2, 4]);
        let r = run(
            "Clip",
            13,
            vec![],
            &[t::<i32>(&[3], &[-5, 2, 9]), None, t::<i32>(&[], &[4])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![-5, 2, 4]);
        // Non-scalar bound and dtype mismatch fail.
        assert!(run(
            "Clip",
            13,
            vec![],
            &[t::<f32>(&[2], &[1., 2.]), t::<f32>(&[2], &[0., 0.])],
            1
        )
        .is_err());
        assert!(run(
            "Clip",
            13,
            vec![],
            &[t::<f32>(&[2], &[1., 2.]), t::<i64>(&[], &[0])],
            1
        )
        .is_err());
    }

    #[test]
    fn clip_run_time_bounds() {
        use crate::ops::elementwise::tests::run_with_runtime_inputs;
        let x = [-3i8, 0, 5, 9];
        let out = run_with_runtime_inputs(
            "Clip",
            13,
            &[t::<i8>(&[4], &x), t::<i8>(&[], &[-1]), t::<i8>(&[], &[6])],
        );
        assert_eq!(vals::<i8>(&out), vec![-1, 0, 5, 6]);
        // Only max given, f32 with a NaN.
        let out = run_with_runtime_inputs(
            "Clip",
            13,
            &[
                t::<f32>(&[3], &[-2., f32::NAN, 4.]),
                None,
                t::<f32>(&[], &[1.]),
            ],
        );
        let v = vals::<f32>(&out);
        assert_eq!((v[0], v[2]), (-2., 1.));
        assert!(v[1].is_nan());
        // min > max gives max.
        let out = run_with_runtime_inputs(
            "Clip",
            13,
            &[
                t::<f64>(&[2], &[-5., 5.]),
                t::<f64>(&[], &[2.]),
                t::<f64>(&[], &[1.]),
            ],
        );
        assert_eq!(vals::<f64>(&out), vec![1., 1.]);
        // Constant int8 bounds, and uint8 with only min.
        let r = run(
            "Clip",
            13,
            vec![],
            &[
                t::<i8>(&[3], &[-128, 0, 127]),
                t::<i8>(&[], &[-5]),
                t::<i8>(&[], &[5]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i8>(&r[0]), vec![-5, 0, 5]);
        let r = run(
            "Clip",
            13,
            vec![],
            &[t::<u8>(&[3], &[1, 7, 200]), t::<u8>(&[], &[7])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![7, 7, 200]);
    }

    #[test]
    fn other_float_types_and_int_relu() {
        let d = [-2.0f64, 0.5];
        let f = |op: &str, opset: i64| -> alloc::vec::Vec<f64> {
            vals::<f64>(&run(op, opset, vec![], &[t(&[2], &d)], 1).unwrap()[0])
        };
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
        let close = |got: &[f64], want: &[f64]| {
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-12, "{g} vs {w}");
            }
        };
        close(&f("Relu", 14), &[0.0, 0.5]);
        close(&f("Sigmoid", 13), &[sig(-2.0), sig(0.5)]);
        close(&f("Tanh", 13), &[(-2f64).tanh(), 0.5f64.tanh()]);
        close(&f("Elu", 6), &[(-2f64).exp() - 1.0, 0.5]);
        close(
            &f("Softplus", 1),
            &[(-2f64).exp().ln_1p(), 0.5f64.exp().ln_1p()],
        );
        close(&f("Softsign", 1), &[-2.0 / 3.0, 0.5 / 1.5]);
        // Attributes are f32 in ONNX; the f64 kernel uses their exact value.
        let (a, b) = (0.01f32 as f64, 0.2f32 as f64);
        close(&f("LeakyRelu", 16), &[-2.0 * a, 0.5]);
        close(&f("HardSigmoid", 6), &[-2.0 * b + 0.5, 0.5 * b + 0.5]);
        let h: alloc::vec::Vec<half::f16> = [-2.0f32, 0.5]
            .iter()
            .map(|&v| half::f16::from_f32(v))
            .collect();
        let r = run("Sigmoid", 13, vec![], &[t(&[2], &h)], 1).unwrap();
        let v = vals::<half::f16>(&r[0]);
        assert!((v[0].to_f32() - sig(-2.0) as f32).abs() < 1e-3);
        let r = run("Relu", 14, vec![], &[t::<i8>(&[3], &[-5, 0, 7])], 1).unwrap();
        assert_eq!(vals::<i8>(&r[0]), vec![0, 0, 7]);
        let r = run(
            "Clip",
            6,
            vec![
                ("min", AttrValue::Float(-1.0)),
                ("max", AttrValue::Float(1.0)),
            ],
            &[t(&[2], &d)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f64>(&r[0]), vec![-1.0, 0.5]);
    }

    #[test]
    fn swish_alpha() {
        let x = [-2.0f32, 0.0, 1.5];
        let want = |a: f64| -> Vec<f32> {
            x.iter()
                .map(|&v| {
                    let v = v as f64;
                    (v / (1.0 + (-a * v).exp())) as f32
                })
                .collect()
        };
        assert_close(&u("Swish", 24, vec![], &x), &want(1.0), 1e-7);
        assert_close(
            &u("Swish", 24, vec![("alpha", AttrValue::Float(0.5))], &x),
            &want(0.5),
            1e-7,
        );
        let d = [-2.0f64, 3.0];
        let r = run("Swish", 24, vec![], &[t(&[2], &d)], 1).unwrap();
        let v = vals::<f64>(&r[0]);
        assert!((v[0] - (-2.0 / (1.0 + 2f64.exp()))).abs() < 1e-12);
        assert!((v[1] - (3.0 / (1.0 + (-3f64).exp()))).abs() < 1e-12);
    }

    #[test]
    fn hardmax_axes_and_opsets() {
        // [2,3]: rows [3,1,3] and [0,2,1]; first maximum wins.
        let x = [3.0f32, 1., 3., 0., 2., 1.];
        let r = run("Hardmax", 13, vec![], &[t(&[2, 3], &x)], 1).unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![1., 0., 0., 0., 1., 0.]);
        let r = run(
            "Hardmax",
            13,
            vec![("axis", AttrValue::Int(0))],
            &[t(&[2, 3], &x)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![1., 0., 1., 0., 1., 0.]);
        // Opset 11, axis 1 of [1,2,3]: one lane over all 6 values.
        let r = run(
            "Hardmax",
            11,
            vec![("axis", AttrValue::Int(1))],
            &[t(&[1, 2, 3], &[0.0f32, 1., 2., 5., 4., 3.])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![0., 0., 0., 1., 0., 0.]);
        // Opset 13 on the same input: lanes along the last axis.
        let r = run(
            "Hardmax",
            13,
            vec![],
            &[t(&[1, 2, 3], &[0.0f32, 1., 2., 5., 4., 3.])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![0., 0., 1., 1., 0., 0.]);
        // NaN counts as the maximum, like numpy argmax.
        let r = run(
            "Hardmax",
            13,
            vec![],
            &[t(&[3], &[1.0f64, f64::NAN, 9.])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f64>(&r[0]), vec![0., 1., 0.]);
        assert!(run(
            "Hardmax",
            13,
            vec![("axis", AttrValue::Int(2))],
            &[t(&[2, 3], &x)],
            1
        )
        .is_err());
    }

    #[test]
    fn sigmoid_tanh_family() {
        let s: Vec<f32> = X
            .iter()
            .map(|&x| 1.0 / (1.0 + libm::exp(-x as f64) as f32))
            .collect();
        assert_close(&u("Sigmoid", 13, vec![], &X), &s, 0.0);
        assert_close(&u("Sigmoid", 13, vec![], &[-100., 100.]), &[0., 1.], 1e-6);
        let th: Vec<f32> = X.iter().map(|&x| libm::tanh(x as f64) as f32).collect();
        assert_close(&u("Tanh", 13, vec![], &X), &th, 0.0);
        assert_close(
            &u("HardSigmoid", 6, vec![], &X),
            &[0.1, 0.4, 0.5, 0.6, 1.0],
            0.0,
        );
        assert_close(
            &u(
                "HardSigmoid",
                6,
                vec![
                    ("alpha", AttrValue::Float(0.5)),
                    ("beta", AttrValue::Float(0.0)),
                ],
                &X,
            ),
            &[0., 0., 0., 0.25, 1.0],
            0.0,
        );
        // x * clip(x/6 + 0.5, 0, 1)
        assert_close(
            &u("HardSwish", 14, vec![], &[-4., -1., 0., 1., 4.]),
            &[0., -1. / 3., 0., 2. / 3., 4.],
            1e-6,
        );
        assert!(crate::ops::find("", "HardSwish", 13).is_none());
    }

    #[test]
    fn elu_selu_softplus_softsign() {
        let e = |x: f32, a: f32| {
            if x < 0.0 {
                a * (libm::exp(x as f64) as f32 - 1.0)
            } else {
                x
            }
        };
        let want: Vec<f32> = X.iter().map(|&x| e(x, 1.0)).collect();
        assert_close(&u("Elu", 6, vec![], &X), &want, 1e-7);
        let want: Vec<f32> = X.iter().map(|&x| e(x, 2.0)).collect();
        assert_close(
            &u("Elu", 6, vec![("alpha", AttrValue::Float(2.0))], &X),
            &want,
            1e-7,
        );
        let (al, ga) = (1.673_263_2_f32, 1.050_701_f32);
        let want: Vec<f32> = X
            .iter()
            .map(|&x| {
                if x > 0.0 {
                    ga * x
                } else {
                    ga * (al * libm::exp(x as f64) as f32 - al)
                }
            })
            .collect();
        assert_close(&u("Selu", 6, vec![], &X), &want, 1e-6);
        let want: Vec<f32> = X
            .iter()
            .map(|&x| libm::log(libm::exp(x as f64) + 1.0) as f32)
            .collect();
        assert_close(&u("Softplus", 1, vec![], &X), &want, 1e-7);
        assert_close(&u("Softplus", 1, vec![], &[100., -100.]), &[100., 0.], 1e-7);
        assert_close(
            &u("Softsign", 1, vec![], &X),
            &[-2. / 3., -1. / 3., 0., 1. / 3., 0.75],
            0.0,
        );
    }

    #[test]
    fn prelu_broadcast() {
        // [2,2,2] input, per-channel slope [2,1,1].
        let x = [-1., 2., -3., 4., -5., 6., -7., 8.];
        let r = run(
            "PRelu",
            16,
            vec![],
            &[t::<f32>(&[2, 2, 2], &x), t::<f32>(&[2, 1, 1], &[0.1, 0.5])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 2, 2]);
        assert_close(
            &vals::<f32>(&r[0]),
            &[-0.1, 2., -0.3, 4., -2.5, 6., -3.5, 8.],
            0.0,
        );
        // Scalar slope.
        let r = run(
            "PRelu",
            16,
            vec![],
            &[t::<f32>(&[3], &[-2., 0., 2.]), t::<f32>(&[1], &[0.25])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[-0.5, 0., 2.], 0.0);
        // Same shape slope.
        let r = run(
            "PRelu",
            16,
            vec![],
            &[t::<f32>(&[2], &[-2., -2.]), t::<f32>(&[2], &[1., 2.])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[-2., -4.], 0.0);
        // Integer and f64 slopes.
        let r = run(
            "PRelu",
            16,
            vec![],
            &[t::<i32>(&[3], &[-4, 0, 4]), t::<i32>(&[], &[3])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![-12, 0, 4]);
        let r = run(
            "PRelu",
            16,
            vec![],
            &[t::<f64>(&[2], &[-4., 1.]), t::<f64>(&[2], &[0.5, 0.5])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f64>(&r[0]), vec![-2., 1.]);
        // Slope that would grow the output is rejected.
        assert!(run(
            "PRelu",
            16,
            vec![],
            &[t::<f32>(&[2], &[1., 2.]), t::<f32>(&[3, 1], &[1., 2., 3.])],
            1
        )
        .is_err());
    }

    #[test]
    fn in_place_paths() {
        use crate::ops::elementwise::tests::run_inplace;
        let x = [-2., -1., 1., 2.];
        assert_close(
            &run_inplace("Relu", 14, &[4], &x, &[]),
            &[0., 0., 1., 2.],
            0.0,
        );
        assert_close(
            &run_inplace("PRelu", 16, &[2, 2], &x, &[t::<f32>(&[2, 1], &[0.5, 0.25])]),
            &[-1., -0.5, 1., 2.],
            0.0,
        );
        assert_close(
            &run_inplace(
                "Clip",
                13,
                &[4],
                &x,
                &[t::<f32>(&[], &[-1.5]), t::<f32>(&[], &[1.5])],
            ),
            &[-1.5, -1., 1., 1.5],
            0.0,
        );
    }

    #[test]
    fn gelu_both_modes() {
        let x = [-3.0f32, -1.0, 0.0, 0.5, 2.0];
        let exact: Vec<f32> = x
            .iter()
            .map(|&v| 0.5 * v * (1.0 + libm::erf(v as f64 / libm::sqrt(2.0)) as f32))
            .collect();
        assert_close(&u("Gelu", 20, vec![], &x), &exact, 1e-6);
        assert_close(&u("Gelu", 20, vec![], &[1.0]), &[0.8413447], 1e-6);
        let k = libm::sqrt(2.0f64 / core::f64::consts::PI);
        let approx: Vec<f32> = x
            .iter()
            .map(|&v| {
                let v = v as f64;
                (0.5 * v * (1.0 + libm::tanh(k * (v + 0.044715 * v * v * v)))) as f32
            })
            .collect();
        assert_close(
            &u(
                "Gelu",
                20,
                vec![("approximate", AttrValue::Str(b"tanh".to_vec()))],
                &x,
            ),
            &approx,
            1e-6,
        );
        assert!(run(
            "Gelu",
            20,
            vec![("approximate", AttrValue::Str(b"fast".to_vec()))],
            &[t::<f32>(&[1], &[1.])],
            1
        )
        .is_err());
        assert!(crate::ops::find("", "Gelu", 19).is_none());
    }
}
