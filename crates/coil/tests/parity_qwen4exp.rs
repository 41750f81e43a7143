//! Qwen4-Exp (`qwen4exp`: Gated DeltaNet and indexed attention layers under
//! gated hyper-connections, a hashed n-gram per-layer embedding, mixtures
//! of experts) against transformers' float32 logits, on the fixture
//! `tools/make_fixtures_qwen4exp.py` writes (tests/fixtures/parity/
//! qwen4exp_tiny: a tiny random `Qwen4ExpForCausalLM` converted by
//! llama.cpp's own converter): max |Δ| ≤ 1e-4 · max|logit| and the same
//! argmax at every position — whole prompt, token by token, micro-batches
//! of 7, mixed sizes, several sequences in one batch. The indexer keeps 2
//! blocks of 4 tokens (plus the query's tail) of up to 10 on the 40-token
//! prompt, and the prompt holds end-of-text tokens, where the n-gram hash
//! restarts. Then bad files: each error names the key or tensor, never a
//! panic.

mod common;

use coil::engine::{BatchEntry, Engine, EngineOptions};
use coil::models::LogitRows;
use coil_gguf::{Metadata, TensorSpec, Value, ValueType};
use common::edit::{drop_tensor, edited, reshape};
use common::{assert_parity, tool_fixture};

const FIXTURE: &str = "qwen4exp_tiny";

#[test]
fn qwen4exp_matches_transformers() {
    common::check_parity(FIXTURE, &tool_fixture(FIXTURE));
}

#[test]
fn layer_plan_follows_recurrent_layers() {
    let f = tool_fixture(FIXTURE);
    let e = Engine::load(&f.model, EngineOptions::default()).unwrap();
    assert_eq!(e.model.info().plan.pattern(), "D*DD*");
}

/// Several sequences in one batch, each at its own position (prefixes of
/// the fixture prompt, short of the indexer's budget and past it), match
/// transformers' rows for their positions, and continue independently.
#[test]
fn several_sequences_in_one_batch_match_transformers() {
    let f = tool_fixture(FIXTURE);
    let v = f.n_vocab;
    let opts = EngineOptions {
        n_seq_max: 3,
        n_ubatch: 16,
        ..Default::default()
    };
    let mut e = Engine::load(&f.model, opts).unwrap();
    let t = &f.tokens;
    e.eval(0, &t[..20], LogitRows::None, 0).unwrap();
    e.eval(1, &t[..9], LogitRows::None, 0).unwrap();
    let got = e
        .decode_batch(&[
            BatchEntry {
                seq: 0,
                tokens: &t[20..21],
                logits: LogitRows::All,
            },
            BatchEntry {
                seq: 1,
                tokens: &t[9..30],
                logits: LogitRows::All,
            },
            BatchEntry {
                seq: 2,
                tokens: &t[..3],
                logits: LogitRows::All,
            },
        ])
        .unwrap();
    let want = |r: std::ops::Range<usize>| &f.logits[r.start * v..r.end * v];
    assert_parity("seq 0", &got[0], want(20..21), v);
    assert_parity("seq 1", &got[1], want(9..30), v);
    assert_parity("seq 2", &got[2], want(0..3), v);
    let n = t.len();
    let got = e
        .decode_batch(&[
            BatchEntry {
                seq: 2,
                tokens: &t[3..n],
                logits: LogitRows::All,
            },
            BatchEntry {
                seq: 0,
                tokens: &t[21..22],
                logits: LogitRows::Last,
            },
        ])
        .unwrap();
    assert_parity("seq 2 on", &got[0], want(3..n), v);
    assert_parity("seq 0 on", &got[1], want(21..22), v);
}

// ---------------------------------------------------------------------------
// Bad files

fn expect_error(what: &str, got: Result<(), String>, needle: &str) {
    match got {
        Ok(()) => panic!("{what}: loaded"),
        Err(e) => {
            eprintln!("{what}: {e}");
            assert!(
                e.contains(needle),
                "{what}: error {e:?} does not name {needle:?}"
            )
        }
    }
}

fn i32s(v: &[i32]) -> Value {
    Value::Array(ValueType::I32, v.iter().map(|&x| Value::I32(x)).collect())
}

#[test]
fn unedited_fixture_loads() {
    edited(FIXTURE, |_| {}, |_| {}).unwrap();
}

fn u64s(v: &[u64]) -> Value {
    Value::Array(ValueType::U64, v.iter().map(|&x| Value::U64(x)).collect())
}

