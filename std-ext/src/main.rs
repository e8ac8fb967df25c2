//! `mote`: inspect and run ONNX models from the command line.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use mote_std::{
    check_declared, fmt_declared, fmt_shape, load_model, safe_name, DType, Model, Provider,
    Session, SessionBuilder, Tensor,
};
use serde_json::{json, Value};

mod bench;

#[derive(Parser, Debug)]
#[command(name = "mote", version, about = "mote: a small ONNX inference runtime")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Show a model's metadata, inputs/outputs, ops, parameters and planned memory.
    Inspect {
        /// The .onnx file.
        model: PathBuf,
        /// Binds a symbolic dimension: NAME=VALUE (repeatable).
        #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = parse_dim)]
        dims: Vec<(String, usize)>,
        /// Plans with 8-bit graph inputs/outputs where the model quantizes
        /// them at once (`optimize::int8_io`), and prints their scales.
        #[arg(long)]
        int8_io: bool,
        /// Also prints the graph after the import rewrites (every node with
        /// its inputs → outputs and planned shapes) and what each rewrite
        /// pass changed.
        #[arg(long)]
        optimized: bool,
        /// Also prints which steps this provider would run and which the
        /// CPU would, with the copies between them (cuda: by its claim
        /// rule, no GPU needed; needs a build with `--features cuda`).
        #[arg(long, value_name = "cpu|cuda|cuda:N", default_value = "cpu", value_parser = parse_provider)]
        provider: Provider,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Run a model once on npy inputs (or seeded random data) and summarize outputs.
    Run {
        /// The .onnx file (or a .mote file from `mote compile`).
        model: PathBuf,
        /// Feeds an input from a .npy file: NAME=FILE (repeatable).
        #[arg(long = "input", value_name = "NAME=FILE", value_parser = parse_input)]
        inputs: Vec<(String, PathBuf)>,
        /// Binds a symbolic dimension: NAME=VALUE (repeatable).
        #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = parse_dim)]
        dims: Vec<(String, usize)>,
        /// Writes every output to DIR/<name>.npy.
        #[arg(long, value_name = "DIR")]
        output_dir: Option<PathBuf>,
        /// Seed of the random data for inputs not given.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Intra-op threads (rayon provider; results identical to 1 thread).
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Where to run: cpu, or cuda / cuda:N (device N; steps the GPU
        /// does not support run on the CPU; needs a build with
        /// `--features cuda` and an NVIDIA driver).
        #[arg(long, value_name = "cpu|cuda|cuda:N", default_value = "cpu", value_parser = parse_provider)]
        provider: Provider,
        /// Stores the f32 weights of Conv, ConvTranspose, MatMul and Gemm as
        /// f16 (`Model::weights_to_f16`): half the weight bytes.
        #[arg(long)]
        f16_weights: bool,
        /// Refuses, before running, a model whose weights, build-time
        /// constants and arena exceed BYTES (suffixes K, M, G: powers of 1024).
        #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
        max_memory: Option<usize>,
        /// A .mote file must be signed by the private key of this Ed25519
        /// public key (PEM, from `openssl pkey -pubout`), as firmware built
        /// with mote-core's `signed` feature checks.
        #[arg(long, value_name = "KEY.pub.pem")]
        public_key: Option<PathBuf>,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Time a model: warmup runs, then timed runs; latency min/median/p90/p99,
    /// inferences per second, arena bytes and peak resident memory.
    Bench {
        /// The .onnx file (or a .mote file from `mote compile`).
        model: PathBuf,
        /// Intra-op threads (rayon provider; results identical to 1 thread).
        #[arg(long, default_value_t = 1)]
        threads: usize,
        /// Where to run: cpu, or cuda / cuda:N (device N; steps the GPU
        /// does not support run on the CPU; needs a build with
        /// `--features cuda` and an NVIDIA driver).
        #[arg(long, value_name = "cpu|cuda|cuda:N", default_value = "cpu", value_parser = parse_provider)]
        provider: Provider,
        /// Timed runs.
        #[arg(long, default_value_t = 50)]
        iters: usize,
        /// Untimed runs before the timed ones.
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        /// Feeds an input from a .npy file: NAME=FILE (repeatable).
        #[arg(long = "input", value_name = "NAME=FILE", value_parser = parse_input)]
        inputs: Vec<(String, PathBuf)>,
        /// Binds a symbolic dimension: NAME=VALUE (repeatable).
        #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = parse_dim)]
        dims: Vec<(String, usize)>,
        /// Seed of the random data for inputs not given.
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// One more run with every GPU step timed by CUDA events: device
        /// time and TFLOP/s per kind of step (needs --provider cuda).
        #[arg(long)]
        profile: bool,
        /// One JSON object on stdout (and no progress bar).
        #[arg(long)]
        json: bool,
    },
    /// List the supported operators.
    Ops,
    /// Compile an int8 model to a .mote file that mote-core runs with no
    /// allocator (firmware): imported, optimized, quantize-fused and planned
    /// here, with graph inputs/outputs made 8-bit where the model quantizes
    /// them at once.
    Compile {
        /// The .onnx file.
        model: PathBuf,
        /// Binds a symbolic dimension: NAME=VALUE (repeatable).
        #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = parse_dim)]
        dims: Vec<(String, usize)>,
        /// Lists every step with its compiled kernel (or why it has none).
        #[arg(long)]
        ops_report: bool,
        /// The .mote file to write.
        #[arg(short, long, value_name = "OUT.mote")]
        output: Option<PathBuf>,
        /// Also writes a Rust module with ARENA_BYTES, the model bytes
        /// (include_bytes! of the .mote file) and the IO shapes.
        #[arg(long, value_name = "FILE.rs")]
        emit_rust: Option<PathBuf>,
        /// Signs the .mote file with this Ed25519 private key (PKCS#8 PEM,
        /// from `openssl genpkey -algorithm ed25519`): firmware then runs
        /// it only with the matching public key.
        #[arg(long, value_name = "KEY.pem")]
        sign: Option<PathBuf>,
    },
    /// Post-training static quantization to a QDQ model (int8).
    ///
    /// Calibration data in DIR, for every graph input NAME (file-safe form:
    /// characters outside [A-Za-z0-9._-] become '_'): either DIR/NAME.npy
    /// with all samples stacked on the first axis (sample k is x[k:k+1]),
    /// or DIR/NAME/*.npy with one file per sample, taken in file-name order.
    /// Prints top-1 agreement and max/mean abs error of the first output of
    /// the quantized model against the float model on the calibration set.
    Quantize {
        /// The float .onnx file (opset 13 or later).
        model: PathBuf,
        /// Directory of calibration .npy files (see above).
        #[arg(long, value_name = "DIR")]
        calibration: PathBuf,
        /// How activation ranges are chosen.
        #[arg(long, value_enum, default_value_t = MethodArg::Minmax)]
        method: MethodArg,
        /// Per-channel weight scales (axis 0 for Conv, the output axis for MatMul/Gemm).
        #[arg(long)]
        per_channel: bool,
        /// Symmetric activations (zero point 0); asymmetric by default.
        #[arg(long)]
        symmetric_activations: bool,
        /// Leaves the node NAME in float (repeatable).
        #[arg(long, value_name = "NODE")]
        exclude: Vec<String>,
        /// The quantized .onnx file to write.
        #[arg(short = 'o', long = "output", value_name = "OUT.onnx")]
        output: PathBuf,
    },
    /// Run the ONNX backend node tests (from `scripts/gen_conformance.py`).
    Conformance {
        /// Suite directory.
        #[arg(long, value_name = "DIR", default_value = ".cache/onnx-node-tests")]
        suite: PathBuf,
        /// Runs only the cases whose name matches REGEX (unanchored, e.g.
        /// `^test_(add|sub)` or `_expanded$`).
        #[arg(long, value_name = "REGEX")]
        filter: Option<String>,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum MethodArg {
    /// Observed min/max.
    Minmax,
    /// 99.99th percentile of |x| (2048-bin histogram).
    Percentile,
    /// KL-divergence threshold search (TensorRT/onnxruntime entropy).
    Entropy,
}

fn parse_dim(s: &str) -> std::result::Result<(String, usize), String> {
    let (n, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, got '{s}'"))?;
    let v = v
        .trim()
        .parse::<usize>()
        .map_err(|_| format!("dim '{n}': '{v}' is not a non-negative integer"))?;
    if n.is_empty() {
        return Err(format!("expected NAME=VALUE, got '{s}'"));
    }
    Ok((n.to_string(), v))
}

/// `65536`, `64K`, `16M`, `1G` (powers of 1024).
fn parse_bytes(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1usize << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("'{s}' is not a byte count (like 65536, 64K, 16M, 1G)"))
}

fn parse_provider(s: &str) -> std::result::Result<Provider, String> {
    s.parse::<Provider>().map_err(|e| e.to_string())
}

fn parse_input(s: &str) -> std::result::Result<(String, PathBuf), String> {
    let (n, f) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=FILE.npy, got '{s}'"))?;
    if n.is_empty() || f.is_empty() {
        return Err(format!("expected NAME=FILE.npy, got '{s}'"));
    }
    Ok((n.to_string(), PathBuf::from(f)))
}

/// Output text: the report (stdout) and notes (stdout, or stderr in JSON mode).
struct Out {
    text: String,
    notes: String,
    json: bool,
}

impl Out {
    fn line(&mut self, s: impl AsRef<str>) {
        self.text.push_str(s.as_ref());
        self.text.push('\n');
    }
    fn note(&mut self, s: impl AsRef<str>) {
        if self.json {
            self.notes.push_str(s.as_ref());
            self.notes.push('\n');
        } else {
            self.line(s);
        }
    }
}

fn main() {
    mote_std::cpu::init();
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        eprintln!(
            "error: internal error (a bug in mote): {}",
            msg.lines().next().unwrap_or("")
        );
        std::process::exit(1);
    }));
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind as K;
            if matches!(
                e.kind(),
                K::DisplayHelp | K::DisplayVersion | K::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            let s = e.to_string();
            let first = s
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid arguments");
            eprintln!("error: {}", first.trim_start_matches("error: ").trim());
            std::process::exit(1);
        }
    };
    let mut out = Out {
        text: String::new(),
        notes: String::new(),
        json: false,
    };
    let r = match cli.cmd {
        Cmd::Inspect {
            model,
            dims,
            int8_io,
            optimized,
            provider,
            json,
        } => {
            out.json = json;
            inspect(&model, &dims, int8_io, optimized, provider, &mut out)
        }
        Cmd::Run {
            model,
            inputs,
            dims,
            output_dir,
            seed,
            threads,
            provider,
            f16_weights,
            max_memory,
            public_key,
            json,
        } => {
            out.json = json;
            let opt = RunOptions {
                seed,
                threads,
                provider,
                max_memory,
                public_key,
            };
            bench::check_threads(threads).and_then(|()| {
                run(
                    &model,
                    &inputs,
                    &dims,
                    output_dir.as_deref(),
                    &opt,
                    f16_weights,
                    &mut out,
                )
            })
        }
        Cmd::Bench {
            model,
            threads,
            provider,
            iters,
            warmup,
            inputs,
            dims,
            seed,
            json,
            profile,
        } => {
            out.json = json;
            let opt = bench::Options {
                threads,
                provider,
                iters,
                warmup,
                seed,
                profile,
            };
            bench::bench(&model, &inputs, &dims, &opt, &mut out)
        }
        Cmd::Ops => ops(&mut out),
        Cmd::Compile {
            model,
            dims,
            ops_report,
            output,
            emit_rust,
            sign,
        } => compile(
            &model,
            &dims,
            ops_report,
            output.as_deref(),
            emit_rust.as_deref(),
            sign.as_deref(),
            &mut out,
        ),
        Cmd::Quantize {
            model,
            calibration,
            method,
            per_channel,
            symmetric_activations,
            exclude,
            output,
        } => {
            let method = match method {
                MethodArg::Minmax => mote_std::quantize::Method::MinMax,
                MethodArg::Percentile => mote_std::quantize::Method::Percentile,
                MethodArg::Entropy => mote_std::quantize::Method::Entropy,
            };
            let opt = mote_std::quantize::Options {
                method,
                per_channel,
                symmetric_activations,
                exclude,
            };
            quantize(&model, &calibration, &opt, &output, &mut out)
        }
        Cmd::Conformance {
            suite,
            filter,
            json,
        } => {
            out.json = json;
            conformance(&suite, filter.as_deref(), &mut out)
        }
    };
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (`mote ops | head`) is not an error worth reporting.
    let _ = stdout
        .write_all(out.text.as_bytes())
        .and_then(|_| stdout.flush());
    eprint!("{}", out.notes);
    if let Err(e) = r {
        // The chain, without repeating a cause its parent already shows.
        let mut msg = String::new();
        for c in e.chain() {
            let c = c.to_string();
            if !msg.ends_with(&c) {
                if !msg.is_empty() {
                    msg.push_str(": ");
                }
                msg.push_str(&c);
            }
        }
        eprintln!("error: {}", msg.replace('\n', " "));
        std::process::exit(1);
    }
}

