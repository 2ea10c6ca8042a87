//! Plain vocabulary data, read from GGUF metadata and validated before use.

use bitnet_gguf::{Array, Metadata, Value};

use crate::TokenizerError;

/// GGUF metadata keys of the tokenizer.
pub mod keys {
    pub const MODEL: &str = "tokenizer.ggml.model";
    pub const PRE: &str = "tokenizer.ggml.pre";
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    pub const SCORES: &str = "tokenizer.ggml.scores";
    pub const MERGES: &str = "tokenizer.ggml.merges";
    pub const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
    pub const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
    pub const EOT_ID: &str = "tokenizer.ggml.eot_token_id";
    pub const EOM_ID: &str = "tokenizer.ggml.eom_token_id";
    pub const PAD_ID: &str = "tokenizer.ggml.padding_token_id";
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    pub const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
}

/// llama.cpp token types (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// 0: undefined (treated like a normal token).
    Undefined,
    /// 1: an ordinary BPE token.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token such as `<|begin_of_text|>`; matched in text only when the
    /// caller asks for special-token parsing.
    Control,
    /// 4: a user-defined token; always matched in text, like HF added tokens.
    UserDefined,
    /// 5: an unused slot.
    Unused,
    /// 6: a byte token (`<0x41>`, SentencePiece vocabularies).
    Byte,
}

impl TokenKind {
    /// The kind for a stored type value; `None` outside 0..=6.
    pub fn from_i32(v: i32) -> Option<Self> {
        Some(match v {
            0 => Self::Undefined,
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => return None,
        })
    }

    /// Whether the token is matched by text rather than produced by BPE.
    pub fn is_special(&self) -> bool {
        matches!(self, Self::Control | Self::UserDefined | Self::Unknown)
    }
}

/// A vocabulary as plain data: what [`crate::Tokenizer::from_vocab`] builds from.
///
/// Special ids are kept as read (`i64`), so out-of-range values can be reported rather
/// than wrapped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VocabData {
    /// `tokenizer.ggml.model` (only `"gpt2"`, byte-level BPE, is supported).
    pub model: String,
    /// `tokenizer.ggml.pre`, if present.
    pub pre: Option<String>,
    /// Token texts, indexed by id (byte-level alphabet for BPE tokens).
    pub tokens: Vec<String>,
    /// Token types (see [`TokenKind`]); `None` means every token is normal.
    pub token_types: Option<Vec<i32>>,
    /// Length of `tokenizer.ggml.scores` if present (BPE does not use the values).
    pub scores_len: Option<usize>,
    /// Merge rules `"left right"`, highest priority first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<i64>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<i64>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot: Option<i64>,
    /// `tokenizer.ggml.eom_token_id`.
    pub eom: Option<i64>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<i64>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.scores` (SentencePiece vocabularies rank their pieces by them).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece; llama.cpp's default: true).
    pub add_space_prefix: Option<bool>,
}

fn opt_int(md: &Metadata, key: &str) -> Result<Option<i64>, TokenizerError> {
    if md.get(key).is_none() {
        return Ok(None);
    }
    Ok(Some(md.get_int(key)?))
}

fn opt_bool(md: &Metadata, key: &str) -> Result<Option<bool>, TokenizerError> {
    if md.get(key).is_none() {
        return Ok(None);
    }
    Ok(Some(md.get_bool(key)?))
}

impl VocabData {
    /// Reads the tokenizer keys from GGUF metadata. Missing required keys and keys of
    /// the wrong type are typed errors; consistency is checked when the tokenizer is
    /// built.
    pub fn from_metadata(md: &Metadata) -> Result<Self, TokenizerError> {
        let model = md.get_str(keys::MODEL)?.to_owned();
        let spm = model == "llama";
        let pre = match md.get(keys::PRE) {
            None => None,
            Some(_) => Some(md.get_str(keys::PRE)?.to_owned()),
        };
        let tokens = md.get_str_array(keys::TOKENS)?.to_vec();
        let token_types = match md.get(keys::TOKEN_TYPE) {
            None => None,
            Some(_) => Some(md.get_i32_array(keys::TOKEN_TYPE)?.to_vec()),
        };
        let scores = match md.get(keys::SCORES) {
            None => None,
            Some(Value::Array(Array::F32(v))) => Some(v.clone()),
            Some(_) => Some(md.get_f32_array(keys::SCORES)?.to_vec()),
        };
        let scores_len = scores.as_ref().map(Vec::len);
        // Merges are required for BPE; other models are rejected later with a clearer
        // error than "missing merges".
        let merges = match md.get(keys::MERGES) {
            None => Vec::new(),
            Some(_) => md.get_str_array(keys::MERGES)?.to_vec(),
        };
        Ok(Self {
            model,
            pre,
            tokens,
            token_types,
            scores_len,
            merges,
            bos: opt_int(md, keys::BOS_ID)?,
            eos: opt_int(md, keys::EOS_ID)?,
            eot: opt_int(md, keys::EOT_ID)?,
            eom: opt_int(md, keys::EOM_ID)?,
            pad: opt_int(md, keys::PAD_ID)?,
            add_bos: opt_bool(md, keys::ADD_BOS)?,
            add_eos: opt_bool(md, keys::ADD_EOS)?,
            // Only a SentencePiece vocabulary needs the values.
            scores: scores.filter(|_| spm),
            add_space_prefix: opt_bool(md, keys::ADD_SPACE_PREFIX)?,
        })
    }
}
