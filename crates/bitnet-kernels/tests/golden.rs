//! Decoding every I2_S tensor of the golden tiny model gives exactly the F32 file's values,
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]
//! and type-36 detection picks bitnet.cpp's I2_S for each of them.

mod common;

use bitnet_kernels::{TernaryLayout, TernaryMatrix};
use common::gguf_tensors;

#[test]
fn tiny_i2s_decodes_to_f32_file() {
    let qbuf = bitnet_testdata::read("tiny/bitnet-tiny-i2_s.gguf");
    let fbuf = bitnet_testdata::read("tiny/bitnet-tiny-f32.gguf");
    let (qt, qstart) = gguf_tensors(&qbuf);
    let (ft, _) = gguf_tensors(&fbuf);
    // The published table (testdata/golden/tiny/TENSORS.md) says the data section starts at byte 194848.
    assert_eq!(qstart, 194_848);
    let mut checked = 0;
    for (i, t) in qt.iter().enumerate() {
        if t.ty != 36 {
            continue;
        }
        let (k, n_out) = (t.dims[0] as usize, t.dims[1] as usize);
        let end = qt.get(i + 1).map_or(qbuf.len(), |n| n.offset);
        let avail = &qbuf[t.offset..end];
        let m = TernaryMatrix::detect_type36(&t.name, n_out, k, avail, 32, None).unwrap();
        assert_eq!(m.layout(), TernaryLayout::I2S, "{}", t.name);
        let f = ft.iter().find(|f| f.name == t.name).unwrap();
        assert_eq!(f.ty, 0);
        assert_eq!(f.dims, t.dims);
        let mut row = vec![0f32; k];
        for r in 0..n_out {
            m.dequantize_row(r, &mut row).unwrap();
            let fr = &fbuf[f.offset + 4 * r * k..f.offset + 4 * (r + 1) * k];
            for (j, (&got, c)) in row.iter().zip(fr.chunks_exact(4)).enumerate() {
                let want = f32::from_le_bytes(c.try_into().unwrap());
                assert_eq!(got.to_bits(), want.to_bits(), "{} row {r} col {j}", t.name);
            }
        }
        assert_eq!(m.count_invalid_codes(), 0);
        checked += 1;
    }
    assert_eq!(checked, 14);
}
