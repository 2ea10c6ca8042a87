//! Test support: seeded synthetic BitNet models with the official file's exact metadata keys,
//! tensor names, types and shapes, written in any ternary layout.
#![forbid(unsafe_code)]

pub mod synth;

pub use synth::{Preset, SynthError, SynthSpec, WeightLayout};

/// The tokenizer metadata of the tiny golden model (4256 tokens): a vocab-only GGUF.
pub const TINY_VOCAB_GGUF: &[u8] = include_bytes!("../fixtures/tiny-vocab.gguf");
