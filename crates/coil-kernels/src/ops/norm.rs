//! RMS normalisation.

use super::act::silu_fast;
use crate::multiversion;

/// `1 / sqrt(mean(x²) + eps)`, summed in 16 lanes (vectorizes).
#[inline(always)]
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let mut acc = [0f32; 16];
    let c = x.chunks_exact(16);
    let tail: f32 = c.remainder().iter().map(|v| v * v).sum();
    for ch in c {
        for i in 0..16 {
            acc[i] += ch[i] * ch[i];
        }
    }
    let ss = acc.iter().sum::<f32>() + tail;
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}

#[inline(always)]
fn rms_rows(x: &[f32], weight: Option<&[f32]>, eps: f32, y: &mut [f32], dim: usize) {
    for (xr, yr) in x.chunks_exact(dim).zip(y.chunks_exact_mut(dim)) {
        let s = inv_rms(xr, eps);
        match weight {
            Some(w) => {
                for ((o, v), g) in yr.iter_mut().zip(xr).zip(w) {
                    *o = v * s * g;
                }
            }
            None => {
                for (o, v) in yr.iter_mut().zip(xr) {
                    *o = v * s;
                }
            }
        }
    }
}
multiversion!(fn rms_rows_mv(x: &[f32], weight: Option<&[f32]>, eps: f32, y: &mut [f32], dim: usize) => rms_rows);

#[inline(always)]
fn rms_rows_inplace(x: &mut [f32], weight: Option<&[f32]>, eps: f32, dim: usize) {
    for xr in x.chunks_exact_mut(dim) {
        let s = inv_rms(xr, eps);
        match weight {
            Some(w) => xr.iter_mut().zip(w).for_each(|(v, g)| *v *= s * g),
            None => xr.iter_mut().for_each(|v| *v *= s),
        }
    }
}
multiversion!(fn rms_rows_inplace_mv(x: &mut [f32], weight: Option<&[f32]>, eps: f32, dim: usize) => rms_rows_inplace);

/// `y[i, :] = x[i, :] / rms(x[i, :]) * weight` per row of `dim` values;
/// `x`, `y`: `[n, dim]`, `weight`: `[dim]` or `None` (no weight).
pub fn rms_norm(x: &[f32], weight: Option<&[f32]>, eps: f32, y: &mut [f32], dim: usize) {
    assert_eq!(x.len(), y.len());
    assert!(dim > 0 && x.len().is_multiple_of(dim));
    if let Some(w) = weight {
        assert_eq!(w.len(), dim);
    }
    rms_rows_mv(x, weight, eps, y, dim);
}

/// In-place [`rms_norm`] of `x`: `[n, dim]`.
pub fn rms_norm_inplace(x: &mut [f32], weight: Option<&[f32]>, eps: f32, dim: usize) {
    assert!(dim > 0 && x.len().is_multiple_of(dim));
    if let Some(w) = weight {
        assert_eq!(w.len(), dim);
    }
    rms_rows_inplace_mv(x, weight, eps, dim);
}

/// Mamba-2 gated RMSNorm (gate before norm): `u = y * silu(z)`, normalised
/// over each group of `dim / n_groups` channels, times `weight`.
/// `y`, `z`, `out`: `[n, dim]`; `weight`: `[dim]` (ggml's `ssm_norm`
/// `{dim/G, G}` is the same memory). `z = None` skips the gate.
pub fn group_rms_norm_gated(
    y: &[f32],
    z: Option<&[f32]>,
    weight: &[f32],
    n_groups: usize,
    eps: f32,
    out: &mut [f32],
    dim: usize,
) {
    assert!(dim > 0 && n_groups > 0 && dim.is_multiple_of(n_groups));
    assert!(y.len().is_multiple_of(dim) && out.len() == y.len() && weight.len() == dim);
    if let Some(z) = z {
        assert_eq!(z.len(), y.len());
    }
    gated_rows_mv(y, z, weight, n_groups, eps, out, dim);
}

#[inline(always)]
fn gated_rows(
    y: &[f32],
    z: Option<&[f32]>,
    weight: &[f32],
    n_groups: usize,
    eps: f32,
    out: &mut [f32],
    dim: usize,
) {
    let gs = dim / n_groups;
    for (i, (yr, or)) in y
        .chunks_exact(dim)
        .zip(out.chunks_exact_mut(dim))
        .enumerate()
    {
        match z {
            Some(z) => {
                let zr = &z[i * dim..(i + 1) * dim];
                for ((o, v), g) in or.iter_mut().zip(yr).zip(zr) {
                    *o = v * silu_fast(*g);
                }
            }
            None => or.copy_from_slice(yr),
        }
        for (og, wg) in or.chunks_exact_mut(gs).zip(weight.chunks_exact(gs)) {
            let s = inv_rms(og, eps);
            og.iter_mut().zip(wg).for_each(|(v, w)| *v *= s * w);
        }
    }
}
multiversion!(fn gated_rows_mv(
    y: &[f32], z: Option<&[f32]>, weight: &[f32], n_groups: usize, eps: f32, out: &mut [f32], dim: usize
) => gated_rows);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_formula() {
        let x = [1.0f32, 2.0, 3.0, 4.0, -1.0, 0.5, 0.0, 2.0];
        let w = [1.0f32, 0.5, 2.0, 1.0];
        let mut y = [0f32; 8];
        rms_norm(&x, Some(&w), 1e-6, &mut y, 4);
        let r = (30.0f32 / 4.0 + 1e-6).sqrt();
        assert!((y[1] - 2.0 / r * 0.5).abs() < 1e-6);
        let mut x2 = x;
        rms_norm_inplace(&mut x2, Some(&w), 1e-6, 4);
        assert_eq!(x2, y);
        let mut y0 = [0f32; 8];
        rms_norm(&x, None, 1e-6, &mut y0, 4);
        assert!((y0[2] - 3.0 / r).abs() < 1e-6);
    }

    #[test]
    fn gated_group_norm() {
        let y = [1.0f32, 2.0, 3.0, 4.0];
        let z = [0.5f32, -1.0, 2.0, 0.0];
        let w = [1.0f32, 2.0, 3.0, 4.0];
        let mut out = [0f32; 4];
        group_rms_norm_gated(&y, Some(&z), &w, 2, 1e-5, &mut out, 4);
        let u: Vec<f32> = y
            .iter()
            .zip(&z)
            .map(|(a, b)| a * b / (1.0 + (-b).exp()))
            .collect();
        for g in 0..2 {
            let s = ((u[2 * g].powi(2) + u[2 * g + 1].powi(2)) / 2.0 + 1e-5).sqrt();
            for j in 0..2 {
                let i = 2 * g + j;
                assert!((out[i] - u[i] / s * w[i]).abs() < 1e-5);
            }
        }
    }
}
