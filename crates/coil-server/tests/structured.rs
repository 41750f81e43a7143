//! Structured outputs through the API: `response_format` (JSON object and
//! schema), `grammar`, `json_schema` and forced tool calls in every
//! template's syntax — the output always parses and validates, streamed or
//! not, beside unconstrained requests in one batch and under speculative
//! decoding — and bad input gets a 400 naming what is wrong.

mod common;

use coil::engine::draft::SpecParams;
use coil_server::scheduler::SchedulerConfig;
use common::{start_any_cfg, start_with_template, TestServer};
use serde_json::{json, Value};

fn demo(parallel: usize, spec: Option<SpecParams>) -> TestServer {
    start_any_cfg(
        "demo",
        parallel,
        1024,
        SchedulerConfig {
            parallel,
            prefill_chunk: 64,
            spec,
            ..Default::default()
        },
    )
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "mood": {"enum": ["merry", "sad"]}
        },
        "required": ["name", "age", "mood"],
        "additionalProperties": false
    })
}

fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let o = v.as_object().unwrap_or_else(|| panic!("{text}"));
    assert_eq!(o.len(), 3, "{text}");
    assert!(
        o["name"].as_str().is_some_and(|s| s.chars().count() <= 16),
        "{text}"
    );
    assert!(o["age"].as_u64().is_some_and(|a| a <= 120), "{text}");
    assert!(o["mood"] == "merry" || o["mood"] == "sad", "{text}");
}

fn chat_body(extra: Value) -> Value {
    let mut b = json!({
        "messages": [{"role": "user", "content": "Who art thou?"}],
        "max_tokens": 120,
        "temperature": 0,
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn schema_format() -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "person", "schema": person_schema(), "strict": true}})
}

/// The content of a streamed chat reply, and its finish reason.
fn streamed(s: &TestServer, body: &Value) -> (String, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = s.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let mut text = String::new();
    let mut finish = String::new();
    for e in r.events() {
        if e == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(&e).unwrap();
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(c);
        }
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish)
}

#[test]
fn response_format_json_schema_and_object_on_the_demo_model() {
    let s = demo(2, None);
    for temp in [0.0, 1.0] {
        let body =
            chat_body(json!({"response_format": schema_format(), "temperature": temp, "seed": 3}));
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        check_person(v["choices"][0]["message"]["content"].as_str().unwrap());
        let (text, finish) = streamed(&s, &body);
        assert_eq!(finish, "stop");
        check_person(&text);
    }
    // json_object on the completions endpoint, and llama-server's bare
    // `json_schema`.
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "ROMEO:", "max_tokens": 200, "temperature": 0,
                "response_format": {"type": "json_object"}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let text = v["choices"][0]["text"].as_str().unwrap();
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(text).unwrap().is_object(),
            "{text}"
        );
    } else {
        assert!(text.starts_with('{'), "{text}");
    }
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "ROMEO:", "max_tokens": 120, "temperature": 0, "json_schema": person_schema()}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    check_person(r.json()["choices"][0]["text"].as_str().unwrap());
}

#[test]
fn grammar_field_constrains_completions_and_chat() {
    let s = demo(1, None);
    let list = include_str!("../../../tests/fixtures/grammars/list.gbnf");
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "ROMEO:", "max_tokens": 40, "temperature": 0, "grammar": list}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(
        text.starts_with("- ") && text.lines().all(|l| l.starts_with("- ")),
        "{text:?}"
    );
    let g = "root ::= (\"yea\" | \"nay\") \", my lord\"\n";
    let r = s.post("/v1/chat/completions", &chat_body(json!({"grammar": g})));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text == "yea, my lord" || text == "nay, my lord", "{text:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

/// Constrained and free requests decoded in one batch: the free ones get
/// the text they get alone (no mask leaks), the constrained ones valid
/// JSON.
#[test]
fn constraints_stay_with_their_request_in_a_batch() {
    let s = demo(3, None);
    let free = json!({"prompt": "JULIET:", "max_tokens": 40, "temperature": 0, "ignore_eos": true});
    let alone = s.post("/v1/completions", &free).json()["choices"][0]["text"].clone();
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let addr = s.addr;
            let body = if i % 2 == 0 {
                free.clone()
            } else {
                chat_body(json!({"response_format": schema_format()}))
            };
            std::thread::spawn(move || {
                let s = TestServer { addr };
                let path = if i % 2 == 0 {
                    "/v1/completions"
                } else {
                    "/v1/chat/completions"
                };
                let r = s.post(path, &body);
                assert_eq!(r.status, 200, "{}", r.text());
                (i, r.json())
            })
        })
        .collect();
    for t in threads {
        let (i, v) = t.join().unwrap();
        if i % 2 == 0 {
            assert_eq!(v["choices"][0]["text"], alone);
        } else {
            check_person(v["choices"][0]["message"]["content"].as_str().unwrap());
        }
    }
}

