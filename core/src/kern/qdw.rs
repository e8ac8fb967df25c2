//! Integer depthwise convolution on 64-bit hosts, bit-identical to
//! [`super::qconv::dw_plane`] (the reference loop, which tests the taps of
//! every output one by one).
//!
//! Both paths turn each kernel tap into one contiguous multiply-add of i16
//! differences `x - zx` (0 over the padding) into i32 sums; the sums are
//! exact modulo 2^32 like the reference's, so the order does not matter.
//! - [`DwScratch::flat`]: a plane of up to [`FLAT`] values with its padding
//!   is copied once into a zero-padded buffer of row width `Wp`; the output
//!   is a grid of the same row width, so each tap is one multiply-add over
//!   the whole plane (`acc[t] += w · xp[s·t + off]`, the grid columns past
//!   the output width are dropped). Strided windows read the buffer split
//!   by stride phase, so the reads stay contiguous. This is every plane of
//!   the MLPerf Tiny models, where a row is a handful of values.
//! - [`DwScratch::rows`]: larger planes, a strip of up to [`STRIP`] outputs
//!   of a row at a time; each input row a window row reads is copied per
//!   strip, split by phase.
//!
//! The whole channel loop is compiled for AVX2 when the CPU has it.

// Integer arithmetic is checked, saturating or wrapping by name (issue 8):
// the flat path's sizes are checked once per plane (`sizes`, against the
// scratch length N) and the row path's by `two_d_fits`, the tap ranges and
// `valid_range`; offsets under those bounds wrap by name. Values and zero
// points are 8-bit (in [-128, 255]): their differences and products with
// weights fit i32.

use core::num::NonZeroUsize;

use super::cpu::Kernels;
use super::par::{self, SharedMut};
use super::qconv::{dw_plane, finish_row, tap_range, QConvView};
use super::requant::Requant;
use super::{valid_range, win, win_mut, Geom, QInt};

/// Most values of a padded plane (and of its output grid).
pub(crate) const FLAT: usize = 16384;
/// Values of the small scratch, for planes that fit it: the big one costs
/// its clearing (128 KiB) on every call, as much as a small model's sums.
pub(crate) const SMALL: usize = 4096;
/// Values of the tiny scratch (8 KiB), for in-place planes of a few
/// hundred values (KWS's 25 × 5): clearing the small one on every call
/// cost KWS int8 1.4 % of its time (min 0.0935 -> 0.0909 ms with it). The
/// out-of-place planes keep [`SMALL`]: on MobileNetV2 int8's 14 × 14 and
/// 7 × 7 planes the tiny one made `grid_pairs_avx512` slower (MobileNetV2
/// int8 min 7.90 -> 8.05 ms, 4 alternating rounds; not understood).
pub(crate) const TINY: usize = 1024;
/// Outputs of one row strip.
const STRIP: usize = 256;
/// Most strides.
const MAX_S: usize = 4;
/// Most `(k - 1) · dilation` columns of the row path.
const MAX_REACH: usize = 64;
/// Most taps of the flat path.
const MAX_TAPS: usize = 64;
/// Grid points of the flat path summed in registers at a time.
const CHUNK: usize = 32;
/// Inputs one phase of a row strip reads.
const PHASE: usize = STRIP + MAX_REACH + 1;

/// Stack buffers, reused across the planes of one call (8 bytes per value
/// of `N`: 128 KiB at [`FLAT`], 32 KiB at [`SMALL`]).
pub(crate) struct DwScratch<const N: usize = FLAT> {
    xp: [i16; N],
    ph: [i16; N],
    acc: [i32; N],
    /// The flat path's taps `(weight, base)`, and their pairs: set per
    /// plane, kept here so that no plane clears them (7 × 7 planes have
    /// fewer sums than these arrays have bytes).
    taps: [(i32, usize); MAX_TAPS],
    pairs: [(i32, usize); MAX_TAPS],
    /// The layout the flat path last set up ([`Layout`]): while planes keep
    /// it (all the planes of one call do), `xp`'s padding is still zero (a
    /// plane writes only its rows' places, and zeros) and `bases` and
    /// `plan` hold; the first plane clears and computes them.
    laid_out: Option<Layout>,
    /// Per tap: where grid point 0 reads it.
    bases: [usize; MAX_TAPS],
    /// Taps paired for `vpmaddwd` ([`pair_plan`]), and their count.
    plan: [(usize, usize, usize); MAX_TAPS],
    n_pairs: usize,
    /// The flat path sums pairs of taps with AVX-512 BW `vpmaddwd`.
    avx512: bool,
}

impl<const N: usize> DwScratch<N> {
    /// Buffers for the kernel selection `sel` ([`super::qgemm::selection`]).
    pub(crate) fn with(sel: (Kernels, bool)) -> Self {
        DwScratch {
            xp: [0; N],
            ph: [0; N],
            acc: [0; N],
            taps: [(0, 0); MAX_TAPS],
            pairs: [(0, 0); MAX_TAPS],
            laid_out: None,
            bases: [0; MAX_TAPS],
            plan: [(0, NO_TAP, 0); MAX_TAPS],
            n_pairs: 0,
            avx512: cfg!(target_arch = "x86_64") && sel == (Kernels::Avx2Fma, true),
        }
    }

    /// Channel `c`: `xp` its input plane, `wp` its kernel, `yo` its output
    /// plane; `false` (nothing written) when neither path takes the
    /// geometry (3-D windows, strides above 4, very wide windows).
    #[inline(always)]
    pub(crate) fn plane<X: QInt, W: QInt, Y: QInt>(
        &mut self,
        xp: &[X],
        wp: &[W],
        yo: &mut [Y],
        c: usize,
        q: &QConvView<'_>,
    ) -> bool {
        self.flat(xp, wp, yo, c, q) || self.rows(xp, wp, yo, c, q)
    }

