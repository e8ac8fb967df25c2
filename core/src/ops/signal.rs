//! Signal processing: DFT, STFT, the Hann/Hamming/Blackman windows and
//! MelWeightMatrix.
//!
//! Transforms are direct O(n²) sums over twiddle tables built at prepare,
//! accumulated in f64; that is exact enough for the short lengths ONNX
//! models use and needs no scratch. Windows and mel matrices depend only on
//! build-time values, so they are computed at prepare as constants.

use alloc::vec;
use alloc::vec::Vec;

use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::kern::win;
use crate::model::Const;
use crate::ops::util::{axis as norm_axis, dtype_in};
use crate::ops::{kernel, OpDef, PrepareCtx, Prepared};
use crate::tensor::ChunksOf as _;
use crate::DType;

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("DFT", 17, prepare_dft),
    OpDef::onnx("STFT", 17, prepare_stft),
    OpDef::onnx("HannWindow", 17, prepare_hann),
    OpDef::onnx("HammingWindow", 17, prepare_hamming),
    OpDef::onnx("BlackmanWindow", 17, prepare_blackman),
    OpDef::onnx("MelWeightMatrix", 17, prepare_mel),
];

fn shape_err(s: &'static str) -> Error {
    Error::new(ErrorKind::Shape(s))
}

fn overflow() -> Error {
    Error::new(ErrorKind::Overflow)
}

/// Checks that `k · t` fits for every `k < a` and `t < b`: the largest,
/// `(a - 1)(b - 1)`, is checked (Overflow).
fn check_products(a: usize, b: usize) -> Result<()> {
    a.saturating_sub(1)
        .checked_mul(b.saturating_sub(1))
        .map(|_| ())
        .ok_or_else(overflow)
}

/// Bins of the one-sided spectrum of an `n`-point transform: `n / 2 + 1`
/// (`n / 2 < usize::MAX`, so the sum is exact).
#[inline]
fn onesided_bins(n: usize) -> usize {
    (n / 2).wrapping_add(1)
}

/// A scalar (or one-element) integer input known at build time.
fn const_scalar(ctx: &PrepareCtx<'_>, i: usize) -> Result<Option<i64>> {
    match ctx.const_ints(i)? {
        None => Ok(None),
        Some(v) => match *v {
            [x] => Ok(Some(x)),
            _ => Err(shape_err("expected a scalar input")),
        },
    }
}

