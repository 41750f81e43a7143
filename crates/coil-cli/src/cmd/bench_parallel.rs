//! `coil bench --parallel 1,2,4,8`: N sequences at once, as llama.cpp's
//! `llama-batched-bench` measures them.
//!
//! For each N: N empty sequences each get a prompt of `p` random tokens,
//! all in one [`Engine::decode_batch`] call (micro-batches of `--ubatch`
//! tokens, logits of each prompt's last token), then `n` steps that each
//! feed one random token to every sequence in one call, through the
//! batch-invariant kernels as `coil serve` runs generated tokens. Reported: prompt
//! tokens/s (N·p over the prompt time), generation tokens/s (N·n over the
//! generation time), the time per step, and the process's CPU seconds per
//! generated token (user + system, every thread; on a shared machine it
//! moves less than wall time), and the least bytes a step moves (weights
//! once, every state read and written) with the GB/s that makes: divided
//! by the machine's read bandwidth, the batch-decode roofline fraction.
//! Best of `r` repetitions, after a warm-up.

use anyhow::{bail, Result};
use coil::engine::{BatchEntry, Engine, Numerics};
use coil::models::LogitRows;
use serde_json::json;
use std::time::Instant;

/// Tokens/s of one measured phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct Phase {
    pub secs: f64,
    pub cpu_secs: f64,
}

/// CPU seconds (user + system) of this process so far, from
/// `/proc/self/stat` (Linux; 0 elsewhere).
pub(super) fn cpu_secs() -> f64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) in parentheses.
    let Some(rest) = s.rfind(')').map(|i| &s[i + 2..]) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, Phase)> {
    let (c0, t0) = (cpu_secs(), Instant::now());
    let v = f()?;
    Ok((
        v,
        Phase {
            secs: t0.elapsed().as_secs_f64(),
            cpu_secs: cpu_secs() - c0,
        },
    ))
}

/// One run at N sequences: (prompt phase, generation phase).
fn run_once(
    engine: &mut Engine,
    rng: &mut impl FnMut() -> u32,
    n_seq: usize,
    n_prompt: usize,
    n_gen: usize,
) -> Result<(Phase, Phase)> {
    for s in 0..n_seq {
        engine.seq_clear(s)?;
    }
    let prompts: Vec<Vec<u32>> = (0..n_seq)
        .map(|_| (0..n_prompt).map(|_| rng()).collect())
        .collect();
    let (_, pp) = timed(|| {
        if n_prompt > 0 {
            let entries: Vec<BatchEntry> = prompts
                .iter()
                .enumerate()
                .map(|(s, p)| BatchEntry {
                    seq: s,
                    tokens: p,
                    logits: LogitRows::Last,
                })
                .collect();
            engine.decode_batch(&entries)?;
        }
        Ok(())
    })?;
    let steps: Vec<Vec<u32>> = (0..n_gen)
        .map(|_| (0..n_seq).map(|_| rng()).collect())
        .collect();
    let (_, tg) = timed(|| {
        for step in &steps {
            let entries: Vec<BatchEntry> = step
                .iter()
                .enumerate()
                .map(|(s, t)| BatchEntry {
                    seq: s,
                    tokens: std::slice::from_ref(t),
                    logits: LogitRows::Last,
                })
                .collect();
            // As `coil serve` decodes: through the batch-invariant kernels
            // (the fast ones switch to a GEMM from a dozen tokens on, which
            // the server never uses for generated tokens), the logits read
            // in place and their buffer handed back for the next step.
            let logits = engine.decode_batch_logits(&entries, Numerics::BatchInvariant)?;
            engine.recycle(logits);
        }
        Ok(())
    })?;
    Ok((pp, tg))
}

/// What `coil bench --parallel` measured at one N.
pub struct Row {
    pub n_seq: usize,
    pub pp: Phase,
    pub tg: Phase,
}

