//! One work item: the online softmax over blocks of positions, in the plain arithmetic every
//! tier reproduces; the tiers' hot loops are in `super::x86`.

use super::kv::{prefetch, Block, KvElem};
use super::work::{Job, Scratch};
#[cfg(target_arch = "x86_64")]
use super::x86;
use super::{padded_queries, KvRows, LANES, MAX_QP, POS_BLOCK};
use crate::tier::Isa;

pub(super) fn select(isa: Isa) -> fn(&Job<'_>, usize, &mut Scratch, &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 && Isa::Avx512.is_supported() {
            return item_avx512;
        }
        if isa >= Isa::Avx2 && Isa::Avx2.is_supported() {
            return item_avx2;
        }
    }
    #[cfg(target_arch = "wasm32")]
    if isa == Isa::Simd128 && Isa::Simd128.is_supported() {
        #[cfg(target_feature = "relaxed-simd")]
        if crate::wasm_fused_madd() {
            return item_fused;
        }
        return item_unfused;
    }
    let _ = isa;
    item_plain
}

/// The plain item with each fused multiply-add split into a multiply and an add: plain
/// WebAssembly SIMD has no fused multiply-add (`f32::mul_add` becomes a software routine
/// there), and the split form is what its SIMD does in one instruction each. Not
/// bit-identical to the plain build; within the same bounds of the exact reference
/// (tests/attn.rs).
#[cfg(target_arch = "wasm32")]
pub(super) fn item_unfused(job: &Job<'_>, it: usize, s: &mut Scratch, part: &mut [f32]) {
    item_impl::<UNFUSED>(job, it, s, part);
}

/// The plain item with its multiply-adds fused by relaxed SIMD's `f32x4.relaxed_madd`, on
/// engines that round it once (`crate::wasm_fused_madd`): the plain build's operations, so its
/// bits (the package's `selfTest` checks them in the browser).
#[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
pub(super) fn item_fused(job: &Job<'_>, it: usize, s: &mut Scratch, part: &mut [f32]) {
    item_impl::<FUSED>(job, it, s, part);
}

/// `acc[x] = madd(a[x], b[x], acc[x])` over one 16-lane chunk; the [`FUSED`] build does it
/// four lanes an instruction with relaxed SIMD's fused multiply-add (the same operations).
#[inline(always)]
fn madd16<const TIER: u8>(a: &[f32], b: &[f32; LANES], acc: &mut [f32]) {
    #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
    if TIER == FUSED {
        use crate::simd::wasm::{load, store};
        use std::arch::wasm32::f32x4_relaxed_madd;
        for h in 0..LANES / 4 {
            let v = f32x4_relaxed_madd(load(a, 4 * h), load(b, 4 * h), load(acc, 4 * h));
            store(acc, 4 * h, v);
        }
        return;
    }
    for x in 0..LANES {
        acc[x] = madd::<TIER>(a[x], b[x], acc[x]);
    }
}

/// `acc[x] = madd(p, b[x], acc[x])` over one 16-lane chunk, as [`madd16`].
#[inline(always)]
fn madd16_by<const TIER: u8>(p: f32, b: &[f32; LANES], acc: &mut [f32]) {
    #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
    if TIER == FUSED {
        use crate::simd::wasm::{load, store};
        use std::arch::wasm32::{f32x4_relaxed_madd, f32x4_splat};
        let pv = f32x4_splat(p);
        for h in 0..LANES / 4 {
            store(
                acc,
                4 * h,
                f32x4_relaxed_madd(pv, load(b, 4 * h), load(acc, 4 * h)),
            );
        }
        return;
    }
    for x in 0..LANES {
        acc[x] = madd::<TIER>(p, b[x], acc[x]);
    }
}

/// `a·b + c`: fused, except in the [`UNFUSED`] build.
#[inline(always)]
fn madd<const TIER: u8>(a: f32, b: f32, c: f32) -> f32 {
    if TIER == UNFUSED {
        a * b + c
    } else {
        a.mul_add(b, c)
    }
}

pub(super) fn item_plain(job: &Job<'_>, it: usize, s: &mut Scratch, part: &mut [f32]) {
    item_impl::<PLAIN>(job, it, s, part);
}

