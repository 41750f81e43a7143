//! Anthropic's Messages API: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`. A request (system prompt, messages of
//! content blocks — `text`, `tool_use`, `tool_result`, `thinking` — and
//! tools with `input_schema`) becomes the internal chat [`Request`]; the
//! reply comes back as content blocks (`thinking` from the model's
//! reasoning, `text`, `tool_use`), whole or streamed with Anthropic's
//! events (`message_start`, `content_block_start` / `_delta` / `_stop`,
//! `message_delta`, `message_stop`). Structured outputs
//! (`output_config.format`, a JSON schema) constrain the reply as OpenAI's
//! `response_format` does. Errors are Anthropic's
//! `{"type": "error", "error": {"type", "message"}}` (see
//! [`crate::errors`]).

use crate::api::{self, ApiError, FinishReason, OutputSpec, ResponseMeta, Stop, Usage};
use crate::fields;
use crate::job::{self, Render};
use crate::request::{self, Chat, Input, Request, ToolChoice};
use crate::routes::ServerState;
use crate::template::tool_calls::{Delta, Parsed, StreamParser};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::sse;
use axum::response::{IntoResponse, Response};
use axum::Json;
use coil::engine::constraint::ConstraintSpec;
use coil::engine::logprobs::TokenLogprob;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use std::time::Instant;

/// The fields of a Messages request (`temperature`, `top_p` and `top_k`
/// as the API had them; newer clients send none).
const FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
    "output_format",
];

/// Anthropic's metadata, accepted without effect on the output: prompt
/// cache markers, where and how fast to run, who is asking, diagnostics.
const METADATA: &[&str] = &[
    "cache_control",
    "inference_geo",
    "speed",
    "user_profile_id",
    "workspace_id",
    "diagnostics",
];

#[derive(Deserialize)]
struct MessagesRequest {
    #[allow(dead_code)]
    model: Option<String>,
    max_tokens: Option<u64>,
    messages: Vec<Value>,
    system: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    #[serde(default)]
    stream: bool,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
    output_config: Option<Value>,
    /// The structured-outputs beta's spelling of `output_config.format`.
    output_format: Option<Value>,
}

/// Anthropic's error body for an HTTP status and message.
pub fn error_body(status: u16, message: &str) -> Value {
    let kind = match status {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    };
    json!({ "type": "error", "error": { "type": kind, "message": message } })
}

