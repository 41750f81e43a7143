//! Jamba (`jamba`): Mamba-1 layers with RMSNorms on δ, B, C, interleaved
//! with attention layers without positional encoding (per-layer
//! `head_count_kv`, 0 = Mamba); every layer then has a feed-forward, dense
//! SwiGLU or a mixture of experts (softmax router, top-k, weights not
//! renormalised).

use super::blocks::attention::Attention;
use super::blocks::ffn::{Activation, DenseFfn, Experts, Gating, Moe};
use super::blocks::mamba1_mixer::{Mamba1Mixer, Mamba1Params};
use super::blocks::stack::{DecoderStack, FfnBlock, MixerBlock, Scales, StackLayer};
use super::hparams::{attention_params, base_info, n_ff, norm_eps};
use super::weights::Loader;
use super::{LayerPlan, ModelError, ModelInfo};
use coil_gguf::GgufFile;
use std::sync::Arc;

/// A SwiGLU mixture of experts, `blk.{l}.ffn_{gate,up,down}_exps`.
pub(crate) fn swiglu_moe(
    ld: &Loader,
    info: &ModelInfo,
    l: usize,
    n_ff: usize,
    norm_weights: bool,
) -> Result<Moe, ModelError> {
    let n_expert = ld.u_in("expert_count", 1, 1 << 16)?;
    let n_used = ld.u_in("expert_used_count", 1, n_expert)?;
    let d = info.n_embd;
    let n = |t: &str| format!("blk.{l}.ffn_{t}.weight");
    Ok(Moe {
        router: ld.matrix(&n("gate_inp"), n_expert, d)?,
        up: Experts::load(ld, &n("up_exps"), n_expert, n_ff, d)?,
        gate: Some(Experts::load(ld, &n("gate_exps"), n_expert, n_ff, d)?),
        down: Experts::load(ld, &n("down_exps"), n_expert, d, n_ff)?,
        gating: Gating::Softmax,
        select_bias: None,
        groups: None,
        n_used,
        norm_weights,
        weights_scale: ld.f32_opt("expert_weights_scale")?.unwrap_or(0.0),
        act: Activation::SwiGlu,
        shared: None,
    })
}

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<DecoderStack, ModelError> {
    let ld = Loader::new(&file, "jamba");
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let d = info.n_embd;
    let mut layers = Vec::new();
    for (l, kind) in info.plan.layers.iter().enumerate() {
        let mixer = if kind.mixer.has_attention() {
            MixerBlock::Attention(Box::new(Attention::load(
                &ld,
                l,
                attention_params(&ld, &info, l, None)?,
            )?))
        } else {
            let p = Mamba1Params::from_gguf(&ld, d, eps)?;
            MixerBlock::Mamba1(Box::new(Mamba1Mixer::load(&ld, l, p)?))
        };
        let ff = n_ff(&ld, &info, l)?;
        let ffn = if ld.has(&format!("blk.{l}.ffn_gate_inp.weight")) {
            FfnBlock::Moe(Box::new(swiglu_moe(&ld, &info, l, ff, false)?))
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
    DecoderStack::build(file.clone(), info, layers, eps, Scales::default())
}
