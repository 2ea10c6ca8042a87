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
    if spec.arch == SynthArch::Bitnet {
        return Err(SynthError::Shape(
            "1bitLLM checkpoints use a SentencePiece vocabulary: not written".into(),
        ));
    }
    let llama = spec.arch == SynthArch::Llama;
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
            .map(|c| bf16_round(half::f16::from_le_bytes([c[0], c[1]]).to_f32()))
            .collect();
        expected.insert(
            gguf.into(),
            v.iter()
                .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                .collect(),
        );
        hf.push(HfTensor {
            name: hf_name.into(),
            dtype: Dtype::BF16,
            shape: vec![n_vocab, e],
            data: bf16_bytes(&v),
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
            .map(|c| bf16_round(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect();
        expected.insert(gguf, v.iter().flat_map(|x| x.to_le_bytes()).collect());
        hf.push(HfTensor {
            name: hf_name,
            dtype: Dtype::BF16,
            shape: vec![n],
            data: bf16_bytes(&v),
        });
    };
    let mut projections: Vec<(String, String, usize, usize)> = Vec::new();
    for il in 0..spec.n_layer {
        let g = |s: &str| format!("blk.{il}.{s}.weight");
        let h = |s: &str| format!("model.layers.{il}.{s}.weight");
        norm(g("attn_norm"), h("input_layernorm"), e, &mut hf);
        if !llama {
            norm(g("attn_sub_norm"), h("self_attn.attn_sub_norm"), e, &mut hf);
        }
        norm(g("ffn_norm"), h("post_attention_layernorm"), e, &mut hf);
        if !llama {
            norm(g("ffn_sub_norm"), h("mlp.ffn_sub_norm"), ff, &mut hf);
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
    write_config(spec, vocab, n_vocab, weights, dir)?;
    write_tokenizer(vocab, spec.pre.as_deref(), dir)?;

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
