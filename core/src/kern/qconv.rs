//! Integer convolution, matrix product and requantize-and-clamp: the
//! kernels of the fused QDQ nodes `mote.QConv`, `mote.QMatMul` and
//! `mote.QRequant` (see `ops::qdq` for the arithmetic they implement).

// Integer arithmetic is checked, saturating or wrapping by name (issue 8):
// `check_conv` (and `qmatmul`'s checks) take the operands' sizes as
// checked products against the slices, with the window reach
// (`Geom::reach_ok`); offsets under those bounds wrap by name. Values and
// zero points are 8-bit: differences and products fit i32, and sums wrap
// as the reference's modulo-2^32 sums.

use super::par::SharedMut;
use super::qcol;
use super::qdw;
use super::qgemm::{self, zero_points_fit, QIo, QMatA, Zero};
use super::requant::Requant;
use super::{check_len, out_of_bounds, tap_in, valid_range, win, win_mut, Geom, QInt};
use crate::error::Result;
use core::num::NonZeroUsize;

/// Geometry of one integer convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IntConv {
    pub batch: usize,
    /// Input channels.
    pub c: usize,
    /// Output channels.
    pub m: usize,
    pub group: usize,
    pub g: Geom,
}

impl IntConv {
    /// One input plane per output channel.
    pub(crate) fn is_depthwise(&self) -> bool {
        self.group == self.c && self.m == self.c
    }
}

/// Output zero point, type bounds and fused activation bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OutQ {
    pub zy: i32,
    pub lo: i32,
    pub hi: i32,
}

/// Parameters of a QConv with borrowed per-channel arrays (`m` each).
#[derive(Clone, Copy, Debug)]
pub(crate) struct QConvView<'a> {
    pub p: IntConv,
    pub zx: i32,
    pub zw: &'a [i32],
    pub bias: &'a [i32],
    pub mult: &'a [Requant],
    pub out: OutQ,
    /// The weights packed for the integer GEMM ([`pack_weights`]), or
    /// empty (compiled models, depthwise, reference kernels).
    pub packed: &'a [i32],
}

/// Parameters of a QMatMul (`y[rows, n] = a[rows, k] · b`), per-column
/// arrays of `n` each.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QMmView<'a> {
    pub rows: usize,
    pub k: usize,
    pub n: usize,
    /// B is `[n, k]` (else `[k, n]`).
    pub trans_b: bool,
    pub za: i32,
    pub zb: &'a [i32],
    pub bias: &'a [i32],
    pub mult: &'a [Requant],
    pub out: OutQ,
}

/// Kernel taps `[lo, hi)` of spatial axis `ax` that land inside the input
/// for output position `o` (the rest read padding, whose `x - zx` is 0).
#[inline]
pub(super) fn tap_range(g: &Geom, ax: usize, o: usize) -> (usize, usize) {
    let at = |a: &[usize; super::MAX_SPATIAL]| a.get(ax).copied().unwrap_or(0);
    let (s, d, pb, n, k) = (at(&g.s), at(&g.d).max(1), at(&g.pb), at(&g.inp), at(&g.k));
    // o < out: o·s does not wrap (`Geom::reach_ok`, checked with the
    // convolution).
    let start = o.wrapping_mul(s); // input coordinate of tap 0, plus pb
    let lo = if start >= pb {
        0
    } else {
        pb.wrapping_sub(start).div_ceil(d)
    };
    // tap t is inside when start + t·d - pb < n, i.e. t·d < n + pb - start.
    // n + pb <= n + pb + pe, which `Geom::reach_ok` computed without overflow.
    let hi = match n.wrapping_add(pb).checked_sub(start) {
        Some(room) => room.div_ceil(d).min(k),
        None => 0,
    };
    (lo, hi.max(lo))
}

#[inline]
pub(super) fn finish<Y: QInt>(acc: i32, r: &Requant, o: &OutQ) -> Y {
    Y::from_sat(r.apply_clamp(acc, o.zy, o.lo, o.hi))
}

/// [`finish`] over a row of sums with one bias and multiplier.
#[inline(always)]
pub(super) fn finish_row<Y: QInt>(yrow: &mut [Y], acc: &[i32], bias: i32, r: &Requant, o: &OutQ) {
    r.apply_row(bias, acc, yrow, o.zy, o.lo, o.hi);
}

/// The operands against the parameters, with checked products: after it,
/// batch·c·in, m·(c / group)·k and batch·m·out fit `usize` (they are the
/// slices' lengths) and every window stays within the padded input
/// (`Geom::reach_ok`), so the kernels' offsets under them wrap by name.
fn check_conv<X, W, Y>(x: &[X], w: &[W], y: &[Y], q: &QConvView<'_>) -> Result<()> {
    let p = &q.p;
    let overflow = || crate::Error::new(crate::ErrorKind::Overflow);
    let (in_sz, out_sz, k_sz) = p.g.checked_sizes().ok_or_else(overflow)?;
    let cg = p.c.checked_div(p.group).unwrap_or(p.c);
    let len3 = |a: usize, b: usize, c: usize| {
        a.checked_mul(b)
            .and_then(|v| v.checked_mul(c))
            .ok_or_else(overflow)
    };
    check_len(x.len(), len3(p.batch, p.c, in_sz)?)?;
    check_len(w.len(), len3(p.m, cg, k_sz)?)?;
    check_len(y.len(), len3(p.batch, p.m, out_sz)?)?;
    check_len(q.zw.len(), p.m)?;
    check_len(q.bias.len(), p.m)?;
    check_len(q.mult.len(), p.m)?;
    if p.group == 0 || !p.c.is_multiple_of(p.group) || !p.m.is_multiple_of(p.group) {
        return Err(crate::Error::new(crate::ErrorKind::Shape(
            "QConv: channels must divide into groups",
        )));
    }
    geom_ok(&p.g)?;
    if !p.g.reach_ok() {
        return Err(crate::Error::new(crate::ErrorKind::Shape(
            "QConv: a window reaches past the padded input",
        )));
    }
    Ok(())
}

/// The kernels find in-bounds taps by division by the stride and the
/// dilation: a geometry read from a file must have both nonzero.
pub(crate) fn geom_ok(g: &Geom) -> Result<()> {
    if g.s.iter().chain(&g.d).any(|&v| v == 0) {
        return Err(crate::Error::new(crate::ErrorKind::Shape(
            "window strides and dilations must be >= 1",
        )));
    }
    Ok(())
}

/// Unit-stride rows as slices (vectorized on hosts). Off on
/// microcontrollers, whose instruction counts in README were measured on
/// the strided loop.
const CONTIGUOUS: bool = cfg!(target_pointer_width = "64");

/// Scratch of the banded depthwise kernel (32-bit targets only).
const BAND: usize = if CONTIGUOUS { 0 } else { qcol::DW_BAND };

/// Output positions of one row accumulated at a time, on the stack.
const ROW: usize = 64;
/// Fewest rows of a QMatMul run as a GEMM (below, packing B costs more
/// than the product saves).
const MM_ROWS: usize = 4;
/// Kernel columns whose in-bounds output ranges are precomputed.
const KCOLS: usize = 16;

/// Grouped integer convolution. Per output channel and output row, a strip
/// of up to [`ROW`] accumulators takes each weight once: for each input
/// plane and kernel tap, the in-bounds output columns are found by
/// division (`valid_range`) and the inner loop is a strided
/// multiply-accumulate with no bounds tests.
pub(crate) fn qconv<X: QInt, W: QInt, Y: QInt>(
    x: &[X],
    w: &[W],
    y: &mut [Y],
    q: &QConvView<'_>,
) -> Result<()> {
    check_conv(x, w, y, q)?;
    if fast(q) {
        return conv_gemm(x, w, y, q);
    }
    if !CONTIGUOUS && qcol::fits(q) {
        // 32-bit targets: the column kernel (SMLAD on Cortex-M4/M7).
        return qcol::conv::<X, W, Y, { qcol::DSP }>(x, w, y, q).ok_or_else(out_of_bounds);
    }
    qconv_body(x, w, y, q).ok_or_else(out_of_bounds)
}

/// Whether the blocked integer kernels take this convolution: on 64-bit
/// hosts unless the reference kernels are forced, with zero points that
/// keep the differences within i16 pairs (see [`qgemm`]).
pub(super) fn fast(q: &QConvView<'_>) -> bool {
    fast_for(q.zx, q.zw)
}

/// [`fast`] from the zero points alone (prepare, before the view exists).
fn fast_for(zx: i32, zw: &[i32]) -> bool {
    CONTIGUOUS && qgemm::enabled() && zero_points_fit(&[zx]) && zero_points_fit(zw)
}

