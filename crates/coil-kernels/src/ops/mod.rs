//! Element-wise and small ops on f32 slices. Shapes are row-major; a
//! "row" is the innermost dimension. Length mismatches are programmer errors
//! and panic at entry.

pub mod act;
pub mod attention;
pub mod conv;
pub mod delta;
pub mod norm;
pub mod rope;
pub mod softmax;
pub mod ssm;
pub mod state_elem;
mod state_rows;
pub mod topk;

pub use act::*;
pub use attention::{attention, KvData, KvView, KV_PAGE_ALIGN};
pub use conv::{conv1d_causal_pool, ConvAct};
pub use norm::{group_rms_norm_gated, rms_norm, rms_norm_inplace};
pub use rope::{rope, rope_table, RopeStyle};
pub use ssm::{mamba1_scan, mamba2_chunked_scan, mamba2_scan, Mamba2Dims};
pub use state_elem::{StateMut, StateRef, StateType};
pub use topk::{top_k, top_k_into};

#[cfg(test)]
mod level_tests {
    use crate::simd::{available_levels, level_scope};

    /// The vectorized ops (compiled per SIMD level) at every level the CPU
    /// has, including the portable one. (Matmul tests pick levels
    /// explicitly, so the process-wide cap does not disturb them.)
    #[test]
    fn ops_at_every_level() {
        for level in available_levels() {
            let _cap = level_scope(Some(level));
            super::ssm::scan::tests::mamba2_matches_naive_and_steps();
            super::ssm::ssd::tests::chunked_matches_sequential();
            super::ssm::scan::tests::mamba1_matches_naive();
            super::ssm::scan::tests::mamba2_bf16_is_the_f32_update_rounded_per_token();
            super::ssm::scan::tests::mamba1_bf16_is_the_f32_update_rounded_per_token();
            super::attention::tests::matches_naive_softmax();
            super::attention::tests::invariant_mode_queries_equal_single_query_calls();
            super::softmax::tests::sums_match_libm();
            super::delta::kda::tests::scan_matches_naive_and_steps();
            super::delta::kda::tests::bf16_is_the_f32_update_rounded_per_token();
            super::delta::kda_chunk::tests::chunked_matches_recurrence();
        }
    }
}
