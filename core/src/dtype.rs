//! Element types and their ONNX codes.
//!
//! The low-precision types of ONNX (8-bit floats, 4-bit floats and ints,
//! 2-bit ints) are stored one element per byte in memory, sub-byte types
//! **unpacked**: a code in the low bits (4-bit and 2-bit ints sign-extended
//! to the whole byte for the signed ones, so an `INT4` byte reads as the
//! `i8` it stands for). Import unpacks the packed `TensorProto` layout. This
//! keeps every tensor byte-addressable (planning, slicing, Gather and the
//! like work unchanged) at a cost of 2x memory for 4-bit types and 4x for
//! 2-bit ones.

use half::{bf16, f16};

/// Element type of a tensor. Codes follow `TensorProto.DataType` of ONNX.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
    /// Boolean, one byte per element (0 or 1).
    Bool,
    /// 8-bit float, 4 exponent bits, 3 mantissa bits, no infinity
    /// (`FLOAT8E4M3FN`).
    F8E4M3FN,
    /// 8-bit float E4M3, no infinity, no negative zero (`FLOAT8E4M3FNUZ`).
    F8E4M3FNUZ,
    /// 8-bit float, 5 exponent bits, 2 mantissa bits, IEEE-like (`FLOAT8E5M2`).
    F8E5M2,
    /// 8-bit float E5M2, no infinity, no negative zero (`FLOAT8E5M2FNUZ`).
    F8E5M2FNUZ,
    /// Unsigned 4-bit integer, unpacked: one byte (0..=15) per element.
    U4,
    /// Signed 4-bit integer, unpacked: one byte (-8..=7 as `i8`) per element.
    I4,
    /// 4-bit float E2M1 (`FLOAT4E2M1`), unpacked: the code in the low nibble.
    F4E2M1,
    /// Unsigned 2-bit integer, unpacked: one byte (0..=3) per element.
    U2,
    /// Signed 2-bit integer, unpacked: one byte (-2..=1 as `i8`) per element.
    I2,
    /// 8-bit power of two 2^(code - 127), 0xFF is NaN (`FLOAT8E8M0`, the
    /// scale type of microscaling formats).
    F8E8M0,
}

/// Rounding of a Cast to [`DType::F8E8M0`] (its `round_mode` attribute).
#[cfg(feature = "alloc")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum E8M0Round {
    /// Toward +infinity in magnitude (the ONNX default).
    Up,
    /// Toward zero.
    Down,
    /// To nearest.
    Nearest,
}

