//! bitnet.cpp's embedding models (`model_type` `qwen3`: bitnet-embedding-0.6b, `gemma3_text`:
//! bitnet-embedding-270m) as its `utils/convert-bitnet-embedding-to-gguf.py --outtype i2_s`
//! writes them: the same keys in the same order, the tensors in the checkpoint's order under the
//! script's names, each projection ternarized by its rule ([`ternary::absmean_embedding`]),
//! the embedding and every norm F16 (Gemma 3's own norms with the 1 its RMSNorm adds), no LM
//! head; the tokenizer as its `_set_vocab_bpe` (Qwen 3) or `_set_vocab_gemma3` writes it, with
//! gguf-py's `SpecialVocab` for the special ids and flags.
//!
//! Where the script would fail or write something unreadable this converter decides instead:
//! Qwen 3's pre-tokenizer is named `qwen2` without the script's hash check (the check knows only
//! the released vocabularies, and names them `qwen2`), and `add_eos_token` is written once (the
//! script crashes on a duplicate key when `tokenizer_config.json` also sets it).

use std::collections::HashMap;
use std::path::Path;

use bitnet_gguf::{Array, GgmlType, Value};
use serde::Deserialize;

use crate::error::ConvertError;
use crate::hf::{self, read_json, HfDir, JsonMap};
use crate::{
    cfg_err, cfg_u32, f16_rows, hf_dims, positive_f32, u64_of, HfDims, PlanOut, Planned, Source,
    Target,
};
use safetensors::tensor::Dtype;

const TOKENIZER: &str = "tokenizer.json";
const TOKENIZER_CONFIG: &str = "tokenizer_config.json";

/// Whether `config.json` names one of the embedding architectures.
pub(crate) fn is_embedding(raw: &serde_json::Value) -> bool {
    matches!(
        raw.get("model_type").and_then(|v| v.as_str()),
        Some("qwen3" | "gemma3_text")
    )
}

