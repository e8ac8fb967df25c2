//! Register-blocked integer GEMM for 64-bit hosts: the int8 / uint8
//! convolutions and matrix products of the fused QDQ nodes, bit-identical
//! to the reference loops of [`super::qconv`].
//!
//! `C[i, j] = Σ_p A(i, p) · B(p, j)` where A and B are 8-bit values minus
//! their zero points. The differences lie in `[-255, 255]`, so they are
//! widened to i16 and multiplied in pairs of k steps into i32
//! (`vpmaddwd` on AVX2: two products of at most 255² each, whose sum fits
//! an i32 exactly). Sums wrap like the reference's `wrapping_add`, and
//! integer addition is associative, so the result is the reference's bit
//! for bit whatever the blocking. The zero points must fit that range
//! ([`zero_points_fit`]); a model whose zero points do not (only a hand-made
//! `.mote` could) runs the reference loops.
//!
//! Blocking, all on the stack (no arena scratch, about 70 KiB):
//! - rows are cut in chunks of up to [`MC`]; for each chunk, columns in
//!   blocks of `nc` (≤ [`NC`], a multiple of [`NR`], so that `mc × nc` i32
//!   sums fit the accumulator block);
//! - k in blocks of [`KC`]: B's `kc × nc` block is packed once as i16
//!   pairs, `NR` columns a panel, then each `MR`-row tile of A is packed
//!   (pairs as one i32 to broadcast) and multiplied with every panel;
//! - after the last k block, the chunk's sums are handed to the output
//!   ([`QIo::store`]), which adds the bias and requantizes.
//!
//! B is read before any output of its columns is written when the row
//! chunk covers all rows and k fits one block, which is what lets the
//! in-place pointwise convolution use this driver ([`fits_one_pass`]).

// Integer arithmetic is checked, saturating or wrapping by name (issue 8):
// `qgemm_with` checks A's extent once per call; inside the driver every
// block size is bounded by the constants below (MC, NC, KC), so its index
// products wrap by name with the bound beside them.

use super::cpu::{self, Kernels};
use super::{win, win_mut};

/// Rows of a register tile.
pub(crate) const MR: usize = 6;
/// Columns of a register tile (two AVX2 vectors of i32).
pub(crate) const NR: usize = 16;
/// Steps of k per block (even: k runs in pairs).
pub(crate) const KC: usize = 256;
/// Most columns of a block.
pub(crate) const NC: usize = 64;
/// Most rows of a chunk (a multiple of MR).
pub(crate) const MC: usize = 504;
/// i32 sums of one chunk × block.
const ACC: usize = 8192;

/// The left operand, row-major: `A(i, p) = a[i * lda + p] - z(i)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QMatA<'a, T> {
    pub a: &'a [T],
    pub lda: usize,
    /// One zero point for all rows, or one per row.
    pub z: Zero<'a>,
    /// The same values packed once by [`pack_a`] (constant weights), or
    /// empty: the driver then packs each tile as it goes.
    pub packed: &'a [i32],
}

/// First word of packed weights ([`pack_a`]): i16 pairs for the AVX2 and
/// portable kernels.
const PAIRS: i32 = 2;
/// First word of packed weights: signed-byte quads for the VNNI kernel.
const QUADS: i32 = 4;

/// i32 words of [`pack_a`] for `m × k` (the layout word included).
/// Saturates for shapes past memory (no buffer can then match it).
pub(crate) fn packed_len(quads: bool, m: usize, k: usize) -> usize {
    let body = if quads {
        super::qgemm_vnni::body_len(m, k)
    } else {
        pairs_len(m, k)
    };
    body.saturating_add(1)
}

/// Words of the pair layout, saturating as [`packed_len`].
fn pairs_len(m: usize, k: usize) -> usize {
    m.div_ceil(MR)
        .saturating_mul(MR)
        .saturating_mul(k.div_ceil(2))
}

/// Whether packed weights (one group's or several) are in the VNNI layout.
pub(crate) fn packed_quads(packed: &[i32]) -> bool {
    packed.first() == Some(&QUADS)
}

/// Whether weights packed now should use the VNNI layout: the kernel the
/// int8 GEMM selects at this moment (prepare).
pub(crate) fn quads_now() -> bool {
    selection().1
}

