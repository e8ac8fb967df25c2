//! With feature `cbindgen`: generates the C header from src/lib.rs and
//! checks it against the committed include/mote.h (MOTE_UPDATE_HEADER=1
//! rewrites it). Without: nothing (the committed header is used as is).

fn main() {
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=include/mote.h");
    println!("cargo:rerun-if-env-changed=MOTE_UPDATE_HEADER");
    #[cfg(feature = "cbindgen")]
    header();
}

#[cfg(feature = "cbindgen")]
fn header() {
    let dir = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let fail = |why: String| -> ! {
        eprintln!("error: {why}");
        std::process::exit(1)
    };
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| fail(format!("cbindgen.toml: {e}")));
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .unwrap_or_else(|e| fail(format!("cbindgen: {e}")));
    let mut text = Vec::new();
    bindings.write(&mut text);
    let path = dir.join("include/mote.h");
    if std::env::var_os("MOTE_UPDATE_HEADER").is_some() {
        if let Err(e) =
            std::fs::create_dir_all(dir.join("include")).and_then(|_| std::fs::write(&path, &text))
        {
            fail(format!("cannot write {}: {e}", path.display()));
        }
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    if committed != text {
        fail(format!(
            "{} is out of date with src/lib.rs: rebuild with MOTE_UPDATE_HEADER=1 and commit it",
            path.display()
        ));
    }
}
