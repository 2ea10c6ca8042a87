//! WebAssembly SIMD (`simd128`) kernels for I2_S and TQ2_0; the other entries are scalar.
//!
//! Compiled only for wasm32 with `-C target-feature=+simd128` (a module either validates
//! with SIMD or not at all, so there is nothing to detect at run time). The layouts are the
//! ones on disk, read as in the NEON tier: per 16 bytes of weights, plane l = 16 codes of
//! consecutive elements:
//! ```text
//! I2_S block b, bytes 32b + 16h + i (h = 0, 1): plane l (bits 7−2l..6−2l) ↔ x[128b + 32l + 16h + i]
//! TQ2_0 block b, half g, bytes 32g + 16h + i:  plane l (bits 2l..2l+1)    ↔ x[256b + 128g + 32l + 16h + i]
//! ```
//! Products are `i16x8.extmul` of codes (0..=3) and int8 activations (|p| ≤ 3·128), summed
//! in i16 lanes for at most [`FLUSH_BLOCKS`] blocks (16 products a lane a block: at most
//! 4·16·384 = 24,576 < 2^15) and then widened pairwise into i32 lanes: never an i16 sum that
//! can overflow. Integer sums are exact, so every result equals the scalar kernel's.

use std::arch::wasm32::*;

use super::scalar;
use crate::layout::tq2_0;
use crate::tier::Prepared;
use crate::tier::{Isa, Kernels};

pub(crate) static TABLE: Kernels = Kernels {
    isa: Isa::Simd128,
    i2s,
    i2s_clean: i2s,
    i2s_quad: Some(i2s_quad),
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
    f16_dot_fast,
    f16_dot_fast_multi,
    q8_0_q8_multi: scalar::q8_0_q8_multi,
    q4_0_q8_multi: scalar::q4_0_q8_multi,
    i2s_panel: None,
    panel_tokens: 0,
    i2s_lut: None,
    i2s_amx: None,
};

/// Blocks of 128 elements summed in i16 lanes before widening (see the module docs).
const FLUSH_BLOCKS: usize = 4;

/// I2_S blocks decoded at a time for a call of several tokens (the codes are decoded once
/// and used by every token).
const CHUNK_BLOCKS: usize = 16;

/// 16 bytes at `s[off..off + 16]`; panics when out of bounds.
#[inline(always)]
fn load<T: Copy>(s: &[T], off: usize) -> v128 {
    let bytes = &s[off..off + 16 / std::mem::size_of::<T>()];
    // SAFETY: `bytes` spans 16 bytes in bounds (checked by the slice above); v128_load
    // reads them without any alignment requirement.
    unsafe { v128_load(bytes.as_ptr().cast::<v128>()) }
}

/// 16 bytes at `s[off..]`, unchecked (the hot loops, whose callers checked the lengths once).
///
/// # Safety
/// `off + 16 / size_of::<T>() <= s.len()`.
#[inline(always)]
unsafe fn ld<T: Copy>(s: &[T], off: usize) -> v128 {
    debug_assert!(off + 16 / std::mem::size_of::<T>() <= s.len());
    // SAFETY: in bounds by the caller's contract; v128_load needs no alignment.
    unsafe { v128_load(s.as_ptr().add(off).cast::<v128>()) }
}

/// Store 16 bytes at `s[off..off + 16]`; panics when out of bounds.
#[inline(always)]
fn store(s: &mut [u8], off: usize, v: v128) {
    let bytes = &mut s[off..off + 16];
    // SAFETY: `bytes` spans 16 writable bytes (checked by the slice above); v128_store
    // writes them without any alignment requirement.
    unsafe { v128_store(bytes.as_mut_ptr().cast::<v128>(), v) }
}

/// I2_S code 11 → 01 in every pair (u = 0, 1, 2, 1 for c = 0..3).
#[inline(always)]
fn sanitize(w: v128) -> v128 {
    let both = v128_and(v128_and(w, u8x16_shr(w, 1)), u8x16_splat(0x55));
    v128_xor(w, i8x16_shl(both, 1))
}

