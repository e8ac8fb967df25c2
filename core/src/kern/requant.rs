//! Fixed-point requantization, shared by every integer kernel.
//!
//! An integer kernel accumulates `Σ (x - zx)(w - zw)` in i32; the real
//! result is `acc · sx · sw`, and the quantized output is
//! `round(acc · sx · sw / sy) + zy`. The real multiplier
//! `m = sx · sw / sy` is fixed at prepare time as an integer `mult` in
//! `[2^30, 2^31)` and a right shift: `m ≈ mult · 2^-shift` (relative error
//! ≤ 2^-31), as TFLite and CMSIS-NN do. The kernel then needs one
//! 32 × 32 → 64-bit multiply and a rounding shift per output, no float.
//!
//! Rounding is half to even, like onnxruntime's QuantizeLinear (`nearbyint`)
//! which is the reference of a QDQ model, rather than TFLite's half away
//! from zero: at an exact tie the two differ by one LSB.
//!
//! All arithmetic saturates, so no input can overflow.

use crate::error::{Error, ErrorKind, Result};

/// A real multiplier `m > 0` as `mult · 2^-shift`, or (made by
/// [`Requant::f32_product`]) an f32 multiplier applied in f32 arithmetic as
/// onnxruntime's QLinearConv / QLinearMatMul do.
///
/// `repr(C)` of two `i32` so that per-channel arrays of them are read in
/// place from a compiled model (see [`Requant::is_valid`]). The f32 form
/// keeps the multiplier's bits in `mult` and [`F32_SHIFT`] in `shift`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Requant {
    mult: i32,
    shift: i32,
}

// SAFETY: two i32 fields, `repr(C)`, no padding; every bit pattern is an
// i32 pair. Values read from a file are checked with `is_valid` before use.
unsafe impl bytemuck::Zeroable for Requant {}
// SAFETY: as above (Copy, 'static, no padding, no invalid bit patterns).
unsafe impl bytemuck::Pod for Requant {}

/// Frexp for positive finite doubles: `m = f · 2^e`, `f` in `[0.5, 1)`.
fn frexp(m: f64) -> (f64, i32) {
    let bits = m.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    if exp == 0 {
        // Subnormal: scale up first.
        let (f, e) = frexp(m * (1u64 << 54) as f64);
        // Exponents of finite doubles: |e| < 1100, no wrap.
        return (f, e.wrapping_sub(54));
    }
    let f = f64::from_bits((bits & !(0x7ffu64 << 52)) | (1022u64 << 52));
    (f, exp.wrapping_sub(1022))
}

/// `shift` of a [`Requant`] in f32 form (`mult` holds the f32's bits).
const F32_SHIFT: i32 = -1;

/// 1.5 · 2^23: adding it to an f32 below 2^22 in magnitude rounds the value
/// to an integer, half to even, held in the low bits of the sum (the trick
/// of onnxruntime's MLAS requantization).
#[cfg(feature = "qoperator")]
const MAGIC: f32 = 12_582_912.0;

impl Requant {
    /// The multiplier `m` (an f32, finite and > 0) applied as onnxruntime's
    /// MLAS requantization does (QLinearConv, QLinearMatMul, QGemm):
    /// `round_half_even(f32(acc) · m)`, the product rounded to f32 first.
    /// The fixed-point form of the same `m` rounds the exact product, and
    /// differs from this one where the f32 product is a tie that the exact
    /// one is not (about one output in 10^5 on MobileNetV1, which then
    /// cascades through the layers after it).
    #[cfg(feature = "qoperator")]
    pub fn f32_product(m: f32) -> Result<Self> {
        if !(m.is_finite() && m > 0.0) {
            return Err(Error::new(ErrorKind::Invalid(
                "requantization multiplier must be finite and > 0 (check the scales)",
            )));
        }
        Ok(Requant {
            mult: m.to_bits() as i32,
            shift: F32_SHIFT,
        })
    }

    /// Whether this is the f32 form ([`Requant::f32_product`]), which
    /// needs mote-core's feature `qoperator`.
    pub fn is_f32(&self) -> bool {
        self.shift == F32_SHIFT
    }

    /// The multiplier `m`. Errs unless `m` is finite, positive and below
    /// 2^31; multipliers below 2^-62 round every i32 accumulator to 0 and
    /// are kept as 0.
    pub fn new(m: f64) -> Result<Self> {
        if !(m.is_finite() && m > 0.0) {
            return Err(Error::new(ErrorKind::Invalid(
                "requantization multiplier must be finite and > 0 (check the scales)",
            )));
        }
        let (f, e) = frexp(m);
        // f in [0.5, 1): mult = round(f · 2^31) in [2^30, 2^31].
        let mut mult = libm::round(f * (1u64 << 31) as f64) as i64;
        // mult in [2^30, 2^31]; 2^31 is renormalized below, so it fits i32.
        let mut e = e;
        // |e| < 1100 (a double's exponent): no wrap below.
        if mult == 1i64 << 31 {
            mult >>= 1;
            e = e.wrapping_add(1);
        }
        let shift = 31i32.wrapping_sub(e);
        if shift < 0 {
            return Err(Error::new(ErrorKind::Invalid(
                "requantization multiplier >= 2^31 (scales out of range)",
            )));
        }
        if shift > 62 {
            return Ok(Requant { mult: 0, shift: 0 });
        }
        Ok(Requant {
            mult: mult as i32,
            shift,
        })
    }

