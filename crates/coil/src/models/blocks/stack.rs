//! The residual decoder stack every architecture here is an instance of:
//!
//! ```text
//! x = embed(tokens) · embedding_scale
//! per layer:  x += residual_scale · mixer(RMSNorm(x))        (if a mixer)
//!             x += residual_scale · ffn(RMSNorm_ffn(x))       (if a feed-forward)
//!             (with sandwich norms, LFM3: each block's output RMS-normed
//!             again before it is added)
//! logits = output(RMSNorm(x)) / logit_scale
//! ```
//!
//! where the mixer is attention, Mamba-1, Mamba-2, attention ∥ Mamba-2
//! (their outputs summed, Falcon-H1), Gated DeltaNet, LFM2's short
//! convolution, Kimi Delta Attention or multi-head latent attention.
//! Architecture files choose the blocks.

use super::attention::Attention;
use super::common::{check_ubatch, gather_rows, Embedding, OutputHead};
use super::ffn::{DenseFfn, Moe, MoeGatedShared};
use super::gated_attention::GatedAttention;
use super::gated_delta_mixer::GatedDeltaMixer;
use super::kda_mixer::KdaMixer;
use super::mamba1_mixer::Mamba1Mixer;
use super::mamba2_mixer::Mamba2Mixer;
use super::mla::Mla;
use super::short_conv::ShortConv;
use crate::memory::SeqId;
use crate::memory::{KvLayerShape, KvMemory, Memory, RecurrentLayerShape, RecurrentMemory};
use crate::models::nextn::NextnBlock;
use crate::models::weights::Loader;
use crate::models::{Model, ModelError, ModelInfo, Rows, UBatch};
use coil_gguf::GgufFile;
use coil_kernels::ops::norm::{rms_norm, rms_norm_inplace};
use coil_kernels::{Scratch, ThreadPool};
use std::sync::Arc;

pub enum MixerBlock {
    None,
    Attention(Box<Attention>),
    Mamba1(Box<Mamba1Mixer>),
    Mamba2(Box<Mamba2Mixer>),
    /// Attention and Mamba-2 on the same normed input, outputs summed.
    Parallel(Box<Attention>, Box<Mamba2Mixer>),
    /// Attention with q/k norms and a sigmoid output gate (Qwen3.5 / Qwen3-Next).
    GatedAttention(Box<GatedAttention>),
    GatedDeltaNet(Box<GatedDeltaMixer>),
    /// LFM2's gated short convolution.
    ShortConv(Box<ShortConv>),
    /// Kimi Delta Attention.
    Kda(Box<KdaMixer>),
    /// Multi-head latent attention (a compressed KV cache).
    Mla(Box<Mla>),
}

pub enum FfnBlock {
    None,
    Dense(Box<DenseFfn>),
    Moe(Box<Moe>),
    /// Experts plus a sigmoid-gated shared expert.
    MoeGatedShared(Box<MoeGatedShared>),
}

pub struct StackLayer {
    pub norm: Vec<f32>,
    pub mixer: MixerBlock,
    /// The norm before the feed-forward; `None` reuses `norm` (a layer
    /// whose only block is its feed-forward).
    pub ffn_norm: Option<Vec<f32>>,
    pub ffn: FfnBlock,
    /// Norms of the mixer's and the feed-forward's outputs before the
    /// residual add (LFM3's `post_operator_norm` / `post_ffn_norm`).
    pub sandwich: Option<SandwichNorms>,
}

/// A layer's output norms (weights `[d_model]`): `x += RMSNorm(mixer(…))·mixer`,
/// `x += RMSNorm(ffn(…))·ffn`.
pub struct SandwichNorms {
    pub mixer: Vec<f32>,
    pub ffn: Vec<f32>,
}

impl StackLayer {
    fn recurrent_shape(&self) -> Option<RecurrentLayerShape> {
        match &self.mixer {
            MixerBlock::Mamba1(m) => Some(m.p.state_shape()),
            MixerBlock::Mamba2(m) | MixerBlock::Parallel(_, m) => Some(m.p.state_shape()),
            MixerBlock::GatedDeltaNet(m) => Some(m.p.state_shape()),
            MixerBlock::ShortConv(c) => Some(c.p.state_shape()),
            MixerBlock::Kda(m) => Some(m.p.state_shape()),
            _ => None,
        }
    }