/// The weights of a (not depthwise) convolution packed for [`conv_gemm`],
/// group after group; empty when the blocked integer kernels will not run
/// it. Built once at prepare: about two bytes per weight, and no tile
/// packing left in the run.
#[cfg(feature = "alloc")]
pub(crate) fn pack_weights<W: QInt>(
    w: &[W],
    p: &IntConv,
    zx: i32,
    zw: &[i32],
) -> alloc::vec::Vec<i32> {
    let (Some(cg), Some(mg)) = (p.c.checked_div(p.group), p.m.checked_div(p.group)) else {
        return alloc::vec::Vec::new();
    };
    let kk = p.g.checked_sizes().and_then(|(_, _, k)| cg.checked_mul(k));
    let (Some(kk), Some(group_w)) = (kk, kk.and_then(|kk| mg.checked_mul(kk))) else {
        return alloc::vec::Vec::new();
    };
    if !fast_for(zx, zw)
        || p.is_depthwise()
        || Some(w.len()) != p.m.checked_mul(kk)
        || zw.len() != p.m
        || group_w == 0
    {
        return alloc::vec::Vec::new();
    }
    let quads = qgemm::quads_now();
    let Some(cap) = p.group.checked_mul(qgemm::packed_len(quads, mg, kk)) else {
        return alloc::vec::Vec::new();
    };
    let mut out = alloc::vec::Vec::with_capacity(cap);
    // `w` holds `group` blocks of `mg × kk` weights, `zw` of `mg` zero
    // points (checked above).
    for (wg, zg) in w
        .chunks_exact(group_w)
        .zip(zw.chunks_exact(mg))
        .take(p.group)
    {
        let a = QMatA {
            a: wg,
            lda: kk,
            z: Zero::Rows(zg),
            packed: &[],
        };
        out.extend(qgemm::pack_a(mg, kk, &a, quads));
    }
    out
}

/// Conv's patch matrix of one image and group for [`qgemm`]:
/// `B(p, j) = x - zx` at input channel, kernel tap `p` and output position
/// `j` (0 over the padding), and the group's output planes.
struct ConvIo<'a, X, Y> {
    /// The group's input planes.
    x: &'a [X],
    zx: i32,
    g: &'a Geom,
    /// `g`'s sizes (checked by `check_conv`): input plane, output plane,
    /// kernel taps.
    sz: (usize, usize, usize),
    /// The group's output planes.
    y: SharedMut<'a, Y>,
    bias: &'a [i32],
    mult: &'a [Requant],
    out: OutQ,
}

impl<X: QInt, Y: QInt> QIo for ConvIo<'_, X, Y> {
    #[inline(always)]
    fn b_row(&self, p: usize, j0: usize, out: &mut [i16]) {
        let g = self.g;
        let [_, o1, o2] = g.out;
        let [i0, i1, i2] = g.inp;
        let [_, k1, k2] = g.k;
        let (in_sz, _, k_sz) = self.sz;
        let ([s0, s1, s2], [d0, d1, d2], [pb0, pb1, pb2]) = (g.s, g.d, g.pb);
        out.fill(0);
        let nz = NonZeroUsize::new;
        // k1 · k2 <= k_sz and o1 · o2 <= out_sz (checked products).
        let (Some(k_nz), Some(k12), Some(k1_nz), Some(k2_nz), Some(o12), Some(o1_nz), Some(o2_nz)) = (
            nz(k_sz),
            nz(k1.wrapping_mul(k2)),
            nz(k1),
            nz(k2),
            nz(o1.wrapping_mul(o2)),
            nz(o1),
            nz(o2),
        ) else {
            return;
        };
        // Offsets wrap by name under `check_conv`'s bounds: p < cg·k_sz
        // (c < cg planes of in_sz), output positions j0 + j below out_sz,
        // window indices under the checked reach (the `- pb` wraps on
        // purpose and fails the `< i` tests).
        let (c, r) = (p / k_nz, p % k_nz);
        let (kd, kh, kw) = (r / k12, (r / k2_nz) % k1_nz, r % k2_nz);
        let Some(plane) = win(self.x, c.wrapping_mul(in_sz), in_sz) else {
            return;
        };
        let zx = self.zx;
        if k_sz == 1 && g.s == [1; 3] && g.pb == [0; 3] && g.inp == g.out {
            // Pointwise: the row is the plane itself.
            if let Some(src) = win(plane, j0, out.len()) {
                for (o, v) in out.iter_mut().zip(src) {
                    *o = v.get().wrapping_sub(zx) as i16;
                }
            }
            return;
        }
        // The columns of a whole output row whose tap lands inside the
        // input row (the same for every row), and the output position of
        // column 0: divisions once per call, not per run of a row (KWS's
        // first convolution packs 25 runs of 5 columns per B row).
        let tap = kw.wrapping_mul(d2);
        let (clo, chi) = valid_range(o2, s2, tap, pb2, i2);
        let ow0 = j0 % o2_nz;
        let (mut od, mut oh) = (j0 / o12, (j0 / o2_nz) % o1_nz);
        let mut ow = ow0;
        let mut j = 0usize;
        while j < out.len() {
            let len = o2.wrapping_sub(ow).min(out.len().wrapping_sub(j));
            // in = out * stride + k * dilation - pad, in [0, inp).
            let (id, ih) = (tap_in(od, s0, kd, d0, pb0), tap_in(oh, s1, kh, d1, pb1));
            // Columns lo..hi of this run (ow + t in clo..chi, t < len).
            let (lo, hi) = (clo.saturating_sub(ow), chi.saturating_sub(ow).min(len));
            if id < i0 && ih < i1 && lo < hi {
                // Columns lo..hi of this run read inside the input row
                // (`valid_range`); the row lies in the plane (`id`, `ih`
                // in range), so a miss leaves the zeros (never happens).
                let first = ow.wrapping_add(lo).wrapping_mul(s2).wrapping_add(tap);
                let row = id.wrapping_mul(i1).wrapping_add(ih).wrapping_mul(i2);
                if let (Some(line), Some(dst)) = (
                    win(plane, row, i2),
                    win_mut(out, j.wrapping_add(lo), hi.wrapping_sub(lo)),
                ) {
                    let cols = line.get(first.wrapping_sub(pb2)..).unwrap_or(&[]);
                    if s2 == 1 {
                        // Contiguous: a plain zip vectorizes.
                        for (d, v) in dst.iter_mut().zip(cols) {
                            *d = v.get().wrapping_sub(zx) as i16;
                        }
                    } else {
                        for (d, v) in dst.iter_mut().zip(cols.iter().step_by(s2.max(1))) {
                            *d = v.get().wrapping_sub(zx) as i16;
                        }
                    }
                }
            }
            j = j.wrapping_add(len);
            // The next run starts a row: oh + 1 <= o1, od + 1 <= batch of
            // output volumes (positions stay below out_sz).
            ow = 0;
            oh = oh.wrapping_add(1);
            if oh == o1 {
                oh = 0;
                od = od.wrapping_add(1);
            }
        }
    }

    fn b_u8_zero(&self) -> Option<i32> {
        (X::LO..=X::HI)
            .contains(&self.zx)
            .then(|| self.zx.wrapping_sub(X::LO))
    }

    #[inline(always)]
    fn store(&self, i: usize, j0: usize, acc: &[i32]) {
        let out_sz = self.sz.1;
        let (Some(&b), Some(r)) = (self.bias.get(i), self.mult.get(i)) else {
            return;
        };
        // i < mg, j0 < out_sz: inside the group's mg · out_sz outputs.
        let at = i.wrapping_mul(out_sz).wrapping_add(j0);
        // SAFETY: `qgemm` stores each (row, column) once, from the task
        // that owns the column (`QIo::store`): no other live slice overlaps.
        if let Some(yrow) = unsafe { self.y.slice(at, acc.len()) } {
            finish_row(yrow, acc, b, r, &self.out);
        }
    }
}

/// [`qconv`] as one integer GEMM per image and group: weights
/// `[mg, cg·k]` times the patch matrix `[cg·k, out positions]`.
fn conv_gemm<X: QInt, W: QInt, Y: QInt>(
    x: &[X],
    w: &[W],
    y: &mut [Y],
    q: &QConvView<'_>,
) -> Result<()> {
    let p = &q.p;
    let g = &p.g;
    let sz = g.checked_sizes().ok_or_else(out_of_bounds)?;
    let (in_sz, out_sz, k_sz) = sz;
    let group = NonZeroUsize::new(p.group).ok_or_else(out_of_bounds)?;
    let (cg, mg) = (p.c / group, p.m / group);
    // `check_conv` checked batch·c·in_sz, m·cg·k_sz and batch·m·out_sz
    // against the slices: with ni < batch and grp < group the offsets
    // below are under them and wrap by name only.
    let kk = cg.wrapping_mul(k_sz);
    for ni in 0..p.batch {
        for grp in 0..p.group {
            let oc0 = grp.wrapping_mul(mg);
            let per_group = qgemm::packed_len(qgemm::packed_quads(q.packed), mg, kk);
            let packed = grp
                .checked_mul(per_group)
                .and_then(|at| win(q.packed, at, per_group));
            let (Some(wg), Some(zw), Some(bias), Some(mult)) = (
                win(w, oc0.wrapping_mul(kk), mg.wrapping_mul(kk)),
                win(q.zw, oc0, mg),
                win(q.bias, oc0, mg),
                win(q.mult, oc0, mg),
            ) else {
                return Err(out_of_bounds());
            };
            let a = QMatA {
                a: wg,
                lda: kk,
                z: Zero::Rows(zw),
                packed: packed.unwrap_or(&[]),
            };
            let ch0 = ni.wrapping_mul(p.c).wrapping_add(grp.wrapping_mul(cg));
            let xg = win(x, ch0.wrapping_mul(in_sz), cg.wrapping_mul(in_sz))
                .ok_or_else(out_of_bounds)?;
            let m0 = ni.wrapping_mul(p.m).wrapping_add(oc0);
            let yg = win_mut(y, m0.wrapping_mul(out_sz), mg.wrapping_mul(out_sz))
                .ok_or_else(out_of_bounds)?;
            let io = ConvIo {
                x: xg,
                zx: q.zx,
                g,
                sz,
                y: SharedMut::new(yg),
                bias,
                mult,
                out: q.out,
            };
            if !qgemm::qgemm(mg, out_sz, kk, a, &io) {
                return Err(crate::Error::new(crate::ErrorKind::Internal(
                    "QConv: integer GEMM refused its operands",
                )));
            }
        }
    }
    Ok(())
}

