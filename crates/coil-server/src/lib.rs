//! `coil serve`'s library: an HTTP server over the coil engine speaking
//! OpenAI's chat / completions and Responses APIs, Anthropic's Messages
//! API and llama-server's extras, with continuous batching and a prefix
//! cache that resumes each request from the longest prompt prefix already
//! in memory.
//!
//! - [`request`]: the one internal request every dialect translates to;
//!   [`job`]: running it (whole or streamed).
//! - [`openai`], [`responses`], [`anthropic`], [`llama`]: the dialects;
//!   [`fields`]: no request field silently ignored.
//! - [`api`]: OpenAI request / response shapes and errors.
//! - [`template`]: chat templates (the model's Jinja, or ChatML) rendered
//!   as transformers renders them, and the tool calls / reasoning in
//!   replies.
//! - [`scheduler`]: the engine thread — continuous batching, slots, the
//!   prefix cache's use of fork and rollback.
//! - [`prefix_cache`]: the radix tree over token ids with LRU eviction.
//! - [`metrics`]: Prometheus counters.
//! - [`structured`]: structured outputs (JSON, schemas, grammars, forced
//!   tool calls) compiled into the engine's output constraint.
//! - [`reply`]: chat replies as OpenAI shapes them (content, reasoning,
//!   tool calls; whole or streamed).
//! - [`routes`]: the axum router.
//! - [`ui`]: the chat page at `/`, embedded.
//! - [`errors`], [`auth`], [`limits`]: OpenAI-shaped errors for everything,
//!   `--api-key`, the queue bound, `max_tokens` ceiling, request timeout
//!   and the drain on shutdown.
//! - [`http_metrics`], [`histogram`]: requests waiting / running, cache
//!   use over its limit, time-to-first-token and per-token histograms.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use coil::engine::{Engine, EngineOptions};
//! use coil_server::{Server, scheduler::SchedulerConfig};
//!
//! let cfg = SchedulerConfig { parallel: 2, ..Default::default() };
//! let opts = EngineOptions { n_seq_max: 6, ..Default::default() };
//! let engine = Engine::load("model.gguf", opts)?;
//! let server = Server::new(engine, cfg, "model".into())?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! server.serve(listener, std::future::pending()).await?;
//! # Ok(()) }
//! ```

pub mod anthropic;
pub mod api;
pub mod auth;
pub mod errors;
pub mod fields;
pub mod histogram;
pub mod http_metrics;
pub mod job;
pub mod limits;
pub mod llama;
pub mod metrics;
pub mod openai;
pub mod prefix_cache;
pub mod reply;
pub mod request;
pub mod responses;
pub mod routes;
pub mod scheduler;
pub mod structured;
pub mod template;
pub mod ui;

use coil::engine::Engine;
use coil::tokenizer::{Tokenizer, TokenizerError};
use limits::{HttpOptions, Limits};
use routes::ServerState;
use scheduler::{Scheduler, SchedulerConfig, SchedulerError};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use template::{ChatTemplate, TemplateError};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("reading the tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
}

/// What `/props` and `/v1/models` tell of the engine's model.
fn model_facts(engine: &Engine) -> routes::ModelFacts {
    let i = engine.model.info();
    let (mut n_params, mut size_bytes) = (0u64, 0u64);
    for t in engine.file.tensors() {
        n_params += t.n_elements;
        size_bytes += t.n_bytes;
    }
    routes::ModelFacts {
        arch: i.arch.clone(),
        name: i.name.clone(),
        n_ctx_train: i.n_ctx_train,
        n_embd: i.n_embd,
        n_layer: i.plan.layers.len(),
        pattern: i.plan.pattern(),
        n_params,
        size_bytes,
    }
}

/// A model ready to serve: the engine thread is running.
pub struct Server {
    pub state: Arc<ServerState>,
    engine_thread: std::thread::JoinHandle<()>,
}

impl Server {
    /// Starts the engine thread on `engine` (which must hold at least
    /// `cfg.parallel` sequences; the rest are prefix-cache room).
    pub fn new(
        engine: Engine,
        cfg: SchedulerConfig,
        model_id: String,
    ) -> Result<Self, ServerError> {
        Self::with_template(engine, cfg, model_id, None)
    }

