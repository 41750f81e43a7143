//! AVX2 (+FMA, F16C) kernels.
use super::{SimdLevel, VecKernel};
use coil_gguf::GgmlType;

pub(super) fn vec_kernel(_ty: GgmlType) -> Option<VecKernel> {
    None
}

/// SIMD decoding of the plain float formats; false = not handled here.
pub(super) fn decode(_ty: GgmlType, _src: &[u8], _dst: &mut [f32], _level: SimdLevel) -> bool {
    false
}
