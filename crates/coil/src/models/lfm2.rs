//! LFM2 (`lfm2`) and LFM2-MoE (`lfm2moe`), Liquid AI's short-convolution
//! hybrids. Every layer is
//!
//! ```text
//! x += mixer(RMSNorm(x))      mixer: gated short conv, or attention
//! x += ffn(RMSNorm_ffn(x))    ffn: SwiGLU, or (LFM2-MoE, after the
//!                             leading dense layers) SwiGLU experts
//! logits = output(RMSNorm(x))
//! ```
//!
//! * short conv (`head_count_kv` 0 in the per-layer array): see
//!   [`ShortConv`], window `shortconv.l_cache`;
//! * attention: grouped-query, per-head RMSNorms of q and k before RoPE
//!   (NeoX halves: the converter does not permute Q/K), scale 1/√head_dim;
//! * LFM2-MoE's router: sigmoid scores; the experts are chosen by score +
//!   `exp_probs_b` (the checkpoint's `expert_bias`) but weighted by the
//!   scores alone, renormalised over the chosen k (unless
//!   `expert_weights_norm` is false: llama.cpp always renormalises for this
//!   arch), times `expert_weights_scale` if present (transformers'
//!   `routed_scaling_factor`; llama.cpp ignores it for this arch);
//! * the final norm is `token_embd_norm.weight` in llama.cpp's files
//!   (transformers' `embedding_norm`, applied after the last layer).

use super::blocks::attention::{Attention, QkNorm};
use super::blocks::ffn::{Activation, DenseFfn, Gating};
use super::blocks::short_conv::{ShortConv, ShortConvParams};
use super::blocks::stack::{DecoderStack, FfnBlock, MixerBlock, Scales, StackLayer};
use super::hparams::{attention_params, base_info, n_ff, norm_eps};
use super::jamba::swiglu_moe;
use super::plan::{FeedForward, Mixer};
use super::weights::Loader;
use super::{LayerPlan, ModelError, ModelInfo};
use coil_gguf::GgufFile;
use coil_kernels::ops::rope::RopeStyle;
use std::sync::Arc;

/// The final norm's name in llama.cpp's LFM2 files.
const OUTPUT_NORM: &str = "token_embd_norm.weight";

/// LFM2-MoE's mixture of SwiGLU experts for layer `l`.
fn moe(ld: &Loader, info: &ModelInfo, l: usize) -> Result<FfnBlock, ModelError> {
    let n_ff = ld.u_in("expert_feed_forward_length", 1, 1 << 20)?;
    // llama.cpp always renormalises for this arch; coil's converter writes
    // `expert_weights_norm` false for a checkpoint with norm_topk_prob off.
    let norm = ld.bool_opt("expert_weights_norm").unwrap_or(true);
    let mut m = swiglu_moe(ld, info, l, n_ff, norm)?;
    // llama.cpp's expert_gating_func: 1 softmax, 2 sigmoid (what the
    // converter writes for LFM2-MoE, and the default here).
    m.gating = match ld.u_opt("expert_gating_func")? {
        None | Some(2) => Gating::Sigmoid,
        Some(1) => Gating::Softmax,
        Some(v) => {
            return Err(ModelError::BadKey {
                key: format!("{}.expert_gating_func", ld.arch),
                reason: format!("{v} is neither 1 (softmax) nor 2 (sigmoid)"),
            })
        }
    };
    let n_expert = m.router.rows;
    m.select_bias = Some(ld.vector(&format!("blk.{l}.exp_probs_b.bias"), &[n_expert])?);
    Ok(FfnBlock::Moe(Box::new(m)))
}

