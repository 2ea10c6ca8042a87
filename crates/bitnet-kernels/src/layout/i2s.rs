//! I2_S as written by bitnet.cpp (docs/FORMATS.md §1) — the official 2B-4T layout.
//!
//! ```text
//! tensor of n = n_out·K elements, K % 128 == 0, row-major (row r = elements r·K .. r·K+K−1)
//! bytes [0, n/4)        packed codes, 128-element blocks of 32 bytes
//! bytes [n/4, n/4+4)    β: little-endian f32, the one scale of the tensor
//! bytes [n/4+4, n/4+32) uninitialised in bitnet.cpp files: never read
//!
//! block b = elements 128b..128b+127 = bytes 32b..32b+31; byte 32b+p:
//!   bit 7 6 | 5 4  | 3 2  | 1 0
//!   elem  p | p+32 | p+64 | p+96        (most significant pair first)
//! code 00 → −1, 01 → 0, 10 → +1, 11 → never written (decoded as 0, counted by validators)
//! w = β · value(code)
//! ```
//! The kernels multiply `u = c ^ ((c & c>>1 & 1) << 1)` (= 0,1,2,1 for c = 0..3, i.e. value+1
//! with code 11 mapped to value 0) and subtract Σq: `T = Σ u·q − Σ q`.

use crate::KernelError;

/// Elements per packing block.
pub const BLOCK_ELEMS: usize = 128;
/// Bytes per packing block.
pub const BLOCK_BYTES: usize = 32;
/// The tail after the packed codes: f32 β then 28 unused bytes.
pub const TAIL_BYTES: usize = 32;

/// One 128-element packing block.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockI2S {
    /// Byte p holds elements p, p+32, p+64, p+96 at bits 7–6, 5–4, 3–2, 1–0.
    pub qs: [u8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockI2S>() == BLOCK_BYTES);

/// The 2-bit code of element `j` of a packed sequence (the worked formula of docs/FORMATS.md §1).
#[inline]
pub fn code(packed: &[u8], j: usize) -> u8 {
    (packed[32 * (j / 128) + (j % 128) % 32] >> (6 - 2 * ((j % 128) / 32))) & 3
}

/// The ternary value of a code: 00 → −1, 01 → 0, 10 → +1, 11 → 0 (invalid).
#[inline]
pub const fn value_of_code(c: u8) -> i8 {
    match c & 3 {
        0 => -1,
        2 => 1,
        _ => 0,
    }
}

/// Map code 11 to 01 in all four pairs of a byte (kernels multiply value + 1).
#[inline]
pub const fn sanitize_byte(b: u8) -> u8 {
    b ^ ((b & (b >> 1) & 0x55) << 1)
}

/// Pack codes (0..=3, one per element; n % 128 == 0) and β into an I2_S tensor
/// (`n/4 + 32` bytes; the 28 unused tail bytes are written as zero).
pub fn pack_codes(codes: &[u8], beta: f32) -> Result<Vec<u8>, KernelError> {
    if !codes.len().is_multiple_of(BLOCK_ELEMS) {
        return Err(KernelError::BadRowLength {
            layout: super::TernaryLayout::I2S,
            cols: codes.len(),
            multiple: BLOCK_ELEMS,
        });
    }
    let mut out = vec![0u8; codes.len() / 4 + TAIL_BYTES];
    for (j, &c) in codes.iter().enumerate() {
        out[32 * (j / 128) + (j % 128) % 32] |= (c & 3) << (6 - 2 * ((j % 128) / 32));
    }
    let n4 = codes.len() / 4;
    out[n4..n4 + 4].copy_from_slice(&beta.to_le_bytes());
    Ok(out)
}

/// Pack ternary values (−1, 0, +1; anything else is an error) and β.
pub fn pack_values(values: &[i8], beta: f32) -> Result<Vec<u8>, KernelError> {
    let codes = values_to_codes(values, 1)?;
    pack_codes(&codes, beta)
}

/// `code = value + offset` for values in {−1, 0, 1}.
pub(crate) fn values_to_codes(values: &[i8], offset: i8) -> Result<Vec<u8>, KernelError> {
    values
        .iter()
        .map(|&v| {
            if (-1..=1).contains(&v) {
                u8::try_from(v + offset).map_err(|_| KernelError::Overflow { what: "code" })
            } else {
                Err(KernelError::ShapeMismatch {
                    what: "ternary value (must be -1, 0 or 1)",
                    expected: 1,
                    got: usize::from(v.unsigned_abs()),
                })
            }
        })
        .collect()
}

/// Unpack the first `n` codes of a packed sequence.
pub fn unpack_codes(packed: &[u8], n: usize) -> Vec<u8> {
    (0..n).map(|j| code(packed, j)).collect()
}

/// Unpack the first `n` ternary values.
pub fn unpack_values(packed: &[u8], n: usize) -> Vec<i8> {
    (0..n).map(|j| value_of_code(code(packed, j))).collect()
}

/// The tensor scale β (f32 at byte n/4) of an I2_S tensor of `n` elements.
pub fn tensor_scale(data: &[u8], n: usize) -> Option<f32> {
    let off = n / 4;
    data.get(off..off + 4)
        .map(|s| f32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// Dequantize one row (`row` = its K/4 packed bytes): `out[k] = β · value(code_k)`.
pub fn dequantize_row(row: &[u8], beta: f32, out: &mut [f32]) {
    for (k, o) in out.iter_mut().enumerate() {
        *o = beta * f32::from(value_of_code(code(row, k)));
    }
}

/// Number of codes 11 (never written by bitnet.cpp) in the packed bytes.
pub fn count_invalid(packed: &[u8]) -> usize {
    packed
        .iter()
        .map(|&b| {
            let both = b & (b >> 1) & 0x55;
            both.count_ones() as usize
        })
        .sum()
}
