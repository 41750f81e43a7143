//! Where a model's weights live: a memory map of the file, or the file read
//! into anonymous memory in transparent huge pages.
//!
//! Decoding streams every weight once per token. Through the page cache's
//! 4 KiB pages that is a TLB miss every 4 KiB; in 2 MiB pages one every
//! 2 MiB. Measured on a 2-core VM (Intel Xeon model 167, 2026-12-03,
//! `coil bench -n 64`, two rounds): decode at the AVX2 level +9–16%
//! (mamba2-370m-like and qwen35-0.8b-like Q4_K_M), +4–8% (lfm2-1.2b-like
//! Q8_0); at AVX-512 0–5%. The price: the weights are this process's own
//! memory (not pages of the page cache that other processes share and the
//! system may evict), read at load (0.5 → 0.7 s for 764 MB from the page
//! cache). So the default takes huge pages only where the system gives
//! them and the file fits well within the memory available; `--mmap`
//! (`WeightMemory::Mapped`) keeps the map.

use coil_gguf::{GgufError, GgufFile};
use coil_kernels::hugepages;
use std::path::Path;

/// Where [`crate::engine::Engine::load`] puts the weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightMemory {
    /// Read into huge pages when [`hugepages::available`] and the file
    /// takes at most 60% (`FIT_FRACTION`) of the memory available; else mapped.
    #[default]
    Auto,
    /// A copy-on-write map of the file, every page mapped at load.
    Mapped,
}

/// The largest share of `MemAvailable` a file read into memory may take.
pub const FIT_FRACTION: f64 = 0.6;

/// Whether `Auto` reads a file of `bytes` into memory.
fn read_into_memory(bytes: u64) -> bool {
    hugepages::available()
        && hugepages::mem_available().is_some_and(|m| bytes as f64 <= m as f64 * FIT_FRACTION)
}

/// Opens `path` (a file, or any part of a split model) for inference as
/// `mode` says.
pub fn open(path: &Path, mode: WeightMemory) -> Result<GgufFile, GgufError> {
    let bytes = GgufFile::model_files(path)?
        .iter()
        .map(|p| std::fs::metadata(p).map_or(u64::MAX, |m| m.len()))
        .fold(0u64, u64::saturating_add);
    match mode {
        WeightMemory::Auto if read_into_memory(bytes) => GgufFile::open_in_huge_pages(path),
        _ => GgufFile::open_prefaulted_private(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_beyond_the_available_memory_stay_mapped() {
        assert!(!read_into_memory(u64::MAX));
        if let Some(m) = hugepages::mem_available() {
            assert!(!read_into_memory(m));
        }
    }
}
