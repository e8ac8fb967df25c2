//! Tensor views over borrowed bytes: dtype + shape + contiguous row-major data.
//!
//! mote never owns tensor memory at run time: activations live in the
//! caller's arena and weights in the model, so tensors here are views.

use crate::error::{Error, ErrorKind, Result};
use crate::{DType, Element};

/// Maximum rank of any tensor mote handles (ONNX has no limit; models in the
/// field stay far below it). Lets kernels keep index state on the stack.
pub const MAX_RANK: usize = 8;

/// Row-major (C order) strides, in elements, of a shape. Returns `None` if
/// the rank exceeds [`MAX_RANK`].
pub fn strides(shape: &[usize]) -> Option<[usize; MAX_RANK]> {
    if shape.len() > MAX_RANK {
        return None;
    }
    let mut s = [0usize; MAX_RANK];
    let mut acc = 1usize;
    for (i, &d) in shape.iter().enumerate().rev() {
        *s.get_mut(i)? = acc;
        acc = acc.saturating_mul(d);
    }
    Some(s)
}

/// A read-only tensor: dtype, shape and `numel * dtype.size()` bytes.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    dtype: DType,
    shape: &'a [usize],
    data: &'a [u8],
}

fn cast<T: Element>(dtype: DType, data: &[u8]) -> Result<&[T]> {
    let ok = dtype == T::DTYPE || (dtype == DType::Bool && T::DTYPE == DType::U8);
    if !ok {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: T::DTYPE,
            got: dtype,
        }));
    }
    bytemuck::try_cast_slice(data)
        .map_err(|_| Error::new(ErrorKind::Internal("misaligned tensor data")))
}

fn cast_mut<T: Element>(dtype: DType, data: &mut [u8]) -> Result<&mut [T]> {
    let ok = dtype == T::DTYPE || (dtype == DType::Bool && T::DTYPE == DType::U8);
    if !ok {
        return Err(Error::new(ErrorKind::DTypeMismatch {
            expected: T::DTYPE,
            got: dtype,
        }));
    }
    bytemuck::try_cast_slice_mut(data)
        .map_err(|_| Error::new(ErrorKind::Internal("misaligned tensor data")))
}

impl<'a> TensorView<'a> {
    /// A view over raw little-endian bytes; checks the length against the shape.
    pub fn from_bytes(dtype: DType, shape: &'a [usize], data: &'a [u8]) -> Result<Self> {
        let n = crate::error::checked_numel(shape)?;
        let bytes = n
            .checked_mul(dtype.size())
            .ok_or(Error::new(ErrorKind::Overflow))?;
        if bytes != data.len() {
            return Err(Error::new(ErrorKind::Len {
                expected: bytes as u64,
                got: data.len() as u64,
            }));
        }
        Ok(TensorView { dtype, shape, data })
    }
    /// A view whose length the caller has checked.
    #[cfg_attr(not(feature = "alloc"), allow(dead_code))]
    pub(crate) fn from_parts(dtype: DType, shape: &'a [usize], data: &'a [u8]) -> Self {
        TensorView { dtype, shape, data }
    }
    /// A view over a typed slice; checks the length against the shape.
    pub fn new<T: Element>(shape: &'a [usize], data: &'a [T]) -> Result<Self> {
        Self::from_bytes(T::DTYPE, shape, bytemuck::cast_slice(data))
    }
    /// A bool view over bytes that are 0 or 1.
    pub fn new_bool(shape: &'a [usize], data: &'a [u8]) -> Result<Self> {
        Self::from_bytes(DType::Bool, shape, data)
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Dimensions.
    pub fn shape(&self) -> &'a [usize] {
        self.shape
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len().checked_div(self.dtype.size()).unwrap_or(0)
    }
    /// Raw bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }
    /// Typed elements; `Err` if `T` is not the dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T]> {
        cast(self.dtype, self.data)
    }
    /// `f32` elements.
    pub fn f32(&self) -> Result<&'a [f32]> {
        self.as_slice()
    }
    /// Reads an integer tensor (any int width) as i64 values, one by one.
    pub fn int_at(&self, i: usize) -> Option<i64> {
        let s = self.dtype.size();
        let b = self
            .data
            .get(i.checked_mul(s)?..i.checked_add(1)?.checked_mul(s)?)?;
        Some(match self.dtype {
            DType::I8 => i8::from_le_bytes(b.try_into().ok()?) as i64,
            DType::U8 | DType::Bool => u8::from_le_bytes(b.try_into().ok()?) as i64,
            DType::I16 => i16::from_le_bytes(b.try_into().ok()?) as i64,
            DType::U16 => u16::from_le_bytes(b.try_into().ok()?) as i64,
            DType::I32 => i32::from_le_bytes(b.try_into().ok()?) as i64,
            DType::U32 => u32::from_le_bytes(b.try_into().ok()?) as i64,
            DType::I64 | DType::U64 => i64::from_le_bytes(b.try_into().ok()?),
            _ => return None,
        })
    }
    /// Reads element `i` of any numeric dtype as f64.
    pub fn f64_at(&self, i: usize) -> Option<f64> {
        let s = self.dtype.size();
        let b = self
            .data
            .get(i.checked_mul(s)?..i.checked_add(1)?.checked_mul(s)?)?;
        Some(match self.dtype {
            DType::F32 => f32::from_le_bytes(b.try_into().ok()?) as f64,
            DType::F64 => f64::from_le_bytes(b.try_into().ok()?),
            DType::F16 => half::f16::from_le_bytes(b.try_into().ok()?).to_f64(),
            DType::BF16 => half::bf16::from_le_bytes(b.try_into().ok()?).to_f64(),
            DType::U64 => u64::from_le_bytes(b.try_into().ok()?) as f64,
            _ => self.int_at(i)? as f64,
        })
    }
}

