//! `mote compile` and `mote run X.mote` from the command line, on the
//! generated int8 KWS model (scripts/make_quant_models.py).

use std::path::{Path, PathBuf};
use std::process::Command;

use mote_std::compiled::MoteFile;
use mote_std::Tensor;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The generated quantized models (`MOTE_QUANT_MODELS`, else
/// `.cache/quant-models`, generated with the venv's Python if missing).
fn dir() -> PathBuf {
    let d = std::env::var_os("MOTE_QUANT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".cache/quant-models"));
    if !d.join("manifest.json").exists() {
        let py = std::env::var("MOTE_PYTHON").unwrap_or_else(|_| {
            let o = Command::new("bash")
                .arg(repo().join("scripts/venv.sh"))
                .output()
                .expect("scripts/venv.sh");
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .last()
                .unwrap_or("python3")
                .trim()
                .to_string()
        });
        let st = Command::new(py)
            .arg(repo().join("scripts/make_quant_models.py"))
            .arg(&d)
            .status()
            .expect("make_quant_models.py");
        assert!(st.success(), "scripts/make_quant_models.py failed");
    }
    d
}

/// First sample of `<base>.input.npy`.
fn sample(base: &str) -> Tensor {
    let t = mote_std::read_npy(dir().join(format!("{base}.input.npy"))).expect("input npy");
    let shape = t.shape()[1..].to_vec();
    let len = t.bytes().len() / t.shape()[0];
    Tensor::from_bytes(t.dtype(), &shape, &t.bytes()[..len]).expect("sample")
}

fn mote() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mote"))
}

#[test]
fn cli_compile_and_run_match_the_library_run() {
    let tmp = repo().join("target/tmp/compiled-cli");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let model = dir().join("kws.qdq.onnx");
    let out = tmp.join("kws.mote");
    let rs = tmp.join("kws.rs");
    let st = mote()
        .arg("compile")
        .arg(&model)
        .arg("-o")
        .arg(&out)
        .arg("--emit-rust")
        .arg(&rs)
        .output()
        .expect("mote compile");
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let text = std::fs::read_to_string(&rs).expect("emitted module");
    let m = MoteFile::open(&out).expect("open");
    let arena = m.model().expect("model").arena_bytes();
    assert!(text.contains(&format!("pub const ARENA_BYTES: usize = {arena};")));
    assert!(text.contains("include_bytes!(\"kws.mote\")"));
    // `mote run X.mote` on a float input file gives the values of the
    // library run (compiled.rs checks those against the planned session).
    let input = tmp.join("x.npy");
    mote_std::write_npy(&input, &sample("kws").view()).expect("write input");
    let json = |args: &[&std::ffi::OsStr]| -> serde_json::Value {
        let o = mote().args(args).output().expect("mote run");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).expect("json")
    };
    let inp = format!("input={}", input.display());
    let got = json(&[
        "run".as_ref(),
        out.as_os_str(),
        "--input".as_ref(),
        inp.as_ref(),
        "--json".as_ref(),
    ]);
    let vals = got["outputs"][0]["values"]
        .as_array()
        .expect("values")
        .clone();
    assert_eq!(vals.len(), 12);
    // The host library run of the same file on the same input.
    let lib = m.run(&[sample("kws")]).expect("lib run");
    let lib_vals: Vec<f64> = lib[0].to_f64_vec();
    let cli_vals: Vec<f64> = vals.iter().map(|v| v.as_f64().expect("num")).collect();
    assert_eq!(cli_vals, lib_vals);
}

#[test]
fn cli_compile_names_the_node_it_cannot_compile() {
    // A float model has no compiled kernels: a one-line error naming the
    // node, exit code 1, and --ops-report lists every step.
    let model = dir().join("kws.f32.onnx");
    let o = mote()
        .arg("compile")
        .arg(&model)
        .arg("-o")
        .arg(repo().join("target/tmp/never.mote"))
        .output()
        .expect("mote compile");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("node '") && err.contains("no compiled kernel"),
        "{err}"
    );
    let o = mote()
        .arg("compile")
        .arg(&model)
        .arg("--ops-report")
        .output()
        .expect("mote compile --ops-report");
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("NOT COMPILABLE"), "{text}");
    assert!(text.contains("0 of "), "{text}");
}
