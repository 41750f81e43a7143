//! `coil logits -m MODEL --tokens 1,2,3 [--ubatch K] --out FILE.npy`: the
//! logits of every position as a float32 `.npy` array `[n_tokens, n_vocab]`.
//! Other tools check coil through this interface: keep it exactly so.

use super::common::ModelArgs;
use anyhow::{bail, Context, Result};
use coil::models::LogitRows;
use coil_gguf::npy;
use std::io::BufWriter;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Comma-separated token ids, e.g. 1,2,3.
    #[arg(long = "tokens", value_delimiter = ',', required = true)]
    tokens: Vec<String>,
    /// Feed the tokens K at a time through the recurrent state (1: token by
    /// token). Default: all at once.
    #[arg(long = "ubatch")]
    ubatch: Option<usize>,
    /// Output .npy file.
    #[arg(long = "out", short = 'o')]
    out: PathBuf,
}

pub fn run(a: Args) -> Result<()> {
    let tokens = a
        .tokens
        .iter()
        .map(|t| {
            t.trim()
                .parse::<u32>()
                .with_context(|| format!("--tokens: {t:?} is not a token id"))
        })
        .collect::<Result<Vec<u32>>>()?;
    if tokens.is_empty() {
        bail!("--tokens is empty");
    }
    let ubatch = a.ubatch.unwrap_or(tokens.len());
    if ubatch == 0 {
        bail!("--ubatch must be at least 1");
    }
    let mut model = a.model.clone();
    model.ctx_at_least(tokens.len());
    let mut engine = model.load(1, ubatch, true)?;
    let n_vocab = engine.n_vocab();
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
        bail!("--tokens: id {bad} is outside the vocabulary of {n_vocab}");
    }
    let logits = engine.eval(0, &tokens, LogitRows::All, ubatch)?;
    let tmp = a.out.with_extension("npy.partial");
    let f = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut w = BufWriter::new(f);
    npy::write_f32(&mut w, &[tokens.len(), n_vocab], &logits)
        .and_then(|_| std::io::Write::flush(&mut w).map_err(Into::into))
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(w);
    std::fs::rename(&tmp, &a.out).with_context(|| format!("writing {}", a.out.display()))?;
    eprintln!(
        "wrote {} ({} × {} float32)",
        a.out.display(),
        tokens.len(),
        n_vocab
    );
    Ok(())
}
