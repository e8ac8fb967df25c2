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

/// Error function: [`erf_vec`] on 64-bit hosts (x86_64, aarch64), where
/// loops over it vectorize; `libm` elsewhere (on a microcontroller the
/// branch-free form would compute both of its halves for every value).
/// Always inlined, so that the loops that call it vectorize.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        erf_vec(x)
    } else {
        libm::erff(x)
    }
}

/// e^x without branches or calls, so that a loop over a slice vectorizes
/// (Softmax's exponentials, [`erf_vec`]): Cody–Waite reduction
/// x = n·ln 2 + r, |r| ≤ ln 2 / 2, Cephes' degree-6 polynomial for e^r, and
/// 2^n put together from its bits. Within 1 ulp of e^x for
/// -86 ≤ x ≤ 88.72 (`tests::exp_vec_error`, a sweep against f64); below
/// -86 it returns 0 where `libm` gives values under 2^-124, above 88.72
/// +∞, and NaN for NaN.
#[inline(always)]
pub(crate) fn exp_vec(x: f32) -> f32 {
    // 1.5 · 2^23: adding it rounds to an integer, kept in the low bits.
    const MAGIC: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const HI: f32 = 88.722_83;
    const LO: f32 = -86.0;
    // NaN fails both comparisons and flows through to the select below
    // (`f32::clamp` would do the same, but carries a panic path for bounds
    // that are NaN or out of order, which constants are not).
    #[allow(clippy::manual_clamp)]
    let xc = if x > HI {
        HI
    } else if x < LO {
        LO
    } else {
        x
    };
    let t = xc * core::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * (r * r) + r + 1.0;
    // 2^(n - 1) from n's bits in t (n in [-124, 128], so the exponent
    // field n + 126 is in [2, 254]); the product by 2 restores 2^n.
    let n_bits = t.to_bits().wrapping_sub(MAGIC.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(126).wrapping_shl(23));
    let y = e * scale * 2.0;
    if x.is_nan() {
        x
    } else if x > HI {
        f32::INFINITY
    } else if x < LO {
        0.0
    } else {
        y
    }
}

/// The error function without branches or calls (a loop over it
/// vectorizes; `libm::erff` branches per value): for |x| < 0.5 its Taylor
/// series to x^13 (truncation under 10^-9), else 1 - erfc(|x|) with
/// erfc from Numerical Recipes' Chebyshev fit (fractional error under
/// 1.2·10^-7) and [`exp_vec`], the sign put back. Within 3 ulp of erf over
/// a sweep of [-6, 6] (`tests::erf_vec_error`).
#[inline(always)]
pub(crate) fn erf_vec(x: f32) -> f32 {
    const T: f32 = core::f32::consts::FRAC_2_SQRT_PI;
    let z = f32::from_bits(x.to_bits() & 0x7fff_ffff);
    let x2 = x * x;
    let mut s = T / 9360.0;
    s = s * x2 - T / 1320.0;
    s = s * x2 + T / 216.0;
    s = s * x2 - T / 42.0;
    s = s * x2 + T / 10.0;
    s = s * x2 - T / 3.0;
    s = s * x2 + T;
    let small = x * s;
    // erf(4) rounds to 1 in f32: larger |x| are clamped (NaN flows on).
    let zc = if z > 4.0 { 4.0 } else { z };
    let t = 1.0 / (1.0 + 0.5 * zc);
    let mut q = 0.170_872_77_f32;
    q = q * t - 0.822_152_23;
    q = q * t + 1.488_515_9;
    q = q * t - 1.135_204;
    q = q * t + 0.278_868_07;
    q = q * t - 0.186_288_06;
    q = q * t + 0.096_784_18;
    q = q * t + 0.374_091_96;
    q = q * t + 1.000_023_7;
    q = q * t - 1.265_512_2;
    let erfc = t * exp_vec(q - zc * zc);
    let large = f32::from_bits((1.0 - erfc).to_bits() | (x.to_bits() & 0x8000_0000));
    if z < 0.5 {
        small
    } else {
        large
    }
}