/// A mutable tensor: dtype, shape and its bytes.
#[derive(Debug)]
pub struct TensorMut<'a> {
    dtype: DType,
    shape: &'a [usize],
    data: &'a mut [u8],
}

impl<'a> TensorMut<'a> {
    /// A mutable view over raw bytes; checks the length against the shape.
    pub fn from_bytes(dtype: DType, shape: &'a [usize], data: &'a mut [u8]) -> Result<Self> {
        let n = crate::error::checked_numel(shape)?;
        let bytes = n
            .checked_mul(dtype.size())
            .ok_or(Error::new(ErrorKind::Overflow))?;
        if bytes != data.len() {
            return Err(Error::new(ErrorKind::Len {
                expected: bytes as u64,
                got: data.len() as u64,
            }));
        }
        Ok(TensorMut { dtype, shape, data })
    }
    /// A mutable view whose length the caller has checked.
    #[cfg_attr(not(feature = "alloc"), allow(dead_code))]
    pub(crate) fn from_parts(dtype: DType, shape: &'a [usize], data: &'a mut [u8]) -> Self {
        TensorMut { dtype, shape, data }
    }
    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Dimensions.
    pub fn shape(&self) -> &'a [usize] {
        self.shape
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len().checked_div(self.dtype.size()).unwrap_or(0)
    }
    /// Raw bytes.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.data
    }
    /// Consumes the view into its raw bytes.
    pub fn into_bytes(self) -> &'a mut [u8] {
        self.data
    }
    /// Typed elements; `Err` if `T` is not the dtype.
    pub fn as_slice_mut<T: Element>(&mut self) -> Result<&mut [T]> {
        cast_mut(self.dtype, self.data)
    }
    /// Consumes the view into typed elements.
    pub fn into_slice<T: Element>(self) -> Result<&'a mut [T]> {
        cast_mut(self.dtype, self.data)
    }
    /// `f32` elements.
    pub fn f32(self) -> Result<&'a mut [f32]> {
        self.into_slice()
    }
    /// A read-only view of the same data.
    pub fn view(&self) -> TensorView<'_> {
        TensorView {
            dtype: self.dtype,
            shape: self.shape,
            data: self.data,
        }
    }
}

/// Numpy (multidirectional) broadcast of two shapes into `out`; returns the
/// output rank. `Err` if incompatible or rank > [`MAX_RANK`].
pub fn broadcast_shapes(a: &[usize], b: &[usize], out: &mut [usize; MAX_RANK]) -> Result<usize> {
    let r = a.len().max(b.len());
    if r > MAX_RANK {
        return Err(Error::new(ErrorKind::Unsupported("rank above 8")));
    }
    // Right-aligned: the shorter shape is padded with leading 1s.
    fn padded(s: &[usize], r: usize) -> impl Iterator<Item = usize> + '_ {
        core::iter::repeat_n(1, r.saturating_sub(s.len())).chain(s.iter().copied())
    }
    for ((o, da), db) in out.iter_mut().zip(padded(a, r)).zip(padded(b, r)) {
        *o = if da == db {
            da
        } else if da == 1 {
            db
        } else if db == 1 {
            da
        } else {
            return Err(Error::new(ErrorKind::Shape("shapes do not broadcast")));
        };
    }
    Ok(r)
}

/// `dst.copy_from_slice(src)`, an `Err` (not a panic) when the lengths
/// differ.
#[cfg(feature = "alloc")]
#[inline]
pub(crate) fn copy_exact<T: Copy>(dst: &mut [T], src: &[T]) -> Result<()> {
    if dst.len() != src.len() {
        return Err(Error::new(ErrorKind::Internal(
            "copy between unequal lengths",
        )));
    }
    dst.copy_from_slice(src);
    Ok(())
}

/// `chunks_exact` / `chunks_exact_mut` that yield no chunk for a chunk size
/// of 0 instead of panicking. A zero chunk size only comes with an empty
/// slice in a consistent layout, so no chunk is the right answer; and the
/// standard methods' `assert!(size != 0)` is a panic path the optimizer
/// keeps whenever it cannot see the size (see `boards/onnx-an386/panic-sites.sh`).
#[cfg(feature = "alloc")]
pub(crate) trait ChunksOf<T> {
    /// [`slice::chunks_exact`], none for `n == 0`.
    fn chunks_of(&self, n: usize) -> core::slice::ChunksExact<'_, T>;
    /// [`slice::chunks_exact_mut`], none for `n == 0`.
    fn chunks_of_mut(&mut self, n: usize) -> core::slice::ChunksExactMut<'_, T>;
}

