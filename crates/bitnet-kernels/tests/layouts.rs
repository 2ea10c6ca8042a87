//! Layout tests: worked examples, pack/unpack round trips, flavor detection.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

mod common;

use bitnet_kernels::layout::i2s;

#[test]
fn i2s_worked_example() {
    // docs/FORMATS.md §1: codes c_j = j mod 3 for j = 0..127 give bytes 0..3 = 24 49 92 24.
    let codes: Vec<u8> = (0..128).map(|j| (j % 3) as u8).collect();
    let packed = i2s::pack_codes(&codes, 1.0).unwrap();
    assert_eq!(&packed[0..4], &[0x24, 0x49, 0x92, 0x24]);
    assert_eq!(packed.len(), 128 / 4 + 32);
    assert_eq!(i2s::unpack_codes(&packed, 128), codes);
}

use bitnet_kernels::layout::{qk256, seq32, tq1_0, tq2_0};
use bitnet_kernels::{KernelError, TernaryLayout, TernaryMatrix};
use common::Rng;

fn ternary(rng: &mut Rng, n: usize) -> Vec<i8> {
    (0..n).map(|_| rng.ternary()).collect()
}

#[test]
fn i2s_element_formula_matches_block_diagram() {
    // Element p+32·g of a block sits at bits 7−2g..6−2g of byte p (docs/FORMATS.md §1 diagram).
    let mut rng = Rng::new(1);
    let bytes: Vec<u8> = (0..64).map(|_| rng.next_u64() as u8).collect();
    for j in 0..256 {
        let (b, e) = (j / 128, j % 128);
        let (g, p) = (e / 32, e % 32);
        let want = (bytes[32 * b + p] >> (6 - 2 * g)) & 3;
        assert_eq!(i2s::code(&bytes, j), want);
    }
}

#[test]
fn i2s_round_trip_and_scale() {
    let mut rng = Rng::new(2);
    let (n_out, k) = (5, 384);
    let v = ternary(&mut rng, n_out * k);
    let packed = i2s::pack_values(&v, 0.125).unwrap();
    assert_eq!(packed.len(), n_out * k / 4 + 32);
    assert_eq!(i2s::unpack_values(&packed, n_out * k), v);
    let m = TernaryMatrix::new(TernaryLayout::I2S, n_out, k, &packed, None).unwrap();
    assert_eq!(m.tensor_scale(), Some(0.125));
    let mut row = vec![0f32; k];
    for r in 0..n_out {
        m.dequantize_row(r, &mut row).unwrap();
        for j in 0..k {
            assert_eq!(row[j], 0.125 * f32::from(v[r * k + j]));
        }
    }
    // The 28 unused tail bytes are never read: garbage there changes nothing.
    let mut dirty = packed.clone();
    for b in &mut dirty[n_out * k / 4 + 4..] {
        *b = 0xA7;
    }
    let m2 = TernaryMatrix::new(TernaryLayout::I2S, n_out, k, &dirty, None).unwrap();
    let mut row2 = vec![0f32; k];
    m2.dequantize_row(3, &mut row2).unwrap();
    m.dequantize_row(3, &mut row).unwrap();
    assert_eq!(row, row2);
}

#[test]
fn i2s_code_11_decodes_as_zero_and_is_counted() {
    let mut packed = vec![0u8; 32 + 32];
    packed[0] = 0b11_10_01_00; // elements 0, 32, 64, 96 = codes 3, 2, 1, 0
    packed[32..36].copy_from_slice(&2.0f32.to_le_bytes());
    let m = TernaryMatrix::new(TernaryLayout::I2S, 1, 128, &packed, None).unwrap();
    let mut row = vec![0f32; 128];
    m.dequantize_row(0, &mut row).unwrap();
    assert_eq!([row[0], row[32], row[64], row[96]], [0.0, 2.0, 0.0, -2.0]);
    // Every other byte is 0 = four codes 00 = −1.
    assert_eq!(row[1], -2.0);
    assert_eq!(m.count_invalid_codes(), 1);
}

