//! The convolution's output rows, one pass over the channels per row, and
//! the carried window's update.

use crate::multiversion;

/// What follows a convolution's sum, per element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvAct {
    /// Nothing (LFM2's short convolution).
    Identity,
    /// SiLU (Mamba's conv1d, the delta-rule mixers' convolutions).
    Silu,
}

/// The new carried window: the last `k − 1` rows of `state ++ x`, where
/// `row(i)` is input row `i` of `n`.
pub(super) fn shift_window<'a>(
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
                o.iter_mut()
                    .for_each(|v| *v = crate::ops::act::silu_fast(*v));
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
            o.iter_mut()
                .for_each(|v| *v = crate::ops::act::silu_fast(*v));
        }
    }
}
multiversion!(pub(super) fn conv_rows_mv(
    x: &[f32], xs: usize, state: &[f32], ss: usize, wt: &[f32], bias: Option<&[f32]>, out: &mut [f32],
    channels: usize, k: usize, n: usize, silu: bool
) => conv_rows);