    /// Whether the fields are in the range [`Requant::new`] produces
    /// (`mult` in `[0, 2^31)`, `shift` in `[0, 62]`): checked on every
    /// multiplier read from a compiled model, so `apply` cannot overflow a
    /// shift.
    pub fn is_valid(&self) -> bool {
        if self.is_f32() {
            let m = f32::from_bits(self.mult as u32);
            return cfg!(feature = "qoperator") && m.is_finite() && m > 0.0;
        }
        self.mult >= 0 && (0..=62).contains(&self.shift)
    }

    /// `round_half_even(acc · m)`.
    #[inline]
    pub fn apply(&self, acc: i32) -> i64 {
        #[cfg(feature = "qoperator")]
        if self.is_f32() {
            return self.apply_f32(acc);
        }
        // |acc|, |mult| < 2^31: the product is exact in i64.
        let (p, shift) = (
            (acc as i64).wrapping_mul(self.mult as i64),
            self.shift as u32,
        );
        if (32..=62).contains(&shift) {
            // Every multiplier below 1/2 (all the usual ones).
            return i64::from(round_shift_hi(p, shift));
        }
        round_shift_out_of_line(p, shift)
    }

    /// `clamp(apply(acc) + zero_point, lo, hi)` ([`clamp`]), in 32-bit
    /// arithmetic when the shift is 32 or more (the rounded value then
    /// lies within ±2^30): what the 32-bit kernels store per output.
    #[inline(always)]
    pub(crate) fn apply_clamp(&self, acc: i32, zero_point: i32, lo: i32, hi: i32) -> i32 {
        let shift = self.shift as u32;
        if (32..=62).contains(&shift) {
            let q = round_shift_hi((acc as i64).wrapping_mul(self.mult as i64), shift);
            // As `clamp`: a sum past the i32 range saturates, and then
            // clamps to the same bound as the i64 sum would.
            return q.saturating_add(zero_point).max(lo).min(hi);
        }
        clamp(self.apply(acc), zero_point, lo, hi)
    }

    /// `clamp(round_half_even((bias + acc) · m) + zy, lo, hi)` for a row of
    /// sums sharing one multiplier (`acc` wraps like the accumulators),
    /// into `out` (up to the shorter of the two). The same values as
    /// [`Requant::apply`] and [`clamp`] per element, computed so that the
    /// loop vectorizes: with `|p| < 2^62`, `p + 2^63` is a u64 whose floor
    /// shift keeps the parity of `floor(p / 2^shift)` (2^63 is a multiple of
    /// 2^shift), so the branch-free rounding `floor((p + half - 1 + q_odd)
    /// / 2^shift)` (`q_odd` the low bit of `floor(p / 2^shift)`) runs on
    /// logical shifts. (Microcontrollers keep [`Requant::apply`], whose
    /// instruction counts README reports.)
    #[inline(always)]
    pub(crate) fn apply_row<Y: crate::kern::QInt>(
        &self,
        bias: i32,
        acc: &[i32],
        out: &mut [Y],
        zy: i32,
        lo: i32,
        hi: i32,
    ) {
        #[cfg(feature = "qoperator")]
        if self.is_f32() {
            return self.apply_row_f32(bias, acc, out, zy, lo, hi);
        }
        #[cfg(target_arch = "x86_64")]
        if crate::kern::cpu::avx512_vnni()
            // SAFETY: `avx512_vnni` holds only where the CPU has AVX-512 F
            // and BW (`cpu::enable_avx512_vnni`'s contract).
            && unsafe { self.apply_row_avx512(bias, acc, out, zy, lo, hi) }
        {
            return;
        }
        self.apply_row_loop(bias, acc, out, zy, lo, hi);
    }

    /// [`Requant::apply_row`]'s portable loop (fixed-point form).
    #[inline(always)]
    fn apply_row_loop<Y: crate::kern::QInt>(
        &self,
        bias: i32,
        acc: &[i32],
        out: &mut [Y],
        zy: i32,
        lo: i32,
        hi: i32,
    ) {
        let (mult, shift) = (self.mult as i64, self.shift as u32);
        if shift == 0 || shift > 62 {
            for (y, &a) in out.iter_mut().zip(acc) {
                *y = Y::from_sat(clamp(self.apply(bias.wrapping_add(a)), zy, lo, hi));
            }
            return;
        }
        let (zy, lo, hi) = (zy as i64, lo as i64, hi as i64);
        // shift in [1, 62]; |p| < 2^62 (i32 times a multiplier below
        // 2^31), so u + half_m1 + odd < 2^64 and every operation below is
        // exact: wrapping by name, not by overflow.
        let half_m1 = (1u64 << shift.wrapping_sub(1)).wrapping_sub(1);
        let off = 1i64 << 63u32.wrapping_sub(shift);
        for (y, &a) in out.iter_mut().zip(acc) {
            let p = (bias.wrapping_add(a) as i64).wrapping_mul(mult);
            let u = (p as u64) ^ (1u64 << 63);
            let odd = (u >> shift) & 1;
            let v = (u.wrapping_add(half_m1).wrapping_add(odd) >> shift) as i64;
            let v = v.wrapping_sub(off).wrapping_add(zy);
            *y = Y::from_sat(v.max(lo).min(hi) as i32);
        }
    }

