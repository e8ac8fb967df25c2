//! f32 depthwise convolution with AVX-512 masked loads (x86_64 only).
//!
//! With stride 1 and output rows as wide as the input rows (the padding
//! of a row adds up to the window's width less one: "same" along the
//! rows), output `o = oh · w + ow` of a plane reads, for tap (kh, kw),
//! input `o + (kh - p1) · w + (kw - p2)`: every tap is the whole input
//! plane, flat, shifted by a constant. So the plane is computed 16 outputs
//! per vector whatever its row width (KWS's rows are 5 floats wide, of
//! which [`super::dwconv::narrow_avx2`] fills 5 of its 8 lanes, one row per
//! vector), with one masked load and one masked multiply-add per vector and
//! tap. A lane whose tap falls in the padding (its column past either end
//! of the row, or its row past either end of the plane) is off in that
//! tap's mask: not read, and its sum keeps its value, as the reference
//! loops skip such taps. The masks depend on the geometry alone and are
//! computed once per call for all its planes ([`Grid16::new`]).
//!
//! Each sum is the bias, then one fused multiply-add per tap in the
//! reference loops' order: the reference values up to the rounding of the
//! fused products, as [`super::dwconv::narrow_avx2`]'s.

use core::arch::x86_64::*;

use super::{win, Geom};

/// Most output vectors of a plane (1024 floats: KWS's 125, MobileNets'
/// planes up to 32 × 32).
const MAX_VECS: usize = 64;
/// Most taps of a window (5 × 5).
const MAX_TAPS: usize = 25;
/// Output vectors summed at once (their sums stay in registers over the
/// taps).
const BLOCK: usize = 8;

/// The masks and offsets of one geometry, for [`Grid16::plane`].
pub(crate) struct Grid16 {
    /// For tap t, vector v's lanes that read it at `masks[t][v]`.
    masks: [[u16; MAX_VECS]; MAX_TAPS],
    /// For tap t, the input's offset from the output index.
    offs: [isize; MAX_TAPS],
    /// The lanes of the last vector inside the output plane.
    last: u16,
    taps: usize,
    vecs: usize,
    /// Floats of the output plane and of the input plane.
    sizes: (usize, usize),
}

