//! Each GPU kernel against the CPU's scalar reference over random shapes with ragged tails.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

mod common;

use bitnet_gpu::probe::{self, AttnProbe};
use bitnet_gpu::GpuKv;
use bitnet_gpu::MvKind;
use bitnet_kernels::{act, Isa, Pool, TernaryLayout, TernaryMatrix};
use bitnet_kernels::{RowMatrix, RowType};
use bitnet_model::numerics::{rms_norm, rope_for, rope_row};
use bitnet_model::{Numerics, RopeStyle};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::borrow::Cow;

/// Random I2_S bytes for `n_out × n_in` (codes 0–2, and some 3 when `code3`), then β.
fn i2s_bytes(rng: &mut ChaCha8Rng, n_out: usize, n_in: usize, code3: bool) -> Vec<u8> {
    let mut b: Vec<u8> = (0..n_out * n_in / 4)
        .map(|_| {
            let mut v = 0u8;
            for l in 0..4 {
                let c = if code3 && rng.random_range(0..20) == 0 {
                    3
                } else {
                    rng.random_range(0..3u8)
                };
                v |= c << (2 * l);
            }
            v
        })
        .collect();
    b.extend_from_slice(&0.0173f32.to_le_bytes());
    b.extend_from_slice(&[0xAB; 28]);
    b
}

/// Random TQ2_0 blocks (codes 0–2, f16 block scales).
fn tq2_bytes(rng: &mut ChaCha8Rng, n_out: usize, n_in: usize) -> Vec<u8> {
    let mut b = Vec::new();
    for _ in 0..n_out * n_in / 256 {
        for _ in 0..64 {
            let mut v = 0u8;
            for l in 0..4 {
                v |= rng.random_range(0..3u8) << (2 * l);
            }
            b.push(v);
        }
        let d = half::f16::from_f32(rng.random_range(0.001..0.05f32));
        b.extend_from_slice(&d.to_le_bytes());
    }
    b
}

fn activations(rng: &mut ChaCha8Rng, n: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    let xq = (0..n * k).map(|_| rng.random_range(-128..=127i8)).collect();
    let s = (0..n).map(|_| rng.random_range(0.5..300.0f32)).collect();
    (xq, s)
}

/// The model's step 8 (docs/MODEL.md) as the CPU forward pass computes it: act(Lin(gate, x))
/// · Lin(up, x) through the scalar kernel, act 1 ReLU², else SiLU.
fn glu_ref(
    gate: &TernaryMatrix<'_>,
    up: &TernaryMatrix<'_>,
    xq: &[i8],
    s: &[f32],
    act: u32,
    pool: &Pool,
) -> Vec<f32> {
    let len = s.len() * gate.n_out();
    let (mut g, mut u) = (vec![0f32; len], vec![0f32; len]);
    gate.matmul_on(Isa::Scalar, xq, s, &mut g, pool)
        .unwrap()
        .unwrap();
    up.matmul_on(Isa::Scalar, xq, s, &mut u, pool)
        .unwrap()
        .unwrap();
    g.iter()
        .zip(&u)
        .map(|(&g, &u)| {
            if act == 1 {
                let r = g.max(0.0);
                (r * r) * u
            } else {
                (g / (1.0 + (-g).exp())) * u
            }
        })
        .collect()
}

#[test]
fn ternary_matches_the_scalar_kernel() {
    let Some(gpu) = common::open() else { return };
    let pool = Pool::new(1);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for case in 0..24 {
        let tq2 = case % 3 == 2;
        let unit = if tq2 { 256 } else { 128 };
        let n_in = unit * rng.random_range(1..5usize);
        let n_out = [1, 3, 17, 40, 70, 129][case % 6];
        let n = rng.random_range(1..11usize);
        let code3 = case % 4 == 1;
        let bytes = if tq2 {
            tq2_bytes(&mut rng, n_out, n_in)
        } else {
            i2s_bytes(&mut rng, n_out, n_in, code3)
        };
        let layout = if tq2 {
            TernaryLayout::Tq2_0
        } else {
            TernaryLayout::I2S
        };
        let mut m = TernaryMatrix::new(layout, n_out, n_in, &bytes, None).unwrap();
        m.check_codes();
        let (xq, s) = activations(&mut rng, n, n_in);
        let mut want = vec![0f32; n * n_out];
        m.matmul_on(Isa::Scalar, &xq, &s, &mut want, &pool)
            .unwrap()
            .unwrap();
        let got = probe::ternary(&gpu, &m, &xq, &s).unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // I2_S: the same integers and float steps (a division may round differently);
            // TQ2_0: the block sum in another order.
            let tol = if tq2 { 2e-5 } else { 1e-6 } * w.abs().max(1e-3);
            assert!((g - w).abs() <= tol, "case {case} ({layout:?} {n_out}x{n_in}, {n} rows, code3 {code3}): [{i}] gpu {g} cpu {w}");
        }
    }
}