/// Metadata and tensor plan of an embedding checkpoint.
pub(crate) fn plan(d: &HfDir, target: Target) -> Result<PlanOut, ConvertError> {
    let raw = &d.raw_config;
    let gemma = raw.get("model_type").and_then(|v| v.as_str()) == Some("gemma3_text");
    let arch = if gemma { "gemma3" } else { "qwen3" };
    if target != Target::I2S {
        return Err(cfg_err(
            "model_type",
            "bitnet.cpp's embedding models are converted to I2_S (its converter's layout)",
        ));
    }
    let c = &d.config;
    let HfDims {
        n_embd,
        n_ff,
        n_layer,
        n_head,
        n_head_kv,
        n_vocab,
        ..
    } = hf_dims(c)?;
    let head_dim = match c.head_dim {
        Some(h) => crate::cfg_usize("head_dim", h)?,
        None => n_embd / n_head,
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(cfg_err("head_dim", "must be even and at least 2"));
    }
    let (qd, kvd) = (n_head * head_dim, n_head_kv * head_dim);
    let k = |s: &str| format!("{arch}.{s}");
    // The script names the model after its folder.
    let name = d
        .dir
        .file_name()
        .and_then(|n| n.to_str())
        .map_or_else(|| arch.to_string(), str::to_string);
    let mut kv: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.name".into(), Value::String(name)),
        (k("block_count"), cfg_u32("num_hidden_layers", n_layer)?),
        (
            k("context_length"),
            cfg_u32(
                "max_position_embeddings",
                crate::cfg_usize("max_position_embeddings", c.max_position_embeddings)?,
            )?,
        ),
        (k("embedding_length"), cfg_u32("hidden_size", n_embd)?),
        (
            k("feed_forward_length"),
            cfg_u32("intermediate_size", n_ff)?,
        ),
        (
            k("attention.head_count"),
            cfg_u32("num_attention_heads", n_head)?,
        ),
        (
            k("attention.head_count_kv"),
            cfg_u32("num_key_value_heads", n_head_kv)?,
        ),
        (k("vocab_size"), cfg_u32("vocab_size", n_vocab)?),
        (k("rope.dimension_count"), cfg_u32("head_dim", head_dim)?),
        (k("attention.key_length"), cfg_u32("head_dim", head_dim)?),
        (k("attention.value_length"), cfg_u32("head_dim", head_dim)?),
    ];
    if let Some(theta) = c.rope_theta {
        kv.push((
            k("rope.freq_base"),
            Value::F32(positive_f32("rope_theta", theta)?),
        ));
    }
    kv.push((
        k("attention.layer_norm_rms_epsilon"),
        Value::F32(positive_f32("rms_norm_eps", c.rms_norm_eps)?),
    ));
    kv.push(("general.file_type".into(), Value::U32(target.file_type())));
    kv.push((k("pooling_type"), Value::U32(pooling_type(&d.dir)?)));
    if gemma {
        kv.extend(vocab_gemma(&d.dir, raw, n_vocab)?);
    } else {
        kv.extend(vocab_bpe(&d.dir, raw, n_vocab)?);
    }

    // Tensors in the checkpoint's order (shard files by name, names sorted in each), under
    // the script's names; unknown ones are left out, as the script leaves them.
    let map = name_map(n_layer, gemma);
    let mut names: Vec<(&std::path::Path, &str)> =
        d.names().map(|n| (d.shard_path(n), n)).collect();
    names.sort_unstable();
    let mut plan = Vec::new();
    for (_, hf_name) in names {
        let short = hf_name.strip_prefix("model.").unwrap_or(hf_name);
        let Some(gguf) = map.get(short) else {
            continue;
        };
        let t = d.require(hf_name)?;
        // The script squeezes every tensor first.
        let shape: Vec<usize> = t.shape.iter().copied().filter(|&s| s != 1).collect();
        let is_norm = gguf.ends_with("_norm.weight") || gguf.ends_with("_norm_in.weight");
        let is_embd = gguf == "token_embd.weight";
        if t.dtype == Dtype::U8 {
            return Err(cfg_err(
                "model_type",
                format!("{hf_name}: packed weights; the embedding converter reads float ones"),
            ));
        }
        if shape.len() == 2 && !is_norm && !is_embd {
            let (n_out, n_in) = (shape[0], shape[1]);
            let want = expected_projection(gguf, n_embd, n_ff, qd, kvd);
            if want.is_some_and(|w| w != (n_out, n_in)) {
                return Err(ConvertError::Shape {
                    name: hf_name.to_string(),
                    expected: want.map(|(o, i)| vec![o, i]).unwrap_or_default(),
                    found: t.shape.clone(),
                });
            }
            target.layout().check_k(n_in)?;
            plan.push(Planned {
                name: gguf.clone(),
                dims: vec![u64_of(n_in), u64_of(n_out)],
                ty: GgmlType::I2S.id(),
                size: u64_of(n_out * n_in / 4 + 32),
                source: Source::HfTernaryEmbed {
                    hf: hf_name.to_string(),
                    n_out,
                    n_in,
                },
            });
        } else if is_embd {
            hf::check_shape(hf_name, &t.shape, &[n_vocab, n_embd])?;
            plan.push(f16_rows(gguf, hf_name, n_vocab, n_embd)?);
        } else {
            let n: usize = shape.iter().product();
            // Gemma 3's RMSNorm multiplies by 1 + w: the script stores w + 1 (in f32), except
            // for the BitLinear input norms, which are plain RMSNorms.
            let plus_one = gemma && is_norm && !gguf.ends_with("_norm_in.weight");
            plan.push(Planned {
                name: gguf.clone(),
                dims: shape.iter().rev().map(|&s| u64_of(s)).collect(),
                ty: GgmlType::F16.id(),
                size: u64_of(n * 2),
                source: Source::HfNormF16 {
                    hf: hf_name.to_string(),
                    plus_one,
                },
            });
        }
    }
    if !plan.iter().any(|p| p.name == "token_embd.weight") {
        return Err(ConvertError::MissingTensor(
            "model.embed_tokens.weight".into(),
        ));
    }
    Ok((kv, plan))
}

