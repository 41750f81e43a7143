//! The f32 dot product of a query and a key row (16 partial sums, then the
//! tail), shared by the row-at-a-time and the chosen-positions kernels.

#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
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
