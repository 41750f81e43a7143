//! The process's allocator: the system's, with every allocation of a few
//! KB or more starting on a cache line.
//!
//! glibc hands out blocks 16 bytes into a line (and `mmap`ed ones 16 bytes
//! past a page), so every 64-byte load or store of an AVX-512 kernel that
//! walks such a buffer from its start — the recurrent states a decode step
//! reads and rewrites, attention's cells, a prompt's activations — touches
//! two lines instead of one.

use std::alloc::{GlobalAlloc, Layout, System};

/// Sizes from which blocks are line-aligned.
const BIG: usize = 4096;
const LINE: usize = 64;

pub struct LineAligned;

fn adjusted(l: Layout) -> Layout {
    if l.size() >= BIG && l.align() < LINE {
        // SAFETY: LINE is a power of two and the size does not overflow
        // isize once rounded to it (the caller's size is at most isize::MAX
        // rounded to its alignment; a few bytes more would not fit anyway).
        Layout::from_size_align(l.size(), LINE).unwrap_or(l)
    } else {
        l
    }
}

// SAFETY: forwards to `System` with a layout that only differs in a larger
// alignment, the same one for a block's allocation, growth and release (it
// depends on the size only, and `realloc` re-derives it for the new size).
unsafe impl GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        System.alloc(adjusted(l))
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        System.alloc_zeroed(adjusted(l))
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, adjusted(l))
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        let (old, new) = (
            adjusted(l),
            adjusted(Layout::from_size_align_unchecked(new_size, l.align())),
        );
        if old.align() == new.align() {
            return System.realloc(p, old, new_size);
        }
        // crossing BIG: a new block, the bytes copied
        let q = System.alloc(new);
        if !q.is_null() {
            std::ptr::copy_nonoverlapping(p, q, l.size().min(new_size));
            System.dealloc(p, old);
        }
        q
    }
}

#[cfg(test)]
mod tests {
    /// This binary's allocator (main.rs installs it for its tests too).
    #[test]
    fn big_blocks_on_lines_and_growth_keeps_bytes() {
        let mut v: Vec<u8> = (0..100u8).collect();
        // grows across BIG (a new aligned block) and far past it (mmap)
        for n in [5000, 300_000, 5_000_000] {
            v.resize(n, 1);
            assert_eq!(v.as_ptr() as usize % super::LINE, 0, "{n} bytes");
            assert!(v[..100].iter().enumerate().all(|(i, &b)| b == i as u8));
        }
        v.truncate(10);
        v.shrink_to_fit(); // back under BIG
        assert_eq!(v, (0..10u8).collect::<Vec<_>>());
        let z = vec![0f32; 1 << 20];
        assert_eq!(
            (z.as_ptr() as usize % super::LINE, z.iter().sum::<f32>()),
            (0, 0.0)
        );
    }
}