#[test]
fn tq2_0_layout_and_round_trip() {
    // Element m + 32l of a half at bits 2l of byte m (least significant pair first).
    let mut rng = Rng::new(3);
    let qs: Vec<u8> = (0..64).map(|_| rng.next_u64() as u8).collect();
    for e in 0..256 {
        let (h, l, m) = (e / 128, (e % 128) / 32, e % 32);
        assert_eq!(tq2_0::code(&qs, e), (qs[32 * h + m] >> (2 * l)) & 3);
    }
    let (n_out, k) = (3, 512);
    let v = ternary(&mut rng, n_out * k);
    let scales: Vec<f32> = (0..n_out * k / 256).map(|i| 0.5 + i as f32).collect();
    let packed = tq2_0::pack(&v, &scales).unwrap();
    assert_eq!(packed.len(), n_out * k / 256 * 66);
    let codes = tq2_0::unpack_codes(&packed);
    assert!(codes
        .iter()
        .zip(&v)
        .all(|(&c, &x)| i32::from(c) - 1 == i32::from(x)));
    let m = TernaryMatrix::new(TernaryLayout::Tq2_0, n_out, k, &packed, None).unwrap();
    let mut row = vec![0f32; k];
    for r in 0..n_out {
        m.dequantize_row(r, &mut row).unwrap();
        for j in 0..k {
            assert_eq!(row[j], f32::from(v[r * k + j]) * scales[r * 2 + j / 256]);
        }
    }
}

#[test]
fn tq1_0_trits_and_round_trip() {
    // A byte holding trits (t0..t4), first most significant, is stored as ceil(v·256/243).
    for v in 0u32..243 {
        let stored = (v * 256).div_ceil(243) as u8;
        let mut rest = v;
        for n in (0..5).rev() {
            let want = (rest % 3) as u8;
            rest /= 3;
            assert_eq!(tq1_0::trit(stored, n), want, "v {v} trit {n}");
        }
    }
    let mut rng = Rng::new(4);
    let (n_out, k) = (2, 768);
    let v = ternary(&mut rng, n_out * k);
    let scales: Vec<f32> = (0..n_out * k / 256)
        .map(|i| 0.25 * (i + 1) as f32)
        .collect();
    let packed = tq1_0::pack(&v, &scales).unwrap();
    assert_eq!(packed.len(), n_out * k / 256 * 54);
    let codes = tq1_0::unpack_codes(&packed);
    assert!(codes
        .iter()
        .zip(&v)
        .all(|(&c, &x)| i32::from(c) - 1 == i32::from(x)));
    // Element positions per docs/FORMATS.md §2.
    assert_eq!(tq1_0::position(0), (0, 0));
    assert_eq!(tq1_0::position(33), (1, 1));
    assert_eq!(tq1_0::position(159), (31, 4));
    assert_eq!(tq1_0::position(160), (32, 0));
    assert_eq!(tq1_0::position(239), (47, 4));
    assert_eq!(tq1_0::position(240), (48, 0));
    assert_eq!(tq1_0::position(255), (51, 3));
    let m = TernaryMatrix::new(TernaryLayout::Tq1_0, n_out, k, &packed, None).unwrap();
    let mut row = vec![0f32; k];
    m.dequantize_row(1, &mut row).unwrap();
    for j in 0..k {
        assert_eq!(row[j], f32::from(v[k + j]) * scales[3 + j / 256]);
    }
}

#[test]
fn seq32_layouts_round_trip() {
    let mut rng = Rng::new(5);
    let (n_out, k) = (3, 96);
    let v = ternary(&mut rng, n_out * k);
    let nb = n_out * k / 32;
    let scales: Vec<f32> = (0..nb).map(|i| 0.5 + 0.25 * i as f32).collect();
    // Sequential, least significant pair first, code = value + 2.
    let inline = seq32::pack_inline(&v, &scales).unwrap();
    assert_eq!(inline.len(), nb * 10);
    assert_eq!(inline[0] & 3, (v[0] + 2) as u8);
    assert_eq!((inline[0] >> 6) & 3, (v[3] + 2) as u8);
    assert_eq!(inline[1] & 3, (v[4] + 2) as u8);
    let codes = seq32::unpack_codes(&inline, 10);
    assert!(codes
        .iter()
        .zip(&v)
        .all(|(&c, &x)| i32::from(c) - 2 == i32::from(x)));
    let (packed, sib) = seq32::pack_split(&v, &scales).unwrap();
    assert_eq!(packed.len(), nb * 8);
    assert_eq!(seq32::unpack_codes(&packed, 8), codes);
    let mi = TernaryMatrix::new(TernaryLayout::BitNet32F16, n_out, k, &inline, None).unwrap();
    let ms = TernaryMatrix::new(
        TernaryLayout::Split32WithSibling,
        n_out,
        k,
        &packed,
        Some(&sib),
    )
    .unwrap();
    assert!(
        TernaryMatrix::new(TernaryLayout::Split32WithSibling, n_out, k, &packed, None).is_err()
    );
    let (mut a, mut b) = (vec![0f32; k], vec![0f32; k]);
    for r in 0..n_out {
        mi.dequantize_row(r, &mut a).unwrap();
        ms.dequantize_row(r, &mut b).unwrap();
        for j in 0..k {
            // Scales here are exact in f16, so both agree with value · scale.
            let want = f32::from(v[r * k + j]) * scales[r * 3 + j / 32];
            assert_eq!(a[j], want);
            assert_eq!(b[j], want);
        }
    }
    assert_eq!(ms.count_invalid_codes(), 0);
}

