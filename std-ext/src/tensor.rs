//! Owned tensors.

use mote_core::{DType, Element, TensorView};

use crate::error::{Error, Result};

/// An owned tensor: dtype, shape and little-endian element bytes.
///
/// The bytes are kept 8-byte aligned, so [`Tensor::view`] can be read as a
/// typed slice of any dtype (`view().f32()`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<usize>,
    words: Vec<u64>,
    len: usize,
}

fn numel(shape: &[usize]) -> Result<usize> {
    mote_core::checked_numel(shape)
        .map_err(|e| Error::Input(format!("shape {}: {e}", fmt_shape(shape))))
}

/// `[1,3,224,224]`.
pub fn fmt_shape(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(","))
}

impl Tensor {
    /// A tensor from raw little-endian bytes; checks the length against the shape.
    pub fn from_bytes(dtype: DType, shape: &[usize], data: &[u8]) -> Result<Self> {
        let n = numel(shape)?;
        let want = n
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::Input(format!("shape {} too large", fmt_shape(shape))))?;
        if want != data.len() {
            return Err(Error::Input(format!(
                "{dtype} {}: expected {want} bytes, got {}",
                fmt_shape(shape),
                data.len()
            )));
        }
        let mut words = vec![0u64; data.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..data.len()].copy_from_slice(data);
        Ok(Tensor {
            dtype,
            shape: shape.to_vec(),
            words,
            len: data.len(),
        })
    }

    /// A tensor from typed values (`f32`, `i64`, `half::f16`, ...).
    pub fn from_slice<T: Element>(shape: &[usize], data: &[T]) -> Result<Self> {
        Self::from_bytes(T::DTYPE, shape, bytemuck::cast_slice(data))
    }

    /// A tensor from a vector of typed values.
    pub fn from_vec<T: Element>(shape: &[usize], data: Vec<T>) -> Result<Self> {
        Self::from_slice(shape, &data)
    }

    /// An `f32` tensor.
    pub fn from_f32(shape: &[usize], data: Vec<f32>) -> Result<Self> {
        Self::from_slice(shape, &data)
    }

    /// A `bool` tensor.
    pub fn from_bools(shape: &[usize], data: &[bool]) -> Result<Self> {
        let b: Vec<u8> = data.iter().map(|&x| x as u8).collect();
        Self::from_bytes(DType::Bool, shape, &b)
    }

    /// A zero-filled tensor.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Result<Self> {
        let n = numel(shape)?;
        let len = n
            .checked_mul(dtype.size())
            .ok_or_else(|| Error::Input(format!("shape {} too large", fmt_shape(shape))))?;
        Ok(Tensor {
            dtype,
            shape: shape.to_vec(),
            words: vec![0u64; len.div_ceil(8)],
            len,
        })
    }

    /// Copies a view.
    pub fn from_view(v: &TensorView<'_>) -> Self {
        let data = v.bytes();
        let mut words = vec![0u64; data.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..data.len()].copy_from_slice(data);
        Tensor {
            dtype: v.dtype(),
            shape: v.shape().to_vec(),
            words,
            len: data.len(),
        }
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.len / self.dtype.size()
    }

    /// Raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }

    /// Raw bytes, mutable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)[..self.len]
    }

    /// A borrowed view (what [`mote_core::Session::run`] takes).
    pub fn view(&self) -> TensorView<'_> {
        // Length and shape agree by construction (every constructor checks).
        TensorView::from_bytes(self.dtype, &self.shape, self.bytes())
            .expect("tensor length checked at construction")
    }

    /// Typed elements; `Err` if `T` is not the dtype (`u8` also reads bool).
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        let ok = self.dtype == T::DTYPE || (self.dtype == DType::Bool && T::DTYPE == DType::U8);
        if !ok {
            return Err(Error::Input(format!(
                "tensor is {}, not {}",
                self.dtype,
                T::DTYPE
            )));
        }
        bytemuck::try_cast_slice(self.bytes())
            .map_err(|e| Error::Input(format!("tensor data: {e}")))
    }

    /// Every element converted to `f32` (bool as 0/1).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        if let Ok(s) = self.as_slice::<f32>() {
            return s.to_vec();
        }
        self.to_f64_vec().into_iter().map(|x| x as f32).collect()
    }

    /// Every element converted to `f64` (bool as 0/1).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let v = self.view();
        (0..self.numel())
            .map(|i| v.f64_at(i).unwrap_or(f64::NAN))
            .collect()
    }
}
