//! aarch64 NEON kernels for I2_S and TQ2_0 (dotprod `sdot` when the CPU has it); the other
//! entries are scalar.
//!
//! The layout is the one on disk (128-element I2_S blocks of 32 bytes), never a host-specific
//! one. Per 16 bytes of weights, plane l = 16 codes (0..=3) of consecutive elements:
//! ```text
//! I2_S block b, bytes 32b + 16h + i (h = 0, 1): plane l (bits 7−2l..6−2l) ↔ x[128b + 32l + 16h + i]
//! TQ2_0 block b, half g, bytes 32g + 16h + i:  plane l (bits 2l..2l+1)    ↔ x[256b + 128g + 32l + 16h + i]
//! ```
//! Products are widened before accumulating: without dotprod, `vmull_s8` (i8×i8 → i16,
//! |·| ≤ 3·128) then `vpadalq_s16` pairwise into i32 lanes — never an i16 running sum (the
//! accumulator overflow of microsoft/BitNet#411); with dotprod, `sdot` into i32 lanes.

use std::arch::aarch64::*;

use super::scalar;
use crate::layout::tq2_0;
use crate::tier::Prepared;
use crate::tier::{Isa, Kernels};

pub(crate) static TABLE: Kernels = Kernels {
    isa: Isa::Neon,
    i2s,
    i2s_clean: i2s,
    i2s_rows: None,
    tq2,
    tq1: scalar::tq1,
    bitnet32: scalar::bitnet32,
    split32: scalar::split32,
    qk256: scalar::qk256,
    f16_dot_ggml: scalar::f16_dot_ggml,
    f16_dot_tiny: scalar::f16_dot_tiny,
    q8_0_dot: scalar::q8_0_dot,
    q4_0_dot: scalar::q4_0_dot,
    bf16_dot: scalar::bf16_dot,
    f32_dot: scalar::f32_dot_lanes8,
    q8_0_q8: scalar::q8_0_q8,
    q4_0_q8: scalar::q4_0_q8,
    f16_dot_ggml_multi: scalar::f16_dot_ggml_multi,
    f16_dot_fast: scalar::f16_dot_ggml,
    f16_dot_fast_multi: scalar::f16_dot_ggml_multi,
    f16_fast_rows: None,
    q8_0_q8_multi: scalar::q8_0_q8_multi,
    q4_0_q8_multi: scalar::q4_0_q8_multi,
    i2s_panel: None,
    panel_tokens: 0,
    i2s_lut: None,
    i2s_amx: None,
};

/// Hint the cache line 3 KiB past `p[off]` (the weight stream's read-ahead distance, as in
/// the x86 kernels). The pointer is formed with `wrapping_add` and never dereferenced.
#[inline(always)]
fn prefetch_ahead(p: &[u8], off: usize) {
    let a = p.as_ptr().wrapping_add(off + 3072);
    // SAFETY: PRFM is a hint: it never faults and writes nothing, whatever the address.
    unsafe {
        std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) a, options(nostack, preserves_flags, readonly));
    }
}

fn has_dotprod() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

/// `acc + Σ a·b` over 16 lanes (a codes 0..=3, b int8), widening through i16 products.
#[inline]
#[target_feature(enable = "neon")]
fn dot16(acc: int32x4_t, a: uint8x16_t, b: int8x16_t) -> int32x4_t {
    let a = vreinterpretq_s8_u8(a);
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_high_s8(a, b);
    vpadalq_s16(vpadalq_s16(acc, lo), hi)
}

/// `acc + Σ a·b` with the dotprod `sdot` instruction.
#[inline]
#[target_feature(enable = "neon,dotprod")]
fn dot16_sdot(acc: int32x4_t, a: uint8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    let a = vreinterpretq_s8_u8(a);
    // SAFETY: `sdot` only reads/writes the named vector registers; dotprod is enabled.
    unsafe {
        std::arch::asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack)
        );
    }
    acc
}

/// 16 int8 at `x[off..off+16]`.
///
/// # Safety
/// `off + 16 <= x.len()`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn ldx(x: &[i8], off: usize) -> int8x16_t {
    debug_assert!(off + 16 <= x.len());
    // SAFETY: in bounds by the caller's contract.
    unsafe { vld1q_s8(x.as_ptr().add(off)) }
}

/// 16 bytes at `w[off..off+16]`.
///
/// # Safety
/// `off + 16 <= w.len()`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn ldw(w: &[u8], off: usize) -> uint8x16_t {
    debug_assert!(off + 16 <= w.len());
    // SAFETY: in bounds by the caller's contract.
    unsafe { vld1q_u8(w.as_ptr().add(off)) }
}

