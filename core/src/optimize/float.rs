//! Float graph rewrites, run by [`super::run`] after QDQ fusion.
//!
//! Each pass is a local pattern on default-domain ops whose parameters are
//! constants of the graph, so it never reaches into a fused integer node
//! (those are in the `mote` / `com.microsoft` domains) nor into a float op
//! left between DequantizeLinear nodes (its weight is a DequantizeLinear
//! output, not a constant):
//!
//! | pass | rewrite |
//! |---|---|
//! | `transpose` | Transpose ∘ Transpose → one Transpose (or Identity); identity perm → Identity |
//! | `identity` | Identity, inference Dropout → removed (consumers read the input) |
//! | `batchnorm` | Conv / ConvTranspose → BatchNormalization → one Conv with W·s, (b−mean)·s+β, s = γ/√(var+ε) (f64) |
//! | `bias` | Conv / Gemm → Add of a per-channel constant → into the bias; Conv / Gemm / MatMul → Mul of a per-channel constant → into the weights |
//! | `gemm` | MatMul (2-D A, constant 2-D B) → Add of a constant along N → Gemm |
//! | `gelu` | x / √2 (or x · 1/√2) → Erf → + 1 → · x → · 0.5, the factors in any of PyTorch's orders → one Gelu (opset 20; onnxruntime fuses the same pattern) |
//! | `activation` | Conv (constant f32 W) → Relu / Clip (constant bounds) / LeakyRelu / Sigmoid / Tanh / HardSigmoid / HardSwish → one `com.microsoft.FusedConv` (onnxruntime's op and attributes, plus HardSwish; the activation runs on the output in the same step); Gemm → activation is left alone |
//! | `dead` | nodes nobody reads removed; then tensors nobody names dropped (unused initializers with them) |
//!
//! The first seven repeat until none applies (a BN fold may expose an Add
//! fold behind it); `dead` runs last. A tensor that is a graph output or is
//! read by a control-flow node (whose body may capture it by name) is
//! *pinned*: no rewrite removes it or renames its producer away, so graph
//! outputs keep their names. A folded node takes over the output tensor of
//! the node it absorbs, which keeps the name of a graph output too.

use alloc::string::String;
use alloc::vec::Vec;

use crate::model::{Attr, AttrValue, Const, Dim, Graph, Node, TensorInfo};
use crate::ops::activation::Act;
use crate::{DType, TensorId};

/// The float passes, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pass {
    /// Transpose ∘ Transpose collapsed; identity permutations removed.
    Transpose,
    /// Identity and inference-mode Dropout removed.
    Identity,
    /// BatchNormalization folded into the Conv / ConvTranspose before it.
    BatchNorm,
    /// A constant per-channel Add / Mul folded into the op before it.
    Bias,
    /// MatMul + constant Add turned into Gemm.
    Gemm,
    /// The Erf form of GELU (five element-wise nodes) turned into Gelu.
    Gelu,
    /// An activation after a Conv fused into it (`FusedConv`).
    Activation,
    /// Nodes whose outputs nobody reads, and unused tensors, removed.
    Dead,
}

impl Pass {
    /// Every pass, in run order.
    pub const ALL: [Pass; 8] = [
        Pass::Transpose,
        Pass::Identity,
        Pass::BatchNorm,
        Pass::Bias,
        Pass::Gemm,
        Pass::Gelu,
        Pass::Activation,
        Pass::Dead,
    ];
    /// Short name (`mote inspect --optimized`).
    pub fn name(self) -> &'static str {
        match self {
            Pass::Transpose => "transpose",
            Pass::Identity => "identity",
            Pass::BatchNorm => "batchnorm",
            Pass::Bias => "bias",
            Pass::Gemm => "gemm",
            Pass::Gelu => "gelu",
            Pass::Activation => "activation",
            Pass::Dead => "dead",
        }
    }
}

/// One rewrite a float pass made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rewrite {
    /// The pass.
    pub pass: Pass,
    /// The node rewritten or removed (name, or `op_type#index` when unnamed).
    pub node: String,
    /// What was done, e.g. `BatchNormalization 'bn1' folded into Conv`.
    pub detail: String,
}

/// Runs every float pass on `g` and returns what they did.
pub fn run(g: &mut Graph) -> Vec<Rewrite> {
    let mut notes = Vec::new();
    let local = [
        Pass::Transpose,
        Pass::Identity,
        Pass::BatchNorm,
        Pass::Bias,
        Pass::Gemm,
        Pass::Gelu,
        // Last: BatchNormalization and bias folds into a Conv come first
        // (a FusedConv is no longer a default-domain Conv).
        Pass::Activation,
    ];
    // Every rewrite removes a node or moves a Transpose one producer up;
    // the bound only guards against a pattern that would undo another.
    let mut budget = g.nodes.len().saturating_mul(4).saturating_add(16);
    // Constants the edits freed (count, bytes), reported with the others
    // that `compact` drops.
    let mut freed = (0usize, 0usize);
    'outer: loop {
        let mut changed = false;
        for pass in local {
            loop {
                if budget == 0 {
                    break 'outer;
                }
                let ix = Ix::new(g);
                let found = (0..g.nodes.len()).find_map(|i| find(g, &ix, pass, i));
                let Some(edit) = found else { break };
                budget = budget.saturating_sub(1);
                changed = true;
                notes.push(edit.note.clone());
                let (n, b) = apply(g, edit);
                freed.0 = freed.0.saturating_add(n);
                freed.1 = freed.1.saturating_add(b);
            }
        }
        if !changed {
            break;
        }
    }
    dead_nodes(g, &mut notes);
    compact(g, &mut notes, freed);
    notes
}

/// Producers, readers and pinned tensors of the graph as it is now.
struct Ix {
    producer: Vec<Option<usize>>,
    /// Reading nodes per tensor (a node reading twice is listed twice).
    readers: Vec<Vec<usize>>,
    pinned: Vec<bool>,
}

impl Ix {
    fn new(g: &Graph) -> Self {
        let nt = g.tensors.len();
        let mut producer = alloc::vec![None; nt];
        let mut readers = alloc::vec![Vec::new(); nt];
        let mut pinned = alloc::vec![false; nt];
        for (i, n) in g.nodes.iter().enumerate() {
            for &o in n.outputs.iter().flatten() {
                if let Some(p) = producer.get_mut(o as usize) {
                    *p = Some(i);
                }
            }
            let body = n
                .attrs
                .iter()
                .any(|a| matches!(a.value, AttrValue::Graph(_) | AttrValue::Graphs(_)));
            for &t in n.inputs.iter().flatten() {
                if let Some(r) = readers.get_mut(t as usize) {
                    r.push(i);
                }
                if body {
                    if let Some(p) = pinned.get_mut(t as usize) {
                        *p = true;
                    }
                }
            }
        }
        for &o in &g.outputs {
            if let Some(p) = pinned.get_mut(o as usize) {
                *p = true;
            }
        }
        Ix {
            producer,
            readers,
            pinned,
        }
    }

    fn pinned(&self, t: TensorId) -> bool {
        self.pinned.get(t as usize).copied().unwrap_or(true)
    }

    fn readers(&self, t: TensorId) -> &[usize] {
        self.readers.get(t as usize).map_or(&[], Vec::as_slice)
    }

    /// Nobody reads `t` and it is not pinned.
    fn unused(&self, t: TensorId) -> bool {
        self.readers(t).is_empty() && !self.pinned(t)
    }

    /// `t` is read by node `i` only (once), and is not pinned.
    fn only_read_by(&self, t: TensorId, i: usize) -> bool {
        self.readers(t) == [i] && !self.pinned(t)
    }

    fn producer<'g>(&self, g: &'g Graph, t: TensorId) -> Option<(usize, &'g Node)> {
        let p = (*self.producer.get(t as usize)?)?;
        Some((p, g.nodes.get(p)?))
    }
}

/// A rewrite found on the graph, applied by [`apply`]. New tensors get the
/// ids `g.tensors.len()..` in order, so nodes in `set` may name them.
struct Edit {
    note: Rewrite,
    set: Vec<(usize, Node)>,
    remove: Vec<usize>,
    /// Readers of `.0` read `.1` instead.
    rewire: Option<(TensorId, TensorId)>,
    tensors: Vec<TensorInfo>,
}

impl Edit {
    fn new(pass: Pass, node: String, detail: String) -> Self {
        Edit {
            note: Rewrite { pass, node, detail },
            set: Vec::new(),
            remove: Vec::new(),
            rewire: None,
            tensors: Vec::new(),
        }
    }
}

