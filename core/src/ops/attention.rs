//! Attention operators: Attention (opsets 23–25) and RotaryEmbedding (23).
//!
//! Attention runs one query row at a time: the row's additive bias (mask,
//! causal frontier, sliding window, padding) and its scores live in scratch,
//! so memory stays O(kv length) whatever the sequence sizes. K and V are read
//! through the past cache and the new inputs in place, never concatenated.
//!
//! f16 / bf16 compute in f32 but round back to the input type at each point
//! where the ONNX reference (numpy in the input precision, matmuls
//! accumulating in f32) rounds, so low-precision results match it closely.

use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::kern::{win, win_mut};
use crate::math;
use crate::ops::util::{div, divides};
use crate::ops::{kernel, util, KernelIo, OpDef, OutputInfo, PrepareCtx, Prepared};
use crate::tensor::copy_exact;
use crate::{DType, Element};
use alloc::vec;
use alloc::vec::Vec;
use half::{bf16, f16};

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("Attention", 23, prepare_attention),
    OpDef::onnx("RotaryEmbedding", 23, prepare_rotary),
];

/// A float element computed in f32.
trait Fl: Element + Copy {
    fn get(self) -> f32;
    fn put(x: f32) -> Self;
    /// Rounds an f32 to this type's precision.
    #[inline]
    fn rt(x: f32) -> f32 {
        Self::put(x).get()
    }
}

impl Fl for f32 {
    #[inline]
    fn get(self) -> f32 {
        self
    }
    #[inline]
    fn put(x: f32) -> Self {
        x
    }
    #[inline]
    fn rt(x: f32) -> f32 {
        x
    }
}

