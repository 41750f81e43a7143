//! Tensor block formats: exact dequantization for every format coil reads,
//! quantization from f32 for every weight format (all but Q8_K).
//!
//! Results are bit-identical to the reference `gguf` Python package
//! (`gguf.quants`, which mirrors ggml's reference C code); the test vectors in
//! `tests/fixtures/quant/` (made by `tools/gen_quant_vectors.py`) check it.
//!
//! | module      | formats                                   | direction      |
//! |-------------|-------------------------------------------|----------------|
//! | [`float`]   | F32, F16, BF16                            | both           |
//! | [`legacy`]  | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0              | both           |
//! | [`kquants`] | Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K        | dequantize     |
//! | [`kquants_quantize`] | Q4_K, Q5_K, Q6_K                 | quantize       |
//! | [`k23_quantize`] | Q2_K, Q3_K                           | quantize       |
//! | [`iquants`] | IQ4_NL, IQ4_XS                            | dequantize     |
//! | [`iquants_quantize`] | IQ4_NL, IQ4_XS                   | quantize       |
//! | [`iq2`]     | IQ2_XXS, IQ2_XS, IQ2_S                    | dequantize     |
//! | [`iq3`]     | IQ3_XXS, IQ3_S                            | dequantize     |
//! | [`iq_quantize`] | IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S | quantize     |
//! | [`iq1_quantize`] | IQ1_S, IQ1_M                         | quantize       |
//! | `weighted`  | Q4_0..Q5_1, Q2_K..Q6_K, IQ4_NL, IQ4_XS with importance weights | quantize |
//! | [`iq1`]     | IQ1_S, IQ1_M                              | dequantize     |
//! | [`ternary`] | TQ1_0, TQ2_0                              | both           |
//! | [`mxfp4`]   | MXFP4                                     | both           |
//!
//! [`grids`] holds the formats' lookup tables (generated from ggml's source).
//!
//! Row functions ([`dequantize_row`], [`quantize_row`], [`quantize_rows`]
//! with an optional importance matrix) check lengths and
//! return [`QuantError`] instead of panicking; each module also has
//! per-block functions on fixed-size arrays (`dequantize_block_q4_k`, ...)
//! and block-size constants (`Q4_K_BYTES`, ...) for kernels that work block
//! by block, plus the scalar helpers [`f16_to_f32`], [`f32_to_f16`],
//! [`bf16_to_f32`], [`f32_to_bf16`], [`get_scale_min_k4`] and
//! [`KVALUES_IQ4NL`].
//!
//! Exactness: every value, NaN payloads of F16/BF16/F32 included, matches
//! `gguf.quants` bit for bit on x86-64 (the checked platform). Elsewhere the
//! one thing that can differ is the bit pattern of a NaN *made by arithmetic*
//! (e.g. `inf·0` in a block whose f16 scale overflowed), which is the CPU's
//! choice. Non-finite inputs to the quantizers never panic; see [`legacy`].

use crate::dtype::GgmlType;

pub mod float;
pub mod grids;
pub mod iq1;
pub mod iq1_quantize;
pub mod iq2;
pub mod iq3;
pub mod iq_quantize;
pub mod iquants;
pub mod iquants_quantize;
pub mod k23_quantize;
pub mod kquants;
pub mod kquants_quantize;
mod lattice;
pub mod legacy;
pub mod mxfp4;
mod search_lanes;
pub mod ternary;
mod weighted;

pub use float::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
pub use iquants::KVALUES_IQ4NL;
pub use kquants::{get_scale_min_k4, QK_K};

