//! The I2_S matmul at 1, 4, 16 and 128 tokens on every tier this CPU has, on the file's
//! layout and on the repacked panels: `cargo bench -p bitnet-kernels --bench gemm`.
//!
//! Variants run interleaved, round by round, and each reports the median of its rounds, so a
//! change in the machine's speed during the run hits them alike. Ratios are against the
//! selected tier on the file's layout (the path before panels existed). The last column is the
//! multiply-add rate in int8 MACs per ns (2.1 G per token for the 2B model's projections), and
//! the share of the tier's multiplier peak that rate is: before the table, a probe times the
//! multiply instruction each tier's panel kernel is built on (`vpmaddubsw` ymm for the AVX2 and
//! AVX-512 tiers, `vpdpbusd` ymm for AVX-VNNI, `vpdpbusd` zmm for AVX-512 VNNI) in independent
//! chains, on one thread and on every thread at once, so that figure is the instruction's issue
//! rate on this host, measured. The AMX tier's is `tdpbsud` (16 × 16 × 64 multiply-adds per
//! instruction, four independent accumulator tiles).
//!
//! Env: `BENCH_QUICK=1` fewer rounds; `BENCH_FILTER=substring` only matching shapes;
//! `BENCH_THREADS=1,2` thread counts; `BENCH_TOKENS=16,128` token counts.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss
)]

use std::time::Instant;

use bitnet_kernels::{isa, supported_isas, Isa, Pool, TernaryLayout, TernaryMatrix};

mod common;
use common::{bytes, probe, tensor};

struct Variant<'a> {
    name: String,
    isa: Isa,
    m: &'a TernaryMatrix<'a>,
    times: Vec<f64>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The multiply instruction `isa`'s panel kernel is built on, and its int8 multiply-adds.
fn multiplier(isa: Isa) -> Option<(&'static str, f64)> {
    match isa {
        Isa::Avx2 | Isa::Avx2Lut | Isa::Avx512 => Some(("vpmaddubsw ymm", 32.0)),
        Isa::AvxVnni => Some(("vpdpbusd ymm", 32.0)),
        Isa::Avx512Vnni => Some(("vpdpbusd zmm", 64.0)),
        Isa::Amx => Some(("tdpbsud", 16.0 * 16.0 * 64.0)),
        _ => None,
    }
}

/// Peak int8 multiply-adds per ns of `isa`'s multiplier with `threads` threads running the
/// probe at once (the sum of their rates).
#[cfg(target_arch = "x86_64")]
fn peak_macs(isa: Isa, threads: usize) -> Option<f64> {
    let (_, macs) = multiplier(isa)?;
    let run = move || -> f64 {
        if isa == Isa::Amx {
            return bitnet_kernels::amx_probe_ns().unwrap_or(f64::NAN);
        }
        // SAFETY: `isa` is a tier the CPU has (the caller takes it from `supported_isas`),
        // and its features include the probe's.
        unsafe {
            match isa {
                Isa::Avx512Vnni => probe::dpbusd_zmm(),
                Isa::AvxVnni => probe::dpbusd_ymm(),
                _ => probe::maddubs_ymm(),
            }
        }
    };
    let ns: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads).map(|_| s.spawn(run)).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    Some(ns.iter().map(|n| macs / n).sum())
}

#[cfg(not(target_arch = "x86_64"))]
fn peak_macs(_: Isa, _: usize) -> Option<f64> {
    None
}

