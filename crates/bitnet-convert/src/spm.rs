//! A SentencePiece `tokenizer.model` (1bitLLM's LLaMA-2 vocabulary) as GGUF tokenizer
//! metadata, as bitnet.cpp's converter writes it (`_set_vocab_sentencepiece` and gguf-py's
//! `SpecialVocab`):
//!
//! - every piece with its score; its type UNKNOWN, CONTROL, UNUSED or BYTE as SentencePiece
//!   marks it, any other (user-defined ones included) NORMAL;
//! - then the keys of `added_tokens.json` not already there (score −1000, USER_DEFINED), then
//!   `[PAD1]`, `[PAD2]`, … (score −1000, UNUSED) up to `vocab_size` of `config.json`;
//! - `tokenizer.ggml.model = llama`, `pre = default`; special token ids from `config.json`
//!   (`bos_token_id`, `eos_token_id`, `unk_token_id`, `sep_token_id`, `pad_token_id`,
//!   `cls_token_id`, `mask_token_id`, each below the vocabulary size); `add_bos_token` and
//!   `add_eos_token` and `chat_template` from `tokenizer_config.json`.
//!
//! The protobuf reader knows the fields of `ModelProto.pieces` (piece 1, score 2, type 3) and
//! skips every other field by its wire type; a malformed file is an error naming it.

use std::path::Path;

use bitnet_gguf::{Array, Value};

use crate::error::ConvertError;
use crate::hf::read_json;

const MODEL: &str = "tokenizer.model";

fn bad(why: impl Into<String>) -> ConvertError {
    ConvertError::TokenizerJson {
        file: MODEL,
        why: why.into(),
    }
}

/// One piece of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub text: String,
    pub score: f32,
    /// SentencePiece's type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub kind: i32,
}

struct Pb<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Pb<'a> {
    fn varint(&mut self) -> Result<u64, ConvertError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .b
                .get(self.pos)
                .ok_or_else(|| bad("a varint runs past the end"))?;
            self.pos += 1;
            v |= u64::from(byte & 0x7F) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("a varint longer than ten bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ConvertError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| bad("a field runs past the end"))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn len_delimited(&mut self) -> Result<&'a [u8], ConvertError> {
        let n = usize::try_from(self.varint()?).map_err(|_| bad("a field length overflows"))?;
        self.take(n)
    }

    /// The next (field number, wire type), or `None` at the end.
    fn key(&mut self) -> Result<Option<(u64, u8)>, ConvertError> {
        if self.pos >= self.b.len() {
            return Ok(None);
        }
        let k = self.varint()?;
        let wire = u8::try_from(k & 7).map_err(|_| bad("a bad wire type"))?;
        Ok(Some((k >> 3, wire)))
    }

    fn skip(&mut self, wire: u8) -> Result<(), ConvertError> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.take(8).map(drop),
            2 => self.len_delimited().map(drop),
            5 => self.take(4).map(drop),
            w => Err(bad(format!("wire type {w} is not supported"))),
        }
    }
}

/// The pieces of a `ModelProto`.
pub fn parse_model(b: &[u8]) -> Result<Vec<Piece>, ConvertError> {
    let mut pb = Pb { b, pos: 0 };
    let mut pieces = Vec::new();
    while let Some((field, wire)) = pb.key()? {
        if field != 1 || wire != 2 {
            pb.skip(wire)?;
            continue;
        }
        let mut p = Pb {
            b: pb.len_delimited()?,
            pos: 0,
        };
        let mut piece = Piece {
            text: String::new(),
            score: 0.0,
            kind: 1,
        };
        while let Some((f, w)) = p.key()? {
            match (f, w) {
                (1, 2) => {
                    piece.text = String::from_utf8(p.len_delimited()?.to_vec())
                        .map_err(|_| bad(format!("piece {} is not UTF-8", pieces.len())))?;
                }
                (2, 5) => {
                    let s = p.take(4)?;
                    piece.score = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                }
                (3, 0) => {
                    piece.kind = i32::try_from(p.varint()?)
                        .map_err(|_| bad(format!("piece {} has a bad type", pieces.len())))?;
                }
                (_, w) => p.skip(w)?,
            }
        }
        pieces.push(piece);
    }
    if pieces.is_empty() {
        return Err(bad("no pieces"));
    }
    Ok(pieces)
}

