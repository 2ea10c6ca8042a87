//! The names of the weight formats, and nothing else: [`TernaryLayout`] (the ternary
//! projections) and [`RowType`] (embedding and LM-head rows). A leaf, so that the error type
//! can name them; their sizes and codecs are methods defined beside the formats themselves,
//! in `crate::layout` and `crate::rows`.

/// A ternary weight layout (see the table of `crate::layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TernaryLayout {
    /// bitnet.cpp I2_S (GGUF type 36 in Microsoft's fork): 128-element blocks of 32 bytes,
    /// MSB pair first, one f32 scale per tensor in a 32-byte tail.
    I2S,
    /// llama.cpp TQ2_0 (type 35): 256-element blocks of 66 bytes.
    Tq2_0,
    /// llama.cpp TQ1_0 (type 34): 256-element blocks of 54 bytes (base-3 packing).
    Tq1_0,
    /// BitNet.rs "inline f16": 32-element blocks of 8 packed bytes + f16 scale.
    BitNet32F16,
    /// BitNet.rs: 32-element blocks of 8 packed bytes, scales in a sibling tensor.
    Split32WithSibling,
    /// BitNet.rs GgmlQk256NoScale: 256-element blocks of 64 bytes, per-block scales from a
    /// companion tensor (1.0 without one).
    Qk256,
}

/// A row format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowType {
    /// f32.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// ggml Q8_0 (32-element blocks).
    Q8_0,
    /// ggml Q6_K (256-element super-blocks).
    Q6K,
    /// ggml Q4_0 (32-element blocks).
    Q4_0,
}
