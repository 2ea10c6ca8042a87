//! Arbitrary text → the tokenizers (LLaMA-3's byte-level BPE with its pre-tokenizer and with
//! Falcon3's, and a SentencePiece vocabulary), with and without special-token parsing, and
//! the chat formats over arbitrary messages.
//!
//! Byte 0 picks the tokenizer and the flags; the rest is the text (lossy UTF-8). Checks: no
//! panic; every id is below the vocabulary size; byte-level BPE without special parsing
//! decodes back to the text exactly; a chat's ids are those of its formatted text.
#![no_main]

use std::sync::OnceLock;

use bitnet_gguf::{GgufFile, Limits};
use bitnet_tokenizer::{ChatFormat, ChatMessage, ChatRole, PreTokenizer, Tokenizer};
use libfuzzer_sys::fuzz_target;

const LLAMA3: &[u8] = include_bytes!("../../testdata/golden/tokenizer/llama3-vocab.gguf");
const SPM: &[u8] = include_bytes!("../../testdata/golden/tokenizer/spm-vocab.gguf");

fn load(bytes: &[u8], pre: Option<PreTokenizer>) -> Tokenizer {
    let f = GgufFile::from_bytes(bytes.to_vec(), &Limits::default()).expect("vocabulary parses");
    Tokenizer::from_gguf(f.metadata(), pre).expect("vocabulary loads")
}

/// Row: LLaMA-3's BPE, the same with Falcon3's pre-tokenizer, SentencePiece; column: the chat
/// format set (2B-4T's, LLaMA-3's, Falcon3's). Built once: a clone per input would cost more
/// than the encoding under test.
fn tokenizers() -> &'static [[Tokenizer; 3]; 3] {
    static T: OnceLock<[[Tokenizer; 3]; 3]> = OnceLock::new();
    T.get_or_init(|| {
        let with = |bytes: &[u8], pre: Option<PreTokenizer>| {
            let t = load(bytes, pre);
            [ChatFormat::Bitnet, ChatFormat::Llama3, ChatFormat::Falcon3].map(|f| {
                let mut t = t.clone();
                t.set_chat_format(f);
                t
            })
        };
        let falcon3 = || Some(PreTokenizer::from_gguf_name("falcon3").expect("falcon3 exists"));
        [with(LLAMA3, None), with(LLAMA3, falcon3()), with(SPM, None)]
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let row = &tokenizers()[usize::from(sel % 3)];
    let tok = &row[0];
    let special = sel & 0x10 != 0;
    let bos = sel & 0x20 != 0;
    let Ok(ids) = tok.encode(&text, bos, special) else {
        return;
    };
    assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
    if sel % 3 < 2 && !special && !bos {
        assert_eq!(tok.decode(&ids).expect("its own ids decode"), text);
    }

    // The same text as chat messages (split at NUL bytes), in each format.
    if sel & 0x40 != 0 {
        let roles = [
            ChatRole::System,
            ChatRole::User,
            ChatRole::Assistant,
            ChatRole::Tool,
        ];
        let msgs: Vec<ChatMessage> = text
            .split('\0')
            .enumerate()
            .map(|(i, c)| ChatMessage::new(roles[i % roles.len()], c))
            .collect();
        for t in row {
            if let Ok(ids) = t.encode_chat(&msgs, sel & 0x80 != 0) {
                assert!(ids.iter().all(|&id| (id as usize) < t.n_vocab()));
            }
        }
    }
});
