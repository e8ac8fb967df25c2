//! `.npy` files (numpy's array format) to and from [`Tensor`]s.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read};
use std::path::Path;

use half::f16;
use mote_core::{DType, Element, TensorView};
use npyz::{NpyFile, Order, TypeChar, WriterBuilder};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

fn npy_err(path: &Path, what: impl std::fmt::Display) -> Error {
    Error::Npy(format!("{}: not a valid npy file: {what}", path.display()))
}

fn read_typed<T, R>(path: &Path, f: NpyFile<R>) -> Result<Vec<u8>>
where
    T: npyz::Deserialize + Element,
    R: Read,
{
    let v: Vec<T> = f
        .into_vec()
        .map_err(|e| npy_err(path, format!("data: {e} (truncated?)")))?;
    Ok(bytemuck::cast_slice(&v).to_vec())
}

/// Row-major copy of Fortran-ordered element bytes.
fn fortran_to_c(data: &[u8], shape: &[usize], size: usize) -> Vec<u8> {
    let n = data.len() / size.max(1);
    let mut out = vec![0u8; data.len()];
    let mut fstride = vec![1usize; shape.len()];
    for k in 1..shape.len() {
        fstride[k] = fstride[k - 1] * shape[k - 1];
    }
    let mut idx = vec![0usize; shape.len()];
    for i in 0..n {
        let src: usize = idx.iter().zip(&fstride).map(|(a, b)| a * b).sum();
        out[i * size..(i + 1) * size].copy_from_slice(&data[src * size..(src + 1) * size]);
        for k in (0..shape.len()).rev() {
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    out
}

/// Reads a `.npy` file: float32/64/16, (u)int8/16/32/64 and bool, C or
/// Fortran order (returned row-major). Malformed files, truncated data and
/// other dtypes are clean errors.
pub fn read_npy(path: impl AsRef<Path>) -> Result<Tensor> {
    let path = path.as_ref();
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
    read_npy_from(path, BufReader::new(file), file_len)
}

/// [`read_npy`] over bytes in memory (`name` is used in messages).
pub fn read_npy_bytes(name: &str, bytes: &[u8]) -> Result<Tensor> {
    read_npy_from(Path::new(name), bytes, bytes.len() as u64)
}

/// Reads an npy stream of at most `len` bytes (a bound checked before any
/// buffer proportional to the declared shape is allocated).
fn read_npy_from<R: Read>(path: &Path, mut reader: R, len: u64) -> Result<Tensor> {
    let head = read_header(&mut reader, len).map_err(|e| match e {
        HeaderError::Io(e) => Error::io(path, e),
        HeaderError::Bad(what) => npy_err(path, what),
    })?;
    let f = NpyFile::new(head.as_slice().chain(reader)).map_err(|e| npy_err(path, e))?;
    let npyz::DType::Plain(ts) = f.dtype() else {
        return Err(Error::Npy(format!(
            "{}: structured npy arrays are not supported",
            path.display()
        )));
    };
    let size = ts.size_field();
    let dtype = match (ts.type_char(), size) {
        (TypeChar::Float, 4) => DType::F32,
        (TypeChar::Float, 8) => DType::F64,
        (TypeChar::Float, 2) => DType::F16,
        (TypeChar::Int, 1) => DType::I8,
        (TypeChar::Int, 2) => DType::I16,
        (TypeChar::Int, 4) => DType::I32,
        (TypeChar::Int, 8) => DType::I64,
        (TypeChar::Uint, 1) => DType::U8,
        (TypeChar::Uint, 2) => DType::U16,
        (TypeChar::Uint, 4) => DType::U32,
        (TypeChar::Uint, 8) => DType::U64,
        (TypeChar::Bool, 1) => DType::Bool,
        _ => {
            return Err(Error::Npy(format!(
                "{}: unsupported npy dtype '{ts}'",
                path.display()
            )))
        }
    };
    let shape: Vec<usize> = f
        .shape()
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| npy_err(path, "dimension too large"))?;
    let bytes = mote_core::checked_numel(&shape)
        .ok()
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or_else(|| npy_err(path, "shape too large"))?;
    if bytes as u64 > len {
        return Err(npy_err(
            path,
            format!("truncated: shape {:?} needs {bytes} bytes of data", shape),
        ));
    }
    let order = f.order();
    let mut data = match dtype {
        DType::F32 => read_typed::<f32, _>(path, f)?,
        DType::F64 => read_typed::<f64, _>(path, f)?,
        DType::F16 => read_typed::<f16, _>(path, f)?,
        DType::I8 => read_typed::<i8, _>(path, f)?,
        DType::I16 => read_typed::<i16, _>(path, f)?,
        DType::I32 => read_typed::<i32, _>(path, f)?,
        DType::I64 => read_typed::<i64, _>(path, f)?,
        DType::U8 => read_typed::<u8, _>(path, f)?,
        DType::U16 => read_typed::<u16, _>(path, f)?,
        DType::U32 => read_typed::<u32, _>(path, f)?,
        DType::U64 => read_typed::<u64, _>(path, f)?,
        DType::Bool => {
            let v: Vec<bool> = f
                .into_vec()
                .map_err(|e| npy_err(path, format!("data: {e} (truncated?)")))?;
            v.into_iter().map(u8::from).collect()
        }
        _ => {
            return Err(Error::Npy(format!(
                "{}: unsupported npy dtype '{ts}'",
                path.display()
            )))
        }
    };
    if order == Order::Fortran && shape.len() > 1 {
        data = fortran_to_c(&data, &shape, dtype.size());
    }
    Tensor::from_bytes(dtype, &shape, &data).map_err(|e| npy_err(path, e))
}

/// Largest npy header read (numpy writes a few hundred bytes).
const MAX_HEADER: u64 = 64 << 10;
/// Deepest bracket nesting of a header's dict literal.
const MAX_NESTING: usize = 8;

enum HeaderError {
    Io(std::io::Error),
    Bad(String),
}

/// The magic, version, length and header dict of an npy stream, checked
/// before npyz parses them: npyz allocates the declared header length
/// before reading it (up to 4 GiB in format 2 and 3), and its parser of
/// the dict literal backtracks exponentially on nested brackets (a
/// 150-byte header took over 10 s). Data other than npy is passed through
/// for npyz to refuse.
fn read_header(r: &mut impl Read, len: u64) -> std::result::Result<Vec<u8>, HeaderError> {
    let mut head = vec![0u8; 12];
    let got = read_up_to(r, &mut head).map_err(HeaderError::Io)?;
    head.truncate(got);
    if head.len() < 10 || !head.starts_with(b"\x93NUMPY") {
        return Ok(head);
    }
    let (fixed, hlen) = match head[6] {
        1 => (10u64, u64::from(u16::from_le_bytes([head[8], head[9]]))),
        _ if head.len() >= 12 => (
            12,
            u64::from(u32::from_le_bytes([head[8], head[9], head[10], head[11]])),
        ),
        _ => return Ok(head),
    };
    if fixed.saturating_add(hlen) > len || hlen > MAX_HEADER {
        return Err(HeaderError::Bad(format!(
            "header of {hlen} bytes is longer than the file ({len} bytes) or than {MAX_HEADER}"
        )));
    }
    // `fixed` and `hlen` are at most 64 KiB here.
    let end = (fixed + hlen) as usize;
    let start = head.len();
    head.resize(end.max(start), 0);
    let got = read_up_to(r, &mut head[start..]).map_err(HeaderError::Io)?;
    head.truncate(start + got);
    let (mut depth, mut quote) = (0usize, None::<u8>);
    for &c in head.get(fixed as usize..).unwrap_or(&[]) {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, b'\'' | b'"') => quote = Some(c),
            (None, b'(' | b'[' | b'{') => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Err(HeaderError::Bad(format!(
                        "header nests brackets deeper than {MAX_NESTING}"
                    )));
                }
            }
            (None, b')' | b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if shape_overflows(head.get(fixed as usize..).unwrap_or(&[])) {
        // npyz multiplies the dims unchecked (an overflow panic under
        // overflow checks, found by the `npy` fuzz target).
        return Err(HeaderError::Bad(
            "the shape's element count overflows 64 bits".to_string(),
        ));
    }
    Ok(head)
}

