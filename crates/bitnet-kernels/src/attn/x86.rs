//! The AVX2 and AVX-512 tiers of the scores and the P·V accumulation.

use std::arch::x86_64::*;

use super::kv::{Block, KvElem};
use super::LANES;

/// Which (position, query) pair of a 16-score group the tree input `t` must hold so
/// that output lane ℓ holds pair ℓ ([`reduce16`] puts input `4s + r` in lane `4r + s`).
const PAIR16: [usize; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];
/// The same for [`reduce8`] (input `2s + h` lands in lane `4h + s`).
const PAIR8: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// Sixteen [`super::item::fold16`]s at once: the four pairwise steps (lanes i + i+8, i + i+4,
/// i + i+2, i + i+1 of each input) done on whole registers, two inputs per addition.
/// Input `4s + r` ends in lane `4r + s`.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce16(a: [__m512; 16]) -> __m512 {
    // Step 8: [a.q0 a.q1 | b.q0 b.q1] + [a.q2 a.q3 | b.q2 b.q3].
    let t: [__m512; 8] = std::array::from_fn(|k| {
        let (x, y) = (a[2 * k], a[2 * k + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(x, y),
            _mm512_shuffle_f32x4::<0xEE>(x, y),
        )
    });
    // Step 4: quarter r of u_k holds input 4k + r.
    let u: [__m512; 4] = std::array::from_fn(|k| {
        let (x, y) = (t[2 * k], t[2 * k + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(x, y),
            _mm512_shuffle_f32x4::<0xDD>(x, y),
        )
    });
    // Step 2, within each quarter: [x0+x2, x1+x3, y0+y2, y1+y3].
    let w: [__m512; 2] = std::array::from_fn(|k| {
        let (x, y) = (u[2 * k], u[2 * k + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(x, y),
            _mm512_shuffle_ps::<0xEE>(x, y),
        )
    });
    // Step 1: [x0+x1, x2+x3, y0+y1, y2+y3].
    _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(w[0], w[1]),
        _mm512_shuffle_ps::<0xDD>(w[0], w[1]),
    )
}

/// Eight [`super::item::fold16`]s whose first step (lo + hi halves) is done: the steps 4, 2, 1
/// on 8-lane registers. Input `2s + h` ends in lane `4h + s`.
#[inline]
#[target_feature(enable = "avx")]
fn reduce8(t: [__m256; 8]) -> __m256 {
    let u: [__m256; 4] = std::array::from_fn(|k| {
        let (x, y) = (t[2 * k], t[2 * k + 1]);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(x, y),
            _mm256_permute2f128_ps::<0x31>(x, y),
        )
    });
    let w: [__m256; 2] = std::array::from_fn(|k| {
        let (x, y) = (u[2 * k], u[2 * k + 1]);
        _mm256_add_ps(
            _mm256_shuffle_ps::<0x44>(x, y),
            _mm256_shuffle_ps::<0xEE>(x, y),
        )
    });
    _mm256_add_ps(
        _mm256_shuffle_ps::<0x88>(w[0], w[1]),
        _mm256_shuffle_ps::<0xDD>(w[0], w[1]),
    )
}

/// [`super::item::block_scores`] on 16-lane registers.
///
/// # Safety
/// AVX-512 F and F16C are available; `qv` holds `nqp` vectors of `dp` (a multiple of 16)
/// and `kb` rows of `dp` elements; `nqp` is a power of two up to 16 or a multiple of 16;
/// `kl` is a multiple of 16 and at most `POS_BLOCK`; `st` holds `POS_BLOCK · nqp` floats.
#[target_feature(enable = "avx512f,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn scores_avx512<T: KvElem, A: KvElem>(
    qv: &[f32],
    dp: usize,
    nqp: usize,
    kb: Block<'_, T>,
    kl: usize,
    scale: f32,
    st: &mut [f32],
    ahead: Option<Block<'_, A>>,
) {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match nqp {
            1 => scores16::<1, 16, T, A>(qv, dp, nqp, kb, kl, scale, st, ahead),
            2 => scores16::<2, 8, T, A>(qv, dp, nqp, kb, kl, scale, st, ahead),
            4 => scores16::<4, 4, T, A>(qv, dp, nqp, kb, kl, scale, st, ahead),
            8 => scores16::<8, 2, T, A>(qv, dp, nqp, kb, kl, scale, st, ahead),
            _ if T::SCALED => scores16::<16, 1, T, A>(qv, dp, nqp, kb, kl, scale, st, ahead),
            _ => scores_rows::<T>(qv, dp, nqp, kb, kl, scale, st),
        }
    }
}

