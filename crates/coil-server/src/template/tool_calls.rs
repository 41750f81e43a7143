//! Tool calls and reasoning in a model's output, in its family's format,
//! turned into OpenAI's `tool_calls` and `reasoning_content`.
//!
//! Formats (known from the chat template's text, see [`OutputFormat`]):
//! - `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`: Qwen2.5,
//!   Qwen3, QwQ, Granite 4 (Hermes style);
//! - `<tool_call><function=NAME><parameter=P>value</parameter></function>
//!   </tool_call>`: Qwen3-Coder, Qwen3.5, Nemotron 3 (values typed by the
//!   tool's JSON schema);
//! - `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`: Granite 3;
//! - `<TOOLCALL>[{"name": ..., "arguments": {...}}, ...]</TOOLCALL>`:
//!   Nemotron Nano v2;
//! - `<|tool_call_start|>[name(arg="value", n=1), ...]<|tool_call_end|>`:
//!   LFM2 / LFM2.5 (Python call syntax);
//! - `<think>…</think>` reasoning, for templates that write it (the prompt
//!   may already have opened the block: see [`StreamParser::new`]).
//!
//! One incremental parser serves streamed and whole responses: text goes
//! in as it is generated, [`Delta`]s come out; text that may be the start
//! of a marker is held back until it is known not to be.

use serde_json::{Map, Value};

/// How a model writes tool calls, known from its template's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    /// The template shows no tool-call format: output stays text.
    None,
    /// `<tool_call>` … `</tool_call>` around JSON or `<function=…>` XML.
    ToolCallTag,
    /// The same tags, the template writing `<function=…>` XML in them.
    ToolCallXml,
    /// Granite 3: `<|tool_call|>` then a JSON list to the end.
    Granite3,
    /// Nemotron Nano v2: `<TOOLCALL>[…]</TOOLCALL>`.
    NemotronV2,
    /// LFM2: `<|tool_call_start|>[f(a=1)]<|tool_call_end|>`.
    Lfm2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputFormat {
    pub tools: ToolSyntax,
    /// The template writes (or strips) `<think>` blocks.
    pub think: bool,
}

impl OutputFormat {
    /// Reads the formats a template describes to (or writes for) its model.
    pub fn detect(source: &str) -> Self {
        let tools = if source.contains("<|tool_call_start|>") || source.contains("List of tools:") {
            ToolSyntax::Lfm2
        } else if source.contains("<TOOLCALL>") {
            ToolSyntax::NemotronV2
        } else if source.contains("<|tool_call|>") {
            ToolSyntax::Granite3
        } else if source.contains("<tool_call>") && source.contains("<function=") {
            ToolSyntax::ToolCallXml
        } else if source.contains("<tool_call>") {
            ToolSyntax::ToolCallTag
        } else {
            ToolSyntax::None
        };
        OutputFormat {
            tools,
            think: source.contains(THINK_OPEN) || source.contains(THINK_CLOSE),
        }
    }

    /// Markers opening and closing a tool-call block (`None`: the block
    /// runs to the end of the output).
    fn tool_markers(self) -> Option<(&'static str, Option<&'static str>)> {
        match self.tools {
            ToolSyntax::None => None,
            ToolSyntax::ToolCallTag | ToolSyntax::ToolCallXml => {
                Some(("<tool_call>", Some("</tool_call>")))
            }
            ToolSyntax::Granite3 => Some(("<|tool_call|>", None)),
            ToolSyntax::NemotronV2 => Some(("<TOOLCALL>", Some("</TOOLCALL>"))),
            ToolSyntax::Lfm2 => Some(("<|tool_call_start|>", Some("<|tool_call_end|>"))),
        }
    }
}

