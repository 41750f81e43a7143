//! Weight · activation products for every weight format.
//!
//! `y[t, r] = sum_c w[r, c] * x[t, c]` with `w` in ggml row-major layout
//! (`rows` rows of `cols` values, each row encoded in the weight's format),
//! `x`: `[n_tokens, cols]` f32, `y`: `[n_tokens, rows]` f32.
//!
//! Two strategies, chosen per call by format and token count:
//! * few tokens (decode; < 12 for the formats with an integer GEMM at AVX2
//!   or AVX-512, < 24 for other quantized formats, < 16 for F32/F16/BF16):
//!   per-row dot products; quantized formats quantize the activations on the
//!   fly (Q8_0-style for Q8_0/Q4_0/IQ4_NL, Q8_K-style for K-quants and
//!   IQ4_XS) and use integer dot products as llama.cpp does, 4 tokens per
//!   unpacked weight row (AVX-512); F32/F16/BF16 convert weights to f32 in
//!   registers. Memory-bound at one token.
//!   Each token's result is bit for bit the one-token result (the 4-token
//!   kernels do each token's operations in the one-token kernel's order;
//!   activations are quantized per row), so inside
//!   [`crate::numerics::invariant_scope`] this path serves any number of
//!   tokens: batch-invariant mode.
//! * many tokens (prefill): for Q8_0/Q4_0/IQ4_NL/Q4_K/Q5_K/Q6_K/IQ4_XS on
//!   AVX-512 VNNI, an integer GEMM (`igemm`: weights unpacked to i8 per
//!   16-row panel, activations quantized per 32 values); on AVX2, one for
//!   Q4_K/Q5_K/Q6_K/Q8_0 (`igemm_avx2`: `vpmaddubsw` / `vpmaddwd`, 8- and
//!   16-row panels); for every other format and level, [`gemm`] — weights decoded to f32 panel by panel and an
//!   f32 register-tile GEMM. Compute-bound. (Below 4 tokens, formats without
//!   a dot kernel decode each row once and use f32 dots.)

pub mod act;
#[cfg(target_arch = "x86_64")]
mod bf16_gemm;
#[cfg(target_arch = "x86_64")]
mod decode_i8;
pub mod dequant;
pub mod gemm;
#[cfg(target_arch = "x86_64")]
mod igemm;
#[cfg(target_arch = "x86_64")]
mod igemm_avx2;
pub mod vecdot;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

use crate::error::KernelError;
use crate::pool::ThreadPool;
use crate::simd::{self, SimdLevel};
use act::QuantAct;
use coil_gguf::GgmlType;

/// A weight matrix as stored in a GGUF file (zero-copy).
#[derive(Clone, Copy, Debug)]
pub struct WeightRef<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    /// How the rows' blocks are laid out in `data`.
    pub layout: Layout,
}

/// The order of a matrix's encoded blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// As in GGUF files: row after row.
    #[default]
    Rows,
    /// Q4_K, Q6_K or Q8_0 rewritten by [`repack`] for the AVX-512 kernels
    /// that keep 16 rows in the vector lanes (same size; groups of 16 rows).
    Lanes16,
}

/// Rewrites a Q4_K, Q6_K or Q8_0 matrix in place into [`Layout::Lanes16`] when
/// the kernels of this process would use it (the selected SIMD level is
/// AVX-512, `rows` is a multiple of 16, the type is wanted: see
/// `repack_wanted`), and says
/// whether it did. Single tokens, a few tokens (batched decode, speculative
/// verification) and prompts then read 16 rows' blocks as one stretch of
/// memory with no transposition left to do.
pub fn repack(ty: GgmlType, data: &mut [u8], rows: usize, cols: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if repacks(ty) && x86_avx512::lanes::can_repack(rows) && cols.is_multiple_of(256) {
        let nb = cols / 256;
        match ty {
            GgmlType::Q4_K if data.len() == rows * nb * 144 => {
                x86_avx512::lanes::repack(data, rows, cols);
                return true;
            }
            GgmlType::Q6_K if data.len() == rows * nb * 210 => {
                x86_avx512::lanes_q6k::repack(data, rows, cols);
                return true;
            }
            GgmlType::Q8_0 if data.len() == rows * nb * 8 * 34 => {
                x86_avx512::lanes_q8_0::repack(data, rows, cols);
                return true;
            }
            _ => {}
        }
    }
    let _ = (ty, data, rows, cols);
    false
}

/// Whether [`repack`] rewrites matrices of `ty` (of a shape it takes) in
/// this process.
pub fn repacks(ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        simd::level() >= SimdLevel::Avx512
            && matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q8_0)
            && repack_wanted(ty)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        false
    }
}

/// Whether matrices of `ty` go into the rows-in-lanes layout: `COIL_REPACK`
/// unset (or `auto`): Q4_K and Q8_0 always, Q6_K except where 512-bit operations
/// run as two halves ([`simd::split_512`]: on an AMD Zen 4 the Q6_K lanes
/// kernel's unpacking — 3 shifts, 2 merges and 4 masks per 64 values —
/// read one token's weights at 18–21 GB/s against 37–41 for the plain
/// rows' kernel, and 8 tokens' no faster; there the AVX2 rows-in-lanes
/// kernels take Q6_K's few-token products from the file's layout, see
/// [`split_q6k_lanes`]); `0`: neither; `all`: both;
/// `noq6`: Q4_K and Q8_0 only (one sequence decoding in a batched engine
/// ~4% faster on qwen35-0.8b-like Q4_K_M, eight ~11% slower).
fn repack_wanted(ty: GgmlType) -> bool {
    let setting = std::env::var("COIL_REPACK").ok();
    repack_setting_wants(setting.as_deref(), ty, simd::split_512())
}