/// Why a row could not be (de)quantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// coil has no (de)quantization code for this type.
    #[error("{op} to/from {ty} is not supported")]
    Unsupported {
        ty: GgmlType,
        /// "dequantization", "quantization" or "quantization with an
        /// importance matrix".
        op: &'static str,
    },
    /// The element count is not a whole number of blocks.
    #[error("{ty}: {n_elements} elements is not a multiple of the block size {block_size}")]
    NotBlockMultiple {
        ty: GgmlType,
        n_elements: usize,
        block_size: usize,
    },
    /// The byte buffer does not hold exactly the blocks for the elements.
    #[error("{ty}: {n_elements} elements take {expected} bytes, but the buffer has {actual}")]
    ByteLength {
        ty: GgmlType,
        n_elements: usize,
        expected: usize,
        actual: usize,
    },
    /// ggml's quantizer for this type needs importance weights.
    #[error("{ty}: quantization needs importance weights (an importance matrix)")]
    WeightsRequired { ty: GgmlType },
    /// ggml's lattice search found no grid point for a group of values
    /// (values or weights so large, or not finite, that every distance is
    /// infinite or NaN); ggml aborts there.
    #[error("{ty}: a group of values has no nearest grid point (values or importance weights too large or not finite)")]
    OffGrid { ty: GgmlType },
    /// A byte buffer that is not a whole number of blocks.
    #[error("{ty}: {n_bytes} bytes is not a whole number of {type_size}-byte blocks")]
    PartialBlock {
        ty: GgmlType,
        n_bytes: usize,
        type_size: usize,
    },
    /// An importance matrix whose length is not the row length.
    #[error("{ty}: an importance matrix of {actual} values for rows of {n_per_row}")]
    ImportanceLength {
        ty: GgmlType,
        n_per_row: usize,
        actual: usize,
    },
    /// Rows that do not tile the data.
    #[error("{ty}: {n_elements} elements is not a whole number of rows of {n_per_row}")]
    PartialRow {
        ty: GgmlType,
        n_elements: usize,
        n_per_row: usize,
    },
}

/// Whether [`dequantize_row`] supports `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q8_0
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | Q8_K
            | IQ4_NL
            | IQ4_XS
            | IQ2_XXS
            | IQ2_XS
            | IQ2_S
            | IQ3_XXS
            | IQ3_S
            | IQ1_S
            | IQ1_M
            | TQ1_0
            | TQ2_0
            | MXFP4
    )
}

/// Whether [`quantize_row`] supports `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16
            | BF16
            | Q8_0
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | IQ4_NL
            | IQ4_XS
            | IQ2_XXS
            | IQ2_XS
            | IQ2_S
            | IQ3_XXS
            | IQ3_S
            | IQ1_S
            | IQ1_M
            | TQ1_0
            | TQ2_0
            | MXFP4
    )
}

/// Whether ggml's quantizer for `ty` refuses to run without importance
/// weights (`ggml_quantize_requires_imatrix`): IQ2_XXS, IQ2_XS, IQ1_S.
pub fn requires_weights(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, IQ2_XXS | IQ2_XS | IQ1_S)
}

/// Whether [`quantize_row_weighted`] accepts importance weights for `ty`:
/// the types whose ggml quantizer ignores them (so do coil's: F32, F16,
/// BF16, Q8_0, TQ1_0, TQ2_0, MXFP4) and those where coil uses them as ggml
/// does (every other type [`quantize_row`] writes).
pub fn can_quantize_weighted(ty: GgmlType) -> bool {
    can_quantize(ty)
}

/// Checks that `n_elements` elements of `ty` take exactly `n_bytes` bytes.
fn check_lengths(ty: GgmlType, n_elements: usize, n_bytes: usize) -> Result<(), QuantError> {
    let (block_size, type_size) = ty.block_layout();
    if !n_elements.is_multiple_of(block_size) {
        return Err(QuantError::NotBlockMultiple {
            ty,
            n_elements,
            block_size,
        });
    }
    let expected = (n_elements / block_size).checked_mul(type_size);
    if expected != Some(n_bytes) {
        return Err(QuantError::ByteLength {
            ty,
            n_elements,
            expected: expected.unwrap_or(usize::MAX),
            actual: n_bytes,
        });
    }
    Ok(())
}

