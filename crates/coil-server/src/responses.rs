//! OpenAI's Responses API: `POST /v1/responses`. Input items — messages
//! (`input_text` / `output_text` parts), `function_call` and
//! `function_call_output`, `reasoning` — and `instructions` become the
//! internal chat [`Request`] (function tools as chat tools); the reply's
//! output items are `reasoning` (the model's reasoning as
//! `reasoning_text`), `message` (`output_text`) and `function_call`,
//! whole or streamed with the API's events (`response.created`,
//! `response.output_item.added`, `response.output_text.delta`,
//! `response.function_call_arguments.delta`, …, `response.completed`).
//! `text.format` (`json_object`, `json_schema`) constrains the output as
//! chat's `response_format` does. Nothing is stored:
//! `previous_response_id` is refused.

use crate::api::{self, ApiError, FinishReason, OutputSpec, ResponseMeta, Usage};
use crate::fields;
use crate::job::{self, Render};
use crate::request::{self, Chat, Input, Request};
use crate::routes::ServerState;
use crate::template::tool_calls::{Delta, Parsed, StreamParser, ToolCall};
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

/// The fields of a Responses request.
const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "reasoning",
    "text",
    "include",
    "truncation",
    "previous_response_id",
    "background",
];

#[derive(Deserialize)]
struct ResponsesRequest {
    #[allow(dead_code)]
    model: Option<String>,
    input: Value,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    max_output_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    #[serde(default)]
    stream: bool,
    reasoning: Option<Value>,
    text: Option<Value>,
    /// Extra output asked for (encrypted reasoning, logprobs, …): coil has
    /// none of it to add, and the output is the same without.
    #[allow(dead_code)]
    include: Option<Vec<String>>,
    truncation: Option<String>,
    previous_response_id: Option<String>,
    background: Option<bool>,
}

