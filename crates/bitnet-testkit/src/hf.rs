//! Small Hugging Face model directories with known weights, for the converter's tests.
//!
//! [`write_dir`] writes `config.json`, the checkpoint (one `model.safetensors`, or shards with
//! `model.safetensors.index.json`), `tokenizer.json` and `tokenizer_config.json` for a
//! [`SynthSpec`], and returns the GGUF that holds the same weights written directly (I2_S).
//!
//! The weights are built so that what a correct converter must produce is known by
//! construction:
//! - the embedding and norms are the synthetic model's values rounded to bf16; the GGUF holds
//!   them widened (norms, F32) or rounded to f16 (embedding, F16);
//! - **bf16 master weights**: the synthetic ternary values `t` become `W = t·a·(1 + 0.25u)`
//!   for non-zeros and `W = 0.1·a·u` for zeros (`u` uniform in [−1, 1), `a` the synthetic β
//!   in bf16). Every non-zero is above half the absmean and every zero below it, so the
//!   ternary values are exactly `t`; β is the absmean of `W` (summed in f64, rounded to f32);
//! - **packed release**: `t` packed four rows per byte (transformers' `pack_weights` order)
//!   with `weight_scale = bf16(1/a)`; β is `1 / weight_scale`.
//!
//! For [`SynthArch::Llama`] the directory is a ternary `LlamaForCausalLM` (Llama3-8B-1.58,
//! Falcon3): no sub-norms, an `lm_head`, Q and K rows in the checkpoint's order (the inverse
//! of the permutation the converter applies, so the GGUF's rows come back).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use bitnet_gguf::{Array, Value};
use bitnet_kernels::layout::i2s;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::{Dtype, TensorView};

use crate::synth::{self, SynthArch, SynthError, SynthSpec, WeightLayout};

/// How the checkpoint stores its projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HfWeights {
    /// bf16 master weights (`microsoft/bitnet-b1.58-2B-4T-bf16`).
    Bf16,
    /// Four ternary values per byte with a `weight_scale` (`microsoft/bitnet-b1.58-2B-4T`).
    Packed,
    /// f16 master weights (1bitLLM's `bitnet_b1_58` checkpoints; `--arch bitnet` only).
    F16,
}

/// LLaMA-3's split regex as Hugging Face writes it.
pub const LLAMA3_HF_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn io(e: impl std::fmt::Display) -> SynthError {
    SynthError::Io(std::io::Error::other(e.to_string()))
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
        .collect()
}

fn bf16_round(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
        .collect()
}

