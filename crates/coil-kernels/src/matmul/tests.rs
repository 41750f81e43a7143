use super::plan::{repack_setting_wants, vec_kernel};
use super::*;
use crate::error::KernelError;
use crate::testutil::{random_weights, Rng};

/// f64 reference from the scalar decoder; returns (y, sum |w||x| per output).
fn reference(w: &WeightRef, x: &[f32], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; n * w.rows];
    let mut mag = vec![0f64; n * w.rows];
    let mut row = vec![0f32; w.cols];
    for r in 0..w.rows {
        if !dequant::dequant_row(w.ty, w.row(r), &mut row) {
            coil_gguf::quant::dequantize_row(w.ty, w.row(r), &mut row).unwrap();
        }
        for t in 0..n {
            let xt = &x[t * w.cols..(t + 1) * w.cols];
            let mut s = 0f64;
            let mut m = 0f64;
            for (a, b) in row.iter().zip(xt) {
                s += *a as f64 * *b as f64;
                m += (*a as f64 * *b as f64).abs();
            }
            y[t * w.rows + r] = s;
            mag[t * w.rows + r] = m;
        }
    }
    (y, mag)
}

const FORMATS: [GgmlType; 25] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
];

fn check(ty: GgmlType, rows: usize, cols: usize, n: usize, pool: &ThreadPool, seed: u64) {
    let mut rng = Rng::new(seed);
    let data = random_weights(&mut rng, ty, rows, cols);
    let w = WeightRef::new(ty, &data, rows, cols).unwrap();
    let x = rng.vec(n * cols);
    let (yr, mag) = reference(&w, &x, n);
    // Quantized activations lose ~1/254 of each block's range.
    for level in crate::simd::available_levels() {
        let tol = match ty {
            // With AVX512_BF16 prefill rounds the activations to bf16 (2^-9).
            #[cfg(target_arch = "x86_64")]
            GgmlType::BF16 if level >= SimdLevel::Avx512 && x86_avx512::bf16_gemm::available() => {
                5e-3
            }
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1e-5,
            _ => 2e-2,
        };
        let mut y = vec![f32::NAN; n * rows];
        matmul_at(pool, &w, &x, &mut y, n, level);
        for i in 0..y.len() {
            let err = (y[i] as f64 - yr[i]).abs();
            assert!(
                err <= tol * mag[i] + 1e-6,
                "{ty} {level:?} rows {rows} cols {cols} n {n}: y[{i}] = {} vs {} (mag {})",
                y[i],
                yr[i],
                mag[i]
            );
        }
    }
}

#[test]
fn all_formats_all_paths() {
    let pool = ThreadPool::new(2);
    let mut seed = 1;
    for ty in FORMATS {
        let bs = ty.block_size();
        // The widest cross the f32 GEMM's column steps (256, packed 1024).
        let col_set: Vec<usize> = if bs == 1 {
            vec![1, 17, 64, 600, 1100]
        } else if bs == 32 {
            vec![32, 96, 640, 1056]
        } else {
            vec![256, 768, 1280]
        };
        for &cols in &col_set {
            for &(rows, n) in &[
                (1, 1),
                (7, 3),
                (50, 1),
                (97, 17),
                (13, 40),
                (61, 5),
                (5, 8),
                (40, 30),
                (33, 27),
                // an odd number of work items for two threads
                (160, 37),
                (70, 20),
            ] {
                check(ty, rows, cols, n, &pool, seed);
                seed += 1;
            }
        }
    }
}

