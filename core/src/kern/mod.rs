//! Integer kernels and their building blocks that need no allocator.
//!
//! The planned session ([`crate::ops`], feature `alloc`) and compiled
//! models ([`crate::compiled`], any build) run the same code: each kernel
//! here works on plain slices and a parameter *view* whose per-channel
//! arrays are borrowed — from the `Vec`s an op's prepare built, or straight
//! from the bytes of a `.mote` file in flash.

// Without `alloc` only compiled models use these: parts serve the planned
// session (prepare, float paths) alone.
#![cfg_attr(not(feature = "alloc"), allow(dead_code))]

pub mod cpu;
#[cfg(feature = "alloc")]
#[cfg(target_arch = "x86_64")]
pub(crate) mod dconv;
#[cfg(target_arch = "x86_64")]
pub(crate) mod dw512;
pub(crate) mod dwconv;
pub mod par;
pub(crate) mod qbin;
pub(crate) mod qcol;
pub(crate) mod qconv;
pub(crate) mod qdw;
pub(crate) mod qgemm;
pub(crate) mod qgemm_vnni;
pub(crate) mod qpool;
pub mod requant;
#[cfg(feature = "alloc")]
pub(crate) mod sgemm;

use crate::Element;

/// Most spatial axes handled.
pub(crate) const MAX_SPATIAL: usize = 3;

/// Window geometry over three spatial axes (unused leading axes have size 1,
/// kernel 1, stride 1, dilation 1 and no padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geom {
    /// Input spatial sizes.
    pub inp: [usize; MAX_SPATIAL],
    /// Output spatial sizes.
    pub out: [usize; MAX_SPATIAL],
    /// Kernel sizes.
    pub k: [usize; MAX_SPATIAL],
    /// Strides.
    pub s: [usize; MAX_SPATIAL],
    /// Dilations.
    pub d: [usize; MAX_SPATIAL],
    /// Padding at the beginning.
    pub pb: [usize; MAX_SPATIAL],
    /// Padding at the end.
    pub pe: [usize; MAX_SPATIAL],
}

impl Geom {
    pub(crate) fn unit() -> Self {
        Geom {
            inp: [1; MAX_SPATIAL],
            out: [1; MAX_SPATIAL],
            k: [1; MAX_SPATIAL],
            s: [1; MAX_SPATIAL],
            d: [1; MAX_SPATIAL],
            pb: [0; MAX_SPATIAL],
            pe: [0; MAX_SPATIAL],
        }
    }
    pub(crate) fn in_size(&self) -> usize {
        self.inp.iter().product()
    }
    pub(crate) fn out_size(&self) -> usize {
        self.out.iter().product()
    }
    pub(crate) fn k_size(&self) -> usize {
        self.k.iter().product()
    }

    /// (input, output, kernel) sizes, `None` if a product passes `usize`.
    pub(crate) fn checked_sizes(&self) -> Option<(usize, usize, usize)> {
        let numel = |d: &[usize; MAX_SPATIAL]| d.iter().try_fold(1usize, |a, &v| a.checked_mul(v));
        Some((numel(&self.inp)?, numel(&self.out)?, numel(&self.k)?))
    }

    /// Whether on every axis the last window's last tap, (o - 1)·s +
    /// (k - 1)·d, lies within the padded input, i + pb + pe (a geometry
    /// from `forward_geom` always does; one read from a file is checked):
    /// then no window index o·s + k·d wraps, and the `- pb` that follows may
    /// wrap on purpose (a negative index becomes one past the input and
    /// fails the `< i` test).
    pub(crate) fn reach_ok(&self) -> bool {
        let window = self.out.iter().zip(&self.k).zip(&self.s).zip(&self.d);
        let input = self.inp.iter().zip(&self.pb).zip(&self.pe);
        window
            .zip(input)
            .all(|((((&o, &k), &s), &d), ((&i, &pb), &pe))| {
                if o == 0 || k == 0 {
                    return true;
                }
                let reach = (o.wrapping_sub(1).checked_mul(s))
                    .zip(k.wrapping_sub(1).checked_mul(d))
                    .and_then(|(r, t)| r.checked_add(t));
                let end = i.checked_add(pb).and_then(|v| v.checked_add(pe));
                matches!((reach, end), (Some(r), Some(e)) if r < e)
            })
    }
}

