//! Compiled models on the host: `mote compile` (ONNX → `.mote`), loading a
//! `.mote` file into an aligned buffer, running it, and the Rust module
//! `--emit-rust` writes for firmware.

use std::fmt::Write as _;
use std::path::Path;

use mote_core::compiled::{self, CompileReport, CompiledModel, CompiledSession, IoDesc};
use mote_core::{DType, Model};

use crate::{explain, load_model, Error, Result, Tensor};

/// A model compiled from ONNX: the file bytes, the step report and the
/// optimized model they came from.
#[derive(Debug)]
pub struct Compiled {
    /// The `.mote` bytes.
    pub bytes: Vec<u8>,
    /// Each step and its kernel.
    pub report: CompileReport,
}

/// Imports, optimizes with 8-bit graph IO (`optimize::int8_io`: inputs and
/// outputs that the graph quantizes at once become int8/uint8, with their
/// scales recorded in the file), plans with `dims` bound, and writes a
/// `.mote` file. On a step without a compiled kernel the error names the
/// node; [`ops_report`] lists them all.
pub fn compile_onnx(path: impl AsRef<Path>, dims: &[(String, usize)]) -> Result<Compiled> {
    let (model, plan) = plan_for_compile(path.as_ref(), dims)?;
    let report = compiled::report(&model, &plan);
    let bytes = compiled::compile(&model, &plan).map_err(|e| explain(&model, &e))?;
    Ok(Compiled { bytes, report })
}

/// The step report alone (works on any plannable model).
pub fn ops_report(path: impl AsRef<Path>, dims: &[(String, usize)]) -> Result<CompileReport> {
    let (model, plan) = plan_for_compile(path.as_ref(), dims)?;
    Ok(compiled::report(&model, &plan))
}

fn plan_for_compile(path: &Path, dims: &[(String, usize)]) -> Result<(Model, mote_core::Plan)> {
    let mut model = load_model(path)?;
    mote_core::optimize::int8_io(&mut model);
    let mut b = model.session_builder();
    for (n, v) in dims {
        b = b.dim(n, *v);
    }
    let plan = b.plan().map_err(|e| explain(&model, &e))?;
    Ok((model, plan))
}

/// A `.mote` file in a 16-byte-aligned buffer (weights are used in place).
#[derive(Clone, Debug)]
pub struct MoteFile {
    buf: Vec<u128>,
    len: usize,
}

impl MoteFile {
    /// Copies `bytes` into an aligned buffer and validates them.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut buf = vec![0u128; bytes.len().div_ceil(16)];
        bytemuck::cast_slice_mut::<u128, u8>(&mut buf)[..bytes.len()].copy_from_slice(bytes);
        let f = MoteFile {
            buf,
            len: bytes.len(),
        };
        f.model()?;
        Ok(f)
    }

    /// Reads and validates a `.mote` file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let b = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        Self::from_bytes(&b).map_err(|e| Error::Model(format!("{}: {e}", path.display())))
    }

    /// [`MoteFile::open`] for a file that must carry a valid signature of
    /// `public_key` ([`CompiledModel::from_bytes_verified`]).
    pub fn open_verified(path: impl AsRef<Path>, public_key: &[u8; 32]) -> Result<Self> {
        let f = Self::open(&path)?;
        CompiledModel::from_bytes_verified(f.bytes(), public_key)
            .map_err(|e| Error::Model(format!("{}: {e}", path.as_ref().display())))?;
        Ok(f)
    }

    /// The file bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u128, u8>(&self.buf)[..self.len]
    }

    /// The validated model.
    pub fn model(&self) -> Result<CompiledModel<'_>> {
        CompiledModel::from_bytes(self.bytes()).map_err(|e| Error::Model(e.to_string()))
    }

    /// Runs once. Each input is given as its stored type, or as f32 for a
    /// quantized input (quantized with the file's scale and zero point).
    /// Returns the outputs as stored (int8/uint8 for quantized ones).
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let m = self.model()?;
        if inputs.len() != m.num_inputs() {
            return Err(Error::Input(format!(
                "the model has {} inputs, {} given",
                m.num_inputs(),
                inputs.len()
            )));
        }
        let mut arena = vec![0u8; m.arena_bytes()];
        let mut s = CompiledSession::new(&m, &mut arena).map_err(core_err)?;
        for (i, t) in inputs.iter().enumerate() {
            let d = m.input(i).map_err(core_err)?;
            let bytes = input_bytes(&d, t)?;
            s.input_bytes_mut(i)
                .map_err(core_err)?
                .copy_from_slice(&bytes);
        }
        s.invoke().map_err(core_err)?;
        (0..m.num_outputs())
            .map(|i| {
                let d = m.output(i).map_err(core_err)?;
                Tensor::from_bytes(
                    d.tensor.dtype,
                    d.tensor.shape(),
                    s.output_bytes(i).map_err(core_err)?,
                )
            })
            .collect()
    }
}

