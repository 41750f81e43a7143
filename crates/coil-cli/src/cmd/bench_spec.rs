//! `coil bench --spec MODE`: speculative decoding measured.
//!
//! - `verify`: the cost of one verification of k + 1 tokens against one
//!   single-token decode step, for each k of `--draft-max` (e.g.
//!   `1,2,4,8,16`), when the whole draft is accepted and when it is
//!   rejected at once (the state is then refolded, or replayed where the
//!   model cannot refold). The three are timed interleaved, `-n` times each
//!   per repetition, from a context of `-p` random tokens.
//! - `right`, `wrong`, `ngram`, `mtp`, `draft`: greedy generation of `-n`
//!   tokens after a prompt of `-p` random tokens (or `--prompt-file`'s
//!   text), plainly and with speculation, one after the other in each
//!   repetition. `right` drafts the model's own greedy continuation (every
//!   draft accepted: the upper bound), `wrong` drafts tokens that always
//!   differ from it (the lower bound), `ngram` looks the last tokens up in
//!   the prompt and the output (random prompts rarely repeat, but
//!   random-weight models do), `mtp` asks the model's own MTP layers (plain
//!   decoding then runs without their memory, as `coil run` does), `draft`
//!   a draft model (`--model-draft`). The adaptive draft length applies
//!   unless `--draft-fixed`. Reported: tokens/s of both, their ratio, the
//!   acceptance, and whether the tokens were identical (they must be).

use super::common::ModelArgs;
use anyhow::{bail, Context, Result};
use coil::engine::draft::{Drafter, NgramDrafter};
use coil::engine::generate::{generate_with, GenerateOptions};
use coil::engine::sampling::{Sampler, SamplingParams};
use coil::engine::speculative::{DraftModel, DraftSource, SpecCounts, Speculator};
use coil::engine::Engine;
use coil::models::LogitRows;
use coil::tokenizer::Tokenizer;
use serde_json::json;
use std::time::Instant;

/// What `--spec` measures in `coil bench`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchSpec {
    /// Drafts are the model's own greedy continuation (always accepted).
    Right,
    /// Drafts always differ from the model's choice (always rejected).
    Wrong,
    /// Prompt-lookup drafts.
    Ngram,
    /// The model's own MTP (NextN) layers.
    Mtp,
    /// A draft model (`--model-draft`).
    Draft,
    /// The cost of verifying k + 1 tokens against decoding one.
    Verify,
}

/// The settings `coil bench --spec` takes.
pub struct SpecBench<'a> {
    pub mode: BenchSpec,
    pub draft_max: &'a [usize],
    pub ngram: usize,
    pub fixed: bool,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub reps: usize,
    pub seed: u64,
    pub json: bool,
    /// The draft model of `draft`.
    pub model_draft: Option<&'a std::path::Path>,
    /// A text whose tokens are the prompt (instead of random ones).
    pub prompt_text: Option<String>,
}

/// The model's greedy continuation (or, `wrong`, always something else).
struct Oracle {
    prompt_len: usize,
    want: Vec<u32>,
    wrong: bool,
    n_vocab: u32,
}

impl Drafter for Oracle {
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        // history = prompt, then the generated tokens up to the next one.
        let at = history.len().saturating_sub(self.prompt_len);
        self.want
            .iter()
            .skip(at)
            .take(max)
            .map(|&t| {
                if self.wrong {
                    (t + 1) % self.n_vocab
                } else {
                    t
                }
            })
            .collect()
    }
}

fn random_tokens(seed: &mut u64, n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = *seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) % n_vocab as u64) as u32
        })
        .collect()
}

pub fn run(b: &SpecBench, margs: &ModelArgs) -> Result<()> {
    if b.draft_max.is_empty() || b.draft_max.iter().any(|&k| k == 0 || k > 64) {
        bail!("--draft-max takes draft lengths between 1 and 64");
    }
    if b.n_gen == 0 {
        bail!("-n must be at least 1 with --spec");
    }
    let kmax = b.draft_max.iter().copied().max().unwrap_or(1);
    let mut margs = margs.clone();
    let need = match b.mode {
        BenchSpec::Verify => b.n_prompt + 1 + b.reps * b.n_gen * (kmax + 3),
        _ => b.n_prompt.max(1) + b.n_gen + kmax + 2,
    };
    margs.ctx_at_least(need);
    if b.mode == BenchSpec::Draft && b.model_draft.is_none() {
        bail!("--spec draft needs --model-draft FILE");
    }
    let mut engine = margs.load_with(1, 512, true, b.mode == BenchSpec::Mtp)?;
    let system = super::common::simd_info()?;
    eprintln!("system: {system}");
    eprintln!("memory: {}", engine.mem.describe());
    let name = format!("{}", margs.model.display());
    let mut draft = match (b.mode, b.model_draft) {
        (BenchSpec::Draft, Some(path)) => {
            let mut dargs = margs.clone();
            dargs.model = path.to_path_buf();
            let d = dargs
                .load(1, 512, true)
                .with_context(|| format!("loading the draft model {}", path.display()))?;
            Some(
                DraftModel::new(d, &engine)
                    .with_context(|| format!("the draft model {}", path.display()))?,
            )
        }
        _ => None,
    };
    match b.mode {
        BenchSpec::Verify => verify_cost(&mut engine, b, &name),
        _ => generation(&mut engine, &mut draft, b, &name),
    }
}

