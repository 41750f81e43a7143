//! Causal depthwise 1-D convolution with a carried window (Mamba conv1d, LFM2 short conv).

mod batch;
mod rows;

use crate::pool::ThreadPool;
pub use batch::{conv1d_causal_batch, ConvSeq, ConvWeights};
pub use rows::ConvAct;
use rows::{conv_rows_mv, shift_window};

/// What [`conv1d_causal_pool`] runs on each range of output rows (whole
/// rows) while they are still in cache.
pub type RowsPost<'a> = &'a (dyn Fn(&mut [f32]) + Sync);

/// `out[t, c] = act(bias[c] + Σ_j weight[c, j] · u[t − (k−1) + j, c])`,
/// where `u` is the input preceded by the carried window (the Mamba conv1d
/// and its SiLU; LFM2's short convolution, with neither bias nor
/// activation):
///
/// * input row `t` is `x[t·x_stride ..][..channels]` (so the channels can
///   be read in place from a wider buffer such as in_proj's output)
/// * `state`: `[k − 1, channels]`, the previous `k − 1` inputs, oldest
///   first; replaced by the last `k − 1` inputs of `state ++ x`
/// * `weights`: laid out at load ([`ConvWeights`]: `channels`, `k`)
/// * `bias`: `[channels]` or `None`; `out`: `[n_tokens, channels]`
/// * `post`: run on each range of output rows (whole rows, `[..,
///   channels]`) while they are still in cache
///
/// Tokens are spread over `pool` (each range reads its window from the
/// inputs before it; the carried window is updated once at the end), with
/// the same results as one thread, bit for bit.
#[allow(clippy::too_many_arguments)]
pub fn conv1d_causal_pool(
    pool: &ThreadPool,
    x: &[f32],
    x_stride: usize,
    state: &mut [f32],
    weights: &ConvWeights,
    bias: Option<&[f32]>,
    out: &mut [f32],
    act: ConvAct,
    post: Option<RowsPost>,
) {
    let (channels, k, wt) = (weights.channels, weights.k, &weights.wt[..]);
    weights.check(state, bias, x_stride);
    assert!(out.len().is_multiple_of(channels));
    let n = out.len() / channels;
    if n == 0 {
        return;
    }
    assert!(
        x.len() >= (n - 1) * x_stride + channels,
        "conv1d: input shorter than its rows"
    );
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
            let silu = act == ConvAct::Silu;
            conv_rows_mv(
                &x[t0 * x_stride..],
                x_stride,
                window,
                ws,
                wt,
                bias,
                part,
                channels,
                k,
                nt,
                silu,
            );
            if let Some(post) = post {
                post(part);
            }
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

    /// A random convolution of `ch` channels, window `k`, over `n` tokens:
    /// inputs `[n, ch]`, a carried window, weights `[ch, k]` and a bias.
    struct Case {
        x: Vec<f32>,
        init: Vec<f32>,
        w: Vec<f32>,
        b: Vec<f32>,
    }

    impl Case {
        fn random(rng: &mut Rng, (ch, k, n): (usize, usize, usize)) -> Self {
            Case {
                x: rng.vec(n * ch),
                init: rng.vec((k - 1) * ch),
                w: rng.vec(ch * k),
                b: rng.vec(ch),
            }
        }
    }

    /// The convolution on one thread (the pool's path for a range starting
    /// at the carried window), rows `ch` apart: its output.
    fn serial(
        x: &[f32],
        state: &mut [f32],
        w: &ConvWeights,
        bias: Option<&[f32]>,
        act: ConvAct,
    ) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        let one = ThreadPool::new(1);
        conv1d_causal_pool(&one, x, w.channels, state, w, bias, &mut out, act, None);
        out
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
        for &shape in &[(5, 4, 7), (3, 4, 2), (8, 1, 3), (4, 2, 1), (6, 3, 17)] {
            let (ch, k, n) = shape;
            let Case { x, init, w, b } = Case::random(&mut rng, shape);
            let want = naive(&x, &init, &w, &b, ch, k);
            let wt = ConvWeights::new(&w, ch, k);
            let mut st = init.clone();
            let out = serial(&x, &mut st, &wt, Some(&b), ConvAct::Identity);
            for (a, e) in out.iter().zip(&want) {
                assert!((a - e).abs() < 1e-5);
            }
            // token-by-token with the carried window gives the same
            let mut st2 = init.clone();
            for t in 0..n {
                let x = &x[t * ch..(t + 1) * ch];
                let o = serial(x, &mut st2, &wt, Some(&b), ConvAct::Identity);
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
        for &shape in &[(5, 4, 200), (8, 1, 100), (6, 3, 33), (7, 4, 20), (4, 4, 2)] {
            let (ch, k, n) = shape;
            let Case { x, init, w, b } = Case::random(&mut rng, shape);
            let wt = ConvWeights::new(&w, ch, k);
            let (mut st1, mut st2) = (init.clone(), init.clone());
            let mut o1 = serial(&x, &mut st1, &wt, Some(&b), ConvAct::Identity);
            crate::ops::silu_inplace(&mut o1);
            // The same rows inside wider ones: [3 other | x row | 2 other].
            let stride = ch + 5;
            let mut wide = rng.vec(n * stride);
            for t in 0..n {
                wide[t * stride + 3..t * stride + 3 + ch].copy_from_slice(&x[t * ch..(t + 1) * ch]);
            }
            let mut o2 = vec![0f32; n * ch];
            let silu = ConvAct::Silu;
            let b = Some(&b[..]);
            conv1d_causal_pool(
                &pool,
                &wide[3..],
                stride,
                &mut st2,
                &wt,
                b,
                &mut o2,
                silu,
                None,
            );
            assert_eq!(o1, o2);
            assert_eq!(st1, st2);
        }
    }

    /// `post` sees every output row once, after the convolution.
    #[test]
    fn post_runs_on_every_row_range() {
        let mut rng = Rng::new(8);
        let pool = crate::ThreadPool::new(2);
        let (ch, k, n) = (6, 4, 100);
        let Case { x, init, w, .. } = Case::random(&mut rng, (ch, k, n));
        let wt = ConvWeights::new(&w, ch, k);
        let mut st1 = init.clone();
        let want: Vec<f32> = serial(&x, &mut st1, &wt, None, ConvAct::Silu)
            .iter()
            .map(|v| 2.0 * v)
            .collect();
        let double = |part: &mut [f32]| {
            assert!(part.len().is_multiple_of(ch));
            part.iter_mut().for_each(|v| *v *= 2.0);
        };
        let mut st2 = init.clone();
        let mut out = vec![0f32; n * ch];
        let silu = ConvAct::Silu;
        conv1d_causal_pool(
            &pool,
            &x,
            ch,
            &mut st2,
            &wt,
            None,
            &mut out,
            silu,
            Some(&double),
        );
        assert_eq!(out, want);
        assert_eq!(st1, st2);
    }

    #[test]
    fn batch_equals_each_sequence_alone() {
        let mut rng = Rng::new(9);
        let pool = crate::ThreadPool::new(2);
        let (ch, k, stride) = (6, 4, 9);
        let w = rng.vec(ch * k);
        let b = rng.vec(ch);
        let wt = ConvWeights::new(&w, ch, k);
        // Sequences of 1, 2 and 3 tokens, rows inside wider ones.
        let toks = [1usize, 2, 1, 3, 1, 1, 2];
        let xs: Vec<Vec<f32>> = toks.iter().map(|&n| rng.vec(n * stride)).collect();
        let init: Vec<Vec<f32>> = toks.iter().map(|_| rng.vec((k - 1) * ch)).collect();
        for act in [ConvAct::Silu, ConvAct::Identity] {
            let mut want_st = init.clone();
            let mut want_out: Vec<Vec<f32>> = toks.iter().map(|&n| vec![0f32; n * ch]).collect();
            for i in 0..toks.len() {
                let (st, out) = (&mut want_st[i], &mut want_out[i]);
                conv1d_causal_pool(&pool, &xs[i], stride, st, &wt, Some(&b), out, act, None);
            }
            let mut st = init.clone();
            let mut out: Vec<Vec<f32>> = toks.iter().map(|&n| vec![0f32; n * ch]).collect();
            let mut seqs: Vec<ConvSeq> = st
                .iter_mut()
                .zip(out.iter_mut())
                .zip(&xs)
                .map(|((state, out), x)| ConvSeq { x, state, out })
                .collect();
            conv1d_causal_batch(&pool, &mut seqs, stride, &wt, Some(&b), act);
            drop(seqs);
            assert_eq!(out, want_out, "{act:?}");
            assert_eq!(st, want_st, "{act:?}");
        }
    }

    #[test]
    fn pool_version_without_activation_matches_the_reference() {
        let mut rng = Rng::new(7);
        let pool = crate::ThreadPool::new(2);
        for &(ch, k, n) in &[(5, 3, 100), (6, 4, 33), (4, 2, 1), (3, 3, 2)] {
            let x = rng.vec(n * ch);
            let init = rng.vec((k - 1) * ch);
            let w = rng.vec(ch * k);
            let wt = ConvWeights::new(&w, ch, k);
            let (mut st1, mut st2) = (init.clone(), init.clone());
            let o1 = serial(&x, &mut st1, &wt, None, ConvAct::Identity);
            let mut o2 = vec![0f32; n * ch];
            let id = ConvAct::Identity;
            conv1d_causal_pool(&pool, &x, ch, &mut st2, &wt, None, &mut o2, id, None);
            assert_eq!(o1, o2);
            assert_eq!(st1, st2);
            // Some outputs are negative: no activation was applied.
            assert!(o2.iter().any(|&v| v < -0.1));
        }
    }
}
