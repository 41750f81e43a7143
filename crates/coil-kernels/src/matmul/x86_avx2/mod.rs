//! The AVX2 (+FMA, F16C) level: one file per role, the same names as
//! `x86_avx512/` where the role exists there too.
//!
//! * `dots.rs` — one-token dot products and one-token rows of every format
//!   it has (row at a time), their shared SIMD pieces, decoding to f32;
//! * `tiles.rs` — few-token tiles (up to 9 tokens per unpacked row);
//! * `lanes.rs` (Q4_K and what the three share), `lanes_q6_k.rs`,
//!   `lanes_b32.rs` (the 32-value formats) — rows in the vector lanes (8
//!   rows side by side, 16 tokens per pass; `plan::avx2_lanes` says which
//!   formats);
//! * `k23.rs` — Q2_K / Q3_K dots (also compiled for the AVX-512 level);
//! * `legacy.rs` — Q4_1 / Q5_0 / Q5_1 dots;
//! * `float_pairs.rs` — F16 / BF16 one-token rows in pairs;
//! * `igemm/` — the integer GEMM for prompts; `decode_i8.rs` — weights
//!   unpacked to small integers for both levels' integer GEMMs.
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

/// Calls `$f::<n>($args)` (`$f<T>`: `$f::<T, n>($args)`) for the token
/// count `n` = `$nt` (1 to 9): the rows-in-lanes kernels' few-token
/// entries.
macro_rules! by_token_count {
    ($nt:expr, $f:ident $(<$g:tt>)?, $what:expr, ($($a:expr),*)) => {
        match $nt {
            1 => $f::<$($g,)? 1>($($a),*),
            2 => $f::<$($g,)? 2>($($a),*),
            3 => $f::<$($g,)? 3>($($a),*),
            4 => $f::<$($g,)? 4>($($a),*),
            5 => $f::<$($g,)? 5>($($a),*),
            6 => $f::<$($g,)? 6>($($a),*),
            7 => $f::<$($g,)? 7>($($a),*),
            8 => $f::<$($g,)? 8>($($a),*),
            9 => $f::<$($g,)? 9>($($a),*),
            n => panic!("{} lanes tile: unsupported token count {n}", $what),
        }
    };
    // up to 16 tokens
    ($nt:expr, $f:ident $(<$g:tt>)?, $what:expr, ($($a:expr),*), 16) => {
        match $nt {
            10 => $f::<$($g,)? 10>($($a),*),
            11 => $f::<$($g,)? 11>($($a),*),
            12 => $f::<$($g,)? 12>($($a),*),
            13 => $f::<$($g,)? 13>($($a),*),
            14 => $f::<$($g,)? 14>($($a),*),
            15 => $f::<$($g,)? 15>($($a),*),
            16 => $f::<$($g,)? 16>($($a),*),
            n => by_token_count!(n, $f $(<$g>)?, $what, ($($a),*)),
        }
    };
}

pub(super) mod decode_i8;
pub(super) mod decode_iq;
pub(super) mod dots;
mod dots_iq;
pub(super) mod float_pairs;
pub(super) mod igemm;
pub(super) mod k23;
pub(super) mod lanes;
mod lanes_b32;
mod lanes_q6_k;
pub(super) mod legacy;
mod tiles;

/// The rows-in-lanes kernels of a 32-value format (`lanes_b32.rs`): its
/// dot (`dot`), few-token tile and its length (`tile`), one-token rows
/// (`rows`).
macro_rules! b32 {
    (dot, $f:ty) => {
        VecKernel::Quant(
            ActKind::Q8_0,
            |r, q, d, s| unsafe { lanes_b32::dot::<$f>(r, q, d, s) },
            None,
        )
    };
    (tile, $f:ty) => {
        (
            |w, rb, a, o| unsafe { lanes_b32::tile::<$f>(w, rb, a, o) },
            lanes_b32::MAX_TOKENS,
        )
    };
    (rows, $f:ty) => {
        |w, rb, q, d, s, o| unsafe { lanes_b32::rows_one::<$f>(w, rb, q, d, s, o) }
    };
}

/// A one-token dot of `dots_iq.rs` against activations quantized as `$acts`.
macro_rules! iq {
    ($acts:expr, $($dot:tt)+) => {
        VecKernel::Quant(
            $acts,
            |r, q, d, s| unsafe { dots_iq::$($dot)+(r, q, d, s) },
            None,
        )
    };
}

