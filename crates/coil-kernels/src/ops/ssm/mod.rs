//! The Mamba selective-scan family (Mamba-1, Mamba-2): one file per way of
//! running the same recurrence, the state's storage type (f32, bf16) a
//! type parameter ([`ScanState`]) and the sequences of a batch a parameter
//! of the one scan.
//!
//! * `dims.rs`: [`Mamba2Dims`], [`ScanInputs`] (x, B, C read in place)
//! * `scan.rs`: token by token, the reference every other file equals bit
//!   for bit: [`mamba2_scan_from`], [`mamba1_scan`] and their wrappers; one
//!   head loop for both state types ([`ScanState`] says how a row is read
//!   and stored)
//! * `bf16.rs`: the Mamba-2 row update on a bf16 state in registers
//!   (widened, updated, rounded; AVX2 / AVX-512)
//! * `tokens.rs`: several tokens of one head with a state row in registers
//! * `moving.rs`: one token while the state moves to a new buffer (streamed)
//! * `batch.rs`: many sequences' (sequence, head) pairs in one pool call
//! * `ssd.rs`: the chunked (state-space duality) form for prompts

pub mod batch;
pub(crate) mod bf16;
pub mod dims;
mod moving;
pub mod scan;
pub mod ssd;
#[cfg(target_arch = "x86_64")]
mod tokens;

pub use batch::{mamba2_scan_batch, Mamba2Seq};
pub use dims::{Mamba2Dims, ScanInputs};
pub use scan::{
    mamba1_scan, mamba1_scan_state, mamba2_scan, mamba2_scan_from, mamba2_scan_from_state,
    ScanState,
};
pub use ssd::mamba2_chunked_scan;