impl Grid16 {
    /// The masks for planes of geometry `g`, or `None` where `g` is not
    /// for this path: not 2-D, a stride or dilation other than 1, output
    /// rows narrower or wider than the input's, more than [`MAX_TAPS`]
    /// taps or [`MAX_VECS`] output vectors.
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn new(g: &Geom) -> Option<Self> {
        let ([o0, o1, o2], [i0, i1, i2], [k0, k1, k2]) = (g.out, g.inp, g.k);
        let ([_, s1, s2], [_, d1, d2], [_, p1, p2]) = (g.s, g.d, g.pb);
        let unit = s1 == 1 && s2 == 1 && d1 == 1 && d2 == 1;
        if o0 != 1 || i0 != 1 || k0 != 1 || !unit || o2 != i2 || o2 == 0 || o1 == 0 {
            return None;
        }
        let on = o1.checked_mul(o2)?;
        let inn = i1.checked_mul(i2)?;
        let taps = k1.checked_mul(k2)?;
        let vecs = on.div_ceil(16);
        // Small enough that every index below is an i32 (and cannot wrap).
        if taps == 0 || taps > MAX_TAPS || vecs > MAX_VECS || inn > 1 << 20 || p1 > 1 << 10 {
            return None;
        }
        let (w, on32, inn32) = (o2 as i32, on as i32, inn as i32);
        let mut grid = Grid16 {
            masks: [[0; MAX_VECS]; MAX_TAPS],
            offs: [0; MAX_TAPS],
            // The last vector's on - 16 (vecs - 1) lanes, 1 to 16.
            last: 1u32
                .wrapping_shl(on.wrapping_sub(vecs.wrapping_sub(1).wrapping_mul(16)) as u32)
                .wrapping_sub(1) as u16,
            taps,
            vecs,
            sizes: (on, inn),
        };
        // (dy, dx) of each tap: rows and columns from the output's.
        let shift = |t: usize| {
            // k2 >= 1 (taps > 0).
            let (kh, kw) = (
                t.checked_div(k2).unwrap_or(0),
                t.checked_rem(k2).unwrap_or(0),
            );
            (
                (kh as i32).wrapping_sub(p1 as i32),
                (kw as i32).wrapping_sub(p2 as i32),
            )
        };
        for (t, off) in grid.offs.iter_mut().enumerate().take(taps) {
            let (dy, dx) = shift(t);
            *off = dy.wrapping_mul(w).wrapping_add(dx) as isize;
        }
        // Per lane: its output index and its column, vector by vector.
        let mut o = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let mut cols = [0i32; 16];
        for (l, c) in cols.iter_mut().enumerate() {
            *c = l.checked_rem(o2).unwrap_or(0) as i32;
        }
        // SAFETY: `cols` holds 16 i32.
        let mut col = unsafe { _mm512_loadu_si512(cols.as_ptr().cast()) };
        let (wv, step) = (
            _mm512_set1_epi32(w),
            _mm512_set1_epi32(16usize.checked_rem(o2).unwrap_or(0) as i32),
        );
        for v in 0..vecs {
            let out = _mm512_cmplt_epu32_mask(o, _mm512_set1_epi32(on32));
            for (t, m) in grid.masks.iter_mut().enumerate().take(taps) {
                let (dy, dx) = shift(t);
                // Unsigned compares: a negative row or column wraps past
                // the bound. With the column inside its row, the flat
                // index is inside the plane exactly when the row is.
                let c = _mm512_add_epi32(col, _mm512_set1_epi32(dx));
                let in_row = _mm512_cmplt_epu32_mask(c, wv);
                let at = _mm512_add_epi32(o, _mm512_set1_epi32(dy.wrapping_mul(w)));
                let in_plane = _mm512_cmplt_epu32_mask(at, _mm512_set1_epi32(inn32));
                if let Some(mv) = m.get_mut(v) {
                    *mv = out & in_row & in_plane;
                }
            }
            o = _mm512_add_epi32(o, _mm512_set1_epi32(16));
            // col + 16 % w < 2w: subtract w where it reached w (unsigned
            // min: col - w wraps high where col < w).
            col = _mm512_add_epi32(col, step);
            col = _mm512_min_epu32(col, _mm512_sub_epi32(col, wv));
        }
        Some(grid)
    }

    /// `y = bias + x ⋆ w` for one plane of the geometry, each output
    /// clamped to `clamp` (a fused Relu / Clip, with [`crate::math::clip`]'s
    /// bits: NaN stays NaN) as it is stored; `false` (nothing written) if a
    /// slice is short.
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn plane(
        &self,
        y: &mut [f32],
        x: &[f32],
        w: &[f32],
        bias: f32,
        clamp: Option<(f32, f32)>,
    ) -> bool {
        let (on, inn) = self.sizes;
        let (Some(y), Some(x), Some(w)) = (y.get_mut(..on), win(x, 0, inn), win(w, 0, self.taps))
        else {
            return false;
        };
        let run = Run {
            y: y.as_mut_ptr(),
            x: x.as_ptr(),
            w,
            bias,
            clamp: clamp.map(|(lo, hi)| (_mm512_set1_ps(lo), _mm512_set1_ps(hi))),
        };
        let mut v0 = 0;
        while v0 < self.vecs {
            let n = BLOCK.min(self.vecs.wrapping_sub(v0));
            // SAFETY: `run` holds the whole planes (above); v0 + n <= vecs.
            let done = unsafe {
                match n {
                    8 => self.block::<8>(&run, v0),
                    7 => self.block::<7>(&run, v0),
                    6 => self.block::<6>(&run, v0),
                    5 => self.block::<5>(&run, v0),
                    4 => self.block::<4>(&run, v0),
                    3 => self.block::<3>(&run, v0),
                    2 => self.block::<2>(&run, v0),
                    _ => self.block::<1>(&run, v0),
                }
            };
            if !done {
                return false;
            }
            v0 = v0.wrapping_add(n);
        }
        true
    }

