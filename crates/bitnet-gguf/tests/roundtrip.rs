//! Writer → reader round trips, and the writer's bytes checked against a hand-assembled file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

mod common;

use bitnet_gguf::{Array, GgmlType, GgufError, GgufFile, GgufWriter, Limits, Value};
use common::Raw;

fn parse(bytes: Vec<u8>) -> GgufFile {
    GgufFile::from_bytes(bytes, &Limits::default()).unwrap()
}

fn every_value() -> Vec<(String, Value)> {
    let nested = Array::Array(vec![
        Array::U8(vec![1, 2, 3]),
        Array::String(vec!["a".into(), "".into()]),
        Array::Array(vec![Array::F64(vec![1.5, -2.25]), Array::Bool(vec![])]),
        Array::I64(vec![]),
    ]);
    let kvs: Vec<(&str, Value)> = vec![
        ("u8", Value::U8(255)),
        ("i8", Value::I8(-128)),
        ("u16", Value::U16(65535)),
        ("i16", Value::I16(-32768)),
        ("u32", Value::U32(u32::MAX)),
        ("i32", Value::I32(i32::MIN)),
        ("f32", Value::F32(-1.25e-7)),
        ("f32.inf", Value::F32(f32::INFINITY)),
        ("bool.t", Value::Bool(true)),
        ("bool.f", Value::Bool(false)),
        ("string", Value::String("héllo ⟨wörld⟩ 🦀".into())),
        ("string.empty", Value::String(String::new())),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f64", Value::F64(std::f64::consts::PI)),
        ("arr.u8", Value::Array(Array::U8(vec![0, 1, 255]))),
        ("arr.i8", Value::Array(Array::I8(vec![-1, 0, 127]))),
        ("arr.u16", Value::Array(Array::U16(vec![0, 65535]))),
        ("arr.i16", Value::Array(Array::I16(vec![-2, 2]))),
        ("arr.u32", Value::Array(Array::U32(vec![7, u32::MAX]))),
        ("arr.i32", Value::Array(Array::I32(vec![-7, i32::MAX]))),
        (
            "arr.f32",
            Value::Array(Array::F32(vec![0.5, -0.0, f32::MAX])),
        ),
        (
            "arr.bool",
            Value::Array(Array::Bool(vec![true, false, true])),
        ),
        (
            "arr.string",
            Value::Array(Array::String(vec!["x".into(), "".into(), "ĠĠ ĠĠ".into()])),
        ),
        ("arr.u64", Value::Array(Array::U64(vec![u64::MAX, 0]))),
        ("arr.i64", Value::Array(Array::I64(vec![i64::MIN, 1]))),
        ("arr.f64", Value::Array(Array::F64(vec![1e300, -1e-300]))),
        ("arr.empty", Value::Array(Array::U32(vec![]))),
        ("arr.nested", Value::Array(nested)),
    ];
    kvs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

#[test]
fn every_value_type_round_trips_in_order() {
    let kvs = every_value();
    let mut w = GgufWriter::new(Vec::new(), 32).unwrap();
    for (k, v) in &kvs {
        w.add_kv(k, v.clone()).unwrap();
    }
    let bytes = w.finish().unwrap();
    let f = parse(bytes);
    assert_eq!(f.version(), 3);
    assert_eq!(f.metadata().len(), kvs.len());
    let got: Vec<(String, Value)> = f
        .metadata()
        .iter()
        .map(|(k, v)| (k.to_owned(), v.clone()))
        .collect();
    assert_eq!(got, kvs);
    // -0.0 == 0.0 under PartialEq: check the sign bit survived too.
    let a = f.metadata().get_f32_array("arr.f32").unwrap();
    assert_eq!(a[1].to_bits(), (-0.0f32).to_bits());
    for (k, v) in &kvs {
        assert_eq!(f.metadata().get(k), Some(v));
    }
    assert!(f.tensors().is_empty());
}

/// The writer's output for a small file equals bytes assembled by hand from the spec.
#[test]
fn writer_bytes_match_spec() {
    let mut w = GgufWriter::new(Vec::new(), 32).unwrap();
    w.add_kv("general.architecture", Value::String("x".into()))
        .unwrap();
    w.add_kv("n", Value::U32(7)).unwrap();
    w.add_tensor("a", &[3], 0, 12).unwrap();
    w.add_tensor("b", &[2, 1], 1, 4).unwrap();
    w.write_header().unwrap();
    w.write_tensor_data("a", &[1; 12]).unwrap();
    w.write_tensor_data("b", &[2; 4]).unwrap();
    let got = w.finish().unwrap();

    let mut r = Raw::header(3, 2, 2);
    r.kv_str("general.architecture", "x").kv_u32("n", 7);
    r.tensor(b"a", &[3], 0, 0).tensor(b"b", &[2, 1], 1, 32);
    r.pad(32);
    r.fill(12, 1).pad(32).fill(4, 2).pad(32);
    assert_eq!(got, r.0);
}

#[test]
fn tensors_round_trip_with_alignment_and_chunks() {
    let align = 64;
    let a: Vec<u8> = (0..4 * 10).map(|i| i as u8).collect(); // F32 [5, 2]
    let q: Vec<u8> = (0..18 * 4).map(|i| (i * 7) as u8).collect(); // Q4_0 [64, 2]: 4 blocks
    let s: Vec<u8> = (0..(128 * 2 / 4 + 32)).map(|i| (i * 3) as u8).collect(); // I2_S [128, 2]
    let mut w = GgufWriter::new(Vec::new(), align).unwrap();
    w.add_kv("general.architecture", "bitnet-b1.58".into())
        .unwrap();
    w.add_tensor("a", &[5, 2], 0, a.len() as u64).unwrap();
    w.add_tensor("q", &[64, 2], 2, q.len() as u64).unwrap();
    w.add_tensor("s", &[128, 2], 36, s.len() as u64).unwrap();
    w.write_header().unwrap();
    w.write_tensor_data("a", &a).unwrap();
    for chunk in q.chunks(5) {
        w.write_tensor_chunk("q", chunk).unwrap();
    }
    w.write_tensor_chunk("s", &s[..1]).unwrap();
    w.write_tensor_chunk("s", &s[1..]).unwrap();
    let bytes = w.finish().unwrap();
    assert_eq!(bytes.len() % align as usize, 0);

    let f = parse(bytes);
    assert_eq!(f.alignment(), align);
    assert_eq!(f.metadata().get_u32("general.alignment").unwrap(), 64);
    // general.alignment is written first.
    assert_eq!(f.metadata().iter().next().unwrap().0, "general.alignment");
    assert_eq!(f.data_offset() % align, 0);
    let names: Vec<_> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "q", "s"]);
    let (ta, tq, ts) = (
        f.tensor("a").unwrap(),
        f.tensor("q").unwrap(),
        f.tensor("s").unwrap(),
    );
    assert_eq!((ta.offset, tq.offset, ts.offset), (0, 64, 192));
    assert_eq!((ta.available, tq.available, ts.available), (64, 128, 128));
    assert_eq!(ta.ggml_type, GgmlType::F32);
    assert_eq!(tq.ggml_type, GgmlType::Q4_0);
    assert_eq!(ts.ggml_type, GgmlType::I2S);
    assert_eq!(f.tensor_data(ta).unwrap(), &a[..]);
    assert_eq!(f.tensor_data(tq).unwrap(), &q[..]);
    assert_eq!(f.tensor_data(ts).unwrap(), &s[..]);
    assert_eq!(&f.tensor_bytes(ta).unwrap()[..40], &a[..]);
    assert!(f.tensor_bytes(ta).unwrap()[40..].iter().all(|&b| b == 0));
}

