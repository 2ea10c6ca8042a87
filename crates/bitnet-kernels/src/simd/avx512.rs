//! AVX-512 F + BW kernels for I2_S and TQ2_0, in two tables: `TABLE` (`maddubs`) and
//! `TABLE_VNNI` (`vpdpbusd`, plus the panel GEMM of `super::panel_x86`); every other entry
//! comes from the AVX2 tier (an AVX-512 CPU has AVX2).
//!
//! ```text
//! I2_S:  one 64-byte load = blocks b, b+1; plane l (bits 7−2l..6−2l) of the low 32 bytes
//!        ↔ x[128b + 32l ..], of the high 32 bytes ↔ x[128(b+1) + 32l ..]
//! TQ2_0: one 64-byte load = qs of block b; plane l (bits 2l..2l+1) of the low half
//!        ↔ x[256b + 32l ..], of the high half ↔ x[256b + 128 + 32l ..]
//! ```
//! Without VNNI: `maddubs` (u8 code × i8 → i16 pairs, |·| ≤ 2·3·128) summed over ≤ 4 planes
//! (≤ 3072) then `madd(·, 1)` into i32; with VNNI: `dpbusd` straight into i32.
//! Both tables are compiled everywhere, selected only by runtime detection (or lowered to by
//! `BITNET_ISA`), and tested wherever the CPU has them.

use std::arch::x86_64::*;

use super::{avx2, scalar};
use crate::layout::tq2_0;
use crate::tier::Prepared;
use crate::tier::{Isa, Kernels};

pub(crate) static TABLE: Kernels = Kernels {
    isa: Isa::Avx512,
    i2s,
    i2s_clean: i2s,
    i2s_rows: avx2::TABLE_BASE.i2s_rows,
    tq2,
    f16_dot_ggml,
    f16_dot_ggml_multi,
    f16_dot_fast: f16_dot_ggml,
    f16_dot_fast_multi: f16_dot_ggml_multi,
    f16_fast_rows: None,
    ..avx2::TABLE_BASE
};

/// The AVX-512 VNNI tier: `vpdpbusd` in the per-row kernels and the panel GEMM.
pub(crate) static TABLE_VNNI: Kernels = Kernels {
    isa: Isa::Avx512Vnni,
    i2s: i2s_vnni,
    i2s_clean: i2s_vnni,
    tq2: tq2_vnni,
    i2s_panel: Some(super::panel_x86::panel_512),
    panel_tokens: super::panel_x86::TOKENS_512,
    ..TABLE
};

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

/// `[x[a..a+32], x[b..b+32]]` as one 512-bit vector.
///
/// # Safety
/// `a + 32 <= x.len()` and `b + 32 <= x.len()`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load_x2(x: &[i8], a: usize, b: usize) -> __m512i {
    debug_assert!(a + 32 <= x.len() && b + 32 <= x.len());
    // SAFETY: in bounds by the caller's contract.
    unsafe {
        let lo = _mm256_loadu_si256(x.as_ptr().add(a).cast());
        let hi = _mm256_loadu_si256(x.as_ptr().add(b).cast());
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
}

/// Four code planes of 64 bytes of weights (values 0..=3), in x order `[p0, p1, p2, p3]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn planes(w: __m512i, msb_first: bool) -> [__m512i; 4] {
    let m3 = _mm512_set1_epi8(3);
    let a = _mm512_and_si512(w, m3);
    let b = _mm512_and_si512(_mm512_srli_epi16::<2>(w), m3);
    let c = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m3);
    let d = _mm512_and_si512(_mm512_srli_epi16::<6>(w), m3);
    if msb_first {
        [d, c, b, a]
    } else {
        [a, b, c, d]
    }
}

/// `Σ planes[l] · xs[l]` added to the i32 accumulator.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn dot4(acc: __m512i, c: &[__m512i; 4], x: &[__m512i; 4]) -> __m512i {
    let s = _mm512_add_epi16(
        _mm512_add_epi16(
            _mm512_maddubs_epi16(c[0], x[0]),
            _mm512_maddubs_epi16(c[1], x[1]),
        ),
        _mm512_add_epi16(
            _mm512_maddubs_epi16(c[2], x[2]),
            _mm512_maddubs_epi16(c[3], x[3]),
        ),
    );
    _mm512_add_epi32(acc, _mm512_madd_epi16(s, _mm512_set1_epi16(1)))
}

