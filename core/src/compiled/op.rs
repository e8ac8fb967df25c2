//! The closed set of kernels a compiled model can run, as borrowed
//! parameter views: built from an op's prepared parameters on the host
//! ([`super::export`]) or decoded in place from a `.mote` file.
//!
//! Parameters are little-endian `u32` words; per-channel arrays are
//! `(offset, count)` references into the file's data section, read in place
//! (`&[i32]`, `&[Requant]`), never copied.

// Without `alloc` only compiled models use these: parts serve the planned
// session (prepare, float paths) alone.
#![cfg_attr(not(feature = "alloc"), allow(dead_code))]

use crate::error::{Error, ErrorKind, Result};
use crate::kern::qbin::{qbinary, BinParams};
use crate::kern::qconv::{
    can_conv_in_place, geom_ok, qconv, qconv_dw, qconv_in_place, qmatmul, qrequant, IntConv, OutQ,
    QConvView, QMmView,
};
use crate::kern::qpool::{avg_pool, global_avg, PoolParams};
use crate::kern::requant::{Requant, Requant2};
use crate::kern::{Geom, QInt, MAX_SPATIAL};
use crate::tensor::MAX_RANK;
use crate::DType;

/// Kernel ids of the file format (stable: never renumber).
pub(crate) mod id {
    pub const QCONV: u32 = 1;
    pub const QMATMUL: u32 = 2;
    pub const QREQUANT: u32 = 3;
    pub const QBINARY: u32 = 4;
    pub const QGLOBAL_AVG: u32 = 5;
    pub const QAVG_POOL: u32 = 6;
}

