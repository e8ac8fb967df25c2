//! f32 depthwise convolution, one channel plane at a time (2-D windows).
//!
//! The direct loops of `ops::conv` run one tap over the whole plane at a
//! time, which re-reads the output plane `k × k` times and pays the loop
//! set-up once per tap and row: on the small planes of edge models (KWS:
//! 25 × 5) that set-up is most of the time. Here each output row is finished
//! before the next: border columns tap by tap with bounds tests, interior
//! columns (every tap inside) in one pass per kernel row, three taps fused
//! when the window is 3 wide with stride 1, so the row stays in registers.
//!
//! Small planes (up to [`FLAT`] floats with their padding: every plane of
//! the MLPerf Tiny models) go through [`Flat`] instead: the plane is copied
//! once into a zero-padded buffer of row width `Wp`, and the output is
//! computed on a grid of the same row width, so that each tap becomes one
//! long contiguous (stride-s) multiply-add over the whole plane, `yq[t] +=
//! w * xp[s * t + off]`; the columns of the grid past the output width are
//! discarded. No bounds tests in the loop, and vectors of the plane's size
//! instead of the row's (5 floats in KWS).
//!
//! With AVX2 + FMA, planes of stride 1 whose rows are at most 8 floats
//! wide (KWS's 25 × 5, MobileNets' 7 × 7 and smaller) take
//! `narrow_avx2` first: one masked vector per row, no copy at all.

use super::{copy_row, valid_range, win, win_mut, Geom};
use crate::math;

/// `y[t] += w0 * x[t] + w1 * x[t + 1] + w2 * x[t + 2]` over `y`: three taps
/// of stride 1 at once (`x` has `y.len() + 2` values); `false` if short.
#[inline(always)]
fn three_taps(y: &mut [f32], x: &[f32], [w0, w1, w2]: [f32; 3]) -> bool {
    let n = y.len();
    let (Some(x0), Some(x1), Some(x2)) = (win(x, 0, n), win(x, 1, n), win(x, 2, n)) else {
        return false;
    };
    for (((yv, &a), &b), &c) in y.iter_mut().zip(x0).zip(x1).zip(x2) {
        *yv += w0 * a + w1 * b + w2 * c;
    }
    true
}

/// `y[t] = bias + w[0]·x[0][t] + … + w[8]·x[8][t]`, added tap by tap in
/// that order: a 3 × 3 window in one pass over the grid, with the
/// operations per element of the reference loops (bias, then one product
/// per tap), so f16 / bf16 planes that accumulate in f32 round the same
/// value. `false` if a run is short.
#[inline(always)]
fn nine_taps(y: &mut [f32], bias: f32, x: [&[f32]; 9], w: [f32; 9]) -> bool {
    let n = y.len();
    let [x0, x1, x2, x3, x4, x5, x6, x7, x8] = x;
    let (Some(x0), Some(x1), Some(x2)) = (x0.get(..n), x1.get(..n), x2.get(..n)) else {
        return false;
    };
    let (Some(x3), Some(x4), Some(x5)) = (x3.get(..n), x4.get(..n), x5.get(..n)) else {
        return false;
    };
    let (Some(x6), Some(x7), Some(x8)) = (x6.get(..n), x7.get(..n), x8.get(..n)) else {
        return false;
    };
    let [w0, w1, w2, w3, w4, w5, w6, w7, w8] = w;
    let r0 = x0.iter().zip(x1).zip(x2);
    let r1 = x3.iter().zip(x4).zip(x5);
    let r2 = x6.iter().zip(x7).zip(x8);
    for (yv, (((&a0, &a1), &a2), (((&a3, &a4), &a5), ((&a6, &a7), &a8)))) in
        y.iter_mut().zip(r0.zip(r1.zip(r2)))
    {
        // Tap by tap, as the reference loops add them (same bits).
        let mut v = bias;
        let taps = [a0, a1, a2, a3, a4, a5, a6, a7, a8];
        for (w, a) in [w0, w1, w2, w3, w4, w5, w6, w7, w8].into_iter().zip(taps) {
            v += w * a;
        }
        *yv = v;
    }
    true
}