/// Speculative decoding (n-gram drafts) under a constraint: the greedy
/// output is the one without speculation.
#[test]
fn speculation_keeps_constrained_outputs() {
    let body = chat_body(json!({
        "max_tokens": 200,
        "response_format": {"type": "json_schema", "json_schema": {"schema": {
            "type": "object",
            "properties": {"lines": {"type": "array", "items": {"enum": ["my lord", "good my lord", "my good lord"]}, "minItems": 6, "maxItems": 6}},
            "required": ["lines"], "additionalProperties": false}}},
    }));
    let plain = demo(1, None).post("/v1/chat/completions", &body).json();
    let spec = demo(1, Some(SpecParams::default()))
        .post("/v1/chat/completions", &body)
        .json();
    let text = plain["choices"][0]["message"]["content"].as_str().unwrap();
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(v["lines"].as_array().unwrap().len(), 6, "{text}");
    assert_eq!(
        spec["choices"][0]["message"]["content"],
        plain["choices"][0]["message"]["content"]
    );
    let drafted = spec["usage"]["completion_tokens_details"]["accepted_prediction_tokens"]
        .as_u64()
        .unwrap_or(0)
        + spec["usage"]["completion_tokens_details"]["rejected_prediction_tokens"]
            .as_u64()
            .unwrap_or(0);
    assert!(drafted > 0, "no drafts were verified: {}", spec["usage"]);
}

#[test]
fn bad_constraints_are_400s_naming_the_fault() {
    let s = demo(1, None);
    let post = |body: Value| {
        let r = s.post("/v1/chat/completions", &chat_body(body));
        assert_eq!(r.status, 400, "{}", r.text());
        let e = r.json()["error"].clone();
        assert_eq!(e["type"], "invalid_request_error");
        (
            e["message"].as_str().unwrap().to_string(),
            e["param"].clone(),
        )
    };
    let (m, p) = post(
        json!({"response_format": {"type": "json_schema", "json_schema": {"schema":
        {"type": "object", "properties": {"age": {"type": "integr"}}}}}}),
    );
    assert!(
        m.starts_with("response_format.json_schema.schema.properties.age.type"),
        "{m}"
    );
    assert_eq!(p, "response_format");
    let (m, p) = post(json!({"grammar": "root ::= \"a\"\nfoo ::= \"b\" %\n"}));
    assert!(m.contains("line 2, column 13"), "{m}");
    assert_eq!(p, "grammar");
    let (m, _) = post(json!({"grammar": "root ::= item\n"}));
    assert!(m.contains("item is used but not defined"), "{m}");
    let (m, _) = post(
        json!({"response_format": {"type": "json_schema", "json_schema": {"schema":
        {"type": "integer", "minimum": 10, "maximum": 2}}}}),
    );
    assert!(m.contains("no output satisfies"), "{m}");
    let (m, p) = post(json!({"response_format": {"type": "xml"}}));
    assert!(m.contains("json_object"), "{m}");
    assert_eq!(p, "response_format");
    let (m, _) =
        post(json!({"response_format": {"type": "json_object"}, "grammar": "root ::= \"x\"\n"}));
    assert!(m.contains("only one of"), "{m}");
    let (m, p) = post(json!({"tool_choice": "required"}));
    assert!(m.contains("no tools"), "{m}");
    assert_eq!(p, "tool_choice");
    let tools = json!([{"type": "function", "function": {"name": "speak", "parameters": {"type": "object"}}}]);
    let (m, _) = post(
        json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "fly"}}}),
    );
    assert!(m.contains("\"fly\"") && m.contains("speak"), "{m}");
    // The server still answers.
    let r = s.post(
        "/v1/chat/completions",
        &chat_body(json!({"response_format": schema_format()})),
    );
    assert_eq!(r.status, 200);
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["celsius", "fahrenheit"]}
            },
            "required": ["city", "days"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}}, "required": ["zone"]}}}
    ])
}