/// One compiled step's kernel and parameters.
// Variant names are the ops' names (all quantized, hence all `Q...`).
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpView<'a> {
    /// `mote.QConv` (depthwise kernel when the geometry is depthwise).
    QConv { dt: [DType; 3], q: QConvView<'a> },
    /// `mote.QMatMul`.
    QMatMul { dt: [DType; 3], q: QMmView<'a> },
    /// `mote.QRequant`.
    QRequant {
        dt: [DType; 2],
        zx: i32,
        r: Requant,
        out: OutQ,
    },
    /// `QLinearAdd` / `QLinearMul` over a broadcast shape.
    QBinary {
        dt: DType,
        is_add: bool,
        rank: usize,
        shape: [usize; MAX_RANK],
        strides: [[usize; MAX_RANK]; 2],
        p: BinParams,
    },
    /// `QLinearGlobalAveragePool`.
    QGlobalAvg {
        dt: DType,
        n: usize,
        c: usize,
        img: usize,
        cl: bool,
        p: PoolParams,
    },
    /// `QLinearAveragePool`.
    QAvgPool {
        dt: DType,
        n: usize,
        c: usize,
        cl: bool,
        include: bool,
        g: Geom,
        p: PoolParams,
    },
}

fn bad(what: &'static str) -> Error {
    Error::new(ErrorKind::Invalid(what))
}

/// Typed view of 8-bit data (any alignment).
fn q8<T: QInt>(b: &[u8]) -> Result<&[T]> {
    bytemuck::try_cast_slice(b).map_err(|_| Error::new(ErrorKind::Internal("8-bit view")))
}

fn q8_mut<T: QInt>(b: &mut [u8]) -> Result<&mut [T]> {
    bytemuck::try_cast_slice_mut(b).map_err(|_| Error::new(ErrorKind::Internal("8-bit view")))
}

/// Runs `$body` with `$t` bound to the 8-bit type of `$dt`.
macro_rules! q8_type {
    ($dt:expr, $t:ident => $body:expr) => {
        match $dt {
            DType::I8 => {
                type $t = i8;
                $body
            }
            #[cfg(feature = "uint8")]
            DType::U8 => {
                type $t = u8;
                $body
            }
            _ => Err(bad("compiled integer kernel on a non-8-bit type")),
        }
    };
}

impl OpView<'_> {
    /// The kernel id.
    pub(crate) fn id(&self) -> u32 {
        match self {
            OpView::QConv { .. } => id::QCONV,
            OpView::QMatMul { .. } => id::QMATMUL,
            OpView::QRequant { .. } => id::QREQUANT,
            OpView::QBinary { .. } => id::QBINARY,
            OpView::QGlobalAvg { .. } => id::QGLOBAL_AVG,
            OpView::QAvgPool { .. } => id::QAVG_POOL,
        }
    }

    /// Number of data inputs (`ins` of [`OpView::run`]).
    pub(crate) fn arity(&self) -> usize {
        match self {
            OpView::QConv { .. } | OpView::QMatMul { .. } | OpView::QBinary { .. } => 2,
            _ => 1,
        }
    }

    /// Dtypes of the data inputs and of the output.
    pub(crate) fn dtypes(&self) -> ([DType; 2], DType) {
        match *self {
            OpView::QConv { dt, .. } | OpView::QMatMul { dt, .. } => ([dt[0], dt[1]], dt[2]),
            OpView::QRequant { dt, .. } => ([dt[0], dt[0]], dt[1]),
            OpView::QBinary { dt, .. }
            | OpView::QGlobalAvg { dt, .. }
            | OpView::QAvgPool { dt, .. } => ([dt, dt], dt),
        }
    }

    /// Whether input 0 may share the output's bytes (`ins[0] = None`).
    pub(crate) fn can_run_in_place(&self) -> bool {
        match self {
            OpView::QRequant { dt, .. } => dt[0] == dt[1],
            OpView::QConv { dt, q } => dt[0] == dt[2] && can_conv_in_place(&q.p),
            _ => false,
        }
    }

    /// Runs on the data inputs' bytes (`ins[0]` is `None` when the step is
    /// in place: the input is read from `y`). Does not allocate.
    pub(crate) fn run(&self, ins: [Option<&[u8]>; 2], y: &mut [u8]) -> Result<()> {
        let need = |i: usize| {
            ins.get(i)
                .copied()
                .flatten()
                .ok_or(Error::new(ErrorKind::MissingInput { index: i }))
        };
        match self {
            OpView::QConv { dt, q } if ins[0].is_none() => {
                // In place: the input is the output's bytes (same type).
                if dt[0] != dt[2] {
                    return Err(Error::new(ErrorKind::MissingInput { index: 0 }));
                }
                q8_type!(dt[1], W => q8_type!(dt[2], T => {
                    qconv_in_place(q8::<W>(need(1)?)?, q8_mut::<T>(y)?, q)
                }))
            }
            OpView::QConv { dt, q } => {
                q8_type!(dt[0], X => q8_type!(dt[1], W => q8_type!(dt[2], Y => {
                    let (x, w, y) = (q8::<X>(need(0)?)?, q8::<W>(need(1)?)?, q8_mut::<Y>(y)?);
                    if q.p.is_depthwise() {
                        qconv_dw(x, w, y, q)
                    } else {
                        qconv(x, w, y, q)
                    }
                })))
            }
            OpView::QMatMul { dt, q } => {
                q8_type!(dt[0], A => q8_type!(dt[1], B => q8_type!(dt[2], Y => {
                    qmatmul(q8::<A>(need(0)?)?, q8::<B>(need(1)?)?, q8_mut::<Y>(y)?, q)
                })))
            }
            OpView::QRequant { dt, zx, r, out } => q8_type!(dt[0], X => q8_type!(dt[1], Y => {
                let x = match ins[0] {
                    Some(b) => Some(q8::<X>(b)?),
                    None if dt[0] == dt[1] => None,
                    None => return Err(Error::new(ErrorKind::MissingInput { index: 0 })),
                };
                qrequant(x, q8_mut::<Y>(y)?, *zx, r, out)
            })),
            OpView::QBinary {
                dt,
                is_add,
                rank,
                shape,
                strides,
                p,
            } => q8_type!(*dt, T => {
                let sh = shape.get(..*rank).ok_or(bad("rank"))?;
                qbinary(q8::<T>(need(0)?)?, q8::<T>(need(1)?)?, q8_mut::<T>(y)?, sh, *strides, *is_add, p)
            }),
            OpView::QGlobalAvg {
                dt,
                n,
                c,
                img,
                cl,
                p,
            } => q8_type!(*dt, T => {
                global_avg(q8::<T>(need(0)?)?, q8_mut::<T>(y)?, *n, *c, *img, *cl, p)
            }),
            OpView::QAvgPool {
                dt,
                n,
                c,
                cl,
                include,
                g,
                p,
            } => q8_type!(*dt, T => {
                avg_pool(q8::<T>(need(0)?)?, q8_mut::<T>(y)?, *n, *c, *cl, g, *include, p)
            }),
        }
    }

    /// Checks what a kernel cannot check cheaply at each run: multipliers in
    /// range, clamp bounds inside the output type, nonzero strides, sizes
    /// whose products do not overflow.
    pub(crate) fn check(&self) -> core::result::Result<(), Fault> {
        match self {
            OpView::QConv { dt, q } => {
                out_ok(&q.out, dt[2])?;
                mults_ok(q.mult)?;
                zp_ok(&[q.zx], dt[0])?;
                zp_ok(q.zw, dt[1])?;
                zp_ok(&[q.out.zy], dt[2])?;
                let p = &q.p;
                geom_consistent(&p.g)?;
                if p.c.checked_rem(p.group) != Some(0) || p.m.checked_rem(p.group) != Some(0) {
                    return Err("QConv: channels must divide into groups");
                }
                let (ins, outs, ks) = sizes(&p.g)?;
                mul(&[p.batch, p.c, ins])?;
                mul(&[p.m, p.c.checked_div(p.group).unwrap_or(0), ks])?;
                mul(&[p.batch, p.m, outs])
            }
            OpView::QMatMul { dt, q } => {
                out_ok(&q.out, dt[2])?;
                mults_ok(q.mult)?;
                zp_ok(&[q.za], dt[0])?;
                zp_ok(q.zb, dt[1])?;
                zp_ok(&[q.out.zy], dt[2])?;
                mul(&[q.rows, q.k])?;
                mul(&[q.k, q.n])?;
                mul(&[q.rows, q.n])
            }
            OpView::QRequant { dt, zx, r, out } => {
                out_ok(out, dt[1])?;
                zp_ok(&[*zx], dt[0])?;
                zp_ok(&[out.zy], dt[1])?;
                mults_ok(core::slice::from_ref(r))
            }
            OpView::QBinary {
                dt, rank, shape, p, ..
            } => {
                zp_ok(&[p.za, p.zb, p.zc], *dt)?;
                mul(shape.get(..*rank).ok_or("rank above 8")?)?;
                mults_ok(core::slice::from_ref(&p.mul))
            }
            OpView::QGlobalAvg {
                dt, n, c, img, p, ..
            } => {
                zp_ok(&[p.zx, p.zy], *dt)?;
                mul(&[*n, *c, *img])?;
                mults_ok(core::slice::from_ref(&p.r))
            }
            OpView::QAvgPool { dt, n, c, g, p, .. } => {
                zp_ok(&[p.zx, p.zy], *dt)?;
                mults_ok(core::slice::from_ref(&p.r))?;
                geom_consistent(g)?;
                if g.d != [1; MAX_SPATIAL] {
                    return Err("QLinearAveragePool with dilations");
                }
                let (ins, outs, _) = sizes(g)?;
                mul(&[*n, *c, ins])?;
                mul(&[*n, *c, outs])
            }
        }
    }
}

