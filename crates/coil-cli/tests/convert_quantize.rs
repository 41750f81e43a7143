//! `coil convert` and `coil quantize` end to end: llama.cpp-identical files
//! from the fixture checkpoints, every quantization mixture, errors that
//! leave nothing behind (a full disk included).

use coil_gguf::{GgmlType, GgufFile};
use std::path::{Path, PathBuf};
use std::process::Command;
#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;
use temp_path::TempPath;

fn coil() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coil"))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn scratch(test: &str) -> TempPath {
    TempPath::dir("coil-cli-cq", test)
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    (out.status.success(), text)
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".gguf"))
        .collect()
}

#[test]
fn convert_is_byte_identical_to_llama_cpp() {
    let d = scratch("identical");
    for name in [
        "mamba",
        "mamba2",
        "jamba",
        "granitemoehybrid",
        "falcon_h1",
        "nemotron_h",
        "nemotron_h_moe",
        "llama",
    ] {
        let out = d.join(format!("{name}.gguf"));
        let (ok, text) = run(coil()
            .args(["convert", "--quiet", "--name", "Hf", "--type", "f16", "-o"])
            .arg(&out)
            .arg(root().join("hf").join(name)));
        assert!(ok, "{name}: {text}");
        let want = std::fs::read(root().join("models").join(name).join("model.f16.gguf")).unwrap();
        assert!(
            std::fs::read(&out).unwrap() == want,
            "{name}: differs from llama.cpp's converter output"
        );
    }
}

#[test]
fn bamba_permutes_only_the_rotary_lanes() {
    let d = scratch("bamba");
    let out = d.join("bamba.gguf");
    let (ok, text) = run(coil()
        .args(["convert", "--quiet", "--name", "Hf", "-o"])
        .arg(&out)
        .arg(root().join("hf/bamba")));
    assert!(ok, "{text}");
    let ours = GgufFile::open(&out).unwrap();
    let theirs = GgufFile::open(root().join("models/bamba/model.f16.gguf")).unwrap();
    assert_eq!(
        ours.metadata().get_bool("coil.rope.partial_permute"),
        Some(true)
    );
    // head_dim 16, rotary 8: rows 8..16 of each head stay in transformers'
    // order; rows 0..8 are pairs (i, i + 4). llama.cpp pairs (i, i + 8).
    let q = ours
        .tensor("blk.1.attn_q.weight")
        .unwrap()
        .to_f32()
        .unwrap();
    let t = theirs
        .tensor("blk.1.attn_q.weight")
        .unwrap()
        .to_f32()
        .unwrap();
    let row = |v: &[f32], r: usize| v[r * 32..(r + 1) * 32].to_vec();
    // llama.cpp's row 2i + j of a head is transformers' row 8j + i, so
    // transformers' row r of head h is:
    let hf = |h: usize, r: usize| row(&t, h * 16 + if r < 8 { 2 * r } else { 2 * (r - 8) + 1 });
    for h in 0..2 {
        for i in 0..4 {
            assert_eq!(row(&q, h * 16 + 2 * i), hf(h, i));
            assert_eq!(row(&q, h * 16 + 2 * i + 1), hf(h, i + 4));
        }
        for r in 8..16 {
            assert_eq!(row(&q, h * 16 + r), hf(h, r));
        }
    }
    for (k, _) in theirs.metadata().iter() {
        assert_eq!(ours.metadata().get(k), theirs.metadata().get(k), "{k}");
    }
}