impl DType {
    /// All supported element types.
    pub const ALL: [DType; 23] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::Bool,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::U4,
        DType::I4,
        DType::F4E2M1,
        DType::U2,
        DType::I2,
        DType::F8E8M0,
    ];

    /// Bytes per element (in memory: sub-byte types take a whole byte).
    pub const fn size(self) -> usize {
        match self {
            DType::I8
            | DType::U8
            | DType::Bool
            | DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::U4
            | DType::I4
            | DType::F4E2M1
            | DType::U2
            | DType::I2
            | DType::F8E8M0 => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// From the ONNX `TensorProto.DataType` code; `None` for types mote does
    /// not store (strings, complex, 6-bit floats).
    pub const fn from_onnx(code: i32) -> Option<DType> {
        Some(match code {
            1 => DType::F32,
            2 => DType::U8,
            3 => DType::I8,
            4 => DType::U16,
            5 => DType::I16,
            6 => DType::I32,
            7 => DType::I64,
            9 => DType::Bool,
            10 => DType::F16,
            11 => DType::F64,
            12 => DType::U32,
            13 => DType::U64,
            16 => DType::BF16,
            17 => DType::F8E4M3FN,
            18 => DType::F8E4M3FNUZ,
            19 => DType::F8E5M2,
            20 => DType::F8E5M2FNUZ,
            21 => DType::U4,
            22 => DType::I4,
            23 => DType::F4E2M1,
            24 => DType::F8E8M0,
            25 => DType::U2,
            26 => DType::I2,
            _ => return None,
        })
    }

    /// The ONNX `TensorProto.DataType` code.
    pub const fn onnx_code(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::BF16 => 16,
            DType::F8E4M3FN => 17,
            DType::F8E4M3FNUZ => 18,
            DType::F8E5M2 => 19,
            DType::F8E5M2FNUZ => 20,
            DType::U4 => 21,
            DType::I4 => 22,
            DType::F4E2M1 => 23,
            DType::F8E8M0 => 24,
            DType::U2 => 25,
            DType::I2 => 26,
        }
    }

    /// Lower-case name as numpy spells it (`float32`, `int64`, `bool`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I16 => "int16",
            DType::U16 => "uint16",
            DType::I32 => "int32",
            DType::U32 => "uint32",
            DType::I64 => "int64",
            DType::U64 => "uint64",
            DType::Bool => "bool",
            DType::F8E4M3FN => "float8_e4m3fn",
            DType::F8E4M3FNUZ => "float8_e4m3fnuz",
            DType::F8E5M2 => "float8_e5m2",
            DType::F8E5M2FNUZ => "float8_e5m2fnuz",
            DType::U4 => "uint4",
            DType::I4 => "int4",
            DType::F4E2M1 => "float4_e2m1fn",
            DType::U2 => "uint2",
            DType::I2 => "int2",
            DType::F8E8M0 => "float8_e8m0fnu",
        }
    }

    /// Name of an ONNX type code, including the ones mote does not store.
    pub const fn onnx_name(code: i32) -> &'static str {
        match DType::from_onnx(code) {
            Some(d) => d.name(),
            None => match code {
                8 => "string",
                14 => "complex64",
                15 => "complex128",
                27 | 28 => "float6",
                _ => "undefined",
            },
        }
    }

    /// True for the common floating-point types (f32, f64, f16, bf16); the
    /// 8-bit and 4-bit floats answer [`DType::is_minifloat`] instead, as no
    /// arithmetic kernel reads them directly.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// True for signed and unsigned integer types (not bool).
    pub const fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8
                | DType::U8
                | DType::I16
                | DType::U16
                | DType::I32
                | DType::U32
                | DType::I64
                | DType::U64
        )
    }
}

impl DType {
    /// True for the 8-bit and 4-bit floats.
    pub const fn is_minifloat(self) -> bool {
        matches!(
            self,
            DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ | DType::F4E2M1
        )
    }

    /// Range of the 4-bit and 2-bit integer types; `None` for the others.
    pub const fn small_int_range(self) -> Option<(i64, i64)> {
        match self {
            DType::U4 => Some((0, 15)),
            DType::I4 => Some((-8, 7)),
            DType::U2 => Some((0, 3)),
            DType::I2 => Some((-2, 1)),
            _ => None,
        }
    }

    /// Bits of a sub-byte type as stored in files (4 or 2); `None` otherwise.
    pub const fn packed_bits(self) -> Option<u32> {
        match self {
            DType::U4 | DType::I4 | DType::F4E2M1 => Some(4),
            DType::U2 | DType::I2 => Some(2),
            _ => None,
        }
    }

    /// The in-memory byte of a sub-byte value from its packed code (the
    /// `bits` low bits of `code`): signed ints are sign-extended.
    pub const fn unpack_code(self, code: u8) -> u8 {
        match self {
            DType::I4 => (((code & 0xF) << 4) as i8 >> 4) as u8,
            DType::I2 => (((code & 0x3) << 6) as i8 >> 6) as u8,
            DType::U4 | DType::F4E2M1 => code & 0xF,
            DType::U2 => code & 0x3,
            _ => code,
        }
    }

    /// A 4-bit or 2-bit int from an integer: wraps modulo 2^bits (as
    /// ml_dtypes converts integers), stored unpacked.
    pub const fn wrap_small_int(self, v: i128) -> u8 {
        self.unpack_code(v as u8)
    }

    /// A 4-bit or 2-bit int from a float: truncated toward zero, and 0 when
    /// NaN or out of range (what ml_dtypes, hence the ONNX reference, does).
    pub fn small_int_from_f64(self, v: f64) -> u8 {
        let Some((lo, hi)) = self.small_int_range() else {
            return 0;
        };
        let t = libm::trunc(v);
        if t >= lo as f64 && t <= hi as f64 {
            (t as i64) as u8
        } else {
            0
        }
    }

