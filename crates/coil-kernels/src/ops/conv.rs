//! Causal depthwise 1-D convolution with a carried window (Mamba conv1d).

use crate::multiversion;
use crate::pool::ThreadPool;

/// `out[t, c] = bias[c] + sum_j weight[c, j] · u[t − (k−1) + j, c]` where `u`
/// is the input preceded by the carried window.
///
/// * `x`: `[n_tokens, channels]` new inputs
/// * `state`: `[k − 1, channels]`, the previous `k − 1` inputs, oldest first;
///   replaced by the last `k − 1` inputs of `state ++ x`
/// * `weight`: `[channels, k]` (ggml `ssm_conv1d.weight` `{k, channels}`)
/// * `bias`: `[channels]` or `None`; `out`: `[n_tokens, channels]`
///
/// No activation is applied (call `silu_inplace` on `out`).
pub fn conv1d_causal(
    x: &[f32],
    state: &mut [f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    channels: usize,
    k: usize,
) {
    let wt = checked_weights(x, state, weight, bias, out, channels, k);
    let n = x.len() / channels;
    conv_rows_mv(x, state, &wt, bias, out, channels, k, n);
    // New window: last k-1 rows of state ++ x.
    if k > 1 {
        let w = k - 1;
        if n >= w {
            state.copy_from_slice(&x[(n - w) * channels..n * channels]);
        } else {
            state.copy_within(n * channels.., 0);
            state[(w - n) * channels..].copy_from_slice(x);
        }
    }
}

/// Checks the shapes of a [`conv1d_causal`] call and returns the weights
/// transposed to `[k, channels]` (so the channel loop is contiguous).
fn checked_weights(
    x: &[f32],
    state: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &[f32],
    channels: usize,
    k: usize,
) -> Vec<f32> {
    assert!(k >= 1 && channels > 0);
    assert!(x.len().is_multiple_of(channels) && out.len() == x.len());
    assert_eq!(
        state.len(),
        (k - 1) * channels,
        "conv1d: state is not [k-1, channels]"
    );
    assert_eq!(
        weight.len(),
        channels * k,
        "conv1d: weight is not [channels, k]"
    );
    if let Some(b) = bias {
        assert_eq!(b.len(), channels);
    }
    let mut wt = vec![0f32; k * channels];
    for c in 0..channels {
        for j in 0..k {
            wt[j * channels + c] = weight[c * k + j];
        }
    }
    wt
}

/// [`conv1d_causal`] with the tokens spread over `pool` (each range reads
/// its window from the inputs before it; the carried window is updated
/// once at the end). Same results, bit for bit.
pub fn conv1d_causal_pool(
    pool: &ThreadPool,
    x: &[f32],
    state: &mut [f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    channels: usize,
    k: usize,
) {
    assert!(k >= 1 && channels > 0);
    let n = x.len() / channels;
    // Ranges must start at or after k-1 to find their window in `x`.
    let grain = 32.max(k);
    if n <= grain || pool.n_threads() == 1 {
        return conv1d_causal(x, state, weight, bias, out, channels, k);
    }
    let wt = checked_weights(x, state, weight, bias, out, channels, k);
    {
        let window0: &[f32] = state;
        pool.rows_mut(out, channels, grain, |t0, part| {
            let nt = part.len() / channels;
            let window = if t0 == 0 {
                window0
            } else {
                &x[(t0 + 1 - k) * channels..t0 * channels]
            };
            let xs = &x[t0 * channels..(t0 + nt) * channels];
            conv_rows_mv(xs, window, &wt, bias, part, channels, k, nt);
        });
    }
    if k > 1 {
        // n > grain >= k > k-1: the new window lies entirely in x.
        state.copy_from_slice(&x[(n - (k - 1)) * channels..n * channels]);
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn conv_rows(
    x: &[f32],
    state: &[f32],
    wt: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    channels: usize,
    k: usize,
    n: usize,
) {
    for t in 0..n {
        let o = &mut out[t * channels..(t + 1) * channels];
        match bias {
            Some(b) => o.copy_from_slice(b),
            None => o.fill(0.0),
        }
        for j in 0..k {
            // input index t - (k-1) + j, possibly in the window
            let src = if t + j < k - 1 {
                let i = t + j; // row in state
                &state[i * channels..(i + 1) * channels]
            } else {
                let i = t + j - (k - 1);
                &x[i * channels..(i + 1) * channels]
            };
            let wj = &wt[j * channels..(j + 1) * channels];
            for ((ov, sv), wv) in o.iter_mut().zip(src).zip(wj) {
                *ov += sv * wv;
            }
        }
    }
}
multiversion!(fn conv_rows_mv(
    x: &[f32], state: &[f32], wt: &[f32], bias: Option<&[f32]>, out: &mut [f32], channels: usize, k: usize,
    n: usize
) => conv_rows);

/// One step of [`conv1d_causal`]: `x`, `out`: `[channels]`.
pub fn conv1d_causal_step(
    x: &[f32],
    state: &mut [f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    k: usize,
) {
    conv1d_causal(x, state, weight, bias, out, x.len(), k);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    fn naive(x: &[f32], init: &[f32], w: &[f32], b: &[f32], ch: usize, k: usize) -> Vec<f32> {
        let n = x.len() / ch;
        let mut u = init.to_vec();
        u.extend_from_slice(x);
        let mut out = vec![0f32; n * ch];
        for t in 0..n {
            for c in 0..ch {
                let mut s = b[c];
                for j in 0..k {
                    s += w[c * k + j] * u[(t + j) * ch + c];
                }
                out[t * ch + c] = s;
            }
        }
        out
    }

    #[test]
    fn sequence_equals_steps_and_naive() {
        let mut rng = Rng::new(3);
        for &(ch, k, n) in &[(5, 4, 7), (3, 4, 2), (8, 1, 3), (4, 2, 1), (6, 3, 17)] {
            let x = rng.vec(n * ch);
            let init = rng.vec((k - 1) * ch);
            let w = rng.vec(ch * k);
            let b = rng.vec(ch);
            let want = naive(&x, &init, &w, &b, ch, k);
            let mut st = init.clone();
            let mut out = vec![0f32; n * ch];
            conv1d_causal(&x, &mut st, &w, Some(&b), &mut out, ch, k);
            for (a, e) in out.iter().zip(&want) {
                assert!((a - e).abs() < 1e-5);
            }
            // token-by-token with the carried window gives the same
            let mut st2 = init.clone();
            for t in 0..n {
                let mut o = vec![0f32; ch];
                conv1d_causal_step(&x[t * ch..(t + 1) * ch], &mut st2, &w, Some(&b), &mut o, k);
                for c in 0..ch {
                    assert!((o[c] - want[t * ch + c]).abs() < 1e-5);
                }
            }
            assert_eq!(st, st2);
        }
    }

    #[test]
    fn pool_version_is_bit_identical() {
        let mut rng = Rng::new(5);
        let pool = crate::ThreadPool::new(2);
        for &(ch, k, n) in &[(5, 4, 200), (8, 1, 100), (6, 3, 33), (7, 4, 20)] {
            let x = rng.vec(n * ch);
            let init = rng.vec((k - 1) * ch);
            let w = rng.vec(ch * k);
            let b = rng.vec(ch);
            let (mut st1, mut st2) = (init.clone(), init.clone());
            let (mut o1, mut o2) = (vec![0f32; n * ch], vec![0f32; n * ch]);
            conv1d_causal(&x, &mut st1, &w, Some(&b), &mut o1, ch, k);
            conv1d_causal_pool(&pool, &x, &mut st2, &w, Some(&b), &mut o2, ch, k);
            assert_eq!(o1, o2);
            assert_eq!(st1, st2);
        }
    }
}
