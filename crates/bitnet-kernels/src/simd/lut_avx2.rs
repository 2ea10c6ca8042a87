//! The table-lookup GEMM (`crate::lut`) on AVX2: `vpshufb` lookups into per-token pair tables.
//!
//! On Zen 3 both `vpmaddubsw` and `vpshufb` issue twice per cycle (measured). The lookup needs
//! neither the planes' decoding nor the activations' broadcasts of the `maddubs` kernel, but
//! it reads 16 bytes of table per pair and token and 2 bytes of index words per pair and row
//! from L2, where the panels read a quarter byte per weight: with the tables and index words
//! of the tile hot it runs about 1.2× the panel kernel, in a whole matmul it ties at 128
//! tokens and loses below.

use std::arch::x86_64::*;

use crate::lut::{PairIdx, PairTable, LUT_PANELS, LUT_TOKENS, NIBBLE_HI, NIBBLE_LO, WIDEN_PAIRS};
use crate::panel::{PanelGroup, GROUP_COLS, PANEL_ROWS};

/// AVX2 [`crate::lut::TableBuilder`]: a group's 16 activations widened to i16, split into
/// the pairs' first and second values, the eight entries computed side by side for the
/// group's eight pairs, then transposed to one table per pair.
pub(crate) fn tables(x: &[i8], k: usize, t0: usize, nt: usize, out: &mut [PairTable]) {
    let npairs = k / 2;
    if !k.is_multiple_of(GROUP_COLS) || x.len() < (t0 + nt) * k || out.len() < nt * npairs {
        return crate::lut::tables_plain(x, k, t0, nt, out);
    }
    // SAFETY: the tier's table is handed out only after runtime detection of AVX2; shapes
    // checked above.
    unsafe { tables_impl(x, k, t0, nt, out) }
}

/// # Safety
/// AVX2 available; `k` a multiple of 16, `x.len() ≥ (t0 + nt)·k`, `out.len() ≥ nt·k/2`.
#[target_feature(enable = "avx2")]
unsafe fn tables_impl(x: &[i8], k: usize, t0: usize, nt: usize, out: &mut [PairTable]) {
    let npairs = k / 2;
    for ti in 0..nt {
        for g in 0..k / GROUP_COLS {
            // SAFETY: (t0 + ti)·k + 16g + 16 ≤ x.len() by the contract.
            let (lo, hi) = unsafe {
                let p = x.as_ptr().add((t0 + ti) * k + GROUP_COLS * g);
                (
                    _mm_cvtepi8_epi16(_mm_loadl_epi64(p.cast())),
                    _mm_cvtepi8_epi16(_mm_loadl_epi64(p.add(8).cast())),
                )
            };
            // Pair 2b + h takes columns 8h + b and 8h + b + 4.
            let a0 = _mm_unpacklo_epi16(lo, hi);
            let a1 = _mm_unpackhi_epi16(lo, hi);
            let z = _mm_setzero_si128();
            let s = _mm_add_epi16(a0, a1);
            let d = _mm_sub_epi16(a0, a1);
            let r = [
                a0,
                _mm_sub_epi16(z, a0),
                a1,
                _mm_sub_epi16(z, a1),
                s,
                _mm_sub_epi16(z, s),
                d,
                _mm_sub_epi16(z, d),
            ];
            let s0 = _mm_unpacklo_epi16(r[0], r[1]);
            let s1 = _mm_unpackhi_epi16(r[0], r[1]);
            let s2 = _mm_unpacklo_epi16(r[2], r[3]);
            let s3 = _mm_unpackhi_epi16(r[2], r[3]);
            let s4 = _mm_unpacklo_epi16(r[4], r[5]);
            let s5 = _mm_unpackhi_epi16(r[4], r[5]);
            let s6 = _mm_unpacklo_epi16(r[6], r[7]);
            let s7 = _mm_unpackhi_epi16(r[6], r[7]);
            let u0 = _mm_unpacklo_epi32(s0, s2);
            let u1 = _mm_unpackhi_epi32(s0, s2);
            let u2 = _mm_unpacklo_epi32(s1, s3);
            let u3 = _mm_unpackhi_epi32(s1, s3);
            let u4 = _mm_unpacklo_epi32(s4, s6);
            let u5 = _mm_unpackhi_epi32(s4, s6);
            let u6 = _mm_unpacklo_epi32(s5, s7);
            let u7 = _mm_unpackhi_epi32(s5, s7);
            let v = [
                _mm_unpacklo_epi64(u0, u4),
                _mm_unpackhi_epi64(u0, u4),
                _mm_unpacklo_epi64(u1, u5),
                _mm_unpackhi_epi64(u1, u5),
                _mm_unpacklo_epi64(u2, u6),
                _mm_unpackhi_epi64(u2, u6),
                _mm_unpacklo_epi64(u3, u7),
                _mm_unpackhi_epi64(u3, u7),
            ];
            let base = ti * npairs + 8 * g;
            for (q, vq) in v.iter().enumerate() {
                // SAFETY: base + q < nt·npairs ≤ out.len(); a PairTable is 16-byte aligned.
                unsafe { _mm_store_si128(out.as_mut_ptr().add(base + q).cast(), *vq) };
            }
        }
    }
}

