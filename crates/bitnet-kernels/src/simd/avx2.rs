//! AVX2 + FMA + F16C kernels.
//!
//! Ternary kernels multiply unsigned codes (u8, ≤ 4) by int8 activations with
//! `_mm256_maddubs_epi16` (pairs → i16, |pair| ≤ 2·4·128 = 1024, never saturates), add at
//! most four such i16 vectors (≤ 4096), widen to i32 with `_mm256_madd_epi16(·, 1)` and
//! accumulate in i32. Results equal the scalar kernels exactly.
//!
//! ```text
//! I2_S / TQ2_0 ("plane" layouts): 32 bytes w; plane l = (w >> 2l) & 3 holds 32 consecutive
//!   elements, so plane l pairs with 32 consecutive activations:
//!   I2_S   block 128: plane 3−l (bits 7−2l..6−2l) ↔ x[32l .. 32l+32]
//!   TQ2_0  half  h:   plane l  (bits 2l..2l+1)   ↔ x[128h + 32l .. +32]
//! sequential layouts (BitNet32F16, Split32, QK256): 32 bytes = 128 elements 4B+l at byte B,
//!   plane l ↔ xp[32l .. 32l+32], xp the permuted activations (see ternary::Prepared)
//! ```

use std::arch::x86_64::*;

use super::scalar;
use crate::layout::{seq32, tq1_0, tq2_0};
use crate::tier::Prepared;
use crate::tier::{Isa, Kernels};

pub(crate) static TABLE: Kernels = TABLE_BASE;

/// The AVX2 tier with the table-lookup GEMM for calls of [`LUT_MIN_TOKENS`] tokens or more
/// (selected only by `BITNET_ISA=avx2lut`, see `Isa::Avx2Lut`).
pub(crate) static TABLE_LUT: Kernels = Kernels {
    isa: Isa::Avx2Lut,
    i2s_lut: Some(crate::lut::Lut {
        tables: super::lut_avx2::tables,
        expand: super::lut_avx2::expand,
        kernel: super::lut_avx2::kernel,
        min_tokens: LUT_MIN_TOKENS,
    }),
    ..TABLE_BASE
};

/// Fewest tokens for which the tier uses the lookup GEMM: below it the tables and index words
/// cost more than the lookups save (at 1 token the lookups run at a third of the panels'
/// speed on Zen 3), so decode stays on the panel kernel.
const LUT_MIN_TOKENS: usize = 8;

/// The AVX2 table as a constant, so higher tiers can start from it.
pub(crate) const TABLE_BASE: Kernels = Kernels {
    isa: Isa::Avx2,
    i2s,
    i2s_clean,
    i2s_rows: Some(crate::tier::I2sRows {
        kernel: i2s_quad,
        rows: 4,
    }),
    tq2,
    tq1,
    bitnet32,
    split32,
    qk256,
    f16_dot_ggml,
    f16_dot_tiny,
    q8_0_dot,
    q4_0_dot,
    bf16_dot,
    f32_dot,
    q8_0_q8,
    q4_0_q8,
    f16_dot_ggml_multi,
    f16_dot_fast: f16_dot_ggml,
    f16_dot_fast_multi: f16_dot_ggml_multi,
    f16_fast_rows: None,
    q8_0_q8_multi,
    q4_0_q8_multi,
    i2s_panel: Some(super::panel_x86::panel_avx2),
    panel_tokens: super::panel_x86::TOKENS_AVX2,
    i2s_lut: None,
    i2s_amx: None,
};

/// Dispatch a tile kernel over a const token count.
macro_rules! tile {
    ($f:ident, $nt:expr, $($arg:expr),*) => {
        match $nt {
            1 => $f::<1>($($arg),*),
            2 => $f::<2>($($arg),*),
            3 => $f::<3>($($arg),*),
            _ => $f::<4>($($arg),*),
        }
    };
}

/// Sum of the 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Sum of the 4 i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn hsum_i32_128(s: __m128i) -> i32 {
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// How far ahead of the byte being read weight streams are prefetched. Weight rows are read
/// once per token, front to back, by a kernel that does not keep up with the hardware
/// prefetcher's ramp-up on its own: a software prefetch this far ahead took the 2-thread
/// I2_S decode pass from ≈58 to ≈41 ms on the development machine (Zen 1; distances 1.3–5 KiB
/// all within noise of each other; `cargo bench -p bitnet-kernels --bench matvec`).
const PREFETCH_BYTES: usize = 3072;

/// Hint the cache line `PREFETCH_BYTES` past `p[off]` into L1. Addresses past the end of `p`
/// are fine: a prefetch never faults, and the pointer is formed with `wrapping_add` and never
/// dereferenced.
#[inline(always)]
pub(crate) fn prefetch_ahead(p: &[u8], off: usize) {
    let a = p.as_ptr().wrapping_add(off + PREFETCH_BYTES);
    // SAFETY: SSE is part of the x86_64 baseline; PREFETCHT0 only hints the cache and never
    // faults, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(a.cast()) }
}

/// How far ahead of the byte being read the single-token F16 head kernels also ask for lines
/// into L2 (beside the L1 prefetch): the 128256×2560 head at one thread on Zen 4, best of 12
/// alternating runs, AVX-512 tier 33.7 → 23.6 ms, AVX2 tier 36.3 → 30.6 ms; at two threads,
/// bound by memory, 2–4 %.
pub(crate) const HEAD_L2_AHEAD: usize = 16384;

/// Hint the cache line `HEAD_L2_AHEAD` past `p[off]` into L2 (see [`prefetch_ahead`]: never
/// faults, the pointer never dereferenced).
#[inline(always)]
pub(crate) fn prefetch_l2_ahead(p: &[u8], off: usize) {
    let a = p.as_ptr().wrapping_add(off + HEAD_L2_AHEAD);
    // SAFETY: SSE is part of the x86_64 baseline; PREFETCHT1 only hints the cache and never
    // faults, whatever the address.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(a.cast()) }
}

/// 32 bytes at `p[off..off+32]`.
///
/// # Safety
/// `off + 32 <= p.len()` (checked in debug builds).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load32(p: &[u8], off: usize) -> __m256i {
    debug_assert!(off + 32 <= p.len());
    // SAFETY: in bounds by the caller's contract; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(p.as_ptr().add(off).cast()) }
}

/// 32 int8 at `x[off..off+32]`.
///
/// # Safety
/// `off + 32 <= x.len()` (checked in debug builds).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn loadx(x: &[i8], off: usize) -> __m256i {
    debug_assert!(off + 32 <= x.len());
    // SAFETY: in bounds by the caller's contract.
    unsafe { _mm256_loadu_si256(x.as_ptr().add(off).cast()) }
}

// ---------------------------------------------------------------------------------------
// I2_S

fn i2s(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    let k = p.k;
    if !k.is_multiple_of(128) || w_row.len() < k / 4 || p.x.len() < (t0 + nt) * k || out.len() < nt
    {
        return scalar::i2s(w_row, p, t0, nt, out);
    }
    // SAFETY: the table holding this function is only handed out after runtime detection of
    // AVX2 (dispatch::kernels_for); lengths were checked above.
    unsafe { tile!(i2s_tile_s, nt, w_row, p, t0, out) }
}