    /// [`Requant::apply_row`] with AVX-512 for 8-bit outputs and shifts of
    /// 32 to 62 (every usual multiplier), 16 outputs per step: the 64-bit
    /// products of the even and of the odd lanes (`vpmuldq`), rounded half
    /// to even as the loop of `apply_row` does but with arithmetic shifts
    /// (`floor((p + half - 1 + q_odd) / 2^shift)`, `q_odd` the low bit of
    /// `p >> shift`), and the rounded values (within ±2^30 for these
    /// shifts, so their low 32 bits are them) merged back into 16 i32
    /// lanes to be offset, clamped and narrowed there (the loop's 64-bit
    /// lanes take 8 outputs per step). `false` (nothing written) for other
    /// shifts, outputs or bounds.
    ///
    /// # Safety
    /// The CPU must support AVX-512 F and BW.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn apply_row_avx512<Y: crate::kern::QInt>(
        &self,
        bias: i32,
        acc: &[i32],
        out: &mut [Y],
        zy: i32,
        lo: i32,
        hi: i32,
    ) -> bool {
        use core::arch::x86_64::*;
        let shift = self.shift as u32;
        // Bounds inside Y's range: clamping to them is `from_sat` too.
        if size_of::<Y>() != 1
            || !(32..=62).contains(&shift)
            || lo < Y::LO
            || hi > Y::HI
            || lo > hi
            || !(-(1 << 29)..=1 << 29).contains(&zy)
        {
            return false;
        }
        let n = acc.len().min(out.len());
        // |p| < 2^62 (an i32 times a multiplier below 2^31): the sums
        // below do not overflow, the quotient lies within ±2^30, and so
        // does its sum with zy (|zy| <= 2^29, checked above).
        let half_m1 = _mm512_set1_epi64((1i64 << shift.wrapping_sub(1)).wrapping_sub(1));
        let one = _mm512_set1_epi64(1);
        let sh = _mm_cvtsi32_si128(shift as i32);
        let (bv, mv, zv) = (
            _mm512_set1_epi32(bias),
            _mm512_set1_epi32(self.mult),
            _mm512_set1_epi32(zy),
        );
        let (lov, hiv) = (_mm512_set1_epi32(lo), _mm512_set1_epi32(hi));
        // p >> shift in each 64-bit lane (Miri lacks `vpsraq`: there, the
        // same shifts lane by lane).
        let sra = |p: __m512i| {
            #[cfg(miri)]
            {
                let _ = sh;
                // SAFETY: both types are 64 bytes of plain integers.
                let l: [i64; 8] = unsafe { core::mem::transmute(p) };
                // SAFETY: as above.
                unsafe { core::mem::transmute::<[i64; 8], __m512i>(l.map(|v| v >> shift)) }
            }
            #[cfg(not(miri))]
            _mm512_sra_epi64(p, sh)
        };
        // The rounded quotient of each 64-bit lane's product.
        let round = |p: __m512i| {
            let odd = _mm512_and_si512(sra(p), one);
            sra(_mm512_add_epi64(_mm512_add_epi64(p, half_m1), odd))
        };
        let (ap, yp) = (acc.as_ptr(), out.as_mut_ptr().cast::<i8>());
        let mut i = 0usize;
        while i < n {
            let left = n.wrapping_sub(i);
            let k: u16 = if left >= 16 {
                u16::MAX
            } else {
                (1u16 << left).wrapping_sub(1)
            };
            // SAFETY: the lanes of `k` lie below n <= acc.len(), out.len()
            // (masked-off lanes are neither read nor written); Y is one byte.
            unsafe {
                let a = _mm512_add_epi32(_mm512_maskz_loadu_epi32(k, ap.add(i)), bv);
                let even = round(_mm512_mul_epi32(a, mv));
                let odd = round(_mm512_mul_epi32(_mm512_srli_epi64::<32>(a), mv));
                // Odd lanes take the low dword of odd's 64-bit lanes.
                let v = _mm512_mask_shuffle_epi32::<0xA0>(even, 0xAAAA, odd);
                let v = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(v, zv), lov), hiv);
                let bytes = _mm512_cvtepi32_epi8(v);
                if left >= 16 {
                    _mm_storeu_si128(yp.add(i).cast(), bytes);
                } else {
                    // The masked store of 64 bytes: `k` keeps the row's.
                    let wide = _mm512_castsi128_si512(bytes);
                    _mm512_mask_storeu_epi8(yp.add(i), u64::from(k), wide);
                }
            }
            i = i.wrapping_add(16);
        }
        true
    }

    /// [`Requant::apply`] of the f32 form, out of line: the fixed-point
    /// path, which every QDQ model and every firmware runs, stays as small
    /// as it was.
    #[cfg(feature = "qoperator")]
    #[cold]
    #[inline(never)]
    fn apply_f32(&self, acc: i32) -> i64 {
        let m = f32::from_bits(self.mult as u32);
        // Past i64 (a huge m), `as` saturates; the callers clamp.
        libm::rintf(acc as f32 * m) as i64
    }

    /// [`Requant::apply_row`] of the f32 form (QOperator models), out of
    /// line for the same reason as [`Requant::apply_f32`].
    #[cfg(feature = "qoperator")]
    #[inline(never)]
    fn apply_row_f32<Y: crate::kern::QInt>(
        &self,
        bias: i32,
        acc: &[i32],
        out: &mut [Y],
        zy: i32,
        lo: i32,
        hi: i32,
    ) {
        let m = f32::from_bits(self.mult as u32);
        // As MLAS: the product clamped in f32 to the bounds less the
        // zero point, rounded by MAGIC (exact: the bounds of 8- and
        // 16-bit outputs lie well within 2^22 of the zero point).
        let (flo, fhi) = (
            i64::from(lo).wrapping_sub(i64::from(zy)),
            i64::from(hi).wrapping_sub(i64::from(zy)),
        );
        let small = |v: i64| v.unsigned_abs() < 1 << 22;
        if small(flo) && small(fhi) && lo <= hi {
            let (flo, fhi) = (flo as f32, fhi as f32);
            let magic_bits = MAGIC.to_bits() as i32;
            for (y, &a) in out.iter_mut().zip(acc) {
                let v = (bias.wrapping_add(a) as f32 * m).max(flo).min(fhi);
                // v + MAGIC in [2^23, 2^24): its low bits hold v.
                let q = ((v + MAGIC).to_bits() as i32).wrapping_sub(magic_bits);
                *y = Y::from_sat(q.wrapping_add(zy));
            }
        } else {
            for (y, &a) in out.iter_mut().zip(acc) {
                *y = Y::from_sat(clamp(self.apply_f32(bias.wrapping_add(a)), zy, lo, hi));
            }
        }
    }

    /// `round_half_even(sum · m / count)` for averages (`count > 0`;
    /// `count <= 0` gives 0).
    #[inline]
    pub fn apply_div(&self, sum: i64, count: i64) -> i64 {
        if count <= 0 {
            return 0;
        }
        #[cfg(feature = "qoperator")]
        if self.is_f32() {
            return self.apply_div_f32(sum, count);
        }
        // |sum| < 2^63, mult < 2^31: exact in i128.
        let num = (sum as i128).wrapping_mul(self.mult as i128);
        let den = (count as i128) << (self.shift as u32);
        div_round_half_even(num, den)
    }
}

