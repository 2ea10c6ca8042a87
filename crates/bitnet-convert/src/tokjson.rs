//! `tokenizer.json` + `tokenizer_config.json` → the GGUF `tokenizer.*` keys (byte-level BPE,
//! `tokenizer.ggml.model = gpt2`, as llama.cpp's converter writes them).
//!
//! - tokens: `model.vocab` and `added_tokens` by id; ids below the vocabulary size that neither
//!   names become `[PAD{id}]` (type UNUSED), as llama.cpp pads them;
//! - token types: 1 NORMAL, 3 CONTROL (added and special), 4 USER_DEFINED (added, not special),
//!   5 UNUSED (padding);
//! - merges: `"a b"` strings (either JSON form, strings or pairs);
//! - BOS/EOS/padding: the text of `bos_token`/`eos_token`/`pad_token` in tokenizer_config.json,
//!   else the ids in config.json;
//! - `add_bos_token` from tokenizer_config.json, else true (LLaMA-3 adds BOS in its
//!   post-processor);
//! - the chat template string of tokenizer_config.json;
//! - `tokenizer.ggml.pre = llama-bpe` when the pre-tokenizer's split regex is LLaMA-3's;
//!   `falcon3` when it is a sequence with a `Punctuation` split and single `Digits` (Falcon3's
//!   tokenizer, which bitnet.cpp's converter names `falcon3`).

use std::collections::HashMap;
use std::path::Path;

use bitnet_gguf::{Array, Value};
use serde::Deserialize;

use crate::error::ConvertError;
use crate::hf::{json_id, read_json, HfConfig, JsonMap};

const TOKENIZER: &str = "tokenizer.json";
const TOKENIZER_CONFIG: &str = "tokenizer_config.json";

/// LLaMA-3's split regex as Hugging Face writes it (case-insensitive contractions).
const LLAMA3_HF_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

