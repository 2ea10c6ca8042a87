//! WebAssembly SIMD (`simd128`) kernels for I2_S and TQ2_0, and fast numerics' F16, Q8_0 and
//! Q4_0 head dots; the other entries are scalar.
//!
//! Compiled only for wasm32 with `-C target-feature=+simd128` (a module either validates
//! with SIMD or not at all, so there is nothing to detect at run time). The layouts are the
//! ones on disk, read as in the NEON tier: per 16 bytes of weights, plane l = 16 codes of
//! consecutive elements:
//! ```text
//! I2_S block b, bytes 32b + 16h + i (h = 0, 1): plane l (bits 7−2l..6−2l) ↔ x[128b + 32l + 16h + i]
//! TQ2_0 block b, half g, bytes 32g + 16h + i:  plane l (bits 2l..2l+1)    ↔ x[256b + 128g + 32l + 16h + i]
//! ```
//! Products of codes (0..=3) and int8 activations go through [`Acc`]. With `simd128` alone
//! they are `i16x8.extmul`s (|p| ≤ 3·128), summed in i16 lanes for at most [`FLUSH_BLOCKS`]
//! blocks (16 products a lane a block: at most 4·16·384 = 24,576 < 2^15) and then widened
//! pairwise into i32 lanes: never an i16 sum that can overflow. A module built with
//! `relaxed-simd` as well (the package's second module, for engines that have it) takes
//! `i32x4.relaxed_dot_i8x16_i7x16_add_s` instead: four products a lane straight into i32,
//! with the codes as its 7-bit operand, where its result is defined exactly (a pair of
//! products is at most 2·3·128 in size, so no engine's i16 step saturates). Integer sums
//! are exact, so every result equals the scalar kernel's either way.
//!
//! The head dots' float multiply-adds go through [`mul_add`]: fused where the module has
//! relaxed SIMD and the engine's `f32x4.relaxed_madd` rounds once ([`madd_fuses`]), which
//! makes them the scalar tier's dots bit for bit (and exact numerics' F16 dot runs on
//! them); elsewhere each product is rounded, then added. The attention's loops make the
//! same choice (`crate::attn`).

use std::arch::wasm32::*;
#[cfg(target_feature = "relaxed-simd")]
use std::sync::OnceLock;

use super::scalar;
use crate::layout::tq2_0;
use crate::tier::Prepared;
use crate::tier::{Isa, Kernels};

pub(crate) static TABLE: Kernels = Kernels {
    isa: Isa::Simd128,
    i2s,
    i2s_clean: i2s,
    i2s_rows: Some(crate::tier::I2sRows {
        kernel: i2s_several,
        rows: DECODE_ROWS,
    }),
    tq2,
    tq1: scalar::tq1,
    bitnet32: scalar::bitnet32,
    split32: scalar::split32,
    qk256: scalar::qk256,
    f16_dot_ggml: exact_f16_dot,
    f16_dot_tiny: scalar::f16_dot_tiny,
    q8_0_dot: scalar::q8_0_dot,
    q4_0_dot: scalar::q4_0_dot,
    bf16_dot: scalar::bf16_dot,
    f32_dot: scalar::f32_dot_lanes8,
    q8_0_q8,
    q4_0_q8,
    f16_dot_ggml_multi: exact_f16_dot_multi,
    f16_dot_fast: fast_f16_dot,
    f16_dot_fast_multi: fast_f16_dot_multi,
    f16_fast_rows: Some(fast_f16_rows),
    q8_0_q8_multi,
    q4_0_q8_multi,
    i2s_panel: None,
    panel_tokens: 0,
    i2s_lut: None,
    i2s_amx: None,
};

/// Exact numerics' F16 dot ([`scalar::f16_dot_ggml`]): [`f16_dot_fast`]'s fused form where
/// the engine fuses, which is that definition, else the scalar tier's.
fn exact_f16_dot(row: &[u8], x: &[f32]) -> f32 {
    if madd_fuses() {
        f16_dot_fast::<true>(row, x)
    } else {
        scalar::f16_dot_ggml(row, x)
    }
}

/// Exact numerics' F16 dots of several rows and tokens, as [`exact_f16_dot`].
fn exact_f16_dot_multi(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    if madd_fuses() {
        f16_dot_fast_multi::<true>(rows, row_bytes, xs, out);
    } else {
        scalar::f16_dot_ggml_multi(rows, row_bytes, xs, out);
    }
}

/// Fast numerics' F16 dot: [`f16_dot_fast`], fused where the engine fuses.
fn fast_f16_dot(row: &[u8], x: &[f32]) -> f32 {
    with_madd!(f16_dot_fast(row, x))
}

/// Fast numerics' F16 dots of several rows and tokens: [`f16_dot_fast_multi`].
fn fast_f16_dot_multi(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    with_madd!(f16_dot_fast_multi(rows, row_bytes, xs, out));
}

/// One token's fast F16 dots of consecutive rows: [`f16_fast_rows`].
fn fast_f16_rows(rows: &[u8], row_bytes: usize, x: &[f32], finite: bool, out: &mut [f32]) {
    with_madd!(f16_fast_rows(rows, row_bytes, x, finite, out));
}

/// Blocks of 128 elements summed in i16 lanes before widening (see the module docs).
const FLUSH_BLOCKS: usize = 4;

/// 16 bytes at `s[off..off + 16]`; panics when out of bounds.
#[inline(always)]
pub(crate) fn load<T: Copy>(s: &[T], off: usize) -> v128 {
    let bytes = &s[off..off + 16 / std::mem::size_of::<T>()];
    // SAFETY: `bytes` spans 16 bytes in bounds (checked by the slice above); v128_load
    // reads them without any alignment requirement.
    unsafe { v128_load(bytes.as_ptr().cast::<v128>()) }
}

