//! The kernels' signatures: what a level's registry hands the plan for
//! one format (a dot product, a one-token rows kernel, a few-token tile)
//! and the activation quantization each reads.

use crate::matmul::act::{self, QuantAct};

/// Which activation quantization a dot kernel wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActKind {
    Q8_0,
    Q8K,
}

pub(crate) type FloatDot = fn(&[u8], &[f32]) -> f32;

pub(crate) type QuantDot = fn(&[u8], &[i8], &[f32], &[i16]) -> f32;

/// Four tokens at once (the weight row is unpacked once).
pub(crate) type QuantDot4 = fn(&[u8], [&[i8]; 4], [&[f32]; 4], [&[i16]; 4]) -> [f32; 4];

/// One token against consecutive rows: `out[i] = row i · x` for the
/// `out.len()` rows of `row_bytes` bytes at the start of the data (decode:
/// no call per row, constants set up once, rows prefetched ahead).
pub(crate) type QuantRows = fn(&[u8], usize, &[i8], &[f32], &[i16], &mut [f32]);

/// A few tokens (up to the kernel's maximum, at least 4) against consecutive
/// rows: `out[t][i] = row i · token t`
/// for the `out[t].len()` rows of `row_bytes` bytes at the start of the data
/// (each row unpacked once for all the tokens; each token's result bit for
/// bit the one-token kernel's).
pub(crate) type QuantTile = fn(&[u8], usize, &act::ActPanel, &mut [&mut [f32]]);

/// A few-token kernel with what it asks of its calls.
#[derive(Clone, Copy)]
pub(crate) struct TileKernel {
    pub f: QuantTile,
    /// Most tokens per call.
    pub max_tokens: usize,
    /// Values per interleaved chunk of the [`act::ActPanel`] it reads (one
    /// vector's worth: 32 at AVX2, 64 at AVX-512).
    pub chunk: usize,
    /// Columns it handles: a multiple of this (the others go through the
    /// dot kernels, token by token).
    pub cols_multiple: usize,
    /// Builds its panels when it reads other fields than
    /// [`act::ActPanel::new`]'s (once per product).
    pub own_panel: Option<PanelBuild>,
}

/// A tile kernel's own panel of tokens `t0..t0 + nt` of the activations.
pub(crate) type PanelBuild = fn(&QuantAct, usize, usize) -> act::ActPanel;

impl TileKernel {
    /// The panel this kernel reads for tokens `t0..t0 + nt` of `xa`
    /// (blocks of `block` values with `per_block` group sums).
    pub(crate) fn panel(
        &self,
        xa: &QuantAct,
        t0: usize,
        nt: usize,
        block: usize,
        per_block: usize,
    ) -> act::ActPanel {
        match self.own_panel {
            Some(build) => build(xa, t0, nt),
            None => act::ActPanel::new(xa, t0, nt, block, per_block, self.chunk),
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum VecKernel {
    Float(FloatDot),
    Quant(ActKind, QuantDot, Option<QuantDot4>),
}

/// One token's rows of a float format: `(w, x, out)`, `w` from the first
/// of `out.len()` rows.
pub(crate) type FloatRows = fn(&[u8], &[f32], &mut [f32]);

/// Rows the decode path fetches ahead of the one it multiplies.
pub(crate) const PF_ROWS: usize = 8;

/// How far ahead (bytes) the row-prefetching decode kernels fetch.
const PF_BYTES: usize = 4096;

/// Rows of `rb` bytes fetched ahead by the decode kernels that prefetch
/// whole rows (AVX2 IQ4_XS; AVX-512 Q8_0/Q4_0/IQ4_NL/IQ4_XS): about
/// [`PF_BYTES`], at most [`PF_ROWS`]. Eight rows of a wide matrix (an FFN
/// down projection's 8192 columns: 37–54 KB at Q4_K–Q6_K) overran the
/// 32 KB L1 and evicted the rows about to be used (lfm2-1.2b-like Q4_K_M,
/// CPU time of `coil bench -p 0 -n 64`, AVX2: 6.93–7.27 s with 8 rows,
/// 6.60–6.77 s with 1–8 KB ahead). The AVX2 32-value and K-quant kernels
/// and the AVX-512 K-quants went further: a prefetch per block, a fixed
/// distance ahead (`x86_avx2::PF_STREAM`), faster again.
#[inline]
pub(crate) fn pf_rows(rb: usize) -> usize {
    (PF_BYTES / rb.max(1)).clamp(1, PF_ROWS)
}
