//! Graph rewrites applied after import, before planning.
//!
//! **QDQ fusion.** A QDQ model (what onnxruntime.quantization, PyTorch and
//! TensorFlow export) means `DequantizeLinear → float op → QuantizeLinear`.
//! Run literally, every op would compute in f32 on f32 tensors: four times
//! the arena of int8. This pass finds those chains and replaces each by one
//! integer node, as onnxruntime's QDQ transformer does:
//!
//! | float op (with its DQ inputs and Q output) | becomes |
//! |---|---|
//! | Conv, optionally → Relu / Clip | `mote.QConv` (depthwise kernel when group = channels) |
//! | MatMul / Gemm with a constant 2-D B, optionally → Relu / Clip | `mote.QMatMul` |
//! | Relu, Clip | `mote.QRequant` (a clamp in the integer domain) |
//! | MaxPool, Reshape, Flatten, Squeeze, Unsqueeze, Transpose | the same op on the 8-bit tensor (+ `mote.QRequant` if the output scale differs) |
//! | Add, Mul, AveragePool, GlobalAveragePool, Concat, Sigmoid, LeakyRelu | `com.microsoft.QLinear*` (when those kernels are built in) |
//!
//! A chain is fused only when everything the integer kernel needs is known
//! at import: constant per-tensor scales and zero points for activations
//! (per-channel allowed for weights), 8-bit types, a single consumer
//! between the op and its QuantizeLinear. Every op that touches a Q/DQ
//! node gets a [`Fusion`] note: integer, or float with the reason
//! (`mote inspect` prints them). DequantizeLinear nodes left without
//! consumers are removed, so the f32 copy of the weights is never made.
//!
//! **Float rewrites** ([`float`]) run after QDQ fusion: Conv + BatchNorm
//! folding, per-channel Add / Mul folded into a bias or weights, MatMul +
//! Add → Gemm, Identity / Dropout / Transpose elimination, and dead nodes
//! with their unused initializers removed.

use alloc::string::String;
use alloc::vec::Vec;

use crate::model::{Attr, AttrValue, Const, Graph, Model, Node, TensorInfo};
use crate::{DType, TensorId};

/// What the QDQ pass did with one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fusion {
    /// Name of the node (or `op_type#index` when unnamed).
    pub node: String,
    /// Its op type in the file.
    pub op_type: String,
    /// `Some(kernel)`: runs in integers as this kernel; `None`: stays float.
    pub integer: Option<&'static str>,
    /// Why it stays float (empty when integer).
    pub reason: &'static str,
}

pub mod float;

/// Which rewrites [`run_with`] applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// QDQ fusion ([`fuse_qdq`]).
    pub qdq: bool,
    /// The float rewrites of [`float`] (BN folding, bias folding, Gemm,
    /// Identity / Transpose / dead-node elimination).
    pub float: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            qdq: true,
            float: true,
        }
    }
}

/// Applies the default rewrites to the main graph: QDQ fusion, then the
/// float rewrites ([`run_with`] with [`Options::default`]).
pub fn run(model: &mut Model) {
    run_with(model, Options::default());
}

/// Applies the chosen rewrites to the main graph. QDQ fusion runs first, on
/// the graph as imported, so its patterns are never disturbed; the float
/// passes then touch only default-domain ops with constant f32 parameters,
/// which a fused integer node (another domain) or a float op fed by
/// DequantizeLinear (a computed weight) is not. Their notes go to
/// [`Model::fusions`] and [`Model::rewrites`].
pub fn run_with(model: &mut Model, opts: Options) {
    if opts.qdq {
        model.fusions = fuse_qdq(&mut model.graph);
    }
    if opts.float {
        model.rewrites = float::run(&mut model.graph);
    }
}

/// A DequantizeLinear feeding a fused op.
#[derive(Clone, Copy, Debug)]
struct Dq {
    q: TensorId,
    scale: TensorId,
    zp: Option<TensorId>,
    axis: i64,
}

/// A QuantizeLinear ending a chain.
#[derive(Clone, Copy, Debug)]
struct Qz {
    node: usize,
    scale: TensorId,
    zp: TensorId,
    out: TensorId,
}

struct Ctx<'g> {
    g: &'g Graph,
    producer: Vec<Option<usize>>,
    uses: Vec<u32>,
    is_output: Vec<bool>,
}

fn is_op(n: &Node, op: &str) -> bool {
    n.op_type == op && n.domain.is_empty()
}

fn attr_i(n: &Node, name: &str, default: i64) -> i64 {
    match n.attr(name) {
        Some(AttrValue::Int(v)) => *v,
        _ => default,
    }
}

impl<'g> Ctx<'g> {
    fn new(g: &'g Graph) -> Self {
        let nt = g.tensors.len();
        let mut producer = alloc::vec![None; nt];
        let mut uses = alloc::vec![0u32; nt];
        let mut is_output = alloc::vec![false; nt];
        for (i, n) in g.nodes.iter().enumerate() {
            for o in n.outputs.iter().flatten() {
                if let Some(p) = producer.get_mut(*o as usize) {
                    *p = Some(i);
                }
            }
            for t in n.inputs.iter().flatten() {
                if let Some(u) = uses.get_mut(*t as usize) {
                    *u = u.saturating_add(1);
                }
            }
        }
        for &o in &g.outputs {
            if let Some(f) = is_output.get_mut(o as usize) {
                *f = true;
            }
        }
        Ctx {
            g,
            producer,
            uses,
            is_output,
        }
    }

    fn value(&self, t: TensorId) -> Option<&Const> {
        self.g.tensors.get(t as usize)?.value.as_ref()
    }

    /// A constant's dtype and element count.
    fn const_info(&self, t: TensorId) -> Option<(DType, usize)> {
        self.value(t)
            .map(|c| (c.dtype, c.shape.iter().product::<usize>()))
    }

    fn const_f32(&self, t: TensorId) -> Option<Vec<f32>> {
        let c = self.value(t)?;
        if c.dtype != DType::F32 {
            return None;
        }
        let v = c.view();
        (0..v.numel())
            .map(|k| v.f64_at(k).map(|x| x as f32))
            .collect()
    }