/// `y[t] += w * x[s·t]` for the `t` both hold. Stride 2 runs blocks of 8
/// outputs over fixed-size arrays, which LLVM turns into vector
/// deinterleaving (a run-time `step_by` stays scalar); one product is
/// added to each `y[t]`, so the split into blocks does not matter.
#[inline(always)]
fn axpy_strided(y: &mut [f32], x: &[f32], s: usize, w: f32) {
    let mut done = 0usize;
    if s == 2 {
        for (yc, xc) in y.chunks_exact_mut(8).zip(x.chunks_exact(16)) {
            let (Ok(yc), Ok(&[a0, _, a1, _, a2, _, a3, _, a4, _, a5, _, a6, _, a7, _])) =
                (<&mut [f32; 8]>::try_from(yc), <&[f32; 16]>::try_from(xc))
            else {
                break;
            };
            let (ev, mut acc) = ([a0, a1, a2, a3, a4, a5, a6, a7], *yc);
            for (yv, e) in acc.iter_mut().zip(ev) {
                *yv += w * e;
            }
            *yc = acc;
            // done <= y.len(): the chunks are in y.
            done = done.wrapping_add(8);
        }
    }
    // done * 2 <= x.len() when done > 0 (the chunks were in x); 0 otherwise.
    let (Some(y), Some(x)) = (y.get_mut(done..), x.get(done.wrapping_mul(s)..)) else {
        return;
    };
    for (yv, &xv) in y.iter_mut().zip(x.iter().step_by(s.max(1))) {
        *yv += w * xv;
    }
}

/// The three weights of a 3-wide kernel row.
#[inline(always)]
fn row3(w: &[f32], at: usize) -> Option<[f32; 3]> {
    match win(w, at, 3)? {
        &[a, b, c] => Some([a, b, c]),
        _ => None,
    }
}

/// Most floats of a padded plane (and of its output grid) for [`Flat`].
pub(crate) const FLAT: usize = 4096;

/// Stack buffers of the flattened path for one geometry, reused across
/// the planes of a call.
pub(crate) struct Flat {
    xp: [f32; FLAT],
    yq: [f32; FLAT],
    /// The even columns of `xp`, then its odd ones (3 × 3, stride 2).
    de: [f32; FLAT],
    g: Geom,
    /// The padded layout of `g`, computed once: `None` when `g` is not
    /// for this path (not 2-D with equal strides, too large, or sizes past
    /// usize).
    sizes: Option<FlatSizes>,
}

/// Element counts of the output, input and kernel plane, the padded row
/// width, the output grid and the padded plane length of a [`Flat`].
#[derive(Clone, Copy)]
struct FlatSizes {
    planes: [usize; 3],
    wp: usize,
    grid: usize,
    len: usize,
}

impl FlatSizes {
    /// Checked: `None` for a geometry past usize or the buffers.
    fn of(g: &Geom) -> Option<Self> {
        let [o0, o1, o2] = g.out;
        let [i0, i1, i2] = g.inp;
        let [k0, k1, k2] = g.k;
        let ([_, s, s2], [_, d1, d2], [_, p1, p2]) = (g.s, g.d, g.pb);
        // i2 >= 1: the input rows are chunks of it.
        if o0 != 1 || i0 != 1 || k0 != 1 || s2 != s || s == 0 || i2 == 0 {
            return None;
        }
        let planes = [
            o1.checked_mul(o2)?,
            i1.checked_mul(i2)?,
            k1.checked_mul(k2)?,
        ];
        // o1, o2, k1, k2 >= 1 here, or `None`.
        let (o2m, k1m, k2m) = (o2.checked_sub(1)?, k1.checked_sub(1)?, k2.checked_sub(1)?);
        // Padded width: every column a valid output reads, and the input.
        let wp = o2m
            .checked_mul(s)?
            .checked_add(k2m.checked_mul(d2)?)?
            .checked_add(1)?
            .max(p2.checked_add(i2)?);
        let grid = o1.checked_mul(wp)?;
        // Highest padded index read for any grid point.
        let reach = s
            .checked_mul(grid.checked_sub(1)?)?
            .checked_add(k1m.checked_mul(d1)?.checked_mul(wp)?)?
            .checked_add(k2m.checked_mul(d2)?)?
            .checked_add(1)?;
        let len = reach.max(p1.checked_add(i1)?.checked_mul(wp)?);
        (len <= FLAT && grid <= FLAT).then_some(FlatSizes {
            planes,
            wp,
            grid,
            len,
        })
    }
}

impl Flat {
    /// Zeroed buffers for planes of geometry `g`.
    pub(crate) fn new(g: &Geom) -> Self {
        Flat {
            xp: [0.0; FLAT],
            yq: [0.0; FLAT],
            de: [0.0; FLAT],
            g: *g,
            sizes: FlatSizes::of(g),
        }
    }

