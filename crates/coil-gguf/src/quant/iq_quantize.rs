//! Quantizers of the 2- and 3-bit lattice formats IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ3_XXS and IQ3_S: ggml's `quantize_row_iq2_{xxs,xs,s}_impl`,
//! `quantize_row_iq3_xxs_impl` and `quantize_row_iq3_s_impl`, one search
//! with the formats' differences in a table ([`Search`]).
//!
//! Per sub-block (32 or 16 values): weights `w = qw·√(σ² + x²)` from the
//! importance weights `qw` (or a default without them); signs taken out
//! (for the IQ2_XXS / IQ2_XS / IQ3_XXS sign tables, with even parity per 8
//! values: the least important odd one is flipped); then, for scales `1/id`
//! around the largest magnitude, every group of 4 or 8 is rounded to level
//! indices and, off the grid, replaced by its best weighted neighbour; the
//! scale with the best `Σwqx² / Σwq²` is kept, off-grid groups are searched
//! again at that scale, and the least-squares scale is recomputed. The
//! block's f16 `d` (times a per-format factor) and 4-bit sub-block scales
//! follow.
//!
//! Arithmetic is f32 in ggml's order, so the bytes equal ggml's
//! (`quantize_matches_ggml_for_the_lattice_ternary_and_fp4_formats` in the
//! crate's tests). Where ggml aborts (a group that cannot be placed on the
//! grid: values or weights so large that every distance is infinite), this
//! returns an error.

// index loops over parallel arrays, as in ggml
#![allow(clippy::needless_range_loop)]

use super::float::write_f16;
use super::iq2::{IQ2_S_BYTES, IQ2_XS_BYTES, IQ2_XXS_BYTES};
use super::iq3::{IQ3_S_BYTES, IQ3_XXS_BYTES};
use super::kquants::QK_K;
use super::kquants_quantize::{nearest_int, GROUP_MAX_EPS};
use super::lattice::{self, Lattice, Place};

/// Why a row could not be quantized (ggml aborts on these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffGrid;

/// The first scale of the search.
#[derive(Clone, Copy)]
enum Start {
    /// `make_qp_quants` with levels `0..=kmax` (IQ2_XXS).
    QpQuants,
    /// The largest magnitude over `2·kmax − 1`.
    Max,
}

/// Which groups are searched again at the chosen scale.
#[derive(Clone, Copy)]
enum Again {
    /// Every group, always (IQ2_XXS).
    All,
    /// The groups that were off the grid (IQ2_XS, IQ2_S, IQ3_XXS).
    OffGrid,
    /// Every group, if one was off the grid (IQ3_S).
    AllIfOffGrid,
}

/// Weights without importance weights.
#[derive(Clone, Copy)]
enum Unweighted {
    /// Importance weights are required (IQ2_XXS, IQ2_XS).
    Never,
    /// `x²` (IQ3_XXS, IQ3_S).
    Square,
    /// `σ²/4 + x²` (IQ2_S).
    QuarterSigma,
}

/// One format's variant of the search (ggml's constants).
struct Search {
    /// Level indices `0..kmax`.
    kmax: i32,
    /// Values per sub-block (one scale).
    len: usize,
    /// `σ² = sigma_mul · Σx² / 256`.
    sigma_mul: f32,
    unweighted: Unweighted,
    /// Sign patterns of even parity (7 bits stored per 8 values).
    parity: bool,
    /// A sub-block whose largest magnitude is below this is zero.
    eps: f32,
    start: Start,
    /// Scales tried: `id = (2·kmax − 1 + is·step) / max`, `is` in `−steps..=steps`.
    steps: i32,
    step: f32,
    /// The grid-search state before the first scale: on the grid or not.
    on_grid_at_start: bool,
    again: Again,
}

