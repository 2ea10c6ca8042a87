//! How a call is cut into work items and run on the pool: a prompt's rows in place, a
//! decode step's chunks of positions merged at the end (flash-decoding).

use std::ops::Range;

use super::{
    padded_queries, AttnShape, KvLayout, KvRows, LANES, MAX_GQA, MIN_CHUNK, POS_BLOCK, TOKEN_BLOCK,
};
use crate::aligned::AlignedBuf;
use crate::pool::SharedMut;
use crate::Pool;

/// How the call is cut into items.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    /// Query rows an item takes ([`token_block`]).
    pub(super) token_block: usize,
    pub(super) token_blocks: usize,
    pub(super) n_head_kv: usize,
    pub(super) chunks: usize,
    pub(super) chunk_len: usize,
    pub(super) n: usize,
}

impl Plan {
    pub(super) fn new(shape: &AttnShape, pos0: usize, n: usize, threads: usize) -> Plan {
        // No more rows than the call has (a decode step: one), so that the items' scratch
        // and partial states are sized for the rows they hold.
        let token_block = token_block(shape.n_head / shape.n_head_kv.max(1)).min(n.max(1));
        let token_blocks = n.div_ceil(token_block);
        let n_kv = pos0 + n;
        let base = token_blocks * shape.n_head_kv;
        // Enough items for every thread several times over, in chunks of useful length.
        let want = (4 * threads).div_ceil(base.max(1));
        let chunks = want.min(n_kv.div_ceil(MIN_CHUNK)).max(1);
        let chunk_len = n_kv.div_ceil(chunks).div_ceil(POS_BLOCK) * POS_BLOCK;
        Plan {
            token_block,
            token_blocks,
            n_head_kv: shape.n_head_kv,
            chunks: n_kv.div_ceil(chunk_len),
            chunk_len,
            n,
        }
    }

    pub(super) fn items(&self) -> usize {
        self.token_blocks * self.n_head_kv * self.chunks
    }

    pub(super) fn item(&self, tb: usize, g: usize, c: usize) -> usize {
        (tb * self.n_head_kv + g) * self.chunks + c
    }

    /// (token block, KV head, chunk) of item `it`.
    pub(super) fn split(&self, it: usize) -> (usize, usize, usize) {
        let c = it % self.chunks;
        let rest = it / self.chunks;
        (rest / self.n_head_kv, rest % self.n_head_kv, c)
    }

    pub(super) fn token_rows(&self, tb: usize) -> Range<usize> {
        tb * self.token_block..((tb + 1) * self.token_block).min(self.n)
    }
}

/// Query rows a work item takes for `gqa` query heads a KV head: [`TOKEN_BLOCK`], or more
/// where that gives fewer than [`LANES`] query vectors (up to [`MAX_GQA`] of them), so that
/// every K and V row widened serves at least 16 vectors (the score kernels' widest form).
/// Each query row's result does not depend on the rows beside it.
pub(super) fn token_block(gqa: usize) -> usize {
    let gqa = gqa.max(1);
    (LANES / gqa).clamp(TOKEN_BLOCK, (MAX_GQA / gqa).max(1))
}

pub(super) struct Job<'a> {
    pub(super) shape: AttnShape,
    pub(super) gqa: usize,
    pub(super) q: &'a [f32],
    pub(super) k: KvRows<'a>,
    pub(super) v: KvRows<'a>,
    pub(super) layout: KvLayout,
    pub(super) pos0: usize,
    pub(super) n: usize,
    pub(super) scale: f32,
    pub(super) plan: Plan,
}

impl Job<'_> {
    /// Floats of one item's partial state: per query vector, `acc[d]`, `m`, `l`.
    pub(super) fn part_len(&self) -> usize {
        self.plan.token_block * self.gqa * (self.shape.head_dim + 2)
    }
}