/// One function call, with its arguments as JSON text (OpenAI's form).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// A piece of the response.
#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    Content(String),
    Reasoning(String),
    ToolCall(ToolCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Content,
    Reasoning,
    Tool,
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// The incremental parser: `push` generated text, then `finish`.
#[derive(Clone, Debug)]
pub struct StreamParser {
    format: OutputFormat,
    /// Read tool calls (the request has tools and tool_choice is not none).
    parse_tools: bool,
    /// Parameter types of the request's tools, for the XML format.
    schemas: Map<String, Value>,
    mode: Mode,
    buf: String,
    /// Whitespace not yet emitted (dropped when a block follows).
    pending_ws: String,
    /// Drop whitespace at the start of the next content or reasoning.
    skip_leading_ws: bool,
    /// The whitespace before an open tool-call block (back in the text if
    /// the block is not a tool call).
    ws_before_block: String,
}

impl StreamParser {
    /// `prompt`: the rendered prompt; when its generation prompt opened a
    /// `<think>` block the output starts inside it. `tools`: the request's
    /// tools when tool calls are to be read.
    pub fn new(format: OutputFormat, prompt: &str, tools: Option<&Value>) -> Self {
        let in_think = opens_think(format, prompt);
        let mut schemas = Map::new();
        for t in tools.and_then(Value::as_array).into_iter().flatten() {
            let f = t.get("function").unwrap_or(t);
            if let (Some(name), Some(params)) = (
                f.get("name").and_then(Value::as_str),
                f.get("parameters").and_then(|p| p.get("properties")),
            ) {
                schemas.insert(name.to_string(), params.clone());
            }
        }
        StreamParser {
            format,
            parse_tools: tools.is_some() && format.tool_markers().is_some(),
            schemas,
            mode: if in_think {
                Mode::Reasoning
            } else {
                Mode::Content
            },
            buf: String::new(),
            pending_ws: String::new(),
            skip_leading_ws: in_think,
            ws_before_block: String::new(),
        }
    }

    /// Whether this parser changes the text at all (otherwise responses
    /// are the raw text).
    pub fn is_active(&self) -> bool {
        self.parse_tools || self.format.think
    }

    /// Feeds generated text; returns what is now certain.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.drain(&mut out, false);
        out
    }

    /// The end of the output: flushes what was held back.
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        self.drain(&mut out, true);
        out
    }

    fn drain(&mut self, out: &mut Vec<Delta>, end: bool) {
        loop {
            match self.mode {
                Mode::Content => {
                    let mut markers: Vec<&str> = Vec::new();
                    if self.format.think {
                        markers.push(THINK_OPEN);
                    }
                    if self.parse_tools {
                        if let Some((open, _)) = self.format.tool_markers() {
                            markers.push(open);
                        }
                    }
                    match find_first(&self.buf, &markers) {
                        Some((at, marker)) => {
                            let before = self.buf[..at].to_string();
                            self.emit_text(out, &before, Mode::Content, true);
                            self.ws_before_block = std::mem::take(&mut self.pending_ws);
                            self.buf.drain(..at + marker.len());
                            if marker == THINK_OPEN {
                                self.mode = Mode::Reasoning;
                                self.skip_leading_ws = true;
                            } else {
                                self.mode = Mode::Tool;
                            }
                        }
                        None => {
                            let keep = if end {
                                0
                            } else {
                                partial_suffix(&self.buf, &markers)
                            };
                            let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                            self.emit_text(out, &text, Mode::Content, end);
                            if end {
                                let ws = std::mem::take(&mut self.pending_ws);
                                if !ws.is_empty() {
                                    out.push(Delta::Content(ws));
                                }
                            }
                            return;
                        }
                    }
                }
                Mode::Reasoning => match self.buf.find(THINK_CLOSE) {
                    Some(at) => {
                        let before = self.buf[..at].to_string();
                        self.emit_text(out, &before, Mode::Reasoning, true);
                        self.pending_ws.clear();
                        self.buf.drain(..at + THINK_CLOSE.len());
                        self.mode = Mode::Content;
                        self.skip_leading_ws = true;
                    }
                    None => {
                        let keep = if end {
                            0
                        } else {
                            partial_suffix(&self.buf, &[THINK_CLOSE])
                        };
                        let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.emit_text(out, &text, Mode::Reasoning, end);
                        if end {
                            self.pending_ws.clear();
                        }
                        return;
                    }
                },
                Mode::Tool => {
                    let Some((open, close)) = self.format.tool_markers() else {
                        self.mode = Mode::Content;
                        continue;
                    };
                    let found = close.and_then(|c| self.buf.find(c).map(|at| (at, c.len())));
                    let (body, consumed) = match (found, end) {
                        (Some((at, n)), _) => (self.buf[..at].to_string(), at + n),
                        (None, true) => (self.buf.clone(), self.buf.len()),
                        (None, false) => return,
                    };
                    let ws = std::mem::take(&mut self.ws_before_block);
                    match self.parse_block(&body) {
                        Some(calls) => {
                            out.extend(calls.into_iter().map(Delta::ToolCall));
                            self.skip_leading_ws = true;
                        }
                        // Not a tool call after all: the text stays.
                        None => {
                            let raw = format!("{ws}{open}{}", &self.buf[..consumed]);
                            out.push(Delta::Content(raw));
                        }
                    }
                    self.buf.drain(..consumed);
                    self.mode = Mode::Content;
                }
            }
        }
    }

    /// Emits `text` as content or reasoning, dropping leading whitespace
    /// after a block and holding trailing whitespace back (`last`: nothing
    /// of this span follows, so held whitespace is dropped by the caller).
    fn emit_text(&mut self, out: &mut Vec<Delta>, text: &str, mode: Mode, last: bool) {
        let mut text = text;
        if self.skip_leading_ws {
            let t = text.trim_start();
            if t.is_empty() && !last {
                return;
            }
            text = t;
            self.skip_leading_ws = false;
        }
        if text.is_empty() {
            return;
        }
        let body = text.trim_end();
        if body.is_empty() {
            self.pending_ws.push_str(text);
            return;
        }
        let mut piece = std::mem::take(&mut self.pending_ws);
        piece.push_str(body);
        self.pending_ws.push_str(&text[body.len()..]);
        out.push(match mode {
            Mode::Reasoning => Delta::Reasoning(piece),
            _ => Delta::Content(piece),
        });
    }

    /// The calls in one tool-call block, or `None` when it is not one.
    fn parse_block(&self, body: &str) -> Option<Vec<ToolCall>> {
        let body = body.trim();
        match self.format.tools {
            ToolSyntax::None => None,
            ToolSyntax::ToolCallTag | ToolSyntax::ToolCallXml => {
                if body.starts_with("<function=") {
                    parse_xml_call(body, &self.schemas).map(|c| vec![c])
                } else {
                    let v: Value = serde_json::from_str(body).ok()?;
                    json_call(&v).map(|c| vec![c])
                }
            }
            ToolSyntax::Granite3 | ToolSyntax::NemotronV2 => {
                let v: Value = serde_json::from_str(body).ok()?;
                match v {
                    Value::Array(items) => items.iter().map(json_call).collect(),
                    other => json_call(&other).map(|c| vec![c]),
                }
            }
            ToolSyntax::Lfm2 => parse_python_calls(body),
        }
    }
}