/// Applies `e`; returns the count and bytes of the constants it freed.
fn apply(g: &mut Graph, e: Edit) -> (usize, usize) {
    // Constants the replaced or removed nodes read: freed below once nobody
    // reads them, so that a pass over a big model (BatchNorm folding makes
    // new weights) never holds the old and the new weights together.
    let mut old: Vec<TensorId> = e
        .set
        .iter()
        .map(|(i, _)| *i)
        .chain(e.remove.iter().copied())
        .filter_map(|i| g.nodes.get(i))
        .flat_map(|n| n.inputs.iter().flatten().copied())
        .filter(|&t| value(g, t).is_some())
        .collect();
    old.sort_unstable();
    old.dedup();
    g.tensors.extend(e.tensors);
    for (i, n) in e.set {
        if let Some(slot) = g.nodes.get_mut(i) {
            *slot = n;
        }
    }
    if let Some((from, to)) = e.rewire {
        for n in &mut g.nodes {
            for t in n.inputs.iter_mut().flatten() {
                if *t == from {
                    *t = to;
                }
            }
        }
    }
    let mut remove = e.remove;
    remove.sort_unstable();
    remove.dedup();
    let mut k = 0usize;
    g.nodes.retain(|_| {
        let keep = remove.binary_search(&k).is_err();
        k = k.saturating_add(1);
        keep
    });
    let mut freed = (0usize, 0usize);
    if !old.is_empty() {
        let ix = Ix::new(g);
        for t in old {
            if ix.unused(t) {
                if let Some(c) = g.tensors.get_mut(t as usize).and_then(|i| i.value.take()) {
                    freed.0 = freed.0.saturating_add(1);
                    freed.1 = freed.1.saturating_add(c.byte_len());
                }
            }
        }
    }
    freed
}

fn find(g: &Graph, ix: &Ix, pass: Pass, i: usize) -> Option<Edit> {
    let n = g.nodes.get(i)?;
    if !n.domain.is_empty() {
        return None;
    }
    match pass {
        Pass::Transpose => transpose(g, ix, i, n),
        Pass::Identity => identity(g, ix, i, n),
        Pass::BatchNorm => batchnorm(g, ix, i, n),
        Pass::Bias => bias(g, ix, i, n),
        Pass::Gemm => gemm(g, ix, i, n),
        Pass::Gelu => gelu(g, ix, i, n),
        Pass::Activation => activation(g, ix, i, n),
        Pass::Dead => None,
    }
}

fn label(n: &Node, i: usize) -> String {
    if n.name.is_empty() {
        alloc::format!("{}#{}", n.op_type, i)
    } else {
        n.name.clone()
    }
}

fn is_op(n: &Node, op: &str) -> bool {
    n.op_type == op && n.domain.is_empty()
}

fn input(n: &Node, k: usize) -> Option<TensorId> {
    n.inputs.get(k).copied().flatten()
}

fn output(n: &Node, k: usize) -> Option<TensorId> {
    n.outputs.get(k).copied().flatten()
}

fn attr_i(n: &Node, name: &str, default: i64) -> i64 {
    match n.attr(name) {
        Some(AttrValue::Int(v)) => *v,
        _ => default,
    }
}

fn attr_f(n: &Node, name: &str, default: f32) -> f32 {
    match n.attr(name) {
        Some(AttrValue::Float(v)) => *v,
        _ => default,
    }
}

fn value(g: &Graph, t: TensorId) -> Option<&Const> {
    g.tensors.get(t as usize)?.value.as_ref()
}

/// A constant f32 tensor: its shape and values.
fn const_f32(g: &Graph, t: Option<TensorId>) -> Option<(&[usize], &[f32])> {
    let c = value(g, t?)?;
    if c.dtype != DType::F32 {
        return None;
    }
    Some((&c.shape, c.view().as_slice::<f32>().ok()?))
}

/// Whether every output but the first is absent or unused.
fn extra_outputs_unused(ix: &Ix, n: &Node) -> bool {
    n.outputs.iter().skip(1).flatten().all(|&t| ix.unused(t))
}

/// A new f32 constant `base/mote_<what>`, unique in `g` and in `pending`.
fn new_const(
    g: &Graph,
    pending: &[TensorInfo],
    base: &str,
    what: &str,
    shape: &[usize],
    v: &[f32],
) -> Option<TensorInfo> {
    let mut name = alloc::format!("{base}/mote_{what}");
    let mut k = 1usize;
    while g.tensor_id(&name).is_some() || pending.iter().any(|t| t.name == name) {
        k = k.saturating_add(1);
        name = alloc::format!("{base}/mote_{what}{k}");
    }
    Some(TensorInfo {
        name,
        dtype: Some(DType::F32),
        shape: Some(shape.iter().map(|&d| Dim::Fixed(d)).collect()),
        value: Some(Const::from_slice(shape, v).ok()?),
        onnx_type: DType::F32.onnx_code(),
    })
}

/// Appends a folded constant to `pending` (the constants an edit adds after
/// `g`'s tensors, in order) and feeds it to input `slot` of `node`.
#[allow(clippy::too_many_arguments)]
fn feed_const(
    g: &Graph,
    pending: &mut Vec<TensorInfo>,
    node: &mut Node,
    slot: usize,
    base: &str,
    what: &str,
    shape: &[usize],
    v: &[f32],
) -> Option<()> {
    let id = TensorId::try_from(g.tensors.len().checked_add(pending.len())?).ok()?;
    let t = new_const(g, pending, base, what, shape, v)?;
    pending.push(t);
    if let Some(s) = node.inputs.get_mut(slot) {
        *s = Some(id);
    }
    Some(())
}

fn tensor_name(g: &Graph, t: TensorId) -> &str {
    g.tensors.get(t as usize).map_or("", |t| t.name.as_str())
}

// ---------------------------------------------------------------------------
// transpose

fn perm(n: &Node) -> Option<&[i64]> {
    match n.attr("perm") {
        Some(AttrValue::Ints(p)) => Some(p),
        _ => None,
    }
}

fn valid_perm(p: &[i64]) -> bool {
    let mut seen = alloc::vec![false; p.len()];
    p.iter().all(
        |&d| match seen.get_mut(usize::try_from(d).unwrap_or(usize::MAX)) {
            Some(s) if !*s => {
                *s = true;
                true
            }
            _ => false,
        },
    )
}

fn is_identity_perm(p: &[i64]) -> bool {
    p.iter().enumerate().all(|(k, &d)| d == k as i64)
}

fn to_identity(n: &Node, x: TensorId) -> Node {
    Node {
        op_type: "Identity".into(),
        inputs: alloc::vec![Some(x)],
        outputs: n.outputs.iter().take(1).copied().collect(),
        attrs: Vec::new(),
        ..n.clone()
    }
}

fn transpose(g: &Graph, ix: &Ix, i: usize, n: &Node) -> Option<Edit> {
    if !is_op(n, "Transpose") {
        return None;
    }
    let p2 = perm(n)?;
    let x = input(n, 0)?;
    output(n, 0)?;
    if !valid_perm(p2) {
        return None;
    }
    let name = label(n, i);
    if is_identity_perm(p2) {
        let mut e = Edit::new(
            Pass::Transpose,
            name,
            "identity permutation: became Identity".into(),
        );
        e.set.push((i, to_identity(n, x)));
        return Some(e);
    }
    let (pi, t1) = ix.producer(g, x)?;
    if !is_op(t1, "Transpose") {
        return None;
    }
    let p1 = perm(t1)?;
    let x0 = input(t1, 0)?;
    if p1.len() != p2.len() || !valid_perm(p1) {
        return None;
    }
    // out[k] = mid[p2[k]] = in[p1[p2[k]]].
    let q: Vec<i64> = p2
        .iter()
        .map(|&d| p1.get(d as usize).copied())
        .collect::<Option<_>>()?;
    let first = label(t1, pi);
    if is_identity_perm(&q) {
        let mut e = Edit::new(
            Pass::Transpose,
            name,
            alloc::format!("with Transpose '{first}' before it: identity, became Identity"),
        );
        e.set.push((i, to_identity(n, x0)));
        return Some(e);
    }
    let mut nn = n.clone();
    if let Some(s) = nn.inputs.first_mut() {
        *s = Some(x0);
    }
    for a in &mut nn.attrs {
        if a.name == "perm" {
            a.value = AttrValue::Ints(q.clone());
        }
    }
    let mut e = Edit::new(
        Pass::Transpose,
        name,
        alloc::format!("merged with Transpose '{first}' before it: perm {q:?}"),
    );
    e.set.push((i, nn));
    Some(e)
}

// ---------------------------------------------------------------------------
// identity

/// Dropout that is the identity at inference, as its kernel decides
/// (`ops::shape`): ratio 0 or training mode off (absent or a constant
/// zero), and its mask unused.
fn dropout_is_identity(g: &Graph, ix: &Ix, n: &Node) -> bool {
    if !extra_outputs_unused(ix, n) {
        return false;
    }
    if n.opset < 12 {
        return true;
    }
    let ratio = input(n, 1).and_then(|t| value(g, t)).and_then(|c| {
        let v = c.view();
        if v.numel() == 1 {
            v.f64_at(0)
        } else {
            None
        }
    });
    if ratio == Some(0.0) {
        return true;
    }
    match input(n, 2) {
        None => true,
        Some(t) => value(g, t).is_some_and(|c| {
            let v = c.view();
            v.numel() == 0 || v.f64_at(0).unwrap_or(0.0) == 0.0
        }),
    }
}

