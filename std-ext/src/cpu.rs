//! Run-time choice of mote-core's f32 kernels (STYLE.md §5): core picks at
//! compile time; here the CPU is asked once, before the first session.
//!
//! `MOTE_KERNELS=reference` forces the reference loops (to check a result
//! against them, or to rule the optimized kernels out of a bug hunt);
//! `MOTE_KERNELS=blocked` keeps the portable blocked kernels even on an
//! AVX2 CPU or on aarch64 (whose default is the NEON micro-kernel: NEON is
//! baseline there, nothing to detect); `MOTE_KERNELS=avx2` keeps the int8
//! kernels and the f32 GEMM, direct Conv and depthwise planes on AVX2 on a
//! CPU that has AVX-512 VNNI.

use std::sync::Once;

pub use mote_core::cpu::Kernels;

static INIT: Once = Once::new();

/// Detects the CPU and selects core's kernels, once per process (later
/// calls return the first choice). Sessions of this crate call it.
pub fn init() -> Kernels {
    INIT.call_once(|| match std::env::var("MOTE_KERNELS").as_deref() {
        Ok("reference") => mote_core::cpu::force_reference(true),
        Ok("blocked") => mote_core::cpu::force_blocked(),
        Ok("avx2") => {
            detect();
            mote_core::cpu::disable_avx512_vnni();
        }
        _ => detect(),
    });
    mote_core::cpu::kernels()
}

#[cfg(target_arch = "x86_64")]
fn detect() {
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU reports AVX2 and FMA.
        unsafe { mote_core::cpu::enable_avx2_fma() };
        if std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vnni")
        {
            // SAFETY: the CPU reports AVX-512 F, BW and VNNI.
            unsafe { mote_core::cpu::enable_avx512_vnni() };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() {}
