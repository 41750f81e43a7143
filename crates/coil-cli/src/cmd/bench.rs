//! `coil bench -m MODEL -p 512 -n 128`: prompt-processing and generation
//! speed, measured the way llama.cpp's `llama-bench` measures them, so that
//! the two can be compared on the same GGUF file.
//!
//! - pp: a prompt of `p` random tokens is processed from an empty sequence,
//!   in micro-batches of `--ubatch` tokens, logits of the last token only;
//! - tg: `n` tokens are fed one at a time from an empty sequence, each call
//!   returning its logits (no sampling: the next token is random, as in
//!   llama-bench);
//! - one warm-up run of each (the whole prompt, one generated token), then
//!   `r` timed repetitions; tokens/s is the mean over repetitions of
//!   tokens ÷ seconds, with its sample standard deviation;
//! - `-d N` (llama-bench's depth): N random tokens are processed once,
//!   untimed, and every run starts from a fork of that context instead of
//!   an empty sequence (a fork shares the context's memory until it writes,
//!   so it costs no copy).
//! - `--parallel 1,2,4,8` (llama.cpp's `llama-batched-bench`): N sequences
//!   at once, prompts in one call and one token of each per generation step
//!   (see [`super::bench_parallel`]).
//! - `--json-schema`, `--grammar` (and their `-file` forms): generation
//!   with and without that output constraint, greedy, alternating (see
//!   [`super::bench_constraint`]).

use super::common::{ConstraintArgs, ModelArgs};
use anyhow::{bail, Context, Result};
use coil::engine::{BatchEntry, Engine, Numerics};
use coil::memory::SeqId;
use coil::models::LogitRows;
use coil_gguf::GgufFile;
use serde_json::json;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens to process (0: skip the prompt test).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Tokens to generate one by one (0: skip the generation test).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Tokens already in the context when each test starts (processed once,
    /// untimed; each run works on a fork of that context).
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    depth: usize,
    /// Timed repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Tokens per micro-batch when processing the prompt.
    #[arg(short = 'u', long = "ubatch", default_value_t = 512)]
    ubatch: usize,
    /// Skip the warm-up run.
    #[arg(long = "no-warmup")]
    no_warmup: bool,
    /// Seed of the random tokens.
    #[arg(long = "seed", default_value_t = 1)]
    seed: u64,
    /// Print one JSON object instead of a table.
    #[arg(long = "json")]
    json: bool,
    /// Sequences decoding together, e.g. `1,2,4,8`: prompt and generation
    /// tokens/s with N sequences per step (best of the repetitions).
    #[arg(long = "parallel", value_delimiter = ',')]
    parallel: Vec<usize>,
    /// Speculative decoding (greedy, `-n` tokens after a `-p`-token random
    /// prompt, plain and speculative interleaved): `right` drafts the
    /// model's own continuation (upper bound), `wrong` drafts that always
    /// fail (lower bound), `ngram` prompt lookup, `mtp` the model's own MTP
    /// layers, `draft` a draft model (--model-draft); `verify` times one
    /// verification of k + 1 tokens against one decode step.
    #[arg(long = "spec", value_enum, value_name = "MODE")]
    spec: Option<super::bench_spec::BenchSpec>,
    /// The draft model of `--spec draft` (`-md`).
    #[arg(long = "model-draft", value_name = "FILE")]
    model_draft: Option<std::path::PathBuf>,
    /// With --spec (not verify): the prompt is this file's text (its
    /// tokens; `-p` is ignored) instead of random tokens.
    #[arg(long = "prompt-file", value_name = "FILE")]
    prompt_file: Option<std::path::PathBuf>,
    /// Draft lengths k for --spec, e.g. `1,2,4,8,16`.
    #[arg(long = "draft-max", value_delimiter = ',', default_value = "8")]
    draft_max: Vec<usize>,
    /// Longest n-gram for --spec ngram.
    #[arg(long = "ngram", default_value_t = 4)]
    ngram: usize,
    /// Keep the draft length at --draft-max (no adaptation).
    #[arg(long = "draft-fixed")]
    draft_fixed: bool,
    /// Run through the batch-invariant kernels (per-row products,
    /// recurrences token by token): the prompt costs what a speculative
    /// verification of `-p` tokens, or a prompt under `coil serve
    /// --batch-invariant`, costs; each generated token goes as `coil serve`
    /// decodes it (one entry of a batch call, batch-invariant).
    #[arg(long = "batch-invariant")]
    batch_invariant: bool,
    /// Run the prompt as `coil serve` runs prompts by default
    /// (`Numerics::CheapInvariant`: attention rows independent of each
    /// other, the fast GEMM and chunked recurrences), each generated token
    /// as it decodes them.
    #[arg(long = "serve-numerics", conflicts_with = "batch_invariant")]
    serve_numerics: bool,
    /// With a constraint: generation only (`-n`; no prompt test), greedy
    /// with and without it, alternating, and what the masks cost per token.
    #[command(flatten)]
    constraint: ConstraintArgs,
}

