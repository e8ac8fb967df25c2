//! # mote-std
//!
//! The std layer of mote: model files, `.npy` tensors, sessions that own
//! their arena, and the `mote` command-line tool.
//!
//! ```no_run
//! # fn main() -> mote_std::Result<()> {
//! let mut s = mote_std::Session::from_file("models/digits_mlp.onnx")?;
//! let x = mote_std::read_npy("models/digits_sample.npy")?;
//! let out = s.run(&[("input", x)])?;
//! mote_std::write_npy("scores.npy", &out[0].view())?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod compiled;
pub mod conformance;
pub mod cpu;
mod error;
pub mod external;
mod npy;
pub mod provider;
pub mod quantize;
mod session;
mod tensor;
pub mod threads;

pub use error::{Error, Result};
pub use external::ExternalData;
pub use mote_core;
pub use mote_core::{DType, IoInfo, Model, Plan, TensorView};
#[cfg(feature = "cuda")]
pub use mote_cuda;
pub use npy::{read_npy, read_npy_bytes, write_npy};
pub use provider::Provider;
pub use session::{
    check_declared, explain, fmt_declared, load_model, load_model_with, Session, SessionBuilder,
};
pub use tensor::{fmt_shape, Tensor};

/// A file-safe form of a tensor name: characters outside `[A-Za-z0-9._-]`
/// become `_` (`logits/Softmax:0` → `logits_Softmax_0`); an empty name, `.`
/// and `..` become `_`-prefixed so they stay plain file names.
pub fn safe_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    match s.as_str() {
        "" => "_".into(),
        "." | ".." => format!("_{s}"),
        _ => s,
    }
}

#[cfg(test)]
mod tests;
