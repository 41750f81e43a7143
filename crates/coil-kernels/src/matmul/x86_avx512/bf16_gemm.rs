//! BF16 weights times many tokens (prefill) with AVX512_BF16: the
//! activations rounded to bf16 (round to nearest even, as
//! `vcvtne2ps2bf16` does), products by `vdpbf16ps` (two bf16 products per
//! f32 lane, summed into f32) — the precision llama.cpp and transformers
//! use for bf16 weights, at twice the products per instruction of the exact
//! f32 GEMM (which the F16 files, the CPUs without AVX512_BF16 and those
//! whose `vdpbf16ps` issues too slowly to pay keep: see [`available`]).
//!
//! Layout: a work item is two panels of 16 weight rows (a last odd panel
//! is paired with an empty one), packed `[column pair][16 rows][2]` (one
//! 64-byte vector per `vdpbf16ps`); the activations `[token][cols]` as
//! bf16, so one broadcast of a token's column pair feeds both panels. The
//! microkernel keeps [`NT`] tokens × 32 rows of `y` in registers.

use crate::aligned::AlignedVec;
use crate::matmul::weight::WeightRef;
use crate::pool::SendPtr;
use crate::pool::ThreadPool;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Tokens per microkernel call.
const NT: usize = 8;

/// Whether this CPU can run [`gemm`]: AVX-512 F/BW and AVX512_BF16.
pub fn supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512bf16")
}

/// Whether BF16 prompts take [`gemm`] here: the CPU runs it and its bf16
/// products pay ([`products_pay`]); `COIL_BF16_DOT=0` keeps BF16 weights
/// on the exact f32 GEMM, `COIL_BF16_DOT=1` takes bf16 products wherever
/// the CPU has them. Decided once per process (and said in the system-info
/// line that `coil bench`, `run` and `serve` print at start).
pub fn available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        supported()
            && match std::env::var("COIL_BF16_DOT").as_deref().map(str::trim) {
                Ok("0") => false,
                Ok("1") => true,
                _ => products_pay(),
            }
    })
}

/// Whether `vdpbf16ps` multiplies faster than the f32 FMAs the exact GEMM
/// runs on: CPUs differ by 4× here. On an Intel Xeon model 207 one zmm
/// `vdpbf16ps` (32 products) issues every other cycle against two
/// `vfmadd231ps` (16 each) per cycle, so bf16 products run at half the
/// f32 rate (BF16 prompts 35% slower than exact, measured); where
/// 512-bit FMAs issue once per cycle and `vdpbf16ps` as often, they run
/// at twice it. The ratio of the two rates is measured (register-only
/// loops, best of 7, ~0.1 ms in all) and rounded to a power of two, as
/// issue rates are, before deciding: the products are taken only where
/// they are at least twice as fast (a ratio ≥ √2), so noise of up to
/// ±40% cannot flip the choice on either kind of CPU, and equal rates
/// keep the exact arithmetic.
fn products_pay() -> bool {
    product_ratio().is_some_and(pays)
}

/// The decision of [`products_pay`] on a measured ratio: twice the f32 rate
/// or more, once rounded to a power of two.
fn pays(ratio: f64) -> bool {
    ratio.log2().round() >= 1.0
}

/// `vdpbf16ps`'s products per second over `vfmadd231ps`'s on this CPU
/// (zmm), measured once per process; `None` without AVX512_BF16.
pub fn product_ratio() -> Option<f64> {
    static R: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    // SAFETY: measured only where `supported()` holds.
    *R.get_or_init(|| supported().then(|| unsafe { mac_ratio() }))
}