/// [`repack_wanted`] for a `COIL_REPACK` value (`None`: unset) on a CPU
/// that does (`split_512`) or does not run 512-bit operations as halves.
fn repack_setting_wants(setting: Option<&str>, ty: GgmlType, split_512: bool) -> bool {
    match setting.map(str::trim) {
        Some("0") => false,
        Some("all") => true,
        Some("noq6") => ty != GgmlType::Q6_K,
        _ => ty != GgmlType::Q6_K || !split_512,
    }
}

impl<'a> WeightRef<'a> {
    /// Checks that `ty` is supported, `cols` is a whole number of blocks and
    /// `data` holds exactly `rows` encoded rows.
    pub fn new(
        ty: GgmlType,
        data: &'a [u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, KernelError> {
        if !supported(ty) {
            return Err(KernelError::UnsupportedType(ty));
        }
        let (bs, ts) = ty.block_layout();
        if !cols.is_multiple_of(bs) {
            return Err(KernelError::BadColumns {
                ty,
                cols,
                block: bs,
            });
        }
        let expected = (cols / bs)
            .checked_mul(ts)
            .and_then(|b| b.checked_mul(rows))
            .unwrap_or(usize::MAX);
        if data.len() != expected {
            return Err(KernelError::BadLength {
                ty,
                rows,
                cols,
                expected,
                got: data.len(),
            });
        }
        Ok(WeightRef {
            ty,
            data,
            rows,
            cols,
            layout: Layout::Rows,
        })
    }

    /// Bytes per encoded row.
    #[inline]
    pub fn row_bytes(&self) -> usize {
        let (bs, ts) = self.ty.block_layout();
        self.cols / bs * ts
    }

    /// The encoded row `r`.
    #[inline]
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    /// The bytes of row `r`, columns `k0..k0+kc` (both multiples of the block size).
    #[inline]
    pub fn row_range(&self, r: usize, k0: usize, kc: usize) -> &'a [u8] {
        let (bs, ts) = self.ty.block_layout();
        let start = r * self.row_bytes() + k0 / bs * ts;
        &self.data[start..start + kc / bs * ts]
    }

    /// Decodes row `r` to f32 (`out.len() == cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols);
        match self.layout {
            Layout::Rows => decode_segment(self.ty, self.row(r), out, simd::level()),
            Layout::Lanes16 => {
                let mut plain = vec![0u8; self.row_bytes()];
                #[cfg(target_arch = "x86_64")]
                match self.ty {
                    GgmlType::Q6_K => {
                        x86_avx512::lanes_q6k::unpack_row(self.data, self.cols, r, &mut plain)
                    }
                    GgmlType::Q8_0 => {
                        x86_avx512::lanes_q8_0::unpack_row(self.data, self.cols, r, &mut plain)
                    }
                    _ => x86_avx512::lanes::unpack_row(self.data, self.cols, r, &mut plain),
                }
                decode_segment(self.ty, &plain, out, simd::level());
            }
        }
    }
}

/// Whether the kernels can multiply weights of type `ty`.
pub fn supported(ty: GgmlType) -> bool {
    dequant::native(ty) || fallback::can_dequantize(ty)
}

/// Fallback decoding through the format layer, for formats without native code.
mod fallback {
    use coil_gguf::GgmlType;

    pub fn can_dequantize(ty: GgmlType) -> bool {
        coil_gguf::quant::can_dequantize(ty)
    }

    pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
        coil_gguf::quant::dequantize_row(ty, src, dst).is_ok()
    }
}

/// Decodes whole blocks of `ty` from `src` into `dst` (f32).
pub(crate) fn decode_segment(ty: GgmlType, src: &[u8], dst: &mut [f32], level: SimdLevel) {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx512 && x86_avx512::decode(ty, src, dst) {
            return;
        }
        if level >= SimdLevel::Avx2 && x86_avx2::decode(ty, src, dst, level) {
            return;
        }
    }
    let _ = level;
    if !dequant::dequant_row(ty, src, dst) && !fallback::dequantize(ty, src, dst) {
        unreachable!("WeightRef::new admits only decodable types, got {ty}");
    }
}

pub(crate) use crate::pool::SendPtr;

/// `y[t, r] = sum_c w[r, c] * x[t, c]`; `x`: `[n_tokens, w.cols]`,
/// `y`: `[n_tokens, w.rows]` (overwritten). Uses the best SIMD level.
pub fn matmul(pool: &ThreadPool, w: &WeightRef, x: &[f32], y: &mut [f32], n_tokens: usize) {
    matmul_at(pool, w, x, y, n_tokens, simd::level())
}

/// `ys[i] = x · ws[i]ᵀ` for several matrices of one input (a feed-forward
/// block's gate and up projections, an attention layer's q, k and v): each
/// result is bit for bit what [`matmul`] gives it alone, and where the
/// kernels would quantize the activations for each matrix (the integer
/// GEMMs), the matrices that take the same quantization get it once.
pub fn matmul_shared(
    pool: &ThreadPool,
    ws: &[&WeightRef],
    x: &[f32],
    ys: &mut [&mut [f32]],
    n_tokens: usize,
) {
    assert_eq!(ws.len(), ys.len(), "matmul_shared: one output per matrix");
    for (w, y) in ws.iter().zip(ys.iter()) {
        check_shapes(w, x, y, n_tokens);
    }
    let level = simd::level().min(simd::detected_level());
    let keys: Vec<Option<SharedActs>> =
        ws.iter().map(|w| shared_acts(w, n_tokens, level)).collect();
    for i in 0..ws.len() {
        // the first matrix of each quantization runs its group (the later
        // ones from i on); a matrix without one runs alone (one-token
        // decode steps: every one, no allocation)
        let Some(k) = keys[i] else {
            matmul_at(pool, ws[i], x, ys[i], n_tokens, level);
            continue;
        };
        if keys[..i].contains(&Some(k)) {
            continue;
        }
        let group: Vec<usize> = (i..ws.len()).filter(|&j| keys[j] == Some(k)).collect();
        if group.len() == 1 {
            matmul_at(pool, ws[i], x, ys[i], n_tokens, level);
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let gw: Vec<&WeightRef> = group.iter().map(|&j| ws[j]).collect();
            let mut gy: Vec<&mut [f32]> = ys
                .iter_mut()
                .enumerate()
                .filter(|(j, _)| group.contains(j))
                .map(|(_, y)| &mut **y)
                .collect();
            match k {
                SharedActs::Avx512(_) => igemm::igemm_many(pool, &gw, x, &mut gy, n_tokens),
                SharedActs::Avx2(_) => igemm_avx2::igemm_many(pool, &gw, x, &mut gy, n_tokens),
            }
        }
    }
}

