//! Recurrent-state buffers that come back to a pool when their last holder
//! drops them.
//!
//! A sequence's state, its checkpoints, a fork's shared state, a server's
//! pinned checkpoints and a verification's base state are all
//! `Arc<StateBuf>`s of one [`StatePool`]. Whoever drops the last reference —
//! thinning, a rollback, a cleared or forked slot, a pin released outside
//! the memory — the buffer goes back to the pool's free list (up to its
//! cap), and the next state to move takes it from there: resident pages
//! instead of fresh ones. Zeroing fresh pages is expensive in a VM (on the
//! 2-core host of 2026-12-02, 13% of a server's CPU time during its first
//! 8 × 240-token load at `--parallel 16`, when buffers dropped outside the
//! memory's own bookkeeping went back to the system).

use coil_kernels::hugepages;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

struct Shared {
    /// f32 words of one buffer.
    words: usize,
    /// Most buffers kept on the free list (the rest go back to the system).
    cap: AtomicUsize,
    free: Mutex<Vec<Vec<f32>>>,
    /// Buffers allocated because the free list was empty (not counting
    /// [`StatePool::reserve`]).
    fresh: AtomicUsize,
    /// Buffers added by [`StatePool::reserve`].
    reserved: AtomicUsize,
}

/// The free list of one memory's state buffers (cheap to clone: shared).
#[derive(Clone)]
pub struct StatePool {
    shared: Arc<Shared>,
}

impl StatePool {
    /// An empty pool of buffers of `words` f32 words each.
    pub fn new(words: usize) -> Self {
        StatePool {
            shared: Arc::new(Shared {
                words,
                cap: AtomicUsize::new(0),
                free: Mutex::new(Vec::new()),
                fresh: AtomicUsize::new(0),
                reserved: AtomicUsize::new(0),
            }),
        }
    }

    fn free(&self) -> MutexGuard<'_, Vec<Vec<f32>>> {
        // A panic while holding the lock leaves a list of plain buffers:
        // still valid.
        self.shared.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets how many free buffers the pool keeps (dropping any beyond).
    pub fn set_cap(&self, cap: usize) {
        self.shared.cap.store(cap, Ordering::Relaxed);
        self.free().truncate(cap);
    }

    pub fn cap(&self) -> usize {
        self.shared.cap.load(Ordering::Relaxed)
    }

    /// Buffers allocated so far because none was free (the startup
    /// reserve not counted): fresh memory mapped while serving.
    pub fn fresh(&self) -> usize {
        self.shared.fresh.load(Ordering::Relaxed)
    }

    /// Buffers added by [`StatePool::reserve`] so far.
    pub fn reserved(&self) -> usize {
        self.shared.reserved.load(Ordering::Relaxed)
    }

    /// Free buffers held now.
    pub fn len(&self) -> usize {
        self.free().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds resident buffers (written once, so their pages are mapped) until
    /// `n` are free or the cap is reached; returns how many were added.
    pub fn reserve(&self, n: usize) -> usize {
        let want = n.min(self.cap()).saturating_sub(self.len());
        for _ in 0..want {
            // `vec!` of zeros maps untouched pages: fill to fault them in
            // (huge pages where the system gives them: a fault per 2 MiB).
            let mut b = hugepages::filled(self.shared.words, 0f32);
            std::hint::black_box(&mut b);
            self.put(b);
        }
        self.shared.reserved.fetch_add(want, Ordering::Relaxed);
        want
    }

    fn put(&self, v: Vec<f32>) {
        if v.len() != self.shared.words {
            return;
        }
        let mut free = self.free();
        if free.len() < self.cap() {
            free.push(v);
        }
    }

    /// A buffer of the pool, its contents unspecified: a free one (the one
    /// given back last) or, when none is, a fresh one.
    pub fn take(&self) -> StateBuf {
        let data = self.free().pop().unwrap_or_else(|| {
            self.shared.fresh.fetch_add(1, Ordering::Relaxed);
            hugepages::filled(self.shared.words, 0.0)
        });
        self.wrap(data)
    }

    /// A buffer of zeros, written now (a fresh `vec!` of zeros would map
    /// the zero page, and the first pass would take a write fault per page).
    pub fn zeroed(&self) -> StateBuf {
        let mut data = self.free().pop().unwrap_or_else(|| {
            self.shared.fresh.fetch_add(1, Ordering::Relaxed);
            let mut v = Vec::new();
            hugepages::reserve(&mut v, self.shared.words);
            v
        });
        data.clear();
        data.resize(self.shared.words, 0.0);
        self.wrap(data)
    }

    /// A copy of `src` in a buffer of the pool.
    pub fn copy_of(&self, src: &[f32]) -> StateBuf {
        let mut b = self.take();
        b.copy_from_slice(src);
        b
    }

    /// Makes `data` a buffer of this pool (it comes back here when dropped,
    /// if it has the pool's size).
    pub fn wrap(&self, data: Vec<f32>) -> StateBuf {
        StateBuf {
            data,
            pool: Some(self.clone()),
        }
    }

    /// Where the free buffers' data lie (tests).
    #[cfg(test)]
    pub(crate) fn free_ptrs(&self) -> Vec<*const f32> {
        self.free().iter().map(|b| b.as_ptr()).collect()
    }

    /// Fills every free buffer with `v` (tests).
    #[cfg(test)]
    pub(crate) fn fill_free(&self, v: f32) {
        self.free().iter_mut().for_each(|b| b.fill(v));
    }

    /// Whether `b` returns to this pool (tests).
    #[cfg(test)]
    pub(crate) fn owns(&self, b: &StateBuf) -> bool {
        b.pool
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(&p.shared, &self.shared))
    }
}

