//! Layer 3: one file per architecture plus the shared blocks and the layer
//! plan. Every architecture implements [`Model`]: given a micro-batch and
//! the memory, run the layers and return logits. Models never allocate
//! per-sequence state and never know how many sequences exist.

pub mod bailing_hybrid;
pub mod blocks;
pub mod falcon_h1;
pub mod granite_hybrid;
pub mod hparams;
pub mod jamba;
pub mod kimi_linear;
pub mod lfm2;
pub mod lfm3;
pub mod llama;
pub mod mamba;
pub mod mamba2;
pub mod nemotron_h;
pub mod nextn;
pub mod plan;
pub mod qwen35;
pub mod qwen3next;
pub mod qwen4exp;
pub mod weights;
pub mod zamba2;

pub use plan::{FeedForward, LayerKind, LayerPlan, Mixer};

use crate::memory::{Memory, MemoryError, SeqId};
use coil_gguf::GgufFile;
use coil_kernels::ThreadPool;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error("metadata key {0} is missing")]
    MissingKey(String),
    #[error("metadata key {key}: {reason}")]
    BadKey { key: String, reason: String },
    #[error("tensor {0} is missing")]
    MissingTensor(String),
    #[error("tensor {name} has shape {found:?}, expected {expected:?} (ggml order, ne0 first)")]
    BadShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("tensor {name}: {reason}")]
    Tensor { name: String, reason: String },
    #[error("architecture {0:?} is recognised but not implemented yet")]
    NotImplemented(String),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("token id {token} is outside the vocabulary of {n_vocab}")]
    BadToken { token: u32, n_vocab: usize },
    #[error("this model has no NextN / MTP layers to draft with (its file carries no `blk.N.nextn.*` tensors: convert the checkpoint with them, or use another --spec kind)")]
    NoNextn,
    #[error(
        "drafting with the NextN block needs the memory made for it (Model::new_memory_nextn)"
    )]
    NextnMemory,
}

/// Which rows of a chunk need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    None,
    Last,
    All,
}

/// Consecutive tokens of one sequence, starting at position `pos`.
#[derive(Clone, Copy, Debug)]
pub struct SeqChunk<'a> {
    pub seq: SeqId,
    pub pos: usize,
    pub tokens: &'a [u32],
    pub logits: LogitRows,
}

impl SeqChunk<'_> {
    pub fn n_logit_rows(&self) -> usize {
        match self.logits {
            LogitRows::None => 0,
            LogitRows::Last => usize::from(!self.tokens.is_empty()),
            LogitRows::All => self.tokens.len(),
        }
    }
}

/// A micro-batch: chunks of distinct sequences, processed in one pass; the
/// rows of all chunks are stacked in order.
#[derive(Clone, Debug, Default)]
pub struct UBatch<'a> {
    pub chunks: Vec<SeqChunk<'a>>,
    /// Batch-invariant numerics. `Full`: every position's logits (and
    /// state update) are bit for bit those of feeding its tokens one at a
    /// time, each sequence alone — whatever the number of tokens and
    /// sequences in the micro-batch: weight products through kernels that
    /// give each token its one-token bits, attention rows independent of
    /// each other, the recurrent mixers token by token (see
    /// `coil_kernels::numerics`); for speculative verification and batched
    /// decoding. `Cheap`: the same except the weight products whose GEMM
    /// does not keep tokens, which take it, and the chunked forms of the
    /// recurrences (`coil serve`'s prompts). `Off`:
    /// the fastest kernels (GEMMs, chunked scans), equal to those results
    /// only to f32 rounding.
    pub invariance: coil_kernels::Invariance,
}

impl UBatch<'_> {
    pub fn n_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.tokens.len()).sum()
    }

    /// Each chunk's sequence, first position and rows in the stacked
    /// activations: what the mixers read their memory by.
    pub fn rows(&self) -> Vec<Rows> {
        self.chunks
            .iter()
            .zip(self.row_ranges())
            .map(|(c, rows)| Rows {
                seq: c.seq,
                pos: c.pos,
                rows,
            })
            .collect()
    }

    /// Row index ranges of each chunk in the stacked activations.
    pub fn row_ranges(&self) -> Vec<std::ops::Range<usize>> {
        let mut at = 0;
        self.chunks
            .iter()
            .map(|c| {
                let r = at..at + c.tokens.len();
                at = r.end;
                r
            })
            .collect()
    }

    /// The rows whose logits the micro-batch asks for, in order: the rows
    /// of the logits the model returns.
    pub fn logit_rows(&self) -> Vec<usize> {
        let mut rows = Vec::new();
        for (c, r) in self.chunks.iter().zip(self.row_ranges()) {
            match c.logits {
                LogitRows::None => {}
                LogitRows::Last => rows.extend(r.end.checked_sub(1)),
                LogitRows::All => rows.extend(r),
            }
        }
        rows
    }
}

/// The rows of one sequence in a micro-batch: its tokens at positions
/// `pos..pos + rows.len()`.
#[derive(Clone, Debug)]
pub struct Rows {
    pub seq: SeqId,
    pub pos: usize,
    pub rows: std::ops::Range<usize>,
}

