//! Chat templates: the model's Jinja template from GGUF
//! (`tokenizer.chat_template`, or a file given to `coil serve
//! --chat-template`) rendered as transformers' `apply_chat_template`
//! renders it (see its `env` module for the Jinja2 compatibility), or ChatML when
//! the file has none.
//!
//! The template sees what transformers gives it: `messages` (an assistant
//! message's reasoning under `reasoning_content` and `thinking`, whichever
//! name the request used), `tools` (none when the request has none),
//! `documents` (none), `add_generation_prompt`, `bos_token`, `eos_token`,
//! and the request's `chat_template_kwargs` (`enable_thinking`, ...).

mod env;
pub mod python;
mod strftime;
pub mod tool_calls;

pub use env::Clock;

use coil::tokenizer::Tokenizer;
use coil_gguf::GgufFile;
use minijinja::{Environment, Error, Value};
use serde_json::Map;

/// ChatML, what llama.cpp falls back to.
pub const DEFAULT_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Names the template's context has already; `chat_template_kwargs` may
/// not replace them.
pub const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("the chat template does not compile: {0}")]
    Compile(String),
    #[error("the chat template failed{}{}: {detail}",
        line.map(|l| format!(" at template line {l}")).unwrap_or_default(),
        message.as_ref().map(|(i, role)| format!(" on messages[{i}] (role {role})")).unwrap_or_default())]
    Render {
        /// What went wrong (the template's own `raise_exception` text, or
        /// minijinja's error with the template line).
        detail: String,
        /// The template line that failed.
        line: Option<usize>,
        /// The first message whose presence makes the template fail: its
        /// index and role.
        message: Option<(usize, String)>,
    },
}

/// Conversations up to this long get the failing message named in a
/// template error.
const LOCATE_MAX_MESSAGES: usize = 256;

/// What a chat request gives the template besides its messages.
#[derive(Clone, Debug, Default)]
pub struct TemplateVars {
    /// Function definitions (`tools`), as the request has them.
    pub tools: Option<serde_json::Value>,
    /// Extra variables: `chat_template_kwargs`, `reasoning_effort`.
    pub kwargs: Map<String, serde_json::Value>,
}

impl TemplateVars {
    pub fn with_tools(tools: Option<serde_json::Value>) -> Self {
        TemplateVars {
            tools,
            ..Default::default()
        }
    }
}

pub struct ChatTemplate {
    env: Environment<'static>,
    /// Whether this is the model's own template (false: ChatML fallback).
    pub from_model: bool,
    pub bos_token: String,
    pub eos_token: String,
    /// Texts that end an assistant turn beyond the tokenizer's
    /// end-of-generation tokens (ChatML's `<|im_end|>` when the vocabulary
    /// has no such token).
    pub extra_stops: Vec<String>,
    /// How the model writes tool calls and reasoning, read from the
    /// template's text.
    pub output_format: tool_calls::OutputFormat,
    /// The Jinja text.
    pub source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("from_model", &self.from_model)
            .field("output_format", &self.output_format)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The template of a GGUF file (ChatML when it has none).
    pub fn from_gguf(file: &GgufFile, tokenizer: &Tokenizer) -> Result<Self, TemplateError> {
        let source = file.metadata().get_str("tokenizer.chat_template");
        Self::new(source, tokenizer)
    }

    /// `source`: the Jinja text, or `None` for ChatML.
    pub fn new(source: Option<&str>, tokenizer: &Tokenizer) -> Result<Self, TemplateError> {
        let text = |id: Option<u32>| {
            id.and_then(|i| tokenizer.token_text(i))
                .unwrap_or_default()
                .to_string()
        };
        let bos_token = text(tokenizer.bos_id());
        let eos_token = text(tokenizer.eos_id());
        let mut extra_stops = Vec::new();
        if source.is_none() && tokenizer.token_to_id("<|im_end|>").is_none() {
            extra_stops.push("<|im_end|>".to_string());
        }
        Self::from_source(source.unwrap_or(DEFAULT_TEMPLATE), bos_token, eos_token).map(|mut t| {
            t.from_model = source.is_some();
            t.extra_stops = extra_stops;
            t
        })
    }

