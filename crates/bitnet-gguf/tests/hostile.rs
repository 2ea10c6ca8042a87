//! docs/RELIABILITY.md §4 A: every GGUF container attack yields a specific typed error, never a
//! panic, an abort or an unbounded allocation. Files are assembled by hand from the spec.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

mod common;

use bitnet_gguf::{GgmlType, GgufError as E, GgufFile, GgufWriter, Limits, Value};
use common::*;

// ---------------------------------------------------------------- 1. empty, prefixes, garbage

/// A small valid file whose last tensor ends exactly at the end of the file, so every strict
/// prefix is invalid. Holds an I2_S tensor in the middle and a string array.
fn small_valid() -> Vec<u8> {
    let mut w = GgufWriter::new(Vec::new(), 32).unwrap();
    w.add_kv("general.architecture", "bitnet-b1.58".into())
        .unwrap();
    w.add_kv(
        "tokenizer.ggml.tokens",
        Value::Array(vec!["a".to_string(), "bc".to_string()].into()),
    )
    .unwrap();
    w.add_kv("flag", Value::Bool(true)).unwrap();
    w.add_kv("eps", Value::F32(1e-5)).unwrap();
    w.add_tensor("norm", &[8], 0, 32).unwrap();
    w.add_tensor("w", &[128, 1], 36, 64).unwrap();
    w.add_tensor("emb", &[16, 2], 1, 64).unwrap();
    w.write_header().unwrap();
    w.write_tensor_data("norm", &[0x3f; 32]).unwrap();
    w.write_tensor_data("w", &[0x55; 64]).unwrap();
    w.write_tensor_data("emb", &[0x11; 64]).unwrap();
    w.finish().unwrap()
}

#[test]
fn empty_file() {
    assert_err!(
        GgufFile::from_bytes(Vec::new(), &Limits::default()),
        E::Truncated {
            what: "magic",
            offset: 0
        }
    );
}

#[test]
fn every_prefix_fails_cleanly() {
    let bytes = small_valid();
    GgufFile::from_bytes(bytes.clone(), &Limits::default()).unwrap();
    for len in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..len].to_vec(), &Limits::default());
        assert!(
            matches!(
                r,
                Err(E::Truncated { .. } | E::CountTooLarge { .. } | E::TensorOutOfBounds { .. })
            ),
            "prefix {len}: {r:?}"
        );
    }
}

#[test]
fn trailing_garbage_is_accepted_and_counted_as_available() {
    let mut bytes = small_valid();
    bytes.extend_from_slice(&[0xAB; 100]);
    let f = GgufFile::from_bytes(bytes, &Limits::default()).unwrap();
    let emb = f.tensor("emb").unwrap();
    assert_eq!(emb.available, 164);
    assert_eq!(f.tensor_data(emb).unwrap(), &[0x11; 64]);
}

#[test]
fn flipping_any_header_byte_never_panics() {
    let bytes = small_valid();
    let data_offset = GgufFile::from_bytes(bytes.clone(), &Limits::default())
        .unwrap()
        .data_offset() as usize;
    let mut outcomes = [0usize; 2];
    for i in 0..data_offset {
        for mask in [0x01u8, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xFF] {
            let mut b = bytes.clone();
            b[i] ^= mask;
            let r = GgufFile::from_bytes(b, &Limits::default());
            outcomes[usize::from(r.is_ok())] += 1;
            if let Ok(f) = r {
                // Whatever parsed must be internally consistent and readable.
                for t in f.tensors() {
                    assert!(f.tensor_bytes(t).is_ok());
                    let _ = f.tensor_data(t);
                }
            }
        }
    }
    // Some flips land in values (still valid), most in structure (errors).
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}

// ---------------------------------------------------------------- 2. magic and version

#[test]
fn bad_magic() {
    let mut r = Raw::header(3, 0, 0);
    r.0[..4].copy_from_slice(b"GGML");
    assert_err!(r.parse(), E::BadMagic);
}

