//! The AVX-512 level (F/BW/VL/DQ + VNNI): one file per role, the same
//! names as `x86_avx2/` where the role exists there too.
//!
//! * `dots.rs` — one-token dot products (and 4 tokens per unpacked row)
//!   and one-token rows, their shared SIMD pieces, decoding to f32;
//! * `tiles.rs` — few-token tiles (up to 9 tokens per unpacked row);
//! * `lanes.rs` (Q4_K and Q5_K, the repacked layout's plumbing and their
//!   products),
//!   `lanes_q6_k.rs`, `lanes_q8_0.rs` — rows in the vector lanes of a
//!   matrix repacked at load time ([`crate::matmul::weight::Layout::Lanes16`]);
//! * `float_pairs.rs` — F16 / BF16 one-token rows in pairs;
//! * `igemm.rs` — the VNNI integer GEMM for prompts; `bf16_gemm.rs` — bf16
//!   products for BF16 prompts (AVX512_BF16).
//!
//! This file is the level's registry: which function serves which format
//! (`vec_kernel`, `tile_kernel`, `rows_kernel`); `matmul::plan` chooses
//! among the levels.

use crate::matmul::kernel::ActKind;
use crate::matmul::kernel::QuantRows;
use crate::matmul::kernel::TileKernel;
use crate::matmul::kernel::VecKernel;
use coil_gguf::GgmlType;
use dots::*;
// Q2_K / Q3_K: the AVX2 level's kernels compiled for this level
use super::x86_avx2::k23::wide as k23;
use k23::{
    dot4_q2_k as k23_dot4_q2_k, dot4_q3_k as k23_dot4_q3_k, dot_q2_k as k23_dot_q2_k,
    dot_q3_k as k23_dot_q3_k,
};

pub(super) mod bf16_gemm;
pub(super) mod dots;
pub(super) mod float_pairs;
pub(super) mod igemm;
pub(super) mod lanes;
#[cfg(test)]
mod lanes_check;
pub(super) mod lanes_q6_k;
pub(super) mod lanes_q8_0;
pub(super) mod packed;
mod tiles;

