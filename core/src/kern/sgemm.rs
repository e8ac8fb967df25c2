//! Register-blocked f32 GEMM for 64-bit hosts, with no heap and no arena
//! scratch.
//!
//! `C = alpha · A·B + beta · C`, C row-major. The product is cut into tiles
//! of `MR × NR` (6 × 16) accumulators held in registers for a block of up to
//! `KC` (256) steps of k; a micro-kernel reads
//! - A in place, through a row stride and a column stride (so plain and
//!   transposed A cost the same, and Conv weights are never copied), and
//! - B either in place, when it is a dense row-major matrix, the tile is
//!   full width and the row stride does not alias in L1 where many row
//!   tiles reuse the panel ([`aliases`]), or from a `KC × NR` panel packed
//!   on the stack (16 KiB):
//!   transposed B, the last partial tile, and Conv's implicit im2col
//!   ([`Im2col`]: the patch matrix is never materialized, only one panel of
//!   it at a time).
//!
//! Loop order: k blocks, then panels of B (one packed panel is reused by
//! every row tile of A while it sits in L1), then row tiles. The
//! micro-kernels are `ukr_avx2` (x86_64 AVX2 + FMA, 12 ymm accumulators),
//! `ukr_neon` and `ukr_portable` (plain Rust that LLVM vectorizes: SSE2 on
//! x86_64 without AVX2). Which one runs is [`super::cpu::kernels`]; the
//! reference loops stay in `ops::matmul::gemm`, and the tests below check
//! every kernel against them on edge sizes.
//!
//! With AVX-512 ([`super::cpu::avx512_vnni`]) B is read two panels at a
//! time by [`ukr_avx512`], 12 × 32 tiles in 24 zmm accumulators, with the
//! same bits as the AVX2 kernel, whatever B's source ([`Src`]): packed at
//! prepare ([`Packed`]: MatMul's constant weights), read in place, or
//! packed by the task (the second panel into a second stack panel); the
//! rows and the panel left over run the AVX2 tiles. On Conv's GEMMs it took
//! ResNet-18 64.8 → 46.4 ms, MobileNetV2 11.8 → 9.6, MobileNetV1 0.369 →
//! 0.328, KWS 0.092 → 0.075 on the Xeon VM of README's figures. The same
//! trial on another Xeon VM (that of the 94ba204 run) had made the
//! MobileNets and KWS 13–24 % slower and ResNet-18 6 % faster; there
//! `MOTE_KERNELS=avx2` keeps every f32 GEMM on AVX2.

// Integer arithmetic is checked, saturating or wrapping by name (issue 8):
// the drivers check every extent the kernels reach once per call (A, B
// and C against m, n, k and their strides; `Im2col::new` the geometry),
// and the offsets under those bounds wrap by name.

use core::num::NonZeroUsize;

use super::cpu::{self, Kernels};
use super::{copy_row, par, tap_in, win, win_mut, Geom};
use crate::math;

/// Rows of a register tile.
pub(crate) const MR: usize = 6;
/// Columns of a register tile.
pub(crate) const NR: usize = 16;
/// Steps of k per block (a packed panel is `KC × NR` floats).
pub(crate) const KC: usize = 256;
/// Rows of the AVX-512 tile ([`ukr_avx512`]): two row tiles.
#[cfg(target_arch = "x86_64")]
const MR2: usize = 2 * MR;

/// The micro-kernels one GEMM call runs ([`Kernels`] with AVX2 + FMA split
/// by whether AVX-512 may run too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ukr {
    /// `ukr_portable`: plain Rust.
    Portable,
    /// `ukr_avx2` / `ukr_avx2_out`: 6 × 16 tiles in 12 ymm accumulators.
    Avx2,
    /// [`Ukr::Avx2`], and [`ukr_avx512`] for 12 × 32 tiles in 24 zmm
    /// accumulators where a task has 12 rows and two whole panels left.
    Avx512,
    /// `ukr_neon`.
    Neon,
}

impl Ukr {
    /// The micro-kernels of `kind` on this CPU: AVX-512 where the int8
    /// kernels may use it ([`cpu::avx512_vnni`], which implies AVX-512 F).
    fn of(kind: Kernels) -> Self {
        match kind {
            Kernels::Avx2Fma if cpu::avx512_vnni() => Ukr::Avx512,
            Kernels::Avx2Fma => Ukr::Avx2,
            Kernels::Neon => Ukr::Neon,
            _ => Ukr::Portable,
        }
    }
}

/// Where A(i, p) lives: `a[i * rs + p * cs]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatA<'a> {
    pub a: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

/// A source of B, `k × n`.
pub(crate) trait SrcB {
    /// `Some((b, ldb))` when B(p, j) is `b[p * ldb + j]`: full-width tiles
    /// are then read in place.
    fn dense(&self) -> Option<(&[f32], usize)>;
    /// Writes B(p0 + p, j0 + j) to `dst[p * NR + j]` for `p < kc`, `j < nr`,
    /// and zeros for `nr <= j < NR` (`dst` holds `kc × NR`, `nr ≤ NR`);
    /// `false` if it does not.
    fn pack(&self, p0: usize, kc: usize, j0: usize, nr: usize, dst: &mut [f32]) -> bool;
    /// The `kc × NR` panel at (`p0`, `j0`) already packed, to read in
    /// place ([`Packed`]); `None` to pack it.
    fn panel(&self, _p0: usize, _j0: usize) -> Option<&[f32]> {
        None
    }
}

/// A constant B packed once, before the first run (onnxruntime packs
/// constant MatMul weights the same way): block by block of `KC` steps of
/// k, panel by panel of `NR` columns, each panel `kc × NR` floats, the
/// last one zero-padded. The micro-kernels then read every panel as one
/// contiguous run, and no run packs or reads B at its row stride (a weight
/// 1024 floats wide puts each row of a panel on its own 4 KiB page, which
/// the hardware prefetchers do not follow: packing such a B on every run
/// took 29 % of the transformer block's time on a Xeon).
#[cfg(feature = "alloc")]
#[derive(Debug)]
pub(crate) struct Packed {
    data: alloc::vec::Vec<f32>,
    k: usize,
    n: usize,
}

#[cfg(feature = "alloc")]
impl Packed {
    /// B (`k × n`, from `src`) packed; `None` when the size overflows or
    /// `src` cannot be packed.
    pub(crate) fn new(src: &impl SrcB, k: usize, n: usize) -> Option<Self> {
        let panels = n.div_ceil(NR);
        let len = k.checked_mul(panels)?.checked_mul(NR)?;
        let mut data = alloc::vec![0f32; len];
        let mut rest = &mut data[..];
        let mut p0 = 0usize;
        while p0 < k {
            let kc = KC.min(k.wrapping_sub(p0));
            for j in 0..panels {
                // j < panels: j · NR < n.
                let j0 = j.wrapping_mul(NR);
                let (dst, tail) = rest.split_at_mut_checked(kc.checked_mul(NR)?)?;
                if !src.pack(p0, kc, j0, NR.min(n.wrapping_sub(j0)), dst) {
                    return None;
                }
                rest = tail;
            }
            p0 = p0.wrapping_add(KC);
        }
        Some(Packed { data, k, n })
    }

    /// Bytes of the packed panels.
    pub(crate) fn bytes(&self) -> usize {
        core::mem::size_of_val(self.data.as_slice())
    }

    /// Rows of B (k).
    pub(crate) fn k(&self) -> usize {
        self.k
    }

    /// Columns of B (n).
    pub(crate) fn n(&self) -> usize {
        self.n
    }
}

#[cfg(feature = "alloc")]
impl SrcB for Packed {
    fn dense(&self) -> Option<(&[f32], usize)> {
        None
    }
    fn pack(&self, p0: usize, kc: usize, j0: usize, nr: usize, dst: &mut [f32]) -> bool {
        let Some(src) = self.panel(p0, j0) else {
            return false;
        };
        for (d, s) in dst.chunks_exact_mut(NR).zip(src.chunks_exact(NR)).take(kc) {
            let (Some(d), Some(s)) = (d.get_mut(..nr), s.get(..nr)) else {
                return false;
            };
            d.copy_from_slice(s);
        }
        true
    }
    fn panel(&self, p0: usize, j0: usize) -> Option<&[f32]> {
        if !p0.is_multiple_of(KC) || !j0.is_multiple_of(NR) || p0 >= self.k || j0 >= self.n {
            return None;
        }
        // p0 < k.
        let kc = KC.min(self.k.wrapping_sub(p0));
        let panels = self.n.div_ceil(NR);
        // Blocks before p0 are full (KC rows each).
        let at = p0
            .checked_mul(panels)?
            .checked_add((j0 / NR).checked_mul(kc)?)?
            .checked_mul(NR)?;
        self.data.get(at..at.checked_add(kc.checked_mul(NR)?)?)
    }
}

/// B stored row-major: B(p, j) = `b[p * ldb + j]`.
pub(crate) struct Dense<'a> {
    pub b: &'a [f32],
    pub ldb: usize,
}

impl SrcB for Dense<'_> {
    fn dense(&self) -> Option<(&[f32], usize)> {
        Some((self.b, self.ldb))
    }
    fn pack(&self, p0: usize, kc: usize, j0: usize, nr: usize, dst: &mut [f32]) -> bool {
        for (p, row) in dst.chunks_exact_mut(NR).take(kc).enumerate() {
            let Some((head, tail)) = row.split_at_mut_checked(nr) else {
                return false;
            };
            // p0 + p < k and j0 + nr <= n: under the extent the driver
            // checked, (k - 1)·ldb + n.
            let start = p0.wrapping_add(p).wrapping_mul(self.ldb).wrapping_add(j0);
            match win(self.b, start, nr) {
                Some(src) => copy_row(head, src),
                None => head.fill(0.0),
            }
            if !tail.is_empty() {
                tail.fill(0.0);
            }
        }
        true
    }
}

/// B stored transposed: B(p, j) = `b[j * ldb + p]`.
pub(crate) struct Trans<'a> {
    pub b: &'a [f32],
    pub ldb: usize,
}

impl SrcB for Trans<'_> {
    fn dense(&self) -> Option<(&[f32], usize)> {
        None
    }
    fn pack(&self, p0: usize, kc: usize, j0: usize, nr: usize, dst: &mut [f32]) -> bool {
        let Some(dst) = win_mut(dst, 0, kc.saturating_mul(NR)) else {
            return false;
        };
        if nr < NR {
            dst.fill(0.0);
        }
        for j in 0..nr.min(NR) {
            // Checked: nothing upstream bounds a transposed B's extent.
            let start = j0
                .checked_add(j)
                .and_then(|c| c.checked_mul(self.ldb))
                .and_then(|o| o.checked_add(p0));
            if let Some(col) = start.and_then(|o| win(self.b, o, kc)) {
                // Column j of the panel: dst[j], dst[NR + j], ...
                let Some(dcol) = dst.get_mut(j..) else {
                    return false;
                };
                for (d, &v) in dcol.iter_mut().step_by(NR).zip(col) {
                    *d = v;
                }
            }
        }
        true
    }
}

