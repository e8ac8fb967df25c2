//! The integer GEMM of [`super::qgemm`] with AVX-512 VNNI: `vpdpbusd`
//! multiplies 64 unsigned bytes by 64 signed bytes and adds each group of
//! four products into an i32 lane, four k steps per instruction (the AVX2
//! kernel's `vpmaddwd` does two, on i16).
//!
//! The operands must be raw 8-bit values, not differences from zero points,
//! so the product is rewritten (all sums wrap modulo 2^32, as the
//! reference's do, so the result is the same bits):
//!
//! ```text
//! A'(i, p) = a - offA ∈ [-128, 127]     offA = 0 for int8, 128 for uint8
//! B'(p, j) = b - LO   ∈ [0, 255]        (b - zb = B' - zb', zb' = zb - LO)
//! Σ_p (a - za)(b - zb) = Σ_p A'·B' - zb'·ΣA'(i) - za'(i)·ΣB'(j) + K·za'(i)·zb'
//! ```
//!
//! with `za' = za - offA`. `ΣA'(i)` is packed with constant weights (or
//! summed once per row chunk), `ΣB'(j)` is summed while B is packed. B's
//! zero point must be one for all columns and within its type's range
//! ([`super::qgemm::QIo::b_u8_zero`]); others run the AVX2 kernel.
//!
//! Tiles are 8 rows × 32 columns (16 `zmm` accumulators); B is packed per
//! block as `[panel][k quad][32 columns][4 bytes]`, A as `[k quad][8 rows]`
//! words of four signed bytes. Blocks (row chunk, columns, k) follow
//! [`super::qgemm`], with k blocks of [`KCV`] ≥ its `KC`, so that
//! [`super::qgemm::fits_one_pass`] holds for both drivers.

// Integer arithmetic is checked, saturating or wrapping by name (issue 8):
// A's extent is checked by the callers (`qgemm_with`, `pack_a`), block
// sizes are bounded by MC, NC and KCV, and offsets under those bounds wrap
// by name; sums wrap by definition (the reference's modulo-2^32 sums).

use super::qgemm::{QMatA, MC, NC};
use super::{win, QInt};

/// Rows of a register tile.
pub(crate) const MRV: usize = 8;
/// Columns of a register tile (two `zmm` of i32).
pub(crate) const NRV: usize = 32;
/// Steps of k per block (a multiple of 4, at least `qgemm::KC`).
pub(crate) const KCV: usize = 512;
/// i32 sums of one chunk × block: `MC × NRV` fit.
const ACCV: usize = 16384;

const _: () = assert!(MC.is_multiple_of(MRV) && NC.is_multiple_of(NRV) && KCV.is_multiple_of(4));
const _: () = assert!(KCV >= super::qgemm::KC && MC * NRV <= ACCV);
/// Most rows of a product that runs on the small buffers (k at most
/// `qgemm::KC`): clearing the big ones (100 KiB) on every call costs a
/// small model as much as some of its layers.
#[cfg(target_arch = "x86_64")]
const SMALL_M: usize = 64;
/// i32 sums of the small buffers: `SMALL_M × NC`.
#[cfg(target_arch = "x86_64")]
const SMALL_ACC: usize = SMALL_M * NC;
#[cfg(target_arch = "x86_64")]
const SMALL_KC: usize = super::qgemm::KC;

/// The signed byte of A's value `v` (type bounds `lo ..= lo + 255`).
#[inline(always)]
fn a_byte(v: i32, off: i32) -> u32 {
    (v.wrapping_sub(off) as i8 as u8) as u32
}

/// `offA`: what makes A's values signed bytes.
#[inline(always)]
fn a_offset<T: QInt>() -> i32 {
    T::LO.wrapping_add(128)
}

/// i32 words of [`pack_a`] for `m × k` (tiles, then one sum per row).
pub(crate) fn body_len(m: usize, k: usize) -> usize {
    let rows = m.div_ceil(MRV).saturating_mul(MRV);
    rows.saturating_mul(k.div_ceil(4)).saturating_add(rows)
}

