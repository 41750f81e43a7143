//! The checks every rows-in-lanes format passes (Q6_K's and Q8_0's tests
//! call [`check`]; Q4_K's, the first, spells them out in `lanes.rs`).
use super::super::act::{ActPanel, QuantAct};
use crate::matmul::matmul;
use crate::matmul::scalar::dequant::dequant_row;
use crate::matmul::weight::Layout;
use crate::matmul::weight::WeightRef;
use crate::testutil::{random_weights, Rng};
use coil_gguf::GgmlType;

/// One format's layout and kernel.
pub(super) struct Format {
    pub ty: GgmlType,
    pub repack: fn(&mut [u8], usize, usize),
    pub unpack_row: fn(&[u8], usize, usize, &mut [u8]),
    /// Its activations and their scale block (values per `d`).
    pub quantize: fn(&[f32], usize) -> QuantAct,
    pub act_block: usize,
    pub panel: fn(&QuantAct, usize, usize) -> ActPanel,
    pub tile: unsafe fn(&[u8], usize, &ActPanel, &mut [&mut [f32]]),
}

/// 48 repacked rows of `cols` values: they unpack to the file's rows; one
/// token's products equal the f64 product of the dequantized weights with
/// the quantized activations within f32 rounding; 2–9 tokens and shifted
/// groups give each token's bits alone (batch invariance); through
/// `matmul` the kernel's bits up to 13 tokens (invariant or not below the
/// GEMM) and, at 40, the integer GEMM's results on the plain rows.
pub(super) fn check(f: &Format, cols: usize, seed: u64) {
    let rows = 48;
    let mut rng = Rng::new(seed);
    let plain = random_weights(&mut rng, f.ty, rows, cols);
    let rb = plain.len() / rows;
    let mut packed = plain.clone();
    (f.repack)(&mut packed, rows, cols);
    assert_ne!(packed, plain);
    let mut row = vec![0u8; rb];
    for r in 0..rows {
        (f.unpack_row)(&packed, cols, r, &mut row);
        assert_eq!(row, plain[r * rb..(r + 1) * rb], "row {r}");
    }
    let x = rng.vec(40 * cols);
    let xa = (f.quantize)(&x, cols);
    let run = |w: &[u8], rows: usize, t0: usize, nt: usize| -> Vec<Vec<f32>> {
        let p = (f.panel)(&xa, t0, nt);
        let mut ys = vec![vec![f32::NAN; rows]; nt];
        let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
        // SAFETY: AVX-512 checked by the caller.
        unsafe { (f.tile)(w, rb, &p, &mut outs) };
        ys
    };
    let nb = cols / f.act_block;
    let alone: Vec<Vec<f32>> = (0..40)
        .map(|t| run(&packed, rows, t, 1).remove(0))
        .collect();
    let mut wf = vec![0f32; cols];
    for r in 0..rows {
        assert!(dequant_row(f.ty, &plain[r * rb..(r + 1) * rb], &mut wf));
        for (t, y) in alone.iter().enumerate().take(6) {
            let want: f64 = (0..cols)
                .map(|c| {
                    let dx = f64::from(xa.d[t * nb + c / f.act_block]);
                    f64::from(wf[c]) * f64::from(xa.qs_row(t)[c]) * dx
                })
                .sum();
            let scale: f64 = (0..cols)
                .map(|c| (f64::from(wf[c]) * f64::from(x[t * cols + c])).abs())
                .sum();
            let got = f64::from(y[r]);
            assert!(
                (got - want).abs() <= 1e-5 * scale + 1e-6,
                "row {r} token {t}: {got} against {want}"
            );
        }
    }
    for nt in 2..=9 {
        for (k, y) in run(&packed, rows, 12 - nt, nt).iter().enumerate() {
            for r in 0..rows {
                assert_eq!(
                    y[r].to_bits(),
                    alone[12 - nt + k][r].to_bits(),
                    "{nt} tokens, row {r}"
                );
            }
        }
    }
    for (k, y) in run(&packed[16 * rb..], rows - 16, 4, 5).iter().enumerate() {
        for r in 16..rows {
            assert_eq!(y[r - 16].to_bits(), alone[4 + k][r].to_bits());
        }
    }
    let pool = crate::ThreadPool::new(2);
    let wp = WeightRef::new(f.ty, &plain, rows, cols).unwrap();
    let wl = WeightRef {
        layout: Layout::Lanes16,
        ..WeightRef::new(f.ty, &packed, rows, cols).unwrap()
    };
    let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
    wp.dequantize_row(33, &mut a);
    wl.dequantize_row(33, &mut b);
    assert_eq!(a, b);
    for (n, invariant) in [(1, false), (4, false), (11, false), (13, true)] {
        let _scope = crate::invariant_scope(invariant);
        let mut y = vec![0f32; n * rows];
        matmul(&pool, &wl, &x[..n * cols], &mut y, n);
        for t in 0..n {
            for r in 0..rows {
                assert_eq!(
                    y[t * rows + r].to_bits(),
                    alone[t][r].to_bits(),
                    "{n} tokens"
                );
            }
        }
    }
    let (mut yp, mut yl) = (vec![0f32; 40 * rows], vec![0f32; 40 * rows]);
    matmul(&pool, &wp, &x, &mut yp, 40);
    matmul(&pool, &wl, &x, &mut yl, 40);
    assert_eq!(yp, yl);
}
