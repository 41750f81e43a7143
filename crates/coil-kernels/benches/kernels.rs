//! Kernel benchmark (not a test): prints GFLOP/s and GB/s per kernel and
//! weight format beside this machine's measured limits.
//!
//!     cargo bench -p coil-kernels --bench kernels [-- THREADS [filter]]
//!
//! Machine limits are measured here too: memory read bandwidth (sum of a
//! 1 GiB buffer with all threads) and the f32 FMA peak (register-only FMAs).

#[path = "common/fma.rs"]
mod fma;
use coil_gguf::GgmlType;
use coil_kernels::testutil::{random_weights, Rng};
use coil_kernels::{matmul, simd, ThreadPool, WeightRef};
use fma::*;
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
coil_kernels::multiversion!(fn sum_mv_auto(x: &[f32]) -> f32 => sum_chunk);

/// Sum with 8 independent AVX-512 accumulators (many loads in flight).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(x: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); 8];
    let mut c = x.chunks_exact(128);
    for ch in &mut c {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm512_add_ps(*a, _mm512_loadu_ps(ch.as_ptr().add(16 * j)));
        }
    }
    let mut s = _mm512_setzero_ps();
    for a in acc {
        s = _mm512_add_ps(s, a);
    }
    _mm512_reduce_add_ps(s) + c.remainder().iter().sum::<f32>()
}

fn sum_mv(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd::level() == simd::SimdLevel::Avx512 {
        // SAFETY: the CPU has AVX-512.
        return unsafe { sum_avx512(x) };
    }
    sum_mv_auto(x)
}

/// Read bandwidth of all threads summing `buf`, GB/s (best of `reps`).
fn read_bandwidth_of(pool: &ThreadPool, buf: &[f32], reps: usize) -> f64 {
    let n = buf.len();
    let grain = (n / (pool.n_threads() * 64)).max(1 << 16);
    let secs = best_of(reps, || {
        let total = std::sync::Mutex::new(0f32);
        pool.parallel_for(n, grain, |r, _| {
            let s = sum_mv(&buf[r]);
            *total.lock().unwrap() += s;
        });
        black_box(total.into_inner().unwrap());
    });
    (n * 4) as f64 / secs / 1e9
}

fn read_bandwidth(pool: &ThreadPool) -> f64 {
    let buf: Vec<f32> = (0..256usize << 20).map(|i| (i % 7) as f32).collect(); // 1 GiB
    read_bandwidth_of(pool, &buf, 4)
}

/// f32 FMA peak of all threads, GFLOP/s.
fn fma_peak(pool: &ThreadPool) -> f64 {
    fma_peak_iters(pool, 20_000_000)
}

fn fma_peak_short(pool: &ThreadPool) -> f64 {
    fma_peak_iters(pool, 2_000_000)
}

