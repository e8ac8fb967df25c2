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
    /// range, clamp bounds inside the output type, nonzero strides.
    pub(crate) fn validate(&self) -> Result<()> {
        let out_ok = |o: &OutQ, dt: DType| -> Result<()> {
            let (lo, hi) = match dt {
                DType::I8 => (-128, 127),
                DType::U8 => (0, 255),
                _ => return Err(bad("compiled integer kernel on a non-8-bit type")),
            };
            if o.lo < lo || o.hi > hi || o.lo > o.hi {
                return Err(bad("output clamp outside the output type"));
            }
            Ok(())
        };
        // Zero points inside their type keep every `(x - z)·(w - zw)`
        // product within ±255², far from i32 overflow.
        let zp_ok = |z: &[i32], dt: DType| -> Result<()> {
            let (lo, hi) = match dt {
                DType::I8 => (-128, 127),
                DType::U8 => (0, 255),
                _ => return Err(bad("compiled integer kernel on a non-8-bit type")),
            };
            if z.iter().all(|v| (lo..=hi).contains(v)) {
                Ok(())
            } else {
                Err(bad("zero point outside its type"))
            }
        };
        let mults_ok = |m: &[Requant]| -> Result<()> {
            if m.iter().all(Requant::is_valid) {
                Ok(())
            } else {
                Err(bad("requantization multiplier out of range"))
            }
        };
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
                    return Err(bad("QConv: channels must divide into groups"));
                }
                let (ins, outs, ks) = sizes(&p.g)?;
                mul(&[p.batch, p.c, ins])?;
                mul(&[p.m, p.c.checked_div(p.group).unwrap_or(0), ks])?;
                mul(&[p.batch, p.m, outs])?;
                Ok(())
            }
            OpView::QMatMul { dt, q } => {
                out_ok(&q.out, dt[2])?;
                mults_ok(q.mult)?;
                zp_ok(&[q.za], dt[0])?;
                zp_ok(q.zb, dt[1])?;
                zp_ok(&[q.out.zy], dt[2])?;
                mul(&[q.rows, q.k])?;
                mul(&[q.k, q.n])?;
                mul(&[q.rows, q.n])?;
                Ok(())
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
                mul(shape.get(..*rank).ok_or(bad("rank above 8"))?)?;
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
                    return Err(bad("QLinearAveragePool with dilations"));
                }
                let (ins, outs, _) = sizes(g)?;
                mul(&[*n, *c, ins])?;
                mul(&[*n, *c, outs])?;
                Ok(())
            }
        }
    }
}

/// Checked product (a file's sizes must not overflow the kernels' index
/// arithmetic).
fn mul(v: &[usize]) -> Result<usize> {
    crate::checked_numel(v)
}

fn sizes(g: &Geom) -> Result<(usize, usize, usize)> {
    Ok((mul(&g.inp)?, mul(&g.out)?, mul(&g.k)?))
}

