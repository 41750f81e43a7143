//! Rollback cost: how long `Engine::seq_truncate` takes to go back `d`
//! tokens, how many tokens it replays, and what the checkpoints cost in
//! memory — against the alternative, re-processing the kept prefix from an
//! empty sequence.
//!
//! ```text
//! cargo run --release -p coil --example rollback_bench -- MODEL.gguf \
//!     [--prompt 1024] [--threads N] [--interval 512] [--budget-mib 256] [--reps 3] [--fork]
//! ```
//!
//! With `--fork` it measures forks instead: after the prompt, how long
//! `Engine::seq_fork` takes, how much the memory grows at the fork and at
//! the first token each side decodes afterwards (medians over `--reps`).
//!
//! For each distance d the sequence is filled with the same random prompt
//! (default checkpoint policy: every 256 tokens, at call ends, 256 MiB per
//! sequence), then truncated to `len − d`; the next token's logits after the
//! rollback are checked against those of a sequence that only ever saw the
//! kept prefix. Times are medians over `--reps`.

use coil::engine::{Engine, EngineOptions};
use coil::memory::CheckpointPolicy;
use coil::models::LogitRows;
use std::error::Error;
use std::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

struct Opts {
    model: String,
    prompt: usize,
    threads: usize,
    interval: usize,
    budget_mib: usize,
    reps: usize,
    fork: bool,
}

fn parse() -> Result<Opts> {
    let mut o = Opts {
        model: String::new(),
        prompt: 1024,
        threads: coil_kernels::ThreadPool::default_threads(),
        interval: 512,
        budget_mib: 256,
        reps: 3,
        fork: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> Result<usize> {
            let v = args.next().ok_or(format!("{name} needs a value"))?;
            Ok(v.parse().map_err(|e| format!("{name} {v}: {e}"))?)
        };
        match a.as_str() {
            "--prompt" => o.prompt = num("--prompt")?,
            "--threads" | "-t" => o.threads = num("--threads")?,
            "--interval" => o.interval = num("--interval")?,
            "--budget-mib" => o.budget_mib = num("--budget-mib")?,
            "--reps" => o.reps = num("--reps")?,
            "--fork" => o.fork = true,
            _ if a.starts_with('-') => return Err(format!("unknown option {a}").into()),
            _ => o.model = a,
        }
    }
    if o.model.is_empty() {
        return Err("usage: rollback_bench MODEL.gguf [--prompt N] [--threads N] [--interval N] [--budget-mib N] [--reps N] [--fork]".into());
    }
    if o.prompt < 2 || o.reps == 0 || o.threads == 0 {
        return Err("--prompt must be at least 2, --reps and --threads at least 1".into());
    }
    Ok(o)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn mib(b: usize) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// splitmix64 random tokens.
fn random_tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) % n_vocab as u64) as u32
        })
        .collect()
}

/// Clears sequence 0 and processes `tokens`; returns the seconds taken.
fn prefill(engine: &mut Engine, tokens: &[u32]) -> Result<f64> {
    engine.seq_clear(0)?;
    let t0 = Instant::now();
    engine.eval(0, tokens, LogitRows::None, 0)?;
    Ok(t0.elapsed().as_secs_f64())
}