/// Products per second of `vdpbf16ps` over those of `vfmadd231ps` (zmm),
/// each the best of 7 timings of 12 independent chains.
///
/// # Safety
/// AVX-512 F and AVX512_BF16 available.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn mac_ratio() -> f64 {
    const ITERS: u64 = 2000;
    let (mut bf, mut fma) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..7 {
        let t = std::time::Instant::now();
        // SAFETY (both): register-only loops on zeroed registers.
        std::arch::asm!(
            "vpxord zmm0, zmm0, zmm0", "vmovaps zmm1, zmm0", "vmovaps zmm2, zmm0",
            "vmovaps zmm3, zmm0", "vmovaps zmm4, zmm0", "vmovaps zmm5, zmm0",
            "vmovaps zmm6, zmm0", "vmovaps zmm7, zmm0", "vmovaps zmm8, zmm0",
            "vmovaps zmm9, zmm0", "vmovaps zmm10, zmm0", "vmovaps zmm11, zmm0",
            "vmovaps zmm12, zmm0", "vmovaps zmm13, zmm0",
            "2:",
            "vdpbf16ps zmm0, zmm12, zmm13", "vdpbf16ps zmm1, zmm12, zmm13",
            "vdpbf16ps zmm2, zmm12, zmm13", "vdpbf16ps zmm3, zmm12, zmm13",
            "vdpbf16ps zmm4, zmm12, zmm13", "vdpbf16ps zmm5, zmm12, zmm13",
            "vdpbf16ps zmm6, zmm12, zmm13", "vdpbf16ps zmm7, zmm12, zmm13",
            "vdpbf16ps zmm8, zmm12, zmm13", "vdpbf16ps zmm9, zmm12, zmm13",
            "vdpbf16ps zmm10, zmm12, zmm13", "vdpbf16ps zmm11, zmm12, zmm13",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) ITERS => _,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
            out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
            out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
            out("zmm12") _, out("zmm13") _,
            options(nostack, nomem),
        );
        bf = bf.min(t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        std::arch::asm!(
            "vpxord zmm0, zmm0, zmm0", "vmovaps zmm1, zmm0", "vmovaps zmm2, zmm0",
            "vmovaps zmm3, zmm0", "vmovaps zmm4, zmm0", "vmovaps zmm5, zmm0",
            "vmovaps zmm6, zmm0", "vmovaps zmm7, zmm0", "vmovaps zmm8, zmm0",
            "vmovaps zmm9, zmm0", "vmovaps zmm10, zmm0", "vmovaps zmm11, zmm0",
            "vmovaps zmm12, zmm0", "vmovaps zmm13, zmm0",
            "2:",
            "vfmadd231ps zmm0, zmm12, zmm13", "vfmadd231ps zmm1, zmm12, zmm13",
            "vfmadd231ps zmm2, zmm12, zmm13", "vfmadd231ps zmm3, zmm12, zmm13",
            "vfmadd231ps zmm4, zmm12, zmm13", "vfmadd231ps zmm5, zmm12, zmm13",
            "vfmadd231ps zmm6, zmm12, zmm13", "vfmadd231ps zmm7, zmm12, zmm13",
            "vfmadd231ps zmm8, zmm12, zmm13", "vfmadd231ps zmm9, zmm12, zmm13",
            "vfmadd231ps zmm10, zmm12, zmm13", "vfmadd231ps zmm11, zmm12, zmm13",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) ITERS => _,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
            out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
            out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
            out("zmm12") _, out("zmm13") _,
            options(nostack, nomem),
        );
        fma = fma.min(t.elapsed().as_secs_f64());
    }
    // 32 products per vdpbf16ps, 16 per vfmadd231ps, the same count of each
    (32.0 / bf.max(1e-12)) / (16.0 / fma.max(1e-12))
}

thread_local! {
    /// The activations as bf16, `[n][cols]` (kept between calls).
    static XB: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
    /// Two packed panels, `[cols / 2][16][2]` each, on cache lines.
    static PANELS: RefCell<[AlignedVec<u32>; 2]> = RefCell::new(Default::default());
}

/// `x` (`cols` a multiple of 32) rounded to bf16 into `xb`.
///
/// # Safety
/// AVX-512 F/BW and AVX512_BF16 available.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn to_bf16(x: &[f32], xb: &mut [u16]) {
    for (s, d) in x.chunks_exact(32).zip(xb.chunks_exact_mut(32)) {
        let lo = _mm512_loadu_ps(s.as_ptr());
        let hi = _mm512_loadu_ps(s.as_ptr().add(16));
        let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(d.as_mut_ptr() as *mut _, v);
    }
}

/// Rows `r0..r0 + 16` of `w` (those past the end: zeros) packed as
/// `[column pair][16 rows]` (each u32 a pair of bf16).
///
/// # Safety
/// AVX-512 F available; `w` is BF16 with an even column count.
#[target_feature(enable = "avx512f")]
unsafe fn pack_panel(w: &WeightRef, r0: usize, p: &mut AlignedVec<u32>) {
    let pairs = w.cols / 2;
    p.resize(pairs * 16);
    let nr = 16.min(w.rows.saturating_sub(r0));
    if nr == 0 {
        p.fill(0);
        return;
    }
    let stride = (w.row_bytes() / 4) as i32; // u32 per row
    let idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(stride),
    );
    let live: u16 = if nr == 16 { 0xFFFF } else { (1u16 << nr) - 1 };
    let base = w.data.as_ptr().add(r0 * w.row_bytes()) as *const i32;
    let out = p.as_mut_ptr();
    for c in 0..pairs {
        // the pair of column `c` of the 16 rows
        let v = _mm512_mask_i32gather_epi32::<4>(_mm512_setzero_si512(), live, idx, base.add(c));
        _mm512_storeu_si512(out.add(16 * c) as *mut _, v);
    }
}

/// `y[t, r0..r0+32]` for tokens `ts` (up to [`NT`]; unused slots repeat
/// the last token and are not stored).
///
/// # Safety
/// AVX-512 F/BW and AVX512_BF16 available; panels packed from `cols`
/// columns, `xb` holds every token of `ts`; `y` is `[tokens][rows]`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel(
    p: [&[u32]; 2],
    xb: &[u16],
    cols: usize,
    ts: &[usize],
    nr: [usize; 2],
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    let xp: [*const i32; NT] =
        std::array::from_fn(|i| xb.as_ptr().add(ts[i.min(ts.len() - 1)] * cols) as *const i32);
    let mut acc = [[_mm512_setzero_ps(); NT]; 2];
    let (w0p, w1p) = (p[0].as_ptr(), p[1].as_ptr());
    for c in 0..cols / 2 {
        let w0: __m512bh = std::mem::transmute(_mm512_loadu_si512(w0p.add(16 * c) as *const _));
        let w1: __m512bh = std::mem::transmute(_mm512_loadu_si512(w1p.add(16 * c) as *const _));
        for t in 0..NT {
            let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(xp[t].add(c).read_unaligned()));
            acc[0][t] = _mm512_dpbf16_ps(acc[0][t], w0, x);
            acc[1][t] = _mm512_dpbf16_ps(acc[1][t], w1, x);
        }
    }
    super::igemm::store_pair(&acc, ts, nr, y, rows, r0);
}

