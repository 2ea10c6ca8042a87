//! `GgufFile::from_mapped_table`: tensors placed in another container's file are checked as
//! GGUF tensors are (bounds, overlap, names, dims, sizes).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bitnet_gguf::{GgufError, GgufFile, Limits, MappedFile, Metadata, TableEntry, Value};

fn entry(name: &str, dims: &[u64], type_id: u32, offset: u64, size: u64) -> TableEntry {
    TableEntry {
        name: name.into(),
        dims: dims.to_vec(),
        type_id,
        offset,
        size,
    }
}

fn open(table: Vec<TableEntry>) -> Result<GgufFile, GgufError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.bin");
    let bytes: Vec<u8> = (0..256u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let md = Metadata::from_entries(vec![(
        "general.architecture".into(),
        Value::String("bitnet-b1.58".into()),
    )])
    .unwrap();
    GgufFile::from_mapped_table(
        MappedFile::open(&path).unwrap(),
        md,
        table,
        &Limits::default(),
    )
}

#[test]
fn valid_tables_lend_exactly_their_bytes() {
    // F32 [4] at 32 and F16 [8] at 64.
    let f = open(vec![
        entry("a", &[4], 0, 32, 16),
        entry("b", &[8], 1, 64, 16),
    ])
    .unwrap();
    assert!(f.is_mapped());
    let a = f.tensor("a").unwrap();
    assert_eq!(
        f.tensor_data(a).unwrap(),
        &(32u8..48).collect::<Vec<u8>>()[..]
    );
    assert_eq!(f.tensor_bytes(a).unwrap().len(), 16);
    assert_eq!(f.tensors().len(), 2);
}

#[test]
fn hostile_tables_are_typed_errors() {
    let cases: Vec<(Vec<TableEntry>, &str)> = vec![
        (vec![entry("a", &[4], 0, 250, 16)], "out of bounds"),
        (vec![entry("a", &[4], 0, 0, 8)], "smaller than its type"),
        (
            vec![entry("a", &[4], 0, u64::MAX - 4, 16)],
            "offset overflow",
        ),
        (
            vec![entry("a", &[4], 0, 0, 16), entry("b", &[4], 0, 8, 16)],
            "overlap",
        ),
        (
            vec![entry("a", &[4], 0, 0, 16), entry("a", &[4], 0, 32, 16)],
            "duplicate",
        ),
        (vec![entry("a", &[4, 0], 0, 0, 16)], "zero dim"),
        (vec![entry("", &[4], 0, 0, 16)], "empty name"),
        (vec![entry("a", &[1, 1, 1, 1, 1], 0, 0, 16)], "five dims"),
        (
            vec![entry("a", &[1 << 40, 1 << 40], 0, 0, 16)],
            "shape overflow",
        ),
        (
            vec![entry("a", &[33], 8, 0, 34)],
            "Q8_0 row not whole blocks",
        ),
    ];
    for (table, what) in cases {
        match open(table) {
            Err(
                GgufError::TensorOutOfBounds { .. }
                | GgufError::OverlappingTensors { .. }
                | GgufError::DuplicateTensor { .. }
                | GgufError::ZeroDim { .. }
                | GgufError::NameEmpty
                | GgufError::BadDims { .. }
                | GgufError::ShapeOverflow { .. },
            ) => {}
            Err(e) => panic!("{what}: unexpected error {e}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
}
