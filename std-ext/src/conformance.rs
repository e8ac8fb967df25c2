//! The ONNX backend node-test conformance harness.
//!
//! A suite directory (written by `scripts/gen_conformance.py`) holds one
//! directory per case: `model.onnx` and `test_data_set_N/{input,output}_K.pb`
//! (serialized `TensorProto`s), or an `UNSUPPORTED` file giving why the case
//! cannot be expressed with tensors only. [`run_suite`] runs every case and
//! compares outputs: floats with `|got - want| <= atol + rtol * |want|`
//! ([`RTOL`], [`ATOL`]; NaN equals NaN), integers and bools exactly, shapes
//! exactly. A mote-core built with `fast-math` is held to the tolerance its
//! approximations meet instead ([`tolerance`]).

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use mote_core::{DType, ErrorKind, Model, TensorView};
use mote_proto::Message as _;

/// Relative tolerance of float comparisons.
pub const RTOL: f64 = 1e-3;
/// Absolute tolerance of float comparisons.
pub const ATOL: f64 = 1e-7;

/// `(rtol, atol)` of float comparisons in this build: [`RTOL`] and [`ATOL`],
/// or mote-core's `APPROX_RTOL` / `APPROX_ATOL` when it was built with
/// `fast-math` (as `cargo test --workspace --all-features` builds it).
pub fn tolerance() -> (f64, f64) {
    if mote_core::math::APPROXIMATE {
        (mote_core::math::APPROX_RTOL, mote_core::math::APPROX_ATOL)
    } else {
        (RTOL, ATOL)
    }
}

/// How one case went.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Every output of every data set matched.
    Pass,
    /// An output differs from the reference.
    Wrong {
        /// Output index.
        output: usize,
        /// Flat element index (`usize::MAX` for a shape or dtype mismatch).
        index: usize,
        /// What mote computed.
        got: String,
        /// What the reference says.
        want: String,
    },
    /// mote does not support the op, dtype or feature.
    Unsupported(String),
    /// Any other failure (load, plan, run, panic, unreadable data).
    Error(String),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Pass => write!(f, "pass"),
            Outcome::Wrong {
                output,
                index,
                got,
                want,
            } if *index == usize::MAX => {
                write!(f, "wrong: output {output}: got {got}, want {want}")
            }
            Outcome::Wrong {
                output,
                index,
                got,
                want,
            } => write!(f, "wrong: output {output}[{index}]: got {got}, want {want}"),
            Outcome::Unsupported(s) => write!(f, "unsupported: {s}"),
            Outcome::Error(s) => write!(f, "error: {s}"),
        }
    }
}

/// Result of one case.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// Case name (its directory name), e.g. `test_abs`.
    pub name: String,
    /// Op types of the model's nodes, in order, deduplicated.
    pub ops: Vec<String>,
    /// How it went.
    pub outcome: Outcome,
}

/// Counts of a suite run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Cases run.
    pub total: usize,
    /// Passing cases.
    pub pass: usize,
    /// Cases with a wrong output.
    pub wrong: usize,
    /// Unsupported cases.
    pub unsupported: usize,
    /// Cases that failed otherwise.
    pub error: usize,
}

impl Summary {
    /// Counts the outcomes of `results`.
    pub fn of(results: &[CaseResult]) -> Self {
        let mut s = Summary {
            total: results.len(),
            ..Summary::default()
        };
        for r in results {
            match r.outcome {
                Outcome::Pass => s.pass += 1,
                Outcome::Wrong { .. } => s.wrong += 1,
                Outcome::Unsupported(_) => s.unsupported += 1,
                Outcome::Error(_) => s.error += 1,
            }
        }
        s
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "conformance: {}/{} pass ({} wrong, {} unsupported, {} error)",
            self.pass, self.total, self.wrong, self.unsupported, self.error
        )
    }
}

/// The case directories of `dir` whose name matches `filter` (a regular
/// expression, unanchored: `test_cast` matches every Cast case), sorted.
pub fn case_dirs(dir: &Path, filter: Option<&regex::Regex>) -> std::io::Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !e.file_type()?.is_dir() {
            continue;
        }
        if filter.is_some_and(|f| !f.is_match(&name)) {
            continue;
        }
        v.push(e.path());
    }
    v.sort();
    Ok(v)
}

/// Runs every case of suite `dir` whose name matches `filter`. Panics are
/// caught (with a silent panic hook for the duration) and count as errors.
pub fn run_suite(dir: &Path, filter: Option<&regex::Regex>) -> std::io::Result<Vec<CaseResult>> {
    let dirs = case_dirs(dir, filter)?;
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let results = dirs.iter().map(|d| run_case(d)).collect();
    std::panic::set_hook(hook);
    Ok(results)
}