impl Fl for f16 {
    #[inline]
    fn get(self) -> f32 {
        self.to_f32()
    }
    #[inline]
    fn put(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Fl for bf16 {
    #[inline]
    fn get(self) -> f32 {
        self.to_f32()
    }
    #[inline]
    fn put(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

fn shape_err(m: &'static str) -> Error {
    Error::new(ErrorKind::Shape(m))
}

fn overflow() -> Error {
    Error::new(ErrorKind::Overflow)
}

/// Precision the softmax runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prec {
    F32,
    F16,
    BF16,
}

impl Prec {
    fn of(dt: DType) -> Prec {
        match dt {
            DType::F16 => Prec::F16,
            DType::BF16 => Prec::BF16,
            _ => Prec::F32,
        }
    }
    #[inline]
    fn round(self, x: f32) -> f32 {
        match self {
            Prec::F32 => x,
            Prec::F16 => f16::from_f32(x).to_f32(),
            Prec::BF16 => bf16::from_f32(x).to_f32(),
        }
    }
}

/// Element strides of a `[batch, heads, seq, d]` view (d contiguous), which
/// covers both the 4D layout and the 3D `[batch, seq, heads * d]` one.
#[derive(Clone, Copy, Debug)]
struct Lay {
    b: usize,
    h: usize,
    s: usize,
}

impl Lay {
    fn d4(heads: usize, seq: usize, d: usize) -> Result<Lay> {
        let h = seq.checked_mul(d).ok_or_else(overflow)?;
        Ok(Lay {
            b: heads.checked_mul(h).ok_or_else(overflow)?,
            h,
            s: d,
        })
    }
    fn d3(heads: usize, seq: usize, d: usize) -> Result<Lay> {
        let s = heads.checked_mul(d).ok_or_else(overflow)?;
        Ok(Lay {
            b: seq.checked_mul(s).ok_or_else(overflow)?,
            h: d,
            s,
        })
    }
    /// Offset of row (b, h, s), for b < batch, h < heads and s < seq: below
    /// batch · self.b, which the kernels check against the slice (`need`),
    /// so the wrapping operations are exact.
    #[inline]
    fn at(&self, b: usize, h: usize, s: usize) -> usize {
        let bh = b.wrapping_mul(self.b).wrapping_add(h.wrapping_mul(self.h));
        bh.wrapping_add(s.wrapping_mul(self.s))
    }
}

#[derive(Clone, Copy, Debug)]
struct Mask {
    is_bool: bool,
    /// Strides over (batch, q head, query row); 0 where broadcast.
    sb: usize,
    sh: usize,
    si: usize,
    /// Columns present; the rest of the kv length counts as masked.
    cols: usize,
    numel: usize,
}

/// What the optional fourth output holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// After QK^T and softcap (modes 0 and 1: the reference caps both).
    Capped,
    /// Plus the additive bias (mode 2).
    Biased,
    /// Guarded softmax probabilities (mode 3).
    Probs,
}

#[derive(Clone, Copy, Debug)]
struct Att {
    batch: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    /// Cached kv rows (past_key, past_value).
    past: usize,
    /// Total kv rows.
    l: usize,
    dk: usize,
    dv: usize,
    /// Scratch f32s of a query row: its scores and bias (l each), then its
    /// query or output head row (max(dk, dv)).
    scr: usize,
    q: Lay,
    k: Lay,
    v: Lay,
    y: Lay,
    sq_scale: f32,
    softcap: f32,
    causal: bool,
    left: i64,
    right: i64,
    mask: Option<Mask>,
    nonpad: bool,
    qk_stage: Stage,
    prec: Prec,
}

fn prepare_attention(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let q = ctx.input(0)?;
    let k = ctx.input(1)?;
    let v = ctx.input(2)?;
    util::dtype_in(q.dtype, FLOATS, "Attention Q")?;
    let dt = q.dtype;
    for x in [k, v] {
        if x.dtype != dt {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: dt,
                got: x.dtype,
            }));
        }
    }
    let rank = q.shape.len();
    if k.shape.len() != rank || v.shape.len() != rank || !(rank == 3 || rank == 4) {
        return Err(Error::new(ErrorKind::Rank {
            expected: 4,
            got: rank,
        }));
    }
    let rank_err = || Error::internal("Attention: rank");
    let (Some(&batch), Some(&kb), Some(&vb)) = (q.shape.first(), k.shape.first(), v.shape.first())
    else {
        return Err(rank_err());
    };
    if kb != batch || vb != batch {
        return Err(shape_err("Attention: batch sizes differ"));
    }
    let (hq, hkv, sq, skv, dq, dk, dv, ql, kl, vl);
    if rank == 3 {
        let (&[_, q_s, q_hid], &[_, k_s, k_hid], &[_, v_s, v_hid]) = (q.shape, k.shape, v.shape)
        else {
            return Err(rank_err());
        };
        let qh = ctx.attr_int("q_num_heads", 0)?;
        let kh = ctx.attr_int("kv_num_heads", 0)?;
        if qh <= 0 || kh <= 0 {
            return Err(Error::new(ErrorKind::Attribute {
                name: "q_num_heads",
                problem: "3D inputs need positive q_num_heads and kv_num_heads",
            }));
        }
        hq = qh as usize;
        hkv = kh as usize;
        if !divides(q_hid, hq) || !divides(k_hid, hkv) || !divides(v_hid, hkv) {
            return Err(shape_err("Attention: hidden size not divisible by heads"));
        }
        sq = q_s;
        skv = k_s;
        dq = div(q_hid, hq, "Attention: heads")?;
        dk = div(k_hid, hkv, "Attention: heads")?;
        dv = div(v_hid, hkv, "Attention: heads")?;
        if v_s != skv {
            return Err(shape_err("Attention: K and V lengths differ"));
        }
        ql = Lay::d3(hq, sq, dq)?;
        kl = Lay::d3(hkv, skv, dk)?;
        vl = Lay::d3(hkv, skv, dv)?;
    } else {
        let (&[_, q_h, q_s, q_d], &[_, k_h, k_s, k_d], &[_, v_h, v_s, v_d]) =
            (q.shape, k.shape, v.shape)
        else {
            return Err(rank_err());
        };
        hq = q_h;
        hkv = k_h;
        sq = q_s;
        skv = k_s;
        dq = q_d;
        dk = k_d;
        dv = v_d;
        if v_h != hkv || v_s != skv {
            return Err(shape_err("Attention: K and V shapes differ"));
        }
        ql = Lay::d4(hq, sq, dq)?;
        kl = Lay::d4(hkv, skv, dk)?;
        vl = Lay::d4(hkv, skv, dv)?;
    }
    if dq != dk {
        return Err(shape_err("Attention: Q and K head sizes differ"));
    }
    if !divides(hq, hkv) {
        return Err(shape_err(
            "Attention: q heads must be a multiple of kv heads",
        ));
    }

    let pk = ctx.opt_input(4);
    let pv = ctx.opt_input(5);
    let past = match (pk, pv) {
        (None, None) => 0,
        (Some(pk), Some(pv)) => {
            if pk.dtype != dt || pv.dtype != dt {
                return Err(Error::new(ErrorKind::DTypeMismatch {
                    expected: dt,
                    got: if pk.dtype != dt { pk.dtype } else { pv.dtype },
                }));
            }
            let past_err = || shape_err("Attention: past_key / past_value shape");
            let (&[pkb, pkh, pkl, pkd], &[pvb, pvh, pvl, pvd]) = (pk.shape, pv.shape) else {
                return Err(past_err());
            };
            if [pkb, pkh] != [batch, hkv]
                || [pvb, pvh] != [batch, hkv]
                || pkl != pvl
                || pkd != dk
                || pvd != dv
            {
                return Err(past_err());
            }
            pkl
        }
        _ => {
            return Err(Error::new(ErrorKind::Invalid(
                "Attention: past_key and past_value go together",
            )))
        }
    };
    let l = past.checked_add(skv).ok_or_else(overflow)?;
    if l == 0 {
        return Err(shape_err("Attention: empty key sequence"));
    }

    let nonpad = match ctx.opt_input(6) {
        None => false,
        Some(n) => {
            util::dtype_in(n.dtype, &[DType::I64], "Attention nonpad_kv_seqlen")?;
            if n.shape != [batch] {
                return Err(shape_err("Attention: nonpad_kv_seqlen must be [batch]"));
            }
            if past > 0 {
                return Err(Error::new(ErrorKind::Invalid(
                    "Attention: nonpad_kv_seqlen with a past cache",
                )));
            }
            true
        }
    };

    let mask = match ctx.opt_input(3) {
        None => None,
        Some(m) => {
            let is_bool = m.dtype == DType::Bool;
            if !is_bool && m.dtype != dt {
                return Err(Error::new(ErrorKind::DTypeMismatch {
                    expected: dt,
                    got: m.dtype,
                }));
            }
            let r = m.shape.len();
            let (Some((&cols, lead)), true) = (m.shape.split_last(), r <= 4) else {
                return Err(Error::new(ErrorKind::Rank {
                    expected: 4,
                    got: r,
                }));
            };
            if cols > l {
                return Err(shape_err("Attention: mask longer than the key sequence"));
            }
            // Right-aligned broadcast of the leading mask axes (at most 3)
            // onto (batch, q heads, q rows).
            let mut st = [0usize; 3];
            let target = [batch, hq, sq];
            let mut stride = cols;
            let axes = lead.iter().rev().zip(target.iter().rev());
            for ((&d, &t), s) in axes.zip(st.iter_mut().rev()) {
                if d == t {
                    *s = stride;
                } else if d != 1 {
                    return Err(shape_err("Attention: mask does not broadcast"));
                }
                stride = stride.checked_mul(d).ok_or_else(overflow)?;
            }
            let [sb, sh, si] = st;
            Some(Mask {
                is_bool,
                sb,
                sh,
                si,
                cols,
                numel: m.numel(),
            })
        }
    };

    let scale = ctx.attr_float("scale", f32::NAN)?;
    let scale = if scale.is_nan() {
        1.0 / libm::sqrt(dq as f64)
    } else {
        scale as f64
    };
    let sq_scale = libm::sqrt(scale) as f32;
    let softcap = ctx.attr_float("softcap", 0.0)?;
    let causal = ctx.attr_int("is_causal", 0)? != 0;
    let left = ctx.attr_int("left_window_size", -1)?;
    let right = ctx.attr_int("right_window_size", -1)?;
    if left < -1 || right < -1 {
        return Err(Error::new(ErrorKind::Attribute {
            name: "left_window_size",
            problem: "window sizes are -1 or nonnegative",
        }));
    }
    let qk_stage = match ctx.attr_int("qk_matmul_output_mode", 0)? {
        0 | 1 => Stage::Capped,
        2 => Stage::Biased,
        3 => Stage::Probs,
        _ => {
            return Err(Error::new(ErrorKind::Unsupported(
                "Attention qk_matmul_output_mode outside 0..3",
            )))
        }
    };
    let prec = match ctx.attr_int("softmax_precision", 0)? {
        0 => Prec::of(dt),
        1 | 11 => Prec::F32,
        10 => Prec::F16,
        16 => Prec::BF16,
        _ => {
            return Err(Error::new(ErrorKind::Unsupported(
                "Attention softmax_precision",
            )))
        }
    };

    let (y_shape, yl) = if rank == 3 {
        let hid = hq.checked_mul(dv).ok_or_else(overflow)?;
        (vec![batch, sq, hid], Lay::d3(hq, sq, dv)?)
    } else {
        (vec![batch, hq, sq, dv], Lay::d4(hq, sq, dv)?)
    };
    let all_out = [
        OutputInfo::new(dt, &y_shape),
        OutputInfo::new(dt, &[batch, hkv, l, dk]),
        OutputInfo::new(dt, &[batch, hkv, l, dv]),
        OutputInfo::new(dt, &[batch, hq, sq, l]),
    ];
    let n_out = ctx.num_outputs();
    if !(1..=4).contains(&n_out) {
        return Err(Error::new(ErrorKind::Invalid(
            "Attention has 1 to 4 outputs",
        )));
    }
    let outputs: Vec<OutputInfo> = all_out
        .get(..n_out)
        .ok_or(Error::internal("Attention outputs"))?
        .to_vec();

    let scr = l
        .checked_mul(2)
        .and_then(|v| v.checked_add(dk.max(dv)))
        .ok_or_else(overflow)?;
    let scratch = scr
        .checked_mul(core::mem::size_of::<f32>())
        .ok_or_else(overflow)?;
    let a = Att {
        batch,
        hq,
        hkv,
        sq,
        past,
        l,
        dk,
        dv,
        scr,
        q: ql,
        k: kl,
        v: vl,
        y: yl,
        sq_scale,
        softcap,
        causal,
        left,
        right,
        mask,
        nonpad,
        qk_stage,
        prec,
    };
    let p = match dt {
        DType::F16 => Prepared::new(
            outputs,
            kernel("Attention", move |io| run_att::<f16>(&a, io)),
        ),
        DType::BF16 => Prepared::new(
            outputs,
            kernel("Attention", move |io| run_att::<bf16>(&a, io)),
        ),
        _ => Prepared::new(
            outputs,
            kernel("Attention", move |io| run_att::<f32>(&a, io)),
        ),
    };
    Ok(p.with_scratch(scratch))
}