#[test]
fn bad_files_get_errors_naming_what_is_wrong() {
    let none = |_: &mut Vec<TensorSpec>| {};
    let t = FIXTURE;
    let set = |k: &'static str, v: Value| move |m: &mut Metadata| m.insert(k, v);
    expect_error(
        "one hyper-connection stream",
        edited(
            t,
            set("qwen4exp.hyper_connection.count", Value::U32(1)),
            none,
        ),
        "qwen4exp.hyper_connection.count",
    );
    expect_error(
        "a hyper-connection count the tensors do not have",
        edited(
            t,
            set("qwen4exp.hyper_connection.count", Value::U32(3)),
            none,
        ),
        "blk.0.ple_key.weight",
    );
    expect_error(
        "no hyper-connection rank",
        edited(
            t,
            |m| {
                m.remove("qwen4exp.hyper_connection.low_rank");
            },
            none,
        ),
        "qwen4exp.hyper_connection.low_rank",
    );
    expect_error(
        "a mixer's down projection of the wrong rank",
        edited(t, |_| {}, reshape("blk.0.hc_attn_down.weight", &[256, 8])),
        "blk.0.hc_attn_down.weight",
    );
    expect_error(
        "no final mixer",
        edited(t, |_| {}, drop_tensor("output_hc_up.weight")),
        "output_hc_up.weight",
    );
    expect_error(
        "compression ratios of the wrong length",
        edited(
            t,
            set("qwen4exp.attention.compress_ratios", i32s(&[0, 4, 0])),
            none,
        ),
        "qwen4exp.attention.compress_ratios",
    );
    expect_error(
        "no indexer key length",
        edited(
            t,
            |m| {
                m.remove("qwen4exp.attention.indexer.key_length");
            },
            none,
        ),
        "qwen4exp.attention.indexer.key_length",
    );
    expect_error(
        "an indexer budget of part of a block",
        edited(
            t,
            set("qwen4exp.attention.indexer.top_k", Value::U32(6)),
            none,
        ),
        "qwen4exp.attention.indexer.top_k",
    );
    expect_error(
        "an indexer head narrower than the rotation",
        edited(
            t,
            set("qwen4exp.attention.indexer.key_length", Value::U32(4)),
            none,
        ),
        "qwen4exp.attention.indexer.key_length",
    );
    expect_error(
        "an indexer query projection of the wrong width",
        edited(t, |_| {}, reshape("blk.1.indexer.q_proj.weight", &[64, 48])),
        "blk.1.indexer.q_proj.weight",
    );
    expect_error(
        "a PLE layer that is an attention layer",
        edited(t, set("qwen4exp.ple.layers", i32s(&[1])), none),
        "qwen4exp.ple.layers",
    );
    expect_error(
        "two PLE layers",
        edited(t, set("qwen4exp.ple.layers", i32s(&[0, 2])), none),
        "qwen4exp.ple.layers",
    );
    expect_error(
        "a PLE layer out of range",
        edited(t, set("qwen4exp.ple.layers", i32s(&[9])), none),
        "qwen4exp.ple.layers",
    );
    expect_error(
        "too few head vocabulary sizes",
        edited(
            t,
            set("qwen4exp.ple.head_vocab_sizes", u64s(&[23, 29])),
            none,
        ),
        "qwen4exp.ple.head_vocab_sizes",
    );
    expect_error(
        "a head with no rows",
        edited(
            t,
            set(
                "qwen4exp.ple.head_vocab_sizes",
                u64s(&[23, 29, 31, 0, 41, 43, 47, 53]),
            ),
            none,
        ),
        "qwen4exp.ple.head_vocab_sizes",
    );
    expect_error(
        "too few hash multipliers",
        edited(
            t,
            set("qwen4exp.ple.layer_multipliers", u64s(&[3, 5])),
            none,
        ),
        "qwen4exp.ple.layer_multipliers",
    );
    expect_error(
        "an n-gram table too short for its heads",
        edited(t, |_| {}, reshape("per_layer_token_embd.weight", &[8, 200])),
        "per_layer_token_embd.weight",
    );
    expect_error(
        "no n-gram table",
        edited(t, |_| {}, drop_tensor("per_layer_token_embd.weight")),
        "per_layer_token_embd.weight",
    );
    expect_error(
        "a PLE convolution of the wrong length",
        edited(t, |_| {}, reshape("blk.0.ple_conv1d.weight", &[3, 256])),
        "blk.0.ple_conv1d.weight",
    );
    expect_error(
        "a PLE key projection of the wrong width",
        edited(t, |_| {}, reshape("blk.0.ple_key.weight", &[64, 128])),
        "blk.0.ple_key.weight",
    );
    expect_error(
        "no rope sections",
        edited(
            t,
            |m| {
                m.remove("qwen4exp.rope.dimension_sections");
            },
            none,
        ),
        "qwen4exp.rope.dimension_sections",
    );
}