/// A window geometry whose every tap position is computable without
/// overflow: strides and dilations ≥ 1, and the last window starts inside
/// the padded input (floor or ceil mode).
fn geom_consistent(g: &Geom) -> Result<()> {
    geom_ok(g)?;
    let axes = (g.inp.iter().zip(&g.pb).zip(&g.pe))
        .zip(g.k.iter().zip(&g.d))
        .zip(g.out.iter().zip(&g.s));
    for ((((&inp, &pb), &pe), (&k, &d)), (&out, &s)) in axes {
        let span = inp
            .checked_add(pb)
            .and_then(|v| v.checked_add(pe))
            .ok_or(Error::new(ErrorKind::Overflow))?;
        let reach = k
            .checked_sub(1)
            .and_then(|k| k.checked_mul(d))
            .ok_or(bad("window: kernel size 0 or overflow"))?;
        let last = out
            .saturating_sub(1)
            .checked_mul(s)
            .ok_or(Error::new(ErrorKind::Overflow))?;
        if reach.checked_add(last).is_none() || last >= span.max(1) || pb > span {
            return Err(bad("window geometry inconsistent"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Decoding (no allocation)
// ---------------------------------------------------------------------------

/// Reads parameter words; arrays are resolved against the data section.
pub(crate) struct Words<'a> {
    w: &'a [u8],
    at: usize,
    data: &'a [u8],
}

impl<'a> Words<'a> {
    pub(crate) fn new(params: &'a [u8], data: &'a [u8]) -> Self {
        Words {
            w: params,
            at: 0,
            data,
        }
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self
            .w
            .get(self.at..self.at.saturating_add(4))
            .ok_or(bad("kernel parameters truncated"))?;
        self.at = self.at.saturating_add(4);
        Ok(u32::from_le_bytes(
            b.try_into()
                .map_err(|_| bad("kernel parameters truncated"))?,
        ))
    }

    fn i32(&mut self) -> Result<i32> {
        Ok(self.u32()? as i32)
    }

    fn usize(&mut self) -> Result<usize> {
        usize::try_from(self.u32()?).map_err(|_| Error::new(ErrorKind::Overflow))
    }

    fn bool(&mut self) -> Result<bool> {
        match self.u32()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(bad("kernel parameter: boolean not 0 or 1")),
        }
    }

    fn i64(&mut self) -> Result<i64> {
        let lo = self.u32()? as u64;
        let hi = self.u32()? as u64;
        Ok((lo | (hi << 32)) as i64)
    }

    fn dtype(&mut self) -> Result<DType> {
        DType::from_onnx(self.i32()?).ok_or(bad("kernel parameter: unknown dtype"))
    }

    fn array<T: bytemuck::Pod>(&mut self) -> Result<&'a [T]> {
        let off = self.usize()?;
        let n = self.usize()?;
        let len = n
            .checked_mul(core::mem::size_of::<T>())
            .ok_or(Error::new(ErrorKind::Overflow))?;
        let end = off
            .checked_add(len)
            .ok_or(Error::new(ErrorKind::Overflow))?;
        let b = self
            .data
            .get(off..end)
            .ok_or(bad("kernel parameter array outside the data section"))?;
        bytemuck::try_cast_slice(b).map_err(|_| bad("kernel parameter array misaligned"))
    }

    fn requant(&mut self) -> Result<Requant> {
        let (m, s) = (self.i32()?, self.i32()?);
        let r: Requant = bytemuck::cast([m, s]);
        if !r.is_valid() {
            return Err(bad("requantization multiplier out of range"));
        }
        Ok(r)
    }

    fn out(&mut self) -> Result<OutQ> {
        Ok(OutQ {
            zy: self.i32()?,
            lo: self.i32()?,
            hi: self.i32()?,
        })
    }

    fn spatial(&mut self) -> Result<[usize; MAX_SPATIAL]> {
        Ok([self.usize()?, self.usize()?, self.usize()?])
    }

    fn geom(&mut self) -> Result<Geom> {
        Ok(Geom {
            inp: self.spatial()?,
            out: self.spatial()?,
            k: self.spatial()?,
            s: self.spatial()?,
            d: self.spatial()?,
            pb: self.spatial()?,
            pe: self.spatial()?,
        })
    }

    fn pool(&mut self) -> Result<PoolParams> {
        Ok(PoolParams {
            zx: self.i32()?,
            zy: self.i32()?,
            r: self.requant()?,
        })
    }

    fn ranked(&mut self) -> Result<[usize; MAX_RANK]> {
        let mut v = [0usize; MAX_RANK];
        for d in v.iter_mut() {
            *d = self.usize()?;
        }
        Ok(v)
    }
}

/// Decodes the parameters of kernel `kid`.
pub(crate) fn decode<'a>(kid: u32, w: &mut Words<'a>) -> Result<OpView<'a>> {
    let op = match kid {
        id::QCONV => {
            let dt = [w.dtype()?, w.dtype()?, w.dtype()?];
            let p = IntConv {
                batch: w.usize()?,
                c: w.usize()?,
                m: w.usize()?,
                group: w.usize()?,
                g: w.geom()?,
            };
            let zx = w.i32()?;
            let out = w.out()?;
            OpView::QConv {
                dt,
                q: QConvView {
                    p,
                    zx,
                    zw: w.array()?,
                    bias: w.array()?,
                    mult: w.array()?,
                    out,
                    packed: &[],
                },
            }
        }
        id::QMATMUL => {
            let dt = [w.dtype()?, w.dtype()?, w.dtype()?];
            let (rows, k, n, trans_b) = (w.usize()?, w.usize()?, w.usize()?, w.bool()?);
            let za = w.i32()?;
            let out = w.out()?;
            OpView::QMatMul {
                dt,
                q: QMmView {
                    rows,
                    k,
                    n,
                    trans_b,
                    za,
                    zb: w.array()?,
                    bias: w.array()?,
                    mult: w.array()?,
                    out,
                },
            }
        }
        id::QREQUANT => OpView::QRequant {
            dt: [w.dtype()?, w.dtype()?],
            zx: w.i32()?,
            r: w.requant()?,
            out: w.out()?,
        },
        id::QBINARY => {
            let dt = w.dtype()?;
            let is_add = w.bool()?;
            let rank = w.usize()?;
            let shape = w.ranked()?;
            let strides = [w.ranked()?, w.ranked()?];
            let (za, zb, zc) = (w.i32()?, w.i32()?, w.i32()?);
            let (ma, mb) = (w.i64()?, w.i64()?);
            let shift = w.u32()?;
            let add = Requant2::from_parts(ma, mb, shift)
                .ok_or(bad("requantization multiplier out of range"))?;
            let mul = w.requant()?;
            OpView::QBinary {
                dt,
                is_add,
                rank,
                shape,
                strides,
                p: BinParams {
                    za,
                    zb,
                    zc,
                    add,
                    mul,
                },
            }
        }
        id::QGLOBAL_AVG => OpView::QGlobalAvg {
            dt: w.dtype()?,
            n: w.usize()?,
            c: w.usize()?,
            img: w.usize()?,
            cl: w.bool()?,
            p: w.pool()?,
        },
        id::QAVG_POOL => OpView::QAvgPool {
            dt: w.dtype()?,
            n: w.usize()?,
            c: w.usize()?,
            cl: w.bool()?,
            include: w.bool()?,
            g: w.geom()?,
            p: w.pool()?,
        },
        _ => {
            return Err(Error::new(ErrorKind::Unsupported(
                "unknown compiled kernel id",
            )))
        }
    };
    if w.at != w.w.len() {
        return Err(bad("kernel parameters: trailing words"));
    }
    op.validate()?;
    Ok(op)
}