/// Whether the prompt's generation prompt opened a `<think>` block (the
/// output starts inside it).
pub fn opens_think(format: OutputFormat, prompt: &str) -> bool {
    format.think
        && prompt
            .rfind(THINK_OPEN)
            .is_some_and(|o| prompt.rfind(THINK_CLOSE).is_none_or(|c| c < o))
}

/// The first of `markers` in `s`: its byte offset and the marker.
fn find_first<'a>(s: &str, markers: &[&'a str]) -> Option<(usize, &'a str)> {
    markers
        .iter()
        .filter_map(|m| s.find(m).map(|at| (at, *m)))
        .min_by_key(|(at, _)| *at)
}

/// How many bytes at the end of `s` may begin one of `markers`.
fn partial_suffix(s: &str, markers: &[&str]) -> usize {
    let mut keep = 0;
    for m in markers {
        for n in (1..m.len()).rev() {
            if n <= s.len() && s.is_char_boundary(s.len() - n) && m.starts_with(&s[s.len() - n..]) {
                keep = keep.max(n);
                break;
            }
        }
    }
    keep
}

/// `{"name": ..., "arguments": {...}}` (arguments may be JSON text; also
/// `parameters` for `arguments`).
fn json_call(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or(Value::Object(Map::new()));
    let arguments = match args {
        Value::String(s) => {
            // Keep it when it is JSON text already; otherwise encode it.
            match serde_json::from_str::<Value>(&s) {
                Ok(_) => s,
                Err(_) => serde_json::to_string(&Value::String(s)).ok()?,
            }
        }
        other => serde_json::to_string(&other).ok()?,
    };
    Some(ToolCall { name, arguments })
}