/// `POST /v1/responses`.
pub async fn create(State(st): State<Arc<ServerState>>, body: Bytes) -> Response {
    let start = Instant::now();
    let (req, echo) = match responses_request(&st, &body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let job = match request::prepare(&st, req) {
        Ok(j) => j,
        Err(e) => return e.into_response(),
    };
    let meta = st.meta("resp");
    let parser = job.parser.clone();
    let stream = job.stream;
    let run = match job::submit(&st, &job, start) {
        Ok(r) => r,
        Err(refused) => return *refused,
    };
    if stream {
        return run.stream(ResponseStream {
            meta,
            echo,
            parser,
            seq: 0,
            items: Vec::new(),
            open: None,
            finish: FinishReason::Stop,
        });
    }
    match run.collect().await {
        Ok(f) => {
            let c = &f.choices[0];
            let parsed = c.parsed(parser.as_ref());
            let items = output_items(&meta, &parsed);
            Json(response(
                &meta,
                &echo,
                "completed",
                c.finish(),
                items,
                Some(&f.usage),
            ))
            .into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// What a response repeats of its request.
#[derive(Clone, Debug, Default)]
struct Echo {
    instructions: Option<String>,
    tools: Vec<Value>,
    tool_choice: Value,
    temperature: Option<f32>,
    top_p: Option<f32>,
    max_output_tokens: Option<u64>,
    reasoning: Value,
    /// `text.format` as asked (`{"type": "text"}` when absent).
    format: Value,
}

/// A Responses request as the internal request.
fn responses_request(st: &ServerState, body: &[u8]) -> Result<(Request, Echo), ApiError> {
    fields::check(body, &[FIELDS])?;
    let req: ResponsesRequest = api::parse_body(body)?;
    if req.previous_response_id.is_some() {
        return Err(ApiError::bad_request(
            "previous_response_id is not supported (coil stores no responses): send the whole conversation as input",
        )
        .with_param("previous_response_id"));
    }
    if req.background == Some(true) {
        return Err(
            ApiError::bad_request("background responses are not supported")
                .with_param("background"),
        );
    }
    if let Some(t) = req.truncation.as_deref().filter(|t| *t != "disabled") {
        return Err(ApiError::bad_request(format!(
            "truncation \"{t}\" is not supported (only \"disabled\")"
        ))
        .with_param("truncation"));
    }
    let (output, format) = match &req.text {
        Some(text) => text_options(text)?,
        None => (None, json!({"type": "text"})),
    };
    let sampling = api::Sampling {
        temperature: req.temperature,
        top_p: req.top_p,
        ..Default::default()
    };
    let params = sampling.params(&st.sampling_context())?;
    let mut kwargs = Map::new();
    if let Some(effort) = req
        .reasoning
        .as_ref()
        .and_then(|r| r.get("effort"))
        .and_then(Value::as_str)
    {
        kwargs.insert("reasoning_effort".into(), json!(effort));
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
    let tool_choice = match &req.tool_choice {
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            Some(json!({"type": "function", "function": {"name": o.get("name")}}))
        }
        other => other.clone(),
    };
    let tool_choice = api::tool_choice(tool_choice.as_ref())?;
    let chat = Chat {
        messages: api::normalise_messages(&messages(req.instructions.as_deref(), &req.input)?)?,
        tools,
        one_tool_call: api::parallel_tool_calls(req.parallel_tool_calls, &tool_choice)?,
        tool_choice,
        kwargs,
    };
    let echo = Echo {
        instructions: req.instructions.clone(),
        tools: req.tools.clone().unwrap_or_default(),
        tool_choice: req.tool_choice.clone().unwrap_or(json!("auto")),
        temperature: req.temperature,
        top_p: req.top_p,
        max_output_tokens: req.max_output_tokens,
        reasoning: req.reasoning.clone().unwrap_or(json!({})),
        format,
    };
    let request = Request {
        input: Input::Chat(chat),
        params,
        max_tokens: req.max_output_tokens,
        max_tokens_param: "max_output_tokens",
        stop: Vec::new(),
        ignore_eos: false,
        n: 1,
        logprobs: None,
        stream: req.stream,
        output,
    };
    Ok((request, echo))
}

/// `text`: `format` is `{"type": "text"}`, `{"type": "json_object"}` or
/// `{"type": "json_schema", "name", "schema", "strict", "description"}`
/// (structured outputs: the same constraint as chat's `response_format`,
/// see [`crate::structured`]). Returns the constraint and the format to
/// echo in the response.
fn text_options(text: &Value) -> Result<(Option<OutputSpec>, Value), ApiError> {
    let bad = |m: String| ApiError::bad_request(m).with_param("text");
    let Some(obj) = text.as_object() else {
        return Err(bad("text must be an object".into()));
    };
    let mut out = (None, json!({"type": "text"}));
    for (k, v) in obj {
        match k.as_str() {
            "format" if v.is_null() => {}
            "format" => out = (text_format(v)?, v.clone()),
            other => return Err(fields::unsupported(&format!("text.{other}"))),
        }
    }
    Ok(out)
}

/// `text.format` as a constraint (`None`: free text).
fn text_format(f: &Value) -> Result<Option<OutputSpec>, ApiError> {
    let bad = |m: String| ApiError::bad_request(m).with_param("text.format");
    let Some(obj) = f.as_object() else {
        return Err(bad("text.format must be an object with a \"type\"".into()));
    };
    let kind = obj.get("type").and_then(Value::as_str);
    let allowed: &[&str] = match kind {
        Some("text") | Some("json_object") => &["type"],
        Some("json_schema") => &["type", "name", "schema", "strict", "description"],
        _ => {
            return Err(bad(format!(
                "text.format.type must be text, json_object or json_schema, got {}",
                obj.get("type").unwrap_or(&Value::Null)
            )))
        }
    };
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(fields::unsupported(&format!("text.format.{k}")));
    }
    Ok(match kind {
        Some("json_object") => Some(OutputSpec::new(
            ConstraintSpec::JsonObject,
            "text.format",
            "text.format",
        )),
        Some("json_schema") => {
            match obj.get("schema") {
                Some(s) if s.is_object() || s.is_boolean() => Some(OutputSpec::new(
                    ConstraintSpec::JsonSchema(s.clone()),
                    "text.format",
                    "text.format.schema",
                )),
                _ => return Err(bad(
                    "text.format.schema is required (a JSON schema object) with type json_schema"
                        .into(),
                )),
            }
        }
        _ => None,
    })
}

/// A function tool (`{"type": "function", "name", "description",
/// "parameters", "strict"}`) as a chat tool.
fn tool(i: usize, t: &Value) -> Result<Value, ApiError> {
    let bad = |m: String| ApiError::bad_request(m).with_param("tools");
    match t.get("type").and_then(Value::as_str) {
        Some("function") => {}
        other => {
            return Err(bad(format!(
                "tools[{i}]: tools of type {} are not supported (function tools only)",
                other.unwrap_or("(none)")
            )))
        }
    }
    let Some(name) = t.get("name").and_then(Value::as_str) else {
        return Err(bad(format!("tools[{i}].name is required")));
    };
    let mut f = json!({
        "name": name,
        "parameters": t.get("parameters").cloned().unwrap_or(json!({"type": "object"})),
    });
    if let Some(d) = t.get("description") {
        f["description"] = d.clone();
    }
    Ok(json!({ "type": "function", "function": f }))
}

fn bad_input(m: String) -> ApiError {
    ApiError::bad_request(m).with_param("input")
}

/// Text of `content`: a string, or `input_text` / `output_text` parts.
fn content_text(at: &str, content: &Value) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        out.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    other => {
                        return Err(bad_input(format!(
                            "{at}.content[{j}]: parts of type {} are not supported (text only)",
                            other.unwrap_or("(none)")
                        )))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(bad_input(format!(
            "{at}.content must be a string or a list of parts"
        ))),
    }
}

/// `instructions` and the input items as chat messages: assistant items
/// in a row (reasoning, output messages, function calls) make one
/// assistant message.
fn messages(instructions: Option<&str>, input: &Value) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(i) = instructions {
        out.push(json!({ "role": "system", "content": i }));
    }
    let items = match input {
        Value::String(s) => {
            out.push(json!({ "role": "user", "content": s }));
            return Ok(out);
        }
        Value::Array(items) => items,
        _ => {
            return Err(bad_input(
                "input must be a string or a list of items".into(),
            ))
        }
    };
    // the assistant turn being gathered
    let mut turn: Option<Map<String, Value>> = None;
    let flush = |turn: &mut Option<Map<String, Value>>, out: &mut Vec<Value>| {
        if let Some(t) = turn.take() {
            out.push(Value::Object(t));
        }
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item.get("type").and_then(Value::as_str);
        let role = item.get("role").and_then(Value::as_str);
        match (kind, role) {
            (None | Some("message"), Some("assistant")) => {
                let text = content_text(&at, item.get("content").unwrap_or(&Value::Null))?;
                let t = assistant(&mut turn);
                let mut c = t["content"].as_str().unwrap_or("").to_string();
                c.push_str(&text);
                t.insert("content".into(), json!(c));
            }
            (None | Some("message"), Some(r @ ("user" | "system" | "developer"))) => {
                flush(&mut turn, &mut out);
                let text = content_text(&at, item.get("content").unwrap_or(&Value::Null))?;
                let role = if r == "developer" { "system" } else { r };
                out.push(json!({ "role": role, "content": text }));
            }
            (Some("reasoning"), _) => {
                let mut text = String::new();
                for key in ["content", "summary"] {
                    for p in item
                        .get(key)
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        text.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""));
                    }
                    if !text.is_empty() {
                        break;
                    }
                }
                if !text.is_empty() {
                    let t = assistant(&mut turn);
                    let mut r = t
                        .get("reasoning_content")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    r.push_str(&text);
                    t.insert("reasoning_content".into(), json!(r));
                }
            }
            (Some("function_call"), _) => {
                let (Some(id), Some(name)) = (
                    item.get("call_id").and_then(Value::as_str),
                    item.get("name").and_then(Value::as_str),
                ) else {
                    return Err(bad_input(format!(
                        "{at}: function_call needs call_id and name"
                    )));
                };
                let args = item.get("arguments").cloned().unwrap_or(json!("{}"));
                let call = json!({ "id": id, "type": "function",
                    "function": { "name": name, "arguments": args } });
                let t = assistant(&mut turn);
                match t.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    Some(list) => list.push(call),
                    None => {
                        t.insert("tool_calls".into(), json!([call]));
                    }
                }
            }
            (Some("function_call_output"), _) => {
                flush(&mut turn, &mut out);
                let Some(id) = item.get("call_id").and_then(Value::as_str) else {
                    return Err(bad_input(format!(
                        "{at}: function_call_output needs call_id"
                    )));
                };
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(&at, v)?,
                    _ => return Err(bad_input(format!("{at}.output must be a string"))),
                };
                out.push(json!({ "role": "tool", "tool_call_id": id, "content": output }));
            }
            (other, r) => {
                return Err(bad_input(format!(
                    "{at}: items of type {} (role {}) are not supported",
                    other.unwrap_or("message"),
                    r.unwrap_or("none")
                )))
            }
        }
    }
    flush(&mut turn, &mut out);
    Ok(out)
}

