//! TQ2_0 as in upstream llama.cpp (GGUF type 35), docs/FORMATS.md §2.
//!
//! ```text
//! block of 256 elements = 66 bytes:  qs[64] | d: f16
//! qs[0..32] hold elements 0..127, qs[32..64] hold 128..255; within a 32-byte half h,
//! byte m holds element 128h + m + 32l at bits 2l..2l+1 (least significant pair first):
//!   bit 7 6   | 5 4     | 3 2     | 1 0
//!   m + 96    | m + 64  | m + 32  | m
//! w = (c − 1) · d        (c = 3 is never written; decoded as +2·d like llama.cpp)
//! ```
//! Rows hold K/256 blocks (K % 256 == 0). The kernels compute per block
//! `T_b = Σ c·q − Σ q` and `y = (Σ_b (T_b as f32) · d_b) / s` (blocks summed in order); a row
//! whose blocks all carry the same `d` takes I2_S's steps, `y = ((Σ_b T_b) as f32 / s) · d`.

use super::TernaryLayout;
use crate::KernelError;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 66;

/// One TQ2_0 block.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockTq2_0 {
    /// Packed codes (see the module diagram).
    pub qs: [u8; 64],
    /// Block scale (absmax).
    pub d: half::f16,
}
const _: () = assert!(std::mem::size_of::<BlockTq2_0>() == BLOCK_BYTES);

/// Code of element `e` (0..256) of a block's `qs`.
#[inline]
pub fn code(qs: &[u8], e: usize) -> u8 {
    let h = e / 128;
    let l = (e % 128) / 32;
    let m = e % 32;
    (qs[32 * h + m] >> (2 * l)) & 3
}

/// Pack ternary values (n % 256 == 0) with one scale per 256-element block (stored as f16).
pub fn pack(values: &[i8], scales: &[f32]) -> Result<Vec<u8>, KernelError> {
    if !values.len().is_multiple_of(BLOCK_ELEMS) || scales.len() != values.len() / BLOCK_ELEMS {
        return Err(KernelError::BadRowLength {
            layout: TernaryLayout::Tq2_0,
            cols: values.len(),
            multiple: BLOCK_ELEMS,
        });
    }
    let codes = super::i2s::values_to_codes(values, 1)?;
    let mut out = Vec::with_capacity(scales.len() * BLOCK_BYTES);
    for (cb, &d) in codes.chunks_exact(BLOCK_ELEMS).zip(scales) {
        let mut qs = [0u8; 64];
        for (e, &c) in cb.iter().enumerate() {
            qs[32 * (e / 128) + e % 32] |= c << (2 * ((e % 128) / 32));
        }
        out.extend_from_slice(&qs);
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
    }
    Ok(out)
}

/// Unpack every code of a sequence of blocks.
pub fn unpack_codes(data: &[u8]) -> Vec<u8> {
    data.chunks_exact(BLOCK_BYTES)
        .flat_map(|b| (0..BLOCK_ELEMS).map(move |e| code(&b[..64], e)))
        .collect()
}

/// Dequantize one row (its K/256 blocks): `out[256b + e] = (c − 1) · d_b`.
pub fn dequantize_row(row: &[u8], out: &mut [f32]) {
    for (b, ob) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = super::read_f16(b, 64);
        for (e, o) in ob.iter_mut().enumerate() {
            *o = (f32::from(code(&b[..64], e)) - 1.0) * d;
        }
    }
}