/// [`erf_vec`] on 8 lanes with AVX2, its polynomials and the reduction of
/// [`exp_vec`] in fused multiply-adds: about half the operations, and
/// results that differ from [`erf_vec`]'s in the last bits (still within
/// 3 ulp of erf over a sweep of [-6, 6], `tests::erf_avx2_error`). NaN
/// lanes stay NaN; |x| > 4 gives ±1.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
// Only ops (feature `alloc`) use it.
#[cfg_attr(not(feature = "alloc"), allow(dead_code))]
pub(crate) fn erf8_avx2(x: core::arch::x86_64::__m256) -> core::arch::x86_64::__m256 {
    use core::arch::x86_64::*;
    const T: f32 = core::f32::consts::FRAC_2_SQRT_PI;
    let c = _mm256_set1_ps;
    let sign = _mm256_and_ps(x, c(-0.0));
    let z = _mm256_andnot_ps(c(-0.0), x);
    // |x| < 0.5: Taylor series, as `erf_vec`.
    let x2 = _mm256_mul_ps(x, x);
    let mut s = c(T / 9360.0);
    for k in [-T / 1320.0, T / 216.0, -T / 42.0, T / 10.0, -T / 3.0, T] {
        s = _mm256_fmadd_ps(s, x2, c(k));
    }
    let small = _mm256_mul_ps(x, s);
    // min(4, z): the second operand (z) when z is NaN, so NaN flows on.
    let zc = _mm256_min_ps(c(4.0), z);
    let t = _mm256_div_ps(c(1.0), _mm256_fmadd_ps(c(0.5), zc, c(1.0)));
    let mut q = c(0.170_872_77);
    for k in [
        -0.822_152_23,
        1.488_515_9,
        -1.135_204,
        0.278_868_07,
        -0.186_288_06,
        0.096_784_18,
        0.374_091_96,
        1.000_023_7,
        -1.265_512_2,
    ] {
        q = _mm256_fmadd_ps(q, t, c(k));
    }
    // q - zc² is in [-17.3, -1.2]: exp_vec's reduction needs no clamp.
    let a = _mm256_fnmadd_ps(zc, zc, q);
    const MAGIC: f32 = 12_582_912.0;
    let tt = _mm256_fmadd_ps(a, c(core::f32::consts::LOG2_E), c(MAGIC));
    let n = _mm256_sub_ps(tt, c(MAGIC));
    let r = _mm256_fnmadd_ps(n, c(0.693_359_4), a);
    let r = _mm256_fnmadd_ps(n, c(-2.121_944_4e-4), r);
    let mut p = c(1.987_569_1e-4);
    for k in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        p = _mm256_fmadd_ps(p, r, c(k));
    }
    let e = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, c(1.0)));
    // 2^n from n's bits in tt (n in [-25, -1]: a normal float).
    let nb = _mm256_sub_epi32(_mm256_castps_si256(tt), _mm256_castps_si256(c(MAGIC)));
    let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        nb,
        _mm256_set1_epi32(127),
    )));
    let erfc = _mm256_mul_ps(t, _mm256_mul_ps(e, scale));
    let large = _mm256_or_ps(_mm256_sub_ps(c(1.0), erfc), sign);
    // z < 0.5 (false for NaN: `large`, which is NaN there).
    let is_small = _mm256_cmp_ps::<_CMP_LT_OQ>(z, c(0.5));
    _mm256_blendv_ps(large, small, is_small)
}

