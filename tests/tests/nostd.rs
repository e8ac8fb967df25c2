//! mote-core builds for bare-metal targets: without `alloc` for
//! thumbv6m (Cortex-M0) and thumbv7em (Cortex-M4F), and with `alloc` for
//! thumbv7em; and its compiled-model runtime links with no panic path.
//! Needs the targets installed (`.ci/run` adds them).

use std::process::Command;

fn build(target: &str, default_features: bool) {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(mote_tests::repo())
        .args(["build", "--quiet", "-p", "mote-core", "--target", target])
        .env("CARGO_TARGET_DIR", mote_tests::repo().join("target/nostd"));
    if !default_features {
        cmd.arg("--no-default-features");
    }
    let out = cmd.output().expect("run cargo");
    assert!(
        out.status.success(),
        "mote-core failed to build for {target} (default features: {default_features}):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn core_builds_no_std_thumbv6m() {
    build("thumbv6m-none-eabi", false);
}

#[test]
fn core_builds_no_std_thumbv7em() {
    build("thumbv7em-none-eabihf", false);
}

#[test]
fn core_builds_no_std_with_alloc_thumbv7em() {
    build("thumbv7em-none-eabihf", true);
}

/// Running a compiled model cannot panic: `boards/nopanic` drives every
/// entry point of `CompiledModel` / `CompiledSession` on bytes the
/// optimizer cannot see, and its panic handler calls a symbol defined
/// nowhere, so the firmware links only if no panic (bounds check,
/// division by zero, `unwrap`, failed `copy_from_slice`) is reachable.
/// Checked for every Cortex-M core the boards use, release profile.
#[test]
fn compiled_runtime_has_no_panic_path() {
    let _g = NOPANIC.lock().unwrap_or_else(|e| e.into_inner());
    for target in [
        "thumbv6m-none-eabi",
        "thumbv7m-none-eabi",
        "thumbv7em-none-eabihf",
        "thumbv8m.main-none-eabihf",
    ] {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.current_dir(mote_tests::repo().join("boards/nopanic"))
            .args(["build", "--release", "--quiet", "--target", target])
            .env(
                "CARGO_TARGET_DIR",
                mote_tests::repo().join("target/boards/nopanic"),
            );
        // The crate's .cargo/config.toml sets `-Tlink.x`; the host build's
        // RUSTFLAGS would replace it.
        for v in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_BUILD_RUSTFLAGS",
        ] {
            cmd.env_remove(v);
        }
        let out = cmd.output().expect("run cargo");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{target}: a panic is reachable in the compiled-model runtime \
             (`bash boards/nopanic/sites.sh {target}` lists where):\n{err}"
        );
    }
}

static NOPANIC: std::sync::Mutex<()> = std::sync::Mutex::new(());
