//! The dispatch table: which kernel multiplies a matrix of a given format,
//! layout and shape with how many tokens at which SIMD level.
//!
//! [`FORMATS`] holds, per weight format, the facts every choice reads: its
//! block geometry, how its activations are quantized for the integer dot
//! kernels, its few-token tiles per level, whether the AVX2 level keeps its
//! rows in the vector lanes, its integer GEMMs and the token counts from
//! which a GEMM takes over, and whether the AVX-512 level repacks it. The
//! functions below it turn those facts into one [`Kernel`] ([`choose`]);
//! [`crate::matmul::matmul_at`] runs what it names, and nothing else in the
//! crate decides. [`describe`] names the choice (`coil inspect --kernels`).
//!
//! The token-count bands of one product:
//!
//! ```text
//!  tokens:   1          2 ..                gemm_from ..
//!            one-token  few-token tiles     GEMM (integer where the level
//!            rows       (or dots, 4 tokens  has one for the format, else
//!                       per weight unpack)  f32 over decoded panels)
//! ```
//!
//! A single token always takes the per-row kernels, and batch-invariant
//! numerics do wherever the GEMM does not give each token its one-token
//! bits ([`gemm_keeps_tokens`]). Formats with
//! no dot kernel at all (Q8_K) decode each row once and take f32 dots
//! below 4 tokens, the f32 GEMM from 4.
//!
//! Run-time knobs (benchmarks, A/B checks): `COIL_GEMM_MIN_TOKENS` (every
//! `gemm_from`), `COIL_INT_GEMM=0` / [`set_int_gemm`] (no integer GEMMs),
//! `COIL_AVX2_LANES=0` (no AVX2 rows-in-lanes), `COIL_REPACK`
//! (`0` / `noq6` / `all`: the AVX-512 repack), `COIL_BF16_DOT`
//! (bf16 products for BF16 prompts), `COIL_SIMD` (the level).

use super::gemm;
#[cfg(target_arch = "x86_64")]
use super::x86_avx512::bf16_gemm;
#[cfg(target_arch = "x86_64")]
use super::{x86_avx2, x86_avx512};
use crate::matmul::kernel::ActKind;
use crate::matmul::kernel::FloatRows;
use crate::matmul::kernel::QuantRows;
use crate::matmul::kernel::TileKernel;
use crate::matmul::kernel::VecKernel;
use crate::matmul::scalar::vecdot;
use crate::matmul::scalar::vecdot_iq;
use crate::matmul::weight::Layout;
use crate::pool::ThreadPool;
use crate::simd::{self, SimdLevel};
use coil_gguf::GgmlType;

/// How a format's activations are quantized for its integer dot kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acts {
    /// None: f32 dots against the f32 activations (F32, F16, BF16).
    F32,
    /// One scale per 32 values (llama.cpp's Q8_0).
    Q8_0,
    /// One scale per 256 values and a sum per 16 (llama.cpp's Q8_K).
    Q8K,
}

/// Whether the AVX2 level keeps a format's rows in the vector lanes
/// (`x86_avx2/lanes*.rs`: 8 rows side by side, 16 tokens per pass) instead
/// of taking them row at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Avx2Lanes {
    No,
    /// Always (unless `COIL_AVX2_LANES=0`).
    Yes,
    /// Except on a pool that runs one sequence at a time
    /// ([`ThreadPool::set_single_stream`]).
    Batched,
}

/// Whether the AVX-512 level rewrites a format into [`Layout::Lanes16`]
/// at load time (`COIL_REPACK` unset or `auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repack {
    No,
    Yes,
    /// Except where 512-bit operations run as halves ([`simd::split_512`]).
    UnlessSplit512,
}

/// First token counts of the AVX2 integer GEMM: with AVX-VNNI, without it,
/// and without it where the format's rows are in the lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Avx2Gemm {
    pub vnni: usize,
    pub no_vnni: usize,
    pub no_vnni_lanes: usize,
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    pub ty: GgmlType,
    /// Values and bytes per block.
    pub block: (usize, usize),
    /// The dot kernels' activations; `None`: no dot kernel (rows decoded
    /// to f32).
    pub acts: Option<Acts>,
    /// Most tokens per pass of the AVX-512 level's few-token tile.
    pub tile_avx512: Option<usize>,
    /// Most tokens per pass of the AVX2 level's row-at-a-time tile.
    pub tile_avx2: Option<usize>,
    pub avx2_lanes: Avx2Lanes,
    /// First token count of the AVX-512 VNNI integer GEMM (`igemm`).
    pub igemm_avx512: Option<usize>,
    /// The AVX2 integer GEMM (`x86_avx2/igemm/`).
    pub igemm_avx2: Option<Avx2Gemm>,
    /// First token count of the f32 GEMM at the AVX2 and AVX-512 levels
    /// where there is no integer GEMM (the scalar level: 4 for all).
    pub f32_gemm: usize,
    pub repack: Repack,
}

const fn format(
    ty: GgmlType,
    block: (usize, usize),
    acts: Option<Acts>,
    tile_avx512: Option<usize>,
    tile_avx2: Option<usize>,
    avx2_lanes: Avx2Lanes,
    igemm_avx512: Option<usize>,
    igemm_avx2: Option<Avx2Gemm>,
    f32_gemm: usize,
    repack: Repack,
) -> Format {
    Format {
        ty,
        block,
        acts,
        tile_avx512,
        tile_avx2,
        avx2_lanes,
        igemm_avx512,
        igemm_avx2,
        f32_gemm,
        repack,
    }
}

const fn g2(vnni: usize, no_vnni: usize, no_vnni_lanes: usize) -> Option<Avx2Gemm> {
    Some(Avx2Gemm {
        vnni,
        no_vnni,
        no_vnni_lanes,
    })
}

use Acts::{Q8K as A256, Q8_0 as A32};
use Avx2Lanes::{Batched, No as Rows, Yes as Lanes};
use GgmlType::*;

