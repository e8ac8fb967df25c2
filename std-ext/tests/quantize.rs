//! `mote quantize` on the shipped digits classifier: the QDQ output runs in
//! onnxruntime and in mote, and keeps held-out accuracy within 2 points.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use mote_proto::Message;
use mote_std::{read_npy, Session, Tensor};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn python() -> String {
    if let Ok(p) = std::env::var("MOTE_PYTHON") {
        return p;
    }
    let out = Command::new("bash")
        .arg(repo().join("scripts/venv.sh"))
        .output()
        .expect("run scripts/venv.sh");
    assert!(out.status.success(), "scripts/venv.sh failed");
    let s = String::from_utf8_lossy(&out.stdout);
    s.lines().last().unwrap_or("python3").trim().to_string()
}

/// `.cache/digits` from `scripts/digits_data.py` (generated once).
fn data() -> PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let d = repo().join(".cache/digits");
        let st = Command::new(python())
            .arg(repo().join("scripts/digits_data.py"))
            .arg(&d)
            .status()
            .unwrap();
        assert!(st.success(), "scripts/digits_data.py failed");
        d
    })
    .clone()
}

fn argmax_accuracy(logits: &[f32], labels: &[i64]) -> f64 {
    let hits = logits
        .chunks(10)
        .zip(labels)
        .filter(|(r, &y)| {
            let best = r
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                )
                .0;
            best as i64 == y
        })
        .count();
    hits as f64 / labels.len() as f64
}

fn mote_logits(model: &Path, x: &Tensor) -> Vec<f32> {
    let mut s = Session::builder(model)
        .input_shape("input", x.shape())
        .build()
        .unwrap();
    s.run(&[("input", x.clone())]).unwrap()[0].to_f32_vec()
}

fn ort_logits(model: &Path, x: &Path, out: &Path) -> Vec<f32> {
    let st = Command::new(python())
        .arg(repo().join("scripts/ort_run.py"))
        .arg(model)
        .arg(x)
        .arg("--out")
        .arg(out)
        .arg("-q")
        .status()
        .unwrap();
    assert!(
        st.success(),
        "onnxruntime could not run {}",
        model.display()
    );
    read_npy(out.join("OUT_0.npy")).unwrap().to_f32_vec()
}

fn check(method: &str, flags: &[&str]) {
    let d = data();
    let tag = format!("{method}{}", flags.join("").replace("--", "_"));
    let work = std::env::temp_dir().join(format!("mote-quantize-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let float = repo().join("models/digits_mlp.onnx");
    let q = work.join("q.onnx");
    let mut args: Vec<String> = vec![
        "quantize".into(),
        float.display().to_string(),
        "--calibration".into(),
        d.join("calib").display().to_string(),
        "--method".into(),
        method.into(),
        "-o".into(),
        q.display().to_string(),
    ];
    args.extend(flags.iter().map(|s| s.to_string()));
    let o = Command::new(env!("CARGO_BIN_EXE_mote"))
        .args(&args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("top-1 agreement"), "{stdout}");

    // A standard QDQ model: int8 weights behind DequantizeLinear, Q/DQ on
    // activations, int32 bias of the Gemm, no float weights left.
    let m = mote_proto::ModelProto::decode(std::fs::read(&q).unwrap().as_slice()).unwrap();
    let g = m.graph.unwrap();
    let count = |op: &str| {
        g.node
            .iter()
            .filter(|n| n.op_type.as_deref() == Some(op))
            .count()
    };
    assert!(count("QuantizeLinear") >= 3, "{tag}");
    assert!(count("DequantizeLinear") >= 7, "{tag}");
    assert_eq!(count("Relu"), 0, "{tag}: Relu folded (asymmetric)");
    let init = |n: &str| g.initializer.iter().find(|t| t.name.as_deref() == Some(n));
    assert!(init("fc1.weight").is_none() && init("fc2.weight").is_none());
    assert_eq!(init("fc1.weight_quantized").unwrap().data_type, Some(3));
    assert_eq!(
        init("fc2.bias_fc2_gemm_quantized").unwrap().data_type,
        Some(6)
    );
    let scale_len = init("fc1.weight_scale").unwrap().dims.clone();
    if flags.contains(&"--per-channel") {
        assert_eq!(scale_len, vec![32]);
    } else {
        assert!(scale_len.is_empty());
    }

    let raw = init("logits_scale").unwrap().raw_data.clone().unwrap();
    let logits_step = f32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
    let xp = d.join("test_x.npy");
    let x = read_npy(&xp).unwrap();
    let y: Vec<i64> = read_npy(d.join("test_y.npy"))
        .unwrap()
        .as_slice::<i64>()
        .unwrap()
        .to_vec();
    let f32_acc = argmax_accuracy(&mote_logits(&float, &x), &y);
    let mote_q = mote_logits(&q, &x);
    let ort_q = ort_logits(&q, &xp, &work.join("ort"));
    let (mote_acc, ort_acc) = (argmax_accuracy(&mote_q, &y), argmax_accuracy(&ort_q, &y));
    let max_diff = mote_q
        .iter()
        .zip(&ort_q)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!(
        "{tag}: f32 {:.2}%  int8 mote {:.2}%  int8 ort {:.2}%  max|mote-ort| {max_diff:.2e}  | {}",
        f32_acc * 100.0,
        mote_acc * 100.0,
        ort_acc * 100.0,
        stdout.lines().last().unwrap_or("")
    );
    assert!(f32_acc > 0.95, "float accuracy {f32_acc}");
    assert!(
        mote_acc >= f32_acc - 0.02,
        "{tag}: int8 {mote_acc} vs f32 {f32_acc}"
    );
    assert!(
        ort_acc >= f32_acc - 0.02,
        "{tag}: ort int8 {ort_acc} vs f32 {f32_acc}"
    );
    // Same QDQ arithmetic in both runtimes: float rounding may move a value
    // across a rounding boundary of the last QuantizeLinear, one step at most.
    assert!(
        max_diff <= logits_step * 1.01,
        "{tag}: mote vs onnxruntime {max_diff} (logits step {logits_step})"
    );
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn minmax_per_tensor() {
    check("minmax", &[]);
}

#[test]
fn minmax_per_channel() {
    check("minmax", &["--per-channel"]);
}

#[test]
fn percentile_per_tensor() {
    check("percentile", &[]);
}

#[test]
fn percentile_per_channel() {
    check("percentile", &["--per-channel"]);
}

#[test]
fn entropy_per_tensor() {
    check("entropy", &[]);
}

#[test]
fn entropy_per_channel() {
    check("entropy", &["--per-channel"]);
}
