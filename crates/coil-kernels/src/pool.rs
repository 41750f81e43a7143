//! A persistent thread pool for data-parallel kernels.
//!
//! Threads are spawned once, in [`ThreadPool::new`]. A parallel call posts one
//! job (a closure over a range of work items); the calling thread works on it
//! too, and work is handed out in chunks from an atomic counter, so a thread
//! that the OS delays (another process on the same cores) simply takes fewer
//! chunks. A worker that wakes up after the caller has finished every chunk
//! never joins that job, so the caller does not wait for descheduled workers.
//!
//! Waiting threads spin briefly (bounded by time, with `yield_now`) and then
//! park on a condition variable: pools that only spin collapse when the cores
//! are oversubscribed.

use std::cell::{Cell, UnsafeCell};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle thread spins before it sleeps on a condition variable.
const SPIN_WAIT: Duration = Duration::from_micros(100);

/// Job state word: epoch in the high 32 bits, `CLOSED` flag, joined-worker count.
const CLOSED: u64 = 1 << 31;
const COUNT_MASK: u64 = CLOSED - 1;

type JobFn = dyn Fn(usize) + Sync;

struct Shared {
    /// Pointer to the current job; written by the caller before it publishes
    /// a new epoch in `state`, read by workers after they joined that epoch.
    job: UnsafeCell<Option<*const JobFn>>,
    state: AtomicU64,
    sleepers: AtomicUsize,
    wake_lock: Mutex<()>,
    wake: Condvar,
    caller_sleeping: AtomicBool,
    done_lock: Mutex<()>,
    done: Condvar,
    panicked: AtomicBool,
    shutdown: AtomicBool,
}

// SAFETY: `job` is only written by the (single, lock-holding) caller while no
// worker has joined the current epoch, and only read by joined workers.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