fn fma_peak_iters(pool: &ThreadPool, iters: usize) -> f64 {
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
                    simd::SimdLevel::Avx512 => fma_loop_512(black_box(iters)),
                    _ => fma_loop_256(black_box(iters)),
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
    if let Some(ty) = filter.strip_prefix("decode") {
        let ty = match ty.trim_start_matches(['-', '_']) {
            "" => GgmlType::Q8_0,
            t => GgmlType::from_name(t).unwrap_or_else(|| panic!("unknown format {t}")),
        };
        return decode_shapes_bench(&pool, ty);
    }
    if let Some(ty) = filter.strip_prefix("prefill") {
        let ty = match ty.trim_start_matches(['-', '_']) {
            "" => GgmlType::Q4_K,
            t => GgmlType::from_name(t).unwrap_or_else(|| panic!("unknown format {t}")),
        };
        return prefill_shapes_bench(&pool, ty);
    }
    if let Some(ty) = filter.strip_prefix("invariant") {
        let mut rng = Rng::new(1);
        return invariant_bench(&pool, &mut rng, ty.trim_start_matches(['-', '_']));
    }
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
    // Decode: one token; rows chosen so each matrix is >= 256 MB (8x L3), so
    // every run streams the weights from memory. Shared machines are noisy:
    // the read bandwidth is re-measured right before each format (same
    // 256 MB size) and the ratio is taken against that.
    let cols = 4096;
    let bwbuf: Vec<f32> = (0..64usize << 20).map(|i| (i % 7) as f32).collect();
    println!("matvec (1 token), R x {cols} weight of >= 256 MB:");
    println!(
        "{:>8} {:>9} {:>10} {:>9} {:>10} {:>8}",
        "format", "MB", "ms", "GB/s", "read GB/s", "%read"
    );
    println!("         (best of 10 runs; %read = median of 5 ratios to the read bandwidth measured just before)");
    for ty in formats {
        if !filter.is_empty() && !ty.name().eq_ignore_ascii_case(&filter) {
            continue;
        }
        let row_bytes = cols / ty.block_size() * ty.type_size();
        let rows = (256usize << 20).div_ceil(row_bytes).next_multiple_of(64);
        let data = random_weights(&mut rng, ty, rows, cols);
        let w = WeightRef::new(ty, &data, rows, cols).unwrap();
        let x = rng.vec(cols);
        let mut y = vec![0f32; rows];
        // Alternate bandwidth and kernel measurements; report the best kernel
        // time and the median of the paired ratios (robust to noise).
        let mut ratios = Vec::new();
        let mut best = f64::INFINITY;
        let mut bw_best = 0f64;
        for _ in 0..5 {
            let bw_now = read_bandwidth_of(&pool, &bwbuf, 1);
            let secs = best_of(2, || matmul(&pool, &w, &x, &mut y, 1));
            ratios.push(data.len() as f64 / secs / 1e9 / bw_now);
            best = best.min(secs);
            bw_best = bw_best.max(bw_now);
        }
        ratios.sort_by(|a, b| a.total_cmp(b));
        let gbs = data.len() as f64 / best / 1e9;
        println!(
            "{:>8} {:>9.1} {:>10.3} {:>9.1} {:>10.1} {:>7.0}%",
            ty.name(),
            data.len() as f64 / 1e6,
            best * 1e3,
            gbs,
            bw_best,
            100.0 * ratios[2]
        );
    }

    // Prefill: 512 tokens x 1024 by a 4096 x 1024 weight.
    let (n, rows, cols) = (512, 4096, 1024);
    println!("\nmatmul (prefill) {n} tokens x {cols} by {rows} x {cols}:");
    println!(
        "{:>8} {:>10} {:>9} {:>8}",
        "format", "ms", "GFLOP/s", "%peak"
    );
    println!("         (best of 6 runs; %peak = median of 3 ratios to the FMA peak measured just before)");
    let x = rng.vec(n * cols);
    let mut y = vec![0f32; n * rows];
    for ty in formats {
        if !filter.is_empty() && !ty.name().eq_ignore_ascii_case(&filter) {
            continue;
        }
        let data = random_weights(&mut rng, ty, rows, cols);
        let w = WeightRef::new(ty, &data, rows, cols).unwrap();
        let mut ratios = Vec::new();
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let pk = fma_peak_short(&pool);
            let secs = best_of(2, || matmul(&pool, &w, &x, &mut y, n));
            ratios.push(2.0 * (n * rows * cols) as f64 / secs / 1e9 / pk);
            best = best.min(secs);
        }
        ratios.sort_by(|a, b| a.total_cmp(b));
        let gf = 2.0 * (n * rows * cols) as f64 / best / 1e9;
        print!(
            "{:>8} {:>10.2} {:>9.1} {:>7.0}%",
            ty.name(),
            best * 1e3,
            gf,
            100.0 * ratios[1]
        );
        // Formats with an integer GEMM: the f32 GEMM path too, side by side.
        let int_fmt = coil_kernels::matmul::has_int_gemm(ty, simd::level());
        if int_fmt {
            coil_kernels::matmul::set_int_gemm(false);
            let f = best_of(4, || matmul(&pool, &w, &x, &mut y, n));
            coil_kernels::matmul::set_int_gemm(true);
            let again = best_of(2, || matmul(&pool, &w, &x, &mut y, n));
            print!(
                "   int GEMM; f32 GEMM path {:.2} ms ({:.1}x slower)",
                f * 1e3,
                f / again.min(best)
            );
        }
        println!();
    }
    // Small batches: decode of a few sequences.
    println!("\nmatmul, few tokens, 4096 x 4096 weight (ms):");
    print!("{:>8}", "format");
    let ns = [2usize, 4, 8, 16, 24, 32, 64];
    for n in ns {
        print!(" {:>8}", format!("n={n}"));
    }
    println!();
    for ty in [
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q3_K,
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
    invariant_bench(&pool, &mut rng, &filter);
    if filter.is_empty() || filter.eq_ignore_ascii_case("ops") {
        ops_bench(&pool, &mut rng, bw);
    }
}

