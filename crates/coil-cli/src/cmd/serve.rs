//! `coil serve -m MODEL`: an OpenAI-compatible HTTP server
//! (`/v1/completions`, `/v1/chat/completions`, `/apply-template`,
//! `/v1/models`, `/health`, `/metrics`) with continuous batching and a prefix cache,
//! and a chat page at `/` (`--no-ui`: none).

use super::common::ModelArgs;
use anyhow::{bail, Context, Result};
use coil_server::limits::HttpOptions;
use coil_server::scheduler::SchedulerConfig;
use coil_server::Server;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    spec: super::common::SpecArgs,
    /// Address to listen on.
    #[arg(long = "host", default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long = "port", default_value_t = 8080)]
    port: u16,
    /// Requests processed at once; the rest wait in a queue (`-np` as
    /// llama.cpp spells it).
    #[arg(long = "parallel", short = 'P', default_value_t = 4)]
    parallel: usize,
    /// Sequence slots beyond --parallel that keep finished conversations
    /// for prefix reuse (least recently used evicted first).
    #[arg(long = "cache-slots", default_value_t = 4)]
    cache_slots: usize,
    /// Memory the prefix cache may hold, in MiB (what cached conversations
    /// share, such as a common prefix, counted once). Running requests come
    /// first: when the recurrent-state buffers reserved at startup run out,
    /// cached conversations give theirs back (older checkpoints, then whole
    /// conversations, least recently used first) before new memory is
    /// mapped.
    #[arg(long = "cache-mib", default_value_t = 4096)]
    cache_mib: usize,
    /// Tokens per step over all running requests: one for each generating
    /// request, the rest (at least a quarter) for prompts, first come first
    /// served. Smaller: generations stall less while a long prompt goes in
    /// (a step costs about this many tokens' compute); larger: prompts go
    /// in in fewer, longer steps.
    #[arg(long = "prefill-chunk", default_value_t = 128)]
    prefill_chunk: usize,
    /// Tokens per micro-batch.
    #[arg(long = "ubatch", default_value_t = 512)]
    ubatch: usize,
    /// The model name `/v1/models` reports (default: the file's name).
    #[arg(long = "alias")]
    alias: Option<String>,
    /// Reuse a cached prefix only where the prompt's tokens are identical
    /// (by default, a prompt that spells the cached tokens' text with other
    /// tokens — a model's output re-tokenized — reuses them too).
    #[arg(long = "exact-tokens")]
    exact_tokens: bool,
    /// Process prompts with the strictly batch-invariant kernels too, so
    /// that every greedy output is bit for bit that of the same request
    /// sent alone, whatever the load, the prompt's chunking and the prefix
    /// cache, for every model. Without it that holds already for a model
    /// whose every weight's GEMM gives each token its one-token bits (Q8_0,
    /// Q6_K, Q5_K_M, Q5_0, Q5_1, Q4_K_M, Q4_0, Q4_1, IQ4_NL files at the
    /// AVX2 level; Q8_0, Q6_K, Q5_K_M, Q4_K_M at AVX-512 where the matrices
    /// are rewritten into rows in lanes) and, with Mamba-2 / Gated DeltaNet /
    /// KDA layers, an f32 recurrent state (their chunked scans then have
    /// chunks at fixed positions of each sequence; the server says at start
    /// whether it does); for the others this makes prompts slower
    /// (recurrences token by token: ~1.5× on a mamba2-370m-like prompt;
    /// per-row products for the other formats). Generated tokens are
    /// batch-invariant with or without it.
    #[arg(long = "batch-invariant")]
    batch_invariant: bool,
    /// A Jinja chat template file to use in place of the model's own
    /// (`tokenizer.chat_template`).
    #[arg(
        long = "chat-template-file",
        visible_alias = "chat-template",
        value_name = "FILE"
    )]
    chat_template: Option<std::path::PathBuf>,
    /// Constrain the output of every request that sets no constraint of
    /// its own (`response_format`, `grammar`, `json_schema`, a forced tool
    /// call) to the GBNF grammar in FILE.
    #[arg(long = "grammar-file", value_name = "FILE")]
    grammar_file: Option<std::path::PathBuf>,
    /// No log line per request on stderr.
    #[arg(long = "quiet", short = 'q')]
    quiet: bool,
    /// Require `Authorization: Bearer KEY` on every route but /health and
    /// the chat page at / (which asks for the key before it calls the API).
    #[arg(long = "api-key", env = "COIL_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// No chat page at / (it answers 404, as any unknown route).
    #[arg(long = "no-ui")]
    no_ui: bool,
    /// Requests that may wait for a slot beyond the --parallel running
    /// ones; more are refused with 503 and Retry-After (default: no bound).
    #[arg(long = "max-queue")]
    max_queue: Option<usize>,
    /// Most tokens one request may generate; a larger max_tokens is
    /// refused (default: what the context leaves).
    #[arg(long = "max-tokens")]
    max_tokens: Option<usize>,
    /// End a request still running this many seconds after it arrived
    /// (504, or an error event in a stream; default: no limit).
    #[arg(long = "request-timeout")]
    request_timeout: Option<f64>,
    /// On SIGTERM or Ctrl-C, wait at most this many seconds for requests in
    /// flight to finish (new ones get 503), then exit.
    #[arg(long = "drain-timeout", default_value_t = 30.0)]
    drain_timeout: f64,
}

/// Seconds from a flag: finite and not negative.
fn seconds(flag: &str, v: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(v)
        .with_context(|| format!("{flag} must be a number of seconds >= 0, got {v}"))
}

