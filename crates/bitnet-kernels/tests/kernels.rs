//! Every tier the host supports against the scalar reference, and the scalar reference
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]
//! against an independent computation from unpacked values (docs/FORMATS.md §1 formula).

mod common;

use bitnet_kernels::layout::{i2s, qk256, seq32, tq1_0};
use bitnet_kernels::{act, supported_isas, Isa, Pool, TernaryLayout, TernaryMatrix};
use common::Rng;

/// A random weight tensor in `layout`: random code bytes (every code, incl. ones no writer
/// produces), valid random scales. Returns (weights, sibling scales).
fn random_tensor(
    rng: &mut Rng,
    layout: TernaryLayout,
    n_out: usize,
    k: usize,
) -> (Vec<u8>, Option<Vec<u8>>) {
    let bytes = layout.tensor_bytes(n_out, k).unwrap();
    let mut w: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
    let f16 = |rng: &mut Rng| half::f16::from_f32(0.01 + rng.f32().abs()).to_le_bytes();
    let nb = n_out * layout.blocks_per_row(k);
    let mut sib = None;
    match layout {
        TernaryLayout::I2S => {
            let off = n_out * k / 4;
            w[off..off + 4].copy_from_slice(&0.37f32.to_le_bytes());
        }
        TernaryLayout::Tq2_0 => {
            (0..nb).for_each(|b| w[66 * b + 64..66 * b + 66].copy_from_slice(&f16(rng)))
        }
        TernaryLayout::Tq1_0 => {
            (0..nb).for_each(|b| w[54 * b + 52..54 * b + 54].copy_from_slice(&f16(rng)))
        }
        TernaryLayout::BitNet32F16 => {
            (0..nb).for_each(|b| w[10 * b + 8..10 * b + 10].copy_from_slice(&f16(rng)))
        }
        TernaryLayout::Split32WithSibling | TernaryLayout::Qk256 => {
            let s: Vec<u8> = if rng.below(2) == 0 {
                (0..nb)
                    .flat_map(|_| (0.01 + rng.f32().abs()).to_le_bytes())
                    .collect()
            } else {
                (0..nb).flat_map(|_| f16(rng)).collect()
            };
            sib = Some(s);
        }
    }
    (w, sib)
}

fn random_acts(rng: &mut Rng, n_tok: usize, k: usize) -> (Vec<i8>, Vec<f32>) {
    let mut x: Vec<f32> = (0..n_tok * k).map(|_| rng.f32() * 3.0).collect();
    // Some tokens with extreme int8 values (incl. −128, which the quantizer never makes).
    if n_tok > 1 {
        for v in &mut x[..k] {
            *v = if rng.below(2) == 0 { 1.0 } else { -1.0 };
        }
    }
    let mut q = vec![0i8; n_tok * k];
    let mut s = vec![0f32; n_tok];
    act::quantize_rows(&x, k, &mut q, &mut s).unwrap();
    if n_tok > 2 {
        for v in &mut q[2 * k..3 * k] {
            *v = if rng.below(2) == 0 { -128 } else { 127 };
        }
    }
    (q, s)
}