/// The assistant turn being gathered, started when there is none.
fn assistant(turn: &mut Option<Map<String, Value>>) -> &mut Map<String, Value> {
    turn.get_or_insert_with(|| {
        let mut m = Map::new();
        m.insert("role".into(), json!("assistant"));
        m.insert("content".into(), json!(""));
        m
    })
}

/// An item's id: `prefix_` and the response's tail.
fn item_id(meta: &ResponseMeta, prefix: &str, i: usize) -> String {
    let tail = meta.id.rsplit('-').next().unwrap_or_default();
    format!("{prefix}_{tail}_{i}")
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({ "type": "reasoning", "id": id, "summary": [],
        "content": [{ "type": "reasoning_text", "text": text }] })
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({ "type": "message", "id": id, "status": status, "role": "assistant",
        "content": [{ "type": "output_text", "text": text, "annotations": [], "logprobs": [] }] })
}

fn call_item(meta: &ResponseMeta, i: usize, c: &ToolCall, status: &str) -> Value {
    json!({ "type": "function_call", "id": item_id(meta, "fc", i),
        "call_id": item_id(meta, "call", i), "name": c.name, "arguments": c.arguments,
        "status": status })
}

/// A whole reply's output items.
fn output_items(meta: &ResponseMeta, p: &Parsed) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(r) = &p.reasoning {
        out.push(reasoning_item(&item_id(meta, "rs", 0), r));
    }
    if let Some(t) = &p.content {
        out.push(message_item(&item_id(meta, "msg", 0), t, "completed"));
    }
    for (i, c) in p.tool_calls.iter().enumerate() {
        out.push(call_item(meta, i, c, "completed"));
    }
    out
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": { "cached_tokens": u.cached_tokens },
        "output_tokens": u.completion_tokens,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