/// Which format starts a GEMM from how many tokens (the measurements
/// behind each number; 2-core machines, `probe` / the kernel bench /
/// `coil bench`, as docs/PERFORMANCE.md records them):
///
/// * AVX-512 integer GEMM from 12: the two-panel GEMM overtakes the dot
///   kernels early (4096 x 4096, 2 threads: Q4_K 16 tokens 0.91 ms against
///   1.79, 8 tokens even; Q8_0 16 tokens 1.75–2.04 against 2.51). Q4_1,
///   Q5_0, Q5_1 take their tiles further: the GEMM packs the whole matrix
///   per call, the tiles (9 tokens a pass) read it once a pass (AMD Zen 5,
///   4096 x 4096, 2 threads, `probe`, tiles / GEMM, ms, 2026-12-08: Q4_1
///   12 tokens 1.08–1.21 / 1.25–1.57, 13 1.37–1.47 / 1.49, 14 1.50–1.53 /
///   1.51, 16 1.75–1.79 / 1.37–1.41; Q5_1 14 tokens 1.75–1.77 / 2.27–2.32,
///   16 2.16–2.34 / 2.40–2.45, 18 2.51 / 2.38; Q5_0 16 tokens 1.93 /
///   2.14, 18 2.35 / 2.18): Q4_1 from 14, Q5_0 and Q5_1 from 17.
/// * AVX2 integer GEMM from 12: it crossed the row-at-a-time dot kernels
///   at about 8 tokens (4096 x 4096, 1 thread; at 12 tokens Q8_0 6.5 ms
///   against 8.3, Q4_K 6.1 against 14.0). Without AVX-VNNI the
///   rows-in-lanes tiles (16 tokens a pass) stay ahead much longer (AMD
///   Zen 3, 4096 x 4096, GEMM against tiles, ms): Q4_K 1 thread 24 tokens
///   5.7–5.9 / 4.6–4.7, 32 tokens 6.7–6.8 / 6.0, 40 tokens 7.9–8.0 / 7.6;
///   2 threads 32 tokens 3.4–3.5 / 3.1: Q4_K from 33. Q6_K's lanes to 48
///   tokens (2 threads, tiles / GEMM: 32768 x 1024 24 tokens 5.6 / 7.5, 32
///   7.2–7.3 / 9.2–9.3, 48 10.8–11.3 / 12.4–12.6; 1024 x 3584 48 tokens
///   1.19–1.21 / 1.33–1.37, 64 2.04 / 1.65): from 49; its row-at-a-time
///   tiles 16 tokens 6.1–6.3 against 4.6, 18 tokens 6.5–7.0 / 5.2: from
///   19. With AVX-VNNI the lanes use `vpdpbusd` too; that crossover is
///   unmeasured (12).
/// * f32 GEMM: with the 4-token dot kernels the quantized formats cross
///   over at ~24 tokens, F16 at ~16 (2-core AVX-512 machine); formats
///   without few-token tiles from 8.
/// * Repack: Q4_K, Q5_K and Q8_0 read 16 rows as one stretch in the
///   rows-in-lanes layout at every token count. Q5_K's fifth bits are
///   stored as byte masks (one masked add per 64 values): AMD Zen 5, 2
///   threads, `probe` `PROBE_AB=1 PROBE_HUGE=1` 16384 x 4096, plain rows /
///   layout, ms, 2026-12-08 on a host busy with other builds: one token
///   0.90–1.08 / 0.74–0.91 (with the bits as 8 vectors tested per use
///   the layout was the slower, 0.81 / 0.93), 2 tokens 1.03–2.43 /
///   0.98–2.22, 4 tokens 1.49 / 1.34, 8 tokens 5.10 / 2.78. Q6_K not where 512-bit
///   operations run as halves: on an AMD Zen 4 its lanes kernel's
///   unpacking (3 shifts, 2 merges and 4 masks per 64 values) read one
///   token's weights at 18–21 GB/s against 37–41 for the plain rows'
///   kernel, and 8 tokens' no faster ([`split_q6k_lanes`] takes its
///   few-token products to the AVX2 lanes there).
/// * The lattice, ternary and MXFP4 formats (IQ1–IQ3, TQ1_0, TQ2_0,
///   MXFP4): one-token dots at AVX2 (the AVX-512 level takes them too);
///   the AVX2 integer GEMM at AVX2 (their rows decoded to i16 with the
///   integer scales folded in, `x86_avx2/decode_iq.rs`), the AVX-512 VNNI
///   GEMM at AVX-512 (the same rows decoded to i8 with a float per scale
///   group), from 8 tokens for those without few-token tiles. The grid
///   formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) have AVX2 tiles (9
///   tokens a pass) that keep ahead of the AVX2 GEMM to ~24 tokens (AMD
///   Zen 3, 1024 x 1024, 2 threads, `probe`, tiles / GEMM, ms: IQ2_XXS 7
///   tokens 0.15 / 0.72, 12 tokens 0.37 / 0.48, 18 tokens 0.47–0.48 /
///   0.62–0.82, 24 tokens 0.65–0.67 / 0.69, 64 tokens 1.74–1.77 / 1.32;
///   IQ3_XXS 9 tokens 0.25 / 0.52–0.53, 18 tokens 0.51 / 0.67, 24 tokens
///   0.70–1.02 / 0.73–0.77, 64 tokens 1.88 / 1.38): from 24; of the
///   AVX-512 GEMM to 12 tokens, 16 for the formats with scales per 16 (AMD
///   Zen 5, 4096 x 4096, 2 threads, a host at a load of 4, GEMM / tiles,
///   ms: IQ2_XXS 9 tokens 2.95–3.04 / 2.14–2.30, 12 tokens 3.04–3.05 /
///   3.32–5.15, 16 tokens 3.16 / 4.53–5.38; IQ3_XXS 9 tokens 3.45–3.52 /
///   2.39–2.41, 12 tokens 3.35–3.53 / 3.58, 16 tokens 3.60–5.79 / 5.84–5.89;
///   IQ2_S 12 tokens 5.49–5.54 / 5.03–5.08, 16 tokens 3.74–5.70 / 4.67–4.70,
///   18 tokens 4.06–4.23 / 5.11–5.18).
/// * AVX2 lanes: Q4_K, Q6_K and Q8_0 (Q5_K gained nothing). Intel Xeon
///   model 167 at `COIL_SIMD=avx2`, 2 threads, streamed: 8 tokens Q4_K
///   7.0–7.5 → 9.6–11.3 GB/s, Q8_0 8.0 → 11.3 (15.6 with AVX-VNNI); Q6_K
///   on an AMD Zen 3 (32768 x 1024): 16 tokens 4.96 → 3.81 ms, 8 tokens
///   +10–17%, one token level. On the Zen 3 the one-token Q8_0 kernel in
///   the lanes is the slower (79–84% of the read bandwidth against 89–98%;
///   `coil bench` tg128 on Q8_0 files 5–20% lower), so a single-stream
///   pool keeps Q8_0 row at a time.
/// * AVX2 lanes in batched engines only, for batch invariance: Q4_0,
///   IQ4_NL, Q5_0, Q4_1, Q5_1 (`lanes_b32.rs`, Q8_0's kernels) and Q5_K
///   (`lanes.rs`): their one-token products in the lanes are slower than
///   row at a time, so a single stream keeps its row kernels; a batched
///   engine (`coil serve`) takes the lanes at every token count, whose
///   bits the AVX2 integer GEMM gives too, so its prompts are
///   batch-invariant at full speed. AMD Zen 3, 2 threads, `probe` 16384 x
///   4096 (`COIL_AVX2_LANES=0` against the default), best of 10, the best
///   of 3 such runs, rows / lanes ms, 2026-12-07 on a host at a load of
///   9.2–9.6 from other builds (single runs spread up to 2×): one token
///   Q4_0 2.00 / 2.43, IQ4_NL 1.91 / 2.67, Q5_0 2.99 / 4.76, Q4_1 2.36 /
///   5.15, Q5_1 5.09 / 3.81, Q5_K 3.12 / 4.05; 8 tokens (best of 2) Q4_0
///   19.2 / 11.3, Q5_K 9.7 / 8.2, Q4_1 28.6 / 31.1, Q5_0 27.3 / 32.4.
#[rustfmt::skip]
pub const FORMATS: &[Format] = &[
    //     type    (values, bytes) acts        tile     tile   AVX2     igemm     igemm AVX2        f32   repack
    //                                         AVX-512  AVX2   lanes    AVX-512   (vnni/no/lanes)   GEMM  (AVX-512)
    format(F32,    (1, 4),         Some(Acts::F32), None, None,    Rows,    None,     None,             16,   Repack::No),
    format(F16,    (1, 2),         Some(Acts::F32), None, None,    Rows,    None,     None,             16,   Repack::No),
    format(BF16,   (1, 2),         Some(Acts::F32), None, None,    Rows,    None,     None,             16,   Repack::No),
    format(Q8_0,   (32, 34),       Some(A32),  Some(9), Some(4), Batched, Some(12), g2(12, 12, 12),   24,   Repack::Yes),
    format(Q4_0,   (32, 18),       Some(A32),  Some(9), Some(4), Batched, Some(12), g2(12, 12, 12),   24,   Repack::No),
    format(IQ4_NL, (32, 18),       Some(A32),  Some(9), Some(4), Batched, Some(12), g2(12, 12, 12),   24,   Repack::No),
    format(Q4_1,   (32, 20),       Some(A32),  Some(9), Some(4), Batched, Some(14), g2(8, 8, 8),      8,    Repack::No),
    format(Q5_0,   (32, 22),       Some(A32),  Some(9), Some(4), Batched, Some(17), g2(8, 8, 8),      8,    Repack::No),
    format(Q5_1,   (32, 24),       Some(A32),  Some(9), Some(4), Batched, Some(17), g2(8, 8, 8),      8,    Repack::No),
    format(Q2_K,   (256, 84),      Some(A256), None,    None,    Rows,    Some(12), g2(12, 12, 12),   24,   Repack::No),
    format(Q3_K,   (256, 110),     Some(A256), None,    None,    Rows,    Some(12), g2(12, 12, 12),   24,   Repack::No),
    format(Q4_K,   (256, 144),     Some(A256), Some(9), Some(9), Lanes,   Some(12), g2(12, 12, 33),   24,   Repack::Yes),
    format(Q5_K,   (256, 176),     Some(A256), Some(9), Some(9), Batched, Some(12), g2(12, 12, 12),   24,   Repack::Yes),
    format(Q6_K,   (256, 210),     Some(A256), Some(9), Some(9), Lanes,   Some(12), g2(12, 19, 49),   24,   Repack::UnlessSplit512),
    format(IQ4_XS, (256, 136),     Some(A256), None,    Some(9), Rows,    Some(12), g2(12, 12, 12),   24,   Repack::No),
    format(IQ2_XXS,(256, 66),      Some(A256), None,    Some(9), Rows,    Some(12), g2(24, 24, 24),   24,   Repack::No),
    format(IQ2_XS, (256, 74),      Some(A256), None,    Some(9), Rows,    Some(16), g2(24, 24, 24),   24,   Repack::No),
    format(IQ2_S,  (256, 82),      Some(A256), None,    Some(9), Rows,    Some(16), g2(24, 24, 24),   24,   Repack::No),
    format(IQ3_XXS,(256, 98),      Some(A256), None,    Some(9), Rows,    Some(12), g2(24, 24, 24),   24,   Repack::No),
    format(IQ3_S,  (256, 110),     Some(A256), None,    Some(9), Rows,    Some(12), g2(24, 24, 24),   24,   Repack::No),
    format(IQ1_S,  (256, 50),      Some(A256), None,    None,    Rows,    Some(8),  g2(8, 8, 8),      8,    Repack::No),
    format(IQ1_M,  (256, 56),      Some(A256), None,    None,    Rows,    Some(8),  g2(8, 8, 8),      8,    Repack::No),
    format(TQ1_0,  (256, 54),      Some(A256), None,    None,    Rows,    Some(8),  g2(8, 8, 8),      8,    Repack::No),
    format(TQ2_0,  (256, 66),      Some(A256), None,    None,    Rows,    Some(8),  g2(8, 8, 8),      8,    Repack::No),
    format(MXFP4,  (32, 17),       Some(A32),  None,    None,    Rows,    Some(8),  g2(8, 8, 8),      8,    Repack::No),
];