/// An activation quantization that several matrices' products can share.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SharedActs {
    #[cfg(target_arch = "x86_64")]
    Avx512(igemm::ActMode),
    #[cfg(target_arch = "x86_64")]
    Avx2(igemm_avx2::ActKey),
}

/// [`SharedActs`] of `w`'s product with `n_tokens` tokens at `level` (as
/// [`matmul_at`] routes it); `None`: the product does not quantize its
/// activations, or not in a shareable way.
#[allow(unused_variables)]
fn shared_acts(w: &WeightRef, n_tokens: usize, level: SimdLevel) -> Option<SharedActs> {
    #[cfg(target_arch = "x86_64")]
    {
        if igemm_route(w, n_tokens, level) {
            return Some(SharedActs::Avx512(igemm::act_mode(w.ty)));
        }
        if igemm_avx2_route(w, n_tokens, level) {
            return igemm_avx2::shared_acts(w.ty).map(SharedActs::Avx2);
        }
    }
    None
}

/// Whether [`matmul_at`] runs `w`'s product with `n_tokens` tokens on the
/// AVX-512 integer GEMM (the one place that decides it).
#[cfg(target_arch = "x86_64")]
fn igemm_route(w: &WeightRef, n_tokens: usize, level: SimdLevel) -> bool {
    level >= SimdLevel::Avx512 && igemm::supported(w.ty) && int_gemm_sized(w, n_tokens, level)
}

/// Whether [`matmul_at`] runs `w`'s product with `n_tokens` tokens on the
/// AVX2 integer GEMM (the one place that decides it).
#[cfg(target_arch = "x86_64")]
fn igemm_avx2_route(w: &WeightRef, n_tokens: usize, level: SimdLevel) -> bool {
    avx2_igemm_at(w.ty, level) && w.layout == Layout::Rows && int_gemm_sized(w, n_tokens, level)
}

/// Whether `ty`'s integer GEMM at `level` is the AVX2 one.
#[cfg(target_arch = "x86_64")]
fn avx2_igemm_at(ty: GgmlType, level: SimdLevel) -> bool {
    level == SimdLevel::Avx2 && igemm_avx2::supported(ty)
}

/// What both integer GEMMs' choices ask beyond the format and level: not
/// batch-invariant, enough tokens for a GEMM to beat the dot kernels.
#[cfg(target_arch = "x86_64")]
fn int_gemm_sized(w: &WeightRef, n_tokens: usize, level: SimdLevel) -> bool {
    if n_tokens <= 1
        || w.rows == 0
        || w.cols == 0
        || !int_gemm_enabled()
        || crate::numerics::batch_invariant()
    {
        return false;
    }
    match (w.layout, vec_kernel(w.ty, level, false)) {
        (Layout::Lanes16, _) | (_, Some(_)) => n_tokens >= gemm_from(w, level),
        (_, None) => n_tokens >= 4,
    }
}

/// Tokens from which `w`'s products go to a GEMM at `level`:
/// [`gemm_min_tokens`], or [`SPLIT_Q6K_GEMM_FROM`] for [`split_q6k_lanes`].
fn gemm_from(w: &WeightRef, level: SimdLevel) -> usize {
    if split_q6k_lanes(w, level) && gemm_override().is_none() {
        SPLIT_Q6K_GEMM_FROM
    } else {
        gemm_min_tokens(w.ty, level)
    }
}

/// Whether `w` is a Q6_K matrix in the file's layout at the AVX-512 level of
/// a CPU that runs 512-bit operations as halves ([`simd::split_512`]: AMD
/// Zen 4, where the loader leaves Q6_K unrepacked) with the AVX2
/// rows-in-lanes Q6_K kernels on. Its products then take the AVX2 level's
/// rows-in-lanes kernels (`x86_avx2::lanes_q6_k`, `vpdpbusd` on 256-bit
/// vectors; 16 tokens per pass, the rows transposed as read) up to
/// [`SPLIT_Q6K_GEMM_FROM`] tokens: for every token count in a batched
/// engine's pool (one kernel family per pool keeps batched decoding
/// batch-invariant), from [`SPLIT_Q6K_LANES_FROM`] in a single stream's
/// prompts (its one-token products stay the AVX-512 row kernel's). AMD Zen
/// 4 (family 25 model 17), 2 threads, `probe`, ms, these / the AVX-512
/// 8-token tile (5–11 tokens) or integer GEMM (12 on): 5 tokens 2048 x
/// 5632 0.36–0.43 / 0.42–0.49; 6 tokens 0.39 / 0.48; 8 tokens 248320 x
/// 1024 12.3–12.5 / 15.3–16.0, 2048 x 5632 0.47 / 0.66–0.74; 16 tokens
/// 0.79–0.80 / 1.47–1.72; 20–32 tokens ahead of the GEMM (2048 x 5632 20
/// tokens 1.12–1.18 / 1.38–1.39, 32 1.60–1.64 / 1.77–1.78), 40 level, 48
/// on behind (64 tokens 2.92–2.98 / 3.28–3.33); one and two tokens from
/// memory level (248320 x 1024: 5.7–6.2 / 5.8–6.6 ms), 3–4 tokens ~10%
/// behind.
#[cfg(target_arch = "x86_64")]
fn split_q6k_lanes(w: &WeightRef, level: SimdLevel) -> bool {
    level == SimdLevel::Avx512
        && w.ty == GgmlType::Q6_K
        && w.layout == Layout::Rows
        && simd::split_512()
        && x86_avx2::lanes(GgmlType::Q6_K, false)
}