#[test]
fn quantize_every_mixture() {
    let d = scratch("quantize");
    let src = d.join("nemotron_h_moe.f32.gguf");
    let (ok, text) = run(coil()
        .args(["convert", "--quiet", "--type", "f32", "-o"])
        .arg(&src)
        .arg(root().join("hf/nemotron_h_moe")));
    assert!(ok, "{text}");
    let input = GgufFile::open(&src).unwrap();
    for mix in [
        "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S",
        "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS",
    ] {
        let out = d.join(format!("q-{mix}.gguf"));
        let (ok, text) = run(coil()
            .args(["quantize", "--quiet"])
            .arg(&src)
            .arg(&out)
            .arg(mix));
        assert!(ok, "{mix}: {text}");
        let q = GgufFile::open(&out).unwrap();
        assert_eq!(q.tensors().len(), input.tensors().len());
        for t in q.tensors() {
            let n = t.name.as_str();
            let kept = n.ends_with("_norm.weight")
                || n.contains("ssm_conv1d")
                || n.contains("ffn_gate_inp")
                || !n.ends_with("weight")
                || t.dims.iter().filter(|&&x| x > 1).count() < 2;
            if kept {
                assert_eq!(t.ty, input.tensor_info(n).unwrap().ty, "{mix} {n}");
            } else {
                // The fixture's rows (32 wide) are too short for 256-blocks:
                // K-quants fall back as llama.cpp does.
                assert!(t.ty != GgmlType::F32, "{mix} {n}");
            }
            let a = q.view(t).to_f32().unwrap();
            let b = input.tensor(n).unwrap().to_f32().unwrap();
            let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
            let err = a
                .iter()
                .zip(&b)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                err <= amax * 0.2 + 1e-6,
                "{mix} {n}: max error {err} of {amax}"
            );
        }
        assert_eq!(
            q.metadata().get_u64("general.file_type"),
            Some(match mix {
                "Q8_0" => 7,
                "Q4_0" => 2,
                "Q4_1" => 3,
                "Q5_0" => 8,
                "Q5_1" => 9,
                "Q2_K" => 10,
                "Q3_K_S" => 11,
                "Q3_K_M" => 12,
                "Q3_K_L" => 13,
                "Q4_K_S" => 14,
                "Q4_K_M" => 15,
                "Q5_K_S" => 16,
                "Q5_K_M" => 17,
                "Q6_K" => 18,
                "IQ4_NL" => 25,
                _ => 30,
            })
        );
        let (ok, text) = run(coil().arg("inspect").arg(&out));
        assert!(ok, "{mix}: inspect: {text}");
    }
    // IQ2_XS without an importance matrix: the fixture's 32-wide rows are
    // too short for its 256-blocks, so every matrix falls back as in
    // llama-quantize and none needs the matrix (a file whose matrices do
    // is refused: tests/imatrix.rs).
    let x = d.join("x.gguf");
    let (ok, text) = run(coil()
        .args(["quantize", "--quiet"])
        .arg(&src)
        .arg(&x)
        .arg("IQ2_XS"));
    assert!(ok, "{text}");
    let q = GgufFile::open(&x).unwrap();
    assert!(q.tensors().iter().all(|t| t.ty != GgmlType::IQ2_XS));
    // llama-quantize's flags
    let rules = d.join("rules.txt");
    std::fs::write(&rules, "ssm_out=q5_1\n").unwrap();
    let out = d.join("flags.gguf");
    let (ok, text) = run(coil()
        .args(["quantize", "--quiet", "--output-tensor-type", "f16"])
        .args([
            "--token-embedding-type",
            "Q8_0",
            "--tensor-type",
            r"blk\.0\.=q4_1",
        ])
        .arg("--tensor-type-file")
        .arg(&rules)
        .arg(&src)
        .arg(&out)
        .arg("Q4_K_M"));
    assert!(ok, "{text}");
    let q = GgufFile::open(&out).unwrap();
    let ty = |n: &str| q.tensor_info(n).unwrap().ty;
    assert_eq!(ty("output.weight"), GgmlType::F16);
    assert_eq!(ty("token_embd.weight"), GgmlType::Q8_0);
    let mut ruled = 0;
    for t in q.tensors().iter().filter(|t| t.name.starts_with("blk.")) {
        if input.tensor_info(&t.name).unwrap().ty == t.ty {
            continue; // not quantized
        }
        let want = if t.name.starts_with("blk.0.") {
            Some(GgmlType::Q4_1)
        } else if t.name.contains("ssm_out") {
            Some(GgmlType::Q5_1)
        } else {
            None
        };
        if let Some(w) = want {
            assert_eq!(t.ty, w, "{}", t.name);
            ruled += 1;
        }
    }
    assert!(ruled >= 2, "{ruled}");
    for bad in [
        ["--output-tensor-type", "q9_k"],
        ["--tensor-type", "attn("],
        ["--tensor-type", "attn(=q8_0"],
    ] {
        let (ok, text) = run(coil()
            .args(["quantize", "--quiet"])
            .args(bad)
            .arg(&src)
            .arg(d.join("bad.gguf"))
            .arg("Q4_K_M"));
        assert!(!ok && text.contains(bad[1]), "{bad:?}: {text}");
        assert!(!d.join("bad.gguf").exists());
    }
}

#[test]
fn errors_leave_nothing_behind() {
    let d = scratch("errors");
    let (ok, text) = run(coil()
        .args(["convert", "--quiet", "-o"])
        .arg(d.join("a.gguf"))
        .arg(d.join("no-such-dir")));
    assert!(!ok && text.contains("no-such-dir"), "{text}");
    let (ok, text) = run(coil()
        .args(["convert", "--quiet", "--type", "q4_k", "-o"])
        .arg(d.join("a.gguf"))
        .arg(root().join("hf/mamba")));
    assert!(!ok && text.contains("--type"), "{text}");
    assert!(leftovers(&d).is_empty());
}

