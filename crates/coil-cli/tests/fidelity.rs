//! Numerics fidelity on trained files: coil's quantized forward is never
//! less faithful than llama.cpp's on the same file.
//!
//! The fixture (tests/fixtures/fidelity/, tools/train_fidelity_llama.py) is
//! a small trained Llama whose rows are whole K-quant super-blocks. Each
//! case quantizes it with `coil quantize` (the file's SHA-256 must be the
//! one tools/fidelity_reference.py recorded), dequantizes that file's
//! weights to F32 and runs coil's F32 forward over the fixture's token
//! windows as the reference. Then, per SIMD level of this CPU and per path
//! — the whole window as one prompt, token by token, four sequences
//! decoding side by side (batch-invariant, as `coil serve` decodes), and
//! speculative verification of five tokens a pass — the mean KL divergence
//! KL(reference ‖ coil) over the 640 positions must be at most 1.05 × the
//! mean KL of llama.cpp's same path on the same file against its own F32
//! forward (reference.json), and coil's top token may differ from the
//! reference's at most as often as llama.cpp's does, plus one, counted on the
//! positions that are not ties (the reference's first two tokens at least
//! `TIE_MARGIN` apart: below it, which comes first is rounding's chance).
//!
//! `cargo test -p coil-cli --test fidelity -- --nocapture` prints the
//! table.

use coil::engine::kld::{argmax, kl_logits};
use coil::engine::{BatchEntry, Engine, EngineOptions, Numerics};
use coil::models::LogitRows;
use coil_convert::{QuantMix, QuantizeOptions};
use coil_gguf::{GgmlType, GgufFile, GgufWriter, TensorSpec};
use coil_kernels::simd;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/fidelity")
}

fn json(name: &str) -> serde_json::Value {
    let s = std::fs::read_to_string(fixtures().join(name)).unwrap();
    serde_json::from_str(&s).unwrap()
}

fn windows() -> (usize, Vec<Vec<u32>>) {
    let w = json("windows.json");
    let n_ctx = w["n_ctx"].as_u64().unwrap() as usize;
    let ws = w["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            w.as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect::<Vec<u32>>()
        })
        .collect::<Vec<_>>();
    assert!(ws.iter().all(|w| w.len() == n_ctx) && ws.len() % 4 == 0);
    (n_ctx, ws)
}

/// A scratch folder of this test process.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("coil-fidelity-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `src` with every tensor as F32 (quantized ones dequantized).
fn dequantized(src: &Path, dst: &Path) {
    let f = GgufFile::open(src).unwrap();
    let specs: Vec<TensorSpec> = f
        .tensors()
        .iter()
        .map(|t| TensorSpec::new(t.name.clone(), &t.dims, GgmlType::F32))
        .collect();
    let mut w = GgufWriter::create(dst, f.metadata(), &specs).unwrap();
    for t in f.tensors() {
        let v = f.view(t).to_f32().unwrap();
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        w.write_tensor_data(&bytes).unwrap();
    }
    w.finish().unwrap();
}

fn engine(path: &Path, n_ctx: usize, n_seq: usize) -> Engine {
    let opts = EngineOptions {
        n_threads: 1,
        n_seq_max: n_seq,
        n_ctx,
        n_ubatch: n_ctx,
        ..EngineOptions::default()
    };
    Engine::load(path, opts).unwrap()
}

/// The paths a position's logits are computed by.
#[derive(Clone, Copy, Debug)]
enum Route {
    Prompt,
    Token,
    Batch4,
    Spec5,
}

impl Route {
    const ALL: [Route; 4] = [Route::Prompt, Route::Token, Route::Batch4, Route::Spec5];

    fn name(self) -> &'static str {
        match self {
            Route::Prompt => "prompt",
            Route::Token => "token",
            Route::Batch4 => "batch4",
            Route::Spec5 => "spec5",
        }
    }

    /// llama.cpp's path of reference.json it is held to (a verification
    /// pass of five tokens: llama.cpp's token-by-token numbers).
    fn llama(self) -> &'static str {
        match self {
            Route::Prompt => "prompt",
            Route::Token | Route::Spec5 => "token",
            Route::Batch4 => "batch4",
        }
    }
}