/// The sixteen bytes of `v`, as i8 lanes.
#[inline(always)]
pub(crate) fn bytes(v: v128) -> [i8; 16] {
    let mut out = [0i8; 16];
    // SAFETY: `out` is 16 bytes; v128_store writes them without any alignment requirement.
    unsafe { v128_store(out.as_mut_ptr().cast::<v128>(), v) };
    out
}

/// `v` into `s[off..off + 4]`; panics when out of bounds.
#[cfg(target_feature = "relaxed-simd")]
#[inline(always)]
pub(crate) fn store(s: &mut [f32], off: usize, v: v128) {
    let out = &mut s[off..off + 4];
    // SAFETY: `out` spans 16 bytes in bounds (checked by the slice above); v128_store
    // writes them without any alignment requirement.
    unsafe { v128_store(out.as_mut_ptr().cast::<v128>(), v) }
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

/// Whether this engine's `f32x4.relaxed_madd` rounds once, as a fused multiply-add: relaxed
/// SIMD lets an engine round the product first or not, and this asks once, on `a·a + c`
/// with `a = 1 + 2^-12` and `c = −(1 + 2^-11)`, which is `2^-24` fused and `0` rounded in
/// two steps. Where it fuses, the float dots of the heads ([`f16_dot_fast`],
/// [`q8_0_q8`], …) and the attention's loops take it: they are then the scalar tier's
/// definitions (and every native tier's), bit for bit, and exact numerics' F16 dot runs on
/// them too. Elsewhere, and in a module without relaxed SIMD, they multiply and then add.
#[cfg(target_feature = "relaxed-simd")]
pub(crate) fn madd_fuses() -> bool {
    static FUSES: OnceLock<bool> = OnceLock::new();
    *FUSES.get_or_init(|| {
        let a = f32x4_splat(std::hint::black_box(f32::from_bits(0x3f80_0800)));
        let c = f32x4_splat(std::hint::black_box(f32::from_bits(0xbf80_1000)));
        let r = f32x4_relaxed_madd(a, a, c);
        f32x4_extract_lane::<0>(r).to_bits() == 0x3380_0000
    })
}

/// Whether this engine's `f32x4.relaxed_madd` rounds once: never without relaxed SIMD.
#[cfg(not(target_feature = "relaxed-simd"))]
pub(crate) fn madd_fuses() -> bool {
    false
}

/// `f(args)` with `FUSED` = [`madd_fuses`]: `f::<true>` where the engine fuses relaxed
/// SIMD's multiply-add, `f::<false>` elsewhere.
macro_rules! with_madd {
    ($f:ident($($arg:expr),*)) => {
        if madd_fuses() {
            $f::<true>($($arg),*)
        } else {
            $f::<false>($($arg),*)
        }
    };
}
use with_madd;

/// `acc + a·b` per lane: one rounding with `FUSED` (only ever set where [`madd_fuses`]),
/// else the product rounded, then the sum.
#[inline(always)]
fn mul_add<const FUSED: bool>(a: v128, b: v128, acc: v128) -> v128 {
    #[cfg(target_feature = "relaxed-simd")]
    if FUSED {
        return f32x4_relaxed_madd(a, b, acc);
    }
    f32x4_add(acc, f32x4_mul(a, b))
}

/// I2_S code 11 → 01 in every pair (u = 0, 1, 2, 1 for c = 0..3).
#[inline(always)]
fn sanitize(w: v128) -> v128 {
    // 16-bit shifts (see `planes`): the 0x55 mask drops the bit that crosses from the next
    // byte, and `both` has no bit 7 to carry into it.
    let both = v128_and(v128_and(w, u16x8_shr(w, 1)), u8x16_splat(0x55));
    v128_xor(w, i16x8_shl(both, 1))
}

/// The four planes of 16 weight bytes in x order: I2_S (msb first) or TQ2_0 (lsb first).
/// The shifts are 16-bit (one instruction on every SIMD ISA; an 8-bit shift is emulated on
/// x86): the mask keeps each byte's own two bits, dropping what crossed from its neighbour.
#[inline(always)]
fn planes(w: v128, msb_first: bool) -> [v128; 4] {
    let m3 = u8x16_splat(3);
    let a = v128_and(w, m3);
    let b = v128_and(u16x8_shr(w, 2), m3);
    let c = v128_and(u16x8_shr(w, 4), m3);
    let d = v128_and(u16x8_shr(w, 6), m3);
    if msb_first {
        [d, c, b, a]
    } else {
        [a, b, c, d]
    }
}

/// A running `Σ c·x` of code and activation vectors (see the module docs): `mac` adds 16
/// products, `flush` must come at least every [`FLUSH_BLOCKS`] blocks, `sum` ends it.
#[derive(Clone, Copy)]
struct Acc {
    /// i16 lanes not yet widened (unused with relaxed-simd).
    #[cfg_attr(target_feature = "relaxed-simd", allow(dead_code))]
    short: v128,
    /// i32 lanes.
    wide: v128,
}

impl Acc {
    #[inline(always)]
    fn new() -> Acc {
        Acc {
            short: i16x8_splat(0),
            wide: i32x4_splat(0),
        }
    }

    /// Add the 16 products `c·x` (codes ≤ 3 are valid i8 and i7 values).
    #[inline(always)]
    fn mac(&mut self, c: v128, x: v128) {
        #[cfg(target_feature = "relaxed-simd")]
        {
            self.wide = i32x4_relaxed_dot_i8x16_i7x16_add(x, c, self.wide);
        }
        #[cfg(not(target_feature = "relaxed-simd"))]
        {
            let p = i16x8_add(i16x8_extmul_low_i8x16(c, x), i16x8_extmul_high_i8x16(c, x));
            self.short = i16x8_add(self.short, p);
        }
    }

    /// Widen the i16 lanes into the i32 ones.
    #[inline(always)]
    fn flush(&mut self) {
        #[cfg(not(target_feature = "relaxed-simd"))]
        {
            self.wide = i32x4_add(self.wide, i32x4_extadd_pairwise_i16x8(self.short));
            self.short = i16x8_splat(0);
        }
    }

    #[inline(always)]
    fn sum(mut self) -> i32 {
        self.flush();
        hsum(self.wide)
    }
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
    let mut acc = Acc::new();
    let mut b0 = 0;
    while b0 < nb {
        let b1 = (b0 + FLUSH_BLOCKS).min(nb);
        for b in b0..b1 {
            for h in 0..2 {
                // SAFETY: b < nb: 32b + 16h + 16 ≤ 32·nb ≤ w.len() (asserted above).
                let raw = unsafe { ld(w, 32 * b + 16 * h) };
                let c = planes(if clean { raw } else { sanitize(raw) }, true);
                for (l, cl) in c.iter().enumerate() {
                    // SAFETY: 128b + 32l + 16h + 16 ≤ 128·nb ≤ x.len().
                    acc.mac(*cl, unsafe { ld(x, 128 * b + 32 * l + 16 * h) });
                }
            }
        }
        acc.flush();
        b0 = b1;
    }
    acc.sum()
}

/// I2_S: `out[ti] = Σ u·q` for `nt` tokens, in groups of up to four that share each decoded
/// code vector.
fn i2s(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    let k = p.k;
    if !k.is_multiple_of(128) || w_row.len() < k / 4 || p.x.len() < (t0 + nt) * k || out.len() < nt
    {
        return scalar::i2s(w_row, p, t0, nt, out);
    }
    let mut t = 0;
    while t < nt {
        let x = |i: usize| p.token(t0 + t + i);
        match nt - t {
            1 => {
                out[t] = i2s_row(w_row, x(0), false);
                t += 1;
            }
            2 => {
                out[t..t + 2].copy_from_slice(&i2s_tokens(w_row, [x(0), x(1)]));
                t += 2;
            }
            3 => {
                out[t..t + 3].copy_from_slice(&i2s_tokens(w_row, [x(0), x(1), x(2)]));
                t += 3;
            }
            _ => {
                out[t..t + 4].copy_from_slice(&i2s_tokens(w_row, [x(0), x(1), x(2), x(3)]));
                t += 4;
            }
        }
    }
}

/// `Σ u·q` of one I2_S row with each of `N` tokens: each 16 weight bytes are loaded and
/// decoded once for all of them. With relaxed SIMD the running sums are plain vectors, two
/// a token ([`SUM_CHAINS`]: planes 0 and 2 into one, 1 and 3 into the other), which the
/// compiler keeps in locals (as `Acc` values it kept them in memory, and stored each sum
/// after every dot product); integer sums, so their order does not change the result.
#[cfg(target_feature = "relaxed-simd")]
#[inline(always)]
fn i2s_tokens<const N: usize>(w: &[u8], xs: [&[i8]; N]) -> [i32; N] {
    let k = xs[0].len();
    let nb = k / 128;
    assert!(w.len() >= 32 * nb && xs.iter().all(|x| x.len() == k));
    let mut acc = [[i32x4_splat(0); SUM_CHAINS]; N];
    for b in 0..nb {
        for h in 0..2 {
            // SAFETY: b < nb: 32b + 16h + 16 ≤ 32·nb ≤ w.len() (asserted above).
            let c = planes(sanitize(unsafe { ld(w, 32 * b + 16 * h) }), true);
            for (a, x) in acc.iter_mut().zip(&xs) {
                for (l, cl) in c.iter().enumerate() {
                    // SAFETY: 128b + 32l + 16h + 16 ≤ 128·nb = x.len() (asserted above).
                    let xl = unsafe { ld(x, 128 * b + 32 * l + 16 * h) };
                    a[chain(l)] = i32x4_relaxed_dot_i8x16_i7x16_add(xl, *cl, a[chain(l)]);
                }
            }
        }
    }
    acc.map(|a| a.into_iter().fold(0i32, |s, v| s.wrapping_add(hsum(v))))
}

/// `Σ u·q` of one I2_S row with each of `N` tokens: each 16 weight bytes are loaded and
/// decoded once for all of them.
#[cfg(not(target_feature = "relaxed-simd"))]
#[inline(always)]
fn i2s_tokens<const N: usize>(w: &[u8], xs: [&[i8]; N]) -> [i32; N] {
    let k = xs[0].len();
    let nb = k / 128;
    assert!(w.len() >= 32 * nb && xs.iter().all(|x| x.len() == k));
    // SUM_CHAINS running sums a token, plane l into sum `chain(l)`.
    let mut acc = [[Acc::new(); SUM_CHAINS]; N];
    let mut b0 = 0;
    while b0 < nb {
        let b1 = (b0 + FLUSH_BLOCKS).min(nb);
        for b in b0..b1 {
            for h in 0..2 {
                // SAFETY: b < nb: 32b + 16h + 16 ≤ 32·nb ≤ w.len() (asserted above).
                let c = planes(sanitize(unsafe { ld(w, 32 * b + 16 * h) }), true);
                for (a, x) in acc.iter_mut().zip(&xs) {
                    for (l, cl) in c.iter().enumerate() {
                        // SAFETY: 128b + 32l + 16h + 16 ≤ 128·nb = x.len() (asserted above).
                        a[chain(l)].mac(*cl, unsafe { ld(x, 128 * b + 32 * l + 16 * h) });
                    }
                }
            }
        }
        for a in acc.iter_mut().flatten() {
            a.flush();
        }
        b0 = b1;
    }
    acc.map(chains_sum)
}

/// Rows a call of the decode kernel ([`i2s_several`]). With relaxed SIMD each row keeps one
/// running sum of dot products, so eight rows make eight independent chains and share each
/// activation load eight ways: in Chromium on AMD Zen 5, eight rows a call read the weights
/// about 20 % faster than four rows with two sums each. Without relaxed SIMD the sums are i16
/// adds with a widening flush, and four rows keep them in registers.
const DECODE_ROWS: usize = if cfg!(target_feature = "relaxed-simd") {
    8
} else {
    4
};

/// [`DECODE_ROWS`] consecutive I2_S rows (`w`, K/4 bytes each) and token `t`, each activation
/// vector loaded once for all of them: `out[r]` = `Σ u·q` of row `r`. `clean`: the rows hold
/// no code 11.
fn i2s_several(w: &[u8], p: &Prepared<'_>, t: usize, clean: bool, out: &mut [i32]) {
    let k = p.k;
    let rb = k / 4;
    if out.len() != DECODE_ROWS
        || !k.is_multiple_of(128)
        || w.len() < DECODE_ROWS * rb
        || p.x.len() < (t + 1) * k
    {
        return scalar::i2s_rows(w, p, t, clean, out);
    }
    let x = p.token(t);
    let nb = k / 128;
    let mut acc = [Acc::new(); DECODE_ROWS];
    let mut b0 = 0;
    while b0 < nb {
        let b1 = (b0 + FLUSH_BLOCKS).min(nb);
        for b in b0..b1 {
            for h in 0..2 {
                // SAFETY: b < nb = K/128: 128b + 32l + 16h + 16 ≤ K = x.len().
                let xs: [v128; 4] =
                    std::array::from_fn(|l| unsafe { ld(x, 128 * b + 32 * l + 16 * h) });
                for (r, a) in acc.iter_mut().enumerate() {
                    // SAFETY: r < DECODE_ROWS, 32b + 16h + 16 ≤ K/4 = rb: in the
                    // DECODE_ROWS·rb ≤ w.len() checked above.
                    let raw = unsafe { ld(w, r * rb + 32 * b + 16 * h) };
                    let c = planes(if clean { raw } else { sanitize(raw) }, true);
                    for l in 0..4 {
                        a.mac(c[l], xs[l]);
                    }
                }
            }
        }
        for a in acc.iter_mut() {
            a.flush();
        }
        b0 = b1;
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a.sum();
    }
}

/// Running sums a token in [`i2s_tokens`], a block in [`tq2`]. With relaxed SIMD each
/// `mac` is one dot product that adds into its sum (`vpdpbusd` where the CPU has AVX-VNNI),
/// so one sum makes one chain of dependent dot products; with two, Chromium on AMD Zen 5
/// reads 2B-4T prompts about 34 % faster. Without relaxed SIMD the sums are i16 adds, and a
/// second one only costs registers. (The decode kernel, [`i2s_several`], gets its chains
/// from its rows instead.)
const SUM_CHAINS: usize = if cfg!(target_feature = "relaxed-simd") {
    2
} else {
    1
};

/// The running sum that plane `l` adds into ([`SUM_CHAINS`]).
#[inline(always)]
#[allow(clippy::modulo_one)] // SUM_CHAINS is 1 without relaxed SIMD: every plane into one
const fn chain(l: usize) -> usize {
    l % SUM_CHAINS
}

/// The total of a row's (or token's, or block's) running sums.
#[inline(always)]
fn chains_sum(a: [Acc; SUM_CHAINS]) -> i32 {
    a.into_iter().fold(0i32, |s, a| s.wrapping_add(a.sum()))
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
            // 2 halves × 2 × 4 planes × 2 products a lane: 32 · 384 < 2^15 before `sum`.
            let mut acc = [Acc::new(); SUM_CHAINS];
            for g in 0..2 {
                for h in 0..2 {
                    let c = planes(load(w_row, b * tq2_0::BLOCK_BYTES + 32 * g + 16 * h), false);
                    for (l, cl) in c.iter().enumerate() {
                        acc[chain(l)].mac(*cl, load(x, 256 * b + 128 * g + 32 * l + 16 * h));
                    }
                }
            }
            out[ti * nb + b] = chains_sum(acc);
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

/// Sixteen halves widened to f32 (the attention's cache rows): [`f16x8_to_f32`] twice.
#[inline(always)]
pub(crate) fn f16x16_to_f32(h: &[half::f16; 16]) -> [f32; 16] {
    let [a, b] = f16x8_to_f32(load(h, 0));
    let [c, d] = f16x8_to_f32(load(h, 8));
    let mut out = [0f32; 16];
    for (i, v) in [a, b, c, d].into_iter().enumerate() {
        // SAFETY: `out[4i..4i + 4]` is in bounds (i < 4); v128_store needs no alignment.
        unsafe { v128_store(out.as_mut_ptr().add(4 * i).cast::<v128>(), v) };
    }
    out
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

/// Eight F16 values (16 bytes) as two f32x4 holding each value times 2^-112: the half in
/// the upper 16 bits of a lane (an interleave with zeros), shifted right by 3 with its sign
/// and masked, puts its exponent and mantissa where an f32's go, with the f32 exponent 112
/// below the half's; subnormal halves and zeros come out as the f32 subnormals and zeros of
/// the same scale. Exact for every finite half; an infinity or NaN (exponent field 31)
/// becomes a finite value, so callers check for those ([`non_finite_halves`]).
#[inline(always)]
fn f16x8_scaled(h: v128) -> [v128; 2] {
    let zero = u16x8_splat(0);
    let mask = u32x4_splat(0x8fff_e000);
    let lo = i16x8_shuffle::<0, 8, 1, 9, 2, 10, 3, 11>(zero, h);
    let hi = i16x8_shuffle::<4, 12, 5, 13, 6, 14, 7, 15>(zero, h);
    [
        v128_and(i32x4_shr(lo, 3), mask),
        v128_and(i32x4_shr(hi, 3), mask),
    ]
}

/// [`f16x8_scaled`]'s values in another order: the even halves, then the odd ones
/// (`[h0, h2, h4, h6]`, `[h1, h3, h5, h7]`). Each 32-bit lane of `h` holds a pair of halves,
/// the odd one in its upper 16 bits, where the shift and mask want it: two operations per
/// four halves instead of three (no interleave with zeros).
#[inline(always)]
fn f16x8_scaled_split(h: v128) -> [v128; 2] {
    let mask = u32x4_splat(0x8fff_e000);
    [
        v128_and(i32x4_shr(i32x4_shl(h, 16), 3), mask),
        v128_and(i32x4_shr(h, 3), mask),
    ]
}

/// `big` updated with the eight halves of `h`: lane-wise max of `|h|`'s bits, which is
/// 0x7c00 or more exactly where a half is an infinity or a NaN ([`non_finite_halves`]).
#[inline(always)]
fn track_magnitude(big: v128, h: v128) -> v128 {
    u16x8_max(big, v128_and(h, u16x8_splat(0x7fff)))
}

/// Whether the halves tracked in `big` held an infinity or a NaN.
#[inline(always)]
fn non_finite_halves(big: v128) -> bool {
    v128_any_true(u16x8_ge(big, u16x8_splat(0x7c00)))
}

/// 2^112: [`f16x8_scaled`]'s values times `x · 2^112` are the halves' values times `x`,
/// the same real products, so each rounds to the same f32.
const TWO_112: f32 = f32::from_bits(0x7780_0000);

/// The ggml-order lane sums (4 accumulators × 8 lanes over chunks of 32) of the first
/// `main` values (a multiple of 32) of an F16 row and `x`: each chunk of eight halves made
/// into two f32x4 by `conv`, each f32x4 of `x` by `xv`, each product added by [`mul_add`].
#[inline(always)]
fn ggml_lanes<const FUSED: bool>(
    row: &[u8],
    x: &[f32],
    main: usize,
    mut conv: impl FnMut(v128) -> [v128; 2],
    xv: impl Fn(v128) -> v128,
) -> [[v128; 2]; 4] {
    assert!(main.is_multiple_of(32) && main <= x.len() && 2 * main <= row.len());
    let mut acc = [[f32x4_splat(0.0); 2]; 4];
    for c in (0..main).step_by(32) {
        for (j, aj) in acc.iter_mut().enumerate() {
            // SAFETY: c + 8j + 8 ≤ main: 2(c + 8j) + 16 ≤ 2·main ≤ row.len() (asserted above).
            let w = conv(unsafe { ld(row, 2 * (c + 8 * j)) });
            for (h, a) in aj.iter_mut().enumerate() {
                // SAFETY: c + 8j + 4h + 4 ≤ main ≤ x.len() (asserted above).
                let xh = xv(unsafe { ld(x, c + 8 * j + 4 * h) });
                *a = mul_add::<FUSED>(w[h], xh, *a);
            }
        }
    }
    acc
}

/// F16 row · x in the ggml order of [`scalar::f16_dot_ggml`] (4 accumulators × 8 lanes over
/// chunks of 32, the same reduction and tail), each product added to its lane by
/// [`mul_add`]: fast numerics' F16 dot, and with `FUSED` [`scalar::f16_dot_ggml`] itself.
///
/// Each product is taken as `(w · 2^-112) · (x · 2^112)` ([`f16x8_scaled`]: three operations
/// per four halves instead of a full conversion): the same real product, so the same f32,
/// unless `x · 2^112` overflows (|x| ≥ 2^16), which makes the sum infinite or NaN; that, or
/// an infinite or NaN weight, sends the row through [`f16_dot_converted`], which converts
/// every half to its f32 value. Either way the result is [`f16_dot_converted`]'s, bit for bit.
fn f16_dot_fast<const FUSED: bool>(row: &[u8], x: &[f32]) -> f32 {
    let k = x.len();
    if row.len() < 2 * k {
        return scalar::f16_dot_ggml(row, x);
    }
    let main = k - k % 32;
    let up = f32x4_splat(TWO_112);
    let mut big = u16x8_splat(0);
    let conv = |h| {
        big = track_magnitude(big, h);
        f16x8_scaled(h)
    };
    let acc = ggml_lanes::<FUSED>(row, x, main, conv, |v| f32x4_mul(v, up));
    let r = ggml_reduce(&acc, row, x, main);
    if r.is_finite() && !non_finite_halves(big) {
        return r;
    }
    f16_dot_converted::<FUSED>(row, x)
}

/// [`f16_dot_fast`] with every half converted to its f32 value ([`f16x8_to_f32`]) before
/// its product: the definition the fast form keeps, and its path for the rows and inputs
/// the fast form cannot take.
fn f16_dot_converted<const FUSED: bool>(row: &[u8], x: &[f32]) -> f32 {
    let k = x.len();
    if row.len() < 2 * k {
        return scalar::f16_dot_ggml(row, x);
    }
    let main = k - k % 32;
    let acc = ggml_lanes::<FUSED>(row, x, main, f16x8_to_f32, |v| v);
    ggml_reduce(&acc, row, x, main)
}

/// One token's [`f16_dot_fast`] of consecutive rows (`row_bytes` apart in `rows`, one per
/// `out` value), bit for bit. The token is scaled by 2^112 once per call, and each eight of
/// its values put in the order of [`f16x8_scaled_split`], whose lane sums go back into
/// ggml's lanes before the reduction. `finite`: the caller knows that no half of these rows
/// is infinite or NaN, so the rows skip the check of their halves ([`track_magnitude`]); a
/// result that is not finite (an activation of 2^16 or more) still goes through
/// [`f16_dot_converted`].
fn f16_fast_rows<const FUSED: bool>(
    rows: &[u8],
    row_bytes: usize,
    x: &[f32],
    finite: bool,
    out: &mut [f32],
) {
    let k = x.len();
    if row_bytes < 2 * k {
        for (row, o) in rows.chunks(row_bytes.max(1)).zip(out.iter_mut()) {
            *o = f16_dot_fast::<FUSED>(row, x);
        }
        return;
    }
    let main = k - k % 32;
    let xs: Vec<f32> = x[..main]
        .chunks_exact(8)
        .flat_map(|c| [c[0], c[2], c[4], c[6], c[1], c[3], c[5], c[7]])
        .map(|v| v * TWO_112)
        .collect();
    for (row, o) in rows.chunks_exact(row_bytes).zip(out.iter_mut()) {
        *o = if finite {
            f16_split_row::<FUSED, false>(row, x, &xs, main)
        } else {
            f16_split_row::<FUSED, true>(row, x, &xs, main)
        };
    }
}

/// One row of [`f16_fast_rows`]: `xs` is the token's first `main` values scaled and in
/// split order; `CHECK`: track the row's halves for infinities and NaNs.
#[inline(always)]
fn f16_split_row<const FUSED: bool, const CHECK: bool>(
    row: &[u8],
    x: &[f32],
    xs: &[f32],
    main: usize,
) -> f32 {
    let mut big = u16x8_splat(0);
    let conv = |h| {
        if CHECK {
            big = track_magnitude(big, h);
        }
        f16x8_scaled_split(h)
    };
    let split = ggml_lanes::<FUSED>(row, xs, main, conv, |v| v);
    // Lane l of `e` summed element 8j + 2l of each chunk, lane l of `o` element 8j + 2l + 1.
    let acc = split.map(|[e, o]| {
        [
            i32x4_shuffle::<0, 4, 1, 5>(e, o),
            i32x4_shuffle::<2, 6, 3, 7>(e, o),
        ]
    });
    let r = ggml_reduce(&acc, row, x, main);
    if r.is_finite() && !(CHECK && non_finite_halves(big)) {
        r
    } else {
        f16_dot_converted::<FUSED>(row, x)
    }
}

/// [`f16_dot_fast`] of each row (`row_bytes` apart in `rows`) with each token:
/// `out[r·n_tok + t]`. Each row is converted once for all tokens (scaled by 2^-112, as in
/// [`f16_dot_fast`]) and the tokens once per call (scaled by 2^112); a row with an infinite
/// or NaN half, or a result that is not finite, is computed by [`f16_dot_converted`].
fn f16_dot_fast_multi<const FUSED: bool>(
    rows: &[u8],
    row_bytes: usize,
    xs: &[&[f32]],
    out: &mut [f32],
) {
    let n_tok = xs.len();
    let Some(k) = xs.first().map(|x| x.len()) else {
        return;
    };
    if row_bytes < 2 * k || xs.iter().any(|x| x.len() != k) {
        return scalar::f16_dot_ggml_multi(rows, row_bytes, xs, out);
    }
    let main = k - k % 32;
    let up = f32x4_splat(TWO_112);
    let xup: Vec<Vec<v128>> = xs
        .iter()
        .map(|x| {
            (0..main)
                .step_by(4)
                .map(|i| f32x4_mul(load(x, i), up))
                .collect()
        })
        .collect();
    let mut wf = vec![f32x4_splat(0.0); main / 4];
    for (row, o) in rows.chunks_exact(row_bytes).zip(out.chunks_mut(n_tok)) {
        let mut big = u16x8_splat(0);
        for (i, pair) in wf.chunks_exact_mut(2).enumerate() {
            let h = load(row, 16 * i);
            big = track_magnitude(big, h);
            let [lo, hi] = f16x8_scaled(h);
            pair[0] = lo;
            pair[1] = hi;
        }
        let finite_row = !non_finite_halves(big);
        for ((o, x), xu) in o.iter_mut().zip(xs).zip(&xup) {
            let mut acc = [[f32x4_splat(0.0); 2]; 4];
            for c in (0..main / 4).step_by(8) {
                for (j, aj) in acc.iter_mut().enumerate() {
                    for (h, a) in aj.iter_mut().enumerate() {
                        let i = c + 2 * j + h;
                        *a = mul_add::<FUSED>(wf[i], xu[i], *a);
                    }
                }
            }
            let r = ggml_reduce(&acc, row, x, main);
            *o = if finite_row && r.is_finite() {
                r
            } else {
                f16_dot_converted::<FUSED>(row, x)
            };
        }
    }
}

/// Lanes `[Σ e0..3, Σ e4..7, Σ e8..11, Σ e12..15]` of the 16 products `w·x` (i8 each), exact.
#[inline(always)]
fn sums4(w: v128, x: v128) -> v128 {
    let lo = i32x4_dot_i16x8(i16x8_extend_low_i8x16(w), i16x8_extend_low_i8x16(x));
    let hi = i32x4_dot_i16x8(i16x8_extend_high_i8x16(w), i16x8_extend_high_i8x16(x));
    i32x4_add(
        i32x4_shuffle::<0, 2, 4, 6>(lo, hi),
        i32x4_shuffle::<1, 3, 5, 7>(lo, hi),
    )
}

/// The order of [`scalar::q8_0_q8`]: per block, lane l of 8 = the exact sum of elements
/// 4l..4l+4, then `acc[l] += d_w·d_x · lane` by [`mul_add`] (fast numerics only),
/// then the tinyBLAS reduction. `w(blk)` gives a block's 32 weights as two i8x16.
#[inline(always)]
fn q8_blocks<const FUSED: bool>(
    row: &[u8],
    wbytes: usize,
    xq: &[i8],
    xd: &[f32],
    w: impl Fn(&[u8]) -> [v128; 2],
) -> f32 {
    let nb = (row.len() / wbytes).min(xq.len() / 32).min(xd.len());
    let mut acc = [f32x4_splat(0.0); 2];
    for b in 0..nb {
        let blk = &row[wbytes * b..wbytes * (b + 1)];
        let d = f32x4_splat(crate::layout::read_f16(blk, 0) * xd[b]);
        let [w0, w1] = w(blk);
        let l0 = sums4(w0, load(xq, 32 * b));
        let l1 = sums4(w1, load(xq, 32 * b + 16));
        // |lane| ≤ 4·128·127: exact in f32.
        acc[0] = mul_add::<FUSED>(d, f32x4_convert_i32x4(l0), acc[0]);
        acc[1] = mul_add::<FUSED>(d, f32x4_convert_i32x4(l1), acc[1]);
    }
    let lanes = |v: v128| {
        [
            f32x4_extract_lane::<0>(v),
            f32x4_extract_lane::<1>(v),
            f32x4_extract_lane::<2>(v),
            f32x4_extract_lane::<3>(v),
        ]
    };
    let [a0, a1, a2, a3] = lanes(acc[0]);
    let [a4, a5, a6, a7] = lanes(acc[1]);
    scalar::reduce8_tiny(&[a0, a1, a2, a3, a4, a5, a6, a7])
}

/// Q8_0 row · activations quantized per 32 (fast numerics' integer head dot).
fn q8_0_q8(row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let w = |blk: &[u8]| [load(blk, 2), load(blk, 18)];
    with_madd!(q8_blocks(row, 34, xq, xd, w))
}

/// Q4_0 row (`nibble − 8`: elements 0..16 the low nibbles, 16..32 the high) · activations
/// quantized per 32.
fn q4_0_q8(row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let w = |blk: &[u8]| {
        let q = load(blk, 2);
        let eight = i8x16_splat(8);
        [
            i8x16_sub(v128_and(q, u8x16_splat(15)), eight),
            i8x16_sub(v128_and(u16x8_shr(q, 4), u8x16_splat(15)), eight),
        ]
    };
    with_madd!(q8_blocks(row, 18, xq, xd, w))
}

/// [`q8_0_q8`] for each token: `out[t]` with codes `xq[t·cols..]` and scales `xd[t·cols/32..]`.
fn q8_0_q8_multi(row: &[u8], xq: &[i8], xd: &[f32], cols: usize, out: &mut [f32]) {
    scalar::per_token(q8_0_q8, row, xq, xd, cols, out);
}

/// [`q4_0_q8`] for each token.
fn q4_0_q8_multi(row: &[u8], xq: &[i8], xd: &[f32], cols: usize, out: &mut [f32]) {
    scalar::per_token(q4_0_q8, row, xq, xd, cols, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every one of the 65,536 halves, eight at a time in every lane position, beside an
    /// infinity and not: the value `half` gives (NaNs as NaNs).
    #[test]
    fn every_half_converts_exactly() {
        let check = |hs: [u16; 8]| {
            let mut bytes = [0u8; 16];
            for (i, h) in hs.iter().enumerate() {
                bytes[2 * i..2 * i + 2].copy_from_slice(&h.to_le_bytes());
            }
            let [lo, hi] = f16x8_to_f32(load(&bytes, 0));
            let mut got = [0f32; 8];
            got[..4].copy_from_slice(&[
                f32x4_extract_lane::<0>(lo),
                f32x4_extract_lane::<1>(lo),
                f32x4_extract_lane::<2>(lo),
                f32x4_extract_lane::<3>(lo),
            ]);
            got[4..].copy_from_slice(&[
                f32x4_extract_lane::<0>(hi),
                f32x4_extract_lane::<1>(hi),
                f32x4_extract_lane::<2>(hi),
                f32x4_extract_lane::<3>(hi),
            ]);
            for (h, g) in hs.iter().zip(got) {
                let want = half::f16::from_bits(*h).to_f32();
                if want.is_nan() {
                    assert!(g.is_nan(), "{h:#06x}: {g}");
                } else {
                    assert_eq!(g.to_bits(), want.to_bits(), "{h:#06x}: {g} against {want}");
                }
            }
        };
        for base in (0..=u16::MAX).step_by(8) {
            let hs: [u16; 8] =
                std::array::from_fn(|i| base.wrapping_add(u16::try_from(i).unwrap_or(0)));
            check(hs);
            // The same halves beside an infinity, and rotated so each lies in every lane.
            let mut with_inf = hs;
            with_inf[usize::from(base / 8 % 8)] = 0x7c00;
            check(with_inf);
            let mut rot = hs;
            rot.rotate_left(usize::from(base / 8 % 8));
            check(rot);
        }
    }

    /// Every finite half, in every lane: [`f16x8_scaled`] gives its value times 2^-112
    /// exactly (subnormal halves and both zeros included), and `track_magnitude` flags
    /// exactly the infinities and NaNs.
    #[test]
    fn every_finite_half_scales_exactly() {
        for base in (0..=u16::MAX).step_by(8) {
            for rot in 0..8 {
                let mut hs: [u16; 8] =
                    std::array::from_fn(|i| base.wrapping_add(u16::try_from(i).unwrap_or(0)));
                hs.rotate_left(rot);
                let mut bytes = [0u8; 16];
                for (i, h) in hs.iter().enumerate() {
                    bytes[2 * i..2 * i + 2].copy_from_slice(&h.to_le_bytes());
                }
                let v = load(&bytes, 0);
                let lanes = |v: v128| {
                    [
                        f32x4_extract_lane::<0>(v),
                        f32x4_extract_lane::<1>(v),
                        f32x4_extract_lane::<2>(v),
                        f32x4_extract_lane::<3>(v),
                    ]
                };
                let [lo, hi] = f16x8_scaled(v).map(lanes);
                let got: [f32; 8] = std::array::from_fn(|i| [lo, hi][i / 4][i % 4]);
                // The split order: evens, then odds, the same values.
                let [ev, od] = f16x8_scaled_split(v).map(lanes);
                let split: [f32; 8] = std::array::from_fn(|i| [ev, od][i % 2][i / 2]);
                for (i, (a, b)) in got.iter().zip(split).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{hs:04x?} half {i}");
                }
                let flagged = non_finite_halves(track_magnitude(u16x8_splat(0), v));
                let any_non_finite = hs.iter().any(|&h| h & 0x7c00 == 0x7c00);
                assert_eq!(flagged, any_non_finite, "{hs:04x?}");
                for (&h, g) in hs.iter().zip(got) {
                    let w = half::f16::from_bits(h).to_f32();
                    if !w.is_finite() {
                        continue;
                    }
                    // w · 2^-112 is an f32 (normal or subnormal): the f64 product is exact.
                    #[allow(clippy::cast_possible_truncation)] // exact, see above
                    let want = (f64::from(w) * (-112f64).exp2()) as f32;
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "{h:#06x}: {g:e} against {want:e}"
                    );
                }
            }
        }
    }

    /// [`f16_dot_fast`], [`f16_dot_fast_multi`] and [`f16_fast_rows`] against
    /// [`f16_dot_converted`], bit for bit: ragged lengths, weights of every exponent
    /// (subnormal halves and zeros among them), activations from 2^-40 to 2^16 and, in some
    /// cases, one past 2^16 (where `x · 2^112` overflows), an infinity or a NaN; infinite and
    /// NaN weights in others. Both forms, products rounded before their sums and (where the
    /// engine fuses [`mul_add`]) not.
    #[test]
    fn scaled_f16_dots_equal_converted() {
        scaled_dots_equal_converted::<false>();
        if madd_fuses() {
            scaled_dots_equal_converted::<true>();
        } else {
            eprintln!("scaled_f16_dots_equal_converted: no fused multiply-add in this module or engine; the rounded form only");
        }
    }

    fn scaled_dots_equal_converted<const FUSED: bool>() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut below = |n: u64| usize::try_from(next() % n).unwrap_or(0);
        for case in 0..400usize {
            let k = 1 + below(300);
            let rows = 1 + below(4);
            let n_tok = 1 + below(3);
            let mut data = vec![0u8; rows * 2 * k];
            for pair in data.chunks_exact_mut(2) {
                let sign = u16::try_from(below(2)).unwrap_or(0) << 15;
                // Exponent fields 0..=30: every finite scale, subnormals (0) included.
                let exp = u16::try_from(below(31)).unwrap_or(0) << 10;
                let man = u16::try_from(below(1024)).unwrap_or(0);
                pair.copy_from_slice(&(sign | exp | man).to_le_bytes());
            }
            if case % 7 == 0 {
                let at = 2 * below(u64::try_from(rows * k).unwrap_or(1));
                let h: u16 = if case % 14 == 0 { 0xfc00 } else { 0x7e01 };
                data[at..at + 2].copy_from_slice(&h.to_le_bytes());
            }
            let mut xs: Vec<Vec<f32>> = (0..n_tok)
                .map(|_| {
                    (0..k)
                        .map(|_| {
                            let e = i32::try_from(below(56)).unwrap_or(0) - 40;
                            let m = f32::from(u16::try_from(below(65_536)).unwrap_or(0));
                            let v = (1.0 + m / 65_536.0) * 2f32.powi(e);
                            if below(2) == 0 {
                                v
                            } else {
                                -v
                            }
                        })
                        .collect()
                })
                .collect();
            if case % 5 == 0 {
                let (t, i) = (
                    below(u64::try_from(n_tok).unwrap_or(1)),
                    below(u64::try_from(k).unwrap_or(1)),
                );
                xs[t][i] = [f32::INFINITY, f32::NAN, 70_000.0][case / 5 % 3];
            }
            let xr: Vec<&[f32]> = xs.iter().map(Vec::as_slice).collect();
            let mut multi = vec![0f32; rows * n_tok];
            f16_dot_fast_multi::<FUSED>(&data, 2 * k, &xr, &mut multi);
            // One token at a time through the rows kernel: checking the halves, and (where
            // they are all finite, as its caller would know) not checking them.
            let all_finite = data
                .chunks_exact(2)
                .all(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7c00 != 0x7c00);
            let by_rows: Vec<[Option<Vec<f32>>; 2]> = xr
                .iter()
                .map(|x| {
                    [true, false].map(|finite| {
                        (all_finite || !finite).then(|| {
                            let mut y = vec![0f32; rows];
                            f16_fast_rows::<FUSED>(&data, 2 * k, x, finite, &mut y);
                            y
                        })
                    })
                })
                .collect();
            for (r, row) in data.chunks_exact(2 * k).enumerate() {
                for (t, x) in xr.iter().enumerate() {
                    let want = f16_dot_converted::<FUSED>(row, x);
                    // The same bits, or NaN for NaN: WebAssembly leaves a NaN result's sign
                    // and payload to the engine, which may give the same function's two
                    // calls different ones (compiled once, then again optimized).
                    let same = |got: f32| {
                        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
                    };
                    let one = f16_dot_fast::<FUSED>(row, x);
                    assert!(
                        same(one),
                        "case {case} row {r} token {t}: {one:e} vs {want:e}"
                    );
                    let m = multi[r * n_tok + t];
                    assert!(
                        same(m),
                        "case {case} row {r} token {t}: multi {m:e} vs {want:e}"
                    );
                    for (finite, y) in [true, false].iter().zip(&by_rows[t]) {
                        let Some(y) = y else { continue };
                        let g = y[r];
                        assert!(
                            same(g),
                            "case {case} row {r} token {t}: rows (finite {finite}) {g:e} vs {want:e}"
                        );
                    }
                }
            }
        }
    }
}
