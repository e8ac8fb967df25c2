//! Compiled models (`.mote` files): a model imported, optimized,
//! quantize-fused and planned once on the host (`mote compile`), run on a
//! device **without any allocator** (this module builds with feature
//! `alloc` off).
//!
//! ```ignore
//! static MODEL: &[u8] = ...; // the .mote bytes, 4-byte aligned, in flash
//! static mut ARENA: [u8; ARENA_BYTES] = [0; ARENA_BYTES];
//! let model = CompiledModel::from_bytes(MODEL)?;    // checks everything once
//! let mut s = CompiledSession::new(&model, unsafe { &mut *addr_of_mut!(ARENA) })?;
//! s.input_mut(0)?.copy_from_slice(&features);        // int8 bytes
//! s.invoke()?;
//! let logits = s.output(0)?;
//! ```
//!
//! # Format, version 1
//! All integers little-endian; every section starts at a multiple of 16.
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic `MOTE` |
//! | 4 | `u16` format version (1), `u16` flags (bit 0: signed) |
//! | 8 | `u32` total length in bytes |
//! | 12 | `u32` CRC-32 (IEEE) of bytes `16..total` |
//! | 16 | `u32` arena bytes |
//! | 20 | `u32` arena lower bound (informative) |
//! | 24 | `u32` tensors, steps, inputs, outputs (4 counts) |
//! | 40 | `u32` offsets of the tensor, step and IO tables |
//! | 52 | `u32` offset, length of the params, strings and data sections |
//! | 76 | `u32` reserved (0); header is 80 bytes |
//!
//! - **tensor** (48 B): `u8` ONNX dtype, `u8` rank (≤ 8), `u8` kind (0:
//!   arena, 1: constant in the data section), `u8` 0, `u32` offset, `u32`
//!   byte length, `u32` 0, `u32 × 8` dims.
//! - **step** (24 B): `u32` kernel id, input 0, input 1 (`u32::MAX`: none),
//!   output tensor, params offset, params length (bytes, a multiple of 4).
//! - **io** (24 B): `u32` tensor, name offset, name length (UTF-8 in the
//!   strings section), `u32` flags (bit 0: quantized), `f32` scale, `i32`
//!   zero point (`real = (q - zero_point) · scale`).
//! - **params**: per kernel, the words [`op::decode`] reads; per-channel
//!   arrays are `(offset, count)` into the data section, used in place.
//! - **data**: weights (16-aligned) and parameter arrays (4-aligned).
//! - **signature** (flag bit 0 only): 64 bytes after `total`, the Ed25519
//!   signature of bytes `0..total` (header included, so that the flag and
//!   the length are signed too). [`CompiledModel::from_bytes_verified`]
//!   (feature `signed`) checks it against the firmware's public key;
//!   [`CompiledModel::from_bytes`] ignores it.
//!
//! [`CompiledModel::from_bytes`] validates the checksum, the version and
//! every record (bounds, dtypes, lengths, kernel parameters, that no step's
//! output overlaps its inputs unless it is exactly in place), so
//! [`CompiledSession::invoke`] can only fail on a kernel's own checks.

#[cfg(feature = "alloc")]
pub(crate) mod export;
pub(crate) mod op;
#[cfg(feature = "alloc")]
mod writer;

#[cfg(feature = "alloc")]
pub use writer::{compile, report, CompileReport, StepReport};

use crate::error::{Error, ErrorKind, Result};
use crate::tensor::MAX_RANK;
use crate::{DType, Element};
use op::{Fault, OpView, Words};

/// The loader's internal result (see [`Fault`]).
type Checked<T> = core::result::Result<T, Fault>;

