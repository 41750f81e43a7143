//! Attention of a batch of query tokens over a KV view: grouped-query,
//! causal through per-query limits, online softmax, f32 accumulation.

use crate::matmul::SendPtr;
use crate::multiversion;
use crate::pool::ThreadPool;
use crate::simd::math::exp_fast;
use half::f16;

/// Key or value storage.
#[derive(Clone, Copy, Debug)]
pub enum KvData<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl KvData<'_> {
    fn len(&self) -> usize {
        match self {
            KvData::F32(s) => s.len(),
            KvData::F16(s) => s.len(),
        }
    }
}

/// Keys and values of `n_pos` positions: element `(pos, kv_head, i)` of K
/// (and V) is at `pos * row_stride + kv_head * head_dim + i`.
#[derive(Clone, Copy, Debug)]
pub struct KvView<'a> {
    pub k: KvData<'a>,
    pub v: KvData<'a>,
    pub n_pos: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Elements between consecutive positions (≥ n_kv_heads · head_dim).
    pub row_stride: usize,
}

impl<'a> KvView<'a> {
    /// A densely packed view: K and V are `[n_pos, n_kv_heads, head_dim]`.
    pub fn dense(k: KvData<'a>, v: KvData<'a>, n_kv_heads: usize, head_dim: usize) -> Self {
        let row = n_kv_heads * head_dim;
        let n_pos = k.len().checked_div(row).unwrap_or(0);
        KvView {
            k,
            v,
            n_pos,
            n_kv_heads,
            head_dim,
            row_stride: row,
        }
    }
}

#[inline(always)]
fn load_row(src: &KvData, off: usize, out: &mut [f32]) {
    match src {
        KvData::F32(s) => out.copy_from_slice(&s[off..off + out.len()]),
        KvData::F16(s) => {
            let n = out.len();
            for (o, v) in out.iter_mut().zip(&s[off..off + n]) {
                *o = v.to_f32();
            }
        }
    }
}

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
    let mut s = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    acc.iter().sum::<f32>() + s
}

const BLOCK: usize = 32;