#[test]
fn versions() {
    assert_err!(Raw::header(0, 0, 0).parse(), E::UnsupportedVersion(0));
    assert_err!(Raw::header(1, 0, 0).parse(), E::UnsupportedVersion(1));
    assert_err!(Raw::header(4, 0, 0).parse(), E::UnsupportedVersion(4));
    assert_err!(
        Raw::header(u32::MAX, 0, 0).parse(),
        E::UnsupportedVersion(u32::MAX)
    );
    assert_eq!(Raw::header(2, 0, 0).parse().unwrap().version(), 2);
    assert_eq!(Raw::header(3, 0, 0).parse().unwrap().version(), 3);
    // Big-endian file: version 3 and counts stored byte-swapped.
    let mut be = b"GGUF".to_vec();
    be.extend_from_slice(&3u32.to_be_bytes());
    be.extend_from_slice(&0u64.to_be_bytes());
    be.extend_from_slice(&0u64.to_be_bytes());
    assert_err!(GgufFile::from_bytes(be, &Limits::default()), E::BigEndian);
    let mut be2 = Raw::header(0, 0, 0);
    be2.0[4..8].copy_from_slice(&2u32.to_be_bytes());
    assert_err!(be2.parse(), E::BigEndian);
}

// ---------------------------------------------------------------- 3. counts

#[test]
fn huge_counts() {
    for n in [1u64 << 63, u64::MAX, 1 << 40, 3] {
        assert_err!(Raw::header(3, 0, n).parse(), E::CountTooLarge { what: "metadata key-value", count } if *count == n);
        assert_err!(Raw::header(3, n, 0).parse(), E::CountTooLarge { what: "tensor", count } if *count == n);
    }
    // count × minimum entry size > file size, though the count itself is small.
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("a", 1); // room for one entry only
    assert_err!(r.parse(), E::CountTooLarge { .. });
    // Within the file but over the configured limits.
    let mut r = Raw::header(3, 0, 3);
    r.kv_u32("a", 1).kv_u32("b", 1).kv_u32("c", 1);
    let lim = Limits {
        max_kv: 2,
        ..Limits::default()
    };
    assert_err!(
        r.parse_with(&lim),
        E::LimitExceeded {
            value: 3,
            limit: 2,
            ..
        }
    );
    let r = with_tensors(
        2,
        &[info(b"a", &[8], G_F32, 0), info(b"b", &[8], G_F32, 32)].concat(),
        64,
    );
    r.parse().unwrap();
    let lim = Limits {
        max_tensors: 1,
        ..Limits::default()
    };
    assert_err!(
        r.parse_with(&lim),
        E::LimitExceeded {
            what: "tensor count",
            value: 2,
            limit: 1
        }
    );
}

// ---------------------------------------------------------------- 4. keys

#[test]
fn keys() {
    // Length 0.
    assert_err!(with_kvs(1, &kv_raw(b"", T_U8, &[1])).parse(), E::KeyEmpty);
    // Length beyond the remaining bytes.
    let mut r = Raw::header(3, 0, 1);
    r.u64(1000).bytes(b"abc").u32(T_U8).u8(0).zeros(8);
    assert_err!(
        r.parse(),
        E::Truncated {
            what: "metadata key",
            ..
        }
    );
    // Length 2^64−1.
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).zeros(20);
    assert_err!(r.parse(), E::StringTooLong { len: u64::MAX, .. });
    // Within the file but above the configured limit.
    let lim = Limits {
        max_string_len: 4,
        ..Limits::default()
    };
    assert_err!(
        with_kvs(1, &kv_raw(b"abcde", T_U8, &[1])).parse_with(&lim),
        E::StringTooLong {
            len: 5,
            limit: 4,
            ..
        }
    );
    // Not UTF-8.
    assert_err!(
        with_kvs(1, &kv_raw(b"k\xff", T_U8, &[1])).parse(),
        E::InvalidUtf8 {
            what: "metadata key"
        }
    );
    // Duplicate.
    let kvs = [
        kv_raw(b"k", T_U8, &[1]),
        kv_raw(b"j", T_U8, &[1]),
        kv_raw(b"k", T_U32, &[0; 4]),
    ]
    .concat();
    assert_err!(with_kvs(3, &kvs).parse(), E::DuplicateKey(k) if k == "k");
    // Non-UTF-8 string value.
    let mut v = Raw::default();
    v.str(b"\xc3\x28");
    assert_err!(
        with_kvs(1, &kv_raw(b"s", T_STRING, &v.0)).parse(),
        E::InvalidUtf8 {
            what: "string value"
        }
    );
}

