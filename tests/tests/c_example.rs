//! The C firmware example: `boards/c-api` (the staticlib with the C API,
//! its header checked against cbindgen) linked by arm-none-eabi-gcc with
//! `boards/c-example` (startup, linker script, semihosting, main.c) around
//! the compiled KWS `.mote`, run under QEMU (mps2-an386); its int8 outputs
//! must equal the host's `.mote` run exactly. Needs the
//! thumbv7em-none-eabihf target, gcc-arm-none-eabi and qemu-system-arm
//! (`.ci/run`).

mod fw_model;

use std::process::Command;
use std::time::{Duration, Instant};

use fw_model::{kws, parse_outputs, qemu_an386, run_ok};
use mote_tests::repo;

#[test]
fn kws_through_the_c_api_on_mps2_an386_matches_the_host_exactly() {
    let m = kws();
    let target_dir = repo().join("target/boards");
    let t = Instant::now();
    // `--features cbindgen`: fails if include/mote.h is not what cbindgen
    // makes of src/lib.rs.
    run_ok(
        Command::new(env!("CARGO"))
            .current_dir(repo().join("boards/c-api"))
            .args(["build", "--release", "--quiet", "--features", "cbindgen"])
            .arg("--target-dir")
            .arg(&target_dir),
        "building boards/c-api",
    );
    let out = repo().join("target/c-example");
    let build = run_ok(
        Command::new("make")
            .current_dir(repo().join("boards/c-example"))
            .arg(format!("MODEL_DIR={}", m.dir.display()))
            .arg(format!(
                "LIB_DIR={}",
                target_dir.join("thumbv7em-none-eabihf/release").display()
            ))
            .arg(format!("OUT={}", out.display()))
            .arg("-B"),
        "building boards/c-example (arm-none-eabi-gcc)",
    );
    let built = t.elapsed();
    let t = Instant::now();
    let (code, console) = qemu_an386(&out.join("c-example.elf"), Duration::from_secs(60));
    eprintln!(
        "c-example: build {built:?}, run {:?}\n{}\n{console}",
        t.elapsed(),
        String::from_utf8_lossy(&build.stdout)
    );
    assert_eq!(code, Some(0), "the firmware failed:\n{console}");
    assert!(
        console.contains(&format!(
            "arena {} of {} bytes",
            m.arena_bytes, m.arena_bytes
        )),
        "the arena line is missing or wrong:\n{console}"
    );
    assert!(
        console.contains(
            "error paths: the session is not initialized, \
             the arena is smaller than the model needs"
        ),
        "the error-path line is missing:\n{console}"
    );
    let got = parse_outputs(&console);
    assert!(!got.is_empty(), "no output lines:\n{console}");
    assert_eq!(
        got, m.outputs,
        "C firmware outputs differ from the host's:\n{console}"
    );
}
