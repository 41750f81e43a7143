//! Quantizers with importance weights (an importance matrix's mean squared
//! activations per column) for the legacy, K-quant and IQ4 formats:
//! ggml's `quantize_row_*_impl` paths that `ggml_quantize_chunk` takes when
//! given `quant_weights` (llama-quantize `--imatrix`), in plain scalar f32
//! arithmetic in ggml's operation order (ggml-base is built without FMA
//! contraction), so the bytes equal ggml's.
//!
//! - Q4_0 / Q5_0: `make_qx_quants` with weights `w·sqrt(σ² + x²)` (σ² the
//!   row's mean square), 19 candidate scales.
//! - Q4_1 / Q5_1: `make_qkx3_quants` (scale and min, 37 candidate steps).
//! - Q2_K / Q4_K / Q5_K: `make_qkx3_quants` per sub-block, the sub-block
//!   scales and mins quantized by `make_qp_quants` weighted by the
//!   sub-blocks' weight sums.
//! - Q3_K: `make_qx_quants` per sub-block and for the 16 scales.
//! - Q6_K: `make_qx_quants` weighted by the importance alone.
//! - IQ4_NL / IQ4_XS: ggml's `quantize_row_iq4_nl_impl` with the weights.
//!
//! Each function quantizes one row (`x.len()` a whole number of blocks,
//! `w` as long as `x`).

// index loops, as in ggml's source, keep the operation order visible
#![allow(clippy::needless_range_loop)]

use super::float::{read_f16, write_f16};
use super::get_scale_min_k4;
use super::kquants_quantize::{nearest_int, GROUP_MAX_EPS};
use super::KVALUES_IQ4NL;

const QK_K: usize = 256;

