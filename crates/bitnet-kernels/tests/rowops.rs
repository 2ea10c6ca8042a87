//! The element-wise row steps (`rowops`): every tier this CPU supports against the plain
//! twins, bit for bit, over random lengths (ragged tails around every vector width) and
//! values of every kind (subnormal, infinite, NaN, the whole i32 range). A NaN matches any
//! NaN: which operand's payload an instruction passes on is not part of the arithmetic.
#![allow(clippy::unwrap_used, clippy::panic, clippy::cast_possible_truncation)]

mod common;

use bitnet_kernels::{rowops, supported_isas, Isa};
use common::Rng;

/// Any f32 bit pattern one time in four (infinities, NaNs, subnormals included), else a value
/// of ordinary size.
fn any_f32(rng: &mut Rng) -> f32 {
    if rng.below(4) == 0 {
        f32::from_bits(rng.next_u64() as u32)
    } else {
        rng.f32() * 8.0
    }
}

fn lengths(rng: &mut Rng) -> Vec<usize> {
    let mut v: Vec<usize> = (0..=70).collect();
    v.extend([127, 128, 129, 1024, 2560, 3072]);
    v.extend((0..12).map(|_| 71 + rng.below(3000)));
    v
}

fn same32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn same64(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn first_difference(got: &[f32], want: &[f32]) -> Option<usize> {
    got.iter().zip(want).position(|(&a, &b)| !same32(a, b))
}

#[test]
fn scale_row_matches_the_twin_on_every_tier() {
    let isas = supported_isas();
    eprintln!("tiers tested: {isas:?}");
    let mut rng = Rng::new(41);
    for n in lengths(&mut rng) {
        let x: Vec<f32> = (0..n).map(|_| any_f32(&mut rng)).collect();
        let w: Vec<f32> = (0..n).map(|_| any_f32(&mut rng)).collect();
        let s = if rng.below(8) == 0 {
            any_f32(&mut rng)
        } else {
            rng.f32()
        };
        let mut want = vec![0.0f32; n];
        rowops::scale_row_scalar(&x, s, &w, &mut want);
        for (i, want) in want.iter().enumerate() {
            assert!(same32(*want, (x[i] * s) * w[i]), "twin, n {n}");
        }
        for &isa in &isas {
            let mut got = vec![7.0f32; n];
            rowops::scale_row_on(isa, &x, s, &w, &mut got).unwrap();
            if let Some(i) = first_difference(&got, &want) {
                panic!("{isa:?} n {n} at {i}: {} vs {}", got[i], want[i]);
            }
        }
        let mut got = vec![7.0f32; n];
        rowops::scale_row(&x, s, &w, &mut got);
        assert_eq!(first_difference(&got, &want), None, "default tier, n {n}");
    }
}

#[test]
fn gemm_epilogue_matches_the_twin_on_every_tier() {
    let isas = supported_isas();
    let mut rng = Rng::new(43);
    for n in lengths(&mut rng) {
        let wide = rng.below(3) == 0;
        let raw: Vec<i32> = (0..n)
            .map(|_| {
                if wide {
                    rng.next_u64() as i32
                } else {
                    rng.below(1 << 20) as i32 - (1 << 19)
                }
            })
            .collect();
        let b = if wide {
            rng.next_u64() as i32
        } else {
            rng.below(4096) as i32 - 2048
        };
        let s = match rng.below(10) {
            0 => 0.0,
            1 => any_f32(&mut rng),
            _ => rng.f32() * 300.0,
        };
        let beta = rng.f32() * 2.0;
        let mut want = vec![0.0f32; n];
        rowops::panel_out_scalar(&raw, b, s, beta, &mut want);
        for (i, want) in want.iter().enumerate() {
            let t = raw[i].wrapping_sub(b) as f32;
            assert!(same32(*want, (t / s) * beta), "twin, n {n}");
        }
        for &isa in &isas {
            let mut got = vec![7.0f32; n];
            rowops::panel_out_on(isa, &raw, b, s, beta, &mut got).unwrap();
            if let Some(i) = first_difference(&got, &want) {
                panic!("{isa:?} n {n} at {i}: {} vs {}", got[i], want[i]);
            }
        }
    }
}

#[test]
fn missing_tiers_are_refused() {
    for isa in [Isa::Neon, Isa::Avx2, Isa::Avx512, Isa::Simd128] {
        let mut y = [0.0f32; 2];
        assert_eq!(
            rowops::scale_row_on(isa, &[1.0, 2.0], 3.0, &[1.0, 1.0], &mut y).is_some(),
            isa.is_supported(),
            "{isa:?}"
        );
    }
}

/// The definition written out: lane `i mod 8`, in order, then the fixed fold.
fn lanes8_by_hand(x: &[f32]) -> f64 {
    let mut l = [0f64; 8];
    for (i, &v) in x.iter().enumerate() {
        l[i % 8] += f64::from(v * v);
    }
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

#[test]
fn sums_of_squares_match_the_twin_on_every_tier() {
    let isas = supported_isas();
    let mut rng = Rng::new(47);
    let mut widths: Vec<usize> = (1..=40).collect();
    widths.extend([64, 127, 128, 129, 1024, 2048, 3072]);
    widths.extend((0..8).map(|_| 41 + rng.below(3000)));
    for width in widths {
        for rows in [0, 1, 2, 3, 4, 5, 7, 8, 9] {
            let wild = rng.below(3) == 0;
            let x: Vec<f32> = (0..rows * width)
                .map(|_| {
                    if wild {
                        any_f32(&mut rng)
                    } else {
                        rng.f32() * 30.0
                    }
                })
                .collect();
            let want: Vec<f64> = x.chunks_exact(width).map(rowops::sum_sq_lanes8).collect();
            for (row, w) in x.chunks_exact(width).zip(&want) {
                assert!(same64(*w, lanes8_by_hand(row)), "twin, width {width}");
            }
            for &isa in &isas {
                // One spare slot: only `rows` results are written.
                let mut got = vec![-1.0f64; rows + 1];
                rowops::sum_sq_rows_on(isa, &x, width, &mut got).unwrap();
                for (r, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        same64(*g, *w),
                        "{isa:?} width {width} rows {rows} row {r}: {g} vs {w}"
                    );
                }
                assert_eq!(
                    got[rows].to_bits(),
                    (-1.0f64).to_bits(),
                    "{isa:?} wrote past"
                );
            }
        }
    }
    // Rows of no values.
    let mut out = [5.0f64; 2];
    rowops::sum_sq_rows(&[], 0, &mut out);
    assert_eq!(out, [0.0, 0.0]);
}

#[test]
fn int8_sums_match_the_twin_on_every_tier() {
    let isas = supported_isas();
    let mut rng = Rng::new(53);
    for n in lengths(&mut rng).into_iter().chain([100_000]) {
        let extreme = rng.below(3);
        let x: Vec<i8> = (0..n)
            .map(|_| match extreme {
                0 => i8::MIN,
                1 => i8::MAX,
                _ => rng.i8(),
            })
            .collect();
        let want = rowops::sum_i8_scalar(&x);
        let by_hand: i64 = x.iter().map(|&v| i64::from(v)).sum();
        assert_eq!(i64::from(want), by_hand, "twin, n {n}");
        for &isa in &isas {
            assert_eq!(rowops::sum_i8_on(isa, &x), Some(want), "{isa:?} n {n}");
        }
        assert_eq!(rowops::sum_i8(&x), want, "default tier, n {n}");
    }
}
