//! Post-training static quantization to a standard QDQ ONNX model.
//!
//! Activations feeding quantizable nodes get `QuantizeLinear` →
//! `DequantizeLinear` pairs (int8, asymmetric by default, symmetric on
//! request); weights are stored as int8 symmetric initializers followed by a
//! `DequantizeLinear` (per tensor, or per output channel: axis 0 for `Conv`
//! and transposed `Gemm` weights, axis 1 for `MatMul`/`Gemm` `[K,N]`
//! weights); `Conv`/`Gemm` biases as int32 with scale `x_scale * w_scale`
//! and zero point 0. As in onnxruntime's QDQ format, a `Relu`/`Clip` that
//! is the only consumer of a quantized node's output is folded into that
//! output's quantization (asymmetric activations only), and
//! `MaxPool`/`Reshape`/`Transpose`/`Flatten`/`Squeeze`/`Unsqueeze` outputs
//! share their input's scale and zero point.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use mote_core::Model;
use mote_proto::{
    attribute_proto, type_proto, AttributeProto, Message, ModelProto, NodeProto, TensorProto,
    TypeProto, ValueInfoProto,
};

use crate::error::{Error, Result};
use crate::session::SessionBuilder;
use crate::tensor::Tensor;

/// How activation ranges are chosen from calibration data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Observed minimum and maximum.
    MinMax,
    /// Clip `|x|` at its 99.99th percentile (2048-bin histogram).
    Percentile,
    /// Clip `|x|` at the threshold minimizing the KL divergence between the
    /// 2048-bin histogram and its 128-level quantization (TensorRT's method).
    Entropy,
}

/// Options of [`quantize`].
#[derive(Clone, Debug)]
pub struct Options {
    /// Calibration method.
    pub method: Method,
    /// Per-channel weight scales.
    pub per_channel: bool,
    /// Symmetric activations (zero point 0).
    pub symmetric_activations: bool,
    /// Node names left in float.
    pub exclude: Vec<String>,
}

/// One calibration sample: a tensor per graph input.
pub type Sample = Vec<(String, Tensor)>;

/// What [`quantize`] reports besides the model.
#[derive(Debug, Clone)]
pub struct Report {
    /// Nodes quantized (op type counts).
    pub quantized_nodes: BTreeMap<String, usize>,
    /// Activation tensors given a Q/DQ pair.
    pub activations: usize,
    /// Weights stored as int8.
    pub weights: usize,
    /// Relu/Clip nodes folded into the preceding output's quantization.
    pub folded: usize,
}

/// Reads calibration samples from `dir`. For every graph input `NAME`
/// (file-safe form, see [`crate::safe_name`]) either `DIR/NAME.npy` holds
/// all samples stacked on the first axis (sample k is `x[k:k+1]`), or
/// `DIR/NAME/` holds one `.npy` per sample, taken in file-name order.
pub fn read_calibration(dir: &Path, input_names: &[String]) -> Result<Vec<Sample>> {
    let mut per_input: Vec<Vec<Tensor>> = Vec::new();
    for name in input_names {
        let safe = crate::safe_name(name);
        let stacked = dir.join(format!("{safe}.npy"));
        let sub = dir.join(&safe);
        let tensors = if stacked.is_file() {
            let t = crate::read_npy(&stacked)?;
            let shape = t.shape().to_vec();
            let Some((&n, rest)) = shape.split_first() else {
                return Err(Error::Input(format!(
                    "{}: expected a sample axis first, got a scalar",
                    stacked.display()
                )));
            };
            let mut one = vec![1usize];
            one.extend_from_slice(rest);
            let step = t.bytes().len() / n.max(1);
            (0..n)
                .map(|k| Tensor::from_bytes(t.dtype(), &one, &t.bytes()[k * step..(k + 1) * step]))
                .collect::<Result<Vec<_>>>()?
        } else if sub.is_dir() {
            let mut files: Vec<_> = std::fs::read_dir(&sub)
                .map_err(|e| Error::io(&sub, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "npy"))
                .collect();
            files.sort();
            files
                .iter()
                .map(crate::read_npy)
                .collect::<Result<Vec<_>>>()?
        } else {
            return Err(Error::Input(format!(
                "no calibration data for input '{name}': expected {} or {}/*.npy",
                stacked.display(),
                sub.display()
            )));
        };
        if tensors.is_empty() {
            return Err(Error::Input(format!(
                "no calibration samples for input '{name}' in {}",
                dir.display()
            )));
        }
        per_input.push(tensors);
    }
    let n = per_input.first().map_or(0, Vec::len);
    if let Some((i, v)) = per_input.iter().enumerate().find(|(_, v)| v.len() != n) {
        return Err(Error::Input(format!(
            "calibration: input '{}' has {} samples, input '{}' has {n}",
            input_names[i],
            v.len(),
            input_names[0]
        )));
    }
    Ok((0..n)
        .map(|k| {
            input_names
                .iter()
                .zip(&per_input)
                .map(|(name, v)| (name.clone(), v[k].clone()))
                .collect()
        })
        .collect())
}

