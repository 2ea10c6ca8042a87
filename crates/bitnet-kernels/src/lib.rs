//! Ternary weight layouts and CPU kernels for BitNet b1.58 inference.
//!
//! - [`layout`]: bit-exact pack / unpack / row dequantization of every ternary layout
//!   (bitnet.cpp I2_S, TQ2_0, TQ1_0, BitNet32F16, Split32WithSibling, QK256).
//! - [`act`]: per-token int8 activation quantization (docs/FORMATS.md §1).
//! - [`attn`]: causal GQA attention over an f16/f32 KV cache read in place, threaded.
//! - [`exact`]: bitnet.cpp's float reductions bit for bit, and its attention, threaded.
//! - [`rowops`]: element-wise float steps (RMSNorm's scaling, the GEMM epilogue) on the
//!   tier's widest vectors.
//! - [`TernaryMatrix`]: a borrowed ternary weight matrix; int8-activation matvec / matmul.
//! - [`panel`] / [`lut`]: I2_S repacked at load for the integer GEMM, and its table-lookup
//!   variant.
//! - [`RowMatrix`]: embedding / LM-head row formats (F32, F16, BF16, Q8_0, Q6_K, Q4_0).
//! - [`Pool`]: the row-partitioned thread pool; [`isa`] / [`isa_report`]: the kernel tier
//!   chosen at run time (`BITNET_ISA` may lower it).
//!
//! **Layers.** Imports run one way (`tests/layers.rs` checks it): the leaves `formats` (the
//! format names), `cpu` (feature detection) and `aligned`; then `error`, `layout`, `pool`,
//! `panel`, `lut`; then `tier`, the types every tier shares (`Isa`, the kernel function types,
//! the `Kernels` table, prepared activations); then the tiers in `simd` (`scalar` below the
//! others, `avx512` and `vnni256` on `avx2`); then `dispatch`, which names each tier's table
//! and picks one; and on top the operations model code calls (`ternary`, `rows`, `act`,
//! `attn`, `exact`, `rowops`).
//!
//! `unsafe` is confined to the SIMD code behind runtime detection (the tiers in `simd::*`,
//! `attn`'s x86 loops, the wider compilations in `exact` and `rowops`) and the pool
//! (lifetime-erased job closure, disjoint output writes); each unsafe fn has a `# Safety`
//! section.

pub mod act;
pub mod aligned;
pub mod attn;
pub mod check;
mod cpu;
mod dispatch;
mod error;
pub mod exact;
mod formats;
pub mod layout;
pub mod lut;
pub mod panel;
mod pool;
pub mod rowops;
pub mod rows;
mod simd;
mod ternary;
mod tier;

pub use dispatch::{has_panel_kernel, isa, isa_report, supported_isas};
pub use error::KernelError;
pub use layout::{ExternalScales, TernaryLayout};
pub use pool::{part_range, Pool, RowsJob2};
pub use rows::{F16DotOrder, RowMatrix, RowType};
pub use ternary::{detect_candidates, RowRunner, TernaryMatrix, ROW_GRAIN, TOKEN_TILE};
pub use tier::Isa;

/// Nanoseconds per AMX `tdpbsud` (16 × 16 × 64 int8 multiply-adds) issued back to back on the
/// calling thread, or `None` without the AMX tier (the gemm benchmark's peak).
#[doc(hidden)]
pub fn amx_probe_ns() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        simd::amx::probe_tdpbsud_ns()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Whether the WebAssembly tier's float multiply-adds (the LM head's F16, Q8_0 and Q4_0 dots
/// and the attention) are fused: in a module built with relaxed SIMD, on an engine whose
/// `f32x4.relaxed_madd` rounds once. Then they give the scalar tier's bits, as every native
/// tier does; otherwise each product is rounded before it is added. Always false outside
/// WebAssembly.
pub fn wasm_fused_madd() -> bool {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd::wasm::madd_fuses()
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        false
    }
}
