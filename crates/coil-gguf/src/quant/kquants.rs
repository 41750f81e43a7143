//! The k-quant super-block formats (256 elements per block): Q2_K, Q3_K,
//! Q4_K, Q5_K, Q6_K, Q8_K. Dequantization only.
//!
//! Layouts (little-endian; `d`, `dmin` are f16 unless noted; offsets in bytes):
//!
//! - **Q2_K** (84): `scales[16]` @0, `qs[64]` @16, `d` @80, `dmin` @82.
//!   16 sub-blocks of 16; `scales[i]` = 4-bit scale (low) | 4-bit min (high).
//!   Element `e = 128·h + 32·s + l` (h < 2, s < 4, l < 32) is
//!   `q = (qs[32·h + l] >> 2s) & 3`; value `(d·sc)·q − (dmin·m)` with the
//!   scale/min of sub-block `e / 16`.
//! - **Q3_K** (110): `hmask[32]` @0, `qs[64]` @32, `scales[12]` @96, `d` @108.
//!   16 sub-blocks of 16 with 6-bit signed scales (`sc − 32`): scale `i` has
//!   low 4 bits from `scales[i % 8]` (low nibble for i < 8, high for i ≥ 8)
//!   and high 2 bits `(scales[8 + i % 4] >> 2·(i / 4)) & 3`. Element
//!   `e = 128·h + 32·s + l`: low bits `(qs[32·h + l] >> 2s) & 3`, minus 4 when
//!   bit `e / 32` of `hmask[l]` is *clear*; value `(d·(sc − 32))·q`.
//! - **Q4_K** (144): `d` @0, `dmin` @2, `scales[12]` @4, `qs[128]` @16.
//!   8 sub-blocks of 32 with 6-bit scale and min packed by
//!   [`get_scale_min_k4`]. Sub-block `j` takes the low (`j` even) or high
//!   (`j` odd) nibbles of `qs[32·(j/2) .. 32·(j/2) + 32]`; value
//!   `(d·sc)·q − (dmin·m)`.
//! - **Q5_K** (176): `d` @0, `dmin` @2, `scales[12]` @4, `qh[32]` @16,
//!   `qs[128]` @48. As Q4_K, plus bit 4 of element `l` of sub-block `j` is
//!   bit `j` of `qh[l]`.
//! - **Q6_K** (210): `ql[128]` @0, `qh[64]` @128, `scales: [i8; 16]` @192,
//!   `d` @208. Element `e = 128·h + r` (r < 128): low 4 bits
//!   `(ql[64·h + r % 64] >> 4·(r / 64)) & 15`, high 2 bits
//!   `(qh[32·h + r % 32] >> 2·(r / 32)) & 3`, `q = that − 32`; value
//!   `(d·scales[e / 16])·q`.
//! - **Q8_K** (292): `d: f32` @0, `qs: [i8; 256]` @4, `bsums: [i16; 16]` @260
//!   (sums of groups of 16 `qs`, used only by dot products); value `d·q`.
//!
//! All arithmetic is f32 in exactly the order of ggml's reference C code and
//! of `gguf.quants` (no fused multiply-add), so results are bit-identical.

use super::float::read_f16;
use super::{blocks, blocks_mut};

/// Elements per k-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of the packed 6-bit scales/mins of Q4_K and Q5_K.
pub const K_SCALE_SIZE: usize = 12;

pub const Q2_K_BYTES: usize = 84;
pub const Q3_K_BYTES: usize = 110;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;
pub const Q8_K_BYTES: usize = 292;

/// Scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block from its 12
/// packed scale bytes (ggml's `get_scale_min_k4`). Both are 6-bit values.
///
/// ```text
///  0 EEAAAAAA   4 eeaaaaaa   8 eeeeEEEE      A..H: scales 0..3 (low 6 bits) and
///  1 FFBBBBBB   5 ffbbbbbb   9 ffffFFFF      scales 4..7 (E..H = 2 + 4 bits)
///  2 GGCCCCCC   6 ggcccccc  10 ggggGGGG      a..h: the same for the mins
///  3 HHDDDDDD   7 hhdddddd  11 hhhhHHHH
/// ```
///
/// `j` is taken modulo 8.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    let j = j & 7;
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[inline]
fn scale_bytes(b: &[u8], at: usize) -> [u8; K_SCALE_SIZE] {
    let mut s = [0u8; K_SCALE_SIZE];
    s.copy_from_slice(&b[at..at + K_SCALE_SIZE]);
    s
}

