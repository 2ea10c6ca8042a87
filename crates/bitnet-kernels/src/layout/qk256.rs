//! BitNet.rs GgmlQk256NoScale ("QK256"), docs/FORMATS.md §3.
//!
//! ```text
//! 256-element blocks of 64 bytes, sequential, least significant pair first:
//!   byte = c0 | c1<<2 | c2<<4 | c3<<6   (element 4m+l of the block at bits 2l of byte m)
//! code LUT: 00 → −2, 01 → −1, 10 → +1, 11 → +2
//! row stride ceil(K/256)·64 bytes (the last block of a row is zero-padded)
//! w = LUT[c] · scale_b, scale_b from a companion F32/F16 tensor (one per block), else 1.0
//! ```
//! Kernels multiply `u = c + (c >> 1)` (0, 1, 3, 4 = LUT + 2): `T_b = Σ u·q − 2 Σ q`,
//! `y = (Σ_b (T_b as f32) · scale_b) / s` (blocks in order).

use super::ExternalScales;
use crate::KernelError;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 64;

/// One QK256 block.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQk256 {
    /// Sequential codes, least significant pair first.
    pub qs: [u8; 64],
}
const _: () = assert!(std::mem::size_of::<BlockQk256>() == BLOCK_BYTES);

/// The value table.
pub const LUT: [i8; 4] = [-2, -1, 1, 2];

/// Code of element `j` of a row's packed bytes (sequential).
#[inline]
pub fn code(row: &[u8], j: usize) -> u8 {
    (row[j / 4] >> (2 * (j % 4))) & 3
}

/// Pack one row of values in {−2, −1, 1, 2} (any length; padded to whole blocks with code 0).
pub fn pack_row(values: &[i8]) -> Result<Vec<u8>, KernelError> {
    let mut out = vec![0u8; values.len().div_ceil(BLOCK_ELEMS) * BLOCK_BYTES];
    for (j, &v) in values.iter().enumerate() {
        let c = (0u8..4)
            .find(|&c| LUT[usize::from(c)] == v)
            .ok_or(KernelError::ShapeMismatch {
                what: "QK256 value (must be -2, -1, 1 or 2)",
                expected: 2,
                got: usize::from(v.unsigned_abs()),
            })?;
        out[j / 4] |= c << (2 * (j % 4));
    }
    Ok(out)
}

/// Pack a matrix (n_out rows of K values) row by row.
pub fn pack(values: &[i8], n_in: usize) -> Result<Vec<u8>, KernelError> {
    if n_in == 0 || !values.len().is_multiple_of(n_in) {
        return Err(KernelError::ShapeMismatch {
            what: "QK256 values",
            expected: n_in,
            got: values.len(),
        });
    }
    let mut out = Vec::new();
    for r in values.chunks_exact(n_in) {
        out.extend(pack_row(r)?);
    }
    Ok(out)
}

/// Unpack the first `n_in` codes of a row.
pub fn unpack_row_codes(row: &[u8], n_in: usize) -> Vec<u8> {
    (0..n_in).map(|j| code(row, j)).collect()
}

/// Dequantize one row: `out[j] = LUT[c_j] · scale_(first_block + j/256)` (1.0 without scales).
pub fn dequantize_row(
    row: &[u8],
    scales: Option<&ExternalScales<'_>>,
    first_block: usize,
    out: &mut [f32],
) {
    for (j, o) in out.iter_mut().enumerate() {
        let d = scales.map_or(1.0, |s| s.get(first_block + j / BLOCK_ELEMS));
        *o = f32::from(LUT[usize::from(code(row, j))]) * d;
    }
}
