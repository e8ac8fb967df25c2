//! The one error type of mote-core.
//!
//! Errors are small `Copy` values with no heap data, so they work without
//! `alloc`. They name the node and tensor by index; [`crate::Model::explain`]
//! resolves those to names (op type, node name, opset, tensor name).

use crate::DType;

/// Index of a node in [`crate::Graph::nodes`] (the order of the ONNX file).
pub type NodeId = u32;
/// Index of a tensor in [`crate::Graph::tensors`].
pub type TensorId = u32;

/// What went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ErrorKind {
    /// The bytes are not a valid ONNX protobuf (truncated or not ONNX).
    Decode,
    /// The model is structurally invalid; the text says how.
    Invalid(&'static str),
    /// No kernel for this node's op type at its opset.
    UnsupportedOp {
        /// Opset version of the node's domain.
        opset: i64,
    },
    /// A dtype this op (or mote) does not handle.
    UnsupportedDType {
        /// Where the dtype appeared.
        what: &'static str,
        /// ONNX type code.
        code: i32,
    },
    /// A feature of an op that is valid ONNX but not implemented.
    Unsupported(&'static str),
    /// A tensor had a different dtype than required.
    DTypeMismatch {
        /// Required dtype.
        expected: DType,
        /// Actual dtype.
        got: DType,
    },
    /// A shape is wrong; the text says which rule failed.
    Shape(&'static str),
    /// Wrong number of dimensions.
    Rank {
        /// Expected rank.
        expected: usize,
        /// Actual rank.
        got: usize,
    },
    /// One dimension has the wrong size.
    Dim {
        /// Axis index.
        axis: usize,
        /// Expected size.
        expected: u64,
        /// Actual size.
        got: u64,
    },
    /// An element count does not match (e.g. data length vs shape).
    Len {
        /// Expected number of elements or bytes.
        expected: u64,
        /// Actual number.
        got: u64,
    },
    /// A tensor is used but never produced, given or initialized.
    MissingTensor,
    /// A required input of a node is absent.
    MissingInput {
        /// Input position.
        index: usize,
    },
    /// The graph has a cycle through this node.
    Cycle,
    /// An attribute is missing, of the wrong type or out of range.
    Attribute {
        /// Attribute name.
        name: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A size computation overflowed (dims whose product exceeds `usize`).
    Overflow,
    /// A symbolic dimension or shape binding is wrong.
    Binding(&'static str),
    /// No graph input or output of this name / index.
    UnknownName,
    /// The caller's arena is too small for the plan.
    ArenaTooSmall {
        /// Bytes the plan needs (including alignment slack).
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// The plan exceeds a memory budget the caller set.
    OverBudget {
        /// Bytes needed.
        needed: usize,
        /// Budget.
        budget: usize,
    },
    /// A compiled model (`.mote`) is corrupt or malformed; the text says how.
    BadFile(&'static str),
    /// A compiled model was written for another format version.
    Version {
        /// The version this build reads.
        supported: u16,
        /// The file's version.
        got: u16,
    },
    /// A `Loop` ran into the session's iteration bound
    /// ([`crate::SessionBuilder::max_loop_iterations`]).
    LoopLimit {
        /// The bound.
        limit: u64,
    },
    /// The heap refused an allocation (a model's weights or a constant
    /// folded at build time); nothing was aborted.
    Alloc {
        /// Bytes asked for.
        bytes: usize,
    },
    /// A bug in mote: an internal invariant failed (please report).
    Internal(&'static str),
}

/// An error of mote-core: what, and where (node and tensor, by index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Error {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Node where it happened, if any.
    pub node: Option<NodeId>,
    /// Tensor concerned, if any.
    pub tensor: Option<TensorId>,
}

/// Result with [`Error`].
pub type Result<T, E = Error> = core::result::Result<T, E>;

impl Error {
    /// An error with no location yet.
    pub const fn new(kind: ErrorKind) -> Self {
        Error {
            kind,
            node: None,
            tensor: None,
        }
    }
    /// An internal invariant broke (a bug of mote, not of the model): the
    /// text names the op and what was out of range.
    pub(crate) const fn internal(what: &'static str) -> Self {
        Error::new(ErrorKind::Internal(what))
    }
    /// Sets the node (keeps an inner, more precise one).
    pub const fn at_node(mut self, node: NodeId) -> Self {
        if self.node.is_none() {
            self.node = Some(node);
        }
        self
    }
    /// Sets the tensor (keeps an inner, more precise one).
    pub const fn at_tensor(mut self, tensor: TensorId) -> Self {
        if self.tensor.is_none() {
            self.tensor = Some(tensor);
        }
        self
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Self {
        Error::new(kind)
    }
}

impl core::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The kinds that are text alone, as (prefix, detail): two
        // `write_str`s instead of a `write!` each (firmware prints these).
        let (text, detail) = match *self {
            ErrorKind::Decode => (
                "not a valid ONNX model (protobuf decode failed: truncated or not ONNX)",
                "",
            ),
            ErrorKind::Invalid(s) => ("invalid model: ", s),
            ErrorKind::Unsupported(s) => ("unsupported: ", s),
            ErrorKind::Shape(s) => ("shape error: ", s),
            ErrorKind::MissingTensor => (
                "tensor is used but never produced, initialized or given as input",
                "",
            ),
            ErrorKind::Cycle => ("graph has a cycle", ""),
            ErrorKind::Overflow => ("size overflow (dimensions too large)", ""),
            ErrorKind::Binding(s) => ("binding error: ", s),
            ErrorKind::UnknownName => ("no such input or output", ""),
            ErrorKind::BadFile(s) => ("bad compiled model: ", s),
            ErrorKind::Internal(s) => ("internal error (a bug in mote): ", s),
            _ => return self.fmt_numbers(f),
        };
        f.write_str(text)?;
        f.write_str(detail)
    }
}

impl ErrorKind {
    /// The kinds that carry numbers or dtypes.
    fn fmt_numbers(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            ErrorKind::UnsupportedOp { opset } => {
                write!(f, "unsupported operator at opset {opset}")
            }
            ErrorKind::UnsupportedDType { what, code } => {
                write!(f, "unsupported dtype {} for {what}", DType::onnx_name(code))
            }
            ErrorKind::DTypeMismatch { expected, got } => {
                write!(f, "dtype mismatch: expected {expected}, got {got}")
            }
            ErrorKind::Rank { expected, got } => {
                write!(f, "rank mismatch: expected {expected}, got {got}")
            }
            ErrorKind::Dim {
                axis,
                expected,
                got,
            } => {
                write!(
                    f,
                    "dimension {axis} mismatch: expected {expected}, got {got}"
                )
            }
            ErrorKind::Len { expected, got } => {
                write!(f, "length mismatch: expected {expected}, got {got}")
            }
            ErrorKind::MissingInput { index } => write!(f, "required input {index} is missing"),
            ErrorKind::Attribute { name, problem } => write!(f, "attribute '{name}': {problem}"),
            ErrorKind::ArenaTooSmall { needed, got } => {
                write!(f, "arena too small: needs {needed} bytes, got {got}")
            }
            ErrorKind::OverBudget { needed, budget } => {
                write!(
                    f,
                    "memory budget exceeded: needs {needed} bytes, budget {budget}"
                )
            }
            ErrorKind::Version { supported, got } => write!(
                f,
                "compiled model format version {got}, this build reads version {supported} (recompile with `mote compile`)"
            ),
            ErrorKind::LoopLimit { limit } => write!(
                f,
                "Loop ran past the session's bound of {limit} iterations (max_loop_iterations)"
            ),
            ErrorKind::Alloc { bytes } => write!(f, "out of memory: could not allocate {bytes} bytes"),
            // Written by `Display` (listed, not `_`: a new kind must be
            // placed in one of the two).
            ErrorKind::Decode
            | ErrorKind::Invalid(_)
            | ErrorKind::Unsupported(_)
            | ErrorKind::Shape(_)
            | ErrorKind::MissingTensor
            | ErrorKind::Cycle
            | ErrorKind::Overflow
            | ErrorKind::Binding(_)
            | ErrorKind::UnknownName
            | ErrorKind::BadFile(_)
            | ErrorKind::Internal(_) => Ok(()),
        }
    }
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.kind.fmt(f)?;
        if let Some(n) = self.node {
            write!(f, " (node #{n})")?;
        }
        if let Some(t) = self.tensor {
            write!(f, " (tensor #{t})")?;
        }
        Ok(())
    }
}

impl core::error::Error for Error {}

/// Checked product of dimensions.
pub fn checked_numel(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or(Error::new(ErrorKind::Overflow))
}
