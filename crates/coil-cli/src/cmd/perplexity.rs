//! `coil perplexity -m MODEL -f TEXT [--ctx N] [--json]`: the perplexity of
//! a text, computed as llama.cpp's llama-perplexity computes it.
//!
//! The whole text is tokenized once (with BOS if the vocabulary adds one)
//! and cut into non-overlapping windows of `--ctx` tokens (a tail that does
//! not fill a window is dropped). Each window is evaluated from an empty
//! state; with `first = ctx / 2`, the logits of positions `first ..= ctx-2`
//! score the tokens `first+1 ..= ctx-1`, so every scored token has at least
//! `ctx / 2` tokens of context. Where the vocabulary adds BOS, the first
//! token of every window is replaced by BOS, as llama-perplexity does.
//! Perplexity = exp(mean negative log-likelihood over the scored tokens).

use super::common::ModelArgs;
use anyhow::{bail, Context, Result};
use coil::models::LogitRows;
use coil::tokenizer::Tokenizer;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// `-c / --ctx-size N` is the window: N tokens per evaluation, the
    /// second half scored (default 4096).
    #[command(flatten)]
    model: ModelArgs,
    /// The text file.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// Stop after this many windows (default: all that fit).
    #[arg(long = "chunks")]
    chunks: Option<usize>,
    /// Print the result as one JSON object on stdout (no per-window lines).
    #[arg(long = "json")]
    json: bool,
}

/// Negative log-likelihood of `target` under one row of logits (f64 log-sum-exp).
fn nll(row: &[f32], target: u32) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    max + sum.ln() - row[target as usize] as f64
}

pub fn run(a: Args) -> Result<()> {
    // The window: -c as given, else 4096 tokens (not the trained
    // context: a window needs twice its length of text).
    let n_ctx = a.model.ctx.unwrap_or(4096);
    if n_ctx < 4 {
        bail!("-c / --ctx-size must be at least 4 (the second half of each window is scored)");
    }
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {} (it must be UTF-8 text)", a.file.display()))?;
    let mut model = a.model.clone();
    model.ctx = Some(n_ctx);
    let mut engine = model.load(1, n_ctx.min(512), true)?;
    let tokenizer = Tokenizer::from_gguf(&engine.file).context("reading the model's tokenizer")?;
    let n_vocab = engine.n_vocab();
    let tokens = tokenizer.encode(&text, true);
    let bos = tokenizer
        .vocab()
        .bos_id
        .filter(|_| tokenizer.vocab().add_bos);
    let fits = tokens.len() / n_ctx;
    if fits == 0 || tokens.len() < 2 * n_ctx {
        bail!(
            "{} has {} tokens; a window of --ctx {n_ctx} needs at least {} (2 × ctx, as llama-perplexity); give a longer text or a smaller --ctx",
            a.file.display(),
            tokens.len(),
            2 * n_ctx
        );
    }
    let n_chunk = a.chunks.map_or(fits, |c| c.clamp(1, fits));
    let first = n_ctx / 2;
    if !a.json {
        eprintln!(
            "{} tokens, {n_chunk} windows of {n_ctx} tokens, {} scored per window",
            tokens.len(),
            n_ctx - 1 - first
        );
    }

    let bar = ProgressBar::new(n_chunk as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} windows  {msg}  [{elapsed} < {eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t0 = Instant::now();
    let mut total = 0.0f64;
    let mut count = 0usize;
    let mut per_chunk = Vec::with_capacity(n_chunk);
    let mut window = Vec::with_capacity(n_ctx);
    for c in 0..n_chunk {
        window.clear();
        window.extend_from_slice(&tokens[c * n_ctx..(c + 1) * n_ctx]);
        if let Some(b) = bos {
            window[0] = b;
        }
        engine.seq_clear(0)?;
        let logits = engine.eval(0, &window, LogitRows::All, 0)?;
        for i in first..n_ctx - 1 {
            total += nll(&logits[i * n_vocab..(i + 1) * n_vocab], window[i + 1]);
            count += 1;
        }
        let ppl = (total / count as f64).exp();
        per_chunk.push(ppl);
        bar.set_message(format!("ppl {ppl:.4}"));
        bar.inc(1);
        if !a.json {
            bar.suspend(|| println!("[{}] {ppl:.4}", c + 1));
        }
    }
    bar.finish_and_clear();
    engine.seq_clear(0)?;
    let secs = t0.elapsed().as_secs_f64();
    let mean_nll = total / count as f64;
    let ppl = mean_nll.exp();
    if a.json {
        let out = serde_json::json!({
            "file": a.file.display().to_string(),
            "ctx": n_ctx,
            "tokens": tokens.len(),
            "chunks": n_chunk,
            "tokens_scored": count,
            "nll": mean_nll,
            "ppl": ppl,
            "uniform_ppl": n_vocab,
            "seconds": secs,
        });
        println!("{out}");
    } else {
        println!(
            "perplexity: {ppl:.4} over {count} tokens ({n_chunk} windows of {n_ctx}); a uniform guess over the {n_vocab}-token vocabulary would be {n_vocab}"
        );
        eprintln!(
            "{:.1} s, {:.1} tokens/s",
            secs,
            (n_chunk * n_ctx) as f64 / secs.max(1e-9)
        );
    }
    Ok(())
}
