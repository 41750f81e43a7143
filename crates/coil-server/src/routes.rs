//! The route table. Each API dialect lives in its own module and
//! translates to the one internal request ([`crate::request`]):
//! - OpenAI ([`crate::openai`]): `POST /v1/completions`,
//!   `POST /v1/chat/completions`; `GET /v1/models`;
//! - OpenAI Responses ([`crate::responses`]): `POST /v1/responses`;
//! - Anthropic Messages ([`crate::anthropic`]): `POST /v1/messages`,
//!   `POST /v1/messages/count_tokens`;
//! - llama-server's ([`crate::llama`]): `POST /tokenize`,
//!   `POST /detokenize`, `GET /props`, `POST /apply-template`;
//! - `GET /health`, `GET /metrics`, and the chat page at `GET /`
//!   ([`crate::ui`]; not with `--no-ui`).
//!
//! Errors of every kind are the dialect's JSON error object
//! ([`crate::errors`]); `--api-key` guards every route but `/health` and
//! the page ([`crate::auth`]); [`crate::limits`] bounds the queue,
//! `max_tokens` and time.

use crate::api::{ApiError, OutputSpec, ResponseMeta, SamplingContext};
use crate::limits::Limits;
use crate::scheduler::Scheduler;
use crate::template::ChatTemplate;
use crate::{anthropic, auth, errors, llama, openai, responses};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use coil::engine::constraint::{ConstraintSpec, Constraints};
use coil::engine::dry::DryBreakers;
use coil::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// What the handlers share.
pub struct ServerState {
    pub scheduler: Scheduler,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    /// The name `/v1/models` lists and responses carry.
    pub model_id: String,
    pub created: u64,
    next_id: AtomicU64,
    /// API key, queue bound, timeouts, drain.
    pub limits: Limits,
    /// What `/props` and `/v1/models` tell of the model.
    pub info: ModelFacts,
    /// DRY's default sequence breakers in this vocabulary (looked up on
    /// first use).
    dry_breakers: OnceLock<Arc<DryBreakers>>,
    /// Compiles output constraints for the model's vocabulary; built by
    /// the first request that asks for one.
    constraints: OnceLock<Result<Arc<Constraints>, String>>,
}

/// Facts about the served model, taken when the server starts.
#[derive(Clone, Debug, Default)]
pub struct ModelFacts {
    pub arch: String,
    /// `general.name`.
    pub name: String,
    /// Training context (`{arch}.context_length`).
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    /// The layer pattern (`coil inspect`'s).
    pub pattern: String,
    /// Parameters (elements of every tensor) and the file's bytes.
    pub n_params: u64,
    pub size_bytes: u64,
}

impl ServerState {
    pub fn new(
        scheduler: Scheduler,
        tokenizer: Arc<Tokenizer>,
        template: ChatTemplate,
        model_id: String,
    ) -> Self {
        ServerState {
            scheduler,
            tokenizer,
            template,
            model_id,
            created: now(),
            next_id: AtomicU64::new(0),
            limits: Limits::default(),
            info: ModelFacts::default(),
            dry_breakers: OnceLock::new(),
            constraints: OnceLock::new(),
        }
    }

    /// What a request that sets no constraint of its own is constrained
    /// to (`--grammar-file`).
    pub fn default_output(&self) -> Option<OutputSpec> {
        let g = self.limits.opts.grammar.as_ref()?;
        Some(OutputSpec::new(
            ConstraintSpec::Gbnf(g.clone()),
            "grammar",
            "",
        ))
    }

    /// Compiles the server-wide constraint (`--grammar-file`), if any, so
    /// that a bad one stops the server at startup rather than failing
    /// every request.
    pub fn check_default_output(&self) -> Result<(), ApiError> {
        match self.default_output() {
            Some(out) => crate::structured::compile(&*self.constraints()?, &out).map(|_| ()),
            None => Ok(()),
        }
    }

    /// The constraint compiler (built on first use: it reads the whole
    /// vocabulary).
    pub fn constraints(&self) -> Result<Arc<Constraints>, ApiError> {
        self.constraints
            .get_or_init(|| {
                Constraints::new(self.tokenizer.clone())
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(ApiError::server)
    }

    /// What turning a request's sampling fields into settings needs.
    pub fn sampling_context(&self) -> SamplingContext<'_> {
        SamplingContext {
            tokenizer: &self.tokenizer,
            n_ctx: self.scheduler.n_ctx,
            default_breakers: &self.dry_breakers,
        }
    }

    /// A fresh response id (`prefix-…`), the time and the model's name.
    pub fn meta(&self, prefix: &str) -> ResponseMeta {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        ResponseMeta {
            id: format!("{prefix}-{:x}{n:04x}", self.created),
            created: now(),
            model: self.model_id.clone(),
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Largest request body: long conversations are big JSON.
pub const MAX_BODY: usize = 64 << 20;

pub fn router(state: Arc<ServerState>) -> Router {
    let mut app = Router::new()
        .route("/v1/completions", post(openai::completions))
        .route("/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/chat/completions", post(openai::chat_completions))
        .route("/v1/responses", post(responses::create))
        .route("/responses", post(responses::create))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/apply-template", post(openai::apply_template))
        .route("/tokenize", post(llama::tokenize))
        .route("/detokenize", post(llama::detokenize))
        .route("/props", get(llama::props))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics));
    if !state.limits.opts.no_ui {
        app = app.route("/", get(crate::ui::page));
    }
    app = app
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(middleware::from_fn(crate::limits::refuse_oversized));
    if let Some(key) = &state.limits.opts.api_key {
        let key: Arc<str> = Arc::from(key.as_str());
        app = app.layer(middleware::from_fn_with_state(key, auth::require_api_key));
    }
    app.layer(middleware::from_fn(errors::api_errors))
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no route for {}", uri.path()))
}

/// 200 `{"status": "ok"}` while the engine thread runs, 503 after it died
/// or while the server drains for shutdown.
async fn health(State(st): State<Arc<ServerState>>) -> Response {
    if st.limits.is_draining() {
        ApiError::unavailable("the server is shutting down").into_response()
    } else if st.scheduler.is_alive() {
        Json(json!({ "status": "ok" })).into_response()
    } else {
        ApiError::unavailable("the engine thread has stopped").into_response()
    }
}

/// `GET /v1/models`: the one model, with its context length and what
/// llama-server's `meta` holds.
async fn models(State(st): State<Arc<ServerState>>) -> Json<Value> {
    let i = &st.info;
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_id,
            "object": "model",
            "created": st.created,
            "owned_by": "coil",
            "context_length": st.scheduler.n_ctx,
            "meta": {
                "n_ctx": st.scheduler.n_ctx,
                "n_ctx_train": i.n_ctx_train,
                "n_vocab": st.scheduler.n_vocab,
                "n_embd": i.n_embd,
                "n_layer": i.n_layer,
                "n_params": i.n_params,
                "size": i.size_bytes,
                "arch": i.arch,
                "name": i.name,
                "layers": i.pattern,
            },
        }],
    }))
}

async fn metrics(State(st): State<Arc<ServerState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.scheduler.metrics.render(),
    )
        .into_response()
}