/// `--spec verify`.
fn verify_cost(engine: &mut Engine, b: &SpecBench, name: &str) -> Result<()> {
    let n_vocab = engine.n_vocab();
    let mut seed = b.seed;
    let mut rows = Vec::new();
    println!("| model | k | decode 1 (ms) | verify k+1, all kept (ms) | ratio | verify k+1, none kept (ms) | ratio | CPU-time ratios (all / none kept) |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let cpu = super::bench_parallel::cpu_secs;
    for &k in b.draft_max {
        // Wall and CPU seconds (user + system, every thread: on a shared
        // machine it moves less than wall time) of each kind.
        let mut t = [[0.0f64; 2]; 3];
        let mut replayed = 0;
        let timed = |t: &mut [f64; 2], f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
            let (c0, t0) = (cpu(), Instant::now());
            f()?;
            t[0] += t0.elapsed().as_secs_f64();
            t[1] += cpu() - c0;
            Ok(())
        };
        for _ in 0..b.reps {
            engine.seq_clear(0)?;
            let ctx = random_tokens(&mut seed, b.n_prompt.max(1), n_vocab);
            engine.eval(0, &ctx, LogitRows::Last, 0)?;
            // Warm-up of each kind.
            let warm = random_tokens(&mut seed, k + 1, n_vocab);
            engine.spec_verify(0, &warm)?;
            engine.spec_commit(0, 1)?;
            for _ in 0..b.n_gen {
                let one = random_tokens(&mut seed, 1, n_vocab);
                timed(&mut t[0], &mut || {
                    engine.eval(0, &one, LogitRows::Last, 1)?;
                    Ok(())
                })?;
                let toks = random_tokens(&mut seed, k + 1, n_vocab);
                timed(&mut t[1], &mut || {
                    engine.spec_verify(0, &toks)?;
                    engine.spec_commit(0, k + 1)?;
                    Ok(())
                })?;
                let toks = random_tokens(&mut seed, k + 1, n_vocab);
                timed(&mut t[2], &mut || {
                    engine.spec_verify(0, &toks)?;
                    replayed += engine.spec_commit(0, 1)?.replayed;
                    Ok(())
                })?;
            }
        }
        let n = (b.reps * b.n_gen) as f64;
        let ms = |i: usize| t[i][0] / n * 1e3;
        let (t1, tk, tr) = (ms(0), ms(1), ms(2));
        let (ck, cr) = (t[1][1] / t[0][1].max(1e-9), t[2][1] / t[0][1].max(1e-9));
        println!(
            "| {name} | {k} | {t1:.2} | {tk:.2} | {:.2} | {tr:.2} | {:.2} | {ck:.2} / {cr:.2} |",
            tk / t1,
            tr / t1
        );
        rows.push(json!({
            "k": k, "decode_ms": t1, "verify_all_kept_ms": tk, "verify_none_kept_ms": tr,
            "ratio_all_kept": tk / t1, "ratio_none_kept": tr / t1,
            "cpu_ratio_all_kept": ck, "cpu_ratio_none_kept": cr,
            "replayed_tokens": replayed,
        }));
    }
    if b.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "model": name, "verify": rows }))?
        );
    }
    Ok(())
}

