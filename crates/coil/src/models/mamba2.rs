//! Mamba-2 language model (`mamba2`): token embedding, then per layer
//! `x ← x + Mamba2Mixer(RMSNorm(x))`, final RMSNorm, output (tied or not).

use super::blocks::common::{check_ubatch, Embedding, OutputHead};
use super::blocks::mamba2_mixer::{Mamba2Mixer, Mamba2Params};
use super::weights::Loader;
use super::{LayerPlan, Model, ModelError, ModelInfo, UBatch};
use crate::memory::{Memory, RecurrentMemory, SeqId};
use coil_gguf::GgufFile;
use coil_kernels::ops::norm::rms_norm;
use coil_kernels::ThreadPool;
use std::ops::Range;
use std::sync::Arc;

struct Layer {
    norm: Vec<f32>,
    mixer: Mamba2Mixer,
}

pub struct Mamba2 {
    file: Arc<GgufFile>,
    info: ModelInfo,
    embed: Embedding,
    layers: Vec<Layer>,
    head: OutputHead,
    eps: f32,
}

impl Mamba2 {
    pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<Self, ModelError> {
        let ld = Loader::new(&file, "mamba2");
        let info = super::mamba::base_info(&ld, plan)?;
        let eps = ld
            .f32_opt("attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-5);
        let p = Mamba2Params::from_gguf(&ld, info.n_embd, eps)?;
        let layers = (0..info.plan.layers.len())
            .map(|l| {
                Ok(Layer {
                    norm: ld.vector(&format!("blk.{l}.attn_norm.weight"), &[info.n_embd])?,
                    mixer: Mamba2Mixer::load(&ld, l, p)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let embed = Embedding::load(&ld, info.n_vocab, info.n_embd)?;
        let head = OutputHead::load(&ld, info.n_vocab, info.n_embd, eps)?;
        Ok(Mamba2 {
            file,
            info,
            embed,
            layers,
            head,
            eps,
        })
    }
}

impl Model for Mamba2 {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_memory(&self, n_seq_max: usize, n_ctx: usize) -> Memory {
        let shapes = self
            .layers
            .iter()
            .map(|l| Some(l.mixer.p.state_shape()))
            .collect();
        Memory::new(
            Some(RecurrentMemory::new(shapes, n_seq_max)),
            n_seq_max,
            n_ctx,
        )
    }

    fn forward(
        &self,
        pool: &ThreadPool,
        ub: &UBatch,
        mem: &mut Memory,
    ) -> Result<Vec<f32>, ModelError> {
        check_ubatch(ub, mem)?;
        let d = self.info.n_embd;
        let n = ub.n_tokens();
        let tokens: Vec<u32> = ub
            .chunks
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect();
        let chunks: Vec<(SeqId, Range<usize>)> = ub
            .chunks
            .iter()
            .map(|c| c.seq)
            .zip(ub.row_ranges())
            .collect();
        let mut x = vec![0f32; n * d];
        self.embed.forward(&self.file, &tokens, &mut x)?;
        let mut h = vec![0f32; n * d];
        let mut o = vec![0f32; n * d];
        let rec = mem.recurrent.as_mut().ok_or_else(|| ModelError::Tensor {
            name: "memory".into(),
            reason: "a Mamba-2 model needs recurrent memory".into(),
        })?;
        for (l, layer) in self.layers.iter().enumerate() {
            rms_norm(&x, Some(&layer.norm), self.eps, &mut h, d);
            layer
                .mixer
                .forward(&self.file, pool, l, &chunks, rec, &h, &mut o)?;
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        }
        for c in &ub.chunks {
            mem.advance(c.seq, c.tokens.len())?;
        }
        Ok(self.head.forward(&self.file, pool, ub, &x))
    }
}
