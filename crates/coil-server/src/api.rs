//! OpenAI's request and response shapes for `/v1/completions` and
//! `/v1/chat/completions`, and its error body.
//!
//! Requests are parsed into typed structs after [`crate::fields`] checked
//! that every field is one coil implements or harmless metadata; responses
//! are built as JSON values so that their shape reads exactly as OpenAI
//! documents it.

use crate::request::ToolChoice;
use crate::template::tool_calls::{Parsed, ToolCall};
use coil::engine::constraint::{ConstraintError, ConstraintSpec};
use coil::engine::dry::{DryBreakers, DryParams, DEFAULT_BREAKERS};
use coil::engine::logprobs::TokenLogprob;
use coil::engine::sampling::{Mirostat, SamplingParams};
use coil::tokenizer::{EncodeOptions, Tokenizer};
use serde::Deserialize;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::sync::Arc;

/// An error as OpenAI reports it: an HTTP status and
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<Cow<'static, str>>,
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
        self.param = Some(Cow::Borrowed(param));
        self
    }

    /// [`ApiError::with_param`] for a name known only at run time.
    pub fn param_owned(mut self, param: &str) -> Self {
        self.param = Some(Cow::Owned(param.to_string()));
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
/// names; `top_k`, `min_p`, `repeat_penalty`, `repeat_last_n`,
/// `typical_p`, `top_n_sigma`, `xtc_*`, `dry_*`, `mirostat*` and
/// `ignore_eos` are llama-server's.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    /// -1: the whole context.
    pub repeat_last_n: Option<i64>,
    pub typical_p: Option<f32>,
    pub top_n_sigma: Option<f32>,
    pub xtc_probability: Option<f32>,
    pub xtc_threshold: Option<f32>,
    pub dry_multiplier: Option<f32>,
    pub dry_base: Option<f32>,
    pub dry_allowed_length: Option<u32>,
    /// -1: the whole context.
    pub dry_penalty_last_n: Option<i64>,
    pub dry_sequence_breakers: Option<Vec<String>>,
    /// 0, 1 or 2.
    pub mirostat: Option<u8>,
    pub mirostat_tau: Option<f32>,
    pub mirostat_eta: Option<f32>,
    /// `{"token id": bias}` (OpenAI), or llama-server's forms: a text key
    /// (each of its tokens), `[[id or text, bias], ...]`, `false` for a ban.
    pub logit_bias: Option<Value>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<u32>,
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
}

/// The fields of [`Sampling`], for [`crate::fields::check`].
pub const SAMPLING_FIELDS: &[&str] = &[
    "model",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "typical_p",
    "top_n_sigma",
    "xtc_probability",
    "xtc_threshold",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "logit_bias",
    "seed",
    "stop",
    "n",
    "ignore_eos",
    "stream",
    "stream_options",
];

/// What sampling needs of the server: its tokenizer (logit bias by text,
/// DRY's breakers), its context (`-1` windows) and DRY's default breakers,
/// looked up once.
pub struct SamplingContext<'a> {
    pub tokenizer: &'a Tokenizer,
    pub n_ctx: usize,
    pub default_breakers: &'a std::sync::OnceLock<Arc<DryBreakers>>,
}