/// [`qconv`] after its checks.
#[inline(always)]
fn qconv_body<X: QInt, W: QInt, Y: QInt>(
    x: &[X],
    w: &[W],
    y: &mut [Y],
    q: &QConvView<'_>,
) -> Option<()> {
    let p = &q.p;
    let g = &p.g;
    let (in_sz, out_sz, k_sz) = g.checked_sizes()?;
    let cg = p.c.checked_div(p.group)?;
    // m = 0 (no output channel) has nothing to compute.
    let Some(mg) = NonZeroUsize::new(p.m.checked_div(p.group)?) else {
        return Some(());
    };
    let [o0, o1, o2] = g.out;
    let (s2, d2, pb2, n2) = (g.s[2], g.d[2], g.pb[2], g.inp[2]);
    // Index arithmetic wraps by name under `check_conv`'s bounds: the
    // slices' lengths batch·c·in_sz, m·cg·k_sz and batch·m·out_sz, and
    // the window reach (taps inside `tap_range` and `valid_range` land in
    // the input, so `o·s + k·d - pb` neither wraps nor leaves the plane).
    let wrap = |a: usize, b: usize, c: usize| a.wrapping_mul(b).wrapping_add(c);
    // In-bounds output columns of each kernel column (the same on every row).
    let mut cols = [(0usize, 0usize); KCOLS];
    for (kw, c) in cols.iter_mut().enumerate().take(g.k[2]) {
        *c = valid_range(o2, s2, kw.wrapping_mul(d2), pb2, n2);
    }
    let col = |kw: usize| match cols.get(kw) {
        Some(&c) if kw < g.k[2] => c,
        _ => valid_range(o2, s2, kw.wrapping_mul(d2), pb2, n2),
    };
    let (cg_in, cg_k) = (cg.wrapping_mul(in_sz), cg.wrapping_mul(k_sz));
    let mut accs = [0i32; ROW];
    for ni in 0..p.batch {
        for oc in 0..p.m {
            let grp = oc / mg;
            let xg = win(
                x,
                wrap(ni, p.c, grp.wrapping_mul(cg)).wrapping_mul(in_sz),
                cg_in,
            )?;
            let wk = win(w, oc.wrapping_mul(cg_k), cg_k)?;
            let (zw, b, r) = (*q.zw.get(oc)?, *q.bias.get(oc)?, q.mult.get(oc)?);
            let yo = win_mut(y, wrap(ni, p.m, oc).wrapping_mul(out_sz), out_sz)?;
            for od in 0..o0 {
                let rd = tap_range(g, 0, od);
                for oh in 0..o1 {
                    let rh = tap_range(g, 1, oh);
                    let mut ow0 = 0usize;
                    while ow0 < o2 {
                        let wlen = ROW.min(o2.wrapping_sub(ow0));
                        let acc = accs.get_mut(..wlen)?;
                        acc.fill(b);
                        for c in 0..cg {
                            let xp = win(xg, c.wrapping_mul(in_sz), in_sz)?;
                            let wp = win(wk, c.wrapping_mul(k_sz), k_sz)?;
                            for kd in rd.0..rd.1 {
                                let id = tap_in(od, g.s[0], kd, g.d[0], g.pb[0]);
                                for kh in rh.0..rh.1 {
                                    let ih = tap_in(oh, g.s[1], kh, g.d[1], g.pb[1]);
                                    let xrow =
                                        win(xp, wrap(id, g.inp[1], ih).wrapping_mul(n2), n2)?;
                                    let wrow =
                                        win(wp, wrap(kd, g.k[1], kh).wrapping_mul(g.k[2]), g.k[2])?;
                                    for (kw, wv) in wrow.iter().enumerate() {
                                        let wv = wv.get().wrapping_sub(zw);
                                        if wv == 0 {
                                            continue;
                                        }
                                        let (lo, hi) = col(kw);
                                        let (lo, hi) =
                                            (lo.max(ow0), hi.min(ow0.wrapping_add(wlen)));
                                        let tap = kw.wrapping_mul(d2);
                                        if CONTIGUOUS && s2 == 1 && lo < hi {
                                            // Unit stride: slices the compiler
                                            // vectorizes (same exact sums).
                                            let from = lo.wrapping_add(tap).wrapping_sub(pb2);
                                            let n = hi.wrapping_sub(lo);
                                            let xs = win(xrow, from, n)?;
                                            let wv = wv as i16 as i32;
                                            let accs = win_mut(acc, lo.wrapping_sub(ow0), n)?;
                                            for (a, xv) in accs.iter_mut().zip(xs) {
                                                let xv = xv.get().wrapping_sub(q.zx) as i16 as i32;
                                                *a = a.wrapping_add(xv.wrapping_mul(wv));
                                            }
                                            continue;
                                        }
                                        for ow in lo..hi {
                                            let iw = wrap(ow, s2, tap).wrapping_sub(pb2);
                                            let xv = xrow.get(iw)?.get().wrapping_sub(q.zx);
                                            let a = acc.get_mut(ow.wrapping_sub(ow0))?;
                                            *a = a.wrapping_add(xv.wrapping_mul(wv));
                                        }
                                    }
                                }
                            }
                        }
                        let at = wrap(wrap(od, o1, oh), o2, ow0);
                        let yrow = win_mut(yo, at, wlen)?;
                        for (yv, a) in yrow.iter_mut().zip(acc.iter()) {
                            *yv = finish(*a, r, &q.out);
                        }
                        ow0 = ow0.wrapping_add(wlen);
                    }
                }
            }
        }
    }
    Some(())
}

/// Depthwise convolution (one input plane per output channel): the taps
/// of a row are found once per output row and column, and the weights of
/// one channel stay hot across its whole plane.
pub(crate) fn qconv_dw<X: QInt, W: QInt, Y: QInt>(
    x: &[X],
    w: &[W],
    y: &mut [Y],
    q: &QConvView<'_>,
) -> Result<()> {
    check_conv(x, w, y, q)?;
    let p = &q.p;
    if !p.is_depthwise() {
        return Err(crate::Error::new(crate::ErrorKind::Internal(
            "depthwise kernel on a grouped convolution",
        )));
    }
    if fast(q) {
        qdw::planes(x, w, y, q);
        return Ok(());
    }
    let g = &p.g;
    let (in_sz, out_sz, k_sz) = g.checked_sizes().ok_or_else(out_of_bounds)?;
    let mut band = [0i16; BAND];
    // Plane offsets under the lengths `check_conv` checked (ni < batch,
    // c < channels): they wrap by name only.
    for ni in 0..p.batch {
        for c in 0..p.c {
            let plane = ni.wrapping_mul(p.c).wrapping_add(c);
            let xp = win(x, plane.wrapping_mul(in_sz), in_sz).ok_or_else(out_of_bounds)?;
            let yo = win_mut(y, plane.wrapping_mul(out_sz), out_sz).ok_or_else(out_of_bounds)?;
            let wp = win(w, c.wrapping_mul(k_sz), k_sz).ok_or_else(out_of_bounds)?;
            if !CONTIGUOUS && qcol::dw_fits(q) {
                // 32-bit targets: the banded kernel.
                qcol::dw_plane(xp, wp, yo, c, q, &mut band).ok_or_else(out_of_bounds)?;
                continue;
            }
            dw_plane(xp, wp, yo, c, q).ok_or_else(out_of_bounds)?;
        }
    }
    Ok(())
}

/// One channel of a depthwise convolution.
#[inline]
pub(super) fn dw_plane<X: QInt, W: QInt, Y: QInt>(
    xp: &[X],
    wp: &[W],
    yo: &mut [Y],
    c: usize,
    q: &QConvView<'_>,
) -> Option<()> {
    let g = &q.p.g;
    let [o0, o1, o2] = g.out;
    let (zw, b, r) = (*q.zw.get(c)?, *q.bias.get(c)?, q.mult.get(c)?);
    let wrap = |a: usize, b: usize, c: usize| a.wrapping_mul(b).wrapping_add(c);
    let mut yo = yo.iter_mut();
    for od in 0..o0 {
        let rd = tap_range(g, 0, od);
        for oh in 0..o1 {
            let rh = tap_range(g, 1, oh);
            for ow in 0..o2 {
                let rw = tap_range(g, 2, ow);
                let mut acc = b;
                // Taps from `tap_range` land inside the input (the window
                // reach is checked by `check_conv`): the indices below
                // neither wrap nor leave the plane; they wrap by name.
                for kd in rd.0..rd.1 {
                    let id = tap_in(od, g.s[0], kd, g.d[0], g.pb[0]);
                    for kh in rh.0..rh.1 {
                        let ih = tap_in(oh, g.s[1], kh, g.d[1], g.pb[1]);
                        let xrow =
                            win(xp, wrap(id, g.inp[1], ih).wrapping_mul(g.inp[2]), g.inp[2])?;
                        let wrow = win(wp, wrap(kd, g.k[1], kh).wrapping_mul(g.k[2]), g.k[2])?;
                        let iw0 = tap_in(ow, g.s[2], rw.0, g.d[2], g.pb[2]);
                        for (t, kw) in (rw.0..rw.1).enumerate() {
                            let iw = wrap(t, g.d[2], iw0);
                            let xv = xrow.get(iw)?.get().wrapping_sub(q.zx);
                            let wv = wrow.get(kw)?.get().wrapping_sub(zw);
                            acc = acc.wrapping_add(xv.wrapping_mul(wv));
                        }
                    }
                }
                *yo.next()? = finish(acc, r, &q.out);
            }
        }
    }
    Some(())
}

