//! Decoding whole blocks of any format to f32 at a SIMD level (the f32
//! GEMM's panels, formats without dot kernels, [`crate::matmul::weight::WeightRef::dequantize_row`]).

use crate::matmul::scalar::dequant;
#[cfg(target_arch = "x86_64")]
use crate::matmul::{x86_avx2::dots as avx2, x86_avx512::dots as avx512};
use crate::simd::SimdLevel;
use coil_gguf::GgmlType;

/// Fallback decoding through the format layer, for formats without native code.
mod fallback {
    use coil_gguf::GgmlType;

    pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
        coil_gguf::quant::dequantize_row(ty, src, dst).is_ok()
    }
}

/// Decodes whole blocks of `ty` from `src` into `dst` (f32).
pub(crate) fn decode_segment(ty: GgmlType, src: &[u8], dst: &mut [f32], level: SimdLevel) {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx512 && avx512::decode(ty, src, dst) {
            return;
        }
        if level >= SimdLevel::Avx2 && avx2::decode(ty, src, dst, level) {
            return;
        }
    }
    let _ = level;
    if !dequant::dequant_row(ty, src, dst) && !fallback::dequantize(ty, src, dst) {
        unreachable!("WeightRef::new admits only decodable types, got {ty}");
    }
}