/// The four planes of 16 weight bytes in x order: I2_S (msb first) or TQ2_0 (lsb first).
#[inline(always)]
fn planes(w: v128, msb_first: bool) -> [v128; 4] {
    let m3 = u8x16_splat(3);
    let a = v128_and(w, m3);
    let b = v128_and(u8x16_shr(w, 2), m3);
    let c = v128_and(u8x16_shr(w, 4), m3);
    let d = u8x16_shr(w, 6);
    if msb_first {
        [d, c, b, a]
    } else {
        [a, b, c, d]
    }
}

/// `acc + Σ` of the 16 products `c·x`, pairwise into i16 lanes (codes ≤ 3 are valid i8).
#[inline(always)]
fn mac(acc: v128, c: v128, x: v128) -> v128 {
    i16x8_add(
        acc,
        i16x8_add(i16x8_extmul_low_i8x16(c, x), i16x8_extmul_high_i8x16(c, x)),
    )
}

/// `acc32 + ` the i16 lanes of `acc16` widened pairwise.
#[inline(always)]
fn widen(acc32: v128, acc16: v128) -> v128 {
    i32x4_add(acc32, i32x4_extadd_pairwise_i16x8(acc16))
}

#[inline(always)]
fn hsum(v: v128) -> i32 {
    i32x4_extract_lane::<0>(v)
        .wrapping_add(i32x4_extract_lane::<1>(v))
        .wrapping_add(i32x4_extract_lane::<2>(v))
        .wrapping_add(i32x4_extract_lane::<3>(v))
}

/// `Σ u·q` of one I2_S row (K/4 bytes, K a multiple of 128) and one token `x`.
fn i2s_row(w: &[u8], x: &[i8], clean: bool) -> i32 {
    let nb = x.len() / 128;
    assert!(w.len() >= 32 * nb);
    let mut acc32 = i32x4_splat(0);
    let mut b0 = 0;
    while b0 < nb {
        let b1 = (b0 + FLUSH_BLOCKS).min(nb);
        let mut acc = i16x8_splat(0);
        for b in b0..b1 {
            for h in 0..2 {
                // SAFETY: b < nb: 32b + 16h + 16 ≤ 32·nb ≤ w.len() (asserted above).
                let raw = unsafe { ld(w, 32 * b + 16 * h) };
                let c = planes(if clean { raw } else { sanitize(raw) }, true);
                for (l, cl) in c.iter().enumerate() {
                    // SAFETY: 128b + 32l + 16h + 16 ≤ 128·nb ≤ x.len().
                    acc = mac(acc, *cl, unsafe { ld(x, 128 * b + 32 * l + 16 * h) });
                }
            }
        }
        acc32 = widen(acc32, acc);
        b0 = b1;
    }
    hsum(acc32)
}

/// I2_S: `out[ti] = Σ u·q` for `nt` tokens. One token reads the row directly; several
/// tokens decode [`CHUNK_BLOCKS`] blocks of codes at a time and reuse them for each token.
fn i2s(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    let k = p.k;
    if !k.is_multiple_of(128) || w_row.len() < k / 4 || p.x.len() < (t0 + nt) * k || out.len() < nt
    {
        return scalar::i2s(w_row, p, t0, nt, out);
    }
    if nt == 1 {
        out[0] = i2s_row(w_row, p.token(t0), false);
        return;
    }
    let nb = k / 128;
    let mut codes = [0u8; CHUNK_BLOCKS * 128];
    out[..nt].fill(0);
    let mut c0 = 0;
    while c0 < nb {
        let c1 = (c0 + CHUNK_BLOCKS).min(nb);
        for b in c0..c1 {
            for h in 0..2 {
                let c = planes(sanitize(load(w_row, 32 * b + 16 * h)), true);
                for (l, cl) in c.iter().enumerate() {
                    store(&mut codes, 128 * (b - c0) + 32 * l + 16 * h, *cl);
                }
            }
        }
        for (ti, o) in out[..nt].iter_mut().enumerate() {
            let x = &p.token(t0 + ti)[128 * c0..128 * c1];
            let mut acc32 = i32x4_splat(0);
            let mut f0 = 0;
            while f0 < c1 - c0 {
                let f1 = (f0 + FLUSH_BLOCKS).min(c1 - c0);
                let mut acc = i16x8_splat(0);
                for off in (128 * f0..128 * f1).step_by(16) {
                    // SAFETY: off + 16 ≤ 128·(c1 − c0) = x.len() ≤ codes.len().
                    acc = mac(acc, unsafe { ld(&codes, off) }, unsafe { ld(x, off) });
                }
                acc32 = widen(acc32, acc);
                f0 = f1;
            }
            *o = o.wrapping_add(hsum(acc32));
        }
        c0 = c1;
    }
}

