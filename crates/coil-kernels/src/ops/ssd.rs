//! Chunked "state space duality" (SSD) scan for Mamba-2 prompt processing
//! (Dao & Gu 2024, §6): within a chunk of `L` tokens, with `c = cumsum(dt·A)`,
//!
//! ```text
//! Y_diag[l] = Σ_{s≤l} (C_l·B_s) · exp(c_l − c_s) · dt_s · x_s
//! Y_off[l]  = exp(c_l) · (S · C_l)                 (the state entering the chunk)
//! S'        = exp(c_{L−1}) · S + Σ_s exp(c_{L−1} − c_s) · dt_s · x_s ⊗ B_s
//! y         = Y_diag + Y_off + D · x
//! ```
//!
//! The same result as the token-by-token recurrence ([`super::ssm::mamba2_scan`])
//! up to f32 rounding, with the state read and written once per chunk
//! instead of once per token and `C·Bᵀ` shared by the heads of a group.

use super::ssm::Mamba2Dims;
use crate::matmul::SendPtr;
use crate::multiversion;
use crate::pool::ThreadPool;
use crate::simd::math::exp_fast;

/// Tokens per chunk: a chunk's `C·Bᵀ` (`L × L`), its slice of x, B, C and
/// one head's state (`P × N`) stay in L1/L2 at this size.
pub const DEFAULT_CHUNK: usize = 64;

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// One head over all chunks. `state`: `[P, N]`; `y` points at `[T, H, P]`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn ssd_head(
    dims: &Mamba2Dims,
    chunk: usize,
    h: usize,
    state: &mut [f32],
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    b: &[f32],
    c: &[f32],
    d: Option<&[f32]>,
    y: *mut f32,
    n_tokens: usize,
) {
    let (hn, p, n) = (dims.n_head, dims.head_dim, dims.d_state);
    let g = h / (hn / dims.n_group);
    let gn = dims.n_group * n;
    let ah = a[h];
    let dh = d.map_or(0.0, |d| d[h]);
    let mut cs = vec![0f32; chunk];
    let mut cb = vec![0f32; chunk * chunk];
    let mut yl = vec![0f32; p];
    let mut t0 = 0;
    while t0 < n_tokens {
        let len = chunk.min(n_tokens - t0);
        // c = cumsum(dt·A) within the chunk.
        let mut acc = 0f32;
        for l in 0..len {
            acc += dt[(t0 + l) * hn + h] * ah;
            cs[l] = acc;
        }
        let bs = |s: usize| &b[(t0 + s) * gn + g * n..(t0 + s) * gn + (g + 1) * n];
        let cl = |l: usize| &c[(t0 + l) * gn + g * n..(t0 + l) * gn + (g + 1) * n];
        let xs = |s: usize| &x[((t0 + s) * hn + h) * p..((t0 + s) * hn + h + 1) * p];
        // C·Bᵀ, lower triangle.
        for l in 0..len {
            let cr = cl(l);
            for s in 0..=l {
                cb[l * chunk + s] = dot(cr, bs(s));
            }
        }
        for l in 0..len {
            // Y_off: exp(c_l) · S·C_l, then D·x.
            let el = exp_fast(cs[l]);
            let cr = cl(l);
            let xl = xs(l);
            for (i, v) in yl.iter_mut().enumerate() {
                *v = el * dot(&state[i * n..(i + 1) * n], cr) + dh * xl[i];
            }
            // Y_diag.
            for s in 0..=l {
                let w = cb[l * chunk + s] * exp_fast(cs[l] - cs[s]) * dt[(t0 + s) * hn + h];
                for (v, xv) in yl.iter_mut().zip(xs(s)) {
                    *v += w * xv;
                }
            }
            // SAFETY: head h owns y[t, h, ..] for every t.
            let out = unsafe { std::slice::from_raw_parts_mut(y.add(((t0 + l) * hn + h) * p), p) };
            out.copy_from_slice(&yl);
        }
        // S' = exp(c_last)·S + Σ_s exp(c_last − c_s)·dt_s · x_s ⊗ B_s.
        let last = cs[len - 1];
        let decay = exp_fast(last);
        let coef: Vec<f32> = (0..len)
            .map(|s| exp_fast(last - cs[s]) * dt[(t0 + s) * hn + h])
            .collect();
        for i in 0..p {
            let row = &mut state[i * n..(i + 1) * n];
            for v in row.iter_mut() {
                *v *= decay;
            }
            for (s, &cf) in coef.iter().enumerate() {
                let u = cf * xs(s)[i];
                for (v, bv) in row.iter_mut().zip(bs(s)) {
                    *v += u * bv;
                }
            }
        }
        t0 += len;
    }
}

