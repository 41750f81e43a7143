//! A `qwen35` / `qwen3next` GGUF with a missing or mis-shaped tensor, an
//! inconsistent head count or an unknown rope section layout loads with an
//! error naming the key or tensor — never a panic. Each case edits a copy
//! of a parity fixture in memory. Also: an old-style qwen3next file (q, k,
//! v, z fused in `ssm_in`) gives the reference logits.

mod common;

use coil::engine::{Engine, EngineOptions};
use coil::models::{self, LogitRows};
use coil_gguf::gguf::encode_header;
use coil_gguf::{GgufFile, Metadata, TensorSpec, Value, ValueType};
use std::sync::Arc;

/// Tensors as (spec, bytes).
type Tensors = Vec<(TensorSpec, Vec<u8>)>;

/// The fixture `name` with its metadata and tensors edited, rebuilt in
/// memory.
fn rebuilt(
    name: &str,
    edit: impl FnOnce(&mut Metadata, &mut Tensors),
) -> Result<Arc<GgufFile>, String> {
    let f = GgufFile::open(common::tool_fixture(name).model).unwrap();
    let mut md = f.metadata().clone();
    let mut tensors: Tensors = f
        .tensors()
        .iter()
        .map(|t| {
            let spec = TensorSpec::new(t.name.clone(), &t.dims, t.ty);
            (spec, f.bytes()[f.data_range(t)].to_vec())
        })
        .collect();
    edit(&mut md, &mut tensors);
    let specs: Vec<TensorSpec> = tensors.iter().map(|t| t.0.clone()).collect();
    let (mut bytes, sizes) = encode_header(&md, &specs).unwrap();
    for ((_, data), size) in tensors.iter_mut().zip(&sizes) {
        // A reshaped tensor keeps its bytes, cut or zero-padded.
        data.resize(*size as usize, 0);
        bytes.extend_from_slice(data);
        bytes.resize(bytes.len().div_ceil(32) * 32, 0);
    }
    Ok(Arc::new(
        GgufFile::from_bytes(bytes).map_err(|e| e.to_string())?,
    ))
}

/// Loads the fixture with its metadata and tensor list edited.
fn edited(
    name: &str,
    edit_md: impl FnOnce(&mut Metadata),
    edit_tensors: impl FnOnce(&mut Vec<TensorSpec>),
) -> Result<(), String> {
    let file = rebuilt(name, |md, tensors| {
        edit_md(md);
        let mut specs: Vec<TensorSpec> = tensors.iter().map(|t| t.0.clone()).collect();
        edit_tensors(&mut specs);
        let mut old = std::mem::take(tensors);
        for spec in specs {
            let data = match old.iter().position(|t| t.0.name == spec.name) {
                Some(i) => old.swap_remove(i).1,
                None => Vec::new(),
            };
            tensors.push((spec, data));
        }
    })?;
    models::load(file).map(|_| ()).map_err(|e| e.to_string())
}

/// llama.cpp's older qwen3next files hold `ssm_in` (per key head: q, k,
/// the value rows of its value heads, their z rows) instead of `attn_qkv`
/// and `attn_gate`: built here from the fixture's, same logits.
#[test]
fn legacy_fused_ssm_in_matches_the_reference() {
    let (hk, dk, r, dv, d) = (2usize, 16usize, 2usize, 16usize, 64usize);
    let row = d * 4; // bytes of one f32 row
    let file = rebuilt("qwen3next_tiny", |_, tensors| {
        for l in [0, 2, 3] {
            let take = |tensors: &mut Tensors, n: &str| {
                let i = tensors.iter().position(|t| t.0.name == n).unwrap();
                tensors.remove(i).1
            };
            let qkv = take(tensors, &format!("blk.{l}.attn_qkv.weight"));
            let z = take(tensors, &format!("blk.{l}.attn_gate.weight"));
            let rows =
                |m: &[u8], first: usize, n: usize| m[first * row..(first + n) * row].to_vec();
            let mut fused = Vec::new();
            for g in 0..hk {
                fused.extend(rows(&qkv, g * dk, dk)); // q
                fused.extend(rows(&qkv, hk * dk + g * dk, dk)); // k
                fused.extend(rows(&qkv, 2 * hk * dk + g * r * dv, r * dv)); // v
                fused.extend(rows(&z, g * r * dv, r * dv)); // z
            }
            let n_rows = (2 * hk * dk + 2 * hk * r * dv) as u64;
            let spec = TensorSpec::new(
                format!("blk.{l}.ssm_in.weight"),
                &[d as u64, n_rows],
                coil_gguf::GgmlType::F32,
            );
            tensors.push((spec, fused));
        }
    })
    .unwrap();
    assert!(file.tensor_info("blk.0.attn_qkv.weight").is_none());
    let f = common::tool_fixture("qwen3next_tiny");
    let mut e = Engine::from_file(file, EngineOptions::default()).unwrap();
    for ub in [f.tokens.len(), 1] {
        e.mem_clear();
        let got = e.eval(0, &f.tokens, LogitRows::All, ub).unwrap();
        common::assert_parity(&format!("ssm_in, ubatch {ub}"), &got, &f.logits, f.n_vocab);
    }
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