fn identity(g: &Graph, ix: &Ix, i: usize, n: &Node) -> Option<Edit> {
    let what = if is_op(n, "Identity") {
        "Identity"
    } else if is_op(n, "Dropout") && dropout_is_identity(g, ix, n) {
        "Dropout (inference)"
    } else {
        return None;
    };
    let x = input(n, 0)?;
    let y = output(n, 0)?;
    let name = label(n, i);
    if !ix.pinned(y) {
        let mut e = Edit::new(
            Pass::Identity,
            name,
            alloc::format!("{what} removed: readers take '{}'", tensor_name(g, x)),
        );
        e.rewire = Some((y, x));
        e.remove.push(i);
        return Some(e);
    }
    // y is pinned (a graph output, or captured by a body): it keeps its
    // name, written by the producer of x, if nothing else needs x.
    let (pi, p) = ix.producer(g, x)?;
    if !ix.only_read_by(x, i) {
        return None;
    }
    let mut pn = p.clone();
    for o in pn.outputs.iter_mut().flatten() {
        if *o == x {
            *o = y;
        }
    }
    let mut e = Edit::new(
        Pass::Identity,
        name,
        alloc::format!(
            "{what} removed: '{}' writes graph output '{}'",
            label(p, pi),
            tensor_name(g, y)
        ),
    );
    e.set.push((pi, pn));
    e.remove.push(i);
    Some(e)
}

// ---------------------------------------------------------------------------
// batchnorm

fn batchnorm(g: &Graph, ix: &Ix, i: usize, n: &Node) -> Option<Edit> {
    if !is_op(n, "BatchNormalization")
        || attr_i(n, "training_mode", 0) != 0
        || attr_i(n, "spatial", 1) != 1
        || !extra_outputs_unused(ix, n)
    {
        return None;
    }
    let x = input(n, 0)?;
    let y = output(n, 0)?;
    let (gamma_s, gamma) = const_f32(g, input(n, 1))?;
    let (_, beta) = const_f32(g, input(n, 2))?;
    let (_, mean) = const_f32(g, input(n, 3))?;
    let (_, var) = const_f32(g, input(n, 4))?;
    let m = gamma.len();
    if gamma_s.len() != 1 || [beta.len(), mean.len(), var.len()] != [m, m, m] {
        return None;
    }
    let (pi, conv) = ix.producer(g, x)?;
    let transposed = is_op(conv, "ConvTranspose");
    if !(is_op(conv, "Conv") || transposed) || !ix.only_read_by(x, i) || conv.outputs.len() != 1 {
        return None;
    }
    let w_id = input(conv, 1)?;
    let (w_shape, w) = const_f32(g, Some(w_id))?;
    if w_shape.len() < 3 {
        return None;
    }
    // Output channel of each weight element.
    let group = usize::try_from(attr_i(conv, "group", 1)).ok()?.max(1);
    let (d0, d1) = (*w_shape.first()?, *w_shape.get(1)?);
    let per = w_shape
        .iter()
        .skip(2)
        .try_fold(1usize, |a, &d| a.checked_mul(d))?;
    let out_channels = if transposed {
        d1.checked_mul(group)?
    } else {
        d0
    };
    if out_channels != m || (transposed && d0.checked_rem(group) != Some(0)) || per == 0 {
        return None;
    }
    let b = match input(conv, 2) {
        None => None,
        Some(t) => {
            let (bs, b) = const_f32(g, Some(t))?;
            if bs.len() != 1 || b.len() != m {
                return None;
            }
            Some(b)
        }
    };
    let eps = f64::from(attr_f(n, "epsilon", 1e-5));
    let s: Vec<f64> = gamma
        .iter()
        .zip(var)
        .map(|(&g, &v)| f64::from(g) / libm::sqrt(f64::from(v) + eps))
        .collect();
    let row = d1.checked_mul(per)?;
    let per_group = d0.checked_div(group)?;
    let channel = |k: usize| -> Option<usize> {
        let c = k.checked_div(row)?;
        if transposed {
            let j = k.checked_div(per)?.checked_rem(d1)?;
            c.checked_div(per_group)?.checked_mul(d1)?.checked_add(j)
        } else {
            Some(c)
        }
    };
    let w2: Vec<f32> = w
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let sc = channel(k).and_then(|c| s.get(c)).copied().unwrap_or(1.0);
            (f64::from(v) * sc) as f32
        })
        .collect();
    let b2: Vec<f32> = (0..m)
        .map(|c| {
            let bc = b.and_then(|b| b.get(c)).copied().map_or(0.0, f64::from);
            let (mc, sc, bt) = (
                mean.get(c).copied().map_or(0.0, f64::from),
                s.get(c).copied().unwrap_or(1.0),
                beta.get(c).copied().map_or(0.0, f64::from),
            );
            ((bc - mc) * sc + bt) as f32
        })
        .collect();
    let base = tensor_name(g, w_id);
    let wt = new_const(g, &[], base, "folded", w_shape, &w2)?;
    let bt = new_const(g, core::slice::from_ref(&wt), base, "bias", &[m], &b2)?;
    let nt = g.tensors.len() as TensorId;
    let mut c2 = conv.clone();
    c2.inputs.resize(3, None);
    c2.inputs.truncate(3);
    if let Some(s) = c2.inputs.get_mut(1) {
        *s = Some(nt);
    }
    if let Some(s) = c2.inputs.get_mut(2) {
        *s = Some(nt.checked_add(1)?);
    }
    c2.outputs = alloc::vec![Some(y)];
    let mut e = Edit::new(
        Pass::BatchNorm,
        label(conv, pi),
        alloc::format!(
            "BatchNormalization '{}' folded into {}",
            label(n, i),
            conv.op_type
        ),
    );
    e.tensors = alloc::vec![wt, bt];
    e.set.push((pi, c2));
    e.remove.push(i);
    Some(e)
}

// ---------------------------------------------------------------------------
// bias

/// The constant operand of a binary Add / Mul and the other one.
type Operand<'g> = (TensorId, TensorId, &'g [usize], &'g [f32]);

/// The operands of a binary Add / Mul: (computed one, constant one, the
/// constant's shape and values).
fn const_operand<'g>(g: &'g Graph, n: &Node) -> Option<Operand<'g>> {
    if n.inputs.len() != 2 {
        return None;
    }
    let (a, b) = (input(n, 0)?, input(n, 1)?);
    if let Some((s, v)) = const_f32(g, Some(b)) {
        if value(g, a).is_none() {
            return Some((a, b, s, v));
        }
    }
    let (s, v) = const_f32(g, Some(a))?;
    value(g, b).is_none().then_some((b, a, s, v))
}

/// The per-channel values of a constant `c` broadcast against an output of
/// rank `rank` whose axis `axis` has `m` channels: `Some(v)` with `m`
/// values when `c` varies along that axis only and does not enlarge the
/// output's rank.
fn per_channel(shape: &[usize], v: &[f32], rank: usize, axis: usize, m: usize) -> Option<Vec<f32>> {
    if shape.len() > rank || v.is_empty() {
        return None;
    }
    let pad = rank.checked_sub(shape.len())?;
    let mut along = 1;
    for (k, &d) in shape.iter().enumerate() {
        if k.checked_add(pad) == Some(axis) {
            if d != 1 && d != m {
                return None;
            }
            along = d;
        } else if d != 1 {
            return None;
        }
    }
    Some(if along == m {
        v.get(..m)?.to_vec()
    } else {
        alloc::vec![*v.first()?; m]
    })
}

