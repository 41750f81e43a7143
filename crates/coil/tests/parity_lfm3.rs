//! LFM3 (`lfm3`: LFM2's short convolutions with full and sliding-window
//! attention layers, a per-head attention gate and sandwich norms) against
//! transformers' float32 logits, on the fixtures `tools/make_fixtures_lfm3.py`
//! writes (tests/fixtures/parity/lfm3_tiny, lfm3_plain: tiny random
//! `Lfm3ForCausalLM` checkpoints converted by `coil convert`): max |Δ| ≤
//! 1e-4 · max|logit| and the same argmax at every position — whole prompt,
//! token by token, micro-batches of 7, mixed sizes, several sequences in one
//! batch; the sliding windows (5 and 9 tokens) are far shorter than the
//! 37-token prompt. Then bad files: each error names the key or tensor,
//! never a panic.

mod common;

use coil::engine::{BatchEntry, Engine, EngineOptions};
use coil::models::LogitRows;
use coil_gguf::{TensorSpec, Value, ValueType};
use common::edit::{drop_tensor, edited, reshape};
use common::{assert_parity, tool_fixture};

const FIXTURES: [&str; 2] = ["lfm3_tiny", "lfm3_plain"];

#[test]
fn lfm3_matches_transformers() {
    common::check_parity("lfm3_tiny", &tool_fixture("lfm3_tiny"));
}

#[test]
fn lfm3_without_gate_and_sandwich_norms_matches_transformers() {
    common::check_parity("lfm3_plain", &tool_fixture("lfm3_plain"));
}

#[test]
fn layer_plans_follow_head_count_kv() {
    for (name, pattern) in [("lfm3_tiny", "C**C*C"), ("lfm3_plain", "*C*C*")] {
        let f = tool_fixture(name);
        let e = Engine::load(&f.model, EngineOptions::default()).unwrap();
        let plan = &e.model.info().plan;
        assert_eq!(plan.pattern(), pattern, "{name}");
        assert_eq!(plan.n_recurrent(), pattern.matches('C').count(), "{name}");
    }
}