const QUANT_OPS: &[&str] = &[
    "Conv",
    "MatMul",
    "Gemm",
    "Add",
    "Mul",
    "AveragePool",
    "GlobalAveragePool",
    "MaxPool",
    "Concat",
];
/// Outputs take their input's quantization parameters.
const SHARED_OPS: &[&str] = &[
    "MaxPool",
    "Reshape",
    "Transpose",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
];
const ACT_OPS: &[&str] = &["Relu", "Clip"];

fn s(o: &Option<String>) -> &str {
    o.as_deref().unwrap_or("")
}

fn attr_i(n: &NodeProto, name: &str, default: i64) -> i64 {
    n.attribute
        .iter()
        .find(|a| s(&a.name) == name)
        .and_then(|a| a.i)
        .unwrap_or(default)
}

/// Float values of an initializer (raw_data or float_data).
fn float_values(t: &TensorProto) -> Option<Vec<f32>> {
    if t.data_type != Some(1) {
        return None;
    }
    match &t.raw_data {
        Some(raw) if !raw.is_empty() => Some(
            raw.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        _ => Some(t.float_data.clone()),
    }
}

/// The plan of the rewrite: which tensors get Q/DQ, which nodes are folded.
struct Plan {
    /// Activation tensors to quantize, in first-seen order.
    acts: Vec<String>,
    /// tensor -> tensor whose parameters it shares.
    shared: BTreeMap<String, String>,
    /// Indices of folded Relu/Clip nodes, and (upstream output -> act output).
    folded: BTreeMap<usize, (String, String)>,
    /// Indices of quantized nodes.
    quantized: BTreeSet<usize>,
}

fn make_plan(m: &ModelProto, opt: &Options) -> Result<Plan> {
    let g = m
        .graph
        .as_ref()
        .ok_or_else(|| Error::Model("model has no graph".into()))?;
    let inits: BTreeSet<&str> = g.initializer.iter().map(|t| s(&t.name)).collect();
    let mut float: BTreeSet<String> = BTreeSet::new();
    for i in &g.input {
        if let Some(TypeProto {
            value: Some(type_proto::Value::TensorType(t)),
            ..
        }) = &i.r#type
        {
            if t.elem_type == Some(1) {
                float.insert(s(&i.name).to_string());
            }
        }
    }
    for t in &g.initializer {
        if t.data_type == Some(1) {
            float.insert(s(&t.name).to_string());
        }
    }
    let mut consumers: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &g.node {
        for i in &n.input {
            *consumers.entry(i.as_str()).or_default() += 1;
        }
    }
    let outputs: BTreeSet<&str> = g.output.iter().map(|o| s(&o.name)).collect();
    let mut plan = Plan {
        acts: Vec::new(),
        shared: BTreeMap::new(),
        folded: BTreeMap::new(),
        quantized: BTreeSet::new(),
    };
    let add = |plan: &mut Plan, t: &str| {
        if !t.is_empty() && !inits.contains(t) && !plan.acts.iter().any(|a| a == t) {
            plan.acts.push(t.to_string());
        }
    };
    // Which node produces each tensor.
    let mut producer: BTreeMap<&str, usize> = BTreeMap::new();
    for (k, n) in g.node.iter().enumerate() {
        for o in &n.output {
            producer.insert(o.as_str(), k);
        }
    }
    for (k, n) in g.node.iter().enumerate() {
        let op = s(&n.op_type);
        let in0_float = n.input.first().is_some_and(|i| float.contains(i));
        let known = s(&n.domain).is_empty()
            && (QUANT_OPS.contains(&op) || SHARED_OPS.contains(&op) || ACT_OPS.contains(&op));
        if in0_float && known {
            for o in &n.output {
                float.insert(o.clone());
            }
        }
        if !in0_float || !known || opt.exclude.iter().any(|e| e == s(&n.name)) {
            continue;
        }
        let in0 = n.input[0].as_str();
        if QUANT_OPS.contains(&op) {
            plan.quantized.insert(k);
            let n_act_in = match op {
                "Conv" | "Gemm" | "MatMul" => 2,
                "Add" | "Mul" => 2,
                "Concat" => n.input.len(),
                _ => 1,
            };
            for i in n.input.iter().take(n_act_in) {
                if float.contains(i) {
                    add(&mut plan, i);
                }
            }
            add(&mut plan, &n.output[0]);
            if op == "MaxPool" {
                plan.shared.insert(n.output[0].clone(), in0.to_string());
            }
        } else if SHARED_OPS.contains(&op) {
            if plan.acts.iter().any(|a| a == in0) {
                plan.quantized.insert(k);
                add(&mut plan, &n.output[0]);
                plan.shared.insert(n.output[0].clone(), in0.to_string());
            }
        } else if ACT_OPS.contains(&op) && plan.acts.iter().any(|a| a == in0) {
            let up_quantized = producer
                .get(in0)
                .is_some_and(|p| plan.quantized.contains(p));
            if !opt.symmetric_activations
                && up_quantized
                && consumers.get(in0) == Some(&1)
                && !outputs.contains(in0)
            {
                plan.folded
                    .insert(k, (in0.to_string(), n.output[0].clone()));
                // The upstream output now is this node's output.
                plan.acts.retain(|a| a != in0);
                add(&mut plan, &n.output[0]);
            } else {
                plan.quantized.insert(k);
                add(&mut plan, &n.output[0]);
            }
        }
    }
    Ok(plan)
}

/// Per-tensor statistics gathered over the calibration set.
#[derive(Clone, Debug)]
struct Stat {
    min: f32,
    max: f32,
    count: u64,
    hist: Vec<u64>,
}

const BINS: usize = 2048;
/// Levels of the quantized histogram in the entropy search (8-bit |x|).
const QBINS: usize = 128;

/// Histogram bins: 2048 for percentile; for entropy 2048 only with enough
/// values (about 16 per bin, in steps of 128), since a sparse histogram
/// makes the KL search pick a far too small threshold.
fn bins(method: Method, count: u64) -> usize {
    match method {
        Method::Entropy => ((count / 16) as usize / QBINS * QBINS).clamp(QBINS, BINS),
        _ => BINS,
    }
}

fn progress(n: usize, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(n as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg:>12} [{bar:40}] {pos}/{len} samples ({elapsed})",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_string());
    pb
}

/// Runs the float model with `names` exposed as outputs on every sample.
fn calibrate(
    m: &ModelProto,
    names: &[String],
    samples: &[Sample],
    method: Method,
) -> Result<BTreeMap<String, Stat>> {
    let mut m = m.clone();
    let g = m
        .graph
        .as_mut()
        .ok_or_else(|| Error::Model("model has no graph".into()))?;
    let existing: BTreeSet<String> = g.output.iter().map(|o| s(&o.name).to_string()).collect();
    let inputs: BTreeSet<String> = g.input.iter().map(|o| s(&o.name).to_string()).collect();
    for n in names {
        if !existing.contains(n) && !inputs.contains(n) {
            g.output.push(ValueInfoProto {
                name: Some(n.clone()),
                r#type: Some(TypeProto {
                    value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                        elem_type: Some(1),
                        shape: None,
                    })),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    let model = Arc::new(Model::from_onnx(&m.encode_to_vec()).map_err(|e| {
        Error::Model(format!(
            "calibration model: {}",
            Model::default().explain(&e)
        ))
    })?);
    let out_names: Vec<String> = model.output_names().map(String::from).collect();
    let mut stats: BTreeMap<String, Stat> = names
        .iter()
        .map(|n| {
            (
                n.clone(),
                Stat {
                    min: f32::INFINITY,
                    max: f32::NEG_INFINITY,
                    count: 0,
                    hist: Vec::new(),
                },
            )
        })
        .collect();
    let passes = if method == Method::MinMax { 1 } else { 2 };
    for pass in 0..passes {
        let pb = progress(
            samples.len(),
            if pass == 0 {
                "calibrating"
            } else {
                "histograms"
            },
        );
        let mut session = None::<(Vec<Vec<usize>>, crate::Session)>;
        for sample in samples {
            let shapes: Vec<Vec<usize>> = sample.iter().map(|(_, t)| t.shape().to_vec()).collect();
            if session.as_ref().is_none_or(|(s, _)| *s != shapes) {
                let mut b = SessionBuilder::from_model(model.clone());
                for (n, t) in sample {
                    b = b.input_shape(n, t.shape());
                }
                session = Some((shapes, b.build()?));
            }
            let Some((_, sess)) = session.as_mut() else {
                continue;
            };
            let args: Vec<(&str, Tensor)> = sample
                .iter()
                .map(|(n, t)| (n.as_str(), t.clone()))
                .collect();
            let outs = sess.run(&args)?;
            let mut values: Vec<(&str, Vec<f32>)> = out_names
                .iter()
                .zip(outs.iter())
                .map(|(n, t)| (n.as_str(), t.to_f32_vec()))
                .collect();
            for (n, t) in sample {
                values.push((n.as_str(), t.to_f32_vec()));
            }
            for (n, v) in values {
                let Some(st) = stats.get_mut(n) else { continue };
                if pass == 0 {
                    for &x in &v {
                        if x.is_finite() {
                            st.min = st.min.min(x);
                            st.max = st.max.max(x);
                            st.count += 1;
                        }
                    }
                } else {
                    let amax = st.min.abs().max(st.max.abs());
                    if st.hist.is_empty() {
                        st.hist = vec![0; bins(method, st.count)];
                    }
                    let nb = st.hist.len();
                    if amax > 0.0 {
                        for &x in &v {
                            if x.is_finite() {
                                let b = ((x.abs() / amax) * nb as f32) as usize;
                                st.hist[b.min(nb - 1)] += 1;
                            }
                        }
                    }
                }
            }
            pb.inc(1);
        }
        pb.finish();
    }
    for (n, st) in &stats {
        if !st.min.is_finite() {
            return Err(Error::Model(format!(
                "calibration: tensor '{n}' had no finite values"
            )));
        }
    }
    Ok(stats)
}

/// The clipping threshold of `|x|` chosen from the histogram.
fn threshold(st: &Stat, method: Method) -> f32 {
    let amax = st.min.abs().max(st.max.abs());
    let total: u64 = st.hist.iter().sum();
    if method == Method::MinMax || total == 0 || amax == 0.0 {
        return amax;
    }
    let nb = st.hist.len();
    let width = amax / nb as f32;
    match method {
        Method::MinMax => amax,
        Method::Percentile => {
            let want = (total as f64 * 0.9999).ceil() as u64;
            let mut acc = 0u64;
            for (i, &c) in st.hist.iter().enumerate() {
                acc += c;
                if acc >= want {
                    return (i + 1) as f32 * width;
                }
            }
            amax
        }
        Method::Entropy => {
            const Q: usize = QBINS;
            let mut best = (f64::INFINITY, nb);
            for i in Q..=nb {
                // Reference: the first i bins, outliers folded into the last.
                let mut p: Vec<f64> = st.hist[..i].iter().map(|&c| c as f64).collect();
                p[i - 1] += st.hist[i..].iter().sum::<u64>() as f64;
                // Candidate: the first i bins merged into Q levels, spread
                // back evenly over the bins that were non-empty.
                let mut q = vec![0f64; i];
                for j in 0..Q {
                    let (a, b) = (j * i / Q, ((j + 1) * i / Q).max(j * i / Q + 1));
                    let b = b.min(i);
                    let sum: f64 = st.hist[a..b].iter().map(|&c| c as f64).sum();
                    let nz = st.hist[a..b].iter().filter(|&&c| c > 0).count();
                    if nz > 0 {
                        for k in a..b {
                            if st.hist[k] > 0 {
                                q[k] = sum / nz as f64;
                            }
                        }
                    }
                }
                let (ps, qs): (f64, f64) = (p.iter().sum(), q.iter().sum());
                if ps == 0.0 || qs == 0.0 {
                    continue;
                }
                let mut kl = 0.0;
                for k in 0..i {
                    if p[k] > 0.0 {
                        let pk = p[k] / ps;
                        let qk = (q[k] / qs).max(1e-12);
                        kl += pk * (pk / qk).ln();
                    }
                }
                if kl < best.0 {
                    best = (kl, i);
                }
            }
            best.1 as f32 * width
        }
    }
}

/// (scale, zero point) of an activation range.
fn act_params(min: f32, max: f32, symmetric: bool) -> (f32, i8) {
    let (min, max) = (min.min(0.0), max.max(0.0));
    if symmetric {
        let a = min.abs().max(max.abs());
        let scale = if a > 0.0 { a / 127.0 } else { 1.0 };
        return (scale, 0);
    }
    let scale = if max > min { (max - min) / 255.0 } else { 1.0 };
    let zp = (-128.0 - min / scale).round().clamp(-128.0, 127.0);
    (scale, zp as i8)
}

fn f32_tensor(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(1),
        raw_data: Some(
            v.iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        ),
        ..Default::default()
    }
}

fn i8_tensor(name: &str, dims: &[i64], v: &[i8]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(3),
        raw_data: Some(v.iter().map(|&x| x as u8).collect::<Vec<u8>>().into()),
        ..Default::default()
    }
}