/// `min(max(v, lo), hi)` as the ONNX Clip: `v < lo` gives `lo`, then a value
/// `> hi` gives `hi`, so NaN stays NaN and `lo > hi` gives `hi`. Clip, the
/// fused activations and the GEMM's clamp epilogue all use this one.
// Its users (ops, the f32 GEMM) need feature `alloc`.
#[cfg_attr(not(feature = "alloc"), allow(dead_code))]
#[inline(always)]
pub(crate) fn clip<T: PartialOrd>(v: T, lo: T, hi: T) -> T {
    let y = if v < lo { lo } else { v };
    if y > hi {
        hi
    } else {
        y
    }
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

#[cfg(test)]
mod tests {
    use super::{erf_vec, exp_vec};
    extern crate std;

    /// Distance in units of the last place of `want` (f64) at f32.
    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        let ulp = f64::from(f32::from_bits(w.abs().to_bits() + 1) - w.abs());
        (f64::from(got) - want).abs() / ulp
    }

    /// A sweep of `lo..hi` in `n` steps plus the ends.
    fn sweep(lo: f32, hi: f32, n: u32) -> impl Iterator<Item = f32> {
        (0..=n).map(move |i| lo + (hi - lo) * (i as f32 / n as f32))
    }

    #[test]
    fn exp_vec_error() {
        let mut worst = 0f64;
        for x in sweep(-86.0, 88.72, 2_000_000).chain([0.0, -0.0, 1e-30, -1e-30]) {
            worst = worst.max(ulps(exp_vec(x), libm::exp(f64::from(x))));
        }
        assert!(worst <= 1.0, "exp_vec: {worst} ulp");
        assert_eq!(exp_vec(0.0), 1.0);
        assert_eq!(exp_vec(-87.0), 0.0);
        assert_eq!(exp_vec(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_vec(89.0), f32::INFINITY);
        assert_eq!(exp_vec(f32::INFINITY), f32::INFINITY);
        assert!(exp_vec(f32::NAN).is_nan());
    }

    #[test]
    fn erf_vec_error() {
        let mut worst = 0f64;
        let tiny = [
            0.0, -0.0, 1e-30, -1e-30, 1e-7, -3e-5, 0.4999, 0.5, -0.5, 0.5001,
        ];
        for x in sweep(-6.0, 6.0, 2_000_000).chain(tiny) {
            let want = libm::erf(f64::from(x));
            if want == 0.0 {
                assert_eq!(erf_vec(x), 0.0);
                continue;
            }
            worst = worst.max(ulps(erf_vec(x), want));
        }
        assert!(worst <= 3.0, "erf_vec: {worst} ulp");
        assert_eq!(erf_vec(10.0), 1.0);
        assert_eq!(erf_vec(-10.0), -1.0);
        assert_eq!(erf_vec(f32::INFINITY), 1.0);
        assert_eq!(erf_vec(f32::NEG_INFINITY), -1.0);
        assert!(erf_vec(f32::NAN).is_nan());
    }

    /// erf8_avx2 on the lanes of `xs` (up to 8).
    #[cfg(target_arch = "x86_64")]
    fn erf8(xs: &[f32]) -> [f32; 8] {
        use core::arch::x86_64::*;
        let mut a = [0f32; 8];
        a[..xs.len()].copy_from_slice(xs);
        let mut out = [0f32; 8];
        // SAFETY: the caller checked AVX2 and FMA; loads and stores of 8
        // floats from and into arrays of 8.
        unsafe {
            let v = super::erf8_avx2(_mm256_loadu_ps(a.as_ptr()));
            _mm256_storeu_ps(out.as_mut_ptr(), v);
        }
        out
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn erf_avx2_error() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            std::eprintln!("skipped: this CPU has no AVX2+FMA");
            return;
        }
        let tiny = [
            0.0, -0.0, 1e-30, -1e-30, 1e-7, -3e-5, 0.4999, 0.5, -0.5, 0.5001,
        ];
        let xs: std::vec::Vec<f32> = sweep(-6.0, 6.0, 2_000_000).chain(tiny).collect();
        let mut worst = 0f64;
        for c in xs.chunks(8) {
            for (&x, &got) in c.iter().zip(&erf8(c)) {
                let want = libm::erf(f64::from(x));
                if want == 0.0 {
                    assert_eq!(got, 0.0, "erf8_avx2({x})");
                    continue;
                }
                worst = worst.max(ulps(got, want));
            }
        }
        assert!(worst <= 3.0, "erf8_avx2: {worst} ulp");
        let special = [
            10.0,
            -10.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            4.0,
            -4.0,
        ];
        let got = erf8(&special);
        assert_eq!(&got[..4], &[1.0, -1.0, 1.0, -1.0]);
        assert!(got[4].is_nan());
        assert_eq!((got[5], got[6]), (erf_vec(4.0), erf_vec(-4.0)));
    }
}