/// `Q = 16`, one position at a time (prompts: 4 tokens × 4 query heads per item): the 16
/// accumulators as named registers, each K chunk widened once for all 16 vectors.
///
/// # Safety
/// As [`scores_avx512`], with `nqp` a multiple of 16.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn scores_rows<T: KvElem>(
    qv: &[f32],
    dp: usize,
    nqp: usize,
    kb: Block<'_, T>,
    kl: usize,
    scale: f32,
    st: &mut [f32],
) {
    // The chunk loop in assembly: 16 accumulators, the widened K chunk and the query
    // operands from memory. (Compiled from intrinsics, the register allocator kept to
    // zmm0–15 and spilled two accumulators through the stack on every chunk, which put a
    // store-to-load round trip on their dependency chains.) Same operations, same order:
    // accumulator i += q_i[16c..] · k[16c..] for c = 0, 1, ….
    macro_rules! chunk_loop {
        ($load:literal, $step:literal, $row:ident, $q:ident, $qs:ident, $n:ident, $($a:ident)*) => {
            // SAFETY: `$n` ≥ 1 chunks; chunk c of the row lies at row + c·$step bytes
            // inside `kb.s` (the row holds dp elements); the 16 query vectors of chunk c
            // lie at q + c·qs .. + 1024 bytes inside `qv`. Reads only.
            unsafe {
                std::arch::asm!(
                    "2:",
                    $load,
                    "vfmadd231ps {a0}, {k}, zmmword ptr [{q}]",
                    "vfmadd231ps {a1}, {k}, zmmword ptr [{q} + 64]",
                    "vfmadd231ps {a2}, {k}, zmmword ptr [{q} + 128]",
                    "vfmadd231ps {a3}, {k}, zmmword ptr [{q} + 192]",
                    "vfmadd231ps {a4}, {k}, zmmword ptr [{q} + 256]",
                    "vfmadd231ps {a5}, {k}, zmmword ptr [{q} + 320]",
                    "vfmadd231ps {a6}, {k}, zmmword ptr [{q} + 384]",
                    "vfmadd231ps {a7}, {k}, zmmword ptr [{q} + 448]",
                    "vfmadd231ps {a8}, {k}, zmmword ptr [{q} + 512]",
                    "vfmadd231ps {a9}, {k}, zmmword ptr [{q} + 576]",
                    "vfmadd231ps {a10}, {k}, zmmword ptr [{q} + 640]",
                    "vfmadd231ps {a11}, {k}, zmmword ptr [{q} + 704]",
                    "vfmadd231ps {a12}, {k}, zmmword ptr [{q} + 768]",
                    "vfmadd231ps {a13}, {k}, zmmword ptr [{q} + 832]",
                    "vfmadd231ps {a14}, {k}, zmmword ptr [{q} + 896]",
                    "vfmadd231ps {a15}, {k}, zmmword ptr [{q} + 960]",
                    concat!("add {row}, ", $step),
                    "add {q}, {qs}",
                    "dec {n}",
                    "jnz 2b",
                    row = inout(reg) $row => _,
                    q = inout(reg) $q => _,
                    qs = in(reg) $qs,
                    n = inout(reg) $n => _,
                    k = out(zmm_reg) _,
                    $($a = inout(zmm_reg) $a,)*
                    options(nostack, readonly),
                );
            }
        };
    }
    let sc = _mm512_set1_ps(scale);
    let kp = kb.s.as_ptr();
    let last = kb.n - 1;
    let nch = dp / LANES;
    let qs = nqp * LANES * std::mem::size_of::<f32>();
    for qg in (0..nqp).step_by(16) {
        for jj in 0..kl {
            // SAFETY: row min(jj, last) starts inside `kb.s` (Block::new); chunk 0 of
            // vector qg is at qg·16 in `qv`.
            let (row, q) = unsafe {
                (
                    kp.add(jj.min(last) * kb.stride),
                    qv.as_ptr().add(qg * LANES),
                )
            };
            let n = nch;
            let z = _mm512_setzero_ps();
            let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
            let (mut a4, mut a5, mut a6, mut a7) = (z, z, z, z);
            let (mut a8, mut a9, mut a10, mut a11) = (z, z, z, z);
            let (mut a12, mut a13, mut a14, mut a15) = (z, z, z, z);
            if T::HALF {
                chunk_loop!("vcvtph2ps {k}, ymmword ptr [{row}]", "32", row, q, qs, n,
                    a0 a1 a2 a3 a4 a5 a6 a7 a8 a9 a10 a11 a12 a13 a14 a15);
            } else {
                chunk_loop!("vmovups {k}, zmmword ptr [{row}]", "64", row, q, qs, n,
                    a0 a1 a2 a3 a4 a5 a6 a7 a8 a9 a10 a11 a12 a13 a14 a15);
            }
            // Lane i of the result is vector qg + i (tree input 4s + r lands in 4r + s).
            let v = reduce16([
                a0, a4, a8, a12, a1, a5, a9, a13, a2, a6, a10, a14, a3, a7, a11, a15,
            ]);
            let v = _mm512_mul_ps(v, sc);
            debug_assert!(jj * nqp + qg + 16 <= st.len());
            // SAFETY: jj < kl ≤ POS_BLOCK and qg + 16 ≤ nqp: inside `st`.
            unsafe { _mm512_storeu_ps(st.as_mut_ptr().add(jj * nqp + qg), v) };
        }
    }
}

