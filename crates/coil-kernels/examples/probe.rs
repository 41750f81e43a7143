//! One matmul shape, timed: `probe FORMAT ROWS COLS N_TOKENS [THREADS]`
//! (best of 10). With `COIL_GEMM_MIN_TOKENS` / `COIL_INT_GEMM` it compares paths;
//! `PROBE_REPACK=1` repacks the matrix as engines' loaders do
//! (`matmul::repack`), `PROBE_SINGLE=1` marks the pool single-stream,
//! `PROBE_HUGE=1` moves the matrix into huge pages as the loaders do.
//! `PROBE_AB=1` times the file's layout and the repacked one (with
//! `COIL_REPACK=all` for Q6_K on a Zen 4) call after call in one process,
//! best of 20 each: a host whose memory speed drifts from second to second
//! moves both alike.
use coil_kernels::testutil::{random_weights, Rng};
use coil_kernels::{matmul, WeightRef};
use std::time::Instant;

#[path = "common/shape.rs"]
mod shape;

fn main() {
    let (ty, rows, cols, n, pool) = shape::args("probe");
    let flag = |k: &str| std::env::var(k).is_ok_and(|v| v == "1");
    pool.set_single_stream(flag("PROBE_SINGLE"));
    let mut rng = Rng::new(1);
    let weights = random_weights(&mut rng, ty, rows, cols);
    let place = |data: &[u8]| {
        if flag("PROBE_HUGE") {
            let mut huge = Vec::new();
            coil_kernels::hugepages::reserve(&mut huge, data.len());
            huge.extend_from_slice(data);
            huge
        } else {
            data.to_vec()
        }
    };
    let ab = flag("PROBE_AB");
    // (matrix bytes, repacked) per variant
    let mut variants = Vec::new();
    if ab || !flag("PROBE_REPACK") {
        variants.push((place(&weights), false));
    }
    if ab || flag("PROBE_REPACK") {
        let mut data = place(&weights);
        let repacked = matmul::repack(ty, &mut data, rows, cols);
        variants.push((data, repacked));
    }
    drop(weights);
    let x = rng.vec(n * cols);
    let mut y = vec![0f32; n * rows];
    let mut best = vec![f64::MAX; variants.len()];
    for _ in 0..if ab { 20 } else { 10 } {
        for (v, (data, repacked)) in variants.iter().enumerate() {
            let mut w = WeightRef::new(ty, data, rows, cols).unwrap();
            if *repacked {
                w.layout = matmul::Layout::Lanes16;
            }
            let t = Instant::now();
            matmul(&pool, &w, &x, &mut y, n);
            best[v] = best[v].min(t.elapsed().as_secs_f64());
        }
    }
    for ((_, repacked), best) in variants.iter().zip(best) {
        println!(
            "{ty}{} {rows}x{cols} n={n}: {:.3} ms, {:.1} GFLOP/s",
            if *repacked { " (lanes16)" } else { "" },
            best * 1e3,
            2.0 * (rows * cols * n) as f64 / best / 1e9
        );
    }
}
