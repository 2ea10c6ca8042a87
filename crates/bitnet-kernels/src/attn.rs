//! Causal grouped-query attention over a KV cache, read in place.
//!
//! `out = softmax(q · Kᵀ · scale, causal) · V` for `n` query rows at positions `pos0..pos0+n`,
//! with the K and V rows of positions `0..pos0+n` read straight from the cache in its own
//! element type (f16, f32, or Q8_0 / Q4_0 codes with their scales): no per-step conversion of the
//! history, and no `[n][n_kv]` score matrix, so memory does not grow with n².
//!
//! **Work split.** A work item is (a block of up to [`TOKEN_BLOCK`] query rows, one KV head,
//! one chunk of KV positions). It carries every query head that reads that KV head (GQA): up
//! to `TOKEN_BLOCK × gqa` query vectors (16 for a prompt of the 2B-4T model, 4 for a decode
//! step), and each K and V row is read once per item, 16 lanes at a time, widened in
//! registers once and used by all of them. Items run on the kernel [`Pool`]. Decode (one row)
//! splits the positions into chunks so that every thread streams part of the cache; the
//! chunks' partial softmax states are merged at the end (flash-decoding). The next block's
//! rows are prefetched.
//!
//! **Blocks.** Positions are taken in blocks of [`POS_BLOCK`]: the scores of every (position,
//! query vector) pair of the block, 16 at a time in registers, each group reduced to one
//! register of 16 scores by a transposing tree; then the online softmax over the block —
//! running maximum `m`, running sum `l`, the accumulator rescaled by `exp(m_old − m_new)`
//! only when the maximum moves, 16 entries at a time; then `acc += P · V` with up to 16
//! accumulator registers (vectors × chunks) kept across the block's rows. `exp` is a
//! branch-free polynomial (within 2 ulp).
//!
//! **Tiers.** The plain code (the scalar twin on x86-64; on aarch64, NEON is the baseline it
//! compiles to) defines the arithmetic: a score lane-wise accumulates `fma(q, k, ·)` over
//! 16-lane chunks and folds the lanes pairwise; the output accumulates `fma(p, v, ·)` position
//! by position. The AVX2 and AVX-512 tiers perform exactly these operations on registers
//! (intrinsics for the hot loops, the rest compiled under the tier's target features; the
//! reduction tree's additions are the pairwise fold's, only in other lanes), so
//! every tier returns bit-identical results — the tests check exactly that. (A plain build on
//! an x86-64 without FMA pays for a software fma; only tests and pre-AVX2 CPUs run it.) The
//! f16 → f32 conversion of a cache element is exact whichever instruction does it.

use std::ops::Range;

use half::f16;

use crate::aligned::AlignedBuf;
use crate::dispatch::Isa;
use crate::pool::SharedMut;
use crate::{KernelError, Pool};

/// Query rows per work item.
pub const TOKEN_BLOCK: usize = 4;
/// KV positions per online-softmax step.
pub const POS_BLOCK: usize = 64;
// Score kernels take positions in whole groups of up to 16.
const _: () = assert!(POS_BLOCK.is_multiple_of(LANES));
/// Lanes of the vectorized loops.
const LANES: usize = 16;
/// The fewest positions worth a chunk of its own (decode splits the history into chunks).
const MIN_CHUNK: usize = 256;
/// Largest number of query vectors in an item (`TOKEN_BLOCK × n_gqa`), bounding scratch.
const MAX_GQA: usize = 64;
/// Largest padded count of query vectors ([`padded_queries`] of [`MAX_GQA`]).
const MAX_QP: usize = MAX_GQA;