#[test]
fn fused_gate_up_matches_two_scalar_matmuls_and_the_activation() {
    let Some(gpu) = common::open() else { return };
    let pool = Pool::new(1);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for case in 0..12 {
        let tq2 = case % 3 == 2;
        let unit = if tq2 { 256 } else { 128 };
        let n_in = unit * rng.random_range(1..4usize);
        let n_out = [1, 5, 33, 70][case % 4];
        let n = rng.random_range(1..10usize);
        let act = if case % 2 == 0 { 1 } else { 2 };
        let mut mats = Vec::new();
        for _ in 0..2 {
            mats.push(if tq2 {
                tq2_bytes(&mut rng, n_out, n_in)
            } else {
                i2s_bytes(&mut rng, n_out, n_in, case % 4 == 1)
            });
        }
        let layout = if tq2 {
            TernaryLayout::Tq2_0
        } else {
            TernaryLayout::I2S
        };
        let mut gate = TernaryMatrix::new(layout, n_out, n_in, &mats[0], None).unwrap();
        let mut up = TernaryMatrix::new(layout, n_out, n_in, &mats[1], None).unwrap();
        gate.check_codes();
        up.check_codes();
        let (xq, s) = activations(&mut rng, n, n_in);
        let want = glu_ref(&gate, &up, &xq, &s, act, &pool);
        let got = probe::glu(&gpu, &gate, &up, &xq, &s, act).unwrap();
        for (i, (x, w)) in got.iter().zip(&want).enumerate() {
            let tol = if tq2 { 5e-5 } else { 1e-5 } * w.abs().max(1e-3);
            assert!((x - w).abs() <= tol, "case {case} ({layout:?} {n_out}x{n_in}, {n} rows, act {act}): [{i}] gpu {x} cpu {w}");
        }
    }
}

#[test]
fn a_broken_code_order_fails_the_ternary_comparison() {
    // The comparison above can fail: the same matrix with its rows' blocks swapped gives
    // different results on the GPU than the scalar kernel computes for the original.
    let Some(gpu) = common::open() else { return };
    let pool = Pool::new(1);
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let (n_out, n_in) = (8, 256);
    let bytes = i2s_bytes(&mut rng, n_out, n_in, false);
    let mut swapped = bytes.clone();
    for r in 0..n_out {
        let row = &mut swapped[r * 64..(r + 1) * 64];
        let (a, b) = row.split_at_mut(32);
        a.swap_with_slice(b);
    }
    let m = TernaryMatrix::new(TernaryLayout::I2S, n_out, n_in, &bytes, None).unwrap();
    let ms = TernaryMatrix::new(TernaryLayout::I2S, n_out, n_in, &swapped, None).unwrap();
    let (xq, s) = activations(&mut rng, 2, n_in);
    let mut want = vec![0f32; 2 * n_out];
    m.matmul_on(Isa::Scalar, &xq, &s, &mut want, &pool)
        .unwrap()
        .unwrap();
    let got = probe::ternary(&gpu, &ms, &xq, &s).unwrap();
    assert!(got.iter().zip(&want).any(|(g, w)| (g - w).abs() > 1e-3));
}

#[test]
fn norm_quant_matches_rms_norm_then_quantize() {
    let Some(gpu) = common::open() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for (case, lanes) in (0..13).flat_map(|c| [(c, false), (c, true)]) {
        if lanes && !gpu.lane_kernels() {
            eprintln!(
                "norm_quant's lane kernel not tested: {} is not a CPU device",
                gpu.info().name
            );
            continue;
        }
        // The last cases are wider than the registers of the fast path hold: 8,200 in both
        // kernels, 4,000 in the lane kernel's (32 threads of 24 vec4s).
        let width = match case {
            11 => 8200,
            12 => 4000,
            _ => 4 * rng.random_range(1..700usize),
        };
        let n = rng.random_range(1..6usize);
        let mut x: Vec<f32> = (0..n * width)
            .map(|_| rng.random_range(-4.0..4.0f32))
            .collect();
        // Every third case (the wide one among them) puts a NaN in one row: that row's
        // scale must be NaN (as the CPU's is), not one computed past the NaN.
        let nan_row = (case % 3 == 2).then(|| rng.random_range(0..n));
        if let Some(r) = nan_row {
            x[r * width + rng.random_range(0..width)] = f32::NAN;
        }
        let w: Vec<f32> = (0..width).map(|_| rng.random_range(0.1..2.0f32)).collect();
        let (codes, scales) = probe::norm_quant(&gpu, &x, &w, 1e-5, lanes).unwrap();
        let mut y = vec![0f32; width];
        let mut q = vec![0i8; width];
        let mut off = 0;
        for r in 0..n {
            if nan_row == Some(r) {
                assert!(
                    scales[r].is_nan(),
                    "case {case} lanes {lanes} row {r}: scale {}",
                    scales[r]
                );
                continue;
            }
            rms_norm(&x[r * width..(r + 1) * width], &w, 1e-5, &mut y);
            let s = act::quantize_i8_scalar(&y, &mut q);
            assert!(
                (scales[r] - s).abs() <= 1e-5 * s,
                "case {case} lanes {lanes} row {r}: scale {} vs {s}",
                scales[r]
            );
            for (i, (&g, &c)) in codes[r * width..(r + 1) * width].iter().zip(&q).enumerate() {
                // The GPU sums squares in f32 (the CPU in f64): a value at a rounding tie
                // may land one code away.
                assert!(
                    (i32::from(g) - i32::from(c)).abs() <= 1,
                    "case {case} lanes {lanes} row {r} [{i}]: {g} vs {c}"
                );
                off += usize::from(g != c);
            }
        }
        assert!(
            off * 100 <= n * width,
            "case {case} lanes {lanes}: {off} codes differ"
        );
    }
}

