//! Attention benchmark: `cargo bench -p bitnet-kernels --bench attn`.
//!
//! One decode step (one query row) of the 2B-4T attention shape (20 query heads, 5 KV heads of
//! 128, in the head-major layout the model uses) at several depths, per cache type (f16, and
//! the same values as Q8_0 and Q4_0), tier and thread count. Each call reads a different layer's cache out of 30, as a decode step does,
//! so the cache streams from memory rather than staying in the last-level cache. Prints µs per
//! layer, the cache bytes per second, the ratio against a plain read of the same buffers in
//! the same run, and the speed-up over the plain (scalar twin) tier.
//!
//! Then a prompt batch: 128 query rows at positions 3968..4096 (the last batch of a
//! 4096-token prompt), per vector tier and thread count, in µs per layer and GFLOP/s (two
//! multiply-adds per head element per visible (row, head, position): q·k and p·v).
//!
//! Env: `BENCH_QUICK=1` runs fewer calls.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss
)]

use std::hint::black_box;
use std::time::Instant;

use bitnet_kernels::attn::{attend_isa, AttnShape, KvLayout, KvRows};
use bitnet_kernels::{supported_isas, Isa, Pool};
use half::f16;

const LAYERS: usize = 30;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One layer's K or V in a cache type.
enum Cache {
    F16(Vec<f16>),
    Q8(Vec<i8>, Vec<f32>),
    Q4(Vec<u8>, Vec<f32>),
}

impl Cache {
    fn new(ty: &str, x: &[f16]) -> Cache {
        let f: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        let mut d = vec![0f32; f.len() / 32];
        match ty {
            "q8_0" => {
                let mut q = vec![0i8; f.len()];
                bitnet_kernels::rows::quantize_q8_0_split(&f, &mut q, &mut d).unwrap();
                Cache::Q8(q, d)
            }
            "q4_0" => {
                let mut q = vec![0u8; f.len() / 2];
                bitnet_kernels::rows::quantize_q4_0_split(&f, &mut q, &mut d).unwrap();
                Cache::Q4(q, d)
            }
            _ => Cache::F16(x.to_vec()),
        }
    }

    fn rows(&self) -> KvRows<'_> {
        match self {
            Cache::F16(x) => KvRows::F16(x),
            Cache::Q8(q, d) => KvRows::Q8 { q, d },
            Cache::Q4(q, d) => KvRows::Q4 { q, d },
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Cache::F16(x) => 2 * x.len(),
            Cache::Q8(q, d) => q.len() + 4 * d.len(),
            Cache::Q4(q, d) => q.len() + 4 * d.len(),
        }
    }
}

/// `len` cache values in [−0.5, 0.5), a different pattern per `salt`.
fn cache_values(len: usize, salt: usize) -> Vec<f16> {
    (0..len)
        .map(|i| f16::from_f32((((i + salt) * 7919) % 1000) as f32 / 1000.0 - 0.5))
        .collect()
}

fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let shape = AttnShape {
        n_head: 20,
        n_head_kv: 5,
        head_dim: 128,
    };
    let q: Vec<f32> = (0..2560)
        .map(|i| ((i * 31) % 97) as f32 / 97.0 - 0.5)
        .collect();
    let mut out = vec![0f32; 2560];
    println!(
        "{:<8} {:>5} {:>7} {:>7} {:>12} {:>10} {:>10} {:>8} {:>10}",
        "isa", "cache", "threads", "depth", "us/layer", "GB/s", "read GB/s", "ratio", "vs plain"
    );
    for depth in [512usize, 4096] {
        let per_layer = depth * shape.n_head_kv * shape.head_dim;
        let caches: Vec<(Vec<f16>, Vec<f16>)> = (0..LAYERS)
            .map(|l| {
                (
                    cache_values(per_layer, l * 7 + 1),
                    cache_values(per_layer, l * 7 + 2),
                )
            })
            .collect();
        let bytes = 2 * per_layer * 2;
        let layout = KvLayout::head_major(&shape, depth);
        let reps = if quick { 3 } else { 7 };
        for threads in [1usize, 2] {
            let pool = Pool::new(threads);
            // The same caches read plainly, in parallel, summing 8-byte words.
            let read_gbs = {
                let mut times = Vec::new();
                for _ in 0..reps {
                    let t = Instant::now();
                    for (k, v) in &caches {
                        let sink = std::sync::atomic::AtomicU64::new(0);
                        let sum = |s: &[f16]| {
                            let b: &[u8] = bytemuck::cast_slice(s);
                            b.chunks_exact(8).fold(0u64, |a, w| {
                                a.wrapping_add(u64::from_le_bytes(w.try_into().unwrap()))
                            })
                        };
                        pool.for_rows(2, 1, &|r| {
                            for i in r {
                                let s = if i == 0 { sum(k) } else { sum(v) };
                                sink.fetch_add(s, std::sync::atomic::Ordering::Relaxed);
                            }
                        });
                        black_box(sink.into_inner());
                    }
                    times.push(t.elapsed().as_secs_f64() / LAYERS as f64);
                }
                bytes as f64 / median(times) / 1e9
            };
            for ty in ["f16", "q8_0", "q4_0"] {
                let typed: Vec<(Cache, Cache)> = caches
                    .iter()
                    .map(|(k, v)| (Cache::new(ty, k), Cache::new(ty, v)))
                    .collect();
                let bytes = typed[0].0.bytes() + typed[0].1.bytes();
                let mut plain_us = f64::NAN;
                let mut isas = vec![Isa::Scalar];
                isas.extend(supported_isas().into_iter().filter(|&i| i != Isa::Scalar));
                for isa in isas {
                    let mut times = Vec::new();
                    for _ in 0..reps {
                        let t = Instant::now();
                        for (k, v) in &typed {
                            attend_isa(
                                isa,
                                &shape,
                                &q,
                                k.rows(),
                                v.rows(),
                                layout,
                                depth - 1,
                                1,
                                0.088,
                                &mut out,
                                &pool,
                            )
                            .unwrap();
                            black_box(&out);
                        }
                        times.push(t.elapsed().as_secs_f64() / LAYERS as f64);
                    }
                    let s = median(times);
                    if isa == Isa::Scalar {
                        plain_us = s * 1e6;
                    }
                    let gbs = bytes as f64 / s / 1e9;
                    println!(
                    "{:<8} {ty:>5} {threads:>7} {depth:>7} {:>12.1} {gbs:>10.2} {read_gbs:>10.2} {:>8.2} {:>9.1}x",
                    isa.name(),
                    s * 1e6,
                    gbs / read_gbs,
                    plain_us / (s * 1e6)
                );
                }
            }
        }
    }

    // A prompt batch deep in the context.
    let (depth, n) = (4096usize, 128usize);
    let pos0 = depth - n;
    let per_layer = depth * shape.n_head_kv * shape.head_dim;
    let (k, v) = (cache_values(per_layer, 1), cache_values(per_layer, 2));
    let layout = KvLayout::head_major(&shape, depth);
    let qn: Vec<f32> = (0..n * 2560)
        .map(|i| ((i * 31) % 97) as f32 / 97.0 - 0.5)
        .collect();
    let mut outn = vec![0f32; n * 2560];
    // Visible (row, position) pairs × heads × 2 dots of head_dim multiply-adds × 2 flops.
    let pairs: usize = (0..n).map(|t| pos0 + t + 1).sum();
    let flops = (pairs * shape.n_head * 2 * shape.head_dim * 2) as f64;
    println!();
    println!(
        "{:<8} {:>7} {:>15} {:>12} {:>10}",
        "isa", "threads", "rows@pos", "us/layer", "GFLOP/s"
    );
    let reps = if quick { 2 } else { 5 };
    for threads in [1usize, 2] {
        let pool = Pool::new(threads);
        for isa in supported_isas().into_iter().filter(|&i| i != Isa::Scalar) {
            let mut times = Vec::new();
            for _ in 0..reps {
                let t = Instant::now();
                attend_isa(
                    isa,
                    &shape,
                    &qn,
                    KvRows::F16(&k),
                    KvRows::F16(&v),
                    layout,
                    pos0,
                    n,
                    0.088,
                    &mut outn,
                    &pool,
                )
                .unwrap();
                black_box(&outn);
                times.push(t.elapsed().as_secs_f64());
            }
            let s = median(times);
            println!(
                "{:<8} {threads:>7} {:>15} {:>12.1} {:>10.1}",
                isa.name(),
                format!("{n}@{pos0}"),
                s * 1e6,
                flops / s / 1e9
            );
        }
    }
}
