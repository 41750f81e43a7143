//! A low-rank adapter beside a weight matrix `W` `[out, in]`:
//! `y = W·x + B·(A·x)`, `A` `[rank, in]`, `B` `[out, rank]` — Zamba2's
//! per-use adapters on its shared block's projections. Stored as llama.cpp
//! stores adapters: `NAME.lora_a` (ggml ne `[in, rank]`) and `NAME.lora_b`
//! (ne `[rank, out]`) beside the weight `NAME`.

use crate::models::weights::{Loader, Matrix};
use crate::models::ModelError;
use coil_gguf::GgufFile;
use coil_kernels::{matmul, Scratch, ThreadPool};

pub struct Lora {
    /// `[rank, in]`
    pub a: Matrix,
    /// `[out, rank]`
    pub b: Matrix,
}

impl Lora {
    /// Loads `{weight}.lora_a` and `{weight}.lora_b` for a weight `[out,
    /// in]`; the rank is `lora_a`'s, and `lora_b` must agree with it.
    pub fn load(ld: &Loader, weight: &str, out: usize, inp: usize) -> Result<Self, ModelError> {
        let (na, nb) = (format!("{weight}.lora_a"), format!("{weight}.lora_b"));
        let info = ld
            .file
            .tensor_info(&na)
            .ok_or_else(|| ModelError::MissingTensor(na.clone()))?;
        let rank = match info.dims.as_slice() {
            [i, r] | [i, r, 1] if *i == inp as u64 && *r >= 1 && *r <= inp.max(out) as u64 => {
                *r as usize
            }
            _ => {
                return Err(ModelError::Tensor {
                    name: na,
                    reason: format!(
                        "shape {:?} is not [{inp}, rank] with 1 ≤ rank ≤ {} (an adapter of {weight}, [{out}, {inp}])",
                        info.dims,
                        inp.max(out)
                    ),
                })
            }
        };
        if !ld.has(&nb) {
            return Err(ModelError::MissingTensor(nb));
        }
        Ok(Lora {
            a: ld.matrix(&na, rank, inp)?,
            b: ld.matrix(&nb, out, rank)?,
        })
    }

    pub fn rank(&self) -> usize {
        self.a.rows
    }

    /// `y += B·(A·x)` for the `n` rows of `x` (`[n, in]`, `y` `[n, out]`).
    pub fn add(&self, file: &GgufFile, pool: &ThreadPool, x: &[f32], y: &mut [f32], n: usize) {
        let mut t = Scratch::dirty(n * self.rank());
        matmul(pool, &self.a.get(file), x, &mut t, n);
        let mut u = Scratch::dirty(n * self.b.rows);
        matmul(pool, &self.b.get(file), &t, &mut u, n);
        y.iter_mut().zip(u.iter()).for_each(|(y, u)| *y += u);
    }
}
