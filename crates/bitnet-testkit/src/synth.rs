//! Synthetic BitNet b1.58 models.
//!
//! Metadata keys, their order, tensor names, types and shapes follow the official
//! `ggml-model-i2_s.gguf` (2B-4T). Weights are seeded random:
//! - projections exactly `β·{−1, 0, +1}` with about a third zeros, `β = c / sqrt(in_features)`;
//! - norm weights `1 + 0.1·u`, `u` uniform in [−1, 1) (F32);
//! - the embedding `0.02·N(0, 1)` stored as F16; no `output.weight` (tied LM head).
//!
//! Every tensor draws from its own ChaCha8 stream keyed by (seed, tensor name, chunk), so the
//! bytes are identical for the same seed whatever the thread count.

// Shapes come from a validated `SynthSpec` (every dimension ≤ MAX_DIM, products checked in
// `validate`), and f64 → f32 rounding of generated values is intended.
#![allow(clippy::cast_possible_truncation)]

use std::io::Write;

use bitnet_gguf::{GgufError, GgufFile, GgufWriter, Limits, Value};
use bitnet_kernels::layout::{i2s, qk256, seq32, tq1_0, tq2_0};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

/// Errors of the synthetic-model writer.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Kernel(#[from] bitnet_kernels::KernelError),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid shape: {0}")]
    Shape(String),
    #[error("vocabulary file has no tokenizer.ggml.tokens")]
    NoVocab,
}

/// How the ternary projections are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// bitnet.cpp I2_S (type 36, n/4 + 32 bytes, one f32 scale per tensor).
    I2S,
    /// upstream llama.cpp TQ2_0 (type 35).
    Tq2_0,
    /// upstream llama.cpp TQ1_0 (type 34).
    Tq1_0,
    /// type 36, 32-element blocks with an inline f16 scale.
    BitNet32F16,
    /// type 36, 32-element blocks with scales in a sibling `<name>.scale` F32 tensor.
    Split32WithSibling,
    /// type 36, 256-element blocks, no zero code (values ±1, ±2): the ternary zeros cannot be
    /// written, so synthetic QK256 weights are `β·{−1, +1}`; per-block scales in a sibling
    /// `<name>.scale` F32 tensor.
    Qk256,
    /// Plain F32 values `β·{−1, 0, +1}`, the embedding and LM head F32 too: what bitnet.cpp's
    /// converter writes with `--outtype f32`, the input of its `llama-quantize … I2_S`. Not a
    /// layout this engine runs.
    F32,
}

impl std::str::FromStr for WeightLayout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "i2_s" | "i2s" => WeightLayout::I2S,
            "tq2_0" => WeightLayout::Tq2_0,
            "tq1_0" => WeightLayout::Tq1_0,
            "bitnet32f16" => WeightLayout::BitNet32F16,
            "split32" | "split32withsibling" => WeightLayout::Split32WithSibling,
            "qk256" | "ggmlqk256noscale" => WeightLayout::Qk256,
            "f32" => WeightLayout::F32,
            _ => {
                return Err(format!(
                    "unknown layout '{s}' (i2_s, tq2_0, tq1_0, bitnet32f16, split32, qk256, f32)"
                ))
            }
        })
    }
}

/// The graph a synthetic model is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthArch {
    /// `bitnet-b1.58` (2B-4T): sub-norms, ReLU² (or SiLU with `silu`), tied LM head.
    BitnetB158,
    /// `llama` with ternary projections, as bitnet.cpp's converter writes Llama3-8B-1.58 and
    /// Falcon3: no sub-norms, SiLU, normal RoPE, an untied F16 `output.weight`.
    Llama,
    /// `bitnet`, 1bitLLM's bitnet_b1_58 models as bitnet.cpp converts them: sub-norms, SiLU,
    /// NEOX RoPE, tied LM head.
    Bitnet,
    /// `qwen3` as bitnet.cpp's embedding converter writes bitnet-embedding-0.6b: an input
    /// norm per projection (`*_norm_in`), per-head Q/K norms, SiLU, NEOX RoPE, `key_length`,
    /// F16 norms, last-token pooling, EOS appended (`add_eos_token`), no LM head.
    Qwen3,
    /// `gemma3` as that converter writes bitnet-embedding-270m: as [`SynthArch::Qwen3`] plus
    /// post-attention and post-FFN norms, GELU, scaled embeddings (no EOS appended).
    Gemma3,
}

