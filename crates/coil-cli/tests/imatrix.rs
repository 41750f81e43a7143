//! `coil imatrix`: llama-imatrix's statistics in its file formats (GGUF and
//! legacy `.dat`), per expert for expert tensors.

use coil_convert::imatrix::Imatrix;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn text() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/shakespeare_val_slice.txt")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coil-imatrix-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn imatrix(model: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_coil"))
        .arg("imatrix")
        .arg("-m")
        .arg(model)
        .arg("-f")
        .arg(text())
        .arg("-o")
        .arg(out)
        .args(["-t", "2"])
        .args(extra)
        .output()
        .expect("run coil")
}

#[test]
fn demo_model_statistics() {
    let model = repo().join("models/shakespeare-hybrid-q8_0.gguf");
    let out = scratch("demo.gguf");
    let r = imatrix(&model, &out, &["-c", "64", "--chunks", "3"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let m = Imatrix::read(&out).unwrap();
    assert!(!m.legacy);
    assert_eq!((m.chunk_count, m.chunk_size), (3, 64));
    assert_eq!(m.datasets, [text().display().to_string()]);
    // every weight matrix of the 4 layers (Mamba-2 and attention layers,
    // gated feed-forward), each over all 3 × 64 tokens
    let file = coil_gguf::GgufFile::open(&model).unwrap();
    for t in file.tensors() {
        let matrix = t.name.starts_with("blk.")
            && t.name.ends_with(".weight")
            && !t.name.contains("conv1d")
            && !t.name.contains("_norm");
        assert_eq!(m.entries.contains_key(&t.name), matrix, "{}", t.name);
        if let Some(e) = m.entries.get(&t.name) {
            assert_eq!(e.counts, [192.0], "{}", t.name);
            assert_eq!(e.sums.len() as u64, t.dims[0], "{}", t.name);
            assert!(e.sums.iter().all(|&s| s >= 0.0 && s.is_finite()));
        }
    }
    // products of one input share their statistics
    let e = |n: &str| m.entries[n].sums.clone();
    assert_eq!(e("blk.0.ffn_up.weight"), e("blk.0.ffn_gate.weight"));
    assert_eq!(e("blk.1.attn_q.weight"), e("blk.1.attn_k.weight"));
    assert_eq!(e("blk.1.attn_q.weight"), e("blk.1.attn_v.weight"));
    assert_ne!(e("blk.1.attn_q.weight"), e("blk.1.attn_output.weight"));

    // the legacy format: the same means
    let dat = scratch("demo.dat");
    let r = imatrix(
        &model,
        &dat,
        &["-c", "64", "--chunks", "3", "--output-format", "dat"],
    );
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let d = Imatrix::read(&dat).unwrap();
    assert!(d.legacy);
    assert_eq!(d.chunk_count, 3);
    for name in m.entries.keys() {
        let (a, b) = (m.importance(name).unwrap(), d.importance(name).unwrap());
        for (x, y) in a.iter().zip(&b) {
            assert!(
                (x - y).abs() <= 1e-5 * x.abs().max(1e-6),
                "{name}: {x} vs {y}"
            );
        }
    }
    let _ = std::fs::remove_file(out);
    let _ = std::fs::remove_file(dat);
}

#[test]
fn expert_tensors_count_per_expert() {
    let model = repo().join("tests/fixtures/parity/qwen35moe_tiny/model.gguf");
    let out = scratch("moe.gguf");
    let r = imatrix(&model, &out, &["-c", "32", "--chunks", "2", "-b", "32"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let m = Imatrix::read(&out).unwrap();
    let file = coil_gguf::GgufFile::open(&model).unwrap();
    let md = file.metadata();
    let n_expert = md.get_u64("qwen35moe.expert_count").unwrap() as usize;
    let n_used = md.get_u64("qwen35moe.expert_used_count").unwrap() as f64;
    let mut seen = 0;
    for (name, e) in &m.entries {
        if name.contains("_exps") {
            seen += 1;
            assert_eq!(e.counts.len(), n_expert, "{name}");
            // every token goes to n_used experts
            assert_eq!(e.counts.iter().sum::<f64>(), 64.0 * n_used, "{name}");
            let t = file.tensors().iter().find(|t| &t.name == name).unwrap();
            assert_eq!(e.sums.len() as u64, t.dims[0] * n_expert as u64);
        } else {
            assert_eq!(e.counts, [64.0], "{name}");
        }
    }
    assert!(seen >= 3, "no expert tensors in {:?}", m.entries.keys());
    let _ = std::fs::remove_file(out);
}

#[test]
fn bad_arguments_are_refused() {
    let model = repo().join("models/shakespeare-hybrid-q8_0.gguf");
    let out = scratch("never.gguf");
    // a text shorter than two chunks
    let r = imatrix(&model, &out, &["-c", "100000"]);
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("shakespeare_val_slice.txt") && err.contains("tokens"),
        "{err}"
    );
    assert!(!out.exists());
}
