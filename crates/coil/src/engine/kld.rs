//! How far one model's next-token distributions are from another's: the
//! KL divergence, top-token agreement and perplexity change that
//! llama-perplexity's `--kl-divergence` reports, and the file of a base
//! model's log-probabilities it reads (`--kl-divergence-base`), in the same
//! format so the files interoperate.
//!
//! The file (native byte order, little-endian everywhere coil runs):
//!
//! | bytes | what |
//! |---|---|
//! | 8 | `_logits_` |
//! | 4 | `n_ctx` (i32): tokens per window |
//! | 4 | `n_vocab` (i32) |
//! | 4 | `n_chunk` (i32): windows |
//! | 4 · n_chunk · n_ctx | the windows' tokens (i32) |
//! | per window, per scored row | [`row_len`]`(n_vocab)` u16: the row's log-probabilities |
//!
//! A window scores rows `n_ctx/2 ..= n_ctx − 2` (each predicts the next
//! token), `n_ctx − 1 − n_ctx/2` rows. A row is stored in 16 bits per token
//! ([`encode_row`]): two f32 (the step `scale` and the lowest log-probability
//! kept, `min`), then `q_i` with `log p_i ≈ min + scale · q_i`; a row spans
//! at most 16 nats below its best token (lower ones read as that floor), so
//! a log-probability is within `scale / 2 ≤ 1.3e-4` of the model's.
//!
//! The divergence of a row is `KL(base ‖ q) = Σ_i p_i (log p_i − log q_i)`
//! over the base's tokens within 16 nats of its best (the rest carry less
//! than e⁻¹⁶ of probability each), as llama-perplexity sums it.

use std::io::{self, Read, Write};

/// Magic bytes of a log-probability file.
pub const MAGIC: &[u8; 8] = b"_logits_";

/// How far below its best token a stored row reaches, in nats.
pub const ROW_SPAN: f32 = 16.0;

/// u16 values per stored row: two f32 of header, the vocabulary rounded up
/// to an even count.
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Rows a window of `n_ctx` tokens scores (the second half, less the last).
pub fn scored_rows(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

/// `(index of the first maximum, ln Σ exp(l − max))` of a row of logits.
fn max_and_lse(logits: &[f32]) -> (usize, f32, f64) {
    let (mut imax, mut max) = (0, logits[0]);
    for (i, &l) in logits.iter().enumerate().skip(1) {
        if l > max {
            (imax, max) = (i, l);
        }
    }
    let sum: f64 = logits
        .iter()
        .map(|&l| f64::from(l - max).exp())
        .sum::<f64>();
    (imax, max, sum.ln())
}

/// Stores the log-softmax of `logits` in `out` (`row_len(logits.len())`
/// values) and returns the negative log-likelihood of `target`.
pub fn encode_row(logits: &[f32], target: u32, out: &mut [u16]) -> f64 {
    assert_eq!(out.len(), row_len(logits.len()));
    let (_, max, lse) = max_and_lse(logits);
    let min = logits
        .iter()
        .fold(max, |m, &l| m.min(l))
        .max(max - ROW_SPAN);
    let min_lp = (f64::from(min - max) - lse) as f32;
    let scale = (max - min) / 65535.0;
    let (head, q) = out.split_at_mut(4);
    for (h, f) in head.chunks_exact_mut(2).zip([scale, min_lp]) {
        let b = f.to_le_bytes();
        h[0] = u16::from_le_bytes([b[0], b[1]]);
        h[1] = u16::from_le_bytes([b[2], b[3]]);
    }
    q.fill(0);
    if scale > 0.0 {
        let inv = 1.0 / scale;
        for (q, &l) in q.iter_mut().zip(logits) {
            if l > min {
                *q = (inv * (l - min)).round_ties_even().clamp(0.0, 65535.0) as u16;
            }
        }
    }
    f64::from(max) + lse - f64::from(logits[target as usize])
}

/// The stored row's `(scale, min)`: `log p_i = min + scale · q_i`.
fn row_header(row: &[u16]) -> (f32, f32) {
    let f = |i: usize| {
        let (a, b) = (row[i].to_le_bytes(), row[i + 1].to_le_bytes());
        f32::from_le_bytes([a[0], a[1], b[0], b[1]])
    };
    (f(0), f(2))
}

/// The base model's log-probabilities of a stored row (`n_vocab` values).
pub fn decode_row(row: &[u16], n_vocab: usize) -> impl Iterator<Item = f32> + '_ {
    let (scale, min) = row_header(row);
    row[4..4 + n_vocab]
        .iter()
        .map(move |&q| scale * f32::from(q) + min)
}

