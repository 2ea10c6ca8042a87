//! Causal grouped-query attention over a KV cache, read in place.
//!
//! `out = softmax(q · Kᵀ · scale, causal) · V` for `n` query rows at positions `pos0..pos0+n`,
//! with the K and V rows of positions `0..pos0+n` read straight from the cache in its own
//! element type (f16 or f32): no per-step conversion of the history, and no `[n][n_kv]` score
//! matrix, so memory does not grow with n².
//!
//! **Work split.** A work item is (a block of up to [`TOKEN_BLOCK`] query rows, one KV head,
//! one chunk of KV positions). It carries every query head that reads that KV head (GQA): each
//! K and V row is read once per item, 16 lanes at a time, widened in registers and used by up
//! to four query vectors at once (a decode step of the 2B-4T model: exactly its four query
//! heads per KV head). Items run on the kernel [`Pool`]. Decode (one row) splits the positions
//! into chunks so that every thread streams part of the cache; the chunks' partial softmax
//! states are merged at the end (flash-decoding). The next block's rows are prefetched.
//!
//! **Online softmax.** Positions are taken in blocks of [`POS_BLOCK`]: scores of the block, a
//! running maximum `m`, a running sum `l`, and the accumulator rescaled by `exp(m_old − m_new)`
//! only when the maximum moves. `exp` is a branch-free polynomial (within 2 ulp).
//!
//! **Tiers.** The plain code (the scalar twin on x86-64; on aarch64, NEON is the baseline it
//! compiles to) defines the arithmetic: a score lane-wise accumulates `fma(q, k, ·)` over
//! 16-lane chunks and folds the lanes pairwise; the output accumulates `fma(p, v, ·)` position
//! by position. The AVX2 and AVX-512 tiers perform exactly these operations on registers
//! (intrinsics for the hot loops, the rest compiled under the tier's target features), so
//! every tier returns bit-identical results — the tests check exactly that. (A plain build on
//! an x86-64 without FMA pays for a software fma; only tests and pre-AVX2 CPUs run it.) The
//! f16 → f32 conversion of a cache element is exact whichever instruction does it.

use std::ops::Range;

use half::f16;

use crate::aligned::AlignedBuf;
use crate::dispatch::Isa;
use crate::pool::SharedMut;
use crate::{KernelError, Pool};

/// `f::<N>(args)` with N = `n` (1..=4): the query-count-specialized x86 loops.
#[cfg(target_arch = "x86_64")]
macro_rules! by_count {
    ($n:expr, $($f:ident)::+, ($($arg:expr),*)) => {
        match $n {
            4 => $($f)::+::<4>($($arg),*),
            3 => $($f)::+::<3>($($arg),*),
            2 => $($f)::+::<2>($($arg),*),
            _ => $($f)::+::<1>($($arg),*),
        }
    };
}

/// Query rows per work item.
pub const TOKEN_BLOCK: usize = 4;
/// KV positions per online-softmax step.
pub const POS_BLOCK: usize = 32;
/// Lanes of the vectorized loops.
const LANES: usize = 16;
/// The fewest positions worth a chunk of its own (decode splits the history into chunks).
const MIN_CHUNK: usize = 256;
/// Largest number of query vectors in an item (`TOKEN_BLOCK × n_gqa`), bounding scratch.
const MAX_GQA: usize = 64;

/// The K or V rows of one layer: `[n_pos][n_head_kv · head_dim]`, in the cache's element type.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
}

impl KvRows<'_> {
    fn len(&self) -> usize {
        match self {
            KvRows::F16(s) => s.len(),
            KvRows::F32(s) => s.len(),
        }
    }
}

/// Head counts and size of an attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// KV heads (`n_head` must be a multiple).
    pub n_head_kv: usize,
    /// Elements per head.
    pub head_dim: usize,
}

impl AttnShape {
    fn check(&self) -> Result<usize, KernelError> {
        let gqa = self.n_head.checked_div(self.n_head_kv).unwrap_or(0);
        if self.head_dim == 0 || gqa == 0 || gqa * self.n_head_kv != self.n_head {
            return Err(KernelError::ShapeMismatch {
                what: "attention heads (n_head must be a non-zero multiple of n_head_kv)",
                expected: self.n_head_kv,
                got: self.n_head,
            });
        }
        if gqa * TOKEN_BLOCK > MAX_GQA {
            return Err(KernelError::ShapeMismatch {
                what: "query heads per KV head",
                expected: MAX_GQA / TOKEN_BLOCK,
                got: gqa,
            });
        }
        Ok(gqa)
    }
}