/// The K or V rows of one layer: `[n_pos][n_head_kv · head_dim]`, in the cache's element type.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
    /// Q8_0: element `e` is `q[e] · d[e / 32]` (ggml's Q8_0 blocks, codes and scales apart,
    /// as [`crate::rows::quantize_q8_0_split`] writes them; the scale is the block's f16 scale
    /// widened). Needs `head_dim` and both strides to be
    /// multiples of 32.
    Q8 {
        q: &'a [i8],
        d: &'a [f32],
    },
    /// Q4_0: ggml's Q4_0 blocks, nibbles and scales apart (as
    /// [`crate::rows::quantize_q4_0_split`] writes them). Byte `16b + j` holds element
    /// `32b + j` in its low nibble and element `32b + j + 16` in its high nibble; element `e`
    /// is `(nibble − 8) · d[e / 32]`. Needs `head_dim` and both strides to be multiples of 32.
    Q4 {
        q: &'a [u8],
        d: &'a [f32],
    },
}

impl KvRows<'_> {
    /// Elements held (for Q8, as far as both codes and scales reach).
    fn len(&self) -> usize {
        match self {
            KvRows::F16(s) => s.len(),
            KvRows::F32(s) => s.len(),
            KvRows::Q8 { q, d } => q.len().min(d.len().saturating_mul(Q8_BLOCK)),
            KvRows::Q4 { q, d } => q
                .len()
                .saturating_mul(2)
                .min(d.len().saturating_mul(Q8_BLOCK)),
        }
    }

    /// The values of elements `at..at + dst.len()`, widened (a code times its scale), as the
    /// kernels read them. Panics past [`Self::len`]-checked bounds, like slice indexing.
    pub fn read(&self, at: usize, dst: &mut [f32]) {
        for (i, o) in dst.iter_mut().enumerate() {
            let e = at + i;
            *o = match self {
                KvRows::F16(s) => f16::elem(s, e),
                KvRows::F32(s) => f32::elem(s, e),
                KvRows::Q8 { q, d } => i8::elem(q, e) * d[e / Q8_BLOCK],
                KvRows::Q4 { q, d } => u8::elem(q, e) * d[e / Q8_BLOCK],
            };
        }
    }

    /// 0 for f16/f32 elements, 1 for Q8_0 blocks, 2 for Q4_0 blocks.
    fn block_kind(&self) -> u8 {
        match self {
            KvRows::F16(_) | KvRows::F32(_) => 0,
            KvRows::Q8 { .. } => 1,
            KvRows::Q4 { .. } => 2,
        }
    }
}

/// Elements per Q8_0 (and Q4_0) scale.
pub const Q8_BLOCK: usize = 32;

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
    if k.block_kind() != 0 || v.block_kind() != 0 {
        // A quantized row must start on a block boundary and hold whole blocks.
        for (what, x) in [
            ("quantized attention head size", d),
            ("quantized attention position stride", layout.pos_stride),
            ("quantized attention head stride", layout.head_stride),
        ] {
            if !x.is_multiple_of(Q8_BLOCK) {
                return Err(KernelError::ShapeMismatch {
                    what,
                    expected: x.next_multiple_of(Q8_BLOCK),
                    got: x,
                });
            }
        }
        if k.block_kind() != v.block_kind() {
            return Err(KernelError::ShapeMismatch {
                what: "attention cache types (quantized keys need values of the same type)",
                expected: usize::from(k.block_kind()),
                got: usize::from(v.block_kind()),
            });
        }
    }
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
    /// `[POS_BLOCK][n_q]` scores, then probabilities (a position's query vectors side by
    /// side).
    s: AlignedBuf<f32>,
    /// The item's query vectors, each padded to a multiple of LANES, chunk-major
    /// (`[dp / LANES][n_q][LANES]`).
    qv: AlignedBuf<f32>,
    /// `[n_q][d]` accumulators, each padded to a multiple of LANES.
    acc: AlignedBuf<f32>,
}