/// I2_S for tensors known to hold no code 11 (see `TernaryMatrix::check_codes`): skips the
/// per-byte code-11 fix-up (5 of ~22 instructions per block).
fn i2s_clean(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    let k = p.k;
    if !k.is_multiple_of(128) || w_row.len() < k / 4 || p.x.len() < (t0 + nt) * k || out.len() < nt
    {
        return scalar::i2s(w_row, p, t0, nt, out);
    }
    // SAFETY: as in `i2s`.
    unsafe { tile!(i2s_tile_c, nt, w_row, p, t0, out) }
}

/// # Safety
/// As [`i2s_tile`].
#[target_feature(enable = "avx2")]
unsafe fn i2s_tile_s<const NT: usize>(w_row: &[u8], p: &Prepared<'_>, t0: usize, out: &mut [i32]) {
    // SAFETY: forwarded contract.
    unsafe { i2s_tile::<NT, true>(w_row, p, t0, out) }
}

/// # Safety
/// As [`i2s_tile`], and the row holds no code 11.
#[target_feature(enable = "avx2")]
unsafe fn i2s_tile_c<const NT: usize>(w_row: &[u8], p: &Prepared<'_>, t0: usize, out: &mut [i32]) {
    // SAFETY: forwarded contract.
    unsafe { i2s_tile::<NT, false>(w_row, p, t0, out) }
}

/// # Safety
/// AVX2 available; `w_row.len() ≥ K/4`, tokens `t0..t0+NT` exist, `out.len() ≥ NT`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn i2s_tile<const NT: usize, const SANITIZE: bool>(
    w_row: &[u8],
    p: &Prepared<'_>,
    t0: usize,
    out: &mut [i32],
) {
    let k = p.k;
    let m3 = _mm256_set1_epi8(3);
    let mc = _mm256_set1_epi8(0x0C);
    let m55 = _mm256_set1_epi8(0x55);
    let ones = _mm256_set1_epi16(1);
    let xs: [&[i8]; NT] = std::array::from_fn(|i| p.token(t0 + i));
    let mut acc = [_mm256_setzero_si256(); NT];
    let nblk = k / 128;
    // Planes with one shift instead of three: with h = w >> 4,
    //   w & 3 → elements p+96, (w & 12) = 4·code of p+64, h & 3 → p+32, (h & 12) = 4·code of p.
    // The ×4 planes go to a second i16 sum that is divided by 4 exactly (every lane is a sum
    // of multiples of 4) before widening. Per lane and block (codes ≤ 2, |q| ≤ 128): the
    // unscaled sum ≤ 2·(2·2·128) = 1024, the scaled one ≤ 2·(8·2·128) = 4096; over ≤ 4
    // blocks 4096 and 16384, and s1 + s4/4 ≤ 8192: all within i16.
    let mut b = 0;
    while b < nblk {
        let span = (nblk - b).min(4);
        let mut s1 = [_mm256_setzero_si256(); NT];
        let mut s4 = [_mm256_setzero_si256(); NT];
        for bb in b..b + span {
            if bb % 2 == 0 {
                prefetch_ahead(w_row, 32 * bb);
            }
            // SAFETY: bb < K/128 so 32·bb + 32 ≤ K/4 ≤ w_row.len().
            let mut w = unsafe { load32(w_row, 32 * bb) };
            if SANITIZE {
                // Code 11 → 01 (value 0): w ^= (w & w>>1 & 0x55) << 1.
                let both = _mm256_and_si256(_mm256_and_si256(w, _mm256_srli_epi16::<1>(w)), m55);
                w = _mm256_xor_si256(w, _mm256_add_epi8(both, both));
            }
            let h = _mm256_srli_epi16::<4>(w);
            let c0x4 = _mm256_and_si256(h, mc);
            let c1 = _mm256_and_si256(h, m3);
            let c2x4 = _mm256_and_si256(w, mc);
            let c3 = _mm256_and_si256(w, m3);
            for (t, x) in xs.iter().enumerate() {
                let o = 128 * bb;
                // SAFETY: o + 128 ≤ K = x.len().
                let (x0, x1, x2, x3) = unsafe {
                    (
                        loadx(x, o),
                        loadx(x, o + 32),
                        loadx(x, o + 64),
                        loadx(x, o + 96),
                    )
                };
                let a =
                    _mm256_add_epi16(_mm256_maddubs_epi16(c1, x1), _mm256_maddubs_epi16(c3, x3));
                let c = _mm256_add_epi16(
                    _mm256_maddubs_epi16(c0x4, x0),
                    _mm256_maddubs_epi16(c2x4, x2),
                );
                s1[t] = _mm256_add_epi16(s1[t], a);
                s4[t] = _mm256_add_epi16(s4[t], c);
            }
        }
        for t in 0..NT {
            let s16 = _mm256_add_epi16(s1[t], _mm256_srai_epi16::<2>(s4[t]));
            acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(s16, ones));
        }
        b += span;
    }
    for t in 0..NT {
        out[t] = hsum_i32(acc[t]);
    }
}

fn i2s_quad(w4: &[u8], p: &Prepared<'_>, t: usize, clean: bool, out: &mut [i32]) {
    let k = p.k;
    if out.len() != 4 || !k.is_multiple_of(128) || w4.len() < k || p.x.len() < (t + 1) * k {
        return scalar::i2s_rows(w4, p, t, clean, out);
    }
    // SAFETY: AVX2 detected before this table is used; lengths checked above (four rows of
    // K/4 bytes each = K bytes).
    let r = unsafe {
        if clean {
            i2s_quad_impl::<false>(w4, p.token(t))
        } else {
            i2s_quad_impl::<true>(w4, p.token(t))
        }
    };
    out.copy_from_slice(&r);
}

/// How far ahead [`i2s_quad_impl`] prefetches, in bytes of its contiguous four-row stream
/// (2–6 KiB measured alike on the development machine; 1–2 KiB clearly worse).
const QUAD_PREFETCH_BYTES: usize = 4096;