/// Causal attention in f64, the plain formula.
fn attention_ref(s: AttnProbe, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let d = s.head_dim;
    let kvs = s.n_head_kv * d;
    let mut out = vec![0f32; q.len()];
    for t in 0..s.n {
        let n_pos = s.pos0 + t + 1;
        for h in 0..s.n_head {
            let kvh = h / (s.n_head / s.n_head_kv);
            let qo = (t * s.n_head + h) * d;
            let scores: Vec<f64> = (0..n_pos)
                .map(|j| {
                    let dot: f64 = (0..d)
                        .map(|i| f64::from(q[qo + i]) * f64::from(k[j * kvs + kvh * d + i]))
                        .sum();
                    dot / (d as f64).sqrt()
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = e.iter().sum();
            for i in 0..d {
                let o: f64 = (0..n_pos)
                    .map(|j| e[j] * f64::from(v[j * kvs + kvh * d + i]))
                    .sum();
                out[qo + i] = (o / l) as f32;
            }
        }
    }
    out
}

#[test]
fn attention_matches_the_reference() {
    let Some(gpu) = common::open() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let shapes = [
        (4, 4, 16),
        (8, 2, 32),
        (6, 3, 40),
        (4, 1, 128),
        (2, 2, 256),
        (5, 5, 64),
    ];
    for (case, &(n_head, n_head_kv, head_dim)) in shapes.iter().enumerate() {
        // Calls of at most 4 rows split their positions into chunks of 64 (2 at 65, 3 at
        // 131, a 2-row call at 192..194 whose first row's 4th chunk is empty) and, past 64
        // chunks, of 128 (4,150); longer calls do not split.
        for (pos0, n) in [
            (0, 1),
            (0, 7),
            (63, 2),
            (130, 1),
            (191, 2),
            (4149, 1),
            (5, 70),
        ] {
            let mut s = AttnProbe {
                n_head,
                n_head_kv,
                head_dim,
                pos0,
                n,
                split: true,
                // Q and O rows from a later row of the buffers (a batched step's sequence).
                row0: case % 3,
            };
            let rows = pos0 + n;
            let q: Vec<f32> = (0..n * n_head * head_dim)
                .map(|_| rng.random_range(-2.0..2.0f32))
                .collect();
            let k: Vec<f32> = (0..rows * n_head_kv * head_dim)
                .map(|_| rng.random_range(-2.0..2.0f32))
                .collect();
            let v: Vec<f32> = (0..rows * n_head_kv * head_dim)
                .map(|_| rng.random_range(-2.0..2.0f32))
                .collect();
            let round = |x: &[f32]| -> Vec<f32> {
                x.iter().map(|&e| half::f16::from_f32(e).to_f32()).collect()
            };
            // Every call, and the same calls unsplit (the lane kernels' adapters); the Q8_0
            // cache where the head size is a multiple of 32.
            for (kv, split) in [GpuKv::F32, GpuKv::F16, GpuKv::Q8_0]
                .into_iter()
                .flat_map(|kv| [(kv, true), (kv, false)])
            {
                if kv == GpuKv::Q8_0 && head_dim % 32 != 0 {
                    continue;
                }
                s.split = split;
                let got = probe::attention(&gpu, s, &q, &k, &v, kv).unwrap();
                // The f16 cache holds K and V rounded to f16, the Q8_0 cache their codes
                // and scales (as the CPU's do).
                let want = match kv {
                    GpuKv::F16 => attention_ref(s, &q, &round(&k), &round(&v)),
                    GpuKv::Q8_0 => attention_ref(s, &q, &q8_round(&k), &q8_round(&v)),
                    GpuKv::F32 => attention_ref(s, &q, &k, &v),
                };
                let md = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(md <= 1e-4, "case {case} {s:?} {kv:?}: max |Δ| {md}");
            }
        }
    }
}

/// The most likely `k` of `logits` as the sampler orders them (higher logit, then lower id).
fn top_ref(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut v: Vec<(u32, f32)> = (0u32..).zip(logits.iter().copied()).collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(k);
    v
}

/// Up to `n / 50` NaN, +∞ or −∞ logits at random places; the lowest index written.
fn sprinkle_non_finite(rng: &mut ChaCha8Rng, logits: &mut [f32]) -> Option<u32> {
    let n = logits.len();
    let mut lowest = None;
    for _ in 0..(n / 50).max(1) {
        let i = rng.random_range(0..n);
        logits[i] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][rng.random_range(0..3usize)];
        lowest = Some(lowest.map_or(i, |l: usize| l.min(i)));
    }
    lowest.map(|i| u32::try_from(i).unwrap())
}

/// `r` is the device's refusal of a NaN or infinite logit at index `lowest`.
fn refused_at<T: std::fmt::Debug>(r: bitnet_gpu::Result<T>, lowest: Option<u32>, what: &str) {
    let e = r.unwrap_err();
    assert!(
        matches!(e, bitnet_gpu::GpuError::NonFiniteLogit { index } if Some(index) == lowest),
        "{what}: {e} (lowest {lowest:?})"
    );
}

#[test]
fn top_k_matches_a_sort() {
    let Some(gpu) = common::open() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for n in [1usize, 5, 63, 64, 65, 300, 4256, 16_384, 128_256, 200_001] {
        // Few distinct values, so many ties.
        let mut logits: Vec<f32> = (0..n)
            .map(|_| f32::from(rng.random_range(-40..40i16)) / 8.0)
            .collect();
        let got = probe::top_k(&gpu, &logits).unwrap();
        let want = top_ref(&logits, 64);
        assert_eq!(got.len(), want.len(), "n {n}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.0 == w.0 && g.1.to_bits() == w.1.to_bits(),
                "n {n} [{i}]: gpu {g:?} sort {w:?}"
            );
        }
        // A NaN or infinite logit anywhere is the model's error, with the lowest index.
        let lowest = sprinkle_non_finite(&mut rng, &mut logits);
        refused_at(probe::top_k(&gpu, &logits), lowest, &format!("n {n}"));
    }
}

