//! `coil serve --state-type bf16 [--cache-type f16]`: continuous batching
//! and the prefix cache with the recurrent state stored in bf16 (and the
//! attention cells in f16) give each prompt what it gets alone (greedy),
//! and cached prompts are resumed, not re-processed.

mod common;

use coil::engine::{Engine, EngineOptions};
use coil::memory::{CacheType, StateType};
use common::{fixture, start_engine, TestServer};
use serde_json::{json, Value};
use std::path::PathBuf;

fn model(arch: &str) -> PathBuf {
    if arch.ends_with("_tiny") {
        return PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/parity")
            .join(arch)
            .join("model.gguf");
    }
    fixture(arch)
}

fn start_bf16(arch: &str, parallel: usize, cache: usize, cells: CacheType) -> TestServer {
    let mut engine = Engine::load(
        model(arch),
        EngineOptions {
            n_threads: 1,
            n_seq_max: parallel + cache,
            n_ctx: 256,
            ..Default::default()
        },
    )
    .expect("load");
    engine.set_state_type(StateType::Bf16);
    engine.set_cache_type(cells);
    start_engine(engine, parallel)
}

fn complete(s: &TestServer, prompt: &str) -> Value {
    let r = s.post(
        "/v1/completions",
        &json!({"model": "fixture", "prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn bf16_state_batched_and_cached_requests_match_alone() {
    let runs = [
        ("mamba2", CacheType::F32),
        ("granitemoehybrid", CacheType::F32),
        ("granitemoehybrid", CacheType::F16),
        ("jamba", CacheType::F16),
        ("qwen35_tiny", CacheType::F16),
    ];
    for (arch, cells) in runs {
        let prompts = [
            "Once upon a time there was",
            "Once upon a time",
            "Call me Ishmael",
        ];
        let alone: Vec<String> = prompts
            .iter()
            .map(|p| {
                let s = start_bf16(arch, 1, 0, cells);
                complete(&s, p)["choices"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        let s = start_bf16(arch, 3, 3, cells);
        for round in 0..2 {
            let threads: Vec<_> = prompts
                .iter()
                .map(|p| {
                    let addr = s.addr;
                    let p = p.to_string();
                    std::thread::spawn(move || complete(&TestServer { addr }, &p))
                })
                .collect();
            for (i, t) in threads.into_iter().enumerate() {
                let v = t.join().unwrap();
                let text = v["choices"][0]["text"].as_str().unwrap();
                assert_eq!(text, alone[i], "{arch} round {round} prompt {i}");
                let u = &v["usage"];
                let (p, cached) = (
                    u["prompt_tokens"].as_u64().unwrap(),
                    u["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap(),
                );
                if round == 1 {
                    assert_eq!(cached, p - 1, "{arch} prompt {i}: resumed from the cache");
                }
            }
        }
    }
}