#[cfg(target_arch = "x86_64")]
pub(super) fn item_avx2(job: &Job<'_>, it: usize, s: &mut Scratch, part: &mut [f32]) {
    /// # Safety
    /// AVX2, FMA and F16C are available.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn inner(job: &Job<'_>, it: usize, s: &mut Scratch, part: &mut [f32]) {
        item_impl::<AVX2>(job, it, s, part);
    }
    // SAFETY: `select` returns this only when the AVX2 tier is supported.
    unsafe { inner(job, it, s, part) }
}

#[cfg(target_arch = "x86_64")]
pub(super) fn item_avx512(job: &Job<'_>, it: usize, s: &mut Scratch, part: &mut [f32]) {
    /// # Safety
    /// AVX-512 F/BW and the AVX2 tier's features are available.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn inner(job: &Job<'_>, it: usize, s: &mut Scratch, part: &mut [f32]) {
        item_impl::<AVX512>(job, it, s, part);
    }
    // SAFETY: `select` returns this only when the AVX-512 tier is supported.
    unsafe { inner(job, it, s, part) }
}

/// Scaled scores of one block: `st[jj·nqp + i] = scale · (q_i · K_jj)` for the `nqp` query
/// vectors in `qv` (chunk-major: lanes 16c.. of vector i at `(c·nqp + i)·16`, zero-padded) and positions `jj < kl` (`kl` a multiple of
/// 16; rows past the block's last repeat it, and their scores are never read). A score's
/// lane `x` accumulates `fma(q[16c + x], k[16c + x], ·)` over chunks c, then the lanes fold
/// pairwise ([`fold16`]). Every tier performs exactly these operations; the vector tiers
/// reduce 16 (or 8) scores at once with a transposing tree whose additions are those of
/// [`fold16`], and run when the head size is a whole number of 16-lane chunks (otherwise
/// the plain code does). The AVX2 tier asks for the rows of `ahead` (the block's V rows) as it
/// goes, a pair of rows per pair of positions scored; the AVX-512 tier does so when `early`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn block_scores<const TIER: u8, T: KvElem, A: KvElem>(
    qv: &[f32],
    dp: usize,
    nqp: usize,
    kb: Block<'_, T>,
    kl: usize,
    scale: f32,
    st: &mut [f32],
    ahead: Block<'_, A>,
    early: bool,
) {
    let qv = &qv[..nqp * dp];
    let st = &mut st[..POS_BLOCK * nqp];
    let kl = kl.min(POS_BLOCK);
    // Only the x86 tiers prefetch.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ahead, early);
    #[cfg(target_arch = "x86_64")]
    if kb.d == dp && kl.is_multiple_of(LANES) {
        if TIER == AVX512 {
            // SAFETY: TIER == AVX512 only inside `item_avx512` (AVX-512 F/BW, F16C enabled);
            // the slices have the lengths the kernel needs (cut above), rows are whole chunks.
            unsafe { x86::scores_avx512(qv, dp, nqp, kb, kl, scale, st, early.then_some(ahead)) };
            return;
        }
        if TIER == AVX2 {
            // SAFETY: TIER == AVX2 only inside `item_avx2` (AVX2, FMA, F16C enabled); as above.
            unsafe { x86::scores_avx2(qv, dp, nqp, kb, kl, scale, st, ahead) };
            return;
        }
    }
    let mut acc = [[0f32; LANES]; MAX_QP];
    for jj in 0..kl {
        let kr = jj.min(kb.n - 1);
        let acc = &mut acc[..nqp];
        for a in acc.iter_mut() {
            *a = [0.0; LANES];
        }
        for c in 0..dp / LANES {
            let kc = kb.chunk(kr, c);
            for (i, a) in acc.iter_mut().enumerate() {
                madd16::<TIER>(&qv[(c * nqp + i) * LANES..][..LANES], &kc, a);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            st[jj * nqp + i] = fold16(*a) * scale;
        }
    }
}

/// `acc_i += Σ_jj st[jj·nqp + i] · V_jj` for the `nqp` query vectors: lane by lane, one fused
/// multiply-add per position, in position order. `acc` is `nqp × dp`.
#[inline(always)]
pub(super) fn block_accumulate<const TIER: u8, T: KvElem>(
    acc: &mut [f32],
    dp: usize,
    nqp: usize,
    st: &[f32],
    vb: Block<'_, T>,
) {
    let acc = &mut acc[..nqp * dp];
    let st = &st[..POS_BLOCK * nqp];
    #[cfg(target_arch = "x86_64")]
    if vb.d == dp && vb.n <= POS_BLOCK {
        if TIER == AVX512 {
            // SAFETY: as in `block_scores`.
            unsafe { x86::accumulate_avx512(acc, dp, nqp, st, vb) };
            return;
        }
        if TIER == AVX2 {
            // SAFETY: as in `block_scores`.
            unsafe { x86::accumulate_avx2(acc, dp, nqp, st, vb) };
            return;
        }
    }
    for c in 0..dp / LANES {
        for jj in 0..vb.n.min(POS_BLOCK) {
            let vc = vb.chunk(jj, c);
            for i in 0..nqp {
                madd16_by::<TIER>(
                    st[jj * nqp + i],
                    &vc,
                    &mut acc[i * dp + c * LANES..][..LANES],
                );
            }
        }
    }
}

/// The online-softmax step of one block for the `nqp` query vectors: entries of `st` that a
/// vector may not see (positions at or past `lim[i]`, or past the block) are set to −∞ first.
/// The block's maximum moves a vector's running maximum `m` (rescaling `l` and its
/// accumulator by `exp(m_old − m_new)` when it does); the scores become probabilities
/// `exp(s − m)` (0 where invisible), summed in position order into `l`. Maxima and
/// exponentials run 16 entries at a time over the block, so they vectorize whatever `nqp` is.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn softmax_block(
    st: &mut [f32],
    nqp: usize,
    bl: usize,
    j0: usize,
    lim: &[usize],
    m: &mut [f32],
    l: &mut [f32],
    acc: &mut [f32],
    dp: usize,
) {
    match nqp {
        1 => softmax_nq::<1>(st, nqp, bl, j0, lim, m, l, acc, dp),
        2 => softmax_nq::<2>(st, nqp, bl, j0, lim, m, l, acc, dp),
        4 => softmax_nq::<4>(st, nqp, bl, j0, lim, m, l, acc, dp),
        8 => softmax_nq::<8>(st, nqp, bl, j0, lim, m, l, acc, dp),
        _ => softmax_nq::<16>(st, nqp, bl, j0, lim, m, l, acc, dp),
    }
}

