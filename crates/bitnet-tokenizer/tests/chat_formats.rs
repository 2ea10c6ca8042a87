//! The chat formats of the ternary `llama` models (LLaMA-3's, Falcon3's) against bitnet.cpp's
//! `llama_chat_apply_template` (testdata/golden/tokenizer/chat-formats.json), and how a file
//! picks its format.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bitnet_gguf::{GgufFile, Limits, Value};
use bitnet_tokenizer::{format_chat_as, ChatFormat, ChatMessage, ChatRole, Tokenizer};

/// The LLaMA-3 vocabulary as a file of `arch` with `template` (if any).
fn tokenizer(arch: Option<&str>, template: Option<&str>) -> Tokenizer {
    let f = GgufFile::open(
        &bitnet_testdata::golden("tokenizer/llama3-vocab.gguf"),
        &Limits::default(),
    )
    .unwrap();
    let bytes = bitnet_testkit::rewrite(&f, |kv, _| {
        kv.retain(|(k, _)| k != "tokenizer.chat_template" && k != "general.architecture");
        if let Some(a) = arch {
            kv.push(("general.architecture".into(), Value::String(a.into())));
        }
        if let Some(t) = template {
            kv.push(("tokenizer.chat_template".into(), Value::String(t.into())));
        }
    })
    .unwrap();
    let f = GgufFile::from_bytes(bytes, &Limits::default()).unwrap();
    Tokenizer::from_gguf(f.metadata(), None).unwrap()
}

/// The conversation dump_chat.cpp formats.
fn chat() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new(ChatRole::System, "You are a helpful assistant."),
        ChatMessage::new(ChatRole::User, "  Hi there!\n"),
        ChatMessage::new(ChatRole::Assistant, "Hello. <|eot_id|> is just text here."),
        ChatMessage::new(ChatRole::User, "What is 2+2?"),
    ]
}

#[test]
fn prompts_match_bitnet_cpp_and_contents_stay_literal() {
    let s = std::fs::read_to_string(bitnet_testdata::golden_str("tokenizer/chat-formats.json"))
        .unwrap();
    let cases: serde_json::Value = serde_json::from_str(&s).unwrap();
    let cases = cases.as_array().unwrap();
    assert_eq!(cases.len(), 4);
    let literal = "Hello. <|eot_id|> is just text here.";
    for c in cases {
        let format: ChatFormat = c["format"].as_str().unwrap().parse().unwrap();
        let add = c["add_generation_prompt"].as_bool().unwrap();
        let want = c["prompt"].as_str().unwrap();
        assert_eq!(
            format_chat_as(format, &chat(), add),
            want,
            "{format:?} {add}"
        );
        // The ids: BOS, then the prompt tokenized at once with its markers as special tokens
        // (a conversation without marker text in its contents, where llama.cpp and this
        // tokenizer must agree exactly).
        let mut t = tokenizer(Some("llama"), None);
        t.set_chat_format(format);
        let plain = "Hello. This is just text here.";
        let mut msgs = chat();
        msgs[2].content = plain.into();
        let mut ids = vec![t.bos().unwrap()];
        ids.extend(
            t.encode(&want.replace(literal, plain), false, true)
                .unwrap(),
        );
        assert_eq!(t.encode_chat(&msgs, add).unwrap(), ids, "{format:?} {add}");
        // Marker text inside a message stays text: `<|eot_id|>` appears only where the
        // LLaMA-3 format closes a message.
        let eot = t.token_id("<|eot_id|>").unwrap();
        let n_eot = t
            .encode_chat(&chat(), add)
            .unwrap()
            .iter()
            .filter(|&&i| i == eot)
            .count();
        let closes = if format == ChatFormat::Llama3 { 4 } else { 0 };
        assert_eq!(n_eot, closes, "{format:?} {add}");
    }
}

#[test]
fn a_file_picks_its_format() {
    let llama3 = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}";
    let falcon3 = "{{ '<|user|>\\n' }}{{ '<|assistant|>\\n' }}";
    let bitnet = "{{ 'Assistant: ' }}";
    for (arch, template, want) in [
        // The bitnet architectures keep 2B-4T's format whatever the template says.
        (Some("bitnet-b1.58"), Some(llama3), ChatFormat::Bitnet),
        (None, Some(llama3), ChatFormat::Bitnet),
        (Some("llama"), Some(llama3), ChatFormat::Llama3),
        (Some("llama"), Some(falcon3), ChatFormat::Falcon3),
        (Some("llama"), Some(bitnet), ChatFormat::Bitnet),
        // No template it knows: the LLaMA-3 vocabulary's header tokens decide.
        (Some("llama"), None, ChatFormat::Llama3),
        (Some("llama"), Some("{{ messages }}"), ChatFormat::Llama3),
    ] {
        assert_eq!(
            tokenizer(arch, template).chat_format(),
            want,
            "{arch:?} {template:?}"
        );
    }
    assert!("chatml".parse::<ChatFormat>().is_err());
}
