//! Typed errors for building and using a tokenizer.

use bitnet_gguf::GgufError;

/// Everything that can go wrong while building a tokenizer from a (possibly hostile)
/// vocabulary, or while encoding and decoding.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A metadata key is missing or has the wrong type.
    #[error("tokenizer metadata: {0}")]
    Metadata(#[from] GgufError),

    /// `tokenizer.ggml.model` names a tokenizer this crate does not implement.
    #[error("unsupported tokenizer model {0:?} (only byte-level BPE, \"gpt2\", is supported)")]
    UnsupportedModel(String),

    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error(
        "unknown pre-tokenizer {0:?} (known: llama-bpe/llama3, default, gpt-2, falcon3, qwen2)"
    )]
    UnknownPreTokenizer(String),

    /// The token list is empty.
    #[error("the vocabulary has no tokens")]
    EmptyVocab,

    /// More tokens than a `u32` id can address.
    #[error("the vocabulary has {0} tokens, more than a u32 id can address")]
    VocabTooLarge(usize),

    /// A per-token array does not have one entry per token.
    #[error("{key} has {got} entries but the vocabulary has {expected} tokens")]
    LengthMismatch {
        /// The metadata key of the array.
        key: &'static str,
        /// The number of tokens.
        expected: usize,
        /// The array's length.
        got: usize,
    },

    /// A token type outside the known range (0..=6).
    #[error("token {id} has unknown token type {ty}")]
    BadTokenType {
        /// The token id.
        id: u32,
        /// The stored type value.
        ty: i32,
    },

    /// A special-token id (BOS, EOS, ...) is negative or not below the vocabulary size.
    #[error("{key} = {id} is not a token id (vocabulary size {n_vocab})")]
    SpecialIdOutOfRange {
        /// The metadata key holding the id.
        key: &'static str,
        /// The stored value.
        id: i64,
        /// The vocabulary size.
        n_vocab: usize,
    },

    /// A byte-level BPE vocabulary lacks the token of one of the 256 bytes.
    #[error("the vocabulary has no token for byte 0x{0:02X}")]
    MissingByteToken(u8),

    /// A merge rule is malformed or names tokens that do not exist.
    #[error("merge #{index} {merge:?}: {reason}")]
    BadMerge {
        /// Position in `tokenizer.ggml.merges`.
        index: usize,
        /// The merge text (truncated to 64 bytes).
        merge: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The BPE model could not be built or run.
    #[error("BPE model: {0}")]
    Bpe(String),

    /// The pre-tokenizer regex failed (e.g. its backtracking limit was hit).
    #[error("pre-tokenizer regex: {0}")]
    Regex(String),

    /// A token id is not below the vocabulary size.
    #[error("token id {id} is out of range (vocabulary size {n_vocab})")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },

    /// BOS was requested but the vocabulary defines none.
    #[error("a BOS token was requested but the vocabulary has none")]
    NoBosToken,

    /// A special token the operation needs (e.g. `<|eot_id|>` for chat) is absent.
    #[error("the vocabulary has no {0} token")]
    MissingSpecialToken(&'static str),

    /// A chat role other than system, user or assistant.
    #[error("unknown chat role {0:?} (expected system, user or assistant)")]
    UnknownRole(String),
    /// A chat format name other than bitnet, llama3 or falcon3.
    #[error("unknown chat format {0:?} (expected bitnet, llama3 or falcon3)")]
    UnknownChatFormat(String),
}