/// The input index that output position `o` reads at kernel tap `k` on one
/// axis: `o·s + k·d - pb`. Wraps by name: under [`Geom::reach_ok`]
/// `o·s + k·d` does not wrap, and a negative result becomes an index past
/// the input, which the caller's `< i` test (or `win`) rejects. (Run with
/// the roles of input and output swapped, it is ConvTranspose's scatter.)
#[inline(always)]
pub(crate) fn tap_in(o: usize, s: usize, k: usize, d: usize, pb: usize) -> usize {
    o.wrapping_mul(s)
        .wrapping_add(k.wrapping_mul(d))
        .wrapping_sub(pb)
}

/// The range `[lo, hi)` of `o` in `0..count` with `0 <= o*s + off - pb < limit`.
#[inline]
pub(crate) fn valid_range(
    count: usize,
    s: usize,
    off: usize,
    pb: usize,
    limit: usize,
) -> (usize, usize) {
    // Strides are checked nonzero (`geom_ok`); a zero would count as 1 here,
    // never a division by zero.
    let s = core::num::NonZeroUsize::new(s).unwrap_or(core::num::NonZeroUsize::MIN);
    // The differences are taken only where the branch keeps them positive,
    // and `x / s + 1` cannot pass usize::MAX for x < usize::MAX.
    let lo = if off >= pb {
        0
    } else {
        let x = pb.wrapping_sub(off);
        // A remainder means s >= 2: x / s + 1 fits.
        (x / s).wrapping_add(usize::from(x % s != 0))
    };
    let end = limit.saturating_add(pb);
    let hi = if end <= off {
        0
    } else {
        (end.wrapping_sub(1).wrapping_sub(off) / s).wrapping_add(1)
    };
    let hi = hi.min(count);
    (lo.min(hi), hi)
}

/// An 8-bit quantized element type (int8 / uint8).
pub(crate) trait QInt: Element + Copy + Default + Send + Sync {
    /// Saturation bounds, as f64 (for float requantization paths).
    const MIN: f64;
    /// Upper saturation bound, as f64.
    const MAX: f64;
    /// Lower bound, as i32.
    const LO: i32;
    /// Upper bound, as i32.
    const HI: i32;
    /// The value widened to i32.
    fn get(self) -> i32;
    /// Saturates an already rounded value (NaN becomes 0, like numpy's cast
    /// in practice).
    fn sat(v: f64) -> Self;
    /// The byte pattern (table index).
    fn bits(self) -> u8;
    /// From a byte pattern.
    fn from_bits(b: u8) -> Self;
    /// From a value already saturated to `[LO, HI]`.
    fn from_sat(v: i32) -> Self;
}

macro_rules! qint {
    ($t:ty, $lo:expr, $hi:expr) => {
        impl QInt for $t {
            const MIN: f64 = $lo as f64;
            const MAX: f64 = $hi as f64;
            const LO: i32 = $lo;
            const HI: i32 = $hi;
            #[inline]
            fn get(self) -> i32 {
                self as i32
            }
            #[inline]
            fn sat(v: f64) -> Self {
                v.clamp(<Self as QInt>::MIN, <Self as QInt>::MAX) as $t
            }
            #[inline]
            fn bits(self) -> u8 {
                self as u8
            }
            #[inline]
            fn from_bits(b: u8) -> Self {
                b as $t
            }
            #[inline]
            fn from_sat(v: i32) -> Self {
                v as $t
            }
        }
    };
}
qint!(i8, -128, 127);
qint!(u8, 0, 255);

/// `s[at..at + len]`, if in bounds. The kernels index through this (and
/// `get`) rather than `[]`: a geometry that disagreed with its slices would
/// be a bug, and it ends in an `Err`, never in a panic (the link check of
/// `boards/nopanic` holds the compiled-model runtime to that).
#[inline(always)]
pub(crate) fn win<T>(s: &[T], at: usize, len: usize) -> Option<&[T]> {
    s.get(at..at.checked_add(len)?)
}