/// Decode (one token) on the matrix shapes of an LFM2-1.2B-like model
/// (hidden 2048, FFN 8192, vocab 65,536): `decode` (Q8_0) or
/// `decode-<format>` as the filter. Each shape is copied until the copies
/// fill 256 MB and the copies are multiplied in turn, so every product
/// streams its weights from memory as in a model's forward pass (whose
/// weights are far larger than the caches).
/// Prefill (512 tokens) at the shapes of an LFM2-1.2B-like model: where a
/// prompt's time goes, per weight format (`-- 2 prefill-Q4_K`).
/// `data` rewritten into the layout coil's loader gives `ty` here (Q4_K
/// and Q6_K where it repacks them), and that layout.
fn loader_layout(ty: GgmlType, data: &mut [u8], rows: usize, cols: usize) -> coil_kernels::Layout {
    match coil_kernels::repack(ty, data, rows, cols) {
        true => coil_kernels::Layout::Lanes16,
        false => coil_kernels::Layout::Rows,
    }
}

fn prefill_shapes_bench(pool: &ThreadPool, ty: GgmlType) {
    let mut rng = Rng::new(11);
    let n = 512;
    println!(
        "matmul (prefill), {n} tokens, {} weights (in the loader's layout):",
        ty.name()
    );
    println!("{:>22} {:>9} {:>9}", "shape (in -> out)", "ms", "GFLOP/s");
    for (cols, rows, what) in [
        (2048usize, 8192usize, "ffn up"),
        (8192, 2048, "ffn down"),
        (2048, 6144, "conv in"),
        (2048, 2048, "square"),
    ] {
        let mut data = random_weights(&mut rng, ty, rows, cols);
        let layout = loader_layout(ty, &mut data, rows, cols);
        let w = WeightRef {
            layout,
            ..WeightRef::new(ty, &data, rows, cols).unwrap()
        };
        let x = rng.vec(n * cols);
        let mut y = vec![0f32; n * rows];
        let secs = best_of(5, || matmul(pool, &w, &x, &mut y, n));
        println!(
            "{:>22} {:>9.2} {:>9.1}",
            format!("{what} {cols} -> {rows}"),
            secs * 1e3,
            2.0 * (n * rows * cols) as f64 / secs / 1e9
        );
    }
}