/// The value range of an 8-bit kernel type.
fn range_of(dt: DType) -> core::result::Result<(i32, i32), Fault> {
    match dt {
        DType::I8 => Ok((-128, 127)),
        #[cfg(feature = "uint8")]
        DType::U8 => Ok((0, 255)),
        #[cfg(not(feature = "uint8"))]
        DType::U8 => Err("uint8 kernels not built in (feature `uint8` of mote-core)"),
        _ => Err("compiled integer kernel on a non-8-bit type"),
    }
}

fn out_ok(o: &OutQ, dt: DType) -> core::result::Result<(), Fault> {
    let (lo, hi) = range_of(dt)?;
    if o.lo < lo || o.hi > hi || o.lo > o.hi {
        return Err("output clamp outside the output type");
    }
    Ok(())
}

/// Zero points inside their type keep every `(x - z)·(w - zw)` product
/// within ±255², far from i32 overflow.
fn zp_ok(z: &[i32], dt: DType) -> core::result::Result<(), Fault> {
    let (lo, hi) = range_of(dt)?;
    if z.iter().all(|v| (lo..=hi).contains(v)) {
        Ok(())
    } else {
        Err("zero point outside its type")
    }
}

fn mults_ok(m: &[Requant]) -> core::result::Result<(), Fault> {
    if m.iter().all(Requant::is_valid) {
        Ok(())
    } else if !cfg!(feature = "qoperator") && m.iter().any(Requant::is_f32) {
        Err("f32 requantization of a QOperator model not built in (feature `qoperator` of mote-core)")
    } else {
        Err("requantization multiplier out of range")
    }
}