/// [`win`], mutable.
#[inline(always)]
pub(crate) fn win_mut<T>(s: &mut [T], at: usize, len: usize) -> Option<&mut [T]> {
    s.get_mut(at..at.checked_add(len)?)
}

/// `dst = src` (equal lengths) without a `memcpy` call for short rows: the
/// rows of small planes are a few floats (5 in KWS's depthwise layers, 16
/// in a GEMM panel), and a library call per row was a sixth of KWS's time
/// and of ResNet-8's. Blocks of 8, then 4, 2 and 1, each a fixed-size copy
/// that compiles to moves.
#[inline(always)]
pub(crate) fn copy_row(dst: &mut [f32], src: &[f32]) {
    if src.len() >= 64 || dst.len() != src.len() {
        // Long rows: the library copy is the faster one (lengths checked by
        // the callers; a mismatch copies the common part).
        let n = dst.len().min(src.len());
        if let (Some(d), Some(s)) = (dst.get_mut(..n), src.get(..n)) {
            d.copy_from_slice(s);
        }
        return;
    }
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (dc, sc) in (&mut d).zip(&mut s) {
        if let (Ok(dc), Ok(sc)) = (<&mut [f32; 8]>::try_from(dc), <&[f32; 8]>::try_from(sc)) {
            *dc = *sc;
        }
    }
    let (d, s) = (d.into_remainder(), s.remainder());
    let n = d.len().min(s.len());
    let mut at = 0;
    for step in [4, 2, 1] {
        if n.saturating_sub(at) >= step {
            match step {
                4 => copy_n::<4>(d, s, at),
                2 => copy_n::<2>(d, s, at),
                _ => copy_n::<1>(d, s, at),
            }
            // at + step <= n < 8.
            at = at.wrapping_add(step);
        }
    }
}

/// `d[at..at + N] = s[at..at + N]` as one fixed-size move (nothing if out of
/// range).
#[inline(always)]
fn copy_n<const N: usize>(d: &mut [f32], s: &[f32], at: usize) {
    let dc = d.get_mut(at..).and_then(|c| c.first_chunk_mut::<N>());
    if let (Some(dc), Some(sc)) = (dc, s.get(at..).and_then(|c| c.first_chunk::<N>())) {
        *dc = *sc;
    }
}

/// The error of a kernel whose checked geometry disagrees with its slices.
#[cold]
pub(crate) fn out_of_bounds() -> crate::Error {
    crate::Error::internal("kernel index out of bounds")
}

/// A test's cases, or under Miri (`cargo miri test`, about 10^4 times
/// slower) the few given: enough to reach every unsafe path.
#[cfg(test)]
pub(crate) fn pick<'a, T>(full: &'a [T], miri: &'a [T]) -> &'a [T] {
    if cfg!(miri) {
        miri
    } else {
        full
    }
}

/// `full` test iterations, `miri` under Miri.
#[cfg(test)]
pub(crate) fn count(full: usize, miri: usize) -> usize {
    if cfg!(miri) {
        miri
    } else {
        full
    }
}

/// `Err(Len)` unless `got == want`.
#[inline]
pub(crate) fn check_len(got: usize, want: usize) -> crate::Result<()> {
    if got != want {
        return Err(crate::Error::new(crate::ErrorKind::Len {
            expected: want as u64,
            got: got as u64,
        }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    #[test]
    fn short_row_copies_copy_every_float() {
        for n in 0..80 {
            let src: Vec<f32> = (0..n).map(|v| v as f32 + 0.5).collect();
            let mut dst = std::vec![f32::NAN; n + 3];
            super::copy_row(&mut dst[1..n + 1], &src);
            assert!(dst[0].is_nan() && dst[n + 1].is_nan(), "{n}: wrote outside");
            assert_eq!(&dst[1..n + 1], &src[..], "{n}");
        }
    }
}