/// A `response` object.
fn response(
    meta: &ResponseMeta,
    echo: &Echo,
    status: &str,
    finish: FinishReason,
    output: Vec<Value>,
    usage: Option<&Usage>,
) -> Value {
    let (status, incomplete) = match (status, finish) {
        ("completed", FinishReason::Length) => {
            ("incomplete", json!({ "reason": "max_output_tokens" }))
        }
        (s, _) => (s, Value::Null),
    };
    json!({
        "id": meta.id,
        "object": "response",
        "created_at": meta.created,
        "status": status,
        "incomplete_details": incomplete,
        "error": null,
        "model": meta.model,
        "output": output,
        "instructions": echo.instructions,
        "tools": echo.tools,
        "tool_choice": echo.tool_choice,
        "parallel_tool_calls": true,
        "temperature": echo.temperature,
        "top_p": echo.top_p,
        "max_output_tokens": echo.max_output_tokens,
        "previous_response_id": null,
        "reasoning": echo.reasoning,
        "text": { "format": echo.format },
        "truncation": "disabled",
        "store": false,
        "metadata": {},
        "usage": usage.map(usage_json),
    })
}

/// The output item a stream is writing.
enum OpenItem {
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
}

struct ResponseStream {
    meta: ResponseMeta,
    echo: Echo,
    parser: Option<StreamParser>,
    /// `sequence_number` of the next event.
    seq: u64,
    /// The finished output items.
    items: Vec<Value>,
    open: Option<OpenItem>,
    finish: FinishReason,
}