/// The `[n_out, n_in]` a projection must have.
fn expected_projection(
    gguf: &str,
    e: usize,
    ff: usize,
    qd: usize,
    kvd: usize,
) -> Option<(usize, usize)> {
    let stem = gguf.rsplit('.').nth(1)?;
    Some(match stem {
        "attn_q" => (qd, e),
        "attn_k" | "attn_v" => (kvd, e),
        "attn_output" => (e, qd),
        "ffn_gate" | "ffn_up" => (ff, e),
        "ffn_down" => (e, ff),
        _ => return None,
    })
}

/// The script's name map (HF name without `model.` → GGUF name).
fn name_map(n_layer: usize, gemma: bool) -> HashMap<String, String> {
    let mut m = HashMap::new();
    m.insert("embed_tokens.weight".into(), "token_embd.weight".into());
    m.insert("norm.weight".into(), "output_norm.weight".into());
    for i in 0..n_layer {
        let p = format!("layers.{i}");
        let b = format!("blk.{i}");
        let mut add = |hf: &str, gg: &str| {
            m.insert(format!("{p}.{hf}"), format!("{b}.{gg}"));
        };
        for (hf, gg) in [
            ("input_layernorm.weight", "attn_norm.weight"),
            ("self_attn.q_proj.weight", "attn_q.weight"),
            ("self_attn.k_proj.weight", "attn_k.weight"),
            ("self_attn.v_proj.weight", "attn_v.weight"),
            ("self_attn.o_proj.weight", "attn_output.weight"),
            ("self_attn.q_norm.weight", "attn_q_norm.weight"),
            ("self_attn.k_norm.weight", "attn_k_norm.weight"),
            ("self_attn.q_proj.norm.weight", "attn_q_norm_in.weight"),
            ("self_attn.k_proj.norm.weight", "attn_k_norm_in.weight"),
            ("self_attn.v_proj.norm.weight", "attn_v_norm_in.weight"),
            ("self_attn.o_proj.norm.weight", "attn_output_norm_in.weight"),
            ("mlp.gate_proj.weight", "ffn_gate.weight"),
            ("mlp.up_proj.weight", "ffn_up.weight"),
            ("mlp.down_proj.weight", "ffn_down.weight"),
            ("mlp.gate_proj.norm.weight", "ffn_gate_norm_in.weight"),
            ("mlp.up_proj.norm.weight", "ffn_up_norm_in.weight"),
            ("mlp.down_proj.norm.weight", "ffn_down_norm_in.weight"),
        ] {
            add(hf, gg);
        }
        if gemma {
            add(
                "post_attention_layernorm.weight",
                "post_attention_norm.weight",
            );
            add("pre_feedforward_layernorm.weight", "ffn_norm.weight");
            add("post_feedforward_layernorm.weight", "post_ffw_norm.weight");
        } else {
            add("post_attention_layernorm.weight", "ffn_norm.weight");
        }
    }
    m
}

/// llama.cpp's pooling number from the sentence-transformers files (`modules.json`, the
/// Pooling module's `config.json`): mean 1, cls 2, last 3; mean when none says.
fn pooling_type(dir: &Path) -> Result<u32, ConvertError> {
    let modules = dir.join("modules.json");
    if !modules.is_file() {
        return Ok(1);
    }
    let list: Vec<serde_json::Value> = read_json(&modules)?;
    let Some(m) = list.iter().find(|m| {
        m.get("type")
            .and_then(|t| t.as_str())
            .is_some_and(|t| t.ends_with("Pooling"))
    }) else {
        return Ok(1);
    };
    let Some(path) = m.get("path").and_then(|p| p.as_str()) else {
        return Ok(1);
    };
    // A folder inside the checkpoint.
    if path
        .split('/')
        .any(|c| c == ".." || c.is_empty() && path.starts_with('/'))
    {
        return Err(cfg_err(
            "modules.json",
            "a module path leaves the checkpoint",
        ));
    }
    let cfg = dir.join(path).join("config.json");
    if !cfg.is_file() {
        return Ok(1);
    }
    let p: JsonMap = read_json(&cfg)?;
    let on = |k: &str| p.get(k).and_then(serde_json::Value::as_bool) == Some(true);
    Ok(if on("pooling_mode_mean_tokens") {
        1
    } else if on("pooling_mode_cls_token") {
        2
    } else if on("pooling_mode_lasttoken") {
        3
    } else {
        1
    })
}

