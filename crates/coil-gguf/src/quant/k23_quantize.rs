//! Q2_K and Q3_K quantizers: ggml's reference algorithms
//! (`quantize_row_q2_K_ref`, `quantize_row_q3_K_ref`), the path
//! `llama-quantize` takes for them without an importance matrix.
//!
//! - Q2_K: per sub-block of 16, levels 0..=3 with a scale and a min from
//!   `make_qkx2_quants` (weights `|x|`, absolute-error search over 16
//!   candidate steps; [`super::search_lanes`]); the 16 scales and 16 mins quantized to 4 bits against
//!   their maxima (`d`, `dmin`).
//! - Q3_K: per sub-block of 16, symmetric levels −4..=3 from `make_q3_quants`
//!   (weights `x²`, up to five passes that move single levels while the
//!   weighted fit improves); the 16 scales quantized to signed 6 bits against
//!   the one of largest magnitude.
//!
//! Arithmetic is f32 in ggml's operation order, so the bytes equal ggml's
//! (`kquants_match_ggml_reference` in the crate's tests).

use super::float::{read_f16, write_f16};
use super::kquants::{Q2_K_BYTES, Q3_K_BYTES, QK_K};
use super::kquants_quantize::nearest_int;
use super::search_lanes::{
    largest_magnitude, make_q3, make_qkx2, max_positive, transpose, untranspose,
};
use super::{blocks, blocks_mut};

/// The 2-bit levels of four 32-value runs packed per byte, as Q2_K and Q3_K
/// store them: byte `l` of each 128-value half holds values `l`, `l + 32`,
/// `l + 64`, `l + 96` in bits 0–1, 2–3, 4–5, 6–7.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for (h, j) in (0..QK_K).step_by(128).enumerate() {
        for i in 0..32 {
            qs[32 * h + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

/// Encodes one Q2_K block: `scales[16]` @0 (scale low nibble, min high),
/// `qs[64]` @16, `d` @80, `dmin` @82.
pub fn quantize_block_q2_k(x: &[f32; QK_K], y: &mut [u8; Q2_K_BYTES]) {
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    // the 16 sub-blocks of 16 side by side (lanes), weights |x|
    let xt = transpose::<16, 16>(x);
    let wt = xt.map(|xi| xi.map(f32::abs));
    let mut lt = [[0u8; 16]; 16];
    let (scales, mins) = make_qkx2::<16, 16, true>(&xt, &wt, 3, &mut lt, -0.5, 0.1, 15);
    untranspose(&lt, &mut l);
    let (max_scale, max_min) = (max_positive(&scales), max_positive(&mins));
    y.fill(0);
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for j in 0..16 {
            y[j] = nearest_int(iscale * scales[j]) as u8;
        }
        write_f16(y, 80, max_scale / Q4SCALE);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for j in 0..16 {
            y[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        write_f16(y, 82, max_min / Q4SCALE);
    }
    let (d_all, dmin_all) = (read_f16(y, 80), read_f16(y, 82));
    for j in 0..16 {
        let d = d_all * (y[j] & 0xf) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * (y[j] >> 4) as f32;
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&l, &mut y[16..80]);
}

/// Encodes one Q3_K block: `hmask[32]` @0 (bit 2 of each level), `qs[64]`
/// @32 (bits 0–1), `scales[12]` @96 (16 × 6 bits, offset 32), `d` @108.
pub fn quantize_block_q3_k(x: &[f32; QK_K], y: &mut [u8; Q3_K_BYTES]) {
    let mut l = [0i8; QK_K];
    let mut lt = [[0i8; 16]; 16];
    let scales = make_q3::<16, 16>(&transpose::<16, 16>(x), 4, &mut lt);
    untranspose(&lt, &mut l);
    let (max_scale, _) = largest_magnitude(&scales);
    y.fill(0);
    let mut sc = [0u8; 12];
    // `max_scale != 0.0` is ggml's `if (max_scale)`: a NaN takes this branch.
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            let q = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
            if j < 8 {
                sc[j] = q as u8 & 0xf;
            } else {
                sc[j - 8] |= (q as u8 & 0xf) << 4;
            }
            sc[j % 4 + 8] |= ((q >> 4) as u8) << (2 * (j / 4));
        }
        write_f16(y, 108, 1.0 / iscale);
    }
    y[96..108].copy_from_slice(&sc);
    let d_all = read_f16(y, 108);
    for j in 0..16 {
        let low = if j < 8 { sc[j] & 0xf } else { sc[j - 8] >> 4 };
        let high = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        let d = d_all * ((low | (high << 4)) as i8 - 32) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    // Bit 2 of value j goes to bit j / 32 of hmask[j % 32].
    let mut levels = [0u8; QK_K];
    for (j, (&v, out)) in l.iter().zip(&mut levels).enumerate() {
        let mut v = v as u8;
        if v > 3 {
            y[j % 32] |= 1 << (j / 32);
            v -= 4;
        }
        *out = v;
    }
    pack_2bit(&levels, &mut y[32..96]);
}

// ---- rows (lengths checked by the caller) ----

pub(crate) fn quantize_q2_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in blocks::<QK_K, f32>(src).zip(blocks_mut::<Q2_K_BYTES, u8>(dst)) {
        quantize_block_q2_k(x, y);
    }
}

pub(crate) fn quantize_q3_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in blocks::<QK_K, f32>(src).zip(blocks_mut::<Q3_K_BYTES, u8>(dst)) {
        quantize_block_q3_k(x, y);
    }
}
