//! Llama (`llama`): attention with RoPE ("normal" pairs — the converter
//! permuted Q/K rows) and a SwiGLU feed-forward in every layer (or a
//! mixture of experts, Mixtral-style, when the layer has a router).

use super::blocks::attention::Attention;
use super::blocks::ffn::{Activation, DenseFfn};
use super::blocks::stack::{DecoderStack, FfnBlock, MixerBlock, Scales, StackLayer};
use super::hparams::{attention_params, base_info, n_ff, norm_eps};
use super::jamba::swiglu_moe;
use super::weights::Loader;
use super::{LayerPlan, ModelError};
use coil_gguf::GgufFile;
use coil_kernels::ops::rope::RopeStyle;
use std::sync::Arc;

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<DecoderStack, ModelError> {
    let ld = Loader::new(&file, "llama");
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let d = info.n_embd;
    let mut layers = Vec::new();
    for l in 0..info.plan.layers.len() {
        let p = attention_params(&ld, &info, l, Some(RopeStyle::Normal))?;
        let ff = n_ff(&ld, &info, l)?;
        let ffn = if ld.has(&format!("blk.{l}.ffn_gate_inp.weight")) {
            FfnBlock::Moe(Box::new(swiglu_moe(&ld, &info, l, ff, true)?))
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
            mixer: MixerBlock::Attention(Box::new(Attention::load(&ld, l, p)?)),
            ffn_norm: Some(ld.vector(&format!("blk.{l}.ffn_norm.weight"), &[d])?),
            ffn,
        });
    }
    DecoderStack::build(file.clone(), info, layers, eps, Scales::default())
}