    fn kv_shape(&self) -> Option<KvLayerShape> {
        match &self.mixer {
            MixerBlock::Attention(a) | MixerBlock::Parallel(a, _) => {
                Some(KvLayerShape::heads(a.p.n_kv_head, a.p.head_dim))
            }
            MixerBlock::GatedAttention(a) => Some(KvLayerShape::heads(a.p.n_kv_head, a.p.head_dim)),
            MixerBlock::Mla(a) => Some(a.p.kv_shape()),
            _ => None,
        }
    }
}

/// Granite-style µP multipliers (1 where a model has none).
#[derive(Clone, Copy, Debug)]
pub struct Scales {
    pub embedding: f32,
    pub residual: f32,
    /// Logits are divided by this.
    pub logit_div: f32,
}

impl Default for Scales {
    fn default() -> Self {
        Scales {
            embedding: 1.0,
            residual: 1.0,
            logit_div: 1.0,
        }
    }
}

pub struct DecoderStack {
    pub file: Arc<GgufFile>,
    pub info: ModelInfo,
    pub embed: Embedding,
    pub layers: Vec<StackLayer>,
    pub head: OutputHead,
    pub eps: f32,
    pub scales: Scales,
    /// The NextN / MTP blocks after the trunk (not run by [`Model::forward`]).
    pub nextn: Vec<NextnBlock>,
}

impl DecoderStack {
    /// Adds the embedding and output head to loaded layers.
    pub fn build(
        file: Arc<GgufFile>,
        info: ModelInfo,
        layers: Vec<StackLayer>,
        eps: f32,
        scales: Scales,
    ) -> Result<Self, ModelError> {
        Self::build_with_output_norm(file, info, layers, eps, scales, "output_norm.weight")
    }

    /// [`DecoderStack::build`] where the final norm is the tensor
    /// `output_norm` (LFM2's files call it `token_embd_norm.weight`).
    pub fn build_with_output_norm(
        file: Arc<GgufFile>,
        info: ModelInfo,
        layers: Vec<StackLayer>,
        eps: f32,
        scales: Scales,
        output_norm: &str,
    ) -> Result<Self, ModelError> {
        let ld = Loader::new(&file, &info.arch);
        let embed = Embedding::load(&ld, info.n_vocab, info.n_embd)?;
        let head = OutputHead::load_with_norm(&ld, info.n_vocab, info.n_embd, eps, output_norm)?;
        Ok(DecoderStack {
            file,
            info,
            embed,
            layers,
            head,
            eps,
            scales,
            nextn: Vec::new(),
        })
    }

    /// The stack with the NextN blocks that follow its trunk in the file.
    pub fn with_nextn(mut self, nextn: Vec<NextnBlock>) -> Self {
        self.nextn = nextn;
        self
    }

    /// Layer `l`'s mixer on the normed rows `h`, into `out`: every row, or
    /// for `q_rows` (ascending) only those rows where the mixer can skip the
    /// others' outputs (attention: their queries are never needed). Returns
    /// whether `out` holds only the `q_rows` rows.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mixer(
        &self,
        pool: &ThreadPool,
        l: usize,
        rows: &[Rows],
        mem: &mut Memory,
        h: &[f32],
        q_rows: Option<&[usize]>,
        out: &mut [f32],
    ) -> Result<bool, ModelError> {
        self.run_mixer(&self.layers[l], l, pool, rows, mem, h, q_rows, out)
    }

    /// [`DecoderStack::mixer`] of `layer`, whose memory is layer `l`'s (a
    /// trunk layer, or a NextN block's past the trunk).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_mixer(
        &self,
        layer: &StackLayer,
        l: usize,
        pool: &ThreadPool,
        rows: &[Rows],
        mem: &mut Memory,
        h: &[f32],
        q_rows: Option<&[usize]>,
        out: &mut [f32],
    ) -> Result<bool, ModelError> {
        let file = &self.file;
        match &layer.mixer {
            MixerBlock::None => out.fill(0.0),
            MixerBlock::Attention(a) => {
                a.forward(file, pool, l, rows, mem, h, q_rows, out)?;
                return Ok(q_rows.is_some());
            }
            MixerBlock::Mamba1(m) => m.forward(file, pool, l, rows, mem, h, out)?,
            MixerBlock::Mamba2(m) => m.forward(file, pool, l, rows, mem, h, out)?,
            MixerBlock::GatedAttention(a) => {
                a.forward(file, pool, l, rows, mem, h, q_rows, out)?;
                return Ok(q_rows.is_some());
            }
            MixerBlock::GatedDeltaNet(m) => m.forward(file, pool, l, rows, mem, h, out)?,
            MixerBlock::Parallel(a, m) => {
                a.forward(file, pool, l, rows, mem, h, None, out)?;
                let mut o2 = Scratch::dirty(out.len());
                m.forward(file, pool, l, rows, mem, h, &mut o2)?;
                out.iter_mut().zip(&o2).for_each(|(a, b)| *a += b);
            }
            MixerBlock::ShortConv(c) => c.forward(file, pool, l, rows, mem, h, out)?,
            MixerBlock::Kda(m) => m.forward(file, pool, l, rows, mem, h, out)?,
            MixerBlock::Mla(a) => {
                a.forward(file, pool, l, rows, mem, h, q_rows, out)?;
                return Ok(q_rows.is_some());
            }
        }
        Ok(false)
    }
}