/// AVX2 [`crate::lut::Expander`]: per group, the 16 rows' bytes gathered by byte position
/// (a shuffle and a 4 × 4 transpose of dwords), split into nibbles, and each nibble mapped to
/// its index word's two bytes by two shuffles.
pub(crate) fn expand(w: &[PanelGroup], gpp: usize, out: &mut [PairIdx]) {
    let np = w.len().checked_div(gpp).unwrap_or(0);
    if gpp == 0 || w.len() != np * gpp || out.len() < np * gpp * 8 {
        return crate::lut::expand_plain(w, gpp, out);
    }
    // SAFETY: AVX2 detected before this tier's table is handed out; shapes checked above.
    unsafe { expand_impl(w, gpp, np, out) }
}

/// # Safety
/// AVX2 available; `w.len() = np·gpp`, `out.len() ≥ np·gpp·8`.
#[target_feature(enable = "avx2")]
unsafe fn expand_impl(w: &[PanelGroup], gpp: usize, np: usize, out: &mut [PairIdx]) {
    let gather = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    // SAFETY: 16-byte tables read whole.
    let (map_lo, map_hi) = unsafe {
        (
            _mm_loadu_si128(NIBBLE_LO.as_ptr().cast()),
            _mm_loadu_si128(NIBBLE_HI.as_ptr().cast()),
        )
    };
    let m15 = _mm_set1_epi8(15);
    for pi in 0..np {
        for g in 0..gpp {
            let gp = w[pi * gpp + g].0.as_ptr();
            // SAFETY: a group is 64 bytes.
            // (No closures here: they would not inherit this function's target features.)
            let xs = unsafe {
                [
                    _mm_shuffle_epi8(_mm_loadu_si128(gp.cast()), gather),
                    _mm_shuffle_epi8(_mm_loadu_si128(gp.add(16).cast()), gather),
                    _mm_shuffle_epi8(_mm_loadu_si128(gp.add(32).cast()), gather),
                    _mm_shuffle_epi8(_mm_loadu_si128(gp.add(48).cast()), gather),
                ]
            };
            let t0 = _mm_unpacklo_epi32(xs[0], xs[1]);
            let t1 = _mm_unpacklo_epi32(xs[2], xs[3]);
            let t2 = _mm_unpackhi_epi32(xs[0], xs[1]);
            let t3 = _mm_unpackhi_epi32(xs[2], xs[3]);
            // by_b[b] = byte b of rows 0..15.
            let by_b = [
                _mm_unpacklo_epi64(t0, t1),
                _mm_unpackhi_epi64(t0, t1),
                _mm_unpacklo_epi64(t2, t3),
                _mm_unpackhi_epi64(t2, t3),
            ];
            for (b, &v) in by_b.iter().enumerate() {
                let nibbles = [
                    _mm_and_si128(v, m15),
                    _mm_and_si128(_mm_srli_epi16::<4>(v), m15),
                ];
                for (h, &n) in nibbles.iter().enumerate() {
                    let lo = _mm_shuffle_epi8(map_lo, n);
                    let hi = _mm_shuffle_epi8(map_hi, n);
                    let q = 8 * g + 2 * b + h;
                    let dst = out[q * np + pi].0.as_mut_ptr();
                    // SAFETY: a PairIdx is 16 words; rows 0..7 then 8..15.
                    unsafe {
                        _mm_storeu_si128(dst.cast(), _mm_unpacklo_epi8(lo, hi));
                        _mm_storeu_si128(dst.add(8).cast(), _mm_unpackhi_epi8(lo, hi));
                    }
                }
            }
        }
    }
}

/// Table prefetch distance, in pairs (16 bytes each).
const PF_PAIRS: usize = 16;