/// `POST /v1/messages`.
pub async fn messages(State(st): State<Arc<ServerState>>, body: Bytes) -> Response {
    let start = Instant::now();
    let req = match messages_request(&st, &body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let stops = req.stop.clone();
    let job = match request::prepare(&st, req) {
        Ok(j) => j,
        Err(e) => return e.into_response(),
    };
    let meta = st.meta("msg");
    let parser = job.parser.clone();
    let input_tokens = job.prompt.len();
    let stream = job.stream;
    let run = match job::submit(&st, &job, start) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    if stream {
        return run.stream(MessageStream {
            meta,
            parser,
            stops,
            input_tokens,
            index: 0,
            open: None,
            n_calls: 0,
            stop: None,
        });
    }
    match run.collect().await {
        Ok(f) => {
            let c = &f.choices[0];
            let parsed = c.parsed(parser.as_ref());
            let reason = stop_reason(
                c.finish(),
                c.stop.as_deref(),
                &stops,
                !parsed.tool_calls.is_empty(),
            );
            let mut body = message(&meta, content_blocks(&meta, &parsed), &f.usage);
            body["stop_reason"] = json!(reason.0);
            body["stop_sequence"] = json!(reason.1);
            Json(body).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the prompt's
/// tokens as rendered by the chat template.
pub async fn count_tokens(State(st): State<Arc<ServerState>>, body: Bytes) -> Response {
    let run = || -> Result<Value, ApiError> {
        fields::check(
            &body,
            &[&[
                "model",
                "messages",
                "system",
                "tools",
                "tool_choice",
                "thinking",
            ]],
        )?;
        let req: MessagesRequest = api::parse_body(&body)?;
        let chat = chat(&req)?;
        let vars = chat.template_vars()?;
        let prompt = request::chat_prompt(&st.template, &st.tokenizer, &chat.messages, &vars)?;
        Ok(json!({ "input_tokens": prompt.len() }))
    };
    match run() {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// A Messages request as the internal request.
fn messages_request(st: &ServerState, body: &[u8]) -> Result<Request, ApiError> {
    fields::check(body, &[FIELDS, METADATA])?;
    let req: MessagesRequest = api::parse_body(body)?;
    let Some(max_tokens) = req.max_tokens else {
        return Err(ApiError::bad_request("max_tokens: Field required").with_param("max_tokens"));
    };
    let sampling = api::Sampling {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        stop: req.stop_sequences.clone().map(Stop::Many),
        ..Default::default()
    };
    let params = sampling.params(&st.sampling_context())?;
    let output = output_format(&req)?;
    Ok(Request {
        input: Input::Chat(chat(&req)?),
        params,
        max_tokens: Some(max_tokens),
        max_tokens_param: "max_tokens",
        stop: sampling.stops(),
        ignore_eos: false,
        n: 1,
        logprobs: None,
        stream: req.stream,
        output,
    })
}

/// The conversation of a Messages request, in OpenAI's chat shape.
fn chat(req: &MessagesRequest) -> Result<Chat, ApiError> {
    let mut messages = Vec::new();
    if let Some(system) = &req.system {
        let text = text_of(system, "system")?;
        messages.push(json!({ "role": "system", "content": text }));
    }
    for (i, m) in req.messages.iter().enumerate() {
        translate_message(i, m, &mut messages)?;
    }
    let tools = match &req.tools {
        None => None,
        Some(list) => Some(Value::Array(
            list.iter()
                .enumerate()
                .map(|(i, t)| tool(i, t))
                .collect::<Result<_, _>>()?,
        )),
    };
    let mut kwargs = Map::new();
    match req
        .thinking
        .as_ref()
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
    {
        Some("enabled") => {
            kwargs.insert("enable_thinking".into(), json!(true));
        }
        Some("disabled") => {
            kwargs.insert("enable_thinking".into(), json!(false));
        }
        // adaptive: the model decides, as its template does by default
        None | Some("adaptive") => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "thinking.type must be enabled, disabled or adaptive, got \"{other}\""
            ))
            .with_param("thinking"))
        }
    }
    if let Some(cfg) = &req.output_config {
        output_config(cfg, &mut kwargs)?;
    }
    let (tool_choice, one_tool_call) = tool_choice(req.tool_choice.as_ref())?;
    Ok(Chat {
        messages: api::normalise_messages(&messages)?,
        tools,
        tool_choice,
        one_tool_call,
        kwargs,
    })
}

/// `output_config`: `effort` goes to the template as `reasoning_effort`;
/// `format` is read by [`output_format`].
fn output_config(cfg: &Value, kwargs: &mut Map<String, Value>) -> Result<(), ApiError> {
    let Some(obj) = cfg.as_object() else {
        return Err(
            ApiError::bad_request("output_config must be an object").with_param("output_config")
        );
    };
    for (k, v) in obj {
        match k.as_str() {
            "effort" if v.is_string() => {
                kwargs.insert("reasoning_effort".into(), v.clone());
            }
            "effort" if v.is_null() => {}
            "format" => {}
            other => return Err(fields::unsupported(&format!("output_config.{other}"))),
        }
    }
    Ok(())
}

/// Structured outputs: `output_config.format` (or the beta's top-level
/// `output_format`), `{"type": "json_schema", "schema": {...}}`, is the
/// same constraint as OpenAI's `response_format` (see
/// [`crate::structured`]).
fn output_format(req: &MessagesRequest) -> Result<Option<OutputSpec>, ApiError> {
    let in_config = req
        .output_config
        .as_ref()
        .and_then(|c| c.get("format"))
        .filter(|f| !f.is_null());
    let top = req.output_format.as_ref().filter(|f| !f.is_null());
    let (f, at, param) = match (in_config, top) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "give either output_config.format or output_format, not both",
            )
            .with_param("output_format"))
        }
        (Some(f), None) => (f, "output_config.format", "output_config"),
        (None, Some(f)) => (f, "output_format", "output_format"),
        (None, None) => return Ok(None),
    };
    let bad = |m: String| ApiError::bad_request(m).with_param(param);
    let Some(obj) = f.as_object() else {
        return Err(bad(format!(
            "{at} must be an object {{\"type\": \"json_schema\", \"schema\": {{...}}}}"
        )));
    };
    match obj.get("type").and_then(Value::as_str) {
        Some("json_schema") => {}
        _ => {
            return Err(bad(format!(
                "{at}.type must be \"json_schema\", got {}",
                obj.get("type").unwrap_or(&Value::Null)
            )))
        }
    }
    if let Some(k) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "type" | "schema"))
    {
        return Err(fields::unsupported(&format!("{at}.{k}")));
    }
    match obj.get("schema") {
        Some(s) if s.is_object() || s.is_boolean() => Ok(Some(OutputSpec::new(
            ConstraintSpec::JsonSchema(s.clone()),
            param,
            &format!("{at}.schema"),
        ))),
        _ => Err(bad(format!(
            "{at}.schema: Field required (a JSON schema object)"
        ))),
    }
}

