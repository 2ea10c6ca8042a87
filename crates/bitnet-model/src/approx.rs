//! The approximate LM head (`--lm-head approx`): the vocabulary clustered by a seeded
//! spherical k-means over the head's rows, then, per output row, exact dot products only for
//! the members of the `probe` clusters whose centroids score highest.
//!
//! The computed logits are exactly the full head's (the same kernels,
//! [`RowMatrix::matmul_q8_rows`]). Every other token gets an estimate from its cluster: the
//! centroid's score (the mean of its members' logits, up to the centroid's Q8_0 rounding) plus
//! `½·‖h‖²·σ²`, where σ² is the members' per-dimension variance about the centroid (what the
//! cluster's total probability mass would be if its spread were isotropic), capped at the
//! largest computed logit, so the argmax is always a computed one. What the approximation
//! costs is a true top token in a cluster that was not probed; measure it with
//! `bitnet perplexity --kl-divergence` (top-1 agreement and KL against the exact head).

use std::borrow::Cow;

use bitnet_kernels::rows::quantize_row_into;
use bitnet_kernels::{Pool, RowMatrix, RowType};

use crate::{Backend, ModelError, Numerics, Result};

/// How the clustering is built and used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApproxOptions {
    /// Clusters (0: 2·√n_vocab rounded up to a power of two: 1024 for a 128K vocabulary).
    pub clusters: usize,
    /// Clusters whose members get exact logits, per output row (0: clusters / 32, at least 1).
    pub probe: usize,
    /// Seed of the initial centroids and of the training sample.
    pub seed: u64,
    /// Lloyd iterations over the training sample.
    pub iterations: usize,
}

impl Default for ApproxOptions {
    fn default() -> Self {
        ApproxOptions {
            clusters: 0,
            probe: 0,
            seed: 0x5eed_0b17,
            iterations: 4,
        }
    }
}

impl ApproxOptions {
    /// The clusters for a vocabulary of `n_vocab` rows.
    pub fn clusters_for(&self, n_vocab: usize) -> usize {
        let k = if self.clusters == 0 {
            (2 * n_vocab.isqrt()).next_power_of_two()
        } else {
            self.clusters
        };
        k.clamp(1, n_vocab.max(1))
    }

    /// The probed clusters for `clusters` clusters.
    pub fn probe_for(&self, clusters: usize) -> usize {
        let p = if self.probe == 0 {
            clusters / 32
        } else {
            self.probe
        };
        p.clamp(1, clusters.max(1))
    }
}

/// Rows of the training sample per cluster.
const SAMPLE_PER_CLUSTER: usize = 8;
/// Rows assigned per call of the centroid GEMM.
const BATCH: usize = 64;

/// The clustered vocabulary: centroids, each token's cluster, tokens grouped by cluster.
#[derive(Debug, Clone)]
pub struct ApproxHead {
    /// `k × n_embd`, Q8_0 (F16 for a width that is not a multiple of 32).
    centroids: RowMatrix<'static>,
    /// Token → cluster.
    assign: Vec<u32>,
    /// Tokens in cluster order; cluster `c` holds `order[starts[c]..starts[c + 1]]`.
    order: Vec<u32>,
    starts: Vec<usize>,
    /// Each cluster's per-dimension variance of its members about the centroid.
    spread: Vec<f32>,
    probe: usize,
}

/// SplitMix64: a small seeded generator (the clustering must not depend on a crate's stream).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant here).
    fn below(&mut self, n: usize) -> usize {
        let n64 = u64::try_from(n).unwrap_or(u64::MAX).max(1);
        usize::try_from(self.next() % n64).unwrap_or(0)
    }
}

fn u32_of(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| ModelError::Overflow("approximate head index"))
}

/// Centroids as a Q8_0 matrix (F16 when `cols` is not a multiple of 32). Scoring them dots
/// Q8_0-quantized activations in integers ([`RowMatrix::matmul_q8`]): the clustering's own
/// GEMM runs at the int8 rate.
fn encode_centroids(c: &[f32], k: usize, cols: usize) -> Result<RowMatrix<'static>> {
    let ty = if cols.is_multiple_of(32) {
        RowType::Q8_0
    } else {
        RowType::F16
    };
    let rb = ty.row_bytes(cols)?;
    let mut bytes = vec![0u8; k * rb];
    for (row, enc) in c.chunks_exact(cols).zip(bytes.chunks_exact_mut(rb)) {
        quantize_row_into(ty, row, enc);
    }
    Ok(RowMatrix::new(ty, k, cols, Cow::Owned(bytes))?)
}

