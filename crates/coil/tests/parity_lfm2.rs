//! LFM2 (`lfm2`) and LFM2-MoE (`lfm2moe`) against transformers' float32
//! logits, on the fixtures `tools/make_fixtures_lfm2.py` writes
//! (tests/fixtures/parity/lfm2_small, lfm2moe_small: tiny random models
//! converted by llama.cpp's own convert_hf_to_gguf.py): max |Δ| ≤ 1e-4 ·
//! max|logit| and the same argmax at every position — whole prompt, token
//! by token, micro-batches of 7, mixed sizes, several sequences in one
//! batch. Then bad files: each error names the key or tensor.

mod common;

use coil::engine::{BatchEntry, Engine, EngineOptions};
use coil::models::LogitRows;
use coil_gguf::{GgufFile, GgufWriter, Metadata, TensorSpec, Value, ValueType};
use common::{assert_parity, tool_fixture};
use std::path::Path;
#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;
use temp_path::TempPath;

const FIXTURES: [&str; 2] = ["lfm2_small", "lfm2moe_small"];

#[test]
fn lfm2_matches_transformers() {
    common::check_parity("lfm2_small", &tool_fixture("lfm2_small"));
}

#[test]
fn lfm2moe_matches_transformers() {
    common::check_parity("lfm2moe_small", &tool_fixture("lfm2moe_small"));
}

#[test]
fn layer_plans_follow_head_count_kv() {
    for (name, pattern, recurrent) in [("lfm2_small", "CC*C*C", 4), ("lfm2moe_small", "C*CC*C", 4)]
    {
        let f = tool_fixture(name);
        let e = Engine::load(&f.model, EngineOptions::default()).unwrap();
        let plan = &e.model.info().plan;
        assert_eq!(plan.pattern(), pattern, "{name}");
        assert_eq!(plan.n_recurrent(), recurrent, "{name}");
        let ffn: Vec<&str> = plan.layers.iter().map(|l| l.ffn.name()).collect();
        if name == "lfm2moe_small" {
            assert_eq!(ffn, ["dense", "dense", "moe", "moe", "moe", "moe"]);
        } else {
            assert!(ffn.iter().all(|f| *f == "dense"));
        }
    }
}

/// Several sequences in one batch, each at its own position (prefixes of
/// the fixture prompt), match transformers' rows for their positions.
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
                    tokens: &t[..5],
                    logits: LogitRows::All,
                },
            ])
            .unwrap();
        assert_parity(
            &format!("{name} seq 0"),
            &got[0],
            &f.logits[20 * v..21 * v],
            v,
        );
        assert_parity(
            &format!("{name} seq 1"),
            &got[1],
            &f.logits[9 * v..30 * v],
            v,
        );
        assert_parity(&format!("{name} seq 2"), &got[2], &f.logits[..5 * v], v);
        // And they continue independently.
        let got = e
            .decode_batch(&[
                BatchEntry {
                    seq: 2,
                    tokens: &t[5..37],
                    logits: LogitRows::All,
                },
                BatchEntry {
                    seq: 0,
                    tokens: &t[21..22],
                    logits: LogitRows::Last,
                },
            ])
            .unwrap();
        assert_parity(&format!("{name} seq 2 on"), &got[0], &f.logits[5 * v..], v);
        assert_parity(
            &format!("{name} seq 0 on"),
            &got[1],
            &f.logits[21 * v..22 * v],
            v,
        );
    }
}

// ---------------------------------------------------------------------------
// Bad files

fn tmp(name: &str) -> TempPath {
    TempPath::new("coil-lfm2-test", name)
}

/// A copy of `src` with its metadata edited and tensors renamed / reshaped
/// (`tensors` maps a name to a new name and new dims, or `None` to drop it).
fn rewrite(
    src: &Path,
    dst: &Path,
    edit_md: impl Fn(&mut Metadata),
    tensors: impl Fn(&str, &[u64]) -> Option<(String, Vec<u64>)>,
) {
    let f = GgufFile::open(src).unwrap();
    let mut md = f.metadata().clone();
    edit_md(&mut md);
    let mut specs = Vec::new();
    let mut datas = Vec::new();
    for t in f.tensors() {
        if let Some((name, dims)) = tensors(&t.name, &t.dims) {
            let data = f.view(t).data;
            let n: u64 = dims.iter().product();
            // Same element type (F32): keep the bytes that fit, pad with 0.
            let mut bytes = data.to_vec();
            bytes.resize(n as usize * 4, 0);
            specs.push(TensorSpec::new(name, &dims, t.ty));
            datas.push(bytes);
        }
    }
    let mut w = GgufWriter::create(dst, &md, &specs).unwrap();
    for d in &datas {
        w.write_tensor_data(d).unwrap();
    }
    w.finish().unwrap();
}

fn load_err(path: &Path) -> String {
    match Engine::load(path, EngineOptions::default()) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => format!("{e:#}"),
    }
}

type MdEdit = Box<dyn Fn(&mut Metadata)>;
type TensorEdit = Box<dyn Fn(&str, &[u64]) -> Option<(String, Vec<u64>)>>;
/// What is broken, how, and what the error must name.
type Case = (&'static str, MdEdit, TensorEdit, &'static str);

fn same(name: &str, dims: &[u64]) -> Option<(String, Vec<u64>)> {
    Some((name.to_string(), dims.to_vec()))
}

