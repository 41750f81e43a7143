//! `coil serve --spec ngram`: speculation per request inside continuous
//! batching gives every request the text it gets without speculation
//! (greedy), concurrent requests included, and reports the draft counts in
//! the usage and /metrics.

mod common;

use coil::engine::draft::{SpecKind, SpecParams};
use coil::engine::{Engine, EngineOptions};
use coil_server::scheduler::SchedulerConfig;
use common::{start_engine_cfg, start_engine_draft, TestServer};
use serde_json::{json, Value};
use std::path::PathBuf;

fn path(name: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    if name.ends_with("_tiny") {
        return root.join("parity").join(name).join("model.gguf");
    }
    root.join("models").join(name).join("model.f16.gguf")
}

fn server(name: &str, spec: Option<SpecParams>) -> TestServer {
    server_of(path(name), spec)
}

fn server_of(path: PathBuf, spec: Option<SpecParams>) -> TestServer {
    let nextn = spec.is_some_and(|p| p.kind == SpecKind::Nextn);
    let engine = Engine::load(
        path,
        EngineOptions {
            n_threads: 1,
            n_seq_max: 5,
            n_ctx: 512,
            nextn,
            ..Default::default()
        },
    )
    .expect("load");
    start_engine_cfg(
        engine,
        SchedulerConfig {
            parallel: 3,
            prefill_chunk: 64,
            spec,
            ..Default::default()
        },
    )
}

