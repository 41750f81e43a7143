//! Gated delta rule: the token-by-token recurrence vs the chunked form, on
//! a Qwen3.5-0.8B DeltaNet layer (16 key and 16 value heads of 128) from a
//! non-zero state. Prints best wall times; no assertion (a measurement).
//!
//!     [N=512] [CHUNK=16] [ROWS=1] [ONLY_CHUNKED=1] [REPS=40] cargo run --release -p coil-kernels --example gated_delta_bench [-- THREADS [HK HV D]]

use coil_kernels::ops::delta::chunk::{delta_chunked, DEFAULT_CHUNK};
use coil_kernels::ops::delta::{
    gated_delta_scan, l2_normalize, DeltaInputs, GatedDeltaDims, HeadOrder,
};
use coil_kernels::testutil::Rng;
use coil_kernels::ThreadPool;

#[path = "common/bench.rs"]
mod bench;
use bench::{numeric_args, time};

fn main() {
    let args = numeric_args();
    let threads = args.first().copied().unwrap_or(1);
    let (hk, hv, d) = match args.get(1..4) {
        Some(&[a, b, c]) => (a, b, c),
        _ => (16, 16, 128),
    };
    let pool = ThreadPool::new(threads);
    let dims = GatedDeltaDims {
        n_k_head: hk,
        n_v_head: hv,
        d_k: d,
        d_v: d,
        order: HeadOrder::Tiled,
    };
    let mut rng = Rng::new(1);
    let nmax = 512;
    let mut q = rng.vec(nmax * hk * d);
    let mut k = rng.vec(nmax * hk * d);
    l2_normalize(&mut q, d, 1e-6, 1.0 / (d as f32).sqrt());
    l2_normalize(&mut k, d, 1e-6, 1.0);
    let v = rng.vec(nmax * hv * d);
    let g: Vec<f32> = rng.vec(nmax * hv).iter().map(|x| -0.1 - x.abs()).collect();
    let beta: Vec<f32> = rng
        .vec(nmax * hv)
        .iter()
        .map(|x| 1.0 / (1.0 + (-x).exp()))
        .collect();
    let s0 = rng.vec(hv * d * d);
    // `ROWS=1`: q, k and v side by side in one row per token, as a model's
    // convolution output holds them (`[q | k | v]`, the rows far apart).
    let rows_like_model = std::env::var("ROWS").is_ok_and(|v| v == "1");
    let (kd, vd) = (hk * d, hv * d);
    let ch = 2 * kd + vd;
    let x: Vec<f32> = if rows_like_model {
        let mut x = vec![0f32; nmax * ch];
        for t in 0..nmax {
            x[t * ch..t * ch + kd].copy_from_slice(&q[t * kd..(t + 1) * kd]);
            x[t * ch + kd..t * ch + 2 * kd].copy_from_slice(&k[t * kd..(t + 1) * kd]);
            x[t * ch + 2 * kd..(t + 1) * ch].copy_from_slice(&v[t * vd..(t + 1) * vd]);
        }
        x
    } else {
        Vec::new()
    };
    let chunk: usize = std::env::var("CHUNK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CHUNK);
    println!("{threads} thread(s), Hk {hk}, Hv {hv}, d {d}; chunk {chunk}; ms per call, CPU time with 1 thread (ratio chunked / recurrence)");
    // `N=512`: that length alone (for a profile of one shape).
    let only: Option<usize> = std::env::var("N").ok().and_then(|v| v.parse().ok());
    for n in [1, 4, 8, 16, 32, 64, 128, 512] {
        if only.is_some_and(|o| o != n) {
            continue;
        }
        let inp = if rows_like_model {
            DeltaInputs {
                q: &x,
                k: &x[kd..],
                ld_qk: ch,
                v: &x[2 * kd..],
                ld_v: ch,
                g: &g[..n * hv],
                beta: &beta[..n * hv],
            }
        } else {
            DeltaInputs {
                q: &q,
                k: &k,
                ld_qk: kd,
                v: &v,
                ld_v: vd,
                g: &g[..n * hv],
                beta: &beta[..n * hv],
            }
        };
        let mut out = vec![0f32; n * hv * d];
        let mut s = s0.clone();
        let reps = std::env::var("REPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or((4096 / n).clamp(8, 400));
        // `ONLY_CHUNKED=1`: the chunked form alone (for a profile).
        let scan = std::env::var("ONLY_CHUNKED").is_err();
        let t_scan = if scan {
            time(reps, threads, || {
                s.copy_from_slice(&s0);
                gated_delta_scan(&pool, dims, &mut s, inp, &mut out, n);
            })
        } else {
            f64::NAN
        };
        let t_chunk = time(reps, threads, || {
            s.copy_from_slice(&s0);
            delta_chunked(&pool, dims, chunk, &mut s, inp, &mut out, n);
        });
        println!(
            "n {n:4}: recurrence {:8.3} ms, chunked {:8.3} ms ({:.2})",
            t_scan * 1e3,
            t_chunk * 1e3,
            t_chunk / t_scan
        );
    }
}