const IQ2_XXS: Search = Search {
    kmax: 3,
    len: 32,
    sigma_mul: 1.0,
    unweighted: Unweighted::Never,
    parity: true,
    eps: GROUP_MAX_EPS,
    start: Start::QpQuants,
    steps: 6,
    step: 0.1,
    on_grid_at_start: true,
    again: Again::All,
};
const IQ2_XS: Search = Search {
    kmax: 3,
    len: 16,
    sigma_mul: 1.0,
    unweighted: Unweighted::Never,
    parity: true,
    eps: GROUP_MAX_EPS,
    start: Start::Max,
    steps: 9,
    step: 0.1,
    on_grid_at_start: true,
    again: Again::OffGrid,
};
const IQ2_S: Search = Search {
    kmax: 3,
    len: 16,
    sigma_mul: 2.0,
    unweighted: Unweighted::QuarterSigma,
    parity: false,
    eps: 1e-8,
    start: Start::Max,
    steps: 9,
    step: 0.1,
    on_grid_at_start: true,
    again: Again::OffGrid,
};
const IQ3_XXS: Search = Search {
    kmax: 8,
    len: 32,
    sigma_mul: 2.0,
    unweighted: Unweighted::Square,
    parity: true,
    eps: 1e-8,
    start: Start::Max,
    steps: 15,
    step: 0.2,
    on_grid_at_start: true,
    again: Again::OffGrid,
};
const IQ3_S: Search = Search {
    kmax: 8,
    len: 32,
    sigma_mul: 2.0,
    unweighted: Unweighted::Square,
    parity: false,
    // ggml tests `!max`: only an all-zero sub-block is skipped
    eps: f32::from_bits(1),
    start: Start::Max,
    steps: 9,
    step: 0.2,
    on_grid_at_start: false,
    again: Again::AllIfOffGrid,
};

/// `a` unless `b` is larger (ggml's `MAX(a, b)` = `a > b ? a : b`).
#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// A sub-block's result: its scale, the grid index of each group and a
/// sign byte per 8 values.
struct SubBlock {
    scale: f32,
    index: [u16; 8],
    signs: [u8; 4],
}