/// Groups of 16 (position, query) pairs: `Q` query vectors × `R = 16 / Q` positions, one
/// accumulator each, one widened K chunk per position shared by the `Q` vectors. With
/// `ahead`, the first group's pass over positions `jb..jb+R` asks for those rows of it.
///
/// # Safety
/// As [`scores_avx512`], with `Q = min(nqp, 16)` and `Q · R = 16`.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores16<const Q: usize, const R: usize, T: KvElem, A: KvElem>(
    qv: &[f32],
    dp: usize,
    nqp: usize,
    kb: Block<'_, T>,
    kl: usize,
    scale: f32,
    st: &mut [f32],
    ahead: Option<Block<'_, A>>,
) {
    let sc = _mm512_set1_ps(scale);
    let qp = qv.as_ptr();
    let kp = kb.s.as_ptr();
    let last = kb.n - 1;
    for qg in (0..nqp).step_by(Q) {
        for jb in (0..kl).step_by(R) {
            if let Some(a) = ahead.filter(|_| qg == 0) {
                for r in jb..jb + R {
                    a.prefetch_row(r);
                }
            }
            // Rows past the block's last repeat it.
            let rp: [*const T; R] =
                // SAFETY: row min(jb + r, last) starts inside `kb.s` (Block::new).
                std::array::from_fn(|r| unsafe { kp.add((jb + r).min(last) * kb.stride) });
            let mut acc = [_mm512_setzero_ps(); 16];
            for c in 0..dp / LANES {
                // SAFETY: each row holds dp = 16·(dp/16) elements; for codes, the row
                // index is ≤ last and chunk c < dp/16, so its scale is inside `kb.sc`.
                let kc: [__m512; R] = std::array::from_fn(|r| unsafe {
                    if T::SCALED {
                        let d = *kb.scales_of((jb + r).min(last)).add(c / 2);
                        T::chunk16_scaled(rp[r], c, d)
                    } else {
                        T::chunk16(rp[r], c)
                    }
                });
                // Accumulator p = r·Q + i: position jb + r, vector qg + i.
                for (p, a) in acc.iter_mut().enumerate() {
                    let (r, i) = (p / Q, p % Q);
                    // SAFETY: (c·nqp + qg + i)·16 + 16 ≤ nqp·dp = qv.len().
                    let qc = unsafe { _mm512_loadu_ps(qp.add((c * nqp + qg + i) * LANES)) };
                    *a = _mm512_fmadd_ps(qc, kc[r], *a);
                }
            }
            // Tree input s takes pair PAIR16[s], so that lane p of the result is pair p.
            let v = _mm512_mul_ps(reduce16(std::array::from_fn(|t| acc[PAIR16[t]])), sc);
            // Lane r·Q + i is (position jb + r, vector qg + i): with Q = nqp the rows
            // jb.. are contiguous, with Q = 16 it is one row. jb + R ≤ kl ≤ POS_BLOCK, so
            // the 16 floats lie inside `st`.
            debug_assert!(jb * nqp + qg + 16 <= st.len());
            // SAFETY: in bounds (above).
            unsafe { _mm512_storeu_ps(st.as_mut_ptr().add(jb * nqp + qg), v) };
        }
    }
}

