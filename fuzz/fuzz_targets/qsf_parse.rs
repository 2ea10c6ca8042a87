//! Arbitrary bytes → `bitnet_qsf::QsfFile::from_bytes`, then every accessor (metadata, each
//! layer, the embedding, the head, the rebuilt GGUF). Any panic, abort, OOM or timeout is a
//! finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(q) = bitnet_qsf::QsfFile::from_bytes(data.to_vec()) else {
        return;
    };
    if let Ok(md) = q.metadata() {
        let _ = md.len();
    }
    for i in 0..64 {
        if q.layer(i).is_err() {
            break;
        }
    }
    let _ = q.embedding();
    let _ = q.head();
    let _ = q.meta_bytes();
    let _ = q.to_gguf();
});