/// ggml's `make_qp_quants(n, nmax, x, L, w)`: a least-squares scale for
/// levels `0..=nmax` of non-negative `x`.
fn make_qp_quants(nmax: i32, x: &[f32], w: &[f32]) -> f32 {
    let n = x.len();
    let mx = x.iter().fold(0f32, |m, &v| max(m, v));
    if mx < GROUP_MAX_EPS {
        return 0.0;
    }
    let mut iscale = nmax as f32 / mx;
    let mut l = [0u8; 32];
    for i in 0..n {
        l[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0f32;
    for i in 0..n {
        let diff = x[i] - scale * l[i] as f32;
        best_mse += w[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / mx;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0f32;
        for i in 0..n {
            let q = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * q as f32;
            mse += w[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..n {
        let q = nearest_int(iscale * x[i]).min(nmax);
        l[i] = q as u8;
        sumlx += w[i] * x[i] * q as f32;
        suml2 += w[i] * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for i in 0..n {
            let li = l[i] as f32;
            let mut slx = sumlx - w[i] * x[i] * li;
            let mut sl2 = suml2 - w[i] * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l[i] as i32 {
                    slx += w[i] * x[i] * new_l as f32;
                    sl2 += w[i] * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// ggml's `iq{2,3}_find_best_neighbour`: the neighbour nearest `x` at
/// `scale` in the `w`-weighted squared distance (the first of equals).
fn best_neighbour<const N: usize>(
    lat: &Lattice<N>,
    neighbours: &[u16],
    x: &[f32],
    w: &[f32],
    scale: f32,
) -> Result<usize, OffGrid> {
    let mut best_d2 = f32::MAX;
    let mut best = None;
    for &j in neighbours {
        let pg = &lat.grid[j as usize];
        let mut d2 = 0f32;
        for i in 0..N {
            let diff = scale * pg[i] as f32 - x[i];
            d2 += w[i] * diff * diff;
        }
        if d2 < best_d2 {
            best_d2 = d2;
            best = Some(j as usize);
        }
    }
    best.ok_or(OffGrid)
}

/// The grid entry for the level indices nearest `x·id` (on the grid, or
/// its best neighbour at `scale`): its index and level indices.
fn place<const N: usize>(
    lat: &Lattice<N>,
    kmax: i32,
    x: &[f32],
    waux: &[f32],
    id: f32,
    scale: f32,
) -> Result<(usize, bool, [i8; N]), OffGrid> {
    let l: [i8; N] =
        std::array::from_fn(|i| nearest_int(0.5 * (id * x[i] - 1.0)).clamp(0, kmax - 1) as i8);
    match lat.place(lat.pack(&l)) {
        Place::On(k) => Ok((k, true, l)),
        Place::Off(n) => {
            let k = best_neighbour(lat, n, x, waux, scale)?;
            Ok((k, false, lat.levels(k)))
        }
    }
}

/// `Σ w·x·q` and `Σ w·q²` for `q = 2l + 1`.
fn sums(w: &[f32], x: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for i in 0..w.len() {
        let q = (2 * l[i] as i32 + 1) as f32;
        sumqx += w[i] * x[i] * q;
        sumq2 += w[i] * q * q;
    }
    (sumqx, sumq2)
}

/// One sub-block of `s.len` values `xb` with weights `weight`; `None` for a
/// zero sub-block.
fn sub_block<const N: usize>(
    lat: &Lattice<N>,
    s: &Search,
    xb: &[f32],
    weight: &[f32],
) -> Result<Option<SubBlock>, OffGrid> {
    let len = s.len;
    let groups = len / N;
    let mut waux = [0f32; 32];
    let mut xval = [0f32; 32];
    for i in 0..len {
        waux[i] = weight[i].sqrt();
    }
    let mut signs = [0u8; 4];
    for k in 0..len / 8 {
        let mut sign = 0u8;
        let mut nflip = 0;
        for i in 0..8 {
            let v = xb[8 * k + i];
            if v >= 0.0 {
                xval[8 * k + i] = v;
            } else {
                xval[8 * k + i] = -v;
                nflip += 1;
                sign |= 1 << i;
            }
        }
        if s.parity {
            if nflip % 2 == 1 {
                let imp = |i: usize| weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                let mut imin = 0;
                let mut min = imp(0);
                for i in 1..8 {
                    if imp(i) < min {
                        min = imp(i);
                        imin = i;
                    }
                }
                xval[8 * k + imin] = -xval[8 * k + imin];
                sign ^= 1 << imin;
            }
            sign &= 127;
        }
        signs[k] = sign;
    }
    let (xval, waux) = (&xval[..len], &waux[..len]);
    let mx = xval[1..].iter().fold(xval[0], |m, &v| max(m, v));
    if mx < s.eps {
        return Ok(None);
    }
    let (mut scale, denom) = match s.start {
        Start::Max => (mx / (2 * s.kmax - 1) as f32, mx),
        Start::QpQuants => {
            let scale = make_qp_quants(s.kmax + 1, xval, weight);
            let eff_max = scale * s.kmax as f32;
            if eff_max <= 0.0 {
                return Ok(None);
            }
            (scale, eff_max)
        }
    };
    let mut l = [0i8; 32];
    let mut on_grid = [s.on_grid_at_start; 8];
    let mut best = 0f32;
    for is in -s.steps..=s.steps {
        let id = ((2 * s.kmax - 1) as f32 + is as f32 * s.step) / denom;
        let this_scale = 1.0 / id;
        let mut laux = [0i8; 32];
        let mut on_aux = [true; 8];
        for k in 0..groups {
            let r = N * k..N * k + N;
            let (_, on, lv) = place(
                lat,
                s.kmax,
                &xval[r.clone()],
                &waux[r.clone()],
                id,
                this_scale,
            )?;
            laux[r].copy_from_slice(&lv);
            on_aux[k] = on;
        }
        let (sumqx, sumq2) = sums(weight, xval, &laux[..len]);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            l = laux;
            on_grid = on_aux;
        }
    }
    let any_off = on_grid[..groups].iter().any(|&on| !on);
    let again = match s.again {
        Again::All => scale > 0.0,
        Again::OffGrid | Again::AllIfOffGrid => any_off && scale > 0.0,
    };
    if again {
        let id = 1.0 / scale;
        for k in 0..groups {
            if matches!(s.again, Again::OffGrid) && on_grid[k] {
                continue;
            }
            let r = N * k..N * k + N;
            let (_, _, lv) = place(lat, s.kmax, &xval[r.clone()], &waux[r.clone()], id, scale)?;
            l[r].copy_from_slice(&lv);
        }
        let (sumqx, sumq2) = sums(weight, xval, &l[..len]);
        if sumq2 > 0.0 {
            scale = sumqx / sumq2;
        }
    }
    if scale < 0.0 {
        scale = -scale;
        for sign in &mut signs[..len / 8] {
            *sign = if s.parity { !*sign & 127 } else { !*sign };
        }
    }
    let mut index = [0u16; 8];
    for k in 0..groups {
        match lat.place(lat.pack(&l[N * k..N * k + N])) {
            Place::On(g) => index[k] = g as u16,
            Place::Off(_) => return Err(OffGrid),
        }
    }
    Ok(Some(SubBlock {
        scale,
        index,
        signs,
    }))
}

/// The sub-blocks of one block of 256 (`None`: all zero) and `id = 1/d` for
/// `d` = the largest scale / 31, or `None` when every scale is 0.
fn block<const N: usize>(
    lat: &Lattice<N>,
    s: &Search,
    x: &[f32; QK_K],
    qw: Option<&[f32]>,
) -> Result<(Vec<Option<SubBlock>>, f32), OffGrid> {
    let mut sumx2 = 0f32;
    for v in x {
        sumx2 += v * v;
    }
    let sigma2 = s.sigma_mul * sumx2 / QK_K as f32;
    let mut out = Vec::with_capacity(QK_K / s.len);
    let mut max_scale = 0f32;
    let mut weight = [0f32; 32];
    for ib in 0..QK_K / s.len {
        let xb = &x[s.len * ib..s.len * (ib + 1)];
        for i in 0..s.len {
            weight[i] = match (qw, s.unweighted) {
                (Some(qw), _) => qw[s.len * ib + i] * (sigma2 + xb[i] * xb[i]).sqrt(),
                (None, Unweighted::Square) => xb[i] * xb[i],
                (None, Unweighted::QuarterSigma) => 0.25 * sigma2 + xb[i] * xb[i],
                // checked by the caller: never reached
                (None, Unweighted::Never) => 1.0,
            };
        }
        let sb = sub_block(lat, s, xb, &weight[..s.len])?;
        if let Some(sb) = &sb {
            max_scale = max(max_scale, sb.scale);
        }
        out.push(sb);
    }
    Ok((out, max_scale))
}

/// The 4-bit scale of a sub-block: `round((id·scale − 1)/2)` in 0..=15.
#[inline]
fn scale4(id: f32, scale: f32) -> u8 {
    nearest_int(0.5 * (id * scale - 1.0)).clamp(0, 15) as u8
}

fn sub_scale(sb: &Option<SubBlock>) -> f32 {
    sb.as_ref().map_or(0.0, |s| s.scale)
}

/// Encodes one IQ2_XXS block (`qw`: the block's 256 importance weights).
pub(crate) fn quantize_block_iq2_xxs(
    x: &[f32; QK_K],
    qw: Option<&[f32]>,
    y: &mut [u8; IQ2_XXS_BYTES],
) -> Result<(), OffGrid> {
    let (subs, max_scale) = block(lattice::iq2xxs(), &IQ2_XXS, x, qw)?;
    y.fill(0);
    if max_scale == 0.0 {
        return Ok(());
    }
    let d = max_scale / 31.0;
    write_f16(y, 0, d);
    let id = 1.0 / d;
    for (ib, sb) in subs.iter().enumerate() {
        let (mut q0, mut q1) = (0u32, 0u32);
        if let Some(sb) = sb {
            for k in 0..4 {
                q0 |= (sb.index[k] as u32) << (8 * k);
                q1 |= (sb.signs[k] as u32) << (7 * k);
            }
        }
        q1 |= (scale4(id, sub_scale(sb)) as u32) << 28;
        y[2 + 8 * ib..6 + 8 * ib].copy_from_slice(&q0.to_le_bytes());
        y[6 + 8 * ib..10 + 8 * ib].copy_from_slice(&q1.to_le_bytes());
    }
    Ok(())
}

/// Encodes one IQ2_XS block.
pub(crate) fn quantize_block_iq2_xs(
    x: &[f32; QK_K],
    qw: Option<&[f32]>,
    y: &mut [u8; IQ2_XS_BYTES],
) -> Result<(), OffGrid> {
    let (subs, max_scale) = block(lattice::iq2xs(), &IQ2_XS, x, qw)?;
    y.fill(0);
    if max_scale == 0.0 {
        return Ok(());
    }
    let d = max_scale / 31.0;
    write_f16(y, 0, d);
    let id = 1.0 / d;
    for (ib, sb) in subs.iter().enumerate() {
        if let Some(sb) = sb {
            for k in 0..2 {
                let q = sb.index[k] | ((sb.signs[k] as u16) << 9);
                let at = 2 + 2 * (2 * ib + k);
                y[at..at + 2].copy_from_slice(&q.to_le_bytes());
            }
        }
        y[66 + ib / 2] |= scale4(id, sub_scale(sb)) << (4 * (ib % 2));
    }
    Ok(())
}

/// Encodes one IQ2_S block.
pub(crate) fn quantize_block_iq2_s(
    x: &[f32; QK_K],
    qw: Option<&[f32]>,
    y: &mut [u8; IQ2_S_BYTES],
) -> Result<(), OffGrid> {
    let (subs, max_scale) = block(lattice::iq2s(), &IQ2_S, x, qw)?;
    y.fill(0);
    for (ib, sb) in subs.iter().enumerate() {
        if let Some(sb) = sb {
            for k in 0..2 {
                let i8 = 2 * ib + k;
                y[2 + i8] = sb.index[k] as u8;
                y[66 + i8 / 4] |= ((sb.index[k] >> 8) as u8) << (2 * (i8 % 4));
                y[34 + i8] = sb.signs[k];
            }
        }
    }
    if max_scale == 0.0 {
        return Ok(());
    }
    let d = max_scale / 31.0;
    write_f16(y, 0, d * 0.9875);
    let id = 1.0 / d;
    for (ib, sb) in subs.iter().enumerate() {
        y[74 + ib / 2] |= scale4(id, sub_scale(sb)) << (4 * (ib % 2));
    }
    Ok(())
}

/// Encodes one IQ3_XXS block.
pub(crate) fn quantize_block_iq3_xxs(
    x: &[f32; QK_K],
    qw: Option<&[f32]>,
    y: &mut [u8; IQ3_XXS_BYTES],
) -> Result<(), OffGrid> {
    let (subs, max_scale) = block(lattice::iq3xxs(), &IQ3_XXS, x, qw)?;
    y.fill(0);
    if max_scale == 0.0 {
        return Ok(());
    }
    let d = max_scale / 31.0;
    write_f16(y, 0, d * 1.0125);
    let id = 1.0 / d;
    for (ib, sb) in subs.iter().enumerate() {
        let mut ss = 0u32;
        if let Some(sb) = sb {
            for k in 0..8 {
                y[2 + 8 * ib + k] = sb.index[k] as u8;
            }
            for k in 0..4 {
                ss |= (sb.signs[k] as u32) << (7 * k);
            }
        }
        ss |= (scale4(id, sub_scale(sb)) as u32) << 28;
        y[66 + 4 * ib..70 + 4 * ib].copy_from_slice(&ss.to_le_bytes());
    }
    Ok(())
}

/// Encodes one IQ3_S block.
pub(crate) fn quantize_block_iq3_s(
    x: &[f32; QK_K],
    qw: Option<&[f32]>,
    y: &mut [u8; IQ3_S_BYTES],
) -> Result<(), OffGrid> {
    let (subs, max_scale) = block(lattice::iq3s(), &IQ3_S, x, qw)?;
    y.fill(0);
    // ggml advances its `qs` and `signs` pointers past non-zero sub-blocks
    // only: after an all-zero sub-block the later ones sit one place early
    // (their `qh` bits do not move). Kept, for the same bytes.
    let mut at = 0;
    for (ib, sb) in subs.iter().enumerate() {
        if let Some(sb) = sb {
            for k in 0..8 {
                y[2 + 8 * at + k] = sb.index[k] as u8;
                y[66 + ib] |= ((sb.index[k] >> 8) as u8) << k;
            }
            y[74 + 4 * at..78 + 4 * at].copy_from_slice(&sb.signs);
            at += 1;
        }
    }
    if max_scale == 0.0 {
        return Ok(());
    }
    let d = max_scale / 31.0;
    write_f16(y, 0, d * 1.033);
    let id = 1.0 / d;
    for ib in (0..8).step_by(2) {
        y[106 + ib / 2] =
            scale4(id, sub_scale(&subs[ib])) | (scale4(id, sub_scale(&subs[ib + 1])) << 4);
    }
    Ok(())
}