/// A seed from the clock, for requests without one.
pub fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Sampling {
    /// The sampler settings: llama-server's defaults where a field is
    /// absent (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05). A
    /// request without a seed draws one from the clock.
    pub fn params(&self, cx: &SamplingContext) -> Result<SamplingParams, ApiError> {
        let d = SamplingParams::default();
        let top_k = match self.top_k {
            None => d.top_k,
            Some(k) if k <= 0 => 0,
            Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
        };
        let window = |v: Option<i64>, default: usize, name: &'static str| match v {
            None => Ok(default),
            Some(-1) => Ok(cx.n_ctx),
            Some(n) if n >= 0 => Ok(n as usize),
            Some(n) => Err(ApiError::bad_request(format!(
                "{name} must be ≥ 0 (or -1: the whole context), got {n}"
            ))
            .with_param(name)),
        };
        let mirostat = match self.mirostat.unwrap_or(0) {
            0 => Mirostat::Off,
            1 => Mirostat::V1,
            2 => Mirostat::V2,
            m => {
                return Err(
                    ApiError::bad_request(format!("mirostat must be 0, 1 or 2, got {m}"))
                        .with_param("mirostat"),
                )
            }
        };
        let dd = DryParams::default();
        let mut dry = DryParams {
            multiplier: self.dry_multiplier.unwrap_or(dd.multiplier),
            base: self.dry_base.unwrap_or(dd.base),
            allowed_length: self
                .dry_allowed_length
                .map_or(dd.allowed_length, |v| v as usize),
            penalty_last_n: window(
                self.dry_penalty_last_n,
                dd.penalty_last_n,
                "dry_penalty_last_n",
            )?,
            breakers: Arc::default(),
        };
        if dry.is_on() {
            dry.breakers = match &self.dry_sequence_breakers {
                None => cx
                    .default_breakers
                    .get_or_init(|| {
                        let texts: Vec<String> =
                            DEFAULT_BREAKERS.iter().map(|s| s.to_string()).collect();
                        Arc::new(DryBreakers::new(cx.tokenizer, &texts))
                    })
                    .clone(),
                Some(texts) => Arc::new(DryBreakers::new(cx.tokenizer, texts)),
            };
        }
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k,
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            repeat_last_n: window(self.repeat_last_n, d.repeat_last_n, "repeat_last_n")?,
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            typical_p: self.typical_p.unwrap_or(d.typical_p),
            top_n_sigma: self.top_n_sigma.unwrap_or(d.top_n_sigma),
            xtc_probability: self.xtc_probability.unwrap_or(d.xtc_probability),
            xtc_threshold: self.xtc_threshold.unwrap_or(d.xtc_threshold),
            dry,
            mirostat,
            mirostat_tau: self.mirostat_tau.unwrap_or(d.mirostat_tau),
            mirostat_eta: self.mirostat_eta.unwrap_or(d.mirostat_eta),
            logit_bias: match &self.logit_bias {
                Some(v) => logit_bias(v, cx.tokenizer)?,
                None => Vec::new(),
            },
            seed: self.seed.map_or_else(clock_seed, |s| s as u64),
        };
        check_params(&p)?;
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

    pub fn n(&self) -> usize {
        self.n.unwrap_or(1) as usize
    }
}

/// [`SamplingParams::validate`] as a 400 naming the field.
pub fn check_params(p: &SamplingParams) -> Result<(), ApiError> {
    p.validate().map_err(|msg| {
        let param = SAMPLING_FIELDS
            .iter()
            .copied()
            .filter(|name| msg.starts_with(name))
            .max_by_key(|name| name.len());
        let mut e = ApiError::bad_request(msg);
        e.param = param.map(Cow::Borrowed);
        e
    })
}

/// `logit_bias` in OpenAI's form (`{"15043": -100}`) or llama-server's
/// (text keys stand for their tokens; `[[id or text, bias], ...]`; `false`
/// bans). Biases add to logits.
pub fn logit_bias(v: &Value, tok: &Tokenizer) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::bad_request(m).with_param("logit_bias");
    let bias_of = |key: &str, b: &Value| match b {
        Value::Number(n) => n
            .as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| bad(format!("logit_bias[{key}] must be a number"))),
        Value::Bool(false) => Ok(f32::NEG_INFINITY),
        other => Err(bad(format!(
            "logit_bias[{key}] must be a number (or false to ban), got {other}"
        ))),
    };
    let tokens_of = |key: &Value| -> Result<Vec<u32>, ApiError> {
        match key {
            Value::Number(n) => n
                .as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .map(|t| vec![t])
                .ok_or_else(|| bad(format!("logit_bias: {n} is not a token id"))),
            Value::String(s) => match s.parse::<u32>() {
                Ok(t) => Ok(vec![t]),
                Err(_) => Ok(tok.encode_with(
                    s,
                    EncodeOptions {
                        add_special: false,
                        parse_special: false,
                    },
                )),
            },
            other => Err(bad(format!(
                "logit_bias keys must be token ids or text, got {other}"
            ))),
        }
    };
    let pairs: Vec<(Value, Value)> = match v {
        Value::Null => Vec::new(),
        Value::Object(m) => m
            .iter()
            .map(|(k, b)| (Value::String(k.clone()), b.clone()))
            .collect(),
        Value::Array(list) => list
            .iter()
            .map(|e| match e.as_array().map(Vec::as_slice) {
                Some([k, b]) => Ok((k.clone(), b.clone())),
                _ => Err(bad(format!(
                    "logit_bias entries must be [token, bias] pairs, got {e}"
                ))),
            })
            .collect::<Result<_, _>>()?,
        other => {
            return Err(bad(format!(
                "logit_bias must be an object of token ids to biases, got {other}"
            )))
        }
    };
    let mut out: Vec<(u32, f32)> = Vec::new();
    for (k, b) in pairs {
        let key = match &k {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let bias = bias_of(&key, &b)?;
        for t in tokens_of(&k)? {
            if (t as usize) >= tok.n_vocab() {
                return Err(bad(format!(
                    "logit_bias: token id {t} is outside the vocabulary of {}",
                    tok.n_vocab()
                )));
            }
            match out.iter_mut().find(|e| e.0 == t) {
                Some(e) => e.1 += bias,
                None => out.push((t, bias)),
            }
        }
    }
    Ok(out)
}