/// Checked product (a file's sizes must not overflow the kernels' index
/// arithmetic).
fn numel(v: &[usize]) -> core::result::Result<usize, Fault> {
    v.iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("sizes overflow")
}

fn mul(v: &[usize]) -> core::result::Result<(), Fault> {
    numel(v).map(|_| ())
}

fn sizes(g: &Geom) -> core::result::Result<(usize, usize, usize), Fault> {
    Ok((numel(&g.inp)?, numel(&g.out)?, numel(&g.k)?))
}

/// A window geometry whose every tap position is computable without
/// overflow: strides and dilations ≥ 1, and the last window starts inside
/// the padded input (floor or ceil mode).
fn geom_consistent(g: &Geom) -> core::result::Result<(), Fault> {
    if geom_ok(g).is_err() {
        return Err("window strides and dilations must be >= 1");
    }
    let axes = (g.inp.iter().zip(&g.pb).zip(&g.pe))
        .zip(g.k.iter().zip(&g.d))
        .zip(g.out.iter().zip(&g.s));
    for ((((&inp, &pb), &pe), (&k, &d)), (&out, &s)) in axes {
        let span = inp
            .checked_add(pb)
            .and_then(|v| v.checked_add(pe))
            .ok_or("window: padded size overflows")?;
        let reach = k
            .checked_sub(1)
            .and_then(|k| k.checked_mul(d))
            .ok_or("window: kernel size 0 or overflow")?;
        let last = out
            .saturating_sub(1)
            .checked_mul(s)
            .ok_or("window: output positions overflow")?;
        if reach.checked_add(last).is_none() || last >= span.max(1) || pb > span {
            return Err("window geometry inconsistent");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Decoding (no allocation)
// ---------------------------------------------------------------------------

/// What is wrong with a file's record or kernel parameters. A bare message,
/// so that the decoder's results stay two words (returned in registers)
/// and each `?` is one branch, where `Result<_, Error>` copied 40 bytes:
/// that took the runtime code of the KWS firmware on a Cortex-M3 from
/// 15.1 to 11.5 KB. The public entry points turn it into
/// [`ErrorKind::BadFile`].
pub(crate) type Fault = &'static str;

/// Reads parameter words; arrays are resolved against the data section.
/// A kernel's words are taken at once as a fixed-size array (one bounds
/// check) and named by destructuring; a conversion that fails returns
/// `None` and leaves its reason in `why`.
pub(crate) struct Words<'a> {
    w: &'a [u8],
    at: usize,
    data: &'a [u8],
    why: Fault,
}

impl<'a> Words<'a> {
    pub(crate) fn new(params: &'a [u8], data: &'a [u8]) -> Self {
        Words {
            w: params,
            at: 0,
            data,
            why: "kernel parameters malformed",
        }
    }

    fn fail<T>(&mut self, why: Fault) -> Option<T> {
        self.why = why;
        None
    }

    /// The next `N` words, in place (the parameters section is 4-aligned
    /// and every kernel's words are a multiple of 4 bytes; the format is
    /// little-endian, as every target mote builds for).
    fn take<const N: usize>(&mut self) -> Option<&'a [u32; N]> {
        let end = N.checked_mul(4).and_then(|n| n.checked_add(self.at));
        let b = end.and_then(|end| self.w.get(self.at..end));
        match b.map(bytemuck::try_from_bytes) {
            Some(Ok(v)) => {
                self.at = end.unwrap_or(usize::MAX);
                Some(v)
            }
            Some(Err(_)) => self.fail("kernel parameters misaligned"),
            None => self.fail("kernel parameters truncated"),
        }
    }

    fn dtype(&mut self, code: u32) -> Option<DType> {
        match DType::from_onnx(code as i32) {
            Some(d) => Some(d),
            None => self.fail("kernel parameter: unknown dtype"),
        }
    }

    fn dtypes<const N: usize>(&mut self, codes: [u32; N]) -> Option<[DType; N]> {
        let mut v = [DType::I8; N];
        for (d, &c) in v.iter_mut().zip(&codes) {
            *d = self.dtype(c)?;
        }
        Some(v)
    }

    fn bool(&mut self, v: u32) -> Option<bool> {
        match v {
            0 => Some(false),
            1 => Some(true),
            _ => self.fail("kernel parameter: boolean not 0 or 1"),
        }
    }

    /// The `[offset, count]` array of `T` in the data section.
    fn array<T: bytemuck::Pod>(&mut self, [off, n]: [u32; 2]) -> Option<&'a [T]> {
        let (off, n) = (off as usize, n as usize);
        let b = n
            .checked_mul(core::mem::size_of::<T>())
            .and_then(|len| off.checked_add(len))
            .and_then(|end| self.data.get(off..end));
        match b.map(bytemuck::try_cast_slice) {
            Some(Ok(v)) => Some(v),
            Some(Err(_)) => self.fail("kernel parameter array misaligned"),
            None => self.fail("kernel parameter array outside the data section"),
        }
    }

    fn requant(&mut self, [m, s]: [u32; 2]) -> Option<Requant> {
        let r: Requant = bytemuck::cast([m as i32, s as i32]);
        if let Err(why) = mults_ok(core::slice::from_ref(&r)) {
            return self.fail(why);
        }
        Some(r)
    }

    fn pool(&mut self, [zx, zy, m, s]: [u32; 4]) -> Option<PoolParams> {
        Some(PoolParams {
            zx: zx as i32,
            zy: zy as i32,
            r: self.requant([m, s])?,
        })
    }
}

