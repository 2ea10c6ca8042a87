//! The panel GEMM (`crate::panel`): on `vpdpbusd` with AVX-512 VNNI (16 rows per register)
//! and AVX-VNNI (8 rows per register, for 256-bit hosts), and on `vpmaddubsw` + `vpmaddwd`
//! with plain AVX2 (the tiers without VNNI: Zen 1–3, Haswell to Skylake, and AVX-512 CPUs
//! without VNNI).
//!
//! Register blocking: P panels (16·P rows) × NT tokens of i32 accumulators. Per group of 16
//! columns, each panel's 64 bytes are loaded once and split into four planes (shift, and);
//! each plane meets each token's four activation bytes, broadcast to every lane, in one
//! `vpdpbusd` per accumulator register. Up to `SMALL_BATCH` tokens (decode, batched decode)
//! go one panel at a time, so the weights stream from memory in address order, with one
//! accumulator per (token, plane) so that no `vpdpbusd` waits on the previous one's result.
//! The weights are prefetched `PF_GROUPS` groups ahead (and, in the AVX-512 decode kernel,
//! `PF_L2_GROUPS` ahead into L2 as well).

use std::arch::x86_64::*;

use crate::panel::{PanelGroup, PANEL_ROWS};

/// Prefetch distance in groups (64 bytes each): 4 KiB ahead.
const PF_GROUPS: usize = 64;

/// A second, farther prefetch for the AVX-512 decode kernel, into L2: 16 KiB ahead. On Zen 4,
/// tg64 of the 2B model at 1 thread went from 14.0–14.3 to 15.0–15.4 tok/s (three alternating
/// pairs), and at 2 threads it was 1–5 % ahead in three pairs; 8 and 32 KiB were no better.
const PF_L2_GROUPS: usize = 256;

/// Token counts up to this run one panel at a time (weights streamed from memory).
const SMALL_BATCH: usize = 4;

/// Largest token tile of the AVX-512 kernel (2 panels × 8 tokens = 16 accumulators).
pub(crate) const TOKENS_512: usize = 8;
/// Largest token tile of the AVX-VNNI kernel (2 halves × 4 tokens = 8 accumulators).
pub(crate) const TOKENS_256: usize = 4;
/// Token tile of the AVX2 kernel (one pass over each panel for all of them: 2 halves × 4
/// tokens of i16 partial sums in registers).
pub(crate) const TOKENS_AVX2: usize = 4;

/// Token `t`'s four activation bytes at column `c`, as one i32 for a broadcast.
///
/// # Safety
/// `x + t·k + c + 4` is within the caller's activation slice.
#[inline(always)]
unsafe fn x4(x: *const i8, k: usize, t: usize, c: usize) -> i32 {
    // SAFETY: in bounds by the caller's contract; unaligned reads are allowed.
    unsafe { std::ptr::read_unaligned(x.add(t * k + c).cast::<i32>()) }
}

#[inline(always)]
fn prefetch(p: *const PanelGroup) {
    // SAFETY: SSE is part of the x86_64 baseline; PREFETCHT0 never faults, and the address
    // is formed with `wrapping_add` and never dereferenced.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PF_GROUPS).cast()) }
}

#[inline(always)]
fn prefetch_l2(p: *const PanelGroup) {
    // SAFETY: as in `prefetch`: PREFETCHT1 never faults, and the address is never
    // dereferenced.
    unsafe { _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(PF_L2_GROUPS).cast()) }
}

/// Checks shared by the kernels; true when the SIMD kernel may run.
fn shape_ok(
    w: &[PanelGroup],
    gpp: usize,
    x: &[i8],
    k: usize,
    t0: usize,
    nt: usize,
    out: &[i32],
) -> bool {
    let np = w.len().checked_div(gpp).unwrap_or(0);
    gpp > 0
        && k == 16 * gpp
        && (np == 1 || np == 2)
        && w.len() == np * gpp
        && x.len() >= (t0 + nt) * k
        && out.len() >= nt * PANEL_ROWS * np
}

