//! Structured outputs for every API dialect: a dialect translates its
//! fields into the internal request's [`OutputSpec`] (JSON, a schema, a
//! grammar — see [`crate::api::OutputFields`]) or a [`ToolChoice`] that
//! forces a tool call, and this module compiles it into the engine's constraint for
//! [`crate::scheduler::GenRequest::constraint`].
//!
//! A forced tool call is written in the chat template's own syntax (the
//! formats [`crate::template::tool_calls`] reads back), as an llguidance
//! Lark grammar whose arguments are the tool's JSON schema:
//! - `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>` (Qwen,
//!   Granite 4);
//! - `<tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n
//!   </function>\n</tool_call>` (Qwen3.5, Qwen3-Coder, Nemotron 3): a
//!   string parameter's value is free text up to `\n</parameter>`, the
//!   others JSON of the parameter's schema; required parameters in the
//!   schema's order, the others optional;
//! - `<|tool_call|>[{...}, ...]` (Granite 3), `<TOOLCALL>[...]</TOOLCALL>`
//!   (Nemotron Nano v2): a JSON list of calls;
//! - `<|tool_call_start|>[f(p="v", n=1)]<|tool_call_end|>` (LFM2): Python
//!   call syntax, values written as JSON (which its parser reads).
//!
//! With `parallel_tool_calls` (the default) one or more calls, else
//! exactly one. Where the prompt opened a `<think>` block the reasoning
//! comes first, free, up to `</think>`.

use crate::api::{ApiError, OutputSpec};
use crate::request::ToolChoice;
use crate::template::tool_calls::{OutputFormat, ToolSyntax};
use coil::engine::constraint::{schema_with_options, Constraint, ConstraintSpec, Constraints};
use coil::tokenizer::{TokenType, Tokenizer};
use serde_json::{json, Map, Value};
use std::fmt::Write;

/// Compiles `out` with `constraints`: a 400 naming the field (and the
/// schema's path, the grammar's line and column) when it is at fault.
pub fn compile(constraints: &Constraints, out: &OutputSpec) -> Result<Constraint, ApiError> {
    constraints.compile(&out.spec).map_err(|e| out.error(e))
}

/// The function name and JSON schema of the request's tools. A call's
/// arguments are the parameters the schema lists: where it does not say
/// whether others may follow, none may (OpenAI's strict mode asks for
/// `additionalProperties: false` everywhere).
fn tool_schemas(tools: &Value) -> Vec<(String, Value)> {
    tools
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let f = t.get("function").unwrap_or(t);
            let name = f.get("name")?.as_str()?.to_string();
            let mut params = f
                .get("parameters")
                .filter(|p| p.is_object())
                .cloned()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            if let Some(obj) = params.as_object_mut() {
                if obj.contains_key("properties") {
                    obj.entry("additionalProperties")
                        .or_insert(Value::Bool(false));
                }
            }
            Some((name, params))
        })
        .collect()
}

/// The grammar that forces a tool call (see the module's notes) of the
/// template's `format`, among `tools` as `choice` allows. `prompt`: the
/// rendered prompt (whether it opened a reasoning block).
pub fn tool_call_spec(
    format: OutputFormat,
    prompt: &str,
    tools: Option<&Value>,
    choice: &ToolChoice,
    parallel: bool,
    tokenizer: &Tokenizer,
) -> Result<OutputSpec, ApiError> {
    let bad = |m: String| ApiError::bad_request(m).with_param("tool_choice");
    let all = tools.map(tool_schemas).unwrap_or_default();
    if all.is_empty() {
        return Err(bad(
            "tool_choice requires a tool call but the request has no tools".into(),
        ));
    }
    let chosen: Vec<(String, Value)> = match choice {
        ToolChoice::Function(name) => match all.iter().find(|(n, _)| n == name) {
            Some(t) => vec![t.clone()],
            None => {
                let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
                return Err(bad(format!(
                    "tool_choice names the function {name:?}, which is not among the request's tools ({})",
                    names.join(", ")
                )));
            }
        },
        _ => all,
    };
    // Each tool's schema is checked where the request holds it.
    for (name, params) in &chosen {
        if let Err(m) = coil::engine::constraint::schema::check(params) {
            return Err(ApiError::bad_request(format!(
                "tools: the parameters of function {name:?}: {m}"
            ))
            .with_param("tools"));
        }
    }
    let g = Grammar {
        tokenizer,
        rules: String::new(),
        n: 0,
    };
    let lark = g.build(format, prompt, &chosen, parallel).ok_or_else(|| {
        bad("tool_choice requires a tool call but this model's chat template shows no tool-call format".into())
    })?;
    Ok(OutputSpec::new(
        ConstraintSpec::Lark(lark),
        "tool_choice",
        "",
    ))
}