fn decode_shapes_bench(pool: &ThreadPool, ty: GgmlType) {
    let bwbuf: Vec<f32> = (0..64usize << 20).map(|i| (i % 7) as f32).collect();
    let mut rng = Rng::new(7);
    let few = [2usize, 4, 8];
    println!(
        "matvec (1 token), {} weights streamed from memory:",
        ty.name()
    );
    print!(
        "{:>22} {:>7} {:>8} {:>6} {:>9} {:>6}",
        "shape (in -> out)", "MB", "us", "GB/s", "read GB/s", "%read"
    );
    for n in few {
        print!(" {:>8}", format!("{n}tok GB/s"));
    }
    println!();
    println!(
        "    (best of 7 passes; %read = median of 7 ratios to the read bandwidth measured just \
         before; n tok: weight bytes per second, n tokens at once)"
    );
    for (cols, rows, what) in [
        (2048usize, 8192usize, "ffn up"),
        (8192, 2048, "ffn down"),
        (2048, 6144, "conv in"),
        (2048, 2048, "square"),
        (2048, 65536, "vocab"),
        (1024, 248320, "head1k"),
    ] {
        let mut one = random_weights(&mut rng, ty, rows, cols);
        let layout = loader_layout(ty, &mut one, rows, cols);
        let copies = (256usize << 20).div_ceil(one.len()).max(2);
        // in huge pages, as the loader reads a model's weights
        let mut data = Vec::new();
        coil_kernels::hugepages::reserve(&mut data, one.len() * copies);
        for _ in 0..copies {
            data.extend_from_slice(&one);
        }
        let ws: Vec<WeightRef> = data
            .chunks_exact(one.len())
            .map(|d| WeightRef {
                layout,
                ..WeightRef::new(ty, d, rows, cols).unwrap()
            })
            .collect();
        let pass = |n: usize, x: &[f32], y: &mut [f32]| {
            best_of(1, || {
                for w in &ws {
                    matmul(pool, w, x, y, n);
                }
            }) / copies as f64
        };
        let x = rng.vec(8 * cols);
        let mut y = vec![0f32; 8 * rows];
        let mut ratios = Vec::new();
        let mut best = f64::INFINITY;
        let mut bw_best = 0f64;
        for _ in 0..7 {
            let bw_now = read_bandwidth_of(pool, &bwbuf, 1);
            let secs = pass(1, &x[..cols], &mut y[..rows]);
            ratios.push(one.len() as f64 / secs / 1e9 / bw_now);
            best = best.min(secs);
            bw_best = bw_best.max(bw_now);
        }
        ratios.sort_by(|a, b| a.total_cmp(b));
        print!(
            "{:>22} {:>7.1} {:>8.1} {:>6.1} {:>9.1} {:>5.0}%",
            format!("{cols} -> {rows} {what}"),
            one.len() as f64 / 1e6,
            best * 1e6,
            one.len() as f64 / best / 1e9,
            bw_best,
            100.0 * ratios[3]
        );
        for n in few {
            let secs = (0..3)
                .map(|_| pass(n, &x[..n * cols], &mut y[..n * rows]))
                .fold(f64::INFINITY, f64::min);
            print!(" {:>8.1}", one.len() as f64 / secs / 1e9);
        }
        println!();
    }
}

