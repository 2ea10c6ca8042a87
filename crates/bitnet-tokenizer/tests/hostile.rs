//! Hostile vocabularies and inputs (docs/RELIABILITY.md §4 C, D, E): typed errors, no
//! panics, bounded time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bitnet_gguf::{Array, GgufFile, Limits, Metadata, Value};
use bitnet_testkit::Xorshift;
use bitnet_tokenizer::{
    keys, PreTokenizer, PreTokenizerSource, StreamDecoder, Tokenizer, TokenizerError, VocabData,
};

fn llama3() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let p = bitnet_testdata::golden_str("tokenizer/llama3-vocab.gguf");
        let f = GgufFile::open(Path::new(&p), &Limits::default()).unwrap();
        Tokenizer::from_gguf(f.metadata(), None).unwrap()
    })
}

/// GPT-2's byte-to-character table, written out independently of the crate.
fn byte_char(b: u8) -> char {
    let printable = |x: u8| {
        (b'!'..=b'~').contains(&x) || (0xA1..=0xAC).contains(&x) || (0xAE..=0xFF).contains(&x)
    };
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count();
    char::from_u32(256 + u32::try_from(rank).unwrap()).unwrap()
}

/// A small valid vocabulary: 256 byte tokens (ids = byte values), "ab" 256, "abc" 257,
/// " a" ("Ġa") 258, and specials: BOS `<s>` 259, EOS `</s>` 260, `<|eot_id|>` 261
/// (control) and `<tool>` 262 (user-defined).
fn small_vocab() -> VocabData {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    tokens.extend(["ab", "abc", "Ġa", "<s>", "</s>", "<|eot_id|>", "<tool>"].map(String::from));
    let mut types = vec![1; 259];
    types.extend([3, 3, 3, 4]);
    VocabData {
        model: "gpt2".into(),
        pre: Some("default".into()),
        tokens,
        token_types: Some(types),
        scores_len: None,
        merges: vec!["a b".into(), "ab c".into(), "Ġ a".into()],
        bos: Some(259),
        eos: Some(260),
        add_bos: Some(true),
        ..VocabData::default()
    }
}

fn build(v: VocabData) -> Result<Tokenizer, TokenizerError> {
    Tokenizer::from_vocab(v, None)
}

#[test]
fn small_vocab_works() {
    let t = build(small_vocab()).unwrap();
    assert_eq!(t.pre(), PreTokenizer::Default);
    assert!(!t.is_llama3_vocab());
    // "abc" merges fully; in " ab" the rank-0 merge "a b" wins over rank-2 "Ġ a",
    // leaving the space alone; " a" merges via "Ġ a".
    assert_eq!(
        t.encode("abc ab a", true, false).unwrap(),
        vec![259, 257, byte_id(b' '), 256, 258]
    );
    // Control text is literal unless asked; user-defined text always matches.
    assert_eq!(t.encode("<|eot_id|>", false, true).unwrap(), vec![261]);
    assert_ne!(t.encode("<|eot_id|>", false, false).unwrap(), vec![261]);
    assert_eq!(t.encode("<tool>", false, false).unwrap(), vec![262]);
    assert_eq!(t.eog_tokens(), &[260, 261]);
}

fn byte_id(b: u8) -> u32 {
    u32::from(b) // the small vocabulary lists bytes in order
}

fn err(v: VocabData) -> TokenizerError {
    build(v).expect_err("hostile vocabulary accepted")
}

