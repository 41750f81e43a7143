//! HTTP routes: `POST /v1/completions`, `POST /v1/chat/completions`
//! (streamed as server-sent events or not), `POST /apply-template`,
//! `GET /v1/models`, `GET /health`, `GET /metrics`, and the chat page at
//! `GET /` ([`crate::ui`]; not with `--no-ui`). Errors of every kind are
//! OpenAI's JSON error object ([`crate::errors`]); `--api-key` guards every
//! route but `/health` and the page ([`crate::auth`]); [`crate::limits`]
//! bounds the queue, `max_tokens` and time.

use crate::api::ToolChoice;
use crate::api::{self, ApiError, ChatRequest, CompletionRequest, Prompt, ResponseMeta};
use crate::http_metrics::InFlight;
use crate::limits::Limits;
use crate::reply::ChatReply;
use crate::scheduler::{Event, GenRequest, Scheduler};
use crate::template::tool_calls::StreamParser;
use crate::template::{ChatTemplate, TemplateVars};
use crate::{auth, errors};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header;
use axum::middleware;
use axum::response::sse::{self, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use coil::engine::sampling::SamplingParams;
use coil::tokenizer::{EncodeOptions, Tokenizer};
use futures_util::stream::{self, Stream};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

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
        }
    }

    fn meta(&self, prefix: &str) -> ResponseMeta {
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
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/chat/completions", post(chat_completions))
        .route("/apply-template", post(apply_template))
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
    app.layer(middleware::map_response(errors::openai_errors))
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

async fn models(State(st): State<Arc<ServerState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_id,
            "object": "model",
            "created": st.created,
            "owned_by": "coil",
            "meta": { "n_ctx": st.scheduler.n_ctx, "n_vocab": st.scheduler.n_vocab },
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

/// A checked request, ready for the engine thread.
struct Job {
    prompt: Vec<u32>,
    /// Checkpoint positions for the scheduler (`GenRequest::marks`).
    marks: Vec<usize>,
    params: SamplingParams,
    max_tokens: usize,
    stop: Vec<String>,
    stop_at_eos: bool,
    stream: bool,
    include_usage: bool,
    /// Reads tool calls and reasoning out of a chat reply (`None`: the
    /// reply is its raw text).
    parser: Option<StreamParser>,
}

/// The prompt plus the completion must fit the context; an absent
/// `max_tokens` takes `default` (or what is left) within it.
fn token_limit(
    n_prompt: usize,
    requested: Option<u64>,
    default: Option<usize>,
    n_ctx: usize,
    param: &'static str,
) -> Result<usize, ApiError> {
    let too_long = |want: u64| {
        ApiError::bad_request(format!(
            "This model's maximum context length is {n_ctx} tokens. However, you requested {} tokens ({n_prompt} in the prompt, {want} for the completion). Please reduce the prompt or the completion length.",
            (n_prompt as u64).saturating_add(want)
        ))
        .with_param(param)
        .with_code("context_length_exceeded")
    };
    if n_prompt > n_ctx {
        return Err(too_long(0).with_param("prompt"));
    }
    let left = n_ctx - n_prompt;
    match requested {
        Some(m) if m > left as u64 => Err(too_long(m)),
        Some(m) => Ok(m as usize),
        None => Ok(default.map_or(left, |d| d.min(left))),
    }
}

fn completion_prompt(st: &ServerState, prompt: Prompt) -> Result<Vec<u32>, ApiError> {
    let encode = |text: &str| {
        st.tokenizer.encode_with(
            text,
            EncodeOptions {
                add_special: true,
                parse_special: true,
            },
        )
    };
    let bad = |m: &str| ApiError::bad_request(m).with_param("prompt");
    let tokens = match prompt {
        Prompt::Text(t) => encode(&t),
        Prompt::Texts(v) if v.len() == 1 => encode(&v[0]),
        Prompt::Tokens(v) => v,
        Prompt::TokenLists(mut v) if v.len() == 1 => v.swap_remove(0),
        Prompt::Texts(_) | Prompt::TokenLists(_) => {
            return Err(bad("one prompt per request is supported"))
        }
    };
    let n_vocab = st.scheduler.n_vocab;
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(bad(&format!(
            "token id {t} is outside the vocabulary of {n_vocab}"
        )));
    }
    if tokens.is_empty() {
        return Err(bad("the prompt is empty"));
    }
    Ok(tokens)
}

async fn completions(State(st): State<Arc<ServerState>>, body: Bytes) -> Response {
    let start = Instant::now();
    let req: CompletionRequest = match api::parse_body(&body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let job = match completion_job(&st, req) {
        Ok(j) => j,
        Err(e) => return e.into_response(),
    };
    let meta = st.meta("cmpl");
    run_job(&st, job, meta, Kind::Completion, start).await
}

fn completion_job(st: &ServerState, req: CompletionRequest) -> Result<Job, ApiError> {
    if req.echo {
        return Err(ApiError::bad_request("echo is not supported").with_param("echo"));
    }
    let params = req.sampling.params()?;
    let prompt = completion_prompt(st, req.prompt)?;
    let max_tokens = token_limit(
        prompt.len(),
        req.max_tokens,
        Some(16),
        st.scheduler.n_ctx,
        "max_tokens",
    )?
    .min(st.limits.max_tokens(req.max_tokens, "max_tokens")?);
    Ok(Job {
        prompt,
        marks: Vec::new(),
        params,
        max_tokens,
        stop: req.sampling.stops(),
        stop_at_eos: !req.sampling.ignore_eos,
        stream: req.sampling.stream,
        include_usage: req.sampling.include_usage(),
        parser: None,
    })
}

async fn chat_completions(State(st): State<Arc<ServerState>>, body: Bytes) -> Response {
    let start = Instant::now();
    let req: ChatRequest = match api::parse_body(&body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let job = match chat_job(&st, req) {
        Ok(j) => j,
        Err(e) => return e.into_response(),
    };
    let meta = st.meta("chatcmpl");
    run_job(&st, job, meta, Kind::Chat, start).await
}

/// `POST /apply-template` (llama-server's): a chat request's body, answered
/// with `{"prompt": TEXT}`, the rendered prompt, without generating.
async fn apply_template(State(st): State<Arc<ServerState>>, body: Bytes) -> Response {
    let rendered = api::parse_body::<ChatRequest>(&body).and_then(|req| {
        let messages = api::normalise_messages(&req.messages)?;
        let vars = req.template_vars()?;
        render_chat(&st.template, &messages, &vars)
    });
    match rendered {
        Ok(prompt) => Json(json!({ "prompt": prompt })).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Renders chat messages with the template and tokenizes them (special
/// token texts become their tokens; BOS is added when the vocabulary asks
/// for it and the template did not write it).
pub fn chat_prompt(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[Value],
    vars: &TemplateVars,
) -> Result<Vec<u32>, ApiError> {
    let text = render_chat(template, messages, vars)?;
    Ok(encode_rendered(template, tokenizer, &text))
}

/// The prompt text of a chat (with the assistant's header); a template
/// that fails is the request's fault (400), naming the message and line.
pub fn render_chat(
    template: &ChatTemplate,
    messages: &[Value],
    vars: &TemplateVars,
) -> Result<String, ApiError> {
    template
        .render(messages, vars, true)
        .map_err(|e| ApiError::bad_request(e.to_string()).with_param("messages"))
}

/// Tokenizes a rendered chat text: special token texts become their
/// tokens; BOS is added when the vocabulary asks for it and the template
/// did not write it.
fn encode_rendered(template: &ChatTemplate, tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    let has_bos = !template.bos_token.is_empty() && text.starts_with(&template.bos_token);
    tokenizer.encode_with(
        text,
        EncodeOptions {
            add_special: !has_bos,
            parse_special: true,
        },
    )
}

/// Where the first message (the system prompt, typically) and the
/// next-to-last message end in `prompt`: checkpoints there let a later
/// conversation that shares them and then differs (same system prompt,
/// another question; the last message edited) resume at them. Positions
/// are the tokens a prefix of the conversation, rendered alone, shares
/// with the whole prompt.
pub fn message_ends(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[Value],
    vars: &TemplateVars,
    prompt: &[u32],
) -> Vec<usize> {
    let n = messages.len();
    let mut ks = vec![1, n.saturating_sub(1)];
    ks.retain(|&k| k > 0 && k < n);
    ks.dedup();
    let mut marks = Vec::new();
    for k in ks {
        let Ok(text) = template.render(&messages[..k], vars, false) else {
            continue;
        };
        let toks = encode_rendered(template, tokenizer, &text);
        let common = toks.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        if common > 0 {
            marks.push(common);
        }
    }
    marks
}

fn chat_job(st: &ServerState, req: ChatRequest) -> Result<Job, ApiError> {
    let params = req.sampling.params()?;
    let messages = api::normalise_messages(&req.messages)?;
    let vars = req.template_vars()?;
    let tool_choice = req.tool_choice()?;
    let text = render_chat(&st.template, &messages, &vars)?;
    let prompt = encode_rendered(&st.template, &st.tokenizer, &text);
    let read_tools = vars
        .tools
        .as_ref()
        .filter(|_| tool_choice == ToolChoice::Auto);
    let parser = StreamParser::new(st.template.output_format, &text, read_tools);
    let marks = message_ends(&st.template, &st.tokenizer, &messages, &vars, &prompt);
    if prompt.is_empty() {
        return Err(
            ApiError::bad_request("the rendered chat prompt is empty").with_param("messages")
        );
    }
    let (requested, param) = match (req.max_completion_tokens, req.max_tokens) {
        (Some(m), _) => (Some(m), "max_completion_tokens"),
        (None, m) => (m, "max_tokens"),
    };
    let max_tokens = token_limit(prompt.len(), requested, None, st.scheduler.n_ctx, param)?
        .min(st.limits.max_tokens(requested, param)?);
    let mut stop = req.sampling.stops();
    stop.extend(st.template.extra_stops.iter().cloned());
    Ok(Job {
        prompt,
        marks,
        params,
        max_tokens,
        stop,
        stop_at_eos: !req.sampling.ignore_eos,
        stream: req.sampling.stream,
        include_usage: req.sampling.include_usage(),
        parser: parser.is_active().then_some(parser),
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

async fn run_job(
    st: &ServerState,
    job: Job,
    meta: ResponseMeta,
    kind: Kind,
    start: Instant,
) -> Response {
    let mut flight = match st.limits.admit(&st.scheduler.metrics, start) {
        Ok(f) => f,
        Err(refused) => return refused.into_response(),
    };
    let (tx, mut rx) = unbounded_channel();
    let submitted = st.scheduler.submit(GenRequest {
        prompt: job.prompt,
        params: job.params,
        max_tokens: job.max_tokens,
        stop: job.stop,
        stop_at_eos: job.stop_at_eos,
        marks: job.marks,
        events: tx,
    });
    if !submitted {
        return ApiError::unavailable("the engine has stopped").into_response();
    }
    let deadline = st.limits.deadline(start);
    let mut reply = ChatReply::new(job.parser);
    if job.stream {
        let sse = Sse::new(event_stream(
            rx,
            meta,
            kind,
            job.include_usage,
            reply,
            flight,
            deadline.map(|d| (d, st.limits.timeout_error())),
        ));
        return sse.keep_alive(KeepAlive::default()).into_response();
    }
    let mut text = String::new();
    loop {
        // Past the deadline, returning drops the receiver: the engine
        // thread frees the slot.
        let ev = match deadline {
            Some(d) => match tokio::time::timeout_at(d, rx.recv()).await {
                Ok(ev) => ev,
                Err(_) => {
                    flight.timed_out();
                    return st.limits.timeout_error().into_response();
                }
            },
            None => rx.recv().await,
        };
        let Some(ev) = ev else { break };
        match ev {
            Event::Text(t) => {
                flight.first_output();
                text.push_str(&t)
            }
            Event::Done { finish, usage } => {
                flight.done(&usage);
                let body = match kind {
                    Kind::Completion => api::completion(&meta, &text, finish, &usage),
                    Kind::Chat => reply.body(&meta, text, finish, &usage),
                };
                return Json(body).into_response();
            }
            Event::Error(m) => return ApiError::server(m).into_response(),
        }
    }
    ApiError::server("the engine stopped before the request ended").into_response()
}

struct StreamState {
    rx: UnboundedReceiver<Event>,
    meta: ResponseMeta,
    kind: Kind,
    include_usage: bool,
    out: VecDeque<String>,
    ended: bool,
    reply: ChatReply,
    /// Counts the request in flight and times it; dropped with the stream.
    flight: InFlight,
    /// When the stream is cut, and the error it then ends with.
    deadline: Option<(tokio::time::Instant, ApiError)>,
}

/// Server-sent events in OpenAI's chunk format, ending with `[DONE]`.
/// Dropping the stream (client gone, or the deadline passed) drops the
/// receiver, which tells the engine thread to free the request's slot.
fn event_stream(
    rx: UnboundedReceiver<Event>,
    meta: ResponseMeta,
    kind: Kind,
    include_usage: bool,
    reply: ChatReply,
    flight: InFlight,
    deadline: Option<(tokio::time::Instant, ApiError)>,
) -> impl Stream<Item = Result<sse::Event, Infallible>> {
    let mut out = VecDeque::new();
    if kind == Kind::Chat {
        let first = api::chat_chunk(&meta, json!({"role": "assistant", "content": ""}), None);
        out.push_back(first.to_string());
    }
    let st = StreamState {
        rx,
        meta,
        kind,
        include_usage,
        out,
        ended: false,
        reply,
        flight,
        deadline,
    };
    stream::unfold(st, |mut st| async move {
        loop {
            if let Some(data) = st.out.pop_front() {
                return Some((Ok(sse::Event::default().data(data)), st));
            }
            if st.ended {
                return None;
            }
            let ev = match &st.deadline {
                Some((d, err)) => match tokio::time::timeout_at(*d, st.rx.recv()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        st.flight.timed_out();
                        st.out.push_back(err.body().to_string());
                        st.out.push_back("[DONE]".into());
                        st.ended = true;
                        continue;
                    }
                },
                None => st.rx.recv().await,
            };
            let Some(ev) = ev else {
                let e = ApiError::server("the engine stopped before the request ended");
                st.out.push_back(e.body().to_string());
                st.ended = true;
                continue;
            };
            st.push(ev);
        }
    })
}

impl StreamState {
    fn push(&mut self, ev: Event) {
        let object = match self.kind {
            Kind::Completion => "text_completion",
            Kind::Chat => "chat.completion.chunk",
        };
        match ev {
            Event::Text(t) => {
                self.flight.first_output();
                let chunks = match self.kind {
                    Kind::Completion => vec![api::completion_chunk(&self.meta, &t, None)],
                    Kind::Chat => self.reply.chunks(&self.meta, &t),
                };
                self.out.extend(chunks.iter().map(Value::to_string));
            }
            Event::Done { finish, usage } => {
                self.flight.done(&usage);
                let last = match self.kind {
                    Kind::Completion => vec![api::completion_chunk(&self.meta, "", Some(finish))],
                    Kind::Chat => self.reply.last_chunks(&self.meta, finish),
                };
                self.out.extend(last.iter().map(Value::to_string));
                if self.include_usage {
                    self.out
                        .push_back(api::usage_chunk(&self.meta, object, &usage).to_string());
                }
                self.out.push_back("[DONE]".into());
                self.ended = true;
            }
            Event::Error(m) => {
                self.out.push_back(ApiError::server(m).body().to_string());
                self.out.push_back("[DONE]".into());
                self.ended = true;
            }
        }
    }
}
