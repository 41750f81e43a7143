//! K-quant quantizers (Q4_K, Q5_K, Q6_K): ggml's reference algorithms
//! (`quantize_row_q4_K_ref`, `quantize_row_q5_K_ref`,
//! `quantize_row_q6_K_ref` with `make_qkx2_quants` / `make_qx_quants`), the
//! path `llama-quantize` takes without an importance matrix.
//!
//! - Q4_K / Q5_K: per sub-block of 32, a weighted search for scale and min
//!   (weights `sqrt(mean x²) + |x|`, 20 / 15 candidate steps), then the 8
//!   scales and 8 mins quantized to 6 bits against the block maxima.
//! - Q6_K: per sub-block of 16, a symmetric scale search (`rmse_type` 1:
//!   weights `x²`, 18 candidates), scales quantized to signed 8 bits.
//!
//! Arithmetic is f32 in ggml's order (no fused multiply-add here; ggml built
//! with FMA contraction may differ in the last bit of a few scales, which
//! moves a rare quant by one step).

use super::float::{read_f16, write_f16};
use super::kquants::{get_scale_min_k4, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K};
use super::search_lanes::{
    largest_magnitude, make_qkx2, make_qx, max_positive, transpose, untranspose,
};
use super::{blocks, blocks_mut};

pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even via the 1.5·2²³ trick.
#[inline]
pub(super) fn nearest_int(f: f32) -> i32 {
    let v = f + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The shared Q4_K / Q5_K scale search: per-sub-block levels in `l`, the
/// packed 6-bit scales/mins, and the super-block `d` / `dmin`.
fn qk_scales(
    x: &[f32; QK_K],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    l: &mut [u8; QK_K],
) -> ([u8; 12], f32, f32) {
    // the 8 sub-blocks of 32 side by side (lanes), weights `sqrt(mean x²) + |x|`
    let xt = transpose::<32, 8>(x);
    let mut sum_x2 = [0f32; 8];
    for xi in &xt {
        for k in 0..8 {
            sum_x2[k] += xi[k] * xi[k];
        }
    }
    let av_x = sum_x2.map(|s| (s / 32.0).sqrt());
    let wt = xt.map(|xi| std::array::from_fn(|k| av_x[k] + xi[k].abs()));
    let mut lt = [[0u8; 8]; 32];
    let (scales, mins) = make_qkx2::<32, 8, false>(&xt, &wt, nmax, &mut lt, rmin, 0.1, nstep);
    untranspose(&lt, l);
    let (max_scale, max_min) = (max_positive(&scales), max_positive(&mins));
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    (packed, max_scale / 63.0, max_min / 63.0)
}

/// Final levels against the stored (f16-rounded) scales.
fn qk_levels(
    x: &[f32; QK_K],
    packed: &[u8; 12],
    d_all: f32,
    dmin_all: f32,
    nmax: i32,
    l: &mut [u8; QK_K],
) {
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, packed);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax);
            l[32 * j + ii] = q as u8;
        }
    }
}

/// Encodes one Q4_K block.
pub fn quantize_block_q4_k(x: &[f32; QK_K], y: &mut [u8; Q4_K_BYTES]) {
    let mut l = [0u8; QK_K];
    let (packed, d, dmin) = qk_scales(x, 15, -1.0, 20, &mut l);
    write_f16(y, 0, d);
    write_f16(y, 2, dmin);
    y[4..16].copy_from_slice(&packed);
    qk_levels(x, &packed, read_f16(y, 0), read_f16(y, 2), 15, &mut l);
    let qs = &mut y[16..144];
    for (c, j) in (0..QK_K).step_by(64).enumerate() {
        for i in 0..32 {
            qs[32 * c + i] = l[j + i] | (l[j + i + 32] << 4);
        }
    }
}