#[test]
fn version_2_file_reads_like_version_3() {
    let mut w = GgufWriter::new(Vec::new(), 32).unwrap();
    w.add_kv("k", Value::U64(9)).unwrap();
    w.add_tensor("t", &[8], 0, 32).unwrap();
    w.write_header().unwrap();
    w.write_tensor_data("t", &[7; 32]).unwrap();
    let mut bytes = w.finish().unwrap();
    bytes[4] = 2; // version field, little-endian
    let f = parse(bytes);
    assert_eq!(f.version(), 2);
    assert_eq!(f.metadata().get_u64("k").unwrap(), 9);
    assert_eq!(f.tensor_data(&f.tensors()[0]).unwrap(), &[7; 32]);
}

#[test]
fn open_modes_agree() {
    let mut w = GgufWriter::new(Vec::new(), 32).unwrap();
    w.add_kv("general.architecture", "llama".into()).unwrap();
    w.add_tensor("t", &[4, 4], 1, 32).unwrap();
    w.write_header().unwrap();
    w.write_tensor_data("t", &[3; 32]).unwrap();
    let bytes = w.finish().unwrap();
    let path =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("bitnet-gguf-open-modes.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let a = GgufFile::open(&path, &Limits::default()).unwrap();
    let b = GgufFile::open_in_memory(&path, &Limits::default()).unwrap();
    let c = parse(bytes);
    for f in [&a, &b] {
        assert_eq!(f.metadata(), c.metadata());
        assert_eq!(f.tensors(), c.tensors());
        assert_eq!(f.as_bytes(), c.as_bytes());
        assert_eq!(f.tensor_data(&f.tensors()[0]).unwrap(), &[3; 32]);
    }
    assert!(!a.bitnet_context());
    // File-size limit is checked at open, before mapping or reading.
    let small = Limits {
        max_file_size: 64,
        ..Limits::default()
    };
    common_assert_limit(GgufFile::open(&path, &small));
    common_assert_limit(GgufFile::open_in_memory(&path, &small));
    // A missing file is an I/O error.
    assert!(matches!(
        GgufFile::open(&path.with_extension("missing"), &Limits::default()),
        Err(GgufError::Io(_))
    ));
    // An empty file is truncated, not a mapping failure.
    let empty = path.with_extension("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty, &Limits::default()),
        Err(GgufError::Truncated { what: "magic", .. })
    ));
    std::fs::remove_file(&empty).unwrap();
    std::fs::remove_file(&path).unwrap();
}