#[test]
fn hostile_vocabularies_are_typed_errors() {
    assert!(matches!(
        err(VocabData {
            tokens: vec![],
            token_types: None,
            ..small_vocab()
        }),
        TokenizerError::EmptyVocab
    ));
    assert!(matches!(
        err(VocabData {
            model: "t5".into(),
            ..small_vocab()
        }),
        TokenizerError::UnsupportedModel(_)
    ));
    // SentencePiece: scores of the wrong length; a text whose pieces and bytes have no token
    // is an error naming the byte, not a panic or a dropped character.
    let spm = |scores: Vec<f32>| VocabData {
        model: "llama".into(),
        tokens: ["<unk>", "<s>", "</s>", "\u{2581}a", "b"]
            .map(String::from)
            .to_vec(),
        token_types: Some(vec![2, 3, 3, 1, 1]),
        scores_len: Some(scores.len()),
        scores: Some(scores),
        bos: Some(1),
        ..VocabData::default()
    };
    assert!(matches!(
        err(spm(vec![0.0; 4])),
        TokenizerError::LengthMismatch { .. }
    ));
    let t = build(spm(vec![0.0; 5])).unwrap();
    assert_eq!(t.encode("a", false, false).unwrap(), vec![3]);
    assert!(matches!(
        t.encode("ab z", false, false),
        Err(TokenizerError::MissingByteToken(0xE2))
    ));
    assert!(matches!(
        err(VocabData {
            pre: Some("deepseek-llm".into()),
            ..small_vocab()
        }),
        TokenizerError::UnknownPreTokenizer(_)
    ));
    // An empty key counts as absent (not a LLaMA-3 vocabulary: llama.cpp's default).
    let t = build(VocabData {
        pre: Some(String::new()),
        ..small_vocab()
    })
    .unwrap();
    assert_eq!(
        (t.pre(), t.pre_source()),
        (PreTokenizer::Default, PreTokenizerSource::Fallback)
    );
    let t = build(VocabData {
        pre: Some("gpt-2".into()),
        ..small_vocab()
    })
    .unwrap();
    assert_eq!(
        (t.pre(), t.pre_source()),
        (PreTokenizer::Gpt2, PreTokenizerSource::Metadata)
    );
    // An override does not look at the key.
    assert!(Tokenizer::from_vocab(
        VocabData {
            pre: Some("deepseek-llm".into()),
            ..small_vocab()
        },
        Some(PreTokenizer::Llama3)
    )
    .is_ok());

    let mut v = small_vocab();
    v.token_types.as_mut().unwrap().pop();
    assert!(matches!(
        err(v),
        TokenizerError::LengthMismatch {
            key: keys::TOKEN_TYPE,
            expected: 263,
            got: 262
        }
    ));
    let mut v = small_vocab();
    v.token_types.as_mut().unwrap()[5] = 9;
    assert!(matches!(
        err(v),
        TokenizerError::BadTokenType { id: 5, ty: 9 }
    ));
    let v = VocabData {
        scores_len: Some(3),
        ..small_vocab()
    };
    assert!(matches!(
        err(v),
        TokenizerError::LengthMismatch {
            key: keys::SCORES,
            ..
        }
    ));

    for (bad, key) in [
        (-1, keys::BOS_ID),
        (263, keys::BOS_ID),
        (i64::MAX, keys::BOS_ID),
    ] {
        let e = err(VocabData {
            bos: Some(bad),
            ..small_vocab()
        });
        assert!(
            matches!(e, TokenizerError::SpecialIdOutOfRange { key: k, id, n_vocab: 263 } if k == key && id == bad),
            "{e}"
        );
    }
    assert!(matches!(
        err(VocabData {
            eos: Some(1 << 40),
            ..small_vocab()
        }),
        TokenizerError::SpecialIdOutOfRange {
            key: keys::EOS_ID,
            ..
        }
    ));
    assert!(matches!(
        err(VocabData {
            eot: Some(-5),
            ..small_vocab()
        }),
        TokenizerError::SpecialIdOutOfRange {
            key: keys::EOT_ID,
            ..
        }
    ));
    assert!(matches!(
        err(VocabData {
            pad: Some(263),
            ..small_vocab()
        }),
        TokenizerError::SpecialIdOutOfRange {
            key: keys::PAD_ID,
            ..
        }
    ));

    // A byte without a token would silently drop input bytes.
    let mut v = small_vocab();
    v.tokens[0x41] = "A_renamed".into();
    assert!(matches!(err(v), TokenizerError::MissingByteToken(0x41)));

    for (merge, index) in [
        ("ab", 1usize),
        (" b", 1),
        ("a ", 1),
        ("x y", 1),
        ("b a", 1),
        ("", 1),
    ] {
        let mut v = small_vocab();
        v.merges.insert(1, merge.into());
        let e = err(v);
        assert!(
            matches!(e, TokenizerError::BadMerge { index: i, .. } if i == index),
            "{merge:?}: {e}"
        );
    }
}