    /// The padded-plane path (equal strides on both axes).
    #[inline(always)]
    pub(crate) fn flat<X: QInt, W: QInt, Y: QInt>(
        &mut self,
        xp: &[X],
        wp: &[W],
        yo: &mut [Y],
        c: usize,
        q: &QConvView<'_>,
    ) -> bool {
        let g = &q.p.g;
        let [_, o1, o2] = g.out;
        let [_, i1, i2] = g.inp;
        let [_, k1, k2] = g.k;
        let s = g.s[1];
        if !two_d_fits(xp, wp, yo, q) || g.s[2] != s {
            return false;
        }
        // 1 <= s <= MAX_S (`two_d_fits`).
        let Some(s_nz) = NonZeroUsize::new(s) else {
            return false;
        };
        if o1 == 0 || o2 == 0 || k1 == 0 || k2 == 0 {
            return false;
        }
        let (d1, d2, p1, p2) = (g.d[1], g.d[2], g.pb[1], g.pb[2]);
        if k1.checked_mul(k2).is_none_or(|t| t > MAX_TAPS) {
            return false;
        }
        // The sizes below, checked: a geometry whose padded grid does not
        // even fit in a usize takes the row path (which bounds-checks).
        let sizes = || -> Option<(usize, usize, usize, usize)> {
            let m = usize::checked_mul;
            let a = usize::checked_add;
            // o1, o2, k1, k2 >= 1 (checked above), and grid >= CHUNK: the
            // `- 1`s do not wrap.
            // Padded width: every column a valid output reads, and the input.
            let wpd =
                a(a(m(o2.wrapping_sub(1), s)?, m(k2.wrapping_sub(1), d2)?)?, 1)?.max(a(p2, i2)?);
            // Grid points, rounded up to whole chunks (the extra ones are
            // computed on zeros and dropped).
            let grid = m(a(m(o1.wrapping_sub(1), wpd)?, o2)?.div_ceil(CHUNK), CHUNK)?;
            // One past the highest padded index any grid point reads.
            let reach = a(
                a(
                    m(s, grid.wrapping_sub(1))?,
                    m(m(k1.wrapping_sub(1), d1)?, wpd)?,
                )?,
                a(m(k2.wrapping_sub(1), d2)?, 1)?,
            )?;
            let len = reach.max(m(a(p1, i1)?, wpd)?);
            let plen = len.div_ceil(s.max(1));
            Some((wpd, grid, len, plen))
        };
        let Some((wpd, grid, len, plen)) = sizes() else {
            return false;
        };
        // One value of slack past `len` and past the phases: a tap summed
        // in a pair with a zero weight reads one past its own reach.
        if len >= N || grid > N || plen.saturating_mul(s) >= N {
            return false;
        }
        let Some((zw, b, r)) = channel(q, c) else {
            return false;
        };
        // Every window below lies in the buffers by the sizes above; a miss
        // returns `false` (the caller then runs the row path).
        let DwScratch {
            xp: buf,
            ph,
            acc,
            taps,
            pairs,
            laid_out,
            bases,
            plan,
            n_pairs,
            avx512,
        } = self;
        let n_taps = k1.wrapping_mul(k2);
        // len < N, plen · s < N, grid <= N and k1 · k2 <= MAX_TAPS (checked
        // above) bound every offset below; each tap's offset is under
        // `reach` <= len.
        let Some(buf) = win_mut(buf, 0, len.wrapping_add(1)) else {
            return false;
        };
        let (Some(bases), Some(wk)) = (win_mut(bases, 0, n_taps), win(wp, 0, n_taps)) else {
            return false;
        };
        let layout = [wpd, len, plen, s, k1, k2, d1, d2, p1, p2, i1, i2];
        if *laid_out != Some(layout) {
            *laid_out = None;
            buf.fill(0);
            // No division per tap: on the small planes of late layers
            // (7 × 7) this set-up once per channel cost as much as the sums.
            let mut slots = bases.iter_mut();
            for kh in 0..k1 {
                let row = kh.wrapping_mul(d1).wrapping_mul(wpd);
                for kw in 0..k2 {
                    let off = row.wrapping_add(kw.wrapping_mul(d2));
                    let Some(t) = slots.next() else {
                        return false;
                    };
                    let (phase, at) = match s {
                        1 => (0, off),
                        2 => (off & 1, off >> 1),
                        _ => (off % s_nz, off / s_nz),
                    };
                    // phase < s and at < plen: phase · plen + at < plen · s < N.
                    *t = phase.wrapping_mul(plen).wrapping_add(at);
                }
            }
            // Pairs only for the AVX-512 sums.
            *n_pairs = if *avx512 { pair_plan(bases, plan) } else { 0 };
            *laid_out = Some(layout);
        }
        let pad = PadRows {
            i1,
            i2,
            p1,
            wpd,
            p2,
            zx: q.zx,
        };
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `avx512` is set only for the VNNI selection, made only
        // when the CPU has AVX-512 F and BW (`cpu::enable_avx512_vnni`).
        let done = *avx512 && unsafe { rows_in_avx512(xp, buf, pad) };
        #[cfg(not(target_arch = "x86_64"))]
        let done = false;
        if !done && !rows_in(xp, buf, pad) {
            return false;
        }
        let src: &[i16] = if s == 1 {
            buf
        } else {
            // Phase f holds buf[s·u + f] at u (and a zero of slack).
            let Some(ph) = win_mut(ph, 0, plen.wrapping_mul(s).wrapping_add(1)) else {
                return false;
            };
            if let Some(last) = ph.last_mut() {
                *last = 0;
            }
            for (f, phase) in ph.chunks_exact_mut(plen).take(s).enumerate() {
                let from = buf.get(f..).unwrap_or_default();
                let n = from.len().div_ceil(s).min(plen);
                let Some((head, rest)) = phase.split_at_mut_checked(n) else {
                    return false;
                };
                strided(head, from, s, |v| v);
                rest.fill(0);
            }
            ph
        };
        // Each tap: its weight and where grid point 0 reads it.
        let Some(taps) = win_mut(taps, 0, n_taps) else {
            return false;
        };
        for ((t, wv), &base) in taps.iter_mut().zip(wk).zip(&*bases) {
            *t = (wv.get().wrapping_sub(zw), base);
        }
        let taps: &[(i32, usize)] = taps;
        #[cfg(target_arch = "x86_64")]
        if *avx512 {
            let Some(pairs) = pairs.get_mut(..*n_pairs) else {
                return false;
            };
            for (p, &(a, b, base)) in pairs.iter_mut().zip(&*plan) {
                // The weights are differences of 8-bit values and zero
                // points, within i16.
                let wa = taps.get(a).map_or(0, |t| t.0);
                let wb = taps.get(b).map_or(0, |t| t.0);
                *p = (
                    ((wa as u16 as u32) | ((wb as u16 as u32) << 16)) as i32,
                    base,
                );
            }
            let pairs: &[(i32, usize)] = pairs;
            // SAFETY: `avx512` is set only for the VNNI selection, made
            // where the CPU has AVX-512 F, BW and VNNI.
            if !unsafe { grid_pairs_avx512(src, pairs, b, grid, acc) } {
                return false;
            }
            // SAFETY: as above (AVX-512 implies AVX2).
            if !unsafe { compact_rows_avx2(acc, o1, o2, wpd) } {
                return false;
            }
            return finish_grid(acc, yo, o1, o2, o2, r, q);
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (avx512, pairs, n_pairs);
        // A chunk of sums stays in registers across the taps.
        for (t0, out) in (0..grid).step_by(CHUNK).zip(acc.chunks_exact_mut(CHUNK)) {
            let mut a = [b; CHUNK];
            for &(wv, base) in taps {
                // base + t0 < plen · s + grid, far below usize::MAX.
                let Some(xs) = win(src, base.wrapping_add(t0), CHUNK) else {
                    continue;
                };
                for (x, &v) in a.iter_mut().zip(xs) {
                    *x = x.wrapping_add(i32::from(v).wrapping_mul(wv));
                }
            }
            out.copy_from_slice(&a);
        }
        finish_grid(acc, yo, o1, o2, wpd, r, q)
    }

    /// The row-strip path.
    #[inline(always)]
    pub(crate) fn rows<X: QInt, W: QInt, Y: QInt>(
        &mut self,
        xp: &[X],
        wp: &[W],
        yo: &mut [Y],
        c: usize,
        q: &QConvView<'_>,
    ) -> bool {
        let g = &q.p.g;
        let [_, o1, o2] = g.out;
        let [_, _, i2] = g.inp;
        let [_, _, k2] = g.k;
        let (s, d, pb) = (g.s[2], g.d[2], g.pb[2]);
        let reach = k2.saturating_sub(1).saturating_mul(d);
        if !two_d_fits(xp, wp, yo, q) || reach > MAX_REACH {
            return false;
        }
        // 1 <= s <= MAX_S (`two_d_fits`).
        let Some(s_nz) = NonZeroUsize::new(s) else {
            return false;
        };
        // The phases of a strip fit the scratch (not the tiny one at
        // stride 4).
        if PHASE.saturating_mul(s) > N {
            return false;
        }
        let Some((zw, b, r)) = channel(q, c) else {
            return false;
        };
        let DwScratch { ph, acc, .. } = self;
        // Bounds: ow0 < o2 and wl <= STRIP, so tl <= PHASE; the rows a tap
        // range keeps (`tap_range`) and the columns `valid_range` keeps lie
        // inside the input, so oh·s + kh·d - pb and (ow0 + t)·s + f - pb do
        // not wrap and index rows of `xp` (i1 · i2 values, `two_d_fits`);
        // kh · k2 + k2 <= k1 · k2 <= wp.len(); oh · o2 + ow0 + wl <= o1 · o2.
        for oh in 0..o1 {
            let rh = tap_range(g, 1, oh);
            let mut ow0 = 0usize;
            while ow0 < o2 {
                let wl = STRIP.min(o2.wrapping_sub(ow0));
                let tl = wl.wrapping_add(reach / s_nz).wrapping_add(1);
                // Every window below lies in its slice by `two_d_fits`, the
                // tap range and `valid_range`; a miss returns `false`.
                let Some(acc) = win_mut(acc, 0, wl) else {
                    return false;
                };
                acc.fill(b);
                for kh in rh.0..rh.1 {
                    let ih = oh
                        .wrapping_mul(g.s[1])
                        .wrapping_add(kh.wrapping_mul(g.d[1]))
                        .wrapping_sub(g.pb[1]);
                    let Some(xrow) = win(xp, ih.wrapping_mul(i2), i2) else {
                        return false;
                    };
                    // Phase f, entry t: input column (ow0 + t)·s + f - pb.
                    for (f, phase) in ph.chunks_exact_mut(PHASE).take(s).enumerate() {
                        let col0 = ow0.wrapping_mul(s).wrapping_add(f);
                        let (lo, hi) = valid_range(tl, s, col0, pb, i2);
                        let Some((head, mid, tail)) = split3(phase, lo, hi, tl) else {
                            return false;
                        };
                        head.fill(0);
                        tail.fill(0);
                        if lo < hi {
                            let first = ow0.wrapping_add(lo).wrapping_mul(s);
                            let first = first.wrapping_add(f).wrapping_sub(pb);
                            let span = hi.wrapping_sub(lo).wrapping_sub(1).wrapping_mul(s);
                            let Some(cols) = win(xrow, first, span.wrapping_add(1)) else {
                                return false;
                            };
                            strided(mid, cols, s, |x| x.get().wrapping_sub(q.zx) as i16);
                        }
                    }
                    let Some(wrow) = win(wp, kh.wrapping_mul(k2), k2) else {
                        return false;
                    };
                    for (kw, wv) in wrow.iter().enumerate() {
                        let wv = i32::from(wv.get().wrapping_sub(zw) as i16);
                        // off <= reach <= MAX_REACH.
                        let off = kw.wrapping_mul(d);
                        let at = (off % s_nz).wrapping_mul(PHASE).wrapping_add(off / s_nz);
                        let Some(src) = win(ph, at, wl) else {
                            return false;
                        };
                        for (a, &xv) in acc.iter_mut().zip(src) {
                            *a = a.wrapping_add(i32::from(xv).wrapping_mul(wv));
                        }
                    }
                }
                let Some(yrow) = win_mut(yo, oh.wrapping_mul(o2).wrapping_add(ow0), wl) else {
                    return false;
                };
                finish_row(yrow, acc, 0, r, &q.out);
                ow0 = ow0.wrapping_add(wl);
            }
        }
        true
    }
}

/// The flat path's output: the grid rows (row width `wpd`), packed together
/// (row oh moves down from oh·wpd to oh·o2), requantized in one pass (rows
/// of a handful of values would otherwise run the scalar tail of
/// `finish_row`).
#[inline(always)]
fn finish_grid<Y: QInt>(
    acc: &mut [i32],
    yo: &mut [Y],
    o1: usize,
    o2: usize,
    wpd: usize,
    r: &Requant,
    q: &QConvView<'_>,
) -> bool {
    // Rows already compacted (`wpd == o2`) stay where they are.
    if wpd != o2 && !compact_rows(acc, o1, o2, wpd) {
        return false;
    }
    let n = o1.wrapping_mul(o2);
    let (Some(sums), Some(yo)) = (win(acc, 0, n), win_mut(yo, 0, n)) else {
        return false;
    };
    finish_row(yo, sums, 0, r, &q.out);
    true
}

/// Moves grid rows 1 .. o1 (row width `wpd`) down to row width `o2`, so
/// that the first o1 · o2 sums are the output's. Out of line: inlined into
/// the channel loop, `copy_within` stayed a call per row (KWS int8 +3 %
/// instructions); here it is inlined. `false` if a row is outside `acc`.
#[inline(never)]
fn compact_rows(acc: &mut [i32], o1: usize, o2: usize, wpd: usize) -> bool {
    // oh < o1 and o2 <= wpd: oh · wpd + o2 <= grid <= N (the flat path's
    // checked sizes), and oh · o2 below that.
    for oh in 1..o1 {
        let from = oh.wrapping_mul(wpd);
        let end = from.wrapping_add(o2);
        if acc.get(from..end).is_none() {
            return false;
        }
        acc.copy_within(from..end, oh.wrapping_mul(o2));
    }
    true
}

/// [`compact_rows`] for rows of at most 8 sums, a row per 8-lane load and
/// store (else through [`compact_rows`]; masked stores of 5 lanes were as
/// slow as the `memmove` calls). Each store also writes up to 8 - o2
/// values past its row: those land where later rows are stored (rewritten
/// in turn) or past the output, and never on a row not read yet — row oh
/// (>= 2) is read at oh · wpd, the store of row oh - 1 ends at
/// (oh - 1) · o2 + 8 <= oh · wpd when 2 · wpd >= o2 + 8 (since wpd >= o2).
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn compact_rows_avx2(acc: &mut [i32], o1: usize, o2: usize, wpd: usize) -> bool {
    use core::arch::x86_64::*;
    let fits = o2 <= 8 && o2 <= wpd && wpd.checked_mul(2).is_some_and(|w| w >= o2.wrapping_add(8));
    // The last row's load (and every store, o2 <= wpd) ends by
    // (o1 - 1) · wpd + 8.
    let end = o1
        .checked_sub(1)
        .and_then(|r| r.checked_mul(wpd))
        .and_then(|v| v.checked_add(8));
    if !fits || end.is_none_or(|e| e > acc.len()) {
        return compact_rows(acc, o1, o2, wpd);
    }
    let p = acc.as_mut_ptr();
    for oh in 1..o1 {
        // SAFETY: oh < o1: both 8-lane windows, at oh · wpd and at
        // oh · o2 <= oh · wpd, end by (o1 - 1) · wpd + 8 <= acc.len()
        // (checked above).
        unsafe {
            let v = _mm256_loadu_si256(p.add(oh.wrapping_mul(wpd)).cast());
            _mm256_storeu_si256(p.add(oh.wrapping_mul(o2)).cast(), v);
        }
    }
    true
}

/// What the flat path's padded buffer and tap bases depend on: padded row
/// width, buffer and phase lengths, stride, kernel, dilations, leading
/// padding and input plane.
type Layout = [usize; 12];

/// No second tap in a [`pair_plan`] entry.
const NO_TAP: usize = usize::MAX;

/// Taps by their bases as pairs `(a, b, base)` for `vpmaddwd`: a tap whose
/// base is one past tap `a`'s joins it as `b`, the others get `b =`
/// [`NO_TAP`] (weight 0, reading one value past their reach, times 0).
/// Returns the number of pairs written.
fn pair_plan(bases: &[usize], plan: &mut [(usize, usize, usize); MAX_TAPS]) -> usize {
    let mut used = [false; MAX_TAPS];
    let mut n = 0;
    for (i, &base) in bases.iter().enumerate() {
        if used.get(i).copied().unwrap_or(true) {
            continue;
        }
        let mut second = NO_TAP;
        // i < bases.len().
        for (j, &b) in bases.iter().enumerate().skip(i.wrapping_add(1)) {
            if b == base.wrapping_add(1) {
                if let Some(u @ false) = used.get_mut(j) {
                    *u = true;
                    second = j;
                    break;
                }
            }
        }
        if let Some(p) = plan.get_mut(n) {
            *p = (i, second, base);
            // n < MAX_TAPS (plan[n] exists).
            n = n.wrapping_add(1);
        }
    }
    n
}

/// The flat path's sums with AVX-512 BW: `acc[t] = b + Σ_pairs wa·src[base
/// + t] + wb·src[base + t + 1]` for `t < grid` (a multiple of [`CHUNK`]):
/// per 32 grid points, one `vpmaddwd` for the even points (the i16 pairs
/// at `base + t0`) and one for the odd ones (at `base + t0 + 1`), then
/// interleaved. `false` if a read or write would leave its slice.
///
/// # Safety
/// The CPU must support AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn grid_pairs_avx512(
    src: &[i16],
    pairs: &[(i32, usize)],
    b: i32,
    grid: usize,
    acc: &mut [i32],
) -> bool {
    use core::arch::x86_64::*;
    let reach = pairs.iter().map(|p| p.1).max().unwrap_or(0);
    if !grid.is_multiple_of(CHUNK)
        || acc.len() < grid
        || reach.saturating_add(grid).saturating_add(1) > src.len()
    {
        return false;
    }
    const _: () = assert!(CHUNK == 32);
    let lo_idx = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    let hi_idx = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    let bv = _mm512_set1_epi32(b);
    let (sp, ap) = (src.as_ptr(), acc.as_mut_ptr());
    let mut t0 = 0;
    while t0 < grid {
        let (mut e, mut o) = (bv, bv);
        for &(w, base) in pairs {
            let wv = _mm512_set1_epi32(w);
            // SAFETY: base + t0 + 32 < base + grid + 1 <= src.len()
            // (checked above, so neither sum wraps).
            unsafe {
                let p = sp.add(base.wrapping_add(t0));
                let xe = _mm512_loadu_si512(p as *const __m512i);
                let xo = _mm512_loadu_si512(p.add(1) as *const __m512i);
                e = _mm512_add_epi32(e, _mm512_madd_epi16(xe, wv));
                o = _mm512_add_epi32(o, _mm512_madd_epi16(xo, wv));
            }
        }
        // e holds points t0 + 2i, o points t0 + 2i + 1.
        let lo = _mm512_unpacklo_epi32(e, o);
        let hi = _mm512_unpackhi_epi32(e, o);
        // SAFETY: t0 + 32 <= grid <= acc.len().
        unsafe {
            let d = ap.add(t0) as *mut __m512i;
            _mm512_storeu_si512(d, _mm512_permutex2var_epi32(lo, lo_idx, hi));
            _mm512_storeu_si512(d.add(1), _mm512_permutex2var_epi32(lo, hi_idx, hi));
        }
        t0 = t0.wrapping_add(CHUNK);
    }
    true
}

