//! Row formats: dequantization against hand-built blocks, every tier's dots against the
//! scalar order (bit-identical) and against f64 (stated bound), quantizers' error bounds.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

mod common;

use std::borrow::Cow;

use bitnet_kernels::rows::{dequantize_row_bytes, quantize_row_into};
use bitnet_kernels::{supported_isas, F16DotOrder, Isa, Pool, RowMatrix, RowType};
use common::Rng;

fn f16b(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

#[test]
fn q8_0_block_by_hand() {
    let mut blk = Vec::new();
    blk.extend_from_slice(&f16b(0.5));
    blk.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let mut out = [0f32; 32];
    dequantize_row_bytes(RowType::Q8_0, &blk, &mut out);
    for (i, &o) in out.iter().enumerate() {
        assert_eq!(o, 0.5 * (i as f32 - 16.0));
    }
}

#[test]
fn q4_0_block_by_hand() {
    let mut blk = Vec::new();
    blk.extend_from_slice(&f16b(0.25));
    // byte j: low nibble = element j, high nibble = element j + 16.
    blk.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let mut out = [0f32; 32];
    dequantize_row_bytes(RowType::Q4_0, &blk, &mut out);
    for j in 0..16 {
        assert_eq!(out[j], 0.25 * (j as f32 - 8.0));
        assert_eq!(out[j + 16], 0.25 * ((15 - j) as f32 - 8.0));
    }
}

/// A NaN in a block of the Q8_0 or Q4_0 quantizer (the KV cache's, and the activations' of
/// the integer dots) stays a NaN: that block's scale is NaN and all it decodes to is NaN,
/// while the other blocks are untouched. An infinity decodes to NaN too (its scale is ∞ and
/// its codes 0).
#[test]
fn q8_0_and_q4_0_keep_a_nan_and_an_infinity_non_finite() {
    let mut rng = Rng::new(21);
    for ty in [RowType::Q8_0, RowType::Q4_0] {
        for bad in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0usize, 31, 32, 63, 95] {
                let mut x: Vec<f32> = (0..96).map(|_| rng.f32() * 3.0).collect();
                x[at] = bad;
                let mut enc = vec![0u8; ty.row_bytes(96).unwrap()];
                quantize_row_into(ty, &x, &mut enc);
                let mut out = vec![0f32; 96];
                dequantize_row_bytes(ty, &enc, &mut out);
                for (i, o) in out.iter().enumerate() {
                    assert_eq!(
                        o.is_finite(),
                        i / 32 != at / 32,
                        "{ty:?} {bad} at {at}: element {i} decodes to {o}"
                    );
                }
            }
        }
    }
}

#[test]
fn q6_k_block_by_hand() {
    // Levels L (0..64) placed per the ggml layout, written here element by element:
    // element 128h + 32g + l (g = 0..4, l = 0..32): low 4 bits in ql[64h + l + 32(g&1)]
    // (high nibble if g >= 2), high 2 bits in qh[32h + l] at bits 2g; scale index
    // 8h + l/16 + 2g; w = (d · scale) · (L − 32).
    let mut rng = Rng::new(9);
    let levels: Vec<u8> = (0..256).map(|_| rng.below(64) as u8).collect();
    let scales: Vec<i8> = (0..16).map(|i| (i as i8) * 7 - 50).collect();
    let mut b = vec![0u8; 210];
    for h in 0..2 {
        for g in 0..4 {
            for l in 0..32 {
                let lv = levels[128 * h + 32 * g + l];
                let qi = 64 * h + l + 32 * (g & 1);
                b[qi] |= if g >= 2 { (lv & 15) << 4 } else { lv & 15 };
                b[128 + 32 * h + l] |= (lv >> 4) << (2 * g);
            }
        }
    }
    for (i, &s) in scales.iter().enumerate() {
        b[192 + i] = s as u8;
    }
    b[208..210].copy_from_slice(&f16b(0.125));
    let mut out = [0f32; 256];
    dequantize_row_bytes(RowType::Q6K, &b, &mut out);
    for h in 0..2 {
        for g in 0..4 {
            for l in 0..32 {
                let e = 128 * h + 32 * g + l;
                let sc = f32::from(scales[8 * h + l / 16 + 2 * g]);
                let want = (0.125 * sc) * (f32::from(levels[e]) - 32.0);
                assert_eq!(out[e], want, "element {e}");
            }
        }
    }
}