fn quantize(
    path: &Path,
    calib: &Path,
    opt: &mote_std::quantize::Options,
    output: &Path,
    out: &mut Out,
) -> Result<()> {
    use mote_proto::Message as _;
    use mote_std::quantize as q;
    let float_bytes = std::fs::read(path).with_context(|| path.display().to_string())?;
    let proto = q::read_model_proto(path)?;
    let model = load_model(path)?;
    let inputs: Vec<String> = model.input_names().map(String::from).collect();
    let samples = q::read_calibration(calib, &inputs)?;
    let (qm, report) = q::quantize(&proto, &samples, opt)?;
    let bytes = qm.encode_to_vec();
    std::fs::write(output, &bytes).with_context(|| output.display().to_string())?;
    let nodes: Vec<String> = report
        .quantized_nodes
        .iter()
        .map(|(k, v)| format!("{k}×{v}"))
        .collect();
    out.line(format!(
        "quantized: {} ({} activations, {} int8 weights, {} Relu/Clip folded) -> {}",
        nodes.join(" "),
        report.activations,
        report.weights,
        report.folded,
        output.display()
    ));
    let a = q::compare(&float_bytes, &bytes, &samples)?;
    out.line(format!(
        "calibration set ({} samples, {} rows): top-1 agreement {:.2}%, max abs error {:.6}, mean abs error {:.6}",
        samples.len(),
        a.rows,
        a.top1 * 100.0,
        a.max_abs,
        a.mean_abs
    ));
    Ok(())
}