impl SynthArch {
    /// The `general.architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::BitnetB158 => "bitnet-b1.58",
            SynthArch::Llama => "llama",
            SynthArch::Bitnet => "bitnet",
            SynthArch::Qwen3 => "qwen3",
            SynthArch::Gemma3 => "gemma3",
        }
    }

    /// Whether this is one of bitnet.cpp's embedding architectures.
    pub fn is_embedding(self) -> bool {
        matches!(self, SynthArch::Qwen3 | SynthArch::Gemma3)
    }
}

impl std::str::FromStr for SynthArch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "bitnet-b1.58" => Ok(SynthArch::BitnetB158),
            "llama" => Ok(SynthArch::Llama),
            "bitnet" => Ok(SynthArch::Bitnet),
            "qwen3" => Ok(SynthArch::Qwen3),
            "gemma3" => Ok(SynthArch::Gemma3),
            _ => Err(format!(
                "unknown architecture '{s}' (bitnet-b1.58, llama, bitnet, qwen3, gemma3)"
            )),
        }
    }
}

/// Named shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// The tiny golden model's shapes: 2 layers, embedding 256, 2 heads / 1 KV head, FFN 512.
    Tiny,
    /// A mid-size model for quick benchmarks: 6 layers, embedding 1024, 8 / 2 heads, FFN 2816.
    Small,
    /// The full 2B-4T shapes: 30 layers, embedding 2560, 20 / 5 heads, FFN 6912, context 4096.
    B2,
    /// Llama3-8B-1.58's shapes: 32 layers, embedding 4096, 32 / 8 heads, FFN 14336, context
    /// 8192 (with `--arch llama` and the LLaMA-3 vocabulary, its whole structure).
    L8B,
    /// Falcon3-1B-1.58bit's shapes: 18 layers, embedding 2048, 8 / 4 heads of 256, FFN 8192,
    /// context 8192, RoPE base 1000042, RMS ε 1e-6, Falcon3's pre-tokenizer named.
    Falcon3_1B,
    /// Falcon3-7B-1.58bit's: 28 layers, embedding 3072, 12 / 4 heads of 256, FFN 23040, and
    /// the rest as [`Preset::Falcon3_1B`].
    Falcon3_7B,
    /// bitnet-embedding-0.6b's shapes (`qwen3`): 28 layers, embedding 1024, 16 / 8 heads of
    /// 128, FFN 3072, context 32768, RoPE base 1e6, RMS ε 1e-6, Qwen's pre-tokenizer named.
    Embed0_6B,
    /// bitnet-embedding-270m's (`gemma3`): 18 layers, embedding 640, 4 / 1 heads of 256,
    /// FFN 2048, context 32768, RoPE base 10000, RMS ε 1e-6.
    Embed270M,
}

impl std::str::FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tiny" => Ok(Preset::Tiny),
            "small" => Ok(Preset::Small),
            "2b" => Ok(Preset::B2),
            "8b" => Ok(Preset::L8B),
            "falcon3-1b" => Ok(Preset::Falcon3_1B),
            "falcon3-7b" => Ok(Preset::Falcon3_7B),
            "embed-0.6b" => Ok(Preset::Embed0_6B),
            "embed-270m" => Ok(Preset::Embed270M),
            _ => Err(format!(
                "unknown preset '{s}' (tiny, small, 2b, 8b, falcon3-1b, falcon3-7b, embed-0.6b, \
                 embed-270m)"
            )),
        }
    }
}