pub(super) fn vec_kernel(ty: GgmlType, lanes: bool) -> Option<VecKernel> {
    use ActKind::*;
    // SAFETY (all): selected only when the CPU has AVX2+FMA+F16C.
    Some(match ty {
        GgmlType::F32 => VecKernel::Float(|r, x| unsafe { dot_f32(r, x) }),
        GgmlType::F16 => VecKernel::Float(|r, x| unsafe { dot_f16(r, x) }),
        GgmlType::BF16 => VecKernel::Float(|r, x| unsafe { dot_bf16(r, x) }),
        GgmlType::Q8_0 if lanes => b32!(dot, lanes_b32::Q8_0),
        GgmlType::Q4_0 if lanes => b32!(dot, lanes_b32::Q4_0),
        GgmlType::IQ4_NL if lanes => b32!(dot, lanes_b32::Iq4Nl),
        GgmlType::Q5_0 if lanes => b32!(dot, lanes_b32::Q5_0),
        GgmlType::Q4_1 if lanes => b32!(dot, lanes_b32::Q4_1),
        GgmlType::Q5_1 if lanes => b32!(dot, lanes_b32::Q5_1),
        GgmlType::Q8_0 => {
            VecKernel::Quant(Q8_0, |r, q, d, s| unsafe { dot_q8_0(r, q, d, s) }, None)
        }
        GgmlType::Q4_0 => {
            VecKernel::Quant(Q8_0, |r, q, d, s| unsafe { dot_q4_0(r, q, d, s) }, None)
        }
        GgmlType::IQ4_NL => {
            VecKernel::Quant(Q8_0, |r, q, d, s| unsafe { dot_iq4_nl(r, q, d, s) }, None)
        }
        GgmlType::Q5_0 => VecKernel::Quant(
            Q8_0,
            |r, q, d, s| unsafe { legacy::dot_q5_0(r, q, d, s) },
            None,
        ),
        GgmlType::Q5_1 => VecKernel::Quant(
            Q8_0,
            |r, q, d, s| unsafe { legacy::dot_q5_1(r, q, d, s) },
            None,
        ),
        GgmlType::Q4_1 => VecKernel::Quant(
            Q8_0,
            |r, q, d, s| unsafe { legacy::dot_q4_1(r, q, d, s) },
            None,
        ),
        GgmlType::Q2_K => VecKernel::Quant(
            Q8K,
            |r, q, d, s| unsafe { k23::avx2::dot_q2_k(r, q, d, s) },
            Some(|r, q, d, s| unsafe { k23::avx2::dot4_q2_k(r, q, d, s) }),
        ),
        GgmlType::Q3_K => VecKernel::Quant(
            Q8K,
            |r, q, d, s| unsafe { k23::avx2::dot_q3_k(r, q, d, s) },
            Some(|r, q, d, s| unsafe { k23::avx2::dot4_q3_k(r, q, d, s) }),
        ),
        GgmlType::Q4_K if lanes => VecKernel::Quant(
            Q8K,
            |r, q, d, s| unsafe { lanes::dot::<false>(r, q, d, s) },
            None,
        ),
        GgmlType::Q5_K if lanes => VecKernel::Quant(
            Q8K,
            |r, q, d, s| unsafe { lanes::dot::<true>(r, q, d, s) },
            None,
        ),
        GgmlType::Q6_K if lanes => VecKernel::Quant(
            Q8K,
            |r, q, d, s| unsafe { lanes_q6_k::dot(r, q, d, s) },
            None,
        ),
        GgmlType::Q4_K => VecKernel::Quant(
            Q8K,
            |r, q, d, s| unsafe { dot_k45::<false, 0>(r, q, d, s) },
            None,
        ),
        GgmlType::Q5_K => VecKernel::Quant(
            Q8K,
            |r, q, d, s| unsafe { dot_k45::<true, 0>(r, q, d, s) },
            None,
        ),
        GgmlType::Q6_K => {
            VecKernel::Quant(Q8K, |r, q, d, s| unsafe { dot_q6_k::<0>(r, q, d, s) }, None)
        }
        GgmlType::IQ4_XS => {
            VecKernel::Quant(Q8K, |r, q, d, s| unsafe { dot_iq4_xs(r, q, d, s) }, None)
        }
        // the lattice, ternary and MXFP4 formats (`dots_iq.rs`)
        GgmlType::IQ2_XXS => iq!(Q8K, dot_grid::<{ dots_iq::IQ2_XXS }, 0>),
        GgmlType::IQ2_XS => iq!(Q8K, dot_grid::<{ dots_iq::IQ2_XS }, 0>),
        GgmlType::IQ2_S => iq!(Q8K, dot_grid::<{ dots_iq::IQ2_S }, 0>),
        GgmlType::IQ3_XXS => iq!(Q8K, dot_grid::<{ dots_iq::IQ3_XXS }, 0>),
        GgmlType::IQ3_S => iq!(Q8K, dot_grid::<{ dots_iq::IQ3_S }, 0>),
        GgmlType::IQ1_S => iq!(Q8K, dot_iq1_s),
        GgmlType::IQ1_M => iq!(Q8K, dot_iq1_m),
        GgmlType::TQ1_0 => iq!(Q8K, dot_tq1_0),
        GgmlType::TQ2_0 => iq!(Q8K, dot_tq2_0),
        GgmlType::MXFP4 => iq!(Q8_0, dot_mxfp4),
        _ => return None,
    })
}

