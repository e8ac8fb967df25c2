//! Indexing, scatter and sequence-position operators: GatherElements,
//! GatherND, Scatter / ScatterElements, ScatterND, TensorScatter, Trilu,
//! CumSum, CumProd, OneHot, EyeLike, DepthToSpace, SpaceToDepth,
//! ReverseSequence, TopK. (Compress, NonZero, Unique, whose output shapes
//! depend on values, are in `select.rs`.)
//!
//! Pure data movement works on raw bytes, so it handles every dtype; ops
//! that compute (scatter reductions, cumulative sums and products, TopK's
//! ordering) dispatch once in prepare to a kernel typed by `Num`. Indices
//! are tensor values, known only at run time: each is wrapped (negative
//! counts from the end) and checked there, and an out-of-range one is an
//! `Err`, never an out-of-bounds access.

use alloc::vec::Vec;
use core::cmp::Ordering;
use core::num::NonZeroUsize;

use half::{bf16, f16};

use crate::error::{checked_numel, Error, ErrorKind, Result};
use crate::ops::{kernel, util, KernelIo, OpDef, OutputInfo, PrepareCtx, Prepared};
use crate::tensor::ChunksOf as _;
use crate::tensor::{TensorView, MAX_RANK};
use crate::{DType, Element};

/// Operators of this family.
pub const OPS: &[OpDef] = &[
    OpDef::onnx("GatherElements", 11, prepare_gather_elements),
    OpDef::onnx("GatherND", 11, prepare_gather_nd),
    OpDef::onnx("Scatter", 9, prepare_scatter_elements),
    OpDef::onnx("ScatterElements", 11, prepare_scatter_elements),
    OpDef::onnx("ScatterND", 11, prepare_scatter_nd),
    OpDef::onnx("TensorScatter", 24, prepare_tensor_scatter),
    OpDef::onnx("Trilu", 14, prepare_trilu),
    OpDef::onnx("CumSum", 11, prepare_cumsum),
    OpDef::onnx("CumProd", 26, prepare_cumprod),
    OpDef::onnx("OneHot", 9, prepare_one_hot),
    OpDef::onnx("EyeLike", 9, prepare_eye_like),
    OpDef::onnx("DepthToSpace", 1, prepare_depth_to_space),
    OpDef::onnx("SpaceToDepth", 1, prepare_space_to_depth),
    OpDef::onnx("ReverseSequence", 10, prepare_reverse_sequence),
    OpDef::onnx("TopK", 1, prepare_top_k),
];

fn shape_err(s: &'static str) -> Error {
    Error::new(ErrorKind::Shape(s))
}

fn attr_err(name: &'static str, problem: &'static str) -> Error {
    Error::new(ErrorKind::Attribute { name, problem })
}

fn overflow() -> Error {
    Error::new(ErrorKind::Overflow)
}

/// Bytes of a tensor of `shape` with `es`-byte elements; `Err` if the
/// count overflows. Prepare checks it for the tensors a kernel indexes:
/// element and byte offsets below it are exact in `usize`, so the kernels
/// compute them wrapping by name.
fn checked_bytes(shape: &[usize], es: usize) -> Result<usize> {
    checked_numel(shape)?.checked_mul(es).ok_or_else(overflow)
}

/// `d` as a divisor, 1 for 0 (for the `.max(1)` of an empty dimension).
#[inline]
fn nonzero(d: usize) -> NonZeroUsize {
    NonZeroUsize::new(d).unwrap_or(NonZeroUsize::MIN)
}

fn check_rank(r: usize) -> Result<()> {
    if r > MAX_RANK {
        return Err(Error::new(ErrorKind::Unsupported("rank above MAX_RANK")));
    }
    Ok(())
}

/// Wraps a negative index and checks it against `dim`.
#[inline]
fn wrap(k: i64, dim: usize, what: &'static str) -> Result<usize> {
    let d = dim as i64;
    // k < 0 <= d (a dimension): the sum cannot overflow.
    let v = if k < 0 { k.wrapping_add(d) } else { k };
    if v < 0 || v >= d {
        return Err(shape_err(what));
    }
    Ok(v as usize)
}

#[inline]
fn int_at(v: &TensorView<'_>, i: usize) -> Result<i64> {
    v.int_at(i).ok_or(Error::internal("index read"))
}

/// Row-major element strides of `shape`; `Err` on overflow.
fn strides(shape: &[usize]) -> Result<Vec<usize>> {
    let mut s = alloc::vec![1usize; shape.len()];
    // s[d] = s[d + 1] * shape[d + 1], from the back; the last stays 1.
    let mut acc = 1usize;
    for (o, &d) in s.iter_mut().rev().skip(1).zip(shape.iter().rev()) {
        acc = acc.checked_mul(d).ok_or_else(overflow)?;
        *o = acc;
    }
    Ok(s)
}

/// Data element offset (strides `xstr`) of the coordinates of linear index
/// `lin` in `shape`, leaving out the coordinate on `axis` (the caller adds
/// that one, read from an index tensor).
///
/// The callers' `shape` is no larger than the data's off the axis
/// (`larger_off_axis`) and `lin` is below its element count, so the
/// offset is below the data's element count, checked in prepare: the
/// wrapping operations are exact.
#[inline]
fn offset_off_axis(mut lin: usize, shape: &[usize], xstr: &[usize], axis: usize) -> usize {
    let mut off = 0usize;
    for (d, (&n, &st)) in shape.iter().zip(xstr).enumerate().rev() {
        let n = nonzero(n);
        if d != axis {
            off = off.wrapping_add((lin % n).wrapping_mul(st));
        }
        lin /= n;
    }
    off
}

/// Copies `len` bytes from `src[s..]` to `dst[d..]`, `Err` if either range
/// is out of bounds.
#[inline]
fn copy_at(src: &[u8], s: usize, dst: &mut [u8], d: usize, len: usize) -> Result<()> {
    let bad = || Error::internal("copy range");
    let from = src.get(s..).and_then(|t| t.get(..len)).ok_or_else(bad)?;
    dst.get_mut(d..)
        .and_then(|t| t.get_mut(..len))
        .ok_or_else(bad)?
        .copy_from_slice(from);
    Ok(())
}

fn copy_all<T: Copy>(dst: &mut [T], src: &[T]) -> Result<()> {
    if dst.len() != src.len() {
        return Err(Error::internal("copy length"));
    }
    dst.copy_from_slice(src);
    Ok(())
}

/// Arithmetic the computing kernels need, per element type. Integers wrap
/// like numpy's; half floats compute in f32 and round at each step, as
/// numpy does when it accumulates in the array's dtype.
trait Num: Element + Copy + PartialOrd {
    const ZERO: Self;
    const ONE: Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
}

macro_rules! num_int {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const ZERO: Self = 0;
            const ONE: Self = 1;
            #[inline]
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline]
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
        }
    )*};
}
num_int!(i8, u8, i16, u16, i32, u32, i64, u64);

macro_rules! num_float {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline]
            fn add(self, o: Self) -> Self { self + o }
            #[inline]
            fn mul(self, o: Self) -> Self { self * o }
        }
    )*};
}
num_float!(f32, f64);

macro_rules! num_half {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const ZERO: Self = <$t>::ZERO;
            const ONE: Self = <$t>::ONE;
            #[inline]
            fn add(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() + o.to_f32()) }
            #[inline]
            fn mul(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() * o.to_f32()) }
        }
    )*};
}
num_half!(f16, bf16);

/// Calls `$f::<T>($args)` for the [`Num`] type of `$dt`; other dtypes are
/// unsupported.
macro_rules! with_num {
    ($dt:expr, $what:expr, $f:ident ( $($a:expr),* )) => {
        match $dt {
            DType::F32 => $f::<f32>($($a),*),
            DType::F64 => $f::<f64>($($a),*),
            DType::F16 => $f::<f16>($($a),*),
            DType::BF16 => $f::<bf16>($($a),*),
            DType::I8 => $f::<i8>($($a),*),
            DType::U8 => $f::<u8>($($a),*),
            DType::I16 => $f::<i16>($($a),*),
            DType::U16 => $f::<u16>($($a),*),
            DType::I32 => $f::<i32>($($a),*),
            DType::U32 => $f::<u32>($($a),*),
            DType::I64 => $f::<i64>($($a),*),
            DType::U64 => $f::<u64>($($a),*),
            d => Err(Error::new(ErrorKind::UnsupportedDType {
                what: $what,
                code: d.onnx_code(),
            })),
        }
    };
}