/// Everything that defines a synthetic model.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    pub name: String,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ctx: usize,
    pub layout: WeightLayout,
    pub seed: u64,
    /// `β = beta_c / sqrt(in_features)`
    pub beta_c: f32,
    /// A SiLU-gated FFN (`{arch}.hidden_act = silu`) instead of 2B-4T's ReLU².
    pub silu: bool,
    /// The graph (and with it the tensor set and metadata keys).
    pub arch: SynthArch,
    /// `{arch}.rope.freq_base`.
    pub rope_base: f32,
    /// `{arch}.attention.layer_norm_rms_epsilon`.
    pub rms_eps: f32,
    /// `tokenizer.ggml.pre` to write (replacing the vocabulary's, if it has one).
    pub pre: Option<String>,
    /// Elements per attention head, written as `key_length`/`value_length` (`None`:
    /// `n_embd / n_head`, and no such keys).
    pub head_dim: Option<usize>,
}

impl SynthSpec {
    pub fn preset(p: Preset) -> Self {
        let (name, n_embd, n_layer, n_ff, n_head, n_head_kv, n_ctx) = match p {
            Preset::Tiny => ("bitnet-synth-tiny", 256, 2, 512, 2, 1, 512),
            Preset::Small => ("bitnet-synth-small", 1024, 6, 2816, 8, 2, 2048),
            Preset::B2 => ("bitnet-synth-2b", 2560, 30, 6912, 20, 5, 4096),
            Preset::L8B => ("bitnet-synth-8b", 4096, 32, 14336, 32, 8, 8192),
            Preset::Falcon3_1B => ("bitnet-synth-falcon3-1b", 2048, 18, 8192, 8, 4, 8192),
            Preset::Falcon3_7B => ("bitnet-synth-falcon3-7b", 3072, 28, 23040, 12, 4, 8192),
            Preset::Embed0_6B => ("bitnet-synth-embed-0.6b", 1024, 28, 3072, 16, 8, 32768),
            Preset::Embed270M => ("bitnet-synth-embed-270m", 640, 18, 2048, 4, 1, 32768),
        };
        let falcon3 = matches!(p, Preset::Falcon3_1B | Preset::Falcon3_7B);
        let (qwen, gemma) = (p == Preset::Embed0_6B, p == Preset::Embed270M);
        SynthSpec {
            name: name.into(),
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            n_ctx,
            layout: WeightLayout::I2S,
            seed: 42,
            beta_c: 1.0,
            silu: false,
            arch: if falcon3 || p == Preset::L8B {
                SynthArch::Llama
            } else if qwen {
                SynthArch::Qwen3
            } else if gemma {
                SynthArch::Gemma3
            } else {
                SynthArch::BitnetB158
            },
            rope_base: match p {
                _ if falcon3 => 1_000_042.0,
                Preset::Embed0_6B => 1_000_000.0,
                Preset::Embed270M => 10_000.0,
                _ => 500_000.0,
            },
            rms_eps: if falcon3 || qwen || gemma { 1e-6 } else { 1e-5 },
            pre: if falcon3 {
                Some("falcon3".to_string())
            } else if qwen {
                Some("qwen2".to_string())
            } else {
                None
            },
            head_dim: match p {
                Preset::Embed0_6B => Some(128),
                Preset::Embed270M => Some(256),
                _ => None,
            },
        }
    }

    fn validate(&self) -> Result<(), SynthError> {
        let bad = |m: &str| Err(SynthError::Shape(m.to_string()));
        let dims = [
            self.n_embd,
            self.n_layer,
            self.n_ff,
            self.n_head,
            self.n_head_kv,
            self.n_ctx,
        ];
        if dims.contains(&0) {
            return bad("every dimension must be at least 1");
        }
        if dims.iter().any(|&d| d > MAX_DIM) {
            return bad("dimension too large");
        }
        if (self.head_dim.is_none() && !self.n_embd.is_multiple_of(self.n_head))
            || !self.n_head.is_multiple_of(self.n_head_kv)
        {
            return bad("n_embd must be a multiple of n_head, and n_head of n_head_kv");
        }
        if self
            .head_dim
            .is_some_and(|d| d == 0 || d % 2 != 0 || d > MAX_DIM)
        {
            return bad("the head dimension must be even and at least 2");
        }
        if self.head_dim.is_some() && !self.arch.is_embedding() {
            return bad("a head dimension of its own needs --arch qwen3 or gemma3");
        }
        let blk = match self.layout {
            WeightLayout::I2S | WeightLayout::F32 => 128,
            WeightLayout::Tq2_0 | WeightLayout::Tq1_0 | WeightLayout::Qk256 => 256,
            WeightLayout::BitNet32F16 | WeightLayout::Split32WithSibling => 32,
        };
        if !self.n_embd.is_multiple_of(blk)
            || !self.n_ff.is_multiple_of(blk)
            || !(self.n_head * self.head_dim()).is_multiple_of(blk)
        {
            return Err(SynthError::Shape(format!(
                "n_embd, n_ff and n_head × head_dim must be multiples of {blk} for {:?}",
                self.layout
            )));
        }
        Ok(())
    }

    fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.n_embd / self.n_head)
    }
}

/// Largest dimension a synthetic model may have.
const MAX_DIM: usize = 1 << 20;

/// One tensor of the file: name, ggml ne, and how to fill it.
#[derive(Debug, Clone)]
struct Planned {
    name: String,
    dims: Vec<u64>,
    kind: Kind,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// the token embedding, or an untied LM head (values drawn the same way)
    Embedding,
    Norm,
    /// ternary projection, n_out x n_in
    Projection {
        n_out: usize,
        n_in: usize,
    },
    /// the sibling scale tensor of the projection planned just before it
    Scales,
}

fn plan(spec: &SynthSpec, n_vocab: usize) -> Vec<Planned> {
    let (e, ff) = (spec.n_embd, spec.n_ff);
    let kv = spec.n_head_kv * spec.head_dim();
    let u = |x: usize| x as u64;
    let mut v = vec![Planned {
        name: "token_embd.weight".into(),
        dims: vec![u(e), u(n_vocab)],
        kind: Kind::Embedding,
    }];
    let sibling = matches!(
        spec.layout,
        WeightLayout::Split32WithSibling | WeightLayout::Qk256
    );
    for il in 0..spec.n_layer {
        let norm = |stem: &str, n: usize| Planned {
            name: format!("blk.{il}.{stem}.weight"),
            dims: vec![u(n)],
            kind: Kind::Norm,
        };
        let proj = |v: &mut Vec<Planned>, stem: &str, n_in: usize, n_out: usize| {
            let name = format!("blk.{il}.{stem}.weight");
            v.push(Planned {
                name: name.clone(),
                dims: vec![u(n_in), u(n_out)],
                kind: Kind::Projection { n_out, n_in },
            });
            if sibling {
                let per_row = match spec.layout {
                    WeightLayout::Qk256 => n_in.div_ceil(256),
                    _ => n_in / 32,
                };
                v.push(Planned {
                    name: format!("{name}.scale"),
                    dims: vec![u(per_row * n_out)],
                    kind: Kind::Scales,
                });
            }
        };
        if spec.arch.is_embedding() {
            // bitnet.cpp's embedding converter's order: the checkpoint's, as named.
            let (hd, qd) = (spec.head_dim(), spec.n_head * spec.head_dim());
            v.push(norm("attn_norm", e));
            proj(&mut v, "attn_q", e, qd);
            proj(&mut v, "attn_k", e, kv);
            proj(&mut v, "attn_v", e, kv);
            proj(&mut v, "attn_output", qd, e);
            v.push(norm("attn_q_norm", hd));
            v.push(norm("attn_k_norm", hd));
            for (stem, n) in [
                ("attn_q_norm_in", e),
                ("attn_k_norm_in", e),
                ("attn_v_norm_in", e),
                ("attn_output_norm_in", qd),
            ] {
                v.push(norm(stem, n));
            }
            proj(&mut v, "ffn_gate", e, ff);
            proj(&mut v, "ffn_up", e, ff);
            proj(&mut v, "ffn_down", ff, e);
            for (stem, n) in [
                ("ffn_gate_norm_in", e),
                ("ffn_up_norm_in", e),
                ("ffn_down_norm_in", ff),
            ] {
                v.push(norm(stem, n));
            }
            if spec.arch == SynthArch::Gemma3 {
                v.push(norm("post_attention_norm", e));
                v.push(norm("ffn_norm", e));
                v.push(norm("post_ffw_norm", e));
            } else {
                v.push(norm("ffn_norm", e));
            }
            continue;
        }
        v.push(norm("attn_norm", e));
        proj(&mut v, "attn_q", e, e);
        proj(&mut v, "attn_k", e, kv);
        proj(&mut v, "attn_v", e, kv);
        proj(&mut v, "attn_output", e, e);
        let sub_norms = spec.arch != SynthArch::Llama;
        if sub_norms {
            v.push(norm("attn_sub_norm", e));
        }
        v.push(norm("ffn_norm", e));
        proj(&mut v, "ffn_gate", e, ff);
        proj(&mut v, "ffn_up", e, ff);
        proj(&mut v, "ffn_down", ff, e);
        if sub_norms {
            v.push(norm("ffn_sub_norm", ff));
        }
    }
    v.push(Planned {
        name: "output_norm.weight".into(),
        dims: vec![u(e)],
        kind: Kind::Norm,
    });
    if spec.arch == SynthArch::Llama {
        v.push(Planned {
            name: "output.weight".into(),
            dims: vec![u(e), u(n_vocab)],
            kind: Kind::Embedding,
        });
    }
    v
}