/// The exact f32 GEMM adds each output's products in column order, one FMA
/// each, at every vector level and shape (packed or not, `ymm` or `zmm`
/// F16 microkernel, any column step; at AVX-512 both shapes, whichever the
/// CPU's kernel choices pick): the same bits.
#[test]
fn f32_gemm_levels_agree_bit_for_bit() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(11);
    for ty in [GgmlType::F16, GgmlType::F32] {
        for &(rows, cols, n) in &[(40, 1100, 30), (97, 2200, 17), (16, 1024, 12)] {
            let data = random_weights(&mut rng, ty, rows, cols);
            let w = WeightRef::new(ty, &data, rows, cols).unwrap();
            let x = rng.vec(n * cols);
            let mut first: Option<(SimdLevel, Vec<f32>)> = None;
            let levels = crate::simd::available_levels().into_iter();
            for level in levels.filter(|&l| l >= SimdLevel::Avx2) {
                let shapes = match level {
                    // both AVX-512 shapes on any AVX-512 CPU, so tests reach
                    // the one the plan does not pick there
                    SimdLevel::Avx512 => vec![gemm::WIDE, gemm::PACKED],
                    _ => vec![plan::f32_gemm_shape(level)],
                };
                for shape in shapes {
                    let mut y = vec![f32::NAN; n * rows];
                    gemm::gemm_shaped(&pool, &w, &x, &mut y, n, level, shape);
                    match &first {
                        None => first = Some((level, y)),
                        Some((l0, y0)) => {
                            for (i, (a, b)) in y.iter().zip(y0).enumerate() {
                                assert_eq!(
                                    a.to_bits(),
                                    b.to_bits(),
                                    "{ty} {rows}×{cols}, {n} tokens: y[{i}] {level:?} {shape:?} \
                                     {a} vs {l0:?} {b}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn unaligned_f32_weights() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(7);
    let (rows, cols, n) = (20, 33, 9);
    let mut data = vec![0u8];
    data.extend(random_weights(&mut rng, GgmlType::F32, rows, cols));
    let w = WeightRef::new(GgmlType::F32, &data[1..], rows, cols).unwrap();
    let x = rng.vec(n * cols);
    let (yr, _) = reference(&w, &x, n);
    let mut y = vec![0f32; n * rows];
    matmul(&pool, &w, &x, &mut y, n);
    for (a, b) in y.iter().zip(&yr) {
        assert!((*a as f64 - b).abs() < 1e-4);
    }
}

#[test]
fn weight_ref_checks() {
    let d = vec![0u8; 34 * 3];
    assert!(WeightRef::new(GgmlType::Q8_0, &d, 3, 32).is_ok());
    assert!(matches!(
        WeightRef::new(GgmlType::Q8_0, &d, 2, 32),
        Err(KernelError::BadLength { .. })
    ));
    assert!(matches!(
        WeightRef::new(GgmlType::Q8_0, &d, 3, 33),
        Err(KernelError::BadColumns { .. })
    ));
    assert!(matches!(
        WeightRef::new(GgmlType::I64, &d, 1, 1),
        Err(KernelError::UnsupportedType(_))
    ));
}

#[test]
fn single_thread_pool_matches() {
    let p1 = ThreadPool::new(1);
    check(GgmlType::Q4_K, 33, 512, 2, &p1, 99);
    check(GgmlType::F16, 33, 100, 20, &p1, 98);
}

/// How the work is split between threads does not change a result: every
/// element is the same bits with one thread as with two (a Qwen3.5-MoE
/// expert's 160 rows, and 70: an odd number of work items).
#[test]
fn thread_split_does_not_change_results() {
    let (p1, p2) = (ThreadPool::new(1), ThreadPool::new(2));
    let mut rng = Rng::new(123);
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
    ] {
        for (rows, n) in [(160, 64), (70, 21)] {
            let cols = 512;
            let data = random_weights(&mut rng, ty, rows, cols);
            let w = WeightRef::new(ty, &data, rows, cols).unwrap();
            let x = rng.vec(n * cols);
            for level in crate::simd::available_levels() {
                let mut y1 = vec![f32::NAN; n * rows];
                let mut y2 = vec![f32::NAN; n * rows];
                matmul_at(&p1, &w, &x, &mut y1, n, level);
                matmul_at(&p2, &w, &x, &mut y2, n, level);
                for i in 0..y1.len() {
                    assert_eq!(
                        y1[i].to_bits(),
                        y2[i].to_bits(),
                        "{ty} {level:?} rows {rows} n {n}: y[{i}] {} vs {}",
                        y1[i],
                        y2[i]
                    );
                }
            }
        }
    }
}

#[test]
fn native_decoder_matches_format_layer() {
    let mut rng = Rng::new(5);
    for ty in FORMATS {
        let cols = ty.block_size() * 8;
        let data = random_weights(&mut rng, ty, 3, cols);
        let mut a = vec![0f32; 3 * cols];
        let mut b = vec![1f32; 3 * cols];
        coil_gguf::quant::dequantize_row(ty, &data, &mut b).unwrap();
        // (the lattice, ternary and MXFP4 formats: the format layer's)
        if !dequant::dequant_row(ty, &data, &mut a) {
            a.copy_from_slice(&b);
        }
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!(
                x.to_bits() == y.to_bits() || x == y,
                "{ty} [{i}]: {x} vs {y}"
            );
        }
        // and the SIMD decoders
        for level in crate::simd::available_levels() {
            let mut c = vec![2f32; 3 * cols];
            decode_segment(ty, &data, &mut c, level);
            assert_eq!(c, b, "{ty} {level:?}");
        }
    }
}

#[test]
fn fallback_formats_via_format_layer() {
    // Q8_K has no native kernel: decoded by coil-gguf, multiplied by the GEMM.
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(77);
    let ty = GgmlType::Q8_K;
    assert!(supported(ty));
    let (rows, cols, n) = (9, 512, 2);
    let mut data = rng.bytes(rows * cols / 256 * ty.type_size());
    for b in data.chunks_exact_mut(ty.type_size()) {
        b[0..4].copy_from_slice(&(rng.f32() * 0.01).to_le_bytes());
    }
    let w = WeightRef::new(ty, &data, rows, cols).unwrap();
    let x = rng.vec(n * cols);
    let mut y = vec![0f32; n * rows];
    matmul(&pool, &w, &x, &mut y, n);
    let mut row = vec![0f32; cols];
    for r in 0..rows {
        coil_gguf::quant::dequantize_row(ty, w.row(r), &mut row).unwrap();
        for t in 0..n {
            let e: f64 = row
                .iter()
                .zip(&x[t * cols..])
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum();
            assert!((y[t * rows + r] as f64 - e).abs() < 1e-3 * (1.0 + e.abs()));
        }
    }
}

/// Every SIMD dot kernel against the scalar kernel on the same quantized
/// activations: only float rounding may differ.
#[test]
fn simd_dots_match_scalar_dots() {
    let mut rng = Rng::new(31);
    for ty in FORMATS {
        let Some(scalar) = vec_kernel(ty, SimdLevel::Scalar, false) else {
            continue;
        };
        for level in crate::simd::available_levels() {
            let Some(k) = vec_kernel(ty, level, false) else {
                continue;
            };
            for &blocks in &[1usize, 2, 3, 5, 16] {
                let cols =
                    ty.block_size().max(16) * blocks + if ty.block_size() == 1 { 7 } else { 0 };
                let data = random_weights(&mut rng, ty, 1, cols);
                let x: Vec<f32> = (0..cols).map(|_| rng.f32() * 4.0).collect();
                let (a, b) = match (scalar, k) {
                    (VecKernel::Float(f), VecKernel::Float(g)) => (f(&data, &x), g(&data, &x)),
                    (VecKernel::Quant(ka, f, _), VecKernel::Quant(kb, g, g4)) => {
                        assert_eq!(ka, kb);
                        let xa = match ka {
                            ActKind::Q8_0 => QuantAct::q8_0(&x, cols),
                            ActKind::Q8K => QuantAct::q8_k(&x, cols),
                        };
                        let (a, b) = (
                            f(&data, &xa.qs, &xa.d, &xa.sums),
                            g(&data, &xa.qs, &xa.d, &xa.sums),
                        );
                        if let Some(g4) = g4 {
                            // four different tokens: lane k equals the one-token result of token k
                            let xs4: Vec<Vec<f32>> = (0..4)
                                .map(|_| (0..cols).map(|_| rng.f32()).collect())
                                .collect();
                            let q4: Vec<QuantAct> = xs4
                                .iter()
                                .map(|x| match ka {
                                    ActKind::Q8_0 => QuantAct::q8_0(x, cols),
                                    ActKind::Q8K => QuantAct::q8_k(x, cols),
                                })
                                .collect();
                            let v = g4(
                                &data,
                                [0, 1, 2, 3].map(|k| &q4[k].qs[..]),
                                [0, 1, 2, 3].map(|k| &q4[k].d[..]),
                                [0, 1, 2, 3].map(|k| &q4[k].sums[..]),
                            );
                            for (k, vk) in v.iter().enumerate() {
                                let one = g(&data, &q4[k].qs, &q4[k].d, &q4[k].sums);
                                assert!(
                                    (vk - one).abs() <= 1e-5 * one.abs().max(1.0),
                                    "{ty} {level:?} dot4[{k}] {vk} vs {one}"
                                );
                            }
                        }
                        (a, b)
                    }
                    _ => panic!("kernel kinds differ for {ty}"),
                };
                let mut row = vec![0f32; cols];
                coil_gguf::quant::dequantize_row(ty, &data, &mut row).unwrap();
                let mag: f32 = row.iter().zip(&x).map(|(w, v)| (w * v).abs()).sum();
                assert!(
                    (a - b).abs() <= 1e-5 * mag + 1e-6,
                    "{ty} {level:?} cols {cols}: {a} vs {b}"
                );
            }
        }
    }
}

/// On AVX-512 the integer GEMM takes the 32-block formats; check their f32
/// GEMM path (AVX-512 microkernel and decoders) too. The switch is
/// process-wide: tests running meanwhile just take the other correct path.
#[test]
fn f32_gemm_path_for_int_gemm_formats() {
    let pool = ThreadPool::new(2);
    // off, then back on (the default)
    for (int_gemm, seed) in [(false, 500), (true, 600)] {
        set_int_gemm(int_gemm);
        for (i, ty) in FORMATS.into_iter().enumerate() {
            let cols = ty.block_size().max(32) * 3;
            check(ty, 29, cols, 37, &pool, seed + i as u64);
        }
    }
}

/// Batch invariance: inside `invariant_scope`, every token's outputs from
/// one call over `n` tokens equal, bit for bit, a one-token call on that
/// token alone — for every format (native dot kernels with their 4-token
/// variants and row-range kernels, and the decode-each-row fallback), at
/// every SIMD level, for token counts on both sides of the GEMM switch.
///
/// Where the GEMM gives those bits ([`plan::gemm_keeps_tokens`]: Q4_K,
/// Q6_K and Q8_0 at AVX2 beside the rows-in-lanes kernels) invariant mode
/// keeps it for many tokens, and the fast mode (the same kernels) is
/// batch-invariant too: on both kinds of pool.
#[test]
fn invariant_mode_rows_equal_one_token_calls_bit_for_bit() {
    for single in [false, true] {
        let pool = ThreadPool::new(2);
        pool.set_single_stream(single);
        rows_equal_one_token_calls(&pool);
    }
}

fn rows_equal_one_token_calls(pool: &ThreadPool) {
    let _inv = crate::numerics::invariant_scope(true);
    let mut seed = 900;
    // 32-value formats: 21 blocks (an odd count; a last nb % 8 at AVX-512)
    // and 24 (whole groups of 8: the AVX-512 few-token tiles)
    let shapes = FORMATS.iter().flat_map(|&ty| match ty.block_size() {
        1 => vec![(ty, 600)],
        32 => vec![(ty, 672), (ty, 768)],
        _ => vec![(ty, 512)],
    });
    // each in the plain rows (37: not whole groups of 16) and, where the
    // loader rewrites the format (AVX-512), in the rows-in-lanes layout
    let shapes =
        shapes.flat_map(|(ty, cols)| [(ty, cols, Layout::Rows), (ty, cols, Layout::Lanes16)]);
    for (ty, cols, layout) in shapes {
        let rows = if layout == Layout::Lanes16 { 48 } else { 37 };
        seed += 1;
        let mut rng = Rng::new(seed);
        let mut data = random_weights(&mut rng, ty, rows, cols);
        if layout == Layout::Lanes16 && !repack(ty, &mut data, rows, cols) {
            continue;
        }
        let w = WeightRef {
            layout,
            ..WeightRef::new(ty, &data, rows, cols).unwrap()
        };
        let n_max = 64;
        let x = rng.vec(n_max * cols);
        // (a rewritten matrix exists only at the AVX-512 level)
        let levels = crate::simd::available_levels()
            .into_iter()
            .filter(|&l| layout == Layout::Rows || l >= crate::simd::SimdLevel::Avx512);
        for level in levels {
            let one: Vec<f32> = (0..n_max)
                .flat_map(|t| {
                    let mut y = vec![f32::NAN; rows];
                    matmul_at(pool, &w, &x[t * cols..(t + 1) * cols], &mut y, 1, level);
                    y
                })
                .collect();
            let single = pool.single_stream();
            for n in [2, 3, 4, 5, 8, 9, 16, 17, 24, 25, 33, 49, 64] {
                let product = plan::product(pool, ty, w.layout, rows, cols, n, level);
                let kernel = plan::choose(&product);
                let gemm = !matches!(
                    kernel,
                    plan::Kernel::Dots { .. } | plan::Kernel::DecodedDots
                );
                // the GEMMs that keep tokens are taken from 64 tokens on
                if n == 64 && plan::gemm_keeps_tokens(&product) {
                    assert!(gemm, "{ty} {level:?} single {single}: {kernel:?} at {n}");
                }
                let mut y = vec![f32::NAN; n * rows];
                matmul_at(pool, &w, &x[..n * cols], &mut y, n, level);
                for (i, (a, b)) in y.iter().zip(&one).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits(),
                        "{ty} {cols} {layout:?} {level:?} single {single} n {n} ({kernel:?}) seed {seed}: token {} row {}: {a} vs {b} alone",
                        i / rows,
                        i % rows
                    );
                }
                // where the GEMM keeps tokens, the fast mode is
                // batch-invariant too
                if plan::gemm_keeps_tokens(&product) {
                    let _fast = crate::numerics::invariant_scope(false);
                    let mut f = vec![f32::NAN; n * rows];
                    matmul_at(pool, &w, &x[..n * cols], &mut f, n, level);
                    assert!(
                        f.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{ty} {level:?} single {single} n {n}: fast mode differs"
                    );
                }
            }
        }
    }
}

/// A pool that runs one sequence at a time
/// ([`ThreadPool::set_single_stream`]) gives F16 / BF16 the AVX2 level's
/// bits at every level, and Q8_0 at the AVX2 level the row-at-a-time dot
/// product's bits, one token or several, and stays batch-invariant; other
/// formats and levels are left alone.
/// `n` tokens of `x` through `w` at `level` on `pool`.
fn product(pool: &ThreadPool, w: &WeightRef, x: &[f32], n: usize, level: SimdLevel) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * w.rows];
    matmul_at(pool, w, &x[..n * w.cols], &mut y, n, level);
    y
}

/// The same bits.
fn same(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
}

#[test]
fn single_stream_pools_keep_their_kernels_on_every_path() {
    let single = ThreadPool::new(2);
    single.set_single_stream(true);
    let plain = ThreadPool::new(2);
    let _inv = crate::numerics::invariant_scope(true);
    let (rows, cols, n_max) = (37, 608, 9);
    for (k, ty) in [
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
    ]
    .into_iter()
    .enumerate()
    {
        let cols = if ty == GgmlType::Q4_K { 768 } else { cols };
        let mut rng = Rng::new(1200 + k as u64);
        let data = random_weights(&mut rng, ty, rows, cols);
        let w = WeightRef::new(ty, &data, rows, cols).unwrap();
        let x = rng.vec(n_max * cols);
        let run = |pool: &ThreadPool, n: usize, level: SimdLevel| product(pool, &w, &x, n, level);
        for level in crate::simd::available_levels() {
            let one: Vec<f32> = (0..n_max)
                .flat_map(|t| {
                    let mut y = vec![f32::NAN; rows];
                    matmul_at(&single, &w, &x[t * cols..(t + 1) * cols], &mut y, 1, level);
                    y
                })
                .collect();
            // Q8_0 at AVX2: each row's dot product by the row-at-a-time kernel
            let row_dots = (ty == GgmlType::Q8_0 && level == SimdLevel::Avx2).then(|| {
                let Some(VecKernel::Quant(ActKind::Q8_0, dot, _)) = vec_kernel(ty, level, true)
                else {
                    panic!("Q8_0: no AVX2 dot kernel");
                };
                let xa = act::QuantAct::q8_0(&x, cols);
                let nb = cols / 32;
                (0..n_max * rows)
                    .map(|i| {
                        let (t, r) = (i / rows, i % rows);
                        let (d, s) = (&xa.d[t * nb..(t + 1) * nb], &xa.sums[t * nb..(t + 1) * nb]);
                        dot(w.row(r), xa.qs_row(t), d, s)
                    })
                    .collect::<Vec<f32>>()
            });
            if let Some(want) = &row_dots {
                assert!(same(&one, want), "Q8_0 AVX2: not the row-at-a-time dots");
            }
            // the level whose bits the single-stream pool must give otherwise
            let want_level = match ty {
                GgmlType::F16 | GgmlType::BF16 => level.min(SimdLevel::Avx2),
                _ => level,
            };
            for n in [1, 2, 4, 8, 9] {
                let got = run(&single, n, level);
                if row_dots.is_none() {
                    let want = run(&plain, n, want_level);
                    assert!(
                        same(&got, &want),
                        "{ty} {level:?} n {n}: not the {want_level:?} level's bits"
                    );
                }
                assert!(
                    same(&got, &one[..n * rows]),
                    "{ty} {level:?} n {n}: not each token alone"
                );
            }
        }
    }
}

/// Where 512-bit operations run as halves (AMD Zen 4: `split_q6k_lanes`),
/// Q6_K in the file's layout takes the AVX2 level's rows-in-lanes kernels
/// at the AVX-512 level: in a batched pool for every token count (so the
/// invariant mode still gives each token its one-token bits), in a
/// single-stream pool for 5–32 tokens of a prompt only (its one-token and
/// invariant products stay the AVX-512 ones). Other CPUs: nothing to check.
#[test]
#[cfg(target_arch = "x86_64")]
fn split_512_q6_k_products_take_the_avx2_lanes() {
    use crate::simd::available_levels;
    let (ty, level) = (GgmlType::Q6_K, SimdLevel::Avx512);
    if !(available_levels().contains(&level)
        && crate::simd::split_512()
        && plan::avx2_lanes(ty, false))
    {
        return;
    }
    let plain = ThreadPool::new(2);
    let single = ThreadPool::new(2);
    single.set_single_stream(true);
    let (rows, cols, n_max) = (37, 768, 32);
    let mut rng = Rng::new(1300);
    let data = random_weights(&mut rng, ty, rows, cols);
    let w = WeightRef::new(ty, &data, rows, cols).unwrap();
    let x = rng.vec(n_max * cols);
    let run = |pool: &ThreadPool, n: usize, level: SimdLevel| product(pool, &w, &x, n, level);
    for n in [1, 2, 3, 4, 5, 8, 9, 16, 17, 32] {
        let avx2 = run(&plain, n, SimdLevel::Avx2);
        assert!(same(&run(&plain, n, level), &avx2), "batched pool, n {n}");
        let _inv = crate::numerics::invariant_scope(true);
        assert!(
            same(&run(&plain, n, level), &avx2),
            "batched pool, invariant, n {n}"
        );
    }
    for n in 5..=32 {
        let avx2 = run(&plain, n, SimdLevel::Avx2);
        assert!(same(&run(&single, n, level), &avx2), "single stream, n {n}");
    }
    // the single stream's one token: the AVX-512 row kernel's bits
    let Some(VecKernel::Quant(ActKind::Q8K, dot, _)) = vec_kernel(ty, level, true) else {
        panic!("Q6_K: no AVX-512 dot kernel");
    };
    let xa = act::QuantAct::q8_k(&x[..cols], cols);
    let want: Vec<f32> = (0..rows)
        .map(|r| dot(w.row(r), xa.qs_row(0), &xa.d, &xa.sums))
        .collect();
    assert!(
        same(&run(&single, 1, level), &want),
        "single stream, one token"
    );
}

/// Without the invariant scope, a single token still takes the one-token
/// path (what plain decoding and the invariant mode share), and many
/// tokens may take another (the GEMM): this is why the mode exists.
#[test]
fn fast_mode_single_token_is_the_invariant_path() {
    let pool = ThreadPool::new(2);
    let (ty, rows, cols) = (GgmlType::Q8_0, 16, 256);
    let mut rng = Rng::new(77);
    let data = random_weights(&mut rng, ty, rows, cols);
    let w = WeightRef::new(ty, &data, rows, cols).unwrap();
    let x = rng.vec(cols);
    let mut fast = vec![0f32; rows];
    matmul(&pool, &w, &x, &mut fast, 1);
    let mut inv = vec![0f32; rows];
    {
        let _inv = crate::numerics::invariant_scope(true);
        matmul(&pool, &w, &x, &mut inv, 1);
    }
    assert!(fast
        .iter()
        .zip(&inv)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}

#[test]
fn scales_mins_k4_equal_the_bytewise_lookup() {
    let mut state = 0x1234_5678_9abc_def0u64;
    for _ in 0..1000 {
        let q: Vec<u8> = (0..12)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 56) as u8
            })
            .collect();
        let (sc, mn) = super::dequant::scales_mins_k4(&q);
        for j in 0..8 {
            assert_eq!(
                (sc[j], mn[j]),
                super::dequant::scale_min_k4(j, &q),
                "j = {j}"
            );
        }
    }
}

