//! Hyperparameters: built once from GGUF metadata and validated before anything is allocated.

use bitnet_gguf::{GgufError, Metadata};

use crate::error::{ModelError, Result};

/// Upper bounds that keep a hostile file from asking for absurd work or memory.
pub const MAX_LAYERS: usize = 512;
pub const MAX_EMBD: usize = 1 << 16;
pub const MAX_FF: usize = 1 << 18;
pub const MAX_HEADS: usize = 1024;
pub const MAX_VOCAB: usize = 1 << 22;
pub const MAX_CTX: usize = 1 << 20;

/// The FFN activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `relu(gate)^2 * up` (BitNet b1.58 2B-4T).
    Relu2,
    /// `silu(gate) * up` (1bitLLM `bitnet` models).
    Silu,
    /// `gelu(gate) * up`, GELU's tanh form through ggml's f16 table (Gemma 3).
    Gelu,
}

/// How an embedding model reduces a sequence's hidden states to one vector
/// (`{arch}.pooling_type`, llama.cpp's numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// No pooling (0): one vector per position.
    None,
    /// The mean of every position.
    Mean,
    /// The first position.
    Cls,
    /// The last position (bitnet.cpp's embedding models: the appended EOS).
    Last,
}

impl Pooling {
    /// llama.cpp's `pooling_type` number.
    pub fn from_id(id: u64) -> Option<Self> {
        Some(match id {
            0 => Pooling::None,
            1 => Pooling::Mean,
            2 => Pooling::Cls,
            3 => Pooling::Last,
            _ => return None,
        })
    }

    /// The name llama.cpp's `--pooling` takes.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

impl std::str::FromStr for Pooling {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            other => Err(format!("{other:?}: pooling is none, mean, cls or last")),
        }
    }
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimension `i` with `i + n_rot/2` (GPT-NeoX; every `bitnet*` architecture).
    Neox,
    /// Dimension `2i` with `2i + 1` (llama.cpp's "normal" RoPE; architecture `llama`, whose
    /// converter permutes the Q and K rows to match).
    Norm,
}

/// Validated model hyperparameters (names sort together: `n_embd`, `n_head`, `n_head_kv`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub arch: String,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_rot: usize,
    pub head_dim: usize,
    pub rms_eps: f32,
    pub rope_freq_base: f32,
    pub activation: Activation,
    /// RoPE's pairing of dimensions.
    pub rope_style: RopeStyle,
    /// Whether each block has `attn_sub_norm` and `ffn_sub_norm` (the `bitnet*`
    /// architectures; not `llama`).
    pub sub_norms: bool,
    /// Whether every projection RMS-normalizes its input with weights of its own first
    /// (`blk.N.{attn_q,…,ffn_down}_norm_in`: bitnet.cpp's embedding models). Set at load from
    /// the tensors present.
    pub norm_in: bool,
    /// Whether Q and K are RMS-normalized per head before RoPE (`attn_q_norm`, `attn_k_norm`:
    /// `qwen3`, `gemma3`).
    pub qk_norm: bool,
    /// Whether the attention and FFN outputs are RMS-normalized before the residual add
    /// (`post_attention_norm`, `post_ffw_norm`: `gemma3`).
    pub post_norms: bool,
    /// A factor on the embedding rows (`gemma3`: `sqrt(n_embd)`).
    pub embd_scale: Option<f32>,
    /// Whether Q is scaled by `1/sqrt(head_dim)` after RoPE and K·Q by 1 (`gemma3`'s graph),
    /// rather than K·Q by `1/sqrt(head_dim)`.
    pub q_prescale: bool,
    /// `{arch}.pooling_type` of an embedding model (`None`: the file names none).
    pub pooling: Option<Pooling>,
}

fn bad(key: &str, value: impl ToString, why: &'static str) -> ModelError {
    ModelError::BadHparam {
        key: key.to_string(),
        value: value.to_string(),
        why,
    }
}

