//! Per-token int8 activation quantization: every tier this CPU supports against the scalar
//! twin (`act::quantize_i8_scalar`), bit for bit, and against hand-computed values.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

mod common;

use bitnet_kernels::{act, supported_isas, Isa};
use common::Rng;

/// Quantize `x` on every supported tier and on the scalar twin; assert identical scale bits
/// and codes. Returns the scalar result.
fn check_all_tiers(x: &[f32], what: &str) -> (f32, Vec<i8>) {
    let mut want_q = vec![0x55i8; x.len()];
    let want_s = act::quantize_i8_scalar(x, &mut want_q);
    for isa in supported_isas() {
        let mut q = vec![0x55i8; x.len()];
        let s = act::quantize_i8_on(isa, x, &mut q).unwrap();
        assert_eq!(
            s.to_bits(),
            want_s.to_bits(),
            "{what} len {} {isa:?}: scale {s} vs {want_s}",
            x.len()
        );
        if let Some(i) = q.iter().zip(&want_q).position(|(a, b)| a != b) {
            panic!(
                "{what} len {} {isa:?}: idx {i}: x {} (bits {:#010x}) -> {} vs {}",
                x.len(),
                x[i],
                x[i].to_bits(),
                q[i],
                want_q[i]
            );
        }
    }
    // The default entry point agrees as well.
    let mut q = vec![0x55i8; x.len()];
    assert_eq!(
        act::quantize_i8(x, &mut q).to_bits(),
        want_s.to_bits(),
        "{what}"
    );
    assert_eq!(q, want_q, "{what}");
    (want_s, want_q)
}

/// Lengths around every vector width, plus the model widths.
fn lengths(rng: &mut Rng) -> Vec<usize> {
    let mut v: Vec<usize> = (0..=300).collect();
    v.extend([2560, 6912]);
    v.extend((0..8).map(|_| 301 + rng.below(4000)));
    v
}

#[test]
fn tiers_reported() {
    let isas = supported_isas();
    eprintln!("tiers tested: {isas:?}");
    assert!(isas.contains(&Isa::Scalar));
    // A tier this CPU lacks is refused, not emulated.
    for isa in [
        Isa::Scalar,
        Isa::Neon,
        Isa::Avx2,
        Isa::AvxVnni,
        Isa::Avx512,
        Isa::Avx512Vnni,
    ] {
        let mut q = [0i8; 3];
        assert_eq!(
            act::quantize_i8_on(isa, &[1.0, 2.0, 3.0], &mut q).is_some(),
            isa.is_supported() && isas.contains(&isa),
            "{isa:?}"
        );
    }
}

#[test]
fn random_rows_match_scalar() {
    let mut rng = Rng::new(11);
    for n in lengths(&mut rng) {
        // Different magnitudes move s, and with it where products land between integers.
        for amp in [1.0f32, 3.0, 1e-3, 1e4] {
            let x: Vec<f32> = (0..n).map(|_| rng.f32() * amp).collect();
            check_all_tiers(&x, &format!("random amp {amp}"));
        }
    }
}

#[test]
fn random_bit_patterns_match_scalar() {
    // Any f32 bit pattern: subnormals, huge values, NaNs with payloads, ±inf, ±0.
    let mut rng = Rng::new(12);
    for n in lengths(&mut rng) {
        let x: Vec<f32> = (0..n)
            .map(|_| f32::from_bits(rng.next_u64() as u32))
            .collect();
        check_all_tiers(&x, "bit patterns");
    }
}

#[test]
fn special_values_sprinkled_match_scalar() {
    let specials = [
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7fa0_0001), // signalling NaN
        f32::INFINITY,
        f32::NEG_INFINITY,
        -0.0,
        0.0,
        f32::MIN_POSITIVE,
        -f32::from_bits(1), // smallest subnormal
        f32::MAX,
        f32::MIN,
    ];
    let mut rng = Rng::new(13);
    for n in lengths(&mut rng) {
        for sp in specials {
            // One special at a random place (possibly in the ragged tail), then a handful.
            let mut x: Vec<f32> = (0..n).map(|_| rng.f32() * 2.0).collect();
            if n > 0 {
                x[rng.below(n)] = sp;
                if n > 1 {
                    x[n - 1] = sp;
                }
            }
            check_all_tiers(&x, &format!("special {sp:?}"));
            for _ in 0..(n / 16).min(8) {
                x[rng.below(n)] = specials[rng.below(specials.len())];
            }
            check_all_tiers(&x, &format!("specials mixed with {sp:?}"));
        }
        // A row with a NaN (the last value, or all): scale NaN, every code 0.
        if n > 0 {
            let mut x: Vec<f32> = (0..n).map(|_| rng.f32() * 2.0).collect();
            x[n - 1] = -f32::NAN;
            let (s, q) = check_all_tiers(&x, "one NaN");
            assert!(s.is_nan(), "len {n}: {s}");
            assert!(q.iter().all(|&v| v == 0));
            let (s, q) = check_all_tiers(&vec![f32::NAN; n], "all NaN");
            assert!(s.is_nan());
            assert!(q.iter().all(|&v| v == 0));
        }
        // Only −0.0.
        let x = vec![-0.0f32; n];
        let (s, q) = check_all_tiers(&x, "all -0.0");
        assert_eq!(s, 12_700_000.0);
        assert!(q.iter().all(|&v| v == 0));
    }
}