/// Batch-invariant mode (speculative verification, batched decode with
/// `--batch-invariant`): n tokens through per-row dot products, each
/// token's result as if alone. Reported as the time of n tokens relative to
/// one token, on a 256 KB weight that stays in L2 (one thread: the kernels' compute
/// cost) and on one streamed from memory (64 MB, all threads). Rows of 4096
/// values, or `BCOLS` (e.g. `BCOLS=1024`: the Qwen3.5-0.8B shape's).
fn invariant_bench(pool: &ThreadPool, rng: &mut Rng, filter: &str) {
    let ns = [1usize, 2, 3, 4, 5, 8, 9, 16];
    let one_thread = ThreadPool::new(1);
    println!("\nbatch-invariant few tokens: time of n tokens / time of 1 token");
    for (label, in_l2) in [("L2,1t", true), ("64 MB", false)] {
        print!("{:>8} {:>6}", "format", label);
        for n in ns {
            print!(" {:>6}", format!("n={n}"));
        }
        println!("   1 token (us)");
        let pool = if in_l2 { &one_thread } else { pool };
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::Q3_K,
            GgmlType::F16,
        ] {
            if !filter.is_empty() && !ty.name().eq_ignore_ascii_case(filter) {
                continue;
            }
            let cols: usize = std::env::var("BCOLS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(4096);
            let row_bytes = cols / ty.block_size() * ty.type_size();
            // 256 KB: within every L2 here with the activations beside it
            // (512 KB filled AMD Zen 3's whole L2, and read from L3)
            let bytes = if in_l2 { 256usize << 10 } else { 64usize << 20 };
            let rows = bytes.div_ceil(row_bytes).next_multiple_of(16);
            let data = random_weights(rng, ty, rows, cols);
            let w = WeightRef::new(ty, &data, rows, cols).unwrap();
            let _inv = coil_kernels::numerics::invariant_scope(true);
            let mut one = 0.0;
            print!("{:>8} {:>6}", ty.name(), "");
            for n in ns {
                let x = rng.vec(n * cols);
                let mut y = vec![0f32; n * rows];
                let reps = if in_l2 { 200 } else { 7 };
                let secs = best_of(reps, || matmul(pool, &w, &x, &mut y, n));
                if n == 1 {
                    one = secs;
                }
                print!(" {:>6.2}", secs / one);
            }
            println!("   {:.1}", one * 1e6);
        }
    }
}

