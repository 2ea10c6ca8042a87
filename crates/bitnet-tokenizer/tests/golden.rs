//! Reference tokenizations: Hugging Face `tokenizers` with the LLaMA-3 tokenizer.json
//! and bitnet.cpp's `llama-tokenize` (testdata/golden, see its README).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers

use std::sync::OnceLock;

use bitnet_gguf::{GgufFile, Limits};
use bitnet_testdata::ids;
use bitnet_tokenizer::{PreTokenizer, PreTokenizerSource, Tokenizer};

fn metadata(rel: &str) -> GgufFile {
    GgufFile::open(&bitnet_testdata::golden(rel), &Limits::default()).unwrap()
}

fn llama3(pre: Option<PreTokenizer>) -> &'static Tokenizer {
    static AUTO: OnceLock<Tokenizer> = OnceLock::new();
    static DEFAULT: OnceLock<Tokenizer> = OnceLock::new();
    let cell = match pre {
        None => &AUTO,
        Some(PreTokenizer::Default) => &DEFAULT,
        Some(other) => panic!("no cached tokenizer for {other:?}"),
    };
    cell.get_or_init(|| {
        let f = metadata("tokenizer/llama3-vocab.gguf");
        Tokenizer::from_gguf(f.metadata(), pre).unwrap()
    })
}

fn tiny(pre: Option<PreTokenizer>) -> Tokenizer {
    let f = metadata("tiny/bitnet-tiny-i2_s.gguf");
    Tokenizer::from_gguf(f.metadata(), pre).unwrap()
}

struct Case {
    text: String,
    hf: Vec<u32>,
    bitnetcpp: Vec<u32>,
}

fn cases() -> Vec<Case> {
    let s = std::fs::read_to_string(bitnet_testdata::golden_str("tokenizer/cases.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().unwrap().to_owned(),
            hf: ids(&c["hf_llama3_ids"]),
            bitnetcpp: ids(&c["bitnetcpp_default_ids"]),
        })
        .collect()
}

#[test]
fn llama3_vocab_metadata() {
    let t = llama3(None);
    assert_eq!(t.n_vocab(), 128_256);
    assert_eq!(t.bos(), Some(128_000));
    assert_eq!(t.eos(), Some(128_001));
    assert_eq!(t.pad(), Some(128_001));
    assert!(t.add_bos());
    assert!(t.is_llama3_vocab());
    assert_eq!(t.pre(), PreTokenizer::Llama3);
    assert_eq!(t.pre_source(), PreTokenizerSource::Llama3Vocab);
    assert_eq!(t.token_id("<|eot_id|>"), Some(128_009));
    assert_eq!(t.eot(), Some(128_009));
    assert_eq!(t.eom(), None);
    assert_eq!(t.eog_tokens(), &[128_001, 128_009]);
    assert!(t.is_eog(128_009) && t.is_eog(128_001) && !t.is_eog(128_000));
    assert_eq!(t.piece(128_000).unwrap(), "<|begin_of_text|>");
    assert_eq!(t.token_bytes(128_000).unwrap(), b"<|begin_of_text|>");
    assert_eq!(t.piece(220).unwrap(), "Ġ");
    assert_eq!(t.token_bytes(220).unwrap(), b" ");
}

#[test]
fn cases_match_hf_llama3_by_default() {
    let t = llama3(None);
    let cases = cases();
    assert_eq!(cases.len(), 12);
    for c in &cases {
        assert_eq!(
            t.encode(&c.text, false, true).unwrap(),
            c.hf,
            "text {:?}",
            c.text
        );
    }
}

#[test]
fn cases_match_bitnetcpp_in_default_mode() {
    let t = llama3(Some(PreTokenizer::Default));
    assert_eq!(t.pre_source(), PreTokenizerSource::Override);
    for c in &cases() {
        assert_eq!(
            t.encode(&c.text, false, true).unwrap(),
            c.bitnetcpp,
            "text {:?}",
            c.text
        );
    }
}

#[test]
fn cases_decode_back_to_their_text() {
    for c in &cases() {
        assert_eq!(llama3(None).decode(&c.hf).unwrap(), c.text);
        assert_eq!(llama3(None).decode(&c.bitnetcpp).unwrap(), c.text);
    }
}

#[test]
fn with_bos_prepends_128000() {
    let t = llama3(None);
    assert_eq!(
        t.encode("Hello world", true, false).unwrap(),
        vec![128_000, 9906, 1917]
    );
    assert_eq!(t.encode("", true, false).unwrap(), vec![128_000]);
    assert_eq!(t.encode("", false, false).unwrap(), Vec::<u32>::new());
}

const TINY_PROMPTS: [&str; 4] = ["p1_english", "p2_unicode", "p3_digits_punct", "p4_code_ws"];

