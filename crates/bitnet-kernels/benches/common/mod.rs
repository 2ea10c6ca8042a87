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

/// Independent chains of one multiply instruction on registers: nanoseconds per instruction
/// (the issue rate, not the latency).
#[cfg(target_arch = "x86_64")]
pub mod probe {
    use std::arch::x86_64::*;
    use std::hint::black_box;
    use std::time::Instant;

    /// Instructions per timed loop (10 chains × this).
    const N: u64 = 20_000_000;

    macro_rules! probe_fn {
        ($name:ident, $feat:literal, $ty:ty, $reg:ident, $init:expr, |$a:ident, $x:ident| $op:expr) => {
            /// # Safety
            /// The named target features are available.
            #[target_feature(enable = $feat)]
            pub unsafe fn $name() -> f64 {
                let $x: $ty = black_box($init);
                let mut c: [$ty; 10] = [black_box($init); 10];
                let mut best = f64::MAX;
                for _ in 0..3 {
                    let t = Instant::now();
                    for _ in 0..N {
                        for $a in c.iter_mut() {
                            *$a = $op;
                        }
                        // SAFETY: an empty instruction string; it only makes the registers
                        // opaque so the chains are neither folded nor merged.
                        unsafe {
                            std::arch::asm!("# {0} {1} {2} {3} {4} {5} {6} {7} {8} {9}",
                                inout($reg) c[0], inout($reg) c[1], inout($reg) c[2],
                                inout($reg) c[3], inout($reg) c[4], inout($reg) c[5],
                                inout($reg) c[6], inout($reg) c[7], inout($reg) c[8],
                                inout($reg) c[9], options(nomem, nostack, preserves_flags));
                        }
                    }
                    best = best.min(t.elapsed().as_secs_f64() * 1e9 / (10 * N) as f64);
                }
                black_box(c);
                best
            }
        };
    }

    probe_fn!(
        maddubs_ymm,
        "avx2",
        __m256i,
        ymm_reg,
        _mm256_set1_epi8(1),
        |a, x| _mm256_maddubs_epi16(*a, x)
    );
    probe_fn!(
        dpbusd_ymm,
        "avx2,avxvnni",
        __m256i,
        ymm_reg,
        _mm256_set1_epi8(1),
        |a, x| _mm256_dpbusd_avx_epi32(*a, x, x)
    );
    probe_fn!(
        dpbusd_zmm,
        "avx512f,avx512vnni",
        __m512i,
        zmm_reg,
        _mm512_set1_epi8(1),
        |a, x| _mm512_dpbusd_epi32(*a, x, x)
    );
}