#[derive(Deserialize)]
struct TokenizerJson {
    model: Model,
    #[serde(default)]
    added_tokens: Vec<Added>,
}

#[derive(Deserialize)]
struct Model {
    #[serde(default)]
    vocab: HashMap<String, u64>,
    #[serde(default)]
    merges: Vec<serde_json::Value>,
}

#[derive(Deserialize, Clone)]
struct Added {
    id: u64,
    content: String,
    #[serde(default)]
    special: bool,
}

const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

fn bad(file: &'static str, why: impl Into<String>) -> ConvertError {
    ConvertError::TokenizerJson {
        file,
        why: why.into(),
    }
}

/// The script's `_does_token_look_special`.
fn looks_special(t: &str) -> bool {
    !t.is_empty()
        && (t.starts_with("<|") || t.starts_with('<') || t.starts_with('['))
        && (t.ends_with("|>") || t.ends_with('>') || t.ends_with(']'))
}

fn tokenizer(dir: &Path) -> Result<(TokenizerJson, JsonMap), ConvertError> {
    let tj: TokenizerJson = read_json(&dir.join(TOKENIZER))?;
    let tc_path = dir.join(TOKENIZER_CONFIG);
    let tc = if tc_path.is_file() {
        read_json(&tc_path)?
    } else {
        JsonMap::new()
    };
    Ok((tj, tc))
}

fn merge_text(
    i: usize,
    m: &serde_json::Value,
    encode_spaces: bool,
) -> Result<String, ConvertError> {
    match m {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Array(pair) => match pair.as_slice() {
            [serde_json::Value::String(a), serde_json::Value::String(b)] => {
                // gguf-py writes a space inside a part as U+0120.
                let enc = |s: &str| {
                    if encode_spaces {
                        s.replace(' ', "\u{120}")
                    } else {
                        s.to_string()
                    }
                };
                Ok(format!("{} {}", enc(a), enc(b)))
            }
            _ => Err(bad(
                TOKENIZER,
                format!("merge {i} is not a pair of strings"),
            )),
        },
        _ => Err(bad(
            TOKENIZER,
            format!("merge {i} is not a string or a pair"),
        )),
    }
}

