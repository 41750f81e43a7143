//! The tool-call and reasoning parser (`template::tool_calls`) on arbitrary
//! model output, in every format it knows, with and without tools and an
//! open `<think>` block in the prompt: no panic; the output fed in pieces
//! (sizes the input picks, cut at char boundaries) parses as it does whole;
//! every call's `arguments` is a JSON object's text; with nothing to parse
//! the text comes back unchanged. `fuzz/dicts/tool_calls.dict` has the
//! markers.
#![no_main]

use coil_server::template::tool_calls::{collect, OutputFormat, StreamParser, ToolSyntax};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use std::sync::LazyLock;

static TOOLS: LazyLock<Value> = LazyLock::new(|| {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                           "temp": {"type": "number"}, "ok": {"type": "boolean"},
                           "opts": {"type": "object"}, "list": {"type": "array"}}}}},
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ])
});

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let syntax = [
        ToolSyntax::None,
        ToolSyntax::ToolCallTag,
        ToolSyntax::Granite3,
        ToolSyntax::NemotronV2,
        ToolSyntax::Lfm2,
    ][(sel % 5) as usize];
    let format = OutputFormat {
        tools: syntax,
        think: sel & 8 != 0,
    };
    let tools = (sel & 16 == 0).then_some(&*TOOLS);
    let prompt = if sel & 32 != 0 { "<|im_start|>assistant\n<think>\n" } else { "" };
    let text = String::from_utf8_lossy(rest);

    let mut p = StreamParser::new(format, prompt, tools);
    let active = p.is_active();
    let mut whole = p.push(&text);
    whole.extend(p.finish());
    let want = collect(whole);

    // the same text in pieces of 1 to 8 bytes, sizes from the text's bytes
    let mut p = StreamParser::new(format, prompt, tools);
    let mut deltas = Vec::new();
    let (mut i, mut k) = (0, 0);
    while i < text.len() {
        let step = 1 + (rest.get(k).copied().unwrap_or(sel) % 8) as usize;
        k += 1;
        let mut j = (i + step).min(text.len());
        while !text.is_char_boundary(j) {
            j += 1;
        }
        deltas.extend(p.push(&text[i..j]));
        i = j;
    }
    deltas.extend(p.finish());
    assert_eq!(collect(deltas), want, "pieces differ from whole: {text:?}");

    for c in &want.tool_calls {
        let v: Value = serde_json::from_str(&c.arguments)
            .unwrap_or_else(|e| panic!("arguments {:?} not JSON: {e}", c.arguments));
        assert!(v.is_object(), "arguments {:?} not an object", c.arguments);
    }
    if !active {
        assert_eq!(want.content.as_deref().unwrap_or(""), text, "inactive parser changed the text");
    }
});
