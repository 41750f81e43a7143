//! Rotary position embedding.

/// Which lanes form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent lanes `(2i, 2i+1)` (llama.cpp "normal"; Llama-family GGUFs
    /// whose Q/K rows the converter permuted).
    Normal,
    /// Halves `(i, i + n_rot/2)` (NeoX / Hugging Face `rotate_half`).
    Neox,
}

/// Rotates the first `n_rot` lanes of every head in place.
///
/// `x`: `[n_tokens, n_heads, head_dim]`; `positions`: `[n_tokens]`.
/// Pair `i` (0 ≤ i < n_rot/2) turns by `pos · freq_scale · freq_base^(−2i/n_rot)`
/// (the inverse frequencies computed in f32 as Hugging Face does).
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    n_rot: usize,
    positions: &[usize],
    freq_base: f32,
    freq_scale: f32,
    style: RopeStyle,
) {
    let n_tokens = positions.len();
    assert_eq!(
        x.len(),
        n_tokens * n_heads * head_dim,
        "rope: x is not [n_tokens, n_heads, head_dim]"
    );
    assert!(
        n_rot <= head_dim && n_rot.is_multiple_of(2),
        "rope: n_rot must be even and <= head_dim"
    );
    let half = n_rot / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / freq_base.powf((2 * i) as f32 / n_rot as f32))
        .collect();
    let mut cs = vec![(0f32, 0f32); half];
    for (t, &pos) in positions.iter().enumerate() {
        for (c, f) in cs.iter_mut().zip(&inv_freq) {
            let ang = (pos as f32 * freq_scale) * f;
            let (s, co) = (ang as f64).sin_cos();
            *c = (co as f32, s as f32);
        }
        let xt = &mut x[t * n_heads * head_dim..(t + 1) * n_heads * head_dim];
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
        let mut x = orig.clone();
        rope(&mut x, 3, 8, 8, &[0, 0], 10000.0, 1.0, RopeStyle::Neox);
        assert_eq!(x, orig);
        let mut x = orig.clone();
        rope(&mut x, 3, 8, 4, &[5, 17], 10000.0, 1.0, RopeStyle::Normal);
        // lanes beyond n_rot untouched
        for h in 0..6 {
            assert_eq!(x[h * 8 + 4..h * 8 + 8], orig[h * 8 + 4..h * 8 + 8]);
            let n0: f32 = orig[h * 8..h * 8 + 4].iter().map(|v| v * v).sum();
            let n1: f32 = x[h * 8..h * 8 + 4].iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-5);
        }
    }

    #[test]
    fn styles_agree_on_permuted_lanes() {
        // Neox on [a0 a1 | b0 b1] equals Normal on [a0 b0 a1 b1].
        let neox_in = [1.0f32, 2.0, 3.0, 4.0];
        let norm_in = [1.0f32, 3.0, 2.0, 4.0];
        let (mut a, mut b) = (neox_in, norm_in);
        rope(&mut a, 1, 4, 4, &[3], 100.0, 1.0, RopeStyle::Neox);
        rope(&mut b, 1, 4, 4, &[3], 100.0, 1.0, RopeStyle::Normal);
        assert!((a[0] - b[0]).abs() < 1e-6 && (a[2] - b[1]).abs() < 1e-6);
        assert!((a[1] - b[2]).abs() < 1e-6 && (a[3] - b[3]).abs() < 1e-6);
        // pair 0 turns by exactly pos radians
        let (s, c) = 3f32.sin_cos();
        assert!((a[0] - (c - 3.0 * s)).abs() < 1e-5);
    }
}
