//! `coil bench --json-schema S` (or `--grammar`, `--grammar-file`,
//! `--json-schema-file`): what a constraint costs generation. Both tests
//! decode `-n` tokens one at a time after a 1-token prompt, each token the
//! greedy choice of the previous logits (the sampler's own greedy path):
//!
//! - free: the choice among all tokens;
//! - constrained: the choice among the tokens the constraint allows, its
//!   mask computed beside the forward pass as generation does it
//!   ([`coil::engine::constraint::beside`]), then applied to the logits.
//!   When the output is complete (only an end-of-generation token is
//!   allowed) the constraint starts over, so every run decodes `n` tokens.
//!
//! One warm-up of each, then `-r` repetitions of each, alternating (free,
//! constrained, free, ...) so that a shared host's drift touches both
//! alike. Beside tokens/s, per token: the mask computation's own time
//! (the last constrained run's tokens replayed through the constraint
//! alone), how much of it outlasted the forward pass it ran beside, and
//! the serial time of applying the mask and choosing the token.

use super::common::{ConstraintArgs, ModelArgs};
use anyhow::{Context, Result};
use coil::engine::constraint::{beside, Constraint};
use coil::engine::sampling::{Sampler, SamplingParams};
use coil::engine::Engine;
use coil::models::LogitRows;
use coil::tokenizer::Tokenizer;
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

/// One run's figures.
#[derive(Clone, Debug, Default)]
struct Run {
    secs: f64,
    /// Seconds the steps waited past their forward pass (the mask
    /// computation that outlasted it, and the thread's start and join).
    mask_secs: f64,
    /// Seconds applying the mask and choosing the token.
    pick_secs: f64,
    /// Times the constraint was complete and started over.
    restarts: usize,
    /// The tokens chosen.
    tokens: Vec<u32>,
}

/// Advances `c` past `tok`, or starts it over from `template` where the
/// output is complete; whether it started over.
fn advance(
    c: &mut Constraint,
    template: &Constraint,
    tokenizer: &Tokenizer,
    tok: u32,
) -> Result<bool> {
    if !tokenizer.is_eog(tok) {
        c.commit(tok)?;
        if !c.is_finished() {
            return Ok(false);
        }
    }
    *c = template.clone();
    Ok(true)
}

/// The mask computation's own time per token (ms: mean, max), alone on
/// this thread: `tokens` replayed through a fresh copy of `template`.
fn mask_times(template: &Constraint, tokenizer: &Tokenizer, tokens: &[u32]) -> Result<(f64, f64)> {
    let mut c = template.clone();
    let (mut sum, mut max) = (0.0f64, 0.0f64);
    for &tok in tokens {
        let t = Instant::now();
        c.prepare()?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        sum += ms;
        max = max.max(ms);
        advance(&mut c, template, tokenizer, tok)?;
    }
    Ok((sum / tokens.len().max(1) as f64, max))
}

fn run_once(
    engine: &mut Engine,
    tokenizer: &Tokenizer,
    template: Option<&Constraint>,
    n: usize,
    first: u32,
) -> Result<Run> {
    engine.seq_clear(0)?;
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let mut constraint = template.cloned();
    let mut run = Run::default();
    let t0 = Instant::now();
    let mut mask_secs = 0.0;
    // The masks are computed on another thread while the model runs.
    let step = |engine: &mut Engine, c: &mut Option<Constraint>, tok: u32| {
        let mut cs: Vec<&mut Constraint> = c.iter_mut().collect();
        let (out, masks) = beside(&mut cs, || {
            let t = Instant::now();
            let r = engine.eval(0, &[tok], LogitRows::Last, 1);
            (r, t.elapsed().as_secs_f64())
        });
        masks?;
        let (logits, fwd) = out;
        Ok::<_, anyhow::Error>((logits?, fwd))
    };
    let (mut logits, _) = step(engine, &mut constraint, first)?;
    for _ in 0..n {
        let t = Instant::now();
        let tok = match constraint.as_mut() {
            Some(c) => {
                let mask = c.mask(0)?;
                sampler.sample_masked(&logits, Some(mask))
            }
            None => sampler.sample(&logits),
        };
        run.pick_secs += t.elapsed().as_secs_f64();
        run.tokens.push(tok);
        if let (Some(c), Some(tpl)) = (constraint.as_mut(), template) {
            if advance(c, tpl, tokenizer, tok)? {
                run.restarts += 1;
            }
        }
        let t = Instant::now();
        let (l, fwd) = step(engine, &mut constraint, tok)?;
        // The step's time past the forward pass: the mask computation
        // that outlasted it (beside it, the rest of its time is hidden).
        mask_secs += (t.elapsed().as_secs_f64() - fwd).max(0.0);
        logits = l;
    }
    run.secs = t0.elapsed().as_secs_f64();
    run.mask_secs = mask_secs;
    engine.seq_clear(0)?;
    Ok(run)
}

