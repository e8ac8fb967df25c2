//! Pooling operators: MaxPool (with its optional Indices output),
//! AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool, GlobalLpPool and
//! MaxUnpool (f32, f64, f16 and bf16 accumulating in f32, MaxPool also
//! uint8/int8, MaxUnpool f32 only; NCHW layout; windowed pools
//! over 1 to 3 spatial axes).

use alloc::vec::Vec;

use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::kern::{win, win_mut};
use crate::math;
use crate::ops::conv::{forward_geom, valid_range, Geom, MAX_SPATIAL};
use crate::ops::util::{Acc, Float};
use crate::ops::{kernel, util, KernelIo, OpDef, OutputInfo, PrepareCtx, Prepared};
use crate::tensor::ChunksOf as _;
use crate::DType;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("MaxPool", 1, prepare_max_pool),
    OpDef::onnx("AveragePool", 1, prepare_avg_pool),
    OpDef::onnx("GlobalAveragePool", 1, prepare_global_avg),
    OpDef::onnx("GlobalMaxPool", 1, prepare_global_max),
    OpDef::onnx("LpPool", 1, prepare_lp_pool),
    OpDef::onnx("LpPool", 18, prepare_lp_pool),
    OpDef::onnx("GlobalLpPool", 1, prepare_global_lp),
    OpDef::onnx("MaxUnpool", 9, prepare_max_unpool),
    OpDef::onnx("MaxUnpool", 11, prepare_max_unpool),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Max,
    /// Average; the flag is `count_include_pad`.
    Avg(bool),
    /// `(sum |x|^p)^(1/p)` over the window's taps inside the input.
    Lp(u32),
}

/// `|v|^p` by repeated multiplication (p is a small integer).
#[inline]
fn abs_pow(v: f32, p: u32) -> f32 {
    let a = if v < 0.0 { -v } else { v };
    let mut r = a;
    for _ in 1..p {
        r *= a;
    }
    r
}

/// `s^(1/p)`.
#[inline]
fn root(s: f32, p: u32) -> f32 {
    match p {
        1 => s,
        2 => math::sqrt(s),
        _ => math::pow(s, 1.0 / p as f32),
    }
}

fn pool_input<'a>(ctx: &PrepareCtx<'a>) -> Result<&'a [usize]> {
    pool_input_of(ctx, &[DType::F32])
}

/// Element types of MaxPool.
const MAX_TYPES: &[DType] = &[
    DType::F32,
    DType::U8,
    DType::I8,
    DType::F16,
    DType::BF16,
    DType::F64,
];

fn pool_input_of<'a>(ctx: &PrepareCtx<'a>, allowed: &[DType]) -> Result<&'a [usize]> {
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, allowed, "pool input")?;
    if x.shape.len() < 3 {
        return Err(Error::new(ErrorKind::Rank {
            expected: 3,
            got: x.shape.len(),
        }));
    }
    Ok(x.shape)
}

fn prepare_window(ctx: &PrepareCtx<'_>, mode: Mode, name: &'static str) -> Result<Prepared> {
    let xs = if mode == Mode::Max {
        pool_input_of(ctx, MAX_TYPES)?
    } else {
        pool_input_of(ctx, util::FLOATS)?
    };
    let dt = ctx.input(0)?.dtype;
    let [nb, ch, spatial @ ..] = xs else {
        return Err(Error::new(ErrorKind::Internal("pool: input rank")));
    };
    let n = spatial.len();
    let k: Vec<usize> = match ctx.attr_ints("kernel_shape")? {
        None => {
            return Err(Error::new(ErrorKind::Attribute {
                name: "kernel_shape",
                problem: "required",
            }))
        }
        Some(v) => v
            .iter()
            .map(|&x| {
                if x >= 1 {
                    Ok(x as usize)
                } else {
                    Err(Error::new(ErrorKind::Attribute {
                        name: "kernel_shape",
                        problem: "must be positive",
                    }))
                }
            })
            .collect::<Result<_>>()?,
    };
    let ceil_mode = ctx.attr_int("ceil_mode", 0)? != 0;
    let g = forward_geom(ctx, spatial, &k, ceil_mode)?;
    let planes = nb.checked_mul(*ch).ok_or(Error::new(ErrorKind::Overflow))?;
    let mut shape = alloc::vec![*nb, *ch];
    shape.extend_from_slice(
        g.out
            .len()
            .checked_sub(n)
            .and_then(|lead| g.out.get(lead..))
            .ok_or(Error::new(ErrorKind::Internal("pool: spatial rank")))?,
    );
    let indices = mode == Mode::Max && ctx.has_output(1);
    // Indices count in row-major (0) or column-major (1) order per plane.
    let col_major = match ctx.attr_int("storage_order", 0)? {
        0 => false,
        1 => true,
        _ => {
            return Err(Error::new(ErrorKind::Attribute {
                name: "storage_order",
                problem: "must be 0 or 1",
            }))
        }
    };
    let mut outs = alloc::vec![OutputInfo::new(dt, &shape)];
    if indices {
        outs.push(OutputInfo::new(DType::I64, &shape));
    }
    Ok(Prepared::new(
        outs,
        kernel(name, move |io| match dt {
            DType::U8 => run_window::<u8>(io, indices, col_major, planes, &g, mode),
            DType::I8 => run_window::<i8>(io, indices, col_major, planes, &g, mode),
            DType::F16 => run_window::<half::f16>(io, indices, col_major, planes, &g, mode),
            DType::BF16 => run_window::<half::bf16>(io, indices, col_major, planes, &g, mode),
            DType::F64 => run_window::<f64>(io, indices, col_major, planes, &g, mode),
            _ => run_window::<f32>(io, indices, col_major, planes, &g, mode),
        }),
    ))
}

fn run_window<T: PoolElem>(
    io: &mut KernelIo<'_>,
    indices: bool,
    col_major: bool,
    planes: usize,
    g: &Geom,
    mode: Mode,
) -> Result<()> {
    let x = io.input_slice::<T>(0)?;
    if !indices {
        let y = io.output_slice::<T>(0)?;
        return pool(x, y, None, planes, g, mode);
    }
    let (y, i) = io.outputs2(0, 1)?;
    let (y, i) = (y.into_slice::<T>()?, i.into_slice::<i64>()?);
    pool(x, y, Some((i, col_major)), planes, g, mode)
}

fn prepare_max_pool(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_window(ctx, Mode::Max, "MaxPool")
}

fn prepare_lp_pool(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_window(ctx, Mode::Lp(lp_p(ctx)?), "LpPool")
}

