//! Integer average pools (`com.microsoft` QLinearAveragePool and
//! QLinearGlobalAveragePool): exact sums of `x - zx`, divided and
//! requantized with [`Requant::apply_div`].

use super::requant::{clamp, Requant};
use super::{check_len, out_of_bounds, valid_range, win, Geom, QInt};
use crate::error::Result;

/// `zx`, `zy` and the multiplier `sx / sy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolParams {
    pub zx: i32,
    pub zy: i32,
    pub r: Requant,
}

/// Mean over the `img` spatial elements of each of `n · c` channels;
/// NHWC when `cl`.
pub(crate) fn global_avg<T: QInt>(
    x: &[T],
    y: &mut [T],
    n: usize,
    c: usize,
    img: usize,
    cl: bool,
    p: &PoolParams,
) -> Result<()> {
    let plane = img.checked_mul(c).ok_or_else(out_of_bounds)?;
    check_len(x.len(), plane.checked_mul(n).ok_or_else(out_of_bounds)?)?;
    check_len(y.len(), n.checked_mul(c).ok_or_else(out_of_bounds)?)?;
    // Element (b, ch, s) sits at b·img·c + ch·cs + s·ss. Every index and
    // sum below is bounded by x.len() (checked above) or by x.len() · 2^8:
    // the wrapping operations are exact.
    let (cs, ss) = if cl { (1, c) } else { (img, 1) };
    let mut ys = y.iter_mut();
    for b in 0..n {
        let xb = win(x, b.wrapping_mul(plane), plane).ok_or_else(out_of_bounds)?;
        for ch in 0..c {
            let mut sum = 0i64;
            for s in 0..img {
                let at = ch.wrapping_mul(cs).wrapping_add(s.wrapping_mul(ss));
                let v = xb.get(at).ok_or_else(out_of_bounds)?.get();
                sum = sum.wrapping_add(i64::from(v));
            }
            let sum = sum.wrapping_sub(i64::from(p.zx).wrapping_mul(img as i64));
            let v = p.r.apply_div(sum, img as i64);
            *ys.next().ok_or_else(out_of_bounds)? = T::from_sat(clamp(v, p.zy, T::LO, T::HI));
        }
    }
    Ok(())
}

/// Windowed average over `n · c` planes of geometry `g` (no dilations);
/// NHWC when `cl`. `include` counts the padding in the divisor.
/// Whether [`avg_pool`] sums channel-first rows as runs (vectorized loops):
/// on 64-bit hosts. Microcontrollers keep the tap loop, 700 bytes smaller
/// in a Cortex-M3 firmware, with no vector unit to gain from the runs.
const RUNS: bool = cfg!(target_pointer_width = "64");