    /// As [`Server::new`], with `chat_template` (Jinja text) in place of
    /// the file's own template when given.
    pub fn with_template(
        engine: Engine,
        cfg: SchedulerConfig,
        model_id: String,
        chat_template: Option<&str>,
    ) -> Result<Self, ServerError> {
        Self::start(engine, cfg, model_id, chat_template, HttpOptions::default())
    }

    /// [`Server::new`] with the HTTP side's settings: API key, queue
    /// bound, `max_tokens` ceiling, request timeout.
    pub fn with_options(
        engine: Engine,
        cfg: SchedulerConfig,
        model_id: String,
        http: HttpOptions,
    ) -> Result<Self, ServerError> {
        Self::start(engine, cfg, model_id, None, http)
    }

    /// The server with every setting: a chat template in place of the
    /// file's (when given) and the HTTP side's options.
    pub fn start(
        engine: Engine,
        cfg: SchedulerConfig,
        model_id: String,
        chat_template: Option<&str>,
        http: HttpOptions,
    ) -> Result<Self, ServerError> {
        Self::start_with_draft(engine, None, cfg, model_id, chat_template, http)
    }

    /// [`Server::start`] with a draft model for speculation
    /// ([`Scheduler::start_with_draft`]).
    pub fn start_with_draft(
        engine: Engine,
        draft: Option<coil::engine::speculative::DraftModel>,
        cfg: SchedulerConfig,
        model_id: String,
        chat_template: Option<&str>,
        http: HttpOptions,
    ) -> Result<Self, ServerError> {
        let tokenizer = Arc::new(Tokenizer::from_gguf(&engine.file)?);
        let template = match chat_template {
            Some(source) => ChatTemplate::new(Some(source), &tokenizer)?,
            None => ChatTemplate::from_gguf(&engine.file, &tokenizer)?,
        };
        let (parallel, cache_bytes) = (cfg.parallel, cfg.cache_bytes);
        let info = model_facts(&engine);
        let (scheduler, engine_thread) =
            Scheduler::start_with_draft(engine, draft, tokenizer.clone(), cfg)?;
        (scheduler.metrics.http.cache_limit_bytes).store(cache_bytes as u64, Ordering::Relaxed);
        let mut state = ServerState::new(scheduler, tokenizer, template, model_id);
        state.limits = Limits::new(http, parallel);
        state.info = info;
        let state = Arc::new(state);
        Ok(Server {
            state,
            engine_thread,
        })
    }

    pub fn router(&self) -> axum::Router {
        routes::router(self.state.clone())
    }

    /// Serves HTTP on `listener` until `shutdown` completes, then drains
    /// without a time limit (see [`Server::serve_with_drain`]).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        self.serve_with_drain(listener, shutdown, None).await?;
        Ok(())
    }

    /// Serves HTTP on `listener` until `shutdown` completes, then drains:
    /// no new connection is accepted, `/health` and new requests on open
    /// connections answer 503 (so routers move on), and requests in flight
    /// run to their end — for at most `drain` (`None`: no limit), after
    /// which the caller should exit. Returns how many requests were still
    /// in flight when it stopped waiting (0: all drained).
    pub async fn serve_with_drain(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
        drain: Option<Duration>,
    ) -> std::io::Result<u64> {
        let app = self.router();
        let state = self.state.clone();
        let (draining_tx, draining_rx) = tokio::sync::oneshot::channel::<()>();
        let signal = async move {
            shutdown.await;
            state.limits.start_draining();
            let _ = draining_tx.send(());
        };
        let server = axum::serve(listener, app).with_graceful_shutdown(signal);
        let give_up = async move {
            match (draining_rx.await, drain) {
                (Ok(()), Some(d)) => tokio::time::sleep(d).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            r = server => r?,
            _ = give_up => {}
        }
        let metrics = &self.state.scheduler.metrics;
        let left = metrics.http.in_flight.load(Ordering::Relaxed);
        drop(self.state);
        // The engine thread ends once every handle is gone and its work
        // is done; don't wait on clients that still hold one.
        drop(self.engine_thread);
        Ok(left)
    }
}
