//! ggml's scale searches of the K-quants (`make_qkx2_quants`,
//! `make_qx_quants`) for `L` sub-blocks side by side.
//!
//! Each candidate scale of a sub-block costs a pass of running sums over its
//! values, so one sub-block at a time is bound by the latency of those adds.
//! Here value `i` of sub-block `k` is `x[i][k]`: every operation is done lane
//! by lane in ggml's order for each lane (the same f32 operations, only side
//! by side, so the compiler runs them as vector instructions and the results
//! are ggml's to the bit), and the branches become per-lane selections.

use super::kquants_quantize::{nearest_int, GROUP_MAX_EPS};

/// `L` sub-blocks of `N` values, transposed: `t[i][k]` is value `i` of
/// sub-block `k`, which starts at `x[k * N]`.
#[inline(always)]
pub(super) fn transpose<const N: usize, const L: usize>(x: &[f32]) -> [[f32; L]; N] {
    let mut t = [[0f32; L]; N];
    for (k, xs) in x.chunks_exact(N).take(L).enumerate() {
        for (i, &v) in xs.iter().enumerate() {
            t[i][k] = v;
        }
    }
    t
}

/// The inverse of [`transpose`]: `t[i][k]` to `out[k * N + i]`.
#[inline(always)]
pub(super) fn untranspose<const N: usize, const L: usize, T: Copy>(t: &[[T; L]; N], out: &mut [T]) {
    for (i, ti) in t.iter().enumerate() {
        for (k, &v) in ti.iter().enumerate() {
            out[k * N + i] = v;
        }
    }
}

/// The largest of `v` and 0, by ggml's loop (`if (v > max) max = v`).
#[inline(always)]
pub(super) fn max_positive(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, &s| if s > m { s } else { m })
}

/// The first value of largest magnitude in `v` and that magnitude (ggml's
/// `if (fabsf(v) > amax) { amax = fabsf(v); max = v; }`, from 0).
#[inline(always)]
pub(super) fn largest_magnitude(v: &[f32]) -> (f32, f32) {
    v.iter().fold((0f32, 0f32), |(max, amax), &s| {
        if s.abs() > amax {
            (s, s.abs())
        } else {
            (max, amax)
        }
    })
}

/// The start both symmetric searches share (ggml's `make_qx_quants` and
/// `make_q3_quants`): per lane the value of largest magnitude `max`, its
/// magnitude, the levels at scale `-nmax / max` (stored plus `offset`) and
/// their sums `Σ w·x·l`, `Σ w·l²` with weights `x²`.
#[inline(always)]
#[allow(clippy::type_complexity)]
fn symmetric_start<const N: usize, const L: usize>(
    x: &[[f32; L]; N],
    nmax: i32,
    l: &mut [[i8; L]; N],
    offset: i32,
) -> ([f32; L], [f32; L], [f32; L], [f32; L]) {
    let (mut max, mut amax) = ([0f32; L], [0f32; L]);
    for xi in x {
        for k in 0..L {
            let ax = xi[k].abs();
            let up = ax > amax[k];
            amax[k] = if up { ax } else { amax[k] };
            max[k] = if up { xi[k] } else { max[k] };
        }
    }
    let iscale = max.map(|m| -(nmax as f32) / m);
    let (mut sumlx, mut suml2) = ([0f32; L], [0f32; L]);
    for (xi, li) in x.iter().zip(l.iter_mut()) {
        for k in 0..L {
            let v = xi[k];
            let q = nearest_int(iscale[k] * v).clamp(-nmax, nmax - 1);
            li[k] = (q + offset) as i8;
            let (w, qf) = (v * v, q as f32);
            sumlx[k] += w * v * qf;
            suml2[k] += w * qf * qf;
        }
    }
    (max, amax, sumlx, suml2)
}

