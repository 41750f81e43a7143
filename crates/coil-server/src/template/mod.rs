//! Chat templates: the model's Jinja template from GGUF
//! (`tokenizer.chat_template`) rendered with minijinja the way Hugging Face
//! renders it (trim_blocks, lstrip_blocks, Python string methods,
//! `raise_exception`, `strftime_now`), or ChatML when the file has none.

use coil::tokenizer::Tokenizer;
use coil_gguf::GgufFile;
use minijinja::{Environment, Error, ErrorKind, Value};

/// ChatML, what llama.cpp falls back to.
pub const DEFAULT_TEMPLATE: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("the chat template does not compile: {0}")]
    Compile(String),
    #[error("the chat template failed on these messages: {0}")]
    Render(String),
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
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("from_model", &self.from_model)
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
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| TemplateError::Compile(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            from_model: true,
            bos_token,
            eos_token,
            extra_stops: Vec::new(),
        })
    }

    /// Renders `messages` (JSON objects with `role` and string `content`),
    /// ending with the assistant's header when `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Renders with the request's `tools` (function definitions), for
    /// templates that describe them to the model.
    pub fn render_with_tools(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| TemplateError::Compile(describe(&e)))?;
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            tools => tools.map_or(Value::from(()), Value::from_serialize),
        };
        tmpl.render(ctx)
            .map_err(|e| TemplateError::Render(describe(&e)))
    }
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

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(format)` in UTC, for templates that print today's date
/// (`%Y %m %d %H %M %S %b %B %a %A %j %%` are understood).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(format.as_str(), secs)
}

fn strftime(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 → (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
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
        let s = chatml().render(&msgs, true).unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let s = chatml().render(&msgs[1..], false).unwrap();
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
        let s = t.render(&msgs, true).unwrap();
        assert_eq!(s, "<s><|user|>a\n<|assistant|>b\n<|assistant|>");
        let err = t
            .render(&[json!({"role": "robot", "content": "x"})], true)
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
        let s = t.render_with_tools(&msgs, Some(&tools), true).unwrap();
        assert!(s.starts_with("[get_time] [{"), "{s}");
        assert!(s.ends_with("hi"));
        assert_eq!(t.render(&msgs, true).unwrap(), "hi");
    }

    #[test]
    fn strftime_formats_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(
            strftime("%d %b %Y, %A (%j) %%", t),
            "29 Feb 2024, Thursday (060) %"
        );
        assert_eq!(civil_from_days(0), (1970, 1, 1));
    }
}
