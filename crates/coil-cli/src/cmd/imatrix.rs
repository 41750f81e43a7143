//! `coil imatrix -m MODEL -f TEXT [-o imatrix.gguf] [--chunks N] [-c CTX]`:
//! an importance matrix for `coil quantize --imatrix` (or llama-quantize),
//! as llama.cpp's llama-imatrix makes it.
//!
//! The text is tokenized once and cut into windows of `-c` tokens (the
//! first replaced by BOS where the vocabulary adds one), each evaluated
//! from an empty state, as `coil perplexity` does (whose perplexity is
//! printed too). Meanwhile every product of a weight matrix `blk.*` with
//! activations adds their squares per input column to the matrix's sums
//! (`coil::engine::imatrix`); the file holds the sums and counts in
//! llama.cpp's GGUF format, or its legacy `.dat` format with
//! `--output-format dat`.

use super::common::ModelArgs;
use super::perplexity::{bos, eval_window, nll};
use anyhow::{bail, Context, Result};
use coil::engine::imatrix::{ActivationStats, ImatrixCollector};
use coil::tokenizer::Tokenizer;
use coil_convert::imatrix::{Imatrix, ImatrixEntry};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    /// `-c / --ctx-size N` is the window (chunk) length: N tokens per
    /// evaluation (default 512).
    #[command(flatten)]
    model: ModelArgs,
    /// The calibration text.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// The importance matrix to write.
    #[arg(short = 'o', long = "output", default_value = "imatrix.gguf")]
    output: PathBuf,
    /// Stop after this many chunks (default: all that fit).
    #[arg(long = "chunks")]
    chunks: Option<usize>,
    /// Tokens per micro-batch (at least 16: smaller products are not
    /// counted, as in llama-imatrix).
    #[arg(short = 'b', long = "batch-size", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(16..))]
    ubatch: u32,
    /// Also collect the statistics of output.weight.
    #[arg(long = "process-output")]
    process_output: bool,
    /// `gguf` (llama.cpp's current format) or `dat` (its legacy one).
    #[arg(long = "output-format", default_value = "gguf",
          value_parser = ["gguf", "dat"])]
    output_format: String,
}

pub fn run(a: Args) -> Result<()> {
    let n_ctx = a.model.ctx.unwrap_or(512);
    if n_ctx < 4 {
        bail!("-c / --ctx-size must be at least 4");
    }
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {} (it must be UTF-8 text)", a.file.display()))?;
    let ubatch = (a.ubatch as usize).min(n_ctx);
    let mut model = a.model.clone();
    model.ctx = Some(n_ctx);
    let mut engine = model.load(1, ubatch, true)?;
    let tokenizer = Tokenizer::from_gguf(&engine.file).context("reading the model's tokenizer")?;
    let n_vocab = engine.n_vocab();
    let tokens = tokenizer.encode(&text, true);
    if tokens.len() < 2 * n_ctx {
        bail!(
            "{} has {} tokens; chunks of -c {n_ctx} need at least {} (2 × ctx, as llama-imatrix); give a longer text or a smaller -c",
            a.file.display(),
            tokens.len(),
            2 * n_ctx
        );
    }
    let fits = tokens.len() / n_ctx;
    let n_chunk = a.chunks.map_or(fits, |c| c.clamp(1, fits));
    let bos = bos(&tokenizer);
    eprintln!(
        "{} tokens, {n_chunk} chunks of {n_ctx} tokens",
        tokens.len()
    );
    let collector = Arc::new(ImatrixCollector::new(&engine.file, a.process_output));
    coil_kernels::matmul::set_product_observer(Some(collector.clone()));
    let result = (|| -> Result<()> {
        let (mut total, mut count) = (0.0f64, 0usize);
        let first = n_ctx / 2;
        let mut window = Vec::with_capacity(n_ctx);
        for c in 0..n_chunk {
            window.clear();
            window.extend_from_slice(&tokens[c * n_ctx..(c + 1) * n_ctx]);
            let logits = eval_window(&mut engine, &mut window, bos, ubatch)?;
            for i in first..n_ctx - 1 {
                total += nll(&logits[i * n_vocab..(i + 1) * n_vocab], window[i + 1]);
                count += 1;
            }
            eprintln!("[{}] ppl {:.4}", c + 1, (total / count as f64).exp());
        }
        Ok(())
    })();
    coil_kernels::matmul::set_product_observer(None);
    result?;
    let stats = collector.take().map_err(anyhow::Error::msg)?;
    if stats.is_empty() {
        bail!("no weight matrix of the model was multiplied with 16 or more tokens at once; raise -b / -c");
    }
    let m = to_imatrix(stats, &a.file, n_chunk, n_ctx);
    match a.output_format.as_str() {
        "dat" => write_legacy(&m, &a.output)?,
        _ => {
            m.write(&a.output)
                .with_context(|| format!("writing {}", a.output.display()))?;
        }
    }
    let partial = m
        .entries
        .iter()
        .filter(|(_, e)| e.counts.contains(&0.0))
        .count();
    eprintln!(
        "wrote {} entries from {n_chunk} chunks to {}{}",
        m.entries.len(),
        a.output.display(),
        if partial > 0 {
            format!(" ({partial} expert tensors have experts no token reached)")
        } else {
            String::new()
        }
    );
    Ok(())
}

fn to_imatrix(
    stats: BTreeMap<String, ActivationStats>,
    dataset: &Path,
    n_chunk: usize,
    n_ctx: usize,
) -> Imatrix {
    Imatrix {
        entries: stats
            .into_iter()
            .map(|(name, s)| {
                let e = ImatrixEntry {
                    sums: s.sums.iter().map(|&v| v as f32).collect(),
                    counts: s.counts.iter().map(|&c| c as f64).collect(),
                };
                (name, e)
            })
            .collect(),
        datasets: vec![dataset.display().to_string()],
        chunk_count: n_chunk as u32,
        chunk_size: n_ctx as u32,
        legacy: false,
    }
}

/// llama-imatrix's `--output-format dat`: per entry the means times ncall
/// (the chunks its largest count spans, rounded up); an expert no token
/// reached stores 1s; entries with no data at all are left out.
fn write_legacy(m: &Imatrix, path: &Path) -> Result<()> {
    let chunk = m.chunk_size.max(1) as f64;
    let mut out = Vec::new();
    let kept: Vec<(&String, &ImatrixEntry)> = m
        .entries
        .iter()
        .filter(|(_, e)| e.counts.iter().any(|&c| c > 0.0))
        .collect();
    out.extend((kept.len() as i32).to_le_bytes());
    for (name, e) in kept {
        out.extend((name.len() as i32).to_le_bytes());
        out.extend(name.as_bytes());
        let max = e.counts.iter().copied().fold(0.0, f64::max);
        let ncall = (max / chunk).ceil() as i32;
        out.extend(ncall.to_le_bytes());
        out.extend((e.sums.len() as i32).to_le_bytes());
        let cols = e.cols();
        for (i, &s) in e.sums.iter().enumerate() {
            let c = e.counts[i / cols.max(1)] as f32;
            let v = if c == 0.0 { 1.0 } else { s / c };
            out.extend((v * ncall as f32).to_le_bytes());
        }
    }
    out.extend((m.chunk_count as i32).to_le_bytes());
    let d = m.datasets.first().map(String::as_bytes).unwrap_or_default();
    out.extend((d.len() as i32).to_le_bytes());
    out.extend(d);
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}
