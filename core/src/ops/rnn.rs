//! Recurrent layers: RNN, GRU, LSTM (opsets 7 to 22), float32.
//!
//! One kernel walks every direction and time step. Per step it computes the
//! input and recurrent projections of all gates with [`sgemm`] into scratch,
//! then combines them element by element. The hidden (and cell) state of
//! each direction lives in scratch too, in `[num_directions, batch, hidden]`
//! order whatever the layout, and is copied to `Y_h` / `Y_c` at the end.
//!
//! `sequence_lens` follows onnxruntime: a batch entry with length `L` only
//! steps through `t < L` (reverse starts at `L - 1`), its state stays put
//! afterwards and its `Y` rows past `L` are zero.

use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::kern::{win, win_mut};
use crate::math;
use crate::model::AttrValue;
use crate::ops::matmul::sgemm;
use crate::ops::util::{row, row_mut};
use crate::ops::{kernel, util, KernelIo, OpDef, OutputInfo, PrepareCtx, Prepared};
use crate::tensor::copy_exact;
use crate::tensor::TensorView;
use crate::DType;
use alloc::vec::Vec;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("RNN", 7, prepare_rnn),
    OpDef::onnx("GRU", 7, prepare_gru),
    OpDef::onnx("LSTM", 7, prepare_lstm),
];

fn shape_err(s: &'static str) -> Error {
    Error::new(ErrorKind::Shape(s))
}

/// A peephole row, or zeros where there is none (P is optional).
fn peeps(p: Option<&[f32]>) -> impl Iterator<Item = f32> + '_ {
    p.into_iter()
        .flatten()
        .copied()
        .chain(core::iter::repeat(0.0))
}

/// An activation function of the `activations` attribute.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    Relu,
    Tanh,
    Sigmoid,
    Affine(f32, f32),
    LeakyRelu(f32),
    ThresholdedRelu(f32),
    ScaledTanh(f32, f32),
    HardSigmoid(f32, f32),
    Elu(f32),
    Softsign,
    Softplus,
}

impl Act {
    #[inline]
    fn apply(self, x: f32) -> f32 {
        match self {
            Act::Relu => x.max(0.0),
            Act::Tanh => math::tanh(x),
            Act::Sigmoid => math::sigmoid(x),
            Act::Affine(a, b) => a * x + b,
            Act::LeakyRelu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            Act::ThresholdedRelu(a) => {
                if x > a {
                    x
                } else {
                    0.0
                }
            }
            Act::ScaledTanh(a, b) => a * math::tanh(b * x),
            Act::HardSigmoid(a, b) => (a * x + b).clamp(0.0, 1.0),
            Act::Elu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * (math::exp(x) - 1.0)
                }
            }
            Act::Softsign => x / (1.0 + math::abs(x)),
            Act::Softplus => {
                // log(1 + e^x) without overflow for large x.
                if x > 0.0 {
                    x + libm::log1pf(math::exp(-x))
                } else {
                    libm::log1pf(math::exp(x))
                }
            }
        }
    }

    /// Parses one name; `alpha` / `beta` supply the next listed values to
    /// the functions that take them (the order onnxruntime consumes them
    /// in), else the defaults of the matching ONNX operators.
    fn parse(
        name: &[u8],
        alpha: &mut impl Iterator<Item = f32>,
        beta: &mut impl Iterator<Item = f32>,
    ) -> Result<Act> {
        let mut buf = [0u8; 16];
        if name.len() > buf.len() {
            return Err(Error::new(ErrorKind::Unsupported(
                "RNN activation function name",
            )));
        }
        for (o, c) in buf.iter_mut().zip(name) {
            *o = c.to_ascii_lowercase();
        }
        let mut a = |d: f32| alpha.next().unwrap_or(d);
        let name = buf
            .get(..name.len())
            .ok_or(Error::internal("RNN activation name"))?;
        Ok(match name {
            b"relu" => Act::Relu,
            b"tanh" => Act::Tanh,
            b"sigmoid" => Act::Sigmoid,
            b"affine" => Act::Affine(a(1.0), beta.next().unwrap_or(0.0)),
            b"leakyrelu" => Act::LeakyRelu(a(0.01)),
            b"thresholdedrelu" => Act::ThresholdedRelu(a(1.0)),
            b"scaledtanh" => Act::ScaledTanh(a(1.0), beta.next().unwrap_or(1.0)),
            b"hardsigmoid" => Act::HardSigmoid(a(0.2), beta.next().unwrap_or(0.5)),
            b"elu" => Act::Elu(a(1.0)),
            b"softsign" => Act::Softsign,
            b"softplus" => Act::Softplus,
            _ => {
                return Err(Error::new(ErrorKind::Unsupported(
                    "RNN activation function",
                )))
            }
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cell {
    Rnn,
    Gru { linear_before_reset: bool },
    Lstm { input_forget: bool },
}

impl Cell {
    fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru { .. } => 3,
            Cell::Lstm { .. } => 4,
        }
    }
    fn num_acts(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru { .. } => 2,
            Cell::Lstm { .. } => 3,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Cell::Rnn => "RNN",
            Cell::Gru { .. } => "GRU",
            Cell::Lstm { .. } => "LSTM",
        }
    }
}

