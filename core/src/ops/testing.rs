//! A tiny runner for per-op unit tests: build a node, run it on constant
//! inputs through the same prepare + kernel path as sessions.

use alloc::string::String;
use alloc::vec::Vec;

use crate::model::{Attr, AttrValue, Const, Dim, Graph, Node, TensorInfo};
use crate::{DType, Element, Result, TensorId};

/// `(name, value)` pairs as node attributes.
pub fn attrs(v: Vec<(&str, AttrValue)>) -> Vec<Attr> {
    v.into_iter()
        .map(|(n, v)| Attr {
            name: n.into(),
            value: v,
        })
        .collect()
}

/// A graph built by hand, for the tests of the graph rewrites
/// (`optimize`, `optimize::float`): tensors, seeded random constants,
/// f32 inputs (recorded in `feeds`) and nodes with generated names.
pub struct TestGraph {
    pub g: Graph,
    pub seed: u64,
    /// Graph inputs added by [`TestGraph::input`]: name, shape.
    pub feeds: Vec<(String, Vec<usize>)>,
}

impl TestGraph {
    pub fn new(seed: u64) -> Self {
        TestGraph {
            g: Graph::default(),
            seed,
            feeds: Vec::new(),
        }
    }
    /// `n` values in [-1, 1), a new seed each call.
    pub fn rand(&mut self, n: usize) -> Vec<f32> {
        self.seed += 1;
        rnd(n, self.seed)
    }
    pub fn tensor(&mut self, name: &str, value: Option<Const>) -> TensorId {
        self.g.tensors.push(TensorInfo {
            name: name.into(),
            dtype: value.as_ref().map(|c| c.dtype),
            shape: value
                .as_ref()
                .map(|c| c.shape.iter().map(|&d| Dim::Fixed(d)).collect()),
            value,
            onnx_type: 0,
        });
        (self.g.tensors.len() - 1) as TensorId
    }
    /// A graph input of f32 and `shape`.
    pub fn input(&mut self, name: &str, shape: &[usize]) -> TensorId {
        let t = self.tensor(name, None);
        self.g.tensors[t as usize].dtype = Some(DType::F32);
        self.g.tensors[t as usize].shape = Some(shape.iter().map(|&d| Dim::Fixed(d)).collect());
        self.g.inputs.push(t);
        self.feeds.push((name.into(), shape.to_vec()));
        t
    }
    /// A constant.
    pub fn c<T: Element>(&mut self, shape: &[usize], v: &[T]) -> TensorId {
        let n = alloc::format!("c{}", self.g.tensors.len());
        self.tensor(&n, Some(Const::from_slice(shape, v).unwrap()))
    }
    /// An f32 constant (float literals stay f32).
    pub fn cf(&mut self, shape: &[usize], v: &[f32]) -> TensorId {
        self.c(shape, v)
    }
    /// A node with optional inputs and `n_out` new outputs.
    pub fn node_n(
        &mut self,
        op: &str,
        ins: &[Option<TensorId>],
        n_out: usize,
        attrs: Vec<(&str, AttrValue)>,
    ) -> Vec<TensorId> {
        let outs: Vec<TensorId> = (0..n_out)
            .map(|_| self.tensor(&alloc::format!("t{}", self.g.tensors.len()), None))
            .collect();
        self.g.nodes.push(Node {
            name: alloc::format!("n{}", self.g.nodes.len()),
            op_type: op.into(),
            domain: String::new(),
            opset: 13,
            inputs: ins.to_vec(),
            outputs: outs.iter().map(|&o| Some(o)).collect(),
            attrs: self::attrs(attrs),
        });
        outs
    }
    /// A node with optional inputs and one output.
    pub fn node_opt(
        &mut self,
        op: &str,
        ins: &[Option<TensorId>],
        attrs: Vec<(&str, AttrValue)>,
    ) -> TensorId {
        self.node_n(op, ins, 1, attrs)[0]
    }
    /// A node with one output.
    pub fn node(&mut self, op: &str, ins: &[TensorId], attrs: Vec<(&str, AttrValue)>) -> TensorId {
        let ins: Vec<Option<TensorId>> = ins.iter().map(|&t| Some(t)).collect();
        self.node_opt(op, &ins, attrs)
    }
}

/// A node of `op_type` (default domain) with `n_in` inputs, `n_out` outputs.
pub fn node(op_type: &str, n_in: usize, n_out: usize, attrs: Vec<(&str, AttrValue)>) -> Node {
    Node {
        name: String::from("test"),
        op_type: op_type.into(),
        domain: String::new(),
        opset: 0,
        inputs: (0..n_in as u32).map(Some).collect(),
        outputs: (100..100 + n_out as u32).map(Some).collect(),
        attrs: self::attrs(attrs),
    }
}

/// A small f32 model at opset 13: x[2,3] → Relu → a → Neg → b → Reshape
/// → c[6] → Sigmoid → y (with a Reshape alias and in-place steps); returns
/// the model and the ids `[x, a, b, shape, c, y]`.
pub fn chain_model() -> (crate::Model, [TensorId; 6]) {
    let mut t = TestGraph::new(1);
    let x = t.input("x", &[2, 3]);
    let a = t.node("Relu", &[x], alloc::vec![]);
    let b = t.node("Neg", &[a], alloc::vec![]);
    let shape = t.c(&[1], &[6i64]);
    let c = t.node("Reshape", &[b, shape], alloc::vec![]);
    let y = t.node("Sigmoid", &[c], Vec::<(&str, AttrValue)>::new());
    t.g.outputs = alloc::vec![y];
    let m = crate::Model {
        graph: t.g,
        opsets: alloc::vec![(String::new(), 13)],
        ..crate::Model::default()
    };
    (m, [x, a, b, shape, c, y])
}