/// Four consecutive rows (`w4` = rows r..r+4, K/4 bytes each, back to back), one token: the
/// plane scheme of [`i2s_tile`] with every activation load shared by four rows.
///
/// The rows lie back to back in memory, so the kernel reads one stream of 4·K/4 bytes, and it
/// prefetches that stream in address order: block `bb` covers bytes 128·bb..128·bb+128 of the
/// four-row span, and the lines `QUAD_PREFETCH_BYTES` past them are hinted. Prefetching each
/// row separately (a per-row distance, as the single-row kernels do) hints the same lines but
/// out of address order; on the development machine that streamed at 68–79 % of the plain
/// read bandwidth, against 87–97 % for this order (2 threads, 6912×2560; the matvec bench).
///
/// # Safety
/// AVX2 available; `w4.len() ≥ K` (four rows of K/4 bytes) and `x.len() = K`, K % 128 == 0.
#[target_feature(enable = "avx2")]
unsafe fn i2s_quad_impl<const SANITIZE: bool>(w4: &[u8], x: &[i8]) -> [i32; 4] {
    const R: usize = 4;
    let k = x.len();
    let rb = k / 4;
    let m3 = _mm256_set1_epi8(3);
    let mc = _mm256_set1_epi8(0x0C);
    let m55 = _mm256_set1_epi8(0x55);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_si256(); R];
    let nblk = k / 128;
    let base = w4.as_ptr();
    let mut b = 0;
    while b < nblk {
        let span = (nblk - b).min(4);
        let mut s1 = [_mm256_setzero_si256(); R];
        let mut s4 = [_mm256_setzero_si256(); R];
        for bb in b..b + span {
            let o = 128 * bb;
            // The four rows' bytes 32·bb.. are consumed at the rate of 128 bytes per block:
            // hint the two lines of that much of the linear stream, QUAD_PREFETCH_BYTES ahead.
            let ahead = base.wrapping_add(128 * bb + QUAD_PREFETCH_BYTES);
            // A prefetch never faults, whatever the address; the pointer (formed with
            // wrapping_add) is never dereferenced.
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64).cast());
            // SAFETY: o + 128 ≤ K = x.len().
            let (x0, x1, x2, x3) = unsafe {
                (
                    loadx(x, o),
                    loadx(x, o + 32),
                    loadx(x, o + 64),
                    loadx(x, o + 96),
                )
            };
            for r in 0..R {
                // SAFETY: r·K/4 + 32·bb + 32 ≤ 4·K/4 = K ≤ w4.len().
                let mut w = unsafe { load32(w4, r * rb + 32 * bb) };
                if SANITIZE {
                    let both =
                        _mm256_and_si256(_mm256_and_si256(w, _mm256_srli_epi16::<1>(w)), m55);
                    w = _mm256_xor_si256(w, _mm256_add_epi8(both, both));
                }
                let h = _mm256_srli_epi16::<4>(w);
                let a = _mm256_add_epi16(
                    _mm256_maddubs_epi16(_mm256_and_si256(h, m3), x1),
                    _mm256_maddubs_epi16(_mm256_and_si256(w, m3), x3),
                );
                let c = _mm256_add_epi16(
                    _mm256_maddubs_epi16(_mm256_and_si256(h, mc), x0),
                    _mm256_maddubs_epi16(_mm256_and_si256(w, mc), x2),
                );
                s1[r] = _mm256_add_epi16(s1[r], a);
                s4[r] = _mm256_add_epi16(s4[r], c);
            }
        }
        for r in 0..R {
            let s16 = _mm256_add_epi16(s1[r], _mm256_srai_epi16::<2>(s4[r]));
            acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(s16, ones));
        }
        b += span;
    }
    std::array::from_fn(|r| hsum_i32(acc[r]))
}

/// `Σ u·q` of one I2_S block (32 bytes of `w`, 128 activations).
///
/// # Safety
/// AVX2 available; `w.len() ≥ 32`, `x.len() ≥ 128` (checked in debug builds).
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn i2s_block(w: &[u8], x: &[i8]) -> i32 {
    debug_assert!(w.len() >= 32 && x.len() >= 128);
    let m3 = _mm256_set1_epi8(3);
    let m55 = _mm256_set1_epi8(0x55);
    // SAFETY: lengths per the contract.
    let (mut w, x0, x1, x2, x3) = unsafe {
        (
            load32(w, 0),
            loadx(x, 0),
            loadx(x, 32),
            loadx(x, 64),
            loadx(x, 96),
        )
    };
    let both = _mm256_and_si256(_mm256_and_si256(w, _mm256_srli_epi16::<1>(w)), m55);
    w = _mm256_xor_si256(w, _mm256_add_epi8(both, both));
    let a = _mm256_add_epi16(
        _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<6>(w), m3), x0),
        _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<4>(w), m3), x1),
    );
    let c = _mm256_add_epi16(
        _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16::<2>(w), m3), x2),
        _mm256_maddubs_epi16(_mm256_and_si256(w, m3), x3),
    );
    hsum_i32(_mm256_madd_epi16(
        _mm256_add_epi16(a, c),
        _mm256_set1_epi16(1),
    ))
}

// ---------------------------------------------------------------------------------------
// TQ2_0

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
    // SAFETY: AVX2 detected before this table is used; lengths checked above.
    unsafe { tile!(tq2_tile, nt, w_row, p, t0, out) }
}

/// # Safety
/// AVX2 available; row holds K/256 blocks; tokens exist; `out.len() ≥ NT·K/256`.
#[target_feature(enable = "avx2")]
unsafe fn tq2_tile<const NT: usize>(w_row: &[u8], p: &Prepared<'_>, t0: usize, out: &mut [i32]) {
    let nb = p.k / 256;
    let m3 = _mm256_set1_epi8(3);
    let ones = _mm256_set1_epi16(1);
    let xs: [&[i8]; NT] = std::array::from_fn(|i| p.token(t0 + i));
    let mc = _mm256_set1_epi8(0x0C);
    // As in I2_S, one shift per 32 bytes: w & 3 → l = 0, w & 12 = 4·(l = 1), h & 3 → l = 2,
    // h & 12 = 4·(l = 3) with h = w >> 4. Codes ≤ 3: per lane and block the unscaled sum
    // ≤ 2 halves · 2 · (3·2·128) = 3072, the scaled one ≤ 12288, and s1 + s4/4 ≤ 6144.
    for b in 0..nb {
        let mut s1 = [_mm256_setzero_si256(); NT];
        let mut s4 = [_mm256_setzero_si256(); NT];
        for half in 0..2 {
            // SAFETY: b·66 + 32·half + 32 ≤ 66·nb ≤ w_row.len().
            let w = unsafe { load32(w_row, b * tq2_0::BLOCK_BYTES + 32 * half) };
            let h = _mm256_srli_epi16::<4>(w);
            let c0 = _mm256_and_si256(w, m3);
            let c1x4 = _mm256_and_si256(w, mc);
            let c2 = _mm256_and_si256(h, m3);
            let c3x4 = _mm256_and_si256(h, mc);
            for (t, x) in xs.iter().enumerate() {
                let o = 256 * b + 128 * half;
                // SAFETY: o + 128 ≤ K.
                let (x0, x1, x2, x3) = unsafe {
                    (
                        loadx(x, o),
                        loadx(x, o + 32),
                        loadx(x, o + 64),
                        loadx(x, o + 96),
                    )
                };
                s1[t] = _mm256_add_epi16(
                    s1[t],
                    _mm256_add_epi16(_mm256_maddubs_epi16(c0, x0), _mm256_maddubs_epi16(c2, x2)),
                );
                s4[t] = _mm256_add_epi16(
                    s4[t],
                    _mm256_add_epi16(
                        _mm256_maddubs_epi16(c1x4, x1),
                        _mm256_maddubs_epi16(c3x4, x3),
                    ),
                );
            }
        }
        for t in 0..NT {
            let s16 = _mm256_add_epi16(s1[t], _mm256_srai_epi16::<2>(s4[t]));
            out[t * nb + b] = hsum_i32(_mm256_madd_epi16(s16, ones));
        }
    }
}

// ---------------------------------------------------------------------------------------
// TQ1_0

/// Trits of 32 bytes for trit index n (premultiplied `v = b·3^n mod 256`):
/// `((v·3) >> 8)` per byte, computed as mulhi_epu16(v placed in a high byte, 3).
#[inline]
#[target_feature(enable = "avx2")]
fn trit256(v: __m256i) -> __m256i {
    let three = _mm256_set1_epi16(3);
    let lo = _mm256_mulhi_epu16(_mm256_slli_epi16::<8>(v), three);
    let hi = _mm256_mulhi_epu16(_mm256_and_si256(v, _mm256_set1_epi16(-256)), three);
    _mm256_or_si256(lo, _mm256_slli_epi16::<8>(hi))
}

