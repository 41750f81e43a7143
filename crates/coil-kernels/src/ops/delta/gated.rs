//! The gated delta rule (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024),
//! one state `S` (`[d_k, d_v]`, f32) per value head:
//!
//! ```text
//! S ← exp(g)·S;   δ = β·(v − Sᵀk);   S ← S + k δᵀ;   o = Sᵀq
//! ```
//!
//! with q, k already L2-normalised (q also scaled by 1/√d_k, see
//! [`l2_normalize`]), β = sigmoid(b) and g ≤ 0 one scalar per value head and
//! token. Value head j reads key head [`GatedDeltaDims::key_head`]`(j)`.
//! [`gated_delta_scan`] runs the recurrence token by token (decode);
//! `delta_chunked` (see `chunk.rs`) gives the same result
//! with matrix products per chunk (prefill).

use super::dims::{scan_heads, DeltaInputs, GatedDeltaDims, Seq};
use crate::multiversion;
use crate::ops::state_elem::{StateElem, StateMut};
use crate::ops::state_rows::{can_stream, prefetch_rows_ahead};
use crate::pool::{SendPtr, ThreadPool};
use half::bf16;

/// `x ← scale · x / sqrt(Σx² + eps)` over each `dim`-wide row of `x`
/// (transformers' / fla's `l2norm` with eps 1e-6, then the query scale).
/// The sum of squares is taken in 16 independent lanes, then the lanes in
/// order: vectorized, and the same at every SIMD level.
pub fn l2_normalize(x: &mut [f32], dim: usize, eps: f32, scale: f32) {
    assert!(dim > 0 && x.len().is_multiple_of(dim));
    l2_rows_mv(x, dim, eps, scale);
}

multiversion!(fn l2_rows_mv(x: &mut [f32], dim: usize, eps: f32, scale: f32) => l2_rows);

#[inline(always)]
fn l2_rows(x: &mut [f32], dim: usize, eps: f32, scale: f32) {
    for r in x.chunks_exact_mut(dim) {
        let mut lanes = [0f32; 16];
        let c = r.chunks_exact(16);
        let tail: f32 = c.remainder().iter().map(|v| v * v).sum();
        for blk in c {
            for (a, v) in lanes.iter_mut().zip(blk) {
                *a += v * v;
            }
        }
        let ss = lanes.iter().sum::<f32>() + tail;
        let s = scale / (ss + eps).sqrt();
        r.iter_mut().for_each(|v| *v *= s);
    }
}

/// The recurrence over `n_tokens` tokens for every value head (heads spread
/// over `pool`), from and into `state` (`[Hv, d_k, d_v]`, f32 or bf16: see
/// [`DeltaState`]); `out`: `[n_tokens, Hv, d_v]`.
pub fn gated_delta_scan<S: DeltaState>(
    pool: &ThreadPool,
    dims: GatedDeltaDims,
    state: &mut [S],
    inp: DeltaInputs,
    out: &mut [f32],
    n_tokens: usize,
) {
    let mut seqs = [DeltaSeq {
        state,
        from: None,
        inputs: inp,
        out,
        n_tokens,
    }];
    gated_delta_scan_batch(pool, dims, &mut seqs);
}

/// [`gated_delta_scan`] on a state of either stored type.
pub fn gated_delta_scan_state(
    pool: &ThreadPool,
    dims: GatedDeltaDims,
    state: StateMut,
    inp: DeltaInputs,
    out: &mut [f32],
    n_tokens: usize,
) {
    match state {
        StateMut::F32(s) => gated_delta_scan(pool, dims, s, inp, out, n_tokens),
        StateMut::Bf16(s) => gated_delta_scan(pool, dims, s, inp, out, n_tokens),
    }
}

/// One sequence's part of [`gated_delta_scan_batch`]: its state `[Hv,
/// d_k, d_v]` (f32 or bf16), inputs and output `[n_tokens, Hv, d_v]`, and
/// where the state moves off a checkpoint (see [`Seq`]).
pub type DeltaSeq<'a, S = f32> = Seq<'a, S>;

