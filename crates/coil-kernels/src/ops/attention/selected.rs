//! Attention over chosen positions: each query attends to its own list of
//! KV positions (a sparse, top-k attention's selection) instead of a causal
//! prefix. Grouped-query, softmax in f32 over the listed positions.

use super::dot::dot;
use super::kv::KvView;
use crate::pool::ThreadPool;

/// `out[t, h] = softmax_j(scale · q[t, h] · K[p_j, h/g]) · V[p_j, h/g]` over
/// the positions `p_j` of `positions[offsets[t]..offsets[t + 1]]` (any
/// order, each below `kv.n_pos`; none gives zeros), with `g = n_heads /
/// kv.n_kv_heads` query heads per KV head.
///
/// `q`, `out`: `[n_q, n_heads, head_dim]`; `offsets`: `[n_q + 1]`,
/// ascending from 0.
pub fn attention_selected(
    pool: &ThreadPool,
    q: &[f32],
    n_heads: usize,
    kv: &KvView,
    positions: &[u32],
    offsets: &[usize],
    scale: f32,
    out: &mut [f32],
) {
    let hd = kv.head_dim;
    let n_q = offsets.len().saturating_sub(1);
    assert!(
        kv.n_kv_heads > 0 && n_heads.is_multiple_of(kv.n_kv_heads),
        "attention_selected: heads not a multiple of kv heads"
    );
    assert_eq!(
        q.len(),
        n_q * n_heads * hd,
        "attention_selected: q is not [n_q, n_heads, head_dim]"
    );
    assert_eq!(out.len(), q.len());
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]) && offsets.last() <= Some(&positions.len()));
    assert!(
        positions.iter().all(|&p| (p as usize) < kv.n_pos),
        "attention_selected: a position beyond the view"
    );
    let row = kv.n_kv_heads * hd;
    assert!(
        kv.k.covers(kv.n_pos, kv.row_stride, row) && kv.v.covers(kv.n_pos, kv.row_stride, row),
        "attention_selected: KV view too short"
    );
    let g = n_heads / kv.n_kv_heads;
    let w = n_heads * hd;
    pool.rows_mut(out, w, 1, |t0, part| {
        let mut buf = vec![0f32; hd];
        let mut s = Vec::new();
        for (i, o) in part.chunks_exact_mut(w).enumerate() {
            let t = t0 + i;
            let sel = &positions[offsets[t]..offsets[t + 1]];
            o.fill(0.0);
            if sel.is_empty() {
                continue;
            }
            for h in 0..n_heads {
                let kvh = h / g;
                let qh = &q[(t * n_heads + h) * hd..(t * n_heads + h + 1) * hd];
                s.clear();
                s.extend(
                    sel.iter()
                        .map(|&p| scale * dot(qh, kv.k_row(kvh, p as usize, &mut buf))),
                );
                let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut z = 0f32;
                for v in s.iter_mut() {
                    *v = (*v - m).exp();
                    z += *v;
                }
                let oh = &mut o[h * hd..(h + 1) * hd];
                for (&p, &e) in sel.iter().zip(&s) {
                    let v = kv.v_row(kvh, p as usize, &mut buf);
                    let wgt = e / z;
                    oh.iter_mut().zip(v).for_each(|(a, b)| *a += wgt * b);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::attention::{attention, KvData};
    use crate::testutil::Rng;

    /// Every earlier position selected (in any order) is causal attention.
    #[test]
    fn selecting_the_prefix_is_causal_attention() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(7);
        let (nq, nh, nkv, hd, npos) = (6, 4, 2, 16, 40);
        let q = rng.vec(nq * nh * hd);
        let k = rng.vec(npos * nkv * hd);
        let v = rng.vec(npos * nkv * hd);
        let view = KvView::dense(KvData::F32(&k), KvData::F32(&v), nkv, hd);
        let lens: Vec<usize> = (0..nq).map(|t| npos - 2 * t).collect();
        let mut want = vec![0f32; q.len()];
        attention(&pool, &q, nh, &view, &lens, 0.25, &mut want);
        let mut positions = Vec::new();
        let mut offsets = vec![0];
        for &l in &lens {
            positions.extend((0..l as u32).rev());
            offsets.push(positions.len());
        }
        let mut got = vec![0f32; q.len()];
        attention_selected(&pool, &q, nh, &view, &positions, &offsets, 0.25, &mut got);
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    /// A subset: the naive softmax over exactly those positions.
    #[test]
    fn a_subset_is_the_softmax_over_it() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(8);
        let (nh, nkv, hd, npos) = (2, 1, 8, 20);
        let q = rng.vec(2 * nh * hd);
        let k = rng.vec(npos * hd);
        let v = rng.vec(npos * hd);
        let view = KvView::dense(KvData::F32(&k), KvData::F32(&v), nkv, hd);
        let positions = [3u32, 17, 5];
        let offsets = [0, 3, 3];
        let mut got = vec![1f32; q.len()];
        attention_selected(&pool, &q, nh, &view, &positions, &offsets, 0.5, &mut got);
        for h in 0..nh {
            let qh = &q[h * hd..(h + 1) * hd];
            let s: Vec<f64> = positions
                .iter()
                .map(|&p| {
                    0.5 * (0..hd)
                        .map(|i| (qh[i] * k[p as usize * hd + i]) as f64)
                        .sum::<f64>()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for i in 0..hd {
                let want: f64 = positions
                    .iter()
                    .zip(&s)
                    .map(|(&p, x)| (x - m).exp() / z * v[p as usize * hd + i] as f64)
                    .sum();
                assert!((got[h * hd + i] as f64 - want).abs() < 1e-5);
            }
        }
        // The second query selects nothing: zeros.
        assert!(got[nh * hd..].iter().all(|&x| x == 0.0));
    }
}