/// One state buffer (f32 words); given back to its pool when dropped.
pub struct StateBuf {
    data: Vec<f32>,
    pool: Option<StatePool>,
}

impl StateBuf {
    /// A buffer of no pool (freed to the system when dropped).
    pub fn detached(data: Vec<f32>) -> Self {
        StateBuf { data, pool: None }
    }
}

impl Deref for StateBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.data
    }
}

impl DerefMut for StateBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }
}

impl Clone for StateBuf {
    /// A copy in another buffer of the same pool.
    fn clone(&self) -> Self {
        match &self.pool {
            Some(p) => p.copy_of(&self.data),
            None => StateBuf::detached(self.data.clone()),
        }
    }
}

impl Drop for StateBuf {
    fn drop(&mut self) {
        if let Some(p) = &self.pool {
            p.put(std::mem::take(&mut self.data));
        }
    }
}

impl std::fmt::Debug for StateBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StateBuf({} words)", self.data.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_buffers_come_back_up_to_the_cap() {
        let pool = StatePool::new(8);
        pool.set_cap(2);
        let (a, b, c) = (pool.take(), pool.take(), pool.take());
        assert_eq!(pool.fresh(), 3);
        let pa = a.as_ptr();
        drop(a);
        assert_eq!(pool.len(), 1);
        drop(b);
        drop(c);
        assert_eq!(pool.len(), 2, "the third is beyond the cap");
        // The last one given back is the first one taken again.
        let d = pool.take();
        assert_ne!(d.as_ptr(), pa);
        assert_eq!(pool.fresh(), 3, "a free buffer is no fresh one");
        drop(d);
        // Shared buffers come back when the last holder drops them.
        let s = Arc::new(pool.zeroed());
        let t = Arc::clone(&s);
        drop(s);
        assert_eq!(pool.len(), 1);
        drop(t);
        assert_eq!(pool.len(), 2);
        pool.set_cap(0);
        assert!(pool.is_empty());
    }

    #[test]
    fn zeroed_and_copies_and_foreign_sizes() {
        let pool = StatePool::new(4);
        pool.set_cap(4);
        let mut a = pool.take();
        a.fill(3.0);
        drop(a);
        assert!(pool.zeroed().iter().all(|&x| x == 0.0));
        let c = pool.copy_of(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(&c[..], &[1.0, 2.0, 3.0, 4.0]);
        assert!(pool.owns(&c.clone()));
        // A buffer of another size never enters the free list.
        let n = pool.len();
        drop(pool.wrap(vec![0.0; 3]));
        assert_eq!(pool.len(), n);
        assert!(!pool.owns(&StateBuf::detached(vec![0.0; 4])));
        let before = pool.len();
        assert_eq!(pool.reserve(10), 4 - before);
        assert_eq!(pool.len(), 4);
    }
}