/// The row of formats the table does not list (decoded through
/// `coil_gguf::quant`: Q8_K, …): no dot kernels, no GEMM of
/// their own, the f32 GEMM from 4 tokens.
const DECODED: Format = format(
    F32,
    (1, 4),
    None,
    None,
    None,
    Rows,
    None,
    None,
    4,
    Repack::No,
);

/// `ty`'s row of [`FORMATS`] ([`DECODED`]'s facts for an unlisted one).
pub fn format_of(ty: GgmlType) -> Format {
    FORMATS
        .iter()
        .find(|f| f.ty == ty)
        .copied()
        .unwrap_or(Format {
            ty,
            block: ty.block_layout(),
            ..DECODED
        })
}

/// Tokens per AVX2 rows-in-lanes pass.
pub const AVX2_LANES_TOKENS: usize = 16;

/// The one SIMD-level-dependent threshold outside the table: the scalar
/// level has no tiles, its f32 GEMM runs from 4 tokens.
const SCALAR_GEMM_FROM: usize = 4;

/// A product to plan: `w` (its format, layout and shape) times `n_tokens`
/// tokens at `level` on a pool that does or does not run one sequence at a
/// time.
#[derive(Clone, Copy, Debug)]
pub struct Product {
    pub ty: GgmlType,
    pub layout: Layout,
    pub rows: usize,
    pub cols: usize,
    pub n_tokens: usize,
    /// Already capped at the CPU's level.
    pub level: SimdLevel,
    pub single_stream: bool,
    /// Batch-invariant numerics ([`crate::numerics::batch_invariant`]).
    pub invariant: bool,
}