// ---------------------------------------------------------------- 5. values and arrays

fn array(elem: u32, count: u64, body: &[u8]) -> Vec<u8> {
    let mut r = Raw::default();
    r.u32(elem).u64(count).bytes(body);
    r.0
}

#[test]
fn value_types() {
    for ty in [13u32, 14, 255, 0xFFFF_FFFF] {
        assert_err!(with_kvs(1, &kv_raw(b"k", ty, &[0; 8])).parse(), E::BadValueType(t) if *t == ty);
        // Also as an array element type.
        assert_err!(with_kvs(1, &kv_raw(b"k", T_ARRAY, &array(ty, 1, &[0; 8]))).parse(), E::BadValueType(t) if *t == ty);
    }
    // Bool stored as 2 (scalar and in an array).
    assert_err!(
        with_kvs(1, &kv_raw(b"b", T_BOOL, &[2])).parse(),
        E::BadBool(2)
    );
    assert_err!(
        with_kvs(1, &kv_raw(b"b", T_ARRAY, &array(T_BOOL, 3, &[1, 0, 0xFF]))).parse(),
        E::BadBool(0xFF)
    );
    // Scalar cut off by the end of file.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"k").u32(T_U64).bytes(&[1, 2, 3]);
    assert_err!(
        r.parse(),
        E::Truncated {
            what: "u64 value",
            ..
        }
    );
}

#[test]
fn array_lengths() {
    // 2^63 elements: above the default limit.
    assert_err!(with_kvs(1, &kv_raw(b"a", T_ARRAY, &array(T_U8, 1 << 63, &[]))).parse(), E::ArrayTooLong { len, .. } if *len == 1 << 63);
    // With no length limit, the bytes-remaining check still refuses before allocating.
    let unlimited = Limits {
        max_array_len: u64::MAX,
        ..Limits::default()
    };
    for (elem, count) in [
        (T_U8, 1u64 << 63),
        (T_U64, 1 << 61),
        (T_U64, u64::MAX / 4),
        (T_ARRAY, u64::MAX),
    ] {
        let kv = kv_raw(b"a", T_ARRAY, &array(elem, count, &[0; 16]));
        assert_err!(
            with_kvs(1, &kv).parse_with(&unlimited),
            E::Truncated {
                what: "array elements",
                ..
            }
        );
    }
    // String array whose count × 8 exceeds the bytes left (each string needs an 8-byte length).
    let body = [0u8; 100];
    let kv = kv_raw(b"a", T_ARRAY, &array(T_STRING, 40, &body));
    let r = with_kvs(1, &kv);
    assert!(r.0.len() < 40 * 8);
    assert_err!(
        r.parse(),
        E::Truncated {
            what: "array elements",
            ..
        }
    );
    // String element longer than the file.
    let mut s = Raw::default();
    s.u64(1 << 20).bytes(b"xy");
    assert_err!(
        with_kvs(1, &kv_raw(b"a", T_ARRAY, &array(T_STRING, 1, &s.0))).parse(),
        E::Truncated {
            what: "string array element",
            ..
        }
    );
    // Allocation budget: 1000 u32 = 4000 bytes > 1024.
    let lim = Limits {
        max_alloc: 1024,
        ..Limits::default()
    };
    let kv = kv_raw(b"a", T_ARRAY, &array(T_U32, 1000, &[0; 4000]));
    with_kvs(1, &kv).parse().unwrap();
    assert_err!(
        with_kvs(1, &kv).parse_with(&lim),
        E::LimitExceeded {
            what: "metadata allocation",
            limit: 1024,
            ..
        }
    );
    // Many small strings are charged for their String headers too (24 bytes each).
    let mut strings = Raw::default();
    for _ in 0..100 {
        strings.str(b"");
    }
    let kv = kv_raw(b"a", T_ARRAY, &array(T_STRING, 100, &strings.0));
    with_kvs(1, &kv).parse().unwrap();
    assert_err!(with_kvs(1, &kv).parse_with(&lim), E::LimitExceeded { .. });
}

