//! Direct f32 convolution for x86_64 AVX2 + FMA, and AVX-512 F where the
//! AVX-512 kernels are selected (the module is built on x86_64 only): 2-D
//! windows, column strides up to 8, any dilation and padding, no im2col.
//!
//! The blocked GEMM runs a k × k Conv over an implicit im2col matrix whose
//! panels it packs from X ([`super::sgemm::Im2col`]); every packed value is
//! then used once per output channel. With the 16–64 output channels of the
//! small image models (ResNet-8: 16 / 32 / 64) packing took more time than
//! the multiply-adds (perf on ResNet-8: `Im2col::pack` and its row copies
//! 52 %, the micro-kernel 37 %). Here nothing is packed per output channel:
//! for each output row, the input rows its windows read (all input
//! channels: the geometry must fit [`BUF`]) are held in a stack buffer,
//! zero-padded, and split by column phase when the stride is above one (so
//! the columns a tap reads for consecutive outputs are contiguous); a row
//! is copied there once while consecutive output rows read it ([`Ring`]).
//! The weights come packed at prepare ([`pack`]), so a tile's output
//! channels read a tap's weights at constant offsets from one pointer.
//! Then register tiles of 12 accumulators — up to 4 output channels × 3
//! vectors of 8 output columns, 6 × 2, or 12 × 1, the channels shared out
//! evenly among a row's tiles — sum, for every buffered row and tap, a
//! broadcast weight times 8 consecutive buffered inputs. The last vector of
//! a row is masked when the row width is not a multiple of 8. With AVX-512
//! ([`super::cpu::avx512_vnni`]) and rows wider than 8 columns, the vectors
//! are of 16 columns and a tile holds up to 24 accumulators (of the 32 zmm
//! registers: 12 channels × 2 vectors or 24 × 1; ResNet-8 0.455 → 0.345
//! ms, README); rows of 8 columns run two at a time, one per half of a
//! 16-lane vector ([`Pair`], [`rows_pairs`]). Rows are split among the
//! workers of [`par`].
//!
//! Every output is `bias + Σ w·x` over the taps in the same order as the
//! reference loops (input channel, kernel row, kernel column), with fused
//! multiply-adds, so results differ from the reference only by rounding
//! (ONNX tolerance); the tests below check that on edge geometries.
//!
//! Integer arithmetic: [`Plan::new`] checks every size and the lengths of
//! X, W, B and Y once, with checked products; offsets below those bounds
//! wrap by name.

use super::{copy_row, par, Geom};

/// Floats of buffered input rows for one output row (16 KiB, on the stack).
const BUF: usize = 4096;
/// Floats after the last buffered row that a masked last vector may read
/// (its lanes past the row end are discarded).
const SLACK: usize = 8;
/// Widest kernel row.
const MAX_KW: usize = 16;
/// Tallest kernel (rows of one input channel buffered per output row).
const MAX_KH: usize = 16;
/// Largest column stride.
const MAX_SW: usize = 8;

/// One convolution (one image, one group), its sizes checked.
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// Input channels.
    c: usize,
    /// Output channels.
    m: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    dh: usize,
    pt: usize,
    sw: usize,
    /// Floats of one column phase of a buffered row.
    wph: usize,
    /// Floats of one buffered row (`sw` phases).
    rs: usize,
    /// Offset of kernel column `kx`'s first input within a buffered row.
    taps: [usize; MAX_KW],
    /// For each column phase: the range `[j0, j1)` of its columns that are
    /// inside the input (the others are padding, zero in the buffer from
    /// its start and never written), and the input column of `j0`.
    spans: [(usize, usize, usize); MAX_SW],
}

impl Plan {
    /// `None` when the window is not 2-D, a size overflows, the kernel row
    /// is wider than [`MAX_KW`], or the rows of all input channels that one
    /// output row reads do not fit the buffer; the caller then runs another
    /// kernel (the GEMM).
    fn new(c: usize, m: usize, g: &Geom) -> Option<Plan> {
        if g.inp[0] != 1 || g.k[0] != 1 || g.out[0] != 1 || !g.reach_ok() {
            return None;
        }
        let [h, w] = [g.inp[1], g.inp[2]];
        let [oh, ow] = [g.out[1], g.out[2]];
        let [kh, kw] = [g.k[1], g.k[2]];
        let [sh, sw] = [g.s[1], g.s[2]];
        let [dh, dw] = [g.d[1], g.d[2]];
        if [c, m, h, w, oh, ow, kh, kw, sh, sw].contains(&0)
            || kw > MAX_KW
            || kh > MAX_KH
            || sw > MAX_SW
        {
            return None;
        }
        // Padded columns the outputs read: (ow - 1)·sw + (kw - 1)·dw + 1.
        let wn = ow
            .wrapping_sub(1)
            .checked_mul(sw)?
            .checked_add(kw.wrapping_sub(1).checked_mul(dw)?)?
            .checked_add(1)?;
        let wph = wn.div_ceil(sw);
        let rs = wph.checked_mul(sw)?;
        if rs.checked_mul(kh)?.checked_mul(c)? > BUF.wrapping_sub(SLACK) {
            return None;
        }
        let mut taps = [0usize; MAX_KW];
        for (kx, t) in taps.iter_mut().enumerate().take(kw) {
            // kx < kw: kx·dw <= (kw - 1)·dw, checked above.
            let col = kx.wrapping_mul(dw);
            let (Some(phase), Some(at)) = (col.checked_rem(sw), col.checked_div(sw)) else {
                return None;
            };
            *t = phase.wrapping_mul(wph).wrapping_add(at);
        }
        let pl = g.pb[2];
        let mut spans = [(0usize, 0usize, 0usize); MAX_SW];
        for (ph, span) in spans.iter_mut().enumerate().take(sw) {
            // Phase ph's column j is padded column j·sw + ph, input column
            // j·sw + ph - pl.
            let (j0, j1) = super::valid_range(wph, sw, ph, pl, w);
            let first = j0.wrapping_mul(sw).wrapping_add(ph).wrapping_sub(pl);
            *span = (j0, j1, first);
        }
        Some(Plan {
            c,
            m,
            h,
            w,
            oh,
            ow,
            kh,
            kw,
            sh,
            dh,
            pt: g.pb[1],
            sw,
            wph,
            rs,
            taps,
            spans,
        })
    }

    /// Whether X, W, B and Y hold every element the plan reaches.
    fn fits(&self, x: usize, w: usize, b: Option<usize>, y: usize) -> bool {
        let xn = self
            .h
            .checked_mul(self.w)
            .and_then(|v| v.checked_mul(self.c));
        let wn = self
            .kh
            .checked_mul(self.kw)
            .and_then(|v| v.checked_mul(self.c))
            .and_then(|v| v.checked_mul(self.m));
        let yn = self
            .oh
            .checked_mul(self.ow)
            .and_then(|v| v.checked_mul(self.m));
        matches!((xn, wn, yn), (Some(xn), Some(wn), Some(yn)) if xn <= x && wn <= w && yn <= y)
            && b.is_none_or(|b| b >= self.m)
    }
}