fn f16_round(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

struct HfTensor {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// Write the directory; returns the expected GGUF (same weights, I2_S).
pub fn write_dir(
    spec: &SynthSpec,
    vocab: &[(String, Value)],
    weights: HfWeights,
    shards: usize,
    dir: &Path,
) -> Result<Vec<u8>, SynthError> {
    if spec.layout != WeightLayout::I2S {
        return Err(SynthError::Shape(
            "HF directories are compared with I2_S".into(),
        ));
    }
    let llama = spec.arch == SynthArch::Llama;
    // 1bitLLM's BitnetForCausalLM: f16 master weights, sub-norms of its own names, a tied
    // head, a SentencePiece `tokenizer.model`.
    let onebit = spec.arch == SynthArch::Bitnet;
    if onebit && weights != HfWeights::F16 {
        return Err(SynthError::Shape(
            "a 1bitLLM checkpoint (--arch bitnet) holds f16 master weights (--hf f16)".into(),
        ));
    }
    if !onebit && weights == HfWeights::F16 {
        return Err(SynthError::Shape(
            "f16 master weights are 1bitLLM's format (--arch bitnet)".into(),
        ));
    }
    // The float dtype of the checkpoint's other tensors.
    type Round = fn(f32) -> f32;
    type Bytes = fn(&[f32]) -> Vec<u8>;
    let (fdtype, fround, fbytes): (Dtype, Round, Bytes) = if onebit {
        (Dtype::F16, f16_round, f16_bytes)
    } else {
        (Dtype::BF16, bf16_round, bf16_bytes)
    };
    std::fs::create_dir_all(dir)?;
    let tokens = match vocab.iter().find(|(k, _)| k == "tokenizer.ggml.tokens") {
        Some((_, Value::Array(Array::String(t)))) => t.clone(),
        _ => return Err(SynthError::NoVocab),
    };
    let n_vocab = tokens.len();
    let (e, ff) = (spec.n_embd, spec.n_ff);
    let head_dim = e / spec.n_head;
    let kv = spec.n_head_kv * head_dim;
    let seed = spec.seed;

    let mut hf: Vec<HfTensor> = Vec::new();
    let mut expected: HashMap<String, Vec<u8>> = HashMap::new();

    // Embedding (and an untied head): the synthetic F16 values, rounded to bf16.
    let mut rows = |gguf: &str, hf_name: &str, hf: &mut Vec<HfTensor>| {
        let raw = synth::embedding_values(seed, synth::name_key(gguf), n_vocab * e);
        let v: Vec<f32> = raw
            .chunks_exact(2)
            .map(|c| fround(half::f16::from_le_bytes([c[0], c[1]]).to_f32()))
            .collect();
        expected.insert(
            gguf.into(),
            v.iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect(),
        );
        hf.push(HfTensor {
            name: hf_name.into(),
            dtype: fdtype,
            shape: vec![n_vocab, e],
            data: fbytes(&v),
        });
    };
    rows("token_embd.weight", "model.embed_tokens.weight", &mut hf);
    if llama {
        rows("output.weight", "lm_head.weight", &mut hf);
    }

    let mut norm = |gguf: String, hf_name: String, n: usize, hf: &mut Vec<HfTensor>| {
        let raw = synth::norm_values(seed, synth::name_key(&gguf), n);
        let v: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| fround(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        expected.insert(gguf, v.iter().flat_map(|x| x.to_le_bytes()).collect());
        hf.push(HfTensor {
            name: hf_name,
            dtype: fdtype,
            shape: vec![n],
            data: fbytes(&v),
        });
    };
    let mut projections: Vec<(String, String, usize, usize)> = Vec::new();
    for il in 0..spec.n_layer {
        let g = |s: &str| format!("blk.{il}.{s}.weight");
        let h = |s: &str| format!("model.layers.{il}.{s}.weight");
        norm(g("attn_norm"), h("input_layernorm"), e, &mut hf);
        let (attn_sub, ffn_sub) = if onebit {
            ("self_attn.inner_attn_ln", "mlp.ffn_layernorm")
        } else {
            ("self_attn.attn_sub_norm", "mlp.ffn_sub_norm")
        };
        if !llama {
            norm(g("attn_sub_norm"), h(attn_sub), e, &mut hf);
        }
        norm(g("ffn_norm"), h("post_attention_layernorm"), e, &mut hf);
        if !llama {
            norm(g("ffn_sub_norm"), h(ffn_sub), ff, &mut hf);
        }
        for (gs, hs, n_in, n_out) in [
            ("attn_q", "self_attn.q_proj", e, e),
            ("attn_k", "self_attn.k_proj", e, kv),
            ("attn_v", "self_attn.v_proj", e, kv),
            ("attn_output", "self_attn.o_proj", e, e),
            ("ffn_gate", "mlp.gate_proj", e, ff),
            ("ffn_up", "mlp.up_proj", e, ff),
            ("ffn_down", "mlp.down_proj", ff, e),
        ] {
            projections.push((g(gs), h(hs), n_in, n_out));
        }
    }
    norm(
        "output_norm.weight".into(),
        "model.norm.weight".into(),
        e,
        &mut hf,
    );

    for (gguf, hf_name, n_in, n_out) in projections {
        let key = synth::name_key(&gguf);
        let t_gguf = synth::ternary_values(seed, key, n_in * n_out, false);
        // Q and K of a Llama checkpoint in its own row order: GGUF row h·d + 2j + i is
        // checkpoint row h·d + i·d/2 + j (d the head size).
        let heads = match gguf.rsplit('.').nth(1) {
            Some("attn_q") if llama => Some(spec.n_head),
            Some("attn_k") if llama => Some(spec.n_head_kv),
            _ => None,
        };
        let t = match heads {
            None => t_gguf.clone(),
            Some(heads) => {
                let d = n_out / heads;
                let mut v = vec![0i8; t_gguf.len()];
                for g in 0..n_out {
                    let (h, r) = (g / d, g % d);
                    let src = h * d + (r % 2) * (d / 2) + r / 2;
                    v[src * n_in..(src + 1) * n_in]
                        .copy_from_slice(&t_gguf[g * n_in..(g + 1) * n_in]);
                }
                v
            }
        };
        #[allow(clippy::cast_precision_loss)]
        let a = bf16_round(spec.beta_c / (n_in as f32).sqrt());
        match weights {
            HfWeights::Bf16 => {
                let mut rng = ChaCha8Rng::seed_from_u64(key ^ 0x5EED);
                let w: Vec<f32> = t
                    .iter()
                    .map(|&v| {
                        let u: f32 = rng.random_range(-1.0f32..1.0);
                        let x = if v == 0 {
                            0.1 * a * u
                        } else {
                            f32::from(v) * a * (1.0 + 0.25 * u)
                        };
                        bf16_round(x)
                    })
                    .collect();
                let sum: f64 = w.iter().map(|x| f64::from(x.abs())).sum();
                #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
                let beta = ((sum / w.len() as f64) as f32).max(1e-5);
                expected.insert(gguf, i2s::pack_values(&t_gguf, beta)?);
                hf.push(HfTensor {
                    name: hf_name,
                    dtype: Dtype::BF16,
                    shape: vec![n_out, n_in],
                    data: bf16_bytes(&w),
                });
            }
            HfWeights::F16 => {
                // Every |W| is a multiple of a power of two `unit` (a/32 or below) with a
                // small multiplier, so the sum of |W| is exact in f32 whatever the order of
                // the additions: the mean, 1/mean and the ternary values are those of any
                // correct implementation of the converter's rule
                // (`s = 1/mean|W|`, `round(W·s)` clamped, β = f16(1/s)).
                // a/32 is a small positive float: its exponent fits an i32.
                #[allow(clippy::cast_possible_truncation)]
                let unit = 2f32.powi((a / 32.0).log2().floor() as i32);
                let mut rng = ChaCha8Rng::seed_from_u64(key ^ 0x5EED);
                let w: Vec<f32> = t
                    .iter()
                    .map(|&v| {
                        let u: f32 = rng.random_range(-1.0f32..1.0);
                        let x = if v == 0 {
                            0.1 * a * u
                        } else {
                            f32::from(v) * a * (1.0 + 0.25 * u)
                        };
                        (x / unit).round() * unit
                    })
                    .collect();
                let sum: f32 = w.iter().map(|x| x.abs()).sum();
                #[allow(clippy::cast_precision_loss)]
                let mean = (sum / w.len() as f32).max(1e-5);
                let s = 1.0 / mean;
                let beta = f16_round(1.0 / s);
                expected.insert(gguf, i2s::pack_values(&t_gguf, beta)?);
                hf.push(HfTensor {
                    name: hf_name,
                    dtype: Dtype::F16,
                    shape: vec![n_out, n_in],
                    data: f16_bytes(&w),
                });
            }
            HfWeights::Packed => {
                let rows = n_out / 4;
                let mut packed = vec![0u8; rows * n_in];
                for (idx, &v) in t.iter().enumerate() {
                    let (r, k) = (idx / n_in, idx % n_in);
                    let code = u8::try_from(v + 1).map_err(io)?;
                    packed[(r % rows) * n_in + k] |= code << (2 * (r / rows));
                }
                let ws = half::bf16::from_f32(1.0 / a);
                expected.insert(gguf, i2s::pack_values(&t_gguf, 1.0 / ws.to_f32())?);
                let stem = hf_name
                    .strip_suffix(".weight")
                    .unwrap_or(&hf_name)
                    .to_string();
                hf.push(HfTensor {
                    name: hf_name,
                    dtype: Dtype::U8,
                    shape: vec![rows, n_in],
                    data: packed,
                });
                hf.push(HfTensor {
                    name: format!("{stem}.weight_scale"),
                    dtype: Dtype::BF16,
                    shape: vec![1],
                    data: ws.to_le_bytes().to_vec(),
                });
            }
        }
    }

    write_checkpoint(&hf, shards.max(1), dir)?;
    if onebit {
        write_config_1bitllm(spec, vocab, n_vocab, dir)?;
        write_spm_tokenizer(vocab, dir)?;
    } else {
        write_config(spec, vocab, n_vocab, weights, dir)?;
        write_tokenizer(vocab, spec.pre.as_deref(), dir)?;
    }

    synth::write_with(spec, vocab, Vec::new(), &mut |_, _| {}, &mut |name| {
        expected.remove(name)
    })
}

fn write_checkpoint(hf: &[HfTensor], shards: usize, dir: &Path) -> Result<(), SynthError> {
    let per = hf.len().div_ceil(shards);
    let mut weight_map = BTreeMap::new();
    for (si, chunk) in hf.chunks(per.max(1)).enumerate() {
        let file = if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", si + 1, shards)
        };
        let views = chunk
            .iter()
            .map(|t| {
                TensorView::new(t.dtype, t.shape.clone(), &t.data).map(|v| (t.name.clone(), v))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(io)?;
        safetensors::serialize_to_file(views, None, &dir.join(&file)).map_err(io)?;
        for t in chunk {
            weight_map.insert(t.name.clone(), file.clone());
        }
    }
    if shards > 1 {
        let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_string_pretty(&index).map_err(io)?,
        )?;
    }
    Ok(())
}

fn vocab_u32(vocab: &[(String, Value)], key: &str) -> Option<u32> {
    vocab
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| match v {
            Value::U32(x) => Some(*x),
            _ => None,
        })
}

fn write_config(
    spec: &SynthSpec,
    vocab: &[(String, Value)],
    n_vocab: usize,
    weights: HfWeights,
    dir: &Path,
) -> Result<(), SynthError> {
    let llama = spec.arch == SynthArch::Llama;
    let mut c = serde_json::json!({
        "architectures": [if llama { "LlamaForCausalLM" } else { "BitNetForCausalLM" }],
        "model_type": if llama { "llama" } else { "bitnet" },
        "hidden_size": spec.n_embd,
        "intermediate_size": spec.n_ff,
        "num_hidden_layers": spec.n_layer,
        "num_attention_heads": spec.n_head,
        "num_key_value_heads": spec.n_head_kv,
        "max_position_embeddings": spec.n_ctx,
        "rms_norm_eps": spec.rms_eps,
        "rope_theta": spec.rope_base,
        "vocab_size": n_vocab,
        "hidden_act": if spec.silu || llama { "silu" } else { "relu2" },
        "tie_word_embeddings": !llama,
        "torch_dtype": "bfloat16",
        "bos_token_id": vocab_u32(vocab, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": vocab_u32(vocab, "tokenizer.ggml.eos_token_id"),
    });
    if weights == HfWeights::Packed {
        c["quantization_config"] = serde_json::json!({
            "quant_method": "bitnet",
            "linear_class": "bitlinear",
            "quantization_mode": "offline",
        });
    }
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&c).map_err(io)?,
    )?;
    Ok(())
}

/// `tokenizer.json` and `tokenizer_config.json` from GGUF tokenizer metadata: control tokens
/// (type 3) become special added tokens, the rest the BPE vocabulary. The pre-tokenizer is
/// LLaMA-3's split, or with `pre = falcon3` Falcon3's sequence (punctuation, byte-level, single
/// digits).
fn write_tokenizer(
    vocab: &[(String, Value)],
    pre: Option<&str>,
    dir: &Path,
) -> Result<(), SynthError> {
    let get = |key: &str| vocab.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let tokens = match get("tokenizer.ggml.tokens") {
        Some(Value::Array(Array::String(t))) => t.clone(),
        _ => return Err(SynthError::NoVocab),
    };
    let types = match get("tokenizer.ggml.token_type") {
        Some(Value::Array(Array::I32(t))) => t.clone(),
        _ => vec![1; tokens.len()],
    };
    let merges = match get("tokenizer.ggml.merges") {
        Some(Value::Array(Array::String(m))) => m.clone(),
        _ => Vec::new(),
    };
    let mut model_vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (t, ty)) in tokens.iter().zip(&types).enumerate() {
        if *ty == 3 {
            added.push(serde_json::json!({
                "id": id, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true,
            }));
        } else {
            model_vocab.insert(t.clone(), serde_json::json!(id));
        }
    }
    let pre_tokenizer = if pre == Some("falcon3") {
        serde_json::json!({
            "type": "Sequence",
            "pretokenizers": [
                { "type": "Punctuation", "behavior": "Contiguous" },
                { "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                  "use_regex": true },
                { "type": "Digits", "individual_digits": true },
            ],
        })
    } else {
        serde_json::json!({
            "type": "Sequence",
            "pretokenizers": [
                { "type": "Split", "pattern": { "Regex": LLAMA3_HF_REGEX },
                  "behavior": "Isolated", "invert": false },
                { "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                  "use_regex": false },
            ],
        })
    };
    let text = |key: &str| {
        vocab_u32(vocab, key)
            .and_then(|id| tokens.get(usize::try_from(id).ok()?))
            .cloned()
    };
    // BOS before every encoded text, as LLaMA-3's post-processor adds it (converters hash the
    // ids of a check text, BOS included, to name the pre-tokenizer).
    let bos_id = vocab_u32(vocab, "tokenizer.ggml.bos_token_id");
    let post_processor = match (text("tokenizer.ggml.bos_token_id"), bos_id) {
        (Some(bos), Some(id)) => {
            let special = |type_id: u32| serde_json::json!({ "SpecialToken": { "id": bos, "type_id": type_id } });
            let seq = |name: &str, type_id: u32| serde_json::json!({ "Sequence": { "id": name, "type_id": type_id } });
            serde_json::json!({
                "type": "TemplateProcessing",
                "single": [special(0), seq("A", 0)],
                "pair": [special(0), seq("A", 0), special(1), seq("B", 1)],
                "special_tokens": { bos.as_str(): { "id": bos, "ids": [id], "tokens": [bos] } },
            })
        }
        _ => serde_json::Value::Null,
    };
    let tj = serde_json::json!({
        "version": "1.0",
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": { "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                     "use_regex": true },
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false,
            "byte_fallback": false, "ignore_merges": true,
            "vocab": model_vocab, "merges": merges,
        },
    });
    std::fs::write(
        dir.join("tokenizer.json"),
        serde_json::to_string(&tj).map_err(io)?,
    )?;
    let mut tc = serde_json::json!({
        "add_bos_token": true,
        "bos_token": text("tokenizer.ggml.bos_token_id"),
        "eos_token": text("tokenizer.ggml.eos_token_id"),
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    if let Some(p) = text("tokenizer.ggml.padding_token_id") {
        tc["pad_token"] = serde_json::json!(p);
    }
    if let Some(Value::String(t)) = get("tokenizer.chat_template") {
        tc["chat_template"] = serde_json::json!(t);
    }
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&tc).map_err(io)?,
    )?;
    Ok(())
}