/// One row compared: the model's logits against the base's stored row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowDivergence {
    /// `KL(base ‖ model)` in nats.
    pub kl: f64,
    /// The model's negative log-likelihood of the next token.
    pub nll: f64,
    /// The base's.
    pub nll_base: f64,
    /// Whether both put the same token first.
    pub same_top: bool,
}

/// `KL(base ‖ model)` and the rest for one row: `base` a stored row,
/// `logits` the model's, `target` the token that follows.
pub fn compare_row(base: &[u16], logits: &[f32], target: u32) -> RowDivergence {
    let n = logits.len();
    let (imax, max, lse) = max_and_lse(logits);
    let log_z = f64::from(max) + lse;
    let (mut kl, mut imax_base, mut best) = (0.0f64, 0usize, f32::NEG_INFINITY);
    for (i, lp) in decode_row(base, n).enumerate() {
        if lp > best {
            (imax_base, best) = (i, lp);
        }
        if lp > -ROW_SPAN {
            let lp = f64::from(lp);
            kl += lp.exp() * (lp - (f64::from(logits[i]) - log_z));
        }
    }
    let t = target as usize;
    RowDivergence {
        kl,
        nll: log_z - f64::from(logits[t]),
        nll_base: -f64::from(decode_row(base, n).nth(t).unwrap_or(f32::NEG_INFINITY)),
        same_top: imax == imax_base,
    }
}

/// `KL(p ‖ q)` between the softmaxes of two rows of f32 logits, in f64
/// without rounding the base (for measuring kernels, not files).
pub fn kl_logits(base: &[f32], logits: &[f32]) -> f64 {
    let (_, mb, lb) = max_and_lse(base);
    let (_, mq, lq) = max_and_lse(logits);
    let (zb, zq) = (f64::from(mb) + lb, f64::from(mq) + lq);
    base.iter()
        .zip(logits)
        .map(|(&b, &q)| {
            let lp = f64::from(b) - zb;
            let p = lp.exp();
            if p > 0.0 {
                p * (lp - (f64::from(q) - zq))
            } else {
                0.0
            }
        })
        .sum::<f64>()
        .max(0.0)
}

/// The index of the first largest logit.
pub fn argmax(logits: &[f32]) -> usize {
    max_and_lse(logits).0
}

/// Running sums over compared rows, and every row's KL and Δp for the
/// percentiles.
#[derive(Clone, Debug, Default)]
pub struct Divergence {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    same_top: usize,
    kls: Vec<f64>,
    /// `p − p_base` of the next token, per row.
    p_diffs: Vec<f64>,
}

/// A mean and its standard error.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub err: f64,
}

/// What llama-perplexity prints at the end of `--kl-divergence`.
#[derive(Clone, Debug, PartialEq)]
pub struct DivergenceSummary {
    pub rows: usize,
    pub ppl: Estimate,
    pub ppl_base: Estimate,
    /// Correlation of the per-row log-likelihoods.
    pub ln_ppl_correlation: f64,
    /// `ln(PPL / PPL_base)`.
    pub ln_ppl_ratio: Estimate,
    pub ppl_ratio: Estimate,
    /// `PPL − PPL_base`.
    pub ppl_diff: Estimate,
    pub kl_mean: Estimate,
    pub kl_max: f64,
    pub kl_p999: f64,
    pub kl_p99: f64,
    pub kl_p95: f64,
    pub kl_p90: f64,
    pub kl_median: f64,
    pub kl_p10: f64,
    pub kl_p5: f64,
    pub kl_p1: f64,
    pub kl_min: f64,
    /// Mean of `p − p_base` of the next token.
    pub dp_mean: Estimate,
    pub dp_max: f64,
    pub dp_p99: f64,
    pub dp_p95: f64,
    pub dp_median: f64,
    pub dp_p5: f64,
    pub dp_p1: f64,
    pub dp_min: f64,
    /// Root mean square of `p − p_base`.
    pub dp_rms: Estimate,
    /// Fraction of rows whose most likely token is the base's.
    pub same_top: Estimate,
}

