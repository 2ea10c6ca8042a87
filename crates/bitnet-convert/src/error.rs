//! Typed errors of the converter: every bad input names the file or tensor and what is wrong.

use std::path::PathBuf;

/// Everything that can go wrong while converting a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    #[error(transparent)]
    Gguf(#[from] bitnet_gguf::GgufError),
    #[error(transparent)]
    Kernel(#[from] bitnet_kernels::KernelError),
    #[error(transparent)]
    Model(#[from] bitnet_model::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] bitnet_tokenizer::TokenizerError),
    #[error(transparent)]
    Qsf(#[from] bitnet_qsf::QsfError),

    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    /// A JSON file (config, tokenizer, shard index) does not parse or has the wrong shape.
    #[error("{}: {source}", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },

    /// A safetensors file fails validation (header length, offsets, dtype and shape sizes).
    #[error("{}: not a valid safetensors file: {source}", path.display())]
    Safetensors {
        path: PathBuf,
        source: safetensors::SafeTensorError,
    },

    /// The input is neither a GGUF file nor a Hugging Face model directory.
    #[error("{}: not a GGUF file or a Hugging Face model directory (config.json and model.safetensors)", path.display())]
    UnknownInput { path: PathBuf },

    /// A value in `config.json` is missing, out of range or unsupported.
    #[error("config.json: {key}: {why}")]
    Config { key: String, why: String },

    /// `tokenizer.json` or `tokenizer_config.json` holds something the converter cannot map.
    #[error("{file}: {why}")]
    TokenizerJson { file: &'static str, why: String },

    /// A tensor the model needs is in no shard.
    #[error("tensor {0:?} is missing from the checkpoint")]
    MissingTensor(String),

    /// The shard index names a file, or a tensor, that is not there (or a tensor twice).
    #[error("{}: {why}", path.display())]
    Index { path: PathBuf, why: String },

    /// A tensor has a shape other than the config implies.
    #[error("tensor {name:?}: shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    /// A tensor has a dtype the converter does not read in that role.
    #[error("tensor {name:?}: dtype {found}, expected {expected}")]
    Dtype {
        name: String,
        expected: &'static str,
        found: String,
    },

    /// A float weight holds NaN or infinity.
    #[error("tensor {name:?}: non-finite value at element {index}")]
    NonFinite { name: String, index: usize },

    /// A packed ternary code that is no ternary value (code 3).
    #[error("tensor {name:?}: code 3 at element {index} is not a ternary value")]
    InvalidCode { name: String, index: usize },

    /// Blocks of one tensor carry different scales, which a per-tensor layout cannot hold.
    #[error(
        "tensor {name:?}: its blocks carry {count} different scales ({first} and {other}, ...); \
         I2_S holds one scale per tensor"
    )]
    MixedScales {
        name: String,
        count: usize,
        first: f32,
        other: f32,
    },

    /// A source layout the converter does not read.
    #[error("tensor {name:?}: {what}")]
    Unsupported { name: String, what: String },

    /// The options contradict each other or the input.
    #[error("{0}")]
    Options(String),

    /// Upstream llama.cpp's graph for the target architecture applies another FFN activation.
    #[error(
        "this model's FFN uses {model}, but upstream llama.cpp's `bitnet` graph hard-codes {upstream}: \
         the file would load there and compute a different function (wrong text). \
         Pass --allow-activation-mismatch to write it anyway"
    )]
    ActivationMismatch {
        model: &'static str,
        upstream: &'static str,
    },

    /// The caller's progress callback asked to stop.
    #[error("conversion cancelled")]
    Cancelled,
}

impl ConvertError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| ConvertError::Io { path, source }
    }
}
