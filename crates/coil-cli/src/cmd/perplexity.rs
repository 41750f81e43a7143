//! `coil perplexity -m MODEL -f TEXT [--ctx N] [--json]`: the perplexity of
//! a text, computed as llama.cpp's llama-perplexity computes it; with
//! `--kl-divergence-base FILE` it also saves the model's log-probabilities,
//! and `--kl-divergence --kl-divergence-base FILE` compares another model
//! (a quantization of the same one) against them (`coil::engine::kld`).
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
use coil::engine::kld::{self, BaseHeader, Divergence, DivergenceSummary, Estimate};
use coil::engine::Engine;
use coil::models::LogitRows;
use coil::tokenizer::Tokenizer;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// `-c / --ctx-size N` is the window: N tokens per evaluation, the
    /// second half scored (default 4096; with --kl-divergence: the base
    /// file's window).
    #[command(flatten)]
    model: ModelArgs,
    /// The text file (not with --kl-divergence: the base file holds the
    /// tokens).
    #[arg(
        short = 'f',
        long = "file",
        required_unless_present = "kl",
        conflicts_with = "kl"
    )]
    file: Option<PathBuf>,
    /// Stop after this many windows (default: all that fit).
    #[arg(long = "chunks")]
    chunks: Option<usize>,
    /// Tokens per micro-batch (1: token by token, as decoding runs).
    #[arg(short = 'b', long = "batch-size", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..))]
    ubatch: u32,
    /// Print the result as one JSON object on stdout (no per-window lines).
    #[arg(long = "json")]
    json: bool,
    /// Save the windows' tokens and this model's log-probabilities of every
    /// scored position in FILE (llama-perplexity's format: files of either
    /// program serve the other); with --kl-divergence, read them from FILE.
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    kl_base: Option<PathBuf>,
    /// Compare this model against the base saved in --kl-divergence-base:
    /// the KL divergence of its next-token distributions from the base's
    /// (mean, median, percentiles), how often both pick the same top token,
    /// and the perplexity change.
    #[arg(long = "kl-divergence", requires = "kl_base")]
    kl: bool,
}

