//! The request surface over HTTP on a fixture model: log-probabilities,
//! `n` choices forked from one prompt, logit bias, seeds and llama-server's
//! samplers; fields that are not implemented refused by name; llama-server's
//! `/tokenize`, `/detokenize` and `/props`; Anthropic's Messages and
//! OpenAI's Responses dialects, whole and streamed. The fixture's weights
//! are random: its text is gibberish, but greedy output is deterministic.

mod common;

use common::{start, start_any, TestServer};
use serde_json::{json, Value};

fn post_ok(s: &TestServer, path: &str, body: Value) -> Value {
    let r = s.post(path, &body);
    assert_eq!(r.status, 200, "{body}: {}", r.text());
    r.json()
}

fn chat(content: &str) -> Value {
    json!([{"role": "user", "content": content}])
}

#[test]
fn logprobs_whole_and_streamed() {
    let s = start(2, 2, 512);
    let v = post_ok(
        &s,
        "/v1/chat/completions",
        json!({"messages": chat("Hello"), "max_tokens": 6, "temperature": 0, "ignore_eos": true,
               "logprobs": true, "top_logprobs": 3}),
    );
    let c = &v["choices"][0];
    let content = c["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 6);
    for t in content {
        let lp = t["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0);
        assert!(t["token"].is_string() && t["bytes"].is_array());
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // greedy: the sampled token is the most likely one
        assert_eq!(top[0]["logprob"].as_f64().unwrap(), lp);
        assert!(top[1]["logprob"].as_f64().unwrap() <= lp);
    }
    let text: String = content
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert_eq!(text, c["message"]["content"].as_str().unwrap());

    // Streamed: the same tokens, spread over the chunks.
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": chat("Hello"), "max_tokens": 6, "temperature": 0, "ignore_eos": true,
                "logprobs": true, "stream": true}),
    );
    let mut streamed = Vec::new();
    for e in r.events().iter().filter(|e| e.as_str() != "[DONE]") {
        let ch: Value = serde_json::from_str(e).unwrap();
        if let Some(list) = ch["choices"][0]["logprobs"]["content"].as_array() {
            streamed.extend(list.iter().map(|t| t["logprob"].as_f64().unwrap()));
        }
    }
    let whole: Vec<f64> = content
        .iter()
        .map(|t| t["logprob"].as_f64().unwrap())
        .collect();
    assert_eq!(streamed, whole);

    // Completions: OpenAI's legacy shape.
    let v = post_ok(
        &s,
        "/v1/completions",
        json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": true, "logprobs": 2}),
    );
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 4);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(lp["text_offset"][0], 0);
    // Without logprobs: null, as before.
    let v = post_ok(
        &s,
        "/v1/completions",
        json!({"prompt": "Hello", "max_tokens": 2}),
    );
    assert!(v["choices"][0]["logprobs"].is_null());
}

#[test]
fn n_choices_fork_one_prompt() {
    let s = start(4, 2, 512);
    let req = |n: usize, temperature: f32, seed: u64| {
        post_ok(
            &s,
            "/v1/completions",
            json!({"prompt": "Once upon a time", "max_tokens": 8, "n": n, "ignore_eos": true,
                   "temperature": temperature, "seed": seed, "top_k": 0, "top_p": 1, "min_p": 0}),
        )
    };
    // Greedy: every choice is the single choice's text.
    let one = req(1, 0.0, 1);
    let three = req(3, 0.0, 1);
    let choices = three["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], one["choices"][0]["text"]);
    }
    assert_eq!(three["usage"]["completion_tokens"], 24);
    assert_eq!(
        three["usage"]["prompt_tokens"],
        one["usage"]["prompt_tokens"]
    );
    // Sampled: choices draw apart, the same seed draws the same again.
    let a = req(4, 1.5, 7);
    let b = req(4, 1.5, 7);
    let texts = |v: &Value| -> Vec<String> {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(texts(&a), texts(&b));
    let mut distinct = texts(&a);
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() > 1, "{:?}", texts(&a));

    // Streamed chat: every choice starts, streams and finishes.
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": chat("Hi"), "max_tokens": 5, "n": 3, "temperature": 0,
                "ignore_eos": true, "stream": true}),
    );
    let mut finished = [false; 3];
    let mut text = [String::new(), String::new(), String::new()];
    for e in r.events().iter().filter(|e| e.as_str() != "[DONE]") {
        let ch: Value = serde_json::from_str(e).unwrap();
        let c = &ch["choices"][0];
        let i = c["index"].as_u64().unwrap() as usize;
        text[i].push_str(c["delta"]["content"].as_str().unwrap_or(""));
        finished[i] |= c["finish_reason"] == "length";
    }
    assert_eq!(finished, [true; 3]);
    assert!(text[0] == text[1] && text[1] == text[2] && !text[0].is_empty());

    // More choices than parallel sequences: refused by name.
    let r = s.post("/v1/completions", &json!({"prompt": "x", "n": 5}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "n");
}

