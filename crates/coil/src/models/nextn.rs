//! NextN / multi-token-prediction (MTP) blocks: the last
//! `{arch}.nextn_predict_layers` blocks of a file (llama.cpp's converter
//! appends them after the trunk for Nemotron-H-MoE, Qwen3.5, Qwen3.5-MoE
//! and Qwen3-Next unless told `--no-mtp`). They are not part of the
//! forward pass: the plan ([`super::LayerPlan::nextn`]) keeps them out of
//! the trunk, and the loader keeps their weights here for a draft of the
//! next-but-one token (speculative decoding). Per block, as llama.cpp's
//! MTP graphs run it:
//!
//! ```text
//! h' = eh_proj · [RMSNorm(embed(t_{i+1}))·enorm ; RMSNorm(h_i)·hnorm]   (2·d → d)
//! h' = layer(h')                     an ordinary decoder block (below)
//! logits = head(norm(h')·shared_head_norm)
//! ```
//!
//! where `h_i` is the trunk's last hidden state (before its output norm),
//! `embed` the block's own `embed_tokens` or else the model's, `head` its
//! own `shared_head_head` or else the model's output, and `norm` RMSNorm
//! (Qwen) or LayerNorm without bias (Nemotron-H).

use super::blocks::stack::StackLayer;
use super::weights::{Loader, Matrix};
use super::{ModelError, ModelInfo};

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
}

impl NextnBlock {
    /// Loads the tail of `info.plan`, each block's decoder layer by
    /// `load_layer(block index)`.
    pub fn load_tail(
        ld: &Loader,
        info: &ModelInfo,
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
                })
            })
            .collect()
    }
}
