//! Criterion micro-benchmarks of every kernel on the selected tier, one thread:
//! `cargo bench -p bitnet-kernels --bench kernels`. Throughput is in weight bytes.
//! (`benches/matvec.rs` is the streaming benchmark with memory-bandwidth ratios.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

use std::borrow::Cow;
use std::hint::black_box;

use bitnet_kernels::{act, isa, Pool, RowMatrix, RowType, TernaryLayout, TernaryMatrix};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

mod common;
use common::tensor;

fn ternary(c: &mut Criterion) {
    let pool = Pool::new(1);
    let (n_out, k) = (2560, 2560);
    let mut g = c.benchmark_group(format!("ternary {n_out}x{k} {}", isa().name()));
    for layout in TernaryLayout::ALL {
        let (w, sib) = tensor(layout, n_out, k);
        let mut m = TernaryMatrix::new(layout, n_out, k, &w, sib.as_deref()).unwrap();
        m.check_codes();
        g.throughput(Throughput::Bytes(m.nbytes() as u64));
        for n_tok in [1usize, 8] {
            let x: Vec<f32> = (0..n_tok * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let mut q = vec![0i8; n_tok * k];
            let mut s = vec![0f32; n_tok];
            act::quantize_rows(&x, k, &mut q, &mut s).unwrap();
            let mut out = vec![0f32; n_tok * n_out];
            g.bench_function(format!("{layout:?} n_tok={n_tok}"), |b| {
                b.iter(|| {
                    m.matmul(&q, &s, &mut out, &pool).unwrap();
                    black_box(&out);
                })
            });
        }
    }
    g.finish();
}

fn rows(c: &mut Criterion) {
    let pool = Pool::new(1);
    let (rows, cols) = (1024, 2560); // 5 MiB of F16: cache-resident on most CPUs
    let f16: Vec<u8> = (0..rows * cols)
        .flat_map(|i| half::f16::from_f32(((i * 31 % 97) as f32 - 48.0) / 480.0).to_le_bytes())
        .collect();
    let src = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&f16)).unwrap();
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 13 % 89) as f32 - 44.0) / 44.0)
        .collect();
    let mut out = vec![0f32; rows];
    let mut g = c.benchmark_group(format!("row dot {rows}x{cols} {}", isa().name()));
    for ty in [
        RowType::F16,
        RowType::Q8_0,
        RowType::Q6K,
        RowType::Q4_0,
        RowType::BF16,
    ] {
        let m = if ty == RowType::F16 {
            src.clone()
        } else {
            RowMatrix::quantize_from(&src, ty, &pool).unwrap()
        };
        g.throughput(Throughput::Bytes(m.nbytes() as u64));
        g.bench_function(format!("{ty:?}"), |b| {
            b.iter(|| {
                m.matmul_f32(&x, &mut out, &pool).unwrap();
                black_box(&out);
            })
        });
    }
    g.finish();
    c.bench_function("act::quantize_i8 2560", |b| {
        let mut q = vec![0i8; cols];
        b.iter(|| black_box(act::quantize_i8(&x, &mut q)))
    });
    // The portable twin, for the SIMD speed-up.
    c.bench_function("act::quantize_i8_scalar 2560", |b| {
        let mut q = vec![0i8; cols];
        b.iter(|| black_box(act::quantize_i8_scalar(&x, &mut q)))
    });
}

criterion_group!(benches, ternary, rows);
criterion_main!(benches);
