//! Buffers whose storage starts on a 64-byte boundary, so that 512-bit (and 256-bit) loads of
//! their rows do not straddle two cache lines. (The allocator gives large blocks a 16-byte
//! offset from a page: every 64-byte load from such a block crosses a line.)

use std::collections::TryReserveError;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use bytemuck::{Pod, Zeroable};

/// One cache line.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct Line([u8; 64]);

/// `len` zero-initialised elements of `T` on a 64-byte boundary.
#[derive(Debug, Clone)]
pub struct AlignedBuf<T> {
    lines: Vec<Line>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> AlignedBuf<T> {
    /// `len` zeros; an error instead of an abort when the memory is not there.
    pub fn try_zeroed(len: usize) -> Result<Self, TryReserveError> {
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        let n = bytes.div_ceil(64);
        let mut lines = Vec::new();
        lines.try_reserve_exact(n)?;
        lines.resize(n, Line([0; 64]));
        Ok(AlignedBuf {
            lines,
            len,
            _t: PhantomData,
        })
    }

    /// `len` zeros (aborts like `vec!` when the memory is not there).
    pub fn zeroed(len: usize) -> Self {
        let n = len.saturating_mul(std::mem::size_of::<T>()).div_ceil(64);
        AlignedBuf {
            lines: vec![Line([0; 64]); n],
            len,
            _t: PhantomData,
        }
    }
}

impl<T: Pod> Deref for AlignedBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &bytemuck::cast_slice::<Line, T>(&self.lines)[..self.len]
    }
}

impl<T: Pod> DerefMut for AlignedBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let len = self.len;
        &mut bytemuck::cast_slice_mut::<Line, T>(&mut self.lines)[..len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_line_and_has_its_length() {
        for len in [0usize, 1, 15, 16, 17, 1000] {
            let mut b = AlignedBuf::<f32>::zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0.0));
            if len > 0 {
                assert_eq!(b.as_ptr().addr() % 64, 0);
                b[len - 1] = 1.0;
            }
            let h = AlignedBuf::<half::f16>::try_zeroed(len).unwrap();
            assert_eq!(h.len(), len);
        }
    }
}
