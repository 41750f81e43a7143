//! A `kimi-linear` or `bailingmoe3` GGUF whose MLA ranks or KDA head layout
//! do not match its tensors, or with a tensor missing or mis-shaped, loads
//! with an error naming the key or tensor — never a panic. Each case edits
//! a copy of a parity fixture in memory.

mod common;

use coil_gguf::{Metadata, Value, ValueType};
use common::edit::edited;

fn expect_error(what: &str, got: Result<(), String>, needle: &str) {
    match got {
        Ok(()) => panic!("{what}: loaded"),
        Err(e) => assert!(
            e.contains(needle),
            "{what}: error {e:?} does not name {needle:?}"
        ),
    }
}

fn set(key: &'static str, v: u32) -> impl FnOnce(&mut Metadata) {
    move |m| m.insert(key, Value::U32(v))
}

#[test]
fn unedited_fixtures_load() {
    for name in ["kimi_linear_tiny", "kimi_linear_qlora"] {
        edited(name, |_| {}, |_| {}).unwrap();
    }
}

/// An MLA rank or head width the tensors do not have.
#[test]
fn mla_ranks_that_do_not_match_the_tensors_are_named() {
    let t = "kimi_linear_tiny";
    // kv_lora_rank 20 (the tensors: 24); key_length kept consistent.
    let got = edited(
        t,
        |m| {
            m.insert("kimi-linear.attention.kv_lora_rank", Value::U32(20));
            m.insert("kimi-linear.attention.key_length", Value::U32(28));
        },
        |_| {},
    );
    expect_error("kv_lora_rank", got, "blk.1.attn_kv_a_mqa.weight");
    // The cached row key_length disagreeing with kv_lora_rank + rope.
    let got = edited(t, set("kimi-linear.attention.key_length", 40), |_| {});
    expect_error("key_length", got, "kimi-linear.attention.key_length");
    // Query heads 20 wide (the tensors: 24).
    let got = edited(t, set("kimi-linear.attention.key_length_mla", 20), |_| {});
    expect_error("key_length_mla", got, "blk.1.attn_q.weight");
    let got = edited(t, set("kimi-linear.attention.value_length_mla", 16), |_| {});
    expect_error("value_length_mla", got, "blk.1.attn_v_b.weight");
    // A RoPE part as wide as the whole head, or odd.
    for bad in [24, 7] {
        let got = edited(t, set("kimi-linear.rope.dimension_count", bad), |_| {});
        expect_error("rope lanes", got, "kimi-linear.rope.dimension_count");
    }
    // A query LoRA rank the tensors do not have; a LoRA without its rank.
    let q = "kimi_linear_qlora";
    let got = edited(q, set("kimi-linear.attention.q_lora_rank", 16), |_| {});
    expect_error("q_lora_rank", got, "blk.0.attn_q_a.weight");
    let got = edited(
        q,
        |m| {
            m.remove("kimi-linear.attention.q_lora_rank");
        },
        |_| {},
    );
    expect_error("no q_lora_rank", got, "q_lora_rank");
    let got = edited(
        t,
        |_| {},
        |s| {
            for x in s.iter_mut().filter(|x| x.name == "blk.1.attn_k_b.weight") {
                x.dims = vec![16, 24, 3];
            }
        },
    );
    expect_error("per-head k_b", got, "blk.1.attn_k_b.weight");
}

/// A KDA head count or width the tensors do not have.
#[test]
fn kda_head_layouts_that_do_not_match_the_tensors_are_named() {
    let t = "kimi_linear_tiny";
    let got = edited(t, set("kimi-linear.kda.head_dim", 8), |_| {});
    expect_error("kda.head_dim", got, "blk.0.attn_q.weight");
    // 8 heads of 8: q, k, v keep their width; the per-head decay rates
    // (and the low-rank gates) do not.
    let got = edited(
        t,
        |m| {
            m.insert("kimi-linear.kda.head_dim", Value::U32(8));
            m.insert("kimi-linear.attention.head_count", Value::U32(8));
        },
        |_| {},
    );
    expect_error("heads × width", got, "KDA heads");
    let got = edited(
        t,
        |_| {},
        |s| {
            for x in s.iter_mut().filter(|x| x.name == "blk.2.ssm_a") {
                x.dims = vec![1, 5, 1, 1];
            }
        },
    );
    expect_error("decay rates per head", got, "blk.2.ssm_a");
    let got = edited(t, set("kimi-linear.ssm.conv_kernel", 3), |_| {});
    expect_error("conv window", got, "blk.0.ssm_conv1d_q.weight");
    let got = edited(t, set("kimi-linear.kda.head_dim", 0), |_| {});
    expect_error("zero width", got, "kimi-linear.kda.head_dim");
}

