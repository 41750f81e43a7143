//! Real chat templates through `coil serve`: plain chats, chats with tools
//! and chats with a tool-call history answer on every family's
//! template, `POST /apply-template` returns transformers' rendering, and
//! bad requests get 400s that name the message and the template line.

mod common;

use common::{start_with_template_override, TestServer};
use serde_json::{json, Value};
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/templates")
}

fn renders() -> Value {
    let text = std::fs::read_to_string(fixtures().join("renders.json")).expect("renders.json");
    serde_json::from_str(&text).expect("JSON")
}

fn source(name: &str) -> String {
    std::fs::read_to_string(fixtures().join(format!("{name}.jinja"))).expect("template")
}

/// A fixture case as an OpenAI client sends it (arguments as JSON text).
fn body(doc: &Value, case: &str) -> Value {
    let c = &doc["cases"][case];
    let mut messages = c["messages"].clone();
    for m in messages.as_array_mut().unwrap() {
        if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for call in calls {
                let args = &mut call["function"]["arguments"];
                *args = Value::String(args.to_string());
            }
        }
    }
    let mut b = json!({"messages": messages, "max_tokens": 2, "temperature": 0});
    if !c["tools"].is_null() {
        b["tools"] = c["tools"].clone();
    }
    if c["kwargs"].as_object().is_some_and(|k| !k.is_empty()) {
        b["chat_template_kwargs"] = c["kwargs"].clone();
    }
    b
}

fn error_message(r: &common::Reply) -> String {
    r.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Nemotron 3 Nano, Qwen3.5 and Qwen3-Coder once failed on plain chats or
/// tool-call histories; every family's template answers, and
/// `/apply-template` gives what transformers renders.
#[test]
fn real_templates_chat_with_tools_and_tool_call_history() {
    let doc = renders();
    let names = [
        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        "Qwen3.5-4B",
        "Qwen3-Coder",
        "ibm-granite-granite-4.0",
        "NVIDIA-Nemotron-Nano-v2",
        "LFM2.5-8B-A1B",
    ];
    for name in names {
        let s = start_with_template_override(&source(name), 8192);
        for case in ["plain", "tools", "tool_call_history", "reasoning_content"] {
            let mut b = body(&doc, case);
            // The fixture model's BOS / EOS texts are not the family's:
            // the fixtures' come in as template variables (which
            // chat_template_kwargs may set, as in transformers).
            let t = &doc["templates"][name];
            let kwargs = b
                .as_object_mut()
                .unwrap()
                .entry("chat_template_kwargs")
                .or_insert(json!({}));
            kwargs["bos_token"] = t["bos_token"].clone();
            kwargs["eos_token"] = t["eos_token"].clone();
            let r = s.post("/v1/chat/completions", &b);
            assert_eq!(r.status, 200, "{name} / {case}: {}", r.text());
            let v = r.json();
            assert_eq!(v["choices"][0]["message"]["role"], "assistant");
            let r = s.post("/apply-template", &b);
            assert_eq!(r.status, 200, "{name} / {case}: {}", r.text());
            // The chat endpoint renders with the generation prompt: the
            // fixtures of these cases do too.
            let want = &doc["templates"][name]["results"][case]["prompt"];
            assert_eq!(&r.json()["prompt"], want, "{name} / {case}");
        }
    }
}

#[test]
fn template_errors_are_400s_naming_the_message_and_line() {
    let doc = renders();
    let s: TestServer = start_with_template_override(&source("Qwen3.5-4B"), 4096);
    // A system message after the first: Qwen3.5's template raises.
    let b = json!({"messages": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "system", "content": "late"},
        {"role": "user", "content": "c"}]});
    for route in ["/v1/chat/completions", "/apply-template"] {
        let r = s.post(route, &b);
        assert_eq!(r.status, 400, "{}", r.text());
        let m = error_message(&r);
        assert!(m.contains("System message must be at the beginning"), "{m}");
        assert!(m.contains("messages[2] (role system)"), "{m}");
        assert!(m.contains("template line 85"), "{m}");
    }
    // Malformed tool-call arguments.
    let mut b = body(&doc, "tool_call_history");
    b["messages"][2]["tool_calls"][1]["function"]["arguments"] = json!("{\"query\": ");
    let r = s.post("/v1/chat/completions", &b);
    assert_eq!(r.status, 400);
    let m = error_message(&r);
    assert!(
        m.contains("messages[2].tool_calls[1].function.arguments is not valid JSON"),
        "{m}"
    );
    // tool_choice naming an absent function; reserved kwargs; tools that
    // are not a list.
    let mut b = body(&doc, "tools");
    b["tool_choice"] = json!({"type": "function", "function": {"name": "absent"}});
    let r = s.post("/v1/chat/completions", &b);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "tool_choice");
    b["tool_choice"] = json!("none");
    assert_eq!(s.post("/v1/chat/completions", &b).status, 200);
    let r = s.post(
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": []}}),
    );
    assert_eq!(r.status, 400);
    assert!(error_message(&r).contains("chat_template_kwargs.messages"));
    let r = s.post(
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "tools");
}

/// `enable_thinking` and `reasoning_effort` reach the template.
#[test]
fn template_kwargs_reach_the_template() {
    let src = "{{ messages[0].content }}|{{ enable_thinking }}|{{ reasoning_effort }}|{{ tools is none }}";
    let s = start_with_template_override(src, 512);
    let r = s.post(
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "hi"}],
                "chat_template_kwargs": {"enable_thinking": false}, "reasoning_effort": "low"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["prompt"], "hi|False|low|True");
}