impl Model for DecoderStack {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn nextn(&self) -> &[NextnBlock] {
        &self.nextn
    }

    fn new_memory(&self, n_seq_max: usize, n_ctx: usize) -> Memory {
        self.memory_with(None, n_seq_max, n_ctx)
    }

    /// One more layer past the trunk: the first NextN block's attention
    /// cells, and as its recurrent state the hidden state it reads next
    /// (`d` values, f32 whatever the state type).
    fn new_memory_nextn(&self, n_seq_max: usize, n_ctx: usize) -> Option<Memory> {
        let kv = self.nextn.first()?.layer.kv_shape()?;
        let h = RecurrentLayerShape {
            conv: super::stack_nextn::nextn_state_words(self.info.n_embd),
            ssm: 0,
        };
        Some(self.memory_with(Some((h, kv)), n_seq_max, n_ctx))
    }

    fn draft_nextn(
        &self,
        pool: &ThreadPool,
        mem: &mut Memory,
        seqs: &[(SeqId, u32, usize)],
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        self.draft(pool, mem, seqs, None)
    }

    fn nextn_catch_up(
        &self,
        pool: &ThreadPool,
        mem: &mut Memory,
        seqs: &[SeqId],
    ) -> Result<(), ModelError> {
        self.catch_up(pool, mem, seqs)
    }

    fn draft_nextn_logits(
        &self,
        pool: &ThreadPool,
        mem: &mut Memory,
        seq: SeqId,
        token: u32,
        k: usize,
    ) -> Result<(Vec<u32>, Vec<f32>), ModelError> {
        let mut logits = Vec::new();
        let mut d = self.draft(pool, mem, &[(seq, token, k)], Some(&mut logits))?;
        Ok((d.pop().unwrap_or_default(), logits))
    }

    fn forward(
        &self,
        pool: &ThreadPool,
        ub: &UBatch,
        mem: &mut Memory,
        logits: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        self.forward_stack(pool, ub, mem, logits)
    }

    /// Refolds where every recurrent layer is a Mamba-2 mixer (alone or
    /// beside attention) or a Gated DeltaNet; the other recurrent mixers
    /// (Mamba-1, LFM2's short convolution) replay. The NextN block's hidden
    /// state (with its memory on) is the verification's row of the last
    /// kept token.
    fn refold(
        &self,
        pool: &ThreadPool,
        mem: &mut Memory,
        seq: SeqId,
        n: usize,
    ) -> Result<bool, ModelError> {
        let can = |l: &StackLayer| match &l.mixer {
            MixerBlock::Mamba2(_) | MixerBlock::Parallel(..) | MixerBlock::GatedDeltaNet(_) => true,
            _ => l.recurrent_shape().is_none(),
        };
        if !self.layers.iter().all(can) {
            return Ok(false);
        }
        for (i, l) in self.layers.iter().enumerate() {
            match &l.mixer {
                MixerBlock::Mamba2(m) | MixerBlock::Parallel(_, m) => {
                    m.refold(pool, i, seq, mem, n)?
                }
                MixerBlock::GatedDeltaNet(m) => m.refold(pool, i, seq, mem, n)?,
                _ => {}
            }
        }
        if self.nextn_on(mem) {
            self.refold_nextn(mem, seq, n)?;
        }
        Ok(true)
    }
}