/// ggml's `make_qx_quants` (symmetric levels `-nmax..nmax-1`, stored
/// `+ nmax` in `l`) with weights `qw` and `rmse_type` 1.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8], qw: &[f32]) -> f32 {
    let n = x.len();
    let (mut max, mut amax) = (0f32, 0f32);
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
        let w = qw[i];
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
        for i in 0..n {
            let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            let w = qw[i];
            sumlx += w * x[i] * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let q = nearest_int(iscale * x[i]);
                l[i] = (nmax + q.clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_qkx3_quants` (levels `0..=nmax` with a scale and a min;
/// `rmin` −0.9, `rdelta` 0.05, 36 steps, squared error); returns the scale
/// and `-min`.
fn make_qkx3_quants(nmax: i32, x: &[f32], weights: &[f32], l: &mut [u8]) -> (f32, f32) {
    const RMIN: f32 = -0.9;
    const RDELTA: f32 = 0.05;
    const NSTEP: i32 = 36;
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
    if max <= min {
        l[..n].fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_mad = 0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_mad += weights[i] * (diff * diff);
    }
    for is in 0..=NSTEP {
        iscale = (RMIN + RDELTA * is as f32 + nmax as f32) / (max - min);
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
            let mut mad = 0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                mad += weights[i] * (diff * diff);
            }
            if mad < best_mad {
                l[..n].copy_from_slice(&laux[..n]);
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qp_quants`: non-negative levels `0..=nmax` for the
/// (non-negative) sub-block scales or mins `x`, weighted.
fn make_qp_quants(nmax: i32, x: &[f32], l: &mut [u8], qw: &[f32]) -> f32 {
    let n = x.len();
    let mut max = 0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max < GROUP_MAX_EPS {
        l[..n].fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    let mut li = [0i32; 16];
    // ggml keeps the levels in a uint8_t array
    let u8w = |q: i32| q as u8 as i32;
    for i in 0..n {
        li[i] = u8w(nearest_int(iscale * x[i]));
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0f32;
    for i in 0..n {
        let diff = x[i] - scale * li[i] as f32;
        best_mse += qw[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0f32;
        for i in 0..n {
            let q = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * q as f32;
            mse += qw[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..n {
        let q = nearest_int(iscale * x[i]).min(nmax);
        li[i] = u8w(q);
        let w = qw[i];
        sumlx += w * x[i] * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = qw[i];
            let mut slx = sumlx - w * x[i] * li[i] as f32;
            let mut sl2 = suml2 - w * li[i] as f32 * li[i] as f32;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != li[i] {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        li[i] = u8w(new_l);
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for i in 0..n {
        l[i] = li[i] as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The row's mean square (`Σx² / n`, summed in order).
fn mean_square(x: &[f32]) -> f32 {
    let mut s = 0f32;
    for &v in x {
        s += v * v;
    }
    s / x.len() as f32
}

/// `qw[j]·sqrt(sigma2 + x[j]²)`.
fn weights_of(qw: &[f32], x: &[f32], sigma2: f32, out: &mut [f32]) {
    for j in 0..x.len() {
        out[j] = qw[j] * (sigma2 + x[j] * x[j]).sqrt();
    }
}

pub(crate) fn quantize_q4_0(x: &[f32], w: &[f32], y: &mut [u8]) {
    let sigma2 = mean_square(x);
    let mut weight = [0f32; 32];
    let mut l = [0i8; 32];
    for ((xb, qw), b) in x
        .chunks_exact(32)
        .zip(w.chunks_exact(32))
        .zip(y.chunks_exact_mut(18))
    {
        weights_of(qw, xb, sigma2, &mut weight);
        let d = make_qx_quants(8, xb, &mut l, &weight);
        write_f16(b, 0, d);
        for j in 0..16 {
            b[2 + j] = (l[j] as u8) | ((l[j + 16] as u8) << 4);
        }
    }
}

pub(crate) fn quantize_q4_1(x: &[f32], w: &[f32], y: &mut [u8]) {
    let sigma2 = mean_square(x);
    let mut weight = [0f32; 32];
    let mut l = [0u8; 32];
    for ((xb, qw), b) in x
        .chunks_exact(32)
        .zip(w.chunks_exact(32))
        .zip(y.chunks_exact_mut(20))
    {
        weights_of(qw, xb, sigma2, &mut weight);
        let (d, min) = make_qkx3_quants(15, xb, &weight, &mut l);
        write_f16(b, 0, d);
        write_f16(b, 2, -min);
        for j in 0..16 {
            b[4 + j] = l[j] | (l[j + 16] << 4);
        }
    }
}

/// The 5-bit levels of a Q5_0 / Q5_1 block: low nibbles into `qs`, the
/// fifth bits as `qh`.
fn pack5(l: &[u8; 32], qs: &mut [u8]) -> [u8; 4] {
    let mut qh = 0u32;
    for j in 0..16 {
        let (a, b) = (l[j], l[j + 16]);
        qs[j] = (a & 0x0f) | ((b & 0x0f) << 4);
        qh |= (((a & 0x10) >> 4) as u32) << j;
        qh |= (((b & 0x10) >> 4) as u32) << (j + 16);
    }
    qh.to_le_bytes()
}

pub(crate) fn quantize_q5_0(x: &[f32], w: &[f32], y: &mut [u8]) {
    let sigma2 = mean_square(x);
    let mut weight = [0f32; 32];
    let mut l = [0i8; 32];
    for ((xb, qw), b) in x
        .chunks_exact(32)
        .zip(w.chunks_exact(32))
        .zip(y.chunks_exact_mut(22))
    {
        weights_of(qw, xb, sigma2, &mut weight);
        let d = make_qx_quants(16, xb, &mut l, &weight);
        write_f16(b, 0, d);
        let lu: [u8; 32] = std::array::from_fn(|i| l[i] as u8);
        let qh = pack5(&lu, &mut b[6..22]);
        b[2..6].copy_from_slice(&qh);
    }
}

pub(crate) fn quantize_q5_1(x: &[f32], w: &[f32], y: &mut [u8]) {
    let sigma2 = mean_square(x);
    let mut weight = [0f32; 32];
    let mut l = [0u8; 32];
    for ((xb, qw), b) in x
        .chunks_exact(32)
        .zip(w.chunks_exact(32))
        .zip(y.chunks_exact_mut(24))
    {
        weights_of(qw, xb, sigma2, &mut weight);
        let (d, min) = make_qkx3_quants(31, xb, &weight, &mut l);
        write_f16(b, 0, d);
        write_f16(b, 2, -min);
        let qh = pack5(&l, &mut b[8..24]);
        b[4..8].copy_from_slice(&qh);
    }
}

/// Blocks of 256 values, their weights and output bytes.
fn k_blocks<'a>(
    x: &'a [f32],
    w: &'a [f32],
    y: &'a mut [u8],
    bytes: usize,
) -> impl Iterator<Item = ((&'a [f32], &'a [f32]), &'a mut [u8])> {
    x.chunks_exact(QK_K)
        .zip(w.chunks_exact(QK_K))
        .zip(y.chunks_exact_mut(bytes))
}

pub(crate) fn quantize_q2_k(x: &[f32], w: &[f32], y: &mut [u8]) {
    for ((x, qw), b) in k_blocks(x, w, y, 84) {
        let mut l = [0u8; QK_K];
        let (mut mins, mut scales, mut sw) = ([0f32; 16], [0f32; 16], [0f32; 16]);
        let mut weight = [0f32; 16];
        let mut sumx2 = 0f32;
        for &v in x {
            sumx2 += v * v;
        }
        let sigma2 = sumx2 / QK_K as f32;
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            weights_of(&qw[16 * j..16 * j + 16], xs, sigma2, &mut weight);
            for &v in &weight {
                sw[j] += v;
            }
            let (s, m) = make_qkx3_quants(3, xs, &weight, &mut l[16 * j..16 * j + 16]);
            scales[j] = s;
            mins[j] = m;
        }
        let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
        let dm = make_qp_quants(15, &scales, &mut ls, &sw);
        let mm = make_qp_quants(15, &mins, &mut lm, &sw);
        write_f16(b, 80, dm);
        write_f16(b, 82, mm);
        let (dm, mm) = (read_f16(b, 80), read_f16(b, 82));
        for j in 0..16 {
            b[j] = ls[j] | (lm[j] << 4);
        }
        for j in 0..16 {
            let d = dm * (b[j] & 0xf) as f32;
            if d == 0.0 {
                continue;
            }
            let m = mm * (b[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((x[16 * j + ii] + m) / d).clamp(0, 3) as u8;
            }
        }
        for (h, j) in (0..QK_K).step_by(128).enumerate() {
            for i in 0..32 {
                b[16 + 32 * h + i] =
                    l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
            }
        }
    }
}

pub(crate) fn quantize_q3_k(x: &[f32], w: &[f32], y: &mut [u8]) {
    for ((x, qw), b) in k_blocks(x, w, y, 110) {
        let mut l = [0i8; QK_K];
        let (mut scales, mut sw) = ([0f32; 16], [0f32; 16]);
        let mut weight = [0f32; 16];
        let mut sumx2 = 0f32;
        for &v in x {
            sumx2 += v * v;
        }
        let sigma2 = 2.0 * sumx2 / QK_K as f32;
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            weights_of(&qw[16 * j..16 * j + 16], xs, sigma2, &mut weight);
            let mut sumw = 0f32;
            for &v in &weight {
                sumw += v;
            }
            sw[j] = sumw;
            scales[j] = make_qx_quants(4, xs, &mut l[16 * j..16 * j + 16], &weight);
        }
        b.fill(0);
        let mut ls = [0i8; 16];
        let d_block = make_qx_quants(32, &scales, &mut ls, &sw);
        let sc = &mut b[96..108];
        for j in 0..16 {
            let v = ls[j] as i32;
            if j < 8 {
                sc[j] = (v & 0xf) as u8;
            } else {
                sc[j - 8] |= ((v & 0xf) << 4) as u8;
            }
            let hi = v >> 4;
            sc[j % 4 + 8] |= (hi << (2 * (j / 4))) as u8;
        }
        write_f16(b, 108, d_block);
        let dd = read_f16(b, 108);
        for j in 0..16 {
            let sc = &b[96..108];
            let lo = if j < 8 { sc[j] & 0xf } else { sc[j - 8] >> 4 };
            let s = ((lo | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i8) - 32;
            let d = dd * s as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
                l[16 * j + ii] = (q + 4) as i8;
            }
        }
        let mut lu: [u8; QK_K] = std::array::from_fn(|i| l[i] as u8);
        let (mut m, mut hm) = (0usize, 1u8);
        for j in 0..QK_K {
            if lu[j] > 3 {
                b[m] |= hm;
                lu[j] -= 4;
            }
            m += 1;
            if m == QK_K / 8 {
                m = 0;
                hm <<= 1;
            }
        }
        for (h, j) in (0..QK_K).step_by(128).enumerate() {
            for i in 0..32 {
                b[32 + 32 * h + i] = lu[j + i]
                    | (lu[j + i + 32] << 2)
                    | (lu[j + i + 64] << 4)
                    | (lu[j + i + 96] << 6);
            }
        }
    }
}

/// The shared Q4_K / Q5_K part: levels in `l`, the packed scales and
/// mins written at `b[4..16]`, `d` / `dmin` at 0 / 2.
fn q45_k_block(x: &[f32], qw: &[f32], nmax: i32, clamp63: bool, b: &mut [u8], l: &mut [u8; QK_K]) {
    let (mut mins, mut scales, mut sw) = ([0f32; 8], [0f32; 8], [0f32; 8]);
    let mut weights = [0f32; 32];
    let mut sum_x2 = 0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    let sigma2 = 2.0 * sum_x2 / QK_K as f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        weights_of(&qw[32 * j..32 * j + 32], xs, sigma2, &mut weights);
        let mut sumw = 0f32;
        for &v in &weights {
            sumw += v;
        }
        sw[j] = sumw;
        let (s, m) = make_qkx3_quants(nmax, xs, &weights, &mut l[32 * j..32 * j + 32]);
        scales[j] = s;
        mins[j] = m;
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    let sc = &mut b[4..16];
    for j in 0..8 {
        let (mut s, mut m) = (ls[j], lm[j]);
        if clamp63 {
            s = s.min(63);
            m = m.min(63);
        }
        if j < 4 {
            sc[j] = s;
            sc[j + 4] = m;
        } else {
            sc[j + 4] = (s & 0xf) | ((m & 0xf) << 4);
            sc[j - 4] |= (s >> 4) << 6;
            sc[j] |= (m >> 4) << 6;
        }
    }
    write_f16(b, 0, d_block);
    write_f16(b, 2, m_block);
    let (dd, dmin) = (read_f16(b, 0), read_f16(b, 2));
    let packed: [u8; 12] = std::array::from_fn(|i| b[4 + i]);
    for j in 0..8 {
        let (s, m) = get_scale_min_k4(j, &packed);
        let d = dd * s as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

pub(crate) fn quantize_q4_k(x: &[f32], w: &[f32], y: &mut [u8]) {
    for ((x, qw), b) in k_blocks(x, w, y, 144) {
        let mut l = [0u8; QK_K];
        q45_k_block(x, qw, 15, false, b, &mut l);
        for (c, j) in (0..QK_K).step_by(64).enumerate() {
            for i in 0..32 {
                b[16 + 32 * c + i] = l[j + i] | (l[j + i + 32] << 4);
            }
        }
    }
}

pub(crate) fn quantize_q5_k(x: &[f32], w: &[f32], y: &mut [u8]) {
    for ((x, qw), b) in k_blocks(x, w, y, 176) {
        let mut l = [0u8; QK_K];
        q45_k_block(x, qw, 31, true, b, &mut l);
        b[16..48].fill(0);
        let (mut m1, mut m2) = (1u8, 2u8);
        for (c, n) in (0..QK_K).step_by(64).enumerate() {
            for j in 0..32 {
                let mut l1 = l[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    b[16 + j] |= m1;
                }
                let mut l2 = l[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    b[16 + j] |= m2;
                }
                b[48 + 32 * c + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}

pub(crate) fn quantize_q6_k(x: &[f32], w: &[f32], y: &mut [u8]) {
    for ((x, qw), b) in k_blocks(x, w, y, 210) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        for ib in 0..16 {
            let s = make_qx_quants(
                32,
                &x[16 * ib..16 * ib + 16],
                &mut l[16 * ib..16 * ib + 16],
                &qw[16 * ib..16 * ib + 16],
            );
            scales[ib] = s;
        }
        super::kquants_quantize::pack_q6_k(x, &scales, &mut l, b);
    }
}

/// ggml's `best_index_int8` over the IQ4 values.
fn best_index(x: f32) -> u8 {
    let v = &KVALUES_IQ4NL;
    if x <= v[0] as f32 {
        return 0;
    }
    if x >= v[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (v[mu - 1] as f32) < (v[mu] as f32) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// ggml's `quantize_row_iq4_nl_impl` (`ntry` 7) for one super-block of
/// `x.len()` values in sub-blocks of 32, weighted: the sub-block scales and
/// levels (`l`), and (IQ4_XS) the 6-bit sub-block scales against `d`.
/// Returns `d` (IQ4_NL: the one scale) and, for IQ4_XS, `scales_h` with the
/// low nibbles written to `scales_l`.
fn iq4_block(x: &[f32], qw: &[f32], l: &mut [u8], scales_l: &mut [u8]) -> (f32, u16) {
    let values = &KVALUES_IQ4NL;
    let v0 = values[0] as f32;
    const NTRY: i32 = 7;
    let nb = x.len() / 32;
    let mut sigma2 = 0f32;
    for &v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / x.len() as f32;
    let mut scales = [0f32; 8];
    let mut weight = [0f32; 32];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for ib in 0..nb {
        let xb = &x[32 * ib..32 * ib + 32];
        let lb = &mut l[32 * ib..32 * ib + 32];
        weights_of(&qw[32 * ib..32 * ib + 32], xb, sigma2, &mut weight);
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let mut d = -max / v0;
        let mut id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for j in 0..32 {
            let al = id * xb[j];
            let q = best_index(al);
            lb[j] = q;
            let qv = values[q as usize] as f32;
            let w = weight[j];
            sumqx += w * qv * xb[j];
            sumq2 += w * qv * qv;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -NTRY..=NTRY {
            id = (itry as f32 + v0) / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..32 {
                let al = id * xb[j];
                let qv = values[best_index(al) as usize] as f32;
                let w = weight[j];
                sumqx += w * qv * xb[j];
                sumq2 += w * qv * qv;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    if nb > 1 {
        let mut scales_h = 0u16;
        let d = -max_scale / 32.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..nb {
            let q = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * q as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 32 * ib..32 * ib + 32 {
                l[j] = best_index(idl * x[j]);
            }
            let q = (q + 32) as u8;
            if ib % 2 == 0 {
                scales_l[ib / 2] = q & 0xf;
            } else {
                scales_l[ib / 2] |= (q & 0xf) << 4;
            }
            scales_h |= ((q >> 4) as u16) << (2 * (ib % 8));
        }
        (d, scales_h)
    } else {
        let id = if scales[0] != 0.0 {
            1.0 / scales[0]
        } else {
            0.0
        };
        for j in 0..x.len() {
            l[j] = best_index(id * x[j]);
        }
        (scales[0], 0)
    }
}

/// The 4-bit levels of 32 values: `l[j] | l[j + 16] << 4`.
fn pack4(l: &[u8], q4: &mut [u8]) {
    for j in 0..16 {
        q4[j] = l[j] | (l[j + 16] << 4);
    }
}

pub(crate) fn quantize_iq4_nl(x: &[f32], w: &[f32], y: &mut [u8]) {
    let mut l = [0u8; 32];
    for ((xb, qw), b) in x
        .chunks_exact(32)
        .zip(w.chunks_exact(32))
        .zip(y.chunks_exact_mut(18))
    {
        l.fill(0);
        let (d, _) = iq4_block(xb, qw, &mut l, &mut []);
        write_f16(b, 0, d);
        pack4(&l, &mut b[2..18]);
    }
}

pub(crate) fn quantize_iq4_xs(x: &[f32], w: &[f32], y: &mut [u8]) {
    let mut l = [0u8; QK_K];
    for ((xb, qw), b) in k_blocks(x, w, y, 136) {
        l.fill(0);
        let mut scales_l = [0u8; 4];
        let (d, scales_h) = iq4_block(xb, qw, &mut l, &mut scales_l);
        write_f16(b, 0, d);
        b[2..4].copy_from_slice(&scales_h.to_le_bytes());
        b[4..8].copy_from_slice(&scales_l);
        for i in 0..8 {
            pack4(&l[32 * i..32 * i + 32], &mut b[8 + 16 * i..8 + 16 * i + 16]);
        }
    }
}