#[test]
fn tiny_prompts_match_bitnetcpp_in_default_mode() {
    let t = tiny(Some(PreTokenizer::Default));
    assert_eq!(t.n_vocab(), 4256);
    assert_eq!(t.bos(), Some(4000));
    assert_eq!(t.eos(), Some(4001));
    assert_eq!(t.eot(), Some(4009));
    assert_eq!(t.eog_tokens(), &[4001, 4009]);
    assert!(t.add_bos());
    for p in TINY_PROMPTS {
        let text =
            std::fs::read_to_string(bitnet_testdata::golden_str(&format!("tiny/{p}.txt"))).unwrap();
        let json = std::fs::read_to_string(bitnet_testdata::golden_str(&format!(
            "tiny/{p}.tokens.json"
        )))
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let want = ids(&v["prompt_tokens"]);
        let listed = std::fs::read_to_string(bitnet_testdata::golden_str(&format!(
            "tiny/{p}.llama-tokenize.ids.txt"
        )))
        .unwrap();
        let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
        assert_eq!(ids(&listed), want, "{p}: golden files disagree");
        assert_eq!(t.encode(&text, t.add_bos(), true).unwrap(), want, "{p}");
        assert_eq!(t.decode(&want[1..]).unwrap(), text, "{p}");
    }
}

#[test]
fn tiny_vocab_counts_as_llama3() {
    let t = tiny(None);
    assert!(t.is_llama3_vocab());
    assert_eq!(t.pre(), PreTokenizer::Llama3);
    // Ids below 4000 are LLaMA-3's own: "The" = 791 and " the" = 279 (cases.json #2).
    assert_eq!(t.encode("The the", false, false).unwrap(), vec![791, 279]);
    assert_eq!(t.encode("<|eot_id|>", false, true).unwrap(), vec![4009]);
}

/// Falcon3's pre-tokenizer, named by the file (`tokenizer.ggml.pre = falcon3`), over the
/// LLaMA-3 merges gives bitnet.cpp's `llama-tokenize` ids (testdata/golden/tokenizer/
/// falcon3-cases.json; special-token text parsed, no BOS), and decodes back to the text.
#[test]
fn falcon3_pre_tokenizer_matches_bitnetcpp() {
    let f = metadata("tokenizer/llama3-vocab.gguf");
    let bytes = bitnet_testkit::rewrite(&f, |kv, _| {
        kv.push((
            "tokenizer.ggml.pre".into(),
            bitnet_gguf::Value::String("falcon3".into()),
        ));
    })
    .unwrap();
    let f = GgufFile::from_bytes(bytes, &Limits::default()).unwrap();
    let t = Tokenizer::from_gguf(f.metadata(), None).unwrap();
    assert_eq!(t.pre(), PreTokenizer::Falcon3);
    assert_eq!(t.pre_source(), PreTokenizerSource::Metadata);
    let s = std::fs::read_to_string(bitnet_testdata::golden_str("tokenizer/falcon3-cases.json"))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    let cases = v.as_array().unwrap();
    assert!(cases.len() >= 14);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want = ids(&c["bitnetcpp_falcon3_ids"]);
        assert_eq!(t.encode(text, false, true).unwrap(), want, "{text:?}");
        assert_eq!(t.decode(&want).unwrap(), text);
    }
}

/// A SentencePiece vocabulary (`tokenizer.ggml.model = llama`, as 1bitLLM's LLaMA-2 one):
/// bitnet.cpp's `llama-tokenize` ids (BOS added, special-token text parsed; scored merges, the
/// space prefix, byte fallback) for every text of testdata/golden/tokenizer/spm-cases.json,
/// and the texts back from the ids.
#[test]
fn sentencepiece_vocabulary_matches_bitnetcpp() {
    let f = metadata("tokenizer/spm-vocab.gguf");
    let t = Tokenizer::from_gguf(f.metadata(), None).unwrap();
    assert_eq!((t.bos(), t.eos(), t.add_bos()), (Some(1), Some(2), true));
    let s =
        std::fs::read_to_string(bitnet_testdata::golden_str("tokenizer/spm-cases.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    let cases = v.as_array().unwrap();
    assert!(cases.len() >= 18);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let want = ids(&c["bitnetcpp_ids"]);
        assert_eq!(t.encode(text, true, true).unwrap(), want, "{text:?}");
        if !text.contains("<s>") {
            assert_eq!(t.decode(&want[1..]).unwrap(), text, "{text:?}");
        }
    }
}

/// A SentencePiece vocabulary that does not say whether to add BOS gets one, as llama.cpp
/// decides: bitnet.cpp's `llama-tokenize` ids for spm-vocab.gguf less its
/// `tokenizer.ggml.add_bos_token` key (testdata/golden/tokenizer/spm-default-bos.json).
#[test]
fn sentencepiece_vocabulary_without_add_bos_key_adds_bos() {
    let f = metadata("tokenizer/spm-vocab.gguf");
    let mut v = bitnet_tokenizer::VocabData::from_metadata(f.metadata()).unwrap();
    assert_eq!(v.add_bos, Some(true), "the source file carries the key");
    v.add_bos = None;
    let t = Tokenizer::from_vocab(v, None).unwrap();
    let s = std::fs::read_to_string(bitnet_testdata::golden_str(
        "tokenizer/spm-default-bos.json",
    ))
    .unwrap();
    let c: serde_json::Value = serde_json::from_str(&s).unwrap();
    let want = ids(&c["bitnetcpp_ids"]);
    assert_eq!(want.first(), Some(&1), "bitnet.cpp added BOS");
    assert!(t.add_bos());
    let text = c["text"].as_str().unwrap();
    assert_eq!(t.encode(text, t.add_bos(), true).unwrap(), want);
}
