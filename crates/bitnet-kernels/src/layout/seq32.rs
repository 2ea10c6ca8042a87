//! BitNet.rs 32-element layouts (docs/FORMATS.md §3): BitNet32F16 and Split32WithSibling.
//!
//! ```text
//! 8 packed bytes per 32 elements, sequential, least significant pair first:
//!   byte i/4, bits 2(i%4)..2(i%4)+1 = code of element i;  code = value + 2
//!   (−1 → 01, 0 → 10, +1 → 11; 00 is never written and decodes as −2, counted by validators)
//! BitNet32F16:        block = 8 packed bytes | f16 scale  (10 bytes)
//! Split32WithSibling: block = 8 packed bytes; scale b = element b of a sibling F32/F16 tensor
//! w = (c − 2) · scale_b
//! ```
//! The tensor is one row-major sequence of blocks; K % 32 == 0 so blocks never straddle rows.
//! Kernels: `T_b = Σ c·q − 2 Σ q`, `y = (Σ_b (T_b as f32) · scale_b) / s` (blocks in order).

use super::{ExternalScales, TernaryLayout};
use crate::KernelError;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 32;
/// Packed code bytes per block.
pub const PACKED_BYTES: usize = 8;
/// Bytes per BitNet32F16 block (codes + inline f16 scale).
pub const INLINE_BLOCK_BYTES: usize = 10;

/// One BitNet32F16 block.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockBitNet32F16 {
    /// Sequential codes, least significant pair first.
    pub qs: [u8; 8],
    /// Block scale.
    pub d: half::f16,
}
const _: () = assert!(std::mem::size_of::<BlockBitNet32F16>() == INLINE_BLOCK_BYTES);

/// One Split32WithSibling block (codes only).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockSplit32 {
    /// Sequential codes, least significant pair first.
    pub qs: [u8; 8],
}
const _: () = assert!(std::mem::size_of::<BlockSplit32>() == PACKED_BYTES);

/// Code of element `i` (0..32) of a block's 8 packed bytes.
#[inline]
pub fn code(qs: &[u8], i: usize) -> u8 {
    (qs[i / 4] >> (2 * (i % 4))) & 3
}

/// Value of a code: c − 2.
#[inline]
pub const fn value_of_code(c: u8) -> i8 {
    // c ≤ 3 so the cast is exact.
    (c & 3) as i8 - 2
}

fn check(layout: TernaryLayout, values: &[i8], n_scales: usize) -> Result<(), KernelError> {
    if !values.len().is_multiple_of(BLOCK_ELEMS) || n_scales != values.len() / BLOCK_ELEMS {
        return Err(KernelError::BadRowLength {
            layout,
            cols: values.len(),
            multiple: BLOCK_ELEMS,
        });
    }
    Ok(())
}

fn pack_codes8(codes: &[u8]) -> [u8; 8] {
    let mut qs = [0u8; 8];
    for (i, &c) in codes.iter().enumerate() {
        qs[i / 4] |= c << (2 * (i % 4));
    }
    qs
}

/// Pack ternary values (n % 32 == 0) as BitNet32F16 with one scale per block (stored f16).
pub fn pack_inline(values: &[i8], scales: &[f32]) -> Result<Vec<u8>, KernelError> {
    check(TernaryLayout::BitNet32F16, values, scales.len())?;
    let codes = super::i2s::values_to_codes(values, 2)?;
    let mut out = Vec::with_capacity(scales.len() * INLINE_BLOCK_BYTES);
    for (cb, &d) in codes.chunks_exact(BLOCK_ELEMS).zip(scales) {
        out.extend_from_slice(&pack_codes8(cb));
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
    }
    Ok(out)
}

/// Pack ternary values (n % 32 == 0) as Split32WithSibling: returns the packed codes and the
/// sibling scale tensor as little-endian f32 bytes.
pub fn pack_split(values: &[i8], scales: &[f32]) -> Result<(Vec<u8>, Vec<u8>), KernelError> {
    check(TernaryLayout::Split32WithSibling, values, scales.len())?;
    let codes = super::i2s::values_to_codes(values, 2)?;
    let packed = codes
        .chunks_exact(BLOCK_ELEMS)
        .flat_map(pack_codes8)
        .collect();
    let sc = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
    Ok((packed, sc))
}

/// Unpack every code of a sequence of blocks of `stride` bytes (8 split, 10 inline).
pub fn unpack_codes(data: &[u8], stride: usize) -> Vec<u8> {
    data.chunks_exact(stride)
        .flat_map(|b| (0..BLOCK_ELEMS).map(move |i| code(&b[..8], i)))
        .collect()
}

/// Dequantize one BitNet32F16 row (its K/32 blocks): `out[32b + i] = (c − 2) · d_b`.
pub fn dequantize_row_inline(row: &[u8], out: &mut [f32]) {
    for (b, ob) in row
        .chunks_exact(INLINE_BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = super::read_f16(b, 8);
        for (i, o) in ob.iter_mut().enumerate() {
            *o = f32::from(value_of_code(code(b, i))) * d;
        }
    }
}

/// Dequantize one Split32 row: blocks of `row`, scales `first_block..` of `scales`.
pub fn dequantize_row_split(
    row: &[u8],
    scales: &ExternalScales<'_>,
    first_block: usize,
    out: &mut [f32],
) {
    for (bi, (b, ob)) in row
        .chunks_exact(PACKED_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
        .enumerate()
    {
        let d = scales.get(first_block + bi);
        for (i, o) in ob.iter_mut().enumerate() {
            *o = f32::from(value_of_code(code(b, i))) * d;
        }
    }
}

/// Number of codes 00 (never written) in packed bytes (pass only code bytes).
pub fn count_invalid(packed: &[u8]) -> usize {
    packed
        .iter()
        .map(|&b| {
            let nz = (b | (b >> 1)) & 0x55;
            4 - nz.count_ones() as usize
        })
        .sum()
}