fn i32_tensor(name: &str, dims: &[i64], v: &[i32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(6),
        raw_data: Some(
            v.iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        ),
        ..Default::default()
    }
}

fn qdq_node(op: &str, name: String, inputs: [&str; 3], out: &str, axis: Option<i64>) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        name: Some(name),
        op_type: Some(op.into()),
        attribute: axis
            .map(|a| AttributeProto {
                name: Some("axis".into()),
                r#type: Some(attribute_proto::AttributeType::Int as i32),
                i: Some(a),
                ..Default::default()
            })
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

/// Quantizes `w` (shape `dims`) symmetric int8 along `axis` (or per tensor).
fn quantize_weight(w: &[f32], dims: &[i64], axis: Option<usize>) -> (Vec<i8>, Vec<f32>) {
    let du: Vec<usize> = dims.iter().map(|&d| d.max(0) as usize).collect();
    let (channels, inner) = match axis {
        Some(a) if a < du.len() => (du[a], du[a + 1..].iter().product::<usize>()),
        _ => (1, w.len().max(1)),
    };
    let ch_of = |i: usize| {
        if channels == 1 {
            0
        } else {
            (i / inner) % channels
        }
    };
    let mut amax = vec![0f32; channels];
    for (i, &x) in w.iter().enumerate() {
        amax[ch_of(i)] = amax[ch_of(i)].max(x.abs());
    }
    let scales: Vec<f32> = amax
        .iter()
        .map(|&a| if a > 0.0 { a / 127.0 } else { 1.0 })
        .collect();
    let q = w
        .iter()
        .enumerate()
        .map(|(i, &x)| (x / scales[ch_of(i)]).round().clamp(-127.0, 127.0) as i8)
        .collect();
    (q, scales)
}

