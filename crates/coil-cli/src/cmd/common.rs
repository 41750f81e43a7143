//! Flags and helpers shared by the subcommands that run a model.

use anyhow::{bail, Context, Result};
use coil::engine::{Engine, EngineOptions};
use coil::memory::CheckpointPolicy;
use std::path::PathBuf;

#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// The GGUF model file.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Worker threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context size: the most tokens a sequence may hold.
    #[arg(short = 'c', long = "ctx", default_value_t = 4096)]
    pub ctx: usize,
    /// Tokens between recurrent-state checkpoints (for rollback; 0 = only
    /// at the end of each prompt or generation step).
    #[arg(long = "checkpoint-interval", default_value_t = 256)]
    pub checkpoint_interval: usize,
    /// Memory for checkpoints per sequence, in MiB; over it they are thinned
    /// out (spaced further apart), never dropped entirely.
    #[arg(long = "checkpoint-budget", default_value_t = 256)]
    pub checkpoint_budget_mib: usize,
}

impl ModelArgs {
    pub fn load(&self, n_seq_max: usize, n_ubatch: usize) -> Result<Engine> {
        let threads = self
            .threads
            .unwrap_or_else(coil_kernels::ThreadPool::default_threads);
        if threads == 0 {
            bail!("--threads must be at least 1");
        }
        if self.ctx == 0 {
            bail!("--ctx must be at least 1");
        }
        let opts = EngineOptions {
            n_threads: threads,
            n_seq_max,
            n_ctx: self.ctx,
            n_ubatch,
            checkpoints: CheckpointPolicy {
                interval: self.checkpoint_interval,
                budget_bytes: self.checkpoint_budget_mib.saturating_mul(1 << 20),
                ..Default::default()
            },
        };
        Engine::load(&self.model, opts).with_context(|| format!("loading {}", self.model.display()))
    }
}
