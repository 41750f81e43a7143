//! AVX2 (+FMA, F16C) kernels: float-format dot products and decoding.

use super::{SimdLevel, VecKernel};
use coil_gguf::GgmlType;
use std::arch::x86_64::*;

pub(super) fn vec_kernel(ty: GgmlType) -> Option<VecKernel> {
    // SAFETY (all): selected only when the CPU has AVX2+FMA+F16C.
    Some(match ty {
        GgmlType::F32 => VecKernel::Float(|r, x| unsafe { dot_f32(r, x) }),
        GgmlType::F16 => VecKernel::Float(|r, x| unsafe { dot_f16(r, x) }),
        GgmlType::BF16 => VecKernel::Float(|r, x| unsafe { dot_bf16(r, x) }),
        _ => return None,
    })
}

/// SIMD decoding of the plain float formats and Q8_0; false = not handled.
pub(super) fn decode(ty: GgmlType, src: &[u8], dst: &mut [f32], _level: SimdLevel) -> bool {
    // SAFETY: called only at level >= Avx2.
    unsafe {
        match ty {
            GgmlType::F16 => decode_f16(src, dst),
            GgmlType::BF16 => decode_bf16(src, dst),
            GgmlType::F32 => {
                for (d, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                    *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            GgmlType::Q8_0 => decode_q8_0(src, dst),
            _ => return false,
        }
    }
    true
}

#[inline(always)]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// f16 bits → f32 with F16C.
#[inline(always)]
pub(super) unsafe fn f16c(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    debug_assert!(row.len() >= 4 * n);
    let (w, xp) = (row.as_ptr() as *const f32, x.as_ptr());
    let mut a = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, acc) in a.iter_mut().enumerate() {
            let o = i + 8 * j;
            *acc = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(o)), _mm256_loadu_ps(xp.add(o)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(w.add(i)), _mm256_loadu_ps(xp.add(i)), a[0]);
        i += 8;
    }
    let mut s = hsum256(_mm256_add_ps(
        _mm256_add_ps(a[0], a[1]),
        _mm256_add_ps(a[2], a[3]),
    ));
    while i < n {
        s += w.add(i).read_unaligned() * x[i];
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    debug_assert!(row.len() >= 2 * n);
    let (w, xp) = (row.as_ptr(), x.as_ptr());
    let ld = |i: usize| _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i) as *const __m128i));
    let mut a = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, acc) in a.iter_mut().enumerate() {
            let o = i + 8 * j;
            *acc = _mm256_fmadd_ps(ld(o), _mm256_loadu_ps(xp.add(o)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        a[0] = _mm256_fmadd_ps(ld(i), _mm256_loadu_ps(xp.add(i)), a[0]);
        i += 8;
    }
    let mut s = hsum256(_mm256_add_ps(
        _mm256_add_ps(a[0], a[1]),
        _mm256_add_ps(a[2], a[3]),
    ));
    while i < n {
        s += f16c(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])) * x[i];
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma")]
unsafe fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    debug_assert!(row.len() >= 2 * n);
    let (w, xp) = (row.as_ptr(), x.as_ptr());
    let ld = |i: usize| {
        let h = _mm_loadu_si128(w.add(2 * i) as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    };
    let mut a = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, acc) in a.iter_mut().enumerate() {
            let o = i + 8 * j;
            *acc = _mm256_fmadd_ps(ld(o), _mm256_loadu_ps(xp.add(o)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        a[0] = _mm256_fmadd_ps(ld(i), _mm256_loadu_ps(xp.add(i)), a[0]);
        i += 8;
    }
    let mut s = hsum256(_mm256_add_ps(
        _mm256_add_ps(a[0], a[1]),
        _mm256_add_ps(a[2], a[3]),
    ));
    while i < n {
        s += f32::from_bits((u16::from_le_bytes([row[2 * i], row[2 * i + 1]]) as u32) << 16) * x[i];
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_f16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i);
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    while i < n {
        dst[i] = f16c(u16::from_le_bytes([src[2 * i], src[2 * i + 1]]));
        i += 1;
    }
}

#[target_feature(enable = "avx2")]
unsafe fn decode_bf16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i);
        let v = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, v);
        i += 8;
    }
    while i < n {
        dst[i] = f32::from_bits((u16::from_le_bytes([src[2 * i], src[2 * i + 1]]) as u32) << 16);
        i += 1;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
        let d = _mm256_set1_ps(f16c(u16::from_le_bytes([b[0], b[1]])));
        for k in 0..4 {
            let q = _mm_loadl_epi64(b.as_ptr().add(2 + 8 * k) as *const __m128i);
            let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            _mm256_storeu_ps(y.as_mut_ptr().add(8 * k), _mm256_mul_ps(v, d));
        }
    }
}