/// Where the row of (position `j`, KV head `g`) starts in a [`KvRows`]: element
/// `j · pos_stride + g · head_stride`, then `head_dim` contiguous elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub pos_stride: usize,
    pub head_stride: usize,
}

impl KvLayout {
    /// `[pos][n_head_kv][head_dim]`: a position's heads side by side (ggml's layout).
    #[must_use]
    pub fn position_major(shape: &AttnShape) -> KvLayout {
        KvLayout {
            pos_stride: shape.n_head_kv * shape.head_dim,
            head_stride: shape.head_dim,
        }
    }

    /// `[n_head_kv][n_ctx][head_dim]`: each head's history contiguous (what one work item
    /// streams).
    #[must_use]
    pub fn head_major(shape: &AttnShape, n_ctx: usize) -> KvLayout {
        KvLayout {
            pos_stride: shape.head_dim,
            head_stride: n_ctx * shape.head_dim,
        }
    }

    /// Elements a buffer needs to hold `n_pos` positions (None on overflow).
    fn needed(&self, shape: &AttnShape, n_pos: usize) -> Option<usize> {
        if n_pos == 0 {
            return Some(0);
        }
        (n_pos - 1)
            .checked_mul(self.pos_stride)?
            .checked_add((shape.n_head_kv - 1).checked_mul(self.head_stride)?)?
            .checked_add(shape.head_dim)
    }
}

/// Causal GQA attention on the selected tier: `out` (`[n][n_head·head_dim]`) for the `n`
/// query rows `q` (same shape, roped) at positions `pos0..pos0+n`, over the cache rows of
/// positions `0..pos0+n` in `k` and `v`, with scores scaled by `scale`.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    shape: &AttnShape,
    q: &[f32],
    k: KvRows<'_>,
    v: KvRows<'_>,
    layout: KvLayout,
    pos0: usize,
    n: usize,
    scale: f32,
    out: &mut [f32],
    pool: &Pool,
) -> Result<(), KernelError> {
    attend_isa(
        crate::isa(),
        shape,
        q,
        k,
        v,
        layout,
        pos0,
        n,
        scale,
        out,
        pool,
    )
}

/// [`attend`] on a given tier (tests and benchmarks); a tier this CPU lacks runs the plain one.
#[allow(clippy::too_many_arguments)]
pub fn attend_isa(
    isa: Isa,
    shape: &AttnShape,
    q: &[f32],
    k: KvRows<'_>,
    v: KvRows<'_>,
    layout: KvLayout,
    pos0: usize,
    n: usize,
    scale: f32,
    out: &mut [f32],
    pool: &Pool,
) -> Result<(), KernelError> {
    let gqa = shape.check()?;
    let d = shape.head_dim;
    let qw = shape.n_head * d;
    let n_kv = pos0.checked_add(n).ok_or(KernelError::Overflow {
        what: "attention positions",
    })?;
    let need = |what: &'static str, expected: usize, got: usize| {
        if got < expected {
            Err(KernelError::ShapeMismatch {
                what,
                expected,
                got,
            })
        } else {
            Ok(())
        }
    };
    let q_len = n.checked_mul(qw).ok_or(KernelError::Overflow {
        what: "attention queries",
    })?;
    if layout.pos_stride < d && layout.head_stride < d {
        return Err(KernelError::ShapeMismatch {
            what: "attention cache strides (rows overlap)",
            expected: d,
            got: layout.pos_stride.max(layout.head_stride),
        });
    }
    let kv_len = layout.needed(shape, n_kv).ok_or(KernelError::Overflow {
        what: "attention cache",
    })?;
    if q.len() != q_len {
        return Err(KernelError::ShapeMismatch {
            what: "attention queries",
            expected: q_len,
            got: q.len(),
        });
    }
    if out.len() != q_len {
        return Err(KernelError::ShapeMismatch {
            what: "attention output",
            expected: q_len,
            got: out.len(),
        });
    }
    need("attention keys", kv_len, k.len())?;
    need("attention values", kv_len, v.len())?;
    if n == 0 {
        return Ok(());
    }

    let plan = Plan::new(shape, pos0, n, pool.n_threads());
    let job = Job {
        shape: *shape,
        gqa,
        q,
        k,
        v,
        layout,
        pos0,
        n,
        scale,
        plan,
    };
    let run: fn(&Job<'_>, usize, &mut Scratch, &mut [f32]) = select(isa);
    if plan.chunks == 1 {
        // Each (row, head) of `out` belongs to exactly one item: write in place.
        let outp = SharedMut::new(out);
        pool.for_rows(plan.items(), 1, &|items: Range<usize>| {
            let mut scratch = Scratch::new(&job);
            let mut part = vec![0f32; job.part_len()];
            for it in items {
                run(&job, it, &mut scratch, &mut part);
                let (tb, g, _) = plan.split(it);
                for (r, t) in plan.token_rows(tb).enumerate() {
                    for hh in 0..gqa {
                        let h = g * gqa + hh;
                        let src = &part[(r * gqa + hh) * (d + 2)..][..d + 2];
                        let l = src[d + 1];
                        let dst0 = t * qw + h * d;
                        // SAFETY: row t, head h belong to this item only; in bounds (q_len).
                        let dst = unsafe { outp.slice_mut(dst0..dst0 + d) };
                        finish_row(&src[..d], l, dst);
                    }
                }
            }
        });
        return Ok(());
    }
    // Several chunks per (rows, head): keep each item's partial state, then merge.
    let part_len = job.part_len();
    let mut parts = vec![0f32; plan.items() * part_len];
    let partp = SharedMut::new(&mut parts);
    pool.for_rows(plan.items(), 1, &|items: Range<usize>| {
        let mut scratch = Scratch::new(&job);
        for it in items {
            // SAFETY: item `it` owns its own partial slot; in bounds by construction.
            let part = unsafe { partp.slice_mut(it * part_len..(it + 1) * part_len) };
            run(&job, it, &mut scratch, part);
        }
    });
    let mut acc = vec![0f32; d];
    for tb in 0..plan.token_blocks {
        for g in 0..shape.n_head_kv {
            for (r, t) in plan.token_rows(tb).enumerate() {
                for hh in 0..gqa {
                    let slot = (r * gqa + hh) * (d + 2);
                    let states = (0..plan.chunks).map(|c| {
                        let it = plan.item(tb, g, c);
                        &parts[it * part_len + slot..][..d + 2]
                    });
                    let m = states
                        .clone()
                        .map(|s| s[d])
                        .fold(f32::NEG_INFINITY, f32::max);
                    acc.fill(0.0);
                    let mut l = 0.0f32;
                    for s in states {
                        if s[d + 1] == 0.0 {
                            continue; // a chunk wholly after this row's position
                        }
                        let w = (s[d] - m).exp();
                        l += s[d + 1] * w;
                        for (a, &x) in acc.iter_mut().zip(&s[..d]) {
                            *a += x * w;
                        }
                    }
                    let h = g * gqa + hh;
                    finish_row(&acc, l, &mut out[t * qw + h * d..][..d]);
                }
            }
        }
    }
    Ok(())
}

