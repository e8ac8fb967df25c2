//! Sequence-model operators of recent opsets: LinearAttention and
//! CausalConvWithState (27), SwiGLU (28) and `ai.onnx.preview`
//! FlexAttention (1).
//!
//! Everything computes in f64 and rounds to the element type where the ONNX
//! reference (numpy in the input precision) rounds, so f32 results sit
//! closer to the exact value than the reference itself and f16 / bf16
//! results round like it. FlexAttention's `score_mod` / `prob_mod`
//! subgraphs are not run (mote has no subgraph evaluation inside a kernel):
//! nodes carrying a non-identity one are reported unsupported.

use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::model::AttrValue;
use crate::ops::util::{div, divides, rem, row, row_mut};
use crate::ops::{kernel, util, KernelIo, OpDef, OutputInfo, PrepareCtx, Prepared};
use crate::tensor::ChunksOf as _;
use crate::{DType, Element};
use alloc::vec;
use half::{bf16, f16};

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("LinearAttention", 27, prepare_linear_attention),
    OpDef::onnx("CausalConvWithState", 27, prepare_causal_conv),
    OpDef::onnx("SwiGLU", 28, prepare_swiglu),
    OpDef {
        op_type: "FlexAttention",
        domain: "ai.onnx.preview",
        since: 1,
        prepare: prepare_flex_attention,
    },
];

/// A float element computed in f64.
trait Fl: Element + Copy {
    fn get(self) -> f64;
    fn put(x: f64) -> Self;
    /// Rounds to this type's precision.
    #[inline]
    fn rt(x: f64) -> f64 {
        Self::put(x).get()
    }
}

impl Fl for f64 {
    #[inline]
    fn get(self) -> f64 {
        self
    }
    #[inline]
    fn put(x: f64) -> Self {
        x
    }
}

impl Fl for f32 {
    #[inline]
    fn get(self) -> f64 {
        self as f64
    }
    #[inline]
    fn put(x: f64) -> Self {
        x as f32
    }
}

impl Fl for f16 {
    #[inline]
    fn get(self) -> f64 {
        self.to_f64()
    }
    #[inline]
    fn put(x: f64) -> Self {
        f16::from_f64(x)
    }
}

impl Fl for bf16 {
    #[inline]
    fn get(self) -> f64 {
        self.to_f64()
    }
    #[inline]
    fn put(x: f64) -> Self {
        bf16::from_f64(x)
    }
}

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::F64];

fn shape_err(m: &'static str) -> Error {
    Error::new(ErrorKind::Shape(m))
}

fn attr_err(name: &'static str, problem: &'static str) -> Error {
    Error::new(ErrorKind::Attribute { name, problem })
}

fn overflow() -> Error {
    Error::new(ErrorKind::Overflow)
}

/// `n` f64 of scratch, in bytes.
fn f64_bytes(n: usize) -> Result<usize> {
    n.checked_mul(8).ok_or_else(overflow)
}

fn need<T>(s: &[T], n: usize) -> Result<()> {
    if s.len() < n {
        return Err(Error::new(ErrorKind::Len {
            expected: n as u64,
            got: s.len() as u64,
        }));
    }
    Ok(())
}

fn as_f64(scratch: &mut [u8], n: usize) -> Result<&mut [f64]> {
    let s: &mut [f64] =
        bytemuck::try_cast_slice_mut(scratch).map_err(|_| Error::internal("scratch alignment"))?;
    s.get_mut(..n).ok_or(Error::internal("scratch size"))
}

#[inline]
fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + libm::exp(-x))
}

/// Picks the monomorphization of a generic kernel for a float dtype.
macro_rules! by_float {
    ($dt:expr, $f:ident) => {
        match $dt {
            DType::F32 => $f::<f32> as fn(&_, &mut KernelIo<'_>) -> Result<()>,
            DType::F16 => $f::<f16>,
            DType::BF16 => $f::<bf16>,
            _ => $f::<f64>,
        }
    };
}

// ---------------------------------------------------------------- SwiGLU

#[derive(Debug)]
struct Swi {
    n: usize,
    alpha: f64,
}

fn prepare_swiglu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let a = ctx.input(0)?;
    let b = ctx.input(1)?;
    util::dtype_in(a.dtype, FLOATS, "SwiGLU")?;
    if b.dtype != a.dtype {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: a.dtype,
            got: b.dtype,
        }));
    }
    if a.shape != b.shape {
        return Err(shape_err("SwiGLU: A and B must have the same shape"));
    }
    let s = Swi {
        n: a.numel(),
        alpha: ctx.attr_float("alpha", 1.0)? as f64,
    };
    let f = by_float!(a.dtype, run_swiglu);
    Ok(Prepared::single(
        a.dtype,
        a.shape,
        kernel("SwiGLU", move |io| f(&s, io)),
    ))
}