#[test]
fn half_way_ties_match_scalar() {
    // max |x| = 127 makes s = (f32)(127/127) = 1 exactly, so x·s = x: every k + 0.5 is a tie.
    let mut rng = Rng::new(14);
    for n in lengths(&mut rng) {
        let mut x: Vec<f32> = (0..n)
            .map(|_| (rng.below(254) as f32 - 127.0) + 0.5)
            .map(|v| v.clamp(-126.5, 126.5))
            .collect();
        if n > 0 {
            x[rng.below(n)] = if rng.below(2) == 0 { 127.0 } else { -127.0 };
            let (s, q) = check_all_tiers(&x, "ties s=1");
            assert_eq!(s, 1.0);
            for (&v, &c) in x.iter().zip(&q) {
                assert_eq!(f32::from(c), v.round_ties_even(), "x {v}");
            }
        }
        // max |x| = 63.5 gives s = 2 exactly: x = (k + 0.5)/2 hits k + 0.5 after scaling.
        let mut x: Vec<f32> = (0..n)
            .map(|_| ((rng.below(254) as f32 - 127.0) + 0.5) / 2.0)
            .map(|v| v.clamp(-63.25, 63.25))
            .collect();
        if n > 0 {
            x[rng.below(n)] = 63.5;
            let (s, _) = check_all_tiers(&x, "ties s=2");
            assert_eq!(s, 2.0);
        }
    }
}

#[test]
fn product_is_rounded_to_f32_before_rounding_to_integer() {
    // m = 3 → s = (f32)(127/3) = 42.333332, not exact. Collect x whose f32 product x·s is
    // exactly k + 0.5 while the exact (f64) product is not: rounding the f32 product goes to
    // the even neighbour; rounding the exact product (FMA-like or in f64) would go by the
    // sign of the error instead.
    let s = 42.333_332f32;
    let mut x = vec![3.0f32];
    let mut want = vec![127i8];
    let mut sides = [0usize; 2];
    for k in -127i32..126 {
        let t = k as f32 + 0.5;
        let x0 = t / s;
        for d in -4i32..=4 {
            let v = f32::from_bits(x0.to_bits().wrapping_add_signed(d));
            if v * s == t && f64::from(v) * f64::from(s) != f64::from(t) {
                // Exact product above vs below the tie, counted for the record.
                let above = f64::from(v) * f64::from(s) > f64::from(t);
                sides[usize::from(above == (t > 0.0))] += 1;
                x.push(v);
                want.push(t.round_ties_even() as i8);
            }
        }
    }
    eprintln!(
        "{} inexact ties (toward zero, away from zero: {sides:?})",
        x.len() - 1
    );
    assert!(sides[0] > 10 && sides[1] > 10, "{sides:?}");
    let (got_s, q) = check_all_tiers(&x, "inexact ties");
    assert_eq!(got_s, s);
    assert_eq!(q, want);
}

#[test]
fn huge_tiny_and_zero_rows_match_scalar() {
    let mut rng = Rng::new(15);
    for n in lengths(&mut rng) {
        // Zero rows: m = 1e-5 floor.
        let (s, q) = check_all_tiers(&vec![0.0f32; n], "zeros");
        assert_eq!(s, 12_700_000.0);
        assert!(q.iter().all(|&v| v == 0));
        // Everything below the floor: codes up to ±127 from the floor scale.
        let x: Vec<f32> = (0..n).map(|_| rng.f32() * 1e-5).collect();
        check_all_tiers(&x, "below floor");
        // Huge values near f32::MAX: products near ±127 after the rounded scale.
        let x: Vec<f32> = (0..n).map(|_| rng.f32() * f32::MAX).collect();
        check_all_tiers(&x, "huge");
        // One huge outlier among ordinary values (most codes round to 0 or −0.0).
        let mut x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
        if n > 0 {
            x[rng.below(n)] = -3.0e38;
        }
        check_all_tiers(&x, "outlier");
    }
}