/// Decodes `dst.len()` elements of type `ty` from `src`, which must hold
/// exactly the blocks for them (`dst.len()` a multiple of the block size).
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    if !can_dequantize(ty) {
        return Err(QuantError::Unsupported {
            ty,
            op: "dequantization",
        });
    }
    check_lengths(ty, dst.len(), src.len())?;
    match ty {
        F32 => float::dequantize_f32(src, dst),
        F16 => float::dequantize_f16(src, dst),
        BF16 => float::dequantize_bf16(src, dst),
        Q4_0 => legacy::dequantize_q4_0(src, dst),
        Q4_1 => legacy::dequantize_q4_1(src, dst),
        Q5_0 => legacy::dequantize_q5_0(src, dst),
        Q5_1 => legacy::dequantize_q5_1(src, dst),
        Q8_0 => legacy::dequantize_q8_0(src, dst),
        Q2_K => kquants::dequantize_q2_k(src, dst),
        Q3_K => kquants::dequantize_q3_k(src, dst),
        Q4_K => kquants::dequantize_q4_k(src, dst),
        Q5_K => kquants::dequantize_q5_k(src, dst),
        Q6_K => kquants::dequantize_q6_k(src, dst),
        Q8_K => kquants::dequantize_q8_k(src, dst),
        IQ4_NL => iquants::dequantize_iq4_nl(src, dst),
        IQ4_XS => iquants::dequantize_iq4_xs(src, dst),
        IQ2_XXS => iq2::dequantize_iq2_xxs(src, dst),
        IQ2_XS => iq2::dequantize_iq2_xs(src, dst),
        IQ2_S => iq2::dequantize_iq2_s(src, dst),
        IQ3_XXS => iq3::dequantize_iq3_xxs(src, dst),
        IQ3_S => iq3::dequantize_iq3_s(src, dst),
        IQ1_S => iq1::dequantize_iq1_s(src, dst),
        IQ1_M => iq1::dequantize_iq1_m(src, dst),
        TQ1_0 => ternary::dequantize_tq1_0(src, dst),
        TQ2_0 => ternary::dequantize_tq2_0(src, dst),
        MXFP4 => mxfp4::dequantize_mxfp4(src, dst),
        _ => {
            return Err(QuantError::Unsupported {
                ty,
                op: "dequantization",
            })
        }
    }
    Ok(())
}

/// Encodes `src` as type `ty` into `dst`, which must have exactly the bytes
/// of the blocks (`src.len()` a multiple of the block size). Types that
/// need importance weights ([`requires_weights`]) are an error here: see
/// [`quantize_row_weighted`].
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    quantize_row_weighted(ty, src, None, dst)
}