fn run_swiglu<T: Fl>(s: &Swi, io: &mut KernelIo<'_>) -> Result<()> {
    let a = io.input_slice::<T>(0)?;
    let b = io.input_slice::<T>(1)?;
    need(a, s.n)?;
    need(b, s.n)?;
    let y = io.output_slice::<T>(0)?;
    need(y, s.n)?;
    for ((o, &x), &g) in y.iter_mut().zip(a).zip(b).take(s.n) {
        let x = x.get();
        // The reference evaluates the sigmoid step by step in the input
        // type; rounding each step the same way keeps f16 results on it.
        let e = T::rt(libm::exp(T::rt(-s.alpha * x)));
        let sig = T::rt(1.0 / T::rt(1.0 + e));
        let swish = T::rt(x * sig);
        *o = T::put(swish * g.get());
    }
    Ok(())
}

// ---------------------------------------------------- CausalConvWithState

#[derive(Debug)]
struct Ccs {
    batch: usize,
    ch: usize,
    len: usize,
    k: usize,
    bias: bool,
    past: bool,
    silu: bool,
    present: bool,
}

fn prepare_causal_conv(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let w = ctx.input(1)?;
    util::dtype_in(x.dtype, FLOATS, "CausalConvWithState")?;
    let dt = x.dtype;
    let act = ctx.attr_str("activation", "none")?;
    let silu = match act {
        "none" => false,
        "silu" | "swish" => true,
        _ => {
            return Err(Error::new(ErrorKind::Unsupported(
                "CausalConvWithState activation",
            )))
        }
    };
    let &[batch, ch, len] = x.shape else {
        return Err(shape_err(
            "CausalConvWithState: input must be rank 3 (B, C, L)",
        ));
    };
    let &[wc, one, k] = w.shape else {
        return Err(shape_err(
            "CausalConvWithState: weight must be rank 3 (C, 1, K)",
        ));
    };
    if w.dtype != dt {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: dt,
            got: w.dtype,
        }));
    }
    if wc != ch || one != 1 || k == 0 {
        return Err(shape_err(
            "CausalConvWithState: weight must be (C, 1, K), K >= 1",
        ));
    }
    let bias = match ctx.opt_input(2) {
        None => false,
        Some(b) => {
            if b.dtype != dt || b.shape != [ch] {
                return Err(shape_err(
                    "CausalConvWithState: bias must be (C) of the input type",
                ));
            }
            true
        }
    };
    let p = k.wrapping_sub(1); // k >= 1 (checked above)
    let past = match ctx.opt_input(3) {
        None => false,
        Some(ps) => {
            if ps.dtype != dt || ps.shape != [batch, ch, p] {
                return Err(shape_err(
                    "CausalConvWithState: past_state must be (B, C, K - 1) of the input type",
                ));
            }
            true
        }
    };
    let c = Ccs {
        batch,
        ch,
        len,
        k,
        bias,
        past,
        silu,
        present: ctx.has_output(1),
    };
    let f = by_float!(dt, run_causal_conv);
    Ok(Prepared::new(
        vec![
            OutputInfo::new(dt, x.shape),
            OutputInfo::new(dt, &[batch, ch, p]),
        ],
        kernel("CausalConvWithState", move |io| f(&c, io)),
    ))
}

fn run_causal_conv<T: Fl>(c: &Ccs, io: &mut KernelIo<'_>) -> Result<()> {
    let x = io.input_slice::<T>(0)?;
    let w = io.input_slice::<T>(1)?;
    let p =
        c.k.checked_sub(1)
            .ok_or(Error::internal("CausalConvWithState: kernel size 0"))?;
    let rows = checked_numel(&[c.batch, c.ch])?;
    let (x_len, st_len) = (checked_numel(&[rows, c.len])?, checked_numel(&[rows, p])?);
    need(x, x_len)?;
    need(w, checked_numel(&[c.ch, c.k])?)?;
    let bias: &[T] = if c.bias { io.input_slice::<T>(2)? } else { &[] };
    let past: &[T] = if c.past { io.input_slice::<T>(3)? } else { &[] };
    need(bias, if c.bias { c.ch } else { 0 })?;
    need(past, if c.past { st_len } else { 0 })?;
    if c.present {
        let (y, st) = io.outputs2(0, 1)?;
        let y = y.into_slice::<T>()?;
        let st = st.into_slice::<T>()?;
        need(y, x_len)?;
        need(st, st_len)?;
        conv_rows(c, p, w, bias, x, past, y)?;
        // The new state is the last K - 1 values of the padded row: the
        // tail of the past state (or zeros) when L < K - 1, then the input.
        let from_past = p.saturating_sub(c.len);
        for r in 0..rows {
            let xr = row(x, r, c.len)?;
            let (st_past, st_in) = row_mut(st, r, p)?
                .split_at_mut_checked(from_past)
                .ok_or(Error::internal("CausalConvWithState: state split"))?;
            if c.past {
                let pr = row(past, r, p)?;
                for (o, v) in st_past.iter_mut().zip(pr.iter().skip(c.len)) {
                    *o = T::put(v.get());
                }
            } else {
                st_past.fill(T::put(0.0));
            }
            for (o, v) in st_in
                .iter_mut()
                .zip(xr.iter().skip(c.len.saturating_sub(p)))
            {
                *o = T::put(v.get());
            }
        }
    } else {
        let y = io.output_slice::<T>(0)?;
        need(y, x_len)?;
        conv_rows(c, p, w, bias, x, past, y)?;
    }
    Ok(())
}