/// The few-token row-range kernel of `ty` and the most tokens it takes per
/// call (each
/// token's result bit for bit the one-token kernel's; see `tiles.rs`).
pub(super) fn tile_kernel(ty: GgmlType, lanes: bool) -> Option<TileKernel> {
    use tiles::{MAX_TOKENS_B32 as B32, MAX_TOKENS_K as K};
    // SAFETY (all): selected only when the CPU has AVX2+FMA+F16C.
    let (f, max_tokens): (crate::matmul::kernel::QuantTile, usize) = match ty {
        GgmlType::Q8_0 if lanes => b32!(tile, lanes_b32::Q8_0),
        GgmlType::Q4_0 if lanes => b32!(tile, lanes_b32::Q4_0),
        GgmlType::IQ4_NL if lanes => b32!(tile, lanes_b32::Iq4Nl),
        GgmlType::Q5_0 if lanes => b32!(tile, lanes_b32::Q5_0),
        GgmlType::Q4_1 if lanes => b32!(tile, lanes_b32::Q4_1),
        GgmlType::Q5_1 if lanes => b32!(tile, lanes_b32::Q5_1),
        GgmlType::Q8_0 => (|w, rb, a, o| unsafe { tiles::tile_q8_0(w, rb, a, o) }, B32),
        GgmlType::Q4_0 => (|w, rb, a, o| unsafe { tiles::tile_q4_0(w, rb, a, o) }, B32),
        GgmlType::IQ4_NL => (
            |w, rb, a, o| unsafe { tiles::tile_iq4_nl(w, rb, a, o) },
            B32,
        ),
        GgmlType::Q5_0 => (|w, rb, a, o| unsafe { tiles::tile_q5_0(w, rb, a, o) }, B32),
        GgmlType::Q5_1 => (|w, rb, a, o| unsafe { tiles::tile_q5_1(w, rb, a, o) }, B32),
        GgmlType::Q4_1 => (|w, rb, a, o| unsafe { tiles::tile_q4_1(w, rb, a, o) }, B32),
        GgmlType::Q4_K if lanes => (
            |w, rb, a, o| unsafe { lanes::tile::<false>(w, rb, a, o) },
            lanes::MAX_TOKENS,
        ),
        GgmlType::Q5_K if lanes => (
            |w, rb, a, o| unsafe { lanes::tile::<true>(w, rb, a, o) },
            lanes::MAX_TOKENS,
        ),
        GgmlType::Q4_K => (|w, rb, a, o| unsafe { tiles::tile_q4_k(w, rb, a, o) }, K),
        GgmlType::Q5_K => (|w, rb, a, o| unsafe { tiles::tile_q5_k(w, rb, a, o) }, K),
        GgmlType::Q6_K if lanes => (
            |w, rb, a, o| unsafe { lanes_q6_k::tile(w, rb, a, o) },
            lanes_q6_k::MAX_TOKENS,
        ),
        GgmlType::Q6_K => (|w, rb, a, o| unsafe { tiles::tile_q6_k(w, rb, a, o) }, K),
        GgmlType::IQ4_XS => (|w, rb, a, o| unsafe { tiles::tile_iq4_xs(w, rb, a, o) }, K),
        GgmlType::IQ2_XXS => (|w, rb, a, o| unsafe { tiles::tile_iq2_xxs(w, rb, a, o) }, K),
        GgmlType::IQ2_XS => (|w, rb, a, o| unsafe { tiles::tile_iq2_xs(w, rb, a, o) }, K),
        GgmlType::IQ2_S => (|w, rb, a, o| unsafe { tiles::tile_iq2_s(w, rb, a, o) }, K),
        GgmlType::IQ3_XXS => (|w, rb, a, o| unsafe { tiles::tile_iq3_xxs(w, rb, a, o) }, K),
        GgmlType::IQ3_S => (|w, rb, a, o| unsafe { tiles::tile_iq3_s(w, rb, a, o) }, K),
        _ => return None,
    };
    Some(TileKernel {
        f,
        max_tokens,
        chunk: 32,
        cols_multiple: 1,
        own_panel: None,
    })
}