impl ResponseStream {
    fn event(&mut self, mut v: Value) -> sse::Event {
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        job::typed(&v)
    }

    fn close(&mut self, out: &mut Vec<sse::Event>) {
        let at = self.items.len();
        let item = match self.open.take() {
            None => return,
            Some(OpenItem::Reasoning { id, text }) => {
                out.push(self.event(json!({ "type": "response.reasoning_text.done",
                    "item_id": id, "output_index": at, "content_index": 0, "text": text })));
                reasoning_item(&id, &text)
            }
            Some(OpenItem::Message { id, text }) => {
                let part = json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": [] });
                out.push(self.event(json!({ "type": "response.output_text.done",
                    "item_id": id, "output_index": at, "content_index": 0, "text": text, "logprobs": [] })));
                out.push(self.event(json!({ "type": "response.content_part.done",
                    "item_id": id, "output_index": at, "content_index": 0, "part": part })));
                message_item(&id, &text, "completed")
            }
        };
        out.push(self.event(json!({ "type": "response.output_item.done",
            "output_index": at, "item": item })));
        self.items.push(item);
    }

    fn deltas(&mut self, deltas: Vec<Delta>) -> Vec<sse::Event> {
        let mut out = Vec::new();
        for d in deltas {
            let at = self.items.len();
            match d {
                Delta::ToolCall(c) => {
                    self.close(&mut out);
                    let at = self.items.len();
                    let n = self
                        .items
                        .iter()
                        .filter(|i| i["type"] == "function_call")
                        .count();
                    let mut item = call_item(&self.meta, n, &c, "in_progress");
                    item["arguments"] = json!("");
                    let id = item["id"].clone();
                    out.push(self.event(json!({ "type": "response.output_item.added",
                        "output_index": at, "item": item })));
                    out.push(
                        self.event(json!({ "type": "response.function_call_arguments.delta",
                        "item_id": id, "output_index": at, "delta": c.arguments })),
                    );
                    out.push(self.event(json!({ "type": "response.function_call_arguments.done",
                        "item_id": id, "output_index": at, "name": c.name, "arguments": c.arguments })));
                    let done = call_item(&self.meta, n, &c, "completed");
                    out.push(self.event(json!({ "type": "response.output_item.done",
                        "output_index": at, "item": done })));
                    self.items.push(done);
                }
                Delta::Reasoning(t) if !t.is_empty() => {
                    if !matches!(self.open, Some(OpenItem::Reasoning { .. })) {
                        self.close(&mut out);
                        let id = item_id(&self.meta, "rs", at);
                        let item =
                            json!({ "type": "reasoning", "id": id, "summary": [], "content": [] });
                        out.push(self.event(json!({ "type": "response.output_item.added",
                            "output_index": at, "item": item })));
                        self.open = Some(OpenItem::Reasoning {
                            id,
                            text: String::new(),
                        });
                    }
                    let Some(OpenItem::Reasoning { id, text }) = self.open.as_mut() else {
                        continue;
                    };
                    text.push_str(&t);
                    let id = id.clone();
                    out.push(self.event(json!({ "type": "response.reasoning_text.delta",
                        "item_id": id, "output_index": at, "content_index": 0, "delta": t })));
                }
                Delta::Content(t) if !t.is_empty() => {
                    if !matches!(self.open, Some(OpenItem::Message { .. })) {
                        self.close(&mut out);
                        let at = self.items.len();
                        let id = item_id(&self.meta, "msg", at);
                        let mut item = message_item(&id, "", "in_progress");
                        item["content"] = json!([]);
                        out.push(self.event(json!({ "type": "response.output_item.added",
                            "output_index": at, "item": item })));
                        out.push(self.event(json!({ "type": "response.content_part.added",
                            "item_id": id, "output_index": at, "content_index": 0,
                            "part": { "type": "output_text", "text": "", "annotations": [], "logprobs": [] } })));
                        self.open = Some(OpenItem::Message {
                            id,
                            text: String::new(),
                        });
                    }
                    let at = self.items.len();
                    let Some(OpenItem::Message { id, text }) = self.open.as_mut() else {
                        continue;
                    };
                    text.push_str(&t);
                    let id = id.clone();
                    out.push(self.event(json!({ "type": "response.output_text.delta",
                        "item_id": id, "output_index": at, "content_index": 0, "delta": t,
                        "logprobs": [] })));
                }
                Delta::Reasoning(_) | Delta::Content(_) => {}
            }
        }
        out
    }
}