/// A total order with NaN above every number (numpy sorts NaN last).
#[inline]
fn total_cmp<T: PartialOrd>(a: &T, b: &T) -> Ordering {
    match a.partial_cmp(b) {
        Some(o) => o,
        None => {
            let an = a.partial_cmp(a).is_none();
            let bn = b.partial_cmp(b).is_none();
            an.cmp(&bn)
        }
    }
}

// ---------------------------------------------------------------------------
// GatherElements, GatherND.

fn prepare_gather_elements(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let ix = ctx.input(1)?;
    util::dtype_in(
        ix.dtype,
        &[DType::I32, DType::I64],
        "GatherElements indices",
    )?;
    let r = x.shape.len();
    if r == 0 || ix.shape.len() != r {
        return Err(shape_err(
            "GatherElements: indices must have the rank of data",
        ));
    }
    check_rank(r)?;
    let axis = util::axis(ctx.attr_int("axis", 0)?, r, "axis")?;
    if larger_off_axis(ix.shape, x.shape, axis) {
        return Err(shape_err("GatherElements: indices larger than data"));
    }
    let es = x.dtype.size();
    checked_bytes(x.shape, es)?;
    checked_bytes(ix.shape, es)?;
    let ishape = ix.shape.to_vec();
    let xstr = strides(x.shape)?;
    let dim = *x
        .shape
        .get(axis)
        .ok_or(Error::internal("GatherElements axis"))?;
    let axis_stride = *xstr
        .get(axis)
        .ok_or(Error::internal("GatherElements axis"))?;
    let n = ix.numel();
    Ok(Prepared::single(
        x.dtype,
        ix.shape,
        kernel("GatherElements", move |io: &mut KernelIo<'_>| {
            let src = io.input(0)?.bytes();
            let iv = io.input(1)?;
            let mut y = io.output(0)?;
            let dst = y.bytes_mut();
            for j in 0..n {
                let k = wrap(int_at(&iv, j)?, dim, "GatherElements: index out of range")?;
                // k < dim: the data offset is below x's element count and
                // j below the output's, whose bytes prepare checked.
                let off = offset_off_axis(j, &ishape, &xstr, axis)
                    .wrapping_add(k.wrapping_mul(axis_stride));
                copy_at(src, off.wrapping_mul(es), dst, j.wrapping_mul(es), es)?;
            }
            Ok(())
        }),
    ))
}

/// Whether `ix` is larger than `x` on some axis other than `axis` (shapes
/// of the same rank).
fn larger_off_axis(ix: &[usize], x: &[usize], axis: usize) -> bool {
    ix.iter()
        .zip(x)
        .enumerate()
        .any(|(d, (&i, &x))| d != axis && i > x)
}

/// Where the index tuples of GatherND / ScatterND point: `m` leading data
/// dimensions after `b` batch dimensions, each tuple selecting a slice of
/// `slice` elements.
#[derive(Clone, Debug)]
struct NdIndex {
    m: usize,
    /// Tuples per batch.
    per: usize,
    batches: usize,
    /// Data elements per batch.
    batch_stride: usize,
    dims: Vec<usize>,
    dim_strides: Vec<usize>,
    slice: usize,
}

impl NdIndex {
    fn new(data: &[usize], ix: &[usize], b: usize) -> Result<Self> {
        let r = data.len();
        let range_err = || shape_err("ND indices: rank or batch_dims out of range");
        let (&m, ix_lead) = ix.split_last().ok_or_else(range_err)?;
        if r == 0 || b >= ix.len().min(r) {
            return Err(range_err());
        }
        // b < r, checked above.
        if m == 0 || m > r.wrapping_sub(b) {
            return Err(shape_err("ND indices: last dimension out of range"));
        }
        // b < q and b + m <= r, checked above.
        let bad = || Error::internal("ND indices: split");
        let (ix_batch, ix_tuples) = ix_lead.split_at_checked(b).ok_or_else(bad)?;
        let (data_batch, data_rest) = data.split_at_checked(b).ok_or_else(bad)?;
        if ix_batch != data_batch {
            return Err(shape_err("ND indices: batch dimensions differ"));
        }
        let (dims, data_slice) = data_rest.split_at_checked(m).ok_or_else(bad)?;
        let st = strides(data)?;
        // The offsets `each` computes are below these counts.
        checked_numel(data)?;
        checked_numel(ix)?;
        Ok(NdIndex {
            m,
            per: checked_numel(ix_tuples)?,
            batches: checked_numel(ix_batch)?,
            batch_stride: checked_numel(data_rest)?,
            dims: dims.to_vec(),
            dim_strides: st
                .get(b..)
                .and_then(|s| s.get(..m))
                .ok_or_else(bad)?
                .to_vec(),
            slice: checked_numel(data_slice)?,
        })
    }

    /// Calls `f(tuple number, data element offset)` for every index tuple.
    ///
    /// The tuple number is below `batches · per`, its index elements below
    /// the index tensor's count, and the offset (of coordinates below the
    /// data's shape) below the data's count; `new` checked both counts:
    /// the wrapping operations are exact.
    #[inline]
    fn each(
        &self,
        iv: &TensorView<'_>,
        what: &'static str,
        mut f: impl FnMut(usize, usize) -> Result<()>,
    ) -> Result<()> {
        for bi in 0..self.batches {
            for t in 0..self.per {
                let n = bi.wrapping_mul(self.per).wrapping_add(t);
                let mut off = bi.wrapping_mul(self.batch_stride);
                let at = n.wrapping_mul(self.m);
                for (k, (&dim, &st)) in self.dims.iter().zip(&self.dim_strides).enumerate() {
                    let v = wrap(int_at(iv, at.wrapping_add(k))?, dim, what)?;
                    off = off.wrapping_add(v.wrapping_mul(st));
                }
                f(n, off)?;
            }
        }
        Ok(())
    }
}

fn prepare_gather_nd(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let ix = ctx.input(1)?;
    util::dtype_in(ix.dtype, &[DType::I32, DType::I64], "GatherND indices")?;
    let b = ctx.attr_int("batch_dims", 0)?;
    if b < 0 {
        return Err(attr_err("batch_dims", "negative"));
    }
    let nd = NdIndex::new(x.shape, ix.shape, b as usize)?;
    // NdIndex::new checked both ranks.
    let bad = || Error::internal("GatherND shape");
    let mut out = ix.shape.split_last().ok_or_else(bad)?.1.to_vec();
    let tail = x.shape.get(b as usize..).and_then(|s| s.get(nd.m..));
    out.extend_from_slice(tail.ok_or_else(bad)?);
    let es = x.dtype.size();
    // Tuple n's slice is output bytes n·len..(n + 1)·len; offsets below
    // these byte counts are exact.
    checked_bytes(x.shape, es)?;
    checked_bytes(&out, es)?;
    let len = nd.slice.checked_mul(es).ok_or_else(overflow)?;
    Ok(Prepared::single(
        x.dtype,
        &out,
        kernel("GatherND", move |io: &mut KernelIo<'_>| {
            let src = io.input(0)?.bytes();
            let iv = io.input(1)?;
            let mut y = io.output(0)?;
            let dst = y.bytes_mut();
            nd.each(&iv, "GatherND: index out of range", |n, off| {
                copy_at(src, off.wrapping_mul(es), dst, n.wrapping_mul(len), len)
            })
        }),
    ))
}

// ---------------------------------------------------------------------------
// Scatter, ScatterElements, ScatterND.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reduce {
    None,
    Add,
    Mul,
    Max,
    Min,
}

impl Reduce {
    fn parse(ctx: &PrepareCtx<'_>) -> Result<Self> {
        Ok(match ctx.attr_str("reduction", "none")? {
            "none" => Reduce::None,
            "add" => Reduce::Add,
            "mul" => Reduce::Mul,
            "max" => Reduce::Max,
            "min" => Reduce::Min,
            _ => return Err(attr_err("reduction", "not none, add, mul, max or min")),
        })
    }

    #[inline]
    fn apply<T: Num>(self, a: T, b: T) -> T {
        match self {
            Reduce::None => b,
            Reduce::Add => a.add(b),
            Reduce::Mul => a.mul(b),
            Reduce::Max => {
                if total_cmp(&b, &a) == Ordering::Greater {
                    b
                } else {
                    a
                }
            }
            Reduce::Min => {
                if total_cmp(&b, &a) == Ordering::Less {
                    b
                } else {
                    a
                }
            }
        }
    }
}

/// The element targets of ScatterElements.
#[derive(Clone, Debug)]
struct ElemIndex {
    ishape: Vec<usize>,
    xstr: Vec<usize>,
    axis: usize,
    dim: usize,
    /// `xstr[axis]`.
    axis_stride: usize,
    n: usize,
}

