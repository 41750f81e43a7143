//! Causal depthwise 1-D convolution with a carried window (Mamba conv1d, LFM2 short conv).

use crate::multiversion;
use crate::pool::SendPtr;
use crate::pool::ThreadPool;

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

/// A convolution's weights laid out for the kernels (`[k, channels]`), once
/// at load instead of at every call.
#[derive(Clone, Debug)]
pub struct ConvWeights {
    wt: Vec<f32>,
    channels: usize,
    k: usize,
}

impl ConvWeights {
    /// From `weight` `[channels, k]` (ggml `ssm_conv1d.weight` `{k, channels}`).
    pub fn new(weight: &[f32], channels: usize, k: usize) -> Self {
        assert!(k >= 1 && channels > 0);
        assert_eq!(
            weight.len(),
            channels * k,
            "conv1d: weight is not [channels, k]"
        );
        let mut wt = vec![0f32; k * channels];
        for c in 0..channels {
            for j in 0..k {
                wt[j * channels + c] = weight[c * k + j];
            }
        }
        ConvWeights { wt, channels, k }
    }
}

/// One sequence's part of [`conv1d_causal_silu_batch`]: its input rows
/// (row `t` at `x[t·x_stride ..]`), carried window `[k − 1, channels]` and
/// output `[n_tokens, channels]`.
pub struct ConvSeq<'a> {
    pub x: &'a [f32],
    pub state: &'a mut [f32],
    pub out: &'a mut [f32],
}

/// [`conv1d_causal_silu_pool`] for a few tokens of each of many sequences
/// (a server's decode step): the weights are laid out once for all of
/// them, and the sequences, not the tokens, are spread over `pool`. Each
/// sequence gets the same result as alone, bit for bit.
pub fn conv1d_causal_silu_batch(
    pool: &ThreadPool,
    seqs: &mut [ConvSeq],
    x_stride: usize,
    weights: &ConvWeights,
    bias: Option<&[f32]>,
) {
    let (channels, k, wt) = (weights.channels, weights.k, &weights.wt[..]);
    assert!(x_stride >= channels);
    if let Some(b) = bias {
        assert_eq!(b.len(), channels);
    }
    struct Part<'a> {
        x: &'a [f32],
        state: SendPtr<f32>,
        out: SendPtr<f32>,
        n: usize,
    }
    let parts: Vec<Part> = seqs
        .iter_mut()
        .map(|s| {
            assert_eq!(
                s.state.len(),
                (k - 1) * channels,
                "conv1d: state is not [k-1, channels]"
            );
            assert!(s.out.len().is_multiple_of(channels));
            let n = s.out.len() / channels;
            assert!(
                n == 0 || s.x.len() >= (n - 1) * x_stride + channels,
                "conv1d: input shorter than its rows"
            );
            Part {
                x: s.x,
                state: SendPtr(s.state.as_mut_ptr()),
                out: SendPtr(s.out.as_mut_ptr()),
                n,
            }
        })
        .collect();
    let grain = (parts.len() / (2 * pool.n_threads())).max(1);
    pool.parallel_for(parts.len(), grain, |r, _| {
        for pt in &parts[r] {
            if pt.n == 0 {
                continue;
            }
            // SAFETY: each sequence's window and output belong to it alone,
            // and parallel_for hands every sequence to exactly one call.
            let (state, out) = unsafe {
                (
                    std::slice::from_raw_parts_mut(pt.state.get(), (k - 1) * channels),
                    std::slice::from_raw_parts_mut(pt.out.get(), pt.n * channels),
                )
            };
            conv_rows_mv(
                pt.x, x_stride, state, channels, wt, bias, out, channels, k, pt.n, true,
            );
            shift_window(
                state,
                |i| &pt.x[i * x_stride..i * x_stride + channels],
                pt.n,
                channels,
                k,
            );
        }
    });
}