    fn minifloat(self) -> Option<MiniFloat> {
        let (man, bias, max, special, sign) = match self {
            DType::F8E4M3FN => (3, 7, 0x7E, Special::Fn, 0x80),
            DType::F8E4M3FNUZ => (3, 8, 0x7F, Special::Fnuz, 0x80),
            DType::F8E5M2 => (2, 15, 0x7B, Special::Ieee, 0x80),
            DType::F8E5M2FNUZ => (2, 16, 0x7F, Special::Fnuz, 0x80),
            DType::F4E2M1 => (1, 1, 0x7, Special::Finite, 0x8),
            _ => return None,
        };
        Some(MiniFloat {
            man,
            bias,
            max,
            special,
            sign,
        })
    }

    /// Value of a minifloat (or E8M0) byte (`NaN` for other dtypes).
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "8-bit codes, and exponents within ±1100: nothing overflows"
    )]
    pub fn minifloat_to_f64(self, code: u8) -> f64 {
        if self == DType::F8E8M0 {
            return if code == 0xFF {
                f64::NAN
            } else {
                pow2(code as i32 - 127)
            };
        }
        match self.minifloat() {
            Some(m) => m.decode(code),
            None => f64::NAN,
        }
    }

    /// A minifloat byte from `x`, rounded to nearest even. `saturate` (the
    /// Cast attribute) clamps out-of-range values and infinities to the
    /// largest finite value; without it they become infinity (E5M2) or NaN.
    /// FLOAT4E2M1 has neither, so it always saturates.
    pub fn minifloat_from_f64(self, x: f64, saturate: bool) -> u8 {
        match self.minifloat() {
            Some(m) => m.encode(x, saturate),
            None => 0,
        }
    }
}

/// An E8M0 byte from `x` (sign ignored), as `onnx.numpy_helper.to_float8e8m0`:
/// only the f32 exponent survives; `round` decides how the mantissa bumps
/// it, and `saturate` keeps the largest exponent from rounding into NaN.
#[cfg(feature = "alloc")]
#[allow(
    clippy::arithmetic_side_effects,
    reason = "8-bit codes, and exponents within ±1100: nothing overflows"
)]
pub(crate) fn e8m0_from_f32(x: f32, saturate: bool, round: E8M0Round) -> u8 {
    let bits = x.to_bits();
    let e = (bits >> 23) & 0xFF;
    if e == 0xFF {
        return 0xFF;
    }
    let up = match round {
        E8M0Round::Down => false,
        E8M0Round::Up => bits & 0x7F_FFFF != 0,
        E8M0Round::Nearest => {
            // The reference's guard/round/sticky test, with its "lsb" being
            // "exponent is non-zero".
            let g = bits & 0x40_0000 != 0;
            let r = bits & 0x20_0000 != 0;
            let s = bits & 0x1F_FFFF != 0;
            g && (r || s || e > 0)
        }
    };
    let up = up && !(saturate && e == 0xFE);
    (e + up as u32) as u8
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Special {
    /// Exponent all ones is infinity (mantissa 0) or NaN (E5M2).
    Ieee,
    /// No infinity; all ones is NaN (E4M3FN).
    Fn,
    /// No infinity, no negative zero; 0x80 is the only NaN.
    Fnuz,
    /// No infinity, no NaN (FLOAT4E2M1).
    Finite,
}

/// Layout of a minifloat: mantissa bits, exponent bias, the largest finite
/// magnitude code, special values and the sign bit.
struct MiniFloat {
    man: u32,
    bias: i32,
    max: u32,
    special: Special,
    sign: u8,
}

#[allow(
    clippy::arithmetic_side_effects,
    reason = "8-bit codes, and exponents within ±1100 (`encode` returns before `e` leaves the format's range): nothing overflows"
)]
impl MiniFloat {
    fn decode(&self, code: u8) -> f64 {
        let neg = code & self.sign != 0;
        let mag = (code & (self.sign - 1)) as u32;
        match self.special {
            Special::Fnuz if code == 0x80 => return f64::NAN,
            Special::Fn if mag == 0x7F => return f64::NAN,
            Special::Ieee if mag > self.max + 1 => return f64::NAN,
            Special::Ieee if mag == self.max + 1 => {
                return if neg {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                };
            }
            _ => {}
        }
        let e = (mag >> self.man) as i32;
        let f = (mag & ((1 << self.man) - 1)) as f64;
        let v = if e == 0 {
            f * pow2(1 - self.bias - self.man as i32)
        } else {
            (f + (1u32 << self.man) as f64) * pow2(e - self.bias - self.man as i32)
        };
        if neg {
            -v
        } else {
            v
        }
    }