macro_rules! quant {
    ($act:ident, $one:ident, $four:ident) => {
        VecKernel::Quant(
            ActKind::$act,
            |r, q, d, s| unsafe { $one(r, q, d, s) },
            Some(|r, q, d, s| unsafe { $four(r, q, d, s) }),
        )
    };
}
pub(super) fn vec_kernel(ty: GgmlType) -> Option<VecKernel> {
    // SAFETY (all): selected only when the CPU has the AVX-512 level.
    Some(match ty {
        GgmlType::F32 => VecKernel::Float(|r, x| unsafe { dot_f32(r, x) }),
        GgmlType::F16 => VecKernel::Float(|r, x| unsafe { dot_f16(r, x) }),
        GgmlType::BF16 => VecKernel::Float(|r, x| unsafe { dot_bf16(r, x) }),
        GgmlType::Q8_0 => quant!(Q8_0, dot_q8_0, dot4_q8_0),
        GgmlType::Q4_0 => quant!(Q8_0, dot_q4_0, dot4_q4_0),
        GgmlType::IQ4_NL => quant!(Q8_0, dot_iq4_nl, dot4_iq4_nl),
        GgmlType::Q5_0 => quant!(Q8_0, dot_q5_0, dot4_q5_0),
        GgmlType::Q4_1 => quant!(Q8_0, dot_q4_1, dot4_q4_1),
        GgmlType::Q5_1 => quant!(Q8_0, dot_q5_1, dot4_q5_1),
        GgmlType::Q4_K => quant!(Q8K, dot_q4_k, dot4_q4_k),
        GgmlType::Q5_K => quant!(Q8K, dot_q5_k, dot4_q5_k),
        GgmlType::Q6_K => quant!(Q8K, dot_q6_k, dot4_q6_k),
        GgmlType::IQ4_XS => quant!(Q8K, dot_iq4_xs, dot4_iq4_xs),
        GgmlType::Q2_K => quant!(Q8K, k23_dot_q2_k, k23_dot4_q2_k),
        GgmlType::Q3_K => quant!(Q8K, k23_dot_q3_k, k23_dot4_q3_k),
        _ => return None,
    })
}
/// One-token kernels over a range of rows (see [`QuantRows`]).
pub(super) fn rows_kernel(ty: GgmlType) -> Option<QuantRows> {
    // SAFETY (all): selected only when the CPU has the AVX-512 level.
    Some(match ty {
        GgmlType::Q8_0 => |w, rb, q, d, s, o| unsafe { rows_q8_0(w, rb, q, d, s, o) },
        GgmlType::Q4_0 => |w, rb, q, d, s, o| unsafe { rows_q4_0(w, rb, q, d, s, o) },
        GgmlType::IQ4_NL => |w, rb, q, d, s, o| unsafe { rows_iq4_nl(w, rb, q, d, s, o) },
        GgmlType::Q5_0 => |w, rb, q, d, s, o| unsafe { rows_q5_0(w, rb, q, d, s, o) },
        GgmlType::Q4_1 => |w, rb, q, d, s, o| unsafe { rows_q4_1(w, rb, q, d, s, o) },
        GgmlType::Q5_1 => |w, rb, q, d, s, o| unsafe { rows_q5_1(w, rb, q, d, s, o) },
        GgmlType::Q4_K => |w, rb, q, d, s, o| unsafe { rows_q4_k(w, rb, q, d, s, o) },
        GgmlType::Q5_K => |w, rb, q, d, s, o| unsafe { rows_q5_k(w, rb, q, d, s, o) },
        GgmlType::Q6_K => |w, rb, q, d, s, o| unsafe { rows_q6_k(w, rb, q, d, s, o) },
        GgmlType::IQ4_XS => |w, rb, q, d, s, o| unsafe { rows_iq4_xs(w, rb, q, d, s, o) },
        GgmlType::Q2_K => |w, rb, q, d, s, o| unsafe { k23::rows_q2_k(w, rb, q, d, s, o) },
        GgmlType::Q3_K => |w, rb, q, d, s, o| unsafe { k23::rows_q3_k(w, rb, q, d, s, o) },
        _ => return None,
    })
}
/// The few-token row-range kernel of `ty` and the most tokens it takes per
/// call (each token's result bit for bit the one-token kernel's; see
/// `tiles.rs`).
pub(super) fn tile_kernel(ty: GgmlType) -> Option<TileKernel> {
    // SAFETY (all): selected only when the CPU has the AVX-512 level.
    let f: crate::matmul::kernel::QuantTile = match ty {
        GgmlType::Q4_K => |w, rb, a, o| unsafe { tiles::tile_q4_k(w, rb, a, o) },
        GgmlType::Q5_K => |w, rb, a, o| unsafe { tiles::tile_q5_k(w, rb, a, o) },
        GgmlType::Q6_K => |w, rb, a, o| unsafe { tiles::tile_q6_k(w, rb, a, o) },
        GgmlType::Q8_0 => |w, rb, a, o| unsafe { tiles::tile_q8_0(w, rb, a, o) },
        GgmlType::Q4_0 => |w, rb, a, o| unsafe { tiles::tile_q4_0(w, rb, a, o) },
        GgmlType::IQ4_NL => |w, rb, a, o| unsafe { tiles::tile_iq4_nl(w, rb, a, o) },
        GgmlType::Q5_0 => |w, rb, a, o| unsafe { tiles::tile_q5_0(w, rb, a, o) },
        GgmlType::Q4_1 => |w, rb, a, o| unsafe { tiles::tile_q4_1(w, rb, a, o) },
        GgmlType::Q5_1 => |w, rb, a, o| unsafe { tiles::tile_q5_1(w, rb, a, o) },
        _ => return None,
    };
    // the 32-value formats' tiles take whole groups of 8 blocks (the dot
    // kernels finish a row's last nb % 8 blocks at AVX2)
    let b32 = ty.block_size() == 32;
    Some(TileKernel {
        f,
        max_tokens: tiles::MAX_TOKENS,
        chunk: 64,
        cols_multiple: if b32 { 256 } else { 1 },
        // SAFETY: as `f`.
        own_panel: if b32 {
            Some(|a, t0, nt| unsafe { tiles::panel_b32(a, t0, nt) })
        } else {
            None
        },
    })
}
