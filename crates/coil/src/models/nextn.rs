//! NextN / multi-token-prediction (MTP) blocks: the last
//! `{arch}.nextn_predict_layers` blocks of a file (llama.cpp's converter
//! appends them after the trunk for Nemotron-H-MoE, Qwen3.5, Qwen3.5-MoE
//! and Qwen3-Next unless told `--no-mtp`). They are not part of the
//! trunk's forward pass: the plan ([`super::LayerPlan::nextn`]) keeps them
//! out of the trunk, and the loader keeps their weights here for drafting
//! the token after next (speculative decoding, `--spec mtp`). Per block, as
//! the architectures define it (Qwen3-Next / Qwen3.5's `mtp.*`,
//! Nemotron-3's `mtp.layers.*`) and llama.cpp's MTP graphs run it:
//!
//! ```text
//! x = eh_proj · [RMSNorm(embed(t_p))·enorm ; RMSNorm(h_{p−1})·hnorm]   (2·d → d)
//! x = layer(x)                       an ordinary decoder block (below)
//! m = norm(x)·shared_head_norm       what a recursive step reads as h
//! logits = head(m)                   a guess at t_{p+1}
//! ```
//!
//! where `h_{p−1}` is the trunk's last hidden state at the position before
//! (after its final norm: what its output head reads; zeros at position 0,
//! as llama.cpp's draft-mtp pairs the first token), `embed` the block's own
//! `embed_tokens` or else the model's, `head` its own `shared_head_head` or
//! else the model's output, and `norm` RMSNorm (Qwen; the model's
//! `output_norm` when the block has no `shared_head_norm`) or LayerNorm
//! without bias (Nemotron-H).
//!
//! With the block's memory on ([`super::Model::new_memory_nextn`]) every
//! pass of the trunk also gives the block's attention cells for its tokens
//! — position p from (t_p, h_{p−1}) — and keeps h of the last position,
//! the state the block reads next, beside the recurrent state (so
//! rollback, forks, checkpoints and sessions carry both). The cells of a
//! few positions may wait, their inputs kept in that state, until drafting
//! needs them (`blocks/stack_nextn.rs`): decode steps while drafting
//! pauses cost the block nothing. A draft then
//! runs the block alone: from the token just sampled and that state, one
//! token per step, each step reading the block's own output `m` in place
//! of the trunk's hidden state; its cells sit past the sequence's length
//! until the verification pass writes those positions again.
use super::blocks::common::Embedding;
use super::blocks::stack::StackLayer;
use super::weights::{Loader, Matrix};
use super::{ModelError, ModelInfo};
use coil_gguf::GgufFile;
use coil_kernels::ops::norm::rms_norm;
use coil_kernels::{matmul, Scratch, ThreadPool};

/// The norm before a block's output head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadNorm {
    /// RMSNorm times the weight (Qwen3.5, Qwen3-Next).
    Rms,
    /// LayerNorm without bias, times the weight (Nemotron-H).
    Layer,
}

/// One NextN block's weights (block `index` of the file).
pub struct NextnBlock {
    /// Block index in the file (`blk.{index}.…`): the trunk's length plus
    /// the block's position in the tail.
    pub index: usize,
    /// `blk.N.nextn.eh_proj`: `[d, 2·d]`, applied to the concatenation
    /// [normed embedding ; normed hidden state].
    pub eh_proj: Matrix,
    /// `blk.N.nextn.enorm`: RMSNorm weight of the next token's embedding.
    pub enorm: Vec<f32>,
    /// `blk.N.nextn.hnorm`: RMSNorm weight of the trunk's hidden state.
    pub hnorm: Vec<f32>,
    /// `blk.N.nextn.shared_head_norm`: the norm before the output head
    /// (optional in Qwen files: the model's `output_norm` then).
    pub shared_head_norm: Option<Vec<f32>>,
    /// `blk.N.nextn.shared_head_head`: the block's own output head `[vocab,
    /// d]`; `None`: the model's output head.
    pub shared_head_head: Option<Matrix>,
    /// `blk.N.nextn.embed_tokens`: the block's own embedding `[vocab, d]`;
    /// `None`: the model's token embedding.
    pub embed_tokens: Option<Matrix>,
    /// The decoder block (`attn_norm`, its mixer, the norm before its
    /// feed-forward and the feed-forward), loaded as the architecture loads
    /// a trunk layer of the same kind.
    pub layer: StackLayer,
    /// How `shared_head_norm` normalises.
    pub head_norm: HeadNorm,
}