/// Mean and standard error of a sum and sum of squares over `n` values.
fn mean_err(sum: f64, sum2: f64, n: usize) -> Estimate {
    if n == 0 {
        return Estimate {
            value: 0.0,
            err: 0.0,
        };
    }
    let m = sum / n as f64;
    let var = sum2 / n as f64 - m * m;
    let err = if var > 0.0 && n > 10 {
        (var / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    Estimate { value: m, err }
}

/// The `fraction` quantile of sorted values, interpolated between ranks.
fn quantile(sorted: &[f64], fraction: f64) -> f64 {
    let Some(&last) = sorted.last() else {
        return 0.0;
    };
    if fraction <= 0.0 {
        return sorted[0];
    }
    if fraction >= 1.0 {
        return last;
    }
    let p = fraction * (sorted.len() - 1) as f64;
    let i = p as usize;
    let f = p - i as f64;
    let next = sorted[(i + 1).min(sorted.len() - 1)];
    (1.0 - f) * sorted[i] + f * next
}

impl Divergence {
    pub fn add(&mut self, r: RowDivergence) {
        self.sum_nll += r.nll;
        self.sum_nll2 += r.nll * r.nll;
        self.sum_nll_base += r.nll_base;
        self.sum_nll_base2 += r.nll_base * r.nll_base;
        self.sum_nll_nll_base += r.nll * r.nll_base;
        self.same_top += usize::from(r.same_top);
        self.kls.push(r.kl);
        self.p_diffs.push((-r.nll).exp() - (-r.nll_base).exp());
    }

    pub fn rows(&self) -> usize {
        self.kls.len()
    }

    /// `(PPL, ln(PPL/PPL_base), mean KL, same-top fraction)` so far, for the
    /// per-window lines.
    pub fn running(&self) -> (f64, f64, f64, f64) {
        let n = self.rows().max(1) as f64;
        (
            (self.sum_nll / n).exp(),
            (self.sum_nll - self.sum_nll_base) / n,
            self.kls.iter().sum::<f64>() / n,
            self.same_top as f64 / n,
        )
    }

    pub fn summary(&self) -> DivergenceSummary {
        let n = self.rows();
        let ln_ppl = mean_err(self.sum_nll, self.sum_nll2, n);
        let ln_base = mean_err(self.sum_nll_base, self.sum_nll_base2, n);
        let cov = if n >= 10 {
            (self.sum_nll_nll_base / n as f64 - ln_ppl.value * ln_base.value) / (n - 1) as f64
        } else {
            0.0
        };
        let ppl = ln_ppl.value.exp();
        let ppl_base = ln_base.value.exp();
        let ratio_err = (ln_ppl.err.powi(2) + ln_base.err.powi(2) - 2.0 * cov)
            .max(0.0)
            .sqrt();
        let ln_ratio = ln_ppl.value - ln_base.value;
        let ppl_err = ppl * ln_ppl.err;
        let base_err = ppl_base * ln_base.err;
        let mut kls = self.kls.clone();
        kls.sort_by(f64::total_cmp);
        let mut dps = self.p_diffs.clone();
        dps.sort_by(f64::total_cmp);
        let (skl, skl2) = kls
            .iter()
            .fold((0.0, 0.0), |(s, s2), &k| (s + k, s2 + k * k));
        let (sdp, sdp2, sdp4) = dps.iter().fold((0.0, 0.0, 0.0), |(s, s2, s4), &d| {
            (s + d, s2 + d * d, s4 + d * d * d * d)
        });
        let mse = mean_err(sdp2, sdp4, n);
        let rms = mse.value.sqrt();
        let same = self.same_top as f64 / n.max(1) as f64;
        DivergenceSummary {
            rows: n,
            ppl: Estimate {
                value: ppl,
                err: ppl_err,
            },
            ppl_base: Estimate {
                value: ppl_base,
                err: base_err,
            },
            ln_ppl_correlation: if ln_ppl.err > 0.0 && ln_base.err > 0.0 {
                cov / (ln_ppl.err * ln_base.err)
            } else {
                0.0
            },
            ln_ppl_ratio: Estimate {
                value: ln_ratio,
                err: ratio_err,
            },
            ppl_ratio: Estimate {
                value: ln_ratio.exp(),
                err: ln_ratio.exp() * ratio_err,
            },
            ppl_diff: Estimate {
                value: ppl - ppl_base,
                err: (ppl_err.powi(2) + base_err.powi(2) - 2.0 * ppl * ppl_base * cov)
                    .max(0.0)
                    .sqrt(),
            },
            kl_mean: mean_err(skl, skl2, n),
            kl_max: quantile(&kls, 1.0),
            kl_p999: quantile(&kls, 0.999),
            kl_p99: quantile(&kls, 0.99),
            kl_p95: quantile(&kls, 0.95),
            kl_p90: quantile(&kls, 0.90),
            kl_median: quantile(&kls, 0.5),
            kl_p10: quantile(&kls, 0.10),
            kl_p5: quantile(&kls, 0.05),
            kl_p1: quantile(&kls, 0.01),
            kl_min: quantile(&kls, 0.0),
            dp_mean: mean_err(sdp, sdp2, n),
            dp_max: quantile(&dps, 1.0),
            dp_p99: quantile(&dps, 0.99),
            dp_p95: quantile(&dps, 0.95),
            dp_median: quantile(&dps, 0.5),
            dp_p5: quantile(&dps, 0.05),
            dp_p1: quantile(&dps, 0.01),
            dp_min: quantile(&dps, 0.0),
            dp_rms: Estimate {
                value: rms,
                err: if rms > 0.0 { 0.5 / rms * mse.err } else { 0.0 },
            },
            same_top: Estimate {
                value: same,
                err: if n > 1 {
                    (same * (1.0 - same) / (n - 1) as f64).sqrt()
                } else {
                    0.0
                },
            },
        }
    }
}

/// What is wrong with a log-probability file.
#[derive(Debug, thiserror::Error)]
pub enum KldFileError {
    #[error("reading the log-probability file: {0}")]
    Io(#[from] io::Error),
    #[error("not a log-probability file (it does not start with `_logits_`)")]
    Magic,
    #[error("the log-probability file's header is invalid: {0}")]
    Header(String),
    #[error("the log-probability file ends early: {0}")]
    Truncated(String),
}

/// The header and tokens of a log-probability file; its rows follow.
#[derive(Clone, Debug, PartialEq)]
pub struct BaseHeader {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    /// `n_chunk · n_ctx` tokens: the windows, as tokenized for the base.
    pub tokens: Vec<u32>,
}

fn read_i32(r: &mut impl Read) -> Result<i32, KldFileError> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(i32::from_le_bytes(b))
}

impl BaseHeader {
    /// Reads the header and the tokens.
    pub fn read(r: &mut impl Read) -> Result<BaseHeader, KldFileError> {
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic).map_err(|_| KldFileError::Magic)?;
        if &magic != MAGIC {
            return Err(KldFileError::Magic);
        }
        let mut field = |name: &str, min: i32| -> Result<usize, KldFileError> {
            let v = read_i32(r).map_err(|_| KldFileError::Truncated(format!("no {name}")))?;
            if v < min {
                return Err(KldFileError::Header(format!("{name} = {v}")));
            }
            Ok(v as usize)
        };
        let n_ctx = field("n_ctx", 4)?;
        let n_vocab = field("n_vocab", 1)?;
        let n_chunk = field("n_chunk", 1)?;
        let n_tok = n_ctx
            .checked_mul(n_chunk)
            .filter(|&n| n < (1 << 31))
            .ok_or_else(|| KldFileError::Header(format!("{n_chunk} windows of {n_ctx}")))?;
        let mut raw = vec![0u8; 4 * n_tok];
        r.read_exact(&mut raw)
            .map_err(|_| KldFileError::Truncated(format!("fewer than {n_tok} tokens")))?;
        let tokens: Vec<u32> = raw
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .map(|t| u32::try_from(t).ok().filter(|&t| (t as usize) < n_vocab))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                KldFileError::Header(format!("a token outside the {n_vocab}-token vocabulary"))
            })?;
        Ok(BaseHeader {
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
        })
    }

    /// Writes the header and the tokens.
    pub fn write(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(MAGIC)?;
        for v in [self.n_ctx, self.n_vocab, self.n_chunk] {
            w.write_all(&(v as i32).to_le_bytes())?;
        }
        for &t in &self.tokens {
            w.write_all(&(t as i32).to_le_bytes())?;
        }
        Ok(())
    }

    /// Window `c`'s tokens.
    pub fn window(&self, c: usize) -> &[u32] {
        &self.tokens[c * self.n_ctx..(c + 1) * self.n_ctx]
    }
}