impl Scratch {
    fn new(job: &Job<'_>) -> Scratch {
        let dp = job.shape.head_dim.next_multiple_of(LANES);
        let nq = padded_queries(TOKEN_BLOCK * job.gqa);
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

/// A cache storage unit (an f16 or f32 element, an i8 Q8_0 code, or a byte of two Q4_0
/// nibbles): widened to f32 exactly, by any instruction. Rows are addressed in units
/// (`PER` elements each) and read in 16-element chunks.
pub(crate) trait KvElem: Copy + Send + Sync {
    /// The element is an IEEE half.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const HALF: bool;
    /// The element is a code, to be multiplied by its 32-element block's scale.
    const SCALED: bool;
    /// Elements per unit (2 for Q4_0 bytes, else 1).
    const PER: usize = 1;
    /// Element `e` of a row that starts at `row[0]` (for a code, before its scale).
    fn elem(row: &[Self], e: usize) -> f32;
    /// Elements `16c..16c+16` of the row at `row`, widened.
    ///
    /// # Safety
    /// AVX-512 F and F16C are enabled in the caller (this is inlined into it); the row holds
    /// at least `16c + 16` elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn chunk16(row: *const Self, c: usize) -> std::arch::x86_64::__m512;
    /// [`Self::chunk16`] times the chunk's scale `d` (codes only): each lane the exact
    /// product `code · d`, however it is formed.
    ///
    /// # Safety
    /// As [`Self::chunk16`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk16_scaled(row: *const Self, c: usize, d: f32) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{_mm512_mul_ps, _mm512_set1_ps};
        // SAFETY: the caller's contract.
        unsafe { _mm512_mul_ps(Self::chunk16(row, c), _mm512_set1_ps(d)) }
    }
    /// Elements `16c + 8h..16c + 8h + 8` (`h` 0 or 1) of the row at `row`, widened.
    ///
    /// # Safety
    /// AVX2 and F16C are enabled in the caller; the row holds at least `16c + 16` elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn chunk8(row: *const Self, c: usize, h: usize) -> std::arch::x86_64::__m256;
    /// Both halves of chunk `c`: `[chunk8(row, c, 0), chunk8(row, c, 1)]`.
    ///
    /// # Safety
    /// As [`Self::chunk8`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn halves8(row: *const Self, c: usize) -> [std::arch::x86_64::__m256; 2] {
        // SAFETY: the caller's contract.
        unsafe { [Self::chunk8(row, c, 0), Self::chunk8(row, c, 1)] }
    }
    /// Half `h` of chunks `2b` and `2b + 1` (one 32-element block):
    /// `[chunk8(row, 2b, h), chunk8(row, 2b + 1, h)]`.
    ///
    /// # Safety
    /// As [`Self::chunk8`], with the row holding at least `32b + 32` elements.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn pair8(row: *const Self, b: usize, h: usize) -> [std::arch::x86_64::__m256; 2] {
        // SAFETY: the caller's contract.
        unsafe { [Self::chunk8(row, 2 * b, h), Self::chunk8(row, 2 * b + 1, h)] }
    }
}

impl KvElem for f16 {
    const HALF: bool = true;
    const SCALED: bool = false;
    #[inline(always)]
    fn elem(row: &[Self], e: usize) -> f32 {
        row[e].to_f32()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk16(row: *const Self, c: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{_mm256_loadu_si256, _mm512_cvtph_ps};
        // SAFETY: the caller's contract.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(row.add(c * LANES).cast())) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk8(row: *const Self, c: usize, h: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{_mm256_cvtph_ps, _mm_loadu_si128};
        // SAFETY: the caller's contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(row.add(c * LANES + 8 * h).cast())) }
    }
}

impl KvElem for f32 {
    const HALF: bool = false;
    const SCALED: bool = false;
    #[inline(always)]
    fn elem(row: &[Self], e: usize) -> f32 {
        row[e]
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk16(row: *const Self, c: usize) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(row.add(c * LANES)) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk8(row: *const Self, c: usize, h: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(row.add(c * LANES + 8 * h)) }
    }
}

impl KvElem for i8 {
    const HALF: bool = false;
    const SCALED: bool = true;
    #[inline(always)]
    fn elem(row: &[Self], e: usize) -> f32 {
        f32::from(row[e])
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk16(row: *const Self, c: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::{_mm512_cvtepi32_ps, _mm512_cvtepi8_epi32, _mm_loadu_si128};
        // SAFETY: the caller's contract.
        unsafe {
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                row.add(c * LANES).cast(),
            )))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk8(row: *const Self, c: usize, h: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{_mm256_cvtepi32_ps, _mm256_cvtepi8_epi32, _mm_loadl_epi64};
        // SAFETY: the caller's contract (AVX2 enabled in the caller: the AVX2 tier's loops).
        unsafe {
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                row.add(c * LANES + 8 * h).cast(),
            )))
        }
    }
}