fn checkpoint_positions(engine: &Engine) -> Result<Vec<usize>> {
    let r = engine.mem.recurrent.as_ref().ok_or("no recurrent memory")?;
    Ok(r.checkpoints(0)?.iter().map(|c| c.pos).collect())
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn main() -> Result<()> {
    let o = parse()?;
    let opts = EngineOptions {
        n_threads: o.threads,
        n_seq_max: if o.fork { 2 } else { 1 },
        n_ctx: o.prompt + 64,
        n_ubatch: 512,
        checkpoints: CheckpointPolicy {
            interval: o.interval,
            budget_bytes: o.budget_mib << 20,
            ..Default::default()
        },
    };
    let mut engine = Engine::load(&o.model, opts)?;
    let info = engine.model.info();
    println!(
        "model: {} ({}, {} layers [{}]), {} threads, prompt {} random tokens, checkpoint interval {}, budget {} MiB, ubatch 512",
        o.model,
        info.arch,
        info.plan.layers.len(),
        info.plan.pattern(),
        engine.pool.n_threads(),
        o.prompt,
        o.interval,
        o.budget_mib
    );
    let n = o.prompt;
    let tokens = random_tokens(n + 1, engine.n_vocab(), 7);
    let prompt = &tokens[..n];

    if o.fork {
        return fork_bench(&mut engine, &tokens, o.reps);
    }

    // Warm-up, then the cost of processing the whole prompt from scratch.
    prefill(&mut engine, prompt)?;
    let full = median(
        (0..o.reps)
            .map(|_| prefill(&mut engine, prompt))
            .collect::<Result<Vec<_>>>()?,
    );
    let (state, cps, cp_bytes, max_cps) = {
        let r = engine
            .mem
            .recurrent
            .as_ref()
            .ok_or("the model has no recurrent layers")?;
        (
            r.bytes_per_seq(),
            checkpoint_positions(&engine)?,
            r.checkpoint_bytes(0)?,
            r.max_checkpoints(),
        )
    };
    let kv = engine.mem.kv.as_ref().map(|k| {
        use coil::memory::SequenceMemory;
        k.bytes()
    });
    println!(
        "prefill of {n} tokens from scratch: {:.1} ms ({:.1} tokens/s)",
        full * 1e3,
        n as f64 / full
    );
    println!(
        "recurrent state per sequence: {:.2} MiB; after the prefill: {} checkpoints at {:?} = {:.2} MiB (budget allows {}){}",
        mib(state),
        cps.len(),
        cps,
        mib(cp_bytes),
        max_cps,
        kv.map(|b| format!("; attention KV memory {:.2} MiB", mib(b)))
            .unwrap_or_default()
    );

    // What one checkpoint costs (a copy of the whole state), as taken at the
    // end of every decode call.
    let copy = {
        let r = engine.mem.recurrent.as_ref().ok_or("no recurrent memory")?;
        let flat = r.flat_state(0)?;
        let mut t = Vec::new();
        for _ in 0..o.reps.max(5) {
            let t0 = Instant::now();
            let v = std::sync::Arc::new(flat.to_vec());
            std::hint::black_box(&v);
            t.push(t0.elapsed().as_secs_f64());
        }
        median(t)
    };
    println!(
        "one checkpoint (copy of the state, as taken at each decode call end): {:.2} ms",
        copy * 1e3
    );

    println!();
    println!("| d | truncate to | restored from | replayed tokens | seq_truncate ms | re-process kept prefix from scratch ms | speed-up | next-token logits max abs diff |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for d in [1usize, 16, 64, 255, 256, 512, 1000] {
        if d >= n {
            continue;
        }
        let p = n - d;
        let mut t_rb = Vec::new();
        let mut t_scratch = Vec::new();
        let mut replayed = 0;
        let mut diff = 0.0f32;
        for _ in 0..o.reps {
            // Rollback: fill, then truncate.
            prefill(&mut engine, prompt)?;
            let stats = engine.seq_truncate(0, p)?;
            t_rb.push(stats.secs);
            replayed = stats.replayed;
            let after = engine.eval(0, &tokens[p..p + 1], LogitRows::Last, 0)?;
            // The alternative: only the kept prefix, from an empty sequence.
            t_scratch.push(prefill(&mut engine, &tokens[..p])?);
            let want = engine.eval(0, &tokens[p..p + 1], LogitRows::Last, 0)?;
            diff = diff.max(max_abs_diff(&after, &want));
        }
        let (rb, sc) = (median(t_rb), median(t_scratch));
        println!(
            "| {d} | {p} | {} | {replayed} | {:.2} | {:.1} | {:.0}× | {diff:.2e} |",
            p - replayed,
            rb * 1e3,
            sc * 1e3,
            sc / rb.max(1e-9)
        );
    }

    // Going back right after generating: call-end checkpoints.
    println!();
    println!("after the prompt and 8 single-token decode calls:");
    println!("| d | replayed tokens | seq_truncate ms | checkpoints held | MiB |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for d in [1usize, 2, 3, 8] {
        let mut t = Vec::new();
        let mut replayed = 0;
        let mut held = (0, 0);
        for _ in 0..o.reps {
            prefill(&mut engine, prompt)?;
            for i in 0..8 {
                engine.eval(0, &tokens[i..i + 1], LogitRows::Last, 1)?;
            }
            let r = engine.mem.recurrent.as_ref().ok_or("no recurrent memory")?;
            held = (r.checkpoints(0)?.len(), r.checkpoint_bytes(0)?);
            let len = engine.mem.seq_tokens(0)?.len();
            let stats = engine.seq_truncate(0, len - d)?;
            t.push(stats.secs);
            replayed = stats.replayed;
        }
        println!(
            "| {d} | {replayed} | {:.2} | {} | {:.1} |",
            median(t) * 1e3,
            held.0,
            mib(held.1)
        );
    }
    Ok(())
}

/// Bytes of attention cells and of current recurrent state the engine's
/// memory holds (each shared page or state counted once).
fn mem_bytes(engine: &Engine) -> (usize, usize) {
    use coil::memory::SequenceMemory;
    let kv = engine.mem.kv.as_ref().map_or(0, |k| k.bytes());
    let rec = engine
        .mem
        .recurrent
        .as_ref()
        .map_or(0, |r| r.resident_bytes());
    (kv, rec)
}

/// Fork cost: sequence 0 holds the prompt (`tokens[..n−1]`); sequence 1 is
/// forked from it, then both decode one (different) token.
fn fork_bench(engine: &mut Engine, tokens: &[u32], reps: usize) -> Result<()> {
    let n = tokens.len() - 1;
    let prompt = &tokens[..n];
    let t_prefill = prefill(engine, prompt)?;
    println!(
        "prefill of {n} tokens: {:.1} ms; sequence 0 holds {} tokens",
        t_prefill * 1e3,
        engine.mem.seq_tokens(0)?.len()
    );
    let (mut t_fork, mut t_dec1, mut t_dec0) = (Vec::new(), Vec::new(), Vec::new());
    let (mut g_fork, mut g_dec1, mut g_dec0) = ((0, 0), (0, 0), (0, 0));
    let mut diff = 0f32;
    let delta =
        |a: (usize, usize), b: (usize, usize)| (b.0 as i64 - a.0 as i64, b.1 as i64 - a.1 as i64);
    for _ in 0..reps {
        engine.seq_clear(1)?;
        let b0 = mem_bytes(engine);
        let t0 = Instant::now();
        engine.seq_fork(0, 1)?;
        t_fork.push(t0.elapsed().as_secs_f64());
        let b1 = mem_bytes(engine);
        // The fork decodes a token, then the source decodes the same one:
        // their logits must agree.
        let t0 = Instant::now();
        let a = engine.eval(1, &tokens[n..n + 1], LogitRows::Last, 1)?;
        t_dec1.push(t0.elapsed().as_secs_f64());
        let b2 = mem_bytes(engine);
        let t0 = Instant::now();
        let b = engine.eval(0, &tokens[n..n + 1], LogitRows::Last, 1)?;
        t_dec0.push(t0.elapsed().as_secs_f64());
        let b3 = mem_bytes(engine);
        diff = diff.max(max_abs_diff(&a, &b));
        engine.seq_truncate(0, n)?;
        (g_fork, g_dec1, g_dec0) = (delta(b0, b1), delta(b1, b2), delta(b2, b3));
    }
    let (kv, rec) = mem_bytes(engine);
    let shared = engine
        .mem
        .kv
        .as_ref()
        .map_or(0, |k| k.page_stats().shared_bytes);
    let smib = |b: i64| b as f64 / (1u64 << 20) as f64;
    println!(
        "memory after the runs: KV cells {:.2} MiB ({:.2} MiB shared by both sequences), recurrent state {:.2} MiB",
        mib(kv),
        mib(shared),
        mib(rec)
    );
    println!("| step | ms (median of {reps}) | KV growth MiB | recurrent growth MiB |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, t, g) in [
        ("seq_fork(0, 1)", &t_fork, g_fork),
        ("first decode on the fork", &t_dec1, g_dec1),
        ("next decode on the source", &t_dec0, g_dec0),
    ] {
        println!(
            "| {name} | {:.3} | {:.2} | {:.2} |",
            median(t.clone()) * 1e3,
            smib(g.0),
            smib(g.1)
        );
    }
    println!("fork vs source next-token logits max abs diff: {diff:.2e}");
    Ok(())
}