// ---------------------------------------------------------------------------------------
// AVX-512 VNNI

/// AVX-512 VNNI panel kernel (see `crate::tier::PanelKernel`).
pub(crate) fn panel_512(
    w: &[PanelGroup],
    gpp: usize,
    x: &[i8],
    k: usize,
    t0: usize,
    nt: usize,
    out: &mut [i32],
) {
    if nt == 0 {
        return;
    }
    if !shape_ok(w, gpp, x, k, t0, nt, out) || nt > TOKENS_512 {
        return crate::panel::scalar_kernel(w, gpp, x, k, t0, nt, out);
    }
    let np = w.len() / gpp;
    // SAFETY: this kernel is only in the AVX-512 VNNI table, handed out after runtime
    // detection of avx512f, avx512bw and avx512vnni; shapes checked above.
    unsafe {
        macro_rules! go {
            ($p:literal) => {
                match nt {
                    5 => tile512::<$p, 5>(w, gpp, x, k, t0, out),
                    6 => tile512::<$p, 6>(w, gpp, x, k, t0, out),
                    7 => tile512::<$p, 7>(w, gpp, x, k, t0, out),
                    _ => tile512::<$p, 8>(w, gpp, x, k, t0, out),
                }
            };
        }
        if nt <= SMALL_BATCH {
            // Decode and small batches stream the weights from memory: one panel at a time
            // (one stream), into a buffer laid out for one panel, then into place.
            let mut tmp = [0i32; 16 * SMALL_BATCH];
            for pi in 0..np {
                let pw = &w[pi * gpp..(pi + 1) * gpp];
                match nt {
                    1 => small512::<1>(pw, gpp, x, k, t0, &mut tmp),
                    2 => small512::<2>(pw, gpp, x, k, t0, &mut tmp),
                    3 => small512::<3>(pw, gpp, x, k, t0, &mut tmp),
                    _ => small512::<4>(pw, gpp, x, k, t0, &mut tmp),
                }
                for ti in 0..nt {
                    out[ti * 16 * np + 16 * pi..][..16].copy_from_slice(&tmp[ti * 16..][..16]);
                }
            }
        } else if np == 2 {
            go!(2)
        } else {
            go!(1)
        }
    }
}

/// # Safety
/// AVX-512 F, BW and VNNI available; `w` holds `P·gpp` groups; `x` holds tokens
/// `t0 .. t0+NT` of `k = 16·gpp` bytes; `out.len() ≥ NT·16·P`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile512<const P: usize, const NT: usize>(
    w: &[PanelGroup],
    gpp: usize,
    x: &[i8],
    k: usize,
    t0: usize,
    out: &mut [i32],
) {
    debug_assert!(w.len() == P * gpp && x.len() >= (t0 + NT) * k && out.len() >= NT * 16 * P);
    let m3 = _mm512_set1_epi8(3);
    let mut acc = [[_mm512_setzero_si512(); NT]; P];
    let wp = w.as_ptr();
    // Pointer arithmetic below: group `pi·gpp + g` is within `w` for g < gpp; columns
    // 16g + 4s + 4 ≤ k.
    // SAFETY: `t0·k ≤ x.len()` by the contract.
    let xp = unsafe { x.as_ptr().add(t0 * k) };
    for g in 0..gpp {
        let mut v = [_mm512_setzero_si512(); P];
        for (pi, vp) in v.iter_mut().enumerate() {
            // SAFETY: pi·gpp + g < P·gpp = w.len().
            let gp = unsafe { wp.add(pi * gpp + g) };
            prefetch(gp);
            // SAFETY: a whole group, 64-byte aligned (`PanelGroup`'s alignment).
            *vp = unsafe { _mm512_load_si512(gp.cast()) };
        }
        macro_rules! plane {
            ($s:literal) => {{
                let d: [__m512i; P] = std::array::from_fn(|pi| {
                    _mm512_and_si512(_mm512_srli_epi16::<{ 2 * $s }>(v[pi]), m3)
                });
                for t in 0..NT {
                    // SAFETY: see above.
                    let xb = _mm512_set1_epi32(unsafe { x4(xp, k, t, 16 * g + 4 * $s) });
                    for pi in 0..P {
                        acc[pi][t] = _mm512_dpbusd_epi32(acc[pi][t], d[pi], xb);
                    }
                }
            }};
        }
        plane!(0);
        plane!(1);
        plane!(2);
        plane!(3);
    }
    let op = out.as_mut_ptr();
    for (pi, row) in acc.iter().enumerate() {
        for (t, a) in row.iter().enumerate() {
            // SAFETY: t·16P + 16pi + 16 ≤ NT·16P ≤ out.len().
            unsafe { _mm512_storeu_si512(op.add(t * 16 * P + 16 * pi).cast(), *a) };
        }
    }
}

