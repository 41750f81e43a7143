//! Attention of a batch of query tokens over a KV view: grouped-query,
//! causal through per-query limits, online softmax, f32 accumulation.

mod call;
mod dot;
mod kv;
mod selected;
mod tiled;

use crate::multiversion;
use crate::pool::SendPtr;
use crate::pool::ThreadPool;
use crate::simd::math::exp_fast;
use call::{Call, Item, Scratch, QB, TRANSPOSE_ROWS};
use dot::dot;
use kv::{kv_block, PB};
pub use kv::{KvData, KvView, KV_PAGE_ALIGN};
pub use selected::attention_selected;

/// One work item, a row at a time (any head dim; see [`tiled`] for the
/// fast path).
///
/// # Safety
/// As [`Scratch::finish`].
#[inline(always)]
unsafe fn item(call: &Call, it: Item, sc: &mut Scratch) {
    let Call { kv, kv_len, .. } = *call;
    let Item { t0, kvh, .. } = it;
    let hd = kv.head_dim;
    let group = call.group();
    let rows = call.rows(it);
    sc.begin(call, it, rows);
    let max_len = call.max_len(it);
    let transpose = rows >= TRANSPOSE_ROWS;
    let mut s = [0f32; PB];
    let mut p0 = call.first_block(it);
    while p0 < max_len {
        let nb = PB.min(max_len - p0);
        let kr = kv_block(&kv.k, kv, kvh, p0, nb, &mut sc.kb);
        if transpose {
            if nb < PB {
                sc.kt.fill(0.0);
            }
            for j in 0..nb {
                for (i, &v) in kr.row(j, hd).iter().enumerate() {
                    sc.kt[i * PB + j] = v;
                }
            }
        }
        let vr = kv_block(&kv.v, kv, kvh, p0, nb, &mut sc.vb);
        for r in 0..rows {
            let len = kv_len[t0 + r / group];
            // Lanes `lo..valid` of the block are this row's (`lo` > 0 only
            // in a sliding window).
            let lo = call.start(it, r).saturating_sub(p0);
            if len <= p0 || lo >= nb {
                continue;
            }
            let valid = nb.min(len - p0);
            let qr = &sc.q[r * hd..(r + 1) * hd];
            if transpose {
                s = [0f32; PB];
                for (i, &qv) in qr.iter().enumerate() {
                    let kt = &sc.kt[i * PB..(i + 1) * PB];
                    for j in 0..PB {
                        s[j] += qv * kt[j];
                    }
                }
            } else {
                for (j, sj) in s.iter_mut().enumerate().take(valid) {
                    *sj = dot(qr, kr.row(j, hd));
                }
            }
            let bmax = s[lo..valid]
                .iter()
                .fold(f32::NEG_INFINITY, |m, v| m.max(*v));
            let m_old = sc.m[r];
            let m_new = m_old.max(bmax);
            if m_new == f32::NEG_INFINITY {
                continue;
            }
            let o = &mut sc.o[r * hd..(r + 1) * hd];
            let corr = exp_fast(m_old - m_new);
            if corr != 1.0 {
                o.iter_mut().for_each(|v| *v *= corr);
                sc.l[r] *= corr;
            }
            sc.m[r] = m_new;
            let mut pb = [0f32; PB];
            for j in 0..PB {
                let e = exp_fast(s[j] - m_new);
                pb[j] = if (lo..valid).contains(&j) { e } else { 0.0 };
            }
            sc.l[r] += pb.iter().sum::<f32>();
            // o += sum_j p_j v_j, 16 lanes of o held in registers over j
            let mut oc = o.chunks_exact_mut(16);
            let mut c0 = 0;
            for o16 in &mut oc {
                let mut acc = [0f32; 16];
                acc.copy_from_slice(o16);
                for (j, &pj) in pb.iter().enumerate().take(valid) {
                    let v16 = &vr.row(j, hd)[c0..c0 + 16];
                    for i in 0..16 {
                        acc[i] += pj * v16[i];
                    }
                }
                o16.copy_from_slice(&acc);
                c0 += 16;
            }
            for (i, ov) in oc.into_remainder().iter_mut().enumerate() {
                for (j, &pj) in pb.iter().enumerate().take(valid) {
                    *ov += pj * vr.row(j, hd)[c0 + i];
                }
            }
        }
        p0 += nb;
    }
    sc.finish(call, it);
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Work items `i0..i1` (query block `i / n_kv_heads`, KV head `i % n_kv_heads`).
#[inline(always)]
fn items(i0: usize, i1: usize, call: &Call, sc: &mut Scratch) {
    let n_q = call.kv_len.len();
    let n_kv = call.kv.n_kv_heads;
    for i in i0..i1 {
        let t0 = (i / n_kv) * call.qb;
        let it = Item {
            t0,
            t1: (t0 + call.qb).min(n_q),
            kvh: i % n_kv,
        };
        // SAFETY: `attention` checked the shapes and hands each work item
        // (and so its (query, head) outputs) to one call only.
        unsafe {
            if tiled::supports(call.kv.head_dim) {
                tiled::item(call, it, sc);
            } else {
                item(call, it, sc);
            }
        }
    }
}

multiversion!(fn items_mv(i0: usize, i1: usize, call: &Call, sc: &mut Scratch) => items);

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
    attention_windowed(pool, q, n_heads, kv, kv_len, None, scale, out)
}

