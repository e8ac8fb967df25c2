//! Kernels a compiled model can carry, as the planned session runs them
//! (feature `alloc`): each owns its parameters, runs through the same
//! [`OpView::run`] as a `.mote` file, and encodes itself for the writer.

use alloc::vec::Vec;

use super::op::OpView;
use crate::error::{Error, ErrorKind, Result};
use crate::kern::qconv::{IntConv, OutQ, QConvView, QMmView};
use crate::kern::requant::Requant;
use crate::kern::Geom;
use crate::ops::{Kernel, KernelIo};
use crate::DType;

/// Parameters: plain (no per-channel arrays) or with owned arrays.
#[derive(Debug)]
pub(crate) enum Params {
    /// Kernels whose parameters are all scalars.
    Plain(OpView<'static>),
    /// `mote.QConv`.
    Conv {
        dt: [DType; 3],
        p: IntConv,
        zx: i32,
        zw: Vec<i32>,
        bias: Vec<i32>,
        mult: Vec<Requant>,
        out: OutQ,
        /// Weights packed for the host's integer GEMM (not written to
        /// `.mote` files; empty when unused).
        packed: Vec<i32>,
    },
    /// `mote.QMatMul`.
    MatMul {
        dt: [DType; 3],
        rows: usize,
        k: usize,
        n: usize,
        trans_b: bool,
        za: i32,
        zb: Vec<i32>,
        bias: Vec<i32>,
        mult: Vec<Requant>,
        out: OutQ,
    },
}

/// A prepared kernel that `mote compile` can write to a `.mote` file.
#[derive(Debug)]
pub(crate) struct Export {
    /// Name shown by `Debug` (the op it implements).
    pub name: &'static str,
    /// Node input positions of the data inputs (`arity` of them used).
    pub ins: [usize; 2],
    pub params: Params,
}

impl Export {
    pub(crate) fn new(name: &'static str, ins: [usize; 2], params: Params) -> Self {
        Export { name, ins, params }
    }

    /// The borrowed view both runtimes execute.
    pub(crate) fn view(&self) -> OpView<'_> {
        match &self.params {
            Params::Plain(v) => *v,
            Params::Conv {
                dt,
                p,
                zx,
                zw,
                bias,
                mult,
                out,
                packed,
            } => OpView::QConv {
                dt: *dt,
                q: QConvView {
                    p: *p,
                    zx: *zx,
                    zw,
                    bias,
                    mult,
                    out: *out,
                    packed,
                },
            },
            Params::MatMul {
                dt,
                rows,
                k,
                n,
                trans_b,
                za,
                zb,
                bias,
                mult,
                out,
            } => OpView::QMatMul {
                dt: *dt,
                q: QMmView {
                    rows: *rows,
                    k: *k,
                    n: *n,
                    trans_b: *trans_b,
                    za: *za,
                    zb,
                    bias,
                    mult,
                    out: *out,
                },
            },
        }
    }
}

impl Kernel for Export {
    fn run(&self, io: &mut KernelIo<'_>) -> Result<()> {
        let v = self.view();
        let a = if io.is_inplace() {
            None
        } else {
            Some(io.input(self.ins[0])?.bytes())
        };
        let b = if v.arity() > 1 {
            Some(io.input(self.ins[1])?.bytes())
        } else {
            None
        };
        v.run([a, b], io.output(0)?.into_bytes())
    }

    fn as_any(&self) -> Option<&dyn core::any::Any> {
        Some(self)
    }
}

// ---------------------------------------------------------------------------
// Encoding (mirror of `op::decode`)
// ---------------------------------------------------------------------------

/// Writes parameter words; arrays go to the data section (4-aligned).
pub(crate) struct Encoder<'a> {
    pub words: Vec<u32>,
    pub data: &'a mut Vec<u8>,
}