#[inline]
#[target_feature(enable = "avx2")]
fn trit128(v: __m128i) -> __m128i {
    let three = _mm_set1_epi16(3);
    let lo = _mm_mulhi_epu16(_mm_slli_epi16::<8>(v), three);
    let hi = _mm_mulhi_epu16(_mm_and_si128(v, _mm_set1_epi16(-256)), three);
    _mm_or_si128(lo, _mm_slli_epi16::<8>(hi))
}

/// `v·3 mod 256` per byte.
#[inline]
#[target_feature(enable = "avx2")]
fn times3_256(v: __m256i) -> __m256i {
    _mm256_add_epi8(_mm256_add_epi8(v, v), v)
}

#[inline]
#[target_feature(enable = "avx2")]
fn times3_128(v: __m128i) -> __m128i {
    _mm_add_epi8(_mm_add_epi8(v, v), v)
}

fn tq1(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    let k = p.k;
    let nb = k / 256;
    if !k.is_multiple_of(256)
        || w_row.len() < nb * tq1_0::BLOCK_BYTES
        || p.x.len() < (t0 + nt) * k
        || out.len() < nt * nb
    {
        return scalar::tq1(w_row, p, t0, nt, out);
    }
    // SAFETY: AVX2 detected before this table is used; lengths checked above.
    unsafe { tile!(tq1_tile, nt, w_row, p, t0, out) }
}

/// # Safety
/// AVX2 available; row holds K/256 blocks of 54 bytes; tokens exist; `out.len() ≥ NT·K/256`.
#[target_feature(enable = "avx2")]
unsafe fn tq1_tile<const NT: usize>(w_row: &[u8], p: &Prepared<'_>, t0: usize, out: &mut [i32]) {
    let nb = p.k / 256;
    let ones = _mm256_set1_epi16(1);
    let ones128 = _mm_set1_epi16(1);
    let xs: [&[i8]; NT] = std::array::from_fn(|i| p.token(t0 + i));
    for b in 0..nb {
        let base = b * tq1_0::BLOCK_BYTES;
        let blk = &w_row[base..base + tq1_0::BLOCK_BYTES];
        // SAFETY: 32 ≤ 54.
        let mut v = unsafe { load32(blk, 0) };
        // SAFETY: bytes 32..48 of the 54-byte block.
        let mut v16 = unsafe { _mm_loadu_si128(blk.as_ptr().add(32).cast()) };
        let mut tr = [_mm256_setzero_si256(); 5];
        let mut tr16 = [_mm_setzero_si128(); 5];
        for n in 0..5 {
            if n > 0 {
                v = times3_256(v);
                v16 = times3_128(v16);
            }
            tr[n] = trit256(v);
            tr16[n] = trit128(v16);
        }
        for (t, x) in xs.iter().enumerate() {
            let o = 256 * b;
            let mut s16 = _mm256_setzero_si256();
            let mut s16b = _mm_setzero_si128();
            for n in 0..5 {
                // SAFETY: o + 32n + 32 ≤ o + 160 ≤ K; o + 160 + 16n + 16 ≤ o + 240.
                let (xa, xb) = unsafe {
                    (
                        loadx(x, o + 32 * n),
                        _mm_loadu_si128(x.as_ptr().add(o + 160 + 16 * n).cast()),
                    )
                };
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(tr[n], xa));
                s16b = _mm_add_epi16(s16b, _mm_maddubs_epi16(tr16[n], xb));
            }
            let wide = _mm256_madd_epi16(s16, ones);
            let narrow = _mm_madd_epi16(s16b, ones128);
            let mut sum = hsum_i32(wide) + hsum_i32_128(narrow);
            // Elements 240..256: 4 trits in each of qh[0..4] (scalar; 16 of 256 elements).
            for j in 0..4 {
                for n in 0..4 {
                    let e = 240 + j + 4 * n;
                    sum += i32::from(tq1_0::trit(blk[48 + j], n)) * i32::from(x[o + e]);
                }
            }
            out[t * nb + b] = sum;
        }
    }
}

// ---------------------------------------------------------------------------------------
// BitNet32F16 / Split32WithSibling

fn bitnet32(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    seq32_dispatch(
        w_row,
        seq32::INLINE_BLOCK_BYTES,
        p,
        t0,
        nt,
        out,
        scalar::bitnet32,
    );
}

fn split32(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    seq32_dispatch(w_row, seq32::PACKED_BYTES, p, t0, nt, out, scalar::split32);
}

fn seq32_dispatch(
    w_row: &[u8],
    stride: usize,
    p: &Prepared<'_>,
    t0: usize,
    nt: usize,
    out: &mut [i32],
    fallback: crate::tier::TernaryKernel,
) {
    let k = p.k;
    let nb = k / 32;
    if !k.is_multiple_of(32)
        || w_row.len() < nb * stride
        || p.kp < nb.div_ceil(4) * 128
        || p.xp.len() < (t0 + nt) * p.kp
        || out.len() < nt * nb
    {
        return fallback(w_row, p, t0, nt, out);
    }
    // SAFETY: AVX2 detected before this table is used; lengths checked above.
    unsafe { tile!(seq32_tile, nt, w_row, stride, p, t0, out) }
}

/// # Safety
/// AVX2 available; the row holds K/32 blocks of `stride` bytes (codes in the first 8);
/// permuted tokens `t0..t0+NT` exist with `kp ≥ ceil(K/128)·128`; `out.len() ≥ NT·K/32`.
#[target_feature(enable = "avx2")]
unsafe fn seq32_tile<const NT: usize>(
    w_row: &[u8],
    stride: usize,
    p: &Prepared<'_>,
    t0: usize,
    out: &mut [i32],
) {
    let nb = p.k / 32;
    let m3 = _mm256_set1_epi8(3);
    let ones = _mm256_set1_epi16(1);
    let xs: [&[i8]; NT] = std::array::from_fn(|i| p.token_perm(t0 + i));
    let mut g = 0;
    while g < nb {
        let nblk = (nb - g).min(4);
        // 4 blocks' codes side by side: byte 8j+m = block g+j, byte m.
        let mut buf = [0u8; 32];
        for j in 0..nblk {
            let s = (g + j) * stride;
            buf[8 * j..8 * j + 8].copy_from_slice(&w_row[s..s + 8]);
        }
        // SAFETY: buf has 32 bytes.
        let w = unsafe { load32(&buf, 0) };
        let c = [
            _mm256_and_si256(w, m3),
            _mm256_and_si256(_mm256_srli_epi16::<2>(w), m3),
            _mm256_and_si256(_mm256_srli_epi16::<4>(w), m3),
            _mm256_and_si256(_mm256_srli_epi16::<6>(w), m3),
        ];
        for (t, x) in xs.iter().enumerate() {
            let o = 32 * g; // = 128 · (g / 4)
                            // SAFETY: o + 128 ≤ kp.
            let (x0, x1, x2, x3) = unsafe {
                (
                    loadx(x, o),
                    loadx(x, o + 32),
                    loadx(x, o + 64),
                    loadx(x, o + 96),
                )
            };
            let a = _mm256_add_epi16(
                _mm256_maddubs_epi16(c[0], x0),
                _mm256_maddubs_epi16(c[1], x1),
            );
            let d = _mm256_add_epi16(
                _mm256_maddubs_epi16(c[2], x2),
                _mm256_maddubs_epi16(c[3], x3),
            );
            // i32 lanes 2j, 2j+1 belong to block j.
            let s = _mm256_madd_epi16(_mm256_add_epi16(a, d), ones);
            let mut lanes = [0i32; 8];
            // SAFETY: lanes is 32 bytes.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), s) };
            for j in 0..nblk {
                out[t * nb + g + j] = lanes[2 * j] + lanes[2 * j + 1];
            }
        }
        g += nblk;
    }
}