/// One (query, head): `out = softmax(scale · q·K[0..len]) · V[0..len]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn one_head(
    q: &[f32],
    kv: &KvView,
    kvh: usize,
    len: usize,
    scale: f32,
    out: &mut [f32],
    krow: &mut [f32],
    scores: &mut [f32; BLOCK],
) {
    let hd = kv.head_dim;
    out.fill(0.0);
    let mut m = f32::NEG_INFINITY;
    let mut l = 0f32;
    let mut p0 = 0;
    while p0 < len {
        let nb = BLOCK.min(len - p0);
        let mut bmax = f32::NEG_INFINITY;
        for j in 0..nb {
            let off = (p0 + j) * kv.row_stride + kvh * hd;
            let s = match &kv.k {
                KvData::F32(k) => dot(q, &k[off..off + hd]),
                KvData::F16(_) => {
                    load_row(&kv.k, off, krow);
                    dot(q, krow)
                }
            } * scale;
            scores[j] = s;
            bmax = bmax.max(s);
        }
        let m_new = m.max(bmax);
        if m_new == f32::NEG_INFINITY {
            p0 += nb;
            continue; // all scores -inf so far
        }
        let corr = exp_fast(m - m_new);
        if corr != 1.0 {
            out.iter_mut().for_each(|o| *o *= corr);
            l *= corr;
        }
        m = m_new;
        for j in 0..nb {
            let p = exp_fast(scores[j] - m);
            l += p;
            let off = (p0 + j) * kv.row_stride + kvh * hd;
            match &kv.v {
                KvData::F32(v) => {
                    for (o, vv) in out.iter_mut().zip(&v[off..off + hd]) {
                        *o += p * vv;
                    }
                }
                KvData::F16(_) => {
                    load_row(&kv.v, off, krow);
                    for (o, vv) in out.iter_mut().zip(krow.iter()) {
                        *o += p * vv;
                    }
                }
            }
        }
        p0 += nb;
    }
    if l > 0.0 {
        let inv = 1.0 / l;
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn items(
    i0: usize,
    i1: usize,
    q: &[f32],
    n_heads: usize,
    kv: &KvView,
    kv_len: &[usize],
    scale: f32,
    out: *mut f32,
) {
    let hd = kv.head_dim;
    let group = n_heads / kv.n_kv_heads;
    let mut krow = vec![0f32; hd];
    let mut scores = [0f32; BLOCK];
    for it in i0..i1 {
        let (t, h) = (it / n_heads, it % n_heads);
        let qh = &q[(t * n_heads + h) * hd..(t * n_heads + h + 1) * hd];
        // SAFETY: item (t, h) owns out[(t*n_heads+h)*hd..][..hd].
        let o = unsafe { std::slice::from_raw_parts_mut(out.add((t * n_heads + h) * hd), hd) };
        one_head(
            qh,
            kv,
            h / group,
            kv_len[t],
            scale,
            o,
            &mut krow,
            &mut scores,
        );
    }
}

multiversion!(fn items_mv(
    i0: usize, i1: usize, q: &[f32], n_heads: usize, kv: &KvView, kv_len: &[usize], scale: f32,
    out: *mut f32
) => items);

/// `out[t, h] = softmax_p(scale · q[t, h] · K[p, h/g]) · V[p, h/g]` over
/// positions `p < kv_len[t]` (causal limit per query; 0 gives zeros), with
/// `g = n_heads / kv.n_kv_heads` query heads per KV head.
///
/// `q`, `out`: `[n_q, n_heads, head_dim]`; `kv_len`: `[n_q]`, each ≤ `kv.n_pos`.
pub fn attention(
    pool: &ThreadPool,
    q: &[f32],
    n_heads: usize,
    kv: &KvView,
    kv_len: &[usize],
    scale: f32,
    out: &mut [f32],
) {
    let n_q = kv_len.len();
    let hd = kv.head_dim;
    assert!(
        kv.n_kv_heads > 0 && n_heads.is_multiple_of(kv.n_kv_heads),
        "attention: heads not a multiple of kv heads"
    );
    assert_eq!(
        q.len(),
        n_q * n_heads * hd,
        "attention: q is not [n_q, n_heads, head_dim]"
    );
    assert_eq!(out.len(), q.len());
    assert!(kv.row_stride >= kv.n_kv_heads * hd);
    let need = if kv.n_pos == 0 {
        0
    } else {
        (kv.n_pos - 1) * kv.row_stride + kv.n_kv_heads * hd
    };
    assert!(
        kv.k.len() >= need && kv.v.len() >= need,
        "attention: KV view too short"
    );
    assert!(
        kv_len.iter().all(|&l| l <= kv.n_pos),
        "attention: kv_len beyond the view"
    );
    let op = SendPtr(out.as_mut_ptr());
    let n_items = n_q * n_heads;
    let grain = (n_items / (pool.n_threads() * 8)).max(1);
    pool.parallel_for(n_items, grain, |r, _| {
        items_mv(r.start, r.end, q, n_heads, kv, kv_len, scale, op.get());
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn matches_naive_softmax() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(21);
        for &(nq, nh, nkv, hd, npos) in &[(3, 4, 2, 8, 40), (1, 2, 2, 64, 100), (17, 6, 1, 5, 17)] {
            let stride = nkv * hd + 3;
            let q = rng.vec(nq * nh * hd);
            let k = rng.vec(npos * stride);
            let v = rng.vec(npos * stride);
            let lens: Vec<usize> = (0..nq).map(|i| npos - (nq - 1 - i).min(npos - 1)).collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let mut want = vec![0f64; nq * nh * hd];
            for t in 0..nq {
                for h in 0..nh {
                    let kh = h / (nh / nkv);
                    let s: Vec<f64> = (0..lens[t])
                        .map(|p| {
                            (0..hd)
                                .map(|i| {
                                    q[(t * nh + h) * hd + i] as f64
                                        * k[p * stride + kh * hd + i] as f64
                                })
                                .sum::<f64>()
                                * scale as f64
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for i in 0..hd {
                        want[(t * nh + h) * hd + i] = (0..lens[t])
                            .map(|p| e[p] / z * v[p * stride + kh * hd + i] as f64)
                            .sum();
                    }
                }
            }
            let view = KvView {
                k: KvData::F32(&k),
                v: KvData::F32(&v),
                n_pos: npos,
                n_kv_heads: nkv,
                head_dim: hd,
                row_stride: stride,
            };
            let mut out = vec![0f32; q.len()];
            attention(&pool, &q, nh, &view, &lens, scale, &mut out);
            for (a, e) in out.iter().zip(&want) {
                assert!((*a as f64 - e).abs() < 1e-5, "{a} vs {e}");
            }
            // f16 storage
            let k16: Vec<f16> = k.iter().map(|v| f16::from_f32(*v)).collect();
            let v16: Vec<f16> = v.iter().map(|v| f16::from_f32(*v)).collect();
            let view16 = KvView {
                k: KvData::F16(&k16),
                v: KvData::F16(&v16),
                ..view
            };
            attention(&pool, &q, nh, &view16, &lens, scale, &mut out);
            for (a, e) in out.iter().zip(&want) {
                assert!((*a as f64 - e).abs() < 5e-3);
            }
        }
    }
}
