//! Weight-streaming benchmark: `cargo bench -p bitnet-kernels --bench matvec`.
//!
//! For the 2B-4T per-layer I2_S shapes and the 128256×2560 LM head (F16, Q8_0), measures
//! weight bytes per second per tier, thread count and thread pool (ours vs rayon), next to a
//! plain read of buffers of the same size measured in the same run (with and without a
//! software prefetch), and prints the ratio against the better of the two reads.
//!
//! Each configuration cycles over enough copies of the weights to exceed the last-level cache
//! (≥ 64 MiB in total), as a decode step does over 30 layers; the read baseline cycles over
//! the same buffers. Timing: best-of-5 medians would hide noise on a shared machine, so we
//! report the median of `SAMPLES` samples, each ≥ `MIN_SAMPLE` long.
//!
//! Env: `BENCH_FILTER=substring` runs only matching rows; `BENCH_QUICK=1` shortens samples;
//! `BENCH_HOT=1` uses a single copy of each weight matrix (cache-resident compute speed).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::panic
)]

use std::hint::black_box;
use std::ops::Range;
use std::time::{Duration, Instant};

mod common;

use bitnet_kernels::layout::i2s;
use bitnet_kernels::{
    act, part_range, supported_isas, F16DotOrder, Isa, Pool, RowMatrix, RowRunner, RowType,
    TernaryLayout, TernaryMatrix,
};

const SAMPLES: usize = 7;
const WORKING_SET: usize = 64 << 20;

