//! `GgufFile::release`: a memory-mapped tensor's pages leave the resident set and read back
//! unchanged; a file held in memory is left alone; ranges outside the file are refused.
//! (One test in its own binary, so no other test maps files while resident memory is read.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

mod common;

#[cfg(target_os = "linux")]
use common::rss_file_kib;

use bitnet_gguf::{GgufError, GgufFile, Limits};

#[test]
fn release_drops_mapped_pages_and_keeps_contents() {
    // 16 MiB F16 tensor (ggml type 1) of varied bytes, then a small one after it.
    let n = 8 << 20;
    let big: Vec<u8> = (0..2 * n).map(|i| (i * 7 + i / 4096) as u8).collect();
    let (path, bytes) = common::f16_file("bitnet-gguf-release.gguf", &big, Some(&[5; 32]));

    let f = GgufFile::open(&path, &Limits::default()).unwrap();
    let data = f.tensor_data(f.tensor("big").unwrap()).unwrap();
    assert_eq!(data, &big[..]);
    let r = f.range_of(data).unwrap();
    assert_eq!(r.len(), data.len());
    assert_eq!(
        u64::try_from(r.start).unwrap(),
        f.data_offset() + f.tensor("big").unwrap().offset
    );
    assert_eq!(f.range_of(&big), None);
    #[cfg(target_os = "linux")]
    let before = rss_file_kib();
    assert!(f.release(data).unwrap());
    #[cfg(target_os = "linux")]
    {
        let after = rss_file_kib();
        // 16 MiB were resident (just compared); at least 12 MiB of them must have left.
        assert!(
            before >= after + 12 * 1024,
            "RssFile {before} KiB -> {after} KiB"
        );
    }
    // Read back: same bytes, and the neighbour sharing the last page is intact.
    assert_eq!(data, &big[..]);
    assert_eq!(f.tensor_data(f.tensor("small").unwrap()).unwrap(), &[5; 32]);
    // The whole file, and an empty range, are fine too.
    assert!(f.release(f.as_bytes()).unwrap());
    assert!(!f.release(&data[..0]).unwrap());
    assert_eq!(f.as_bytes(), &bytes[..]);

    // Not part of the file: refused, whatever its size.
    for foreign in [&big[..], &big[..1]] {
        assert!(matches!(
            f.release(foreign),
            Err(GgufError::NotInFile { len }) if len == foreign.len()
        ));
    }

    // A file read into memory: nothing to release, contents untouched.
    let m = GgufFile::open_in_memory(&path, &Limits::default()).unwrap();
    let md = m.tensor_data(m.tensor("big").unwrap()).unwrap();
    assert!(!m.release(md).unwrap());
    assert_eq!(md, &big[..]);
    assert!(m.release(data).is_err());

    // read_at: the same bytes, copied with pread from a mapped file (its pages stay out of the
    // process), or from memory; ranges past the end are refused.
    let at = r.start + 4096 * 3 + 5;
    let mut out = vec![0u8; 1 << 20];
    assert!(f.release(f.as_bytes()).unwrap());
    #[cfg(target_os = "linux")]
    let before = rss_file_kib();
    f.read_at(at, &mut out).unwrap();
    assert_eq!(&out[..], &bytes[at..at + out.len()]);
    #[cfg(target_os = "linux")]
    {
        let after = rss_file_kib();
        assert!(after < before + 512, "RssFile {before} KiB -> {after} KiB");
    }
    let mut again = vec![0u8; out.len()];
    m.read_at(at, &mut again).unwrap();
    assert_eq!(again, out);
    let len = bytes.len();
    let mut tail = [0u8; 2];
    assert!(matches!(
        f.read_at(len - 1, &mut tail),
        Err(GgufError::NotInFile { .. })
    ));
    assert!(f.read_at(usize::MAX, &mut tail).is_err());
    assert!(f.read_at(len - 2, &mut tail).is_ok());
}