fn layout_type_id(l: WeightLayout) -> u32 {
    match l {
        WeightLayout::F32 => 0,
        WeightLayout::Tq2_0 => 35,
        WeightLayout::Tq1_0 => 34,
        _ => 36,
    }
}

fn tensor_type_and_size(spec: &SynthSpec, p: &Planned) -> Result<(u32, u64), SynthError> {
    let n: usize = p.dims.iter().map(|&d| d as usize).product();
    let size = |x: usize| x as u64;
    Ok(match p.kind {
        Kind::Embedding if spec.layout == WeightLayout::F32 => (0, size(n * 4)),
        Kind::Embedding => (1, size(n * 2)),
        // bitnet.cpp's embedding converter writes its norms as F16.
        Kind::Norm if spec.arch.is_embedding() && spec.layout != WeightLayout::F32 => {
            (1, size(n * 2))
        }
        Kind::Norm | Kind::Scales => (0, size(n * 4)),
        Kind::Projection { n_out, n_in } => {
            let bytes = match spec.layout {
                WeightLayout::I2S => n / 4 + 32,
                WeightLayout::Tq2_0 => n / 256 * 66,
                WeightLayout::Tq1_0 => n / 256 * 54,
                WeightLayout::BitNet32F16 => n / 32 * 10,
                WeightLayout::Split32WithSibling => n / 32 * 8,
                WeightLayout::Qk256 => n_out * n_in.div_ceil(256) * 64,
                WeightLayout::F32 => n * 4,
            };
            (layout_type_id(spec.layout), size(bytes))
        }
    })
}

/// splitmix64: derive independent stream keys from (seed, tensor, chunk).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of a tensor name: streams are keyed by name, so every layout (with or without
/// sibling scale tensors) draws the same values for the same tensor.
pub(crate) fn name_key(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

fn rng_for(seed: u64, tensor: u64, chunk: usize) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(mix(mix(seed ^ mix(tensor)) ^ chunk as u64))
}

/// Elements per independently seeded chunk.
const CHUNK: usize = 1 << 16;

/// Ternary values in {−1, 0, +1}, about a third each (or ±1 for QK256).
pub(crate) fn ternary_values(seed: u64, tensor: u64, n: usize, binary: bool) -> Vec<i8> {
    let mut v = vec![0i8; n];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(ci, chunk)| {
        let mut rng = rng_for(seed, tensor, ci);
        for x in chunk.iter_mut() {
            *x = if binary {
                if rng.random::<bool>() {
                    1
                } else {
                    -1
                }
            } else {
                // 0..3 uniformly (rejection-free: random_range is unbiased)
                rng.random_range(0u8..3) as i8 - 1
            };
        }
    });
    v
}