#[test]
fn hand_computed_values() {
    // m = 127 → s = 1: q = round_half_even(x), ties to even, both signs.
    let x = [
        127.0f32, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5, -126.5, -127.0, 0.49, -0.0, 0.25,
        64.5, -64.5, 5.5, -5.5, 100.25, -100.75, 0.0, 1.0, -1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0,
        9.0, 10.5, 11.5, 12.5, 13.5,
    ];
    let want: [i8; 35] = [
        127, 0, 2, 2, 0, -2, -2, 4, 126, -126, -127, 0, 0, 0, 64, -64, 6, -6, 100, -101, 0, 1, -1,
        2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 12, 14,
    ];
    for isa in supported_isas() {
        let mut q = [0x55i8; 35];
        let s = act::quantize_i8_on(isa, &x, &mut q).unwrap();
        assert_eq!(s, 1.0, "{isa:?}");
        assert_eq!(q, want, "{isa:?}");
    }

    // m = 254 → s = 0.5 exactly: x·s = x/2, so 1 → 0.5 → 0, 3 → 1.5 → 2, 5 → 2.5 → 2,
    // −3 → −2, 254 → 127, −254 → −127; ±inf is excluded only as NaN is, so none here.
    let x = [254.0f32, 1.0, 3.0, 5.0, -3.0, -254.0, 253.0, 7.0, -7.0];
    let want: [i8; 9] = [127, 0, 2, 2, -2, -127, 126, 4, -4];
    for isa in supported_isas() {
        let mut q = [0x55i8; 9];
        let s = act::quantize_i8_on(isa, &x, &mut q).unwrap();
        assert_eq!(s, 0.5, "{isa:?}");
        assert_eq!(q, want, "{isa:?}");
    }

    // An infinity is the maximum: s = 127/inf = 0, so finite values give ±0 → 0 and the
    // infinity itself gives inf·0 = NaN → 0.
    let x = [
        f32::INFINITY,
        1.0,
        -5.0,
        0.5,
        -f32::INFINITY,
        3.0,
        2.0,
        -1.0,
        9.0,
    ];
    for isa in supported_isas() {
        let mut q = [0x55i8; 9];
        let s = act::quantize_i8_on(isa, &x, &mut q).unwrap();
        assert_eq!(s.to_bits(), 0.0f32.to_bits(), "{isa:?}");
        assert_eq!(q, [0; 9], "{isa:?}");
    }

    // A NaN anywhere, beside an infinity or not: the scale is NaN and every code 0, so the
    // projection's outputs for the row are NaN (0 / NaN).
    for x in [
        [f32::INFINITY, 1.0, -5.0, 0.5, f32::NAN, 3.0, 2.0, -1.0, 9.0],
        [127.0, 1.0, -5.0, 0.5, 2.0, 3.0, 2.0, -1.0, -f32::NAN],
    ] {
        for isa in supported_isas() {
            let mut q = [0x55i8; 9];
            let s = act::quantize_i8_on(isa, &x, &mut q).unwrap();
            assert!(s.is_nan(), "{isa:?}: {s}");
            assert_eq!(q, [0; 9], "{isa:?}");
        }
    }

    // Empty row: the floor gives s = 127 / 1e-5 = 12 700 000 (exact in f32).
    for isa in supported_isas() {
        assert_eq!(
            act::quantize_i8_on(isa, &[], &mut []).unwrap(),
            12_700_000.0
        );
    }
}

#[test]
fn quantize_rows_matches_per_row_scalar() {
    let mut rng = Rng::new(16);
    for (n_tok, k) in [(1usize, 2560usize), (3, 37), (5, 6912), (4, 1), (2, 33)] {
        let x: Vec<f32> = (0..n_tok * k).map(|_| rng.f32() * 4.0).collect();
        let mut q = vec![0i8; n_tok * k];
        let mut s = vec![0f32; n_tok];
        act::quantize_rows(&x, k, &mut q, &mut s).unwrap();
        for t in 0..n_tok {
            let mut qr = vec![0i8; k];
            let sr = act::quantize_i8_scalar(&x[t * k..(t + 1) * k], &mut qr);
            assert_eq!(s[t].to_bits(), sr.to_bits());
            assert_eq!(&q[t * k..(t + 1) * k], &qr[..]);
        }
    }
}