/// A packed for the micro-kernel once, after a layout word: with `quads`,
/// [`super::qgemm_vnni::pack_a`]; else `[row tile][pair of k][MR]`, each
/// word a pair of `a - z` (rows past `m` and the odd last step are 0).
/// What the driver would pack tile by tile, for weights reused every run.
/// Empty if A is short.
#[cfg(feature = "alloc")]
pub(crate) fn pack_a<T: super::QInt>(
    m: usize,
    k: usize,
    a: &QMatA<'_, T>,
    quads: bool,
) -> alloc::vec::Vec<i32> {
    let extent = m
        .saturating_sub(1)
        .checked_mul(a.lda)
        .and_then(|v| v.checked_add(k));
    if a.lda < k || extent.is_none_or(|e| a.a.len() < e) {
        return alloc::vec::Vec::new();
    }
    let mut out = alloc::vec![if quads { QUADS } else { PAIRS }];
    if quads {
        out.extend(super::qgemm_vnni::pack_a(m, k, a));
        return out;
    }
    let kq = k.div_ceil(2);
    // A holds m rows of k (checked above), so pairs_len(m, k) (at most
    // (m + MR) · (k + 1) words) did not saturate.
    out.resize(pairs_len(m, k).saturating_add(1), 0);
    let body = out.get_mut(1..).unwrap_or(&mut []);
    for (t, tile) in body
        .chunks_exact_mut(kq.saturating_mul(MR).max(1))
        .enumerate()
    {
        // t < ceil(m / MR) tiles (none when k = 0): t · MR < m.
        let i0 = t.wrapping_mul(MR);
        let rows = MR.min(m.wrapping_sub(i0));
        pack_tile(a, i0, rows, 0, k, tile);
    }
    out
}

/// Rows `i0 .. i0 + rows` of A, steps `p0 .. p0 + kc`, into `at`
/// (`[pair][MR]`, zero elsewhere).
#[inline(always)]
fn pack_tile<T: super::QInt>(
    a: &QMatA<'_, T>,
    i0: usize,
    rows: usize,
    p0: usize,
    kc: usize,
    at: &mut [i32],
) {
    at.fill(0);
    // Rows i0 + r < m and steps p0 + kc <= k, where A holds m rows of lda
    // >= k (`qgemm_with` / `pack_a` checked (m - 1) · lda + k): the row
    // offsets below do not wrap. Pair slots q · MR + r < kc / 2 · MR + MR
    // are small (kc <= k), and `get` bounds them. Values and zero points lie
    // in [-128, 255]: their differences fit i32.
    for r in 0..rows {
        let gi = i0.wrapping_add(r);
        let z = a.z.of(gi);
        let start = gi.wrapping_mul(a.lda).wrapping_add(p0);
        let Some(src) = win(a.a, start, kc) else {
            return;
        };
        let mut ps = src.chunks_exact(2);
        for (q, two) in (&mut ps).enumerate() {
            let slot = q.wrapping_mul(MR).wrapping_add(r);
            if let (Some(w), &[x0, x1]) = (at.get_mut(slot), two) {
                *w = pair(x0.get().wrapping_sub(z), x1.get().wrapping_sub(z));
            }
        }
        if let [last] = ps.remainder() {
            let slot = (kc / 2).wrapping_mul(MR).wrapping_add(r);
            if let Some(w) = at.get_mut(slot) {
                *w = pair(last.get().wrapping_sub(z), 0);
            }
        }
    }
}

/// Zero points of A's rows.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Zero<'a> {
    All(i32),
    Rows(&'a [i32]),
}

impl Zero<'_> {
    #[inline]
    pub(crate) fn of(&self, i: usize) -> i32 {
        match self {
            Zero::All(z) => *z,
            Zero::Rows(z) => z.get(i).copied().unwrap_or(0),
        }
    }
}

/// The right operand and the output of one product, shared by the tasks
/// of [`qgemm`].
pub(crate) trait QIo: Sync {
    /// `B(p, j0 + j) - zero point` for `j < out.len()` (`out.len() <= NC`).
    fn b_row(&self, p: usize, j0: usize, out: &mut [i16]);
    /// The finished sums of row `i`, columns `j0 ..` (`acc.len()` of them).
    /// [`qgemm`] stores each (row, column) once, and a task reads B
    /// (`b_row`) and stores only over the columns it owns, so outputs
    /// written through a [`super::par::SharedMut`] never overlap.
    fn store(&self, i: usize, j0: usize, acc: &[i32]);
    /// `zb - LO` when every column of B has the same zero point `zb` and
    /// it lies within B's type `LO ..= LO + 255`: then `B - zb + this` is
    /// B's value as an unsigned byte, which the VNNI kernel multiplies.
    /// `None` (the default) keeps the i16 kernels.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn b_u8_zero(&self) -> Option<i32> {
        None
    }
}