/// The convolution over the padded rows: each padded row is the past state
/// (or zeros), `p = K - 1` values, followed by the input row.
fn conv_rows<T: Fl>(
    c: &Ccs,
    p: usize,
    w: &[T],
    bias: &[T],
    x: &[T],
    past: &[T],
    y: &mut [T],
) -> Result<()> {
    for r in 0..checked_numel(&[c.batch, c.ch])? {
        let ch = rem(r, c.ch, "causal conv channel")?;
        let wr = row(w, ch, c.k)?;
        let b0 = if c.bias {
            bias.get(ch)
                .ok_or(Error::internal("CausalConvWithState: bias"))?
                .get()
        } else {
            0.0
        };
        let xr = row(x, r, c.len)?;
        let pr = if c.past { Some(row(past, r, p)?) } else { None };
        for (t, o) in row_mut(y, r, c.len)?.iter_mut().enumerate() {
            let mut acc = b0;
            // Taps j < p - t read the past state (or zeros) at t + j, the
            // others the input at t + j - p; in tap order, as one loop would.
            let n_past = p.saturating_sub(t);
            match pr {
                Some(pr) => {
                    for (wj, v) in wr.iter().zip(pr.iter().skip(t)) {
                        acc += wj.get() * v.get();
                    }
                }
                None => {
                    for wj in wr.iter().take(n_past) {
                        acc += wj.get() * 0.0;
                    }
                }
            }
            for (wj, v) in wr
                .iter()
                .skip(n_past)
                .zip(xr.iter().skip(t.saturating_sub(p)))
            {
                acc += wj.get() * v.get();
            }
            // The reference rounds the convolution to the input type
            // before the activation.
            let conv = T::rt(acc);
            *o = T::put(if c.silu { conv * sigmoid(conv) } else { conv });
        }
    }
    Ok(())
}

// -------------------------------------------------------- LinearAttention

#[derive(Debug)]
struct Lin {
    batch: usize,
    seq: usize,
    hq: usize,
    hkv: usize,
    dk: usize,
    dv: usize,
    scale: f64,
    /// Decay per key dim (true) or per head (false), when gating.
    decay: Option<bool>,
    /// Beta per head (true) or one for all heads (false), with delta rule.
    beta: Option<bool>,
    past: bool,
    present: bool,
}

