//! mote-core builds for bare-metal targets: without `alloc` for
//! thumbv6m (Cortex-M0) and thumbv7em (Cortex-M4F), and with `alloc` for
//! thumbv7em. Needs the targets installed (`.ci/run` adds them).

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