/// One group's weights (`m × c·kh·kw`, ONNX order) packed for [`Conv`]:
/// tap `t = (ci · kh + ky) · kw + kx` of output channel `o` at `t · m + o`,
/// so a register tile's channels read one tap's weights from one pointer
/// at constant offsets (with the ONNX order each channel had its own
/// pointer: 24 of them in a tile of 24 channels, and the spilled ones
/// reloaded from the stack on every tap). `None` when `w` is not `m`
/// rows of `wk` or `out` not as long.
pub(crate) fn pack(w: &[f32], m: usize, wk: usize, out: &mut [f32]) -> Option<()> {
    if wk == 0 || m.checked_mul(wk)? != w.len() || out.len() != w.len() {
        return None;
    }
    for (o, row) in w.chunks_exact(wk).enumerate() {
        // o < m: o + t·m < m·wk, out's length.
        for (d, &v) in out.iter_mut().skip(o).step_by(m).zip(row) {
            *d = v;
        }
    }
    Some(())
}

/// Whether [`Conv::run`] takes a Conv of `c` input and `m` output channels per
/// group over `g` on this CPU. It pays where im2col packing dominates the
/// GEMM: few output channels per packed value.
pub(crate) fn wanted(c: usize, m: usize, g: &Geom) -> bool {
    super::cpu::kernels() == super::cpu::Kernels::Avx2Fma
        && m <= 64
        && g.out[2] >= 8
        && Plan::new(c, m, g).is_some()
}

/// One image and group of a Conv: X (`c` planes), W packed by [`pack`]
/// (tap-major: `c · kh · kw` runs of `m` floats), the optional bias B
/// (`m`), over `g`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Conv<'a> {
    pub x: &'a [f32],
    pub w: &'a [f32],
    pub b: Option<&'a [f32]>,
    pub c: usize,
    pub m: usize,
    pub g: &'a Geom,
}

impl Conv<'_> {
    /// `y[o, :, :] = b[o] + Σ_{c, ky, kx} w[o, c, ky, kx] · x[c, window]`
    /// for the `m` output planes of Y. `false` (nothing reliable written)
    /// when the geometry is not one [`wanted`] takes, a length is short, or
    /// the CPU lacks AVX2 + FMA. Split by output rows among the workers of
    /// [`par`] unless `serial`.
    pub(crate) fn run(&self, y: &mut [f32], serial: bool) -> bool {
        if super::cpu::kernels() != super::cpu::Kernels::Avx2Fma {
            return false;
        }
        let workers = if serial { 1 } else { par::workers() };
        // SAFETY: the kernels are Avx2Fma only when the CPU has AVX2 and
        // FMA (`cpu::enable_avx2_fma`'s contract, or a build that targets
        // them).
        // `avx512_vnni` holds only where the CPU has AVX-512 F
        // (`cpu::enable_avx512_vnni`'s contract).
        unsafe { self.run_on(y, workers, super::cpu::avx512_vnni()) }
    }

    /// [`Conv::run`] with `workers` workers (1: on this thread), in 16-lane
    /// tiles where `avx512`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA, and AVX-512 F where `avx512`.
    unsafe fn run_on(&self, y: &mut [f32], workers: usize, avx512: bool) -> bool {
        let Conv { x, w, b, c, m, g } = *self;
        let Some(plan) = Plan::new(c, m, g) else {
            return false;
        };
        if !plan.fits(x.len(), w.len(), b.map(<[f32]>::len), y.len()) {
            return false;
        }
        // Checked in `fits`.
        let out_sz = plan.oh.wrapping_mul(plan.ow);
        let wk = plan.c.wrapping_mul(plan.kh).wrapping_mul(plan.kw);
        let macs = out_sz.saturating_mul(wk).saturating_mul(m);
        let t = par::tasks(workers, macs, plan.oh);
        // With AVX-512 (the caller's `avx512`), 16-lane tiles: of columns
        // for rows wider than 8, else of row pairs.
        type Rows = unsafe fn(&Plan, &[f32], &[f32], Option<&[f32]>, *mut f32, (usize, usize));
        let rows: Rows = if avx512 { rows_avx512 } else { rows_avx2 };
        if t <= 1 {
            // SAFETY: AVX2 and FMA, and AVX-512 F where `avx512` (the
            // caller's contract): forwarded; `fits` checked X, W, B and Y,
            // and Y is borrowed mutably here.
            unsafe { rows(&plan, x, w, b, y.as_mut_ptr(), (0, plan.oh)) };
            return true;
        }
        let ys = par::SharedMut::new(y);
        par::for_each(t, &|ti| {
            // SAFETY: as above; `fits` checked X, W, B and Y (before it was
            // shared); task ti writes only its output rows (par::chunk:
            // disjoint from the other tasks') of each plane.
            unsafe { rows(&plan, x, w, b, ys.as_mut_ptr(), par::chunk(plan.oh, t, ti)) };
        });
        true
    }
}

/// The operands of one register tile.
struct Tile {
    /// The buffer at this tile's first column.
    buf: *const f32,
    /// Input channels and kernel rows.
    c: usize,
    kh: usize,
    /// Floats between two input channels' rows in the buffer
    /// ([`Ring::cs`]).
    cs: usize,
    /// Offset of the row that kernel row `ky` reads within an input
    /// channel's rows, for the tile's output row and (for [`Pair`]) the
    /// next one ([`Ring::koff`]).
    koff: [[usize; MAX_KH]; 2],
    kw: usize,
    taps: [usize; MAX_KW],
    /// The packed weights ([`pack`]) at the tile's first channel's first
    /// tap; channel `i`'s weight of tap `t` at `t · ws + i`.
    w: *const f32,
    /// Floats between two taps' weights (the output channels, `m`).
    ws: usize,
    /// Y of the tile's first channel, row and column.
    y: *mut f32,
    /// Floats between two output planes.
    out_sz: usize,
    /// The tile's first channel's bias, or null (no bias: 0).
    bias: *const f32,
    /// Lanes of the tile's last vector that are outputs (1..=8, 1..=16 for
    /// [`Zmm`]; for [`Pair`], `ow`, per row).
    last: usize,
    /// [`Pair`]: the row after this one is computed too (false for the
    /// last row of a task's odd count).
    pair: bool,
}

/// Output rows `oy0 .. oy1` of every output channel of `plan`, in tiles of
/// 8-lane vectors ([`tile`] on [`Ymm`]).
///
/// # Safety
/// The CPU has AVX2 and FMA; [`Plan::fits`] holds for X, W, B and the
/// `m · oh · ow` floats at `y`, and no other thread reads or writes rows
/// `oy0 .. oy1` of Y's planes meanwhile.
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2(
    plan: &Plan,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    y: *mut f32,
    rows: (usize, usize),
) {
    // SAFETY: forwarded.
    unsafe { rows_body::<8>(plan, x, w, b, y, rows) }
}