/// Runs one case directory.
pub fn run_case(dir: &Path) -> CaseResult {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut ops = Vec::new();
    let outcome = match catch_unwind(AssertUnwindSafe(|| case_outcome(dir, &mut ops))) {
        Ok(o) => o,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(non-string payload)".into());
            Outcome::Error(format!("panic: {msg}"))
        }
    };
    CaseResult { name, ops, outcome }
}

fn core_outcome(model: &Model, stage: &str, e: &mote_core::Error) -> Outcome {
    let text = format!("{stage}: {}", model.explain(e));
    match e.kind {
        ErrorKind::UnsupportedOp { .. }
        | ErrorKind::UnsupportedDType { .. }
        | ErrorKind::Unsupported(_) => Outcome::Unsupported(text),
        _ => Outcome::Error(text),
    }
}

fn read_tensor(path: &Path) -> Result<mote_core::model::Const, Outcome> {
    let buf =
        std::fs::read(path).map_err(|e| Outcome::Error(format!("{}: {e}", path.display())))?;
    let t = mote_proto::TensorProto::decode(&buf[..])
        .map_err(|e| Outcome::Error(format!("{}: {e}", path.display())))?;
    mote_core::onnx::tensor_from_proto(t).map_err(|e| {
        let text = format!("{}: {}", path.display(), Model::default().explain(&e));
        match e.kind {
            ErrorKind::UnsupportedDType { .. } | ErrorKind::Unsupported(_) => {
                Outcome::Unsupported(text)
            }
            _ => Outcome::Error(text),
        }
    })
}

fn read_set(dir: &Path, prefix: &str) -> Result<Vec<mote_core::model::Const>, Outcome> {
    let mut v = Vec::new();
    loop {
        let p = dir.join(format!("{prefix}_{}.pb", v.len()));
        if !p.exists() {
            return Ok(v);
        }
        v.push(read_tensor(&p)?);
    }
}

fn case_outcome(dir: &Path, ops: &mut Vec<String>) -> Outcome {
    let bytes = match std::fs::read(dir.join("model.onnx")) {
        Ok(b) => b,
        Err(e) => return Outcome::Error(format!("model.onnx: {e}")),
    };
    if let Ok(m) = mote_proto::ModelProto::decode(&bytes[..]) {
        for n in m.graph.iter().flat_map(|g| g.node.iter()) {
            let op = n.op_type.clone().unwrap_or_default();
            if !ops.contains(&op) {
                ops.push(op);
            }
        }
    }
    if let Ok(why) = std::fs::read_to_string(dir.join("UNSUPPORTED")) {
        return Outcome::Unsupported(why.trim().to_string());
    }
    let model = match Model::from_onnx(&bytes) {
        Ok(m) => m,
        Err(e) => return core_outcome(&Model::default(), "load", &e),
    };
    let mut sets = 0;
    loop {
        let ds = dir.join(format!("test_data_set_{sets}"));
        if !ds.is_dir() {
            break;
        }
        sets += 1;
        let (inputs, want) = match (read_set(&ds, "input"), read_set(&ds, "output")) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(e), _) | (_, Err(e)) => return e,
        };
        let o = run_set(&model, &inputs, &want);
        if o != Outcome::Pass {
            return o;
        }
    }
    if sets == 0 {
        return Outcome::Error("no test_data_set_N".into());
    }
    Outcome::Pass
}

