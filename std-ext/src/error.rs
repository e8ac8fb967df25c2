//! The error type of mote-std: one line, with names.

use std::path::PathBuf;

/// Errors of file loading, npy handling, input checks and model runs.
///
/// Every variant displays as one line; model errors already carry the node
/// and tensor names (resolved with [`mote_core::Model::explain`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Import, planning or running failed (explained with node/tensor names).
    #[error("{0}")]
    Model(String),
    /// An npy file is malformed or holds an unsupported dtype.
    #[error("{0}")]
    Npy(String),
    /// A caller's input does not fit the model (name, dtype, shape).
    #[error("{0}")]
    Input(String),
    /// A session option this build cannot honour (a thread count).
    #[error("{0}")]
    Config(String),
    /// An execution provider this build or machine does not have (CUDA
    /// without the `cuda` feature, no driver, no such device), a bad
    /// provider name, or a provider failing at run time.
    #[error("{0}")]
    Provider(String),
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