/// Decodes one Q2_K block.
#[inline]
pub fn dequantize_block_q2_k(b: &[u8; Q2_K_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 80);
    let dmin = read_f16(b, 82);
    let mut dl = [0f32; 16];
    let mut ml = [0f32; 16];
    for ((dv, mv), &sc) in dl.iter_mut().zip(ml.iter_mut()).zip(&b[0..16]) {
        *dv = d * (sc & 0x0f) as f32;
        *mv = dmin * (sc >> 4) as f32;
    }
    let qs = &b[16..80];
    for h in 0..2 {
        for s in 0..4 {
            let out = &mut y[128 * h + 32 * s..128 * h + 32 * s + 32];
            let q = &qs[32 * h..32 * h + 32];
            for half in 0..2 {
                let is = 8 * h + 2 * s + half;
                let (dl, ml) = (dl[is], ml[is]);
                let out = &mut out[16 * half..16 * half + 16];
                for (o, &qv) in out.iter_mut().zip(&q[16 * half..16 * half + 16]) {
                    *o = dl * ((qv >> (2 * s)) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// The 16 signed 6-bit scales of a Q3_K block (`sc − 32`).
#[inline]
fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = (s[i % 8] >> (4 * (i / 8))) & 0x0f;
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// Decodes one Q3_K block.
#[inline]
pub fn dequantize_block_q3_k(b: &[u8; Q3_K_BYTES], y: &mut [f32; QK_K]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = q3_k_scales(&b[96..108]);
    let d = read_f16(b, 108);
    for h in 0..2 {
        for s in 0..4 {
            let bit = 4 * h + s;
            for half in 0..2 {
                let dl = d * scales[8 * h + 2 * s + half] as f32;
                for l in 16 * half..16 * half + 16 {
                    let low = ((qs[32 * h + l] >> (2 * s)) & 3) as i8;
                    let q = low - if (hmask[l] >> bit) & 1 != 0 { 0 } else { 4 };
                    y[128 * h + 32 * s + l] = dl * q as f32;
                }
            }
        }
    }
}

/// Decodes one Q4_K block.
#[inline]
pub fn dequantize_block_q4_k(b: &[u8; Q4_K_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 0);
    let dmin = read_f16(b, 2);
    let scales = scale_bytes(b, 4);
    let qs = &b[16..144];
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &scales);
        let d1 = d * sc as f32;
        let m1 = dmin * m as f32;
        let shift = 4 * (j % 2);
        let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
        let out = &mut y[32 * j..32 * j + 32];
        for (o, &qv) in out.iter_mut().zip(q) {
            *o = d1 * ((qv >> shift) & 0x0f) as f32 - m1;
        }
    }
}

/// Decodes one Q5_K block.
#[inline]
pub fn dequantize_block_q5_k(b: &[u8; Q5_K_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 0);
    let dmin = read_f16(b, 2);
    let scales = scale_bytes(b, 4);
    let qh = &b[16..48];
    let qs = &b[48..176];
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &scales);
        let d1 = d * sc as f32;
        let m1 = dmin * m as f32;
        let shift = 4 * (j % 2);
        let q = &qs[32 * (j / 2)..32 * (j / 2) + 32];
        let out = &mut y[32 * j..32 * j + 32];
        for ((o, &qv), &hv) in out.iter_mut().zip(q).zip(qh) {
            let v = ((qv >> shift) & 0x0f) | (((hv >> j) & 1) << 4);
            *o = d1 * v as f32 - m1;
        }
    }
}

/// Decodes one Q6_K block.
#[inline]
pub fn dequantize_block_q6_k(b: &[u8; Q6_K_BYTES], y: &mut [f32; QK_K]) {
    let d = read_f16(b, 208);
    // d·scale per 16-element group, rounded once as ggml and numpy do
    let mut ds = [0f32; 16];
    for (o, &s) in ds.iter_mut().zip(&b[192..208]) {
        *o = d * s as i8 as f32;
    }
    for h in 0..2 {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        let ds = &ds[8 * h..8 * h + 8];
        let y = &mut y[128 * h..128 * h + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i8 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            y[l] = ds[is] * q1 as f32;
            y[l + 32] = ds[is + 2] * q2 as f32;
            y[l + 64] = ds[is + 4] * q3 as f32;
            y[l + 96] = ds[is + 6] * q4 as f32;
        }
    }
}

/// Decodes one Q8_K block.
#[inline]
pub fn dequantize_block_q8_k(b: &[u8; Q8_K_BYTES], y: &mut [f32; QK_K]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (o, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
        *o = d * q as i8 as f32;
    }
}

macro_rules! rows {
    ($deq:ident, $dblock:ident, $bytes:expr) => {
        pub(crate) fn $deq(src: &[u8], dst: &mut [f32]) {
            for (b, y) in blocks::<$bytes, u8>(src).zip(blocks_mut::<QK_K, f32>(dst)) {
                $dblock(b, y);
            }
        }
    };
}

rows!(dequantize_q2_k, dequantize_block_q2_k, Q2_K_BYTES);
rows!(dequantize_q3_k, dequantize_block_q3_k, Q3_K_BYTES);
rows!(dequantize_q4_k, dequantize_block_q4_k, Q4_K_BYTES);
rows!(dequantize_q5_k, dequantize_block_q5_k, Q5_K_BYTES);
rows!(dequantize_q6_k, dequantize_block_q6_k, Q6_K_BYTES);
rows!(dequantize_q8_k, dequantize_block_q8_k, Q8_K_BYTES);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_unpacking() {
        // scales 0..3 = 1,2,3,4; mins 0..3 = 5,6,7,8;
        // scale 4 = 0b11_0101 (53), min 4 = 0b10_1010 (42)
        let mut q = [0u8; 12];
        q[..4].copy_from_slice(&[1, 2, 3, 4]);
        q[4..8].copy_from_slice(&[5, 6, 7, 8]);
        q[0] |= 0b11 << 6; // high bits of scale 4
        q[4] |= 0b10 << 6; // high bits of min 4
        q[8] = 0b1010_0101; // low nibbles: scale 4 = 0101, min 4 = 1010
        assert_eq!(get_scale_min_k4(0, &q), (1, 5));
        assert_eq!(get_scale_min_k4(3, &q), (4, 8));
        assert_eq!(get_scale_min_k4(4, &q), (53, 42));
        assert_eq!(get_scale_min_k4(5, &q), (0, 0));
    }

    #[test]
    fn q4_k_simple_block() {
        // d = 1, dmin = 0.5, every scale 2 and min 1, every nibble 3 (low) / 5 (high)
        let mut b = [0u8; Q4_K_BYTES];
        b[0..2].copy_from_slice(&0x3c00u16.to_le_bytes());
        b[2..4].copy_from_slice(&0x3800u16.to_le_bytes());
        for j in 0..4 {
            b[4 + j] = 2;
            b[8 + j] = 1;
        }
        b[12..16].fill(0x12); // scales 4..7 = 2, mins 4..7 = 1
        b[16..].fill(0x53);
        let mut y = [0f32; QK_K];
        dequantize_block_q4_k(&b, &mut y);
        for (e, v) in y.iter().enumerate() {
            let q = if (e / 32) % 2 == 0 { 3.0 } else { 5.0 };
            assert_eq!(*v, 2.0 * q - 0.5, "element {e}");
        }
    }

    #[test]
    fn q8_k_is_d_times_q() {
        let mut b = [0u8; Q8_K_BYTES];
        b[0..4].copy_from_slice(&0.25f32.to_le_bytes());
        for i in 0..QK_K {
            b[4 + i] = (i as i8).wrapping_sub(100) as u8;
        }
        let mut y = [0f32; QK_K];
        dequantize_block_q8_k(&b, &mut y);
        for (i, v) in y.iter().enumerate() {
            assert_eq!(*v, 0.25 * (i as i8).wrapping_sub(100) as f32);
        }
    }
}