fn check_call(call: &Value, want: Option<&str>) {
    let f = &call["function"];
    let name = f["name"].as_str().unwrap();
    if let Some(w) = want {
        assert_eq!(name, w);
    }
    let args: Value = serde_json::from_str(f["arguments"].as_str().unwrap()).unwrap();
    match name {
        "get_weather" => {
            assert!(args["city"].is_string(), "{args}");
            assert!(
                args["days"].as_u64().is_some_and(|d| (1..=7).contains(&d)),
                "{args}"
            );
            assert!(
                args.get("unit")
                    .is_none_or(|u| u == "celsius" || u == "fahrenheit"),
                "{args}"
            );
        }
        "get_time" => assert!(args["zone"].is_string(), "{args}"),
        other => panic!("unknown tool {other}"),
    }
}

/// `tool_choice` "required" and a named function force a call in each
/// template's syntax, its arguments valid against the tool's schema.
#[test]
fn forced_tool_calls_in_every_template_syntax() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/templates");
    for name in [
        "Qwen-Qwen2.5-7B-Instruct",
        "Qwen3.5-4B",
        "Qwen3-Coder",
        "ibm-granite-granite-3.3-2B-Instruct",
        "ibm-granite-granite-4.0",
        "NVIDIA-Nemotron-Nano-v2",
        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        "LFM2-8B-A1B",
    ] {
        let src = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
        let s = start_with_template(&src, 1, 2048);
        for (choice, want, parallel) in [
            (json!("required"), None, false),
            (
                json!({"type": "function", "function": {"name": "get_weather"}}),
                Some("get_weather"),
                false,
            ),
            (json!("required"), None, true),
        ] {
            let body = json!({
                // (no reasoning first: random weights would not end it)
                "messages": [{"role": "system", "content": "/no_think"}, {"role": "user", "content": "Weather in Paris?"}],
                "tools": weather_tools(),
                "tool_choice": choice,
                "parallel_tool_calls": parallel,
                "max_tokens": 400,
                "temperature": 0.7,
                "seed": 5,
                "chat_template_kwargs": {"enable_thinking": false},
            });
            let r = s.post("/v1/chat/completions", &body);
            assert_eq!(r.status, 200, "{name}: {}", r.text());
            let v = r.json();
            let c = &v["choices"][0];
            // (random weights: with parallel calls allowed the model may go
            // on calling until the token limit)
            if parallel && c["finish_reason"] == "length" {
                // (a list format's unclosed list reads as no call)
                continue;
            }
            assert_eq!(c["finish_reason"], "tool_calls", "{name}: {v}");
            let calls = c["message"]["tool_calls"]
                .as_array()
                .unwrap_or_else(|| panic!("{name}: {v}"));
            assert!(!calls.is_empty(), "{name}");
            if !parallel {
                assert_eq!(calls.len(), 1, "{name}: {v}");
            }
            for call in calls {
                check_call(call, want);
            }
        }
    }
}

