//! OpenAI's `POST /v1/completions` and `POST /v1/chat/completions` (and
//! llama-server's `POST /apply-template`): requests translated into the
//! internal [`Request`], replies written from the engine's events — whole,
//! or streamed as chunks ending with `[DONE]`.

use crate::api::{
    self, ApiError, ChatRequest, CompletionRequest, FinishReason, ResponseMeta, Usage,
};
use crate::fields;
use crate::job::{self, Finished, Render};
use crate::reply::{self, ChatReply};
use crate::request::{self, Chat, Input, Prompt, Request};
use crate::routes::ServerState;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse;
use axum::response::{IntoResponse, Response};
use axum::Json;
use coil::engine::logprobs::TokenLogprob;
use coil::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// `POST /v1/completions`.
pub async fn completions(State(st): State<Arc<ServerState>>, body: Bytes) -> Response {
    let start = Instant::now();
    let (req, include_usage) = match completion_request(&st, &body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let want_logprobs = req.logprobs.is_some();
    let job = match request::prepare(&st, req) {
        Ok(j) => j,
        Err(e) => return e.into_response(),
    };
    let meta = st.meta("cmpl");
    let n = job.n;
    let stream = job.stream;
    let run = match job::submit(&st, &job, start) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let tok = st.tokenizer.clone();
    if stream {
        return run.stream(CompletionStream {
            meta,
            tok,
            include_usage,
            logprobs: want_logprobs,
            offsets: vec![0; n],
        });
    }
    match run.collect().await {
        Ok(f) => Json(completion_body(&meta, &tok, &f, want_logprobs)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A completion request as the internal request (and whether a stream
/// ends with a usage chunk).
pub fn completion_request(st: &ServerState, body: &[u8]) -> Result<(Request, bool), ApiError> {
    fields::check(body, &[api::SAMPLING_FIELDS, api::COMPLETION_FIELDS])?;
    let req: CompletionRequest = api::parse_body(body)?;
    if req.echo {
        return Err(ApiError::bad_request("echo is not supported").with_param("echo"));
    }
    let params = req.sampling.params(&st.sampling_context())?;
    let bad = |m: &str| ApiError::bad_request(m).with_param("prompt");
    let prompt = match req.prompt {
        api::Prompt::Text(t) => Prompt::Text(t),
        api::Prompt::Texts(mut v) if v.len() == 1 => Prompt::Text(v.swap_remove(0)),
        api::Prompt::Tokens(v) => Prompt::Tokens(v),
        api::Prompt::TokenLists(mut v) if v.len() == 1 => Prompt::Tokens(v.swap_remove(0)),
        api::Prompt::Texts(_) | api::Prompt::TokenLists(_) => {
            return Err(bad("one prompt per request is supported"))
        }
    };
    let logprobs = match req.logprobs {
        Some(k) => Some(api::top_logprobs(k, "logprobs")?),
        None => None,
    };
    Ok((
        Request {
            input: Input::Prompt(prompt),
            params,
            max_tokens: req.max_tokens,
            max_tokens_param: "max_tokens",
            stop: req.sampling.stops(),
            ignore_eos: req.sampling.ignore_eos,
            n: req.sampling.n(),
            logprobs,
            stream: req.sampling.stream,
            output: req.output.spec()?,
        },
        req.sampling.include_usage(),
    ))
}

fn completion_body(meta: &ResponseMeta, tok: &Tokenizer, f: &Finished, logprobs: bool) -> Value {
    let choices = f
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lp = if logprobs {
                api::completion_logprobs(tok, &c.logprobs, 0)
            } else {
                Value::Null
            };
            api::completion_choice(i, &c.text, Some(c.finish()), lp)
        })
        .collect();
    api::completion(meta, choices, Some(&f.usage))
}

/// `[DONE]`, the end of an OpenAI stream.
fn done_marker() -> sse::Event {
    sse::Event::default().data("[DONE]")
}

struct CompletionStream {
    meta: ResponseMeta,
    tok: Arc<Tokenizer>,
    include_usage: bool,
    logprobs: bool,
    /// Where each choice's next text starts (`text_offset`).
    offsets: Vec<usize>,
}

impl Render for CompletionStream {
    fn start(&mut self) -> Vec<sse::Event> {
        Vec::new()
    }

    fn text(&mut self, i: usize, text: &str, lps: Vec<TokenLogprob>) -> Vec<sse::Event> {
        let lp = if self.logprobs {
            api::completion_logprobs(&self.tok, &lps, self.offsets[i])
        } else {
            Value::Null
        };
        self.offsets[i] += text.len();
        let choice = api::completion_choice(i, text, None, lp);
        vec![job::data(&api::completion(&self.meta, vec![choice], None))]
    }

    fn done(&mut self, i: usize, finish: FinishReason, _: Option<&str>) -> Vec<sse::Event> {
        let choice = api::completion_choice(i, "", Some(finish), Value::Null);
        vec![job::data(&api::completion(&self.meta, vec![choice], None))]
    }

    fn end(&mut self, usage: &Usage) -> Vec<sse::Event> {
        let mut out = Vec::new();
        if self.include_usage {
            out.push(job::data(&api::usage_chunk(
                &self.meta,
                "text_completion",
                usage,
            )));
        }
        out.push(done_marker());
        out
    }

    fn error(&mut self, err: &ApiError) -> Vec<sse::Event> {
        vec![job::data(&err.body()), done_marker()]
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(st): State<Arc<ServerState>>, body: Bytes) -> Response {
    let start = Instant::now();
    let (req, include_usage) = match chat_request(&st, &body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let want_logprobs = req.logprobs.is_some();
    let job = match request::prepare(&st, req) {
        Ok(j) => j,
        Err(e) => return e.into_response(),
    };
    let meta = st.meta("chatcmpl");
    let parser = job.parser.clone();
    let (n, stream) = (job.n, job.stream);
    let run = match job::submit(&st, &job, start) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    let tok = st.tokenizer.clone();
    if stream {
        return run.stream(ChatStream {
            replies: (0..n).map(|i| ChatReply::new(parser.clone(), i)).collect(),
            pending: vec![Vec::new(); n],
            meta,
            tok,
            include_usage,
            logprobs: want_logprobs,
        });
    }
    match run.collect().await {
        Ok(f) => {
            let choices = f
                .choices
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let parsed = c.parsed(parser.as_ref());
                    let (message, finish) = reply::message(&meta, i, &parsed, c.finish());
                    let lp = if want_logprobs {
                        api::chat_logprobs(&tok, &c.logprobs)
                    } else {
                        Value::Null
                    };
                    api::chat_choice(i, message, finish, lp)
                })
                .collect();
            Json(api::chat_completion(&meta, choices, &f.usage)).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// A chat request as the internal request (and whether a stream ends
/// with a usage chunk).
pub fn chat_request(st: &ServerState, body: &[u8]) -> Result<(Request, bool), ApiError> {
    fields::check(body, &[api::SAMPLING_FIELDS, api::CHAT_FIELDS])?;
    let req: ChatRequest = api::parse_body(body)?;
    let params = req.sampling.params(&st.sampling_context())?;
    let chat = chat_input(&req)?;
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (true, k) => Some(api::top_logprobs(k.unwrap_or(0), "top_logprobs")?),
        (false, Some(_)) => {
            return Err(ApiError::bad_request("top_logprobs needs logprobs: true")
                .with_param("top_logprobs"))
        }
        (false, None) => None,
    };
    let (max_tokens, param) = match (req.max_completion_tokens, req.max_tokens) {
        (Some(m), _) => (Some(m), "max_completion_tokens"),
        (None, m) => (m, "max_tokens"),
    };
    Ok((
        Request {
            input: Input::Chat(chat),
            params,
            max_tokens,
            max_tokens_param: param,
            stop: req.sampling.stops(),
            ignore_eos: req.sampling.ignore_eos,
            n: req.sampling.n(),
            logprobs,
            stream: req.sampling.stream,
            output: req.output.spec()?,
        },
        req.sampling.include_usage(),
    ))
}

/// The conversation of a chat request.
fn chat_input(req: &ChatRequest) -> Result<Chat, ApiError> {
    let tool_choice = api::tool_choice(req.tool_choice.as_ref())?;
    Ok(Chat {
        messages: api::normalise_messages(&req.messages)?,
        tools: req.tools.clone(),
        one_tool_call: api::parallel_tool_calls(req.parallel_tool_calls, &tool_choice)?,
        tool_choice,
        kwargs: req.kwargs(),
    })
}

/// `POST /apply-template` (llama-server's): a chat request's body, answered
/// with `{"prompt": TEXT}`, the rendered prompt, without generating.
pub async fn apply_template(State(st): State<Arc<ServerState>>, body: Bytes) -> Response {
    let rendered = api::parse_body::<ChatRequest>(&body).and_then(|req| {
        let chat = chat_input(&req)?;
        let vars = chat.template_vars()?;
        request::render_chat(&st.template, &chat.messages, &vars)
    });
    match rendered {
        Ok(prompt) => Json(json!({ "prompt": prompt })).into_response(),
        Err(e) => e.into_response(),
    }
}

struct ChatStream {
    meta: ResponseMeta,
    tok: Arc<Tokenizer>,
    include_usage: bool,
    logprobs: bool,
    replies: Vec<ChatReply>,
    /// Log-probabilities not yet sent, per choice (they go with the next
    /// chunk of that choice).
    pending: Vec<Vec<TokenLogprob>>,
}

impl ChatStream {
    /// `chunks` of choice `i`, the pending log-probabilities on the first.
    fn with_logprobs(&mut self, i: usize, mut chunks: Vec<Value>) -> Vec<sse::Event> {
        if self.logprobs && !self.pending[i].is_empty() {
            if let Some(first) = chunks.first_mut() {
                let lps = std::mem::take(&mut self.pending[i]);
                first["choices"][0]["logprobs"] = api::chat_logprobs(&self.tok, &lps);
            }
        }
        chunks.iter().map(job::data).collect()
    }
}

impl Render for ChatStream {
    fn start(&mut self) -> Vec<sse::Event> {
        (0..self.replies.len())
            .map(|i| {
                let delta = json!({"role": "assistant", "content": ""});
                job::data(&api::chat_chunk(&self.meta, i, delta, None, Value::Null))
            })
            .collect()
    }

    fn text(&mut self, i: usize, text: &str, lps: Vec<TokenLogprob>) -> Vec<sse::Event> {
        self.pending[i].extend(lps);
        let chunks = self.replies[i].chunks(&self.meta, text);
        self.with_logprobs(i, chunks)
    }

    fn done(&mut self, i: usize, finish: FinishReason, _: Option<&str>) -> Vec<sse::Event> {
        let chunks = self.replies[i].last_chunks(&self.meta, finish);
        self.with_logprobs(i, chunks)
    }

    fn end(&mut self, usage: &Usage) -> Vec<sse::Event> {
        let mut out = Vec::new();
        if self.include_usage {
            out.push(job::data(&api::usage_chunk(
                &self.meta,
                "chat.completion.chunk",
                usage,
            )));
        }
        out.push(done_marker());
        out
    }

    fn error(&mut self, err: &ApiError) -> Vec<sse::Event> {
        vec![job::data(&err.body()), done_marker()]
    }
}
