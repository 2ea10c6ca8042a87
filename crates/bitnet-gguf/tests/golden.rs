//! The golden fixture files parse, and their tables equal the reference listing
//! (testdata/golden/tiny/TENSORS.md, produced by gguf-py from the same files).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::cast_possible_truncation
)]

use std::path::Path;
use std::time::Instant;

use bitnet_gguf::{GgmlType, GgufFile, Limits, Value};
use bitnet_testdata::golden;

/// Metadata of bitnet-tiny-i2_s.gguf, from testdata/golden/tiny/TENSORS.md: (key, type name).
const TINY_KEYS: [(&str, &str); 24] = [
    ("general.architecture", "string"),
    ("general.name", "string"),
    ("bitnet-b1.58.vocab_size", "u32"),
    ("bitnet-b1.58.context_length", "u32"),
    ("bitnet-b1.58.embedding_length", "u32"),
    ("bitnet-b1.58.block_count", "u32"),
    ("bitnet-b1.58.feed_forward_length", "u32"),
    ("bitnet-b1.58.rope.dimension_count", "u32"),
    ("bitnet-b1.58.attention.head_count", "u32"),
    ("bitnet-b1.58.attention.head_count_kv", "u32"),
    ("tokenizer.ggml.add_bos_token", "bool"),
    ("bitnet-b1.58.attention.layer_norm_rms_epsilon", "f32"),
    ("bitnet-b1.58.rope.freq_base", "f32"),
    ("general.file_type", "u32"),
    ("tokenizer.ggml.model", "string"),
    ("tokenizer.ggml.tokens", "array<string>"),
    ("tokenizer.ggml.scores", "array<f32>"),
    ("tokenizer.ggml.token_type", "array<i32>"),
    ("tokenizer.ggml.merges", "array<string>"),
    ("tokenizer.ggml.bos_token_id", "u32"),
    ("tokenizer.ggml.eos_token_id", "u32"),
    ("tokenizer.ggml.padding_token_id", "u32"),
    ("tokenizer.chat_template", "string"),
    ("general.quantization_version", "u32"),
];

/// Tensor table of bitnet-tiny-i2_s.gguf, from testdata/golden/tiny/TENSORS.md: (name, type, ne, bytes, offset).
const TINY_TENSORS: [(&str, &str, &[u64], u64, u64); 24] = [
    ("token_embd.weight", "F16", &[256, 4256], 2179072, 0),
    ("blk.0.attn_norm.weight", "F32", &[256], 1024, 2179072),
    ("blk.0.attn_q.weight", "I2_S", &[256, 256], 16416, 2180096),
    ("blk.0.attn_k.weight", "I2_S", &[256, 128], 8224, 2196512),
    ("blk.0.attn_v.weight", "I2_S", &[256, 128], 8224, 2204736),
    (
        "blk.0.attn_output.weight",
        "I2_S",
        &[256, 256],
        16416,
        2212960,
    ),
    ("blk.0.attn_sub_norm.weight", "F32", &[256], 1024, 2229376),
    ("blk.0.ffn_norm.weight", "F32", &[256], 1024, 2230400),
    ("blk.0.ffn_gate.weight", "I2_S", &[256, 512], 32800, 2231424),
    ("blk.0.ffn_up.weight", "I2_S", &[256, 512], 32800, 2264224),
    ("blk.0.ffn_down.weight", "I2_S", &[512, 256], 32800, 2297024),
    ("blk.0.ffn_sub_norm.weight", "F32", &[512], 2048, 2329824),
    ("blk.1.attn_norm.weight", "F32", &[256], 1024, 2331872),
    ("blk.1.attn_q.weight", "I2_S", &[256, 256], 16416, 2332896),
    ("blk.1.attn_k.weight", "I2_S", &[256, 128], 8224, 2349312),
    ("blk.1.attn_v.weight", "I2_S", &[256, 128], 8224, 2357536),
    (
        "blk.1.attn_output.weight",
        "I2_S",
        &[256, 256],
        16416,
        2365760,
    ),
    ("blk.1.attn_sub_norm.weight", "F32", &[256], 1024, 2382176),
    ("blk.1.ffn_norm.weight", "F32", &[256], 1024, 2383200),
    ("blk.1.ffn_gate.weight", "I2_S", &[256, 512], 32800, 2384224),
    ("blk.1.ffn_up.weight", "I2_S", &[256, 512], 32800, 2417024),
    ("blk.1.ffn_down.weight", "I2_S", &[512, 256], 32800, 2449824),
    ("blk.1.ffn_sub_norm.weight", "F32", &[512], 2048, 2482624),
    ("output_norm.weight", "F32", &[256], 1024, 2484672),
];

