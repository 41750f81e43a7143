//! A chat reply in OpenAI's shapes: the raw text as `content`, or — when
//! the template's format is known ([`StreamParser`]) — `reasoning_content`,
//! `content` and `tool_calls` read out of it, whole or as stream deltas.

use crate::api::{self, FinishReason, ResponseMeta, Usage};
use crate::template::tool_calls::{self, Delta, Parsed, StreamParser};
use serde_json::{json, Value};

pub struct ChatReply {
    parser: Option<StreamParser>,
    /// Tool calls streamed so far.
    n_calls: usize,
}

/// The id of a reply's `i`-th tool call.
fn call_id(meta: &ResponseMeta, i: usize) -> String {
    let tail = meta.id.rsplit('-').next().unwrap_or_default();
    format!("call_{tail}_{i}")
}

impl ChatReply {
    /// `parser`: `None` keeps the reply's text as it is.
    pub fn new(parser: Option<StreamParser>) -> Self {
        ChatReply { parser, n_calls: 0 }
    }

    /// The `chat.completion` body of a whole reply.
    pub fn body(
        &mut self,
        meta: &ResponseMeta,
        text: String,
        finish: FinishReason,
        usage: &Usage,
    ) -> Value {
        let parsed = match self.parser.as_mut() {
            Some(p) => {
                let mut deltas = p.push(&text);
                deltas.extend(p.finish());
                tool_calls::collect(deltas)
            }
            None => Parsed {
                content: Some(text),
                ..Default::default()
            },
        };
        let message = api::assistant_message(&parsed, |i| call_id(meta, i));
        let finish = api::chat_finish(finish, !parsed.tool_calls.is_empty());
        api::chat_completion(meta, message, finish, usage)
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
        out.push(api::chat_chunk(meta, json!({}), Some(f)));
        out
    }

    fn delta_chunks(&mut self, meta: &ResponseMeta, deltas: Vec<Delta>) -> Vec<Value> {
        deltas
            .into_iter()
            .map(|d| {
                let delta = match d {
                    Delta::Content(t) => json!({ "content": t }),
                    Delta::Reasoning(t) => json!({ "reasoning_content": t }),
                    Delta::ToolCall(c) => {
                        let i = self.n_calls;
                        self.n_calls += 1;
                        let call = api::tool_call_json(&c, &call_id(meta, i), Some(i));
                        json!({ "tool_calls": [call] })
                    }
                };
                api::chat_chunk(meta, delta, None)
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
        ChatReply::new(Some(StreamParser::new(format, prompt, Some(&tools))))
    }

    /// A canned Qwen3.5 reply: reasoning (opened by the prompt), a word,
    /// an XML tool call.
    const CANNED: &str = "The user wants weather.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";

    #[test]
    fn whole_replies_carry_tool_calls_and_reasoning() {
        let body = qwen35().body(
            &meta(),
            CANNED.into(),
            FinishReason::Stop,
            &Usage::default(),
        );
        let c = &body["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        let m = &c["message"];
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
        let body = ChatReply::new(None).body(
            &meta(),
            "x <tool_call>".into(),
            FinishReason::Length,
            &Usage::default(),
        );
        assert_eq!(body["choices"][0]["message"]["content"], "x <tool_call>");
        assert_eq!(body["choices"][0]["finish_reason"], "length");
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