/// Signs a `.mote` file (Ed25519): sets the header's signed flag and
/// appends the signature of everything before it. Firmware built with
/// mote-core's `signed` feature accepts it with
/// [`CompiledModel::from_bytes_verified`] and the matching public key.
pub fn sign(bytes: &[u8], key: &ed25519_dalek::SigningKey) -> Result<Vec<u8>> {
    use ed25519_dalek::Signer;
    MoteFile::from_bytes(bytes).map_err(|e| Error::Model(format!("cannot sign: {e}")))?;
    let flags = u16::from_le_bytes([bytes[6], bytes[7]]);
    if flags & compiled::FLAG_SIGNED != 0 {
        return Err(Error::Model(
            "cannot sign: the model is signed already".into(),
        ));
    }
    let mut out = bytes.to_vec();
    out[6..8].copy_from_slice(&(flags | compiled::FLAG_SIGNED).to_le_bytes());
    let sig = key.sign(&out);
    out.extend_from_slice(&sig.to_bytes());
    Ok(out)
}

/// An Ed25519 private key from a PKCS#8 PEM file (as
/// `openssl genpkey -algorithm ed25519 -out key.pem` writes).
pub fn read_signing_key(path: impl AsRef<Path>) -> Result<ed25519_dalek::SigningKey> {
    use ed25519_dalek::pkcs8::DecodePrivateKey;
    let path = path.as_ref();
    let pem = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    ed25519_dalek::SigningKey::from_pkcs8_pem(&pem).map_err(|e| {
        Error::Input(format!(
            "{}: not an Ed25519 private key in PKCS#8 PEM ({e})",
            path.display()
        ))
    })
}

/// An Ed25519 public key from a PEM file (as `openssl pkey -in key.pem
/// -pubout -out key.pub.pem` writes), as the 32 bytes firmware holds.
pub fn read_public_key(path: impl AsRef<Path>) -> Result<[u8; 32]> {
    use ed25519_dalek::pkcs8::DecodePublicKey;
    let path = path.as_ref();
    let pem = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    ed25519_dalek::VerifyingKey::from_public_key_pem(&pem)
        .map(|k| k.to_bytes())
        .map_err(|e| {
            Error::Input(format!(
                "{}: not an Ed25519 public key in PEM ({e})",
                path.display()
            ))
        })
}

/// `[0x12, 0x34, ...]`: a key as a Rust array, for firmware source.
pub fn rust_bytes(b: &[u8]) -> String {
    let v: Vec<String> = b.iter().map(|x| format!("0x{x:02x}")).collect();
    format!("[{}]", v.join(", "))
}

fn core_err(e: mote_core::Error) -> Error {
    Error::Model(e.to_string())
}

/// The bytes to store for input `d` from `t`.
fn input_bytes(d: &IoDesc<'_>, t: &Tensor) -> Result<Vec<u8>> {
    let name = d.name().map_err(core_err)?;
    if t.shape() != d.tensor.shape() {
        return Err(Error::Input(format!(
            "input '{}': shape {:?} given, the compiled model takes {:?}",
            name,
            t.shape(),
            d.tensor.shape()
        )));
    }
    if t.dtype() == d.tensor.dtype {
        return Ok(t.bytes().to_vec());
    }
    match (t.dtype(), d.quant) {
        (DType::F32, Some(_)) => Ok(t
            .to_f32_vec()
            .iter()
            .map(|&v| d.quantize(v).unwrap_or(0) as u8)
            .collect()),
        _ => Err(Error::Input(format!(
            "input '{}': {} given, the compiled model takes {}{}",
            name,
            t.dtype(),
            d.tensor.dtype,
            if d.quant.is_some() {
                " (or float32)"
            } else {
                ""
            }
        ))),
    }
}