fn prepare_linear_attention(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let q = ctx.input(0)?;
    let k = ctx.input(1)?;
    let v = ctx.input(2)?;
    let dt = q.dtype;
    util::dtype_in(dt, FLOATS, "LinearAttention")?;
    for x in [k, v] {
        if x.dtype != dt {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: dt,
                got: x.dtype,
            }));
        }
    }
    let hq = ctx.attr_int("q_num_heads", 0)?;
    let hkv = ctx.attr_int("kv_num_heads", 0)?;
    if hq <= 0 || hkv <= 0 || hq.checked_rem(hkv) != Some(0) {
        return Err(attr_err(
            "q_num_heads",
            "q_num_heads and kv_num_heads are required, q_num_heads a multiple of kv_num_heads",
        ));
    }
    let (hq, hkv) = (hq as usize, hkv as usize);
    let (gating, delta) = match ctx.attr_str("update_rule", "gated_delta")? {
        "linear" => (false, false),
        "gated" => (true, false),
        "delta" => (false, true),
        "gated_delta" => (true, true),
        _ => return Err(attr_err("update_rule", "unknown update rule")),
    };
    let (&[batch, seq, qw], &[kb, ks, kw], &[vb, vs, vw]) = (q.shape, k.shape, v.shape) else {
        return Err(shape_err(
            "LinearAttention: query, key, value must be rank 3",
        ));
    };
    if kb != batch || vb != batch || ks != seq || vs != seq {
        return Err(shape_err(
            "LinearAttention: query, key, value disagree on (B, T)",
        ));
    }
    if !divides(qw, hq)
        || !divides(vw, hkv)
        || Some(kw) != qw.checked_div(hq).and_then(|d| d.checked_mul(hkv))
    {
        return Err(shape_err(
            "LinearAttention: hidden sizes do not split into heads",
        ));
    }
    let (dk, dv) = (
        div(qw, hq, "LinearAttention: heads")?,
        div(vw, hkv, "LinearAttention: heads")?,
    );
    let decay = match (gating, ctx.opt_input(4)) {
        (false, None) => None,
        (true, Some(d)) => {
            if d.dtype != dt {
                return Err(Error::new(ErrorKind::DTypeMismatch {
                    expected: dt,
                    got: d.dtype,
                }));
            }
            match *d.shape {
                // kw = hkv · dk (checked above).
                [b, t, w] if b == batch && t == seq && w == kw => Some(true),
                [b, t, w] if b == batch && t == seq && w == hkv => Some(false),
                _ => {
                    return Err(shape_err(
                        "LinearAttention: decay must be (B, T, H) or (B, T, H*dk)",
                    ))
                }
            }
        }
        _ => {
            return Err(shape_err(
                "LinearAttention: decay is required by gated rules and forbidden otherwise",
            ))
        }
    };
    let beta = match (delta, ctx.opt_input(5)) {
        (false, None) => None,
        (true, Some(b)) => {
            if b.dtype != dt {
                return Err(Error::new(ErrorKind::DTypeMismatch {
                    expected: dt,
                    got: b.dtype,
                }));
            }
            match *b.shape {
                [bb, t, w] if bb == batch && t == seq && w == hkv => Some(true),
                [bb, t, 1] if bb == batch && t == seq => Some(false),
                _ => {
                    return Err(shape_err(
                        "LinearAttention: beta must be (B, T, H) or (B, T, 1)",
                    ))
                }
            }
        }
        _ => {
            return Err(shape_err(
                "LinearAttention: beta is required by delta rules and forbidden otherwise",
            ))
        }
    };
    let state_shape = [batch, hkv, dk, dv];
    let state_dt = match ctx.opt_input(3) {
        None => dt,
        Some(p) => {
            if p.shape != state_shape {
                return Err(shape_err(
                    "LinearAttention: past_state must be (B, H_kv, dk, dv)",
                ));
            }
            p.dtype
        }
    };
    let s = ctx.attr_float("scale", 0.0)? as f64;
    let l = Lin {
        batch,
        seq,
        hq,
        hkv,
        dk,
        dv,
        scale: if s == 0.0 {
            1.0 / libm::sqrt(dk as f64)
        } else {
            s
        },
        decay,
        beta,
        past: ctx.opt_input(3).is_some(),
        present: ctx.has_output(1),
    };
    let f: fn(&Lin, &mut KernelIo<'_>) -> Result<()> = match (dt, state_dt) {
        (DType::F32, DType::F32) => run_linear::<f32, f32>,
        (DType::F16, DType::F16) => run_linear::<f16, f16>,
        (DType::BF16, DType::BF16) => run_linear::<bf16, bf16>,
        (DType::F64, DType::F64) => run_linear::<f64, f64>,
        (DType::F16, DType::F32) => run_linear::<f16, f32>,
        (DType::BF16, DType::F32) => run_linear::<bf16, f32>,
        _ => {
            return Err(Error::new(ErrorKind::UnsupportedDType {
                what: "LinearAttention past_state",
                code: state_dt.onnx_code(),
            }))
        }
    };
    let states = checked_numel(&state_shape)?;
    let scratch = f64_bytes(states.checked_add(dv).ok_or_else(overflow)?)?;
    let out_w = hq.checked_mul(dv).ok_or_else(overflow)?;
    Ok(Prepared::new(
        vec![
            OutputInfo::new(dt, &[batch, seq, out_w]),
            OutputInfo::new(state_dt, &state_shape),
        ],
        kernel("LinearAttention", move |io| f(&l, io)),
    )
    .with_scratch(scratch))
}