/// `dst = acc / l`.
fn finish_row(acc: &[f32], l: f32, dst: &mut [f32]) {
    let inv = 1.0 / l;
    for (o, &a) in dst.iter_mut().zip(acc) {
        *o = a * inv;
    }
}

/// How the call is cut into items.
#[derive(Debug, Clone, Copy)]
struct Plan {
    token_blocks: usize,
    n_head_kv: usize,
    chunks: usize,
    chunk_len: usize,
    n: usize,
}

impl Plan {
    fn new(shape: &AttnShape, pos0: usize, n: usize, threads: usize) -> Plan {
        let token_blocks = n.div_ceil(TOKEN_BLOCK);
        let n_kv = pos0 + n;
        let base = token_blocks * shape.n_head_kv;
        // Enough items for every thread several times over, in chunks of useful length.
        let want = (4 * threads).div_ceil(base.max(1));
        let chunks = want.min(n_kv.div_ceil(MIN_CHUNK)).max(1);
        let chunk_len = n_kv.div_ceil(chunks).div_ceil(POS_BLOCK) * POS_BLOCK;
        Plan {
            token_blocks,
            n_head_kv: shape.n_head_kv,
            chunks: n_kv.div_ceil(chunk_len),
            chunk_len,
            n,
        }
    }

    fn items(&self) -> usize {
        self.token_blocks * self.n_head_kv * self.chunks
    }

    fn item(&self, tb: usize, g: usize, c: usize) -> usize {
        (tb * self.n_head_kv + g) * self.chunks + c
    }

    /// (token block, KV head, chunk) of item `it`.
    fn split(&self, it: usize) -> (usize, usize, usize) {
        let c = it % self.chunks;
        let rest = it / self.chunks;
        (rest / self.n_head_kv, rest % self.n_head_kv, c)
    }

    fn token_rows(&self, tb: usize) -> Range<usize> {
        tb * TOKEN_BLOCK..((tb + 1) * TOKEN_BLOCK).min(self.n)
    }
}

struct Job<'a> {
    shape: AttnShape,
    gqa: usize,
    q: &'a [f32],
    k: KvRows<'a>,
    v: KvRows<'a>,
    layout: KvLayout,
    pos0: usize,
    n: usize,
    scale: f32,
    plan: Plan,
}

