//! Block formats against the reference `gguf` Python package (`gguf.quants`,
//! mirroring ggml). The vectors in `tests/fixtures/quant/` come from
//! `tools/gen_quant_vectors.py`, which documents the file layout:
//!
//! - `<fmt>.blocks.bin` / `<fmt>.blocks.deq.f32`: random valid blocks and their
//!   reference dequantization (every format);
//! - `<fmt>.in.f32` / `<fmt>.in.q.bin` / `<fmt>.in.deq.f32`: f32 input, its
//!   reference quantization and that one's dequantization (quantizable formats).
//!
//! Everything must match to the bit (0 ulp). The one allowance: where the
//! reference value is a NaN made by arithmetic inside a block format (e.g.
//! `inf · 0` when an f16 scale overflowed to inf), any NaN is accepted, since
//! the bits of such a NaN are the CPU's choice, not the format's. NaNs that are
//! data (F32/F16/BF16 conversions) must match bit for bit.

use std::path::PathBuf;

use coil_gguf::quant::{
    can_dequantize, can_quantize, dequantize_row, quantize_row, quantize_row_weighted,
    quantize_rows, requires_weights,
};
use coil_gguf::GgmlType;

const DEQUANT_ONLY: [&str; 8] = [
    "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q8_k", "iq4_nl", "iq4_xs",
];
const QUANTIZABLE: [&str; 8] = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"];
/// Quantized by coil (ggml's reference algorithms) but not by `gguf.quants`:
/// checked against ggml's C code instead (`kquants_match_ggml_reference`).
const QUANTIZABLE_NO_VECTORS: [&str; 7] =
    ["q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs"];

/// Made by ggml itself (`tools/gen_iq_vectors.py`, `tools/qref.c`): random
/// blocks and their `dequantize_row_*`, and `ggml_quantize_chunk` of
/// `iq.ggml.in.f32` without (`.ggml.q.bin`) and with (`.ggml.qw.bin`) the
/// importance weights `iq.ggml.w.f32`.
const GGML_VECTORS: [&str; 10] = [
    "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "tq1_0", "tq2_0", "mxfp4",
];

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/quant")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    assert_eq!(bytes.len() % 4, 0);
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn ty(name: &str) -> GgmlType {
    GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"))
}