#[test]
fn final_norm_matches_rms_norm() {
    let Some(gpu) = common::open() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    for width in [1usize, 7, 256, 1000, 2560] {
        let n = rng.random_range(1..5usize);
        let x: Vec<f32> = (0..n * width)
            .map(|_| rng.random_range(-6.0..6.0f32))
            .collect();
        let w: Vec<f32> = (0..width).map(|_| rng.random_range(0.1..2.0f32)).collect();
        let got = probe::rmsnorm(&gpu, &x, &w, 1e-6).unwrap();
        let mut want = vec![0f32; width];
        for r in 0..n {
            rms_norm(&x[r * width..(r + 1) * width], &w, 1e-6, &mut want);
            for (i, (g, c)) in got[r * width..(r + 1) * width]
                .iter()
                .zip(&want)
                .enumerate()
            {
                assert!(
                    (g - c).abs() <= 1e-5 * c.abs().max(1.0),
                    "width {width} row {r} [{i}]: {g} vs {c}"
                );
            }
        }
    }
}

/// Both RoPE styles (NeoX; the normal pairwise form of `llama`) against the CPU's, with
/// partial rotations (n_rot < head_dim) among the shapes.
#[test]
fn rope_matches_the_cpu() {
    let Some(gpu) = common::open() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    for style in [RopeStyle::Neox, RopeStyle::Norm] {
        let cpu_rope = rope_for(style);
        for (n_head, n_head_kv, head_dim, n_rot) in [
            (4, 2, 64, 64),
            (8, 8, 128, 128),
            (3, 1, 80, 64),
            (2, 1, 32, 16),
        ] {
            let (pos0, n) = (rng.random_range(0..3000usize), rng.random_range(1..6usize));
            let s = probe::RopeProbe {
                n_head,
                n_head_kv,
                head_dim,
                n_rot,
                base: 500_000.0,
                pos0,
                n,
                style,
                // Q, K and V rows from a later row of the buffers (a batched step's sequence).
                row0: rng.random_range(0..3usize),
            };
            let q: Vec<f32> = (0..n * n_head * head_dim)
                .map(|_| rng.random_range(-3.0..3.0f32))
                .collect();
            let k: Vec<f32> = (0..n * n_head_kv * head_dim)
                .map(|_| rng.random_range(-3.0..3.0f32))
                .collect();
            let v: Vec<f32> = (0..n * n_head_kv * head_dim)
                .map(|_| rng.random_range(-3.0..3.0f32))
                .collect();
            for cache in [GpuKv::F16, GpuKv::F32, GpuKv::Q8_0] {
                if cache == GpuKv::Q8_0 && head_dim % 32 != 0 {
                    continue;
                }
                let out = probe::rope(&gpu, s, &q, &k, &v, cache).unwrap();
                let (gq, gk) = (&out.q, &out.k);
                let (mut wq, mut wk) = (q.clone(), k.clone());
                for t in 0..n {
                    let r = rope_row(pos0 + t, n_rot, 500_000.0);
                    let rows = wq[t * n_head * head_dim..(t + 1) * n_head * head_dim]
                        .chunks_exact_mut(head_dim)
                        .chain(
                            wk[t * n_head_kv * head_dim..(t + 1) * n_head_kv * head_dim]
                                .chunks_exact_mut(head_dim),
                        );
                    for head in rows {
                        cpu_rope(&mut head[..n_rot], &r, Numerics::Fast);
                    }
                }
                for (g, w) in gq.iter().zip(&wq).chain(gk.iter().zip(&wk)) {
                    // The same table; a GPU may fuse the multiply-add.
                    assert!((g - w).abs() <= 1e-5, "{s:?}: {g} vs {w}");
                }
                // The cache holds the rotated K and the V rows: as they are (f32), rounded
                // to f16 (within one f16 step of the CPU cache's round-to-nearest-even), or
                // quantized per 32 (the CPU's scales; a code within one step of its codes,
                // where the device's division rounds onto the other side of a half).
                assert_eq!(out.cache_k.len(), wk.len());
                assert_eq!(out.cache_v.len(), v.len());
                let (q8k, q8v) = if cache == GpuKv::Q8_0 {
                    (q8_round(gk), q8_round(&v))
                } else {
                    (gk.clone(), v.clone())
                };
                let pairs = out
                    .cache_k
                    .iter()
                    .zip(gk.iter().zip(&q8k))
                    .chain(out.cache_v.iter().zip(v.iter().zip(&q8v)));
                for (i, (&c, (&w, &w8))) in pairs.enumerate() {
                    let (want, tol) = match cache {
                        GpuKv::F16 => {
                            let h = half::f16::from_f32(w).to_f32();
                            (h, h.abs() / 1024.0)
                        }
                        GpuKv::F32 => (w, 0.0),
                        GpuKv::Q8_0 => {
                            let blk = i / 32 * 32;
                            let all: Vec<f32> = gk.iter().chain(&v).copied().collect();
                            let amax = all[blk..blk + 32].iter().fold(0f32, |m, x| m.max(x.abs()));
                            (w8, amax / 127.0 * 1.01)
                        }
                    };
                    assert!(
                        (c - want).abs() <= tol,
                        "{s:?} {cache:?}: cache element {i}: {c} vs {want}"
                    );
                }
            }
        }
    }
}

