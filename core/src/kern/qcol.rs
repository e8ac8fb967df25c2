//! Integer convolution for 32-bit targets (Cortex-M), CMSIS-NN's scheme
//! in mote's NCHW layout: for each output position, the patch `x - zx`
//! (`cg·k` values, 0 over the padding) is gathered once into an i16
//! column on the stack, then every output channel of the group takes the
//! dot product of its 8-bit weight row with it, four channels at a time.
//! The gather is paid once per position for all output channels, and the
//! inner loop is loads and multiply-accumulates with no index arithmetic.
//!
//! On Armv7E-M (`thumbv7em`, Cortex-M4/M7: build script cfg `mote_dsp`)
//! the dot product is the DSP extension's: a word of four weights is
//! widened by `SXTB16` (bytes 0, 2) and `SXTB16 ROR #8` (bytes 1, 3), and
//! two `SMLAD`s take four products with the column stored in that order
//! (`[x0, x2, x1, x3]` per group of four). Elsewhere (Cortex-M3, hosts
//! running the reference kernels) the column keeps its natural order and
//! the products are plain. Both orders are tested on the host, the DSP one
//! through a Rust model of the two instructions; the board tests compare
//! the firmware's outputs with the host's exactly.
//!
//! Exactness: the weights are taken raw and their zero point applied to
//! the column sum, `Σ (w - zw)(x - zx) = Σ w·(x - zx) - zw·Σ (x - zx)`, and
//! `SMLAD` adds its two products to the accumulator modulo 2^32: every
//! sum is the reference loops' wrapping sum (integer addition is
//! associative), whatever the order.

// Integer arithmetic is checked, saturating or wrapping by name (issue 8):
// each kernel checks its sizes once (plane, patch and band lengths against
// the slices, and `Geom::reach_ok`: no window index past `usize`), and offsets
// under those bounds wrap by name. Values and zero points are 8-bit, with
// `x - zx` within i16 (`zero_points_fit`): differences and products fit
// i32, and sums wrap by definition (the reference's modulo-2^32 sums).

use super::qconv::{finish, OutQ, QConvView};
use super::qgemm::zero_points_fit;
use super::requant::Requant;
use super::{tap_in, valid_range, win, win_mut, QInt};

/// Most patch values of one output position (the column: 2 × this many
/// bytes of stack). ResNet-8's 3×3×64 patch is 576.
pub(crate) const KMAX: usize = 640;

/// Whether the DSP (`SMLAD`) dot product is built in.
pub(crate) const DSP: bool = cfg!(mote_dsp);

/// Whether [`conv`] takes this (not depthwise) convolution: its patch fits
/// the column and `x - zx` fits an i16.
pub(crate) fn fits(q: &QConvView<'_>) -> bool {
    let p = &q.p;
    let kk =
        p.c.checked_div(p.group)
            .and_then(|cg| cg.checked_mul(p.g.checked_sizes()?.2));
    kk.is_some_and(|kk| kk <= KMAX) && zero_points_fit(&[q.zx]) && !p.is_depthwise()
}

/// A column: `KMAX` i16 values in u32 words (the DSP loop reads pairs).
struct Col([u32; KMAX / 2]);

impl Col {
    fn new() -> Self {
        Col([0; KMAX / 2])
    }

    fn values(&mut self) -> &mut [i16] {
        bytemuck::cast_slice_mut(&mut self.0)
    }

    /// Puts the first `kk / 4` groups of four in the DSP order
    /// `[x0, x2, x1, x3]` (the tail stays natural).
    fn reorder(&mut self, kk: usize) {
        for quad in self.values().chunks_exact_mut(4).take(kk / 4) {
            quad.swap(1, 2);
        }
    }
}

