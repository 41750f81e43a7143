//! The Mamba-2 recurrence (`ssm::m2_head`) over a state stored in bf16:
//! each state row (`d_state` values) is widened to f32, updated with the
//! f32 kernel's arithmetic in the same order, and rounded back to bf16
//! (nearest even) when stored — after every token, so that a token's
//! result does not depend on how many tokens share the call (what
//! batch-invariant decoding and speculative verification need). The
//! output `y` reads the updated row before rounding.
//!
//! Half the state bytes of the f32 kernel are read and written per token:
//! on mamba2-370m the state is ~50 MB, a third of a Q4_K_M decode step's
//! memory traffic in f32.

use super::ssm::Mamba2Dims;
use super::ssm_move;
use super::state_elem::{round_row, widen_row};
use crate::multiversion;
use crate::simd::math::exp_fast;
use half::bf16;

/// One head over `n_tokens` tokens (see `ssm::m2_head`); `row` is a work
/// row of `d_state` f32.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn m2_head_bf16(
    dims: &Mamba2Dims,
    h: usize,
    from: Option<&[bf16]>,
    state: &mut [bf16],
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
    row: &mut [f32],
) {
    let (hn, p_dim, n) = (dims.n_head, dims.head_dim, dims.d_state);
    let g = h / (hn / dims.n_group);
    for t in 0..n_tokens {
        let dth = dt[t * hn + h];
        let da = exp_fast(dth * a[h]);
        let bt = &b[t * ldbc + g * n..t * ldbc + (g + 1) * n];
        let ct = &c[t * ldbc + g * n..t * ldbc + (g + 1) * n];
        let dh = d.map_or(0.0, |d| d[h]);
        let src = if t == 0 { from } else { None };
        // One token moving the state to a new buffer: stream the new rows
        // there (see `ssm_move`).
        let stream = src.is_some() && n_tokens == 1 && ssm_move::usable_bf16(state, n);
        for p in 0..p_dim {
            let xv = x[t * ldx + h * p_dim + p];
            let xdt = xv * dth;
            let s = &mut state[p * n..(p + 1) * n];
            match src {
                Some(f) => widen_row(&f[p * n..(p + 1) * n], row),
                None => widen_row(s, row),
            }
            // update and output in one pass over the row, as m2_head
            let mut acc = [0f32; 16];
            let mut sc = row.chunks_exact_mut(16);
            let (mut bc, mut cc) = (bt.chunks_exact(16), ct.chunks_exact(16));
            for ((s16, b16), c16) in (&mut sc).zip(&mut bc).zip(&mut cc) {
                for i in 0..16 {
                    let v = s16[i] * da + xdt * b16[i];
                    s16[i] = v;
                    acc[i] += v * c16[i];
                }
            }
            let mut tail = 0f32;
            for ((sv, &bv), &cv) in sc
                .into_remainder()
                .iter_mut()
                .zip(bc.remainder())
                .zip(cc.remainder())
            {
                *sv = *sv * da + xdt * bv;
                tail += *sv * cv;
            }
            if stream {
                // SAFETY: `usable_bf16` checked AVX2, the row length and
                // alignment.
                unsafe { ssm_move::stream_row_bf16(s, row) };
            } else {
                round_row(row, s);
            }
            let yv = acc.iter().sum::<f32>() + tail + dh * xv;
            // SAFETY: (t, h, p) belongs to this head only.
            unsafe { *y.add((t * hn + h) * p_dim + p) = yv };
        }
    }
}

/// Heads `h0..h1` (see `ssm::m2_heads`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn m2_heads_bf16(
    dims: &Mamba2Dims,
    h0: usize,
    h1: usize,
    from: Option<&[bf16]>,
    state: *mut bf16,
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
    let hs = dims.head_dim * dims.d_state;
    let mut row = vec![0f32; dims.d_state];
    for h in h0..h1 {
        // SAFETY: head h owns state[h*hs..(h+1)*hs].
        let st = unsafe { std::slice::from_raw_parts_mut(state.add(h * hs), hs) };
        let f = from.map(|f| &f[h * hs..(h + 1) * hs]);
        m2_head_bf16(
            dims, h, f, st, x, ldx, b, c, ldbc, dt, a, d, y, n_tokens, &mut row,
        );
    }
    if from.is_some() {
        ssm_move::fence();
    }
}

multiversion!(pub(crate) fn m2_heads_bf16_mv(
    dims: &Mamba2Dims, h0: usize, h1: usize, from: Option<&[bf16]>, state: *mut bf16, x: &[f32],
    ldx: usize, b: &[f32], c: &[f32], ldbc: usize, dt: &[f32], a: &[f32], d: Option<&[f32]>, y: *mut f32, n_tokens: usize
) => m2_heads_bf16);

#[cfg(test)]
pub(crate) mod tests {
    use crate::ops::ssm::{mamba1_scan, mamba2_scan_from, Mamba2Dims, ScanInputs};
    use crate::ops::state_elem::{round_bf16, widen_bf16};
    use crate::testutil::Rng;
    use crate::ThreadPool;
    use half::bf16;

