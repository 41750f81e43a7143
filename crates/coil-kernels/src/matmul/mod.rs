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
//!
//! Which of these runs is decided in one place, [`plan`]: its table
//! (`plan::FORMATS`) and `plan::choose`; [`matmul_at`] runs the choice.

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
pub mod plan;
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
/// [`repacks`]), and says
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

pub use plan::{has_int_gemm, repacks, set_int_gemm};

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
    let keys: Vec<Option<SharedActs>> = ws
        .iter()
        .map(|w| shared_acts(pool, w, n_tokens, level))
        .collect();
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
/// [`matmul_at`] routes it on `pool`); `None`: the product does not
/// quantize its activations, or not in a shareable way.
#[allow(unused_variables)]
fn shared_acts(
    pool: &ThreadPool,
    w: &WeightRef,
    n_tokens: usize,
    level: SimdLevel,
) -> Option<SharedActs> {
    #[cfg(target_arch = "x86_64")]
    match plan::choose(&plan::product(
        pool, w.ty, w.layout, w.rows, w.cols, n_tokens, level,
    )) {
        plan::Kernel::IntGemmAvx512 => return Some(SharedActs::Avx512(igemm::act_mode(w.ty))),
        plan::Kernel::IntGemmAvx2 => return igemm_avx2::shared_acts(w.ty).map(SharedActs::Avx2),
        _ => {}
    }
    None
}

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
    let single = pool.single_stream();
    match plan::choose(&plan::product(
        pool, w.ty, w.layout, w.rows, w.cols, n_tokens, level,
    )) {
        plan::Kernel::Nothing => {}
        plan::Kernel::Zeros => y.fill(0.0),
        #[cfg(target_arch = "x86_64")]
        plan::Kernel::IntGemmAvx512 => igemm::igemm(pool, w, x, y, n_tokens),
        #[cfg(target_arch = "x86_64")]
        plan::Kernel::IntGemmAvx2 => igemm_avx2::igemm(pool, w, x, y, n_tokens),
        plan::Kernel::Lanes16 { gemm_from } => {
            matmul_lanes(pool, w, x, y, n_tokens, level, gemm_from)
        }
        plan::Kernel::Dots {
            level: dot_level, ..
        } => vec_path(
            pool,
            w,
            x,
            y,
            n_tokens,
            plan::vec_kernel(w.ty, dot_level, single).expect("planned with a dot kernel"),
            plan::rows_kernel(w.ty, dot_level, single),
            plan::tile_kernel(w.ty, dot_level, single),
            plan::float_rows_kernel(w.ty, dot_level),
        ),
        plan::Kernel::DecodedDots => decode_vec_path(pool, w, x, y, n_tokens, level),
        #[cfg(target_arch = "x86_64")]
        plan::Kernel::Bf16Gemm => bf16_gemm::gemm(pool, w, x, y, n_tokens),
        plan::Kernel::F32Gemm { level } => {
            gemm::gemm_shaped(pool, w, x, y, n_tokens, level, plan::f32_gemm_shape(level))
        }
        #[allow(unreachable_patterns)]
        k => unreachable!("{k:?} planned off x86-64"),
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
    gemm_from: usize,
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
        x86_avx512::lanes::matmul_packed(pool, w, x, y, n_tokens, gemm_from)
    };
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

/// One token's rows of a float format: `(w, x, out)`, `w` from the first
/// of `out.len()` rows.
pub(crate) type FloatRows = fn(&[u8], &[f32], &mut [f32]);

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
    let Some(VecKernel::Float(dot)) = plan::vec_kernel(GgmlType::F32, level, false) else {
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