// ---------------------------------------------------------------------------------------
// QK256

fn qk256(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    let nb = p.k.div_ceil(256);
    if w_row.len() < nb * 64
        || p.kp < nb * 256
        || p.xp.len() < (t0 + nt) * p.kp
        || out.len() < nt * nb
    {
        return scalar::qk256(w_row, p, t0, nt, out);
    }
    // SAFETY: AVX2 detected before this table is used; lengths checked above.
    unsafe { tile!(qk256_tile, nt, w_row, p, t0, out) }
}

/// # Safety
/// AVX2 available; the row holds ceil(K/256)·64 bytes; permuted tokens exist with
/// `kp ≥ ceil(K/256)·256`; `out.len() ≥ NT·ceil(K/256)`.
#[target_feature(enable = "avx2")]
unsafe fn qk256_tile<const NT: usize>(w_row: &[u8], p: &Prepared<'_>, t0: usize, out: &mut [i32]) {
    let nb = p.k.div_ceil(256);
    let m3 = _mm256_set1_epi8(3);
    let ones = _mm256_set1_epi16(1);
    // u = c + (c >> 1): 0, 1, 3, 4.
    let lut = _mm256_setr_epi8(
        0, 1, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0,
    );
    let xs: [&[i8]; NT] = std::array::from_fn(|i| p.token_perm(t0 + i));
    for b in 0..nb {
        let mut s16 = [_mm256_setzero_si256(); NT];
        for h in 0..2 {
            // SAFETY: 64b + 32h + 32 ≤ 64·nb ≤ w_row.len().
            let w = unsafe { load32(w_row, 64 * b + 32 * h) };
            let c = [
                _mm256_shuffle_epi8(lut, _mm256_and_si256(w, m3)),
                _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16::<2>(w), m3)),
                _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16::<4>(w), m3)),
                _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16::<6>(w), m3)),
            ];
            for (t, x) in xs.iter().enumerate() {
                let o = 256 * b + 128 * h;
                // SAFETY: o + 128 ≤ kp.
                let (x0, x1, x2, x3) = unsafe {
                    (
                        loadx(x, o),
                        loadx(x, o + 32),
                        loadx(x, o + 64),
                        loadx(x, o + 96),
                    )
                };
                let a = _mm256_add_epi16(
                    _mm256_maddubs_epi16(c[0], x0),
                    _mm256_maddubs_epi16(c[1], x1),
                );
                let d = _mm256_add_epi16(
                    _mm256_maddubs_epi16(c[2], x2),
                    _mm256_maddubs_epi16(c[3], x3),
                );
                s16[t] = _mm256_add_epi16(s16[t], _mm256_add_epi16(a, d));
            }
        }
        for t in 0..NT {
            out[t * nb + b] = hsum_i32(_mm256_madd_epi16(s16[t], ones));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Float row dots (orders defined in simd::scalar)

/// 8 f16 at `row[2i..2i+16]` as f32.
///
/// # Safety
/// `2i + 16 <= row.len()`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load_f16x8(row: &[u8], i: usize) -> __m256 {
    debug_assert!(2 * i + 16 <= row.len());
    // SAFETY: in bounds by the caller's contract.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(2 * i).cast())) }
}

/// # Safety
/// `i + 8 <= x.len()`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_f32x8(x: &[f32], i: usize) -> __m256 {
    debug_assert!(i + 8 <= x.len());
    // SAFETY: in bounds by the caller's contract.
    unsafe { _mm256_loadu_ps(x.as_ptr().add(i)) }
}

/// (t0+t2)+(t1+t3) of t = lo + hi.
#[inline]
#[target_feature(enable = "avx2")]
fn reduce8_tiny(a: __m256) -> f32 {
    let t = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    // [t0+t2, t1+t3, ..]
    let u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps::<0b01>(u, u)))
}

fn f16_dot_ggml(row: &[u8], x: &[f32]) -> f32 {
    if row.len() < 2 * x.len() {
        return scalar::f16_dot_ggml(row, x);
    }
    // SAFETY: AVX2+FMA+F16C detected before this table is used; length checked.
    unsafe { f16_dot_ggml_impl(row, x) }
}

/// # Safety
/// AVX2, FMA, F16C available; `row.len() ≥ 2·x.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_dot_ggml_impl(row: &[u8], x: &[f32]) -> f32 {
    let k = x.len();
    let main = k - k % 32;
    let mut acc = [[_mm256_setzero_ps(); 4]];
    let mut c = 0;
    while c < main {
        prefetch_ahead(row, 2 * c);
        prefetch_l2_ahead(row, 2 * c);
        // SAFETY: c + 32 ≤ main ≤ k ≤ row.len() / 2; features enabled here.
        unsafe { fma_chunk32(row, &[x], c, &mut acc) };
        c += 32;
    }
    // SAFETY: this function's features include ggml_finish's; the caller's lengths.
    unsafe { ggml_finish(&acc[0], row, x, main) }
}

/// Whether a multi-token F16 call has the shape its vector kernels assume: every token of
/// one length `k ≤ row_bytes / 2`, `n_rows · n_tok` outputs (`xs` not empty).
pub(crate) fn multi_shape_ok(row_bytes: usize, n_rows: usize, xs: &[&[f32]], out: &[f32]) -> bool {
    let k = xs[0].len();
    xs.iter().all(|x| x.len() == k) && row_bytes >= 2 * k && out.len() >= n_rows * xs.len()
}

/// Rows per block of [`f16_dot_ggml_multi`].
const MULTI_ROWS: usize = 8;
/// Columns per chunk of [`f16_dot_ggml_multi`] (a multiple of 32).
const MULTI_COLS: usize = 512;