/// Runs `op_type` at `opset` on `inputs` (None = omitted input).
pub fn run(
    op_type: &str,
    opset: i64,
    attrs: Vec<(&str, AttrValue)>,
    inputs: &[Option<Const>],
    n_out: usize,
) -> Result<Vec<Const>> {
    let n = node(op_type, inputs.len(), n_out, attrs);
    let refs: Vec<Option<&Const>> = inputs.iter().map(|c| c.as_ref()).collect();
    crate::plan::eval_const(&n, opset, &refs)
}

/// Runs `op_type` of `domain` at `opset` on `inputs` (None = omitted input).
pub fn run_in(
    domain: &str,
    op_type: &str,
    opset: i64,
    attrs: Vec<(&str, AttrValue)>,
    inputs: &[Option<Const>],
    n_out: usize,
) -> Result<Vec<Const>> {
    let mut n = node(op_type, inputs.len(), n_out, attrs);
    n.domain = domain.into();
    let refs: Vec<Option<&Const>> = inputs.iter().map(|c| c.as_ref()).collect();
    crate::plan::eval_const(&n, opset, &refs)
}

/// A constant of typed values.
pub fn t<T: Element>(shape: &[usize], v: &[T]) -> Option<Const> {
    Some(Const::from_slice(shape, v).unwrap())
}

/// Typed values of a result.
pub fn vals<T: Element>(c: &Const) -> Vec<T> {
    c.view().as_slice::<T>().unwrap().to_vec()
}

/// Asserts two float slices agree within ONNX tolerance (rtol 1e-3, atol 1e-7)
/// — or a looser `atol` given; with `fast-math`, within the tolerance its
/// approximations meet ([`crate::math::APPROX_RTOL`], `APPROX_ATOL`).
pub fn assert_close(got: &[f32], want: &[f32], atol: f32) {
    assert_eq!(got.len(), want.len(), "length");
    let (rtol, atol) = if crate::math::APPROXIMATE {
        (
            crate::math::APPROX_RTOL as f32,
            atol.max(crate::math::APPROX_ATOL as f32),
        )
    } else {
        (1e-3, atol.max(1e-7))
    };
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = atol + rtol * w.abs();
        assert!(
            (g - w).abs() <= tol || (g.is_nan() && w.is_nan()),
            "element {i}: got {g}, want {w}"
        );
    }
}

/// `n` pseudo-random values uniform in [-1, 1) (an LCG: deterministic).
pub fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let step = |s: u64| {
        s.wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
    };
    let mut s = step(seed);
    (0..n)
        .map(|_| {
            s = step(s);
            ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Runs `op_type` on `inputs` (shape, f32 values) as f32 and as f16, bf16
/// and f64 (the values first rounded to f16 so all types see the same
/// numbers) and checks the narrow results are the f32 result rounded once —
/// exactly, since the narrow kernels accumulate in f32 — and the f64 result
/// agrees within `f64_rtol`. Returns the f32 output.
pub fn float_types_agree(
    op_type: &str,
    opset: i64,
    attrs: Vec<(&str, AttrValue)>,
    inputs: &[(&[usize], &[f32])],
    f64_rtol: f64,
) -> Vec<f32> {
    use half::{bf16, f16};
    let exact: Vec<Vec<f32>> = inputs
        .iter()
        .map(|(_, v)| v.iter().map(|&x| f16::from_f32(x).to_f32()).collect())
        .collect();
    type MakeConst<'a> = &'a dyn Fn(&[f32], &[usize]) -> Option<Const>;
    let mk = |conv: MakeConst<'_>| -> Vec<Option<Const>> {
        inputs
            .iter()
            .zip(&exact)
            .map(|((s, _), v)| conv(v, s))
            .collect()
    };
    let go = |ins: Vec<Option<Const>>| run(op_type, opset, attrs.clone(), &ins, 1).unwrap();
    let y32 = go(mk(&|v, s| t(s, v)));
    let want = vals::<f32>(&y32[0]);
    let y16 = go(mk(&|v, s| {
        t(s, &v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>())
    }));
    assert_eq!(y16[0].shape, y32[0].shape, "{op_type} f16 shape");
    for (i, (g, w)) in vals::<f16>(&y16[0]).iter().zip(&want).enumerate() {
        let w16 = f16::from_f32(*w);
        assert!(
            g.to_bits() == w16.to_bits() || (g.is_nan() && w16.is_nan()),
            "{op_type} f16 element {i}: got {g}, want {w16} (f32 {w})"
        );
    }
    // bf16 sees the values rounded to bf16 (f16 values may not be exact).
    let yb = go(mk(&|v, s| {
        t(s, &v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>())
    }));
    let bexact: Vec<Option<Const>> = inputs
        .iter()
        .zip(&exact)
        .map(|((s, _), v)| {
            t(
                s,
                &v.iter()
                    .map(|&x| bf16::from_f32(x).to_f32())
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let wantb = vals::<f32>(&go(bexact)[0]);
    for (i, (g, w)) in vals::<bf16>(&yb[0]).iter().zip(&wantb).enumerate() {
        assert_eq!(
            g.to_bits(),
            bf16::from_f32(*w).to_bits(),
            "{op_type} bf16 element {i}: got {g}, want {w}"
        );
    }
    let y64 = go(mk(&|v, s| {
        t(s, &v.iter().map(|&x| x as f64).collect::<Vec<_>>())
    }));
    for (i, (g, w)) in vals::<f64>(&y64[0]).iter().zip(&want).enumerate() {
        let w = *w as f64;
        assert!(
            (g - w).abs() <= f64_rtol * w.abs() + 1e-6,
            "{op_type} f64 element {i}: got {g}, want {w}"
        );
    }
    want
}