/// Largest plane (elements) a depthwise convolution copies to the stack to
/// run in place.
pub(crate) const INPLACE_PLANE: usize = 1024;
/// Most channels of an in-place pointwise convolution.
pub(crate) const INPLACE_CHANNELS: usize = 256;

/// Whether a convolution can write its output over its input (same
/// bytes, same element type): a depthwise one that keeps the spatial size
/// (each output plane needs only its own input plane, copied to the stack
/// first), or a pointwise one with as many outputs as inputs (each pixel's
/// outputs need only that pixel's inputs, gathered first) — what TinyEngine
/// does to go below the two-buffer bound.
pub(crate) fn can_conv_in_place(p: &IntConv) -> bool {
    let g = &p.g;
    let same = g.inp == g.out;
    let dw = p.is_depthwise() && same && g.in_size() <= INPLACE_PLANE;
    let pw = p.group == 1
        && p.m == p.c
        && p.c <= INPLACE_CHANNELS
        && same
        && g.k == [1; 3]
        && g.s == [1; 3]
        && g.pb == [0; 3]
        && g.pe == [0; 3];
    dw || pw
}

/// [`qconv`] / [`qconv_dw`] in place: `y` holds the input on entry (see
/// [`can_conv_in_place`]). Uses at most 1 KB of stack.
pub(crate) fn qconv_in_place<T: QInt, W: QInt>(
    w: &[W],
    y: &mut [T],
    q: &QConvView<'_>,
) -> Result<()> {
    let p = &q.p;
    if !can_conv_in_place(p) {
        return Err(crate::Error::new(crate::ErrorKind::Internal(
            "convolution cannot run in place",
        )));
    }
    // The checks of `check_conv`, with x = y (the same size: m = c and
    // the same spatial sizes, by `can_conv_in_place`); below them offsets
    // wrap by name.
    check_conv(y, w, y, q)?;
    let sz = p.g.checked_sizes().ok_or_else(out_of_bounds)?.0;
    let mut buf = [T::default(); INPLACE_PLANE];
    if p.is_depthwise() && sz <= INPLACE_PLANE && fast(q) {
        qdw::planes_in_place(w, y, q);
        return Ok(());
    }
    if p.is_depthwise() && sz <= INPLACE_PLANE {
        let k_sz = p.g.checked_sizes().ok_or_else(out_of_bounds)?.2;
        let Some(channels) = NonZeroUsize::new(p.c) else {
            return Ok(());
        };
        let mut band = [0i16; BAND];
        for (c, plane) in y.chunks_exact_mut(sz.max(1)).enumerate() {
            let c = c % channels;
            let saved = buf.get_mut(..plane.len()).ok_or_else(out_of_bounds)?;
            saved.copy_from_slice(plane);
            let wp = win(w, c.wrapping_mul(k_sz), k_sz).ok_or_else(out_of_bounds)?;
            if !CONTIGUOUS && qcol::dw_fits(q) {
                qcol::dw_plane(saved, wp, plane, c, q, &mut band).ok_or_else(out_of_bounds)?;
                continue;
            }
            dw_plane(saved, wp, plane, c, q).ok_or_else(out_of_bounds)?;
        }
        return Ok(());
    }
    if fast(q) && qgemm::fits_one_pass(p.m, p.c) {
        // One pass per column block: every input of a block of pixels is
        // packed before any output of them is written.
        let kk = p.c;
        // c · sz <= y.len() (`check_conv`).
        for img in y.chunks_exact_mut(kk.wrapping_mul(sz).max(1)) {
            let a = QMatA {
                a: w,
                lda: kk,
                z: Zero::Rows(q.zw),
                packed: q.packed,
            };
            let io = InPlaceIo {
                img: SharedMut::new(img),
                sz,
                q,
            };
            if !qgemm::qgemm(p.m, sz, kk, a, &io) {
                return Err(crate::Error::new(crate::ErrorKind::Internal(
                    "QConv: integer GEMM refused its operands",
                )));
            }
        }
        return Ok(());
    }
    if !CONTIGUOUS && zero_points_fit(&[q.zx]) {
        return qcol::pointwise_in_place::<T, W, { qcol::DSP }>(w, y, q).ok_or_else(out_of_bounds);
    }
    pointwise_in_place(w, y, q, &mut buf).ok_or_else(out_of_bounds)
}

/// Pointwise, m == c: gather a pixel's channels, then write its outputs.
fn pointwise_in_place<T: QInt, W: QInt>(
    w: &[W],
    y: &mut [T],
    q: &QConvView<'_>,
    buf: &mut [T],
) -> Option<()> {
    let (p, sz) = (&q.p, q.p.g.checked_sizes()?.0);
    let c_n = p.c;
    // `check_conv` checked c · sz and m · c against the slices, m = c: the
    // offsets below (ch, oc < c, px < sz) wrap by name only.
    let at = |ch: usize, px: usize| ch.wrapping_mul(sz).wrapping_add(px);
    for img in y.chunks_exact_mut(c_n.wrapping_mul(sz).max(1)) {
        for px in 0..sz {
            let xs = buf.get_mut(..c_n)?;
            for (ch, v) in xs.iter_mut().enumerate() {
                *v = *img.get(at(ch, px))?;
            }
            for oc in 0..p.m {
                let wr = win(w, oc.wrapping_mul(c_n), c_n)?;
                let zw = *q.zw.get(oc)?;
                let mut acc = *q.bias.get(oc)?;
                for (xv, wv) in xs.iter().zip(wr) {
                    let d = xv
                        .get()
                        .wrapping_sub(q.zx)
                        .wrapping_mul(wv.get().wrapping_sub(zw));
                    acc = acc.wrapping_add(d);
                }
                *img.get_mut(at(oc, px))? = finish(acc, q.mult.get(oc)?, &q.out);
            }
        }
    }
    Some(())
}

/// An in-place pointwise convolution's image (`c` planes of `sz`) as both
/// B and output of [`qgemm`]; the driver reads a column block whole before
/// storing into it (`fits_one_pass`).
struct InPlaceIo<'a, 'q, T> {
    img: SharedMut<'a, T>,
    sz: usize,
    q: &'a QConvView<'q>,
}

impl<T: QInt> QIo for InPlaceIo<'_, '_, T> {
    #[inline(always)]
    fn b_row(&self, p: usize, j0: usize, out: &mut [i16]) {
        let zx = self.q.zx;
        // p < c, j0 < sz: inside the image (c · sz, checked).
        let at = p.wrapping_mul(self.sz).wrapping_add(j0);
        // SAFETY: a task reads only the columns it owns, before storing
        // them (`QIo::store`); the slice does not outlive this call.
        match unsafe { self.img.slice(at, out.len()) } {
            Some(src) => {
                for (o, v) in out.iter_mut().zip(src.iter()) {
                    *o = v.get().wrapping_sub(zx) as i16;
                }
            }
            None => out.fill(0),
        }
    }

    fn b_u8_zero(&self) -> Option<i32> {
        let zx = self.q.zx;
        (T::LO..=T::HI)
            .contains(&zx)
            .then(|| zx.wrapping_sub(T::LO))
    }

    #[inline(always)]
    fn store(&self, i: usize, j0: usize, acc: &[i32]) {
        let q = self.q;
        let (Some(&b), Some(r)) = (q.bias.get(i), q.mult.get(i)) else {
            return;
        };
        let at = i.wrapping_mul(self.sz).wrapping_add(j0);
        // SAFETY: as in `ConvIo::store`; the reads of these columns
        // (`b_row`) are over, the driver packs a column block whole first.
        if let Some(yrow) = unsafe { self.img.slice(at, acc.len()) } {
            finish_row(yrow, acc, b, r, &q.out);
        }
    }
}

/// A QMatMul's B (`[k, n]`, or `[n, k]` transposed) and output for
/// [`qgemm`]; bias and multipliers are per column.
struct MmIo<'a, 'q, B, Y> {
    b: &'a [B],
    y: SharedMut<'a, Y>,
    q: &'a QMmView<'q>,
}