    fn node_of(&self, t: TensorId) -> Option<(usize, &'g Node)> {
        let i = (*self.producer.get(t as usize)?)?;
        Some((i, self.g.nodes.get(i)?))
    }

    /// The DequantizeLinear producing `t`, with constant f32 scales and
    /// (when present) a constant 8-bit zero point; no blocked quantization.
    fn dq(&self, t: TensorId) -> Result<Dq, &'static str> {
        let (_, n) = self.node_of(t).ok_or("input is not dequantized")?;
        if !is_op(n, "DequantizeLinear") {
            return Err("input is not from DequantizeLinear");
        }
        if attr_i(n, "block_size", 0) != 0 {
            return Err("blocked DequantizeLinear");
        }
        let q = n.inputs.first().copied().flatten().ok_or("DQ input")?;
        let scale = n.inputs.get(1).copied().flatten().ok_or("DQ scale")?;
        match self.const_info(scale) {
            Some((DType::F32, _)) => {}
            Some(_) => return Err("scale is not float32"),
            None => return Err("scale is not a constant"),
        }
        let zp = n.inputs.get(2).copied().flatten();
        match zp.map(|z| self.const_info(z)) {
            None => {}
            Some(Some((DType::I8 | DType::U8 | DType::I32, _))) => {}
            Some(Some(_)) => return Err("not 8-bit (zero point type)"),
            Some(None) => return Err("zero point is not a constant"),
        }
        if zp.is_none()
            && !matches!(
                self.const_info(q),
                Some((DType::I8 | DType::U8 | DType::I32, _))
            )
        {
            // Without a zero point the type is not known before planning.
            return Err("DequantizeLinear without zero point on a non-constant");
        }
        Ok(Dq {
            q,
            scale,
            zp,
            axis: attr_i(n, "axis", 1),
        })
    }

    /// Whether the dequantized tensor is 8-bit (its zero point, or the
    /// constant itself, says so).
    fn eight_bit(&self, d: &Dq) -> bool {
        let t = d.zp.unwrap_or(d.q);
        matches!(self.const_info(t), Some((DType::I8 | DType::U8, _)))
    }

    fn per_tensor(&self, d: &Dq) -> bool {
        self.const_info(d.scale).is_some_and(|(_, n)| n == 1)
    }

    /// The single consumer of `t`: `(node index, node)`, unless `t` is a
    /// graph output or has several readers.
    fn only_consumer(&self, t: TensorId) -> Option<(usize, &'g Node)> {
        if self.is_output.get(t as usize).copied().unwrap_or(true)
            || self.uses.get(t as usize).copied() != Some(1)
        {
            return None;
        }
        self.g
            .nodes
            .iter()
            .enumerate()
            .find(|(_, n)| n.inputs.contains(&Some(t)))
    }

    /// The per-tensor QuantizeLinear that `t` feeds alone.
    fn q_of(&self, t: TensorId) -> Result<Qz, &'static str> {
        let (i, n) = self.only_consumer(t).ok_or("output has other readers")?;
        if !is_op(n, "QuantizeLinear") {
            return Err("output is not quantized");
        }
        let scale = n.inputs.get(1).copied().flatten().ok_or("Q scale")?;
        let zp = n
            .inputs
            .get(2)
            .copied()
            .flatten()
            .ok_or("QuantizeLinear without zero point")?;
        if self.const_info(scale) != Some((DType::F32, 1)) {
            return Err("output scale is not a per-tensor float32 constant");
        }
        if !matches!(self.const_info(zp), Some((DType::I8 | DType::U8, 1))) {
            return Err("output is not 8-bit per-tensor");
        }
        if attr_i(n, "block_size", 0) != 0 {
            return Err("blocked QuantizeLinear");
        }
        let out = n.outputs.first().copied().flatten().ok_or("Q output")?;
        Ok(Qz {
            node: i,
            scale,
            zp,
            out,
        })
    }

    /// An activation between an op and its QuantizeLinear: `(node, min,
    /// max)` for Relu and constant-bound Clip.
    fn activation(&self, t: TensorId) -> Option<(usize, f32, f32)> {
        let (i, n) = self.only_consumer(t)?;
        if is_op(n, "Relu") {
            return Some((i, 0.0, f32::INFINITY));
        }
        if is_op(n, "Clip") {
            let (lo, hi) = clip_bounds(self, n)?;
            return Some((i, lo, hi));
        }
        None
    }
}

fn clip_bounds(c: &Ctx<'_>, n: &Node) -> Option<(f32, f32)> {
    if n.opset < 11 {
        let f = |name: &str, d: f32| match n.attr(name) {
            Some(AttrValue::Float(v)) => *v,
            _ => d,
        };
        return Some((f("min", f32::NEG_INFINITY), f("max", f32::INFINITY)));
    }
    let bound = |i: usize, d: f32| -> Option<f32> {
        match n.inputs.get(i).copied().flatten() {
            None => Some(d),
            Some(t) => c.const_f32(t)?.first().copied(),
        }
    };
    Some((bound(1, f32::NEG_INFINITY)?, bound(2, f32::INFINITY)?))
}

/// The input's (scale, zero point) a QRequant starts from.
type InScale = (TensorId, Option<TensorId>);

/// What to do with one node.
enum Rewrite {
    /// Replace node `at` by `node`, remove `drop` nodes.
    Replace {
        node: Node,
        drop: Vec<usize>,
        kernel: &'static str,
    },
    /// Run the op itself on the 8-bit tensor: input 0 becomes `q_in`, output
    /// 0 becomes `q_out` (through a QRequant when scales differ).
    Retype {
        q_in: TensorId,
        q_out: Qz,
        requant: Option<InScale>,
    },
}

fn act_attrs(attrs: &mut Vec<Attr>, act: Option<(usize, f32, f32)>) {
    if let Some((_, lo, hi)) = act {
        for (name, v) in [("mote_act_min", lo), ("mote_act_max", hi)] {
            if v.is_finite() {
                attrs.push(Attr {
                    name: name.into(),
                    value: AttrValue::Float(v),
                });
            }
        }
    }
}

fn fused_node(
    orig: &Node,
    op_type: &str,
    domain: &str,
    inputs: Vec<Option<TensorId>>,
    out: TensorId,
    attrs: Vec<Attr>,
) -> Node {
    Node {
        name: orig.name.clone(),
        op_type: op_type.into(),
        domain: domain.into(),
        opset: 1,
        inputs,
        outputs: alloc::vec![Some(out)],
        attrs,
    }
}

