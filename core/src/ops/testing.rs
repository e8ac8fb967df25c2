//! A tiny runner for per-op unit tests: build a node, run it on constant
//! inputs through the same prepare + kernel path as sessions.

use alloc::string::String;
use alloc::vec::Vec;

use crate::model::{Attr, AttrValue, Const, Node};
use crate::{Element, Result};

/// A node of `op_type` (default domain) with `n_in` inputs, `n_out` outputs.
pub fn node(op_type: &str, n_in: usize, n_out: usize, attrs: Vec<(&str, AttrValue)>) -> Node {
    Node {
        name: String::from("test"),
        op_type: op_type.into(),
        domain: String::new(),
        opset: 0,
        inputs: (0..n_in as u32).map(Some).collect(),
        outputs: (100..100 + n_out as u32).map(Some).collect(),
        attrs: attrs
            .into_iter()
            .map(|(n, v)| Attr {
                name: n.into(),
                value: v,
            })
            .collect(),
    }
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
/// — or a looser `atol` given.
pub fn assert_close(got: &[f32], want: &[f32], atol: f32) {
    assert_eq!(got.len(), want.len(), "length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = atol.max(1e-7) + 1e-3 * w.abs();
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