    /// A template from its text, with the BOS/EOS texts it may refer to.
    pub fn from_source(
        source: &str,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, TemplateError> {
        let env =
            env::build(source, Clock::System).map_err(|e| TemplateError::Compile(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            from_model: true,
            bos_token,
            eos_token,
            extra_stops: Vec::new(),
            output_format: tool_calls::OutputFormat::detect(source),
            source: source.to_string(),
        })
    }

    /// Where `strftime_now` reads the time (the system clock by default).
    pub fn set_clock(&mut self, clock: Clock) {
        env::set_clock(&mut self.env, clock);
    }

    /// Renders `messages` (JSON objects with `role`, string `content` and
    /// maybe `tool_calls` with object `arguments`, `reasoning_content`),
    /// ending with the assistant's header when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        vars: &TemplateVars,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        match self.try_render(messages, vars, add_generation_prompt) {
            Ok(s) => Ok(s),
            Err(e) => Err(self.locate(e, messages, vars)),
        }
    }

    fn try_render(
        &self,
        messages: &[serde_json::Value],
        vars: &TemplateVars,
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let tmpl = self.env.get_template(env::NAME)?;
        let mut ctx = Map::new();
        for (k, v) in &vars.kwargs {
            if !RESERVED.contains(&k.as_str()) {
                ctx.insert(k.clone(), v.clone());
            }
        }
        ctx.entry("bos_token")
            .or_insert_with(|| self.bos_token.clone().into());
        ctx.entry("eos_token")
            .or_insert_with(|| self.eos_token.clone().into());
        let messages: Vec<serde_json::Value> = messages.iter().map(alias_reasoning).collect();
        ctx.insert("messages".into(), messages.into());
        ctx.insert(
            "tools".into(),
            vars.tools.clone().unwrap_or(serde_json::Value::Null),
        );
        ctx.insert("documents".into(), serde_json::Value::Null);
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        tmpl.render(Value::from_serialize(&ctx))
    }

    /// The error of a failed render, with the template line and the first
    /// message whose presence makes the template fail the same way.
    fn locate(
        &self,
        e: Error,
        messages: &[serde_json::Value],
        vars: &TemplateVars,
    ) -> TemplateError {
        let same = |other: &Error| other.kind() == e.kind() && other.detail() == e.detail();
        // Each try renders a prefix: bounded work on huge conversations.
        let n = if messages.len() <= LOCATE_MAX_MESSAGES {
            messages.len()
        } else {
            0
        };
        let message = (1..=n)
            .find(|&k| {
                self.try_render(&messages[..k], vars, false)
                    .is_err_and(|x| same(&x))
            })
            .map(|k| {
                let role = messages[k - 1]
                    .get("role")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("?");
                (k - 1, role.to_string())
            });
        TemplateError::Render {
            detail: describe(&e),
            line: e.line(),
            message,
        }
    }
}

/// transformers' `_alias_reasoning_fields`: an assistant message's
/// reasoning, under whichever of `reasoning_content`, `thinking`,
/// `reasoning` it came, is given to the template as `reasoning_content`
/// and `thinking` (templates read one or the other).
fn alias_reasoning(m: &serde_json::Value) -> serde_json::Value {
    let Some(obj) = m.as_object() else {
        return m.clone();
    };
    let reasoning = ["reasoning_content", "thinking", "reasoning"]
        .iter()
        .find_map(|k| obj.get(*k).filter(|v| !v.is_null()));
    let Some(r) = reasoning else {
        return m.clone();
    };
    let mut out = Map::new();
    out.insert("thinking".into(), r.clone());
    for (k, v) in obj {
        out.insert(k.clone(), v.clone());
    }
    out.insert("reasoning_content".into(), r.clone());
    serde_json::Value::Object(out)
}

fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chatml() -> ChatTemplate {
        ChatTemplate::from_source(DEFAULT_TEMPLATE, "<s>".into(), "</s>".into()).unwrap()
    }

    #[test]
    fn chatml_renders_turns_and_the_generation_prompt() {
        let msgs = [
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Hi"}),
        ];
        let s = chatml()
            .render(&msgs, &TemplateVars::default(), true)
            .unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let s = chatml()
            .render(&msgs[1..], &TemplateVars::default(), false)
            .unwrap();
        assert_eq!(s, "<|im_start|>user\nHi<|im_end|>\n");
    }

    /// A Hugging Face style template: trim/lstrip blocks, Python string
    /// methods, namespace, raise_exception, bos_token.
    #[test]
    fn hugging_face_templates_render() {
        let src = r#"{{ bos_token }}
{%- set ns = namespace(system='') %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'].strip() %}
{%- endif %}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('bad role ' + message['role']) }}
    {% endif %}
    {% if message['role'] != 'system' %}
<|{{ message['role'] }}|>{{ message['content'] | trim }}{{ '\n' }}
    {%- endif %}
{% endfor %}
{% if add_generation_prompt %}<|assistant|>{% endif %}"#;
        let t = ChatTemplate::from_source(src, "<s>".into(), "</s>".into()).unwrap();
        let msgs = [
            json!({"role": "system", "content": " sys "}),
            json!({"role": "user", "content": " a "}),
            json!({"role": "assistant", "content": "b"}),
        ];
        let s = t.render(&msgs, &TemplateVars::default(), true).unwrap();
        assert_eq!(s, "<s><|user|>a\n<|assistant|>b\n<|assistant|>");
        let err = t
            .render(
                &[json!({"role": "robot", "content": "x"})],
                &TemplateVars::default(),
                true,
            )
            .unwrap_err();
        assert!(err.to_string().contains("bad role robot"), "{err}");
        assert!(ChatTemplate::from_source("{% if %}", String::new(), String::new()).is_err());
    }

    #[test]
    fn tools_reach_the_template() {
        let src = "{% if tools %}[{% for t in tools %}{{ t['function']['name'] }}{% endfor %}] {{ tools | tojson }}{% endif %}{{ messages[-1]['content'] }}";
        let t = ChatTemplate::from_source(src, String::new(), String::new()).unwrap();
        let msgs = [json!({"role": "user", "content": "hi"})];
        let tools = json!([{"type": "function", "function": {"name": "get_time"}}]);
        let s = t
            .render(&msgs, &TemplateVars::with_tools(Some(tools)), true)
            .unwrap();
        assert!(s.starts_with("[get_time] [{"), "{s}");
        assert!(s.ends_with("hi"));
        assert_eq!(
            t.render(&msgs, &TemplateVars::default(), true).unwrap(),
            "hi"
        );
    }
}