    /// [`plane`] on the padded buffers, its rows clamped to `clamp` (a fused
    /// Relu / Clip, [`math::clip`]) as they are copied out; `false` when the
    /// plane does not fit them (or the geometry is not 2-D with equal
    /// strides).
    // Inlined into its one caller, `ops::conv`'s per-task body, which is
    // compiled for AVX2 when the CPU has it.
    #[inline(always)]
    pub(crate) fn plane(
        &mut self,
        y: &mut [f32],
        x: &[f32],
        w: &[f32],
        bias: f32,
        clamp: Option<(f32, f32)>,
    ) -> bool {
        let Some(FlatSizes {
            planes: [on, inn, kn],
            wp,
            grid,
            len,
        }) = self.sizes
        else {
            return false;
        };
        if y.len() < on || x.len() < inn || w.len() < kn {
            return false;
        }
        let g = &self.g;
        let ([_, i1, i2], [_, k1, k2], [_, s, _]) = (g.inp, g.k, g.s);
        let ([_, d1, d2], [_, p1, p2], [_, _, o2]) = (g.d, g.pb, g.out);
        // From here every index is below `len` or `grid` (at most FLAT,
        // `FlatSizes::of`): the arithmetic below wraps by name and cannot
        // wrap.
        // Every window below lies in `xp` / `yq` by the sizes above; a
        // miss returns `false` (the caller then runs the row kernel).
        let (Some(xp), Some(yq)) = (
            win_mut(&mut self.xp, 0, len),
            win_mut(&mut self.yq, 0, grid),
        ) else {
            return false;
        };
        // The geometry is fixed: planes write the same data rectangle of
        // `xp`, whose padding stays zero from `new`.
        for (r, src) in x.chunks_exact(i2).take(i1).enumerate() {
            // r < i1: (r + p1) · wp + p2 + i2 <= (p1 + i1) · wp <= len.
            let at = r.wrapping_add(p1).wrapping_mul(wp).wrapping_add(p2);
            let Some(dst) = win_mut(xp, at, i2) else {
                return false;
            };
            copy_row(dst, src);
        }
        if k1 == 3 && k2 == 3 && (s == 1 || s == 2) {
            // 3 × 3 (MobileNet's and KWS's depthwise layers): the nine taps
            // in one pass over the grid. With stride 2 the plane is first
            // split into its even and odd columns, so that every tap reads
            // a contiguous run of one of them.
            let src: &[f32] = if s == 1 {
                xp
            } else {
                let h = len.div_ceil(2);
                let Some((even, odd)) = self.de.split_at_mut_checked(h) else {
                    return false;
                };
                for ((e, o), pair) in even.iter_mut().zip(odd.iter_mut()).zip(xp.chunks_exact(2)) {
                    if let &[a, b] = pair {
                        (*e, *o) = (a, b);
                    }
                }
                if len % 2 == 1 {
                    // len >= 1, so h >= 1.
                    let last = (h.wrapping_sub(1), len.wrapping_sub(1));
                    if let (Some(e), Some(&a)) = (even.get_mut(last.0), xp.get(last.1)) {
                        *e = a;
                    }
                }
                &self.de[..]
            };
            let half = len.div_ceil(2);
            let mut taps = [&[][..]; 9];
            for (t, tap) in taps.iter_mut().enumerate() {
                // t / 3 <= k1 - 1 and t % 3 <= k2 - 1: off < reach <= len.
                let off = (t / 3)
                    .wrapping_mul(d1)
                    .wrapping_mul(wp)
                    .wrapping_add((t % 3).wrapping_mul(d2));
                // xp[s·u + off] for u < grid: xp[u + off], or the even
                // (odd) half at u + off / 2 for an even (odd) offset.
                let at = if s == 1 {
                    off
                } else {
                    (off % 2).wrapping_mul(half).wrapping_add(off / 2)
                };
                let Some(run) = win(src, at, grid) else {
                    return false;
                };
                *tap = run;
            }
            let Ok(wv) = <[f32; 9]>::try_from(w.get(..9).unwrap_or(&[])) else {
                return false;
            };
            if !nine_taps(yq, bias, taps, wv) {
                return false;
            }
        } else {
            // Other windows: a pass per tap (three per row for 3-wide rows
            // at stride 1) over the grid filled with the bias.
            yq.fill(bias);
            for (kh, wr) in w.chunks_exact(k2).take(k1).enumerate() {
                // kh < k1: row + kw · d2 < reach <= len for every kw < k2.
                let row = kh.wrapping_mul(d1).wrapping_mul(wp);
                if s == 1 && k2 == 3 && d2 == 1 {
                    let (Some(ws), Some(xs)) = (row3(wr, 0), win(xp, row, grid.wrapping_add(2)))
                    else {
                        return false;
                    };
                    if !three_taps(yq, xs, ws) {
                        return false;
                    }
                    continue;
                }
                for (kw, &wv) in wr.iter().enumerate() {
                    let off = row.wrapping_add(kw.wrapping_mul(d2));
                    if s == 1 {
                        let Some(xs) = win(xp, off, grid) else {
                            return false;
                        };
                        for (yv, &xv) in yq.iter_mut().zip(xs) {
                            *yv += wv * xv;
                        }
                    } else {
                        let Some(xs) = xp.get(off..) else {
                            return false;
                        };
                        axpy_strided(yq, xs, s, wv);
                    }
                }
            }
        }
        for (dst, src) in y.chunks_exact_mut(o2).zip(yq.chunks_exact(wp)) {
            let Some(src) = src.get(..o2) else {
                return false;
            };
            match clamp {
                Some((lo, hi)) => {
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = math::clip(v, lo, hi);
                    }
                }
                None => copy_row(dst, src),
            }
        }
        true
    }
}