fn bad(m: String) -> ApiError {
    ApiError::bad_request(m).with_param("messages")
}

/// A string, or text blocks joined.
fn text_of(v: &Value, what: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (j, b) in blocks.iter().enumerate() {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        out.push_str(b.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    other => {
                        return Err(bad(format!(
                            "{what}[{j}]: blocks of type {} are not supported here (text only)",
                            other.unwrap_or("(none)")
                        )))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(bad(format!(
            "{what} must be a string or a list of text blocks"
        ))),
    }
}

/// Message `i` as OpenAI chat messages: a user turn's `tool_result`
/// blocks become `tool` messages (before its text); an assistant turn's
/// `thinking` becomes `reasoning_content` and its `tool_use` blocks
/// `tool_calls`.
fn translate_message(i: usize, m: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let role = m.get("role").and_then(Value::as_str).unwrap_or("");
    if role != "user" && role != "assistant" {
        return Err(bad(format!(
            "messages[{i}].role must be \"user\" or \"assistant\", got {:?}",
            m.get("role")
        )));
    }
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({ "role": role, "content": s }));
            return Ok(());
        }
        Some(Value::Array(b)) => b,
        _ => {
            return Err(bad(format!(
                "messages[{i}].content must be a string or a list of content blocks"
            )))
        }
    };
    let (mut text, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        match (role, b.get("type").and_then(Value::as_str)) {
            (_, Some("text")) => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            ("assistant", Some("thinking")) => {
                reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""))
            }
            // encrypted reasoning of another model: nothing to show this one
            ("assistant", Some("redacted_thinking")) => {}
            ("assistant", Some("tool_use")) => {
                let (Some(id), Some(name)) = (
                    b.get("id").and_then(Value::as_str),
                    b.get("name").and_then(Value::as_str),
                ) else {
                    return Err(bad(format!("{at}: tool_use needs id and name")));
                };
                calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": { "name": name, "arguments": b.get("input").cloned().unwrap_or(json!({})) },
                }));
            }
            ("user", Some("tool_result")) => {
                let Some(id) = b.get("tool_use_id").and_then(Value::as_str) else {
                    return Err(bad(format!("{at}: tool_result needs tool_use_id")));
                };
                let content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &format!("{at}.content"))?,
                };
                out.push(json!({ "role": "tool", "tool_call_id": id, "content": content }));
            }
            (_, other) => {
                return Err(bad(format!(
                    "{at}: content blocks of type {} are not supported in a {role} message",
                    other.unwrap_or("(none)")
                )))
            }
        }
    }
    if role == "user"
        && text.is_empty()
        && !blocks.is_empty()
        && out.last().is_some_and(|m| m["role"] == "tool")
    {
        return Ok(());
    }
    let mut msg = json!({ "role": role, "content": text });
    if !reasoning.is_empty() {
        msg["reasoning_content"] = json!(reasoning);
    }
    if !calls.is_empty() {
        msg["tool_calls"] = Value::Array(calls);
    }
    out.push(msg);
    Ok(())
}