/// [`rows_avx2`] in tiles of 16-lane vectors: of 16 columns ([`tile`] on
/// [`Zmm`]) for rows wider than 8, else of two rows ([`rows_pairs`]).
///
/// # Safety
/// The CPU has AVX-512 F; otherwise as [`rows_avx2`].
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn rows_avx512(
    plan: &Plan,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    y: *mut f32,
    rows: (usize, usize),
) {
    // SAFETY: forwarded.
    unsafe {
        if plan.ow > 8 {
            rows_body::<16>(plan, x, w, b, y, rows)
        } else {
            rows_pairs(plan, x, w, b, y, rows)
        }
    }
}

/// Output rows `oy0 .. oy1` of rows of at most 8 columns two at a time, one
/// 16-lane vector per row pair ([`Pair`]; ResNet-8's 8 × 8 planes filled
/// half the lanes of a 16-lane vector, and took 39 % of its time in 8-lane
/// tiles): the input rows of both in one buffer of `2 · BUF` floats (a
/// [`Ring`] of two output rows), then tiles of up to 24 output channels.
///
/// Kept out of line, so that the 16-column path's frame does not carry its
/// 32 KiB of buffers.
///
/// # Safety
/// The CPU has AVX-512 F; `plan.ow <= 8`; otherwise as [`rows_avx2`].
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline(never)]
unsafe fn rows_pairs(
    plan: &Plan,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    y: *mut f32,
    (oy0, oy1): (usize, usize),
) {
    let mut buf = [0f32; 2 * BUF];
    let p = plan;
    // Sizes checked by `Plan::new` and `fits`.
    let out_sz = p.oh.wrapping_mul(p.ow);
    let oy1 = oy1.min(p.oh);
    let tiles = p.m.div_ceil(24);
    let mut ring = Ring::new(p, 2, 2 * BUF);
    let mut oy = oy0;
    while oy < oy1 {
        let pair = oy1.wrapping_sub(oy) >= 2;
        fill(&mut buf, p, x, oy, &mut ring, 0);
        if pair {
            fill(&mut buf, p, x, oy.wrapping_add(1), &mut ring, 1);
        }
        for ti in 0..tiles {
            let (co, co_end) = par::chunk(p.m, tiles, ti);
            let t = Tile {
                buf: buf.as_ptr(),
                c: p.c,
                kh: p.kh,
                cs: ring.cs,
                koff: ring.koff,
                kw: p.kw,
                taps: p.taps,
                w: w.as_ptr().wrapping_add(co),
                ws: p.m,
                y: y.wrapping_add(co.wrapping_mul(out_sz).wrapping_add(oy.wrapping_mul(p.ow))),
                out_sz,
                bias: b.map_or(core::ptr::null(), |b| b.as_ptr().wrapping_add(co)),
                last: p.ow,
                pair,
            };
            // SAFETY: the tile's channels co..co_end <= m (at most 24: tiles
            // = ceil(m / 24) near-equal runs); rows oy and, where `pair`,
            // oy + 1 < oy1 are this task's and inside each plane (ow <= 8
            // floats each, contiguous); `fill` wrote the rows of both output
            // rows that the masked lanes read, inside `buf` with SLACK
            // after them (`Ring::new`); the CPU has AVX-512 F (the caller's
            // contract).
            unsafe { dispatch512::<Pair>(co_end.wrapping_sub(co), 1, &t) };
        }
        oy = oy.wrapping_add(if pair { 2 } else { 1 });
    }
}

/// [`rows_avx2`] (L = 8) and [`rows_avx512`] (L = 16): per output row, the
/// input rows it reads buffered once, then the row's vectors of L columns
/// in groups (3, or 2 + 2 for a remainder of 4, with 8 lanes; 2 with 16),
/// each group by tiles of as many output channels as keep 12 (AVX2: 16
/// ymm registers) or 24 (AVX-512: 32 zmm) accumulators, shared out evenly.
///
/// # Safety
/// As [`rows_avx2`] for L = 8, [`rows_avx512`] for L = 16.
#[inline(always)]
unsafe fn rows_body<const L: usize>(
    plan: &Plan,
    x: &[f32],
    w: &[f32],
    b: Option<&[f32]>,
    y: *mut f32,
    (oy0, oy1): (usize, usize),
) {
    let mut buf = [0f32; BUF];
    let p = plan;
    // Sizes checked by `Plan::new` and `fits`.
    let out_sz = p.oh.wrapping_mul(p.ow);
    let nvec = p.ow.div_ceil(L);
    let tail = p.ow.wrapping_sub(nvec.wrapping_sub(1).wrapping_mul(L));
    let mut ring = Ring::new(p, 1, BUF);
    for oy in oy0..oy1.min(p.oh) {
        fill(&mut buf, p, x, oy, &mut ring, 0);
        let mut v = 0;
        while v < nvec {
            let nx = match (L, nvec.wrapping_sub(v)) {
                (16, l) => l.min(2),
                // A remainder of 1 after a group of 3 makes two groups of
                // 2 instead.
                (_, 4) => 2,
                (_, l) => l.min(3),
            };
            let ox = v.wrapping_mul(L);
            let end = v.wrapping_add(nx);
            // Channels per tile (the other registers hold the inputs and a
            // broadcast weight).
            let mb_max: usize = match (L, nx) {
                (16, 1) => 24,
                (16, _) | (_, 1) => 12,
                (_, 2) => 6,
                _ => 4,
            };
            let tiles = p.m.div_ceil(mb_max);
            for ti in 0..tiles {
                let (co, co_end) = par::chunk(p.m, tiles, ti);
                let mb = co_end.wrapping_sub(co);
                let t = Tile {
                    buf: buf.as_ptr().wrapping_add(ox),
                    c: p.c,
                    kh: p.kh,
                    cs: ring.cs,
                    koff: ring.koff,
                    kw: p.kw,
                    taps: p.taps,
                    w: w.as_ptr().wrapping_add(co),
                    ws: p.m,
                    y: y.wrapping_add(
                        co.wrapping_mul(out_sz)
                            .wrapping_add(oy.wrapping_mul(p.ow))
                            .wrapping_add(ox),
                    ),
                    out_sz,
                    bias: b.map_or(core::ptr::null(), |b| b.as_ptr().wrapping_add(co)),
                    last: if end == nvec { tail } else { L },
                    pair: false,
                };
                // SAFETY: the tile's channels co..co + mb <= m (mb <=
                // mb_max: tiles = ceil(m / mb_max) near-equal runs), its
                // columns ox..ox + L·nx (the last vector masked to `last`
                // lanes) < ow, and `fill` wrote the rows·rs floats of `buf`
                // it reads, which holds SLACK more (see `tile`); with
                // L = 16 the CPU has AVX-512 F (`rows_avx512`).
                unsafe {
                    if L == 16 {
                        dispatch512::<Zmm>(mb, nx, &t);
                    } else {
                        dispatch(mb, nx, &t);
                    }
                }
            }
            v = end;
        }
    }
}