/// The tokenizer keys of a directory with a SentencePiece `tokenizer.model` (the module docs).
pub fn tokenizer_kv(
    dir: &Path,
    config: &serde_json::Value,
    n_vocab: usize,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let path = dir.join(MODEL);
    let bytes = std::fs::read(&path).map_err(ConvertError::io(&path))?;
    let pieces = parse_model(&bytes)?;
    let mut tokens = Vec::with_capacity(n_vocab);
    let mut scores = Vec::with_capacity(n_vocab);
    let mut types = Vec::with_capacity(n_vocab);
    for p in pieces {
        tokens.push(p.text);
        scores.push(p.score);
        // bitnet.cpp's converter asks is_unknown, is_control, is_unused, is_byte in turn.
        types.push(match p.kind {
            2 | 3 | 5 | 6 => p.kind,
            _ => 1,
        });
    }
    let added = dir.join("added_tokens.json");
    if added.is_file() {
        let map: serde_json::Map<String, serde_json::Value> = read_json(&added)?;
        for key in map.keys() {
            if !tokens.contains(key) {
                tokens.push(key.clone());
                scores.push(-1000.0);
                types.push(4);
            }
        }
    }
    if tokens.len() > n_vocab {
        return Err(bad(format!(
            "{} pieces, more than vocab_size {n_vocab}",
            tokens.len()
        )));
    }
    for i in 1..=n_vocab - tokens.len() {
        tokens.push(format!("[PAD{i}]"));
        scores.push(-1000.0);
        types.push(5);
    }
    let mut kv: Vec<(String, Value)> = vec![
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(tokens)),
        ),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array(Array::F32(scores)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
    ];
    for (typ, key) in [
        ("bos", "bos_token_id"),
        ("eos", "eos_token_id"),
        ("unk", "unknown_token_id"),
        ("sep", "seperator_token_id"),
        ("pad", "padding_token_id"),
        ("cls", "cls_token_id"),
        ("mask", "mask_token_id"),
    ] {
        let field = format!("{typ}_token_id");
        let Some(v) = config.get(&field) else {
            continue;
        };
        // gguf-py takes integers only (a list of EOS ids is skipped), refuses negatives and
        // skips ids past the vocabulary.
        if let Some(id) = v.as_i64() {
            let id = u32::try_from(id)
                .map_err(|_| bad(format!("config.json {field} = {id} is not a token id")))?;
            if usize::try_from(id).is_ok_and(|i| i < n_vocab) {
                kv.push((format!("tokenizer.ggml.{key}"), Value::U32(id)));
            }
        }
    }
    let tc_path = dir.join("tokenizer_config.json");
    if tc_path.is_file() {
        let tc: serde_json::Map<String, serde_json::Value> = read_json(&tc_path)?;
        for typ in ["bos", "eos"] {
            if let Some(b) = tc
                .get(&format!("add_{typ}_token"))
                .and_then(|v| v.as_bool())
            {
                kv.push((format!("tokenizer.ggml.add_{typ}_token"), Value::Bool(b)));
            }
        }
        if let Some(t) = tc.get("chat_template").and_then(|v| v.as_str()) {
            kv.push(("tokenizer.chat_template".into(), Value::String(t.into())));
        }
    }
    Ok(kv)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn malformed_models_are_errors() {
        for b in [
            &[][..],
            &[0x0A][..],
            &[0x0A, 0x05, 0x0A, 0x01][..],
            &[0x0A, 0x03, 0x0A, 0x01, 0xFF][..],
            &[0x0B][..],
            &[0x80; 12][..],
        ] {
            assert!(parse_model(b).is_err(), "{b:?}");
        }
        // One piece "a", score 1.5, type 3; a trainer spec after it, skipped.
        let mut b = vec![0x0A, 10, 0x0A, 1, b'a', 0x15];
        b.extend_from_slice(&1.5f32.to_le_bytes());
        b.extend_from_slice(&[0x18, 3, 0x12, 2, 0x18, 2]);
        assert_eq!(
            parse_model(&b).unwrap(),
            vec![Piece {
                text: "a".into(),
                score: 1.5,
                kind: 3
            }]
        );
    }
}
