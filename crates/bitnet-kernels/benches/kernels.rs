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

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// A random tensor with valid scales (codes random, scales 0.5).
fn tensor(layout: TernaryLayout, n_out: usize, k: usize) -> (Vec<u8>, Option<Vec<u8>>) {
    let mut w = bytes(layout.tensor_bytes(n_out, k).unwrap(), 7);
    let nb = n_out * layout.blocks_per_row(k);
    let half = half::f16::from_f32(0.5).to_le_bytes();
    let mut sib = None;
    match layout {
        TernaryLayout::I2S => {
            let o = n_out * k / 4;
            w[o..o + 4].copy_from_slice(&0.5f32.to_le_bytes());
            // Valid codes only (no 11), as bitnet.cpp writes them.
            for b in &mut w[..o] {
                *b = bitnet_kernels::layout::i2s::sanitize_byte(*b);
            }
        }
        TernaryLayout::Tq2_0 => {
            (0..nb).for_each(|b| w[66 * b + 64..66 * b + 66].copy_from_slice(&half))
        }
        TernaryLayout::Tq1_0 => {
            (0..nb).for_each(|b| w[54 * b + 52..54 * b + 54].copy_from_slice(&half))
        }
        TernaryLayout::BitNet32F16 => {
            (0..nb).for_each(|b| w[10 * b + 8..10 * b + 10].copy_from_slice(&half))
        }
        TernaryLayout::Split32WithSibling | TernaryLayout::Qk256 => {
            sib = Some((0..nb).flat_map(|_| 0.5f32.to_le_bytes()).collect());
        }
    }
    (w, sib)
}

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