/// Whether the product of the integers in the tuple after a `shape` key of
/// an npy header dict overflows `u64` (anything unparsable is left to npyz).
fn shape_overflows(dict: &[u8]) -> bool {
    let mut at = 0;
    while let Some(k) = dict
        .get(at..)
        .and_then(|d| d.windows(5).position(|w| w == b"shape"))
    {
        let after = &dict[at + k + 5..];
        at += k + 5;
        let Some(open) = after.iter().position(|&c| c == b'(') else {
            continue;
        };
        // Only `'shape': (` — quote, colon and spaces in between.
        if !after[..open]
            .iter()
            .all(|c| matches!(c, b'\'' | b'"' | b':' | b' '))
        {
            continue;
        }
        let body = &after[open + 1..];
        let body = &body[..body.iter().position(|&c| c == b')').unwrap_or(body.len())];
        let mut product: u64 = 1;
        for part in body.split(|&c| c == b',') {
            let t = String::from_utf8_lossy(part);
            let Ok(d) = t.trim().parse::<u64>() else {
                continue;
            };
            match product.checked_mul(d) {
                Some(p) => product = p,
                None => return true,
            }
        }
    }
    false
}

/// Reads until `buf` is full or the stream ends; the bytes read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn typed<T: Element>(v: &TensorView<'_>) -> Vec<T> {
    let mut out = vec![T::zeroed(); v.numel()];
    bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(v.bytes());
    out
}

