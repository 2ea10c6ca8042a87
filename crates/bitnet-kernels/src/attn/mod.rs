//! Causal grouped-query attention over a KV cache, read in place.
//!
//! `out = softmax(q · Kᵀ · scale, causal) · V` for `n` query rows at positions `pos0..pos0+n`,
//! with the K and V rows of positions `0..pos0+n` read straight from the cache in its own
//! element type (f16, f32, or Q8_0 / Q4_0 codes with their scales): no per-step conversion of the
//! history, and no `[n][n_kv]` score matrix, so memory does not grow with n².
//!
//! **Work split.** A work item is (a block of query rows, one KV head, one chunk of KV
//! positions). It carries every query head that reads that KV head (GQA): the block holds
//! [`TOKEN_BLOCK`] rows, or more where the model has fewer than four query heads a KV head
//! (up to 16 query vectors: 16 for a prompt of the 2B-4T model or of a Qwen3-0.6B shape, 4 for
//! a decode step), and each K and V row is read once per item, 16 lanes at a time, widened in
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
//! an x86-64 without FMA pays for a software fma; only tests and pre-AVX2 CPUs run it.)
//! WebAssembly's hot loops use relaxed SIMD's multiply-add where the engine fuses it, with
//! the same bits; elsewhere they multiply, then add (`item_unfused`, within the tests'
//! bounds). The f16 → f32 conversion of a cache element is exact whichever instruction does it.

//!
//! **Files.** `work` cuts a call into items and runs them (a prompt's rows in place, a decode
//! step's chunks merged); `item` is one item's online softmax in the plain arithmetic; `kv`
//! reads the cache's element types; `x86` holds the AVX2 and AVX-512 hot loops.

use half::f16;

use crate::tier::Isa;
use crate::{KernelError, Pool};

mod item;
mod kv;
mod work;
#[cfg(target_arch = "x86_64")]
mod x86;

use kv::KvElem;
use work::{Job, Plan};

/// Query rows per work item (the fewest; see the module docs).
pub const TOKEN_BLOCK: usize = 4;
/// KV positions per online-softmax step.
pub const POS_BLOCK: usize = 64;
// Score kernels take positions in whole groups of up to 16.
const _: () = assert!(POS_BLOCK.is_multiple_of(LANES));
/// Lanes of the vectorized loops.
pub(super) const LANES: usize = 16;
/// The fewest positions worth a chunk of its own (decode splits the history into chunks).
pub(super) const MIN_CHUNK: usize = 256;
/// Largest number of query vectors in an item (`TOKEN_BLOCK × n_gqa`), bounding scratch.
pub(super) const MAX_GQA: usize = 64;
/// Largest padded count of query vectors ([`padded_queries`] of [`MAX_GQA`]).
pub(super) const MAX_QP: usize = MAX_GQA;

/// Query vectors an item holds, padded so that the score kernels group them evenly: a power of
/// two up to 16, else a multiple of 16. Padding vectors are zero and see no position. (The
/// work plan sizes scratch by it, the items fill it.)
pub(super) fn padded_queries(nq: usize) -> usize {
    if nq <= LANES {
        nq.next_power_of_two()
    } else {
        nq.next_multiple_of(LANES)
    }
}

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
    work::run(&job, item::select(isa), out, pool);
    Ok(())
}
