// Shared by the board crates' build.rs (`include!`d): copies the model a
// firmware runs into OUT_DIR. `MOTE_FW_MODEL_DIR` names a folder with
// `model.rs` (from `mote compile --emit-rust model.rs`), `model.mote`
// and `input.bin` (input 0 as stored: int8 bytes); see boards/README.md.

fn copy_model_files() {
    println!("cargo:rerun-if-env-changed=MOTE_FW_MODEL_DIR");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let Some(dir) = std::env::var_os("MOTE_FW_MODEL_DIR") else {
        panic!(
            "set MOTE_FW_MODEL_DIR to a folder with model.rs (mote compile --emit-rust), \
             model.mote and input.bin (see boards/README.md)"
        );
    };
    let dir = std::path::PathBuf::from(dir);
    for f in ["model.rs", "model.mote", "input.bin"] {
        let src = dir.join(f);
        println!("cargo:rerun-if-changed={}", src.display());
        std::fs::copy(&src, out.join(f))
            .unwrap_or_else(|e| panic!("copying {}: {e}", src.display()));
    }
}

fn copy_memory_x() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    std::fs::copy("memory.x", out.join("memory.x")).expect("copy memory.x");
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rerun-if-changed=memory.x");
}