/// The convolution `y = conv(x, w)` (all images and groups), with
/// `DSP_ORDER` choosing the dot product. `None` if a geometry disagrees
/// with the slices (checked by the caller; never happens).
pub(crate) fn conv<X: QInt, W: QInt, Y: QInt, const DSP_ORDER: bool>(
    x: &[X],
    w: &[W],
    y: &mut [Y],
    q: &QConvView<'_>,
) -> Option<()> {
    let p = &q.p;
    let g = &p.g;
    let (in_sz, out_sz, k_sz) = g.checked_sizes()?;
    let cg = p.c.checked_div(p.group)?;
    let mg = p.m.checked_div(p.group)?;
    let kk = cg.checked_mul(k_sz)?;
    let [_, o1, o2] = g.out;
    let o12 = o1.checked_mul(o2)?;
    let len3 = |a: usize, b: usize, c: usize| a.checked_mul(b)?.checked_mul(c);
    if kk > KMAX
        || !g.reach_ok()
        || x.len() < len3(p.batch, p.c, in_sz)?
        || w.len() < p.m.checked_mul(kk)?
        || y.len() < len3(p.batch, p.m, out_sz)?
    {
        return None;
    }
    // With ni < batch, grp < group, (grp + 1)·cg <= c and (grp + 1)·mg <= m,
    // the offsets below stay under the lengths just checked.
    // Divisors of the output position (out_sz = 0 has no positions).
    let nz = core::num::NonZeroUsize::new;
    let (Some(o12_nz), Some(o2_nz), Some(o1_nz)) = (nz(o12), nz(o2), nz(o1)) else {
        return Some(());
    };
    let mut col = Col::new();
    for ni in 0..p.batch {
        for grp in 0..p.group {
            let ch0 = ni.wrapping_mul(p.c).wrapping_add(grp.wrapping_mul(cg));
            let xg = win(x, ch0.wrapping_mul(in_sz), cg.wrapping_mul(in_sz))?;
            let oc0 = grp.wrapping_mul(mg);
            let rows = Rows {
                w: win(w, oc0.wrapping_mul(kk), mg.wrapping_mul(kk))?,
                kk,
                zw: win(q.zw, oc0, mg)?,
                bias: win(q.bias, oc0, mg)?,
                mult: win(q.mult, oc0, mg)?,
                out: &q.out,
            };
            let m0 = ni.wrapping_mul(p.m).wrapping_add(oc0);
            let yg = y.get_mut(m0.wrapping_mul(out_sz)..)?;
            for j in 0..out_sz {
                let at = [j / o12_nz, (j / o2_nz) % o1_nz, j % o2_nz];
                let sum = gather(xg, q, at, col.values(), (cg, in_sz, kk))?;
                if DSP_ORDER {
                    col.reorder(kk);
                }
                rows.outputs::<DSP_ORDER, Y>(&col, sum, |oc, v| {
                    // oc < mg: under yg's mg planes of out_sz.
                    if let Some(d) = yg.get_mut(oc.wrapping_mul(out_sz).wrapping_add(j)) {
                        *d = v;
                    }
                })?;
            }
        }
    }
    Some(())
}