/// Every position's logits of every window, `[window][position][vocab]`
/// flattened per window.
fn run(path: &Path, how: Route, n_ctx: usize, ws: &[Vec<u32>]) -> Vec<Vec<f32>> {
    match how {
        Route::Prompt | Route::Token => {
            let mut e = engine(path, n_ctx, 1);
            let ub = if matches!(how, Route::Prompt) {
                n_ctx
            } else {
                1
            };
            ws.iter()
                .map(|w| {
                    e.seq_clear(0).unwrap();
                    e.eval(0, w, LogitRows::All, ub).unwrap()
                })
                .collect()
        }
        Route::Batch4 => {
            let mut out = Vec::new();
            let mut e = engine(path, n_ctx, 4);
            for group in ws.chunks(4) {
                e.mem_clear();
                let mut rows = vec![Vec::new(); group.len()];
                for i in 0..n_ctx {
                    let toks: Vec<[u32; 1]> = group.iter().map(|w| [w[i]]).collect();
                    let entries: Vec<BatchEntry> = toks
                        .iter()
                        .enumerate()
                        .map(|(s, t)| BatchEntry {
                            seq: s,
                            tokens: t,
                            logits: LogitRows::Last,
                        })
                        .collect();
                    let l = e
                        .decode_batch_with(&entries, Numerics::BatchInvariant)
                        .unwrap();
                    for (r, l) in rows.iter_mut().zip(l) {
                        r.extend_from_slice(&l);
                    }
                }
                out.extend(rows);
            }
            out
        }
        Route::Spec5 => {
            let mut e = engine(path, n_ctx, 1);
            ws.iter()
                .map(|w| {
                    e.seq_clear(0).unwrap();
                    let mut rows = Vec::new();
                    for chunk in w.chunks(5) {
                        rows.extend(e.spec_verify(0, chunk).unwrap());
                        e.spec_commit(0, chunk.len()).unwrap();
                    }
                    rows
                })
                .collect()
        }
    }
}

/// A position whose reference puts its first two tokens closer than this
/// (in logits) is a tie: which of them an engine's rounding puts first is
/// chance (tools/fidelity_reference.py's TIE_MARGIN).
const TIE_MARGIN: f32 = 0.01;

/// Of `got` against `reference`: the mean KL, the positions whose top token
/// differs, those of them that are not ties, and the positions.
struct Fidelity {
    kl: f64,
    flips: usize,
    flips_decided: usize,
    n: usize,
}

fn compare(reference: &[Vec<f32>], got: &[Vec<f32>], n_vocab: usize) -> Fidelity {
    let mut f = Fidelity {
        kl: 0.0,
        flips: 0,
        flips_decided: 0,
        n: 0,
    };
    for (r, g) in reference.iter().zip(got) {
        assert_eq!(r.len(), g.len());
        for (rr, gg) in r.chunks_exact(n_vocab).zip(g.chunks_exact(n_vocab)) {
            f.kl += kl_logits(rr, gg);
            let top = argmax(rr);
            if top != argmax(gg) {
                f.flips += 1;
                let second = rr
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i != top)
                    .map(|(_, &v)| v)
                    .fold(f32::NEG_INFINITY, f32::max);
                f.flips_decided += usize::from(rr[top] - second >= TIE_MARGIN);
            }
            f.n += 1;
        }
    }
    f.kl /= f.n as f64;
    f
}

