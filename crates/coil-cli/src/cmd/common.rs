//! Flags and helpers shared by the subcommands that run a model.

use anyhow::{bail, Context, Result};
use coil::engine::{Engine, EngineOptions};
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
        };
        Engine::load(&self.model, opts).with_context(|| format!("loading {}", self.model.display()))
    }
}
