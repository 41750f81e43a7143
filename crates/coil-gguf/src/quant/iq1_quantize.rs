//! Quantizers of the 1-bit lattice formats IQ1_S and IQ1_M: ggml's
//! `quantize_row_iq1_s_impl` and `quantize_row_iq1_m_impl`.
//!
//! Per sub-block (32 values for IQ1_S, 16 for IQ1_M): with three values
//! `{−1, 0, 1} + δ` (δ = ±[`IQ1S_DELTA`], one sign per sub-block for IQ1_S,
//! per half for IQ1_M) the best weighted least-squares split is found
//! exactly: the values sorted (stably, as glibc's `qsort` sorts these), every
//! pair of boundaries tried against prefix sums. Groups of 8 off the grid
//! take their nearest neighbour ([`super::lattice`]) and the scale is
//! refitted. The block's f16 `d` (IQ1_M: refitted over the whole block)
//! and 3-bit odd scales follow.
//!
//! Arithmetic is f32 in ggml's order, so the bytes equal ggml's. Where
//! ggml aborts (no neighbour at a finite distance), this is an error.

// index loops over parallel arrays, as in ggml
#![allow(clippy::needless_range_loop)]

use std::cmp::Ordering;

use super::float::{f32_to_f16, write_f16};
use super::grids::IQ1S_DELTA;
use super::iq1::{IQ1_M_BYTES, IQ1_S_BYTES};
use super::iq_quantize::OffGrid;
use super::kquants::QK_K;
use super::kquants_quantize::nearest_int;
use super::lattice::{self, Lattice, Place};

/// The three values with δ added (`+`) or subtracted (`−`).
const X_P: [f32; 3] = [-1.0 + IQ1S_DELTA, IQ1S_DELTA, 1.0 + IQ1S_DELTA];
const X_M: [f32; 3] = [-1.0 - IQ1S_DELTA, -IQ1S_DELTA, 1.0 - IQ1S_DELTA];

#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// The order of `x` by value, ties (−0 and 0 too) in index order, as
/// glibc's merge sort leaves them; NaNs (which ggml's comparator leaves
/// unordered) go last, so the order is total.
fn sorted_order<const N: usize>(x: &[f32]) -> [usize; N] {
    let mut idx: [usize; N] = std::array::from_fn(|i| i);
    idx.sort_by(|&a, &b| match (x[a].is_nan(), x[b].is_nan()) {
        (false, false) => x[a].partial_cmp(&x[b]).unwrap_or(Ordering::Equal),
        (na, nb) => na.cmp(&nb),
    });
    idx
}

/// ggml's `iq1_find_best_neighbour2`: the neighbour whose values `xg`
/// times `scale` are nearest `x` in the `w`-weighted squared distance.
fn best_neighbour(
    lat: &Lattice<8>,
    neighbours: &[u16],
    x: &[f32],
    w: &[f32],
    scale: f32,
    xg: &[f32; 3],
) -> Result<usize, OffGrid> {
    let mut best_d2 = f32::MAX;
    let mut best = None;
    for &j in neighbours {
        let pg = &lat.grid[j as usize];
        let mut d2 = 0f32;
        for i in 0..8 {
            let q = xg[((pg[i] - 1) / 2) as usize];
            let diff = scale * q - x[i];
            d2 += w[i] * diff * diff;
        }
        if d2 < best_d2 {
            best_d2 = d2;
            best = Some(j as usize);
        }
    }
    best.ok_or(OffGrid)
}

/// The grid index of a group of 8 level indices `l` (0, 1, 2), or of its
/// best neighbour; `l` is rewritten to the entry's. Also whether it was on
/// the grid.
fn grid_index(
    lat: &Lattice<8>,
    l: &mut [i8],
    x: &[f32],
    w: &[f32],
    scale: f32,
    xg: &[f32; 3],
) -> Result<(usize, bool), OffGrid> {
    match lat.place(lat.pack(l)) {
        Place::On(k) => Ok((k, true)),
        Place::Off(n) => {
            let k = best_neighbour(lat, n, x, w, scale, xg)?;
            l.copy_from_slice(&lat.levels(k));
            Ok((k, false))
        }
    }
}