/// [`quantize_row`] with ggml's importance weights (`src` one row: the
/// legacy types' weighting uses the row's mean square): `weights` has one value
/// per element of the row (an importance matrix's entries for the row's
/// columns; every row of a tensor takes the same ones), as
/// `ggml_quantize_chunk` takes them.
pub fn quantize_row_weighted(
    ty: GgmlType,
    src: &[f32],
    weights: Option<&[f32]>,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    use GgmlType::*;
    if !can_quantize(ty) {
        return Err(QuantError::Unsupported {
            ty,
            op: "quantization",
        });
    }
    check_lengths(ty, src.len(), dst.len())?;
    let off_grid = |_| QuantError::OffGrid { ty };
    match weights {
        None if requires_weights(ty) => return Err(QuantError::WeightsRequired { ty }),
        Some(_) if !can_quantize_weighted(ty) => {
            return Err(QuantError::Unsupported {
                ty,
                op: "quantization with an importance matrix",
            })
        }
        Some(w) if w.len() != src.len() => {
            return Err(QuantError::ImportanceLength {
                ty,
                n_per_row: src.len(),
                actual: w.len(),
            })
        }
        _ => {}
    }
    if let Some(w) = weights {
        let f: Option<WeightedRowFn> = match ty {
            Q4_0 => Some(weighted::quantize_q4_0),
            Q4_1 => Some(weighted::quantize_q4_1),
            Q5_0 => Some(weighted::quantize_q5_0),
            Q5_1 => Some(weighted::quantize_q5_1),
            Q2_K => Some(weighted::quantize_q2_k),
            Q3_K => Some(weighted::quantize_q3_k),
            Q4_K => Some(weighted::quantize_q4_k),
            Q5_K => Some(weighted::quantize_q5_k),
            Q6_K => Some(weighted::quantize_q6_k),
            IQ4_NL => Some(weighted::quantize_iq4_nl),
            IQ4_XS => Some(weighted::quantize_iq4_xs),
            _ => None,
        };
        if let Some(f) = f {
            f(src, w, dst);
            return Ok(());
        }
    }
    match ty {
        F32 => float::quantize_f32(src, dst),
        F16 => float::quantize_f16(src, dst),
        BF16 => float::quantize_bf16(src, dst),
        Q4_0 => legacy::quantize_q4_0(src, dst),
        Q4_1 => legacy::quantize_q4_1(src, dst),
        Q5_0 => legacy::quantize_q5_0(src, dst),
        Q5_1 => legacy::quantize_q5_1(src, dst),
        Q8_0 => legacy::quantize_q8_0(src, dst),
        Q2_K => k23_quantize::quantize_q2_k(src, dst),
        Q3_K => k23_quantize::quantize_q3_k(src, dst),
        Q4_K => kquants_quantize::quantize_q4_k(src, dst),
        Q5_K => kquants_quantize::quantize_q5_k(src, dst),
        Q6_K => kquants_quantize::quantize_q6_k(src, dst),
        IQ4_NL => iquants_quantize::quantize_iq4_nl(src, dst),
        IQ4_XS => iquants_quantize::quantize_iq4_xs(src, dst),
        TQ1_0 => ternary::quantize_tq1_0(src, dst),
        TQ2_0 => ternary::quantize_tq2_0(src, dst),
        MXFP4 => mxfp4::quantize_mxfp4(src, dst),
        IQ2_XXS => lattice_blocks(src, weights, dst, iq_quantize::quantize_block_iq2_xxs)
            .map_err(off_grid)?,
        IQ2_XS => lattice_blocks(src, weights, dst, iq_quantize::quantize_block_iq2_xs)
            .map_err(off_grid)?,
        IQ2_S => lattice_blocks(src, weights, dst, iq_quantize::quantize_block_iq2_s)
            .map_err(off_grid)?,
        IQ3_XXS => lattice_blocks(src, weights, dst, iq_quantize::quantize_block_iq3_xxs)
            .map_err(off_grid)?,
        IQ3_S => lattice_blocks(src, weights, dst, iq_quantize::quantize_block_iq3_s)
            .map_err(off_grid)?,
        IQ1_S => lattice_blocks(src, weights, dst, iq1_quantize::quantize_block_iq1_s)
            .map_err(off_grid)?,
        IQ1_M => lattice_blocks(src, weights, dst, iq1_quantize::quantize_block_iq1_m)
            .map_err(off_grid)?,
        _ => {
            return Err(QuantError::Unsupported {
                ty,
                op: "quantization",
            })
        }
    }
    Ok(())
}

