//! Zamba2 (`zamba2`: Mamba-2 layers with shared attention + MLP blocks
//! reused at several depths, per-use LoRA adapters, the token embedding
//! concatenated into the shared block's input) against transformers'
//! float32 logits, on the fixtures `tools/make_fixtures_zamba2.py` writes
//! (tests/fixtures/parity/zamba2_tiny, zamba2_plain: tiny random
//! `Zamba2ForCausalLM` checkpoints converted by `coil convert`): max |Δ| ≤
//! 1e-4 · max|logit| and the same argmax at every position — whole prompt,
//! token by token, micro-batches of 7, mixed sizes, several sequences in
//! one batch. Then bad files: each error names the key or tensor, never a
//! panic.

mod common;

use coil::engine::{BatchEntry, Engine, EngineOptions};
use coil::models::LogitRows;
use coil_gguf::{TensorSpec, Value, ValueType};
use common::edit::{drop_tensor, edited, reshape};
use common::{assert_parity, tool_fixture};

const FIXTURES: [&str; 2] = ["zamba2_tiny", "zamba2_plain"];

#[test]
fn zamba2_matches_transformers() {
    common::check_parity("zamba2_tiny", &tool_fixture("zamba2_tiny"));
}

#[test]
fn zamba2_without_attention_adapters_and_rope_matches_transformers() {
    common::check_parity("zamba2_plain", &tool_fixture("zamba2_plain"));
}

#[test]
fn layer_plans_follow_the_shared_block_schedule() {
    for (name, pattern, shared, n_blocks) in [
        (
            "zamba2_tiny",
            "MSMSMSM",
            vec![None, Some(0), None, Some(1), None, Some(0), None],
            2,
        ),
        (
            "zamba2_plain",
            "SMMSM",
            vec![Some(0), None, None, Some(0), None],
            1,
        ),
    ] {
        let f = tool_fixture(name);
        let e = Engine::load(&f.model, EngineOptions::default()).unwrap();
        let plan = &e.model.info().plan;
        assert_eq!(plan.pattern(), pattern, "{name}");
        assert_eq!(plan.shared, shared, "{name}");
        assert_eq!(plan.n_shared_blocks, n_blocks, "{name}");
        assert_eq!(plan.n_recurrent(), pattern.len(), "{name}");
        assert_eq!(plan.n_attention(), pattern.matches('S').count(), "{name}");
        // each use its own attention cells
        let mem = e.model.new_memory(1, 64);
        let kv = mem.kv.as_ref().unwrap();
        for (l, s) in shared.iter().enumerate() {
            assert_eq!(
                kv.layer_bytes_per_token(l) > 0,
                s.is_some(),
                "{name} layer {l}"
            );
        }
    }
}

/// Several sequences in one batch, each at its own position (prefixes of
/// the fixture prompt, past the shared blocks' uses), match
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
    let t = "zamba2_tiny";
    let sched = "zamba2.shared_block_schedule";
    expect_error(
        "a schedule naming a block the file does not have",
        edited(
            t,
            |m| m.insert(sched, i32s(&[-1, 0, -1, 1, -1, 2, -1])),
            none,
        ),
        sched,
    );
    expect_error(
        "a schedule naming a negative block",
        edited(
            t,
            |m| m.insert(sched, i32s(&[-1, 0, -1, 1, -1, -2, -1])),
            none,
        ),
        sched,
    );
    expect_error(
        "a schedule too short",
        edited(t, |m| m.insert(sched, i32s(&[-1, 0, -1])), none),
        sched,
    );
    expect_error(
        "a schedule that is not an array",
        edited(t, |m| m.insert(sched, Value::U32(0)), none),
        sched,
    );
    expect_error(
        "no schedule",
        edited(
            t,
            |m| {
                m.remove(sched);
            },
            none,
        ),
        sched,
    );
    expect_error(
        "no block count",
        edited(
            t,
            |m| {
                m.remove("zamba2.shared_block_count");
            },
            none,
        ),
        "zamba2.shared_block_count",
    );
    expect_error(
        "a block count past the blocks in the file",
        edited(
            t,
            |m| m.insert("zamba2.shared_block_count", Value::U32(3)),
            none,
        ),
        "shared.2.attn_norm.weight",
    );
    expect_error(
        "a use where the layer has no projection back",
        edited(
            t,
            |m| m.insert(sched, i32s(&[0, 0, -1, 1, -1, 0, -1])),
            none,
        ),
        "blk.0.shared_out.weight",
    );
    expect_error(
        "a layer with a use's tensors the schedule skips",
        edited(
            t,
            |m| m.insert(sched, i32s(&[-1, 0, -1, 1, -1, -1, -1])),
            none,
        ),
        "blk.5.shared_out.weight",
    );
    expect_error(
        "a LoRA whose two halves disagree on the rank",
        edited(t, |_| {}, reshape("blk.1.attn_q.weight.lora_b", &[4, 64])),
        "blk.1.attn_q.weight.lora_b",
    );
    expect_error(
        "a LoRA that reads the wrong width",
        edited(t, |_| {}, reshape("blk.3.ffn_up.weight.lora_a", &[16, 8])),
        "blk.3.ffn_up.weight.lora_a",
    );
    expect_error(
        "a LoRA of rank 0",
        edited(t, |_| {}, reshape("blk.3.ffn_up.weight.lora_a", &[32, 0])),
        "blk.3.ffn_up.weight.lora_a",
    );
    expect_error(
        "a LoRA writing the wrong width",
        edited(t, |_| {}, reshape("blk.5.ffn_gate.weight.lora_b", &[8, 32])),
        "blk.5.ffn_gate.weight.lora_b",
    );
    expect_error(
        "one projection's adapter missing",
        edited(t, |_| {}, drop_tensor("blk.5.attn_v.weight.lora_a")),
        "blk.5.attn_v.weight.lora_a",
    );
    expect_error(
        "an adapter's second half missing",
        edited(t, |_| {}, drop_tensor("blk.1.attn_k.weight.lora_b")),
        "blk.1.attn_k.weight.lora_b",
    );
    expect_error(
        "a shared block's projection missing",
        edited(t, |_| {}, drop_tensor("shared.1.attn_k.weight")),
        "shared.1.attn_k.weight",
    );
    expect_error(
        "a shared block's input norm of the model's width",
        edited(t, |_| {}, reshape("shared.0.attn_norm.weight", &[32])),
        "shared.0.attn_norm.weight",
    );
    expect_error(
        "KV heads that do not divide the heads",
        edited(
            t,
            |m| m.insert("zamba2.attention.head_count_kv", Value::U32(3)),
            none,
        ),
        "zamba2.attention.head_count_kv",
    );
    expect_error(
        "a Mamba-2 mixer missing",
        edited(t, |_| {}, drop_tensor("blk.4.ssm_in.weight")),
        "blk.4.ssm_in.weight",
    );
}
