//! Integer QLinearAdd / QLinearMul with numpy broadcasting.

#[cfg(target_arch = "x86_64")]
use super::cpu::Kernels;
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
            #[cfg(target_arch = "x86_64")]
            {
                let sel = super::qgemm::selection();
                if sel == (Kernels::Avx2Fma, true) {
                    // SAFETY: the VNNI selection is made only where the CPU
                    // has AVX-512 F, BW and VNNI (`cpu::enable_avx512_vnni`).
                    unsafe { dense_add_avx512(a, b, y, p) };
                    return Ok(());
                }
                if sel.0 == Kernels::Avx2Fma {
                    // SAFETY: `Avx2Fma` is selected only where the CPU has
                    // AVX2 (`cpu::enable_avx2_fma`).
                    unsafe { dense_add_avx2(a, b, y, p) };
                    return Ok(());
                }
            }
            dense_add(a, b, y, p);
            return Ok(());
        }
    }
    for (o, [ia, ib]) in y.iter_mut().zip(StridedIter::new(shape, strides)) {
        let (Some(va), Some(vb)) = (a.get(ia), b.get(ib)) else {
            return Err(super::out_of_bounds());
        };
        // 8-bit values less 8-bit zero points: |da|, |db| <= 255, so the
        // differences and the product (<= 65,025) are exact in i32.
        let (da, db) = (va.get().wrapping_sub(p.za), vb.get().wrapping_sub(p.zb));
        let v = if is_add {
            p.add.apply(da, db)
        } else {
            p.mul.apply(da.wrapping_mul(db))
        };
        *o = T::from_sat(clamp(v, p.zc, T::LO, T::HI));
    }
    Ok(())
}

/// `y = a + b` requantized, same-shape operands (the same values as
/// [`Requant2::apply`]).
#[inline(always)]
fn dense_add<T: QInt>(a: &[T], b: &[T], y: &mut [T], p: &BinParams) {
    for ((o, x), z) in y.iter_mut().zip(a).zip(b) {
        // |x - za|, |z - zb| <= 255: exact (as in `qbinary`).
        let v = p
            .add
            .apply_small(x.get().wrapping_sub(p.za), z.get().wrapping_sub(p.zb));
        *o = T::from_sat(clamp(v, p.zc, T::LO, T::HI));
    }
}

/// [`dense_add`] compiled for AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
unsafe fn dense_add_avx512<T: QInt>(a: &[T], b: &[T], y: &mut [T], p: &BinParams) {
    dense_add(a, b, y, p);
}

/// [`dense_add`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dense_add_avx2<T: QInt>(a: &[T], b: &[T], y: &mut [T], p: &BinParams) {
    dense_add(a, b, y, p);
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    /// The same-shape Add path, under every kernel selection of the CPU,
    /// against the per-element definition (`Requant2::apply`).
    #[test]
    fn dense_add_matches_the_definition() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for case in 0..40 {
            let n = 1 + (next() % 300) as usize;
            let a: Vec<i8> = (0..n).map(|_| next() as i8).collect();
            let b: Vec<i8> = (0..n).map(|_| next() as i8).collect();
            let ma = 0.01 + (next() % 1000) as f64 / 700.0;
            let mb = 0.01 + (next() % 1000) as f64 / 900.0;
            let p = BinParams {
                za: (next() % 256) as i32 - 128,
                zb: (next() % 256) as i32 - 128,
                zc: (next() % 256) as i32 - 128,
                add: Requant2::new(ma, mb).unwrap(),
                mul: Requant::new(0.5).unwrap(),
            };
            let want: Vec<i8> = a
                .iter()
                .zip(&b)
                .map(|(&x, &z)| {
                    let v = p.add.apply(x as i32 - p.za, z as i32 - p.zb);
                    clamp(v, p.zc, -128, 127) as i8
                })
                .collect();
            let mut strides = [[0usize; MAX_RANK]; 2];
            strides[0][0] = 1;
            strides[1][0] = 1;
            for sel in super::super::qgemm::testing::selections() {
                let _g = super::super::qgemm::testing::with(sel);
                let mut y = alloc::vec![0i8; n];
                qbinary(&a, &b, &mut y, &[n], strides, true, &p).unwrap();
                assert_eq!(y, want, "{sel:?} case {case}");
            }
        }
    }
}