/// Encodes one Q5_K block.
pub fn quantize_block_q5_k(x: &[f32; QK_K], y: &mut [u8; Q5_K_BYTES]) {
    let mut l = [0u8; QK_K];
    let (packed, d, dmin) = qk_scales(x, 31, -0.5, 15, &mut l);
    write_f16(y, 0, d);
    write_f16(y, 2, dmin);
    y[4..16].copy_from_slice(&packed);
    qk_levels(x, &packed, read_f16(y, 0), read_f16(y, 2), 31, &mut l);
    let mut qh = [0u8; 32];
    let mut ql = [0u8; 128];
    let (mut m1, mut m2) = (1u8, 2u8);
    for (c, n) in (0..QK_K).step_by(64).enumerate() {
        for j in 0..32 {
            let mut l1 = l[n + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = l[n + j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[32 * c + j] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
    y[16..48].copy_from_slice(&qh);
    y[48..176].copy_from_slice(&ql);
}

/// Encodes one Q6_K block.
pub fn quantize_block_q6_k(x: &[f32; QK_K], y: &mut [u8; Q6_K_BYTES]) {
    let mut l = [0i8; QK_K];
    let mut lt = [[0i8; 16]; 16];
    let scales = make_qx::<16, 16>(&transpose::<16, 16>(x), 32, &mut lt);
    untranspose(&lt, &mut l);
    pack_q6_k(x, &scales, &mut l, y);
}

/// The rest of a Q6_K block once its 16 sub-block scales are found (with
/// or without importance weights): the scales quantized to i8 under one
/// f16 `d`, the levels requantized at those scales (a sub-block whose
/// scale rounds to zero keeps the levels `l` holds), and the packing.
pub(super) fn pack_q6_k(x: &[f32], scales: &[f32; 16], l: &mut [i8; QK_K], y: &mut [u8]) {
    let (max_scale, max_abs_scale) = largest_magnitude(scales);
    y.fill(0);
    if max_abs_scale < GROUP_MAX_EPS {
        return;
    }
    let iscale = -128.0 / max_scale;
    write_f16(y, 208, 1.0 / iscale);
    let d_all = read_f16(y, 208);
    let mut sc = [0i8; 16];
    for ib in 0..16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        y[192 + ib] = sc[ib] as u8;
    }
    for j in 0..16 {
        let d = d_all * sc[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            l[16 * j + ii] = (q + 32) as i8;
        }
    }
    let (ql, rest) = y.split_at_mut(128);
    let qh = &mut rest[..64];
    for (c, j) in (0..QK_K).step_by(128).enumerate() {
        for i in 0..32 {
            let g = |k: usize| l[j + i + k] as u8;
            ql[64 * c + i] = (g(0) & 0xf) | ((g(64) & 0xf) << 4);
            ql[64 * c + i + 32] = (g(32) & 0xf) | ((g(96) & 0xf) << 4);
            qh[32 * c + i] =
                (g(0) >> 4) | ((g(32) >> 4) << 2) | ((g(64) >> 4) << 4) | ((g(96) >> 4) << 6);
        }
    }
}

// ---- rows (lengths checked by the caller) ----

pub(crate) fn quantize_q4_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in blocks::<QK_K, f32>(src).zip(blocks_mut::<Q4_K_BYTES, u8>(dst)) {
        quantize_block_q4_k(x, y);
    }
}

pub(crate) fn quantize_q5_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in blocks::<QK_K, f32>(src).zip(blocks_mut::<Q5_K_BYTES, u8>(dst)) {
        quantize_block_q5_k(x, y);
    }
}

pub(crate) fn quantize_q6_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in blocks::<QK_K, f32>(src).zip(blocks_mut::<Q6_K_BYTES, u8>(dst)) {
        quantize_block_q6_k(x, y);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{dequantize, quantize};
    use crate::dtype::GgmlType;

    fn data(n: usize, seed: u64) -> Vec<f32> {
        // xorshift + Box-Muller: normal-ish values
        let mut s = seed;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        (0..n)
            .map(|_| {
                let (u, v) = (next().max(1e-12), next());
                ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
            })
            .collect()
    }

    fn rmse(a: &[f32], b: &[f32]) -> f64 {
        (a.iter()
            .zip(b)
            .map(|(x, y)| ((x - y) as f64).powi(2))
            .sum::<f64>()
            / a.len() as f64)
            .sqrt()
    }

    #[test]
    fn nearest_int_rounds_half_even() {
        assert_eq!(super::nearest_int(2.5), 2);
        assert_eq!(super::nearest_int(3.5), 4);
        assert_eq!(super::nearest_int(-1.5), -2);
        assert_eq!(super::nearest_int(-0.4), 0);
    }

    #[test]
    fn kquant_errors_are_small_and_ordered() {
        use GgmlType::*;
        let x = data(256 * 64, 7);
        let mut errs = Vec::new();
        for ty in [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K] {
            let q = quantize(ty, &x).unwrap();
            let y = dequantize(ty, &q).unwrap();
            errs.push(rmse(&x, &y));
        }
        // unit-variance normal data: Q4_K ~0.1, then halving per bit (measured with ggml)
        assert!(errs[2] < 0.12 && errs[2] > 0.07, "{errs:?}");
        for w in errs.windows(2) {
            assert!(w[1] < w[0] * 0.6, "{errs:?}");
        }
    }

    #[test]
    fn zeros_and_constants() {
        use GgmlType::*;
        for ty in [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS] {
            for c in [0.0f32, 1.0, -3.0] {
                let x = vec![c; 512];
                let y = dequantize(ty, &quantize(ty, &x).unwrap()).unwrap();
                for v in y {
                    assert!((v - c).abs() <= c.abs() * 0.02 + 1e-6, "{ty} {c} {v}");
                }
            }
            // non-finite input does not panic
            let mut x = data(512, 3);
            x[5] = f32::NAN;
            x[9] = f32::INFINITY;
            x[300] = f32::NEG_INFINITY;
            x[301] = f32::MAX;
            x[302] = f32::MIN_POSITIVE / 4.0;
            let _ = quantize(ty, &x).unwrap();
        }
    }
}
