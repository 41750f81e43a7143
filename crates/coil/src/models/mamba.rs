//! Mamba (-1) language model (`mamba`, also Falcon-Mamba): token embedding,
//! then per layer `x ← x + Mamba1Mixer(RMSNorm(x))`, final RMSNorm, output.

use super::blocks::common::{check_ubatch, Embedding, OutputHead};
use super::blocks::mamba1_mixer::{Mamba1Mixer, Mamba1Params};
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
    mixer: Mamba1Mixer,
}

pub struct Mamba {
    file: Arc<GgufFile>,
    info: ModelInfo,
    embed: Embedding,
    layers: Vec<Layer>,
    head: OutputHead,
    eps: f32,
}

/// Name, vocabulary, width and context length, common to every
/// architecture.
pub(crate) fn base_info(ld: &Loader, plan: LayerPlan) -> Result<ModelInfo, ModelError> {
    let n_embd = ld.u_in("embedding_length", 1, 1 << 20)?;
    let n_vocab = match ld.file.tensor_info("token_embd.weight") {
        Some(t) if t.dims.len() == 2 => t.dims[1] as usize,
        Some(t) => {
            return Err(ModelError::BadShape {
                name: t.name.clone(),
                expected: vec![n_embd as u64, 0],
                found: t.dims.clone(),
            })
        }
        None => return Err(ModelError::MissingTensor("token_embd.weight".into())),
    };
    Ok(ModelInfo {
        arch: plan.arch.clone(),
        name: ld
            .file
            .metadata()
            .get_str("general.name")
            .unwrap_or("")
            .to_string(),
        n_vocab,
        n_embd,
        n_ctx_train: ld.u_opt("context_length")?.unwrap_or(0),
        plan,
    })
}

impl Mamba {
    pub fn load(file: Arc<GgufFile>, plan: LayerPlan) -> Result<Self, ModelError> {
        let ld = Loader::new(&file, "mamba");
        let info = base_info(&ld, plan)?;
        let eps = ld
            .f32_opt("attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-5);
        let p = Mamba1Params::from_gguf(&ld, info.n_embd, eps)?;
        let layers = (0..info.plan.layers.len())
            .map(|l| {
                Ok(Layer {
                    norm: ld.vector(&format!("blk.{l}.attn_norm.weight"), &[info.n_embd])?,
                    mixer: Mamba1Mixer::load(&ld, l, p)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let embed = Embedding::load(&ld, info.n_vocab, info.n_embd)?;
        let head = OutputHead::load(&ld, info.n_vocab, info.n_embd, eps)?;
        Ok(Mamba {
            file,
            info,
            embed,
            layers,
            head,
            eps,
        })
    }
}

impl Model for Mamba {
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
            reason: "a Mamba model needs recurrent memory".into(),
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
