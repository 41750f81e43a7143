//! The Mamba-2 recurrence of many sequences in one pass: a server's decode
//! step holds one token (or a few) of each of N sequences, and each
//! sequence's update alone is too small to be worth a thread-pool call
//! (one head is 32 KB of state at P = 64, N = 128). Here the work items are
//! (sequence, head) pairs, handed out over the pool's threads in one call,
//! so N updates cost one dispatch and both cores share them evenly.
//!
//! Each head runs exactly the code of [`super::scan::mamba2_scan_from`]
//! (`m2_heads`), so the results are bit for bit those of updating each
//! sequence alone.

use super::dims::{Mamba2Dims, ScanInputs};
use super::scan::ScanState;
use crate::pool::SendPtr;
use crate::pool::ThreadPool;

/// One sequence's part of [`mamba2_scan_batch`]: its state `[H, P, N]`
/// (started from `from` when the state moves to a new buffer, as in
/// [`super::scan::mamba2_scan_from`]), inputs, activated `dt` `[n_tokens,
/// H]` and output `y` `[n_tokens, H, P]`. The state is f32 or bf16 (see
/// [`ScanState`]).
pub struct Mamba2Seq<'a, S: ScanState = f32> {
    pub from: Option<&'a [S]>,
    pub state: &'a mut [S],
    pub inputs: ScanInputs<'a>,
    pub dt: &'a [f32],
    pub y: &'a mut [f32],
    pub n_tokens: usize,
}

/// What a pool job needs of one sequence (raw pointers for the parts it
/// writes: each (sequence, head) item writes only its own head's state and
/// output lanes).
struct Part<'a, S> {
    from: Option<&'a [S]>,
    state: SendPtr<S>,
    inputs: ScanInputs<'a>,
    dt: &'a [f32],
    y: SendPtr<f32>,
    n_tokens: usize,
}

/// [`super::scan::mamba2_scan_from`] for every sequence of `seqs` at once
/// (same `a`, `d` and sizes: one layer), with the (sequence, head) pairs
/// spread over `pool` in a single parallel call.
pub fn mamba2_scan_batch<S: ScanState>(
    pool: &ThreadPool,
    dims: Mamba2Dims,
    seqs: &mut [Mamba2Seq<S>],
    a: &[f32],
    d: Option<&[f32]>,
) {
    let (hn, p) = (dims.n_head, dims.head_dim);
    dims.check_heads(a, d);
    let parts: Vec<Part<S>> = seqs
        .iter_mut()
        .map(|s| {
            dims.check_state(s.state.len(), s.from.map(|f| f.len()));
            s.inputs.check(&dims, s.n_tokens);
            assert_eq!(s.y.len(), s.n_tokens * hn * p);
            assert_eq!(s.dt.len(), s.n_tokens * hn);
            Part {
                from: s.from,
                state: SendPtr(s.state.as_mut_ptr()),
                inputs: s.inputs,
                dt: s.dt,
                y: SendPtr(s.y.as_mut_ptr()),
                n_tokens: s.n_tokens,
            }
        })
        .collect();
    let items = parts.len() * hn;
    // About four chunks per thread, as a single sequence's scan has, of at
    // most one sequence's worth of heads; a chunk that spans two sequences
    // is one call per sequence.
    let grain = (items / (pool.n_threads() * 4)).clamp(1, hn);
    pool.parallel_for(items, grain, |r, _| {
        let mut i = r.start;
        while i < r.end {
            let (s, h0) = (i / hn, i % hn);
            let h1 = (h0 + (r.end - i)).min(hn);
            let pt = &parts[s];
            super::scan::m2_heads_mv(
                &dims,
                h0,
                h1,
                pt.from,
                pt.state.get(),
                pt.inputs.x,
                pt.inputs.ldx,
                pt.inputs.b,
                pt.inputs.c,
                pt.inputs.ldbc,
                pt.dt,
                a,
                d,
                pt.y.get(),
                pt.n_tokens,
            );
            i += h1 - h0;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::ssm::mamba2_scan_from;
    use crate::testutil::Rng;

    /// N sequences (some moving off another buffer, some with 2 tokens)
    /// updated together give each sequence's own scan, bit for bit.
    #[test]
    fn batch_equals_each_sequence_alone() {
        let mut rng = Rng::new(21);
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for &(hn, p, g, n) in &[(4, 8, 2, 32), (6, 3, 3, 5), (2, 4, 1, 128)] {
                let dims = Mamba2Dims {
                    n_head: hn,
                    head_dim: p,
                    n_group: g,
                    d_state: n,
                };
                let ld = hn * p + 2 * g * n;
                let n_seq = 7;
                let toks: Vec<usize> = (0..n_seq).map(|s| 1 + s % 3 / 2).collect();
                let rows: Vec<Vec<f32>> = toks.iter().map(|&t| rng.vec(t * ld)).collect();
                let dts: Vec<Vec<f32>> = toks
                    .iter()
                    .map(|&t| rng.vec(t * hn).iter().map(|v| v.abs() * 0.5).collect())
                    .collect();
                let a: Vec<f32> = rng.vec(hn).iter().map(|v| -v.abs() - 0.1).collect();
                let dd = rng.vec(hn);
                let s0: Vec<Vec<f32>> = (0..n_seq).map(|_| rng.vec(hn * p * n)).collect();
                fn rows_of(r: &[f32], wx: usize, wbc: usize) -> ScanInputs<'_> {
                    let ld = wx + 2 * wbc;
                    ScanInputs {
                        x: r,
                        ldx: ld,
                        b: &r[wx..],
                        c: &r[wx + wbc..],
                        ldbc: ld,
                    }
                }
                let inputs = |r| rows_of(r, hn * p, g * n);
                // Alone: odd sequences move off their source buffer.
                let mut want_s = Vec::new();
                let mut want_y = Vec::new();
                for s in 0..n_seq {
                    let mut st = if s % 2 == 1 {
                        vec![f32::NAN; s0[s].len()]
                    } else {
                        s0[s].clone()
                    };
                    let from = (s % 2 == 1).then_some(&s0[s][..]);
                    let mut y = vec![0f32; toks[s] * hn * p];
                    mamba2_scan_from(
                        &pool,
                        dims,
                        from,
                        &mut st,
                        inputs(&rows[s]),
                        &dts[s],
                        &a,
                        Some(&dd),
                        &mut y,
                        toks[s],
                    );
                    want_s.push(st);
                    want_y.push(y);
                }
                let mut got_s: Vec<Vec<f32>> = (0..n_seq)
                    .map(|s| {
                        if s % 2 == 1 {
                            vec![f32::NAN; s0[s].len()]
                        } else {
                            s0[s].clone()
                        }
                    })
                    .collect();
                let mut got_y: Vec<Vec<f32>> =
                    toks.iter().map(|&t| vec![0f32; t * hn * p]).collect();
                let mut seqs: Vec<Mamba2Seq> = got_s
                    .iter_mut()
                    .zip(got_y.iter_mut())
                    .enumerate()
                    .map(|(s, (st, y))| Mamba2Seq {
                        from: (s % 2 == 1).then_some(&s0[s][..]),
                        state: st,
                        inputs: inputs(&rows[s]),
                        dt: &dts[s],
                        y,
                        n_tokens: toks[s],
                    })
                    .collect();
                mamba2_scan_batch(&pool, dims, &mut seqs, &a, Some(&dd));
                drop(seqs);
                assert_eq!(got_s, want_s, "states, {threads} threads, {dims:?}");
                assert_eq!(got_y, want_y, "outputs, {threads} threads, {dims:?}");
            }
        }
    }
}