#[test]
fn bad_files_get_errors_naming_what_is_wrong() {
    let src = tool_fixture("lfm2moe_small").model;
    const ARCH: &str = "lfm2moe";
    let cases: Vec<Case> = vec![
        (
            "no conv weights",
            Box::new(|_| {}),
            Box::new(|n, d| {
                (n != "blk.2.shortconv.conv.weight")
                    .then(|| same(n, d))
                    .flatten()
            }),
            "blk.2.shortconv.conv.weight",
        ),
        (
            "conv kernel mis-shaped",
            Box::new(|_| {}),
            Box::new(|n, d| {
                if n == "blk.0.shortconv.conv.weight" {
                    Some((n.to_string(), vec![3, d[1]]))
                } else {
                    same(n, d)
                }
            }),
            "blk.0.shortconv.conv.weight",
        ),
        (
            "in_proj mis-shaped",
            Box::new(|_| {}),
            Box::new(|n, d| {
                if n == "blk.3.shortconv.in_proj.weight" {
                    Some((n.to_string(), vec![d[0], d[1] - 1]))
                } else {
                    same(n, d)
                }
            }),
            "blk.3.shortconv.in_proj.weight",
        ),
        (
            "conv kernel 0",
            Box::new(|md| {
                md.insert(format!("{ARCH}.shortconv.l_cache"), Value::U32(0));
            }),
            Box::new(same),
            "lfm2moe.shortconv.l_cache",
        ),
        (
            "no l_cache",
            Box::new(|md| {
                md.remove(&format!("{ARCH}.shortconv.l_cache"));
            }),
            Box::new(same),
            "lfm2moe.shortconv.l_cache",
        ),
        (
            "plan says attention at a conv layer",
            Box::new(|md| {
                let kv = [0, 1, 1, 0, 1, 0].map(Value::I32).to_vec();
                md.insert(
                    format!("{ARCH}.attention.head_count_kv"),
                    Value::Array(ValueType::I32, kv),
                );
            }),
            Box::new(same),
            "blk.2.shortconv.in_proj.weight",
        ),
        (
            "plan says conv at an attention layer",
            Box::new(|md| {
                let kv = [0, 0, 0, 0, 1, 0].map(Value::I32).to_vec();
                md.insert(
                    format!("{ARCH}.attention.head_count_kv"),
                    Value::Array(ValueType::I32, kv),
                );
            }),
            Box::new(same),
            "blk.1.attn_q.weight",
        ),
        (
            "dense layers disagree with the tensors",
            Box::new(|md| {
                md.insert(format!("{ARCH}.leading_dense_block_count"), Value::U32(3));
            }),
            Box::new(same),
            "blk.2.ffn_down.weight",
        ),
        (
            "no expert bias",
            Box::new(|_| {}),
            Box::new(|n, d| {
                (n != "blk.4.exp_probs_b.bias")
                    .then(|| same(n, d))
                    .flatten()
            }),
            "blk.4.exp_probs_b.bias",
        ),
        (
            "no q norm",
            Box::new(|_| {}),
            Box::new(|n, d| {
                (n != "blk.4.attn_q_norm.weight")
                    .then(|| same(n, d))
                    .flatten()
            }),
            "blk.4.attn_q_norm.weight",
        ),
        (
            "no output norm",
            Box::new(|_| {}),
            Box::new(|n, d| {
                (n != "token_embd_norm.weight")
                    .then(|| same(n, d))
                    .flatten()
            }),
            "token_embd_norm.weight",
        ),
    ];
    for (i, (what, md, tensors, want)) in cases.iter().enumerate() {
        let p = tmp(&format!("bad{i}.gguf"));
        rewrite(&src, &p, md, tensors);
        let err = load_err(&p);
        eprintln!("{what}: {err}");
        let _ = std::fs::remove_file(&p);
        assert!(
            err.contains(want),
            "{what}: error {err:?} does not name {want}"
        );
    }
    // The unedited copy loads (the rewrite itself is sound).
    let p = tmp("good.gguf");
    rewrite(&src, &p, |_| {}, same);
    assert!(Engine::load(&p, EngineOptions::default()).is_ok());
    let _ = std::fs::remove_file(&p);
}

/// `expert_weights_norm` false and `expert_weights_scale` (written by coil's
/// converter for checkpoints with `norm_topk_prob` off or a routed scaling
/// factor) change LFM2-MoE's output; the defaults are what the fixture's
/// transformers reference ran.
#[test]
fn expert_weight_keys_are_honoured() {
    let f = tool_fixture("lfm2moe_small");
    let run = |path: &Path| {
        let mut e = Engine::load(path, EngineOptions::default()).unwrap();
        e.eval(0, &f.tokens, LogitRows::All, 0).unwrap()
    };
    for (i, (key, value)) in [
        ("expert_weights_norm", Value::Bool(false)),
        ("expert_weights_scale", Value::F32(2.5)),
        ("expert_weights_scale", Value::F32(1.0)),
    ]
    .into_iter()
    .enumerate()
    {
        let p = tmp(&format!("keys{i}.gguf"));
        rewrite(
            &f.model,
            &p,
            |md| {
                md.insert(format!("lfm2moe.{key}"), value.clone());
            },
            same,
        );
        let got = run(&p);
        let _ = std::fs::remove_file(&p);
        let rel = common::max_rel_diff(&got, &f.logits);
        if value == Value::F32(1.0) {
            assert!(rel < 1e-5, "{key} = 1 changed the logits by {rel}");
        } else {
            assert!(rel > 1e-2, "{key} = {value} left the logits as they were");
        }
    }
}