/// gguf-py's `SpecialVocab`: special ids (tokenizer_config.json's texts matched against the
/// added tokens, then config.json's ids, first one wins, in the order bos, eos, unk, sep, pad,
/// cls, mask), the `add_bos`/`add_eos` flags and the chat template.
struct Special {
    ids: Vec<(&'static str, u32)>,
    add: Vec<(&'static str, bool)>,
    template: Option<String>,
}

const TYPES: [&str; 7] = ["bos", "eos", "unk", "sep", "pad", "cls", "mask"];

fn special(tj: &TokenizerJson, tc: &JsonMap, config: &serde_json::Value) -> Special {
    let mut s = Special {
        ids: Vec::new(),
        add: Vec::new(),
        template: match tc.get("chat_template") {
            Some(serde_json::Value::String(t)) => Some(t.clone()),
            _ => None,
        },
    };
    let set = |s: &mut Special, typ: &'static str, id: Option<u64>| {
        let Some(id) = id.and_then(|i| u32::try_from(i).ok()) else {
            return;
        };
        if !s.ids.iter().any(|(t, _)| *t == typ) {
            s.ids.push((typ, id));
        }
    };
    for typ in TYPES {
        if let Some(serde_json::Value::Bool(b)) = tc.get(&format!("add_{typ}_token")) {
            s.add.push((typ, *b));
        }
        let content = match tc.get(&format!("{typ}_token")) {
            Some(serde_json::Value::String(c)) => Some(c.as_str()),
            Some(serde_json::Value::Object(o)) => o.get("content").and_then(|c| c.as_str()),
            _ => None,
        };
        if let Some(c) = content {
            let id = tj
                .added_tokens
                .iter()
                .find(|a| a.content == c)
                .map(|a| a.id);
            set(&mut s, typ, id);
        }
    }
    for typ in TYPES {
        let id = config
            .get(format!("{typ}_token_id"))
            .and_then(serde_json::Value::as_u64);
        set(&mut s, typ, id);
    }
    s
}

/// The keys of `SpecialVocab.add_to_gguf` after the merges: ids, flags (only BOS and EOS have
/// keys), template.
fn special_kv(s: &Special) -> Vec<(String, Value)> {
    let mut kv = Vec::new();
    for (typ, id) in &s.ids {
        let key = match *typ {
            "bos" => "tokenizer.ggml.bos_token_id",
            "eos" => "tokenizer.ggml.eos_token_id",
            "unk" => "tokenizer.ggml.unknown_token_id",
            "sep" => "tokenizer.ggml.seperator_token_id",
            "pad" => "tokenizer.ggml.padding_token_id",
            "cls" => "tokenizer.ggml.cls_token_id",
            _ => "tokenizer.ggml.mask_token_id",
        };
        kv.push((key.to_string(), Value::U32(*id)));
    }
    for (typ, b) in &s.add {
        match *typ {
            "bos" => kv.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(*b))),
            "eos" => kv.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(*b))),
            _ => {}
        }
    }
    if let Some(t) = &s.template {
        kv.push(("tokenizer.chat_template".into(), Value::String(t.clone())));
    }
    kv
}

/// Qwen 3's vocabulary, as the script's `_set_vocab_bpe` writes it.
fn vocab_bpe(
    dir: &Path,
    config: &serde_json::Value,
    n_vocab: usize,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let (tj, tc) = tokenizer(dir)?;
    // The tokenizer's vocabulary: the model's, then the added tokens.
    let mut reverse: HashMap<u64, String> = tj
        .model
        .vocab
        .iter()
        .map(|(t, &i)| (i, t.clone()))
        .collect();
    let mut added: HashMap<u64, Added> = HashMap::new();
    for a in &tj.added_tokens {
        reverse.insert(a.id, a.content.clone());
        added.insert(a.id, a.clone());
    }
    let added_texts: std::collections::HashSet<&str> =
        tj.added_tokens.iter().map(|a| a.content.as_str()).collect();
    let mut tokens = Vec::with_capacity(n_vocab);
    let mut types = Vec::with_capacity(n_vocab);
    for i in 0..u64_of(n_vocab) {
        match reverse.get(&i) {
            None => {
                tokens.push(format!("[PAD{i}]"));
                types.push(UNUSED);
            }
            Some(t) if added_texts.contains(t.as_str()) => {
                let special = added.get(&i).is_some_and(|a| a.special);
                if special || looks_special(t) {
                    tokens.push(t.clone());
                    types.push(CONTROL);
                } else {
                    tokens.push(t.replace('\u{2581}', " "));
                    types.push(USER_DEFINED);
                }
            }
            Some(t) => {
                tokens.push(t.clone());
                types.push(NORMAL);
            }
        }
    }
    let mut merges = tj
        .model
        .merges
        .iter()
        .enumerate()
        .map(|(i, m)| merge_text(i, m, true))
        .collect::<Result<Vec<_>, _>>()?;
    if merges.is_empty() {
        merges = merges_txt(dir)?;
    }
    let mut sp = special(&tj, &tc, config);
    // The script's override: Qwen 3's sentence end is <|endoftext|> (151643), which its
    // last-token pooling reads.
    match sp.ids.iter_mut().find(|(t, _)| *t == "eos") {
        Some(e) => e.1 = 151_643,
        None => sp.ids.push(("eos", 151_643)),
    }
    let mut kv: Vec<(String, Value)> = vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("qwen2".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(tokens)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
    ];
    if !merges.is_empty() {
        kv.push((
            "tokenizer.ggml.merges".into(),
            Value::Array(Array::String(merges)),
        ));
    }
    kv.extend(special_kv(&sp));
    // Embedding models append EOS for last-token pooling (one key, whatever the config said).
    kv.retain(|(k, _)| k != "tokenizer.ggml.add_eos_token");
    kv.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(true)));
    Ok(kv)
}