/// What the output must be: OpenAI's `response_format` (`text`,
/// `json_object`, `json_schema`), llama-server's `grammar` (GBNF) and
/// `json_schema` (a bare schema). At most one of them.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct OutputFields {
    pub response_format: Option<Value>,
    pub grammar: Option<String>,
    pub json_schema: Option<Value>,
}

impl OutputFields {
    /// The constraint these fields ask for (`None`: free text).
    pub fn spec(&self) -> Result<Option<OutputSpec>, ApiError> {
        let mut found: Vec<OutputSpec> = Vec::new();
        if let Some(rf) = &self.response_format {
            found.extend(response_format_spec(rf)?);
        }
        if let Some(g) = &self.grammar {
            found.push(OutputSpec::new(
                ConstraintSpec::Gbnf(g.clone()),
                "grammar",
                "",
            ));
        }
        if let Some(s) = &self.json_schema {
            found.push(OutputSpec::new(
                ConstraintSpec::JsonSchema(s.clone()),
                "json_schema",
                "json_schema",
            ));
        }
        if found.len() > 1 {
            let names: Vec<&str> = found.iter().map(|o| o.param).collect();
            return Err(ApiError::bad_request(format!(
                "only one of response_format, grammar and json_schema may constrain the output, got {}",
                names.join(" and ")
            ))
            .with_param(names[1]));
        }
        Ok(found.pop())
    }
}

/// `response_format`: `{"type": "text"}`, `{"type": "json_object"}`
/// (llama-server: with an optional `schema`) or `{"type": "json_schema",
/// "json_schema": {"name", "schema", "strict"}}`.
fn response_format_spec(rf: &Value) -> Result<Option<OutputSpec>, ApiError> {
    let bad = |m: String| ApiError::bad_request(m).with_param("response_format");
    if rf.is_null() {
        return Ok(None);
    }
    let Some(kind) = rf.get("type").and_then(Value::as_str) else {
        return Err(bad(
            "response_format must be an object with a \"type\" (text, json_object or json_schema)"
                .into(),
        ));
    };
    let spec = |s: ConstraintSpec, path: &str| Some(OutputSpec::new(s, "response_format", path));
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(match rf.get("schema") {
            Some(s) if !s.is_null() => spec(
                ConstraintSpec::JsonSchema(s.clone()),
                "response_format.schema",
            ),
            _ => spec(ConstraintSpec::JsonObject, "response_format"),
        }),
        "json_schema" => {
            let Some(js) = rf.get("json_schema").filter(|v| v.is_object()) else {
                return Err(bad(
                    "response_format.json_schema must be an object with a \"schema\"".into(),
                ));
            };
            match js.get("schema") {
                Some(s) if !s.is_null() => Ok(spec(
                    ConstraintSpec::JsonSchema(s.clone()),
                    "response_format.json_schema.schema",
                )),
                _ => Err(bad("response_format.json_schema.schema is required".into())),
            }
        }
        other => Err(bad(format!(
            "response_format.type must be text, json_object or json_schema, got {other:?}"
        ))),
    }
}

/// A constraint a request asks for, and which field asked (for errors).
#[derive(Clone, Debug, PartialEq)]
pub struct OutputSpec {
    pub spec: ConstraintSpec,
    /// The request field (`param` of an error).
    pub param: &'static str,
    /// Where a JSON schema sits in the request, prefixed to the path an
    /// error names.
    pub path: String,
}

impl OutputSpec {
    pub fn new(spec: ConstraintSpec, param: &'static str, path: &str) -> Self {
        OutputSpec {
            spec,
            param,
            path: path.to_string(),
        }
    }