/// Per-thread buffers, reused across items, on 64-byte boundaries: rows of `dp` (a multiple
/// of 16) floats then never straddle two cache lines in the 512-bit loops.
pub(super) struct Scratch {
    /// `[POS_BLOCK][n_q]` scores, then probabilities (a position's query vectors side by
    /// side).
    pub(super) s: AlignedBuf<f32>,
    /// The item's query vectors, each padded to a multiple of LANES, chunk-major
    /// (`[dp / LANES][n_q][LANES]`).
    pub(super) qv: AlignedBuf<f32>,
    /// `[n_q][d]` accumulators, each padded to a multiple of LANES.
    pub(super) acc: AlignedBuf<f32>,
}

impl Scratch {
    pub(super) fn new(job: &Job<'_>) -> Scratch {
        let dp = job.shape.head_dim.next_multiple_of(LANES);
        let nq = padded_queries(job.plan.token_block * job.gqa);
        Scratch {
            s: AlignedBuf::zeroed(nq * POS_BLOCK),
            qv: AlignedBuf::zeroed(nq * dp),
            acc: AlignedBuf::zeroed(nq * dp),
        }
    }
}

/// The tier's item function.
pub(super) type ItemFn = fn(&Job<'_>, usize, &mut Scratch, &mut [f32]);

/// Run every item of `job` on `pool` with `run`, writing `out` (`[n][n_head·head_dim]`).
pub(super) fn run(job: &Job<'_>, run: ItemFn, out: &mut [f32], pool: &Pool) {
    let plan = job.plan;
    let gqa = job.gqa;
    let d = job.shape.head_dim;
    let qw = job.shape.n_head * d;
    let shape = &job.shape;
    if plan.chunks == 1 {
        // Each (row, head) of `out` belongs to exactly one item: write in place. A prompt's
        // later rows see more positions, so the items are handed out last row first: the
        // threads take the long ones while there are others left to even out the end (a
        // 512-token prompt's attention in contiguous eighths costs 1, 3, …, 15; in order,
        // two threads finish at 36 where they could at 32).
        let outp = SharedMut::new(out);
        let last = plan.items() - 1;
        pool.for_rows(plan.items(), 1, &|items: Range<usize>| {
            let mut scratch = Scratch::new(job);
            let mut part = vec![0f32; job.part_len()];
            for it in items.map(|i| last - i) {
                run(job, it, &mut scratch, &mut part);
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
        return;
    }
    // Several chunks per (rows, head): keep each item's partial state, then merge.
    let part_len = job.part_len();
    let mut parts = vec![0f32; plan.items() * part_len];
    let partp = SharedMut::new(&mut parts);
    pool.for_rows(plan.items(), 1, &|items: Range<usize>| {
        let mut scratch = Scratch::new(job);
        for it in items {
            // SAFETY: item `it` owns its own partial slot; in bounds by construction.
            let part = unsafe { partp.slice_mut(it * part_len..(it + 1) * part_len) };
            run(job, it, &mut scratch, part);
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
}

/// `dst = acc / l`.
pub(super) fn finish_row(acc: &[f32], l: f32, dst: &mut [f32]) {
    let inv = 1.0 / l;
    for (o, &a) in dst.iter_mut().zip(acc) {
        *o = a * inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn items_hold_at_least_sixteen_query_vectors_where_they_can() {
        for (gqa, rows) in [(1, 16), (2, 8), (3, 5), (4, 4), (5, 4), (8, 4), (16, 4)] {
            assert_eq!(token_block(gqa), rows, "gqa {gqa}");
            assert!(token_block(gqa) * gqa <= MAX_GQA);
        }
        let shape = AttnShape {
            n_head: 16,
            n_head_kv: 8,
            head_dim: 128,
        };
        let p = Plan::new(&shape, 0, 20, 2);
        assert_eq!((p.token_block, p.token_blocks), (8, 3));
        assert_eq!(p.token_rows(2), 16..20);
        let p = Plan::new(&shape, 300, 1, 2);
        assert_eq!((p.token_block, p.token_blocks), (1, 1));
        assert_eq!(p.token_rows(0), 0..1);
    }
}