/// [`softmax_block`] with `NQ = min(nqp, 16)`: 16-lane groups of `16 / NQ` positions × `NQ`
/// vectors (lane `x` is vector `x mod NQ`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn softmax_nq<const NQ: usize>(
    st: &mut [f32],
    nqp: usize,
    bl: usize,
    j0: usize,
    lim: &[usize],
    m: &mut [f32],
    l: &mut [f32],
    acc: &mut [f32],
    dp: usize,
) {
    let r = LANES / NQ;
    let span = bl.next_multiple_of(r);
    let lim = &lim[..nqp];
    let min_lim = lim.iter().copied().min().unwrap_or(0);
    if span > bl || j0 + span > min_lim {
        for jj in 0..span {
            for (i, &li) in lim.iter().enumerate() {
                if jj >= bl || j0 + jj >= li {
                    st[jj * nqp + i] = f32::NEG_INFINITY;
                }
            }
        }
    }
    // Entry of group g (16 floats): positions g·r.. of every vector (NQ < 16), or one
    // position's vectors qg..qg+16 (NQ = 16, nqp a multiple of 16).
    let base = |g: usize, qg: usize| if NQ == LANES { g * nqp + qg } else { g * LANES };
    for qg in (0..nqp).step_by(NQ) {
        let groups = span / r;
        let mut m16 = [f32::NEG_INFINITY; LANES];
        for g in 0..groups {
            let v = &st[base(g, qg)..][..LANES];
            for x in 0..LANES {
                m16[x] = if v[x] > m16[x] { v[x] } else { m16[x] };
            }
        }
        for i in 0..NQ {
            let mut bm = f32::NEG_INFINITY;
            for rr in 0..r {
                let y = m16[rr * NQ + i];
                bm = if y > bm { y } else { bm };
            }
            let q = qg + i;
            if bm > m[q] {
                // The running maximum moves: rescale what was accumulated.
                let corr = exp_approx(m[q] - bm);
                l[q] *= corr;
                for a in &mut acc[q * dp..(q + 1) * dp] {
                    *a *= corr;
                }
                m[q] = bm;
            }
        }
        let mut mq = [0f32; LANES];
        for (x, v) in mq.iter_mut().enumerate() {
            *v = m[qg + x % NQ];
        }
        for g in 0..groups {
            let v = &mut st[base(g, qg)..][..LANES];
            for x in 0..LANES {
                v[x] = if v[x] == f32::NEG_INFINITY {
                    0.0
                } else {
                    exp_approx(v[x] - mq[x])
                };
            }
        }
        let mut sum = [0f32; NQ];
        for jj in 0..bl {
            let row = &st[jj * nqp + qg..][..NQ];
            for i in 0..NQ {
                sum[i] += row[i];
            }
        }
        for i in 0..NQ {
            l[qg + i] += sum[i];
        }
    }
}

