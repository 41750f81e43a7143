//! Random traffic through the scheduler (no HTTP): waves of concurrent
//! requests whose prompts are new, repeats, extensions or branches of
//! earlier ones, under drawn slot counts, step sizes, checkpoint spacings
//! and prefix-cache sizes (small ones evict), n-gram speculation in half
//! the runs. Each greedy completion — its text and every reported
//! log-probability, bit for bit — must be exactly that of the request alone
//! on an engine without a cache, whatever shared its steps, which cached
//! prefix it resumed from and at which checkpoint, how many drafts were
//! accepted; and the usage must be true: the prompt tokens the forward
//! passes took are the prompts less what the usage reports cached.
//!
//! The server's default numerics are batch-invariant for a model whose
//! weights are all in formats whose GEMM keeps tokens, with an f32 state
//! where it has chunked recurrences (`Engine::prompts_invariant`: the Q8_0
//! llama and Mamba-2 fixtures and the bundled Q8_0 demo model at the AVX2
//! level, which the test requires); the other models run with
//! `batch_invariant` (`coil serve --batch-invariant`). For a model with
//! chunked recurrences prompts are longer (past two chunks of its scans),
//! and some continue an earlier conversation: its prompt, the completion,
//! then new tokens (a resume after decoded tokens).

mod common;

use coil::engine::draft::SpecParams;
use coil::engine::sampling::SamplingParams;
use coil::engine::{Engine, EngineOptions};
use coil::tokenizer::Tokenizer;
use coil_server::api::Usage;
use coil_server::scheduler::{Event, GenRequest, Scheduler, SchedulerConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n.max(1) as u64) as usize
    }
}

/// The model file of `arch` ("demo": the bundled Q8_0 demo model).
fn model(arch: &str) -> std::path::PathBuf {
    if arch == "demo" {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/shakespeare-hybrid-q8_0.gguf")
    } else {
        common::fixture(arch)
    }
}

/// An engine thread on `arch` with `cache` spare sequences for the prefix
/// cache; `batch_invariant` set where the default numerics are not
/// batch-invariant for the model (see the module documentation). Also
/// returns whether the default ran and whether the model has chunked
/// recurrences.
fn scheduler(arch: &str, cache: usize, mut cfg: SchedulerConfig) -> (Scheduler, bool, bool) {
    let opts = EngineOptions {
        n_threads: 1,
        n_seq_max: cfg.parallel + cache,
        n_ctx: 512,
        n_ubatch: 512,
        ..Default::default()
    };
    let engine = Engine::load(model(arch), opts).expect("load");
    let default = engine.prompts_invariant();
    let chunked = engine.scan_chunk().is_some();
    cfg.batch_invariant = !default;
    let tok = Arc::new(Tokenizer::from_gguf(&engine.file).expect("tokenizer"));
    (
        Scheduler::start(engine, tok, cfg).expect("start").0,
        default,
        chunked,
    )
}

fn submit(s: &Scheduler, prompt: &[u32], max_tokens: usize) -> UnboundedReceiver<Event> {
    let (tx, rx) = unbounded_channel();
    let req = GenRequest {
        prompt: prompt.to_vec(),
        params: SamplingParams::default(),
        max_tokens,
        stop: Vec::new(),
        stop_at_eos: false,
        marks: Vec::new(),
        n: 1,
        logprobs: Some(2),
        constraint: None,
        events: tx,
    };
    assert!(s.submit(req), "the engine thread took no request");
    rx
}

/// A sampled token, its log-probability's bits and the most likely
/// tokens' (token, bits).
type TokenBits = (u32, u32, Vec<(u32, u32)>);

/// A completion: its text, and per token its [`TokenBits`].
#[derive(Debug, PartialEq, Eq)]
struct Output {
    text: String,
    logprobs: Vec<TokenBits>,
}