/// `tile::<L, MB, NX>` for the run-time `mb`, `nx`, with `L` [`Zmm`] or
/// [`Pair`] (then `nx` is 1).
///
/// # Safety
/// As [`tile`] on `L`.
#[inline(always)]
unsafe fn dispatch512<L: Lanes>(mb: usize, nx: usize, t: &Tile) {
    // SAFETY: forwarded.
    unsafe {
        match (mb, nx) {
            (1, 1) => tile::<L, 1, 1>(t),
            (2, 1) => tile::<L, 2, 1>(t),
            (3, 1) => tile::<L, 3, 1>(t),
            (4, 1) => tile::<L, 4, 1>(t),
            (5, 1) => tile::<L, 5, 1>(t),
            (6, 1) => tile::<L, 6, 1>(t),
            (7, 1) => tile::<L, 7, 1>(t),
            (8, 1) => tile::<L, 8, 1>(t),
            (9, 1) => tile::<L, 9, 1>(t),
            (10, 1) => tile::<L, 10, 1>(t),
            (11, 1) => tile::<L, 11, 1>(t),
            (12, 1) => tile::<L, 12, 1>(t),
            (13, 1) => tile::<L, 13, 1>(t),
            (14, 1) => tile::<L, 14, 1>(t),
            (15, 1) => tile::<L, 15, 1>(t),
            (16, 1) => tile::<L, 16, 1>(t),
            (17, 1) => tile::<L, 17, 1>(t),
            (18, 1) => tile::<L, 18, 1>(t),
            (19, 1) => tile::<L, 19, 1>(t),
            (20, 1) => tile::<L, 20, 1>(t),
            (21, 1) => tile::<L, 21, 1>(t),
            (22, 1) => tile::<L, 22, 1>(t),
            (23, 1) => tile::<L, 23, 1>(t),
            (_, 1) => tile::<L, 24, 1>(t),
            (1, _) => tile::<L, 1, 2>(t),
            (2, _) => tile::<L, 2, 2>(t),
            (3, _) => tile::<L, 3, 2>(t),
            (4, _) => tile::<L, 4, 2>(t),
            (5, _) => tile::<L, 5, 2>(t),
            (6, _) => tile::<L, 6, 2>(t),
            (7, _) => tile::<L, 7, 2>(t),
            (8, _) => tile::<L, 8, 2>(t),
            (9, _) => tile::<L, 9, 2>(t),
            (10, _) => tile::<L, 10, 2>(t),
            (11, _) => tile::<L, 11, 2>(t),
            _ => tile::<L, 12, 2>(t),
        }
    }
}

/// `tile::<Ymm, MB, NX>` for the run-time `mb`, `nx`.
///
/// # Safety
/// As [`tile`] on [`Ymm`].
#[inline(always)]
unsafe fn dispatch(mb: usize, nx: usize, t: &Tile) {
    // SAFETY: forwarded.
    unsafe {
        match (mb, nx) {
            (1, 1) => tile::<Ymm, 1, 1>(t),
            (2, 1) => tile::<Ymm, 2, 1>(t),
            (3, 1) => tile::<Ymm, 3, 1>(t),
            (4, 1) => tile::<Ymm, 4, 1>(t),
            (5, 1) => tile::<Ymm, 5, 1>(t),
            (6, 1) => tile::<Ymm, 6, 1>(t),
            (7, 1) => tile::<Ymm, 7, 1>(t),
            (8, 1) => tile::<Ymm, 8, 1>(t),
            (9, 1) => tile::<Ymm, 9, 1>(t),
            (10, 1) => tile::<Ymm, 10, 1>(t),
            (11, 1) => tile::<Ymm, 11, 1>(t),
            (_, 1) => tile::<Ymm, 12, 1>(t),
            (1, 2) => tile::<Ymm, 1, 2>(t),
            (2, 2) => tile::<Ymm, 2, 2>(t),
            (3, 2) => tile::<Ymm, 3, 2>(t),
            (4, 2) => tile::<Ymm, 4, 2>(t),
            (5, 2) => tile::<Ymm, 5, 2>(t),
            (_, 2) => tile::<Ymm, 6, 2>(t),
            (1, _) => tile::<Ymm, 1, 3>(t),
            (2, _) => tile::<Ymm, 2, 3>(t),
            (3, _) => tile::<Ymm, 3, 3>(t),
            _ => tile::<Ymm, 4, 3>(t),
        }
    }
}

/// Row slots per input channel at most ([`Ring`]).
const MAX_SLOTS: usize = 2 * MAX_KH;

/// The input rows a task's buffer holds, for one output row at a time or
/// two (`rows`, [`rows_pairs`]). Each input channel has `n` row slots of
/// `rs` floats; output row `oy`'s kernel row `ky` reads padded input row
/// `oy · sh + ky · dh`. With `dh` = 1 the rows that `rows` consecutive
/// output rows read are consecutive, `kh + (rows - 1) · sh` of them, so
/// with that many slots, slot `row % n` gives them distinct slots, and a
/// row stays in its slot until a later output row needs the slot: with
/// stride 1 each input row is copied once per task instead of `kh` times
/// (ResNet-8's 3 × 3 layers: `fill` was a third of the direct Conv's
/// time). Otherwise (a row dilation, or slots that do not fit the buffer)
/// output row `r` of the `rows` has slot `r · kh + ky`.
struct Ring {
    /// The padded input row each slot holds (`usize::MAX`: none).
    held: [usize; MAX_SLOTS],
    /// For each of the `rows` output rows, the offset (`slot · rs`) of the
    /// row its kernel row `ky` reads, within an input channel's slots.
    koff: [[usize; MAX_KH]; 2],
    /// Slots per input channel.
    n: usize,
    /// Floats between two input channels' slots (`n · rs`).
    cs: usize,
    /// Slots by row modulo `n`.
    cycle: bool,
}

impl Ring {
    /// An empty ring for `rows` (1 or 2) output rows at a time in a buffer
    /// of `len` floats, which holds `rows · c · kh · rs + SLACK` floats
    /// (`Plan::new`: `c · kh · rs + SLACK <= BUF`).
    fn new(p: &Plan, rows: usize, len: usize) -> Ring {
        let rows = rows.clamp(1, 2);
        // Plan::new: kh <= MAX_KH and c · kh · rs <= BUF - SLACK.
        let span = rows
            .wrapping_sub(1)
            .saturating_mul(p.sh)
            .saturating_add(p.kh);
        let fits = span
            .checked_mul(p.rs)
            .and_then(|v| v.checked_mul(p.c))
            .and_then(|v| v.checked_add(SLACK))
            .is_some_and(|v| v <= len);
        let cycle = p.dh == 1 && span <= MAX_SLOTS && fits;
        let n = if cycle { span } else { rows.wrapping_mul(p.kh) };
        Ring {
            held: [usize::MAX; MAX_SLOTS],
            koff: [[0; MAX_KH]; 2],
            n,
            cs: n.wrapping_mul(p.rs),
            cycle,
        }
    }
}

