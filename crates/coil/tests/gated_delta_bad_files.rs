//! A `qwen35` / `qwen3next` GGUF with a missing or mis-shaped tensor, an
//! inconsistent head count or an unknown rope section layout loads with an
//! error naming the key or tensor — never a panic. Each case edits a copy
//! of a parity fixture in memory.

mod common;

use coil::models;
use coil_gguf::gguf::encode_header;
use coil_gguf::{GgufFile, Metadata, TensorSpec, Value, ValueType};
use std::sync::Arc;

/// The fixture `name` with its metadata and tensor list edited, rebuilt in
/// memory (tensor data carried over by name; a reshaped tensor keeps its
/// bytes, cut or zero-padded to its new size).
fn edited(
    name: &str,
    edit_md: impl FnOnce(&mut Metadata),
    edit_tensors: impl FnOnce(&mut Vec<TensorSpec>),
) -> Result<(), String> {
    let f = GgufFile::open(common::tool_fixture(name).model).unwrap();
    let mut md = f.metadata().clone();
    edit_md(&mut md);
    let mut specs: Vec<TensorSpec> = f
        .tensors()
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ty))
        .collect();
    edit_tensors(&mut specs);
    let (mut bytes, sizes) = encode_header(&md, &specs).unwrap();
    for (spec, size) in specs.iter().zip(&sizes) {
        let mut data = match f.tensor_info(&spec.name) {
            Some(t) => f.bytes()[f.data_range(t)].to_vec(),
            None => Vec::new(),
        };
        data.resize(*size as usize, 0);
        bytes.extend_from_slice(&data);
        bytes.resize(bytes.len().div_ceil(32) * 32, 0);
    }
    let file = Arc::new(GgufFile::from_bytes(bytes).map_err(|e| e.to_string())?);
    models::load(file).map(|_| ()).map_err(|e| e.to_string())
}

fn expect_error(what: &str, got: Result<(), String>, needle: &str) {
    match got {
        Ok(()) => panic!("{what}: loaded"),
        Err(e) => assert!(
            e.contains(needle),
            "{what}: error {e:?} does not name {needle:?}"
        ),
    }
}

#[test]
fn unedited_fixtures_load() {
    for name in ["qwen35_tiny", "qwen35moe_tiny", "qwen3next_tiny"] {
        edited(name, |_| {}, |_| {}).unwrap();
    }
}

#[test]
fn missing_tensors_are_named() {
    for (name, tensor) in [
        ("qwen35_tiny", "blk.0.ssm_conv1d.weight"),
        ("qwen35_tiny", "blk.2.ssm_alpha.weight"),
        ("qwen35_tiny", "blk.1.attn_q_norm.weight"),
        ("qwen35_tiny", "blk.3.post_attention_norm.weight"),
        ("qwen3next_tiny", "blk.0.ssm_a"),
        ("qwen3next_tiny", "blk.0.ffn_gate_inp_shexp.weight"),
        ("qwen35moe_tiny", "blk.2.ffn_down_exps.weight"),
    ] {
        let got = edited(name, |_| {}, |t| t.retain(|s| s.name != tensor));
        expect_error(&format!("{name} without {tensor}"), got, tensor);
    }
    // Neither attn_qkv nor the legacy ssm_in.
    let got = edited(
        "qwen3next_tiny",
        |_| {},
        |t| t.retain(|s| s.name != "blk.2.attn_qkv.weight"),
    );
    expect_error("no qkv projection", got, "blk.2.attn_qkv.weight");
}

#[test]
fn mis_shaped_tensors_are_named() {
    for (name, tensor, dims) in [
        ("qwen35_tiny", "blk.0.ssm_conv1d.weight", vec![3u64, 128]),
        ("qwen35_tiny", "blk.0.attn_qkv.weight", vec![64u64, 96]),
        ("qwen35_tiny", "blk.1.attn_q.weight", vec![64u64, 128]),
        ("qwen3next_tiny", "blk.0.ssm_ba.weight", vec![64u64, 4]),
        ("qwen3next_tiny", "blk.3.ssm_norm.weight", vec![8u64]),
    ] {
        let got = edited(
            name,
            |_| {},
            |t| {
                for s in t.iter_mut().filter(|s| s.name == tensor) {
                    s.dims = dims.clone();
                }
            },
        );
        expect_error(&format!("{name} {tensor} as {dims:?}"), got, tensor);
    }
}

#[test]
fn inconsistent_head_counts_are_named() {
    // 3 value heads for 2 key heads.
    let got = edited(
        "qwen35_tiny",
        |m| m.insert("qwen35.ssm.time_step_rank", Value::U32(3)),
        |_| {},
    );
    expect_error("Hv not a multiple of Hk", got, "qwen35.ssm.time_step_rank");
    let got = edited(
        "qwen3next_tiny",
        |m| m.insert("qwen3next.ssm.inner_size", Value::U32(62)),
        |_| {},
    );
    expect_error("inner size", got, "qwen3next.ssm.inner_size");
    let got = edited(
        "qwen3next_tiny",
        |m| m.insert("qwen3next.attention.head_count_kv", Value::U32(3)),
        |_| {},
    );
    expect_error("KV heads", got, "head_count_kv");
    let got = edited(
        "qwen35_tiny",
        |m| {
            m.insert(
                "qwen35.attention.recurrent_layers",
                Value::Array(ValueType::Bool, vec![Value::Bool(true); 2]),
            )
        },
        |_| {},
    );
    expect_error("recurrent flags", got, "qwen35.attention.recurrent_layers");
}

#[test]
fn unknown_rope_sections_are_refused() {
    let sections = |v: &[u32]| {
        Value::Array(
            ValueType::U32,
            v.iter().map(|&x| Value::U32(x)).collect::<Vec<_>>(),
        )
    };
    for bad in [&[2u32, 1, 0, 0][..], &[2, 1, 1, 1], &[4, 4, 4, 0]] {
        let s = sections(bad);
        let got = edited(
            "qwen35_tiny",
            |m| m.insert("qwen35.rope.dimension_sections", s),
            |_| {},
        );
        expect_error(
            &format!("sections {bad:?}"),
            got,
            "qwen35.rope.dimension_sections",
        );
    }
    let got = edited(
        "qwen35moe_tiny",
        |m| {
            m.remove("qwen35moe.rope.dimension_sections");
        },
        |_| {},
    );
    expect_error("no sections", got, "qwen35moe.rope.dimension_sections");
    // Another layout covering the same pairs is the same rotation for text.
    edited(
        "qwen35_tiny",
        |m| m.insert("qwen35.rope.dimension_sections", sections(&[1, 2, 1, 0])),
        |_| {},
    )
    .unwrap();
}