/// The text of a whole Responses reply (its message items).
fn responses_text(v: &Value) -> String {
    v["output"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .filter(|o| o["type"] == "message")
        .flat_map(|o| o["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["text"].as_str().map(String::from))
        .collect()
}

/// OpenAI Responses' `text.format` and Anthropic's `output_config.format`
/// (and the beta's `output_format`) constrain the reply as chat's
/// `response_format` does, whole and streamed.
#[test]
fn responses_and_messages_structured_outputs() {
    let s = demo(2, None);
    let input = "Who art thou?";
    let format =
        json!({"type": "json_schema", "name": "person", "schema": person_schema(), "strict": true});
    let body = json!({"input": input, "max_output_tokens": 120, "temperature": 0,
                      "text": {"format": format}});
    let r = s.post("/v1/responses", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["text"]["format"], format);
    check_person(&responses_text(&v));
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let r = s.post("/v1/responses", &streamed_body);
    assert_eq!(r.status, 200, "{}", r.text());
    let mut text = String::new();
    let mut last = Value::Null;
    for e in r.events() {
        let v: Value = serde_json::from_str(&e).unwrap();
        if v["type"] == "response.output_text.delta" {
            text.push_str(v["delta"].as_str().unwrap());
        }
        last = v;
    }
    assert_eq!(last["type"], "response.completed", "{last}");
    assert_eq!(last["response"]["text"]["format"]["type"], "json_schema");
    check_person(&text);
    // json_object: any JSON object.
    let r = s.post(
        "/v1/responses",
        &json!({"input": input, "max_output_tokens": 200, "temperature": 0,
                "text": {"format": {"type": "json_object"}}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    if v["status"] == "completed" {
        let t = responses_text(&v);
        assert!(
            serde_json::from_str::<Value>(&t).unwrap().is_object(),
            "{t}"
        );
    }

    // Anthropic: output_config.format, and the beta's output_format.
    for field in [
        json!({"output_config": {"format": {"type": "json_schema", "schema": person_schema()}}}),
        json!({"output_format": {"type": "json_schema", "schema": person_schema()}}),
    ] {
        let mut body = json!({"max_tokens": 120, "temperature": 0,
                              "messages": [{"role": "user", "content": input}]});
        for (k, v) in field.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = s.post("/v1/messages", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["stop_reason"], "end_turn", "{v}");
        assert_eq!(v["content"][0]["type"], "text", "{v}");
        check_person(v["content"][0]["text"].as_str().unwrap());
        body["stream"] = json!(true);
        let r = s.post("/v1/messages", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let mut text = String::new();
        for e in r.events() {
            let v: Value = serde_json::from_str(&e).unwrap();
            if v["type"] == "content_block_delta" {
                text.push_str(v["delta"]["text"].as_str().unwrap());
            }
        }
        check_person(&text);
    }
}

/// A bad `text.format` or `output_config.format` is a 400 in the
/// dialect's error shape naming the field and the schema's path.
#[test]
fn bad_responses_and_messages_formats_are_400s() {
    let s = demo(1, None);
    let bad_schema = json!({"type": "object", "properties": {"age": {"type": "integr"}}});
    let openai_error = |body: Value| {
        let mut b = json!({"input": "Hello", "max_output_tokens": 8});
        for (k, v) in body.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = s.post("/v1/responses", &b);
        assert_eq!(r.status, 400, "{}", r.text());
        let e = r.json()["error"].clone();
        assert_eq!(e["type"], "invalid_request_error", "{e}");
        (
            e["message"].as_str().unwrap().to_string(),
            e["param"].clone(),
        )
    };
    let (m, p) = openai_error(
        json!({"text": {"format": {"type": "json_schema", "name": "x", "schema": bad_schema}}}),
    );
    assert!(
        m.starts_with("text.format.schema.properties.age.type"),
        "{m}"
    );
    assert_eq!(p, "text.format");
    let (m, p) = openai_error(json!({"text": {"format": {"type": "json_schema", "name": "x"}}}));
    assert!(m.contains("text.format.schema is required"), "{m}");
    assert_eq!(p, "text.format");
    let (m, _) = openai_error(json!({"text": {"format": {"type": "xml"}}}));
    assert!(m.contains("json_schema"), "{m}");
    let (m, p) = openai_error(
        json!({"text": {"format": {"type": "json_object", "schema": {"type": "object"}}}}),
    );
    assert!(m.contains("unsupported field"), "{m}");
    assert_eq!(p, "text.format.schema");

    let anthropic_error = |body: Value| {
        let mut b = json!({"max_tokens": 8, "messages": [{"role": "user", "content": "Hello"}]});
        for (k, v) in body.as_object().unwrap() {
            b[k] = v.clone();
        }
        let r = s.post("/v1/messages", &b);
        assert_eq!(r.status, 400, "{}", r.text());
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        v["error"]["message"].as_str().unwrap().to_string()
    };
    let m = anthropic_error(
        json!({"output_config": {"format": {"type": "json_schema", "schema": bad_schema}}}),
    );
    assert!(
        m.starts_with("output_config.format.schema.properties.age.type"),
        "{m}"
    );
    let m =
        anthropic_error(json!({"output_format": {"type": "json_schema", "schema": bad_schema}}));
    assert!(
        m.starts_with("output_format.schema.properties.age.type"),
        "{m}"
    );
    let m = anthropic_error(json!({"output_config": {"format": {"type": "json_object"}}}));
    assert!(m.contains("output_config.format.type"), "{m}");
    let m = anthropic_error(json!({"output_config": {"format": {"type": "json_schema"}}}));
    assert!(m.contains("output_config.format.schema"), "{m}");
    let both = json!({"type": "json_schema", "schema": person_schema()});
    let m = anthropic_error(json!({"output_config": {"format": both}, "output_format": both}));
    assert!(m.contains("not both"), "{m}");
    let m = anthropic_error(
        json!({"output_config": {"format": {"type": "json_schema", "schema":
        {"type": "integer", "minimum": 10, "maximum": 2}}}}),
    );
    assert!(m.contains("no output satisfies"), "{m}");
}