    /// A compile error as a 400 naming the field (and the schema path).
    pub fn error(&self, e: ConstraintError) -> ApiError {
        let msg = match e {
            ConstraintError::Schema(m) if !self.path.is_empty() => {
                // `properties.a.type must ...` → `response_format.json_schema.schema.properties.a.type must ...`
                if m.starts_with("the schema ") {
                    m.replacen("the schema", &self.path, 1)
                } else if m.starts_with("invalid JSON schema") {
                    format!("{}: {m}", self.path)
                } else {
                    format!("{}.{m}", self.path)
                }
            }
            other => other.to_string(),
        };
        ApiError::bad_request(msg).with_param(self.param)
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub echo: bool,
    /// The top log-probabilities to report per token (0–20; 0: the
    /// sampled token's only).
    pub logprobs: Option<u32>,
    #[serde(flatten)]
    pub sampling: Sampling,
    #[serde(flatten)]
    pub output: OutputFields,
}

/// The fields a completion request may carry beyond [`SAMPLING_FIELDS`].
pub const COMPLETION_FIELDS: &[&str] = &[
    "prompt",
    "max_tokens",
    "echo",
    "logprobs",
    "response_format",
    "grammar",
    "json_schema",
];

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
    /// With a forced tool call: may the reply make several (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Extra variables for the chat template (`enable_thinking`, ...).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Passed to the template as `reasoning_effort` (for templates that
    /// read it).
    pub reasoning_effort: Option<String>,
    /// Report each token's log-probability.
    #[serde(default)]
    pub logprobs: bool,
    /// And the most likely alternatives' (0–20; needs `logprobs`).
    pub top_logprobs: Option<u32>,
    #[serde(flatten)]
    pub sampling: Sampling,
    #[serde(flatten)]
    pub output: OutputFields,
}

impl ChatRequest {
    /// The template's extra variables: `chat_template_kwargs`, and
    /// `reasoning_effort` (for templates that read it).
    pub fn kwargs(&self) -> serde_json::Map<String, Value> {
        let mut kwargs = self.chat_template_kwargs.clone().unwrap_or_default();
        if let Some(effort) = &self.reasoning_effort {
            kwargs
                .entry("reasoning_effort")
                .or_insert_with(|| Value::String(effort.clone()));
        }
        kwargs
    }

    /// The chat template's variables (`tools` checked, the extra ones).
    pub fn template_vars(&self) -> Result<crate::template::TemplateVars, ApiError> {
        crate::request::Chat {
            tools: self.tools.clone(),
            kwargs: self.kwargs(),
            ..Default::default()
        }
        .template_vars()
    }
}

/// The fields a chat request may carry beyond [`SAMPLING_FIELDS`].
pub const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "grammar",
    "json_schema",
    "chat_template_kwargs",
    "reasoning_effort",
    "logprobs",
    "top_logprobs",
];

/// Most alternatives per token `top_logprobs` may ask for (OpenAI's).
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// A count of top log-probabilities, checked.
pub fn top_logprobs(k: u32, param: &'static str) -> Result<usize, ApiError> {
    if k > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad_request(format!(
            "{param} must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"
        ))
        .with_param(param));
    }
    Ok(k as usize)
}

/// `tool_choice` in OpenAI's shape: `"auto"`, `"none"`, `"required"` or
/// `{"type": "function", "function": {"name": ...}}` (the Responses API's
/// `{"type": "function", "name": ...}` too); the last two force a tool
/// call (see [`crate::structured`]).
pub fn tool_choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let bad = |m: String| ApiError::bad_request(m).with_param("tool_choice");
    match v {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) if s == "auto" => Ok(ToolChoice::Auto),
        Some(Value::String(s)) if s == "none" => Ok(ToolChoice::None),
        Some(Value::String(s)) if s == "required" => Ok(ToolChoice::Required),
        Some(v @ Value::Object(_)) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| v.get("name"))
                .and_then(Value::as_str);
            match name {
                Some(n) => Ok(ToolChoice::Function(n.to_string())),
                None => Err(bad(format!(
                    "tool_choice must name a function as {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {v}"
                ))),
            }
        }
        Some(other) => Err(bad(format!(
            "tool_choice must be \"auto\", \"none\", \"required\" or name a function, got {other}"
        ))),
    }
}