/// Read a non-negative integer key of any integer type and bound it to `1..=max`.
fn count(md: &Metadata, key: &str, max: usize) -> Result<usize> {
    let v = md.get_uint(key)?;
    let n = usize::try_from(v).map_err(|_| bad(key, v, "does not fit in usize"))?;
    if n == 0 {
        return Err(bad(key, n, "must be at least 1"));
    }
    if n > max {
        return Err(bad(key, n, "exceeds the supported maximum"));
    }
    Ok(n)
}

fn opt_count(md: &Metadata, key: &str, max: usize) -> Result<Option<usize>> {
    if md.get(key).is_none() {
        return Ok(None);
    }
    count(md, key, max).map(Some)
}

fn opt_f32(md: &Metadata, key: &str) -> Result<Option<f32>> {
    match md.get(key) {
        None => Ok(None),
        Some(_) => Ok(Some(md.get_f32(key)?)),
    }
}

impl Config {
    /// Build and validate the config. `n_vocab_from_embd` is the row count of `token_embd`
    /// (the authority when `<arch>.vocab_size` is absent).
    pub fn from_metadata(md: &Metadata, n_vocab_from_embd: Option<u64>) -> Result<Self> {
        let arch = match md.get_str("general.architecture") {
            Ok(a) => a.to_string(),
            Err(GgufError::MissingKey { .. }) => {
                return Err(ModelError::MissingArch("general.architecture"))
            }
            Err(e) => return Err(e.into()),
        };
        // bitnet.cpp's fork: the `bitnet*` graphs (ReLU² or SiLU, sub-norms, NEOX RoPE) and
        // `llama` with ternary projections (SiLU, no sub-norms, normal RoPE).
        // bitnet.cpp's embedding models (`qwen3`, `gemma3` with ternary projections; their
        // per-projection input norms are found at load): SiLU or GELU, no sub-norms, NEOX RoPE,
        // per-head Q/K norms; Gemma 3 also post-norms, scaled embeddings and a scaled Q.
        let (default_act, rope_style, sub_norms) = match arch.as_str() {
            "bitnet-b1.58" | "bitnet-25" => (Activation::Relu2, RopeStyle::Neox, true),
            "bitnet" => (Activation::Silu, RopeStyle::Neox, true),
            "llama" => (Activation::Silu, RopeStyle::Norm, false),
            "qwen3" => (Activation::Silu, RopeStyle::Neox, false),
            "gemma3" => (Activation::Gelu, RopeStyle::Neox, false),
            _ => return Err(ModelError::UnsupportedArch(arch)),
        };
        let (qk_norm, gemma) = (
            matches!(arch.as_str(), "qwen3" | "gemma3"),
            arch == "gemma3",
        );
        let k = |s: &str| format!("{arch}.{s}");

        let n_embd = count(md, &k("embedding_length"), MAX_EMBD)?;
        let n_layer = count(md, &k("block_count"), MAX_LAYERS)?;
        let n_ff = count(md, &k("feed_forward_length"), MAX_FF)?;
        let n_head = count(md, &k("attention.head_count"), MAX_HEADS)?;
        let n_head_kv = opt_count(md, &k("attention.head_count_kv"), MAX_HEADS)?.unwrap_or(n_head);
        let n_ctx_train = count(md, &k("context_length"), MAX_CTX)?;

        // `key_length` (Qwen 3, Gemma 3: a head wider than n_embd / n_head); else n_embd / n_head.
        let key_length = opt_count(md, &k("attention.key_length"), MAX_EMBD)?;
        let value_length = opt_count(md, &k("attention.value_length"), MAX_EMBD)?;
        if value_length.is_some_and(|v| Some(v) != key_length.or(Some(n_embd / n_head))) {
            return Err(bad(
                &k("attention.value_length"),
                value_length.unwrap_or(0),
                "differs from the key length",
            ));
        }
        if key_length.is_none() && n_embd % n_head != 0 {
            return Err(bad(
                &k("embedding_length"),
                n_embd,
                "not a multiple of head_count",
            ));
        }
        if n_head
            .checked_mul(key_length.unwrap_or(1))
            .is_none_or(|w| w > MAX_EMBD)
        {
            return Err(bad(
                &k("attention.key_length"),
                key_length.unwrap_or(0),
                "head_count times key_length exceeds the supported maximum",
            ));
        }
        if n_head % n_head_kv != 0 {
            return Err(bad(
                &k("attention.head_count_kv"),
                n_head_kv,
                "does not divide head_count",
            ));
        }
        let head_dim = key_length.unwrap_or(n_embd / n_head);
        let n_rot = opt_count(md, &k("rope.dimension_count"), MAX_EMBD)?.unwrap_or(head_dim);
        if n_rot % 2 != 0 || n_rot > head_dim {
            return Err(bad(
                &k("rope.dimension_count"),
                n_rot,
                "must be even and at most head_dim",
            ));
        }
        if head_dim % 2 != 0 {
            return Err(bad(
                &k("embedding_length"),
                n_embd,
                "head dimension must be even",
            ));
        }
        // Gemma 3's sliding-window layers are not implemented: refuse, never run them as
        // global ones (bitnet.cpp's embedding converter writes no window).
        if md.get(&k("attention.sliding_window")).is_some() {
            return Err(ModelError::Unsupported(format!(
                "sliding-window attention ({})",
                k("attention.sliding_window")
            )));
        }
        let pooling = match md.get(&k("pooling_type")) {
            None => None,
            Some(_) => {
                let id = md.get_uint(&k("pooling_type"))?;
                Some(
                    Pooling::from_id(id)
                        .ok_or_else(|| bad(&k("pooling_type"), id, "is not 0, 1, 2 or 3"))?,
                )
            }
        };

        let eps_key = k("attention.layer_norm_rms_epsilon");
        let rms_eps = md.get_f32(&eps_key)?;
        if !(rms_eps.is_finite() && rms_eps > 0.0) {
            return Err(bad(&eps_key, rms_eps, "must be finite and > 0"));
        }
        let base_key = k("rope.freq_base");
        let rope_freq_base = opt_f32(md, &base_key)?.unwrap_or(10000.0);
        if !(rope_freq_base.is_finite() && rope_freq_base > 0.0) {
            return Err(bad(&base_key, rope_freq_base, "must be finite and > 0"));
        }

        let n_vocab = match (
            opt_count(md, &k("vocab_size"), MAX_VOCAB)?,
            n_vocab_from_embd,
        ) {
            (Some(v), Some(e)) if u64::try_from(v).ok() != Some(e) => {
                return Err(bad(&k("vocab_size"), v, "disagrees with token_embd rows"))
            }
            (Some(v), _) => v,
            (None, Some(e)) => {
                let n = usize::try_from(e).map_err(|_| bad("token_embd rows", e, "too large"))?;
                if n == 0 || n > MAX_VOCAB {
                    return Err(bad("token_embd rows", n, "out of range"));
                }
                n
            }
            (None, None) => return Err(bad(&k("vocab_size"), "missing", "no vocabulary size")),
        };

        let activation = activation_from_metadata(md, &arch)?.unwrap_or(default_act);
        check_rope_scaling(md, &arch)?;

        Ok(Config {
            arch,
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            n_rot,
            head_dim,
            rms_eps,
            rope_freq_base,
            activation,
            rope_style,
            sub_norms,
            norm_in: false,
            qk_norm,
            post_norms: gemma,
            #[allow(clippy::cast_precision_loss)]
            embd_scale: gemma.then(|| (n_embd as f32).sqrt()),
            q_prescale: gemma,
            pooling,
        })
    }

