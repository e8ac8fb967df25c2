//! `cfg(mote_dsp)` on Armv7E-M targets (Cortex-M4/M7, `thumbv7em-*`),
//! whose DSP extension (`SMLAD`, `SXTB16`) the integer column kernel
//! (`src/kern/qcol.rs`) uses; the way the `cortex-m` crate derives its
//! `armv7em` cfg from the target name.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(mote_dsp)");
    println!("cargo::rerun-if-env-changed=TARGET");
    if std::env::var("TARGET").is_ok_and(|t| t.starts_with("thumbv7em")) {
        println!("cargo::rustc-cfg=mote_dsp");
    }
}