/// Widest kernel row [`narrow_avx2`] takes.
#[cfg(target_arch = "x86_64")]
const NARROW_K: usize = 8;

/// `y = bias + x ⋆ w` for one plane of a 2-D window of stride 1 and
/// dilation 1 whose output and input rows are at most 8 floats wide (KWS's
/// 25 × 5 planes; MobileNets' 7 × 7 and smaller): each output row is one
/// 8-lane vector and each tap one masked load of its input row, shifted by
/// the tap's column, whose lanes outside the row read 0 without touching
/// memory. So the plane is never copied ([`Flat`] copies it in and out, 5
/// floats at a time, which cost more than its arithmetic), and four output
/// rows are summed at once (one row's taps form a chain of dependent adds).
/// Each sum is the bias, then one fused multiply-add per tap in the
/// reference loops' order (a tap in the padding adds a zero product, a row
/// of taps in it is skipped): the reference values up to the rounding of
/// the fused products (tested against the definition with rtol 1e-5).
/// With `clamp` (a fused Relu / Clip, [`Act::bounds`]), each row is
/// clamped as it is stored, with [`math::clip`]'s bits (NaN stays NaN), so
/// the activation needs no pass of its own.
/// `false` (nothing written) for any other geometry or a short slice.
///
/// [`Act::bounds`]: crate::ops::activation::Act::bounds
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn narrow_avx2(
    y: &mut [f32],
    x: &[f32],
    w: &[f32],
    bias: f32,
    g: &Geom,
    clamp: Option<(f32, f32)>,
) -> bool {
    let ([o0, o1, o2], [i0, i1, i2], [k0, k1, k2]) = (g.out, g.inp, g.k);
    let ([_, s1, s2], [_, d1, d2], [_, p1, p2]) = (g.s, g.d, g.pb);
    let unit = s1 == 1 && s2 == 1 && d1 == 1 && d2 == 1;
    if o0 != 1 || i0 != 1 || k0 != 1 || !unit || k1 == 0 || o1 == 0 {
        return false;
    }
    if !(1..=8).contains(&o2) || !(1..=8).contains(&i2) || !(1..=NARROW_K).contains(&k2) || p2 > 8 {
        return false;
    }
    // o1 + k1 bounds every row index below (oh + kh), so it cannot wrap.
    let fits = o1.checked_add(k1).is_some()
        && o1.checked_mul(o2).is_some_and(|n| y.len() >= n)
        && i1.checked_mul(i2).is_some_and(|n| x.len() >= n)
        && k1.checked_mul(k2).is_some_and(|n| w.len() >= n);
    if !fits {
        return false;
    }
    let shape = Narrow {
        rows: (o1, o2, i1, i2, k1),
        p: (p1, p2),
        clamp,
    };
    // A loop fully unrolled over the kernel row (its taps' shifts and
    // masks in registers): a loop over them ran at 3× the instructions.
    match k2 {
        1 => narrow_rows::<1>(y, x, w, bias, shape),
        2 => narrow_rows::<2>(y, x, w, bias, shape),
        3 => narrow_rows::<3>(y, x, w, bias, shape),
        4 => narrow_rows::<4>(y, x, w, bias, shape),
        5 => narrow_rows::<5>(y, x, w, bias, shape),
        6 => narrow_rows::<6>(y, x, w, bias, shape),
        7 => narrow_rows::<7>(y, x, w, bias, shape),
        _ => narrow_rows::<8>(y, x, w, bias, shape),
    }
}

/// The geometry [`narrow_avx2`] checked: (output rows, output row width,
/// input rows, input row width, kernel rows) and the leading pads (rows,
/// columns).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Narrow {
    rows: (usize, usize, usize, usize, usize),
    p: (usize, usize),
    clamp: Option<(f32, f32)>,
}

