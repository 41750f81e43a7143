//! On-the-fly quantization of f32 activations for the integer dot products:
//! Q8_0-style (32 values per scale) for Q8_0 / Q4_0 / IQ4_NL weights and
//! Q8_K-style (256 values per scale, sums per 16) for K-quants and IQ4_XS.
//! Scales are kept in f32 (ggml rounds the Q8_0 scale to f16; this is an
//! internal buffer, so we keep the extra precision).

/// Activations of `n_tokens` rows of `cols` values, quantized to i8.
#[derive(Default, Debug, Clone)]
pub struct QuantAct {
    /// `[n_tokens, cols]` quantized values.
    pub qs: Vec<i8>,
    /// One scale per block: `[n_tokens, cols / block]`.
    pub d: Vec<f32>,
    /// Sums of `qs` per group: Q8_0 style per block of 32, Q8_K style per 16.
    pub sums: Vec<i16>,
    pub cols: usize,
}

impl QuantAct {
    /// Quantizes `x` (`[n_tokens, cols]`) with 32 values per scale.
    pub fn q8_0(x: &[f32], cols: usize) -> QuantAct {
        let mut a = QuantAct::default();
        a.fill(x, cols, 32, 32);
        a
    }

    /// Quantizes `x` (`[n_tokens, cols]`) with 256 values per scale, sums per 16.
    pub fn q8_k(x: &[f32], cols: usize) -> QuantAct {
        let mut a = QuantAct::default();
        a.fill(x, cols, 256, 16);
        a
    }

    fn fill(&mut self, x: &[f32], cols: usize, block: usize, group: usize) {
        assert!(cols.is_multiple_of(block) && x.len().is_multiple_of(cols.max(1)));
        self.cols = cols;
        self.qs.clear();
        self.qs.resize(x.len(), 0);
        self.d.clear();
        self.d.resize(x.len() / block, 0.0);
        self.sums.clear();
        self.sums.resize(x.len() / group, 0);
        for ((xb, qb), d) in x
            .chunks_exact(block)
            .zip(self.qs.chunks_exact_mut(block))
            .zip(self.d.iter_mut())
        {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            if amax == 0.0 || !amax.is_finite() {
                *d = if amax.is_finite() { 0.0 } else { amax };
                qb.fill(0);
                continue;
            }
            *d = amax / 127.0;
            let id = 127.0 / amax;
            for (q, v) in qb.iter_mut().zip(xb) {
                *q = (v * id).round().clamp(-127.0, 127.0) as i8;
            }
        }
        for (s, qg) in self.sums.iter_mut().zip(self.qs.chunks_exact(group)) {
            *s = qg.iter().map(|&q| q as i16).sum();
        }
    }

    /// Values of token `t`.
    #[inline]
    pub fn qs_row(&self, t: usize) -> &[i8] {
        &self.qs[t * self.cols..(t + 1) * self.cols]
    }
}