/// Several matrices of one input through `matmul_shared` (one activation
/// quantization where the integer GEMM runs them all): each result bit for
/// bit its own `matmul`, whatever the formats, layouts, token counts.
#[test]
fn shared_input_products_equal_separate_ones() {
    let pool = ThreadPool::new(2);
    let (rows, cols) = (48, 512);
    let mut rng = Rng::new(21);
    let mut mats: Vec<(GgmlType, Vec<u8>, crate::Layout)> = Vec::new();
    for ty in [
        GgmlType::Q4_K,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
    ] {
        let mut data = random_weights(&mut rng, ty, rows, cols);
        let plain = data.clone();
        mats.push((ty, plain, crate::Layout::Rows));
        if crate::repack(ty, &mut data, rows, cols) {
            mats.push((ty, data, crate::Layout::Lanes16));
        }
    }
    fn wref(m: &(GgmlType, Vec<u8>, crate::Layout), rows: usize, cols: usize) -> WeightRef<'_> {
        WeightRef {
            layout: m.2,
            ..WeightRef::new(m.0, &m.1, rows, cols).unwrap()
        }
    }
    // pairs of the same mode (shared) and of different ones (separate)
    let q4: Vec<usize> = (0..mats.len())
        .filter(|&i| mats[i].0 == GgmlType::Q4_K)
        .collect();
    let pick = |t: GgmlType| (0..mats.len()).find(|&i| mats[i].0 == t).unwrap();
    let last = |t: GgmlType| (0..mats.len()).rfind(|&i| mats[i].0 == t).unwrap();
    let sets: Vec<Vec<usize>> = vec![
        vec![q4[0], q4[1]],
        vec![q4[0], *q4.last().unwrap(), q4[1]],
        vec![pick(GgmlType::Q8_0), pick(GgmlType::Q8_0)],
        vec![q4[0], pick(GgmlType::Q6_K)],
        vec![pick(GgmlType::F16), q4[0]],
        vec![pick(GgmlType::Q6_K), pick(GgmlType::Q6_K)],
        // groups of different quantizations in one call (a DeltaNet
        // layer's q/k/v, z, β and α), in any order
        vec![
            q4[0],
            pick(GgmlType::Q6_K),
            pick(GgmlType::F16),
            q4[1],
            pick(GgmlType::Q6_K),
        ],
        // the 32-value formats, with and without a min
        vec![
            pick(GgmlType::Q8_0),
            pick(GgmlType::Q4_1),
            pick(GgmlType::Q4_0),
            last(GgmlType::Q8_0),
            pick(GgmlType::Q4_1),
            q4[0],
        ],
        // two in the file's layout (the AVX2 level shares these)
        q4.iter()
            .copied()
            .filter(|&i| mats[i].2 == crate::Layout::Rows)
            .collect(),
    ];
    let levels: Vec<_> = [crate::simd::SimdLevel::Avx512, crate::simd::SimdLevel::Avx2]
        .into_iter()
        .filter(|&l| l <= crate::simd::detected_level())
        .collect();
    for (n, &level) in [1, 3, 9, 40]
        .into_iter()
        .flat_map(|n| levels.iter().map(move |l| (n, l)))
    {
        let x = rng.vec(n * cols);
        // the AVX2 level: only the matrices in the file's layout
        let _cap = crate::simd::level_scope(Some(level));
        for invariant in [false, true] {
            let _scope = crate::invariant_scope(invariant);
            for set in sets.iter().filter(|set| {
                level == crate::simd::SimdLevel::Avx512
                    || set.iter().all(|&i| mats[i].2 == crate::Layout::Rows)
            }) {
                let ws: Vec<WeightRef> = set.iter().map(|&i| wref(&mats[i], rows, cols)).collect();
                let wr: Vec<&WeightRef> = ws.iter().collect();
                let mut outs = vec![vec![0f32; n * rows]; ws.len()];
                let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                crate::matmul_shared(&pool, &wr, &x, &mut ys, n);
                for (w, got) in ws.iter().zip(&outs) {
                    let mut want = vec![0f32; n * rows];
                    matmul(&pool, w, &x, &mut want, n);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{:?} {:?}, {n} tokens, {level:?}", w.ty, w.layout);
                }
            }
        }
    }
}

