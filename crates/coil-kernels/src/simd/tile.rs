//! Sixteen-lane f32 vectors over every SIMD level, and the register-tile
//! product built on them: the shared core of the chunked SSD and the
//! prefill attention kernels (each instantiates it per level under
//! `#[target_feature]`).

/// Sixteen f32 lanes: one `__m512`, two `__m256`, or a plain array.
pub(crate) trait V16: Copy {
    unsafe fn zero() -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(self, p: *mut f32);
    unsafe fn splat(v: f32) -> Self;
    /// `a·b + c`.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    /// `dst[j·ldd + i] = src[i·lds + j]` for `i, j < 16`.
    #[inline(always)]
    unsafe fn transpose16(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
        for i in 0..16 {
            for j in 0..16 {
                *dst.add(j * ldd + i) = *src.add(i * lds + j);
            }
        }
    }
}

/// The portable vector (the compiler vectorizes its loops as it can).
#[derive(Clone, Copy)]
pub(crate) struct Lanes([f32; 16]);

impl V16 for Lanes {
    #[inline(always)]
    unsafe fn zero() -> Self {
        Lanes([0.0; 16])
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        Lanes(std::ptr::read_unaligned(p as *const [f32; 16]))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        std::ptr::write_unaligned(p as *mut [f32; 16], self.0)
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        Lanes([v; 16])
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        let mut r = c.0;
        for i in 0..16 {
            r[i] += a.0[i] * b.0[i];
        }
        Lanes(r)
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        let mut r = a.0;
        for i in 0..16 {
            r[i] *= b.0[i];
        }
        Lanes(r)
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::V16;
    use std::arch::x86_64::*;

    impl V16 for __m512 {
        #[inline(always)]
        unsafe fn zero() -> Self {
            _mm512_setzero_ps()
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm512_storeu_ps(p, self)
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            _mm512_set1_ps(v)
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            _mm512_fmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            _mm512_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn transpose16(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
            let mut r = [_mm512_setzero_ps(); 16];
            for (i, v) in r.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(src.add(i * lds));
            }
            // Interleave pairs of rows (32-bit, then 64-bit elements), then
            // 128-bit lanes twice.
            let mut t = [_mm512_setzero_ps(); 16];
            for k in 0..8 {
                t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
                t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
            }
            for q in 0..4 {
                let (a, b, c, d) = (t[4 * q], t[4 * q + 1], t[4 * q + 2], t[4 * q + 3]);
                r[4 * q] = _mm512_shuffle_ps::<0x44>(a, c);
                r[4 * q + 1] = _mm512_shuffle_ps::<0xee>(a, c);
                r[4 * q + 2] = _mm512_shuffle_ps::<0x44>(b, d);
                r[4 * q + 3] = _mm512_shuffle_ps::<0xee>(b, d);
            }
            for h in 0..2 {
                for k in 0..4 {
                    let (a, b) = (r[8 * h + k], r[8 * h + k + 4]);
                    t[8 * h + k] = _mm512_shuffle_f32x4::<0x88>(a, b);
                    t[8 * h + k + 4] = _mm512_shuffle_f32x4::<0xdd>(a, b);
                }
            }
            for k in 0..8 {
                r[k] = _mm512_shuffle_f32x4::<0x88>(t[k], t[k + 8]);
                r[k + 8] = _mm512_shuffle_f32x4::<0xdd>(t[k], t[k + 8]);
            }
            for (j, v) in r.iter().enumerate() {
                _mm512_storeu_ps(dst.add(j * ldd), *v);
            }
        }
    }

    /// Two AVX2 registers.
    #[derive(Clone, Copy)]
    pub struct Pair(__m256, __m256);

    impl V16 for Pair {
        #[inline(always)]
        unsafe fn zero() -> Self {
            Pair(_mm256_setzero_ps(), _mm256_setzero_ps())
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            Pair(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            _mm256_storeu_ps(p, self.0);
            _mm256_storeu_ps(p.add(8), self.1);
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            let s = _mm256_set1_ps(v);
            Pair(s, s)
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            Pair(
                _mm256_fmadd_ps(a.0, b.0, c.0),
                _mm256_fmadd_ps(a.1, b.1, c.1),
            )
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            Pair(_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1))
        }
        #[inline(always)]
        unsafe fn transpose16(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
            for bi in 0..2 {
                for bj in 0..2 {
                    transpose8(
                        src.add(8 * (bi * lds + bj)),
                        lds,
                        dst.add(8 * (bj * ldd + bi)),
                        ldd,
                    );
                }
            }
        }
    }

    /// `dst[j·ldd + i] = src[i·lds + j]` for `i, j < 8`.
    #[inline(always)]
    unsafe fn transpose8(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
        let mut r = [_mm256_setzero_ps(); 8];
        for (i, v) in r.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(src.add(i * lds));
        }
        for (k, c) in columns8(r).iter().enumerate() {
            _mm256_storeu_ps(dst.add(k * ldd), *c);
        }
    }