    /// Output vectors `v0 .. v0 + N` of [`Self::plane`]; `false` if they
    /// are not all in the plane's vectors.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; `run.y` and `run.x` point to the output and
    /// input planes of this geometry, which nothing else accesses.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn block<const N: usize>(&self, run: &Run<'_>, v0: usize) -> bool {
        if v0.checked_add(N).is_none_or(|end| end > self.vecs) {
            return false;
        }
        let mut acc = [_mm512_set1_ps(run.bias); N];
        let taps = self.masks.iter().zip(&self.offs).zip(run.w);
        for ((masks, &off), &wt) in taps.take(self.taps) {
            let Some(masks) = masks.get(v0..).and_then(|m| m.first_chunk::<N>()) else {
                return false;
            };
            let wb = _mm512_set1_ps(wt);
            // The input run of this tap, from the block's first output.
            let base = run.x.wrapping_offset(off).wrapping_add(v0.wrapping_mul(16));
            for (j, (a, &m)) in acc.iter_mut().zip(masks).enumerate() {
                // SAFETY: the lanes `m` enables are outputs o < on whose
                // tap reads input o + off in 0..inn, inside `run.x`
                // (`new`); the others touch no memory.
                let xv = unsafe { _mm512_maskz_loadu_ps(m, base.wrapping_add(j.wrapping_mul(16))) };
                *a = _mm512_mask3_fmadd_ps(wb, xv, *a, m);
            }
        }
        let last = self.vecs.wrapping_sub(1);
        for (j, mut a) in acc.into_iter().enumerate() {
            let v = v0.wrapping_add(j);
            if let Some((lo, hi)) = run.clamp {
                // math::clip: max_ps(lo, a) is lo where lo > a, else a
                // (NaN too); min_ps(hi, ·) likewise.
                a = _mm512_min_ps(hi, _mm512_max_ps(lo, a));
            }
            let m = if v == last { self.last } else { u16::MAX };
            // SAFETY: v < vecs: the lanes `m` enables are outputs 16 v + l
            // < on, inside `run.y`.
            unsafe { _mm512_mask_storeu_ps(run.y.wrapping_add(v.wrapping_mul(16)), m, a) };
        }
        true
    }
}