/// VNNI form of [`dot4`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn dot4_vnni(acc: __m512i, c: &[__m512i; 4], x: &[__m512i; 4]) -> __m512i {
    let acc = _mm512_dpbusd_epi32(acc, c[0], x[0]);
    let acc = _mm512_dpbusd_epi32(acc, c[1], x[1]);
    let acc = _mm512_dpbusd_epi32(acc, c[2], x[2]);
    _mm512_dpbusd_epi32(acc, c[3], x[3])
}

/// I2_S code 11 → 01 in every pair.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn sanitize(w: __m512i) -> __m512i {
    let both = _mm512_and_si512(
        _mm512_and_si512(w, _mm512_srli_epi16::<1>(w)),
        _mm512_set1_epi8(0x55),
    );
    _mm512_xor_si512(w, _mm512_add_epi8(both, both))
}

// ---------------------------------------------------------------------------------------
// I2_S

fn i2s(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    i2s_any::<false>(w_row, p, t0, nt, out)
}

fn i2s_vnni(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    i2s_any::<true>(w_row, p, t0, nt, out)
}

/// The I2_S entry of `TABLE` (`VNNI = false`) and of `TABLE_VNNI` (`VNNI = true`).
fn i2s_any<const VNNI: bool>(
    w_row: &[u8],
    p: &Prepared<'_>,
    t0: usize,
    nt: usize,
    out: &mut [i32],
) {
    let k = p.k;
    if !k.is_multiple_of(128) || w_row.len() < k / 4 || p.x.len() < (t0 + nt) * k || out.len() < nt
    {
        return scalar::i2s(w_row, p, t0, nt, out);
    }
    // SAFETY: the tables are handed out only after runtime detection of AVX-512 F+BW (and
    // AVX2), the VNNI one (the only caller with VNNI = true) also of AVX-512 VNNI; lengths
    // checked above.
    unsafe {
        if VNNI {
            tile!(i2s_tile_vnni, nt, w_row, p, t0, out)
        } else {
            tile!(i2s_tile, nt, w_row, p, t0, out)
        }
    }
}

macro_rules! i2s_body {
    ($w_row:ident, $p:ident, $t0:ident, $out:ident, $NT:ident, $dot:ident) => {{
        let k = $p.k;
        let xs: [&[i8]; $NT] = std::array::from_fn(|i| $p.token($t0 + i));
        let mut acc = [_mm512_setzero_si512(); $NT];
        let nblk = k / 128;
        let mut b = 0;
        while b + 2 <= nblk {
            avx2::prefetch_ahead($w_row, 32 * b);
            // SAFETY: 32b + 64 ≤ K/4 ≤ w_row.len().
            let w = sanitize(unsafe { _mm512_loadu_si512($w_row.as_ptr().add(32 * b).cast()) });
            let c = planes(w, true);
            for (t, x) in xs.iter().enumerate() {
                let o = 128 * b;
                // SAFETY: o + 256 ≤ K.
                let xv = unsafe {
                    [
                        load_x2(x, o, o + 128),
                        load_x2(x, o + 32, o + 160),
                        load_x2(x, o + 64, o + 192),
                        load_x2(x, o + 96, o + 224),
                    ]
                };
                acc[t] = $dot(acc[t], &c, &xv);
            }
            b += 2;
        }
        for t in 0..$NT {
            $out[t] = _mm512_reduce_add_epi32(acc[t]);
        }
        if b < nblk {
            // One odd block left: the AVX2 kernel on a one-block slice view.
            let mut tail = [0i32; 4];
            for t in 0..$NT {
                // SAFETY: AVX-512 F implies AVX2; the slices have 32 and 128 elements.
                tail[t] = unsafe {
                    avx2::i2s_block(&$w_row[32 * b..32 * b + 32], &xs[t][128 * b..128 * b + 128])
                };
            }
            for t in 0..$NT {
                $out[t] += tail[t];
            }
        }
    }};
}