/// `Σ w·q·x` and `Σ w·q²` of a group on grid entry `k` with values `xg`.
fn group_sums(lat: &Lattice<8>, k: usize, xg: &[f32; 3], x: &[f32], w: &[f32], s: &mut (f32, f32)) {
    let pg = &lat.grid[k];
    for j in 0..8 {
        let q = xg[((pg[j] - 1) / 2) as usize];
        s.0 += w[j] * q * x[j];
        s.1 += w[j] * q * q;
    }
}

/// Level indices 0, 1, 2 for the values below `i1`, below `i2` and the
/// rest in `order`.
fn split<const N: usize>(order: &[usize; N], i1: usize, i2: usize) -> [i8; N] {
    let mut l = [0i8; N];
    for (j, &i) in order.iter().enumerate() {
        l[i] = if j < i1 {
            0
        } else if j < i2 {
            1
        } else {
            2
        };
    }
    l
}

/// Encodes one IQ1_S block (`qw`: the block's 256 importance weights,
/// which it needs; the caller checks they are there).
pub(crate) fn quantize_block_iq1_s(
    x: &[f32; QK_K],
    qw: Option<&[f32]>,
    y: &mut [u8; IQ1_S_BYTES],
) -> Result<(), OffGrid> {
    const BS: usize = 32;
    let Some(qw) = qw else {
        return Err(OffGrid);
    };
    let lat = lattice::iq1s();
    y.fill(0);
    let mut sumx2 = 0f32;
    for v in x {
        sumx2 += v * v;
    }
    let sigma2 = 2.0 * sumx2 / QK_K as f32;
    let mut scales = [0f32; QK_K / BS];
    let mut shifts = [1i8; QK_K / BS];
    let mut max_scale = 0f32;
    let mut qh = [0u16; QK_K / BS];
    for ib in 0..QK_K / BS {
        let xb = &x[BS * ib..BS * (ib + 1)];
        let weight: [f32; BS] =
            std::array::from_fn(|i| qw[BS * ib + i] * (sigma2 + xb[i] * xb[i]).sqrt());
        let mx = xb[1..].iter().fold(xb[0].abs(), |m, v| max(m, v.abs()));
        if mx < 1e-12 {
            continue;
        }
        let order = sorted_order::<BS>(xb);
        let (mut sumx, mut sumw) = ([0f32; BS + 1], [0f32; BS + 1]);
        for (j, &i) in order.iter().enumerate() {
            sumx[j + 1] = sumx[j] + weight[i] * xb[i];
            sumw[j + 1] = sumw[j] + weight[i];
        }
        let mut best_score = -f32::MAX;
        let mut scale = mx;
        let mut best: Option<(usize, usize, i8)> = None;
        for i1 in 0..=BS {
            for i2 in i1..=BS {
                for (xv, shift) in [(&X_P, 1), (&X_M, -1)] {
                    let sumqx = (sumx[i1] - sumx[0]) * xv[0]
                        + (sumx[i2] - sumx[i1]) * xv[1]
                        + (sumx[BS] - sumx[i2]) * xv[2];
                    let sumq2 = (sumw[i1] - sumw[0]) * xv[0] * xv[0]
                        + (sumw[i2] - sumw[i1]) * xv[1] * xv[1]
                        + (sumw[BS] - sumw[i2]) * xv[2] * xv[2];
                    if sumq2 > 0.0 && sumqx * sumqx > best_score * sumq2 {
                        scale = sumqx / sumq2;
                        best_score = scale * sumqx;
                        best = Some((i1, i2, shift));
                    }
                }
            }
        }
        let Some((i1, i2, mut shift)) = best else {
            continue;
        };
        let mut l = split(&order, i1, i2);
        if scale < 0.0 {
            for v in &mut l {
                *v = 2 - *v;
            }
            scale = -scale;
            shift = -shift;
        }
        let xx = if shift == 1 { &X_P } else { &X_M };
        let mut all_on_grid = true;
        let mut index = [0usize; BS / 8];
        for k in 0..BS / 8 {
            let r = 8 * k..8 * k + 8;
            let (g, on) = grid_index(
                lat,
                &mut l[r.clone()],
                &xb[r.clone()],
                &weight[r],
                scale,
                xx,
            )?;
            all_on_grid &= on;
            index[k] = g;
        }
        if !all_on_grid {
            let mut s = (0f32, 0f32);
            for (k, &g) in index.iter().enumerate() {
                let r = 8 * k..8 * k + 8;
                group_sums(lat, g, xx, &xb[r.clone()], &weight[r], &mut s);
            }
            if s.0 > 0.0 && s.1 > 0.0 {
                scale = s.0 / s.1;
            }
        }
        let mut h = 0u16;
        for (k, &g) in index.iter().enumerate() {
            y[2 + 4 * ib + k] = g as u8;
            h |= ((g >> 8) as u16) << (3 * k);
        }
        qh[ib] = h;
        scales[ib] = scale;
        shifts[ib] = shift;
        max_scale = max(max_scale, scale);
    }
    if max_scale != 0.0 {
        let d = max_scale / 15.0;
        write_f16(y, 0, d * 1.125);
        let id = 1.0 / d;
        for ib in 0..QK_K / BS {
            let mut l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7) as u16;
            if shifts[ib] == -1 {
                l |= 8;
            }
            qh[ib] |= l << 12;
        }
    }
    for (ib, h) in qh.iter().enumerate() {
        y[34 + 2 * ib..36 + 2 * ib].copy_from_slice(&h.to_le_bytes());
    }
    Ok(())
}