/// Whether every zero point keeps `value - zero` within i16 products that
/// cannot overflow a pair sum (`|diff| <= 255` for 8-bit values).
pub(crate) fn zero_points_fit(zs: &[i32]) -> bool {
    zs.iter().all(|z| (-128..=255).contains(z))
}

/// Whether `m` rows and `k` steps run in one pass per column block: every
/// column block of B is read before any output of it is stored.
pub(crate) fn fits_one_pass(m: usize, k: usize) -> bool {
    m <= MC && k <= KC
}

/// Packs `a` pairs: `lo` in the low half, `hi` in the high half.
#[inline(always)]
fn pair(lo: i32, hi: i32) -> i32 {
    ((lo as u16 as u32) | ((hi as u16 as u32) << 16)) as i32
}

/// `C = A · B` for `m × k` by `k × n`, handed row segment by row segment
/// to `io.store`, each (row, column) exactly once. With a parallel-for
/// provider ([`super::par`]) the columns are cut into ranges, one task
/// each: a task reads B and stores C only over its own columns, and every
/// sum is formed as in one task, so the result is the same. `false`
/// (nothing stored) when A is short.
pub(crate) fn qgemm<T: super::QInt, IO: QIo>(
    m: usize,
    n: usize,
    k: usize,
    a: QMatA<'_, T>,
    io: &IO,
) -> bool {
    let (kind, vnni) = selection();
    qgemm_with(kind, vnni, super::par::workers(), m, n, k, a, io)
}

/// The integer kernels in use now (on this thread, for unit tests): the
/// family, and whether the AVX-512 VNNI ones are among them.
pub(crate) fn selection() -> (Kernels, bool) {
    #[cfg(test)]
    if let Some(forced) = testing::forced() {
        return forced;
    }
    let kind = if cfg!(target_pointer_width = "64") {
        cpu::kernels()
    } else {
        Kernels::Reference
    };
    (kind, kind == Kernels::Avx2Fma && cpu::avx512_vnni())
}

fn kernels_now() -> Kernels {
    selection().0
}

/// Whether the blocked integer kernels run (else callers use their
/// reference loops).
pub(crate) fn enabled() -> bool {
    kernels_now() != Kernels::Reference
}

/// [`qgemm`] with the kernels given: `kind` as [`cpu::kernels`], `vnni`
/// for the VNNI kernel (x86_64 with `kind` AVX2; the caller vouches that
/// the CPU has AVX-512 F, BW and VNNI).
pub(crate) fn qgemm_with<T: super::QInt, IO: QIo>(
    kind: Kernels,
    vnni: bool,
    workers: usize,
    m: usize,
    n: usize,
    k: usize,
    a: QMatA<'_, T>,
    io: &IO,
) -> bool {
    if m == 0 || n == 0 {
        return true;
    }
    // m >= 1 here. Every offset the driver forms in A is below this extent.
    let extent = m
        .wrapping_sub(1)
        .checked_mul(a.lda)
        .and_then(|v| v.checked_add(k));
    if k > 0 && (a.lda < k || extent.is_none_or(|e| a.a.len() < e)) {
        return false;
    }
    if let Zero::Rows(z) = a.z {
        if z.len() < m {
            return false;
        }
    }
    let blocks = n.div_ceil(NR);
    let macs = m.saturating_mul(n).saturating_mul(k.max(1));
    let t = super::par::tasks_int8(workers, macs, blocks);
    if t <= 1 {
        return run_cols(kind, vnni, m, (0, n), k, &a, io);
    }
    let ok = core::sync::atomic::AtomicBool::new(true);
    super::par::for_each(t, &|ti| {
        let (lo, hi) = super::par::chunk(blocks, t, ti);
        // lo <= hi <= blocks = ceil(n / NR): lo · NR < n + NR.
        let cols = (lo.saturating_mul(NR).min(n), hi.saturating_mul(NR).min(n));
        if !run_cols(kind, vnni, m, cols, k, &a, io) {
            ok.store(false, core::sync::atomic::Ordering::Relaxed);
        }
    });
    ok.into_inner()
}