/// [`super::item::block_scores`] on 8-lane registers.
///
/// # Safety
/// AVX2, FMA and F16C are available; shapes as in [`scores_avx512`].
#[target_feature(enable = "avx,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn scores_avx2<T: KvElem, A: KvElem>(
    qv: &[f32],
    dp: usize,
    nqp: usize,
    kb: Block<'_, T>,
    kl: usize,
    scale: f32,
    st: &mut [f32],
    ahead: Block<'_, A>,
) {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        match nqp {
            1 => scores8::<1, 8, T, A>(qv, dp, nqp, kb, kl, scale, st, ahead),
            2 => scores8::<2, 4, T, A>(qv, dp, nqp, kb, kl, scale, st, ahead),
            4 => scores8::<4, 2, T, A>(qv, dp, nqp, kb, kl, scale, st, ahead),
            _ => scores8::<8, 1, T, A>(qv, dp, nqp, kb, kl, scale, st, ahead),
        }
    }
}

/// Groups of 8 (position, query) pairs, each lane half (0..8, 8..16) accumulated in its
/// own pass so that 8 accumulators fit the 16 registers. The first group's pass over
/// positions `jb..jb+R` asks for rows `jb..jb+R` of `ahead`.
///
/// # Safety
/// As [`scores_avx2`], with `Q = min(nqp, 8)` and `Q · R = 8`.
#[inline]
#[target_feature(enable = "avx,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores8<const Q: usize, const R: usize, T: KvElem, A: KvElem>(
    qv: &[f32],
    dp: usize,
    nqp: usize,
    kb: Block<'_, T>,
    kl: usize,
    scale: f32,
    st: &mut [f32],
    ahead: Block<'_, A>,
) {
    let sc = _mm256_set1_ps(scale);
    let qp = qv.as_ptr();
    let kp = kb.s.as_ptr();
    let last = kb.n - 1;
    for qg in (0..nqp).step_by(Q) {
        for jb in (0..kl).step_by(R) {
            if qg == 0 {
                for r in jb..jb + R {
                    ahead.prefetch_row(r);
                }
            }
            let rp: [*const T; R] =
                // SAFETY: row min(jb + r, last) starts inside `kb.s` (Block::new).
                std::array::from_fn(|r| unsafe { kp.add((jb + r).min(last) * kb.stride) });
            let mut halves = [[_mm256_setzero_ps(); 8]; 2];
            for (h, acc) in halves.iter_mut().enumerate() {
                let mut c0 = 0;
                // Two chunks (one 32-element block) at a time where the registers allow
                // (R ≤ 2: 2R key vectors beside the 8 accumulators): codes share a load
                // and a scale. The same multiply-adds in the same order as chunk by chunk.
                if R <= 2 {
                    while c0 + 2 <= dp / LANES {
                        let mut kc: [[__m256; 2]; R] =
                            // SAFETY: each row holds dp ≥ 16·c0 + 32 elements.
                            std::array::from_fn(|r| unsafe { T::pair8(rp[r], c0 / 2, h) });
                        if T::SCALED {
                            for (r, x) in kc.iter_mut().enumerate() {
                                // SAFETY: code rows; the row index is ≤ last; block c0/2
                                // lies inside the row.
                                let d = _mm256_set1_ps(unsafe {
                                    *kb.scales_of((jb + r).min(last)).add(c0 / 2)
                                });
                                x[0] = _mm256_mul_ps(x[0], d);
                                x[1] = _mm256_mul_ps(x[1], d);
                            }
                        }
                        for (k, c) in [c0, c0 + 1].into_iter().enumerate() {
                            for (p, a) in acc.iter_mut().enumerate() {
                                let (r, i) = (p / Q, p % Q);
                                // SAFETY: (c·nqp + qg + i)·16 + 8h + 8 ≤ nqp·dp.
                                let qh = unsafe {
                                    _mm256_loadu_ps(qp.add((c * nqp + qg + i) * LANES + 8 * h))
                                };
                                *a = _mm256_fmadd_ps(qh, kc[r][k], *a);
                            }
                        }
                        c0 += 2;
                    }
                }
                for c in c0..dp / LANES {
                    // SAFETY: each row holds dp elements; 16c + 8h + 8 ≤ dp.
                    let mut kc: [__m256; R] =
                        std::array::from_fn(|r| unsafe { T::chunk8(rp[r], c, h) });
                    if T::SCALED {
                        for (r, x) in kc.iter_mut().enumerate() {
                            // SAFETY: code rows; the row index is ≤ last; chunk c < dp/16.
                            let d = unsafe { *kb.scales_of((jb + r).min(last)).add(c / 2) };
                            *x = _mm256_mul_ps(*x, _mm256_set1_ps(d));
                        }
                    }
                    // Accumulator p = r·Q + i: position jb + r, vector qg + i.
                    for (p, a) in acc.iter_mut().enumerate() {
                        let (r, i) = (p / Q, p % Q);
                        // SAFETY: (c·nqp + qg + i)·16 + 8h + 8 ≤ nqp·dp = qv.len().
                        let qh =
                            unsafe { _mm256_loadu_ps(qp.add((c * nqp + qg + i) * LANES + 8 * h)) };
                        *a = _mm256_fmadd_ps(qh, kc[r], *a);
                    }
                }
            }
            // Step 8 of the fold (lane x + lane x+8); tree input s takes pair PAIR8[s].
            let t: [__m256; 8] =
                std::array::from_fn(|t| _mm256_add_ps(halves[0][PAIR8[t]], halves[1][PAIR8[t]]));
            let v = _mm256_mul_ps(reduce8(t), sc);
            debug_assert!(jb * nqp + qg + 8 <= st.len());
            // SAFETY: as in `scores16` (groups of 8, jb + R ≤ kl ≤ POS_BLOCK).
            unsafe { _mm256_storeu_ps(st.as_mut_ptr().add(jb * nqp + qg), v) };
        }
    }
}

