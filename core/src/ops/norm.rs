//! norm operators.

use crate::ops::OpDef;

/// Operators of this family.
pub const OPS: &[OpDef] = &[];
