//! OpenAI's request and response shapes for `/v1/completions` and
//! `/v1/chat/completions`, and its error body.
//!
//! Requests are parsed into typed structs (unknown fields are ignored, as
//! OpenAI-compatible servers do); responses are built as JSON values so
//! that their shape reads exactly as OpenAI documents it.

use crate::template::tool_calls::{Parsed, ToolCall};
use crate::template::{TemplateVars, RESERVED};
use coil::engine::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};

/// An error as OpenAI reports it: an HTTP status and
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    pub fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError {
            status: 404,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    pub fn server(message: impl Into<String>) -> Self {
        ApiError {
            status: 500,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            status: 503,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

/// `stop`: one string or a list.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `prompt` of a completion: text, a one-element list of text, or token ids.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling and generation fields shared by both endpoints, with OpenAI's
/// names; `top_k`, `min_p`, `repeat_penalty` and `ignore_eos` are
/// llama.cpp's extensions.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<u32>,
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
}

impl Sampling {
    /// The sampler settings: llama.cpp's server defaults where a field is
    /// absent (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05). A
    /// request without a seed draws one from the clock.
    pub fn params(&self) -> Result<SamplingParams, ApiError> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::bad_request(format!(
                    "n must be 1 (one choice per request), got {n}"
                ))
                .with_param("n"));
            }
        }
        let d = SamplingParams::default();
        let top_k = match self.top_k {
            None => d.top_k,
            Some(k) if k <= 0 => 0,
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        };
        let seed = match self.seed {
            Some(s) => s as u64,
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
        };
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k,
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            repeat_last_n: d.repeat_last_n,
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            seed,
        };
        if let Err(msg) = p.validate() {
            let param = [
                "temperature",
                "top_p",
                "min_p",
                "repeat_penalty",
                "presence_penalty",
                "frequency_penalty",
            ]
            .into_iter()
            .find(|name| msg.starts_with(name));
            let mut e = ApiError::bad_request(msg);
            e.param = param;
            return Err(e);
        }
        Ok(p)
    }

    pub fn stops(&self) -> Vec<String> {
        self.stop.clone().map(Stop::into_vec).unwrap_or_default()
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub sampling: Sampling,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    /// Kept as JSON: the template sees every field a message has
    /// (`content` is normalised to text first).
    pub messages: Vec<Value>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    /// Function definitions, passed to the chat template as `tools`.
    pub tools: Option<Value>,
    /// `"auto"` (the default) or `"none"` (tools stay in the prompt, the
    /// output is not read for tool calls).
    pub tool_choice: Option<Value>,
    /// Extra variables for the chat template (`enable_thinking`, ...).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Passed to the template as `reasoning_effort` (for templates that
    /// read it).
    pub reasoning_effort: Option<String>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// What `tool_choice` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
}

impl ChatRequest {
    /// `tool_choice`: `"auto"` or `"none"`; `"required"` and a named
    /// function need constrained decoding, which coil does not do.
    pub fn tool_choice(&self) -> Result<ToolChoice, ApiError> {
        let bad = |m: String| ApiError::bad_request(m).with_param("tool_choice");
        match &self.tool_choice {
            None | Some(Value::Null) => Ok(ToolChoice::Auto),
            Some(Value::String(s)) if s == "auto" => Ok(ToolChoice::Auto),
            Some(Value::String(s)) if s == "none" => Ok(ToolChoice::None),
            Some(Value::String(s)) if s == "required" => Err(bad(
                "tool_choice \"required\" is not supported (it needs constrained decoding); use \"auto\"".into(),
            )),
            Some(Value::Object(_)) => Err(bad(
                "tool_choice naming a function is not supported (it needs constrained decoding); use \"auto\"".into(),
            )),
            Some(other) => Err(bad(format!(
                "tool_choice must be \"auto\" or \"none\", got {other}"
            ))),
        }
    }

    /// The chat template's variables: `tools` (checked to be a list of
    /// objects), `chat_template_kwargs` and `reasoning_effort`.
    pub fn template_vars(&self) -> Result<TemplateVars, ApiError> {
        let tools = match &self.tools {
            None | Some(Value::Null) => None,
            Some(Value::Array(list)) => {
                if let Some(i) = list.iter().position(|t| !t.is_object()) {
                    return Err(ApiError::bad_request(format!(
                        "tools[{i}] must be an object ({{\"type\": \"function\", \"function\": {{...}}}})"
                    ))
                    .with_param("tools"));
                }
                Some(Value::Array(list.clone()))
            }
            Some(_) => {
                return Err(ApiError::bad_request("tools must be a list").with_param("tools"))
            }
        };
        let mut kwargs = self.chat_template_kwargs.clone().unwrap_or_default();
        if let Some(k) = kwargs.keys().find(|k| RESERVED.contains(&k.as_str())) {
            return Err(ApiError::bad_request(format!(
                "chat_template_kwargs.{k} cannot be set (the request gives it)"
            ))
            .with_param("chat_template_kwargs"));
        }
        if let Some(effort) = &self.reasoning_effort {
            kwargs
                .entry("reasoning_effort")
                .or_insert_with(|| Value::String(effort.clone()));
        }
        Ok(TemplateVars { tools, kwargs })
    }
}