/// The kernel's inputs, typed and length-checked.
struct Src<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    pk: &'a [T],
    pv: &'a [T],
    mask_b: &'a [u8],
    mask_f: &'a [T],
    nonpad: &'a [i64],
}

impl<T: Fl> Src<'_, T> {
    /// Key row `j` (past rows first) of kv head `h`.
    #[inline]
    fn key(&self, a: &Att, b: usize, h: usize, j: usize) -> Result<&[T]> {
        let row = if j < a.past {
            win(self.pk, past_row(a, b, h, j, a.dk), a.dk)
        } else {
            // past <= j < l: a row of K.
            win(self.k, a.k.at(b, h, j.wrapping_sub(a.past)), a.dk)
        };
        row.ok_or(Error::internal("Attention: key row"))
    }
    /// Value row `j` (past rows first) of kv head `h`.
    #[inline]
    fn value(&self, a: &Att, b: usize, h: usize, j: usize) -> Result<&[T]> {
        let row = if j < a.past {
            win(self.pv, past_row(a, b, h, j, a.dv), a.dv)
        } else {
            // past <= j < l: a row of V.
            win(self.v, a.v.at(b, h, j.wrapping_sub(a.past)), a.dv)
        };
        row.ok_or(Error::internal("Attention: value row"))
    }
}

/// Offset of row `j` < past of kv head `h` < hkv, batch `b` < batch in a
/// `[batch, hkv, past, d]` cache: below batch · hkv · past · d, which
/// `run_att` checks against the cache (`need`), so the wrapping operations
/// are exact.
#[inline]
fn past_row(a: &Att, b: usize, h: usize, j: usize, d: usize) -> usize {
    let bh = b.wrapping_mul(a.hkv).wrapping_add(h);
    bh.wrapping_mul(a.past).wrapping_add(j).wrapping_mul(d)
}