/// Q4_0 bytes: element `e` of a row is the low nibble of byte `16(e / 32) + e mod 16` when
/// `e mod 32 < 16`, else its high nibble; its code is the nibble minus 8. Chunk `c` (16
/// elements) is one nibble half of the 16 bytes of block `c / 2`: low for even `c`.
impl KvElem for u8 {
    const HALF: bool = false;
    const SCALED: bool = true;
    const PER: usize = 2;
    #[inline(always)]
    fn elem(row: &[Self], e: usize) -> f32 {
        let b = row[e / 32 * 16 + e % 16];
        let nib = if e % 32 < 16 { b & 15 } else { b >> 4 };
        f32::from(nib) - 8.0
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk16(row: *const Self, c: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: block c / 2 (16 bytes) lies inside the row.
        unsafe {
            let b = _mm_loadu_si128(row.add(c / 2 * 16).cast());
            let b = if c.is_multiple_of(2) {
                b
            } else {
                _mm_srli_epi16::<4>(b)
            };
            let n = _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(15)), _mm_set1_epi8(8));
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(n))
        }
    }
    /// The 16 products `(n − 8) · d` as a table, looked up by nibble (the permute reads the
    /// low 4 bits of each index): no conversion and no multiply per element.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk16_scaled(row: *const Self, c: usize, d: f32) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: block c / 2 (16 bytes) lies inside the row.
        unsafe {
            let codes = _mm512_setr_ps(
                -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0,
                7.0,
            );
            let table = _mm512_mul_ps(codes, _mm512_set1_ps(d));
            let w = _mm512_cvtepu8_epi32(_mm_loadu_si128(row.add(c / 2 * 16).cast()));
            let idx = if c.is_multiple_of(2) {
                w
            } else {
                _mm512_srli_epi32::<4>(w)
            };
            _mm512_permutexvar_ps(idx, table)
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn chunk8(row: *const Self, c: usize, h: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: bytes 8h..8h+8 of block c / 2 lie inside the row.
        unsafe {
            let b = _mm_loadl_epi64(row.add(c / 2 * 16 + 8 * h).cast());
            let b = if c.is_multiple_of(2) {
                b
            } else {
                _mm_srli_epi16::<4>(b)
            };
            let n = _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(15)), _mm_set1_epi8(8));
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(n))
        }
    }
    /// One 16-byte load for both halves.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn halves8(row: *const Self, c: usize) -> [std::arch::x86_64::__m256; 2] {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: block c / 2 (16 bytes) lies inside the row.
        unsafe {
            let b = _mm_loadu_si128(row.add(c / 2 * 16).cast());
            let b = if c.is_multiple_of(2) {
                b
            } else {
                _mm_srli_epi16::<4>(b)
            };
            let n = _mm_sub_epi8(_mm_and_si128(b, _mm_set1_epi8(15)), _mm_set1_epi8(8));
            [
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(n)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(n))),
            ]
        }
    }
    /// One 8-byte load for both chunks: their elements share bytes (low and high nibbles).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn pair8(row: *const Self, b: usize, h: usize) -> [std::arch::x86_64::__m256; 2] {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: bytes 8h..8h+8 of block b lie inside the row.
        unsafe {
            let x = _mm_loadl_epi64(row.add(b * 16 + 8 * h).cast());
            let (m, e) = (_mm_set1_epi8(15), _mm_set1_epi8(8));
            let lo = _mm_sub_epi8(_mm_and_si128(x, m), e);
            let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(x), m), e);
            [
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
            ]
        }
    }
}