fn ops(out: &mut Out) -> Result<()> {
    for (domain, op) in mote_std::mote_core::ops::supported_ops() {
        if domain.is_empty() {
            out.line(op);
        } else {
            out.line(format!("{domain}.{op}"));
        }
    }
    Ok(())
}

fn conformance(suite: &Path, filter: Option<&str>, out: &mut Out) -> Result<()> {
    use mote_std::conformance::{run_suite, Outcome, Summary};
    if !suite.is_dir() {
        bail!(
            "no conformance suite at {} (generate it: python scripts/gen_conformance.py {})",
            suite.display(),
            suite.display()
        );
    }
    let filter = filter
        .map(regex::Regex::new)
        .transpose()
        .context("--filter is not a valid regular expression")?;
    let results = run_suite(suite, filter.as_ref()).with_context(|| suite.display().to_string())?;
    let summary = Summary::of(&results);
    if out.json {
        let cases: Vec<Value> = results
            .iter()
            .map(|r| {
                let kind = match r.outcome {
                    Outcome::Pass => "pass",
                    Outcome::Wrong { .. } => "wrong",
                    Outcome::Unsupported(_) => "unsupported",
                    Outcome::Error(_) => "error",
                };
                json!({"name": r.name, "ops": r.ops, "outcome": kind, "detail": r.outcome.to_string()})
            })
            .collect();
        out.line(
            json!({
                "total": summary.total,
                "pass": summary.pass,
                "wrong": summary.wrong,
                "unsupported": summary.unsupported,
                "error": summary.error,
                "cases": cases,
            })
            .to_string(),
        );
    } else {
        for r in results.iter().filter(|r| r.outcome != Outcome::Pass) {
            out.line(format!(
                "{}: {}",
                r.name,
                r.outcome.to_string().replace('\n', " ")
            ));
        }
        out.line(summary.to_string());
    }
    Ok(())
}

fn domain_name(d: &str) -> &str {
    if d.is_empty() {
        "ai.onnx"
    } else {
        d
    }
}

fn declared_json(model: &Model, id: u32) -> Value {
    let Some(t) = model.graph.tensors.get(id as usize) else {
        return Value::Null;
    };
    let dtype = t.dtype.map_or_else(
        || DType::onnx_name(t.onnx_type).to_string(),
        |d| d.to_string(),
    );
    let shape: Value = match &t.shape {
        None => Value::Null,
        Some(s) => s
            .iter()
            .map(|d| match d {
                mote_std::mote_core::model::Dim::Fixed(v) => json!(v),
                mote_std::mote_core::model::Dim::Param(p) => json!(p),
                mote_std::mote_core::model::Dim::Unknown => Value::Null,
            })
            .collect(),
    };
    json!({"name": t.name, "dtype": dtype, "shape": shape})
}

