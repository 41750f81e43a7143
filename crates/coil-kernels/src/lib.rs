//! coil layer 1 — CPU compute kernels: pure functions on slices.
//!
//! * [`matmul()`]: `y[t, r] = Σ_c w[r, c] · x[t, c]` for weights of every GGUF
//!   format as they lie in the file ([`WeightRef`], zero-copy), `x`:
//!   `[n_tokens, cols]` f32, `y`: `[n_tokens, rows]` f32. Few tokens: integer
//!   dot products against activations quantized on the fly (Q8_0-style for
//!   Q8_0/Q4_0/IQ4_NL, Q8_K-style for K-quants/IQ4_XS; 4 tokens per weight
//!   unpack), f32 dots for F32/F16/BF16. Many tokens: an AVX-512 VNNI
//!   integer GEMM for Q8_0/Q4_0/IQ4_NL/Q4_K/Q5_K/Q6_K/IQ4_XS, otherwise
//!   weights decoded to f32 panel by panel and a register-tiled f32 GEMM.
//!   Formats without native code (IQ2/IQ3/…, Q8_K) are decoded through
//!   `coil_gguf::quant`.
//! * [`ops`]: RMSNorm and gated group RMSNorm, activations, RoPE (normal /
//!   NeoX, partial), causal depthwise conv1d with a carried window, Mamba-1
//!   and Mamba-2 scans (sequence and single step), attention of a batch of
//!   queries over a KV view (GQA, per-query causal limits, f32/f16 KV), top-k.
//! * [`ThreadPool`]: persistent threads; the caller works too; chunks handed
//!   out from an atomic counter; idle threads spin ~100 µs, then sleep.
//! * [`numerics`]: batch-invariant mode — inside [`invariant_scope`] every
//!   kernel takes the path of a single row, so a row's result does not
//!   depend on how many rows share the call (bit for bit).
//! * [`simd`]: runtime dispatch (AVX-512+VNNI, AVX2+FMA, portable);
//!   [`matmul_at`], [`simd::level_scope`] (a thread and its pool jobs:
//!   tests) and [`simd::force_level`] (process-wide: benchmarks) pick a level
//!   explicitly; `COIL_SIMD=scalar|avx2|avx512` caps it.
//!
//! Shapes are row-major and written `[outer, ..., inner]` in the docs.
//! Length mismatches in the hot functions are programmer errors and panic;
//! data from files is checked at [`WeightRef::new`].

#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

pub mod aligned;
pub mod denormals;
pub mod error;
pub mod hugepages;
mod info;
pub mod matmul;
pub mod numerics;
pub mod ops;
pub mod pool;
pub mod scratch;
pub mod simd;
#[doc(hidden)]
pub mod testutil;

pub use error::KernelError;
pub use info::system_info;
pub use matmul::{matmul, matmul_at, matmul_shared, repack, repacks, Layout, WeightRef};
pub use numerics::{batch_invariant, invariance, invariance_scope, invariant_scope, Invariance};
pub use pool::ThreadPool;
pub use scratch::Scratch;
pub use simd::SimdLevel;
