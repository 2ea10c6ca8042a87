//! Real vocabularies from llama.cpp's tokenizer tests (testdata/golden/tokenizer/llama-cpp,
//! see its README): Qwen 2's byte-level BPE (151,936 tokens, `tokenizer.ggml.pre = qwen2`,
//! the vocabulary of Qwen 3 and so of bitnet.cpp's Qwen3 embedding model), LLaMA-2's
//! SentencePiece (32,000), and LLaMA-3's BPE (our `llama3-vocab.gguf`). The expected ids are
//! the Hugging Face tokenizer's (`encode(text, add_special_tokens=False)`, written by
//! llama.cpp's `convert_hf_to_gguf_update.py`), which llama.cpp's `test-tokenizer-0` holds
//! llama.cpp to.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers

use bitnet_gguf::{GgufFile, Limits};
use bitnet_tokenizer::Tokenizer;

fn texts() -> Vec<String> {
    let s = String::from_utf8(bitnet_testdata::read("tokenizer/llama-cpp/texts.inp")).unwrap();
    // Each text is followed by "\n__ggml_vocab_test__\n".
    let mut v: Vec<String> = s
        .split("\n__ggml_vocab_test__\n")
        .map(str::to_string)
        .collect();
    assert_eq!(
        v.pop().as_deref(),
        Some(""),
        "texts.inp ends with a separator"
    );
    v
}

fn expected(name: &str) -> Vec<Vec<u32>> {
    let s = String::from_utf8(bitnet_testdata::read(&format!(
        "tokenizer/llama-cpp/{name}.out"
    )))
    .unwrap();
    s.lines()
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect()
}

fn check(vocab: &str, name: &str) {
    let f = GgufFile::open(&bitnet_testdata::golden(vocab), &Limits::default()).unwrap();
    let tok = Tokenizer::from_gguf(f.metadata(), None).unwrap();
    let texts = texts();
    let want = expected(name);
    assert_eq!(texts.len(), want.len(), "{name}: texts vs expected lines");
    assert!(texts.len() >= 40, "{name}: only {} texts", texts.len());
    let mut bad = Vec::new();
    for (text, want) in texts.iter().zip(&want) {
        let got = tok.encode(text, false, false).unwrap();
        if &got != want {
            bad.push(format!("{text:?}: got {got:?}, want {want:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{name}: {} of {} differ:\n{}",
        bad.len(),
        texts.len(),
        bad.join("\n")
    );
}

#[test]
fn qwen2_vocabulary_tokenizes_as_hugging_face() {
    check("tokenizer/llama-cpp/qwen2-vocab.gguf", "qwen2");
}

#[test]
fn llama2_sentencepiece_vocabulary_tokenizes_as_hugging_face() {
    check("tokenizer/llama-cpp/llama-spm-vocab.gguf", "llama-spm");
}

#[test]
fn llama3_vocabulary_tokenizes_as_hugging_face_on_llama_cpp_texts() {
    check("tokenizer/llama3-vocab.gguf", "llama-bpe");
}