#[test]
fn logit_bias_seed_and_samplers() {
    let s = start(1, 1, 512);
    let tokens = |text: &str| -> Vec<u64> {
        let v = post_ok(&s, "/tokenize", json!({"content": text}));
        v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect()
    };
    let target = tokens(" the")[0];
    let v = post_ok(
        &s,
        "/v1/completions",
        json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": true,
               "logit_bias": {target.to_string(): 100}}),
    );
    assert_eq!(v["choices"][0]["text"], " the the the the");
    // Banned (llama-server's list form; biases add up): never sampled.
    let v = post_ok(
        &s,
        "/v1/completions",
        json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": true,
               "logit_bias": [[target, 100], [target, false]]}),
    );
    assert!(!v["choices"][0]["text"].as_str().unwrap().contains(" the"));

    // A seed makes sampling reproducible.
    let sampled = |seed: u64| {
        post_ok(
            &s,
            "/v1/completions",
            json!({"prompt": "Hello", "max_tokens": 12, "temperature": 1.2, "seed": seed,
                   "ignore_eos": true}),
        )["choices"][0]["text"]
            .clone()
    };
    assert_eq!(sampled(3), sampled(3));

    // Every llama-server sampler runs.
    for extra in [
        json!({"typical_p": 0.8}),
        json!({"top_n_sigma": 1.0}),
        json!({"xtc_probability": 1.0, "xtc_threshold": 0.05}),
        json!({"dry_multiplier": 0.8, "dry_base": 1.75, "dry_allowed_length": 2,
               "dry_penalty_last_n": -1, "dry_sequence_breakers": ["\n", "."]}),
        json!({"mirostat": 1, "mirostat_tau": 3.0, "mirostat_eta": 0.2}),
        json!({"mirostat": 2}),
        json!({"repeat_penalty": 1.2, "repeat_last_n": -1, "presence_penalty": 0.3}),
    ] {
        let mut body =
            json!({"prompt": "Hello there", "max_tokens": 6, "seed": 1, "ignore_eos": true});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let v = post_ok(&s, "/v1/completions", body);
        assert_eq!(v["usage"]["completion_tokens"], 6, "{extra}");
    }
}