/// Rows `i0 .. i0 + rows` of A, steps `p0 .. p0 + kc`, as `[quad][MRV]`
/// words into `at` (zero past the rows and past `kc`).
#[inline(always)]
fn pack_tile<T: QInt>(
    a: &QMatA<'_, T>,
    i0: usize,
    rows: usize,
    p0: usize,
    kc: usize,
    at: &mut [i32],
) {
    at.fill(0);
    let off = a_offset::<T>();
    // Rows i0 + r < m and steps p0 + kc <= k lie in A (its extent checked
    // by the callers): the offsets wrap by name only.
    for r in 0..rows {
        let gi = i0.wrapping_add(r);
        let Some(src) = win(a.a, gi.wrapping_mul(a.lda).wrapping_add(p0), kc) else {
            return;
        };
        for (q, four) in src.chunks(4).enumerate() {
            let mut w = 0u32;
            for (t, v) in four.iter().enumerate() {
                // t < 4: a shift of at most 24.
                w |= a_byte(v.get(), off) << t.wrapping_mul(8);
            }
            if let Some(d) = at.get_mut(q.wrapping_mul(MRV).wrapping_add(r)) {
                *d = w as i32;
            }
        }
    }
}

/// `Σ_p A'(i, p)` over all of k.
#[inline(always)]
fn row_sum<T: QInt>(a: &QMatA<'_, T>, i: usize, k: usize) -> i32 {
    let off = a_offset::<T>();
    win(a.a, i.wrapping_mul(a.lda), k)
        .unwrap_or(&[])
        .iter()
        .fold(0i32, |s, v| s.wrapping_add(v.get().wrapping_sub(off)))
}

