//! Prefill GEMM efficiency against the FMA peak, in CPU time (not a test).
//!
//!     [REPS=n] cargo bench -p coil-kernels --bench gemm_cpu [-- FORMAT... [TOKENS ROWS COLS]]
//!
//! One thread. Both the f32 FMA peak (register-only FMAs) and the GEMM are
//! timed by the CPU time this thread got (`CLOCK_THREAD_CPUTIME_ID`),
//! not wall time, so the ratio holds on a machine shared with other jobs
//! (time the thread spends descheduled is not counted). What sharing still
//! costs — caches refilled after another job ran — lowers the ratio a little.

use coil_gguf::GgmlType;
use coil_kernels::testutil::{random_weights, Rng};
use coil_kernels::{matmul, simd, ThreadPool, WeightRef};
use std::hint::black_box;

/// Nanoseconds of CPU time this thread has used (`CLOCK_THREAD_CPUTIME_ID`).
#[cfg(target_os = "linux")]
fn cpu_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clk: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes one timespec (libc's, 64-bit Linux layout).
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.sec as u64 * 1_000_000_000 + ts.nsec as u64
}

/// Elsewhere: wall time.
#[cfg(not(target_os = "linux"))]
fn cpu_ns() -> u64 {
    use std::sync::OnceLock;
    static T0: OnceLock<std::time::Instant> = OnceLock::new();
    T0.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64
}

/// Best CPU time of `reps` runs after one warm-up, seconds.
fn best_cpu(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = u64::MAX;
    for _ in 0..reps {
        let t = cpu_ns();
        f();
        best = best.min(cpu_ns() - t);
    }
    best as f64 / 1e9
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_256(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_set1_ps(0.0); 12];
    let a = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(1e-7);
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm256_fmadd_ps(*v, a, b);
        }
    }
    let mut o = [0f32; 8];
    let mut s = _mm256_setzero_ps();
    for v in acc {
        s = _mm256_add_ps(s, v);
    }
    _mm256_storeu_ps(o.as_mut_ptr(), s);
    o.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop_512(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(0.0); 24];
    let a = _mm512_set1_ps(0.999_999);
    let b = _mm512_set1_ps(1e-7);
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm512_fmadd_ps(*v, a, b);
        }
    }
    let mut s = _mm512_setzero_ps();
    for v in acc {
        s = _mm512_add_ps(s, v);
    }
    _mm512_reduce_add_ps(s)
}

/// f32 FMA peak of one thread at the current SIMD level, GFLOP per CPU-second.
fn fma_peak() -> f64 {
    let iters = 20_000_000;
    #[cfg(target_arch = "x86_64")]
    {
        let (per, secs) = match simd::level() {
            // SAFETY: the level says the CPU has the features.
            simd::SimdLevel::Avx512 => (
                24 * 16 * 2,
                best_cpu(3, || {
                    black_box(unsafe { fma_loop_512(black_box(iters)) });
                }),
            ),
            simd::SimdLevel::Avx2 => (
                12 * 8 * 2,
                best_cpu(3, || {
                    black_box(unsafe { fma_loop_256(black_box(iters)) });
                }),
            ),
            simd::SimdLevel::Scalar => return f64::NAN,
        };
        per as f64 * iters as f64 / secs / 1e9
    }
    #[cfg(not(target_arch = "x86_64"))]
    f64::NAN
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let nums: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let mut formats: Vec<GgmlType> = args.iter().filter_map(|a| GgmlType::from_name(a)).collect();
    if formats.is_empty() {
        formats = vec![GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0];
    }
    let (n, rows, cols) = match nums[..] {
        [n, r, c, ..] => (n, r, c),
        _ => (512, 1024, 1024),
    };
    // Best of REPS runs (CPU time): a shared machine's other jobs evict the
    // caches now and then, and the best run is the one they left alone.
    let reps = std::env::var("REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let pool = ThreadPool::new(1);
    let peak = fma_peak();
    println!(
        "gemm_cpu: 1 thread, SIMD level {}, f32 FMA peak {peak:.1} GFLOP per CPU-second",
        simd::level().name()
    );
    println!("{n} tokens x {cols} by {rows} x {cols} (best of {reps}, CPU time):");
    println!(
        "{:>8} {:>10} {:>9} {:>8}",
        "format", "ms", "GFLOP/s", "%peak"
    );
    let mut rng = Rng::new(7);
    let x = rng.vec(n * cols);
    let mut y = vec![0f32; n * rows];
    for ty in formats {
        let data = random_weights(&mut rng, ty, rows, cols);
        let w = WeightRef::new(ty, &data, rows, cols).expect("benchmark shapes are valid");
        let secs = best_cpu(reps, || matmul(&pool, &w, &x, &mut y, n));
        let gf = 2.0 * (n * rows * cols) as f64 / secs / 1e9;
        println!(
            "{:>8} {:>10.2} {:>9.1} {:>7.0}%",
            ty.name(),
            secs * 1e3,
            gf,
            100.0 * gf / peak
        );
        black_box(&y);
    }
}