/// # Safety
/// AVX-512 F+BW available; `w_row.len() ≥ K/4`; tokens exist; `out.len() ≥ NT`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn i2s_tile<const NT: usize>(w_row: &[u8], p: &Prepared<'_>, t0: usize, out: &mut [i32]) {
    i2s_body!(w_row, p, t0, out, NT, dot4)
}

/// # Safety
/// As [`i2s_tile`], plus AVX-512 VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn i2s_tile_vnni<const NT: usize>(
    w_row: &[u8],
    p: &Prepared<'_>,
    t0: usize,
    out: &mut [i32],
) {
    i2s_body!(w_row, p, t0, out, NT, dot4_vnni)
}

// ---------------------------------------------------------------------------------------
// TQ2_0

fn tq2(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    tq2_any::<false>(w_row, p, t0, nt, out)
}

fn tq2_vnni(w_row: &[u8], p: &Prepared<'_>, t0: usize, nt: usize, out: &mut [i32]) {
    tq2_any::<true>(w_row, p, t0, nt, out)
}

/// The TQ2_0 entry of `TABLE` and (`VNNI = true`) of `TABLE_VNNI`.
fn tq2_any<const VNNI: bool>(
    w_row: &[u8],
    p: &Prepared<'_>,
    t0: usize,
    nt: usize,
    out: &mut [i32],
) {
    let k = p.k;
    let nb = k / 256;
    if !k.is_multiple_of(256)
        || w_row.len() < nb * tq2_0::BLOCK_BYTES
        || p.x.len() < (t0 + nt) * k
        || out.len() < nt * nb
    {
        return scalar::tq2(w_row, p, t0, nt, out);
    }
    // SAFETY: as in `i2s_any`.
    unsafe {
        if VNNI {
            tile!(tq2_tile_vnni, nt, w_row, p, t0, out)
        } else {
            tile!(tq2_tile, nt, w_row, p, t0, out)
        }
    }
}

macro_rules! tq2_body {
    ($w_row:ident, $p:ident, $t0:ident, $out:ident, $NT:ident, $dot:ident) => {{
        let nb = $p.k / 256;
        let xs: [&[i8]; $NT] = std::array::from_fn(|i| $p.token($t0 + i));
        for b in 0..nb {
            let wp = $w_row[b * tq2_0::BLOCK_BYTES..].as_ptr();
            // SAFETY: 66b + 64 ≤ 66·nb ≤ w_row.len().
            let w = unsafe { _mm512_loadu_si512(wp.cast()) };
            let c = planes(w, false);
            for (t, x) in xs.iter().enumerate() {
                let o = 256 * b;
                // SAFETY: o + 256 ≤ K.
                let xv = unsafe {
                    [
                        load_x2(x, o, o + 128),
                        load_x2(x, o + 32, o + 160),
                        load_x2(x, o + 64, o + 192),
                        load_x2(x, o + 96, o + 224),
                    ]
                };
                $out[t * nb + b] = _mm512_reduce_add_epi32($dot(_mm512_setzero_si512(), &c, &xv));
            }
        }
    }};
}

/// # Safety
/// AVX-512 F+BW available; the row holds K/256 blocks; tokens exist; `out.len() ≥ NT·K/256`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn tq2_tile<const NT: usize>(w_row: &[u8], p: &Prepared<'_>, t0: usize, out: &mut [i32]) {
    tq2_body!(w_row, p, t0, out, NT, dot4)
}

/// # Safety
/// As [`tq2_tile`], plus AVX-512 VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tq2_tile_vnni<const NT: usize>(
    w_row: &[u8],
    p: &Prepared<'_>,
    t0: usize,
    out: &mut [i32],
) {
    tq2_body!(w_row, p, t0, out, NT, dot4_vnni)
}

// ---------------------------------------------------------------------------------------
// F16 rows · f32 activations in ggml's order (`ggml_vec_dot_f16`), 16 lanes at a time
//
// ggml keeps four 8-lane accumulators over chunks of 32; here accumulators 0|1 share one
// 512-bit register and 2|3 another, so each chunk takes two conversions and two FMAs instead
// of four, with the same lane-wise operations; the reduction then splits the registers back
// into the four 8-lane sums and adds them in ggml's order: identical bits to the AVX2 and
// scalar forms.