fn run_set(
    model: &Model,
    inputs: &[mote_core::model::Const],
    want: &[mote_core::model::Const],
) -> Outcome {
    let names: Vec<&str> = model.input_names().collect();
    if names.len() != inputs.len() {
        return Outcome::Error(format!(
            "model has {} inputs, data set {}",
            names.len(),
            inputs.len()
        ));
    }
    let plan = match plan_case(model, &names, inputs) {
        Ok(p) => p,
        Err(e) => return core_outcome(model, "plan", &e),
    };
    let mut arena = vec![0u128; plan.arena_bytes().div_ceil(16).max(1)];
    let arena: &mut [u8] = bytemuck::cast_slice_mut(&mut arena);
    let mut s = match mote_core::Session::new(model, &plan, arena) {
        Ok(s) => s,
        Err(e) => return core_outcome(model, "session", &e),
    };
    let feeds: Vec<(&str, TensorView<'_>)> = names
        .iter()
        .zip(inputs)
        .map(|(n, t)| (*n, t.view()))
        .collect();
    if let Err(e) = s.run(&feeds) {
        return core_outcome(model, "run", &e);
    }
    if plan.outputs().len() != want.len() {
        return Outcome::Error(format!(
            "model has {} outputs, data set {}",
            plan.outputs().len(),
            want.len()
        ));
    }
    for (i, w) in want.iter().enumerate() {
        let got = match s.output(i) {
            Ok(g) => g,
            Err(e) => return core_outcome(model, "output", &e),
        };
        if let Some(o) = compare(i, &got, &w.view()) {
            return o;
        }
    }
    Outcome::Pass
}

/// Plans a case with its inputs' shapes. The suite feeds shape tensors (the
/// `shape` of Reshape, `axes`, `pads`, `scales`, ...) as graph inputs; where
/// planning stops on one whose value is needed, the small graph inputs that
/// node depends on are bound by value ([`mote_core::plan::SessionBuilder::input_value`])
/// and planning is retried. Only scalars and 1-D inputs of at most
/// [`BIND_MAX`] elements qualify (shape tensors are 1-D), so data tensors go
/// through the arena.
fn plan_case(
    model: &Model,
    names: &[&str],
    inputs: &[mote_core::model::Const],
) -> Result<mote_core::Plan, mote_core::Error> {
    crate::cpu::init();
    let g = &model.graph;
    let mut bound = vec![false; names.len()];
    loop {
        let mut b = model.session_builder();
        for ((n, t), &v) in names.iter().zip(inputs).zip(&bound) {
            b = if v {
                b.input_value(n, &t.view())
            } else {
                b.input_shape(n, &t.shape)
            };
        }
        let e = match b.plan() {
            Ok(p) => return Ok(p),
            Err(e) => e,
        };
        let needs_value =
            matches!(e.kind, ErrorKind::Unsupported(m) if m.contains("known at build time"));
        let Some(node) = e.node.filter(|_| needs_value) else {
            return Err(e);
        };
        // Graph inputs upstream of the node.
        let mut up = vec![false; g.tensors.len()];
        let mut stack = vec![node];
        let mut seen = vec![false; g.nodes.len()];
        while let Some(n) = stack.pop() {
            let Some(nd) = g.nodes.get(n as usize) else {
                continue;
            };
            if std::mem::replace(&mut seen[n as usize], true) {
                continue;
            }
            for &t in nd.inputs.iter().flatten() {
                up[t as usize] = true;
                for (pi, p) in g.nodes.iter().enumerate() {
                    if p.outputs.contains(&Some(t)) {
                        stack.push(pi as u32);
                    }
                }
            }
        }
        let mut more = false;
        for (k, &id) in g.inputs.iter().enumerate() {
            let small = inputs.get(k).is_some_and(|t| {
                t.shape.len() <= 1 && t.shape.iter().product::<usize>() <= BIND_MAX
            });
            if up[id as usize] && small && !bound[k] {
                bound[k] = true;
                more = true;
            }
        }
        if !more {
            return Err(e);
        }
    }
}

/// Largest graph input (in elements) the harness binds by value.
pub const BIND_MAX: usize = 16;

/// The first difference of `got` from `want`, if any.
pub fn compare(output: usize, got: &TensorView<'_>, want: &TensorView<'_>) -> Option<Outcome> {
    if got.dtype() != want.dtype() || got.shape() != want.shape() {
        return Some(Outcome::Wrong {
            output,
            index: usize::MAX,
            got: format!("{} {:?}", got.dtype(), got.shape()),
            want: format!("{} {:?}", want.dtype(), want.shape()),
        });
    }
    let float = want.dtype().is_float();
    let (rtol, atol) = tolerance();
    for i in 0..want.numel() {
        let ok = if float {
            let (g, w) = (got.f64_at(i)?, want.f64_at(i)?);
            (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= atol + rtol * w.abs()
        } else {
            let s = want.dtype().size();
            got.bytes().get(i * s..(i + 1) * s) == want.bytes().get(i * s..(i + 1) * s)
        };
        if !ok {
            let show = |v: &TensorView<'_>| {
                if float {
                    v.f64_at(i).map_or("?".into(), |x| x.to_string())
                } else if v.dtype() == DType::U64 {
                    v.f64_at(i).map_or("?".into(), |x| x.to_string())
                } else {
                    v.int_at(i).map_or("?".into(), |x| x.to_string())
                }
            };
            return Some(Outcome::Wrong {
                output,
                index: i,
                got: show(got),
                want: show(want),
            });
        }
    }
    None
}