/// Makes `buf` hold the input rows that output row `oy` reads (those it
/// does not hold yet: [`Ring`]), as the ring's output row `r` (0, or 1 for
/// the second of a pair), and `ring.koff[r]` their offsets: kernel row
/// `ky` of input channel `ci` at `ci · cs + koff[r][ky]`, its padded
/// columns `col` at `(col % sw) · wph + col / sw` from there, zeros where
/// the window is in the padding.
#[inline(always)]
fn fill(buf: &mut [f32], p: &Plan, x: &[f32], oy: usize, ring: &mut Ring, r: usize) {
    // Sizes and offsets below the plan's bounds (`Plan::new`, `fits`) and
    // the ring's (`Ring::new`).
    let in_sz = p.h.wrapping_mul(p.w);
    let Some(koff) = ring.koff.get_mut(r) else {
        return;
    };
    for ky in 0..p.kh {
        let ip = oy.wrapping_mul(p.sh).wrapping_add(ky.wrapping_mul(p.dh));
        let slot = if ring.cycle {
            ip.checked_rem(ring.n).unwrap_or(ky)
        } else {
            r.wrapping_mul(p.kh).wrapping_add(ky)
        };
        let off = slot.wrapping_mul(p.rs);
        if let Some(k) = koff.get_mut(ky) {
            *k = off;
        }
        match ring.held.get_mut(slot) {
            Some(h) if *h != ip => *h = ip,
            _ => continue,
        }
        let iy = ip.wrapping_sub(p.pt);
        for ci in 0..p.c {
            let at = ci.wrapping_mul(ring.cs).wrapping_add(off);
            let Some(row) = buf.get_mut(at..at.wrapping_add(p.rs)) else {
                continue;
            };
            // ci < c and iy < h: inside X (`Plan::fits`).
            let start = ci.wrapping_mul(in_sz).wrapping_add(iy.wrapping_mul(p.w));
            let xrow = if iy < p.h {
                x.get(start..start.wrapping_add(p.w))
            } else {
                None
            };
            fill_row(row, p, xrow);
        }
    }
}

/// One buffered row from input row `xrow` (`None`: a padding row), split
/// by column phase; its padding columns stay as they are (zero).
#[inline(always)]
fn fill_row(row: &mut [f32], p: &Plan, xrow: Option<&[f32]>) {
    let spans = p.spans.iter().take(p.sw);
    for (part, &(j0, j1, first)) in row.chunks_exact_mut(p.wph).zip(spans) {
        let Some(dst) = part.get_mut(j0..j1) else {
            continue;
        };
        let Some(xr) = xrow else {
            dst.fill(0.0);
            continue;
        };
        let Some(src) = xr.get(first..) else {
            continue;
        };
        if p.sw == 1 {
            // Short rows (8–64 floats): moves, not a `memcpy` call per row.
            copy_row(dst, src.get(..dst.len()).unwrap_or_default());
            continue;
        }
        let (mut dst, mut src) = (dst, src);
        if p.sw == 2 {
            // Every other float, 8 from each 16 (one shuffle; rows of 16-33
            // columns left the compiler's vectorized loop, which takes 64
            // at a time, to its scalar one); the rest below.
            let mut blocks = 0usize;
            for (d, s) in dst.chunks_exact_mut(8).zip(src.chunks_exact(16)) {
                if let (Ok(d), Ok(s)) = (<&mut [f32; 8]>::try_from(d), <&[f32; 16]>::try_from(s)) {
                    let [a, _, b, _, c, _, e, _, f, _, g, _, h, _, i, _] = *s;
                    *d = [a, b, c, e, f, g, h, i];
                }
                blocks = blocks.wrapping_add(1);
            }
            // blocks · 16 <= src.len().
            dst = dst.get_mut(blocks.wrapping_mul(8)..).unwrap_or_default();
            src = src.get(blocks.wrapping_mul(16)..).unwrap_or_default();
        }
        for (d, s) in dst.iter_mut().zip(src.iter().step_by(p.sw)) {
            *d = *s;
        }
    }
}

/// The vector operations of [`tile`] on one lane width: [`Ymm`] (AVX2,
/// 8 lanes) and [`Zmm`] (AVX-512 F, 16 lanes). They differ only in the
/// last vector of a row: AVX2 loads it whole (the lanes past the row read
/// the next buffered row or [`SLACK`], and are discarded) and stores it
/// with a vector mask; AVX-512 loads and stores it under a k-mask.
///
/// # Safety
/// Every method is an intrinsic of the type's instruction set, so it may
/// run only inside a function compiled for it (`rows_avx2`,
/// `rows_avx512`), on pointers that hold the vector it reads or writes.
trait Lanes {
    /// Output columns per vector.
    const N: usize;
    type V: Copy;
    /// What the loads and stores of one tile need besides the pointer: the
    /// lanes of the last vector that are outputs.
    type Ctx: Copy;
    /// The tile's context: the first `t.last` (1..=N) columns.
    unsafe fn ctx(t: &Tile) -> Self::Ctx;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(p: *const f32) -> Self::V;
    unsafe fn load(c: Self::Ctx, p: *const f32) -> Self::V;
    /// The last vector at `p`; `p2`: the same tap's first column in the
    /// next output row's buffered row (read by [`Pair`] only).
    unsafe fn load_last(c: Self::Ctx, p: *const f32, p2: *const f32) -> Self::V;
    /// `a · b + c`, fused.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn store(c: Self::Ctx, p: *mut f32, v: Self::V);
    unsafe fn store_last(c: Self::Ctx, p: *mut f32, v: Self::V);
}

/// AVX2 + FMA: 8 lanes.
struct Ymm;

/// AVX-512 F: 16 lanes.
struct Zmm;