/// An Anthropic tool (`name`, `description`, `input_schema`) as OpenAI's.
fn tool(i: usize, t: &Value) -> Result<Value, ApiError> {
    let bad = |m: String| ApiError::bad_request(m).with_param("tools");
    if let Some(kind) = t.get("type").and_then(Value::as_str) {
        if kind != "custom" {
            return Err(bad(format!(
                "tools[{i}]: server tools (type {kind}) are not supported; give name, description and input_schema"
            )));
        }
    }
    let Some(name) = t.get("name").and_then(Value::as_str) else {
        return Err(bad(format!("tools[{i}].name is required")));
    };
    let mut f = json!({
        "name": name,
        "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"})),
    });
    if let Some(d) = t.get("description") {
        f["description"] = d.clone();
    }
    Ok(json!({ "type": "function", "function": f }))
}

/// `tool_choice`: `auto`, `none`, `any` (a tool call is forced) or
/// `{"type": "tool", "name": ...}` (that tool's call is forced; see
/// [`crate::structured`]); and whether `disable_parallel_tool_use` asks
/// for exactly one call (enforced where a call is forced).
fn tool_choice(v: Option<&Value>) -> Result<(ToolChoice, bool), ApiError> {
    let bad = |m: String| ApiError::bad_request(m).with_param("tool_choice");
    let Some(v) = v else {
        return Ok((ToolChoice::Auto, false));
    };
    let choice = match v.get("type").and_then(Value::as_str) {
        Some("auto") => ToolChoice::Auto,
        Some("none") => ToolChoice::None,
        Some("any") => ToolChoice::Required,
        Some("tool") => match v.get("name").and_then(Value::as_str) {
            Some(n) => ToolChoice::Function(n.to_string()),
            None => return Err(bad("tool_choice of type \"tool\" needs a \"name\"".into())),
        },
        other => {
            return Err(bad(format!(
                "tool_choice.type must be auto, any, tool or none, got {other:?}"
            )))
        }
    };
    let one = v.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true);
    if one && !choice.forces() {
        return Err(bad(
            "tool_choice.disable_parallel_tool_use needs type any or tool (with auto a reply may make several calls)".into(),
        ));
    }
    Ok((choice, one))
}

/// A tool call's id.
fn tool_id(meta: &ResponseMeta, i: usize) -> String {
    let tail = meta.id.rsplit('-').next().unwrap_or_default();
    format!("toolu_{tail}_{i}")
}

/// A reply's content blocks: thinking, text, tool uses.
fn content_blocks(meta: &ResponseMeta, p: &Parsed) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(r) = &p.reasoning {
        out.push(json!({ "type": "thinking", "thinking": r, "signature": "" }));
    }
    if let Some(t) = &p.content {
        out.push(json!({ "type": "text", "text": t }));
    }
    for (i, c) in p.tool_calls.iter().enumerate() {
        let input: Value = serde_json::from_str(&c.arguments).unwrap_or(json!({}));
        out.push(
            json!({ "type": "tool_use", "id": tool_id(meta, i), "name": c.name, "input": input }),
        );
    }
    out
}

/// `stop_reason` and `stop_sequence`: `tool_use` when the reply made calls
/// and ended by itself, `stop_sequence` when one of the request's ended it.
fn stop_reason(
    finish: FinishReason,
    matched: Option<&str>,
    stops: &[String],
    made_calls: bool,
) -> (&'static str, Option<String>) {
    match (finish, matched) {
        (FinishReason::Length, _) => ("max_tokens", None),
        (FinishReason::Stop, Some(s)) if stops.iter().any(|x| x == s) => {
            ("stop_sequence", Some(s.to_string()))
        }
        _ if made_calls => ("tool_use", None),
        _ => ("end_turn", None),
    }
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": u.completion_tokens,
    })
}