fn bias(g: &Graph, ix: &Ix, i: usize, n: &Node) -> Option<Edit> {
    let add = is_op(n, "Add");
    if !(add || is_op(n, "Mul")) {
        return None;
    }
    let y = output(n, 0)?;
    let (x, _, cs, cv) = const_operand(g, n)?;
    let (pi, p) = ix.producer(g, x)?;
    if !ix.only_read_by(x, i) || p.outputs.len() != 1 {
        return None;
    }
    let w_id = input(p, 1)?;
    let (w_shape, w) = const_f32(g, Some(w_id))?;
    let base = tensor_name(g, w_id);
    let mut p2 = p.clone();
    p2.outputs = alloc::vec![Some(y)];
    let mut tensors: Vec<TensorInfo> = Vec::new();
    let what = if add { "Add" } else { "Mul" };
    let detail;
    if is_op(p, "Conv") {
        let m = *w_shape.first()?;
        let v = per_channel(cs, cv, w_shape.len(), 1, m)?;
        let b = match input(p, 2) {
            None => None,
            Some(t) => {
                let (bs, b) = const_f32(g, Some(t))?;
                if bs.len() != 1 || b.len() != m {
                    return None;
                }
                Some(b)
            }
        };
        p2.inputs.resize(3, None);
        p2.inputs.truncate(3);
        if add {
            let b2: Vec<f32> = (0..m)
                .map(|c| {
                    let bc = b.and_then(|b| b.get(c)).copied().map_or(0.0, f64::from);
                    (bc + v.get(c).copied().map_or(0.0, f64::from)) as f32
                })
                .collect();
            feed_const(g, &mut tensors, &mut p2, 2, base, "bias", &[m], &b2)?;
            detail = alloc::format!("{what} '{}' folded into the bias", label(n, i));
        } else {
            let per = w.len().checked_div(m).filter(|&p| p > 0)?;
            let w2: Vec<f32> = w
                .iter()
                .enumerate()
                .map(|(k, &x)| {
                    x * k
                        .checked_div(per)
                        .and_then(|c| v.get(c))
                        .copied()
                        .unwrap_or(1.0)
                })
                .collect();
            feed_const(g, &mut tensors, &mut p2, 1, base, "folded", w_shape, &w2)?;
            if let Some(b) = b {
                let b2: Vec<f32> = b.iter().zip(&v).map(|(b, v)| b * v).collect();
                feed_const(g, &mut tensors, &mut p2, 2, base, "bias", &[m], &b2)?;
            }
            detail = alloc::format!("{what} '{}' folded into the weights", label(n, i));
        }
    } else if is_op(p, "Gemm") || (is_op(p, "MatMul") && !add) {
        if w_shape.len() != 2 {
            return None;
        }
        let trans_b = is_op(p, "Gemm") && attr_i(p, "transB", 0) != 0;
        let nn = *w_shape.get(if trans_b { 0 } else { 1 })?;
        let kk = *w_shape.get(if trans_b { 1 } else { 0 })?;
        // MatMul's A may be 1-D (output [N]): a constant of rank 2 would
        // add a dimension, so only rank ≤ 1 there.
        let v = if is_op(p, "MatMul") {
            per_channel(cs, cv, 1, 0, nn)?
        } else {
            per_channel(cs, cv, 2, 1, nn)?
        };
        // The Gemm's C, if any, must vary along N only.
        let c_old = match input(p, 2) {
            None => None,
            Some(t) => {
                let (s, c) = const_f32(g, Some(t))?;
                Some(per_channel(s, c, 2, 1, nn)?)
            }
        };
        let beta = f64::from(attr_f(p, "beta", 1.0));
        if add {
            let c2: Vec<f32> = (0..nn)
                .map(|j| {
                    let old = c_old
                        .as_ref()
                        .and_then(|c| c.get(j))
                        .copied()
                        .map_or(0.0, f64::from);
                    (beta * old + v.get(j).copied().map_or(0.0, f64::from)) as f32
                })
                .collect();
            p2.inputs.resize(3, None);
            feed_const(g, &mut tensors, &mut p2, 2, base, "bias", &[nn], &c2)?;
            p2.attrs.retain(|a| a.name != "beta");
            detail = alloc::format!("{what} '{}' folded into C", label(n, i));
        } else {
            let w2: Vec<f32> = w
                .iter()
                .enumerate()
                .map(|(k, &x)| {
                    // B is [N, K] under transB, else [K, N].
                    let j = if trans_b {
                        k.checked_div(kk)
                    } else {
                        k.checked_rem(nn)
                    };
                    x * j.and_then(|j| v.get(j)).copied().unwrap_or(1.0)
                })
                .collect();
            feed_const(g, &mut tensors, &mut p2, 1, base, "folded", w_shape, &w2)?;
            if let Some(c) = c_old {
                let c2: Vec<f32> = c.iter().zip(&v).map(|(c, v)| c * v).collect();
                feed_const(g, &mut tensors, &mut p2, 2, base, "bias", &[nn], &c2)?;
            }
            detail = alloc::format!("{what} '{}' folded into the weights", label(n, i));
        }
    } else {
        return None;
    }
    let mut e = Edit::new(Pass::Bias, label(p, pi), detail);
    e.tensors = tensors;
    e.set.push((pi, p2));
    e.remove.push(i);
    Some(e)
}

// ---------------------------------------------------------------------------
// gemm

/// The rank of `t` where the graph says it before shape inference: a
/// constant, a declared shape, or an op whose output rank is fixed.
fn known_rank(g: &Graph, ix: &Ix, t: TensorId, depth: usize) -> Option<usize> {
    if let Some(c) = value(g, t) {
        return Some(c.shape.len());
    }
    if let Some(s) = g.tensors.get(t as usize).and_then(|t| t.shape.as_ref()) {
        return Some(s.len());
    }
    if depth == 0 {
        return None;
    }
    let (_, p) = ix.producer(g, t)?;
    if !p.domain.is_empty() {
        return None;
    }
    match p.op_type.as_str() {
        "Flatten" | "Gemm" => Some(2),
        "Reshape" => value(g, input(p, 1)?).map(|c| c.view().numel()),
        "Relu" | "LeakyRelu" | "Sigmoid" | "Tanh" | "Clip" | "HardSigmoid" | "HardSwish"
        | "Elu" | "Selu" | "Gelu" | "Softmax" | "Identity" | "Dropout" | "Neg" | "Abs" | "Exp"
        | "Erf" | "Sqrt" | "Cast" => known_rank(g, ix, input(p, 0)?, depth.checked_sub(1)?),
        _ => None,
    }
}

fn gemm(g: &Graph, ix: &Ix, i: usize, n: &Node) -> Option<Edit> {
    if !is_op(n, "Add") {
        return None;
    }
    let y = output(n, 0)?;
    let (x, c, cs, cv) = const_operand(g, n)?;
    let (pi, p) = ix.producer(g, x)?;
    if !is_op(p, "MatMul") || !ix.only_read_by(x, i) || p.opset < 7 {
        return None;
    }
    let a = input(p, 0)?;
    let b = input(p, 1)?;
    let (bs, _) = const_f32(g, Some(b))?;
    if bs.len() != 2 || known_rank(g, ix, a, 16) != Some(2) {
        return None;
    }
    per_channel(cs, cv, 2, 1, *bs.get(1)?)?;
    let gm = Node {
        op_type: "Gemm".into(),
        inputs: alloc::vec![Some(a), Some(b), Some(c)],
        outputs: alloc::vec![Some(y)],
        attrs: Vec::<Attr>::new(),
        ..p.clone()
    };
    let mut e = Edit::new(
        Pass::Gemm,
        label(p, pi),
        alloc::format!("MatMul + Add '{}' became Gemm", label(n, i)),
    );
    e.set.push((pi, gm));
    e.remove.push(i);
    Some(e)
}

// ---------------------------------------------------------------------------
// gelu

/// `v` is `want` to within 1e-5 of it (exporters write √2 and 1/√2 in f32).
fn near(v: f32, want: f32) -> bool {
    (v - want).abs() <= 1e-5 * want.abs()
}

/// For a binary `op` node with one scalar f32 constant: its other operand
/// (which must be `x` when given) and the constant. Div only as
/// `operand / constant`. A constant of rank 1 or more must not raise the
/// rank of the other operand (a rank that is not known does not match).
fn scalar_op(
    g: &Graph,
    ix: &Ix,
    n: &Node,
    op: &str,
    x: Option<TensorId>,
) -> Option<(TensorId, f32)> {
    if !is_op(n, op) || n.outputs.len() != 1 {
        return None;
    }
    let (a, c, shape, v) = const_operand(g, n)?;
    if (op == "Div" && input(n, 1)? != c) || x.is_some_and(|x| x != a) {
        return None;
    }
    let &[v] = v else { return None };
    if !shape.is_empty() && known_rank(g, ix, a, 16).is_none_or(|r| r < shape.len()) {
        return None;
    }
    Some((a, v))
}

/// The single reader of `t` (read once, not pinned), with its index.
fn sole_reader<'g>(g: &'g Graph, ix: &Ix, t: TensorId) -> Option<(usize, &'g Node)> {
    let &[r] = ix.readers(t) else { return None };
    (!ix.pinned(t)).then_some(())?;
    Some((r, g.nodes.get(r)?))
}

