//! The Mamba-2 decode update of one state row while the state moves to a
//! new buffer (a checkpoint keeps the old one): reads the old row, writes
//! the new one with non-temporal stores. The new buffer is not in cache
//! (the state is tens of MB); ordinary stores would first read each line
//! of it (read-for-ownership), a third pass over the state per token.
//! Streaming stores make keeping the old state as a checkpoint cost the
//! same traffic as updating it in place: one read and one write.
//!
//! Same arithmetic, in the same order, as the row loop of `scan.rs`'s `m2_head`
//! (16 partial sums, added in order), so the result is bit for bit the
//! in-place update's. (A bf16 state streams its rows in `bf16.rs`.)

/// `dst[i] = src[i]·da + xdt·b[i]` (streamed), returns `Σ dst[i]·c[i]`
/// summed as `m2_head` sums it. Call `state_rows::fence` before another thread
/// reads `dst`. Requires `state_rows::can_stream`.
///
/// # Safety
/// The CPU has AVX2; `dst`, `src`, `b`, `c` hold `n` values, `n` a multiple
/// of 16, `dst` 16-byte aligned.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn move_row(
    dst: &mut [f32],
    src: &[f32],
    b: &[f32],
    c: &[f32],
    da: f32,
    xdt: f32,
) -> f32 {
    use std::arch::x86_64::*;
    let n = dst.len();
    let (vda, vx) = (_mm256_set1_ps(da), _mm256_set1_ps(xdt));
    let mut acc = [_mm256_setzero_ps(); 2];
    let d = dst.as_mut_ptr();
    for i in (0..n).step_by(16) {
        for (h, acc) in acc.iter_mut().enumerate() {
            let k = i + 8 * h;
            let s = _mm256_loadu_ps(src.as_ptr().add(k));
            let bv = _mm256_loadu_ps(b.as_ptr().add(k));
            let cv = _mm256_loadu_ps(c.as_ptr().add(k));
            let v = _mm256_add_ps(_mm256_mul_ps(s, vda), _mm256_mul_ps(vx, bv));
            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(v, cv));
            _mm_stream_ps(d.add(k), _mm256_castps256_ps128(v));
            _mm_stream_ps(d.add(k + 4), _mm256_extractf128_ps(v, 1));
        }
    }
    let mut lanes = [0f32; 16];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
    lanes.iter().sum()
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn move_row(
    _dst: &mut [f32],
    _src: &[f32],
    _b: &[f32],
    _c: &[f32],
    _da: f32,
    _xdt: f32,
) -> f32 {
    unreachable!("usable() is false off x86-64")
}