/// [`super::item::block_accumulate`] on 16-lane registers.
///
/// # Safety
/// AVX-512 F and F16C are available; `acc` holds `nqp` rows of `dp` (a multiple of 16),
/// `vb` at most `POS_BLOCK` rows of `dp` elements; `nqp` is a power of two up to 16 or a
/// multiple of 16; `st` holds `POS_BLOCK · nqp` floats.
#[target_feature(enable = "avx512f,f16c")]
pub(super) unsafe fn accumulate_avx512<T: KvElem>(
    acc: &mut [f32],
    dp: usize,
    nqp: usize,
    st: &[f32],
    vb: Block<'_, T>,
) {
    let nch = dp / LANES;
    // 16 accumulators per tile: 16 vectors × 1 chunk (prompts: each V chunk is widened
    // once for all 16 vectors, where 8 × 2 widened it twice; a 128-row batch at 4096
    // positions, Zen 4: 61.8 → 58.0 ms on one thread), 8 vectors × 2 chunks, or (fewer
    // vectors) × 4 chunks.
    // SAFETY: (every call) the caller's contract; qg + QA ≤ nqp and c + CA ≤ nch.
    unsafe {
        if nqp.is_multiple_of(16) {
            for qg in (0..nqp).step_by(16) {
                for c in 0..nch {
                    tile512::<16, 1, T>(acc, dp, nqp, qg, c, st, vb);
                }
            }
            return;
        }
        // Not a multiple of 16: a power of two up to 8.
        if nqp == 8 {
            let mut c = 0;
            while c + 2 <= nch {
                tile512::<8, 2, T>(acc, dp, nqp, 0, c, st, vb);
                c += 2;
            }
            if c < nch {
                tile512::<8, 1, T>(acc, dp, nqp, 0, c, st, vb);
            }
            return;
        }
        let mut c = 0;
        while c + 4 <= nch {
            match nqp {
                4 => tile512::<4, 4, T>(acc, dp, nqp, 0, c, st, vb),
                2 => tile512::<2, 4, T>(acc, dp, nqp, 0, c, st, vb),
                _ => tile512::<1, 4, T>(acc, dp, nqp, 0, c, st, vb),
            }
            c += 4;
        }
        while c < nch {
            match nqp {
                4 => tile512::<4, 1, T>(acc, dp, nqp, 0, c, st, vb),
                2 => tile512::<2, 1, T>(acc, dp, nqp, 0, c, st, vb),
                _ => tile512::<1, 1, T>(acc, dp, nqp, 0, c, st, vb),
            }
            c += 1;
        }
    }
}