#[test]
fn quantizers_error_bounds() {
    let mut rng = Rng::new(10);
    let x: Vec<f32> = (0..512).map(|_| rng.f32() * 0.7).collect();
    for (ty, bound_in_d) in [
        (RowType::Q8_0, 0.5),
        (RowType::Q4_0, 1.0),
        (RowType::Q6K, 0.0),
    ] {
        let mut enc = vec![0u8; ty.row_bytes(512).unwrap()];
        quantize_row_into(ty, &x, &mut enc);
        let mut dec = vec![0f32; 512];
        dequantize_row_bytes(ty, &enc, &mut dec);
        let be = ty.block_elems();
        for (blk, (xb, db)) in x.chunks(be).zip(dec.chunks(be)).enumerate() {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let max_err = xb
                .iter()
                .zip(db)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            let limit = match ty {
                // d = amax/127: rounding gives d/2; d is stored as f16 (relative error
                // ≤ 2^-11) and multiplies |q| ≤ 127.
                RowType::Q8_0 => (bound_in_d + 127.0 / 2048.0) * amax / 127.0 * 1.001 + 1e-7,
                // d = amax/8: rounding and the clamp at 15 give d; f16 d times |q| ≤ 8.
                RowType::Q4_0 => (bound_in_d + 8.0 / 2048.0) * amax / 8.0 * 1.001 + 1e-7,
                // 6-bit levels: a few percent of the block max.
                _ => amax * 0.05,
            };
            assert!(
                max_err <= limit,
                "{ty:?} block {blk}: err {max_err} > {limit}"
            );
        }
    }
    // All-zero input encodes to zeros.
    for ty in [RowType::Q8_0, RowType::Q4_0, RowType::Q6K] {
        let mut enc = vec![0u8; ty.row_bytes(256).unwrap()];
        quantize_row_into(ty, &[0.0; 256], &mut enc);
        let mut dec = vec![1f32; 256];
        dequantize_row_bytes(ty, &enc, &mut dec);
        assert!(dec.iter().all(|&v| v == 0.0), "{ty:?}");
    }
}

fn random_rows(rng: &mut Rng, ty: RowType, rows: usize, cols: usize) -> Vec<u8> {
    let x: Vec<f32> = (0..rows * cols).map(|_| rng.f32()).collect();
    let rb = ty.row_bytes(cols).unwrap();
    let mut out = vec![0u8; rows * rb];
    for r in 0..rows {
        quantize_row_into(
            ty,
            &x[r * cols..(r + 1) * cols],
            &mut out[r * rb..(r + 1) * rb],
        );
    }
    out
}

