//! Activations and element-wise arithmetic. The slice functions on hot
//! paths (SiLU, SwiGLU) use a vectorizable `exp` and are compiled per SIMD
//! level; the scalar helpers (`silu1`, `softplus1`) use libm's `exp`.

use crate::multiversion;
use crate::simd::math::{exp_fast, softplus_fast};

/// `x * sigmoid(x)`.
#[inline]
pub fn silu1(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `ln(1 + e^x)`, exact for large `x` (as torch: linear above 20).
#[inline]
pub fn softplus1(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `x * sigmoid(x)` with the vectorizable `exp` (about 1e-6 relative).
#[inline(always)]
pub(crate) fn silu_fast(x: f32) -> f32 {
    x / (1.0 + exp_fast(-x))
}

#[inline(always)]
fn silu_slice(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu_fast(*v));
}
multiversion!(fn silu_slice_mv(x: &mut [f32]) => silu_slice);

#[inline(always)]
fn silu_copy(x: &[f32], y: &mut [f32]) {
    y.iter_mut().zip(x).for_each(|(o, v)| *o = silu_fast(*v));
}
multiversion!(fn silu_copy_mv(x: &[f32], y: &mut [f32]) => silu_copy);

#[inline(always)]
fn swiglu_slice(gate: &mut [f32], up: &[f32]) {
    gate.iter_mut()
        .zip(up)
        .for_each(|(g, u)| *g = silu_fast(*g) * u);
}
multiversion!(fn swiglu_slice_mv(gate: &mut [f32], up: &[f32]) => swiglu_slice);

/// `x = silu(x)` in place.
pub fn silu_inplace(x: &mut [f32]) {
    silu_slice_mv(x);
}

/// `y = silu(x)`.
pub fn silu(x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len());
    silu_copy_mv(x, y);
}

#[inline(always)]
fn mul_silu_slice(y: &mut [f32], z: &[f32]) {
    y.iter_mut().zip(z).for_each(|(v, g)| *v *= silu_fast(*g));
}
multiversion!(fn mul_silu_slice_mv(y: &mut [f32], z: &[f32]) => mul_silu_slice);

#[inline(always)]
fn mul_sigmoid_slice(y: &mut [f32], z: &[f32]) {
    y.iter_mut()
        .zip(z)
        .for_each(|(v, g)| *v /= 1.0 + exp_fast(-*g));
}
multiversion!(fn mul_sigmoid_slice_mv(y: &mut [f32], z: &[f32]) => mul_sigmoid_slice);

/// An output gate: `y = y · sigmoid(z)` (as `y / (1 + e^−z)`) in place.
pub fn mul_sigmoid_inplace(y: &mut [f32], z: &[f32]) {
    assert_eq!(y.len(), z.len());
    mul_sigmoid_slice_mv(y, z);
}

/// The Mamba gate: `y = y * silu(z)` in place.
pub fn mul_silu_inplace(y: &mut [f32], z: &[f32]) {
    assert_eq!(y.len(), z.len());
    mul_silu_slice_mv(y, z);
}

/// SwiGLU: `gate = silu(gate) * up` in place.
pub fn swiglu_inplace(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    swiglu_slice_mv(gate, up);
}

#[inline(always)]
fn swiglu_clamped_slice(gate: &mut [f32], up: &[f32], limit: f32) {
    gate.iter_mut()
        .zip(up)
        .for_each(|(g, u)| *g = silu_fast(*g).min(limit) * u.clamp(-limit, limit));
}
multiversion!(fn swiglu_clamped_slice_mv(gate: &mut [f32], up: &[f32], limit: f32) => swiglu_clamped_slice);

/// SwiGLU with its two halves clipped (Step-3.5, Ling 3.0):
/// `gate = min(silu(gate), limit) * clamp(up, −limit, limit)` in place.
pub fn swiglu_clamped_inplace(gate: &mut [f32], up: &[f32], limit: f32) {
    assert_eq!(gate.len(), up.len());
    swiglu_clamped_slice_mv(gate, up, limit);
}

#[inline(always)]
fn softplus_slice(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = softplus_fast(*v));
}
multiversion!(fn softplus_slice_mv(x: &mut [f32]) => softplus_slice);

/// `x = softplus(x)` in place (vectorized; within 1e-6 of [`softplus1`]).
pub fn softplus_inplace(x: &mut [f32]) {
    softplus_slice_mv(x);
}

/// `x = max(x, 0)^2` in place (Nemotron-H MLP).
pub fn relu2_inplace(x: &mut [f32]) {
    x.iter_mut().for_each(|v| {
        let r = v.max(0.0);
        *v = r * r;
    });
}