#[test]
fn tiny_i2s_matches_reference_listing() {
    let path = golden("tiny/bitnet-tiny-i2_s.gguf");
    for f in [
        GgufFile::open(&path, &Limits::default()).unwrap(),
        GgufFile::open_in_memory(&path, &Limits::default()).unwrap(),
    ] {
        // Header line of testdata/golden/tiny/TENSORS.md.
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), 32);
        assert_eq!(f.data_offset(), 194848);
        assert_eq!(f.file_size(), 2680544);
        assert_eq!(f.architecture(), Some("bitnet-b1.58"));
        assert!(f.bitnet_context());

        let md = f.metadata();
        assert_eq!(md.len(), 24);
        let got: Vec<(&str, &str)> = md.iter().map(|(k, v)| (k, v.type_name())).collect();
        assert_eq!(got, TINY_KEYS);

        // Values listed in testdata/golden/tiny/TENSORS.md.
        assert_eq!(md.get_str("general.name").unwrap(), "bitnet2b-ref-tiny");
        assert_eq!(md.get_u32("bitnet-b1.58.vocab_size").unwrap(), 4256);
        assert_eq!(md.get_u32("bitnet-b1.58.context_length").unwrap(), 512);
        assert_eq!(md.get_u32("bitnet-b1.58.embedding_length").unwrap(), 256);
        assert_eq!(md.get_u32("bitnet-b1.58.block_count").unwrap(), 2);
        assert_eq!(md.get_u32("bitnet-b1.58.feed_forward_length").unwrap(), 512);
        assert_eq!(
            md.get_u32("bitnet-b1.58.rope.dimension_count").unwrap(),
            128
        );
        assert_eq!(md.get_u32("bitnet-b1.58.attention.head_count").unwrap(), 2);
        assert_eq!(
            md.get_u32("bitnet-b1.58.attention.head_count_kv").unwrap(),
            1
        );
        assert!(md.get_bool("tokenizer.ggml.add_bos_token").unwrap());
        // testdata/golden/tiny/TENSORS.md prints the stored f32 widened to f64.
        let eps = md
            .get_f32("bitnet-b1.58.attention.layer_norm_rms_epsilon")
            .unwrap();
        assert_eq!(f64::from(eps), 9.999999747378752e-06_f64);
        assert_eq!(md.get_f32("bitnet-b1.58.rope.freq_base").unwrap(), 500000.0);
        assert_eq!(md.get_u32("general.file_type").unwrap(), 40);
        assert_eq!(md.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
        let tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap();
        assert_eq!(tokens.len(), 4256);
        assert_eq!(&tokens[..6], ["!", "\"", "#", "$", "%", "&"]);
        let scores = md.get_f32_array("tokenizer.ggml.scores").unwrap();
        assert_eq!(scores.len(), 4256);
        assert_eq!(&scores[..6], [0.0; 6]);
        let tt = md.get_i32_array("tokenizer.ggml.token_type").unwrap();
        assert_eq!(tt.len(), 4256);
        assert_eq!(&tt[..6], [1; 6]);
        let merges = md.get_str_array("tokenizer.ggml.merges").unwrap();
        assert_eq!(merges.len(), 6241);
        assert_eq!(
            &merges[..6],
            ["Ġ Ġ", "Ġ ĠĠĠ", "ĠĠ ĠĠ", "ĠĠĠ Ġ", "i n", "Ġ t"]
        );
        assert_eq!(md.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 4000);
        assert_eq!(md.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 4001);
        assert_eq!(md.get_u32("tokenizer.ggml.padding_token_id").unwrap(), 4001);
        assert!(md.get_str("tokenizer.chat_template").unwrap().starts_with(
            "{% for message in messages %}{% if loop.first %}{{ bos_token }}{% endif %}{% if "
        ));
        assert_eq!(md.get_u32("general.quantization_version").unwrap(), 2);

        assert_eq!(f.tensors().len(), 24);
        for (t, &(name, ty, ne, bytes, offset)) in f.tensors().iter().zip(TINY_TENSORS.iter()) {
            assert_eq!(t.name, name);
            assert_eq!(t.ggml_type.name(), ty, "{name}");
            assert_eq!(t.dims, ne, "{name}");
            assert_eq!(t.offset, offset, "{name}");
            assert_eq!(t.nbytes(), Some(bytes), "{name}");
            // Every size in this file is a multiple of 32, so no padding between tensors.
            assert_eq!(t.available, bytes, "{name}");
            assert_eq!(f.tensor_data(t).unwrap().len() as u64, bytes);
            assert_eq!(f.tensor_bytes(t).unwrap().len() as u64, bytes);
            assert_eq!(f.tensor(name), Some(t));
        }
        // The type summary line of testdata/golden/tiny/TENSORS.md.
        let sum = |ty: GgmlType| -> (usize, u64) {
            let ts: Vec<_> = f.tensors().iter().filter(|t| t.ggml_type == ty).collect();
            (ts.len(), ts.iter().map(|t| t.nbytes().unwrap()).sum())
        };
        assert_eq!(sum(GgmlType::F16), (1, 2179072));
        assert_eq!(sum(GgmlType::F32), (9, 11264));
        assert_eq!(sum(GgmlType::I2S), (14, 295360));

        // F16 embedding rows come straight from the map; first element is a finite f16.
        let emb = f.tensor("token_embd.weight").unwrap();
        let raw = f.tensor_data(emb).unwrap();
        let x = half::f16::from_le_bytes([raw[0], raw[1]]);
        assert!(x.is_finite());
        assert!(f.tensor("missing").is_none());
    }
}

