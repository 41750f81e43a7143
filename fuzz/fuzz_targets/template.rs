//! Chat-template rendering of arbitrary messages: any JSON the request
//! parser lets through (after `normalise_messages`) renders or fails with
//! an error, never a panic. The demo model has no template of its own, so
//! this is coil's ChatML fallback (with `tools`); a model's own Jinja
//! template would need a target that loads it.
#![no_main]

#[path = "common.rs"]
mod common;

use coil_server::api::normalise_messages;
use coil_server::template::ChatTemplate;
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

static TEMPLATE: LazyLock<ChatTemplate> = LazyLock::new(|| {
    let file = coil_gguf::GgufFile::open(common::demo_path()).expect("demo model");
    let tok = coil::tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer");
    ChatTemplate::from_gguf(&file, &tok).expect("template")
});

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let (messages, tools) = match &v {
        serde_json::Value::Array(m) => (m.clone(), None),
        serde_json::Value::Object(o) => (
            o.get("messages")
                .and_then(|m| m.as_array())
                .cloned()
                .unwrap_or_default(),
            o.get("tools").cloned(),
        ),
        _ => return,
    };
    let Ok(messages) = normalise_messages(&messages) else {
        return;
    };
    for add in [false, true] {
        let _ = TEMPLATE.render_with_tools(&messages, tools.as_ref(), add);
    }
});