/// Conv's patch matrix of one group, never materialized: B(p, j) with
/// p = (channel, kd, kh, kw) over the group's input channels and j = output
/// position (od, oh, ow), zero where the window hangs over the padding.
pub(crate) struct Im2col<'a> {
    /// The group's input planes, `channels × in_sz`.
    x: &'a [f32],
    g: &'a Geom,
    /// Input plane size, kernel taps per channel and output plane size,
    /// each checked (`Geom::checked_sizes`), with the window reach
    /// (`Geom::reach_ok`), by [`Im2col::new`].
    in_sz: usize,
    k_sz: usize,
    o12: usize,
}

impl<'a> Im2col<'a> {
    /// The patch matrix of input planes `x` under geometry `g`; `None` if a
    /// size passes `usize` or a window reaches past the padded input (never
    /// for a geometry from `forward_geom`).
    pub(crate) fn new(x: &'a [f32], g: &'a Geom) -> Option<Self> {
        let (in_sz, _, k_sz) = g.checked_sizes()?;
        let [_, o1, o2] = g.out;
        let o12 = o1.checked_mul(o2)?;
        g.reach_ok().then_some(Im2col {
            x,
            g,
            in_sz,
            k_sz,
            o12,
        })
    }
}

impl SrcB for Im2col<'_> {
    fn dense(&self) -> Option<(&[f32], usize)> {
        None
    }
    fn pack(&self, p0: usize, kc: usize, j0: usize, nr: usize, dst: &mut [f32]) -> bool {
        let g = self.g;
        let [_, o1, o2] = g.out;
        let [i0, i1, i2] = g.inp;
        let [k0, k1, k2] = g.k;
        let ([s0, s1, s2], [d0, d1, d2], [pb0, pb1, pb2]) = (g.s, g.d, g.pb);
        let in_sz = self.in_sz;
        let nz = NonZeroUsize::new;
        // k1 · k2 <= k_sz and o1 · o2 = o12, products checked by `new`.
        let (Some(k_nz), Some(k12), Some(k1_nz), Some(k2_nz), Some(o12), Some(o1_nz), Some(o2_nz)) = (
            nz(self.k_sz),
            nz(k1.wrapping_mul(k2)),
            nz(k1),
            nz(k2),
            nz(self.o12),
            nz(o1),
            nz(o2),
        ) else {
            return true;
        };
        // Index arithmetic below wraps by name only: output positions j0 + j
        // stay below n (the driver's columns), window indices under the
        // reach `new` checked (so `o·s + k·d` does not wrap and `- pb`
        // wraps on purpose, failing the `< i` tests), rows and columns of
        // a plane under its checked size.
        // The panel's columns as runs along one output row: (first column,
        // length, od, oh, first ow).
        let mut runs = [(0usize, 0usize, 0usize, 0usize, 0usize); NR];
        let mut n_runs = 0usize;
        let mut j = 0usize;
        for run in runs.iter_mut() {
            if j >= nr {
                break;
            }
            let o = j0.wrapping_add(j);
            let ow = o % o2_nz;
            let len = o2.wrapping_sub(ow).min(nr.wrapping_sub(j));
            *run = (j, len, o / o12, (o / o2_nz) % o1_nz, ow);
            n_runs = n_runs.wrapping_add(1);
            j = j.wrapping_add(len);
        }
        let Some(runs) = runs.get(..n_runs) else {
            return false;
        };
        let (mut c, r) = (p0 / k_nz, p0 % k_nz);
        let (mut kd, mut kh, mut kw) = (r / k12, (r / k2_nz) % k1_nz, r % k2_nz);
        for row in dst.chunks_exact_mut(NR).take(kc) {
            row.fill(0.0);
            let plane = c.checked_mul(in_sz).and_then(|at| win(self.x, at, in_sz));
            if let Some(plane) = plane {
                for &(js, len, od, oh, ow) in runs {
                    // in = out * stride + k * dilation - pad, in [0, inp).
                    let (id, ih) = (tap_in(od, s0, kd, d0, pb0), tap_in(oh, s1, kh, d1, pb1));
                    if id >= i0 || ih >= i1 {
                        continue;
                    }
                    let at = id.wrapping_mul(i1).wrapping_add(ih).wrapping_mul(i2);
                    let (Some(line), Some(out)) = (win(plane, at, i2), win_mut(row, js, len))
                    else {
                        return false;
                    };
                    let base = ow.wrapping_mul(s2).wrapping_add(kw.wrapping_mul(d2));
                    if s2 == 1 {
                        // Columns t with 0 <= base + t - pad < i2.
                        let lo = pb2.saturating_sub(base).min(len);
                        let hi = i2.wrapping_add(pb2).saturating_sub(base).min(len);
                        if lo < hi {
                            let from = base.wrapping_add(lo).wrapping_sub(pb2);
                            let n = hi.wrapping_sub(lo);
                            let (Some(dst), Some(src)) = (win_mut(out, lo, n), win(line, from, n))
                            else {
                                return false;
                            };
                            dst.copy_from_slice(src);
                        }
                    } else {
                        for (t, v) in out.iter_mut().enumerate() {
                            let iw = base.wrapping_add(t.wrapping_mul(s2)).wrapping_sub(pb2);
                            if let Some(&x) = line.get(iw) {
                                *v = x;
                            }
                        }
                    }
                }
            }
            kw = kw.wrapping_add(1);
            if kw == k2 {
                kw = 0;
                kh = kh.wrapping_add(1);
                if kh == k1 {
                    kh = 0;
                    kd = kd.wrapping_add(1);
                    if kd == k0 {
                        kd = 0;
                        c = c.wrapping_add(1);
                    }
                }
            }
        }
        true
    }
}

/// Whether the blocked kernels are selected (else the caller runs its
/// reference loops).
pub(crate) fn enabled() -> bool {
    kernels_now() != Kernels::Reference
}

fn kernels_now() -> Kernels {
    if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        cpu::kernels()
    } else {
        Kernels::Reference
    }
}

/// `C = alpha · A·B + beta · C` with `beta == 0` never reading C. The
/// caller has checked that A, B and C hold every element the shapes reach
/// (`m`, `n`, `k` > 0 or the call does nothing); this function checks again
/// and does nothing (returns `false`) if they do not. Split among the
/// workers of [`par`] when it is large enough.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm<B: SrcB + Sync>(
    m: usize,
    n: usize,
    k: usize,
    a: MatA<'_>,
    b: &B,
    c: &mut [f32],
    ldc: usize,
    alpha: f32,
    beta: f32,
) -> bool {
    let kind = Ukr::of(kernels_now());
    sgemm_with(kind, par::workers(), m, n, k, a, b, c, ldc, alpha, beta)
}

/// The driver. With `workers > 1` the output is cut into rectangles of
/// whole column panels (`NR`) and whole row tiles (`MR`), columns first (a
/// task then packs only its own panels of B); each rectangle is one task
/// that runs the same loops as the single-task run restricted to it — the
/// same k blocks, the same tiles, the same micro-kernel — so every element
/// of C gets the same operations in the same order, and the result is
/// bit-identical for any number of workers. k is never split.
#[allow(clippy::too_many_arguments)]
fn sgemm_with<B: SrcB + Sync>(
    kind: Ukr,
    workers: usize,
    m: usize,
    n: usize,
    k: usize,
    a: MatA<'_>,
    b: &B,
    c: &mut [f32],
    ldc: usize,
    alpha: f32,
    beta: f32,
) -> bool {
    let ep = Epilogue::default();
    sgemm_init(kind, workers, m, n, k, a, b, c, ldc, alpha, beta, ep)
}

/// What a GEMM does to C as it writes it ([`sgemm_out`]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Epilogue<'b> {
    /// Added along each row of C (`[i]` to row `i`, `m` values).
    pub bias: Option<&'b [f32]>,
    /// Each value of C clamped to `[lo, hi]` once its sum is complete, as
    /// Clip (and Relu, `(0, ∞)`) compute it: `v < lo` gives `lo`, then
    /// `v > hi` gives `hi`, NaN stays NaN.
    pub clamp: Option<(f32, f32)>,
}

/// `v` clamped to `(lo, hi)` ([`math::clip`]) if `C`, else `v`.
#[inline(always)]
fn clamp_if<const C: bool>(v: f32, (lo, hi): (f32, f32)) -> f32 {
    if C {
        math::clip(v, lo, hi)
    } else {
        v
    }
}

/// `C = A·B (+ bias) (clamped)` on this thread (`serial`) or split among
/// the workers, C written once: the bias goes in as the first k block's
/// tiles are written, the clamp as the last one's are (Conv's bias on a
/// 1.8 MB output, filled first and read back, and its Relu6 as a pass of
/// its own, were extra passes over memory). The sums are those of C
/// filled with the bias and `beta = 1` (`bias + A·B` per element, added
/// last), then clamped.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_out<B: SrcB + Sync>(
    serial: bool,
    m: usize,
    n: usize,
    k: usize,
    a: MatA<'_>,
    b: &B,
    c: &mut [f32],
    ldc: usize,
    ep: Epilogue<'_>,
) -> bool {
    let workers = if serial { 1 } else { par::workers() };
    let kind = Ukr::of(kernels_now());
    sgemm_init(kind, workers, m, n, k, a, b, c, ldc, 1.0, 0.0, ep)
}

/// [`sgemm_with`], with an [`Epilogue`] ([`sgemm_out`]; a bias replaces
/// `beta · C`).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn sgemm_init<B: SrcB + Sync>(
    kind: Ukr,
    workers: usize,
    m: usize,
    n: usize,
    k: usize,
    a: MatA<'_>,
    b: &B,
    c: &mut [f32],
    ldc: usize,
    alpha: f32,
    beta: f32,
    ep: Epilogue<'_>,
) -> bool {
    if m == 0 || n == 0 {
        return true;
    }
    let bias = ep.bias;
    if bias.is_some_and(|v| v.len() < m) {
        return false;
    }
    // Every index the kernels form is below these bounds (checked here once,
    // with checked arithmetic, so the micro-kernels may read without checks
    // and the offsets below wrap by name only).
    let (mul, add) = (usize::checked_mul, usize::checked_add);
    let last = m.wrapping_sub(1);
    let extent = |rows: usize, rs: usize, cols: usize, cs: usize| {
        add(add(mul(rows, rs)?, mul(cols, cs)?)?, 1)
    };
    let a_ok =
        k == 0 || extent(last, a.rs, k.wrapping_sub(1), a.cs).is_some_and(|e| a.a.len() >= e);
    let c_ok = mul(last, ldc)
        .and_then(|v| add(v, n))
        .is_some_and(|e| c.len() >= e);
    if !a_ok || !c_ok || ldc < n {
        return false;
    }
    let dense = b.dense();
    if let Some((bb, ldb)) = dense {
        let b_ok = mul(k.wrapping_sub(1), ldb)
            .and_then(|v| add(v, n))
            .is_some_and(|e| bb.len() >= e);
        if k > 0 && (!b_ok || ldb < n) {
            return false;
        }
    }
    if bias.is_none() && beta != 0.0 && beta != 1.0 {
        for i in 0..m {
            for v in win_mut(c, i.wrapping_mul(ldc), n).into_iter().flatten() {
                *v *= beta;
            }
        }
    }
    if k == 0 {
        for i in 0..m {
            let Some(row) = win_mut(c, i.wrapping_mul(ldc), n) else {
                continue;
            };
            match bias {
                // i < m <= bias.len() (checked).
                Some(bias) => row.fill(bias.get(i).copied().unwrap_or(0.0)),
                None if beta == 0.0 => row.fill(0.0),
                None => {}
            }
            if let Some(cl) = ep.clamp {
                row.iter_mut().for_each(|v| *v = clamp_if::<true>(*v, cl));
            }
        }
        return true;
    }
    let (panels, row_tiles) = (n.div_ceil(NR), m.div_ceil(MR));
    let macs = m.saturating_mul(n).saturating_mul(k);
    let t = par::tasks(workers, macs, panels.saturating_mul(row_tiles));
    let c = par::SharedMut::new(c);
    let dense = dense.filter(|&(_, ldb)| m < PACK_ROWS || !aliases(ldb, k));
    let blk = Block {
        kind,
        k,
        a,
        b,
        dense,
        c: &c,
        ldc,
        alpha,
        beta,
        bias,
        clamp: ep.clamp,
    };
    if t <= 1 {
        return blk.run_any((0, m), (0, n));
    }
    // t > 1 and panels >= 1 (n > 0): tc >= 1.
    let Some(tc) = NonZeroUsize::new(t.min(panels)) else {
        return false;
    };
    let tr = t.div_ceil(tc.get()).min(row_tiles);
    let failed = par::Failed::new();
    // Chunk bounds are at most panels (row_tiles): their multiples of NR
    // (MR) are below n + NR (m + MR).
    par::for_each(tc.get().saturating_mul(tr), &|task| {
        let (pl, ph) = par::chunk(panels, tc.get(), task % tc);
        let (rl, rh) = par::chunk(row_tiles, tr, task / tc);
        let cols = (pl.wrapping_mul(NR), ph.wrapping_mul(NR).min(n));
        let rows = (rl.wrapping_mul(MR), rh.wrapping_mul(MR).min(m));
        if !blk.run_any(rows, cols) {
            failed.set();
        }
    });
    !failed.get()
}

