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
//!   tokens: batch-invariant mode (where a GEMM gives the same bits, it
//!   serves many tokens there too: [`plan::gemm_keeps_tokens`]).
//! * many tokens (prefill): for Q8_0/Q4_0/IQ4_NL/Q4_K/Q5_K/Q6_K/IQ4_XS on
//!   AVX-512 VNNI, an integer GEMM (`igemm`: weights unpacked to i8 per
//!   16-row panel, activations quantized per 32 values); on AVX2, one for
//!   Q4_K/Q5_K/Q6_K/Q8_0 (`x86_avx2/igemm/`: `vpmaddubsw` / `vpmaddwd`, 8- and
//!   16-row panels); for every other format and level, [`gemm`] — weights decoded to f32 panel by panel and an
//!   f32 register-tile GEMM. Compute-bound. (Below 4 tokens, formats without
//!   a dot kernel decode each row once and use f32 dots.)
//!
//! Which of these runs is decided in one place, [`plan`]: its table
//! (`plan::FORMATS`) and `plan::choose`; [`matmul_at`] runs the choice.

pub mod act;
mod decode;
pub mod gemm;
pub(crate) mod kernel;
pub mod observe;
pub mod plan;
pub mod scalar;
pub(crate) mod split;
mod weight;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;

use crate::pool::ThreadPool;
use crate::simd::{self, SimdLevel};
use act::QuantAct;
use coil_gguf::GgmlType;
use decode::decode_segment;
use kernel::{ActKind, FloatRows, QuantRows, TileKernel, VecKernel, PF_ROWS};
pub use scalar::{dequant, vecdot};
use split::{balanced_groups, rows_for};
pub use weight::{supported, Layout, WeightRef};

/// Rewrites a Q4_K, Q5_K, Q6_K or Q8_0 matrix in place into [`Layout::Lanes16`] when
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
                x86_avx512::lanes::repack::<false>(data, rows, cols);
                return true;
            }
            GgmlType::Q5_K if data.len() == rows * nb * 176 => {
                x86_avx512::lanes::repack::<true>(data, rows, cols);
                return true;
            }
            GgmlType::Q6_K if data.len() == rows * nb * 210 => {
                x86_avx512::lanes_q6_k::repack(data, rows, cols);
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

pub use plan::{has_int_gemm, keeps_tokens, repacks, set_int_gemm};

impl WeightRef<'_> {
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
                        x86_avx512::lanes_q6_k::unpack_row(self.data, self.cols, r, &mut plain)
                    }
                    GgmlType::Q8_0 => {
                        x86_avx512::lanes_q8_0::unpack_row(self.data, self.cols, r, &mut plain)
                    }
                    GgmlType::Q5_K => {
                        x86_avx512::lanes::unpack_row::<true>(self.data, self.cols, r, &mut plain)
                    }
                    _ => {
                        x86_avx512::lanes::unpack_row::<false>(self.data, self.cols, r, &mut plain)
                    }
                }
                decode_segment(self.ty, &plain, out, simd::level());
            }
        }
    }
}

use crate::pool::SendPtr;

/// `y[t, r] = sum_c w[r, c] * x[t, c]`; `x`: `[n_tokens, w.cols]`,
/// `y`: `[n_tokens, w.rows]` (overwritten). Uses the best SIMD level.
pub fn matmul(pool: &ThreadPool, w: &WeightRef, x: &[f32], y: &mut [f32], n_tokens: usize) {
    matmul_at(pool, w, x, y, n_tokens, simd::level())
}

pub use observe::{set_product_observer, ProductObserver};

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
        observe::notify(w, x, n_tokens);
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
            product_at(pool, ws[i], x, ys[i], n_tokens, level);
            continue;
        };
        if keys[..i].contains(&Some(k)) {
            continue;
        }
        let group: Vec<usize> = (i..ws.len()).filter(|&j| keys[j] == Some(k)).collect();
        if group.len() == 1 {
            product_at(pool, ws[i], x, ys[i], n_tokens, level);
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
                SharedActs::Avx512(_) => {
                    x86_avx512::igemm::igemm_many(pool, &gw, x, &mut gy, n_tokens)
                }
                SharedActs::Avx2(_) => x86_avx2::igemm::igemm_many(pool, &gw, x, &mut gy, n_tokens),
            }
        }
    }
}

/// An activation quantization that several matrices' products can share.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SharedActs {
    #[cfg(target_arch = "x86_64")]
    Avx512(x86_avx512::igemm::ActMode),
    #[cfg(target_arch = "x86_64")]
    Avx2(x86_avx2::igemm::ActKey),
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
        plan::Kernel::IntGemmAvx512 => {
            return Some(SharedActs::Avx512(x86_avx512::igemm::act_mode(w.ty)))
        }
        plan::Kernel::IntGemmAvx2 => {
            return x86_avx2::igemm::shared_acts(w.ty).map(SharedActs::Avx2)
        }
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
    check_shapes(w, x, y, n_tokens);
    observe::notify(w, x, n_tokens);
    product_at(pool, w, x, y, n_tokens, level)
}

/// [`matmul_at`] without its checks and observer.
fn product_at(
    pool: &ThreadPool,
    w: &WeightRef,
    x: &[f32],
    y: &mut [f32],
    n_tokens: usize,
    level: SimdLevel,
) {
    let level = level.min(simd::detected_level());
    let single = pool.single_stream();
    match plan::choose(&plan::product(
        pool, w.ty, w.layout, w.rows, w.cols, n_tokens, level,
    )) {
        plan::Kernel::Nothing => {}
        plan::Kernel::Zeros => y.fill(0.0),
        #[cfg(target_arch = "x86_64")]
        plan::Kernel::IntGemmAvx512 => x86_avx512::igemm::igemm(pool, w, x, y, n_tokens),
        #[cfg(target_arch = "x86_64")]
        plan::Kernel::IntGemmAvx2 => x86_avx2::igemm::igemm(pool, w, x, y, n_tokens),
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
        plan::Kernel::Bf16Gemm => x86_avx512::bf16_gemm::gemm(pool, w, x, y, n_tokens),
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
            && matches!(
                w.ty,
                GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q8_0
            ),
        "matmul: a {} matrix repacked for AVX-512 at the {level:?} level",
        w.ty
    );
    #[cfg(target_arch = "x86_64")]
    {
        if n_tokens >= gemm_from && !crate::numerics::batch_invariant() {
            return x86_avx512::igemm::igemm(pool, w, x, y, n_tokens);
        }
        // SAFETY: the AVX-512 level was checked above.
        unsafe { x86_avx512::packed::matmul_packed(pool, w, x, y, n_tokens) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (pool, x, y, n_tokens, gemm_from);
}

/// Whether prompts through BF16 weights take bf16 products at the AVX-512
/// level (the CPU has AVX512_BF16, its `vdpbf16ps` multiplies at least
/// twice as fast as its f32 FMAs, measured once per process, or
/// `COIL_BF16_DOT=1`; `COIL_BF16_DOT=0` never); else they stay exact in
/// f32.
pub fn bf16_products() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        x86_avx512::bf16_gemm::available()
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
        x86_avx512::bf16_gemm::product_ratio()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Rows the few-token path multiplies with every group of tokens before it
/// moves on, so the later groups find them in L1/L2.
const TILE_ROWS: usize = 32;

/// Prefetches the encoded rows `r0..r1` of `w`.
#[inline]
fn prefetch_rows(w: &WeightRef, r0: usize, r1: usize) {
    if r1 > r0 {
        let rb = w.row_bytes();
        gemm::prefetch(&w.data[r0 * rb..r1 * rb]);
    }
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