/// Dequantized values of a quantized output (`None` if not quantized).
pub fn dequantize(d: &IoDesc<'_>, t: &Tensor) -> Option<Vec<f32>> {
    d.quant?;
    let v: Vec<i32> = match t.dtype() {
        DType::I8 => t.bytes().iter().map(|&b| b as i8 as i32).collect(),
        DType::U8 => t.bytes().iter().map(|&b| b as i32).collect(),
        _ => return None,
    };
    v.into_iter().map(|q| d.dequantize(q)).collect()
}

fn rust_dtype(d: DType) -> &'static str {
    match d {
        DType::I8 => "i8",
        DType::U8 => "u8",
        DType::F32 => "f32",
        DType::I32 => "i32",
        _ => "u8",
    }
}

/// The module `mote compile --emit-rust` writes: the arena size as a
/// constant (so `static mut ARENA: [u8; ARENA_BYTES]` makes the linker
/// reject a model that does not fit), the model bytes (aligned
/// `include_bytes!` of `mote_file`, a path relative to the module) and the
/// IO shapes and quantization.
pub fn emit_rust(m: &CompiledModel<'_>, mote_file: &str, source: &str) -> Result<String> {
    let mut s = String::new();
    let w = |s: &mut String, t: std::fmt::Arguments<'_>| {
        let _ = s.write_fmt(t);
    };
    w(
        &mut s,
        format_args!(
            "// Generated by `mote compile` from {source}: do not edit.\n\
         // (no inner attributes or doc comments: the module may be `include!`d)\n\n\
         /// Arena bytes the model needs (lower bound {}).\n\
         pub const ARENA_BYTES: usize = {};\n\
         /// Weight and parameter bytes (in flash).\n\
         pub const DATA_BYTES: usize = {};\n\
         /// Kernel invocations per inference.\n\
         pub const STEPS: usize = {};\n\n\
         #[repr(C, align(16))]\n\
         struct Aligned<T: ?Sized>(T);\n\
         static BYTES: &Aligned<[u8]> = &Aligned(*include_bytes!({:?}));\n\
         /// The `.mote` file, 16-byte aligned.\n\
         pub static MODEL: &[u8] = &BYTES.0;\n",
            m.arena_lower_bound(),
            m.arena_bytes(),
            m.data_bytes(),
            m.num_steps(),
            mote_file,
        ),
    );
    for (kind, n, get) in [
        (
            "INPUT",
            m.num_inputs(),
            CompiledModel::input as fn(&_, usize) -> _,
        ),
        ("OUTPUT", m.num_outputs(), CompiledModel::output),
    ] {
        for i in 0..n {
            let d = get(m, i).map_err(core_err)?;
            let name = d.name().map_err(core_err)?;
            let t = &d.tensor;
            let numel: usize = t.shape().iter().product();
            w(
                &mut s,
                format_args!(
                    "\n/// {} {i}: `{}`, {} {:?}.\npub const {kind}{i}_NAME: &str = {:?};\n\
                 pub const {kind}{i}_SHAPE: [usize; {}] = {:?};\n\
                 pub const {kind}{i}_LEN: usize = {numel};\n\
                 #[allow(non_camel_case_types)]\npub type {kind}{i}_TYPE = {};\n",
                    kind.to_lowercase(),
                    name,
                    t.dtype,
                    t.shape(),
                    name,
                    t.rank,
                    t.shape(),
                    rust_dtype(t.dtype)
                ),
            );
            if let Some((sc, zp)) = d.quant {
                w(&mut s, format_args!(
                    "/// real = (q - {kind}{i}_ZERO_POINT) * {kind}{i}_SCALE\n\
                     pub const {kind}{i}_SCALE: f32 = {sc:e};\npub const {kind}{i}_ZERO_POINT: i32 = {zp};\n"
                ));
            }
        }
    }
    Ok(s)
}
