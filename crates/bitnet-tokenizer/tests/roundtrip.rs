//! Every vocabulary token survives decode -> encode, and text survives encode -> decode.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers

use std::sync::OnceLock;

use bitnet_gguf::{GgufFile, Limits};
use bitnet_tokenizer::{PreTokenizer, TokenKind, Tokenizer};
use proptest::prelude::*;

fn load(rel: &str, pre: Option<PreTokenizer>) -> Tokenizer {
    let f = GgufFile::open(&bitnet_testdata::golden(rel), &Limits::default()).unwrap();
    Tokenizer::from_gguf(f.metadata(), pre).unwrap()
}

fn llama3() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load("tokenizer/llama3-vocab.gguf", None))
}

fn llama3_default() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load("tokenizer/llama3-vocab.gguf", Some(PreTokenizer::Default)))
}

#[derive(Debug, Default)]
struct Stats {
    ok: usize,
    /// Token bytes that are not UTF-8 on their own (part of a character).
    not_utf8: usize,
    /// Text the pre-tokenizer cuts into several pieces: no single token can result.
    multi_piece: Vec<u32>,
    /// One piece, valid UTF-8, but encoded differently.
    failed: Vec<(u32, Vec<u32>)>,
}

fn round_trip_all(t: &Tokenizer) -> Stats {
    let mut s = Stats::default();
    for id in 0..u32::try_from(t.n_vocab()).unwrap() {
        let bytes = t.token_bytes(id).unwrap();
        if t.token_kind(id) == Some(TokenKind::Control) {
            // Control tokens round-trip through special parsing only.
            let text = std::str::from_utf8(bytes).unwrap();
            assert_eq!(t.encode(text, false, true).unwrap(), vec![id]);
            assert_ne!(t.encode(text, false, false).unwrap(), vec![id]);
            continue;
        }
        let Ok(text) = std::str::from_utf8(bytes) else {
            s.not_utf8 += 1;
            continue;
        };
        // decode(encode(x)) == x holds for every piece of text, split or not.
        let ids = t.encode(text, false, false).unwrap();
        assert_eq!(t.decode(&ids).unwrap(), text, "token {id}");
        if ids == [id] {
            s.ok += 1;
        } else if t.pre_tokenize(text).unwrap().len() > 1 {
            s.multi_piece.push(id);
        } else {
            s.failed.push((id, ids));
        }
    }
    s
}

#[test]
fn every_llama3_token_round_trips() {
    let t = llama3();
    let s = round_trip_all(t);
    println!(
        "llama3: {} ok, {} partial UTF-8, {} multi-piece",
        s.ok,
        s.not_utf8,
        s.multi_piece.len()
    );
    assert!(
        s.failed.is_empty(),
        "{:?}",
        &s.failed[..s.failed.len().min(20)]
    );
    assert_eq!(s.ok + s.not_utf8 + s.multi_piece.len(), 128_000);
    // Every LLaMA-3 token is a single piece of its own pre-tokenizer.
    assert!(s.multi_piece.is_empty());
}

#[test]
fn every_llama3_token_round_trips_in_default_mode() {
    let t = llama3_default();
    let s = round_trip_all(t);
    println!(
        "default: {} ok, {} partial UTF-8, {} multi-piece, {} failed",
        s.ok,
        s.not_utf8,
        s.multi_piece.len(),
        s.failed.len()
    );
    // Without `ignore_merges` some tokens (e.g. " việc") are not reachable by the
    // merges, as in llama.cpp's default mode; decode(encode(x)) == x still holds
    // (checked inside `round_trip_all`).
}

#[test]
fn every_tiny_token_round_trips() {
    let t = load("tiny/bitnet-tiny-i2_s.gguf", None);
    let s = round_trip_all(&t);
    println!(
        "tiny: {} ok, {} partial UTF-8, {} multi-piece",
        s.ok,
        s.not_utf8,
        s.multi_piece.len()
    );
    assert!(s.multi_piece.is_empty());
    assert!(
        s.failed.is_empty(),
        "{:?}",
        &s.failed[..s.failed.len().min(20)]
    );
    assert_eq!(s.ok + s.not_utf8 + s.multi_piece.len(), 4000);
}

/// Text built from fragments that stress the pre-tokenizers: letters, digits,
/// punctuation, whitespace runs, CJK, emoji with joiners, combining marks and
/// special-token text.
fn tricky_text() -> impl Strategy<Value = String> {
    let frag = prop_oneof![
        any::<char>().prop_map(String::from),
        "[a-zA-Z]{1,8}",
        "[0-9]{1,7}",
        "[ \t\r\n]{1,4}",
        r"[!-/:-@\[-`{-~]{1,3}",
        Just("'s".to_owned()),
        Just("日本語".to_owned()),
        Just("👨\u{200d}👩\u{200d}👧".to_owned()),
        Just("e\u{301}\u{302}".to_owned()),
        Just("<|eot_id|>".to_owned()),
        Just("<|begin_of_text|>".to_owned()),
        Just("\u{0}".to_owned()),
    ];
    prop::collection::vec(frag, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn encode_then_decode_gives_the_text(text in tricky_text(), parse_special in any::<bool>(), default_mode in any::<bool>()) {
        let t = if default_mode { llama3_default() } else { llama3() };
        let ids = t.encode(&text, false, parse_special).unwrap();
        prop_assert_eq!(t.decode(&ids).unwrap(), text.clone());
        if !parse_special {
            // Special-token text stays literal.
            prop_assert!(ids.iter().all(|&id| t.token_kind(id) == Some(TokenKind::Normal)));
        }
        // Pieces concatenate to the text.
        prop_assert_eq!(t.pre_tokenize(&text).unwrap().concat(), text);
    }
}
