//! The sizes and inputs every gated-delta-rule kernel of this folder shares.

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

/// The per-token inputs, read in place from wider rows: token `i`'s q and k
/// (`[Hk, d_k]` each) start at `q[i·ld_qk]`, `k[i·ld_qk]`, its v (`[Hv,
/// d_v]`) at `v[i·ld_v]`; `g`, `beta`: `[n_tokens, Hv]`.
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
    pub(crate) fn check(&self, d: &GatedDeltaDims, n: usize) {
        if n == 0 {
            return;
        }
        let (kd, vd) = (d.n_k_head * d.d_k, d.n_v_head * d.d_v);
        assert!(self.ld_qk >= kd && self.ld_v >= vd);
        assert!(
            self.q.len() >= (n - 1) * self.ld_qk + kd,
            "gated delta: q too short"
        );
        assert!(
            self.k.len() >= (n - 1) * self.ld_qk + kd,
            "gated delta: k too short"
        );
        assert!(
            self.v.len() >= (n - 1) * self.ld_v + vd,
            "gated delta: v too short"
        );
        assert_eq!(
            self.g.len(),
            n * d.n_v_head,
            "gated delta: g is not [n, Hv]"
        );
        assert_eq!(
            self.beta.len(),
            n * d.n_v_head,
            "gated delta: beta is not [n, Hv]"
        );
    }

    #[inline(always)]
    pub(crate) fn q_at(&self, d: &GatedDeltaDims, i: usize, kh: usize) -> &[f32] {
        &self.q[i * self.ld_qk + kh * d.d_k..][..d.d_k]
    }
    #[inline(always)]
    pub(crate) fn k_at(&self, d: &GatedDeltaDims, i: usize, kh: usize) -> &[f32] {
        &self.k[i * self.ld_qk + kh * d.d_k..][..d.d_k]
    }
    #[inline(always)]
    pub(crate) fn v_at(&self, d: &GatedDeltaDims, i: usize, j: usize) -> &[f32] {
        &self.v[i * self.ld_v + j * d.d_v..][..d.d_v]
    }
}