/// Planes of 16 bytes in x order: I2_S (msb first) or TQ2_0 (lsb first).
#[inline]
#[target_feature(enable = "neon")]
fn planes(w: uint8x16_t, msb_first: bool) -> [uint8x16_t; 4] {
    let m3 = vdupq_n_u8(3);
    let a = vandq_u8(w, m3);
    let b = vandq_u8(vshrq_n_u8::<2>(w), m3);
    let c = vandq_u8(vshrq_n_u8::<4>(w), m3);
    let d = vshrq_n_u8::<6>(w);
    if msb_first {
        [d, c, b, a]
    } else {
        [a, b, c, d]
    }
}

/// I2_S code 11 → 01 in every pair.
#[inline]
#[target_feature(enable = "neon")]
fn sanitize(w: uint8x16_t) -> uint8x16_t {
    let both = vandq_u8(vandq_u8(w, vshrq_n_u8::<1>(w)), vdupq_n_u8(0x55));
    veorq_u8(w, vshlq_n_u8::<1>(both))
}

macro_rules! ternary_fns {
    ($name:ident, $dot:ident, $feat:literal) => {
        /// I2_S: `out[ti] = Σ u·q` for `nt` tokens.
        ///
        /// # Safety
        /// NEON (and the named features) available; `w_row.len() ≥ K/4`; tokens exist;
        /// `out.len() ≥ nt`.
        #[target_feature(enable = $feat)]
        unsafe fn $name(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
            let k = p.k;
            for ti in 0..nt {
                let x = p.token(t0 + ti);
                let mut acc = vdupq_n_s32(0);
                for b in 0..k / 128 {
                    if b % 2 == 0 {
                        prefetch_ahead(w_row, 32 * b);
                    }
                    for h in 0..2 {
                        // SAFETY: 32b + 16h + 16 ≤ K/4; 128b + 32l + 16h + 16 ≤ K.
                        let c = planes(sanitize(unsafe { ldw(w_row, 32 * b + 16 * h) }), true);
                        for (l, cl) in c.iter().enumerate() {
                            // SAFETY: as above.
                            let xv = unsafe { ldx(x, 128 * b + 32 * l + 16 * h) };
                            acc = $dot(acc, *cl, xv);
                        }
                    }
                }
                out[ti] = vaddvq_s32(acc);
            }
        }
    };
}
ternary_fns!(i2s_neon, dot16, "neon");
ternary_fns!(i2s_sdot, dot16_sdot, "neon,dotprod");

macro_rules! tq2_fns {
    ($name:ident, $dot:ident, $feat:literal) => {
        /// TQ2_0: `out[ti·nb + b] = Σ c·q` per block.
        ///
        /// # Safety
        /// NEON (and the named features) available; the row holds K/256 blocks; tokens exist;
        /// `out.len() ≥ nt·K/256`.
        #[target_feature(enable = $feat)]
        unsafe fn $name(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
            let nb = p.k / 256;
            for ti in 0..nt {
                let x = p.token(t0 + ti);
                for b in 0..nb {
                    let mut acc = vdupq_n_s32(0);
                    for g in 0..2 {
                        for h in 0..2 {
                            let off = b * tq2_0::BLOCK_BYTES + 32 * g + 16 * h;
                            // SAFETY: off + 16 ≤ 66b + 64; x offsets < 256(b+1) ≤ K.
                            let c = planes(unsafe { ldw(w_row, off) }, false);
                            for (l, cl) in c.iter().enumerate() {
                                // SAFETY: as above.
                                let xv = unsafe { ldx(x, 256 * b + 128 * g + 32 * l + 16 * h) };
                                acc = $dot(acc, *cl, xv);
                            }
                        }
                    }
                    out[ti * nb + b] = vaddvq_s32(acc);
                }
            }
        }
    };
}
tq2_fns!(tq2_neon, dot16, "neon");
tq2_fns!(tq2_sdot, dot16_sdot, "neon,dotprod");

fn i2s(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    let k = p.k;
    if !k.is_multiple_of(128) || w_row.len() < k / 4 || p.x.len() < (t0 + nt) * k || out.len() < nt
    {
        return scalar::i2s(w_row, p, t0, nt, out);
    }
    // SAFETY: the table is handed out only when NEON is detected; sdot only with dotprod.
    unsafe {
        if has_dotprod() {
            i2s_sdot(w_row, p, t0, nt, out)
        } else {
            i2s_neon(w_row, p, t0, nt, out)
        }
    }
}

fn tq2(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    let k = p.k;
    let nb = k / 256;
    if !k.is_multiple_of(256)
        || w_row.len() < nb * tq2_0::BLOCK_BYTES
        || p.x.len() < (t0 + nt) * k
        || out.len() < nt * nb
    {
        return scalar::tq2(w_row, p, t0, nt, out);
    }
    // SAFETY: as in `i2s`.
    unsafe {
        if has_dotprod() {
            tq2_sdot(w_row, p, t0, nt, out)
        } else {
            tq2_neon(w_row, p, t0, nt, out)
        }
    }
}