/// Where the flat path puts an input plane of `i1` rows of `i2` values:
/// row `ih` at `(ih + p1) · wpd + p2` of the padded buffer, each value
/// minus the zero point `zx`.
#[derive(Clone, Copy)]
struct PadRows {
    i1: usize,
    i2: usize,
    p1: usize,
    wpd: usize,
    p2: usize,
    zx: i32,
}

/// Plane `xp` into the padded buffer as `r` says. `false` if a row would
/// leave `buf`.
#[inline(always)]
fn rows_in<X: QInt>(xp: &[X], buf: &mut [i16], r: PadRows) -> bool {
    let PadRows {
        i1,
        i2,
        p1,
        wpd,
        p2,
        zx,
    } = r;
    for (ih, row) in xp.chunks_exact(i2).take(i1).enumerate() {
        // ih < i1: (ih + p1) · wpd + p2 + i2 <= (p1 + i1) · wpd, checked
        // by the caller against the buffer; a miss fails the window.
        let at = ih.wrapping_add(p1).wrapping_mul(wpd).wrapping_add(p2);
        let Some(dst) = win_mut(buf, at, i2) else {
            return false;
        };
        for (d, v) in dst.iter_mut().zip(row) {
            *d = v.get().wrapping_sub(zx) as i16;
        }
    }
    true
}

