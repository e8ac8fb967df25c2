//! # mote-core
//!
//! The no_std heart of mote, an ONNX inference runtime for the edge.
//!
//! Stages (each visible in the API, as in tract):
//! 1. **import** — [`Model::from_onnx`] turns ONNX bytes into a graph IR
//!    ([`Model`], [`Graph`]) with weights in aligned storage;
//! 2. **plan** — [`SessionBuilder`] binds input shapes and symbolic
//!    dimensions, infers every shape, folds constant subgraphs and places
//!    every tensor at a fixed offset of one arena ([`Plan`]);
//! 3. **run** — [`Session`] pairs the plan with a caller-owned `&mut [u8]`
//!    arena; [`Session::run`] performs no heap allocation.
//!
//! Without the `alloc` feature, the types, the integer kernels and
//! [`compiled`] models (`.mote` files written by `mote compile`) are built:
//! a firmware runs a model from flash with one static arena and no heap.
#![no_std]
#![deny(missing_docs)]
// No panics on any input (see README, Reliability): no unwrap / expect /
// panic!, and no unchecked `x[i]` / `x[a..b]` (a miss is an `Err` or, in a
// kernel, a refusal the caller turns into one).
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

#[cfg(feature = "alloc")]
extern crate alloc;

// Integer arithmetic: every `+ - * / %` on integers is checked, saturating
// or wrapping by name (clippy `arithmetic_side_effects`, denied per module
// below); an overflow of a size is an `Err`, never a wrap or a debug panic.

#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
pub mod compiled;
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
mod dtype;
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
mod error;
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
mod kern;
pub use kern::cpu;
pub use kern::par;
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
pub mod math;
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
pub mod tensor;

#[cfg(feature = "alloc")]
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
pub mod model;
#[cfg(feature = "alloc")]
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
pub mod onnx;
#[cfg(feature = "alloc")]
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
pub mod ops;
#[cfg(feature = "alloc")]
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
pub mod optimize;
#[cfg(feature = "alloc")]
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
pub mod plan;
#[cfg(feature = "alloc")]
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
pub mod planner;
#[cfg(feature = "alloc")]
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
pub mod provider;
#[cfg(feature = "alloc")]
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects))]
mod session;

pub use compiled::{CompiledModel, CompiledSession};
pub use dtype::{DType, Element};
pub use error::{checked_numel, Error, ErrorKind, NodeId, Result, TensorId};
pub use tensor::{TensorMut, TensorView};

#[cfg(feature = "alloc")]
pub use model::{Graph, Model};
#[cfg(feature = "alloc")]
pub use plan::{IoInfo, Plan, SessionBuilder};
#[cfg(feature = "alloc")]
pub use session::Session;

#[cfg(feature = "alloc")]
impl Model {
    /// Starts a session build (shape bindings, then [`SessionBuilder::plan`]).
    pub fn session_builder(&self) -> SessionBuilder<'_> {
        SessionBuilder::new(self)
    }
}
