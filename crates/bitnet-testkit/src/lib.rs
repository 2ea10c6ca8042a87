//! Test support: seeded synthetic BitNet models with the official file's exact metadata keys,
//! tensor names, types and shapes, written in any ternary layout.
#![forbid(unsafe_code)]

pub mod hf;
pub mod reference;
pub mod rewrite;
pub mod synth;

pub use rewrite::{rewrite, RawTensor, EXTREME_F32S, EXTREME_U32S};
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

/// A xorshift64 generator for seeded randomized tests: the same sequence on every run and
/// every platform.
#[derive(Debug, Clone)]
pub struct Xorshift(pub u64);

impl Xorshift {
    /// The next 64 random bits (the state must not be zero).
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        if n == 0 {
            return 0;
        }
        usize::try_from(self.next_u64() % n).unwrap_or(0)
    }

    /// One of `xs`, cloned (`xs` must not be empty).
    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }
}
