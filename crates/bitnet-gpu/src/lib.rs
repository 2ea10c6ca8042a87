//! The GPU backend: the whole BitNet b1.58 forward pass on wgpu (WebGPU over Vulkan, Metal or
//! DX12, or a browser's WebGPU on wasm32), in WGSL kernels. Opening the device and reading
//! results back are asynchronous (`Gpu::open_async`, `GpuModel::forward_async`, …): a
//! browser's page may not block on them; native callers wait on the same functions
//! ([`block`]).
//!
//! [`GpuModel`] uploads a bound [`bitnet_model::Model`] as stored (2-bit codes, their scales,
//! the F16 head) and runs every step of docs/MODEL.md on the device: RMSNorm fused with the
//! per-token int8 quantization, the ternary matmul on packed int8 dot products, RoPE (NeoX, or
//! the normal form of `llama`), the KV cache and attention with an online softmax, ReLU² or
//! SiLU, residual adds, the LM head and a greedy argmax. A call records all of it into one command buffer and reads back only the
//! logits it asks for (or 512 bytes for greedy). docs/BACKENDS.md says how it fits the engine.
#![deny(unsafe_code)]

mod builder;
mod cache;
mod device;
mod error;
mod kernels;
mod model;
#[doc(hidden)]
pub mod probe;
mod rec;
mod upload;

pub use builder::GpuBuilder;
pub use cache::{GpuCache, GpuKv};
pub use device::{adapters, block, AdapterInfo, Gpu};
pub use error::{GpuError, Result};
pub use kernels::{MvKind, TOP_CANDIDATES};
pub use model::{check_architecture, DecodeKernels, GpuModel, GpuOptions, GpuOutputs};
pub use rec::KernelTime;
pub use upload::RowsSpec;