/// `parallel_tool_calls`: whether a reply may make several calls; `false`
/// is enforced where a tool call is forced (exactly one), and refused
/// otherwise (a free reply is not constrained to one call). Returns
/// whether the reply must make exactly one call.
pub fn parallel_tool_calls(v: Option<bool>, choice: &ToolChoice) -> Result<bool, ApiError> {
    match (v, choice.forces()) {
        (Some(false), true) => Ok(true),
        (Some(false), false) => Err(ApiError::bad_request(
            "parallel_tool_calls false needs a tool_choice that requires a call (\"required\" or a named function); with \"auto\" a reply may make several calls",
        )
        .with_param("parallel_tool_calls")),
        _ => Ok(false),
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

/// One choice of a completion (a whole one, or a stream chunk's).
pub fn completion_choice(
    index: usize,
    text: &str,
    finish: Option<FinishReason>,
    logprobs: Value,
) -> Value {
    json!({
        "text": text,
        "index": index,
        "logprobs": logprobs,
        "finish_reason": finish.map(FinishReason::as_str),
    })
}

/// A `text_completion` of `choices` (whole, with `usage`, or a stream
/// chunk, without).
pub fn completion(meta: &ResponseMeta, choices: Vec<Value>, usage: Option<&Usage>) -> Value {
    let mut v = json!({
        "id": meta.id,
        "object": "text_completion",
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
    });
    if let Some(u) = usage {
        v["usage"] = u.json();
    }
    v
}

/// A token's text (control tokens by name) for `logprobs`, and its bytes.
fn token_text(tok: &Tokenizer, t: u32) -> (String, Vec<u8>) {
    let b = tok.token_to_bytes_with(t, true).to_vec();
    (String::from_utf8_lossy(&b).into_owned(), b)
}

/// Chat's `logprobs`: `{"content": [{token, logprob, bytes,
/// top_logprobs: [{token, logprob, bytes}]}], "refusal": null}`.
pub fn chat_logprobs(tok: &Tokenizer, lps: &[TokenLogprob]) -> Value {
    let entry = |t: u32, lp: f32| {
        let (text, bytes) = token_text(tok, t);
        json!({ "token": text, "logprob": lp, "bytes": bytes })
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let mut e = entry(l.token, l.logprob);
            e["top_logprobs"] = l.top.iter().map(|&(t, lp)| entry(t, lp)).collect();
            e
        })
        .collect();
    json!({ "content": content, "refusal": null })
}

/// Completions' `logprobs`: `tokens`, `token_logprobs`, `top_logprobs`
/// (token text → logprob) and `text_offset` (each token's start in the
/// text, from `offset`).
pub fn completion_logprobs(tok: &Tokenizer, lps: &[TokenLogprob], offset: usize) -> Value {
    let mut at = offset;
    let (mut tokens, mut values, mut tops, mut offsets) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for l in lps {
        let (text, _) = token_text(tok, l.token);
        offsets.push(at);
        at += text.len();
        tokens.push(text);
        values.push(l.logprob);
        let top: serde_json::Map<String, Value> = l
            .top
            .iter()
            .map(|&(t, lp)| (token_text(tok, t).0, json!(lp)))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": tops,
        "text_offset": offsets,
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

/// One choice of a whole chat completion.
pub fn chat_choice(index: usize, message: Value, finish: &str, logprobs: Value) -> Value {
    json!({
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish,
    })
}

pub fn chat_completion(meta: &ResponseMeta, choices: Vec<Value>, usage: &Usage) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion",
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": usage.json(),
    })
}

