//! Typed errors of the GPU backend.

/// What can go wrong on the GPU path: no adapter, an adapter too small for the model, a model
/// the kernels do not cover, or the device failing while it runs.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU adapter found (wgpu found none on Vulkan, Metal or DX12)")]
    NoAdapter,
    #[error("GPU adapter {index} does not exist: {count} adapter(s) found (`bitnet inspect --system` lists them)")]
    NoSuchAdapter { index: usize, count: usize },
    #[error("the GPU adapter refused a device: {0}")]
    RequestDevice(String),
    #[error(
        "GPU adapter {adapter:?} is too small: {what} needs {need}, the adapter allows {have}"
    )]
    Limit {
        adapter: String,
        what: &'static str,
        need: u64,
        have: u64,
    },
    #[error("the GPU backend does not run {0}")]
    Unsupported(String),
    #[error("GPU validation error: {0}")]
    Validation(String),
    #[error("GPU device lost: {0}")]
    DeviceLost(String),
    #[error("reading GPU results back failed: {0}")]
    Readback(String),
    #[error("GPU shape mismatch: {what} has {got} values, expected {expected}")]
    Shape {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("GPU cache full: {need} positions needed, the context holds {n_ctx}")]
    ContextFull { need: usize, n_ctx: usize },
    #[error("token id {id} is outside the vocabulary ({n_vocab} tokens)")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    #[error("size overflow computing {0}")]
    Overflow(&'static str),
    /// The device's arg-max or top-k met a NaN or infinite logit (the lowest such index).
    #[error(
        "the model computed NaN or infinity (a logit: entry {index}): the file's weights hold \
         NaN or infinity there, or the arithmetic overflowed"
    )]
    NonFiniteLogit { index: u32 },
    #[error(transparent)]
    Kernel(#[from] bitnet_kernels::KernelError),
    #[error("this GPU call would have to wait, and a browser's page may not: use its async form")]
    NeedsAsync,
}

pub type Result<T> = std::result::Result<T, GpuError>;