/// `--spec right|wrong|ngram`.
fn generation(
    engine: &mut Engine,
    draft: &mut Option<DraftModel>,
    b: &SpecBench,
    name: &str,
) -> Result<()> {
    let tok = Tokenizer::from_gguf(&engine.file)
        .with_context(|| format!("reading the tokenizer of {name} (needed by --spec)"))?;
    let n_vocab = engine.n_vocab();
    let opts = GenerateOptions {
        max_tokens: b.n_gen,
        stop: Vec::new(),
        stop_at_eos: false,
    };
    let mut seed = b.seed;
    let mode = match b.mode {
        BenchSpec::Right => "right",
        BenchSpec::Wrong => "wrong",
        BenchSpec::Mtp => "mtp",
        BenchSpec::Draft => "draft model",
        _ => "ngram",
    };
    let text_prompt = b.prompt_text.as_ref().map(|t| tok.encode(t, true));
    // `mtp`: plain decoding without the MTP block's memory (as `coil run`
    // without --spec), speculation with it.
    let mtp = b.mode == BenchSpec::Mtp;
    let mut rows = Vec::new();
    println!("| model | drafts | k | plain t/s | spec t/s | ratio | CPU-time ratio | accepted / drafted | verifications | identical |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    let cpu = super::bench_parallel::cpu_secs;
    for &k in b.draft_max {
        let (mut plain_secs, mut spec_secs) = (0.0, 0.0);
        // CPU seconds of each whole run (prompt included, the same in both).
        let (mut plain_cpu, mut spec_cpu) = (0.0, 0.0);
        let mut counts = SpecCounts::default();
        let mut identical = true;
        let mut ratios = Vec::new();
        for r in 0..=b.reps {
            let prompt = match &text_prompt {
                Some(p) => p.clone(),
                None => random_tokens(&mut seed, b.n_prompt.max(1), n_vocab),
            };
            engine.set_nextn(false)?;
            engine.seq_clear(0)?;
            let mut s = Sampler::new(SamplingParams::greedy());
            let c0 = cpu();
            let plain = generate_with(engine, &tok, 0, &prompt, &mut s, &opts, None, |_| true)?;
            let plain_c = cpu() - c0;
            let source = match b.mode {
                BenchSpec::Ngram => DraftSource::Tokens(Box::new(NgramDrafter::new(b.ngram))),
                BenchSpec::Mtp => DraftSource::Nextn,
                BenchSpec::Draft => match draft.take() {
                    Some(d) => DraftSource::Model(Box::new(d)),
                    None => bail!("--spec draft needs --model-draft FILE"),
                },
                _ => DraftSource::Tokens(Box::new(Oracle {
                    prompt_len: prompt.len(),
                    want: plain.tokens.clone(),
                    wrong: b.mode == BenchSpec::Wrong,
                    n_vocab: n_vocab as u32,
                })),
            };
            let mut sp = Speculator::with_source(source, k);
            if b.fixed {
                sp.len = coil::engine::draft::AdaptiveLen::fixed(k);
            }
            engine.set_nextn(mtp)?;
            engine.seq_clear(0)?;
            let mut s = Sampler::new(SamplingParams::greedy());
            let c0 = cpu();
            let spec = generate_with(
                engine,
                &tok,
                0,
                &prompt,
                &mut s,
                &opts,
                Some(&mut sp),
                |_| true,
            )?;
            let spec_c = cpu() - c0;
            if let DraftSource::Model(d) = sp.source {
                *draft = Some(*d);
            }
            engine.set_nextn(false)?;
            // Every other round times plain decoding after the speculative
            // run instead of before it (the plain run above is then only the
            // drafts' reference), so neither gains from going second.
            let (plain, plain_c) = if r % 2 == 1 {
                engine.seq_clear(0)?;
                let mut s = Sampler::new(SamplingParams::greedy());
                let c0 = cpu();
                let again = generate_with(engine, &tok, 0, &prompt, &mut s, &opts, None, |_| true)?;
                (again, cpu() - c0)
            } else {
                (plain, plain_c)
            };
            // Round 0 is the warm-up.
            if r == 0 {
                continue;
            }
            plain_cpu += plain_c;
            spec_cpu += spec_c;
            identical &= spec.tokens == plain.tokens;
            plain_secs += plain.gen_secs;
            spec_secs += spec.gen_secs;
            ratios.push(plain.gen_secs / spec.gen_secs);
            if let Some(c) = &spec.spec {
                counts.add(c);
            }
        }
        let n = (b.reps * b.n_gen) as f64;
        let (pt, st) = (n / plain_secs, n / spec_secs);
        println!(
            "| {name} | {mode}{} | {k} | {pt:.2} | {st:.2} | {:.2} | {:.2} | {} / {} | {} | {} |",
            if b.fixed { " (fixed k)" } else { "" },
            st / pt,
            plain_cpu / spec_cpu.max(1e-9),
            counts.accepted,
            counts.drafted,
            counts.verifications,
            if identical { "yes" } else { "NO" }
        );
        rows.push(json!({
            "k": k, "mode": mode, "fixed": b.fixed, "plain_tps": pt, "spec_tps": st,
            "speedup": st / pt, "speedup_per_rep": ratios,
            "cpu_speedup": plain_cpu / spec_cpu.max(1e-9),
            "drafted": counts.drafted, "accepted": counts.accepted,
            "verifications": counts.verifications, "replayed": counts.replayed,
            "identical": identical,
        }));
    }
    if b.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "model": name, "spec": rows }))?
        );
    }
    Ok(())
}