#[cfg(feature = "alloc")]
impl<T> ChunksOf<T> for [T] {
    #[inline]
    fn chunks_of(&self, n: usize) -> core::slice::ChunksExact<'_, T> {
        match core::num::NonZeroUsize::new(n) {
            Some(n) => self.chunks_exact(n.get()),
            None => <&[T]>::default().chunks_exact(1),
        }
    }
    #[inline]
    fn chunks_of_mut(&mut self, n: usize) -> core::slice::ChunksExactMut<'_, T> {
        match core::num::NonZeroUsize::new(n) {
            Some(n) => self.chunks_exact_mut(n.get()),
            None => <&mut [T]>::default().chunks_exact_mut(1),
        }
    }
}

/// Strides (in elements) that read an input of shape `shape` as if
/// broadcast to `out_shape`: broadcast axes get stride 0.
pub fn broadcast_strides(shape: &[usize], out_shape: &[usize]) -> [usize; MAX_RANK] {
    let mut s = [0usize; MAX_RANK];
    let r = out_shape.len().min(MAX_RANK);
    let off = r.saturating_sub(shape.len());
    let mut acc = 1usize;
    for (i, &d) in shape.iter().enumerate().rev() {
        if let Some(si) = s.get_mut(i.saturating_add(off)) {
            *si = if d == 1 { 0 } else { acc };
        }
        acc = acc.saturating_mul(d);
    }
    s
}

/// Iterates a multi-index over `shape` in row-major order, tracking linear
/// offsets into up to `N` operands with their own strides. No allocation.
#[derive(Debug)]
pub struct StridedIter<const N: usize> {
    shape: [usize; MAX_RANK],
    /// Per axis, the stride of each operand.
    strides: [[usize; N]; MAX_RANK],
    rank: usize,
    idx: [usize; MAX_RANK],
    offs: [usize; N],
    remaining: usize,
}

impl<const N: usize> StridedIter<N> {
    /// Starts at index 0 of `shape` (rank ≤ [`MAX_RANK`]).
    pub fn new(shape: &[usize], strides: [[usize; MAX_RANK]; N]) -> Self {
        let rank = shape.len().min(MAX_RANK);
        let mut sh = [1usize; MAX_RANK];
        for (d, &s) in sh.iter_mut().zip(shape) {
            *d = s;
        }
        let remaining = sh
            .iter()
            .take(rank)
            .fold(1usize, |a, &d| a.saturating_mul(d));
        let mut by_axis = [[0usize; N]; MAX_RANK];
        for (k, operand) in strides.iter().enumerate() {
            for (axis, &st) in by_axis.iter_mut().zip(operand) {
                if let Some(a) = axis.get_mut(k) {
                    *a = st;
                }
            }
        }
        StridedIter {
            shape: sh,
            strides: by_axis,
            rank,
            idx: [0; MAX_RANK],
            offs: [0; N],
            remaining,
        }
    }
}

impl<const N: usize> Iterator for StridedIter<N> {
    type Item = [usize; N];
    #[inline]
    fn next(&mut self) -> Option<[usize; N]> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining = self.remaining.saturating_sub(1);
        let cur = self.offs;
        // Advance the odometer, last axis first.
        let axes = self
            .idx
            .iter_mut()
            .zip(&self.shape)
            .zip(&self.strides)
            .take(self.rank)
            .rev();
        for ((i, &n), st) in axes {
            // `*i < n` held before this step, so this cannot saturate.
            *i = i.saturating_add(1);
            for (o, &s) in self.offs.iter_mut().zip(st) {
                *o = o.wrapping_add(s);
            }
            if *i < n {
                break;
            }
            for (o, &s) in self.offs.iter_mut().zip(st) {
                *o = o.wrapping_sub(s.wrapping_mul(n));
            }
            *i = 0;
        }
        Some(cur)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    #[test]
    fn broadcast_and_iter() {
        let mut out = [0; MAX_RANK];
        let r = broadcast_shapes(&[2, 1, 3], &[4, 1], &mut out).unwrap();
        assert_eq!(&out[..r], &[2, 4, 3]);
        let sa = broadcast_strides(&[2, 1, 3], &out[..r]);
        let sb = broadcast_strides(&[4, 1], &out[..r]);
        let v: Vec<[usize; 2]> = StridedIter::new(&out[..r], [sa, sb]).collect();
        assert_eq!(v.len(), 24);
        assert_eq!(v[0], [0, 0]);
        assert_eq!(v[1], [1, 0]);
        assert_eq!(v[3], [0, 1]);
        assert_eq!(v[12], [3, 0]);
        assert!(broadcast_shapes(&[2], &[3], &mut out).is_err());
    }

    #[test]
    fn view_checks_len_and_dtype() {
        let d = [1.0f32, 2.0];
        assert!(TensorView::new(&[3], &d).is_err());
        let v = TensorView::new(&[2], &d).unwrap();
        assert!(v.as_slice::<i32>().is_err());
        assert_eq!(v.f32().unwrap(), &d);
    }
}