/// The centroids' directions (unit rows), for assignment by cosine: Euclidean assignment in
/// this many dimensions lets centroids near the origin take most of the vocabulary (measured
/// on random rows: one cluster of 13,680 of 128,256 tokens, a median of 3); spherical k-means
/// keeps the clusters comparable.
fn encode_directions(c: &[f32], k: usize, cols: usize) -> Result<RowMatrix<'static>> {
    let unit: Vec<f32> = c
        .chunks_exact(cols)
        .flat_map(|row| {
            let n = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            let inv = if n > 0.0 { 1.0 / n } else { 0.0 };
            row.iter().map(move |v| v * inv)
        })
        .collect();
    encode_centroids(&unit, k, cols)
}

/// The best-aligned direction of each of `n` rows `x` (`n × cols`): argmax of `x·d`, lowest
/// index on ties.
fn nearest(
    dirs: &RowMatrix<'_>,
    x: &[f32],
    n: usize,
    pool: &Pool,
    scores: &mut Vec<f32>,
    out: &mut [u32],
) -> Result<()> {
    let k = dirs.rows();
    scores.clear();
    scores.resize(n * k, 0.0);
    dirs.matmul_q8(x, scores, pool)?;
    for (o, s) in out.iter_mut().zip(scores.chunks_exact(k)) {
        let mut best = (0usize, f32::NEG_INFINITY);
        for (c, &v) in s.iter().enumerate() {
            if v > best.1 {
                best = (c, v);
            }
        }
        *o = u32_of(best.0)?;
    }
    Ok(())
}

/// Reads rows of the head (by index) as f32: `read(ids, out)` fills `ids.len() × cols`.
pub type RowReader<'r> = dyn Fn(&[u32], &mut [f32]) -> Result<()> + 'r;

