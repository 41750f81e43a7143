//! The demo model's tokenizer: encoding arbitrary text (special tokens
//! parsed or not) and streaming arbitrary bytes and token ids through the
//! decoder: no panic, and encode → decode gives the text back.
#![no_main]

#[path = "common.rs"]
mod common;

use coil::tokenizer::{EncodeOptions, StreamDecoder, Tokenizer};
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

static TOK: LazyLock<Tokenizer> = LazyLock::new(|| {
    let file = coil_gguf::GgufFile::open(common::demo_path()).expect("demo model");
    Tokenizer::from_gguf(&file).expect("its tokenizer")
});

fuzz_target!(|data: &[u8]| {
    let tok = &*TOK;
    let text = String::from_utf8_lossy(data);
    for parse_special in [false, true] {
        let ids = tok.encode_with(
            &text,
            EncodeOptions {
                add_special: false,
                parse_special,
            },
        );
        if !parse_special {
            // Byte-level BPE: plain text round-trips exactly.
            assert_eq!(tok.decode(&ids), text, "round trip");
        }
    }
    // Arbitrary bytes, and arbitrary ids (in and out of the vocabulary),
    // through the streaming decoder.
    let mut d = StreamDecoder::new();
    let mut out = String::new();
    for chunk in data.chunks(3) {
        out.push_str(&d.push_bytes(chunk));
    }
    let mut d = StreamDecoder::new();
    for pair in data.chunks_exact(2) {
        let id = u16::from_le_bytes([pair[0], pair[1]]) as u32;
        out.push_str(&d.push(tok, id));
    }
    let _ = out;
});