/// Rows of C from which an aliasing in-place B is packed ([`aliases`]).
const PACK_ROWS: usize = 8 * MR;

/// Whether the `min(k, KC)` rows of a 16-float panel of B read in place at
/// row stride `ldb` floats would not stay in L1 while every row tile reads
/// them again (then the panel is packed: one contiguous run). A stride of
/// `16 · 2^j` floats (`2^j` cache lines) puts the rows on only `64 / 2^j` of
/// the 64 sets of a 32 KiB 8-way L1, 8 lines each: `ldb` 256 or 1024 (the
/// transformer's weights) keep 32 or 8 rows of the 256, and a 112 × 112
/// pointwise Conv's 12,544 keeps 32. Half of those lines are left for A
/// and C.
///
/// Packing copies B once per GEMM; it pays only where many row tiles reuse
/// each panel ([`PACK_ROWS`]: MobileNetV2's 24-channel 56 × 56 projections,
/// 4 row tiles, ran 3 % slower packed, the transformer's 128-token
/// products, 22 row tiles, 13 % faster).
fn aliases(ldb: usize, k: usize) -> bool {
    let lines = ldb.trailing_zeros().saturating_sub(4).min(6);
    let sets = 64usize >> lines;
    // sets <= 64: the product is at most 256.
    KC.min(k) > sets.wrapping_mul(8) / 2
}

/// One GEMM, shared by the tasks of [`sgemm_with`] (bounds already checked).
struct Block<'s, 'a, B> {
    kind: Ukr,
    k: usize,
    a: MatA<'a>,
    b: &'s B,
    dense: Option<(&'s [f32], usize)>,
    c: &'s par::SharedMut<'s, f32>,
    ldc: usize,
    alpha: f32,
    beta: f32,
    /// Added to each row as the first k block writes it (`beta` unused).
    bias: Option<&'s [f32]>,
    /// Applied to each value as the last k block writes it.
    clamp: Option<(f32, f32)>,
}

/// Where [`Block::run`] found a panel of B (read by [`Block::wide`], on
/// x86_64 only).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum Src<'b> {
    /// Packed at prepare ([`SrcB::panel`]), row stride NR.
    Prepacked,
    /// B itself ([`SrcB::dense`]: B and its row stride `ldb`).
    Dense(&'b [f32], usize),
    /// Packed by this task into a stack panel, row stride NR.
    Packed,
}

/// One k block of [`Block::run`]: its first step `p0` and length `kc`,
/// whether it overwrites C (the first block with `beta == 0` or a bias),
/// and the clamp it applies (the last block's, else no-op bounds).
struct Step {
    p0: usize,
    kc: usize,
    overwrite: bool,
    cl: (f32, f32),
}

impl<'s, B: SrcB> Block<'s, '_, B> {
    /// C over rows `[i_lo, i_hi)` and columns `[j_lo, j_hi)`, where `i_lo`
    /// is a multiple of `MR` and `i_hi` one too or `m` (the same for the
    /// columns and `NR`): exactly the tiles the full loops would compute
    /// there. `false` if a part of C was out of bounds.
    fn run_any(&self, rows: (usize, usize), cols: (usize, usize)) -> bool {
        if self.clamp.is_some() {
            self.run::<true>(rows, cols)
        } else {
            self.run::<false>(rows, cols)
        }
    }

    /// [`Self::run_any`] with (`CLAMP`) or without a clamp: two copies, so
    /// that GEMMs without one keep a write-back with no compare in it
    /// (the transformer block ran 1–2 % slower with a no-op clamp).
    #[inline(never)]
    fn run<const CLAMP: bool>(
        &self,
        (i_lo, i_hi): (usize, usize),
        (j_lo, j_hi): (usize, usize),
    ) -> bool {
        let k = self.k;
        let mut panel = [0f32; KC * NR];
        // The second panel of a 12 × 32 AVX-512 tile, packed ([`Self::wide`]):
        // on the stack (and cleared) only where the AVX-512 kernel runs.
        #[cfg(target_arch = "x86_64")]
        let mut panel1;
        #[cfg(target_arch = "x86_64")]
        let spare: &mut [f32] = if self.kind == Ukr::Avx512 {
            panel1 = [0f32; KC * NR];
            &mut panel1
        } else {
            &mut []
        };
        let mut tile = [0f32; MR * NR];
        // Offsets wrap by name under the extents `sgemm_with` checked:
        // p0 < k, j0 < n, i0 + r < m.
        let mut p0 = 0usize;
        while p0 < k {
            let kc = KC.min(k.wrapping_sub(p0));
            let overwrite = p0 == 0 && (self.beta == 0.0 || self.bias.is_some());
            // p0 < k: no wrap; the last block completes every sum. Without
            // a clamp, (-∞, ∞) leaves every value (NaN too) as it is.
            let cl = match self.clamp {
                Some(cl) if k.wrapping_sub(p0) <= KC => cl,
                _ => (f32::NEG_INFINITY, f32::INFINITY),
            };
            let step = Step {
                p0,
                kc,
                overwrite,
                cl,
            };
            let mut j0 = j_lo;
            while j0 < j_hi {
                let nr = NR.min(j_hi.wrapping_sub(j0));
                let prepacked = self.b.panel(p0, j0);
                let (bp, b_rs, src): (&[f32], usize, Src) = match (prepacked, self.dense) {
                    (Some(bp), _) => (bp, NR, Src::Prepacked),
                    (None, Some((bb, ldb))) if nr == NR => {
                        match bb.get(p0.wrapping_mul(ldb).wrapping_add(j0)..) {
                            Some(bp) => (bp, ldb, Src::Dense(bb, ldb)),
                            None => return false,
                        }
                    }
                    _ => {
                        if !self.b.pack(p0, kc, j0, nr, &mut panel) {
                            return false;
                        }
                        (&panel[..], NR, Src::Packed)
                    }
                };
                // With AVX-512, 12 × 32 tiles over this panel and the next
                // ([`Self::wide`]); the rows after them panel by panel.
                #[cfg(target_arch = "x86_64")]
                let Some((i_from, next)) =
                    self.wide::<CLAMP>((i_lo, i_hi), (j0, j_hi), (bp, b_rs, src), &step, spare)
                else {
                    return false;
                };
                #[cfg(not(target_arch = "x86_64"))]
                let (i_from, next) = {
                    let _ = src;
                    (i_lo, None)
                };
                let panels = core::iter::once((j0, bp, b_rs)).chain(next);
                for (j, bp, b_rs) in panels {
                    if !self.tiles::<CLAMP>((i_from, i_hi), (j, nr), (bp, b_rs), &step, &mut tile) {
                        return false;
                    }
                }
                j0 = j0.wrapping_add(if next.is_some() { 2 * NR } else { NR });
            }
            p0 = p0.wrapping_add(KC);
        }
        true
    }

    /// Rows `[i_lo, i_hi)` of the `nr` columns of C at `j0` over one k
    /// block (`step`), from the panel `bp` (row stride `b_rs`): tiles of MR
    /// rows, full ones with AVX2 written from the registers
    /// ([`ukr_avx2_out`]), the others through `tile`. `false` if a part of
    /// A or C was out of bounds.
    #[inline(always)]
    fn tiles<const CLAMP: bool>(
        &self,
        (i_lo, i_hi): (usize, usize),
        (j0, nr): (usize, usize),
        (bp, b_rs): (&[f32], usize),
        step: &Step,
        tile: &mut [f32; MR * NR],
    ) -> bool {
        let (a, ldc, alpha) = (self.a, self.ldc, self.alpha);
        let &Step {
            p0,
            kc,
            overwrite,
            cl,
        } = step;
        let mut i0 = i_lo;
        while i0 < i_hi {
            let mr = MR.min(i_hi.wrapping_sub(i0));
            let at = i0.wrapping_mul(a.rs).wrapping_add(p0.wrapping_mul(a.cs));
            let Some(ap) = a.a.get(at..) else {
                return false;
            };
            #[cfg(target_arch = "x86_64")]
            if nr == NR && matches!(self.kind, Ukr::Avx2 | Ukr::Avx512) && matches!(mr, MR | 4 | 2)
            {
                let cl = CLAMP.then_some(cl);
                // SAFETY: `Ukr::Avx2` and `Ukr::Avx512` come from
                // `Kernels::Avx2Fma`, selected only when the CPU has AVX2 and
                // FMA; the driver checked A's mr rows of kc columns and B's
                // kc rows of NR; `out` holds mr rows of NR floats of C that
                // are this task's.
                let done = unsafe {
                    match mr {
                        MR => self
                            .tile_out::<MR, NR>((i0, j0), overwrite, cl)
                            .map(|out| ukr_avx2_out(kc, ap, a.rs, a.cs, bp, b_rs, &out)),
                        4 => self
                            .tile_out::<4, NR>((i0, j0), overwrite, cl)
                            .map(|out| ukr_avx2_out(kc, ap, a.rs, a.cs, bp, b_rs, &out)),
                        _ => self
                            .tile_out::<2, NR>((i0, j0), overwrite, cl)
                            .map(|out| ukr_avx2_out(kc, ap, a.rs, a.cs, bp, b_rs, &out)),
                    }
                };
                if done.is_none() {
                    return false;
                }
                i0 = i0.wrapping_add(mr);
                continue;
            }
            ukr(self.kind, mr, kc, ap, a.rs, a.cs, bp, b_rs, tile);
            for (r, trow) in tile.chunks_exact(NR).take(mr).enumerate() {
                let at = i0.wrapping_add(r).wrapping_mul(ldc).wrapping_add(j0);
                // SAFETY: row i0 + r and columns j0..j0 + nr belong to this
                // task's rectangle; rectangles of the tasks are disjoint and
                // ldc >= n (checked), so no other live slice overlaps this
                // one.
                let Some(crow) = (unsafe { self.c.slice(at, nr) }) else {
                    return false;
                };
                // Clamped in the same loop (a loop of its own per row ran
                // slower than Relu6 as a separate pass).
                if let (true, Some(bias)) = (overwrite, self.bias) {
                    // i0 + r < m <= bias.len() (checked).
                    let bv = bias.get(i0.wrapping_add(r)).copied().unwrap_or(0.0);
                    for (cv, &t) in crow.iter_mut().zip(trow) {
                        *cv = clamp_if::<CLAMP>(bv + alpha * t, cl);
                    }
                } else if overwrite {
                    for (cv, &t) in crow.iter_mut().zip(trow) {
                        *cv = clamp_if::<CLAMP>(alpha * t, cl);
                    }
                } else {
                    for (cv, &t) in crow.iter_mut().zip(trow) {
                        *cv = clamp_if::<CLAMP>(*cv + alpha * t, cl);
                    }
                }
            }
            i0 = i0.wrapping_add(MR);
        }
        true
    }