/// Gathers the patch of output position `at` (`[d, h, w]`) of one group's
/// input planes `xg` into `col`, as `x - zx`; returns the patch's sum.
/// The in-bounds taps of a kernel row are the same on every row
/// (`valid_range`, once per position): each row is zeros, a run read from
/// the input line, zeros. `dims` is (channels per group, input plane
/// size, patch size), checked by [`conv`], as is `Geom::reach_ok`.
#[inline(always)]
fn gather<X: QInt>(
    xg: &[X],
    q: &QConvView<'_>,
    at: [usize; 3],
    col: &mut [i16],
    (cg, in_sz, kk): (usize, usize, usize),
) -> Option<i32> {
    let g = &q.p.g;
    let [i0, i1, i2] = g.inp;
    let [k0, k1, k2] = g.k;
    let (zx, d2) = (q.zx, g.d[2].max(1));
    // Window indices (`tap_in`): `Geom::reach_ok` was checked by `conv`.
    let ([a0, a1, a2], [s0, s1, s2], [dd0, dd1, _], [p0, p1, p2]) = (at, g.s, g.d, g.pb);
    let (lo, hi) = valid_range(k2, d2, a2.wrapping_mul(s2), p2, i2);
    let first = tap_in(a2, s2, lo, d2, p2);
    let mut rows = col.get_mut(..kk)?.chunks_exact_mut(k2.max(1));
    let mut sum = 0i32;
    for plane in xg.chunks_exact(in_sz.max(1)).take(cg) {
        for kd in 0..k0 {
            let id = tap_in(a0, s0, kd, dd0, p0);
            for kh in 0..k1 {
                let ih = tap_in(a1, s1, kh, dd1, p1);
                let dst = rows.next()?;
                dst.fill(0);
                if id >= i0 || ih >= i1 || lo >= hi {
                    continue;
                }
                // id < i0, ih < i1: the row lies in the plane.
                let row = id.wrapping_mul(i1).wrapping_add(ih).wrapping_mul(i2);
                let src = win(plane, row, i2)?.get(first..)?;
                let run = dst.get_mut(lo..hi)?;
                if d2 == 1 {
                    for (d, v) in run.iter_mut().zip(src) {
                        let v = v.get().wrapping_sub(zx);
                        *d = v as i16;
                        sum = sum.wrapping_add(v);
                    }
                } else {
                    for (d, v) in run.iter_mut().zip(src.iter().step_by(d2)) {
                        let v = v.get().wrapping_sub(zx);
                        *d = v as i16;
                        sum = sum.wrapping_add(v);
                    }
                }
            }
        }
    }
    Some(sum)
}

/// One group's output channels: weight rows (`kk` each), zero points,
/// bias, multipliers and output clamp.
struct Rows<'a, W> {
    w: &'a [W],
    kk: usize,
    zw: &'a [i32],
    bias: &'a [i32],
    mult: &'a [Requant],
    out: &'a OutQ,
}

impl<W: QInt> Rows<'_, W> {
    /// Every output channel's value at one position from its column
    /// (`sum` = Σ column), handed to `store(channel, value)`.
    #[inline(always)]
    fn outputs<const DSP_ORDER: bool, Y: QInt>(
        &self,
        col: &Col,
        sum: i32,
        mut store: impl FnMut(usize, Y),
    ) -> Option<()> {
        let kk = self.kk;
        let col = col.0.get(..kk.div_ceil(2))?;
        let n = self.zw.len();
        let last = n.saturating_sub(1);
        let mut oc = 0usize;
        // oc < n and r < 4: oc + r does not wrap; rows are windows of `w`
        // (`win` checks them).
        while oc < n {
            // Four rows at a time; past the last row, repeat it (the extra
            // sums are not stored).
            let row = |r: usize| win(self.w, oc.wrapping_add(r).min(last).wrapping_mul(kk), kk);
            let rows = [row(0)?, row(1)?, row(2)?, row(3)?];
            let acc = if DSP_ORDER {
                dot_dsp(rows, col, kk)
            } else {
                dot_plain(rows, col, kk)
            };
            for (r, a) in acc.iter().enumerate().take(n.wrapping_sub(oc)) {
                let i = oc.wrapping_add(r);
                let (zw, b, m) = (*self.zw.get(i)?, *self.bias.get(i)?, self.mult.get(i)?);
                let a = b.wrapping_add(*a).wrapping_sub(zw.wrapping_mul(sum));
                store(i, finish(a, m, self.out));
            }
            oc = oc.saturating_add(4);
        }
        Some(())
    }
}

/// The column's i16 values (natural order from `4 * (kk / 4)` on).
fn halves(col: &[u32]) -> &[i16] {
    bytemuck::cast_slice(col)
}

