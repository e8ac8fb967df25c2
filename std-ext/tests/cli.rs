//! End-to-end checks of the `mote` binary on tiny models built here.

use std::path::{Path, PathBuf};
use std::process::Command;

use mote_proto::{tensor_shape_proto::dimension, tensor_shape_proto::Dimension, type_proto, *};

fn vi(name: &str, dims: &[Result<i64, &str>]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Ok(v) => dimension::Value::DimValue(*v),
                Err(p) => dimension::Value::DimParam(p.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A float initializer.
fn init(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        dims: dims.to_vec(),
        data_type: Some(1),
        float_data: v.to_vec(),
        name: Some(name.into()),
        ..Default::default()
    }
}

/// A default-domain node with one output.
fn node(name: &str, op: &str, ins: &[&str], out: &str) -> NodeProto {
    NodeProto {
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        name: Some(name.into()),
        op_type: Some(op.into()),
        ..Default::default()
    }
}

/// Writes an opset-13 model of `graph` to `dir/file`.
fn write_model(dir: &Path, file: &str, graph: GraphProto) -> PathBuf {
    let m = ModelProto {
        ir_version: Some(8),
        producer_name: Some("mote-test".into()),
        opset_import: vec![OperatorSetIdProto {
            version: Some(13),
            ..Default::default()
        }],
        graph: Some(graph),
        ..Default::default()
    };
    let p = dir.join(file);
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    p
}

/// y = x + b, x: float [batch, 4]; `op` replaces Add to test unsupported ops.
fn model(dir: &Path, file: &str, op: &str) -> PathBuf {
    let graph = GraphProto {
        node: vec![node("add1", op, &["x", "b"], "out/0")],
        name: Some("g".into()),
        initializer: vec![init("b", &[4], &[1.0, 2.0, 3.0, 4.0])],
        input: vec![vi("x", &[Err("batch"), Ok(4)])],
        output: vec![vi("out/0", &[Err("batch"), Ok(4)])],
        ..Default::default()
    };
    write_model(dir, file, graph)
}

/// A folder for one test's files, removed when the test drops it.
fn dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("mote-cli-test-")
        .tempdir()
        .unwrap()
}