fn sha256(p: &Path) -> String {
    let d = Sha256::digest(std::fs::read(p).unwrap());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The types quantized with the fixture's importance matrix
/// (`tests/fixtures/fidelity/imatrix.gguf`, made by the reference script).
const WITH_IMATRIX: [&str; 7] = [
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
];

fn check(mix: &str) {
    let reference = json("reference.json");
    let rec = &reference["types"][mix];
    assert!(
        !rec.is_null(),
        "{mix}: no llama.cpp numbers in reference.json (tools/fidelity_reference.py)"
    );
    let (n_ctx, ws) = windows();
    let dir = scratch(mix);
    let q = dir.join(format!("{mix}.gguf"));
    let mut opts = QuantizeOptions::new(QuantMix::parse(mix).unwrap());
    if WITH_IMATRIX.contains(&mix) {
        // by its name in the fixtures folder, as tools/fidelity_reference.py
        // passes it (the file records the name)
        let m = coil_convert::imatrix::Imatrix::read(&fixtures().join("imatrix.gguf")).unwrap();
        opts.imatrix = Some(("imatrix.gguf".to_string(), m));
    }
    coil_convert::quantize(&fixtures().join("shakespeare-llama-q8_0.gguf"), &q, &opts).unwrap();
    assert_eq!(
        sha256(&q),
        rec["sha256"].as_str().unwrap(),
        "{mix}: `coil quantize` writes another file than the one llama.cpp's numbers are of: run tools/fidelity_reference.py"
    );
    let f32_path = dir.join(format!("{mix}-f32.gguf"));
    dequantized(&q, &f32_path);
    let n_vocab = engine(&f32_path, n_ctx, 1).n_vocab();
    let base = run(&f32_path, Route::Prompt, n_ctx, &ws);
    let mut failures = Vec::new();
    for level in simd::available_levels() {
        let _cap = simd::level_scope(Some(level));
        for how in Route::ALL {
            let got = run(&q, how, n_ctx, &ws);
            let f = compare(&base, &got, n_vocab);
            let l = &rec["llama"][how.llama()];
            let l_kl = l["kl_mean"].as_f64().unwrap();
            let l_flips = ((1.0 - l["same_top"].as_f64().unwrap()) * f.n as f64).round() as usize;
            let l_decided = l["flips_decided"].as_u64().unwrap_or_else(|| {
                panic!(
                    "{mix}: reference.json has no flips_decided: run tools/fidelity_reference.py"
                )
            }) as usize;
            println!(
                "{mix:7} {:6} {:6}  coil KL {:.3e} flips {:2} ({:2} not ties)   llama.cpp KL {l_kl:.3e} flips {l_flips:2} ({l_decided:2})   ratio {:.3}",
                level.name(),
                how.name(),
                f.kl,
                f.flips,
                f.flips_decided,
                f.kl / l_kl
            );
            if f.kl > 1.05 * l_kl || f.flips_decided > l_decided + 1 {
                failures.push(format!(
                    "{mix} at {} ({}): KL {:.3e} (llama.cpp {l_kl:.3e}), top-token flips outside ties {} (llama.cpp {l_decided})",
                    level.name(),
                    how.name(),
                    f.kl,
                    f.flips_decided
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failures.is_empty(),
        "less faithful than llama.cpp:\n{}",
        failures.join("\n")
    );
}

#[test]
fn q4_0_is_as_faithful_as_llama_cpp() {
    check("Q4_0");
}

#[test]
fn q4_1_is_as_faithful_as_llama_cpp() {
    check("Q4_1");
}

#[test]
fn q4_k_m_is_as_faithful_as_llama_cpp() {
    check("Q4_K_M");
}

#[test]
fn q5_k_m_is_as_faithful_as_llama_cpp() {
    check("Q5_K_M");
}

#[test]
fn q6_k_is_as_faithful_as_llama_cpp() {
    check("Q6_K");
}

#[test]
fn q8_0_is_as_faithful_as_llama_cpp() {
    check("Q8_0");
}

#[test]
fn iq4_xs_is_as_faithful_as_llama_cpp() {
    check("IQ4_XS");
}

#[test]
fn iq1_s_is_as_faithful_as_llama_cpp() {
    check("IQ1_S");
}

#[test]
fn iq1_m_is_as_faithful_as_llama_cpp() {
    check("IQ1_M");
}

#[test]
fn iq2_xxs_is_as_faithful_as_llama_cpp() {
    check("IQ2_XXS");
}

#[test]
fn iq2_xs_is_as_faithful_as_llama_cpp() {
    check("IQ2_XS");
}

#[test]
fn iq2_s_is_as_faithful_as_llama_cpp() {
    check("IQ2_S");
}

#[test]
fn iq3_xxs_is_as_faithful_as_llama_cpp() {
    check("IQ3_XXS");
}

#[test]
fn iq3_s_is_as_faithful_as_llama_cpp() {
    check("IQ3_S");
}