fn run_linear<T: Fl, S: Fl>(l: &Lin, io: &mut KernelIo<'_>) -> Result<()> {
    let (b_n, t_n, dk, dv) = (l.batch, l.seq, l.dk, l.dv);
    let per = checked_numel(&[dk, dv])?;
    let states = checked_numel(&[b_n, l.hkv, per])?;
    let q = io.input_slice::<T>(0)?;
    let k = io.input_slice::<T>(1)?;
    let v = io.input_slice::<T>(2)?;
    need(q, checked_numel(&[b_n, t_n, l.hq, dk])?)?;
    need(k, checked_numel(&[b_n, t_n, l.hkv, dk])?)?;
    need(v, checked_numel(&[b_n, t_n, l.hkv, dv])?)?;
    let past: &[S] = if l.past { io.input_slice::<S>(3)? } else { &[] };
    need(past, if l.past { states } else { 0 })?;
    let decay: &[T] = if l.decay.is_some() {
        io.input_slice::<T>(4)?
    } else {
        &[]
    };
    let dw = match l.decay {
        Some(true) => checked_numel(&[l.hkv, dk])?,
        Some(false) => l.hkv,
        None => 0,
    };
    need(decay, checked_numel(&[b_n, t_n, dw])?)?;
    let beta: &[T] = if l.beta.is_some() {
        io.input_slice::<T>(5)?
    } else {
        &[]
    };
    let bw = match l.beta {
        Some(true) => l.hkv,
        Some(false) => 1,
        None => 0,
    };
    need(beta, checked_numel(&[b_n, t_n, bw])?)?;
    if dv == 0 {
        // No output element and no state value: nothing to compute (and the
        // state rows below have dv >= 1 values each).
        return Ok(());
    }
    let group = div(l.hq, l.hkv, "LinearAttention: kv heads")?;
    // Row indices in the loops below: b·hkv + g < b_n·hkv, bt = b·t_n + t
    // < b_n·t_n, and bt·hkv + g, bt·bw + g, bt·hq + h < b_n·t_n·hq (bw <=
    // hkv <= hq, a multiple of it): within the products checked here, so
    // the wrapping operations are exact.
    checked_numel(&[b_n, l.hq])?;
    checked_numel(&[b_n, t_n, l.hq])?;
    {
        let (out, scratch) = io.output_and_scratch(0)?;
        let out = out.into_slice::<T>()?;
        need(out, checked_numel(&[b_n, t_n, l.hq, dv])?)?;
        let sc = as_f64(scratch, states.checked_add(dv).ok_or_else(overflow)?)?;
        let (all, vt) = sc
            .split_at_mut_checked(states)
            .ok_or(Error::internal("LinearAttention: scratch split"))?;
        for b in 0..b_n {
            for g in 0..l.hkv {
                // The state of this head: dk rows of dv values.
                let bg = b.wrapping_mul(l.hkv).wrapping_add(g);
                let st = row_mut(all, bg, per)?;
                if l.past {
                    for (s, p) in st.iter_mut().zip(row(past, bg, per)?) {
                        *s = p.get();
                    }
                } else {
                    st.fill(0.0);
                }
                for t in 0..t_n {
                    let bt = b.wrapping_mul(t_n).wrapping_add(t);
                    let btg = bt.wrapping_mul(l.hkv).wrapping_add(g);
                    let kt = row(k, btg, dk)?;
                    if let Some(per_dim) = l.decay {
                        // One gate per key dim, or the head's one for all
                        // of them (cycled).
                        let gates = row(decay, bt, dw)?;
                        let gates = if per_dim {
                            row(gates, g, dk)?
                        } else {
                            row(gates, g, 1)?
                        };
                        for (srow, x) in st.chunks_of_mut(dv).zip(gates.iter().cycle()) {
                            let f = libm::exp(x.get());
                            for s in srow {
                                *s *= f;
                            }
                        }
                    }
                    for (o, x) in vt.iter_mut().zip(row(v, btg, dv)?) {
                        *o = x.get();
                    }
                    if let Some(per_head) = l.beta {
                        // Delta rule: write only what the state does not
                        // already retrieve for this key.
                        let at = bt.wrapping_mul(bw);
                        let be = beta
                            .get(if per_head { at.wrapping_add(g) } else { at })
                            .ok_or(Error::internal("LinearAttention: beta"))?
                            .get();
                        for (m, o) in vt.iter_mut().enumerate() {
                            let mut r = 0.0;
                            // Column m of the state, one value per key dim.
                            for (s, kd) in st.iter().skip(m).step_by(dv).zip(kt) {
                                r += s * kd.get();
                            }
                            *o = be * (*o - r);
                        }
                    }
                    for (srow, kd) in st.chunks_of_mut(dv).zip(kt) {
                        let kd = kd.get();
                        for (s, &x) in srow.iter_mut().zip(vt.iter()) {
                            *s += kd * x;
                        }
                    }
                    // (g + 1) · group <= hkv · group = hq.
                    let h0 = g.wrapping_mul(group);
                    for h in h0..h0.wrapping_add(group) {
                        let bth = bt.wrapping_mul(l.hq).wrapping_add(h);
                        let qt = row(q, bth, dk)?;
                        let o = row_mut(out, bth, dv)?;
                        for (m, om) in o.iter_mut().enumerate() {
                            let mut acc = 0.0;
                            for (qd, s) in qt.iter().zip(st.iter().skip(m).step_by(dv)) {
                                acc += qd.get() * s;
                            }
                            *om = T::put(l.scale * acc);
                        }
                    }
                }
            }
        }
    }
    if l.present {
        // The scratch still holds every final state from the pass above.
        let (pres, scratch) = io.output_and_scratch(1)?;
        let pres = pres.into_slice::<S>()?;
        need(pres, states)?;
        let sc = as_f64(scratch, states)?;
        for (p, &s) in pres.iter_mut().zip(sc.iter()) {
            *p = S::put(s);
        }
    }
    Ok(())
}

// ---------------------------------------------------------- FlexAttention

#[derive(Debug)]
struct Flex {
    batch: usize,
    hq: usize,
    hkv: usize,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    scale: f64,
}