#[test]
fn fields_that_would_change_the_output_are_refused_by_name() {
    let s = start(1, 1, 256);
    for (path, body, field) in [
        (
            "/v1/chat/completions",
            json!({"messages": chat("hi"), "audio": {}}),
            "audio",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": chat("hi"), "prediction": {}}),
            "prediction",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "suffix": "x"}),
            "suffix",
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "best_of": 2}),
            "best_of",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": chat("hi"), "temprature": 0}),
            "temprature",
        ),
    ] {
        let r = s.post(path, &body);
        assert_eq!(r.status, 400, "{body}");
        let e = r.json();
        assert_eq!(e["error"]["param"], field, "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(field));
    }
    for (body, param) in [
        (
            json!({"messages": chat("hi"), "response_format": {"type": "xml"}}),
            "response_format",
        ),
        (
            json!({"messages": chat("hi"), "parallel_tool_calls": false}),
            "parallel_tool_calls",
        ),
        (
            json!({"messages": chat("hi"), "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            json!({"messages": chat("hi"), "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            json!({"messages": chat("hi"), "tool_choice": "required"}),
            "tool_choice",
        ),
    ] {
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["param"], param);
    }
    // Metadata is accepted.
    post_ok(
        &s,
        "/v1/chat/completions",
        json!({"messages": chat("hi"), "max_tokens": 1, "user": "u", "metadata": {"a": "b"},
               "store": false, "service_tier": "auto", "response_format": {"type": "text"},
               "parallel_tool_calls": true}),
    );
}

#[test]
fn tokenize_detokenize_props_and_models() {
    let s = start(2, 1, 384);
    let v = post_ok(&s, "/tokenize", json!({"content": "Hello world"}));
    let ids = v["tokens"].clone();
    assert!(!ids.as_array().unwrap().is_empty());
    let back = post_ok(&s, "/detokenize", json!({"tokens": ids}));
    assert_eq!(back["content"], "Hello world");
    let v = post_ok(
        &s,
        "/tokenize",
        json!({"content": "Hello world", "with_pieces": true}),
    );
    let pieces: String = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert!(t["id"].is_u64());
            t["piece"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(pieces, "Hello world");
    let r = s.post("/detokenize", &json!({"tokens": [99999999]}));
    assert_eq!(r.status, 400);
    let r = s.post("/tokenize", &json!({"content": "x", "special": true}));
    assert_eq!(r.status, 400);

    let p = s.get("/props").json();
    assert_eq!(p["n_ctx"], 384);
    assert_eq!(p["total_slots"], 2);
    assert_eq!(p["model"]["arch"], "granitehybrid");
    assert!(p["model"]["n_params"].as_u64().unwrap() > 0);
    assert!(p["chat_template"].is_string());
    assert!(p["build_info"].as_str().unwrap().starts_with("coil "));
    assert!(p["simd"].is_string());
    let m = s.get("/v1/models").json();
    assert_eq!(m["data"][0]["context_length"], 384);
    assert_eq!(m["data"][0]["meta"]["n_ctx"], 384);
    assert_eq!(m["data"][0]["meta"]["arch"], "granitehybrid");
}

#[test]
fn anthropic_messages_whole_streamed_and_errors() {
    let s = start(1, 2, 512);
    let v = post_ok(
        &s,
        "/v1/messages",
        json!({"model": "m", "max_tokens": 5, "system": "Be brief.", "temperature": 0,
               "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]}),
    );
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert!(v["id"].as_str().unwrap().starts_with("msg-"));
    assert_eq!(v["content"][0]["type"], "text");
    let text = v["content"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 5);

    // Streamed: Anthropic's events, the same text.
    let r = s.post(
        "/v1/messages",
        &json!({"max_tokens": 5, "system": "Be brief.", "temperature": 0, "stream": true,
                "messages": [{"role": "user", "content": "Hello"}]}),
    );
    let body = r.text();
    let names: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"]);
    let mut streamed = String::new();
    for e in r.events() {
        let v: Value = serde_json::from_str(&e).unwrap();
        if v["type"] == "content_block_delta" {
            streamed.push_str(v["delta"]["text"].as_str().unwrap());
        }
        if v["type"] == "message_delta" {
            assert_eq!(v["delta"]["stop_reason"], "max_tokens");
            assert_eq!(v["usage"]["output_tokens"], 5);
        }
    }
    assert_eq!(streamed, text);

    // A tool conversation renders like OpenAI's equivalent.
    let tools = json!([{"name": "get_weather", "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let messages = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Call the tool.", "signature": ""},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]},
    ]);
    let n = post_ok(
        &s,
        "/v1/messages/count_tokens",
        json!({"model": "m", "messages": messages, "tools": tools}),
    )["input_tokens"]
        .as_u64()
        .unwrap();
    let openai = post_ok(
        &s,
        "/v1/chat/completions",
        json!({"max_tokens": 1, "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
             "tool_calls": [{"id": "toolu_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"}],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]}),
    );
    assert_eq!(openai["usage"]["prompt_tokens"].as_u64().unwrap(), n);
    post_ok(
        &s,
        "/v1/messages",
        json!({"max_tokens": 2, "messages": messages, "tools": tools}),
    );

    // Errors in Anthropic's shape.
    for (body, needle) in [
        (json!({"messages": chat("hi")}), "max_tokens"),
        (
            json!({"max_tokens": 2, "messages": chat("hi"), "top_logprobs": 1}),
            "top_logprobs",
        ),
        (
            json!({"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "image"}]}]}),
            "image",
        ),
        (
            json!({"max_tokens": 2, "messages": chat("hi"), "tool_choice": {"type": "any"}}),
            "no tools",
        ),
    ] {
        let r = s.post("/v1/messages", &body);
        assert_eq!(r.status, 400, "{body}");
        let e = r.json();
        assert_eq!(e["type"], "error", "{e}");
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(needle),
            "{e}"
        );
    }
    let r = s.request("POST", "/v1/messages", Some("{not json"));
    assert_eq!(r.json()["type"], "error");
    // Anthropic's newer fields: effort, adaptive thinking, metadata.
    post_ok(
        &s,
        "/v1/messages",
        json!({"max_tokens": 2, "messages": chat("hi"), "output_config": {"effort": "low"},
               "thinking": {"type": "adaptive"}, "cache_control": {"type": "ephemeral"},
               "metadata": {"user_id": "u"}, "speed": "standard"}),
    );
}

#[test]
fn responses_whole_streamed_and_items() {
    let s = start(1, 2, 512);
    let v = post_ok(
        &s,
        "/v1/responses",
        json!({"model": "m", "instructions": "Be brief.", "input": "Hello",
               "max_output_tokens": 5, "temperature": 0}),
    );
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    let item = &v["output"][0];
    assert_eq!(item["type"], "message");
    assert_eq!(item["content"][0]["type"], "output_text");
    let text = item["content"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(v["usage"]["output_tokens"], 5);

    let r = s.post(
        "/v1/responses",
        &json!({"instructions": "Be brief.", "input": [{"role": "user", "content": "Hello"}],
                "max_output_tokens": 5, "temperature": 0, "stream": true}),
    );
    let evs: Vec<Value> = r
        .events()
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(evs[0]["type"], "response.created");
    assert_eq!(evs.last().unwrap()["type"], "response.incomplete");
    let mut streamed = String::new();
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(e["sequence_number"], i);
        if e["type"] == "response.output_text.delta" {
            streamed.push_str(e["delta"].as_str().unwrap());
        }
    }
    assert_eq!(streamed, text);
    assert_eq!(
        evs.last().unwrap()["response"]["output"][0]["content"][0]["text"],
        text.as_str()
    );

    // Function calls and their outputs as input items, with a function tool.
    post_ok(
        &s,
        "/v1/responses",
        json!({"max_output_tokens": 2, "tools": [{"type": "function", "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
               "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": "Call it."}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather",
                 "arguments": "{\"city\": \"Paris\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "18 C"}]}),
    );
    for (body, param) in [
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "json_schema"}}}),
            "text.format",
        ),
        (
            json!({"input": "x", "text": {"verbosity": "low"}}),
            "text.verbosity",
        ),
        (json!({"input": [{"type": "input_image"}]}), "input"),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools",
        ),
        (json!({"input": "x", "top_logprobs": 2}), "top_logprobs"),
    ] {
        let r = s.post("/v1/responses", &body);
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
}

