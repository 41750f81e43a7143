//! `coil bench` as a user runs it (no timing assertions: only the report).

use std::path::PathBuf;
use std::process::Command;

fn model(arch: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../tests/fixtures/models/{arch}/model.f16.gguf"))
        .to_string_lossy()
        .into_owned()
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

#[test]
fn bench_json_reports_both_tests() {
    for (arch, want_arch) in [("mamba2", "mamba2"), ("granitemoehybrid", "granitehybrid")] {
        let m = model(arch);
        let (ok, out, err) = coil(&[
            "bench", "-m", &m, "-p", "16", "-n", "4", "-r", "2", "-t", "2", "--json",
        ]);
        assert!(ok, "{arch}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("bench prints JSON");
        assert_eq!(v["n_prompt"], 16);
        assert_eq!(v["n_gen"], 4);
        assert_eq!(v["threads"], 2);
        assert_eq!(v["repetitions"], 2);
        assert_eq!(v["arch"], want_arch);
        assert_eq!(v["model_type"], format!("{want_arch} F16"));
        for key in ["pp_tps", "tg_tps", "pp_tps_std", "tg_tps_std"] {
            let x = v[key].as_f64().unwrap_or(f64::NAN);
            assert!(x.is_finite() && x >= 0.0, "{arch}: {key} = {}", v[key]);
        }
        assert!(v["pp_tps"].as_f64().unwrap() > 0.0);
        assert!(v["tg_tps"].as_f64().unwrap() > 0.0);
        assert_eq!(v["pp_secs"].as_array().map(|a| a.len()), Some(2));
        assert_eq!(v["tg_secs"].as_array().map(|a| a.len()), Some(2));
        assert!(v["model_size"].as_u64().unwrap() > 0);
        assert!(v["model_n_params"].as_u64().unwrap() > 0);
    }
}

#[test]
fn bench_table_and_errors() {
    let m = model("mamba2");
    let (ok, out, err) = coil(&["bench", "-m", &m, "-p", "8", "-n", "0", "-r", "1"]);
    assert!(ok, "{err}");
    assert!(out.contains("| pp8 |"), "{out}");
    assert!(!out.contains("tg0"), "{out}");

    let (ok, _, err) = coil(&["bench", "-m", &m, "-p", "0", "-n", "0"]);
    assert!(!ok);
    assert!(err.contains("nothing to measure"), "{err}");
    let (ok, _, err) = coil(&["bench", "-m", &m, "-r", "0"]);
    assert!(!ok);
    assert!(err.contains("--repetitions"), "{err}");
    let (ok, _, err) = coil(&[
        "bench",
        "-m",
        "/nonexistent/model.gguf",
        "-p",
        "4",
        "-n",
        "1",
    ]);
    assert!(!ok);
    assert!(err.contains("error"), "{err}");
}

/// `-d N`: both tests run on a context of N tokens (llama-bench's depth),
/// and the report names it.
#[test]
fn bench_at_a_depth() {
    let m = model("granitemoehybrid");
    let (ok, out, err) = coil(&[
        "bench", "-m", &m, "-p", "8", "-n", "2", "-d", "40", "-r", "2", "-t", "2",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("| pp8 @ d40 |"), "{out}");
    assert!(out.contains("| tg2 @ d40 |"), "{out}");
    let (ok, out, err) = coil(&[
        "bench", "-m", &m, "-p", "8", "-n", "2", "-d", "40", "-r", "1", "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("bench prints JSON");
    assert_eq!(v["n_depth"], 40);
    assert!(v["pp_tps"].as_f64().unwrap() > 0.0);
    assert!(v["tg_tps"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_parallel_reports_every_sequence_count() {
    let m = model("granitemoehybrid");
    let (ok, out, err) = coil(&[
        "bench",
        "-m",
        &m,
        "-p",
        "8",
        "-n",
        "3",
        "-r",
        "1",
        "-t",
        "2",
        "--parallel",
        "1,3",
        "--json",
    ]);
    assert!(ok, "{err}");
    let rows: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    for (r, n) in rows.iter().zip([1, 3]) {
        assert_eq!(r["n_seq"], n);
        assert_eq!(r["n_prompt"], 8);
        assert_eq!(r["n_gen"], 3);
        for key in ["pp_tps", "tg_tps"] {
            let x = r[key].as_f64().unwrap_or(f64::NAN);
            assert!(x.is_finite() && x > 0.0, "{key} = {}", r[key]);
        }
    }
    let (ok, _, err) = coil(&["bench", "-m", &m, "-n", "2", "--parallel", "0"]);
    assert!(!ok);
    assert!(err.contains("at least 1"), "{err}");
}

fn coil_env(args: &[&str], simd: &str) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_coil"))
        .args(args)
        .env("COIL_SIMD", simd)
        .output()
        .expect("run coil");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The SIMD level and CPU features are reported (`--json` and the table's
/// stderr line); `COIL_SIMD` caps the level; a level the CPU lacks or an
/// unknown name is a clear error, not an illegal instruction.
#[test]
fn bench_reports_simd_level_and_refuses_levels_the_cpu_lacks() {
    let m = model("mamba2");
    let args = ["bench", "-m", &m, "-p", "8", "-n", "2", "-r", "1", "--json"];
    let (ok, out, err) = coil_env(&args, "scalar");
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("bench prints JSON");
    assert_eq!(v["simd"], "scalar");
    let cpu = v["cpu_simd"].as_str().expect("cpu_simd").to_string();
    assert!(
        ["scalar", "avx2", "avx512"].contains(&cpu.as_str()),
        "{cpu}"
    );
    assert!(v["cpu_features"].is_array(), "{v}");
    let info = v["system_info"].as_str().expect("system_info");
    assert!(info.starts_with("simd: scalar"), "{info}");
    assert!(info.contains("COIL_SIMD=scalar"), "{info}");

    let (ok, out, err) = coil_env(&["bench", "-m", &m, "-p", "8", "-n", "0", "-r", "1"], &cpu);
    assert!(ok, "{err}");
    assert!(out.contains("| pp8 |"), "{out}");
    assert!(err.contains(&format!("system: simd: {cpu}")), "{err}");

    let (ok, _, err) = coil_env(&args, "sse9");
    assert!(!ok);
    assert!(
        err.contains("COIL_SIMD=\"sse9\" names no SIMD level"),
        "{err}"
    );
    if cpu != "avx512" {
        let (ok, _, err) = coil_env(&args, "avx512");
        assert!(!ok, "COIL_SIMD=avx512 on a {cpu} CPU must fail");
        assert!(
            err.contains("COIL_SIMD=avx512 needs CPU features this CPU lacks"),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// `--state-type` / `--cache-type`: bf16 / f16 run and are reported; a
/// type that does not exist is refused with the allowed ones listed.
#[test]
fn bench_state_type() {
    let m = model("mamba2");
    let (ok, out, err) = coil(&[
        "bench",
        "-m",
        &m,
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
        "--json",
        "--state-type",
        "bf16",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("bench prints JSON");
    assert_eq!(v["state_type"], "bf16");
    assert!(v["tg_tps"].as_f64().unwrap() > 0.0);
    let (ok, out, err) = coil(&[
        "bench",
        "-m",
        &model("granitemoehybrid"),
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
        "--json",
        "--cache-type",
        "f16",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("bench prints JSON");
    assert_eq!(v["cache_type"], "f16");
    assert_eq!(v["state_type"], "f32");
    let (ok, _, err) = coil(&["bench", "-m", &m, "--cache-type", "q4_0"]);
    assert!(!ok);
    assert!(err.contains("allowed: f32, f16"), "{err}");
    let (ok, _, err) = coil(&["bench", "-m", &m, "--state-type", "f8"]);
    assert!(!ok);
    assert!(
        err.contains("f8") && err.contains("allowed: f32, bf16"),
        "{err}"
    );
    let (ok, _, err) = coil(&["bench", "-m", &m, "--checkpoint-spacing", "0"]);
    assert!(!ok);
    assert!(err.contains("--checkpoint-spacing"), "{err}");
    // `coil run` says what it stores.
    let (ok, _, err) = coil(&[
        "run",
        "-m",
        &m,
        "-p",
        "ROMEO:",
        "-n",
        "4",
        "--temp",
        "0",
        "--state-type",
        "bf16",
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("SSM state in bf16"), "{err}");
}

/// `--batch-invariant` and `--serve-numerics` run generated tokens as
/// `coil serve` decodes them (one entry of a batch-invariant call) as well
/// as the prompt (strictly invariant, or as the server's default).
#[test]
fn bench_batch_invariant_generates() {
    for (arch, flag) in [
        ("mamba2", "--batch-invariant"),
        ("jamba", "--batch-invariant"),
        ("mamba2", "--serve-numerics"),
    ] {
        let m = model(arch);
        let (ok, out, err) = coil(&[
            "bench", "-m", &m, "-p", "8", "-n", "3", "-r", "1", flag, "--json",
        ]);
        assert!(ok, "{arch}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("bench prints JSON");
        assert_eq!(v["batch_invariant"], flag == "--batch-invariant", "{arch}");
        assert_eq!(v["serve_numerics"], flag == "--serve-numerics", "{arch}");
        assert_eq!(v["n_gen"], 3);
        assert!(v["tg_tps"].as_f64().unwrap() > 0.0, "{arch}: {out}");
        assert!(v["pp_tps"].as_f64().unwrap() > 0.0, "{arch}: {out}");
    }
}