struct Grammar<'a> {
    tokenizer: &'a Tokenizer,
    /// Rules written so far (after `start`).
    rules: String,
    /// Rules named so far.
    n: usize,
}

/// `%json {...}` of a schema, with coil's JSON writing options.
fn json_inline(schema: &Value) -> String {
    format!("%json {}", schema_with_options(schema))
}

fn lit(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

impl Grammar<'_> {
    /// A marker: the control token whose text it is (a single token the
    /// vocabulary never produces from text), else the text.
    fn marker(&self, text: &str) -> String {
        match self.tokenizer.token_to_id(text) {
            Some(id) if self.tokenizer.vocab().token_type(id) == TokenType::Control => {
                format!("<[{id}]>")
            }
            _ => lit(text),
        }
    }

    fn rule(&mut self, body: &str) -> String {
        let name = format!("r{}", self.n);
        self.n += 1;
        let _ = writeln!(self.rules, "{name}: {body}");
        name
    }

    /// `name[lazy]: /regex/`: as few bytes as possible up to what the
    /// regex ends with.
    fn lazy(&mut self, regex: &str) -> String {
        let name = format!("r{}", self.n);
        self.n += 1;
        let _ = writeln!(self.rules, "{name}[lazy]: /{regex}/");
        name
    }

    /// One call of any of `tools` as a JSON object `{"name", "arguments"}`.
    fn json_call(tools: &[(String, Value)]) -> Value {
        let one = |(name, params): &(String, Value)| {
            json!({
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        };
        match tools {
            [t] => one(t),
            _ => json!({"anyOf": tools.iter().map(one).collect::<Vec<_>>()}),
        }
    }

    /// `first (sep first)*` when `parallel`, else `first`.
    fn repeat(&mut self, one: &str, sep: &str, parallel: bool) -> String {
        if parallel {
            self.rule(&format!("{one} ({} {one})*", lit(sep)))
        } else {
            one.to_string()
        }
    }

    /// A JSON list of calls (one or more, or exactly one).
    fn json_list(tools: &[(String, Value)], parallel: bool) -> String {
        let mut list = json!({"type": "array", "items": Self::json_call(tools), "minItems": 1});
        if !parallel {
            list["maxItems"] = json!(1);
        }
        json_inline(&list)
    }

    /// A parameter's schema says a string (the XML format writes it raw).
    fn is_string(schema: &Value) -> bool {
        match schema.get("type") {
            Some(Value::String(t)) => t == "string",
            Some(Value::Array(ts)) => ts.len() == 1 && ts[0] == "string",
            _ => false,
        }
    }

    fn properties(params: &Value) -> (Vec<(String, Value)>, Vec<String>) {
        let props: Vec<(String, Value)> = params
            .get("properties")
            .and_then(Value::as_object)
            .map(|m: &Map<String, Value>| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        let required: Vec<String> = params
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        (props, required)
    }

    /// `<tool_call>\n<function=f>\n<parameter=p>\nv\n</parameter>\n...`.
    fn xml_call(&mut self, name: &str, params: &Value) -> String {
        let (props, required) = Self::properties(params);
        let mut body = vec![lit(&format!("<tool_call>\n<function={name}>\n"))];
        let close = lit("\n</parameter>\n");
        for (p, schema) in &props {
            let open = lit(&format!("<parameter={p}>\n"));
            let strings: Option<Vec<&str>> = schema
                .get("enum")
                .and_then(Value::as_array)
                .and_then(|e| e.iter().map(Value::as_str).collect());
            let value = if let Some(words) = strings.filter(|w| !w.is_empty()) {
                // Written raw, as the template writes a string.
                let alts: Vec<String> = words.iter().map(|w| lit(w)).collect();
                format!("{open} ({}) {close}", alts.join(" | "))
            } else if Self::is_string(schema) {
                let len = match schema.get("maxLength").and_then(Value::as_u64) {
                    Some(n) => format!("{{0,{n}}}"),
                    None => "*".into(),
                };
                let v = self.lazy(&format!(r"(?s:.{len})\n<\/parameter>\n"));
                format!("{open} {v}")
            } else {
                format!("{open} {} {}", json_inline(schema), lit("\n</parameter>\n"))
            };
            let r = self.rule(&value);
            body.push(if required.contains(p) {
                r
            } else {
                format!("{r}?")
            });
        }
        body.push(lit("</function>\n</tool_call>"));
        self.rule(&body.join(" "))
    }

    /// `f(p="v", n=1)`: the parameters in the schema's order, the
    /// optional ones may be left out, `, ` between those written.
    fn python_call(&mut self, name: &str, params: &Value) -> String {
        let (props, required) = Self::properties(params);
        let args: Vec<(String, bool)> = props
            .iter()
            .map(|(p, schema)| {
                let r = self.rule(&format!(
                    "{} {}",
                    lit(&format!("{p}=")),
                    json_inline(schema)
                ));
                (r, required.contains(p))
            })
            .collect();
        // From the last argument back: `tail` writes the rest, each after
        // ", "; `head` the rest with nothing written before them.
        let (mut tail, mut head) = (String::new(), String::new());
        for (a, req) in args.iter().rev() {
            let item = format!("{} {a}", lit(", "));
            let t = if *req {
                format!("{item} {tail}")
            } else {
                format!("({item})? {tail}")
            };
            let h = match (*req, head.is_empty()) {
                (true, _) => format!("{a} {tail}"),
                (false, true) => format!("({a} {tail})?"),
                (false, false) => format!("{a} {tail} | {head}"),
            };
            tail = self.rule(t.trim());
            head = self.rule(h.trim());
        }
        self.rule(&format!("{} {head} {}", lit(&format!("{name}(")), lit(")")))
    }

    fn build(
        mut self,
        format: OutputFormat,
        prompt: &str,
        tools: &[(String, Value)],
        parallel: bool,
    ) -> Option<String> {
        let calls = match format.tools {
            ToolSyntax::None => return None,
            ToolSyntax::ToolCallTag => {
                let one = self.rule(&format!(
                    "{} {} {}",
                    lit("<tool_call>\n"),
                    json_inline(&Self::json_call(tools)),
                    lit("\n</tool_call>")
                ));
                self.repeat(&one, "\n", parallel)
            }
            ToolSyntax::ToolCallXml => {
                let alts: Vec<String> = tools.iter().map(|(n, p)| self.xml_call(n, p)).collect();
                let one = self.rule(&alts.join(" | "));
                self.repeat(&one, "\n", parallel)
            }
            ToolSyntax::Granite3 => {
                let open = self.marker("<|tool_call|>");
                self.rule(&format!("{open} {}", Self::json_list(tools, parallel)))
            }
            ToolSyntax::NemotronV2 => {
                let (open, close) = (self.marker("<TOOLCALL>"), self.marker("</TOOLCALL>"));
                self.rule(&format!(
                    "{open} {} {close}",
                    Self::json_list(tools, parallel)
                ))
            }
            ToolSyntax::Lfm2 => {
                let alts: Vec<String> = tools.iter().map(|(n, p)| self.python_call(n, p)).collect();
                let one = self.rule(&alts.join(" | "));
                let list = self.repeat(&one, ", ", parallel);
                let (open, close) = (
                    self.marker("<|tool_call_start|>"),
                    self.marker("<|tool_call_end|>"),
                );
                self.rule(&format!("{open} {} {list} {} {close}", lit("["), lit("]")))
            }
        };
        let start = if crate::template::tool_calls::opens_think(format, prompt) {
            // The reasoning the prompt opened, then the calls.
            let close = self.marker("</think>");
            let think = if close.starts_with('<') && close.ends_with("]>") {
                let text = self.rule("/(?s:.*)/");
                format!("{text} {close}")
            } else {
                self.lazy(r"(?s:.*)<\/think>")
            };
            let ws = self.rule("/[ \\t\\r\\n]*/");
            format!("{think} {ws} {calls}")
        } else {
            calls
        };
        Some(format!("%llguidance {{}}\nstart: {start}\n{}", self.rules))
    }
}
