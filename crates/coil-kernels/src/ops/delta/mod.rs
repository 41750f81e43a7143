//! The delta-rule family: the gated delta rule (Gated DeltaNet: Qwen3.5,
//! Qwen3-Next) with one decay per head, and Kimi Delta Attention (KDA:
//! Kimi-Linear) with one per key channel. Each runs token by token for
//! decode and in chunks of matrix products for prompts; the state's
//! storage type (f32, bf16) is a type parameter ([`DeltaState`],
//! [`KdaState`]) and the sequences of a batch a parameter of the one scan.
//!
//! * `dims.rs`: [`GatedDeltaDims`], [`HeadOrder`], [`DeltaInputs`]
//! * `gated.rs`: the gated delta rule token by token (on an f32 or a bf16
//!   state), the reference: [`gated_delta_scan`], [`gated_delta_scan_batch`];
//!   [`l2_normalize`]
//! * `moving.rs`: one token while the state moves to a new buffer (streamed)
//! * `chunk.rs`: the chunked form of both ([`delta_chunked`], over the
//!   decay shape: [`ChunkGate`]), its buffers, solve and small matrix
//!   products; `chunk_lanes.rs`: the gated delta rule's chunks with one
//!   token per SIMD lane for small heads
//! * `kda.rs`, `kda_chunk.rs`: KDA token by token, and its chunk step

pub mod chunk;
mod chunk_lanes;
pub mod dims;
pub mod gated;
pub mod kda;
pub mod kda_chunk;
mod moving;

pub use chunk::{delta_chunked, ChunkGate, DEFAULT_CHUNK};
pub use dims::{DeltaInputs, GatedDeltaDims, HeadOrder, Seq};
pub use gated::{
    gated_delta_scan, gated_delta_scan_batch, gated_delta_scan_state, l2_normalize, DeltaSeq,
    DeltaState,
};
pub use kda::{kda_scan, kda_scan_batch, kda_scan_state, KdaDims, KdaInputs, KdaSeq, KdaState};