/// Everything the kernel needs, fixed at prepare.
#[derive(Clone, Copy, Debug)]
struct Plan {
    cell: Cell,
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    ndir: usize,
    /// Per direction: steps run from the last time step to the first.
    reverse: [bool; 2],
    /// Per direction: f, g, h (only the first `num_acts` are used).
    acts: [[Act; 3]; 2],
    clip: Option<f32>,
    /// `layout = 1`: batch is the leading axis of X, Y, Y_h, Y_c.
    batch_major: bool,
}

/// The kernel's inputs, as slices.
struct Inputs<'a> {
    x: &'a [f32],
    w: &'a [f32],
    r: &'a [f32],
    b: Option<&'a [f32]>,
    lens: Option<TensorView<'a>>,
    h0: Option<&'a [f32]>,
    c0: Option<&'a [f32]>,
    p: Option<&'a [f32]>,
}

// Every size below and every offset built from indices under the sizes it
// is made of stays below a product that `Plan::scratch_len` checks at
// prepare (the scratch, Y's or X's element count, a row of W, R or B): the
// wrapping operations of the kernel are exact, wrapping by name only.
impl Plan {
    /// gates · hidden.
    fn gh(&self) -> usize {
        self.cell.gates().wrapping_mul(self.hidden)
    }
    /// ndir · batch · hidden.
    fn state_len(&self) -> usize {
        self.ndir.wrapping_mul(self.batch).wrapping_mul(self.hidden)
    }
    /// Offset in scratch of the gx, gh and tmp parts' end: the h state
    /// starts there, the c state one state length later.
    fn states_at(&self) -> usize {
        let bsz = self.batch;
        bsz.wrapping_mul(self.gh())
            .wrapping_mul(2)
            .wrapping_add(bsz.wrapping_mul(self.hidden))
    }
    /// Scratch in f32 units: gx, gh (batch x gates*hidden), tmp (batch x
    /// hidden), h and c state (ndir x batch x hidden). Checks, once at
    /// prepare, the products that bound the kernel's index math (an
    /// `Overflow` error where one does not fit).
    fn scratch_len(&self) -> Result<usize> {
        let overflow = || Error::new(ErrorKind::Overflow);
        let gh = self
            .cell
            .gates()
            .checked_mul(self.hidden)
            .ok_or_else(overflow)?;
        // Rows of W, R and B, per direction.
        for n in [self.input, self.hidden, 2] {
            gh.checked_mul(n).ok_or_else(overflow)?;
        }
        checked_numel(&[self.seq, self.batch, self.input])?;
        checked_numel(&[self.seq, self.ndir, self.batch, self.hidden])?;
        let gates = checked_numel(&[2, self.batch, gh])?;
        let tmp = checked_numel(&[self.batch, self.hidden])?;
        let states = checked_numel(&[2, self.ndir, self.batch, self.hidden])?;
        gates
            .checked_add(tmp)
            .and_then(|v| v.checked_add(states))
            .ok_or_else(overflow)
    }
    /// Offset in Y_h / Y_c / initial_h / initial_c of (direction, batch):
    /// below state_len.
    fn state_off(&self, d: usize, b: usize) -> usize {
        let (outer, n, inner) = if self.batch_major {
            (b, self.ndir, d)
        } else {
            (d, self.batch, b)
        };
        outer
            .wrapping_mul(n)
            .wrapping_add(inner)
            .wrapping_mul(self.hidden)
    }
    /// Offset in Y of (time, direction, batch): below Y's element count.
    fn y_off(&self, t: usize, d: usize, b: usize) -> usize {
        // ((i0 · n1 + i1) · n2 + i2) · hidden
        let ((i0, n1), (i1, n2), i2) = if self.batch_major {
            ((b, self.seq), (t, self.ndir), d)
        } else {
            ((t, self.ndir), (d, self.batch), b)
        };
        i0.wrapping_mul(n1)
            .wrapping_add(i1)
            .wrapping_mul(n2)
            .wrapping_add(i2)
            .wrapping_mul(self.hidden)
    }
    #[inline]
    fn clip(&self, x: f32) -> f32 {
        match self.clip {
            // Comparisons rather than min/max so that NaN propagates.
            Some(c) if x > c => c,
            Some(c) if x < -c => -c,
            _ => x,
        }
    }