/// Parses a request body; a syntax error and a wrong field read
/// differently.
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        use serde_json::error::Category;
        let msg = match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => {
                format!("the request body is not valid JSON: {e}")
            }
            Category::Data => format!("invalid request: {e}"),
        };
        ApiError::bad_request(msg)
    })
}

/// Checks chat messages and makes each `content` a string (text parts of a
/// list are joined; a missing or null content becomes empty).
pub fn normalise_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty").with_param("messages"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let Some(obj) = m.as_object() else {
            return Err(
                ApiError::bad_request(format!("messages[{i}] must be an object"))
                    .with_param("messages"),
            );
        };
        if !obj.get("role").is_some_and(Value::is_string) {
            return Err(ApiError::bad_request(format!(
                "messages[{i}].role must be a string (system, user, assistant or tool)"
            ))
            .with_param("messages"));
        }
        let content = match obj.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match p.get("type").and_then(Value::as_str) {
                        Some("text") => {
                            if let Some(t) = p.get("text").and_then(Value::as_str) {
                                text.push_str(t);
                            }
                        }
                        other => {
                            return Err(ApiError::bad_request(format!(
                            "messages[{i}]: content parts of type {} are not supported (text only)",
                            other.unwrap_or("(none)")
                        ))
                            .with_param("messages"))
                        }
                    }
                }
                text
            }
            Some(_) => {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}].content must be a string or a list of text parts"
                ))
                .with_param("messages"))
            }
        };
        let mut obj = obj.clone();
        obj.insert("content".into(), Value::String(content));
        if let Some(calls) = obj.get_mut("tool_calls") {
            parse_tool_call_arguments(i, calls)?;
        }
        out.push(Value::Object(obj));
    }
    Ok(out)
}

/// A tool call's `arguments` is a JSON text in OpenAI's API; templates
/// (and transformers) take the object it encodes.
fn parse_tool_call_arguments(i: usize, calls: &mut Value) -> Result<(), ApiError> {
    let bad = |m: String| ApiError::bad_request(m).with_param("messages");
    let list = match calls {
        Value::Null => return Ok(()),
        Value::Array(list) => list,
        _ => return Err(bad(format!("messages[{i}].tool_calls must be a list"))),
    };
    for (j, call) in list.iter_mut().enumerate() {
        let Some(call) = call.as_object_mut() else {
            return Err(bad(format!(
                "messages[{i}].tool_calls[{j}] must be an object"
            )));
        };
        let target = match call.get_mut("function") {
            Some(Value::Object(f)) => f,
            Some(_) => {
                return Err(bad(format!(
                    "messages[{i}].tool_calls[{j}].function must be an object"
                )))
            }
            None => call,
        };
        if let Some(args) = target.get_mut("arguments") {
            if let Value::String(text) = args {
                let parsed: Value = serde_json::from_str(text).map_err(|e| {
                    bad(format!(
                        "messages[{i}].tool_calls[{j}].function.arguments is not valid JSON: {e}"
                    ))
                })?;
                *args = parsed;
            }
        }
    }
    Ok(())
}

/// Why generation ended, as OpenAI names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens taken from the prefix cache (not processed).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Speculative decoding: draft tokens proposed, and accepted.
    pub draft_tokens: usize,
    pub accepted_draft_tokens: usize,
}

impl Usage {
    pub fn json(&self) -> Value {
        let mut v = json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": { "cached_tokens": self.cached_tokens },
        });
        if self.draft_tokens > 0 {
            // OpenAI's names for predicted tokens that were (not) used.
            v["completion_tokens_details"] = json!({
                "accepted_prediction_tokens": self.accepted_draft_tokens,
                "rejected_prediction_tokens": self.draft_tokens - self.accepted_draft_tokens,
            });
        }
        v
    }
}

/// Identifies one response: its id, creation time and model name.
#[derive(Clone, Debug)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