/// AVX2 [`crate::lut::LutKernel`].
pub(crate) fn kernel(
    idx: &[PairIdx],
    np: usize,
    tables: &[PairTable],
    npairs: usize,
    nt: usize,
    out: &mut [i32],
) {
    let ok = (1..=LUT_PANELS).contains(&np)
        && (1..=LUT_TOKENS).contains(&nt)
        && idx.len() >= npairs * np
        && tables.len() >= nt * npairs
        && out.len() >= nt * PANEL_ROWS * np;
    if !ok {
        return crate::lut::kernel_plain(idx, np, tables, npairs, nt, out);
    }
    // SAFETY: AVX2 detected before this tier's table is handed out; shapes checked above.
    unsafe {
        match (np, nt) {
            (1, 1) => tile::<1, 1>(idx, tables, npairs, out),
            (1, 2) => tile::<1, 2>(idx, tables, npairs, out),
            (1, 3) => tile::<1, 3>(idx, tables, npairs, out),
            (1, _) => tile::<1, 4>(idx, tables, npairs, out),
            (_, 1) => tile::<2, 1>(idx, tables, npairs, out),
            (_, 2) => tile::<2, 2>(idx, tables, npairs, out),
            (_, 3) => tile::<2, 3>(idx, tables, npairs, out),
            _ => tile::<2, 4>(idx, tables, npairs, out),
        }
    }
}

/// `NP` panels × `NT` tokens: i16 sums in registers, widened into i32 totals every
/// [`WIDEN_PAIRS`] pairs.
///
/// # Safety
/// AVX2 available; `idx.len() ≥ npairs·NP`, `tables.len() ≥ NT·npairs`,
/// `out.len() ≥ NT·16·NP`.
#[target_feature(enable = "avx2")]
unsafe fn tile<const NP: usize, const NT: usize>(
    idx: &[PairIdx],
    tables: &[PairTable],
    npairs: usize,
    out: &mut [i32],
) {
    let mut tot = [[[0i32; PANEL_ROWS]; NP]; NT];
    let ip = idx.as_ptr();
    let tp = tables.as_ptr();
    let mut q0 = 0;
    while q0 < npairs {
        let q1 = (q0 + WIDEN_PAIRS).min(npairs);
        let mut acc = [[_mm256_setzero_si256(); NP]; NT];
        for q in q0..q1 {
            let mut iv = [_mm256_setzero_si256(); NP];
            for (pi, v) in iv.iter_mut().enumerate() {
                // SAFETY: q·NP + pi < npairs·NP ≤ idx.len(); PairIdx is 32-byte aligned.
                *v = unsafe { _mm256_load_si256(ip.add(q * NP + pi).cast()) };
            }
            if q % 4 == 0 {
                for t in 0..NT {
                    // PREFETCHT0 never faults; the address is formed with `wrapping_add`.
                    _mm_prefetch::<_MM_HINT_T0>(tp.wrapping_add(t * npairs + q + PF_PAIRS).cast());
                }
            }
            for (t, at) in acc.iter_mut().enumerate() {
                // SAFETY: t·npairs + q < NT·npairs ≤ tables.len(); PairTable is 16 bytes.
                let tb = unsafe {
                    _mm256_broadcastsi128_si256(_mm_load_si128(tp.add(t * npairs + q).cast()))
                };
                for (a, &v) in at.iter_mut().zip(&iv) {
                    *a = _mm256_add_epi16(*a, _mm256_shuffle_epi8(tb, v));
                }
            }
        }
        for (tt, at) in tot.iter_mut().zip(&acc) {
            for (tp_, &a) in tt.iter_mut().zip(at) {
                let p = tp_.as_mut_ptr();
                let lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a));
                let hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(a));
                // SAFETY: 16 i32 per (token, panel).
                unsafe {
                    _mm256_storeu_si256(
                        p.cast(),
                        _mm256_add_epi32(_mm256_loadu_si256(p.cast()), lo),
                    );
                    _mm256_storeu_si256(
                        p.add(8).cast(),
                        _mm256_add_epi32(_mm256_loadu_si256(p.add(8).cast()), hi),
                    );
                }
            }
        }
        q0 = q1;
    }
    for (t, tt) in tot.iter().enumerate() {
        for (pi, rows) in tt.iter().enumerate() {
            let o = t * PANEL_ROWS * NP + PANEL_ROWS * pi;
            out[o..o + PANEL_ROWS].copy_from_slice(rows);
        }
    }
}