#[test]
fn tolerated_oddities_have_defined_behaviour() {
    // Duplicate merges keep the first rank; duplicate token texts map to the lowest id.
    let mut v = small_vocab();
    v.merges.push("a b".into());
    v.tokens.push("ab".into());
    v.token_types.as_mut().unwrap().push(1);
    let t = build(v).unwrap();
    assert_eq!(t.token_id("ab"), Some(256));
    assert_eq!(t.encode("ab", false, false).unwrap(), vec![256]);
    assert_eq!(t.decode(&[263]).unwrap(), "ab");
    // Tokens with NUL bytes and multi-kilobyte tokens are just text.
    let mut v = small_vocab();
    v.tokens.push("x\u{0}y".into());
    v.tokens.push("z".repeat(1 << 20));
    v.token_types.as_mut().unwrap().extend([1, 1]);
    let t = build(v).unwrap();
    assert_eq!(t.token_bytes(263).unwrap(), b"x\0y");
    assert_eq!(t.token_bytes(264).unwrap().len(), 1 << 20);
    // No token types: everything is normal, special text is never parsed.
    let t = build(VocabData {
        token_types: None,
        ..small_vocab()
    })
    .unwrap();
    assert_eq!(t.encode("<|eot_id|>", false, true).unwrap().len(), 10);
    // add_bos without a BOS id is off; asking for BOS then is an error.
    let t = build(VocabData {
        bos: None,
        ..small_vocab()
    })
    .unwrap();
    assert!(!t.add_bos());
    assert!(matches!(
        t.encode("a", true, false),
        Err(TokenizerError::NoBosToken)
    ));
}

fn md(entries: Vec<(&str, Value)>) -> Metadata {
    Metadata::from_entries(
        entries
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
    )
    .unwrap()
}

fn strings(v: &[String]) -> Value {
    Value::Array(Array::String(v.to_vec()))
}

#[test]
fn hostile_metadata_types() {
    let v = small_vocab();
    let base = || {
        vec![
            (keys::MODEL, Value::String("gpt2".into())),
            (keys::TOKENS, strings(&v.tokens)),
            (keys::MERGES, strings(&v.merges)),
        ]
    };
    assert!(Tokenizer::from_gguf(&md(base()), None).is_ok());
    let with = |k: &'static str, val: Value| {
        let mut e = base();
        e.retain(|(key, _)| *key != k);
        e.push((k, val));
        Tokenizer::from_gguf(&md(e), None)
    };
    let is_md_err =
        |r: Result<Tokenizer, TokenizerError>| matches!(r, Err(TokenizerError::Metadata(_)));
    assert!(is_md_err(with(
        keys::TOKENS,
        Value::Array(Array::I32(vec![1, 2]))
    )));
    assert!(is_md_err(with(keys::MODEL, Value::U32(2))));
    assert!(is_md_err(with(
        keys::TOKEN_TYPE,
        Value::Array(Array::F32(vec![1.0; 263]))
    )));
    assert!(is_md_err(with(
        keys::SCORES,
        Value::Array(Array::I32(vec![0; 263]))
    )));
    assert!(is_md_err(with(keys::BOS_ID, Value::String("1".into()))));
    assert!(is_md_err(with(keys::ADD_BOS, Value::U8(1))));
    assert!(is_md_err(with(keys::PRE, Value::Bool(true))));
    assert!(is_md_err(with(
        keys::MERGES,
        Value::Array(Array::U8(vec![]))
    )));
    // The scores' element type is checked even though BPE does not use them.
    assert!(matches!(
        with(keys::SCORES, Value::Array(Array::F32(vec![0.0; 7]))),
        Err(TokenizerError::LengthMismatch {
            key: keys::SCORES,
            ..
        })
    ));
    assert!(matches!(
        with(keys::TOKEN_TYPE, Value::Array(Array::I32(vec![1; 300]))),
        Err(TokenizerError::LengthMismatch {
            key: keys::TOKEN_TYPE,
            ..
        })
    ));
    assert!(matches!(
        with(keys::BOS_ID, Value::I32(-1)),
        Err(TokenizerError::SpecialIdOutOfRange { .. })
    ));
    assert!(matches!(
        with(keys::TOKENS, strings(&[])),
        Err(TokenizerError::EmptyVocab)
    ));
    // Missing required keys.
    let mut e = base();
    e.retain(|(k, _)| *k != keys::TOKENS);
    assert!(is_md_err(Tokenizer::from_gguf(&md(e), None)));
    // No merges at all: the merge-free vocabulary still encodes byte by byte.
    let mut e = base();
    e.retain(|(k, _)| *k != keys::MERGES);
    let t = Tokenizer::from_gguf(&md(e), None).unwrap();
    assert_eq!(
        t.encode("ab", false, false).unwrap(),
        vec![byte_id(b'a'), byte_id(b'b')]
    );
}