fn f16_dot_ggml(row: &[u8], x: &[f32]) -> f32 {
    if row.len() < 2 * x.len() {
        return scalar::f16_dot_ggml(row, x);
    }
    // SAFETY: this table is handed out only after runtime detection of AVX-512 F+BW and
    // the AVX2 tier (FMA, F16C); length checked.
    unsafe { f16_dot_ggml_nt::<1>(row, [x])[0] }
}

/// Bytes added to the AVX2 prefetch distance in the F16 row kernels.
const HEAD_PREFETCH_EXTRA: usize = 3072;

/// Tokens per pass of [`f16_dot_ggml_multi`] (sixteen accumulator registers).
const MULTI_TOKENS: usize = 8;

/// Every row, tokens in passes of up to eight sharing each converted chunk, when a pass's
/// activations fit in the L1 data cache (two rows per pass sharing the activation loads, and
/// walking the columns in chunks across a block of rows, both measured slower on Zen 5,
/// 48 KiB L1D, at four tokens). When they do not, every row would stream them from L2, and
/// [`f16_dot_ggml_blocked`], which keeps a group's activation chunks in L1, is faster (same
/// bits): on Zen 4 (32 KiB L1D), LM head 128256×2560 × 4 tokens, 1 thread 83.3 → 61.4 ms
/// with the AVX2 tier's walk, then ≈ 40 ms with this tier's two-row walk and its next-block
/// prefetch into L2 rather than L1.
fn f16_dot_ggml_multi(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    let n_tok = xs.len();
    if n_tok == 0 || row_bytes == 0 {
        return;
    }
    let n_rows = rows.len() / row_bytes;
    let k = xs[0].len();
    if !avx2::multi_shape_ok(row_bytes, n_rows, xs, out) {
        return scalar::f16_dot_ggml_multi(rows, row_bytes, xs, out);
    }
    let pass_bytes = n_tok.min(MULTI_TOKENS).saturating_mul(k).saturating_mul(4);
    if pass_bytes > crate::cpu::l1d_bytes() {
        return f16_dot_ggml_blocked(rows, row_bytes, xs, out);
    }
    for (row, o) in rows
        .chunks_exact(row_bytes)
        .zip(out.chunks_exact_mut(n_tok))
    {
        let mut t0 = 0;
        while t0 < n_tok {
            let g = (n_tok - t0).min(MULTI_TOKENS);
            macro_rules! go {
                ($nt:literal) => {{
                    let a: [&[f32]; $nt] = std::array::from_fn(|i| xs[t0 + i]);
                    // SAFETY: this table is handed out only after runtime detection of
                    // AVX-512 F+BW and the AVX2 tier (FMA, F16C); every token has length
                    // k ≤ row_bytes / 2.
                    let r = unsafe { f16_dot_ggml_nt::<$nt>(row, a) };
                    o[t0..t0 + $nt].copy_from_slice(&r);
                }};
            }
            match g {
                1 => go!(1),
                2 => go!(2),
                3 => go!(3),
                4 => go!(4),
                5 => go!(5),
                6 => go!(6),
                7 => go!(7),
                _ => go!(8),
            }
            t0 += g;
        }
    }
}

/// Rows per block of [`f16_dot_ggml_blocked`].
const BLOCK_ROWS: usize = 8;
/// Columns per chunk of [`f16_dot_ggml_blocked`] (a multiple of 32).
const BLOCK_COLS: usize = 512;
/// Tokens per group of [`f16_dot_ggml_blocked`].
const BLOCK_TOKENS: usize = 4;

