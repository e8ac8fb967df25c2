//! Elementary functions for kernels.
//!
//! By default these are `libm` (accurate to ~1 ulp, inside the ONNX suite's
//! tolerance). With the `fast-math` feature, `micromath` approximations
//! replace the ones where they are much faster; they do not meet rtol 1e-3
//! everywhere: tests compare such a build with [`APPROX_RTOL`] /
//! [`APPROX_ATOL`] (see [`APPROXIMATE`]), and the conformance figures in
//! README are of the default build.

/// Whether this build uses the approximate functions (feature `fast-math`).
pub const APPROXIMATE: bool = cfg!(feature = "fast-math");

/// Relative tolerance that results of an [`APPROXIMATE`] build meet against
/// exact references (the unit tests and the conformance suite saw errors
/// of about 0.1 % from micromath's `exp`, and one unit of the last place
/// on bf16 / f16 outputs; no bound was proven).
pub const APPROX_RTOL: f64 = 1e-2;

/// Absolute tolerance of an [`APPROXIMATE`] build (sums of exponentials
/// that cancel, e.g. log-sum-exp near 0).
pub const APPROX_ATOL: f64 = 1e-3;

/// e^x
#[inline]
pub fn exp(x: f32) -> f32 {
    #[cfg(feature = "fast-math")]
    {
        micromath::F32Ext::exp(x)
    }
    #[cfg(not(feature = "fast-math"))]
    {
        libm::expf(x)
    }
}

/// Natural logarithm.
#[inline]
pub fn ln(x: f32) -> f32 {
    libm::logf(x)
}

/// Square root.
#[inline]
pub fn sqrt(x: f32) -> f32 {
    libm::sqrtf(x)
}

/// Hyperbolic tangent.
#[inline]
pub fn tanh(x: f32) -> f32 {
    #[cfg(feature = "fast-math")]
    {
        let e = exp(2.0 * x);
        if x > 9.0 {
            return 1.0;
        }
        if x < -9.0 {
            return -1.0;
        }
        (e - 1.0) / (e + 1.0)
    }
    #[cfg(not(feature = "fast-math"))]
    {
        libm::tanhf(x)
    }
}

/// Error function.
#[inline]
pub fn erf(x: f32) -> f32 {
    libm::erff(x)
}

/// x^y
#[inline]
pub fn pow(x: f32, y: f32) -> f32 {
    libm::powf(x, y)
}

/// Logistic sigmoid, stable for large |x|.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + exp(-x))
    } else {
        let e = exp(x);
        e / (1.0 + e)
    }
}

/// Floor.
#[inline]
pub fn floor(x: f32) -> f32 {
    libm::floorf(x)
}

/// Ceiling.
#[inline]
pub fn ceil(x: f32) -> f32 {
    libm::ceilf(x)
}

/// Round half to even (ONNX `Round`, numpy `rint`).
#[inline]
pub fn round_even(x: f32) -> f32 {
    libm::rintf(x)
}

/// Absolute value.
#[inline]
pub fn abs(x: f32) -> f32 {
    libm::fabsf(x)
}