#[cfg(feature = "qoperator")]
impl Requant {
    /// [`Requant::apply_div`] of the f32 form (no kernel makes one today).
    #[cold]
    #[inline(never)]
    fn apply_div_f32(&self, sum: i64, count: i64) -> i64 {
        let m = f32::from_bits(self.mult as u32);
        libm::rint(sum as f64 * f64::from(m) / count as f64) as i64
    }
}

/// Two multipliers over one shift, for `round(da · ma + db · mb)`
/// (QLinearAdd-style sums of differently scaled inputs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requant2 {
    ma: i64,
    mb: i64,
    shift: u32,
}

impl Requant2 {
    /// The raw fields `(ma, mb, shift)`, for serialization.
    pub(crate) fn to_parts(self) -> (i64, i64, u32) {
        (self.ma, self.mb, self.shift)
    }

    /// From raw fields; `None` unless they are in the range
    /// [`Requant2::new`] produces (`|m| <= 2^32`, `shift <= 62`).
    pub(crate) fn from_parts(ma: i64, mb: i64, shift: u32) -> Option<Self> {
        let ok = |m: i64| (0..=1i64 << 32).contains(&m);
        (ok(ma) && ok(mb) && shift <= 62).then_some(Requant2 { ma, mb, shift })
    }
}

impl Requant2 {
    /// Multipliers `ma`, `mb` (each finite, ≥ 0, below 2^31; not both 0).
    pub fn new(ma: f64, mb: f64) -> Result<Self> {
        let ok = |m: f64| m.is_finite() && m >= 0.0 && m < (1u64 << 31) as f64;
        if !(ok(ma) && ok(mb)) || (ma == 0.0 && mb == 0.0) {
            return Err(Error::new(ErrorKind::Invalid(
                "requantization multipliers must be finite, >= 0 and < 2^31",
            )));
        }
        // Common exponent from the larger multiplier; both get 31 bits
        // relative to it.
        let big = if ma > mb { ma } else { mb };
        let (_, e) = frexp(big);
        let shift = 31i32.wrapping_sub(e).clamp(0, 62) as u32;
        let scale = libm::ldexp(1.0, shift as i32);
        Ok(Requant2 {
            ma: libm::round(ma * scale) as i64,
            mb: libm::round(mb * scale) as i64,
            shift,
        })
    }

    /// `round_half_even(da · ma + db · mb)`.
    #[inline]
    pub fn apply(&self, da: i32, db: i32) -> i64 {
        let p = (da as i64)
            .saturating_mul(self.ma)
            .saturating_add((db as i64).saturating_mul(self.mb));
        round_shift(p, self.shift)
    }
}