/// [`need`] of the product of `dims`, which must fit.
fn need_n<T>(s: &[T], dims: &[usize]) -> Result<()> {
    need(s, checked_numel(dims)?)
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

fn run_att<T: Fl>(a: &Att, io: &mut KernelIo<'_>) -> Result<()> {
    let q = io.input_slice::<T>(0)?;
    let k = io.input_slice::<T>(1)?;
    let v = io.input_slice::<T>(2)?;
    need_n(q, &[a.batch, a.q.b])?;
    need_n(k, &[a.batch, a.k.b])?;
    need_n(v, &[a.batch, a.v.b])?;
    let (mut mask_b, mut mask_f): (&[u8], &[T]) = (&[], &[]);
    if let Some(m) = &a.mask {
        let t = io.input(3)?;
        if m.is_bool {
            mask_b = t.bytes();
            need(mask_b, m.numel)?;
        } else {
            mask_f = t.as_slice::<T>()?;
            need(mask_f, m.numel)?;
        }
    }
    let (mut pk, mut pv): (&[T], &[T]) = (&[], &[]);
    if a.past > 0 {
        pk = io.input_slice::<T>(4)?;
        pv = io.input_slice::<T>(5)?;
        need_n(pk, &[a.batch, a.hkv, a.past, a.dk])?;
        need_n(pv, &[a.batch, a.hkv, a.past, a.dv])?;
    }
    let mut nonpad: &[i64] = &[];
    if a.nonpad {
        nonpad = io.input_slice::<i64>(6)?;
        need(nonpad, a.batch)?;
    }
    let src = Src {
        q,
        k,
        v,
        pk,
        pv,
        mask_b,
        mask_f,
        nonpad,
    };

    for (slot, d) in [(1usize, a.dk), (2, a.dv)] {
        if !io.has_output(slot) {
            continue;
        }
        let out = io.output_slice::<T>(slot)?;
        need_n(out, &[a.batch, a.hkv, a.l, d])?;
        // Row `o` / d < batch · hkv · l: `o + d` stays within that checked
        // size, so the wrapping addition is exact.
        let mut o = 0usize;
        for b in 0..a.batch {
            for h in 0..a.hkv {
                for j in 0..a.l {
                    let row = if slot == 1 {
                        src.key(a, b, h, j)?
                    } else {
                        src.value(a, b, h, j)?
                    };
                    win_mut(out, o, d)
                        .ok_or(Error::internal("Attention: present size"))
                        .and_then(|o| copy_exact(o, row))?;
                    o = o.wrapping_add(d);
                }
            }
        }
    }

    let l = a.l;
    if io.has_output(3) {
        let (out, scratch) = io.output_and_scratch(3)?;
        let out = out.into_slice::<T>()?;
        need_n(out, &[a.batch, a.hq, a.sq, l])?;
        let sc = as_f32(scratch, a.scr)?;
        // Row `o` / l < batch · hq · sq: `o + l` stays within that checked
        // size, so the wrapping addition is exact.
        let mut o = 0usize;
        for b in 0..a.batch {
            for h in 0..a.hq {
                for i in 0..a.sq {
                    row_scores(a, &src, b, h, i, sc, a.qk_stage)?;
                    let orow =
                        win_mut(out, o, l).ok_or(Error::internal("Attention: qk output size"))?;
                    for (ov, &x) in orow.iter_mut().zip(sc.iter()) {
                        *ov = T::put(x);
                    }
                    o = o.wrapping_add(l);
                }
            }
        }
    }

    let (out, scratch) = io.output_and_scratch(0)?;
    let y = out.into_slice::<T>()?;
    need_n(y, &[a.batch, a.y.b])?;
    let sc = as_f32(scratch, a.scr)?;
    let group = div(a.hq, a.hkv, "Attention: kv heads")?;
    for b in 0..a.batch {
        for h in 0..a.hq {
            let kvh = div(h, group, "Attention: head group")?;
            for i in 0..a.sq {
                row_scores(a, &src, b, h, i, sc, Stage::Probs)?;
                // The query slot of the scratch is free now: accumulate the
                // row in f32 there, like the reference's matmul, round once.
                // The probabilities are sc[..l], the query slot sc[2l..].
                let (p, rest) = sc
                    .split_at_mut_checked(l)
                    .ok_or(Error::internal("Attention: scratch"))?;
                let acc = rest
                    .get_mut(l..)
                    .and_then(|r| r.get_mut(..a.dv))
                    .ok_or(Error::internal("Attention: scratch"))?;
                acc.fill(0.0);
                for (j, &pj) in p.iter().enumerate() {
                    for (x, vv) in acc.iter_mut().zip(src.value(a, b, kvh, j)?) {
                        *x += pj * vv.get();
                    }
                }
                let yrow = win_mut(y, a.y.at(b, h, i), a.dv)
                    .ok_or(Error::internal("Attention: output size"))?;
                for (o, x) in yrow.iter_mut().zip(acc.iter()) {
                    *o = T::put(*x);
                }
            }
        }
    }
    Ok(())
}

fn as_f32(scratch: &mut [u8], n: usize) -> Result<&mut [f32]> {
    let s: &mut [f32] =
        bytemuck::try_cast_slice_mut(scratch).map_err(|_| Error::internal("scratch alignment"))?;
    s.get_mut(..n).ok_or(Error::internal("scratch size"))
}

/// Fills `sc[..l]` with query row `i` of head `h` up to `stage`; uses
/// `sc[l..2l]` for the bias and `sc[2l..2l + dk]` for the scaled query.
fn row_scores<T: Fl>(
    a: &Att,
    src: &Src<'_, T>,
    b: usize,
    h: usize,
    i: usize,
    sc: &mut [f32],
    stage: Stage,
) -> Result<()> {
    let l = a.l;
    let scratch = || Error::internal("Attention: scratch");
    let (s, rest) = sc.split_at_mut_checked(l).ok_or_else(scratch)?;
    let (bias, qs) = rest.split_at_mut_checked(l).ok_or_else(scratch)?;
    let qs = qs.get_mut(..a.dk).ok_or_else(scratch)?;
    let kvh = div(
        h,
        div(a.hq, a.hkv, "Attention: kv heads")?,
        "Attention: head group",
    )?;
    let neg = f32::NEG_INFINITY;

    // The causal / window frontier sits `offset` keys right of the row.
    let valid = if a.nonpad {
        *src.nonpad
            .get(b)
            .ok_or(Error::internal("Attention: nonpad_kv_seqlen size"))?
    } else {
        l as i64
    };
    // `valid` is an input value: any i64.
    let offset = if a.past > 0 {
        a.past as i64
    } else if a.nonpad {
        valid.checked_sub(a.sq as i64).ok_or_else(overflow)?
    } else {
        0
    };
    let pos = (i as i64).checked_add(offset).ok_or_else(overflow)?;
    // The mask's row (missing columns count as masked), then the frontier.
    match &a.mask {
        Some(m) => {
            // b < batch, h < hq, i < sq on the mask's own strides (0 where
            // broadcast): the row ends within the mask's numel, checked
            // against the input (`need`), so the wrapping operations are
            // exact.
            let bh = b.wrapping_mul(m.sb).wrapping_add(h.wrapping_mul(m.sh));
            let r = bh.wrapping_add(i.wrapping_mul(m.si));
            let mask_err = || Error::internal("Attention: mask size");
            let (present, missing) = bias.split_at_mut_checked(m.cols).ok_or_else(mask_err)?;
            missing.fill(neg);
            if m.is_bool {
                let row = win(src.mask_b, r, m.cols).ok_or_else(mask_err)?;
                for (x, &mv) in present.iter_mut().zip(row) {
                    *x = if mv == 0 { neg } else { 0.0 };
                }
            } else {
                let row = win(src.mask_f, r, m.cols).ok_or_else(mask_err)?;
                for (x, mv) in present.iter_mut().zip(row) {
                    *x = mv.get();
                }
            }
        }
        None => bias.fill(0.0),
    }
    for (j, x) in bias.iter_mut().enumerate() {
        let jj = j as i64;
        // pos - jj > left and jj - pos > right. As jj >= 0, pos - jj can
        // only overflow below i64::MIN (not past the window's left edge)
        // and jj - pos only above i64::MAX (past the right edge).
        let blocked = (a.causal && jj > pos)
            || (a.left >= 0 && pos.checked_sub(jj).is_some_and(|d| d > a.left))
            || (a.right >= 0 && jj.checked_sub(pos).is_none_or(|d| d > a.right))
            || jj >= valid;
        if blocked {
            *x += neg;
        }
    }
    let all_masked = bias.iter().all(|&x| x == neg);

    let sqs = T::rt(a.sq_scale);
    let qrow = win(src.q, a.q.at(b, h, i), a.dk).ok_or(Error::internal("Attention: query row"))?;
    for (x, qv) in qs.iter_mut().zip(qrow) {
        *x = T::rt(qv.get() * sqs);
    }
    let cap = T::rt(a.softcap);
    for (j, sj) in s.iter_mut().enumerate() {
        let kr = src.key(a, b, kvh, j)?;
        let mut acc = 0.0f32;
        for (&qv, kv) in qs.iter().zip(kr) {
            acc += qv * T::rt(kv.get() * sqs);
        }
        let mut x = T::rt(acc);
        if a.softcap > 0.0 {
            x = T::rt(T::rt(math::tanh(T::rt(x / cap))) * cap);
        }
        *sj = x;
    }
    if stage == Stage::Capped {
        return Ok(());
    }
    for (x, &bj) in s.iter_mut().zip(bias.iter()) {
        *x = T::rt(*x + bj);
    }
    if stage == Stage::Biased {
        return Ok(());
    }

    let p = a.prec;
    let mut mx = neg;
    for x in s.iter_mut() {
        *x = p.round(*x);
        if x.is_nan() || mx.is_nan() {
            mx = f32::NAN;
        } else if *x > mx {
            mx = *x;
        }
    }
    if mx == neg {
        mx = 0.0;
    }
    let mut sum = 0.0f32;
    for x in s.iter_mut() {
        *x = p.round(math::exp(p.round(*x - mx)));
        // numpy sums f16 in f32, but bf16 (an ml_dtypes type) one rounded
        // add at a time.
        sum = if p == Prec::BF16 {
            p.round(sum + *x)
        } else {
            sum + *x
        };
    }
    let mut sum = p.round(sum);
    if sum == 0.0 {
        sum = 1.0;
    }
    for x in s.iter_mut() {
        *x = if all_masked {
            0.0
        } else {
            T::rt(p.round(*x / sum))
        };
    }
    Ok(())
}

#[derive(Clone, Copy, Debug)]
struct Rot {
    batch: usize,
    heads: usize,
    seq: usize,
    d: usize,
    x: Lay,
    half: usize,
    /// rotary_embedding_dim: 2 · half.
    rd: usize,
    interleaved: bool,
    /// Cache rows: by position id when present, else (batch, seq) strides.
    pos_ids: bool,
    pb: usize,
    ps: usize,
    cache_rows: usize,
    cb: usize,
    cs: usize,
}

fn prepare_rotary(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, FLOATS, "RotaryEmbedding")?;
    let dt = x.dtype;
    let cos = ctx.input(1)?;
    let sin = ctx.input(2)?;
    if cos.dtype != dt || sin.dtype != dt {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: dt,
            got: if cos.dtype != dt {
                cos.dtype
            } else {
                sin.dtype
            },
        }));
    }
    if cos.shape != sin.shape {
        return Err(shape_err("RotaryEmbedding: cos and sin caches differ"));
    }
    let (batch, heads, seq, d, xl) = match *x.shape {
        [b, h, s, d] => (b, h, s, d, Lay::d4(h, s, d)?),
        [b, s, hid] => {
            let nh = ctx.attr_int("num_heads", 0)?;
            if nh <= 0 || !divides(hid, nh as usize) {
                return Err(Error::new(ErrorKind::Attribute {
                    name: "num_heads",
                    problem: "3D input needs num_heads dividing the hidden size",
                }));
            }
            let h = nh as usize;
            let d = div(hid, h, "num_heads")?;
            (b, h, s, d, Lay::d3(h, s, d)?)
        }
        _ => {
            return Err(Error::new(ErrorKind::Rank {
                expected: 4,
                got: x.shape.len(),
            }))
        }
    };
    let rd = ctx.attr_int("rotary_embedding_dim", 0)?;
    let rd = if rd <= 0 { d } else { rd as usize };
    if rd > d || rd % 2 != 0 {
        return Err(Error::new(ErrorKind::Attribute {
            name: "rotary_embedding_dim",
            problem: "must be even and at most the head size",
        }));
    }
    let half = rd / 2;
    if cos.shape.last() != Some(&half) {
        return Err(shape_err(
            "RotaryEmbedding: cache width must be rotary_embedding_dim / 2",
        ));
    }
    let bcast = |dim: usize, n: usize, stride: usize| -> Result<usize> {
        if dim == n {
            Ok(stride)
        } else if dim == 1 {
            Ok(0)
        } else {
            Err(shape_err("RotaryEmbedding: batch / sequence sizes"))
        }
    };
    let (pos_ids, pb, ps, cache_rows, cb, cs) = match ctx.opt_input(3) {
        Some(p) => {
            util::dtype_in(p.dtype, &[DType::I64], "RotaryEmbedding position_ids")?;
            let (&[p_b, p_s], &[rows, _]) = (p.shape, cos.shape) else {
                return Err(shape_err(
                    "RotaryEmbedding: position_ids [batch, seq] with a 2D cache",
                ));
            };
            let pb = bcast(p_b, batch, p_s)?;
            let ps = bcast(p_s, seq, 1)?;
            (true, pb, ps, rows, 0, 0)
        }
        None => {
            let &[c_b, c_s, _] = cos.shape else {
                return Err(shape_err(
                    "RotaryEmbedding: without position_ids the cache is [batch, seq, dim/2]",
                ));
            };
            let row = c_s.checked_mul(half).ok_or_else(overflow)?;
            let cb = bcast(c_b, batch, row)?;
            let cs = bcast(c_s, seq, half)?;
            (false, 0, 0, 0, cb, cs)
        }
    };
    let r = Rot {
        batch,
        heads,
        seq,
        d,
        x: xl,
        half,
        rd,
        interleaved: ctx.attr_int("interleaved", 0)? != 0,
        pos_ids,
        pb,
        ps,
        cache_rows,
        cb,
        cs,
    };
    let shape = x.shape;
    Ok(match dt {
        DType::F16 => Prepared::single(
            dt,
            shape,
            kernel("RotaryEmbedding", move |io| run_rot::<f16>(&r, io)),
        ),
        DType::BF16 => Prepared::single(
            dt,
            shape,
            kernel("RotaryEmbedding", move |io| run_rot::<bf16>(&r, io)),
        ),
        _ => Prepared::single(
            dt,
            shape,
            kernel("RotaryEmbedding", move |io| run_rot::<f32>(&r, io)),
        ),
    })
}

