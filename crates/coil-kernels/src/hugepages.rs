//! Transparent huge pages for the large buffers (recurrent states and their
//! checkpoints, packed panels, work buffers), asked for with
//! `madvise(MADV_HUGEPAGE)` before their pages are first touched.
//!
//! Most Linux distributions set transparent huge pages to `madvise`: a
//! program gets 2 MiB pages only where it asks. Without them every 4 KiB
//! of a fresh buffer is a page fault, and in a virtual machine a fault
//! is expensive: on the 2-core VM of 2026-12-03 `coil serve --parallel
//! 16` wrote its 5.5 GB of checkpoint buffers in 14 s of CPU time with
//! 4 KiB pages and in under 2 s with 2 MiB ones. Decoding reads and writes
//! the states every token, so fewer TLB misses help there too.
//!
//! `COIL_HUGEPAGES=0` in the environment turns the advice off (for
//! comparison); elsewhere than Linux it does nothing. The kernel may still
//! refuse (`transparent_hugepage` set to `never`, no free 2 MiB frames):
//! the buffer then simply has small pages.

/// Buffers smaller than this are left alone (a huge page would be more
/// than their size, or only part of one would fit).
pub const MIN_BYTES: usize = 4 << 20;

/// Huge page size on x86-64 and most aarch64 Linux systems.
#[cfg(target_os = "linux")]
const HUGE: usize = 2 << 20;

/// Whether the advice is given (`COIL_HUGEPAGES` is not `0`).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("COIL_HUGEPAGES").map_or(true, |v| v.trim() != "0"))
}

/// Whether advice would be taken: [`enabled`], on Linux, with transparent
/// huge pages set to `always` or `madvise` (not `never`).
pub fn available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        enabled()
            && cfg!(target_os = "linux")
            && std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
                .is_ok_and(|m| m.contains("[always]") || m.contains("[madvise]"))
    })
}

/// The memory the system could give without swapping (`MemAvailable` of
/// `/proc/meminfo`), in bytes; `None` where it is not known.
pub fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Asks for huge pages on the 2 MiB-aligned part of `bytes` bytes at `ptr`,
/// memory this process owns (from the allocator, not yet touched for the
/// advice to take effect at the first write). Ignores failures: the pages
/// stay small.
pub fn advise(ptr: *const u8, bytes: usize) {
    if bytes < MIN_BYTES || !enabled() {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + bytes) / HUGE * HUGE;
        if end > start {
            // SAFETY: `start..end` lies within memory the caller owns;
            // MADV_HUGEPAGE changes how it is backed, not its contents.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = ptr;
}

/// Makes room for `additional` more values in `v`, advising huge pages on
/// the room (when it is large) before anything is written there.
pub fn reserve<T>(v: &mut Vec<T>, additional: usize) {
    v.reserve(additional);
    let spare = v.spare_capacity_mut();
    advise(spare.as_ptr() as *const u8, std::mem::size_of_val(spare));
}

/// A vector of `n` copies of `x`, its memory advised for huge pages before
/// it is written (a large `vec![0.0; n]` maps untouched zero pages instead,
/// faulted in 4 KiB at a time by whatever writes them first).
pub fn filled<T: Clone>(n: usize, x: T) -> Vec<T> {
    let mut v = Vec::new();
    reserve(&mut v, n);
    v.resize(n, x);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_buffers_hold_their_values() {
        for n in [0, 1, 1000, (MIN_BYTES / 4) + 12_345] {
            let v = filled(n, 1.5f32);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&x| x == 1.5));
        }
        let mut v = vec![1u8, 2, 3];
        reserve(&mut v, 3 * MIN_BYTES);
        assert!(v.capacity() >= 3 * MIN_BYTES + 3);
        assert_eq!(v, [1, 2, 3]);
        // odd pointers and sizes are no business of the caller's
        advise(v.as_ptr().wrapping_add(1), 3 * MIN_BYTES - 1);
        assert_eq!(v, [1, 2, 3]);
    }
}
