//! Kimi Delta Attention (KDA; Kimi Team, "Kimi Linear", 2025): the gated
//! delta rule of [`super::gated`] with a *per-channel* decay. One
//! state `S` (`[d_k, d_v]`) per head; per token, with `g` a `d_k`-vector of
//! log decays (≤ 0):
//!
//! ```text
//! S ← Diag(exp(g))·S;   δ = β·(v − Sᵀk);   S ← S + k δᵀ;   o = Sᵀq
//! ```
//!
//! q and k already L2-normalised (q also scaled by 1/√d_k), β = sigmoid(b)
//! one scalar per head and token. Key channel r decays row r of the state.
//! [`kda_scan`] runs the recurrence token by token (decode);
//! `delta_chunked` (see `kda_chunk.rs`) gives the same result with matrix
//! products per chunk (prefill).
//!
//! Per token and head the kernel makes two passes over the state rows: a
//! read-only one for `kv = Sᵀ(k ⊙ e^g)` and one that writes `e^g_r·S_r +
//! k_r δ` and accumulates `o`. A bf16 state (`--state-type bf16`) is
//! widened a row at a time and rounded once per token when stored.

use super::dims::{scan_heads, DeltaInputs, Heads, Seq};
use crate::multiversion;
use crate::ops::state_elem::{StateElem, StateMut};
use crate::ops::state_rows::prefetch_rows_ahead;
use crate::pool::{SendPtr, ThreadPool};

/// Heads and their widths (as many key heads as value heads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdaDims {
    pub n_head: usize,
    pub d_k: usize,
    pub d_v: usize,
}

impl KdaDims {
    /// Elements of the state of all heads: `[H, d_k, d_v]`.
    pub fn state_len(&self) -> usize {
        self.n_head * self.d_k * self.d_v
    }

    pub(crate) fn check(&self) {
        assert!(self.n_head > 0 && self.d_k > 0 && self.d_v > 0);
    }
}

impl Heads for KdaDims {
    const FAMILY: &'static str = "kda";
    const SHAPES: (&'static str, &'static str) = ("H", "H, d_k");
    #[inline(always)]
    fn shape(&self) -> (usize, usize, usize, usize) {
        (self.n_head, self.n_head, self.d_k, self.d_v)
    }
    #[inline(always)]
    fn decays(&self) -> usize {
        self.d_k
    }
}

/// The per-token inputs, q, k and v read in place from wider rows: token
/// `i`'s q and k (`[H, d_k]` each) start at `q[i·ld_qk]`, `k[i·ld_qk]`, its
/// v (`[H, d_v]`) at `v[i·ld_v]`; `g`: `[n_tokens, H, d_k]` log decays,
/// `beta`: `[n_tokens, H]` (the gated delta rule's inputs, with a decay
/// per key channel).
pub type KdaInputs<'a> = DeltaInputs<'a>;

/// The state types the recurrence takes (f32, bf16): every
/// [`StateElem`], a state row read and written in f32 by
/// [`StateElem::read_row`], [`StateElem::update_row`].
pub trait KdaState: StateElem {}

impl<S: StateElem> KdaState for S {}

/// One thread's buffers.
struct Work {
    /// e^g of the token, `[d_k]`.
    e: Vec<f32>,
    /// k ⊙ e^g, `[d_k]`.
    ke: Vec<f32>,
    /// Sᵀ(k ⊙ e^g), then δ, `[d_v]`.
    kv: Vec<f32>,
    /// A state row widened (bf16), `[d_v]`.
    row: Vec<f32>,
}

impl Work {
    fn new(d: &KdaDims) -> Self {
        Work {
            e: vec![0.0; d.d_k],
            ke: vec![0.0; d.d_k],
            kv: vec![0.0; d.d_v],
            row: vec![0.0; d.d_v],
        }
    }
}