#[allow(clippy::too_many_arguments)]
pub(crate) fn avg_pool<T: QInt>(
    x: &[T],
    y: &mut [T],
    n: usize,
    c: usize,
    cl: bool,
    g: &Geom,
    include: bool,
    p: &PoolParams,
) -> Result<()> {
    let (in_sz, out_sz) = (g.in_size(), g.out_size());
    let nc = n.checked_mul(c).ok_or_else(out_of_bounds)?;
    check_len(x.len(), nc.checked_mul(in_sz).ok_or_else(out_of_bounds)?)?;
    check_len(y.len(), nc.checked_mul(out_sz).ok_or_else(out_of_bounds)?)?;
    // Every index below is below x.len() or y.len() (checked above; the
    // window ranges come from `valid_range`), every sum below x.len() ·
    // 2^9, the window size below x.len() plus the padding (`geom_ok`): the
    // wrapping operations are exact, wrapping by name only.
    let [o0, o1, o2] = g.out;
    let [i0, i1, i2] = g.inp;
    let [k0, k1, k2] = g.k;
    let [s0, s1, s2] = g.s;
    let [p0, p1, p2] = g.pb;
    let full = k0.wrapping_mul(k1).wrapping_mul(k2) as i64;
    let zx = i64::from(p.zx);
    // Spatial element stride and channel stride.
    let (es, cs_in, cs_out) = if cl { (c, 1, 1) } else { (1, in_sz, out_sz) };
    for b in 0..n {
        for ch in 0..c {
            let bc = b.wrapping_mul(c);
            let xb = bc.wrapping_mul(in_sz).wrapping_add(ch.wrapping_mul(cs_in));
            let yb = bc
                .wrapping_mul(out_sz)
                .wrapping_add(ch.wrapping_mul(cs_out));
            for od in 0..o0 {
                let d0 = od.wrapping_mul(s0);
                let (ad, bd) = valid_range(k0, 1, d0, p0, i0);
                for oh in 0..o1 {
                    let h0 = oh.wrapping_mul(s1);
                    let (ah, bh) = valid_range(k1, 1, h0, p1, i1);
                    for ow in 0..o2 {
                        let w0 = ow.wrapping_mul(s2);
                        let (aw, bw) = valid_range(k2, 1, w0, p2, i2);
                        let (nh, nw) = (bh.wrapping_sub(ah), bw.wrapping_sub(aw));
                        let mut sum = 0i64;
                        for kd in ad..bd {
                            let id = d0.wrapping_add(kd).wrapping_sub(p0);
                            let plane = xb.wrapping_add(id.wrapping_mul(i1).wrapping_mul(i2));
                            if RUNS && es == 1 && ah < bh && w0.wrapping_add(aw) == p2 && nw == i2 {
                                // Whole rows (KWS's 25 × 5 pool): one run.
                                let ih = h0.wrapping_add(ah).wrapping_sub(p1);
                                let at = plane.wrapping_add(ih.wrapping_mul(i2));
                                let len = nh.wrapping_mul(i2);
                                let run = win(x, at, len).ok_or_else(out_of_bounds)?;
                                let raw: i64 = run.iter().map(|v| v.get() as i64).sum();
                                sum =
                                    sum.wrapping_add(raw.wrapping_sub(zx.wrapping_mul(len as i64)));
                                continue;
                            }
                            for kh in ah..bh {
                                let ih = h0.wrapping_add(kh).wrapping_sub(p1);
                                let row = id.wrapping_mul(i1).wrapping_add(ih).wrapping_mul(i2);
                                if RUNS && es == 1 && aw < bw {
                                    // Channel-first: the row's taps are one
                                    // run, summed in a loop that vectorizes
                                    // (integer sums: any order is exact).
                                    let iw = w0.wrapping_add(aw).wrapping_sub(p2);
                                    let at = xb.wrapping_add(row).wrapping_add(iw);
                                    let run = win(x, at, nw).ok_or_else(out_of_bounds)?;
                                    let raw: i64 = run.iter().map(|v| v.get() as i64).sum();
                                    sum = sum
                                        .wrapping_add(raw.wrapping_sub(zx.wrapping_mul(nw as i64)));
                                    continue;
                                }
                                for kw in aw..bw {
                                    let iw = w0.wrapping_add(kw).wrapping_sub(p2);
                                    let at = xb.wrapping_add(row.wrapping_add(iw).wrapping_mul(es));
                                    let v = x.get(at).ok_or_else(out_of_bounds)?;
                                    sum = sum.wrapping_add(i64::from(v.get().wrapping_sub(p.zx)));
                                }
                            }
                        }
                        let taps = bd.wrapping_sub(ad).wrapping_mul(nh).wrapping_mul(nw) as i64;
                        let cnt = if include { full } else { taps };
                        let v = p.r.apply_div(sum, cnt);
                        let o = od
                            .wrapping_mul(o1)
                            .wrapping_add(oh)
                            .wrapping_mul(o2)
                            .wrapping_add(ow);
                        *y.get_mut(yb.wrapping_add(o.wrapping_mul(es)))
                            .ok_or_else(out_of_bounds)? = T::from_sat(clamp(v, p.zy, T::LO, T::HI));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate std;
    use std::vec::Vec;

    /// `avg_pool` against the definition (every tap by index, window sums
    /// then `apply_div`), channel-first and channel-last, with and without
    /// the padding counted: windows of whole rows (one run), partial rows
    /// (a run per row) and padded windows.
    #[test]
    fn avg_pool_matches_the_definition() {
        let mut seed = 11u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) % 256) as i32 - 128
        };
        // (inp [h, w], k, s, pads [top, left, bottom, right])
        type Case = ([usize; 2], [usize; 2], [usize; 2], [usize; 4]);
        let cases: [Case; 5] = [
            ([25, 5], [25, 5], [1, 1], [0, 0, 0, 0]),
            ([6, 7], [2, 7], [2, 1], [0, 0, 0, 0]),
            ([7, 9], [3, 4], [2, 3], [1, 1, 1, 1]),
            ([5, 5], [3, 3], [1, 1], [1, 2, 1, 0]),
            ([4, 6], [4, 6], [1, 1], [0, 0, 0, 0]),
        ];
        let r = Requant::new(0.7).unwrap();
        let p = PoolParams { zx: -3, zy: 5, r };
        for ([h, w], k, s, pads) in cases {
            let oh = (h + pads[0] + pads[2] - k[0]) / s[0] + 1;
            let ow = (w + pads[1] + pads[3] - k[1]) / s[1] + 1;
            let g = Geom {
                inp: [1, h, w],
                out: [1, oh, ow],
                k: [1, k[0], k[1]],
                s: [1, s[0], s[1]],
                d: [1, 1, 1],
                pb: [0, pads[0], pads[1]],
                pe: [0, pads[2], pads[3]],
            };
            let (n, c) = (2, 3);
            let x: Vec<i8> = (0..n * c * h * w).map(|_| rnd() as i8).collect();
            for cl in [false, true] {
                for include in [false, true] {
                    let mut y = std::vec![0i8; n * c * oh * ow];
                    avg_pool(&x, &mut y, n, c, cl, &g, include, &p).unwrap();
                    for b in 0..n {
                        for ch in 0..c {
                            for yh in 0..oh {
                                for yw in 0..ow {
                                    let (mut sum, mut taps) = (0i64, 0i64);
                                    for a in 0..k[0] {
                                        for bb in 0..k[1] {
                                            let ih = (yh * s[0] + a) as isize - pads[0] as isize;
                                            let iw = (yw * s[1] + bb) as isize - pads[1] as isize;
                                            if ih < 0
                                                || iw < 0
                                                || ih >= h as isize
                                                || iw >= w as isize
                                            {
                                                continue;
                                            }
                                            let sp = ih as usize * w + iw as usize;
                                            let at = if cl {
                                                (b * h * w + sp) * c + ch
                                            } else {
                                                (b * c + ch) * h * w + sp
                                            };
                                            sum += (x[at] as i64) - p.zx as i64;
                                            taps += 1;
                                        }
                                    }
                                    let cnt = if include { (k[0] * k[1]) as i64 } else { taps };
                                    let v = clamp(p.r.apply_div(sum, cnt), p.zy, -128, 127);
                                    let o = yh * ow + yw;
                                    let at = if cl {
                                        (b * oh * ow + o) * c + ch
                                    } else {
                                        (b * c + ch) * oh * ow + o
                                    };
                                    assert_eq!(
                                        y[at] as i64, v as i64,
                                        "{g:?} cl {cl} include {include} at {at}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
