//! QSF round trips, CRC coverage of every byte, truncation and layout damage.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use bitnet_gguf::{GgufFile, Limits};
use bitnet_qsf::{write_from_gguf, Compression, QsfError, QsfFile, HEADER_BYTES};
use bitnet_testkit::{synth, Preset, SynthSpec, WeightLayout};

/// A small model: 2 layers over the tiny vocabulary, width 128 for I2_S (256 for the 256-blocks).
fn model(layout: WeightLayout) -> GgufFile {
    let mut spec = SynthSpec::preset(Preset::Tiny);
    spec.layout = layout;
    spec.n_embd = if layout == WeightLayout::I2S {
        128
    } else {
        256
    };
    spec.n_ff = 256;
    let vocab = synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF).unwrap();
    GgufFile::from_bytes(
        synth::write(&spec, &vocab, Vec::new(), &mut |_, _| {}).unwrap(),
        &Limits::default(),
    )
    .unwrap()
}

fn qsf(f: &GgufFile, c: Compression) -> Vec<u8> {
    write_from_gguf(f, c, None, Vec::new(), &mut |_, _| true).unwrap()
}

#[test]
fn round_trip_keeps_every_tensor_and_key() {
    for layout in [WeightLayout::I2S, WeightLayout::Tq2_0, WeightLayout::Tq1_0] {
        let f = model(layout);
        for c in [Compression::None, Compression::Lz4] {
            let q = QsfFile::from_bytes(qsf(&f, c)).unwrap();
            assert_eq!(q.hparams.n_layer, 2);
            assert_eq!(
                q.hparams.n_embd,
                f.metadata()
                    .get_uint("bitnet-b1.58.embedding_length")
                    .unwrap() as u32
            );
            assert_eq!(q.hparams.n_vocab, 4256);
            assert_eq!(q.compression, c);
            assert!(q
                .layers
                .iter()
                .all(|l| l.tensor_count == 11 && l.importance.is_nan()));
            let g = q.to_gguf().unwrap();
            assert_eq!(g.tensors().len(), f.tensors().len());
            for t in f.tensors() {
                let u = g.tensor(&t.name).unwrap();
                assert_eq!((u.ggml_type, &u.dims), (t.ggml_type, &t.dims), "{}", t.name);
                assert!(
                    g.tensor_data(u).unwrap() == f.tensor_data(t).unwrap(),
                    "{layout:?} {c:?}: {}",
                    t.name
                );
            }
            let keys = |f: &GgufFile| {
                f.metadata()
                    .iter()
                    .map(|(k, v)| (k.to_string(), format!("{v:?}")))
                    .collect::<Vec<_>>()
            };
            assert_eq!(keys(&g), keys(&f));
        }
    }
}

/// Every single-byte change anywhere after the header is caught: at open (meta, index) or when
/// the section is read (embedding, head, layers), each naming its section.
#[test]
fn every_byte_flip_is_caught_by_its_section_crc() {
    let bytes = qsf(&model(WeightLayout::I2S), Compression::None);
    let q = QsfFile::from_bytes(bytes.clone()).unwrap();
    let l0 = q.layers[0].section;
    let (start, end) = (l0.offset as usize, (l0.offset + l0.stored) as usize);
    // Every byte of layer 0 (each flip caught by that layer's CRC) ...
    let mut positions: Vec<usize> = (start..end).collect();
    // ... and a spread of bytes over the rest of the file, header included.
    positions.extend(
        (0..bytes.len())
            .step_by(1999)
            .filter(|p| !(start..end).contains(p)),
    );
    let mut b = bytes;
    for &p in &positions {
        b[p] ^= 0x5A;
        let r = QsfFile::from_bytes(b.clone()).and_then(|q| {
            if (start..end).contains(&p) {
                q.layer(0).map(|_| ())
            } else {
                q.to_gguf().map(|_| ())
            }
        });
        b[p] ^= 0x5A;
        match r {
            Err(QsfError::Crc { section, .. }) => {
                if (start..end).contains(&p) {
                    assert_eq!(section, "layer 0", "byte {p}");
                }
            }
            // A flip of the magic or version is reported as such (before the header CRC).
            Err(QsfError::BadMagic | QsfError::Version(_)) if p < 8 => {}
            Err(e) => panic!("byte {p}: expected a CRC error, got {e}"),
            Ok(()) => panic!("byte {p}: flip not detected"),
        }
    }
}