#[cfg(not(target_arch = "x86_64"))]
fn split_q6k_lanes(_: &WeightRef, _: SimdLevel) -> bool {
    false
}

/// See [`split_q6k_lanes`].
const SPLIT_Q6K_LANES_FROM: usize = 5;
/// See [`split_q6k_lanes`].
const SPLIT_Q6K_GEMM_FROM: usize = 33;

fn check_shapes(w: &WeightRef, x: &[f32], y: &[f32], n_tokens: usize) {
    assert_eq!(
        x.len(),
        n_tokens * w.cols,
        "matmul: x is not [n_tokens, cols]"
    );
    assert_eq!(
        y.len(),
        n_tokens * w.rows,
        "matmul: y is not [n_tokens, rows]"
    );
}

/// [`matmul`] at a given SIMD level (capped at what the CPU supports).
pub fn matmul_at(
    pool: &ThreadPool,
    w: &WeightRef,
    x: &[f32],
    y: &mut [f32],
    n_tokens: usize,
    level: SimdLevel,
) {
    let level = level.min(simd::detected_level());
    check_shapes(w, x, y, n_tokens);
    if n_tokens == 0 || w.rows == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if igemm_route(w, n_tokens, level) {
        return igemm::igemm(pool, w, x, y, n_tokens);
    }
    #[cfg(target_arch = "x86_64")]
    if igemm_avx2_route(w, n_tokens, level) {
        return igemm_avx2::igemm(pool, w, x, y, n_tokens);
    }
    if w.layout == Layout::Lanes16 {
        return matmul_lanes(pool, w, x, y, n_tokens, level);
    }
    if w.cols == 0 {
        y.fill(0.0);
        return;
    }
    // One token, or batch-invariant numerics: per-row dot products, each
    // token's result computed exactly as if it were alone (see
    // [`crate::numerics`]).
    let per_row = n_tokens == 1 || crate::numerics::batch_invariant();
    let single = pool.single_stream();
    let dot_level = if split_q6k_lanes(w, level)
        && (!single || (!per_row && n_tokens >= SPLIT_Q6K_LANES_FROM))
    {
        SimdLevel::Avx2
    } else {
        float_dot_level(pool, w.ty, level)
    };
    match vec_kernel(w.ty, dot_level, single) {
        Some(k) if per_row || n_tokens < gemm_from(w, level) => vec_path(
            pool,
            w,
            x,
            y,
            n_tokens,
            k,
            rows_kernel(w.ty, dot_level, single),
            tile_kernel(w.ty, dot_level, single),
            float_rows_kernel(w.ty, dot_level),
        ),
        None if per_row || n_tokens < 4 => decode_vec_path(pool, w, x, y, n_tokens, level),
        // (the integer GEMMs were chosen above, `igemm_route`)
        _ => {
            // BF16 weights: bf16 products where the CPU has them (the
            // activations rounded to bf16), else the exact f32 GEMM.
            #[cfg(target_arch = "x86_64")]
            if level >= SimdLevel::Avx512
                && w.ty == GgmlType::BF16
                && w.cols.is_multiple_of(32)
                && bf16_gemm::available()
            {
                return bf16_gemm::gemm(pool, w, x, y, n_tokens);
            }
            gemm::gemm(pool, w, x, y, n_tokens, level)
        }
    }
}

/// The level of the per-row products of `ty` on `pool`: F16 / BF16 at the
/// AVX2 level's 256-bit kernels where the pool asks for them
/// ([`ThreadPool::set_single_stream`]). Measured on an Intel Xeon (family
/// 6 model 167), 2 threads, 512-bit → 256-bit: one token (`coil bench -p 0
/// -n 64 -r 2`, two rounds each) qwen35-0.8b-like F16 18.3 → 20.7–20.9
/// tokens/s, BF16 18.1 → 21.0, mamba2-370m-like F16 34.3–35.6 → 39.4–40.0,
/// lfm2-1.2b-like F16 12.6 → 13.2, BF16 12.3–12.4 → 13.2 (a memory-bound
/// loop gains nothing from the width, and the core runs slower under
/// 512-bit float work); eight sequences (`coil bench --parallel 8 -p 16 -n
/// 32`, mamba2-370m-like F16) 109.2–109.6 → 89.9–90.6 generated tokens/s.
/// Engines ask for them when they run one sequence at a time
/// (`EngineOptions::batched_layout` off).
fn float_dot_level(pool: &ThreadPool, ty: GgmlType, level: SimdLevel) -> SimdLevel {
    match ty {
        GgmlType::F16 | GgmlType::BF16 if pool.single_stream() => level.min(SimdLevel::Avx2),
        _ => level,
    }
}

/// [`matmul_at`] for a [`Layout::Lanes16`] matrix (made only where the
/// AVX-512 level was selected), after its shape checks.
fn matmul_lanes(
    pool: &ThreadPool,
    w: &WeightRef,
    x: &[f32],
    y: &mut [f32],
    n_tokens: usize,
    level: SimdLevel,
) {
    assert!(
        level >= SimdLevel::Avx512
            && matches!(w.ty, GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q8_0),
        "matmul: a {} matrix repacked for AVX-512 at the {level:?} level",
        w.ty
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the AVX-512 level was checked above.
    unsafe {
        x86_avx512::lanes::matmul_packed(pool, w, x, y, n_tokens, gemm_min_tokens(w.ty, level))
    };
}

/// 0 = from the environment, 1 = on, 2 = off.
static INT_GEMM: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Integer GEMM for prefill (AVX-512 VNNI: the 32-block formats; AVX2: Q4_K,
/// Q5_K, Q6_K and the 32-blocks Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
/// IQ4_XS): on unless
/// `COIL_INT_GEMM=0` is set or [`set_int_gemm`]`(false)` was called.
fn int_gemm_enabled() -> bool {
    use std::sync::atomic::Ordering;
    match INT_GEMM.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let on = std::env::var("COIL_INT_GEMM").map_or(true, |v| v != "0");
            INT_GEMM.store(if on { 1 } else { 2 }, Ordering::Relaxed);
            on
        }
    }
}