/// Asserts `got` equals `want` bit for bit (see the module comment for NaNs).
fn assert_bits(ty: GgmlType, what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{ty} {what}: length");
    let nan_is_data = ty.is_plain();
    let mut bad = Vec::new();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = g.to_bits() == w.to_bits() || (!nan_is_data && g.is_nan() && w.is_nan());
        if !ok {
            bad.push(format!(
                "[{i}] got {g:e} ({:#010x}) want {w:e} ({:#010x})",
                g.to_bits(),
                w.to_bits()
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{ty} {what}: {} of {} values differ, first: {:?}",
        bad.len(),
        got.len(),
        &bad[..bad.len().min(8)]
    );
}

fn check_dequant(name: &str, q_file: &str, deq_file: &str) -> usize {
    let t = ty(name);
    assert!(can_dequantize(t), "{t}");
    let q = fixture(q_file);
    let want = f32s(&fixture(deq_file));
    let (bs, ts) = t.block_layout();
    assert_eq!(q.len() / ts * bs, want.len(), "{q_file} vs {deq_file}");
    let mut got = vec![f32::NAN; want.len()];
    dequantize_row(t, &q, &mut got).unwrap();
    assert_bits(t, q_file, &got, &want);
    // Row by row in pieces of a few blocks gives the same result.
    let piece_blocks = 3;
    let mut pieced = vec![0f32; want.len()];
    for (qc, yc) in q
        .chunks(piece_blocks * ts)
        .zip(pieced.chunks_mut(piece_blocks * bs))
    {
        dequantize_row(t, qc, yc).unwrap();
    }
    assert_bits(t, "pieces", &pieced, &want);
    want.len()
}

#[test]
fn dequantize_random_blocks_matches_gguf_py() {
    let mut total = 0;
    for name in DEQUANT_ONLY.iter().chain(QUANTIZABLE.iter()) {
        let n = check_dequant(
            name,
            &format!("{name}.blocks.bin"),
            &format!("{name}.blocks.deq.f32"),
        );
        assert!(n >= 256, "{name}: only {n} values");
        total += n;
    }
    assert!(total > 20_000);
}

#[test]
fn dequantize_matches_ggml_for_the_lattice_ternary_and_fp4_formats() {
    for name in GGML_VECTORS {
        let n = check_dequant(
            name,
            &format!("{name}.blocks.bin"),
            &format!("{name}.blocks.deq.f32"),
        );
        assert!(n >= 768, "{name}: only {n} values");
    }
}

/// Rows of this many values in `iq.ggml.in.f32` (the importance weights
/// `iq.ggml.w.f32` have one per column).
const IQ_ROW: usize = 512;

#[test]
fn quantize_matches_ggml_for_the_lattice_ternary_and_fp4_formats() {
    let x = f32s(&fixture("iq.ggml.in.f32"));
    let w = f32s(&fixture("iq.ggml.w.f32"));
    assert_eq!(w.len(), IQ_ROW);
    let mut compared = 0;
    for name in GGML_VECTORS {
        let t = ty(name);
        if !can_quantize(t) {
            continue;
        }
        let ts = t.type_size();
        let row_bytes = IQ_ROW / t.block_size() * ts;
        for (file, weights) in [("ggml.q.bin", None), ("ggml.qw.bin", Some(&w[..]))] {
            let Ok(want) = std::fs::read(
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/quant")
                    .join(format!("{name}.{file}")),
            ) else {
                assert!(weights.is_none(), "{name}.{file} is missing");
                assert!(requires_weights(t), "{name}: no vectors without weights");
                continue;
            };
            let mut got = vec![0u8; want.len()];
            quantize_rows(t, &x, IQ_ROW, weights, &mut got).unwrap();
            // and row by row
            let mut rows = vec![0u8; want.len()];
            for (xr, yr) in x.chunks(IQ_ROW).zip(rows.chunks_mut(row_bytes)) {
                quantize_row_weighted(t, xr, weights, yr).unwrap();
            }
            assert_eq!(rows, got, "{t} {file}: row by row");
            let bad: Vec<usize> = (0..want.len() / ts)
                .filter(|&b| got[b * ts..(b + 1) * ts] != want[b * ts..(b + 1) * ts])
                .collect();
            assert!(
                bad.is_empty(),
                "{t} {file}: blocks {bad:?} differ from ggml"
            );
            compared += 1;
        }
    }
    // every format with importance weights, all but IQ2_XXS, IQ2_XS and IQ1_S without
    assert_eq!(compared, 17);
}

/// The legacy, K-quant and IQ4 formats with importance weights (ggml's
/// `quantize_row_*_impl`, what llama-quantize `--imatrix` runs), byte for
/// byte, on the lattice formats' input and weights.
#[test]
fn weighted_quantize_matches_ggml_for_the_legacy_k_and_iq4_formats() {
    let x = f32s(&fixture("iq.ggml.in.f32"));
    let w = f32s(&fixture("iq.ggml.w.f32"));
    for name in [
        "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs",
    ] {
        let t = ty(name);
        let want = fixture(&format!("{name}.ggml.qw.bin"));
        let ts = t.type_size();
        let mut got = vec![0u8; want.len()];
        quantize_rows(t, &x, IQ_ROW, Some(&w), &mut got).unwrap();
        let bad: Vec<usize> = (0..want.len() / ts)
            .filter(|&b| got[b * ts..(b + 1) * ts] != want[b * ts..(b + 1) * ts])
            .collect();
        if let Some(&b) = bad.first() {
            panic!(
                "{t}: blocks {bad:?} differ from ggml; block {b}:\n got  {:02x?}\n want {:02x?}",
                &got[b * ts..(b + 1) * ts],
                &want[b * ts..(b + 1) * ts]
            );
        }
        // the weights matter: without them the bytes differ
        let mut plain = vec![0u8; want.len()];
        quantize_rows(t, &x, IQ_ROW, None, &mut plain).unwrap();
        assert_ne!(plain, got, "{t}: the weights changed nothing");
    }
}

#[test]
fn dequantize_quantized_input_matches_gguf_py() {
    for name in QUANTIZABLE {
        check_dequant(
            name,
            &format!("{name}.in.q.bin"),
            &format!("{name}.in.deq.f32"),
        );
    }
}

#[test]
fn quantize_matches_gguf_py_bytes() {
    for name in QUANTIZABLE {
        let t = ty(name);
        assert!(can_quantize(t), "{t}");
        let x = f32s(&fixture(&format!("{name}.in.f32")));
        let want = fixture(&format!("{name}.in.q.bin"));
        let (bs, ts) = t.block_layout();
        assert_eq!(x.len() / bs * ts, want.len(), "{name}");
        let mut got = vec![0u8; want.len()];
        quantize_row(t, &x, &mut got).unwrap();
        let bad: Vec<usize> = (0..want.len() / ts)
            .filter(|&b| got[b * ts..(b + 1) * ts] != want[b * ts..(b + 1) * ts])
            .collect();
        if let Some(&b) = bad.first() {
            panic!(
                "{t}: {} of {} blocks differ; first block {b}: input {:?}\n got  {:02x?}\n want {:02x?}",
                bad.len(),
                want.len() / ts,
                &x[b * bs..(b + 1) * bs],
                &got[b * ts..(b + 1) * ts],
                &want[b * ts..(b + 1) * ts]
            );
        }
    }
}

#[test]
fn fixtures_cover_every_supported_format() {
    for t in GgmlType::ALL {
        let name = t.name().to_ascii_lowercase();
        let listed = DEQUANT_ONLY.contains(&name.as_str())
            || QUANTIZABLE.contains(&name.as_str())
            || GGML_VECTORS.contains(&name.as_str());
        assert_eq!(can_dequantize(t), listed, "{t}");
        if can_quantize(t) {
            assert!(
                QUANTIZABLE.contains(&name.as_str())
                    || QUANTIZABLE_NO_VECTORS.contains(&name.as_str())
                    || GGML_VECTORS.contains(&name.as_str()),
                "{t}"
            );
        }
    }
}

/// Q2_K..Q6_K, IQ4_NL and IQ4_XS against ggml's quantizers
/// (`quantize_row_q*_K_ref`, `quantize_iq4_{nl,xs}` without an importance
/// matrix, of llama.cpp's `ggml-quants.c` in its `ggml-base`, no FMA;
/// `tools/qref.c`) on 15 blocks of 256: normal, heavy-tailed, zero,
/// constant, one-signed, outliers. Bit-identical.
#[test]
fn kquants_match_ggml_reference() {
    let x = f32s(&fixture("kquant.ggml.in.f32"));
    for (name, t) in [
        ("q2_k", GgmlType::Q2_K),
        ("q3_k", GgmlType::Q3_K),
        ("q4_k", GgmlType::Q4_K),
        ("q5_k", GgmlType::Q5_K),
        ("q6_k", GgmlType::Q6_K),
        ("iq4_nl", GgmlType::IQ4_NL),
        ("iq4_xs", GgmlType::IQ4_XS),
    ] {
        let want = fixture(&format!("{name}.ggml.q.bin"));
        let mut got = vec![0u8; want.len()];
        quantize_row(t, &x, &mut got).unwrap();
        let ts = t.type_size();
        let bad: Vec<usize> = (0..want.len() / ts)
            .filter(|&b| got[b * ts..(b + 1) * ts] != want[b * ts..(b + 1) * ts])
            .collect();
        assert!(bad.is_empty(), "{t}: blocks {bad:?} differ from ggml");
    }
}