impl DecoderStack {
    /// Memory for the trunk, plus the NextN block's layer `(hidden state,
    /// attention cells)` when given.
    fn memory_with(
        &self,
        nextn: Option<(RecurrentLayerShape, KvLayerShape)>,
        n_seq_max: usize,
        n_ctx: usize,
    ) -> Memory {
        let mut rec: Vec<Option<RecurrentLayerShape>> = self
            .layers
            .iter()
            .map(StackLayer::recurrent_shape)
            .collect();
        let mut kv: Vec<Option<KvLayerShape>> =
            self.layers.iter().map(StackLayer::kv_shape).collect();
        let deferred = nextn.map(|(h, cells)| {
            rec.push(Some(h));
            kv.push(Some(cells));
            kv.len() - 1
        });
        let recurrent = rec
            .iter()
            .any(Option::is_some)
            .then(|| RecurrentMemory::new(rec, n_seq_max));
        let kv = kv.iter().any(Option::is_some).then(|| {
            let m = KvMemory::new(kv, n_seq_max, n_ctx);
            match deferred {
                Some(l) => m.with_deferred(l),
                None => m,
            }
        });
        Memory::new(recurrent, kv, n_seq_max, n_ctx)
    }

    fn forward_stack(
        &self,
        pool: &ThreadPool,
        ub: &UBatch,
        mem: &mut Memory,
        logits: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        check_ubatch(ub, mem)?;
        // Every kernel called below on this thread reads it.
        let _numerics = coil_kernels::invariance_scope(ub.invariance);
        let d = self.info.n_embd;
        let n = ub.n_tokens();
        let tokens: Vec<u32> = ub
            .chunks
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect();
        let rows = ub.rows();
        let mut x = Scratch::dirty(n * d);
        self.embed.forward(&self.file, &tokens, &mut x)?;
        if self.scales.embedding != 1.0 {
            x.iter_mut().for_each(|v| *v *= self.scales.embedding);
        }
        let rs = self.scales.residual;
        let mut h = Scratch::dirty(n * d);
        let mut o = Scratch::dirty(n * d);
        // The last layer's rows past its mixer (which writes every row's
        // memory) are only those whose logits are asked for: a prompt's
        // feed-forward of its last layer runs for its last token alone (as
        // llama.cpp's graphs do), and an attention mixer there computes that
        // token's query and output alone.
        let out_rows = ub.logit_rows();
        let last = self.layers.len().saturating_sub(1);
        // With the NextN block's memory on, the block reads every row's
        // final hidden state: what the last layer leaves out here is
        // computed after the loop (`LastRows`), the rows asked for staying
        // exactly as without the block.
        let nextn = self.nextn_on(mem);
        let mut rest: Option<LastRows> = None;
        let mut m = n; // rows of x
        for (l, layer) in self.layers.iter().enumerate() {
            let narrow = (l == last && out_rows.len() < m).then_some(&out_rows[..]);
            if nextn && narrow.is_some() {
                rest = Some(LastRows {
                    x: copy_of(&x),
                    mixed: None,
                });
            }
            if !matches!(layer.mixer, MixerBlock::None) {
                norm_rows(pool, &x, &layer.norm, self.eps, &mut h, d);
                let narrowed = self.mixer(pool, l, &rows, mem, &h, narrow, &mut o)?;
                let written = if narrowed { out_rows.len() } else { m };
                self.post_mixer_norm(pool, layer, &mut o[..written * d]);
                if narrowed {
                    x = gather_rows(&x, &out_rows, d);
                    m = out_rows.len();
                } else if let Some(r) = &mut rest {
                    r.mixed = Some(copy_of(&o));
                }
                add_scaled_rows(pool, &mut x, rs, &o[..m * d], d);
            }
            if l == last && out_rows.len() < m {
                x = gather_rows(&x, &out_rows, d);
                m = out_rows.len();
            }
            self.ffn_rows(pool, layer, &mut x, &mut h, &mut o, m);
        }
        if nextn {
            let hidden = self.final_hidden(pool, &rows, mem, &out_rows, &x, rest)?;
            self.nextn_cells(pool, &rows, mem, &tokens, &hidden)?;
        }
        for c in &ub.chunks {
            mem.advance(c.seq, c.tokens)?;
        }
        let kept: Vec<usize> = if m == n { out_rows } else { (0..m).collect() };
        self.head.forward(&self.file, pool, &kept, &x, logits);
        if self.scales.logit_div != 1.0 {
            let s = 1.0 / self.scales.logit_div;
            logits.iter_mut().for_each(|v| *v *= s);
        }
        Ok(())
    }