pub fn run(a: Args) -> Result<()> {
    if a.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    if a.ubatch == 0 || a.prefill_chunk == 0 {
        bail!("--ubatch and --prefill-chunk must be at least 1");
    }
    if a.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        bail!("--api-key (or COIL_API_KEY) is empty");
    }
    if a.max_tokens == Some(0) {
        bail!("--max-tokens must be at least 1");
    }
    let request_timeout = a
        .request_timeout
        .map(|t| seconds("--request-timeout", t))
        .transpose()?;
    if request_timeout.is_some_and(|t| t.is_zero()) {
        bail!("--request-timeout must be more than 0 seconds");
    }
    let drain = seconds("--drain-timeout", a.drain_timeout)?;
    let http = HttpOptions {
        api_key: a.api_key.clone(),
        max_queue: a.max_queue,
        max_tokens: a.max_tokens,
        request_timeout,
        no_ui: a.no_ui,
        grammar: match &a.grammar_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading the grammar {}", path.display()))?,
            ),
            None => None,
        },
    };
    let chat_template = match &a.chat_template {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the chat template {}", path.display()))?,
        ),
        None => None,
    };
    let spec = a.spec.params()?;
    let mut engine = a.model.load_with(
        a.parallel + a.cache_slots,
        a.ubatch,
        a.parallel > 1 || spec.is_some(),
        a.spec.nextn(),
    )?;
    // Generation is checkpointed (every `--checkpoint-spacing` tokens): the
    // running sequences' states move through reserved buffers, which the
    // scheduler fills while idle (the server answers at once).
    let reserve = coil_server::scheduler::state_buffers_wanted(&mut engine, a.parallel);
    if let Some(r) = engine.mem.recurrent.as_ref() {
        eprintln!(
            "memory: {reserve} state buffers ({:.0} MiB) to reserve for the checkpoints taken during generation, written while idle (--checkpoint-budget bounds them)",
            (reserve * r.bytes_per_seq()) as f64 / (1 << 20) as f64
        );
    }
    let draft = match spec {
        Some(_) => a.spec.draft_model(&engine, &a.model)?,
        None => None,
    };
    let info = engine.model.info();
    eprintln!(
        "model: {} ({}), {} layers [{}], vocab {}, {} threads",
        a.model.model.display(),
        info.arch,
        info.plan.layers.len(),
        info.plan.pattern(),
        info.n_vocab,
        engine.pool.n_threads()
    );
    eprintln!("memory: {}", engine.mem.describe());
    eprintln!("weights: {}", engine.weights_where());
    eprintln!("system: {}", super::common::simd_info()?);
    let model_id = a.alias.clone().unwrap_or_else(|| {
        a.model
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    });
    let cfg = SchedulerConfig {
        parallel: a.parallel,
        cache_bytes: a.cache_mib.saturating_mul(1 << 20),
        prefill_chunk: a.prefill_chunk,
        reuse_by_text: !a.exact_tokens,
        log_requests: !a.quiet,
        spec,
        batch_invariant: a.batch_invariant,
        checkpoint_spacing: a
            .model
            .checkpoint_spacing
            .map_or(SchedulerConfig::default().checkpoint_spacing, |n| {
                n as usize
            }),
        reserve_state_buffers: reserve,
    };
    if a.batch_invariant {
        eprintln!("numerics: batch-invariant (--batch-invariant)");
    } else if engine.prompts_invariant() {
        match engine.scan_chunk() {
            Some(c) => eprintln!(
                "numerics: batch-invariant (every weight's GEMM keeps tokens at this SIMD level; \
                 chunked scans with chunks at multiples of {c} positions)"
            ),
            None => eprintln!(
                "numerics: batch-invariant (every weight's GEMM keeps tokens at this SIMD level)"
            ),
        }
    } else {
        eprintln!(
            "numerics: generated tokens batch-invariant; prompts not bit for bit (weights whose \
             GEMM differs from their one-token products at this SIMD level, or a bf16 recurrent \
             state; --batch-invariant makes them so)"
        );
    }
    let server =
        Server::start_with_draft(engine, draft, cfg, model_id, chat_template.as_deref(), http)
            .context("starting the server")?;
    server
        .state
        .check_default_output()
        .map_err(|e| anyhow::anyhow!("--grammar-file: {}", e.message))?;
    let template_name = match (&a.chat_template, server.state.template.from_model) {
        (Some(path), _) => path.display().to_string(),
        (None, true) => "the model's (tokenizer.chat_template)".into(),
        (None, false) => "ChatML (the model has none)".into(),
    };
    eprintln!("chat template: {template_name}");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let addr = format!("{}:{}", a.host, a.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr().context("reading the bound address")?;
        eprintln!(
            "listening on http://{local} ({} parallel, {} cache slots{}); Ctrl-C or SIGTERM stops",
            a.parallel,
            a.cache_slots,
            if a.api_key.is_some() {
                ", API key required"
            } else {
                ""
            }
        );
        if !a.no_ui {
            eprintln!("chat page: http://{local}/");
        }
        let shutdown = async move {
            stop_signal().await;
            eprintln!(
                "shutting down: draining requests in flight (at most {:.0} s)",
                drain.as_secs_f64()
            );
        };
        let left = server
            .serve_with_drain(listener, shutdown, Some(drain))
            .await
            .context("serving")?;
        if left > 0 {
            eprintln!("drain timeout: {left} requests in flight were cut");
        } else {
            eprintln!("drained; stopped");
        }
        Ok(())
    })
}

/// Ctrl-C, or SIGTERM where there is one.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