/// `<function=NAME>` then `<parameter=P>\nVALUE\n</parameter>` pairs and
/// `</function>`; a value is a string where the tool's schema says so (or
/// it is not JSON), else the JSON it spells.
fn parse_xml_call(body: &str, schemas: &Map<String, Value>) -> Option<ToolCall> {
    let rest = body.strip_prefix("<function=")?;
    let close = rest.find('>')?;
    let name = rest[..close].trim().to_string();
    let mut rest = &rest[close + 1..];
    let props = schemas.get(&name);
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() || rest.starts_with("</function>") {
            break;
        }
        let r = rest.strip_prefix("<parameter=")?;
        let close = r.find('>')?;
        let pname = r[..close].trim().to_string();
        let r = &r[close + 1..];
        let end = r.find("</parameter>")?;
        let mut value = &r[..end];
        value = value.strip_prefix('\n').unwrap_or(value);
        value = value.strip_suffix('\n').unwrap_or(value);
        let ty = props
            .and_then(|p| p.get(&pname))
            .and_then(|s| s.get("type"));
        let is_string = match ty {
            Some(Value::String(t)) => t == "string",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "string") && ts.len() == 1,
            _ => false,
        };
        let v = if is_string {
            Value::String(value.to_string())
        } else {
            serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()))
        };
        args.insert(pname, v);
        rest = &r[end + "</parameter>".len()..];
    }
    Some(ToolCall {
        name,
        arguments: serde_json::to_string(&Value::Object(args)).ok()?,
    })
}

/// `[f(a="x", b=1), g()]` (or one call without the brackets).
fn parse_python_calls(body: &str) -> Option<Vec<ToolCall>> {
    let mut p = PyParser {
        s: body.as_bytes(),
        i: 0,
    };
    p.ws();
    let bracketed = p.eat(b'[');
    let mut calls = Vec::new();
    loop {
        p.ws();
        if bracketed && p.eat(b']') {
            break;
        }
        if !bracketed && p.i >= p.s.len() {
            break;
        }
        if !calls.is_empty() && !p.eat(b',') {
            if bracketed {
                return None;
            }
            break;
        }
        p.ws();
        let name = p.ident()?;
        p.ws();
        if !p.eat(b'(') {
            return None;
        }
        let mut args = Map::new();
        loop {
            p.ws();
            if p.eat(b')') {
                break;
            }
            if !args.is_empty() {
                if !p.eat(b',') {
                    return None;
                }
                p.ws();
                if p.eat(b')') {
                    break;
                }
            }
            let key = p.ident()?;
            p.ws();
            if !p.eat(b'=') {
                return None;
            }
            let v = p.literal()?;
            args.insert(key, v);
        }
        calls.push(ToolCall {
            name,
            arguments: serde_json::to_string(&Value::Object(args)).ok()?,
        });
    }
    p.ws();
    (p.i == p.s.len() && !calls.is_empty()).then_some(calls)
}

/// A small reader of Python literals (strings, numbers, True / False /
/// None, lists, dicts) and identifiers.
struct PyParser<'a> {
    s: &'a [u8],
    i: usize,
}

impl PyParser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Option<String> {
        let start = self.i;
        while self.i < self.s.len()
            && (self.s[self.i].is_ascii_alphanumeric()
                || matches!(self.s[self.i], b'_' | b'.' | b'-'))
        {
            self.i += 1;
        }
        (self.i > start).then(|| String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn literal(&mut self) -> Option<Value> {
        self.ws();
        match *self.s.get(self.i)? {
            q @ (b'"' | b'\'') => self.string(q).map(Value::String),
            b'[' | b'(' => {
                let close = if self.s[self.i] == b'[' { b']' } else { b')' };
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    self.ws();
                    if self.eat(close) {
                        return Some(Value::Array(items));
                    }
                    if !items.is_empty() {
                        if !self.eat(b',') {
                            return None;
                        }
                        self.ws();
                        if self.eat(close) {
                            return Some(Value::Array(items));
                        }
                    }
                    items.push(self.literal()?);
                }
            }
            b'{' => {
                self.i += 1;
                let mut map = Map::new();
                loop {
                    self.ws();
                    if self.eat(b'}') {
                        return Some(Value::Object(map));
                    }
                    if !map.is_empty() {
                        if !self.eat(b',') {
                            return None;
                        }
                        self.ws();
                        if self.eat(b'}') {
                            return Some(Value::Object(map));
                        }
                    }
                    let key = match self.literal()? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    self.ws();
                    if !self.eat(b':') {
                        return None;
                    }
                    let v = self.literal()?;
                    map.insert(key, v);
                }
            }
            _ => {
                let start = self.i;
                while self.i < self.s.len()
                    && !matches!(self.s[self.i], b',' | b')' | b']' | b'}' | b':')
                    && !self.s[self.i].is_ascii_whitespace()
                {
                    self.i += 1;
                }
                let word = std::str::from_utf8(&self.s[start..self.i]).ok()?;
                match word {
                    "True" | "true" => Some(Value::Bool(true)),
                    "False" | "false" => Some(Value::Bool(false)),
                    "None" | "null" => Some(Value::Null),
                    w => serde_json::from_str::<serde_json::Number>(w)
                        .ok()
                        .map(Value::Number),
                }
            }
        }
    }