/// A full disk, simulated with a file-size limit (writes fail with EFBIG).
#[cfg(unix)]
#[test]
fn full_disk_leaves_nothing_behind() {
    let d = scratch("full");
    let out = d.join("big.gguf");
    let script = format!(
        "trap '' XFSZ; ulimit -f 64; exec '{}' convert --quiet --type f32 -o '{}' '{}'",
        env!("CARGO_BIN_EXE_coil"),
        out.display(),
        root().join("hf/falcon_h1").display()
    );
    let (ok, text) = run(Command::new("sh").arg("-c").arg(script));
    assert!(!ok, "{text}");
    assert!(text.contains("big.gguf"), "{text}");
    assert!(leftovers(&d).is_empty(), "{:?}", leftovers(&d));
}

/// coil's own f32 conversion, run by coil, reproduces transformers' logits
/// (Bamba included: only the rotary lanes are permuted).
#[test]
fn converted_models_match_transformers() {
    let d = scratch("logits");
    for name in ["bamba", "falcon_h1", "mamba"] {
        let gguf = d.join(format!("{name}.gguf"));
        let (ok, text) = run(coil()
            .args(["convert", "--quiet", "--type", "f32", "-o"])
            .arg(&gguf)
            .arg(root().join("hf").join(name)));
        assert!(ok, "{text}");
        let tokens: Vec<u32> = serde_json::from_str(
            &std::fs::read_to_string(root().join("models").join(name).join("tokens.json")).unwrap(),
        )
        .unwrap();
        let list = tokens
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let npy = d.join(format!("{name}.npy"));
        let (ok, text) = run(coil()
            .args(["logits", "-t", "2", "--tokens", &list, "-m"])
            .arg(&gguf)
            .arg("-o")
            .arg(&npy));
        assert!(ok, "{name}: {text}");
        let ours = coil_gguf::npy::parse_f32(&std::fs::read(&npy).unwrap()).unwrap();
        let want = coil_gguf::npy::parse_f32(
            &std::fs::read(root().join("models").join(name).join("logits.npy")).unwrap(),
        )
        .unwrap();
        assert_eq!(ours.shape, want.shape);
        let amax = want.data.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = ours
            .data
            .iter()
            .zip(&want.data)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            err <= 1e-4 * amax,
            "{name}: max abs error {err} (max |logit| {amax})"
        );
    }
}

/// The llama.cpp converter faults coil fixes, end to end: a Nemotron-H
/// mixing dense MLP and MoE layers (llama.cpp: feed-forward length 0 for the
/// dense layers, unloadable) and a GraniteMoeHybrid with RoPE (llama.cpp:
/// RoPE dropped). Checkpoints and transformers logits from
/// `tools/make_converter_fixtures.py`.
#[test]
fn converter_fixes_match_transformers() {
    let d = scratch("fixes");
    for name in ["nemotron_h_mixed", "granite_rope"] {
        let dir = root().join("convert").join(name);
        let gguf = d.join(format!("{name}.gguf"));
        let (ok, text) = run(coil()
            .args(["convert", "--quiet", "--type", "f32", "-o"])
            .arg(&gguf)
            .arg(&dir));
        assert!(ok, "{text}");
        let f = GgufFile::open(&gguf).unwrap();
        let md = f.metadata();
        if name == "nemotron_h_mixed" {
            assert_eq!(f.architecture(), Some("nemotron_h_moe"));
            let ff: Vec<u64> = md
                .get_array("nemotron_h_moe.feed_forward_length")
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(ff, [0, 64, 0, 24, 0]);
            assert!(f.tensor_info("blk.1.ffn_up.weight").is_some());
            assert!(f.tensor_info("blk.3.ffn_up_exps.weight").is_some());
        } else {
            assert_eq!(
                md.get_bool("granitehybrid.rope.scaling.finetuned"),
                Some(true)
            );
            assert_eq!(md.get_u64("granitehybrid.context_length"), Some(2048));
        }
        let tokens: Vec<u32> =
            serde_json::from_str(&std::fs::read_to_string(dir.join("tokens.json")).unwrap())
                .unwrap();
        let list = tokens
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let npy = d.join(format!("{name}.npy"));
        let (ok, text) = run(coil()
            .args(["logits", "-t", "2", "--tokens", &list, "-m"])
            .arg(&gguf)
            .arg("-o")
            .arg(&npy));
        assert!(ok, "{name}: {text}");
        let ours = coil_gguf::npy::parse_f32(&std::fs::read(&npy).unwrap()).unwrap();
        let want =
            coil_gguf::npy::parse_f32(&std::fs::read(dir.join("logits.npy")).unwrap()).unwrap();
        assert_eq!(ours.shape, want.shape);
        let amax = want.data.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = ours
            .data
            .iter()
            .zip(&want.data)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            err <= 1e-4 * amax,
            "{name}: max abs error {err} (max |logit| {amax})"
        );
    }
}

