//! A weight matrix as the kernels see it: its format, its encoded rows
//! and their [`Layout`].

use crate::error::KernelError;
use crate::matmul::scalar::dequant;
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
    /// Q4_K, Q6_K or Q8_0 rewritten by [`crate::matmul::repack`] for the AVX-512 kernels
    /// that keep 16 rows in the vector lanes (same size; groups of 16 rows).
    Lanes16,
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
}

/// Whether the kernels can multiply weights of type `ty`.
pub fn supported(ty: GgmlType) -> bool {
    dequant::native(ty) || coil_gguf::quant::can_dequantize(ty)
}