/// Vectors `qg..qg+QA`, chunks `c0..c0+CA`: `QA × CA` accumulators in registers over the
/// whole block.
///
/// # Safety
/// As [`accumulate_avx512`], with `qg + QA ≤ nqp` and `c0 + CA ≤ dp / 16`.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile512<const QA: usize, const CA: usize, T: KvElem>(
    acc: &mut [f32],
    dp: usize,
    nqp: usize,
    qg: usize,
    c0: usize,
    st: &[f32],
    vb: Block<'_, T>,
) {
    let ap = acc.as_mut_ptr();
    let vp = vb.s.as_ptr();
    let mut a = [[_mm512_setzero_ps(); CA]; QA];
    for (i, ai) in a.iter_mut().enumerate() {
        for (ci, x) in ai.iter_mut().enumerate() {
            // SAFETY: (qg + i)·dp + 16(c0 + ci) + 16 ≤ nqp·dp = acc.len().
            *x = unsafe { _mm512_loadu_ps(ap.add((qg + i) * dp + (c0 + ci) * LANES)) };
        }
    }
    for jj in 0..vb.n {
        // SAFETY: row jj < n starts inside `vb.s` and holds dp elements; 16(c0+ci)+16 ≤ dp;
        // for codes, chunk c0 + ci < dp/16 has its scale inside `vb.sc`.
        let v: [__m512; CA] = std::array::from_fn(|ci| unsafe {
            let row = vp.add(jj * vb.stride);
            if T::SCALED {
                T::chunk16_scaled(row, c0 + ci, *vb.scales_of(jj).add((c0 + ci) / 2))
            } else {
                T::chunk16(row, c0 + ci)
            }
        });
        let prow = &st[jj * nqp + qg..][..QA];
        for (ai, &p) in a.iter_mut().zip(prow) {
            let p = _mm512_set1_ps(p);
            for (x, &vc) in ai.iter_mut().zip(&v) {
                *x = _mm512_fmadd_ps(p, vc, *x);
            }
        }
    }
    for (i, ai) in a.iter().enumerate() {
        for (ci, x) in ai.iter().enumerate() {
            // SAFETY: as for the load.
            unsafe { _mm512_storeu_ps(ap.add((qg + i) * dp + (c0 + ci) * LANES), *x) };
        }
    }
}