#[allow(clippy::too_many_arguments)]
fn ssd_heads(
    dims: &Mamba2Dims,
    chunk: usize,
    h0: usize,
    h1: usize,
    state: *mut f32,
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    b: &[f32],
    c: &[f32],
    d: Option<&[f32]>,
    y: *mut f32,
    n_tokens: usize,
) {
    let hs = dims.head_dim * dims.d_state;
    for h in h0..h1 {
        // SAFETY: head h owns state[h*hs..(h+1)*hs].
        let st = unsafe { std::slice::from_raw_parts_mut(state.add(h * hs), hs) };
        ssd_head(dims, chunk, h, st, x, dt, a, b, c, d, y, n_tokens);
    }
}

multiversion!(fn ssd_heads_mv(
    dims: &Mamba2Dims, chunk: usize, h0: usize, h1: usize, state: *mut f32, x: &[f32],
    dt: &[f32], a: &[f32], b: &[f32], c: &[f32], d: Option<&[f32]>, y: *mut f32, n_tokens: usize
) => ssd_heads);

/// Mamba-2 over `n_tokens` tokens with the chunked SSD algorithm; same
/// arguments and result as [`super::ssm::mamba2_scan`]:
///
/// * `state`: `[n_head, head_dim, d_state]`, updated in place
/// * `x`: `[n_tokens, n_head, head_dim]`; `dt`: `[n_tokens, n_head]` (activated)
/// * `a`: `[n_head]` (= −exp(A_log)); `d`: `[n_head]` or `None`
/// * `b`, `c`: `[n_tokens, n_group, d_state]`; `y`: `[n_tokens, n_head, head_dim]`
/// * `chunk`: tokens per chunk (e.g. [`DEFAULT_CHUNK`])
#[allow(clippy::too_many_arguments)]
pub fn mamba2_chunked_scan(
    pool: &ThreadPool,
    dims: Mamba2Dims,
    chunk: usize,
    state: &mut [f32],
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    b: &[f32],
    c: &[f32],
    d: Option<&[f32]>,
    y: &mut [f32],
    n_tokens: usize,
) {
    let Mamba2Dims {
        n_head: hn,
        head_dim: p,
        n_group: g,
        d_state: n,
    } = dims;
    assert!(chunk > 0, "ssd: chunk must be at least 1");
    assert!(
        g > 0 && hn.is_multiple_of(g),
        "ssd: n_head must be a multiple of n_group"
    );
    assert_eq!(state.len(), hn * p * n, "ssd: state is not [H, P, N]");
    assert_eq!(x.len(), n_tokens * hn * p);
    assert_eq!(y.len(), n_tokens * hn * p);
    assert_eq!(dt.len(), n_tokens * hn);
    assert_eq!(a.len(), hn);
    assert!(b.len() == n_tokens * g * n && c.len() == b.len());
    if let Some(d) = d {
        assert_eq!(d.len(), hn);
    }
    if n_tokens == 0 {
        return;
    }
    let sp = SendPtr(state.as_mut_ptr());
    let yp = SendPtr(y.as_mut_ptr());
    let grain = (hn / (pool.n_threads() * 4)).max(1);
    pool.parallel_for(hn, grain, |hr, _| {
        ssd_heads_mv(
            &dims,
            chunk,
            hr.start,
            hr.end,
            sp.get(),
            x,
            dt,
            a,
            b,
            c,
            d,
            yp.get(),
            n_tokens,
        );
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ops::ssm::mamba2_scan;

    struct Lcg(u64);
    impl Lcg {
        fn f(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn v(&mut self, n: usize, s: f32) -> Vec<f32> {
            (0..n).map(|_| self.f() * s).collect()
        }
    }

    /// Chunked SSD equals the sequential recurrence, for chunk sizes that do
    /// and do not divide the token count, from a non-zero starting state.
    pub fn chunked_matches_sequential() {
        let pool = ThreadPool::new(2);
        let mut r = Lcg(3);
        for (hn, p, g, n, t) in [
            (4, 16, 2, 16, 37),
            (8, 24, 4, 12, 64),
            (2, 8, 1, 20, 5),
            (6, 64, 3, 128, 70),
        ] {
            let dims = Mamba2Dims {
                n_head: hn,
                head_dim: p,
                n_group: g,
                d_state: n,
            };
            let x = r.v(t * hn * p, 1.0);
            let dt: Vec<f32> = r
                .v(t * hn, 1.0)
                .iter()
                .map(|v| 0.05 + 0.5 * v.abs())
                .collect();
            let a: Vec<f32> = r.v(hn, 1.0).iter().map(|v| -0.2 - v.abs()).collect();
            let b = r.v(t * g * n, 1.0);
            let c = r.v(t * g * n, 1.0);
            let d = r.v(hn, 1.0);
            let s0 = r.v(hn * p * n, 0.5);
            let mut s_ref = s0.clone();
            let mut y_ref = vec![0f32; t * hn * p];
            mamba2_scan(
                &pool,
                dims,
                &mut s_ref,
                &x,
                &dt,
                &a,
                &b,
                &c,
                Some(&d),
                &mut y_ref,
                t,
            );
            for chunk in [1, 4, 8, 64, 100] {
                let mut s = s0.clone();
                let mut y = vec![0f32; t * hn * p];
                mamba2_chunked_scan(
                    &pool,
                    dims,
                    chunk,
                    &mut s,
                    &x,
                    &dt,
                    &a,
                    &b,
                    &c,
                    Some(&d),
                    &mut y,
                    t,
                );
                let my = y_ref.iter().fold(0f32, |m, v| m.max(v.abs()));
                let dy = y
                    .iter()
                    .zip(&y_ref)
                    .fold(0f32, |m, (u, v)| m.max((u - v).abs()));
                assert!(
                    dy <= 2e-5 * my,
                    "y: chunk {chunk} {hn}x{p} g{g} n{n}: {dy} of {my}"
                );
                let ms = s_ref.iter().fold(0f32, |m, v| m.max(v.abs()));
                let ds = s
                    .iter()
                    .zip(&s_ref)
                    .fold(0f32, |m, (u, v)| m.max((u - v).abs()));
                assert!(ds <= 2e-5 * ms, "state: chunk {chunk}: {ds} of {ms}");
            }
        }
    }

    #[test]
    fn chunked_equals_sequential() {
        chunked_matches_sequential();
    }
}

#[cfg(test)]
mod timing {
    use super::*;
    use crate::ops::ssm::mamba2_scan;

    /// `cargo test --release -p coil-kernels ssd_timing -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn ssd_timing() {
        let pool = ThreadPool::new(2);
        let dims = Mamba2Dims {
            n_head: 32,
            head_dim: 64,
            n_group: 1,
            d_state: 128,
        };
        let t = 512;
        let x = vec![0.1f32; t * 32 * 64];
        let dt = vec![0.05f32; t * 32];
        let a = vec![-0.5f32; 32];
        let b = vec![0.01f32; t * 128];
        let c = vec![0.02f32; t * 128];
        let mut y = vec![0f32; t * 32 * 64];
        for chunk in [0, 32, 64, 128] {
            let mut s = vec![0f32; 32 * 64 * 128];
            let t0 = std::time::Instant::now();
            for _ in 0..5 {
                if chunk == 0 {
                    mamba2_scan(&pool, dims, &mut s, &x, &dt, &a, &b, &c, None, &mut y, t);
                } else {
                    mamba2_chunked_scan(
                        &pool, dims, chunk, &mut s, &x, &dt, &a, &b, &c, None, &mut y, t,
                    );
                }
            }
            eprintln!(
                "chunk {chunk}: {:.2} ms per 512 tokens",
                t0.elapsed().as_secs_f64() * 1e3 / 5.0
            );
        }
    }
}