/// Four rows' dot products with a natural-order column (four separate
/// accumulators: an array indexed in the loop stays in memory). Out of
/// line, like [`dot_dsp`]: inlined into the convolution, its loop
/// competed for registers with the caller's and spilled its row pointers
/// (18 instructions per step instead of 11 on the Cortex-M55); a call per
/// four channels costs a few instructions against `4·kk` products.
#[inline(never)]
fn dot_plain<W: QInt>(rows: [&[W]; 4], col: &[u32], kk: usize) -> [i32; 4] {
    let [r0, r1, r2, r3] = rows;
    let (mut a0, mut a1, mut a2, mut a3) = (0i32, 0i32, 0i32, 0i32);
    let xs = halves(col).get(..kk).unwrap_or(&[]);
    let it = xs.iter().zip(r0).zip(r1).zip(r2).zip(r3);
    for ((((&x, w0), w1), w2), w3) in it {
        let x = i32::from(x);
        a0 = a0.wrapping_add(w0.get().wrapping_mul(x));
        a1 = a1.wrapping_add(w1.get().wrapping_mul(x));
        a2 = a2.wrapping_add(w2.get().wrapping_mul(x));
        a3 = a3.wrapping_add(w3.get().wrapping_mul(x));
    }
    [a0, a1, a2, a3]
}

/// Four rows' dot products with a DSP-order column ([`Col::reorder`]):
/// two `SMLAD`s per four weights and row, the tail plain. Out of line
/// (see [`dot_plain`]).
#[inline(never)]
fn dot_dsp<W: QInt>(rows: [&[W]; 4], col: &[u32], kk: usize) -> [i32; 4] {
    let [r0, r1, r2, r3] = rows;
    let (mut a0, mut a1, mut a2, mut a3) = (0i32, 0i32, 0i32, 0i32);
    // An index loop over arrays, not a five-way `zip`: in a large caller
    // at `opt-level = "s"` the zip's `next` stopped being inlined (a call
    // per four steps: ResNet-8 on the Cortex-M4 took 45 % more
    // instructions). `q < n` bounds every `get`, so no check remains.
    let (pairs, _) = col.as_chunks::<2>();
    let [q0, q1, q2, q3] = rows.map(|r| r.as_chunks::<4>().0);
    let n = (kk / 4)
        .min(pairs.len())
        .min(q0.len())
        .min(q1.len())
        .min(q2.len())
        .min(q3.len());
    for q in 0..n {
        let (Some(&[b02, b13]), Some(w0), Some(w1), Some(w2), Some(w3)) =
            (pairs.get(q), q0.get(q), q1.get(q), q2.get(q), q3.get(q))
        else {
            break;
        };
        a0 = mac4::<W>(a0, word(w0), b02, b13);
        a1 = mac4::<W>(a1, word(w1), b02, b13);
        a2 = mac4::<W>(a2, word(w2), b02, b13);
        a3 = mac4::<W>(a3, word(w3), b02, b13);
    }
    let mut a = [a0, a1, a2, a3];
    let k4 = kk & !3;
    let tail = halves(col).get(k4..kk).unwrap_or(&[]);
    for (p, &x) in tail.iter().enumerate() {
        let x = i32::from(x);
        for (acc, row) in a.iter_mut().zip([r0, r1, r2, r3]) {
            // k4 + p < kk.
            let w = row.get(k4.wrapping_add(p)).map_or(0, |v| v.get());
            *acc = acc.wrapping_add(w.wrapping_mul(x));
        }
    }
    a
}

/// `acc` plus four products: weights `v` (four bytes) with the column
/// pairs `b02` (values 0 and 2) and `b13` (1 and 3).
#[inline(always)]
fn mac4<W: QInt>(acc: i32, v: u32, b02: u32, b13: u32) -> i32 {
    let (w02, w13) = if W::LO < 0 {
        (sxtb16(v), sxtb16_ror8(v))
    } else {
        (v & 0x00ff_00ff, (v >> 8) & 0x00ff_00ff)
    };
    smlad(w13, b13, smlad(w02, b02, acc))
}