/// A few tokens (decode, batched decode) on one panel: each (token, plane) gets its own
/// accumulator, so the `vpdpbusd` chains are independent (one accumulator per token would
/// serialize four per group on the instruction's latency); the planes are summed at the end.
/// One panel at a time keeps the weights one stream in address order.
///
/// # Safety
/// As [`tile512`] with `P = 1`, `NT ≤ SMALL_BATCH`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn small512<const NT: usize>(
    w: &[PanelGroup],
    gpp: usize,
    x: &[i8],
    k: usize,
    t0: usize,
    out: &mut [i32],
) {
    debug_assert!(w.len() == gpp && x.len() >= (t0 + NT) * k && out.len() >= 16 * NT);
    let m3 = _mm512_set1_epi8(3);
    let mut acc = [[_mm512_setzero_si512(); 4]; NT];
    let wp = w.as_ptr();
    // SAFETY: `t0·k ≤ x.len()` by the contract.
    let xp = unsafe { x.as_ptr().add(t0 * k) };
    for g in 0..gpp {
        // SAFETY: g < gpp = w.len().
        let gp = unsafe { wp.add(g) };
        prefetch(gp);
        prefetch_l2(gp);
        // SAFETY: a whole group, 64-byte aligned.
        let v = unsafe { _mm512_load_si512(gp.cast()) };
        let d = [
            _mm512_and_si512(v, m3),
            _mm512_and_si512(_mm512_srli_epi16::<2>(v), m3),
            _mm512_and_si512(_mm512_srli_epi16::<4>(v), m3),
            _mm512_and_si512(_mm512_srli_epi16::<6>(v), m3),
        ];
        for (t, a) in acc.iter_mut().enumerate() {
            for (s, (as_, ds)) in a.iter_mut().zip(&d).enumerate() {
                // SAFETY: columns 16g + 4s + 4 ≤ k; token t < NT.
                let xb = _mm512_set1_epi32(unsafe { x4(xp, k, t, 16 * g + 4 * s) });
                *as_ = _mm512_dpbusd_epi32(*as_, *ds, xb);
            }
        }
    }
    let op = out.as_mut_ptr();
    for (t, a) in acc.iter().enumerate() {
        let sum = _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3]));
        // SAFETY: 16t + 16 ≤ 16·NT ≤ out.len().
        unsafe { _mm512_storeu_si512(op.add(16 * t).cast(), sum) };
    }
}

// ---------------------------------------------------------------------------------------
// AVX-VNNI (256-bit)

