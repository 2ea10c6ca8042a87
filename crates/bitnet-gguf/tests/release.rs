//! `GgufFile::release`: a memory-mapped tensor's pages leave the resident set and read back
//! unchanged; a file held in memory is left alone; ranges outside the file are refused.
//! (One test in its own binary, so no other test maps files while resident memory is read.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use bitnet_gguf::{GgufError, GgufFile, GgufWriter, Limits};

/// Resident file-backed memory of this process, in KiB (Linux only).
#[cfg(target_os = "linux")]
fn rss_file_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("RssFile:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn release_drops_mapped_pages_and_keeps_contents() {
    // 16 MiB F16 tensor (ggml type 1) of varied bytes, then a small one after it.
    let n = 8 << 20;
    let big: Vec<u8> = (0..2 * n).map(|i| (i * 7 + i / 4096) as u8).collect();
    let mut w = GgufWriter::new(Vec::new(), 32).unwrap();
    w.add_kv("general.architecture", "llama".into()).unwrap();
    w.add_tensor("big", &[n as u64], 1, 2 * n as u64).unwrap();
    w.add_tensor("small", &[16], 1, 32).unwrap();
    w.write_header().unwrap();
    w.write_tensor_data("big", &big).unwrap();
    w.write_tensor_data("small", &[5; 32]).unwrap();
    let bytes = w.finish().unwrap();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("bitnet-gguf-release.gguf");
    std::fs::write(&path, &bytes).unwrap();

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
