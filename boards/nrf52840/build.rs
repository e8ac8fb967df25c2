//! Finds the model (`MOTE_FW_MODEL_DIR`: `model.rs` and `model.mote` from
//! `mote compile X.onnx -o model.mote --emit-rust model.rs`, and
//! `input.bin`, the quantized input bytes) and sets up the linker script.
//! No model is committed: `boards/build-real.sh` makes one.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=MOTE_FW_MODEL_DIR");
    println!("cargo:rerun-if-changed=memory.x");
    let dir = match std::env::var_os("MOTE_FW_MODEL_DIR") {
        Some(d) => PathBuf::from(d),
        None => fail("MOTE_FW_MODEL_DIR is not set"),
    };
    for f in ["model.rs", "model.mote", "input.bin"] {
        let p = dir.join(f);
        if !p.is_file() {
            fail(&format!("{} is missing", p.display()));
        }
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
    println!("cargo:rustc-env=MOTE_FW_MODEL_DIR_ABS={}", dir.display());

    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    if let Err(e) = std::fs::copy("memory.x", out.join("memory.x")) {
        fail(&format!("cannot copy memory.x: {e}"));
    }
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rustc-link-arg-bins=-Tlink.x");
    if std::env::var_os("CARGO_FEATURE_DEFMT").is_some() {
        println!("cargo:rustc-link-arg-bins=-Tdefmt.x");
    }
}

fn fail(why: &str) -> ! {
    eprintln!(
        "error: {why}.\n\
         This firmware embeds a compiled model from the directory MOTE_FW_MODEL_DIR\n\
         (model.rs and model.mote from `mote compile MODEL.onnx -o DIR/model.mote\n\
         --emit-rust DIR/model.rs`, and input.bin, the int8 input bytes).\n\
         boards/build-real.sh makes one from the KWS test model and builds the boards."
    );
    std::process::exit(1)
}
