//! The sizes and inputs every gated-delta-rule kernel of this folder shares,
//! and the spread of a batch's (sequence, head) pairs over the pool.

use crate::denormals::FlushDenormals;
use crate::ops::state_elem::StateElem;
use crate::ops::state_rows::fence;
use crate::pool::{SendPtr, ThreadPool};

/// Which key head a value head reads, when there are more value heads than
/// key heads (Hv = r·Hk).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadOrder {
    /// Value head j reads key head j / r (the checkpoint's order; llama.cpp's
    /// `qwen3next` files).
    Grouped,
    /// Value head j reads key head j % Hk (llama.cpp's `qwen35` files, whose
    /// value heads the converter re-orders).
    Tiled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatedDeltaDims {
    pub n_k_head: usize,
    pub n_v_head: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub order: HeadOrder,
}

impl GatedDeltaDims {
    /// The key head value head `j` reads.
    #[inline(always)]
    pub fn key_head(&self, j: usize) -> usize {
        match self.order {
            HeadOrder::Grouped => j / (self.n_v_head / self.n_k_head),
            HeadOrder::Tiled => j % self.n_k_head,
        }
    }

    /// f32 elements of the state of all value heads.
    pub fn state_len(&self) -> usize {
        self.n_v_head * self.d_k * self.d_v
    }

    pub(crate) fn check(&self) {
        assert!(
            self.n_k_head > 0 && self.n_v_head.is_multiple_of(self.n_k_head),
            "gated delta: value heads must be a multiple of key heads"
        );
        assert!(self.d_k > 0 && self.d_v > 0);
    }
}

/// The head shapes of a family of this folder, which its inputs, states
/// and outputs are checked and read against: [`GatedDeltaDims`] (one log
/// decay per value head) and `KdaDims` (as many key as value heads, one log
/// decay per key channel).
pub trait Heads: Copy + Send + Sync {
    /// The family, for messages.
    #[doc(hidden)]
    const FAMILY: &'static str;
    /// The value heads and the log decays per token, for messages.
    #[doc(hidden)]
    const SHAPES: (&'static str, &'static str);
    /// `(key heads, value heads, d_k, d_v)`.
    #[doc(hidden)]
    fn shape(&self) -> (usize, usize, usize, usize);
    /// Log decays per value head and token.
    #[doc(hidden)]
    fn decays(&self) -> usize;
}

impl Heads for GatedDeltaDims {
    const FAMILY: &'static str = "gated delta";
    const SHAPES: (&'static str, &'static str) = ("Hv", "Hv");
    #[inline(always)]
    fn shape(&self) -> (usize, usize, usize, usize) {
        (self.n_k_head, self.n_v_head, self.d_k, self.d_v)
    }
    #[inline(always)]
    fn decays(&self) -> usize {
        1
    }
}

/// The per-token inputs, read in place from wider rows: token `i`'s q and k
/// (`[Hk, d_k]` each) start at `q[i·ld_qk]`, `k[i·ld_qk]`, its v (`[Hv,
/// d_v]`) at `v[i·ld_v]`; `g`: `[n_tokens, Hv]` log decays (KDA: `[n_tokens,
/// H, d_k]`), `beta`: `[n_tokens, Hv]`.
#[derive(Clone, Copy)]
pub struct DeltaInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub ld_qk: usize,
    pub v: &'a [f32],
    pub ld_v: usize,
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

impl DeltaInputs<'_> {
    pub(crate) fn check<D: Heads>(&self, d: &D, n: usize) {
        if n == 0 {
            return;
        }
        let ((hk, hv, dk, dv), f) = (d.shape(), D::FAMILY);
        let (kd, vd) = (hk * dk, hv * dv);
        assert!(self.ld_qk >= kd && self.ld_v >= vd);
        assert!(
            self.q.len() >= (n - 1) * self.ld_qk + kd,
            "{f}: q too short"
        );
        assert!(
            self.k.len() >= (n - 1) * self.ld_qk + kd,
            "{f}: k too short"
        );
        assert!(self.v.len() >= (n - 1) * self.ld_v + vd, "{f}: v too short");
        let (heads, decays) = D::SHAPES;
        assert_eq!(
            self.g.len(),
            n * hv * d.decays(),
            "{f}: g is not [n, {decays}]"
        );
        assert_eq!(self.beta.len(), n * hv, "{f}: beta is not [n, {heads}]");
    }

    /// Token `i`'s q of key head `kh`.
    #[inline(always)]
    pub(crate) fn q_at<D: Heads>(&self, d: &D, i: usize, kh: usize) -> &[f32] {
        key_row(self.q, self.ld_qk, d, i, kh)
    }
    /// Token `i`'s k of key head `kh`.
    #[inline(always)]
    pub(crate) fn k_at<D: Heads>(&self, d: &D, i: usize, kh: usize) -> &[f32] {
        key_row(self.k, self.ld_qk, d, i, kh)
    }
    #[inline(always)]
    pub(crate) fn v_at<D: Heads>(&self, d: &D, i: usize, j: usize) -> &[f32] {
        let dv = d.shape().3;
        &self.v[i * self.ld_v + j * dv..][..dv]
    }
    /// Token `i`'s log decays of head `j` (one per key channel: KDA).
    #[inline(always)]
    pub(crate) fn g_at<D: Heads>(&self, d: &D, i: usize, j: usize) -> &[f32] {
        let (_, hv, dk, _) = d.shape();
        &self.g[(i * hv + j) * dk..][..dk]
    }
}