/// `merges.txt` as gguf-py reads it (a `#` first line skipped, `a b` pairs).
fn merges_txt(dir: &Path) -> Result<Vec<String>, ConvertError> {
    let path = dir.join("merges.txt");
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(&path).map_err(ConvertError::io(&path))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if (i == 0 && line.starts_with('#')) || line.is_empty() {
            continue;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        if let [a, b] = parts.as_slice() {
            out.push(format!("{a} {b}"));
        }
    }
    Ok(out)
}

/// Gemma 3's vocabulary, as the script's `_set_vocab_gemma3` writes it: SentencePiece-style
/// (`tokenizer.ggml.model = llama`, no space prefix), scores from the merge ranks.
fn vocab_gemma(
    dir: &Path,
    config: &serde_json::Value,
    n_vocab: usize,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let (tj, tc) = tokenizer(dir)?;
    let mut merge_scores: HashMap<String, f32> = HashMap::new();
    for (rank, m) in tj.model.merges.iter().enumerate() {
        let result = match m {
            serde_json::Value::String(s) => s.replacen(' ', "", 1),
            serde_json::Value::Array(p) => p
                .iter()
                .map(|x| x.as_str().unwrap_or(""))
                .collect::<String>(),
            _ => {
                return Err(bad(
                    TOKENIZER,
                    format!("merge {rank} is not a string or a pair"),
                ))
            }
        };
        // -rank, as the script computes it in f64 and gguf-py stores it in f32.
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        merge_scores.entry(result).or_insert(-(rank as f64) as f32);
    }
    let reverse: HashMap<u64, &str> = tj
        .model
        .vocab
        .iter()
        .map(|(t, &i)| (i, t.as_str()))
        .collect();
    let added: HashMap<u64, &Added> = tj.added_tokens.iter().map(|a| (a.id, a)).collect();
    let (mut tokens, mut scores, mut types) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..u64_of(n_vocab) {
        let Some(&t) = reverse.get(&i) else {
            tokens.push(format!("[PAD{i}]"));
            scores.push(-10_000.0);
            types.push(UNUSED);
            continue;
        };
        if let Some(a) = added.get(&i) {
            types.push(if a.special || looks_special(t) {
                CONTROL
            } else {
                USER_DEFINED
            });
            scores.push(-1000.0);
        } else if t.starts_with("<0x") && t.ends_with('>') && t.chars().count() == 6 {
            types.push(BYTE);
            scores.push(0.0);
        } else if t == "<unk>" {
            types.push(UNKNOWN);
            scores.push(0.0);
        } else {
            types.push(NORMAL);
            scores.push(merge_scores.get(t).copied().unwrap_or(0.0));
        }
        tokens.push(t.to_string());
    }
    let mut kv: Vec<(String, Value)> = vec![
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(tokens)),
        ),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array(Array::F32(scores)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
        ("tokenizer.ggml.add_space_prefix".into(), Value::Bool(false)),
    ];
    kv.extend(special_kv(&special(&tj, &tc, config)));
    Ok(kv)
}