#[test]
fn missing_tensors_and_bad_moe_keys_are_named() {
    for tensor in [
        "blk.0.ssm_conv1d_v.weight",
        "blk.2.ssm_f_b.weight",
        "blk.3.ssm_norm.weight",
        "blk.1.attn_kv_a_norm.weight",
        "blk.1.attn_v_b.weight",
        "blk.2.exp_probs_b.bias",
        "blk.3.ffn_gate_shexp.weight",
    ] {
        let got = edited(
            "kimi_linear_tiny",
            |_| {},
            |t| t.retain(|s| s.name != tensor),
        );
        expect_error(&format!("without {tensor}"), got, tensor);
    }
    let got = edited(
        "kimi_linear_tiny",
        set("kimi-linear.expert_gating_func", 3),
        |_| {},
    );
    expect_error("gating", got, "kimi-linear.expert_gating_func");
    let got = edited(
        "kimi_linear_tiny",
        |m| {
            m.insert("kimi-linear.expert_group_count", Value::U32(3));
            m.insert("kimi-linear.expert_group_used_count", Value::U32(1));
        },
        |_| {},
    );
    expect_error("groups", got, "kimi-linear.expert_group_count");
}

/// Ling 3.0's `bailingmoe3`: the bounded KDA gate's keys, the full-rank
/// gates, MLA's head gate and RoPE, the per-layer clipping limits and the
/// expert groups.
#[test]
fn bailing_hybrid_files_that_do_not_match_are_named() {
    let t = "bailing_hybrid_tiny";
    edited(t, |_| {}, |_| {}).unwrap();
    edited("bailing_hybrid_qlora", |_| {}, |_| {}).unwrap();
    let got = edited(
        t,
        |m| {
            m.remove("bailingmoe3.kda.gate_lower_bound");
        },
        |_| {},
    );
    expect_error("no lower bound", got, "bailingmoe3.kda.gate_lower_bound");
    let got = edited(
        t,
        |m| m.insert("bailingmoe3.kda.gate_lower_bound", Value::F32(2.0)),
        |_| {},
    );
    expect_error("positive bound", got, "bailingmoe3.kda.gate_lower_bound");
    let got = edited(
        t,
        |m| m.insert("bailingmoe3.kda.safe_gate", Value::Bool(false)),
        |_| {},
    );
    expect_error("unbounded gate", got, "bailingmoe3.kda.safe_gate");
    let got = edited(t, set("bailingmoe3.kda.head_dim", 8), |_| {});
    expect_error("kda.head_dim", got, "blk.0.attn_q.weight");
    for tensor in [
        "blk.0.ssm_f_a.weight",
        "blk.1.ssm_g_a.weight",
        "blk.2.attn_gate.weight",
        "blk.4.ffn_up_shexp.weight",
    ] {
        let got = edited(t, |_| {}, |s| s.retain(|x| x.name != tensor));
        expect_error(&format!("without {tensor}"), got, tensor);
    }
    // A low-rank forget gate's shape where the full-rank one belongs.
    let got = edited(
        t,
        |_| {},
        |s| {
            for x in s.iter_mut().filter(|x| x.name == "blk.0.ssm_f_a.weight") {
                x.dims = vec![48, 16];
            }
        },
    );
    expect_error("low-rank f", got, "blk.0.ssm_f_a.weight");
    let got = edited(
        t,
        |m| {
            m.insert("bailingmoe3.attention.kv_lora_rank", Value::U32(20));
            m.insert("bailingmoe3.attention.key_length", Value::U32(28));
        },
        |_| {},
    );
    expect_error("kv_lora_rank", got, "blk.2.attn_kv_a_mqa.weight");
    let got = edited(
        t,
        |m| {
            m.insert(
                "bailingmoe3.rope.dimension_sections",
                Value::Array(ValueType::I32, vec![Value::I32(2); 4]),
            )
        },
        |_| {},
    );
    expect_error("mrope", got, "bailingmoe3.rope.dimension_sections");
    let got = edited(
        t,
        |m| {
            m.insert(
                "bailingmoe3.swiglu_clamp_exp",
                Value::Array(ValueType::F32, vec![Value::F32(1.0); 3]),
            )
        },
        |_| {},
    );
    expect_error("short limits", got, "bailingmoe3.swiglu_clamp_exp");
    // 3 experts per token from 1 group of 2.
    let got = edited(
        t,
        |m| {
            m.insert("bailingmoe3.expert_used_count", Value::U32(3));
            m.insert("bailingmoe3.expert_group_used_count", Value::U32(1));
        },
        |_| {},
    );
    expect_error("groups too few", got, "bailingmoe3.expert_group_used_count");
}