fn inspect(
    path: &Path,
    dims: &[(String, usize)],
    int8_io: bool,
    optimized: bool,
    provider: Provider,
    out: &mut Out,
) -> Result<()> {
    provider.check_compiled_in()?;
    let mut model = load_model(path)?;
    if int8_io {
        mote_std::mote_core::optimize::int8_io(&mut model);
    }
    let model = Arc::new(model);
    let mut b = SessionBuilder::from_model(model.clone());
    for (n, v) in dims {
        b = b.dim(n, *v);
    }
    let session = b.build();
    let g = &model.graph;
    let mut op_counts: BTreeMap<String, usize> = BTreeMap::new();
    for n in &g.nodes {
        let key = if n.domain.is_empty() {
            n.op_type.clone()
        } else {
            format!("{}.{}", n.domain, n.op_type)
        };
        *op_counts.entry(key).or_default() += 1;
    }
    let (mut params, mut param_bytes) = (0usize, 0usize);
    for t in &g.tensors {
        if let Some(c) = &t.value {
            params += c.shape.iter().product::<usize>();
            param_bytes += c.byte_len();
        }
    }
    let io = |ids: &[u32], planned: Option<&[mote_std::IoInfo]>| -> Vec<Value> {
        match planned {
            Some(p) => p
                .iter()
                .map(|i| json!({"name": i.name, "dtype": i.dtype.name(), "shape": i.shape}))
                .collect(),
            None => ids.iter().map(|&i| declared_json(&model, i)).collect(),
        }
    };
    let plan = session.as_ref().ok().map(|s| s.plan());
    let partition = match plan {
        Some(p) => mote_std::provider::partition_report(&model, p, provider)?,
        None => None,
    };
    if out.json {
        let mut v = json!({
            "producer": model.producer,
            "producer_version": model.producer_version,
            "ir_version": model.ir_version,
            "opsets": model.opsets.iter().map(|(d, v)| json!({"domain": domain_name(d), "version": v})).collect::<Vec<_>>(),
            "inputs": io(&g.inputs, plan.map(|p| p.inputs())),
            "outputs": io(&g.outputs, plan.map(|p| p.outputs())),
            "op_counts": op_counts,
            "nodes": g.nodes.len(),
            "parameters": params,
            "parameter_bytes": param_bytes,
            "arena_bytes": plan.map(|p| p.arena_bytes()),
            "arena_lower_bound": plan.map(|p| p.lower_bound()),
            "scratch_bytes": plan.map(|p| p.scratch_bytes()),
            "steps": plan.map(|p| p.num_steps()),
            "folded_bytes": plan.map(|p| p.folded_bytes()),
            "defaulted_dims": plan.map_or(&[][..], |p| p.defaulted_dims()),
            "io_quant": model.io_quant.iter().map(|q| json!({
                "name": q.name, "input": q.input, "dtype": q.dtype.name(),
                "scale": q.scale, "zero_point": q.zero_point,
            })).collect::<Vec<_>>(),
            "qdq": model.fusions.iter().map(|f| json!({
                "node": f.node, "op_type": f.op_type,
                "integer": f.integer, "reason": f.reason,
            })).collect::<Vec<_>>(),
        });
        if let Err(e) = &session {
            v["plan_error"] = json!(e.to_string());
        }
        if let Some(r) = &partition {
            v["partition"] = r.to_json();
        }
        if optimized {
            v["graph"] = json!(g
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let ts = |ids: &[Option<u32>]| -> Vec<Value> {
                        ids.iter()
                            .map(|t| match t {
                                None => Value::Null,
                                Some(t) => {
                                    let name = g.tensors.get(*t as usize).map(|t| t.name.as_str());
                                    let shape = plan.and_then(|p| p.tensor_type(*t)).map(|x| x.1);
                                    json!({"name": name, "shape": shape})
                                }
                            })
                            .collect()
                    };
                    json!({
                        "name": node_label(n, i), "op_type": n.op_type, "domain": n.domain,
                        "inputs": ts(&n.inputs), "outputs": ts(&n.outputs),
                    })
                })
                .collect::<Vec<_>>());
            v["rewrites"] = json!(model
                .rewrites
                .iter()
                .map(|r| json!({"pass": r.pass.name(), "node": r.node, "detail": r.detail}))
                .collect::<Vec<_>>());
        }
        out.line(v.to_string());
    } else {
        let producer = if model.producer.is_empty() {
            "(unknown)"
        } else {
            &model.producer
        };
        out.line(format!("model: {}", path.display()));
        out.line(format!("producer: {producer} {}", model.producer_version).trim_end());
        out.line(format!("ir_version: {}", model.ir_version));
        let ops: Vec<String> = model
            .opsets
            .iter()
            .map(|(d, v)| format!("{} {v}", domain_name(d)))
            .collect();
        out.line(format!("opsets: {}", ops.join(", ")));
        for (label, ids, planned) in [
            ("input", &g.inputs, plan.map(|p| p.inputs())),
            ("output", &g.outputs, plan.map(|p| p.outputs())),
        ] {
            match planned {
                Some(p) => {
                    for i in p {
                        out.line(format!(
                            "{label} '{}': {} {}",
                            i.name,
                            i.dtype,
                            fmt_shape(&i.shape)
                        ));
                    }
                }
                None => {
                    for &id in ids.iter() {
                        if let Some(t) = g.tensors.get(id as usize) {
                            let dt = t.dtype.map_or_else(
                                || DType::onnx_name(t.onnx_type).to_string(),
                                |d| d.to_string(),
                            );
                            let sh = t
                                .shape
                                .as_deref()
                                .map_or_else(|| "[?]".to_string(), fmt_declared);
                            out.line(format!("{label} '{}': {dt} {sh}", t.name));
                        }
                    }
                }
            }
        }
        let mut s = format!("ops ({} nodes):", g.nodes.len());
        for (k, v) in &op_counts {
            let _ = write!(s, " {k}×{v}");
        }
        out.line(s);
        out.line(format!(
            "parameters: {params} ({})",
            human_bytes(param_bytes)
        ));
        for q in &model.io_quant {
            out.line(format!(
                "{} '{}' is {}: real = (q - {}) * {:e}",
                if q.input { "input" } else { "output" },
                q.name,
                q.dtype,
                q.zero_point,
                q.scale
            ));
        }
        if !model.fusions.is_empty() {
            let int = model.fusions.iter().filter(|f| f.integer.is_some()).count();
            out.line(format!(
                "QDQ: {int} of {} nodes run in integer",
                model.fusions.len()
            ));
            for f in &model.fusions {
                match f.integer {
                    Some(k) => out.line(format!("  {} ({}): integer, {k}", f.node, f.op_type)),
                    None => out.line(format!("  {} ({}): float, {}", f.node, f.op_type, f.reason)),
                }
            }
        }
        if let Some(p) = plan {
            out.line(format!(
                "arena: {} bytes (lower bound {} bytes, {:.3}x), scratch {} bytes",
                p.arena_bytes(),
                p.lower_bound(),
                p.arena_bytes() as f64 / p.lower_bound().max(1) as f64,
                p.scratch_bytes()
            ));
            out.line(format!(
                "steps: {} (after folding), folded constants: {} bytes",
                p.num_steps(),
                p.folded_bytes()
            ));
            for d in p.defaulted_dims() {
                out.note(format!("note: dim '{d}' not bound, using 1 (--dim {d}=N)"));
            }
        }
        if let Some(r) = &partition {
            for l in r.lines() {
                out.line(l);
            }
        }
        if optimized {
            print_optimized(&model, plan, out);
        }
    }
    match session {
        Ok(_) => Ok(()),
        Err(e) => Err(anyhow!("cannot plan {}: {e}", path.display())),
    }
}