/// AVX-VNNI panel kernel (see `crate::tier::PanelKernel`).
pub(crate) fn panel_256(
    w: &[PanelGroup],
    gpp: usize,
    x: &[i8],
    k: usize,
    t0: usize,
    nt: usize,
    out: &mut [i32],
) {
    if nt == 0 {
        return;
    }
    if !shape_ok(w, gpp, x, k, t0, nt, out) || nt > TOKENS_256 {
        return crate::panel::scalar_kernel(w, gpp, x, k, t0, nt, out);
    }
    let np = w.len() / gpp;
    let stride = PANEL_ROWS * np;
    for pi in 0..np {
        let pw = &w[pi * gpp..(pi + 1) * gpp];
        let o = &mut out[PANEL_ROWS * pi..];
        // SAFETY: this kernel is only in the AVX-VNNI table, handed out after runtime
        // detection of avx2 and avxvnni; shapes checked above.
        unsafe {
            match nt {
                1 => matvec256(pw, gpp, x, k, t0, o),
                2 => tile256::<2>(pw, gpp, x, k, t0, o, stride),
                3 => tile256::<3>(pw, gpp, x, k, t0, o, stride),
                _ => tile256::<4>(pw, gpp, x, k, t0, o, stride),
            }
        }
    }
}

/// One token: an accumulator per plane and half (independent `vpdpbusd` chains), summed at
/// the end, as in [`small512`].
///
/// # Safety
/// As [`tile256`] with `NT = 1`.
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn matvec256(w: &[PanelGroup], gpp: usize, x: &[i8], k: usize, t0: usize, out: &mut [i32]) {
    debug_assert!(w.len() == gpp && x.len() >= (t0 + 1) * k && out.len() >= 16);
    let m3 = _mm256_set1_epi8(3);
    let mut lo = [_mm256_setzero_si256(); 4];
    let mut hi = [_mm256_setzero_si256(); 4];
    let wp = w.as_ptr();
    // SAFETY: `t0·k ≤ x.len()` by the contract.
    let xp = unsafe { x.as_ptr().add(t0 * k) };
    for g in 0..gpp {
        // SAFETY: g < gpp = w.len().
        let gp = unsafe { wp.add(g) };
        prefetch(gp);
        // SAFETY: a whole group, 64-byte aligned, so both 32-byte halves are aligned.
        let (vl, vh) = unsafe {
            let b = gp.cast::<__m256i>();
            (_mm256_load_si256(b), _mm256_load_si256(b.add(1)))
        };
        macro_rules! plane {
            ($s:literal) => {{
                // SAFETY: columns 16g + 4s + 4 ≤ k.
                let xb = _mm256_set1_epi32(unsafe { x4(xp, k, 0, 16 * g + 4 * $s) });
                let dl = _mm256_and_si256(_mm256_srli_epi16::<{ 2 * $s }>(vl), m3);
                let dh = _mm256_and_si256(_mm256_srli_epi16::<{ 2 * $s }>(vh), m3);
                lo[$s] = _mm256_dpbusd_avx_epi32(lo[$s], dl, xb);
                hi[$s] = _mm256_dpbusd_avx_epi32(hi[$s], dh, xb);
            }};
        }
        plane!(0);
        plane!(1);
        plane!(2);
        plane!(3);
    }
    let sum = |a: [__m256i; 4]| {
        _mm256_add_epi32(_mm256_add_epi32(a[0], a[1]), _mm256_add_epi32(a[2], a[3]))
    };
    let op = out.as_mut_ptr();
    // SAFETY: out.len() ≥ 16.
    unsafe {
        _mm256_storeu_si256(op.cast(), sum(lo));
        _mm256_storeu_si256(op.add(8).cast(), sum(hi));
    }
}