/// Ask for the cache lines of the `d` elements at element `at` (no effect on results).
#[inline(always)]
fn prefetch<T: KvElem>(s: &[T], at: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let (at, d) = (at / T::PER, d.div_ceil(T::PER));
        if at + d > s.len() {
            return;
        }
        let ptr: *const u8 = s[at..].as_ptr().cast();
        let bytes = d * std::mem::size_of::<T>();
        let mut off = 0;
        while off < bytes {
            // SAFETY: a prefetch never faults, and `ptr + off` lies inside the row.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(ptr.add(off).cast()) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, at, d);
}

/// The K or V rows of one block: `n ≥ 1` rows of `d` elements, `stride` units apart, from
/// the start of `s` (which ends with the last row); for codes, `sc` holds the scales of the
/// same elements (`sc[e / 32]` for element `e` of `s`; the block starts on a scale boundary).
#[derive(Clone, Copy)]
struct Block<'a, T> {
    s: &'a [T],
    sc: &'a [f32],
    /// Units from one row to the next.
    stride: usize,
    n: usize,
    /// Elements per row.
    d: usize,
}

impl<'a, T: KvElem> Block<'a, T> {
    /// Rows at elements `at`, `at + stride`, … of `all` (with `scales` for codes, else
    /// empty); `at` and `stride` are whole units (the caller checked: multiples of 32 for
    /// codes). Panics when the rows do not fit (the caller checked).
    fn new(
        all: &'a [T],
        scales: &'a [f32],
        at: usize,
        stride: usize,
        n: usize,
        d: usize,
    ) -> Block<'a, T> {
        let len = (n - 1) * stride + d;
        let sc = if T::SCALED {
            &scales[at / Q8_BLOCK..(at + len).div_ceil(Q8_BLOCK)]
        } else {
            &[]
        };
        Block {
            s: &all[at / T::PER..(at + len).div_ceil(T::PER)],
            sc,
            stride: stride / T::PER,
            n,
            d,
        }
    }

    /// Ask for row `jj`'s cache lines, if the block has that row (no effect on results).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // only the x86 tiers prefetch
    #[inline(always)]
    fn prefetch_row(&self, jj: usize) {
        if jj < self.n {
            prefetch(self.s, jj * self.stride * T::PER, self.d);
        }
    }

    /// Row `jj`'s units.
    fn row(&self, jj: usize) -> &'a [T] {
        &self.s[jj * self.stride..][..self.d.div_ceil(T::PER)]
    }

    /// The scale of lanes `16c..16c+16` of row `jj` (codes only).
    #[inline(always)]
    fn scale(&self, jj: usize, c: usize) -> f32 {
        self.sc[(jj * self.stride * T::PER + c * LANES) / Q8_BLOCK]
    }

    /// Where row `jj`'s scales start: lanes `16c..` use element `c / 2` (codes only).
    ///
    /// # Safety
    /// `T::SCALED` and `jj < n`; reads through the pointer stay below `d / 16` chunks.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn scales_of(&self, jj: usize) -> *const f32 {
        // SAFETY: row jj starts at element jj·stride·PER (a multiple of 32) inside `s`, so
        // its first scale is inside `sc`.
        unsafe { self.sc.as_ptr().add(jj * self.stride * T::PER / Q8_BLOCK) }
    }

    /// Lanes `16c..16c+16` of row `jj` as values, zero past the row's end (the plain way).
    #[inline(always)]
    fn chunk(&self, jj: usize, c: usize) -> [f32; LANES] {
        let r = self.row(jj);
        let mut out = [0f32; LANES];
        let lo = c * LANES;
        let hi = (lo + LANES).min(self.d);
        for (o, e) in out.iter_mut().zip(lo..hi) {
            *o = T::elem(r, e);
        }
        if T::SCALED {
            // An exact product: a code of at most 8 bits times a half's 11-bit significand.
            let d = self.scale(jj, c);
            for o in &mut out {
                *o *= d;
            }
        }
        out
    }
}