/// `Erf` node `n` (index `i`) as the middle of `0.5 · x · (1 + erf(x/√2))`:
/// the five nodes become one Gelu that writes the last one's output.
fn gelu(g: &Graph, ix: &Ix, i: usize, n: &Node) -> Option<Edit> {
    if !is_op(n, "Erf") || n.inputs.len() != 1 || n.outputs.len() != 1 {
        return None;
    }
    let scaled = input(n, 0)?;
    let (pi, p) = ix.producer(g, scaled)?;
    if !ix.only_read_by(scaled, i) {
        return None;
    }
    let x = match (
        scalar_op(g, ix, p, "Div", None),
        scalar_op(g, ix, p, "Mul", None),
    ) {
        (Some((x, c)), _) if near(c, core::f32::consts::SQRT_2) => x,
        (_, Some((x, c))) if near(c, core::f32::consts::FRAC_1_SQRT_2) => x,
        _ => return None,
    };
    let (ai, a) = sole_reader(g, ix, output(n, 0)?)?;
    if scalar_op(g, ix, a, "Add", output(n, 0))?.1 != 1.0 {
        return None;
    }
    let (m1i, m1) = sole_reader(g, ix, output(a, 0)?)?;
    if !is_op(m1, "Mul") || m1.inputs.len() != 2 || m1.outputs.len() != 1 {
        return None;
    }
    let sum = output(a, 0)?;
    let other = match (input(m1, 0)?, input(m1, 1)?) {
        (s, o) | (o, s) if s == sum && o != sum => o,
        _ => return None,
    };
    let half = |v: f32| v == 0.5;
    // (index, node) of the node removed besides p, n, a, m1, and of the
    // one whose output the Gelu writes.
    let (extra, last) = if other == x {
        // ((1 + erf) · x) · 0.5
        let (m2i, m2) = sole_reader(g, ix, output(m1, 0)?)?;
        half(scalar_op(g, ix, m2, "Mul", output(m1, 0))?.1).then_some(())?;
        (m1i, (m2i, m2))
    } else if let Some((_, v)) = scalar_op(g, ix, m1, "Mul", Some(sum)) {
        // ((1 + erf) · 0.5) · x
        half(v).then_some(())?;
        let (m2i, m2) = sole_reader(g, ix, output(m1, 0)?)?;
        let m1o = output(m1, 0)?;
        let ok = is_op(m2, "Mul")
            && m2.outputs.len() == 1
            && matches!((input(m2, 0)?, input(m2, 1)?), (s, o) | (o, s) if s == m1o && o == x && o != s);
        ok.then_some(())?;
        (m1i, (m2i, m2))
    } else {
        // (x · 0.5) · (1 + erf)
        let (hi, h) = ix.producer(g, other)?;
        half(scalar_op(g, ix, h, "Mul", Some(x))?.1).then_some(())?;
        ix.only_read_by(other, m1i).then_some(())?;
        (hi, (m1i, m1))
    };
    let (li, l) = last;
    let fused = Node {
        op_type: "Gelu".into(),
        domain: String::new(),
        opset: 20,
        inputs: alloc::vec![Some(x)],
        outputs: alloc::vec![Some(output(l, 0)?)],
        attrs: Vec::new(),
        ..n.clone()
    };
    let mut e = Edit::new(
        Pass::Gelu,
        label(n, i),
        alloc::format!(
            "Erf '{}' and the Div/Mul/Add/Mul around it became Gelu",
            label(n, i)
        ),
    );
    e.set.push((li, fused));
    e.remove
        .extend([pi, i, ai, m1i, extra].into_iter().filter(|&k| k != li));
    Some(e)
}

// ---------------------------------------------------------------------------
// activation

/// A scalar f32 constant input `k` of `n`; `Some(None)` when absent.
fn const_scalar(g: &Graph, n: &Node, k: usize) -> Option<Option<f32>> {
    let Some(t) = input(n, k) else {
        return Some(None);
    };
    match const_f32(g, Some(t))? {
        (_, &[v]) => Some(Some(v)),
        _ => None,
    }
}

/// The activation node `n` as a fused one, if its parameters are known.
fn fusable_act(g: &Graph, n: &Node) -> Option<Act> {
    if !n.domain.is_empty() {
        return None;
    }
    Some(match n.op_type.as_str() {
        "Relu" => Act::Relu,
        "Sigmoid" => Act::Sigmoid,
        "Tanh" => Act::Tanh,
        "HardSwish" => Act::HardSwish,
        "LeakyRelu" => Act::LeakyRelu(attr_f(n, "alpha", 0.01)),
        "HardSigmoid" => Act::HardSigmoid(attr_f(n, "alpha", 0.2), attr_f(n, "beta", 0.5)),
        "Clip" if n.opset < 11 => Act::Clip(
            attr_f(n, "min", f32::NEG_INFINITY),
            attr_f(n, "max", f32::INFINITY),
        ),
        "Clip" => Act::Clip(
            const_scalar(g, n, 1)?.unwrap_or(f32::NEG_INFINITY),
            const_scalar(g, n, 2)?.unwrap_or(f32::INFINITY),
        ),
        _ => return None,
    })
}

fn activation(g: &Graph, ix: &Ix, i: usize, n: &Node) -> Option<Edit> {
    let act = fusable_act(g, n)?;
    let y = output(n, 0)?;
    let (pi, p) = ix.producer(g, input(n, 0)?)?;
    let x = output(p, 0)?;
    // Gemm → activation is left as it is: the CUDA provider's Gemm has no
    // epilogue (a FusedGemm step would fall back to the CPU there), and on
    // the CPU the in-place activation step after it costs nothing
    // measurable. FusedGemm files from onnxruntime still load.
    let conv = is_op(p, "Conv");
    if !conv
        || p.outputs.len() != 1
        || p.inputs.len() > 3
        || !ix.only_read_by(x, i)
        || n.outputs.len() != 1
    {
        return None;
    }
    // f32 weights, hence f32 X (FusedConv is f32 only).
    const_f32(g, input(p, 1))?;
    let mut attrs = p.attrs.clone();
    attrs.retain(|a| !a.name.starts_with("activation"));
    let (name, params) = act.to_attrs();
    attrs.push(Attr {
        name: "activation".into(),
        value: AttrValue::Str(name.as_bytes().to_vec()),
    });
    if !params.is_empty() {
        attrs.push(Attr {
            name: "activation_params".into(),
            value: AttrValue::Floats(params),
        });
    }
    let fused = Node {
        op_type: "FusedConv".into(),
        domain: "com.microsoft".into(),
        opset: 1,
        outputs: alloc::vec![Some(y)],
        attrs,
        ..p.clone()
    };
    let mut e = Edit::new(
        Pass::Activation,
        label(p, pi),
        alloc::format!(
            "{} '{}' fused into the Conv (FusedConv)",
            n.op_type,
            label(n, i)
        ),
    );
    e.set.push((pi, fused));
    e.remove.push(i);
    Some(e)
}

// ---------------------------------------------------------------------------
// dead

fn dead_nodes(g: &mut Graph, notes: &mut Vec<Rewrite>) {
    loop {
        let ix = Ix::new(g);
        let dead: Vec<bool> = g
            .nodes
            .iter()
            .map(|n| n.outputs.iter().flatten().all(|&t| ix.unused(t)))
            .collect();
        if !dead.iter().any(|&d| d) {
            return;
        }
        for (i, n) in g.nodes.iter().enumerate() {
            if dead.get(i).copied().unwrap_or(false) {
                notes.push(Rewrite {
                    pass: Pass::Dead,
                    node: label(n, i),
                    detail: alloc::format!("{} removed: nobody reads its outputs", n.op_type),
                });
            }
        }
        let mut dead = dead.iter();
        g.nodes.retain(|_| !dead.next().copied().unwrap_or(false));
    }
}

/// Drops the tensors no node, input or output names, renumbering the rest.
fn compact(g: &mut Graph, notes: &mut Vec<Rewrite>, freed: (usize, usize)) {
    let nt = g.tensors.len();
    let mut used = alloc::vec![false; nt];
    let ids = g
        .nodes
        .iter()
        .flat_map(|n| n.inputs.iter().chain(&n.outputs).flatten())
        .chain(&g.inputs)
        .chain(&g.outputs);
    for &t in ids {
        if let Some(u) = used.get_mut(t as usize) {
            *u = true;
        }
    }
    if used.iter().all(|&u| u) {
        return;
    }
    let (mut consts, mut bytes) = freed;
    let mut map: Vec<TensorId> = alloc::vec![TensorId::MAX; nt];
    let old = core::mem::take(&mut g.tensors);
    for (k, t) in old.into_iter().enumerate() {
        if used.get(k).copied().unwrap_or(false) {
            if let Some(m) = map.get_mut(k) {
                *m = g.tensors.len() as TensorId;
            }
            g.tensors.push(t);
        } else if let Some(c) = &t.value {
            consts = consts.saturating_add(1);
            bytes = bytes.saturating_add(c.byte_len());
        }
    }
    let remap = |t: &mut TensorId| {
        if let Some(&m) = map.get(*t as usize) {
            *t = m;
        }
    };
    for n in &mut g.nodes {
        n.inputs
            .iter_mut()
            .chain(n.outputs.iter_mut())
            .flatten()
            .for_each(remap);
    }
    g.inputs.iter_mut().for_each(remap);
    g.outputs.iter_mut().for_each(remap);
    if consts > 0 {
        notes.push(Rewrite {
            pass: Pass::Dead,
            node: String::new(),
            detail: alloc::format!("{consts} unused initializers dropped ({bytes} bytes)"),
        });
    }
}

#[cfg(test)]
mod tests {
    //! Each rewrite on hand-built graphs: where it fires, where it must
    //! not, and the same outputs as the graph run as built.
    use super::*;
    use crate::model::Model;
    use crate::{Session, SessionBuilder, TensorView};
    use alloc::vec;

    use crate::ops::testing::TestGraph as G;

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    /// Input feeds: name, shape, values.
    type Feeds = Vec<(String, Vec<usize>, Vec<f32>)>;