/// A modifier graph that returns its input unchanged needs no evaluation.
fn is_identity_graph(v: &AttrValue) -> bool {
    match v {
        AttrValue::Graph(g) => {
            g.nodes.is_empty()
                && g.inputs.len() == 1
                && g.outputs.len() == 1
                && g.inputs.first() == g.outputs.first()
        }
        _ => false,
    }
}

fn prepare_flex_attention(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let q = ctx.input(0)?;
    let k = ctx.input(1)?;
    let v = ctx.input(2)?;
    let dt = q.dtype;
    util::dtype_in(dt, FLOATS, "FlexAttention")?;
    for x in [k, v] {
        if x.dtype != dt {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: dt,
                got: x.dtype,
            }));
        }
    }
    for name in ["score_mod", "prob_mod"] {
        if let Some(g) = ctx.node.attr(name) {
            if !is_identity_graph(g) {
                return Err(Error::new(ErrorKind::Unsupported(
                    "FlexAttention score_mod / prob_mod subgraphs",
                )));
            }
        }
    }
    let default_prec = if dt == DType::F64 { 11 } else { 1 };
    if ctx.attr_int("softmax_precision", default_prec)? != default_prec {
        return Err(Error::new(ErrorKind::Unsupported(
            "FlexAttention softmax_precision other than the default",
        )));
    }
    let (&[batch, hq, l, e], &[kb, hkv, s, ke], &[vb, vh, vs, ev]) = (q.shape, k.shape, v.shape)
    else {
        return Err(shape_err("FlexAttention: Q, K, V must be rank 4"));
    };
    if kb != batch || vb != batch || vh != hkv || vs != s || ke != e {
        return Err(shape_err("FlexAttention: Q, K, V shapes disagree"));
    }
    if !divides(hq, hkv) {
        return Err(shape_err(
            "FlexAttention: q heads must be a multiple of kv heads",
        ));
    }
    let scale = match ctx.node.attr("scale") {
        None => 1.0 / libm::sqrt(e as f64),
        Some(_) => ctx.attr_float("scale", 1.0)? as f64,
    };
    let fx = Flex {
        batch,
        hq,
        hkv,
        l,
        s,
        e,
        ev,
        scale,
    };
    let f = by_float!(dt, run_flex);
    let scratch = f64_bytes(s.checked_add(e).ok_or_else(overflow)?)?;
    Ok(Prepared::single(
        dt,
        &[batch, hq, l, ev],
        kernel("FlexAttention", move |io| f(&fx, io)),
    )
    .with_scratch(scratch))
}