    fn run(&self, inp: &Inputs<'_>, mut y: Option<&mut [f32]>, s: &mut [f32]) -> Result<()> {
        let (bsz, hid, inz, gh) = (self.batch, self.hidden, self.input, self.gh());
        // Below scratch_len (checked at prepare): see the note on `Plan`.
        let (bgh, bh) = (bsz.wrapping_mul(gh), bsz.wrapping_mul(hid));
        let hid2 = hid.wrapping_mul(2); // <= 2 · gh
        let scratch = Error::internal("RNN scratch");
        let (gx, s) = s.split_at_mut_checked(bgh).ok_or(scratch)?;
        let (ghb, s) = s.split_at_mut_checked(bgh).ok_or(scratch)?;
        let (tmp, s) = s.split_at_mut_checked(bh).ok_or(scratch)?;
        let (hs, s) = s.split_at_mut_checked(self.state_len()).ok_or(scratch)?;
        let cs = s.get_mut(..self.state_len()).ok_or(scratch)?;
        for d in 0..self.ndir {
            for b in 0..bsz {
                let so = self.state_off(d, b);
                let sr = d.wrapping_mul(bsz).wrapping_add(b); // < ndir · batch
                let hrow = row_mut(hs, sr, hid)?;
                match inp.h0 {
                    Some(h0) => hrow.copy_from_slice(
                        win(h0, so, hid).ok_or(Error::internal("RNN initial_h row"))?,
                    ),
                    None => hrow.fill(0.0),
                }
                let crow = row_mut(cs, sr, hid)?;
                match inp.c0 {
                    Some(c0) => crow.copy_from_slice(
                        win(c0, so, hid).ok_or(Error::internal("RNN initial_c row"))?,
                    ),
                    None => crow.fill(0.0),
                }
            }
        }
        // Read per use from the tensor: values are only known at run time.
        let len_of = |b: usize| -> Result<usize> {
            match &inp.lens {
                None => Ok(self.seq),
                Some(v) => {
                    let l = v.int_at(b).ok_or(Error::internal("sequence_lens read"))?;
                    if l < 0 || l as u64 > self.seq as u64 {
                        return Err(Error::new(ErrorKind::Invalid(
                            "sequence_lens value outside [0, seq_length]",
                        )));
                    }
                    Ok(l as usize)
                }
            }
        };
        // Y row (time, direction, batch): the new hidden state where the
        // batch entry is still running, else zeros.
        let mut put_y = |t: usize, d: usize, b: usize, h: &[f32], active: bool| -> Result<()> {
            if let Some(y) = y.as_deref_mut() {
                let yr =
                    win_mut(y, self.y_off(t, d, b), hid).ok_or(Error::internal("RNN Y row"))?;
                if active {
                    copy_exact(yr, h)?;
                } else {
                    yr.fill(0.0);
                }
            }
            Ok(())
        };
        for d in 0..self.ndir {
            let w = row(inp.w, d, gh.wrapping_mul(inz))?;
            let r = row(inp.r, d, gh.wrapping_mul(hid))?;
            let bias: &[f32] = match inp.b {
                Some(b) => row(b, d, gh.wrapping_mul(2))?,
                None => &[],
            };
            // B is optional: without it both biases are zero. The gate
            // index k is below gh: gh + k below 2 · gh.
            let wb = |k: usize| bias.get(k).copied().unwrap_or(0.0);
            let rb = |k: usize| bias.get(gh.wrapping_add(k)).copied().unwrap_or(0.0);
            // Peepholes of the input, output and forget gates.
            let (p_i, p_o, p_f) = match inp.p {
                Some(p) => {
                    // Only LSTM has P: 3 · hidden <= gh = 4 · hidden.
                    let pd = row(p, d, hid.wrapping_mul(3))?;
                    (
                        Some(row(pd, 0, hid)?),
                        Some(row(pd, 1, hid)?),
                        Some(row(pd, 2, hid)?),
                    )
                }
                None => (None, None, None),
            };
            let [fa, ga, ha] = *self.acts.get(d).ok_or(Error::internal("RNN direction"))?;
            let reverse = *self
                .reverse
                .get(d)
                .ok_or(Error::internal("RNN direction"))?;
            let h = row_mut(hs, d, bh)?;
            let c = row_mut(cs, d, bh)?;
            for step in 0..self.seq {
                // step < seq: seq - 1 - step does not wrap.
                let t = if reverse {
                    self.seq.wrapping_sub(1).wrapping_sub(step)
                } else {
                    step
                };
                // t < seq: offsets below X's element count.
                let (xa, lda) = if self.batch_major {
                    (inp.x.get(t.wrapping_mul(inz)..), self.seq.wrapping_mul(inz))
                } else {
                    (inp.x.get(t.wrapping_mul(bsz).wrapping_mul(inz)..), inz)
                };
                let xa = xa.ok_or(Error::internal("RNN X offset"))?;
                sgemm(bsz, gh, inz, xa, lda, false, w, inz, true, gx, gh, 1.0, 0.0)?;
                // GRU without linear_before_reset needs (r * H) first, so its
                // hidden-gate recurrent product waits.
                let n_rec = match self.cell {
                    Cell::Gru {
                        linear_before_reset: false,
                    } => hid2,
                    _ => gh,
                };
                sgemm(
                    bsz, n_rec, hid, h, hid, false, r, hid, true, ghb, gh, 1.0, 0.0,
                )?;
                match self.cell {
                    Cell::Rnn => {
                        for b in 0..bsz {
                            let active = t < len_of(b)?;
                            let hr = row_mut(h, b, hid)?;
                            let gates = row(gx, b, hid)?.iter().zip(row(ghb, b, hid)?);
                            for (j, ((&x, &hh), hk)) in gates.zip(hr.iter_mut()).enumerate() {
                                let v = fa.apply(self.clip(x + hh + wb(j) + rb(j)));
                                if active {
                                    *hk = v;
                                }
                            }
                            put_y(t, d, b, hr, active)?;
                        }
                    }
                    Cell::Lstm { input_forget } => {
                        for b in 0..bsz {
                            let active = t < len_of(b)?;
                            // Pre-activations of the gates i, o, f, c in
                            // place: both products and both biases.
                            let pre = row_mut(gx, b, gh)?;
                            for (q, (x, &hh)) in pre.iter_mut().zip(row(ghb, b, gh)?).enumerate() {
                                *x = *x + hh + wb(q) + rb(q);
                            }
                            let pre = &*pre;
                            let gates = row(pre, 0, hid)?
                                .iter()
                                .zip(row(pre, 1, hid)?)
                                .zip(row(pre, 2, hid)?)
                                .zip(row(pre, 3, hid)?);
                            let peep = peeps(p_i).zip(peeps(p_o)).zip(peeps(p_f));
                            let hr = row_mut(h, b, hid)?;
                            let state = row_mut(c, b, hid)?.iter_mut().zip(hr.iter_mut());
                            for (((((&pi, &po), &pf), &pc), ((ppi, ppo), ppf)), (ck, hk)) in
                                gates.zip(peep).zip(state)
                            {
                                let cp = *ck;
                                let ig = fa.apply(self.clip(pi + ppi * cp));
                                let fg = if input_forget {
                                    1.0 - ig
                                } else {
                                    fa.apply(self.clip(pf + ppf * cp))
                                };
                                let cc = ga.apply(self.clip(pc));
                                let cn = fg * cp + ig * cc;
                                let og = fa.apply(self.clip(po + ppo * cn));
                                let hn = og * ha.apply(cn);
                                if active {
                                    *ck = cn;
                                    *hk = hn;
                                }
                            }
                            put_y(t, d, b, hr, active)?;
                        }
                    }
                    Cell::Gru {
                        linear_before_reset,
                    } => {
                        // z and r overwrite their pre-activations in gx.
                        for b in 0..bsz {
                            let zr = row_mut(gx, b, gh)?
                                .get_mut(..hid2)
                                .ok_or(Error::internal("GRU gates"))?;
                            let zr_h = row(ghb, b, gh)?;
                            for (q, (x, &hh)) in zr.iter_mut().zip(zr_h).enumerate() {
                                *x = fa.apply(self.clip(*x + hh + wb(q) + rb(q)));
                            }
                            let rg = row(zr, 1, hid)?;
                            let rh = row_mut(tmp, b, hid)?;
                            for ((o, &rj), &hj) in rh.iter_mut().zip(rg).zip(row(h, b, hid)?) {
                                *o = rj * hj;
                            }
                        }
                        if !linear_before_reset {
                            // 2 · hidden · hidden <= gh · hidden: within R's row.
                            let rh = r
                                .get(hid2.wrapping_mul(hid)..)
                                .ok_or(Error::internal("GRU R"))?;
                            let out = ghb.get_mut(hid2..).ok_or(Error::internal("GRU scratch"))?;
                            sgemm(
                                bsz, hid, hid, tmp, hid, false, rh, hid, true, out, gh, 1.0, 0.0,
                            )?;
                        }
                        for b in 0..bsz {
                            let active = t < len_of(b)?;
                            let g = row(gx, b, gh)?;
                            let hh = row(row(ghb, b, gh)?, 2, hid)?;
                            let gates = row(g, 0, hid)?
                                .iter()
                                .zip(row(g, 1, hid)?)
                                .zip(row(g, 2, hid)?)
                                .zip(hh);
                            let hr = row_mut(h, b, hid)?;
                            for (j, ((((&z, &rg), &xh), &hh), hk)) in
                                gates.zip(hr.iter_mut()).enumerate()
                            {
                                let q = hid2.wrapping_add(j); // j < hid: q < gh
                                let pre = if linear_before_reset {
                                    xh + rg * (hh + rb(q)) + wb(q)
                                } else {
                                    xh + hh + wb(q) + rb(q)
                                };
                                let cand = ga.apply(self.clip(pre));
                                let hn = (1.0 - z) * cand + z * *hk;
                                if active {
                                    *hk = hn;
                                }
                            }
                            put_y(t, d, b, hr, active)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Copies state `which` (0 = h, 1 = c) from scratch to an output in
    /// its layout.
    fn write_state(&self, out: &mut [f32], s: &[f32], which: usize) -> Result<()> {
        // which <= 1: within scratch_len (see the note on `Plan`).
        let base = self
            .states_at()
            .wrapping_add(which.wrapping_mul(self.state_len()));
        let st = win(s, base, self.state_len()).ok_or(Error::internal("RNN scratch"))?;
        let hid = self.hidden;
        for d in 0..self.ndir {
            for b in 0..self.batch {
                let sr = d.wrapping_mul(self.batch).wrapping_add(b); // < ndir · batch
                win_mut(out, self.state_off(d, b), hid)
                    .ok_or(Error::internal("RNN state output row"))?
                    .copy_from_slice(row(st, sr, hid)?);
            }
        }
        Ok(())
    }
}

fn opt_f32<'a>(io: &KernelIo<'a>, i: usize) -> Result<Option<&'a [f32]>> {
    match io.opt_input(i)? {
        Some(v) => Ok(Some(v.as_slice::<f32>()?)),
        None => Ok(None),
    }
}

/// The first `bytes` bytes of scratch as f32.
fn as_f32(s: &mut [u8], bytes: usize) -> Result<&mut [f32]> {
    let s = s
        .get_mut(..bytes)
        .ok_or(Error::internal("RNN scratch size"))?;
    bytemuck::try_cast_slice_mut(s).map_err(|_| Error::internal("scratch alignment"))
}

fn check_shape(ctx: &PrepareCtx<'_>, i: usize, want: &[usize], what: &'static str) -> Result<bool> {
    let Some(x) = ctx.opt_input(i) else {
        return Ok(false);
    };
    util::dtype_in(x.dtype, &[DType::F32], "RNN input")?;
    if x.shape != want {
        return Err(shape_err(what));
    }
    Ok(true)
}

fn prepare_rnn(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare(ctx, Cell::Rnn)
}

fn prepare_gru(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let lbr = ctx.attr_int("linear_before_reset", 0)? != 0;
    prepare(
        ctx,
        Cell::Gru {
            linear_before_reset: lbr,
        },
    )
}

fn prepare_lstm(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let input_forget = ctx.attr_int("input_forget", 0)? != 0;
    prepare(ctx, Cell::Lstm { input_forget })
}

fn prepare(ctx: &PrepareCtx<'_>, cell: Cell) -> Result<Prepared> {
    let name = cell.name();
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, &[DType::F32], name)?;
    let w = ctx.input_of(1, DType::F32)?;
    let r = ctx.input_of(2, DType::F32)?;
    let layout = ctx.attr_int("layout", 0)?;
    if layout != 0 && layout != 1 {
        return Err(Error::new(ErrorKind::Attribute {
            name: "layout",
            problem: "must be 0 or 1",
        }));
    }
    let batch_major = layout == 1;
    let (ndir, reverse) = match ctx.attr_str("direction", "forward")? {
        "forward" => (1, [false, false]),
        "reverse" => (1, [true, false]),
        "bidirectional" => (2, [false, true]),
        _ => {
            return Err(Error::new(ErrorKind::Attribute {
                name: "direction",
                problem: "must be forward, reverse or bidirectional",
            }))
        }
    };
    let (&[x0, x1, input], 3, &[_, _, hidden]) = (x.shape, w.shape.len(), r.shape) else {
        return Err(shape_err("X, W and R must be 3-D"));
    };
    let (seq, batch) = if batch_major { (x1, x0) } else { (x0, x1) };
    let hs = ctx.attr_int("hidden_size", -1)?;
    if hs >= 0 && hs as usize != hidden {
        return Err(shape_err("hidden_size differs from R's shape"));
    }
    let overflow = || Error::new(ErrorKind::Overflow);
    let gh = cell.gates().checked_mul(hidden).ok_or_else(overflow)?;
    if w.shape != [ndir, gh, input] {
        return Err(shape_err("W must be [num_directions, gates*hidden, input]"));
    }
    if r.shape != [ndir, gh, hidden] {
        return Err(shape_err(
            "R must be [num_directions, gates*hidden, hidden]",
        ));
    }
    check_shape(
        ctx,
        3,
        &[ndir, gh.checked_mul(2).ok_or_else(overflow)?],
        "B must be [num_directions, 2*gates*hidden]",
    )?;
    if let Some(l) = ctx.opt_input(4) {
        util::dtype_in(l.dtype, &[DType::I32, DType::I64], "sequence_lens")?;
        if l.shape != [batch] {
            return Err(shape_err("sequence_lens must be [batch]"));
        }
    }
    let state: [usize; 3] = if batch_major {
        [batch, ndir, hidden]
    } else {
        [ndir, batch, hidden]
    };
    check_shape(ctx, 5, &state, "initial_h has the wrong shape")?;
    let max_out = if matches!(cell, Cell::Lstm { .. }) {
        check_shape(ctx, 6, &state, "initial_c has the wrong shape")?;
        check_shape(
            ctx,
            7,
            &[ndir, hidden.checked_mul(3).ok_or_else(overflow)?],
            "P must be [num_directions, 3*hidden]",
        )?;
        3
    } else {
        if ctx.num_inputs() > 6 {
            return Err(Error::new(ErrorKind::Invalid("too many inputs")));
        }
        2
    };
    if ctx.num_outputs() > max_out {
        return Err(Error::new(ErrorKind::Invalid("too many outputs")));
    }

    let k = cell.num_acts();
    let defaults = match cell {
        Cell::Rnn => [Act::Tanh; 3],
        _ => [Act::Sigmoid, Act::Tanh, Act::Tanh],
    };
    let mut acts = [defaults; 2];
    match ctx.node.attr("activations") {
        None => {}
        Some(AttrValue::Strings(names)) => {
            // One set per direction; a single set serves both directions.
            // k <= 3, ndir <= 2: the product does not wrap.
            if names.len() != k.wrapping_mul(ndir) && names.len() != k {
                return Err(Error::new(ErrorKind::Attribute {
                    name: "activations",
                    problem: "needs one entry per gate function and direction",
                }));
            }
            let alpha = ctx.attr_floats("activation_alpha")?.unwrap_or(&[]);
            let beta = ctx.attr_floats("activation_beta")?.unwrap_or(&[]);
            let mut ai = alpha.iter().copied();
            let mut bi = beta.iter().copied();
            // Name n sets function n % k of direction n / k.
            let slots = acts.iter_mut().flat_map(|set| set.iter_mut().take(k));
            for (slot, nm) in slots.zip(names) {
                *slot = Act::parse(nm, &mut ai, &mut bi)?;
            }
            if names.len() == k {
                let [first, second] = &mut acts;
                *second = *first;
            }
        }
        Some(_) => {
            return Err(Error::new(ErrorKind::Attribute {
                name: "activations",
                problem: "expected STRINGS",
            }))
        }
    }
    let clip = match ctx.node.attr("clip") {
        None => None,
        Some(_) => {
            let c = ctx.attr_float("clip", 0.0)?;
            if c.is_nan() || c <= 0.0 {
                return Err(Error::new(ErrorKind::Attribute {
                    name: "clip",
                    problem: "must be positive",
                }));
            }
            Some(c)
        }
    };
    let plan = Plan {
        cell,
        seq,
        batch,
        input,
        hidden,
        ndir,
        reverse,
        acts,
        clip,
        batch_major,
    };
    let y_shape: Vec<usize> = if batch_major {
        alloc::vec![batch, seq, ndir, hidden]
    } else {
        alloc::vec![seq, ndir, batch, hidden]
    };
    let mut outputs = Vec::new();
    for i in 0..ctx.num_outputs() {
        let shape: &[usize] = if i == 0 { &y_shape } else { &state };
        outputs.push(OutputInfo::new(DType::F32, shape));
    }
    // In bytes.
    let n = plan.scratch_len()?.checked_mul(4).ok_or_else(overflow)?;
    let is_lstm = matches!(cell, Cell::Lstm { .. });
    Ok(Prepared::new(
        outputs,
        kernel(name, move |io| {
            let inp = Inputs {
                x: io.input_slice::<f32>(0)?,
                w: io.input_slice::<f32>(1)?,
                r: io.input_slice::<f32>(2)?,
                b: opt_f32(io, 3)?,
                lens: io.opt_input(4)?,
                h0: opt_f32(io, 5)?,
                c0: if is_lstm { opt_f32(io, 6)? } else { None },
                p: if is_lstm { opt_f32(io, 7)? } else { None },
            };
            if io.has_output(0) {
                let (y, s) = io.output_and_scratch(0)?;
                plan.run(&inp, Some(y.into_slice::<f32>()?), as_f32(s, n)?)?;
            } else {
                plan.run(&inp, None, as_f32(io.scratch()?, n)?)?;
            }
            for (o, which) in [(1, 0), (2, 1)] {
                if io.has_output(o) {
                    let (t, s) = io.output_and_scratch(o)?;
                    plan.write_state(t.into_slice::<f32>()?, as_f32(s, n)?, which)?;
                }
            }
            Ok(())
        }),
    )
    .with_scratch(n))
}

#[cfg(test)]
mod tests {
    use crate::model::{AttrValue, Const};
    use crate::ops::testing::{assert_close, rnd, run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;

    fn sig(x: f32) -> f32 {
        1.0 / (1.0 + libm::expf(-x))
    }

    fn s(v: &str) -> AttrValue {
        AttrValue::Str(v.as_bytes().to_vec())
    }

    #[test]
    fn rnn_one_step_with_bias_and_initial_h() {
        // H = tanh(x*W + h0*R + Wb + Rb) = tanh(0.5 + 0.3 + 0.1 + 0.2).
        let out = run(
            "RNN",
            14,
            vec![("hidden_size", AttrValue::Int(1))],
            &[
                t(&[1, 1, 1], &[1.0f32]),
                t(&[1, 1, 1], &[0.5f32]),
                t(&[1, 1, 1], &[0.3f32]),
                t(&[1, 2], &[0.1f32, 0.2]),
                None,
                t(&[1, 1, 1], &[1.0f32]),
            ],
            2,
        )
        .unwrap();
        assert_close(&vals::<f32>(&out[0]), &[libm::tanhf(1.1)], 0.0);
        assert_close(&vals::<f32>(&out[1]), &[libm::tanhf(1.1)], 0.0);
    }

    #[test]
    fn rnn_reverse_relu_sequence_lens() {
        // W = 1, R = 0.5, Relu, X = 1, 2, 3 for both batch entries, lengths
        // 3 and 2. Entry 0 (reverse): h = 3, 2 + 1.5 = 3.5, 1 + 1.75 = 2.75.
        // Entry 1 starts at t = 1: h = 2, then 1 + 1 = 2; Y at t = 2 is 0.
        let out = run(
            "RNN",
            14,
            vec![
                ("hidden_size", AttrValue::Int(1)),
                ("direction", s("reverse")),
                ("activations", AttrValue::Strings(vec![b"Relu".to_vec()])),
            ],
            &[
                t(&[3, 2, 1], &[1.0f32, 1.0, 2.0, 2.0, 3.0, 3.0]),
                t(&[1, 1, 1], &[1.0f32]),
                t(&[1, 1, 1], &[0.5f32]),
                None,
                t(&[2], &[3i32, 2]),
            ],
            2,
        )
        .unwrap();
        assert_eq!(out[0].shape, vec![3, 1, 2, 1]);
        assert_close(&vals::<f32>(&out[0]), &[2.75, 2.0, 3.5, 2.0, 3.0, 0.0], 0.0);
        assert_close(&vals::<f32>(&out[1]), &[2.75, 2.0], 0.0);
    }

    #[test]
    fn rnn_affine_with_clip() {
        // The pre-activation 3 is clipped to 0.5, then 2 * 0.5 + 1.
        let out = run(
            "RNN",
            14,
            vec![
                ("activations", AttrValue::Strings(vec![b"Affine".to_vec()])),
                ("activation_alpha", AttrValue::Floats(vec![2.0])),
                ("activation_beta", AttrValue::Floats(vec![1.0])),
                ("clip", AttrValue::Float(0.5)),
            ],
            &[
                t(&[1, 1, 1], &[3.0f32]),
                t(&[1, 1, 1], &[1.0f32]),
                t(&[1, 1, 1], &[0.0f32]),
            ],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&out[0]), &[2.0], 0.0);
    }

    fn gru_one_step(lbr: bool) -> f32 {
        let (wz, wr, wh) = (0.3f32, -0.2, 0.7);
        let (rz, rr, rh) = (0.4f32, 0.6, -0.5);
        let b = [0.1f32, 0.2, 0.3, -0.1, 0.05, 0.4];
        let out = run(
            "GRU",
            14,
            vec![("linear_before_reset", AttrValue::Int(lbr as i64))],
            &[
                t(&[1, 1, 1], &[1.0f32]),
                t(&[1, 3, 1], &[wz, wr, wh]),
                t(&[1, 3, 1], &[rz, rr, rh]),
                t(&[1, 6], &b),
                None,
                t(&[1, 1, 1], &[0.5f32]),
            ],
            2,
        )
        .unwrap();
        let h = 0.5f32;
        let z = sig(wz + rz * h + b[0] + b[3]);
        let r = sig(wr + rr * h + b[1] + b[4]);
        let cand = if lbr {
            libm::tanhf(wh + r * (rh * h + b[5]) + b[2])
        } else {
            libm::tanhf(wh + rh * (r * h) + b[2] + b[5])
        };
        let want = (1.0 - z) * cand + z * h;
        assert_close(&vals::<f32>(&out[0]), &[want], 0.0);
        assert_close(&vals::<f32>(&out[1]), &[want], 0.0);
        want
    }

    #[test]
    fn gru_reset_before_and_after() {
        let a = gru_one_step(false);
        let b = gru_one_step(true);
        assert!((a - b).abs() > 1e-3, "the two forms must differ here");
    }

    fn lstm_one_step(input_forget: bool) {
        let w = [0.3f32, -0.2, 0.7, 0.5]; // i, o, f, c
        let p = [0.2f32, -0.4, 0.6]; // i, o, f
        let c0 = 0.5f32;
        let out = run(
            "LSTM",
            14,
            vec![("input_forget", AttrValue::Int(input_forget as i64))],
            &[
                t(&[1, 1, 1], &[1.0f32]),
                t(&[1, 4, 1], &w),
                t(&[1, 4, 1], &[0.0f32; 4]),
                None,
                None,
                None,
                t(&[1, 1, 1], &[c0]),
                t(&[1, 3], &p),
            ],
            3,
        )
        .unwrap();
        let i = sig(w[0] + p[0] * c0);
        let f = if input_forget {
            1.0 - i
        } else {
            sig(w[2] + p[2] * c0)
        };
        let c = f * c0 + i * libm::tanhf(w[3]);
        let o = sig(w[1] + p[1] * c);
        let h = o * libm::tanhf(c);
        assert_close(&vals::<f32>(&out[0]), &[h], 0.0);
        assert_close(&vals::<f32>(&out[1]), &[h], 0.0);
        assert_close(&vals::<f32>(&out[2]), &[c], 0.0);
    }

    #[test]
    fn lstm_peepholes() {
        lstm_one_step(false);
        lstm_one_step(true);
    }

    /// `[a, b, c, d]`-shaped data with axes 0 and 1 swapped.
    fn swap01(v: &[f32], a: usize, b: usize, inner: usize) -> Vec<f32> {
        let mut o = vec![0.0; v.len()];
        for i in 0..a {
            for j in 0..b {
                let src = (i * b + j) * inner;
                let dst = (j * a + i) * inner;
                o[dst..dst + inner].copy_from_slice(&v[src..src + inner]);
            }
        }
        o
    }

    #[test]
    fn lstm_bidirectional_matches_layout_and_reverse() {
        let (seq, batch, input, hid) = (3, 2, 2, 3);
        let x = rnd(seq * batch * input, 1);
        let w = rnd(2 * 4 * hid * input, 2);
        let r = rnd(2 * 4 * hid * hid, 3);
        let b = rnd(2 * 8 * hid, 4);
        let lstm = |attrs: Vec<(&str, AttrValue)>, ins: &[Option<Const>]| {
            run("LSTM", 14, attrs, ins, 3).unwrap()
        };
        let bi = lstm(
            vec![("direction", s("bidirectional"))],
            &[
                t(&[seq, batch, input], &x),
                t(&[2, 4 * hid, input], &w),
                t(&[2, 4 * hid, hid], &r),
                t(&[2, 8 * hid], &b),
            ],
        );
        // layout = 1 on the transposed input gives the transposed outputs.
        let bm = lstm(
            vec![
                ("direction", s("bidirectional")),
                ("layout", AttrValue::Int(1)),
            ],
            &[
                t(&[batch, seq, input], &swap01(&x, seq, batch, input)),
                t(&[2, 4 * hid, input], &w),
                t(&[2, 4 * hid, hid], &r),
                t(&[2, 8 * hid], &b),
            ],
        );
        assert_eq!(bm[0].shape, vec![batch, seq, 2, hid]);
        // Y [seq, 2, batch, hid] -> [batch, seq, 2, hid]: view it as
        // [seq*2, batch, hid], swap, then regroup.
        let y = vals::<f32>(&bi[0]);
        let y_bm = swap01(&y, seq * 2, batch, hid);
        assert_close(&vals::<f32>(&bm[0]), &y_bm, 0.0);
        let yh_bm = swap01(&vals::<f32>(&bi[1]), 2, batch, hid);
        assert_close(&vals::<f32>(&bm[1]), &yh_bm, 0.0);
        let yc_bm = swap01(&vals::<f32>(&bi[2]), 2, batch, hid);
        assert_close(&vals::<f32>(&bm[2]), &yc_bm, 0.0);

        // Direction 1 is a reverse LSTM with the second set of weights.
        let rev = lstm(
            vec![("direction", s("reverse"))],
            &[
                t(&[seq, batch, input], &x),
                t(&[1, 4 * hid, input], &w[4 * hid * input..]),
                t(&[1, 4 * hid, hid], &r[4 * hid * hid..]),
                t(&[1, 8 * hid], &b[8 * hid..]),
            ],
        );
        let yr = vals::<f32>(&rev[0]);
        for ti in 0..seq {
            let got = &y[(ti * 2 + 1) * batch * hid..(ti * 2 + 2) * batch * hid];
            assert_close(got, &yr[ti * batch * hid..(ti + 1) * batch * hid], 0.0);
        }
        assert_close(
            &vals::<f32>(&bi[1])[batch * hid..],
            &vals::<f32>(&rev[1]),
            0.0,
        );
        assert_close(
            &vals::<f32>(&bi[2])[batch * hid..],
            &vals::<f32>(&rev[2]),
            0.0,
        );
    }

    #[test]
    fn rejects_bad_shapes_and_attributes() {
        let ins = [
            t(&[1, 1, 1], &[1.0f32]),
            t(&[1, 1, 1], &[1.0f32]),
            t(&[1, 1, 1], &[1.0f32]),
        ];
        assert!(run("RNN", 14, vec![("direction", s("bidirectional"))], &ins, 1).is_err());
        assert!(run("RNN", 14, vec![("layout", AttrValue::Int(2))], &ins, 1).is_err());
        let bad_act = vec![("activations", AttrValue::Strings(vec![b"Nope".to_vec()]))];
        assert!(run("RNN", 14, bad_act, &ins, 1).is_err());
        assert!(run("GRU", 14, vec![], &ins, 1).is_err());
    }
}