#[test]
fn qk256_round_trip_ragged_rows() {
    let mut rng = Rng::new(6);
    let (n_out, k) = (3, 300); // 2 blocks per row, the second ragged
    let v: Vec<i8> = (0..n_out * k).map(|_| qk256::LUT[rng.below(4)]).collect();
    let packed = qk256::pack(&v, k).unwrap();
    assert_eq!(packed.len(), n_out * 2 * 64);
    // byte = c0 | c1<<2 | c2<<4 | c3<<6
    let c = |x: i8| qk256::LUT.iter().position(|&l| l == x).unwrap() as u8;
    assert_eq!(
        packed[0],
        c(v[0]) | c(v[1]) << 2 | c(v[2]) << 4 | c(v[3]) << 6
    );
    for r in 0..n_out {
        let row = &packed[r * 128..(r + 1) * 128];
        let codes = qk256::unpack_row_codes(row, k);
        assert!(codes
            .iter()
            .zip(&v[r * k..])
            .all(|(&cc, &x)| qk256::LUT[cc as usize] == x));
    }
    // Without a companion tensor every scale is 1.0.
    let m = TernaryMatrix::new(TernaryLayout::Qk256, n_out, k, &packed, None).unwrap();
    assert!(m.scales_default_to_one());
    let mut row = vec![0f32; k];
    m.dequantize_row(2, &mut row).unwrap();
    assert!(row
        .iter()
        .zip(&v[2 * k..])
        .all(|(&a, &b)| a == f32::from(b)));
    // With f16 companion scales (one per 256-block).
    let sc: Vec<u8> = (0..n_out * 2)
        .flat_map(|i| half::f16::from_f32(0.5 * (i + 1) as f32).to_le_bytes())
        .collect();
    let m = TernaryMatrix::new(TernaryLayout::Qk256, n_out, k, &packed, Some(&sc)).unwrap();
    m.dequantize_row(1, &mut row).unwrap();
    for j in 0..k {
        assert_eq!(row[j], f32::from(v[k + j]) * 0.5 * (2 + j / 256 + 1) as f32);
    }
}

#[test]
fn sizes_per_formats_table() {
    let (n_out, k) = (2560, 6912);
    let n = n_out * k;
    assert_eq!(
        TernaryLayout::I2S.tensor_bytes(n_out, k).unwrap(),
        n / 4 + 32
    );
    assert_eq!(
        TernaryLayout::Qk256.tensor_bytes(n_out, k).unwrap(),
        n / 256 * 64
    );
    assert_eq!(
        TernaryLayout::Split32WithSibling
            .tensor_bytes(n_out, k)
            .unwrap(),
        n / 32 * 8
    );
    assert_eq!(
        TernaryLayout::BitNet32F16.tensor_bytes(n_out, k).unwrap(),
        n / 32 * 10
    );
    assert_eq!(
        TernaryLayout::Tq2_0.tensor_bytes(n_out, k).unwrap(),
        n / 256 * 66
    );
    assert_eq!(
        TernaryLayout::Tq1_0.tensor_bytes(n_out, k).unwrap(),
        n / 256 * 54
    );
    // 2B-4T per-layer I2_S bytes (docs/MODEL.md): 17,367,264.
    let layer: usize = [
        (2560, 2560),
        (640, 2560),
        (640, 2560),
        (2560, 2560),
        (6912, 2560),
        (6912, 2560),
        (2560, 6912),
    ]
    .iter()
    .map(|&(o, i)| TernaryLayout::I2S.tensor_bytes(o, i).unwrap())
    .sum();
    assert_eq!(layer, 17_367_264);
    assert!(TernaryLayout::I2S.tensor_bytes(4, 96).is_err());
    assert!(TernaryLayout::Tq2_0.tensor_bytes(4, 128).is_err());
}

fn detect(
    n_out: usize,
    k: usize,
    avail: usize,
    align: usize,
    sib: Option<&[u8]>,
) -> Result<TernaryLayout, KernelError> {
    let buf = vec![0u8; avail];
    TernaryMatrix::detect_type36("blk.0.attn_q.weight", n_out, k, &buf, align, sib)
        .map(|m| m.layout())
}

