//! The 3-bit lattice formats IQ3_XXS and IQ3_S (dequantization).
//!
//! A block of 256 values is 64 groups of 4; a group is one entry of a grid of
//! 4-vectors ([`IQ3XXS_GRID`]: coordinates {4, 12, …, 52, 62}; [`IQ3S_GRID`]:
//! {1, 3, …, 15}) times a sign pattern per 8 values, times the scale of its
//! sub-block of 32.
//!
//! Layouts (little-endian; `d` is f16 @0):
//!
//! - **IQ3_XXS** (98 bytes): `qs[64]` @2 (8-bit grid indices, 8 per
//!   sub-block), then per sub-block `ib` a u32 @`66 + 4·ib`: 4 × 7-bit sign
//!   indices into [`KSIGNS_IQ2XS`] (bit `7l`, one per 8 values) and a 4-bit
//!   `s` in the top bits; `db = d·(0.5 + s)·0.5`.
//! - **IQ3_S** (110 bytes): `qs[64]` @2 (low 8 bits of 9-bit indices), `qh[8]`
//!   @66 (bit `k` of byte `ib` is index `8·ib + k`'s 9th bit), `signs[32]` @74
//!   (a plain sign mask per 8 values), `scales[4]` @106 (nibbles; sub-block
//!   `ib` has `db = d·(1 + 2·s)`).
//!
//! Every index a block can hold is inside its table by construction.

use super::float::read_f16;
use super::grids::{IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS};
use super::kquants::QK_K;
use super::{blocks, blocks_mut};

pub const IQ3_XXS_BYTES: usize = 98;
pub const IQ3_S_BYTES: usize = 110;

/// Eight values from two grid entries: `y[j] = db·grid[j]`, negated where bit
/// `j` of `signs` is set.
#[inline(always)]
fn pair(db: f32, g1: u32, g2: u32, signs: u8, y: &mut [f32]) {
    let g = [g1.to_le_bytes(), g2.to_le_bytes()];
    for j in 0..8 {
        let s = if signs & (1 << j) != 0 { -1.0 } else { 1.0 };
        y[j] = db * g[j / 4][j % 4] as f32 * s;
    }
}

/// Decodes one IQ3_XXS block.
pub fn dequantize_block_iq3_xxs(b: &[u8; IQ3_XXS_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 0);
    for ib in 0..8 {
        let qs = &b[2 + 8 * ib..10 + 8 * ib];
        let at = 66 + 4 * ib;
        let aux = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let (g1, g2) = (
                IQ3XXS_GRID[qs[2 * l] as usize],
                IQ3XXS_GRID[qs[2 * l + 1] as usize],
            );
            let at = 32 * ib + 8 * l;
            pair(db, g1, g2, signs, &mut y[at..at + 8]);
        }
    }
}

/// Decodes one IQ3_S block.
pub fn dequantize_block_iq3_s(b: &[u8; IQ3_S_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 0);
    for ib in 0..8 {
        let sc = b[106 + ib / 2] >> (4 * (ib % 2));
        let db = d * (1 + 2 * (sc & 0xf) as i32) as f32;
        let qs = &b[2 + 8 * ib..10 + 8 * ib];
        let qh = b[66 + ib] as usize;
        for l in 0..4 {
            let i1 = qs[2 * l] as usize | ((qh << (8 - 2 * l)) & 256);
            let i2 = qs[2 * l + 1] as usize | ((qh << (7 - 2 * l)) & 256);
            let at = 32 * ib + 8 * l;
            pair(
                db,
                IQ3S_GRID[i1],
                IQ3S_GRID[i2],
                b[74 + 4 * ib + l],
                &mut y[at..at + 8],
            );
        }
    }
}

pub(crate) fn dequantize_iq3_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<IQ3_XXS_BYTES, u8>(src).zip(blocks_mut::<QK_K, f32>(dst)) {
        dequantize_block_iq3_xxs(b, y);
    }
}

pub(crate) fn dequantize_iq3_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<IQ3_S_BYTES, u8>(src).zip(blocks_mut::<QK_K, f32>(dst)) {
        dequantize_block_iq3_s(b, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq3_s_scales_and_high_bits() {
        let mut b = [0u8; IQ3_S_BYTES];
        b[0..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // d = 1
        b[106] = 0x21; // sub-block 0: 1 + 2·1 = 3; sub-block 1: 1 + 2·2 = 5
        b[2] = 5; // value group 0 → index 5 | 256
        b[66] = 1;
        b[74] = 0x0f; // first four values negative
        let mut y = [0f32; QK_K];
        dequantize_block_iq3_s(&b, &mut y);
        let g = IQ3S_GRID[256 + 5].to_le_bytes();
        for j in 0..4 {
            assert_eq!(y[j], -3.0 * g[j] as f32);
        }
        assert_eq!(y[4], 3.0 * IQ3S_GRID[0].to_le_bytes()[0] as f32);
        assert_eq!(y[32], 5.0 * IQ3S_GRID[0].to_le_bytes()[0] as f32);
    }
}