/// ggml's `make_qkx2_quants` (levels `0..=nmax`, weighted squared error, or
/// absolute error with `MAD`) for `L` sub-blocks of `N` values: fills
/// `l[i][k]` and returns each sub-block's scale and −min.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub(super) fn make_qkx2<const N: usize, const L: usize, const MAD: bool>(
    x: &[[f32; L]; N],
    w: &[[f32; L]; N],
    nmax: i32,
    l: &mut [[u8; L]; N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> ([f32; L], [f32; L]) {
    let err = |d: f32| if MAD { d.abs() } else { d * d };
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w[0];
    let mut sum_x = [0f32; L];
    for k in 0..L {
        sum_x[k] = sum_w[k] * x[0][k];
    }
    for i in 1..N {
        for k in 0..L {
            let v = x[i][k];
            min[k] = if v < min[k] { v } else { min[k] };
            max[k] = if v > max[k] { v } else { max[k] };
            sum_w[k] += w[i][k];
            sum_x[k] += w[i][k] * v;
        }
    }
    let mut flat = [false; L];
    for k in 0..L {
        min[k] = if min[k] > 0.0 { 0.0 } else { min[k] };
        flat[k] = max[k] == min[k];
    }
    let min0 = min;
    let nmaxf = nmax as f32;
    let mut iscale = [0f32; L];
    let mut scale = [0f32; L];
    let mut best = [0f32; L];
    for k in 0..L {
        iscale[k] = nmaxf / (max[k] - min[k]);
        scale[k] = 1.0 / iscale[k];
    }
    for i in 0..N {
        for k in 0..L {
            let q = nearest_int(iscale[k] * (x[i][k] - min[k])).clamp(0, nmax);
            l[i][k] = q as u8;
            let diff = scale[k] * q as f32 + min[k] - x[i][k];
            best[k] += w[i][k] * err(diff);
        }
    }
    if nstep >= 1 {
        let mut laux = [[0u8; L]; N];
        for is in 0..=nstep {
            let step = rmin + rdelta * is as f32 + nmaxf;
            let (mut sum_l, mut sum_l2, mut sum_xl) = ([0f32; L], [0f32; L], [0f32; L]);
            for k in 0..L {
                iscale[k] = step / (max[k] - min[k]);
            }
            for i in 0..N {
                for k in 0..L {
                    let q = nearest_int(iscale[k] * (x[i][k] - min[k])).clamp(0, nmax);
                    laux[i][k] = q as u8;
                    let (wv, lf) = (w[i][k], q as f32);
                    sum_l[k] += wv * lf;
                    sum_l2[k] += wv * lf * lf;
                    sum_xl[k] += wv * lf * x[i][k];
                }
            }
            let (mut this_scale, mut this_min, mut ok) = ([0f32; L], [0f32; L], [false; L]);
            for k in 0..L {
                let d = sum_w[k] * sum_l2[k] - sum_l[k] * sum_l[k];
                ok[k] = d > 0.0;
                let s = (sum_w[k] * sum_xl[k] - sum_x[k] * sum_l[k]) / d;
                let m = (sum_l2[k] * sum_x[k] - sum_l[k] * sum_xl[k]) / d;
                let clip = m > 0.0;
                this_scale[k] = if clip { sum_xl[k] / sum_l2[k] } else { s };
                this_min[k] = if clip { 0.0 } else { m };
            }
            let mut cur = [0f32; L];
            for i in 0..N {
                for k in 0..L {
                    let diff = this_scale[k] * laux[i][k] as f32 + this_min[k] - x[i][k];
                    cur[k] += w[i][k] * err(diff);
                }
            }
            let mut accept = [false; L];
            for k in 0..L {
                accept[k] = ok[k] && cur[k] < best[k];
                if accept[k] {
                    best[k] = cur[k];
                    scale[k] = this_scale[k];
                    min[k] = this_min[k];
                }
            }
            if accept.iter().any(|&a| a) {
                for i in 0..N {
                    for k in 0..L {
                        l[i][k] = if accept[k] { laux[i][k] } else { l[i][k] };
                    }
                }
            }
        }
    }
    let mut neg_min = [0f32; L];
    for k in 0..L {
        if flat[k] {
            scale[k] = 0.0;
            min[k] = min0[k];
            for li in l.iter_mut() {
                li[k] = 0;
            }
        }
        neg_min[k] = -min[k];
    }
    (scale, neg_min)
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no importance weights
/// (symmetric levels `-nmax..nmax-1` stored as `l + nmax`, weights `x²`,
/// 18 candidate scales) for `L` sub-blocks of `N` values: fills `l[i][k]`
/// and returns each sub-block's scale.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub(super) fn make_qx<const N: usize, const L: usize>(
    x: &[[f32; L]; N],
    nmax: i32,
    l: &mut [[i8; L]; N],
) -> [f32; L] {
    let (max, amax, sumlx, suml2) = symmetric_start(x, nmax, l, nmax);
    let nmaxf = nmax as f32;
    let mut iscale = [0f32; L];
    let (mut scale, mut best) = ([0f32; L], [0f32; L]);
    for k in 0..L {
        scale[k] = if suml2[k] != 0.0 {
            sumlx[k] / suml2[k]
        } else {
            0.0
        };
        best[k] = scale[k] * sumlx[k];
    }
    let mut laux = [[0i8; L]; N];
    for is in (-9..=9).filter(|&is| is != 0) {
        let top = -(nmaxf + 0.1 * is as f32);
        let (mut sumlx, mut suml2) = ([0f32; L], [0f32; L]);
        for k in 0..L {
            iscale[k] = top / max[k];
        }
        for i in 0..N {
            for k in 0..L {
                let v = x[i][k];
                let q = nearest_int(iscale[k] * v).clamp(-nmax, nmax - 1);
                laux[i][k] = (q + nmax) as i8;
                let (w, qf) = (v * v, q as f32);
                sumlx[k] += w * v * qf;
                suml2[k] += w * qf * qf;
            }
        }
        let mut accept = [false; L];
        for k in 0..L {
            accept[k] = suml2[k] > 0.0 && sumlx[k] * sumlx[k] > best[k] * suml2[k];
            if accept[k] {
                scale[k] = sumlx[k] / suml2[k];
                best[k] = scale[k] * sumlx[k];
            }
        }
        if accept.iter().any(|&a| a) {
            for i in 0..N {
                for k in 0..L {
                    l[i][k] = if accept[k] { laux[i][k] } else { l[i][k] };
                }
            }
        }
    }
    for k in 0..L {
        if amax[k] < GROUP_MAX_EPS {
            scale[k] = 0.0;
            for li in l.iter_mut() {
                li[k] = 0;
            }
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse` (symmetric levels `-nmax..nmax-1`
/// stored as `l + nmax`, weights `x²`, then up to five passes moving one
/// level at a time while the fit improves) for `L` sub-blocks of `N`
/// values: fills `l[i][k]` and returns each sub-block's scale. A lane whose
/// pass changed nothing would change nothing in the next pass either, so
/// the passes stop when no lane changes (ggml stops each sub-block then).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub(super) fn make_q3<const N: usize, const L: usize>(
    x: &[[f32; L]; N],
    nmax: i32,
    l: &mut [[i8; L]; N],
) -> [f32; L] {
    let (_, amax, mut sumlx, mut suml2) = symmetric_start(x, nmax, l, 0);
    for _ in 0..5 {
        let mut changed = false;
        for i in 0..N {
            for k in 0..L {
                let v = x[i][k];
                let (w, li) = (v * v, l[i][k] as f32);
                let slx = sumlx[k] - w * v * li;
                let sl2 = suml2[k] - w * li * li;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                let nl = new_l as f32;
                let slx2 = slx + w * v * nl;
                let sl22 = sl2 + w * nl * nl;
                let take = slx > 0.0
                    && new_l != l[i][k] as i32
                    && sl22 > 0.0
                    && slx2 * slx2 * suml2[k] > sumlx[k] * sumlx[k] * sl22;
                if take {
                    l[i][k] = new_l as i8;
                    sumlx[k] = slx2;
                    suml2[k] = sl22;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    let mut scale = [0f32; L];
    for k in 0..L {
        let zero = amax[k] < GROUP_MAX_EPS;
        // ggml's `suml2 > 0 ? sumlx / suml2 : 0` (a NaN sum gives 0)
        scale[k] = if !zero && suml2[k] > 0.0 {
            sumlx[k] / suml2[k]
        } else {
            0.0
        };
        for li in l.iter_mut() {
            li[k] = if zero { 0 } else { li[k] + nmax as i8 };
        }
    }
    scale
}
