//! The 2-bit lattice formats IQ2_XXS, IQ2_XS and IQ2_S (dequantization).
//!
//! A block of 256 values is 32 groups of 8; a group is one entry of a grid of
//! 8-vectors with coordinates in {8, 25, 43} ([`super::grids`]), times a sign
//! pattern, times the scale of its sub-block of 32. Scales: `db = d·(0.5 +
//! s)·0.25` with a 4-bit `s`.
//!
//! Layouts (little-endian; `d` is f16 @0):
//!
//! - **IQ2_XXS** (66 bytes): `qs: u16[32]` @2. Sub-block `ib` is the two
//!   u32 at `2 + 8·ib`: the first holds 4 grid indices (one byte each, into
//!   [`IQ2XXS_GRID`]), the second 4 × 7-bit sign indices (into
//!   [`KSIGNS_IQ2XS`], bit `7l`) and `s` in its top 4 bits.
//! - **IQ2_XS** (74 bytes): `qs: u16[32]` @2 (9-bit index into
//!   [`IQ2XS_GRID`], 7-bit sign index above it), `scales[8]` @66 (groups 0–1
//!   of sub-block `ib` use the low nibble, groups 2–3 the high one).
//! - **IQ2_S** (82 bytes): `qs[32]` @2 (low 8 bits of the 10-bit index into
//!   [`IQ2S_GRID`]), `signs[32]` @34 (a plain 8-bit sign mask per group),
//!   `qh[8]` @66 (bits `2l..2l+2` of byte `ib` are group `l`'s index bits 8–9),
//!   `scales[8]` @74 (as IQ2_XS).
//!
//! Every index a block can hold is inside its table by construction (8-, 9-
//! and 10-bit fields for grids of 256, 512 and 1024 entries; 7-bit sign
//! indices for 128 patterns), so no byte pattern is out of range.

use super::float::read_f16;
use super::grids::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KSIGNS_IQ2XS};
use super::kquants::QK_K;
use super::{blocks, blocks_mut};

pub const IQ2_XXS_BYTES: usize = 66;
pub const IQ2_XS_BYTES: usize = 74;
pub const IQ2_S_BYTES: usize = 82;

/// One group: `y[j] = db·grid[j]`, negated where bit `j` of `signs` is set.
#[inline(always)]
pub(crate) fn group(db: f32, grid: u64, signs: u8, y: &mut [f32]) {
    let g = grid.to_le_bytes();
    for j in 0..8 {
        let s = if signs & (1 << j) != 0 { -1.0 } else { 1.0 };
        y[j] = db * g[j] as f32 * s;
    }
}

/// The two sub-block scales of a 4-bit scale pair (IQ2_XS, IQ2_S).
#[inline(always)]
fn scale_pair(d: f32, sc: u8) -> [f32; 2] {
    [
        d * (0.5 + (sc & 0xf) as f32) * 0.25,
        d * (0.5 + (sc >> 4) as f32) * 0.25,
    ]
}

/// Decodes one IQ2_XXS block.
pub fn dequantize_block_iq2_xxs(b: &[u8; IQ2_XXS_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 0);
    for ib in 0..8 {
        let q = &b[2 + 8 * ib..10 + 8 * ib];
        let aux = u32::from_le_bytes([q[4], q[5], q[6], q[7]]);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let at = 32 * ib + 8 * l;
            group(db, IQ2XXS_GRID[q[l] as usize], signs, &mut y[at..at + 8]);
        }
    }
}

/// Decodes one IQ2_XS block.
pub fn dequantize_block_iq2_xs(b: &[u8; IQ2_XS_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 0);
    for ib in 0..8 {
        let db = scale_pair(d, b[66 + ib]);
        for l in 0..4 {
            let at = 2 + 2 * (4 * ib + l);
            let q = u16::from_le_bytes([b[at], b[at + 1]]);
            let signs = KSIGNS_IQ2XS[(q >> 9) as usize];
            let at = 32 * ib + 8 * l;
            group(
                db[l / 2],
                IQ2XS_GRID[(q & 511) as usize],
                signs,
                &mut y[at..at + 8],
            );
        }
    }
}

/// Decodes one IQ2_S block.
pub fn dequantize_block_iq2_s(b: &[u8; IQ2_S_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 0);
    for ib in 0..8 {
        let db = scale_pair(d, b[74 + ib]);
        let qh = b[66 + ib] as usize;
        for l in 0..4 {
            let index = b[2 + 4 * ib + l] as usize | ((qh << (8 - 2 * l)) & 0x300);
            let at = 32 * ib + 8 * l;
            group(
                db[l / 2],
                IQ2S_GRID[index],
                b[34 + 4 * ib + l],
                &mut y[at..at + 8],
            );
        }
    }
}

pub(crate) fn dequantize_iq2_xxs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<IQ2_XXS_BYTES, u8>(src).zip(blocks_mut::<QK_K, f32>(dst)) {
        dequantize_block_iq2_xxs(b, y);
    }
}

pub(crate) fn dequantize_iq2_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<IQ2_XS_BYTES, u8>(src).zip(blocks_mut::<QK_K, f32>(dst)) {
        dequantize_block_iq2_xs(b, y);
    }
}

pub(crate) fn dequantize_iq2_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<IQ2_S_BYTES, u8>(src).zip(blocks_mut::<QK_K, f32>(dst)) {
        dequantize_block_iq2_s(b, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq2_xxs_group_reads_grid_signs_and_scale() {
        let mut b = [0u8; IQ2_XXS_BYTES];
        b[0..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // d = 1
                                                           // sub-block 0: grid entries 0 and 1, sign pattern 1 on group 0, s = 3
        b[2] = 0;
        b[3] = 1;
        let aux: u32 = 1 | (3 << 28);
        b[6..10].copy_from_slice(&aux.to_le_bytes());
        let mut y = [0f32; QK_K];
        dequantize_block_iq2_xxs(&b, &mut y);
        let db = (0.5 + 3.0) * 0.25;
        let g0 = IQ2XXS_GRID[0].to_le_bytes();
        let s0 = KSIGNS_IQ2XS[1];
        for j in 0..8 {
            let s = if s0 & (1 << j) != 0 { -1.0 } else { 1.0 };
            assert_eq!(y[j], db * g0[j] as f32 * s);
            assert_eq!(y[8 + j], db * IQ2XXS_GRID[1].to_le_bytes()[j] as f32);
        }
        // KSIGNS patterns have even parity: pattern 1 flips two signs
        assert_eq!(s0.count_ones() % 2, 0);
    }

    #[test]
    fn iq2_s_uses_the_high_index_bits() {
        let mut b = [0u8; IQ2_S_BYTES];
        b[0..2].copy_from_slice(&0x3c00u16.to_le_bytes());
        b[2] = 7; // group 0, low bits
        b[66] = 0b11; // group 0, bits 8-9 → index 0x307
        let mut y = [0f32; QK_K];
        dequantize_block_iq2_s(&b, &mut y);
        let g = IQ2S_GRID[0x307].to_le_bytes();
        for j in 0..8 {
            assert_eq!(y[j], 0.125 * g[j] as f32);
        }
    }
}