/// The format version this build reads and writes.
pub const FORMAT_VERSION: u16 = 1;
/// Bytes of the header.
pub(crate) const HEADER: usize = 80;
pub(crate) const TENSOR_REC: usize = 48;
pub(crate) const STEP_REC: usize = 24;
pub(crate) const IO_REC: usize = 24;
pub(crate) const NONE: u32 = u32::MAX;
pub(crate) const KIND_ARENA: u8 = 0;
pub(crate) const KIND_CONST: u8 = 1;
/// Header flag: an Ed25519 signature follows the model's `total` bytes.
pub const FLAG_SIGNED: u16 = 1;
/// Bytes of the signature of a signed file.
pub const SIGNATURE_LEN: usize = 64;

fn bad(what: &'static str) -> Error {
    Error::new(ErrorKind::BadFile(what))
}

/// CRC-32 (IEEE 802.3, reflected, as zlib's `crc32`), four bits at a time
/// (a 64-byte table: small in flash).
pub fn crc32(bytes: &[u8]) -> u32 {
    // Built by const evaluation: an index out of range there is a compile
    // error, not a run-time panic.
    #[allow(clippy::indexing_slicing)]
    const T: [u32; 16] = {
        let mut t = [0u32; 16];
        let mut i = 0;
        while i < 16 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 4 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut c = !0u32;
    // `c & 15` always indexes the 16-entry table (the fallback is dead code
    // the optimizer removes, so no bounds check reaches the firmware).
    let step = |c: u32| T.get((c & 15) as usize).copied().unwrap_or(0) ^ (c >> 4);
    for &b in bytes {
        c ^= b as u32;
        c = step(step(c));
    }
    !c
}

/// The `u32` at byte `at` (`None` past the end).
fn rd32(b: &[u8], at: usize) -> Option<u32> {
    let c = b.get(at..)?.first_chunk::<4>()?;
    Some(u32::from_le_bytes(*c))
}

fn rd16(b: &[u8], at: usize) -> Option<u16> {
    let c = b.get(at..)?.first_chunk::<2>()?;
    Some(u16::from_le_bytes(*c))
}

fn rdu(b: &[u8], at: usize) -> Option<usize> {
    usize::try_from(rd32(b, at)?).ok()
}

/// Record `i` of a table of `N`-byte records.
fn record<const N: usize>(table: &[u8], i: usize) -> Option<&[u8; N]> {
    table.get(i.checked_mul(N)?..)?.first_chunk::<N>()
}

/// `b[off..off+len]`.
fn section(b: &[u8], off: usize, len: usize) -> Checked<&[u8]> {
    off.checked_add(len)
        .and_then(|end| b.get(off..end))
        .ok_or("section outside the file")
}

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// `len` bytes at `offset` in the arena.
    Arena,
    /// In the model's data section (weights, read in place).
    Const,
}

/// One tensor of a compiled model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorDesc {
    /// Element type.
    pub dtype: DType,
    /// Rank (dims past it are 0).
    pub rank: usize,
    /// Dimensions.
    pub dims: [usize; MAX_RANK],
    /// Arena or constant.
    pub storage: Storage,
    /// Byte offset (in the arena or the data section).
    pub offset: usize,
    /// Byte length.
    pub len: usize,
}

impl TensorDesc {
    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        // Never empty by the fallback: `dims` holds MAX_RANK entries.
        self.dims.get(..self.rank.min(MAX_RANK)).unwrap_or(&[])
    }

    fn end(&self) -> usize {
        // Checked at load: offset + len does not overflow.
        self.offset.saturating_add(self.len)
    }
}

/// A graph input or output of a compiled model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IoDesc<'m> {
    /// Tensor name in the source model, as stored; UTF-8 is checked by
    /// [`IoDesc::name`], so firmware that never asks for a name does not
    /// link the UTF-8 validator (about 300 B of flash on a Cortex-M3).
    name: &'m [u8],
    /// Its tensor (dtype, shape, arena place).
    pub tensor: TensorDesc,
    /// `(scale, zero_point)` of an 8-bit input or output standing for a
    /// float one: `real = (q - zero_point) · scale`.
    pub quant: Option<(f32, i32)>,
}