fn lp_p(ctx: &PrepareCtx<'_>) -> Result<u32> {
    let p = ctx.attr_int("p", 2)?;
    if !(1..=64).contains(&p) {
        return Err(Error::new(ErrorKind::Unsupported(
            "LpPool p outside 1..=64",
        )));
    }
    Ok(p as u32)
}

fn prepare_avg_pool(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let include = ctx.attr_int("count_include_pad", 0)? != 0;
    prepare_window(ctx, Mode::Avg(include), "AveragePool")
}

fn check_len(got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::new(ErrorKind::Len {
            expected: want as u64,
            got: got as u64,
        }));
    }
    Ok(())
}

/// Number of window taps `k` of output `o` with `o*s + k*d < end`, the
/// padded extent `pb + in + pe` (positions never precede `-pb`).
#[inline]
fn taps_below(o: usize, s: usize, d: usize, k: usize, end: usize) -> usize {
    // o*s is at most the last window's start, below the reach checked by
    // `window_bounds`.
    let start = o.wrapping_mul(s);
    if start >= end {
        0
    } else {
        // start < end: end - start - 1 does not wrap, nor q + 1 (q < end).
        // A dilation is at least 1 (checked at prepare).
        end.wrapping_sub(start)
            .wrapping_sub(1)
            .checked_div(d)
            .map_or(0, |q| q.wrapping_add(1).min(k))
    }
}

/// Checks once the sums and products the window loops of [`pool`] take:
/// the window size `k0·k1·k2` and, per axis, the reach of the last window
/// `(out - 1)·s + (k - 1)·d` and the padded extent `pb + in + pe`, which it
/// returns. Every window position, tap count and window size in the loops
/// stays under one of them.
fn window_bounds(g: &Geom) -> Result<[usize; MAX_SPATIAL]> {
    let overflow = || Error::new(ErrorKind::Overflow);
    checked_numel(&g.k)?;
    let axes = g.out.iter().zip(&g.s).zip(g.k.iter().zip(&g.d));
    for ((&o, &s), (&k, &d)) in axes {
        // The last output position and tap (none when out = 0; k >= 1).
        let start = o.saturating_sub(1).checked_mul(s);
        let tap = k.saturating_sub(1).checked_mul(d);
        start
            .zip(tap)
            .and_then(|(a, b)| a.checked_add(b))
            .ok_or_else(overflow)?;
    }
    let mut ext = [0usize; MAX_SPATIAL];
    let axes = g.inp.iter().zip(&g.pb).zip(&g.pe);
    for (e, ((&i, &pb), &pe)) in ext.iter_mut().zip(axes) {
        *e = i
            .checked_add(pb)
            .and_then(|v| v.checked_add(pe))
            .ok_or_else(overflow)?;
    }
    Ok(ext)
}

