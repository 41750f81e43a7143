//! The non-linear 4-bit formats IQ4_NL and IQ4_XS (dequantization only).
//! A 4-bit index selects one of the 16 values of [`KVALUES_IQ4NL`].
//!
//! Layouts (little-endian; `d` is f16):
//!
//! - **IQ4_NL** (18 bytes, 32 elements): `d` @0, `qs[16]` @2. Element
//!   `j < 16` is `d·K[qs[j] & 15]`, element `j + 16` is `d·K[qs[j] >> 4]`.
//! - **IQ4_XS** (136 bytes, 256 elements): `d` @0, `scales_h: u16` @2,
//!   `scales_l[4]` @4, `qs[128]` @8. 8 sub-blocks of 32; sub-block `ib` has
//!   the 6-bit scale `ls = ((scales_l[ib/2] >> 4·(ib%2)) & 15) |
//!   (((scales_h >> 2·ib) & 3) << 4)` and uses `qs[16·ib .. 16·ib + 16]` as
//!   IQ4_NL does; value `(d·(ls − 32))·K[q]`.

use super::float::read_f16;
use super::kquants::QK_K;
use super::{blocks, blocks_mut};

pub use super::grids::KVALUES_IQ4NL;

pub const QK4_NL: usize = 32;
pub const IQ4_NL_BYTES: usize = 18;
pub const IQ4_XS_BYTES: usize = 136;

#[inline]
fn kv(i: u8) -> f32 {
    KVALUES_IQ4NL[(i & 0x0f) as usize] as f32
}

/// Decodes one IQ4_NL block.
#[inline]
pub fn dequantize_block_iq4_nl(b: &[u8; IQ4_NL_BYTES], y: &mut [f32; QK4_NL]) {
    let d = read_f16(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = d * kv(qs[j]);
        y[j + 16] = d * kv(qs[j] >> 4);
    }
}

/// Decodes one IQ4_XS block.
#[inline]
pub fn dequantize_block_iq4_xs(b: &[u8; IQ4_XS_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let scales_l = &b[4..8];
    let qs = &b[8..136];
    for ib in 0..8 {
        let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let ls = (low | (high << 4)) as i32 - 32;
        let dl = d * ls as f32;
        let q = &qs[16 * ib..16 * ib + 16];
        let out = &mut y[32 * ib..32 * ib + 32];
        for j in 0..16 {
            out[j] = dl * kv(q[j]);
            out[j + 16] = dl * kv(q[j] >> 4);
        }
    }
}

pub(crate) fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<IQ4_NL_BYTES, u8>(src).zip(blocks_mut::<QK4_NL, f32>(dst)) {
        dequantize_block_iq4_nl(b, y);
    }
}

pub(crate) fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<IQ4_XS_BYTES, u8>(src).zip(blocks_mut::<QK_K, f32>(dst)) {
        dequantize_block_iq4_xs(b, y);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iq4_nl_maps_nibbles_through_the_table() {
        let mut b = [0u8; IQ4_NL_BYTES];
        b[0..2].copy_from_slice(&0x4000u16.to_le_bytes()); // d = 2
        for j in 0..16 {
            b[2 + j] = (j as u8) | (((15 - j) as u8) << 4);
        }
        let mut y = [0f32; QK4_NL];
        dequantize_block_iq4_nl(&b, &mut y);
        for j in 0..16 {
            assert_eq!(y[j], 2.0 * KVALUES_IQ4NL[j] as f32);
            assert_eq!(y[j + 16], 2.0 * KVALUES_IQ4NL[15 - j] as f32);
        }
    }

    #[test]
    fn iq4_xs_scales() {
        let mut b = [0u8; IQ4_XS_BYTES];
        b[0..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // d = 1
                                                           // sub-block 0: ls = 33 (low 1, high 2) → scale 1; sub-block 1: ls = 0 → -32
        b[2..4].copy_from_slice(&0b10u16.to_le_bytes());
        b[4] = 0x01;
        b[8..].fill(0x88); // index 8 → +1
        let mut y = [0f32; QK_K];
        dequantize_block_iq4_xs(&b, &mut y);
        assert!(y[..32].iter().all(|&v| v == 1.0));
        assert!(y[32..64].iter().all(|&v| v == -32.0));
    }
}
