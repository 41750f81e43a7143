//! IQ4_NL and IQ4_XS quantizers: ggml's `quantize_iq4_nl` /
//! `quantize_iq4_xs` without an importance matrix (what `llama-quantize`
//! runs for them; `ntry` = 7).
//!
//! Per sub-block of 32: weights `x²`, a first scale mapping the value of
//! largest magnitude onto the grid's end (−127), the least-squares scale of
//! the nearest grid indices, then 15 more candidate scales around it, kept
//! when `Σwqx² / Σwq²` grows. IQ4_NL stores that scale as f16; IQ4_XS
//! quantizes its 8 scales to signed 6 bits against the one of largest
//! magnitude and picks the indices again against the stored scales.
//!
//! Arithmetic is f32 in ggml's order, so the bytes equal ggml's
//! (`iquants_match_ggml_reference` in the crate's tests).

use super::float::write_f16;
use super::iquants::{IQ4_NL_BYTES, IQ4_XS_BYTES, KVALUES_IQ4NL, QK4_NL};
use super::kquants::QK_K;
use super::kquants_quantize::{nearest_int, GROUP_MAX_EPS};
use super::{blocks, blocks_mut};

/// The index of the grid value nearest `x` (ggml's `best_index_int8`; ties
/// go up).
fn best_index(x: f32) -> u8 {
    let v = |i: usize| KVALUES_IQ4NL[i] as f32;
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut lo, mut hi) = (0, 15);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < v(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - v(hi - 1) < v(hi) - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

/// `Σ w·q·x` and `Σ w·q²` of the grid indices nearest `id·x`.
fn fit(xb: &[f32], w: &[f32], id: f32, l: Option<&mut [u8]>) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    let mut l = l;
    for j in 0..xb.len() {
        let i = best_index(id * xb[j]);
        if let Some(l) = l.as_deref_mut() {
            l[j] = i;
        }
        let q = KVALUES_IQ4NL[i as usize] as f32;
        sumqx += w[j] * q * xb[j];
        sumq2 += w[j] * q * q;
    }
    (sumqx, sumq2)
}

/// The scale of one sub-block of 32 (ggml's search with `ntry` = 7); 0 for
/// an all-zero sub-block. Leaves the first pass's indices in `l`.
fn sub_block_scale(xb: &[f32], l: &mut [u8]) -> f32 {
    const NTRY: i32 = 7;
    let mut weight = [0f32; 32];
    for (w, &x) in weight.iter_mut().zip(xb) {
        *w = x * x;
    }
    let (mut amax, mut max) = (0f32, 0f32);
    for &x in xb {
        let ax = x.abs();
        if ax > amax {
            amax = ax;
            max = x;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = KVALUES_IQ4NL[0] as f32;
    let d = -max / v0;
    let (sumqx, sumq2) = fit(xb, &weight, 1.0 / d, Some(l));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let id = (itry + KVALUES_IQ4NL[0] as i32) as f32 / max;
        let (sumqx, sumq2) = fit(xb, &weight, id, None);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 indices: byte `j` holds values `j` (low nibble) and `j + 16`.
fn pack(l: &[u8], q4: &mut [u8]) {
    for j in 0..16 {
        q4[j] = l[j] | (l[16 + j] << 4);
    }
}

/// Encodes one IQ4_NL block: `d` @0, `qs[16]` @2.
pub fn quantize_block_iq4_nl(x: &[f32; QK4_NL], y: &mut [u8; IQ4_NL_BYTES]) {
    let mut l = [0u8; QK4_NL];
    let d = sub_block_scale(x, &mut l);
    write_f16(y, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (li, &v) in l.iter_mut().zip(x) {
        *li = best_index(id * v);
    }
    pack(&l, &mut y[2..18]);
}

/// Encodes one IQ4_XS block: `d` @0, `scales_h: u16` @2, `scales_l[4]` @4,
/// `qs[128]` @8.
pub fn quantize_block_iq4_xs(x: &[f32; QK_K], y: &mut [u8; IQ4_XS_BYTES]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for ib in 0..8 {
        let s = sub_block_scale(&x[32 * ib..32 * ib + 32], &mut l[32 * ib..32 * ib + 32]);
        scales[ib] = s;
        if s.abs() > amax_scale {
            amax_scale = s.abs();
            max_scale = s;
        }
    }
    y.fill(0);
    let d = -max_scale / 32.0;
    write_f16(y, 0, d);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    for ib in 0..8 {
        let ls = nearest_int(id * scales[ib]).clamp(-32, 31);
        let dl = d * ls as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        for j in 32 * ib..32 * ib + 32 {
            l[j] = best_index(idl * x[j]);
        }
        let ls = (ls + 32) as u8;
        y[4 + ib / 2] |= (ls & 0xf) << (4 * (ib % 2));
        scales_h |= ((ls >> 4) as u16) << (2 * ib);
    }
    y[2..4].copy_from_slice(&scales_h.to_le_bytes());
    for i in 0..8 {
        pack(&l[32 * i..32 * i + 32], &mut y[8 + 16 * i..8 + 16 * i + 16]);
    }
}

// ---- rows (lengths checked by the caller) ----

pub(crate) fn quantize_iq4_nl(src: &[f32], dst: &mut [u8]) {
    for (x, y) in blocks::<QK4_NL, f32>(src).zip(blocks_mut::<IQ4_NL_BYTES, u8>(dst)) {
        quantize_block_iq4_nl(x, y);
    }
}

pub(crate) fn quantize_iq4_xs(src: &[f32], dst: &mut [u8]) {
    for (x, y) in blocks::<QK_K, f32>(src).zip(blocks_mut::<IQ4_XS_BYTES, u8>(dst)) {
        quantize_block_iq4_xs(x, y);
    }
}
