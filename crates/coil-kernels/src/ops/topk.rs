//! Top-k selection (MoE routing, sampling helpers).

use std::cmp::Ordering;

fn cmp_desc(x: &[f32], a: usize, b: usize) -> Ordering {
    // larger first; NaN last; ties by lower index
    let (va, vb) = (x[a], x[b]);
    match (va.is_nan(), vb.is_nan()) {
        (true, true) => a.cmp(&b),
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => vb
            .partial_cmp(&va)
            .unwrap_or(Ordering::Equal)
            .then(a.cmp(&b)),
    }
}

/// Indices of the `idx.len()` largest values of `x`, largest first (ties:
/// lower index first; NaN ranks last). `idx.len()` ≤ `x.len()`.
pub fn top_k_into(x: &[f32], idx: &mut [usize]) {
    let k = idx.len();
    assert!(k <= x.len(), "top_k: k > len");
    if k == 0 {
        return;
    }
    let mut all: Vec<usize> = (0..x.len()).collect();
    if k < all.len() {
        all.select_nth_unstable_by(k - 1, |&a, &b| cmp_desc(x, a, b));
        all.truncate(k);
    }
    all.sort_unstable_by(|&a, &b| cmp_desc(x, a, b));
    idx.copy_from_slice(&all);
}

/// The `k` largest `(index, value)` pairs of `x`, largest first.
pub fn top_k(x: &[f32], k: usize) -> Vec<(usize, f32)> {
    let k = k.min(x.len());
    let mut idx = vec![0usize; k];
    top_k_into(x, &mut idx);
    idx.into_iter().map(|i| (i, x[i])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_largest() {
        let x = [0.1f32, 5.0, -2.0, 5.0, f32::NAN, 3.0];
        assert_eq!(top_k(&x, 3), vec![(1, 5.0), (3, 5.0), (5, 3.0)]);
        assert_eq!(top_k(&x, 0), vec![]);
        let all = top_k(&x, 10);
        assert_eq!(all.len(), 6);
        assert_eq!(all[5].0, 4);
    }
}
