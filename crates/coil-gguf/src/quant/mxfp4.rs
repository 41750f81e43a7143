//! MXFP4 (OCP microscaling FP4): blocks of 32 E2M1 values sharing one E8M0
//! exponent. Both directions; the quantizer is ggml's
//! `quantize_row_mxfp4_ref` (llama-quantize ignores importance weights for it).
//!
//! Layout (17 bytes): `e` @0, `qs[16]` @1. Byte `j` holds value `j` (low
//! nibble) and `j + 16` (high). A nibble selects one of [`KVALUES_MXFP4`]
//! (the E2M1 values doubled: 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12), and the
//! block's scale is `2^(e − 128)` (half of E8M0's `2^(e − 127)`, undoing the
//! doubling; `e` = 0 and 1 give the subnormals 2⁻¹²⁸ and 2⁻¹²⁷).

use super::grids::KVALUES_MXFP4;
use super::{blocks, blocks_mut};

pub const QK_MXFP4: usize = 32;
pub const MXFP4_BYTES: usize = 17;

/// `2^(e − 128)` (ggml's `ggml_e8m0_to_fp32_half`).
#[inline]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e - 1) as u32) << 23
    };
    f32::from_bits(bits)
}

/// Decodes one MXFP4 block.
#[inline]
pub fn dequantize_block_mxfp4(b: &[u8; MXFP4_BYTES], y: &mut [f32; QK_MXFP4]) {
    let d = e8m0_to_f32_half(b[0]);
    for j in 0..16 {
        y[j] = KVALUES_MXFP4[(b[1 + j] & 0xf) as usize] as f32 * d;
        y[j + 16] = KVALUES_MXFP4[(b[1 + j] >> 4) as usize] as f32 * d;
    }
}

/// The index of the table value nearest `x` at scale `d` (the first of
/// equally near ones).
#[inline]
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (KVALUES_MXFP4[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i;
            best_err = err;
        }
    }
    best as u8
}

/// Encodes one MXFP4 block: `e = ⌊log₂ amax⌋ − 2 + 127` (0 for an all-zero
/// block), then the nearest value for each element.
pub fn quantize_block_mxfp4(x: &[f32; QK_MXFP4], y: &mut [u8; MXFP4_BYTES]) {
    let amax = x
        .iter()
        .fold(0f32, |m, v| if m < v.abs() { v.abs() } else { m });
    let e = if amax > 0.0 {
        // ggml converts the float to uint8_t; on x86-64 that truncates
        // through a 32-bit integer (an infinite amax gives 0).
        let v = amax.log2().floor() - 2.0 + 127.0;
        if v.is_finite() {
            v as i32 as u8
        } else {
            0
        }
    } else {
        0
    };
    let d = e8m0_to_f32_half(e);
    y[0] = e;
    for j in 0..16 {
        y[1 + j] = best_index(x[j], d) | (best_index(x[j + 16], d) << 4);
    }
}

pub(crate) fn dequantize_mxfp4(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<MXFP4_BYTES, u8>(src).zip(blocks_mut::<QK_MXFP4, f32>(dst)) {
        dequantize_block_mxfp4(b, y);
    }
}

pub(crate) fn quantize_mxfp4(src: &[f32], dst: &mut [u8]) {
    for (x, y) in blocks::<QK_MXFP4, f32>(src).zip(blocks_mut::<MXFP4_BYTES, u8>(dst)) {
        quantize_block_mxfp4(x, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_a_power_of_two() {
        assert_eq!(e8m0_to_f32_half(128), 1.0);
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_to_f32_half(255), 2f32.powi(127));
    }

    #[test]
    fn representable_values_round_trip() {
        let x: [f32; QK_MXFP4] = std::array::from_fn(|i| KVALUES_MXFP4[i % 16] as f32 * 0.25);
        let mut b = [0u8; MXFP4_BYTES];
        quantize_block_mxfp4(&x, &mut b);
        let mut y = [0f32; QK_MXFP4];
        dequantize_block_mxfp4(&b, &mut y);
        assert_eq!(y, x);
    }
}
