//! `coil run --spec ngram` and `coil bench --spec ...` as a user runs them:
//! the same output as without speculation, counts in the summary, clear
//! errors for bad flags (no timing assertions).

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

fn model(arch: &str) -> String {
    repo()
        .join(format!("tests/fixtures/models/{arch}/model.f16.gguf"))
        .to_string_lossy()
        .into_owned()
}

/// The count after `label` in the speculation summary line.
fn count(err: &str, label: &str) -> usize {
    let line = err
        .lines()
        .find(|l| l.starts_with("speculative:"))
        .unwrap_or_else(|| panic!("no speculation summary in {err}"));
    let at = line
        .find(label)
        .unwrap_or_else(|| panic!("{label} in {line}"));
    line[..at]
        .split_whitespace()
        .last()
        .and_then(|w| w.trim_start_matches('(').parse().ok())
        .unwrap_or_else(|| panic!("{label} in {line}"))
}

#[test]
fn run_with_ngram_speculation_prints_the_same_text() {
    let passage = "the cat sat on the mat and the dog sat on the log; ".repeat(3);
    let demo = repo()
        .join("models/shakespeare-hybrid-q8_0.gguf")
        .to_string_lossy()
        .into_owned();
    // Three fixtures (Mamba-2 refolds, Granite-4.0-H hybrid refolds, Jamba
    // replays) and the bundled demo model (Q8_0 weights), greedy and
    // sampled with a seed.
    let runs = [
        (model("mamba2"), "0"),
        (model("granitemoehybrid"), "0"),
        (model("jamba"), "0"),
        (demo.clone(), "0"),
        (demo, "0.8"),
        (model("granitemoehybrid"), "1.0"),
    ];
    for (m, temp) in &runs {
        let arch = format!("{m} at temperature {temp}");
        let base = [
            "run",
            "-m",
            m,
            "-p",
            &passage,
            "-n",
            "48",
            "--temp",
            temp,
            "--seed",
            "5",
            "-t",
            "2",
            "--ignore-eos",
        ];
        let (ok, plain, err) = coil(&base);
        assert!(ok, "{arch}: {err}");
        assert!(!err.contains("speculative:"), "{err}");
        let mut args = base.to_vec();
        args.extend(["--spec", "ngram", "--draft-max", "6", "--ngram", "3"]);
        let (ok, spec, err) = coil(&args);
        assert!(ok, "{arch}: {err}");
        assert_eq!(spec, plain, "{arch}: speculation changed the output");
        let drafted = count(&err, "drafted");
        let accepted = count(&err, "accepted");
        assert!(drafted > 0 && accepted <= drafted, "{arch}: {err}");
    }
}

/// The README's first command, sampled, with and without `--spec ngram`:
/// the same text at the CPU's own level and at the AVX2 level (where Q8_0
/// decode of one sequence takes other kernels than a batched engine's; a
/// speculative run must take the plain run's).
#[test]
fn readme_command_prints_the_same_text_with_speculation() {
    let demo = repo()
        .join("models/shakespeare-hybrid-q8_0.gguf")
        .to_string_lossy()
        .into_owned();
    let mut levels = vec![None];
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
    {
        levels.push(Some("avx2"));
    }
    for level in levels {
        let run = |spec: bool| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_coil"));
            cmd.args([
                "run", "-m", &demo, "-p", "ROMEO:", "-n", "120", "--seed", "42",
            ]);
            cmd.args(["-t", "2"]);
            if spec {
                cmd.args(["--spec", "ngram"]);
            }
            if let Some(l) = level {
                cmd.env("COIL_SIMD", l);
            }
            let out = cmd.output().expect("run coil");
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(out.status.success(), "{level:?}: {err}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert_eq!(
            run(true),
            run(false),
            "{level:?}: speculation changed the sampled text"
        );
    }
}