impl NextnBlock {
    /// Loads the tail of `info.plan`, each block's decoder layer by
    /// `load_layer(block index)`.
    pub fn load_tail(
        ld: &Loader,
        info: &ModelInfo,
        head_norm: HeadNorm,
        mut load_layer: impl FnMut(usize) -> Result<StackLayer, ModelError>,
    ) -> Result<Vec<NextnBlock>, ModelError> {
        let d = info.n_embd;
        let n_vocab = info.n_vocab;
        (info.plan.layers.len()..info.plan.n_blocks())
            .map(|i| {
                let name = |t: &str| format!("blk.{i}.nextn.{t}.weight");
                let vector_opt = |t: &str| -> Result<Option<Vec<f32>>, ModelError> {
                    let n = name(t);
                    ld.has(&n).then(|| ld.vector(&n, &[d])).transpose()
                };
                let matrix_opt = |t: &str| -> Result<Option<Matrix>, ModelError> {
                    let n = name(t);
                    ld.has(&n).then(|| ld.matrix(&n, n_vocab, d)).transpose()
                };
                Ok(NextnBlock {
                    index: i,
                    eh_proj: ld.matrix(&name("eh_proj"), d, 2 * d)?,
                    enorm: ld.vector(&name("enorm"), &[d])?,
                    hnorm: ld.vector(&name("hnorm"), &[d])?,
                    shared_head_norm: vector_opt("shared_head_norm")?,
                    shared_head_head: matrix_opt("shared_head_head")?,
                    embed_tokens: matrix_opt("embed_tokens")?,
                    layer: load_layer(i)?,
                    head_norm,
                })
            })
            .collect()
    }
}

impl NextnBlock {
    /// The block's input for `tokens` and the hidden states they read
    /// (`hidden`: `[n, d]`): `eh_proj · [RMSNorm(embed(t))·enorm ;
    /// RMSNorm(h)·hnorm]`, `[n, d]`.
    pub fn input(
        &self,
        file: &GgufFile,
        pool: &ThreadPool,
        embed: &Embedding,
        tokens: &[u32],
        hidden: &[f32],
        eps: f32,
    ) -> Result<Scratch, ModelError> {
        let d = self.enorm.len();
        let n = tokens.len();
        let mut e = Scratch::dirty(n * d);
        match &self.embed_tokens {
            Some(t) => {
                for (&tok, row) in tokens.iter().zip(e.chunks_exact_mut(d)) {
                    t.row_f32(file, tok as usize, row)?;
                }
            }
            None => embed.forward(file, tokens, &mut e)?,
        }
        // [n, 2·d]: each row its normed embedding, then its normed state.
        let mut cat = Scratch::dirty(n * 2 * d);
        for ((row, e), h) in cat
            .chunks_exact_mut(2 * d)
            .zip(e.chunks_exact(d))
            .zip(hidden.chunks_exact(d))
        {
            let (a, b) = row.split_at_mut(d);
            rms_norm(e, Some(&self.enorm), eps, a, d);
            rms_norm(h, Some(&self.hnorm), eps, b, d);
        }
        let mut x = Scratch::dirty(n * d);
        matmul(pool, &self.eh_proj.get(file), &cat, &mut x, n);
        Ok(x)
    }

    /// The norm before the head, row by row (`x`, `out`: `[n, d]`);
    /// `fallback` is the model's `output_norm`, for a block without its own.
    pub fn out_norm(&self, x: &[f32], fallback: &[f32], eps: f32, out: &mut [f32]) {
        let d = self.enorm.len();
        let w = self.shared_head_norm.as_deref().unwrap_or(fallback);
        for (x, y) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            match self.head_norm {
                HeadNorm::Rms => rms_norm(x, Some(w), eps, y, d),
                HeadNorm::Layer => layer_norm(x, w, eps, y),
            }
        }
    }
}

/// `y = (x − mean) / sqrt(var + eps) · w` (no bias), in f64 sums.
fn layer_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    let inv = 1.0 / (var + eps as f64).sqrt();
    for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
        *y = ((x as f64 - mean) * inv) as f32 * w;
    }
}

#[cfg(test)]
mod tests {
    use super::layer_norm;

    #[test]
    fn layer_norm_centres_and_scales() {
        let mut y = [0f32; 4];
        layer_norm(&[1.0, 2.0, 3.0, 4.0], &[1.0, 1.0, 2.0, 2.0], 0.0, &mut y);
        let s = 1.25f64.sqrt();
        let want = [-1.5 / s, -0.5 / s, 2.0 * 0.5 / s, 2.0 * 1.5 / s];
        for (a, b) in y.iter().zip(want) {
            assert!((*a as f64 - b).abs() < 1e-6, "{y:?}");
        }
    }
}