#[test]
fn tiny_f32_tensor_table() {
    let path = golden("tiny/bitnet-tiny-f32.gguf");
    let f = GgufFile::open(&path, &Limits::default()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.tensors().len(), 24);
    // Same names and shapes as the I2_S file, every tensor F32, laid out back to back from
    // offset 0 (each size is a multiple of the 32-byte alignment), ending at the file end.
    let mut offset = 0u64;
    for (t, &(name, _, ne, _, _)) in f.tensors().iter().zip(TINY_TENSORS.iter()) {
        let n: u64 = ne.iter().product();
        assert_eq!(t.name, name);
        assert_eq!(t.ggml_type, GgmlType::F32);
        assert_eq!(t.type_id, 0);
        assert_eq!(t.dims, ne);
        assert_eq!(t.offset, offset, "{name}");
        assert_eq!(t.nbytes(), Some(4 * n));
        assert_eq!(t.available, 4 * n);
        offset += 4 * n;
    }
    assert_eq!(f.data_offset() + offset, f.file_size());
    // The norm weights of a trained-or-seeded model are finite.
    let norm = f
        .tensor_data(f.tensor("output_norm.weight").unwrap())
        .unwrap();
    assert!(norm
        .chunks_exact(4)
        .all(|c| f32::from_le_bytes(c.try_into().unwrap()).is_finite()));
}

#[test]
fn llama3_vocab_parses_quickly() {
    let path = golden("tokenizer/llama3-vocab.gguf");
    let t0 = Instant::now();
    let f = GgufFile::open(Path::new(&path), &Limits::default()).unwrap();
    let elapsed = t0.elapsed();
    let md = f.metadata();
    assert_eq!(
        md.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        128256
    );
    assert_eq!(
        md.get_str_array("tokenizer.ggml.merges").unwrap().len(),
        280147
    );
    assert_eq!(
        md.get_f32_array("tokenizer.ggml.scores").unwrap().len(),
        128256
    );
    assert_eq!(
        md.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        128256
    );
    assert_eq!(md.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 128000);
    assert!(f.tensors().is_empty());
    // This file omits the final padding; data_offset never exceeds the file size.
    assert!(f.data_offset() <= f.file_size());
    // ~0.1 s at opt-level 2 on the reference machine; generous bound for loaded CI.
    assert!(elapsed.as_secs_f64() < 5.0, "vocab parse took {elapsed:?}");
    eprintln!("llama3 vocab parse: {elapsed:?}");
    assert!(matches!(
        md.get("tokenizer.ggml.add_bos_token"),
        Some(Value::Bool(true))
    ));
}