    /// With AVX-512 and a second whole panel after the one at `j0` before
    /// `j_hi`: [`Self::pairs`] over rows `[i_lo, i_hi)` of both, and the
    /// first row it left with the second panel (its column, its data, its
    /// row stride) for the AVX2 tiles; otherwise `(i_lo, None)`. The first
    /// panel is `bp` at row stride `b_rs`, from `src`; the second comes
    /// from the same source: [`SrcB::panel`], B read in place, or packed
    /// into `spare` (KC × NR floats where the kernel is AVX-512). `None` if
    /// a part of A, B or C was out of bounds.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(clippy::type_complexity)]
    fn wide<'p, const CLAMP: bool>(
        &self,
        (i_lo, i_hi): (usize, usize),
        (j0, j_hi): (usize, usize),
        (bp, b_rs, src): (&[f32], usize, Src<'s>),
        step: &Step,
        spare: &'p mut [f32],
    ) -> Option<(usize, Option<(usize, &'p [f32], usize)>)>
    where
        's: 'p,
    {
        let b: &'s B = self.b;
        let j1 = j0.wrapping_add(NR);
        if self.kind != Ukr::Avx512 || j_hi.wrapping_sub(j0) < 2 * NR {
            return Some((i_lo, None));
        }
        let bp1: &'p [f32] = match src {
            Src::Prepacked => match b.panel(step.p0, j1) {
                Some(bp1) => bp1,
                None => return Some((i_lo, None)),
            },
            Src::Dense(bb, ldb) => bb.get(step.p0.wrapping_mul(ldb).wrapping_add(j1)..)?,
            Src::Packed => {
                if !b.pack(step.p0, step.kc, j1, NR, spare) {
                    return None;
                }
                spare
            }
        };
        let i_from = self.pairs::<CLAMP>((i_lo, i_hi), j0, ((bp, bp1), b_rs), step)?;
        Some((i_from, Some((j1, bp1, b_rs))))
    }

    /// [`ukr_avx512`] tiles (MR2 rows by the two panels `bp` of the 2NR
    /// columns at `j0`, at row stride `b_rs`) from row `i_lo` while MR2
    /// rows are left below `i_hi`; the first row not done, or `None` if a
    /// part of A or C was out of bounds.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn pairs<const CLAMP: bool>(
        &self,
        (i_lo, i_hi): (usize, usize),
        j0: usize,
        (bp, b_rs): ((&[f32], &[f32]), usize),
        step: &Step,
    ) -> Option<usize> {
        let a = self.a;
        let clamp = CLAMP.then_some(step.cl);
        let mut i0 = i_lo;
        while i_hi.wrapping_sub(i0) >= MR2 {
            let at = i0
                .wrapping_mul(a.rs)
                .wrapping_add(step.p0.wrapping_mul(a.cs));
            let ap = a.a.get(at..)?;
            let out = self.tile_out::<MR2, { 2 * NR }>((i0, j0), step.overwrite, clamp)?;
            // SAFETY: `Ukr::Avx512` comes from `cpu::avx512_vnni` (the CPU
            // has AVX-512 F: `cpu::enable_avx512_vnni`'s contract) with
            // `Kernels::Avx2Fma` (AVX2 and FMA); the driver checked A's rows
            // (i0 + MR2 <= i_hi) of kc columns and B's kc rows of NR at
            // stride b_rs in each panel (`run`; for the second, `wide`);
            // `out` holds MR2 rows of 2NR floats of C that are this task's.
            unsafe { ukr_avx512(step.kc, ap, a.rs, a.cs, bp, b_rs, &out) };
            i0 = i0.wrapping_add(MR2);
        }
        Some(i0)
    }

    /// Where a register tile of `R` rows and `W` columns at (`i0`, `j0`)
    /// goes ([`TileOut`]): the rows' W floats of C, the bias of those rows when
    /// this is the first k block (`overwrite`) and there is one, alpha and
    /// the clamp. `None` if C or the bias is short.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn tile_out<const R: usize, const W: usize>(
        &self,
        (i0, j0): (usize, usize),
        overwrite: bool,
        clamp: Option<(f32, f32)>,
    ) -> Option<TileOut<'s, R, W>> {
        let bias = match (overwrite, self.bias) {
            // i0 + R <= m <= bias.len() (checked).
            (true, Some(b)) => Some(win(b, i0, R)?),
            _ => None,
        };
        // The tile's last element is below C's length: every row pointer
        // formed from `c` below stays inside C.
        let end = (i0.checked_add(R)?.checked_sub(1)?.checked_mul(self.ldc))
            .and_then(|v| v.checked_add(j0)?.checked_add(W))?;
        if end > self.c.len() {
            return None;
        }
        let at = i0.wrapping_mul(self.ldc).wrapping_add(j0);
        Some(TileOut {
            c: self.c.as_mut_ptr().wrapping_add(at),
            ldc: self.ldc,
            alpha: self.alpha,
            bias,
            overwrite,
            clamp,
        })
    }
}

/// Columns of C per unit of a [`dots`] split (a task never shares a cache
/// line of C with another).
const DOT_COLS: usize = 16;

/// `C = alpha · A·Bᵀ + beta · C` as `m × n` dot products, for B stored
/// transposed (`b[j * ldb + p]`) and A with contiguous rows: a Linear layer
/// at batch 1, where packing B would cost more than the product. `false`
/// (nothing written) when a slice is short. Split over the columns among
/// the workers of [`par`]: each element is still one dot product.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dots(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    alpha: f32,
    beta: f32,
) -> bool {
    dots_with(par::workers(), m, n, k, a, lda, b, ldb, c, ldc, alpha, beta)
}