fn ops_bench(pool: &ThreadPool, rng: &mut Rng, bw: f64) {
    use coil_kernels::ops::attention::{attention, KvData, KvView};
    use coil_kernels::ops::ssm::{mamba1_scan, mamba2_scan, Mamba2Dims};
    println!("\nops (mamba2-370m-like shapes: 32 heads x 64, d_state 128, 1 group):");
    println!(
        "{:>34} {:>10} {:>9} {:>9}",
        "kernel", "ms", "GFLOP/s", "GB/s"
    );
    let dims = Mamba2Dims {
        n_head: 32,
        head_dim: 64,
        n_group: 1,
        d_state: 128,
    };
    let sn = 32 * 64 * 128;
    for t in [1usize, 512] {
        let mut state = rng.vec(sn);
        let x = rng.vec(t * 32 * 64);
        let dt: Vec<f32> = rng.vec(t * 32).iter().map(|v| v.abs() * 0.1).collect();
        let a: Vec<f32> = rng.vec(32).iter().map(|v| -v.abs()).collect();
        let b = rng.vec(t * 128);
        let c = rng.vec(t * 128);
        let d = rng.vec(32);
        let mut y = vec![0f32; t * 32 * 64];
        let secs = best_of(10, || {
            mamba2_scan(
                pool,
                dims,
                &mut state,
                &x,
                &dt,
                &a,
                &b,
                &c,
                Some(&d),
                &mut y,
                t,
            )
        });
        // per state element and token: 2 FMA (update) + 1 FMA (output)
        let flops = 6.0 * (sn * t) as f64;
        // T=1 streams the state in and out once; T=512 keeps it in cache
        let gbs = if t == 1 {
            format!("{:.1}", 8.0 * sn as f64 / secs / 1e9)
        } else {
            "-".to_string()
        };
        println!(
            "{:>34} {:>10.3} {:>9.1} {:>9}",
            format!("mamba2_scan T={t}"),
            secs * 1e3,
            flops / secs / 1e9,
            gbs
        );
    }
    // A server's decode step: one token of each of N sequences through 12
    // layers (states 12 MiB per sequence, beyond the caches), each
    // sequence's scan its own pool call, or all in one (ops/ssm/batch.rs).
    {
        use coil_kernels::ops::ssm::{mamba2_scan_batch, Mamba2Seq};
        use coil_kernels::ops::ssm::{mamba2_scan_from, ScanInputs};
        let layers = 12;
        let ld = 32 * 64 + 2 * 128;
        let a: Vec<f32> = rng.vec(32).iter().map(|v| -v.abs()).collect();
        let d = rng.vec(32);
        for n_seq in [1usize, 2, 4, 8, 16] {
            let mut states: Vec<Vec<f32>> = (0..n_seq * layers).map(|_| rng.vec(sn)).collect();
            let rows: Vec<Vec<f32>> = (0..n_seq).map(|_| rng.vec(ld)).collect();
            let dts: Vec<Vec<f32>> = (0..n_seq)
                .map(|_| rng.vec(32).iter().map(|v| v.abs() * 0.1).collect())
                .collect();
            let mut ys: Vec<Vec<f32>> = (0..n_seq).map(|_| vec![0f32; 32 * 64]).collect();
            fn inputs(r: &[f32]) -> ScanInputs<'_> {
                ScanInputs {
                    x: r,
                    ldx: r.len(),
                    b: &r[32 * 64..],
                    c: &r[32 * 64 + 128..],
                    ldbc: r.len(),
                }
            }
            let alone = best_of(5, || {
                for l in 0..layers {
                    for s in 0..n_seq {
                        mamba2_scan_from(
                            pool,
                            dims,
                            None,
                            &mut states[l * n_seq + s],
                            inputs(&rows[s]),
                            &dts[s],
                            &a,
                            Some(&d),
                            &mut ys[s],
                            1,
                        );
                    }
                }
            });
            let together = best_of(5, || {
                for l in 0..layers {
                    let mut seqs: Vec<Mamba2Seq> = states[l * n_seq..(l + 1) * n_seq]
                        .iter_mut()
                        .zip(ys.iter_mut())
                        .enumerate()
                        .map(|(s, (st, y))| Mamba2Seq {
                            from: None,
                            state: st,
                            inputs: inputs(&rows[s]),
                            dt: &dts[s],
                            y,
                            n_tokens: 1,
                        })
                        .collect();
                    mamba2_scan_batch(pool, dims, &mut seqs, &a, Some(&d));
                }
            });
            let bytes = 8.0 * (sn * n_seq * layers) as f64;
            for (how, secs) in [("each alone", alone), ("batched", together)] {
                println!(
                    "{:>34} {:>10.3} {:>9.1} {:>9.1}",
                    format!("mamba2 step N={n_seq} x{layers} {how}"),
                    secs * 1e3,
                    6.0 * (sn * n_seq * layers) as f64 / secs / 1e9,
                    bytes / secs / 1e9
                );
            }
        }
    }
    // A decode step through 48 layers (mamba2-370m: 48 MiB of f32 state,
    // beyond the caches) with the state stored in f32 or bf16
    // (ops/ssm/bf16.rs): half the bytes, more arithmetic per value.
    {
        use coil_kernels::ops::ssm::{mamba2_scan_from, ScanInputs};
        use half::bf16;
        let layers = 48;
        let mut s32: Vec<Vec<f32>> = (0..layers).map(|_| rng.vec(sn)).collect();
        let mut s16: Vec<Vec<bf16>> = s32
            .iter()
            .map(|s| s.iter().map(|&v| bf16::from_f32(v)).collect())
            .collect();
        let x = rng.vec(32 * 64);
        let dt: Vec<f32> = rng.vec(32).iter().map(|v| v.abs() * 0.1).collect();
        let a: Vec<f32> = rng.vec(32).iter().map(|v| -v.abs()).collect();
        let (b, c, d) = (rng.vec(128), rng.vec(128), rng.vec(32));
        let mut y = vec![0f32; 32 * 64];
        let inputs = ScanInputs::dense(&dims, &x, &b, &c, 1);
        let f32_secs = best_of(10, || {
            for s in s32.iter_mut() {
                mamba2_scan_from(pool, dims, None, s, inputs, &dt, &a, Some(&d), &mut y, 1);
            }
        });
        let bf16_secs = best_of(10, || {
            for s in s16.iter_mut() {
                mamba2_scan_from(pool, dims, None, s, inputs, &dt, &a, Some(&d), &mut y, 1);
            }
        });
        for (ty, secs, size) in [("f32", f32_secs, 4.0), ("bf16", bf16_secs, 2.0)] {
            println!(
                "{:>34} {:>10.3} {:>9.1} {:>9.1}",
                format!("mamba2 step x{layers} state {ty}"),
                secs * 1e3,
                6.0 * (sn * layers) as f64 / secs / 1e9,
                2.0 * size * (sn * layers) as f64 / secs / 1e9
            );
        }
    }
    // The same for the gated delta rule: a decode step through 18 Gated
    // DeltaNet layers of qwen35-0.8b (16 heads of 128 × 128: 18 MiB of f32
    // state).
    {
        use coil_kernels::ops::delta::{gated_delta_scan, DeltaInputs, GatedDeltaDims, HeadOrder};
        use half::bf16;
        let (layers, h, dk) = (18, 16, 128);
        let gd = GatedDeltaDims {
            n_k_head: h,
            n_v_head: h,
            d_k: dk,
            d_v: dk,
            order: HeadOrder::Tiled,
        };
        let n = gd.state_len();
        let mut s32: Vec<Vec<f32>> = (0..layers)
            .map(|_| rng.vec(n).iter().map(|v| v * 0.1).collect())
            .collect();
        let mut s16: Vec<Vec<bf16>> = s32
            .iter()
            .map(|s| s.iter().map(|&v| bf16::from_f32(v)).collect())
            .collect();
        let norm = |v: Vec<f32>| -> Vec<f32> {
            let mut v = v;
            for r in v.chunks_mut(dk) {
                let ss: f32 = r.iter().map(|x| x * x).sum::<f32>().sqrt();
                r.iter_mut().for_each(|x| *x /= ss);
            }
            v
        };
        let (q, k, v) = (
            norm(rng.vec(h * dk)),
            norm(rng.vec(h * dk)),
            rng.vec(h * dk),
        );
        let g: Vec<f32> = rng.vec(h).iter().map(|x| -x.abs() * 0.1).collect();
        let beta: Vec<f32> = rng.vec(h).iter().map(|x| 0.5 + 0.4 * x).collect();
        let inp = DeltaInputs {
            q: &q,
            k: &k,
            ld_qk: h * dk,
            v: &v,
            ld_v: h * dk,
            g: &g,
            beta: &beta,
        };
        let mut o = vec![0f32; h * dk];
        let f32_secs = best_of(10, || {
            for s in s32.iter_mut() {
                gated_delta_scan(pool, gd, s, inp, &mut o, 1);
            }
        });
        let bf16_secs = best_of(10, || {
            for s in s16.iter_mut() {
                gated_delta_scan(pool, gd, s, inp, &mut o, 1);
            }
        });
        // A prompt of 512 tokens through one layer, the chunked form.
        {
            use coil_kernels::ops::delta::chunk::{delta_chunked, DEFAULT_CHUNK};
            let t = 512;
            let (q, k) = (norm(rng.vec(t * h * dk)), norm(rng.vec(t * h * dk)));
            let v = rng.vec(t * h * dk);
            let g: Vec<f32> = rng.vec(t * h).iter().map(|x| -x.abs() * 0.1).collect();
            let beta: Vec<f32> = rng.vec(t * h).iter().map(|x| 0.5 + 0.4 * x).collect();
            let inp = DeltaInputs {
                q: &q,
                k: &k,
                ld_qk: h * dk,
                v: &v,
                ld_v: h * dk,
                g: &g,
                beta: &beta,
            };
            let mut o = vec![0f32; t * h * dk];
            let mut s = s32[0].clone();
            let secs = best_of(5, || {
                delta_chunked(pool, gd, DEFAULT_CHUNK, &mut s, inp, &mut o, t)
            });
            println!(
                "{:>34} {:>10.3}",
                format!("delta chunked T={t}, {h} heads"),
                secs * 1e3
            );
        }
        for (ty, secs, size) in [("f32", f32_secs, 4.0), ("bf16", bf16_secs, 2.0)] {
            println!(
                "{:>34} {:>10.3} {:>9.1} {:>9.1}",
                format!("delta step x{layers} state {ty}"),
                secs * 1e3,
                6.0 * (n * layers) as f64 / secs / 1e9,
                2.0 * size * (n * layers) as f64 / secs / 1e9
            );
        }
    }
    // Mamba-1 (mamba-790m-like: d_inner 3072, d_state 16)
    let (di, n) = (3072usize, 16usize);
    for t in [1usize, 512] {
        let mut state = rng.vec(di * n);
        let x = rng.vec(t * di);
        let dt: Vec<f32> = rng.vec(t * di).iter().map(|v| v.abs() * 0.1).collect();
        let a: Vec<f32> = rng.vec(di * n).iter().map(|v| -v.abs()).collect();
        let b = rng.vec(t * n);
        let c = rng.vec(t * n);
        let d = rng.vec(di);
        let mut y = vec![0f32; t * di];
        let secs = best_of(10, || {
            mamba1_scan(
                pool,
                di,
                n,
                &mut state,
                &x,
                &dt,
                &a,
                &b,
                &c,
                Some(&d),
                &mut y,
                t,
            )
        });
        let flops = 8.0 * (di * n * t) as f64; // exp counted as ~2
        println!(
            "{:>34} {:>10.3} {:>9.1} {:>9}",
            format!("mamba1_scan d_inner 3072 T={t}"),
            secs * 1e3,
            flops / secs / 1e9,
            ""
        );
    }
    // Attention: 12 heads, 4 KV heads, head_dim 64, over 4096 positions.
    let (nh, nkv, hd, npos) = (12usize, 4usize, 64usize, 4096usize);
    let k = rng.vec(npos * nkv * hd);
    let v = rng.vec(npos * nkv * hd);
    let k16: Vec<half::f16> = k.iter().map(|x| half::f16::from_f32(*x)).collect();
    let v16: Vec<half::f16> = v.iter().map(|x| half::f16::from_f32(*x)).collect();
    // The same f32 cells in pages of 256 positions, each its own allocation
    // (as the KV memory holds them).
    let page =
        |x: &[f32]| -> Vec<Vec<f32>> { x.chunks(256 * nkv * hd).map(|c| c.to_vec()).collect() };
    let (kp, vp) = (page(&k), page(&v));
    let ks: Vec<&[f32]> = kp.iter().map(|p| p.as_slice()).collect();
    let vs: Vec<&[f32]> = vp.iter().map(|p| p.as_slice()).collect();
    for (name, view, esz) in [
        (
            "f32",
            KvView::dense(KvData::F32(&k), KvData::F32(&v), nkv, hd),
            4.0,
        ),
        (
            "f32 paged",
            KvView::paged(&ks, &vs, 256, npos, nkv, hd),
            4.0,
        ),
        (
            "f16",
            KvView::dense(KvData::F16(&k16), KvData::F16(&v16), nkv, hd),
            2.0,
        ),
    ] {
        for nq in [1usize, 64] {
            let q = rng.vec(nq * nh * hd);
            let lens: Vec<usize> = (0..nq).map(|i| npos - nq + 1 + i).collect();
            let mut out = vec![0f32; q.len()];
            let secs = best_of(5, || attention(pool, &q, nh, &view, &lens, 0.125, &mut out));
            let flops = 4.0 * (nq * nh * hd * npos) as f64;
            let bytes = 2.0 * esz * (npos * nkv * hd) as f64;
            println!(
                "{:>34} {:>10.3} {:>9.1} {:>9.1}",
                format!("attention {name} KV 4096, {nq} q"),
                secs * 1e3,
                flops / secs / 1e9,
                bytes / secs / 1e9
            );
        }
    }
    let _ = bw;
}
