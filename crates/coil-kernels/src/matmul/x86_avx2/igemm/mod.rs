//! Integer GEMM for many tokens (prefill) at the AVX2 level (no VNNI): the
//! K-quants (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, [`kquant`])
//! and the formats of small integers with one scale (and for Q4_1 / Q5_1 a
//! min) per 32 values (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS:
//! [`scale32`]).
//!
//! Both multiply small integers exactly in i32 per scale group and apply
//! the float scales once per group: weights packed per panel of 8 rows
//! (one 256-bit vector of i32 / f32 lanes), activations quantized once per
//! call, a microkernel holding a few tokens × 8 rows in registers.
//! `panels.rs` is what they share: the panels over the thread pool, the
//! next panel's rows fetched while one is multiplied, the token tiles, the
//! stores.

mod kquant;
mod panels;
mod quant;
mod scale32;

use crate::matmul::weight::WeightRef;
use crate::pool::ThreadPool;
use coil_gguf::GgmlType;

/// Whether `ty` has an AVX2 integer GEMM.
/// (The dispatch table, `plan::FORMATS`, says when it runs; its test
/// checks the two agree.)
#[cfg(test)]
pub fn supported(ty: GgmlType) -> bool {
    kquant_format(ty) || scale32::supported(ty)
}

fn kquant_format(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_K | Q5_K | Q6_K | Q2_K | Q3_K)
}

/// `y = x · wᵀ` for `n_tokens` tokens. The caller checks [`supported`] and
/// that the CPU has AVX2 + FMA + F16C.
pub fn igemm(pool: &ThreadPool, w: &WeightRef, x: &[f32], y: &mut [f32], n_tokens: usize) {
    if kquant_format(w.ty) {
        kquant::igemm(pool, w, x, y, n_tokens)
    } else {
        scale32::igemm(pool, w, x, y, n_tokens)
    }
}

/// The activation quantization a matrix needs: matrices with the same one
/// can share it ([`igemm_many`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActKey {
    /// A K-quant's: one sum per `usize` values ([`kquant::act_group`]).
    KQuant(usize),
    /// The 32-value formats': tiles of i16 pairs, with the block sums of a
    /// min (Q4_1, Q5_1) or without.
    Scale32 { sums: bool },
}

/// The activation quantization `ty`'s products use, `None` where there is
/// no integer GEMM for it.
pub fn shared_acts(ty: GgmlType) -> Option<ActKey> {
    if kquant_format(ty) {
        Some(ActKey::KQuant(kquant::act_group(ty)))
    } else {
        scale32::supported(ty).then(|| ActKey::Scale32 {
            sums: scale32::has_min(ty),
        })
    }
}

/// `ys[i] = x · ws[i]ᵀ` for matrices of one [`shared_acts`] key: the
/// activations quantized once, each result bit for bit its [`igemm`].
pub fn igemm_many(
    pool: &ThreadPool,
    ws: &[&WeightRef],
    x: &[f32],
    ys: &mut [&mut [f32]],
    n_tokens: usize,
) {
    if kquant_format(ws[0].ty) {
        kquant::igemm_many(pool, ws, x, ys, n_tokens, crate::simd::avx_vnni())
    } else {
        scale32::igemm_many(pool, ws, x, ys, n_tokens)
    }
}
