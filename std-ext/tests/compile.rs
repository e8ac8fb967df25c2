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

/// `mote compile --sign` and `mote run --public-key`, with keys from
/// openssl (the tools a model's owner would use); then what firmware's
/// `CompiledModel::from_bytes_verified` refuses.
#[test]
fn signed_models_run_only_with_their_key() {
    use mote_std::mote_core::compiled::{CompiledModel, FLAG_SIGNED, SIGNATURE_LEN};
    let tmp = repo().join("target/tmp/signed-cli");
    std::fs::create_dir_all(&tmp).expect("tmp");
    let openssl = |args: &[&std::ffi::OsStr]| {
        let o = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let key = |name: &str| -> (PathBuf, PathBuf) {
        let (k, p) = (
            tmp.join(format!("{name}.pem")),
            tmp.join(format!("{name}.pub.pem")),
        );
        openssl(&[
            "genpkey".as_ref(),
            "-algorithm".as_ref(),
            "ed25519".as_ref(),
            "-out".as_ref(),
            k.as_os_str(),
        ]);
        openssl(&[
            "pkey".as_ref(),
            "-in".as_ref(),
            k.as_os_str(),
            "-pubout".as_ref(),
            "-out".as_ref(),
            p.as_os_str(),
        ]);
        (k, p)
    };
    let (owner, owner_pub) = key("owner");
    let (_, other_pub) = key("other");
    let out = tmp.join("kws.signed.mote");
    let st = mote()
        .arg("compile")
        .arg(dir().join("kws.qdq.onnx"))
        .arg("-o")
        .arg(&out)
        .arg("--sign")
        .arg(&owner)
        .output()
        .expect("mote compile --sign");
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    assert!(String::from_utf8_lossy(&st.stdout).contains("public key for firmware: [0x"));
    let run = |model: &Path, key: &Path| {
        mote()
            .arg("run")
            .arg(model)
            .arg("--public-key")
            .arg(key)
            .output()
            .expect("mote run")
    };
    let ok = run(&out, &owner_pub);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("signature verified"));
    let bad = run(&out, &other_pub);
    assert!(!bad.status.success());
    let msg = String::from_utf8_lossy(&bad.stderr);
    assert!(
        msg.contains("signature does not match") && msg.lines().count() == 1,
        "{msg}"
    );

    // What the device checks, on the bytes.
    let signed = MoteFile::open(&out).expect("a signed file is a valid model");
    let bytes = signed.bytes().to_vec();
    let pk = mote_std::compiled::read_public_key(&owner_pub).expect("key");
    let other = mote_std::compiled::read_public_key(&other_pub).expect("key");
    let aligned = |b: &[u8]| -> Vec<u128> {
        let mut w = vec![0u128; b.len().div_ceil(16)];
        bytemuck_bytes(&mut w)[..b.len()].copy_from_slice(b);
        w
    };
    let verify = |b: &[u8], k: &[u8; 32]| {
        let w = aligned(b);
        let view = &bytemuck_bytes_ref(&w)[..b.len()];
        CompiledModel::from_bytes_verified(view, k)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    verify(&bytes, &pk).expect("the owner's key");
    assert!(verify(&bytes, &other).unwrap_err().contains("signature"));
    // Every single-bit flip, anywhere (header, records, weights,
    // signature), every 97th bit to keep it short: refused.
    for bit in (0..bytes.len() * 8).step_by(97) {
        let mut b = bytes.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        assert!(verify(&b, &pk).is_err(), "bit {bit} flipped was accepted");
    }
    // The signature stripped (flag cleared, 64 bytes gone): a valid
    // unsigned model, which a verifying device refuses.
    let mut stripped = bytes[..bytes.len() - SIGNATURE_LEN].to_vec();
    let flags = u16::from_le_bytes([stripped[6], stripped[7]]) & !FLAG_SIGNED;
    stripped[6..8].copy_from_slice(&flags.to_le_bytes());
    MoteFile::from_bytes(&stripped).expect("still a model");
    assert!(verify(&stripped, &pk).unwrap_err().contains("not signed"));
    // An unsigned file run with --public-key is refused too.
    let plain = tmp.join("kws.plain.mote");
    std::fs::write(&plain, &stripped).expect("write");
    let r = run(&plain, &owner_pub);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("not signed"));
}

fn bytemuck_bytes(w: &mut [u128]) -> &mut [u8] {
    bytemuck::cast_slice_mut(w)
}

fn bytemuck_bytes_ref(w: &[u128]) -> &[u8] {
    bytemuck::cast_slice(w)
}
