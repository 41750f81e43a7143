//! Layer 4: the engine a Rust user embeds — a loaded model, its memory and a
//! thread pool; feeding tokens of sequences through micro-batches.

pub mod generate;
pub mod sampling;

use crate::memory::{Memory, SeqId, SequenceMemory};
use crate::models::{self, LogitRows, Model, ModelError, SeqChunk, UBatch};
use coil_gguf::{GgufError, GgufFile};
use coil_kernels::ThreadPool;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),
    #[error("{0}")]
    Invalid(String),
}

#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Worker threads (default: physical cores).
    pub n_threads: usize,
    /// Sequences the memory holds at once.
    pub n_seq_max: usize,
    /// Most tokens one sequence may hold.
    pub n_ctx: usize,
    /// Most tokens per micro-batch.
    pub n_ubatch: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            n_threads: ThreadPool::default_threads(),
            n_seq_max: 1,
            n_ctx: 4096,
            n_ubatch: 512,
        }
    }
}

pub struct Engine {
    pub file: Arc<GgufFile>,
    pub model: Box<dyn Model>,
    pub mem: Memory,
    pub pool: ThreadPool,
    pub opts: EngineOptions,
}

impl Engine {
    pub fn load(path: impl AsRef<Path>, opts: EngineOptions) -> Result<Engine, EngineError> {
        let file = Arc::new(GgufFile::open(path)?);
        Self::from_file(file, opts)
    }

    pub fn from_file(file: Arc<GgufFile>, opts: EngineOptions) -> Result<Engine, EngineError> {
        if opts.n_ubatch == 0 || opts.n_ctx == 0 || opts.n_seq_max == 0 || opts.n_threads == 0 {
            return Err(EngineError::Invalid(
                "threads, sequences, context and micro-batch size must be at least 1".into(),
            ));
        }
        let model = models::load(file.clone())?;
        let mem = model.new_memory(opts.n_seq_max, opts.n_ctx);
        Ok(Engine {
            file,
            model,
            mem,
            pool: ThreadPool::new(opts.n_threads),
            opts,
        })
    }

    /// Forgets every sequence.
    pub fn mem_clear(&mut self) {
        for s in 0..self.mem.n_seq_max() {
            // In range by construction.
            let _ = self.mem.seq_clear(s);
        }
    }

    pub fn n_vocab(&self) -> usize {
        self.model.info().n_vocab
    }

    /// Appends `tokens` to sequence `seq`, `ubatch` tokens per micro-batch
    /// (0: the engine's default), and returns the logits asked for:
    /// `[tokens.len(), n_vocab]` for `All`, `[1, n_vocab]` for `Last`.
    pub fn eval(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        rows: LogitRows,
        ubatch: usize,
    ) -> Result<Vec<f32>, EngineError> {
        let ub = if ubatch == 0 {
            self.opts.n_ubatch
        } else {
            ubatch
        };
        let mut pos = self.mem.seq_len(seq)?;
        self.mem.check_append(seq, pos, tokens.len())?;
        let mut out = Vec::new();
        let n_chunks = tokens.len().div_ceil(ub);
        for (i, part) in tokens.chunks(ub).enumerate() {
            let logits = match rows {
                LogitRows::All => LogitRows::All,
                LogitRows::Last if i + 1 == n_chunks => LogitRows::Last,
                _ => LogitRows::None,
            };
            let batch = UBatch {
                chunks: vec![SeqChunk {
                    seq,
                    pos,
                    tokens: part,
                    logits,
                }],
            };
            out.extend(self.model.forward(&self.pool, &batch, &mut self.mem)?);
            pos += part.len();
        }
        Ok(out)
    }
}