/// Rows in blocks of [`MULTI_ROWS`], walked in column chunks of [`MULTI_COLS`] across the
/// block, tokens in groups of up to three sharing each converted F16 chunk: a group's
/// activation chunks (6 KiB) stay in L1 across the block's rows, where whole activation rows
/// (10 KiB per token at 2,560 columns) streamed from L2 for every weight row. Each
/// accumulator sums the same products in the same order as [`f16_dot_ggml_impl`].
pub(crate) fn f16_dot_ggml_multi(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    let n_tok = xs.len();
    if n_tok == 0 || row_bytes == 0 {
        return;
    }
    let n_rows = rows.len() / row_bytes;
    if !multi_shape_ok(row_bytes, n_rows, xs, out) {
        for (row, o) in rows.chunks_exact(row_bytes).zip(out.chunks_mut(n_tok)) {
            f16_dot_ggml_tokens(row, xs, o);
        }
        return;
    }
    for_block_groups(
        rows,
        row_bytes,
        n_tok,
        out,
        MULTI_ROWS,
        3,
        |block, ob, t, g| {
            // SAFETY: AVX2+FMA+F16C detected before this table is used; every token has length
            // k ≤ row_bytes / 2, and `ob` holds n_tok outputs per row of the block.
            unsafe {
                match g {
                    3 => block_ggml::<3>(block, row_bytes, [xs[t], xs[t + 1], xs[t + 2]], ob, t),
                    2 => block_ggml::<2>(block, row_bytes, [xs[t], xs[t + 1]], ob, t),
                    _ => block_ggml::<1>(block, row_bytes, [xs[t]], ob, t),
                }
            }
        },
    );
}

/// The blocked walks' driver: whole rows in blocks of `block_rows` beside their outputs
/// (`n_tok` per row), and per block the tokens in groups of up to `group`:
/// `f(block, block's outputs, first token, tokens in the group)`.
pub(crate) fn for_block_groups(
    rows: &[u8],
    row_bytes: usize,
    n_tok: usize,
    out: &mut [f32],
    block_rows: usize,
    group: usize,
    mut f: impl FnMut(&[u8], &mut [f32], usize, usize),
) {
    let n_rows = rows.len() / row_bytes;
    let blocks = rows[..n_rows * row_bytes].chunks(block_rows * row_bytes);
    let outs = out[..n_rows * n_tok].chunks_mut(block_rows * n_tok);
    for (block, ob) in blocks.zip(outs) {
        let mut t = 0;
        while t < n_tok {
            let g = (n_tok - t).min(group);
            f(block, ob, t, g);
            t += g;
        }
    }
}

/// One block of rows (`block.len() / rb` of them, at most [`MULTI_ROWS`]) times `NT` tokens:
/// writes `out[r·n + t0 + t]` (`n = out.len() / rows`) for row r and token t. The
/// accumulators live in memory between column chunks. While it runs it asks for the next
/// block's bytes into L2, one cache line per 32 columns, so they are near by the time it
/// starts (into L1 they evicted the lines in use: 8 rows of 2,560 columns are 40 KiB; Zen 4,
/// head 128256×2560 × 4 tokens, 1 thread: 62 → 49 ms).
///
/// # Safety
/// AVX2, FMA, F16C available; every `xs[t].len() == k`, `rb ≥ 2k`, `block` whole rows,
/// `out.len()` the row count times the outputs per row, at least `t0 + NT` of them.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // lane-parallel indexing over tokens and accumulators
unsafe fn block_ggml<const NT: usize>(
    block: &[u8],
    rb: usize,
    xs: [&[f32]; NT],
    out: &mut [f32],
    t0: usize,
) {
    let nr = block.len() / rb;
    let n = out.len() / nr.max(1);
    let k = xs[0].len();
    let main = k - k % 32;
    let mut acc = [[[_mm256_setzero_ps(); 4]; NT]; MULTI_ROWS];
    let next = block.as_ptr().wrapping_add(block.len());
    let mut ahead = 0usize;
    let mut c0 = 0;
    while c0 < main {
        let c1 = (c0 + MULTI_COLS).min(main);
        for (r, ar) in acc.iter_mut().enumerate().take(nr) {
            let row = &block[r * rb..(r + 1) * rb];
            let mut a = *ar;
            let mut c = c0;
            while c < c1 {
                // A prefetch never faults, whatever the address (formed with wrapping_add,
                // never dereferenced).
                _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(ahead).cast());
                ahead += 64;
                // SAFETY: c + 32 ≤ main ≤ k for the row and every token; features enabled here.
                unsafe { fma_chunk32(row, &xs, c, &mut a) };
                c += 32;
            }
            *ar = a;
        }
        c0 = c1;
    }
    for (r, ar) in acc.iter().enumerate().take(nr) {
        let row = &block[r * rb..(r + 1) * rb];
        for t in 0..NT {
            // SAFETY: this function's features include ggml_finish's; the caller's lengths.
            out[r * n + t0 + t] = unsafe { ggml_finish(&ar[t], row, xs[t], main) };
        }
    }
}

fn f16_dot_ggml_tokens(row: &[u8], xs: &[&[f32]], out: &mut [f32]) {
    let n = xs.len().min(out.len());
    let mut t = 0;
    while t < n {
        let k = xs[t].len();
        // Up to three tokens of equal length share each converted F16 chunk (twelve
        // accumulators fit the sixteen registers); anything else goes one by one.
        let g = (n - t).min(3);
        let same = xs[t..t + g].iter().all(|x| x.len() == k) && row.len() >= 2 * k;
        // SAFETY: AVX2+FMA+F16C detected before this table is used; every x has length k
        // and the row holds ≥ k f16 values.
        unsafe {
            match g {
                3 if same => {
                    let r = f16_dot_ggml_nt::<3>(row, [xs[t], xs[t + 1], xs[t + 2]]);
                    out[t..t + 3].copy_from_slice(&r);
                }
                2.. if same => {
                    let r = f16_dot_ggml_nt::<2>(row, [xs[t], xs[t + 1]]);
                    out[t..t + 2].copy_from_slice(&r);
                }
                _ => out[t] = f16_dot_ggml(row, xs[t]),
            }
        }
        t += if same { g } else { 1 };
    }
}

/// [`f16_dot_ggml_impl`] for `NT` tokens at once: the same per-token accumulators and
/// reduction, each chunk of the row converted once.
///
/// # Safety
/// AVX2, FMA, F16C available; every `xs[t].len() == k` and `row.len() ≥ 2k`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // lane-parallel indexing over tokens and accumulators
unsafe fn f16_dot_ggml_nt<const NT: usize>(row: &[u8], xs: [&[f32]; NT]) -> [f32; NT] {
    let k = xs[0].len();
    let main = k - k % 32;
    let mut acc = [[_mm256_setzero_ps(); 4]; NT];
    let mut c = 0;
    while c < main {
        prefetch_ahead(row, 2 * c);
        // SAFETY: c + 32 ≤ main ≤ k for the row and every token; features enabled here.
        unsafe { fma_chunk32(row, &xs, c, &mut acc) };
        c += 32;
    }
    let mut out = [0f32; NT];
    for t in 0..NT {
        // SAFETY: this function's features include ggml_finish's; the caller's lengths.
        out[t] = unsafe { ggml_finish(&acc[t], row, xs[t], main) };
    }
    out
}

/// ggml's step over columns `c..c + 32` for `NT` tokens: accumulator j of token t gains
/// `w[c + 8j..] · x_t[c + 8j..]`, each F16 chunk converted once. Inlined into its callers,
/// which enable the features.
///
/// # Safety
/// AVX2, FMA and F16C available; `c + 32 ≤ xs[t].len()` for every t and `2(c + 32) ≤
/// row.len()`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // lane-parallel indexing over tokens and accumulators
unsafe fn fma_chunk32<const NT: usize>(
    row: &[u8],
    xs: &[&[f32]; NT],
    c: usize,
    acc: &mut [[__m256; 4]; NT],
) {
    for j in 0..4 {
        let i = c + 8 * j;
        // SAFETY: the contract above (bounds; features enabled by the caller).
        unsafe {
            let w = load_f16x8(row, i);
            for t in 0..NT {
                let xv = load_f32x8(xs[t], i);
                acc[t][j] = _mm256_fmadd_ps(w, xv, acc[t][j]);
            }
        }
    }
}

