//! Work buffers whose data starts on a cache line.
//!
//! A `Vec` from the allocator starts 16 bytes into a line (glibc), so half
//! of the 32-byte and every 64-byte load from it straddles two lines and
//! costs two. The GEMMs' packed weight panels are read again and again by
//! such loads: they live here. Measured on an Intel Xeon (AVX-512, one
//! core), a microkernel with the integer GEMM's loop: 3.97 `vpdpbusd` per ns
//! with its panels on line boundaries, 3.48 at 16 bytes past them; the Q4_K
//! prefill GEMM itself +8–12%.

use std::marker::PhantomData;

/// One cache line of bytes.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Element types whose all-zero bytes are the value zero.
pub trait Zeroed: Copy + sealed::Sealed {}
impl Zeroed for u8 {}
impl Zeroed for i8 {}
impl Zeroed for i16 {}
impl Zeroed for i32 {}
impl Zeroed for u32 {}
impl Zeroed for f32 {}
mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for i8 {}
    impl Sealed for i16 {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
    impl Sealed for f32 {}
}

/// A growable buffer of `T` whose first element is 64-byte aligned.
pub struct AlignedVec<T: Zeroed> {
    lines: Vec<Line>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Zeroed> Default for AlignedVec<T> {
    fn default() -> Self {
        AlignedVec {
            lines: Vec::new(),
            len: 0,
            _t: PhantomData,
        }
    }
}

impl<T: Zeroed> AlignedVec<T> {
    /// Sets the length to `len` values, as `Vec::resize(len, 0)`: values
    /// added are zero, kept ones stay.
    pub fn resize(&mut self, len: usize) {
        let n = (len * size_of::<T>()).div_ceil(64);
        if self.lines.len() < n {
            if self.lines.capacity() < n {
                // grown anyway: large ones in huge pages
                let more = n - self.lines.len();
                crate::hugepages::reserve(&mut self.lines, more);
            }
            self.lines.resize(n, Line([0; 64]));
        }
        if len > self.len {
            let sz = size_of::<T>();
            // SAFETY: bytes `self.len * sz .. len * sz` lie in `lines`.
            unsafe {
                std::ptr::write_bytes(
                    (self.as_mut_ptr() as *mut u8).add(self.len * sz),
                    0,
                    (len - self.len) * sz,
                )
            };
        }
        self.len = len;
    }

    /// Length in values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first value (64-byte aligned).
    pub fn as_ptr(&self) -> *const T {
        self.lines.as_ptr() as *const T
    }

    /// The first value (64-byte aligned), for writing.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.lines.as_mut_ptr() as *mut T
    }
}

impl<T: Zeroed> std::ops::Deref for AlignedVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `lines` holds at least `len` values' bytes, all
        // initialised (zero or written), and any bytes are a valid `T`.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }
}

impl<T: Zeroed> std::ops::DerefMut for AlignedVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as `deref`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_keeps_values() {
        let mut b = AlignedVec::<f32>::default();
        assert!(b.is_empty());
        b.resize(100);
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert!(b.iter().all(|&x| x == 0.0));
        b[99] = 7.0;
        b.resize(1000);
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert_eq!((b.len(), b[99], b[999]), (1000, 7.0, 0.0));
        b.resize(10);
        assert_eq!(b.len(), 10);
        // grown again: zeros, as `Vec::resize`
        b.resize(100);
        assert_eq!(b[99], 0.0);
        let mut q = AlignedVec::<u8>::default();
        q.resize(65);
        assert_eq!((q.as_ptr() as usize % 64, q.len()), (0, 65));
    }
}