    /// `x += s·ffn(norm(x))` for the first `m` rows of `x` (`h`, `o`:
    /// scratch of at least as many rows).
    pub(super) fn ffn_rows(
        &self,
        pool: &ThreadPool,
        layer: &StackLayer,
        x: &mut [f32],
        h: &mut [f32],
        o: &mut [f32],
        m: usize,
    ) {
        let d = self.info.n_embd;
        if matches!(layer.ffn, FfnBlock::None) || m == 0 {
            return;
        }
        let w = layer.ffn_norm.as_ref().unwrap_or(&layer.norm);
        let (h, o) = (&mut h[..m * d], &mut o[..m * d]);
        norm_rows(pool, x, w, self.eps, h, d);
        match &layer.ffn {
            FfnBlock::Dense(f) => f.forward(&self.file, pool, h, o),
            FfnBlock::Moe(f) => f.forward(&self.file, pool, h, o),
            FfnBlock::MoeGatedShared(f) => f.forward(&self.file, pool, h, o),
            FfnBlock::None => {}
        }
        if let Some(sw) = &layer.sandwich {
            norm_rows_inplace(pool, o, &sw.ffn, self.eps, d);
        }
        add_scaled_rows(pool, &mut x[..m * d], self.scales.residual, o, d);
    }

    /// The sandwich norm of `layer`'s mixer output `o` (rows of `d`), if it
    /// has one.
    pub(super) fn post_mixer_norm(&self, pool: &ThreadPool, layer: &StackLayer, o: &mut [f32]) {
        if let Some(sw) = &layer.sandwich {
            norm_rows_inplace(pool, o, &sw.mixer, self.eps, self.info.n_embd);
        }
    }
}

/// What the last layer of a pass that computed only some rows (a prompt's
/// logits row) needs to compute the others: its input, and its mixer's
/// output of every row where the mixer computed them all (recurrent
/// mixers; attention computes the asked rows only and runs again).
pub(super) struct LastRows {
    pub x: Scratch,
    pub mixed: Option<Scratch>,
}

/// A scratch copy of `x`.
fn copy_of(x: &[f32]) -> Scratch {
    let mut s = Scratch::dirty(x.len());
    s.copy_from_slice(x);
    s
}

/// `h = RMSNorm(x)·w` row by row (`[n, d]`), rows spread over the pool.
pub(crate) fn norm_rows(
    pool: &ThreadPool,
    x: &[f32],
    w: &[f32],
    eps: f32,
    h: &mut [f32],
    d: usize,
) {
    pool.rows_mut(h, d, 16, |r0, part| {
        rms_norm(&x[r0 * d..r0 * d + part.len()], Some(w), eps, part, d)
    });
}

/// `x = RMSNorm(x)·w` row by row (`[n, d]`), rows spread over the pool.
pub(crate) fn norm_rows_inplace(pool: &ThreadPool, x: &mut [f32], w: &[f32], eps: f32, d: usize) {
    pool.rows_mut(x, d, 16, |_, part| rms_norm_inplace(part, Some(w), eps, d));
}

/// `x += s·o` (`[n, d]`), rows spread over the pool.
pub(super) fn add_scaled_rows(pool: &ThreadPool, x: &mut [f32], s: f32, o: &[f32], d: usize) {
    pool.rows_mut(x, d, 16, |r0, part| {
        part.iter_mut()
            .zip(&o[r0 * d..])
            .for_each(|(a, b)| *a += s * b)
    });
}