/// [`rows_in`] for 8-bit `X` and rows of at most 32 values, a row per
/// masked load, widening and store (the rows of the MLPerf Tiny planes
/// are 5 to 25 values: the loop above runs them one value at a time).
/// `false` (nothing written) for other types or widths, or if `xp` or
/// `buf` is too short.
///
/// # Safety
/// The CPU must support AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn rows_in_avx512<X: QInt>(xp: &[X], buf: &mut [i16], r: PadRows) -> bool {
    use core::arch::x86_64::*;
    let (i1, i2, p1, wpd, p2, zx) = (r.i1, r.i2, r.p1, r.wpd, r.p2, r.zx);
    if size_of::<X>() != 1 || i2 == 0 || i2 > 32 || i1 == 0 {
        return false;
    }
    // The last row ends at (p1 + i1 - 1) · wpd + p2 + i2.
    let end = p1
        .checked_add(i1)
        .map(|r| r.wrapping_sub(1))
        .and_then(|r| r.checked_mul(wpd))
        .and_then(|v| v.checked_add(p2))
        .and_then(|v| v.checked_add(i2));
    if end.is_none_or(|e| e > buf.len()) || i1.checked_mul(i2).is_none_or(|n| n > xp.len()) {
        return false;
    }
    // i2 <= 32: the masks select the row's bytes and its i16 lanes.
    let m8: u64 = (1u64 << i2).wrapping_sub(1);
    let m16: u32 = (1u64 << i2).wrapping_sub(1) as u32;
    // zx is an 8-bit zero point, in [-128, 255].
    let z = _mm512_set1_epi16(zx as i16);
    let (sp, dp, buf_len) = (xp.as_ptr().cast::<i8>(), buf.as_mut_ptr(), buf.len());
    for ih in 0..i1 {
        // SAFETY: row ih's i2 bytes are inside xp (i1 · i2 <= xp.len())
        // and its i2 lanes at (ih + p1) · wpd + p2 inside buf (the last
        // row's end <= buf.len(), checked above); masked-off lanes are
        // neither read nor written, and the plain store's 16 lanes end by
        // buf.len() (checked before it).
        unsafe {
            let v = _mm512_maskz_loadu_epi8(m8, sp.add(ih.wrapping_mul(i2)));
            let lo = _mm512_castsi512_si256(v);
            let w = if X::LO < 0 {
                _mm512_cvtepi8_epi16(lo)
            } else {
                _mm512_cvtepu8_epi16(lo)
            };
            let at = ih.wrapping_add(p1).wrapping_mul(wpd).wrapping_add(p2);
            // The lanes past the row as zeros, so that where 16 lanes fit
            // in buf (at + 16 <= buf.len(), no wrap: at < buf.len()) one
            // plain store writes the row and zeros after it (a masked
            // store of a few lanes is slow). The zeros land on padding
            // (zero already) or on later rows' places, which those rows
            // then write.
            let d = _mm512_maskz_sub_epi16(m16, w, z);
            if i2 <= 16 && at.wrapping_add(16) <= buf_len {
                _mm256_storeu_si256(dp.add(at).cast(), _mm512_castsi512_si256(d));
            } else {
                _mm512_mask_storeu_epi16(dp.add(at), m16, d);
            }
        }
    }
    true
}