/// Several sequences in one batch, each at its own position (prefixes of
/// the fixture prompt, past the sliding window and inside it), match
/// transformers' rows for their positions, and continue independently.
#[test]
fn several_sequences_in_one_batch_match_transformers() {
    for name in FIXTURES {
        let f = tool_fixture(name);
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
        assert_parity(&format!("{name} seq 0"), &got[0], want(20..21), v);
        assert_parity(&format!("{name} seq 1"), &got[1], want(9..30), v);
        assert_parity(&format!("{name} seq 2"), &got[2], want(0..3), v);
        let got = e
            .decode_batch(&[
                BatchEntry {
                    seq: 2,
                    tokens: &t[3..37],
                    logits: LogitRows::All,
                },
                BatchEntry {
                    seq: 0,
                    tokens: &t[21..22],
                    logits: LogitRows::Last,
                },
            ])
            .unwrap();
        assert_parity(&format!("{name} seq 2 on"), &got[0], want(3..37), v);
        assert_parity(&format!("{name} seq 0 on"), &got[1], want(21..22), v);
    }
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

fn bools(v: &[bool]) -> Value {
    Value::Array(ValueType::Bool, v.iter().map(|&b| Value::Bool(b)).collect())
}

fn i32s(v: &[i32]) -> Value {
    Value::Array(ValueType::I32, v.iter().map(|&x| Value::I32(x)).collect())
}

#[test]
fn unedited_fixtures_load() {
    for name in FIXTURES {
        edited(name, |_| {}, |_| {}).unwrap();
    }
}

#[test]
fn bad_files_get_errors_naming_what_is_wrong() {
    let none = |_: &mut Vec<TensorSpec>| {};
    let t = "lfm3_tiny";
    expect_error(
        "KV heads that do not divide the heads",
        edited(
            t,
            |m| m.insert("lfm3.attention.head_count_kv", i32s(&[0, 3, 3, 0, 3, 0])),
            none,
        ),
        "lfm3.attention.head_count_kv",
    );
    expect_error(
        "a head count the tensors do not have",
        edited(
            t,
            |m| m.insert("lfm3.attention.head_count", Value::U32(2)),
            none,
        ),
        "blk.1.attn_q.weight",
    );
    expect_error(
        "a head dimension the tensors do not have",
        edited(
            t,
            |m| {
                m.insert("lfm3.attention.key_length", Value::U32(8));
                m.insert("lfm3.attention.value_length", Value::U32(8));
                m.insert("lfm3.rope.dimension_count", Value::U32(8));
                m.insert("lfm3.rope.dimension_count_swa", Value::U32(8));
            },
            none,
        ),
        "blk.1.attn_q.weight",
    );
    expect_error(
        "the attention gate with the wrong number of heads",
        edited(t, |_| {}, reshape("blk.2.attn_gate.weight", &[64, 3])),
        "blk.2.attn_gate.weight",
    );
    expect_error(
        "proportional RoPE factors of the wrong length",
        edited(t, |_| {}, reshape("rope_freqs.weight", &[4])),
        "rope_freqs.weight",
    );
    expect_error(
        "a sliding layer that is a conv layer",
        edited(
            t,
            |m| {
                m.insert(
                    "lfm3.attention.sliding_window_pattern",
                    bools(&[true, true, false, false, true, false]),
                )
            },
            none,
        ),
        "lfm3.attention.sliding_window_pattern",
    );
    expect_error(
        "a sliding-window pattern too short",
        edited(
            t,
            |m| {
                m.insert(
                    "lfm3.attention.sliding_window_pattern",
                    bools(&[false, true]),
                )
            },
            none,
        ),
        "lfm3.attention.sliding_window_pattern",
    );
    expect_error(
        "a sliding-window pattern of numbers",
        edited(
            t,
            |m| {
                m.insert(
                    "lfm3.attention.sliding_window_pattern",
                    i32s(&[0, 1, 0, 0, 1, 0]),
                )
            },
            none,
        ),
        "lfm3.attention.sliding_window_pattern",
    );
    expect_error(
        "no window size",
        edited(
            t,
            |m| {
                m.remove("lfm3.attention.sliding_window");
            },
            none,
        ),
        "lfm3.attention.sliding_window",
    );
    expect_error(
        "a window of 0",
        edited(
            t,
            |m| m.insert("lfm3.attention.sliding_window", Value::U32(0)),
            none,
        ),
        "lfm3.attention.sliding_window",
    );
    expect_error(
        "a rotary width beyond the head",
        edited(
            t,
            |m| m.insert("lfm3.rope.dimension_count_swa", Value::U32(18)),
            none,
        ),
        "lfm3.rope.dimension_count_swa",
    );
    expect_error(
        "one sandwich norm without the other",
        edited(t, |_| {}, drop_tensor("blk.3.post_ffw_norm.weight")),
        "blk.3.post_ffw_norm.weight",
    );
    expect_error(
        "plan says attention at a conv layer",
        edited(
            t,
            |m| m.insert("lfm3.attention.head_count_kv", i32s(&[2, 2, 2, 0, 2, 0])),
            none,
        ),
        "blk.0.shortconv.in_proj.weight",
    );
    expect_error(
        "plan says conv at an attention layer",
        edited(
            t,
            |m| m.insert("lfm3.attention.head_count_kv", i32s(&[0, 2, 0, 0, 2, 0])),
            none,
        ),
        "blk.2.attn_q.weight",
    );
    expect_error(
        "no conv kernel",
        edited(t, |_| {}, drop_tensor("blk.5.shortconv.conv.weight")),
        "blk.5.shortconv.conv.weight",
    );
    expect_error(
        "no k norm",
        edited(t, |_| {}, drop_tensor("blk.4.attn_k_norm.weight")),
        "blk.4.attn_k_norm.weight",
    );
    expect_error(
        "no feed-forward",
        edited(
            t,
            |_| {},
            |s| s.retain(|t| !t.name.starts_with("blk.3.ffn_")),
        ),
        "blk.3.ffn_down.weight",
    );
    expect_error(
        "no output norm",
        edited(t, |_| {}, drop_tensor("token_embd_norm.weight")),
        "token_embd_norm.weight",
    );
}