    /// A quoted string with Python's common escapes.
    fn string(&mut self, quote: u8) -> Option<String> {
        self.i += 1;
        let mut out = Vec::new();
        while self.i < self.s.len() {
            let c = self.s[self.i];
            self.i += 1;
            if c == quote {
                return String::from_utf8(out).ok();
            }
            if c == b'\\' {
                let e = *self.s.get(self.i)?;
                self.i += 1;
                match e {
                    b'n' => out.push(b'\n'),
                    b't' => out.push(b'\t'),
                    b'r' => out.push(b'\r'),
                    b'u' => {
                        let hex = std::str::from_utf8(self.s.get(self.i..self.i + 4)?).ok()?;
                        let ch = char::from_u32(u32::from_str_radix(hex, 16).ok()?)?;
                        self.i += 4;
                        let mut b = [0u8; 4];
                        out.extend_from_slice(ch.encode_utf8(&mut b).as_bytes());
                    }
                    other => out.push(other),
                }
            } else {
                out.push(c);
            }
        }
        None
    }
}

/// A whole response: content (`None` when empty), reasoning and calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed {
    pub content: Option<String>,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

/// Collects the deltas of a whole response.
pub fn collect(deltas: impl IntoIterator<Item = Delta>) -> Parsed {
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut tool_calls = Vec::new();
    for d in deltas {
        match d {
            Delta::Content(t) => content.push_str(&t),
            Delta::Reasoning(t) => reasoning.push_str(&t),
            Delta::ToolCall(c) => tool_calls.push(c),
        }
    }
    if !tool_calls.is_empty() {
        content = content.trim().to_string();
    }
    Parsed {
        content: (!content.is_empty()).then_some(content),
        reasoning: (!reasoning.is_empty()).then_some(reasoning),
        tool_calls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                           "zip": {"type": "string"}, "opts": {"type": "object"}}}}}])
    }

    fn fmt(tools: ToolSyntax, think: bool) -> OutputFormat {
        OutputFormat { tools, think }
    }

    /// Parses `output` whole and in pieces of every size from 1 to 7
    /// bytes (at char boundaries): both give the same result.
    fn parse(format: OutputFormat, prompt: &str, output: &str) -> Parsed {
        let t = tools();
        let mut p = StreamParser::new(format, prompt, Some(&t));
        let mut whole = p.push(output);
        whole.extend(p.finish());
        let want = collect(whole);
        for step in 1..8 {
            let mut p = StreamParser::new(format, prompt, Some(&t));
            let mut deltas = Vec::new();
            let mut i = 0;
            while i < output.len() {
                let mut j = (i + step).min(output.len());
                while !output.is_char_boundary(j) {
                    j += 1;
                }
                deltas.extend(p.push(&output[i..j]));
                i = j;
            }
            deltas.extend(p.finish());
            assert_eq!(collect(deltas), want, "pieces of {step}: {output:?}");
        }
        want
    }

    fn call(name: &str, args: Value) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: args.to_string(),
        }
    }

    #[test]
    fn hermes_json_tool_calls() {
        let f = fmt(ToolSyntax::ToolCallTag, true);
        let out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lyon\"}}\n</tool_call>";
        let p = parse(f, "<|im_start|>assistant\n", out);
        assert_eq!(p.content.as_deref(), Some("Let me check."));
        assert_eq!(
            p.tool_calls,
            vec![
                call("get_weather", json!({"city": "Paris", "days": 2})),
                call("get_weather", json!({"city": "Lyon"}))
            ]
        );
    }

    #[test]
    fn qwen_xml_tool_calls_are_typed_by_the_schema() {
        let f = fmt(ToolSyntax::ToolCallTag, true);
        let out = "<think>\nNeed weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=zip>\n10001\n</parameter>\n<parameter=opts>\n{\"a\": [1]}\n</parameter>\n</function>\n</tool_call>";
        let p = parse(f, "<|im_start|>assistant\n", out);
        assert_eq!(p.reasoning.as_deref(), Some("Need weather."));
        assert_eq!(p.content, None);
        assert_eq!(
            p.tool_calls,
            vec![call(
                "get_weather",
                json!({"city": "New York", "days": 3, "zip": "10001", "opts": {"a": [1]}})
            )]
        );
    }

    #[test]
    fn reasoning_opened_by_the_prompt() {
        let f = fmt(ToolSyntax::ToolCallTag, true);
        let p = parse(
            f,
            "<|im_start|>assistant\n<think>\n",
            "Two and two.\n</think>\n\nIt is 4.",
        );
        assert_eq!(p.reasoning.as_deref(), Some("Two and two."));
        assert_eq!(p.content.as_deref(), Some("It is 4."));
        // A closed (empty) block in the prompt: plain content.
        let p = parse(f, "<|im_start|>assistant\n<think>\n\n</think>\n\n", "4");
        assert_eq!((p.reasoning, p.content.as_deref()), (None, Some("4")));
        // Unfinished reasoning (stopped by max_tokens) stays reasoning.
        let p = parse(f, "x<think>\n", "Hmm, let me");
        assert_eq!(p.reasoning.as_deref(), Some("Hmm, let me"));
    }

    #[test]
    fn nemotron_granite_and_lfm2_formats() {
        let p = parse(
            fmt(ToolSyntax::NemotronV2, true),
            "<SPECIAL_11>Assistant\n<think></think>",
            "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"f\", \"arguments\": {}}]</TOOLCALL>",
        );
        assert_eq!(
            p.tool_calls,
            vec![
                call("get_weather", json!({"city": "Oslo"})),
                call("f", json!({}))
            ]
        );
        let p = parse(
            fmt(ToolSyntax::Granite3, false),
            "",
            "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]",
        );
        assert_eq!(
            p.tool_calls,
            vec![call("get_weather", json!({"city": "Rome"}))]
        );
        let p = parse(
            fmt(ToolSyntax::Lfm2, true),
            "<|im_start|>assistant\n",
            "Checking.<|tool_call_start|>[get_weather(city='Zürich', days=2, opts={\"x\": True}), f()]<|tool_call_end|>",
        );
        assert_eq!(p.content.as_deref(), Some("Checking."));
        assert_eq!(
            p.tool_calls,
            vec![
                call(
                    "get_weather",
                    json!({"city": "Zürich", "days": 2, "opts": {"x": true}})
                ),
                call("f", json!({}))
            ]
        );
    }

    #[test]
    fn text_that_is_not_a_tool_call_stays() {
        let f = fmt(ToolSyntax::ToolCallTag, false);
        let out = "Use <tool_call>not json</tool_call> tags. a < b";
        let p = parse(f, "", out);
        assert_eq!(p.content.as_deref(), Some(out));
        assert!(p.tool_calls.is_empty());
        // Without tools in the request, tags are text.
        let mut p = StreamParser::new(f, "", None);
        let mut d = p.push("<tool_call>{\"name\": \"f\"}</tool_call>");
        d.extend(p.finish());
        assert_eq!(
            collect(d).content.as_deref(),
            Some("<tool_call>{\"name\": \"f\"}</tool_call>")
        );
        // Plain text keeps its whitespace.
        let p = parse(fmt(ToolSyntax::None, false), "", "  hi \n");
        assert_eq!(p.content.as_deref(), Some("  hi \n"));
    }

    #[test]
    fn formats_are_read_from_templates() {
        assert_eq!(
            OutputFormat::detect("{{ '<tool_call>' }}<think>"),
            fmt(ToolSyntax::ToolCallTag, true)
        );
        assert_eq!(
            OutputFormat::detect("List of tools: ["),
            fmt(ToolSyntax::Lfm2, false)
        );
        assert_eq!(
            OutputFormat::detect("<TOOLCALL>"),
            fmt(ToolSyntax::NemotronV2, false)
        );
        assert_eq!(
            OutputFormat::detect("<|tool_call|>"),
            fmt(ToolSyntax::Granite3, false)
        );
        assert_eq!(
            OutputFormat::detect("{{ x }}"),
            fmt(ToolSyntax::None, false)
        );
    }
}