/// What runs a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// No tokens or no rows: nothing to do.
    Nothing,
    /// No columns: `y` = 0.
    Zeros,
    /// The AVX-512 VNNI integer GEMM (`igemm`; it reads [`Layout::Lanes16`]
    /// panels too).
    IntGemmAvx512,
    /// The AVX2 integer GEMM (`x86_avx2/igemm/`).
    IntGemmAvx2,
    /// A [`Layout::Lanes16`] matrix at AVX-512: its rows-in-lanes tiles,
    /// the integer GEMM from `gemm_from` tokens.
    Lanes16 { gemm_from: usize },
    /// Per-row kernels of `level`: the one-token rows kernel, the
    /// few-token tiles or the dot kernels; `lanes`: the AVX2
    /// rows-in-lanes family.
    Dots { level: SimdLevel, lanes: bool },
    /// Each row decoded to f32 once, then f32 dots with every token.
    DecodedDots,
    /// bf16 products (AVX512_BF16) of BF16 weights.
    Bf16Gemm,
    /// Weights decoded panel by panel and the f32 GEMM of `level`.
    F32Gemm { level: SimdLevel },
}

/// The kernel of `p` (the one place that decides it).
pub fn choose(p: &Product) -> Kernel {
    if p.n_tokens == 0 || p.rows == 0 {
        return Kernel::Nothing;
    }
    if int_gemm_avx512(p) {
        return Kernel::IntGemmAvx512;
    }
    if int_gemm_avx2(p) {
        return Kernel::IntGemmAvx2;
    }
    if p.layout == Layout::Lanes16 {
        return Kernel::Lanes16 {
            gemm_from: gemm_min_tokens(p.ty, p.level),
        };
    }
    if p.cols == 0 {
        return Kernel::Zeros;
    }
    // One token, or batch-invariant numerics: per-row dot products, each
    // token's result computed exactly as if it were alone (see
    // [`crate::numerics`]) — unless the GEMM gives those bits too.
    let per_row = p.n_tokens == 1 || (p.invariant && !gemm_keeps_tokens(p));
    let dot_level = if split_q6k_lanes(p.ty, p.layout, p.level)
        && (!p.single_stream || (!per_row && p.n_tokens >= SPLIT_Q6K_LANES_FROM))
    {
        SimdLevel::Avx2
    } else {
        float_dot_level(p.ty, p.level, p.single_stream)
    };
    match vec_kernel(p.ty, dot_level, p.single_stream) {
        Some(_) if per_row || p.n_tokens < gemm_from(p.ty, p.layout, p.level) => Kernel::Dots {
            level: dot_level,
            lanes: dot_level == SimdLevel::Avx2 && avx2_lanes(p.ty, p.single_stream),
        },
        None if per_row || p.n_tokens < SCALAR_GEMM_FROM => Kernel::DecodedDots,
        // (the integer GEMMs were chosen above)
        _ => {
            // BF16 weights: bf16 products where the CPU has them (the
            // activations rounded to bf16), else the exact f32 GEMM.
            #[cfg(target_arch = "x86_64")]
            if p.level >= SimdLevel::Avx512
                && p.ty == BF16
                && p.cols.is_multiple_of(32)
                && bf16_gemm::available()
            {
                return Kernel::Bf16Gemm;
            }
            Kernel::F32Gemm { level: p.level }
        }
    }
}

/// Whether [`choose`] runs `p` on the AVX-512 integer GEMM.
fn int_gemm_avx512(p: &Product) -> bool {
    p.level >= SimdLevel::Avx512 && format_of(p.ty).igemm_avx512.is_some() && int_gemm_sized(p)
}

/// Whether [`choose`] runs `p` on the AVX2 integer GEMM.
fn int_gemm_avx2(p: &Product) -> bool {
    avx2_igemm_at(p.ty, p.level) && p.layout == Layout::Rows && int_gemm_sized(p)
}

/// Whether `ty`'s integer GEMM at `level` is the AVX2 one: at the AVX2
/// level, and at AVX-512 for the formats with no AVX-512 GEMM (the
/// lattice, ternary and MXFP4 formats).
fn avx2_igemm_at(ty: GgmlType, level: SimdLevel) -> bool {
    let f = format_of(ty);
    cfg!(target_arch = "x86_64")
        && f.igemm_avx2.is_some()
        && (level == SimdLevel::Avx2 || (level >= SimdLevel::Avx512 && f.igemm_avx512.is_none()))
}

/// What both integer GEMMs' choices ask beyond the format and level: not
/// batch-invariant (unless the GEMM gives each token its one-token bits,
/// [`gemm_keeps_tokens`]), enough tokens for a GEMM to beat the dot
/// kernels.
fn int_gemm_sized(p: &Product) -> bool {
    if p.n_tokens <= 1 || p.rows == 0 || p.cols == 0 || !int_gemm_enabled() {
        return false;
    }
    if p.invariant && !gemm_keeps_tokens(p) {
        return false;
    }
    match (p.layout, vec_kernel(p.ty, p.level, false)) {
        (Layout::Lanes16, _) | (_, Some(_)) => p.n_tokens >= gemm_from(p.ty, p.layout, p.level),
        (_, None) => p.n_tokens >= SCALAR_GEMM_FROM,
    }
}

/// Whether the GEMM [`choose`] takes for `p`'s format, layout, level and
/// pool gives every token bit for bit the result of its one-token product
/// (the same activation quantization, the same exact integer sums, the same
/// float operations in the same order per row and token), so that
/// batch-invariant numerics keep it for many tokens:
///
/// Q4_K, Q5_K, Q6_K and the 32-value formats Q8_0, Q4_0, Q4_1, Q5_0,
/// Q5_1, IQ4_NL at the AVX2 level on the pools whose per-row products are
/// the rows-in-lanes kernels ([`avx2_lanes`]: all but Q4_K and Q6_K in
/// batched engines only): the AVX2 integer GEMM quantizes the activations
/// as they do, sums the same exact integers per block and rounds each
/// block's float work as they do (`x86_avx2/lanes.rs`, `lanes_q6_k.rs`,
/// `lanes_b32.rs` against `igemm/kquant.rs`, `igemm/scale32.rs`). Not the
/// others: the float formats' GEMM adds each output's products in column
/// order where their dot kernels keep 32 partial sums per row; Q2_K, Q3_K,
/// IQ4_XS and the lattice, ternary and MXFP4 formats have row-at-a-time
/// dots only (8 partial sums per row, added at the end; IQ4_XS's dots
/// quantize the activations per 256, its GEMM per 32).
///
/// Q4_K, Q5_K, Q6_K and Q8_0 at the AVX-512 level in the rows-in-lanes layout
/// the loader gives them there ([`Layout::Lanes16`]; Q6_K not where
/// 512-bit operations run as halves, [`Repack::UnlessSplit512`]): the
/// integer GEMM's panels come out of that layout and its microkernel does
/// per row lane and token the integer sums and float operations of the
/// tiles (`x86_avx512/lanes.rs`, `lanes_q6_k.rs`, `lanes_q8_0.rs`) in their
/// order, from activations quantized as theirs (ties away from zero). Not the plain rows there: the dot kernels add a row's partial
/// sums across the vector lanes, the GEMM keeps a row in one lane. No
/// GEMM of the scalar level rounds as its dot kernels do.
///
/// Held by `matmul::tests::invariant_mode_rows_equal_one_token_calls_bit_for_bit`.
pub(crate) fn gemm_keeps_tokens(p: &Product) -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    match (p.ty, p.level, p.layout) {
        (Q4_K | Q5_K | Q6_K | Q8_0, SimdLevel::Avx512, Layout::Lanes16) => true,
        (
            Q4_K | Q5_K | Q6_K | Q8_0 | Q4_0 | IQ4_NL | Q5_0 | Q4_1 | Q5_1,
            SimdLevel::Avx2,
            Layout::Rows,
        ) => avx2_lanes(p.ty, p.single_stream),
        _ => false,
    }
}

