//! Gated hyper-connections (Qwen4-Exp): the residual stream is `hc` parallel
//! streams of `d` (`[n, hc·d]`, the embedding repeated `hc` times at the
//! start) instead of one, and each block reads a learned mix of them and
//! writes back into each with its own weight:
//!
//! ```text
//! x̂ = RMSNorm per stream of d (x)·w            (hc_norm, (1 + w) baked in)
//! m = sigmoid(up(silu(down(x̂) / hc)))          (low rank: down [r, hc·d], up [hc·d, r])
//! block input  = mean over streams of (m ⊙ x̂)   ([n, d]; in place of a layer norm)
//! inject       = 2·sigmoid(inject(x̂) / hc)      ([n, hc])
//! x[s] += inject[s] · block(…)                  (each stream s)
//! ```
//!
//! The final mixer (`output_hc_*`, no inject) is the model's output norm.

use crate::models::weights::{Loader, Matrix};
use crate::models::ModelError;
use coil_gguf::GgufFile;
use coil_kernels::ops::norm::rms_norm;
use coil_kernels::{matmul, Scratch, ThreadPool};

/// A grouped RMSNorm weight of `len` values (`[len]`, or llama.cpp's
/// `[d, hc]` view of it).
pub fn grouped_weight(
    ld: &Loader,
    name: &str,
    d: usize,
    hc: usize,
) -> Result<Vec<f32>, ModelError> {
    match ld.file.tensor_info(name).map(|t| t.dims.len()) {
        Some(2) => ld.vector(name, &[d, hc]),
        _ => ld.vector(name, &[d * hc]),
    }
}

/// `y = RMSNorm(x)·w` per group of `d` lanes (`x`, `y`: `[n, hc·d]`; `w`:
/// `[hc·d]`).
pub fn grouped_rms_norm(
    pool: &ThreadPool,
    x: &[f32],
    w: &[f32],
    eps: f32,
    d: usize,
    y: &mut [f32],
) {
    let row = w.len();
    pool.rows_mut(y, row, 16, |r0, part| {
        for (i, yr) in part.chunks_exact_mut(row).enumerate() {
            let xr = &x[(r0 + i) * row..(r0 + i + 1) * row];
            for ((xs, ys), ws) in xr
                .chunks_exact(d)
                .zip(yr.chunks_exact_mut(d))
                .zip(w.chunks_exact(d))
            {
                rms_norm(xs, Some(ws), eps, ys, d);
            }
        }
    });
}

pub struct HyperConnection {
    pub hc: usize,
    pub d: usize,
    pub eps: f32,
    /// `[hc·d]`
    pub norm: Vec<f32>,
    /// `[rank, hc·d]`
    pub down: Matrix,
    /// `[hc·d, rank]`
    pub up: Matrix,
    /// `[hc, hc·d]`; `None` for the final mixer.
    pub inject: Option<Matrix>,
}

impl HyperConnection {
    /// Loads `{prefix}_{norm,down,up}.weight` and, with `inject`,
    /// `{prefix}_inject.weight`.
    pub fn load(
        ld: &Loader,
        prefix: &str,
        (hc, d, rank): (usize, usize, usize),
        eps: f32,
        inject: bool,
    ) -> Result<Self, ModelError> {
        let n = |t: &str| format!("{prefix}_{t}.weight");
        Ok(HyperConnection {
            hc,
            d,
            eps,
            norm: grouped_weight(ld, &n("norm"), d, hc)?,
            down: ld.matrix(&n("down"), rank, hc * d)?,
            up: ld.matrix(&n("up"), hc * d, rank)?,
            inject: match inject {
                true => Some(ld.matrix(&n("inject"), hc, hc * d)?),
                false => None,
            },
        })
    }

    /// The block input `[n, d]` from the streams `x` (`[n, hc·d]`) into
    /// `mixed`, and (with an inject matrix) each stream's write-back weight
    /// `[n, hc]` into `inject`.
    pub fn mix(
        &self,
        file: &GgufFile,
        pool: &ThreadPool,
        x: &[f32],
        mixed: &mut [f32],
        inject: Option<&mut [f32]>,
    ) {
        let (hc, d) = (self.hc, self.d);
        let w = hc * d;
        let n = x.len() / w;
        let inv = 1.0 / hc as f32;
        let mut xn = Scratch::dirty(n * w);
        grouped_rms_norm(pool, x, &self.norm, self.eps, d, &mut xn);
        let mut lo = Scratch::dirty(n * self.down.rows);
        matmul(pool, &self.down.get(file), &xn, &mut lo, n);
        lo.iter_mut().for_each(|v| {
            let s = *v * inv;
            *v = s / (1.0 + (-s).exp());
        });
        let mut gate = Scratch::dirty(n * w);
        matmul(pool, &self.up.get(file), &lo, &mut gate, n);
        pool.rows_mut(&mut mixed[..n * d], d, 16, |r0, part| {
            for (i, m) in part.chunks_exact_mut(d).enumerate() {
                let r = r0 + i;
                m.fill(0.0);
                let (g, v) = (&gate[r * w..(r + 1) * w], &xn[r * w..(r + 1) * w]);
                for (gs, vs) in g.chunks_exact(d).zip(v.chunks_exact(d)) {
                    for ((o, &gi), &vi) in m.iter_mut().zip(gs).zip(vs) {
                        *o += vi / (1.0 + (-gi).exp());
                    }
                }
                m.iter_mut().for_each(|o| *o *= inv);
            }
        });
        if let (Some(m), Some(out)) = (&self.inject, inject) {
            matmul(pool, &m.get(file), &xn, &mut out[..n * hc], n);
            out[..n * hc]
                .iter_mut()
                .for_each(|v| *v = 2.0 / (1.0 + (-*v * inv).exp()));
        }
    }
}

/// `x[r, s, :] += w[r, s]·y[r, :]` for every stream `s` (`x`: `[n, hc·d]`,
/// `y`: `[n, d]`, `w`: `[n, hc]`).
pub fn combine(pool: &ThreadPool, x: &mut [f32], y: &[f32], w: &[f32], hc: usize, d: usize) {
    pool.rows_mut(x, hc * d, 16, |r0, part| {
        for (i, xr) in part.chunks_exact_mut(hc * d).enumerate() {
            let r = r0 + i;
            let yr = &y[r * d..(r + 1) * d];
            for (xs, &ws) in xr.chunks_exact_mut(d).zip(&w[r * hc..(r + 1) * hc]) {
                xs.iter_mut().zip(yr).for_each(|(a, b)| *a += ws * b);
            }
        }
    });
}