/// Independent reference: unpack values and scales per layout, then docs/FORMATS.md §1.
fn reference(m: &TernaryMatrix<'_>, w: &[u8], sib: Option<&[u8]>, q: &[i8], s: &[f32]) -> Vec<f32> {
    let (n_out, k) = (m.n_out(), m.n_in());
    let layout = m.layout();
    let nbr = layout.blocks_per_row(k);
    let be = match layout {
        TernaryLayout::I2S => k,
        l => l.block_elems(),
    };
    // values[r][j], scale[r][b]
    let mut vals = vec![0i32; n_out * k];
    let mut scale = vec![0f32; n_out * nbr];
    let rb = layout.row_bytes(k);
    let ext = |i: usize| -> f32 {
        let sb = sib.unwrap();
        if sb.len() == 4 * n_out * nbr {
            f32::from_le_bytes(sb[4 * i..4 * i + 4].try_into().unwrap())
        } else {
            half::f16::from_le_bytes(sb[2 * i..2 * i + 2].try_into().unwrap()).to_f32()
        }
    };
    for r in 0..n_out {
        let row = &w[r * rb..(r + 1) * rb];
        for j in 0..k {
            vals[r * k + j] = match layout {
                TernaryLayout::I2S => i32::from(i2s::value_of_code(i2s::code(row, j))),
                TernaryLayout::Tq2_0 => {
                    i32::from(bitnet_kernels::layout::tq2_0::code(
                        &row[66 * (j / 256)..],
                        j % 256,
                    )) - 1
                }
                TernaryLayout::Tq1_0 => i32::from(tq1_0::code(&row[54 * (j / 256)..], j % 256)) - 1,
                TernaryLayout::BitNet32F16 => i32::from(seq32::value_of_code(seq32::code(
                    &row[10 * (j / 32)..],
                    j % 32,
                ))),
                TernaryLayout::Split32WithSibling => i32::from(seq32::value_of_code(seq32::code(
                    &row[8 * (j / 32)..],
                    j % 32,
                ))),
                TernaryLayout::Qk256 => i32::from(qk256::LUT[usize::from(qk256::code(row, j))]),
            };
        }
        for b in 0..nbr {
            scale[r * nbr + b] = match layout {
                TernaryLayout::I2S => m.tensor_scale().unwrap(),
                TernaryLayout::Tq2_0 => {
                    half::f16::from_le_bytes([row[66 * b + 64], row[66 * b + 65]]).to_f32()
                }
                TernaryLayout::Tq1_0 => {
                    half::f16::from_le_bytes([row[54 * b + 52], row[54 * b + 53]]).to_f32()
                }
                TernaryLayout::BitNet32F16 => {
                    half::f16::from_le_bytes([row[10 * b + 8], row[10 * b + 9]]).to_f32()
                }
                TernaryLayout::Split32WithSibling => ext(r * nbr + b),
                TernaryLayout::Qk256 => sib.map_or(1.0, |_| ext(r * nbr + b)),
            };
        }
    }
    let n_tok = s.len();
    let mut out = vec![0f32; n_tok * n_out];
    for t in 0..n_tok {
        let x = &q[t * k..(t + 1) * k];
        for r in 0..n_out {
            let v = &vals[r * k..(r + 1) * k];
            let sc = &scale[r * nbr..(r + 1) * nbr];
            // A TQ2_0, TQ1_0, BitNet32F16 or Split32 row whose blocks all carry one scale
            // takes I2_S's steps.
            let one_scale = !matches!(layout, TernaryLayout::I2S | TernaryLayout::Qk256)
                && sc.iter().all(|d| d.to_bits() == sc[0].to_bits());
            out[t * n_out + r] = if layout == TernaryLayout::I2S || one_scale {
                let tt: i32 = v.iter().zip(x).map(|(&a, &b)| a * i32::from(b)).sum();
                (tt as f32 / s[t]) * scale[r * nbr]
            } else {
                let mut acc = 0f32;
                for b in 0..nbr {
                    let e = ((b + 1) * be).min(k);
                    let tb: i32 = (b * be..e).map(|j| v[j] * i32::from(x[j])).sum();
                    acc += tb as f32 * scale[r * nbr + b];
                }
                acc / s[t]
            };
        }
    }
    out
}

