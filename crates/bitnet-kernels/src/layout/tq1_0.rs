//! TQ1_0 as in upstream llama.cpp (GGUF type 34), docs/FORMATS.md §2.
//!
//! ```text
//! block of 256 elements = 54 bytes:  qs[48] | qh[4] | d: f16
//! five trits per byte, base 3, first trit most significant, stored as ceil(v·256/243):
//!   qs[0..32]   byte m, trit n (0..5) → element m + 32n            (elements 0..159)
//!   qs[32..48]  byte m, trit n (0..5) → element 160 + m + 16n      (elements 160..239)
//!   qh[0..4]    byte j, trit n (0..4) → element 240 + j + 4n       (elements 240..255)
//! trit n of byte b = ((u16)(u8)(b · 3^n) · 3) >> 8;   w = (trit − 1) · d
//! ```
//! Rows hold K/256 blocks. Kernels: `T_b = Σ trit·q − Σ q`, `y = (Σ_b (T_b as f32) · d_b) / s`;
//! a row whose blocks all carry the same `d` takes I2_S's steps, `y = ((Σ_b T_b) as f32 / s) · d`.

use super::TernaryLayout;
use crate::KernelError;

/// Elements per block.
pub const BLOCK_ELEMS: usize = 256;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 54;

/// One TQ1_0 block.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockTq1_0 {
    /// Five trits per byte for elements 0..240.
    pub qs: [u8; 48],
    /// Four trits per byte for elements 240..256.
    pub qh: [u8; 4],
    /// Block scale.
    pub d: half::f16,
}
const _: () = assert!(std::mem::size_of::<BlockTq1_0>() == BLOCK_BYTES);

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `n` (0 = most significant) of a packed byte.
#[inline]
pub fn trit(b: u8, n: usize) -> u8 {
    let v = u16::from(b.wrapping_mul(POW3[n]));
    // (v·3) >> 8 ≤ 2 for every v ≤ 255.
    ((v * 3) >> 8) as u8
}

/// (byte index within the 52 packed bytes, trit index) of element `e` (0..256) of a block.
#[inline]
pub fn position(e: usize) -> (usize, usize) {
    if e < 160 {
        (e % 32, e / 32)
    } else if e < 240 {
        (32 + (e - 160) % 16, (e - 160) / 16)
    } else {
        (48 + (e - 240) % 4, (e - 240) / 4)
    }
}

/// The trit (0..=2) of element `e` of a block (`b` = the block's bytes).
#[inline]
pub fn code(b: &[u8], e: usize) -> u8 {
    let (byte, n) = position(e);
    trit(b[byte], n)
}

/// Pack ternary values (n % 256 == 0) with one scale per block (stored as f16).
pub fn pack(values: &[i8], scales: &[f32]) -> Result<Vec<u8>, KernelError> {
    if !values.len().is_multiple_of(BLOCK_ELEMS) || scales.len() != values.len() / BLOCK_ELEMS {
        return Err(KernelError::BadRowLength {
            layout: TernaryLayout::Tq1_0,
            cols: values.len(),
            multiple: BLOCK_ELEMS,
        });
    }
    let trits = super::i2s::values_to_codes(values, 1)?;
    let mut out = Vec::with_capacity(scales.len() * BLOCK_BYTES);
    for (tb, &d) in trits.chunks_exact(BLOCK_ELEMS).zip(scales) {
        // Base-3 number per byte, first trit most significant.
        let mut v = [0u16; 52];
        let mut count = [0usize; 52];
        for (e, &t) in tb.iter().enumerate() {
            let (byte, _) = position(e);
            v[byte] = v[byte] * 3 + u16::from(t);
            count[byte] += 1;
        }
        for (byte, val) in v.iter_mut().enumerate() {
            // qh bytes hold 4 trits; scale them like 5-trit numbers (the 5th trit is 0).
            for _ in count[byte]..5 {
                *val *= 3;
            }
            // ceil(v·256/243) ≤ 256 only for v = 243, which five trits cannot reach (max 242).
            let stored = (u32::from(*val) * 256).div_ceil(243);
            out.push(u8::try_from(stored).map_err(|_| KernelError::Overflow { what: "trit" })?);
        }
        out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
    }
    Ok(out)
}

/// Unpack every trit of a sequence of blocks.
pub fn unpack_codes(data: &[u8]) -> Vec<u8> {
    data.chunks_exact(BLOCK_BYTES)
        .flat_map(|b| (0..BLOCK_ELEMS).map(move |e| code(b, e)))
        .collect()
}

/// Dequantize one row (its K/256 blocks): `out[256b + e] = (trit − 1) · d_b`.
pub fn dequantize_row(row: &[u8], out: &mut [f32]) {
    for (b, ob) in row
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(BLOCK_ELEMS))
    {
        let d = super::read_f16(b, 52);
        for (e, o) in ob.iter_mut().enumerate() {
            *o = (f32::from(code(b, e)) - 1.0) * d;
        }
    }
}