    impl G {
        fn rc(&mut self, shape: &[usize]) -> TensorId {
            let v = self.rand(shape.iter().product());
            self.cf(shape, &v)
        }
        /// BatchNormalization with constant, random parameters.
        fn bn(&mut self, x: TensorId, m: usize) -> TensorId {
            let s: Vec<f32> = self.rand(m).iter().map(|v| 1.0 + 0.5 * v).collect();
            let var: Vec<f32> = self.rand(m).iter().map(|v| 0.6 + 0.5 * v.abs()).collect();
            let (st, vt) = (self.cf(&[m], &s), self.cf(&[m], &var));
            let (bt, mt) = (self.rc(&[m]), self.rc(&[m]));
            self.node(
                "BatchNormalization",
                &[x, st, bt, mt, vt],
                vec![("epsilon", AttrValue::Float(1e-3))],
            )
        }
        fn model(mut self, outs: &[TensorId]) -> (Model, Feeds) {
            self.g.outputs = outs.to_vec();
            let feeds = core::mem::take(&mut self.feeds);
            let data = feeds
                .into_iter()
                .map(|(n, s)| {
                    let v = self.rand(s.iter().product());
                    (n, s, v)
                })
                .collect();
            let m = Model {
                graph: self.g,
                opsets: vec![(String::new(), 13)],
                ..Model::default()
            };
            (m, data)
        }
    }