/// Element types a pool reads: MaxPool takes all of them, the averaging
/// pools and LpPool only the float ones (prepare enforces it).
trait PoolElem: crate::Element + PartialOrd {
    /// Value of a window with no tap inside the input.
    const LOWEST: Self;
    /// The identity of the maximum: -∞ for the float types, the minimum
    /// for the integer ones.
    const NEG: Self;
    fn is_nan(self) -> bool;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl PoolElem for f32 {
    const LOWEST: Self = f32::MIN;
    const NEG: Self = f32::NEG_INFINITY;
    fn is_nan(self) -> bool {
        f32::is_nan(self)
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

macro_rules! int_pool_elem {
    ($($t:ty),*) => {$(
        impl PoolElem for $t {
            const LOWEST: Self = <$t>::MIN;
            const NEG: Self = <$t>::MIN;
            fn is_nan(self) -> bool {
                false
            }
            fn to_f32(self) -> f32 {
                self as f32
            }
            fn from_f32(v: f32) -> Self {
                v as $t
            }
        }
    )*};
}
int_pool_elem!(u8, i8);

macro_rules! float_pool_elem {
    ($($t:ty),*) => {$(
        impl PoolElem for $t {
            const LOWEST: Self = <$t>::MIN;
            const NEG: Self = <$t>::NEG_INFINITY;
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            fn to_f32(self) -> f32 {
                Float::to_f32(self)
            }
            fn from_f32(v: f32) -> Self {
                <$t as Float>::from_f32(v)
            }
        }
    )*};
}
float_pool_elem!(half::f16, half::bf16, f64);

/// Windowed pool of `planes` planes; `idx` (MaxPool only) receives the flat
/// input index of each maximum, in column-major plane order when its flag is
/// set.
fn pool<T: PoolElem>(
    x: &[T],
    y: &mut [T],
    idx: Option<(&mut [i64], bool)>,
    planes: usize,
    g: &Geom,
    mode: Mode,
) -> Result<()> {
    let overflow = || Error::new(ErrorKind::Overflow);
    let (in_sz, out_sz) = (checked_numel(&g.inp)?, checked_numel(&g.out)?);
    check_len(x.len(), planes.checked_mul(in_sz).ok_or_else(overflow)?)?;
    check_len(y.len(), planes.checked_mul(out_sz).ok_or_else(overflow)?)?;
    if let Some((i, _)) = &idx {
        check_len(i.len(), y.len())?;
    }
    if y.is_empty() {
        return Ok(());
    }
    let [n0, n1, n2] = window_bounds(g)?;
    if mode == Mode::Max && idx.is_none() && is_plain_2d(g) {
        return max_pool_2d(x, y, in_sz, out_sz, g);
    }
    windows(x, y, idx, (in_sz, out_sz), [n0, n1, n2], g, mode)
}

/// A 2-D window (one plane per channel, no dilation): [`max_pool_2d`]'s case.
fn is_plain_2d(g: &Geom) -> bool {
    let ([i0, _, _], [k0, _, _], [o0, _, _]) = (g.inp, g.k, g.out);
    let [_, d1, d2] = g.d;
    [i0, k0, o0, d1, d2] == [1; 5]
}

/// [`pool`] window by window, for any geometry and mode (x, y and the
/// reaches `n` checked by `pool`).
fn windows<T: PoolElem>(
    x: &[T],
    y: &mut [T],
    mut idx: Option<(&mut [i64], bool)>,
    (in_sz, out_sz): (usize, usize),
    [n0, n1, n2]: [usize; MAX_SPATIAL],
    g: &Geom,
    mode: Mode,
) -> Result<()> {
    let [o0, o1, o2] = g.out;
    let [i0, i1, i2] = g.inp;
    let [k0, k1, k2] = g.k;
    let [s0, s1, s2] = g.s;
    let [d0, d1, d2] = g.d;
    let [p0, p1, p2] = g.pb;
    let [e0, _, _] = g.pe;
    let short = Error::new(ErrorKind::Internal("pool: window outside the plane"));
    // The innermost dilation as NonZero, so that `step_by` below has no
    // zero-step assertion.
    let d2_nz = core::num::NonZeroUsize::new(d2)
        .ok_or(Error::new(ErrorKind::Internal("pool: zero dilation")))?;
    // Every index below is exact, wrapping by name only: a window start
    // o·s plus a tap k·d stays under the reach checked by `window_bounds`;
    // the taps `valid_range` keeps fall inside the input (o·s + k·d - p
    // does not wrap) and `a..b` has a <= b; offsets in a plane stay under
    // in_sz or out_sz, plane offsets under planes · in_sz = x.len() and
    // planes · out_sz = y.len() (checked above); tap counts under k0·k1·k2
    // (`window_bounds`).
    for (pi, yp) in y.chunks_of_mut(out_sz).enumerate() {
        // pi < planes.
        let xp = win(x, pi.wrapping_mul(in_sz), in_sz).ok_or(short)?;
        for od in 0..o0 {
            // Taps of this window that fall inside the input, per axis.
            let x0 = od.wrapping_mul(s0);
            let (ad, bd) = valid_range(k0, d0, x0, p0, i0);
            let nd = bd.wrapping_sub(ad);
            let pd = taps_below(od, s0, d0, k0, n0);
            for oh in 0..o1 {
                let h0 = oh.wrapping_mul(s1);
                let (ah, bh) = valid_range(k1, d1, h0, p1, i1);
                let nh = bh.wrapping_sub(ah);
                let ph = taps_below(oh, s1, d1, k1, n1);
                let r0 = od.wrapping_mul(o1).wrapping_add(oh).wrapping_mul(o2);
                let yrow = win_mut(yp, r0, o2).ok_or(short)?;
                // This row's Indices (MaxPool with that output only).
                let mut irow = match idx.as_mut() {
                    Some((iv, col_major)) => {
                        let o = pi.wrapping_mul(out_sz).wrapping_add(r0);
                        Some((win_mut(iv, o, o2).ok_or(short)?, *col_major))
                    }
                    None => None,
                };
                for (ow, out) in yrow.iter_mut().enumerate() {
                    let w0 = ow.wrapping_mul(s2);
                    let (aw, bw) = valid_range(k2, d2, w0, p2, i2);
                    let nw = bw.wrapping_sub(aw);
                    if let (Mode::Avg(include), [1, 1, 0, 0], 1, 1) =
                        (mode, [i0, k0, p0, e0], d1, d2)
                    {
                        // A 2-D average whose taps in a row are contiguous:
                        // rows summed with partial sums; when the window
                        // spans whole rows (KWS's 25 × 5 pool), its rows are
                        // one contiguous run.
                        let cnt = if include {
                            ph.wrapping_mul(taps_below(ow, s2, d2, k2, n2))
                        } else {
                            nh.wrapping_mul(nw)
                        };
                        let mut acc = 0.0f32;
                        if aw < bw && ah < bh {
                            let iw0 = w0.wrapping_add(aw).wrapping_sub(p2);
                            let ih0 = h0.wrapping_add(ah).wrapping_sub(p1);
                            if iw0 == 0 && nw == i2 {
                                let run = win(xp, ih0.wrapping_mul(i2), nh.wrapping_mul(i2))
                                    .ok_or(short)?;
                                acc = util::sum_lanes(run, T::to_f32);
                            } else {
                                for ih in ih0..ih0.wrapping_add(nh) {
                                    let r = ih.wrapping_mul(i2).wrapping_add(iw0);
                                    let taps = win(xp, r, nw).ok_or(short)?;
                                    acc += util::sum_lanes(taps, T::to_f32);
                                }
                            }
                        }
                        *out = T::from_f32(if cnt == 0 { 0.0 } else { acc / cnt as f32 });
                        continue;
                    }
                    let mut acc = 0.0f32;
                    let mut best = T::LOWEST;
                    // (d, h, w) of the maximum, for Indices.
                    let mut at: Option<[usize; 3]> = None;
                    for kd in ad..bd {
                        let id = x0.wrapping_add(kd.wrapping_mul(d0)).wrapping_sub(p0);
                        for kh in ah..bh {
                            let ih = h0.wrapping_add(kh.wrapping_mul(d1)).wrapping_sub(p1);
                            let r = id.wrapping_mul(i1).wrapping_add(ih).wrapping_mul(i2);
                            let row = win(xp, r, i2).ok_or(short)?;
                            // Taps aw..bw of this row: the inputs from that
                            // of tap aw on, `d2` apart.
                            let taps = if aw < bw {
                                let iw0 = w0.wrapping_add(aw.wrapping_mul(d2)).wrapping_sub(p2);
                                let span = nw.wrapping_sub(1).wrapping_mul(d2).wrapping_add(1);
                                win(row, iw0, span).ok_or(short)?
                            } else {
                                &[]
                            };
                            for (kw, &v) in (aw..bw).zip(taps.iter().step_by(d2_nz.get())) {
                                let iw = w0.wrapping_add(kw.wrapping_mul(d2)).wrapping_sub(p2);
                                match mode {
                                    Mode::Max => {
                                        if v > best || v.is_nan() || at.is_none() {
                                            best = v;
                                            at = Some([id, ih, iw]);
                                        }
                                    }
                                    Mode::Avg(_) => acc += v.to_f32(),
                                    Mode::Lp(p) => acc += abs_pow(v.to_f32(), p),
                                }
                            }
                        }
                    }
                    if let Some((iv, col_major)) = irow.as_mut() {
                        *iv.get_mut(ow).ok_or(short)? = match at {
                            None => -1,
                            Some([a, b, c]) => {
                                // a < i0, b < i1, c < i2: below in_sz.
                                let within = if *col_major {
                                    let ab = a.wrapping_add(b.wrapping_mul(i0));
                                    ab.wrapping_add(c.wrapping_mul(i0).wrapping_mul(i1))
                                } else {
                                    a.wrapping_mul(i1)
                                        .wrapping_add(b)
                                        .wrapping_mul(i2)
                                        .wrapping_add(c)
                                };
                                pi.wrapping_mul(in_sz).wrapping_add(within) as i64
                            }
                        };
                    }
                    *out = match mode {
                        Mode::Max => best,
                        Mode::Lp(p) => T::from_f32(root(acc, p)),
                        Mode::Avg(include) => {
                            let cnt = if include {
                                let pw = taps_below(ow, s2, d2, k2, n2);
                                pd.wrapping_mul(ph).wrapping_mul(pw)
                            } else {
                                nd.wrapping_mul(nh).wrapping_mul(nw)
                            };
                            T::from_f32(if cnt == 0 { 0.0 } else { acc / cnt as f32 })
                        }
                    };
                }
            }
        }
    }
    Ok(())
}

/// MaxPool of 2-D planes with no dilation and no Indices (ResNet's 3 × 3
/// stride-2 stem pool: it was a tenth of ResNet-18's time window by
/// window), tap by tap: each tap (kh, kw) updates, in one pass, every
/// output of a row whose window holds it, a loop over consecutive inputs
/// (or evenly spaced ones, strided) that LLVM vectorizes. Each output meets
/// its taps in [`windows`]' order (row by row, left to right) under the
/// same comparison, so the result is the same bit for bit, NaN and signed
/// zeros included; the first tap is compared with `T::NEG` (-∞), which
/// keeps its value, where `windows` takes it as is. x and y are checked by
/// [`pool`] (`planes` planes of `in_sz` and `out_sz`).
fn max_pool_2d<T: PoolElem>(
    x: &[T],
    y: &mut [T],
    in_sz: usize,
    out_sz: usize,
    g: &Geom,
) -> Result<()> {
    let short = Error::new(ErrorKind::Internal("pool: window outside the plane"));
    let ([_, o1, o2], [_, i1, i2], [_, k1, k2]) = (g.out, g.inp, g.k);
    let ([_, s1, s2], [_, p1, p2]) = (g.s, g.pb);
    let s2_nz = core::num::NonZeroUsize::new(s2)
        .ok_or(Error::new(ErrorKind::Internal("pool: zero stride")))?;
    // Outputs [wa, wb) of a row have taps inside the input in some column
    // (the union of each tap's outputs; an interval, as a window moves
    // right monotonically); the others sit in the padding: T::LOWEST, as in
    // `windows`.
    let (mut wa, mut wb) = (o2, 0);
    for kw in 0..k2 {
        let (lo, hi) = valid_range(o2, s2, kw, p2, i2);
        if lo < hi {
            (wa, wb) = (wa.min(lo), wb.max(hi));
        }
    }
    // The outputs [lo, hi) of a row that tap column kw reaches depend on kw
    // only: kept for the first TAPS columns (every pool kernel in practice),
    // recomputed (two divisions) past them.
    const TAPS: usize = 16;
    let mut cols = [(0usize, 0usize); TAPS];
    for (kw, c) in cols.iter_mut().enumerate().take(k2) {
        *c = valid_range(o2, s2, kw, p2, i2);
    }
    let col = |kw: usize| match cols.get(kw) {
        Some(&c) => c,
        None => valid_range(o2, s2, kw, p2, i2),
    };
    // Index arithmetic wraps by name only: `window_bounds` (checked by
    // `pool`) bounds oh·s1 + kh and ow·s2 + kw; `valid_range` keeps only
    // rows and outputs whose input index h0 + kh - p1 (kw + ow·s2 - p2)
    // lies in [0, i1) ([0, i2)), so nothing below wraps; rows start at
    // ih·i2 < in_sz and planes at pi·in_sz < x.len() (pi < planes).
    for (pi, yp) in y.chunks_of_mut(out_sz).enumerate() {
        let xp = win(x, pi.wrapping_mul(in_sz), in_sz).ok_or(short)?;
        for (oh, yrow) in yp.chunks_of_mut(o2).take(o1).enumerate() {
            let h0 = oh.wrapping_mul(s1);
            let (ah, bh) = valid_range(k1, 1, h0, p1, i1);
            if ah >= bh || wa >= wb {
                yrow.fill(T::LOWEST);
                continue;
            }
            for (ow, v) in yrow.iter_mut().enumerate() {
                *v = if (wa..wb).contains(&ow) {
                    T::NEG
                } else {
                    T::LOWEST
                };
            }
            for kh in ah..bh {
                let ih = h0.wrapping_add(kh).wrapping_sub(p1);
                let xrow = win(xp, ih.wrapping_mul(i2), i2).ok_or(short)?;
                for kw in 0..k2 {
                    let (lo, hi) = col(kw);
                    if lo >= hi {
                        continue;
                    }
                    let n = hi.wrapping_sub(lo);
                    let at = kw.wrapping_add(lo.wrapping_mul(s2)).wrapping_sub(p2);
                    let ys = win_mut(yrow, lo, n).ok_or(short)?;
                    if s2 == 1 {
                        let xs = win(xrow, at, n).ok_or(short)?;
                        for (yv, &v) in ys.iter_mut().zip(xs) {
                            *yv = if v > *yv || v.is_nan() { v } else { *yv };
                        }
                    } else {
                        let xs = xrow.get(at..).ok_or(short)?;
                        for (yv, &v) in ys.iter_mut().zip(xs.iter().step_by(s2_nz.get())) {
                            *yv = if v > *yv || v.is_nan() { v } else { *yv };
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn prepare_global(ctx: &PrepareCtx<'_>, mode: Mode) -> Result<Prepared> {
    let x = ctx.input(0)?;
    util::dtype_in(x.dtype, util::FLOATS, "global pool input")?;
    let (xs, dt) = (x.shape, x.dtype);
    let [nb, ch, spatial @ ..] = xs else {
        return Err(Error::new(ErrorKind::Rank {
            expected: 3,
            got: xs.len(),
        }));
    };
    let planes = nb.checked_mul(*ch).ok_or(Error::new(ErrorKind::Overflow))?;
    let plane = checked_numel(spatial)?;
    let mut shape = alloc::vec![*nb, *ch];
    shape.resize(xs.len(), 1);
    let name = match mode {
        Mode::Max => "GlobalMaxPool",
        Mode::Avg(_) => "GlobalAveragePool",
        Mode::Lp(_) => "GlobalLpPool",
    };
    util::with_float!(dt, T => Ok(Prepared::single(
        dt,
        &shape,
        kernel(name, move |io| run_global::<T>(io, mode, planes, plane)),
    )), other => Err(Error::new(ErrorKind::UnsupportedDType {
        what: name,
        code: other.onnx_code(),
    })))
}

/// A global pool over `planes` planes of `plane` elements, accumulated in
/// f32 (f64 for f64).
fn run_global<T: Float>(
    io: &mut KernelIo<'_>,
    mode: Mode,
    planes: usize,
    plane: usize,
) -> Result<()>
where
{
    let x = io.input_slice::<T>(0)?;
    let y = io.output_slice::<T>(0)?;
    let numel = planes
        .checked_mul(plane)
        .ok_or(Error::new(ErrorKind::Overflow))?;
    check_len(x.len(), numel)?;
    check_len(y.len(), planes)?;
    if plane == 0 {
        y.fill(T::from_f32(if mode == Mode::Max { f32::MIN } else { 0.0 }));
        return Ok(());
    }
    let cnt = T::Acc::from_f64(plane as f64);
    for (o, xp) in y.iter_mut().zip(x.chunks_of(plane)) {
        *o = match mode {
            Mode::Max => xp.iter().fold(
                *xp.first()
                    .ok_or(Error::new(ErrorKind::Internal("GlobalMaxPool plane")))?,
                |a, &v| {
                    if v > a || v.to_acc() != v.to_acc() {
                        v
                    } else {
                        a
                    }
                },
            ),
            Mode::Avg(_) => T::from_acc(util::sum_lanes(xp, T::to_acc).over(cnt)),
            Mode::Lp(p) => T::from_f32(root(
                xp.iter().map(|&v| abs_pow(v.to_f32(), p)).sum::<f32>(),
                p,
            )),
        };
    }
    Ok(())
}

fn prepare_global_avg(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_global(ctx, Mode::Avg(false))
}

fn prepare_global_max(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_global(ctx, Mode::Max)
}

fn prepare_global_lp(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_global(ctx, Mode::Lp(lp_p(ctx)?))
}

/// MaxUnpool: scatters X to the flat positions of Indices in a zero tensor
/// of the inferred shape `(in - 1) * stride - pads + kernel`; an explicit
/// `output_shape` larger than that pads it at the end of each axis (the
/// indices stay relative to the inferred shape, as in the ONNX reference).
fn prepare_max_unpool(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let xs = pool_input(ctx)?;
    let ind = ctx.input(1)?;
    util::dtype_in(ind.dtype, &[DType::I64], "MaxUnpool indices")?;
    if ind.shape != xs {
        return Err(Error::new(ErrorKind::Shape(
            "MaxUnpool indices must have the shape of X",
        )));
    }
    let [nb, ch, spatial @ ..] = xs else {
        return Err(Error::new(ErrorKind::Internal("MaxUnpool: input rank")));
    };
    let n = spatial.len();
    if n > 3 {
        return Err(Error::new(ErrorKind::Unsupported(
            "MaxUnpool over more than 3 spatial axes",
        )));
    }
    let attr_len = |name: &'static str, want: usize, default: usize| -> Result<Vec<usize>> {
        match ctx.attr_ints(name)? {
            None => Ok(alloc::vec![default; want]),
            Some(v) if v.len() == want && v.iter().all(|&x| x >= 0) => {
                Ok(v.iter().map(|&x| x as usize).collect())
            }
            Some(_) => Err(Error::new(ErrorKind::Attribute {
                name,
                problem: "wrong length or negative",
            })),
        }
    };
    if ctx.attr_ints("kernel_shape")?.is_none() {
        return Err(Error::new(ErrorKind::Attribute {
            name: "kernel_shape",
            problem: "required",
        }));
    }
    let k = attr_len("kernel_shape", n, 1)?;
    let s = attr_len("strides", n, 1)?;
    let p = attr_len("pads", n.wrapping_mul(2), 0)?; // n <= 3 (checked above)
    let (p_begin, p_end) = p
        .split_at_checked(n)
        .ok_or(Error::new(ErrorKind::Internal("MaxUnpool pads")))?;
    let mut inferred = alloc::vec![*nb, *ch];
    let axes = spatial.iter().zip(&s).zip(&k).zip(p_begin).zip(p_end);
    for ((((&xi, &si), &ki), &pb), &pe) in axes {
        // (in - 1)·stride + kernel, an empty axis counting as one.
        let full = xi
            .saturating_sub(1)
            .checked_mul(si)
            .and_then(|v| v.checked_add(ki))
            .ok_or(Error::new(ErrorKind::Overflow))?;
        let v = full
            .checked_sub(pb)
            .and_then(|v| v.checked_sub(pe))
            .ok_or(Error::new(ErrorKind::Shape(
                "MaxUnpool pads exceed the output",
            )))?;
        inferred.push(v);
    }
    let shape: Vec<usize> = match ctx.const_ints(2)? {
        None => inferred.clone(),
        Some(v) => {
            if v.len() != xs.len()
                || v.iter()
                    .zip(&inferred)
                    .any(|(&o, &i)| o < 0 || (o as usize) < i)
            {
                return Err(Error::new(ErrorKind::Shape(
                    "MaxUnpool output_shape must have X's rank and cover the inferred shape",
                )));
            }
            v.iter().map(|&o| o as usize).collect()
        }
    };
    let total = checked_numel(&inferred)?;
    let numel = checked_numel(xs)?;
    // Row-major strides of the output and the inferred shape.
    let mut out_st = [0usize; 5];
    let mut inf_st = [0usize; 5];
    let rank = xs.len();
    let (mut a, mut b) = (1usize, 1usize);
    let strides = out_st
        .get_mut(..rank)
        .zip(inf_st.get_mut(..rank))
        .ok_or(Error::new(ErrorKind::Internal("MaxUnpool rank")))?;
    let axes = strides.0.iter_mut().zip(strides.1.iter_mut());
    for ((os, is), (&sd, &id)) in axes.zip(shape.iter().zip(&inferred)).rev() {
        *os = a;
        *is = b;
        a = a.checked_mul(sd).ok_or(Error::new(ErrorKind::Overflow))?;
        b = b.checked_mul(id).ok_or(Error::new(ErrorKind::Overflow))?;
    }
    Ok(Prepared::single(
        DType::F32,
        &shape,
        kernel("MaxUnpool", move |io| {
            let x = io.input_slice::<f32>(0)?;
            let ind = io.input_slice::<i64>(1)?;
            let y = io.output_slice::<f32>(0)?;
            check_len(x.len(), numel)?;
            check_len(ind.len(), numel)?;
            y.fill(0.0);
            for (&v, &i) in x.iter().zip(ind) {
                if i < 0 || i as usize >= total {
                    return Err(Error::new(ErrorKind::Shape(
                        "MaxUnpool index out of the inferred output",
                    )));
                }
                // Re-address the inferred-shape index into the output.
                // Below `total`, the quotient of each axis is below its
                // inferred size, at most the output's: `o` stays below
                // the output's size (checked above, `a`).
                let (mut rem, mut o) = (i as usize, 0usize);
                for (&is, &os) in inf_st.iter().zip(&out_st).take(rank) {
                    let (q, r) = util::div_rem(rem, is, "MaxUnpool index")?;
                    o = o.wrapping_add(q.wrapping_mul(os));
                    rem = r;
                }
                let slot = y
                    .get_mut(o)
                    .ok_or(Error::new(ErrorKind::Internal("MaxUnpool output index")))?;
                *slot = v;
            }
            Ok(())
        }),
    ))
}

#[cfg(test)]
mod tests {
    use alloc::vec;
    use alloc::vec::Vec;

    use crate::math;
    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, run, t, vals};

    use crate::ops::testing::rnd;

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    fn out_len(i: usize, k: usize, s: usize, d: usize, pb: usize, pe: usize, ceil: bool) -> usize {
        let ek = (k - 1) * d + 1;
        let num = i + pb + pe - ek;
        if ceil {
            let mut o = num.div_ceil(s) + 1;
            if (o - 1) * s >= i + pb {
                o -= 1;
            }
            o
        } else {
            num / s + 1
        }
    }

    /// Naive 2-D pool over [planes, h, w]; `avg = Some(count_include_pad)`.
    #[allow(clippy::too_many_arguments)]
    fn naive_pool(
        x: &[f32],
        planes: usize,
        h: usize,
        w: usize,
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        p: [usize; 4],
        ceil: bool,
        avg: Option<bool>,
    ) -> (Vec<f32>, usize, usize) {
        let oh = out_len(h, k[0], s[0], d[0], p[0], p[2], ceil);
        let ow = out_len(w, k[1], s[1], d[1], p[1], p[3], ceil);
        let mut y = Vec::new();
        for pl in 0..planes {
            for yh in 0..oh {
                for yw in 0..ow {
                    let mut mx = f32::MIN;
                    let mut sum = 0.0;
                    let mut n_valid = 0usize;
                    let mut n_padded = 0usize;
                    for a in 0..k[0] {
                        for b in 0..k[1] {
                            let ih = (yh * s[0] + a * d[0]) as isize - p[0] as isize;
                            let iw = (yw * s[1] + b * d[1]) as isize - p[1] as isize;
                            if ih < (h + p[2]) as isize && iw < (w + p[3]) as isize {
                                n_padded += 1;
                            }
                            if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                                continue;
                            }
                            let v = x[(pl * h + ih as usize) * w + iw as usize];
                            mx = mx.max(v);
                            sum += v;
                            n_valid += 1;
                        }
                    }
                    y.push(match avg {
                        None => mx,
                        Some(true) => sum / n_padded as f32,
                        Some(false) => sum / n_valid as f32,
                    });
                }
            }
        }
        (y, oh, ow)
    }

    #[allow(clippy::too_many_arguments)]
    fn check_pool(
        xs: [usize; 4],
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        p: [usize; 4],
        ceil: bool,
        avg: Option<bool>,
        auto_pad: Option<&str>,
    ) {
        let x = rnd(xs.iter().product(), 31);
        let (want, oh, ow) = naive_pool(&x, xs[0] * xs[1], xs[2], xs[3], k, s, d, p, ceil, avg);
        let mut attrs = vec![
            ("kernel_shape", ints(&[k[0] as i64, k[1] as i64])),
            ("strides", ints(&[s[0] as i64, s[1] as i64])),
            ("ceil_mode", AttrValue::Int(ceil as i64)),
        ];
        if d != [1, 1] {
            attrs.push(("dilations", ints(&[d[0] as i64, d[1] as i64])));
        }
        match auto_pad {
            Some(a) => attrs.push(("auto_pad", AttrValue::Str(a.as_bytes().to_vec()))),
            None => attrs.push(("pads", ints(&p.map(|v| v as i64)))),
        }
        let op = match avg {
            None => "MaxPool",
            Some(inc) => {
                attrs.push(("count_include_pad", AttrValue::Int(inc as i64)));
                "AveragePool"
            }
        };
        let out = run(op, 19, attrs, &[t(&xs, &x)], 1).unwrap();
        assert_eq!(out[0].shape, vec![xs[0], xs[1], oh, ow]);
        assert_close(&vals::<f32>(&out[0]), &want, 1e-6);
    }

    /// `max_pool_2d` (tap by tap) against `windows` (window by window), bit
    /// for bit, on f32 with NaN, ±∞, signed zeros and ties, and on i8 / u8 /
    /// f16, over kernel sizes, strides, paddings (both ends) and planes
    /// narrower than the window, and windows wider than 16 columns.
    #[test]
    fn max_pool_2d_is_the_window_loop() {
        use super::{is_plain_2d, max_pool_2d, window_bounds, windows, Geom, Mode, PoolElem};
        fn check<T: PoolElem + core::fmt::Debug>(x: &[T], planes: usize, g: &Geom) {
            assert!(is_plain_2d(g));
            let (in_sz, out_sz) = (g.inp.iter().product(), g.out.iter().product::<usize>());
            let n = window_bounds(g).unwrap();
            let mut want = vec![T::NEG; planes * out_sz];
            windows(x, &mut want, None, (in_sz, out_sz), n, g, Mode::Max).unwrap();
            let mut got = vec![T::NEG; planes * out_sz];
            max_pool_2d(x, &mut got, in_sz, out_sz, g).unwrap();
            let bits = |v: &[T]| {
                v.iter()
                    .map(|e| alloc::format!("{e:?}"))
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(&got), bits(&want), "{g:?}");
        }
        let mut cases = 0;
        for (h, w) in [(7, 9), (1, 1), (2, 5), (12, 16), (5, 3), (3, 40)] {
            // (2, 18): more tap columns than `max_pool_2d` keeps ranges of.
            for (k1, k2) in [(3, 3), (2, 2), (1, 3), (3, 1), (5, 4), (2, 18)] {
                for (s1, s2) in [(1, 1), (2, 2), (1, 3), (3, 2)] {
                    for pads in [[0, 0, 0, 0], [1, 1, 1, 1], [0, 2, 1, 0], [2, 0, 0, 3]] {
                        let [pt, pl, pbm, pr] = pads;
                        if pt >= k1 || pbm >= k1 || pl >= k2 || pr >= k2 {
                            continue;
                        }
                        if h + pt + pbm < k1 || w + pl + pr < k2 {
                            continue;
                        }
                        let mut g = Geom::unit();
                        g.inp = [1, h, w];
                        g.k = [1, k1, k2];
                        g.s = [1, s1, s2];
                        g.pb = [0, pt, pl];
                        g.pe = [0, pbm, pr];
                        g.out = [
                            1,
                            out_len(h, k1, s1, 1, pt, pbm, cases % 2 == 1),
                            out_len(w, k2, s2, 1, pl, pr, cases % 2 == 1),
                        ];
                        let planes = 3;
                        let n = planes * h * w;
                        let mut x = rnd(n, cases as u64);
                        // Ties, signed zeros, infinities and NaN in the
                        // first plane.
                        for (i, v) in x.iter_mut().enumerate().take(h * w) {
                            *v = match i % 7 {
                                0 => 0.0,
                                1 => -0.0,
                                2 => f32::NEG_INFINITY,
                                3 if i % 3 == 0 => f32::NAN,
                                4 => 0.5,
                                _ => *v,
                            };
                        }
                        // The second plane all -∞.
                        x[h * w..2 * h * w].fill(f32::NEG_INFINITY);
                        check(&x, planes, &g);
                        let q: Vec<i8> = x.iter().map(|&v| (v * 100.0) as i8).collect();
                        check(&q, planes, &g);
                        let u: Vec<u8> = x.iter().map(|&v| (v * 100.0 + 100.0) as u8).collect();
                        check(&u, planes, &g);
                        let f: Vec<half::f16> = x.iter().map(|&v| half::f16::from_f32(v)).collect();
                        check(&f, planes, &g);
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > 150, "{cases}");
    }

    #[test]
    fn max_pool_2d() {
        check_pool(
            [2, 3, 8, 9],
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 1],
            false,
            None,
            None,
        );
        check_pool(
            [1, 2, 8, 9],
            [3, 3],
            [2, 2],
            [1, 1],
            [0, 0, 0, 0],
            true,
            None,
            None,
        );
        check_pool(
            [1, 2, 7, 7],
            [2, 2],
            [2, 2],
            [1, 1],
            [0, 0, 0, 0],
            true,
            None,
            None,
        );
        check_pool(
            [1, 2, 10, 9],
            [3, 2],
            [1, 2],
            [2, 2],
            [1, 0, 2, 1],
            false,
            None,
            None,
        );
        check_pool(
            [1, 2, 9, 8],
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 0, 1, 1],
            false,
            None,
            Some("SAME_UPPER"),
        );
        check_pool(
            [1, 2, 9, 8],
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1, 1, 0],
            false,
            None,
            Some("SAME_LOWER"),
        );
    }

    #[test]
    fn avg_pool_2d() {
        for inc in [false, true] {
            check_pool(
                [2, 3, 8, 9],
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                false,
                Some(inc),
                None,
            );
            check_pool(
                [1, 2, 8, 9],
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 0, 1, 2],
                true,
                Some(inc),
                None,
            );
            check_pool(
                [1, 2, 7, 6],
                [2, 3],
                [2, 2],
                [1, 1],
                [0, 0, 0, 0],
                true,
                Some(inc),
                None,
            );
            check_pool(
                [1, 2, 10, 9],
                [3, 2],
                [1, 2],
                [2, 2],
                [1, 0, 2, 1],
                false,
                Some(inc),
                None,
            );
            check_pool(
                [1, 2, 9, 8],
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 0, 1, 1],
                false,
                Some(inc),
                Some("SAME_UPPER"),
            );
            // Windows of whole rows (one contiguous run: KWS's 25 × 5 pool,
            // and two rows of 20) and long partial rows (the lane sums).
            for (xs, k, s, p) in [
                ([1, 3, 25, 5], [25, 5], [1, 1], [0, 0, 0, 0]),
                ([1, 2, 6, 20], [2, 20], [2, 1], [0, 0, 0, 0]),
                ([1, 2, 5, 19], [3, 17], [1, 1], [1, 1, 1, 1]),
            ] {
                check_pool(xs, k, s, [1, 1], p, false, Some(inc), None);
            }
        }
    }

    #[test]
    fn pool_onnx_ceil_examples() {
        let x: Vec<f32> = (1..=16).map(|v| v as f32).collect();
        let attrs = || {
            vec![
                ("kernel_shape", ints(&[3, 3])),
                ("strides", ints(&[2, 2])),
                ("ceil_mode", AttrValue::Int(1)),
            ]
        };
        let out = run("MaxPool", 10, attrs(), &[t(&[1, 1, 4, 4], &x)], 1).unwrap();
        assert_eq!(vals::<f32>(&out[0]), vec![11.0, 12.0, 15.0, 16.0]);
        let out = run("AveragePool", 10, attrs(), &[t(&[1, 1, 4, 4], &x)], 1).unwrap();
        assert_close(&vals::<f32>(&out[0]), &[6.0, 7.5, 12.0, 13.5], 1e-6);
    }

    #[test]
    fn pool_1d() {
        let x = rnd(2 * 11, 41);
        let (want, _, ow) = naive_pool(
            &x,
            2,
            1,
            11,
            [1, 3],
            [1, 2],
            [1, 1],
            [0, 1, 0, 1],
            false,
            Some(false),
        );
        let out = run(
            "AveragePool",
            11,
            vec![
                ("kernel_shape", ints(&[3])),
                ("strides", ints(&[2])),
                ("pads", ints(&[1, 1])),
            ],
            &[t(&[1, 2, 11], &x)],
            1,
        )
        .unwrap();
        assert_eq!(out[0].shape, vec![1, 2, ow]);
        assert_close(&vals::<f32>(&out[0]), &want, 1e-6);
        let (want, _, ow) = naive_pool(
            &x,
            2,
            1,
            11,
            [1, 2],
            [1, 2],
            [1, 1],
            [0, 0, 0, 0],
            true,
            None,
        );
        let out = run(
            "MaxPool",
            11,
            vec![
                ("kernel_shape", ints(&[2])),
                ("strides", ints(&[2])),
                ("ceil_mode", AttrValue::Int(1)),
            ],
            &[t(&[1, 2, 11], &x)],
            1,
        )
        .unwrap();
        assert_eq!(out[0].shape, vec![1, 2, ow]);
        assert_close(&vals::<f32>(&out[0]), &want, 1e-6);
    }

    #[test]
    fn max_pool_indices() {
        // Plane 1 of 2, 3x3; 2x2 windows, stride 1.
        let p0: Vec<f32> = (0..9).map(|v| v as f32).collect();
        let p1 = [9.0f32, 1.0, 2.0, 3.0, 4.0, 8.0, 6.0, 7.0, 5.0];
        let x: Vec<f32> = p0.iter().chain(&p1).cloned().collect();
        for (order, want) in [
            (0i64, [4i64, 5, 7, 8, 9, 14, 16, 14]),
            (1, [4, 7, 5, 8, 9, 16, 14, 16]),
        ] {
            let r = run(
                "MaxPool",
                12,
                vec![
                    ("kernel_shape", ints(&[2, 2])),
                    ("storage_order", AttrValue::Int(order)),
                ],
                &[t(&[1, 2, 3, 3], &x)],
                2,
            )
            .unwrap();
            assert_eq!(r[1].shape, vec![1, 2, 2, 2]);
            assert_eq!(
                vals::<f32>(&r[0]),
                vec![4.0, 5.0, 7.0, 8.0, 9.0, 8.0, 7.0, 8.0]
            );
            // Column-major: (h, w) counts as h + w * 3 within the plane.
            assert_eq!(vals::<i64>(&r[1]), want.to_vec());
        }
    }

    #[test]
    fn max_pool_ints() {
        let x: Vec<u8> = vec![1, 200, 3, 4, 5, 6, 250, 8, 9];
        let r = run(
            "MaxPool",
            12,
            vec![("kernel_shape", ints(&[2, 2]))],
            &[t(&[1, 1, 3, 3], &x)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<u8>(&r[0]), vec![200, 200, 250, 9]);
        let x: Vec<i8> = vec![-1, -7, -3, -4];
        let r = run(
            "MaxPool",
            12,
            vec![("kernel_shape", ints(&[2])), ("pads", ints(&[1, 0]))],
            &[t(&[1, 2, 2], &x)],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i8>(&r[0]), vec![-1, -1, -3, -3]);
        // The averaging pools stay f32-only.
        assert!(run(
            "AveragePool",
            12,
            vec![("kernel_shape", ints(&[2]))],
            &[t(&[1, 2, 2], &x)],
            1,
        )
        .is_err());
    }

    #[test]
    fn lp_pool() {
        // 1-D, p = 2, kernel 2, pad 1 each side: the padding adds nothing.
        let x = [3.0f32, -4.0, 12.0];
        let r = run(
            "LpPool",
            18,
            vec![("kernel_shape", ints(&[2])), ("pads", ints(&[1, 1]))],
            &[t(&[1, 1, 3], &x)],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 1, 4]);
        assert_close(
            &vals::<f32>(&r[0]),
            &[3.0, 5.0, math::sqrt(160.0), 12.0],
            1e-6,
        );
        // p = 3 against 2-D windows summed by hand.
        let x = rnd(16, 61);
        let r = run(
            "LpPool",
            18,
            vec![
                ("kernel_shape", ints(&[2, 2])),
                ("strides", ints(&[2, 2])),
                ("p", AttrValue::Int(3)),
            ],
            &[t(&[1, 1, 4, 4], &x)],
            1,
        )
        .unwrap();
        let mut want = Vec::new();
        for (oh, ow) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            let mut s = 0.0f32;
            for (a, b) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                s += x[(2 * oh + a) * 4 + 2 * ow + b].abs().powi(3);
            }
            want.push(s.powf(1.0 / 3.0));
        }
        assert_close(&vals::<f32>(&r[0]), &want, 1e-6);
        let r = run(
            "GlobalLpPool",
            2,
            vec![("p", AttrValue::Int(1))],
            &[t(&[1, 2, 2], &[1.0f32, -2.0, 3.0, 4.0])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 2, 1]);
        assert_close(&vals::<f32>(&r[0]), &[3.0, 7.0], 0.0);
        let r = run(
            "GlobalLpPool",
            2,
            vec![],
            &[t(&[1, 1, 2], &[3.0f32, 4.0])],
            1,
        )
        .unwrap();
        assert_close(&vals::<f32>(&r[0]), &[5.0], 1e-6);
    }

    #[test]
    fn max_unpool() {
        let xv = [1.0f32, 2.0, 3.0, 4.0];
        let iv = [5i64, 7, 13, 15];
        let attrs = || vec![("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2, 2]))];
        let r = run(
            "MaxUnpool",
            11,
            attrs(),
            &[t(&[1, 1, 2, 2], &xv), t(&[1, 1, 2, 2], &iv)],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 1, 4, 4]);
        let mut want = vec![0.0f32; 16];
        for (v, i) in xv.iter().zip(iv) {
            want[i as usize] = *v;
        }
        assert_eq!(vals::<f32>(&r[0]), want);
        // A larger output_shape pads after each axis; indices keep the
        // inferred 4x4 addressing.
        let r = run(
            "MaxUnpool",
            11,
            attrs(),
            &[
                t(&[1, 1, 2, 2], &xv),
                t(&[1, 1, 2, 2], &iv),
                t(&[4], &[1i64, 1, 5, 5]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 1, 5, 5]);
        let mut want = vec![0.0f32; 25];
        for (v, (h, w)) in xv.iter().zip([(1, 1), (1, 3), (3, 1), (3, 3)]) {
            want[h * 5 + w] = *v;
        }
        assert_eq!(vals::<f32>(&r[0]), want);
        assert!(run(
            "MaxUnpool",
            11,
            attrs(),
            &[t(&[1, 1, 2, 2], &xv), t(&[1, 1, 2, 2], &[0i64, 1, 2, 16])],
            1,
        )
        .is_err());
    }

    #[test]
    fn global_pools() {
        let x = rnd(2 * 3 * 4 * 5, 51);
        let avg = run("GlobalAveragePool", 1, vec![], &[t(&[2, 3, 4, 5], &x)], 1).unwrap();
        let mx = run("GlobalMaxPool", 1, vec![], &[t(&[2, 3, 4, 5], &x)], 1).unwrap();
        assert_eq!(avg[0].shape, vec![2, 3, 1, 1]);
        assert_eq!(mx[0].shape, vec![2, 3, 1, 1]);
        let want_avg: Vec<f32> = x.chunks(20).map(|c| c.iter().sum::<f32>() / 20.0).collect();
        let want_max: Vec<f32> = x
            .chunks(20)
            .map(|c| c.iter().cloned().fold(f32::MIN, f32::max))
            .collect();
        assert_close(&vals::<f32>(&avg[0]), &want_avg, 1e-6);
        assert_close(&vals::<f32>(&mx[0]), &want_max, 0.0);
    }

    #[test]
    fn narrow_floats_accumulate_in_f32() {
        use crate::model::AttrValue;
        use crate::ops::testing::{float_types_agree, rnd};
        let x = rnd(2 * 3 * 7 * 8, 51);
        let xs: &[usize] = &[2, 3, 7, 8];
        let k = || AttrValue::Ints(vec![3, 2]);
        float_types_agree(
            "MaxPool",
            12,
            vec![
                ("kernel_shape", k()),
                ("strides", AttrValue::Ints(vec![2, 2])),
            ],
            &[(xs, &x)],
            0.0,
        );
        for include in [0, 1] {
            float_types_agree(
                "AveragePool",
                19,
                vec![
                    ("kernel_shape", k()),
                    ("pads", AttrValue::Ints(vec![1, 1, 1, 0])),
                    ("count_include_pad", AttrValue::Int(include)),
                ],
                &[(xs, &x)],
                1e-5,
            );
        }
        float_types_agree("GlobalAveragePool", 1, vec![], &[(xs, &x)], 1e-5);
        float_types_agree("GlobalMaxPool", 1, vec![], &[(xs, &x)], 0.0);
    }
}