pub fn run(a: Args) -> Result<()> {
    if a.kl {
        return divergence(a);
    }
    let Some(file) = a.file.clone() else {
        bail!("give the text with -f FILE");
    };
    // The window: -c as given, else 4096 tokens (not the trained
    // context: a window needs twice its length of text).
    let n_ctx = a.model.ctx.unwrap_or(4096);
    if n_ctx < 4 {
        bail!("-c / --ctx-size must be at least 4 (the second half of each window is scored)");
    }
    let text = std::fs::read_to_string(&file)
        .with_context(|| format!("reading {} (it must be UTF-8 text)", file.display()))?;
    let ubatch = (a.ubatch as usize).min(n_ctx);
    let mut model = a.model.clone();
    model.ctx = Some(n_ctx);
    let mut engine = model.load(1, ubatch, true)?;
    let tokenizer = Tokenizer::from_gguf(&engine.file).context("reading the model's tokenizer")?;
    let n_vocab = engine.n_vocab();
    let tokens = tokenizer.encode(&text, true);
    let bos = bos(&tokenizer);
    let fits = tokens.len() / n_ctx;
    if fits == 0 || tokens.len() < 2 * n_ctx {
        bail!(
            "{} has {} tokens; a window of --ctx {n_ctx} needs at least {} (2 × ctx, as llama-perplexity); give a longer text or a smaller --ctx",
            file.display(),
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
            kld::scored_rows(n_ctx)
        );
    }
    let mut save = match &a.kl_base {
        Some(path) => {
            let f = std::fs::File::create(path)
                .with_context(|| format!("creating {}", path.display()))?;
            let mut w = BufWriter::new(f);
            BaseHeader {
                n_ctx,
                n_vocab,
                n_chunk,
                tokens: tokens[..n_chunk * n_ctx].to_vec(),
            }
            .write(&mut w)
            .with_context(|| format!("writing {}", path.display()))?;
            Some((
                w,
                vec![0u16; kld::scored_rows(n_ctx) * kld::row_len(n_vocab)],
            ))
        }
        None => None,
    };

    let bar = progress(n_chunk);
    let t0 = Instant::now();
    let mut total = 0.0f64;
    let mut count = 0usize;
    let mut window = Vec::with_capacity(n_ctx);
    for c in 0..n_chunk {
        window.clear();
        window.extend_from_slice(&tokens[c * n_ctx..(c + 1) * n_ctx]);
        let logits = eval_window(&mut engine, &mut window, bos, ubatch)?;
        let rows =
            (first..n_ctx - 1).map(|i| (&logits[i * n_vocab..(i + 1) * n_vocab], window[i + 1]));
        match &mut save {
            Some((_, buf)) => {
                for ((row, next), out) in rows.zip(buf.chunks_exact_mut(kld::row_len(n_vocab))) {
                    total += kld::encode_row(row, next, out);
                    count += 1;
                }
            }
            None => {
                for (row, next) in rows {
                    total += nll(row, next);
                    count += 1;
                }
            }
        }
        if let (Some((w, buf)), Some(path)) = (&mut save, &a.kl_base) {
            kld::write_rows(w, buf).with_context(|| format!("writing {}", path.display()))?;
        }
        let ppl = (total / count as f64).exp();
        bar.set_message(format!("ppl {ppl:.4}"));
        bar.inc(1);
        if !a.json {
            bar.suspend(|| println!("[{}] {ppl:.4}", c + 1));
        }
    }
    bar.finish_and_clear();
    engine.seq_clear(0)?;
    if let (Some((mut w, _)), Some(path)) = (save, &a.kl_base) {
        w.flush()
            .with_context(|| format!("writing {}", path.display()))?;
        if !a.json {
            eprintln!(
                "saved the log-probabilities of {count} positions in {}",
                path.display()
            );
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let mean_nll = total / count as f64;
    let ppl = mean_nll.exp();
    if a.json {
        let out = serde_json::json!({
            "file": file.display().to_string(),
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

/// `--kl-divergence`: this model against the base file's log-probabilities.
fn divergence(a: Args) -> Result<()> {
    let Some(path) = a.kl_base.clone() else {
        bail!("--kl-divergence needs --kl-divergence-base FILE");
    };
    let f = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let mut r = BufReader::new(f);
    let base = BaseHeader::read(&mut r).with_context(|| format!("reading {}", path.display()))?;
    let n_ctx = base.n_ctx;
    if let Some(c) = a.model.ctx.filter(|&c| c != n_ctx) {
        bail!(
            "{} holds windows of {n_ctx} tokens; -c {c} cannot change them (leave -c out)",
            path.display()
        );
    }
    let mut model = a.model.clone();
    model.ctx = Some(n_ctx);
    let ubatch = (a.ubatch as usize).min(n_ctx);
    let mut engine = model.load(1, ubatch, true)?;
    let n_vocab = engine.n_vocab();
    if base.n_vocab != n_vocab {
        bail!(
            "{} was saved from a model with {} tokens in its vocabulary; this one has {n_vocab}: compare quantizations of one model",
            path.display(),
            base.n_vocab
        );
    }
    let tokenizer = Tokenizer::from_gguf(&engine.file).context("reading the model's tokenizer")?;
    let bos = bos(&tokenizer);
    let n_chunk = a.chunks.map_or(base.n_chunk, |c| c.clamp(1, base.n_chunk));
    let first = n_ctx / 2;
    let scored = kld::scored_rows(n_ctx);
    if !a.json {
        eprintln!(
            "{}: {n_chunk} windows of {n_ctx} tokens, {scored} scored per window",
            path.display()
        );
        println!("window          PPL   ln(PPL/PPL_base)    mean KLD   same top");
    }
    let bar = progress(n_chunk);
    let t0 = Instant::now();
    let row_len = kld::row_len(n_vocab);
    let mut rows = vec![0u16; scored * row_len];
    let mut div = Divergence::default();
    let mut window = Vec::with_capacity(n_ctx);
    for c in 0..n_chunk {
        kld::read_rows(&mut r, &mut rows, c)
            .with_context(|| format!("reading {}", path.display()))?;
        window.clear();
        window.extend_from_slice(base.window(c));
        let logits = eval_window(&mut engine, &mut window, bos, ubatch)?;
        for (j, stored) in rows.chunks_exact(row_len).enumerate() {
            let i = first + j;
            let row = &logits[i * n_vocab..(i + 1) * n_vocab];
            div.add(kld::compare_row(stored, row, window[i + 1]));
        }
        bar.inc(1);
        if !a.json {
            let (ppl, ln_ratio, kl, same) = div.running();
            bar.suspend(|| {
                println!(
                    "{:6} {:12.4} {:18.5} {:11.6} {:9.3}%",
                    c + 1,
                    ppl,
                    ln_ratio,
                    kl,
                    100.0 * same
                )
            });
        }
    }
    bar.finish_and_clear();
    engine.seq_clear(0)?;
    let s = div.summary();
    let secs = t0.elapsed().as_secs_f64();
    if a.json {
        println!("{}", summary_json(&s, n_ctx, n_chunk, secs));
    } else {
        print_summary(&s);
        eprintln!("{secs:.1} s");
    }
    Ok(())
}

/// The BOS token where the vocabulary adds one.
pub(super) fn bos(tokenizer: &Tokenizer) -> Option<u32> {
    tokenizer
        .vocab()
        .bos_id
        .filter(|_| tokenizer.vocab().add_bos)
}

/// One window from an empty state (its first token replaced by `bos`),
/// every position's logits.
pub(super) fn eval_window(
    engine: &mut Engine,
    window: &mut [u32],
    bos: Option<u32>,
    ubatch: usize,
) -> Result<Vec<f32>> {
    if let Some(b) = bos {
        window[0] = b;
    }
    engine.seq_clear(0)?;
    Ok(engine.eval(0, window, LogitRows::All, ubatch)?)
}

/// Negative log-likelihood of `target` under one row of logits (f64 log-sum-exp).
pub(super) fn nll(row: &[f32], target: u32) -> f64 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    max + sum.ln() - row[target as usize] as f64
}

fn progress(n: usize) -> ProgressBar {
    let bar = ProgressBar::new(n as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} windows  {msg}  [{elapsed} < {eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

fn est(e: Estimate) -> serde_json::Value {
    serde_json::json!({ "value": e.value, "err": e.err })
}

fn summary_json(
    s: &DivergenceSummary,
    n_ctx: usize,
    n_chunk: usize,
    secs: f64,
) -> serde_json::Value {
    serde_json::json!({
        "ctx": n_ctx,
        "chunks": n_chunk,
        "tokens_scored": s.rows,
        "ppl": est(s.ppl),
        "ppl_base": est(s.ppl_base),
        "ln_ppl_correlation": s.ln_ppl_correlation,
        "ln_ppl_ratio": est(s.ln_ppl_ratio),
        "ppl_ratio": est(s.ppl_ratio),
        "ppl_diff": est(s.ppl_diff),
        "kld": {
            "mean": est(s.kl_mean),
            "max": s.kl_max,
            "p99_9": s.kl_p999,
            "p99": s.kl_p99,
            "p95": s.kl_p95,
            "p90": s.kl_p90,
            "median": s.kl_median,
            "p10": s.kl_p10,
            "p5": s.kl_p5,
            "p1": s.kl_p1,
            "min": s.kl_min,
        },
        "delta_p": {
            "mean": est(s.dp_mean),
            "max": s.dp_max,
            "p99": s.dp_p99,
            "p95": s.dp_p95,
            "median": s.dp_median,
            "p5": s.dp_p5,
            "p1": s.dp_p1,
            "min": s.dp_min,
            "rms": est(s.dp_rms),
        },
        "same_top": est(s.same_top),
        "seconds": secs,
    })
}

/// llama-perplexity's closing statistics, in its words.
fn print_summary(s: &DivergenceSummary) {
    let pm = |e: Estimate| format!("{:10.6} ± {:10.6}", e.value, e.err);
    let pct = |e: Estimate| format!("{:6.3} ± {:5.3} %", 100.0 * e.value, 100.0 * e.err);
    println!();
    println!("====== Perplexity statistics ======");
    println!("Mean PPL(Q)                   : {}", pm(s.ppl));
    println!("Mean PPL(base)                : {}", pm(s.ppl_base));
    println!(
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
        100.0 * s.ln_ppl_correlation
    );
    println!("Mean ln(PPL(Q)/PPL(base))     : {}", pm(s.ln_ppl_ratio));
    println!("Mean PPL(Q)/PPL(base)         : {}", pm(s.ppl_ratio));
    println!("Mean PPL(Q)-PPL(base)         : {}", pm(s.ppl_diff));
    println!();
    println!("====== KL divergence statistics ======");
    println!("Mean    KLD: {}", pm(s.kl_mean));
    for (name, v) in [
        ("Maximum KLD", s.kl_max),
        ("99.9%   KLD", s.kl_p999),
        ("99.0%   KLD", s.kl_p99),
        ("95.0%   KLD", s.kl_p95),
        ("90.0%   KLD", s.kl_p90),
        ("Median  KLD", s.kl_median),
        ("10.0%   KLD", s.kl_p10),
        (" 5.0%   KLD", s.kl_p5),
        (" 1.0%   KLD", s.kl_p1),
        ("Minimum KLD", s.kl_min),
    ] {
        println!("{name}: {v:10.6}");
    }
    println!();
    println!("====== Token probability statistics ======");
    println!("Mean    Δp: {}", pct(s.dp_mean));
    for (name, v) in [
        ("Maximum Δp", s.dp_max),
        ("99.0%   Δp", s.dp_p99),
        ("95.0%   Δp", s.dp_p95),
        ("Median  Δp", s.dp_median),
        (" 5.0%   Δp", s.dp_p5),
        (" 1.0%   Δp", s.dp_p1),
        ("Minimum Δp", s.dp_min),
    ] {
        println!("{name}: {:6.3}%", 100.0 * v);
    }
    println!("RMS Δp    : {}", pct(s.dp_rms));
    println!("Same top p: {}", pct(s.same_top));
}