/// cos and sin of 2πj/n for j in 0..n.
fn twiddles(n: usize) -> Vec<(f64, f64)> {
    (0..n)
        .map(|j| {
            let a = 2.0 * core::f64::consts::PI * j as f64 / n as f64;
            (libm::cos(a), libm::sin(a))
        })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Dir {
    Forward,
    Inverse,
    /// Inverse of a one-sided spectrum: Hermitian-extended, real output.
    InverseReal,
}

/// Geometry of one transform over a `[outer, len, inner, comps]` layout.
#[derive(Clone, Copy, Debug)]
struct Layout {
    outer: usize,
    inner: usize,
    n_in: usize,
    c_in: usize,
    n_out: usize,
    c_out: usize,
}

impl Layout {
    /// Whether `x` points in and `y` points out hold the whole layout:
    /// `outer · n_in · inner` and `outer · n_out · inner` (checked).
    fn fits(&self, x: usize, y: usize) -> bool {
        let need = |n: usize| self.outer.checked_mul(n)?.checked_mul(self.inner);
        need(self.n_in).is_some_and(|v| v <= x) && need(self.n_out).is_some_and(|v| v <= y)
    }

    /// Point 0 of line `(o, i)` with `n` (`n_in` or `n_out`) points a line:
    /// `o · n · inner + i`. With `o < outer`, `i < inner` and [`Self::fits`]
    /// true, that is below `outer · n · inner` (or is `i` for `n = 0`), so
    /// the wrapping operations are exact.
    #[inline]
    fn start(&self, o: usize, n: usize, i: usize) -> usize {
        o.wrapping_mul(n).wrapping_mul(self.inner).wrapping_add(i)
    }
}

/// Values as complex pairs (the last axis of size 2).
fn pairs(x: &[f32]) -> Result<&[C]> {
    bytemuck::try_cast_slice(x)
        .map_err(|_| Error::new(ErrorKind::Internal("signal: complex pairs")))
}

fn pairs_mut(x: &mut [f32]) -> Result<&mut [C]> {
    bytemuck::try_cast_slice_mut(x)
        .map_err(|_| Error::new(ErrorKind::Internal("signal: complex pairs")))
}

/// An input point: a real value (imaginary part 0) or a complex pair.
trait Point: Copy {
    fn parts(self) -> (f64, f64);
    /// Both parts times `w` (a real point's imaginary part stays 0).
    fn scaled(self, w: f64) -> (f64, f64);
}

impl Point for f32 {
    #[inline]
    fn parts(self) -> (f64, f64) {
        (self as f64, 0.0)
    }
    #[inline]
    fn scaled(self, w: f64) -> (f64, f64) {
        (self as f64 * w, 0.0)
    }
}

impl Point for C {
    #[inline]
    fn parts(self) -> (f64, f64) {
        let [re, im] = self;
        (re as f64, im as f64)
    }
    #[inline]
    fn scaled(self, w: f64) -> (f64, f64) {
        let [re, im] = self;
        (re as f64 * w, im as f64 * w)
    }
}

/// An output point: a real value (the imaginary part dropped) or a pair.
trait OutPoint {
    fn set(&mut self, re: f32, im: f32);
}

impl OutPoint for f32 {
    #[inline]
    fn set(&mut self, re: f32, _im: f32) {
        *self = re;
    }
}

impl OutPoint for C {
    #[inline]
    fn set(&mut self, re: f32, im: f32) {
        *self = [re, im];
    }
}

/// Transforms every line of `x` into `y` (one point per component group:
/// `x` is `f32` for `c_in = 1`, pairs for 2, likewise `y` for `c_out`);
/// `n` is the DFT length.
fn transform<P: Point, Q: OutPoint>(
    x: &[P],
    y: &mut [Q],
    l: Layout,
    n: usize,
    dir: Dir,
    tw: &[(f64, f64)],
) -> Result<()> {
    let Layout {
        outer,
        inner,
        n_in,
        n_out,
        ..
    } = l;
    if inner == 0 {
        return Ok(());
    }
    if !l.fits(x.len(), y.len()) {
        return Err(Error::new(ErrorKind::Internal("DFT: buffer sizes")));
    }
    // Exactly n entries, so every `(k * t) % n` below is in range.
    let tw = tw.get(..n).ok_or(Error::internal("signal index"))?;
    let used = match dir {
        Dir::InverseReal => n_in.min(onesided_bins(n)),
        _ => n_in.min(n),
    };
    // k < n_out and t < used: every k · t fits once the largest does.
    check_products(n_out, used)?;
    // The Nyquist bin t = n / 2 of an even length (2t == n).
    let nyquist = n.is_multiple_of(2).then_some(n / 2);
    let scale = if dir == Dir::Forward {
        1.0
    } else {
        1.0 / n as f64
    };
    for o in 0..outer {
        for i in 0..inner {
            // Point t of this line is x[(o * n_in + t) * inner + i], output
            // point k is y[(o * n_out + k) * inner + i].
            let line = x.iter().skip(l.start(o, n_in, i)).step_by(inner);
            let out = y.iter_mut().skip(l.start(o, n_out, i)).step_by(inner);
            for (k, yk) in out.take(n_out).enumerate() {
                let (mut re, mut im) = (0f64, 0f64);
                for (t, p) in line.clone().take(used).enumerate() {
                    let (xr, xi) = p.parts();
                    // Exact: k · t fits (check_products above).
                    let (c, s) = *k
                        .wrapping_mul(t)
                        .checked_rem(n)
                        .and_then(|j| tw.get(j))
                        .ok_or(Error::internal("signal index"))?;
                    match dir {
                        // x * e^{-iθ}
                        Dir::Forward => {
                            re += xr * c + xi * s;
                            im += xi * c - xr * s;
                        }
                        // x * e^{+iθ}
                        Dir::Inverse => {
                            re += xr * c - xi * s;
                            im += xi * c + xr * s;
                        }
                        Dir::InverseReal => {
                            // Bins other than DC and Nyquist stand for their
                            // conjugate mirror too.
                            let w = if t == 0 || Some(t) == nyquist {
                                1.0
                            } else {
                                2.0
                            };
                            re += w * (xr * c - xi * s);
                        }
                    }
                }
                yk.set((re * scale) as f32, (im * scale) as f32);
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------ f32 c2c FFT
//
// The expected outputs come from numpy's pocketfft run in single precision,
// and values that are mathematically zero carry its f32 rounding residue
// (~1e-7, the size of the suite's atol). Reproducing pocketfft's radix-2/3/
// 4/5 passes operation for operation gives the same residue; lengths with
// other factors fall back to the f64 direct sum.

type C = [f32; 2];

#[inline]
fn cadd(a: C, b: C) -> C {
    [a[0] + b[0], a[1] + b[1]]
}

#[inline]
fn csub(a: C, b: C) -> C {
    [a[0] - b[0], a[1] - b[1]]
}

/// `v` times `w` (backward) or times conj(`w`) (forward).
#[inline]
fn smul(v: C, w: C, fwd: bool) -> C {
    if fwd {
        [v[0] * w[0] + v[1] * w[1], v[1] * w[0] - v[0] * w[1]]
    } else {
        [v[0] * w[0] - v[1] * w[1], v[0] * w[1] + v[1] * w[0]]
    }
}

/// pocketfft's `cfftp` plan: radix factors with their twiddle offsets.
#[derive(Debug)]
struct Cfftp {
    n: usize,
    fact: Vec<(usize, usize)>,
    tw: Vec<C>,
}

impl Cfftp {
    /// The plan for length `n`, or `None` when a factor is not 2, 3, 4 or 5
    /// (pocketfft would use radix 7, 8, 11, a generic pass or Bluestein).
    fn new(n: usize) -> Option<Self> {
        if n == 0 {
            return None;
        }
        let mut f: Vec<usize> = Vec::new();
        let mut len = n;
        if len.is_multiple_of(8) {
            return None;
        }
        let mut fours = 0usize;
        while len.is_multiple_of(4) {
            fours = fours.wrapping_add(1); // at most log4(n) < usize::BITS
            len /= 4;
        }
        // A factor 2 goes first, then the 4s.
        if len.is_multiple_of(2) {
            len /= 2;
            f.push(2);
        }
        f.extend(core::iter::repeat_n(4, fours));
        let mut d = 3usize;
        while d.checked_mul(d).is_some_and(|dd| dd <= len) {
            while len.checked_rem(d) == Some(0) {
                f.push(d);
                len = len.checked_div(d)?;
            }
            d = d.wrapping_add(2); // d · d <= len: d + 2 is far from usize::MAX
        }
        if len > 1 {
            f.push(len);
        }
        if f.iter().any(|&p| p > 5) {
            return None;
        }
        let root = |m: usize| -> C {
            let a = 2.0 * core::f64::consts::PI * m as f64 / n as f64;
            [libm::cos(a) as f32, libm::sin(a) as f32]
        };
        let mut tw = Vec::new();
        let mut fact = Vec::new();
        let mut l1 = 1usize;
        for &ip in &f {
            let l1_ip = l1.checked_mul(ip)?;
            let ido = n.checked_div(l1_ip)?;
            fact.push((ip, tw.len()));
            for j in 1..ip {
                for i in 1..ido {
                    // j < ip and i < ido = n / (l1 · ip): below n, exact.
                    tw.push(root(j.wrapping_mul(l1).wrapping_mul(i)));
                }
            }
            l1 = l1_ip;
        }
        Some(Cfftp { n, fact, tw })
    }

    /// Transforms `c` in place (`ch` is a work buffer of the same length),
    /// then scales by `fct` unless it is 1.
    fn exec(&self, c: &mut [C], ch: &mut [C], fwd: bool, fct: f32) -> Result<()> {
        let n = self.n;
        let c = c.get_mut(..n).ok_or(fft_err())?;
        let ch = ch.get_mut(..n).ok_or(fft_err())?;
        if n == 1 {
            for v in c.iter_mut() {
                *v = [v[0] * fct, v[1] * fct];
            }
            return Ok(());
        }
        let mut l1 = 1usize;
        let mut in_c = true;
        for &(ip, off) in &self.fact {
            let l1_ip = l1.checked_mul(ip).ok_or(fft_err())?;
            let ido = n.checked_div(l1_ip).ok_or(fft_err())?;
            if ido == 0 {
                return Err(fft_err());
            }
            let wa = self.tw.get(off..).ok_or(fft_err())?;
            let (src, dst): (&[C], &mut [C]) = if in_c {
                (&*c, &mut *ch)
            } else {
                (&*ch, &mut *c)
            };
            match ip {
                2 => pass2(ido, l1, src, dst, wa, fwd)?,
                3 => pass3(ido, l1, src, dst, wa, fwd)?,
                4 => pass4(ido, l1, src, dst, wa, fwd)?,
                _ => pass5(ido, l1, src, dst, wa, fwd)?,
            }
            in_c = !in_c;
            l1 = l1_ip;
        }
        if !in_c {
            for (d, s) in c.iter_mut().zip(ch.iter()) {
                *d = if fct != 1.0 {
                    [s[0] * fct, s[1] * fct]
                } else {
                    *s
                };
            }
        } else if fct != 1.0 {
            for d in c.iter_mut() {
                *d = [d[0] * fct, d[1] * fct];
            }
        }
        Ok(())
    }
}

fn fft_err() -> Error {
    Error::new(ErrorKind::Internal("DFT: FFT plan"))
}

// A pass of radix `ip` reads `cc` as `[l1][ip][ido]` and writes `ch` as
// `[ip][l1][ido]`: for each k, `ip` input rows of `ido` points (one group)
// go to row k of each of the `ip` output planes. Point i > 0 of output
// plane u > 0 is then multiplied by twiddle `wa[(u - 1) * (ido - 1) + i - 1]`.

/// The twiddles of output plane `u` (1-based), by point: none for point 0.
fn plane_twiddles(
    wa: &[C],
    ido: usize,
    u: usize,
) -> Result<impl Iterator<Item = Option<&C>> + Clone> {
    let m = ido.checked_sub(1).ok_or(fft_err())?;
    let at = u
        .checked_sub(1)
        .and_then(|v| v.checked_mul(m))
        .ok_or(fft_err())?;
    let w = win(wa, at, m).ok_or(fft_err())?;
    Ok(core::iter::once(None).chain(w.iter().map(Some)))
}

/// `v` times a twiddle, if any.
#[inline]
fn twiddle(v: C, w: Option<&C>, fwd: bool) -> C {
    match w {
        Some(&w) => smul(v, w, fwd),
        None => v,
    }
}

/// The `ip` output planes of a pass and its input groups, checked.
fn pass_io<'a, const IP: usize>(
    ido: usize,
    l1: usize,
    cc: &'a [C],
    ch: &'a mut [C],
) -> Result<([&'a mut [C]; IP], core::slice::ChunksExact<'a, C>)> {
    let plane = l1.checked_mul(ido).ok_or(fft_err())?;
    let len = plane.checked_mul(IP).ok_or(fft_err())?;
    let cc = cc.get(..len).ok_or(fft_err())?;
    let ch = ch.get_mut(..len).ok_or(fft_err())?;
    if plane == 0 {
        return Err(fft_err());
    }
    let mut planes = ch.chunks_of_mut(plane);
    let mut out: [&mut [C]; IP] = core::array::from_fn(|_| <&mut [C]>::default());
    for o in out.iter_mut() {
        *o = planes.next().ok_or(fft_err())?;
    }
    // One group: IP · ido <= len (l1 >= 1 as plane > 0), exact.
    Ok((out, cc.chunks_of(ido.wrapping_mul(IP))))
}

/// Splits a group of `IP` input rows of `ido` (>= 1) points.
fn group_rows<const IP: usize>(g: &[C], ido: usize) -> Result<[&[C]; IP]> {
    let mut rows: [&[C]; IP] = [&[]; IP];
    let mut it = g.chunks_of(ido);
    for r in rows.iter_mut() {
        *r = it.next().ok_or(fft_err())?;
    }
    Ok(rows)
}

fn pass2(ido: usize, l1: usize, cc: &[C], ch: &mut [C], wa: &[C], fwd: bool) -> Result<()> {
    let tw1 = plane_twiddles(wa, ido, 1)?;
    let ([ch0, ch1], groups) = pass_io::<2>(ido, l1, cc, ch)?;
    let rows = ch0.chunks_of_mut(ido).zip(ch1.chunks_of_mut(ido));
    for ((y0, y1), g) in rows.zip(groups) {
        let [c0, c1] = group_rows::<2>(g, ido)?;
        let outs = y0.iter_mut().zip(y1.iter_mut());
        for (((o0, o1), (&a, &b)), w1) in outs.zip(c0.iter().zip(c1)).zip(tw1.clone()) {
            *o0 = cadd(a, b);
            *o1 = twiddle(csub(a, b), w1, fwd);
        }
    }
    Ok(())
}

fn pass3(ido: usize, l1: usize, cc: &[C], ch: &mut [C], wa: &[C], fwd: bool) -> Result<()> {
    let twr = -0.5f32;
    let twi = if fwd { -1.0f32 } else { 1.0 } * (0.866_025_403_784_438_6_f64 as f32);
    let tws = plane_twiddles(wa, ido, 1)?.zip(plane_twiddles(wa, ido, 2)?);
    let ([ch0, ch1, ch2], groups) = pass_io::<3>(ido, l1, cc, ch)?;
    let rows = ch0
        .chunks_of_mut(ido)
        .zip(ch1.chunks_of_mut(ido))
        .zip(ch2.chunks_of_mut(ido));
    for (((y0, y1), y2), g) in rows.zip(groups) {
        let [c0, c1, c2] = group_rows::<3>(g, ido)?;
        let outs = y0.iter_mut().zip(y1.iter_mut()).zip(y2.iter_mut());
        let ins = c0.iter().zip(c1).zip(c2);
        for ((((o0, o1), o2), ((&t0, &x1), &x2)), (w1, w2)) in outs.zip(ins).zip(tws.clone()) {
            let t1 = cadd(x1, x2);
            let t2 = csub(x1, x2);
            *o0 = cadd(t0, t1);
            let ca = [t0[0] + t1[0] * twr, t0[1] + t1[1] * twr];
            let cb = [-(t2[1] * twi), t2[0] * twi];
            let (u1, u2) = (cadd(ca, cb), csub(ca, cb));
            *o1 = twiddle(u1, w1, fwd);
            *o2 = twiddle(u2, w2, fwd);
        }
    }
    Ok(())
}

fn pass4(ido: usize, l1: usize, cc: &[C], ch: &mut [C], wa: &[C], fwd: bool) -> Result<()> {
    let tws = plane_twiddles(wa, ido, 1)?
        .zip(plane_twiddles(wa, ido, 2)?)
        .zip(plane_twiddles(wa, ido, 3)?);
    let ([ch0, ch1, ch2, ch3], groups) = pass_io::<4>(ido, l1, cc, ch)?;
    let rows = ch0
        .chunks_of_mut(ido)
        .zip(ch1.chunks_of_mut(ido))
        .zip(ch2.chunks_of_mut(ido))
        .zip(ch3.chunks_of_mut(ido));
    for ((((y0, y1), y2), y3), g) in rows.zip(groups) {
        let [r0, r1, r2, r3] = group_rows::<4>(g, ido)?;
        let outs = y0
            .iter_mut()
            .zip(y1.iter_mut())
            .zip(y2.iter_mut())
            .zip(y3.iter_mut());
        let ins = r0.iter().zip(r1).zip(r2).zip(r3);
        for ((outs, ins), tws) in outs.zip(ins).zip(tws.clone()) {
            let ((((o0, o1), o2), o3), (((&c0, &c1), &c2), &c3)) = (outs, ins);
            let ((w1, w2), w3) = tws;
            let (t2, t1) = (cadd(c0, c2), csub(c0, c2));
            let (t3, mut t4) = (cadd(c1, c3), csub(c1, c3));
            t4 = if fwd {
                [t4[1], -t4[0]]
            } else {
                [-t4[1], t4[0]]
            };
            *o0 = cadd(t2, t3);
            *o1 = twiddle(cadd(t1, t4), w1, fwd);
            *o2 = twiddle(csub(t2, t3), w2, fwd);
            *o3 = twiddle(csub(t1, t4), w3, fwd);
        }
    }
    Ok(())
}

fn pass5(ido: usize, l1: usize, cc: &[C], ch: &mut [C], wa: &[C], fwd: bool) -> Result<()> {
    let sign = if fwd { -1.0f32 } else { 1.0 };
    let tw1r = 0.309_016_994_374_947_4_f64 as f32;
    let tw1i = sign * (0.951_056_516_295_153_5_f64 as f32);
    let tw2r = -0.809_016_994_374_947_4_f64 as f32;
    let tw2i = sign * (0.587_785_252_292_473_1_f64 as f32);
    let tws = plane_twiddles(wa, ido, 1)?
        .zip(plane_twiddles(wa, ido, 2)?)
        .zip(plane_twiddles(wa, ido, 3)?)
        .zip(plane_twiddles(wa, ido, 4)?);
    let ([ch0, ch1, ch2, ch3, ch4], groups) = pass_io::<5>(ido, l1, cc, ch)?;
    let rows = ch0
        .chunks_of_mut(ido)
        .zip(ch1.chunks_of_mut(ido))
        .zip(ch2.chunks_of_mut(ido))
        .zip(ch3.chunks_of_mut(ido))
        .zip(ch4.chunks_of_mut(ido));
    for (((((y0, y1), y2), y3), y4), g) in rows.zip(groups) {
        let [r0, r1, r2, r3, r4] = group_rows::<5>(g, ido)?;
        let outs = y0
            .iter_mut()
            .zip(y1.iter_mut())
            .zip(y2.iter_mut())
            .zip(y3.iter_mut())
            .zip(y4.iter_mut());
        let ins = r0.iter().zip(r1).zip(r2).zip(r3).zip(r4);
        for ((outs, ins), tws) in outs.zip(ins).zip(tws.clone()) {
            let (((((o0, o1), o2), o3), o4), ((((&t0, &c1), &c2), &c3), &c4)) = (outs, ins);
            let (((w1, w2), w3), w4) = tws;
            let (t1, t4) = (cadd(c1, c4), csub(c1, c4));
            let (t2, t3) = (cadd(c2, c3), csub(c2, c3));
            *o0 = [t0[0] + t1[0] + t2[0], t0[1] + t1[1] + t2[1]];
            let step = |twar: f32, twbr: f32, twai: f32, twbi: f32| {
                let ca = [
                    t0[0] + twar * t1[0] + twbr * t2[0],
                    t0[1] + twar * t1[1] + twbr * t2[1],
                ];
                let cb = [-(twai * t4[1] + twbi * t3[1]), twai * t4[0] + twbi * t3[0]];
                (cadd(ca, cb), csub(ca, cb))
            };
            let (a, b) = step(tw1r, tw2r, tw1i, tw2i);
            *o1 = twiddle(a, w1, fwd);
            *o4 = twiddle(b, w4, fwd);
            let (a, b) = step(tw2r, tw1r, tw2i, -tw1i);
            *o2 = twiddle(a, w2, fwd);
            *o3 = twiddle(b, w3, fwd);
        }
    }
    Ok(())
}

fn prepare_dft(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    dtype_in(x.dtype, &[DType::F32], "DFT")?;
    let r = x.shape.len();
    let (Some((&c_in, dims)), true) = (x.shape.split_last(), r >= 2) else {
        return Err(shape_err(
            "DFT: input needs a signal axis and a component axis",
        ));
    };
    if !(c_in == 1 || c_in == 2) {
        return Err(shape_err("DFT: last axis must be 1 (real) or 2 (complex)"));
    }
    let ax = if ctx.opset >= 20 {
        const_scalar(ctx, 2)?.unwrap_or(-2)
    } else {
        ctx.attr_int("axis", 1)?
    };
    let ax = norm_axis(ax, r, "axis")?;
    // `dims` is the shape without the component axis: [outer.., n_in, inner..].
    let (head, rest) = dims
        .split_at_checked(ax)
        .ok_or(Error::internal("signal index"))?;
    let Some((&n_in, tail)) = rest.split_first() else {
        return Err(shape_err("DFT: axis cannot be the component axis"));
    };
    let inverse = ctx.attr_int("inverse", 0)? != 0;
    let onesided = ctx.attr_int("onesided", 0)? != 0;
    let n = match const_scalar(ctx, 1)? {
        Some(v) => usize::try_from(v)
            .ok()
            .filter(|&v| v > 0)
            .ok_or(shape_err("DFT: dft_length must be positive"))?,
        None if inverse && onesided => {
            n_in.saturating_sub(1).checked_mul(2).ok_or_else(overflow)?
        }
        None => n_in,
    };
    if n == 0 {
        return Err(shape_err("DFT: empty transform"));
    }
    let (dir, n_out, c_out) = match (inverse, onesided) {
        (false, false) => (Dir::Forward, n, 2),
        (false, true) => (Dir::Forward, onesided_bins(n), 2),
        (true, false) => (Dir::Inverse, n, 2),
        (true, true) => (Dir::InverseReal, n, 1),
    };
    let l = Layout {
        outer: checked_numel(head)?,
        inner: checked_numel(tail)?,
        n_in,
        c_in,
        n_out,
        c_out,
    };
    let mut out = x.shape.to_vec();
    *out.get_mut(ax).ok_or(Error::internal("signal index"))? = n_out;
    *out.last_mut().ok_or(Error::internal("signal index"))? = c_out;
    // numpy transforms real input in f64 but complex input (built from f32
    // parts) in f32, so only the latter takes the f32 replica.
    let plan = match dir {
        Dir::InverseReal => None,
        _ if c_in == 1 => None,
        _ => Cfftp::new(n),
    };
    let Some(plan) = plan else {
        let tw = twiddles(n);
        return Ok(Prepared::single(
            DType::F32,
            &out,
            kernel("DFT", move |io| {
                let xs = io.input_slice::<f32>(0)?;
                let y = io.output_slice::<f32>(0)?;
                match (l.c_in, l.c_out) {
                    (1, 1) => transform(xs, y, l, n, dir, &tw),
                    (1, _) => transform(xs, pairs_mut(y)?, l, n, dir, &tw),
                    (_, 1) => transform(pairs(xs)?, y, l, n, dir, &tw),
                    _ => transform(pairs(xs)?, pairs_mut(y)?, l, n, dir, &tw),
                }
            }),
        ));
    };
    let fwd = dir == Dir::Forward;
    // numpy scales the inverse by the f32 reciprocal of the length.
    let fct = if fwd { 1.0 } else { 1.0 / n as f32 };
    Ok(Prepared::single(
        DType::F32,
        &out,
        kernel("DFT", move |io| {
            let xs = io.input_slice::<f32>(0)?;
            let (mut yt, scratch) = io.output_and_scratch(0)?;
            let y = yt.as_slice_mut::<f32>()?;
            let buf: &mut [C] = bytemuck::try_cast_slice_mut(scratch)
                .map_err(|_| Error::new(ErrorKind::Internal("DFT scratch alignment")))?;
            let (c, ch) = buf
                .split_at_mut_checked(n)
                .ok_or(Error::new(ErrorKind::Internal("DFT scratch size")))?;
            // This path has complex input and output (c_in = c_out = 2).
            let (xs, ys) = (pairs(xs)?, pairs_mut(y)?);
            if l.c_in != 2 || l.inner == 0 || !l.fits(xs.len(), ys.len()) {
                return Err(Error::new(ErrorKind::Internal("DFT: buffer sizes")));
            }
            for o in 0..l.outer {
                for i in 0..l.inner {
                    // Point t of this line is xs[(o * n_in + t) * inner + i],
                    // output point k is ys[(o * n_out + k) * inner + i].
                    let line = xs.iter().skip(l.start(o, l.n_in, i)).step_by(l.inner);
                    let line = line.take(l.n_in).chain(core::iter::repeat(&[0.0, 0.0]));
                    for (v, p) in c.iter_mut().zip(line) {
                        *v = *p;
                    }
                    plan.exec(c, ch, fwd, fct)?;
                    let out = ys.iter_mut().skip(l.start(o, l.n_out, i)).step_by(l.inner);
                    let spectrum = c.get(..l.n_out).ok_or(Error::internal("signal index"))?;
                    for (yk, v) in out.zip(spectrum) {
                        *yk = *v;
                    }
                }
            }
            Ok(())
        }),
    )
    // Saturating: a scratch past usize::MAX fails planning.
    .with_scratch(
        n.saturating_mul(2)
            .saturating_mul(core::mem::size_of::<C>()),
    ))
}

fn prepare_stft(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    dtype_in(x.dtype, &[DType::F32], "STFT")?;
    let &[batch, len, c_in] = x.shape else {
        return Err(shape_err("STFT: signal must be [batch, length, 1 or 2]"));
    };
    if !(c_in == 1 || c_in == 2) {
        return Err(shape_err("STFT: signal must be [batch, length, 1 or 2]"));
    }
    let step = const_scalar(ctx, 1)?.ok_or(Error::new(ErrorKind::MissingInput { index: 1 }))?;
    let step = usize::try_from(step)
        .ok()
        .filter(|&s| s > 0)
        .ok_or(shape_err("STFT: frame_step must be positive"))?;
    let win = ctx.opt_input(2);
    let mut win_len = None;
    if let Some(w) = win {
        dtype_in(w.dtype, &[DType::F32], "STFT window")?;
        let &[wl] = w.shape else {
            return Err(shape_err("STFT: window must be 1-D"));
        };
        win_len = Some(wl);
    }
    let flen = match const_scalar(ctx, 3)? {
        Some(v) => usize::try_from(v)
            .ok()
            .filter(|&v| v > 0)
            .ok_or(shape_err("STFT: frame_length must be positive"))?,
        None => win_len.unwrap_or(len),
    };
    // Samples taken from each frame before the DFT pads or truncates them.
    let wlen = win_len.unwrap_or(flen);
    if wlen == 0 || flen > len {
        return Err(shape_err("STFT: frame longer than the signal"));
    }
    let onesided = ctx.attr_int("onesided", 1)? != 0;
    // flen <= len (above), and the quotient is at most len - flen < len:
    // the difference and the sum are exact.
    let hops = crate::ops::util::div(len.wrapping_sub(flen), step, "STFT: frame_step")?;
    let frames = hops.wrapping_add(1);
    let bins = if onesided { onesided_bins(flen) } else { flen };
    let used = wlen.min(flen);
    let has_win = win.is_some();
    let tw = twiddles(flen);
    let st = Stft {
        batch,
        len,
        step,
        flen,
        frames,
        bins,
        used,
    };
    Ok(Prepared::single(
        DType::F32,
        &[batch, frames, bins, 2],
        kernel("STFT", move |io| {
            let xs = io.input_slice::<f32>(0)?;
            let ws: &[f32] = if has_win {
                io.input_slice::<f32>(2)?
                    .get(..used)
                    .ok_or(Error::internal("signal index"))?
            } else {
                &[]
            };
            let y = pairs_mut(io.output_slice::<f32>(0)?)?;
            if c_in == 2 {
                run_stft(&st, pairs(xs)?, ws, y, &tw)
            } else {
                run_stft(&st, xs, ws, y, &tw)
            }
        }),
    ))
}

/// STFT sizes, fixed at prepare.
#[derive(Clone, Copy, Debug)]
struct Stft {
    batch: usize,
    len: usize,
    step: usize,
    flen: usize,
    frames: usize,
    bins: usize,
    /// Samples taken from each frame (window length and frame length).
    used: usize,
}

/// STFT of points `xs` (`[batch, len]`) into `y` (`[batch, frames, bins]`
/// pairs), weighted by the window `ws` (empty: no window).
fn run_stft<P: Point>(
    st: &Stft,
    xs: &[P],
    ws: &[f32],
    y: &mut [C],
    tw: &[(f64, f64)],
) -> Result<()> {
    // Exactly flen entries, so every `(k * t) % flen` below is in range.
    let tw = tw.get(..st.flen).ok_or(Error::internal("signal index"))?;
    // k < bins and t < used: every k · t fits once the largest does.
    check_products(st.bins, st.used)?;
    let idx = || Error::internal("signal index");
    // Per batch item, one signal of `len` points and one output matrix of
    // `frames · bins`, checked once here (all sizes >= 1 from prepare: a 0
    // would make the chunks below yield nothing).
    let per_out = st.frames.checked_mul(st.bins).ok_or_else(idx)?;
    let fit = |per: usize, have: usize| st.batch.checked_mul(per).is_some_and(|v| v <= have);
    if st.len == 0 || per_out == 0 || !fit(st.len, xs.len()) || !fit(per_out, y.len()) {
        return Err(idx());
    }
    let signals = xs.chunks_of(st.len).zip(y.chunks_of_mut(per_out));
    for (sig, rows) in signals.take(st.batch) {
        for (f, out) in rows.chunks_of_mut(st.bins).enumerate() {
            // This frame's samples: `used` from f · step, cut at the end;
            // f < frames, so f · step <= len - flen (exact).
            let at = f.wrapping_mul(st.step);
            let cnt = st.used.min(st.len.saturating_sub(at));
            let frame = win(sig, at, cnt).ok_or_else(idx)?;
            for (k, o) in out.iter_mut().enumerate() {
                let (mut re, mut im) = (0f64, 0f64);
                // Without a window every weight is 1.
                let weights = ws.iter().map(|&w| w as f64).chain(core::iter::repeat(1.0));
                for (t, (p, w)) in frame.iter().zip(weights).enumerate() {
                    let (xr, xi) = p.scaled(w);
                    // Exact: k · t fits (check_products above).
                    let (c, s) = *k
                        .wrapping_mul(t)
                        .checked_rem(st.flen)
                        .and_then(|j| tw.get(j))
                        .ok_or(Error::internal("signal index"))?;
                    re += xr * c + xi * s;
                    im += xi * c - xr * s;
                }
                *o = [re as f32, im as f32];
            }
        }
    }
    Ok(())
}

/// `vals` as a constant of the op's `output_datatype` (default float).
fn float_const(ctx: &PrepareCtx<'_>, shape: &[usize], vals: &[f64]) -> Result<Prepared> {
    let code = ctx.attr_int("output_datatype", 1)?;
    let c = match code {
        1 => {
            let v: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
            Const::from_slice(shape, &v)?
        }
        11 => Const::from_slice(shape, vals)?,
        10 => {
            let v: Vec<half::f16> = vals.iter().map(|&v| half::f16::from_f64(v)).collect();
            Const::from_slice(shape, &v)?
        }
        16 => {
            let v: Vec<half::bf16> = vals.iter().map(|&v| half::bf16::from_f64(v)).collect();
            Const::from_slice(shape, &v)?
        }
        _ => {
            return Err(Error::new(ErrorKind::UnsupportedDType {
                what: "output_datatype",
                code: code as i32,
            }))
        }
    };
    Ok(Prepared::values(vec![c]))
}

/// Window length and the denominator N (periodic) or N - 1 (symmetric).
fn window_params(ctx: &PrepareCtx<'_>) -> Result<(usize, f64)> {
    let size = const_scalar(ctx, 0)?.ok_or(Error::new(ErrorKind::MissingInput { index: 0 }))?;
    let size = usize::try_from(size).map_err(|_| shape_err("window size must be >= 0"))?;
    let periodic = ctx.attr_int("periodic", 1)? != 0;
    let den = if periodic {
        size as f64
    } else {
        size as f64 - 1.0
    };
    Ok((size, den))
}

fn window(ctx: &PrepareCtx<'_>, f: impl Fn(f64) -> f64) -> Result<Prepared> {
    let (size, den) = window_params(ctx)?;
    ctx.check_alloc(size, 8)?;
    let pi = core::f64::consts::PI;
    let v: Vec<f64> = (0..size).map(|i| f(i as f64 * pi / den)).collect();
    float_const(ctx, &[size], &v)
}

fn prepare_hann(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    window(ctx, |a| {
        let s = libm::sin(a);
        s * s
    })
}

fn prepare_hamming(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let alpha = 25.0 / 46.0;
    window(ctx, move |a| alpha - libm::cos(2.0 * a) * (1.0 - alpha))
}

fn prepare_blackman(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    window(ctx, |a| {
        0.42 - 0.5 * libm::cos(2.0 * a) + 0.08 * libm::cos(4.0 * a)
    })
}

fn prepare_mel(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let need = |i: usize| Error::new(ErrorKind::MissingInput { index: i });
    let bins = const_scalar(ctx, 0)?.ok_or(need(0))?;
    let dft_len = const_scalar(ctx, 1)?.ok_or(need(1))?;
    let rate = const_scalar(ctx, 2)?.ok_or(need(2))?;
    let lo = ctx
        .const_floats(3)?
        .and_then(|v| v.first().copied())
        .ok_or(need(3))? as f64;
    let hi = ctx
        .const_floats(4)?
        .and_then(|v| v.first().copied())
        .ok_or(need(4))? as f64;
    if bins <= 0 || dft_len <= 0 || rate <= 0 {
        return Err(shape_err("MelWeightMatrix: sizes must be positive"));
    }
    let nb = usize::try_from(bins).map_err(|_| overflow())?;
    let spec = onesided_bins(usize::try_from(dft_len).map_err(|_| overflow())?);
    let cells = spec.checked_mul(nb).ok_or_else(overflow)?;
    ctx.check_alloc(cells, 8)?;
    // nb + 2 band edges; saturating: a saturated count fails check_alloc.
    let n_edges = nb.saturating_add(2);
    ctx.check_alloc(n_edges, 8)?;
    let ln10 = libm::log(10.0);
    let lo_mel = 2595.0 * libm::log1p(lo / 700.0) / ln10;
    let hi_mel = 2595.0 * libm::log1p(hi / 700.0) / ln10;
    let step = (hi_mel - lo_mel) / n_edges as f64;
    // The FFT size dft_len + 1 (check_alloc above already rules out an
    // overflow: spec = dft_len / 2 + 1 cells of 8 bytes fit in memory).
    let fft_size = dft_len.checked_add(1).ok_or_else(overflow)? as f64;
    let mut edges = Vec::with_capacity(n_edges);
    for i in 0..n_edges {
        let mel = i as f64 * step + lo_mel;
        let hz = 700.0 * libm::expm1(mel / 2595.0 * ln10);
        edges.push(libm::floor(fft_size * hz / rate as f64) as i64);
    }
    let mut out = vec![0f64; cells];
    let edge_err = || shape_err("MelWeightMatrix: band edge out of range");
    let mut set = |j: i64, i: usize, v: f64| -> Result<()> {
        let j = usize::try_from(j)
            .ok()
            .filter(|&j| j < spec)
            .ok_or_else(edge_err)?;
        // j < spec and band i < nb: below spec · nb = cells, exact.
        *out.get_mut(j.wrapping_mul(nb).wrapping_add(i))
            .ok_or(Error::internal("signal index"))? = v;
        Ok(())
    };
    // `a - b` of band edges as f64. Below, it overflows only when the lower
    // edge is negative, and `set` rejects that edge with this error in the
    // same call (the first of its loop).
    let diff = |a: i64, b: i64| a.checked_sub(b).map(|d| d as f64).ok_or_else(edge_err);
    // Band i rises from edge i to edge i + 1 and falls to edge i + 2.
    for (i, e) in edges.windows(3).enumerate() {
        let &[l, c, h] = e else {
            return Err(Error::internal("signal index"));
        };
        if c == l {
            set(c, i, 1.0)?;
        } else {
            for j in l..=c {
                set(j, i, diff(j, l)? / diff(c, l)?)?;
            }
        }
        if h > c {
            for j in c..h {
                set(j, i, diff(h, j)? / diff(h, c)?)?;
            }
        }
    }
    float_const(ctx, &[spec, nb], &out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::AttrValue;
    use crate::ops::testing::{assert_close, run, t, vals};

    #[test]
    fn dft_real_length4() {
        // DFT of [1, 2, 3, 4] is [10, -2+2i, -2, -2-2i].
        let x = t(&[1, 4, 1], &[1.0f32, 2.0, 3.0, 4.0]);
        let y = run("DFT", 17, vec![], &[x], 1).unwrap();
        assert_close(
            &vals::<f32>(&y[0]),
            &[10.0, 0.0, -2.0, 2.0, -2.0, 0.0, -2.0, -2.0],
            1e-6,
        );
    }

    #[test]
    fn dft_inverse_onesided_roundtrip() {
        // The one-sided spectrum of [1, 2, 3, 4] inverts back to the signal.
        let x = t(&[1, 3, 2], &[10.0f32, 0.0, -2.0, 2.0, -2.0, 0.0]);
        let y = run(
            "DFT",
            17,
            vec![
                ("inverse", AttrValue::Int(1)),
                ("onesided", AttrValue::Int(1)),
            ],
            &[x],
            1,
        )
        .unwrap();
        assert_eq!(y[0].shape, vec![1, 4, 1]);
        assert_close(&vals::<f32>(&y[0]), &[1.0, 2.0, 3.0, 4.0], 1e-6);
    }

    #[test]
    fn stft_rectangular() {
        // Two frames of length 2, step 2: bins are sum and difference.
        let x = t(&[1, 4, 1], &[1.0f32, 2.0, 3.0, 5.0]);
        let step = t(&[], &[2i64]);
        let len = t(&[], &[2i64]);
        let y = run("STFT", 17, vec![], &[x, step, None, len], 1).unwrap();
        assert_eq!(y[0].shape, vec![1, 2, 2, 2]);
        assert_close(
            &vals::<f32>(&y[0]),
            &[3.0, 0.0, -1.0, 0.0, 8.0, 0.0, -2.0, 0.0],
            1e-6,
        );
    }

    #[test]
    fn hann_periodic_4() {
        // sin²(πn/4): 0, 0.5, 1, 0.5.
        let y = run("HannWindow", 17, vec![], &[t(&[], &[4i64])], 1).unwrap();
        assert_close(&vals::<f32>(&y[0]), &[0.0, 0.5, 1.0, 0.5], 1e-7);
    }

    #[test]
    fn hamming_symmetric_3() {
        // alpha - beta cos(2πn/2): alpha - beta, 1, alpha - beta.
        let y = run(
            "HammingWindow",
            17,
            vec![("periodic", AttrValue::Int(0))],
            &[t(&[], &[3i64])],
            1,
        )
        .unwrap();
        let e = 25.0 / 46.0 - 21.0 / 46.0;
        assert_close(&vals::<f32>(&y[0]), &[e, 1.0, e], 1e-7);
    }

    #[test]
    fn dft_complex_single_tone() {
        // x_t = i^t has all its energy in bin 1: X = [0, 4, 0, 0].
        let x = t(&[1, 4, 2], &[1.0f32, 0.0, 0.0, 1.0, -1.0, 0.0, 0.0, -1.0]);
        let y = run("DFT", 17, vec![], &[x], 1).unwrap();
        assert_close(
            &vals::<f32>(&y[0]),
            &[0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            1e-6,
        );
    }

    #[test]
    fn radix_passes_match_direct_sum() {
        // Every radix-2/3/4/5 pass, with and without twiddles, against the
        // f64 direct sum, both directions.
        for n in [1usize, 2, 3, 4, 5, 6, 9, 10, 12, 15, 20, 25, 36, 60] {
            let plan = Cfftp::new(n).unwrap();
            let r = crate::ops::testing::rnd(2 * n, n as u64);
            let tw = twiddles(n);
            for (fwd, dir) in [(true, Dir::Forward), (false, Dir::Inverse)] {
                let mut c: Vec<C> = r.chunks(2).map(|p| [p[0], p[1]]).collect();
                let mut ch = vec![[0.0f32; 2]; n];
                let fct = if fwd { 1.0 } else { 1.0 / n as f32 };
                plan.exec(&mut c, &mut ch, fwd, fct).unwrap();
                let mut want = vec![0.0f32; 2 * n];
                let l = Layout {
                    outer: 1,
                    inner: 1,
                    n_in: n,
                    c_in: 2,
                    n_out: n,
                    c_out: 2,
                };
                transform(
                    pairs(&r).unwrap(),
                    pairs_mut(&mut want).unwrap(),
                    l,
                    n,
                    dir,
                    &tw,
                )
                .unwrap();
                let got: Vec<f32> = c.iter().flatten().copied().collect();
                assert_close(&got, &want, 1e-5);
            }
        }
        assert!(Cfftp::new(7).is_none() && Cfftp::new(8).is_none());
    }
}