    fn encode(&self, x: f64, saturate: bool) -> u8 {
        let sign = if x.is_sign_negative() { self.sign } else { 0 };
        let saturate = saturate || self.special == Special::Finite;
        let overflow = || -> u8 {
            if saturate {
                return self.max as u8 | sign;
            }
            match self.special {
                Special::Ieee => (self.max + 1) as u8 | sign,
                Special::Fn => 0x7F | sign,
                _ => 0x80,
            }
        };
        if x.is_nan() {
            return match self.special {
                Special::Ieee => 0x7E | sign,
                Special::Fn => 0x7F | sign,
                Special::Fnuz => 0x80,
                // ml_dtypes turns +NaN into the -0 code of FLOAT4E2M1 (and
                // -NaN into +0); the reference outputs follow it.
                Special::Finite => self.sign ^ sign,
            };
        }
        let a = x.abs();
        if a.is_infinite() {
            return overflow();
        }
        let emin = 1 - self.bias;
        let mag: u64 = if a < pow2(emin) {
            // Subnormal grid; rounding up to 2^man lands on the smallest
            // normal code, which is the right encoding.
            libm::rint(a * pow2(self.man as i32 - emin)) as u64
        } else {
            let e = ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023;
            if e - emin > 40 {
                return overflow();
            }
            let frac = a * pow2(-e) - 1.0;
            let q = libm::rint(frac * pow2(self.man as i32)) as u64;
            // A carry out of the mantissa bumps the exponent by itself.
            (((e + self.bias) as u64) << self.man) + q
        };
        if mag > self.max as u64 {
            return overflow();
        }
        if mag == 0 && self.special == Special::Fnuz {
            return 0;
        }
        mag as u8 | sign
    }
}

/// 2^e for the small exponents minifloats need (exact).
#[allow(
    clippy::arithmetic_side_effects,
    reason = "8-bit codes, and exponents within ±1100: nothing overflows"
)]
fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

impl core::fmt::Display for DType {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that is the storage of one [`DType`].
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The dtype this type stores.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i8 => I8, u8 => U8, i16 => I16,
    u16 => U16, i32 => I32, u32 => U32, i64 => I64, u64 => U64);

#[cfg(test)]
mod tests {
    use super::DType;

    #[test]
    fn minifloat_decodes_by_layout() {
        // E4M3FN: 0 0111 000 = 1, 0 1111 110 = 448 (max), 0x7F = NaN,
        // 0 0000 001 = 2^-9 (smallest subnormal).
        let d = DType::F8E4M3FN;
        assert_eq!(d.minifloat_to_f64(0x38), 1.0);
        assert_eq!(d.minifloat_to_f64(0x7E), 448.0);
        assert!(d.minifloat_to_f64(0x7F).is_nan());
        assert_eq!(d.minifloat_to_f64(0x01), 1.0 / 512.0);
        assert_eq!(d.minifloat_to_f64(0xC0), -2.0);
        // FNUZ: 0x80 is NaN, bias 8 (0x40 = 1), max 0x7F = 240.
        assert!(DType::F8E4M3FNUZ.minifloat_to_f64(0x80).is_nan());
        assert_eq!(DType::F8E4M3FNUZ.minifloat_to_f64(0x40), 1.0);
        assert_eq!(DType::F8E4M3FNUZ.minifloat_to_f64(0x7F), 240.0);
        // E5M2: 0x7C = inf, 0x7B = 57344, 0x3C = 1.
        assert_eq!(DType::F8E5M2.minifloat_to_f64(0x7C), f64::INFINITY);
        assert_eq!(DType::F8E5M2.minifloat_to_f64(0x7B), 57344.0);
        assert_eq!(DType::F8E5M2.minifloat_to_f64(0x3C), 1.0);
        assert_eq!(DType::F8E5M2FNUZ.minifloat_to_f64(0x7F), 57344.0);
        // E2M1 codes 0..7: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
        let f4: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for (c, &v) in f4.iter().enumerate() {
            assert_eq!(DType::F4E2M1.minifloat_to_f64(c as u8), v);
            assert_eq!(DType::F4E2M1.minifloat_to_f64(c as u8 | 8), -v);
        }
    }