/// The multi-token F16 product when a pass's activations do not fit the L1 data cache: rows
/// in blocks of [`BLOCK_ROWS`] walked in column chunks of [`BLOCK_COLS`] (a group's
/// activation chunks, 8 KiB at four tokens, stay in L1 across the block), two rows at a time
/// sharing each activation load, tokens in groups of up to [`BLOCK_TOKENS`] sharing each
/// converted weight chunk. Accumulators live in memory between column chunks; each sums the
/// same products in the same order as [`f16_dot_ggml_nt`] (identical bits).
fn f16_dot_ggml_blocked(rows: &[u8], row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    let n_tok = xs.len();
    avx2::for_block_groups(
        rows,
        row_bytes,
        n_tok,
        out,
        BLOCK_ROWS,
        BLOCK_TOKENS,
        |block, ob, t, g| {
            // SAFETY: this table is handed out only after runtime detection of AVX-512 F+BW and
            // the AVX2 tier (FMA, F16C); the caller checked the shape (`multi_shape_ok`): every
            // token has length k ≤ row_bytes / 2, and `ob` holds n_tok outputs per row.
            unsafe {
                match g {
                    4 => block2r::<4>(block, row_bytes, std::array::from_fn(|i| xs[t + i]), ob, t),
                    3 => block2r::<3>(block, row_bytes, std::array::from_fn(|i| xs[t + i]), ob, t),
                    2 => block2r::<2>(block, row_bytes, std::array::from_fn(|i| xs[t + i]), ob, t),
                    _ => block2r::<1>(block, row_bytes, [xs[t]], ob, t),
                }
            }
        },
    );
}

/// One block of rows (at most [`BLOCK_ROWS`]) times `NT` tokens, rows in pairs: writes
/// `out[r·n + t0 + t]` (`n = out.len() / rows`) for row r and token t. While it runs it asks
/// for the next block's bytes into L2, one cache line per row and 32 columns (a block of 8
/// rows of 2,560 columns is 40 KiB: into a 32 KiB L1 it evicted the lines in use; Zen 4, head
/// × 4 tokens, 1 thread: 62 → 45 ms), and for the next pair's lines of the chunk into L1
/// (45 → 40 ms).
///
/// # Safety
/// AVX-512 F, AVX2, FMA and F16C available; every `xs[t].len() == k`, `rb ≥ 2k`, `block`
/// whole rows, `out.len()` the row count times the outputs per row, at least `t0 + NT`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // lane-parallel indexing over tokens and accumulators
unsafe fn block2r<const NT: usize>(
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
    // acc[r][t][0] = ggml accumulators 0|1 of row r, token t; [1] = 2|3.
    let mut acc = [[[_mm512_setzero_ps(); 2]; NT]; BLOCK_ROWS];
    let next = block.as_ptr().wrapping_add(block.len());
    let mut ahead = 0usize;
    let mut c0 = 0;
    while c0 < main {
        let c1 = (c0 + BLOCK_COLS).min(main);
        let mut r = 0;
        while r < nr {
            let pair = r + 1 < nr;
            let ra = block[r * rb..(r + 1) * rb].as_ptr();
            // The second row of the pair; a lone last row reads itself again and drops it.
            let r2 = if pair { r + 1 } else { r };
            let rb2 = block[r2 * rb..(r2 + 1) * rb].as_ptr();
            let (mut a0, mut a1) = (acc[r], acc[r2]);
            let mut c = c0;
            while c < c1 {
                for _ in 0..2 {
                    // A prefetch never faults, whatever the address (formed with
                    // wrapping_add, never dereferenced).
                    _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(ahead).cast());
                    ahead += 64;
                }
                // The next pair's lines of this chunk, from L2 into L1 (never faults).
                _mm_prefetch::<_MM_HINT_T0>(ra.wrapping_add(2 * rb + 2 * c).cast());
                _mm_prefetch::<_MM_HINT_T0>(ra.wrapping_add(3 * rb + 2 * c).cast());
                for h in 0..2 {
                    let i = c + 16 * h;
                    // SAFETY: i + 16 ≤ main ≤ k ≤ rb / 2 for both rows, and i + 16 ≤ k =
                    // xs[t].len(): the caller's contract.
                    unsafe {
                        let w0 = _mm512_cvtph_ps(_mm256_loadu_si256(ra.add(2 * i).cast()));
                        let w1 = _mm512_cvtph_ps(_mm256_loadu_si256(rb2.add(2 * i).cast()));
                        for t in 0..NT {
                            let xv = _mm512_loadu_ps(xs[t].as_ptr().add(i));
                            a0[t][h] = _mm512_fmadd_ps(w0, xv, a0[t][h]);
                            a1[t][h] = _mm512_fmadd_ps(w1, xv, a1[t][h]);
                        }
                    }
                }
                c += 32;
            }
            acc[r] = a0;
            if pair {
                acc[r + 1] = a1;
            }
            r += 2;
        }
        c0 = c1;
    }
    for r in 0..nr {
        let row = &block[r * rb..(r + 1) * rb];
        for t in 0..NT {
            // SAFETY: this function's features include finish_ggml's.
            out[r * n + t0 + t] = unsafe { finish_ggml(acc[r][t], row, xs[t], main) };
        }
    }
}