/// `x = gelu(x)` (tanh approximation) in place.
pub fn gelu_inplace(x: &mut [f32]) {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    x.iter_mut()
        .for_each(|v| *v = 0.5 * *v * (1.0 + (C * (*v + 0.044715 * *v * *v * *v)).tanh()));
}

/// The error function, to 1.5e-7 (Abramowitz & Stegun 7.1.26, in f64).
pub fn erf1(x: f32) -> f32 {
    let (s, x) = (x.signum() as f64, x.abs() as f64);
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    (s * (1.0 - poly * (-x * x).exp())) as f32
}

/// `x·Φ(x) = 0.5·x·(1 + erf(x/√2))`: the exact GELU (torch's default,
/// transformers' `gelu`), not the tanh approximation.
#[inline]
pub fn gelu_erf1(x: f32) -> f32 {
    0.5 * x * (1.0 + erf1(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// GeGLU with the exact GELU: `gate = gelu(gate) * up` in place.
pub fn geglu_erf_inplace(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len());
    gate.iter_mut()
        .zip(up)
        .for_each(|(g, u)| *g = gelu_erf1(*g) * u);
}

/// `a += b`.
pub fn add_inplace(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
}

/// `out = a + b`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    assert!(a.len() == b.len() && a.len() == out.len());
    out.iter_mut()
        .zip(a.iter().zip(b))
        .for_each(|(o, (x, y))| *o = x + y);
}

/// `a *= b` element-wise.
pub fn mul_inplace(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    a.iter_mut().zip(b).for_each(|(x, y)| *x *= y);
}

/// `x *= s`.
pub fn scale_inplace(x: &mut [f32], s: f32) {
    x.iter_mut().for_each(|v| *v *= s);
}

/// `a += s * b` (residual with a multiplier).
pub fn axpy(a: &mut [f32], s: f32, b: &[f32]) {
    assert_eq!(a.len(), b.len());
    a.iter_mut().zip(b).for_each(|(x, y)| *x += s * y);
}

/// `x[i, :] += bias` for each row of `bias.len()` values.
pub fn add_bias_rows(x: &mut [f32], bias: &[f32]) {
    assert!(!bias.is_empty() && x.len().is_multiple_of(bias.len()));
    for r in x.chunks_exact_mut(bias.len()) {
        add_inplace(r, bias);
    }
}

/// Numerically stable softmax of each row of `dim` values, in place.
pub fn softmax_inplace(x: &mut [f32], dim: usize) {
    assert!(dim > 0 && x.len().is_multiple_of(dim));
    for r in x.chunks_exact_mut(dim) {
        let m = r.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        if m == f32::NEG_INFINITY {
            r.fill(1.0 / dim as f32);
            continue;
        }
        let mut s = 0f32;
        for v in r.iter_mut() {
            *v = (*v - m).exp();
            s += *v;
        }
        let inv = 1.0 / s;
        r.iter_mut().for_each(|v| *v *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations() {
        assert!((silu1(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((softplus1(0.0) - std::f32::consts::LN_2).abs() < 1e-6);
        assert_eq!(softplus1(50.0), 50.0);
        // erf against known values; GELU's tails
        for (x, e) in [
            (0.5f32, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-2.0, -0.995_322_3),
        ] {
            assert!((erf1(x) - e).abs() < 3e-7, "erf({x}) = {}", erf1(x));
        }
        assert!(erf1(0.0).abs() < 1e-8);
        assert!((gelu_erf1(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!(gelu_erf1(-10.0).abs() < 1e-6);
        assert!(softplus1(-50.0) >= 0.0 && softplus1(-50.0) < 1e-20);
        let mut v = [-2.0f32, 3.0];
        relu2_inplace(&mut v);
        assert_eq!(v, [0.0, 9.0]);
        let mut s = [1.0f32, 2.0, 3.0, 0.0, 0.0, 0.0];
        softmax_inplace(&mut s, 3);
        assert!((s.iter().take(3).sum::<f32>() - 1.0).abs() < 1e-6);
        assert!((s[2] - 0.665_240_9).abs() < 1e-6);
        assert!((s[4] - 1.0 / 3.0).abs() < 1e-6);
        let mut a = [1.0f32, 2.0];
        axpy(&mut a, 2.0, &[1.0, 1.0]);
        assert_eq!(a, [3.0, 4.0]);
        // vectorized SiLU / SwiGLU against libm
        let xs: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.05).collect();
        let mut v = xs.clone();
        silu_inplace(&mut v);
        let mut g = xs.clone();
        swiglu_inplace(&mut g, &xs);
        for ((x, s), w) in xs.iter().zip(&v).zip(&g) {
            let e = silu1(*x);
            assert!((s - e).abs() <= 1e-6 * e.abs().max(1e-3), "{x}: {s} vs {e}");
            assert!((w - e * x).abs() <= 1e-5 * (e * x).abs().max(1e-3));
        }
    }
}
