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
use super::{blocks, blocks_mut};

pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even via the 1.5·2²³ trick.
#[inline]
pub(super) fn nearest_int(f: f32) -> i32 {
    let v = f + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// ggml's `make_qkx2_quants` for `n` ≤ 32 values, levels `0..=nmax`; the
/// error is weighted squares, or weighted absolute values with `use_mad`
/// (Q2_K). Returns (scale, −min) and fills `l`.
#[allow(clippy::too_many_arguments)]
pub(super) fn make_qkx2_quants(
    x: &[f32],
    weights: &[f32],
    nmax: i32,
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let n = x.len();
    let mut laux = [0u8; 32];
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let w = weights[i];
            let lf = q as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no importance weights:
/// symmetric levels `-nmax..nmax-1` stored as `l + nmax`.
fn make_qx_quants(x: &[f32], nmax: i32, l: &mut [i8]) -> f32 {
    let n = x.len();
    let mut max = 0f32;
    let mut amax = 0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l[..n].fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..n {
        let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (q + nmax) as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            let w = v * v;
            sumlx += w * v * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
                l[i] = (q + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
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
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let mut weights = [0f32; 32];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            xs,
            &weights,
            nmax,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
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
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let s = make_qx_quants(&x[16 * ib..16 * ib + 16], 32, &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
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
        for ty in [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K] {
            for c in [0.0f32, 1.0, -3.0] {
                let x = vec![c; 512];
                let y = dequantize(ty, &quantize(ty, &x).unwrap()).unwrap();
                for v in y {
                    assert!((v - c).abs() <= c.abs() * 0.02 + 1e-6, "{ty} {c} {v}");
                }
            }
            // non-finite input does not panic
            let mut x = data(256, 3);
            x[5] = f32::NAN;
            x[9] = f32::INFINITY;
            let _ = quantize(ty, &x).unwrap();
        }
    }
}