/// Whether prefill of `ty` at `level` has an integer GEMM (used unless it
/// is switched off, see [`set_int_gemm`]).
pub fn has_int_gemm(ty: GgmlType, level: SimdLevel) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        (level >= SimdLevel::Avx512 && igemm::supported(ty)) || avx2_igemm_at(ty, level)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, level);
        false
    }
}

/// Whether prompts through BF16 weights take bf16 products at the AVX-512
/// level (the CPU has AVX512_BF16, its `vdpbf16ps` multiplies at least
/// twice as fast as its f32 FMAs, measured once per process, or
/// `COIL_BF16_DOT=1`; `COIL_BF16_DOT=0` never); else they stay exact in
/// f32.
pub fn bf16_products() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        bf16_gemm::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `vdpbf16ps`'s products per second over the f32 FMAs' on this CPU, where
/// it has AVX512_BF16 (measured once per process).
pub fn bf16_product_ratio() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        bf16_gemm::product_ratio()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Chooses (process-wide) between the integer GEMM and the f32 GEMM for
/// prefill of the formats that have both (benchmarks, A/B checks).
pub fn set_int_gemm(enabled: bool) {
    INT_GEMM.store(
        if enabled { 1 } else { 2 },
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// `COIL_GEMM_MIN_TOKENS`, if set to a number.
fn gemm_override() -> Option<usize> {
    static OVERRIDE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *OVERRIDE.get_or_init(|| {
        std::env::var("COIL_GEMM_MIN_TOKENS")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

/// Token count from which the GEMM strategy wins over per-row dot products.
/// (Measured on a 2-core AVX-512 machine: with the 4-token dot kernels the
/// quantized formats cross over at ~24 tokens against the f32 GEMM, ~12
/// against the integer GEMM, F16 at ~16.)
/// `COIL_GEMM_MIN_TOKENS` in the environment overrides it (for tuning; a
/// single token and the batch-invariant mode take the dot products whatever
/// it says).
fn gemm_min_tokens(ty: GgmlType, level: SimdLevel) -> usize {
    use GgmlType::*;
    if let Some(o) = gemm_override() {
        return o;
    }
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx512 && igemm::supported(ty) && int_gemm_enabled() {
        // The two-panel integer GEMM overtakes the dot kernels early
        // (2 threads, 4096 x 4096: Q4_K 16 tokens 0.91 ms against 1.79,
        // 8 tokens even; Q8_0 16 tokens 1.75-2.04 against 2.51). Q4_1,
        // Q5_0, Q5_1 have no few-token tiles: the GEMM from 8, as for their
        // f32 GEMM.
        return if matches!(ty, Q4_1 | Q5_0 | Q5_1) {
            8
        } else {
            12
        };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_igemm_at(ty, level) && int_gemm_enabled() {
        // The AVX2 integer GEMM (Q4_K/Q5_K/Q6_K/Q8_0) crossed the
        // row-at-a-time dot kernels at about 8 tokens (4096 x 4096, 1
        // thread; at 12 tokens Q8_0 6.5 ms against 8.3, Q4_K 6.1 against
        // 14.0): from 12 where no rows-in-lanes tile says otherwise (Q4_1
        // / Q5_0 / Q5_1, without few-token tiles, from 8). With AVX-VNNI
        // the Q4_K / Q6_K lanes use `vpdpbusd` too; their crossover there
        // is unmeasured (on an AMD Zen 4, the Q6_K lanes with AVX-512
        // VNNI on 256-bit vectors stay ahead of the AVX-512 GEMM to ~32
        // tokens: `split_q6k_lanes`).
        // Without AVX-VNNI, since Q4_K's rows-in-lanes tile takes up to 16
        // tokens per pass, the tiles stay ahead much longer (AMD Zen 3,
        // 4096 x 4096, the GEMM against the tiles, ms): Q4_K 1 thread 24
        // tokens 5.7-5.9 against 4.6-4.7, 32 tokens 6.7-6.8 against 6.0, 40
        // tokens 7.9-8.0 against 7.6; Q6_K 16 tokens 6.1-6.3 against 4.6, 18
        // tokens 6.5-7.0 against 5.2; 2 threads Q4_K 32 tokens 3.4-3.5
        // against 3.1, Q6_K 16 tokens 3.0-3.7 against 2.4. Q6_K's
        // rows-in-lanes tile (16 tokens per pass) stays ahead of the GEMM
        // to 48 tokens (2 threads, ms, tiles against the GEMM: 32768 x 1024
        // 24 tokens 5.6 / 7.5, 32 7.2-7.3 / 9.2-9.3, 48 10.8-11.3 /
        // 12.4-12.6; 1024 x 3584 48 tokens 1.19-1.21 / 1.33-1.37, 64 2.04 /
        // 1.65).
        return match ty {
            Q4_1 | Q5_0 | Q5_1 => 8,
            Q4_K if !crate::simd::avx_vnni() && x86_avx2::lanes(ty, false) => 33,
            Q6_K if !crate::simd::avx_vnni() && x86_avx2::lanes(ty, false) => 49,
            Q6_K if !crate::simd::avx_vnni() => 19,
            _ => 12,
        };
    }
    match (ty, level) {
        (_, SimdLevel::Scalar) => 4,
        (F32 | F16 | BF16, _) => 16,
        // no few-token tiles: the float GEMM from 8 tokens
        (Q4_1 | Q5_0 | Q5_1, _) => 8,
        _ => 24,
    }
}

/// Which activation quantization a dot kernel wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActKind {
    Q8_0,
    Q8K,
}

pub(crate) type FloatDot = fn(&[u8], &[f32]) -> f32;
pub(crate) type QuantDot = fn(&[u8], &[i8], &[f32], &[i16]) -> f32;
/// Four tokens at once (the weight row is unpacked once).
pub(crate) type QuantDot4 = fn(&[u8], [&[i8]; 4], [&[f32]; 4], [&[i16]; 4]) -> [f32; 4];
/// One token against consecutive rows: `out[i] = row i · x` for the
/// `out.len()` rows of `row_bytes` bytes at the start of the data (decode:
/// no call per row, constants set up once, rows prefetched ahead).
pub(crate) type QuantRows = fn(&[u8], usize, &[i8], &[f32], &[i16], &mut [f32]);

/// A few tokens (up to the kernel's maximum, at least 4) against consecutive
/// rows: `out[t][i] = row i · token t`
/// for the `out[t].len()` rows of `row_bytes` bytes at the start of the data
/// (each row unpacked once for all the tokens; each token's result bit for
/// bit the one-token kernel's).
pub(crate) type QuantTile = fn(&[u8], usize, &act::ActPanel, &mut [&mut [f32]]);

/// A few-token kernel with what it asks of its calls.
#[derive(Clone, Copy)]
pub(crate) struct TileKernel {
    pub f: QuantTile,
    /// Most tokens per call.
    pub max_tokens: usize,
    /// Values per interleaved chunk of the [`act::ActPanel`] it reads (one
    /// vector's worth: 32 at AVX2, 64 at AVX-512).
    pub chunk: usize,
    /// Columns it handles: a multiple of this (the others go through the
    /// dot kernels, token by token).
    pub cols_multiple: usize,
    /// Builds its panels when it reads other fields than
    /// [`act::ActPanel::new`]'s (once per product).
    pub own_panel: Option<PanelBuild>,
}

/// A tile kernel's own panel of tokens `t0..t0 + nt` of the activations.
pub(crate) type PanelBuild = fn(&QuantAct, usize, usize) -> act::ActPanel;

impl TileKernel {
    /// The panel this kernel reads for tokens `t0..t0 + nt` of `xa`
    /// (blocks of `block` values with `per_block` group sums).
    pub(crate) fn panel(
        &self,
        xa: &QuantAct,
        t0: usize,
        nt: usize,
        block: usize,
        per_block: usize,
    ) -> act::ActPanel {
        match self.own_panel {
            Some(build) => build(xa, t0, nt),
            None => act::ActPanel::new(xa, t0, nt, block, per_block, self.chunk),
        }
    }
}

/// Rows the few-token path multiplies with every group of tokens before it
/// moves on, so the later groups find them in L1/L2.
const TILE_ROWS: usize = 32;

#[derive(Clone, Copy)]
pub(crate) enum VecKernel {
    Float(FloatDot),
    Quant(ActKind, QuantDot, Option<QuantDot4>),
}

/// The few-token row-range kernel of `ty` at `level`, if there is one: it
/// comes from the level whose dot [`vec_kernel`] picks (the same
/// arithmetic, so each token's result is the one-token kernel's).
/// `single`: for a pool that runs one sequence at a time
/// ([`ThreadPool::single_stream`]), as for [`vec_kernel`] and
/// [`rows_kernel`].
fn tile_kernel(ty: GgmlType, level: SimdLevel, single: bool) -> Option<TileKernel> {
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx512 && x86_avx512::vec_kernel(ty).is_some() {
        return x86_avx512::tile_kernel(ty);
    }
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx2 {
        return x86_avx2::tile_kernel(ty, x86_avx2::lanes(ty, single));
    }
    let _ = (ty, level, single);
    None
}

/// The one-token row-range kernel of `ty` at `level` (`single`: as for
/// [`tile_kernel`]), if there is one.
fn rows_kernel(ty: GgmlType, level: SimdLevel, single: bool) -> Option<QuantRows> {
    // The rows kernel comes from the level whose dot `vec_kernel` picks
    // (the same arithmetic): AVX-512 where it has a dot for `ty`, else AVX2.
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx512 && x86_avx512::vec_kernel(ty).is_some() {
        return x86_avx512::rows_kernel(ty);
    }
    #[cfg(target_arch = "x86_64")]
    if level >= SimdLevel::Avx2 {
        return x86_avx2::rows_kernel(ty, x86_avx2::lanes(ty, single));
    }
    let _ = (ty, level, single);
    None
}

/// The one-token rows kernel of a 16-bit float format at `level`, if there
/// is one (rows in pairs: F16 and BF16 at AVX-512 and AVX2), each
/// row's result bit for bit its [`VecKernel::Float`] dot product's (the
/// same level's).
fn float_rows_kernel(ty: GgmlType, level: SimdLevel) -> Option<FloatRows> {
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx512 && x86_avx512::vec_kernel(ty).is_some() {
            return x86_avx512::float_pairs::rows_kernel(ty);
        }
        if level >= SimdLevel::Avx2 {
            return x86_avx2::float_pairs::rows_kernel(ty);
        }
    }
    let _ = (ty, level);
    None
}

/// One token's rows of a float format: `(w, x, out)`, `w` from the first
/// of `out.len()` rows.
type FloatRows = fn(&[u8], &[f32], &mut [f32]);

/// The dot product of one row of `ty` with one token at `level`; `single`:
/// for a pool that runs one sequence at a time (at AVX2, Q8_0 then takes its
/// row-at-a-time kernels, see `x86_avx2::lanes`).
fn vec_kernel(ty: GgmlType, level: SimdLevel, single: bool) -> Option<VecKernel> {
    use GgmlType::*;
    #[cfg(target_arch = "x86_64")]
    {
        if level >= SimdLevel::Avx512 {
            if let Some(k) = x86_avx512::vec_kernel(ty) {
                return Some(k);
            }
        }
        if level >= SimdLevel::Avx2 {
            if let Some(k) = x86_avx2::vec_kernel(ty, x86_avx2::lanes(ty, single)) {
                return Some(k);
            }
        }
    }
    let _ = (level, single);
    Some(match ty {
        F32 => VecKernel::Float(vecdot::dot_f32_bytes),
        F16 => VecKernel::Float(vecdot::dot_f16),
        BF16 => VecKernel::Float(vecdot::dot_bf16),
        Q8_0 => VecKernel::Quant(ActKind::Q8_0, vecdot::dot_q8_0, None),
        Q4_0 => VecKernel::Quant(ActKind::Q8_0, vecdot::dot_q4_0, None),
        IQ4_NL => VecKernel::Quant(ActKind::Q8_0, vecdot::dot_iq4_nl, None),
        Q5_0 => VecKernel::Quant(ActKind::Q8_0, vecdot::dot_q5_0, None),
        Q5_1 => VecKernel::Quant(ActKind::Q8_0, vecdot::dot_q5_1, None),
        Q4_1 => VecKernel::Quant(ActKind::Q8_0, vecdot::dot_q4_1, None),
        Q2_K => VecKernel::Quant(ActKind::Q8K, vecdot::dot_q2_k, None),
        Q3_K => VecKernel::Quant(ActKind::Q8K, vecdot::dot_q3_k, None),
        Q4_K => VecKernel::Quant(ActKind::Q8K, vecdot::dot_q4_k, None),
        Q5_K => VecKernel::Quant(ActKind::Q8K, vecdot::dot_q5_k, None),
        Q6_K => VecKernel::Quant(ActKind::Q8K, vecdot::dot_q6_k, None),
        IQ4_XS => VecKernel::Quant(ActKind::Q8K, vecdot::dot_iq4_xs, None),
        _ => return None,
    })
}

/// Rows the decode path fetches ahead of the one it multiplies.
pub(crate) const PF_ROWS: usize = 8;

/// How far ahead (bytes) the row-prefetching decode kernels fetch.
const PF_BYTES: usize = 4096;

/// Rows of `rb` bytes fetched ahead by the decode kernels that prefetch
/// whole rows (AVX2 IQ4_XS; AVX-512 Q8_0/Q4_0/IQ4_NL/IQ4_XS): about
/// [`PF_BYTES`], at most [`PF_ROWS`]. Eight rows of a wide matrix (an FFN
/// down projection's 8192 columns: 37–54 KB at Q4_K–Q6_K) overran the
/// 32 KB L1 and evicted the rows about to be used (lfm2-1.2b-like Q4_K_M,
/// CPU time of `coil bench -p 0 -n 64`, AVX2: 6.93–7.27 s with 8 rows,
/// 6.60–6.77 s with 1–8 KB ahead). The AVX2 32-value and K-quant kernels
/// and the AVX-512 K-quants went further: a prefetch per block, a fixed
/// distance ahead (`x86_avx2::PF_STREAM`), faster again.
#[inline]
pub(crate) fn pf_rows(rb: usize) -> usize {
    (PF_BYTES / rb.max(1)).clamp(1, PF_ROWS)
}

/// Prefetches the encoded rows `r0..r1` of `w`.
#[inline]
fn prefetch_rows(w: &WeightRef, r0: usize, r1: usize) {
    if r1 > r0 {
        let rb = w.row_bytes();
        gemm::prefetch(&w.data[r0 * rb..r1 * rb]);
    }
}

/// `n` tokens as `(first, count)` groups of at most `max`: as few groups as
/// that allows, their counts within one of each other, larger first.
fn balanced_groups(n: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let groups = n.div_ceil(max.max(1));
    let (base, extra) = (n / groups.max(1), n % groups.max(1));
    (0..groups).map(move |g| (g * base + g.min(extra), base + usize::from(g < extra)))
}

/// Splits `0..rows` into chunks for the decode path and runs `f` on them
/// over the pool. Guided: each chunk takes `1/(2·threads)` of the rows
/// still left, but at least `rows/(4·threads)` (and 16): about 7 chunks
/// for 2 threads. The first chunks are long contiguous
/// ranges, which stream from memory better than many small ones, and the
/// last are short, so no thread waits long for the other at the end.
/// Measured, 2 threads, tg128, against the 16 chunks of at most 256 rows
/// used before: hybrid-350m-like F16 47 -> 63 tokens/s, quantized files
/// +5-15%. `COIL_GRAIN_DIV=d` uses `d` equal chunks per thread instead.
fn rows_for<F>(pool: &ThreadPool, rows: usize, f: F)
where
    F: Fn(std::ops::Range<usize>) + Sync,
{
    static DIV: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let div = *DIV.get_or_init(|| {
        std::env::var("COIL_GRAIN_DIV")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&d| d > 0)
    });
    let nt = pool.n_threads();
    if let Some(d) = div {
        return pool.parallel_for(rows, (rows / (nt * d)).max(16), |rr, _| f(rr));
    }
    let min = (rows / (4 * nt)).max(16);
    let mut bounds = vec![0usize];
    let mut at = 0;
    while at < rows {
        let left = rows - at;
        at += (left / (2 * nt)).max(min).min(left);
        bounds.push(at);
    }
    pool.parallel_for(bounds.len() - 1, 1, |cr, _| {
        for c in cr {
            f(bounds[c]..bounds[c + 1]);
        }
    });
}

thread_local! {
    static ROWBUF: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Few tokens, format without a dot kernel: decode each row to f32 once,
/// then f32 dot products with every token.
fn decode_vec_path(
    pool: &ThreadPool,
    w: &WeightRef,
    x: &[f32],
    y: &mut [f32],
    n_tokens: usize,
    level: SimdLevel,
) {
    let (rows, cols) = (w.rows, w.cols);
    let Some(VecKernel::Float(dot)) = vec_kernel(GgmlType::F32, level, false) else {
        unreachable!("F32 always has a float dot kernel")
    };
    let yp = SendPtr(y.as_mut_ptr());
    rows_for(pool, rows, |rr| {
        ROWBUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.resize(cols, 0.0);
            for r in rr {
                decode_segment(w.ty, w.row(r), &mut buf, level);
                // SAFETY: reading f32 storage as bytes.
                let bytes =
                    unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, cols * 4) };
                for t in 0..n_tokens {
                    let v = dot(bytes, &x[t * cols..(t + 1) * cols]);
                    // SAFETY: element (t, r) is written by this chunk only.
                    unsafe { *yp.get().add(t * rows + r) = v };
                }
            }
        })
    });
}