/// `config.json` of a 1bitLLM `BitnetForCausalLM` checkpoint (`bitnet_b1_58-large`'s keys).
fn write_config_1bitllm(
    spec: &SynthSpec,
    vocab: &[(String, Value)],
    n_vocab: usize,
    dir: &Path,
) -> Result<(), SynthError> {
    let c = serde_json::json!({
        "architectures": ["BitnetForCausalLM"],
        "model_type": "llama",
        "attention_bias": false,
        "hidden_act": "silu",
        "hidden_size": spec.n_embd,
        "intermediate_size": spec.n_ff,
        "num_hidden_layers": spec.n_layer,
        "num_attention_heads": spec.n_head,
        "num_key_value_heads": spec.n_head_kv,
        "max_position_embeddings": spec.n_ctx,
        "rms_norm_eps": spec.rms_eps,
        "rope_theta": spec.rope_base,
        "rope_scaling": null,
        "vocab_size": n_vocab,
        "input_bits": 8,
        "weight_bits": 1,
        "tie_word_embeddings": true,
        "torch_dtype": "float16",
        "bos_token_id": vocab_u32(vocab, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": vocab_u32(vocab, "tokenizer.ggml.eos_token_id"),
    });
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&c).map_err(io)?,
    )?;
    Ok(())
}

