#![forbid(unsafe_code)]
//! Byte-level BPE tokenizer built from a GGUF vocabulary (LLaMA-3 for BitNet b1.58
//! 2B-4T; SentencePiece vocabularies too, as 1bitLLM's files carry), with special-token
//! parsing, streaming UTF-8-safe decoding, stop tokens and the model's chat format.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use bitnet_tokenizer::{ChatMessage, ChatRole, StreamDecoder, Tokenizer};
//! let file = bitnet_gguf::GgufFile::open("model.gguf".as_ref(), &Default::default())?;
//! let tok = Tokenizer::from_gguf(file.metadata(), None)?;
//! let prompt = tok.encode_chat(&[ChatMessage::new(ChatRole::User, "Hi")], true)?;
//! let mut out = StreamDecoder::new();
//! for &id in &prompt {
//!     print!("{}", out.push(&tok, id)?);
//! }
//! print!("{}", out.finish());
//! # Ok(()) }
//! ```
//!
//! The merge step uses the Hugging Face `tokenizers` BPE model; pre-tokenization
//! regexes run on `fancy-regex`, the pure-Rust engine that `tokenizers` itself uses.

mod bytelevel;
mod chat;
mod chat_format;
mod error;
mod pretok;
mod spm;
mod stream;
mod tokenizer;
mod vocab;

pub use chat::{format_chat, format_chat_as, ChatMessage, ChatRole, BOS_TEXT};
pub use chat_format::ChatFormat;
pub use error::TokenizerError;
pub use pretok::{PreTokenizer, DEFAULT_REGEXES, FALCON3_REGEXES, GPT2_REGEX, LLAMA3_REGEX};
pub use stream::StreamDecoder;
pub use tokenizer::{PreTokenizerSource, Tokenizer, EOM_TEXT, EOT_TEXT};
pub use vocab::{keys, TokenKind, VocabData};

// A tokenizer is shared between request threads; a decoder moves with its stream.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<Tokenizer>();
    shareable::<StreamDecoder>();
};