fn common_assert_limit(r: Result<GgufFile, GgufError>) {
    assert!(
        matches!(
            r,
            Err(GgufError::LimitExceeded {
                what: "file size",
                limit: 64,
                ..
            })
        ),
        "{r:?}"
    );
}

#[test]
fn writer_rejects_misuse() {
    use GgufError as E;
    assert!(matches!(
        GgufWriter::new(Vec::new(), 0),
        Err(E::BadAlignment { value: 0, .. })
    ));
    assert!(matches!(
        GgufWriter::new(Vec::new(), 48),
        Err(E::BadAlignment { value: 48, .. })
    ));
    assert!(matches!(
        GgufWriter::new(Vec::new(), 1 << 32),
        Err(E::BadAlignment { .. })
    ));

    let mut w = GgufWriter::new(Vec::new(), 32).unwrap();
    assert!(matches!(w.add_kv("", Value::U8(1)), Err(E::KeyEmpty)));
    w.add_kv("k", Value::U8(1)).unwrap();
    assert!(matches!(w.add_kv("k", Value::U8(2)), Err(E::DuplicateKey(k)) if k == "k"));
    assert!(matches!(
        w.add_kv("general.alignment", Value::U32(64)),
        Err(E::Writer(_))
    ));
    assert!(matches!(w.add_tensor("", &[1], 0, 4), Err(E::NameEmpty)));
    assert!(matches!(
        w.add_tensor(&"x".repeat(64), &[1], 0, 4),
        Err(E::NameTooLong { len: 64, .. })
    ));
    w.add_tensor(&"x".repeat(63), &[1], 0, 4).unwrap();
    assert!(matches!(
        w.add_tensor(&"x".repeat(63), &[1], 0, 4),
        Err(E::DuplicateTensor {
            first: 0,
            second: 1,
            ..
        })
    ));
    assert!(matches!(
        w.add_tensor("d0", &[], 0, 4),
        Err(E::BadDims { .. })
    ));
    assert!(matches!(
        w.add_tensor("d5", &[1; 5], 0, 4),
        Err(E::BadDims { .. })
    ));
    assert!(matches!(
        w.add_tensor("z", &[2, 0], 0, 4),
        Err(E::ZeroDim { axis: 1, .. })
    ));
    assert!(matches!(
        w.add_tensor("o", &[1 << 32, 1 << 32], 0, 4),
        Err(E::ShapeOverflow { .. })
    ));
    assert!(matches!(
        w.add_tensor("f", &[3], 0, 8),
        Err(E::SizeMismatch {
            expected: 12,
            got: 8,
            ..
        })
    ));
    assert!(matches!(
        w.add_tensor("q", &[33], 2, 18),
        Err(E::BadDims { .. })
    ));
    w.add_tensor("b", &[2], 0, 8).unwrap();
    // Data before the header, then out of order, then the wrong size.
    assert!(matches!(
        w.write_tensor_data("b", &[0; 8]),
        Err(E::Writer(_))
    ));
    w.write_header().unwrap();
    assert!(matches!(w.write_header(), Err(E::Writer(_))));
    assert!(matches!(w.add_kv("late", Value::U8(1)), Err(E::Writer(_))));
    assert!(matches!(
        w.write_tensor_data("b", &[0; 8]),
        Err(E::Writer(_))
    ));
    let first = "x".repeat(63);
    assert!(matches!(
        w.write_tensor_data(&first, &[0; 3]),
        Err(E::SizeMismatch {
            expected: 4,
            got: 3,
            ..
        })
    ));
    assert!(matches!(
        w.write_tensor_chunk(&first, &[0; 5]),
        Err(E::SizeMismatch { .. })
    ));
    w.write_tensor_chunk(&first, &[0; 2]).unwrap();
    assert!(matches!(
        w.write_tensor_data(&first, &[0; 2]),
        Err(E::Writer(_))
    ));
    w.write_tensor_chunk(&first, &[0; 2]).unwrap();
    let incomplete = w.finish();
    assert!(matches!(incomplete, Err(E::Writer(_))));
}

