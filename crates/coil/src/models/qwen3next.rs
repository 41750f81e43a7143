//! Qwen3-Next (`qwen3next`): Gated DeltaNet layers and gated attention
//! layers (every `full_attention_interval`-th, or as `attention.
//! recurrent_layers` says), 3 : 1 in the released models. Each layer:
//!
//! ```text
//! x += mixer(RMSNorm(x))                 (attn_norm)
//! x += moe(RMSNorm(x))                   (post_attention_norm)
//! ```
//!
//! with RMSNorm weights (1 + w) baked in by the converter; attention rotates
//! the first `rope.dimension_count` lanes of each head (NeoX halves); the
//! mixture of experts is softmax top-k, renormalised, plus a shared expert
//! scaled by `sigmoid(ffn_gate_inp_shexp · x)`. The value heads of the
//! DeltaNet layers keep the checkpoint's grouped order.

use super::blocks::ffn::{Activation, DenseFfn, MoeGatedShared};
use super::blocks::gated_attention::GatedAttention;
use super::blocks::gated_delta_mixer::{GatedDeltaMixer, GatedDeltaParams};
use super::blocks::stack::{DecoderStack, FfnBlock, MixerBlock, Scales, StackLayer};
use super::hparams::{attention_params, base_info, n_ff, norm_eps};
use super::jamba::swiglu_moe;
use super::nextn::{HeadNorm, NextnBlock};
use super::weights::Loader;
use super::{LayerPlan, ModelError, ModelInfo};
use coil_gguf::GgufFile;
use coil_kernels::ops::delta::HeadOrder;
use coil_kernels::ops::rope::RopeStyle;
use std::sync::Arc;

/// The feed-forward of layer `l`: experts plus the gated shared expert
/// where the layer has a router, else a dense SwiGLU.
pub(crate) fn qwen_ffn(ld: &Loader, info: &ModelInfo, l: usize) -> Result<FfnBlock, ModelError> {
    let d = info.n_embd;
    if !ld.has(&format!("blk.{l}.ffn_gate_inp.weight")) {
        let ff = n_ff(ld, info, l)?;
        return Ok(FfnBlock::Dense(Box::new(DenseFfn::load(
            ld,
            l,
            "",
            d,
            ff,
            Activation::SwiGlu,
        )?)));
    }
    let ff = match ld.u_opt("expert_feed_forward_length")? {
        Some(f) => f,
        None => n_ff(ld, info, l)?,
    };
    let norm = ld.bool_opt("expert_weights_norm").unwrap_or(true);
    let moe = swiglu_moe(ld, info, l, ff, norm)?;
    let shared_ff = match ld.u_opt("expert_shared_feed_forward_length")? {
        Some(f) => f,
        None => n_ff(ld, info, l)?,
    };
    Ok(FfnBlock::MoeGatedShared(Box::new(MoeGatedShared {
        moe,
        shared: DenseFfn::load(ld, l, "_shexp", d, shared_ff, Activation::SwiGlu)?,
        shared_gate: ld.matrix(&format!("blk.{l}.ffn_gate_inp_shexp.weight"), 1, d)?,
    })))
}

/// The layers of a Qwen3-Next-style stack: value heads in `order`, the
/// feed-forward chosen per layer by [`qwen_ffn`].
pub(crate) fn load_stack(
    file: Arc<GgufFile>,
    plan: LayerPlan,
    order: HeadOrder,
) -> Result<DecoderStack, ModelError> {
    let arch = plan.arch.clone();
    let ld = Loader::new(&file, &arch);
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let d = info.n_embd;
    // One decoder layer, gated attention or Gated DeltaNet; the NextN
    // blocks are full-attention layers of the same form.
    let layer = |l: usize, attention: bool| -> Result<StackLayer, ModelError> {
        let mixer = if attention {
            let p = attention_params(&ld, &info, l, Some(RopeStyle::Neox))?;
            MixerBlock::GatedAttention(Box::new(GatedAttention::load(&ld, l, p, eps)?))
        } else {
            let p = GatedDeltaParams::from_gguf(&ld, d, eps, order)?;
            MixerBlock::GatedDeltaNet(Box::new(GatedDeltaMixer::load(&ld, l, p)?))
        };
        Ok(StackLayer {
            sandwich: None,
            norm: ld.vector(&format!("blk.{l}.attn_norm.weight"), &[d])?,
            mixer,
            ffn_norm: Some(ld.vector(&format!("blk.{l}.post_attention_norm.weight"), &[d])?),
            ffn: qwen_ffn(&ld, &info, l)?,
        })
    };
    let layers = (info.plan.layers.iter().enumerate())
        .map(|(l, kind)| layer(l, kind.mixer.has_attention()))
        .collect::<Result<Vec<_>, _>>()?;
    let nextn = NextnBlock::load_tail(&ld, &info, HeadNorm::Rms, |l| layer(l, true))?;
    Ok(DecoderStack::build(file.clone(), info, layers, eps, Scales::default())?.with_nextn(nextn))
}

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<DecoderStack, ModelError> {
    load_stack(file, plan, HeadOrder::Grouped)
}