pub(crate) fn norm_values(seed: u64, tensor: u64, n: usize) -> Vec<u8> {
    let mut rng = rng_for(seed, tensor, 0);
    (0..n)
        .flat_map(|_| (1.0f32 + 0.1 * rng.random_range(-1.0f32..1.0)).to_le_bytes())
        .collect()
}

/// 0.02·N(0, 1) as F16 (Box–Muller).
pub(crate) fn embedding_values(seed: u64, tensor: u64, n: usize) -> Vec<u8> {
    embedding_values_as(seed, tensor, n, 2, &|x, out| {
        out.copy_from_slice(&half::f16::from_f32(x).to_le_bytes());
    })
}

/// [`embedding_values`]' values, `width` bytes each as `put` writes them.
fn embedding_values_as(
    seed: u64,
    tensor: u64,
    n: usize,
    width: usize,
    put: &(dyn Fn(f32, &mut [u8]) + Sync),
) -> Vec<u8> {
    let mut out = vec![0u8; n * width];
    out.par_chunks_mut(CHUNK * width)
        .enumerate()
        .for_each(|(ci, chunk)| {
            let mut rng = rng_for(seed, tensor, ci);
            for pair in chunk.chunks_mut(2 * width) {
                let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
                let u2: f64 = rng.random::<f64>();
                let r = (-2.0 * u1.ln()).sqrt();
                let t = 2.0 * std::f64::consts::PI * u2;
                let (a, b) = ((0.02 * r * t.cos()) as f32, (0.02 * r * t.sin()) as f32);
                put(a, &mut pair[..width]);
                if pair.len() == 2 * width {
                    put(b, &mut pair[width..]);
                }
            }
        });
    out
}

/// Pack a projection in the chosen layout; returns (weight bytes, sibling scale bytes).
fn pack_projection(
    layout: WeightLayout,
    values: &[i8],
    n_in: usize,
    beta: f32,
) -> Result<(Vec<u8>, Option<Vec<u8>>), SynthError> {
    let n = values.len();
    let f32_bytes = |s: &[f32]| s.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    Ok(match layout {
        WeightLayout::I2S => (i2s::pack_values(values, beta)?, None),
        WeightLayout::F32 => (
            values
                .iter()
                .flat_map(|&v| (beta * f32::from(v)).to_le_bytes())
                .collect(),
            None,
        ),
        WeightLayout::Tq2_0 => (tq2_0::pack(values, &vec![beta; n / 256])?, None),
        WeightLayout::Tq1_0 => (tq1_0::pack(values, &vec![beta; n / 256])?, None),
        WeightLayout::BitNet32F16 => (seq32::pack_inline(values, &vec![beta; n / 32])?, None),
        WeightLayout::Split32WithSibling => {
            let (w, s) = seq32::pack_split(values, &vec![beta; n / 32])?;
            (w, Some(s))
        }
        WeightLayout::Qk256 => {
            let scales = vec![beta; (n / n_in) * n_in.div_ceil(256)];
            (qk256::pack(values, n_in)?, Some(f32_bytes(&scales)))
        }
    })
}

/// Tokenizer metadata to embed: every `tokenizer.*` key of a vocab GGUF, in its order.
pub fn vocab_from_gguf_bytes(bytes: &[u8]) -> Result<Vec<(String, Value)>, SynthError> {
    let f = GgufFile::from_bytes(bytes.to_vec(), &Limits::default())?;
    vocab_from_gguf(&f)
}

pub fn vocab_from_gguf(f: &GgufFile) -> Result<Vec<(String, Value)>, SynthError> {
    let kv: Vec<(String, Value)> = f
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    if !kv.iter().any(|(k, _)| k == "tokenizer.ggml.tokens") {
        return Err(SynthError::NoVocab);
    }
    Ok(kv)
}

fn n_vocab_of(vocab: &[(String, Value)]) -> Result<usize, SynthError> {
    vocab
        .iter()
        .find_map(|(k, v)| match (k.as_str(), v) {
            ("tokenizer.ggml.tokens", Value::Array(bitnet_gguf::Array::String(t))) => Some(t.len()),
            _ => None,
        })
        .ok_or(SynthError::NoVocab)
}

