//! A Mamba-2 head over several tokens of one sequence (speculative
//! verification, prefill in batch-invariant mode), state row by state row:
//! 64 values of a row `S_h[p, ·]` stay in eight registers while every token
//! updates them, so the head's state (`head_dim × d_state` f32, as large as
//! L1) is read and written once per call instead of once per token.
//!
//! Each value goes through exactly the operations of the one-token loop in
//! `scan.rs` (`s = s·dA + (x·dt)·B`, `acc[i] += s·C` into the same sixteen
//! accumulator lanes in the same order, the same final sum), so the outputs
//! and the state are bit for bit those of feeding the tokens one at a time.

use super::dims::Mamba2Dims;
use crate::simd::math::exp_fast;
use crate::simd::{self, SimdLevel};
use std::arch::x86_64::*;

/// Values of a state row kept in registers at once.
const SPAN: usize = 64;

/// Whether [`head`] can run `dims` at the current SIMD level.
pub(super) fn usable(dims: &Mamba2Dims) -> bool {
    simd::level() >= SimdLevel::Avx2 && dims.d_state.is_multiple_of(SPAN)
}

/// One head `h` over `n_tokens` tokens, as `scan.rs`'s `m2_head` (same
/// arguments; `from`: the head's state to start from instead of `state`'s).
///
/// # Safety
/// The CPU has AVX2 ([`usable`]); `y` points to `[n_tokens, n_head, head_dim]`
/// whose `(·, h, ·)` elements only this call writes.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn head(
    dims: &Mamba2Dims,
    h: usize,
    from: Option<&[f32]>,
    state: &mut [f32],
    x: &[f32],
    ldx: usize,
    b: &[f32],
    c: &[f32],
    ldbc: usize,
    dt: &[f32],
    a: &[f32],
    d: Option<&[f32]>,
    y: *mut f32,
    n_tokens: usize,
) {
    let (hn, p_dim, n) = (dims.n_head, dims.head_dim, dims.d_state);
    let g = h / (hn / dims.n_group);
    debug_assert!(n.is_multiple_of(SPAN) && state.len() == p_dim * n);
    let dh = d.map_or(0.0, |d| d[h]);
    // per token: dt, exp(dt·A)
    let dth: Vec<f32> = (0..n_tokens).map(|t| dt[t * hn + h]).collect();
    let da: Vec<f32> = dth.iter().map(|&v| exp_fast(v * a[h])).collect();
    // per token: the sixteen accumulator lanes of the current row
    let mut acc = vec![[_mm256_setzero_ps(); 2]; n_tokens];
    for p in 0..p_dim {
        acc.iter_mut().for_each(|a| *a = [_mm256_setzero_ps(); 2]);
        for s0 in (0..n).step_by(SPAN) {
            let row = p * n + s0;
            let src = from.map_or(state.as_ptr().add(row), |f| f.as_ptr().add(row));
            let mut s: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(src.add(8 * j)));
            for t in 0..n_tokens {
                let xdt = _mm256_set1_ps(x[t * ldx + h * p_dim + p] * dth[t]);
                let dav = _mm256_set1_ps(da[t]);
                let bt = b.as_ptr().add(t * ldbc + g * n + s0);
                let ct = c.as_ptr().add(t * ldbc + g * n + s0);
                let at = &mut acc[t];
                for (j, sj) in s.iter_mut().enumerate() {
                    let bj = _mm256_loadu_ps(bt.add(8 * j));
                    let v = _mm256_add_ps(_mm256_mul_ps(*sj, dav), _mm256_mul_ps(xdt, bj));
                    *sj = v;
                    let cj = _mm256_loadu_ps(ct.add(8 * j));
                    // lanes 0..8 of a 16-value chunk, then 8..16
                    at[j % 2] = _mm256_add_ps(at[j % 2], _mm256_mul_ps(v, cj));
                }
            }
            let dst = state.as_mut_ptr().add(row);
            for (j, sj) in s.iter().enumerate() {
                _mm256_storeu_ps(dst.add(8 * j), *sj);
            }
        }
        for (t, at) in acc.iter().enumerate() {
            let mut lanes = [0f32; 16];
            _mm256_storeu_ps(lanes.as_mut_ptr(), at[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), at[1]);
            let xv = x[t * ldx + h * p_dim + p];
            // as the one-token loop: the lanes in order, its (empty) tail, D·x
            let yv = lanes.iter().sum::<f32>() + 0f32 + dh * xv;
            *y.add((t * hn + h) * p_dim + p) = yv;
        }
    }
}