impl Requant2 {
    /// [`Requant2::apply`] for 8-bit differences (`|da|, |db| <= 2^16`, so
    /// `|p| < 2^50` and nothing saturates), with the branch-free rounding of
    /// [`Requant::apply_row`].
    #[inline(always)]
    pub(crate) fn apply_small(&self, da: i32, db: i32) -> i64 {
        let (da, db) = (
            da.clamp(-65536, 65536) as i64,
            db.clamp(-65536, 65536) as i64,
        );
        // |d| <= 2^16, m <= 2^32 (from_parts / new): |p| < 2^50, and the
        // rounding below is exact as in `Requant::apply_row`.
        let p = da
            .wrapping_mul(self.ma)
            .wrapping_add(db.wrapping_mul(self.mb));
        let shift = self.shift;
        if shift == 0 {
            return p;
        }
        let u = (p as u64) ^ (1u64 << 63);
        let odd = (u >> shift) & 1;
        let half_m1 = (1u64 << shift.wrapping_sub(1)).wrapping_sub(1);
        let v = (u.wrapping_add(half_m1).wrapping_add(odd) >> shift) as i64;
        v.wrapping_sub(1i64 << 63u32.wrapping_sub(shift))
    }
}

/// `round_half_even(p / 2^shift)`.
#[inline]
fn round_shift(p: i64, shift: u32) -> i64 {
    if shift == 0 {
        return p;
    }
    // shift in [1, 63] (callers: <= 62): q = floor(p / 2^shift), so
    // q << shift <= p, r in [0, 2^shift) and q + 1 fit.
    let q = p >> shift; // floor
    let r = p.wrapping_sub(q << shift); // in [0, 2^shift)
    let half = 1i64 << shift.wrapping_sub(1);
    if r > half || (r == half && q & 1 == 1) {
        q.wrapping_add(1)
    } else {
        q
    }
}

/// [`round_shift`] not inlined: [`Requant::apply`]'s rare path (multipliers
/// of 1/2 and more), kept out of the many kernels that inline `apply`.
#[inline(never)]
fn round_shift_out_of_line(p: i64, shift: u32) -> i64 {
    round_shift(p, shift)
}

/// [`round_shift`] for `shift` in `[32, 62]` and `|p| < 2^62` on 32-bit
/// words (a Cortex-M has no 64-bit shifter: the generic version's two
/// variable 64-bit shifts cost about 40 instructions there): the floor is
/// the high word shifted by `shift - 32`, and the remainder, the masked
/// high word over the low word, is compared with half as one u64.
#[inline]
fn round_shift_hi(p: i64, shift: u32) -> i32 {
    let t = shift.wrapping_sub(32) & 31;
    let (hi, lo) = ((p >> 32) as i32, p as u32);
    let q = hi >> t;
    let r_hi = (hi as u32) & (1u32 << t).wrapping_sub(1);
    let r = (u64::from(r_hi) << 32) | u64::from(lo);
    let half = if t == 0 {
        1u64 << 31
    } else {
        u64::from(1u32 << t.wrapping_sub(1)) << 32
    };
    let up = r > half || (r == half && q & 1 == 1);
    // |p| < 2^62: |q| < 2^30, so q + 1 does not overflow.
    q.wrapping_add(i32::from(up))
}

/// [`round_shift`] without branches (so that a row of outputs vectorizes
/// and an unpredictable tie test costs nothing), for `|p| < 2^62` and
/// `shift <= 62`: `floor((p + half - 1 + q_odd) / 2^shift)` where `q_odd`
/// is the low bit of `floor(p / 2^shift)`, which rounds up exactly when the
/// remainder is above half, or at half with `q` odd.
#[cfg(test)]
fn round_shift_small(p: i64, shift: u32) -> i64 {
    if shift == 0 {
        return p;
    }
    let half = 1i64 << (shift - 1);
    let odd = (p >> shift) & 1;
    (p + (half - 1) + odd) >> shift
}

