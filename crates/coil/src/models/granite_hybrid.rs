//! Bamba and Granite 4.0-H (`granitehybrid`): Mamba-2 layers and attention
//! layers (per-layer `head_count_kv`, 0 = Mamba-2), each followed by a
//! SwiGLU feed-forward — dense, or experts (softmax over all, top-k,
//! renormalised) plus a shared expert. RoPE ("normal" pairs on the first
//! `rope.dimension_count` lanes) when `rope.scaling.finetuned` is true,
//! none otherwise. Granite's µP multipliers: embedding, residual,
//! attention scale, logits ÷ logit_scale.

use super::blocks::attention::{bamba_qk_lane_fix, Attention};
use super::blocks::ffn::{Activation, DenseFfn};
use super::blocks::mamba2_mixer::{Mamba2Mixer, Mamba2Params};
use super::blocks::stack::{DecoderStack, FfnBlock, MixerBlock, Scales, StackLayer};
use super::hparams::{attention_params, base_info, n_ff, norm_eps};
use super::jamba::swiglu_moe;
use super::weights::Loader;
use super::{LayerPlan, ModelError};
use coil_gguf::GgufFile;
use coil_kernels::ops::rope::RopeStyle;
use std::sync::Arc;

/// Written by coil's converter when it permuted only the rotary lanes of
/// Q/K (llama.cpp's converter permutes the whole head).
pub const PARTIAL_PERMUTE_KEY: &str = "coil.rope.partial_permute";

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<DecoderStack, ModelError> {
    let ld = Loader::new(&file, "granitehybrid");
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let d = info.n_embd;
    let rope = ld.bool_opt("rope.scaling.finetuned").unwrap_or(true);
    let partial_permuted = file
        .metadata()
        .get_bool(PARTIAL_PERMUTE_KEY)
        .unwrap_or(false);
    let n_expert = ld.u_opt("expert_count")?.unwrap_or(0);
    let n_ff_shared = ld.u_opt("expert_shared_feed_forward_length")?.unwrap_or(0);
    let mut layers = Vec::new();
    for (l, kind) in info.plan.layers.iter().enumerate() {
        let mixer = if kind.mixer.has_attention() {
            let p = attention_params(&ld, &info, l, rope.then_some(RopeStyle::Normal))?;
            let mut a = Attention::load(&ld, l, p)?;
            if let Some(r) = p.rope {
                if r.n_rot < p.head_dim && !partial_permuted {
                    a.qk_lane_perm = Some(bamba_qk_lane_fix(p.head_dim, r.n_rot));
                }
            }
            MixerBlock::Attention(Box::new(a))
        } else {
            MixerBlock::Mamba2(Box::new(Mamba2Mixer::load(
                &ld,
                l,
                Mamba2Params::from_gguf(&ld, d, eps)?,
            )?))
        };
        let ff = n_ff(&ld, &info, l)?;
        let ffn = if n_expert > 0 {
            let mut moe = swiglu_moe(&ld, &info, l, ff, true)?;
            if n_ff_shared > 0 {
                moe.shared = Some(DenseFfn::load(
                    &ld,
                    l,
                    "_shexp",
                    d,
                    n_ff_shared,
                    Activation::SwiGlu,
                )?);
            }
            FfnBlock::Moe(Box::new(moe))
        } else {
            FfnBlock::Dense(Box::new(DenseFfn::load(
                &ld,
                l,
                "",
                d,
                ff,
                Activation::SwiGlu,
            )?))
        };
        layers.push(StackLayer {
            sandwich: None,
            norm: ld.vector(&format!("blk.{l}.attn_norm.weight"), &[d])?,
            mixer,
            ffn_norm: Some(ld.vector(&format!("blk.{l}.ffn_norm.weight"), &[d])?),
            ffn,
        });
    }
    let nonzero = |v: Option<f32>| v.filter(|x| *x != 0.0).unwrap_or(1.0);
    let scales = Scales {
        embedding: nonzero(ld.f32_opt("embedding_scale")?),
        residual: nonzero(ld.f32_opt("residual_scale")?),
        logit_div: nonzero(ld.f32_opt("logit_scale")?),
    };
    DecoderStack::build(file.clone(), info, layers, eps, scales)
}
