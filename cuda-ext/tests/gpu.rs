//! The CUDA provider against the CPU provider (mote-core's kernels).
//!
//! Every case is a small graph built here. On every machine, each case
//! checks which steps the provider claims (the partition needs no GPU).
//! Where a GPU is present, each case also runs on both providers and the
//! outputs must agree within 1e-4 relative (f32): max |gpu - cpu| over an
//! output, divided by the output's max |cpu|. Without a GPU the value
//! checks print `skipped: <reason>` and pass.
//!
//! `MOTE_GPU_MODELS=dir` adds every `*.onnx` in `dir` (the model set of
//! `cuda-ext/device-check.sh`), compared the same way.

use std::sync::{Arc, OnceLock};

use mote_core::model::{Attr, AttrValue, Const, Dim, Graph, Node, TensorInfo};
use mote_core::provider::partition;
use mote_core::{DType, Model, Plan, Session, TensorView};
use mote_cuda::{CudaCapability, CudaExecutor, CudaProvider};

/// The GPU, or the reason there is none (printed once per test).
fn gpu() -> Result<Arc<CudaProvider>, String> {
    static P: OnceLock<Result<Arc<CudaProvider>, String>> = OnceLock::new();
    P.get_or_init(|| {
        let ordinal = std::env::var("MOTE_CUDA_DEVICE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        CudaProvider::new(ordinal)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    })
    .clone()
}

fn rnd(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// A graph under construction.
struct G {
    g: Graph,
    opset: i64,
    feeds: Feeds,
    seed: u64,
    range: (f32, f32),
}

impl G {
    fn new(opset: i64) -> Self {
        G {
            g: Graph::default(),
            opset,
            feeds: Vec::new(),
            seed: 7,
            range: (-2.0, 2.0),
        }
    }
    fn positive(mut self) -> Self {
        self.range = (0.25, 2.0);
        self
    }
    fn tensor(
        &mut self,
        name: &str,
        dtype: Option<DType>,
        shape: Option<&[usize]>,
        value: Option<Const>,
    ) -> u32 {
        self.g.tensors.push(TensorInfo {
            name: name.into(),
            dtype,
            shape: shape.map(|s| s.iter().map(|&d| Dim::Fixed(d)).collect()),
            value,
            onnx_type: 0,
        });
        (self.g.tensors.len() - 1) as u32
    }
    fn input(&mut self, shape: &[usize]) -> u32 {
        let name = format!("in{}", self.g.tensors.len());
        let t = self.tensor(&name, Some(DType::F32), Some(shape), None);
        self.g.inputs.push(t);
        self.seed += 1;
        let n = shape.iter().product();
        self.feeds.push((
            name,
            shape.to_vec(),
            rnd(n, self.seed, self.range.0, self.range.1),
        ));
        t
    }
    fn weight(&mut self, shape: &[usize]) -> u32 {
        self.seed += 1;
        let v = rnd(shape.iter().product(), self.seed, -1.0, 1.0);
        self.constant(shape, &v)
    }
    fn constant<T: mote_core::Element>(&mut self, shape: &[usize], v: &[T]) -> u32 {
        let c = Const::from_slice(shape, v).unwrap();
        let name = format!("c{}", self.g.tensors.len());
        self.tensor(&name, Some(c.dtype), Some(shape), Some(c))
    }
    fn node(&mut self, op: &str, ins: &[Option<u32>], attrs: Vec<(&str, AttrValue)>) -> u32 {
        let name = format!("t{}", self.g.tensors.len());
        let o = self.tensor(&name, None, None, None);
        self.g.nodes.push(Node {
            name: format!("{op}_{}", self.g.nodes.len()),
            op_type: op.into(),
            domain: String::new(),
            opset: self.opset,
            inputs: ins.to_vec(),
            outputs: vec![Some(o)],
            attrs: attrs
                .into_iter()
                .map(|(n, v)| Attr {
                    name: n.into(),
                    value: v,
                })
                .collect(),
        });
        o
    }
    fn op(&mut self, op: &str, ins: &[u32], attrs: Vec<(&str, AttrValue)>) -> u32 {
        let ins: Vec<Option<u32>> = ins.iter().map(|&t| Some(t)).collect();
        self.node(op, &ins, attrs)
    }
    fn model(mut self, outs: &[u32]) -> (Model, Feeds) {
        self.g.outputs = outs.to_vec();
        let m = Model {
            graph: self.g,
            opsets: vec![(String::new(), self.opset)],
            ..Model::default()
        };
        (m, self.feeds)
    }
}

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

type Feeds = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Outputs of one run on the CPU, and on the GPU when `exec` is given
/// (step by step with events when `profiled`, else as captured graphs).
fn run(m: &Model, plan: &Plan, feeds: &Feeds, exec: Option<&CudaExecutor>) -> Vec<Vec<f32>> {
    run_with(m, plan, feeds, exec, false)
}

fn run_with(
    m: &Model,
    plan: &Plan,
    feeds: &Feeds,
    exec: Option<&CudaExecutor>,
    profiled: bool,
) -> Vec<Vec<f32>> {
    let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
    let mut s = Session::new(m, plan, &mut arena).unwrap();
    let views: Vec<(&str, TensorView<'_>)> = feeds
        .iter()
        .map(|(n, sh, v)| (n.as_str(), TensorView::new(sh, v).unwrap()))
        .collect();
    match exec {
        Some(e) if profiled => {
            s.feed(&views).unwrap();
            let t = e.invoke_profiled(&mut s).unwrap();
            assert!(t.iter().all(|t| t.ms >= 0.0));
        }
        Some(e) => e.run(&mut s, &views).unwrap(),
        None => s.run(&views).unwrap(),
    }
    (0..plan.outputs().len())
        .map(|i| s.output(i).unwrap().f32().unwrap().to_vec())
        .collect()
}

/// Largest |gpu - cpu| of each output relative to that output's largest
/// |cpu| (the error against the tensor's scale: a deep model's logits near
/// zero differ in relative terms between any two summation orders).
fn max_rel(cpu: &[Vec<f32>], gpu: &[Vec<f32>]) -> f32 {
    let mut worst = 0f32;
    for (c, g) in cpu.iter().zip(gpu) {
        assert_eq!(c.len(), g.len());
        let scale = c
            .iter()
            .fold(0f32, |m, v| if v.is_nan() { m } else { m.max(v.abs()) });
        for (&a, &b) in c.iter().zip(g) {
            if a.is_nan() && b.is_nan() {
                continue;
            }
            worst = worst.max((a - b).abs() / scale.max(f32::MIN_POSITIVE));
        }
    }
    worst
}

/// Checks the claim (steps on the GPU) everywhere, values on a GPU.
fn check(name: &str, model: (Model, Feeds), gpu_steps: usize) {
    check_dims(name, model, gpu_steps, &[]);
}

/// [`check`] with symbolic dims bound.
fn check_dims(name: &str, (m, feeds): (Model, Feeds), gpu_steps: usize, dims: &[(&str, usize)]) {
    let mut b = m.session_builder();
    for (n, v) in dims {
        b = b.dim(n, *v);
    }
    let plan = b
        .plan()
        .unwrap_or_else(|e| panic!("{name}: {}", m.explain(&e)));
    let p = partition(&m, &plan, &CudaCapability).unwrap();
    assert_eq!(
        p.provider_steps(),
        gpu_steps,
        "{name}: steps claimed of {}",
        plan.num_steps()
    );
    let provider = match gpu() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("{name}: claim checked; values skipped: {why}");
            return;
        }
    };
    let exec = CudaExecutor::new(provider, &m, &plan).unwrap_or_else(|e| panic!("{name}: {e}"));
    let cpu = run(&m, &plan, &feeds, None);
    let gpu = run(&m, &plan, &feeds, Some(&exec));
    // Twice: the second run reuses the device arena and the uploads.
    let again = run(&m, &plan, &feeds, Some(&exec));
    let rel = max_rel(&cpu, &gpu);
    eprintln!(
        "{name}: {gpu_steps} GPU steps, max rel diff {rel:.2e} ({})",
        exec.summary()
    );
    assert!(
        rel <= 1e-4,
        "{name}: GPU differs from CPU by {rel:e} relative"
    );
    assert_eq!(gpu, again, "{name}: second GPU run differs");
    // Step by step (no graph) runs the same kernels in the same order.
    let stepped = run_with(&m, &plan, &feeds, Some(&exec), true);
    assert_eq!(
        gpu,
        stepped,
        "{name}: step-by-step run differs from the graph run ({})",
        exec.graphs()
    );
}

fn unary(op: &str, opset: i64, attrs: Vec<(&str, AttrValue)>, positive: bool) -> (Model, Feeds) {
    let mut g = G::new(opset);
    if positive {
        g = g.positive();
    }
    let x = g.input(&[2, 3, 5, 7]);
    let y = g.op(op, &[x], attrs);
    g.model(&[y])
}

#[test]
fn unary_ops() {
    for op in [
        "Relu",
        "Sigmoid",
        "Tanh",
        "HardSwish",
        "Exp",
        "Neg",
        "Abs",
        "Erf",
        "Softplus",
        "Floor",
        "Ceil",
    ] {
        check(op, unary(op, 14, vec![], false), 1);
    }
    for op in ["Sqrt", "Log", "Reciprocal"] {
        check(op, unary(op, 14, vec![], true), 1);
    }
    check(
        "LeakyRelu",
        unary(
            "LeakyRelu",
            14,
            vec![("alpha", AttrValue::Float(0.1))],
            false,
        ),
        1,
    );
    check(
        "HardSigmoid",
        unary(
            "HardSigmoid",
            14,
            vec![
                ("alpha", AttrValue::Float(0.3)),
                ("beta", AttrValue::Float(0.4)),
            ],
            false,
        ),
        1,
    );
    check(
        "Elu",
        unary("Elu", 14, vec![("alpha", AttrValue::Float(0.7))], false),
        1,
    );
    check("Gelu", unary("Gelu", 20, vec![], false), 1);
    // Clip with constant bounds (opset 13 inputs) and one omitted.
    let mut g = G::new(13);
    let x = g.input(&[4, 33]);
    let lo = g.constant(&[], &[-0.5f32]);
    let y = g.node("Clip", &[Some(x), Some(lo), None], vec![]);
    check("Clip", g.model(&[y]), 1);
}

#[test]
fn binary_ops() {
    let cases: [(&str, &[usize], &[usize]); 10] = [
        ("Add", &[2, 3, 4, 5], &[2, 3, 4, 5]),
        ("Add", &[2, 3, 4, 5], &[3, 1, 1]),
        ("Mul", &[2, 3, 4, 5], &[5]),
        ("Sub", &[2, 3, 4, 5], &[1]),
        ("Div", &[6, 1], &[1, 7]),
        ("Max", &[2, 3, 4, 5], &[4, 1]),
        ("Min", &[3, 4], &[3, 4]),
        ("Pow", &[3, 4], &[3, 4]),
        ("PRelu", &[2, 3, 4, 5], &[3, 1, 1]),
        ("Add", &[1, 3, 1, 5], &[2, 1, 4, 1]),
    ];
    for (op, a, b) in cases {
        let mut g = G::new(13);
        if op == "Pow" || op == "Div" {
            g = g.positive();
        }
        let x = g.input(a);
        let z = g.input(b);
        let y = g.op(op, &[x, z], vec![]);
        check(&format!("{op} {a:?} {b:?}"), g.model(&[y]), 1);
    }
}

#[test]
fn gemm_and_matmul() {
    // Gemm, transB, bias [N] (a Linear layer).
    let mut g = G::new(13);
    let x = g.input(&[3, 64]);
    let w = g.weight(&[10, 64]);
    let b = g.weight(&[10]);
    let y = g.op("Gemm", &[x, w, b], vec![("transB", AttrValue::Int(1))]);
    check("Gemm transB bias", g.model(&[y]), 1);
    // transA, alpha, beta, C [M, N].
    let mut g = G::new(13);
    let x = g.input(&[17, 5]);
    let w = g.weight(&[17, 9]);
    let c = g.weight(&[5, 9]);
    let y = g.op(
        "Gemm",
        &[x, w, c],
        vec![
            ("transA", AttrValue::Int(1)),
            ("alpha", AttrValue::Float(0.5)),
            ("beta", AttrValue::Float(2.0)),
        ],
    );
    check("Gemm transA alpha beta C", g.model(&[y]), 1);
    // No C.
    let mut g = G::new(13);
    let x = g.input(&[4, 8]);
    let w = g.input(&[8, 3]);
    let y = g.op("Gemm", &[x, w], vec![]);
    check("Gemm no C", g.model(&[y]), 1);
    // MatMul: shared B folded into M, batched, A broadcast.
    for (a, b) in [
        (&[2usize, 3, 4, 5][..], &[5usize, 6][..]),
        (&[2, 3, 4, 5], &[2, 3, 5, 6]),
        (&[4, 5], &[3, 5, 6]),
    ] {
        let mut g = G::new(13);
        let x = g.input(a);
        let z = g.input(b);
        let y = g.op("MatMul", &[x, z], vec![]);
        check(&format!("MatMul {a:?} {b:?}"), g.model(&[y]), 1);
    }
}

#[allow(clippy::type_complexity)]
#[test]
fn conv() {
    // (name, x shape, w shape, group, bias, attrs)
    let cases: Vec<(
        &str,
        Vec<usize>,
        Vec<usize>,
        i64,
        bool,
        Vec<(&str, AttrValue)>,
    )> = vec![
        (
            "3x3 pad 1",
            vec![1, 3, 9, 11],
            vec![8, 3, 3, 3],
            1,
            true,
            vec![("pads", ints(&[1, 1, 1, 1]))],
        ),
        (
            "3x3 stride 2 batch 3",
            vec![3, 4, 10, 10],
            vec![6, 4, 3, 3],
            1,
            false,
            vec![("pads", ints(&[1, 1, 1, 1])), ("strides", ints(&[2, 2]))],
        ),
        (
            "group 2",
            vec![2, 4, 7, 7],
            vec![6, 2, 3, 3],
            2,
            true,
            vec![],
        ),
        (
            "depthwise x2",
            vec![2, 4, 8, 8],
            vec![8, 1, 3, 3],
            4,
            true,
            vec![("pads", ints(&[1, 1, 1, 1]))],
        ),
        ("1x1", vec![2, 16, 5, 5], vec![8, 16, 1, 1], 1, true, vec![]),
        (
            "1x1 batch 1",
            vec![1, 16, 5, 5],
            vec![8, 16, 1, 1],
            1,
            true,
            vec![],
        ),
        (
            "3x3 batch 2 large plane",
            vec![2, 3, 40, 40],
            vec![5, 3, 3, 3],
            1,
            true,
            vec![("pads", ints(&[1, 1, 1, 1]))],
        ),
        (
            "1x1 batch 2 large plane",
            vec![2, 8, 33, 33],
            vec![4, 8, 1, 1],
            1,
            false,
            vec![],
        ),
        (
            "dilation 2",
            vec![1, 3, 12, 12],
            vec![4, 3, 3, 3],
            1,
            true,
            vec![("dilations", ints(&[2, 2])), ("pads", ints(&[2, 1, 0, 2]))],
        ),
        (
            "1-D",
            vec![2, 5, 20],
            vec![7, 5, 3],
            1,
            true,
            vec![("pads", ints(&[1, 1]))],
        ),
        (
            "SAME_UPPER stride 2",
            vec![1, 3, 9, 9],
            vec![4, 3, 3, 3],
            1,
            true,
            vec![
                ("auto_pad", AttrValue::Str(b"SAME_UPPER".to_vec())),
                ("strides", ints(&[2, 2])),
            ],
        ),
    ];
    for (name, xs, ws, group, bias, mut attrs) in cases {
        let mut g = G::new(13);
        let x = g.input(&xs);
        let w = g.weight(&ws);
        let mut ins = vec![x, w];
        if bias {
            ins.push(g.weight(&[ws[0]]));
        }
        attrs.push(("group", AttrValue::Int(group)));
        attrs.push((
            "kernel_shape",
            ints(&ws[2..].iter().map(|&v| v as i64).collect::<Vec<_>>()),
        ));
        let y = g.op("Conv", &ins, attrs);
        check(&format!("Conv {name}"), g.model(&[y]), 1);
    }
}

#[test]
fn pooling_softmax_norm_layout() {
    let pools: Vec<(&str, Vec<(&str, AttrValue)>)> = vec![
        (
            "MaxPool",
            vec![
                ("kernel_shape", ints(&[3, 3])),
                ("strides", ints(&[2, 2])),
                ("pads", ints(&[1, 1, 1, 1])),
            ],
        ),
        (
            "AveragePool",
            vec![("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2, 2]))],
        ),
        (
            "AveragePool",
            vec![
                ("kernel_shape", ints(&[3, 3])),
                ("pads", ints(&[1, 1, 1, 1])),
                ("count_include_pad", AttrValue::Int(1)),
            ],
        ),
        ("GlobalAveragePool", vec![]),
        ("GlobalMaxPool", vec![]),
    ];
    for (op, attrs) in pools {
        let mut g = G::new(13);
        let x = g.input(&[2, 3, 9, 8]);
        let y = g.op(op, &[x], attrs);
        check(op, g.model(&[y]), 1);
    }
    for (op, opset, axis, shape) in [
        ("Softmax", 13, -1, vec![4, 10]),
        ("Softmax", 13, 1, vec![2, 5, 3, 3]),
        ("LogSoftmax", 13, -1, vec![3, 1000]),
        ("Softmax", 11, 1, vec![2, 3, 4]),
    ] {
        let mut g = G::new(opset);
        let x = g.input(&shape);
        let y = g.op(op, &[x], vec![("axis", AttrValue::Int(axis))]);
        check(&format!("{op} opset {opset} axis {axis}"), g.model(&[y]), 1);
    }
    let mut g = G::new(13);
    let x = g.input(&[2, 4, 3, 3]);
    let s = g.weight(&[4]);
    let b = g.weight(&[4]);
    let mean = g.weight(&[4]);
    let var = g.constant(&[4], &[0.5f32, 1.0, 2.0, 0.1]);
    let y = g.op("BatchNormalization", &[x, s, b, mean, var], vec![]);
    check("BatchNormalization", g.model(&[y]), 1);
    let mut g = G::new(13);
    let a = g.input(&[2, 3, 4]);
    let b = g.input(&[2, 5, 4]);
    let c = g.weight(&[2, 1, 4]);
    let y = g.op("Concat", &[a, b, c], vec![("axis", AttrValue::Int(1))]);
    check("Concat axis 1", g.model(&[y]), 1);
    let mut g = G::new(13);
    let x = g.input(&[2, 3, 4, 5]);
    let y = g.op("Transpose", &[x], vec![("perm", ints(&[0, 2, 3, 1]))]);
    check("Transpose", g.model(&[y]), 1);
}

/// A chain that leaves the GPU and comes back: Relu (GPU) → ReduceSum (CPU:
/// not claimed) → Sigmoid (GPU) + a Reshape alias and a Conv.
#[test]
fn partitioned_chain() {
    let mut g = G::new(13);
    let x = g.input(&[1, 4, 6, 6]);
    let w = g.weight(&[4, 4, 3, 3]);
    let c = g.op("Conv", &[x, w], vec![("pads", ints(&[1, 1, 1, 1]))]);
    let r = g.op("Relu", &[c], vec![]);
    let axes = g.constant(&[1], &[1i64]);
    let s = g.op(
        "ReduceSum",
        &[r, axes],
        vec![("keepdims", AttrValue::Int(1))],
    );
    let shape = g.constant(&[2], &[1i64, 36]);
    let f = g.op("Reshape", &[s, shape], vec![]);
    let y = g.op("Sigmoid", &[f], vec![]);
    let model = g.model(&[y, r]);
    // Conv, Relu on the GPU; ReduceSum on the CPU; Sigmoid on the GPU.
    let plan = model.0.session_builder().plan().unwrap();
    let p = partition(&model.0, &plan, &CudaCapability).unwrap();
    let sides: Vec<bool> = p.segments.iter().map(|s| s.on_provider).collect();
    assert_eq!(sides, [true, false, true]);
    check("Conv-Relu-ReduceSum-Reshape-Sigmoid", model, 3);
}

/// Whole models: the shipped MLP, the generated test models when present,
/// and `MOTE_GPU_MODELS` (ResNet-18, MobileNetV2 on a GPU machine).
#[test]
fn models() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("models/digits_mlp.onnx")];
    let mut dirs = vec![root.join(".cache/test-models")];
    if let Ok(d) = std::env::var("MOTE_GPU_MODELS") {
        dirs.push(d.into());
    }
    for d in dirs {
        if let Ok(rd) = std::fs::read_dir(&d) {
            let mut v: Vec<_> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
                .collect();
            v.sort();
            files.extend(v);
        }
    }
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        let proto = mote_proto::decode_model(mote_proto::bytes::Bytes::from(bytes)).unwrap();
        let m = Model::from_proto(proto).unwrap();
        for batch in [1, 2] {
            let dims: Vec<(&str, usize)> = ["batch", "N", "batch_size"]
                .iter()
                .map(|&n| (n, batch))
                .collect();
            let mut b = m.session_builder();
            for (n, v) in &dims {
                b = b.dim(n, *v);
            }
            let Ok(plan) = b.plan() else {
                eprintln!("{}: cannot plan with batch {batch}, skipped", f.display());
                continue;
            };
            let symbolic = m.graph.inputs.iter().any(|&i| {
                m.graph.tensors[i as usize]
                    .shape
                    .as_ref()
                    .is_some_and(|s| s.iter().any(|d| !matches!(d, Dim::Fixed(_))))
            });
            if batch > 1 && !symbolic {
                continue;
            }
            let feeds: Feeds = plan
                .inputs()
                .iter()
                .filter(|i| i.dtype == DType::F32)
                .enumerate()
                .map(|(k, i)| {
                    (
                        i.name.clone(),
                        i.shape.clone(),
                        rnd(i.shape.iter().product(), k as u64 + 3, -1.0, 1.0),
                    )
                })
                .collect();
            if feeds.len() != plan.inputs().len() {
                eprintln!("{}: non-f32 inputs, skipped", f.display());
                continue;
            }
            let p = partition(&m, &plan, &CudaCapability).unwrap();
            let name = format!("{} batch {batch}", f.file_name().unwrap().to_string_lossy());
            eprintln!(
                "{name}: {} of {} steps claimed, {} segments",
                p.provider_steps(),
                plan.num_steps(),
                p.segments.len()
            );
            drop(plan);
            check_dims(&name, (m.clone(), feeds), p.provider_steps(), &dims);
        }
    }
}