#[derive(Deserialize)]
struct TokenizerJson {
    model: BpeModel,
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
    #[serde(default)]
    pre_tokenizer: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct BpeModel {
    #[serde(rename = "type")]
    ty: String,
    vocab: HashMap<String, u64>,
    #[serde(default)]
    merges: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct AddedToken {
    id: u64,
    content: String,
    #[serde(default)]
    special: bool,
}

const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

fn bad(file: &'static str, why: impl Into<String>) -> ConvertError {
    ConvertError::TokenizerJson {
        file,
        why: why.into(),
    }
}

/// The `tokenizer.*` keys, in the official file's order. `n_vocab` is the embedding's row count.
pub fn tokenizer_kv(
    dir: &Path,
    config: &HfConfig,
    n_vocab: usize,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let tj: TokenizerJson = read_json(&dir.join(TOKENIZER))?;
    let tc_path = dir.join(TOKENIZER_CONFIG);
    let tc: JsonMap = if tc_path.is_file() {
        read_json(&tc_path)?
    } else {
        JsonMap::new()
    };
    if tj.model.ty != "BPE" {
        return Err(bad(
            TOKENIZER,
            format!(
                "model type {:?}: only byte-level BPE is supported",
                tj.model.ty
            ),
        ));
    }

    let mut tokens: Vec<Option<(String, i32)>> = vec![None; n_vocab];
    let mut place = |id: u64, text: &str, ty: i32, added: bool| -> Result<(), ConvertError> {
        let slot = usize::try_from(id)
            .ok()
            .and_then(|i| tokens.get_mut(i))
            .ok_or_else(|| {
                bad(
                    TOKENIZER,
                    format!("token {text:?} has id {id}, past the vocabulary size {n_vocab}"),
                )
            })?;
        match slot {
            Some((old, _)) if old != text && !added => Err(bad(
                TOKENIZER,
                format!("id {id} names both {old:?} and {text:?}"),
            )),
            _ => {
                *slot = Some((text.to_string(), ty));
                Ok(())
            }
        }
    };
    for (text, &id) in &tj.model.vocab {
        place(id, text, NORMAL, false)?;
    }
    for a in &tj.added_tokens {
        place(
            a.id,
            &a.content,
            if a.special { CONTROL } else { USER_DEFINED },
            true,
        )?;
    }
    let mut texts = Vec::with_capacity(n_vocab);
    let mut types = Vec::with_capacity(n_vocab);
    for (id, slot) in tokens.into_iter().enumerate() {
        match slot {
            Some((t, ty)) => {
                texts.push(t);
                types.push(ty);
            }
            None => {
                texts.push(format!("[PAD{id}]"));
                types.push(UNUSED);
            }
        }
    }
    let mut by_text: HashMap<&str, u32> = HashMap::with_capacity(texts.len());
    for (t, i) in texts.iter().zip(0u32..) {
        by_text.entry(t.as_str()).or_insert(i); // the first id wins
    }

    let mut merges = Vec::with_capacity(tj.model.merges.len());
    for (i, m) in tj.model.merges.iter().enumerate() {
        let s = match m {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(pair) => match pair.as_slice() {
                [serde_json::Value::String(a), serde_json::Value::String(b)] => format!("{a} {b}"),
                _ => {
                    return Err(bad(
                        TOKENIZER,
                        format!("merge {i} is not a pair of strings"),
                    ))
                }
            },
            _ => {
                return Err(bad(
                    TOKENIZER,
                    format!("merge {i} is not a string or a pair"),
                ))
            }
        };
        merges.push(s);
    }

    // Special tokens: the text in tokenizer_config.json, else the id in config.json.
    let special =
        |key: &str, fallback: Option<&serde_json::Value>| -> Result<Option<u32>, ConvertError> {
            let text = match tc.get(key) {
                Some(serde_json::Value::String(s)) => Some(s.as_str()),
                Some(serde_json::Value::Object(o)) => o.get("content").and_then(|c| c.as_str()),
                _ => None,
            };
            match text {
                Some(t) => by_text.get(t).copied().map(Some).ok_or_else(|| {
                    bad(
                        TOKENIZER_CONFIG,
                        format!("{key} {t:?} is not in the vocabulary"),
                    )
                }),
                None => match fallback {
                    None | Some(serde_json::Value::Null) => Ok(None),
                    Some(v) => {
                        let id = json_id(v).ok_or_else(|| ConvertError::Config {
                            key: format!("{key}_id"),
                            why: format!("{v} is not a token id"),
                        })?;
                        if usize::try_from(id).map_or(true, |i| i >= n_vocab) {
                            return Err(ConvertError::Config {
                                key: format!("{key}_id"),
                                why: format!("{id} is past the vocabulary size {n_vocab}"),
                            });
                        }
                        Ok(Some(id))
                    }
                },
            }
        };
    let bos = special("bos_token", config.bos_token_id.as_ref())?;
    let eos = special("eos_token", config.eos_token_id.as_ref())?;
    let pad = special("pad_token", config.pad_token_id.as_ref())?;
    let add_bos = match tc.get("add_bos_token") {
        Some(serde_json::Value::Bool(b)) => *b,
        _ => true,
    };
    let template = match tc.get("chat_template") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        // A list of named templates: the one called "default".
        Some(serde_json::Value::Array(list)) => list.iter().find_map(|t| {
            (t.get("name")?.as_str()? == "default")
                .then(|| t.get("template")?.as_str().map(str::to_string))
                .flatten()
        }),
        _ => None,
    };
    let llama3 = tj
        .pre_tokenizer
        .as_ref()
        .is_some_and(|p| has_split_regex(p, LLAMA3_HF_REGEX));

    let mut kv: Vec<(String, Value)> = vec![
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos)),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(texts)),
        ),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array(Array::F32(vec![0.0; n_vocab])),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(Array::String(merges)),
        ),
    ];
    for (key, id) in [
        ("tokenizer.ggml.bos_token_id", bos),
        ("tokenizer.ggml.eos_token_id", eos),
        ("tokenizer.ggml.padding_token_id", pad),
    ] {
        if let Some(id) = id {
            kv.push((key.into(), Value::U32(id)));
        }
    }
    if let Some(t) = template {
        kv.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    let falcon3 = tj.pre_tokenizer.as_ref().is_some_and(is_falcon3);
    if llama3 {
        kv.push((
            "tokenizer.ggml.pre".into(),
            Value::String("llama-bpe".into()),
        ));
    } else if falcon3 {
        kv.push(("tokenizer.ggml.pre".into(), Value::String("falcon3".into())));
    }
    Ok(kv)
}

/// Whether a pre-tokenizer is Falcon3's: a `Sequence` with a `Punctuation` split and a
/// `Digits` split into single digits.
fn is_falcon3(p: &serde_json::Value) -> bool {
    let Some(list) = p.get("pretokenizers").and_then(|s| s.as_array()) else {
        return false;
    };
    let has = |ty: &str| {
        list.iter()
            .any(|q| q.get("type").and_then(|t| t.as_str()) == Some(ty))
    };
    let single_digits = list.iter().any(|q| {
        q.get("type").and_then(|t| t.as_str()) == Some("Digits")
            && q.get("individual_digits").and_then(|v| v.as_bool()) == Some(true)
    });
    has("Punctuation") && single_digits
}

/// Whether a pre-tokenizer (a `Split`, or a `Sequence` holding one) splits with `regex`.
fn has_split_regex(p: &serde_json::Value, regex: &str) -> bool {
    match p.get("type").and_then(|t| t.as_str()) {
        Some("Split") => {
            p.get("pattern")
                .and_then(|pat| pat.get("Regex"))
                .and_then(|r| r.as_str())
                == Some(regex)
        }
        Some("Sequence") => p
            .get("pretokenizers")
            .and_then(|s| s.as_array())
            .is_some_and(|s| s.iter().any(|q| has_split_regex(q, regex))),
        _ => false,
    }
}
