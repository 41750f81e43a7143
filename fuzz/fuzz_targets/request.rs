//! The server's request parsing on arbitrary bodies: both endpoints'
//! request types, message normalisation and sampling validation (against
//! the demo model's tokenizer: logit biases, DRY breakers, stops) return
//! OpenAI errors (4xx), never panic.
#![no_main]

#[path = "common.rs"]
mod common;

use coil::tokenizer::Tokenizer;
use coil_server::api::{
    normalise_messages, parse_body, ChatRequest, CompletionRequest, Sampling, SamplingContext,
};
use libfuzzer_sys::fuzz_target;
use std::sync::{LazyLock, OnceLock};

static TOK: LazyLock<Tokenizer> = LazyLock::new(|| {
    let file = coil_gguf::GgufFile::open(common::demo_path()).expect("demo model");
    Tokenizer::from_gguf(&file).expect("its tokenizer")
});

fn validate(s: &Sampling) {
    let breakers = OnceLock::new();
    let cx = SamplingContext {
        tokenizer: &TOK,
        n_ctx: 4096,
        default_breakers: &breakers,
    };
    if let Err(e) = s.params(&cx) {
        assert_eq!(e.status, 400);
    }
}

fuzz_target!(|data: &[u8]| {
    match parse_body::<CompletionRequest>(data) {
        Ok(r) => {
            validate(&r.sampling);
            let _ = r.sampling.stops();
        }
        Err(e) => assert_eq!(e.status, 400),
    }
    match parse_body::<ChatRequest>(data) {
        Ok(r) => {
            if let Err(e) = normalise_messages(&r.messages) {
                assert_eq!(e.status, 400);
            }
            validate(&r.sampling);
        }
        Err(e) => assert_eq!(e.status, 400),
    }
});