impl ElemIndex {
    /// Calls `f(update number, data element offset)` for every index.
    #[inline]
    fn each(
        &self,
        iv: &TensorView<'_>,
        mut f: impl FnMut(usize, usize) -> Result<()>,
    ) -> Result<()> {
        for j in 0..self.n {
            let k = wrap(
                int_at(iv, j)?,
                self.dim,
                "ScatterElements: index out of range",
            )?;
            let off = offset_off_axis(j, &self.ishape, &self.xstr, self.axis);
            // k < dim: below the data's element count, checked in prepare.
            f(j, off.wrapping_add(k.wrapping_mul(self.axis_stride)))?;
        }
        Ok(())
    }
}

/// Reads inputs 1 and 2, then the output, filled with input 0 unless the
/// planner put it in place.
macro_rules! scatter_io {
    ($io:ident, $get_in:expr, $get_out:expr) => {{
        let iv = $io.input(1)?;
        let up = ($get_in)(&*$io, 2)?;
        let src = if $io.is_inplace() {
            None
        } else {
            Some(($get_in)(&*$io, 0)?)
        };
        let y = ($get_out)(&mut *$io, 0)?;
        if let Some(s) = src {
            copy_all(y, s)?;
        }
        (iv, up, y)
    }};
}

fn bytes_in<'a>(io: &KernelIo<'a>, i: usize) -> Result<&'a [u8]> {
    Ok(io.input(i)?.bytes())
}

fn bytes_out<'b>(io: &'b mut KernelIo<'_>, i: usize) -> Result<&'b mut [u8]> {
    Ok(io.output(i)?.into_bytes())
}

fn prepare_scatter_elements(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let ix = ctx.input(1)?;
    let u = ctx.input(2)?;
    util::dtype_in(
        ix.dtype,
        &[DType::I32, DType::I64],
        "ScatterElements indices",
    )?;
    if u.dtype != x.dtype {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: x.dtype,
            got: u.dtype,
        }));
    }
    let r = x.shape.len();
    if r == 0 || ix.shape.len() != r || u.shape != ix.shape {
        return Err(shape_err(
            "ScatterElements: indices and updates must match and have the rank of data",
        ));
    }
    check_rank(r)?;
    let axis = util::axis(ctx.attr_int("axis", 0)?, r, "axis")?;
    if larger_off_axis(ix.shape, x.shape, axis) {
        return Err(shape_err("ScatterElements: indices larger than data"));
    }
    let red = Reduce::parse(ctx)?;
    let es = x.dtype.size();
    // Data and update offsets are below these counts (`ElemIndex::each`).
    checked_bytes(x.shape, es)?;
    checked_bytes(u.shape, es)?;
    let xstr = strides(x.shape)?;
    let bad = || Error::internal("ScatterElements axis");
    let ei = ElemIndex {
        ishape: ix.shape.to_vec(),
        axis,
        dim: *x.shape.get(axis).ok_or_else(bad)?,
        axis_stride: *xstr.get(axis).ok_or_else(bad)?,
        xstr,
        n: ix.numel(),
    };
    if red == Reduce::None {
        return Ok(Prepared::single(
            x.dtype,
            x.shape,
            kernel("ScatterElements", move |io: &mut KernelIo<'_>| {
                let (iv, up, y) = scatter_io!(io, bytes_in, bytes_out);
                // j and off are below the byte counts checked above.
                ei.each(&iv, |j, off| {
                    copy_at(up, j.wrapping_mul(es), y, off.wrapping_mul(es), es)
                })
            }),
        )
        .in_place());
    }
    with_num!(
        x.dtype,
        "ScatterElements reduction",
        scatter_elements_typed(x.shape, ei, red)
    )
}

fn scatter_elements_typed<T: Num>(shape: &[usize], ei: ElemIndex, red: Reduce) -> Result<Prepared> {
    Ok(Prepared::single(
        T::DTYPE,
        shape,
        kernel("ScatterElements", move |io: &mut KernelIo<'_>| {
            let (iv, up, y) =
                scatter_io!(io, KernelIo::input_slice::<T>, KernelIo::output_slice::<T>);
            ei.each(&iv, |j, off| {
                let u = *up.get(j).ok_or(Error::internal("updates"))?;
                let o = y.get_mut(off).ok_or(Error::internal("scatter range"))?;
                *o = red.apply(*o, u);
                Ok(())
            })
        }),
    )
    .in_place())
}

fn prepare_scatter_nd(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let ix = ctx.input(1)?;
    let u = ctx.input(2)?;
    util::dtype_in(ix.dtype, &[DType::I32, DType::I64], "ScatterND indices")?;
    if u.dtype != x.dtype {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: x.dtype,
            got: u.dtype,
        }));
    }
    let nd = NdIndex::new(x.shape, ix.shape, 0)?;
    // NdIndex::new checked both ranks.
    let bad = || Error::internal("ScatterND shape");
    let mut want = ix.shape.split_last().ok_or_else(bad)?.1.to_vec();
    want.extend_from_slice(x.shape.get(nd.m..).ok_or_else(bad)?);
    if u.shape != want.as_slice() {
        return Err(shape_err("ScatterND: updates shape mismatch"));
    }
    let red = Reduce::parse(ctx)?;
    let es = x.dtype.size();
    // Tuple n's slice is update elements n·slice..(n + 1)·slice; offsets
    // below these byte counts are exact.
    checked_bytes(x.shape, es)?;
    checked_bytes(u.shape, es)?;
    if red == Reduce::None {
        let len = nd.slice.checked_mul(es).ok_or_else(overflow)?;
        return Ok(Prepared::single(
            x.dtype,
            x.shape,
            kernel("ScatterND", move |io: &mut KernelIo<'_>| {
                let (iv, up, y) = scatter_io!(io, bytes_in, bytes_out);
                nd.each(&iv, "ScatterND: index out of range", |n, off| {
                    copy_at(up, n.wrapping_mul(len), y, off.wrapping_mul(es), len)
                })
            }),
        )
        .in_place());
    }
    with_num!(
        x.dtype,
        "ScatterND reduction",
        scatter_nd_typed(x.shape, nd, red)
    )
}

fn scatter_nd_typed<T: Num>(shape: &[usize], nd: NdIndex, red: Reduce) -> Result<Prepared> {
    Ok(Prepared::single(
        T::DTYPE,
        shape,
        kernel("ScatterND", move |io: &mut KernelIo<'_>| {
            let (iv, up, y) =
                scatter_io!(io, KernelIo::input_slice::<T>, KernelIo::output_slice::<T>);
            let len = nd.slice;
            nd.each(&iv, "ScatterND: index out of range", |n, off| {
                // n·len is below the updates' count, checked in prepare.
                let from = up
                    .get(n.wrapping_mul(len)..)
                    .and_then(|u| u.get(..len))
                    .ok_or(Error::internal("updates"))?;
                let to = y
                    .get_mut(off..)
                    .and_then(|t| t.get_mut(..len))
                    .ok_or(Error::internal("scatter range"))?;
                for (o, &v) in to.iter_mut().zip(from) {
                    *o = red.apply(*o, v);
                }
                Ok(())
            })
        }),
    )
    .in_place())
}

