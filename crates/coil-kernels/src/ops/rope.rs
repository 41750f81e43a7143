//! Rotary position embedding.

use crate::pool::ThreadPool;

/// Which lanes form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent lanes `(2i, 2i+1)` (llama.cpp "normal"; Llama-family GGUFs
    /// whose Q/K rows the converter permuted).
    Normal,
    /// Halves `(i, i + n_rot/2)` (NeoX / Hugging Face `rotate_half`).
    Neox,
}

/// The rotation of every (token, pair): `(cos, sin)` of
/// `pos · freq_scale · freq_base^(−2i/n_rot)`, `[n_tokens][n_rot / 2]` (the
/// inverse frequencies and angles in f32 as Hugging Face computes them,
/// the cosine and sine rounded from f64). Computed once per call for the
/// queries and the keys alike, tokens spread over `pool`.
pub fn rope_table(
    pool: &ThreadPool,
    positions: &[usize],
    n_rot: usize,
    freq_base: f32,
    freq_scale: f32,
) -> Vec<(f32, f32)> {
    rope_table_factors(pool, positions, n_rot, freq_base, freq_scale, None)
}

/// [`rope_table`] with pair `i`'s frequency divided by `freq_factors[i]`
/// (llama.cpp's `rope_freqs` tensor, `[n_rot / 2]`): a factor of 1e30
/// leaves the pair unrotated, as "proportional" RoPE's zero frequencies.
pub fn rope_table_factors(
    pool: &ThreadPool,
    positions: &[usize],
    n_rot: usize,
    freq_base: f32,
    freq_scale: f32,
    freq_factors: Option<&[f32]>,
) -> Vec<(f32, f32)> {
    assert!(n_rot.is_multiple_of(2), "rope: n_rot must be even");
    let half = n_rot / 2;
    if let Some(f) = freq_factors {
        assert_eq!(f.len(), half, "rope: freq_factors is not [n_rot/2]");
    }
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| {
            let f = 1.0 / freq_base.powf((2 * i) as f32 / n_rot as f32);
            freq_factors.map_or(f, |ff| f / ff[i])
        })
        .collect();
    let mut table = vec![(0f32, 0f32); positions.len() * half];
    if half == 0 {
        return table;
    }
    pool.rows_mut(&mut table, half, 64, |t0, part| {
        for (i, row) in part.chunks_exact_mut(half).enumerate() {
            let pos = positions[t0 + i] as f32;
            for (c, f) in row.iter_mut().zip(&inv_freq) {
                let ang = (pos * freq_scale) * f;
                let (s, co) = (ang as f64).sin_cos();
                *c = (co as f32, s as f32);
            }
        }
    });
    table
}

/// Rotates the first `n_rot` lanes of every head in place by `table` (from
/// [`rope_table`], one row per token).
///
/// `x`: `[n_tokens, n_heads, head_dim]`.
pub fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    n_rot: usize,
    table: &[(f32, f32)],
    style: RopeStyle,
) {
    assert!(
        n_rot <= head_dim && n_rot.is_multiple_of(2),
        "rope: n_rot must be even and <= head_dim"
    );
    let half = n_rot / 2;
    let n_tokens = x.len() / (n_heads * head_dim).max(1);
    assert_eq!(
        x.len(),
        n_tokens * n_heads * head_dim,
        "rope: x is not [n_tokens, n_heads, head_dim]"
    );
    assert_eq!(
        table.len(),
        n_tokens * half,
        "rope: table is not [n_tokens, n_rot/2]"
    );
    if half == 0 {
        return;
    }
    for (xt, cs) in x
        .chunks_exact_mut(n_heads * head_dim)
        .zip(table.chunks_exact(half))
    {
        for head in xt.chunks_exact_mut(head_dim) {
            match style {
                RopeStyle::Normal => {
                    for (i, &(c, s)) in cs.iter().enumerate() {
                        let (a, b) = (head[2 * i], head[2 * i + 1]);
                        head[2 * i] = a * c - b * s;
                        head[2 * i + 1] = a * s + b * c;
                    }
                }
                RopeStyle::Neox => {
                    for (i, &(c, s)) in cs.iter().enumerate() {
                        let (a, b) = (head[i], head[i + half]);
                        head[i] = a * c - b * s;
                        head[i + half] = a * s + b * c;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_norm_preserved() {
        let orig: Vec<f32> = (0..2 * 3 * 8).map(|i| (i as f32 * 0.37).sin()).collect();
        let pool = ThreadPool::new(2);
        let mut x = orig.clone();
        let t = rope_table(&pool, &[0, 0], 8, 10000.0, 1.0);
        rope(&mut x, 3, 8, 8, &t, RopeStyle::Neox);
        assert_eq!(x, orig);
        let mut x = orig.clone();
        let t = rope_table(&pool, &[5, 17], 4, 10000.0, 1.0);
        rope(&mut x, 3, 8, 4, &t, RopeStyle::Normal);
        // lanes beyond n_rot untouched
        for h in 0..6 {
            assert_eq!(x[h * 8 + 4..h * 8 + 8], orig[h * 8 + 4..h * 8 + 8]);
            let n0: f32 = orig[h * 8..h * 8 + 4].iter().map(|v| v * v).sum();
            let n1: f32 = x[h * 8..h * 8 + 4].iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-5);
        }
    }

    #[test]
    fn table_spread_over_threads_matches_one_thread() {
        let pos: Vec<usize> = (0..300).map(|i| i * 7 + 3).collect();
        let a = rope_table(&ThreadPool::new(1), &pos, 64, 10000.0, 0.5);
        let b = rope_table(&ThreadPool::new(2), &pos, 64, 10000.0, 0.5);
        assert_eq!(a, b);
        let (c, s) = a[5 * 32 + 1];
        let ang = (38.0f32 * 0.5) * (1.0 / 10000f32.powf(2.0 / 64.0));
        assert!((c - ang.cos()).abs() < 1e-6 && (s - ang.sin()).abs() < 1e-6);
    }

    #[test]
    fn styles_agree_on_permuted_lanes() {
        // Neox on [a0 a1 | b0 b1] equals Normal on [a0 b0 a1 b1].
        let neox_in = [1.0f32, 2.0, 3.0, 4.0];
        let norm_in = [1.0f32, 3.0, 2.0, 4.0];
        let (mut a, mut b) = (neox_in, norm_in);
        let t = rope_table(&ThreadPool::new(1), &[3], 4, 100.0, 1.0);
        rope(&mut a, 1, 4, 4, &t, RopeStyle::Neox);
        rope(&mut b, 1, 4, 4, &t, RopeStyle::Normal);
        assert!((a[0] - b[0]).abs() < 1e-6 && (a[2] - b[1]).abs() < 1e-6);
        assert!((a[1] - b[2]).abs() < 1e-6 && (a[3] - b[3]).abs() < 1e-6);
        // pair 0 turns by exactly pos radians
        let (s, c) = 3f32.sin_cos();
        assert!((a[0] - (c - 3.0 * s)).abs() < 1e-5);
    }
}
