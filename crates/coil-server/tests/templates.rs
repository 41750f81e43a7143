//! Real chat templates (tests/fixtures/templates/*.jinja, from llama.cpp's
//! models/templates) render byte for byte as transformers renders them
//! (tests/fixtures/templates/renders.json, from
//! tools/make_template_fixtures.py), for every case: plain chats, tools,
//! tool calls and results, reasoning, enable_thinking. The messages go
//! through the request path first, as an OpenAI client sends them: a tool
//! call's `arguments` as a JSON string.

use coil_server::api::{normalise_messages, parse_body, ChatRequest};
use coil_server::template::{ChatTemplate, Clock};
use serde_json::{json, Value};
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/templates")
}

fn load() -> Value {
    let text = std::fs::read_to_string(fixtures().join("renders.json")).expect("renders.json");
    serde_json::from_str(&text).expect("renders.json is JSON")
}

/// The clock the fixtures were rendered at (`now`, UTC).
fn fixed_now(doc: &Value) -> u64 {
    let now = doc["now"].as_str().expect("now");
    // "YYYY-MM-DDTHH:MM:SS"
    let n = |a: usize, b: usize| now[a..b].parse::<i64>().expect("a date");
    let (y, m, d) = (n(0, 4), n(5, 7), n(8, 10));
    let (y2, m2) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    (days * 86_400 + n(11, 13) * 3600 + n(14, 16) * 60 + n(17, 19)) as u64
}

/// The case as an OpenAI chat request body: arguments as JSON text.
fn request_body(case: &Value) -> Value {
    let mut messages = case["messages"].clone();
    for m in messages.as_array_mut().expect("messages") {
        if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for c in calls {
                let args = &mut c["function"]["arguments"];
                *args = Value::String(serde_json::to_string(args).expect("json"));
            }
        }
    }
    let mut body = json!({ "messages": messages });
    if !case["tools"].is_null() {
        body["tools"] = case["tools"].clone();
    }
    if case["kwargs"].as_object().is_some_and(|k| !k.is_empty()) {
        body["chat_template_kwargs"] = case["kwargs"].clone();
    }
    body
}

fn template(doc: &Value, name: &str) -> ChatTemplate {
    let t = &doc["templates"][name];
    let source = std::fs::read_to_string(fixtures().join(format!("{name}.jinja")))
        .unwrap_or_else(|e| panic!("{name}.jinja: {e}"));
    let mut tmpl = ChatTemplate::from_source(
        &source,
        t["bos_token"].as_str().unwrap_or_default().into(),
        t["eos_token"].as_str().unwrap_or_default().into(),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    tmpl.set_clock(Clock::Fixed(fixed_now(doc)));
    tmpl
}

#[test]
fn every_template_renders_every_case_as_transformers_does() {
    let doc = load();
    let cases = doc["cases"].as_object().expect("cases");
    let templates = doc["templates"].as_object().expect("templates");
    assert!(templates.len() >= 13, "{} templates", templates.len());
    let mut failures = Vec::new();
    let (mut n, mut same) = (0, 0);
    for (name, t) in templates {
        let tmpl = template(&doc, name);
        for (case_name, case) in cases {
            n += 1;
            let req: ChatRequest =
                parse_body(request_body(case).to_string().as_bytes()).expect("a chat request");
            let messages = normalise_messages(&req.messages).expect("messages");
            let vars = req.template_vars().expect("template variables");
            let agp = case["add_generation_prompt"].as_bool().expect("agp");
            let got = tmpl.render(&messages, &vars, agp);
            let want = &t["results"][case_name];
            match (want.get("prompt").and_then(Value::as_str), got) {
                (Some(w), Ok(g)) if w == g => same += 1,
                (Some(w), Ok(g)) => failures.push(format!(
                    "{name} / {case_name}: differs\n--- transformers\n{w}\n--- coil\n{g}\n---"
                )),
                (Some(_), Err(e)) => {
                    failures.push(format!("{name} / {case_name}: coil failed: {e}"))
                }
                (None, Ok(g)) => failures.push(format!(
                    "{name} / {case_name}: transformers failed ({}), coil rendered\n{g}",
                    want["error"]
                )),
                (None, Err(_)) => {}
            }
        }
    }
    // Most cases render (a few are errors in transformers too).
    assert!(same + failures.len() >= n * 9 / 10, "{same} of {n}");
    assert!(
        failures.is_empty(),
        "{} of {n} renders differ:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
