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
    check_len(x.len(), n * c * img)?;
    check_len(y.len(), n * c)?;
    // Element (b, ch, s) sits at b·img·c + ch·cs + s·ss.
    let (cs, ss) = if cl { (1, c) } else { (img, 1) };
    let mut ys = y.iter_mut();
    for b in 0..n {
        let xb = win(x, b * img * c, img * c).ok_or_else(out_of_bounds)?;
        for ch in 0..c {
            let mut sum = 0i64;
            for s in 0..img {
                sum += xb.get(ch * cs + s * ss).ok_or_else(out_of_bounds)?.get() as i64;
            }
            let sum = sum - p.zx as i64 * img as i64;
            let v = p.r.apply_div(sum, img as i64);
            *ys.next().ok_or_else(out_of_bounds)? = T::from_sat(clamp(v, p.zy, T::LO, T::HI));
        }
    }
    Ok(())
}

/// Windowed average over `n · c` planes of geometry `g` (no dilations);
/// NHWC when `cl`. `include` counts the padding in the divisor.
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
    check_len(x.len(), n * c * in_sz)?;
    check_len(y.len(), n * c * out_sz)?;
    let [o0, o1, o2] = g.out;
    let [i0, i1, i2] = g.inp;
    let [k0, k1, k2] = g.k;
    let [s0, s1, s2] = g.s;
    let [p0, p1, p2] = g.pb;
    let full = (k0 * k1 * k2) as i64;
    // Spatial element stride and channel stride.
    let (es, cs_in, cs_out) = if cl { (c, 1, 1) } else { (1, in_sz, out_sz) };
    for b in 0..n {
        for ch in 0..c {
            let xb = b * c * in_sz + ch * cs_in;
            let yb = b * c * out_sz + ch * cs_out;
            for od in 0..o0 {
                let (ad, bd) = valid_range(k0, 1, od * s0, p0, i0);
                for oh in 0..o1 {
                    let (ah, bh) = valid_range(k1, 1, oh * s1, p1, i1);
                    for ow in 0..o2 {
                        let (aw, bw) = valid_range(k2, 1, ow * s2, p2, i2);
                        let mut sum = 0i64;
                        for kd in ad..bd {
                            let id = od * s0 + kd - p0;
                            for kh in ah..bh {
                                let ih = oh * s1 + kh - p1;
                                let row = (id * i1 + ih) * i2;
                                for kw in aw..bw {
                                    let iw = ow * s2 + kw - p2;
                                    let v =
                                        x.get(xb + (row + iw) * es).ok_or_else(out_of_bounds)?;
                                    sum += (v.get() - p.zx) as i64;
                                }
                            }
                        }
                        let taps = ((bd - ad) * (bh - ah) * (bw - aw)) as i64;
                        let cnt = if include { full } else { taps };
                        let v = p.r.apply_div(sum, cnt);
                        let o = (od * o1 + oh) * o2 + ow;
                        *y.get_mut(yb + o * es).ok_or_else(out_of_bounds)? =
                            T::from_sat(clamp(v, p.zy, T::LO, T::HI));
                    }
                }
            }
        }
    }
    Ok(())
}
