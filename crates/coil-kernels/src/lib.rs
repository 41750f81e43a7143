//! coil layer 1 — CPU compute kernels: pure functions on slices.
//!
//! * [`matmul`]: weight · activation products for every GGUF weight format
//!   (decode-sized and prefill-sized), with runtime SIMD dispatch ([`simd`]).
//! * [`ops`]: norms, activations, RoPE, causal conv1d, Mamba-1/Mamba-2 scans,
//!   attention over a KV view, top-k.
//! * [`ThreadPool`]: a persistent pool that spins briefly, then sleeps.
//!
//! Shapes are row-major and written `[outer, ..., inner]` in the docs.

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

pub mod error;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod simd;
#[doc(hidden)]
pub mod testutil;

pub use error::KernelError;
pub use matmul::{matmul, matmul_at, WeightRef};
pub use pool::ThreadPool;
pub use simd::SimdLevel;
