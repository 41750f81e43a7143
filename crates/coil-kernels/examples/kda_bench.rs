//! Kimi Delta Attention: the token-by-token recurrence vs the chunked form
//! on a Kimi-Linear-48B-A3B KDA layer (32 heads of 128) from a non-zero
//! state, and one decode step's state traffic (read + write of the f32 or
//! bf16 state) as a bandwidth. Prints mean CPU times with one thread (best
//! wall times with more); no assertion (a measurement).
//!
//!     [N=512] [CHUNK=16] [REPS=20] cargo run --release -p coil-kernels --example kda_bench [-- THREADS [H D]]

use coil_kernels::ops::delta::chunk::{delta_chunked, DEFAULT_CHUNK};
use coil_kernels::ops::delta::kda::{kda_scan, KdaDims, KdaInputs};
use coil_kernels::ops::delta::l2_normalize;
use coil_kernels::testutil::Rng;
use coil_kernels::ThreadPool;
use half::bf16;

#[path = "common/bench.rs"]
mod bench;
use bench::{numeric_args, time};

fn env(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn main() {
    let args = numeric_args();
    let threads = args.first().copied().unwrap_or(1);
    let (h, d) = match args.get(1..3) {
        Some(&[a, b]) => (a, b),
        _ => (32, 128),
    };
    let (n, chunk, reps) = (env("N", 512), env("CHUNK", DEFAULT_CHUNK), env("REPS", 20));
    let pool = ThreadPool::new(threads);
    let dims = KdaDims {
        n_head: h,
        d_k: d,
        d_v: d,
    };
    let mut rng = Rng::new(1);
    let mut q = rng.vec(n * h * d);
    let mut k = rng.vec(n * h * d);
    l2_normalize(&mut q, d, 1e-6, 1.0 / (d as f32).sqrt());
    l2_normalize(&mut k, d, 1e-6, 1.0);
    let v = rng.vec(n * h * d);
    let g: Vec<f32> = rng.vec(n * h * d).iter().map(|x| -x.abs() * 0.3).collect();
    let beta: Vec<f32> = rng
        .vec(n * h)
        .iter()
        .map(|x| 1.0 / (1.0 + (-x).exp()))
        .collect();
    let s0 = rng.vec(dims.state_len());
    let inp = |t: usize| KdaInputs {
        q: &q,
        k: &k,
        ld_qk: h * d,
        v: &v,
        ld_v: h * d,
        g: &g[..t * h * d],
        beta: &beta[..t * h],
    };
    let mut out = vec![0f32; n * h * d];
    let mut s = s0.clone();
    let rec = time(reps, threads, || {
        s.copy_from_slice(&s0);
        kda_scan(&pool, dims, &mut s, inp(n), &mut out, n);
    });
    let chunked = time(reps, threads, || {
        s.copy_from_slice(&s0);
        delta_chunked(&pool, dims, chunk, &mut s, inp(n), &mut out, n);
    });
    println!(
        "{h} heads x {d}, {n} tokens, {threads} thread(s): recurrence {:.2} ms, chunked ({chunk}) {:.2} ms ({:.2}x)",
        rec * 1e3,
        chunked * 1e3,
        rec / chunked
    );
    let bytes = |elem: usize| 2.0 * (dims.state_len() * elem) as f64;
    let one = time(reps * 10, threads, || {
        kda_scan(&pool, dims, &mut s, inp(1), &mut out[..h * d], 1)
    });
    let mut sb: Vec<bf16> = s0.iter().map(|&x| bf16::from_f32(x)).collect();
    let one_b = time(reps * 10, threads, || {
        kda_scan(&pool, dims, &mut sb, inp(1), &mut out[..h * d], 1)
    });
    println!(
        "decode step: f32 state {:.1} us ({:.1} GB/s of state), bf16 state {:.1} us ({:.1} GB/s)",
        one * 1e6,
        bytes(4) / one * 1e-9,
        one_b * 1e6,
        bytes(2) / one_b * 1e-9
    );
}
