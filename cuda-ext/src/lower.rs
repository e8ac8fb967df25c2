//! Lowering: which plan steps the GPU runs, and how.
//!
//! [`lower`] turns one step of a [`Plan`] into a [`GpuOp`]: kernel choice,
//! sizes, attributes, and operands as arena offsets or constant tensors.
//! It touches no GPU, so what the provider claims (and why not) is decided
//! and tested on any machine; [`crate::CudaExecutor`] resolves the operands
//! to device addresses and launches.
//!
//! A step is claimed only when every input and output is f32 (Concat,
//! Transpose: any 4-byte type), the op's attributes are ones the kernel
//! implements, and every shape is known at build time. Anything else runs
//! on the CPU kernels of mote-core, with copies at the boundary.

use mote_core::model::{AttrValue, Model, Node};
use mote_core::provider::{Place, StepInfo};
use mote_core::{DType, Plan, TensorId};

/// Where a kernel operand lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    /// Byte offset in the (mirrored) arena.
    Arena(usize),
    /// A constant tensor, uploaded once when the executor is built.
    Const(TensorId),
}

/// Activation applied by a kernel's epilogue (`act` in kernels.cu).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Act {
    /// Code of the activation (see `act()` in kernels.cu).
    pub op: i32,
    /// First parameter (Clip min, LeakyRelu alpha, ...).
    pub a: f32,
    /// Second parameter (Clip max, HardSigmoid beta).
    pub b: f32,
}

impl Act {
    /// No activation.
    pub const NONE: Act = Act {
        op: 0,
        a: 0.0,
        b: 0.0,
    };
}

/// 2-D window geometry shared by Conv and pooling (1-D ops have H = 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub h: i32,
    pub w: i32,
    pub oh: i32,
    pub ow: i32,
    pub kh: i32,
    pub kw: i32,
    pub sh: i32,
    pub sw: i32,
    pub ph: i32,
    pub pw: i32,
    pub dh: i32,
    pub dw: i32,
}

/// One step as the GPU runs it.
#[derive(Clone, Debug, PartialEq)]
pub enum GpuOp {
    /// `y = act(x)` element-wise.
    Unary {
        x: Operand,
        y: Operand,
        n: i64,
        act: Act,
    },
    /// Broadcasting binary op; `meta` is `None` when both inputs have the
    /// output's shape.
    Binary {
        a: Operand,
        b: Operand,
        y: Operand,
        n: i64,
        op: i32,
        meta: Option<Vec<i64>>,
    },
    /// `y[batch] = alpha · op(a) · op(b) (+ beta · c)` through cuBLAS,
    /// row-major `m × k` by `k × n`; `c` is broadcast-copied into `y` first
    /// (its `bcast_copy` meta alongside).
    Gemm {
        a: Operand,
        b: Operand,
        y: Operand,
        c: Option<(Operand, Vec<i64>)>,
        m: i64,
        n: i64,
        k: i64,
        trans_a: bool,
        trans_b: bool,
        alpha: f32,
        beta: f32,
        batch: i64,
        stride_a: i64,
        stride_b: i64,
    },
    /// Convolution: im2col + cuBLAS per group (batched over images), or
    /// the direct depthwise kernel when each group has one input channel.
    Conv {
        x: Operand,
        w: Operand,
        bias: Option<Operand>,
        y: Operand,
        n: i64,
        c: i64,
        m: i64,
        group: i64,
        win: Window,
        act: Act,
    },
    /// MaxPool / AveragePool.
    Pool {
        x: Operand,
        y: Operand,
        n: i64,
        c: i64,
        win: Window,
        is_max: bool,
        count_pad: bool,
    },
    /// Mean or max of each row (GlobalAveragePool, GlobalMaxPool).
    RowReduce {
        x: Operand,
        y: Operand,
        rows: i64,
        len: i64,
        is_max: bool,
    },
    /// Softmax / LogSoftmax over the middle axis of `[outer, axis, inner]`.
    Softmax {
        x: Operand,
        y: Operand,
        outer: i64,
        axis: i64,
        inner: i64,
        log: bool,
    },
    /// `y = x · scale[c] + shift[c]` (BatchNormalization, folded on the host).
    ScaleShift {
        x: Operand,
        y: Operand,
        scale: Vec<f32>,
        shift: Vec<f32>,
        n: i64,
        channels: i64,
        inner: i64,
    },
    /// Concat: each piece `(x, outer, inner_in, offset)` into rows of `inner_out`.
    Concat {
        y: Operand,
        pieces: Vec<(Operand, i64, i64, i64)>,
        inner_out: i64,
    },
    /// Transpose of 4-byte elements; `meta` = rank, out dims, in strides.
    Transpose {
        x: Operand,
        y: Operand,
        n: i64,
        meta: Vec<i64>,
    },
}