/// Runs every N in `levels` (the engine must hold max N sequences);
/// best of `reps` per phase.
pub fn measure(
    engine: &mut Engine,
    levels: &[usize],
    n_prompt: usize,
    n_gen: usize,
    reps: usize,
    warmup: bool,
    seed: u64,
) -> Result<Vec<Row>> {
    if levels.contains(&0) {
        bail!("--parallel: every sequence count must be at least 1");
    }
    let n_vocab = engine.n_vocab() as u64;
    let mut state = seed;
    let mut rng = move || {
        // splitmix64, as the single-sequence bench.
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n_vocab) as u32
    };
    let mut rows = Vec::new();
    for &n in levels {
        if warmup {
            run_once(engine, &mut rng, n, n_prompt.min(16), n_gen.min(2))?;
        }
        let mut best: Option<Row> = None;
        for _ in 0..reps {
            let (pp, tg) = run_once(engine, &mut rng, n, n_prompt, n_gen)?;
            let b = best.get_or_insert(Row { n_seq: n, pp, tg });
            if pp.secs < b.pp.secs {
                b.pp = pp;
            }
            if tg.secs < b.tg.secs {
                b.tg = tg;
            }
        }
        rows.extend(best);
    }
    for s in 0..levels.iter().copied().max().unwrap_or(0) {
        engine.seq_clear(s)?;
    }
    Ok(rows)
}

fn tps(tokens: usize, p: &Phase) -> f64 {
    if p.secs > 0.0 {
        tokens as f64 / p.secs
    } else {
        0.0
    }
}

/// Bytes a decode step must move at least: the weights once, and each
/// sequence's recurrent state read and written (attention caches left out:
/// small at these lengths).
#[derive(Clone, Copy, Debug)]
pub struct Traffic {
    pub weight_bytes: u64,
    pub state_bytes_per_seq: u64,
}

impl Traffic {
    fn step_bytes(&self, n_seq: usize) -> f64 {
        self.weight_bytes as f64 + 2.0 * n_seq as f64 * self.state_bytes_per_seq as f64
    }

    /// GB/s a generation phase moved at that minimum (compare with the
    /// machine's read bandwidth for the roofline fraction).
    fn gbps(&self, r: &Row, n: usize) -> f64 {
        if r.tg.secs > 0.0 {
            self.step_bytes(r.n_seq) * n as f64 / r.tg.secs / 1e9
        } else {
            0.0
        }
    }
}

/// The table (or JSON lines) of `coil bench --parallel`.
#[allow(clippy::too_many_arguments)]
pub fn print(
    rows: &[Row],
    model_type: &str,
    threads: usize,
    p: usize,
    n: usize,
    traffic: Traffic,
    as_json: bool,
) {
    if as_json {
        for r in rows {
            let v = json!({
                "model_type": model_type,
                "threads": threads,
                "n_seq": r.n_seq,
                "n_prompt": p,
                "n_gen": n,
                "pp_secs": r.pp.secs,
                "pp_tps": tps(r.n_seq * p, &r.pp),
                "tg_secs": r.tg.secs,
                "tg_tps": tps(r.n_seq * n, &r.tg),
                "tg_cpu_secs_per_token": r.tg.cpu_secs / (r.n_seq * n).max(1) as f64,
                "step_bytes": traffic.step_bytes(r.n_seq),
                "tg_gbps": traffic.gbps(r, n),
            });
            println!("{v}");
        }
        return;
    }
    println!(
        "| model | threads | N | pp | S_PP t/s | tg | S_TG t/s | ms/step | CPU ms/token | MB/step | GB/s |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in rows {
        let steps = n.max(1) as f64;
        println!(
            "| {model_type} | {threads} | {} | {p} | {:.1} | {n} | {:.1} | {:.1} | {:.2} | {:.0} | {:.1} |",
            r.n_seq,
            tps(r.n_seq * p, &r.pp),
            tps(r.n_seq * n, &r.tg),
            r.tg.secs / steps * 1e3,
            r.tg.cpu_secs / (r.n_seq * n).max(1) as f64 * 1e3,
            traffic.step_bytes(r.n_seq) / 1e6,
            traffic.gbps(r, n),
        );
    }
}