fn complete(s: &TestServer, prompt: &str) -> Value {
    let r = s.post(
        "/v1/completions",
        &json!({"model": "fixture", "prompt": prompt, "max_tokens": 32, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn all_at_once(s: &TestServer, prompts: &[String]) -> Vec<Value> {
    let threads: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (addr, p) = (s.addr, p.clone());
            std::thread::spawn(move || complete(&TestServer { addr }, &p))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn speculating_requests_get_the_plain_text() {
    let prompts: Vec<String> = [
        "one two three one two three one two three",
        "the cat sat on the mat, the cat sat on the",
        "Call me",
        "a b c d a b c d a b c d a b",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Granite-4.0-H (Mamba-2 refolds), Jamba (Mamba-1 replays), Qwen3.5
    // (Gated DeltaNet replays).
    for name in ["granitemoehybrid", "jamba", "qwen35_tiny"] {
        let plain = server(name, None);
        let want: Vec<Value> = prompts.iter().map(|p| complete(&plain, p)).collect();
        let spec = server(
            name,
            Some(SpecParams {
                draft_max: 5,
                ngram_max: 3,
                ..Default::default()
            }),
        );
        let got = all_at_once(&spec, &prompts);
        let (mut drafted, mut accepted) = (0, 0);
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g["choices"][0]["text"], w["choices"][0]["text"], "{name}");
            assert_eq!(
                g["usage"]["completion_tokens"],
                w["usage"]["completion_tokens"]
            );
            assert!(w["usage"].get("completion_tokens_details").is_none());
            if let Some(d) = g["usage"].get("completion_tokens_details") {
                let a = d["accepted_prediction_tokens"].as_u64().unwrap();
                let r = d["rejected_prediction_tokens"].as_u64().unwrap();
                drafted += a + r;
                accepted += a;
            }
        }
        assert!(drafted > 0, "{name}: nothing was drafted");
        let m = spec.metrics();
        assert_eq!(m["coil_spec_draft_tokens_total"], drafted as f64, "{name}");
        assert_eq!(
            m["coil_spec_accepted_tokens_total"], accepted as f64,
            "{name}"
        );
        assert!(m["coil_spec_verifications_total"] > 0.0);
        assert_eq!(plain.metrics()["coil_spec_draft_tokens_total"], 0.0);
    }
}

/// Every kind of draft on every architecture with an MTP block (the
/// fixtures of tests/fixtures/nextn/): n-gram lookups, the model's own MTP
/// block (drafting for every speculating request of a step side by side)
/// and a draft model (another architecture's random weights over the same
/// vocabulary: drafts mostly rejected). Each request gets the plain text,
/// alone or beside others, and again from the prefix cache.
#[test]
fn every_kind_of_draft_on_every_mtp_architecture_gets_the_plain_text() {
    let prompts: Vec<String> = [
        "one two three one two three",
        "the cat sat on the mat",
        "Call me",
        "a b c d a b",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/nextn");
    let load = |file: &PathBuf, nextn: bool| {
        Engine::load(
            file,
            EngineOptions {
                n_threads: 1,
                n_seq_max: 5,
                n_ctx: 512,
                nextn,
                ..Default::default()
            },
        )
        .expect("load")
    };
    // (target, its draft model)
    let cases = [
        ("qwen35", root.join("qwen35moe/model.gguf")),
        ("qwen35moe", root.join("qwen3next/model.gguf")),
        ("qwen3next", root.join("qwen35/model.gguf")),
        ("nemotron_h_moe", path("mamba2")),
    ];
    for (name, draft) in cases {
        let file = root.join(name).join("model.gguf");
        let plain = server_of(file.clone(), None);
        let want: Vec<Value> = prompts.iter().map(|p| complete(&plain, p)).collect();
        for kind in [SpecKind::Ngram, SpecKind::Nextn, SpecKind::Model] {
            let spec = Some(SpecParams {
                kind,
                draft_max: 3,
                ngram_max: 2,
            });
            let cfg = SchedulerConfig {
                parallel: 3,
                prefill_chunk: 64,
                spec,
                ..Default::default()
            };
            let s = match kind {
                SpecKind::Model => {
                    let engine = load(&file, false);
                    let dm =
                        coil::engine::speculative::DraftModel::new(load(&draft, false), &engine)
                            .unwrap();
                    start_engine_draft(engine, dm, cfg)
                }
                _ => server_of(file.clone(), spec),
            };
            for round in 0..2 {
                let got = all_at_once(&s, &prompts);
                for (g, w) in got.iter().zip(&want) {
                    let what = format!("{name}, {kind:?}, round {round}");
                    assert_eq!(g["choices"][0]["text"], w["choices"][0]["text"], "{what}");
                }
            }
            // N-gram drafts need the text to repeat itself, which a random
            // model's may not: only the model-made drafts must exist.
            if !matches!(kind, SpecKind::Ngram) {
                let m = s.metrics();
                assert!(
                    m["coil_spec_draft_tokens_total"] > 0.0,
                    "{name}, {kind:?}: nothing drafted"
                );
                assert!(m["coil_spec_verifications_total"] > 0.0);
            }
        }
    }
}

/// `-md`: a draft model drafts for every speculating request, each in the
/// draft model's sequence of its own id; concurrent requests get the plain
/// text, again from the prefix cache, whether the drafts are kept (the
/// target drafting for itself) or mostly not (Mamba-2's random weights).
#[test]
fn draft_model_requests_get_the_plain_text() {
    let prompts: Vec<String> = [
        "one two three one two three",
        "the cat sat on the mat",
        "Call me",
        "a b c d a b",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let load = |name: &str| {
        Engine::load(
            path(name),
            EngineOptions {
                n_threads: 1,
                n_seq_max: 5,
                n_ctx: 512,
                ..Default::default()
            },
        )
        .expect("load")
    };
    let plain = server("granitemoehybrid", None);
    let want: Vec<Value> = prompts.iter().map(|p| complete(&plain, p)).collect();
    for draft in ["granitemoehybrid", "mamba2"] {
        let engine = load("granitemoehybrid");
        let dm = coil::engine::speculative::DraftModel::new(load(draft), &engine).unwrap();
        let spec = start_engine_draft(
            engine,
            dm,
            SchedulerConfig {
                parallel: 3,
                prefill_chunk: 64,
                spec: Some(SpecParams {
                    kind: SpecKind::Model,
                    draft_max: 3,
                    ngram_max: 1,
                }),
                ..Default::default()
            },
        );
        for round in 0..2 {
            let got = all_at_once(&spec, &prompts);
            for (g, w) in got.iter().zip(&want) {
                let what = format!("{draft}, round {round}");
                assert_eq!(g["choices"][0]["text"], w["choices"][0]["text"], "{what}");
            }
        }
        let m = spec.metrics();
        assert!(
            m["coil_spec_draft_tokens_total"] > 0.0,
            "{draft}: nothing drafted"
        );
        if draft == "granitemoehybrid" {
            assert_eq!(
                m["coil_spec_accepted_tokens_total"], m["coil_spec_draft_tokens_total"],
                "the target drafting for itself"
            );
        }
    }
}