/// Total bytes [`write`] will produce for tensor data (for progress bars).
pub fn data_bytes(spec: &SynthSpec, n_vocab: usize) -> Result<u64, SynthError> {
    plan(spec, n_vocab)
        .iter()
        .map(|p| tensor_type_and_size(spec, p).map(|(_, s)| s))
        .sum()
}

/// Write a synthetic model to `w`. `progress(done, total)` is called after each tensor.
pub fn write<W: Write>(
    spec: &SynthSpec,
    vocab: &[(String, Value)],
    w: W,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<W, SynthError> {
    write_with(spec, vocab, w, progress, &mut |_| None)
}

/// [`write`], with the bytes of some tensors given by `given(name)` (exactly the size the
/// spec's layout needs) instead of generated.
pub(crate) fn write_with<W: Write>(
    spec: &SynthSpec,
    vocab: &[(String, Value)],
    w: W,
    progress: &mut dyn FnMut(u64, u64),
    given: &mut dyn FnMut(&str) -> Option<Vec<u8>>,
) -> Result<W, SynthError> {
    spec.validate()?;
    let n_vocab = n_vocab_of(vocab)?;
    let plan = plan(spec, n_vocab);
    // The official file's (stale) chat template, from the built-in vocabulary, when the
    // given vocabulary has none: the key set then matches the official file.
    let has_template = vocab.iter().any(|(k, _)| k == "tokenizer.chat_template");
    let builtin = if has_template {
        Vec::new()
    } else {
        vocab_from_gguf_bytes(crate::TINY_VOCAB_GGUF)?
    };
    let get = |key: &str| {
        vocab
            .iter()
            .chain(
                builtin
                    .iter()
                    .filter(|(k, _)| k == "tokenizer.chat_template"),
            )
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let u32v = |x: usize| Value::U32(x as u32);

    let mut gw = GgufWriter::new(w, 32)?;
    let arch = spec.arch.name();
    // Key order of the official 2B-4T file.
    gw.add_kv("general.architecture", Value::String(arch.into()))?;
    gw.add_kv("general.name", Value::String(spec.name.clone()))?;
    gw.add_kv(&format!("{arch}.vocab_size"), u32v(n_vocab))?;
    gw.add_kv(&format!("{arch}.context_length"), u32v(spec.n_ctx))?;
    gw.add_kv(&format!("{arch}.embedding_length"), u32v(spec.n_embd))?;
    gw.add_kv(&format!("{arch}.block_count"), u32v(spec.n_layer))?;
    gw.add_kv(&format!("{arch}.feed_forward_length"), u32v(spec.n_ff))?;
    gw.add_kv(
        &format!("{arch}.rope.dimension_count"),
        u32v(spec.head_dim()),
    )?;
    gw.add_kv(&format!("{arch}.attention.head_count"), u32v(spec.n_head))?;
    gw.add_kv(
        &format!("{arch}.attention.head_count_kv"),
        u32v(spec.n_head_kv),
    )?;
    // Qwen's vocabulary has no BOS in front (llama.cpp's `qwen2` pre-tokenizer adds none).
    let add_bos = if spec.arch == SynthArch::Qwen3 {
        Value::Bool(false)
    } else {
        get("tokenizer.ggml.add_bos_token").unwrap_or(Value::Bool(true))
    };
    gw.add_kv("tokenizer.ggml.add_bos_token", add_bos)?;
    gw.add_kv(
        &format!("{arch}.attention.layer_norm_rms_epsilon"),
        Value::F32(spec.rms_eps),
    )?;
    gw.add_kv(
        &format!("{arch}.rope.freq_base"),
        Value::F32(spec.rope_base),
    )?;
    // llama.cpp's file types: ALL_F32 0; bitnet.cpp's MOSTLY_I2_S 40 (the official file's).
    let file_type = if spec.layout == WeightLayout::F32 {
        0
    } else {
        40
    };
    gw.add_kv("general.file_type", Value::U32(file_type))?;
    if spec.silu && spec.arch == SynthArch::BitnetB158 {
        gw.add_kv(&format!("{arch}.hidden_act"), Value::String("silu".into()))?;
    }
    if let Some(hd) = spec.head_dim {
        gw.add_kv(&format!("{arch}.attention.key_length"), u32v(hd))?;
        gw.add_kv(&format!("{arch}.attention.value_length"), u32v(hd))?;
    }
    if spec.arch.is_embedding() {
        // LLAMA_POOLING_TYPE_LAST, from the checkpoints' sentence-transformers config.
        gw.add_kv(&format!("{arch}.pooling_type"), Value::U32(3))?;
    }
    if spec.arch == SynthArch::Qwen3 {
        // The converter's: EOS appended, for last-token pooling.
        gw.add_kv("tokenizer.ggml.add_eos_token", Value::Bool(true))?;
    }
    for key in [
        "tokenizer.ggml.model",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.chat_template",
    ] {
        if let Some(v) = get(key) {
            gw.add_kv(key, v)?;
        }
    }
    // Any other tokenizer keys the vocabulary carries (e.g. a pre-tokenizer name).
    for (k, v) in vocab {
        let known = [
            "tokenizer.ggml.add_bos_token",
            "tokenizer.ggml.model",
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.scores",
            "tokenizer.ggml.token_type",
            "tokenizer.ggml.merges",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.padding_token_id",
            "tokenizer.chat_template",
        ];
        let replaced = (spec.pre.is_some() && k == "tokenizer.ggml.pre")
            || (spec.arch == SynthArch::Qwen3 && k == "tokenizer.ggml.add_eos_token");
        if !known.contains(&k.as_str()) && !replaced {
            gw.add_kv(k, v.clone())?;
        }
    }
    if let Some(pre) = &spec.pre {
        gw.add_kv("tokenizer.ggml.pre", Value::String(pre.clone()))?;
    }
    gw.add_kv("general.quantization_version", Value::U32(2))?;

    let mut total = 0u64;
    for p in &plan {
        let (ty, size) = tensor_type_and_size(spec, p)?;
        gw.add_tensor(&p.name, &p.dims, ty, size)?;
        total += size;
    }
    gw.write_header()?;

    let mut done = 0u64;
    let mut pending_scales: Option<Vec<u8>> = None;
    for p in &plan {
        let ti = name_key(&p.name);
        let n: usize = p.dims.iter().map(|&d| d as usize).product();
        let supplied = match p.kind {
            Kind::Scales => None,
            _ => given(&p.name),
        };
        let bytes = match p.kind {
            _ if supplied.is_some() => supplied.unwrap_or_default(),
            Kind::Embedding if spec.layout == WeightLayout::F32 => {
                embedding_values_as(spec.seed, ti, n, 4, &|x, out| {
                    out.copy_from_slice(&x.to_le_bytes());
                })
            }
            Kind::Embedding => embedding_values(spec.seed, ti, n),
            Kind::Norm if spec.arch.is_embedding() && spec.layout != WeightLayout::F32 => {
                norm_values(spec.seed, ti, n)
                    .chunks_exact(4)
                    .flat_map(|c| {
                        let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        half::f16::from_f32(x).to_le_bytes()
                    })
                    .collect()
            }
            Kind::Norm => norm_values(spec.seed, ti, n),
            Kind::Projection { n_in, .. } => {
                let values = ternary_values(spec.seed, ti, n, spec.layout == WeightLayout::Qk256);
                #[allow(clippy::cast_precision_loss)]
                let beta = spec.beta_c / (n_in as f32).sqrt();
                let (w, s) = pack_projection(spec.layout, &values, n_in, beta)?;
                pending_scales = s;
                w
            }
            Kind::Scales => pending_scales.take().unwrap_or_default(),
        };
        gw.write_tensor_data(&p.name, &bytes)?;
        done += bytes.len() as u64;
        progress(done, total);
    }
    Ok(gw.finish()?)
}
