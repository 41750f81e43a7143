//! Causal depthwise 1-D convolution with a carried window (Mamba conv1d, LFM2 short conv).

mod batch;
mod rows;

use crate::pool::ThreadPool;
pub use batch::{conv1d_causal_silu_batch, ConvSeq, ConvWeights};
use rows::{conv_rows_mv, shift_window};

/// Checks the window, weight and bias shapes of a convolution and returns
/// the weights transposed to `[k, channels]` (so the channel loop is
/// contiguous).
fn transposed_weights(
    state: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    channels: usize,
    k: usize,
) -> Vec<f32> {
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

/// `out[t, c] = silu(bias[c] + Σ_j weight[c, j] · u[t − (k−1) + j, c])`,
/// where `u` is the input preceded by the carried window (the Mamba conv1d
/// and its activation):
///
/// * input row `t` is `x[t·x_stride ..][..channels]` (so the channels can
///   be read in place from a wider buffer such as in_proj's output)
/// * `state`: `[k − 1, channels]`, the previous `k − 1` inputs, oldest
///   first; replaced by the last `k − 1` inputs of `state ++ x`
/// * `weight`: `[channels, k]` (ggml `ssm_conv1d.weight` `{k, channels}`)
/// * `bias`: `[channels]` or `None`; `out`: `[n_tokens, channels]`
///
/// Tokens are spread over `pool` (each range reads its window from the
/// inputs before it; the carried window is updated once at the end), with
/// the same results as one thread, bit for bit.
#[allow(clippy::too_many_arguments)]
pub fn conv1d_causal_silu_pool(
    pool: &ThreadPool,
    x: &[f32],
    x_stride: usize,
    state: &mut [f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    channels: usize,
    k: usize,
) {
    conv1d_causal_act_pool(
        pool,
        x,
        x_stride,
        state,
        weight,
        bias,
        out,
        channels,
        k,
        true,
        &|_| {},
    );
}

/// [`conv1d_causal_silu_pool`], then `post` on each range of output rows
/// (whole rows, `[.., channels]`) while they are still in cache.
#[allow(clippy::too_many_arguments)]
pub fn conv1d_causal_silu_pool_then(
    pool: &ThreadPool,
    x: &[f32],
    x_stride: usize,
    state: &mut [f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    channels: usize,
    k: usize,
    post: &(dyn Fn(&mut [f32]) + Sync),
) {
    conv1d_causal_act_pool(
        pool, x, x_stride, state, weight, bias, out, channels, k, true, post,
    );
}

/// [`conv1d_causal_silu_pool`] without the activation: `out[t, c] =
/// bias[c] + Σ_j weight[c, j] · u[t − (k−1) + j, c]` (LFM2's short
/// convolution, which has neither bias nor activation).
#[allow(clippy::too_many_arguments)]
pub fn conv1d_causal_pool(
    pool: &ThreadPool,
    x: &[f32],
    x_stride: usize,
    state: &mut [f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    channels: usize,
    k: usize,
) {
    conv1d_causal_act_pool(
        pool,
        x,
        x_stride,
        state,
        weight,
        bias,
        out,
        channels,
        k,
        false,
        &|_| {},
    );
}

#[allow(clippy::too_many_arguments)]
fn conv1d_causal_act_pool(
    pool: &ThreadPool,
    x: &[f32],
    x_stride: usize,
    state: &mut [f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    channels: usize,
    k: usize,
    silu: bool,
    post: &(dyn Fn(&mut [f32]) + Sync),
) {
    assert!(k >= 1 && channels > 0 && x_stride >= channels);
    assert!(out.len().is_multiple_of(channels));
    let n = out.len() / channels;
    if n == 0 {
        return;
    }
    assert!(
        x.len() >= (n - 1) * x_stride + channels,
        "conv1d: input shorter than its rows"
    );
    let wt = transposed_weights(state, weight, bias, channels, k);
    // Ranges must start at or after k-1 to find their window in `x`.
    let grain = 32.max(k);
    {
        let window0: &[f32] = state;
        let body = |t0: usize, part: &mut [f32]| {
            let nt = part.len() / channels;
            let (window, ws) = if t0 == 0 {
                (window0, channels)
            } else {
                (&x[(t0 + 1 - k) * x_stride..], x_stride)
            };
            conv_rows_mv(
                &x[t0 * x_stride..],
                x_stride,
                window,
                ws,
                &wt,
                bias,
                part,
                channels,
                k,
                nt,
                silu,
            );
            post(part);
        };
        if n <= grain || pool.n_threads() == 1 {
            body(0, out);
        } else {
            pool.rows_mut(out, channels, grain, body);
        }
    }
    shift_window(
        state,
        |i| &x[i * x_stride..i * x_stride + channels],
        n,
        channels,
        k,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    /// The serial reference without the activation: `out[t, c] = bias[c] + sum_j weight[c, j] · u[t − (k−1) + j, c]` where `u`
    /// is the input preceded by the carried window.
    ///
    /// * `x`: `[n_tokens, channels]` new inputs
    /// * `state`: `[k − 1, channels]`, the previous `k − 1` inputs, oldest first;
    ///   replaced by the last `k − 1` inputs of `state ++ x`
    /// * `weight`: `[channels, k]` (ggml `ssm_conv1d.weight` `{k, channels}`)
    /// * `bias`: `[channels]` or `None`; `out`: `[n_tokens, channels]`
    ///
    /// No activation is applied (call `silu_inplace` on `out`).
    fn conv1d_causal(
        x: &[f32],
        state: &mut [f32],
        weight: &[f32],
        bias: Option<&[f32]>,
        out: &mut [f32],
        channels: usize,
        k: usize,
    ) {
        assert!(k >= 1 && channels > 0);
        assert!(x.len().is_multiple_of(channels) && out.len() == x.len());
        let wt = transposed_weights(state, weight, bias, channels, k);
        let n = x.len() / channels;
        conv_rows_mv(
            x, channels, state, channels, &wt, bias, out, channels, k, n, false,
        );
        shift_window(
            state,
            |i| &x[i * channels..(i + 1) * channels],
            n,
            channels,
            k,
        );
    }

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
                conv1d_causal(
                    &x[t * ch..(t + 1) * ch],
                    &mut st2,
                    &w,
                    Some(&b),
                    &mut o,
                    ch,
                    k,
                );
                for c in 0..ch {
                    assert!((o[c] - want[t * ch + c]).abs() < 1e-5);
                }
            }
            assert_eq!(st, st2);
        }
    }

    #[test]
    fn pool_version_with_silu_and_stride_is_bit_identical() {
        let mut rng = Rng::new(5);
        let pool = crate::ThreadPool::new(2);
        for &(ch, k, n) in &[(5, 4, 200), (8, 1, 100), (6, 3, 33), (7, 4, 20), (4, 4, 2)] {
            let x = rng.vec(n * ch);
            let init = rng.vec((k - 1) * ch);
            let w = rng.vec(ch * k);
            let b = rng.vec(ch);
            let (mut st1, mut st2) = (init.clone(), init.clone());
            let (mut o1, mut o2) = (vec![0f32; n * ch], vec![0f32; n * ch]);
            conv1d_causal(&x, &mut st1, &w, Some(&b), &mut o1, ch, k);
            crate::ops::silu_inplace(&mut o1);
            // The same rows inside wider ones: [3 other | x row | 2 other].
            let stride = ch + 5;
            let mut wide = rng.vec(n * stride);
            for t in 0..n {
                wide[t * stride + 3..t * stride + 3 + ch].copy_from_slice(&x[t * ch..(t + 1) * ch]);
            }
            conv1d_causal_silu_pool(
                &pool,
                &wide[3..],
                stride,
                &mut st2,
                &w,
                Some(&b),
                &mut o2,
                ch,
                k,
            );
            assert_eq!(o1, o2);
            assert_eq!(st1, st2);
        }
    }

    #[test]
    fn batch_equals_each_sequence_alone() {
        let mut rng = Rng::new(9);
        let pool = crate::ThreadPool::new(2);
        let (ch, k, stride) = (6, 4, 9);
        let w = rng.vec(ch * k);
        let b = rng.vec(ch);
        // Sequences of 1, 2 and 3 tokens, rows inside wider ones.
        let toks = [1usize, 2, 1, 3, 1, 1, 2];
        let xs: Vec<Vec<f32>> = toks.iter().map(|&n| rng.vec(n * stride)).collect();
        let init: Vec<Vec<f32>> = toks.iter().map(|_| rng.vec((k - 1) * ch)).collect();
        let mut want_st = init.clone();
        let mut want_out: Vec<Vec<f32>> = toks.iter().map(|&n| vec![0f32; n * ch]).collect();
        for i in 0..toks.len() {
            conv1d_causal_silu_pool(
                &pool,
                &xs[i],
                stride,
                &mut want_st[i],
                &w,
                Some(&b),
                &mut want_out[i],
                ch,
                k,
            );
        }
        let mut st = init.clone();
        let mut out: Vec<Vec<f32>> = toks.iter().map(|&n| vec![0f32; n * ch]).collect();
        let mut seqs: Vec<ConvSeq> = st
            .iter_mut()
            .zip(out.iter_mut())
            .zip(&xs)
            .map(|((state, out), x)| ConvSeq { x, state, out })
            .collect();
        let wt = ConvWeights::new(&w, ch, k);
        conv1d_causal_silu_batch(&pool, &mut seqs, stride, &wt, Some(&b));
        drop(seqs);
        assert_eq!(out, want_out);
        assert_eq!(st, want_st);
    }

    #[test]
    fn pool_version_without_activation_matches_the_reference() {
        let mut rng = Rng::new(7);
        let pool = crate::ThreadPool::new(2);
        for &(ch, k, n) in &[(5, 3, 100), (6, 4, 33), (4, 2, 1), (3, 3, 2)] {
            let x = rng.vec(n * ch);
            let init = rng.vec((k - 1) * ch);
            let w = rng.vec(ch * k);
            let (mut st1, mut st2) = (init.clone(), init.clone());
            let (mut o1, mut o2) = (vec![0f32; n * ch], vec![0f32; n * ch]);
            conv1d_causal(&x, &mut st1, &w, None, &mut o1, ch, k);
            conv1d_causal_pool(&pool, &x, ch, &mut st2, &w, None, &mut o2, ch, k);
            assert_eq!(o1, o2);
            assert_eq!(st1, st2);
            // Some outputs are negative: no activation was applied.
            assert!(o2.iter().any(|&v| v < -0.1));
        }
    }
}