/// [`attention`] in a sliding window: query `t` attends to the last
/// `window` positions below its limit, `kv_len[t] − window .. kv_len[t]`
/// (`None`: every position below it).
#[allow(clippy::too_many_arguments)]
pub fn attention_windowed(
    pool: &ThreadPool,
    q: &[f32],
    n_heads: usize,
    kv: &KvView,
    kv_len: &[usize],
    window: Option<usize>,
    scale: f32,
    out: &mut [f32],
) {
    assert!(window != Some(0), "attention: a window of 0 positions");
    let window = window.unwrap_or(usize::MAX);
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
    let row = kv.n_kv_heads * hd;
    assert!(
        kv.k.covers(kv.n_pos, kv.row_stride, row) && kv.v.covers(kv.n_pos, kv.row_stride, row),
        "attention: KV view too short (or pages not a multiple of {PB} positions)"
    );
    assert!(
        kv_len.iter().all(|&l| l <= kv.n_pos),
        "attention: kv_len beyond the view"
    );
    let op = SendPtr(out.as_mut_ptr());
    // The tiled kernel computes each (query, head) row with its own
    // operations whatever else shares its work item (scores, softmax and
    // `P·V` row by row; rows that do not see a block add nothing), so a
    // query's result is the one it gets alone. The per-row kernel's
    // depends on the item's row count (it takes the transposed-K path from
    // `TRANSPOSE_ROWS` rows on): with batch-invariant numerics (`Full` or
    // `Cheap`) each query is an item of its own there.
    let invariant = crate::numerics::invariance() != crate::numerics::Invariance::Off;
    let qb = if invariant && !tiled::supports(hd) {
        1
    } else {
        QB
    };
    let n_items = n_q.div_ceil(qb) * kv.n_kv_heads;
    let grain = (n_items / (pool.n_threads() * 4)).max(1);
    pool.parallel_for(n_items, grain, |r, _| {
        SCRATCH.with(|sc| {
            let mut sc = sc.borrow_mut();
            let call = Call {
                q,
                n_heads,
                kv,
                kv_len,
                window,
                scale,
                out: op.get(),
                qb,
            };
            items_mv(r.start, r.end, &call, &mut sc);
        });
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testutil::Rng;
    use half::f16;
    use std::ops::Range;

    /// The softmax attention in f64: query `t` (`q`: `[n_q, nh, hd]`) over
    /// the positions `seen(t)` of K and V (rows `stride` apart, `nkv` heads
    /// of `hd`).
    #[allow(clippy::too_many_arguments)]
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        stride: usize,
        (nh, nkv, hd): (usize, usize, usize),
        seen: impl Fn(usize) -> Range<usize>,
        scale: f32,
    ) -> Vec<f64> {
        let nq = q.len() / (nh * hd);
        let mut want = vec![0f64; nq * nh * hd];
        for t in 0..nq {
            let pos = seen(t);
            for h in 0..nh {
                let kh = h / (nh / nkv);
                let s: Vec<f64> = pos
                    .clone()
                    .map(|p| {
                        (0..hd)
                            .map(|i| {
                                q[(t * nh + h) * hd + i] as f64 * k[p * stride + kh * hd + i] as f64
                            })
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for i in 0..hd {
                    want[(t * nh + h) * hd + i] = pos
                        .clone()
                        .map(|p| e[p - pos.start] / z * v[p * stride + kh * hd + i] as f64)
                        .sum();
                }
            }
        }
        want
    }

    #[test]
    pub(crate) fn matches_naive_softmax() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(21);
        for &(nq, nh, nkv, hd, npos) in &[
            (3, 4, 2, 8, 40),
            (1, 2, 2, 64, 100),
            (17, 6, 1, 5, 17),
            (40, 8, 2, 16, 70),
            (5, 3, 3, 32, 65),
            // More of the tiled path (head_dim a multiple of 16): tiles of
            // 6 and of 2 rows, partial position blocks and row tiles.
            (33, 4, 2, 64, 80),
            (20, 2, 1, 128, 50),
            (9, 5, 1, 48, 31),
        ] {
            let stride = nkv * hd + 3;
            let q = rng.vec(nq * nh * hd);
            let k = rng.vec(npos * stride);
            let v = rng.vec(npos * stride);
            let mut lens: Vec<usize> = (0..nq).map(|i| npos - (nq - 1 - i).min(npos - 1)).collect();
            if nq > 2 {
                lens[1] = 0; // a query that sees nothing gives zeros
                lens[2] = 33.min(npos);
            }
            let scale = 1.0 / (hd as f32).sqrt();
            let want = naive(&q, &k, &v, stride, (nh, nkv, hd), |t| 0..lens[t], scale);
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

    /// A sliding window: each query attends to the last `w` positions below
    /// its limit, as a naive softmax over exactly those; windows shorter,
    /// longer and across blocks of positions, both kernels, f32 and pages.
    #[test]
    fn sliding_window_matches_naive_softmax() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(77);
        for &(nq, nh, nkv, hd, npos, w) in &[
            (9, 4, 2, 8, 40, 5),
            (20, 2, 1, 64, 150, 37),
            (1, 4, 4, 16, 300, 200),
            (33, 6, 2, 32, 90, 1),
            (7, 3, 1, 5, 20, 64),
        ] {
            let row = nkv * hd;
            let q = rng.vec(nq * nh * hd);
            let k = rng.vec(npos * row);
            let v = rng.vec(npos * row);
            let lens: Vec<usize> = (0..nq).map(|t| npos - (nq - 1 - t)).collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let seen = |t: usize| lens[t].saturating_sub(w)..lens[t];
            let want = naive(&q, &k, &v, row, (nh, nkv, hd), seen, scale);
            let dense = KvView::dense(KvData::F32(&k), KvData::F32(&v), nkv, hd);
            let mut got = vec![0f32; q.len()];
            attention_windowed(&pool, &q, nh, &dense, &lens, Some(w), scale, &mut got);
            for (a, e) in got.iter().zip(&want) {
                assert!((*a as f64 - e).abs() < 1e-5, "window {w}: {a} vs {e}");
            }
            // Each query alone gives what it gives among the others.
            let wd = nh * hd;
            for t in 0..nq {
                let mut one = vec![0f32; wd];
                let qt = &q[t * wd..(t + 1) * wd];
                attention_windowed(
                    &pool,
                    qt,
                    nh,
                    &dense,
                    &lens[t..t + 1],
                    Some(w),
                    scale,
                    &mut one,
                );
                for (a, b) in one.iter().zip(&got[t * wd..(t + 1) * wd]) {
                    assert!((a - b).abs() < 1e-5, "window {w} query {t}: {a} vs {b}");
                }
            }
        }
    }

    /// Batch invariance: in the invariant scope, each query of a call gives
    /// bit for bit what it gives alone (one-query call), at every SIMD
    /// level (run by `ops_at_every_level`), for the row-at-a-time and the
    /// tiled kernels.
    pub(crate) fn invariant_mode_queries_equal_single_query_calls() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(33);
        let _inv = crate::numerics::invariant_scope(true);
        for &(nq, nh, nkv, hd, npos) in &[
            (17, 4, 2, 8, 60),
            (17, 8, 1, 16, 70),
            (9, 6, 2, 64, 40),
            (17, 32, 2, 5, 33),
            // a prompt's queries over several position blocks
            (40, 8, 2, 32, 300),
        ] {
            let stride = nkv * hd;
            let q = rng.vec(nq * nh * hd);
            let k = rng.vec(npos * stride);
            let v = rng.vec(npos * stride);
            let lens: Vec<usize> = (0..nq).map(|i| npos - nq + 1 + i).collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let view = KvView {
                k: KvData::F32(&k),
                v: KvData::F32(&v),
                n_pos: npos,
                n_kv_heads: nkv,
                head_dim: hd,
                row_stride: stride,
            };
            let mut all = vec![0f32; q.len()];
            attention(&pool, &q, nh, &view, &lens, scale, &mut all);
            let w = nh * hd;
            for t in 0..nq {
                let mut one = vec![0f32; w];
                let qt = &q[t * w..(t + 1) * w];
                attention(&pool, qt, nh, &view, &lens[t..t + 1], scale, &mut one);
                let same = one
                    .iter()
                    .zip(&all[t * w..(t + 1) * w])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                let level = crate::simd::level();
                assert!(same, "{level:?} nq {nq} nh {nh} hd {hd}: query {t}");
            }
        }
    }

    /// Pages of `page_len` positions, each its own allocation, cut from a
    /// dense `[n_pos, stride]` buffer.
    fn pages_of(dense: &[f32], stride: usize, page_len: usize) -> Vec<Vec<f32>> {
        dense
            .chunks(page_len * stride)
            .map(|c| c.to_vec())
            .collect()
    }

    #[test]
    fn paged_view_equals_dense_view() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(5);
        // (n_q, n_heads, n_kv_heads, head_dim, n_pos): GQA and MHA, decode
        // and prefill shapes (the tiled path for head dims of 16·k, the
        // per-row path for the others).
        for &(nq, nh, nkv, hd, npos) in &[
            (1, 8, 2, 64, 300),
            (20, 4, 1, 16, 129),
            (7, 6, 3, 8, 96),
            (33, 4, 4, 32, 257),
        ] {
            let row = nkv * hd;
            let q = rng.vec(nq * nh * hd);
            let k = rng.vec(npos * row);
            let v = rng.vec(npos * row);
            // Causal: query t sees the first npos − (nq − 1 − t) positions.
            let lens: Vec<usize> = (0..nq).map(|t| npos - (nq - 1 - t)).collect();
            let scale = 1.0 / (hd as f32).sqrt();
            let dense = KvView::dense(KvData::F32(&k), KvData::F32(&v), nkv, hd);
            let mut want = vec![0f32; q.len()];
            attention(&pool, &q, nh, &dense, &lens, scale, &mut want);
            for page_len in [32, 64, 96, 256, 512] {
                let (kp, vp) = (pages_of(&k, row, page_len), pages_of(&v, row, page_len));
                let ks: Vec<&[f32]> = kp.iter().map(|p| p.as_slice()).collect();
                let vs: Vec<&[f32]> = vp.iter().map(|p| p.as_slice()).collect();
                let paged = KvView::paged(&ks, &vs, page_len, npos, nkv, hd);
                let mut got = vec![1f32; q.len()];
                attention(&pool, &q, nh, &paged, &lens, scale, &mut got);
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "nq {nq} nh {nh} nkv {nkv} hd {hd} npos {npos} page {page_len}"
                );
            }
            // f16 pages read as the dense f16 view reads them.
            let (k16, v16): (Vec<f16>, Vec<f16>) = (
                k.iter().map(|x| f16::from_f32(*x)).collect(),
                v.iter().map(|x| f16::from_f32(*x)).collect(),
            );
            let dense16 = KvView::dense(KvData::F16(&k16), KvData::F16(&v16), nkv, hd);
            attention(&pool, &q, nh, &dense16, &lens, scale, &mut want);
            for page_len in [32, 96, 256] {
                let kp: Vec<&[f16]> = k16.chunks(page_len * row).collect();
                let vp: Vec<&[f16]> = v16.chunks(page_len * row).collect();
                let paged = KvView::paged_f16(&kp, &vp, page_len, npos, nkv, hd);
                let mut got = vec![1f32; q.len()];
                attention(&pool, &q, nh, &paged, &lens, scale, &mut got);
                assert!(
                    got.iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "f16: nq {nq} nh {nh} nkv {nkv} hd {hd} npos {npos} page {page_len}"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "KV view too short")]
    fn pages_must_align_with_position_blocks() {
        let pool = ThreadPool::new(1);
        let k = vec![0f32; 40 * 2];
        let (kp, vp) = (pages_of(&k, 2, 20), pages_of(&k, 2, 20));
        let ks: Vec<&[f32]> = kp.iter().map(|p| p.as_slice()).collect();
        let vs: Vec<&[f32]> = vp.iter().map(|p| p.as_slice()).collect();
        let view = KvView::paged(&ks, &vs, 20, 40, 1, 2);
        let mut out = vec![0f32; 2];
        attention(&pool, &[0.0; 2], 1, &view, &[40], 1.0, &mut out);
    }
}
