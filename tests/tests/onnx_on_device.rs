//! On-device ONNX: `boards/onnx-an386` embeds the plain KWS int8 QDQ
//! `.onnx`, imports, optimizes and plans it on the Cortex-M4F under a heap
//! (embedded-alloc) and runs it under QEMU (mps2-an386); its int8 outputs
//! must equal the host's exactly (the same model through the host's ONNX
//! session and through its compiled `.mote` file). Needs the
//! thumbv7em-none-eabihf target and qemu-system-arm (`.ci/run`).

mod fw_model;

use std::process::Command;
use std::time::{Duration, Instant};

use fw_model::{kws, parse_outputs, qemu_an386, run_ok};
use mote_tests::repo;

#[test]
fn kws_onnx_on_mps2_an386_matches_the_host_exactly() {
    let m = kws();
    let target_dir = repo().join("target/boards");
    let t = Instant::now();
    run_ok(
        Command::new(env!("CARGO"))
            .current_dir(repo().join("boards/onnx-an386"))
            .args(["build", "--release", "--quiet", "--target-dir"])
            .arg(&target_dir)
            .env("MOTE_FW_MODEL_DIR", &m.dir),
        "building boards/onnx-an386",
    );
    let built = t.elapsed();
    let elf = target_dir.join("thumbv7em-none-eabihf/release/mote-fw-onnx-an386");
    let t = Instant::now();
    let (code, console) = qemu_an386(&elf, Duration::from_secs(120));
    eprintln!(
        "onnx-an386: build {built:?}, run {:?}\n{console}",
        t.elapsed()
    );
    assert_eq!(code, Some(0), "the firmware failed:\n{console}");
    let got = parse_outputs(&console);
    assert!(!got.is_empty(), "no output lines:\n{console}");
    assert_eq!(
        got, m.outputs,
        "device outputs differ from the host's:\n{console}"
    );
}