/// Whether the products of a `ty` matrix in `layout` (the one the loader
/// gave it: [`Layout::Lanes16`] where it rewrote the matrix, see
/// [`crate::matmul::repack`]) at the process's SIMD level, on a pool that
/// does (`single_stream`) or does not run one sequence at a time, give
/// every token bit for bit its one-token result whatever the number of
/// tokens in the call — the fast choice of kernel included
/// ([`gemm_keeps_tokens`]).
pub fn keeps_tokens(ty: GgmlType, layout: Layout, single_stream: bool) -> bool {
    gemm_keeps_tokens(&Product {
        ty,
        layout,
        rows: 1,
        cols: 256,
        n_tokens: 64,
        level: simd::level().min(simd::detected_level()),
        single_stream,
        invariant: false,
    })
}

/// Tokens from which products of `ty` in `layout` go to a GEMM at `level`:
/// [`gemm_min_tokens`], or [`SPLIT_Q6K_GEMM_FROM`] for [`split_q6k_lanes`].
fn gemm_from(ty: GgmlType, layout: Layout, level: SimdLevel) -> usize {
    if split_q6k_lanes(ty, layout, level) && gemm_override().is_none() {
        SPLIT_Q6K_GEMM_FROM
    } else {
        gemm_min_tokens(ty, level)
    }
}

/// Token count from which the GEMM strategy wins over per-row dot products
/// (the table's numbers, see [`FORMATS`]). `COIL_GEMM_MIN_TOKENS` in the
/// environment overrides it (for tuning; a single token and the
/// batch-invariant mode take the dot products whatever it says).
pub(crate) fn gemm_min_tokens(ty: GgmlType, level: SimdLevel) -> usize {
    if let Some(o) = gemm_override() {
        return o;
    }
    let f = format_of(ty);
    if cfg!(target_arch = "x86_64") && level >= SimdLevel::Avx512 && int_gemm_enabled() {
        if let Some(from) = f.igemm_avx512 {
            return from;
        }
    }
    if avx2_igemm_at(ty, level) && int_gemm_enabled() {
        if let Some(g) = f.igemm_avx2 {
            return if simd::avx_vnni() {
                g.vnni
            } else if avx2_lanes(ty, false) {
                g.no_vnni_lanes
            } else {
                g.no_vnni
            };
        }
    }
    match level {
        SimdLevel::Scalar => SCALAR_GEMM_FROM,
        _ => f.f32_gemm,
    }
}

/// Whether a Q6_K matrix in `layout` at `level` is on a CPU that runs
/// 512-bit operations as halves ([`simd::split_512`]: AMD Zen 4, where the
/// loader leaves Q6_K unrepacked) with the AVX2 rows-in-lanes Q6_K kernels
/// on. Its products then take the AVX2 level's rows-in-lanes kernels
/// (`x86_avx2::lanes_q6_k`, `vpdpbusd` on 256-bit vectors; 16 tokens per
/// pass, the rows transposed as read) up to [`SPLIT_Q6K_GEMM_FROM`]
/// tokens: for every token count in a batched engine's pool (one kernel
/// family per pool keeps batched decoding batch-invariant), from
/// [`SPLIT_Q6K_LANES_FROM`] in a single stream's prompts (its one-token
/// products stay the AVX-512 row kernel's). AMD Zen 4 (family 25 model
/// 17), 2 threads, `probe`, ms, these / the AVX-512 8-token tile (5–11
/// tokens) or integer GEMM (12 on): 5 tokens 2048 x 5632 0.36–0.43 /
/// 0.42–0.49; 6 tokens 0.39 / 0.48; 8 tokens 248320 x 1024 12.3–12.5 /
/// 15.3–16.0, 2048 x 5632 0.47 / 0.66–0.74; 16 tokens 0.79–0.80 /
/// 1.47–1.72; 20–32 tokens ahead of the GEMM (2048 x 5632 20 tokens
/// 1.12–1.18 / 1.38–1.39, 32 1.60–1.64 / 1.77–1.78), 40 level, 48 on
/// behind (64 tokens 2.92–2.98 / 3.28–3.33); one and two tokens from
/// memory level (248320 x 1024: 5.7–6.2 / 5.8–6.6 ms), 3–4 tokens ~10%
/// behind.
pub(crate) fn split_q6k_lanes(ty: GgmlType, layout: Layout, level: SimdLevel) -> bool {
    cfg!(target_arch = "x86_64")
        && level == SimdLevel::Avx512
        && ty == Q6_K
        && layout == Layout::Rows
        && simd::split_512()
        && avx2_lanes(Q6_K, false)
}

/// See [`split_q6k_lanes`].
const SPLIT_Q6K_LANES_FROM: usize = 5;
/// See [`split_q6k_lanes`].
const SPLIT_Q6K_GEMM_FROM: usize = 33;

/// The level of the per-row products of `ty`: F16 / BF16 at the AVX2
/// level's 256-bit kernels where the pool runs one sequence at a time
/// ([`ThreadPool::set_single_stream`]). Measured on an Intel Xeon (family
/// 6 model 167), 2 threads, 512-bit → 256-bit: one token (`coil bench -p 0
/// -n 64 -r 2`, two rounds each) qwen35-0.8b-like F16 18.3 → 20.7–20.9
/// tokens/s, BF16 18.1 → 21.0, mamba2-370m-like F16 34.3–35.6 → 39.4–40.0,
/// lfm2-1.2b-like F16 12.6 → 13.2, BF16 12.3–12.4 → 13.2 (a memory-bound
/// loop gains nothing from the width, and the core runs slower under
/// 512-bit float work); eight sequences (`coil bench --parallel 8 -p 16 -n
/// 32`, mamba2-370m-like F16) 109.2–109.6 → 89.9–90.6 generated tokens/s.
/// Engines ask for them when they run one sequence at a time
/// (`EngineOptions::batched_layout` off).
fn float_dot_level(ty: GgmlType, level: SimdLevel, single_stream: bool) -> SimdLevel {
    match ty {
        F16 | BF16 if single_stream => level.min(SimdLevel::Avx2),
        _ => level,
    }
}

