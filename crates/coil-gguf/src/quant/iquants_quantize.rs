//! IQ4_NL and IQ4_XS quantizers: ggml's `quantize_iq4_nl` /
//! `quantize_iq4_xs` without an importance matrix (what `llama-quantize`
//! runs for them; `ntry` = 7).
//!
//! Per sub-block of 32: weights `x²`, a first scale mapping the value of
//! largest magnitude onto the grid's end (−127), the least-squares scale of
//! the nearest grid indices, then 15 more candidate scales around it, kept
//! when `Σwqx² / Σwq²` grows; eight sub-blocks (IQ4_XS) or blocks (IQ4_NL)
//! side by side, as [`super::search_lanes`] does for the K-quants. IQ4_NL stores that scale as f16; IQ4_XS
//! quantizes its 8 scales to signed 6 bits against the one of largest
//! magnitude and picks the indices again against the stored scales.
//!
//! Arithmetic is f32 in ggml's order, so the bytes equal ggml's
//! (`iquants_match_ggml_reference` in the crate's tests).

use super::float::write_f16;
use super::iquants::{IQ4_NL_BYTES, IQ4_XS_BYTES, KVALUES_IQ4NL, QK4_NL};
use super::kquants::QK_K;
use super::kquants_quantize::{nearest_int, GROUP_MAX_EPS};
use super::search_lanes::{largest_magnitude, transpose};
use super::{blocks, blocks_mut};

/// The index of the grid value nearest `x` (ggml's `best_index_int8`; ties
/// go up). Without branches on the data: ggml's binary search ends at the
/// last grid value `x` is not below, which is a count of such values (a
/// NaN, below none of them, ends at the top as there).
#[inline(always)]
fn best_index(x: f32) -> u8 {
    let v = |i: usize| KVALUES_IQ4NL[i] as f32;
    let mut ml = 0;
    for i in 1..15 {
        ml += if x < v(i) { 0 } else { 1 };
    }
    let pick = if x - v(ml) < v(ml + 1) - x {
        ml
    } else {
        ml + 1
    };
    if x <= v(0) {
        0
    } else if x >= v(15) {
        15
    } else {
        pick as u8
    }
}

/// The grid value [`best_index`] picks, by selections only (so it runs
/// lane by lane in vector registers): the last value `x` is not below and
/// the first one above it.
#[inline(always)]
fn nearest_value(x: f32) -> f32 {
    let v = |i: usize| KVALUES_IQ4NL[i] as f32;
    let (mut lo, mut hi) = (v(0), v(15));
    for i in 1..15 {
        lo = if x < v(i) { lo } else { v(i) };
        hi = if x < v(15 - i) { v(15 - i) } else { hi };
    }
    let q = if x - lo < hi - x { lo } else { hi };
    if x <= v(0) {
        v(0)
    } else if x >= v(15) {
        v(15)
    } else {
        q
    }
}

/// The scales of the `L` sub-blocks of 32 values in `x`, side by side
/// (transposed, see [`super::search_lanes`]): ggml's search with `ntry` = 7
/// lane by lane; 0 for an all-zero sub-block.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn sub_block_scales<const L: usize>(x: &[f32]) -> [f32; L] {
    const NTRY: i32 = 7;
    let x = transpose::<32, L>(x);
    let w = x.map(|xi| xi.map(|v| v * v));
    let (mut amax, mut max) = ([0f32; L], [0f32; L]);
    for xi in &x {
        for k in 0..L {
            let up = xi[k].abs() > amax[k];
            amax[k] = if up { xi[k].abs() } else { amax[k] };
            max[k] = if up { xi[k] } else { max[k] };
        }
    }
    let fit = |id: [f32; L]| {
        let (mut sumqx, mut sumq2) = ([0f32; L], [0f32; L]);
        for (xi, wi) in x.iter().zip(&w) {
            for k in 0..L {
                let q = nearest_value(id[k] * xi[k]);
                sumqx[k] += wi[k] * q * xi[k];
                sumq2[k] += wi[k] * q * q;
            }
        }
        (sumqx, sumq2)
    };
    let v0 = KVALUES_IQ4NL[0] as f32;
    let (sumqx, sumq2) = fit(max.map(|m| 1.0 / (-m / v0)));
    let mut d = [0f32; L];
    let mut best = [0f32; L];
    for k in 0..L {
        d[k] = if sumq2[k] > 0.0 {
            sumqx[k] / sumq2[k]
        } else {
            0.0
        };
        best[k] = d[k] * sumqx[k];
    }
    for itry in -NTRY..=NTRY {
        let top = (itry + KVALUES_IQ4NL[0] as i32) as f32;
        let (sumqx, sumq2) = fit(max.map(|m| top / m));
        for k in 0..L {
            if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best[k] * sumq2[k] {
                d[k] = sumqx[k] / sumq2[k];
                best[k] = d[k] * sumqx[k];
            }
        }
    }
    for k in 0..L {
        if amax[k] < GROUP_MAX_EPS {
            d[k] = 0.0;
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

/// Encodes IQ4_NL blocks (`d` @0, `qs[16]` @2) of `x`, `L` of them side by
/// side.
#[inline(always)]
fn iq4_nl_blocks<const L: usize>(x: &[[f32; QK4_NL]; L], y: &mut [[u8; IQ4_NL_BYTES]; L]) {
    let d = sub_block_scales::<L>(x.as_flattened());
    for ((xb, yb), d) in x.iter().zip(y.iter_mut()).zip(d) {
        write_f16(yb, 0, d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let l = xb.map(|v| best_index(id * v));
        pack(&l, &mut yb[2..18]);
    }
}

/// Encodes one IQ4_NL block.
pub fn quantize_block_iq4_nl(x: &[f32; QK4_NL], y: &mut [u8; IQ4_NL_BYTES]) {
    iq4_nl_blocks::<1>(std::array::from_ref(x), std::array::from_mut(y));
}

/// Encodes one IQ4_XS block: `d` @0, `scales_h: u16` @2, `scales_l[4]` @4,
/// `qs[128]` @8.
pub fn quantize_block_iq4_xs(x: &[f32; QK_K], y: &mut [u8; IQ4_XS_BYTES]) {
    let mut l = [0u8; QK_K];
    let scales = sub_block_scales::<8>(x);
    let (max_scale, _) = largest_magnitude(&scales);
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
    // eight blocks at a time, then the rest one by one
    let n8 = src.len() / (8 * QK4_NL) * 8;
    let (s8, s1) = src.split_at(n8 * QK4_NL);
    let (d8, d1) = dst.split_at_mut(n8 * IQ4_NL_BYTES);
    for (x, y) in blocks::<{ 8 * QK4_NL }, f32>(s8).zip(blocks_mut::<{ 8 * IQ4_NL_BYTES }, u8>(d8))
    {
        let x: &[[f32; QK4_NL]; 8] = x.as_chunks().0.try_into().expect("8 blocks");
        let y: &mut [[u8; IQ4_NL_BYTES]; 8] = y.as_chunks_mut().0.try_into().expect("8 blocks");
        iq4_nl_blocks(x, y);
    }
    for (x, y) in blocks::<QK4_NL, f32>(s1).zip(blocks_mut::<IQ4_NL_BYTES, u8>(d1)) {
        quantize_block_iq4_nl(x, y);
    }
}

pub(crate) fn quantize_iq4_xs(src: &[f32], dst: &mut [u8]) {
    for (x, y) in blocks::<QK_K, f32>(src).zip(blocks_mut::<IQ4_XS_BYTES, u8>(dst)) {
        quantize_block_iq4_xs(x, y);
    }
}