impl ApproxHead {
    /// Cluster the `n_vocab × cols` head whose rows `read` returns: spherical k-means (rows
    /// assigned to the centroid direction they align with best). Lloyd iterations run on a
    /// seeded sample of `8 × clusters` rows (all of them for a small vocabulary); then every
    /// row is assigned once, and each centroid becomes the mean of its members. Clusters left
    /// empty are dropped. Deterministic for a given seed, on any number of threads.
    pub fn build(
        n_vocab: usize,
        cols: usize,
        opts: &ApproxOptions,
        pool: &Pool,
        read: &RowReader<'_>,
    ) -> Result<Self> {
        if n_vocab == 0 || cols == 0 {
            return Err(ModelError::BadHparam {
                key: "lm head".into(),
                value: format!("{n_vocab} × {cols}"),
                why: "an approximate head needs rows",
            });
        }
        let k = opts.clusters_for(n_vocab);
        let mut rng = SplitMix(opts.seed);
        // A seeded sample, in file order (reads stay mostly sequential).
        let mut all: Vec<u32> = (0..u32_of(n_vocab)?).collect();
        let n_sample = k.saturating_mul(SAMPLE_PER_CLUSTER).min(n_vocab);
        for i in 0..n_sample {
            let j = i + rng.below(n_vocab - i);
            all.swap(i, j);
        }
        // The first k shuffled rows are the initial centroids (distinct rows).
        let mut c = vec![0f32; k * cols];
        read(&all[..k], &mut c)?;
        let mut sample = all[..n_sample].to_vec();
        sample.sort_unstable();
        drop(all);

        let mut x = vec![0f32; BATCH * cols];
        let mut scores = Vec::new();
        let mut a = vec![0u32; BATCH];
        let mut sums = vec![0f32; k * cols];
        let mut counts = vec![0usize; k];
        let mut sq = vec![0f64; k];
        // One pass over `ids`: assign each row, accumulate member sums (and, with `record`,
        // squared norms).
        let mut pass = |ids: &[u32],
                        dirs: &RowMatrix<'_>,
                        sums: &mut [f32],
                        counts: &mut [usize],
                        mut record: Option<(&mut Vec<u32>, &mut [f64])>|
         -> Result<()> {
            sums.fill(0.0);
            counts.fill(0);
            for chunk in ids.chunks(BATCH) {
                let n = chunk.len();
                let xb = &mut x[..n * cols];
                read(chunk, xb)?;
                nearest(dirs, xb, n, pool, &mut scores, &mut a[..n])?;
                for (row, &cl) in xb.chunks_exact(cols).zip(&a[..n]) {
                    let cl = cl as usize;
                    counts[cl] += 1;
                    for (s, v) in sums[cl * cols..(cl + 1) * cols].iter_mut().zip(row) {
                        *s += v;
                    }
                    if let Some((_, sq)) = record.as_mut() {
                        sq[cl] += row.iter().map(|&v| f64::from(v * v)).sum::<f64>();
                    }
                }
                if let Some((r, _)) = record.as_mut() {
                    r.extend_from_slice(&a[..n]);
                }
            }
            Ok(())
        };
        for _ in 0..opts.iterations {
            let dirs = encode_directions(&c, k, cols)?;
            pass(&sample, &dirs, &mut sums, &mut counts, None)?;
            for (cl, (row, &n)) in c.chunks_exact_mut(cols).zip(&counts).enumerate() {
                if n == 0 {
                    // Reseed an empty cluster from a random sample row.
                    let r = sample[rng.below(sample.len())];
                    read(&[r], row)?;
                    continue;
                }
                let inv = 1.0 / n as f32;
                for (d, s) in row.iter_mut().zip(&sums[cl * cols..(cl + 1) * cols]) {
                    *d = s * inv;
                }
            }
        }
        // Every row, once; the centroids become their members' means.
        let dirs = encode_directions(&c, k, cols)?;
        let every: Vec<u32> = (0..u32_of(n_vocab)?).collect();
        let mut assign = Vec::with_capacity(n_vocab);
        pass(
            &every,
            &dirs,
            &mut sums,
            &mut counts,
            Some((&mut assign, &mut sq)),
        )?;
        drop(every);
        // Drop empty clusters: renumber the others in order.
        let mut renum = vec![u32::MAX; k];
        let mut kept = 0usize;
        let mut means = Vec::with_capacity(k * cols);
        let mut spread = Vec::with_capacity(k);
        for (cl, &n) in counts.iter().enumerate() {
            if n == 0 {
                continue;
            }
            renum[cl] = u32_of(kept)?;
            kept += 1;
            let inv = 1.0 / n as f32;
            let mean = &sums[cl * cols..(cl + 1) * cols];
            means.extend(mean.iter().map(|s| s * inv));
            // Per-dimension variance of the members about their mean.
            let c2: f64 = mean.iter().map(|&s| f64::from(s * inv).powi(2)).sum();
            let v = (sq[cl] / n as f64 - c2).max(0.0) / cols as f64;
            // A variance, rounded to the precision the logits are computed in.
            #[allow(clippy::cast_possible_truncation)]
            let v = v as f32;
            spread.push(v);
        }
        for a in &mut assign {
            *a = renum[*a as usize];
        }
        let centroids = encode_centroids(&means, kept, cols)?;
        // Tokens grouped by cluster (counting sort: ascending ids within a cluster).
        let mut starts = vec![0usize; kept + 1];
        for &a in &assign {
            starts[a as usize + 1] += 1;
        }
        for i in 0..kept {
            starts[i + 1] += starts[i];
        }
        let mut fill = starts.clone();
        let mut order = vec![0u32; n_vocab];
        for (t, &a) in assign.iter().enumerate() {
            let slot = &mut fill[a as usize];
            order[*slot] = u32_of(t)?;
            *slot += 1;
        }
        Ok(ApproxHead {
            centroids,
            assign,
            order,
            starts,
            spread,
            probe: opts.probe_for(kept),
        })
    }

    /// Clusters (non-empty).
    pub fn clusters(&self) -> usize {
        self.centroids.rows()
    }

    /// Clusters probed per output row.
    pub fn probe(&self) -> usize {
        self.probe
    }