#[test]
fn detect_each_layout_by_exact_size() {
    let (n_out, k) = (2560, 2560);
    let n = n_out * k;
    // bitnet.cpp I2_S, exactly and with padding up to the alignment.
    assert_eq!(
        detect(n_out, k, n / 4 + 32, 32, None).unwrap(),
        TernaryLayout::I2S
    );
    assert_eq!(
        detect(640, 2560, 640 * 640 + 32, 32, None).unwrap(),
        TernaryLayout::I2S
    );
    // QK256: n/4 bytes — 32 fewer than I2_S; with and without a companion scale tensor.
    assert_eq!(
        detect(n_out, k, n / 4, 32, None).unwrap(),
        TernaryLayout::Qk256
    );
    let comp = vec![0u8; n / 256 * 4];
    assert_eq!(
        detect(n_out, k, n / 4, 32, Some(&comp)).unwrap(),
        TernaryLayout::Qk256
    );
    // Split32: the same n/4 bytes, told apart by a sibling of one scale per 32 elements.
    let sib32 = vec![0u8; n / 32 * 2];
    assert_eq!(
        detect(n_out, k, n / 4, 32, Some(&sib32)).unwrap(),
        TernaryLayout::Split32WithSibling
    );
    // BitNet32F16: n/32·10.
    assert_eq!(
        detect(n_out, k, n / 32 * 10, 32, None).unwrap(),
        TernaryLayout::BitNet32F16
    );
    // QK256 with ragged rows: 3 × 300 → 3 rows × 2 blocks × 64 bytes = 384.
    assert_eq!(detect(3, 300, 384, 32, None).unwrap(), TernaryLayout::Qk256);
    // Padding of the last block of a tensor: accepted up to the alignment.
    assert_eq!(
        detect(1, 64, 32, 32, None).unwrap(),
        TernaryLayout::BitNet32F16
    );
}

#[test]
fn detect_never_uses_a_loose_tolerance() {
    // I2_S and QK256 differ by exactly 32 bytes; a ±128 tolerance would accept both.
    let (n_out, k) = (2560, 2560);
    let n = n_out * k;
    for extra in [1usize, 16, 31] {
        // I2_S size + bytes that are not alignment padding (I2_S sizes are multiples of 32).
        let e = detect(n_out, k, n / 4 + 32 + extra, 32, None).unwrap_err();
        assert!(matches!(e, KernelError::NoLayout { .. }), "{e}");
    }
    let e = detect(n_out, k, n / 4 + 32 + 64, 32, None).unwrap_err();
    assert!(matches!(e, KernelError::NoLayout { .. }));
}

