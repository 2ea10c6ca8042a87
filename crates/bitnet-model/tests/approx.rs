//! The approximate LM head: k-means finds planted clusters, probed members get exactly the
//! full head's logits, probing every cluster is the exact head, and the build does not
//! depend on the thread count.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use std::borrow::Cow;

use bitnet_kernels::rows::quantize_row_into;
use bitnet_kernels::{Pool, RowMatrix, RowType};
use bitnet_model::{ApproxHead, ApproxOptions};

/// xorshift64*, uniform in [-1, 1).
struct Rng(u64);
impl Rng {
    fn f32(&mut self) -> f32 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        ((x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `groups` random centers in `cols` dimensions, `per` members each (center + small noise),
/// members of the groups interleaved (token t is in group t % groups), as an F16 matrix.
fn planted(groups: usize, per: usize, cols: usize, seed: u64) -> (Vec<f32>, Vec<u8>) {
    let mut rng = Rng(seed | 1);
    let centers: Vec<f32> = (0..groups * cols).map(|_| rng.f32()).collect();
    let n = groups * per;
    let mut x = vec![0f32; n * cols];
    for t in 0..n {
        let g = t % groups;
        for j in 0..cols {
            x[t * cols + j] = centers[g * cols + j] + 0.05 * rng.f32();
        }
    }
    let rb = RowType::F16.row_bytes(cols).unwrap();
    let mut bytes = vec![0u8; n * rb];
    for (row, out) in x.chunks_exact(cols).zip(bytes.chunks_exact_mut(rb)) {
        quantize_row_into(RowType::F16, row, out);
    }
    (centers, bytes)
}

fn build(m: &RowMatrix<'_>, opts: &ApproxOptions, pool: &Pool) -> ApproxHead {
    let read = |ids: &[u32], out: &mut [f32]| -> bitnet_model::Result<()> {
        for (&r, o) in ids.iter().zip(out.chunks_exact_mut(m.cols())) {
            m.dequantize_row(r as usize, o)?;
        }
        Ok(())
    };
    ApproxHead::build(m.rows(), m.cols(), opts, pool, &read).unwrap()
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

#[test]
fn planted_clusters_stay_pure_and_their_queries_find_the_true_top_token() {
    let (groups, per, cols) = (8, 120, 96);
    let (centers, bytes) = planted(groups, per, cols, 11);
    let m = RowMatrix::new(RowType::F16, groups * per, cols, Cow::Borrowed(&bytes)).unwrap();
    let pool = Pool::new(2);
    let opts = ApproxOptions {
        clusters: 64,
        ..Default::default()
    };
    let mut a = build(&m, &opts, &pool);
    assert!(a.clusters() > groups && a.clusters() <= 64);
    // Every cluster holds members of one planted group only.
    let mut per_group = vec![0usize; groups];
    for c in 0..a.clusters() {
        let ms = a.members(c);
        assert!(!ms.is_empty());
        let g = ms[0] as usize % groups;
        assert!(
            ms.iter().all(|&t| t as usize % groups == g),
            "cluster {c} mixes groups"
        );
        per_group[g] += 1;
    }
    // Probing as many clusters as the most split group has: a query's own group's clusters
    // score highest, so all of them are probed.
    a.set_probe(per_group.iter().copied().max().unwrap());
    // A query along a group's center: the approximate top token is the exact one.
    let mut rng = Rng(99);
    for q in 0..2 * groups {
        let g = q % groups;
        let h: Vec<f32> = (0..cols)
            .map(|j| centers[g * cols + j] + 0.3 * rng.f32())
            .collect();
        let mut exact = vec![0f32; m.rows()];
        m.matmul_q8(&h, &mut exact, &pool).unwrap();
        let mut approx = vec![0f32; m.rows()];
        a.logits(&m, &h, 1, &pool, &mut approx).unwrap();
        let top = argmax(&exact);
        assert_eq!(top % groups, g);
        assert_eq!(argmax(&approx), top, "query {q}");
        assert_eq!(approx[top].to_bits(), exact[top].to_bits());
    }
}

#[test]
fn probed_members_are_exact_and_probing_every_cluster_is_the_exact_head() {
    // Unstructured rows (the hard case), a ragged width, several rows per call.
    let mut rng = Rng(7);
    let (n, cols, rows) = (700, 72, 3);
    let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
    let rb = RowType::F16.row_bytes(cols).unwrap();
    let mut bytes = vec![0u8; n * rb];
    for (row, out) in x.chunks_exact(cols).zip(bytes.chunks_exact_mut(rb)) {
        quantize_row_into(RowType::F16, row, out);
    }
    let m = RowMatrix::new(RowType::F16, n, cols, Cow::Borrowed(&bytes)).unwrap();
    let pool = Pool::new(2);
    let mut a = build(
        &m,
        &ApproxOptions {
            clusters: 40,
            probe: 5,
            ..Default::default()
        },
        &pool,
    );
    let h: Vec<f32> = (0..rows * cols).map(|_| rng.f32()).collect();
    let mut exact = vec![0f32; rows * n];
    for (hr, er) in h.chunks_exact(cols).zip(exact.chunks_exact_mut(n)) {
        m.matmul_q8(hr, er, &pool).unwrap();
    }
    let mut approx = vec![0f32; rows * n];
    a.logits(&m, &h, rows, &pool, &mut approx).unwrap();
    for (r, (ar, er)) in approx
        .chunks_exact(n)
        .zip(exact.chunks_exact(n))
        .enumerate()
    {
        let computed: Vec<usize> = (0..n)
            .filter(|&t| ar[t].to_bits() == er[t].to_bits())
            .collect();
        // At least the probed clusters' members, and the top logit is one of them.
        let probed_members = {
            let mut sizes: Vec<usize> = (0..a.clusters()).map(|c| a.members(c).len()).collect();
            sizes.sort_unstable();
            sizes[..5].iter().sum::<usize>()
        };
        assert!(computed.len() >= probed_members, "row {r}");
        let top = argmax(ar);
        assert_eq!(
            ar[top].to_bits(),
            er[top].to_bits(),
            "row {r}: top is a filled value"
        );
        assert!(ar.iter().all(|&v| v <= ar[top]));
        // Whole clusters are computed or filled: a cluster's members are all exact together.
        for c in 0..a.clusters() {
            let ms = a.members(c);
            let exact_members = ms
                .iter()
                .filter(|&&t| ar[t as usize].to_bits() == er[t as usize].to_bits())
                .count();
            assert!(
                exact_members == ms.len() || exact_members <= 1,
                "row {r} cluster {c}: {exact_members} of {} exact",
                ms.len()
            );
        }
    }
    a.set_probe(a.clusters());
    a.logits(&m, &h, rows, &pool, &mut approx).unwrap();
    assert!(approx
        .iter()
        .zip(&exact)
        .all(|(p, q)| p.to_bits() == q.to_bits()));
}

#[test]
fn the_clustering_depends_on_the_seed_not_on_the_threads() {
    let (_, bytes) = planted(5, 60, 64, 3);
    let m = RowMatrix::new(RowType::F16, 300, 64, Cow::Borrowed(&bytes)).unwrap();
    let opts = ApproxOptions {
        clusters: 12,
        ..Default::default()
    };
    let one = build(&m, &opts, &Pool::new(1));
    let two = build(&m, &opts, &Pool::new(2));
    let of = |a: &ApproxHead| {
        (0..300)
            .map(|t| a.cluster_of(t).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(of(&one), of(&two));
    assert_eq!(one.centroids().data(), two.centroids().data());
    let other = build(
        &m,
        &ApproxOptions {
            seed: 12345,
            ..opts
        },
        &Pool::new(2),
    );
    assert_ne!(one.centroids().data(), other.centroids().data());
}