/// [`gated_delta_scan`] for every sequence of `seqs` at once (a server's
/// decode step, one layer): the (sequence, value head) pairs are spread
/// over `pool` in one call, each running the code of the single-sequence
/// scan (the same result, bit for bit).
pub fn gated_delta_scan_batch<S: DeltaState>(
    pool: &ThreadPool,
    dims: GatedDeltaDims,
    seqs: &mut [DeltaSeq<S>],
) {
    dims.check();
    let hs = dims.d_k * dims.d_v;
    let work = || vec![0f32; dims.d_v];
    scan_heads(pool, &dims, seqs, work, |pt, j, s, kv| {
        if let Some(f) = pt.from {
            let src = &f[j * hs..(j + 1) * hs];
            // One token (a decode step): read the old head, stream the
            // new one (`moving.rs`).
            // SAFETY: head j's output row belongs to this call alone.
            if pt.n_tokens == 1
                && unsafe { S::move_step(&dims, j, src, s, &pt.inputs, pt.out.get(), kv) }
            {
                return true;
            }
            s.copy_from_slice(src);
        }
        if pt.n_tokens > 0 {
            head_scan_mv::<S>(&dims, j, s, &pt.inputs, pt.out, kv, pt.n_tokens);
        }
        false
    });
}

/// The recurrence on value head `j`'s state `s` (`[d_k, d_v]`) over the
/// `n` tokens of `inp`: two passes over the state rows per token. A bf16
/// state is computed in f32, each row widened as it is read and, in the
/// second pass, rounded back to bf16 (nearest even) as it is written:
/// once per token, so a token's result does not depend on how many tokens
/// share the call; the same arithmetic in the same order as on an f32
/// state, half the state bytes to and from memory.
#[inline(always)]
fn head_scan<S: StateElem>(
    d: &GatedDeltaDims,
    j: usize,
    s: &mut [S],
    inp: &DeltaInputs,
    out: SendPtr<f32>,
    kv: &mut [f32],
    n: usize,
) {
    let (dk, dv, hv) = (d.d_k, d.d_v, d.n_v_head);
    let kh = d.key_head(j);
    let f32_state = S::TYPE == f32::TYPE;
    // a bf16 row widened (an f32 row is used as it is)
    let mut row = vec![0f32; if f32_state { 0 } else { dv }];
    for i in 0..n {
        let (q, k, v) = (inp.q_at(d, i, kh), inp.k_at(d, i, kh), inp.v_at(d, i, j));
        let decay = inp.g[i * hv + j].exp();
        let beta = inp.beta[i * hv + j];
        // kv = (exp(g)·S)ᵀk = exp(g)·(Sᵀk): a read-only pass over S.
        kv.fill(0.0);
        for (ri, (r, &kr)) in s.chunks_exact(dv).zip(k).enumerate() {
            if i == 0 {
                // the state comes from memory on the first token: rows
                // prefetched ahead as the decode kernels stream weights
                // (dv bf16 are the bytes of dv / 2 f32)
                let at = s.as_ptr().wrapping_add(ri * dv) as *const f32;
                prefetch_rows_ahead(at, if f32_state { dv } else { dv.div_ceil(2) });
            }
            for (a, &x) in kv.iter_mut().zip(S::read_row(r, &mut row)) {
                *a += kr * x;
            }
        }
        // δ = β(v − kv), kept in kv.
        for (a, &vv) in kv.iter_mut().zip(v) {
            *a = beta * (vv - decay * *a);
        }
        // SAFETY: token i, head j: lanes no other head writes.
        let o = unsafe { std::slice::from_raw_parts_mut(out.get().add((i * hv + j) * dv), dv) };
        o.fill(0.0);
        // S ← exp(g)·S + k δᵀ and o = Sᵀq in a second pass.
        let kv = &*kv;
        for ((r, &kr), &qr) in s.chunks_exact_mut(dv).zip(k).zip(q) {
            S::update_row(r, &mut row, |r| {
                for ((x, &dl), ov) in r.iter_mut().zip(kv.iter()).zip(o.iter_mut()) {
                    *x = decay * *x + kr * dl;
                    *ov += qr * *x;
                }
            });
        }
    }
    debug_assert_eq!(s.len(), dk * dv);
}
multiversion!(fn head_scan_mv<S: StateElem>(
    d: &GatedDeltaDims, j: usize, s: &mut [S], inp: &DeltaInputs, out: SendPtr<f32>, kv: &mut [f32], n: usize
) => head_scan);

/// The state types the delta rule takes (f32, bf16; a bf16 head is computed
/// in f32 and rounded once per token when stored), and where a decode
/// step moving the state to a new buffer streams it.
pub trait DeltaState: StateElem {
    /// One token of head `j` with its state moving from `src` to `dst`,
    /// the new state streamed (`moving.rs`); `false` (nothing
    /// done) where that path does not run: the caller copies and scans.
    ///
    /// # Safety
    /// `out` holds `Hv · d_v` values of which this call alone writes row
    /// `j`.
    #[doc(hidden)]
    unsafe fn move_step(
        _d: &GatedDeltaDims,
        _j: usize,
        _src: &[Self],
        _dst: &mut [Self],
        _inp: &DeltaInputs,
        _out: *mut f32,
        _kv: &mut [f32],
    ) -> bool {
        false
    }
}

