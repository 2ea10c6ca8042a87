//! Ternary weight layouts: block types, pack/unpack, row dequantization (reference only).
//!
//! Every layout stores a matrix of `n_out` rows (output features) by `n_in` (= K) columns.
//! The per-layout modules document the exact bit layout at the top of each file.
//!
//! | layout | block | bytes/block | scale | value of code c |
//! |---|---|---|---|---|
//! | [`i2s`] (bitnet.cpp) | 128 | 32 | one f32 per tensor at byte n/4 | c−1 (c=3 decodes as 0) |
//! | [`tq2_0`] | 256 | 66 | f16 per block (inline) | c−1 |
//! | [`tq1_0`] | 256 | 54 | f16 per block (inline) | trit−1 |
//! | [`seq32`] BitNet32F16 | 32 | 10 | f16 per block (inline) | c−2 |
//! | [`seq32`] Split32WithSibling | 32 | 8 | f32/f16 per block, sibling tensor | c−2 |
//! | [`qk256`] GgmlQk256NoScale | 256 | 64 | f32/f16 per block, companion tensor, else 1.0 | LUT {−2,−1,+1,+2} |

pub mod i2s;
pub mod qk256;
pub mod seq32;
pub mod tq1_0;
pub mod tq2_0;

use crate::KernelError;

/// The largest row length accepted: keeps every i32 sum of `code · q` (|·| ≤ 4·128 per
/// element) far from overflow.
pub const MAX_K: usize = 1 << 20;

pub use crate::formats::TernaryLayout;

// The methods of the format names live with the formats they describe.
impl TernaryLayout {
    /// All layouts, in the order type-36 detection tries them.
    pub const ALL: [TernaryLayout; 6] = [
        TernaryLayout::I2S,
        TernaryLayout::Qk256,
        TernaryLayout::Split32WithSibling,
        TernaryLayout::BitNet32F16,
        TernaryLayout::Tq2_0,
        TernaryLayout::Tq1_0,
    ];

    /// Elements per scale block (I2_S: the whole row, reported as 128, its packing block).
    pub const fn block_elems(self) -> usize {
        match self {
            TernaryLayout::I2S => 128,
            TernaryLayout::Tq2_0 | TernaryLayout::Tq1_0 | TernaryLayout::Qk256 => 256,
            TernaryLayout::BitNet32F16 | TernaryLayout::Split32WithSibling => 32,
        }
    }

    /// A layout of ternary codes with a scale per block (TQ2_0, TQ1_0, BitNet32F16,
    /// Split32): not I2_S (one tensor scale), not QK256 (values ±1, ±2).
    pub const fn is_ternary_block_layout(self) -> bool {
        matches!(
            self,
            TernaryLayout::Tq2_0
                | TernaryLayout::Tq1_0
                | TernaryLayout::BitNet32F16
                | TernaryLayout::Split32WithSibling
        )
    }

    /// The multiple K must be (QK256 allows any K: rows are padded to whole blocks).
    pub const fn k_multiple(self) -> usize {
        match self {
            TernaryLayout::Qk256 => 1,
            other => other.block_elems(),
        }
    }

    /// Number of scale blocks per row (I2_S: 1, the whole row shares the tensor scale).
    pub fn blocks_per_row(self, n_in: usize) -> usize {
        match self {
            TernaryLayout::I2S => 1,
            TernaryLayout::Qk256 => n_in.div_ceil(256),
            other => n_in / other.block_elems(),
        }
    }

    /// Bytes of one row of packed weights (I2_S: K/4; the tail is not part of any row).
    pub fn row_bytes(self, n_in: usize) -> usize {
        match self {
            TernaryLayout::I2S => n_in / 4,
            TernaryLayout::Tq2_0 => n_in / 256 * tq2_0::BLOCK_BYTES,
            TernaryLayout::Tq1_0 => n_in / 256 * tq1_0::BLOCK_BYTES,
            TernaryLayout::BitNet32F16 => n_in / 32 * seq32::INLINE_BLOCK_BYTES,
            TernaryLayout::Split32WithSibling => n_in / 32 * seq32::PACKED_BYTES,
            TernaryLayout::Qk256 => n_in.div_ceil(256) * qk256::BLOCK_BYTES,
        }
    }