impl Job<'_> {
    /// Floats of one item's partial state: per query vector, `acc[d]`, `m`, `l`.
    fn part_len(&self) -> usize {
        TOKEN_BLOCK * self.gqa * (self.shape.head_dim + 2)
    }
}

/// Per-thread buffers, reused across items, on 64-byte boundaries: rows of `dp` (a multiple
/// of 16) floats then never straddle two cache lines in the 512-bit loops.
struct Scratch {
    /// `[n_q][POS_BLOCK]` scores, then probabilities.
    s: AlignedBuf<f32>,
    /// `[n_q][d]` the item's query vectors, each padded to a multiple of LANES.
    qv: AlignedBuf<f32>,
    /// `[n_q][d]` accumulators, each padded to a multiple of LANES.
    acc: AlignedBuf<f32>,
}

impl Scratch {
    fn new(job: &Job<'_>) -> Scratch {
        let dp = job.shape.head_dim.next_multiple_of(LANES);
        let nq = TOKEN_BLOCK * job.gqa;
        Scratch {
            s: AlignedBuf::zeroed(nq * POS_BLOCK),
            qv: AlignedBuf::zeroed(nq * dp),
            acc: AlignedBuf::zeroed(nq * dp),
        }
    }
}

fn select(isa: Isa) -> fn(&Job<'_>, usize, &mut Scratch, &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 && Isa::Avx512.is_supported() {
            return item_avx512;
        }
        if isa >= Isa::Avx2 && Isa::Avx2.is_supported() {
            return item_avx2;
        }
    }
    let _ = isa;
    item_plain
}

fn item_plain(job: &Job<'_>, it: usize, s: &mut Scratch, part: &mut [f32]) {
    item_impl::<PLAIN>(job, it, s, part);
}

#[cfg(target_arch = "x86_64")]
fn item_avx2(job: &Job<'_>, it: usize, s: &mut Scratch, part: &mut [f32]) {
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
fn item_avx512(job: &Job<'_>, it: usize, s: &mut Scratch, part: &mut [f32]) {
    /// # Safety
    /// AVX-512 F/BW and the AVX2 tier's features are available.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn inner(job: &Job<'_>, it: usize, s: &mut Scratch, part: &mut [f32]) {
        item_impl::<AVX512>(job, it, s, part);
    }
    // SAFETY: `select` returns this only when the AVX-512 tier is supported.
    unsafe { inner(job, it, s, part) }
}

/// One cache row (`head_dim` elements) in the cache's element type.
#[derive(Clone, Copy)]
enum Row<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
}

impl<'a> KvRows<'a> {
    /// Ask for the cache lines of the row at `at` (no effect on results).
    #[inline(always)]
    fn prefetch(&self, at: usize, d: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let (ptr, bytes): (*const u8, usize) = match *self {
                KvRows::F16(s) if at + d <= s.len() => (s[at..].as_ptr().cast(), 2 * d),
                KvRows::F32(s) if at + d <= s.len() => (s[at..].as_ptr().cast(), 4 * d),
                _ => return,
            };
            let mut off = 0;
            while off < bytes {
                // SAFETY: a prefetch never faults, and `ptr + off` lies inside the row.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(ptr.add(off).cast()) };
                off += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (at, d);
    }

    #[inline(always)]
    fn row(&self, at: usize, d: usize) -> Row<'a> {
        match *self {
            KvRows::F16(s) => Row::F16(&s[at..at + d]),
            KvRows::F32(s) => Row::F32(&s[at..at + d]),
        }
    }
}

impl Row<'_> {
    /// Lanes `16c..16c+16` widened to f32, zero past the row's end (the plain way).
    #[inline(always)]
    fn chunk(&self, c: usize) -> [f32; LANES] {
        let mut out = [0f32; LANES];
        let lo = c * LANES;
        match *self {
            Row::F16(r) => {
                let hi = (lo + LANES).min(r.len());
                for (o, x) in out.iter_mut().zip(&r[lo..hi]) {
                    *o = x.to_f32();
                }
            }
            Row::F32(r) => {
                let hi = (lo + LANES).min(r.len());
                out[..hi - lo].copy_from_slice(&r[lo..hi]);
            }
        }
        out
    }

    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn len(&self) -> usize {
        match self {
            Row::F16(r) => r.len(),
            Row::F32(r) => r.len(),
        }
    }
}