#[test]
fn detect_ambiguous_and_truncated_name_everything() {
    // Alignment 256: n/4 = 1920 (QK256) and n/4 + 32 (I2_S) both pad to 2048.
    let (n_out, k) = (3, 2560);
    let n = n_out * k;
    let e = detect(n_out, k, n / 4 + 32, 256, None).unwrap_err();
    match &e {
        KernelError::AmbiguousLayout {
            tensor,
            n_elements,
            available,
            candidates,
        } => {
            assert_eq!(tensor, "blk.0.attn_q.weight");
            assert_eq!(*n_elements, n);
            assert_eq!(*available, n / 4 + 32);
            assert!(candidates.contains(&(TernaryLayout::I2S, n / 4 + 32)));
            assert!(candidates.contains(&(TernaryLayout::Qk256, n / 4)));
        }
        other => panic!("{other}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("blk.0.attn_q.weight") && msg.contains(&n.to_string()),
        "{msg}"
    );
    // Tiny tensor with padding: 1×64 with a sibling of two f16 scales → Split32 (16 bytes)
    // and BitNet32F16 (20 bytes) both pad to 32.
    let sib = [0u8; 4];
    let e = detect(1, 64, 32, 32, Some(&sib)).unwrap_err();
    assert!(matches!(e, KernelError::AmbiguousLayout { .. }), "{e}");
    // Truncated: fewer bytes than any layout needs.
    let (n_out, k) = (2560, 2560);
    let n = n_out * k;
    let e = detect(n_out, k, n / 4 - 1, 32, None).unwrap_err();
    match &e {
        KernelError::NoLayout {
            tensor,
            available,
            candidates,
            ..
        } => {
            assert_eq!(tensor, "blk.0.attn_q.weight");
            assert_eq!(*available, n / 4 - 1);
            assert_eq!(candidates.len(), 4);
            assert!(candidates.contains(&(TernaryLayout::I2S, n / 4 + 32)));
        }
        other => panic!("{other}"),
    }
    // A sibling matching no layout: Split32 is not a candidate, QK256 not either.
    let bad = [0u8; 12];
    assert!(detect(n_out, k, n / 4, 32, Some(&bad)).is_err());
}

#[test]
fn new_validates_sizes_and_scales() {
    let packed = vec![0u8; 128 / 4 + 32];
    assert!(TernaryMatrix::new(TernaryLayout::I2S, 1, 128, &packed[..60], None).is_err());
    assert!(TernaryMatrix::new(TernaryLayout::I2S, 1, 128, &packed, Some(&[0u8; 4])).is_err());
    assert!(TernaryMatrix::new(TernaryLayout::I2S, 1, 96, &packed, None).is_err());
    let q = vec![0u8; 64];
    assert!(TernaryMatrix::new(TernaryLayout::Qk256, 1, 256, &q, Some(&[0u8; 3])).is_err());
    assert!(TernaryMatrix::new(TernaryLayout::Qk256, 1, 256, &q, Some(&[0u8; 4])).is_ok());
    let m = TernaryMatrix::new(TernaryLayout::I2S, 1, 128, &packed, None).unwrap();
    let mut row = vec![0f32; 128];
    assert!(m.dequantize_row(1, &mut row).is_err());
    assert!(m.dequantize_row(0, &mut row[..5]).is_err());
}

/// `first_non_finite_scale` names the first NaN or infinite block scale, row-major, in every
/// layout that has scales; finite ones (zero included) pass.
#[test]
fn first_non_finite_scale_in_every_layout() {
    let mut rng = Rng::new(8);
    let (n_out, k) = (3, 768);
    let v = ternary(&mut rng, n_out * k);
    let v4: Vec<i8> = (0..n_out * k).map(|_| qk256::LUT[rng.below(4)]).collect();
    // The layout's bytes and sibling scale tensor for `scales`.
    let pack = |layout: TernaryLayout, scales: &[f32]| match layout {
        TernaryLayout::Tq2_0 => (tq2_0::pack(&v, scales).unwrap(), None),
        TernaryLayout::Tq1_0 => (tq1_0::pack(&v, scales).unwrap(), None),
        TernaryLayout::BitNet32F16 => (seq32::pack_inline(&v, scales).unwrap(), None),
        TernaryLayout::Split32WithSibling => {
            let (p, s) = seq32::pack_split(&v, scales).unwrap();
            (p, Some(s))
        }
        _ => {
            let s: Vec<u8> = scales.iter().flat_map(|x| x.to_le_bytes()).collect();
            (qk256::pack(&v4, k).unwrap(), Some(s))
        }
    };
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        // I2_S: the one tensor scale.
        for (beta, want) in [(0.0, None), (0.5, None), (bad, Some(0))] {
            let packed = i2s::pack_values(&v, beta).unwrap();
            let m = TernaryMatrix::new(TernaryLayout::I2S, n_out, k, &packed, None).unwrap();
            assert_eq!(m.first_non_finite_scale(), want, "I2_S {beta}");
        }
        for (block_size, layouts) in [
            (
                256,
                &[
                    TernaryLayout::Tq2_0,
                    TernaryLayout::Tq1_0,
                    TernaryLayout::Qk256,
                ][..],
            ),
            (
                32,
                &[
                    TernaryLayout::BitNet32F16,
                    TernaryLayout::Split32WithSibling,
                ][..],
            ),
        ] {
            let nb = n_out * k / block_size;
            for at in [0, nb / 2 + 1, nb - 1] {
                let mut scales: Vec<f32> = (0..nb).map(|i| 0.25 * (i % 4) as f32).collect();
                for &layout in layouts {
                    scales[at] = bad;
                    let (packed, sibling) = pack(layout, &scales);
                    let m =
                        TernaryMatrix::new(layout, n_out, k, &packed, sibling.as_deref()).unwrap();
                    assert_eq!(
                        m.first_non_finite_scale(),
                        Some(at),
                        "{layout:?} {bad} at {at}"
                    );
                    scales[at] = 1.0;
                    let (packed, sibling) = pack(layout, &scales);
                    let m =
                        TernaryMatrix::new(layout, n_out, k, &packed, sibling.as_deref()).unwrap();
                    assert_eq!(m.first_non_finite_scale(), None, "{layout:?} finite");
                }
            }
        }
    }
}