impl<B: QInt, Y: QInt> QIo for MmIo<'_, '_, B, Y> {
    #[inline(always)]
    fn b_row(&self, p: usize, j0: usize, out: &mut [i16]) {
        let q = self.q;
        // B's k · n values are checked by `qmatmul`; p < k and j0 + j < n
        // keep the offsets under it (they wrap by name only).
        let zb = win(q.zb, j0, out.len()).unwrap_or(&[]);
        out.fill(0);
        if q.trans_b {
            for (j, (o, z)) in out.iter_mut().zip(zb).enumerate() {
                let at = j0.wrapping_add(j).wrapping_mul(q.k).wrapping_add(p);
                if let Some(v) = self.b.get(at) {
                    *o = v.get().wrapping_sub(*z) as i16;
                }
            }
        } else if let Some(src) = win(self.b, p.wrapping_mul(q.n).wrapping_add(j0), out.len()) {
            for ((o, v), z) in out.iter_mut().zip(src).zip(zb) {
                *o = v.get().wrapping_sub(*z) as i16;
            }
        }
    }

    #[inline(always)]
    fn store(&self, i: usize, j0: usize, acc: &[i32]) {
        let q = self.q;
        // i < rows, j0 < n: under y's rows · n (checked by `qmatmul`).
        let at = i.wrapping_mul(q.n).wrapping_add(j0);
        let (Some(yrow), Some(bias), Some(mult)) = (
            // SAFETY: as in `ConvIo::store`.
            unsafe { self.y.slice(at, acc.len()) },
            win(q.bias, j0, acc.len()),
            win(q.mult, j0, acc.len()),
        ) else {
            return;
        };
        for (((yv, &a), &b), r) in yrow.iter_mut().zip(acc).zip(bias).zip(mult) {
            *yv = finish(b.wrapping_add(a), r, &q.out);
        }
    }
}

/// Integer matrix product with per-column requantization.
pub(crate) fn qmatmul<A: QInt, B: QInt, Y: QInt>(
    a: &[A],
    b: &[B],
    y: &mut [Y],
    q: &QMmView<'_>,
) -> Result<()> {
    let (k, n) = (q.k, q.n);
    // Checked products: below them every offset wraps by name only.
    let prod = |a: usize, b: usize| {
        a.checked_mul(b)
            .ok_or_else(|| crate::Error::new(crate::ErrorKind::Overflow))
    };
    check_len(a.len(), prod(q.rows, k)?)?;
    check_len(b.len(), prod(k, n)?)?;
    check_len(y.len(), prod(q.rows, n)?)?;
    for v in [q.zb.len(), q.bias.len(), q.mult.len()] {
        check_len(v, n)?;
    }
    if CONTIGUOUS
        && q.rows >= MM_ROWS
        && qgemm::enabled()
        && zero_points_fit(&[q.za])
        && zero_points_fit(q.zb)
    {
        let a = QMatA {
            a,
            lda: k,
            z: Zero::All(q.za),
            packed: &[],
        };
        let io = MmIo {
            b,
            y: SharedMut::new(y),
            q,
        };
        if !qgemm::qgemm(q.rows, n, k, a, &io) {
            return Err(crate::Error::new(crate::ErrorKind::Internal(
                "QMatMul: integer GEMM refused its operands",
            )));
        }
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if CONTIGUOUS {
        let sel = qgemm::selection();
        if sel == (super::cpu::Kernels::Avx2Fma, true) {
            // SAFETY: the VNNI selection is made only where the CPU has
            // AVX-512 F, BW and VNNI (`cpu::enable_avx512_vnni`).
            return unsafe { loops_avx512(a, b, y, q) }.ok_or_else(out_of_bounds);
        }
        if sel.0 == super::cpu::Kernels::Avx2Fma {
            // SAFETY: `Avx2Fma` is selected only where the CPU has AVX2
            // (`cpu::enable_avx2_fma`).
            return unsafe { loops_avx2(a, b, y, q) }.ok_or_else(out_of_bounds);
        }
    }
    qmatmul_loops(a, b, y, q).ok_or_else(out_of_bounds)
}

/// [`qmatmul_loops`] compiled for AVX-512 (the same integer code).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn loops_avx512<A: QInt, B: QInt, Y: QInt>(
    a: &[A],
    b: &[B],
    y: &mut [Y],
    q: &QMmView<'_>,
) -> Option<()> {
    loops_body(a, b, y, q)
}

/// [`qmatmul_loops`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn loops_avx2<A: QInt, B: QInt, Y: QInt>(
    a: &[A],
    b: &[B],
    y: &mut [Y],
    q: &QMmView<'_>,
) -> Option<()> {
    loops_body(a, b, y, q)
}

/// [`qmatmul`]'s reference loops, after its checks (fewer than
/// [`MM_ROWS`] rows on hosts, every QMatMul on microcontrollers).
fn qmatmul_loops<A: QInt, B: QInt, Y: QInt>(
    a: &[A],
    b: &[B],
    y: &mut [Y],
    q: &QMmView<'_>,
) -> Option<()> {
    loops_body(a, b, y, q)
}

#[inline(always)]
fn loops_body<A: QInt, B: QInt, Y: QInt>(
    a: &[A],
    b: &[B],
    y: &mut [Y],
    q: &QMmView<'_>,
) -> Option<()> {
    let (k, n) = (q.k, q.n);
    // rows · k, k · n and rows · n are checked by `qmatmul`: offsets under
    // them wrap by name only; values and zero points are 8-bit, so their
    // differences and products fit i32, and sums wrap as the reference's.
    if q.trans_b {
        // B is [N, K]: each output is a contiguous dot product.
        for r in 0..q.rows {
            let arow = win(a, r.wrapping_mul(k), k)?;
            let yrow = win_mut(y, r.wrapping_mul(n), n)?;
            for (j, yv) in yrow.iter_mut().enumerate() {
                let brow = win(b, j.wrapping_mul(k), k)?;
                let zb = *q.zb.get(j)?;
                let mut acc = *q.bias.get(j)?;
                for (av, bv) in arow.iter().zip(brow) {
                    let d = av
                        .get()
                        .wrapping_sub(q.za)
                        .wrapping_mul(bv.get().wrapping_sub(zb));
                    acc = acc.wrapping_add(d);
                }
                *yv = finish(acc, q.mult.get(j)?, &q.out);
            }
        }
        return Some(());
    }
    // B is [K, N]: accumulate a strip of up to STRIP sums on the stack,
    // walking B by rows (contiguous reads, no arena scratch).
    const STRIP: usize = 32;
    let mut acc = [0i32; STRIP];
    for r in 0..q.rows {
        let arow = win(a, r.wrapping_mul(k), k)?;
        let mut j0 = 0usize;
        while j0 < n {
            let w = STRIP.min(n.wrapping_sub(j0));
            let acc = acc.get_mut(..w)?;
            acc.copy_from_slice(win(q.bias, j0, w)?);
            let zb = win(q.zb, j0, w)?;
            for (p, av) in arow.iter().enumerate() {
                let av = av.get().wrapping_sub(q.za);
                if av == 0 {
                    continue;
                }
                let brow = win(b, p.wrapping_mul(n).wrapping_add(j0), w)?;
                for ((s, bv), z) in acc.iter_mut().zip(brow).zip(zb) {
                    *s = s.wrapping_add(av.wrapping_mul(bv.get().wrapping_sub(*z)));
                }
            }
            let yrow = win_mut(y, r.wrapping_mul(n).wrapping_add(j0), w)?;
            for ((yv, s), m) in yrow.iter_mut().zip(acc.iter()).zip(win(q.mult, j0, w)?) {
                *yv = finish(*s, m, &q.out);
            }
            j0 = j0.wrapping_add(w);
        }
    }
    Some(())
}

/// `y = clamp(requant(x - zx))`; `x = None` runs in place on `y`.
pub(crate) fn qrequant<X: QInt, Y: QInt>(
    x: Option<&[X]>,
    y: &mut [Y],
    zx: i32,
    r: &Requant,
    o: &OutQ,
) -> Result<()> {
    // x and its zero point are of one 8-bit type: the difference fits.
    match x {
        None => {
            for v in y.iter_mut() {
                *v = finish(v.get().wrapping_sub(zx), r, o);
            }
        }
        Some(x) => {
            check_len(y.len(), x.len())?;
            for (yv, xv) in y.iter_mut().zip(x) {
                *yv = finish(xv.get().wrapping_sub(zx), r, o);
            }
        }
    }
    Ok(())
}