/// [`narrow_avx2`] for kernel rows `K` wide (`K` = the geometry's, checked
/// with the rest by the caller: `y`, `x`, `w` hold the planes, widths and
/// pads at most 8).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn narrow_rows<const K: usize>(y: &mut [f32], x: &[f32], w: &[f32], bias: f32, n: Narrow) -> bool {
    use core::arch::x86_64::*;
    let Narrow {
        rows: (o1, o2, i1, i2, k1),
        p: (p1, p2),
        clamp,
    } = n;
    // Per tap column kw, the shift d = kw - p2 (|d| <= 8) and the lanes
    // whose input column lane + d is in 0..i2.
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut shift = [0isize; K];
    let mut mask = [_mm256_setzero_si256(); K];
    for (kw, (d, m)) in shift.iter_mut().zip(mask.iter_mut()).enumerate() {
        // kw < 8, p2 <= 8, i2 <= 8: all small.
        let dv = (kw as i32).wrapping_sub(p2 as i32);
        *d = dv as isize;
        let lo = _mm256_cmpgt_epi32(lanes, _mm256_set1_epi32(dv.wrapping_neg().wrapping_sub(1)));
        let hi = _mm256_cmpgt_epi32(_mm256_set1_epi32((i2 as i32).wrapping_sub(dv)), lanes);
        *m = _mm256_and_si256(lo, hi);
    }
    let c = Taps {
        base: x.as_ptr(),
        shift,
        mask,
        out: _mm256_cmpgt_epi32(_mm256_set1_epi32(o2 as i32), lanes),
        clamp: clamp.map(|(lo, hi)| (_mm256_set1_ps(lo), _mm256_set1_ps(hi))),
        w,
        bias,
        dims: (o2, i1, i2, k1, p1),
    };
    // R output rows at a time: R independent sums (one row's taps are one
    // chain of dependent adds, k1 · K fused multiply-adds long, so a block
    // takes at least that chain's latency). The last block of a plane
    // ends at its last row and recomputes rows of the block before it
    // (the same bits: x is not y), rather than a short block that takes
    // the whole chain's latency for fewer rows. Eight rows keep K <= 3
    // masks, K weights and 8 sums in the 16 ymm registers.
    if K <= 3 && o1 >= 8 {
        narrow_blocks::<K, 8>(y, o1, &c)
    } else if o1 >= 4 {
        narrow_blocks::<K, 4>(y, o1, &c)
    } else {
        (0..o1).all(|oh| narrow_block::<K, 1>(y, oh, &c))
    }
}

/// [`narrow_rows`]'s output rows in blocks of `R` (`o1 >= R`; the last
/// block moved back to end at row `o1`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn narrow_blocks<const K: usize, const R: usize>(
    y: &mut [f32],
    o1: usize,
    c: &Taps<'_, K>,
) -> bool {
    let Some(last) = o1.checked_sub(R) else {
        return false;
    };
    let mut oh = 0usize;
    loop {
        let at = oh.min(last);
        if !narrow_block::<K, R>(y, at, c) {
            return false;
        }
        if at == last {
            return true;
        }
        oh = oh.wrapping_add(R);
    }
}

/// What [`narrow_block`] reads: the plane, each tap column's shift and
/// lane mask, the output lanes, the kernel, the bias and (output row
/// width, input rows, input row width, kernel rows, leading row pad).
#[cfg(target_arch = "x86_64")]
struct Taps<'a, const K: usize> {
    base: *const f32,
    shift: [isize; K],
    mask: [core::arch::x86_64::__m256i; K],
    out: core::arch::x86_64::__m256i,
    /// The activation's bounds, applied as the rows are stored.
    clamp: Option<(core::arch::x86_64::__m256, core::arch::x86_64::__m256)>,
    w: &'a [f32],
    bias: f32,
    dims: (usize, usize, usize, usize, usize),
}

/// Output rows `oh0 .. oh0 + R` of [`narrow_rows`]; `false` if they are
/// not in `y`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn narrow_block<const K: usize, const R: usize>(
    y: &mut [f32],
    oh0: usize,
    c: &Taps<'_, K>,
) -> bool {
    use core::arch::x86_64::*;
    let (o2, i1, i2, k1, p1) = c.dims;
    let Some(ys) = oh0
        .checked_mul(o2)
        .and_then(|at| win_mut(y, at, R.checked_mul(o2)?))
    else {
        return false;
    };
    let mut acc = [_mm256_set1_ps(c.bias); R];
    for (kh, wr) in c.w.chunks_exact(K).take(k1).enumerate() {
        let Ok(wr) = <&[f32; K]>::try_from(wr) else {
            return false;
        };
        // The kernel row's weights, broadcast once for the R rows.
        let wb = wr.map(|wv| _mm256_set1_ps(wv));
        for (r, a) in acc.iter_mut().enumerate() {
            // Row indices are below o1 + k1, which fits usize (checked).
            let ih = oh0.wrapping_add(r).wrapping_add(kh).wrapping_sub(p1);
            if ih >= i1 {
                continue;
            }
            // ih < i1: row ih starts at ih · i2 < x.len().
            let row = c.base.wrapping_add(ih.wrapping_mul(i2));
            for ((&wv, &d), &m) in wb.iter().zip(&c.shift).zip(&c.mask) {
                // SAFETY: the lanes `m` enables read x[ih · i2 + lane + d]
                // with 0 <= lane + d < i2, in row ih of x; the others touch
                // no memory and read 0.
                let v = unsafe { _mm256_maskload_ps(row.wrapping_offset(d), m) };
                *a = _mm256_fmadd_ps(wv, v, *a);
            }
        }
    }
    for (yrow, mut a) in ys.chunks_exact_mut(o2).zip(acc) {
        if let Some((lo, hi)) = c.clamp {
            // math::clip: max_ps(lo, a) is lo where lo > a, else a (NaN
            // too); min_ps(hi, ·) likewise.
            a = _mm256_min_ps(hi, _mm256_max_ps(lo, a));
        }
        // SAFETY: the lanes `out` enables are 0..o2 = yrow.len().
        unsafe { _mm256_maskstore_ps(yrow.as_mut_ptr(), c.out, a) };
    }
    true
}