#[inline(always)]
fn head_scan<S: StateElem>(
    d: &KdaDims,
    h: usize,
    s: &mut [S],
    inp: &KdaInputs,
    out: SendPtr<f32>,
    w: &mut Work,
    n: usize,
) {
    let (dv, nh) = (d.d_v, d.n_head);
    debug_assert_eq!(s.len(), d.d_k * dv);
    for i in 0..n {
        let (q, k, v, g) = (
            inp.q_at(d, i, h),
            inp.k_at(d, i, h),
            inp.v_at(d, i, h),
            inp.g_at(d, i, h),
        );
        let beta = inp.beta[i * nh + h];
        for (((e, ke), &gr), &kr) in w.e.iter_mut().zip(w.ke.iter_mut()).zip(g).zip(k) {
            *e = gr.exp();
            *ke = kr * *e;
        }
        // kv = (Diag(e^g)·S)ᵀk: a read-only pass over S.
        w.kv.fill(0.0);
        for (r, &kr) in s.chunks_exact(dv).zip(&w.ke) {
            if i == 0 && S::TYPE == f32::TYPE {
                // the state comes from memory on the first token
                prefetch_rows_ahead(r.as_ptr() as *const f32, dv);
            }
            let row = S::read_row(r, &mut w.row);
            for (a, &x) in w.kv.iter_mut().zip(row) {
                *a += kr * x;
            }
        }
        // δ = β(v − kv), kept in kv.
        for (a, &vv) in w.kv.iter_mut().zip(v) {
            *a = beta * (vv - *a);
        }
        // SAFETY: token i, head h: lanes no other head writes.
        let o = unsafe { std::slice::from_raw_parts_mut(out.get().add((i * nh + h) * dv), dv) };
        o.fill(0.0);
        // S ← Diag(e^g)·S + k δᵀ and o = Sᵀq in a second pass.
        let kv = &w.kv;
        for (((r, &kr), &qr), &er) in s.chunks_exact_mut(dv).zip(k).zip(q).zip(&w.e) {
            S::update_row(r, &mut w.row, |x| {
                for ((x, &dl), ov) in x.iter_mut().zip(kv.iter()).zip(o.iter_mut()) {
                    *x = er * *x + kr * dl;
                    *ov += qr * *x;
                }
            });
        }
    }
}
multiversion!(fn head_scan_mv<S: StateElem>(
    d: &KdaDims, h: usize, s: &mut [S], inp: &KdaInputs, out: SendPtr<f32>, w: &mut Work, n: usize
) => head_scan);

/// The recurrence over `n_tokens` tokens for every head (heads spread over
/// `pool`), from and into `state` (`[H, d_k, d_v]`, f32 or bf16); `out`:
/// `[n_tokens, H, d_v]`.
pub fn kda_scan<S: KdaState>(
    pool: &ThreadPool,
    dims: KdaDims,
    state: &mut [S],
    inp: KdaInputs,
    out: &mut [f32],
    n_tokens: usize,
) {
    let mut seqs = [KdaSeq {
        state,
        from: None,
        inputs: inp,
        out,
        n_tokens,
    }];
    kda_scan_batch(pool, dims, &mut seqs);
}

/// [`kda_scan`] on a state of either stored type.
pub fn kda_scan_state(
    pool: &ThreadPool,
    dims: KdaDims,
    state: StateMut,
    inp: KdaInputs,
    out: &mut [f32],
    n_tokens: usize,
) {
    match state {
        StateMut::F32(s) => kda_scan(pool, dims, s, inp, out, n_tokens),
        StateMut::Bf16(s) => kda_scan(pool, dims, s, inp, out, n_tokens),
    }
}

/// One sequence's part of [`kda_scan_batch`]: its state `[H, d_k, d_v]`,
/// inputs and output `[n_tokens, H, d_v]`, and where the state moves off a
/// checkpoint (see [`Seq`]).
pub type KdaSeq<'a, S = f32> = Seq<'a, S>;