/// `y = x · wᵀ` for `n_tokens` tokens of BF16 weights `w` (`cols` a
/// multiple of 32). The caller checks [`available`].
pub fn gemm(pool: &ThreadPool, w: &WeightRef, x: &[f32], y: &mut [f32], n_tokens: usize) {
    let (rows, cols) = (w.rows, w.cols);
    debug_assert!(cols.is_multiple_of(32));
    let mut xb = XB.with(|b| std::mem::take(&mut *b.borrow_mut()));
    xb.resize(n_tokens * cols, 0);
    let xp = SendPtr(xb.as_mut_ptr());
    pool.parallel_for(n_tokens, 16, |tr, _| {
        for t in tr {
            // SAFETY: the CPU has AVX512_BF16 (checked by the caller);
            // token t owns its row of `xb`.
            unsafe {
                let d = std::slice::from_raw_parts_mut(xp.get().add(t * cols), cols);
                to_bf16(&x[t * cols..(t + 1) * cols], d);
            }
        }
    });
    let yp = SendPtr(y.as_mut_ptr());
    let items = rows.div_ceil(32);
    let all: Vec<usize> = (0..n_tokens).collect();
    let xb_ref = &xb;
    pool.parallel_for(items, 1, |ir, _| {
        PANELS.with(|ps| {
            let mut ps = ps.borrow_mut();
            let [pa, pb] = &mut *ps;
            for it in ir {
                let r0 = 32 * it;
                // SAFETY: AVX-512 available (checked by the caller).
                unsafe {
                    pack_panel(w, r0, pa);
                    pack_panel(w, r0 + 16, pb);
                }
                let nr = [16.min(rows - r0), 16.min(rows.saturating_sub(r0 + 16))];
                for ts in all.chunks(NT) {
                    // SAFETY: as above; rows r0..r0+32 of y belong to this
                    // item only.
                    unsafe { kernel([pa, pb], xb_ref, cols, ts, nr, yp.get(), rows, r0) };
                }
            }
        })
    });
    XB.with(|b| *b.borrow_mut() = xb);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    /// bf16 products are taken from twice the f32 rate (rounded to a power
    /// of two), never at equal or lower rates; and the rate measured here
    /// is a real ratio.
    #[test]
    fn products_taken_where_twice_as_fast() {
        for (ratio, want) in [
            (0.5, false),
            (1.0, false),
            (1.3, false),
            (0.05, false),
            (1.5, true),
            (2.0, true),
            (2.6, true),
            (4.0, true),
        ] {
            assert_eq!(pays(ratio), want, "ratio {ratio}");
        }
        if let Some(r) = product_ratio() {
            assert!(r.is_finite() && r > 0.05 && r < 20.0, "ratio {r}");
        }
    }

    /// f32 to bf16 bits, rounded to nearest even (finite values).
    fn bf16_rne(v: f32) -> f32 {
        let b = v.to_bits();
        let r = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
        f32::from_bits(r)
    }

    /// The GEMM is `Σ w · bf16(x)` (the weights exact, the activations
    /// rounded to nearest even), summed in f32: checked against f64 sums of
    /// the same products, ragged panels and token tiles, one and two threads.
    #[test]
    fn products_of_bf16_activations() {
        if !supported() {
            return;
        }
        let mut rng = Rng::new(31);
        for (rows, cols, n, threads) in [(16, 32, 8, 1), (45, 96, 13, 2), (70, 640, 30, 2)] {
            let data = random_weights(&mut rng, GgmlType::BF16, rows, cols);
            let w = WeightRef::new(GgmlType::BF16, &data, rows, cols).unwrap();
            let x = rng.vec(n * cols);
            let pool = ThreadPool::new(threads);
            let mut y = vec![f32::NAN; n * rows];
            gemm(&pool, &w, &x, &mut y, n);
            let mut wr = vec![0f32; cols];
            for r in 0..rows {
                assert!(crate::matmul::scalar::dequant::dequant_row(
                    GgmlType::BF16,
                    w.row(r),
                    &mut wr
                ));
                for t in 0..n {
                    let xs = &x[t * cols..(t + 1) * cols];
                    let (mut want, mut mag) = (0f64, 0f64);
                    for (a, b) in wr.iter().zip(xs) {
                        let p = *a as f64 * bf16_rne(*b) as f64;
                        want += p;
                        mag += p.abs();
                    }
                    let got = y[t * rows + r] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * mag + 1e-9,
                        "{rows}x{cols} n {n} t {t} r {r}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