/// One work item: online softmax over the item's positions for its query vectors; writes
/// `acc[d], m, l` per query vector into `part`.
#[inline(always)]
pub(super) fn item_impl<const TIER: u8>(
    job: &Job<'_>,
    it: usize,
    sc: &mut Scratch,
    part: &mut [f32],
) {
    match (job.k, job.v) {
        (KvRows::F16(k), KvRows::F16(v)) => {
            item_typed::<TIER, _, _>(job, (k, &[]), (v, &[]), it, sc, part)
        }
        (KvRows::F32(k), KvRows::F32(v)) => {
            item_typed::<TIER, _, _>(job, (k, &[]), (v, &[]), it, sc, part)
        }
        (KvRows::F16(k), KvRows::F32(v)) => {
            item_typed::<TIER, _, _>(job, (k, &[]), (v, &[]), it, sc, part)
        }
        (KvRows::F32(k), KvRows::F16(v)) => {
            item_typed::<TIER, _, _>(job, (k, &[]), (v, &[]), it, sc, part)
        }
        (KvRows::Q8 { q: k, d: kd }, KvRows::Q8 { q: v, d: vd }) => {
            item_typed::<TIER, _, _>(job, (k, kd), (v, vd), it, sc, part);
        }
        (KvRows::Q4 { q: k, d: kd }, KvRows::Q4 { q: v, d: vd }) => {
            item_typed::<TIER, _, _>(job, (k, kd), (v, vd), it, sc, part);
        }
        // `attend_isa` refuses a quantized type beside another type.
        _ => {}
    }
}

/// [`item_impl`] for one pair of cache element types (each with its Q8 scales, else empty).
#[inline(always)]
pub(super) fn item_typed<const TIER: u8, TK: KvElem, TV: KvElem>(
    job: &Job<'_>,
    (k, ks): (&[TK], &[f32]),
    (v, vs): (&[TV], &[f32]),
    it: usize,
    sc: &mut Scratch,
    part: &mut [f32],
) {
    let d = job.shape.head_dim;
    let dp = d.next_multiple_of(LANES);
    let gqa = job.gqa;
    let qw = job.shape.n_head * d;
    let (tb, g, c) = job.plan.split(it);
    let rows = job.plan.token_rows(tb);
    let nq = rows.len() * gqa;
    let nqp = padded_queries(nq);
    // Query vectors of the item, zero-padded to whole lanes, chunk-major (chunk c of vector
    // i at `(c·nqp + i)·16`, so a chunk's vectors are side by side); `lim[i]` = visible
    // positions.
    let mut lim = [0usize; MAX_QP];
    sc.qv[..nqp * dp].fill(0.0);
    for (r, t) in rows.clone().enumerate() {
        for hh in 0..gqa {
            let i = r * gqa + hh;
            let h = g * gqa + hh;
            let src = &job.q[t * qw + h * d..][..d];
            for (c, part) in src.chunks(LANES).enumerate() {
                sc.qv[(c * nqp + i) * LANES..][..part.len()].copy_from_slice(part);
            }
            lim[i] = job.pos0 + t + 1;
        }
    }
    let c0 = c * job.plan.chunk_len;
    let c1 = ((c + 1) * job.plan.chunk_len).min(job.pos0 + job.n);
    // The furthest any of the item's rows can see.
    let end = c1.min(job.pos0 + rows.end);
    let mut m = [f32::NEG_INFINITY; MAX_QP];
    let mut l = [0f32; MAX_QP];
    sc.acc[..nqp * dp].fill(0.0);
    let (ps, hs) = (job.layout.pos_stride, job.layout.head_stride);
    let early = TIER == AVX2 || (TIER == AVX512 && small_l1());
    let mut j0 = c0;
    while j0 < end {
        let bl = (end - j0).min(POS_BLOCK);
        // Software prefetch: the hardware prefetchers follow the accumulation's strided walk
        // over V poorly. The AVX2 tier asks for this block's V rows while it scores the
        // block's K rows (fetching the whole next block up front overflows a 32 KiB L1 and
        // was slower on Zen 3), and so does the AVX-512 tier on a core with an L1 data cache
        // of at most 32 KiB (`early`; Zen 4, decode step at 4096 positions, 2 threads: f16
        // 838 → 620 µs, Q8_0 505 → 404, Q4_0 472 → 443). With Zen 5's 48 KiB, where the
        // other way was tuned, the next block's K and V rows are asked for here.
        if !early {
            let next_end = (j0 + bl + POS_BLOCK).min(end);
            for nj in j0 + bl..next_end {
                prefetch(k, nj * ps + g * hs, d);
                prefetch(v, nj * ps + g * hs, d);
            }
        }
        let at = j0 * ps + g * hs;
        let kb = Block::new(k, ks, at, ps, bl, d);
        let vb = Block::new(v, vs, at, ps, bl, d);
        // Scores of the block: each K row read once for every query vector of the item.
        let kl = bl.next_multiple_of(LANES);
        block_scores::<TIER, TK, TV>(&sc.qv, dp, nqp, kb, kl, job.scale, &mut sc.s, vb, early);
        softmax_block(
            &mut sc.s,
            nqp,
            bl,
            j0,
            &lim,
            &mut m,
            &mut l,
            &mut sc.acc,
            dp,
        );
        // acc += P · V, each V row read once for every query vector.
        block_accumulate::<TIER, TV>(&mut sc.acc, dp, nqp, &sc.s, vb);
        j0 += bl;
    }
    for i in 0..nq {
        part[i * (d + 2)..][..d].copy_from_slice(&sc.acc[i * dp..][..d]);
        part[i * (d + 2) + d] = m[i];
        part[i * (d + 2) + d + 1] = l[i];
    }
}