thread_local! {
    /// Set while this thread runs a pool job: nested parallel calls run inline.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// A fixed set of worker threads plus the calling thread.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    n_threads: usize,
    call_lock: Mutex<()>,
    /// See [`Self::set_single_stream`].
    single_stream: AtomicBool,
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all, counting the caller (so
    /// `n_threads - 1` workers are spawned). `0` means [`Self::default_threads`].
    pub fn new(n_threads: usize) -> Self {
        let n_threads = if n_threads == 0 {
            Self::default_threads()
        } else {
            n_threads
        };
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            state: AtomicU64::new(CLOSED),
            sleepers: AtomicUsize::new(0),
            wake_lock: Mutex::new(()),
            wake: Condvar::new(),
            caller_sleeping: AtomicBool::new(false),
            done_lock: Mutex::new(()),
            done: Condvar::new(),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
        });
        let mut workers = Vec::with_capacity(n_threads.saturating_sub(1));
        for tid in 1..n_threads {
            let shared = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("coil-worker-{tid}"))
                .spawn(move || worker_loop(&shared, tid));
            match handle {
                Ok(h) => workers.push(h),
                Err(_) => break, // run with the threads we could get
            }
        }
        let n_threads = workers.len() + 1;
        ThreadPool {
            shared,
            workers,
            n_threads,
            call_lock: Mutex::new(()),
            single_stream: AtomicBool::new(false),
        }
    }

    /// Whether this pool runs one sequence at a time (single-stream decode,
    /// memory-bound: `coil run` with or without `--spec`, `coil chat`,
    /// `coil bench` without `--parallel` N > 1) or
    /// several (the default: sequences decoding together, compute-bound),
    /// for the products whose fastest kernel differs between the two: F16 /
    /// BF16 for 1 to 15 tokens at the AVX-512 level take the AVX2 level's
    /// 256-bit kernels (faster on Intel cores that slow their clock under
    /// 512-bit float work), and Q8_0 at the AVX2 level its row-at-a-time
    /// kernels instead of the rows-in-lanes ones (faster for one token on an
    /// AMD Zen 3, slower for several). One choice per pool, so every path of
    /// an engine (one token, several, batch-invariant) gets the same bits.
    /// See `matmul::matmul_at`.
    pub fn set_single_stream(&self, single: bool) {
        self.single_stream.store(single, Ordering::Relaxed);
    }

    /// What [`Self::set_single_stream`] set.
    pub fn single_stream(&self) -> bool {
        self.single_stream.load(Ordering::Relaxed)
    }

    /// A pool with a single thread (the caller); no workers.
    pub fn single() -> Self {
        Self::new(1)
    }

    /// Threads that take part in a parallel call, counting the caller.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Number of physical cores available to this process (hyper-threads of
    /// one core count once), at least 1.
    pub fn default_threads() -> usize {
        let logical = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        physical_cores().map_or(logical, |p| p.clamp(1, logical))
    }

    /// Calls `f(chunk, tid)` for consecutive chunks of `0..n` of at most
    /// `grain` items, spread over the pool's threads; returns when all of
    /// `0..n` is done. `tid < n_threads()` identifies the executing thread
    /// (0 = caller); no two concurrent calls of `f` share a `tid`.
    ///
    /// Nested calls (from inside `f`) and calls while another thread uses the
    /// pool run on the calling thread alone.
    pub fn parallel_for<F>(&self, n: usize, grain: usize, f: F)
    where
        F: Fn(Range<usize>, usize) + Sync,
    {
        let grain = grain.max(1);
        if n == 0 {
            return;
        }
        let serial = |f: &F| {
            let mut s = 0;
            while s < n {
                let e = (s + grain).min(n);
                f(s..e, 0);
                s = e;
            }
        };
        if self.n_threads == 1 || n <= grain || IN_JOB.with(|c| c.get()) {
            return serial(&f);
        }
        let _guard = match self.call_lock.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return serial(&f),
        };
        let next = AtomicUsize::new(0);
        // the caller's SIMD cap (tests), on whichever thread runs a chunk
        let cap = crate::simd::scoped_cap();
        let body = |tid: usize| {
            let _cap = cap.map(|c| crate::simd::level_scope(Some(c)));
            loop {
                let s = next.fetch_add(grain, Ordering::Relaxed);
                if s >= n {
                    break;
                }
                f(s..(s + grain).min(n), tid);
            }
        };
        self.run_job(&body);
    }

    /// Splits `data` into rows of `row` elements and calls `f(first_row,
    /// rows)` on consecutive groups of at most `grain` rows in parallel:
    /// element-wise work over `[n_rows, row]` buffers (norms, activations,
    /// residual adds). `data.len()` must be a multiple of `row`.
    pub fn rows_mut<T, F>(&self, data: &mut [T], row: usize, grain: usize, f: F)
    where
        T: Send,
        F: Fn(usize, &mut [T]) + Sync,
    {
        if row == 0 || data.is_empty() {
            return;
        }
        assert!(data.len().is_multiple_of(row), "rows_mut: ragged rows");
        let n = data.len() / row;
        let base = SendPtr(data.as_mut_ptr());
        self.parallel_for(n, grain, |r, _| {
            // SAFETY: parallel_for hands out disjoint row ranges within 0..n,
            // so each call gets its own part of `data`.
            let part = unsafe {
                std::slice::from_raw_parts_mut(base.get().add(r.start * row), r.len() * row)
            };
            f(r.start, part);
        });
    }

    /// Posts `job` to the workers, runs it on this thread with tid 0, then
    /// closes it and waits for the workers that joined.
    fn run_job(&self, job: &(dyn Fn(usize) + Sync)) {
        let sh = &*self.shared;
        // SAFETY: the job outlives its use: we do not return before every
        // worker that joined this epoch has finished (count back to 0).
        let ptr: *const JobFn =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static JobFn>(job) };
        let prev = sh.state.load(Ordering::Acquire);
        debug_assert!(prev & CLOSED != 0 && prev & COUNT_MASK == 0);
        unsafe { *sh.job.get() = Some(ptr) };
        let epoch = (prev >> 32).wrapping_add(1) & 0xffff_ffff;
        sh.state.store(epoch << 32, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            drop(lock(&sh.wake_lock));
            sh.wake.notify_all();
        }

        struct Finish<'a>(&'a Shared);
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                let sh = self.0;
                sh.state.fetch_or(CLOSED, Ordering::SeqCst);
                wait_until(
                    || sh.state.load(Ordering::SeqCst) & COUNT_MASK == 0,
                    &sh.caller_sleeping,
                    &sh.done_lock,
                    &sh.done,
                );
                unsafe { *sh.job.get() = None };
            }
        }
        {
            let _finish = Finish(sh);
            IN_JOB.with(|c| c.set(true));
            let r = catch_unwind(AssertUnwindSafe(|| job(0)));
            IN_JOB.with(|c| c.set(false));
            if let Err(p) = r {
                drop(_finish);
                sh.panicked.store(false, Ordering::SeqCst);
                std::panic::resume_unwind(p);
            }
        }
        if sh.panicked.swap(false, Ordering::SeqCst) {
            panic!("a coil thread-pool worker panicked");
        }
    }
}