/// Refuses what llama.cpp's LFM2 graph runs differently and coil does not:
/// sliding-window attention (LFM2.5 audio tokenizer) and bidirectional
/// (embedding) models.
fn check_supported(ld: &Loader) -> Result<(), ModelError> {
    if ld.u_opt("attention.sliding_window")?.unwrap_or(0) > 0 {
        return Err(ModelError::BadKey {
            key: format!("{}.attention.sliding_window", ld.arch),
            reason: "sliding-window attention is not supported for LFM2".into(),
        });
    }
    if ld.bool_opt("attention.causal") == Some(false) {
        return Err(ModelError::BadKey {
            key: format!("{}.attention.causal", ld.arch),
            reason: "non-causal (embedding) LFM2 models are not supported".into(),
        });
    }
    Ok(())
}

/// An error when the layer plan (from `attention.head_count_kv`) says one
/// mixer and the file holds the other's tensors.
fn check_mixer_tensors(ld: &Loader, l: usize, mixer: Mixer) -> Result<(), ModelError> {
    let (wrong, want) = match mixer {
        Mixer::Attention => ("shortconv.in_proj", "an attention"),
        _ => ("attn_q", "a short-convolution"),
    };
    let name = format!("blk.{l}.{wrong}.weight");
    if ld.has(&name) {
        return Err(ModelError::Tensor {
            name,
            reason: format!(
                "layer {l} is {want} layer by {}.attention.head_count_kv, but holds this tensor",
                ld.arch
            ),
        });
    }
    Ok(())
}

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<DecoderStack, ModelError> {
    let arch = plan.arch.clone();
    let ld = Loader::new(&file, &arch);
    check_supported(&ld)?;
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let d = info.n_embd;
    let n_layer = info.plan.layers.len();
    // Layers before this one have a dense feed-forward, the rest experts.
    let n_dense = if arch == "lfm2moe" {
        ld.u_opt("leading_dense_block_count")?.unwrap_or(0)
    } else {
        n_layer
    };
    let conv = ShortConvParams::from_gguf(&ld, d)?;
    let mut layers = Vec::with_capacity(n_layer);
    for (l, kind) in info.plan.layers.iter().enumerate() {
        check_mixer_tensors(&ld, l, kind.mixer)?;
        let mixer = if kind.mixer.has_attention() {
            let p = attention_params(&ld, &info, l, Some(RopeStyle::Neox))?;
            let mut a = Attention::load(&ld, l, p)?;
            a.qk_norm = Some(QkNorm::load(&ld, l, p.head_dim, eps)?);
            MixerBlock::Attention(Box::new(a))
        } else {
            MixerBlock::ShortConv(Box::new(ShortConv::load(&ld, l, conv)?))
        };
        let want = if l < n_dense {
            FeedForward::Dense
        } else {
            FeedForward::Moe
        };
        if kind.ffn != want {
            let (name, reason) = match want {
                FeedForward::Dense => (
                    format!("blk.{l}.ffn_down.weight"),
                    format!("layer {l} should have a dense feed-forward (leading_dense_block_count {n_dense})"),
                ),
                _ => (
                    format!("blk.{l}.ffn_gate_inp.weight"),
                    format!("layer {l} should have experts (leading_dense_block_count {n_dense})"),
                ),
            };
            return Err(ModelError::Tensor { name, reason });
        }
        let ffn = match want {
            FeedForward::Dense => FfnBlock::Dense(Box::new(DenseFfn::load(
                &ld,
                l,
                "",
                d,
                n_ff(&ld, &info, l)?,
                Activation::SwiGlu,
            )?)),
            _ => moe(&ld, &info, l)?,
        };
        layers.push(StackLayer {
            sandwich: None,
            norm: ld.vector(&format!("blk.{l}.attn_norm.weight"), &[d])?,
            mixer,
            ffn_norm: Some(ld.vector(&format!("blk.{l}.ffn_norm.weight"), &[d])?),
            ffn,
        });
    }
    DecoderStack::build_with_output_norm(
        file.clone(),
        info,
        layers,
        eps,
        Scales::default(),
        OUTPUT_NORM,
    )
}
