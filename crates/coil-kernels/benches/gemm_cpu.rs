//! Prefill GEMM efficiency against the FMA peak, in CPU time (not a test).
//!
//!     [REPS=n] [THREADS=n] cargo bench -p coil-kernels --bench gemm_cpu \
//!         [-- FORMAT... [TOKENS ROWS COLS | hybrid | mamba2]]
//!
//! Both the f32 FMA peak (register-only FMAs, one thread) and the GEMM are
//! timed by CPU time (`CLOCK_THREAD_CPUTIME_ID`, or with `THREADS` > 1 the
//! process's: all threads, idle spinning included), not wall time, so the ratio
//! holds on a machine shared with other jobs (time spent descheduled is not
//! counted). What sharing still costs — caches refilled after another job
//! ran — lowers the ratio a little. `hybrid` / `mamba2`: the matrices of a
//! layer of hybrid-350m-like / mamba2-370m-like at 512 tokens, summed.

#[path = "common/fma.rs"]
mod fma;
use coil_gguf::GgmlType;
use coil_kernels::testutil::{random_weights, Rng};
use coil_kernels::{matmul, simd, ThreadPool, WeightRef};
use fma::*;
use std::hint::black_box;

/// Time the process's CPU time (all threads) instead of this thread's.
static PROCESS_CLOCK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

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
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let clk = if PROCESS_CLOCK.load(std::sync::atomic::Ordering::Relaxed) {
        CLOCK_PROCESS_CPUTIME_ID
    } else {
        CLOCK_THREAD_CPUTIME_ID
    };
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: clock_gettime writes one timespec (libc's, 64-bit Linux layout).
    let rc = unsafe { clock_gettime(clk, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime({clk}) failed");
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
    // (tokens, rows, cols) of each product
    let shapes: Vec<(usize, usize, usize)> = if args.iter().any(|a| a == "hybrid") {
        // in_proj, out_proj, MLP gate+up, MLP down
        vec![
            (512, 3352, 768),
            (512, 768, 1536),
            (512, 5120, 768),
            (512, 768, 2560),
        ]
    } else if args.iter().any(|a| a == "mamba2") {
        vec![(512, 4384, 1024), (512, 1024, 2048)]
    } else {
        match nums[..] {
            [n, r, c, ..] => vec![(n, r, c)],
            _ => vec![(512, 1024, 1024)],
        }
    };
    // Best of REPS runs (CPU time): a shared machine's other jobs evict the
    // caches now and then, and the best run is the one they left alone.
    let reps = std::env::var("REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let pool = ThreadPool::new(threads);
    let peak = fma_peak();
    PROCESS_CLOCK.store(threads > 1, std::sync::atomic::Ordering::Relaxed);
    println!(
        "gemm_cpu: {threads} thread(s), SIMD level {}, f32 FMA peak {peak:.1} GFLOP per CPU-second",
        simd::level().name()
    );
    println!("{shapes:?} (tokens, rows, cols), best of {reps}, in GFLOP per CPU-second:");
    println!(
        "{:>8} {:>10} {:>9} {:>8}",
        "format", "ms", "GFLOP/s", "%peak"
    );
    let mut rng = Rng::new(7);
    let mut mats = Vec::new();
    for ty in formats {
        let data: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&(_, r, c)| random_weights(&mut rng, ty, r, c))
            .collect();
        mats.push((ty, data));
    }
    let xs: Vec<Vec<f32>> = shapes.iter().map(|&(n, _, c)| rng.vec(n * c)).collect();
    let mut ys: Vec<Vec<f32>> = shapes.iter().map(|&(n, r, _)| vec![0f32; n * r]).collect();
    let flops: f64 = shapes
        .iter()
        .map(|&(n, r, c)| 2.0 * (n * r * c) as f64)
        .sum();
    for (ty, data) in &mats {
        let ws: Vec<WeightRef> = data
            .iter()
            .zip(&shapes)
            .map(|(d, &(_, r, c))| {
                WeightRef::new(*ty, d, r, c).expect("benchmark shapes are valid")
            })
            .collect();
        let secs = best_cpu(reps, || {
            for ((w, x), (y, &(n, _, _))) in ws.iter().zip(&xs).zip(ys.iter_mut().zip(&shapes)) {
                matmul(&pool, w, x, y, n);
            }
        });
        // GFLOP per CPU-second (per core busy), against one core's peak
        let gf = flops / secs / 1e9;
        println!(
            "{:>8} {:>10.2} {:>9.1} {:>7.0}%",
            ty.name(),
            secs * 1e3,
            gf,
            100.0 * gf / peak
        );
        black_box(&ys);
    }
}
