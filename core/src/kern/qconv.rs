//! Integer convolution, matrix product and requantize-and-clamp: the
//! kernels of the fused QDQ nodes `mote.QConv`, `mote.QMatMul` and
//! `mote.QRequant` (see `ops::qdq` for the arithmetic they implement).

use super::requant::{clamp, Requant};
use super::{check_len, valid_range, Geom, QInt};
use crate::error::Result;

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
fn tap_range(g: &Geom, ax: usize, o: usize) -> (usize, usize) {
    let (s, d, pb, n, k) = (g.s[ax], g.d[ax], g.pb[ax], g.inp[ax], g.k[ax]);
    let start = o * s; // input coordinate of tap 0, plus pb
    let lo = if start >= pb {
        0
    } else {
        (pb - start).div_ceil(d)
    };
    // tap t is inside when start + t·d - pb < n, i.e. t·d < n + pb - start.
    let hi = match (n + pb).checked_sub(start) {
        Some(room) => room.div_ceil(d).min(k),
        None => 0,
    };
    (lo, hi.max(lo))
}

#[inline]
fn finish<Y: QInt>(acc: i32, r: &Requant, o: &OutQ) -> Y {
    Y::from_sat(clamp(r.apply(acc), o.zy, o.lo, o.hi))
}

fn check_conv<X, W, Y>(x: &[X], w: &[W], y: &[Y], q: &QConvView<'_>) -> Result<()> {
    let p = &q.p;
    let cg = p.c / p.group.max(1);
    check_len(x.len(), p.batch * p.c * p.g.in_size())?;
    check_len(w.len(), p.m * cg * p.g.k_size())?;
    check_len(y.len(), p.batch * p.m * p.g.out_size())?;
    check_len(q.zw.len(), p.m)?;
    check_len(q.bias.len(), p.m)?;
    check_len(q.mult.len(), p.m)?;
    if p.group == 0 || p.c % p.group != 0 || p.m % p.group != 0 {
        return Err(crate::Error::new(crate::ErrorKind::Shape(
            "QConv: channels must divide into groups",
        )));
    }
    geom_ok(&p.g)
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

/// Output positions of one row accumulated at a time, on the stack.
const ROW: usize = 64;
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
    #[cfg(all(target_arch = "x86_64", feature = "alloc"))]
    if super::cpu::kernels() == super::cpu::Kernels::Avx2Fma {
        // SAFETY: `Avx2Fma` is selected only when the CPU has AVX2 (see
        // `cpu::enable_avx2_fma`). The same integer code compiled for
        // AVX2: the sums are exact, so the result is bit-identical.
        unsafe { qconv_avx2(x, w, y, q) };
        return Ok(());
    }
    qconv_body(x, w, y, q);
    Ok(())
}

#[cfg(all(target_arch = "x86_64", feature = "alloc"))]
#[target_feature(enable = "avx2")]
unsafe fn qconv_avx2<X: QInt, W: QInt, Y: QInt>(x: &[X], w: &[W], y: &mut [Y], q: &QConvView<'_>) {
    qconv_body(x, w, y, q)
}