/// Mean and sample standard deviation of tokens/s over repetitions.
#[derive(Clone, Debug, Default)]
struct Stats {
    mean: f64,
    std: f64,
    secs: Vec<f64>,
}

impl Stats {
    fn new(n_tokens: usize, secs: Vec<f64>) -> Stats {
        let tps: Vec<f64> = secs.iter().map(|&s| n_tokens as f64 / s).collect();
        let n = tps.len() as f64;
        let mean = tps.iter().sum::<f64>() / n;
        let std = if tps.len() > 1 {
            (tps.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        Stats { mean, std, secs }
    }
}

/// A small deterministic generator (splitmix64) for the random tokens.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn token(&mut self, n_vocab: usize) -> u32 {
        (self.next() % n_vocab as u64) as u32
    }
}

/// llama.cpp's `general.file_type` values (`enum llama_ftype`).
fn ftype_name(v: u64) -> String {
    let name = match v {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return format!("ftype {v}"),
    };
    name.to_string()
}

/// (tensor bytes, parameters, file type) as llama-bench reports them.
fn model_totals(file: &GgufFile) -> (u64, u64, String) {
    let bytes = file.tensors().iter().map(|t| t.n_bytes).sum();
    let params = file.tensors().iter().map(|t| t.n_elements).sum();
    let ftype = file
        .metadata()
        .get_u64("general.file_type")
        .map(ftype_name)
        .unwrap_or_else(|| "?".to_string());
    (bytes, params, ftype)
}

/// Peak resident memory of this process (Linux; `None` elsewhere).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The sequence a run starts from: sequence 0 emptied, or (at a depth)
/// sequence 1 as a fresh fork of the context held by sequence 0.
fn start_seq(engine: &mut Engine, depth: usize) -> Result<SeqId> {
    if depth == 0 {
        engine.seq_clear(0)?;
        return Ok(0);
    }
    engine.seq_clear(1)?;
    engine.seq_fork(0, 1)?;
    Ok(1)
}

/// One prompt test: `n` random tokens after `depth` tokens of context.
fn run_prompt(
    engine: &mut Engine,
    rng: &mut Rng,
    n: usize,
    ubatch: usize,
    depth: usize,
    numerics: Numerics,
) -> Result<f64> {
    let n_vocab = engine.n_vocab();
    let tokens: Vec<u32> = (0..n).map(|_| rng.token(n_vocab)).collect();
    let seq = start_seq(engine, depth)?;
    let t0 = Instant::now();
    let saved = std::mem::replace(&mut engine.opts.n_ubatch, ubatch);
    let entry = BatchEntry {
        seq,
        tokens: &tokens,
        logits: LogitRows::Last,
    };
    let out = engine.decode_batch_with(&[entry], numerics);
    engine.opts.n_ubatch = saved;
    out?;
    Ok(t0.elapsed().as_secs_f64())
}

/// One generation test: `n` single-token calls after `depth` tokens of
/// context.
fn run_gen(
    engine: &mut Engine,
    rng: &mut Rng,
    n: usize,
    depth: usize,
    numerics: Numerics,
) -> Result<f64> {
    let n_vocab = engine.n_vocab();
    let seq = start_seq(engine, depth)?;
    let t0 = Instant::now();
    for _ in 0..n {
        let t = rng.token(n_vocab);
        match numerics {
            Numerics::Fast => {
                engine.eval(seq, &[t], LogitRows::Last, 1)?;
            }
            // as `coil serve` decodes: one entry through the batch call,
            // batch-invariant (`CheapInvariant` would take the chunked
            // scans for a token, which `coil serve` runs on prompts only)
            Numerics::BatchInvariant | Numerics::CheapInvariant => {
                let entry = BatchEntry {
                    seq,
                    tokens: &[t],
                    logits: LogitRows::Last,
                };
                engine.decode_batch_with(&[entry], Numerics::BatchInvariant)?;
            }
        }
    }
    Ok(t0.elapsed().as_secs_f64())
}