#[allow(clippy::too_many_arguments)]
fn dots_with(
    workers: usize,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    alpha: f32,
    beta: f32,
) -> bool {
    if m == 0 || n == 0 {
        return true;
    }
    // Extents checked once; the offsets below (i < m, j < n) wrap by name.
    let fits = |len: usize, rows: usize, ld: usize, cols: usize| {
        rows.wrapping_sub(1)
            .checked_mul(ld)
            .and_then(|v| v.checked_add(cols))
            .is_some_and(|e| len >= e)
    };
    if (k > 0 && !(fits(a.len(), m, lda, k) && fits(b.len(), n, ldb, k)))
        || !fits(c.len(), m, ldc, n)
    {
        return false;
    }
    let kind = kernels_now();
    let units = n.div_ceil(DOT_COLS);
    // Rows of C that overlap (ldc < n) stay on one task, in order.
    let t = if m > 1 && ldc < n {
        1
    } else {
        par::tasks(workers, m.saturating_mul(n).saturating_mul(k), units)
    };
    let c = par::SharedMut::new(c);
    let failed = par::Failed::new();
    let task = |ti: usize| {
        let (ul, uh) = par::chunk(units, t, ti);
        // uh <= units: uh · DOT_COLS < n + DOT_COLS.
        let (j_lo, j_hi) = (ul.wrapping_mul(DOT_COLS), uh.wrapping_mul(DOT_COLS).min(n));
        for i in 0..m {
            let Some(arow) = win(a, i.wrapping_mul(lda), k) else {
                failed.set();
                return;
            };
            let at = i.wrapping_mul(ldc).wrapping_add(j_lo);
            // SAFETY: with one task only one slice is alive at a time; with
            // several, ldc >= n, so row i's columns j_lo..j_hi of this task
            // overlap no other task's.
            let Some(crow) = (unsafe { c.slice(at, j_hi.saturating_sub(j_lo)) }) else {
                failed.set();
                return;
            };
            for (j, cv) in (j_lo..j_hi).zip(crow) {
                let Some(brow) = win(b, j.wrapping_mul(ldb), k) else {
                    failed.set();
                    return;
                };
                #[cfg(target_arch = "x86_64")]
                let d = if kind == Kernels::Avx2Fma {
                    // SAFETY: as in `ukr`, AVX2 + FMA are present when selected.
                    unsafe { dot_avx2(arow, brow) }
                } else {
                    dot_portable(arow, brow)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let d = {
                    let _ = kind;
                    dot_portable(arow, brow)
                };
                *cv = if beta == 0.0 {
                    alpha * d
                } else {
                    alpha * d + beta * *cv
                };
            }
        }
    };
    if t <= 1 {
        task(0);
    } else {
        par::for_each(t, &task);
    }
    !failed.get()
}

/// Dot product over 8 lanes (vectorized by LLVM), then the lanes summed.
fn dot_portable(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xc
        .remainder()
        .iter()
        .zip(yc.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in xc.zip(yc) {
        for ((s, &x), &y) in acc.iter_mut().zip(a).zip(b) {
            *s += x * y;
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(x: &[f32], y: &[f32]) -> f32 {
    use core::arch::x86_64::*;
    let n = x.len().min(y.len());
    let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut p = 0usize;
    // SAFETY: every load reads 8 floats at p (+ 8) with p + 16 <= n (or
    // p + 8 <= n) inside both slices (p <= n: the sums do not wrap).
    unsafe {
        while p.wrapping_add(16) <= n {
            s0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(x.as_ptr().add(p)),
                _mm256_loadu_ps(y.as_ptr().add(p)),
                s0,
            );
            s1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(x.as_ptr().add(p.wrapping_add(8))),
                _mm256_loadu_ps(y.as_ptr().add(p.wrapping_add(8))),
                s1,
            );
            p = p.wrapping_add(16);
        }
        if p.wrapping_add(8) <= n {
            s0 = _mm256_fmadd_ps(
                _mm256_loadu_ps(x.as_ptr().add(p)),
                _mm256_loadu_ps(y.as_ptr().add(p)),
                s0,
            );
            p = p.wrapping_add(8);
        }
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(s0, s1)) };
    // p <= n <= both lengths: the fallback is never taken.
    let (xt, yt) = (x.get(p..n).unwrap_or(&[]), y.get(p..n).unwrap_or(&[]));
    let tail: f32 = xt.iter().zip(yt).map(|(a, b)| a * b).sum();
    lanes.iter().sum::<f32>() + tail
}

/// One `mr × NR` tile over `kc` steps into `tile` (row-major, NR wide).
/// `a` starts at A(i0, p0), `b` at B(p0, j0) with row stride `b_rs`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn ukr(
    kind: Ukr,
    mr: usize,
    kc: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    tile: &mut [f32; MR * NR],
) {
    // The driver checked the bounds: rows < mr at stride a_rs, kc columns at
    // stride a_cs inside `a`; kc rows of NR at stride b_rs inside `b`.
    debug_assert!(
        kc == 0
            || (mr.wrapping_sub(1).checked_mul(a_rs))
                .zip(kc.wrapping_sub(1).checked_mul(a_cs))
                .and_then(|(r, c)| r.checked_add(c))
                .is_some_and(|last| a.len() > last)
    );
    debug_assert!(
        kc == 0
            || (kc.wrapping_sub(1).checked_mul(b_rs))
                .and_then(|v| v.checked_add(NR))
                .is_some_and(|e| b.len() >= e)
    );
    macro_rules! dispatch {
        ($f:ident) => {
            match mr {
                1 => $f::<1>(kc, a, a_rs, a_cs, b, b_rs, tile),
                2 => $f::<2>(kc, a, a_rs, a_cs, b, b_rs, tile),
                3 => $f::<3>(kc, a, a_rs, a_cs, b, b_rs, tile),
                4 => $f::<4>(kc, a, a_rs, a_cs, b, b_rs, tile),
                5 => $f::<5>(kc, a, a_rs, a_cs, b, b_rs, tile),
                _ => $f::<6>(kc, a, a_rs, a_cs, b, b_rs, tile),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(kind, Ukr::Avx2 | Ukr::Avx512) {
        // SAFETY: both come from `Kernels::Avx2Fma`, selected only by
        // `cpu::enable_avx2_fma`, whose caller guarantees the CPU has AVX2
        // and FMA, or by a build that targets them; the bounds were checked
        // by the driver.
        unsafe { dispatch!(ukr_avx2) };
        return;
    }
    #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
    if kind == Ukr::Neon {
        // SAFETY: this build targets NEON (cfg above; baseline on aarch64
        // Linux), and the driver checked the bounds `ukr_neon` reads.
        unsafe { dispatch!(ukr_neon) };
        return;
    }
    let _ = kind;
    dispatch!(ukr_portable);
}

#[inline(always)]
fn ukr_portable<const R: usize>(
    kc: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    tile: &mut [f32; MR * NR],
) {
    let mut acc = [[0f32; NR]; R];
    // Offsets under the extents the driver checked (p < kc, r < R <= mr).
    for p in 0..kc {
        let Some(brow) = win(b, p.wrapping_mul(b_rs), NR) else {
            return;
        };
        for (r, accr) in acc.iter_mut().enumerate() {
            let at = r.wrapping_mul(a_rs).wrapping_add(p.wrapping_mul(a_cs));
            let av = a.get(at).copied().unwrap_or(0.0);
            for (x, &bv) in accr.iter_mut().zip(brow) {
                *x += av * bv;
            }
        }
    }
    for (dst, src) in tile.chunks_exact_mut(NR).zip(&acc) {
        dst.copy_from_slice(src);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn ukr_avx2<const R: usize>(
    kc: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    tile: &mut [f32; MR * NR],
) {
    use core::arch::x86_64::*;
    // SAFETY: the caller's contract is `sums_avx2`'s.
    let acc = unsafe { sums_avx2::<R>(kc, a, a_rs, a_cs, b, b_rs) };
    for (r, accr) in acc.iter().enumerate() {
        // SAFETY: r < R <= MR, so both stores fall inside the MR × NR tile.
        unsafe {
            let t = tile.as_mut_ptr().add(r.wrapping_mul(NR));
            _mm256_storeu_ps(t, accr[0]);
            _mm256_storeu_ps(t.add(8), accr[1]);
        }
    }
}

/// The `R × NR` sums of `kc` steps of A·B in ymm registers (two per row),
/// for [`ukr_avx2`] and [`ukr_avx2_out`].
///
/// # Safety
/// The CPU has AVX2 and FMA; `a` holds A(r, p) at `r * a_rs + p * a_cs`
/// for `r < R`, `p < kc`, and `b` holds `kc` rows of NR floats at stride
/// `b_rs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn sums_avx2<const R: usize>(
    kc: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
) -> [[core::arch::x86_64::__m256; 2]; R] {
    use core::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    for p in 0..kc {
        // SAFETY: p < kc, and the caller guarantees that B holds kc rows of
        // NR floats at stride b_rs and A holds R rows (stride a_rs) of kc
        // columns (stride a_cs).
        unsafe {
            let brow = bp.add(p.wrapping_mul(b_rs));
            let b0 = _mm256_loadu_ps(brow);
            let b1 = _mm256_loadu_ps(brow.add(8));
            let acol = ap.add(p.wrapping_mul(a_cs));
            for (r, accr) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*acol.add(r.wrapping_mul(a_rs)));
                accr[0] = _mm256_fmadd_ps(av, b0, accr[0]);
                accr[1] = _mm256_fmadd_ps(av, b1, accr[1]);
            }
        }
    }
    acc
}

/// Where [`ukr_avx2_out`] (MR × NR) and [`ukr_avx512`] (MR2 × 2NR) write
/// a full R × W tile of C, and the write-back of [`Block::tiles`]' loop:
/// C = bias + alpha · sum (the first k block, with a bias), alpha · sum
/// (the first, without), or C + alpha · sum, each clamped when `clamp` is
/// set.
#[cfg(target_arch = "x86_64")]
struct TileOut<'a, const R: usize, const W: usize> {
    /// C(i0, j0); row r of the tile is the W floats `r · ldc` further
    /// ([`Block::tile_out`] checked that the last row's are inside C).
    c: *mut f32,
    ldc: usize,
    alpha: f32,
    /// The R rows' bias (first k block only).
    bias: Option<&'a [f32]>,
    overwrite: bool,
    clamp: Option<(f32, f32)>,
}

/// The AVX2 intrinsics of a [`write_back!`] on 8 lanes.
#[cfg(target_arch = "x86_64")]
mod lanes8 {
    pub(super) use core::arch::x86_64::{
        _mm256_add_ps as add, _mm256_loadu_ps as load, _mm256_max_ps as max, _mm256_min_ps as min,
        _mm256_mul_ps as mul, _mm256_set1_ps as splat, _mm256_storeu_ps as store,
    };
    /// Floats per vector.
    pub(super) const N: usize = 8;
}

/// The AVX-512 intrinsics of a [`write_back!`] on 16 lanes.
#[cfg(target_arch = "x86_64")]
mod lanes16 {
    pub(super) use core::arch::x86_64::{
        _mm512_add_ps as add, _mm512_loadu_ps as load, _mm512_max_ps as max, _mm512_min_ps as min,
        _mm512_mul_ps as mul, _mm512_set1_ps as splat, _mm512_storeu_ps as store,
    };
    /// Floats per vector.
    pub(super) const N: usize = 16;
}

/// Writes the register tile `acc` (R rows of vectors of `$lanes`' width)
/// into C through `out` ([`TileOut`]): per vector, multiply by alpha, add
/// C's old value (or the row's bias on the first k block), clamp with
/// `math::clip`'s max then min, store: the scalar loop of
/// [`Block::tiles`] on every lane, so the same bits. One copy for both
/// vector widths; it runs inside the caller's `#[target_feature]`
/// function, whose contract makes every vector of the tile C's.
#[cfg(target_arch = "x86_64")]
macro_rules! write_back {
    ($lanes:ident, $acc:expr, $out:expr) => {{
        use $lanes as l;
        let out = $out;
        let alpha = l::splat(out.alpha);
        let clamp = out.clamp.map(|(lo, hi)| (l::splat(lo), l::splat(hi)));
        for (r, accr) in $acc.iter().enumerate() {
            // r < R: row r of the tile, inside C (the caller's contract).
            let row = out.c.wrapping_add(r.wrapping_mul(out.ldc));
            let bias = out.bias.and_then(|b| b.get(r)).map(|&bv| l::splat(bv));
            for (h, &t) in accr.iter().enumerate() {
                // The h-th vector of the row's floats.
                let at = row.wrapping_add(h.wrapping_mul(l::N));
                let mut v = l::mul(alpha, t);
                if !out.overwrite {
                    // SAFETY: `at` holds one vector of this tile (above);
                    // C's old value is read once, here.
                    v = l::add(unsafe { l::load(at) }, v);
                } else if let Some(bv) = bias {
                    v = l::add(bv, v);
                }
                if let Some((lo, hi)) = clamp {
                    // math::clip: max_ps(lo, v) is lo where lo > v, else v
                    // (NaN too); min_ps(hi, ·) likewise.
                    v = l::min(hi, l::max(lo, v));
                }
                // SAFETY: as above.
                unsafe { l::store(at, v) };
            }
        }
    }};
}

/// [`ukr_avx2`] for a full-width tile of `R` rows (MR, or the 4 and 2 rows
/// left by power-of-two row counts), written into C as [`Block::tiles`]'
/// write-back would, without the round trip through the tile buffer.
///
/// # Safety
/// The CPU has AVX2 and FMA; `a` holds A(r, p) at `r * a_rs + p * a_cs`
/// for `r < R`, `p < kc`; `b` holds `kc` rows of NR floats at stride
/// `b_rs`; `out` points to R rows of NR floats of C (at stride
/// `out.ldc`) that nothing else reads or writes during the call, and
/// `out.bias`, if any, holds R values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn ukr_avx2_out<const R: usize>(
    kc: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    out: &TileOut<'_, R, NR>,
) {
    // SAFETY: the caller guarantees `sums_avx2`'s contract for R rows.
    let acc = unsafe { sums_avx2::<R>(kc, a, a_rs, a_cs, b, b_rs) };
    write_back!(lanes8, acc, out);
}

/// The AVX-512 micro-kernel: a full MR2 × 2NR tile (12 × 32) over `kc`
/// steps of two panels of B (the first NR columns and the next NR), written
/// into C. Each element gets the same chain of `fma` over p
/// as in [`sums_avx2`] and the same write-back as in [`ukr_avx2_out`]
/// ([`write_back!`] on 16 lanes instead of 8), so the same bits as four
/// 6 × 16 tiles of the AVX2 kernel.
///
/// # Safety
/// The CPU has AVX-512 F; `a` holds A(r, p) at `r * a_rs + p * a_cs` for
/// `r < MR2`, `p < kc`; `b.0` and `b.1` hold `kc` rows of NR floats each
/// at row stride `b_rs`; `out` points to MR2 rows of 2NR floats of C (at stride
/// `out.ldc`) that nothing else reads or writes during the call, and
/// `out.bias`, if any, holds MR2 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn ukr_avx512(
    kc: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: (&[f32], &[f32]),
    b_rs: usize,
    out: &TileOut<'_, MR2, { 2 * NR }>,
) {
    // SAFETY: the caller's contract is `sums_avx512`'s.
    let acc = unsafe { sums_avx512(kc, a, a_rs, a_cs, b, b_rs) };
    write_back!(lanes16, acc, out);
}