fn out_q([zy, lo, hi]: [u32; 3]) -> OutQ {
    OutQ {
        zy: zy as i32,
        lo: lo as i32,
        hi: hi as i32,
    }
}

fn usizes<const N: usize>(v: [u32; N]) -> [usize; N] {
    v.map(|x| x as usize)
}

/// A window geometry: input, output, kernel, strides, dilations, pads
/// before and after, 3 words each.
fn geom(v: [u32; 21]) -> Geom {
    let mut a = [[0usize; MAX_SPATIAL]; 7];
    for (d, &x) in a.iter_mut().flatten().zip(&v) {
        *d = x as usize;
    }
    let [inp, out, k, s, d, pb, pe] = a;
    Geom {
        inp,
        out,
        k,
        s,
        d,
        pb,
        pe,
    }
}

/// Decodes and checks the parameters of kernel `kid`.
pub(crate) fn decode<'a>(kid: u32, w: &mut Words<'a>) -> core::result::Result<OpView<'a>, Fault> {
    let Some(op) = decode_words(kid, w) else {
        return Err(w.why);
    };
    if w.at != w.w.len() {
        return Err("kernel parameters: trailing words");
    }
    op.check()?;
    Ok(op)
}

// The word layout of each kernel mirrors `export::encode`.
fn decode_words<'a>(kid: u32, w: &mut Words<'a>) -> Option<OpView<'a>> {
    Some(match kid {
        id::QCONV => {
            let &[d0, d1, d2, batch, c, m, group, g @ .., zx, zy, lo, hi, zw0, zw1, b0, b1, m0, m1] =
                w.take::<38>()?;
            let [batch, c, m, group] = usizes([batch, c, m, group]);
            OpView::QConv {
                dt: w.dtypes([d0, d1, d2])?,
                q: QConvView {
                    p: IntConv {
                        batch,
                        c,
                        m,
                        group,
                        g: geom(g),
                    },
                    zx: zx as i32,
                    zw: w.array([zw0, zw1])?,
                    bias: w.array([b0, b1])?,
                    mult: w.array([m0, m1])?,
                    out: out_q([zy, lo, hi]),
                    packed: &[],
                },
            }
        }
        id::QMATMUL => {
            let &[d0, d1, d2, rows, k, n, trans_b, za, zy, lo, hi, zb0, zb1, b0, b1, m0, m1] =
                w.take::<17>()?;
            let [rows, k, n] = usizes([rows, k, n]);
            OpView::QMatMul {
                dt: w.dtypes([d0, d1, d2])?,
                q: QMmView {
                    rows,
                    k,
                    n,
                    trans_b: w.bool(trans_b)?,
                    za: za as i32,
                    zb: w.array([zb0, zb1])?,
                    bias: w.array([b0, b1])?,
                    mult: w.array([m0, m1])?,
                    out: out_q([zy, lo, hi]),
                },
            }
        }
        id::QREQUANT => {
            let &[d0, d1, zx, m, s, zy, lo, hi] = w.take::<8>()?;
            OpView::QRequant {
                dt: w.dtypes([d0, d1])?,
                zx: zx as i32,
                r: w.requant([m, s])?,
                out: out_q([zy, lo, hi]),
            }
        }
        id::QBINARY => {
            let &[d, is_add, rank] = w.take::<3>()?;
            let shape = usizes(*w.take::<MAX_RANK>()?);
            let strides = [
                usizes(*w.take::<MAX_RANK>()?),
                usizes(*w.take::<MAX_RANK>()?),
            ];
            let &[za, zb, zc, ma0, ma1, mb0, mb1, shift, m, s] = w.take::<10>()?;
            let wide = |lo: u32, hi: u32| (lo as u64 | (hi as u64) << 32) as i64;
            let Some(add) = Requant2::from_parts(wide(ma0, ma1), wide(mb0, mb1), shift) else {
                return w.fail("requantization multiplier out of range");
            };
            OpView::QBinary {
                dt: w.dtype(d)?,
                is_add: w.bool(is_add)?,
                rank: rank as usize,
                shape,
                strides,
                p: BinParams {
                    za: za as i32,
                    zb: zb as i32,
                    zc: zc as i32,
                    add,
                    mul: w.requant([m, s])?,
                },
            }
        }
        id::QGLOBAL_AVG => {
            let &[d, n, c, img, cl, pool @ ..] = w.take::<9>()?;
            OpView::QGlobalAvg {
                dt: w.dtype(d)?,
                n: n as usize,
                c: c as usize,
                img: img as usize,
                cl: w.bool(cl)?,
                p: w.pool(pool)?,
            }
        }
        id::QAVG_POOL => {
            let &[d, n, c, cl, include, g @ .., z0, z1, m, s] = w.take::<30>()?;
            OpView::QAvgPool {
                dt: w.dtype(d)?,
                n: n as usize,
                c: c as usize,
                cl: w.bool(cl)?,
                include: w.bool(include)?,
                g: geom(g),
                p: w.pool([z0, z1, m, s])?,
            }
        }
        _ => return w.fail("unknown compiled kernel id"),
    })
}