fn node_label(n: &mote_std::mote_core::model::Node, i: usize) -> String {
    if n.name.is_empty() {
        format!("{}#{i}", n.op_type)
    } else {
        n.name.clone()
    }
}

/// The graph after the import rewrites, then what each float pass did.
fn print_optimized(model: &Model, plan: Option<&mote_std::mote_core::Plan>, out: &mut Out) {
    use mote_std::mote_core::optimize::float::Pass;
    let g = &model.graph;
    let tensor = |t: &Option<u32>| -> String {
        let Some(t) = *t else {
            return "_".into();
        };
        let name = g.tensors.get(t as usize).map_or("?", |t| t.name.as_str());
        match plan.and_then(|p| p.tensor_type(t)) {
            Some((_, sh)) => format!("{name}{}", fmt_shape(sh)),
            None => name.to_string(),
        }
    };
    out.line(format!("graph after rewrites ({} nodes):", g.nodes.len()));
    for (i, n) in g.nodes.iter().enumerate() {
        let op = if n.domain.is_empty() {
            n.op_type.clone()
        } else {
            format!("{}.{}", n.domain, n.op_type)
        };
        let ins: Vec<String> = n.inputs.iter().map(tensor).collect();
        let outs: Vec<String> = n.outputs.iter().map(tensor).collect();
        out.line(format!(
            "  {} ({op}): {} -> {}",
            node_label(n, i),
            ins.join(", "),
            outs.join(", ")
        ));
    }
    let counts: Vec<String> = Pass::ALL
        .iter()
        .map(|p| {
            let k = model.rewrites.iter().filter(|r| r.pass == *p).count();
            format!("{} {k}", p.name())
        })
        .collect();
    out.line(format!(
        "rewrites: {} ({})",
        model.rewrites.len(),
        counts.join(", ")
    ));
    for r in &model.rewrites {
        if r.node.is_empty() {
            out.line(format!("  {}: {}", r.pass.name(), r.detail));
        } else {
            out.line(format!("  {}: {}: {}", r.pass.name(), r.node, r.detail));
        }
    }
}

fn human_bytes(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{b} bytes, {:.1} MiB", b as f64 / (1 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{b} bytes, {:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} bytes")
    }
}

/// xorshift64* — deterministic input data.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        // splitmix64 of the seed: never zero, well mixed.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng(if z == 0 { 1 } else { z })
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn random_tensor(dtype: DType, shape: &[usize], rng: &mut Rng) -> Result<Tensor> {
    let mut t = Tensor::zeros(dtype, shape)?;
    let size = dtype.size();
    for chunk in t.bytes_mut().chunks_exact_mut(size) {
        let r = rng.next();
        let int = (r % 10) as i64;
        match dtype {
            DType::F32 => {
                chunk.copy_from_slice(&((r >> 40) as f32 / (1u64 << 24) as f32).to_le_bytes())
            }
            DType::F64 => {
                chunk.copy_from_slice(&((r >> 11) as f64 / (1u64 << 53) as f64).to_le_bytes())
            }
            DType::F16 => {
                chunk.copy_from_slice(&half::f16::from_f32((r >> 53) as f32 / 2048.0).to_le_bytes())
            }
            DType::BF16 => {
                chunk.copy_from_slice(&half::bf16::from_f32((r >> 56) as f32 / 256.0).to_le_bytes())
            }
            DType::Bool => chunk[0] = (r >> 63) as u8,
            _ => chunk.copy_from_slice(&int.to_le_bytes()[..size]),
        }
    }
    Ok(t)
}

