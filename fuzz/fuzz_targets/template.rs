//! Chat-template rendering of arbitrary messages: any JSON the request
//! parser lets through (after `normalise_messages`) renders or fails with
//! an error, never a panic — through coil's ChatML fallback (the demo model
//! has no template of its own) and through every real template of the
//! test fixtures (`tests/fixtures/templates/*.jinja`: Granite, Nemotron,
//! Qwen, LFM2), with `tools` and `chat_template_kwargs`.
#![no_main]

#[path = "common.rs"]
mod common;

use coil_server::api::normalise_messages;
use coil_server::template::{ChatTemplate, TemplateVars};
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

static TEMPLATES: LazyLock<Vec<ChatTemplate>> = LazyLock::new(|| {
    let file = coil_gguf::GgufFile::open(common::demo_path()).expect("demo model");
    let tok = coil::tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer");
    let mut all = vec![ChatTemplate::from_gguf(&file, &tok).expect("ChatML")];
    let dir = common::demo_path()
        .parent()
        .and_then(|m| m.parent())
        .expect("repository root")
        .join("tests/fixtures/templates");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/fixtures/templates")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
        .collect();
    paths.sort();
    for p in paths {
        let src = std::fs::read_to_string(&p).expect("template text");
        let t = ChatTemplate::from_source(&src, "<s>".into(), "</s>".into()).expect("compiles");
        all.push(t);
    }
    all
});

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let (messages, vars) = match &v {
        serde_json::Value::Array(m) => (m.clone(), TemplateVars::default()),
        serde_json::Value::Object(o) => {
            let mut vars = TemplateVars::with_tools(o.get("tools").cloned());
            if let Some(serde_json::Value::Object(kw)) = o.get("chat_template_kwargs") {
                vars.kwargs = kw.clone();
            }
            (
                o.get("messages")
                    .and_then(|m| m.as_array())
                    .cloned()
                    .unwrap_or_default(),
                vars,
            )
        }
        _ => return,
    };
    let Ok(messages) = normalise_messages(&messages) else {
        return;
    };
    for t in TEMPLATES.iter() {
        for add in [false, true] {
            let _ = t.render(&messages, &vars, add);
        }
    }
});
