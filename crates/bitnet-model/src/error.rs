//! Typed errors of model loading and evaluation.

use thiserror::Error;

/// Everything that can go wrong between a parsed GGUF file and logits.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] bitnet_gguf::GgufError),
    #[error(transparent)]
    Kernel(#[from] bitnet_kernels::KernelError),
    #[error("unsupported architecture '{0}' (supported: bitnet-b1.58, bitnet-25, bitnet, llama)")]
    UnsupportedArch(String),
    #[error("metadata key '{0}' is missing (general.architecture is required)")]
    MissingArch(&'static str),
    #[error("invalid hyperparameter {key} = {value}: {why}")]
    BadHparam {
        key: String,
        value: String,
        why: &'static str,
    },
    #[error("unknown activation '{0}' (known: relu2, silu)")]
    UnknownActivation(String),
    #[error("tensor '{0}' is missing")]
    MissingTensor(String),
    #[error("tensor '{name}' has shape {found:?}, expected {expected:?}")]
    WrongShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("tensor '{name}' has type {found}, expected one of: {expected}")]
    WrongType {
        name: String,
        expected: &'static str,
        found: String,
    },
    /// bitnet.cpp's TL1/TL2: weights arranged at conversion for the kernels bitnet.cpp
    /// generates for one model's shapes (TL1 for ARM, TL2 for x86); the arrangement is not
    /// described in the file, so they are not read here.
    #[error(
        "tensor '{name}' is {found}, bitnet.cpp's lookup-table layout, arranged at conversion \
         for kernels generated for this model's shapes: not readable here. Use the I2_S file \
         (ggml-model-i2_s.gguf), or convert the Hugging Face checkpoint with \
         `bitnet convert <checkpoint dir> -o model.gguf`"
    )]
    TiledLayout { name: String, found: String },
    #[error("tensor '{name}' holds a non-finite value at index {index}")]
    NonFinite { name: String, index: usize },
    /// A ternary weight's scale (the I2_S tensor scale, or block `block` of a block layout,
    /// counted row by row) is NaN or infinite.
    #[error("tensor '{name}': scale {block} is NaN or infinite")]
    NonFiniteScale { name: String, block: usize },
    /// The embedding table's row of a token the call reads holds NaN or infinity.
    #[error("token {token}'s row of the embedding table holds NaN or infinity")]
    NonFiniteEmbedding { token: u32 },
    /// The forward pass computed NaN or infinity where a result is read (a logit, an
    /// embedding): a weight the file holds (an embedding or output row) is NaN or infinite,
    /// or the arithmetic overflowed. The caches are left as they were before the call.
    #[error(
        "the model computed NaN or infinity ({what}: output row {row}, entry {index}): \
         the file's weights hold NaN or infinity there, or the arithmetic overflowed"
    )]
    NonFiniteOutput {
        what: &'static str,
        row: usize,
        index: usize,
    },
    #[error("not supported: {0}")]
    Unsupported(String),
    #[error("unexpected tensor '{0}' (not part of this architecture)")]
    UnexpectedTensor(String),
    #[error(
        "tensor '{0}' has exactly n/4 bytes and no scale tensor: it is either a bitnet.cpp I2_S \
         tensor missing its 32-byte scale tail (a truncated or corrupt file) or a QK256 tensor \
         without its companion scales; refusing to guess (scales would default to 1.0)"
    )]
    MissingScales(String),
    #[error("token id {id} is out of range (vocabulary has {n_vocab} tokens)")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    #[error("context is full: {needed} positions needed, the cache holds {n_ctx}")]
    ContextFull { needed: usize, n_ctx: usize },
    #[error("empty batch")]
    EmptyBatch,
    #[error("memory budget exceeded: {what} needs {needed} bytes, the budget is {budget} bytes")]
    OverBudget {
        what: &'static str,
        needed: u64,
        budget: u64,
    },
    #[error("size overflow computing {0}")]
    Overflow(&'static str),
    /// A backend could not run (its worker stopped, its state is unusable).
    #[error("backend: {0}")]
    Backend(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