/// A packed once (constant weights): `[row tile][quad][MRV]`, then
/// `ΣA'` of each row (rows padded to a tile). Empty if A is short.
#[cfg(feature = "alloc")]
pub(crate) fn pack_a<T: QInt>(m: usize, k: usize, a: &QMatA<'_, T>) -> alloc::vec::Vec<i32> {
    let extent = m
        .saturating_sub(1)
        .checked_mul(a.lda)
        .and_then(|v| v.checked_add(k));
    if a.lda < k || extent.is_none_or(|e| a.a.len() < e) {
        return alloc::vec::Vec::new();
    }
    let (kq, tiles) = (k.div_ceil(4), m.div_ceil(MRV));
    // The packed size is at most about A's: these products do not wrap.
    let tile_len = kq.wrapping_mul(MRV);
    let mut out = alloc::vec![0i32; body_len(m, k)];
    let Some((body, sums)) = out.split_at_mut_checked(tiles.wrapping_mul(tile_len)) else {
        return alloc::vec::Vec::new();
    };
    for (t, tile) in body.chunks_exact_mut(tile_len.max(1)).enumerate() {
        let i0 = t.wrapping_mul(MRV);
        pack_tile(a, i0, MRV.min(m.wrapping_sub(i0)), 0, k, tile);
    }
    for (i, s) in sums.iter_mut().take(m).enumerate() {
        *s = row_sum(a, i, k);
    }
    out
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::driver;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use crate::kern::qgemm::QIo;
    use crate::kern::win_mut;
    use core::arch::x86_64::*;

    /// Rows `0..m`, columns `cols.0 .. cols.1` of `C = A · B` (operands
    /// checked by `qgemm_with`), handed to `io.store`; `zb` is B's zero
    /// point as an unsigned byte (`zb'`), `pre` A packed by [`pack_a`] or
    /// empty. `false` (a bug, never seen) if a block misses its buffer.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW and VNNI.
    #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vnni")]
    pub(crate) unsafe fn driver<T: QInt, IO: QIo>(
        m: usize,
        cols: (usize, usize),
        k: usize,
        a: &QMatA<'_, T>,
        pre: &[i32],
        io: &IO,
        zb: i32,
    ) -> bool {
        if m <= SMALL_M && k <= SMALL_KC {
            let mut bpack = [0u8; SMALL_KC * NC];
            let mut apack = [0i32; MRV * SMALL_KC / 4];
            let mut acc = [0i32; SMALL_ACC];
            let bufs = (&mut bpack[..], &mut apack[..], &mut acc[..], SMALL_KC);
            // SAFETY: this function's CPU features.
            unsafe { body(m, cols, k, a, pre, io, zb, bufs) }
        } else {
            let mut bpack = [0u8; KCV * NC];
            let mut apack = [0i32; MRV * KCV / 4];
            let mut acc = [0i32; ACCV];
            let bufs = (&mut bpack[..], &mut apack[..], &mut acc[..], KCV);
            // SAFETY: this function's CPU features.
            unsafe { body(m, cols, k, a, pre, io, zb, bufs) }
        }
    }

    /// [`driver`] on buffers: B blocks of `kcv × NC` bytes, an A tile of
    /// `MRV × kcv / 4` words, sums of a chunk × block (at least
    /// `min(m, MC)` rounded up to `MRV`, times `NRV`).
    ///
    /// # Safety
    /// The CPU must support AVX-512 F, BW and VNNI (inlined into
    /// [`driver`], compiled for them).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn body<T: QInt, IO: QIo>(
        m: usize,
        cols: (usize, usize),
        k: usize,
        a: &QMatA<'_, T>,
        pre: &[i32],
        io: &IO,
        zb: i32,
        (bpack, apack, acc, kcv): (&mut [u8], &mut [i32], &mut [i32], usize),
    ) -> bool {
        let acc_len = acc.len();
        let mut rows = [0i16; 4 * NC];
        let mut colsum = [0i32; NC];
        // Per row of the chunk (and a tile of slack): K·za'·zb' - zb'·ΣA'.
        let mut rsum = [0i32; MC + MRV];
        let kq_all = k.div_ceil(4);
        let tiles_all = m.div_ceil(MRV);
        let pre = if pre.len() == body_len(m, k) {
            pre
        } else {
            &[]
        };
        let kz = (k as i32).wrapping_mul(zb);
        let off = a_offset::<T>();
        // Block sizes are bounded by MC, NC, KCV and the buffers; rows,
        // columns and steps stay below m, n and k (A's extent checked by
        // `qgemm_with`, `pre` of length `body_len(m, k)`): every offset
        // below wraps by name only.
        let pre_sums = tiles_all.wrapping_mul(MRV).wrapping_mul(kq_all);
        let mut i_c = 0usize;
        while i_c < m {
            let mc = MC.min(m.wrapping_sub(i_c));
            let mc_up = mc.div_ceil(MRV).wrapping_mul(MRV);
            let Some(per_row) = acc_len.checked_div(mc_up) else {
                return false;
            };
            let nc = (per_row / NRV).wrapping_mul(NRV).clamp(NRV, NC);
            rsum.fill(0);
            // Whether some row has za' ≠ 0 (a column term to subtract).
            let mut col_term = false;
            for (r, s) in rsum.iter_mut().take(mc).enumerate() {
                let gi = i_c.wrapping_add(r);
                let sa = match pre.get(pre_sums.wrapping_add(gi)) {
                    Some(&v) if !pre.is_empty() => v,
                    _ => row_sum(a, gi, k),
                };
                let za = a.z.of(gi).wrapping_sub(off);
                col_term |= za != 0;
                *s = kz.wrapping_mul(za).wrapping_sub(zb.wrapping_mul(sa));
            }
            let (mut j0, n) = cols;
            while j0 < n {
                let ncur = nc.min(n.wrapping_sub(j0));
                let panels = ncur.div_ceil(NRV);
                let Some(accb) = win_mut(acc, 0, mc_up.wrapping_mul(nc)) else {
                    return false;
                };
                colsum.fill(0);
                let mut p0 = 0usize;
                while p0 < k {
                    let kc = kcv.min(k.wrapping_sub(p0));
                    let kq = kc.div_ceil(4);
                    // A panel's bytes: kq quads of NRV columns of 4.
                    let panel = kq.wrapping_mul(NRV * 4);
                    let Some(bb) = win_mut(bpack, 0, panels.wrapping_mul(panel)) else {
                        return false;
                    };
                    for q in 0..kq {
                        // Four rows of B - zb, then + zb' (so columns past
                        // ncur and steps past kc hold B' = 0).
                        rows.fill(zb.wrapping_neg() as i16);
                        let step = q.wrapping_mul(4);
                        for (t, row) in rows.chunks_exact_mut(NC).enumerate() {
                            let pt = step.wrapping_add(t);
                            if pt < kc {
                                if let Some(dst) = row.get_mut(..ncur) {
                                    io.b_row(p0.wrapping_add(pt), j0, dst);
                                }
                            }
                        }
                        // SAFETY: this function's CPU features.
                        if !unsafe { pack_quad(&rows, zb, panels, q, kq, bb, &mut colsum) } {
                            return false;
                        }
                    }
                    let tile = kq.wrapping_mul(MRV);
                    let mut i0 = 0usize;
                    while i0 < mc {
                        let mr = MRV.min(mc.wrapping_sub(i0));
                        let gi = i_c.wrapping_add(i0);
                        let at: &[i32] = if pre.is_empty() {
                            let Some(at) = win_mut(apack, 0, tile) else {
                                return false;
                            };
                            pack_tile(a, gi, mr, p0, kc, at);
                            at
                        } else {
                            let quad = (gi / MRV).wrapping_mul(kq_all).wrapping_add(p0 / 4);
                            let Some(at) = win(pre, quad.wrapping_mul(MRV), tile) else {
                                return false;
                            };
                            at
                        };
                        for pn in 0..panels {
                            let (Some(bp), Some(c)) = (
                                win(bb, pn.wrapping_mul(panel), panel),
                                accb.get_mut(
                                    i0.wrapping_mul(nc).wrapping_add(pn.wrapping_mul(NRV))..,
                                ),
                            ) else {
                                return false;
                            };
                            // The first k block starts from the row terms.
                            let init = match win(&rsum, i0, MRV) {
                                Some(r) if p0 == 0 => Some(r),
                                Some(_) => None,
                                None => return false,
                            };
                            // nc <= NC: (MRV - 1) · nc + NRV is small.
                            let c_need = (MRV - 1).wrapping_mul(nc).wrapping_add(NRV);
                            if at.len() < tile || c.len() < c_need {
                                return false;
                            }
                            // SAFETY: lengths checked just above; the CPU
                            // features are the caller's duty (`body`).
                            unsafe { ukr(kq, at, bp, c, nc, init) };
                        }
                        i0 = i0.wrapping_add(MRV);
                    }
                    p0 = p0.wrapping_add(kcv);
                }
                for (r, sums) in accb.chunks_exact_mut(nc).take(mc).enumerate() {
                    let Some(sums) = sums.get_mut(..ncur) else {
                        return false;
                    };
                    let gi = i_c.wrapping_add(r);
                    if col_term {
                        let za = a.z.of(gi).wrapping_sub(off);
                        for (s, &cs) in sums.iter_mut().zip(&colsum) {
                            *s = s.wrapping_sub(za.wrapping_mul(cs));
                        }
                    }
                    io.store(gi, j0, sums);
                }
                j0 = j0.wrapping_add(nc);
            }
            i_c = i_c.wrapping_add(mc);
        }
        true
    }

    /// Quad `q` of a B block: `rows` holds four rows of `NC` values
    /// `B - zb`; writes `B' = value + zb` as bytes `[j][4]` into each panel
    /// and adds the (untruncated) values to `colsum`. 16 columns at a time:
    /// the four rows widened to i32 lanes, their low bytes shifted into
    /// place and or-ed into one word per column. `false` (nothing written)
    /// if the panels do not lie in `bb`.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F and BW.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pack_quad(
        rows: &[i16; 4 * NC],
        zb: i32,
        panels: usize,
        q: usize,
        kq: usize,
        bb: &mut [u8],
        colsum: &mut [i32; NC],
    ) -> bool {
        const _: () = assert!(NRV == 32 && NC.is_multiple_of(NRV));
        // The last panel's quad ends at ((panels - 1) · kq + q + 1) · 128.
        let end = panels
            .checked_sub(1)
            .and_then(|p| p.checked_mul(kq))
            .and_then(|v| v.checked_add(q))
            .and_then(|v| v.checked_add(1))
            .and_then(|v| v.checked_mul(NRV * 4));
        if panels > NC / NRV || end.is_none_or(|e| e > bb.len()) {
            return false;
        }
        let zv = _mm512_set1_epi32(zb);
        let low = _mm512_set1_epi32(0xff);
        let (rp, bp, cp) = (rows.as_ptr(), bb.as_mut_ptr(), colsum.as_mut_ptr());
        for pn in 0..panels {
            // pn < panels <= NC / NRV, q < kq: the offsets are small.
            let at = pn.wrapping_mul(kq).wrapping_add(q).wrapping_mul(NRV * 4);
            for h in 0..2usize {
                let j = pn.wrapping_mul(NRV).wrapping_add(h.wrapping_mul(16));
                // SAFETY: j + 16 <= panels · NRV <= NC: row t's 16 values
                // at t · NC + j lie in `rows`, the sums in `colsum`; the 64
                // bytes at at + 64h lie in the panel's quad, inside `bb`
                // (its end checked above).
                unsafe {
                    let v = |t: usize| {
                        let r =
                            _mm256_loadu_si256(rp.add(t.wrapping_mul(NC).wrapping_add(j)).cast());
                        _mm512_add_epi32(_mm512_cvtepi16_epi32(r), zv)
                    };
                    let (v0, v1, v2, v3) = (v(0), v(1), v(2), v(3));
                    let b = |x: __m512i| _mm512_and_si512(x, low);
                    let word = _mm512_or_si512(
                        _mm512_or_si512(b(v0), _mm512_slli_epi32::<8>(b(v1))),
                        _mm512_or_si512(
                            _mm512_slli_epi32::<16>(b(v2)),
                            _mm512_slli_epi32::<24>(v3),
                        ),
                    );
                    _mm512_storeu_si512(bp.add(at.wrapping_add(h.wrapping_mul(64))).cast(), word);
                    let sum = _mm512_add_epi32(_mm512_add_epi32(v0, v1), _mm512_add_epi32(v2, v3));
                    let c = cp.add(j).cast::<__m512i>();
                    _mm512_storeu_si512(c, _mm512_add_epi32(_mm512_loadu_si512(c), sum));
                }
            }
        }
        true
    }

    /// `c[r * ldc + j] += Σ_q Σ_t A'(q, r, t) · B'(q, j, t)` for `r < MRV`,
    /// `j < NRV`; with `init`, `c[r * ldc + j] = init[r] + Σ ...` (the
    /// first k block: `c` is not read).
    ///
    /// # Safety
    /// `at` holds `kq × MRV` words, `bp` `kq × NRV × 4` bytes, `c`
    /// `(MRV - 1) * ldc + NRV` sums; the CPU supports AVX-512 F and VNNI.
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn ukr(
        kq: usize,
        at: &[i32],
        bp: &[u8],
        c: &mut [i32],
        ldc: usize,
        init: Option<&[i32]>,
    ) {
        let mut s = [[_mm512_setzero_si512(); 2]; MRV];
        if let Some(init) = init {
            for (sr, &v) in s.iter_mut().zip(init) {
                *sr = [_mm512_set1_epi32(v); 2];
            }
        }
        let (ap, bpp) = (at.as_ptr(), bp.as_ptr());
        for q in 0..kq {
            // SAFETY: q < kq and the caller's lengths.
            unsafe {
                let b = bpp.add(q.wrapping_mul(NRV * 4));
                let b0 = _mm512_loadu_si512(b as *const __m512i);
                let b1 = _mm512_loadu_si512(b.add(64) as *const __m512i);
                let aq = ap.add(q.wrapping_mul(MRV));
                for (r, sr) in s.iter_mut().enumerate() {
                    let av = _mm512_set1_epi32(*aq.add(r));
                    sr[0] = _mm512_dpbusd_epi32(sr[0], b0, av);
                    sr[1] = _mm512_dpbusd_epi32(sr[1], b1, av);
                }
            }
        }
        for (r, sr) in s.iter().enumerate() {
            // SAFETY: r < MRV and the caller's length of c.
            unsafe {
                let p = c.as_mut_ptr().add(r.wrapping_mul(ldc)) as *mut __m512i;
                if init.is_some() {
                    _mm512_storeu_si512(p, sr[0]);
                    _mm512_storeu_si512(p.add(1), sr[1]);
                } else {
                    _mm512_storeu_si512(p, _mm512_add_epi32(_mm512_loadu_si512(p), sr[0]));
                    let p = p.add(1);
                    _mm512_storeu_si512(p, _mm512_add_epi32(_mm512_loadu_si512(p), sr[1]));
                }
            }
        }
    }
}
