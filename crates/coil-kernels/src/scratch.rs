//! Reusable f32 work buffers for a forward pass.
//!
//! A prompt's micro-batch needs a dozen buffers of several MB per layer
//! (`[n_tokens, d_in_proj]` and friends). Allocated afresh each time, glibc
//! serves them with `mmap` and returns them with `munmap`, so every layer
//! pays page faults on first touch (measured on mamba2-370m, 512-token
//! prompt: ~15% of the time in the kernel's fault and unmap paths). Buffers
//! taken here come from a per-thread free list and go back to it on drop.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Buffers kept per thread; more are freed on return.
const MAX_FREE: usize = 32;

thread_local! {
    static FREE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of `len` f32 that returns to its thread's free list on drop.
pub struct Scratch {
    /// Every value written at least once: a buffer reused for fewer values
    /// keeps its length, so that growing it back to an earlier length needs
    /// no zeroing (`memset` of reused buffers was 1% of a prompt's time).
    v: Vec<f32>,
    /// Values in use: `v[..len]`.
    len: usize,
}

impl Scratch {
    /// `len` zeros.
    pub fn zeroed(len: usize) -> Scratch {
        let mut s = Scratch::dirty(len);
        s.fill(0.0);
        s
    }

    /// `len` values left from an earlier use: for buffers the caller
    /// overwrites completely (a matmul output, a copy target).
    pub fn dirty(len: usize) -> Scratch {
        let mut v = FREE
            .with(|f| {
                let mut f = f.borrow_mut();
                // The smallest buffer that fits, else the largest (grown).
                let fit = (0..f.len())
                    .filter(|&i| f[i].capacity() >= len)
                    .min_by_key(|&i| f[i].capacity());
                let pick = fit.or_else(|| (0..f.len()).max_by_key(|&i| f[i].capacity()));
                pick.map(|i| f.swap_remove(i))
            })
            .unwrap_or_default();
        if v.len() < len {
            v.resize(len, 0.0);
        }
        Scratch { v, len }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.v);
        if v.capacity() == 0 {
            return;
        }
        // Threads being torn down drop their list; then the buffer is freed.
        let _ = FREE.try_with(|f| {
            let mut f = f.borrow_mut();
            if f.len() < MAX_FREE {
                f.push(v);
            } else if let Some(i) = (0..f.len()).min_by_key(|&i| f[i].capacity()) {
                if f[i].capacity() < v.capacity() {
                    f[i] = v;
                }
            }
        });
    }
}

impl Deref for Scratch {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.v[..self.len]
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.v[..self.len]
    }
}

impl<'a> IntoIterator for &'a Scratch {
    type Item = &'a f32;
    type IntoIter = std::slice::Iter<'a, f32>;
    fn into_iter(self) -> Self::IntoIter {
        self.v[..self.len].iter()
    }
}

impl<'a> IntoIterator for &'a mut Scratch {
    type Item = &'a mut f32;
    type IntoIter = std::slice::IterMut<'a, f32>;
    fn into_iter(self) -> Self::IntoIter {
        self.v[..self.len].iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_and_zeroes() {
        let p = {
            let mut a = Scratch::zeroed(1000);
            a.iter_mut().for_each(|v| *v = 7.0);
            a.as_ptr()
        };
        let b = Scratch::zeroed(800);
        assert_eq!(b.len(), 800);
        assert!(b.iter().all(|&v| v == 0.0));
        assert_eq!(b.as_ptr(), p, "the returned buffer is reused");
        let c = Scratch::dirty(2000);
        assert_eq!(c.len(), 2000);
        assert_ne!(c.as_ptr(), b.as_ptr());
    }
}
