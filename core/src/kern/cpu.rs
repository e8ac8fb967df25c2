//! Which f32 kernels run: the portable reference loops, or a register-blocked
//! overlay for the CPU (STYLE.md §5).
//!
//! no_std builds decide at compile time: the blocked kernels are the default
//! on 64-bit hosts (x86_64, aarch64), AVX2+FMA when the build targets it
//! (`-C target-feature=+avx2,+fma`), NEON on aarch64 (baseline there: every
//! aarch64 Linux target has it, so no run-time check); microcontrollers keep
//! the reference loops, which need no stack tile. std builds detect the CPU
//! at run time (mote-std does it once, before its first session) and honour
//! `MOTE_KERNELS=reference`, so that any result can be checked against the
//! reference path, and `MOTE_KERNELS=blocked` ([`force_blocked`]), to rule
//! the SIMD micro-kernels out.

use core::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// The f32 kernel family in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kernels {
    /// The portable reference loops (every target).
    Reference,
    /// Register-blocked GEMM in portable Rust (64-bit hosts).
    Blocked,
    /// Register-blocked GEMM with AVX2 + FMA micro-kernels (x86_64).
    Avx2Fma,
    /// Register-blocked GEMM with NEON micro-kernels (aarch64).
    Neon,
}

const UNSET: u8 = 0;
const REFERENCE: u8 = 1;
const BLOCKED: u8 = 2;
const AVX2_FMA: u8 = 3;
const NEON: u8 = 4;

static SELECTED: AtomicU8 = AtomicU8::new(UNSET);

const fn default_code() -> u8 {
    if cfg!(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )) {
        AVX2_FMA
    } else if cfg!(all(target_arch = "aarch64", target_feature = "neon")) {
        NEON
    } else if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        BLOCKED
    } else {
        REFERENCE
    }
}

/// The kernels f32 GEMM-shaped ops (MatMul, Gemm, Conv) use now.
pub fn kernels() -> Kernels {
    let code = match SELECTED.load(Ordering::Relaxed) {
        UNSET => default_code(),
        c => c,
    };
    match code {
        AVX2_FMA => Kernels::Avx2Fma,
        NEON => Kernels::Neon,
        BLOCKED => Kernels::Blocked,
        _ => Kernels::Reference,
    }
}

/// Forces the reference kernels (`true`), or goes back to the default of
/// this build (`false`). f32 results of the two differ only by float
/// rounding order (within the ONNX tolerance); the integer kernels switch
/// too (on 64-bit hosts) and give the same bytes either way.
pub fn force_reference(on: bool) {
    SELECTED.store(if on { REFERENCE } else { UNSET }, Ordering::Relaxed);
}

/// Selects the portable blocked kernels (no SIMD intrinsics) on 64-bit
/// hosts, even where this build defaults to AVX2+FMA or NEON; a no-op on
/// other targets (they keep their default). [`force_reference`]`(false)`
/// goes back to the default.
pub fn force_blocked() {
    if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        SELECTED.store(BLOCKED, Ordering::Relaxed);
    }
}

/// Selects the AVX2 + FMA micro-kernels; a no-op on other architectures.
///
/// # Safety
/// The CPU running the process must support AVX2 and FMA (std builds check
/// with `is_x86_feature_detected!`), else the next f32 GEMM executes
/// instructions the CPU does not have.
pub unsafe fn enable_avx2_fma() {
    if cfg!(target_arch = "x86_64") {
        SELECTED.store(AVX2_FMA, Ordering::Relaxed);
    }
}

/// Whether the int8 GEMM may use AVX-512 VNNI (`vpdpbusd`): the build
/// targets it, or [`enable_avx512_vnni`] was called.
static VNNI: AtomicBool = AtomicBool::new(cfg!(all(
    target_arch = "x86_64",
    target_feature = "avx512f",
    target_feature = "avx512bw",
    target_feature = "avx512vnni"
)));

/// Whether the AVX-512 kernels run: the int8 ones (the GEMM's VNNI
/// micro-kernel, depthwise loops compiled for AVX-512 BW), the f32
/// GEMM's 12 × 32 micro-kernel on B packed at prepare (`sgemm::ukr_avx512`,
/// the same bits as the AVX2 one), the f32 direct Conv's 16-lane tiles
/// (`dconv`) and the f32 depthwise planes of `dw512` (AVX-512 F):
/// selected, and the f32 kernels are
/// AVX2+FMA (forcing the reference or the portable kernels turns it off
/// too).
pub fn avx512_vnni() -> bool {
    cfg!(target_arch = "x86_64") && VNNI.load(Ordering::Relaxed) && kernels() == Kernels::Avx2Fma
}

/// Lets the int8 kernels use AVX-512: the GEMM multiplies with VNNI (u8 ×
/// s8 products, four k steps per instruction, with zero-point corrections)
/// and depthwise loops are compiled for AVX-512 BW; the same bits as the
/// other kernels. Effective while [`kernels`] is [`Kernels::Avx2Fma`].
///
/// # Safety
/// The CPU running the process must support AVX-512 F, BW and VNNI (std
/// builds check with `is_x86_feature_detected!`).
pub unsafe fn enable_avx512_vnni() {
    if cfg!(target_arch = "x86_64") {
        VNNI.store(true, Ordering::Relaxed);
    }
}

/// Keeps the int8 kernels on AVX2 even where AVX-512 VNNI is available
/// (`MOTE_KERNELS=avx2`, and tests comparing the two).
pub fn disable_avx512_vnni() {
    VNNI.store(false, Ordering::Relaxed);
}

/// Defines a function whose body is compiled twice, once for the build's
/// baseline and once for AVX2 + FMA on x86_64, and runs the second when
/// [`kernels`] is [`Kernels::Avx2Fma`]: loops that autovectorize then run
/// on 8 lanes instead of 4 without intrinsics. Bodies must not rely on
/// `a * b + c` being fused (Rust never contracts it), so both versions
/// give the same bits. Arguments are plain `name: Type` pairs (no
/// patterns, no generics); attributes before `fn` go to the outer function.
// Only ops (feature `alloc`) use it.
#[cfg_attr(not(feature = "alloc"), allow(unused_macros))]
macro_rules! avx2_variant {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $t:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $t),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $t),*) $(-> $ret)? $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2($($arg: $t),*) $(-> $ret)? {
                body($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            if $crate::kern::cpu::kernels() == $crate::kern::cpu::Kernels::Avx2Fma {
                // SAFETY: `Avx2Fma` is selected only when the CPU has AVX2
                // and FMA (see `cpu::enable_avx2_fma`) or the build targets
                // them.
                return unsafe { avx2($($arg),*) };
            }
            body($($arg),*)
        }
    };
}
#[cfg_attr(not(feature = "alloc"), allow(unused_imports))]
pub(crate) use avx2_variant;