/// TensorScatter (a KV-cache write): per batch, `update`'s rows along
/// `axis` land at `write_indices[b]` onward, wrapping in circular mode.
fn prepare_tensor_scatter(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let u = ctx.input(1)?;
    if u.dtype != x.dtype {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: x.dtype,
            got: u.dtype,
        }));
    }
    let r = x.shape.len();
    let axis = util::axis(ctx.attr_int("axis", -2)?, r, "axis")?;
    if axis == 0 {
        return Err(attr_err("axis", "axis 0 is the batch"));
    }
    let same = u.shape.len() == r
        && u.shape.iter().zip(x.shape).enumerate().all(
            |(d, (&ud, &xd))| {
                if d == axis {
                    ud <= xd
                } else {
                    ud == xd
                }
            },
        );
    if !same {
        return Err(shape_err("TensorScatter: update shape mismatch"));
    }
    // 0 < axis < r, checked above.
    let bad = || Error::internal("TensorScatter shape");
    let (lead, rest) = x.shape.split_at_checked(axis).ok_or_else(bad)?;
    let (&batch, between) = lead.split_first().ok_or_else(bad)?;
    let (&smax, tail) = rest.split_first().ok_or_else(bad)?;
    let sn = *u.shape.get(axis).ok_or_else(bad)?;
    if let Some(w) = ctx.opt_input(2) {
        util::dtype_in(
            w.dtype,
            &[DType::I32, DType::I64],
            "TensorScatter write_indices",
        )?;
        if w.shape != [batch] {
            return Err(shape_err("TensorScatter: write_indices must be [batch]"));
        }
    }
    let circular = match ctx.attr_str("mode", "linear")? {
        "linear" => false,
        "circular" => true,
        _ => return Err(attr_err("mode", "not linear or circular")),
    };
    let es = x.dtype.size();
    let rows = checked_numel(lead)?;
    let per_batch = nonzero(checked_numel(between)?);
    let block = checked_numel(tail)?.checked_mul(es).ok_or_else(overflow)?;
    // Row p's block s of the update, block c of the data: offsets below
    // these byte counts are exact.
    checked_bytes(x.shape, es)?;
    checked_bytes(u.shape, es)?;
    Ok(Prepared::single(
        x.dtype,
        x.shape,
        kernel("TensorScatter", move |io: &mut KernelIo<'_>| {
            let up = io.input(1)?.bytes();
            let wi = io.opt_input(2)?;
            let src = if io.is_inplace() {
                None
            } else {
                Some(io.input(0)?.bytes())
            };
            let mut y = io.output(0)?;
            let dst = y.bytes_mut();
            if let Some(s) = src {
                copy_all(dst, s)?;
            }
            for p in 0..rows {
                let b = p / per_batch;
                let w = match &wi {
                    Some(v) => int_at(v, b)?,
                    None => 0,
                };
                for s in 0..sn {
                    let c = w.saturating_add(s as i64);
                    let c = if circular {
                        c.rem_euclid(smax.max(1) as i64)
                    } else {
                        c
                    };
                    if c < 0 || c as usize >= smax {
                        return Err(shape_err("TensorScatter: write index out of range"));
                    }
                    // p < rows, c < smax, s < sn: below the byte counts
                    // checked in prepare.
                    let c = c as usize;
                    let to = p.wrapping_mul(smax).wrapping_add(c).wrapping_mul(block);
                    let from = p.wrapping_mul(sn).wrapping_add(s).wrapping_mul(block);
                    copy_at(up, from, dst, to, block)?;
                }
            }
            Ok(())
        }),
    )
    .in_place())
}

// ---------------------------------------------------------------------------
// Trilu, EyeLike.

fn prepare_trilu(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let [ref batch @ .., rows, cols] = *x.shape else {
        return Err(shape_err("Trilu: rank below 2"));
    };
    if let Some(k) = ctx.opt_input(1) {
        if !k.dtype.is_int() || k.numel() != 1 {
            return Err(shape_err("Trilu: k must be one integer"));
        }
    }
    let upper = ctx.attr_int("upper", 1)? != 0;
    let es = x.dtype.size();
    let mats = checked_numel(batch)?;
    // Row offsets below x's bytes are exact.
    checked_bytes(x.shape, es)?;
    let row = cols.checked_mul(es).ok_or_else(overflow)?;
    Ok(Prepared::single(
        x.dtype,
        x.shape,
        // k does not change the shape, so it may be a run-time input.
        kernel("Trilu", move |io: &mut KernelIo<'_>| {
            let k = match io.opt_input(1)? {
                Some(v) => int_at(&v, 0)?,
                None => 0,
            };
            let src = if io.is_inplace() {
                None
            } else {
                Some(io.input(0)?.bytes())
            };
            let mut y = io.output(0)?;
            let dst = y.bytes_mut();
            for m in 0..mats {
                for i in 0..rows {
                    // Kept columns are j >= i + k (upper) or j <= i + k.
                    let edge = (i as i64).saturating_add(k);
                    let (lo, hi) = if upper {
                        (edge.clamp(0, cols as i64) as usize, cols)
                    } else {
                        (0, edge.saturating_add(1).clamp(0, cols as i64) as usize)
                    };
                    // m < mats, i < rows and lo <= hi <= cols: every byte
                    // offset is below x's bytes, checked in prepare. (lo
                    // and hi in bytes from here.)
                    let base = m.wrapping_mul(rows).wrapping_add(i).wrapping_mul(row);
                    let (lo, hi) = (lo.wrapping_mul(es), hi.wrapping_mul(es));
                    let bad = || Error::internal("Trilu range");
                    let out = dst
                        .get_mut(base..)
                        .and_then(|t| t.get_mut(..row))
                        .ok_or_else(bad)?;
                    if let Some(s) = src {
                        copy_at(s, base.wrapping_add(lo), out, lo, hi.wrapping_sub(lo))?;
                    }
                    out.get_mut(..lo).ok_or_else(bad)?.fill(0);
                    out.get_mut(hi..).ok_or_else(bad)?.fill(0);
                }
            }
            Ok(())
        }),
    )
    .in_place())
}

/// Bytes of the value one in `dt` (little-endian, first `dt.size()` used).
fn one_bytes(dt: DType) -> [u8; 8] {
    let mut b = [0u8; 8];
    match dt {
        DType::F32 => b[..4].copy_from_slice(&1f32.to_le_bytes()),
        DType::F64 => b.copy_from_slice(&1f64.to_le_bytes()),
        DType::F16 => b[..2].copy_from_slice(&f16::ONE.to_le_bytes()),
        DType::BF16 => b[..2].copy_from_slice(&bf16::ONE.to_le_bytes()),
        _ => b[0] = 1,
    }
    b
}

