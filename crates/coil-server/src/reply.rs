//! A chat reply in OpenAI's shapes: the raw text as `content`, or — when
//! the template's format is known ([`StreamParser`]) — `reasoning_content`,
//! `content` and `tool_calls` read out of it, whole or as stream deltas.

use crate::api::{self, FinishReason, ResponseMeta};
use crate::template::tool_calls::{Delta, Parsed, StreamParser};
use serde_json::{json, Value};

pub struct ChatReply {
    parser: Option<StreamParser>,
    /// Which choice of the response this is.
    index: usize,
    /// Tool calls streamed so far.
    n_calls: usize,
}

/// The id of choice `choice`'s `i`-th tool call.
pub fn call_id(meta: &ResponseMeta, choice: usize, i: usize) -> String {
    let tail = meta.id.rsplit('-').next().unwrap_or_default();
    match choice {
        0 => format!("call_{tail}_{i}"),
        c => format!("call_{tail}_{c}_{i}"),
    }
}

/// A whole reply of choice `index`: its assistant message and finish
/// reason (`tool_calls` when it made some and ended by itself).
pub fn message(
    meta: &ResponseMeta,
    index: usize,
    parsed: &Parsed,
    finish: FinishReason,
) -> (Value, &'static str) {
    let message = api::assistant_message(parsed, |i| call_id(meta, index, i));
    (
        message,
        api::chat_finish(finish, !parsed.tool_calls.is_empty()),
    )
}

impl ChatReply {
    /// `parser`: `None` keeps the reply's text as it is; `index`: the
    /// choice.
    pub fn new(parser: Option<StreamParser>, index: usize) -> Self {
        ChatReply {
            parser,
            index,
            n_calls: 0,
        }
    }

    /// Stream chunks for a piece of generated text (none while the parser
    /// holds it back).
    pub fn chunks(&mut self, meta: &ResponseMeta, text: &str) -> Vec<Value> {
        let deltas = match self.parser.as_mut() {
            Some(p) => p.push(text),
            None => vec![Delta::Content(text.to_string())],
        };
        self.delta_chunks(meta, deltas)
    }

    /// The last chunks: what the parser held back, then `{}` with the
    /// finish reason (`tool_calls` when the reply made some).
    pub fn last_chunks(&mut self, meta: &ResponseMeta, finish: FinishReason) -> Vec<Value> {
        let deltas = self.parser.as_mut().map(|p| p.finish()).unwrap_or_default();
        let mut out = self.delta_chunks(meta, deltas);
        let f = api::chat_finish(finish, self.n_calls > 0);
        out.push(api::chat_chunk(
            meta,
            self.index,
            json!({}),
            Some(f),
            Value::Null,
        ));
        out
    }

    fn delta_chunks(&mut self, meta: &ResponseMeta, deltas: Vec<Delta>) -> Vec<Value> {
        deltas
            .into_iter()
            .filter(|d| !matches!(d, Delta::Content(t) | Delta::Reasoning(t) if t.is_empty()))
            .map(|d| {
                let delta = match d {
                    Delta::Content(t) => json!({ "content": t }),
                    Delta::Reasoning(t) => json!({ "reasoning_content": t }),
                    Delta::ToolCall(c) => {
                        let i = self.n_calls;
                        self.n_calls += 1;
                        let id = call_id(meta, self.index, i);
                        let call = api::tool_call_json(&c, &id, Some(i));
                        json!({ "tool_calls": [call] })
                    }
                };
                api::chat_chunk(meta, self.index, delta, None, Value::Null)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::tool_calls::OutputFormat;

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "chatcmpl-abc0001".into(),
            created: 1,
            model: "m".into(),
        }
    }

    fn qwen35() -> ChatReply {
        let format = OutputFormat::detect("<tool_call>\n<function=...> <think>");
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        let prompt = "<|im_start|>assistant\n<think>\n";
        ChatReply::new(Some(StreamParser::new(format, prompt, Some(&tools))), 0)
    }

    /// A canned Qwen3.5 reply: reasoning (opened by the prompt), a word,
    /// an XML tool call.
    const CANNED: &str = "The user wants weather.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";

    fn parsed(parser: Option<StreamParser>, text: &str) -> Parsed {
        let c = crate::job::Choice {
            text: text.into(),
            ..Default::default()
        };
        c.parsed(parser.as_ref())
    }

    #[test]
    fn whole_replies_carry_tool_calls_and_reasoning() {
        let format = OutputFormat::detect("<tool_call>\n<function=...> <think>");
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        let parser = StreamParser::new(format, "<|im_start|>assistant\n<think>\n", Some(&tools));
        let (m, finish) = message(
            &meta(),
            0,
            &parsed(Some(parser), CANNED),
            FinishReason::Stop,
        );
        assert_eq!(finish, "tool_calls");
        assert_eq!(m["role"], "assistant");
        assert_eq!(m["content"], "Checking.");
        assert_eq!(m["reasoning_content"], "The user wants weather.");
        let call = &m["tool_calls"][0];
        assert_eq!(call["id"], "call_abc0001_0");
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({"city": "Paris"}));
        // Without a parser the text is the content.
        let (m, finish) = message(
            &meta(),
            0,
            &parsed(None, "x <tool_call>"),
            FinishReason::Length,
        );
        assert_eq!(m["content"], "x <tool_call>");
        assert_eq!(finish, "length");
    }

    #[test]
    fn streamed_replies_carry_the_same_as_deltas() {
        let mut r = qwen35();
        let mut chunks = Vec::new();
        // Token-sized pieces.
        let bytes: Vec<char> = CANNED.chars().collect();
        for piece in bytes.chunks(3) {
            chunks.extend(r.chunks(&meta(), &piece.iter().collect::<String>()));
        }
        chunks.extend(r.last_chunks(&meta(), FinishReason::Stop));
        let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
        for ch in &chunks[..chunks.len() - 1] {
            let d = &ch["choices"][0]["delta"];
            assert!(ch["choices"][0]["finish_reason"].is_null());
            if let Some(t) = d["reasoning_content"].as_str() {
                reasoning.push_str(t);
            }
            if let Some(t) = d["content"].as_str() {
                content.push_str(t);
            }
            if let Some(c) = d["tool_calls"].as_array() {
                calls.extend(c.iter().cloned());
            }
        }
        assert_eq!(reasoning, "The user wants weather.");
        assert_eq!(content, "Checking.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["index"], 0);
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(last["choices"][0]["delta"], json!({}));
    }
}
