//! Nemotron-H (`nemotron_h`, `nemotron_h_moe`): each layer is exactly one
//! block on the residual — Mamba-2 (`M`), attention without positional
//! encoding (`*`), a squared-ReLU MLP (`-`) or a mixture of squared-ReLU
//! experts (`E`: sigmoid router with a score-correction bias for choosing,
//! top-k, optionally renormalised, scaled) plus a shared expert.

use super::blocks::attention::Attention;
use super::blocks::ffn::{Activation, DenseFfn, Experts, Gating, Moe};
use super::blocks::mamba2_mixer::{Mamba2Mixer, Mamba2Params};
use super::blocks::stack::{DecoderStack, FfnBlock, MixerBlock, Scales, StackLayer};
use super::hparams::{attention_params, base_info, n_ff, norm_eps};
use super::nextn::{HeadNorm, NextnBlock};
use super::plan::Mixer;
use super::weights::Loader;
use super::{LayerPlan, ModelError, ModelInfo};
use coil_gguf::GgufFile;
use std::sync::Arc;

fn relu2_moe(ld: &Loader, info: &ModelInfo, l: usize) -> Result<Moe, ModelError> {
    let d = info.n_embd;
    let n_expert = ld.u_in("expert_count", 1, 1 << 16)?;
    let n_used = ld.u_in("expert_used_count", 1, n_expert)?;
    let ff = match ld.u_opt("expert_feed_forward_length")? {
        Some(f) => f,
        None => n_ff(ld, info, l)?,
    };
    let n = |t: &str| format!("blk.{l}.ffn_{t}.weight");
    let bias_name = format!("blk.{l}.exp_probs_b.bias");
    let select_bias = if ld.has(&bias_name) {
        Some(ld.vector(&bias_name, &[n_expert])?)
    } else {
        None
    };
    let shared = match ld.u_opt("expert_shared_feed_forward_length")? {
        Some(sf) if sf > 0 && ld.has(&format!("blk.{l}.ffn_up_shexp.weight")) => {
            Some(DenseFfn::load(ld, l, "_shexp", d, sf, Activation::Relu2)?)
        }
        _ => None,
    };
    Ok(Moe {
        router: ld.matrix(&n("gate_inp"), n_expert, d)?,
        up: Experts::load(ld, &n("up_exps"), n_expert, ff, d)?,
        gate: None,
        down: Experts::load(ld, &n("down_exps"), n_expert, d, ff)?,
        gating: Gating::Sigmoid,
        select_bias,
        groups: None,
        n_used,
        norm_weights: ld.bool_opt("expert_weights_norm").unwrap_or(false),
        weights_scale: ld.f32_opt("expert_weights_scale")?.unwrap_or(0.0),
        act: Activation::Relu2,
        shared,
    })
}

/// The MLP width of layer `l`; where llama.cpp's converter wrote 0 (a
/// pattern mixing dense and MoE layers), the width of `ffn_up`.
fn dense_width(ld: &Loader, info: &ModelInfo, l: usize) -> Result<usize, ModelError> {
    match n_ff(ld, info, l)? {
        0 => match ld.file.tensor_info(&format!("blk.{l}.ffn_up.weight")) {
            Some(t) if t.dims.len() == 2 => Ok(t.dims[1] as usize),
            _ => Err(ModelError::MissingTensor(format!("blk.{l}.ffn_up.weight"))),
        },
        f => Ok(f),
    }
}

/// Trunk layer `l`: exactly one block (`M`, `*`, `-` or `E`) behind
/// `attn_norm`.
fn trunk_layer(
    ld: &Loader,
    info: &ModelInfo,
    l: usize,
    mixer: Mixer,
    eps: f32,
) -> Result<StackLayer, ModelError> {
    let d = info.n_embd;
    let (mixer, ffn) = match mixer {
        Mixer::Attention => (
            MixerBlock::Attention(Box::new(Attention::load(
                ld,
                l,
                attention_params(ld, info, l, None)?,
            )?)),
            FfnBlock::None,
        ),
        Mixer::None if ld.has(&format!("blk.{l}.ffn_gate_inp.weight")) => (
            MixerBlock::None,
            FfnBlock::Moe(Box::new(relu2_moe(ld, info, l)?)),
        ),
        Mixer::None => (
            MixerBlock::None,
            FfnBlock::Dense(Box::new(DenseFfn::load(
                ld,
                l,
                "",
                d,
                dense_width(ld, info, l)?,
                Activation::Relu2,
            )?)),
        ),
        _ => (
            MixerBlock::Mamba2(Box::new(Mamba2Mixer::load(
                ld,
                l,
                Mamba2Params::from_gguf(ld, d, eps)?,
            )?)),
            FfnBlock::None,
        ),
    };
    Ok(StackLayer {
        sandwich: None,
        norm: ld.vector(&format!("blk.{l}.attn_norm.weight"), &[d])?,
        mixer,
        ffn_norm: None,
        ffn,
    })
}

/// The NextN block's decoder layer (Nemotron-3's MTP layout): attention
/// without positional encoding behind `attn_norm`, then the relu² experts
/// behind `post_attention_norm`.
fn nextn_layer(ld: &Loader, info: &ModelInfo, l: usize) -> Result<StackLayer, ModelError> {
    let d = info.n_embd;
    Ok(StackLayer {
        sandwich: None,
        norm: ld.vector(&format!("blk.{l}.attn_norm.weight"), &[d])?,
        mixer: MixerBlock::Attention(Box::new(Attention::load(
            ld,
            l,
            attention_params(ld, info, l, None)?,
        )?)),
        ffn_norm: Some(ld.vector(&format!("blk.{l}.post_attention_norm.weight"), &[d])?),
        ffn: FfnBlock::Moe(Box::new(relu2_moe(ld, info, l)?)),
    })
}

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<DecoderStack, ModelError> {
    let arch = plan.arch.clone();
    let ld = Loader::new(&file, &arch);
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let layers = (info.plan.layers.iter().enumerate())
        .map(|(l, kind)| trunk_layer(&ld, &info, l, kind.mixer, eps))
        .collect::<Result<Vec<_>, _>>()?;
    let nextn = NextnBlock::load_tail(&ld, &info, HeadNorm::Layer, |l| nextn_layer(&ld, &info, l))?;
    Ok(DecoderStack::build(file.clone(), info, layers, eps, Scales::default())?.with_nextn(nextn))
}
