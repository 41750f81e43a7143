//! Mamba (-1) (`mamba`, also Falcon-Mamba with weightless δ/B/C norms):
//! per layer `x ← x + Mamba1Mixer(RMSNorm(x))`; no feed-forward.

use super::blocks::mamba1_mixer::{Mamba1Mixer, Mamba1Params};
use super::blocks::stack::{DecoderStack, FfnBlock, MixerBlock, Scales, StackLayer};
use super::hparams::{base_info, norm_eps};
use super::weights::Loader;
use super::{LayerPlan, ModelError};
use coil_gguf::GgufFile;
use std::sync::Arc;

pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<DecoderStack, ModelError> {
    let ld = Loader::new(&file, "mamba");
    let info = base_info(&ld, plan)?;
    let eps = norm_eps(&ld)?;
    let p = Mamba1Params::from_gguf(&ld, info.n_embd, eps)?;
    let layers = (0..info.plan.layers.len())
        .map(|l| {
            Ok(StackLayer {
                sandwich: None,
                norm: ld.vector(&format!("blk.{l}.attn_norm.weight"), &[info.n_embd])?,
                mixer: MixerBlock::Mamba1(Box::new(Mamba1Mixer::load(&ld, l, p)?)),
                ffn_norm: None,
                ffn: FfnBlock::None,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    DecoderStack::build(file.clone(), info, layers, eps, Scales::default())
}
