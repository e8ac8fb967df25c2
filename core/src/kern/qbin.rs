//! Integer QLinearAdd / QLinearMul with numpy broadcasting.

use super::requant::{clamp, Requant, Requant2};
use super::{check_len, QInt};
use crate::error::Result;
use crate::tensor::{StridedIter, MAX_RANK};

/// Zero points and multipliers of `c = a ⊕ b` (only the one the op uses is
/// meaningful: `add` for QLinearAdd, `mul` for QLinearMul).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BinParams {
    pub za: i32,
    pub zb: i32,
    pub zc: i32,
    pub add: Requant2,
    pub mul: Requant,
}

/// Whether both operands are dense row-major over `shape` (no broadcast).
fn dense(shape: &[usize], strides: &[[usize; MAX_RANK]; 2]) -> bool {
    let mut want = 1usize;
    for (ax, &d) in shape.iter().enumerate().rev() {
        let (Some(&sa), Some(&sb)) = (strides[0].get(ax), strides[1].get(ax)) else {
            return false;
        };
        if d > 1 && (sa != want || sb != want) {
            return false;
        }
        want = want.saturating_mul(d);
    }
    true
}

/// `y[i] = a[ia] ⊕ b[ib]` over the broadcast `shape`, with element strides
/// `strides[0]` of a and `strides[1]` of b (0 on broadcast axes).
pub(crate) fn qbinary<T: QInt>(
    a: &[T],
    b: &[T],
    y: &mut [T],
    shape: &[usize],
    strides: [[usize; MAX_RANK]; 2],
    is_add: bool,
    p: &BinParams,
) -> Result<()> {
    let n: usize = shape.iter().product();
    check_len(y.len(), n)?;
    if n == 0 {
        return Ok(());
    }
    // The last element each operand reads must be in bounds.
    let last = |s: &[usize; MAX_RANK]| -> usize {
        shape
            .iter()
            .zip(s.iter())
            .map(|(&d, &st)| d.saturating_sub(1).saturating_mul(st))
            .fold(0usize, |acc, v| acc.saturating_add(v))
    };
    if last(&strides[0]) >= a.len() || last(&strides[1]) >= b.len() {
        return Err(crate::Error::new(crate::ErrorKind::Shape(
            "QLinearAdd / QLinearMul: broadcast reads past an input",
        )));
    }
    if cfg!(target_pointer_width = "64") && is_add && dense(shape, &strides) {
        // Same-shape Add (residual connections) on hosts: slices and a
        // branch-free rounding, the same values.
        if let (Some(a), Some(b)) = (a.get(..n), b.get(..n)) {
            for ((o, x), z) in y.iter_mut().zip(a).zip(b) {
                let v = p.add.apply_small(x.get() - p.za, z.get() - p.zb);
                *o = T::from_sat(clamp(v, p.zc, T::LO, T::HI));
            }
            return Ok(());
        }
    }
    for (o, [ia, ib]) in y.iter_mut().zip(StridedIter::new(shape, strides)) {
        let (Some(va), Some(vb)) = (a.get(ia), b.get(ib)) else {
            return Err(super::out_of_bounds());
        };
        let (da, db) = (va.get() - p.za, vb.get() - p.zb);
        let v = if is_add {
            p.add.apply(da, db)
        } else {
            p.mul.apply(da * db)
        };
        *o = T::from_sat(clamp(v, p.zc, T::LO, T::HI));
    }
    Ok(())
}