/// Mean tokens/s and its sample standard deviation.
fn tps(n: usize, runs: &[Run]) -> (f64, f64) {
    let v: Vec<f64> = runs.iter().map(|r| n as f64 / r.secs).collect();
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let sd = if v.len() > 1 {
        (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
    } else {
        0.0
    };
    (m, sd)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub struct ConstraintBench<'a> {
    pub constraint: &'a ConstraintArgs,
    pub n_gen: usize,
    pub reps: usize,
    pub no_warmup: bool,
    pub json: bool,
}

pub fn run(b: &ConstraintBench, margs: &ModelArgs) -> Result<()> {
    if b.n_gen == 0 {
        anyhow::bail!("a constraint is measured on generation: give -n above 0");
    }
    let mut margs = margs.clone();
    margs.ctx_at_least(b.n_gen + 1);
    let mut engine = margs.load(1, 512, false)?;
    let tokenizer = Arc::new(
        Tokenizer::from_gguf(&engine.file)
            .with_context(|| format!("reading the tokenizer of {}", margs.model.display()))?,
    );
    let t = Instant::now();
    let Some(template) = b.constraint.compile(&tokenizer)? else {
        anyhow::bail!("no constraint given");
    };
    let compile_secs = t.elapsed().as_secs_f64();
    let first = tokenizer.bos_id().unwrap_or(0);
    let threads = engine.pool.n_threads();
    if !b.no_warmup {
        run_once(&mut engine, &tokenizer, None, 1, first)?;
        run_once(&mut engine, &tokenizer, Some(&template), 1, first)?;
    }
    let (mut free, mut constrained) = (Vec::new(), Vec::new());
    for _ in 0..b.reps {
        free.push(run_once(&mut engine, &tokenizer, None, b.n_gen, first)?);
        constrained.push(run_once(
            &mut engine,
            &tokenizer,
            Some(&template),
            b.n_gen,
            first,
        )?);
    }
    let (f, f_sd) = tps(b.n_gen, &free);
    let (c, c_sd) = tps(b.n_gen, &constrained);
    let ratios: Vec<f64> = free
        .iter()
        .zip(&constrained)
        .map(|(a, b)| a.secs / b.secs)
        .collect();
    let ratio = median(ratios.clone());
    let per_tok = |runs: &[Run], g: fn(&Run) -> f64| {
        1e3 * runs.iter().map(g).sum::<f64>() / (runs.len() * b.n_gen) as f64
    };
    let mask_ms = per_tok(&constrained, |r| r.mask_secs);
    let pick_ms = per_tok(&constrained, |r| r.pick_secs);
    let free_pick_ms = per_tok(&free, |r| r.pick_secs);
    let restarts: usize = constrained.iter().map(|r| r.restarts).sum();
    let last = constrained
        .last()
        .map(|r| r.tokens.as_slice())
        .unwrap_or(&[]);
    let (alone_ms, alone_max_ms) = mask_times(&template, &tokenizer, last)?;
    let fwd_ms = 1e3 * free.iter().map(|r| r.secs).sum::<f64>() / (free.len() * b.n_gen) as f64;
    if b.json {
        let out = json!({
            "model": margs.model.display().to_string(),
            "threads": threads,
            "n_gen": b.n_gen,
            "repetitions": b.reps,
            "compile_secs": compile_secs,
            "free_tps": f,
            "free_tps_std": f_sd,
            "constrained_tps": c,
            "constrained_tps_std": c_sd,
            "ratio_median": ratio,
            "ratios": ratios,
            "mask_outlasting_forward_ms_per_token": mask_ms,
            "mask_alone_ms_per_token": alone_ms,
            "mask_alone_max_ms": alone_max_ms,
            "free_ms_per_token": fwd_ms,
            "pick_ms_per_token": pick_ms,
            "free_pick_ms_per_token": free_pick_ms,
            "restarts": restarts,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("| test | threads | t/s |");
    println!("| --- | ---: | ---: |");
    println!("| tg{} free | {threads} | {f:.2} ± {f_sd:.2} |", b.n_gen);
    println!(
        "| tg{} constrained | {threads} | {c:.2} ± {c_sd:.2} |",
        b.n_gen
    );
    println!(
        "constrained / free: {ratio:.3} (median of {} alternating pairs); per token: \
         mask computation {alone_ms:.3} ms alone (max {alone_max_ms:.3}; a free token takes \
         {fwd_ms:.1} ms), {mask_ms:.3} ms of it outlasting the forward pass; mask applied \
         and token chosen {pick_ms:.3} ms (free: {free_pick_ms:.3} ms); compiled in {:.3} s; \
         {restarts} restarts of a complete output",
        b.reps, compile_secs
    );
    Ok(())
}