/// # Safety
/// AVX2 and AVX-VNNI available; `w` holds one panel (`gpp` groups); `x` holds tokens
/// `t0 .. t0+NT` of `k = 16·gpp` bytes; `out[t·stride .. t·stride + 16]` exists for t < NT.
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn tile256<const NT: usize>(
    w: &[PanelGroup],
    gpp: usize,
    x: &[i8],
    k: usize,
    t0: usize,
    out: &mut [i32],
    stride: usize,
) {
    debug_assert!(w.len() == gpp && x.len() >= (t0 + NT) * k);
    debug_assert!(out.len() >= (NT - 1) * stride + 16);
    let m3 = _mm256_set1_epi8(3);
    let mut lo = [_mm256_setzero_si256(); NT];
    let mut hi = [_mm256_setzero_si256(); NT];
    let wp = w.as_ptr();
    // SAFETY: `t0·k ≤ x.len()` by the contract.
    let xp = unsafe { x.as_ptr().add(t0 * k) };
    for g in 0..gpp {
        // SAFETY: g < gpp = w.len().
        let gp = unsafe { wp.add(g) };
        prefetch(gp);
        // SAFETY: a whole group, 64-byte aligned, so both 32-byte halves are aligned.
        let (vl, vh) = unsafe {
            let b = gp.cast::<__m256i>();
            (_mm256_load_si256(b), _mm256_load_si256(b.add(1)))
        };
        macro_rules! plane {
            ($s:literal) => {{
                let dl = _mm256_and_si256(_mm256_srli_epi16::<{ 2 * $s }>(vl), m3);
                let dh = _mm256_and_si256(_mm256_srli_epi16::<{ 2 * $s }>(vh), m3);
                for t in 0..NT {
                    // SAFETY: see above.
                    let xb = _mm256_set1_epi32(unsafe { x4(xp, k, t, 16 * g + 4 * $s) });
                    lo[t] = _mm256_dpbusd_avx_epi32(lo[t], dl, xb);
                    hi[t] = _mm256_dpbusd_avx_epi32(hi[t], dh, xb);
                }
            }};
        }
        plane!(0);
        plane!(1);
        plane!(2);
        plane!(3);
    }
    let op = out.as_mut_ptr();
    for t in 0..NT {
        // SAFETY: t·stride + 16 ≤ out.len() by the contract.
        unsafe {
            _mm256_storeu_si256(op.add(t * stride).cast(), lo[t]);
            _mm256_storeu_si256(op.add(t * stride + 8).cast(), hi[t]);
        }
    }
}

// ---------------------------------------------------------------------------------------
// AVX2 (`maddubs`)

/// AVX2 panel kernel (see `crate::tier::PanelKernel`): `vpmaddubsw` multiplies the codes
/// (u8, ≤ 2) by the activations (i8) into i16 pairs (|·| ≤ 2·2·128, no saturation), the four
/// planes of a group are added in i16 (|·| ≤ 2048), and so are up to [`WIDEN_GROUPS`] groups
/// (|·| ≤ 16384); then `vpmaddwd` by 1 widens each lane's pair to i32. The same integers as
/// `vpdpbusd`.
pub(crate) fn panel_avx2(
    w: &[PanelGroup],
    gpp: usize,
    x: &[i8],
    k: usize,
    t0: usize,
    nt: usize,
    out: &mut [i32],
) {
    if nt == 0 {
        return;
    }
    if !shape_ok(w, gpp, x, k, t0, nt, out) || nt > TOKENS_AVX2 {
        return crate::panel::scalar_kernel(w, gpp, x, k, t0, nt, out);
    }
    let np = w.len() / gpp;
    let stride = PANEL_ROWS * np;
    for pi in 0..np {
        let pw = &w[pi * gpp..(pi + 1) * gpp];
        let o = &mut out[PANEL_ROWS * pi..];
        // SAFETY: this kernel is only in tables handed out after runtime detection of
        // AVX2 (with FMA and F16C); shapes checked above.
        unsafe {
            match nt {
                1 => tile_avx2::<1>(pw, gpp, x, k, t0, o, stride),
                2 => tile_avx2::<2>(pw, gpp, x, k, t0, o, stride),
                3 => tile_avx2::<3>(pw, gpp, x, k, t0, o, stride),
                _ => tile_avx2::<4>(pw, gpp, x, k, t0, o, stride),
            }
        }
    }
}