/// `--split-max-tensors` / `--split-max-size` write llama.cpp's parts; every
/// command reads a split model from any part: the parts' tensors are the
/// unsplit file's, quantizing the parts gives the unsplit quantization byte
/// for byte, `coil logits` on a part gives the whole file's logits, and
/// `coil inspect` lists the parts. A missing part is an error naming it.
#[test]
fn split_models_are_written_and_read() {
    let d = scratch("split");
    let whole = root().join("models/nemotron_h_moe/model.f16.gguf");
    let (ok, text) = run(coil()
        .args([
            "convert",
            "--quiet",
            "--name",
            "Hf",
            "--type",
            "f16",
            "--split-max-tensors",
            "15",
            "-o",
        ])
        .arg(d.join("c.gguf"))
        .arg(root().join("hf/nemotron_h_moe")));
    assert!(ok, "{text}");
    let part = |p: &str, i: usize| d.join(format!("{p}-{i:05}-of-00003.gguf"));
    let (a, b) = (
        GgufFile::open(part("c", 2)).unwrap(),
        GgufFile::open(&whole).unwrap(),
    );
    assert_eq!(a.parts().len(), 3);
    assert_eq!(a.tensors().len(), b.tensors().len());
    for (x, y) in a.tensors().iter().zip(b.tensors()) {
        assert_eq!(x.name, y.name);
        assert_eq!(a.view(x).data, b.view(y).data, "{}", x.name);
    }

    // Quantizing the parts (given the last) = quantizing the whole file.
    for (src, out) in [
        (part("c", 3), "from-parts.gguf"),
        (whole.clone(), "from-whole.gguf"),
    ] {
        let (ok, text) = run(coil()
            .args(["quantize", "--quiet"])
            .arg(&src)
            .arg(d.join(out))
            .arg("Q8_0"));
        assert!(ok, "{text}");
    }
    let q = std::fs::read(d.join("from-whole.gguf")).unwrap();
    assert!(std::fs::read(d.join("from-parts.gguf")).unwrap() == q);

    // A quantized split, run from its second part.
    let (ok, text) = run(coil()
        .args(["quantize", "--quiet", "--split-max-size", "1M"])
        .arg(&whole)
        .arg(d.join("q.gguf"))
        .arg("Q8_0"));
    assert!(ok, "{text}");
    // 0.6 MB of tensors fit 1M: one plain file.
    assert!(std::fs::read(d.join("q.gguf")).unwrap() == q);
    let (ok, text) = run(coil()
        .args(["quantize", "--quiet", "--split-max-tensors", "15"])
        .arg(&whole)
        .arg(d.join("q.gguf"))
        .arg("Q8_0"));
    assert!(ok && text.contains("and the other 2 parts"), "{text}");
    let logits = |model: &Path, out: &str| {
        let (ok, text) = run(coil()
            .args(["logits", "--tokens", "5,17,300,9,4000,2", "--out"])
            .arg(d.join(out))
            .arg("-m")
            .arg(model));
        assert!(ok, "{text}");
        std::fs::read(d.join(out)).unwrap()
    };
    assert!(logits(&part("q", 2), "split.npy") == logits(&d.join("from-whole.gguf"), "whole.npy"));

    let (ok, text) = run(coil().arg("inspect").arg(part("q", 1)));
    assert!(ok && text.contains("split model: 3 parts"), "{text}");
    assert!(text.contains("q-00003-of-00003.gguf"), "{text}");

    std::fs::remove_file(part("q", 3)).unwrap();
    let (ok, text) = run(coil()
        .args(["logits", "--tokens", "1", "--out"])
        .arg(d.join("x.npy"))
        .arg("-m")
        .arg(part("q", 1)));
    assert!(
        !ok && text.contains("q-00003-of-00003.gguf") && text.contains("part 3 of 3 is missing"),
        "{text}"
    );
}