/// `dst[t] = f(src[s·t])`, for the `t` both hold. Stride 1 is a plain zip
/// and stride 2 runs blocks of 8 over fixed-size arrays: both vectorize
/// (a run-time `step_by` stays scalar).
#[inline(always)]
fn strided<S: Copy>(dst: &mut [i16], src: &[S], s: usize, f: impl Fn(S) -> i16) {
    let mut done = 0usize;
    match s {
        1 => {
            for (v, &x) in dst.iter_mut().zip(src) {
                *v = f(x);
            }
            return;
        }
        2 => {
            for (dc, sc) in dst.chunks_exact_mut(8).zip(src.chunks_exact(16)) {
                let (Ok(dc), Ok(&[a0, _, a1, _, a2, _, a3, _, a4, _, a5, _, a6, _, a7, _])) =
                    (<&mut [i16; 8]>::try_from(dc), <&[S; 16]>::try_from(sc))
                else {
                    break;
                };
                *dc = [a0, a1, a2, a3, a4, a5, a6, a7].map(&f);
                // done <= dst.len().
                done = done.wrapping_add(8);
            }
        }
        _ => {}
    }
    let (Some(dst), Some(src)) = (dst.get_mut(done..), src.get(done.saturating_mul(s)..)) else {
        return;
    };
    for (v, &x) in dst.iter_mut().zip(src.iter().step_by(s.max(1))) {
        *v = f(x);
    }
}