/// [`super::item::block_accumulate`] on 8-lane register pairs: up to 4 vectors × one chunk.
///
/// # Safety
/// AVX2, FMA and F16C are available; shapes as in [`accumulate_avx512`].
#[target_feature(enable = "avx,avx2,fma,f16c")]
pub(super) unsafe fn accumulate_avx2<T: KvElem>(
    acc: &mut [f32],
    dp: usize,
    nqp: usize,
    st: &[f32],
    vb: Block<'_, T>,
) {
    // SAFETY: (every call) the caller's contract; qg + QA ≤ nqp.
    unsafe {
        match nqp {
            1 => tile256::<1, T>(acc, dp, nqp, 0, st, vb),
            2 => tile256::<2, T>(acc, dp, nqp, 0, st, vb),
            _ => {
                for qg in (0..nqp).step_by(4) {
                    tile256::<4, T>(acc, dp, nqp, qg, st, vb);
                }
            }
        }
    }
}

/// Vectors `qg..qg+QA`, every chunk in turn, each as two 8-lane halves.
///
/// # Safety
/// As [`accumulate_avx2`], with `qg + QA ≤ nqp`.
#[inline]
#[target_feature(enable = "avx,avx2,fma,f16c")]
unsafe fn tile256<const QA: usize, T: KvElem>(
    acc: &mut [f32],
    dp: usize,
    nqp: usize,
    qg: usize,
    st: &[f32],
    vb: Block<'_, T>,
) {
    let ap = acc.as_mut_ptr();
    let vp = vb.s.as_ptr();
    for c in 0..dp / LANES {
        let mut lo = [_mm256_setzero_ps(); QA];
        let mut hi = [_mm256_setzero_ps(); QA];
        for i in 0..QA {
            // SAFETY: (qg + i)·dp + 16c + 16 ≤ acc.len().
            unsafe {
                let a = ap.add((qg + i) * dp + c * LANES);
                lo[i] = _mm256_loadu_ps(a);
                hi[i] = _mm256_loadu_ps(a.add(8));
            }
        }
        for jj in 0..vb.n {
            // SAFETY: row jj < n holds dp elements; 16c + 16 ≤ dp.
            let [mut v_lo, mut v_hi] = unsafe { T::halves8(vp.add(jj * vb.stride), c) };
            if T::SCALED {
                // SAFETY: code rows, jj < n; chunk c < dp/16.
                let d = _mm256_set1_ps(unsafe { *vb.scales_of(jj).add(c / 2) });
                v_lo = _mm256_mul_ps(v_lo, d);
                v_hi = _mm256_mul_ps(v_hi, d);
            }
            let prow = &st[jj * nqp + qg..][..QA];
            for ((l, h), &p) in lo.iter_mut().zip(hi.iter_mut()).zip(prow) {
                let pj = _mm256_set1_ps(p);
                *l = _mm256_fmadd_ps(pj, v_lo, *l);
                *h = _mm256_fmadd_ps(pj, v_hi, *h);
            }
        }
        for i in 0..QA {
            // SAFETY: as for the load.
            unsafe {
                let a = ap.add((qg + i) * dp + c * LANES);
                _mm256_storeu_ps(a, lo[i]);
                _mm256_storeu_ps(a.add(8), hi[i]);
            }
        }
    }
}