/// A `message` object.
fn message(meta: &ResponseMeta, content: Vec<Value>, usage: &Usage) -> Value {
    json!({
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": content,
        "stop_reason": null,
        "stop_sequence": null,
        "usage": usage_json(usage),
    })
}

/// The open content block of a stream.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Text,
    Thinking,
}

struct MessageStream {
    meta: ResponseMeta,
    parser: Option<StreamParser>,
    /// The request's stop sequences.
    stops: Vec<String>,
    input_tokens: usize,
    /// The next block's index.
    index: usize,
    open: Option<Open>,
    n_calls: usize,
    /// How it ended, for `message_delta`.
    stop: Option<(&'static str, Option<String>)>,
}

impl MessageStream {
    fn close(&mut self, out: &mut Vec<sse::Event>) {
        if self.open.take().is_some() {
            out.push(job::typed(
                &json!({ "type": "content_block_stop", "index": self.index }),
            ));
            self.index += 1;
        }
    }

    fn deltas(&mut self, deltas: Vec<Delta>) -> Vec<sse::Event> {
        let mut out = Vec::new();
        for d in deltas {
            let (kind, text) = match d {
                Delta::Content(t) => (Open::Text, t),
                Delta::Reasoning(t) => (Open::Thinking, t),
                Delta::ToolCall(c) => {
                    self.close(&mut out);
                    let id = tool_id(&self.meta, self.n_calls);
                    self.n_calls += 1;
                    let i = self.index;
                    out.push(job::typed(&json!({
                        "type": "content_block_start", "index": i,
                        "content_block": { "type": "tool_use", "id": id, "name": c.name, "input": {} },
                    })));
                    out.push(job::typed(&json!({
                        "type": "content_block_delta", "index": i,
                        "delta": { "type": "input_json_delta", "partial_json": c.arguments },
                    })));
                    out.push(job::typed(
                        &json!({ "type": "content_block_stop", "index": i }),
                    ));
                    self.index += 1;
                    continue;
                }
            };
            if text.is_empty() {
                continue;
            }
            if self.open != Some(kind) {
                self.close(&mut out);
                let block = match kind {
                    Open::Text => json!({ "type": "text", "text": "" }),
                    Open::Thinking => {
                        json!({ "type": "thinking", "thinking": "", "signature": "" })
                    }
                };
                out.push(job::typed(&json!({
                    "type": "content_block_start", "index": self.index, "content_block": block,
                })));
                self.open = Some(kind);
            }
            let delta = match kind {
                Open::Text => json!({ "type": "text_delta", "text": text }),
                Open::Thinking => json!({ "type": "thinking_delta", "thinking": text }),
            };
            out.push(job::typed(&json!({
                "type": "content_block_delta", "index": self.index, "delta": delta,
            })));
        }
        out
    }
}

impl Render for MessageStream {
    fn start(&mut self) -> Vec<sse::Event> {
        let usage = Usage {
            prompt_tokens: self.input_tokens,
            ..Default::default()
        };
        vec![
            job::typed(&json!({
                "type": "message_start",
                "message": message(&self.meta, Vec::new(), &usage),
            })),
            job::typed(&json!({ "type": "ping" })),
        ]
    }

    fn text(&mut self, _: usize, text: &str, _: Vec<TokenLogprob>) -> Vec<sse::Event> {
        let deltas = match self.parser.as_mut() {
            Some(p) => p.push(text),
            None => vec![Delta::Content(text.to_string())],
        };
        self.deltas(deltas)
    }

    fn done(&mut self, _: usize, finish: FinishReason, stop: Option<&str>) -> Vec<sse::Event> {
        let deltas = self.parser.as_mut().map(|p| p.finish()).unwrap_or_default();
        let mut out = self.deltas(deltas);
        self.close(&mut out);
        self.stop = Some(stop_reason(finish, stop, &self.stops, self.n_calls > 0));
        out
    }

