//! Arbitrary bytes → `GgufFile::from_bytes`. Any panic, abort, OOM or timeout is a finding.
//!
//! For inputs that parse, the target also checks the reader's invariants (every tensor's
//! `available` bytes are in bounds, lookups agree with the table) and that the metadata
//! survives a write → read → write round trip byte for byte.
#![no_main]

use bitnet_gguf::{GgufFile, GgufWriter, Limits, Metadata, KEY_ALIGNMENT};
use libfuzzer_sys::fuzz_target;

fn limits() -> Limits {
    // Small caps keep each run fast and memory use far below libFuzzer's RSS limit.
    Limits {
        max_file_size: 1 << 24,
        max_alloc: 64 << 20,
        ..Limits::default()
    }
}

/// Serializes metadata (minus general.alignment) as a tensor-less v3 file.
fn write_metadata(md: &Metadata) -> Vec<u8> {
    let mut w = GgufWriter::new(Vec::new(), 32).expect("alignment 32 is valid");
    for (k, v) in md.iter() {
        if k != KEY_ALIGNMENT {
            w.add_kv(k, v.clone())
                .expect("parsed keys are unique and non-empty");
        }
    }
    w.finish().expect("writing to a Vec cannot fail")
}

fuzz_target!(|data: &[u8]| {
    let limits = limits();
    let Ok(f) = GgufFile::from_bytes(data.to_vec(), &limits) else {
        return;
    };

    assert!(f.data_offset() <= f.file_size());
    assert_eq!(f.metadata().len(), f.metadata().iter().count());
    for (k, v) in f.metadata().iter() {
        // Identity, not equality: values may hold NaN.
        assert!(f
            .metadata()
            .get(k)
            .is_some_and(|found| std::ptr::eq(found, v)));
    }
    for t in f.tensors() {
        let bytes = f
            .tensor_bytes(t)
            .expect("available bytes lie inside the file");
        assert_eq!(bytes.len() as u64, t.available);
        assert_eq!(t.offset % f.alignment(), 0);
        if let Ok(d) = f.tensor_data(t) {
            assert_eq!(Some(d.len() as u64), t.nbytes());
        }
        assert!(f
            .tensor(&t.name)
            .is_some_and(|found| std::ptr::eq(found, t)));
    }

    let once = write_metadata(f.metadata());
    let g = GgufFile::from_bytes(once.clone(), &limits).expect("writer output parses");
    assert_eq!(write_metadata(g.metadata()), once);
});
