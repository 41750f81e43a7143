//! `coil inspect` on every bundled GGUF, as a user runs it.

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn coil(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_coil"))
        .args(args)
        .output()
        .expect("run coil");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const PLANS: [(&str, &str); 9] = [
    ("mamba", "MMMM"),
    ("mamba2", "MMMM"),
    ("jamba", "MM*MM*"),
    ("bamba", "M*M*"),
    ("granitemoehybrid", "MM*M*"),
    ("falcon_h1", "PPPP"),
    ("nemotron_h", "M-M*-"),
    ("nemotron_h_moe", "MEM*E"),
    ("llama", "****"),
];

#[test]
fn inspects_every_model_fixture_with_its_layer_plan() {
    for (arch, pattern) in PLANS {
        let path = repo().join(format!("tests/fixtures/models/{arch}/model.f16.gguf"));
        let p = path.to_str().unwrap();
        let (ok, out, err) = coil(&["inspect", p]);
        assert!(ok, "{arch}: {err}");
        assert!(
            out.contains(&format!("pattern {pattern}")),
            "{arch}:\n{out}"
        );
        assert!(out.contains("token_embd.weight"), "{arch}");
        assert!(out.contains("tokenizer.ggml.tokens"), "{arch}");
        assert!(out.contains("memory: "), "{arch}");
        assert_eq!(
            out.contains("rollback checkpoints:"),
            arch != "llama",
            "{arch}"
        );

        let (ok, out, err) = coil(&["inspect", "--json", p]);
        assert!(ok, "{arch}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["layer_plan"]["pattern"], pattern, "{arch}");
        assert_eq!(
            v["metadata"]["tokenizer.ggml.tokens"]["len"], 4096,
            "{arch}"
        );
        let n = v["tensors"].as_array().unwrap().len();
        assert_eq!(v["totals"]["tensors"], n, "{arch}");
    }
}

#[test]
fn mixers_and_ffns_are_named() {
    let p = repo().join("tests/fixtures/models/jamba/model.f16.gguf");
    let (ok, out, _) = coil(&["inspect", p.to_str().unwrap()]);
    assert!(ok);
    assert!(out.contains("blk.0   mamba1            moe"), "{out}");
    assert!(out.contains("blk.2   attention         moe"), "{out}");
    assert!(out.contains("blk.1   mamba1            dense"), "{out}");
}

#[test]
fn bad_files_give_a_clear_error() {
    let (ok, _, err) = coil(&["inspect", "no/such/file.gguf"]);
    assert!(!ok);
    assert!(err.contains("no/such/file.gguf"), "{err}");

    let dir = std::env::temp_dir().join(format!("coil-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = std::fs::read(repo().join("tests/fixtures/models/mamba/model.f16.gguf")).unwrap();
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &src[..20_000]).unwrap();
    let (ok, _, err) = coil(&["inspect", cut.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("truncated") && err.contains("offset"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--kernels` names a kernel per weight matrix and token count (and
/// leaves out norms, convolutions and the SSM's A and D); with `--json`
/// the same as one object.
#[test]
fn kernels_are_named_per_matrix_and_token_count() {
    let path = repo().join("tests/fixtures/models/mamba2/model.f16.gguf");
    let p = path.to_str().unwrap();
    let (ok, out, err) = coil(&["inspect", "--kernels", p]);
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.contains("blk.0.ssm_in.weight"))
        .unwrap_or_else(|| panic!("no ssm_in row:\n{out}"));
    // one token: a per-row kernel; 512 tokens: a GEMM
    assert!(line.contains("gemm"), "{line}");
    assert!(
        !out.contains("ssm_norm") && !out.contains("ssm_conv1d"),
        "{out}"
    );
    let (ok, out, err) = coil(&["inspect", "--kernels", "--batched", "--json", p]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let t = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "blk.0.ssm_out.weight")
        .expect("ssm_out");
    for n in ["1", "4", "9", "64", "512"] {
        assert!(
            t["kernels"][n].as_str().is_some_and(|k| !k.is_empty()),
            "{t}"
        );
    }
    assert!(
        t["kernels"]["512"].as_str().unwrap().contains("gemm"),
        "{t}"
    );
}

/// The memory of the KDA layers (delta-rule state and conv tails, per
/// sequence) and of the MLA layers (the compressed latent row per token,
/// no K/V rows) is listed by kind.
#[test]
fn kda_state_and_mla_latent_cells_are_accounted() {
    // kimi_linear_tiny: 3 KDA layers of 4 heads × 16 × 16 with conv tails
    // of 3 × 192, one MLA layer caching kv_lora_rank 24 + RoPE 8 lanes.
    // bailing_hybrid_tiny: 4 KDA layers, 2 MLA layers of the same widths.
    for (name, kda, mla) in [
        (
            "kimi_linear_tiny",
            "kda: 3 layer(s), state 18.8 KiB per sequence (3072 state + 1728 conv-tail f32 values)",
            "mla: 1 layer(s), 128 bytes of compressed latent cells per token (0.5 MiB at 4096 tokens)",
        ),
        (
            "bailing_hybrid_tiny",
            "kda: 4 layer(s), state 25.0 KiB per sequence (4096 state + 2304 conv-tail f32 values)",
            "mla: 2 layer(s), 256 bytes of compressed latent cells per token (1.0 MiB at 4096 tokens)",
        ),
    ] {
        let p = repo().join(format!("tests/fixtures/parity/{name}/model.gguf"));
        let (ok, out, err) = coil(&["inspect", p.to_str().unwrap()]);
        assert!(ok, "{name}: {err}");
        assert!(out.contains(kda), "{name}:\n{out}");
        assert!(out.contains(mla), "{name}:\n{out}");
    }
}

/// `coil inspect FILE | head -1`: the reader stops after one line while
/// coil still writes (a file whose listing is far larger than a pipe's
/// buffer); coil ends without a panic.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use coil_gguf::{GgmlType, Metadata, TensorSpec, Value};
    use std::io::{BufRead, BufReader};
    let mut md = Metadata::new();
    md.insert("general.architecture", Value::String("llama".into()));
    for i in 0..4000 {
        md.insert(format!("x.key{i}"), Value::String("v".repeat(60)));
    }
    let t = [TensorSpec::new("t.weight", &[32], GgmlType::F32)];
    let (mut bytes, sizes) = coil_gguf::gguf::encode_header(&md, &t).unwrap();
    bytes.extend(vec![0u8; sizes[0] as usize]);
    let path = std::env::temp_dir().join(format!("coil-pipe-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_coil"))
        .arg("inspect")
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run coil");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("GGUF v3"), "{first}");
    // the reading end is closed here
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_ne!(out.status.code(), Some(101), "{stderr}");
    let _ = std::fs::remove_file(path);
}

/// LFM3's memory: the short convolutions' conv tails per sequence, the full
/// attention layers' K/V cells and the sliding-window layers' apart, with
/// their window.
#[test]
fn lfm3_conv_tails_and_sliding_window_cells_are_accounted() {
    // lfm3_tiny: 3 short-conv layers with tails of (7 − 1) × 64, one full
    // and two sliding-window (window 5) attention layers of 2 KV heads × 16.
    let p = repo().join("tests/fixtures/parity/lfm3_tiny/model.gguf");
    let (ok, out, err) = coil(&["inspect", p.to_str().unwrap()]);
    assert!(ok, "{err}");
    for want in [
        "pattern C**C*C",
        "shortconv: 3 layer(s), state 4.5 KiB per sequence (0 state + 1152 conv-tail f32 values)",
        "attention: 1 layer(s), 256 bytes of K/V cells per token (1.0 MiB at 4096 tokens)",
        "sliding-window attention: 2 layer(s), 512 bytes of K/V cells per token (2.0 MiB at 4096 tokens), a query reads the last 5 tokens' cells",
    ] {
        assert!(out.contains(want), "{want}:\n{out}");
    }
}

/// Qwen4-Exp's memory: the DeltaNet states, the indexed attention layers'
/// K/V cells, and past the trunk the per-layer embedding's state and the
/// indexer's raw keys.
#[test]
fn qwen4exp_ple_state_and_indexer_keys_are_accounted() {
    // qwen4exp_tiny: 3 DeltaNet layers (4 value heads of 16 × 16, conv
    // tails of 3 × 128), 2 attention layers of 2 KV heads × 32 with
    // indexer keys of 16; the PLE: (4 − 1) × 3 conv inputs of 4 × 64 and 2
    // tokens.
    let p = repo().join("tests/fixtures/parity/qwen4exp_tiny/model.gguf");
    let (ok, out, err) = coil(&["inspect", p.to_str().unwrap()]);
    assert!(ok, "{err}");
    for want in [
        "pattern D*DD*",
        "gated_deltanet: 3 layer(s), state 16.5 KiB per sequence (3072 state + 1152 conv-tail f32 values)",
        "attention: 2 layer(s), 1024 bytes of K/V cells per token",
        "n-gram embedding (PLE): state 9.0 KiB per sequence (2306 f32 values",
        "indexer keys: 128 bytes per token",
        "top 8 tokens' blocks",
    ] {
        assert!(out.contains(want), "{want}:\n{out}");
    }
}