/// A chat stream chunk for choice `index`; `delta` is `{"role":
/// "assistant", "content": ""}` first, `{"content": text}`,
/// `{"reasoning_content": text}` or `{"tool_calls": [...]}` then, `{}`
/// with the finish reason last.
pub fn chat_chunk(
    meta: &ResponseMeta,
    index: usize,
    delta: Value,
    finish: Option<&str>,
    logprobs: Value,
) -> Value {
    json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "choices": [{
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
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
    use coil::tokenizer::Vocab;
    use std::sync::OnceLock;

    fn tokenizer() -> Tokenizer {
        let tokens = ["a", "b", "h", "i", "x", "\n"].map(String::from).to_vec();
        Tokenizer::new(Vocab::bpe(tokens, Vec::new(), None)).unwrap()
    }

    fn params(s: &Sampling) -> Result<SamplingParams, ApiError> {
        let tok = tokenizer();
        let breakers = OnceLock::new();
        s.params(&SamplingContext {
            tokenizer: &tok,
            n_ctx: 100,
            default_breakers: &breakers,
        })
    }

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
        let p = params(&r.sampling).unwrap();
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
    fn llama_server_samplers_and_logit_bias_are_read() {
        let r: CompletionRequest = parse_body(
            br#"{"prompt":"x","typical_p":0.9,"top_n_sigma":1.5,"xtc_probability":0.5,"xtc_threshold":0.2,
                "dry_multiplier":0.8,"dry_base":2,"dry_allowed_length":3,"dry_penalty_last_n":-1,
                "mirostat":2,"mirostat_tau":4,"mirostat_eta":0.2,"repeat_last_n":-1,
                "logit_bias":{"1":-100,"ab":2,"4":false}}"#,
        )
        .unwrap();
        let p = params(&r.sampling).unwrap();
        assert_eq!(p.typical_p, 0.9);
        assert_eq!(p.top_n_sigma, 1.5);
        assert_eq!((p.xtc_probability, p.xtc_threshold), (0.5, 0.2));
        assert_eq!(p.dry.multiplier, 0.8);
        assert_eq!(p.dry.base, 2.0);
        assert_eq!(p.dry.allowed_length, 3);
        // -1: the whole context
        assert_eq!(p.dry.penalty_last_n, 100);
        assert_eq!(p.repeat_last_n, 100);
        assert_eq!(p.dry.breakers.texts().len(), 4);
        assert_eq!(p.mirostat, Mirostat::V2);
        assert_eq!((p.mirostat_tau, p.mirostat_eta), (4.0, 0.2));
        let mut bias = p.logit_bias.clone();
        bias.sort_by_key(|b| b.0);
        // "ab" is tokens 0 and 1: token 1 gets -100 + 2
        assert_eq!(bias, vec![(0, 2.0), (1, -98.0), (4, f32::NEG_INFINITY)]);
        // llama-server's list form
        let r: CompletionRequest =
            parse_body(br#"{"prompt":"x","logit_bias":[[2, 1.5], ["x", -1]]}"#).unwrap();
        assert_eq!(
            params(&r.sampling).unwrap().logit_bias,
            vec![(2, 1.5), (4, -1.0)]
        );
    }

    #[test]
    fn bad_requests_name_the_problem() {
        let e = parse_body::<CompletionRequest>(b"{not json").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e =
            parse_body::<CompletionRequest>(br#"{"prompt":"x","temperature":"hot"}"#).unwrap_err();
        assert!(e.message.contains("invalid"), "{}", e.message);
        let bad = |body: &[u8], param: &str| {
            let r: CompletionRequest = parse_body(body).unwrap();
            let e = params(&r.sampling).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        };
        bad(br#"{"prompt":"x","top_p":2}"#, "top_p");
        bad(
            br#"{"prompt":"x","dry_multiplier":1,"dry_base":0.5}"#,
            "dry_base",
        );
        bad(br#"{"prompt":"x","xtc_threshold":3}"#, "xtc_threshold");
        bad(br#"{"prompt":"x","mirostat":3}"#, "mirostat");
        bad(br#"{"prompt":"x","repeat_last_n":-2}"#, "repeat_last_n");
        bad(br#"{"prompt":"x","logit_bias":{"99":1}}"#, "logit_bias");
        bad(br#"{"prompt":"x","logit_bias":{"1":"x"}}"#, "logit_bias");
        assert!(top_logprobs(21, "top_logprobs").is_err());
        assert_eq!(
            tool_choice(Some(&json!("required"))).unwrap(),
            ToolChoice::Required
        );
        assert!(tool_choice(Some(&json!({"type": "function"}))).is_err());
        assert!(tool_choice(Some(&json!(3))).is_err());
        let f = |v: Value| OutputFields {
            response_format: Some(v),
            ..Default::default()
        };
        assert!(f(json!({"type": "text"})).spec().unwrap().is_none());
        assert!(f(json!({"type": "json_object"})).spec().unwrap().is_some());
        assert!(f(json!({"type": "xml"})).spec().is_err());
        assert!(f(json!({"type": "json_schema", "json_schema": {}}))
            .spec()
            .is_err());
        assert!(normalise_messages(&[]).is_err());
        assert!(normalise_messages(&[json!({"content": "x"})]).is_err());
        let body = ApiError::bad_request("m").with_param("p").body();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "p");
    }
}