/// Up to four query vectors (`nqg`, each `dp` long, zero-padded) dotted with one K row:
/// lane `x` accumulates `fma(q[16c + x], k[16c + x], ·)` over chunks c, then the lanes fold
/// pairwise ([`fold16`]). Every tier performs exactly these operations.
#[inline(always)]
fn scores4<const TIER: u8>(q: &[f32], dp: usize, nqg: usize, k: Row<'_>, out: &mut [f32; 4]) {
    #[cfg(target_arch = "x86_64")]
    {
        if TIER == AVX512 {
            // SAFETY: TIER == AVX512 only inside `item_avx512` (AVX-512 F/BW, F16C enabled).
            unsafe { by_count!(nqg, x86::scores4_avx512, (q, dp, k, out)) };
            return;
        }
        if TIER == AVX2 {
            // SAFETY: TIER == AVX2 only inside `item_avx2` (AVX2, FMA, F16C enabled).
            unsafe { by_count!(nqg, x86::scores4_avx2, (q, dp, k, out)) };
            return;
        }
    }
    let mut acc = [[0f32; LANES]; 4];
    for c in 0..dp / LANES {
        let kc = k.chunk(c);
        for (i, a) in acc.iter_mut().enumerate().take(nqg) {
            let qc = &q[i * dp + c * LANES..][..LANES];
            for x in 0..LANES {
                a[x] = qc[x].mul_add(kc[x], a[x]);
            }
        }
    }
    for i in 0..nqg {
        out[i] = fold16(acc[i]);
    }
}