/// A protobuf field key (field number, wire type).
fn pb_key(out: &mut Vec<u8>, field: u32, wire: u32) {
    pb_varint(out, u64::from((field << 3) | wire));
}

fn pb_varint(out: &mut Vec<u8>, mut v: u64) {
    // Each byte holds seven bits of `v` (masked, so the narrowing keeps them all).
    #[allow(clippy::cast_possible_truncation)]
    while v >= 0x80 {
        out.push((v & 0x7F) as u8 | 0x80);
        v >>= 7;
    }
    #[allow(clippy::cast_possible_truncation)]
    out.push(v as u8);
}

fn pb_bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    pb_key(out, field, 2);
    pb_varint(out, u64::try_from(b.len()).unwrap_or(u64::MAX));
    out.extend_from_slice(b);
}

fn pb_uint(out: &mut Vec<u8>, field: u32, v: u64) {
    pb_key(out, field, 0);
    pb_varint(out, v);
}

/// A SentencePiece `ModelProto` (`tokenizer.model`) of a GGUF SentencePiece vocabulary
/// (`tokenizer.ggml.model = llama`): each piece with its score and type (GGUF's token types
/// are SentencePiece's), a BPE trainer spec with byte fallback and the special ids, and
/// LLaMA-2's normalizer (no normalization, a dummy prefix, spaces as U+2581).
pub fn spm_model_proto(vocab: &[(String, Value)]) -> Result<Vec<u8>, SynthError> {
    let get = |key: &str| vocab.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let tokens = match get("tokenizer.ggml.tokens") {
        Some(Value::Array(Array::String(t))) => t.clone(),
        _ => return Err(SynthError::NoVocab),
    };
    let scores = match get("tokenizer.ggml.scores") {
        Some(Value::Array(Array::F32(s))) => s.clone(),
        _ => vec![0.0; tokens.len()],
    };
    let types = match get("tokenizer.ggml.token_type") {
        Some(Value::Array(Array::I32(t))) => t.clone(),
        _ => vec![1; tokens.len()],
    };
    let mut out = Vec::new();
    for ((piece, score), ty) in tokens.iter().zip(&scores).zip(&types) {
        let mut p = Vec::new();
        pb_bytes(&mut p, 1, piece.as_bytes());
        pb_key(&mut p, 2, 5);
        p.extend_from_slice(&score.to_le_bytes());
        pb_uint(&mut p, 3, u64::try_from(*ty).map_err(io)?);
        pb_bytes(&mut out, 1, &p);
    }
    let id = |key: &str, default: i64| vocab_u32(vocab, key).map_or(default, i64::from);
    // Negative ids (no such token) are written as protobuf writes an int32: ten bytes.
    let int = |v: i64| u64::from_le_bytes(v.to_le_bytes());
    let mut trainer = Vec::new();
    pb_uint(&mut trainer, 3, 2); // model_type: BPE
    pb_uint(&mut trainer, 4, u64::try_from(tokens.len()).map_err(io)?); // vocab_size
    pb_uint(&mut trainer, 35, 1); // byte_fallback
    pb_uint(
        &mut trainer,
        40,
        int(id("tokenizer.ggml.unknown_token_id", 0)),
    );
    pb_uint(&mut trainer, 41, int(id("tokenizer.ggml.bos_token_id", -1)));
    pb_uint(&mut trainer, 42, int(id("tokenizer.ggml.eos_token_id", -1)));
    pb_uint(
        &mut trainer,
        43,
        int(id("tokenizer.ggml.padding_token_id", -1)),
    );
    pb_bytes(&mut out, 2, &trainer);
    let mut norm = Vec::new();
    pb_bytes(&mut norm, 1, b"identity");
    pb_uint(&mut norm, 3, 1); // add_dummy_prefix
    pb_uint(&mut norm, 4, 0); // remove_extra_whitespaces
    pb_uint(&mut norm, 5, 1); // escape_whitespaces
    pb_bytes(&mut out, 3, &norm);
    Ok(out)
}

/// `tokenizer.model` and `tokenizer_config.json` of a SentencePiece vocabulary (1bitLLM's
/// files: no `tokenizer.json`).
fn write_spm_tokenizer(vocab: &[(String, Value)], dir: &Path) -> Result<(), SynthError> {
    std::fs::write(dir.join("tokenizer.model"), spm_model_proto(vocab)?)?;
    let flag = |key: &str, default: bool| {
        vocab
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| match v {
                Value::Bool(b) => Some(*b),
                _ => None,
            })
            .unwrap_or(default)
    };
    let tc = serde_json::json!({
        "add_bos_token": flag("tokenizer.ggml.add_bos_token", true),
        "add_eos_token": flag("tokenizer.ggml.add_eos_token", false),
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "legacy": false,
        "model_max_length": 2048,
        "tokenizer_class": "LlamaTokenizer",
    });
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&tc).map_err(io)?,
    )?;
    Ok(())
}