impl<'m> IoDesc<'m> {
    /// Tensor name in the source model; `Err` (`BadFile`) if the file
    /// stores a name that is not UTF-8.
    pub fn name(&self) -> Result<&'m str> {
        core::str::from_utf8(self.name).map_err(|_| bad("IO name not UTF-8"))
    }

    /// Quantizes a float value for this input (round half to even,
    /// saturating), as QuantizeLinear does; `None` if not quantized.
    pub fn quantize(&self, v: f32) -> Option<i32> {
        let (s, z) = self.quant?;
        let (lo, hi) = match self.tensor.dtype {
            DType::U8 => (0.0, 255.0),
            _ => (-128.0, 127.0),
        };
        let q = libm::rintf(v / s) + z as f32;
        Some(q.clamp(lo, hi) as i32)
    }

    /// Dequantizes an 8-bit value of this output; `None` if not quantized.
    pub fn dequantize(&self, q: i32) -> Option<f32> {
        let (s, z) = self.quant?;
        Some(q.saturating_sub(z) as f32 * s)
    }
}

/// A validated `.mote` file, borrowed (from flash, or a host buffer).
#[derive(Clone, Copy, Debug)]
pub struct CompiledModel<'m> {
    arena_bytes: usize,
    lower_bound: usize,
    counts: [usize; 4],
    tensors: &'m [u8],
    steps: &'m [u8],
    io: &'m [u8],
    params: &'m [u8],
    strings: &'m [u8],
    data: &'m [u8],
}

/// Decoded step record.
#[derive(Clone, Copy, Debug)]
struct StepRec {
    kid: u32,
    ins: [u32; 2],
    out: u32,
    params: (usize, usize),
}

impl<'m> CompiledModel<'m> {
    /// Checks and wraps a `.mote` file. `bytes` must start on a 4-byte
    /// boundary (weights and parameter arrays are used in place).
    pub fn from_bytes(bytes: &'m [u8]) -> Result<Self> {
        if bytes.len() < HEADER || bytes.get(..4) != Some(b"MOTE".as_slice()) {
            return Err(bad("not a .mote file (no MOTE magic)"));
        }
        let version = rd16(bytes, 4).ok_or(bad("truncated"))?;
        if version != FORMAT_VERSION {
            return Err(Error::new(ErrorKind::Version {
                supported: FORMAT_VERSION,
                got: version,
            }));
        }
        let flags = rd16(bytes, 6).ok_or(bad("truncated"))?;
        if flags & !FLAG_SIGNED != 0 {
            return Err(bad("unknown flags"));
        }
        if !(bytes.as_ptr() as usize).is_multiple_of(4) {
            return Err(bad("model bytes must start on a 4-byte boundary"));
        }
        let total = rdu(bytes, 8).ok_or(bad("truncated"))?;
        let sig = if flags & FLAG_SIGNED != 0 {
            SIGNATURE_LEN
        } else {
            0
        };
        if total.checked_add(sig) != Some(bytes.len()) {
            return Err(bad("length in the header differs from the file's"));
        }
        // A signed file's length field can claim less than a header.
        if total < HEADER {
            return Err(bad("length in the header is shorter than a header"));
        }
        let bytes = bytes.get(..total).ok_or(bad("truncated"))?;
        if Some(crc32(bytes.get(16..).unwrap_or_default())) != rd32(bytes, 12) {
            return Err(bad("checksum mismatch (corrupt file)"));
        }
        let m = Self::sections(bytes).map_err(bad)?;
        m.validate()?;
        Ok(m)
    }

