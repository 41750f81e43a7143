//! Falcon-H1 (`falcon-h1`): every layer runs attention (NeoX RoPE) and a
//! Mamba-2 mixer side by side on the same normed input and adds both to
//! the residual, then a SwiGLU feed-forward. The µP multipliers were folded
//! into the weights by the converter; none are applied here.

use super::blocks::attention::Attention;
use super::blocks::ffn::{Activation, DenseFfn};
use super::blocks::mamba2_mixer::{Mamba2Mixer, Mamba2Params};
use super::blocks::stack::{DecoderStack, FfnBlock, MixerBlock, Scales, StackLayer};
use super::hparams::{attention_params, base_info, n_ff, norm_eps};
use super::weights::Loader;
use super::{LayerPlan, ModelError};
use coil_gguf::GgufFile;
use coil_kernels::ops::rope::RopeStyle;
use std::sync::Arc;

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<DecoderStack, ModelError> {
    let ld = Loader::new(&file, "falcon-h1");
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let d = info.n_embd;
    let mut layers = Vec::new();
    for l in 0..info.plan.layers.len() {
        let attn = Attention::load(
            &ld,
            l,
            attention_params(&ld, &info, l, Some(RopeStyle::Neox))?,
        )?;
        let ssm = Mamba2Mixer::load(&ld, l, Mamba2Params::from_gguf(&ld, d, eps)?)?;
        // llama.cpp's converter names this norm without ".weight".
        let ffn_norm_name = if ld.has(&format!("blk.{l}.ffn_norm")) {
            format!("blk.{l}.ffn_norm")
        } else {
            format!("blk.{l}.ffn_norm.weight")
        };
        layers.push(StackLayer {
            sandwich: None,
            norm: ld.vector(&format!("blk.{l}.attn_norm.weight"), &[d])?,
            mixer: MixerBlock::Parallel(Box::new(attn), Box::new(ssm)),
            ffn_norm: Some(ld.vector(&ffn_norm_name, &[d])?),
            ffn: FfnBlock::Dense(Box::new(DenseFfn::load(
                &ld,
                l,
                "",
                d,
                n_ff(&ld, &info, l)?,
                Activation::SwiGlu,
            )?)),
        });
    }
    DecoderStack::build(file.clone(), info, layers, eps, Scales::default())
}
