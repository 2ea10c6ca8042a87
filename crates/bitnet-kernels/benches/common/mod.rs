//! Test data shared by the benchmarks: seeded bytes and valid random ternary tensors.

#![allow(dead_code, clippy::unwrap_used, clippy::cast_possible_truncation)] // each bench uses part

use bitnet_kernels::TernaryLayout;

/// `n` seeded pseudo-random bytes (xorshift64).
pub fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// A random tensor with valid scales (codes random, scales 0.5).
pub fn tensor(layout: TernaryLayout, n_out: usize, k: usize) -> (Vec<u8>, Option<Vec<u8>>) {
    let mut w = bytes(layout.tensor_bytes(n_out, k).unwrap(), 7);
    let nb = n_out * layout.blocks_per_row(k);
    let half = half::f16::from_f32(0.5).to_le_bytes();
    let mut sib = None;
    match layout {
        TernaryLayout::I2S => {
            let o = n_out * k / 4;
            w[o..o + 4].copy_from_slice(&0.5f32.to_le_bytes());
            // Valid codes only (no 11), as bitnet.cpp writes them.
            for b in &mut w[..o] {
                *b = bitnet_kernels::layout::i2s::sanitize_byte(*b);
            }
        }
        TernaryLayout::Tq2_0 => {
            (0..nb).for_each(|b| w[66 * b + 64..66 * b + 66].copy_from_slice(&half))
        }
        TernaryLayout::Tq1_0 => {
            (0..nb).for_each(|b| w[54 * b + 52..54 * b + 54].copy_from_slice(&half))
        }
        TernaryLayout::BitNet32F16 => {
            (0..nb).for_each(|b| w[10 * b + 8..10 * b + 10].copy_from_slice(&half))
        }
        TernaryLayout::Split32WithSibling | TernaryLayout::Qk256 => {
            sib = Some((0..nb).flat_map(|_| 0.5f32.to_le_bytes()).collect());
        }
    }
    (w, sib)
}