/// Tiers of the hot loops (a const parameter, so each compiled item gets its own).
pub(super) const PLAIN: u8 = 0;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) const AVX2: u8 = 1;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) const AVX512: u8 = 2;
/// The plain arithmetic with multiplies and adds apart (WebAssembly).
pub(super) const UNFUSED: u8 = 3;
/// The plain arithmetic on relaxed SIMD's fused multiply-add (WebAssembly, where it fuses).
#[cfg_attr(
    not(all(target_arch = "wasm32", target_feature = "relaxed-simd")),
    allow(dead_code)
)]
pub(super) const FUSED: u8 = 4;

/// Whether the core's L1 data cache is at most 32 KiB (x86; never elsewhere, where the tiers
/// that ask this do not run).
pub(super) fn small_l1() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::cpu::l1d_bytes() <= 32 * 1024
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Fold 16 lane sums pairwise: lanes i + i+8, then i + i+4, i + i+2, i + i+1.
#[inline(always)]
pub(super) fn fold16(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0]
}

/// `e^x` for `x ≤ 0` (softmax inputs), within 2 ulp; 0 below −87.3 (and for −∞).
///
/// Range reduction `x = n·ln2 + r` with `n = round(x·log2 e)` (the 1.5·2²³ rounding trick, so
/// no rounding instruction is needed), a degree-6 polynomial for `e^r` on |r| ≤ ln2/2, and
/// `2^n` assembled in the exponent bits. Branch-free, so it vectorizes.
#[inline(always)]
pub(super) fn exp_approx(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = if x > -87.3 { x } else { -87.3 };
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    // e^r ≈ 1 + r + r²/2 + … + r⁶/720 (Horner).
    let p = 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // n ∈ [−126, 0]: a normal power of two. The low mantissa bits of t hold n (bits(t) =
    // bits(1.5·2²³) + n), so 2ⁿ is built with integer operations only (no float → int
    // conversion, which does not vectorize well).
    let two_n = f32::from_bits(t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    let y = p * two_n;
    if x < -87.3 {
        0.0
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::cast_precision_loss)]
    fn exp_approx_tracks_exp() {
        let mut worst = 0.0f64;
        for i in 0..=873_000 {
            let x = -(i as f32) * 1e-4;
            let want = f64::from(x).exp();
            let got = f64::from(exp_approx(x));
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 4e-7, "relative error {worst}");
        assert_eq!(exp_approx(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_approx(-100.0), 0.0);
        assert_eq!(exp_approx(0.0), 1.0);
    }
}
