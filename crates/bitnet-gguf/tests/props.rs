//! Property tests (stable toolchain): random metadata round-trips through the writer, and
//! random mutations of a valid file never panic.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use bitnet_gguf::{Array, GgufFile, GgufWriter, Limits, Value};
use proptest::prelude::*;

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u8>().prop_map(Value::U8),
        any::<i8>().prop_map(Value::I8),
        any::<u16>().prop_map(Value::U16),
        any::<i16>().prop_map(Value::I16),
        any::<u32>().prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        // Finite floats only, so PartialEq is meaningful (NaN round trips are byte-checked
        // by the fuzz target).
        (-1e30f32..1e30).prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        ".{0,12}".prop_map(Value::String),
        any::<u64>().prop_map(Value::U64),
        any::<i64>().prop_map(Value::I64),
        (-1e300f64..1e300).prop_map(Value::F64),
    ]
}

fn flat_array() -> impl Strategy<Value = Array> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..8).prop_map(Array::U8),
        prop::collection::vec(any::<i16>(), 0..8).prop_map(Array::I16),
        prop::collection::vec(any::<u32>(), 0..8).prop_map(Array::U32),
        prop::collection::vec(-1e30f32..1e30, 0..8).prop_map(Array::F32),
        prop::collection::vec(any::<bool>(), 0..8).prop_map(Array::Bool),
        prop::collection::vec(".{0,6}", 0..8).prop_map(Array::String),
        prop::collection::vec(any::<i64>(), 0..8).prop_map(Array::I64),
    ]
}

fn array() -> impl Strategy<Value = Array> {
    flat_array().prop_recursive(3, 24, 4, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(Array::Array)
    })
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![3 => scalar(), 1 => array().prop_map(Value::Array)]
}

fn metadata() -> impl Strategy<Value = Vec<(String, Value)>> {
    prop::collection::btree_map("[a-z]{1,3}(\\.[a-z_]{1,6}){0,2}", value(), 0..12)
        .prop_map(|m| m.into_iter().collect())
        .prop_shuffle()
}

/// A small valid file with two tensors (an F32 norm and an I2_S weight) after `kvs`.
fn build(kvs: &[(String, Value)], alignment: u64) -> Vec<u8> {
    let mut w = GgufWriter::new(Vec::new(), alignment).unwrap();
    for (k, v) in kvs {
        w.add_kv(k, v.clone()).unwrap();
    }
    w.add_tensor("norm", &[8], 0, 32).unwrap();
    w.add_tensor("w", &[128, 2], 36, 96).unwrap();
    w.write_header().unwrap();
    w.write_tensor_data("norm", &[1; 32]).unwrap();
    w.write_tensor_data("w", &[2; 96]).unwrap();
    w.finish().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn metadata_round_trips(kvs in metadata(), align_log2 in 0u32..8) {
        let alignment = 1u64 << align_log2;
        let f = GgufFile::from_bytes(build(&kvs, alignment), &Limits::default()).unwrap();
        let got: Vec<(String, Value)> = f
            .metadata()
            .iter()
            .filter(|(k, _)| *k != "general.alignment")
            .map(|(k, v)| (k.to_owned(), v.clone()))
            .collect();
        prop_assert_eq!(&got, &kvs);
        prop_assert_eq!(f.alignment(), alignment);
        prop_assert_eq!(f.tensor_data(f.tensor("norm").unwrap()).unwrap(), &[1u8; 32][..]);
        prop_assert_eq!(f.tensor_data(f.tensor("w").unwrap()).unwrap(), &[2u8; 96][..]);
    }

    #[test]
    fn mutations_never_panic(
        kvs in metadata(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = build(&kvs, 32);
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        let len = bytes.len();
        for candidate in [bytes.clone(), bytes[..cut.index(len)].to_vec()] {
            if let Ok(f) = GgufFile::from_bytes(candidate, &Limits::default()) {
                for t in f.tensors() {
                    prop_assert_eq!(f.tensor_bytes(t).unwrap().len() as u64, t.available);
                    let _ = f.tensor_data(t);
                }
            }
        }
    }
}