    /// A bf16 state gives, token after token, exactly what the f32 kernel
    /// gives from the same (widened) state with its result rounded to bf16
    /// after each token: same outputs bit for bit, same rounded state —
    /// whether the tokens come in one call or one per call, in place or
    /// moving off another buffer.
    #[test]
    pub(crate) fn mamba2_bf16_is_the_f32_update_rounded_per_token() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(31);
        for &(hn, p, g, n, t) in &[(4, 3, 2, 5, 4), (6, 16, 3, 32, 3), (4, 8, 2, 64, 1)] {
            let dims = Mamba2Dims {
                n_head: hn,
                head_dim: p,
                n_group: g,
                d_state: n,
            };
            let x = rng.vec(t * hn * p);
            let dt: Vec<f32> = rng.vec(t * hn).iter().map(|v| v.abs() * 0.5).collect();
            let a: Vec<f32> = rng.vec(hn).iter().map(|v| -v.abs() - 0.1).collect();
            let b = rng.vec(t * g * n);
            let c = rng.vec(t * g * n);
            let dd = rng.vec(hn);
            let s0: Vec<bf16> = rng.vec(hn * p * n).iter().map(|&v| round_bf16(v)).collect();
            let one = |ti: usize| {
                ScanInputs::dense(
                    &dims,
                    &x[ti * hn * p..(ti + 1) * hn * p],
                    &b[ti * g * n..(ti + 1) * g * n],
                    &c[ti * g * n..(ti + 1) * g * n],
                    1,
                )
            };
            // Reference: the f32 kernel one token at a time, rounding the
            // state in between.
            let mut sf: Vec<f32> = s0.iter().map(|&v| widen_bf16(v)).collect();
            let mut want_y = Vec::new();
            for ti in 0..t {
                let mut y = vec![0f32; hn * p];
                let dts = &dt[ti * hn..(ti + 1) * hn];
                mamba2_scan_from(
                    &pool,
                    dims,
                    None,
                    &mut sf,
                    one(ti),
                    dts,
                    &a,
                    Some(&dd),
                    &mut y,
                    1,
                );
                sf.iter_mut().for_each(|v| *v = widen_bf16(round_bf16(*v)));
                want_y.extend(y);
            }
            let want_s: Vec<bf16> = sf.iter().map(|&v| round_bf16(v)).collect();
            // All tokens in one call, in place.
            let mut st = s0.clone();
            let mut y = vec![0f32; t * hn * p];
            let all = ScanInputs::dense(&dims, &x, &b, &c, t);
            mamba2_scan_from(
                &pool,
                dims,
                None,
                &mut st,
                all,
                &dt,
                &a,
                Some(&dd),
                &mut y,
                t,
            );
            assert_eq!(st, want_s, "{dims:?}");
            assert_eq!(y, want_y, "{dims:?}");
            // One token per call, the first moving off the start state.
            let mut st2 = vec![bf16::NAN; s0.len()];
            let mut y2 = Vec::new();
            for ti in 0..t {
                let mut yy = vec![0f32; hn * p];
                let dts = &dt[ti * hn..(ti + 1) * hn];
                let from = (ti == 0).then_some(&s0[..]);
                mamba2_scan_from(
                    &pool,
                    dims,
                    from,
                    &mut st2,
                    one(ti),
                    dts,
                    &a,
                    Some(&dd),
                    &mut yy,
                    1,
                );
                y2.extend(yy);
            }
            assert_eq!(st2, want_s, "{dims:?} moving");
            assert_eq!(y2, want_y, "{dims:?} moving");
        }
    }

    /// Mamba-1 with a bf16 state: the f32 scan rounded after every token.
    #[test]
    pub(crate) fn mamba1_bf16_is_the_f32_update_rounded_per_token() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(32);
        for &(di, n, t) in &[(40, 16, 5), (7, 3, 2), (300, 16, 3)] {
            let x = rng.vec(t * di);
            let dt: Vec<f32> = rng.vec(t * di).iter().map(|v| v.abs()).collect();
            let a: Vec<f32> = rng.vec(di * n).iter().map(|v| -v.abs() * 3.0).collect();
            let b = rng.vec(t * n);
            let c = rng.vec(t * n);
            let dd = rng.vec(di);
            let s0: Vec<bf16> = rng.vec(di * n).iter().map(|&v| round_bf16(v)).collect();
            let mut sf: Vec<f32> = s0.iter().map(|&v| widen_bf16(v)).collect();
            let mut want_y = Vec::new();
            for ti in 0..t {
                let r = ti * di..(ti + 1) * di;
                let mut y = vec![0f32; di];
                mamba1_scan(
                    &pool,
                    di,
                    n,
                    &mut sf,
                    &x[r.clone()],
                    &dt[r.clone()],
                    &a,
                    &b[ti * n..(ti + 1) * n],
                    &c[ti * n..(ti + 1) * n],
                    Some(&dd),
                    &mut y,
                    1,
                );
                sf.iter_mut().for_each(|v| *v = widen_bf16(round_bf16(*v)));
                want_y.extend(y);
            }
            let mut st = s0.clone();
            let mut y = vec![0f32; t * di];
            mamba1_scan(
                &pool,
                di,
                n,
                &mut st,
                &x,
                &dt,
                &a,
                &b,
                &c,
                Some(&dd),
                &mut y,
                t,
            );
            let got: Vec<f32> = st.iter().map(|&v| widen_bf16(v)).collect();
            assert_eq!(got, sf);
            assert_eq!(y, want_y);
        }
    }
}