/// `round_half_even(num / den)` for `den > 0`.
#[inline]
fn div_round_half_even(num: i128, den: i128) -> i64 {
    if den <= 0 {
        // Not reached (callers pass den > 0); no division by zero either.
        return 0;
    }
    let q = num.div_euclid(den);
    let r = num.rem_euclid(den); // in [0, den)
                                 // r < den < 2^126 (a count shifted by at most 62), so 2r and q + 1
                                 // fit in i128.
    let twice = r.wrapping_mul(2);
    let q = if twice > den || (twice == den && q & 1 == 1) {
        q.wrapping_add(1)
    } else {
        q
    };
    q.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// Saturates a requantized value plus zero point into `[lo, hi]` (the
/// output type's range, narrowed by a fused Relu / Clip).
#[inline]
pub fn clamp(v: i64, zero_point: i32, lo: i32, hi: i32) -> i32 {
    // `max`/`min` rather than `Ord::clamp`, which panics when lo > hi
    // (validation keeps lo <= hi; this keeps the kernels panic-free).
    v.saturating_add(zero_point as i64)
        .max(lo as i64)
        .min(hi as i64) as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::rnd;
    use alloc::{vec, vec::Vec};

    fn reference(acc: i32, m: f64) -> i64 {
        libm::rint(acc as f64 * m) as i64
    }

    #[test]
    fn matches_float_rounding_off_ties() {
        let (ms, accs) = (rnd(20_000, 7), rnd(20_000, 8));
        for (&u, &a) in ms.iter().zip(&accs) {
            let m = libm::exp2(u as f64 * 12.0 - 8.0);
            let acc = (a * 2.0e6) as i32;
            let r = Requant::new(m).unwrap();
            let exact = acc as f64 * m;
            let frac = exact - libm::floor(exact);
            if (frac - 0.5).abs() < 1e-6 {
                continue; // a near-tie: either side is within the rule
            }
            assert_eq!(r.apply(acc), reference(acc, m), "acc {acc} m {m}");
        }
    }

    /// `(p, shift)` cases for the rounding variants: per shift, `n`
    /// values, mostly ties and their neighbours, then arbitrary ones (all
    /// with `|p| < 2^62`), of both signs.
    fn shift_cases(
        seed: u64,
        shifts: core::ops::RangeInclusive<u32>,
        n: usize,
    ) -> alloc::vec::Vec<(i64, u32)> {
        let mut seed = seed;
        let mut out = alloc::vec::Vec::new();
        for shift in shifts {
            for i in 0..n {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let p = match i % 4 {
                    0 | 1 if shift > 0 => {
                        let q = (seed >> 20) as i64 % (1i64 << (62 - shift).min(40));
                        let r = (1i64 << (shift - 1)) + (i % 3) as i64 - 1;
                        q * (1i64 << shift) + r
                    }
                    _ => (seed as i64) >> 2,
                };
                out.push((if i % 2 == 0 { p } else { -p }, shift));
            }
        }
        out
    }

    #[test]
    fn branch_free_rounding_is_the_branchy_one() {
        for (p, shift) in shift_cases(3, 0..=62, crate::kern::count(4000, 200)) {
            assert_eq!(
                round_shift_small(p, shift),
                round_shift(p, shift),
                "{p} >> {shift}"
            );
        }
    }

    /// The AVX-512 row (16 lanes, masked tails) against the portable loop:
    /// rows of 0 to 40 sums (full i32 range, the extremes included),
    /// biases, shifts from 32 to 62, zero points and bounds of both output
    /// types, fused-activation bounds among them.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_row_is_the_loop() {
        if !(std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw"))
        {
            std::eprintln!("skipped: no AVX-512 F/BW on this CPU");
            return;
        }
        extern crate std;
        fn check<Y: crate::kern::QInt + PartialEq + core::fmt::Debug>(
            r: &Requant,
            bias: i32,
            acc: &[i32],
            zy: i32,
            lo: i32,
            hi: i32,
        ) -> bool {
            let mut want = vec![Y::default(); acc.len() + 3];
            let mut got = want.clone();
            r.apply_row_loop(bias, acc, &mut want, zy, lo, hi);
            // SAFETY: the CPU has AVX-512 F and BW (checked above).
            let taken = unsafe { r.apply_row_avx512(bias, acc, &mut got, zy, lo, hi) };
            if taken {
                assert_eq!(got, want, "{r:?} bias {bias} zy {zy} [{lo}, {hi}] {acc:?}");
            }
            taken
        }
        let cases = crate::kern::count(3000, 40);
        let (ms, vals) = (rnd(cases, 31), rnd(cases * 40, 32));
        let mut taken = 0;
        for (i, &u) in ms.iter().enumerate() {
            // Multipliers 2^-31 .. 2^-1: shifts 32 .. 62.
            let r = Requant::new(libm::exp2(-1.0 - u.abs() as f64 * 30.0)).unwrap();
            let len = i % 41;
            let acc: Vec<i32> = vals[i * 40..i * 40 + len]
                .iter()
                .enumerate()
                .map(|(j, &v)| match (i + j) % 7 {
                    0 => i32::MAX,
                    1 => i32::MIN,
                    2 => (v * 2.0e4) as i32,
                    _ => (v * 2.1e9) as i32,
                })
                .collect();
            let bias = [0, 1, -7, 123_456, i32::MAX][i % 5];
            let zy = [0, -128, 127, 255, 3][i % 5];
            let (zi, zu) = (zy.min(127), zy.max(0));
            taken += usize::from(check::<i8>(&r, bias, &acc, zi, -128, 127));
            taken += usize::from(check::<i8>(&r, bias, &acc, zi, zi, 127));
            taken += usize::from(check::<u8>(&r, bias, &acc, zu, 0, 255));
            taken += usize::from(check::<u8>(&r, bias, &acc, zu, zu.min(200), 200));
        }
        // Exact ties: m = 2^-k makes odd multiples of 2^(k-1) halves, the
        // even and the odd quotients among them (rounded to even).
        for k in 2..=32u32 {
            let r = Requant::new(libm::exp2(-f64::from(k))).unwrap();
            let acc: Vec<i32> = (-20..20).map(|j| (2 * j + 1) << (k - 1).min(26)).collect();
            taken += usize::from(check::<i8>(&r, 0, &acc, 0, -128, 127));
            taken += usize::from(check::<u8>(&r, 1 << (k - 1).min(26), &acc, 128, 0, 255));
        }
        assert_eq!(
            taken,
            4 * cases + 62,
            "the AVX-512 row refused a case it takes"
        );
        // Bounds outside the type, or small shifts: the loop's.
        let r = Requant::new(0.75).unwrap();
        assert!(!check::<i8>(&r, 0, &[1, 2], 0, -128, 127));
        let r = Requant::new(0.01).unwrap();
        assert!(!check::<u8>(&r, 0, &[1, 2], 0, -1, 255));
    }

    #[test]
    fn apply_clamp_is_apply_then_clamp() {
        let (ms, accs) = (rnd(5_000, 17), rnd(5_000, 18));
        let zps = [0, -128, 255, -3, i32::MAX, i32::MIN];
        let bounds = [(-128, 127), (0, 255), (-3, 127), (i32::MIN, i32::MAX)];
        for (i, (&u, &a)) in ms.iter().zip(&accs).enumerate() {
            // Multipliers from 2^-40 to 2^4: shifts on both sides of 32.
            let r = Requant::new(libm::exp2(u as f64 * 44.0 - 40.0)).unwrap();
            let acc = match i % 5 {
                0 => i32::MAX,
                1 => i32::MIN,
                _ => (a * 2.0e9) as i32,
            };
            let zy = zps[i % zps.len()];
            let (lo, hi) = bounds[i % bounds.len()];
            assert_eq!(
                r.apply_clamp(acc, zy, lo, hi),
                clamp(r.apply(acc), zy, lo, hi),
                "acc {acc} {r:?} zy {zy} [{lo}, {hi}]"
            );
        }
    }

    #[test]
    fn word_rounding_is_the_generic_one() {
        for (p, shift) in shift_cases(5, 32..=62, crate::kern::count(20_000, 200)) {
            assert_eq!(
                i64::from(round_shift_hi(p, shift)),
                round_shift(p, shift),
                "{p} >> {shift}"
            );
        }
        // Products at the extremes.
        for (acc, mult) in [(i32::MIN, i32::MAX), (i32::MAX, i32::MAX), (-1, 1), (1, 1)] {
            let p = acc as i64 * mult as i64;
            for shift in 32..=62 {
                assert_eq!(
                    i64::from(round_shift_hi(p, shift)),
                    round_shift(p, shift),
                    "{p} >> {shift}"
                );
            }
        }
    }

    #[test]
    fn row_requantization_is_apply_and_clamp() {
        let mut seed = 9u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 32) as i32
        };
        for t in 0..crate::kern::count(3000, 100) as i32 {
            let m = match t % 5 {
                0 => 1.0,
                1 => 2.0f64.powi(-(t % 60)),
                2 => 0.5,
                _ => (next() as u32 as f64 + 1.0) / 2f64.powi(20 + t % 30),
            };
            let Ok(r) = Requant::new(m) else { continue };
            let (bias, zy) = (next() % 100_000, next() % 200);
            let (lo, hi) = if t % 2 == 0 { (-128, 127) } else { (0, 255) };
            let mut acc = [0i32; 37];
            for (i, a) in acc.iter_mut().enumerate() {
                let i = i as i32;
                *a = match i % 4 {
                    0 => next(),
                    1 => i32::MAX - i,
                    2 => i32::MIN + i,
                    _ => next() % 1000,
                };
            }
            let mut got = [0u8; 37];
            r.apply_row(bias, &acc, &mut got, zy, lo.max(0), hi);
            let mut got_i8 = [0i8; 37];
            r.apply_row(bias, &acc, &mut got_i8, zy, lo, hi.min(127));
            for (i, &a) in acc.iter().enumerate() {
                let want = clamp(r.apply(bias.wrapping_add(a)), zy, lo.max(0), hi);
                assert_eq!(got[i] as i32, want, "m {m} acc {a} bias {bias}");
                let want = clamp(r.apply(bias.wrapping_add(a)), zy, lo, hi.min(127));
                assert_eq!(got_i8[i] as i32, want, "m {m} acc {a} bias {bias}");
            }
        }
    }

    #[test]
    fn small_two_input_rounding_is_apply() {
        let mut seed = 21u64;
        for t in 0..crate::kern::count(2000, 100) as i32 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let ma = (seed >> 40) as f64 / 2f64.powi(t % 40);
            let mb = (seed >> 45 & 0xffff) as f64 / 2f64.powi(t % 33);
            let Ok(r) = Requant2::new(ma.min(1e9), mb.min(1e9)) else {
                continue;
            };
            for da in (-255..=255).step_by(7) {
                for db in [-255, -128, -1, 0, 1, 77, 255] {
                    assert_eq!(
                        r.apply_small(da, db),
                        r.apply(da, db),
                        "{ma} {mb} {da} {db}"
                    );
                }
            }
        }
    }

    #[test]
    fn ties_round_to_even() {
        let r = Requant::new(0.5).unwrap();
        assert_eq!(r.apply(1), 0);
        assert_eq!(r.apply(3), 2);
        assert_eq!(r.apply(-1), 0);
        assert_eq!(r.apply(-3), -2);
        assert_eq!(r.apply_div(5, 1), 2);
        assert_eq!(r.apply_div(3, 3), 0); // 0.5 -> 0
        assert_eq!(r.apply_div(9, 3), 2); // 1.5 -> 2
        let r2 = Requant2::new(0.5, 0.25).unwrap();
        assert_eq!(r2.apply(1, 2), 1); // 1.0
        assert_eq!(r2.apply(1, 0), 0); // 0.5 -> 0
        assert_eq!(r2.apply(3, 0), 2); // 1.5 -> 2
    }

    #[test]
    fn bad_multipliers_are_errors_not_panics() {
        assert!(Requant::new(0.0).is_err());
        assert!(Requant::new(-1.0).is_err());
        assert!(Requant::new(f64::NAN).is_err());
        assert!(Requant::new(f64::INFINITY).is_err());
        assert!(Requant::new(1e10).is_err());
        let tiny = Requant::new(1e-30).unwrap();
        assert_eq!(tiny.apply(i32::MAX), 0);
        assert_eq!(Requant::new(1.0).unwrap().apply(i32::MIN), i32::MIN as i64);
        assert!(Requant2::new(0.0, 0.0).is_err());
        let big = Requant2::new(1e9, 1e9).unwrap();
        let _ = big.apply(i32::MAX, i32::MAX); // saturates
        assert_eq!(clamp(i64::MAX, 5, -128, 127), 127);
        assert_eq!(clamp(-200, 5, -128, 127), -128);
    }

    #[test]
    fn averages_match_float() {
        let (ms, cs, ss) = (rnd(5_000, 3), rnd(5_000, 4), rnd(5_000, 5));
        for ((&u, &c), &s) in ms.iter().zip(&cs).zip(&ss) {
            let m = (u as f64 + 1.0) * 1.5 + 0.01;
            let count = 1 + ((c + 1.0) * 24.0) as i64;
            let sum = (s * 255.0 * count as f32) as i64;
            let exact = sum as f64 * m / count as f64;
            if (exact - libm::floor(exact) - 0.5).abs() < 1e-6 {
                continue;
            }
            let r = Requant::new(m).unwrap();
            assert_eq!(r.apply_div(sum, count), libm::rint(exact) as i64);
        }
    }

    #[cfg(feature = "qoperator")]
    /// The f32 form rounds the f32 product, as onnxruntime's MLAS
    /// requantization: a case from MobileNetV1's QOperator model, where
    /// the exact product is just above a tie and the f32 one is the tie.
    #[test]
    fn f32_form_rounds_the_f32_product() {
        let m = f32::from_bits(1_012_257_458); // 0.013050722
        assert_eq!(5402.0f32 * m, 70.5);
        assert_eq!(Requant::new(f64::from(m)).unwrap().apply(5402), 71);
        let r = Requant::f32_product(m).unwrap();
        assert!(r.is_valid());
        assert_eq!(r.apply(5402), 70);
        assert_eq!(r.apply(-5402), -70);
        assert_eq!(r.apply_clamp(5402, -128, -128, 127), -58);
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(Requant::f32_product(bad).is_err());
        }
        // A file's f32 form with a bad multiplier is refused.
        let bad = Requant {
            mult: f32::NAN.to_bits() as i32,
            shift: F32_SHIFT,
        };
        assert!(!bad.is_valid());
    }

    #[cfg(feature = "qoperator")]
    /// `apply_row`'s vectorized f32 path (clamp, then MAGIC rounding) is
    /// `apply` + `clamp` per element, bounds near and far included.
    #[test]
    fn f32_form_row_is_the_scalar_path() {
        fn check<Y: crate::kern::QInt>(
            r: &Requant,
            bias: i32,
            acc: &[i32],
            zy: i32,
            lo: i32,
            hi: i32,
        ) {
            let mut row = vec![Y::default(); acc.len()];
            r.apply_row(bias, acc, &mut row, zy, lo, hi);
            for (&a, &y) in acc.iter().zip(&row) {
                let want = clamp(r.apply(bias.wrapping_add(a)), zy, lo, hi);
                assert_eq!(
                    y.get(),
                    want,
                    "acc {a} bias {bias} {r:?} zy {zy} [{lo}, {hi}]"
                );
            }
        }
        let (ms, accs) = (rnd(64, 11), rnd(4096, 12));
        let acc: Vec<i32> = accs.iter().map(|&a| (a * 3.0e5) as i32).collect();
        for (i, &u) in ms.iter().enumerate() {
            let r = Requant::f32_product(libm::exp2f(u * 10.0 - 6.0)).unwrap();
            let bias = (i as i32 - 32) * 77;
            check::<i8>(&r, bias, &acc, 0, -128, 127);
            check::<i8>(&r, bias, &acc, -128, -128, 127);
            check::<i8>(&r, bias, &acc, -5, -20, 30); // a fused Clip
            check::<u8>(&r, bias, &acc, 200, 0, 255);
            // Bounds past MAGIC's range from the zero point: scalar loop.
            check::<i8>(&r, bias, &acc, 1 << 23, -128, 127);
        }
    }
}