// SAFETY (every method of both impls): the trait's contract: the caller
// runs in a function compiled for the instruction set, on pointers that
// hold the vector.
impl Lanes for Ymm {
    const N: usize = 8;
    type V = core::arch::x86_64::__m256;
    type Ctx = core::arch::x86_64::__m256i;
    #[inline(always)]
    unsafe fn ctx(t: &Tile) -> Self::Ctx {
        const MASK: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];
        // SAFETY: `last` is 1..=8, so the 8-lane window lies inside MASK.
        unsafe {
            core::arch::x86_64::_mm256_loadu_si256(
                MASK.as_ptr().add(8usize.wrapping_sub(t.last)).cast(),
            )
        }
    }
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        // SAFETY: the trait's contract.
        unsafe { core::arch::x86_64::_mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self::V {
        // SAFETY: the trait's contract.
        unsafe { core::arch::x86_64::_mm256_broadcast_ss(&*p) }
    }
    #[inline(always)]
    unsafe fn load(_: Self::Ctx, p: *const f32) -> Self::V {
        // SAFETY: the trait's contract.
        unsafe { core::arch::x86_64::_mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_last(_: Self::Ctx, p: *const f32, _: *const f32) -> Self::V {
        // SAFETY: the trait's contract; [`tile`]'s caller makes the whole
        // vector readable (the next row or the slack).
        unsafe { core::arch::x86_64::_mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // SAFETY: the trait's contract.
        unsafe { core::arch::x86_64::_mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store(_: Self::Ctx, p: *mut f32, v: Self::V) {
        // SAFETY: the trait's contract.
        unsafe { core::arch::x86_64::_mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn store_last(m: Self::Ctx, p: *mut f32, v: Self::V) {
        // SAFETY: the trait's contract (the masked lanes).
        unsafe { core::arch::x86_64::_mm256_maskstore_ps(p, m, v) }
    }
}

impl Lanes for Zmm {
    const N: usize = 16;
    type V = core::arch::x86_64::__m512;
    type Ctx = core::arch::x86_64::__mmask16;
    #[inline(always)]
    unsafe fn ctx(t: &Tile) -> Self::Ctx {
        // `last` is 1..=16: its low bits.
        low_lanes(t.last)
    }
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        // SAFETY: the trait's contract.
        unsafe { core::arch::x86_64::_mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self::V {
        // SAFETY: the trait's contract.
        unsafe { core::arch::x86_64::_mm512_set1_ps(*p) }
    }
    #[inline(always)]
    unsafe fn load(_: Self::Ctx, p: *const f32) -> Self::V {
        // SAFETY: the trait's contract.
        unsafe { core::arch::x86_64::_mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load_last(m: Self::Ctx, p: *const f32, _: *const f32) -> Self::V {
        // SAFETY: the trait's contract (the masked lanes; the others read
        // nothing and are zero).
        unsafe { core::arch::x86_64::_mm512_maskz_loadu_ps(m, p) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // SAFETY: the trait's contract.
        unsafe { core::arch::x86_64::_mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store(_: Self::Ctx, p: *mut f32, v: Self::V) {
        // SAFETY: the trait's contract.
        unsafe { core::arch::x86_64::_mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn store_last(m: Self::Ctx, p: *mut f32, v: Self::V) {
        // SAFETY: the trait's contract (the masked lanes).
        unsafe { core::arch::x86_64::_mm512_mask_storeu_ps(p, m, v) }
    }
}

/// The lane mask of the first `n` (0..=16) lanes.
#[inline(always)]
fn low_lanes(n: usize) -> u16 {
    (1u32.wrapping_shl(n as u32).wrapping_sub(1)) as u16
}

/// AVX-512 F on rows of at most 8 columns: one 16-lane vector holds a row
/// pair, output row `oy` in its first `ow` lanes and `oy + 1` in the next
/// `ow` ([`rows_pairs`]): each buffered row of the second has its own
/// pointer ([`Lanes::load_last`]'s `p2`, from [`Tile::koff`]), and the two
/// rows of Y are contiguous (`ow` floats each), so each is
/// one masked load and the pair one masked store. A row pair is a single
/// vector (`nx` = 1): `load` and `store` are the last vector's.
struct Pair;

/// [`Pair`]'s lanes: the first row's, the second's (none for a row left
/// alone at the end), and `ow`.
#[derive(Clone, Copy)]
struct PairCtx {
    lo: u16,
    hi: u16,
    ow: usize,
}

impl Lanes for Pair {
    const N: usize = 8;
    type V = core::arch::x86_64::__m512;
    type Ctx = PairCtx;
    #[inline(always)]
    unsafe fn ctx(t: &Tile) -> Self::Ctx {
        // `last` (ow) is 1..=8: both rows fit the 16 lanes.
        let lo = low_lanes(t.last);
        let hi = if t.pair {
            lo.wrapping_shl(t.last as u32)
        } else {
            0
        };
        PairCtx { lo, hi, ow: t.last }
    }
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        // SAFETY: the trait's contract.
        unsafe { Zmm::zero() }
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self::V {
        // SAFETY: the trait's contract.
        unsafe { Zmm::splat(p) }
    }
    #[inline(always)]
    unsafe fn load(c: Self::Ctx, p: *const f32) -> Self::V {
        // Not reached (a pair is one vector, the last): the first row.
        // SAFETY: the trait's contract (the masked lanes).
        unsafe { core::arch::x86_64::_mm512_maskz_loadu_ps(c.lo, p) }
    }
    #[inline(always)]
    unsafe fn load_last(c: Self::Ctx, p: *const f32, p2: *const f32) -> Self::V {
        use core::arch::x86_64::*;
        // SAFETY: the trait's contract: `p` is in the first row's buffered
        // row and `p2` in the second's; lane `ow + l` of the second load
        // reads its float `l` (the unmasked lanes read nothing).
        unsafe {
            let v = _mm512_maskz_loadu_ps(c.lo, p);
            _mm512_mask_loadu_ps(v, c.hi, p2.wrapping_sub(c.ow))
        }
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // SAFETY: the trait's contract.
        unsafe { Zmm::fma(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store(c: Self::Ctx, p: *mut f32, v: Self::V) {
        // SAFETY: as `store_last`.
        unsafe { Self::store_last(c, p, v) }
    }
    #[inline(always)]
    unsafe fn store_last(c: Self::Ctx, p: *mut f32, v: Self::V) {
        // SAFETY: the trait's contract: row `oy` at `p`, row `oy + 1` right
        // after it (ow floats on), only the lanes of `c`.
        unsafe { core::arch::x86_64::_mm512_mask_storeu_ps(p, c.lo | c.hi, v) }
    }
}

/// One register tile: `MB` output channels × `NX` vectors of `L::N`
/// output columns of one output row, the last vector's stores masked to
/// `t.last` lanes.
///
/// # Safety
/// The CPU has `L`'s instruction set (AVX2 + FMA for [`Ymm`], AVX-512 F
/// for [`Zmm`]); `t.buf` has `t.c · t.cs` floats of buffered rows (input
/// channel `ci`'s row for kernel row `ky` at `ci · cs + koff[ky]`, each
/// `koff[ky]` below `cs` by a row or more) plus [`SLACK`] floats after
/// them, and a row's tap `kx` reads its floats
/// `taps[kx] + L::N·NX` onward only where the output lane is below
/// `t.last` (1..=L::N) in the last vector (with [`Ymm`] the other lanes
/// may read the next row or the slack; [`Zmm`] does not read them); `t.w`
/// reaches `(c·kh·kw - 1)·ws + MB` floats, and `t.y` the `NX` vectors
/// (the last masked) of `MB` planes at stride `out_sz`; `t.bias` is null
/// or holds `MB` floats.
#[inline(always)]
unsafe fn tile<L: Lanes, const MB: usize, const NX: usize>(t: &Tile) {
    // SAFETY: the caller's contract (above) bounds every pointer below.
    unsafe {
        let ctx = L::ctx(t);
        let mut acc = [[L::zero(); NX]; MB];
        if !t.bias.is_null() {
            for (i, accr) in acc.iter_mut().enumerate() {
                *accr = [L::splat(t.bias.add(i)); NX];
            }
        }
        let mut wrow = t.w;
        let [k0, k1] = &t.koff;
        for ci in 0..t.c {
            let cbuf = t.buf.add(ci.wrapping_mul(t.cs));
            for ky in 0..t.kh {
                let brow = cbuf.add(*k0.get_unchecked(ky));
                // The next output row's (read by `Pair` only).
                let brow2 = cbuf.wrapping_add(*k1.get_unchecked(ky));
                row_taps::<L, MB, NX>(&mut acc, ctx, brow, brow2, wrow, t);
                // Past W after the last row (never read there):
                // wrapping, not `add`, whose result must be in bounds.
                wrow = wrow.wrapping_add(t.kw.wrapping_mul(t.ws));
            }
        }
        for (i, accr) in acc.iter().enumerate() {
            let yp = t.y.add(i.wrapping_mul(t.out_sz));
            for (j, &a) in accr.iter().enumerate() {
                let at = yp.add(j.wrapping_mul(L::N));
                if j.wrapping_add(1) == NX {
                    L::store_last(ctx, at, a);
                } else {
                    L::store(ctx, at, a);
                }
            }
        }
    }
}

/// The taps of one buffered row (`brow`, weights `wrow` of the tile's
/// first channel) added to a [`tile`]'s accumulators.
///
/// # Safety
/// As [`tile`], for a row it reads.
#[inline(always)]
unsafe fn row_taps<L: Lanes, const MB: usize, const NX: usize>(
    acc: &mut [[L::V; NX]; MB],
    ctx: L::Ctx,
    brow: *const f32,
    brow2: *const f32,
    wrow: *const f32,
    t: &Tile,
) {
    // SAFETY: the caller's contract bounds every pointer below.
    unsafe {
        for kx in 0..t.kw {
            let tap = *t.taps.get_unchecked(kx);
            let (bp, bp2) = (brow.add(tap), brow2.wrapping_add(tap));
            let mut v = [L::zero(); NX];
            for (j, vj) in v.iter_mut().enumerate() {
                let at = bp.add(j.wrapping_mul(L::N));
                *vj = if j.wrapping_add(1) == NX {
                    L::load_last(ctx, at, bp2)
                } else {
                    L::load(ctx, at)
                };
            }
            for (i, accr) in acc.iter_mut().enumerate() {
                let wv = L::splat(wrow.add(kx.wrapping_mul(t.ws).wrapping_add(i)));
                for (a, &vj) in accr.iter_mut().zip(&v) {
                    *a = L::fma(wv, vj, *a);
                }
            }
        }
    }
}

#[cfg(all(test, feature = "alloc"))]
mod tests {
    extern crate std;
    use super::*;
    use crate::ops::testing::rnd;
    use alloc::vec::Vec;

    /// The reference: the loops of the ONNX definition.
    fn reference(
        x: &[f32],
        w: &[f32],
        b: Option<&[f32]>,
        c: usize,
        m: usize,
        g: &Geom,
    ) -> Vec<f32> {
        let (h, wd, oh, ow, kh, kw) = (g.inp[1], g.inp[2], g.out[1], g.out[2], g.k[1], g.k[2]);
        let mut y = alloc::vec![0f32; m * oh * ow];
        for o in 0..m {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut s = b.map_or(0.0, |b| b[o]);
                    for ci in 0..c {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * g.s[1] + ky * g.d[1]) as isize - g.pb[1] as isize;
                                let ix = (ox * g.s[2] + kx * g.d[2]) as isize - g.pb[2] as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                s += w[((o * c + ci) * kh + ky) * kw + kx]
                                    * x[(ci * h + iy as usize) * wd + ix as usize];
                            }
                        }
                    }
                    y[(o * oh + oy) * ow + ox] = s;
                }
            }
        }
        y
    }

    #[allow(clippy::too_many_arguments)]
    fn geom(
        h: usize,
        w: usize,
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        pb: [usize; 2],
        pe: [usize; 2],
    ) -> Geom {
        let out = |i: usize, a: usize| (i + pb[a] + pe[a] - (k[a] - 1) * d[a] - 1) / s[a] + 1;
        Geom {
            inp: [1, h, w],
            out: [1, out(h, 0), out(w, 1)],
            k: [1, k[0], k[1]],
            s: [1, s[0], s[1]],
            d: [1, d[0], d[1]],
            pb: [0, pb[0], pb[1]],
            pe: [0, pe[0], pe[1]],
        }
    }

    /// c, m, h, w, and the window's k, s, d, pb, pe.
    type Case = (usize, usize, usize, usize, [[usize; 2]; 5]);

    #[test]
    fn matches_reference_on_edge_geometries() {
        check(&[
            // c, m, h, w, k, s, d, pb, pe
            (3, 16, 32, 32, [[3, 3], [1, 1], [1, 1], [1, 1], [1, 1]]),
            (16, 32, 16, 16, [[3, 3], [2, 2], [1, 1], [1, 1], [1, 1]]),
            (5, 7, 9, 13, [[3, 5], [1, 1], [1, 1], [0, 2], [1, 2]]),
            (2, 9, 11, 30, [[2, 3], [1, 3], [2, 1], [1, 0], [0, 3]]),
            (1, 64, 49, 10, [[10, 4], [2, 2], [1, 1], [4, 1], [5, 1]]),
            (4, 3, 8, 8, [[1, 1], [1, 1], [1, 1], [0, 0], [0, 0]]),
            (3, 5, 20, 41, [[3, 3], [2, 3], [2, 2], [2, 2], [2, 2]]),
            // 4071 of the 4088 buffered floats.
            (59, 6, 10, 21, [[3, 3], [1, 1], [1, 1], [1, 1], [1, 1]]),
            // A row of one vector and 8 channels per tile, and odd m.
            (8, 13, 8, 8, [[3, 3], [1, 1], [1, 1], [1, 1], [1, 1]]),
            // 16-lane tiles: two vectors (the last of 1 lane) by 12
            // channels; two vectors (the last of 4) by 10; one vector of 12
            // by 24 channels; 2 + 1 vectors with 50 channels (tiles of 10,
            // then of 17 and 16).
            (4, 24, 12, 17, [[3, 3], [1, 1], [1, 1], [1, 1], [1, 1]]),
            (3, 40, 6, 20, [[3, 3], [1, 1], [1, 1], [1, 1], [1, 1]]),
            (2, 24, 5, 12, [[3, 3], [1, 1], [1, 1], [1, 1], [1, 1]]),
            (3, 50, 4, 40, [[3, 3], [1, 1], [1, 1], [1, 1], [1, 1]]),
            // 16-lane row pairs (rows of 8 columns): 7 rows (three pairs and
            // one alone; split in 3, pairs and single rows in each task) by
            // 50 channels (tiles of 17, 17 and 16).
            (5, 50, 7, 8, [[3, 3], [1, 1], [1, 1], [1, 1], [1, 1]]),
            // Row reuse (`Ring`): stride-2 rows of 70 columns (phases of
            // 35: two blocks of 16 to 8, a pair and a float alone); 5
            // kernel rows at row stride 2 (3 rows kept per output row); a
            // row dilation of 2 (slot ky, no reuse); one kernel row; top
            // and bottom padding beyond the kernel (output rows wholly in
            // the padding).
            (3, 8, 9, 70, [[3, 3], [2, 2], [1, 1], [1, 1], [1, 1]]),
            (2, 6, 13, 37, [[5, 3], [2, 2], [1, 1], [2, 1], [2, 1]]),
            (2, 5, 12, 20, [[3, 3], [1, 1], [2, 1], [2, 1], [2, 1]]),
            (1, 4, 30, 9, [[1, 3], [1, 1], [1, 1], [0, 1], [0, 1]]),
            (2, 4, 5, 16, [[3, 3], [1, 1], [1, 1], [4, 1], [4, 1]]),
            // Row pairs (rows of 8 columns or fewer) on the ring: row
            // stride 2 (5 slots), row dilation 2 (2 · kh slots, no
            // reuse), one kernel row at row stride 8 whose 9 slots do not
            // fit the buffer (120 channels: 2 slots, no reuse), 5 rows.
            (3, 20, 15, 15, [[3, 3], [2, 2], [1, 1], [1, 1], [1, 1]]),
            (4, 30, 11, 8, [[3, 3], [1, 1], [2, 1], [1, 1], [1, 1]]),
            (120, 5, 40, 8, [[1, 1], [8, 1], [1, 1], [0, 0], [0, 0]]),
            (2, 7, 5, 7, [[5, 3], [1, 1], [1, 1], [2, 1], [2, 1]]),
        ]);
    }

    /// [`pack`]: tap-major, output channel minor; a length that is not
    /// `m` rows of `wk` (or no taps) is refused.
    #[test]
    fn packs_tap_major() {
        let w: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let mut out = [0f32; 12];
        assert_eq!(pack(&w, 3, 4, &mut out), Some(()));
        assert_eq!(out, [0., 4., 8., 1., 5., 9., 2., 6., 10., 3., 7., 11.]);
        assert_eq!(pack(&w, 4, 4, &mut out), None);
        assert_eq!(pack(&w, 3, 4, &mut out[1..]), None);
        assert_eq!(pack(&[], 3, 0, &mut []), None);
    }

    /// Geometries small enough for Miri (CI runs this under it with AVX2,
    /// and with AVX-512): a row of 11 columns (8 + a last vector of 3
    /// lanes; one 16-lane vector masked to 11), 20 columns by 13 channels
    /// (8 + 8 + 4 in one tile; 16 + 4), column stride 2 with padding, and a
    /// 1-column row (one lane of one vector).
    #[test]
    fn matches_reference_on_small_geometries() {
        check(&[
            (2, 3, 3, 11, [[3, 3], [1, 1], [1, 1], [1, 1], [1, 1]]),
            (1, 13, 2, 20, [[1, 3], [1, 1], [1, 1], [0, 1], [0, 1]]),
            (2, 2, 3, 9, [[2, 3], [1, 2], [1, 1], [0, 1], [1, 1]]),
            (3, 2, 2, 1, [[1, 1], [1, 1], [1, 1], [0, 0], [0, 0]]),
            // Row pairs of 6 and of 4 columns (row stride 2, an odd row
            // count: the last row alone).
            (2, 3, 6, 6, [[3, 3], [1, 1], [1, 1], [1, 1], [1, 1]]),
            (2, 3, 9, 7, [[3, 3], [2, 2], [1, 1], [1, 1], [1, 1]]),
        ]);
    }

    /// Runs every case with and without bias, on one worker and split among
    /// 3, with 8-lane tiles and (where the CPU has AVX-512 F) 16-lane ones,
    /// against [`reference`].
    fn check(cases: &[Case]) {
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            std::eprintln!("skipped: no AVX2 + FMA");
            return;
        }
        let mut seed = 7u64;
        for &(c, m, h, wd, [k, s, d, pb, pe]) in cases {
            let g = geom(h, wd, k, s, d, pb, pe);
            seed += 3;
            let x = rnd(c * h * wd, seed);
            let w = rnd(m * c * k[0] * k[1], seed + 1);
            let b = rnd(m, seed + 2);
            let mut wp = alloc::vec![0f32; w.len()];
            assert_eq!(pack(&w, m, c * k[0] * k[1], &mut wp), Some(()));
            for bias in [None, Some(&b[..])] {
                let want = reference(&x, &w, bias, c, m, &g);
                // One worker, and the rows split among 3 std threads.
                for (workers, wide) in [(1, false), (3, false), (1, true), (3, true)] {
                    if wide && !std::is_x86_feature_detected!("avx512f") {
                        continue;
                    }
                    let _provider = (workers > 1).then(|| crate::par::testing::with(workers));
                    let mut got = alloc::vec![f32::NAN; want.len()];
                    let op = Conv {
                        x: &x,
                        w: &wp,
                        b: bias,
                        c,
                        m,
                        g: &g,
                    };
                    // SAFETY: AVX2 and FMA detected above.
                    let ok = unsafe { op.run_on(&mut got, workers, wide) };
                    assert!(ok, "{c} {m} {h} {wd} {k:?}");
                    for (i, (a, e)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (a - e).abs() <= 1e-5 + 1e-4 * e.abs(),
                            "case {c} {m} {h}×{wd} k{k:?} s{s:?} workers {workers}: y[{i}] {a} vs {e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn refuses_short_operands_and_other_kernels() {
        let g = geom(8, 8, [3, 3], [1, 1], [1, 1], [1, 1], [1, 1]);
        let (x, w) = (alloc::vec![0f32; 2 * 64], alloc::vec![0f32; 4 * 2 * 9]);
        let mut y = alloc::vec![0f32; 4 * 64];
        if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
            return;
        }
        let run = |x: &[f32], w: &[f32], b: Option<&[f32]>, y: &mut [f32], c, m, g: &Geom| {
            // SAFETY: AVX2 and FMA detected above.
            unsafe { Conv { x, w, b, c, m, g }.run_on(y, 1, false) }
        };
        assert!(run(&x, &w, None, &mut y, 2, 4, &g));
        assert!(!run(&x[1..], &w, None, &mut y, 2, 4, &g));
        assert!(!run(&x, &w[1..], None, &mut y, 2, 4, &g));
        assert!(!run(&x, &w, Some(&[0.0; 3]), &mut y, 2, 4, &g));
        assert!(!run(&x, &w, None, &mut y[1..], 2, 4, &g));
        // A 3-D window, and a kernel row wider than MAX_KW.
        let mut g3 = g;
        g3.inp[0] = 2;
        assert!(!run(&x, &w, None, &mut y, 1, 4, &g3));
        let wide = geom(1, 40, [1, 17], [1, 1], [1, 1], [0, 0], [0, 0]);
        assert!(!run(
            &[0.0; 40],
            &[0.0; 17],
            None,
            &mut [0.0; 24],
            1,
            1,
            &wide
        ));
        // A kernel taller than MAX_KH.
        let tall = geom(20, 8, [17, 1], [1, 1], [1, 1], [0, 0], [0, 0]);
        assert!(!run(
            &[0.0; 160],
            &[0.0; 17 * 4],
            None,
            &mut [0.0; 4 * 32],
            1,
            4,
            &tall
        ));
        // Input rows past the buffer: 60 channels × 3 rows × 23 floats.
        let big = geom(10, 21, [3, 3], [1, 1], [1, 1], [1, 1], [1, 1]);
        let (xb, wb) = (alloc::vec![0f32; 60 * 210], alloc::vec![0f32; 60 * 9]);
        assert!(!run(
            &xb,
            &wb,
            None,
            &mut alloc::vec![0f32; 210],
            60,
            1,
            &big
        ));
    }
}