/// One plane's operands for [`Grid16::block`].
struct Run<'a> {
    y: *mut f32,
    x: *const f32,
    w: &'a [f32],
    bias: f32,
    clamp: Option<(__m512, __m512)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate std;
    use crate::kern::dwconv::tests::naive;
    use crate::kern::pick;

    fn geom(
        (i1, i2): (usize, usize),
        (k1, k2): (usize, usize),
        p1: (usize, usize),
        p2: usize,
    ) -> Geom {
        // Rows as wide as the input's: k2 - 1 columns of padding in all.
        let o1 = (i1 + p1.0 + p1.1).saturating_sub(k1 - 1);
        Geom {
            inp: [1, i1, i2],
            out: [1, o1, i2],
            k: [1, k1, k2],
            s: [1, 1, 1],
            d: [1, 1, 1],
            pb: [0, p1.0, p2],
            pe: [0, p1.1, k2 - 1 - p2],
        }
    }

    /// [`Grid16::plane`] against the definition (rtol 1e-5: fused
    /// products) on planes of 1 to 1024 floats (a partial last vector, one
    /// and several blocks), windows 1 × 1 to 5 × 5 with every split of the
    /// row padding, row pads of 0 to 3 on either side, with and without a
    /// clamp and a NaN; nothing written past the plane; other geometries
    /// and short slices refused.
    #[test]
    fn planes_match_the_definition() {
        if !std::is_x86_feature_detected!("avx512f") {
            std::eprintln!("skipped: this CPU has no AVX-512 F");
            return;
        }
        let mut cases = 0;
        let planes = [
            (1, 1),
            (25, 5),
            (7, 7),
            (3, 40),
            (14, 14),
            (32, 32),
            (5, 1),
            (1, 16),
        ];
        let windows = [(1, 1), (3, 3), (5, 5), (3, 1), (1, 5), (2, 2), (5, 3)];
        let row_pads = [(0, 0), (1, 1), (2, 0), (0, 3)];
        for &plane in pick(&planes, &[(25, 5), (3, 40)]) {
            for &k in pick(&windows, &[(3, 3), (2, 2)]) {
                for &p1 in pick(&row_pads, &[(1, 1)]) {
                    for p2 in 0..k.1 {
                        let g = geom(plane, k, p1, p2);
                        if g.out[1] == 0 {
                            continue;
                        }
                        let seed = cases as u64 * 3;
                        let mut x = crate::ops::testing::rnd(plane.0 * plane.1, seed + 1);
                        let w = crate::ops::testing::rnd(k.0 * k.1, seed + 2);
                        // Miri lacks the 512-bit max / min (register-only
                        // arithmetic: the loads and stores it checks are
                        // the same with and without a clamp).
                        let clamp = (!cfg!(miri) && cases % 3 == 1).then_some((-0.2f32, 0.3f32));
                        if cases % 4 == 2 {
                            x[plane.0 * plane.1 / 2] = f32::NAN;
                        }
                        let mut want = naive(&x, &w, 0.25, &g);
                        if let Some((lo, hi)) = clamp {
                            want.iter_mut()
                                .for_each(|v| *v = crate::math::clip(*v, lo, hi));
                        }
                        // SAFETY: the CPU has AVX-512 F.
                        let grid = unsafe { Grid16::new(&g) };
                        assert_eq!(grid.is_some(), g.out[1] * g.out[2] <= 1024, "{g:?}");
                        let Some(grid) = grid else {
                            continue;
                        };
                        let mut y = std::vec![f32::NAN; want.len() + 17];
                        // SAFETY: as above.
                        assert!(unsafe { grid.plane(&mut y, &x, &w, 0.25, clamp) }, "{g:?}");
                        for (t, &wv) in want.iter().enumerate() {
                            let ok = if wv.is_nan() {
                                y[t].is_nan()
                            } else {
                                (y[t] - wv).abs() <= 1e-5 + 1e-5 * wv.abs()
                            };
                            assert!(ok, "{g:?} {clamp:?} at {t}: {} vs {wv}", y[t]);
                        }
                        assert!(y[want.len()..].iter().all(|v| v.is_nan()), "{g:?}");
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > crate::kern::count(500, 4), "{cases}");
        // Refused: stride 2, dilation 2, output rows narrower than the
        // input's, 36 taps, 1089 outputs.
        let g = geom((5, 5), (3, 3), (1, 1), 1);
        for bad in [
            Geom { s: [1, 2, 2], ..g },
            Geom { d: [1, 2, 2], ..g },
            Geom {
                out: [1, 5, 3],
                pe: [0, 1, 0],
                pb: [0, 1, 0],
                ..g
            },
            geom((8, 8), (6, 6), (0, 0), 0),
            geom((33, 33), (3, 3), (1, 1), 1),
        ] {
            // SAFETY: the CPU has AVX-512 F.
            assert!(unsafe { Grid16::new(&bad) }.is_none(), "{bad:?}");
        }
        // SAFETY: as above.
        let grid = unsafe { Grid16::new(&g) }.expect("5 x 5, 3 x 3");
        let (x, w) = (std::vec![1.0; 25], std::vec![1.0; 9]);
        let mut y = std::vec![0.0; 25];
        // SAFETY: as above.
        unsafe {
            assert!(!grid.plane(&mut y[..24], &x, &w, 0.0, None));
            assert!(!grid.plane(&mut y, &x[..24], &w, 0.0, None));
            assert!(!grid.plane(&mut y, &x, &w[..8], 0.0, None));
            assert!(y.iter().all(|&v| v == 0.0));
            assert!(grid.plane(&mut y, &x, &w, 0.0, None));
        }
        assert_eq!((y[0], y[1], y[6]), (4.0, 6.0, 9.0));
    }
}