    /// Change the clusters probed per output row (clamped to 1..=clusters).
    pub fn set_probe(&mut self, probe: usize) {
        self.probe = probe.clamp(1, self.clusters().max(1));
    }

    /// Token `t`'s cluster.
    pub fn cluster_of(&self, t: usize) -> Option<usize> {
        self.assign.get(t).map(|&a| a as usize)
    }

    /// The members of cluster `c`.
    pub fn members(&self, c: usize) -> &[u32] {
        match (self.starts.get(c), self.starts.get(c + 1)) {
            (Some(&a), Some(&b)) => &self.order[a..b],
            _ => &[],
        }
    }

    /// The centroids (`clusters × n_embd`, Q8_0 or F16).
    pub fn centroids(&self) -> &RowMatrix<'static> {
        &self.centroids
    }

    /// Bytes held (centroids and the two token tables).
    pub fn nbytes(&self) -> usize {
        self.centroids.nbytes()
            + (self.assign.len() + self.order.len()) * 4
            + self.starts.len() * std::mem::size_of::<usize>()
    }

    /// Logits `out` (`rows × n_vocab`) of `rows` normed hidden states `hn` through `head`:
    /// exact for the members of each row's `probe` best clusters, the cluster's centroid
    /// score for every other token.
    pub fn logits(
        &self,
        head: &RowMatrix<'_>,
        hn: &[f32],
        rows: usize,
        backend: &dyn Backend,
        out: &mut [f32],
    ) -> Result<()> {
        let n_vocab = head.rows();
        let cols = head.cols();
        let k = self.clusters();
        if self.assign.len() != n_vocab || self.centroids.cols() != cols {
            return Err(ModelError::Backend(format!(
                "the approximate head was built for {} × {}, the head is {n_vocab} × {cols}",
                self.assign.len(),
                self.centroids.cols()
            )));
        }
        let shape = |what: &'static str, expected: usize, got: usize| {
            ModelError::Kernel(bitnet_kernels::KernelError::ShapeMismatch {
                what,
                expected,
                got,
            })
        };
        if Some(hn.len()) != rows.checked_mul(cols) {
            return Err(shape(
                "approximate head: hidden states",
                rows.saturating_mul(cols),
                hn.len(),
            ));
        }
        if Some(out.len()) != rows.checked_mul(n_vocab) {
            return Err(shape(
                "approximate head: logits",
                rows.saturating_mul(n_vocab),
                out.len(),
            ));
        }
        let mut cs = vec![0f32; rows * k];
        backend.lm_head(&self.centroids, hn, rows, Numerics::Fast, &mut cs)?;
        let mut pick: Vec<u32> = Vec::with_capacity(k);
        let mut ids: Vec<u32> = Vec::new();
        let mut vals: Vec<f32> = Vec::new();
        let mut fill: Vec<f32> = Vec::with_capacity(k);
        for ((h, s), o) in hn
            .chunks_exact(cols)
            .zip(cs.chunks_exact(k))
            .zip(out.chunks_exact_mut(n_vocab))
            .take(rows)
        {
            pick.clear();
            pick.extend(0..u32_of(k)?);
            let by_score = |a: &u32, b: &u32| {
                s[*b as usize]
                    .total_cmp(&s[*a as usize])
                    .then_with(|| a.cmp(b))
            };
            if self.probe < k {
                pick.select_nth_unstable_by(self.probe - 1, by_score);
                pick.truncate(self.probe);
            }
            ids.clear();
            for &c in &pick {
                ids.extend_from_slice(self.members(c as usize));
            }
            ids.sort_unstable();
            vals.clear();
            vals.resize(ids.len(), 0.0);
            backend.lm_head_rows(head, &ids, h, &mut vals)?;
            let top = vals.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let hh: f32 = h.iter().map(|v| v * v).sum();
            fill.clear();
            fill.extend(
                s.iter()
                    .zip(&self.spread)
                    .map(|(&m, &v)| (m + 0.5 * hh * v).min(top)),
            );
            for (v, &a) in o.iter_mut().zip(&self.assign) {
                *v = fill[a as usize];
            }
            for (&t, &v) in ids.iter().zip(&vals) {
                o[t as usize] = v;
            }
        }
        Ok(())
    }
}