/// The completion and its usage (a request unanswered for a minute fails
/// the test rather than hanging it).
fn collect(mut rx: UnboundedReceiver<Event>) -> (Output, Usage) {
    use tokio::sync::mpsc::error::TryRecvError;
    let mut out = Output {
        text: String::new(),
        logprobs: Vec::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match rx.try_recv() {
            Ok(Event::Text {
                text: t, logprobs, ..
            }) => {
                out.text.push_str(&t);
                out.logprobs.extend(logprobs.iter().map(|l| {
                    let top = l.top.iter().map(|&(t, p)| (t, p.to_bits())).collect();
                    (l.token, l.logprob.to_bits(), top)
                }));
            }
            Ok(Event::Done { usage, .. }) => return (out, usage),
            Ok(Event::Error(e)) => panic!("request failed: {e}"),
            Err(TryRecvError::Disconnected) => panic!("the engine thread stopped"),
            Err(TryRecvError::Empty) => {
                assert!(Instant::now() < deadline, "no answer in 60 s");
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

/// One run: 24 requests in waves of 1–5 on `arch`, the configuration and
/// prompts drawn from `seed`; returns the prompt tokens the cache saved,
/// the draft tokens speculation accepted and whether the server's default
/// numerics ran.
fn run(arch: &str, seed: u64) -> (usize, usize, bool) {
    let mut rng = Lcg(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let cfg = SchedulerConfig {
        parallel: 1 + rng.below(4),
        prefill_chunk: [3, 8, 32][rng.below(3)],
        checkpoint_spacing: [1, 2, 4][rng.below(3)],
        cache_bytes: [64 << 10, 2 << 30][rng.below(2)],
        // n-gram speculation in half the runs: its greedy output is plain
        // decoding's, bit for bit
        spec: (rng.below(2) == 1).then(|| SpecParams {
            draft_max: 1 + rng.below(8),
            ngram_max: 1 + rng.below(4),
            ..Default::default()
        }),
        log_requests: false,
        ..Default::default()
    };
    let (s, default, chunked) = scheduler(arch, 4, cfg.clone());
    let what = format!("{arch} seed {seed} {cfg:?} (default numerics: {default})");
    // one spare sequence: a batched engine, as a server with cache slots
    // (a one-sequence engine keeps Q8_0's row-at-a-time kernel, whose bits
    // differ from the batched one's)
    let (alone, _, _) = scheduler(
        arch,
        1,
        SchedulerConfig {
            parallel: 1,
            ..Default::default()
        },
    );
    let n_vocab = s.n_vocab;
    let fresh = |rng: &mut Lcg, n: usize| -> Vec<u32> {
        (0..n).map(|_| 3 + rng.below(n_vocab - 6) as u32).collect()
    };
    let mut seen: Vec<Vec<u32>> = Vec::new();
    // conversations so far: a prompt and its completion's tokens
    let mut talks: Vec<Vec<u32>> = Vec::new();
    let longest = if chunked { 150 } else { 40 };
    let mut saved = 0;
    let mut sent = 0;
    while sent < 24 {
        let wave = (1 + rng.below(5)).min(24 - sent);
        let mut reqs = Vec::new();
        for _ in 0..wave {
            let prompt = match (seen.is_empty(), rng.below(if chunked { 5 } else { 4 })) {
                (true, _) | (_, 0) => {
                    let n = 2 + rng.below(longest);
                    fresh(&mut rng, n)
                }
                (false, 4) if !talks.is_empty() => {
                    let mut p = talks[rng.below(talks.len())].clone();
                    let n = 1 + rng.below(12);
                    p.extend(fresh(&mut rng, n));
                    p
                }
                (false, 1) => seen[rng.below(seen.len())].clone(),
                (false, 2) => {
                    let mut p = seen[rng.below(seen.len())].clone();
                    let n = 1 + rng.below(12);
                    p.extend(fresh(&mut rng, n));
                    p
                }
                _ => {
                    let mut p = seen[rng.below(seen.len())].clone();
                    p.truncate(1 + rng.below(p.len()));
                    let n = 1 + rng.below(12);
                    p.extend(fresh(&mut rng, n));
                    p
                }
            };
            // within the context, with room for the completion
            let mut prompt = prompt;
            prompt.truncate(480);
            let max_tokens = 1 + rng.below(16);
            seen.push(prompt.clone());
            reqs.push((submit(&s, &prompt, max_tokens), prompt, max_tokens));
        }
        for (rx, prompt, max_tokens) in reqs {
            let (got, usage) = collect(rx);
            let (want, _) = collect(submit(&alone, &prompt, max_tokens));
            assert_eq!(
                got,
                want,
                "{what}: request {sent} ({} tokens) differs from alone",
                prompt.len()
            );
            assert_eq!(usage.prompt_tokens, prompt.len(), "{what}: request {sent}");
            assert_eq!(
                usage.completion_tokens, max_tokens,
                "{what}: request {sent}"
            );
            assert!(
                usage.cached_tokens < usage.prompt_tokens,
                "{what}: request {sent}: {usage:?}"
            );
            saved += usage.cached_tokens;
            sent += 1;
            let mut talk = prompt;
            talk.extend(got.logprobs.iter().map(|l| l.0));
            if talk.len() + 32 < 512 {
                talks.push(talk);
            }
        }
    }
    // what the usage promised (each prompt less its cached part) is what
    // the forward passes took: no cached token was processed after all
    let m = &s.metrics;
    let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        get(&m.prompt_tokens_evaluated),
        get(&m.prompt_tokens_processed),
        "{what}: prompt tokens evaluated against processed"
    );
    assert_eq!(
        get(&m.prompt_tokens_processed) + get(&m.prompt_tokens_cached),
        get(&m.prompt_tokens)
    );
    (saved, get(&m.spec_accepted) as usize, default)
}

#[test]
fn random_traffic_gives_every_request_its_output_alone() {
    let (mut saved, mut accepted) = (0, 0);
    for (i, arch) in [
        "llama_q8_0",
        "mamba2_q8_0",
        "demo",
        "granitemoehybrid",
        "mamba2",
        "jamba",
        "qwen35_tiny",
        "qwen3next_tiny",
        "lfm2_small",
        "lfm3_tiny",
        "zamba2_tiny",
        "qwen4exp_tiny",
        "kimi_linear_tiny",
    ]
    .into_iter()
    .enumerate()
    {
        for seed in 0..3 {
            let (s, a, default) = run(arch, 10 * i as u64 + seed);
            eprintln!("{arch} seed {seed}: {s} prompt tokens from the cache, {a} drafts accepted");
            saved += s;
            accepted += a;
            // at the AVX2 level the Q8_0 llama runs the default numerics
            // (its GEMM keeps tokens there)
            if ["llama_q8_0", "mamba2_q8_0", "demo"].contains(&arch)
                && coil_kernels::simd::level() == coil_kernels::simd::SimdLevel::Avx2
            {
                assert!(
                    default,
                    "{arch}: the default numerics are not batch-invariant at AVX2"
                );
            }
        }
    }
    // the prefix cache and speculation took part
    assert!(
        saved > 0 && accepted > 0,
        "{saved} cached, {accepted} accepted"
    );
}

/// The same on 20 seeds per fixture, more architectures (run by hand:
/// `cargo test --release -p coil-server --test random_traffic -- --ignored`).
#[test]
#[ignore]
fn much_random_traffic_gives_every_request_its_output_alone() {
    for (i, arch) in [
        "demo",
        "llama_q8_0",
        "mamba2_q8_0",
        "granitemoehybrid",
        "mamba",
        "mamba2",
        "jamba",
        "bamba",
        "falcon_h1",
        "nemotron_h",
        "llama",
        "qwen35_tiny",
        "qwen35moe_tiny",
        "qwen3next_tiny",
        "lfm2_small",
        "lfm2moe_small",
        "lfm3_tiny",
        "zamba2_tiny",
        "qwen4exp_tiny",
        "kimi_linear_tiny",
        "kimi_linear_qlora",
        "bailing_hybrid_tiny",
    ]
    .into_iter()
    .enumerate()
    {
        for seed in 0..20 {
            run(arch, 1000 + 100 * i as u64 + seed);
        }
    }
}
