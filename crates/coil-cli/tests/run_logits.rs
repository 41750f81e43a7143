//! `coil run` and `coil logits` as a user runs them.

use std::path::PathBuf;
use std::process::Command;
#[path = "../../../tests/support/fixtures.rs"]
mod fixtures;
#[path = "../../../tests/support/temp_path.rs"]
mod temp_path;
use temp_path::TempPath;

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

fn model(arch: &str) -> String {
    fixtures::path(&repo().join("tests/fixtures"), arch)
        .to_string_lossy()
        .into_owned()
}

fn tmp(name: &str) -> TempPath {
    TempPath::new("coil-cli-test", name)
}

#[test]
fn logits_writes_npy_that_matches_the_reference() {
    for arch in ["mamba2", "granitemoehybrid"] {
        logits_match(arch);
    }
}

fn logits_match(arch: &str) {
    let dir = repo().join(format!("tests/fixtures/models/{arch}"));
    let tokens = std::fs::read_to_string(dir.join("tokens.json")).unwrap();
    let tokens = tokens
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .replace(' ', "");
    let want = coil_gguf::npy::parse_f32(&std::fs::read(dir.join("logits.npy")).unwrap()).unwrap();
    for ub in ["1", "5", "48"] {
        let out = tmp(&format!("l{arch}{ub}.npy"));
        let (ok, _, err) = coil(&[
            "logits",
            "-m",
            &model(arch),
            "--tokens",
            &tokens,
            "--ubatch",
            ub,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
        let got = coil_gguf::npy::parse_f32(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(got.shape, want.shape);
        let max = want.data.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = got
            .data
            .iter()
            .zip(&want.data)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff <= 1e-4 * max, "ubatch {ub}: {diff}");
    }
}

#[test]
fn logits_rejects_bad_input_clearly() {
    let out = tmp("bad.npy");
    let o = out.to_str().unwrap();
    let (ok, _, err) = coil(&[
        "logits",
        "-m",
        &model("mamba"),
        "--tokens",
        "1,x",
        "--out",
        o,
    ]);
    assert!(!ok && err.contains("\"x\" is not a token id"), "{err}");
    let (ok, _, err) = coil(&[
        "logits",
        "-m",
        &model("mamba"),
        "--tokens",
        "1,99999",
        "--out",
        o,
    ]);
    assert!(
        !ok && err.contains("99999") && err.contains("vocabulary"),
        "{err}"
    );
    let (ok, _, err) = coil(&["logits", "-m", "missing.gguf", "--tokens", "1", "--out", o]);
    assert!(!ok && err.contains("missing.gguf"), "{err}");
    let (ok, _, err) = coil(&[
        "logits",
        "-m",
        &model("mamba"),
        "--tokens",
        "1",
        "--ubatch",
        "0",
        "--out",
        o,
    ]);
    assert!(!ok && err.contains("--ubatch"), "{err}");
    assert!(!out.exists());
}

#[test]
fn run_streams_text_and_reports_speed() {
    for arch in fixtures::CONVERTED {
        let args = [
            "run",
            "-m",
            &model(arch),
            "-p",
            "ROMEO:",
            "-n",
            "12",
            "--temp",
            "0",
            "-t",
            "1",
        ];
        let (ok, out1, err) = coil(&args);
        assert!(ok, "{err}");
        assert!(out1.starts_with("ROMEO:"), "{out1}");
        assert!(out1.len() > "ROMEO:".len() + 5, "{out1}");
        assert!(
            err.contains("prompt: 3 tokens") || err.contains("prompt:"),
            "{err}"
        );
        assert!(
            err.contains("generation: 12 tokens") && err.contains("tokens/s"),
            "{err}"
        );
        assert!(err.contains("memory:"), "{err}");
        // Greedy is deterministic, and thread count does not change it.
        let args2 = [
            "run",
            "-m",
            &model(arch),
            "-p",
            "ROMEO:",
            "-n",
            "12",
            "--temp",
            "0",
            "-t",
            "2",
        ];
        let (_, out2, _) = coil(&args2);
        assert_eq!(out1, out2);
        // A seed makes sampling reproducible.
        let s = [
            "run",
            "-m",
            &model(arch),
            "-p",
            "ROMEO:",
            "-n",
            "12",
            "--temp",
            "1",
            "--seed",
            "5",
        ];
        assert_eq!(coil(&s).1, coil(&s).1);
    }
}

#[test]
fn run_rejects_bad_flags_clearly() {
    let (ok, _, err) = coil(&["run", "-m", &model("mamba"), "-p", "x", "--top-p", "2"]);
    assert!(!ok && err.contains("top_p"), "{err}");
    let (ok, _, err) = coil(&["run", "-m", &model("mamba"), "-p", "x", "-t", "0"]);
    assert!(!ok && err.contains("--threads"), "{err}");
    let (ok, _, err) = coil(&[
        "run",
        "-m",
        &model("mamba"),
        "-p",
        "x",
        "-n",
        "10",
        "--ctx",
        "4",
    ]);
    assert!(!ok && err.contains("--ctx"), "{err}");
    let readme = repo().join("tests/fixtures/README.md");
    let (ok, _, err) = coil(&["run", "-m", readme.to_str().unwrap(), "-p", "x"]);
    assert!(
        !ok && err.contains("GGUF") && !err.contains("panicked"),
        "{err}"
    );
}

#[test]
fn sessions_continue_a_generation_without_reprocessing() {
    // (kept to the end: the last check loads mamba2's session into jamba)
    let files: Vec<TempPath> = ["mamba2", "jamba", "nemotron_h"]
        .iter()
        .map(|a| tmp(&format!("{a}.session")))
        .collect();
    for (arch, file) in ["mamba2", "jamba", "nemotron_h"].into_iter().zip(&files) {
        let m = model(arch);
        let f = file.to_str().unwrap();
        let (ok, whole, err) = coil(&["run", "-m", &m, "-p", "ROMEO:", "-n", "30", "--temp", "0"]);
        assert!(ok, "{err}");
        let (ok, first, err) = coil(&[
            "run",
            "-m",
            &m,
            "-p",
            "ROMEO:",
            "-n",
            "20",
            "--temp",
            "0",
            "--save-session",
            f,
        ]);
        assert!(ok, "{err}");
        assert!(err.contains("session: 25 tokens saved"), "{err}");
        let (ok, rest, err) = coil(&[
            "run",
            "-m",
            &m,
            "-n",
            "10",
            "--temp",
            "0",
            "--load-session",
            f,
        ]);
        assert!(ok, "{err}");
        assert!(err.contains("session: 25 tokens loaded"), "{err}");
        assert!(err.contains("prompt: 1 tokens"), "{err}");
        // The two halves make the whole generation.
        assert_eq!(
            format!(
                "{}{}",
                first.trim_end_matches('\n'),
                rest.trim_end_matches('\n')
            ),
            whole.trim_end_matches('\n'),
            "{arch}"
        );
    }
    // Another model's session is refused with a clear message.
    let file = &files[0];
    let (ok, _, err) = coil(&[
        "run",
        "-m",
        &model("jamba"),
        "-n",
        "3",
        "--load-session",
        file.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("another model"), "{err}");
}

/// The context flags as llama.cpp spells them: `-c` / `--ctx-size` (and
/// coil's `--ctx`) set it; without them the model's trained context is
/// taken (the demo model's 1048576 tokens: its attention cells are small
/// and grow only as used); `-np` is `--parallel`.
#[test]
fn context_and_parallel_flags_as_llama_cpp_spells_them() {
    for flag in ["-c", "--ctx-size", "--ctx"] {
        let (ok, _, err) = coil(&["run", "-p", "To be or not to be", "-n", "40", flag, "8"]);
        assert!(
            !ok && err.contains("exceed the context of 8"),
            "{flag}: {err}"
        );
    }
    let (ok, _, err) = coil(&["run", "-p", "To be or not to be", "-n", "1048576"]);
    assert!(
        !ok && err.contains("exceed the context of 1048576"),
        "{err}"
    );
    let (ok, _, err) = coil(&["run", "-p", "To be", "-n", "2", "-c", "0"]);
    assert!(ok, "{err}");
    let (ok, out, err) = coil(&["bench", "-np", "2", "-p", "8", "-n", "2", "-r", "1"]);
    assert!(ok && out.contains("| 2 |"), "{out}{err}");
}