struct Stats {
    min: f64,
    max: f64,
    mean: f64,
    top5: Vec<(usize, f64)>,
}

fn stats(t: &Tensor) -> Stats {
    let v = t.to_f64_vec();
    let (mut min, mut max, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
    for &x in &v {
        min = min.min(x);
        max = max.max(x);
        sum += x;
    }
    let n = v.len();
    let (min, max, mean) = if n == 0 {
        (f64::NAN, f64::NAN, f64::NAN)
    } else {
        (min, max, sum / n as f64)
    };
    let shape = t.shape();
    let one_row = !shape.is_empty() && shape[..shape.len() - 1].iter().all(|&d| d == 1);
    let mut top5 = Vec::new();
    if t.dtype().is_float() && one_row && (2..=1000).contains(&n) {
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by(|&a, &b| {
            let (x, y) = (v[a], v[b]);
            y.partial_cmp(&x)
                .unwrap_or_else(|| x.is_nan().cmp(&y.is_nan()))
                .then(a.cmp(&b))
        });
        top5 = idx.into_iter().take(5).map(|i| (i, v[i])).collect();
    }
    Stats {
        min,
        max,
        mean,
        top5,
    }
}

fn num(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// How `mote run` and `mote bench` plan and feed a model.
pub(crate) struct RunOptions {
    /// Seed of the random data for inputs not given.
    pub seed: u64,
    /// Intra-op threads.
    pub threads: usize,
    /// `--provider`: where the session runs.
    pub provider: Provider,
    /// `--max-memory`: budget of weights, folded constants and arena.
    pub max_memory: Option<usize>,
    /// `--public-key`: a .mote file must be signed by this key.
    pub public_key: Option<PathBuf>,
}

/// `provider cuda:0 (NVIDIA H200): 12 of 14 steps on the GPU`.
fn provider_note(session: &Session) -> String {
    let mut s = format!("provider {}", session.provider());
    if let Some(d) = session.device_name() {
        let _ = write!(s, " ({d})");
    }
    #[cfg(feature = "cuda")]
    if let Some(x) = session.cuda() {
        let p = x.partition();
        let _ = write!(
            s,
            ": {} of {} steps on the GPU, {} segment{}",
            p.provider_steps(),
            session.plan().num_steps(),
            p.segments.len(),
            if p.segments.len() == 1 { "" } else { "s" }
        );
    }
    s
}

/// A planned session and its inputs (see [`plan_with_inputs`]).
struct Planned {
    session: Session,
    /// Every graph input, by name.
    feeds: Vec<(String, Tensor)>,
    /// How each input was filled, for `--json` reports.
    inputs_json: Vec<Value>,
}

/// Plans `model` with `dims` and the shapes of the `given` npy inputs, and
/// feeds every input: the given files, and seeded random data (see
/// [`random_tensor`]) for the others.
fn plan_with_inputs(
    path: &Path,
    model: Model,
    given: &[(String, PathBuf)],
    dims: &[(String, usize)],
    opt: &RunOptions,
    out: &mut Out,
) -> Result<Planned> {
    let (seed, threads) = (opt.seed, opt.threads);
    let model = Arc::new(model);
    let mut feeds: Vec<(String, Tensor, String)> = Vec::new();
    for (name, file) in given {
        if feeds.iter().any(|(n, _, _)| n == name) {
            bail!("input '{name}' given more than once");
        }
        let t = mote_std::read_npy(file)?;
        check_declared(&model, name, t.dtype(), t.shape())?;
        feeds.push((name.clone(), t, file.display().to_string()));
    }
    let mut b = SessionBuilder::from_model(model.clone())
        .threads(threads)
        .provider(opt.provider);
    if let Some(m) = opt.max_memory {
        b = b.max_memory(m);
    }
    for (n, v) in dims {
        b = b.dim(n, *v);
    }
    for (n, t, _) in &feeds {
        b = b.input_shape(n, t.shape());
    }
    let session: Session = match b.build() {
        Ok(s) => s,
        // No CUDA in this build, no driver, no device: not the model's fault.
        Err(e @ mote_std::Error::Provider(_)) => return Err(e.into()),
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!("cannot plan {}", path.display())))
        }
    };
    if let Provider::Cuda { .. } = opt.provider {
        out.note(provider_note(&session));
    }
    for d in session.plan().defaulted_dims() {
        out.note(format!("note: dim '{d}' not bound, using 1 (--dim {d}=N)"));
    }
    let mut rng = Rng::new(seed);
    let mut inputs_json = Vec::new();
    for info in session.inputs().to_vec() {
        if let Some((_, _, file)) = feeds.iter().find(|(n, _, _)| *n == info.name) {
            out.note(format!(
                "input '{}': {} {} from {file}",
                info.name,
                info.dtype,
                fmt_shape(&info.shape)
            ));
            inputs_json.push(json!({"name": info.name, "dtype": info.dtype.name(), "shape": info.shape, "file": file}));
        } else {
            let t = random_tensor(info.dtype, &info.shape, &mut rng)?;
            out.note(format!(
                "input '{}': random (seed {seed}) {} {}",
                info.name,
                info.dtype,
                fmt_shape(&info.shape)
            ));
            inputs_json.push(
                json!({"name": info.name, "dtype": info.dtype.name(), "shape": info.shape, "random_seed": seed}),
            );
            feeds.push((info.name.clone(), t, String::new()));
        }
    }
    let feeds = feeds.into_iter().map(|(n, t, _)| (n, t)).collect();
    Ok(Planned {
        session,
        feeds,
        inputs_json,
    })
}