fn min_sample() -> Duration {
    if std::env::var_os("BENCH_QUICK").is_some() {
        Duration::from_millis(20)
    } else {
        Duration::from_millis(80)
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Median seconds per call of `f(i)` (i = call counter, for rotating buffers).
fn time_per_call(mut f: impl FnMut(usize)) -> f64 {
    let mut i = 0usize;
    // Warm up and calibrate.
    let t = Instant::now();
    let mut calls = 0usize;
    while t.elapsed() < min_sample() / 4 || calls < 1 {
        f(i);
        i += 1;
        calls += 1;
    }
    let per = t.elapsed().as_secs_f64() / calls as f64;
    let reps = ((min_sample().as_secs_f64() / per).ceil() as usize).max(1);
    // Slow configurations (the scalar LM head takes seconds per call): fewer samples.
    let n_samples = if per > 0.25 { 3 } else { SAMPLES };
    let mut samples: Vec<f64> = (0..n_samples)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f(i);
                i += 1;
            }
            t.elapsed().as_secs_f64() / reps as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[n_samples / 2]
}

/// Plain read of `buf` split over the threads (sum of u64 words). With `PF`, each 64-byte
/// line is also prefetched 4 KiB ahead, as the streaming kernels do: on hosts whose hardware
/// prefetcher is weak, that read is the faster one, and ratios are taken against the better.
fn read_all<const PF: bool>(buf: &[u8], runner: &RowRunner<'_>) -> u64 {
    let words: &[u64] = bytemuck::cast_slice(&buf[..buf.len() / 8 * 8]);
    let chunks = words.len().div_ceil(512);
    let total = std::sync::atomic::AtomicU64::new(0);
    runner(chunks, 1, &|r: Range<usize>| {
        let w = &words[r.start * 512..(r.end * 512).min(words.len())];
        // Four independent sums so the loop is limited by loads, not by add latency.
        let mut s = [0u64; 4];
        let mut it = w.chunks_exact(8);
        for c in &mut it {
            if PF {
                prefetch_4k_ahead(c);
            }
            for l in 0..8 {
                s[l % 4] = s[l % 4].wrapping_add(c[l]);
            }
        }
        let rest: u64 = it.remainder().iter().fold(0, |a, &b| a.wrapping_add(b));
        let v = s.iter().fold(rest, |a, &b| a.wrapping_add(b));
        total.fetch_add(v, std::sync::atomic::Ordering::Relaxed);
    });
    total.into_inner()
}

/// Hint the line 4 KiB past `c` into L1 (no-op off x86_64).
#[inline(always)]
fn prefetch_4k_ahead(c: &[u64]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let a = c.as_ptr().cast::<i8>().wrapping_add(4096);
        // SAFETY: SSE is baseline on x86_64; a prefetch never faults, whatever the address,
        // and the pointer is never dereferenced.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(a) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = c;
}

#[derive(Clone, Copy, PartialEq)]
enum PoolKind {
    Ours,
    Rayon,
}

struct Runners {
    ours: [Pool; 2],
    rayon: [rayon::ThreadPool; 2],
}

impl Runners {
    fn run(
        &self,
        kind: PoolKind,
        threads: usize,
        n: usize,
        grain: usize,
        f: &(dyn Fn(Range<usize>) + Sync),
    ) {
        match kind {
            PoolKind::Ours => self.ours[threads - 1].for_rows(n, grain, f),
            PoolKind::Rayon => {
                let parts = threads.min(n.div_ceil(grain)).max(1);
                self.rayon[threads - 1].install(|| {
                    rayon::scope(|s| {
                        for i in 1..parts {
                            s.spawn(move |_| f(part_range(n, grain, parts, i)));
                        }
                        f(part_range(n, grain, parts, 0));
                    })
                });
            }
        }
    }
}

struct Row {
    name: String,
    tier: Isa,
    threads: usize,
    pool: &'static str,
    us: f64,
    gbs: f64,
    read: Read,
}

fn copies_for(bytes: usize) -> usize {
    // BENCH_HOT=1: one copy, so small shapes stay in cache (measures compute, not memory).
    if std::env::var_os("BENCH_HOT").is_some() {
        return 1;
    }
    WORKING_SET.div_ceil(bytes).clamp(1, 64)
}

fn filter_ok(name: &str) -> bool {
    std::env::var("BENCH_FILTER").map_or(true, |f| name.contains(&f))
}

fn main() {
    let runners = Runners {
        ours: [Pool::new(1), Pool::new(2)],
        rayon: [
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap(),
            rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .unwrap(),
        ],
    };
    let isas = supported_isas();
    println!("{}", bitnet_kernels::isa_report());
    let mut rows: Vec<Row> = Vec::new();
    let mut rng = Rng(0x1234_5678_9abc_def1);

    // --- the multiplier's issue rate, which bounds every I2_S kernel on this host ---
    #[cfg(target_arch = "x86_64")]
    if filter_ok("probe") && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 detected just above.
        let ns = unsafe { common::probe::maddubs_ymm() };
        // The I2_S kernels issue 4 vpmaddubsw (ymm) per 128 weights = 32 bytes per token.
        println!(
            "probe: vpmaddubsw ymm {ns:.3} ns each (10 independent chains, 1 thread) -> \
             I2_S compute bound {:.2} GB/s of weights per core and token",
            32.0 / (4.0 * ns)
        );
    }

    // --- pool dispatch overhead: an (almost) empty job over 640 rows ---
    if filter_ok("dispatch") {
        for threads in [1, 2] {
            for kind in [PoolKind::Ours, PoolKind::Rayon] {
                let sink = std::sync::atomic::AtomicUsize::new(0);
                let t = time_per_call(|_| {
                    runners.run(kind, threads, 640, 8, &|r: Range<usize>| {
                        sink.fetch_add(r.len(), std::sync::atomic::Ordering::Relaxed);
                    })
                });
                println!(
                    "pool dispatch (empty job, 640 rows) {:>5} thr={threads}: {:.2} us",
                    if kind == PoolKind::Ours {
                        "ours"
                    } else {
                        "rayon"
                    },
                    t * 1e6
                );
            }
        }
    }

    // --- ternary I2_S matvec on the 2B-4T shapes (out × in) ---
    for (n_out, k) in [(2560, 2560), (640, 2560), (6912, 2560), (2560, 6912)] {
        let name = format!("I2_S matvec {n_out}x{k}");
        if !filter_ok(&name) {
            continue;
        }
        let bytes = TernaryLayout::I2S.tensor_bytes(n_out, k).unwrap();
        let copies = copies_for(bytes);
        let codes: Vec<u8> = (0..n_out * k).map(|_| (rng.next() % 3) as u8).collect();
        let one = i2s::pack_codes(&codes, 0.5).unwrap();
        let bufs: Vec<Vec<u8>> = (0..copies).map(|_| one.clone()).collect();
        let mats: Vec<TernaryMatrix<'_>> = bufs
            .iter()
            .map(|b| {
                let mut m = TernaryMatrix::new(TernaryLayout::I2S, n_out, k, b, None).unwrap();
                assert_eq!(m.check_codes(), 0);
                m
            })
            .collect();
        let x: Vec<f32> = (0..k)
            .map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let mut q = vec![0i8; k];
        let s = [act::quantize_i8(&x, &mut q)];
        let mut out = vec![0f32; n_out];
        for threads in [1, 2] {
            let read = bandwidth(&bufs, &runners, threads);
            for &isa in &isas {
                for kind in [PoolKind::Ours, PoolKind::Rayon] {
                    if kind == PoolKind::Rayon && isa == Isa::Scalar {
                        continue;
                    }
                    let t = time_per_call(|i| {
                        let m = &mats[i % copies];
                        m.matmul_with_runner(isa, &q, &s, &mut out, &|n, g, f| {
                            runners.run(kind, threads, n, g, f)
                        })
                        .unwrap()
                        .unwrap();
                        black_box(&out);
                    });
                    let r = Row {
                        name: name.clone(),
                        tier: isa,
                        threads,
                        pool: if kind == PoolKind::Ours {
                            "ours"
                        } else {
                            "rayon"
                        },
                        us: t * 1e6,
                        gbs: mats[0].nbytes() as f64 / t / 1e9,
                        read,
                    };
                    print_row(&r);
                    rows.push(r);
                }
            }
        }
    }

    // --- a whole decode pass over the ternary weights: 30 layers × 7 projections ---
    let name = "I2_S decode pass 30 layers".to_owned();
    if filter_ok(&name) {
        let shapes = [
            (2560usize, 2560usize),
            (640, 2560),
            (640, 2560),
            (2560, 2560),
            (6912, 2560),
            (6912, 2560),
            (2560, 6912),
        ];
        let layers = 30;
        let mut bufs: Vec<Vec<u8>> = Vec::new();
        for _ in 0..layers {
            for &(o, i) in &shapes {
                let codes: Vec<u8> = (0..o * i).map(|_| (rng.next() % 3) as u8).collect();
                bufs.push(i2s::pack_codes(&codes, 0.5).unwrap());
            }
        }
        let mats: Vec<TernaryMatrix<'_>> = bufs
            .iter()
            .enumerate()
            .map(|(j, b)| {
                let (o, i) = shapes[j % shapes.len()];
                let mut m = TernaryMatrix::new(TernaryLayout::I2S, o, i, b, None).unwrap();
                assert_eq!(m.check_codes(), 0);
                m
            })
            .collect();
        let total: usize = mats.iter().map(|m| m.nbytes()).sum();
        // The same matrices repacked into panels (what the loader does on tiers with a panel
        // kernel), timed as pool "panels".
        let panel_mats: Vec<TernaryMatrix<'_>> = mats
            .iter()
            .map(|m| {
                let mut m = m.clone();
                m.repack_always(&runners.ours[1]).unwrap();
                m
            })
            .collect();
        let xq: Vec<Vec<i8>> = [2560usize, 6912]
            .iter()
            .map(|&k| {
                (0..k)
                    .map(|j| ((j * 7919 % 255) as i32 - 127) as i8)
                    .collect()
            })
            .collect();
        let mut out = vec![0f32; 6912];
        for threads in [1, 2] {
            // Read baselines over the same 30 × 7 buffers, in the same order.
            let run = |pf: bool| {
                let rt = time_per_call(|_| {
                    for b in &bufs {
                        let runner = |n: usize, g: usize, f: &(dyn Fn(Range<usize>) + Sync)| {
                            runners.run(PoolKind::Ours, threads, n, g, f)
                        };
                        black_box(if pf {
                            read_all::<true>(b, &runner)
                        } else {
                            read_all::<false>(b, &runner)
                        });
                    }
                });
                total as f64 / rt / 1e9
            };
            let read = Read {
                plain: run(false),
                prefetched: run(true),
            };
            for &isa in isas.iter().filter(|&&i| i != Isa::Scalar) {
                let kinds: &[(PoolKind, bool)] = if bitnet_kernels::has_panel_kernel(isa) {
                    &[
                        (PoolKind::Ours, false),
                        (PoolKind::Rayon, false),
                        (PoolKind::Ours, true),
                    ]
                } else {
                    &[(PoolKind::Ours, false), (PoolKind::Rayon, false)]
                };
                for &(kind, panels) in kinds {
                    let set = if panels { &panel_mats } else { &mats };
                    let t = time_per_call(|_| {
                        for m in set {
                            let x = if m.n_in() == 2560 { &xq[0] } else { &xq[1] };
                            m.matmul_with_runner(
                                isa,
                                x,
                                &[1.0],
                                &mut out[..m.n_out()],
                                &|n, g, f| runners.run(kind, threads, n, g, f),
                            )
                            .unwrap()
                            .unwrap();
                        }
                        black_box(&out);
                    });
                    let r = Row {
                        name: name.clone(),
                        tier: isa,
                        threads,
                        pool: match (kind, panels) {
                            (_, true) => "panels",
                            (PoolKind::Ours, _) => "ours",
                            _ => "rayon",
                        },
                        us: t * 1e6,
                        gbs: total as f64 / t / 1e9,
                        read,
                    };
                    print_row(&r);
                    rows.push(r);
                }
            }
        }
    }

    // --- LM head 128256 × 2560, one token ---
    let (v, d) = (128_256usize, 2560usize);
    let f16_bytes: Vec<u8> = (0..v * d)
        .flat_map(|_| {
            half::f16::from_f32(((rng.next() % 2001) as f32 / 1000.0 - 1.0) * 0.05).to_le_bytes()
        })
        .collect();
    let f16m = RowMatrix::new(RowType::F16, v, d, std::borrow::Cow::Borrowed(&f16_bytes)).unwrap();
    let x: Vec<f32> = (0..d)
        .map(|_| (rng.next() % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    let mut logits = vec![0f32; v];
    // (row type, activations quantized to Q8_0 → integer block dots)
    // (row type, activations quantized to Q8_0, tokens): 4 tokens is a batched decode step
    // (the weights are read once for all of them).
    let x4: Vec<f32> = x.iter().cycle().take(4 * d).copied().collect();
    let mut logits4 = vec![0f32; 4 * v];
    for (ty, q8, n_tok) in [
        (RowType::F16, false, 1usize),
        (RowType::F16, false, 4),
        (RowType::Q8_0, false, 1),
        (RowType::Q8_0, true, 1),
        (RowType::Q8_0, true, 4),
    ] {
        let name = format!(
            "LM head {ty:?}{} {v}x{d}{}",
            if q8 { "·q8" } else { "" },
            if n_tok > 1 {
                format!(" x{n_tok}")
            } else {
                String::new()
            }
        );
        if !filter_ok(&name) {
            continue;
        }
        let m = if ty == RowType::F16 {
            f16m.clone()
        } else {
            RowMatrix::quantize_from(&f16m, ty, &runners.ours[1]).unwrap()
        };
        let bufs = [m.data().to_vec()];
        for threads in [1, 2] {
            let read = bandwidth(&bufs, &runners, threads);
            for &isa in &isas {
                let t = time_per_call(|_| {
                    let pool = &runners.ours[threads - 1];
                    let (xx, out) = if n_tok == 1 {
                        (&x[..], &mut logits[..])
                    } else {
                        (&x4[..], &mut logits4[..])
                    };
                    if q8 {
                        m.matmul_q8_on(isa, xx, out, pool)
                    } else {
                        m.matmul_f32_on(isa, xx, out, pool, F16DotOrder::Ggml)
                    }
                    .unwrap()
                    .unwrap();
                    black_box(&out);
                });
                let r = Row {
                    name: name.clone(),
                    tier: isa,
                    threads,
                    pool: "ours",
                    us: t * 1e6,
                    gbs: m.nbytes() as f64 / t / 1e9,
                    read,
                };
                print_row(&r);
                rows.push(r);
            }
        }
    }

    println!(
        "\n=== summary: weight GB/s vs read GB/s of the same bytes (same run); ratio against \
         the better of the plain and the prefetched read ==="
    );
    println!(
        "{:<28} {:>7} {:>3} {:>6} {:>10} {:>8} {:>8} {:>8} {:>6}",
        "kernel", "tier", "thr", "pool", "us/call", "GB/s", "read", "read+pf", "ratio"
    );
    for r in &rows {
        println!(
            "{:<28} {:>7} {:>3} {:>6} {:>10.1} {:>8.2} {:>8.2} {:>8.2} {:>5.0}%",
            r.name,
            r.tier.name(),
            r.threads,
            r.pool,
            r.us,
            r.gbs,
            r.read.plain,
            r.read.prefetched,
            100.0 * r.gbs / r.read.best()
        );
    }
    // Speed-ups of interest.
    let names = [(2560, 2560), (640, 2560), (6912, 2560), (2560, 6912)]
        .iter()
        .map(|(o, k)| format!("I2_S matvec {o}x{k}"))
        .chain(std::iter::once("I2_S decode pass 30 layers".to_owned()));
    for name in names {
        let find = |tier: Isa, thr: usize, pool: &str| {
            rows.iter()
                .find(|r| r.name == name && r.tier == tier && r.threads == thr && r.pool == pool)
                .map(|r| r.us)
        };
        if let (Some(sc), Some(av)) = (find(Isa::Scalar, 1, "ours"), find(Isa::Avx2, 1, "ours")) {
            println!(
                "{name}: avx2 / scalar speed-up (1 thread) = {:.1}x",
                sc / av
            );
        }
        for thr in [1, 2] {
            if let (Some(o), Some(r)) = (
                find(isas[isas.len() - 1], thr, "ours"),
                find(isas[isas.len() - 1], thr, "rayon"),
            ) {
                println!("{name}: {thr} thread(s): ours {o:.1} us, rayon {r:.1} us");
            }
        }
    }
}

/// Read bandwidth over `bufs` at `threads`: (plain read, read with software prefetch), GB/s.
fn bandwidth(bufs: &[Vec<u8>], runners: &Runners, threads: usize) -> Read {
    let bytes = bufs[0].len();
    let run = |pf: bool| {
        let t = time_per_call(|i| {
            let runner = |n: usize, g: usize, f: &(dyn Fn(Range<usize>) + Sync)| {
                runners.run(PoolKind::Ours, threads, n, g, f)
            };
            let b = &bufs[i % bufs.len()];
            black_box(if pf {
                read_all::<true>(b, &runner)
            } else {
                read_all::<false>(b, &runner)
            });
        });
        bytes as f64 / t / 1e9
    };
    Read {
        plain: run(false),
        prefetched: run(true),
    }
}

#[derive(Clone, Copy)]
struct Read {
    plain: f64,
    prefetched: f64,
}

impl Read {
    fn best(self) -> f64 {
        self.plain.max(self.prefetched)
    }
}

fn print_row(r: &Row) {
    println!(
        "{:<28} {:>7} thr={} {:<5} {:>10.1} us  {:>7.2} GB/s  (read {:.2} / prefetched {:.2} GB/s, {:.0}%)",
        r.name,
        r.tier.name(),
        r.threads,
        r.pool,
        r.us,
        r.gbs,
        r.read.plain,
        r.read.prefetched,
        100.0 * r.gbs / r.read.best()
    );
}