impl Default for ThreadPool {
    fn default() -> Self {
        Self::new(0)
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        drop(lock(&self.shared.wake_lock));
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads)
            .finish()
    }
}

fn lock(m: &Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Spin (bounded by time) until `ready()`, then sleep on `cv` with `flag` set
/// so that the thread making `ready()` true knows to notify.
fn wait_until(ready: impl Fn() -> bool, flag: &AtomicBool, m: &Mutex<()>, cv: &Condvar) {
    let start = Instant::now();
    let mut i = 0u32;
    loop {
        if ready() {
            return;
        }
        i = i.wrapping_add(1);
        if i.is_multiple_of(64) {
            if start.elapsed() > SPIN_WAIT {
                break;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    let mut g = lock(m);
    flag.store(true, Ordering::SeqCst);
    while !ready() {
        g = match cv.wait_timeout(g, Duration::from_millis(5)) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        };
    }
    flag.store(false, Ordering::SeqCst);
}

fn worker_loop(sh: &Shared, tid: usize) {
    let mut seen_epoch = 0u64; // epoch 0 is the initial closed state
    loop {
        // Wait for a new, open epoch.
        let is_new = |s: u64| (s >> 32) != seen_epoch && s & CLOSED == 0;
        let start = Instant::now();
        let mut i = 0u32;
        let mut s;
        loop {
            if sh.shutdown.load(Ordering::Relaxed) {
                return;
            }
            s = sh.state.load(Ordering::Acquire);
            if is_new(s) {
                break;
            }
            i = i.wrapping_add(1);
            if i.is_multiple_of(64) {
                if start.elapsed() > SPIN_WAIT {
                    let mut g = lock(&sh.wake_lock);
                    sh.sleepers.fetch_add(1, Ordering::SeqCst);
                    loop {
                        s = sh.state.load(Ordering::SeqCst);
                        if is_new(s) || sh.shutdown.load(Ordering::SeqCst) {
                            break;
                        }
                        g = match sh.wake.wait(g) {
                            Ok(g) => g,
                            Err(p) => p.into_inner(),
                        };
                    }
                    sh.sleepers.fetch_sub(1, Ordering::SeqCst);
                    if sh.shutdown.load(Ordering::SeqCst) {
                        return;
                    }
                    break;
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        // Join the epoch unless the caller already closed it.
        loop {
            if s & CLOSED != 0 {
                break;
            }
            match sh
                .state
                .compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    // SAFETY: joined an open epoch; the caller keeps the job
                    // alive until our count is released below.
                    let job = unsafe { *sh.job.get() };
                    if let Some(job) = job {
                        IN_JOB.with(|c| c.set(true));
                        let r = catch_unwind(AssertUnwindSafe(|| unsafe { (*job)(tid) }));
                        IN_JOB.with(|c| c.set(false));
                        if r.is_err() {
                            sh.panicked.store(true, Ordering::SeqCst);
                        }
                    }
                    let after = sh.state.fetch_sub(1, Ordering::SeqCst) - 1;
                    if after & COUNT_MASK == 0 && sh.caller_sleeping.load(Ordering::SeqCst) {
                        drop(lock(&sh.done_lock));
                        sh.done.notify_all();
                    }
                    break;
                }
                Err(cur) => {
                    if (cur >> 32) != (s >> 32) {
                        break; // a newer epoch: handle it in the next round
                    }
                    s = cur;
                }
            }
        }
        seen_epoch = s >> 32;
    }
}

/// Physical cores from Linux sysfs topology (unique core_id per package).
fn physical_cores() -> Option<usize> {
    let affinity = std::thread::available_parallelism().ok()?.get();
    let mut cores = std::collections::HashSet::new();
    let dir = std::fs::read_dir("/sys/devices/system/cpu").ok()?;
    for entry in dir.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Some(num) = name.strip_prefix("cpu") else {
            continue;
        };
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let topo = entry.path().join("topology");
        let core = std::fs::read_to_string(topo.join("core_id")).ok()?;
        let pkg = std::fs::read_to_string(topo.join("physical_package_id")).unwrap_or_default();
        cores.insert((pkg.trim().to_string(), core.trim().to_string()));
    }
    if cores.is_empty() {
        return None;
    }
    Some(cores.len().min(affinity))
}

/// A raw pointer that may cross into pool jobs (writes go to disjoint parts).
pub(crate) struct SendPtr<T>(pub *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the whole wrapper).
    #[inline(always)]
    pub fn get(self) -> *mut T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread's SIMD cap (`simd::level_scope`) holds in the pool jobs it
    /// starts, on every worker, and nowhere else.
    #[test]
    fn a_scoped_simd_cap_reaches_the_workers_only_for_its_jobs() {
        use crate::simd::{detected_level, level, level_scope, SimdLevel};
        let pool = ThreadPool::new(2);
        let seen = |pool: &ThreadPool| {
            let levels = std::sync::Mutex::new(Vec::new());
            pool.parallel_for(64, 1, |_, _| {
                std::thread::sleep(std::time::Duration::from_micros(200));
                levels.lock().unwrap().push(level());
            });
            levels.into_inner().unwrap()
        };
        {
            let _cap = level_scope(Some(SimdLevel::Scalar));
            assert_eq!(level(), SimdLevel::Scalar);
            let other = std::thread::spawn(level).join().unwrap();
            assert_eq!(other, detected_level(), "another thread keeps its level");
            assert!(seen(&pool).iter().all(|&l| l == SimdLevel::Scalar));
        }
        assert_eq!(level(), detected_level());
        assert!(seen(&pool).iter().all(|&l| l == detected_level()));
    }

    #[test]
    fn covers_every_item_once() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for n in [0usize, 1, 5, 17, 1000] {
                for grain in [1usize, 3, 64] {
                    let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                    pool.parallel_for(n, grain, |r, tid| {
                        assert!(tid < pool.n_threads());
                        for i in r {
                            hits[i].fetch_add(1, Ordering::Relaxed);
                        }
                    });
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                }
            }
        }
    }

    #[test]
    fn many_calls_and_sleeping_workers() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        for i in 0..2000u32 {
            pool.parallel_for(64, 4, |r, _| {
                total.fetch_add(r.len(), Ordering::Relaxed);
            });
            if i.is_multiple_of(500) {
                std::thread::sleep(Duration::from_millis(2)); // let workers park
            }
        }
        assert_eq!(total.load(Ordering::Relaxed), 2000 * 64);
    }

    #[test]
    fn nested_calls_run_inline() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        pool.parallel_for(8, 1, |_, _| {
            pool.parallel_for(10, 2, |r, _| {
                total.fetch_add(r.len(), Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 80);
    }

    #[test]
    fn worker_panic_propagates() {
        let pool = ThreadPool::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.parallel_for(1000, 1, |r, _| {
                if r.start == 999 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        // the pool still works afterwards
        let total = AtomicUsize::new(0);
        pool.parallel_for(100, 1, |r, _| {
            total.fetch_add(r.len(), Ordering::Relaxed);
        });
        assert_eq!(total.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn default_threads_positive() {
        assert!(ThreadPool::default_threads() >= 1);
    }

    #[test]
    fn rows_mut_covers_every_row_once() {
        let pool = ThreadPool::new(2);
        let mut v = vec![0u32; 7 * 300];
        pool.rows_mut(&mut v, 7, 16, |r0, rows| {
            for (i, row) in rows.chunks_exact_mut(7).enumerate() {
                row.iter_mut().for_each(|x| *x += (r0 + i) as u32 + 1);
            }
        });
        for (r, row) in v.chunks_exact(7).enumerate() {
            assert!(row.iter().all(|&x| x == r as u32 + 1));
        }
    }
}