pub fn run(a: Args) -> Result<()> {
    if a.reps == 0 {
        bail!("--repetitions must be at least 1");
    }
    if a.ubatch == 0 {
        bail!("--ubatch must be at least 1");
    }
    if a.n_prompt == 0 && a.n_gen == 0 {
        bail!("nothing to measure: -p and -n are both 0");
    }
    if a.constraint.spec()?.is_some() {
        if !a.parallel.is_empty()
            || a.depth > 0
            || a.batch_invariant
            || a.serve_numerics
            || a.spec.is_some()
        {
            bail!("a constraint is measured alone: leave out --parallel, -d, --spec, --batch-invariant and --serve-numerics");
        }
        let b = super::bench_constraint::ConstraintBench {
            constraint: &a.constraint,
            n_gen: a.n_gen,
            reps: a.reps,
            no_warmup: a.no_warmup,
            json: a.json,
        };
        return super::bench_constraint::run(&b, &a.model);
    }
    if let Some(mode) = a.spec {
        if !a.parallel.is_empty() || a.depth > 0 {
            bail!("--spec takes neither --parallel nor a depth (-d)");
        }
        if !(1..=coil::engine::draft::MAX_NGRAM).contains(&a.ngram) {
            bail!(
                "--ngram must be between 1 and {}, got {}",
                coil::engine::draft::MAX_NGRAM,
                a.ngram
            );
        }
        let b = super::bench_spec::SpecBench {
            mode,
            draft_max: &a.draft_max,
            ngram: a.ngram,
            fixed: a.draft_fixed,
            n_prompt: a.n_prompt,
            n_gen: a.n_gen,
            reps: a.reps,
            seed: a.seed,
            json: a.json,
            model_draft: a.model_draft.as_deref(),
            prompt_text: match &a.prompt_file {
                Some(p) => Some(
                    std::fs::read_to_string(p)
                        .with_context(|| format!("reading {}", p.display()))?,
                ),
                None => None,
            },
        };
        return super::bench_spec::run(&b, &a.model);
    }
    let mut margs = a.model.clone();
    margs.ctx_at_least(a.depth + a.n_prompt.max(a.n_gen));
    if !a.parallel.is_empty() {
        if a.batch_invariant || a.serve_numerics {
            bail!("--batch-invariant and --serve-numerics measure one sequence's prompt: leave out --parallel");
        }
        return run_parallel(&a, &margs);
    }
    let t_load = Instant::now();
    let mut engine = margs.load(if a.depth > 0 { 2 } else { 1 }, a.ubatch, false)?;
    let load_secs = t_load.elapsed().as_secs_f64();
    let (size, params, ftype) = model_totals(&engine.file);
    let arch = engine.model.info().arch.clone();
    let model_type = format!("{arch} {ftype}");
    let threads = engine.pool.n_threads();
    let system = super::common::simd_info()?;
    let mut rng = Rng(a.seed);
    let numerics = match (a.batch_invariant, a.serve_numerics) {
        (true, _) => Numerics::BatchInvariant,
        (false, true) => Numerics::CheapInvariant,
        (false, false) => Numerics::Fast,
    };
    if a.depth > 0 {
        let n_vocab = engine.n_vocab();
        let context: Vec<u32> = (0..a.depth).map(|_| rng.token(n_vocab)).collect();
        engine.seq_clear(0)?;
        engine.eval(0, &context, LogitRows::Last, a.ubatch)?;
    }

    if !a.no_warmup {
        if a.n_prompt > 0 {
            run_prompt(
                &mut engine,
                &mut rng,
                a.n_prompt,
                a.ubatch,
                a.depth,
                numerics,
            )?;
        }
        if a.n_gen > 0 {
            run_gen(&mut engine, &mut rng, 1, a.depth, numerics)?;
        }
    }
    let mut pp = None;
    if a.n_prompt > 0 {
        let mut secs = Vec::with_capacity(a.reps);
        for _ in 0..a.reps {
            secs.push(run_prompt(
                &mut engine,
                &mut rng,
                a.n_prompt,
                a.ubatch,
                a.depth,
                numerics,
            )?);
        }
        pp = Some(Stats::new(a.n_prompt, secs));
    }
    let mut tg = None;
    if a.n_gen > 0 {
        let mut secs = Vec::with_capacity(a.reps);
        for _ in 0..a.reps {
            secs.push(run_gen(&mut engine, &mut rng, a.n_gen, a.depth, numerics)?);
        }
        tg = Some(Stats::new(a.n_gen, secs));
    }
    engine.seq_clear(0)?;
    if a.depth > 0 {
        engine.seq_clear(1)?;
    }

    if a.json {
        let mean = |s: &Option<Stats>| s.as_ref().map(|s| s.mean);
        let std = |s: &Option<Stats>| s.as_ref().map(|s| s.std);
        let secs = |s: &Option<Stats>| s.as_ref().map(|s| s.secs.clone());
        let out = json!({
            "model": a.model.model.display().to_string(),
            "model_type": model_type,
            "arch": arch,
            "ftype": ftype,
            "model_size": size,
            "model_n_params": params,
            "file_size": engine.file.file_len(),
            "threads": threads,
            "simd": coil_kernels::simd::level().name(),
            "cpu_simd": coil_kernels::simd::cpu_level().name(),
            "cpu_features": coil_kernels::simd::cpu_features()
                .into_iter()
                .filter(|(_, has)| *has)
                .map(|(name, _)| name)
                .collect::<Vec<_>>(),
            "system_info": system,
            "weights": engine.weights_where(),
            "n_prompt": a.n_prompt,
            "n_gen": a.n_gen,
            "n_depth": a.depth,
            "n_ubatch": a.ubatch,
            "batch_invariant": a.batch_invariant,
            "serve_numerics": a.serve_numerics,
            "repetitions": a.reps,
            "checkpoint_interval": margs.checkpoint_interval,
            "checkpoint_every_token": margs.checkpoint_every_token,
            "state_type": margs.state_type.name(),
            "cache_type": margs.cache_type.name(),
            "pp_tps": mean(&pp),
            "pp_tps_std": std(&pp),
            "pp_secs": secs(&pp),
            "tg_tps": mean(&tg),
            "tg_tps_std": std(&tg),
            "tg_secs": secs(&tg),
            "load_secs": load_secs,
            "peak_rss_bytes": peak_rss_bytes(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }

    eprintln!("system: {system}");
    eprintln!("weights: {}", engine.weights_where());
    let mib = size as f64 / (1u64 << 20) as f64;
    let mparams = params as f64 / 1e6;
    println!("| model | size | params | threads | test | t/s |");
    println!("| --- | ---: | ---: | ---: | --- | ---: |");
    let at = match a.depth {
        0 => String::new(),
        d => format!(" @ d{d}"),
    };
    let rows = [
        (format!("pp{}{at}", a.n_prompt), &pp),
        (format!("tg{}{at}", a.n_gen), &tg),
    ];
    for (test, s) in rows {
        if let Some(s) = s {
            println!(
                "| {model_type} | {mib:.2} MiB | {mparams:.2} M | {threads} | {test} | {:.2} ± {:.2} |",
                s.mean, s.std
            );
        }
    }
    if let Some(rss) = peak_rss_bytes() {
        eprintln!("peak RSS: {:.1} MiB", rss as f64 / (1u64 << 20) as f64);
    }
    Ok(())
}

/// `--parallel`: N sequences decoding together.
fn run_parallel(a: &Args, margs: &super::common::ModelArgs) -> Result<()> {
    if a.depth > 0 {
        bail!("--parallel does not take a depth (-d)");
    }
    let n_max = a.parallel.iter().copied().max().unwrap_or(1).max(1);
    let mut margs = margs.clone();
    margs.ctx_at_least(a.n_prompt + a.n_gen);
    let mut engine = margs.load(n_max, a.ubatch, true)?;
    let (weight_bytes, _, ftype) = model_totals(&engine.file);
    let model_type = format!("{} {ftype}", engine.model.info().arch);
    let threads = engine.pool.n_threads();
    let traffic = super::bench_parallel::Traffic {
        weight_bytes,
        state_bytes_per_seq: engine
            .mem
            .recurrent
            .as_ref()
            .map_or(0, |r| r.bytes_per_seq() as u64),
    };
    let rows = super::bench_parallel::measure(
        &mut engine,
        &a.parallel,
        a.n_prompt,
        a.n_gen,
        a.reps,
        !a.no_warmup,
        a.seed,
    )?;
    super::bench_parallel::print(
        &rows,
        &model_type,
        threads,
        a.n_prompt,
        a.n_gen,
        traffic,
        a.json,
    );
    Ok(())
}
