//! ggml type table checked against the block structs of ggml-common.h (QK_K = 256), written
//! here as sums of the struct members, and the id numbering of ggml.h / bitnet.cpp's fork.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use bitnet_gguf::GgmlType as G;

const QK_K: u64 = 256;
const F16: u64 = 2;

#[test]
fn block_sizes_follow_ggml_common_h() {
    #[rustfmt::skip]
    let table: &[(G, u64, u64)] = &[
        (G::F32, 1, 4),
        (G::F16, 1, 2),
        (G::BF16, 1, 2),
        (G::F64, 1, 8),
        (G::I8, 1, 1), (G::I16, 1, 2), (G::I32, 1, 4), (G::I64, 1, 8),
        (G::Q4_0, 32, F16 + 32 / 2),
        (G::Q4_1, 32, 2 * F16 + 32 / 2),
        (G::Q5_0, 32, F16 + 4 + 32 / 2),
        (G::Q5_1, 32, 2 * F16 + 4 + 32 / 2),
        (G::Q8_0, 32, F16 + 32),
        (G::Q8_1, 32, 2 * F16 + 32),
        (G::Q2K, QK_K, QK_K / 16 + QK_K / 4 + 2 * F16),
        (G::Q3K, QK_K, QK_K / 8 + QK_K / 4 + 12 + F16),
        (G::Q4K, QK_K, 2 * F16 + 12 + QK_K / 2),
        (G::Q5K, QK_K, 2 * F16 + 12 + QK_K / 8 + QK_K / 2),
        (G::Q6K, QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + F16),
        (G::Q8K, QK_K, 4 + QK_K + 2 * (QK_K / 16)),
        (G::IQ2XXS, QK_K, F16 + 2 * (QK_K / 8)),
        (G::IQ2XS, QK_K, F16 + 2 * (QK_K / 8) + QK_K / 32),
        (G::IQ2S, QK_K, F16 + QK_K / 4 + QK_K / 32 + QK_K / 32),
        (G::IQ3XXS, QK_K, F16 + 3 * QK_K / 8),
        (G::IQ3S, QK_K, F16 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64),
        (G::IQ1S, QK_K, F16 + QK_K / 8 + 2 * (QK_K / 32)),
        (G::IQ1M, QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
        (G::IQ4NL, 32, F16 + 32 / 2),
        (G::IQ4XS, QK_K, F16 + 2 + QK_K / 64 + QK_K / 2),
        (G::TQ1_0, QK_K, (QK_K - 4 * QK_K / 64) / 5 + QK_K / 64 + F16),
        (G::TQ2_0, QK_K, QK_K / 4 + F16),
        (G::MXFP4, 32, 1 + 32 / 2),
    ];
    for &(t, elems, bytes) in table {
        assert_eq!(t.block_elems(), Some(elems), "{t}");
        assert_eq!(t.block_bytes(), Some(bytes), "{t}");
        assert_eq!(t.nbytes(3 * elems), Some(3 * bytes), "{t}");
        if elems > 1 {
            assert_eq!(t.nbytes(elems + 1), None, "{t}: partial block");
        }
    }
    // docs/FORMATS.md §2 states the ternary block sizes directly.
    assert_eq!(G::TQ2_0.block_bytes(), Some(66));
    assert_eq!(G::TQ1_0.block_bytes(), Some(54));
}

#[test]
fn i2s_size_is_bitnet_cpp_flavor() {
    // docs/FORMATS.md §1: n/4 packed bytes + 32-byte tail; no fixed block.
    assert_eq!(G::I2S.block_elems(), None);
    assert_eq!(G::I2S.nbytes(2560 * 2560), Some(2560 * 2560 / 4 + 32));
    assert_eq!(G::I2S.nbytes(256 * 128), Some(8224)); // testdata/golden/tiny/TENSORS.md attn_k
    assert_eq!(G::I2S.nbytes(6), None);
    for t in [G::TL1, G::TL2, G::Unknown(77)] {
        assert_eq!(t.nbytes(1024), None);
        assert_eq!(t.block_elems(), None);
    }
    assert_eq!(
        G::F32.nbytes(u64::MAX / 2),
        None,
        "overflow is None, not a wrapped size"
    );
}

#[test]
fn ids_and_names() {
    #[rustfmt::skip]
    let upstream: &[(u32, &str)] = &[
        (0, "F32"), (1, "F16"), (2, "Q4_0"), (3, "Q4_1"), (6, "Q5_0"), (7, "Q5_1"), (8, "Q8_0"),
        (9, "Q8_1"), (10, "Q2_K"), (11, "Q3_K"), (12, "Q4_K"), (13, "Q5_K"), (14, "Q6_K"),
        (15, "Q8_K"), (16, "IQ2_XXS"), (17, "IQ2_XS"), (18, "IQ3_XXS"), (19, "IQ1_S"),
        (20, "IQ4_NL"), (21, "IQ3_S"), (22, "IQ2_S"), (23, "IQ4_XS"), (24, "I8"), (25, "I16"),
        (26, "I32"), (27, "I64"), (28, "F64"), (29, "IQ1_M"), (30, "BF16"), (34, "TQ1_0"),
        (35, "TQ2_0"), (36, "I2_S"), (39, "MXFP4"),
    ];
    for &(id, name) in upstream {
        let t = G::from_id(id, false);
        assert_eq!(t.name(), name);
        assert_eq!(t.id(), id);
    }
    for id in [4, 5, 31, 32, 33, 37, 38, 40, 41, u32::MAX] {
        assert_eq!(G::from_id(id, false), G::Unknown(id));
        assert_eq!(G::from_id(id, false).id(), id);
        assert_eq!(G::from_id(id, false).name(), "UNKNOWN");
    }
    // bitnet.cpp's fork: 36 = I2_S, 38 = TL1, 39 = TL2 (37 = I8_S is runtime-only).
    assert_eq!(G::from_id(36, true), G::I2S);
    assert_eq!(G::from_id(38, true), G::TL1);
    assert_eq!(G::from_id(39, true), G::TL2);
    assert_eq!(G::from_id(37, true), G::Unknown(37));
    assert_eq!(G::TL2.id(), 39);
    assert_eq!(G::TL1.name(), "TL1");
    assert_eq!(G::from_id(0, true), G::F32);
    assert_eq!(format!("{}", G::Unknown(99)), "UNKNOWN(99)");
    assert_eq!(format!("{}", G::Q4K), "Q4_K");
}