/// `s[..lo]`, `s[lo..hi]`, `s[hi..len]`, or `None` unless `lo ≤ hi ≤ len ≤
/// s.len()` (an empty middle when `lo ≥ hi`, as `valid_range` may give).
#[inline(always)]
fn split3<T>(
    s: &mut [T],
    lo: usize,
    hi: usize,
    len: usize,
) -> Option<(&mut [T], &mut [T], &mut [T])> {
    let hi = hi.max(lo);
    let s = s.get_mut(..len)?;
    let (head, rest) = s.split_at_mut_checked(lo)?;
    // hi >= lo (above).
    let (mid, tail) = rest.split_at_mut_checked(hi.wrapping_sub(lo))?;
    Some((head, mid, tail))
}

/// Whether both paths can take the window: 2-D (or 1-D), a row stride in
/// `1..=MAX_S`, and planes that hold what the geometry reaches.
#[inline(always)]
fn two_d_fits<X, W, Y>(xp: &[X], wp: &[W], yo: &[Y], q: &QConvView<'_>) -> bool {
    let g = &q.p.g;
    let ([o0, o1, o2], [i0, i1, i2], [k0, k1, k2]) = (g.out, g.inp, g.k);
    let s = g.s[2];
    let holds = |len: usize, a: usize, b: usize| a.checked_mul(b).is_some_and(|n| len >= n);
    o0 == 1
        && i0 == 1
        && k0 == 1
        && (1..=MAX_S).contains(&s)
        && holds(xp.len(), i1, i2)
        && holds(wp.len(), k1, k2)
        && holds(yo.len(), o1, o2)
}

/// Channel `c`'s weight zero point, bias and multiplier.
#[inline(always)]
fn channel<'q>(q: &QConvView<'q>, c: usize) -> Option<(i32, i32, &'q Requant)> {
    Some((*q.zw.get(c)?, *q.bias.get(c)?, q.mult.get(c)?))
}

/// Every plane of a depthwise convolution whose lengths `qconv_dw` checked.
pub(crate) fn planes<X: QInt, W: QInt, Y: QInt>(x: &[X], w: &[W], y: &mut [Y], q: &QConvView<'_>) {
    let p = &q.p;
    let g = &p.g;
    // `qconv_dw` checked x and y for batch · c planes: no saturation.
    let planes = p.batch.saturating_mul(p.c);
    let macs = planes
        .saturating_mul(g.out_size())
        .saturating_mul(g.k_size());
    let t = par::tasks_int8(par::workers(), macs, planes);
    let ys = SharedMut::new(y);
    let sel = super::qgemm::selection();
    let job = Planes {
        x,
        w,
        ys: &ys,
        q,
        sel,
    };
    if t <= 1 {
        job.run((0, planes));
    } else {
        par::for_each(t, &|ti| job.run(par::chunk(planes, t, ti)));
    }
}

