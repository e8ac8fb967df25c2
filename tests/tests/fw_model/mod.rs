//! The model directory of the QEMU firmware tests (`MOTE_FW_MODEL_DIR` of
//! `boards/onnx-an386` and `boards/c-example`), written under `target/` at
//! test time: the KWS int8 QDQ model as `model.onnx`, compiled as
//! `model.mote` with its `--emit-rust` module `model.rs`, and `input.bin`
//! (the samples of the test batch quantized with the compiled model's input
//! scale, one after the other), plus the host's outputs for them (the `.mote` run and the ONNX session run,
//! which must agree).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mote_core::{Model, Session};
use mote_std::compiled::{compile_onnx, emit_rust, MoteFile};
use mote_tests::{generated_dir, repo};

/// A model directory and what the host computes for it.
#[allow(dead_code)]
pub struct FwModel {
    /// The directory (absolute).
    pub dir: PathBuf,
    /// Each output's bytes (int8), from the host, for each input in turn.
    pub outputs: Vec<Vec<u8>>,
    /// `ARENA_BYTES` of the compiled model.
    pub arena_bytes: usize,
}

/// The KWS QDQ model directory (made once per test process).
pub fn kws() -> &'static FwModel {
    static M: OnceLock<FwModel> = OnceLock::new();
    M.get_or_init(|| make("kws.qdq", "kws.input.npy"))
}

fn quant_dir() -> PathBuf {
    generated_dir(
        "MOTE_QUANT_MODELS",
        "quant-models",
        "make_quant_models.py",
        "manifest.json",
    )
}

fn make(stem: &str, input: &str) -> FwModel {
    let src = quant_dir();
    let onnx = src.join(format!("{stem}.onnx"));
    let dir = repo().join("target/fw-models").join(stem);
    std::fs::create_dir_all(&dir).expect("create the model directory");

    let c = compile_onnx(&onnx, &[]).expect("compile the model");
    std::fs::write(dir.join("model.mote"), &c.bytes).expect("write model.mote");
    std::fs::copy(&onnx, dir.join("model.onnx")).expect("copy model.onnx");
    let f = MoteFile::from_bytes(&c.bytes).expect("load the compiled model");
    let m = f.model().expect("compiled model");
    let rs = emit_rust(&m, "model.mote", &onnx.display().to_string()).expect("emit rust");
    std::fs::write(dir.join("model.rs"), rs).expect("write model.rs");

    // The inputs as the firmware gets them: each sample of the test batch
    // quantized with the file's scale, one after the other.
    let x = mote_std::read_npy(src.join(input)).expect("read the input");
    let d = m.input(0).expect("input 0");
    assert!(
        d.quant.is_some(),
        "{stem}: the compiled input is not quantized"
    );
    let shape = d.tensor.shape().to_vec();
    let n: usize = shape.iter().product();
    let xs = x.to_f32_vec();
    assert!(
        !xs.is_empty() && xs.len().is_multiple_of(n),
        "{stem}: {} input values, not a whole number of inputs of {n}",
        xs.len()
    );
    let q: Vec<u8> = xs
        .iter()
        .map(|&v| d.quantize(v).expect("quantized input") as u8)
        .collect();
    std::fs::write(dir.join("input.bin"), &q).expect("write input.bin");

    // The ONNX file as the on-device firmware runs it.
    let bytes = std::fs::read(&onnx).expect("read the model");
    let mut model = Model::from_onnx(&bytes).expect("import");
    mote_core::optimize::int8_io(&mut model);
    let plan = model.session_builder().plan().expect("plan");
    let mut arena = vec![0u128; plan.arena_bytes().div_ceil(16)];
    let arena: &mut [u8] = bytemuck_cast(&mut arena);
    let mut s = Session::new(&model, &plan, arena).expect("session");

    let mut outputs = Vec::new();
    for (xf, xq) in xs.chunks_exact(n).zip(q.chunks_exact(n)) {
        // Host run of the .mote file (float input, quantized the same way).
        let t = mote_std::Tensor::from_bytes(
            mote_core::DType::F32,
            &shape,
            &xf.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
        )
        .expect("input tensor");
        let mote: Vec<Vec<u8>> = f
            .run(&[t])
            .expect("run the compiled model")
            .iter()
            .map(|t| t.bytes().to_vec())
            .collect();
        s.input_mut(0)
            .expect("input")
            .bytes_mut()
            .copy_from_slice(xq);
        s.invoke().expect("invoke");
        let onnx: Vec<Vec<u8>> = (0..s.outputs().len())
            .map(|i| s.output(i).expect("output").bytes().to_vec())
            .collect();
        assert_eq!(
            mote, onnx,
            "{stem}: the host's .mote run and ONNX session run differ"
        );
        outputs.extend(mote);
    }
    FwModel {
        dir,
        outputs,
        arena_bytes: m.arena_bytes(),
    }
}

fn bytemuck_cast(v: &mut [u128]) -> &mut [u8] {
    let len = std::mem::size_of_val(v);
    // SAFETY: u128 has no padding and every byte pattern is a valid u8.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), len) }
}

/// Runs `cmd`, failing the test with its output unless it succeeds.
#[allow(dead_code)]
pub fn run_ok(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `elf` under qemu-system-arm (mps2-an386, semihosting), killing it
/// after `limit`; returns its exit code and console output.
#[allow(dead_code)]
pub fn qemu_an386(elf: &Path, limit: Duration) -> (Option<i32>, String) {
    let mut child = Command::new("qemu-system-arm")
        .args(["-machine", "mps2-an386", "-cpu", "cortex-m4", "-nographic"])
        .args(["-semihosting-config", "enable=on,target=native", "-kernel"])
        .arg(elf)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run qemu-system-arm (apt-get install qemu-system-arm)");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait for qemu").is_some() {
            break;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("qemu output");
            panic!(
                "{} did not finish within {limit:?}:\n{}",
                elf.display(),
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("qemu output");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code(), text)
}

/// The `output <i>: v v v` lines of a firmware's console, as bytes.
#[allow(dead_code)]
pub fn parse_outputs(console: &str) -> Vec<Vec<u8>> {
    console
        .lines()
        .filter_map(|l| l.trim().strip_prefix("output "))
        .map(|rest| {
            let (_, vals) = rest.split_once(':').expect("output line");
            vals.split_whitespace()
                .map(|v| v.parse::<i16>().expect("an integer output value") as u8)
                .collect()
        })
        .collect()
}