#[allow(clippy::too_many_arguments)]
fn vec_path(
    pool: &ThreadPool,
    w: &WeightRef,
    x: &[f32],
    y: &mut [f32],
    n_tokens: usize,
    k: VecKernel,
    rows_k: Option<QuantRows>,
    tile_k: Option<TileKernel>,
    float_rows: Option<FloatRows>,
) {
    let (rows, cols) = (w.rows, w.cols);
    let yp = SendPtr(y.as_mut_ptr());
    match k {
        // one token: the paired rows kernel where the level has one (the
        // same bits as `f` per row)
        VecKernel::Float(_) if n_tokens == 1 && float_rows.is_some() => {
            let k = float_rows.expect("checked");
            let rb = w.row_bytes();
            rows_for(pool, rows, |rr| {
                // SAFETY: y[rr] is written by this chunk only (one token).
                let out =
                    unsafe { std::slice::from_raw_parts_mut(yp.get().add(rr.start), rr.len()) };
                k(&w.data[rr.start * rb..], x, out)
            })
        }
        VecKernel::Float(f) => rows_for(pool, rows, |rr| {
            for r in rr {
                let row = w.row(r);
                for t in 0..n_tokens {
                    let v = f(row, &x[t * cols..(t + 1) * cols]);
                    // SAFETY: element (t, r) is written by this chunk only.
                    unsafe { *yp.get().add(t * rows + r) = v };
                }
            }
        }),
        VecKernel::Quant(kind, f, f4) => {
            let xa = match kind {
                ActKind::Q8_0 => QuantAct::q8_0(x, cols),
                ActKind::Q8K => QuantAct::q8_k(x, cols),
            };
            let (block, group) = match kind {
                ActKind::Q8_0 => (32, 32),
                ActKind::Q8K => (256, 16),
            };
            let (nd, ns) = (cols / block, cols / group);
            if let (Some(rk), 1) = (rows_k, n_tokens) {
                let rb = w.row_bytes();
                rows_for(pool, rows, |rr| {
                    // SAFETY: y[rr] is written by this chunk only (one token).
                    let out =
                        unsafe { std::slice::from_raw_parts_mut(yp.get().add(rr.start), rr.len()) };
                    rk(&w.data[rr.start * rb..], rb, &xa.qs, &xa.d, &xa.sums, out);
                });
                return;
            }
            let tile_k = tile_k.filter(|t| cols.is_multiple_of(t.cols_multiple));
            if let (Some(tile), true) = (tile_k, n_tokens > 1) {
                // as few groups of at most `max` tokens as the call needs,
                // their sizes within one of each other (16 tokens with 9 at
                // most: 8 + 8, not 9 + 7; a kernel's per-token cost grows
                // past 8 and at few tokens), each interleaved once
                let (tk, max) = (tile.f, tile.max_tokens);
                let per_block = block / group;
                let panels: Vec<(usize, act::ActPanel)> = balanced_groups(n_tokens, max)
                    .map(|(t0, nt)| (t0, tile.panel(&xa, t0, nt, block, per_block)))
                    .collect();
                let rb = w.row_bytes();
                rows_for(pool, rows, |rr| {
                    let mut r0 = rr.start;
                    while r0 < rr.end {
                        let r1 = (r0 + TILE_ROWS).min(rr.end);
                        for &(t0, ref p) in &panels {
                            // SAFETY: y[t0.., r0..r1] is written by this chunk only.
                            let mut outs: [&mut [f32]; act::PANEL_LANES] =
                                std::array::from_fn(|k| match k < p.nt {
                                    true => unsafe {
                                        let y = yp.get().add((t0 + k) * rows + r0);
                                        std::slice::from_raw_parts_mut(y, r1 - r0)
                                    },
                                    false => &mut [],
                                });
                            tk(&w.data[r0 * rb..r1 * rb], rb, p, &mut outs[..p.nt]);
                        }
                        r0 = r1;
                    }
                });
                return;
            }
            rows_for(pool, rows, |rr| {
                let act = |t: usize| {
                    (
                        xa.qs_row(t),
                        &xa.d[t * nd..(t + 1) * nd],
                        &xa.sums[t * ns..(t + 1) * ns],
                    )
                };
                // Rows are short (a few hundred bytes) and matrices small, so
                // the hardware prefetchers barely ramp up before a chunk
                // ends: fetch a few KB ahead explicitly.
                let end = rr.end;
                prefetch_rows(w, rr.start, (rr.start + PF_ROWS).min(end));
                for r in rr {
                    if r + PF_ROWS < end {
                        prefetch_rows(w, r + PF_ROWS, r + PF_ROWS + 1);
                    }
                    let row = w.row(r);
                    let mut t = 0;
                    if let Some(f4) = f4 {
                        while t + 4 <= n_tokens {
                            let a = [act(t), act(t + 1), act(t + 2), act(t + 3)];
                            let v = f4(row, a.map(|a| a.0), a.map(|a| a.1), a.map(|a| a.2));
                            for (k, vk) in v.iter().enumerate() {
                                // SAFETY: element (t+k, r) is written by this chunk only.
                                unsafe { *yp.get().add((t + k) * rows + r) = *vk };
                            }
                            t += 4;
                        }
                    }
                    while t < n_tokens {
                        let (q, d, s) = act(t);
                        let v = f(row, q, d, s);
                        // SAFETY: element (t, r) is written by this chunk only.
                        unsafe { *yp.get().add(t * rows + r) = v };
                        t += 1;
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests;