fn run(
    path: &Path,
    given: &[(String, PathBuf)],
    dims: &[(String, usize)],
    output_dir: Option<&Path>,
    opt: &RunOptions,
    f16_weights: bool,
    out: &mut Out,
) -> Result<()> {
    let threads = opt.threads;
    if is_mote(path) {
        if f16_weights || !dims.is_empty() {
            bail!("--f16-weights and --dim do not apply to a compiled model");
        }
        if threads > 1 {
            bail!("--threads {threads}: a compiled model runs on one thread");
        }
        if opt.provider != Provider::Cpu {
            bail!(
                "--provider {}: a compiled model runs on the CPU",
                opt.provider
            );
        }
        return run_mote(path, given, output_dir, opt, out);
    }
    if opt.public_key.is_some() {
        bail!("--public-key applies to a compiled (.mote) model");
    }
    let mut model = load_model(path)?;
    if f16_weights {
        let (before, after) = model.weights_to_f16();
        out.note(format!("f16 weights: initializers {before} B -> {after} B"));
    }
    let Planned {
        mut session,
        feeds,
        inputs_json,
    } = plan_with_inputs(path, model, given, dims, opt, out)?;
    let (names, tensors): (Vec<String>, Vec<Tensor>) = feeds.into_iter().unzip();
    let args: Vec<(&str, Tensor)> = names.iter().map(String::as_str).zip(tensors).collect();
    let outputs = session.run(&args)?;
    if let Some(dir) = output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut used_names: Vec<String> = Vec::new();
    let mut outputs_json = Vec::new();
    for (info, t) in session.outputs().iter().zip(&outputs) {
        let file = match output_dir {
            Some(dir) => {
                let base = safe_name(&info.name);
                let mut name = base.clone();
                let mut k = 1;
                while used_names.contains(&name) {
                    name = format!("{base}_{k}");
                    k += 1;
                }
                used_names.push(name.clone());
                let p = dir.join(format!("{name}.npy"));
                mote_std::write_npy(&p, &t.view())?;
                out.note(format!("output '{}' -> {}", info.name, p.display()));
                Some(p.display().to_string())
            }
            None => None,
        };
        let s = stats(t);
        if out.json {
            outputs_json.push(json!({
                "name": info.name,
                "dtype": t.dtype().name(),
                "shape": t.shape(),
                "min": num(s.min),
                "max": num(s.max),
                "mean": num(s.mean),
                "top5": s.top5.iter().map(|&(i, v)| json!([i, num(v)])).collect::<Vec<_>>(),
                "file": file,
            }));
        } else {
            out.line(format!(
                "output '{}': {} {}  min {:.6} max {:.6} mean {:.6}",
                info.name,
                t.dtype(),
                fmt_shape(t.shape()),
                s.min,
                s.max,
                s.mean
            ));
            if !s.top5.is_empty() {
                let parts: Vec<String> = s
                    .top5
                    .iter()
                    .map(|(i, v)| format!("{i} ({v:.4})"))
                    .collect();
                out.line(format!("  top5: {}", parts.join(", ")));
            }
        }
    }
    if out.json {
        out.line(
            json!({
                "inputs": inputs_json,
                "outputs": outputs_json,
                "arena_bytes": session.plan().arena_bytes(),
                "provider": session.provider().to_string(),
                "device": session.device_name(),
            })
            .to_string(),
        );
    } else {
        out.line(format!(
            "arena: {} bytes (lower bound {} bytes), {} steps",
            session.plan().arena_bytes(),
            session.plan().lower_bound(),
            session.plan().num_steps()
        ));
    }
    Ok(())
}

fn is_mote(path: &Path) -> bool {
    use std::io::Read as _;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"MOTE"
}

fn compile(
    path: &Path,
    dims: &[(String, usize)],
    ops_report: bool,
    output: Option<&Path>,
    emit_rust: Option<&Path>,
    sign: Option<&Path>,
    out: &mut Out,
) -> Result<()> {
    if ops_report {
        let r = mote_std::compiled::ops_report(path, dims)?;
        for s in &r.steps {
            out.line(format!(
                "  {} ({}): {}",
                if s.name.is_empty() { "-" } else { &s.name },
                s.op,
                s.kernel.unwrap_or("NOT COMPILABLE (no compiled kernel)")
            ));
        }
        let bad = r.unsupported().count();
        out.line(format!(
            "{} of {} steps compile; arena {} bytes (lower bound {})",
            r.steps.len() - bad,
            r.steps.len(),
            r.arena_bytes,
            r.lower_bound
        ));
        if output.is_none() {
            return Ok(());
        }
    }
    let Some(output) = output else {
        bail!("-o OUT.mote is required (or --ops-report alone)");
    };
    let mut c = mote_std::compiled::compile_onnx(path, dims)
        .with_context(|| format!("cannot compile {}", path.display()))?;
    if let Some(key) = sign {
        let key = mote_std::compiled::read_signing_key(key)?;
        c.bytes = mote_std::compiled::sign(&c.bytes, &key)?;
        out.note(format!(
            "signed (Ed25519); public key for firmware: {}",
            mote_std::compiled::rust_bytes(key.verifying_key().as_bytes())
        ));
    }
    std::fs::write(output, &c.bytes)
        .with_context(|| format!("cannot write {}", output.display()))?;
    let f = mote_std::compiled::MoteFile::from_bytes(&c.bytes)?;
    let m = f.model()?;
    out.line(format!(
        "wrote {}: {} bytes ({} steps, {} tensors, weights and parameters {} bytes), arena {} bytes (lower bound {})",
        output.display(),
        c.bytes.len(),
        m.num_steps(),
        m.num_tensors(),
        m.data_bytes(),
        m.arena_bytes(),
        m.arena_lower_bound()
    ));
    for (kind, n) in [("input", m.num_inputs()), ("output", m.num_outputs())] {
        for i in 0..n {
            let d = if kind == "input" {
                m.input(i)
            } else {
                m.output(i)
            }
            .map_err(|e| anyhow!("{e}"))?;
            let name = d.name().map_err(|e| anyhow!("{e}"))?;
            let q = match d.quant {
                Some((s, z)) => format!(": real = (q - {z}) * {s:e}"),
                None => String::new(),
            };
            out.line(format!(
                "{kind} '{}': {} {}{q}",
                name,
                d.tensor.dtype,
                fmt_shape(d.tensor.shape())
            ));
        }
    }
    if let Some(rs) = emit_rust {
        // include_bytes! resolves relative to the module file.
        let rel = relative_to(output, rs.parent().unwrap_or(Path::new(".")));
        let text = mote_std::compiled::emit_rust(&m, &rel, &path.display().to_string())?;
        std::fs::write(rs, text).with_context(|| format!("cannot write {}", rs.display()))?;
        out.line(format!("wrote {}", rs.display()));
    }
    Ok(())
}

