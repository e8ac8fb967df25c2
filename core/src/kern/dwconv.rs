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

// 32 integer `+ - * / %` sites here are not yet checked, saturating or
// wrapping by name (issue 8); `ops` and `kern` deny the lint elsewhere.
#![cfg_attr(not(mote_arith_debt), allow(clippy::arithmetic_side_effects))]

use super::{copy_row, valid_range, win, win_mut, Geom};

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
    let mut done = 0;
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
            done += 8;
        }
    }
    let (Some(y), Some(x)) = (y.get_mut(done..), x.get(done * s..)) else {
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

/// Stack buffers of the flattened path, reused across the planes of a call.
pub(crate) struct Flat {
    xp: [f32; FLAT],
    yq: [f32; FLAT],
    /// The even columns of `xp`, then its odd ones (3 × 3, stride 2).
    de: [f32; FLAT],
    /// The layout `(len, wp, p1, p2, i1, i2)` of the last plane copied in:
    /// `xp[..len]` is zero outside that layout's data rectangle, so a plane
    /// of the same layout need not clear the padding again. `None`: all of
    /// `xp` is zero.
    layout: Option<[usize; 6]>,
}

impl Flat {
    /// Zeroed buffers.
    pub(crate) fn new() -> Self {
        Flat {
            xp: [0.0; FLAT],
            yq: [0.0; FLAT],
            de: [0.0; FLAT],
            layout: None,
        }
    }

    /// [`plane`] on the padded buffers; `false` when the plane does not fit
    /// them (or the geometry is not 2-D with equal strides).
    // Inlined into its one caller, `ops::conv`'s per-task body, which is
    // compiled for AVX2 when the CPU has it.
    #[inline(always)]
    pub(crate) fn plane(
        &mut self,
        y: &mut [f32],
        x: &[f32],
        w: &[f32],
        bias: f32,
        g: &Geom,
    ) -> bool {
        let [o0, o1, o2] = g.out;
        let [i0, i1, i2] = g.inp;
        let [k0, k1, k2] = g.k;
        let [_, s, s2] = g.s;
        if o0 != 1
            || i0 != 1
            || k0 != 1
            || s2 != s
            || s == 0
            || o1 == 0
            || o2 == 0
            || k1 == 0
            || k2 == 0
        {
            return false;
        }
        if y.len() < o1 * o2 || x.len() < i1 * i2 || w.len() < k1 * k2 {
            return false;
        }
        let ([_, d1, d2], [_, p1, p2]) = (g.d, g.pb);
        // Padded width: every column a valid output reads, and the input.
        let wp = ((o2 - 1) * s + (k2 - 1) * d2 + 1).max(p2 + i2);
        let grid = o1 * wp;
        // Highest padded index read for any grid point.
        let reach = s * (grid - 1) + (k1 - 1) * d1 * wp + (k2 - 1) * d2 + 1;
        let len = reach.max((p1 + i1) * wp);
        if len > FLAT || grid > FLAT {
            return false;
        }
        // Every window below lies in `xp` / `yq` by the sizes above; a
        // miss returns `false` (the caller then runs the row kernel).
        let (Some(xp), Some(yq)) = (
            win_mut(&mut self.xp, 0, len),
            win_mut(&mut self.yq, 0, grid),
        ) else {
            return false;
        };
        let layout = [len, wp, p1, p2, i1, i2];
        if self.layout.is_some_and(|l| l != layout) {
            xp.fill(0.0);
        }
        // Only the data rectangle of `layout` is written below.
        self.layout = Some(layout);
        for (r, src) in x.chunks_exact(i2).take(i1).enumerate() {
            let Some(dst) = win_mut(xp, (r + p1) * wp + p2, i2) else {
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
                    if let (Some(e), Some(&a)) = (even.get_mut(h - 1), xp.get(len - 1)) {
                        *e = a;
                    }
                }
                &self.de[..]
            };
            let half = len.div_ceil(2);
            let mut taps = [&[][..]; 9];
            for (t, tap) in taps.iter_mut().enumerate() {
                let off = (t / 3) * d1 * wp + (t % 3) * d2;
                // xp[s·u + off] for u < grid: xp[u + off], or the even
                // (odd) half at u + off / 2 for an even (odd) offset.
                let at = if s == 1 {
                    off
                } else {
                    (off % 2) * half + off / 2
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
                let row = kh * d1 * wp;
                if s == 1 && k2 == 3 && d2 == 1 {
                    let (Some(ws), Some(xs)) = (row3(wr, 0), win(xp, row, grid + 2)) else {
                        return false;
                    };
                    if !three_taps(yq, xs, ws) {
                        return false;
                    }
                    continue;
                }
                for (kw, &wv) in wr.iter().enumerate() {
                    let off = row + kw * d2;
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
            copy_row(dst, src);
        }
        true
    }
}

/// `y = bias + x ⋆ w` for one plane of a 2-D window (`g.k[0] == 1`,
/// `g.inp[0] == g.out[0] == 1`); `false` (nothing written) when the
/// geometry is not that or a slice is short.
#[inline(always)]
pub(crate) fn plane(y: &mut [f32], x: &[f32], w: &[f32], bias: f32, g: &Geom) -> bool {
    let [o0, o1, o2] = g.out;
    let [i0, i1, i2] = g.inp;
    let [k0, k1, k2] = g.k;
    if o0 != 1 || i0 != 1 || k0 != 1 || y.len() < o1 * o2 || x.len() < i1 * i2 || w.len() < k1 * k2
    {
        return false;
    }
    let ([_, s1, s2], [_, d1, d2], [_, p1, p2]) = (g.s, g.d, g.pb);
    if o2 == 0 || k2 == 0 {
        let Some(y) = win_mut(y, 0, o1 * o2) else {
            return false;
        };
        y.fill(bias);
        return true;
    }
    // Columns where the first and the last tap of a row are inside.
    let (a_lo, a_hi) = valid_range(o2, s2, 0, p2, i2);
    let (b_lo, b_hi) = valid_range(o2, s2, (k2 - 1) * d2, p2, i2);
    let (lo, hi) = (a_lo.max(b_lo), a_hi.min(b_hi));
    let (lo, hi) = if lo < hi { (lo, hi) } else { (0, 0) };
    for (oh, yrow) in y.chunks_exact_mut(o2).take(o1).enumerate() {
        yrow.fill(bias);
        for kh in 0..k1 {
            let ih = (oh * s1 + kh * d1).wrapping_sub(p1);
            if ih >= i1 {
                continue;
            }
            let (Some(xrow), Some(wr)) = (win(x, ih * i2, i2), win(w, kh * k2, k2)) else {
                return false;
            };
            // Border columns, tap by tap (`get` is the bounds test).
            for ow in (0..lo).chain(hi.max(lo)..o2) {
                let mut sum = 0.0;
                for (kw, &wv) in wr.iter().enumerate() {
                    let iw = (ow * s2 + kw * d2).wrapping_sub(p2);
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
            let n = hi - lo;
            // Interior: lo * s2 + kw * d2 - p2 >= 0 for every kw.
            let base = lo * s2 - p2;
            let Some(yin) = win_mut(yrow, lo, n) else {
                return false;
            };
            if s2 == 1 && d2 == 1 && k2 == 3 {
                let (Some(ws), Some(xs)) = (row3(wr, 0), win(xrow, base, n + 2)) else {
                    return false;
                };
                if !three_taps(yin, xs, ws) {
                    return false;
                }
            } else if s2 == 1 {
                for (kw, &wv) in wr.iter().enumerate() {
                    let Some(xs) = win(xrow, base + kw * d2, n) else {
                        return false;
                    };
                    for (yv, &xv) in yin.iter_mut().zip(xs) {
                        *yv += wv * xv;
                    }
                }
            } else {
                for (kw, &wv) in wr.iter().enumerate() {
                    let Some(xs) = xrow.get(base + kw * d2..) else {
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
mod tests {
    use super::*;
    extern crate std;
    use std::vec::Vec;

    fn naive(x: &[f32], w: &[f32], bias: f32, g: &Geom) -> Vec<f32> {
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
        flat.plane(yf, x, w, 0.25, g);
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
        let mut flat = Flat::new();
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
                            let fits = flat.plane(&mut yf, &x, &w, 0.25, &g);
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