impl DeltaState for f32 {
    unsafe fn move_step(
        d: &GatedDeltaDims,
        j: usize,
        src: &[f32],
        dst: &mut [f32],
        inp: &DeltaInputs,
        out: *mut f32,
        kv: &mut [f32],
    ) -> bool {
        if !can_stream(dst, d.d_v) {
            return false;
        }
        // SAFETY: `usable` checked AVX2, the row width and the alignment;
        // the caller owns head j's state and output row.
        super::moving::move_step(d, j, src, dst, inp, out, kv);
        true
    }
}

impl DeltaState for bf16 {}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ops::delta::dims::Heads;
    use crate::ops::delta::HeadOrder;
    use crate::ops::state_elem::{round_bf16, widen_bf16};
    use crate::testutil::Rng;

    /// The textbook recurrence in f64 over the case's `n` tokens, per value
    /// head (key head by `order`): the state and the outputs.
    pub fn naive(dims: &GatedDeltaDims, c: &Case, n: usize) -> (Vec<f64>, Vec<f64>) {
        let (hk, hv, dk, dv) = (dims.n_k_head, dims.n_v_head, dims.d_k, dims.d_v);
        let (q, k, v, g, beta) = (&c.q, &c.k, &c.v, &c.g, &c.beta);
        let mut s: Vec<f64> = c.s0.iter().map(|&x| x as f64).collect();
        let mut out = vec![0f64; n * hv * dv];
        for i in 0..n {
            for j in 0..hv {
                let kh = dims.key_head(j);
                let sj = &mut s[j * dk * dv..(j + 1) * dk * dv];
                let e = (g[i * hv + j] as f64).exp();
                sj.iter_mut().for_each(|x| *x *= e);
                for c in 0..dv {
                    let mut kv = 0f64;
                    for r in 0..dk {
                        kv += sj[r * dv + c] * k[(i * hk + kh) * dk + r] as f64;
                    }
                    let delta = beta[i * hv + j] as f64 * (v[(i * hv + j) * dv + c] as f64 - kv);
                    for r in 0..dk {
                        sj[r * dv + c] += k[(i * hk + kh) * dk + r] as f64 * delta;
                    }
                }
                for c in 0..dv {
                    let mut o = 0f64;
                    for r in 0..dk {
                        o += sj[r * dv + c] * q[(i * hk + kh) * dk + r] as f64;
                    }
                    out[(i * hv + j) * dv + c] = o;
                }
            }
        }
        (s, out)
    }

    /// Random q, k (normalised), v, log decays g, β and a start state.
    pub struct Case {
        pub q: Vec<f32>,
        pub k: Vec<f32>,
        pub v: Vec<f32>,
        pub g: Vec<f32>,
        pub beta: Vec<f32>,
        pub s0: Vec<f32>,
    }

    impl Case {
        /// `n` tokens for the heads `d`, g made from uniform draws by
        /// `decay(index, draw)`, β in (0, 1).
        pub fn random<D: Heads>(
            rng: &mut Rng,
            d: &D,
            n: usize,
            decay: impl Fn(usize, f32) -> f32,
        ) -> Case {
            let (hk, hv, dk, dv) = d.shape();
            let mut q = rng.vec(n * hk * dk);
            let mut k = rng.vec(n * hk * dk);
            l2_normalize(&mut q, dk, 1e-6, 1.0 / (dk as f32).sqrt());
            l2_normalize(&mut k, dk, 1e-6, 1.0);
            let v = rng.vec(n * hv * dv);
            let g = rng.vec(n * hv * d.decays());
            let g = g.iter().enumerate().map(|(i, &x)| decay(i, x)).collect();
            let beta = rng.vec(n * hv);
            let beta = beta.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect();
            let s0 = rng.vec(hv * dk * dv);
            Case {
                q,
                k,
                v,
                g,
                beta,
                s0,
            }
        }

        /// All tokens, rows packed.
        pub fn inputs<D: Heads>(&self, d: &D) -> DeltaInputs<'_> {
            let (hk, hv, dk, dv) = d.shape();
            DeltaInputs {
                q: &self.q,
                k: &self.k,
                ld_qk: hk * dk,
                v: &self.v,
                ld_v: hv * dv,
                g: &self.g,
                beta: &self.beta,
            }
        }

        /// Token `i` alone.
        pub fn one<D: Heads>(&self, d: &D, i: usize) -> DeltaInputs<'_> {
            let (hk, hv, dk, dv) = d.shape();
            let ng = hv * d.decays();
            DeltaInputs {
                q: &self.q[i * hk * dk..],
                k: &self.k[i * hk * dk..],
                v: &self.v[i * hv * dv..],
                g: &self.g[i * ng..(i + 1) * ng],
                beta: &self.beta[i * hv..(i + 1) * hv],
                ..self.inputs(d)
            }
        }
    }

    /// g in (−2, 0).
    pub fn random_inputs(rng: &mut Rng, dims: &GatedDeltaDims, n: usize) -> Case {
        Case::random(rng, dims, n, |_, x| -(x.abs() * 2.0))
    }

    /// A family's token-by-token scan and its f64 reference, as the checks
    /// both families share call them.
    pub trait Family: Heads {
        fn scan<S: DeltaState>(
            &self,
            pool: &ThreadPool,
            state: &mut [S],
            inp: DeltaInputs,
            out: &mut [f32],
            n: usize,
        );
        fn scan_batch<S: DeltaState>(&self, pool: &ThreadPool, seqs: &mut [Seq<S>]);
        /// The recurrence in f64 over the case's `n` tokens: the state
        /// and the outputs.
        fn naive(&self, c: &Case, n: usize) -> (Vec<f64>, Vec<f64>);
    }

    impl Family for GatedDeltaDims {
        fn scan<S: DeltaState>(
            &self,
            pool: &ThreadPool,
            state: &mut [S],
            inp: DeltaInputs,
            out: &mut [f32],
            n: usize,
        ) {
            gated_delta_scan(pool, *self, state, inp, out, n)
        }
        fn scan_batch<S: DeltaState>(&self, pool: &ThreadPool, seqs: &mut [Seq<S>]) {
            gated_delta_scan_batch(pool, *self, seqs)
        }
        fn naive(&self, c: &Case, n: usize) -> (Vec<f64>, Vec<f64>) {
            naive(self, c, n)
        }
    }

    fn bits<T: AsRef<[f32]>>(v: &[T]) -> Vec<Vec<u32>> {
        v.iter()
            .map(|r| r.as_ref().iter().map(|x| x.to_bits()).collect())
            .collect()
    }

    /// The scan of the case's `n` tokens within 1e-4 of the f64
    /// recurrence, and token by token the same bits.
    pub fn check_scan<D: Family>(pool: &ThreadPool, d: D, c: &Case, n: usize) {
        let (_, hv, _, dv) = d.shape();
        let (ws, wo) = d.naive(c, n);
        let mut s = c.s0.clone();
        let mut out = vec![0f32; n * hv * dv];
        d.scan(pool, &mut s, c.inputs(&d), &mut out, n);
        for (a, e) in out.iter().zip(&wo) {
            assert!((*a as f64 - e).abs() < 1e-4, "{a} vs {e}");
        }
        for (a, e) in s.iter().zip(&ws) {
            assert!((*a as f64 - e).abs() < 1e-4);
        }
        let mut s2 = c.s0.clone();
        let mut out2 = vec![0f32; n * hv * dv];
        for i in 0..n {
            let o = &mut out2[i * hv * dv..(i + 1) * hv * dv];
            d.scan(pool, &mut s2, c.one(&d, i), o, 1);
        }
        assert_eq!(out, out2);
        assert_eq!(s, s2);
    }

    /// Sequences of `toks` tokens (`cases`) in one call, odd ones moving
    /// off a checkpoint (their buffers hold garbage, `from` the state to
    /// continue): each gets the bits it gets alone, in place.
    pub fn check_batch<D: Family>(pool: &ThreadPool, d: D, cases: &[Case], toks: &[usize]) {
        let (_, hv, _, dv) = d.shape();
        let mut want_s: Vec<Vec<f32>> = cases.iter().map(|c| c.s0.clone()).collect();
        let mut want_o: Vec<Vec<f32>> = toks.iter().map(|&n| vec![0f32; n * hv * dv]).collect();
        for (i, c) in cases.iter().enumerate() {
            d.scan(pool, &mut want_s[i], c.inputs(&d), &mut want_o[i], toks[i]);
        }
        let mut got_s: Vec<Vec<f32>> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| match i % 2 {
                0 => c.s0.clone(),
                _ => vec![f32::NAN; c.s0.len()],
            })
            .collect();
        let mut got_o: Vec<Vec<f32>> = toks.iter().map(|&n| vec![0f32; n * hv * dv]).collect();
        let mut seqs: Vec<Seq> = got_s
            .iter_mut()
            .zip(got_o.iter_mut())
            .zip(cases.iter().zip(toks))
            .enumerate()
            .map(|(i, ((state, out), (c, &n)))| Seq {
                state,
                from: (i % 2 == 1).then_some(&c.s0[..]),
                inputs: c.inputs(&d),
                out,
                n_tokens: n,
            })
            .collect();
        d.scan_batch(pool, &mut seqs);
        drop(seqs);
        assert_eq!(bits(&got_s), bits(&want_s), "states, d_v {dv}");
        assert_eq!(bits(&got_o), bits(&want_o), "outputs, d_v {dv}");
    }

    /// A bf16 state gives exactly the f32 recurrence with the state
    /// rounded to bf16 after every token, in one call or one token per
    /// call, alone or batched.
    pub fn check_bf16<D: Family>(pool: &ThreadPool, d: D, c: &Case, n: usize) {
        let (_, hv, _, dv) = d.shape();
        let s0: Vec<bf16> = c.s0.iter().map(|&x| round_bf16(x)).collect();
        let mut sf: Vec<f32> = s0.iter().map(|&x| widen_bf16(x)).collect();
        let mut want_o = vec![0f32; n * hv * dv];
        for i in 0..n {
            let o = &mut want_o[i * hv * dv..(i + 1) * hv * dv];
            d.scan(pool, &mut sf, c.one(&d, i), o, 1);
            sf.iter_mut().for_each(|x| *x = widen_bf16(round_bf16(*x)));
        }
        let want_s: Vec<bf16> = sf.iter().map(|&x| round_bf16(x)).collect();

        let mut s = s0.clone();
        let mut o = vec![0f32; n * hv * dv];
        d.scan(pool, &mut s, c.inputs(&d), &mut o, n);
        assert_eq!(s, want_s);
        assert_eq!(o, want_o);

        let mut s2 = s0.clone();
        let mut o2 = vec![0f32; n * hv * dv];
        let mut seqs = [Seq {
            state: &mut s2[..],
            from: None,
            inputs: c.inputs(&d),
            out: &mut o2,
            n_tokens: n,
        }];
        d.scan_batch(pool, &mut seqs);
        assert_eq!(s2, want_s);
        assert_eq!(o2, want_o);
    }

    #[test]
    pub fn scan_matches_naive_in_both_orders_and_steps() {
        let mut rng = Rng::new(11);
        let pool = ThreadPool::new(2);
        for order in [HeadOrder::Grouped, HeadOrder::Tiled] {
            for &(hk, hv, dk, dv, n) in &[(2, 4, 8, 8, 9), (1, 3, 5, 7, 4), (2, 2, 16, 4, 1)] {
                let dims = GatedDeltaDims {
                    n_k_head: hk,
                    n_v_head: hv,
                    d_k: dk,
                    d_v: dv,
                    order,
                };
                let c = random_inputs(&mut rng, &dims, n);
                check_scan(&pool, dims, &c, n);
            }
        }
    }

    /// Odd sequences move off a checkpoint; with value rows of 32 their
    /// one-token steps take the streamed path (`moving.rs`), with
    /// rows of 4 the copy-then-update one: the same bits as each sequence
    /// scanned alone in place.
    #[test]
    fn batch_equals_each_sequence_alone() {
        for (dk, dv) in [(8, 4), (16, 32)] {
            let dims = GatedDeltaDims {
                n_k_head: 2,
                n_v_head: 4,
                d_k: dk,
                d_v: dv,
                order: HeadOrder::Tiled,
            };
            let mut rng = Rng::new(13);
            let toks = [1usize, 2, 1, 1, 3, 1];
            let cases: Vec<Case> = toks
                .iter()
                .map(|&n| random_inputs(&mut rng, &dims, n))
                .collect();
            check_batch(&ThreadPool::new(2), dims, &cases, &toks);
        }
    }

    #[test]
    fn bf16_is_the_f32_update_rounded_per_token() {
        let mut rng = Rng::new(41);
        let pool = ThreadPool::new(2);
        for &(hk, hv, dk, dv, n) in &[(2, 4, 8, 16, 5), (1, 3, 5, 7, 3), (2, 2, 32, 32, 1)] {
            let dims = GatedDeltaDims {
                n_k_head: hk,
                n_v_head: hv,
                d_k: dk,
                d_v: dv,
                order: HeadOrder::Tiled,
            };
            let c = random_inputs(&mut rng, &dims, n);
            check_bf16(&pool, dims, &c, n);
        }
    }
}