/// [`qconv`] after its checks.
#[inline(always)]
fn qconv_body<X: QInt, W: QInt, Y: QInt>(x: &[X], w: &[W], y: &mut [Y], q: &QConvView<'_>) {
    let p = &q.p;
    let g = &p.g;
    let (in_sz, out_sz, k_sz) = (g.in_size(), g.out_size(), g.k_size());
    let cg = p.c / p.group;
    let mg = p.m / p.group;
    let [o0, o1, o2] = g.out;
    let (s2, d2, pb2, n2) = (g.s[2], g.d[2], g.pb[2], g.inp[2]);
    // In-bounds output columns of each kernel column (the same on every row).
    let mut cols = [(0usize, 0usize); KCOLS];
    for (kw, c) in cols.iter_mut().enumerate().take(g.k[2]) {
        *c = valid_range(o2, s2, kw * d2, pb2, n2);
    }
    let col = |kw: usize| match cols.get(kw) {
        Some(&c) if kw < g.k[2] => c,
        _ => valid_range(o2, s2, kw * d2, pb2, n2),
    };
    let mut accs = [0i32; ROW];
    for ni in 0..p.batch {
        for oc in 0..p.m {
            let grp = oc / mg.max(1);
            let xg = &x[(ni * p.c + grp * cg) * in_sz..][..cg * in_sz];
            let wk = &w[oc * cg * k_sz..][..cg * k_sz];
            let (zw, b, r) = (q.zw[oc], q.bias[oc], &q.mult[oc]);
            let yo = &mut y[(ni * p.m + oc) * out_sz..][..out_sz];
            for od in 0..o0 {
                let rd = tap_range(g, 0, od);
                for oh in 0..o1 {
                    let rh = tap_range(g, 1, oh);
                    let mut ow0 = 0;
                    while ow0 < o2 {
                        let wlen = ROW.min(o2 - ow0);
                        let acc = &mut accs[..wlen];
                        acc.fill(b);
                        for c in 0..cg {
                            let xp = &xg[c * in_sz..][..in_sz];
                            let wp = &wk[c * k_sz..][..k_sz];
                            for kd in rd.0..rd.1 {
                                let id = od * g.s[0] + kd * g.d[0] - g.pb[0];
                                for kh in rh.0..rh.1 {
                                    let ih = oh * g.s[1] + kh * g.d[1] - g.pb[1];
                                    let xrow = &xp[(id * g.inp[1] + ih) * n2..][..n2];
                                    let wrow = &wp[(kd * g.k[1] + kh) * g.k[2]..][..g.k[2]];
                                    for (kw, wv) in wrow.iter().enumerate() {
                                        let wv = wv.get() - zw;
                                        if wv == 0 {
                                            continue;
                                        }
                                        let (lo, hi) = col(kw);
                                        let (lo, hi) = (lo.max(ow0), hi.min(ow0 + wlen));
                                        if CONTIGUOUS && s2 == 1 && lo < hi {
                                            // Unit stride: slices the compiler
                                            // vectorizes (same exact sums).
                                            let from = lo + kw * d2 - pb2;
                                            let xs = &xrow[from..from + (hi - lo)];
                                            let wv = wv as i16 as i32;
                                            for (a, xv) in
                                                acc[lo - ow0..hi - ow0].iter_mut().zip(xs)
                                            {
                                                let xv = (xv.get() - q.zx) as i16 as i32;
                                                *a = a.wrapping_add(xv * wv);
                                            }
                                            continue;
                                        }
                                        for ow in lo..hi {
                                            let xv = xrow[ow * s2 + kw * d2 - pb2].get() - q.zx;
                                            let a = &mut acc[ow - ow0];
                                            *a = a.wrapping_add(xv * wv);
                                        }
                                    }
                                }
                            }
                        }
                        let yrow = &mut yo[(od * o1 + oh) * o2 + ow0..][..wlen];
                        for (yv, a) in yrow.iter_mut().zip(acc.iter()) {
                            *yv = finish(*a, r, &q.out);
                        }
                        ow0 += wlen;
                    }
                }
            }
        }
    }
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
    let g = &p.g;
    let (in_sz, out_sz, k_sz) = (g.in_size(), g.out_size(), g.k_size());
    for ni in 0..p.batch {
        for c in 0..p.c {
            let xp = &x[(ni * p.c + c) * in_sz..][..in_sz];
            let yo = &mut y[(ni * p.c + c) * out_sz..][..out_sz];
            dw_plane(xp, &w[c * k_sz..][..k_sz], yo, c, q);
        }
    }
    Ok(())
}

/// One channel of a depthwise convolution.
#[inline]
fn dw_plane<X: QInt, W: QInt, Y: QInt>(
    xp: &[X],
    wp: &[W],
    yo: &mut [Y],
    c: usize,
    q: &QConvView<'_>,
) {
    let g = &q.p.g;
    let [o0, o1, o2] = g.out;
    let (zw, b, r) = (q.zw[c], q.bias[c], &q.mult[c]);
    let mut i = 0;
    for od in 0..o0 {
        let rd = tap_range(g, 0, od);
        for oh in 0..o1 {
            let rh = tap_range(g, 1, oh);
            for ow in 0..o2 {
                let rw = tap_range(g, 2, ow);
                let mut acc = b;
                for kd in rd.0..rd.1 {
                    let id = od * g.s[0] + kd * g.d[0] - g.pb[0];
                    for kh in rh.0..rh.1 {
                        let ih = oh * g.s[1] + kh * g.d[1] - g.pb[1];
                        let xrow = &xp[(id * g.inp[1] + ih) * g.inp[2]..][..g.inp[2]];
                        let wrow = &wp[(kd * g.k[1] + kh) * g.k[2]..][..g.k[2]];
                        let iw0 = ow * g.s[2] + rw.0 * g.d[2] - g.pb[2];
                        for (t, kw) in (rw.0..rw.1).enumerate() {
                            let xv = xrow[iw0 + t * g.d[2]].get() - q.zx;
                            acc = acc.wrapping_add(xv * (wrow[kw].get() - zw));
                        }
                    }
                }
                yo[i] = finish(acc, r, &q.out);
                i += 1;
            }
        }
    }
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
    // Lengths as in check_conv, with x = y (same size by can_conv_in_place).
    check_len(y.len(), p.batch * p.m * p.g.out_size())?;
    check_len(w.len(), p.m * (p.c / p.group.max(1)) * p.g.k_size())?;
    for v in [q.zw.len(), q.bias.len(), q.mult.len()] {
        check_len(v, p.m)?;
    }
    let sz = p.g.in_size();
    let mut buf = [T::default(); INPLACE_PLANE];
    if p.is_depthwise() && sz <= INPLACE_PLANE {
        let k_sz = p.g.k_size();
        for (c, plane) in y.chunks_exact_mut(sz.max(1)).enumerate() {
            let c = c % p.c;
            let saved = &mut buf[..sz];
            saved.copy_from_slice(plane);
            dw_plane(saved, &w[c * k_sz..][..k_sz], plane, c, q);
        }
        return Ok(());
    }
    // Pointwise, m == c: gather a pixel's channels, then write its outputs.
    let c_n = p.c;
    for img in y.chunks_exact_mut((c_n * sz).max(1)) {
        for px in 0..sz {
            let xs = &mut buf[..c_n];
            for (ch, v) in xs.iter_mut().enumerate() {
                *v = img[ch * sz + px];
            }
            for oc in 0..p.m {
                let wr = &w[oc * c_n..][..c_n];
                let zw = q.zw[oc];
                let mut acc = q.bias[oc];
                for (xv, wv) in xs.iter().zip(wr) {
                    acc = acc.wrapping_add((xv.get() - q.zx) * (wv.get() - zw));
                }
                img[oc * sz + px] = finish(acc, &q.mult[oc], &q.out);
            }
        }
    }
    Ok(())
}