/// The driver over columns `cols`, compiled for AVX2 when selected.
fn run_cols<T: super::QInt, IO: QIo>(
    kind: Kernels,
    vnni: bool,
    m: usize,
    cols: (usize, usize),
    k: usize,
    a: &QMatA<'_, T>,
    io: &IO,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let (true, Kernels::Avx2Fma, Some(zb)) = (vnni, kind, io.b_u8_zero()) {
        let pre = match a.packed.split_first() {
            Some((&QUADS, body)) => body,
            _ => &[],
        };
        // SAFETY: `vnni` is set only where the CPU has AVX-512 F, BW and
        // VNNI (`cpu::enable_avx512_vnni`, or the build targets them), and
        // `b_u8_zero` vouches that B's values are unsigned bytes.
        return unsafe { super::qgemm_vnni::driver(m, cols, k, a, pre, io, zb) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = vnni;
    #[cfg(target_arch = "x86_64")]
    if kind == Kernels::Avx2Fma {
        // SAFETY: `Avx2Fma` is selected only when the CPU has AVX2 (see
        // `cpu::enable_avx2_fma`) or the build targets it. The driver and
        // the operand's packing and stores compiled for AVX2.
        return unsafe { driver_avx2(m, cols, k, a, io) };
    }
    driver(kind, m, cols, k, a, io)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn driver_avx2<T: super::QInt, IO: QIo>(
    m: usize,
    cols: (usize, usize),
    k: usize,
    a: &QMatA<'_, T>,
    io: &IO,
) -> bool {
    driver(Kernels::Avx2Fma, m, cols, k, a, io)
}

/// Rows `0..m`, columns `cols.0 .. cols.1` (`qgemm_with` checked A).
/// Every block lies in its buffer by the tile sizes; `false` (a bug, never
/// seen) if one does not.
#[inline(always)]
fn driver<T: super::QInt, IO: QIo>(
    kind: Kernels,
    m: usize,
    cols: (usize, usize),
    k: usize,
    a: &QMatA<'_, T>,
    io: &IO,
) -> bool {
    let mut bpack = [0i16; KC * NC];
    let mut apack = [0i32; MR * KC / 2];
    let mut acc = [0i32; ACC];
    let mut rows = [0i16; 2 * NC];
    let kq_all = k.div_ceil(2);
    let pre = match a.packed.split_first() {
        Some((&PAIRS, body)) if body.len() == pairs_len(m, k) => body,
        _ => &[],
    };
    // Bounds of the products below: mc <= MC, mc_up <= MC (a multiple of
    // MR), nc <= NC, ncur <= nc, panels <= NC / NR, kc <= KC, kq <= KC / 2,
    // i0 < mc, q < kq, pn < panels: every block offset is under its
    // buffer's length (ACC, KC · NC, MR · KC / 2), checked again by
    // `win` / `win_mut`. Positions in the whole product (i_c + i0 < m,
    // j0 < n, p0 + 2q + 1 < p0 + kc <= k) do not wrap; the loop steps
    // saturate.
    let mut i_c = 0;
    while i_c < m {
        let mc = MC.min(m.wrapping_sub(i_c));
        let mc_up = mc.div_ceil(MR).wrapping_mul(MR);
        // Columns per block: a multiple of NR with mc_up × nc sums in `acc`
        // (mc_up >= MR: mc >= 1).
        let nc = (ACC.checked_div(mc_up).unwrap_or(ACC) / NR)
            .wrapping_mul(NR)
            .clamp(NR, NC);
        let (mut j0, n) = cols;
        while j0 < n {
            let ncur = nc.min(n.wrapping_sub(j0));
            let panels = ncur.div_ceil(NR);
            let Some(accb) = win_mut(&mut acc, 0, mc_up.wrapping_mul(nc)) else {
                return false;
            };
            accb.fill(0);
            let mut p0 = 0usize;
            while p0 < k {
                let kc = KC.min(k.wrapping_sub(p0));
                let kq = kc.div_ceil(2);
                // B block: panel q-major, `[panel][pair][NR][2]`.
                let panel_len = kq.wrapping_mul(NR).wrapping_mul(2);
                let Some(bb) = win_mut(&mut bpack, 0, panels.wrapping_mul(panel_len)) else {
                    return false;
                };
                for q in 0..kq {
                    let (r0, r1) = rows.split_at_mut(NC);
                    r0.fill(0);
                    r1.fill(0);
                    let (Some(b0), Some(b1)) = (win_mut(r0, 0, ncur), win_mut(r1, 0, ncur)) else {
                        return false;
                    };
                    let p = p0.wrapping_add(q.wrapping_mul(2));
                    io.b_row(p, j0, b0);
                    if q.wrapping_mul(2).wrapping_add(1) < kc {
                        io.b_row(p.wrapping_add(1), j0, b1);
                    }
                    let panel_rows = r0.chunks_exact(NR).zip(r1.chunks_exact(NR));
                    for (pn, (x0, x1)) in panel_rows.take(panels).enumerate() {
                        let at = pn
                            .wrapping_mul(panel_len)
                            .wrapping_add(q.wrapping_mul(NR * 2));
                        let Some(dst) = win_mut(bb, at, NR * 2) else {
                            return false;
                        };
                        for ((d, &u), &v) in dst.chunks_exact_mut(2).zip(x0).zip(x1) {
                            if let [d0, d1] = d {
                                *d0 = u;
                                *d1 = v;
                            }
                        }
                    }
                }
                let mut i0 = 0usize;
                while i0 < mc {
                    let mr = MR.min(mc.wrapping_sub(i0));
                    let gi = i_c.wrapping_add(i0);
                    let a_len = kq.wrapping_mul(MR);
                    // A tile: `[pair][MR]`, rows past mr are zero.
                    let at: &[i32] = if !pre.is_empty() {
                        // pre holds pairs_len(m, k) words (matched above):
                        // tile gi / MR's pairs p0 / 2 .. lie inside it.
                        let tile = (gi / MR).wrapping_mul(kq_all).wrapping_add(p0 / 2);
                        let Some(at) = win(pre, tile.wrapping_mul(MR), a_len) else {
                            return false;
                        };
                        at
                    } else {
                        let Some(at) = win_mut(&mut apack, 0, a_len) else {
                            return false;
                        };
                        pack_tile(a, gi, mr, p0, kc, at);
                        at
                    };
                    for pn in 0..panels {
                        let c_at = i0.wrapping_mul(nc).wrapping_add(pn.wrapping_mul(NR));
                        let (Some(bp), Some(c)) = (
                            win(bb, pn.wrapping_mul(panel_len), panel_len),
                            accb.get_mut(c_at..),
                        ) else {
                            return false;
                        };
                        ukr(kind, kq, at, bp, c, nc);
                    }
                    i0 = i0.saturating_add(MR);
                }
                p0 = p0.saturating_add(KC);
            }
            for (r, sums) in accb.chunks_exact(nc).take(mc).enumerate() {
                let Some(sums) = sums.get(..ncur) else {
                    return false;
                };
                io.store(i_c.wrapping_add(r), j0, sums);
            }
            j0 = j0.saturating_add(nc);
        }
        i_c = i_c.saturating_add(mc);
    }
    true
}

/// `c[r * ldc + j] += Σ_q A pair (q, r) · B pair (q, j)` for `r < MR`,
/// `j < NR`: `at` is `kq × MR` pairs, `bp` is `kq × NR × 2`, `c` holds
/// `(MR - 1) * ldc + NR` sums.
#[inline]
fn ukr(kind: Kernels, kq: usize, at: &[i32], bp: &[i16], c: &mut [i32], ldc: usize) {
    let c_need = ldc.saturating_mul(MR - 1).saturating_add(NR);
    if at.len() < kq.saturating_mul(MR) || bp.len() < kq.saturating_mul(NR * 2) || c.len() < c_need
    {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if kind == Kernels::Avx2Fma {
        // SAFETY: `Avx2Fma` is selected only when the CPU has AVX2 (see
        // `cpu::enable_avx2_fma`) or the build targets it; the lengths were
        // checked above.
        unsafe { ukr_avx2(kq, at, bp, c, ldc) };
        return;
    }
    let _ = kind;
    ukr_portable(kq, at, bp, c, ldc);
}

#[inline(always)]
fn ukr_portable(kq: usize, at: &[i32], bp: &[i16], c: &mut [i32], ldc: usize) {
    let mut s = [[0i32; NR]; MR];
    for (ap, bq) in at.chunks_exact(MR).zip(bp.chunks_exact(NR * 2)).take(kq) {
        for (sr, &w) in s.iter_mut().zip(ap) {
            let (a0, a1) = (w as i16 as i32, (w >> 16) as i16 as i32);
            for (x, b) in sr.iter_mut().zip(bq.chunks_exact(2)) {
                if let &[b0, b1] = b {
                    // Two i16 × i16 products and their sum fit i32 (the
                    // operands are differences within [-383, 383]).
                    let pair = a0
                        .wrapping_mul(b0 as i32)
                        .wrapping_add(a1.wrapping_mul(b1 as i32));
                    *x = x.wrapping_add(pair);
                }
            }
        }
    }
    // `ukr` checked that `c` holds every row.
    for (r, sr) in s.iter().enumerate() {
        // r < MR: r · ldc is under c's length (checked by `ukr`).
        if let Some(crow) = win_mut(c, r.wrapping_mul(ldc), NR) {
            for (cv, &v) in crow.iter_mut().zip(sr) {
                *cv = cv.wrapping_add(v);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn ukr_avx2(kq: usize, at: &[i32], bp: &[i16], c: &mut [i32], ldc: usize) {
    use core::arch::x86_64::*;
    let mut s = [[_mm256_setzero_si256(); 2]; MR];
    let (ap, bpp) = (at.as_ptr(), bp.as_ptr());
    for q in 0..kq {
        // SAFETY: q < kq; `ukr` checked `at` holds kq × MR pairs and `bp`
        // kq × NR × 2 halves.
        unsafe {
            let b = bpp.add(q.wrapping_mul(NR * 2));
            let b0 = _mm256_loadu_si256(b as *const __m256i);
            let b1 = _mm256_loadu_si256(b.add(NR) as *const __m256i);
            let aq = ap.add(q.wrapping_mul(MR));
            for (r, sr) in s.iter_mut().enumerate() {
                let av = _mm256_set1_epi32(*aq.add(r));
                sr[0] = _mm256_add_epi32(sr[0], _mm256_madd_epi16(av, b0));
                sr[1] = _mm256_add_epi32(sr[1], _mm256_madd_epi16(av, b1));
            }
        }
    }
    for (r, sr) in s.iter().enumerate() {
        // SAFETY: r < MR and `ukr` checked c holds (MR - 1) * ldc + NR sums.
        unsafe {
            let p = c.as_mut_ptr().add(r.wrapping_mul(ldc)) as *mut __m256i;
            _mm256_storeu_si256(p, _mm256_add_epi32(_mm256_loadu_si256(p), sr[0]));
            let p = p.add(1);
            _mm256_storeu_si256(p, _mm256_add_epi32(_mm256_loadu_si256(p), sr[1]));
        }
    }
}

/// A per-thread choice of the integer kernels for unit tests, which run in
/// parallel and must not switch the process-wide selection under the f32
/// tests.
#[cfg(test)]
pub(crate) mod testing {
    extern crate std;
    use super::Kernels;
    use core::cell::Cell;
    use std::vec::Vec;

    std::thread_local! {
        static FORCED: Cell<Option<(Kernels, bool)>> = const { Cell::new(None) };
    }

    pub(super) fn forced() -> Option<(Kernels, bool)> {
        FORCED.with(Cell::get)
    }

    /// Until the guard drops, this thread's integer GEMMs (and weight
    /// packing) use `sel`.
    pub(crate) fn with(sel: (Kernels, bool)) -> Guard {
        FORCED.with(|f| f.set(Some(sel)));
        Guard
    }

    pub(crate) struct Guard;
    impl Drop for Guard {
        fn drop(&mut self) {
            FORCED.with(|f| f.set(None));
        }
    }

    /// Every selection this CPU can run: portable blocked, AVX2, VNNI
    /// (aarch64: its NEON default, whose int8 paths are portable code).
    #[allow(unused_mut)]
    pub(crate) fn selections() -> Vec<(Kernels, bool)> {
        let mut v = std::vec![(Kernels::Blocked, false)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                v.push((Kernels::Avx2Fma, false));
            }
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::is_x86_feature_detected!("avx512vnni")
            {
                v.push((Kernels::Avx2Fma, true));
            }
        }
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        v.push((Kernels::Neon, false));
        v
    }
}