    /// The columns of the 8 × 8 block whose rows are `r`: column `k` at
    /// index `k` (pairs of rows interleaved, 32-bit then 64-bit elements,
    /// then 128-bit lanes).
    #[inline(always)]
    pub(crate) unsafe fn columns8(mut r: [__m256; 8]) -> [__m256; 8] {
        let mut t = [_mm256_setzero_ps(); 8];
        for k in 0..4 {
            t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
            t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
        }
        for q in 0..2 {
            let (a, b, c, d) = (t[4 * q], t[4 * q + 1], t[4 * q + 2], t[4 * q + 3]);
            r[4 * q] = _mm256_shuffle_ps::<0x44>(a, c);
            r[4 * q + 1] = _mm256_shuffle_ps::<0xee>(a, c);
            r[4 * q + 2] = _mm256_shuffle_ps::<0x44>(b, d);
            r[4 * q + 3] = _mm256_shuffle_ps::<0xee>(b, d);
        }
        std::array::from_fn(|k| {
            if k < 4 {
                _mm256_permute2f128_ps::<0x20>(r[k], r[k + 4])
            } else {
                _mm256_permute2f128_ps::<0x31>(r[k - 4], r[k])
            }
        })
    }
}

/// `acc[r][j] += Σ_{k<depth} a[r·lda + k] · b[k·ldb + 16j]`.
///
/// # Safety
/// `a` readable for `MR` rows of `depth` values at stride `lda`; `b` for
/// `depth` rows of `16·NV` values at stride `ldb`.
#[inline(always)]
pub(crate) unsafe fn fma_tile<V: V16, const MR: usize, const NV: usize>(
    acc: &mut [[V; NV]; MR],
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    depth: usize,
) {
    let mut bk = b;
    let mut ak = a;
    for _ in 0..depth {
        let mut bv = [V::zero(); NV];
        for (j, v) in bv.iter_mut().enumerate() {
            *v = V::load(bk.add(16 * j));
        }
        for r in 0..MR {
            let av = V::splat(*ak.add(r * lda));
            for j in 0..NV {
                acc[r][j] = V::fma(av, bv[j], acc[r][j]);
            }
        }
        bk = bk.add(ldb);
        ak = ak.add(1);
    }
}

/// Stores the first `rows` rows of `acc` to `out` (row stride `ldo`).
#[inline(always)]
pub(crate) unsafe fn store_tile<V: V16, const MR: usize, const NV: usize>(
    acc: &[[V; NV]; MR],
    out: *mut f32,
    ldo: usize,
    rows: usize,
) {
    for r in 0..MR.min(rows) {
        for j in 0..NV {
            acc[r][j].store(out.add(r * ldo + 16 * j));
        }
    }
}

/// `dst[j·ldd + i] = src[i·lds + j]` for `i < rows`, `j < cols`, in
/// 16 × 16 blocks.
#[inline(always)]
pub(crate) unsafe fn transpose<V: V16>(
    src: *const f32,
    lds: usize,
    rows: usize,
    cols: usize,
    dst: *mut f32,
    ldd: usize,
) {
    let (rb, cb) = (rows / 16 * 16, cols / 16 * 16);
    for i0 in (0..rb).step_by(16) {
        for j0 in (0..cb).step_by(16) {
            V::transpose16(src.add(i0 * lds + j0), lds, dst.add(j0 * ldd + i0), ldd);
        }
    }
    for i in 0..rows {
        for j in if i < rb { cb } else { 0 }..cols {
            *dst.add(j * ldd + i) = *src.add(i * lds + j);
        }
    }
}
