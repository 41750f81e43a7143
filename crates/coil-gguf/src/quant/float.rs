//! Plain float formats: F32, F16, BF16 (one element per "block").
//!
//! Layouts (little-endian, no block header):
//! - `F32`:  4 bytes per element, IEEE binary32.
//! - `F16`:  2 bytes per element, IEEE binary16.
//! - `BF16`: 2 bytes per element, the upper 16 bits of a binary32.
//!
//! Conversions are exact and bit-identical to the reference `gguf` Python
//! package (numpy), including NaNs:
//! - f16 → f32 keeps a NaN's payload as is (`payload << 13`, no quieting),
//!   like numpy's `astype(np.float32)`; the `half` crate would set the quiet
//!   bit, so NaNs are handled here.
//! - f32 → f16 rounds to nearest even (overflow → ±inf); a NaN keeps the top 10
//!   payload bits and, if those are all zero, becomes `0x7c01` (numpy's
//!   `npy_floatbits_to_halfbits`; again no quieting).
//! - f32 → bf16 rounds to nearest even; a NaN is forced quiet
//!   (`(bits >> 16) | 0x40`), like ggml's `ggml_compute_fp32_to_bf16`.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Elements converted per chunk in the slice conversions (stack buffer).
const CHUNK: usize = 256;

#[inline]
fn is_f16_nan(bits: u16) -> bool {
    bits & 0x7c00 == 0x7c00 && bits & 0x03ff != 0
}

/// f16 NaN → f32 NaN with the payload shifted up, sign kept, no quieting.
#[inline]
fn f16_nan_to_f32(bits: u16) -> f32 {
    let b = bits as u32;
    f32::from_bits(((b & 0x8000) << 16) | 0x7f80_0000 | ((b & 0x03ff) << 13))
}

/// f32 NaN → f16 NaN as numpy does it.
#[inline]
fn f32_nan_to_f16(bits: u32) -> u16 {
    let sign = ((bits >> 16) & 0x8000) as u16;
    let mut h = 0x7c00u16 + ((bits & 0x007f_ffff) >> 13) as u16;
    if h == 0x7c00 {
        h += 1;
    }
    sign | h
}

/// The value of the IEEE half-precision number with bits `bits` (exact).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    if is_f16_nan(bits) {
        f16_nan_to_f32(bits)
    } else {
        f16::from_bits(bits).to_f32()
    }
}

/// `x` rounded to half precision (nearest even), as bits.
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    if x.is_nan() {
        f32_nan_to_f16(x.to_bits())
    } else {
        f16::from_f32(x).to_bits()
    }
}

/// The value of the bfloat16 number with bits `bits` (exact).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `x` rounded to bfloat16 (nearest even; NaN forced quiet), as bits.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let n = x.to_bits();
    if n & 0x7fff_ffff > 0x7f80_0000 {
        return ((n >> 16) | 0x40) as u16;
    }
    ((n as u64 + 0x7fff + ((n as u64 >> 16) & 1)) >> 16) as u16
}

/// Reads the little-endian f16 at `b[at..at + 2]` as f32.
#[inline]
pub(crate) fn read_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Writes `x` rounded to f16 at `b[at..at + 2]`, little-endian.
#[inline]
pub(crate) fn write_f16(b: &mut [u8], at: usize, x: f32) {
    b[at..at + 2].copy_from_slice(&f32_to_f16(x).to_le_bytes());
}

// ---- rows (lengths checked by the caller: src.len() == 4 or 2 × dst.len()) ----

pub(crate) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (c, y) in src.chunks_exact(4).zip(dst.iter_mut()) {
        *y = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

pub(crate) fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (x, c) in src.iter().zip(dst.chunks_exact_mut(4)) {
        c.copy_from_slice(&x.to_le_bytes());
    }
}

pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    // Through a stack buffer so that `half` can use F16C where the CPU has it
    // (several times faster than element by element), then NaNs fixed up.
    let mut buf = [f16::ZERO; CHUNK];
    for (s, d) in src.chunks(2 * CHUNK).zip(dst.chunks_mut(CHUNK)) {
        let h = &mut buf[..d.len()];
        for (hv, c) in h.iter_mut().zip(s.chunks_exact(2)) {
            *hv = f16::from_bits(u16::from_le_bytes([c[0], c[1]]));
        }
        h.convert_to_f32_slice(d);
        if d.iter().fold(false, |any, y| any | y.is_nan()) {
            for (hv, y) in h.iter().zip(d.iter_mut()) {
                if is_f16_nan(hv.to_bits()) {
                    *y = f16_nan_to_f32(hv.to_bits());
                }
            }
        }
    }
}

pub(crate) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    let mut buf = [f16::ZERO; CHUNK];
    for (s, d) in src.chunks(CHUNK).zip(dst.chunks_mut(2 * CHUNK)) {
        let h = &mut buf[..s.len()];
        h.convert_from_f32_slice(s);
        for ((hv, x), c) in h.iter().zip(s).zip(d.chunks_exact_mut(2)) {
            let bits = if x.is_nan() {
                f32_nan_to_f16(x.to_bits())
            } else {
                hv.to_bits()
            };
            c.copy_from_slice(&bits.to_le_bytes());
        }
    }
}

pub(crate) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (c, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *y = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

pub(crate) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (x, c) in src.iter().zip(dst.chunks_exact_mut(2)) {
        c.copy_from_slice(&f32_to_bf16(*x).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_specials() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        // NaN payloads are kept, not quieted (numpy semantics).
        assert_eq!(f16_to_f32(0x7c01).to_bits(), 0x7f80_2000);
        assert_eq!(f16_to_f32(0xfe00).to_bits(), 0xffc0_0000);
    }

    #[test]
    fn f32_to_f16_rounding() {
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(65519.99), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(-1e9), 0xfc00);
        // ties to even
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0x0000);
        assert_eq!(f32_to_f16(f32::from_bits(0x3300_0001)), 0x0001);
        // NaNs as numpy converts them
        assert_eq!(f32_to_f16(f32::from_bits(0x7f80_0001)), 0x7c01);
        assert_eq!(f32_to_f16(f32::from_bits(0xff81_2345)), 0xfc09);
        assert_eq!(f32_to_f16(f32::from_bits(0x7fc0_0000)), 0x7e00);
    }

    #[test]
    fn f16_round_trips_every_value_nan_included() {
        for bits in 0..=u16::MAX {
            let x = f16_to_f32(bits);
            assert_eq!(f32_to_f16(x), bits, "{bits:#06x}");
        }
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80); // tie, even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82); // tie, even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80); // rounds to inf
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0); // quieted
        assert_eq!(f32_to_bf16(f32::from_bits(0xffff_ffff)), 0xffff);
        for bits in 0..=u16::MAX {
            if bits & 0x7f80 == 0x7f80 && bits & 0x7f != 0 {
                continue; // NaN: quieted
            }
            assert_eq!(f32_to_bf16(bf16_to_f32(bits)), bits);
        }
    }

    #[test]
    fn slice_paths_match_scalar() {
        let bits: Vec<u16> = (0..200u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 16) as u16)
            .chain([0x7c01, 0xfd00, 0x7e00, 0x7c00])
            .collect();
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let mut out = vec![0f32; bits.len()];
        dequantize_f16(&bytes, &mut out);
        for (b, y) in bits.iter().zip(&out) {
            assert_eq!(y.to_bits(), f16_to_f32(*b).to_bits());
        }
        let mut back = vec![0u8; bytes.len()];
        quantize_f16(&out, &mut back);
        assert_eq!(back, bytes);
    }
}