/// Whether `ty` goes through the AVX2 rows-in-lanes kernels
/// (`x86_avx2/lanes*.rs`) on a pool that does (`single_stream`) or does
/// not run one sequence at a time: [`Format::avx2_lanes`], unless
/// `COIL_AVX2_LANES=0`. One choice per pool and format: the one-token,
/// few-token and dot kernels of a choice share their arithmetic, so each
/// token's bits are the same however many are in the call.
pub(crate) fn avx2_lanes(ty: GgmlType, single_stream: bool) -> bool {
    match format_of(ty).avx2_lanes {
        Avx2Lanes::No => false,
        Avx2Lanes::Yes => avx2_lanes_on(),
        Avx2Lanes::Batched => avx2_lanes_on() && !single_stream,
    }
}

/// [`avx2_lanes`] for the AVX2 kernels of a product at `level`: at the
/// AVX2 level only (where the AVX-512 level takes AVX2 dots — the
/// lattice, ternary and MXFP4 formats — they stay row at a time).
fn avx2_lanes_at(ty: GgmlType, level: SimdLevel, single_stream: bool) -> bool {
    level == SimdLevel::Avx2 && avx2_lanes(ty, single_stream)
}

/// `COIL_AVX2_LANES` is not `0`.
fn avx2_lanes_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("COIL_AVX2_LANES").map_or(true, |v| v != "0"))
}

/// 0 = from the environment, 1 = on, 2 = off.
static INT_GEMM: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Integer GEMMs for prefill: on unless `COIL_INT_GEMM=0` is set or
/// [`set_int_gemm`]`(false)` was called.
fn int_gemm_enabled() -> bool {
    use std::sync::atomic::Ordering;
    match INT_GEMM.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let on = std::env::var("COIL_INT_GEMM").map_or(true, |v| v != "0");
            INT_GEMM.store(if on { 1 } else { 2 }, Ordering::Relaxed);
            on
        }
    }
}

