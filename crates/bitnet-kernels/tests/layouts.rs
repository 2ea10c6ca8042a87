//! Layout tests: worked examples, pack/unpack round trips, flavor detection.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::cast_possible_truncation)]

mod common;

use bitnet_kernels::layout::i2s;

#[test]
fn i2s_worked_example() {
    // FORMATS.md §1: codes c_j = j mod 3 for j = 0..127 give bytes 0..3 = 24 49 92 24.
    let codes: Vec<u8> = (0..128).map(|j| (j % 3) as u8).collect();
    let packed = i2s::pack_codes(&codes, 1.0).unwrap();
    assert_eq!(&packed[0..4], &[0x24, 0x49, 0x92, 0x24]);
    assert_eq!(packed.len(), 128 / 4 + 32);
    assert_eq!(i2s::unpack_codes(&packed, 128), codes);
}