    /// Width of Q rows and of the attention output (`n_head * head_dim`).
    pub fn n_embd_q(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The factor of K·Q in attention: `1/sqrt(head_dim)`, or 1 where Q was scaled.
    pub fn kq_scale(&self) -> f32 {
        #[allow(clippy::cast_precision_loss)]
        let s = 1.0 / (self.head_dim as f32).sqrt();
        if self.q_prescale {
            1.0
        } else {
            s
        }
    }

    /// Width of K and V rows (`n_head_kv * head_dim`).
    pub fn n_embd_kv(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Query heads per KV head.
    pub fn n_gqa(&self) -> usize {
        self.n_head / self.n_head_kv
    }

    /// Bytes of KV cache for `n_ctx` positions of element type `ty`, checked.
    pub fn kv_cache_bytes(&self, n_ctx: usize, ty: KvType) -> Result<u64> {
        [self.n_layer, n_ctx, self.n_embd_kv(), 2]
            .iter()
            .try_fold(1u64, |acc, &x| acc.checked_mul(u64::try_from(x).ok()?))
            .and_then(|values| ty.bytes_for(values))
            .ok_or(ModelError::Overflow("KV cache size"))
    }
}

/// RoPE scaling is not implemented: a file that asks for it (other than the linear factor 1
/// that bitnet.cpp's converter writes for `bitnet` models) is refused, not run unscaled.
fn check_rope_scaling(md: &Metadata, arch: &str) -> Result<()> {
    let ty_key = format!("{arch}.rope.scaling.type");
    let factor_key = format!("{arch}.rope.scaling.factor");
    let ty = match md.get(&ty_key) {
        None => None,
        Some(_) => Some(md.get_str(&ty_key)?.to_string()),
    };
    let factor = opt_f32(md, &factor_key)?;
    match (ty.as_deref(), factor) {
        (None | Some("none"), _) | (Some("linear"), None | Some(1.0)) => Ok(()),
        (Some(t), f) => Err(ModelError::Unsupported(format!(
            "RoPE scaling '{t}'{} ({ty_key})",
            f.map(|f| format!(" with factor {f}")).unwrap_or_default()
        ))),
    }
}

/// Honour a `hidden_act`-style key when a file carries one.
fn activation_from_metadata(md: &Metadata, arch: &str) -> Result<Option<Activation>> {
    for key in [
        format!("{arch}.hidden_act"),
        format!("{arch}.feed_forward_activation"),
    ] {
        if md.get(&key).is_some() {
            let s = md.get_str(&key)?;
            return match s.to_ascii_lowercase().as_str() {
                "relu2" | "relu_squared" | "relu²" | "squared_relu" => Ok(Some(Activation::Relu2)),
                "silu" | "swish" => Ok(Some(Activation::Silu)),
                "gelu" => Ok(Some(Activation::Gelu)),
                _ => Err(ModelError::UnknownActivation(s.to_string())),
            };
        }
    }
    Ok(None)
}

/// Element type of the KV cache (the configuration's, so that sizes can be planned before a
/// cache exists: [`Config::kv_cache_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    F32,
    #[default]
    F16,
    /// ggml's Q8_0: a code per value, an f16 scale per 32 (held widened to f32).
    Q8_0,
    /// ggml's Q4_0: a nibble per value, an f16 scale per 32 (held widened to f32).
    Q4_0,
}

impl KvType {
    /// The name in flags and reports (`f32`, `f16`, `q8_0`, `q4_0`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// Stored as codes in blocks of 32 values with a scale each.
    pub fn is_quantized(self) -> bool {
        matches!(self, KvType::Q8_0 | KvType::Q4_0)
    }

    /// Bytes that `n` values take (`n` a multiple of 32 for Q8_0 and Q4_0); None on overflow.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        match self {
            KvType::F32 => n.checked_mul(4),
            KvType::F16 => n.checked_mul(2),
            // A code per value, an f32 scale per 32 values.
            KvType::Q8_0 => n.checked_add(n.div_ceil(32).checked_mul(4)?),
            // Half a byte per value, an f32 scale per 32 values.
            KvType::Q4_0 => n.div_ceil(2).checked_add(n.div_ceil(32).checked_mul(4)?),
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            "q4_0" => Ok(KvType::Q4_0),
            _ => Err(format!("unknown KV cache type '{s}' (f32|f16|q8_0|q4_0)")),
        }
    }
}