fn write_typed<T>(path: &Path, shape: &[u64], values: Vec<T>) -> Result<()>
where
    T: npyz::AutoSerialize,
{
    let file = File::create(path).map_err(|e| Error::io(path, e))?;
    let io = |e| Error::io(path, e);
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(BufWriter::new(file))
        .begin_nd()
        .map_err(io)?;
    w.extend(values).map_err(io)?;
    w.finish().map_err(io)
}

/// Writes a tensor as a (C-order, little-endian) `.npy` file. bfloat16 has
/// no numpy dtype and is refused.
pub fn write_npy(path: impl AsRef<Path>, t: &TensorView<'_>) -> Result<()> {
    let path = path.as_ref();
    let shape: Vec<u64> = t.shape().iter().map(|&d| d as u64).collect();
    match t.dtype() {
        DType::F32 => write_typed(path, &shape, typed::<f32>(t)),
        DType::F64 => write_typed(path, &shape, typed::<f64>(t)),
        DType::F16 => write_typed(path, &shape, typed::<f16>(t)),
        DType::I8 => write_typed(path, &shape, typed::<i8>(t)),
        DType::I16 => write_typed(path, &shape, typed::<i16>(t)),
        DType::I32 => write_typed(path, &shape, typed::<i32>(t)),
        DType::I64 => write_typed(path, &shape, typed::<i64>(t)),
        DType::U8 => write_typed(path, &shape, typed::<u8>(t)),
        DType::U16 => write_typed(path, &shape, typed::<u16>(t)),
        DType::U32 => write_typed(path, &shape, typed::<u32>(t)),
        DType::U64 => write_typed(path, &shape, typed::<u64>(t)),
        DType::Bool => write_typed(
            path,
            &shape,
            t.bytes().iter().map(|&b| b != 0).collect::<Vec<bool>>(),
        ),
        d => Err(Error::Npy(format!(
            "{}: dtype {d} has no npy equivalent",
            path.display()
        ))),
    }
}