/// What a user (and the engine) needs to know about a loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub arch: String,
    pub name: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_ctx_train: usize,
    pub plan: LayerPlan,
}

pub trait Model: Send + Sync {
    fn info(&self) -> &ModelInfo;

    /// The NextN / multi-token-prediction blocks that follow the trunk in
    /// the file (empty without them); [`Model::forward`] never runs them.
    fn nextn(&self) -> &[nextn::NextnBlock] {
        &[]
    }

    /// Memory for `n_seq_max` sequences of up to `n_ctx` tokens each.
    fn new_memory(&self, n_seq_max: usize, n_ctx: usize) -> Memory;

    /// [`Model::new_memory`] that also keeps what the first NextN block
    /// needs to draft ([`Model::draft_nextn`]): its own attention cells and
    /// the hidden state it reads next, which every forward pass then
    /// keeps (see [`nextn`]; a few positions' cells may wait until
    /// drafting needs them). `None` for a model without NextN blocks.
    fn new_memory_nextn(&self, _n_seq_max: usize, _n_ctx: usize) -> Option<Memory> {
        None
    }

    /// Greedy drafts of the first NextN block for each `(seq, token, k)`:
    /// up to `k` tokens after `token`, the one just sampled for `seq` (not
    /// yet fed to the model). The sequences draft side by
    /// side, one token each per step. The memory must come from
    /// [`Model::new_memory_nextn`]; the drafts' attention cells lie past
    /// each sequence's length (the next pass drops them) and nothing else
    /// changes.
    fn draft_nextn(
        &self,
        _pool: &ThreadPool,
        _mem: &mut Memory,
        _seqs: &[(SeqId, u32, usize)],
    ) -> Result<Vec<Vec<u32>>, ModelError> {
        Err(ModelError::NoNextn)
    }

    /// Writes the first NextN block's attention cells that still wait for
    /// `seqs` (see [`Model::new_memory_nextn`]), so that the memory holds
    /// every cell of every position (saving a session). Nothing to do for
    /// a memory without the block.
    fn nextn_catch_up(
        &self,
        _pool: &ThreadPool,
        _mem: &mut Memory,
        _seqs: &[SeqId],
    ) -> Result<(), ModelError> {
        Ok(())
    }

    /// [`Model::draft_nextn`] of one sequence, with the logits each step
    /// drafted from (`[drafts, n_vocab]`): for checking the block against
    /// a reference.
    fn draft_nextn_logits(
        &self,
        _pool: &ThreadPool,
        _mem: &mut Memory,
        _seq: SeqId,
        _token: u32,
        _k: usize,
    ) -> Result<(Vec<u32>, Vec<f32>), ModelError> {
        Err(ModelError::NoNextn)
    }

    /// Runs the micro-batch and writes the wanted logits rows into
    /// `logits`, stacked in chunk order: `[Σ n_logit_rows, n_vocab]` (its
    /// length set to that; a buffer reused from an earlier pass is
    /// overwritten, not zeroed first).
    fn forward(
        &self,
        pool: &ThreadPool,
        ub: &UBatch,
        mem: &mut Memory,
        logits: &mut Vec<f32>,
    ) -> Result<(), ModelError>;

    /// After a speculative verification of `seq` (`Memory::spec_begin`)
    /// kept only its first `n` tokens: brings every recurrent layer's state
    /// to the state after them from the verification's tapes, and returns
    /// `true`; `false` (nothing changed) where some layer cannot, and the
    /// engine replays the kept tokens instead.
    fn refold(
        &self,
        _pool: &ThreadPool,
        _mem: &mut Memory,
        _seq: SeqId,
        _n: usize,
    ) -> Result<bool, ModelError> {
        Ok(false)
    }
}

/// Loads the model of a GGUF file, choosing the architecture from
/// `general.architecture`.
pub fn load(file: Arc<GgufFile>) -> Result<Box<dyn Model>, ModelError> {
    let plan = LayerPlan::from_gguf(&file)?;
    let stack = match plan.arch.as_str() {
        "mamba" => mamba::load(file, plan)?,
        "mamba2" => mamba2::load(file, plan)?,
        "jamba" => jamba::load(file, plan)?,
        "granitehybrid" => granite_hybrid::load(file, plan)?,
        "falcon-h1" => falcon_h1::load(file, plan)?,
        "nemotron_h" | "nemotron_h_moe" => nemotron_h::load(file, plan)?,
        "llama" => llama::load(file, plan)?,
        "qwen35" | "qwen35moe" => qwen35::load(file, plan)?,
        "qwen3next" => qwen3next::load(file, plan)?,
        "lfm2" | "lfm2moe" => lfm2::load(file, plan)?,
        "lfm3" => lfm3::load(file, plan)?,
        "kimi-linear" => kimi_linear::load(file, plan)?,
        "bailingmoe3" => bailing_hybrid::load(file, plan)?,
        "qwen4exp" => return Ok(Box::new(qwen4exp::load(file, plan)?)),
        "zamba2" => return Ok(Box::new(zamba2::load(file, plan)?)),
        other => return Err(ModelError::NotImplemented(other.to_string())),
    };
    Ok(Box::new(stack))
}
