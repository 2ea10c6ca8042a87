//! A header read from the first bytes of a file ([`GgufHeader::parse_prefix`]) and the file
//! read piece by piece through windows ([`GgufHeader::window`]), against the whole file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use bitnet_gguf::{GgufError, GgufFile, GgufHeader, GgufWriter, Limits, Value};

/// A file with metadata long enough to span many prefixes and three tensors.
fn sample() -> Vec<u8> {
    let a: Vec<u8> = (0..4 * 10).map(|i| (i * 5 % 251) as u8).collect(); // F32 [5, 2]
    let s: Vec<u8> = (0..(128 * 2 / 4 + 32))
        .map(|i| (i * 3 % 251) as u8)
        .collect(); // I2_S
    let b: Vec<u8> = (0..2 * 7).map(|i| (i + 100) as u8).collect(); // F16 [7, 1]
    let mut w = GgufWriter::new(Vec::new(), 32).unwrap();
    w.add_kv("general.architecture", "bitnet-b1.58".into())
        .unwrap();
    let words: Vec<String> = (0..300).map(|i| format!("token{i}")).collect();
    w.add_kv(
        "tokenizer.ggml.tokens",
        Value::Array(bitnet_gguf::Array::String(words)),
    )
    .unwrap();
    w.add_tensor("a", &[5, 2], 0, a.len() as u64).unwrap();
    w.add_tensor("s", &[128, 2], 36, s.len() as u64).unwrap();
    w.add_tensor("b", &[7, 1], 1, b.len() as u64).unwrap();
    w.write_header().unwrap();
    w.write_tensor_data("a", &a).unwrap();
    w.write_tensor_data("s", &s).unwrap();
    w.write_tensor_data("b", &b).unwrap();
    w.finish().unwrap()
}

#[test]
fn every_prefix_either_waits_or_reads_the_whole_header() {
    let bytes = sample();
    let whole = GgufFile::from_bytes(bytes.clone(), &Limits::default()).unwrap();
    let size = bytes.len() as u64;
    let data_offset = usize::try_from(whole.data_offset()).unwrap();
    let mut first = None;
    for n in 0..=bytes.len() {
        let got = GgufHeader::parse_prefix(&bytes[..n], size, &Limits::default()).unwrap();
        match got {
            None => assert!(
                first.is_none(),
                "prefix {n} waits after an earlier one parsed"
            ),
            Some(h) => {
                first.get_or_insert(n);
                assert_eq!(h.metadata(), whole.metadata());
                assert_eq!(h.tensors(), whole.tensors());
                assert_eq!(h.data_offset(), whole.data_offset());
                assert_eq!(h.file_size(), size);
            }
        }
    }
    // The header is read as soon as its last tensor info is in: before the data section.
    let n = first.expect("the whole file has a header");
    assert!(n <= data_offset && n > data_offset - 32, "parsed at {n}");
}

#[test]
fn windows_give_the_tensors_inside_them_and_refuse_the_rest() {
    let bytes = sample();
    let whole = GgufFile::from_bytes(bytes.clone(), &Limits::default()).unwrap();
    let h = GgufHeader::parse_prefix(&bytes, bytes.len() as u64, &Limits::default())
        .unwrap()
        .unwrap();
    for t in whole.tensors() {
        let r = h.tensor_range(t);
        let (s, e) = (
            usize::try_from(r.start).unwrap(),
            usize::try_from(r.end).unwrap(),
        );
        // Just the tensor, then the tensor with a neighbour's bytes on either side.
        for (ws, we) in [(s, e), (s.saturating_sub(8), (e + 8).min(bytes.len()))] {
            let w = h.window(ws as u64, bytes[ws..we].to_vec()).unwrap();
            let t2 = w.tensor(&t.name).unwrap();
            assert_eq!(w.tensor_data(t2).unwrap(), whole.tensor_data(t).unwrap());
            assert_eq!(w.tensor_bytes(t2).unwrap(), whole.tensor_bytes(t).unwrap());
            assert_eq!(w.file_size(), whole.file_size());
        }
        // One byte short of the tensor's end: out of bounds, not a shorter slice.
        let w = h.window(s as u64, bytes[s..e - 1].to_vec()).unwrap();
        assert!(matches!(
            w.tensor_bytes(w.tensor(&t.name).unwrap()),
            Err(GgufError::TensorOutOfBounds { .. })
        ));
        // A window that starts after the tensor's start.
        let w = h.window(s as u64 + 1, bytes[s + 1..e].to_vec()).unwrap();
        assert!(w.tensor_data(w.tensor(&t.name).unwrap()).is_err());
    }
    // A window past the file's end.
    assert!(matches!(
        h.window(bytes.len() as u64 - 4, vec![0; 8]),
        Err(GgufError::NotInFile { .. })
    ));
}

#[test]
fn hostile_prefixes_fail_as_the_whole_file_would() {
    let bytes = sample();
    let size = bytes.len() as u64;
    let lim = Limits::default();
    // More bytes than the declared size.
    assert!(GgufHeader::parse_prefix(&bytes, size - 1, &lim).is_err());
    // Bad magic: an error at once, not a wait.
    let mut bad = bytes.clone();
    bad[0] = b'X';
    assert!(matches!(
        GgufHeader::parse_prefix(&bad[..16], size, &lim),
        Err(GgufError::BadMagic)
    ));
    // A declared size too small for the header: the file is truncated, not incomplete.
    let cut = 200;
    assert!(matches!(
        GgufHeader::parse_prefix(&bytes[..cut], cut as u64, &lim),
        Err(GgufError::Truncated { .. } | GgufError::CountTooLarge { .. })
    ));
    // A string length beyond the file's end is an error even from a short prefix.
    let mut long = bytes.clone();
    // The first key's length (u64 after magic, version and the two counts).
    long[24..32].copy_from_slice(&(size * 2).to_le_bytes());
    assert!(GgufHeader::parse_prefix(&long[..40], size, &lim).is_err());
    // A tensor that lies past the declared size.
    assert!(GgufHeader::parse_prefix(&bytes, size + 4096, &lim).is_ok());
    let whole = GgufFile::from_bytes(bytes.clone(), &lim).unwrap();
    let short = whole.data_offset() + 8;
    assert!(matches!(
        GgufHeader::parse_prefix(&bytes[..usize::try_from(short).unwrap()], short, &lim),
        Err(GgufError::TensorOutOfBounds { .. })
    ));
}