/// Encodes whole rows of `n_per_row` elements of `src` as `ty` into `dst`
/// (ggml's `ggml_quantize_chunk`). `importance`, where given, holds one
/// weight per column (`n_per_row` values, the same for every row: ggml's
/// `quant_weights`, e.g. the mean squared activations `coil imatrix`
/// collects for the matrix): the quantizers then minimise the
/// importance-weighted error, as llama-quantize does with `--imatrix`.
/// F32, F16, BF16, Q8_0, TQ1_0, TQ2_0 and MXFP4 take no weights (as in
/// ggml); every other type uses them ([`quantize_row_weighted`]; the
/// legacy types weigh by the whole row's mean square, so `src` is whole
/// rows).
pub fn quantize_rows(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    importance: Option<&[f32]>,
    dst: &mut [u8],
) -> Result<(), QuantError> {
    if n_per_row == 0 || !src.len().is_multiple_of(n_per_row) {
        return Err(QuantError::PartialRow {
            ty,
            n_elements: src.len(),
            n_per_row,
        });
    }
    let Some(w) = importance else {
        return quantize_row(ty, src, dst);
    };
    if w.len() != n_per_row {
        return Err(QuantError::ImportanceLength {
            ty,
            n_per_row,
            actual: w.len(),
        });
    }
    if !can_quantize_weighted(ty) {
        return Err(QuantError::Unsupported {
            ty,
            op: "quantization with an importance matrix",
        });
    }
    check_lengths(ty, src.len(), dst.len())?;
    let row_bytes = ty
        .bytes_for(n_per_row as u64)
        .ok_or(QuantError::NotBlockMultiple {
            ty,
            n_elements: n_per_row,
            block_size: ty.block_size(),
        })? as usize;
    for (x, y) in src
        .chunks_exact(n_per_row)
        .zip(dst.chunks_exact_mut(row_bytes))
    {
        quantize_row_weighted(ty, x, Some(w), y)?;
    }
    Ok(())
}

/// A weighted row quantizer of `weighted`: values, weights, blocks.
type WeightedRowFn = fn(&[f32], &[f32], &mut [u8]);

/// A lattice format's block quantizer: 256 values, their importance weights.
type LatticeBlockFn<const B: usize> =
    fn(&[f32; QK_K], Option<&[f32]>, &mut [u8; B]) -> Result<(), iq_quantize::OffGrid>;

/// Runs a lattice format's block quantizer over a row, each block with its
/// 256 importance weights.
fn lattice_blocks<const B: usize>(
    src: &[f32],
    weights: Option<&[f32]>,
    dst: &mut [u8],
    f: LatticeBlockFn<B>,
) -> Result<(), iq_quantize::OffGrid> {
    for (i, (x, y)) in blocks::<QK_K, f32>(src)
        .zip(blocks_mut::<B, u8>(dst))
        .enumerate()
    {
        f(x, weights.map(|w| &w[QK_K * i..QK_K * (i + 1)]), y)?;
    }
    Ok(())
}

/// [`dequantize_row`] into a new vector; the element count follows from
/// `src.len()`, which must be a whole number of blocks.
pub fn dequantize(ty: GgmlType, src: &[u8]) -> Result<Vec<f32>, QuantError> {
    let (block_size, type_size) = ty.block_layout();
    if !src.len().is_multiple_of(type_size) {
        return Err(QuantError::PartialBlock {
            ty,
            n_bytes: src.len(),
            type_size,
        });
    }
    let mut out = vec![0f32; src.len() / type_size * block_size];
    dequantize_row(ty, src, &mut out)?;
    Ok(out)
}

/// [`quantize_row`] into a new vector.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let (block_size, type_size) = ty.block_layout();
    let mut out = vec![0u8; src.len() / block_size * type_size];
    quantize_row(ty, src, &mut out)?;
    Ok(out)
}

/// `src` as whole `N`-element blocks (a trailing partial block is skipped;
/// callers check lengths first).
#[inline]
pub(crate) fn blocks<const N: usize, T>(src: &[T]) -> impl Iterator<Item = &[T; N]> {
    src.chunks_exact(N).filter_map(|c| c.try_into().ok())
}

