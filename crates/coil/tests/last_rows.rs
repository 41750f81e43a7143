//! A prompt whose logits are asked for its last token only: the last
//! layer then computes the queries and outputs of that token alone (its
//! attention mixer) while caching every token's keys and values. The
//! logits, and those of the tokens decoded after it, equal the full
//! computation's (1e-5 of the largest logit); so do a prompt asking for no
//! row, and several sequences in one batch, some asking for every row and
//! some for none.

use coil::engine::{BatchEntry, Engine, EngineOptions};
use coil::models::plan::Mixer;
use coil::models::LogitRows;
use coil_gguf::{GgufFile, GgufWriter, TensorSpec, Value};
use std::path::{Path, PathBuf};

mod common;
#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;

/// Fixtures whose last layer is an attention mixer.
const ATTENTION_LAST: [&str; 2] = ["jamba_small", "bamba_partial_rope"];
/// Fixtures whose second layer is a gated attention mixer: their first
/// two layers make a model that ends in one.
const GATED_SECOND: [&str; 3] = ["qwen35_tiny", "qwen35moe_tiny", "qwen3next_tiny"];
/// Fixtures with a latent-attention (MLA) layer at the given place: their
/// layers up to it make a model that ends in one.
const MLA_AT: [(&str, usize); 3] = [
    ("kimi_linear_tiny", 1),
    ("kimi_linear_qlora", 0),
    ("bailing_hybrid_qlora", 1),
];

/// `src` cut to its first `n` layers (`{arch}.block_count` and the per-layer
/// arrays shortened, later layers' tensors dropped), written to `dst`.
fn first_layers(src: &Path, n: usize, dst: &Path) {
    let f = GgufFile::open(src).unwrap();
    let arch = f.architecture().unwrap().to_string();
    let mut md = f.metadata().clone();
    let per_layer: Vec<(String, Value)> = md
        .iter()
        .filter(|(k, _)| k.starts_with(&format!("{arch}.")))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let n_layer = md.get_u64(&format!("{arch}.block_count")).unwrap() as usize;
    for (k, v) in per_layer {
        if let Value::Array(ty, items) = v {
            // (rope.dimension_sections is not per layer, whatever its length)
            if items.len() == n_layer && !k.contains(".rope.") {
                md.insert(k, Value::Array(ty, items[..n].to_vec()));
            }
        }
    }
    md.insert(format!("{arch}.block_count"), Value::U32(n as u32));
    let keep = |name: &str| match name.strip_prefix("blk.") {
        Some(rest) => rest.split('.').next().unwrap().parse::<usize>().unwrap() < n,
        None => true,
    };
    let infos: Vec<_> = f.tensors().iter().filter(|t| keep(&t.name)).collect();
    let specs: Vec<TensorSpec> = infos
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ty))
        .collect();
    let mut w = GgufWriter::create(dst, &md, &specs).unwrap();
    for t in infos {
        w.write_tensor_data(&f.bytes()[f.data_range(t)]).unwrap();
    }
    w.finish().unwrap();
}

fn engine(model: &std::path::Path) -> Engine {
    let opts = EngineOptions {
        n_seq_max: 4,
        ..EngineOptions::default()
    };
    Engine::load(model, opts).unwrap()
}

#[test]
fn last_row_logits_equal_the_full_computation() {
    let dir = temp_path::TempPath::dir("coil-last-rows", "models");
    let mut models: Vec<(String, PathBuf, Vec<u32>)> = Vec::new();
    for name in ATTENTION_LAST {
        let f = common::tool_fixture(name);
        models.push((name.into(), f.model, f.tokens));
    }
    for name in GATED_SECOND {
        let f = common::tool_fixture(name);
        let cut = dir.join(format!("{name}-2.gguf"));
        first_layers(&f.model, 2, &cut);
        models.push((format!("{name} (2 layers)"), cut, f.tokens));
    }
    for (name, at) in MLA_AT {
        let f = common::tool_fixture(name);
        let cut = dir.join(format!("{name}-{}.gguf", at + 1));
        first_layers(&f.model, at + 1, &cut);
        models.push((format!("{name} ({} layers)", at + 1), cut, f.tokens));
    }
    for (name, model, tokens) in &models {
        let mut e = engine(model);
        let v = e.n_vocab();
        let last_layer = e.model.info().plan.layers.last().unwrap().mixer;
        assert!(
            matches!(last_layer, Mixer::Attention | Mixer::Mla),
            "{name}: last layer {last_layer:?}"
        );
        let (prompt, next) = tokens.split_at(tokens.len() - 3);
        let all = e.eval(0, prompt, LogitRows::All, 0).unwrap();
        let then_all = e.eval(0, next, LogitRows::All, 0).unwrap();
        e.seq_clear(0).unwrap();
        let last = e.eval(0, prompt, LogitRows::Last, 0).unwrap();
        let then_last = e.eval(0, next, LogitRows::All, 0).unwrap();
        let what = format!("{name}: last row");
        common::assert_close(&what, &last, &all[all.len() - v..], 1e-5);
        let what = format!("{name}: tokens after it");
        common::assert_close(&what, &then_last, &then_all, 1e-5);
        // No row at all (a server's prompt chunk before the last).
        e.seq_clear(0).unwrap();
        assert!(e.eval(0, prompt, LogitRows::None, 0).unwrap().is_empty());
        let then_none = e.eval(0, next, LogitRows::All, 0).unwrap();
        let what = format!("{name}: tokens after a prompt without logits");
        common::assert_close(&what, &then_none, &then_all, 1e-5);

        // One batch: the last row of one prompt, every row of another, no
        // row of a third; then each sequence's next token.
        let (a, b, c) = (&prompt[..20], &prompt[5..], &prompt[..9]);
        let want_a = e.eval(1, a, LogitRows::All, 0).unwrap();
        let want_b = e.eval(2, b, LogitRows::All, 0).unwrap();
        for s in 1..3 {
            e.seq_clear(s).unwrap();
        }
        let entry = |seq, tokens, logits| BatchEntry {
            seq,
            tokens,
            logits,
        };
        let got = e
            .decode_batch(&[
                entry(1, a, LogitRows::Last),
                entry(2, b, LogitRows::All),
                entry(3, c, LogitRows::None),
            ])
            .unwrap();
        let what = format!("{name}: batch, last row");
        common::assert_close(&what, &got[0], &want_a[want_a.len() - v..], 1e-5);
        common::assert_close(&format!("{name}: batch, every row"), &got[1], &want_b, 1e-5);
        assert!(got[2].is_empty(), "{name}: rows nobody asked for");
        let step = e.eval(3, &next[..1], LogitRows::All, 0).unwrap();
        let mut e2 = engine(model);
        let mut full = c.to_vec();
        full.push(next[0]);
        let want = e2.eval(0, &full, LogitRows::All, 0).unwrap();
        let what = format!("{name}: after a batch without its rows");
        common::assert_close(&what, &step, &want[want.len() - v..], 1e-5);
    }
}