impl Render for ResponseStream {
    fn start(&mut self) -> Vec<sse::Event> {
        let r = response(
            &self.meta,
            &self.echo,
            "in_progress",
            FinishReason::Stop,
            Vec::new(),
            None,
        );
        vec![
            self.event(json!({ "type": "response.created", "response": r })),
            self.event(json!({ "type": "response.in_progress", "response": r })),
        ]
    }

    fn text(&mut self, _: usize, text: &str, _: Vec<TokenLogprob>) -> Vec<sse::Event> {
        let deltas = match self.parser.as_mut() {
            Some(p) => p.push(text),
            None => vec![Delta::Content(text.to_string())],
        };
        self.deltas(deltas)
    }

    fn done(&mut self, _: usize, finish: FinishReason, _: Option<&str>) -> Vec<sse::Event> {
        let deltas = self.parser.as_mut().map(|p| p.finish()).unwrap_or_default();
        let mut out = self.deltas(deltas);
        self.close(&mut out);
        self.finish = finish;
        out
    }

    fn end(&mut self, usage: &Usage) -> Vec<sse::Event> {
        let items = std::mem::take(&mut self.items);
        let r = response(
            &self.meta,
            &self.echo,
            "completed",
            self.finish,
            items,
            Some(usage),
        );
        let kind = if r["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        vec![self.event(json!({ "type": kind, "response": r }))]
    }

    fn error(&mut self, err: &ApiError) -> Vec<sse::Event> {
        let e = json!({ "type": "error", "code": err.code.unwrap_or(err.kind),
            "message": err.message, "param": err.param });
        vec![self.event(e)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "resp-abc0001".into(),
            created: 1,
            model: "m".into(),
        }
    }

    #[test]
    fn input_items_gather_into_chat_turns() {
        let input = json!([
            {"role": "developer", "content": "Rules."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "Call."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{\"city\":\"Rome\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
            {"type": "function_call_output", "call_id": "c2", "output": "25 C"},
        ]);
        let m = messages(Some("Be brief."), &input).unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(
            roles,
            ["system", "system", "user", "assistant", "tool", "tool"]
        );
        assert_eq!(m[3]["content"], "Checking.");
        assert_eq!(m[3]["reasoning_content"], "Call.");
        assert_eq!(m[3]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(m[5]["tool_call_id"], "c2");
        assert!(messages(None, &json!([{"type": "input_image"}])).is_err());
    }

    #[test]
    fn a_reply_streams_as_output_items() {
        let mut s = ResponseStream {
            meta: meta(),
            echo: Echo::default(),
            parser: None,
            seq: 0,
            items: Vec::new(),
            open: None,
            finish: FinishReason::Stop,
        };
        let start = s.start();
        assert_eq!(start.len(), 2);
        s.deltas(vec![Delta::Reasoning("Think.".into())]);
        s.deltas(vec![
            Delta::Content("Check".into()),
            Delta::Content("ing.".into()),
        ]);
        s.deltas(vec![Delta::ToolCall(ToolCall {
            name: "w".into(),
            arguments: "{}".into(),
        })]);
        s.done(0, FinishReason::Stop, None);
        let kinds: Vec<&str> = s
            .items
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(s.items[0]["content"][0]["text"], "Think.");
        assert_eq!(s.items[1]["content"][0]["text"], "Checking.");
        assert_eq!(s.items[2]["call_id"], "call_abc0001_0");
        assert!(s.seq > 10);
        let items = output_items(
            &meta(),
            &Parsed {
                content: Some("x".into()),
                reasoning: None,
                tool_calls: Vec::new(),
            },
        );
        assert_eq!(items[0]["content"][0]["text"], "x");
    }
}