/// `acc[i] += Σ_jj p[i][jj] · V_jj` for up to four queries: lane by lane, one fused
/// multiply-add per position, in position order. `acc` is `nqg × dp`, `p` is
/// `nqg × POS_BLOCK`, `rows` the block's V rows.
#[inline(always)]
fn accumulate<const TIER: u8>(acc: &mut [f32], dp: usize, nqg: usize, p: &[f32], rows: &[Row<'_>]) {
    #[cfg(target_arch = "x86_64")]
    {
        if TIER == AVX512 {
            // SAFETY: as in `scores4`.
            unsafe { by_count!(nqg, x86::accumulate_avx512, (acc, dp, p, rows)) };
            return;
        }
        if TIER == AVX2 {
            // SAFETY: as in `scores4`.
            unsafe { by_count!(nqg, x86::accumulate_avx2, (acc, dp, p, rows)) };
            return;
        }
    }
    for c in 0..dp / LANES {
        let mut a = [[0f32; LANES]; 4];
        for (i, ai) in a.iter_mut().enumerate().take(nqg) {
            ai.copy_from_slice(&acc[i * dp + c * LANES..][..LANES]);
        }
        for (jj, r) in rows.iter().enumerate() {
            let vc = r.chunk(c);
            for (i, ai) in a.iter_mut().enumerate().take(nqg) {
                let pj = p[i * POS_BLOCK + jj];
                for x in 0..LANES {
                    ai[x] = pj.mul_add(vc[x], ai[x]);
                }
            }
        }
        for (i, ai) in a.iter().enumerate().take(nqg) {
            acc[i * dp + c * LANES..][..LANES].copy_from_slice(ai);
        }
    }
}

/// One work item: online softmax over the item's positions for its query vectors; writes
/// `acc[d], m, l` per query vector into `part`.
#[inline(always)]
fn item_impl<const TIER: u8>(job: &Job<'_>, it: usize, sc: &mut Scratch, part: &mut [f32]) {
    let d = job.shape.head_dim;
    let dp = d.next_multiple_of(LANES);
    let gqa = job.gqa;
    let qw = job.shape.n_head * d;
    let (tb, g, c) = job.plan.split(it);
    let rows = job.plan.token_rows(tb);
    let nq = rows.len() * gqa;
    // Query vectors of the item, zero-padded to whole lanes; `lim[i]` = visible positions.
    let mut lim = [0usize; MAX_GQA];
    for (r, t) in rows.clone().enumerate() {
        for hh in 0..gqa {
            let i = r * gqa + hh;
            let h = g * gqa + hh;
            let dst = &mut sc.qv[i * dp..(i + 1) * dp];
            dst[..d].copy_from_slice(&job.q[t * qw + h * d..][..d]);
            dst[d..].fill(0.0);
            lim[i] = job.pos0 + t + 1;
        }
    }
    let c0 = c * job.plan.chunk_len;
    let c1 = ((c + 1) * job.plan.chunk_len).min(job.pos0 + job.n);
    // The furthest any of the item's rows can see.
    let end = c1.min(job.pos0 + rows.end);
    let mut m = [f32::NEG_INFINITY; MAX_GQA];
    let mut l = [0f32; MAX_GQA];
    sc.acc[..nq * dp].fill(0.0);
    let (ps, hs) = (job.layout.pos_stride, job.layout.head_stride);
    let mut j0 = c0;
    while j0 < end {
        let bl = (end - j0).min(POS_BLOCK);
        // Scores of the block: each K row read once for every query vector of the item.
        let mut four = [0f32; 4];
        let next_end = (j0 + bl + POS_BLOCK).min(end);
        for jj in 0..bl {
            // Software prefetch of the next block's K and V rows: the hardware prefetchers
            // follow these strided streams poorly.
            let nj = j0 + bl + jj;
            if nj < next_end {
                job.k.prefetch(nj * ps + g * hs, d);
                job.v.prefetch(nj * ps + g * hs, d);
            }
            let k = job.k.row((j0 + jj) * ps + g * hs, d);
            for q0 in (0..nq).step_by(4) {
                let nqg = (nq - q0).min(4);
                scores4::<TIER>(&sc.qv[q0 * dp..], dp, nqg, k, &mut four);
                for (i, &x) in four.iter().enumerate().take(nqg) {
                    sc.s[(q0 + i) * POS_BLOCK + jj] = x * job.scale;
                }
            }
        }
        // Online softmax per query vector; probabilities past a row's position are 0.
        for i in 0..nq {
            let s = &mut sc.s[i * POS_BLOCK..(i + 1) * POS_BLOCK];
            let vis = lim[i].saturating_sub(j0).min(bl);
            s[vis..].fill(0.0);
            if vis == 0 {
                continue;
            }
            let bm = max_of(&s[..vis]);
            if bm > m[i] {
                // The running maximum moves: rescale what was accumulated.
                let corr = exp_approx(m[i] - bm);
                l[i] *= corr;
                for a in &mut sc.acc[i * dp..(i + 1) * dp] {
                    *a *= corr;
                }
                m[i] = bm;
            }
            l[i] += exp_block(&mut s[..vis], m[i]);
        }
        // acc += P · V, each V row read once for every query vector.
        let mut vrows = [Row::F32(&[]); POS_BLOCK];
        for (jj, r) in vrows.iter_mut().enumerate().take(bl) {
            *r = job.v.row((j0 + jj) * ps + g * hs, d);
        }
        for q0 in (0..nq).step_by(4) {
            let nqg = (nq - q0).min(4);
            accumulate::<TIER>(
                &mut sc.acc[q0 * dp..],
                dp,
                nqg,
                &sc.s[q0 * POS_BLOCK..],
                &vrows[..bl],
            );
        }
        j0 += bl;
    }
    for i in 0..nq {
        part[i * (d + 2)..][..d].copy_from_slice(&sc.acc[i * dp..][..d]);
        part[i * (d + 2) + d] = m[i];
        part[i * (d + 2) + d + 1] = l[i];
    }
}

/// Tiers of the hot loops (a const parameter, so each compiled item gets its own).
const PLAIN: u8 = 0;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AVX2: u8 = 1;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AVX512: u8 = 2;

/// Fold 16 lane sums pairwise: lanes i + i+8, then i + i+4, i + i+2, i + i+1.
#[inline(always)]
fn fold16(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0]
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Row, LANES, POS_BLOCK};

    /// The last three pairwise steps of [`super::fold16`] on 8 lanes.
    #[inline]
    #[target_feature(enable = "avx")]
    fn fold8(v: __m256) -> f32 {
        let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        let x = _mm_add_ss(x, _mm_shuffle_ps::<0b01>(x, x));
        _mm_cvtss_f32(x)
    }

    /// [`super::fold16`] of a 16-lane register.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn fold16_avx512(v: __m512) -> f32 {
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        fold8(_mm256_add_ps(lo, hi))
    }

    /// Chunk `c` of a row as 16 lanes (zero past the row's end). Inlined into its callers,
    /// which enable the features.
    ///
    /// # Safety
    /// AVX-512 F and F16C are available.
    #[inline(always)]
    unsafe fn chunk_avx512(r: Row<'_>, c: usize) -> __m512 {
        let lo = c * LANES;
        if lo + LANES > r.len() {
            let t = r.chunk(c);
            // SAFETY: t holds 16 floats.
            return unsafe { _mm512_loadu_ps(t.as_ptr()) };
        }
        match r {
            // SAFETY: lo + 16 ≤ len (checked above).
            Row::F16(x) => unsafe {
                _mm512_cvtph_ps(_mm256_loadu_si256(x.as_ptr().add(lo).cast()))
            },
            // SAFETY: as above.
            Row::F32(x) => unsafe { _mm512_loadu_ps(x.as_ptr().add(lo)) },
        }
    }

    /// Chunk `c` of a row as two 8-lane halves (zero past the row's end). Inlined into its
    /// callers, which enable the features.
    ///
    /// # Safety
    /// AVX and F16C are available.
    #[inline(always)]
    unsafe fn chunk_avx2(r: Row<'_>, c: usize) -> (__m256, __m256) {
        let lo = c * LANES;
        if lo + LANES > r.len() {
            let t = r.chunk(c);
            // SAFETY: t holds 16 floats.
            return unsafe {
                (
                    _mm256_loadu_ps(t.as_ptr()),
                    _mm256_loadu_ps(t.as_ptr().add(8)),
                )
            };
        }
        match r {
            // SAFETY: lo + 16 ≤ len (checked above).
            Row::F16(x) => unsafe {
                let p = x.as_ptr().add(lo);
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(8).cast())),
                )
            },
            // SAFETY: as above.
            Row::F32(x) => unsafe {
                let p = x.as_ptr().add(lo);
                (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
            },
        }
    }

    /// [`super::scores4`] on 16-lane registers.
    ///
    /// # Safety
    /// AVX-512 F and F16C are available; `q` holds `nqg ≤ 4` vectors of `dp` (a multiple of
    /// 16) elements.
    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    pub(super) unsafe fn scores4_avx512<const N: usize>(
        q: &[f32],
        dp: usize,
        k: Row<'_>,
        out: &mut [f32; 4],
    ) {
        let nqg = N;
        let q = &q[..nqg * dp];
        let mut a = [_mm512_setzero_ps(); N];
        for c in 0..dp / LANES {
            // SAFETY: features enabled by the caller.
            let kc = unsafe { chunk_avx512(k, c) };
            for (i, ai) in a.iter_mut().enumerate().take(nqg) {
                // SAFETY: i·dp + 16c + 16 ≤ nqg·dp = q.len().
                let qc = unsafe { _mm512_loadu_ps(q.as_ptr().add(i * dp + c * LANES)) };
                *ai = _mm512_fmadd_ps(qc, kc, *ai);
            }
        }
        for i in 0..nqg {
            out[i] = fold16_avx512(a[i]);
        }
    }

    /// [`super::scores4`] on 8-lane register pairs.
    ///
    /// # Safety
    /// AVX, FMA and F16C are available; `q` as in [`scores4_avx512`].
    #[inline]
    #[target_feature(enable = "avx,fma,f16c")]
    pub(super) unsafe fn scores4_avx2<const N: usize>(
        q: &[f32],
        dp: usize,
        k: Row<'_>,
        out: &mut [f32; 4],
    ) {
        let nqg = N;
        let q = &q[..nqg * dp];
        let mut lo = [_mm256_setzero_ps(); N];
        let mut hi = [_mm256_setzero_ps(); N];
        for c in 0..dp / LANES {
            // SAFETY: features enabled by the caller.
            let (k0, k1) = unsafe { chunk_avx2(k, c) };
            for i in 0..nqg {
                // SAFETY: i·dp + 16c + 16 ≤ q.len().
                unsafe {
                    let p = q.as_ptr().add(i * dp + c * LANES);
                    lo[i] = _mm256_fmadd_ps(_mm256_loadu_ps(p), k0, lo[i]);
                    hi[i] = _mm256_fmadd_ps(_mm256_loadu_ps(p.add(8)), k1, hi[i]);
                }
            }
        }
        for i in 0..nqg {
            out[i] = fold8(_mm256_add_ps(lo[i], hi[i]));
        }
    }

    /// [`super::accumulate`] on 16-lane registers.
    ///
    /// # Safety
    /// AVX-512 F and F16C are available; `acc` holds `nqg ≤ 4` rows of `dp`, `p` holds
    /// `nqg` rows of `POS_BLOCK`.
    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn accumulate_avx512<const N: usize>(
        acc: &mut [f32],
        dp: usize,
        p: &[f32],
        rows: &[Row<'_>],
    ) {
        let nqg = N;
        let acc = &mut acc[..nqg * dp];
        let p32 = p[..nqg * POS_BLOCK].as_chunks::<POS_BLOCK>().0;
        let rows = &rows[..rows.len().min(POS_BLOCK)];
        for c in 0..dp / LANES {
            let mut a = [_mm512_setzero_ps(); N];
            for (i, ai) in a.iter_mut().enumerate().take(nqg) {
                // SAFETY: i·dp + 16c + 16 ≤ acc.len().
                *ai = unsafe { _mm512_loadu_ps(acc.as_ptr().add(i * dp + c * LANES)) };
            }
            for (jj, &r) in rows.iter().enumerate() {
                // SAFETY: features enabled by the caller.
                let vc = unsafe { chunk_avx512(r, c) };
                for (ai, pi) in a.iter_mut().zip(p32).take(nqg) {
                    *ai = _mm512_fmadd_ps(_mm512_set1_ps(pi[jj]), vc, *ai);
                }
            }
            for (i, ai) in a.iter().enumerate().take(nqg) {
                // SAFETY: as for the load.
                unsafe { _mm512_storeu_ps(acc.as_mut_ptr().add(i * dp + c * LANES), *ai) };
            }
        }
    }

    /// [`super::accumulate`] on 8-lane register pairs.
    ///
    /// # Safety
    /// AVX, FMA and F16C are available; shapes as in [`accumulate_avx512`].
    #[inline]
    #[target_feature(enable = "avx,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn accumulate_avx2<const N: usize>(
        acc: &mut [f32],
        dp: usize,
        p: &[f32],
        rows: &[Row<'_>],
    ) {
        let nqg = N;
        let acc = &mut acc[..nqg * dp];
        let p32 = p[..nqg * POS_BLOCK].as_chunks::<POS_BLOCK>().0;
        let rows = &rows[..rows.len().min(POS_BLOCK)];
        for c in 0..dp / LANES {
            let mut lo = [_mm256_setzero_ps(); N];
            let mut hi = [_mm256_setzero_ps(); N];
            for i in 0..nqg {
                // SAFETY: i·dp + 16c + 16 ≤ acc.len().
                unsafe {
                    let a = acc.as_ptr().add(i * dp + c * LANES);
                    lo[i] = _mm256_loadu_ps(a);
                    hi[i] = _mm256_loadu_ps(a.add(8));
                }
            }
            for (jj, &r) in rows.iter().enumerate() {
                // SAFETY: features enabled by the caller.
                let (v_lo, v_hi) = unsafe { chunk_avx2(r, c) };
                for ((l, h), pi) in lo.iter_mut().zip(hi.iter_mut()).zip(p32).take(nqg) {
                    let pj = _mm256_set1_ps(pi[jj]);
                    *l = _mm256_fmadd_ps(pj, v_lo, *l);
                    *h = _mm256_fmadd_ps(pj, v_hi, *h);
                }
            }
            for i in 0..nqg {
                // SAFETY: as for the load.
                unsafe {
                    let a = acc.as_mut_ptr().add(i * dp + c * LANES);
                    _mm256_storeu_ps(a, lo[i]);
                    _mm256_storeu_ps(a.add(8), hi[i]);
                }
            }
        }
    }
}

