//! Tensor block formats: exact dequantization for every format coil reads,
//! quantization from f32 for the simple formats.
//!
//! (Owned by the block-formats work; see `dequantize` / `quantize`.)
