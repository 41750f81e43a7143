//! The convolution of a few tokens of each of many sequences (a server's
//! decode step), the weights laid out once at load.

use super::rows::{conv_rows_mv, shift_window, ConvAct};
use crate::pool::SendPtr;
use crate::pool::ThreadPool;

/// A convolution's weights laid out for the kernels (`[k, channels]`), once
/// at load instead of at every call.
#[derive(Clone, Debug)]
pub struct ConvWeights {
    pub(super) wt: Vec<f32>,
    pub(super) channels: usize,
    pub(super) k: usize,
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

    /// Checks a call's carried window (`[k − 1, channels]`), bias
    /// (`[channels]`) and input row stride against these weights.
    pub(super) fn check(&self, state: &[f32], bias: Option<&[f32]>, x_stride: usize) {
        assert_eq!(
            state.len(),
            (self.k - 1) * self.channels,
            "conv1d: state is not [k-1, channels]"
        );
        if let Some(b) = bias {
            assert_eq!(b.len(), self.channels, "conv1d: bias is not [channels]");
        }
        assert!(
            x_stride >= self.channels,
            "conv1d: input rows narrower than the channels"
        );
    }
}

/// One sequence's part of [`conv1d_causal_batch`]: its input rows
/// (row `t` at `x[t·x_stride ..]`), carried window `[k − 1, channels]` and
/// output `[n_tokens, channels]`.
pub struct ConvSeq<'a> {
    pub x: &'a [f32],
    pub state: &'a mut [f32],
    pub out: &'a mut [f32],
}

/// [`super::conv1d_causal_pool`] for a few tokens of each of many sequences
/// (a server's decode step): the weights are laid out once for all of
/// them, and the sequences, not the tokens, are spread over `pool`. Each
/// sequence gets the same result as alone, bit for bit.
pub fn conv1d_causal_batch(
    pool: &ThreadPool,
    seqs: &mut [ConvSeq],
    x_stride: usize,
    weights: &ConvWeights,
    bias: Option<&[f32]>,
    act: ConvAct,
) {
    let (channels, k, wt) = (weights.channels, weights.k, &weights.wt[..]);
    struct Part<'a> {
        x: &'a [f32],
        state: SendPtr<f32>,
        out: SendPtr<f32>,
        n: usize,
    }
    let parts: Vec<Part> = seqs
        .iter_mut()
        .map(|s| {
            weights.check(s.state, bias, x_stride);
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
    let silu = act == ConvAct::Silu;
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
                pt.x, x_stride, state, channels, wt, bias, out, channels, k, pt.n, silu,
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