/// Four weights as one little-endian word (one load on Cortex-M4/M7).
#[inline(always)]
fn word<W: QInt>(w: &[W; 4]) -> u32 {
    let [a, b, c, d] = w;
    u32::from_le_bytes([a.bits(), b.bits(), c.bits(), d.bits()])
}

/// `SMLAD acc, a, b`: `acc + a.lo·b.lo + a.hi·b.hi` (signed halves),
/// modulo 2^32.
#[inline(always)]
fn smlad(a: u32, b: u32, acc: i32) -> i32 {
    #[cfg(mote_dsp)]
    {
        let r: i32;
        // SAFETY: register-only arithmetic (it may set the sticky Q flag,
        // which nothing reads).
        unsafe {
            core::arch::asm!(
                "smlad {r}, {a}, {b}, {c}",
                r = lateout(reg) r,
                a = in(reg) a,
                b = in(reg) b,
                c = in(reg) acc,
                options(pure, nomem, nostack),
            );
        }
        r
    }
    #[cfg(not(mote_dsp))]
    {
        // i16 × i16 products fit i32.
        let lo = (a as u16 as i16 as i32).wrapping_mul(b as u16 as i16 as i32);
        let hi = ((a >> 16) as u16 as i16 as i32).wrapping_mul((b >> 16) as u16 as i16 as i32);
        acc.wrapping_add(lo).wrapping_add(hi)
    }
}