/// `COIL_REPACK`'s values: unset repacks Q4_K, Q5_K and Q8_0 everywhere and Q6_K
/// except where 512-bit operations run as halves; `0` nothing, `all`
/// everything, `noq6` all but Q6_K.
#[test]
fn repack_settings_choose_the_formats() {
    use GgmlType::{Q4_K, Q5_K, Q6_K, Q8_0};
    let wants = |s: Option<&str>, split: bool| {
        [Q4_K, Q5_K, Q6_K, Q8_0].map(|ty| repack_setting_wants(s, ty, split))
    };
    assert_eq!(wants(None, false), [true, true, true, true]);
    assert_eq!(wants(None, true), [true, true, false, true]);
    assert_eq!(wants(Some("auto"), true), [true, true, false, true]);
    assert_eq!(wants(Some("0"), false), [false, false, false, false]);
    assert_eq!(wants(Some("all"), true), [true, true, true, true]);
    assert_eq!(wants(Some(" noq6 "), false), [true, true, false, true]);
}

/// The groups cover the tokens in order, none over `max`, as few as
/// `max` allows, sizes within one of each other.
#[test]
fn groups_cover_in_order_and_balance() {
    assert_eq!(balanced_groups(16, 9).collect::<Vec<_>>(), [(0, 8), (8, 8)]);
    assert_eq!(balanced_groups(10, 9).collect::<Vec<_>>(), [(0, 5), (5, 5)]);
    assert_eq!(
        balanced_groups(11, 4).collect::<Vec<_>>(),
        [(0, 4), (4, 4), (8, 3)]
    );
    assert_eq!(balanced_groups(0, 9).count(), 0);
    for max in 1..12 {
        for n in 0..40 {
            let g: Vec<_> = balanced_groups(n, max).collect();
            assert_eq!(g.len(), n.div_ceil(max));
            let mut next = 0;
            for &(t0, nt) in &g {
                assert_eq!(t0, next);
                assert!(nt >= 1 && nt <= max);
                next += nt;
            }
            assert_eq!(next, n);
            let (lo, hi) = (g.iter().map(|x| x.1).min(), g.iter().map(|x| x.1).max());
            assert!(hi.unwrap_or(0) - lo.unwrap_or(0) <= 1);
        }
    }
}