fn prepare_eye_like(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let (rows, cols) = match *x.shape {
        [n] => (n, n),
        [r, c] => (r, c),
        _ => return Err(shape_err("EyeLike: input must be 2-D")),
    };
    let code = ctx.attr_int("dtype", 0)?;
    let dt = if code == 0 {
        x.dtype
    } else {
        DType::from_onnx(code as i32).ok_or(Error::new(ErrorKind::UnsupportedDType {
            what: "EyeLike dtype",
            code: code as i32,
        }))?
    };
    let k = ctx.attr_int("k", 0)?;
    let es = dt.size();
    // Element offsets below the output's bytes are exact.
    checked_bytes(&[rows, cols], es)?;
    let one = one_bytes(dt);
    Ok(Prepared::single(
        dt,
        &[rows, cols],
        kernel("EyeLike", move |io: &mut KernelIo<'_>| {
            let mut y = io.output(0)?;
            let dst = y.bytes_mut();
            dst.fill(0);
            for i in 0..rows {
                // Saturated, j is past every column all the same.
                let j = (i as i64).saturating_add(k);
                if j >= 0 && (j as usize) < cols {
                    // i < rows, j < cols: below the bytes checked in prepare.
                    let at = i.wrapping_mul(cols).wrapping_add(j as usize);
                    copy_at(&one, 0, dst, at.wrapping_mul(es), es)?;
                }
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------------------
// CumSum, CumProd.

fn prepare_cumsum(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_cum(ctx, "CumSum", false)
}

fn prepare_cumprod(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    prepare_cum(ctx, "CumProd", true)
}

fn prepare_cum(ctx: &PrepareCtx<'_>, name: &'static str, prod: bool) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let a = ctx.input(1)?;
    if !matches!(a.dtype, DType::I32 | DType::I64) || a.numel() != 1 {
        return Err(shape_err("CumSum/CumProd: axis must be one int32 or int64"));
    }
    if let Some(v) = a.value {
        util::axis_or_scalar(int_at(&v, 0)?, x.shape.len(), "axis")?;
    }
    let cfg = Cum {
        name,
        prod,
        exclusive: ctx.attr_int("exclusive", 0)? != 0,
        reverse: ctx.attr_int("reverse", 0)? != 0,
        shape: x.shape.to_vec(),
    };
    with_num!(x.dtype, name, cum_typed(cfg))
}

#[derive(Clone, Debug)]
struct Cum {
    name: &'static str,
    prod: bool,
    exclusive: bool,
    reverse: bool,
    shape: Vec<usize>,
}

fn cum_typed<T: Num>(c: Cum) -> Result<Prepared> {
    let shape = c.shape.clone();
    Ok(Prepared::single(
        T::DTYPE,
        &shape,
        // The axis does not change the shape, so it may be a run-time input.
        kernel(c.name, move |io: &mut KernelIo<'_>| {
            let a = int_at(&io.input(1)?, 0)?;
            let axis = util::axis_or_scalar(a, c.shape.len(), "axis")?;
            let (lead, rest) = c
                .shape
                .split_at_checked(axis)
                .ok_or(Error::internal("cum axis"))?;
            // A scalar (rank 0, axis 0) is one axis of length 1.
            let (dim, tail) = match rest.split_first() {
                Some((&d, t)) => (d, t),
                None => (1, rest),
            };
            let outer = checked_numel(lead)?;
            let inner = checked_numel(tail)?;
            let x = io.input_slice::<T>(0)?;
            let y = io.output_slice::<T>(0)?;
            let plane = dim.checked_mul(inner);
            let total = plane.and_then(|p| p.checked_mul(outer));
            if x.len() != y.len() || total != Some(x.len()) {
                return Err(Error::internal("cum length"));
            }
            let plane = plane.ok_or(Error::internal("cum length"))?;
            if plane == 0 {
                return Ok(());
            }
            // Per outer block (one plane) and inner position i, the `dim`
            // elements along the axis are every `inner`-th from i.
            for (xp, yp) in x.chunks_of(plane).zip(y.chunks_of_mut(plane)) {
                for i in 0..inner {
                    let mut acc = if c.prod { T::ONE } else { T::ZERO };
                    for k in 0..dim {
                        // k < dim, i < inner: j is below the plane's size,
                        // checked above.
                        let k = if c.reverse {
                            dim.wrapping_sub(1).wrapping_sub(k)
                        } else {
                            k
                        };
                        let j = k.wrapping_mul(inner).wrapping_add(i);
                        let (Some(o), Some(&v)) = (yp.get_mut(j), xp.get(j)) else {
                            return Err(Error::internal("cum index"));
                        };
                        let next = if c.prod { acc.mul(v) } else { acc.add(v) };
                        *o = if c.exclusive { acc } else { next };
                        acc = next;
                    }
                }
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------------------
// OneHot.

/// Input `i`, whose value sets an output shape: must be known at build time.
fn build_time_value<'a>(ctx: &PrepareCtx<'a>, i: usize) -> Result<TensorView<'a>> {
    ctx.input(i)?.value.ok_or(Error::new(ErrorKind::Unsupported(
        "input that sets a shape must be known at build time (constant or computed from shapes)",
    )))
}

fn prepare_one_hot(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let ix = ctx.input(0)?;
    let d = ctx.input(1)?;
    let v = ctx.input(2)?;
    if ix.dtype == DType::Bool || d.numel() != 1 {
        return Err(shape_err("OneHot: numeric indices and one depth value"));
    }
    // The depth sets the output shape: it must be known now.
    let depth = build_time_value(ctx, 1)?
        .f64_at(0)
        .ok_or(Error::internal("depth"))?;
    if !depth.is_finite() {
        return Err(shape_err("OneHot: depth not finite"));
    }
    let depth = depth as i64;
    if depth < 1 {
        return Err(shape_err("OneHot: depth below 1"));
    }
    if v.numel() != 2 {
        return Err(shape_err("OneHot: values must be [off, on]"));
    }
    // Saturating: a rank past usize::MAX fails check_rank all the same.
    let r = ix.shape.len().saturating_add(1);
    check_rank(r)?;
    let axis = util::axis(ctx.attr_int("axis", -1)?, r, "axis")?;
    let (lead, tail) = ix
        .shape
        .split_at_checked(axis)
        .ok_or(Error::internal("OneHot axis"))?;
    let mut out = lead.to_vec();
    out.push(depth as usize);
    out.extend_from_slice(tail);
    let outer = checked_numel(lead)?;
    let inner = checked_numel(tail)?;
    let es = v.dtype.size();
    // Index and output offsets are below the output's bytes (depth >= 1).
    checked_bytes(&out, es)?;
    let du = depth as usize;
    Ok(Prepared::single(
        v.dtype,
        &out,
        kernel("OneHot", move |io: &mut KernelIo<'_>| {
            let iv = io.input(0)?;
            let vals = io.input(2)?.bytes();
            let (off, on) = (
                vals.get(..es).ok_or(Error::internal("values"))?,
                vals.get(es..)
                    .and_then(|v| v.get(..es))
                    .ok_or(Error::internal("values"))?,
            );
            let mut y = io.output(0)?;
            let dst = y.bytes_mut();
            for c in dst.chunks_of_mut(es) {
                c.copy_from_slice(off);
            }
            // o < outer, i < inner and k < depth: every offset below is
            // below the output's bytes, checked in prepare.
            for o in 0..outer {
                for i in 0..inner {
                    // Float indices truncate, as in onnxruntime.
                    let f = iv
                        .f64_at(o.wrapping_mul(inner).wrapping_add(i))
                        .ok_or(Error::internal("index read"))?;
                    let mut k = f as i64;
                    if k < 0 {
                        // k < 0 < depth: the sum cannot overflow.
                        k = k.wrapping_add(depth);
                    }
                    // Out-of-range indices leave the row all off, per the spec.
                    if (0..depth).contains(&k) {
                        let p = o
                            .wrapping_mul(du)
                            .wrapping_add(k as usize)
                            .wrapping_mul(inner)
                            .wrapping_add(i);
                        copy_at(on, 0, dst, p.wrapping_mul(es), es)?;
                    }
                }
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------------------
// DepthToSpace, SpaceToDepth: a reshape to 6-D, a transpose, a reshape.

fn permute6(
    ctx: &PrepareCtx<'_>,
    name: &'static str,
    out: &[usize],
    tmp: [usize; 6],
    perm: [usize; 6],
) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let es = x.dtype.size();
    let mut st = [0usize; 6];
    let mut acc = 1usize;
    for (s, &t) in st.iter_mut().zip(&tmp).rev() {
        *s = acc;
        acc = acc.checked_mul(t).ok_or_else(overflow)?;
    }
    // `acc` is now the element count: offsets below its bytes are exact.
    acc.checked_mul(es).ok_or_else(overflow)?;
    let mut dims = [0usize; 6];
    let mut from = [0usize; 6];
    for ((d, f), &p) in dims.iter_mut().zip(&mut from).zip(&perm) {
        *d = *tmp.get(p).ok_or(Error::internal("permute6 perm"))?;
        *f = *st.get(p).ok_or(Error::internal("permute6 perm"))?;
    }
    let [n0, n1, n2, n3, n4, n5] = dims;
    let [f0, f1, f2, f3, f4, f5] = from;
    Ok(Prepared::single(
        x.dtype,
        out,
        kernel(name, move |io: &mut KernelIo<'_>| {
            let src = io.input(0)?.bytes();
            let mut y = io.output(0)?;
            let dst = y.bytes_mut();
            // The coordinates are below `tmp` (permuted) and p counts the
            // elements: offsets below the bytes checked in prepare.
            let mut p = 0usize;
            for a in 0..n0 {
                for b in 0..n1 {
                    for c in 0..n2 {
                        for d in 0..n3 {
                            let base = a
                                .wrapping_mul(f0)
                                .wrapping_add(b.wrapping_mul(f1))
                                .wrapping_add(c.wrapping_mul(f2))
                                .wrapping_add(d.wrapping_mul(f3));
                            for e in 0..n4 {
                                for f in 0..n5 {
                                    let s = base
                                        .wrapping_add(e.wrapping_mul(f4))
                                        .wrapping_add(f.wrapping_mul(f5));
                                    copy_at(src, s.wrapping_mul(es), dst, p.wrapping_mul(es), es)?;
                                    p = p.wrapping_add(1);
                                }
                            }
                        }
                    }
                }
            }
            Ok(())
        }),
    ))
}

fn block_and_mode(ctx: &PrepareCtx<'_>, mode_since: i64) -> Result<(usize, bool)> {
    let bs = ctx.attr_int("blocksize", 0)?;
    if bs < 1 {
        return Err(attr_err("blocksize", "must be positive"));
    }
    let mode = if ctx.opset >= mode_since {
        ctx.attr_str("mode", "DCR")?
    } else {
        "DCR"
    };
    let crd = match mode {
        "DCR" => false,
        "CRD" => true,
        _ => return Err(attr_err("mode", "not DCR or CRD")),
    };
    Ok((bs as usize, crd))
}

fn nchw(ctx: &PrepareCtx<'_>) -> Result<[usize; 4]> {
    match *ctx.input(0)?.shape {
        [n, c, h, w] => Ok([n, c, h, w]),
        _ => Err(shape_err("DepthToSpace/SpaceToDepth: input must be 4-D")),
    }
}

fn prepare_depth_to_space(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let [n, c, h, w] = nchw(ctx)?;
    let (bs, crd) = block_and_mode(ctx, 11)?;
    let bs2 = bs.checked_mul(bs).ok_or(Error::new(ErrorKind::Overflow))?;
    if !util::divides(c, bs2) {
        return Err(shape_err(
            "DepthToSpace: channels not divisible by blocksize^2",
        ));
    }
    let c2 = util::div(c, bs2, "DepthToSpace: block")?;
    let out = [
        n,
        c2,
        h.checked_mul(bs).ok_or_else(overflow)?,
        w.checked_mul(bs).ok_or_else(overflow)?,
    ];
    if crd {
        permute6(
            ctx,
            "DepthToSpace",
            &out,
            [n, c2, bs, bs, h, w],
            [0, 1, 4, 2, 5, 3],
        )
    } else {
        permute6(
            ctx,
            "DepthToSpace",
            &out,
            [n, bs, bs, c2, h, w],
            [0, 3, 4, 1, 5, 2],
        )
    }
}

fn prepare_space_to_depth(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let [n, c, h, w] = nchw(ctx)?;
    let (bs, crd) = block_and_mode(ctx, 28)?;
    if !util::divides(h, bs) || !util::divides(w, bs) {
        return Err(shape_err(
            "SpaceToDepth: spatial size not divisible by blocksize",
        ));
    }
    let (h2, w2) = (
        util::div(h, bs, "SpaceToDepth: block")?,
        util::div(w, bs, "SpaceToDepth: block")?,
    );
    let c2 = bs
        .checked_mul(bs)
        .and_then(|b2| c.checked_mul(b2))
        .ok_or_else(overflow)?;
    let out = [n, c2, h2, w2];
    let tmp = [n, c, h2, bs, w2, bs];
    let perm = if crd {
        [0, 1, 3, 5, 2, 4]
    } else {
        [0, 3, 5, 1, 2, 4]
    };
    permute6(ctx, "SpaceToDepth", &out, tmp, perm)
}

// ---------------------------------------------------------------------------
// ReverseSequence.

fn prepare_reverse_sequence(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let sl = ctx.input(1)?;
    util::dtype_in(
        sl.dtype,
        &[DType::I32, DType::I64],
        "ReverseSequence lengths",
    )?;
    let [d0, d1, ref rest @ ..] = *x.shape else {
        return Err(shape_err("ReverseSequence: rank below 2"));
    };
    let ba = ctx.attr_int("batch_axis", 1)?;
    let ta = ctx.attr_int("time_axis", 0)?;
    let batch_first = match (ba, ta) {
        (0, 1) => true,
        (1, 0) => false,
        _ => {
            return Err(attr_err(
                "batch_axis",
                "batch_axis and time_axis must be 0 and 1",
            ))
        }
    };
    let (nb, nt) = if batch_first { (d0, d1) } else { (d1, d0) };
    if sl.shape != [nb] {
        return Err(shape_err("ReverseSequence: sequence_lens must be [batch]"));
    }
    let block = checked_numel(rest)?
        .checked_mul(x.dtype.size())
        .ok_or_else(overflow)?;
    checked_bytes(x.shape, x.dtype.size())?;
    // b < nb, t < nt: the offset is below x's bytes, checked above.
    let at = move |b: usize, t: usize| {
        let (i, n, j) = if batch_first { (b, nt, t) } else { (t, nb, b) };
        i.wrapping_mul(n).wrapping_add(j).wrapping_mul(block)
    };
    Ok(Prepared::single(
        x.dtype,
        x.shape,
        // The lengths do not change the shape, so they may be run-time input.
        kernel("ReverseSequence", move |io: &mut KernelIo<'_>| {
            let src = io.input(0)?.bytes();
            let lens = io.input(1)?;
            let mut y = io.output(0)?;
            let dst = y.bytes_mut();
            for b in 0..nb {
                let len = int_at(&lens, b)?;
                if len < 0 || len as usize > nt {
                    return Err(shape_err("ReverseSequence: length out of range"));
                }
                let len = len as usize;
                for t in 0..nt {
                    // t < len: the difference is not negative.
                    let from = if t < len {
                        len.wrapping_sub(1).wrapping_sub(t)
                    } else {
                        t
                    };
                    copy_at(src, at(b, from), dst, at(b, t), block)?;
                }
            }
            Ok(())
        }),
    ))
}

// ---------------------------------------------------------------------------
// TopK.

#[derive(Clone, Copy, Debug)]
struct TopK {
    outer: usize,
    dim: usize,
    inner: usize,
    k: usize,
    largest: bool,
}

fn prepare_top_k(ctx: &PrepareCtx<'_>) -> Result<Prepared> {
    let x = ctx.input(0)?;
    let r = x.shape.len();
    if r == 0 {
        return Err(shape_err("TopK: scalar input"));
    }
    let axis = util::axis(ctx.attr_int("axis", -1)?, r, "axis")?;
    let k = if ctx.opset < 10 {
        ctx.attr_int("k", -1)?
    } else {
        // K sets the output shape: it must be known now.
        match ctx.const_ints(1)?.as_deref() {
            Some([k]) => *k,
            _ => return Err(shape_err("TopK: K must be one integer")),
        }
    };
    let bad = || Error::internal("TopK axis");
    let (lead, rest) = x.shape.split_at_checked(axis).ok_or_else(bad)?;
    let (&dim, tail) = rest.split_first().ok_or_else(bad)?;
    if k < 0 || k as usize > dim {
        return Err(shape_err("TopK: K out of range"));
    }
    if dim > u32::MAX as usize {
        return Err(Error::new(ErrorKind::Unsupported("TopK: axis too long")));
    }
    let largest = ctx.opset < 11 || ctx.attr_int("largest", 1)? != 0;
    // `sorted = 0` leaves the order free; sorted output is conformant.
    let mut out = x.shape.to_vec();
    *out.get_mut(axis).ok_or_else(bad)? = k as usize;
    let cfg = TopK {
        outer: checked_numel(lead)?,
        dim,
        inner: checked_numel(tail)?,
        k: k as usize,
        largest,
    };
    with_num!(x.dtype, "TopK", top_k_typed(&out, cfg))
}

/// Orders every row of `x` along the axis into `order` and calls
/// `emit(output element, source position on the axis)` for its first `k`.
fn top_k_rows<T: Num>(
    x: &[T],
    c: &TopK,
    order: &mut [u32],
    mut emit: impl FnMut(usize, usize) -> Result<()>,
) -> Result<()> {
    let (k, dim, inner) = (c.k, c.dim, c.inner);
    if k == 0 {
        return Ok(());
    }
    let len = c.outer.checked_mul(dim).and_then(|v| v.checked_mul(inner));
    if len != Some(x.len()) || order.len() != dim {
        return Err(Error::internal("TopK length"));
    }
    // Set if a comparison read outside `x`; the length check above rules
    // that out (positions are below `dim`, `i` below `inner`). The same
    // bounds (and j < k <= dim) keep the wrapping index operations below
    // x.len(): exact.
    let out_of_range = core::cell::Cell::new(false);
    for o in 0..c.outer {
        for i in 0..inner {
            let at = |s: usize| {
                o.wrapping_mul(dim)
                    .wrapping_add(s)
                    .wrapping_mul(inner)
                    .wrapping_add(i)
            };
            let val = |s: u32| x.get(at(s as usize));
            // Ties go to the lower index, as the reference's.
            let cmp = |a: &u32, b: &u32| {
                let (Some(va), Some(vb)) = (val(*a), val(*b)) else {
                    out_of_range.set(true);
                    return a.cmp(b);
                };
                let v = total_cmp(va, vb);
                let v = if c.largest { v.reverse() } else { v };
                v.then(a.cmp(b))
            };
            for (s, e) in order.iter_mut().enumerate() {
                *e = s as u32;
            }
            if k < dim {
                // k >= 1: k == 0 returned above.
                order.select_nth_unstable_by(k.wrapping_sub(1), cmp);
            }
            let top = order.get_mut(..k).ok_or(Error::internal("TopK k"))?;
            top.sort_unstable_by(cmp);
            if out_of_range.get() {
                return Err(Error::internal("TopK row"));
            }
            for (j, &s) in top.iter().enumerate() {
                let p = o
                    .wrapping_mul(k)
                    .wrapping_add(j)
                    .wrapping_mul(inner)
                    .wrapping_add(i);
                emit(p, s as usize)?;
            }
        }
    }
    Ok(())
}

fn scratch_u32(sc: &mut [u8], n: usize) -> Result<&mut [u32]> {
    bytemuck::try_cast_slice_mut::<u8, u32>(sc)
        .map_err(|_| Error::internal("TopK scratch"))?
        .get_mut(..n)
        .ok_or(Error::internal("TopK scratch"))
}

fn top_k_typed<T: Num>(out: &[usize], c: TopK) -> Result<Prepared> {
    let outputs = alloc::vec![
        OutputInfo::new(T::DTYPE, out),
        OutputInfo::new(DType::I64, out),
    ];
    let scratch = c
        .dim
        .checked_mul(core::mem::size_of::<u32>())
        .ok_or_else(overflow)?;
    // Output element p is (o, j, i) of [outer, k, inner]; k <= dim.
    checked_numel(&[c.outer, c.dim, c.inner])?;
    let row = nonzero(c.k.checked_mul(c.inner).ok_or_else(overflow)?);
    let lanes = nonzero(c.inner);
    Ok(Prepared::new(
        outputs,
        kernel("TopK", move |io: &mut KernelIo<'_>| {
            let x = io.input_slice::<T>(0)?;
            let (dim, inner) = (c.dim, c.inner);
            let src = |p: usize, s: usize| {
                let (o, i) = (p / row, p % lanes);
                // o < outer, s < dim, i < inner: the index is below
                // outer·dim·inner, checked in prepare, so exact.
                if o >= c.outer || s >= dim {
                    return Err(Error::internal("TopK index"));
                }
                let at = o.wrapping_mul(dim).wrapping_add(s).wrapping_mul(inner);
                x.get(at.wrapping_add(i))
                    .copied()
                    .ok_or(Error::internal("TopK index"))
            };
            if !io.has_output(1) {
                // Values only: no indices output to stage the order in.
                let (mut yv, sc) = io.output_and_scratch(0)?;
                let yv = yv.as_slice_mut::<T>()?;
                return top_k_rows(x, &c, scratch_u32(sc, dim)?, |p, s| {
                    *yv.get_mut(p).ok_or(Error::internal("TopK out"))? = src(p, s)?;
                    Ok(())
                });
            }
            {
                let (mut yi, sc) = io.output_and_scratch(1)?;
                let yi = yi.as_slice_mut::<i64>()?;
                top_k_rows(x, &c, scratch_u32(sc, dim)?, |p, s| {
                    *yi.get_mut(p).ok_or(Error::internal("TopK out"))? = s as i64;
                    Ok(())
                })?;
            }
            if io.has_output(0) {
                // Output and scratch cannot be held with a second output:
                // the values follow from the indices just written.
                let (mut yv, yi) = io.outputs2(0, 1)?;
                let yv = yv.as_slice_mut::<T>()?;
                let yi = yi.view();
                for (p, (v, &s)) in yv.iter_mut().zip(yi.as_slice::<i64>()?).enumerate() {
                    *v = src(p, s as usize)?;
                }
            }
            Ok(())
        }),
    )
    .with_scratch(scratch))
}

#[cfg(test)]
#[allow(clippy::cloned_ref_to_slice_refs)]
mod tests {
    use crate::model::{AttrValue, Const};
    use crate::ops::testing::{run, t, vals};
    use alloc::vec;
    use alloc::vec::Vec;

    fn seq(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32).collect()
    }
    fn i64s(shape: &[usize], v: &[i64]) -> Option<Const> {
        t::<i64>(shape, v)
    }
    fn int(v: i64) -> AttrValue {
        AttrValue::Int(v)
    }
    fn s(v: &str) -> AttrValue {
        AttrValue::Str(v.as_bytes().to_vec())
    }

    #[test]
    fn gather_elements_axes_and_negative() {
        // The spec's examples.
        let x = t(&[2, 2], &[1f32, 2., 3., 4.]);
        let r = run(
            "GatherElements",
            13,
            vec![("axis", int(1))],
            &[x.clone(), i64s(&[2, 2], &[0, 0, 1, 0])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![1., 1., 4., 3.]);
        let x = t(&[3, 3], &[1i32, 2, 3, 4, 5, 6, 7, 8, 9]);
        let r = run(
            "GatherElements",
            13,
            vec![],
            &[x.clone(), t::<i32>(&[2, 3], &[-1, -2, 0, -2, 0, 0])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 3]);
        assert_eq!(vals::<i32>(&r[0]), vec![7, 5, 3, 4, 2, 3]);
        assert!(run("GatherElements", 13, vec![], &[x, i64s(&[1, 1], &[3])], 1).is_err());
    }

    #[test]
    fn gather_nd_plain_and_batched() {
        let x = t(&[2, 2], &[0i32, 1, 2, 3]);
        let r = run(
            "GatherND",
            13,
            vec![],
            &[x.clone(), i64s(&[2, 2], &[0, 0, 1, 1])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![0, 3]);
        let r = run("GatherND", 13, vec![], &[x, i64s(&[2, 1], &[1, 0])], 1).unwrap();
        assert_eq!(r[0].shape, vec![2, 2]);
        assert_eq!(vals::<i32>(&r[0]), vec![2, 3, 0, 1]);
        // batch_dims = 1: batch 0 takes row 1, batch 1 takes row 0.
        let x = t(&[2, 2, 2], &seq(8));
        let r = run(
            "GatherND",
            13,
            vec![("batch_dims", int(1))],
            &[x.clone(), i64s(&[2, 1], &[1, 0])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 2]);
        assert_eq!(vals::<f32>(&r[0]), vec![2., 3., 4., 5.]);
        assert!(run("GatherND", 13, vec![], &[x, i64s(&[1, 1], &[2])], 1).is_err());
    }

    #[test]
    fn scatter_elements_reductions() {
        let x = t(&[1, 5], &[1f32, 2., 3., 4., 5.]);
        let ix = i64s(&[1, 2], &[1, -2]);
        let up = t(&[1, 2], &[1.1f32, 2.1]);
        let go = |red: &str| {
            let r = run(
                "ScatterElements",
                18,
                vec![("axis", int(1)), ("reduction", s(red))],
                &[x.clone(), ix.clone(), up.clone()],
                1,
            )
            .unwrap();
            vals::<f32>(&r[0])
        };
        assert_eq!(go("none"), vec![1., 1.1, 3., 2.1, 5.]);
        assert_eq!(go("add"), vec![1., 3.1, 3., 6.1, 5.]);
        assert_eq!(go("mul"), vec![1., 2. * 1.1, 3., 4. * 2.1, 5.]);
        assert_eq!(go("max"), vec![1., 2., 3., 4., 5.]);
        assert_eq!(go("min"), vec![1., 1.1, 3., 2.1, 5.]);
        // Duplicate indices accumulate in order.
        let r = run(
            "ScatterElements",
            18,
            vec![("axis", int(1)), ("reduction", s("add"))],
            &[x.clone(), i64s(&[1, 2], &[1, 1]), up.clone()],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![1., 2. + 1.1 + 2.1, 3., 4., 5.]);
        // The opset 9 Scatter, axis 0, on a bool tensor (bytes only).
        let b = t(&[2, 2], &[0u8, 0, 0, 0]);
        let mut bb = b.unwrap();
        bb.dtype = crate::DType::Bool;
        let mut ub = t(&[1, 2], &[1u8, 1]).unwrap();
        ub.dtype = crate::DType::Bool;
        let r = run(
            "Scatter",
            9,
            vec![],
            &[Some(bb), i64s(&[1, 2], &[1, 0]), Some(ub)],
            1,
        )
        .unwrap();
        assert_eq!(r[0].data.bytes(), &[0, 1, 1, 0]);
        assert!(run(
            "ScatterElements",
            18,
            vec![],
            &[x, i64s(&[1, 2], &[2, 0]), up],
            1
        )
        .is_err());
    }

    #[test]
    fn scatter_nd_slices_and_reduce() {
        // The spec's example 1.
        let x = t(&[8], &[1f32, 2., 3., 4., 5., 6., 7., 8.]);
        let r = run(
            "ScatterND",
            18,
            vec![],
            &[
                x.clone(),
                i64s(&[4, 1], &[4, 3, 1, 7]),
                t(&[4], &[9f32, 10., 11., 12.]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![1., 11., 3., 10., 9., 6., 7., 12.]);
        // Row slices, with a duplicate under multiply.
        let x = t(&[2, 2], &[1i64, 2, 3, 4]);
        let r = run(
            "ScatterND",
            18,
            vec![("reduction", s("mul"))],
            &[
                x.clone(),
                i64s(&[2, 1], &[1, -1]),
                t(&[2, 2], &[2i64, 3, 5, 7]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![1, 2, 30, 84]);
        assert!(run(
            "ScatterND",
            18,
            vec![],
            &[x, i64s(&[1, 1], &[2]), t(&[1, 2], &[0i64, 0])],
            1
        )
        .is_err());
    }

    #[test]
    fn tensor_scatter_linear_and_circular() {
        // Cache [2, 4, 1]; batch 0 writes 2 rows at 1, batch 1 at 3.
        let x = t(&[2, 4, 1], &[0f32; 8]);
        let u = t(&[2, 2, 1], &[1f32, 2., 3., 4.]);
        let w = i64s(&[2], &[1, 3]);
        let go = |mode: &str| {
            run(
                "TensorScatter",
                24,
                vec![("mode", s(mode))],
                &[x.clone(), u.clone(), w.clone()],
                1,
            )
        };
        let r = go("circular").unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![0., 1., 2., 0., 4., 0., 0., 3.]);
        // Linear mode may not run past the end.
        assert!(go("linear").is_err());
        let r = run("TensorScatter", 24, vec![], &[x.clone(), u.clone()], 1).unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![1., 2., 0., 0., 3., 4., 0., 0.]);
    }

    #[test]
    fn trilu_upper_lower_with_k() {
        let x = t(&[3, 4], &seq(12));
        let go = |upper: i64, k: Option<i64>| {
            let mut ins = vec![x.clone()];
            if let Some(k) = k {
                ins.push(i64s(&[], &[k]));
            }
            let r = run("Trilu", 14, vec![("upper", int(upper))], &ins, 1).unwrap();
            vals::<f32>(&r[0])
        };
        #[rustfmt::skip]
        assert_eq!(go(1, None), vec![0., 1., 2., 3., 0., 5., 6., 7., 0., 0., 10., 11.]);
        #[rustfmt::skip]
        assert_eq!(go(1, Some(-1)), vec![0., 1., 2., 3., 4., 5., 6., 7., 0., 9., 10., 11.]);
        #[rustfmt::skip]
        assert_eq!(go(0, None), vec![0., 0., 0., 0., 4., 5., 0., 0., 8., 9., 10., 0.]);
        #[rustfmt::skip]
        assert_eq!(go(0, Some(1)), vec![0., 1., 0., 0., 4., 5., 6., 0., 8., 9., 10., 11.]);
        assert_eq!(go(0, Some(-7)), vec![0.; 12]);
        assert_eq!(go(1, Some(9)), vec![0.; 12]);
    }

    #[test]
    fn eye_like_offsets_and_dtype() {
        let x = t(&[3, 4], &[0i32; 12]);
        let r = run("EyeLike", 9, vec![("k", int(1))], &[x.clone()], 1).unwrap();
        assert_eq!(vals::<i32>(&r[0]), vec![0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]);
        let r = run(
            "EyeLike",
            9,
            vec![("dtype", int(11)), ("k", int(-2))],
            &[x],
            1,
        )
        .unwrap();
        assert_eq!(
            vals::<f64>(&r[0]),
            vec![0., 0., 0., 0., 0., 0., 0., 0., 1., 0., 0., 0.]
        );
    }

    #[test]
    fn cumsum_modes_and_cumprod() {
        let x = t(&[5], &[1f32, 2., 3., 4., 5.]);
        let go = |op: &str, ex: i64, rev: i64| {
            let r = run(
                op,
                26,
                vec![("exclusive", int(ex)), ("reverse", int(rev))],
                &[x.clone(), t::<i32>(&[], &[0])],
                1,
            )
            .unwrap();
            vals::<f32>(&r[0])
        };
        assert_eq!(go("CumSum", 0, 0), vec![1., 3., 6., 10., 15.]);
        assert_eq!(go("CumSum", 1, 0), vec![0., 1., 3., 6., 10.]);
        assert_eq!(go("CumSum", 0, 1), vec![15., 14., 12., 9., 5.]);
        assert_eq!(go("CumSum", 1, 1), vec![14., 12., 9., 5., 0.]);
        assert_eq!(go("CumProd", 0, 0), vec![1., 2., 6., 24., 120.]);
        assert_eq!(go("CumProd", 1, 1), vec![120., 60., 20., 5., 1.]);
        // Axis -1 of a 2-D int tensor.
        let r = run(
            "CumSum",
            14,
            vec![],
            &[t(&[2, 3], &[1i64, 2, 3, 4, 5, 6]), i64s(&[], &[-1])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<i64>(&r[0]), vec![1, 3, 6, 4, 9, 15]);
        let r = run(
            "CumSum",
            14,
            vec![],
            &[t(&[2, 3], &[1i64, 2, 3, 4, 5, 6]), i64s(&[], &[2])],
            1,
        );
        assert!(r.is_err());
    }

    #[test]
    fn one_hot_axis_and_negative() {
        let r = run(
            "OneHot",
            11,
            vec![],
            &[
                i64s(&[3], &[0, -1, 5]),
                t(&[], &[3f32]),
                t(&[2], &[-1f32, 2.]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![3, 3]);
        // 5 is out of range: a row of off values.
        assert_eq!(
            vals::<f32>(&r[0]),
            vec![2., -1., -1., -1., -1., 2., -1., -1., -1.]
        );
        let r = run(
            "OneHot",
            11,
            vec![("axis", int(0))],
            &[t(&[2], &[1f32, 0.]), i64s(&[1], &[2]), t(&[2], &[0i32, 7])],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![2, 2]);
        assert_eq!(vals::<i32>(&r[0]), vec![0, 7, 7, 0]);
    }

    #[test]
    fn depth_space_round_trip() {
        // DCR: output (0, 0, 0, 1) reads channel 1 of block (0, 1).
        let x = t(&[1, 4, 1, 1], &[0f32, 1., 2., 3.]);
        let r = run(
            "DepthToSpace",
            13,
            vec![("blocksize", int(2))],
            &[x.clone()],
            1,
        )
        .unwrap();
        assert_eq!(r[0].shape, vec![1, 1, 2, 2]);
        assert_eq!(vals::<f32>(&r[0]), vec![0., 1., 2., 3.]);
        // CRD vs DCR differ once there are 2 output channels.
        let x = t(&[1, 8, 1, 1], &seq(8));
        let dcr = run(
            "DepthToSpace",
            13,
            vec![("blocksize", int(2))],
            &[x.clone()],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&dcr[0]), vec![0., 2., 4., 6., 1., 3., 5., 7.]);
        let crd = run(
            "DepthToSpace",
            13,
            vec![("blocksize", int(2)), ("mode", s("CRD"))],
            &[x.clone()],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&crd[0]), seq(8));
        // SpaceToDepth (DCR) inverts DepthToSpace (DCR).
        let back = run(
            "SpaceToDepth",
            13,
            vec![("blocksize", int(2))],
            &[Some(dcr[0].clone())],
            1,
        )
        .unwrap();
        assert_eq!(back[0].shape, vec![1, 8, 1, 1]);
        assert_eq!(vals::<f32>(&back[0]), seq(8));
        let back = run(
            "SpaceToDepth",
            28,
            vec![("blocksize", int(2)), ("mode", s("CRD"))],
            &[Some(crd[0].clone())],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&back[0]), seq(8));
    }

    #[test]
    fn reverse_sequence_both_layouts() {
        // time-major [4, 2]: batch 0 reverses 4 steps, batch 1 reverses 2.
        let x = t(&[4, 2], &seq(8));
        let r = run(
            "ReverseSequence",
            10,
            vec![],
            &[x.clone(), i64s(&[2], &[4, 2])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![6., 3., 4., 1., 2., 5., 0., 7.]);
        let r = run(
            "ReverseSequence",
            10,
            vec![("batch_axis", int(0)), ("time_axis", int(1))],
            &[t(&[2, 4], &seq(8)), i64s(&[2], &[1, 3])],
            1,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![0., 1., 2., 3., 6., 5., 4., 7.]);
        assert!(run("ReverseSequence", 10, vec![], &[x, i64s(&[2], &[5, 0])], 1).is_err());
    }

    #[test]
    fn top_k_largest_smallest_ties() {
        let x = t(&[2, 4], &[1f32, 3., 3., 2., 0., -1., 5., 5.]);
        let r = run("TopK", 11, vec![], &[x.clone(), i64s(&[1], &[2])], 2).unwrap();
        assert_eq!(r[0].shape, vec![2, 2]);
        assert_eq!(vals::<f32>(&r[0]), vec![3., 3., 5., 5.]);
        assert_eq!(vals::<i64>(&r[1]), vec![1, 2, 2, 3]);
        let r = run(
            "TopK",
            11,
            vec![("largest", int(0)), ("axis", int(0))],
            &[x.clone(), i64s(&[1], &[1])],
            2,
        )
        .unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![0., -1., 3., 2.]);
        assert_eq!(vals::<i64>(&r[1]), vec![1, 1, 0, 0]);
        let r = run(
            "TopK",
            1,
            vec![("k", int(3))],
            &[t(&[4], &[2u64, 9, 2, u64::MAX])],
            2,
        )
        .unwrap();
        assert_eq!(vals::<u64>(&r[0]), vec![u64::MAX, 9, 2]);
        assert_eq!(vals::<i64>(&r[1]), vec![3, 1, 0]);
        // Values only (no indices output).
        let r = run("TopK", 11, vec![], &[x.clone(), i64s(&[1], &[3])], 1).unwrap();
        assert_eq!(vals::<f32>(&r[0]), vec![3., 3., 2., 5., 5., 0.]);
        assert!(run("TopK", 11, vec![], &[x, i64s(&[1], &[5])], 2).is_err());
    }
}
