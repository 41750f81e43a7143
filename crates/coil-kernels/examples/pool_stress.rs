//! Decode-like loop (many small parallel matvecs) to check the pool under
//! oversubscription: run it alone, then beside a busy process.
use coil_gguf::GgmlType;
use coil_kernels::testutil::{random_weights, Rng};
use coil_kernels::{matmul, ThreadPool, WeightRef};
use std::time::Instant;
fn main() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(1);
    let (rows, cols) = (1024, 1024);
    let data = random_weights(&mut rng, GgmlType::Q4_K, rows, cols);
    let w = WeightRef::new(GgmlType::Q4_K, &data, rows, cols).unwrap();
    let x = rng.vec(cols);
    let mut y = vec![0f32; rows];
    // empty parallel call latency
    let t = Instant::now();
    for _ in 0..10000 {
        pool.parallel_for(2, 1, |_, _| {});
    }
    println!(
        "empty parallel_for: {:.2} us",
        t.elapsed().as_secs_f64() * 1e6 / 10000.0
    );
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..5000 {
            matmul(&pool, &w, &x, &mut y, 1);
        }
        println!(
            "1024x1024 Q4_K matvec: {:.2} us/call",
            t.elapsed().as_secs_f64() * 1e6 / 5000.0
        );
    }
}