/// Four consecutive I2_S rows (`w4`, K/4 bytes each) and token `t`, each activation vector
/// loaded once for the four rows. `clean`: the rows hold no code 11.
fn i2s_quad(w4: &[u8], p: &Prepared<'_>, t: usize, clean: bool) -> [i32; 4] {
    let k = p.k;
    let rb = k / 4;
    if !k.is_multiple_of(128) || w4.len() < 4 * rb || p.x.len() < (t + 1) * k {
        return scalar::i2s_quad(w4, p, t, clean);
    }
    let x = p.token(t);
    let nb = k / 128;
    let mut acc32 = [i32x4_splat(0); 4];
    let mut b0 = 0;
    while b0 < nb {
        let b1 = (b0 + FLUSH_BLOCKS).min(nb);
        let mut acc = [i16x8_splat(0); 4];
        for b in b0..b1 {
            for h in 0..2 {
                // SAFETY: b < nb = K/128: 128b + 32l + 16h + 16 ≤ K = x.len().
                let xs: [v128; 4] =
                    std::array::from_fn(|l| unsafe { ld(x, 128 * b + 32 * l + 16 * h) });
                for (r, a) in acc.iter_mut().enumerate() {
                    // SAFETY: r < 4, 32b + 16h + 16 ≤ K/4 = rb: in the 4·rb ≤ w4.len() checked above.
                    let raw = unsafe { ld(w4, r * rb + 32 * b + 16 * h) };
                    let c = planes(if clean { raw } else { sanitize(raw) }, true);
                    for l in 0..4 {
                        *a = mac(*a, c[l], xs[l]);
                    }
                }
            }
        }
        for r in 0..4 {
            acc32[r] = widen(acc32[r], acc[r]);
        }
        b0 = b1;
    }
    acc32.map(hsum)
}

/// TQ2_0: `out[ti·nb + b] = Σ c·q` per block of 256.
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
    for ti in 0..nt {
        let x = p.token(t0 + ti);
        for b in 0..nb {
            // 2 halves × 2 × 4 planes × 2 products a lane: 32 · 384 < 2^15.
            let mut acc = i16x8_splat(0);
            for g in 0..2 {
                for h in 0..2 {
                    let c = planes(load(w_row, b * tq2_0::BLOCK_BYTES + 32 * g + 16 * h), false);
                    for (l, cl) in c.iter().enumerate() {
                        acc = mac(acc, *cl, load(x, 256 * b + 128 * g + 32 * l + 16 * h));
                    }
                }
            }
            out[ti * nb + b] = hsum(i32x4_extadd_pairwise_i16x8(acc));
        }
    }
}

/// Eight F16 values (16 bytes) as two f32x4: the exponent and mantissa moved into place and
/// scaled by 2^112 (exact for normal and subnormal halves alike), infinities and NaNs
/// rebuilt, the sign put back; the same values as `half`'s conversion.
#[inline(always)]
fn f16x8_to_f32(h: v128) -> [v128; 2] {
    let conv = |v: v128| {
        let em = v128_and(v, u32x4_splat(0x7fff));
        let shifted = i32x4_shl(em, 13);
        let scaled = f32x4_mul(shifted, f32x4_splat(f32::from_bits(0x7780_0000))); // 2^112
        let inf_nan = v128_or(shifted, u32x4_splat(0x7f80_0000));
        let big = u32x4_ge(em, u32x4_splat(0x7c00));
        let mag = v128_bitselect(inf_nan, scaled, big);
        let sign = i32x4_shl(v128_and(v, u32x4_splat(0x8000)), 16);
        v128_or(mag, sign)
    };
    [
        conv(u32x4_extend_low_u16x8(h)),
        conv(u32x4_extend_high_u16x8(h)),
    ]
}