/// `x` (rows a multiple of 32 long) through the CPU's Q8_0 KV quantizer and back.
fn q8_round(x: &[f32]) -> Vec<f32> {
    let mut q = vec![0i8; x.len()];
    let mut d = vec![0f32; x.len() / 32];
    bitnet_kernels::rows::quantize_q8_0_split(x, &mut q, &mut d).unwrap();
    q.iter()
        .enumerate()
        .map(|(i, &c)| f32::from(c) * d[i / 32])
        .collect()
}

fn row_matrix(rng: &mut ChaCha8Rng, ty: RowType, rows: usize, cols: usize) -> Vec<u8> {
    let v: Vec<f32> = (0..rows * cols)
        .map(|_| rng.random_range(-1.0..1.0f32))
        .collect();
    match ty {
        RowType::F16 => v
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect(),
        _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

#[test]
fn head_and_embedding_match_the_rows() {
    let Some(gpu) = common::open() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(15);
    for (case, ty) in [RowType::F16, RowType::F32, RowType::F16]
        .into_iter()
        .enumerate()
    {
        let (rows, cols) = ([37usize, 200, 1001][case], [64usize, 256, 130][case]);
        let bytes = row_matrix(&mut rng, ty, rows, cols);
        let m = RowMatrix::new(ty, rows, cols, Cow::Borrowed(&bytes)).unwrap();
        let row_bytes = bytes.len() / rows;
        // Chunks of 10 rows (ragged last one), and the whole matrix in one buffer.
        // One output row (a decode step), and batched steps' 3 and 6 (head_lanes.wgsl takes
        // four a thread: a ragged group).
        for (chunk, n) in [10 * row_bytes, bytes.len()]
            .into_iter()
            .flat_map(|c| [(c, 1usize), (c, 3), (c, 6)])
        {
            let hn: Vec<f32> = (0..n * cols)
                .map(|_| rng.random_range(-2.0..2.0f32))
                .collect();
            let mut w = vec![0f32; cols];
            // head.wgsl, and head_lanes.wgsl where the adapter has it.
            for lanes in [false, true] {
                if lanes && !gpu.lane_kernels() {
                    eprintln!(
                        "head_lanes.wgsl not tested: {} is not a CPU device",
                        gpu.info().name
                    );
                    continue;
                }
                let got = probe::head(&gpu, &m, &hn, n, chunk as u64, lanes).unwrap();
                for r in 0..rows {
                    m.dequantize_row(r, &mut w).unwrap();
                    for t in 0..n {
                        let want: f64 = w
                            .iter()
                            .zip(&hn[t * cols..(t + 1) * cols])
                            .map(|(&a, &b)| f64::from(a) * f64::from(b))
                            .sum();
                        let g = f64::from(got[t * rows + r]);
                        assert!(
                            (g - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "{ty:?} chunk {chunk} row {r} token {t} (lanes {lanes}): {g} vs {want}"
                        );
                    }
                }
            }
            let ids: Vec<u32> = (0..5)
                .map(|_| rng.random_range(0..u32::try_from(rows).unwrap()))
                .collect();
            let got = probe::embed(&gpu, &m, &ids, chunk as u64).unwrap();
            for (i, &id) in ids.iter().enumerate() {
                m.dequantize_row(id as usize, &mut w).unwrap();
                assert_eq!(
                    &got[i * cols..(i + 1) * cols],
                    &w[..],
                    "{ty:?} embedding row {id}"
                );
            }
        }
    }
}

/// The quantized LM head against the CPU's integer head (`RowMatrix::matmul_q8`, the same
/// per-32 activation codes): Q8_0 and Q4_0, each from F16 rows quantized at upload and from
/// rows the CPU quantized (repacked only); even and odd block counts, the head in chunks
/// (ragged last) and whole, one output row and batched steps' 3 and 6; head_q.wgsl, and
/// head_q_lanes.wgsl where the adapter has it.
#[test]
fn quantized_head_matches_the_cpu_integer_head() {
    let Some(gpu) = common::open() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let pool = Pool::new(2);
    for (case, ty) in [RowType::Q8_0, RowType::Q4_0, RowType::Q8_0, RowType::Q4_0]
        .into_iter()
        .enumerate()
    {
        let (rows, cols) = (
            [37usize, 200, 1001, 70][case],
            [64usize, 96, 160, 2560][case],
        );
        let bytes = row_matrix(&mut rng, RowType::F16, rows, cols);
        let f16 = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&bytes)).unwrap();
        let q = RowMatrix::quantize_from(&f16, ty, &pool).unwrap();
        let gpu_row = (q.nbytes() / rows).next_multiple_of(4) + 4;
        for (chunk, n) in [10 * gpu_row, rows * gpu_row]
            .into_iter()
            .flat_map(|c| [(c, 1usize), (c, 3), (c, 6)])
        {
            let x: Vec<f32> = (0..n * cols)
                .map(|_| rng.random_range(-2.0..2.0f32))
                .collect();
            let mut want = vec![0f32; n * rows];
            q.matmul_q8(&x, &mut want, &pool).unwrap();
            let mut xq = vec![0i8; n * cols];
            let mut xd = vec![0f32; n * cols / 32];
            bitnet_kernels::rows::quantize_q8_0_split(&x, &mut xq, &mut xd).unwrap();
            for (src, lanes) in [(&f16, false), (&q, false), (&f16, true), (&q, true)] {
                if lanes && !gpu.lane_kernels() {
                    eprintln!(
                        "head_q_lanes.wgsl not tested: {} is not a CPU device",
                        gpu.info().name
                    );
                    continue;
                }
                let what = format!(
                    "{ty:?} from {:?}, {rows}×{cols}, chunk {chunk}, {n} rows (lanes {lanes})",
                    src.row_type()
                );
                let got = probe::head_q(&gpu, src, ty, &xq, &xd, n, chunk as u64, lanes).unwrap();
                assert_eq!(got.len(), want.len(), "{what}");
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                        "{what}: logit {i}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

/// The final norm that feeds a quantized head: the rows rmsnorm.wgsl gives, quantized per 32
/// as `quantize_q8_0_split` quantizes them (scales equal; a code may differ by one where the
/// device's division rounds a value onto the other side of a half), and a NaN's block a NaN
/// scale.
#[test]
fn rmsnorm_q8_quantizes_the_normed_rows_as_the_cpu() {
    let Some(gpu) = common::open() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    for (n, width) in [(1usize, 32usize), (3, 96), (2, 2560), (5, 1024)] {
        let mut x: Vec<f32> = (0..n * width)
            .map(|_| rng.random_range(-3.0..3.0f32))
            .collect();
        // A block of zeros (scale 0, codes 0).
        x[..32].fill(0.0);
        let w: Vec<f32> = (0..width).map(|_| rng.random_range(0.5..1.5f32)).collect();
        let y = probe::rmsnorm(&gpu, &x, &w, 1e-5).unwrap();
        let mut cq = vec![0i8; n * width];
        let mut cd = vec![0f32; n * width / 32];
        bitnet_kernels::rows::quantize_q8_0_split(&y, &mut cq, &mut cd).unwrap();
        let (gq, gd) = probe::rmsnorm_q8(&gpu, &x, &w, 1e-5).unwrap();
        assert_eq!(gd, cd, "{n}×{width}: scales");
        let off = gq.iter().zip(&cq).filter(|(a, b)| a != b).count();
        assert!(
            gq.iter()
                .zip(&cq)
                .all(|(&a, &b)| (i16::from(a) - i16::from(b)).abs() <= 1),
            "{n}×{width}: a code differs by more than one"
        );
        assert!(off * 1000 <= gq.len(), "{n}×{width}: {off} codes differ");
        assert!(gd[0] == 0.0 && gq[..32].iter().all(|&c| c == 0));
    }
    let mut x = vec![1.0f32; 64];
    x[40] = f32::NAN;
    let (_, d) = probe::rmsnorm_q8(&gpu, &x, &[1.0; 64], 1e-5).unwrap();
    assert!(d[1].is_nan(), "a NaN's block: scale {}", d[1]);
}

#[test]
fn argmax_matches_the_sampler() {
    let Some(gpu) = common::open() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(16);
    for n in [1usize, 2, 255, 256, 257, 4256, 128_256] {
        for case in 0..2 {
            let mut logits: Vec<f32> = (0..n)
                .map(|_| f32::from(rng.random_range(-20..20i16)) / 4.0)
                .collect();
            if case == 1 {
                // The maximum tied at several places.
                let m = logits.iter().copied().fold(f32::MIN, f32::max);
                logits[n - 1] = m;
                logits[n / 2] = m;
            }
            let want = bitnet_sampling::argmax(&logits).unwrap();
            assert_eq!(
                probe::argmax(&gpu, &logits).unwrap(),
                want,
                "n {n} case {case}"
            );
            // A NaN or infinite logit anywhere is the model's error, with the lowest index.
            let lowest = sprinkle_non_finite(&mut rng, &mut logits);
            refused_at(
                probe::argmax(&gpu, &logits),
                lowest,
                &format!("n {n} case {case}"),
            );
        }
    }
}

#[test]
fn argmax_takes_each_row_of_a_batched_step() {
    let Some(gpu) = common::open() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    for (n, rows) in [(257usize, 2usize), (4256, 5), (128_256, 4)] {
        let logits: Vec<f32> = (0..n * rows)
            .map(|_| f32::from(rng.random_range(-20..20i16)) / 4.0)
            .collect();
        let want: Vec<u32> = logits
            .chunks_exact(n)
            .map(|r| bitnet_sampling::argmax(r).unwrap())
            .collect();
        assert_eq!(
            probe::argmax_rows(&gpu, &logits, rows).unwrap(),
            want,
            "n {n} rows {rows}"
        );
    }
}

/// RMS(x, w) then the int8 quantization of each row, on the CPU: codes and scales.
fn norm_quant_ref(x: &[f32], w: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let width = w.len();
    let mut y = vec![0f32; width];
    let mut q = vec![0i8; width];
    let (mut codes, mut scales) = (Vec::new(), Vec::new());
    for row in x.chunks_exact(width) {
        rms_norm(row, w, 1e-5, &mut y);
        scales.push(act::quantize_i8_scalar(&y, &mut q));
        codes.extend_from_slice(&q);
    }
    (codes, scales)
}

/// Output rows agree within what one activation code off by one at a rounding tie moves
/// (the GPU sums squares in f32): a few thousandths of the row's largest value.
fn assert_rows_close(got: &[f32], want: &[f32], n_out: usize, what: &str) {
    for (r, (g, w)) in got.chunks(n_out).zip(want.chunks(n_out)).enumerate() {
        let scale = w.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= 4e-3 * scale,
                "{what}: row {r} [{i}] gpu {a} cpu {b} (row max {scale})"
            );
        }
    }
}

#[test]
fn decode_kernel_matches_norm_quant_and_the_scalar_kernel() {
    let Some(gpu) = common::open() else { return };
    let pool = Pool::new(1);
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    for case in 0..18 {
        let tq2 = case % 3 == 2;
        let unit = if tq2 { 256 } else { 128 };
        let n_in = unit * rng.random_range(1..9usize);
        let n = rng.random_range(1..7usize);
        let layout = if tq2 {
            TernaryLayout::Tq2_0
        } else {
            TernaryLayout::I2S
        };
        // Q, K and V read together (case even), or one matrix added into its output.
        let shapes: Vec<usize> = if case % 2 == 0 {
            vec![
                [8, 24, 40, 300][case % 4],
                [1, 3, 17, 16][case % 4],
                [1, 3, 17, 9][(case / 2) % 4],
            ]
        } else {
            vec![[1, 7, 70, 129][case % 4]]
        };
        let bytes: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&r| {
                if tq2 {
                    tq2_bytes(&mut rng, r, n_in)
                } else {
                    i2s_bytes(&mut rng, r, n_in, case % 4 == 1)
                }
            })
            .collect();
        let mats: Vec<TernaryMatrix<'_>> = shapes
            .iter()
            .zip(&bytes)
            .map(|(&r, b)| {
                let mut m = TernaryMatrix::new(layout, r, n_in, b, None).unwrap();
                m.check_codes();
                m
            })
            .collect();
        let x: Vec<f32> = (0..n * n_in)
            .map(|_| rng.random_range(-4.0..4.0f32))
            .collect();
        let nw: Vec<f32> = (0..n_in).map(|_| rng.random_range(0.1..2.0f32)).collect();
        let add: Option<Vec<f32>> = (shapes.len() == 1).then(|| {
            (0..n * shapes[0])
                .map(|_| rng.random_range(-1.0..1.0f32))
                .collect()
        });
        let refs: Vec<&TernaryMatrix<'_>> = mats.iter().collect();
        // Every set: teams normed in the prologue or by norm_quant first, and the lane
        // kernels where the adapter has them.
        for kind in decode_kinds(&gpu) {
            let got = probe::mv(&gpu, &refs, &x, &nw, 1e-5, add.as_deref(), kind).unwrap();
            let (xq, s) = norm_quant_ref(&x, &nw);
            for (j, m) in mats.iter().enumerate() {
                let mut want = vec![0f32; n * m.n_out()];
                m.matmul_on(Isa::Scalar, &xq, &s, &mut want, &pool)
                    .unwrap()
                    .unwrap();
                if let Some(a) = &add {
                    want.iter_mut().zip(a).for_each(|(w, a)| *w += a);
                }
                assert_rows_close(
                    &got[j],
                    &want,
                    m.n_out(),
                    &format!(
                        "case {case} ({layout:?} {n_in} in, {n} rows, {kind:?}) matrix {j} of \
                     {shapes:?}"
                    ),
                );
            }
        }
    }
}

/// The decode kernel sets to test on this adapter: the lane kernels only where it has them
/// (a CPU device), which the output says.
fn decode_kinds(gpu: &bitnet_gpu::Gpu) -> Vec<MvKind> {
    let mut kinds = vec![MvKind::Quant, MvKind::Norm];
    if gpu.lane_kernels() {
        kinds.push(MvKind::Lanes);
    } else {
        eprintln!(
            "lane kernels not tested: {} is not a CPU device",
            gpu.info().name
        );
    }
    kinds
}

#[test]
fn decode_gate_up_kernel_matches_the_scalar_kernels_and_the_activation() {
    let Some(gpu) = common::open() else { return };
    let pool = Pool::new(1);
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for case in 0..8 {
        let tq2 = case % 4 == 3;
        let unit = if tq2 { 256 } else { 128 };
        let n_in = unit * rng.random_range(1..9usize);
        let n_out = [1, 9, 40, 261][case % 4];
        let n = rng.random_range(1..6usize);
        let act_mode = 1 + u32::from(case % 2 == 1);
        let layout = if tq2 {
            TernaryLayout::Tq2_0
        } else {
            TernaryLayout::I2S
        };
        let gen = |rng: &mut ChaCha8Rng| {
            if tq2 {
                tq2_bytes(rng, n_out, n_in)
            } else {
                i2s_bytes(rng, n_out, n_in, false)
            }
        };
        let (bg, bu) = (gen(&mut rng), gen(&mut rng));
        let gate = TernaryMatrix::new(layout, n_out, n_in, &bg, None).unwrap();
        let up = TernaryMatrix::new(layout, n_out, n_in, &bu, None).unwrap();
        let x: Vec<f32> = (0..n * n_in)
            .map(|_| rng.random_range(-4.0..4.0f32))
            .collect();
        let nw: Vec<f32> = (0..n_in).map(|_| rng.random_range(0.1..2.0f32)).collect();
        for kind in decode_kinds(&gpu) {
            let got = probe::mv_glu(&gpu, &gate, &up, &x, &nw, 1e-5, act_mode, kind).unwrap();
            let (xq, s) = norm_quant_ref(&x, &nw);
            let want = glu_ref(&gate, &up, &xq, &s, act_mode, &pool);
            assert_rows_close(
                &got,
                &want,
                n_out,
                &format!(
                    "case {case} ({layout:?} {n_out}x{n_in}, {n} rows, act {act_mode}, {kind:?})"
                ),
            );
        }
    }
}

#[test]
fn prompt_gemm_matches_the_scalar_kernel_and_its_epilogues() {
    let Some(gpu) = common::open() else { return };
    let pool = Pool::new(1);
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    for case in 0..16 {
        let n_in = 128 * rng.random_range(1..7usize);
        // Ragged tiles: rows and tokens not multiples of 64, and more than one tile of each.
        let n_out = [1, 63, 64, 65, 130, 200, 7, 129][case % 8];
        let n = [16, 17, 64, 65, 100, 130, 1, 40][(case + case / 8) % 8];
        let op = u32::try_from(case % 4).unwrap();
        let bytes = i2s_bytes(&mut rng, n_out, n_in, case % 5 == 1);
        let mut m = TernaryMatrix::new(TernaryLayout::I2S, n_out, n_in, &bytes, None).unwrap();
        m.check_codes();
        let (xq, s) = activations(&mut rng, n, n_in);
        let y0: Vec<f32> = (0..n * n_out)
            .map(|_| rng.random_range(-2.0..2.0f32))
            .collect();
        let mut lin = vec![0f32; n * n_out];
        m.matmul_on(Isa::Scalar, &xq, &s, &mut lin, &pool)
            .unwrap()
            .unwrap();
        let want: Vec<f32> = lin
            .iter()
            .zip(&y0)
            .map(|(&v, &y)| match op {
                0 => v,
                1 => y + v,
                2 => {
                    let p = y.max(0.0);
                    p * p * v
                }
                _ => y / (1.0 + (-y).exp()) * v,
            })
            .collect();
        for lanes in gemm_kinds(&gpu, case) {
            let got = probe::gemm(&gpu, &m, &xq, &s, &y0, op, lanes).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                // The same integers and float steps as the scalar kernel (exp may round apart).
                let tol = 2e-6 * w.abs().max(1e-3);
                assert!(
                    (g - w).abs() <= tol,
                    "case {case} ({n_out}x{n_in}, {n} rows, op {op}, lanes {lanes}): [{i}] gpu {g} cpu {w}"
                );
            }
        }
    }
}

#[test]
fn prompt_gemm_holds_the_largest_sums() {
    // Every code +1 and every activation 127: the largest code·(x + 128) sums a block can
    // have (gemm_lanes.wgsl keeps two rows' in 16-bit halves); one token at −128 (x + 128 = 0).
    let Some(gpu) = common::open() else { return };
    let pool = Pool::new(1);
    let (n_out, n_in, n) = (66, 384, 21);
    let mut bytes = vec![0xAAu8; n_out * n_in / 4];
    bytes.extend_from_slice(&0.5f32.to_le_bytes());
    bytes.extend_from_slice(&[0; 28]);
    let m = TernaryMatrix::new(TernaryLayout::I2S, n_out, n_in, &bytes, None).unwrap();
    let mut xq = vec![127i8; n * n_in];
    xq[n_in..2 * n_in].fill(-128);
    let s = vec![1.0f32; n];
    let mut want = vec![0f32; n * n_out];
    m.matmul_on(Isa::Scalar, &xq, &s, &mut want, &pool)
        .unwrap()
        .unwrap();
    assert_eq!(want[0], 0.5 * 127.0 * 384.0, "the scalar kernel's sum");
    for lanes in gemm_kinds(&gpu, 0) {
        let got = probe::gemm(&gpu, &m, &xq, &s, &vec![0f32; n * n_out], 0, lanes).unwrap();
        assert_eq!(got, want, "lanes {lanes}");
    }
}

/// The prompt GEMMs to test on this adapter: gemm.wgsl, and gemm_lanes.wgsl where it has
/// the lane kernels (said once, at case 0, where it has not).
fn gemm_kinds(gpu: &bitnet_gpu::Gpu, case: usize) -> Vec<bool> {
    if gpu.lane_kernels() {
        vec![false, true]
    } else {
        if case == 0 {
            eprintln!(
                "gemm_lanes.wgsl not tested: {} is not a CPU device",
                gpu.info().name
            );
        }
        vec![false]
    }
}
