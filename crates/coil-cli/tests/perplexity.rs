//! `coil perplexity` and the bundled demo model (models/README.md): coil's
//! tokenization and perplexity of a held-out Shakespeare slice equal those of
//! transformers on the Hugging Face checkpoint the model was converted from
//! (tests/data/demo_perplexity.json, written by tools/train_demo.py).

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn demo_model() -> PathBuf {
    repo().join("models/shakespeare-hybrid-q8_0.gguf")
}

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn expected() -> serde_json::Value {
    let s = std::fs::read_to_string(data("demo_perplexity.json")).unwrap();
    serde_json::from_str(&s).unwrap()
}

#[test]
fn demo_model_tokenizes_like_transformers() {
    let file = coil_gguf::GgufFile::open(demo_model()).unwrap();
    let tok = coil::tokenizer::Tokenizer::from_gguf(&file).unwrap();
    let text = std::fs::read_to_string(data("shakespeare_val_slice.txt")).unwrap();
    let ids = tok.encode(&text, true);
    let want: Vec<u32> = expected()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(
        ids.len(),
        want.len(),
        "token count differs from transformers'"
    );
    if let Some(i) = (0..ids.len()).find(|&i| ids[i] != want[i]) {
        panic!(
            "token {i} differs: coil {} vs transformers {}",
            ids[i], want[i]
        );
    }
    assert_eq!(tok.decode(&ids), text, "decode(encode(text)) != text");
}

#[test]
fn perplexity_of_demo_model_matches_transformers() {
    let exp = expected();
    let ctx = exp["ctx"].as_u64().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_coil"))
        .args(["perplexity", "-m"])
        .arg(demo_model())
        .arg("-f")
        .arg(data("shakespeare_val_slice.txt"))
        .args(["--ctx", &ctx, "--json", "-t", "2"])
        .output()
        .expect("run coil");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "coil perplexity failed: {stderr}");
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ppl = got["ppl"].as_f64().unwrap();
    let want = exp["ppl"].as_f64().unwrap();
    assert_eq!(got["chunks"], exp["chunks"]);
    assert_eq!(got["tokens_scored"], exp["tokens_scored"]);
    let rel = (ppl - want).abs() / want;
    assert!(
        rel < 0.005,
        "coil perplexity {ppl:.4} vs transformers {want:.4} ({:.3}% apart, at most 0.5%)",
        rel * 100.0
    );
    // a trained model, far below a uniform guess over the vocabulary
    let uniform = got["uniform_ppl"].as_f64().unwrap();
    assert!(
        ppl < uniform / 20.0,
        "perplexity {ppl} is not far below the uniform {uniform}"
    );
}

#[test]
fn perplexity_refuses_a_text_shorter_than_two_windows() {
    let out = Command::new(env!("CARGO_BIN_EXE_coil"))
        .args(["perplexity", "-m"])
        .arg(demo_model())
        .arg("-f")
        .arg(data("shakespeare_val_slice.txt"))
        .args(["--ctx", "100000"])
        .output()
        .expect("run coil");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("smaller --ctx"), "{err}");
}

#[test]
fn run_without_model_uses_the_demo_model() {
    // from the repository root, as the README's main command runs it
    let out = Command::new(env!("CARGO_BIN_EXE_coil"))
        .current_dir(repo())
        .args(["run", "-p", "ROMEO:", "-n", "16", "--temp", "0", "-t", "2"])
        .output()
        .expect("run coil");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "coil run failed: {stderr}");
    assert!(stderr.contains("shakespeare-hybrid"), "{stderr}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.trim().len() > "ROMEO:".len(),
        "nothing generated: {text:?}"
    );
}