#[test]
fn nested_arrays_are_depth_capped() {
    // depth-d nesting of empty u8 arrays: [[[...[u8; 0]...]]]
    fn nest(d: u32) -> Vec<u8> {
        let mut r = Raw::default();
        for _ in 1..d {
            r.u32(T_ARRAY).u64(1);
        }
        r.u32(T_U8).u64(0);
        r.0
    }
    let lim = Limits {
        max_array_depth: 3,
        ..Limits::default()
    };
    for d in 1..=3 {
        let f = with_kvs(1, &kv_raw(b"a", T_ARRAY, &nest(d)))
            .parse_with(&lim)
            .unwrap();
        let mut a = f.metadata().get_array("a").unwrap();
        for _ in 1..d {
            match a {
                bitnet_gguf::Array::Array(v) => a = &v[0],
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(a, &bitnet_gguf::Array::U8(vec![]));
    }
    assert_err!(
        with_kvs(1, &kv_raw(b"a", T_ARRAY, &nest(4))).parse_with(&lim),
        E::ArrayNestingTooDeep { limit: 3 }
    );
    // Deep enough to overflow the stack if nesting were unbounded; capped at the default.
    let deep = nest(100_000);
    assert_err!(
        with_kvs(1, &kv_raw(b"a", T_ARRAY, &deep)).parse(),
        E::ArrayNestingTooDeep { .. }
    );
    // max_array_depth 0 forbids arrays altogether.
    let none = Limits {
        max_array_depth: 0,
        ..Limits::default()
    };
    assert_err!(
        with_kvs(1, &kv_raw(b"a", T_ARRAY, &nest(1))).parse_with(&none),
        E::ArrayNestingTooDeep { limit: 0 }
    );
}

// ---------------------------------------------------------------- 6. alignment

fn with_alignment_kv(ty: u32, value: &[u8]) -> Raw {
    with_kvs(1, &kv_raw(b"general.alignment", ty, value))
}

#[test]
fn alignment() {
    assert_err!(
        with_alignment_kv(T_U32, &0u32.to_le_bytes()).parse(),
        E::BadAlignment { value: 0, .. }
    );
    assert_err!(
        with_alignment_kv(T_U32, &3u32.to_le_bytes()).parse(),
        E::BadAlignment { value: 3, .. }
    );
    assert_err!(with_alignment_kv(T_U32, &(1u32 << 31).to_le_bytes()).parse(), E::BadAlignment { value, .. } if *value == 1 << 31);
    // Wrong types.
    assert_err!(
        with_alignment_kv(T_I32, &32i32.to_le_bytes()).parse(),
        E::WrongType {
            expected: "u32",
            found: "i32",
            ..
        }
    );
    assert_err!(
        with_alignment_kv(T_U64, &(1u64 << 63).to_le_bytes()).parse(),
        E::WrongType { found: "u64", .. }
    );
    let mut s = Raw::default();
    s.str(b"32");
    assert_err!(
        with_alignment_kv(T_STRING, &s.0).parse(),
        E::WrongType {
            found: "string",
            ..
        }
    );
    // Valid: 32 and 16 explicitly.
    assert_eq!(
        with_alignment_kv(T_U32, &32u32.to_le_bytes())
            .parse()
            .unwrap()
            .alignment(),
        32
    );
    let f = with_alignment_kv(T_U32, &16u32.to_le_bytes())
        .parse()
        .unwrap();
    assert_eq!(f.alignment(), 16);
}

// ---------------------------------------------------------------- 7. tensor names

fn one_tensor(name: &[u8]) -> Raw {
    with_tensors(1, &info(name, &[8], G_F32, 0), 32)
}

#[test]
fn tensor_names() {
    assert_err!(one_tensor(b"").parse(), E::NameEmpty);
    one_tensor(&[b'n'; 63]).parse().unwrap();
    assert_err!(
        one_tensor(&[b'n'; 64]).parse(),
        E::NameTooLong { len: 64, limit: 64 }
    );
    // A huge length prefix is refused by the name limit before any read.
    let mut r = Raw::header(3, 1, 0);
    r.u64(u64::MAX).zeros(40);
    assert_err!(r.parse(), E::NameTooLong { len: u64::MAX, .. });
    assert_err!(
        one_tensor(b"w\xfe").parse(),
        E::InvalidUtf8 {
            what: "tensor name"
        }
    );
    let infos = [
        info(b"a", &[8], G_F32, 0),
        info(b"b", &[8], G_F32, 32),
        info(b"a", &[8], G_F32, 64),
    ]
    .concat();
    assert_err!(with_tensors(3, &infos, 96).parse(), E::DuplicateTensor { name, first: 0, second: 2 } if name == "a");
}

// ---------------------------------------------------------------- 8. dimensions

fn dims_case(n_dims: u32, dims: &[u64], ty: u32) -> Raw {
    let mut t = Raw::default();
    t.str(b"t").u32(n_dims);
    for &d in dims {
        t.u64(d);
    }
    t.u32(ty).u64(0);
    with_tensors(1, &t.0, 64)
}

#[test]
fn dimensions() {
    assert_err!(dims_case(0, &[], G_F32).parse(), E::BadDims { .. });
    assert_err!(dims_case(5, &[1; 5], G_F32).parse(), E::BadDims { .. });
    assert_err!(
        dims_case(0xFFFF_FFFF, &[1; 8], G_F32).parse(),
        E::BadDims { .. }
    );
    dims_case(4, &[2, 2, 2, 2], G_F32).parse().unwrap();
    assert_err!(
        dims_case(2, &[4, 0], G_F32).parse(),
        E::ZeroDim { axis: 1, .. }
    );
    // ≥ 2^63: negative as i64.
    assert_err!(
        dims_case(2, &[1 << 63, 1], G_F32).parse(),
        E::BadDims { .. }
    );
    assert_err!(dims_case(1, &[u64::MAX], G_F32).parse(), E::BadDims { .. });
    // Product overflows u64; product overflows i64 but not u64.
    assert_err!(
        dims_case(2, &[1 << 33, 1 << 33], G_F32).parse(),
        E::ShapeOverflow { .. }
    );
    assert_err!(
        dims_case(2, &[1 << 62, 2], G_F32).parse(),
        E::ShapeOverflow { .. }
    );
    assert_err!(
        dims_case(4, &[1 << 16, 1 << 16, 1 << 16, 1 << 16], G_I2S).parse(),
        E::ShapeOverflow { .. }
    );
    // Elements fit i64 but bytes wrap to exactly 0 mod 2^64: 2^62 F32 elements = 2^64 bytes.
    assert_err!(
        dims_case(2, &[1 << 31, 1 << 31], G_F32).parse(),
        E::ShapeOverflow { .. }
    );
    // llama.cpp#18674-style: 2^42+1 rows of a wide type.
    assert_err!(
        dims_case(2, &[(1 << 42) + 1, 1 << 21], G_F32).parse(),
        E::ShapeOverflow { .. }
    );
    // Valid shape but far larger than the data: out of bounds, not an allocation.
    assert_err!(
        dims_case(2, &[1 << 30, 1 << 20], G_F32).parse(),
        E::TensorOutOfBounds { .. }
    );
    // Dimension list cut off by the end of file.
    let mut r = Raw::header(3, 1, 0);
    r.str(b"t").u32(4).u64(1).u64(1).bytes(&[1; 4]);
    assert_err!(
        r.parse(),
        E::Truncated {
            what: "tensor dimension",
            ..
        }
    );
    // Per-limit: max_dims 2.
    let lim = Limits {
        max_dims: 2,
        ..Limits::default()
    };
    assert_err!(
        dims_case(3, &[2, 2, 2], G_F32).parse_with(&lim),
        E::BadDims { .. }
    );
    // With the dims cap lifted, a huge n_dims is still refused before allocating.
    let lim = Limits {
        max_dims: usize::MAX,
        ..Limits::default()
    };
    assert_err!(
        dims_case(0xFFFF_FFFF, &[1; 8], G_F32).parse_with(&lim),
        E::Truncated {
            what: "tensor dimension",
            ..
        }
    );
}

// ---------------------------------------------------------------- 9. types

fn typed(ty: u32, dims: &[u64], arch: Option<&str>, data: usize) -> Raw {
    let mut r = Raw::header(3, 1, u64::from(arch.is_some()));
    if let Some(a) = arch {
        r.kv_str("general.architecture", a);
    }
    r.tensor(b"t", dims, ty, 0).pad(32).zeros(data);
    r
}

#[test]
fn unknown_type_opens_but_data_errors() {
    for id in [31u32, 37, 40, 1000, u32::MAX] {
        let f = typed(id, &[16], None, 64).parse().unwrap();
        let t = &f.tensors()[0];
        assert_eq!(t.ggml_type, GgmlType::Unknown(id));
        assert_eq!(t.type_id, id);
        assert_eq!(f.tensor_bytes(t).unwrap().len(), 64);
        assert_err!(f.tensor_data(t), E::UnsupportedType { tensor, type_name: "UNKNOWN", type_id } if tensor == "t" && *type_id == id);
    }
}

#[test]
fn fork_type_ids_depend_on_context() {
    // 39: MXFP4 upstream (32-element blocks of 17 bytes), TL2 in bitnet.cpp files.
    let f = typed(39, &[64], Some("llama"), 64).parse().unwrap();
    assert_eq!(f.tensors()[0].ggml_type, GgmlType::MXFP4);
    assert_eq!(f.tensor_data(&f.tensors()[0]).unwrap().len(), 34);
    assert_err!(
        typed(39, &[48], Some("llama"), 64).parse(),
        E::BadDims { .. }
    );
    for arch in ["bitnet", "bitnet-b1.58", "bitnet-25"] {
        let f = typed(39, &[48], Some(arch), 64).parse().unwrap();
        let t = &f.tensors()[0];
        assert_eq!(t.ggml_type, GgmlType::TL2);
        assert_err!(
            f.tensor_data(t),
            E::UnsupportedType {
                type_name: "TL2",
                type_id: 39,
                ..
            }
        );
        let f = typed(38, &[48], Some(arch), 64).parse().unwrap();
        assert_eq!(f.tensors()[0].ggml_type, GgmlType::TL1);
    }
    // general.file_type = 40 (mostly I2_S in the fork) also selects the BitNet numbering.
    let mut r = Raw::header(3, 1, 2);
    r.kv_str("general.architecture", "llama")
        .kv_u32("general.file_type", 40);
    r.tensor(b"t", &[64], 39, 0).pad(32).zeros(64);
    assert_eq!(r.parse().unwrap().tensors()[0].ggml_type, GgmlType::TL2);
    // 38 outside a BitNet context is a retired upstream id: unknown.
    assert_eq!(
        typed(38, &[64], None, 64).parse().unwrap().tensors()[0].ggml_type,
        GgmlType::Unknown(38)
    );
    // 36 is I2_S in every context.
    assert_eq!(
        typed(36, &[128], None, 64).parse().unwrap().tensors()[0].ggml_type,
        GgmlType::I2S
    );
}

#[test]
fn type_shape_compatibility() {
    assert_err!(
        typed(G_Q4_0, &[33, 2], None, 128).parse(),
        E::BadDims { .. }
    );
    typed(G_Q4_0, &[64, 2], None, 160).parse().unwrap();
    // Q4_K: ne[0] must be a multiple of 256.
    assert_err!(typed(12, &[128, 2], None, 288).parse(), E::BadDims { .. });
    // I2_S: element count must be a multiple of 4 (no block constraint on ne[0]).
    assert_err!(typed(G_I2S, &[6, 1], None, 64).parse(), E::BadDims { .. });
    typed(G_I2S, &[4, 3], None, 64).parse().unwrap();
}

#[test]
fn i2s_sizes_are_bounds_checked_not_required() {
    // 256 elements: bitnet.cpp's I2_S needs 64 + 32 = 96 bytes; QK256 needs 64.
    // A 64-byte tensor followed by another tensor parses (layout detection is left to the
    // caller), tensor_bytes gives the 64, tensor_data refuses the bitnet.cpp size.
    let infos = [info(b"w", &[256], G_I2S, 0), info(b"n", &[8], G_F32, 64)].concat();
    let f = with_tensors(2, &infos, 96).parse().unwrap();
    let w = f.tensor("w").unwrap();
    assert_eq!(w.available, 64);
    assert_eq!(w.nbytes(), Some(96));
    assert_eq!(f.tensor_bytes(w).unwrap().len(), 64);
    assert_err!(f.tensor_data(w), E::TensorOutOfBounds { needed: 96, .. });
    // Fewer than n/4 bytes fits no ternary layout: overlap.
    let infos = [info(b"w", &[256], G_I2S, 0), info(b"n", &[8], G_F32, 32)].concat();
    assert_err!(
        with_tensors(2, &infos, 64).parse(),
        E::OverlappingTensors { needed: 64, .. }
    );
    // Full bitnet.cpp size with a tail: tensor_data returns exactly n/4 + 32.
    let f = with_tensors(1, &info(b"w", &[256], G_I2S, 0), 128)
        .parse()
        .unwrap();
    assert_eq!(f.tensor_data(&f.tensors()[0]).unwrap().len(), 96);
    assert_eq!(f.tensor_bytes(&f.tensors()[0]).unwrap().len(), 128);
}

// ---------------------------------------------------------------- 10. offsets

#[test]
fn offsets() {
    // Misaligned.
    assert_err!(
        with_tensors(1, &info(b"t", &[8], G_F32, 4), 64).parse(),
        E::MisalignedOffset {
            offset: 4,
            alignment: 32,
            ..
        }
    );
    // Overlapping: a (32 bytes) at 0, b at 0 too (aliasing) and b at 32 with a of 64 bytes.
    let infos = [info(b"a", &[8], G_F32, 0), info(b"b", &[8], G_F32, 0)].concat();
    assert_err!(
        with_tensors(2, &infos, 64).parse(),
        E::OverlappingTensors { .. }
    );
    let infos = [info(b"a", &[16], G_F32, 0), info(b"b", &[8], G_F32, 32)].concat();
    assert_err!(with_tensors(2, &infos, 96).parse(), E::OverlappingTensors { tensor, next, .. } if tensor == "a" && next == "b");
    // Gaps are allowed and counted as available bytes.
    let infos = [info(b"a", &[8], G_F32, 0), info(b"b", &[8], G_F32, 128)].concat();
    let f = with_tensors(2, &infos, 160).parse().unwrap();
    assert_eq!(f.tensor("a").unwrap().available, 128);
    assert_eq!(f.tensor("b").unwrap().available, 32);
    // Out of order is allowed; `available` follows offset order.
    let infos = [
        info(b"late", &[8], G_F32, 64),
        info(b"early", &[16], G_F32, 0),
    ]
    .concat();
    let f = with_tensors(2, &infos, 96).parse().unwrap();
    assert_eq!(f.tensors()[0].name, "late");
    assert_eq!(f.tensor("early").unwrap().available, 64);
    assert_eq!(f.tensor("late").unwrap().available, 32);
    // Beyond EOF.
    assert_err!(
        with_tensors(1, &info(b"t", &[8], G_F32, 1 << 20), 64).parse(),
        E::TensorOutOfBounds { .. }
    );
    // offset + size overflows u64.
    let off = u64::MAX - 31;
    assert_err!(
        with_tensors(1, &info(b"t", &[64], G_F32, off), 64).parse(),
        E::TensorOutOfBounds { .. }
    );
    // Data section shorter than declared.
    assert_err!(
        with_tensors(1, &info(b"t", &[64], G_F32, 0), 255).parse(),
        E::TensorOutOfBounds {
            needed: 256,
            data_len: 255,
            ..
        }
    );
    // File ends inside the padding before the data section.
    let mut r = Raw::header(3, 1, 0);
    r.tensor(b"t", &[8], G_F32, 0);
    assert_err!(
        r.parse(),
        E::Truncated {
            what: "padding before tensor data",
            ..
        }
    );
}

#[test]
fn configured_limits_are_enforced() {
    let bytes = small_valid();
    let lim = Limits {
        max_file_size: bytes.len() as u64 - 1,
        ..Limits::default()
    };
    assert_err!(
        GgufFile::from_bytes(bytes.clone(), &lim),
        E::LimitExceeded {
            what: "file size",
            ..
        }
    );
    let lim = Limits {
        max_alignment: 16,
        ..Limits::default()
    };
    assert_err!(
        with_alignment_kv(T_U32, &32u32.to_le_bytes()).parse_with(&lim),
        E::BadAlignment { value: 32, .. }
    );
    let lim = Limits {
        max_name_len: 4,
        ..Limits::default()
    };
    assert_err!(
        one_tensor(b"abcd").parse_with(&lim),
        E::NameTooLong { len: 4, limit: 4 }
    );
    one_tensor(b"abc").parse_with(&lim).unwrap();
}
