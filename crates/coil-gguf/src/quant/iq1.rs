//! The 1-bit lattice formats IQ1_S and IQ1_M (dequantization).
//!
//! A block of 256 values is 32 groups of 8; a group is one entry of
//! [`IQ1S_GRID`] (coordinates in {−1, 0, 1}) shifted by `±δ` ([`IQ1S_DELTA`]),
//! times an odd 3-bit scale `2s + 1` and the block's `d`.
//!
//! Layouts (little-endian):
//!
//! - **IQ1_S** (50 bytes): `d` f16 @0, `qs[32]` @2 (low 8 bits of 11-bit grid
//!   indices), `qh: u16[8]` @34, one per sub-block of 32: bits `3l..3l+3` are
//!   group `l`'s index bits 8–10, bits 12–14 the scale `s`, bit 15 the sign
//!   of `δ` (set: `−δ`). Value `d·(2s + 1)·(grid[j] + δ)`.
//! - **IQ1_M** (56 bytes): `qs[32]` @0, `qh[16]` @32 (per pair of groups: the
//!   low nibble has group `2k`'s index bits 8–10 and, in bit 3, its `δ` sign;
//!   the high nibble group `2k + 1`'s), `scales: u16[4]` @48: the f16 `d` is
//!   the top nibbles of the four u16 (first one lowest); each u16 also holds
//!   four 3-bit scales (bits 0, 3, 6, 9), one per half sub-block of 16.
//!
//! Every index a block can hold is inside the grid by construction (11 bits,
//! 2048 entries).

use super::float::{f16_to_f32, read_f16};
use super::grids::{IQ1S_DELTA, IQ1S_GRID};
use super::kquants::QK_K;
use super::{blocks, blocks_mut};

pub const IQ1_S_BYTES: usize = 50;
pub const IQ1_M_BYTES: usize = 56;

/// One group: `y[j] = dl·(grid[j] + delta)`.
#[inline(always)]
fn group(dl: f32, index: usize, delta: f32, y: &mut [f32]) {
    let g = IQ1S_GRID[index].to_le_bytes();
    for j in 0..8 {
        y[j] = dl * (g[j] as i8 as f32 + delta);
    }
}

/// Decodes one IQ1_S block.
pub fn dequantize_block_iq1_s(b: &[u8; IQ1_S_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 0);
    for ib in 0..8 {
        let qh = u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]) as usize;
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 != 0 {
            -IQ1S_DELTA
        } else {
            IQ1S_DELTA
        };
        for l in 0..4 {
            let index = b[2 + 4 * ib + l] as usize | (((qh >> (3 * l)) & 7) << 8);
            let at = 32 * ib + 8 * l;
            group(dl, index, delta, &mut y[at..at + 8]);
        }
    }
}

/// The f16 block scale of IQ1_M, from the top nibbles of its four scale words.
#[inline]
pub fn iq1_m_scale(sc: [u16; 4]) -> f32 {
    f16_to_f32((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000))
}

/// Decodes one IQ1_M block.
pub fn dequantize_block_iq1_m(b: &[u8; IQ1_M_BYTES], y: &mut [f32; QK_K]) {
    let sc: [u16; 4] = std::array::from_fn(|k| u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]));
    let d = iq1_m_scale(sc);
    for ib in 0..8 {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let dl = [
            d * (2 * (s & 7) + 1) as f32,
            d * (2 * ((s >> 3) & 7) + 1) as f32,
        ];
        let qs = &b[4 * ib..4 * ib + 4];
        let qh = [b[32 + 2 * ib] as usize, b[33 + 2 * ib] as usize];
        for l in 0..4 {
            let h = qh[l / 2] >> (4 * (l % 2));
            let index = qs[l] as usize | ((h & 7) << 8);
            let delta = if h & 8 != 0 { -IQ1S_DELTA } else { IQ1S_DELTA };
            let at = 32 * ib + 8 * l;
            group(dl[l / 2], index, delta, &mut y[at..at + 8]);
        }
    }
}

pub(crate) fn dequantize_iq1_s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<IQ1_S_BYTES, u8>(src).zip(blocks_mut::<QK_K, f32>(dst)) {
        dequantize_block_iq1_s(b, y);
    }
}

pub(crate) fn dequantize_iq1_m(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<IQ1_M_BYTES, u8>(src).zip(blocks_mut::<QK_K, f32>(dst)) {
        dequantize_block_iq1_m(b, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq1_s_scale_delta_and_index() {
        let mut b = [0u8; IQ1_S_BYTES];
        b[0..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // d = 1
        b[2] = 0x34;
        let qh: u16 = 0b101 | (2 << 12) | 0x8000; // group 0 index 0x534, s = 2, −δ
        b[34..36].copy_from_slice(&qh.to_le_bytes());
        let mut y = [0f32; QK_K];
        dequantize_block_iq1_s(&b, &mut y);
        let g = IQ1S_GRID[0x534].to_le_bytes();
        for j in 0..8 {
            assert_eq!(y[j], 5.0 * (g[j] as i8 as f32 - 0.125));
        }
    }

    #[test]
    fn iq1_m_scale_is_spread_over_four_words() {
        // f16 0x3c00 (1.0): nibbles 0, 0, c, 3 from the lowest
        let sc = [0x0000, 0x0000, 0xc000, 0x3000];
        assert_eq!(iq1_m_scale(sc), 1.0);
        let mut b = [0u8; IQ1_M_BYTES];
        for (k, w) in sc.iter().enumerate() {
            b[48 + 2 * k..50 + 2 * k].copy_from_slice(&w.to_le_bytes());
        }
        b[48] |= 0b011_010; // sub-block 0: scales 2 (values 0-15), 3 (16-31)
        b[33] = 0x80; // group 3: −δ
        let mut y = [0f32; QK_K];
        dequantize_block_iq1_m(&b, &mut y);
        let g = IQ1S_GRID[0].to_le_bytes();
        assert_eq!(y[0], 5.0 * (g[0] as i8 as f32 + 0.125));
        assert_eq!(y[16], 7.0 * (g[0] as i8 as f32 + 0.125));
        assert_eq!(y[24], 7.0 * (g[0] as i8 as f32 - 0.125));
    }
}
