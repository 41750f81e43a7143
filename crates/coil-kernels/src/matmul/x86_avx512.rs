//! AVX-512 (F/BW/VL/DQ + VNNI) kernels.
use super::VecKernel;
use coil_gguf::GgmlType;

pub(super) fn vec_kernel(_ty: GgmlType) -> Option<VecKernel> {
    None
}