/// Reads one window's stored rows into `rows` (`scored_rows(n_ctx) ·
/// row_len(n_vocab)` values).
pub fn read_rows(r: &mut impl Read, rows: &mut [u16], window: usize) -> Result<(), KldFileError> {
    let mut raw = vec![0u8; 2 * rows.len()];
    r.read_exact(&mut raw)
        .map_err(|_| KldFileError::Truncated(format!("window {} has no rows", window + 1)))?;
    for (v, b) in rows.iter_mut().zip(raw.chunks_exact(2)) {
        *v = u16::from_le_bytes([b[0], b[1]]);
    }
    Ok(())
}

/// Writes stored rows.
pub fn write_rows(w: &mut impl Write, rows: &[u16]) -> io::Result<()> {
    let raw: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    w.write_all(&raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits(seed: u32, n: usize) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1 << 24) as f32 * 20.0 - 10.0
            })
            .collect()
    }

    fn log_softmax(l: &[f32]) -> Vec<f64> {
        let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let z = m + l.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
        l.iter().map(|&x| x as f64 - z).collect()
    }

    #[test]
    fn a_stored_row_is_the_log_softmax_within_half_a_step() {
        let l = logits(1, 301);
        let mut row = vec![0u16; row_len(l.len())];
        let nll = encode_row(&l, 7, &mut row);
        let want = log_softmax(&l);
        assert!((nll + want[7]).abs() < 1e-9);
        let (scale, _) = row_header(&row);
        assert!(scale > 0.0 && scale <= ROW_SPAN / 65535.0 * 1.0001);
        let best = want.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        for (got, w) in decode_row(&row, l.len()).zip(&want) {
            let floor = best - ROW_SPAN as f64;
            let w = w.max(floor);
            assert!(
                (got as f64 - w).abs() <= scale as f64 * 0.5 + 1e-5,
                "{got} vs {w}"
            );
        }
    }

    #[test]
    fn a_row_against_itself_diverges_by_nothing() {
        let l = logits(2, 1000);
        let mut row = vec![0u16; row_len(l.len())];
        encode_row(&l, 3, &mut row);
        let r = compare_row(&row, &l, 3);
        assert!(r.kl.abs() < 1e-4, "{}", r.kl);
        assert!(r.same_top);
        assert!((r.nll - r.nll_base).abs() < 2e-4);
        assert!(kl_logits(&l, &l).abs() < 1e-12);
    }

    #[test]
    fn stored_and_exact_divergences_agree() {
        let a = logits(3, 500);
        let b: Vec<f32> = a
            .iter()
            .zip(logits(4, 500))
            .map(|(x, e)| x + 0.05 * e)
            .collect();
        let mut row = vec![0u16; row_len(a.len())];
        encode_row(&a, 0, &mut row);
        let stored = compare_row(&row, &b, 0).kl;
        let exact = kl_logits(&a, &b);
        assert!(exact > 1e-3);
        assert!(
            (stored - exact).abs() < 0.02 * exact + 1e-4,
            "{stored} vs {exact}"
        );
    }

    #[test]
    fn the_header_round_trips_and_bad_files_are_named() {
        let h = BaseHeader {
            n_ctx: 8,
            n_vocab: 5,
            n_chunk: 2,
            tokens: (0..16).map(|i| i % 5).collect(),
        };
        let mut buf = Vec::new();
        h.write(&mut buf).unwrap();
        assert_eq!(buf.len(), 8 + 12 + 64);
        assert_eq!(BaseHeader::read(&mut buf.as_slice()).unwrap(), h);
        let mut bad = buf.clone();
        bad[0] = b'x';
        assert!(matches!(
            BaseHeader::read(&mut bad.as_slice()),
            Err(KldFileError::Magic)
        ));
        let short = &buf[..30];
        assert!(matches!(
            BaseHeader::read(&mut &short[..]),
            Err(KldFileError::Truncated(_))
        ));
        let mut big_token = buf.clone();
        big_token[20] = 9;
        assert!(matches!(
            BaseHeader::read(&mut big_token.as_slice()),
            Err(KldFileError::Header(_))
        ));
    }

    #[test]
    fn the_summary_counts_like_llama_perplexity() {
        let mut d = Divergence::default();
        for i in 0..200 {
            d.add(RowDivergence {
                kl: i as f64 * 1e-3,
                nll: 2.0 + (i % 7) as f64 * 0.1,
                nll_base: 2.0 + (i % 7) as f64 * 0.1 - 0.01,
                same_top: i % 10 != 0,
            });
        }
        let s = d.summary();
        assert_eq!(s.rows, 200);
        assert!((s.same_top.value - 0.9).abs() < 1e-12);
        assert!((s.kl_mean.value - 0.0995).abs() < 1e-12);
        assert!((s.kl_median - 0.0995).abs() < 1e-12);
        assert!((s.kl_max - 0.199).abs() < 1e-12);
        assert!((s.ln_ppl_ratio.value - 0.01).abs() < 1e-12);
        assert!(s.ppl_diff.value > 0.0);
    }
}
