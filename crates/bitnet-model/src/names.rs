//! The one table that spells tensor names (llama.cpp `llama-arch` style).

/// Global tensors.
pub const TOKEN_EMBD: &str = "token_embd.weight";
pub const OUTPUT_NORM: &str = "output_norm.weight";
pub const OUTPUT: &str = "output.weight";
/// Llama 3.1-style RoPE frequency factors (not supported; a file with them is refused).
pub const ROPE_FREQS: &str = "rope_freqs.weight";

/// Per-head Q and K norms (`qwen3`, `gemma3`), `[head_dim]`.
pub const ATTN_Q_NORM: &str = "attn_q_norm";
pub const ATTN_K_NORM: &str = "attn_k_norm";
/// Gemma 3's norms of the attention and FFN outputs, `[n_embd]`.
pub const POST_ATTN_NORM: &str = "post_attention_norm";
pub const POST_FFW_NORM: &str = "post_ffw_norm";

/// `blk.{layer}.{stem}.weight` for a stem outside [`LayerTensor`].
pub fn block_tensor(layer: usize, stem: &str) -> String {
    format!("blk.{layer}.{stem}.weight")
}

/// The input norm of a projection in bitnet.cpp's embedding models
/// (`blk.{layer}.attn_q_norm_in.weight`, …), whose width is the projection's input.
pub fn norm_in_name(projection: LayerTensor, layer: usize) -> String {
    format!("blk.{layer}.{}_norm_in.weight", projection.stem())
}

/// Per-layer tensors, by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerTensor {
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    AttnSubNorm,
    AttnOutput,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnSubNorm,
    FfnDown,
}

impl LayerTensor {
    pub const ALL: [LayerTensor; 11] = [
        LayerTensor::AttnNorm,
        LayerTensor::AttnQ,
        LayerTensor::AttnK,
        LayerTensor::AttnV,
        LayerTensor::AttnSubNorm,
        LayerTensor::AttnOutput,
        LayerTensor::FfnNorm,
        LayerTensor::FfnGate,
        LayerTensor::FfnUp,
        LayerTensor::FfnSubNorm,
        LayerTensor::FfnDown,
    ];

    /// The name stem after `blk.{i}.`.
    pub fn stem(self) -> &'static str {
        match self {
            LayerTensor::AttnNorm => "attn_norm",
            LayerTensor::AttnQ => "attn_q",
            LayerTensor::AttnK => "attn_k",
            LayerTensor::AttnV => "attn_v",
            LayerTensor::AttnSubNorm => "attn_sub_norm",
            LayerTensor::AttnOutput => "attn_output",
            LayerTensor::FfnNorm => "ffn_norm",
            LayerTensor::FfnGate => "ffn_gate",
            LayerTensor::FfnUp => "ffn_up",
            LayerTensor::FfnSubNorm => "ffn_sub_norm",
            LayerTensor::FfnDown => "ffn_down",
        }
    }

    /// `blk.{layer}.{stem}.weight`
    pub fn name(self, layer: usize) -> String {
        format!("blk.{layer}.{}.weight", self.stem())
    }

    /// Whether the tensor is a ternary projection (otherwise an F32 norm vector).
    pub fn is_projection(self) -> bool {
        !matches!(
            self,
            LayerTensor::AttnNorm
                | LayerTensor::AttnSubNorm
                | LayerTensor::FfnNorm
                | LayerTensor::FfnSubNorm
        )
    }

    /// The expected ggml `ne` (row length first) for a given config.
    pub fn dims(self, c: &crate::Config) -> Vec<u64> {
        let (e, kv, ff) = (c.n_embd as u64, c.n_embd_kv() as u64, c.n_ff as u64);
        let q = c.n_embd_q() as u64;
        match self {
            LayerTensor::AttnNorm | LayerTensor::AttnSubNorm | LayerTensor::FfnNorm => vec![e],
            LayerTensor::FfnSubNorm => vec![ff],
            LayerTensor::AttnQ => vec![e, q],
            LayerTensor::AttnOutput => vec![q, e],
            LayerTensor::AttnK | LayerTensor::AttnV => vec![e, kv],
            LayerTensor::FfnGate | LayerTensor::FfnUp => vec![e, ff],
            LayerTensor::FfnDown => vec![ff, e],
        }
    }
}

/// Sibling scale tensor names some writers use for per-tensor scales.
/// `blk.0.attn_q.weight` -> `blk.0.attn_q.weight.scale`, `blk.0.attn_q.weight_scale`,
/// `blk.0.attn_q.scale`, `blk.0.attn_q_scale`.
pub fn sibling_scale_names(weight: &str) -> [String; 4] {
    let stem = weight.strip_suffix(".weight").unwrap_or(weight);
    [
        format!("{weight}.scale"),
        format!("{weight}_scale"),
        format!("{stem}.scale"),
        format!("{stem}_scale"),
    ]
}