/// dtype, shape and operand of tensor `id`.
fn tensor<'p>(
    model: &'p Model,
    plan: &'p Plan,
    id: TensorId,
) -> Option<(DType, &'p [usize], Operand)> {
    let (dt, shape, place) = plan.place(model, id)?;
    let op = match place {
        Place::Arena { offset, .. } => Operand::Arena(offset),
        Place::Const(_) => Operand::Const(id),
    };
    Some((dt, shape, op))
}

fn input(
    model: &Model,
    plan: &Plan,
    st: &StepInfo<'_>,
    i: usize,
) -> Option<(DType, Vec<usize>, Operand)> {
    let id = (*st.inputs.get(i)?)?;
    let (dt, s, o) = tensor(model, plan, id)?;
    Some((dt, s.to_vec(), o))
}

fn output(
    model: &Model,
    plan: &Plan,
    st: &StepInfo<'_>,
    i: usize,
) -> Option<(DType, Vec<usize>, Operand)> {
    let id = (*st.outputs.get(i)?)?;
    let (dt, s, o) = tensor(model, plan, id)?;
    // Outputs are written: they must be in the arena.
    matches!(o, Operand::Arena(_)).then_some((dt, s.to_vec(), o))
}

fn numel(s: &[usize]) -> Option<i64> {
    s.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|n| i64::try_from(n).ok())
}

fn int(node: &Node, name: &str, default: i64) -> Option<i64> {
    match node.attr(name) {
        None => Some(default),
        Some(AttrValue::Int(v)) => Some(*v),
        Some(_) => None,
    }
}

fn float(node: &Node, name: &str, default: f32) -> Option<f32> {
    match node.attr(name) {
        None => Some(default),
        Some(AttrValue::Float(v)) => Some(*v),
        Some(_) => None,
    }
}

fn ints(node: &Node, name: &str) -> Option<Option<Vec<i64>>> {
    match node.attr(name) {
        None => Some(None),
        Some(AttrValue::Ints(v)) => Some(Some(v.clone())),
        Some(_) => None,
    }
}

fn string(node: &Node, name: &str) -> Option<Vec<u8>> {
    match node.attr(name) {
        None => Some(Vec::new()),
        Some(AttrValue::Str(v)) => Some(v.clone()),
        Some(_) => None,
    }
}

