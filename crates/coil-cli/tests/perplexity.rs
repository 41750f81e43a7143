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

fn coil() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coil"))
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "coil perplexity failed: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A log-probability file written by llama-perplexity
/// (`--kl-divergence-base`, tools/kld_reference.sh) is read: the same file
/// evaluated by coil is within a file's rounding of it.
#[test]
fn kl_divergence_reads_llama_perplexity_files() {
    let out = coil()
        .args(["perplexity", "-m"])
        .arg(demo_model())
        .args(["--kl-divergence", "--kl-divergence-base"])
        .arg(data("demo_base_llama.kld"))
        .args(["--json", "-t", "2"])
        .output()
        .expect("run coil");
    let got = json_of(&out);
    assert_eq!(got["ctx"], 64);
    assert_eq!(got["chunks"], 2);
    assert_eq!(got["tokens_scored"], 62);
    let kl = got["kld"]["mean"]["value"].as_f64().unwrap();
    assert!(
        kl.abs() < 1e-4,
        "coil against llama.cpp on one Q8_0 file: mean KL {kl}"
    );
    assert!(got["same_top"]["value"].as_f64().unwrap() >= 0.95, "{got}");
    let (ppl, base) = (
        got["ppl"]["value"].as_f64().unwrap(),
        got["ppl_base"]["value"].as_f64().unwrap(),
    );
    assert!(
        (ppl / base - 1.0).abs() < 2e-3,
        "{ppl} vs llama.cpp's {base}"
    );
}

/// `--kl-divergence-base` writes llama-perplexity's format (header, the
/// windows' tokens, 16-bit rows) and a model compared with its own file
/// diverges by no more than the file's rounding.
#[test]
fn kl_divergence_of_a_model_against_its_own_base() {
    let dir = std::env::temp_dir().join(format!("coil-kld-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let base = dir.join("base.kld");
    let out = coil()
        .args(["perplexity", "-m"])
        .arg(demo_model())
        .arg("-f")
        .arg(data("shakespeare_val_slice.txt"))
        .args(["--ctx", "64", "--chunks", "3", "--json", "-t", "2"])
        .arg("--kl-divergence-base")
        .arg(&base)
        .output()
        .expect("run coil");
    let ppl = json_of(&out)["ppl"].as_f64().unwrap();
    let n_vocab = 2048;
    let row = 2 * n_vocab / 2 + 4;
    let want = 8 + 12 + 4 * 3 * 64 + 2 * 3 * 31 * row;
    assert_eq!(std::fs::metadata(&base).unwrap().len() as usize, want);
    let out = coil()
        .args(["perplexity", "-m"])
        .arg(demo_model())
        .args(["--kl-divergence", "--kl-divergence-base"])
        .arg(&base)
        .args(["--json", "-t", "2", "--chunks", "2"])
        .output()
        .expect("run coil");
    let got = json_of(&out);
    assert_eq!(got["tokens_scored"], 62);
    let kl = got["kld"]["mean"]["value"].as_f64().unwrap();
    assert!(kl.abs() < 2e-5, "mean KL against itself {kl}");
    assert!(got["same_top"]["value"].as_f64().unwrap() >= 0.98, "{got}");
    let base_ppl = got["ppl_base"]["value"].as_f64().unwrap();
    assert!((got["ppl"]["value"].as_f64().unwrap() / base_ppl - 1.0).abs() < 1e-3);
    // the base of 3 windows; its first two are those compared
    assert!(ppl > 1.0 && base_ppl > 1.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kl_divergence_names_a_bad_base_file() {
    let dir = std::env::temp_dir().join(format!("coil-kld-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.kld");
    std::fs::write(&bad, b"not a log-probability file").unwrap();
    let out = coil()
        .args(["perplexity", "-m"])
        .arg(demo_model())
        .args(["--kl-divergence", "--kl-divergence-base"])
        .arg(&bad)
        .output()
        .expect("run coil");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a log-probability file"), "{err}");
    // a file cut short after its header and tokens
    let full = std::fs::read(data("demo_base_llama.kld")).unwrap();
    std::fs::write(&bad, &full[..8 + 12 + 4 * 128 + 100]).unwrap();
    let out = coil()
        .args(["perplexity", "-m"])
        .arg(demo_model())
        .args(["--kl-divergence", "--kl-divergence-base"])
        .arg(&bad)
        .output()
        .expect("run coil");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ends early"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// With --kl-divergence the base file holds the text and the window: a text
/// or another window is refused, not ignored.
#[test]
fn kl_divergence_refuses_a_text_or_another_window() {
    let out = coil()
        .args(["perplexity", "-m"])
        .arg(demo_model())
        .args(["--kl-divergence", "--kl-divergence-base"])
        .arg(data("demo_base_llama.kld"))
        .arg("-f")
        .arg(data("shakespeare_val_slice.txt"))
        .output()
        .expect("run coil");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--file") && err.contains("--kl-divergence"),
        "{err}"
    );
    let out = coil()
        .args(["perplexity", "-m"])
        .arg(demo_model())
        .args(["--kl-divergence", "--kl-divergence-base"])
        .arg(data("demo_base_llama.kld"))
        .args(["-c", "128"])
        .output()
        .expect("run coil");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("windows of 64 tokens") && err.contains("-c 128"),
        "{err}"
    );
}