/// The operands of [`planes`], shared by its tasks.
struct Planes<'a, 's, X, W, Y> {
    x: &'a [X],
    w: &'a [W],
    ys: &'a SharedMut<'s, Y>,
    q: &'a QConvView<'a>,
    /// The kernel selection of the calling thread.
    sel: (Kernels, bool),
}

impl<X: QInt, W: QInt, Y: QInt> Planes<'_, '_, X, W, Y> {
    /// Planes `lo .. hi` of one task, each with its own output plane. A
    /// method of its own, not the task closure, so that it is what gets
    /// compiled for AVX2 (a closure does not inherit the target features
    /// of the function it is written in).
    fn run(&self, range: (usize, usize)) {
        #[cfg(target_arch = "x86_64")]
        if self.sel == (Kernels::Avx2Fma, true) {
            // SAFETY: selected only where the CPU has AVX-512 F, BW and
            // VNNI (`cpu::enable_avx512_vnni`). The same integer code
            // compiled for AVX-512 (bit-identical: integer sums).
            unsafe { self.run_avx512(range) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.sel.0 == Kernels::Avx2Fma {
            // SAFETY: `Avx2Fma` is selected only when the CPU has AVX2 (see
            // `cpu::enable_avx2_fma`). The same integer code compiled for AVX2.
            unsafe { self.run_avx2(range) };
            return;
        }
        self.run_body(range);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,avx512f,avx512bw")]
    unsafe fn run_avx512(&self, range: (usize, usize)) {
        self.run_body(range);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn run_avx2(&self, range: (usize, usize)) {
        self.run_body(range);
    }

    #[inline(always)]
    fn run_body(&self, (lo, hi): (usize, usize)) {
        let g = &self.q.p.g;
        let [_, i1, i2] = g.inp;
        let [_, k1, k2] = g.k;
        // About the padded plane's size: the small scratch when it fits.
        if i1.saturating_add(k1).saturating_mul(i2.saturating_add(k2)) <= SMALL {
            self.planes_with(DwScratch::<SMALL>::with(self.sel), (lo, hi));
        } else {
            self.planes_with(DwScratch::<FLAT>::with(self.sel), (lo, hi));
        }
    }

    #[inline(always)]
    fn planes_with<const N: usize>(&self, mut sc: DwScratch<N>, (lo, hi): (usize, usize)) {
        let Planes { x, w, ys, q, .. } = *self;
        let p = &q.p;
        let (in_sz, out_sz, k_sz) = (p.g.in_size(), p.g.out_size(), p.g.k_size());
        for i in lo..hi {
            // i < planes = batch · c (so c >= 1), and `qconv_dw` checked x,
            // y and w for planes of in_sz, out_sz and k_sz values: the
            // offsets below do not wrap.
            let Some(c) = i.checked_rem(p.c) else {
                return;
            };
            // SAFETY: each plane index belongs to one task (`par::chunk`), so
            // the output planes of live slices never overlap.
            let yo = unsafe { ys.slice(i.wrapping_mul(out_sz), out_sz) };
            let (Some(xp), Some(yo), Some(wc)) = (
                win(x, i.wrapping_mul(in_sz), in_sz),
                yo,
                win(w, c.wrapping_mul(k_sz), k_sz),
            ) else {
                return;
            };
            if !sc.plane(xp, wc, yo, c, q) {
                // In bounds: the slices were just taken from the checked
                // geometry (a `None` could only leave the plane unwritten).
                let _ = dw_plane(xp, wc, yo, c, q);
            }
        }
    }
}

/// [`planes`] with the output over the input (`qconv_in_place` checked
/// the lengths and that a plane fits `INPLACE_PLANE`).
pub(crate) fn planes_in_place<T: QInt, W: QInt>(w: &[W], y: &mut [T], q: &QConvView<'_>) {
    let sel = super::qgemm::selection();
    #[cfg(target_arch = "x86_64")]
    if sel == (Kernels::Avx2Fma, true) {
        // SAFETY: as in `Planes::run`.
        unsafe { in_place_avx512(w, y, q, sel) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if sel.0 == Kernels::Avx2Fma {
        // SAFETY: as in `planes`.
        unsafe { in_place_avx2(w, y, q, sel) };
        return;
    }
    in_place_body(w, y, q, sel);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn in_place_avx512<T: QInt, W: QInt>(
    w: &[W],
    y: &mut [T],
    q: &QConvView<'_>,
    sel: (Kernels, bool),
) {
    in_place_body(w, y, q, sel);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn in_place_avx2<T: QInt, W: QInt>(
    w: &[W],
    y: &mut [T],
    q: &QConvView<'_>,
    sel: (Kernels, bool),
) {
    in_place_body(w, y, q, sel);
}

#[inline(always)]
fn in_place_body<T: QInt, W: QInt>(w: &[W], y: &mut [T], q: &QConvView<'_>, sel: (Kernels, bool)) {
    // Planes of at most `INPLACE_PLANE` (1024) values: the small scratch,
    // or the tiny one.
    if fits_tiny(&q.p.g) {
        in_place_with(DwScratch::<TINY>::with(sel), w, y, q);
    } else {
        in_place_with(DwScratch::<SMALL>::with(sel), w, y, q);
    }
}

/// Whether a plane's padded layout takes at most half of [`TINY`] (the
/// flat path rounds its grid up to whole chunks and reads one row of
/// slack), and a stride the row path's phases fit in it. Either way the
/// planes are right: a layout that misses the scratch takes the row path,
/// or the reference loop.
#[inline(always)]
fn fits_tiny(g: &Geom) -> bool {
    let side = |[i, k, d, pb, pe]: [usize; 5]| {
        i.saturating_add(pb)
            .saturating_add(pe)
            .saturating_add(k.saturating_mul(d))
    };
    let [_, i1, i2] = g.inp;
    let ([_, k1, k2], [_, d1, d2], [_, b1, b2], [_, e1, e2]) = (g.k, g.d, g.pb, g.pe);
    side([i1, k1, d1, b1, e1])
        .saturating_mul(side([i2, k2, d2, b2, e2]))
        .saturating_mul(2)
        <= TINY
        && PHASE.saturating_mul(g.s[2]) <= TINY
}

#[inline(always)]
fn in_place_with<const N: usize, T: QInt, W: QInt>(
    mut sc: DwScratch<N>,
    w: &[W],
    y: &mut [T],
    q: &QConvView<'_>,
) {
    let p = &q.p;
    let (sz, k_sz) = (p.g.in_size(), p.g.k_size());
    let mut saved = [T::default(); super::qconv::INPLACE_PLANE];
    let Some(saved) = saved.get_mut(..sz) else {
        return;
    };
    for (i, plane) in y.chunks_exact_mut(sz.max(1)).enumerate() {
        let c = i.checked_rem(p.c).unwrap_or(0);
        saved.copy_from_slice(plane);
        // c < p.c: w holds c · k_sz + k_sz weights (`qconv_in_place`).
        let Some(wc) = super::win(w, c.wrapping_mul(k_sz), k_sz) else {
            return;
        };
        if !sc.plane(saved, wc, plane, c, q) {
            let _ = dw_plane(saved, wc, plane, c, q);
        }
    }
}

// The fast paths tested here are x86_64's.
#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    extern crate std;

    use super::*;
    use alloc::vec::Vec;

    /// `n` values from a fixed linear congruential sequence.
    fn seq(n: usize, seed: u32) -> Vec<u32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                s >> 8
            })
            .collect()
    }

    #[test]
    fn compact_rows_avx2_gives_the_rows_of_compact_rows() {
        if !std::is_x86_feature_detected!("avx2") {
            return;
        }
        // Every geometry the fast path takes or refuses (o2 up to 10,
        // wpd from o2 to o2 + 9), and an acc with and without slack.
        let o1s = crate::kern::pick(&[1usize, 2, 3, 5, 9], &[3]);
        let o2s = crate::kern::pick(&[1usize, 2, 4, 5, 7, 8, 9, 10], &[5, 9]);
        for &o1 in o1s {
            for &o2 in o2s {
                for wpd in o2..o2 + crate::kern::count(10, 3) {
                    for slack in [0, 8] {
                        let len = o1 * wpd + slack;
                        let acc: Vec<i32> = seq(len, (o1 * 100 + wpd) as u32)
                            .into_iter()
                            .map(|v| v as i32)
                            .collect();
                        let (mut want, mut got) = (acc.clone(), acc);
                        assert!(compact_rows(&mut want, o1, o2, wpd));
                        // SAFETY: AVX2 detected above.
                        assert!(unsafe { compact_rows_avx2(&mut got, o1, o2, wpd) });
                        let n = o1 * o2;
                        assert_eq!(got[..n], want[..n], "o1 {o1}, o2 {o2}, wpd {wpd}");
                    }
                }
            }
        }
        // A row outside acc is refused by both.
        let mut short = [0i32; 10];
        assert!(!compact_rows(&mut short, 3, 5, 7));
        // SAFETY: AVX2 detected above.
        assert!(!unsafe { compact_rows_avx2(&mut short, 3, 5, 7) });
    }

    #[test]
    fn rows_in_avx512_gives_the_buffer_of_rows_in() {
        if !(std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw"))
        {
            return;
        }
        fn case<X: QInt>(x: &[X], pad: PadRows, len: usize) {
            let mut want = alloc::vec![0i16; len];
            let mut got = want.clone();
            assert!(rows_in(x, &mut want, pad));
            // SAFETY: AVX-512 F and BW detected above.
            assert!(unsafe { rows_in_avx512(x, &mut got, pad) });
            assert_eq!(got, want, "i1 {}, i2 {}, wpd {}", pad.i1, pad.i2, pad.wpd);
        }
        // Row widths on both stores (16 lanes fit, or the masked one near
        // the end of the buffer), signed and unsigned values.
        let widths = crate::kern::pick(&[1usize, 5, 8, 15, 16, 17, 25, 32], &[5, 17]);
        for &i2 in widths {
            for (i1, p1, p2) in [(1, 0, 0), (4, 1, 1), (7, 2, 3)] {
                let wpd = i2 + 2 * p2;
                let len = (i1 + 2 * p1) * wpd + 1;
                let raw = seq(i1 * i2, (i2 * 10 + i1) as u32);
                let x8: Vec<i8> = raw.iter().map(|&v| v as u8 as i8).collect();
                let u8s: Vec<u8> = raw.iter().map(|&v| v as u8).collect();
                let pad = |zx| PadRows {
                    i1,
                    i2,
                    p1,
                    wpd,
                    p2,
                    zx,
                };
                for zx in [-128, -3, 0, 7, 127] {
                    case(&x8, pad(zx), len);
                }
                for zx in [0, 100, 255] {
                    case(&u8s, pad(zx), len);
                }
            }
        }
        // Too wide a row, or a plane short of its rows: refused, nothing
        // written.
        let x = [1i8; 40];
        let mut buf = [0i16; 200];
        let wide = PadRows {
            i1: 1,
            i2: 33,
            p1: 0,
            wpd: 33,
            p2: 0,
            zx: 0,
        };
        // SAFETY: as above.
        assert!(!unsafe { rows_in_avx512(&x, &mut buf, wide) });
        let short = PadRows {
            i1: 3,
            i2: 16,
            ..wide
        };
        // SAFETY: as above.
        assert!(!unsafe { rows_in_avx512(&x, &mut buf, short) });
        assert!(buf.iter().all(|&v| v == 0));
    }
}