/// `file` as a path relative to `dir` when both are under a common
/// directory, else absolute.
fn relative_to(file: &Path, dir: &Path) -> String {
    let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (f, d) = (abs(file), abs(dir));
    if let Ok(r) = f.strip_prefix(&d) {
        return r.display().to_string();
    }
    f.display().to_string()
}

/// The inputs of a compiled model: the `given` npy files, and seeded random
/// data for the others.
fn mote_inputs(
    f: &mote_std::compiled::MoteFile,
    given: &[(String, PathBuf)],
    seed: u64,
    out: &mut Out,
) -> Result<Vec<Tensor>> {
    let m = f.model()?;
    let mut rng = Rng::new(seed);
    let mut inputs = Vec::new();
    for (name, _) in given {
        if !(0..m.num_inputs()).any(|i| m.input(i).is_ok_and(|d| d.name().is_ok_and(|n| n == name)))
        {
            bail!("the compiled model has no input '{name}'");
        }
    }
    for i in 0..m.num_inputs() {
        let d = m.input(i).map_err(|e| anyhow!("{e}"))?;
        let name = d.name().map_err(|e| anyhow!("{e}"))?;
        let t = match given.iter().find(|(n, _)| n == name) {
            Some((_, file)) => {
                out.note(format!("input '{name}': from {}", file.display()));
                mote_std::read_npy(file)?
            }
            None => {
                out.note(format!(
                    "input '{name}': random (seed {seed}) {} {}",
                    d.tensor.dtype,
                    fmt_shape(d.tensor.shape())
                ));
                random_tensor(d.tensor.dtype, d.tensor.shape(), &mut rng)?
            }
        };
        inputs.push(t);
    }
    Ok(inputs)
}

fn run_mote(
    path: &Path,
    given: &[(String, PathBuf)],
    output_dir: Option<&Path>,
    opt: &RunOptions,
    out: &mut Out,
) -> Result<()> {
    let f = match &opt.public_key {
        Some(k) => {
            let key = mote_std::compiled::read_public_key(k)?;
            let f = mote_std::compiled::MoteFile::open_verified(path, &key)?;
            out.note("signature verified (Ed25519)");
            f
        }
        None => mote_std::compiled::MoteFile::open(path)?,
    };
    let m = f.model()?;
    if let Some(budget) = opt.max_memory {
        let needed = m.arena_bytes().saturating_add(m.data_bytes());
        if needed > budget {
            bail!(
                "{}: memory budget exceeded: needs {needed} bytes (arena {} + weights {}), budget {budget}",
                path.display(),
                m.arena_bytes(),
                m.data_bytes()
            );
        }
    }
    let inputs = mote_inputs(&f, given, opt.seed, out)?;
    let outputs = f.run(&inputs)?;
    if let Some(dir) = output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let mut outputs_json = Vec::new();
    for (i, t) in outputs.iter().enumerate() {
        let d = m.output(i).map_err(|e| anyhow!("{e}"))?;
        let name = d.name().map_err(|e| anyhow!("{e}"))?;
        if let Some(dir) = output_dir {
            let p = dir.join(format!("{}.npy", safe_name(name)));
            mote_std::write_npy(&p, &t.view())?;
            out.note(format!("output '{name}' -> {}", p.display()));
        }
        let s = stats(t);
        let deq = mote_std::compiled::dequantize(&d, t);
        if out.json {
            outputs_json.push(json!({
                "name": name, "dtype": t.dtype().name(), "shape": t.shape(),
                "values": t.to_f64_vec(), "dequantized": deq,
            }));
        } else {
            out.line(format!(
                "output '{}': {} {}  min {} max {} mean {:.4}",
                name,
                t.dtype(),
                fmt_shape(t.shape()),
                s.min,
                s.max,
                s.mean
            ));
            let vals: Vec<String> = t
                .to_f64_vec()
                .iter()
                .take(16)
                .map(|v| v.to_string())
                .collect();
            out.line(format!(
                "  values: {}{}",
                vals.join(" "),
                if t.numel() > 16 { " ..." } else { "" }
            ));
            if let Some(v) = deq {
                let top = v
                    .iter()
                    .enumerate()
                    .fold(
                        (0, f32::NEG_INFINITY),
                        |a, (i, &x)| if x > a.1 { (i, x) } else { a },
                    );
                out.line(format!("  dequantized: top1 {} ({:.4})", top.0, top.1));
            }
        }
    }
    if out.json {
        out.line(json!({"outputs": outputs_json, "arena_bytes": m.arena_bytes()}).to_string());
    } else {
        out.line(format!(
            "arena: {} bytes (lower bound {} bytes), {} steps (compiled)",
            m.arena_bytes(),
            m.arena_lower_bound(),
            m.num_steps()
        ));
    }
    Ok(())
}