/// Quantizes a float model (decoded ONNX) with calibration `samples`.
pub fn quantize(m: &ModelProto, samples: &[Sample], opt: &Options) -> Result<(ModelProto, Report)> {
    let opset = m
        .opset_import
        .iter()
        .find(|o| s(&o.domain).is_empty())
        .and_then(|o| o.version)
        .unwrap_or(1);
    if opset < 13 {
        return Err(Error::Model(format!(
            "quantize: expected a model of opset 13 or later (per-axis DequantizeLinear), got opset {opset}"
        )));
    }
    let plan = make_plan(m, opt)?;
    let stats = calibrate(m, &plan.acts, samples, opt.method)?;
    let mut out = m.clone();
    let g = out
        .graph
        .as_mut()
        .ok_or_else(|| Error::Model("model has no graph".into()))?;
    // Activation parameters (shared ones take their source's).
    let mut params: BTreeMap<String, (f32, i8)> = BTreeMap::new();
    for a in &plan.acts {
        let st = &stats[a];
        let t = threshold(st, opt.method);
        let (lo, hi) = (st.min.max(-t), st.max.min(t));
        params.insert(a.clone(), act_params(lo, hi, opt.symmetric_activations));
    }
    for a in &plan.acts {
        let mut src = a;
        let mut hops = 0;
        while let Some(s2) = plan.shared.get(src) {
            if !params.contains_key(s2) || hops > plan.shared.len() {
                break;
            }
            src = s2;
            hops += 1;
        }
        let p = params[src];
        params.insert(a.clone(), p);
    }
    let graph_outputs: BTreeSet<String> = g.output.iter().map(|o| s(&o.name).to_string()).collect();
    let inits: BTreeMap<String, TensorProto> = g
        .initializer
        .iter()
        .map(|t| (s(&t.name).to_string(), t.clone()))
        .collect();
    let mut new_inits: Vec<TensorProto> = Vec::new();
    let mut removed_inits: BTreeSet<String> = BTreeSet::new();
    let mut report = Report {
        quantized_nodes: BTreeMap::new(),
        activations: plan.acts.len(),
        weights: 0,
        folded: plan.folded.len(),
    };
    // Renames: activation name -> its dequantized name (for consumers).
    let mut dq_name: BTreeMap<String, String> = BTreeMap::new();
    let mut nodes: Vec<NodeProto> = Vec::new();
    let emit_act = |a: &str,
                    nodes: &mut Vec<NodeProto>,
                    new_inits: &mut Vec<TensorProto>,
                    dq_name: &mut BTreeMap<String, String>,
                    src: &str| {
        let (scale, zp) = params[a];
        let (sn, zn) = (format!("{a}_scale"), format!("{a}_zero_point"));
        new_inits.push(f32_tensor(&sn, &[], &[scale]));
        new_inits.push(i8_tensor(&zn, &[], &[zp]));
        let qn = format!("{a}_QuantizeLinear_Output");
        nodes.push(qdq_node(
            "QuantizeLinear",
            format!("{a}_QuantizeLinear"),
            [src, &sn, &zn],
            &qn,
            None,
        ));
        let dn = if src != a {
            a.to_string()
        } else {
            format!("{a}_DequantizeLinear_Output")
        };
        nodes.push(qdq_node(
            "DequantizeLinear",
            format!("{a}_DequantizeLinear"),
            [&qn, &sn, &zn],
            &dn,
            None,
        ));
        dq_name.insert(a.to_string(), dn);
    };
    let graph_inputs: Vec<String> = g.input.iter().map(|i| s(&i.name).to_string()).collect();
    for gi in &graph_inputs {
        if plan.acts.contains(gi) {
            emit_act(gi, &mut nodes, &mut new_inits, &mut dq_name, gi);
        }
    }
    // Clip bounds of folded nodes, dropped below when nothing else reads them.
    let folded_extra: BTreeSet<String> = plan
        .folded
        .keys()
        .filter_map(|&k| g.node.get(k))
        .flat_map(|n| n.input.iter().skip(1).cloned())
        .collect();
    let old_nodes = std::mem::take(&mut g.node);
    let folded_up: BTreeMap<String, String> = plan.folded.values().cloned().collect();
    for (k, mut n) in old_nodes.into_iter().enumerate() {
        if plan.folded.contains_key(&k) {
            continue;
        }
        // The upstream of a folded activation writes the activation's output.
        for o in n.output.iter_mut() {
            if let Some(f) = folded_up.get(o) {
                *o = f.clone();
            }
        }
        let op = s(&n.op_type).to_string();
        if plan.quantized.contains(&k) {
            *report.quantized_nodes.entry(op.clone()).or_default() += 1;
            let node_name = if s(&n.name).is_empty() {
                format!("node{k}")
            } else {
                s(&n.name).to_string()
            };
            // Weights and biases.
            let weight_axis = match op.as_str() {
                "Conv" => Some(0),
                "MatMul" => Some(1),
                "Gemm" => Some(if attr_i(&n, "transB", 0) != 0 { 0 } else { 1 }),
                _ => None,
            };
            let mut w_scales: Option<Vec<f32>> = None;
            let n_w = match op.as_str() {
                "Conv" | "MatMul" | "Gemm" | "Add" | "Mul" => 2,
                _ => 0,
            };
            for idx in 0..n.input.len().min(n_w) {
                let name = n.input[idx].clone();
                let Some(t) = inits.get(&name) else { continue };
                let Some(w) = float_values(t) else { continue };
                let axis = if idx == 1 && opt.per_channel && t.dims.len() >= 2 {
                    weight_axis
                } else {
                    None
                };
                let (q, scales) = quantize_weight(&w, &t.dims, axis);
                if idx == 1 && weight_axis.is_some() {
                    w_scales = Some(scales.clone());
                }
                if removed_inits.insert(name.clone()) {
                    let qn = format!("{name}_quantized");
                    let (sn, zn) = (format!("{name}_scale"), format!("{name}_zero_point"));
                    let sd: Vec<i64> = if axis.is_some() {
                        vec![scales.len() as i64]
                    } else {
                        vec![]
                    };
                    new_inits.push(i8_tensor(&qn, &t.dims, &q));
                    new_inits.push(f32_tensor(&sn, &sd, &scales));
                    new_inits.push(i8_tensor(&zn, &sd, &vec![0; scales.len()]));
                    nodes.push(qdq_node(
                        "DequantizeLinear",
                        format!("{name}_DequantizeLinear"),
                        [&qn, &sn, &zn],
                        &name,
                        axis.map(|a| a as i64),
                    ));
                    report.weights += 1;
                }
            }
            if (op == "Conv" || op == "Gemm") && n.input.len() > 2 {
                let bname = n.input[2].clone();
                let x = &n.input[0];
                if let (Some(t), Some(ws), Some(&(xs, _))) =
                    (inits.get(&bname), w_scales.as_ref(), params.get(x))
                {
                    if let Some(b) = float_values(t) {
                        let per = ws.len() > 1;
                        let scales: Vec<f32> = if per {
                            ws.iter().map(|w| w * xs).collect()
                        } else {
                            vec![ws[0] * xs]
                        };
                        let q: Vec<i32> = b
                            .iter()
                            .enumerate()
                            .map(|(i, &v)| {
                                let sc = scales[if per { i.min(scales.len() - 1) } else { 0 }];
                                (v / sc).round().clamp(i32::MIN as f32, i32::MAX as f32) as i32
                            })
                            .collect();
                        let base = format!("{bname}_{node_name}");
                        let (qn, sn, zn) = (
                            format!("{base}_quantized"),
                            format!("{base}_scale"),
                            format!("{base}_zero_point"),
                        );
                        let sd: Vec<i64> = if per {
                            vec![scales.len() as i64]
                        } else {
                            vec![]
                        };
                        new_inits.push(i32_tensor(&qn, &t.dims, &q));
                        new_inits.push(f32_tensor(&sn, &sd, &scales));
                        new_inits.push(i32_tensor(&zn, &sd, &vec![0; scales.len()]));
                        let dn = format!("{base}_dequantized");
                        nodes.push(qdq_node(
                            "DequantizeLinear",
                            format!("{base}_DequantizeLinear"),
                            [&qn, &sn, &zn],
                            &dn,
                            per.then_some(0),
                        ));
                        n.input[2] = dn;
                        removed_inits.insert(bname);
                    }
                }
            }
        }
        // Consumers read dequantized activations.
        for i in n.input.iter_mut() {
            if let Some(d) = dq_name.get(i.as_str()) {
                *i = d.clone();
            }
        }
        let outs = n.output.clone();
        let mut pending = Vec::new();
        for o in n.output.iter_mut() {
            if plan.acts.contains(o) && graph_outputs.contains(o) {
                // Keep the graph output's name on the dequantized value.
                let pre = format!("{o}_prequant");
                pending.push((o.clone(), pre.clone()));
                *o = pre;
            }
        }
        nodes.push(n);
        for o in outs {
            if plan.acts.contains(&o) {
                let src = pending
                    .iter()
                    .find(|(a, _)| *a == o)
                    .map_or(o.clone(), |(_, p)| p.clone());
                emit_act(&o, &mut nodes, &mut new_inits, &mut dq_name, &src);
            }
        }
    }
    g.node = nodes;
    // Float weights still read by some node stay; the rest go.
    let still_used: BTreeSet<String> = g
        .node
        .iter()
        .flat_map(|n| n.input.iter().cloned())
        .collect();
    let produced: BTreeSet<String> = g
        .node
        .iter()
        .flat_map(|n| n.output.iter().cloned())
        .collect();
    g.initializer.retain(|t| {
        let n = s(&t.name);
        let gone = removed_inits.contains(n) || folded_extra.contains(n);
        !(gone && (produced.contains(n) || !still_used.contains(n)))
    });
    g.input
        .retain(|i| !(removed_inits.contains(s(&i.name)) && produced.contains(s(&i.name))));
    g.initializer.extend(new_inits);
    Ok((out, report))
}