    fn end(&mut self, usage: &Usage) -> Vec<sse::Event> {
        let (reason, seq) = self.stop.take().unwrap_or(("end_turn", None));
        vec![
            job::typed(&json!({
                "type": "message_delta",
                "delta": { "stop_reason": reason, "stop_sequence": seq },
                "usage": usage_json(usage),
            })),
            job::typed(&json!({ "type": "message_stop" })),
        ]
    }

    fn error(&mut self, err: &ApiError) -> Vec<sse::Event> {
        vec![job::typed(&error_body(err.status, &err.message))]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::tool_calls::ToolCall;

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "msg-abc0001".into(),
            created: 1,
            model: "m".into(),
        }
    }

    #[test]
    fn a_reply_streams_as_thinking_text_and_tool_use_blocks() {
        let mut s = MessageStream {
            meta: meta(),
            parser: None,
            stops: vec!["END".into()],
            input_tokens: 7,
            index: 0,
            open: None,
            n_calls: 0,
            stop: None,
        };
        let call = ToolCall {
            name: "get_weather".into(),
            arguments: "{\"city\":\"Paris\"}".into(),
        };
        let mut shown = Vec::new();
        let mut push = |evs: Vec<sse::Event>, n: usize| shown.push(evs.len() == n);
        push(
            s.deltas(vec![
                Delta::Reasoning("Think".into()),
                Delta::Reasoning("ing.".into()),
            ]),
            3,
        );
        push(s.deltas(vec![Delta::Content("Checking.".into())]), 3);
        push(s.deltas(vec![Delta::ToolCall(call)]), 4);
        assert!(shown.iter().all(|&b| b), "{shown:?}");
        assert_eq!(s.index, 3);
        assert_eq!(s.n_calls, 1);
        let mut out = Vec::new();
        s.close(&mut out);
        assert!(out.is_empty(), "the tool block closed itself");
        assert_eq!(
            stop_reason(FinishReason::Stop, None, &s.stops, true).0,
            "tool_use"
        );
        assert_eq!(
            stop_reason(FinishReason::Stop, Some("END"), &s.stops, false),
            ("stop_sequence", Some("END".into()))
        );
        // a template's own stop string is the turn's end, not the request's
        assert_eq!(
            stop_reason(FinishReason::Stop, Some("<|im_end|>"), &s.stops, false).0,
            "end_turn"
        );
        assert_eq!(
            stop_reason(FinishReason::Length, None, &s.stops, true).0,
            "max_tokens"
        );
    }

    #[test]
    fn whole_replies_are_content_blocks() {
        let p = Parsed {
            content: Some("Checking.".into()),
            reasoning: Some("Think.".into()),
            tool_calls: vec![ToolCall {
                name: "f".into(),
                arguments: "{\"a\":1}".into(),
            }],
        };
        let blocks = content_blocks(&meta(), &p);
        let kinds: Vec<&str> = blocks.iter().map(|b| b["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["thinking", "text", "tool_use"]);
        assert_eq!(blocks[2]["input"], json!({"a": 1}));
        assert_eq!(blocks[2]["id"], "toolu_abc0001_0");
    }

    #[test]
    fn tool_turns_become_openai_messages() {
        let req: MessagesRequest = serde_json::from_value(json!({
            "max_tokens": 5,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Call.", "signature": "x"},
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "18 C"}]},
                    {"type": "text", "text": "Thanks"}]},
            ],
            "tools": [{"name": "w", "input_schema": {"type": "object"}}],
            "thinking": {"type": "enabled", "budget_tokens": 100},
        }))
        .unwrap();
        let c = chat(&req).unwrap();
        let roles: Vec<&str> = c
            .messages
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        let a = &c.messages[2];
        assert_eq!(a["content"], "Let me check.");
        assert_eq!(a["reasoning_content"], "Call.");
        assert_eq!(
            a["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
        assert_eq!(c.messages[3]["tool_call_id"], "t1");
        assert_eq!(c.messages[3]["content"], "18 C");
        assert_eq!(c.tools.unwrap()[0]["function"]["name"], "w");
        assert_eq!(c.kwargs["enable_thinking"], true);
        assert_eq!(error_body(404, "x")["error"]["type"], "not_found_error");
    }
}