impl Encoder<'_> {
    fn u32(&mut self, v: u32) {
        self.words.push(v);
    }

    fn usize(&mut self, v: usize) -> Result<()> {
        self.words
            .push(u32::try_from(v).map_err(|_| Error::new(ErrorKind::Overflow))?);
        Ok(())
    }

    fn i32(&mut self, v: i32) {
        self.words.push(v as u32);
    }

    fn bool(&mut self, v: bool) {
        self.words.push(v as u32);
    }

    fn i64(&mut self, v: i64) {
        self.words.push(v as u32);
        self.words.push((v >> 32) as u32);
    }

    fn dtype(&mut self, d: DType) {
        self.i32(d.onnx_code());
    }

    fn array<T: bytemuck::Pod>(&mut self, v: &[T]) -> Result<()> {
        while !self.data.len().is_multiple_of(4) {
            self.data.push(0);
        }
        let off = self.data.len();
        self.data.extend_from_slice(bytemuck::cast_slice(v));
        self.usize(off)?;
        self.usize(v.len())
    }

    fn requant(&mut self, r: &Requant) {
        let [m, s]: [i32; 2] = bytemuck::cast(*r);
        self.i32(m);
        self.i32(s);
    }

    fn out(&mut self, o: &OutQ) {
        self.i32(o.zy);
        self.i32(o.lo);
        self.i32(o.hi);
    }

    fn spatial(&mut self, v: &[usize; 3]) -> Result<()> {
        v.iter().try_for_each(|&d| self.usize(d))
    }

    fn geom(&mut self, g: &Geom) -> Result<()> {
        for v in [&g.inp, &g.out, &g.k, &g.s, &g.d, &g.pb, &g.pe] {
            self.spatial(v)?;
        }
        Ok(())
    }
}

/// Encodes `v`'s parameters (the words `op::decode` reads back).
pub(crate) fn encode(v: &OpView<'_>, e: &mut Encoder<'_>) -> Result<()> {
    match v {
        OpView::QConv { dt, q } => {
            dt.iter().for_each(|d| e.dtype(*d));
            let p = &q.p;
            for d in [p.batch, p.c, p.m, p.group] {
                e.usize(d)?;
            }
            e.geom(&p.g)?;
            e.i32(q.zx);
            e.out(&q.out);
            e.array(q.zw)?;
            e.array(q.bias)?;
            e.array(q.mult)?;
        }
        OpView::QMatMul { dt, q } => {
            dt.iter().for_each(|d| e.dtype(*d));
            for d in [q.rows, q.k, q.n] {
                e.usize(d)?;
            }
            e.bool(q.trans_b);
            e.i32(q.za);
            e.out(&q.out);
            e.array(q.zb)?;
            e.array(q.bias)?;
            e.array(q.mult)?;
        }
        OpView::QRequant { dt, zx, r, out } => {
            dt.iter().for_each(|d| e.dtype(*d));
            e.i32(*zx);
            e.requant(r);
            e.out(out);
        }
        OpView::QBinary {
            dt,
            is_add,
            rank,
            shape,
            strides,
            p,
        } => {
            e.dtype(*dt);
            e.bool(*is_add);
            e.usize(*rank)?;
            for s in [shape, &strides[0], &strides[1]] {
                s.iter().try_for_each(|&d| e.usize(d))?;
            }
            e.i32(p.za);
            e.i32(p.zb);
            e.i32(p.zc);
            let (ma, mb, shift) = p.add.to_parts();
            e.i64(ma);
            e.i64(mb);
            e.u32(shift);
            e.requant(&p.mul);
        }
        OpView::QGlobalAvg {
            dt,
            n,
            c,
            img,
            cl,
            p,
        } => {
            e.dtype(*dt);
            for d in [*n, *c, *img] {
                e.usize(d)?;
            }
            e.bool(*cl);
            e.i32(p.zx);
            e.i32(p.zy);
            e.requant(&p.r);
        }
        OpView::QAvgPool {
            dt,
            n,
            c,
            cl,
            include,
            g,
            p,
        } => {
            e.dtype(*dt);
            e.usize(*n)?;
            e.usize(*c)?;
            e.bool(*cl);
            e.bool(*include);
            e.geom(g)?;
            e.i32(p.zx);
            e.i32(p.zy);
            e.requant(&p.r);
        }
    }
    Ok(())
}
