//! The server's request parsing on arbitrary bodies: both endpoints'
//! request types, message normalisation and sampling validation return
//! OpenAI errors (4xx), never panic.
#![no_main]

use coil_server::api::{normalise_messages, parse_body, ChatRequest, CompletionRequest};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse_body::<CompletionRequest>(data) {
        Ok(r) => {
            if let Err(e) = r.sampling.params() {
                assert_eq!(e.status, 400);
            }
            let _ = r.sampling.stops();
        }
        Err(e) => assert_eq!(e.status, 400),
    }
    match parse_body::<ChatRequest>(data) {
        Ok(r) => {
            if let Err(e) = normalise_messages(&r.messages) {
                assert_eq!(e.status, 400);
            }
            if let Err(e) = r.sampling.params() {
                assert_eq!(e.status, 400);
            }
        }
        Err(e) => assert_eq!(e.status, 400),
    }
});