fn shapes(layout: TernaryLayout, rng: &mut Rng) -> Vec<(usize, usize)> {
    let km = layout.k_multiple().max(1);
    // 150 rows: more than one row block of the multi-token loop, with a ragged last block.
    let mut v = vec![
        (1, km.max(128)),
        (13, 2 * km.max(128)),
        (37, 512),
        (150, km.max(128)),
        // 17 blocks of 128: a ragged last group of the 4 blocks that an i16 sum may hold
        // (the simd128 tier).
        (3, 17 * km.max(128)),
    ];
    for _ in 0..6 {
        let n_out = 1 + rng.below(70);
        let k = match layout {
            // QK256 and the 32-blocks allow K not a multiple of 256.
            TernaryLayout::Qk256 => 1 + rng.below(900),
            TernaryLayout::Split32WithSibling | TernaryLayout::BitNet32F16 => {
                32 * (1 + rng.below(30))
            }
            _ => km * (1 + rng.below(6)),
        };
        v.push((n_out, k));
    }
    v
}

#[test]
fn every_tier_matches_scalar_and_reference() {
    let mut rng = Rng::new(7);
    let pools = [Pool::new(1), Pool::new(2), Pool::new(3)];
    let isas = supported_isas();
    eprintln!("tiers tested: {isas:?}");
    for layout in TernaryLayout::ALL {
        for (n_out, k) in shapes(layout, &mut rng) {
            let (w, sib) = random_tensor(&mut rng, layout, n_out, k);
            let m = TernaryMatrix::new(layout, n_out, k, &w, sib.as_deref()).unwrap();
            // Repacked into panels too (I2_S, and the block layouts with their scales apart).
            let mut packed = m.clone();
            packed.repack_always(&pools[0]).unwrap();
            for n_tok in [1usize, 2, 3, 4, 5, 9] {
                let (q, s) = random_acts(&mut rng, n_tok, k);
                let want = reference(&m, &w, sib.as_deref(), &q, &s);
                for &isa in &isas {
                    for pool in &pools {
                        for (mat, what) in [(&m, "as stored"), (&packed, "repacked")] {
                            let mut out = vec![f32::NAN; n_tok * n_out];
                            mat.matmul_on(isa, &q, &s, &mut out, pool).unwrap().unwrap();
                            for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                                assert_eq!(
                                    a.to_bits(),
                                    b.to_bits(),
                                    "{layout:?} {what} {n_out}x{k} n_tok {n_tok} {isa:?} \
                                     threads {} idx {i}: {a} vs {b}",
                                    pool.n_threads()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A matrix over a copy of its packed bytes (the low-memory reader's buffers) computes the
/// same bits as the original; a copy of another length is refused; a different copy gives
/// other results (the copy is what is read).
#[test]
fn a_matrix_over_a_copy_of_its_bytes_is_the_same_matrix() {
    let mut rng = Rng::new(31);
    let pool = Pool::new(2);
    for layout in TernaryLayout::ALL {
        let (n_out, k) = shapes(layout, &mut rng)[0];
        let (w, sib) = random_tensor(&mut rng, layout, n_out, k);
        let m = TernaryMatrix::new(layout, n_out, k, &w, sib.as_deref()).unwrap();
        let (q, s) = random_acts(&mut rng, 3, k);
        let run = |m: &TernaryMatrix<'_>| {
            let mut out = vec![f32::NAN; 3 * n_out];
            m.matmul(&q, &s, &mut out, &pool).unwrap();
            out
        };
        let want = run(&m);
        let mut copy = m.packed_data().to_vec();
        let same = run(&m.with_packed(&copy).unwrap());
        assert!(
            same.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{layout:?}"
        );
        assert!(m.with_packed(&copy[1..]).is_err(), "{layout:?}");
        for b in copy.iter_mut() {
            *b = !*b;
        }
        assert_ne!(run(&m.with_packed(&copy).unwrap()), want, "{layout:?}");
    }
}

#[test]
fn default_tier_is_used_and_reported() {
    let r = bitnet_kernels::isa_report();
    eprintln!("{r}");
    assert!(r.contains(bitnet_kernels::isa().name()), "{r}");
    assert!(supported_isas().contains(&Isa::Scalar));
}

#[test]
fn matmul_rejects_bad_shapes() {
    let w = i2s::pack_values(&vec![1i8; 128 * 2], 1.0).unwrap();
    let m = TernaryMatrix::new(TernaryLayout::I2S, 2, 128, &w, None).unwrap();
    let pool = Pool::new(1);
    let mut out = vec![0f32; 2];
    assert!(m.matmul(&[0i8; 127], &[1.0], &mut out, &pool).is_err());
    assert!(m.matmul(&[0i8; 128], &[1.0], &mut out[..1], &pool).is_err());
    assert!(m.matmul(&[0i8; 128], &[1.0], &mut out, &pool).is_ok());
}

#[test]
fn quantize_ties_round_to_even() {
    // m = 127 → s = (f32)(127/127) = 1 exactly, so q = round_half_even(x).
    let x = [127.0f32, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5];
    let mut q = [0i8; 9];
    let s = act::quantize_i8(&x, &mut q);
    assert_eq!(s, 1.0);
    assert_eq!(q, [127, 0, 2, 2, 0, -2, -2, 4, 126]);
}

#[test]
fn quantize_absmax_floor_and_zero_rows() {
    // Every |x| below 1e-5: m = 1e-5, s = (f32)(127 / 1e-5) = 12 700 000 (exact in f32).
    let x = [2.0f32.powi(-20), -(2.0f32.powi(-19)), 0.0];
    let mut q = [0i8; 3];
    let s = act::quantize_i8(&x, &mut q);
    assert_eq!(s, 12_700_000.0);
    // 2^-20 · 12.7e6 = 12.11… → 12; −2^-19 · 12.7e6 = −24.22… → −24.
    assert_eq!(q, [12, -24, 0]);
    let mut q = [5i8; 4];
    let s = act::quantize_i8(&[0.0; 4], &mut q);
    assert_eq!(s, 12_700_000.0);
    assert_eq!(q, [0; 4]);
}

#[test]
fn quantize_scale_is_f64_division_rounded() {
    // m = 3: 127/3 = 42.333… in f64, rounded to f32 = 42.333332.
    let mut q = [0i8; 2];
    let s = act::quantize_i8(&[3.0, -1.0], &mut q);
    assert_eq!(s, 42.333_332f32);
    assert_eq!(q, [127, -42]);
    // Clamp: values outside ±127 after scaling (only for caller-chosen scales).
    assert_eq!(act::quantize_one(200.0, 1.0), 127);
    assert_eq!(act::quantize_one(-200.0, 1.0), -128);
    assert_eq!(act::quantize_one(f32::NAN, 1.0), 0);
}

#[test]
fn i2s_checked_clean_path_matches_reference() {
    let mut rng = Rng::new(8);
    let pools = [Pool::new(1), Pool::new(2)];
    for (n_out, k) in [(1usize, 128usize), (37, 640), (64, 2560), (9, 384)] {
        let v: Vec<i8> = (0..n_out * k).map(|_| rng.ternary()).collect();
        let w = i2s::pack_values(&v, 0.25).unwrap();
        let mut m = TernaryMatrix::new(TernaryLayout::I2S, n_out, k, &w, None).unwrap();
        assert!(!m.codes_checked_clean());
        assert_eq!(m.check_codes(), 0);
        assert!(m.codes_checked_clean());
        for n_tok in [1usize, 3, 4, 6, 7] {
            let (q, s) = random_acts(&mut rng, n_tok, k);
            let want = reference(&m, &w, None, &q, &s);
            for isa in supported_isas() {
                for pool in &pools {
                    let mut out = vec![f32::NAN; n_tok * n_out];
                    m.matmul_on(isa, &q, &s, &mut out, pool).unwrap().unwrap();
                    assert!(out
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                }
            }
        }
    }
    // A tensor with a code 11 stays on the checking kernel.
    let mut w = i2s::pack_values(&[0i8; 128], 1.0).unwrap();
    w[5] = 0xFF;
    let mut m = TernaryMatrix::new(TernaryLayout::I2S, 1, 128, &w, None).unwrap();
    assert_eq!(m.check_codes(), 4);
    assert!(!m.codes_checked_clean());
}