/// The end of [`f16_dot_ggml_impl`] for one token: its four accumulators reduced as ggml
/// does, then the elements from `main` on added in f64.
///
/// # Safety
/// AVX2 and F16C available; `row.len() ≥ 2·x.len()`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn ggml_finish(acc: &[__m256; 4], row: &[u8], x: &[f32], main: usize) -> f32 {
    let a = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let v = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let h = _mm_hadd_ps(v, v);
    let h = _mm_hadd_ps(h, h);
    let mut sum = f64::from(_mm_cvtss_f32(h));
    for (i, &xi) in x.iter().enumerate().skip(main) {
        let w = half::f16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32();
        sum += f64::from(w * xi);
    }
    #[allow(clippy::cast_possible_truncation)] // f64 -> f32 rounding is the defined result
    let r = sum as f32;
    r
}

fn f16_dot_tiny(row: &[u8], x: &[f32]) -> f32 {
    if row.len() < 2 * x.len() {
        return scalar::f16_dot_tiny(row, x);
    }
    // SAFETY: AVX2+FMA+F16C detected before this table is used; length checked.
    unsafe { f16_dot_tiny_impl(row, x) }
}

/// # Safety
/// AVX2, FMA, F16C available; `row.len() ≥ 2·x.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_dot_tiny_impl(row: &[u8], x: &[f32]) -> f32 {
    let k = x.len();
    let main = k - k % 8;
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < main {
        if i % 32 == 0 {
            prefetch_ahead(row, 2 * i);
        }
        // SAFETY: i + 8 ≤ main ≤ k.
        let (w, xv) = unsafe { (load_f16x8(row, i), load_f32x8(x, i)) };
        acc = _mm256_fmadd_ps(w, xv, acc);
        i += 8;
    }
    let mut r = reduce8_tiny(acc);
    for (i, &xi) in x.iter().enumerate().skip(main) {
        r += half::f16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32() * xi;
    }
    r
}

fn f32_dot(w: &[f32], x: &[f32]) -> f32 {
    // SAFETY: AVX2+FMA detected before this table is used; loads stay within min length.
    unsafe { f32_dot_impl(w, x) }
}

/// # Safety
/// AVX2 and FMA available.
#[target_feature(enable = "avx2,fma")]
unsafe fn f32_dot_impl(w: &[f32], x: &[f32]) -> f32 {
    let k = x.len().min(w.len());
    let main = k - k % 8;
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < main {
        // SAFETY: i + 8 ≤ main ≤ min(w.len(), x.len()).
        let (a, b) = unsafe { (load_f32x8(w, i), load_f32x8(x, i)) };
        acc = _mm256_fmadd_ps(a, b, acc);
        i += 8;
    }
    let mut r = reduce8_tiny(acc);
    for i in main..k {
        r += w[i] * x[i];
    }
    r
}

fn q8_0_dot(row: &[u8], x: &[f32]) -> f32 {
    if row.len() < x.len() / 32 * 34 {
        return scalar::q8_0_dot(row, x);
    }
    // SAFETY: AVX2+FMA+F16C detected before this table is used; length checked.
    unsafe { q8_0_dot_impl(row, x) }
}

/// # Safety
/// AVX2, FMA available; `row.len() ≥ (x.len()/32)·34`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_dot_impl(row: &[u8], x: &[f32]) -> f32 {
    let nb = x.len() / 32;
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
        prefetch_ahead(row, 34 * b);
        let blk = &row[34 * b..34 * b + 34];
        // The block scale through F16C (exact, like half's conversion), broadcast.
        let dbits = i32::from(u16::from_le_bytes([blk[0], blk[1]]));
        let d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dbits)));
        let mut bl = _mm256_setzero_ps();
        for j in 0..4 {
            // SAFETY: 2 + 8j + 8 ≤ 34; 32b + 8j + 8 ≤ 32·nb ≤ x.len().
            let (q, xv) = unsafe {
                (
                    _mm_loadl_epi64(blk.as_ptr().add(2 + 8 * j).cast()),
                    load_f32x8(x, 32 * b + 8 * j),
                )
            };
            let qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            bl = _mm256_fmadd_ps(qf, xv, bl);
        }
        acc = _mm256_fmadd_ps(d, bl, acc);
    }
    reduce8_tiny(acc)
}

fn q4_0_dot(row: &[u8], x: &[f32]) -> f32 {
    if row.len() < x.len() / 32 * 18 {
        return scalar::q4_0_dot(row, x);
    }
    // SAFETY: AVX2+FMA+F16C detected before this table is used; length checked.
    unsafe { q4_0_dot_impl(row, x) }
}

/// # Safety
/// AVX2, FMA, F16C available; `row.len() ≥ (x.len()/32)·18`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_dot_impl(row: &[u8], x: &[f32]) -> f32 {
    let nb = x.len() / 32;
    let m4 = _mm_set1_epi8(15);
    let eight = _mm_set1_epi8(8);
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
        if b % 2 == 0 {
            prefetch_ahead(row, 18 * b);
        }
        let blk = &row[18 * b..18 * b + 18];
        let dbits = i32::from(u16::from_le_bytes([blk[0], blk[1]]));
        let d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dbits)));
        // SAFETY: bytes 2..18 of the block.
        let v = unsafe { _mm_loadu_si128(blk.as_ptr().add(2).cast()) };
        // Elements 0..16 (low nibbles) and 16..32 (high nibbles), as q − 8 in i8.
        let lo = _mm_sub_epi8(_mm_and_si128(v, m4), eight);
        let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(v), m4), eight);
        let q = [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)];
        let mut bl = _mm256_setzero_ps();
        for (j, qj) in q.iter().enumerate() {
            // SAFETY: 32b + 8j + 8 ≤ 32·nb ≤ x.len().
            let xv = unsafe { load_f32x8(x, 32 * b + 8 * j) };
            bl = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(*qj)), xv, bl);
        }
        acc = _mm256_fmadd_ps(d, bl, acc);
    }
    reduce8_tiny(acc)
}

/// A Q8_0 (or, with `Q4`, Q4_0) block at `row[wo..]`: its f16 scale's bits and its 32
/// integers as i8 (Q4_0: `nibble − 8`, elements 0..16 from the low nibbles).
///
/// # Safety
/// AVX2 available; `wo + 34` (Q4_0: `wo + 18`) ≤ `row.len()`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_q_block<const Q4: bool>(row: &[u8], wo: usize) -> (i16, __m256i) {
    // SAFETY: in bounds by the contract; unaligned reads. The scale's bits are little-endian
    // in the format, as x86 is.
    unsafe {
        let dbits = std::ptr::read_unaligned(row.as_ptr().add(wo).cast::<i16>());
        let w = if Q4 {
            let v = _mm_loadu_si128(row.as_ptr().add(wo + 2).cast());
            let m4 = _mm_set1_epi8(15);
            let lo = _mm_and_si128(v, m4);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m4);
            _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8))
        } else {
            _mm256_loadu_si256(row.as_ptr().add(wo + 2).cast())
        };
        (dbits, w)
    }
}

