//! Test support: seeded synthetic BitNet models with the official file's exact metadata keys,
//! tensor names, types and shapes, written in any ternary layout.
#![forbid(unsafe_code)]

pub mod hf;
pub mod reference;
pub mod rewrite;
pub mod synth;

pub use rewrite::{rewrite, RawTensor};
pub use synth::{Preset, SynthArch, SynthError, SynthSpec, WeightLayout};

/// A tiny synthetic I2_S model (the golden model's shapes) as bytes.
pub fn tiny_model_bytes(seed: u64) -> Result<Vec<u8>, SynthError> {
    let mut spec = SynthSpec::preset(Preset::Tiny);
    spec.seed = seed;
    let vocab = synth::vocab_from_gguf_bytes(TINY_VOCAB_GGUF)?;
    synth::write(&spec, &vocab, Vec::new(), &mut |_, _| {})
}

/// The tokenizer metadata of the tiny golden model (4256 tokens): a vocab-only GGUF.
pub const TINY_VOCAB_GGUF: &[u8] = include_bytes!("../fixtures/tiny-vocab.gguf");