fn run_flex<T: Fl>(f: &Flex, io: &mut KernelIo<'_>) -> Result<()> {
    let q = io.input_slice::<T>(0)?;
    let k = io.input_slice::<T>(1)?;
    let v = io.input_slice::<T>(2)?;
    need(q, checked_numel(&[f.batch, f.hq, f.l, f.e])?)?;
    need(k, checked_numel(&[f.batch, f.hkv, f.s, f.e])?)?;
    need(v, checked_numel(&[f.batch, f.hkv, f.s, f.ev])?)?;
    let (k_row, v_row) = (checked_numel(&[f.s, f.e])?, checked_numel(&[f.s, f.ev])?);
    // Row indices in the loop below: b·hq + h < batch·hq, (b·hq + h)·l + i
    // < batch·hq·l and kv = b·hkv + h / group < batch·hkv <= batch·hq (hq,
    // when not 0, is a multiple of hkv): within the products checked here,
    // so the wrapping operations are exact.
    checked_numel(&[f.batch, f.hq])?;
    checked_numel(&[f.batch, f.hq, f.l])?;
    // The reference scales Q and K each by sqrt(scale), in the input type.
    let ss = T::rt(libm::sqrtf(f.scale as f32) as f64);
    let group = div(f.hq, f.hkv, "FlexAttention: kv heads")?;
    let (out, scratch) = io.output_and_scratch(0)?;
    let out = out.into_slice::<T>()?;
    need(out, checked_numel(&[f.batch, f.hq, f.l, f.ev])?)?;
    let sc = as_f64(scratch, f.s.checked_add(f.e).ok_or_else(overflow)?)?;
    let (p, qs) = sc
        .split_at_mut_checked(f.s)
        .ok_or(Error::internal("FlexAttention: scratch split"))?;
    for b in 0..f.batch {
        for h in 0..f.hq {
            let bh = b.wrapping_mul(f.hq).wrapping_add(h);
            let kv =
                b.wrapping_mul(f.hkv)
                    .wrapping_add(div(h, group, "FlexAttention: head group")?);
            let kh = row(k, kv, k_row)?;
            let vh = row(v, kv, v_row)?;
            for i in 0..f.l {
                let bhi = bh.wrapping_mul(f.l).wrapping_add(i);
                let qr = row(q, bhi, f.e)?;
                for (o, x) in qs.iter_mut().zip(qr) {
                    *o = T::rt(x.get() * ss);
                }
                let mut mx = f64::NEG_INFINITY;
                for (j, pj) in p.iter_mut().enumerate() {
                    let mut acc = 0.0;
                    for (qd, kd) in qs.iter().zip(row(kh, j, f.e)?) {
                        acc += qd * T::rt(kd.get() * ss);
                    }
                    *pj = T::rt(acc);
                    mx = mx.max(*pj);
                }
                let mut sum = 0.0;
                for pj in p.iter_mut() {
                    *pj = libm::exp(*pj - mx);
                    sum += *pj;
                }
                let o = row_mut(out, bhi, f.ev)?;
                for (m, om) in o.iter_mut().enumerate() {
                    let mut acc = 0.0;
                    // Column m of V (o is not empty here, so f.ev >= 1).
                    for (pj, vj) in p.iter().zip(vh.iter().skip(m).step_by(f.ev)) {
                        acc += pj * vj.get();
                    }
                    *om = T::put(acc / sum);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::AttrValue as A;
    use crate::ops::testing::{assert_close, node, rnd, run, t, vals};
    use alloc::vec::Vec;

    fn s(x: &str) -> A {
        A::Str(x.as_bytes().to_vec())
    }

    #[test]
    fn swiglu_by_hand() {
        // y = a * sigmoid(alpha a) * b: a = 0 -> 0; a = 2, alpha 0.5 ->
        // 2 * sigmoid(1) * 3 = 4.3864; a = -1 -> -1 * sigmoid(-0.5) * 2.
        let r = run(
            "SwiGLU",
            28,
            vec![("alpha", A::Float(0.5))],
            &[t(&[3], &[0.0f32, 2.0, -1.0]), t(&[3], &[5.0f32, 3.0, 2.0])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[0.0, 4.386_355, -0.754_915], 1e-6);
        assert!(run(
            "SwiGLU",
            28,
            vec![],
            &[t(&[2], &[1.0f32, 2.0]), t(&[1], &[1.0f32])],
            1
        )
        .is_err());
    }

    #[test]
    fn causal_conv_by_hand() {
        // One channel, K = 3, past [1, 2], input [3, 4], bias 0.5, weight
        // [1, 10, 100]: y0 = 1 + 20 + 300 + .5, y1 = 2 + 30 + 400 + .5;
        // present = last two of [1, 2, 3, 4].
        let r = run(
            "CausalConvWithState",
            27,
            vec![],
            &[
                t(&[1, 1, 2], &[3.0f32, 4.0]),
                t(&[1, 1, 3], &[1.0f32, 10.0, 100.0]),
                t(&[1], &[0.5f32]),
                t(&[1, 1, 2], &[1.0f32, 2.0]),
            ],
            2,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), [321.5, 432.5]);
        assert_eq!(vals::<f32>(&r[1]), [3.0, 4.0]);
        // No past: zeros pad, and silu(x) = x sigmoid(x): y0 = 3 * 100 = 300,
        // y1 = 3 * 10 + 4 * 100 = 430 (sigmoid ~ 1); present keeps [3, 4].
        let r = run(
            "CausalConvWithState",
            27,
            vec![("activation", s("silu"))],
            &[
                t(&[1, 1, 2], &[3.0f32, -0.01]),
                t(&[1, 1, 3], &[1.0f32, 10.0, 1.0]),
            ],
            2,
        )
        .unwrap();
        // y0 = 3 * 1 = 3 -> 3 sigmoid(3); y1 = 30 - .01 -> 29.99 sigmoid(29.99).
        let y0 = 3.0 / (1.0 + (-3.0f32).exp());
        assert_close(&vals::<f32>(&r[0]), &[y0, 29.99], 1e-5);
        assert_eq!(vals::<f32>(&r[1]), [3.0, -0.01]);
    }

    /// The reference recurrence written straight from the spec, per head.
    fn linear_ref(
        rule: &str,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        decay: &[f32],
        beta: &[f32],
        tn: usize,
        d: usize,
        scale: f32,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut st = vec![0.0f32; d * d];
        let mut out = vec![0.0f32; tn * d];
        for t in 0..tn {
            if rule.starts_with("gated") {
                for i in 0..d {
                    for j in 0..d {
                        st[i * d + j] *= decay[t * d + i].exp();
                    }
                }
            }
            let mut vt: Vec<f32> = v[t * d..(t + 1) * d].to_vec();
            if rule.ends_with("delta") {
                for j in 0..d {
                    let r: f32 = (0..d).map(|i| st[i * d + j] * k[t * d + i]).sum();
                    vt[j] = beta[t] * (vt[j] - r);
                }
            }
            for i in 0..d {
                for j in 0..d {
                    st[i * d + j] += k[t * d + i] * vt[j];
                }
            }
            for j in 0..d {
                out[t * d + j] = scale * (0..d).map(|i| q[t * d + i] * st[i * d + j]).sum::<f32>();
            }
        }
        (out, st)
    }

    #[test]
    fn linear_attention_rules_match_recurrence() {
        let (tn, d) = (3, 2);
        let q = rnd(tn * d, 1);
        let k = rnd(tn * d, 2);
        let v = rnd(tn * d, 3);
        let decay: Vec<f32> = rnd(tn * d, 4).iter().map(|x| -x.abs()).collect();
        let beta: Vec<f32> = rnd(tn, 5).iter().map(|x| x.abs()).collect();
        for rule in ["linear", "gated", "delta", "gated_delta"] {
            let mut inputs = vec![
                t(&[1, tn, d], &q),
                t(&[1, tn, d], &k),
                t(&[1, tn, d], &v),
                None,
                None,
                None,
            ];
            if rule.starts_with("gated") {
                inputs[4] = t(&[1, tn, d], &decay);
            }
            if rule.ends_with("delta") {
                inputs[5] = t(&[1, tn, 1], &beta);
            }
            let r = run(
                "LinearAttention",
                27,
                vec![
                    ("q_num_heads", A::Int(1)),
                    ("kv_num_heads", A::Int(1)),
                    ("update_rule", s(rule)),
                ],
                &inputs,
                2,
            )
            .unwrap();
            let (o, st) = linear_ref(rule, &q, &k, &v, &decay, &beta, tn, d, 1.0 / 2f32.sqrt());
            assert_close(&vals::<f32>(&r[0]), &o, 1e-6);
            assert_close(&vals::<f32>(&r[1]), &st, 1e-6);
            assert_eq!(r[1].shape, [1, 1, 2, 2]);
        }
    }

    #[test]
    fn linear_attention_past_and_gqa_by_hand() {
        // dk = dv = 1, two query heads on one kv head, linear rule, scale 2:
        // state = past 3 + k v = 3 + 2 * 5 = 13; outputs 2 * q * 13.
        let r = run(
            "LinearAttention",
            27,
            vec![
                ("q_num_heads", A::Int(2)),
                ("kv_num_heads", A::Int(1)),
                ("update_rule", s("linear")),
                ("scale", A::Float(2.0)),
            ],
            &[
                t(&[1, 1, 2], &[1.0f32, -0.5]),
                t(&[1, 1, 1], &[2.0f32]),
                t(&[1, 1, 1], &[5.0f32]),
                t(&[1, 1, 1, 1], &[3.0f32]),
            ],
            2,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), [26.0, -13.0]);
        assert_eq!(vals::<f32>(&r[1]), [13.0]);
        // Gated rule without decay is malformed.
        let bad = run(
            "LinearAttention",
            27,
            vec![
                ("q_num_heads", A::Int(1)),
                ("kv_num_heads", A::Int(1)),
                ("update_rule", s("gated")),
            ],
            &[
                t(&[1, 1, 1], &[1.0f32]),
                t(&[1, 1, 1], &[1.0f32]),
                t(&[1, 1, 1], &[1.0f32]),
            ],
            2,
        );
        assert!(bad.is_err());
    }

    #[test]
    fn flex_attention_by_hand_and_gqa() {
        // One query [1, 0] against keys [1, 0], [0, 1] with scale 1:
        // softmax([1, 0]) = [e/(e+1), 1/(e+1)]; values [10], [20].
        let e = core::f32::consts::E;
        let p0 = e / (e + 1.0);
        let want = 10.0 * p0 + 20.0 * (1.0 - p0);
        // Two query heads share the one kv head.
        let mut n = node("FlexAttention", 3, 1, vec![("scale", A::Float(1.0))]);
        n.domain = "ai.onnx.preview".into();
        let q = t(&[1, 2, 1, 2], &[1.0f32, 0.0, 1.0, 0.0]).unwrap();
        let k = t(&[1, 1, 2, 2], &[1.0f32, 0.0, 0.0, 1.0]).unwrap();
        let v = t(&[1, 1, 2, 1], &[10.0f32, 20.0]).unwrap();
        let r = crate::plan::eval_const(&n, 1, &[Some(&q), Some(&k), Some(&v)]).unwrap();
        assert_eq!(r[0].shape, [1, 2, 1, 1]);
        assert_close(&vals::<f32>(&r[0]), &[want, want], 1e-6);
        // Default scale 1/sqrt(2) on head size 2, one head.
        let q1 = t(&[1, 1, 1, 2], &[1.0f32, 0.0]).unwrap();
        n.attrs.clear();
        let r = crate::plan::eval_const(&n, 1, &[Some(&q1), Some(&k), Some(&v)]).unwrap();
        let p0 = 1.0 / (1.0 + (-(0.5f32).sqrt()).exp());
        assert_close(&vals::<f32>(&r[0]), &[10.0 * p0 + 20.0 * (1.0 - p0)], 1e-6);
    }
}