#[test]
fn writer_streams_large_tensor_in_chunks() {
    // 4 MiB F16 tensor streamed in 64 KiB chunks into a sink, without holding it in memory.
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let n: u64 = 2048 * 1024;
    let mut w = GgufWriter::new(Count(0), 32).unwrap();
    w.add_tensor("big", &[2048, 1024], 1, 2 * n).unwrap();
    w.write_header().unwrap();
    let chunk = vec![0u8; 64 << 10];
    for _ in 0..(2 * n / chunk.len() as u64) {
        w.write_tensor_chunk("big", &chunk).unwrap();
    }
    let c = w.finish().unwrap();
    // header: 4+4+8+8 + name(8+3) + n_dims 4 + 2*8 + type 4 + offset 8 = 67 → padded to 96.
    assert_eq!(c.0, 96 + 2 * n);
}

#[test]
fn metadata_getters_name_key_and_types() {
    use GgufError as E;
    let mut w = GgufWriter::new(Vec::new(), 32).unwrap();
    for (k, v) in every_value() {
        w.add_kv(&k, v).unwrap();
    }
    w.add_kv("neg", Value::I32(-5)).unwrap();
    w.add_kv("small", Value::U8(200)).unwrap();
    let f = parse(w.finish().unwrap());
    let md = f.metadata();
    assert_eq!(md.get_u32("u32").unwrap(), u32::MAX);
    assert!(
        matches!(md.get_u32("u64"), Err(E::WrongType { key, expected: "u32", found: "u64" }) if key == "u64")
    );
    assert!(matches!(md.get_u32("nope"), Err(E::MissingKey { key }) if key == "nope"));
    assert!(matches!(
        md.get_str("u8"),
        Err(E::WrongType {
            expected: "string",
            found: "u8",
            ..
        })
    ));
    assert!(matches!(
        md.get_str_array("arr.f32"),
        Err(E::WrongType {
            expected: "array<string>",
            found: "array<f32>",
            ..
        })
    ));
    assert!(matches!(
        md.get_f32_array("string"),
        Err(E::WrongType {
            found: "string",
            ..
        })
    ));
    assert!(matches!(
        md.get_i32_array("arr.u32"),
        Err(E::WrongType {
            found: "array<u32>",
            ..
        })
    ));
    assert!(matches!(
        md.get_bool("u8"),
        Err(E::WrongType {
            expected: "bool",
            ..
        })
    ));
    assert!(matches!(
        md.get_f32("f64"),
        Err(E::WrongType {
            expected: "f32",
            found: "f64",
            ..
        })
    ));
    assert!(matches!(md.get_i32("i64"), Err(E::WrongType { .. })));
    assert_eq!(md.get_i32("i32").unwrap(), i32::MIN);
    assert_eq!(md.get_u64("u64").unwrap(), u64::MAX);
    assert!(md.get_bool("bool.t").unwrap());
    // Lenient integer getter.
    assert_eq!(md.get_uint("small").unwrap(), 200);
    assert_eq!(md.get_uint("u16").unwrap(), 65535);
    assert_eq!(md.get_uint("u64").unwrap(), u64::MAX);
    assert!(matches!(md.get_uint("neg"), Err(E::OutOfRange { key, .. }) if key == "neg"));
    assert!(matches!(
        md.get_uint("bool.t"),
        Err(E::WrongType { found: "bool", .. })
    ));
    assert!(matches!(
        md.get_uint("f32"),
        Err(E::WrongType { found: "f32", .. })
    ));
    assert_eq!(md.get_int("neg").unwrap(), -5);
    assert!(matches!(md.get_int("u64"), Err(E::OutOfRange { .. })));
}

/// NaN payloads survive a write → read → write cycle bit for bit (PartialEq cannot show
/// this; found while fuzzing, where a harness compared values with `==`).
#[test]
fn nan_values_round_trip_bitwise() {
    let nan32 = f32::from_bits(0x7fc0_1234);
    let nan64 = f64::from_bits(0xfff8_0000_0000_abcd);
    let write = |kvs: &[(&str, Value)]| {
        let mut w = GgufWriter::new(Vec::new(), 32).unwrap();
        for (k, v) in kvs {
            w.add_kv(k, v.clone()).unwrap();
        }
        w.finish().unwrap()
    };
    let kvs = [
        ("a", Value::F32(nan32)),
        ("b", Value::F64(nan64)),
        ("c", Value::Array(Array::F32(vec![0.0, nan32, -1.7e38]))),
    ];
    let once = write(&kvs);
    let f = parse(once.clone());
    assert_eq!(f.metadata().get_f32("a").unwrap().to_bits(), 0x7fc0_1234);
    assert_eq!(
        f.metadata().get_f32_array("c").unwrap()[1].to_bits(),
        0x7fc0_1234
    );
    let again: Vec<(&str, Value)> = f.metadata().iter().map(|(k, v)| (k, v.clone())).collect();
    assert_eq!(write(&again), once);
}