fn q8_0_q8(row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    // SAFETY: AVX2+FMA+F16C detected before this table is used; the kernel reads only whole
    // blocks of every slice.
    unsafe { q8_blocks_impl::<false>(row, xq, xd) }
}

fn q4_0_q8(row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    // SAFETY: as in `q8_0_q8`.
    unsafe { q8_blocks_impl::<true>(row, xq, xd) }
}

/// Q8_0 (or, with `Q4`, Q4_0) row · per-32 quantized activations in `scalar::q8_0_q8`'s
/// order. The signed products go through `maddubs(|w|, x·sign(w))`: |w| ≤ 128 fits u8, and
/// the activations' |x| ≤ 127 keeps `x·sign(w)` in i8 and each pair ≤ 2·128·127 < 2^15.
///
/// # Safety
/// AVX2, FMA and F16C available.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_blocks_impl<const Q4: bool>(row: &[u8], xq: &[i8], xd: &[f32]) -> f32 {
    let wbytes = if Q4 { 18 } else { 34 };
    let nb = (row.len() / wbytes).min(xq.len() / 32).min(xd.len());
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (b, &dx) in xd.iter().enumerate().take(nb) {
        // Every block (blocks straddle lines; one prefetch per 64 bytes would skip some).
        prefetch_ahead(row, wbytes * b);
        let wo = wbytes * b;
        // SAFETY: b < nb, so bytes wo..wo+wbytes of the row and codes 32b..32b+32 exist.
        let ((dbits, w), x) = unsafe {
            (
                load_q_block::<Q4>(row, wo),
                _mm256_loadu_si256(xq.as_ptr().add(32 * b).cast()),
            )
        };
        // The f16 scale broadcast before converting (a full-register conversion has no
        // dependency on a stale register), times the activation scale: d_w·d_x in f32.
        let dw = _mm256_cvtph_ps(_mm_set1_epi16(dbits));
        let d = _mm256_mul_ps(dw, _mm256_set1_ps(dx));
        let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        let lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        acc = _mm256_fmadd_ps(d, lanes, acc);
    }
    reduce8_tiny(acc)
}

fn q8_0_q8_multi(row: &[u8], xq: &[i8], xd: &[f32], cols: usize, out: &mut [f32]) {
    q8_multi_groups::<false>(row, xq, xd, cols, out);
}

fn q4_0_q8_multi(row: &[u8], xq: &[i8], xd: &[f32], cols: usize, out: &mut [f32]) {
    q8_multi_groups::<true>(row, xq, xd, cols, out);
}

/// Tokens in groups of up to four through [`q8_blocks_nt`]; inputs that do not hold every
/// token's codes and scales go to the scalar definition.
fn q8_multi_groups<const Q4: bool>(
    row: &[u8],
    xq: &[i8],
    xd: &[f32],
    cols: usize,
    out: &mut [f32],
) {
    let n = out.len();
    let nb = cols / 32;
    let wbytes = if Q4 { 18 } else { 34 };
    if !cols.is_multiple_of(32)
        || xq.len() < n * cols
        || xd.len() < n * nb
        || row.len() < nb * wbytes
    {
        return if Q4 {
            scalar::q4_0_q8_multi(row, xq, xd, cols, out)
        } else {
            scalar::q8_0_q8_multi(row, xq, xd, cols, out)
        };
    }
    let mut t = 0;
    while t < n {
        let g = (n - t).min(4);
        let (q, d) = (&xq[t * cols..], &xd[t * nb..]);
        // SAFETY: AVX2+FMA+F16C detected before this table is used; the row holds nb blocks
        // and tokens t..t+g have cols codes and nb scales each (checked above).
        unsafe {
            match g {
                4 => out[t..t + 4].copy_from_slice(&q8_blocks_nt::<4, Q4>(row, q, d, cols)),
                3 => out[t..t + 3].copy_from_slice(&q8_blocks_nt::<3, Q4>(row, q, d, cols)),
                2 => out[t..t + 2].copy_from_slice(&q8_blocks_nt::<2, Q4>(row, q, d, cols)),
                _ => out[t] = q8_blocks_impl::<Q4>(row, &q[..cols], &d[..nb]),
            }
        }
        t += g;
    }
}

/// [`q8_blocks_impl`] for `NT` tokens: each weight block loaded, sign-split and its scale
/// converted once; per token the same operations in the same order.
///
/// # Safety
/// AVX2, FMA, F16C available; `cols % 32 == 0`; the row holds `cols/32` blocks; `xq` holds
/// `NT·cols` codes and `xd` `NT·cols/32` scales.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // lane-parallel indexing over tokens
unsafe fn q8_blocks_nt<const NT: usize, const Q4: bool>(
    row: &[u8],
    xq: &[i8],
    xd: &[f32],
    cols: usize,
) -> [f32; NT] {
    let wbytes = if Q4 { 18 } else { 34 };
    let nb = cols / 32;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NT];
    for b in 0..nb {
        prefetch_ahead(row, wbytes * b);
        let wo = wbytes * b;
        // SAFETY: b < nb: the block's bytes exist (contract).
        let (dbits, w) = unsafe { load_q_block::<Q4>(row, wo) };
        let aw = _mm256_sign_epi8(w, w);
        let dw = _mm256_cvtph_ps(_mm_set1_epi16(dbits));
        for t in 0..NT {
            // SAFETY: token t's codes t·cols + 32b .. +32 and scale t·nb + b exist (contract).
            let (x, dx) = unsafe {
                (
                    _mm256_loadu_si256(xq.as_ptr().add(t * cols + 32 * b).cast()),
                    *xd.get_unchecked(t * nb + b),
                )
            };
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(dx));
            let p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
            let lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
            acc[t] = _mm256_fmadd_ps(d, lanes, acc[t]);
        }
    }
    let mut out = [0f32; NT];
    for t in 0..NT {
        out[t] = reduce8_tiny(acc[t]);
    }
    out
}

fn bf16_dot(row: &[u8], x: &[f32]) -> f32 {
    if row.len() < 2 * x.len() {
        return scalar::bf16_dot(row, x);
    }
    // SAFETY: AVX2+FMA detected before this table is used; length checked.
    unsafe { bf16_dot_impl(row, x) }
}

/// # Safety
/// AVX2 and FMA available; `row.len() ≥ 2·x.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_dot_impl(row: &[u8], x: &[f32]) -> f32 {
    let k = x.len();
    let main = k - k % 8;
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < main {
        // SAFETY: 2i + 16 ≤ 2·main ≤ row.len(); i + 8 ≤ x.len().
        let (h, xv) = unsafe {
            (
                _mm_loadu_si128(row.as_ptr().add(2 * i).cast()),
                load_f32x8(x, i),
            )
        };
        // bf16 → f32: the 16 bits become the high half of the f32 (exact).
        let w = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)));
        acc = _mm256_fmadd_ps(w, xv, acc);
        i += 8;
    }
    let mut r = reduce8_tiny(acc);
    for (i, &xi) in x.iter().enumerate().skip(main) {
        r += half::bf16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32() * xi;
    }
    r
}