/// Encodes one IQ1_M block (`qw`: the block's 256 importance weights, or
/// none: weights `x²`).
pub(crate) fn quantize_block_iq1_m(
    x: &[f32; QK_K],
    qw: Option<&[f32]>,
    y: &mut [u8; IQ1_M_BYTES],
) -> Result<(), OffGrid> {
    const BS: usize = 16;
    // which values each half uses, by the sub-block's shift code
    // (0: +,+  1: +,−  2: −,+  3: −,−)
    fn values(shift: usize, k: usize) -> &'static [f32; 3] {
        let plus = if k == 0 {
            shift < 2
        } else {
            shift.is_multiple_of(2)
        };
        if plus {
            &X_P
        } else {
            &X_M
        }
    }
    const MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    let lat = lattice::iq1s();
    y.fill(0);
    let mut sumx2 = 0f32;
    for v in x {
        sumx2 += v * v;
    }
    let sigma2 = 2.0 * sumx2 / QK_K as f32;
    let weights = |ib: usize| -> [f32; BS] {
        let xb = &x[BS * ib..BS * (ib + 1)];
        std::array::from_fn(|i| match qw {
            Some(qw) => qw[BS * ib + i] * (sigma2 + xb[i] * xb[i]).sqrt(),
            None => xb[i] * xb[i],
        })
    };
    let mut scales = [0f32; QK_K / BS];
    let mut shifts = [0usize; QK_K / BS];
    let mut max_scale = 0f32;
    let (cp1, cp2) = (
        X_P[0] * X_P[0] - X_P[1] * X_P[1],
        X_P[1] * X_P[1] - X_P[2] * X_P[2],
    );
    let (cm1, cm2) = (
        X_M[0] * X_M[0] - X_M[1] * X_M[1],
        X_M[1] * X_M[1] - X_M[2] * X_M[2],
    );
    let (p2, m2) = (X_P[2], X_M[2]);
    for ib in 0..QK_K / BS {
        let xb = &x[BS * ib..BS * (ib + 1)];
        let weight = weights(ib);
        let mx = xb[1..].iter().fold(xb[0].abs(), |m, v| max(m, v.abs()));
        if mx < 1e-7 {
            continue;
        }
        let order = sorted_order::<BS>(xb);
        // prefix sums per half of the sub-block, in sorted order
        let mut px = [[0f32; BS + 1]; 2];
        let mut pw = [[0f32; BS + 1]; 2];
        for (j, &i) in order.iter().enumerate() {
            let h = usize::from(i >= BS / 2);
            px[h][j + 1] = px[h][j] + weight[i] * xb[i];
            px[1 - h][j + 1] = px[1 - h][j];
            pw[h][j + 1] = pw[h][j] + weight[i];
            pw[1 - h][j + 1] = pw[1 - h][j];
        }
        let txs = [px[0][BS], px[1][BS]];
        let tws = [pw[0][BS], pw[1][BS]];
        let mut best_score = -f32::MAX;
        let mut scale = mx;
        let mut best: Option<(usize, usize, usize)> = None;
        for i1 in 0..=BS {
            for i2 in i1..=BS {
                let (mut qx_p, mut qx_m, mut q2_p, mut q2_m) =
                    ([0f32; 2], [0f32; 2], [0f32; 2], [0f32; 2]);
                for h in 0..2 {
                    let sx = px[h][i1] + px[h][i2];
                    qx_p[h] = txs[h] * p2 - sx;
                    qx_m[h] = txs[h] * m2 - sx;
                    q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                    q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                }
                let sumqx = [
                    qx_p[0] + qx_p[1],
                    qx_p[0] + qx_m[1],
                    qx_m[0] + qx_p[1],
                    qx_m[0] + qx_m[1],
                ];
                let sumq2 = [
                    q2_p[0] + q2_p[1],
                    q2_p[0] + q2_m[1],
                    q2_m[0] + q2_p[1],
                    q2_m[0] + q2_m[1],
                ];
                for k in 0..4 {
                    if sumq2[k] > 0.0 && sumqx[k] * sumqx[k] > best_score * sumq2[k] {
                        scale = sumqx[k] / sumq2[k];
                        best_score = scale * sumqx[k];
                        best = Some((i1, i2, k));
                    }
                }
            }
        }
        let Some((i1, i2, mut best_k)) = best else {
            continue;
        };
        let mut l = split(&order, i1, i2);
        if scale < 0.0 {
            for v in &mut l {
                *v = 2 - *v;
            }
            scale = -scale;
            best_k = 3 - best_k;
        }
        let mut all_on_grid = true;
        let mut index = [0usize; 2];
        for k in 0..2 {
            let r = 8 * k..8 * k + 8;
            let xx = values(best_k, k);
            let (g, on) = grid_index(
                lat,
                &mut l[r.clone()],
                &xb[r.clone()],
                &weight[r],
                scale,
                xx,
            )?;
            all_on_grid &= on;
            index[k] = g;
        }
        if !all_on_grid {
            let mut s = (0f32, 0f32);
            for (k, &g) in index.iter().enumerate() {
                let r = 8 * k..8 * k + 8;
                group_sums(
                    lat,
                    g,
                    values(best_k, k),
                    &xb[r.clone()],
                    &weight[r],
                    &mut s,
                );
            }
            if s.0 > 0.0 && s.1 > 0.0 {
                scale = s.0 / s.1;
            }
        }
        y[2 * ib] = index[0] as u8;
        y[2 * ib + 1] = index[1] as u8;
        y[32 + ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) as u8;
        scales[ib] = scale;
        shifts[ib] = best_k;
        max_scale = max(max_scale, scale);
    }
    if max_scale == 0.0 {
        return Ok(());
    }
    let mut sc = [0u16; 4];
    let mut d = max_scale / 15.0;
    let id = 1.0 / d;
    let mut s = (0f32, 0f32);
    for ib in 0..QK_K / BS {
        let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
        sc[ib / 4] |= (l as u16) << (3 * (ib % 4));
        y[32 + ib] |= MASKS[shifts[ib]];
        let xb = &x[BS * ib..BS * (ib + 1)];
        let weight = weights(ib);
        let qh = y[32 + ib] as usize;
        for k in 0..2 {
            let xx = values(shifts[ib], k);
            let g = y[2 * ib + k] as usize + ((qh << (8 - 4 * k)) & 0x700);
            let pg = &lat.grid[g];
            for j in 0..8 {
                let w = weight[8 * k + j];
                let q = xx[((pg[j] - 1) / 2) as usize] * (2 * l + 1) as f32;
                s.0 += w * q * xb[8 * k + j];
                s.1 += w * q * q;
            }
        }
    }
    if s.1 > 0.0 {
        d = s.0 / s.1;
    }
    let h = f32_to_f16(d * 1.1125);
    sc[0] |= (h & 0x000f) << 12;
    sc[1] |= (h & 0x00f0) << 8;
    sc[2] |= (h & 0x0f00) << 4;
    sc[3] |= h & 0xf000;
    for (k, v) in sc.iter().enumerate() {
        y[48 + 2 * k..50 + 2 * k].copy_from_slice(&v.to_le_bytes());
    }
    Ok(())
}