/// The one-token rows of grid format `$kind` (`dots_iq::rows_grid`).
macro_rules! grid_rows {
    ($kind:ident) => {
        |w, rb, q, d, s, o| unsafe { dots_iq::rows_grid::<{ dots_iq::$kind }>(w, rb, q, d, s, o) }
    };
}

/// The one-token row-range kernel of `ty` (decode: one call per chunk of
/// rows; the dot is inlined). Q8_0/Q4_0/IQ4_NL and the K-quants prefetch
/// [`PF_STREAM`] ahead block by block as they go (the grid formats too),
/// IQ4_XS whole rows
/// [`crate::matmul::kernel::pf_rows`] ahead.
pub(super) fn rows_kernel(ty: GgmlType, lanes: bool) -> Option<QuantRows> {
    // SAFETY (all): selected only when the CPU has AVX2+FMA+F16C.
    Some(match ty {
        GgmlType::Q8_0 if lanes => b32!(rows, lanes_b32::Q8_0),
        GgmlType::Q4_0 if lanes => b32!(rows, lanes_b32::Q4_0),
        GgmlType::IQ4_NL if lanes => b32!(rows, lanes_b32::Iq4Nl),
        GgmlType::Q5_0 if lanes => b32!(rows, lanes_b32::Q5_0),
        GgmlType::Q4_1 if lanes => b32!(rows, lanes_b32::Q4_1),
        GgmlType::Q5_1 if lanes => b32!(rows, lanes_b32::Q5_1),
        GgmlType::Q8_0 => |w, rb, q, d, s, o| unsafe { rows_b32::<34, 0>(w, rb, q, d, s, o) },
        GgmlType::Q4_0 => |w, rb, q, d, s, o| unsafe { rows_b32::<18, 1>(w, rb, q, d, s, o) },
        GgmlType::IQ4_NL => |w, rb, q, d, s, o| unsafe { rows_b32::<18, 2>(w, rb, q, d, s, o) },
        GgmlType::Q5_0 => |w, rb, q, d, s, o| unsafe { legacy::rows_q5_0(w, rb, q, d, s, o) },
        GgmlType::Q5_1 => |w, rb, q, d, s, o| unsafe { legacy::rows_q5_1(w, rb, q, d, s, o) },
        GgmlType::Q4_1 => |w, rb, q, d, s, o| unsafe { legacy::rows_q4_1(w, rb, q, d, s, o) },
        GgmlType::Q4_K if lanes => {
            |w, rb, q, d, s, o| unsafe { lanes::rows_one::<false>(w, rb, q, d, s, o) }
        }
        GgmlType::Q5_K if lanes => {
            |w, rb, q, d, s, o| unsafe { lanes::rows_one::<true>(w, rb, q, d, s, o) }
        }
        GgmlType::Q4_K => |w, rb, q, d, s, o| unsafe { rows_q4_k(w, rb, q, d, s, o) },
        GgmlType::Q5_K => |w, rb, q, d, s, o| unsafe { rows_q5_k(w, rb, q, d, s, o) },
        GgmlType::Q6_K if lanes => {
            |w, rb, q, d, s, o| unsafe { lanes_q6_k::rows_one(w, rb, q, d, s, o) }
        }
        GgmlType::Q6_K => |w, rb, q, d, s, o| unsafe { rows_q6_k(w, rb, q, d, s, o) },
        GgmlType::Q2_K => |w, rb, q, d, s, o| unsafe { k23::avx2::rows_q2_k(w, rb, q, d, s, o) },
        GgmlType::Q3_K => |w, rb, q, d, s, o| unsafe { k23::avx2::rows_q3_k(w, rb, q, d, s, o) },
        GgmlType::IQ4_XS => |w, rb, q, d, s, o| unsafe { rows_iq4_xs(w, rb, q, d, s, o) },
        GgmlType::IQ2_XXS => grid_rows!(IQ2_XXS),
        GgmlType::IQ2_XS => grid_rows!(IQ2_XS),
        GgmlType::IQ2_S => grid_rows!(IQ2_S),
        GgmlType::IQ3_XXS => grid_rows!(IQ3_XXS),
        GgmlType::IQ3_S => grid_rows!(IQ3_S),
        _ => return None,
    })
}