#[test]
fn row_dots_every_tier_matches_scalar_and_f64() {
    let mut rng = Rng::new(11);
    let pools = [Pool::new(1), Pool::new(2)];
    let types = [
        RowType::F32,
        RowType::F16,
        RowType::BF16,
        RowType::Q8_0,
        RowType::Q6K,
        RowType::Q4_0,
    ];
    for ty in types {
        for _ in 0..6 {
            let rows = 1 + rng.below(40);
            let be = ty.block_elems().max(1);
            let cols = match ty {
                RowType::F32 | RowType::F16 | RowType::BF16 => 1 + rng.below(300),
                _ => be * (1 + rng.below(4)),
            };
            let data = random_rows(&mut rng, ty, rows, cols);
            let m = RowMatrix::new(ty, rows, cols, Cow::Borrowed(&data)).unwrap();
            for n_tok in [1usize, 3, 4, 11] {
                let x: Vec<f32> = (0..n_tok * cols).map(|_| rng.f32()).collect();
                for order in [F16DotOrder::Auto, F16DotOrder::Ggml, F16DotOrder::Lanes8] {
                    let mut want = vec![0f32; n_tok * rows];
                    m.matmul_f32_on(bitnet_kernels::Isa::Scalar, &x, &mut want, &pools[0], order)
                        .unwrap()
                        .unwrap();
                    // Scalar against f64 with dequantized rows: |Δ| ≤ 2·cols·ε·Σ|w·x|.
                    let mut w = vec![0f32; cols];
                    for r in 0..rows {
                        m.dequantize_row(r, &mut w).unwrap();
                        for t in 0..n_tok {
                            let xt = &x[t * cols..(t + 1) * cols];
                            let exact: f64 = w
                                .iter()
                                .zip(xt)
                                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                                .sum();
                            let mag: f64 = w
                                .iter()
                                .zip(xt)
                                .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                                .sum();
                            let got = f64::from(want[t * rows + r]);
                            let bound = 2.0 * cols as f64 * f64::from(f32::EPSILON) * mag + 1e-30;
                            assert!(
                                (got - exact).abs() <= bound,
                                "{ty:?} {rows}x{cols}: {got} vs {exact}"
                            );
                        }
                    }
                    for isa in supported_isas() {
                        for pool in &pools {
                            let mut got = vec![f32::NAN; n_tok * rows];
                            m.matmul_f32_on(isa, &x, &mut got, pool, order)
                                .unwrap()
                                .unwrap();
                            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                                assert_eq!(
                                    a.to_bits(),
                                    b.to_bits(),
                                    "{ty:?} {rows}x{cols} {isa:?} {order:?} idx {i}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The release hook sees every source row exactly once, in runs of at most `RELEASE_ROWS`
/// whole rows, each after its rows were converted; the result equals `quantize_from`'s.
#[test]
fn quantize_from_releasing_hands_back_each_row_once() {
    use bitnet_kernels::rows::RELEASE_ROWS;
    let mut rng = Rng::new(13);
    let cols = 64;
    let row_bytes = RowType::F16.row_bytes(cols).unwrap();
    for (rows, threads) in [
        (1usize, 1usize),
        (255, 2),
        (256, 2),
        (1000, 3),
        (2 * RELEASE_ROWS + 7, 2),
    ] {
        let data = random_rows(&mut rng, RowType::F16, rows, cols);
        let src = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&data)).unwrap();
        let pool = Pool::new(threads);
        let seen = std::sync::Mutex::new(Vec::new());
        let base = data.as_ptr().addr();
        let q = RowMatrix::quantize_from_releasing(&src, RowType::Q8_0, &pool, &|b| {
            let start = b.as_ptr().addr() - base;
            assert_eq!(start % row_bytes, 0);
            assert_eq!(b.len() % row_bytes, 0);
            assert!(b.len() / row_bytes <= RELEASE_ROWS);
            seen.lock()
                .unwrap()
                .push(start / row_bytes..(start + b.len()) / row_bytes);
        })
        .unwrap();
        let mut runs = seen.into_inner().unwrap();
        runs.sort_by_key(|r| r.start);
        let mut next = 0;
        for r in &runs {
            assert_eq!(r.start, next, "rows {rows}: runs {runs:?}");
            assert!(r.end > r.start);
            next = r.end;
        }
        assert_eq!(next, rows);
        let want = RowMatrix::quantize_from(&src, RowType::Q8_0, &pool).unwrap();
        assert_eq!(q.data(), want.data());
    }
}

#[test]
fn quantize_from_f16_embedding() {
    let mut rng = Rng::new(12);
    let (rows, cols) = (37, 512);
    let data = random_rows(&mut rng, RowType::F16, rows, cols);
    let src = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&data)).unwrap();
    let pool = Pool::new(2);
    for ty in [RowType::Q8_0, RowType::Q6K, RowType::Q4_0, RowType::BF16] {
        let q = RowMatrix::quantize_from(&src, ty, &pool).unwrap();
        assert_eq!(q.rows(), rows);
        assert_eq!(q.nbytes(), rows * ty.row_bytes(cols).unwrap());
        let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
        for r in 0..rows {
            src.dequantize_row(r, &mut a).unwrap();
            q.dequantize_row(r, &mut b).unwrap();
            // Row by row equal to the single-row quantizer.
            let mut enc = vec![0u8; ty.row_bytes(cols).unwrap()];
            quantize_row_into(ty, &a, &mut enc);
            let mut c = vec![0f32; cols];
            dequantize_row_bytes(ty, &enc, &mut c);
            assert_eq!(b, c);
        }
    }
    assert!(RowMatrix::new(RowType::Q8_0, 2, 48, Cow::Owned(vec![0; 68])).is_err());
    assert!(RowMatrix::new(RowType::Q8_0, 2, 64, Cow::Owned(vec![0; 135])).is_err());
    let mut out = vec![0f32; 512];
    assert!(src.dequantize_row(rows, &mut out).is_err());
}

#[test]
fn ggml_f16_order_by_hand() {
    // 32 elements: w = 1, x = 2^-24 · [1..32] in lane order; the ggml order reduces
    // (a0+a2)+(a1+a3) lane-wise, then (t0+t1)+(t2+t3) of lo+hi — exact here, so the
    // result is the plain sum; a single huge value shows that leftovers go through f64.
    let w: Vec<u8> = (0..33).flat_map(|_| f16b(1.0)).collect();
    let mut x: Vec<f32> = (1..=32).map(|i| i as f32).collect();
    x.push(0.5);
    let m = RowMatrix::new(RowType::F16, 1, 33, Cow::Borrowed(&w)).unwrap();
    let pool = Pool::new(1);
    for isa in supported_isas() {
        let mut out = [0f32; 1];
        m.matmul_f32_on(isa, &x, &mut out, &pool, F16DotOrder::Ggml)
            .unwrap()
            .unwrap();
        assert_eq!(out[0], 528.5);
    }
}

/// Q8_0 / Q4_0 rows against Q8_0-quantized activations: every tier bit-identical to the
/// scalar order; the scalar result within f32 rounding of the f64 dot of the dequantized
/// row and the dequantized activations; other row types (and cols % 32 ≠ 0) fall back to
/// the f32 path exactly.
#[test]
fn q8_activation_dots_every_tier() {
    let mut rng = Rng::new(31);
    let pools = [Pool::new(1), Pool::new(2), Pool::new(3)];
    for ty in [RowType::Q8_0, RowType::Q4_0] {
        for _ in 0..8 {
            let rows = 1 + rng.below(45);
            let cols = 32 * (1 + rng.below(90));
            let mut data = random_rows(&mut rng, ty, rows, cols);
            if ty == RowType::Q8_0 {
                // A row block of −128s (a file may hold them; ours never writes them).
                data[2..34].fill(0x80);
            }
            let m = RowMatrix::new(ty, rows, cols, Cow::Borrowed(&data)).unwrap();
            // 3, 5 and 7 tokens leave a partial group of the multi-token kernels (fours).
            for n_tok in [1usize, 2, 3, 4, 5, 7] {
                // Some activations at the extremes of a block (±amax → q = ±127).
                let x: Vec<f32> = (0..n_tok * cols)
                    .map(|i| if i % 37 == 0 { -3.0 } else { rng.f32() })
                    .collect();
                let mut want = vec![0f32; n_tok * rows];
                m.matmul_q8_on(bitnet_kernels::Isa::Scalar, &x, &mut want, &pools[0])
                    .unwrap()
                    .unwrap();
                let xb = RowType::Q8_0.row_bytes(cols).unwrap();
                let mut w = vec![0f32; cols];
                let mut xd = vec![0f32; cols];
                let mut enc = vec![0u8; xb];
                let mut bounds = vec![0f64; n_tok * rows];
                for t in 0..n_tok {
                    quantize_row_into(RowType::Q8_0, &x[t * cols..(t + 1) * cols], &mut enc);
                    assert!(enc
                        .chunks_exact(34)
                        .all(|b| b[2..].iter().all(|&q| q != 0x80)));
                    dequantize_row_bytes(RowType::Q8_0, &enc, &mut xd);
                    for r in 0..rows {
                        m.dequantize_row(r, &mut w).unwrap();
                        let exact: f64 = w
                            .iter()
                            .zip(&xd)
                            .map(|(&a, &b)| f64::from(a) * f64::from(b))
                            .sum();
                        let mag: f64 = w
                            .iter()
                            .zip(&xd)
                            .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                            .sum();
                        let got = f64::from(want[t * rows + r]);
                        // d_w·d_x rounded once per block, then one fma per block and lane.
                        let bound =
                            4.0 * (cols / 32 + 3) as f64 * f64::from(f32::EPSILON) * mag + 1e-30;
                        assert!(
                            (got - exact).abs() <= bound,
                            "{ty:?} {rows}x{cols}: {got} vs {exact} (bound {bound})"
                        );
                        bounds[t * rows + r] = bound;
                    }
                }
                for isa in supported_isas() {
                    for pool in &pools {
                        let mut got = vec![f32::NAN; n_tok * rows];
                        m.matmul_q8_on(isa, &x, &mut got, pool).unwrap().unwrap();
                        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                            if isa == Isa::Simd128 && !bitnet_kernels::wasm_fused_madd() {
                                // WebAssembly without a fused multiply-add multiplies, then
                                // adds: within twice the scalar order's own bound of it.
                                let d = (f64::from(*a) - f64::from(*b)).abs();
                                assert!(
                                    d <= 2.0 * bounds[i],
                                    "{ty:?} {rows}x{cols} {isa:?} idx {i}: {a} vs {b}"
                                );
                                continue;
                            }
                            assert_eq!(
                                a.to_bits(),
                                b.to_bits(),
                                "{ty:?} {rows}x{cols} {isa:?} idx {i}"
                            );
                        }
                    }
                }
            }
        }
    }
    // Not Q8_0/Q4_0: the f32 path in the ggml order.
    for (ty, cols) in [(RowType::F16, 64), (RowType::Q6K, 256), (RowType::F32, 40)] {
        let data = random_rows(&mut rng, ty, 5, cols);
        let m = RowMatrix::new(ty, 5, cols, Cow::Borrowed(&data)).unwrap();
        let x: Vec<f32> = (0..3 * cols).map(|_| rng.f32()).collect();
        let (mut a, mut b) = (vec![0f32; 15], vec![0f32; 15]);
        m.matmul_q8(&x, &mut a, &pools[1]).unwrap();
        m.matmul_f32_order(&x, &mut b, &pools[1], F16DotOrder::Ggml)
            .unwrap();
        if ty == RowType::F16
            && bitnet_kernels::isa() == Isa::Simd128
            && !bitnet_kernels::wasm_fused_madd()
        {
            // WebAssembly's fast F16 dot multiplies, then adds (f16_fast_dots_match_scalar).
            let mag: f32 = x.iter().map(|v| v.abs()).sum();
            for (p, q) in a.iter().zip(&b) {
                assert!((p - q).abs() <= 1e-5 * mag, "{ty:?}: {p} vs {q}");
            }
        } else {
            assert_eq!(a, b, "{ty:?}");
        }
    }
}

/// The F16 dots of fast numerics (`matmul_q8`) on every tier against the scalar tier's:
/// bit-identical where the tier has a fused multiply-add; WebAssembly's `simd128` tier
/// without one (`wasm_fused_madd`) multiplies, then adds: bit-identical to
/// [`ggml_dot_unfused`], its scalar twin (run under wasm32 by scripts/test-wasm). Random
/// shapes, ragged K, 1..7 tokens.
#[test]
fn f16_fast_dots_match_scalar() {
    let mut rng = Rng::new(91);
    let pool = Pool::new(1);
    let isas = supported_isas();
    if !isas.contains(&Isa::Simd128) {
        eprintln!(
            "f16_fast_dots_match_scalar: the simd128 tier is not on this host ({}); scripts/test-wasm runs it",
            std::env::consts::ARCH
        );
    }
    for _ in 0..24 {
        let rows = 1 + rng.below(40);
        let cols = 1 + rng.below(700);
        let data = random_rows(&mut rng, RowType::F16, rows, cols);
        let m = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&data)).unwrap();
        for n_tok in [1usize, 2, 3, 5, 7] {
            let x: Vec<f32> = (0..n_tok * cols).map(|_| rng.f32() * 2.0).collect();
            let mut want = vec![0f32; n_tok * rows];
            m.matmul_q8_on(Isa::Scalar, &x, &mut want, &pool)
                .unwrap()
                .unwrap();
            for &isa in &isas {
                let mut got = vec![f32::NAN; n_tok * rows];
                m.matmul_q8_on(isa, &x, &mut got, &pool).unwrap().unwrap();
                if isa != Isa::Simd128 || bitnet_kernels::wasm_fused_madd() {
                    assert_eq!(got, want, "{isa:?} {rows}x{cols} n_tok {n_tok}");
                    continue;
                }
                let mut w = vec![0f32; cols];
                for t in 0..n_tok {
                    let xt = &x[t * cols..(t + 1) * cols];
                    for r in 0..rows {
                        m.dequantize_row(r, &mut w).unwrap();
                        let want = ggml_dot_unfused(&w, xt);
                        let g = got[t * rows + r];
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "{isa:?} {rows}x{cols} n_tok {n_tok} t {t} r {r}: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

/// The fast F16 dot of one token over matrices holding an infinite or NaN half (the
/// `simd128` tier checks a matrix's halves once, and only a matrix of finite halves skips the
/// check of each row): every tier against the scalar tier, the `simd128` tier without a fused
/// multiply-add against its twin [`ggml_dot_unfused`]; NaN taken for NaN (its sign and payload are the engine's).
/// Random shapes, ragged K, one and two threads.
#[test]
fn f16_fast_dots_with_non_finite_halves() {
    let mut rng = Rng::new(92);
    let pools = [Pool::new(1), Pool::new(2)];
    let isas = supported_isas();
    if !isas.contains(&Isa::Simd128) {
        eprintln!(
            "f16_fast_dots_with_non_finite_halves: the simd128 tier is not on this host ({}); scripts/test-wasm runs it",
            std::env::consts::ARCH
        );
    }
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    for case in 0..30 {
        let rows = 1 + rng.below(40);
        let cols = 1 + rng.below(700);
        let mut data = random_rows(&mut rng, RowType::F16, rows, cols);
        let bad: u16 = [0x7c00, 0xfc00, 0x7e01][case % 3];
        let at = 2 * rng.below(rows * cols);
        data[at..at + 2].copy_from_slice(&bad.to_le_bytes());
        let m = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&data)).unwrap();
        let x: Vec<f32> = (0..cols).map(|_| rng.f32() * 2.0).collect();
        let pool = &pools[case % 2];
        let mut want = vec![0f32; rows];
        m.matmul_q8_on(Isa::Scalar, &x, &mut want, pool)
            .unwrap()
            .unwrap();
        let mut w = vec![0f32; cols];
        for &isa in &isas {
            let mut got = vec![0f32; rows];
            m.matmul_q8_on(isa, &x, &mut got, pool).unwrap().unwrap();
            for r in 0..rows {
                let want = if isa == Isa::Simd128 && !bitnet_kernels::wasm_fused_madd() {
                    m.dequantize_row(r, &mut w).unwrap();
                    ggml_dot_unfused(&w, &x)
                } else {
                    want[r]
                };
                assert!(
                    same(got[r], want),
                    "{isa:?} case {case} {rows}x{cols} row {r}: {} vs {want}",
                    got[r]
                );
            }
        }
    }
}

/// The scalar twin of the `simd128` tier's fast F16 dot without a fused multiply-add: ggml's
/// order (4 accumulators × 8 lanes over chunks of 32, the lanes reduced pairwise, the K % 32
/// tail added in f64) with each product rounded before it is added.
fn ggml_dot_unfused(w: &[f32], x: &[f32]) -> f32 {
    let main = x.len() - x.len() % 32;
    let mut acc = [[0f32; 8]; 4];
    for c in (0..main).step_by(32) {
        for (j, aj) in acc.iter_mut().enumerate() {
            for (l, a) in aj.iter_mut().enumerate() {
                let i = c + 8 * j + l;
                *a += w[i] * x[i];
            }
        }
    }
    let a: Vec<f32> = (0..8)
        .map(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]))
        .collect();
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let mut sum = f64::from((t[0] + t[1]) + (t[2] + t[3]));
    for i in main..x.len() {
        sum += f64::from(w[i] * x[i]);
    }
    sum as f32
}

/// `matmul_q8`: a token's outputs do not depend on the other tokens of the call (F16 rows go
/// through the multi-token kernel in groups of up to three, with a ragged K too).
#[test]
fn q8_path_is_batch_invariant() {
    let mut rng = Rng::new(77);
    let pools = [Pool::new(1), Pool::new(2)];
    for (ty, cols) in [
        (RowType::F16, 517),
        (RowType::F16, 512),
        (RowType::Q8_0, 512),
        (RowType::Q4_0, 512),
        (RowType::Q6K, 512),
    ] {
        let rows = 23;
        let data = random_rows(&mut rng, ty, rows, cols);
        let m = RowMatrix::new(ty, rows, cols, Cow::Borrowed(&data)).unwrap();
        for n_tok in [2usize, 3, 4, 5, 7] {
            let x: Vec<f32> = (0..n_tok * cols).map(|_| rng.f32()).collect();
            for pool in &pools {
                let mut all = vec![0f32; n_tok * rows];
                m.matmul_q8(&x, &mut all, pool).unwrap();
                for t in 0..n_tok {
                    let mut one = vec![0f32; rows];
                    m.matmul_q8(&x[t * cols..(t + 1) * cols], &mut one, pool)
                        .unwrap();
                    assert_eq!(
                        one,
                        all[t * rows..(t + 1) * rows],
                        "{ty:?} {n_tok} tokens, token {t}"
                    );
                }
            }
        }
    }
}

#[test]
fn q8_activation_dot_by_hand() {
    // One Q8_0 block: d_w = 0.5, w = [1, -2, 0, ..., 0, -128 at 31]; x = [127, 0.5·127 → 64?]
    // Activations chosen so their Q8_0 code is exact: amax = 127 → d_x = 1, q = x.
    let mut blk = Vec::new();
    blk.extend_from_slice(&f16b(0.5));
    let mut w = [0i8; 32];
    w[0] = 1;
    w[1] = -2;
    w[31] = -128;
    blk.extend(w.iter().map(|&v| v as u8));
    let mut x = [0f32; 32];
    x[0] = 127.0;
    x[1] = -5.0;
    x[31] = -127.0;
    let m = RowMatrix::new(RowType::Q8_0, 1, 32, Cow::Borrowed(&blk)).unwrap();
    let pool = Pool::new(1);
    // 0.5 · (127 + 10 + 128·127) = 0.5 · 16393
    for isa in supported_isas() {
        let mut out = [0f32; 1];
        m.matmul_q8_on(isa, &x, &mut out, &pool).unwrap().unwrap();
        assert_eq!(out[0], 8196.5, "{isa:?}");
    }
}

/// F16 rows · several tokens in ggml's order, on rows long enough for the column-chunked
/// multi-token kernels (chunks of 512, blocks of 8 rows, passes of 8 tokens, a leftover past
/// the last 32): every tier bit-identical to the scalar single-token dot.
#[test]
fn f16_ggml_multi_token_blocks_every_tier() {
    let mut rng = Rng::new(77);
    let pool = Pool::new(2);
    // 4133 columns: even two tokens' activations (33 KiB) exceed a 32 KiB L1 data cache and
    // four (66 KiB) any L1 up to 64 KiB, so the AVX-512 tiers' blocked walk runs on every
    // host that has them; 3, 5 and 7 tokens leave partial token groups.
    for (rows, cols) in [(19usize, 1100usize), (9, 2567), (17, 512), (21, 4133)] {
        let data = random_rows(&mut rng, RowType::F16, rows, cols);
        let m = RowMatrix::new(RowType::F16, rows, cols, Cow::Borrowed(&data)).unwrap();
        for n_tok in [2usize, 3, 4, 5, 7, 9, 17] {
            let x: Vec<f32> = (0..n_tok * cols).map(|_| rng.f32()).collect();
            let mut want = vec![0f32; n_tok * rows];
            for t in 0..n_tok {
                let mut one = vec![0f32; rows];
                m.matmul_f32_on(
                    bitnet_kernels::Isa::Scalar,
                    &x[t * cols..(t + 1) * cols],
                    &mut one,
                    &pool,
                    F16DotOrder::Ggml,
                )
                .unwrap()
                .unwrap();
                want[t * rows..(t + 1) * rows].copy_from_slice(&one);
            }
            for isa in supported_isas() {
                let mut got = vec![f32::NAN; n_tok * rows];
                m.matmul_f32_on(isa, &x, &mut got, &pool, F16DotOrder::Ggml)
                    .unwrap()
                    .unwrap();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{isa:?} {rows}x{cols} tokens {n_tok}");
            }
        }
    }
}

/// The selected-rows entry (the approximate head's candidates) gives, on every tier, exactly
/// what the full matmul of that tier gives for those rows, and the scalar tier's value where
/// the tiers agree bit for bit; ragged widths, repeated and unordered ids, 1 and 2 threads.
#[test]
fn selected_rows_equal_the_full_matmul_every_tier() {
    let mut rng = Rng::new(4242);
    let pools = [Pool::new(1), Pool::new(2)];
    for (ty, cols) in [
        (RowType::F16, 517),
        (RowType::F16, 544),
        (RowType::F32, 77),
        (RowType::BF16, 96),
        (RowType::Q8_0, 512),
        (RowType::Q8_0, 96),
        (RowType::Q4_0, 320),
        (RowType::Q6K, 512),
    ] {
        let rows = 37 + rng.below(60);
        let data = random_rows(&mut rng, ty, rows, cols);
        let m = RowMatrix::new(ty, rows, cols, Cow::Borrowed(&data)).unwrap();
        let x: Vec<f32> = (0..cols).map(|_| rng.f32()).collect();
        let n_ids = 1 + rng.below(3 * rows);
        let ids: Vec<u32> = (0..n_ids).map(|_| rng.below(rows) as u32).collect();
        for isa in supported_isas() {
            for pool in &pools {
                let mut full = vec![0f32; rows];
                m.matmul_q8_on(isa, &x, &mut full, pool).unwrap().unwrap();
                let mut sel = vec![f32::NAN; n_ids];
                m.matmul_q8_rows_on(isa, &ids, &x, &mut sel, pool)
                    .unwrap()
                    .unwrap();
                for (i, &r) in ids.iter().enumerate() {
                    assert_eq!(
                        sel[i].to_bits(),
                        full[r as usize].to_bits(),
                        "{ty:?} cols {cols} {isa:?} id {r}"
                    );
                }
            }
        }
    }
}

#[test]
fn selected_rows_refuse_bad_ids_and_shapes() {
    let mut rng = Rng::new(5);
    let data = random_rows(&mut rng, RowType::F16, 4, 64);
    let m = RowMatrix::new(RowType::F16, 4, 64, Cow::Borrowed(&data)).unwrap();
    let pool = Pool::new(2);
    let x = vec![0.5f32; 64];
    let mut out = vec![0f32; 2];
    assert!(matches!(
        m.matmul_q8_rows(&[1, 4], &x, &mut out, &pool),
        Err(bitnet_kernels::KernelError::RowOutOfRange { row: 4, rows: 4 })
    ));
    assert!(m
        .matmul_q8_rows(&[1, 2], &x[..63], &mut out, &pool)
        .is_err());
    assert!(m.matmul_q8_rows(&[1], &x, &mut out, &pool).is_err());
    m.matmul_q8_rows(&[], &x, &mut [], &pool).unwrap();
}

/// `first_non_finite_value` (and `first_non_finite` for f32 slices) give the first value
/// that decodes to NaN or ±∞, over random lengths, for each row type: a value of the float
/// types, the first value of a block whose scale is NaN or ±∞ in the block types.
#[test]
fn first_non_finite_value_is_the_first_that_decodes_non_finite() {
    use bitnet_kernels::rows::{first_non_finite, first_non_finite_value};
    let mut rng = Rng::new(21);
    for ty in [RowType::F32, RowType::F16, RowType::BF16] {
        for _ in 0..200 {
            let n = rng.below(700);
            let mut x: Vec<f32> = (0..n).map(|_| rng.f32() * 1e5).collect();
            for _ in 0..rng.below(3) {
                if n > 0 {
                    x[rng.below(n)] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][rng.below(3)];
                }
            }
            let bytes: Vec<u8> = match ty {
                RowType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
                RowType::F16 => x
                    .iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                    .collect(),
                _ => x
                    .iter()
                    .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                    .collect(),
            };
            let mut decoded = vec![0f32; n];
            dequantize_row_bytes(ty, &bytes, &mut decoded);
            let want = decoded.iter().position(|v| !v.is_finite());
            assert_eq!(first_non_finite_value(ty, &bytes), want, "{ty:?} n {n}");
            assert_eq!(first_non_finite(&decoded), want, "{ty:?} n {n}");
        }
    }
    for ty in [RowType::Q8_0, RowType::Q6K, RowType::Q4_0] {
        let per = ty.block_elems();
        for _ in 0..50 {
            let blocks = rng.below(12);
            let x: Vec<f32> = (0..blocks * per).map(|_| rng.f32() * 4.0).collect();
            let mut bytes = vec![0u8; ty.row_bytes(x.len()).unwrap()];
            quantize_row_into(ty, &x, &mut bytes);
            // Some blocks' f16 scale set to NaN or ±∞ (the last two bytes of Q6_K's block).
            let at = if ty == RowType::Q6K { 208 } else { 0 };
            for _ in 0..rng.below(3) {
                if blocks > 0 {
                    let b = rng.below(blocks) * ty.block_bytes() + at;
                    let h = [0x7e00u16, 0x7c00, 0xfc00, 0x7c01][rng.below(4)];
                    bytes[b..b + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
            let mut decoded = vec![0f32; x.len()];
            dequantize_row_bytes(ty, &bytes, &mut decoded);
            let want = decoded.iter().position(|v| !v.is_finite());
            assert_eq!(
                first_non_finite_value(ty, &bytes),
                want,
                "{ty:?} {blocks} blocks"
            );
            // Every value of such a block is non-finite, not only its first.
            if let Some(i) = want {
                assert!(decoded[i..i + per].iter().all(|v| !v.is_finite()), "{ty:?}");
            }
        }
    }
}