    fn run_model(m: &Model, data: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<Vec<f32>> {
        let plan = SessionBuilder::new(m)
            .plan()
            .unwrap_or_else(|e| panic!("{}", m.explain(&e)));
        let mut arena = vec![0u8; plan.arena_bytes_unaligned()];
        let mut s = Session::new(m, &plan, &mut arena).unwrap();
        let feeds: Vec<(&str, TensorView<'_>)> = data
            .iter()
            .map(|(n, sh, v)| (n.as_str(), TensorView::new(sh, v).unwrap()))
            .collect();
        s.run(&feeds)
            .unwrap_or_else(|e| panic!("{}", m.explain(&e)));
        (0..m.graph.outputs.len())
            .map(|k| {
                let o = s.output(k).unwrap();
                (0..o.numel())
                    .map(|i| o.f64_at(i).unwrap() as f32)
                    .collect()
            })
            .collect()
    }

    /// Optimizes, checks outputs against the graph as built (`rtol`, plus
    /// `rtol`·max|y| absolute for values near zero), and returns the
    /// optimized model.
    fn check(b: G, outs: &[TensorId], rtol: f32) -> Model {
        let (m, data) = b.model(outs);
        let mut o = m.clone();
        o.rewrites = run(&mut o.graph);
        let (want, got) = (run_model(&m, &data), run_model(&o, &data));
        assert_eq!(
            m.output_names().collect::<Vec<_>>(),
            o.output_names().collect::<Vec<_>>()
        );
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(w.len(), g.len());
            let scale = w.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (a, b) in w.iter().zip(g) {
                assert!(
                    (a - b).abs() <= rtol * (a.abs() + 1e-2 * scale),
                    "{a} vs {b}: {:?}",
                    o.rewrites
                );
            }
        }
        o
    }

    fn ops(m: &Model) -> Vec<&str> {
        m.graph.nodes.iter().map(|n| n.op_type.as_str()).collect()
    }

    fn count(m: &Model, p: Pass) -> usize {
        m.rewrites.iter().filter(|r| r.pass == p).count()
    }

    #[test]
    fn conv_bn_relu_conv_bn_folds() {
        let mut b = G::new(7);
        let x = b.input("x", &[1, 3, 7, 7]);
        let (w, bias) = (b.rc(&[6, 3, 3, 3]), b.rc(&[6]));
        let c = b.node("Conv", &[x, w, bias], vec![("pads", ints(&[1, 1, 1, 1]))]);
        let h = b.bn(c, 6);
        let h = b.node("Relu", &[h], vec![]);
        // Depthwise (group 6), no bias.
        let w2 = b.rc(&[6, 1, 3, 3]);
        let c2 = b.node("Conv", &[h, w2], vec![("group", AttrValue::Int(6))]);
        let y = b.bn(c2, 6);
        let m = check(b, &[y], 1e-5);
        assert_eq!(ops(&m), ["FusedConv", "Conv"]);
        assert_eq!(count(&m, Pass::BatchNorm), 2);
        // The BN output (a graph output) keeps its name; old weights dropped.
        assert_eq!(m.output_names().next(), Some(y_name(y).as_str()));
        // Only the two folded weights and biases are left.
        assert_eq!(
            m.graph.tensors.iter().filter(|t| t.value.is_some()).count(),
            4
        );
    }

    fn y_name(t: TensorId) -> String {
        alloc::format!("t{t}")
    }

    #[test]
    fn activations_fuse_into_conv() {
        // Each activation after a Conv (and a Conv → BN → Relu6 chain):
        // one FusedConv with the outputs of the graph as built.
        type Case<'a> = (&'a str, i64, Vec<(&'a str, AttrValue)>, &'a str);
        let acts: Vec<Case> = vec![
            ("Relu", 13, vec![], "Relu"),
            (
                "LeakyRelu",
                13,
                vec![("alpha", AttrValue::Float(0.3))],
                "LeakyRelu",
            ),
            ("Sigmoid", 13, vec![], "Sigmoid"),
            ("Tanh", 13, vec![], "Tanh"),
            (
                "HardSigmoid",
                13,
                vec![("alpha", AttrValue::Float(0.25))],
                "HardSigmoid",
            ),
            ("HardSwish", 14, vec![], "HardSwish"),
            (
                "Clip",
                6,
                vec![
                    ("min", AttrValue::Float(-0.2)),
                    ("max", AttrValue::Float(0.3)),
                ],
                "Clip",
            ),
        ];
        for (op, opset, attrs, name) in acts {
            let mut b = G::new(7);
            let x = b.input("x", &[1, 3, 6, 6]);
            let (w, bias) = (b.rc(&[4, 3, 3, 3]), b.rc(&[4]));
            let c = b.node("Conv", &[x, w, bias], vec![("pads", ints(&[1, 1, 1, 1]))]);
            let y = b.node(op, &[c], attrs);
            if let Some(n) = b.g.nodes.last_mut() {
                n.opset = opset;
            }
            let m = check(b, &[y], 1e-5);
            assert_eq!(ops(&m), ["FusedConv"], "{op}");
            assert_eq!(m.graph.nodes[0].domain, "com.microsoft");
            assert!(matches!(m.graph.nodes[0].attr("activation"),
                Some(AttrValue::Str(s)) if s == name.as_bytes()));
            assert_eq!(count(&m, Pass::Activation), 1);
            // The activation's output (a graph output) keeps its name.
            assert_eq!(m.output_names().next(), Some(y_name(y).as_str()));
        }
        // Clip (opset 13) with constant bounds after Conv → BN; depthwise.
        let mut b = G::new(9);
        let x = b.input("x", &[1, 4, 7, 7]);
        let w = b.rc(&[4, 1, 3, 3]);
        let c = b.node("Conv", &[x, w], vec![("group", AttrValue::Int(4))]);
        let h = b.bn(c, 4);
        let (lo, hi) = (b.cf(&[], &[0.0]), b.cf(&[], &[0.5]));
        let y = b.node("Clip", &[h, lo, hi], vec![]);
        let m = check(b, &[y], 1e-5);
        assert_eq!(ops(&m), ["FusedConv"]);
        // Not fused: a Clip bound computed at run time, the Conv output also
        // read elsewhere, or a graph output.
        let mut b = G::new(9);
        let x = b.input("x", &[1, 2, 4, 4]);
        let hi = b.input("hi", &[]);
        let w = b.rc(&[2, 2, 1, 1]);
        let c = b.node("Conv", &[x, w], vec![]);
        let y = b.node("Clip", &[c, hi], vec![]);
        let m = check(b, &[y], 1e-6);
        assert_eq!(ops(&m), ["Conv", "Clip"]);
        let mut b = G::new(9);
        let x = b.input("x", &[1, 2, 4, 4]);
        let w = b.rc(&[2, 2, 1, 1]);
        let c = b.node("Conv", &[x, w], vec![]);
        let y = b.node("Relu", &[c], vec![]);
        let m = check(b, &[y, c], 1e-6);
        assert_eq!(ops(&m), ["Conv", "Relu"]);
        // Gemm → activation is not fused (see `activation`).
        let mut b = G::new(9);
        let x = b.input("x", &[3, 5]);
        let (w, c) = (b.rc(&[4, 5]), b.rc(&[4]));
        let h = b.node("Gemm", &[x, w, c], vec![("transB", AttrValue::Int(1))]);
        let y = b.node("Relu", &[h], vec![]);
        let m = check(b, &[y], 1e-6);
        assert_eq!(ops(&m), ["Gemm", "Relu"]);
    }

    #[test]
    fn fused_gemm_is_gemm_then_its_activation() {
        // onnxruntime's com.microsoft.FusedGemm (as in its optimized files)
        // against the Gemm → activation it stands for: the same bits.
        for (op, attrs, fattrs) in [
            (
                "LeakyRelu",
                vec![("alpha", AttrValue::Float(0.3))],
                vec![("activation_alpha", AttrValue::Float(0.3))],
            ),
            (
                "HardSigmoid",
                vec![("beta", AttrValue::Float(0.4))],
                vec![("activation_beta", AttrValue::Float(0.4))],
            ),
            ("Tanh", vec![], vec![]),
        ] {
            let mut b = G::new(9);
            let x = b.input("x", &[3, 5]);
            let (w, c) = (b.rc(&[4, 5]), b.rc(&[4]));
            let h = b.node("Gemm", &[x, w, c], vec![("transB", AttrValue::Int(1))]);
            let y = b.node(op, &[h], attrs);
            let (m, data) = b.model(&[y]);
            let want = run_model(&m, &data);
            let mut f = m.clone();
            let act = f.graph.nodes.remove(1);
            let g = &mut f.graph.nodes[0];
            g.op_type = "FusedGemm".into();
            g.domain = "com.microsoft".into();
            g.opset = 1;
            g.outputs = act.outputs;
            g.attrs.push(Attr {
                name: "activation".into(),
                value: AttrValue::Str(op.as_bytes().to_vec()),
            });
            for (name, value) in fattrs {
                g.attrs.push(Attr {
                    name: name.into(),
                    value,
                });
            }
            assert_eq!(run_model(&f, &data), want, "{op}");
        }
    }

    #[test]
    fn fused_conv_refuses_what_it_cannot_run() {
        for (act, params) in [("Gelu", vec![]), ("Clip", vec![1.0]), ("Relu", vec![2.0])] {
            let r = Act::from_attrs(act, &params);
            assert!(r.is_err(), "{act} {params:?}");
        }
        // Round trip of every activation's attributes.
        for a in [
            Act::Relu,
            Act::Clip(-1.0, 2.0),
            Act::LeakyRelu(0.1),
            Act::Sigmoid,
            Act::Tanh,
            Act::HardSigmoid(0.2, 0.5),
            Act::HardSwish,
        ] {
            let (n, p) = a.to_attrs();
            assert_eq!(Act::from_attrs(n, &p).ok(), Some(a));
        }
    }

    #[test]
    fn conv_transpose_bn_folds() {
        let mut b = G::new(7);
        let x = b.input("x", &[1, 4, 5, 5]);
        // C = 4, group 2, M/g = 3: M = 6.
        let w = b.rc(&[4, 3, 3, 3]);
        let c = b.node(
            "ConvTranspose",
            &[x, w],
            vec![("group", AttrValue::Int(2)), ("strides", ints(&[2, 2]))],
        );
        let y = b.bn(c, 6);
        let m = check(b, &[y], 1e-5);
        assert_eq!(ops(&m), ["ConvTranspose"]);
    }

    #[test]
    fn bn_is_kept_where_folding_would_be_wrong() {
        // Non-constant scale.
        let mut b = G::new(7);
        let x = b.input("x", &[1, 2, 4, 4]);
        let s = b.input("s", &[2]);
        let w = b.rc(&[2, 2, 1, 1]);
        let c = b.node("Conv", &[x, w], vec![]);
        let (bt, mt, vt) = (b.rc(&[2]), b.rc(&[2]), b.cf(&[2], &[1.0, 2.0]));
        let y = b.node("BatchNormalization", &[c, s, bt, mt, vt], vec![]);
        let m = check(b, &[y], 1e-6);
        assert_eq!(ops(&m), ["Conv", "BatchNormalization"]);
        // Conv output read twice.
        let mut b = G::new(7);
        let x = b.input("x", &[1, 2, 4, 4]);
        let w = b.rc(&[2, 2, 1, 1]);
        let c = b.node("Conv", &[x, w], vec![]);
        let y = b.bn(c, 2);
        let r = b.node("Relu", &[c], vec![]);
        let m = check(b, &[y, r], 1e-6);
        assert_eq!(ops(&m), ["Conv", "BatchNormalization", "Relu"]);
        // Conv output is a graph output.
        let mut b = G::new(7);
        let x = b.input("x", &[1, 2, 4, 4]);
        let w = b.rc(&[2, 2, 1, 1]);
        let c = b.node("Conv", &[x, w], vec![]);
        let y = b.bn(c, 2);
        let m = check(b, &[y, c], 1e-6);
        assert_eq!(ops(&m), ["Conv", "BatchNormalization"]);
        assert!(m.rewrites.is_empty(), "{:?}", m.rewrites);
    }

    #[test]
    fn bn_after_a_dequantized_weight_stays() {
        // Conv(x, DQ(w8)) → BN: the weight is computed, not a constant, and
        // the QDQ pass leaves the Conv float (x is not dequantized).
        let mut b = G::new(7);
        let x = b.input("x", &[1, 2, 4, 4]);
        let w8 = b.tensor(
            "w8",
            Some(Const::from_slice(&[2, 2, 1, 1], &[1i8, -3, 7, 100]).unwrap()),
        );
        let (s, z) = (
            b.cf(&[], &[0.02]),
            b.tensor("z", Some(Const::from_slice(&[], &[0i8]).unwrap())),
        );
        let w = b.node("DequantizeLinear", &[w8, s, z], vec![]);
        let c = b.node("Conv", &[x, w], vec![]);
        let y = b.bn(c, 2);
        let (mut m, data) = b.model(&[y]);
        let want = run_model(&m, &data);
        crate::optimize::run(&mut m);
        assert_eq!(ops(&m), ["DequantizeLinear", "Conv", "BatchNormalization"]);
        assert_eq!(count(&m, Pass::BatchNorm), 0);
        assert_eq!(run_model(&m, &data), want);
    }

    #[test]
    fn per_channel_add_and_mul_fold_into_conv() {
        let mut b = G::new(7);
        let x = b.input("x", &[1, 3, 5, 5]);
        let w = b.rc(&[4, 3, 3, 3]);
        let c = b.node("Conv", &[x, w], vec![]);
        let a = b.rc(&[1, 4, 1, 1]);
        let h = b.node("Add", &[a, c], vec![]);
        let mc = b.rc(&[4, 1, 1]);
        let h = b.node("Mul", &[h, mc], vec![]);
        let s = b.cf(&[], &[0.5]);
        let y = b.node("Add", &[h, s], vec![]);
        let m = check(b, &[y], 1e-5);
        assert_eq!(ops(&m), ["Conv"]);
        assert_eq!(count(&m, Pass::Bias), 3);
    }

    #[test]
    fn non_per_channel_operands_are_kept() {
        let mut b = G::new(7);
        let x = b.input("x", &[1, 2, 3, 3]);
        let w = b.rc(&[2, 2, 1, 1]);
        let c = b.node("Conv", &[x, w], vec![]);
        // Varies along W: not a bias.
        let a = b.rc(&[1, 1, 1, 3]);
        let h = b.node("Add", &[c, a], vec![]);
        let w2 = b.rc(&[2, 2, 1, 1]);
        let c2 = b.node("Conv", &[h, w2], vec![]);
        // A computed operand.
        let z = b.input("z", &[1, 2, 1, 1]);
        let h = b.node("Add", &[c2, z], vec![]);
        let w3 = b.rc(&[2, 2, 1, 1]);
        let c3 = b.node("Conv", &[h, w3], vec![]);
        // Rank 5: would change the output's rank.
        let a5 = b.rc(&[1, 1, 2, 1, 1]);
        let y = b.node("Mul", &[c3, a5], vec![]);
        let m = check(b, &[y], 1e-6);
        assert_eq!(ops(&m), ["Conv", "Add", "Conv", "Add", "Conv", "Mul"]);
    }

    #[test]
    fn gemm_and_matmul_fold_bias_and_scale() {
        let mut b = G::new(7);
        let x = b.input("x", &[3, 4]);
        let (w, cb) = (b.rc(&[5, 4]), b.rc(&[5]));
        let g1 = b.node(
            "Gemm",
            &[x, w, cb],
            vec![
                ("transB", AttrValue::Int(1)),
                ("beta", AttrValue::Float(0.5)),
            ],
        );
        let a = b.rc(&[1, 5]);
        let h = b.node("Add", &[g1, a], vec![]);
        let s = b.rc(&[5]);
        let h = b.node("Mul", &[h, s], vec![]);
        let w2 = b.rc(&[5, 2]);
        let mm = b.node("MatMul", &[h, w2], vec![]);
        let s2 = b.rc(&[2]);
        let y = b.node("Mul", &[s2, mm], vec![]);
        let m = check(b, &[y], 1e-5);
        assert_eq!(ops(&m), ["Gemm", "MatMul"]);
        assert_eq!(count(&m, Pass::Bias), 3);
    }

    #[test]
    fn matmul_add_becomes_gemm_when_a_is_2d() {
        let mut b = G::new(7);
        let x = b.input("x", &[3, 4]);
        let w = b.rc(&[4, 6]);
        let mm = b.node("MatMul", &[x, w], vec![]);
        let a = b.rc(&[6]);
        let h = b.node("Add", &[mm, a], vec![]);
        let r = b.node("Relu", &[h], vec![]);
        let w2 = b.rc(&[6, 2]);
        let mm2 = b.node("MatMul", &[r, w2], vec![]);
        let a2 = b.rc(&[1, 2]);
        let y = b.node("Add", &[a2, mm2], vec![]);
        let m = check(b, &[y], 1e-5);
        assert_eq!(ops(&m), ["Gemm", "Relu", "Gemm"]);
        assert_eq!(count(&m, Pass::Gemm), 2);
        // A of rank 3, an (M, N) operand, a second reader: all kept.
        let mut b = G::new(7);
        let x = b.input("x", &[2, 3, 4]);
        let w = b.rc(&[4, 6]);
        let mm = b.node("MatMul", &[x, w], vec![]);
        let a = b.rc(&[6]);
        let y1 = b.node("Add", &[mm, a], vec![]);
        let x2 = b.input("x2", &[3, 4]);
        let mm2 = b.node("MatMul", &[x2, w], vec![]);
        let a2 = b.rc(&[3, 6]);
        let y2 = b.node("Add", &[mm2, a2], vec![]);
        let mm3 = b.node("MatMul", &[x2, w], vec![]);
        let y3 = b.node("Add", &[mm3, a], vec![]);
        let m = check(b, &[y1, y2, y3, mm3], 1e-6);
        assert_eq!(ops(&m), ["MatMul", "Add", "MatMul", "Add", "MatMul", "Add"]);
    }

    /// `0.5 · x · (1 + erf(x/√2))` in the three orders PyTorch exports,
    /// with Div by √2 or Mul by 1/√2.
    fn gelu_graph(order: usize, div: bool, seed: u64) -> (G, TensorId) {
        let mut b = G::new(seed);
        let x = b.input("x", &[2, 3, 40]);
        let x = b.node("Relu", &[x], vec![]);
        let x = b.node("Neg", &[x], vec![]);
        let s = if div {
            let c = b.cf(&[], &[core::f32::consts::SQRT_2]);
            b.node("Div", &[x, c], vec![])
        } else {
            let c = b.cf(&[1], &[core::f32::consts::FRAC_1_SQRT_2]);
            b.node("Mul", &[c, x], vec![])
        };
        let e = b.node("Erf", &[s], vec![]);
        let one = b.cf(&[], &[1.0]);
        let a = b.node("Add", &[one, e], vec![]);
        let half = b.cf(&[], &[0.5]);
        let y = match order {
            0 => {
                let m = b.node("Mul", &[x, a], vec![]);
                b.node("Mul", &[m, half], vec![])
            }
            1 => {
                let m = b.node("Mul", &[a, half], vec![]);
                b.node("Mul", &[x, m], vec![])
            }
            _ => {
                let h = b.node("Mul", &[half, x], vec![]);
                b.node("Mul", &[a, h], vec![])
            }
        };
        (b, y)
    }

    #[test]
    fn erf_gelu_becomes_gelu() {
        for order in 0..3 {
            for div in [true, false] {
                let (mut b, y) = gelu_graph(order, div, 7);
                // Inputs of both signs (Relu then Neg would make them ≤ 0).
                b.g.nodes.remove(0);
                let x = b.g.inputs[0];
                b.g.nodes[0].inputs[0] = Some(x);
                let m = check(b, &[y], 1e-5);
                assert_eq!(ops(&m), ["Neg", "Gelu"], "order {order}, div {div}");
                assert_eq!(count(&m, Pass::Gelu), 1);
                assert_eq!(m.output_names().next(), Some(y_name(y).as_str()));
            }
        }
        // Not GELU: a wrong constant, an intermediate read elsewhere (also
        // a graph output), a constant that broadcasts x to a higher rank.
        let (mut b, y) = gelu_graph(0, true, 7);
        let c = b.g.nodes[2].inputs[1].unwrap() as usize;
        b.g.tensors[c].value = Some(Const::from_slice(&[], &[1.5f32]).unwrap());
        let m = check(b, &[y], 1e-5);
        assert_eq!(count(&m, Pass::Gelu), 0);
        let (b, y) = gelu_graph(1, false, 7);
        let e = b.g.nodes[3].outputs[0].unwrap();
        let m = check(b, &[y, e], 1e-5);
        assert_eq!(count(&m, Pass::Gelu), 0);
        let (mut b, y) = gelu_graph(2, true, 7);
        let half = b.g.nodes[5].inputs[0].unwrap() as usize;
        b.g.tensors[half].value = Some(Const::from_slice(&[1, 1, 1, 1], &[0.5f32]).unwrap());
        let m = check(b, &[y], 1e-5);
        assert_eq!(count(&m, Pass::Gelu), 0);
        assert_eq!(ops(&m).len(), 7);
    }

    #[test]
    fn transposes_collapse() {
        let mut b = G::new(7);
        let x = b.input("x", &[2, 3, 4]);
        let t1 = b.node("Transpose", &[x], vec![("perm", ints(&[0, 2, 1]))]);
        let t2 = b.node("Transpose", &[t1], vec![("perm", ints(&[0, 2, 1]))]);
        let r = b.node("Relu", &[t2], vec![]);
        let t3 = b.node("Transpose", &[r], vec![("perm", ints(&[1, 0, 2]))]);
        let t4 = b.node("Transpose", &[t3], vec![("perm", ints(&[2, 0, 1]))]);
        let t5 = b.node("Transpose", &[t4], vec![("perm", ints(&[0, 1, 2]))]);
        let y = b.node("Neg", &[t5], vec![]);
        let m = check(b, &[y], 0.0);
        assert_eq!(ops(&m), ["Relu", "Transpose", "Neg"]);
        // perm of t4 ∘ t3: [p3[2], p3[0], p3[1]] = [2, 1, 0].
        assert_eq!(
            m.graph.nodes[1].attr("perm").map(|a| match a {
                AttrValue::Ints(v) => v.clone(),
                _ => vec![],
            }),
            Some(vec![2, 1, 0])
        );
    }

    #[test]
    fn identity_and_dropout_are_removed_but_outputs_keep_their_names() {
        let mut b = G::new(7);
        let x = b.input("x", &[2, 3]);
        let i1 = b.node("Identity", &[x], vec![]);
        let r = b.node("Relu", &[i1], vec![]);
        let d = b.node_n("Dropout", &[Some(r)], 2, vec![])[0];
        let n = b.node("Neg", &[d], vec![]);
        // Graph output made by an Identity: Neg writes it.
        let y = b.node("Identity", &[n], vec![]);
        // Identity of a graph input to a graph output: kept.
        let y2 = b.node("Identity", &[x], vec![]);
        // Dropout whose mask is read: kept.
        let dm = b.node_n("Dropout", &[Some(r)], 2, vec![]);
        let m = check(b, &[y, y2, dm[0], dm[1]], 0.0);
        assert_eq!(ops(&m), ["Relu", "Neg", "Identity", "Dropout"]);
        assert_eq!(count(&m, Pass::Identity), 3);
        assert_eq!(m.graph.nodes[1].outputs, vec![Some(m.graph.outputs[0])]);
        assert_eq!(m.graph.tensors[m.graph.outputs[0] as usize].name, y_name(y));
    }

    #[test]
    fn dropout_in_training_mode_is_kept() {
        let mut b = G::new(7);
        let x = b.input("x", &[2, 3]);
        let r = b.tensor("r", Some(Const::from_slice(&[], &[0.5f32]).unwrap()));
        let tm = b.tensor("tm", Some(Const::from_slice(&[], &[1u8]).unwrap()));
        b.g.tensors[tm as usize].value.as_mut().unwrap().dtype = DType::Bool;
        let d = b.node_n("Dropout", &[Some(x), Some(r), Some(tm)], 1, vec![])[0];
        let y = b.node("Neg", &[d], vec![]);
        let (mut m, _) = b.model(&[y]);
        m.rewrites = run(&mut m.graph);
        assert_eq!(ops(&m), ["Dropout", "Neg"]);
    }

    #[test]
    fn dead_nodes_and_their_initializers_go() {
        let mut b = G::new(7);
        let x = b.input("x", &[2, 3]);
        let w = b.rc(&[3, 3]);
        let unused = b.node("MatMul", &[x, w], vec![]);
        let _ = b.node("Relu", &[unused], vec![]);
        let big = b.rc(&[64]);
        let _ = big;
        let y = b.node("Neg", &[x], vec![]);
        let m = check(b, &[y], 0.0);
        assert_eq!(ops(&m), ["Neg"]);
        assert_eq!(count(&m, Pass::Dead), 3, "{:?}", m.rewrites);
        assert_eq!(m.graph.tensors.len(), 2);
    }
}
