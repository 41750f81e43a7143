//! Constrained generation on the bundled demo model (a 2048-token
//! vocabulary that writes Shakespeare): the constraint forces valid JSON
//! and every llama.cpp GBNF grammar out of it, and speculative decoding
//! under a constraint (drafts rejected and rolled back) gives the tokens
//! of plain decoding.

use coil::engine::constraint::{ConstraintSpec, Constraints};
use coil::engine::draft::Drafter;
use coil::engine::generate::{generate_constrained, GenerateOptions, StopReason};
use coil::engine::sampling::{Sampler, SamplingParams};
use coil::engine::speculative::Speculator;
use coil::engine::{Engine, EngineOptions};
use coil::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn demo() -> (Engine, Arc<Tokenizer>) {
    let e = Engine::load(
        root().join("models/shakespeare-hybrid-q8_0.gguf"),
        EngineOptions {
            n_threads: 2,
            n_ctx: 1024,
            ..Default::default()
        },
    )
    .unwrap();
    let t = Arc::new(Tokenizer::from_gguf(&e.file).unwrap());
    (e, t)
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..Default::default()
    }
}

/// Generates under `spec` from a fresh sequence; the text and how it ended.
fn run(
    e: &mut Engine,
    t: &Tokenizer,
    cs: &Constraints,
    spec: &ConstraintSpec,
    params: SamplingParams,
    max: usize,
    drafts: Option<&mut Speculator>,
) -> (Vec<u32>, String, StopReason) {
    e.mem_clear();
    let mut c = cs.compile(spec).unwrap();
    let prompt = t.encode("ROMEO:\n", true);
    let opts = GenerateOptions {
        max_tokens: max,
        stop: Vec::new(),
        stop_at_eos: true,
    };
    let mut text = String::new();
    let stats = generate_constrained(
        e,
        t,
        0,
        &prompt,
        &mut Sampler::new(params),
        &opts,
        drafts,
        Some(&mut c),
        |s| {
            text.push_str(s);
            true
        },
    )
    .unwrap();
    (stats.tokens, text, stats.stop)
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "mood": {"enum": ["merry", "sad"]},
            "lines": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2}
        },
        "required": ["name", "age", "mood", "lines"],
        "additionalProperties": false
    })
}

fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let o = v.as_object().unwrap();
    assert_eq!(o.len(), 4, "{text}");
    assert!(
        o["name"].as_str().is_some_and(|s| s.chars().count() <= 12),
        "{text}"
    );
    assert!(o["age"].as_u64().is_some_and(|a| a <= 120), "{text}");
    assert!(o["mood"] == "merry" || o["mood"] == "sad", "{text}");
    let lines = o["lines"].as_array().unwrap();
    assert!(
        lines.len() <= 2
            && lines
                .iter()
                .all(|l| l.as_str().is_some_and(|s| s.chars().count() <= 8)),
        "{text}"
    );
}

#[test]
fn json_schema_and_json_object_force_valid_json() {
    let (mut e, t) = demo();
    let cs = Constraints::new(t.clone()).unwrap();
    let spec = ConstraintSpec::JsonSchema(person_schema());
    for params in [SamplingParams::greedy(), sampled(1), sampled(2), sampled(3)] {
        let (_, text, stop) = run(&mut e, &t, &cs, &spec, params, 200, None);
        assert_eq!(stop, StopReason::Complete, "{text}");
        check_person(&text);
    }
    for params in [SamplingParams::greedy(), sampled(4)] {
        let (_, text, stop) = run(
            &mut e,
            &t,
            &cs,
            &ConstraintSpec::JsonObject,
            params,
            300,
            None,
        );
        if stop != StopReason::Length {
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(v.is_object());
        } else {
            assert!(text.starts_with('{'), "{text}");
        }
    }
}

/// Proposes the continuation of a known output, wrong at every second
/// proposal's last token (`wrong`, a letter: inside a JSON string the
/// constraint allows it, so that verifications end in rejections).
struct Oracle {
    prompt_len: usize,
    want: Vec<u32>,
    calls: usize,
    wrong: u32,
}

impl Drafter for Oracle {
    fn propose(&mut self, history: &[u32], k: usize) -> Vec<u32> {
        self.calls += 1;
        let at = history.len() - self.prompt_len;
        let mut d: Vec<u32> = self.want.iter().skip(at).take(k).copied().collect();
        if self.calls.is_multiple_of(2) {
            if let Some(last) = d.last_mut() {
                if *last != self.wrong {
                    *last = self.wrong;
                }
            }
        }
        d
    }
}

#[test]
fn speculation_under_a_constraint_gives_the_plain_tokens() {
    let (mut e, t) = demo();
    let cs = Constraints::new(t.clone()).unwrap();
    // Mostly a string: where a wrong letter is allowed.
    let spec = ConstraintSpec::JsonSchema(json!({
        "type": "object",
        "properties": {"speech": {"type": "string", "minLength": 40, "maxLength": 80}},
        "required": ["speech"],
        "additionalProperties": false
    }));
    let prompt_len = t.encode("ROMEO:\n", true).len();
    for params in [SamplingParams::greedy(), sampled(5)] {
        let (want, text, _) = run(&mut e, &t, &cs, &spec, params.clone(), 200, None);
        let mut sp = Speculator::new(
            Box::new(Oracle {
                prompt_len,
                want: want.clone(),
                calls: 0,
                wrong: t.encode("e", false)[0],
            }),
            4,
        );
        let (got, text2, _) = run(&mut e, &t, &cs, &spec, params, 200, Some(&mut sp));
        assert_eq!(got, want, "{text} / {text2}");
        let c = sp.counts;
        assert!(c.accepted > 0 && c.accepted < c.drafted, "{c:?} {text}");
    }
}

#[test]
fn every_llama_cpp_grammar_loads_and_constrains() {
    let (mut e, t) = demo();
    let cs = Constraints::new(t.clone()).unwrap();
    let dir = root().join("tests/fixtures/grammars");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|f| f.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gbnf"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 8);
    for path in names {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let src = std::fs::read_to_string(&path).unwrap();
        let spec = ConstraintSpec::Gbnf(src);
        for params in [SamplingParams::greedy(), sampled(11)] {
            let (tokens, text, stop) = run(&mut e, &t, &cs, &spec, params, 48, None);
            assert!(!tokens.is_empty(), "{name}");
            // The output is in the grammar's language (complete when it
            // ended by itself, a prefix when cut at the limit).
            let complete = stop != StopReason::Length;
            let ok = match name.as_str() {
                "json" | "json_arr" if complete => serde_json::from_str::<Value>(&text).is_ok(),
                "json" => text.starts_with('{'),
                "json_arr" => text.starts_with("[\n"),
                "chess" => text.starts_with("1. "),
                "list" => text.starts_with("- ") && text.lines().all(|l| l.starts_with("- ")),
                "english" => text
                    .chars()
                    .all(|c| c.is_ascii_graphic() || " \t\n".contains(c)),
                "japanese" => text.chars().all(|c| !c.is_ascii() || " \t\n".contains(c)),
                "arithmetic" => text.chars().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || "_-+*/()= \t\n".contains(c)
                }),
                "c" => text.is_ascii(),
                other => panic!("no check for {other}"),
            };
            assert!(ok, "{name}: {text:?} ({stop:?})");
        }
    }
}