/// Conv / MatMul / Gemm → QConv / QMatMul.
fn plan_linear(c: &Ctx<'_>, n: &Node) -> Result<Rewrite, &'static str> {
    let conv = is_op(n, "Conv");
    let gemm = is_op(n, "Gemm");
    let inp = |k: usize| n.inputs.get(k).copied().flatten();
    let x = c.dq(inp(0).ok_or("no input")?)?;
    if !c.per_tensor(&x) {
        return Err("per-axis activation scale");
    }
    if !c.eight_bit(&x) {
        return Err("activation is not 8-bit");
    }
    let w = c.dq(inp(1).ok_or("no weight")?)?;
    let (wdt, _) = c.const_info(w.q).ok_or("weights are not constant")?;
    if !matches!(wdt, DType::I8 | DType::U8) {
        return Err("weights are not 8-bit");
    }
    let wshape = c.value(w.q).map(|v| v.shape.clone()).unwrap_or_default();
    let rank = wshape.len() as i64;
    let trans_b = gemm && attr_i(n, "transB", 0) != 0;
    if !conv {
        if wshape.len() != 2 {
            return Err("B is not a 2-D constant");
        }
        if gemm && attr_i(n, "transA", 0) != 0 {
            return Err("Gemm with transA");
        }
    }
    if !c.per_tensor(&w) {
        let want = if conv || trans_b { 0 } else { 1 };
        let axis = if w.axis < 0 {
            w.axis.saturating_add(rank)
        } else {
            w.axis
        };
        if axis != want {
            return Err("weight scale is not per output channel");
        }
    }
    // Bias: a dequantized int32, or a float constant.
    let mut bias: Vec<Option<TensorId>> = Vec::new();
    if let Some(b) = inp(2) {
        if let Ok(bd) = c.dq(b) {
            if c.const_info(bd.q).map(|x| x.0) != Some(DType::I32) {
                return Err("bias is not int32");
            }
            bias.extend([Some(bd.q), Some(bd.scale), bd.zp]);
        } else if c.const_info(b).map(|x| x.0) == Some(DType::F32) {
            let n_out = wshape.get(if trans_b { 0 } else { 1 }).copied();
            let numel = c.const_info(b).map(|x| x.1);
            if gemm && numel != n_out && numel != Some(1) {
                return Err("Gemm C is not a vector");
            }
            bias.push(Some(b));
        } else {
            return Err("bias is neither dequantized int32 nor a float constant");
        }
    }
    let out = n.outputs.first().copied().flatten().ok_or("no output")?;
    let act = c.activation(out);
    let q = c.q_of(act.map_or(out, |(ai, _, _)| {
        c.g.nodes
            .get(ai)
            .and_then(|a| a.outputs.first().copied().flatten())
            .unwrap_or(out)
    }))?;
    let mut inputs = alloc::vec![
        Some(x.q),
        Some(x.scale),
        x.zp,
        Some(w.q),
        Some(w.scale),
        w.zp,
        Some(q.scale),
        Some(q.zp)
    ];
    inputs.extend(bias);
    let mut attrs: Vec<Attr> = n
        .attrs
        .iter()
        .filter(|a| conv || ["alpha", "beta", "transB", "transA"].contains(&a.name.as_str()))
        .cloned()
        .collect();
    act_attrs(&mut attrs, act);
    let (op, kernel) = if conv {
        ("QConv", "QConv")
    } else {
        ("QMatMul", "QMatMul")
    };
    let mut drop = alloc::vec![q.node];
    if let Some((ai, _, _)) = act {
        drop.push(ai);
    }
    Ok(Rewrite::Replace {
        node: fused_node(n, op, crate::ops::qdq::DOMAIN, inputs, q.out, attrs),
        drop,
        kernel,
    })
}

/// Relu / Clip alone between DQ and Q → QRequant.
fn plan_activation(c: &Ctx<'_>, n: &Node) -> Result<Rewrite, &'static str> {
    let x = c.dq(n.inputs.first().copied().flatten().ok_or("no input")?)?;
    if !c.per_tensor(&x) {
        return Err("per-axis activation scale");
    }
    if !c.eight_bit(&x) {
        return Err("activation is not 8-bit");
    }
    let (lo, hi) = if is_op(n, "Relu") {
        (0.0, f32::INFINITY)
    } else {
        clip_bounds(c, n).ok_or("Clip bounds are not constants")?
    };
    let out = n.outputs.first().copied().flatten().ok_or("no output")?;
    let q = c.q_of(out)?;
    let mut attrs = Vec::new();
    act_attrs(&mut attrs, Some((0, lo, hi)));
    let inputs = alloc::vec![Some(x.q), Some(x.scale), x.zp, Some(q.scale), Some(q.zp)];
    Ok(Rewrite::Replace {
        node: fused_node(n, "QRequant", crate::ops::qdq::DOMAIN, inputs, q.out, attrs),
        drop: alloc::vec![q.node],
        kernel: "QRequant",
    })
}

/// Data movement (and MaxPool): the op itself runs on the 8-bit tensor.
fn plan_retype(c: &Ctx<'_>, n: &Node) -> Result<Rewrite, &'static str> {
    let x = c.dq(n.inputs.first().copied().flatten().ok_or("no input")?)?;
    if !c.per_tensor(&x) {
        return Err("per-axis activation scale");
    }
    if !c.eight_bit(&x) {
        return Err("activation is not 8-bit");
    }
    if n.outputs.iter().skip(1).any(|o| o.is_some()) {
        return Err("second output (MaxPool Indices) is used");
    }
    let out = n.outputs.first().copied().flatten().ok_or("no output")?;
    let q = c.q_of(out)?;
    let same = c.const_f32(x.scale) == c.const_f32(q.scale)
        && match x.zp {
            Some(z) => {
                let (a, b) = (c.value(z), c.value(q.zp));
                a.zip(b)
                    .is_some_and(|(a, b)| a.dtype == b.dtype && a.data.bytes() == b.data.bytes())
            }
            None => false,
        };
    Ok(Rewrite::Retype {
        q_in: x.q,
        q_out: q,
        requant: if same { None } else { Some((x.scale, x.zp)) },
    })
}

/// com.microsoft QLinear* for ops whose integer kernels live there.
fn plan_contrib(c: &Ctx<'_>, n: &Node) -> Result<Rewrite, &'static str> {
    let (op, binary) = match n.op_type.as_str() {
        "Add" => ("QLinearAdd", true),
        "Mul" => ("QLinearMul", true),
        "AveragePool" => ("QLinearAveragePool", false),
        "GlobalAveragePool" => ("QLinearGlobalAveragePool", false),
        "Sigmoid" => ("QLinearSigmoid", false),
        "LeakyRelu" => ("QLinearLeakyRelu", false),
        "Concat" => ("QLinearConcat", false),
        _ => return Err("no integer kernel for this op"),
    };
    if crate::ops::find("com.microsoft", op, 1).is_none() {
        return Err("no integer kernel for this op (com.microsoft QLinear ops not built in)");
    }
    let out = n.outputs.first().copied().flatten().ok_or("no output")?;
    let ins: Vec<Dq> = n
        .inputs
        .iter()
        .map(|t| c.dq(t.ok_or("omitted input")?))
        .collect::<Result<_, _>>()?;
    if ins.iter().any(|d| !c.per_tensor(d)) {
        return Err("per-axis activation scale");
    }
    if ins.iter().any(|d| !c.eight_bit(d)) {
        return Err("activation is not 8-bit");
    }
    if binary && ins.len() != 2 {
        return Err("binary op without two inputs");
    }
    let q = c.q_of(out)?;
    let mut inputs: Vec<Option<TensorId>> = Vec::new();
    if op == "QLinearConcat" {
        inputs.extend([Some(q.scale), Some(q.zp)]);
        for d in &ins {
            inputs.extend([Some(d.q), Some(d.scale), d.zp]);
        }
    } else {
        for d in &ins {
            inputs.extend([Some(d.q), Some(d.scale), d.zp]);
        }
        inputs.extend([Some(q.scale), Some(q.zp)]);
    }
    Ok(Rewrite::Replace {
        node: fused_node(n, op, "com.microsoft", inputs, q.out, n.attrs.clone()),
        drop: alloc::vec![q.node],
        kernel: op,
    })
}

/// Whether a node touches a Q/DQ node (and so deserves a note).
fn in_qdq_context(c: &Ctx<'_>, n: &Node) -> bool {
    let from_dq = n.inputs.iter().flatten().any(|&t| {
        c.node_of(t)
            .is_some_and(|(_, p)| is_op(p, "DequantizeLinear"))
    });
    from_dq && !is_op(n, "QuantizeLinear") && !is_op(n, "DequantizeLinear")
}

/// Whether node `i` is flagged in a per-node table (one flag per node of the
/// graph the table was made for; a node beyond it is not flagged).
fn flagged(flags: &[bool], i: usize) -> bool {
    flags.get(i).copied().unwrap_or(false)
}

/// Flags node `i` in a per-node table.
fn flag(flags: &mut [bool], i: usize) {
    if let Some(f) = flags.get_mut(i) {
        *f = true;
    }
}

/// Removes the nodes whose flag is set (`flags` has one entry per node).
fn retain_unflagged(nodes: &mut Vec<Node>, flags: &[bool]) {
    let mut it = flags.iter();
    nodes.retain(|_| !it.next().copied().unwrap_or(false));
}

/// The QDQ fusion pass over one graph; returns a note per QDQ node.
pub fn fuse_qdq(g: &mut Graph) -> Vec<Fusion> {
    let mut notes = Vec::new();
    let mut removed = alloc::vec![false; g.nodes.len()];
    let mut replaced: Vec<(usize, Node)> = Vec::new();
    let mut retyped: Vec<(usize, TensorId, Qz, Option<InScale>)> = Vec::new();
    {
        let c = Ctx::new(g);
        // Linear ops first: they claim a trailing Relu / Clip.
        for pass in 0..2 {
            for (i, n) in g.nodes.iter().enumerate() {
                if flagged(&removed, i) || !in_qdq_context(&c, n) {
                    continue;
                }
                let linear = ["Conv", "MatMul", "Gemm"].iter().any(|o| is_op(n, o));
                if (pass == 0) != linear {
                    continue;
                }
                let plan = if linear {
                    plan_linear(&c, n)
                } else if is_op(n, "Relu") || is_op(n, "Clip") {
                    plan_activation(&c, n)
                } else if [
                    "MaxPool",
                    "Reshape",
                    "Flatten",
                    "Squeeze",
                    "Unsqueeze",
                    "Transpose",
                ]
                .iter()
                .any(|o| is_op(n, o))
                {
                    plan_retype(&c, n)
                } else if n.domain.is_empty() {
                    plan_contrib(&c, n)
                } else {
                    Err("not an ONNX op")
                };
                let name = if n.name.is_empty() {
                    alloc::format!("{}#{}", n.op_type, i)
                } else {
                    n.name.clone()
                };
                // A node already claimed (its Q taken by an earlier fusion).
                let claimed = |r: &Rewrite| match r {
                    Rewrite::Replace { drop, .. } => drop.iter().any(|&d| flagged(&removed, d)),
                    Rewrite::Retype { q_out, .. } => flagged(&removed, q_out.node),
                };
                match plan {
                    Ok(r) if !claimed(&r) => {
                        let kernel = match r {
                            Rewrite::Replace { node, drop, kernel } => {
                                for d in drop {
                                    flag(&mut removed, d);
                                }
                                replaced.push((i, node));
                                kernel
                            }
                            Rewrite::Retype {
                                q_in,
                                q_out,
                                requant,
                            } => {
                                flag(&mut removed, q_out.node);
                                retyped.push((i, q_in, q_out, requant));
                                if requant.is_some() {
                                    "8-bit op + QRequant"
                                } else {
                                    "8-bit op"
                                }
                            }
                        };
                        notes.push(Fusion {
                            node: name,
                            op_type: n.op_type.clone(),
                            integer: Some(kernel),
                            reason: "",
                        });
                    }
                    Ok(_) => {}
                    Err(why) => notes.push(Fusion {
                        node: name,
                        op_type: n.op_type.clone(),
                        integer: None,
                        reason: why,
                    }),
                }
            }
        }
    }
    // Apply the rewrites (the patterns were all read from the graph as
    // imported: each claims its own QuantizeLinear, so they are disjoint).
    for (i, node) in replaced {
        if let Some(slot) = g.nodes.get_mut(i) {
            *slot = node;
        }
    }
    for (i, q_in, q_out, requant) in retyped {
        let Some(n) = g.nodes.get(i) else { continue };
        let mut n = n.clone();
        if let Some(first) = n.inputs.first_mut() {
            *first = Some(q_in);
        }
        match requant {
            None => {
                if let Some(o) = n.outputs.first_mut() {
                    *o = Some(q_out.out);
                }
                if let Some(slot) = g.nodes.get_mut(i) {
                    *slot = n;
                }
            }
            Some((xs, xz)) => {
                // op(q) → tmp (input's scale) → QRequant → q_out.
                let tmp = g.tensors.len() as TensorId;
                let base = g
                    .tensors
                    .get(q_out.out as usize)
                    .map(|t| t.name.clone())
                    .unwrap_or_default();
                g.tensors.push(TensorInfo {
                    name: alloc::format!("{base}/mote_int"),
                    dtype: None,
                    shape: None,
                    value: None,
                    onnx_type: 0,
                });
                if let Some(o) = n.outputs.first_mut() {
                    *o = Some(tmp);
                }
                let rq = fused_node(
                    &n,
                    "QRequant",
                    crate::ops::qdq::DOMAIN,
                    alloc::vec![Some(tmp), Some(xs), xz, Some(q_out.scale), Some(q_out.zp)],
                    q_out.out,
                    Vec::new(),
                );
                if let Some(slot) = g.nodes.get_mut(i) {
                    *slot = n;
                }
                g.nodes.push(rq);
                removed.push(false);
            }
        }
    }
    // Drop the fused Q / activation nodes, then DequantizeLinear nodes
    // nobody reads any more.
    let mut removed = removed.iter();
    g.nodes
        .retain(|_| !removed.next().copied().unwrap_or(false));
    loop {
        let c = Ctx::new(g);
        let dead: Vec<bool> = g
            .nodes
            .iter()
            .map(|n| {
                is_op(n, "DequantizeLinear")
                    && n.outputs.iter().flatten().all(|&o| {
                        c.uses.get(o as usize).copied().unwrap_or(0) == 0
                            && !c.is_output.get(o as usize).copied().unwrap_or(true)
                    })
            })
            .collect();
        if !dead.iter().any(|&d| d) {
            break;
        }
        retain_unflagged(&mut g.nodes, &dead);
    }
    notes
}

/// Scale and zero point of a graph input or output made 8-bit by
/// [`int8_io`]: `real = (q - zero_point) · scale`.
#[derive(Clone, Debug, PartialEq)]
pub struct IoQuant {
    /// Tensor name (unchanged).
    pub name: String,
    /// Whether it is a graph input (else an output).
    pub input: bool,
    /// 8-bit type: `I8` or `U8`.
    pub dtype: DType,
    /// Scale.
    pub scale: f32,
    /// Zero point.
    pub zero_point: i32,
}

/// Makes the model's float inputs and outputs 8-bit where the graph
/// quantizes them straight away (an input read only by per-tensor
/// QuantizeLinear nodes with one scale and zero point) or dequantizes them
/// last (an output made by a per-tensor DequantizeLinear) — what a TFLite
/// model converted with `inference_input_type=int8` looks like. The caller
/// then feeds and reads 8-bit data (quantized with the returned parameters,
/// also kept in [`Model::io_quant`]), and the float copies leave the
/// arena. Names are unchanged; inputs and outputs the graph does not
/// quantize stay float.
pub fn int8_io(model: &mut Model) -> Vec<IoQuant> {
    let mut done = Vec::new();
    let g = &mut model.graph;
    let mut drop = alloc::vec![false; g.nodes.len()];
    let qparams =
        |g: &Graph, s: Option<TensorId>, z: Option<TensorId>| -> Option<(f32, i32, DType)> {
            let sc = g.tensors.get(s? as usize)?.value.as_ref()?;
            let zc = g.tensors.get(z? as usize)?.value.as_ref()?;
            if sc.dtype != DType::F32 || sc.shape.iter().product::<usize>() != 1 {
                return None;
            }
            if !matches!(zc.dtype, DType::I8 | DType::U8) || zc.shape.iter().product::<usize>() != 1
            {
                return None;
            }
            Some((
                sc.view().f64_at(0)? as f32,
                zc.view().int_at(0)? as i32,
                zc.dtype,
            ))
        };
    for inp in g.inputs.clone() {
        let readers: Vec<usize> = g
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.inputs.contains(&Some(inp)))
            .map(|(i, _)| i)
            .collect();
        if readers.is_empty() || g.outputs.contains(&inp) {
            continue;
        }
        let mut params = None;
        let ok = readers.iter().all(|&i| {
            let Some(n) = g.nodes.get(i) else {
                return false;
            };
            let p = if is_op(n, "QuantizeLinear") && n.inputs.first() == Some(&Some(inp)) {
                qparams(
                    g,
                    n.inputs.get(1).copied().flatten(),
                    n.inputs.get(2).copied().flatten(),
                )
            } else {
                None
            };
            match (p, params) {
                (None, _) => false,
                (Some(p), None) => {
                    params = Some(p);
                    true
                }
                (Some(p), Some(q)) => p == q,
            }
        });
        let Some((scale, zp, dt)) = params.filter(|_| ok) else {
            continue;
        };
        // Every reader's output is now the input itself.
        for &i in &readers {
            flag(&mut drop, i);
            if let Some(Some(o)) = g.nodes.get(i).and_then(|n| n.outputs.first()).copied() {
                for n in g.nodes.iter_mut() {
                    for t in n.inputs.iter_mut().flatten() {
                        if *t == o {
                            *t = inp;
                        }
                    }
                }
                for t in g.outputs.iter_mut() {
                    if *t == o {
                        *t = inp;
                    }
                }
            }
        }
        if let Some(t) = g.tensors.get_mut(inp as usize) {
            t.dtype = Some(dt);
            done.push(IoQuant {
                name: t.name.clone(),
                input: true,
                dtype: dt,
                scale,
                zero_point: zp,
            });
        }
    }
    for k in 0..g.outputs.len() {
        let Some(&out) = g.outputs.get(k) else {
            continue;
        };
        let Some(i) = g.nodes.iter().position(|n| n.outputs.contains(&Some(out))) else {
            continue;
        };
        let Some(n) = g.nodes.get(i) else {
            continue;
        };
        if flagged(&drop, i) || !is_op(n, "DequantizeLinear") || n.outputs.len() != 1 {
            continue;
        }
        let used = g.nodes.iter().any(|m| m.inputs.contains(&Some(out)));
        let Some(q) = n.inputs.first().copied().flatten() else {
            continue;
        };
        let Some((scale, zp, dt)) = qparams(
            g,
            n.inputs.get(1).copied().flatten(),
            n.inputs.get(2).copied().flatten(),
        ) else {
            continue;
        };
        if used || g.inputs.contains(&q) || g.outputs.contains(&q) {
            continue;
        }
        // The quantized tensor takes the output's place and name.
        flag(&mut drop, i);
        let name = g
            .tensors
            .get(out as usize)
            .map(|t| t.name.clone())
            .unwrap_or_default();
        if let Some(t) = g.tensors.get_mut(q as usize) {
            t.name = name.clone();
            t.dtype = Some(dt);
        }
        if let Some(t) = g.tensors.get_mut(out as usize) {
            t.name = alloc::format!("{name}/mote_float");
        }
        if let Some(t) = g.outputs.get_mut(k) {
            *t = q;
        }
        done.push(IoQuant {
            name,
            input: false,
            dtype: dt,
            scale,
            zero_point: zp,
        });
    }
    retain_unflagged(&mut g.nodes, &drop);
    model.io_quant.extend(done.iter().cloned());
    done
}

#[cfg(test)]
mod tests {
    //! Each fused kernel against the same graph run literally (dequantize →
    //! float op → quantize, the ONNX meaning; the float path is itself
    //! checked against the ONNX node suite), over random shapes, scales and
    //! zero points: within 1 LSB everywhere, exact on ≥ 99.9 % of elements.
    use super::*;
    use crate::model::{Dim, Model};
    use crate::{Session, SessionBuilder, TensorView};
    use alloc::vec;

    use crate::ops::testing::TestGraph as G;

    impl G {
        /// DQ of an activation with a random scale and zero point.
        fn dq_act(&mut self, q: TensorId, u8_: bool) -> (TensorId, f32) {
            let r = self.rand(2);
            let s = 0.01 + 0.04 * (r[0] + 1.0) / 2.0;
            let st = self.c(&[], &[s]);
            let zt = if u8_ {
                self.c(&[], &[(128.0 + 20.0 * r[1]) as u8])
            } else {
                self.c(&[], &[(20.0 * r[1]) as i8])
            };
            (
                self.node_opt("DequantizeLinear", &[Some(q), Some(st), Some(zt)], vec![]),
                s,
            )
        }
        fn q(&mut self, x: TensorId, scale: f32, u8_: bool) -> TensorId {
            let r = self.rand(1);
            let st = self.c(&[], &[scale]);
            let zt = if u8_ {
                self.c(&[], &[(128.0 + 30.0 * r[0]) as u8])
            } else {
                self.c(&[], &[(30.0 * r[0]) as i8])
            };
            self.node_opt("QuantizeLinear", &[Some(x), Some(st), Some(zt)], vec![])
        }
        /// Per-channel int8 weights of `shape` (channels on `axis`), DQ'd.
        fn weights(&mut self, shape: &[usize], axis: usize) -> (TensorId, Vec<f32>) {
            let n: usize = shape.iter().product();
            let w: Vec<i8> = self.rand(n).iter().map(|v| (v * 127.0) as i8).collect();
            let ch = shape[axis];
            let s: Vec<f32> = self
                .rand(ch)
                .iter()
                .map(|v| 0.002 + 0.01 * (v + 1.0))
                .collect();
            let wt = self.c(shape, &w);
            let st = self.c(&[ch], &s);
            let zt = self.c(&[ch], &vec![0i8; ch]);
            (
                self.node_opt(
                    "DequantizeLinear",
                    &[Some(wt), Some(st), Some(zt)],
                    vec![("axis", AttrValue::Int(axis as i64))],
                ),
                s,
            )
        }
        fn bias(&mut self, sx: f32, sw: &[f32]) -> TensorId {
            let b: Vec<i32> = self
                .rand(sw.len())
                .iter()
                .map(|v| (v * 3000.0) as i32)
                .collect();
            let s: Vec<f32> = sw.iter().map(|w| sx * w).collect();
            let bt = self.c(&[sw.len()], &b);
            let st = self.c(&[sw.len()], &s);
            self.node_opt(
                "DequantizeLinear",
                &[Some(bt), Some(st)],
                vec![("axis", AttrValue::Int(0))],
            )
        }
    }

    /// Runs `g` (input `x` of `shape`, 8-bit random data) literally and fused;
    /// returns (elements, exact, max LSB difference) and the fused op types.
    fn compare(
        mut b: G,
        x: TensorId,
        shape: &[usize],
        u8_: bool,
        out: TensorId,
    ) -> (usize, usize, i32, Vec<String>) {
        b.g.inputs = vec![x];
        b.g.outputs = vec![out];
        b.g.tensors[x as usize].dtype = Some(if u8_ { DType::U8 } else { DType::I8 });
        b.g.tensors[x as usize].shape = Some(shape.iter().map(|&d| Dim::Fixed(d)).collect());
        let n: usize = shape.iter().product();
        let data: Vec<f32> = b.rand(n);
        let model = Model {
            graph: b.g,
            opsets: vec![(String::new(), 13)],
            ..Model::default()
        };
        let mut fused = model.clone();
        super::run(&mut fused);
        let ops: Vec<String> = fused
            .graph
            .nodes
            .iter()
            .map(|n| n.op_type.clone())
            .collect();
        let run = |m: &Model| -> Vec<i32> {
            let plan = SessionBuilder::new(m)
                .plan()
                .unwrap_or_else(|e| panic!("{}", m.explain(&e)));
            let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
            let mut s = Session::new(m, &plan, &mut arena).unwrap();
            let name = String::from(m.input_names().next().unwrap());
            if u8_ {
                let v: Vec<u8> = data.iter().map(|d| (128.0 + d * 127.0) as u8).collect();
                s.run(&[(&name, TensorView::new(shape, &v).unwrap())])
                    .unwrap();
            } else {
                let v: Vec<i8> = data.iter().map(|d| (d * 127.0) as i8).collect();
                s.run(&[(&name, TensorView::new(shape, &v).unwrap())])
                    .unwrap();
            }
            let o = s.output(0).unwrap();
            (0..o.numel())
                .map(|k| o.int_at(k).unwrap() as i32)
                .collect()
        };
        let (want, got) = (run(&model), run(&fused));
        assert_eq!(want.len(), got.len());
        let exact = want.iter().zip(&got).filter(|(a, b)| a == b).count();
        let max = want
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .max()
            .unwrap_or(0);
        (want.len(), exact, max, ops)
    }

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    /// Conv cases: (c, m, group, k, stride, pad, hw, activation, u8).
    fn conv_case(
        seed: u64,
        c: usize,
        m: usize,
        group: usize,
        k: usize,
        stride: i64,
        pad: i64,
        hw: usize,
        act: u8,
        u8_: bool,
    ) -> (usize, usize, i32, Vec<String>) {
        let mut b = G::new(seed);
        let x = b.tensor("x", None);
        let (xd, sx) = b.dq_act(x, u8_);
        let (wd, sw) = b.weights(&[m, c / group, k, k], 0);
        let bd = b.bias(sx, &sw);
        let conv = b.node_opt(
            "Conv",
            &[Some(xd), Some(wd), Some(bd)],
            vec![
                ("group", AttrValue::Int(group as i64)),
                ("kernel_shape", ints(&[k as i64, k as i64])),
                ("strides", ints(&[stride, stride])),
                ("pads", ints(&[pad; 4])),
            ],
        );
        let y = match act {
            1 => b.node_opt("Relu", &[Some(conv)], vec![]),
            2 => {
                let (lo, hi) = (b.c(&[], &[0.0f32]), b.c(&[], &[6.0f32]));
                b.node_opt("Clip", &[Some(conv), Some(lo), Some(hi)], vec![])
            }
            _ => conv,
        };
        let sy = sx * sw[0] * 130.0 * libm::sqrtf((c / group * k * k) as f32);
        let out = b.q(y, sy, u8_);
        compare(b, x, &[1, c, hw, hw], u8_, out)
    }

    fn check_rule(what: &str, n: usize, exact: usize, max: i32) {
        assert!(max <= 1, "{what}: max diff {max} LSB");
        assert!(
            exact as f64 >= 0.999 * n as f64,
            "{what}: {exact}/{n} exact"
        );
    }

    #[test]
    fn qconv_matches_qdq_meaning() {
        let (mut n, mut e, mut mx) = (0, 0, 0);
        let cases: &[(usize, usize, usize, usize, i64, i64, usize)] = &[
            (3, 8, 1, 3, 1, 1, 9),
            (8, 8, 8, 3, 1, 1, 10), // depthwise
            (8, 8, 8, 3, 2, 1, 11), // depthwise, stride 2
            (8, 16, 1, 1, 1, 0, 6), // pointwise
            (4, 6, 2, 3, 2, 0, 9),  // grouped
            (2, 4, 1, 5, 1, 2, 7),
        ];
        for (i, &(c, m, group, k, s, p, hw)) in cases.iter().enumerate() {
            for act in 0..3u8 {
                for u8_ in [false, true] {
                    let (cn, ce, cm, ops) = conv_case(
                        i as u64 * 100 + act as u64 * 10 + u8_ as u64,
                        c,
                        m,
                        group,
                        k,
                        s,
                        p,
                        hw,
                        act,
                        u8_,
                    );
                    assert!(ops.iter().any(|o| o == "QConv"), "not fused: {ops:?}");
                    assert!(
                        !ops.iter().any(|o| o == "Relu" || o == "Clip"),
                        "activation left: {ops:?}"
                    );
                    assert!(cm <= 1, "case {i} act {act} u8 {u8_}: {cm} LSB");
                    n += cn;
                    e += ce;
                    mx = mx.max(cm);
                }
            }
        }
        check_rule("QConv", n, e, mx);
    }

    #[test]
    fn qmatmul_and_gemm_match_qdq_meaning() {
        let (mut n, mut e, mut mx) = (0, 0, 0);
        for (i, &(m, k, nn, gemm, trans_b)) in [
            (4, 32, 16, false, false),
            (3, 64, 10, true, true),
            (5, 20, 7, true, false),
            (2, 128, 33, false, false),
        ]
        .iter()
        .enumerate()
        {
            for u8_ in [false, true] {
                let mut b = G::new(1000 + i as u64 * 10 + u8_ as u64);
                let x = b.tensor("x", None);
                let (xd, sx) = b.dq_act(x, u8_);
                let wshape = if trans_b { [nn, k] } else { [k, nn] };
                let (wd, sw) = b.weights(&wshape, if trans_b { 0 } else { 1 });
                let y = if gemm {
                    let bd = b.bias(sx, &sw);
                    let g = b.node_opt(
                        "Gemm",
                        &[Some(xd), Some(wd), Some(bd)],
                        vec![("transB", AttrValue::Int(trans_b as i64))],
                    );
                    b.node_opt("Relu", &[Some(g)], vec![])
                } else {
                    b.node_opt("MatMul", &[Some(xd), Some(wd)], vec![])
                };
                let out = b.q(y, sx * sw[0] * 130.0 * libm::sqrtf(k as f32), u8_);
                let (cn, ce, cm, ops) = compare(b, x, &[m, k], u8_, out);
                assert!(ops.iter().any(|o| o == "QMatMul"), "not fused: {ops:?}");
                n += cn;
                e += ce;
                mx = mx.max(cm);
            }
        }
        check_rule("QMatMul", n, e, mx);
    }

    #[test]
    fn activations_and_data_movement_run_on_8_bit() {
        for u8_ in [false, true] {
            // DQ → Relu → Q (new scale) → DQ → MaxPool → Q (new scale) →
            // DQ → Reshape → Q (same scale).
            let mut b = G::new(77 + u8_ as u64);
            let x = b.tensor("x", None);
            let (xd, sx) = b.dq_act(x, u8_);
            let r = b.node_opt("Relu", &[Some(xd)], vec![]);
            let rq = b.q(r, sx * 0.7, u8_);
            let (rd, _) = b.dq_act(rq, u8_);
            let mp = b.node_opt(
                "MaxPool",
                &[Some(rd)],
                vec![("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2, 2]))],
            );
            let mq = b.q(mp, 0.02, u8_);
            let (md, _) = b.dq_act(mq, u8_);
            let shape = b.c(&[2], &[1i64, -1]);
            let rs = b.node_opt("Reshape", &[Some(md), Some(shape)], vec![]);
            let out = b.q(rs, 0.03, u8_);
            let (n, e, m, ops) = compare(b, x, &[1, 3, 8, 8], u8_, out);
            assert!(ops.iter().any(|o| o == "QRequant"), "{ops:?}");
            assert!(!ops.iter().any(|o| o == "DequantizeLinear"), "{ops:?}");
            check_rule("Relu/MaxPool/Reshape", n, e, m);
        }
    }

    #[test]
    fn unfusable_chains_stay_float_with_a_reason() {
        // A Conv whose output is also a graph output cannot drop its float.
        let mut b = G::new(5);
        let x = b.tensor("x", None);
        let (xd, sx) = b.dq_act(x, false);
        let (wd, sw) = b.weights(&[4, 2, 3, 3], 0);
        let conv = b.node_opt(
            "Conv",
            &[Some(xd), Some(wd)],
            vec![("kernel_shape", ints(&[3, 3]))],
        );
        let out = b.q(conv, sx * sw[0] * 10.0, false);
        b.g.inputs = vec![x];
        b.g.outputs = vec![out, conv];
        let mut m = Model {
            graph: b.g,
            ..Model::default()
        };
        super::run(&mut m);
        assert_eq!(m.fusions.len(), 1);
        assert_eq!(m.fusions[0].integer, None);
        assert_eq!(m.fusions[0].reason, "output has other readers");
        assert!(m.graph.nodes.iter().any(|n| n.op_type == "Conv"));
    }
}

#[cfg(test)]
mod io_tests {
    use super::*;
    use crate::model::{Dim, Graph, Model, Node, TensorInfo};
    use crate::{Session, SessionBuilder, TensorView};
    use alloc::vec;

    /// x (f32) → Q → DQ → Relu → Q → DQ → y (f32).
    fn model() -> Model {
        let mut g = Graph::default();
        let mut t = |name: &str, v: Option<Const>| {
            g.tensors.push(TensorInfo {
                name: name.into(),
                dtype: Some(DType::F32),
                shape: Some(vec![Dim::Fixed(6)]),
                value: v,
                onnx_type: 0,
            });
            (g.tensors.len() - 1) as TensorId
        };
        let x = t("x", None);
        let s0 = t("s0", Some(Const::from_slice(&[], &[0.05f32]).unwrap()));
        let z0 = t("z0", Some(Const::from_slice(&[], &[3i8]).unwrap()));
        let s1 = t("s1", Some(Const::from_slice(&[], &[0.03f32]).unwrap()));
        let z1 = t("z1", Some(Const::from_slice(&[], &[-7i8]).unwrap()));
        let (xq, xd, r, rq, y) = (
            t("xq", None),
            t("xd", None),
            t("r", None),
            t("rq", None),
            t("y", None),
        );
        let node = |op: &str, i: Vec<TensorId>, o: TensorId| Node {
            name: op.into(),
            op_type: op.into(),
            domain: String::new(),
            opset: 13,
            inputs: i.into_iter().map(Some).collect(),
            outputs: vec![Some(o)],
            attrs: vec![],
        };
        g.nodes = vec![
            node("QuantizeLinear", vec![x, s0, z0], xq),
            node("DequantizeLinear", vec![xq, s0, z0], xd),
            node("Relu", vec![xd], r),
            node("QuantizeLinear", vec![r, s1, z1], rq),
            node("DequantizeLinear", vec![rq, s1, z1], y),
        ];
        g.inputs = vec![x];
        g.outputs = vec![y];
        Model {
            graph: g,
            opsets: vec![(String::new(), 13)],
            ..Model::default()
        }
    }

    #[test]
    fn int8_io_feeds_and_returns_the_quantized_tensors() {
        let xs = [-1.0f32, -0.2, 0.0, 0.13, 0.7, 2.0];
        let float = model();
        let plan = SessionBuilder::new(&float).plan().unwrap();
        let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
        let mut s = Session::new(&float, &plan, &mut arena).unwrap();
        s.run(&[("x", TensorView::new(&[6], &xs).unwrap())])
            .unwrap();
        let want: Vec<f32> = s.output(0).unwrap().f32().unwrap().to_vec();

        let mut m = model();
        run(&mut m);
        let io = int8_io(&mut m);
        assert_eq!(io.len(), 2, "{io:?}");
        assert_eq!(
            (io[0].name.as_str(), io[0].scale, io[0].zero_point),
            ("x", 0.05, 3)
        );
        assert_eq!(
            (io[1].name.as_str(), io[1].scale, io[1].zero_point),
            ("y", 0.03, -7)
        );
        let ops: Vec<&str> = m.graph.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, ["QRequant"]);
        let xq: Vec<i8> = xs
            .iter()
            .map(|v| (libm::rintf(v / 0.05) + 3.0).clamp(-128.0, 127.0) as i8)
            .collect();
        let plan = SessionBuilder::new(&m).plan().unwrap();
        assert!(plan.arena_bytes() < 64);
        let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
        let mut s = Session::new(&m, &plan, &mut arena).unwrap();
        s.run(&[("x", TensorView::new(&[6], &xq).unwrap())])
            .unwrap();
        let out = s.output_by_name("y").unwrap();
        let got: Vec<f32> = out
            .as_slice::<i8>()
            .unwrap()
            .iter()
            .map(|&q| (q as i32 + 7) as f32 * 0.03)
            .collect();
        assert_eq!(got, want);
    }
}