/// Integer matrix product with per-column requantization.
pub(crate) fn qmatmul<A: QInt, B: QInt, Y: QInt>(
    a: &[A],
    b: &[B],
    y: &mut [Y],
    q: &QMmView<'_>,
) -> Result<()> {
    let (k, n) = (q.k, q.n);
    check_len(a.len(), q.rows * k)?;
    check_len(b.len(), k * n)?;
    check_len(y.len(), q.rows * n)?;
    for v in [q.zb.len(), q.bias.len(), q.mult.len()] {
        check_len(v, n)?;
    }
    if q.trans_b {
        // B is [N, K]: each output is a contiguous dot product.
        for (arow, yrow) in a.chunks_exact(k.max(1)).zip(y.chunks_exact_mut(n.max(1))) {
            for (j, yv) in yrow.iter_mut().enumerate() {
                let brow = &b[j * k..][..k];
                let zb = q.zb[j];
                let mut acc = q.bias[j];
                for (av, bv) in arow.iter().zip(brow) {
                    acc = acc.wrapping_add((av.get() - q.za) * (bv.get() - zb));
                }
                *yv = finish(acc, &q.mult[j], &q.out);
            }
        }
        return Ok(());
    }
    // B is [K, N]: accumulate a strip of up to STRIP sums on the stack,
    // walking B by rows (contiguous reads, no arena scratch).
    const STRIP: usize = 32;
    let mut acc = [0i32; STRIP];
    for r in 0..q.rows {
        let arow = &a[r * k..][..k];
        let mut j0 = 0;
        while j0 < n {
            let w = STRIP.min(n - j0);
            let acc = &mut acc[..w];
            acc.copy_from_slice(&q.bias[j0..j0 + w]);
            let zb = &q.zb[j0..j0 + w];
            for (p, av) in arow.iter().enumerate() {
                let av = av.get() - q.za;
                if av == 0 {
                    continue;
                }
                let brow = &b[p * n + j0..][..w];
                for ((s, bv), z) in acc.iter_mut().zip(brow).zip(zb) {
                    *s = s.wrapping_add(av * (bv.get() - z));
                }
            }
            let yrow = &mut y[r * n + j0..][..w];
            for ((yv, s), m) in yrow.iter_mut().zip(acc.iter()).zip(&q.mult[j0..j0 + w]) {
                *yv = finish(*s, m, &q.out);
            }
            j0 += w;
        }
    }
    Ok(())
}

/// `y = clamp(requant(x - zx))`; `x = None` runs in place on `y`.
pub(crate) fn qrequant<X: QInt, Y: QInt>(
    x: Option<&[X]>,
    y: &mut [Y],
    zx: i32,
    r: &Requant,
    o: &OutQ,
) -> Result<()> {
    match x {
        None => {
            for v in y.iter_mut() {
                *v = finish(v.get() - zx, r, o);
            }
        }
        Some(x) => {
            check_len(y.len(), x.len())?;
            for (yv, xv) in y.iter_mut().zip(x) {
                *yv = finish(xv.get() - zx, r, o);
            }
        }
    }
    Ok(())
}