/// `SXTB16 v`: bytes 0 and 2 sign-extended into the two halves.
#[inline(always)]
fn sxtb16(v: u32) -> u32 {
    #[cfg(mote_dsp)]
    {
        let r: u32;
        // SAFETY: register-only arithmetic.
        unsafe {
            core::arch::asm!(
                "sxtb16 {r}, {v}",
                r = lateout(reg) r,
                v = in(reg) v,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        r
    }
    #[cfg(not(mote_dsp))]
    {
        let lo = v as u8 as i8 as i16 as u16 as u32;
        let hi = (v >> 16) as u8 as i8 as i16 as u16 as u32;
        lo | (hi << 16)
    }
}

/// `SXTB16 v, ROR #8`: bytes 1 and 3 sign-extended into the two halves.
#[inline(always)]
fn sxtb16_ror8(v: u32) -> u32 {
    #[cfg(mote_dsp)]
    {
        let r: u32;
        // SAFETY: register-only arithmetic.
        unsafe {
            core::arch::asm!(
                "sxtb16 {r}, {v}, ror #8",
                r = lateout(reg) r,
                v = in(reg) v,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        r
    }
    #[cfg(not(mote_dsp))]
    {
        sxtb16(v.rotate_right(8))
    }
}

/// Pointwise convolution in place, `m == c` (see
/// [`super::qconv::can_conv_in_place`]): each pixel's channels are
/// gathered into the column before its outputs overwrite them.
pub(crate) fn pointwise_in_place<T: QInt, W: QInt, const DSP_ORDER: bool>(
    w: &[W],
    y: &mut [T],
    q: &QConvView<'_>,
) -> Option<()> {
    let (p, sz) = (&q.p, q.p.g.checked_sizes()?.0);
    let c_n = p.c;
    if c_n > KMAX || p.m != c_n || !zero_points_fit(&[q.zx]) {
        return None;
    }
    // An image is c_n · sz values (checked): ch · sz + px and oc · sz + px
    // (ch, oc < c_n, px < sz) lie in it.
    let img_len = c_n.checked_mul(sz)?;
    let rows = Rows {
        w: win(w, 0, p.m.checked_mul(c_n)?)?,
        kk: c_n,
        zw: q.zw.get(..p.m)?,
        bias: q.bias.get(..p.m)?,
        mult: q.mult.get(..p.m)?,
        out: &q.out,
    };
    let mut col = Col::new();
    for img in y.chunks_exact_mut(img_len.max(1)) {
        for px in 0..sz {
            let mut sum = 0i32;
            for (ch, d) in col.values().iter_mut().take(c_n).enumerate() {
                let v = img
                    .get(ch.wrapping_mul(sz).wrapping_add(px))?
                    .get()
                    .wrapping_sub(q.zx);
                *d = v as i16;
                sum = sum.wrapping_add(v);
            }
            if DSP_ORDER {
                col.reorder(c_n);
            }
            rows.outputs::<DSP_ORDER, T>(&col, sum, |oc, v| {
                if let Some(d) = img.get_mut(oc.wrapping_mul(sz).wrapping_add(px)) {
                    *d = v;
                }
            })?;
        }
    }
    Some(())
}

/// Most values of a depthwise band: `k_h` padded input rows, each as wide
/// as the output row reads (2 × this many bytes of stack).
pub(crate) const DW_BAND: usize = 384;
/// Most taps of a depthwise kernel.
pub(crate) const DW_TAPS: usize = 64;

/// Padded width of a depthwise band row: the input columns one output row
/// reads, `(o_w - 1)·s_w + (k_w - 1)·d_w + 1`.
fn band_width(g: &super::Geom) -> Option<usize> {
    let [_, _, o2] = g.out;
    let [_, _, k2] = g.k;
    if o2 == 0 || k2 == 0 {
        return Some(0);
    }
    // o2, k2 >= 1: the `- 1`s do not wrap.
    o2.wrapping_sub(1)
        .checked_mul(g.s[2])?
        .checked_add(k2.wrapping_sub(1).checked_mul(g.d[2])?)?
        .checked_add(1)
}

/// Whether [`dw_plane`] takes this depthwise convolution: 2-D, its band
/// and taps fit, and `x - zx` fits an i16.
pub(crate) fn dw_fits(q: &QConvView<'_>) -> bool {
    let g = &q.p.g;
    let band = band_width(g).and_then(|w| w.checked_mul(g.k[1]));
    g.k[0] == 1
        && g.inp[0] == 1
        && g.out[0] == 1
        && g.pb[0] == 0
        && band.is_some_and(|b| b <= DW_BAND)
        && g.k[1].checked_mul(g.k[2]).is_some_and(|t| t <= DW_TAPS)
        && zero_points_fit(&[q.zx])
}

/// One channel `c` of a depthwise convolution ([`dw_fits`]): for each
/// output row, the `k_h` input rows it reads are copied as `x - zx` into a
/// band with the padding as zeros, so the taps run with no bounds tests;
/// the weights minus their zero point are taken once per plane.
/// `band` is the caller's scratch of [`DW_BAND`] values (zeroing it once
/// per convolution rather than per plane).
pub(crate) fn dw_plane<X: QInt, W: QInt, Y: QInt>(
    xp: &[X],
    wp: &[W],
    yo: &mut [Y],
    c: usize,
    q: &QConvView<'_>,
    band: &mut [i16],
) -> Option<()> {
    let g = &q.p.g;
    let ([_, o1, o2], [_, i1, i2], [_, k1, k2]) = (g.out, g.inp, g.k);
    let (s1, s2, d1, d2) = (g.s[1], g.s[2].max(1), g.d[1], g.d[2].max(1));
    let (pb1, pb2, zx) = (g.pb[1], g.pb[2], q.zx);
    let bw = band_width(g)?;
    // Bounds checked once: the window reach (`Geom::reach_ok`: oh·s1 + kh·d1 does
    // not wrap), o1 rows of o2 outputs in `yo`, k1 band rows of bw (each
    // output's taps ow·s2 + kw·d2 < bw, `band_width`), ih < i1 rows of i2 in
    // `xp` (`win`); offsets under them wrap by name.
    if !g.reach_ok() || o1.checked_mul(o2)? > yo.len() {
        return None;
    }
    let (zw, b, r) = (*q.zw.get(c)?, *q.bias.get(c)?, q.mult.get(c)?);
    let mut wz = [0i32; DW_TAPS];
    for (d, v) in wz.iter_mut().zip(wp.get(..k1.checked_mul(k2)?)?) {
        *d = v.get().wrapping_sub(zw);
    }
    let band = band.get_mut(..k1.checked_mul(bw)?)?;
    // The padding columns stay zero: rows only ever write their interior
    // (a row over the top or bottom padding is zeroed whole).
    band.fill(0);
    for oh in 0..o1 {
        for kh in 0..k1 {
            let dst = win_mut(band, kh.wrapping_mul(bw), bw)?;
            let ih = oh
                .wrapping_mul(s1)
                .wrapping_add(kh.wrapping_mul(d1))
                .wrapping_sub(pb1);
            if ih >= i1 {
                dst.fill(0);
                continue;
            }
            // Band column t reads input column t - pb_w.
            if let Some(d) = dst.get_mut(pb2..) {
                for (d, v) in d.iter_mut().zip(win(xp, ih.wrapping_mul(i2), i2)?) {
                    *d = v.get().wrapping_sub(zx) as i16;
                }
            }
        }
        let yrow = win_mut(yo, oh.wrapping_mul(o2), o2)?;
        if k1 == 3 && k2 == 3 && d2 == 1 {
            // The common 3×3 kernel: nine taps in straight-line code.
            let (r0, rest) = band.split_at_checked(bw)?;
            let (r1, r2) = rest.split_at_checked(bw)?;
            let [w0, w1, w2, w3, w4, w5, w6, w7, w8, ..] = wz;
            for (ow, yv) in yrow.iter_mut().enumerate() {
                let i = ow.wrapping_mul(s2);
                let (Some(&[a0, a1, a2]), Some(&[b0, b1, b2]), Some(&[c0, c1, c2])) =
                    (win(r0, i, 3), win(r1, i, 3), win(r2, i, 3))
                else {
                    return None;
                };
                let t = |x: i16, w: i32| i32::from(x).wrapping_mul(w);
                let acc = b
                    .wrapping_add(t(a0, w0).wrapping_add(t(a1, w1)).wrapping_add(t(a2, w2)))
                    .wrapping_add(t(b0, w3).wrapping_add(t(b1, w4)).wrapping_add(t(b2, w5)))
                    .wrapping_add(t(c0, w6).wrapping_add(t(c1, w7)).wrapping_add(t(c2, w8)));
                *yv = finish(acc, r, &q.out);
            }
            continue;
        }
        for (ow, yv) in yrow.iter_mut().enumerate() {
            let mut acc = b;
            for (kh, wr) in wz.chunks_exact(k2.max(1)).take(k1).enumerate() {
                let at = kh.wrapping_mul(bw).wrapping_add(ow.wrapping_mul(s2));
                let row = band.get(at..)?;
                if d2 == 1 {
                    for (x, w) in row.iter().zip(wr) {
                        acc = acc.wrapping_add(i32::from(*x).wrapping_mul(*w));
                    }
                } else {
                    for (x, w) in row.iter().step_by(d2).zip(wr) {
                        acc = acc.wrapping_add(i32::from(*x).wrapping_mul(*w));
                    }
                }
            }
            *yv = finish(acc, r, &q.out);
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dsp_model_matches_the_plain_sums() {
        // smlad / sxtb16 models against their definitions on edge values.
        for &(a, b) in &[
            (0x8000_7fffu32, 0x7fff_8000u32),
            (0xffff_ffff, 0x0001_0001),
            (0, 0),
        ] {
            let want = 7i32
                .wrapping_add((a as u16 as i16 as i32) * (b as u16 as i16 as i32))
                .wrapping_add(((a >> 16) as i16 as i32) * ((b >> 16) as i16 as i32));
            assert_eq!(smlad(a, b, 7), want);
        }
        assert_eq!(sxtb16(0x7f80_ff01), 0x0080_0001 | 0xff80_0000);
        assert_eq!(sxtb16(0x12ff_34fe), 0xffff_fffe);
        assert_eq!(sxtb16_ror8(0x80ff_7f01), 0xff80_007f);
    }
}
