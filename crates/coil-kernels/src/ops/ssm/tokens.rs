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

#[cfg(test)]
mod tests {
    use crate::ops::ssm::{mamba2_scan_from, Mamba2Dims, ScanInputs};
    use crate::pool::ThreadPool;
    use crate::simd::{detected_level, SimdLevel};
    use crate::testutil::Rng;

    /// Several tokens in one call (this kernel) leave the state and give the
    /// outputs of one token per call, bit for bit, starting in place or
    /// from another buffer.
    #[test]
    fn tokens_in_one_call_equal_one_at_a_time_bit_for_bit() {
        if detected_level() < SimdLevel::Avx2 {
            return;
        }
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(5);
        for &(hn, p, g, n, t) in &[(3, 5, 1, 64, 9), (4, 3, 2, 128, 2), (2, 4, 2, 192, 17)] {
            let dims = Mamba2Dims {
                n_head: hn,
                head_dim: p,
                n_group: g,
                d_state: n,
            };
            assert!(super::usable(&dims));
            let x = rng.vec(t * hn * p);
            let dt: Vec<f32> = rng.vec(t * hn).iter().map(|v| v.abs() * 0.5).collect();
            let a: Vec<f32> = rng.vec(hn).iter().map(|v| -v.abs() - 0.1).collect();
            let b = rng.vec(t * g * n);
            let c = rng.vec(t * g * n);
            let dd = rng.vec(hn);
            let s0 = rng.vec(hn * p * n);
            for from in [false, true] {
                let inputs = |t0: usize, nt: usize| {
                    ScanInputs::dense(
                        &dims,
                        &x[t0 * hn * p..(t0 + nt) * hn * p],
                        &b[t0 * g * n..(t0 + nt) * g * n],
                        &c[t0 * g * n..(t0 + nt) * g * n],
                        nt,
                    )
                };
                let mut st = if from {
                    vec![f32::NAN; s0.len()]
                } else {
                    s0.clone()
                };
                let mut y = vec![0f32; t * hn * p];
                let src = from.then_some(&s0[..]);
                mamba2_scan_from(
                    &pool,
                    dims,
                    src,
                    &mut st,
                    inputs(0, t),
                    &dt,
                    &a,
                    Some(&dd),
                    &mut y,
                    t,
                );
                let mut st1 = if from {
                    vec![f32::NAN; s0.len()]
                } else {
                    s0.clone()
                };
                let mut y1 = vec![0f32; t * hn * p];
                for k in 0..t {
                    let src = (from && k == 0).then_some(&s0[..]);
                    mamba2_scan_from(
                        &pool,
                        dims,
                        src,
                        &mut st1,
                        inputs(k, 1),
                        &dt[k * hn..(k + 1) * hn],
                        &a,
                        Some(&dd),
                        &mut y1[k * hn * p..(k + 1) * hn * p],
                        1,
                    );
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&y), bits(&y1), "outputs, dims {dims:?}, from {from}");
                assert_eq!(bits(&st), bits(&st1), "state, dims {dims:?}, from {from}");
            }
        }
    }
}