    /// Check that K suits the layout.
    pub fn check_k(self, n_in: usize) -> Result<(), KernelError> {
        let multiple = self.k_multiple();
        if n_in == 0 || !n_in.is_multiple_of(multiple) {
            return Err(KernelError::BadRowLength {
                layout: self,
                cols: n_in,
                multiple,
            });
        }
        Ok(())
    }

    /// Exact byte size of the weight tensor (`n_out × n_in`), scales included when inline.
    ///
    /// | layout | bytes |
    /// |---|---|
    /// | I2_S | n/4 + 32 |
    /// | QK256 | n_out · ceil(K/256) · 64 (= ceil(n/256)·64 when K % 256 == 0) |
    /// | Split32WithSibling | n/32 · 8 |
    /// | BitNet32F16 | n/32 · 10 |
    /// | TQ2_0 | n/256 · 66 |
    /// | TQ1_0 | n/256 · 54 |
    pub fn tensor_bytes(self, n_out: usize, n_in: usize) -> Result<usize, KernelError> {
        self.check_k(n_in)?;
        let rows = n_out
            .checked_mul(self.row_bytes(n_in))
            .ok_or(KernelError::Overflow {
                what: "tensor bytes",
            })?;
        match self {
            TernaryLayout::I2S => rows
                .checked_add(i2s::TAIL_BYTES)
                .ok_or(KernelError::Overflow {
                    what: "tensor bytes",
                }),
            _ => Ok(rows),
        }
    }

    /// Offset subtracted from the kernel's unsigned code to get the value: `w = u − offset`
    /// where `u` is the (transformed) code the kernels multiply (see each layout module).
    pub(crate) const fn code_offset(self) -> i32 {
        match self {
            TernaryLayout::I2S | TernaryLayout::Tq2_0 | TernaryLayout::Tq1_0 => 1,
            TernaryLayout::BitNet32F16
            | TernaryLayout::Split32WithSibling
            | TernaryLayout::Qk256 => 2,
        }
    }
}

/// Per-block scales stored outside the weight bytes (sibling / companion tensor).
#[derive(Debug, Clone, Copy)]
pub enum ExternalScales<'a> {
    /// Little-endian f32, one per block.
    F32(&'a [u8]),
    /// Little-endian IEEE f16, one per block.
    F16(&'a [u8]),
}

impl<'a> ExternalScales<'a> {
    /// Interpret the exact bytes of a scale tensor holding `n_blocks` scales: `4·n_blocks`
    /// bytes are f32, `2·n_blocks` bytes are f16; anything else is `None`.
    pub fn from_exact_len(bytes: &'a [u8], n_blocks: usize) -> Option<Self> {
        if Some(bytes.len()) == n_blocks.checked_mul(4) {
            Some(ExternalScales::F32(bytes))
        } else if Some(bytes.len()) == n_blocks.checked_mul(2) {
            Some(ExternalScales::F16(bytes))
        } else {
            None
        }
    }

    /// Number of scales held.
    pub fn len(&self) -> usize {
        match self {
            ExternalScales::F32(b) => b.len() / 4,
            ExternalScales::F16(b) => b.len() / 2,
        }
    }

    /// True when no scale is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Scale `i` as f32 (0.0 past the end; callers validate lengths at construction).
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            ExternalScales::F32(b) => read_f32(b, 4 * i),
            ExternalScales::F16(b) => read_f16(b, 2 * i),
        }
    }
}

/// Little-endian f32 at byte `off` (0.0 if out of range).
#[inline]
pub(crate) fn read_f32(b: &[u8], off: usize) -> f32 {
    match b.get(off..off + 4) {
        Some(s) => f32::from_le_bytes([s[0], s[1], s[2], s[3]]),
        None => 0.0,
    }
}

/// Little-endian f16 at byte `off`, widened to f32 (0.0 if out of range).
#[inline]
pub(crate) fn read_f16(b: &[u8], off: usize) -> f32 {
    match b.get(off..off + 2) {
        Some(s) => half::f16::from_le_bytes([s[0], s[1]]).to_f32(),
        None => 0.0,
    }
}
