//! `GgufFile::advise_huge_pages`, `huge_mapped_pieces` and `drop_cached`: hints and probes that
//! never change what the file reads as, count only whole pieces inside the file, and leave
//! nothing of the probed pieces resident. (One test in its own binary, so no other test maps
//! files while resident memory is read.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_truncation
)]

mod common;

#[cfg(target_os = "linux")]
use common::rss_file_kib;

use bitnet_gguf::{GgufFile, Limits, HUGE_PAGE};

#[test]
fn huge_page_hints_and_probes_keep_contents_and_release_what_they_touch() {
    // A 12 MiB F16 tensor of varied bytes: five whole 2 MiB pieces lie inside the file.
    let n = 6 << 20;
    let big: Vec<u8> = (0..2 * n).map(|i| (i * 13 + i / 4096) as u8).collect();
    let (path, bytes) = common::f16_file("bitnet-gguf-huge.gguf", &big, None);
    let len = bytes.len();

    let f = GgufFile::open(&path, &Limits::default()).unwrap();
    let linux = cfg!(target_os = "linux");
    let thp = linux && std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
    assert_eq!(f.advise_huge_pages().unwrap(), thp);

    // Nothing usable to probe: no offsets, unaligned, or a piece running past the end.
    assert_eq!(f.huge_mapped_pieces(&[]).unwrap(), None);
    assert_eq!(f.huge_mapped_pieces(&[1, HUGE_PAGE + 4096]).unwrap(), None);
    let past = (len / HUGE_PAGE) * HUGE_PAGE;
    assert_eq!(f.huge_mapped_pieces(&[past]).unwrap(), None);

    #[cfg(target_os = "linux")]
    {
        let before = rss_file_kib();
        let pieces = [HUGE_PAGE, 2 * HUGE_PAGE, 3 * HUGE_PAGE];
        let n = f
            .huge_mapped_pieces(&pieces)
            .unwrap()
            .expect("smaps is readable on Linux");
        // The count over several pieces is the sum of each piece's own (its unit is a whole
        // piece, and the page cache keeps each piece's folio size between probes).
        let each: usize = pieces
            .iter()
            .map(|&p| f.huge_mapped_pieces(&[p]).unwrap().unwrap())
            .sum();
        assert_eq!(n, each);
        // Every probed piece has left again (whatever the page size it came in).
        let after = rss_file_kib();
        assert!(after < before + 1024, "RssFile {before} KiB -> {after} KiB");
        // Unusable offsets beside usable ones are skipped, not counted.
        let m = f
            .huge_mapped_pieces(&[HUGE_PAGE, 7, past])
            .unwrap()
            .unwrap();
        assert_eq!(Some(m), f.huge_mapped_pieces(&[HUGE_PAGE]).unwrap());
    }

    // Dropping the page cache never changes the bytes; empty and outside ranges do nothing.
    assert_eq!(f.drop_cached(0..len).unwrap(), linux);
    assert_eq!(f.as_bytes(), &bytes[..]);
    assert_eq!(f.drop_cached(HUGE_PAGE..2 * HUGE_PAGE).unwrap(), linux);
    assert_eq!(f.tensor_data(f.tensor("big").unwrap()).unwrap(), &big[..]);
    assert!(!f.drop_cached(5..5).unwrap());
    assert!(!f.drop_cached(0..len + 1).unwrap());

    // A file read into memory: no hint, no probe, nothing to drop, contents untouched.
    let m = GgufFile::open_in_memory(&path, &Limits::default()).unwrap();
    assert!(!m.advise_huge_pages().unwrap());
    assert_eq!(m.huge_mapped_pieces(&[HUGE_PAGE]).unwrap(), None);
    assert!(!m.drop_cached(0..len).unwrap());
    assert_eq!(m.as_bytes(), &bytes[..]);
}