fn mote(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_mote"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

#[test]
fn inspect_and_run_add_model() {
    let td = dir();
    let d = td.path();
    let m = model(d, "add.onnx", "Add");
    let m = m.to_str().unwrap();
    let (rc, out, err) = mote(&["inspect", m]);
    assert_eq!(rc, 0, "{out}{err}");
    assert!(
        out.contains("note: dim 'batch' not bound, using 1 (--dim batch=N)"),
        "{out}"
    );
    let (rc, out, err) = mote(&["inspect", m, "--dim", "batch=3", "--json"]);
    assert_eq!(rc, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["inputs"][0]["shape"], serde_json::json!([3, 4]));
    assert_eq!(v["parameters"], 4);
    assert_eq!(v["op_counts"]["Add"], 1);

    let odir = d.join("outs");
    let (rc, out, err) = mote(&["run", m, "--output-dir", odir.to_str().unwrap(), "--json"]);
    assert_eq!(rc, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let o = &v["outputs"][0];
    assert_eq!(o["name"], "out/0");
    assert_eq!(o["top5"][0][0], 3);
    let x = mote_std::read_npy(odir.join("out_0.npy")).unwrap();
    assert_eq!(x.shape(), &[1, 4]);
    assert!(err.contains("random (seed 42)"), "{err}");

    // Given input; then a dtype mismatch and an unknown name.
    let xin = d.join("x.npy");
    mote_std::write_npy(
        &xin,
        &mote_std::Tensor::from_f32(&[2, 4], vec![0.0; 8])
            .unwrap()
            .view(),
    )
    .unwrap();
    let (rc, out, err) = mote(&["run", m, "--input", &format!("x={}", xin.display())]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("[2,4]") && !out.contains("top5"), "{out}");
    let xi = d.join("xi.npy");
    mote_std::write_npy(
        &xi,
        &mote_std::Tensor::from_slice::<i64>(&[1, 4], &[0; 4])
            .unwrap()
            .view(),
    )
    .unwrap();
    let (rc, _, err) = mote(&["run", m, "--input", &format!("x={}", xi.display())]);
    assert_eq!(rc, 1);
    assert_eq!(
        err.trim(),
        "error: input 'x': expected float32 [batch,4], got int64 [1,4]"
    );
    let (rc, _, err) = mote(&["run", m, "--input", &format!("nope={}", xin.display())]);
    assert_eq!(rc, 1);
    assert!(err.contains("unknown input 'nope'"), "{err}");
}

#[test]
fn unsupported_op_names_the_node() {
    let td = dir();
    let d = td.path();
    let m = model(d, "bad.onnx", "NoSuchOp");
    let (rc, _, err) = mote(&["run", m.to_str().unwrap()]);
    assert_eq!(rc, 1);
    assert!(
        err.starts_with("error: ") && err.contains("add1") && err.contains("NoSuchOp"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn bad_files_are_one_line_errors() {
    let td = dir();
    let d = td.path();
    let good = model(d, "trunc_src.onnx", "Add");
    let bytes = std::fs::read(&good).unwrap();
    let t = d.join("trunc.onnx");
    std::fs::write(&t, &bytes[..bytes.len() / 2]).unwrap();
    let g = d.join("garbage.onnx");
    std::fs::write(&g, b"hi\n").unwrap();
    for f in [t, g, d.join("missing.onnx")] {
        let (rc, _, err) = mote(&["inspect", f.to_str().unwrap()]);
        assert_eq!(rc, 1, "{err}");
        assert!(
            err.starts_with("error: ") && err.lines().count() == 1,
            "{err}"
        );
    }
    let bad = d.join("bad.npy");
    std::fs::write(&bad, b"nope").unwrap();
    let (rc, _, err) = mote(&[
        "run",
        good.to_str().unwrap(),
        "--input",
        &format!("x={}", bad.display()),
    ]);
    assert_eq!(rc, 1);
    assert!(err.contains("not a valid npy"), "{err}");
}

fn digits_mlp() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/digits_mlp.onnx")
        .display()
        .to_string()
}

#[test]
fn bench_json_reports_every_field() {
    let m = digits_mlp();
    let (rc, out, err) = mote(&["bench", &m, "--iters", "5", "--warmup", "1", "--json"]);
    assert_eq!(rc, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for k in [
        "model",
        "threads",
        "iters",
        "warmup",
        "min_ms",
        "median_ms",
        "p90_ms",
        "p99_ms",
        "ips",
        "arena_bytes",
        "peak_rss_bytes",
    ] {
        assert!(v.get(k).is_some(), "no '{k}' in {v}");
    }
    assert_eq!(v["model"], m.as_str());
    assert_eq!(
        (&v["threads"], &v["iters"], &v["warmup"]),
        (&1.into(), &5.into(), &1.into())
    );
    let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    assert!(f("min_ms") > 0.0, "{v}");
    assert!(f("min_ms") <= f("median_ms"), "{v}");
    assert!(f("median_ms") <= f("p90_ms"), "{v}");
    assert!(f("p90_ms") <= f("p99_ms"), "{v}");
    assert!(
        (f("ips") - 1e3 / f("median_ms")).abs() < 1e-6 * f("ips"),
        "{v}"
    );
    assert!(v["arena_bytes"].as_u64().unwrap() > 0, "{v}");
    if cfg!(target_os = "linux") {
        assert!(v["peak_rss_bytes"].as_u64().unwrap() > 0, "{v}");
    }
}

#[test]
fn threads_2_on_run_and_bench() {
    let m = digits_mlp();
    let (rc, one, err) = mote(&["run", &m, "--json", "--threads", "1"]);
    assert_eq!(rc, 0, "{err}");
    let (rc, two, err) = mote(&["run", &m, "--json", "--threads", "2"]);
    if cfg!(feature = "rayon") {
        assert_eq!(rc, 0, "{err}");
        // Same seeded inputs, same output summary (values are bit-identical).
        assert_eq!(one, two);
        let (rc, out, err) = mote(&["bench", &m, "--threads", "2", "--iters", "2", "--json"]);
        assert_eq!(rc, 0, "{err}");
        assert!(out.contains("\"threads\":2"), "{out}");
    } else {
        assert_eq!(rc, 1, "{two}{err}");
    }
    for cmd in ["run", "bench"] {
        let (rc, _, err) = mote(&[cmd, &m, "--threads", "0"]);
        assert_eq!(rc, 1);
        assert_eq!(err.trim_end(), "error: --threads must be at least 1");
    }
}

/// x [1,2,3,3] → Conv (1×1) → BatchNormalization → Identity → y.
fn conv_bn_model(dir: &Path) -> PathBuf {
    let graph = GraphProto {
        node: vec![
            node("conv1", "Conv", &["x", "w"], "c"),
            node("bn1", "BatchNormalization", &["c", "s", "b", "m", "v"], "h"),
            node("id1", "Identity", &["h"], "y"),
        ],
        name: Some("g".into()),
        initializer: vec![
            init("w", &[2, 2, 1, 1], &[1.0, 2.0, 3.0, 4.0]),
            init("s", &[2], &[0.5, 2.0]),
            init("b", &[2], &[0.1, -0.1]),
            init("m", &[2], &[1.0, 0.0]),
            init("v", &[2], &[1.0, 4.0]),
        ],
        input: vec![vi("x", &[Ok(1), Ok(2), Ok(3), Ok(3)])],
        output: vec![vi("y", &[Ok(1), Ok(2), Ok(3), Ok(3)])],
        ..Default::default()
    };
    write_model(dir, "convbn.onnx", graph)
}

#[test]
fn inspect_optimized_lists_the_rewritten_graph() {
    let td = dir();
    let d = td.path();
    let m = conv_bn_model(d);
    let m = m.to_str().unwrap();
    let (rc, plain, err) = mote(&["inspect", m]);
    assert_eq!(rc, 0, "{err}");
    assert!(!plain.contains("rewrites:"), "{plain}");
    let (rc, out, err) = mote(&["inspect", m, "--optimized"]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.starts_with(&plain), "{out}");
    assert!(out.contains("graph after rewrites (1 nodes):"), "{out}");
    assert!(
        out.contains(
            "  conv1 (Conv): x[1,2,3,3], w/mote_folded[2,2,1,1], w/mote_bias[2] -> y[1,2,3,3]"
        ),
        "{out}"
    );
    assert!(
        out.contains("rewrites: 3 (transpose 0, identity 1, batchnorm 1, bias 0, gemm 0, gelu 0, activation 0, dead 1)"),
        "{out}"
    );
    assert!(
        out.contains("batchnorm: conv1: BatchNormalization 'bn1' folded into Conv"),
        "{out}"
    );
    let (rc, out, err) = mote(&["inspect", m, "--optimized", "--json"]);
    assert_eq!(rc, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["graph"][0]["op_type"], "Conv");
    assert_eq!(
        v["graph"][0]["outputs"][0]["shape"],
        serde_json::json!([1, 2, 3, 3])
    );
    assert_eq!(v["rewrites"][1]["pass"], "batchnorm");
}

#[test]
fn run_refuses_a_model_over_its_memory_budget() {
    let m = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/digits_mlp.onnx");
    let m = m.to_str().unwrap();
    // The shipped model: 9,640 bytes of weights and a 384-byte arena.
    let (rc, out, err) = mote(&["run", m, "--max-memory", "4K"]);
    assert_eq!(rc, 1, "{out}{err}");
    assert!(err.contains("memory budget exceeded"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let (rc, _, err) = mote(&["run", m, "--max-memory", "64K"]);
    assert_eq!(rc, 0, "{err}");
    let (rc, _, err) = mote(&["run", m, "--max-memory", "lots"]);
    assert_ne!(rc, 0);
    assert!(err.contains("not a byte count"), "{err}");
}

#[test]
fn provider_flag() {
    let m = digits_mlp();
    // Bad names: clap's one-line error.
    for cmd in ["run", "bench", "inspect"] {
        let (rc, _, err) = mote(&[cmd, &m, "--provider", "gpu"]);
        assert_eq!(rc, 1, "{err}");
        assert!(
            err.starts_with("error: ")
                && err.contains("unknown provider 'gpu' (expected cpu, cuda or cuda:N)")
                && err.lines().count() == 1,
            "{err}"
        );
    }
    let (rc, cpu, err) = mote(&["run", &m, "--json", "--provider", "cpu"]);
    assert_eq!(rc, 0, "{err}");
    let cpu: serde_json::Value = serde_json::from_str(&cpu).unwrap();
    assert_eq!(cpu["provider"], "cpu");
    assert_eq!(cpu["device"], serde_json::Value::Null);
    let (rc, out, err) = mote(&["bench", &m, "--iters", "2", "--json"]);
    assert_eq!(rc, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&v["provider"], &v["device"]),
        (&"cpu".into(), &serde_json::Value::Null)
    );

    let (rc, out, err) = mote(&["inspect", &m, "--provider", "cuda"]);
    if cfg!(feature = "cuda") {
        // The claim rule needs no GPU.
        assert_eq!(rc, 0, "{err}");
        assert!(
            out.contains("provider cuda: 3 of 3 steps on the GPU"),
            "{out}"
        );
        assert!(
            out.contains("  [gpu] steps 0..3: Gemm, Relu, Gemm"),
            "{out}"
        );
        let (rc, out, err) = mote(&["inspect", &m, "--provider", "cuda", "--json"]);
        assert_eq!(rc, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["partition"]["provider_steps"], 3, "{v}");
    } else {
        assert_eq!(rc, 1, "{out}");
        assert!(
            err.starts_with("error: provider cuda:0: this build of mote has no CUDA support")
                && err.lines().count() == 1,
            "{err}"
        );
    }

    let gpu = mote(&["run", &m, "--json", "--provider", "cuda"]);
    let bench = mote(&["bench", &m, "--json", "--iters", "2", "--provider", "cuda"]);
    for (rc, out, err) in [&gpu, &bench] {
        if *rc == 0 {
            continue;
        }
        assert_eq!(*rc, 1, "{out}");
        assert!(
            err.starts_with("error: provider cuda:0: ") && err.lines().count() == 1,
            "{err}"
        );
        if cfg!(feature = "cuda") {
            eprintln!("skipped: no GPU ({})", err.trim());
        } else {
            assert!(err.contains("no CUDA support"), "{err}");
        }
    }
    // A GPU machine, with the feature (without it, the loop above failed).
    if gpu.0 == 0 {
        let v: serde_json::Value = serde_json::from_str(&gpu.1).unwrap();
        assert_eq!(v["provider"], "cuda:0");
        assert!(v["device"].is_string(), "{v}");
        assert_eq!(
            v["outputs"][0]["top5"][0][0],
            cpu["outputs"][0]["top5"][0][0]
        );
        assert!(gpu.2.contains("steps on the GPU"), "{}", gpu.2);
        let v: serde_json::Value = serde_json::from_str(&bench.1).unwrap();
        assert_eq!(v["provider"], "cuda:0");
        assert!(v["device"].is_string(), "{v}");
        if cfg!(feature = "rayon") {
            // CPU segments on the pool; the GPU calls from a pool thread.
            let (rc, out, err) =
                mote(&["run", &m, "--json", "--provider", "cuda", "--threads", "2"]);
            assert_eq!(rc, 0, "{err}");
            assert_eq!(out, gpu.1);
        }
    }
}