/// The new carried window: the last `k − 1` rows of `state ++ x`, where
/// `row(i)` is input row `i` of `n`.
fn shift_window<'a>(
    state: &mut [f32],
    row: impl Fn(usize) -> &'a [f32],
    n: usize,
    channels: usize,
    k: usize,
) {
    let w = k - 1;
    let kept = w.saturating_sub(n);
    // Rows of the old window that stay move to the front.
    state.copy_within((w - kept) * channels.., 0);
    for (j, dst) in state[kept * channels..]
        .chunks_exact_mut(channels)
        .enumerate()
    {
        dst.copy_from_slice(row(n - (w - kept) + j));
    }
}

/// Output rows `0..n` of a convolution, each in one pass over its channels
/// (bias, then the taps in order, then SiLU where `silu`: per element the
/// same operations as a row of taps at a time).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn conv_rows(
    x: &[f32],
    xs: usize,
    state: &[f32],
    ss: usize,
    wt: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    channels: usize,
    k: usize,
    n: usize,
    silu: bool,
) {
    match k {
        2 => conv_rows_k::<2>(x, xs, state, ss, wt, bias, out, channels, n, silu),
        3 => conv_rows_k::<3>(x, xs, state, ss, wt, bias, out, channels, n, silu),
        4 => conv_rows_k::<4>(x, xs, state, ss, wt, bias, out, channels, n, silu),
        _ => conv_rows_any(x, xs, state, ss, wt, bias, out, channels, k, n, silu),
    }
}

/// [`conv_rows`] for a window of `K` (the taps unrolled, the channel loop
/// vectorized).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn conv_rows_k<const K: usize>(
    x: &[f32],
    xs: usize,
    state: &[f32],
    ss: usize,
    wt: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    channels: usize,
    n: usize,
    silu: bool,
) {
    let w: [&[f32]; K] = std::array::from_fn(|j| &wt[j * channels..(j + 1) * channels]);
    let zeros = [0f32; 64];
    for t in 0..n {
        // input index t − (K−1) + j, possibly in the window
        let src: [&[f32]; K] = std::array::from_fn(|j| {
            if t + j < K - 1 {
                let i = t + j;
                &state[i * ss..i * ss + channels]
            } else {
                let i = t + j - (K - 1);
                &x[i * xs..i * xs + channels]
            }
        });
        let o = &mut out[t * channels..(t + 1) * channels];
        for c0 in (0..channels).step_by(64) {
            let m = 64.min(channels - c0);
            let b = match bias {
                Some(b) => &b[c0..c0 + m],
                None => &zeros[..m],
            };
            let s: [&[f32]; K] = std::array::from_fn(|j| &src[j][c0..c0 + m]);
            let wj: [&[f32]; K] = std::array::from_fn(|j| &w[j][c0..c0 + m]);
            let o = &mut o[c0..c0 + m];
            for i in 0..m {
                let mut acc = b[i];
                for j in 0..K {
                    acc += s[j][i] * wj[j][i];
                }
                o[i] = acc;
            }
            if silu {
                o.iter_mut().for_each(|v| *v = super::act::silu_fast(*v));
            }
        }
    }
}

/// [`conv_rows`] for any window: a row of taps at a time.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn conv_rows_any(
    x: &[f32],
    xs: usize,
    state: &[f32],
    ss: usize,
    wt: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    channels: usize,
    k: usize,
    n: usize,
    silu: bool,
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
                &state[i * ss..i * ss + channels]
            } else {
                let i = t + j - (k - 1);
                &x[i * xs..i * xs + channels]
            };
            let wj = &wt[j * channels..(j + 1) * channels];
            for ((ov, sv), wv) in o.iter_mut().zip(src).zip(wj) {
                *ov += sv * wv;
            }
        }
        if silu {
            o.iter_mut().for_each(|v| *v = super::act::silu_fast(*v));
        }
    }
}
multiversion!(fn conv_rows_mv(
    x: &[f32], xs: usize, state: &[f32], ss: usize, wt: &[f32], bias: Option<&[f32]>, out: &mut [f32],
    channels: usize, k: usize, n: usize, silu: bool
) => conv_rows);

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
