//! Kernel benchmark (not a test): prints GFLOP/s and GB/s per kernel and
//! weight format beside this machine's measured limits.
//!
//!     cargo bench -p coil-kernels --bench kernels [-- THREADS [filter]]
//!
//! Machine limits are measured here too: memory read bandwidth (sum of a
//! 1 GiB buffer with all threads) and the f32 FMA peak (register-only FMAs).

use coil_gguf::GgmlType;
use coil_kernels::testutil::{random_weights, Rng};
use coil_kernels::{matmul, simd, ThreadPool, WeightRef};
use std::hint::black_box;
use std::time::Instant;

/// Best wall time of `reps` runs after one warm-up, in seconds.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

#[inline(always)]
fn sum_chunk(x: &[f32]) -> f32 {
    let mut acc = [0f32; 32];
    for c in x.chunks_exact(32) {
        for i in 0..32 {
            acc[i] += c[i];
        }
    }
    acc.iter().sum()
}
coil_kernels::multiversion!(fn sum_mv(x: &[f32]) -> f32 => sum_chunk);

fn read_bandwidth(pool: &ThreadPool) -> f64 {
    let n = 256 << 20; // 1 GiB of f32
    let buf: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let grain = n / (pool.n_threads() * 16);
    let secs = best_of(4, || {
        let total = std::sync::Mutex::new(0f32);
        pool.parallel_for(n, grain, |r, _| {
            let s = sum_mv(&buf[r]);
            *total.lock().unwrap() += s;
        });
        black_box(total.into_inner().unwrap());
    });
    (n * 4) as f64 / secs / 1e9
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

/// f32 FMA peak of all threads, GFLOP/s.
fn fma_peak(pool: &ThreadPool) -> f64 {
    let iters = 20_000_000;
    let lvl = simd::level();
    let per = match lvl {
        simd::SimdLevel::Avx512 => 24 * 16 * 2,
        simd::SimdLevel::Avx2 => 12 * 8 * 2,
        simd::SimdLevel::Scalar => return f64::NAN,
    } as f64;
    let nt = pool.n_threads();
    let secs = best_of(3, || {
        pool.parallel_for(nt, 1, |_, _| {
            #[cfg(target_arch = "x86_64")]
            black_box(unsafe {
                match lvl {
                    simd::SimdLevel::Avx512 => fma_loop_512(iters),
                    _ => fma_loop_256(iters),
                }
            });
        });
    });
    per * iters as f64 * nt as f64 / secs / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let threads = args.first().and_then(|a| a.parse().ok()).unwrap_or(0);
    let filter = args.get(1).cloned().unwrap_or_default();
    let pool = ThreadPool::new(threads);
    println!(
        "coil-kernels benchmark: {} threads, SIMD level {}",
        pool.n_threads(),
        simd::level().name()
    );
    let bw = read_bandwidth(&pool);
    let peak = fma_peak(&pool);
    println!("machine: memory read {bw:.1} GB/s, f32 FMA peak {peak:.0} GFLOP/s\n");

    let mut rng = Rng::new(1);
    // Decode: one token against a matrix much larger than the caches.
    let formats = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::IQ4_NL,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
    ];
    println!("matvec (1 token), {} x {} weight:", 16384, 4096);
    println!(
        "{:>8} {:>9} {:>10} {:>9} {:>8}",
        "format", "MB", "ms", "GB/s", "%read"
    );
    for ty in formats {
        if !filter.is_empty() && !ty.name().eq_ignore_ascii_case(&filter) {
            continue;
        }
        let (rows, cols) = (if ty == GgmlType::F32 { 8192 } else { 16384 }, 4096);
        let data = random_weights(&mut rng, ty, rows, cols);
        let w = WeightRef::new(ty, &data, rows, cols).unwrap();
        let x = rng.vec(cols);
        let mut y = vec![0f32; rows];
        let secs = best_of(10, || matmul(&pool, &w, &x, &mut y, 1));
        let gbs = data.len() as f64 / secs / 1e9;
        println!(
            "{:>8} {:>9.1} {:>10.3} {:>9.1} {:>7.0}%",
            ty.name(),
            data.len() as f64 / 1e6,
            secs * 1e3,
            gbs,
            100.0 * gbs / bw
        );
    }

    // Prefill: 512 tokens x 1024 by a 4096 x 1024 weight.
    let (n, rows, cols) = (512, 4096, 1024);
    println!("\nmatmul (prefill) {n} tokens x {cols} by {rows} x {cols}:");
    println!(
        "{:>8} {:>10} {:>9} {:>8}",
        "format", "ms", "GFLOP/s", "%peak"
    );
    let x = rng.vec(n * cols);
    let mut y = vec![0f32; n * rows];
    for ty in formats {
        if !filter.is_empty() && !ty.name().eq_ignore_ascii_case(&filter) {
            continue;
        }
        let data = random_weights(&mut rng, ty, rows, cols);
        let w = WeightRef::new(ty, &data, rows, cols).unwrap();
        let secs = best_of(3, || matmul(&pool, &w, &x, &mut y, n));
        let gf = 2.0 * (n * rows * cols) as f64 / secs / 1e9;
        println!(
            "{:>8} {:>10.2} {:>9.1} {:>7.0}%",
            ty.name(),
            secs * 1e3,
            gf,
            100.0 * gf / peak
        );
    }
    // Small batches: decode of a few sequences.
    println!("\nmatmul, few tokens, 4096 x 4096 weight (ms):");
    print!("{:>8}", "format");
    let ns = [2usize, 4, 8, 16, 32];
    for n in ns {
        print!(" {:>8}", format!("n={n}"));
    }
    println!();
    for ty in [
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        if !filter.is_empty() && !ty.name().eq_ignore_ascii_case(&filter) {
            continue;
        }
        let (rows, cols) = (4096, 4096);
        let data = random_weights(&mut rng, ty, rows, cols);
        let w = WeightRef::new(ty, &data, rows, cols).unwrap();
        print!("{:>8}", ty.name());
        for n in ns {
            let x = rng.vec(n * cols);
            let mut y = vec![0f32; n * rows];
            let secs = best_of(5, || matmul(&pool, &w, &x, &mut y, n));
            print!(" {:>8.3}", secs * 1e3);
        }
        println!();
    }
}
