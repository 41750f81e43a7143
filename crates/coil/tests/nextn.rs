//! Files with a NextN / multi-token-prediction tail (tests/fixtures/nextn/,
//! `tools/make_fixtures_nextn.py`): the tiny models of the other fixtures
//! given an MTP block and converted by llama.cpp's converter with it. The
//! tail is not part of the forward pass: each file's logits are bit for bit
//! those of the same model converted without the tail (the committed
//! trunk-only file), and within the parity bound of transformers'. The
//! tail's weights load and are exposed by `Model::nextn`.

mod common;

use coil::engine::{Engine, EngineOptions};
use coil::models::blocks::stack::{FfnBlock, MixerBlock};
use coil::models::plan::{FeedForward, LayerKind, Mixer};
use coil::models::{LayerPlan, LogitRows};
use coil_gguf::{GgufFile, GgufWriter, TensorSpec, Value};
use common::{assert_parity, llama_cpp_fixture, tool_fixture, Fixture};
use std::path::PathBuf;

#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;

fn tail_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../tests/fixtures/nextn/{name}/model.gguf"))
}

/// (fixture with the tail, the trunk-only fixture, the tail block's kind)
fn cases() -> Vec<(&'static str, Fixture, LayerKind)> {
    let attn = |ffn| LayerKind {
        mixer: Mixer::Attention,
        ffn,
    };
    vec![
        (
            "nemotron_h_moe",
            llama_cpp_fixture("nemotron_h_moe"),
            attn(FeedForward::MoeShared),
        ),
        (
            "qwen35",
            tool_fixture("qwen35_tiny"),
            attn(FeedForward::Dense),
        ),
        (
            "qwen35moe",
            tool_fixture("qwen35moe_tiny"),
            attn(FeedForward::MoeShared),
        ),
        (
            "qwen3next",
            tool_fixture("qwen3next_tiny"),
            attn(FeedForward::MoeShared),
        ),
    ]
}

#[test]
fn the_tail_is_planned_apart_from_the_trunk() {
    for (name, trunk, kind) in cases() {
        let with = LayerPlan::from_gguf(&GgufFile::open(tail_file(name)).unwrap()).unwrap();
        let without = LayerPlan::from_gguf(&GgufFile::open(&trunk.model).unwrap()).unwrap();
        assert_eq!(with.layers, without.layers, "{name}: trunk");
        assert!(without.nextn.is_empty(), "{name}");
        assert_eq!(with.nextn, vec![kind], "{name}: tail");
        assert_eq!(with.n_blocks(), without.layers.len() + 1);
        let text = with.to_string();
        assert!(text.contains("NextN / MTP tail: 1 block"), "{name}: {text}");
    }
}

#[test]
fn the_trunk_runs_exactly_as_without_the_tail() {
    for (name, trunk, _) in cases() {
        let n = trunk.tokens.len();
        let mut with = Engine::load(tail_file(name), EngineOptions::default()).unwrap();
        let mut without = Engine::load(&trunk.model, EngineOptions::default()).unwrap();
        for ub in [n, 1, 7] {
            with.mem_clear();
            without.mem_clear();
            let a = with.eval(0, &trunk.tokens, LogitRows::All, ub).unwrap();
            let b = without.eval(0, &trunk.tokens, LogitRows::All, ub).unwrap();
            assert!(
                a == b,
                "{name}: ubatch {ub}: logits differ from the trunk-only file"
            );
            let rel = assert_parity(
                &format!("{name}: ubatch {ub}"),
                &a,
                &trunk.logits,
                trunk.n_vocab,
            );
            eprintln!("{name}: ubatch {ub}: max rel vs transformers {rel:e}");
        }
    }
}

#[test]
fn the_tail_weights_are_exposed() {
    for (name, trunk, _) in cases() {
        let e = Engine::load(tail_file(name), EngineOptions::default()).unwrap();
        let info = e.model.info();
        let d = info.n_embd;
        let tail = e.model.nextn();
        assert_eq!(tail.len(), 1, "{name}");
        let b = &tail[0];
        assert_eq!(b.index, info.plan.layers.len(), "{name}");
        assert_eq!(
            b.eh_proj.name,
            format!("blk.{}.nextn.eh_proj.weight", b.index)
        );
        assert_eq!((b.eh_proj.rows, b.eh_proj.cols), (d, 2 * d), "{name}");
        assert_eq!((b.enorm.len(), b.hnorm.len()), (d, d), "{name}");
        assert_eq!(b.shared_head_norm.as_ref().map(Vec::len), Some(d), "{name}");
        // The tiny models share the trunk's embedding and output head.
        assert!(
            b.embed_tokens.is_none() && b.shared_head_head.is_none(),
            "{name}"
        );
        assert!(
            matches!(
                b.layer.mixer,
                MixerBlock::Attention(_) | MixerBlock::GatedAttention(_)
            ),
            "{name}: the tail block is an attention layer"
        );
        assert!(!matches!(b.layer.ffn, FfnBlock::None), "{name}");
        assert!(b.layer.ffn_norm.is_some(), "{name}");
        let plain = Engine::load(&trunk.model, EngineOptions::default()).unwrap();
        assert!(plain.model.nextn().is_empty(), "{name}");
    }
}

/// `src` with its metadata changed by `edit`, tensors as they are.
fn edited(
    src: &std::path::Path,
    dst: &std::path::Path,
    edit: impl FnOnce(&mut coil_gguf::Metadata, &str),
) {
    let f = GgufFile::open(src).unwrap();
    let arch = f.architecture().unwrap().to_string();
    let mut md = f.metadata().clone();
    edit(&mut md, &arch);
    let specs: Vec<TensorSpec> = f
        .tensors()
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ty))
        .collect();
    let mut w = GgufWriter::create(dst, &md, &specs).unwrap();
    for t in f.tensors() {
        w.write_tensor_data(&f.bytes()[f.data_range(t)]).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn a_tail_that_leaves_no_trunk_or_lacks_its_tensors_is_refused() {
    let dir = temp_path::TempPath::dir("coil-nextn", "bad");
    let all = dir.join("all.gguf");
    edited(&tail_file("qwen35"), &all, |md, arch| {
        md.insert(format!("{arch}.nextn_predict_layers"), Value::U32(5));
    });
    let err = Engine::load(&all, EngineOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("nextn_predict_layers") && err.contains("leave none"),
        "{err}"
    );

    // Two tail blocks claimed: block 3, an ordinary trunk layer, has no
    // `nextn.eh_proj`.
    let two = dir.join("two.gguf");
    edited(&tail_file("nemotron_h_moe"), &two, |md, arch| {
        md.insert(format!("{arch}.nextn_predict_layers"), Value::U32(2));
    });
    let err = Engine::load(&two, EngineOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("blk.4.nextn.eh_proj.weight"), "{err}");
}