#[test]
fn out_of_range_ids_are_errors() {
    let t = llama3();
    for id in [128_256, u32::MAX] {
        assert!(matches!(
            t.decode(&[1, id]),
            Err(TokenizerError::TokenOutOfRange {
                n_vocab: 128_256,
                ..
            })
        ));
        assert!(t.piece(id).is_err());
        assert!(t.token_bytes(id).is_err());
        assert!(StreamDecoder::new().push(t, id).is_err());
        assert!(!t.is_eog(id));
        assert_eq!(t.token_kind(id), None);
    }
    // Control tokens decode to their text.
    assert_eq!(t.decode(&[128_009]).unwrap(), "<|eot_id|>");
}

#[test]
fn awkward_prompts() {
    let t = llama3();
    assert_eq!(t.encode("", false, true).unwrap(), Vec::<u32>::new());
    for text in [
        " ",
        "   \n\t  ",
        "\u{0}",
        "\u{200b}\u{200d}\u{feff}",
        "\u{d7ff}\u{e000}\u{10ffff}",
    ] {
        let ids = t.encode(text, false, false).unwrap();
        assert!(!ids.is_empty());
        assert_eq!(t.decode(&ids).unwrap(), text);
    }
    // Special text without special parsing is literal text.
    let ids = t.encode("<|eot_id|>", false, false).unwrap();
    assert!(!ids.contains(&128_009) && ids.len() > 1);
    assert_eq!(t.decode(&ids).unwrap(), "<|eot_id|>");
    // Half a special token, and one inside a word.
    let ids = t.encode("x<|eot_id|>y<|eot_id", false, true).unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == 128_009).count(), 1);
    assert_eq!(t.decode(&ids).unwrap(), "x<|eot_id|>y<|eot_id");
}

/// Encodes `unit` repeated `n` times; returns the elapsed time.
fn time_repeat(t: &Tokenizer, unit: &str, n: usize) -> Duration {
    let text = unit.repeat(n);
    let start = Instant::now();
    let ids = t.encode(&text, false, false).unwrap();
    let el = start.elapsed();
    assert_eq!(t.decode(&ids).unwrap(), text);
    el
}

#[test]
fn long_repetitive_prompts_take_linear_time() {
    let t = llama3();
    let units = [
        "a", " ", "!", "日", "7", "\n ", " \t", "e\u{301}", "ab ", "🙂",
    ];
    let mut report = Vec::new();
    for unit in units {
        let small = time_repeat(t, unit, 25_000);
        let large = time_repeat(t, unit, 100_000);
        report.push(format!("{unit:?}: 25k {small:?}, 100k {large:?}"));
        // Generous absolute bound for a shared 2-core CI machine.
        assert!(
            large < Duration::from_secs(3),
            "{unit:?} x100k took {large:?}"
        );
        // 4x the input may cost at most ~12x the time (quadratic would be 16x), with
        // slack for timer noise on tiny durations.
        assert!(
            large <= small * 12 + Duration::from_millis(50),
            "{unit:?}: 25k {small:?}, 100k {large:?}"
        );
    }
    println!("{}", report.join("\n"));
}