#[test]
fn truncation_and_trailing_bytes_are_refused() {
    let bytes = qsf(&model(WeightLayout::I2S), Compression::Lz4);
    for len in [
        0,
        3,
        4,
        100,
        HEADER_BYTES,
        HEADER_BYTES + 1,
        bytes.len() / 2,
        bytes.len() - 1,
    ] {
        match QsfFile::from_bytes(bytes[..len].to_vec()) {
            Err(QsfError::Truncated(_) | QsfError::BadMagic) => {}
            Err(e) => panic!("{len}: unexpected {e}"),
            Ok(_) => panic!("{len} bytes accepted"),
        }
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        QsfFile::from_bytes(longer),
        Err(QsfError::Truncated(_))
    ));
    assert!(QsfFile::from_bytes(bytes).is_ok());
}

#[test]
fn lz4_sections_that_lie_about_their_size_are_refused() {
    let f = model(WeightLayout::I2S);
    let bytes = qsf(&f, Compression::Lz4);
    let q = QsfFile::from_bytes(bytes.clone()).unwrap();
    let e = q.layers[1].section;
    // Rewrite layer 1 with garbage that has a valid CRC: the LZ4 decoder must refuse it.
    let mut b = bytes;
    let (start, end) = (e.offset as usize, (e.offset + e.stored) as usize);
    for x in &mut b[start..end] {
        *x = 0xFF;
    }
    let crc = crc32fast::hash(&b[start..end]);
    // The index entry's CRC sits 36 bytes into the entry; the index starts after the meta.
    let index_off = HEADER_BYTES + q.meta_bytes() as usize;
    let entry = index_off + 48;
    b[entry + 36..entry + 40].copy_from_slice(&crc.to_le_bytes());
    // The index CRC in the header (descriptor 2 at byte 88, CRC at +24), then the header CRC.
    let icrc = crc32fast::hash(&b[index_off..index_off + 96]);
    b[88 + 24..88 + 28].copy_from_slice(&icrc.to_le_bytes());
    let hcrc = crc32fast::hash(&b[..188]);
    b[188..192].copy_from_slice(&hcrc.to_le_bytes());
    let q = QsfFile::from_bytes(b).unwrap();
    match q.layer(1) {
        Err(QsfError::Lz4 { section, .. }) => assert_eq!(section, "layer 1"),
        other => panic!("expected an LZ4 error, got {other:?}"),
    }
}

#[test]
fn an_uncompressed_file_is_used_in_place_and_a_compressed_one_is_rebuilt() {
    let f = model(WeightLayout::I2S);
    let dir = tempfile::tempdir().unwrap();
    for (c, mapped) in [(Compression::None, true), (Compression::Lz4, false)] {
        let path = dir.path().join(format!("{c:?}.qsf"));
        std::fs::write(&path, qsf(&f, c)).unwrap();
        assert!(bitnet_qsf::is_qsf(&path));
        let g = QsfFile::open(&path).unwrap().into_gguf().unwrap();
        assert_eq!(g.is_mapped(), mapped, "{c:?}");
        for t in f.tensors() {
            let u = g.tensor(&t.name).unwrap();
            assert_eq!((u.ggml_type, &u.dims), (t.ggml_type, &t.dims), "{}", t.name);
            assert!(
                g.tensor_data(u).unwrap() == f.tensor_data(t).unwrap(),
                "{}",
                t.name
            );
            // Tensors used in place sit on 32-byte file offsets, and hold exactly their bytes.
            if mapped {
                let r = g.range_of(g.tensor_bytes(u).unwrap()).unwrap();
                assert_eq!(r.start % 32, 0, "{}", t.name);
                assert_eq!(r.len(), f.tensor_data(t).unwrap().len().max(r.len()));
            }
        }
        assert_eq!(
            g.metadata().get_str("general.architecture").unwrap(),
            "bitnet-b1.58"
        );
    }
    // A flipped byte in a layer of a mapped file is caught before any tensor is lent out.
    let path = dir.path().join("flip.qsf");
    let mut b = qsf(&f, Compression::None);
    let q = QsfFile::from_bytes(b.clone()).unwrap();
    let at = (q.layers[1].section.offset + 100) as usize;
    b[at] ^= 1;
    std::fs::write(&path, b).unwrap();
    match QsfFile::open(&path).unwrap().into_gguf() {
        Err(QsfError::Crc { section, .. }) => assert_eq!(section, "layer 1"),
        other => panic!("expected a CRC error, got {:?}", other.map(|_| ())),
    }
}