/// The MR2 × 2NR sums of [`ukr_avx512`] in 24 zmm accumulators (two per
/// row; with the two rows of B and the broadcast, 27 of the 32 registers).
/// Kept out of line: inlined into its write-back, LLVM spilled the
/// accumulators to the stack inside the k loop (the MobileNetV2 GEMMs'
/// k loop took twice as long).
///
/// # Safety
/// The CPU has AVX-512 F; `a` and `b` as for [`ukr_avx512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline(never)]
unsafe fn sums_avx512(
    kc: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    (b0, b1): (&[f32], &[f32]),
    b_rs: usize,
) -> [[core::arch::x86_64::__m512; 2]; MR2] {
    use core::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR2];
    let (ap, bp0, bp1) = (a.as_ptr(), b0.as_ptr(), b1.as_ptr());
    for p in 0..kc {
        // SAFETY: p < kc, and the caller guarantees that each panel holds
        // kc rows of NR floats at stride b_rs and A holds MR2 rows (stride
        // a_rs) of kc columns (stride a_cs).
        unsafe {
            let at = p.wrapping_mul(b_rs);
            let v0 = _mm512_loadu_ps(bp0.add(at));
            let v1 = _mm512_loadu_ps(bp1.add(at));
            let acol = ap.add(p.wrapping_mul(a_cs));
            for (r, x) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*acol.add(r.wrapping_mul(a_rs)));
                x[0] = _mm512_fmadd_ps(av, v0, x[0]);
                x[1] = _mm512_fmadd_ps(av, v1, x[1]);
            }
        }
    }
    acc
}

/// The NEON micro-kernel: the contract of `ukr_avx2` (A read through its row
/// and column strides, B rows of NR floats at stride `b_rs`, the `R × NR`
/// product of `kc` steps written to the first R rows of `tile`). R rows of 4
/// q-register accumulators (24 of the 32 for R = 6), 4 for the row of B, and
/// each A(r, p) multiplied in by lane (`fmla v.4s, v.4s, v.s[0]`).
///
/// # Safety
/// `a` holds A(r, p) at `r * a_rs + p * a_cs` for `r < R`, `p < kc`, and `b`
/// holds `kc` rows of NR floats at stride `b_rs` (the driver checks both).
#[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
#[target_feature(enable = "neon")]
#[inline]
unsafe fn ukr_neon<const R: usize>(
    kc: usize,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    tile: &mut [f32; MR * NR],
) {
    use core::arch::aarch64::*;
    let mut acc = [[vdupq_n_f32(0.0); 4]; R];
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    for p in 0..kc {
        // SAFETY: p < kc and the caller guarantees that B holds kc rows of
        // NR floats at stride b_rs and A holds R rows (stride a_rs) of kc
        // columns (stride a_cs).
        unsafe {
            let brow = bp.add(p.wrapping_mul(b_rs));
            let bv = [
                vld1q_f32(brow),
                vld1q_f32(brow.add(4)),
                vld1q_f32(brow.add(8)),
                vld1q_f32(brow.add(12)),
            ];
            let acol = ap.add(p.wrapping_mul(a_cs));
            for (r, accr) in acc.iter_mut().enumerate() {
                let av = *acol.add(r.wrapping_mul(a_rs));
                for (x, &v) in accr.iter_mut().zip(&bv) {
                    *x = vfmaq_n_f32(*x, v, av);
                }
            }
        }
    }
    for (r, accr) in acc.iter().enumerate() {
        // SAFETY: r < R <= MR, so the 4 stores of 4 floats fall inside row r
        // of the MR × NR tile.
        unsafe {
            let t = tile.as_mut_ptr().add(r.wrapping_mul(NR));
            vst1q_f32(t, accr[0]);
            vst1q_f32(t.add(4), accr[1]);
            vst1q_f32(t.add(8), accr[2]);
            vst1q_f32(t.add(12), accr[3]);
        }
    }
}

#[cfg(all(test, feature = "alloc"))]
mod tests {
    use super::*;
    use alloc::vec;
    use alloc::vec::Vec;

    fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    #[allow(unused_mut)] // only pushed to on x86_64 and aarch64
    fn kinds() -> Vec<Ukr> {
        let mut v = vec![Ukr::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            extern crate std;
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                v.push(Ukr::Avx2);
                if std::is_x86_feature_detected!("avx512f") {
                    v.push(Ukr::Avx512);
                }
            }
        }
        // NEON is baseline on aarch64: no detection.
        #[cfg(all(target_arch = "aarch64", target_feature = "neon"))]
        v.push(Ukr::Neon);
        v
    }

    fn close(got: &[f32], want: &[f32], what: &str) {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 + 1e-4 * w.abs(),
                "{what}: element {i}: {g} vs {w}"
            );
        }
    }

    /// B in place with a row stride that aliases in L1 and enough rows of C
    /// to pack it (`aliases`, `PACK_ROWS`): the packed panels give the
    /// reference's product, with `ldb` above `n` too.
    #[test]
    fn aliasing_dense_b_is_packed_and_matches_reference() {
        assert!(aliases(256, 256) && aliases(1024, 1024) && aliases(12_544, 32));
        assert!(!aliases(3136, 24) && !aliases(784, 256) && !aliases(12_544, 16));
        let mut seed = 11;
        for kind in kinds() {
            for &(m, n, k, ldb) in &[(PACK_ROWS, 64, 300, 64), (PACK_ROWS + 5, 40, 257, 128)] {
                assert!(aliases(ldb, k));
                let a = rand(m * k, &mut seed);
                let b = rand(k * ldb, &mut seed);
                let mut want = alloc::vec![0f32; m * n];
                crate::ops::matmul::reference_gemm(
                    m, n, k, &a, k, false, &b, ldb, false, &mut want, n, 1.0, 0.0,
                );
                let mut got = alloc::vec![f32::NAN; m * n];
                let ma = MatA {
                    a: &a,
                    rs: k,
                    cs: 1,
                };
                let src = Dense { b: &b, ldb };
                assert!(sgemm_with(
                    kind, 1, m, n, k, ma, &src, &mut got, n, 1.0, 0.0
                ));
                close(
                    &got,
                    &want,
                    &alloc::format!("{kind:?} m{m} n{n} k{k} ldb{ldb}"),
                );
            }
        }
    }

    /// `got` and `want` hold the same bits.
    fn same_bits(got: &[f32], want: &[f32], what: &str) {
        let bits = |v: &[f32]| {
            v.iter()
                .map(|f| f.to_bits())
                .collect::<alloc::vec::Vec<_>>()
        };
        assert_eq!(bits(got), bits(want), "{what}");
    }

    /// Full tiles (written from the registers: MR × NR by [`ukr_avx2_out`]
    /// with AVX2, MR2 × 2NR by [`ukr_avx512`] with AVX-512 and B packed at
    /// prepare) give the bits of the same rows one row fewer (a partial
    /// tile written through the tile buffer by `Block::tiles`; with MR2
    /// rows, one MR tile from the registers and a partial one), with B in
    /// place and packed: alpha, bias, beta and clamp in the same order, a
    /// NaN kept by the clamp, within and across k blocks, on every kernel
    /// kind.
    #[test]
    fn full_tiles_give_the_bits_of_the_tile_buffer_write_back() {
        let mut seed = 5;
        for kind in kinds() {
            for (k, m) in [
                (1, MR),
                (7, MR),
                (KC + 5, MR),
                (1, 2 * MR),
                (9, 2 * MR),
                (KC + 5, 2 * MR),
                // 4- and 2-row tiles from the registers against 3 and 1
                // rows through the buffer, alone and after a 6-row tile.
                (7, 4),
                (KC + 5, 4),
                (7, 2),
                (9, MR + 4),
                (9, MR + 2),
            ] {
                let n = 2 * NR;
                let mut a = rand(m * k, &mut seed);
                a[3] = f32::NAN;
                let (b, bias, c0) = (
                    rand(k * n, &mut seed),
                    rand(m, &mut seed),
                    rand(m * n, &mut seed),
                );
                let ma = |rows: usize| MatA {
                    a: &a[..rows * k],
                    rs: k,
                    cs: 1,
                };
                let dense = Dense { b: &b, ldb: n };
                let packed = Packed::new(&dense, k, n).unwrap();
                for (alpha, beta, with_bias, clamp) in [
                    (1.0, 0.0, false, None),
                    (0.7, 0.0, true, Some((-0.05, 0.1))),
                    (1.3, 1.0, false, Some((-0.05, 0.1))),
                    (0.9, 1.0, false, None),
                ] {
                    let ep = |rows: usize| Epilogue {
                        bias: with_bias.then_some(&bias[..rows]),
                        clamp,
                    };
                    let what =
                        alloc::format!("{kind:?} m{m} k{k} {alpha} {beta} {with_bias} {clamp:?}");
                    let mut want = c0[..(m - 1) * n].to_vec();
                    let rows = m - 1;
                    assert!(sgemm_init(
                        kind,
                        1,
                        rows,
                        n,
                        k,
                        ma(rows),
                        &dense,
                        &mut want,
                        n,
                        alpha,
                        beta,
                        ep(rows)
                    ));
                    let mut full = c0.clone();
                    assert!(sgemm_init(
                        kind,
                        1,
                        m,
                        n,
                        k,
                        ma(m),
                        &dense,
                        &mut full,
                        n,
                        alpha,
                        beta,
                        ep(m)
                    ));
                    same_bits(&full[..rows * n], &want, &alloc::format!("{what} in place"));
                    let mut full = c0.clone();
                    assert!(sgemm_init(
                        kind,
                        1,
                        m,
                        n,
                        k,
                        ma(m),
                        &packed,
                        &mut full,
                        n,
                        alpha,
                        beta,
                        ep(m)
                    ));
                    same_bits(&full[..rows * n], &want, &alloc::format!("{what} packed"));
                }
            }
        }
    }

    /// An [`Epilogue`]: a row bias added as C is first written, a clamp as
    /// it is last written, each, both or neither, give the bits of C filled
    /// with the bias (or zeros) and `beta = 1`, then clamped value by value,
    /// on every kernel kind, with 1 and 3 workers, across k blocks (the
    /// clamp must wait for the last) and for k = 0; a bias shorter than m
    /// is refused.
    #[test]
    fn epilogue_gives_the_bits_of_a_filled_c_then_clamped() {
        let mut seed = 17;
        let clamps = [None, Some((0.0, f32::INFINITY)), Some((-0.1f32, 0.2f32))];
        for kind in kinds() {
            for &(m, n, k) in &[
                (1, 5, 3),
                (7, 17, 0),
                (13, 40, KC + 9),
                (PACK_ROWS + 2, 16, 24),
            ] {
                let a = rand(m * k, &mut seed);
                let b = rand(k * n, &mut seed);
                let bias = rand(m, &mut seed);
                let ma = MatA {
                    a: &a,
                    rs: k,
                    cs: 1,
                };
                let src = Dense { b: &b, ldb: n };
                for (workers, with_bias, clamp) in [1, 3]
                    .into_iter()
                    .flat_map(|w| [true, false].map(|wb| (w, wb)))
                    .flat_map(|(w, wb)| clamps.map(|c| (w, wb, c)))
                {
                    let mut want: alloc::vec::Vec<f32> = bias
                        .iter()
                        .flat_map(|&v| core::iter::repeat_n(if with_bias { v } else { 0.0 }, n))
                        .collect();
                    assert!(sgemm_with(
                        kind, workers, m, n, k, ma, &src, &mut want, n, 1.0, 1.0
                    ));
                    if let Some((lo, hi)) = clamp {
                        want.iter_mut().for_each(|v| *v = v.max(lo).min(hi));
                    }
                    let mut got = alloc::vec![f32::NAN; m * n];
                    let ep = Epilogue {
                        bias: with_bias.then_some(&bias[..]),
                        clamp,
                    };
                    // `sgemm_out` with this kernel kind (it takes the
                    // selected one) and 1.0, 0.0.
                    assert!(sgemm_init(
                        kind, workers, m, n, k, ma, &src, &mut got, n, 1.0, 0.0, ep
                    ));
                    same_bits(
                        &got,
                        &want,
                        &alloc::format!("{kind:?} m{m} n{n} k{k} x{workers} {with_bias} {clamp:?}"),
                    );
                }
                let mut c = alloc::vec![0f32; m * n];
                let ep = Epilogue {
                    bias: Some(&bias[..m - 1]),
                    clamp: None,
                };
                assert!(!sgemm_init(
                    kind, 1, m, n, k, ma, &src, &mut c, n, 1.0, 1.0, ep
                ));
            }
        }
    }

    /// A B packed once ([`Packed`]) gives the bits of the same B packed
    /// or read in place on every run (the same operations in the same
    /// order), on every kernel kind, with 1 and 3 workers, for sizes with
    /// a partial last panel and a partial last k block; a Packed of
    /// another shape is refused, not read past.
    #[test]
    #[cfg(feature = "alloc")]
    fn prepacked_b_gives_the_same_bits() {
        let mut seed = 13;
        for kind in kinds() {
            for &(m, n, k) in &[
                (1, 1, 1),
                (7, 17, 3),
                (PACK_ROWS + 1, 40, KC + 7),
                (13, 64, 2 * KC),
            ] {
                let a = rand(m * k, &mut seed);
                let b = rand(k * n, &mut seed);
                let ma = MatA {
                    a: &a,
                    rs: k,
                    cs: 1,
                };
                let dense = Dense { b: &b, ldb: n };
                let pk = Packed::new(&dense, k, n).unwrap();
                assert_eq!((pk.k(), pk.n()), (k, n));
                for workers in [1, 3] {
                    let mut want = alloc::vec![f32::NAN; m * n];
                    let mut got = alloc::vec![f32::NAN; m * n];
                    assert!(sgemm_with(
                        kind, workers, m, n, k, ma, &dense, &mut want, n, 1.0, 0.0
                    ));
                    assert!(sgemm_with(
                        kind, workers, m, n, k, ma, &pk, &mut got, n, 1.0, 0.0
                    ));
                    same_bits(
                        &got,
                        &want,
                        &alloc::format!("{kind:?} m{m} n{n} k{k} x{workers}"),
                    );
                }
                // Its panels are those `Dense::pack` writes.
                let mut panel = alloc::vec![0f32; KC * NR];
                let kc = KC.min(k);
                assert!(dense.pack(0, kc, 0, NR.min(n), &mut panel));
                assert_eq!(pk.panel(0, 0).unwrap(), &panel[..kc * NR]);
                assert!(pk.panel(1, 0).is_none() && pk.panel(0, n.next_multiple_of(NR)).is_none());
            }
        }
        // A wider call than the packed B: refused (false), nothing read
        // past its panels.
        let (m, n, k) = (6, 16, 8);
        let a = rand(m * k, &mut seed);
        let b = rand(k * n, &mut seed);
        let pk = Packed::new(&Dense { b: &b, ldb: n }, k, n).unwrap();
        let mut c = alloc::vec![0f32; m * 32];
        let ma = MatA {
            a: &a,
            rs: k,
            cs: 1,
        };
        assert!(!sgemm_with(
            Ukr::Portable,
            1,
            m,
            32,
            k,
            ma,
            &pk,
            &mut c,
            32,
            1.0,
            0.0
        ));
    }

    /// The 12 × 32 AVX-512 tiles give the bits of the AVX2 ones whatever
    /// B's source: read in place ([`Dense`]), packed by the task (a
    /// [`Dense`] whose row stride would alias in L1, and [`Im2col`]), or
    /// packed at prepare ([`Packed`]); with tiles of 12 rows and rows left
    /// after them, pairs of panels and a panel (full or partial) left,
    /// k over several blocks, bias, clamp and beta, on 1 and 2–3 workers.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_tiles_give_the_avx2_bits_from_every_source() {
        extern crate std;
        if !(std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma"))
        {
            std::eprintln!("skipped: this CPU has no AVX-512 F");
            return;
        }
        // One GEMM of a kernel kind into C; `false` if refused.
        type GemmInto<'a> = dyn Fn(Ukr, &mut [f32]) -> bool + 'a;
        let mut seed = 21;
        // (m, n, k): one 12 × 32 tile; two pairs of panels, 6 rows and a
        // panel left, k over two blocks; a partial panel after a pair and
        // 1 row left; m at PACK_ROWS for the aliasing Dense (packed).
        // Under Miri: a partial panel after a pair, and the aliasing Dense.
        let shapes = [
            (12, 32, 7),
            (30, 80, KC + 9),
            (13, 47, 300),
            (PACK_ROWS + 2, 64, 40),
        ];
        let few = [(13, 47, 3), (PACK_ROWS + 2, 64, 3)];
        for &(m, n, k) in crate::kern::pick(&shapes, &few) {
            let a = rand(m * k, &mut seed);
            let ma = MatA {
                a: &a,
                rs: k,
                cs: 1,
            };
            // B at row stride n (read in place) and at 1024 (aliasing: packed
            // by the task where m >= PACK_ROWS).
            let b = rand(k * 1024, &mut seed);
            let bias = rand(m, &mut seed);
            let c0 = rand(m * n, &mut seed);
            let inplace = Dense {
                b: &b[..k * n],
                ldb: n,
            };
            let strided = Dense { b: &b, ldb: 1024 };
            let packed = Packed::new(&inplace, k, n).unwrap();
            let eps = [(1.0, 0.0, false), (0.7, 0.0, true), (1.3, 1.0, false)];
            for &(alpha, beta, with_ep) in crate::kern::pick(&eps, &eps[1..2]) {
                let ep = || Epilogue {
                    bias: with_ep.then_some(&bias[..]),
                    // Miri lacks the 512-bit max and min of the clamp.
                    clamp: (with_ep && !cfg!(miri)).then_some((-0.2, 0.3)),
                };
                // On 1, 2 and 3 workers; under Miri on 1 (the split is
                // checked there with Im2col below).
                let gemm = |kind: Ukr, src: &GemmInto| {
                    let one = || {
                        let mut c = c0.clone();
                        assert!(src(kind, &mut c), "{kind:?} m{m} n{n} k{k}");
                        c
                    };
                    if cfg!(miri) {
                        alloc::vec![one()]
                    } else {
                        par::testing::each(one).into()
                    }
                };
                let what = alloc::format!("m{m} n{n} k{k} alpha{alpha} beta{beta} ep{with_ep}");
                let sources: [(&str, &GemmInto); 3] = [
                    ("in place", &|kind, c| {
                        sgemm_init(
                            kind,
                            par::workers(),
                            m,
                            n,
                            k,
                            ma,
                            &inplace,
                            c,
                            n,
                            alpha,
                            beta,
                            ep(),
                        )
                    }),
                    ("strided", &|kind, c| {
                        sgemm_init(
                            kind,
                            par::workers(),
                            m,
                            n,
                            k,
                            ma,
                            &strided,
                            c,
                            n,
                            alpha,
                            beta,
                            ep(),
                        )
                    }),
                    ("prepacked", &|kind, c| {
                        sgemm_init(
                            kind,
                            par::workers(),
                            m,
                            n,
                            k,
                            ma,
                            &packed,
                            c,
                            n,
                            alpha,
                            beta,
                            ep(),
                        )
                    }),
                ];
                for (name, src) in sources {
                    let want = gemm(Ukr::Avx2, src);
                    let got = gemm(Ukr::Avx512, src);
                    for (w, g) in want.iter().zip(&got) {
                        same_bits(g, w, &alloc::format!("{name} {what}"));
                    }
                }
            }
        }
        // Im2col: 20 channels of 9 × 40, 3 × 3, pad 1 (k = 180, n = 360),
        // 26 output channels (two 12-row tiles and 2 rows); under Miri 1
        // channel of 2 rows (n = 80, k = 9).
        let (c, h) = *crate::kern::pick(&[(20, 9)], &[(1, 2)]).first().unwrap();
        let g = Geom {
            inp: [1, h, 40],
            out: [1, h, 40],
            k: [1, 3, 3],
            s: [1, 1, 1],
            d: [1, 1, 1],
            pb: [0, 1, 1],
            pe: [0, 1, 1],
        };
        let (m, n, k) = (26, h * 40, c * 9);
        let x = rand(c * n, &mut seed);
        let w = rand(m * k, &mut seed);
        let conv = |kind: Ukr| {
            par::testing::each(|| {
                let mut y = vec![f32::NAN; m * n];
                let src = Im2col::new(&x, &g).unwrap();
                let ma = MatA {
                    a: &w,
                    rs: k,
                    cs: 1,
                };
                assert!(sgemm_with(
                    kind,
                    par::workers(),
                    m,
                    n,
                    k,
                    ma,
                    &src,
                    &mut y,
                    n,
                    1.0,
                    0.0
                ));
                y
            })
        };
        for (w, g) in conv(Ukr::Avx2).iter().zip(&conv(Ukr::Avx512)) {
            same_bits(g, w, "im2col");
        }
    }

    #[test]
    fn blocked_matches_reference_on_edge_sizes() {
        let mut seed = 7;
        use crate::kern::pick;
        let sizes = [0, 1, 2, 5, 6, 7, 15, 16, 17, 33];
        let ks = [0, 1, 3, KC - 1, KC, KC + 1, 300];
        let trans = [(false, false), (true, false), (false, true), (true, true)];
        let scales = [(1.0, 0.0), (0.5, 1.0), (1.5, -0.5)];
        for kind in kinds() {
            for &m in pick(&sizes, &[1, 7, 17]) {
                for &n in pick(&sizes, &[1, 17]) {
                    for &k in pick(&ks, &[0, 3, KC + 1]) {
                        for &(ta, tb) in pick(&trans, &[(false, false), (true, true)]) {
                            let a = rand(m * k, &mut seed);
                            let b = rand(k * n, &mut seed);
                            let c0 = rand(m * n, &mut seed);
                            for &(alpha, beta) in pick(&scales, &[(0.5, 1.0)]) {
                                let mut want = c0.clone();
                                let (lda, ldb) = (if ta { m } else { k }, if tb { k } else { n });
                                crate::ops::matmul::reference_gemm(
                                    m, n, k, &a, lda, ta, &b, ldb, tb, &mut want, n, alpha, beta,
                                );
                                let ma = if ta {
                                    MatA {
                                        a: &a,
                                        rs: 1,
                                        cs: m,
                                    }
                                } else {
                                    MatA {
                                        a: &a,
                                        rs: k,
                                        cs: 1,
                                    }
                                };
                                let mut got = c0.clone();
                                let ok = if tb {
                                    sgemm_with(
                                        kind,
                                        1,
                                        m,
                                        n,
                                        k,
                                        ma,
                                        &Trans { b: &b, ldb },
                                        &mut got,
                                        n,
                                        alpha,
                                        beta,
                                    )
                                } else {
                                    sgemm_with(
                                        kind,
                                        1,
                                        m,
                                        n,
                                        k,
                                        ma,
                                        &Dense { b: &b, ldb },
                                        &mut got,
                                        n,
                                        alpha,
                                        beta,
                                    )
                                };
                                assert!(ok || m == 0 || n == 0);
                                close(
                                    &got,
                                    &want,
                                    &alloc::format!(
                                        "{kind:?} m{m} n{n} k{k} ta{ta} tb{tb} a{alpha} b{beta}"
                                    ),
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn dots_match_reference() {
        let mut seed = 11;
        for kind in kinds() {
            let _ = kind; // dots follow the global selection
            for (m, n, k) in [(1, 1, 1), (1, 10, 7), (3, 17, 16), (2, 5, 33), (1, 3, 0)] {
                let a = rand(m * k, &mut seed);
                let b = rand(n * k, &mut seed);
                let c0 = rand(m * n, &mut seed);
                for (alpha, beta) in [(1.0, 0.0), (0.5, 1.0), (2.0, -1.5)] {
                    let mut want = c0.clone();
                    crate::ops::matmul::reference_gemm(
                        m, n, k, &a, k, false, &b, k, true, &mut want, n, alpha, beta,
                    );
                    let mut got = c0.clone();
                    assert!(dots(m, n, k, &a, k, &b, k, &mut got, n, alpha, beta));
                    close(&got, &want, &alloc::format!("dots m{m} n{n} k{k}"));
                }
            }
        }
    }

    #[test]
    fn beta_zero_never_reads_c() {
        for kind in kinds() {
            let (m, n, k) = (7, 19, 5);
            let a = vec![1.0; m * k];
            let b = vec![1.0; k * n];
            let mut c = vec![f32::NAN; m * n];
            let ma = MatA {
                a: &a,
                rs: k,
                cs: 1,
            };
            assert!(sgemm_with(
                kind,
                1,
                m,
                n,
                k,
                ma,
                &Dense { b: &b, ldb: n },
                &mut c,
                n,
                1.0,
                0.0
            ));
            assert!(c.iter().all(|&v| v == 5.0), "{kind:?}");
        }
    }

    #[test]
    fn short_buffers_are_refused() {
        let a = vec![1.0; 5];
        let b = vec![1.0; 6];
        let mut c = vec![0.0; 4];
        let ma = MatA {
            a: &a,
            rs: 3,
            cs: 1,
        };
        assert!(!sgemm_with(
            Ukr::Portable,
            1,
            2,
            2,
            3,
            ma,
            &Dense { b: &b, ldb: 2 },
            &mut c,
            2,
            1.0,
            0.0
        ));
    }

    #[test]
    fn im2col_matches_direct_convolution() {
        // B(p, j) of the packed panels against the definition, from k
        // offsets inside a channel, over several geometries: strides 1 to
        // 3, dilation, pads on both sides, output rows wider than a panel.
        // (channels, inp [h, w], k, s, d, pads [top, left, bottom, right])
        type Case = (
            usize,
            [usize; 2],
            [usize; 2],
            [usize; 2],
            [usize; 2],
            [usize; 4],
        );
        let cases: [Case; 5] = [
            (2, [5, 6], [3, 2], [2, 1], [1, 2], [1, 0, 2, 1]),
            (3, [9, 70], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
            (2, [12, 11], [3, 3], [2, 2], [1, 1], [1, 1, 0, 0]),
            (2, [4, 40], [1, 7], [1, 3], [1, 1], [0, 3, 0, 3]),
            (1, [3, 3], [3, 3], [1, 1], [1, 1], [2, 2, 2, 2]),
        ];
        let mut seed = 3;
        for (ch, [h, w], k, st, d, pads) in cases {
            let ext = |i: usize, k: usize, s: usize, d: usize, pa: usize, pb: usize| {
                (i + pa + pb - (k - 1) * d - 1) / s + 1
            };
            let (o1, o2) = (
                ext(h, k[0], st[0], d[0], pads[0], pads[2]),
                ext(w, k[1], st[1], d[1], pads[1], pads[3]),
            );
            let g = Geom {
                inp: [1, h, w],
                out: [1, o1, o2],
                k: [1, k[0], k[1]],
                s: [1, st[0], st[1]],
                d: [1, d[0], d[1]],
                pb: [0, pads[0], pads[1]],
                pe: [0, pads[2], pads[3]],
            };
            let x = rand(ch * h * w, &mut seed);
            let src = Im2col::new(&x, &g).unwrap();
            let ksz = k[0] * k[1];
            let (kk, nn) = (ch * ksz, o1 * o2);
            let want = |p: usize, j: usize| {
                let (c, kh, kw) = (p / ksz, (p % ksz) / k[1], p % k[1]);
                let (oh, ow) = (j / o2, j % o2);
                let ih = (oh * st[0] + kh * d[0]) as isize - pads[0] as isize;
                let iw = (ow * st[1] + kw * d[1]) as isize - pads[1] as isize;
                if !(0..h as isize).contains(&ih) || !(0..w as isize).contains(&iw) {
                    0.0
                } else {
                    x[c * h * w + ih as usize * w + iw as usize]
                }
            };
            for p0 in [0, 1, kk / 2] {
                let kc = kk - p0;
                let mut buf = vec![f32::NAN; KC * NR];
                for j0 in (0..nn).step_by(NR) {
                    let nr = NR.min(nn - j0);
                    assert!(src.pack(p0, kc, j0, nr, &mut buf));
                    for p in 0..kc {
                        for j in 0..NR {
                            let v = if j >= nr { 0.0 } else { want(p0 + p, j0 + j) };
                            assert_eq!(buf[p * NR + j], v, "{g:?} p{} j{}", p0 + p, j0 + j);
                        }
                    }
                }
            }
        }
    }

    /// C of one `sgemm_with` call with the provider of `par::testing`.
    #[allow(clippy::too_many_arguments)]
    fn par_gemm(
        kind: Ukr,
        (m, n, k): (usize, usize, usize),
        a: &[f32],
        b: &[f32],
        tb: bool,
        c0: &[f32],
        ldc: usize,
        beta: f32,
    ) -> Vec<f32> {
        let ma = MatA { a, rs: k, cs: 1 };
        let mut c = c0.to_vec();
        let ok = if tb {
            let src = Trans { b, ldb: k };
            sgemm_with(
                kind,
                par::workers(),
                m,
                n,
                k,
                ma,
                &src,
                &mut c,
                ldc,
                1.5,
                beta,
            )
        } else {
            let src = Dense { b, ldb: n };
            sgemm_with(
                kind,
                par::workers(),
                m,
                n,
                k,
                ma,
                &src,
                &mut c,
                ldc,
                1.5,
                beta,
            )
        };
        assert!(ok);
        c
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn split_gemm_is_bit_identical() {
        let mut seed = 5;
        // Shapes that split (panels and row tiles, full and partial, k over
        // several blocks), one too small to split, and a padded ldc.
        let shapes = [
            (64, 256, 300, 256),
            (6, 1000, 64, 1000),
            (100, 17, 200, 17),
            (7, 33, 513, 40),
            (1, 16, 4096, 16),
            (3, 5, 7, 5),
        ];
        for kind in kinds() {
            for &(m, n, k, ldc) in crate::kern::pick(&shapes, &[(7, 33, 513, 40), (3, 5, 7, 5)]) {
                let a = rand(m * k, &mut seed);
                let b = rand(k * n, &mut seed);
                let c0 = rand(m * ldc, &mut seed);
                for tb in [false, true] {
                    for beta in [0.0, 1.0, -0.5] {
                        let calls = par::testing::split_calls();
                        let [one, two, three] = par::testing::each(|| {
                            par_gemm(kind, (m, n, k), &a, &b, tb, &c0, ldc, beta)
                        });
                        let split = par::testing::split_calls() > calls;
                        assert_eq!(split, m * n * k >= 2 * par::MIN_TASK_MACS, "m{m} n{n} k{k}");
                        let what = alloc::format!("{kind:?} m{m} n{n} k{k} tb{tb} beta{beta}");
                        assert_eq!(bits(&one), bits(&two), "2 workers: {what}");
                        assert_eq!(bits(&one), bits(&three), "3 workers: {what}");
                        // Padding columns of C are never written.
                        for i in 0..m {
                            assert_eq!(
                                bits(&one[i * ldc + n..(i + 1) * ldc]),
                                bits(&c0[i * ldc + n..(i + 1) * ldc])
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn split_im2col_gemm_is_bit_identical() {
        // 8 channels of 20x20, 3x3 kernel, pad 1: a Conv GEMM of 16 x 400
        // x 72, split over output positions.
        let g = Geom {
            inp: [1, 20, 20],
            out: [1, 20, 20],
            k: [1, 3, 3],
            s: [1, 1, 1],
            d: [1, 1, 1],
            pb: [0, 1, 1],
            pe: [0, 1, 1],
        };
        let mut seed = 9;
        let x = rand(8 * 400, &mut seed);
        let w = rand(16 * 72, &mut seed);
        for kind in kinds() {
            let calls = par::testing::split_calls();
            let [one, two, three] = par::testing::each(|| {
                let mut y = vec![0f32; 16 * 400];
                let src = Im2col::new(&x, &g).unwrap();
                let ma = MatA {
                    a: &w,
                    rs: 72,
                    cs: 1,
                };
                assert!(sgemm_with(
                    kind,
                    par::workers(),
                    16,
                    400,
                    72,
                    ma,
                    &src,
                    &mut y,
                    400,
                    1.0,
                    0.0
                ));
                y
            });
            assert!(par::testing::split_calls() >= calls + 2, "did not split");
            assert_eq!(bits(&one), bits(&two), "{kind:?}");
            assert_eq!(bits(&one), bits(&three), "{kind:?}");
        }
    }

    #[test]
    fn split_dots_are_bit_identical() {
        let mut seed = 13;
        let shapes = [
            (1, 1000, 512, 1000),
            (3, 257, 300, 260),
            (2, 40, 9, 40),
            (1, 33, 5000, 33),
        ];
        for &(m, n, k, ldc) in crate::kern::pick(&shapes, &[(3, 257, 300, 260), (2, 40, 9, 40)]) {
            let a = rand(m * k, &mut seed);
            let b = rand(n * k, &mut seed);
            let c0 = rand(m * ldc, &mut seed);
            for beta in [0.0, 0.5] {
                let calls = par::testing::split_calls();
                let [one, two, three] = par::testing::each(|| {
                    let mut c = c0.clone();
                    assert!(dots(m, n, k, &a, k, &b, k, &mut c, ldc, 2.0, beta));
                    c
                });
                let split = par::testing::split_calls() > calls;
                assert_eq!(
                    split,
                    m * n * k >= 2 * par::MIN_TASK_MACS,
                    "dots m{m} n{n} k{k}"
                );
                assert_eq!(bits(&one), bits(&two), "dots m{m} n{n} k{k}");
                assert_eq!(bits(&one), bits(&three), "dots m{m} n{n} k{k}");
            }
        }
    }
}