/// `dst` as whole `N`-element blocks, mutable (see [`blocks`]).
#[inline]
pub(crate) fn blocks_mut<const N: usize, T>(dst: &mut [T]) -> impl Iterator<Item = &mut [T; N]> {
    dst.chunks_exact_mut(N).filter_map(|c| c.try_into().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_with_and_without_importance() {
        let src: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let n = GgmlType::Q8_0.bytes_for(64).unwrap() as usize;
        let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
        quantize_rows(GgmlType::Q8_0, &src, 32, None, &mut a).unwrap();
        // Q8_0 takes no weights, as in ggml.
        quantize_rows(GgmlType::Q8_0, &src, 32, Some(&[1.0; 32]), &mut b).unwrap();
        assert_eq!(a, b);
        assert_eq!(a, quantize(GgmlType::Q8_0, &src).unwrap());
        let e = quantize_rows(GgmlType::Q8_0, &src, 32, Some(&[1.0; 31]), &mut b);
        assert!(
            matches!(e, Err(QuantError::ImportanceLength { actual: 31, .. })),
            "{e:?}"
        );
        let e = quantize_rows(GgmlType::Q8_0, &src, 48, None, &mut b);
        assert!(matches!(e, Err(QuantError::PartialRow { .. })), "{e:?}");
    }

    #[test]
    fn support_tables() {
        for ty in GgmlType::ALL {
            if can_quantize(ty) {
                assert!(can_dequantize(ty), "{ty}");
            }
        }
        assert!(can_dequantize(GgmlType::IQ4_XS));
        assert!(can_dequantize(GgmlType::IQ2_XXS));
        assert!(!can_dequantize(GgmlType::I32));
        assert!(can_quantize(GgmlType::Q4_K));
        assert!(can_quantize(GgmlType::Q2_K));
        assert!(can_quantize(GgmlType::IQ4_XS));
        assert!(!can_quantize(GgmlType::Q8_K));
    }

    #[test]
    fn unsupported_types_are_errors() {
        let mut out = [0f32; 256];
        let e = dequantize_row(GgmlType::Q8_1, &[0u8; 36 * 8], &mut out).unwrap_err();
        assert!(matches!(e, QuantError::Unsupported { .. }));
        assert!(e.to_string().contains("Q8_1"));
        let mut bytes = [0u8; 292];
        let e = quantize_row(GgmlType::Q8_K, &out, &mut bytes).unwrap_err();
        assert!(matches!(e, QuantError::Unsupported { .. }));
    }

    #[test]
    fn wrong_lengths_are_errors_for_every_type() {
        for ty in GgmlType::ALL {
            let (bs, ts) = ty.block_layout();
            if can_dequantize(ty) {
                let src = vec![0u8; 3 * ts];
                let mut dst = vec![0f32; 3 * bs];
                assert!(dequantize_row(ty, &src, &mut dst).is_ok(), "{ty}");
                // one byte short / long
                let e = dequantize_row(ty, &src[..3 * ts - 1], &mut dst).unwrap_err();
                assert!(matches!(e, QuantError::ByteLength { .. }), "{ty}: {e}");
                let long = vec![0u8; 3 * ts + 1];
                assert!(dequantize_row(ty, &long, &mut dst).is_err());
                // two blocks of bytes for three blocks of elements
                assert!(dequantize_row(ty, &src[..2 * ts], &mut dst).is_err());
                if bs > 1 {
                    let e = dequantize_row(ty, &src, &mut dst[..3 * bs - 1]).unwrap_err();
                    assert!(
                        matches!(e, QuantError::NotBlockMultiple { .. }),
                        "{ty}: {e}"
                    );
                    assert!(dequantize(ty, &src[..ts + 1]).is_err());
                }
                assert_eq!(dequantize(ty, &src).map(|v| v.len()), Ok(3 * bs));
                // empty rows are fine
                assert!(dequantize_row(ty, &[], &mut []).is_ok());
            }
            if can_quantize(ty) {
                // ones as importance weights where the type needs them
                let q = |src: &[f32], dst: &mut [u8]| {
                    let w = vec![1f32; src.len()];
                    quantize_row_weighted(ty, src, requires_weights(ty).then_some(&w[..]), dst)
                };
                let src = vec![0.5f32; 2 * bs];
                let mut dst = vec![0u8; 2 * ts];
                assert!(q(&src, &mut dst).is_ok(), "{ty}");
                assert!(q(&src, &mut dst[..2 * ts - 1]).is_err());
                assert!(q(&src[..bs], &mut dst).is_err());
                if bs > 1 {
                    let e = q(&src[..2 * bs - 1], &mut dst).unwrap_err();
                    assert!(
                        matches!(e, QuantError::NotBlockMultiple { .. }),
                        "{ty}: {e}"
                    );
                    let mut short = vec![0u8; ts];
                    assert!(q(&src[..bs + 3], &mut short).is_err());
                }
            }
        }
    }

    #[test]
    fn importance_weights_are_checked() {
        let x = [0.5f32; 256];
        let w = [1f32; 256];
        let mut y = [0u8; 66];
        // TQ2_0 ignores weights (as ggml does); their count is still checked
        assert!(quantize_row_weighted(GgmlType::TQ2_0, &x, Some(&w), &mut y).is_ok());
        let e = quantize_row_weighted(GgmlType::TQ2_0, &x, Some(&w[..255]), &mut y).unwrap_err();
        assert!(matches!(e, QuantError::ImportanceLength { .. }), "{e}");
        let mut y = [0u8; 144];
        assert!(quantize_row_weighted(GgmlType::Q4_K, &x, Some(&w), &mut y).is_ok());
        let e = quantize_row_weighted(GgmlType::Q4_K, &x, Some(&w[..128]), &mut y).unwrap_err();
        assert!(matches!(e, QuantError::ImportanceLength { .. }), "{e}");
        for ty in GgmlType::ALL.into_iter().filter(|&t| requires_weights(t)) {
            let mut y = vec![0u8; ty.type_size()];
            if can_quantize(ty) {
                let e = quantize_row(ty, &x, &mut y).unwrap_err();
                assert!(matches!(e, QuantError::WeightsRequired { .. }), "{e}");
                assert!(e.to_string().contains("importance"));
            }
        }
    }

    #[test]
    fn row_round_trips() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let ones = vec![1f32; x.len()];
        for ty in GgmlType::ALL.into_iter().filter(|t| can_quantize(*t)) {
            let mut q = vec![0u8; x.len() / ty.block_size() * ty.type_size()];
            let w = requires_weights(ty).then_some(&ones[..]);
            quantize_row_weighted(ty, &x, w, &mut q).unwrap();
            let y = dequantize(ty, &q).unwrap();
            assert_eq!(y.len(), x.len());
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let tol = match ty {
                GgmlType::F32 => 0.0,
                GgmlType::F16 => amax / 1024.0,
                GgmlType::BF16 => amax / 128.0,
                GgmlType::Q8_0 => amax / 127.0,
                GgmlType::Q5_0 | GgmlType::Q5_1 => amax / 15.0,
                GgmlType::Q2_K => amax / 3.0,
                GgmlType::Q3_K => amax / 5.0,
                GgmlType::TQ1_0 | GgmlType::TQ2_0 => amax / 2.0 * 1.001,
                GgmlType::MXFP4 => amax / 3.0,
                // a lattice point per 4 or 8 values: single values can be far
                // off (without importance weights IQ1_M puts one of these at
                // 1.06·amax from its value, as ggml does)
                GgmlType::IQ1_S | GgmlType::IQ1_M => amax * 1.1,
                GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => amax,
                GgmlType::IQ3_XXS | GgmlType::IQ3_S => amax / 2.0,
                _ => amax / 7.0,
            };
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= tol, "{ty}: {a} vs {b}");
            }
            // quantizing the dequantized values again is stable for the float types
            if ty.is_plain() {
                assert_eq!(quantize(ty, &y).unwrap(), q, "{ty}");
            }
        }
    }
}