    /// The header's fields and sections (bounds checked, not yet their
    /// records).
    fn sections(bytes: &'m [u8]) -> Checked<Self> {
        let h = |i: usize| rdu(bytes, i.saturating_mul(4).saturating_add(16)).ok_or("truncated");
        let arena_bytes = h(0)?;
        let lower_bound = h(1)?;
        let counts = [h(2)?, h(3)?, h(4)?, h(5)?];
        let table = |off: usize, n: usize, rec: usize| -> Checked<&'m [u8]> {
            section(bytes, off, n.checked_mul(rec).ok_or("count overflow")?)
        };
        let m = CompiledModel {
            arena_bytes,
            lower_bound,
            counts,
            tensors: table(h(6)?, counts[0], TENSOR_REC)?,
            steps: table(h(7)?, counts[1], STEP_REC)?,
            io: table(
                h(8)?,
                counts[2].checked_add(counts[3]).ok_or("io count")?,
                IO_REC,
            )?,
            params: section(bytes, h(9)?, h(10)?)?,
            strings: section(bytes, h(11)?, h(12)?)?,
            data: section(bytes, h(13)?, h(14)?)?,
        };
        if !(m.data.as_ptr() as usize).is_multiple_of(16) {
            return Err("data section not 16-aligned");
        }
        Ok(m)
    }

    /// [`CompiledModel::from_bytes`] for a file that must be signed by
    /// `public_key` (Ed25519, `mote compile --sign`): an unsigned file, a
    /// file signed by another key, and any change to a signed file (a
    /// flipped bit, a stripped or replaced signature) are errors, checked
    /// before anything else of the file is read.
    #[cfg(feature = "signed")]
    pub fn from_bytes_verified(bytes: &'m [u8], public_key: &[u8; 32]) -> Result<Self> {
        if bytes.len() < HEADER || bytes.get(..4) != Some(b"MOTE".as_slice()) {
            return Err(bad("not a .mote file (no MOTE magic)"));
        }
        if rd16(bytes, 6).ok_or(bad("truncated"))? & FLAG_SIGNED == 0 {
            return Err(bad("model is not signed (mote compile --sign)"));
        }
        let total = rdu(bytes, 8).ok_or(bad("truncated"))?;
        let (signed, sig) = match (bytes.get(..total), bytes.get(total..)) {
            (Some(m), Some(s)) if s.len() == SIGNATURE_LEN => (m, s),
            _ => return Err(bad("length in the header differs from the file's")),
        };
        let key = ed25519_dalek::VerifyingKey::from_bytes(public_key)
            .map_err(|_| bad("public key is not a valid Ed25519 key"))?;
        let mut s = [0u8; SIGNATURE_LEN];
        s.copy_from_slice(sig);
        key.verify_strict(signed, &ed25519_dalek::Signature::from_bytes(&s))
            .map_err(|_| bad("signature does not match (changed, or signed by another key)"))?;
        CompiledModel::from_bytes(bytes)
    }

    /// Arena bytes a session needs.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// The planner's lower bound on the arena (largest set of tensors live
    /// at once), for reports.
    pub fn arena_lower_bound(&self) -> usize {
        self.lower_bound
    }

    /// Number of tensors.
    pub fn num_tensors(&self) -> usize {
        self.counts[0]
    }

    /// Number of steps (kernel invocations per inference).
    pub fn num_steps(&self) -> usize {
        self.counts[1]
    }

    /// Number of graph inputs.
    pub fn num_inputs(&self) -> usize {
        self.counts[2]
    }

    /// Number of graph outputs.
    pub fn num_outputs(&self) -> usize {
        self.counts[3]
    }

    /// Bytes of weights and parameter arrays.
    pub fn data_bytes(&self) -> usize {
        self.data.len()
    }

    /// Tensor `i`.
    pub fn tensor(&self, i: usize) -> Result<TensorDesc> {
        if i >= self.counts[0] {
            return Err(Error::new(ErrorKind::UnknownName));
        }
        self.tensor_at(i).map_err(bad)
    }

    fn tensor_at(&self, i: usize) -> Checked<TensorDesc> {
        let r =
            record::<TENSOR_REC>(self.tensors, i).ok_or("tensor index outside the tensor table")?;
        let &[code, rank, kind, ..] = r;
        let dtype = DType::from_onnx(code as i32).ok_or("unknown tensor dtype")?;
        let rank = rank as usize;
        if rank > MAX_RANK {
            return Err("tensor rank above 8");
        }
        let storage = match kind {
            KIND_ARENA => Storage::Arena,
            KIND_CONST => Storage::Const,
            _ => return Err("unknown tensor storage kind"),
        };
        let mut dims = [0usize; MAX_RANK];
        for (k, d) in dims.iter_mut().enumerate().take(rank) {
            *d = rdu(r, k.saturating_mul(4).saturating_add(16)).ok_or("truncated tensor record")?;
        }
        Ok(TensorDesc {
            dtype,
            rank,
            dims,
            storage,
            offset: rdu(r, 4).ok_or("truncated tensor record")?,
            len: rdu(r, 8).ok_or("truncated tensor record")?,
        })
    }

    fn step(&self, i: usize) -> Checked<StepRec> {
        let r = record::<STEP_REC>(self.steps, i).ok_or("step index outside the step table")?;
        let w = |k: usize| rd32(r, k).unwrap_or(NONE);
        Ok(StepRec {
            kid: w(0),
            ins: [w(4), w(8)],
            out: w(12),
            params: (w(16) as usize, w(20) as usize),
        })
    }

    fn op(&self, s: &StepRec) -> Checked<OpView<'m>> {
        let p = section(self.params, s.params.0, s.params.1)?;
        op::decode(s.kid, &mut Words::new(p, self.data))
    }

    fn io_desc(&self, i: usize) -> Checked<IoDesc<'m>> {
        let r = record::<IO_REC>(self.io, i).ok_or("io index outside the io table")?;
        let w = |k: usize| rd32(r, k).unwrap_or(NONE);
        let tensor = self.tensor_at(w(0) as usize)?;
        let name = section(self.strings, w(4) as usize, w(8) as usize)?;
        let quant = match w(12) {
            0 => None,
            1 => Some((f32::from_bits(w(16)), w(20) as i32)),
            _ => return Err("unknown IO flags"),
        };
        Ok(IoDesc {
            name,
            tensor,
            quant,
        })
    }

    /// Graph input `i`.
    pub fn input(&self, i: usize) -> Result<IoDesc<'m>> {
        if i >= self.counts[2] {
            return Err(Error::new(ErrorKind::UnknownName));
        }
        self.io_desc(i).map_err(bad)
    }

    /// Graph output `i`.
    pub fn output(&self, i: usize) -> Result<IoDesc<'m>> {
        if i >= self.counts[3] {
            return Err(Error::new(ErrorKind::UnknownName));
        }
        self.io_desc(self.counts[2].saturating_add(i)).map_err(bad)
    }

    fn validate(&self) -> Result<()> {
        for i in 0..self.counts[0] {
            self.validate_tensor(i)
                .map_err(|e| bad(e).at_tensor(i as u32))?;
        }
        for i in 0..self.counts[1] {
            self.validate_step(i)
                .map_err(|e| bad(e).at_node(i as u32))?;
        }
        for i in 0..self.counts[2].saturating_add(self.counts[3]) {
            self.validate_io(i).map_err(bad)?;
        }
        Ok(())
    }

    fn validate_tensor(&self, i: usize) -> Checked<()> {
        let t = self.tensor_at(i)?;
        let len = t
            .shape()
            .iter()
            .try_fold(t.dtype.size(), |a, &d| a.checked_mul(d))
            .ok_or("tensor size overflows")?;
        if t.len != len {
            return Err("tensor byte length differs from its shape");
        }
        let end = t.offset.checked_add(t.len).ok_or("tensor range overflow")?;
        let limit = match t.storage {
            Storage::Arena => self.arena_bytes,
            Storage::Const => {
                if t.offset % 16 != 0 {
                    return Err("constant not 16-aligned");
                }
                self.data.len()
            }
        };
        if end > limit {
            return Err("tensor outside the arena or data section");
        }
        Ok(())
    }

    fn validate_io(&self, i: usize) -> Checked<()> {
        let d = self.io_desc(i)?;
        if d.tensor.storage != Storage::Arena {
            return Err("graph inputs and outputs must be in the arena");
        }
        if let Some((s, _)) = d.quant {
            if !(s.is_finite() && s > 0.0) {
                return Err("IO scale must be finite and > 0");
            }
        }
        Ok(())
    }

    fn validate_step(&self, i: usize) -> Checked<()> {
        let s = self.step(i)?;
        let op = self.op(&s)?;
        let out = self.tensor_at(s.out as usize)?;
        if out.storage != Storage::Arena {
            return Err("step output must be in the arena");
        }
        let (in_dt, out_dt) = op.dtypes();
        if out.dtype != out_dt {
            return Err("step output dtype differs from its kernel's");
        }
        for (k, (&id, &want)) in s.ins.iter().zip(&in_dt).enumerate() {
            if k >= op.arity() {
                if id != NONE {
                    return Err("input given to a kernel that takes none there");
                }
                continue;
            }
            let t = self.tensor_at(id as usize)?;
            if t.dtype != want {
                return Err("step input dtype differs from its kernel's");
            }
            if t.storage == Storage::Arena && t.offset < out.end() && out.offset < t.end() {
                let in_place = k == 0 && t.offset == out.offset && t.len == out.len;
                if !in_place || !op.can_run_in_place() {
                    return Err("step output overlaps an input");
                }
            }
        }
        Ok(())
    }
}

