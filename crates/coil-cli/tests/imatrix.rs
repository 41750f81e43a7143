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
        .args(if extra.contains(&"-t") {
            &[][..]
        } else {
            &["-t", "2"][..]
        })
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
    // The statistics do not depend on how the work is split among threads:
    // the same file, byte for byte, from one thread and from three.
    for t in ["1", "3"] {
        let other = scratch(&format!("moe-t{t}.gguf"));
        let r = imatrix(
            &model,
            &other,
            &["-c", "32", "--chunks", "2", "-b", "32", "-t", t],
        );
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        assert!(
            std::fs::read(&other).unwrap() == std::fs::read(&out).unwrap(),
            "-t {t} wrote another importance matrix than -t 2"
        );
        let _ = std::fs::remove_file(other);
    }
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

/// `coil quantize --imatrix` writes llama-quantize's bytes: every case of
/// tests/fixtures/imatrix/cases.txt against the hashes of llama-quantize's
/// outputs (tools/imatrix_quantize_reference.sh), with the GGUF and the
/// legacy importance-matrix formats, a dense and an expert model.
#[test]
fn quantize_with_imatrix_matches_llama_quantize() {
    use sha2::{Digest, Sha256};
    let dir = repo().join("tests/fixtures/imatrix");
    let want = std::fs::read_to_string(dir.join("quantize.sha256")).unwrap();
    let out = scratch("q.gguf");
    let mut checked = 0;
    let mut bad = Vec::new();
    for case in std::fs::read_to_string(dir.join("cases.txt"))
        .unwrap()
        .lines()
    {
        let f: Vec<&str> = case.split_whitespace().collect();
        if f.is_empty() || f[0].starts_with('#') {
            continue;
        }
        let (model, imatrix) = (f[0], f[1]);
        for mix in &f[2..] {
            let hash = want
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{model} {imatrix} {mix} ")))
                .unwrap_or_else(|| panic!("no reference hash for {model} {mix}"));
            let r = Command::new(env!("CARGO_BIN_EXE_coil"))
                .current_dir(&dir)
                .args(["quantize", "--quiet", "--imatrix", imatrix, model])
                .arg(&out)
                .arg(mix)
                .output()
                .expect("run coil");
            assert!(
                r.status.success(),
                "{model} {mix}: {}",
                String::from_utf8_lossy(&r.stderr)
            );
            let got = format!("{:x}", Sha256::digest(std::fs::read(&out).unwrap()));
            if got != hash {
                bad.push(format!("{model} {imatrix} {mix}"));
            }
            checked += 1;
        }
    }
    let _ = std::fs::remove_file(&out);
    assert!(bad.is_empty(), "differ from llama-quantize: {bad:?}");
    assert!(checked >= 35, "{checked} cases");
}

#[test]
fn quantize_refuses_a_missing_or_foreign_imatrix() {
    let dir = repo().join("tests/fixtures/imatrix");
    let out = scratch("never-q.gguf");
    let run = |extra: &[&str]| {
        let (mix, flags) = extra.split_last().unwrap();
        Command::new(env!("CARGO_BIN_EXE_coil"))
            .current_dir(&dir)
            .args(["quantize", "--quiet"])
            .args(flags)
            .arg("../fidelity/shakespeare-llama-q8_0.gguf")
            .arg(&out)
            .arg(mix)
            .output()
            .expect("run coil")
    };
    // IQ2_XXS without an importance matrix
    let r = run(&["IQ2_XXS"]);
    assert!(!r.status.success());
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(e.contains("IQ2_XXS") && e.contains("--imatrix"), "{e}");
    // the MoE model's matrix for the llama model
    let r = run(&["--imatrix", "qwen35moe.imatrix.gguf", "IQ2_XXS"]);
    assert!(!r.status.success());
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(
        e.contains("qwen35moe.imatrix.gguf") && e.contains("another model"),
        "{e}"
    );
    // not an importance matrix at all
    let r = run(&["--imatrix", "README.md", "IQ2_XXS"]);
    assert!(!r.status.success());
    let e = String::from_utf8_lossy(&r.stderr);
    assert!(e.contains("README.md"), "{e}");
    assert!(!out.exists());
}