fn run_rot<T: Fl>(r: &Rot, io: &mut KernelIo<'_>) -> Result<()> {
    let x = io.input_slice::<T>(0)?;
    let cos = io.input_slice::<T>(1)?;
    let sin = io.input_slice::<T>(2)?;
    let pos: &[i64] = if r.pos_ids {
        io.input_slice::<i64>(3)?
    } else {
        &[]
    };
    if r.batch == 0 || r.seq == 0 {
        return Ok(());
    }
    let n = checked_numel(&[r.batch, r.x.b])?;
    need(x, n)?;
    // The offset of the last (batch, seq) element on strides (sb, ss), plus
    // `len`: batch and seq are at least 1 here.
    let end = |sb: usize, ss: usize, len: usize| -> Result<usize> {
        r.batch
            .wrapping_sub(1)
            .checked_mul(sb)
            .zip(r.seq.wrapping_sub(1).checked_mul(ss))
            .and_then(|(a, b)| a.checked_add(b))
            .and_then(|v| v.checked_add(len))
            .ok_or_else(overflow)
    };
    if r.pos_ids {
        need(pos, end(r.pb, r.ps, 1)?)?;
        need_n(cos, &[r.cache_rows, r.half])?;
        need_n(sin, &[r.cache_rows, r.half])?;
    } else {
        let m = end(r.cb, r.cs, r.half)?;
        need(cos, m)?;
        need(sin, m)?;
    }
    let y = io.output_slice::<T>(0)?;
    need(y, n)?;
    // Every offset below is exact, wrapping by name only: b < batch and
    // s < seq keep position and cache offsets within the sizes checked
    // above, p < cache_rows keeps p · half below cache_rows · half, and
    // rows of X and Y end within batch · x.b.
    let size = || Error::internal("RotaryEmbedding size");
    // One rotated pair (x1, x2) by the angle of (cos, sin).
    let rot = |c: &T, sn: &T, x1: &T, x2: &T| {
        let (c, sn, x1, x2) = (c.get(), sn.get(), x1.get(), x2.get());
        (
            T::put(T::rt(c * x1) - T::rt(sn * x2)),
            T::put(T::rt(sn * x1) + T::rt(c * x2)),
        )
    };
    for b in 0..r.batch {
        for s in 0..r.seq {
            let c0 = if r.pos_ids {
                let at = b.wrapping_mul(r.pb).wrapping_add(s.wrapping_mul(r.ps));
                let p = *pos.get(at).ok_or_else(size)?;
                if p < 0 || p as usize >= r.cache_rows {
                    return Err(Error::new(ErrorKind::Invalid(
                        "RotaryEmbedding: position id outside the cache",
                    )));
                }
                (p as usize).wrapping_mul(r.half)
            } else {
                b.wrapping_mul(r.cb).wrapping_add(s.wrapping_mul(r.cs))
            };
            let cr = win(cos, c0, r.half).ok_or_else(size)?;
            let sr = win(sin, c0, r.half).ok_or_else(size)?;
            for h in 0..r.heads {
                let o = r.x.at(b, h, s);
                let xr = win(x, o, r.d).ok_or_else(size)?;
                let yr = win_mut(y, o, r.d).ok_or_else(size)?;
                yr.copy_from_slice(xr);
                // Pairs (2t, 2t + 1) when interleaved, else (t, t + half),
                // for t < half; the rest of the row passes through.
                if r.interleaved {
                    let rd = r.rd;
                    let xp: &[[T; 2]] = bytemuck::try_cast_slice(xr.get(..rd).ok_or_else(size)?)
                        .map_err(|_| size())?;
                    let yp: &mut [[T; 2]] =
                        bytemuck::try_cast_slice_mut(yr.get_mut(..rd).ok_or_else(size)?)
                            .map_err(|_| size())?;
                    for ((([y1, y2], [x1, x2]), c), sn) in yp.iter_mut().zip(xp).zip(cr).zip(sr) {
                        (*y1, *y2) = rot(c, sn, x1, x2);
                    }
                } else {
                    let (x_lo, x_rest) = xr.split_at_checked(r.half).ok_or_else(size)?;
                    let (y_lo, y_rest) = yr.split_at_mut_checked(r.half).ok_or_else(size)?;
                    let x_hi = x_rest.get(..r.half).ok_or_else(size)?;
                    let pairs = y_lo
                        .iter_mut()
                        .zip(y_rest.iter_mut())
                        .zip(x_lo.iter().zip(x_hi));
                    for (((y1, y2), (x1, x2)), (c, sn)) in pairs.zip(cr.iter().zip(sr)) {
                        (*y1, *y2) = rot(c, sn, x1, x2);
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;

    /// `assert_close`, with infinities required to match exactly.
    fn close_inf(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            if w.is_infinite() {
                assert_eq!(g, w);
            }
        }
        let fin = |v: &[f32], w: &[f32]| -> Vec<f32> {
            v.iter()
                .zip(w)
                .filter(|(_, w)| w.is_finite())
                .map(|(x, _)| *x)
                .collect()
        };
        assert_close(&fin(got, want), &fin(want, want), 1e-6);
    }

    #[test]
    fn single_query_by_hand() {
        // q = [1, 0] against keys [1, 0], [0, 1]: scores 1/sqrt(2) and 0.
        let r = run(
            "Attention",
            23,
            vec![],
            &[
                t(&[1, 1, 1, 2], &[1.0f32, 0.0]),
                t(&[1, 1, 2, 2], &[1.0f32, 0.0, 0.0, 1.0]),
                t(&[1, 1, 2, 2], &[1.0f32, 2.0, 3.0, 4.0]),
            ],
            1,
        )
        .unwrap();
        let e = libm::expf(core::f32::consts::FRAC_1_SQRT_2);
        let (p0, p1) = (e / (e + 1.0), 1.0 / (e + 1.0));
        assert_eq!(r[0].shape, vec![1, 1, 1, 2]);
        assert_close(
            &vals::<f32>(&r[0]),
            &[p0 + 3.0 * p1, 2.0 * p0 + 4.0 * p1],
            0.0,
        );
    }

    #[test]
    fn gqa_3d_causal_past_mask_and_qk_bias() {
        // Expected values from onnx.reference's _compute_attention.
        let r = run(
            "Attention",
            23,
            vec![
                ("is_causal", AttrValue::Int(1)),
                ("q_num_heads", AttrValue::Int(2)),
                ("kv_num_heads", AttrValue::Int(1)),
                ("qk_matmul_output_mode", AttrValue::Int(2)),
            ],
            &[
                t(
                    &[1, 2, 4],
                    &[-0.5f32, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25],
                ),
                t(&[1, 2, 2], &[-0.3f32, 0.2, 0.7, 1.2]),
                t(&[1, 2, 2], &[1.0f32, 2.0, 3.0, 4.0]),
                t(&[2, 3], &[0.0f32, -0.5, 0.25, 0.1, 0.0, 0.0]),
                t(&[1, 1, 1, 2], &[0.2f32, -0.4]),
                t(&[1, 1, 1, 2], &[-1.0f32, 2.0]),
            ],
            4,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 2, 4]);
        assert_close(
            &vals::<f32>(&r[0]),
            &[
                -0.2114079, 2.0, -0.1944587, 2.0, 1.6671023, 3.1052253, 2.165379, 3.4363773,
            ],
            1e-6,
        );
        assert_eq!(r[1].shape, vec![1, 1, 3, 2]);
        assert_close(&vals::<f32>(&r[1]), &[0.2, -0.4, -0.3, 0.2, 0.7, 1.2], 0.0);
        assert_close(&vals::<f32>(&r[2]), &[-1.0, 2.0, 1.0, 2.0, 3.0, 4.0], 0.0);
        assert_eq!(r[3].shape, vec![1, 2, 2, 3]);
        let inf = f32::INFINITY;
        close_inf(
            &vals::<f32>(&r[3]),
            &[
                7.45e-11, -0.4292893, -inf, -0.0414214, -1.05e-8, 0.8838835, -0.0707107,
                -0.4646447, -inf, -0.112132, -0.0353554, 1.555635,
            ],
        );
    }

    #[test]
    fn window_nonpad_softcap_scale() {
        // Expected values from onnx.reference's _compute_attention.
        let lin = |a: f32, b: f32, n: usize| -> Vec<f32> {
            (0..n)
                .map(|i| a + (b - a) * i as f32 / (n - 1) as f32)
                .collect()
        };
        let r = run(
            "Attention",
            25,
            vec![
                ("is_causal", AttrValue::Int(1)),
                ("left_window_size", AttrValue::Int(1)),
                ("scale", AttrValue::Float(0.5)),
                ("softcap", AttrValue::Float(2.0)),
            ],
            &[
                t(&[1, 1, 4, 2], &lin(-1.0, 1.0, 8)),
                t(&[1, 1, 5, 2], &lin(0.5, -0.5, 10)),
                t(&[1, 1, 5, 2], &lin(1.0, 3.0, 10)),
                None,
                None,
                None,
                t(&[1], &[4i64]),
            ],
            1,
        )
        .unwrap();
        assert_close(
            &vals::<f32>(&r[0]),
            &[
                1.0, 1.2222222, 1.2292552, 1.4514774, 1.659616, 1.8818382, 2.0900822, 2.3123045,
            ],
            1e-6,
        );
    }

    #[test]
    fn fully_masked_row_is_zero_and_mode3() {
        // Row 0 has no allowed key: Y and the probabilities are 0, not NaN.
        let r = run(
            "Attention",
            23,
            vec![("qk_matmul_output_mode", AttrValue::Int(3))],
            &[
                t(&[1, 1, 2, 1], &[1.0f32, 2.0]),
                t(&[1, 1, 2, 1], &[1.0f32, 1.0]),
                t(&[1, 1, 2, 1], &[5.0f32, 7.0]),
                t::<u8>(&[2, 2], &[0, 0, 1, 1]).map(|mut c| {
                    c.dtype = crate::DType::Bool;
                    c
                }),
            ],
            4,
        )
        .unwrap();
        // Equal keys: row 1 averages the values.
        assert_close(&vals::<f32>(&r[0]), &[0.0, 6.0], 0.0);
        assert_close(&vals::<f32>(&r[3]), &[0.0, 0.0, 0.5, 0.5], 0.0);
    }

    #[test]
    fn rotary_by_hand() {
        // One head of size 4 at one position; angle a: cos c, sin s.
        let (c, s) = (0.6f32, 0.8f32);
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let caches = |interleaved: i64| {
            run(
                "RotaryEmbedding",
                23,
                vec![("interleaved", AttrValue::Int(interleaved))],
                &[
                    t(&[1, 1, 1, 4], &x),
                    t(&[1, 1, 2], &[c, 1.0]),
                    t(&[1, 1, 2], &[s, 0.0]),
                ],
                1,
            )
            .unwrap()
        };
        // Halves: pairs (x0, x2) rotate by (c, s), (x1, x3) by angle 0.
        let r = caches(0);
        assert_close(
            &vals::<f32>(&r[0]),
            &[c * 1.0 - s * 3.0, 2.0, s * 1.0 + c * 3.0, 4.0],
            1e-6,
        );
        // Interleaved: pairs (x0, x1) and (x2, x3).
        let r = caches(1);
        assert_close(
            &vals::<f32>(&r[0]),
            &[c * 1.0 - s * 2.0, s * 1.0 + c * 2.0, 3.0, 4.0],
            1e-6,
        );
    }

    #[test]
    fn rotary_position_ids_partial_3d() {
        // 3D input, 2 heads of size 4, rotating only the first 2 dims, with
        // the cache row picked by position id 1.
        let r = run(
            "RotaryEmbedding",
            23,
            vec![
                ("num_heads", AttrValue::Int(2)),
                ("rotary_embedding_dim", AttrValue::Int(2)),
            ],
            &[
                t(&[1, 1, 8], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
                t(&[2, 1], &[1.0f32, 0.0]),
                t(&[2, 1], &[0.0f32, 1.0]),
                t(&[1, 1], &[1i64]),
            ],
            1,
        )
        .unwrap();
        // cos 0, sin 1: (x0, x1) -> (-x1, x0).
        assert_close(
            &vals::<f32>(&r[0]),
            &[-2.0, 1.0, 3.0, 4.0, -6.0, 5.0, 7.0, 8.0],
            0.0,
        );
    }

    #[test]
    fn rejects_bad_heads() {
        let r = run(
            "Attention",
            23,
            vec![
                ("q_num_heads", AttrValue::Int(3)),
                ("kv_num_heads", AttrValue::Int(2)),
            ],
            &[
                t(&[1, 1, 6], &[0.0f32; 6]),
                t(&[1, 1, 4], &[0.0f32; 4]),
                t(&[1, 1, 4], &[0.0f32; 4]),
            ],
            1,
        );
        assert!(r.is_err());
    }
}
