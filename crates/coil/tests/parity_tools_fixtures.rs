//! Parity with transformers' float32 logits on the fixtures that
//! `tools/make_fixtures.py` writes (tests/fixtures/parity/<name>/): all-F32
//! GGUFs of tiny random Mamba / Mamba-2 models with shapes the llama.cpp
//! fixtures don't cover (d_inner ≠ 2·d_model, d_state 8 / 12 / 24, d_conv
//! 2 / 3, dt_rank 5, n_groups 1 and 4, head_dim 24, untied output), and of
//! hybrids that llama.cpp's converter gets wrong or refuses: Bamba with
//! partial RoPE permuted correctly (`coil.rope.partial_permute`),
//! GraniteMoeHybrid with RoPE, Nemotron-H mixing dense and MoE layers,
//! Nemotron-H without attention, and a small GQA / top-2 Jamba.
//! Max |Δ| ≤ 1e-4 · max|logit|, same argmax everywhere — for full prefill,
//! token by token, micro-batches of 7 and mixed micro-batch sizes.

mod common;

fn run(name: &str) {
    common::check_parity(name, &common::tool_fixture(name));
}

#[test]
fn mamba_dstate8_matches_transformers() {
    run("mamba_dstate8");
}

#[test]
fn mamba2_g4_hd24_matches_transformers() {
    run("mamba2_g4_hd24");
}

#[test]
fn mamba2_g1_hd16_matches_transformers() {
    run("mamba2_g1_hd16");
}

// Hybrids whose llama.cpp conversion is wrong or refused (see
// tests/fixtures/parity/README.md).

#[test]
fn bamba_partial_rope_matches_transformers() {
    run("bamba_partial_rope");
}

#[test]
fn granitemoehybrid_rope_matches_transformers() {
    run("granitemoehybrid_rope");
}

#[test]
fn nemotron_h_mixed_matches_transformers() {
    run("nemotron_h_mixed");
}

#[test]
fn nemotron_h_no_attn_matches_transformers() {
    run("nemotron_h_no_attn");
}

#[test]
fn jamba_small_matches_transformers() {
    run("jamba_small");
}