/// Query vectors an item holds, padded so that the score kernels group them evenly: a power of
/// two up to 16, else a multiple of 16. Padding vectors are zero and see no position.
fn padded_queries(nq: usize) -> usize {
    if nq <= LANES {
        nq.next_power_of_two()
    } else {
        nq.next_multiple_of(LANES)
    }
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
fn block_scores<const TIER: u8, T: KvElem, A: KvElem>(
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
                let qc = &qv[(c * nqp + i) * LANES..][..LANES];
                for x in 0..LANES {
                    a[x] = qc[x].mul_add(kc[x], a[x]);
                }
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
fn block_accumulate<const TIER: u8, T: KvElem>(
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
                let p = st[jj * nqp + i];
                let a = &mut acc[i * dp + c * LANES..][..LANES];
                for x in 0..LANES {
                    a[x] = p.mul_add(vc[x], a[x]);
                }
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
fn softmax_block(
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
fn softmax_nq<const NQ: usize>(
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
fn item_impl<const TIER: u8>(job: &Job<'_>, it: usize, sc: &mut Scratch, part: &mut [f32]) {
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
fn item_typed<const TIER: u8, TK: KvElem, TV: KvElem>(
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
const PLAIN: u8 = 0;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AVX2: u8 = 1;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AVX512: u8 = 2;

/// Whether the core's L1 data cache is at most 32 KiB (x86; never elsewhere, where the tiers
/// that ask this do not run).
fn small_l1() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::simd::l1d_bytes() <= 32 * 1024
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

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

    use super::{Block, KvElem, LANES};

    /// Which (position, query) pair of a 16-score group the tree input `t` must hold so
    /// that output lane ℓ holds pair ℓ ([`reduce16`] puts input `4s + r` in lane `4r + s`).
    const PAIR16: [usize; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];
    /// The same for [`reduce8`] (input `2s + h` lands in lane `4h + s`).
    const PAIR8: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

    /// Sixteen [`super::fold16`]s at once: the four pairwise steps (lanes i + i+8, i + i+4,
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

    /// Eight [`super::fold16`]s whose first step (lo + hi halves) is done: the steps 4, 2, 1
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

    /// [`super::block_scores`] on 16-lane registers.
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

    /// [`super::block_scores`] on 8-lane registers.
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
                            let qh = unsafe {
                                _mm256_loadu_ps(qp.add((c * nqp + qg + i) * LANES + 8 * h))
                            };
                            *a = _mm256_fmadd_ps(qh, kc[r], *a);
                        }
                    }
                }
                // Step 8 of the fold (lane x + lane x+8); tree input s takes pair PAIR8[s].
                let t: [__m256; 8] = std::array::from_fn(|t| {
                    _mm256_add_ps(halves[0][PAIR8[t]], halves[1][PAIR8[t]])
                });
                let v = _mm256_mul_ps(reduce8(t), sc);
                debug_assert!(jb * nqp + qg + 8 <= st.len());
                // SAFETY: as in `scores16` (groups of 8, jb + R ≤ kl ≤ POS_BLOCK).
                unsafe { _mm256_storeu_ps(st.as_mut_ptr().add(jb * nqp + qg), v) };
            }
        }
    }

    /// [`super::block_accumulate`] on 16-lane registers.
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

    /// [`super::block_accumulate`] on 8-lane register pairs: up to 4 vectors × one chunk.
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
}

/// `e^x` for `x ≤ 0` (softmax inputs), within 2 ulp; 0 below −87.3 (and for −∞).
///
/// Range reduction `x = n·ln2 + r` with `n = round(x·log2 e)` (the 1.5·2²³ rounding trick, so
/// no rounding instruction is needed), a degree-6 polynomial for `e^r` on |r| ≤ ln2/2, and
/// `2^n` assembled in the exponent bits. Branch-free, so it vectorizes.
#[inline(always)]
fn exp_approx(x: f32) -> f32 {
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
