//! One matmul shape timed the way llama.cpp's `test-backend-ops perf` times
//! MUL_MAT (one warm-up call, then the mean over repeated calls for at least
//! ~1 s), for side-by-side comparison:
//! `vs_llama FORMAT ROWS COLS N_TOKENS [THREADS]`.
//! llama.cpp's `MUL_MAT(type_a=T,m=ROWS,n=N_TOKENS,k=COLS)` is this shape.
use coil_kernels::testutil::{random_weights, Rng};
use coil_kernels::{matmul, WeightRef};
use std::time::Instant;

#[path = "common/shape.rs"]
mod shape;

fn main() {
    let (ty, rows, cols, n, pool) = shape::args("vs_llama");
    let mut rng = Rng::new(1);
    let data = random_weights(&mut rng, ty, rows, cols);
    let w = WeightRef::new(ty, &data, rows, cols).unwrap();
    let x = rng.vec(n * cols);
    let mut y = vec![0f32; n * rows];
    matmul(&pool, &w, &x, &mut y, n); // warm-up
    let (mut runs, mut best) = (0usize, f64::MAX);
    let start = Instant::now();
    while runs < 3 || start.elapsed().as_secs_f64() < 1.0 {
        let t = Instant::now();
        matmul(&pool, &w, &x, &mut y, n);
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    let mean = start.elapsed().as_secs_f64() / runs as f64;
    let flop = 2.0 * (rows * cols * n) as f64;
    println!(
        "{ty} {rows}x{cols} n={n} threads={}: {runs} runs, mean {:.3} ms = {:.1} GFLOP/s (best {:.1})",
        pool.n_threads(),
        mean * 1e3,
        flop / mean / 1e9,
        flop / best / 1e9
    );
}