/// One random edit of a `tokenizer.*` key: an entry of an array overwritten (an odd token
/// text, a NaN score, an out-of-range token type), duplicated or pushed, the array cut
/// short, a scalar replaced by an extreme value or another type, or the key removed.
fn random_vocab_edit(r: &mut Xorshift, kv: &mut Vec<(String, Value)>) -> String {
    let keys: Vec<usize> = (0..kv.len())
        .filter(|&i| kv[i].0.starts_with("tokenizer."))
        .collect();
    let i = keys[r.below(keys.len())];
    let name = kv[i].0.clone();
    if r.below(10) == 0 {
        kv.remove(i);
        return format!("remove {name}");
    }
    let texts = [
        "",
        " ",
        "ab",
        "a b",
        "<|eot_id|>",
        "<0xZZ>",
        "<0x41>",
        "▁",
        "Ġ",
        "ĠĠ",
        "\u{fffd}",
        "<s>",
        "</s>",
        "x y z",
    ];
    match &mut kv[i].1 {
        Value::Array(Array::String(v)) if !v.is_empty() => {
            let (a, b) = (r.below(v.len()), r.below(v.len()));
            match r.below(4) {
                0 => v[a] = texts[r.below(texts.len())].to_string(),
                1 => v[a] = v[b].clone(),
                2 => v.truncate(a.max(1)),
                _ => v.push(texts[r.below(texts.len())].to_string()),
            }
        }
        Value::Array(Array::F32(v)) if !v.is_empty() => {
            let a = r.below(v.len());
            v[a] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30][r.below(4)];
        }
        Value::Array(Array::I32(v)) if !v.is_empty() => {
            let a = r.below(v.len());
            v[a] = [-1, 0, 1, 2, 3, 4, 5, 6, 7, 100, i32::MIN, i32::MAX][r.below(12)];
        }
        Value::Array(a) => *a = Array::U8(vec![1, 2, 3]),
        v => {
            let scalars = [
                Value::U32(0),
                Value::U32(u32::MAX),
                Value::U32(255),
                Value::I32(-1),
                Value::Bool(true),
                Value::String(String::new()),
                Value::String("gpt2".into()),
                Value::String("llama".into()),
                Value::String("falcon3".into()),
                Value::String("<|assistant|><|user|>".into()),
                Value::F32(f32::NAN),
            ];
            *v = scalars[r.below(scalars.len())].clone();
        }
    }
    format!("edit {name}")
}

/// 300 random edits (one to three each) of the vocabularies of every kind the golden files
/// hold (byte-level BPE with LLaMA-3's, Falcon3's and Qwen's pre-tokenizers, SentencePiece,
/// Gemma's): each builds a tokenizer or gives a typed error, and a built one encodes,
/// decodes and picks a chat format without a panic.
#[test]
fn random_vocabulary_edits_never_panic() {
    let files = [
        "tokenizer/spm-vocab.gguf",
        "tiny/bitnet-tiny-i2_s.gguf",
        "falcon3-tiny/falcon3-tiny-i2_s.gguf",
        "1bitllm-tiny/1bitllm-tiny-i2_s.gguf",
        "embed/qwen3-converted.gguf",
        "embed/gemma3-converted.gguf",
    ];
    let parsed: Vec<GgufFile> = files
        .iter()
        .map(|f| GgufFile::from_bytes(bitnet_testdata::read(f), &Limits::default()).unwrap())
        .collect();
    let mut r = Xorshift(0x2545_f491_4f6c_dd1d);
    let mut built = 0;
    for i in 0..300 {
        let which = r.below(files.len());
        let mut edits = Vec::new();
        let bytes = bitnet_testkit::rewrite(&parsed[which], |kv, _| {
            for _ in 0..=r.below(3) {
                edits.push(random_vocab_edit(&mut r, kv));
            }
        })
        .unwrap();
        let f = GgufFile::from_bytes(bytes, &Limits::default()).unwrap();
        let run = std::panic::catch_unwind(|| {
            let Ok(t) = Tokenizer::from_gguf(f.metadata(), None) else {
                return false;
            };
            for text in [
                "Hello world",
                "  a  b\n\n\tc",
                "<|eot_id|><s></s>日本語 🎉 \u{0}",
                "",
            ] {
                for (bos, special) in [(false, false), (true, true)] {
                    if let Ok(ids) = t.encode(text, bos, special) {
                        let _ = t.decode(&ids);
                    }
                }
            }
            let _ = t.decode(&[0, 1, 2, u32::MAX]);
            let template = f.metadata().get_str("tokenizer.chat_template").ok();
            for arch in [Some("llama"), None] {
                let _ = bitnet_tokenizer::ChatFormat::detect(arch, template, |s| {
                    t.token_id(s).is_some()
                });
            }
            true
        });
        match run {
            Ok(ok) => built += usize::from(ok),
            Err(_) => panic!("edit {i} of {}: a panic after {edits:?}", files[which]),
        }
    }
    eprintln!("{built} of 300 edited vocabularies built");
    assert!(built >= 30, "only {built} of 300 edited vocabularies built");
}