fn main() {
    let quick = std::env::var("BENCH_QUICK").is_ok();
    let filter = std::env::var("BENCH_FILTER").ok();
    let threads: Vec<usize> = std::env::var("BENCH_THREADS")
        .ok()
        .map(|s| s.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2]);
    let token_counts: Vec<usize> = std::env::var("BENCH_TOKENS")
        .ok()
        .map(|s| s.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 4, 16, 128]);
    let rounds = if quick { 5 } else { 11 };
    println!(
        "selected tier: {}; tiers: {:?}",
        isa().name(),
        supported_isas()
    );
    // The multipliers' peaks (each probed once), per thread count.
    let mut peaks: Vec<(&str, usize, f64)> = Vec::new();
    for t in supported_isas() {
        let Some((name, _)) = multiplier(t) else {
            continue;
        };
        for &thr in &threads {
            if peaks.iter().any(|&(m, n, _)| m == name && n == thr) {
                continue;
            }
            if let Some(p) = peak_macs(t, thr) {
                println!("peak: {name:<14} {thr} thread(s): {p:>7.1} int8 MAC/ns");
                peaks.push((name, thr, p));
            }
        }
    }
    let peak_of = |t: Isa, thr: usize| {
        let name = multiplier(t).map(|m| m.0);
        peaks
            .iter()
            .find(|&&(m, n, _)| Some(m) == name && n == thr)
            .map_or(f64::NAN, |p| p.2)
    };
    println!(
        "{:<22} {:>4} {:>3} {:<22} {:>10} {:>7} {:>8} {:>6}",
        "shape", "tok", "thr", "variant", "µs/call", "ratio", "MAC/ns", "peak"
    );
    for (n_out, k) in [(2560usize, 2560usize), (6912, 2560), (2560, 6912)] {
        let shape = format!("I2_S {n_out}x{k}");
        if filter.as_ref().is_some_and(|f| !shape.contains(f.as_str())) {
            continue;
        }
        let (w, _) = tensor(TernaryLayout::I2S, n_out, k);
        let plain = TernaryMatrix::new(TernaryLayout::I2S, n_out, k, &w, None).unwrap();
        let mut panels = plain.clone();
        panels.repack_always(&Pool::new(2)).unwrap();
        for &thr in &threads {
            let pool = Pool::new(thr);
            for &n_tok in &token_counts {
                let x: Vec<i8> = bytes(n_tok * k, 11)
                    .into_iter()
                    .map(|b| i8::from_le_bytes([b]))
                    .collect();
                let s = vec![3.0f32; n_tok];
                let mut out = vec![0f32; n_tok * n_out];
                let mut vars: Vec<Variant<'_>> = Vec::new();
                for t in supported_isas() {
                    vars.push(Variant {
                        name: format!("{} file layout", t.name()),
                        isa: t,
                        m: &plain,
                        times: Vec::new(),
                    });
                }
                for t in supported_isas() {
                    if bitnet_kernels::has_panel_kernel(t) {
                        vars.push(Variant {
                            name: format!("{} panels", t.name()),
                            isa: t,
                            m: &panels,
                            times: Vec::new(),
                        });
                    }
                }
                // The scalar tier takes seconds at 128 tokens; keep it to the small counts.
                vars.retain(|v| v.isa != Isa::Scalar || n_tok <= 4);
                // Calls per sample: about 20 ms of work for the selected tier.
                let t = Instant::now();
                plain.matmul(&x, &s, &mut out, &pool).unwrap();
                let one = t.elapsed().as_secs_f64().max(1e-6);
                let reps = ((0.02 / one) as usize).clamp(1, 2000);
                for _ in 0..rounds {
                    for v in &mut vars {
                        let reps = if v.isa == Isa::Scalar { 1 } else { reps };
                        v.m.matmul_on(v.isa, &x, &s, &mut out, &pool)
                            .unwrap()
                            .unwrap();
                        let t = Instant::now();
                        for _ in 0..reps {
                            v.m.matmul_on(v.isa, &x, &s, &mut out, &pool)
                                .unwrap()
                                .unwrap();
                        }
                        v.times.push(t.elapsed().as_secs_f64() / reps as f64);
                    }
                }
                let base = vars
                    .iter_mut()
                    .find(|v| v.isa == isa() && std::ptr::eq(v.m, &plain))
                    .map(|v| median(&mut v.times.clone()))
                    .unwrap_or(f64::NAN);
                let macs = (n_out * k * n_tok) as f64;
                for v in &mut vars {
                    let m = median(&mut v.times);
                    let rate = macs / (m * 1e9);
                    let share = 100.0 * rate / peak_of(v.isa, thr);
                    let share = if share.is_finite() {
                        format!("{share:>5.0}%")
                    } else {
                        format!("{:>6}", "-")
                    };
                    println!(
                        "{:<22} {:>4} {:>3} {:<22} {:>10.1} {:>6.2}x {:>8.1} {share}",
                        shape,
                        n_tok,
                        thr,
                        v.name,
                        m * 1e6,
                        base / m,
                        rate,
                    );
                }
            }
        }
    }
}