/// The bundled demo model (trained: real text) through every dialect, as
/// `scripts/client-check.py` drives it with the official clients.
#[test]
fn the_demo_model_answers_in_every_dialect() {
    let s = start_any("demo", 3, 1, 512);
    let hello = chat("Say hello.");
    // OpenAI chat: n = 3 streamed with logprobs.
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": hello, "max_tokens": 8, "n": 3, "seed": 4, "logprobs": true,
                "top_logprobs": 2, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let (mut tokens, mut finished, mut usage) = ([0usize; 3], 0, Value::Null);
    for e in r.events().iter().filter(|e| e.as_str() != "[DONE]") {
        let ch: Value = serde_json::from_str(e).unwrap();
        if !ch["usage"].is_null() {
            usage = ch["usage"].clone();
        }
        for c in ch["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            tokens[i] += c["logprobs"]["content"].as_array().map_or(0, Vec::len);
            finished += usize::from(!c["finish_reason"].is_null());
        }
    }
    assert_eq!(finished, 3);
    assert_eq!(
        usage["completion_tokens"].as_u64().unwrap() as usize,
        tokens.iter().sum::<usize>()
    );
    // Anthropic: streamed text equals the whole reply's.
    let body = json!({"max_tokens": 8, "temperature": 0, "messages": hello});
    let whole = post_ok(&s, "/v1/messages", body.clone());
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let mut text = String::new();
    for e in s.post("/v1/messages", &streamed).events() {
        let v: Value = serde_json::from_str(&e).unwrap();
        if let Some(t) = v["delta"]["text"].as_str() {
            text.push_str(t);
        }
    }
    assert_eq!(whole["content"][0]["text"].as_str().unwrap(), text);
    // Responses: the same greedy text as Messages (the same prompt).
    let r = post_ok(
        &s,
        "/v1/responses",
        json!({"input": "Say hello.", "max_output_tokens": 8, "temperature": 0}),
    );
    assert_eq!(r["output"][0]["content"][0]["text"].as_str().unwrap(), text);
}