/// Token `i`'s `d_k` values of key head `kh` in rows `ld` apart.
#[inline(always)]
fn key_row<'a, D: Heads>(x: &'a [f32], ld: usize, d: &D, i: usize, kh: usize) -> &'a [f32] {
    let dk = d.shape().2;
    &x[i * ld + kh * dk..][..dk]
}

/// One sequence's part of a batched scan (`gated_delta_scan_batch`,
/// `kda_scan_batch`): its state `[Hv, d_k, d_v]` (f32 or bf16), inputs and
/// output `[n_tokens, Hv, d_v]`. With `from` (a state moving off a
/// checkpoint, same length), `state`'s old contents are ignored: each head
/// is copied from `from` just before its update (cache-hot, instead of a
/// pass over the whole state first).
pub struct Seq<'a, S = f32> {
    pub state: &'a mut [S],
    pub from: Option<&'a [S]>,
    pub inputs: DeltaInputs<'a>,
    pub out: &'a mut [f32],
    pub n_tokens: usize,
}

/// A [`Seq`] checked, its buffers sendable.
pub(crate) struct Part<'a, S> {
    state: SendPtr<S>,
    pub(crate) from: Option<&'a [S]>,
    pub(crate) inputs: DeltaInputs<'a>,
    pub(crate) out: SendPtr<f32>,
    pub(crate) n_tokens: usize,
}

/// The (sequence, value head) pairs of `seqs` spread over `pool` in one
/// call: `head(part, j, state of head j, scratch)` on each, `scratch` made
/// once per thread by `work`; `head` returns whether it streamed its stores,
/// and a thread whose heads did fences them before handing back.
pub(crate) fn scan_heads<D: Heads, S: StateElem, W>(
    pool: &ThreadPool,
    dims: &D,
    seqs: &mut [Seq<S>],
    work: impl Fn() -> W + Sync,
    head: impl Fn(&Part<S>, usize, &mut [S], &mut W) -> bool + Sync,
) {
    let ((_, hv, dk, dv), f) = (dims.shape(), D::FAMILY);
    let hs = dk * dv;
    let parts: Vec<Part<S>> = seqs
        .iter_mut()
        .map(|s| {
            s.inputs.check(dims, s.n_tokens);
            let heads = D::SHAPES.0;
            assert_eq!(
                s.state.len(),
                hv * hs,
                "{f}: state is not [{heads}, dk, dv]"
            );
            assert!(s.from.is_none_or(|f| f.len() == s.state.len()));
            assert_eq!(s.out.len(), s.n_tokens * hv * dv);
            Part {
                state: SendPtr(s.state.as_mut_ptr()),
                from: s.from,
                inputs: s.inputs,
                out: SendPtr(s.out.as_mut_ptr()),
                n_tokens: s.n_tokens,
            }
        })
        .collect();
    let items = parts.len() * hv;
    if items == 0 {
        return;
    }
    let grain = (items / (pool.n_threads() * 4)).clamp(1, hv);
    pool.parallel_for(items, grain, |r, _| {
        let _flush = FlushDenormals::new();
        let mut w = work();
        let mut streamed = false;
        for i in r {
            let (pt, j) = (&parts[i / hv], i % hv);
            // SAFETY: each (sequence, value head) pair's state and output
            // lanes belong to exactly one call.
            let s = unsafe { std::slice::from_raw_parts_mut(pt.state.get().add(j * hs), hs) };
            streamed |= head(pt, j, s, &mut w);
        }
        if streamed {
            // The streamed stores are ordered before the hand-back.
            fence();
        }
    });
}