/// `y = bias + x ⋆ w` for one plane of a 2-D window (`g.k[0] == 1`,
/// `g.inp[0] == g.out[0] == 1`); `false` (nothing written) when the
/// geometry is not that or a slice is short.
#[inline(always)]
pub(crate) fn plane(y: &mut [f32], x: &[f32], w: &[f32], bias: f32, g: &Geom) -> bool {
    let [o0, o1, o2] = g.out;
    let [i0, i1, i2] = g.inp;
    let [k0, k1, k2] = g.k;
    let ([_, s1, s2], [_, d1, d2], [_, p1, p2]) = (g.s, g.d, g.pb);
    // The furthest tap of the last output of each axis, o·s + k·d, must
    // fit usize (it does for any geometry `ops::conv` prepared); then every
    // index below is at most that and wraps by name, never in fact.
    let reach =
        |o: usize, s: usize, k: usize, d: usize| o.checked_mul(s)?.checked_add(k.checked_mul(d)?);
    let fits = o1.checked_mul(o2).is_some_and(|n| y.len() >= n)
        && i1.checked_mul(i2).is_some_and(|n| x.len() >= n)
        && k1.checked_mul(k2).is_some_and(|n| w.len() >= n)
        && reach(o1, s1, k1, d1).is_some()
        && reach(o2, s2, k2, d2).is_some();
    if o0 != 1 || i0 != 1 || k0 != 1 || !fits {
        return false;
    }
    if o2 == 0 || k2 == 0 {
        let Some(y) = win_mut(y, 0, o1.wrapping_mul(o2)) else {
            return false;
        };
        y.fill(bias);
        return true;
    }
    // Columns where the first and the last tap of a row are inside.
    let (a_lo, a_hi) = valid_range(o2, s2, 0, p2, i2);
    let last_tap = k2.wrapping_sub(1).wrapping_mul(d2);
    let (b_lo, b_hi) = valid_range(o2, s2, last_tap, p2, i2);
    let (lo, hi) = (a_lo.max(b_lo), a_hi.min(b_hi));
    let (lo, hi) = if lo < hi { (lo, hi) } else { (0, 0) };
    for (oh, yrow) in y.chunks_exact_mut(o2).take(o1).enumerate() {
        yrow.fill(bias);
        for kh in 0..k1 {
            // oh < o1, kh < k1: within `reach` (checked above).
            let ih = oh
                .wrapping_mul(s1)
                .wrapping_add(kh.wrapping_mul(d1))
                .wrapping_sub(p1);
            if ih >= i1 {
                continue;
            }
            // ih < i1, kh < k1: below i1 · i2 and k1 · k2 (checked above).
            let (xat, wat) = (ih.wrapping_mul(i2), kh.wrapping_mul(k2));
            let (Some(xrow), Some(wr)) = (win(x, xat, i2), win(w, wat, k2)) else {
                return false;
            };
            // Border columns, tap by tap (`get` is the bounds test).
            for ow in (0..lo).chain(hi.max(lo)..o2) {
                let mut sum = 0.0;
                for (kw, &wv) in wr.iter().enumerate() {
                    // ow < o2, kw < k2: within `reach`.
                    let iw = ow
                        .wrapping_mul(s2)
                        .wrapping_add(kw.wrapping_mul(d2))
                        .wrapping_sub(p2);
                    if let Some(&xv) = xrow.get(iw) {
                        sum += wv * xv;
                    }
                }
                if let Some(yv) = yrow.get_mut(ow) {
                    *yv += sum;
                }
            }
            if lo == hi {
                continue;
            }
            // lo < hi <= o2 here; interior: lo · s2 + kw · d2 - p2 >= 0 for
            // every kw (valid_range), and lo · s2 is within `reach`.
            let n = hi.wrapping_sub(lo);
            let base = lo.wrapping_mul(s2).wrapping_sub(p2);
            let Some(yin) = win_mut(yrow, lo, n) else {
                return false;
            };
            if s2 == 1 && d2 == 1 && k2 == 3 {
                let (Some(ws), Some(xs)) = (row3(wr, 0), win(xrow, base, n.wrapping_add(2))) else {
                    return false;
                };
                if !three_taps(yin, xs, ws) {
                    return false;
                }
            } else if s2 == 1 {
                for (kw, &wv) in wr.iter().enumerate() {
                    let Some(xs) = win(xrow, base.wrapping_add(kw.wrapping_mul(d2)), n) else {
                        return false;
                    };
                    for (yv, &xv) in yin.iter_mut().zip(xs) {
                        *yv += wv * xv;
                    }
                }
            } else {
                for (kw, &wv) in wr.iter().enumerate() {
                    let Some(xs) = xrow.get(base.wrapping_add(kw.wrapping_mul(d2))..) else {
                        return false;
                    };
                    axpy_strided(yin, xs, s2, wv);
                }
            }
        }
    }
    true
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    extern crate std;
    use std::vec::Vec;

    pub(in crate::kern) fn naive(x: &[f32], w: &[f32], bias: f32, g: &Geom) -> Vec<f32> {
        let [_, o1, o2] = g.out;
        let [_, i1, i2] = g.inp;
        let [_, k1, k2] = g.k;
        let mut y = std::vec![bias; o1 * o2];
        for oh in 0..o1 {
            for ow in 0..o2 {
                for kh in 0..k1 {
                    for kw in 0..k2 {
                        let ih = (oh * g.s[1] + kh * g.d[1]) as isize - g.pb[1] as isize;
                        let iw = (ow * g.s[2] + kw * g.d[2]) as isize - g.pb[2] as isize;
                        if ih >= 0 && iw >= 0 && (ih as usize) < i1 && (iw as usize) < i2 {
                            y[oh * o2 + ow] += w[kh * k2 + kw] * x[ih as usize * i2 + iw as usize];
                        }
                    }
                }
            }
        }
        y
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn both_avx2(
        flat: &mut Flat,
        y: &mut [f32],
        yf: &mut [f32],
        x: &[f32],
        w: &[f32],
        g: &Geom,
    ) {
        plane(y, x, w, 0.25, g);
        flat.plane(yf, x, w, 0.25, None);
    }

    /// [`narrow_avx2`] against the definition on every row width it takes
    /// (1–8), kernel rows 1–8 wide, pads 0–8 on either side (asymmetric
    /// too, and past the row), and where it must refuse.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn narrow_rows_match_the_definition() {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            std::eprintln!("skipped: this CPU has no AVX2+FMA");
            return;
        }
        let mut cases = 0;
        let geom = |(i1, i2): (usize, usize), (k1, k2), (pb, pe): (usize, usize)| {
            let ext = |i: usize, k: usize| (i + pb + pe).checked_sub(k - 1).filter(|&o| o > 0);
            let (o1, o2) = (ext(i1, k1)?, ext(i2, k2)?);
            Some(Geom {
                inp: [1, i1, i2],
                out: [1, o1, o2],
                k: [1, k1, k2],
                s: [1, 1, 1],
                d: [1, 1, 1],
                pb: [0, pb, pb],
                pe: [0, pe, pe],
            })
        };
        use crate::kern::pick;
        let widths = [1, 2, 3, 4, 5, 6, 7, 8];
        let all_pads = [(0, 0), (1, 1), (2, 0), (0, 3), (4, 4), (8, 1)];
        let heights = [(1, 1), (25, 3), (6, 5), (3, 4)];
        for &i2 in pick(&widths, &[5, 8]) {
            for &k2 in pick(&widths, &[3, 8]) {
                for &pads in pick(&all_pads, &[(1, 1), (0, 3)]) {
                    for &(i1, k1) in pick(&heights, &[(6, 3)]) {
                        let Some(g) = geom((i1, i2), (k1, k2), pads) else {
                            continue;
                        };
                        let x = crate::ops::testing::rnd(i1 * i2, cases as u64 + 1);
                        let w = crate::ops::testing::rnd(k1 * k2, cases as u64 + 2);
                        let want = naive(&x, &w, 0.25, &g);
                        let mut y = std::vec![f32::NAN; want.len() + 3];
                        // SAFETY: the CPU has AVX2 and FMA.
                        let took = unsafe { narrow_avx2(&mut y, &x, &w, 0.25, &g, None) };
                        assert_eq!(took, g.out[2] <= 8, "{g:?}");
                        if !took {
                            continue;
                        }
                        for (t, &wv) in want.iter().enumerate() {
                            let tol = 1e-5 + 1e-5 * wv.abs();
                            assert!((y[t] - wv).abs() <= tol, "{g:?} at {t}: {} vs {wv}", y[t]);
                        }
                        // Nothing written past the plane.
                        assert!(y[want.len()..].iter().all(|v| v.is_nan()), "{g:?}");
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > crate::kern::count(600, 3), "{cases}");
        // Refused: stride 2, dilation 2, rows of 9, a 9-wide kernel row,
        // short slices.
        let g = geom((5, 5), (3, 3), (1, 1)).unwrap();
        let (x, w) = (std::vec![1.0; 25], std::vec![1.0; 9]);
        let mut y = std::vec![0.0; 25];
        for bad in [
            Geom { s: [1, 2, 2], ..g },
            Geom { d: [1, 2, 2], ..g },
            Geom {
                inp: [1, 5, 9],
                out: [1, 5, 9],
                ..g
            },
            Geom { k: [1, 3, 9], ..g },
        ] {
            // SAFETY: the CPU has AVX2 and FMA.
            let took = unsafe { narrow_avx2(&mut y, &x, &w, 0.0, &bad, None) };
            assert!(!took, "{bad:?}");
        }
        // SAFETY: as above.
        unsafe {
            assert!(!narrow_avx2(&mut y[..24], &x, &w, 0.0, &g, None));
            assert!(!narrow_avx2(&mut y, &x[..24], &w, 0.0, &g, None));
            assert!(!narrow_avx2(&mut y, &x, &w[..8], 0.0, &g, None));
            assert!(narrow_avx2(&mut y, &x, &w, 0.0, &g, None));
        }
        assert_eq!(y[6], 9.0);
    }

    #[test]
    fn both_paths_match_the_definition() {
        let mut seed = 5u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let mut cases = 0;
        use crate::kern::pick;
        let planes = [(1, 1), (5, 5), (25, 5), (7, 12), (48, 48), (70, 70)];
        let kernels = [(1, 1), (3, 3), (5, 5), (3, 1), (1, 7)];
        let pads = [(0, 0), (1, 1), (2, 1), (0, 3)];
        for &(i1, i2) in pick(&planes, &[(5, 5), (7, 12)]) {
            for &(k1, k2) in pick(&kernels, &[(3, 3), (1, 7)]) {
                for s in [1, 2] {
                    for d in [1, 2] {
                        for &pad in pick(&pads, &[(1, 1), (0, 3)]) {
                            let ext = |i: usize, k: usize| {
                                let span = (k - 1) * d + 1;
                                (i + pad.0 + pad.1).checked_sub(span).map(|v| v / s + 1)
                            };
                            let (Some(o1), Some(o2)) = (ext(i1, k1), ext(i2, k2)) else {
                                continue;
                            };
                            let g = Geom {
                                inp: [1, i1, i2],
                                out: [1, o1, o2],
                                k: [1, k1, k2],
                                s: [1, s, s],
                                d: [1, d, d],
                                pb: [0, pad.0, pad.0],
                                pe: [0, pad.1, pad.1],
                            };
                            let x: Vec<f32> = (0..i1 * i2).map(|_| rnd()).collect();
                            let w: Vec<f32> = (0..k1 * k2).map(|_| rnd()).collect();
                            let want = naive(&x, &w, 0.25, &g);
                            let mut y = std::vec![f32::NAN; o1 * o2];
                            assert!(plane(&mut y, &x, &w, 0.25, &g));
                            let mut yf = std::vec![f32::NAN; o1 * o2];
                            let mut flat = Flat::new(&g);
                            let fits = flat.plane(&mut yf, &x, &w, 0.25, None);
                            // The AVX2 + FMA build of both paths (what
                            // `ops::conv` runs on such CPUs) gives the
                            // same bits: no product is fused.
                            #[cfg(target_arch = "x86_64")]
                            if std::is_x86_feature_detected!("avx2")
                                && std::is_x86_feature_detected!("fma")
                            {
                                let (mut y2, mut yf2) =
                                    (std::vec![f32::NAN; y.len()], std::vec![f32::NAN; yf.len()]);
                                // SAFETY: the CPU has AVX2 and FMA.
                                unsafe { both_avx2(&mut flat, &mut y2, &mut yf2, &x, &w, &g) };
                                let bits =
                                    |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                                assert_eq!(bits(&y2), bits(&y), "rows, AVX2 {g:?}");
                                if fits {
                                    assert_eq!(bits(&yf2), bits(&yf), "flat, AVX2 {g:?}");
                                }
                            }
                            for (t, &wv) in want.iter().enumerate() {
                                let tol = 1e-5 + 1e-5 * wv.abs();
                                assert!((y[t] - wv).abs() <= tol, "rows {g:?} at {t}");
                                if fits {
                                    assert!((yf[t] - wv).abs() <= tol, "flat {g:?} at {t}");
                                }
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert!(cases > crate::kern::count(300, 10), "{cases}");
    }
}