/// The largest element (−∞ for none); comparisons only, so it vectorizes.
#[inline(always)]
fn max_of(x: &[f32]) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for &v in x {
        m = if v > m { v } else { m };
    }
    m
}

/// `x[i] = exp(x[i] − m)` for every element; returns their sum (sequential).
#[inline(always)]
fn exp_block(x: &mut [f32], m: f32) -> f32 {
    for v in x.iter_mut() {
        *v = exp_approx(*v - m);
    }
    x.iter().sum()
}

/// `e^x` for `x ≤ 0` (softmax inputs), within 2 ulp; 0 below −87.3 (and for −∞).
///
/// Range reduction `x = n·ln2 + r` with `n = round(x·log2 e)` (the 1.5·2²³ rounding trick, so
/// no rounding instruction is needed), a degree-6 polynomial for `e^r` on |r| ≤ ln2/2, and
/// `2^n` assembled in the exponent bits. Branch-free, so it vectorizes.
#[inline(always)]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn exp_approx(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = if x > -87.3 { x } else { -87.3 };
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    // e^r ≈ 1 + r + r²/2 + … + r⁶/720 (Horner).
    let p = 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // n ∈ [−126, 0]: a normal power of two.
    let two_n = f32::from_bits(((n as i32 + 127) as u32) << 23);
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

    #[test]
    fn plans_cover_every_position_once() {
        let shape = AttnShape {
            n_head: 20,
            n_head_kv: 5,
            head_dim: 128,
        };
        for (pos0, n, threads) in [
            (0, 1, 2),
            (4095, 1, 2),
            (0, 512, 2),
            (100, 7, 1),
            (9000, 1, 8),
        ] {
            let p = Plan::new(&shape, pos0, n, threads);
            assert!(p.chunks >= 1 && p.chunk_len.is_multiple_of(POS_BLOCK));
            assert!(p.chunks * p.chunk_len >= pos0 + n);
            assert!((p.chunks - 1) * p.chunk_len < pos0 + n);
            for it in 0..p.items() {
                let (tb, g, c) = p.split(it);
                assert_eq!(p.item(tb, g, c), it);
            }
        }
    }
}