/// A compiled model bound to a caller-owned arena. No allocation, ever.
#[derive(Debug)]
pub struct CompiledSession<'m, 'a> {
    model: CompiledModel<'m>,
    arena: &'a mut [u8],
}

impl<'m, 'a> CompiledSession<'m, 'a> {
    /// Binds `model` to `arena` (at least [`CompiledModel::arena_bytes`];
    /// any alignment: version-1 kernels read and write bytes).
    pub fn new(model: &CompiledModel<'m>, arena: &'a mut [u8]) -> Result<Self> {
        if arena.len() < model.arena_bytes {
            return Err(Error::new(ErrorKind::ArenaTooSmall {
                needed: model.arena_bytes,
                got: arena.len(),
            }));
        }
        Ok(CompiledSession {
            model: *model,
            arena,
        })
    }

    /// The model.
    pub fn model(&self) -> &CompiledModel<'m> {
        &self.model
    }

    fn io_bytes(&self, d: &IoDesc<'_>) -> Result<&[u8]> {
        section(self.arena, d.tensor.offset, d.tensor.len).map_err(bad)
    }

    /// The bytes of graph input `i`, to fill before [`Self::invoke`].
    pub fn input_bytes_mut(&mut self, i: usize) -> Result<&mut [u8]> {
        let d = self.model.input(i)?;
        let end = d.tensor.end();
        self.arena
            .get_mut(d.tensor.offset..end)
            .ok_or(bad("input outside the arena"))
    }

    /// Graph input `i` as elements of `T` (its dtype must be `T`).
    pub fn input_mut<T: Element>(&mut self, i: usize) -> Result<&mut [T]> {
        let dt = self.model.input(i)?.tensor.dtype;
        if dt != T::DTYPE {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: dt,
                got: T::DTYPE,
            }));
        }
        bytemuck::try_cast_slice_mut(self.input_bytes_mut(i)?)
            .map_err(|_| bad("arena not aligned for this input's type"))
    }

    /// The bytes of graph output `i` (valid after [`Self::invoke`]).
    pub fn output_bytes(&self, i: usize) -> Result<&[u8]> {
        let d = self.model.output(i)?;
        self.io_bytes(&d)
    }

    /// Graph output `i` as elements of `T`.
    pub fn output<T: Element>(&self, i: usize) -> Result<&[T]> {
        let dt = self.model.output(i)?.tensor.dtype;
        if dt != T::DTYPE {
            return Err(Error::new(ErrorKind::DTypeMismatch {
                expected: dt,
                got: T::DTYPE,
            }));
        }
        bytemuck::try_cast_slice(self.output_bytes(i)?)
            .map_err(|_| bad("arena not aligned for this output's type"))
    }

    /// Runs every step once, in order.
    pub fn invoke(&mut self) -> Result<()> {
        for i in 0..self.model.num_steps() {
            self.run_step(i).map_err(|e| e.at_node(i as u32))?;
        }
        Ok(())
    }

    /// Runs step `i` (for per-step timing on a board).
    pub fn run_step(&mut self, i: usize) -> Result<()> {
        let (op, ins, y) = self.bind(i).map_err(bad)?;
        op.run(ins, y)
    }

    /// Step `i`'s kernel, input bytes and output bytes.
    #[allow(clippy::type_complexity)]
    fn bind(&mut self, i: usize) -> Checked<(OpView<'m>, [Option<&[u8]>; 2], &mut [u8])> {
        let m = self.model;
        let s = m.step(i)?;
        let op = m.op(&s)?;
        let out = m.tensor_at(s.out as usize)?;
        // Split the arena around the output: inputs come from the parts
        // before and after it (checked at load never to overlap it, except
        // input 0 exactly in place).
        let (head, rest) = self
            .arena
            .split_at_mut_checked(out.offset)
            .ok_or("output outside the arena")?;
        let (y, tail) = rest
            .split_at_mut_checked(out.len)
            .ok_or("output outside the arena")?;
        let (head, tail): (&[u8], &[u8]) = (head, tail);
        let mut ins: [Option<&[u8]>; 2] = [None, None];
        for (k, (slot, &id)) in ins.iter_mut().zip(&s.ins).enumerate().take(op.arity()) {
            let t = m.tensor_at(id as usize)?;
            *slot = match t.storage {
                Storage::Const => Some(section(m.data, t.offset, t.len)?),
                Storage::Arena if t.offset == out.offset && k == 0 => None,
                Storage::Arena if t.end() <= out.offset => Some(section(head, t.offset, t.len)?),
                Storage::Arena => {
                    let off = t
                        .offset
                        .checked_sub(out.end())
                        .ok_or("step output overlaps an input")?;
                    Some(section(tail, off, t.len)?)
                }
            };
        }
        Ok((op, ins, y))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn short_or_foreign_bytes_are_errors() {
        for b in [
            &b""[..],
            b"MOTE",
            b"ONNX and more bytes than a header but not a mote file at all, surely not",
        ] {
            assert!(CompiledModel::from_bytes(b).is_err());
        }
    }

    #[test]
    fn signed_length_shorter_than_a_header_is_an_error() {
        // Signed files whose header claims fewer bytes than a header before
        // the signature: refused by name (the nopanic link check found the
        // slice bound the optimizer could not see through).
        for total in [16usize, 76] {
            let mut w = vec![0u32; (total + SIGNATURE_LEN) / 4];
            w[0] = u32::from_le_bytes(*b"MOTE");
            w[1] = u32::from(FORMAT_VERSION) | (u32::from(FLAG_SIGNED) << 16);
            w[2] = total as u32;
            // SAFETY: u8 has no alignment or validity requirement; the
            // length is the buffer's byte length.
            let bytes =
                unsafe { core::slice::from_raw_parts(w.as_ptr().cast::<u8>(), w.len() * 4) };
            let e = CompiledModel::from_bytes(bytes).err().map(|e| e.kind);
            let want = bad("length in the header is shorter than a header").kind;
            assert_eq!(e, Some(want), "total {total}");
        }
    }
}