    #[test]
    fn minifloat_encoding_rounds_even_and_saturates() {
        let d = DType::F8E4M3FN;
        // 1.0625 is halfway between 1 (0x38) and 1.125 (0x39): even wins.
        assert_eq!(d.minifloat_from_f64(1.0625, true), 0x38);
        assert_eq!(d.minifloat_from_f64(1.1875, true), 0x3A);
        // 464 is halfway between 448 and the NaN slot: ties to 448; above
        // it overflows to NaN, or to 448 when saturating.
        assert_eq!(d.minifloat_from_f64(464.0, false), 0x7E);
        assert_eq!(d.minifloat_from_f64(465.0, false), 0x7F);
        assert_eq!(d.minifloat_from_f64(-1e6, true), 0xFE);
        assert_eq!(d.minifloat_from_f64(f64::INFINITY, false), 0x7F);
        // Below half the smallest subnormal: signed zero (none in FNUZ).
        assert_eq!(d.minifloat_from_f64(-1e-4, true), 0x80);
        assert_eq!(DType::F8E4M3FNUZ.minifloat_from_f64(-1e-4, true), 0x00);
        assert_eq!(DType::F8E4M3FNUZ.minifloat_from_f64(300.0, false), 0x80);
        // E5M2 overflows to infinity without saturation.
        assert_eq!(DType::F8E5M2.minifloat_from_f64(1e6, false), 0x7C);
        assert_eq!(DType::F8E5M2.minifloat_from_f64(1e6, true), 0x7B);
        assert_eq!(DType::F8E5M2.minifloat_from_f64(f64::NAN, true), 0x7E);
        // E2M1 always saturates: 5 ties to 4 (even), 100 -> 6.
        assert_eq!(DType::F4E2M1.minifloat_from_f64(5.0, false), 0x6);
        assert_eq!(DType::F4E2M1.minifloat_from_f64(-100.0, false), 0xF);
        assert_eq!(DType::F4E2M1.minifloat_from_f64(0.25, false), 0x0);
    }

    #[test]
    fn small_ints_wrap_from_ints_and_zero_out_of_range_floats() {
        assert_eq!(DType::I4.wrap_small_int(9), (-7i8) as u8);
        assert_eq!(DType::U4.wrap_small_int(-1), 15);
        assert_eq!(DType::I2.wrap_small_int(3), (-1i8) as u8);
        assert_eq!(DType::I4.small_int_from_f64(-8.9), (-8i8) as u8);
        assert_eq!(DType::I4.small_int_from_f64(8.0), 0);
        assert_eq!(DType::U2.small_int_from_f64(3.7), 3);
        assert_eq!(DType::U4.small_int_from_f64(f64::NAN), 0);
        assert_eq!(DType::I4.unpack_code(0xF), 0xFF);
    }

    #[test]
    fn e8m0_keeps_the_exponent_and_rounds_by_mode() {
        use super::{e8m0_from_f32, E8M0Round as R};
        assert_eq!(DType::F8E8M0.minifloat_to_f64(127), 1.0);
        assert_eq!(DType::F8E8M0.minifloat_to_f64(124), 0.125);
        assert!(DType::F8E8M0.minifloat_to_f64(0xFF).is_nan());
        // 1.1 = 1.1 * 2^0: up -> 2 (128), down -> 1 (127), nearest -> 1.
        assert_eq!(e8m0_from_f32(1.1, true, R::Up), 128);
        assert_eq!(e8m0_from_f32(1.1, true, R::Down), 127);
        assert_eq!(e8m0_from_f32(1.1, true, R::Nearest), 127);
        assert_eq!(e8m0_from_f32(1.75, true, R::Nearest), 128);
        // Sign is dropped; the top exponent rounds into NaN unless saturating.
        assert_eq!(e8m0_from_f32(-4.0, true, R::Up), 129);
        assert_eq!(e8m0_from_f32(3e38, false, R::Up), 0xFF);
        assert_eq!(e8m0_from_f32(3e38, true, R::Up), 0xFE);
        assert_eq!(e8m0_from_f32(f32::INFINITY, true, R::Up), 0xFF);
    }

    #[test]
    fn onnx_codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_onnx(d.onnx_code()), Some(d));
        }
    }
}