/// ggml's reduction of accumulators 0|1 and 2|3, then the leftover columns past `main` in f64.
/// Inlined into its caller, which enables the features (a call would pass the registers
/// through memory).
///
/// # Safety
/// AVX-512 F, AVX2 and F16C are available.
#[inline(always)]
unsafe fn finish_ggml(acc: [__m512; 2], row: &[u8], x: &[f32], main: usize) -> f32 {
    let [a01, a23] = acc;
    // SAFETY: the features are enabled by the caller (the contract above).
    let h = unsafe {
        // (a0 + a2) + (a1 + a3), as 8-lane vectors.
        let s02 = _mm256_add_ps(_mm512_castps512_ps256(a01), _mm512_castps512_ps256(a23));
        let s13 = _mm256_add_ps(ext_hi(a01), ext_hi(a23));
        let a = _mm256_add_ps(s02, s13);
        let v = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let h = _mm_hadd_ps(v, v);
        _mm_cvtss_f32(_mm_hadd_ps(h, h))
    };
    let mut sum = f64::from(h);
    for (i, &xi) in x.iter().enumerate().skip(main) {
        let w = half::f16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32();
        sum += f64::from(w * xi);
    }
    #[allow(clippy::cast_possible_truncation)] // f64 -> f32 rounding is the defined result
    let r = sum as f32;
    r
}

/// # Safety
/// AVX-512 F, AVX2, FMA and F16C available; every `xs[t].len() == k` and `row.len() ≥ 2k`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // lane-parallel indexing over tokens
unsafe fn f16_dot_ggml_nt<const NT: usize>(row: &[u8], xs: [&[f32]; NT]) -> [f32; NT] {
    let k = xs[0].len();
    let main = k - k % 32;
    // acc[t][0] = ggml accumulators 0|1, acc[t][1] = 2|3.
    let mut acc = [[_mm512_setzero_ps(); 2]; NT];
    let mut c = 0;
    while c < main {
        // 6 KiB ahead (twice the AVX2 kernels' distance): one thread then reads the F16 head
        // at 98 % of a plain read here, against 84 % at 3 KiB.
        avx2::prefetch_ahead(row, 2 * c + HEAD_PREFETCH_EXTRA);
        if NT == 1 {
            avx2::prefetch_l2_ahead(row, 2 * c);
        }
        for h in 0..2 {
            let i = c + 16 * h;
            // SAFETY: i + 16 ≤ main ≤ k ≤ row.len() / 2.
            let w = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(row.as_ptr().add(2 * i).cast())) };
            for t in 0..NT {
                // SAFETY: i + 16 ≤ k = xs[t].len().
                let xv = unsafe { _mm512_loadu_ps(xs[t].as_ptr().add(i)) };
                acc[t][h] = _mm512_fmadd_ps(w, xv, acc[t][h]);
            }
        }
        c += 32;
    }
    let mut out = [0f32; NT];
    for t in 0..NT {
        // SAFETY: this function's features include finish_ggml's.
        out[t] = unsafe { finish_ggml(acc[t], row, xs[t], main) };
    }
    out
}

/// The upper eight lanes of a 512-bit float vector.
#[inline]
#[target_feature(enable = "avx512f")]
fn ext_hi(v: __m512) -> __m256 {
    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)))
}