#[cfg(all(test, feature = "alloc"))]
mod tests {
    extern crate std;
    use super::*;
    use crate::kern::cpu::Kernels;
    use alloc::vec;
    use alloc::vec::Vec;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) as u32
        }
        fn below(&mut self, n: usize) -> usize {
            self.next() as usize % n.max(1)
        }
        fn q<T: QInt>(&mut self, n: usize) -> Vec<T> {
            (0..n)
                .map(|_| T::from_sat(T::LO + self.below((T::HI - T::LO + 1) as usize) as i32))
                .collect()
        }
        fn zp<T: QInt>(&mut self) -> i32 {
            T::LO + self.below((T::HI - T::LO + 1) as usize) as i32
        }
    }

    /// Dense B `[k, n]` minus per-column zero points, raw i32 sums out.
    struct Raw<'a> {
        b: &'a [u8],
        zb: &'a [i32],
        n: usize,
        c: std::sync::Mutex<(Vec<i32>, usize)>,
    }
    impl QIo for Raw<'_> {
        fn b_row(&self, p: usize, j0: usize, out: &mut [i16]) {
            for (j, o) in out.iter_mut().enumerate() {
                *o = (self.b[p * self.n + j0 + j] as i32 - self.zb[j0 + j]) as i16;
            }
        }
        fn b_u8_zero(&self) -> Option<i32> {
            // One zero point for all columns: the VNNI kernel may run.
            let z = *self.zb.first()?;
            self.zb.iter().all(|&v| v == z).then_some(z)
        }
        fn store(&self, i: usize, j0: usize, acc: &[i32]) {
            let mut c = self.c.lock().unwrap();
            c.0[i * self.n + j0..][..acc.len()].copy_from_slice(acc);
            c.1 += acc.len();
        }
    }

    #[test]
    fn qgemm_matches_the_definition_on_edge_sizes() {
        let mut rng = Rng(7);
        let sizes = [
            (1, 1, 0),
            (1, 1, 1),
            (5, 17, 3),
            (6, 16, 2),
            (7, 15, 255),
            (13, 65, 256),
            (12, 130, 257),
            (2, 64, 513),
            (505, 20, 9),
            (509, 33, 300),
        ];
        let sizes = crate::kern::pick(&sizes, &[(1, 1, 0), (5, 17, 3), (7, 15, 255)]);
        for (kind, vnni) in qgemm::testing::selections() {
            for &(m, n, k) in sizes {
                let a: Vec<i8> = rng.q(m * k);
                let b: Vec<u8> = rng.q(k * n);
                let za: Vec<i32> = (0..m).map(|_| rng.zp::<i8>()).collect();
                // Per-column zero points, or one for all (VNNI's case).
                let z0 = rng.zp::<u8>();
                let one = rng.below(2) == 0;
                let zb: Vec<i32> = (0..n)
                    .map(|_| if one { z0 } else { rng.zp::<u8>() })
                    .collect();
                let want: Vec<i32> = (0..m * n)
                    .map(|ij| {
                        let (i, j) = (ij / n, ij % n);
                        (0..k).fold(0i32, |s, p| {
                            s.wrapping_add(
                                (a[i * k + p] as i32 - za[i]) * (b[p * n + j] as i32 - zb[j]),
                            )
                        })
                    })
                    .collect();
                // No provider, then 2 and 3 workers (columns split when the
                // product is big enough).
                for workers in [1, 2, 3] {
                    let _g =
                        crate::kern::par::testing::with(if workers == 1 { 0 } else { workers });
                    let io = Raw {
                        b: &b,
                        zb: &zb,
                        n,
                        c: std::sync::Mutex::new((vec![i32::MIN; m * n], 0)),
                    };
                    let am = QMatA {
                        a: &a,
                        lda: k,
                        z: Zero::Rows(&za),
                        packed: &[],
                    };
                    assert!(qgemm::qgemm_with(kind, vnni, workers, m, n, k, am, &io));
                    let (c, stores) = io.c.into_inner().unwrap();
                    let sel = (kind, vnni);
                    assert_eq!(stores, m * n, "{sel:?} {m}x{n}x{k}: every output once");
                    assert_eq!(c, want, "{sel:?} {m}x{n}x{k}, {workers} workers");
                }
            }
        }
    }

    #[test]
    fn qgemm_refuses_short_operands() {
        let a = [0i8; 5];
        let io = Raw {
            b: &[],
            zb: &[],
            n: 1,
            c: std::sync::Mutex::new((vec![0; 2], 0)),
        };
        let am = QMatA {
            a: &a,
            lda: 3,
            z: Zero::All(0),
            packed: &[],
        };
        assert!(!qgemm::qgemm_with(
            Kernels::Blocked,
            false,
            1,
            2,
            1,
            3,
            am,
            &io
        ));
        assert_eq!(io.c.into_inner().unwrap().1, 0);
    }

    struct Case {
        p: IntConv,
        zx: i32,
        zw: Vec<i32>,
        bias: Vec<i32>,
        mult: Vec<Requant>,
        out: OutQ,
        packed: Vec<i32>,
    }

    impl Case {
        fn view(&self) -> QConvView<'_> {
            QConvView {
                p: self.p,
                zx: self.zx,
                zw: &self.zw,
                bias: &self.bias,
                mult: &self.mult,
                out: self.out,
                packed: &self.packed,
            }
        }
    }

    /// A random convolution: `dw` picks depthwise, else grouped or plain.
    fn case<X: QInt, W: QInt>(rng: &mut Rng, dw: bool) -> Case {
        let mut g = Geom::unit();
        let two_d = rng.below(4) != 0;
        for ax in (if two_d { 1 } else { 2 })..3 {
            g.k[ax] = 1 + rng.below(5);
            g.s[ax] = 1 + rng.below(3);
            g.d[ax] = 1 + rng.below(2);
            g.pb[ax] = rng.below(3);
            g.pe[ax] = rng.below(3);
            let span = (g.k[ax] - 1) * g.d[ax] + 1;
            g.inp[ax] = span.saturating_sub(g.pb[ax] + g.pe[ax]).max(1) + rng.below(20);
            let padded = g.inp[ax] + g.pb[ax] + g.pe[ax];
            g.out[ax] = if padded >= span {
                (padded - span) / g.s[ax] + 1
            } else {
                0
            };
        }
        let (c, m, group) = if dw {
            let c = 1 + rng.below(6);
            (c, c, c)
        } else {
            let group = [1, 1, 1, 2, 3][rng.below(5)];
            (
                group * (1 + rng.below(9)),
                group * (1 + rng.below(20)),
                group,
            )
        };
        let p = IntConv {
            batch: 1 + rng.below(2),
            c,
            m,
            group,
            g,
        };
        let zy = rng.zp::<i8>();
        let (lo, hi) = if rng.below(2) == 0 {
            (-128, 127)
        } else {
            (zy, 127)
        };
        Case {
            p,
            zx: rng.zp::<X>(),
            zw: (0..m).map(|_| rng.zp::<W>()).collect(),
            bias: (0..m).map(|_| rng.next() as i32 % 5000).collect(),
            mult: (0..m)
                .map(|_| Requant::new(0.0005 + rng.below(1000) as f64 * 1e-5).unwrap())
                .collect(),
            out: OutQ { zy, lo, hi },
            packed: Vec::new(),
        }
    }

    fn conv_cases<X: QInt, W: QInt>(seed: u64) {
        let mut rng = Rng(seed);
        let (mut flat_cases, mut col_cases, mut band_cases) = (0, 0, 0);
        for n in 0..crate::kern::count(300, 4) {
            let cs = case::<X, W>(&mut rng, n % 3 == 0);
            let q = cs.view();
            let p = &cs.p;
            let cg = p.c / p.group;
            let x: Vec<X> = rng.q(p.batch * p.c * p.g.in_size());
            let w: Vec<W> = rng.q(p.m * cg * p.g.k_size());
            let mut want = vec![i8::default(); p.batch * p.m * p.g.out_size()];
            qconv_body(&x, &w, &mut want, &q);
            for sel in qgemm::testing::selections() {
                let _g = qgemm::testing::with(sel);
                let mut got = vec![i8::MIN; want.len()];
                conv_gemm(&x, &w, &mut got, &q).unwrap();
                assert_eq!(got, want, "GEMM {sel:?}, case {n}: {p:?}");
                if p.is_depthwise() {
                    continue;
                }
                let packed = pack_weights(&w, p, cs.zx, &cs.zw);
                // Packed only where the blocked kernels run (64-bit hosts),
                // as i16 pairs or (VNNI) byte quads.
                assert_eq!(
                    packed.len(),
                    if CONTIGUOUS {
                        p.group * qgemm::packed_len(sel.1, p.m / p.group, cg * p.g.k_size())
                    } else {
                        0
                    }
                );
                let qp = QConvView {
                    packed: &packed,
                    ..q
                };
                let mut got = vec![i8::MIN; want.len()];
                conv_gemm(&x, &w, &mut got, &qp).unwrap();
                assert_eq!(got, want, "GEMM {sel:?}, packed weights, case {n}: {p:?}");
            }
            if qcol::fits(&q) {
                let mut plain = vec![i8::MIN; want.len()];
                qcol::conv::<X, W, i8, false>(&x, &w, &mut plain, &q).unwrap();
                assert_eq!(plain, want, "column kernel, case {n}: {p:?}");
                let mut dsp = vec![i8::MIN; want.len()];
                qcol::conv::<X, W, i8, true>(&x, &w, &mut dsp, &q).unwrap();
                assert_eq!(dsp, want, "column kernel, DSP order, case {n}: {p:?}");
                col_cases += 1;
            }
            if p.is_depthwise() {
                let k_sz = p.g.k_size();
                let (in_sz, out_sz) = (p.g.in_size(), p.g.out_size());
                for (si, sel) in qgemm::testing::selections().into_iter().enumerate() {
                    let mut sc = qdw::DwScratch::<{ qdw::FLAT }>::with(sel);
                    // The tiny scratch (8 KiB) takes what fits it, either
                    // path; the row path declines only stride 4.
                    let mut tiny = qdw::DwScratch::<{ qdw::TINY }>::with(sel);
                    let (mut rows, mut flat, mut small) = (
                        vec![i8::MIN; want.len()],
                        vec![i8::MIN; want.len()],
                        vec![i8::MIN; want.len()],
                    );
                    let mut flat_ok = true;
                    for pl in 0..p.batch * p.c {
                        let ch = pl % p.c;
                        let xp = &x[pl * in_sz..][..in_sz];
                        let wc = &w[ch * k_sz..][..k_sz];
                        assert!(sc.rows(xp, wc, &mut rows[pl * out_sz..][..out_sz], ch, &q));
                        flat_ok &= sc.flat(xp, wc, &mut flat[pl * out_sz..][..out_sz], ch, &q);
                        let yt = &mut small[pl * out_sz..][..out_sz];
                        if !tiny.plane(xp, wc, yt, ch, &q) {
                            assert_eq!(p.g.s[2], 4, "tiny scratch declined, case {n}: {p:?}");
                            dw_plane(xp, wc, yt, ch, &q).unwrap();
                        }
                    }
                    assert_eq!(rows, want, "depthwise rows {sel:?}, case {n}: {p:?}");
                    assert_eq!(
                        small, want,
                        "depthwise, tiny scratch {sel:?}, case {n}: {p:?}"
                    );
                    if flat_ok && out_sz > 0 {
                        flat_cases += usize::from(si == 0);
                        assert_eq!(flat, want, "depthwise flat {sel:?}, case {n}: {p:?}");
                    }
                }
                if qcol::dw_fits(&q) {
                    let mut band = vec![i8::MIN; want.len()];
                    for pl in 0..p.batch * p.c {
                        let ch = pl % p.c;
                        let xp = &x[pl * in_sz..][..in_sz];
                        let wc = &w[ch * k_sz..][..k_sz];
                        let yo = &mut band[pl * out_sz..][..out_sz];
                        qcol::dw_plane(xp, wc, yo, ch, &q, &mut [0; qcol::DW_BAND]).unwrap();
                    }
                    assert_eq!(band, want, "depthwise band, case {n}: {p:?}");
                    band_cases += 1;
                }
                for sel in qgemm::testing::selections() {
                    let _g = qgemm::testing::with(sel);
                    let mut all = vec![i8::MIN; want.len()];
                    qconv_dw(&x, &w, &mut all, &q).unwrap();
                    assert_eq!(all, want, "qconv_dw {sel:?}, case {n}: {p:?}");
                }
            }
        }
        assert!(
            flat_cases > crate::kern::count(30, 0),
            "flat depthwise path taken {flat_cases} times"
        );
        assert!(
            col_cases > crate::kern::count(100, 0),
            "column kernel taken {col_cases} times"
        );
        assert!(
            band_cases > crate::kern::count(50, 0),
            "depthwise band kernel taken {band_cases} times"
        );
    }

    /// mote_load (scripts/fuzz.sh) found a depthwise geometry that passes
    /// the `.mote` validator (a dilation of 2^61 on a 1×1 plane) whose
    /// padded-grid size overflowed in the flat path: now that path
    /// declines it, and the convolution returns an `Err` (its window
    /// reaches past the input).
    #[test]
    fn fuzz_depthwise_grid_that_overflows() {
        let mut g = Geom::unit();
        g.k[2] = 2;
        g.d[2] = 1 << (usize::BITS - 3);
        g.inp[1] = 1;
        g.out[1] = 5;
        g.pb[1] = 4;
        let p = IntConv {
            batch: 1,
            c: 1,
            m: 1,
            group: 1,
            g,
        };
        let cs = Case {
            p,
            zx: 0,
            zw: vec![0],
            bias: vec![0],
            mult: vec![Requant::new(0.5).unwrap()],
            out: OutQ {
                zy: 0,
                lo: -128,
                hi: 127,
            },
            packed: Vec::new(),
        };
        let (x, w, mut y) = ([3i8], [1i8, 1], [0i8; 5]);
        let sel = (Kernels::Blocked, false);
        assert!(!qdw::DwScratch::<{ qdw::FLAT }>::with(sel).flat(&x, &w, &mut y, 0, &cs.view()));
        // Its window (1 + 2^61 columns) reaches past the 1-column input, so
        // the convolution refuses it up front (`Geom::reach_ok`).
        let err = qconv_dw(&x, &w, &mut y, &cs.view()).expect_err("refused");
        assert!(matches!(err.kind, crate::ErrorKind::Shape(_)), "{err:?}");
    }

    /// One depthwise scratch across planes of two geometries, back and
    /// forth: the flat path keeps its padded buffer's zeros and its tap
    /// layout only while the geometry stays (the first plane of another
    /// clears and lays out again), so each plane matches the reference.
    #[test]
    fn depthwise_scratch_reused_across_geometries() {
        let geom = |i: [usize; 2], pad: usize, s: usize| {
            let mut g = Geom::unit();
            g.inp[1..].copy_from_slice(&i);
            g.k[1..].copy_from_slice(&[3, 3]);
            g.s[1..].copy_from_slice(&[s, s]);
            g.pb[1..].copy_from_slice(&[pad, pad]);
            g.pe[1..].copy_from_slice(&[pad, pad]);
            for a in 1..3 {
                g.out[a] = (g.inp[a] + 2 * pad - 3) / s + 1;
            }
            g
        };
        // 9 x 9 unpadded, then 5 x 7 padded by 1 and by 2 with stride 2:
        // the later planes' padding lies where the first planes' rows were.
        // And stride 4 with 5 taps a row, which reads all four phases.
        let mut wide = geom([13, 14], 1, 4);
        wide.k[2] = 5;
        wide.out[2] = (14 + 2 - 5) / 4 + 1;
        let geoms = [
            geom([9, 9], 0, 1),
            geom([5, 7], 1, 1),
            geom([6, 4], 2, 2),
            wide,
        ];
        let mut rng = Rng(5);
        for sel in qgemm::testing::selections() {
            let mut sc = qdw::DwScratch::<{ qdw::TINY }>::with(sel);
            let mut flat_planes = 0;
            for (n, g) in [0, 1, 1, 2, 0, 3, 2, 1]
                .map(|i| geoms[i])
                .into_iter()
                .enumerate()
            {
                let p = IntConv {
                    batch: 1,
                    c: 1,
                    m: 1,
                    group: 1,
                    g,
                };
                let cs = Case {
                    p,
                    zx: 3,
                    zw: vec![-2],
                    bias: vec![17],
                    mult: vec![Requant::new(0.01).unwrap()],
                    out: OutQ {
                        zy: -5,
                        lo: -128,
                        hi: 127,
                    },
                    packed: Vec::new(),
                };
                let x: Vec<i8> = (0..g.in_size()).map(|_| rng.next() as i8).collect();
                let w: Vec<i8> = (0..g.k_size()).map(|_| rng.next() as i8).collect();
                let mut want = vec![0i8; g.out_size()];
                dw_plane(&x, &w, &mut want, 0, &cs.view()).unwrap();
                let mut got = vec![i8::MIN; g.out_size()];
                if sc.flat(&x, &w, &mut got, 0, &cs.view()) {
                    flat_planes += 1;
                    assert_eq!(got, want, "plane {n}, {sel:?}: {g:?}");
                }
                // The row path on the same scratch: its 4 stride phases do
                // not fit the tiny scratch, which it then declines.
                let mut got = vec![i8::MIN; g.out_size()];
                if sc.rows(&x, &w, &mut got, 0, &cs.view()) {
                    assert_eq!(got, want, "rows, plane {n}, {sel:?}: {g:?}");
                } else {
                    assert_eq!(g.s[2], 4, "rows declined plane {n}, {sel:?}: {g:?}");
                }
            }
            assert_eq!(flat_planes, 8, "{sel:?}: the flat path declined a plane");
        }
    }

    /// The banded depthwise kernel of 32-bit targets on its 3×3 fast path
    /// (strides 1 and 2, padding 0 to 2) and others, against the
    /// reference loop, plain and in place.
    #[test]
    fn depthwise_band_matches_the_reference() {
        let mut rng = Rng(21);
        let mut taken = 0;
        for n in 0..crate::kern::count(200, 4) {
            let mut cs = case::<i8, i8>(&mut rng, true);
            let g = &mut cs.p.g;
            if n % 4 != 3 {
                for ax in 1..3 {
                    g.k[ax] = 3;
                    g.d[ax] = 1;
                    g.s[ax] = 1 + rng.below(2);
                    g.pb[ax] = rng.below(3);
                    g.pe[ax] = if n % 2 == 0 { g.pb[ax] } else { rng.below(3) };
                    g.inp[ax] = 1 + rng.below(30);
                    let padded = g.inp[ax] + g.pb[ax] + g.pe[ax];
                    g.out[ax] = if padded >= 3 {
                        (padded - 3) / g.s[ax] + 1
                    } else {
                        0
                    };
                }
            }
            let q = cs.view();
            let p = &cs.p;
            if !qcol::dw_fits(&q) {
                continue;
            }
            taken += 1;
            let (in_sz, out_sz, k_sz) = (p.g.in_size(), p.g.out_size(), p.g.k_size());
            let x: Vec<i8> = rng.q(p.batch * p.c * in_sz);
            let w: Vec<i8> = rng.q(p.c * k_sz);
            for pl in 0..p.batch * p.c {
                let ch = pl % p.c;
                let xp = &x[pl * in_sz..][..in_sz];
                let wc = &w[ch * k_sz..][..k_sz];
                let mut want = vec![0i8; out_sz];
                dw_plane(xp, wc, &mut want, ch, &q).unwrap();
                let mut got = vec![i8::MIN; out_sz];
                qcol::dw_plane(xp, wc, &mut got, ch, &q, &mut [0; qcol::DW_BAND]).unwrap();
                assert_eq!(got, want, "case {n}, plane {pl}: {p:?}");
            }
        }
        assert!(taken > crate::kern::count(150, 0), "taken {taken} times");
    }

    #[test]
    fn conv_gemm_and_depthwise_rows_match_the_reference() {
        conv_cases::<u8, i8>(1);
        conv_cases::<i8, i8>(2);
        conv_cases::<u8, u8>(3);
    }

    #[test]
    fn split_convolutions_are_bit_identical() {
        use crate::kern::par::testing;
        let mut rng = Rng(17);
        // Big enough that the int8 work splits natively (par::tasks_int8);
        // Miri's tiny task size splits the small plane of case 1, the one
        // it runs.
        let dw_hw = if cfg!(miri) { 40 } else { 80 };
        for (n, &(c, m, group, hw, k, s)) in [
            (16, 32, 1, 20, 3, 1),
            (16, 16, 16, dw_hw, 3, 1),
            (24, 24, 24, 115, 3, 2),
            (12, 36, 3, 63, 5, 2),
            (96, 16, 1, 30, 1, 1),
            (8, 8, 8, 120, 3, 1),
        ]
        .iter()
        .enumerate()
        .filter(|(n, _)| !cfg!(miri) || *n == 1)
        {
            let mut g = Geom::unit();
            for ax in 1..3 {
                g.k[ax] = k;
                g.s[ax] = s;
                g.pb[ax] = k / 2;
                g.pe[ax] = k / 2;
                g.inp[ax] = hw;
                g.out[ax] = (hw + 2 * (k / 2) - k) / s + 1;
            }
            let p = IntConv {
                batch: 1,
                c,
                m,
                group,
                g,
            };
            let cs = Case {
                p,
                zx: rng.zp::<u8>(),
                zw: (0..m).map(|_| rng.zp::<i8>()).collect(),
                bias: (0..m).map(|_| rng.next() as i32 % 3000).collect(),
                mult: (0..m).map(|_| Requant::new(0.001).unwrap()).collect(),
                out: OutQ {
                    zy: 0,
                    lo: 0,
                    hi: 255,
                },
                packed: Vec::new(),
            };
            let q = cs.view();
            let x: Vec<u8> = rng.q(c * g.in_size());
            let w: Vec<i8> = rng.q(m * (c / group) * g.k_size());
            let mut want = vec![0u8; m * g.out_size()];
            qconv_body(&x, &w, &mut want, &q);
            let calls = testing::split_calls();
            let outs = testing::each(|| {
                let mut y = vec![0u8; want.len()];
                if p.is_depthwise() {
                    qconv_dw(&x, &w, &mut y, &q).unwrap();
                } else {
                    qconv(&x, &w, &mut y, &q).unwrap();
                }
                y
            });
            // 32-bit targets run the reference loops, which do not split.
            assert!(
                testing::split_calls() > calls || !CONTIGUOUS,
                "case {n} did not split"
            );
            for (i, y) in outs.iter().enumerate() {
                assert_eq!(y, &want, "case {n}, run {i}: {p:?}");
            }
        }
    }

    #[test]
    fn in_place_pointwise_matches_the_reference() {
        let mut rng = Rng(11);
        for n in 0..crate::kern::count(40, 2) {
            let c = [1, 3, 16, 64, 200, 256][n % 6];
            let mut g = Geom::unit();
            g.inp[2] = 1 + rng.below(70);
            g.inp[1] = 1 + rng.below(4);
            g.out = g.inp;
            let p = IntConv {
                batch: 1 + rng.below(2),
                c,
                m: c,
                group: 1,
                g,
            };
            let cs = Case {
                p,
                zx: rng.zp::<i8>(),
                zw: (0..c).map(|_| rng.zp::<i8>()).collect(),
                bias: (0..c).map(|_| rng.next() as i32 % 3000).collect(),
                mult: (0..c).map(|_| Requant::new(0.003).unwrap()).collect(),
                out: OutQ {
                    zy: -3,
                    lo: -128,
                    hi: 127,
                },
                packed: Vec::new(),
            };
            assert!(can_conv_in_place(&p));
            let x: Vec<i8> = rng.q(p.batch * c * g.in_size());
            let w: Vec<i8> = rng.q(c * c);
            let mut want = vec![0i8; x.len()];
            qconv_body(&x, &w, &mut want, &cs.view());
            for sel in qgemm::testing::selections() {
                let _g = qgemm::testing::with(sel);
                let packed = if n % 2 == 0 {
                    pack_weights(&w, &p, cs.zx, &cs.zw)
                } else {
                    Vec::new()
                };
                let q = QConvView {
                    packed: &packed,
                    ..cs.view()
                };
                let mut y = x.clone();
                qconv_in_place(&w, &mut y, &q).unwrap();
                assert_eq!(y, want, "in place {sel:?}, case {n}: {p:?}");
            }
            let mut y = x.clone();
            qcol::pointwise_in_place::<i8, i8, false>(&w, &mut y, &cs.view()).unwrap();
            assert_eq!(y, want, "in place, column kernel, case {n}: {p:?}");
            let mut y = x.clone();
            qcol::pointwise_in_place::<i8, i8, true>(&w, &mut y, &cs.view()).unwrap();
            assert_eq!(
                y, want,
                "in place, column kernel, DSP order, case {n}: {p:?}"
            );
        }
    }

    #[test]
    fn in_place_depthwise_matches_the_reference() {
        let mut rng = Rng(13);
        for n in 0..crate::kern::count(40, 2) {
            let c = 1 + rng.below(8);
            let mut g = Geom::unit();
            let k = [1, 3, 5][n % 3];
            for ax in 1..3 {
                g.k[ax] = k;
                g.pb[ax] = k / 2;
                g.pe[ax] = k / 2;
                g.inp[ax] = 1 + rng.below(31);
            }
            if n % 4 == 0 {
                g.inp[1] = 1;
                g.k[1] = 1;
                g.pb[1] = 0;
                g.pe[1] = 0;
            }
            g.out = g.inp;
            let p = IntConv {
                batch: 1 + rng.below(2),
                c,
                m: c,
                group: c,
                g,
            };
            let cs = Case {
                p,
                zx: rng.zp::<u8>(),
                zw: (0..c).map(|_| rng.zp::<u8>()).collect(),
                bias: (0..c).map(|_| rng.next() as i32 % 3000).collect(),
                mult: (0..c).map(|_| Requant::new(0.002).unwrap()).collect(),
                out: OutQ {
                    zy: 100,
                    lo: 100,
                    hi: 255,
                },
                packed: Vec::new(),
            };
            let q = cs.view();
            assert!(can_conv_in_place(&p), "{p:?}");
            let x: Vec<u8> = rng.q(p.batch * c * g.in_size());
            let w: Vec<u8> = rng.q(c * g.k_size());
            let mut want = vec![0u8; x.len()];
            qconv_body(&x, &w, &mut want, &q);
            for sel in qgemm::testing::selections() {
                let _g = qgemm::testing::with(sel);
                let mut y = x.clone();
                qconv_in_place(&w, &mut y, &q).unwrap();
                assert_eq!(y, want, "in place depthwise {sel:?}, case {n}: {p:?}");
            }
        }
    }

    #[test]
    fn qmatmul_gemm_matches_the_loops() {
        let mut rng = Rng(5);
        for n_case in 0..crate::kern::count(60, 2) {
            let rows = 1 + rng.below(40);
            let (k, n) = (1 + rng.below(300), 1 + rng.below(90));
            let trans_b = n_case % 2 == 0;
            let zb: Vec<i32> = (0..n).map(|_| rng.zp::<i8>()).collect();
            let bias: Vec<i32> = (0..n).map(|_| rng.next() as i32 % 4000).collect();
            let mult: Vec<Requant> = (0..n)
                .map(|_| Requant::new(0.001 + rng.below(100) as f64 * 1e-4).unwrap())
                .collect();
            let q = QMmView {
                rows,
                k,
                n,
                trans_b,
                za: rng.zp::<u8>(),
                zb: &zb,
                bias: &bias,
                mult: &mult,
                out: OutQ {
                    zy: 10,
                    lo: 0,
                    hi: 255,
                },
            };
            let a: Vec<u8> = rng.q(rows * k);
            let b: Vec<i8> = rng.q(k * n);
            let mut want = vec![0u8; rows * n];
            qmatmul_loops(&a, &b, &mut want, &q);
            for sel in qgemm::testing::selections() {
                let _g = qgemm::testing::with(sel);
                let mut got = vec![0u8; rows * n];
                qmatmul(&a, &b, &mut got, &q).unwrap();
                let what =
                    alloc::format!("{sel:?} case {n_case}: {rows}x{k}x{n} trans_b {trans_b}");
                assert_eq!(got, want, "{what}");
            }
        }
    }
}