/// The ggml reduction of [`scalar::f16_dot_ggml`] from its 4 × 8 lane accumulators (two
/// f32x4 each), then the tail in f64.
#[inline(always)]
fn ggml_reduce(acc: &[[v128; 2]; 4], row: &[u8], x: &[f32], main: usize) -> f32 {
    let half = |h: usize| {
        f32x4_add(
            f32x4_add(acc[0][h], acc[2][h]),
            f32x4_add(acc[1][h], acc[3][h]),
        )
    };
    let t = f32x4_add(half(0), half(1));
    let t0 = f32x4_extract_lane::<0>(t);
    let t1 = f32x4_extract_lane::<1>(t);
    let t2 = f32x4_extract_lane::<2>(t);
    let t3 = f32x4_extract_lane::<3>(t);
    let mut sum = f64::from((t0 + t1) + (t2 + t3));
    for (i, &xi) in x.iter().enumerate().skip(main) {
        let w = half::f16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32();
        sum += f64::from(w * xi);
    }
    #[allow(clippy::cast_possible_truncation)] // f64 -> f32 rounding is the defined result
    let r = sum as f32;
    r
}

/// F16 row · x in the ggml order of [`scalar::f16_dot_ggml`] (4 accumulators × 8 lanes over
/// chunks of 32, the same reduction and tail), each product added to its lane after it is
/// rounded (WebAssembly has no fused multiply-add): fast numerics' F16 dot.
fn f16_dot_fast(row: &[u8], x: &[f32]) -> f32 {
    let k = x.len();
    if row.len() < 2 * k {
        return scalar::f16_dot_ggml(row, x);
    }
    let main = k - k % 32;
    let mut acc = [[f32x4_splat(0.0); 2]; 4];
    for c in (0..main).step_by(32) {
        for (j, aj) in acc.iter_mut().enumerate() {
            // SAFETY: c + 8j + 8 ≤ main ≤ K: 2(c + 8j) + 16 ≤ 2K ≤ row.len() (checked above).
            let w = f16x8_to_f32(unsafe { ld(row, 2 * (c + 8 * j)) });
            for (h, a) in aj.iter_mut().enumerate() {
                // SAFETY: c + 8j + 4h + 4 ≤ main ≤ K = x.len().
                let xv = unsafe { ld(x, c + 8 * j + 4 * h) };
                *a = f32x4_add(*a, f32x4_mul(w[h], xv));
            }
        }
    }
    ggml_reduce(&acc, row, x, main)
}

/// [`f16_dot_fast`] of each row (`row_bytes` apart in `rows`) with each token:
/// `out[r·n_tok + t]`; each row converted to f32 once for all tokens.
fn f16_dot_fast_multi(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    let n_tok = xs.len();
    let Some(k) = xs.first().map(|x| x.len()) else {
        return;
    };
    if row_bytes < 2 * k || xs.iter().any(|x| x.len() != k) {
        return scalar::f16_dot_ggml_multi(rows, row_bytes, xs, out);
    }
    let main = k - k % 32;
    let mut wf = vec![f32x4_splat(0.0); main / 4];
    for (row, o) in rows.chunks_exact(row_bytes).zip(out.chunks_mut(n_tok)) {
        for (i, pair) in wf.chunks_exact_mut(2).enumerate() {
            let [lo, hi] = f16x8_to_f32(load(row, 16 * i));
            pair[0] = lo;
            pair[1] = hi;
        }
        for (o, x) in o.iter_mut().zip(xs) {
            let mut acc = [[f32x4_splat(0.0); 2]; 4];
            for c in (0..main).step_by(32) {
                for (j, aj) in acc.iter_mut().enumerate() {
                    for (h, a) in aj.iter_mut().enumerate() {
                        let xv = load(x, c + 8 * j + 4 * h);
                        *a = f32x4_add(*a, f32x4_mul(wf[(c + 8 * j + 4 * h) / 4], xv));
                    }
                }
            }
            *o = ggml_reduce(&acc, row, x, main);
        }
    }
}