#[test]
fn bad_speculation_flags_are_clear_errors() {
    let m = model("mamba2");
    for (flags, want) in [
        (vec!["--spec", "ngram", "--draft-max", "0"], "--draft-max"),
        (
            vec!["--spec", "ngram", "--draft-max", "1000"],
            "--draft-max",
        ),
        (vec!["--spec", "ngram", "--ngram", "0"], "--ngram"),
        (vec!["--spec", "ngram", "--ngram", "99"], "--ngram"),
        (vec!["--spec", "eagle"], "eagle"),
    ] {
        let mut args = vec!["run", "-m", &m, "-p", "hello", "-n", "2"];
        args.extend(flags.iter().copied());
        let (ok, _, err) = coil(&args);
        assert!(!ok, "{flags:?} should fail");
        assert!(err.contains(want), "{flags:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // Draft flags without --spec: a notice, plain decoding.
    let (ok, _, err) = coil(&[
        "run",
        "-m",
        &m,
        "-p",
        "hello",
        "-n",
        "2",
        "--draft-max",
        "3",
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("no effect without --spec"), "{err}");
    assert!(!err.contains("speculative:"), "{err}");
}

#[test]
fn bench_spec_modes_report_identical_tokens() {
    let m = model("mamba2");
    for mode in ["right", "wrong", "ngram"] {
        let (ok, out, err) = coil(&[
            "bench",
            "-m",
            &m,
            "--spec",
            mode,
            "-p",
            "8",
            "-n",
            "24",
            "-r",
            "1",
            "-t",
            "2",
            "--draft-max",
            "2,5",
        ]);
        assert!(ok, "{mode}: {err}");
        let rows: Vec<&str> = out
            .lines()
            .filter(|l| l.contains(&format!("| {mode}")))
            .collect();
        assert_eq!(rows.len(), 2, "{mode}: {out}");
        for r in rows {
            assert!(r.trim_end().ends_with("| yes |"), "{mode}: {r}");
        }
    }
    let (ok, out, err) = coil(&[
        "bench",
        "-m",
        &m,
        "--spec",
        "verify",
        "-p",
        "8",
        "-n",
        "3",
        "-r",
        "1",
        "-t",
        "2",
        "--draft-max",
        "1,4",
    ]);
    assert!(ok, "{err}");
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("| ") && l.contains(".gguf"))
            .count(),
        2,
        "{out}"
    );
    let (ok, _, err) = coil(&["bench", "-m", &m, "--spec", "right", "--draft-max", "0"]);
    assert!(!ok && err.contains("--draft-max"), "{err}");
}

/// `--spec mtp` (the Qwen3.5 fixture with an MTP block) and `-md` (a draft
/// model of the same vocabulary) in `coil run`: the text of plain
/// decoding, greedy and sampled with a seed; and the bad inputs as clear
/// errors at start.
#[test]
fn run_with_mtp_and_a_draft_model_prints_the_same_text() {
    let nextn = repo()
        .join("tests/fixtures/nextn/qwen35/model.gguf")
        .to_string_lossy()
        .into_owned();
    let (granite, mamba2) = (model("granitemoehybrid"), model("mamba2"));
    let md_eq = format!("-md={mamba2}");
    let runs: [(&str, Vec<&str>); 4] = [
        (&nextn, vec!["--spec", "mtp", "--draft-max", "3"]),
        (&granite, vec!["-md", &mamba2]),
        (&granite, vec!["--spec", "draft", "--model-draft", &granite]),
        (&granite, vec![&md_eq]),
    ];
    for (m, flags) in &runs {
        for temp in ["0", "0.8"] {
            let base = [
                "run",
                "-m",
                m,
                "-p",
                "one two three",
                "-n",
                "24",
                "--temp",
                temp,
                "--seed",
                "3",
                "-t",
                "2",
                "--ignore-eos",
            ];
            let (ok, plain, err) = coil(&base);
            assert!(ok, "{err}");
            let mut args = base.to_vec();
            args.extend(flags.iter().copied());
            let (ok, spec, err) = coil(&args);
            let what = format!("{m} {flags:?} at {temp}");
            assert!(ok, "{what}: {err}");
            assert_eq!(spec, plain, "{what}: speculation changed the output");
            assert!(count(&err, "drafted") > 0, "{what}: {err}");
        }
    }
    let qwen_vocab = repo()
        .join("tests/fixtures/parity/qwen35_tiny/model.gguf")
        .to_string_lossy()
        .into_owned();
    for (args, want) in [
        (
            vec!["run", "-m", &granite, "--spec", "mtp"],
            "no NextN / MTP layers",
        ),
        (
            vec!["run", "-m", &granite, "-md", &qwen_vocab],
            "vocabulary",
        ),
        (
            vec!["run", "-m", &granite, "-md", &granite, "--spec", "mtp"],
            "--model-draft",
        ),
        (
            vec!["run", "-m", &granite, "--spec", "draft"],
            "--model-draft FILE",
        ),
        (
            vec!["serve", "-m", &granite, "-md", &qwen_vocab],
            "vocabulary",
        ),
        (
            vec!["chat", "-m", &granite, "--spec", "mtp"],
            "no NextN / MTP layers",
        ),
        (
            vec!["bench", "-m", &granite, "--spec", "mtp", "-n", "4"],
            "no NextN / MTP layers",
        ),
    ] {
        let mut a = args.clone();
        if a[0] == "run" {
            a.extend(["-p", "hello", "-n", "2"]);
        }
        let (ok, _, err) = coil(&a);
        assert!(!ok, "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// The trained MTP fixture (tests/fixtures/mtp/, `tools/train_demo.py
/// --model qwen35-mtp`): `coil run --spec mtp` prints the text of plain
/// decoding, greedy and sampled with a seed, and greedy keeps most of the
/// block's drafts (a random block's are almost never kept).
#[test]
fn run_with_the_trained_mtp_block_keeps_most_drafts() {
    let m = repo()
        .join("tests/fixtures/mtp/model.q8_0.gguf")
        .to_string_lossy()
        .into_owned();
    for temp in ["0", "0.8"] {
        let base = [
            "run",
            "-m",
            &m,
            "-p",
            "ROMEO:",
            "-n",
            "64",
            "--temp",
            temp,
            "--seed",
            "9",
            "-t",
            "2",
            "--ignore-eos",
        ];
        let (ok, plain, err) = coil(&base);
        assert!(ok, "{err}");
        let mut args = base.to_vec();
        args.extend(["--spec", "mtp", "--draft-max", "3"]);
        let (ok, spec, err) = coil(&args);
        assert!(ok, "{err}");
        assert_eq!(
            spec, plain,
            "at temperature {temp}: speculation changed the output"
        );
        let (drafted, accepted) = (count(&err, "drafted"), count(&err, "accepted"));
        assert!(drafted > 0 && accepted <= drafted, "{err}");
        if temp == "0" {
            assert!(
                accepted * 10 >= drafted * 4,
                "greedy: {accepted} of {drafted} drafts accepted"
            );
        }
    }
}