/// [`kda_scan`] for every sequence of `seqs` at once (a server's decode
/// step, one layer): the (sequence, head) pairs are spread over `pool` in
/// one call, each running the single-sequence code (the same result, bit
/// for bit).
pub fn kda_scan_batch<S: KdaState>(pool: &ThreadPool, dims: KdaDims, seqs: &mut [KdaSeq<S>]) {
    dims.check();
    let hs = dims.d_k * dims.d_v;
    scan_heads(
        pool,
        &dims,
        seqs,
        || Work::new(&dims),
        |pt, h, s, w| {
            if let Some(f) = pt.from {
                s.copy_from_slice(&f[h * hs..(h + 1) * hs]);
            }
            if pt.n_tokens > 0 {
                head_scan_mv::<S>(&dims, h, s, &pt.inputs, pt.out, w, pt.n_tokens);
            }
            false
        },
    );
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ops::delta::gated::tests::{check_batch, check_bf16, check_scan, Case, Family};
    use crate::ops::delta::DeltaState;
    use crate::testutil::Rng;

    /// The textbook recurrence in f64 (decay first, as transformers' torch
    /// path orders it) over the case's `n` tokens: the state and the
    /// outputs.
    pub fn naive(d: &KdaDims, c: &Case, n: usize) -> (Vec<f64>, Vec<f64>) {
        let (nh, dk, dv) = (d.n_head, d.d_k, d.d_v);
        let (q, k, v, g, beta) = (&c.q, &c.k, &c.v, &c.g, &c.beta);
        let mut s: Vec<f64> = c.s0.iter().map(|&x| x as f64).collect();
        let mut out = vec![0f64; n * nh * dv];
        for i in 0..n {
            for h in 0..nh {
                let sh = &mut s[h * dk * dv..(h + 1) * dk * dv];
                let at = (i * nh + h) * dk;
                for r in 0..dk {
                    let e = (g[at + r] as f64).exp();
                    sh[r * dv..(r + 1) * dv].iter_mut().for_each(|x| *x *= e);
                }
                for c in 0..dv {
                    let kv: f64 = (0..dk).map(|r| sh[r * dv + c] * k[at + r] as f64).sum();
                    let delta = beta[i * nh + h] as f64 * (v[(i * nh + h) * dv + c] as f64 - kv);
                    for r in 0..dk {
                        sh[r * dv + c] += k[at + r] as f64 * delta;
                    }
                }
                for c in 0..dv {
                    out[(i * nh + h) * dv + c] =
                        (0..dk).map(|r| sh[r * dv + c] * q[at + r] as f64).sum();
                }
            }
        }
        (s, out)
    }

    /// Random normalised q, k, v, per-channel g in (−3, 0) (some channels
    /// forget within a token, some remember for ~100), β in (0, 1).
    pub fn random_inputs(rng: &mut Rng, d: &KdaDims, n: usize) -> Case {
        Case::random(rng, d, n, |i, x| match i % 3 {
            0 => -(x.abs() * 3.0),
            _ => -(x.abs() * 0.02),
        })
    }

    impl Family for KdaDims {
        fn scan<S: DeltaState>(
            &self,
            pool: &ThreadPool,
            state: &mut [S],
            inp: KdaInputs,
            out: &mut [f32],
            n: usize,
        ) {
            kda_scan(pool, *self, state, inp, out, n)
        }
        fn scan_batch<S: DeltaState>(&self, pool: &ThreadPool, seqs: &mut [Seq<S>]) {
            kda_scan_batch(pool, *self, seqs)
        }
        fn naive(&self, c: &Case, n: usize) -> (Vec<f64>, Vec<f64>) {
            naive(self, c, n)
        }
    }

    #[test]
    pub fn scan_matches_naive_and_steps() {
        let mut rng = Rng::new(63);
        let pool = ThreadPool::new(2);
        for &(nh, dk, dv, n) in &[(2, 8, 8, 9), (3, 5, 7, 4), (1, 16, 4, 1), (4, 16, 16, 20)] {
            let d = KdaDims {
                n_head: nh,
                d_k: dk,
                d_v: dv,
            };
            let c = random_inputs(&mut rng, &d, n);
            check_scan(&pool, d, &c, n);
        }
    }

    /// Several sequences in one call, odd ones moving off a checkpoint:
    /// each gets the bits it gets alone.
    #[test]
    fn batch_equals_each_sequence_alone() {
        let mut rng = Rng::new(64);
        let d = KdaDims {
            n_head: 3,
            d_k: 8,
            d_v: 12,
        };
        let toks = [1usize, 2, 1, 3];
        let cases: Vec<Case> = toks
            .iter()
            .map(|&n| random_inputs(&mut rng, &d, n))
            .collect();
        check_batch(&ThreadPool::new(2), d, &cases, &toks);
    }

    /// A bf16 state gives exactly the f32 recurrence with the state rounded
    /// to bf16 after every token.
    #[test]
    pub fn bf16_is_the_f32_update_rounded_per_token() {
        let mut rng = Rng::new(65);
        let d = KdaDims {
            n_head: 2,
            d_k: 8,
            d_v: 16,
        };
        let n = 5;
        let c = random_inputs(&mut rng, &d, n);
        check_bf16(&ThreadPool::new(2), d, &c, n);
    }
}