/// A scalar f32 constant input (Clip min/max), or `default` when omitted.
fn const_scalar(
    model: &Model,
    plan: &Plan,
    st: &StepInfo<'_>,
    i: usize,
    default: f32,
) -> Option<f32> {
    let Some(Some(id)) = st.inputs.get(i) else {
        return Some(default);
    };
    match plan.place(model, *id)? {
        (DType::F32, _, Place::Const(v)) => {
            let b = v.bytes();
            (b.len() == 4).then(|| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        _ => None,
    }
}

/// Right-aligned broadcast strides of `shape` against `out` (0 on
/// broadcast axes), or `None` if it does not broadcast.
fn bcast_strides(shape: &[usize], out: &[usize]) -> Option<Vec<i64>> {
    if shape.len() > out.len() {
        return None;
    }
    let pad = out.len() - shape.len();
    let mut strides = vec![0i64; out.len()];
    let mut acc = 1i64;
    for d in (0..out.len()).rev() {
        if d < pad {
            continue;
        }
        let s = shape[d - pad];
        if s == out[d] && s != 1 {
            strides[d] = acc;
        } else if s != 1 {
            return None;
        }
        acc = acc.checked_mul(i64::try_from(s).ok()?)?;
    }
    Some(strides)
}

/// `binary`/`bcast_copy` meta: rank, out dims, a strides, b strides.
fn bcast_meta(out: &[usize], a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let mut m = vec![i64::try_from(out.len()).ok()?];
    for &d in out {
        m.push(i64::try_from(d).ok()?);
    }
    m.extend_from_slice(a);
    m.extend_from_slice(b);
    Some(m)
}

/// The epilogue of a `FusedConv`: Relu or Clip (what the GPU conv epilogue
/// takes); `None` (CPU) for the others.
fn fused_conv_act(node: &Node) -> Option<Act> {
    let params: &[f32] = match node.attr("activation_params") {
        None => &[],
        Some(AttrValue::Floats(v)) => v,
        Some(_) => return None,
    };
    match (string(node, "activation")?.as_slice(), params) {
        (b"Relu", []) => Some(Act {
            op: 1,
            a: 0.0,
            b: 0.0,
        }),
        (b"Clip", &[lo, hi]) => Some(Act {
            op: 4,
            a: lo,
            b: hi,
        }),
        _ => None,
    }
}

fn unary_code(node: &Node) -> Option<Act> {
    let (op, a, b) = match node.op_type.as_str() {
        "Relu" => (1, 0.0, 0.0),
        "Sigmoid" => (2, 0.0, 0.0),
        "Tanh" => (3, 0.0, 0.0),
        "LeakyRelu" => (5, float(node, "alpha", 0.01)?, 0.0),
        "HardSigmoid" => (6, float(node, "alpha", 0.2)?, float(node, "beta", 0.5)?),
        "HardSwish" => (7, 0.0, 0.0),
        "Exp" => (8, 0.0, 0.0),
        "Neg" => (9, 0.0, 0.0),
        "Abs" => (10, 0.0, 0.0),
        "Sqrt" => (11, 0.0, 0.0),
        "Erf" => (12, 0.0, 0.0),
        "Elu" => (13, float(node, "alpha", 1.0)?, 0.0),
        "Softplus" => (14, 0.0, 0.0),
        "Gelu" => {
            if !string(node, "approximate")?.is_empty() && string(node, "approximate")? != b"none" {
                return None;
            }
            (15, 0.0, 0.0)
        }
        "Reciprocal" => (16, 0.0, 0.0),
        "Log" => (17, 0.0, 0.0),
        "Floor" => (18, 0.0, 0.0),
        "Ceil" => (19, 0.0, 0.0),
        _ => return None,
    };
    Some(Act { op, a, b })
}

/// Window geometry of a Conv / pool node with input `[N, C, spatial..]`
/// and output `[N, M, out spatial..]` (1-D or 2-D).
fn window(node: &Node, x: &[usize], y: &[usize], kernel: &[usize]) -> Option<Window> {
    let sp = x.len().checked_sub(2)?;
    if !(1..=2).contains(&sp) || y.len() != x.len() || kernel.len() != sp {
        return None;
    }
    let strides = ints(node, "strides")?.unwrap_or_else(|| vec![1; sp]);
    let dil = ints(node, "dilations")?.unwrap_or_else(|| vec![1; sp]);
    let auto = string(node, "auto_pad")?;
    if strides.len() != sp || dil.len() != sp {
        return None;
    }
    let mut begin = vec![0i64; sp];
    match auto.as_slice() {
        b"" | b"NOTSET" => {
            if let Some(p) = ints(node, "pads")? {
                if p.len() != 2 * sp {
                    return None;
                }
                begin.copy_from_slice(&p[..sp]);
            }
        }
        b"VALID" => {}
        b"SAME_UPPER" | b"SAME_LOWER" => {
            for d in 0..sp {
                let (i, o, k) = (x[2 + d] as i64, y[2 + d] as i64, kernel[d] as i64);
                let total = ((o - 1) * strides[d] + (k - 1) * dil[d] + 1 - i).max(0);
                begin[d] = if auto == b"SAME_UPPER" {
                    total / 2
                } else {
                    total - total / 2
                };
            }
        }
        _ => return None,
    }
    let g = |v: &[usize], d: usize| -> Option<i32> { i32::try_from(*v.get(2 + d)?).ok() };
    let (h, oh, kh, sh, ph, dh) = if sp == 2 {
        (
            g(x, 0)?,
            g(y, 0)?,
            i32::try_from(kernel[0]).ok()?,
            i32::try_from(strides[0]).ok()?,
            i32::try_from(begin[0]).ok()?,
            i32::try_from(dil[0]).ok()?,
        )
    } else {
        (1, 1, 1, 1, 0, 1)
    };
    let l = sp - 1;
    Some(Window {
        h,
        w: g(x, l)?,
        oh,
        ow: g(y, l)?,
        kh,
        kw: i32::try_from(kernel[l]).ok()?,
        sh,
        sw: i32::try_from(strides[l]).ok()?,
        ph,
        pw: i32::try_from(begin[l]).ok()?,
        dh,
        dw: i32::try_from(dil[l]).ok()?,
    })
}

/// Largest element count a kernel indexes in 32 bits (see kernels.cu):
/// 2^30, so that a grid-stride step (at most 2^29) cannot overflow `int`.
const MAX_ELEMS: usize = 1 << 30;
/// Most images a per-image kernel launches (grid y).
const MAX_IMAGES: i64 = 65_535;

/// How the GPU runs step `st`, or `None` when it does not (the CPU does).
pub fn lower(model: &Model, plan: &Plan, st: &StepInfo<'_>) -> Option<GpuOp> {
    // Every tensor the kernels index must fit 32-bit arithmetic.
    for &t in st.inputs.iter().chain(st.outputs).flatten() {
        let (_, shape, _) = plan.place(model, t)?;
        if shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))? > MAX_ELEMS {
            return None;
        }
    }
    let op = lower_op(model, plan, st)?;
    match &op {
        GpuOp::Conv {
            n, c, group, win, ..
        } => {
            let col = (c / group) * win.kh as i64 * win.kw as i64 * win.oh as i64 * win.ow as i64;
            (*n <= MAX_IMAGES && col <= MAX_ELEMS as i64).then_some(op)
        }
        GpuOp::Pool { n, .. } => (*n <= MAX_IMAGES).then_some(op),
        _ => Some(op),
    }
}