pub fn completion(meta: &ResponseMeta, text: &str, finish: FinishReason, usage: &Usage) -> Value {
    json!({
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{
            "text": text,
            "index": 0,
            "logprobs": null,
            "finish_reason": finish.as_str(),
        }],
        "usage": usage.json(),
    })
}

pub fn completion_chunk(meta: &ResponseMeta, text: &str, finish: Option<FinishReason>) -> Value {
    json!({
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{
            "text": text,
            "index": 0,
            "logprobs": null,
            "finish_reason": finish.map(FinishReason::as_str),
        }],
    })
}

/// An assistant message: `content` (null when the reply is only tool
/// calls), `reasoning_content` and `tool_calls` when there are some.
pub fn assistant_message(parsed: &Parsed, call_id: impl Fn(usize) -> String) -> Value {
    let mut m = json!({ "role": "assistant", "content": parsed.content });
    if parsed.content.is_none() && parsed.tool_calls.is_empty() {
        m["content"] = json!("");
    }
    if let Some(r) = &parsed.reasoning {
        m["reasoning_content"] = json!(r);
    }
    if !parsed.tool_calls.is_empty() {
        let calls: Vec<Value> = parsed
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| tool_call_json(c, &call_id(i), None))
            .collect();
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

/// One tool call as OpenAI writes it (`index` in stream deltas).
pub fn tool_call_json(call: &ToolCall, id: &str, index: Option<usize>) -> Value {
    let mut v = json!({
        "id": id,
        "type": "function",
        "function": { "name": call.name, "arguments": call.arguments },
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

/// `finish_reason` of a chat: `tool_calls` when the reply made some and
/// ended by itself.
pub fn chat_finish(finish: FinishReason, made_tool_calls: bool) -> &'static str {
    match finish {
        FinishReason::Stop if made_tool_calls => "tool_calls",
        f => f.as_str(),
    }
}

pub fn chat_completion(meta: &ResponseMeta, message: Value, finish: &str, usage: &Usage) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish,
        }],
        "usage": usage.json(),
    })
}

/// A chat stream chunk; `delta` is `{"role": "assistant", "content": ""}`
/// first, `{"content": text}`, `{"reasoning_content": text}` or
/// `{"tool_calls": [...]}` then, `{}` with the finish reason last.
pub fn chat_chunk(meta: &ResponseMeta, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish,
        }],
    })
}

/// The last chunk of a stream with `stream_options.include_usage`.
pub fn usage_chunk(meta: &ResponseMeta, object: &str, usage: &Usage) -> Value {
    json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage.json(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_openai_requests() {
        let r: CompletionRequest = parse_body(
            br#"{"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"stop":"\n","stream":true,"seed":-3,"top_k":-1}"#,
        )
        .unwrap();
        assert!(matches!(r.prompt, Prompt::Text(ref t) if t == "hi"));
        assert_eq!(r.max_tokens, Some(5));
        assert!(r.sampling.stream);
        assert_eq!(r.sampling.stops(), vec!["\n".to_string()]);
        let p = r.sampling.params().unwrap();
        assert_eq!(p.temperature, 0.0);
        assert_eq!(p.top_k, 0);
        let r: CompletionRequest = parse_body(br#"{"prompt":[1,2,3]}"#).unwrap();
        assert!(matches!(r.prompt, Prompt::Tokens(ref t) if t == &[1, 2, 3]));
        let r: ChatRequest = parse_body(
            br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"stop":["x","y"]}"#,
        )
        .unwrap();
        let m = normalise_messages(&r.messages).unwrap();
        assert_eq!(m[0]["content"], "ab");
        assert_eq!(r.sampling.stops().len(), 2);
    }

    #[test]
    fn bad_requests_name_the_problem() {
        let e = parse_body::<CompletionRequest>(b"{not json").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e =
            parse_body::<CompletionRequest>(br#"{"prompt":"x","temperature":"hot"}"#).unwrap_err();
        assert!(e.message.contains("invalid"), "{}", e.message);
        let r: CompletionRequest = parse_body(br#"{"prompt":"x","top_p":2}"#).unwrap();
        let e = r.sampling.params().unwrap_err();
        assert_eq!(e.param, Some("top_p"));
        let r: CompletionRequest = parse_body(br#"{"prompt":"x","n":3}"#).unwrap();
        assert_eq!(r.sampling.params().unwrap_err().param, Some("n"));
        assert!(normalise_messages(&[]).is_err());
        assert!(normalise_messages(&[json!({"content": "x"})]).is_err());
        let body = ApiError::bad_request("m").with_param("p").body();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "p");
    }
}