/// Groups whose i16 sums the AVX2 kernel adds before widening: each adds at most
/// 4 planes × 2 pairs × 2·128 = 2048 in magnitude, so 8 groups stay within ±16384.
const WIDEN_GROUPS: usize = 8;

/// One panel × `NT` tokens: per token, two i16 registers (rows 0–7 and 8–15, a pair of
/// columns per lane) collect [`WIDEN_GROUPS`] groups, then are widened into the i32 totals
/// (which the compiler may keep on the stack: they are touched once per [`WIDEN_GROUPS`]
/// groups). Each group is loaded and split into planes once for all `NT` tokens.
///
/// # Safety
/// AVX2 available; `w` holds one panel (`gpp` groups); `x` holds tokens `t0 .. t0+NT` of
/// `k = 16·gpp` bytes; `out[t·stride .. t·stride + 16]` exists for t < NT.
#[target_feature(enable = "avx2")]
unsafe fn tile_avx2<const NT: usize>(
    w: &[PanelGroup],
    gpp: usize,
    x: &[i8],
    k: usize,
    t0: usize,
    out: &mut [i32],
    stride: usize,
) {
    debug_assert!(w.len() == gpp && x.len() >= (t0 + NT) * k);
    debug_assert!(out.len() >= (NT - 1) * stride + 16);
    let m3 = _mm256_set1_epi8(3);
    let ones = _mm256_set1_epi16(1);
    let mut lo = [_mm256_setzero_si256(); NT];
    let mut hi = [_mm256_setzero_si256(); NT];
    let wp = w.as_ptr();
    // SAFETY: `t0·k ≤ x.len()` by the contract.
    let xp = unsafe { x.as_ptr().add(t0 * k) };
    let mut g0 = 0;
    while g0 < gpp {
        let g1 = (g0 + WIDEN_GROUPS).min(gpp);
        let mut sl = [_mm256_setzero_si256(); NT];
        let mut sh = [_mm256_setzero_si256(); NT];
        for g in g0..g1 {
            // SAFETY: g < gpp = w.len().
            let gp = unsafe { wp.add(g) };
            prefetch(gp);
            // SAFETY: a whole group, 64-byte aligned, so both 32-byte halves are aligned.
            let (vl, vh) = unsafe {
                let b = gp.cast::<__m256i>();
                (_mm256_load_si256(b), _mm256_load_si256(b.add(1)))
            };
            macro_rules! plane {
                ($s:literal) => {{
                    let dl = _mm256_and_si256(_mm256_srli_epi16::<{ 2 * $s }>(vl), m3);
                    let dh = _mm256_and_si256(_mm256_srli_epi16::<{ 2 * $s }>(vh), m3);
                    for t in 0..NT {
                        // SAFETY: columns 16g + 4s + 4 ≤ k; token t < NT.
                        let xb = _mm256_set1_epi32(unsafe { x4(xp, k, t, 16 * g + 4 * $s) });
                        sl[t] = _mm256_add_epi16(sl[t], _mm256_maddubs_epi16(dl, xb));
                        sh[t] = _mm256_add_epi16(sh[t], _mm256_maddubs_epi16(dh, xb));
                    }
                }};
            }
            plane!(0);
            plane!(1);
            plane!(2);
            plane!(3);
        }
        for t in 0..NT {
            lo[t] = _mm256_add_epi32(lo[t], _mm256_madd_epi16(sl[t], ones));
            hi[t] = _mm256_add_epi32(hi[t], _mm256_madd_epi16(sh[t], ones));
        }
        g0 = g1;
    }
    let op = out.as_mut_ptr();
    for t in 0..NT {
        // SAFETY: t·stride + 16 ≤ out.len() by the contract.
        unsafe {
            _mm256_storeu_si256(op.add(t * stride).cast(), lo[t]);
            _mm256_storeu_si256(op.add(t * stride + 8).cast(), hi[t]);
        }
    }
}