/// Decodes an ONNX file.
pub fn read_model_proto(path: &Path) -> Result<ModelProto> {
    let buf = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    mote_proto::decode_model(buf.into()).map_err(|_| {
        Error::Model(format!(
            "not an ONNX model or truncated: {}",
            path.display()
        ))
    })
}

/// Accuracy figures of a quantized model against its float model.
#[derive(Debug, Clone, Copy)]
pub struct Agreement {
    /// Rows of the first output whose argmax agrees.
    pub top1: f64,
    /// Max |float - quantized| over the first output.
    pub max_abs: f64,
    /// Mean |float - quantized| over the first output.
    pub mean_abs: f64,
    /// Rows compared.
    pub rows: usize,
}

/// Runs both models (in mote) on every sample and compares their first outputs.
pub fn compare(float: &[u8], quant: &[u8], samples: &[Sample]) -> Result<Agreement> {
    let load = |b: &[u8], what: &str| {
        Model::from_onnx(b)
            .map(Arc::new)
            .map_err(|e| Error::Model(format!("{what} model: {}", Model::default().explain(&e))))
    };
    let (fm, qm) = (load(float, "float")?, load(quant, "quantized")?);
    let (mut agree, mut rows, mut max_abs, mut sum_abs, mut count) =
        (0usize, 0usize, 0f64, 0f64, 0usize);
    let pb = progress(samples.len(), "comparing");
    for sample in samples {
        let mut outs = Vec::new();
        for m in [&fm, &qm] {
            let mut b = SessionBuilder::from_model(m.clone());
            for (n, t) in sample {
                b = b.input_shape(n, t.shape());
            }
            let mut sess = b.build()?;
            let args: Vec<(&str, Tensor)> = sample
                .iter()
                .map(|(n, t)| (n.as_str(), t.clone()))
                .collect();
            let o = sess.run(&args)?;
            let first = o
                .into_iter()
                .next()
                .ok_or_else(|| Error::Model("model has no outputs".into()))?;
            outs.push(first);
        }
        let (f, q) = (outs[0].to_f64_vec(), outs[1].to_f64_vec());
        for (a, b) in f.iter().zip(&q) {
            let d = (a - b).abs();
            max_abs = max_abs.max(d);
            sum_abs += d;
            count += 1;
        }
        let width = outs[0].shape().last().copied().unwrap_or(1).max(1);
        for (rf, rq) in f.chunks(width).zip(q.chunks(width)) {
            let am = |r: &[f64]| {
                r.iter()
                    .enumerate()
                    .fold(
                        (0, f64::NEG_INFINITY),
                        |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                    )
                    .0
            };
            agree += usize::from(am(rf) == am(rq));
            rows += 1;
        }
        pb.inc(1);
    }
    pb.finish();
    Ok(Agreement {
        top1: agree as f64 / rows.max(1) as f64,
        max_abs,
        mean_abs: sum_abs / count.max(1) as f64,
        rows,
    })
}