/// Chooses (process-wide) between the integer GEMM and the f32 GEMM for
/// prefill of the formats that have both (benchmarks, A/B checks).
pub fn set_int_gemm(enabled: bool) {
    INT_GEMM.store(
        if enabled { 1 } else { 2 },
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// Whether prefill of `ty` at `level` has an integer GEMM (used unless it
/// is switched off, see [`set_int_gemm`]).
pub fn has_int_gemm(ty: GgmlType, level: SimdLevel) -> bool {
    cfg!(target_arch = "x86_64")
        && ((level >= SimdLevel::Avx512 && format_of(ty).igemm_avx512.is_some())
            || avx2_igemm_at(ty, level))
}

/// `COIL_GEMM_MIN_TOKENS`, if set to a number.
fn gemm_override() -> Option<usize> {
    static OVERRIDE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *OVERRIDE.get_or_init(|| {
        std::env::var("COIL_GEMM_MIN_TOKENS")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

/// Whether the AVX-512 level's loader rewrites matrices of `ty` into
/// [`Layout::Lanes16`] in this process (see [`crate::matmul::repack`]).
pub fn repacks(ty: GgmlType) -> bool {
    cfg!(target_arch = "x86_64")
        && simd::level() >= SimdLevel::Avx512
        && format_of(ty).repack != Repack::No
        && repack_wanted(ty)
}

/// `COIL_REPACK` read for `ty` (see [`repack_setting_wants`]).
fn repack_wanted(ty: GgmlType) -> bool {
    let setting = std::env::var("COIL_REPACK").ok();
    repack_setting_wants(setting.as_deref(), ty, simd::split_512())
}

/// Whether a `COIL_REPACK` value (`None`: unset) takes `ty` (one the table
/// repacks) on a CPU that does (`split_512`) or does not run 512-bit
/// operations as halves: unset or `auto`: the table's [`Repack`]; `0`:
/// none; `all`: every one; `noq6`: all but Q6_K (one sequence decoding in
/// a batched engine ~4% faster on qwen35-0.8b-like Q4_K_M, eight ~11%
/// slower).
pub(crate) fn repack_setting_wants(setting: Option<&str>, ty: GgmlType, split_512: bool) -> bool {
    match setting.map(str::trim) {
        Some("0") => false,
        Some("all") => true,
        Some("noq6") => ty != Q6_K,
        _ => match format_of(ty).repack {
            Repack::UnlessSplit512 => !split_512,
            Repack::Yes | Repack::No => true,
        },
    }
}

/// The dot product of one row of `ty` with one token at `level`;
/// `single`: for a pool that runs one sequence at a time (at AVX2 the
/// rows-in-lanes choice, [`avx2_lanes`]).
pub(crate) fn vec_kernel(ty: GgmlType, level: SimdLevel, single: bool) -> Option<VecKernel> {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx512 {
            if let Some(k) = x86_avx512::vec_kernel(ty) {
                return Some(k);
            }
        }
        if level >= SimdLevel::Avx2 {
            if let Some(k) = x86_avx2::vec_kernel(ty, avx2_lanes_at(ty, level, single)) {
                return Some(k);
            }
        }
    }
    let _ = (level, single);
    Some(match ty {
        F32 => VecKernel::Float(vecdot::dot_f32_bytes),
        F16 => VecKernel::Float(vecdot::dot_f16),
        BF16 => VecKernel::Float(vecdot::dot_bf16),
        Q8_0 => VecKernel::Quant(ActKind::Q8_0, vecdot::dot_q8_0, None),
        Q4_0 => VecKernel::Quant(ActKind::Q8_0, vecdot::dot_q4_0, None),
        IQ4_NL => VecKernel::Quant(ActKind::Q8_0, vecdot::dot_iq4_nl, None),
        Q5_0 => VecKernel::Quant(ActKind::Q8_0, vecdot::dot_q5_0, None),
        Q5_1 => VecKernel::Quant(ActKind::Q8_0, vecdot::dot_q5_1, None),
        Q4_1 => VecKernel::Quant(ActKind::Q8_0, vecdot::dot_q4_1, None),
        Q2_K => VecKernel::Quant(ActKind::Q8K, vecdot::dot_q2_k, None),
        Q3_K => VecKernel::Quant(ActKind::Q8K, vecdot::dot_q3_k, None),
        Q4_K => VecKernel::Quant(ActKind::Q8K, vecdot::dot_q4_k, None),
        Q5_K => VecKernel::Quant(ActKind::Q8K, vecdot::dot_q5_k, None),
        Q6_K => VecKernel::Quant(ActKind::Q8K, vecdot::dot_q6_k, None),
        IQ4_XS => VecKernel::Quant(ActKind::Q8K, vecdot::dot_iq4_xs, None),
        IQ2_XXS => VecKernel::Quant(ActKind::Q8K, vecdot_iq::dot_iq2_xxs, None),
        IQ2_XS => VecKernel::Quant(ActKind::Q8K, vecdot_iq::dot_iq2_xs, None),
        IQ2_S => VecKernel::Quant(ActKind::Q8K, vecdot_iq::dot_iq2_s, None),
        IQ3_XXS => VecKernel::Quant(ActKind::Q8K, vecdot_iq::dot_iq3_xxs, None),
        IQ3_S => VecKernel::Quant(ActKind::Q8K, vecdot_iq::dot_iq3_s, None),
        IQ1_S => VecKernel::Quant(ActKind::Q8K, vecdot_iq::dot_iq1_s, None),
        IQ1_M => VecKernel::Quant(ActKind::Q8K, vecdot_iq::dot_iq1_m, None),
        TQ1_0 => VecKernel::Quant(ActKind::Q8K, vecdot_iq::dot_tq1_0, None),
        TQ2_0 => VecKernel::Quant(ActKind::Q8K, vecdot_iq::dot_tq2_0, None),
        MXFP4 => VecKernel::Quant(ActKind::Q8_0, vecdot_iq::dot_mxfp4, None),
        _ => return None,
    })
}

/// The few-token row-range kernel of `ty` at `level`, if there is one: it
/// comes from the level whose dot [`vec_kernel`] picks (the same
/// arithmetic, so each token's result is the one-token kernel's).
pub(crate) fn tile_kernel(ty: GgmlType, level: SimdLevel, single: bool) -> Option<TileKernel> {
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx512 && x86_avx512::vec_kernel(ty).is_some() {
        return x86_avx512::tile_kernel(ty);
    }
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx2 {
        return x86_avx2::tile_kernel(ty, avx2_lanes_at(ty, level, single));
    }
    let _ = (ty, level, single);
    None
}

/// The one-token row-range kernel of `ty` at `level` (from the level whose
/// dot [`vec_kernel`] picks), if there is one.
pub(crate) fn rows_kernel(ty: GgmlType, level: SimdLevel, single: bool) -> Option<QuantRows> {
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx512 && x86_avx512::vec_kernel(ty).is_some() {
        return x86_avx512::rows_kernel(ty);
    }
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx2 {
        return x86_avx2::rows_kernel(ty, avx2_lanes_at(ty, level, single));
    }
    let _ = (ty, level, single);
    None
}

/// The one-token rows kernel of a 16-bit float format at `level`, if there
/// is one (rows in pairs: F16 and BF16 at AVX-512 and AVX2), each row's
/// result bit for bit its [`VecKernel::Float`] dot product's (the same
/// level's).
pub(crate) fn float_rows_kernel(ty: GgmlType, level: SimdLevel) -> Option<FloatRows> {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx512 && x86_avx512::vec_kernel(ty).is_some() {
            return x86_avx512::float_pairs::rows_kernel(ty);
        }
        if level >= SimdLevel::Avx2 {
            return x86_avx2::float_pairs::rows_kernel(ty);
        }
    }
    let _ = (ty, level);
    None
}

/// The f32 GEMM's tiling at `level` (see [`gemm::Shape`]): the AVX-512
/// level takes the packed shape where the CPU runs 512-bit operations as
/// halves ([`simd::split_512`]), its F16 strips widened and multiplied 16
/// rows to a `zmm`. On an AMD Zen 4 (kernel bench, 512 tokens × 4096 ×
/// 1024 F16, 2 threads, two rounds) the packed AVX2 shape gave
/// 185.7–187.2 GFLOP/s against 163.6–164.3 for the unpacked AVX-512 one
/// (whose 512-bit FMAs bring no more products per cycle there); its F16
/// `zmm` microkernel, qwen35 F16 pp512 (alternating, three rounds): 183.1
/// / 182.6 / 195.1 → 182.9 / 192.8 / 202.6 tokens/s.
pub(crate) fn f32_gemm_shape(level: SimdLevel) -> gemm::Shape {
    match level {
        SimdLevel::Avx512 if simd::split_512() => gemm::PACKED,
        SimdLevel::Avx512 => gemm::WIDE,
        SimdLevel::Avx2 => gemm::PACKED,
        SimdLevel::Scalar => gemm::SCALAR,
    }
}

/// A short name of what runs `ty`'s product with `n_tokens` tokens under
/// choice `k` (`cols`: the matrix's), e.g. `avx2 lanes tile ≤16`,
/// `avx512 igemm`, `f32 gemm (avx2)`.
pub fn describe(k: Kernel, ty: GgmlType, cols: usize, n_tokens: usize, single: bool) -> String {
    match k {
        Kernel::Nothing => "-".into(),
        Kernel::Zeros => "zeros".into(),
        Kernel::IntGemmAvx512 => "avx512 igemm".into(),
        Kernel::IntGemmAvx2 => "avx2 igemm".into(),
        Kernel::Lanes16 { gemm_from } if n_tokens >= gemm_from => "avx512 igemm".into(),
        Kernel::Lanes16 { .. } if n_tokens == 1 => "avx512 lanes16 rows".into(),
        Kernel::Lanes16 { .. } => "avx512 lanes16 tile ≤9".into(),
        Kernel::DecodedDots => "decode + f32 dots".into(),
        Kernel::Bf16Gemm => "avx512 bf16 gemm".into(),
        Kernel::F32Gemm { level } => format!("f32 gemm ({})", level.name()),
        Kernel::Dots { level, lanes } => {
            let l = kernel_level(ty, level, single).name();
            let fam = if lanes { " lanes" } else { "" };
            match vec_kernel(ty, level, single) {
                Some(VecKernel::Float(_)) if n_tokens == 1 => match float_rows_kernel(ty, level) {
                    Some(_) => format!("{l} float pairs"),
                    None => format!("{l} float dot"),
                },
                Some(VecKernel::Float(_)) => format!("{l} float dot ×{n_tokens}"),
                Some(VecKernel::Quant(_, _, f4)) => {
                    if n_tokens == 1 && rows_kernel(ty, level, single).is_some() {
                        return format!("{l}{fam} rows");
                    }
                    let tile = tile_kernel(ty, level, single)
                        .filter(|t| cols.is_multiple_of(t.cols_multiple));
                    match tile {
                        Some(t) if n_tokens > 1 => format!("{l}{fam} tile ≤{}", t.max_tokens),
                        _ if f4.is_some() && n_tokens >= 4 => format!("{l} dot ×4"),
                        _ => format!("{l} dot"),
                    }
                }
                None => "decode + f32 dots".into(),
            }
        }
    }
}

/// The level whose dot kernel [`vec_kernel`] picks for `ty` at `level`
/// (the lattice, ternary and MXFP4 formats at AVX-512: the AVX2 ones).
fn kernel_level(ty: GgmlType, level: SimdLevel, single: bool) -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx512 && x86_avx512::vec_kernel(ty).is_some() {
            return SimdLevel::Avx512;
        }
        if level >= SimdLevel::Avx2
            && x86_avx2::vec_kernel(ty, avx2_lanes_at(ty, level, single)).is_some()
        {
            return SimdLevel::Avx2;
        }
    }
    let _ = (ty, level, single);
    SimdLevel::Scalar
}

/// [`describe`] of [`choose`] for a matrix of `ty` in `layout`, `rows` x
/// `cols`, times `n_tokens` tokens at the process's SIMD level on a pool
/// that does (`single_stream`) or does not run one sequence at a time.
pub fn kernel_name(
    ty: GgmlType,
    layout: Layout,
    rows: usize,
    cols: usize,
    n_tokens: usize,
    single_stream: bool,
) -> String {
    let p = Product {
        ty,
        layout,
        rows,
        cols,
        n_tokens,
        level: simd::level().min(simd::detected_level()),
        single_stream,
        invariant: crate::numerics::batch_invariant(),
    };
    describe(choose(&p), ty, cols, n_tokens, single_stream)
}

/// The product `pool` would run for `w`-shaped inputs (its stream mode and
/// the calling thread's numerics).
pub(crate) fn product(
    pool: &ThreadPool,
    ty: GgmlType,
    layout: Layout,
    rows: usize,
    cols: usize,
    n_tokens: usize,
    level: SimdLevel,
) -> Product {
    Product {
        ty,
        layout,
        rows,
        cols,
        n_tokens,
        level,
        single_stream: pool.single_stream(),
        invariant: crate::numerics::batch_invariant(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table says what the kernels are: block geometry as the format
    /// layer has it, an integer dot kernel with the table's activations
    /// at every level where it claims one, the few-token tiles of the
    /// length it claims at the AVX-512 and AVX2 levels.
    #[test]
    fn table_matches_the_kernels() {
        for f in FORMATS {
            assert_eq!(f.block, f.ty.block_layout(), "{}", f.ty);
            let acts = match vec_kernel(f.ty, SimdLevel::Scalar, false) {
                Some(VecKernel::Float(_)) => Some(Acts::F32),
                Some(VecKernel::Quant(ActKind::Q8_0, ..)) => Some(Acts::Q8_0),
                Some(VecKernel::Quant(ActKind::Q8K, ..)) => Some(Acts::Q8K),
                None => None,
            };
            assert_eq!(acts, f.acts, "{}", f.ty);
            #[cfg(target_arch = "x86_64")]
            {
                let t512 = x86_avx512::vec_kernel(f.ty)
                    .and_then(|_| x86_avx512::tile_kernel(f.ty))
                    .map(|t| t.max_tokens);
                assert_eq!(t512, f.tile_avx512, "{} AVX-512 tile", f.ty);
                let t2 = x86_avx2::tile_kernel(f.ty, false).map(|t| t.max_tokens);
                assert_eq!(t2, f.tile_avx2, "{} AVX2 tile", f.ty);
                if f.avx2_lanes != Avx2Lanes::No {
                    let t = x86_avx2::tile_kernel(f.ty, true).map(|t| t.max_tokens);
                    assert_eq!(t, Some(AVX2_LANES_TOKENS), "{} AVX2 lanes tile", f.ty);
                }
                let kind = |k: Option<VecKernel>| match k {
                    Some(VecKernel::Float(_)) => Some(Acts::F32),
                    Some(VecKernel::Quant(ActKind::Q8_0, ..)) => Some(Acts::Q8_0),
                    Some(VecKernel::Quant(ActKind::Q8K, ..)) => Some(Acts::Q8K),
                    None => None,
                };
                for lanes in [false, true] {
                    assert_eq!(
                        kind(x86_avx2::vec_kernel(f.ty, lanes)),
                        f.acts,
                        "{} AVX2",
                        f.ty
                    );
                }
                let k512 = kind(x86_avx512::vec_kernel(f.ty));
                assert_eq!(
                    f.igemm_avx512.is_some(),
                    super::super::x86_avx512::igemm::supported(f.ty)
                );
                assert_eq!(
                    f.igemm_avx2.is_some(),
                    super::super::x86_avx2::igemm::supported(f.ty)
                );
                assert!(k512.is_none() || k512 == f.acts, "{} AVX-512", f.ty);
            }
        }
        // every format with a dot kernel is in the table
        for ty in GgmlType::ALL {
            if vec_kernel(ty, SimdLevel::Scalar, false).is_some() {
                assert!(FORMATS.iter().any(|f| f.ty == ty), "{ty} missing");
            }
        }
    }

    /// A few answers of [`choose`] that the table implies (a Q6_K matrix on
    /// the AVX2 level without AVX-VNNI: the rows kernel for one token, its
    /// lanes tile to 48, the integer GEMM from 49; the scalar level's f32
    /// GEMM from 4 tokens).
    #[test]
    fn choices_follow_the_table() {
        let p = |ty, n, level| Product {
            ty,
            layout: Layout::Rows,
            rows: 64,
            cols: 1024,
            n_tokens: n,
            level,
            single_stream: false,
            invariant: false,
        };
        assert_eq!(choose(&p(Q4_K, 0, SimdLevel::Scalar)), Kernel::Nothing);
        let scalar = |n| choose(&p(Q4_K, n, SimdLevel::Scalar));
        if gemm_override().is_none() {
            assert!(matches!(scalar(3), Kernel::Dots { .. }));
            assert_eq!(
                scalar(4),
                Kernel::F32Gemm {
                    level: SimdLevel::Scalar
                }
            );
        }
        let inv = Product {
            invariant: true,
            ..p(Q4_K, 512, SimdLevel::Scalar)
        };
        assert!(matches!(choose(&inv), Kernel::Dots { .. }));
        assert_eq!(choose(&p(Q8_K, 2, SimdLevel::Scalar)), Kernel::DecodedDots);
        // the lattice formats: each level's integer GEMM after the grid
        // formats' tiles
        #[cfg(target_arch = "x86_64")]
        if int_gemm_enabled() && gemm_override().is_none() {
            for (level, gemm) in [
                (SimdLevel::Avx2, Kernel::IntGemmAvx2),
                (SimdLevel::Avx512, Kernel::IntGemmAvx512),
            ] {
                for ty in [IQ1_S, IQ2_XXS] {
                    let from = gemm_min_tokens(ty, level);
                    assert_eq!(
                        choose(&p(ty, from - 1, level)),
                        Kernel::Dots {
                            level,
                            lanes: false
                        }
                    );
                    assert_eq!(choose(&p(ty, from, level)), gemm);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if crate::simd::available_levels().contains(&SimdLevel::Avx2)
            && !simd::avx_vnni()
            && avx2_lanes(Q6_K, false)
            && int_gemm_enabled()
            && gemm_override().is_none()
        {
            let at = |n| choose(&p(Q6_K, n, SimdLevel::Avx2));
            let lanes = Kernel::Dots {
                level: SimdLevel::Avx2,
                lanes: true,
            };
            assert_eq!(at(1), lanes);
            assert_eq!(at(48), lanes);
            assert_eq!(at(49), Kernel::IntGemmAvx2);
        }
    }
}