fn lower_op(model: &Model, plan: &Plan, st: &StepInfo<'_>) -> Option<GpuOp> {
    let node = st.node;
    // mote's optimizer turns Conv → Relu / Clip into `com.microsoft.FusedConv`:
    // lowered as the Conv with that epilogue (the fusion `fuse_activations`
    // makes for Conv → Relu / Clip steps).
    let fused_conv = node.domain == "com.microsoft" && node.op_type == "FusedConv";
    if st.dynamic || (!node.domain.is_empty() && !fused_conv) {
        return None;
    }
    let f32_in = |i| input(model, plan, st, i).filter(|(dt, _, _)| *dt == DType::F32);
    let f32_out = |i| output(model, plan, st, i).filter(|(dt, _, _)| *dt == DType::F32);
    if st.outputs.iter().flatten().count() != 1 {
        return None; // MaxPool's Indices, Dropout's mask, ...: CPU
    }
    let op = if fused_conv {
        "Conv"
    } else {
        node.op_type.as_str()
    };
    if let Some(act) = unary_code(node) {
        let (_, xs, x) = f32_in(0)?;
        let (_, ys, y) = f32_out(0)?;
        return (xs == ys).then_some(GpuOp::Unary {
            x,
            y,
            n: numel(&ys)?,
            act,
        });
    }
    match op {
        "Clip" => {
            let (_, xs, x) = f32_in(0)?;
            let (_, ys, y) = f32_out(0)?;
            let (lo, hi) = if node.opset < 11 {
                (float(node, "min", f32::MIN)?, float(node, "max", f32::MAX)?)
            } else {
                (
                    const_scalar(model, plan, st, 1, f32::MIN)?,
                    const_scalar(model, plan, st, 2, f32::MAX)?,
                )
            };
            (xs == ys).then_some(GpuOp::Unary {
                x,
                y,
                n: numel(&ys)?,
                act: Act {
                    op: 4,
                    a: lo,
                    b: hi,
                },
            })
        }
        "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Pow" | "PRelu" => {
            if (op == "Max" || op == "Min") && st.inputs.len() != 2 {
                return None;
            }
            let code = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu"]
                .iter()
                .position(|&o| o == op)? as i32;
            let (_, as_, a) = f32_in(0)?;
            let (_, bs, b) = f32_in(1)?;
            let (_, ys, y) = f32_out(0)?;
            let meta = if as_ == ys && bs == ys {
                None
            } else {
                let sa = bcast_strides(&as_, &ys)?;
                let sb = bcast_strides(&bs, &ys)?;
                Some(bcast_meta(&ys, &sa, &sb)?)
            };
            Some(GpuOp::Binary {
                a,
                b,
                y,
                n: numel(&ys)?,
                op: code,
                meta,
            })
        }
        "Gemm" => {
            let (_, as_, a) = f32_in(0)?;
            let (_, bs, b) = f32_in(1)?;
            let (_, ys, y) = f32_out(0)?;
            let (ta, tb) = (int(node, "transA", 0)? != 0, int(node, "transB", 0)? != 0);
            if as_.len() != 2 || bs.len() != 2 || ys.len() != 2 {
                return None;
            }
            let (m, k) = if ta {
                (as_[1], as_[0])
            } else {
                (as_[0], as_[1])
            };
            let n = if tb { bs[0] } else { bs[1] };
            if ys != [m, n] {
                return None;
            }
            let beta = float(node, "beta", 1.0)?;
            let c = match st.inputs.get(2).copied().flatten() {
                Some(_) => {
                    let (_, cs, c) = f32_in(2)?;
                    let sc = bcast_strides(&cs, &ys)?;
                    Some((c, bcast_meta(&ys, &vec![0; ys.len()], &sc)?))
                }
                None => None,
            };
            Some(GpuOp::Gemm {
                a,
                b,
                y,
                c,
                m: m as i64,
                n: n as i64,
                k: k as i64,
                trans_a: ta,
                trans_b: tb,
                alpha: float(node, "alpha", 1.0)?,
                beta,
                batch: 1,
                stride_a: 0,
                stride_b: 0,
            })
        }
        "MatMul" => {
            let (_, as_, a) = f32_in(0)?;
            let (_, bs, b) = f32_in(1)?;
            let (_, ys, y) = f32_out(0)?;
            if as_.len() < 2 || bs.len() < 2 {
                return None; // 1-D operands: CPU
            }
            let (m, k) = (as_[as_.len() - 2], as_[as_.len() - 1]);
            let n = bs[bs.len() - 1];
            if bs[bs.len() - 2] != k || ys.len() < 2 || ys[ys.len() - 2..] != [m, n] {
                return None;
            }
            let ba = numel(&as_[..as_.len() - 2])?;
            let bb = numel(&bs[..bs.len() - 2])?;
            let by = numel(&ys[..ys.len() - 2])?;
            let (mi, ni, ki) = (m as i64, n as i64, k as i64);
            let g = |batch, stride_a, stride_b, m| GpuOp::Gemm {
                a,
                b,
                y,
                c: None,
                m,
                n: ni,
                k: ki,
                trans_a: false,
                trans_b: false,
                alpha: 1.0,
                beta: 0.0,
                batch,
                stride_a,
                stride_b,
            };
            if bb == 1 {
                // One B for every batch: fold the batch into M.
                (ba == by).then(|| g(1, 0, 0, by * mi))
            } else if ba == by && bb == by && as_.len() == bs.len() {
                Some(g(by, mi * ki, ki * ni, mi))
            } else if ba == 1 && bb == by {
                Some(g(by, 0, ki * ni, mi))
            } else {
                None
            }
        }
        "Conv" => {
            let act = if fused_conv {
                fused_conv_act(node)?
            } else {
                Act::NONE
            };
            if st.inputs.len() > 3 {
                return None; // FusedConv's Z: CPU (which refuses it)
            }
            let (_, xs, x) = f32_in(0)?;
            let (_, ws, w) = f32_in(1)?;
            let (_, ys, y) = f32_out(0)?;
            let bias = match st.inputs.get(2).copied().flatten() {
                Some(_) => Some(f32_in(2)?.2),
                None => None,
            };
            if xs.len() != ws.len() || xs.len() < 3 {
                return None;
            }
            let group = int(node, "group", 1)?;
            let win = window(node, &xs, &ys, &ws[2..])?;
            let (n, c, m) = (xs[0] as i64, xs[1] as i64, ws[0] as i64);
            if group < 1
                || c % group != 0
                || m % group != 0
                || ws[1] as i64 != c / group
                || ys[1] as i64 != m
            {
                return None;
            }
            Some(GpuOp::Conv {
                x,
                w,
                bias,
                y,
                n,
                c,
                m,
                group,
                win,
                act,
            })
        }
        "MaxPool" | "AveragePool" => {
            let (_, xs, x) = f32_in(0)?;
            let (_, ys, y) = f32_out(0)?;
            let k: Vec<usize> = ints(node, "kernel_shape")??
                .iter()
                .map(|&v| usize::try_from(v).ok())
                .collect::<Option<_>>()?;
            if int(node, "storage_order", 0)? != 0 {
                return None;
            }
            let win = window(node, &xs, &ys, &k)?;
            if op == "AveragePool" && (win.dh != 1 || win.dw != 1) {
                return None;
            }
            Some(GpuOp::Pool {
                x,
                y,
                n: xs[0] as i64,
                c: xs[1] as i64,
                win,
                is_max: op == "MaxPool",
                count_pad: int(node, "count_include_pad", 0)? != 0,
            })
        }
        "GlobalAveragePool" | "GlobalMaxPool" => {
            let (_, xs, x) = f32_in(0)?;
            let (_, _, y) = f32_out(0)?;
            if xs.len() < 3 {
                return None;
            }
            Some(GpuOp::RowReduce {
                x,
                y,
                rows: numel(&xs[..2])?,
                len: numel(&xs[2..])?,
                is_max: op == "GlobalMaxPool",
            })
        }
        "Softmax" | "LogSoftmax" => {
            let (_, xs, x) = f32_in(0)?;
            let (_, ys, y) = f32_out(0)?;
            let r = xs.len() as i64;
            let default = if node.opset < 13 { 1 } else { -1 };
            let mut axis = int(node, "axis", default)?;
            if axis < 0 {
                axis += r;
            }
            if xs != ys || !(0..r).contains(&axis) {
                return None;
            }
            let a = axis as usize;
            let (outer, ax, inner) = if node.opset < 13 {
                (numel(&xs[..a])?, numel(&xs[a..])?, 1)
            } else {
                (numel(&xs[..a])?, xs[a] as i64, numel(&xs[a + 1..])?)
            };
            Some(GpuOp::Softmax {
                x,
                y,
                outer,
                axis: ax,
                inner,
                log: op == "LogSoftmax",
            })
        }
        "BatchNormalization" => {
            if int(node, "training_mode", 0)? != 0 {
                return None;
            }
            let (_, xs, x) = f32_in(0)?;
            let (_, ys, y) = f32_out(0)?;
            let eps = float(node, "epsilon", 1e-5)?;
            let vals = |i: usize| -> Option<Vec<f32>> {
                let id = (*st.inputs.get(i)?)?;
                match plan.place(model, id)? {
                    (DType::F32, _, Place::Const(v)) => Some(v.f32().ok()?.to_vec()),
                    _ => None,
                }
            };
            let (s, b, mean, var) = (vals(1)?, vals(2)?, vals(3)?, vals(4)?);
            let c = *xs.get(1)?;
            if xs != ys || [s.len(), b.len(), mean.len(), var.len()] != [c; 4] {
                return None;
            }
            let scale: Vec<f32> = s
                .iter()
                .zip(&var)
                .map(|(s, v)| s / (v + eps).sqrt())
                .collect();
            let shift: Vec<f32> = b
                .iter()
                .zip(&mean)
                .zip(&scale)
                .map(|((b, m), k)| b - m * k)
                .collect();
            Some(GpuOp::ScaleShift {
                x,
                y,
                scale,
                shift,
                n: numel(&xs)?,
                channels: c as i64,
                inner: numel(&xs[2..])?,
            })
        }
        "Concat" => {
            let (dt, ys, y) = output(model, plan, st, 0)?;
            if dt.size() != 4 {
                return None;
            }
            let r = ys.len() as i64;
            let mut axis = int(node, "axis", 0)?;
            if axis < 0 {
                axis += r;
            }
            if !(0..r).contains(&axis) {
                return None;
            }
            let a = axis as usize;
            let outer = numel(&ys[..a])?;
            let inner_out = numel(&ys[a..])?;
            let mut pieces = Vec::new();
            let mut off = 0i64;
            for i in 0..st.inputs.len() {
                let (dti, xs, x) = input(model, plan, st, i)?;
                if dti != dt || xs.len() != ys.len() {
                    return None;
                }
                let inner_in = numel(&xs[a..])?;
                pieces.push((x, outer, inner_in, off));
                off += inner_in;
            }
            (off == inner_out).then_some(GpuOp::Concat {
                y,
                pieces,
                inner_out,
            })
        }
        "Transpose" => {
            let (dt, xs, x) = input(model, plan, st, 0)?;
            let (dto, ys, y) = output(model, plan, st, 0)?;
            if dt.size() != 4 || dto != dt {
                return None;
            }
            let r = xs.len();
            let perm: Vec<usize> = match ints(node, "perm")? {
                Some(p) => p
                    .iter()
                    .map(|&v| usize::try_from(v).ok())
                    .collect::<Option<_>>()?,
                None => (0..r).rev().collect(),
            };
            if perm.len() != r {
                return None;
            }
            let mut in_strides = vec![1i64; r];
            for d in (0..r.saturating_sub(1)).rev() {
                in_strides[d] = in_strides[d + 1] * xs[d + 1] as i64;
            }
            let mut meta = vec![r as i64];
            meta.extend(ys.iter().map(|&d| d as i64));
            for &p in &perm {
                meta.push(*in_strides.get(p)?);
            }
            Some(GpuOp::Transpose {
                x,
                y,
                n: numel(&ys)?,
                meta,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_strides() {
        assert_eq!(bcast_strides(&[3], &[2, 3]), Some(vec![0, 1]));
        assert_eq!(bcast_strides(&[2, 1], &[2, 3]), Some(vec![1, 0]));
        assert_eq!(
            bcast_strides(&[1, 3, 1, 1], &[2, 3, 4, 5]),
            Some(vec![0, 1, 0, 0])
        );
        assert_eq!(bcast_strides(&[4], &[2, 3]), None);
        assert_eq!(bcast_strides(&[1, 2, 3], &[2, 3]), None);
    }

    #[test]
    fn fused_conv_epilogues() {
        use mote_core::model::Attr;
        let node = |act: &str, params: Option<Vec<f32>>| {
            let mut attrs = vec![Attr {
                name: "activation".into(),
                value: AttrValue::Str(act.as_bytes().to_vec()),
            }];
            attrs.extend(params.map(|p| Attr {
                name: "activation_params".into(),
                value: AttrValue::Floats(p),
            }));
            Node {
                name: String::new(),
                op_type: "FusedConv".into(),
                domain: "com.microsoft".into(),
                opset: 1,
                inputs: Vec::new(),
                outputs: Vec::new(),
                attrs,
            }
        };
        assert_eq!(
            fused_conv_act(&node("Relu", None)),
            Some(Act {
                op: 1,
                a: 0.0,
                b: 0.0
            })
        );
        assert_eq!(
            fused_conv_act(&node("Clip", Some(vec![0.0, 6.0]))),
            Some(Act {
                op: 4,
                a: 0.0,
                b: 6.0
            })
        );
        // What the GPU conv epilogue does not take stays on the CPU.
        assert_eq!(fused_conv_act(&node("Sigmoid", None)), None);
        assert_eq!(fused_conv_act(&node("Clip", Some(vec![0.0]))), None);
    }
}
