//! `bitnet convert`: Hugging Face checkpoints to GGUF, and GGUF files between ternary layouts.
//!
//! Inputs:
//! - a **Hugging Face model directory** (`config.json`, `model.safetensors` or shards with
//!   `model.safetensors.index.json`, `tokenizer.json`, `tokenizer_config.json`) holding either
//!   the bf16 master weights (ternarized with the absmean rule) or the packed release (U8
//!   weights with a `weight_scale`; decoded exactly), see [`ternary`];
//! - a **GGUF** file whose projections are I2_S (bitnet.cpp), TQ2_0 or TQ1_0.
//!
//! Outputs: GGUF with the official file's metadata keys, tensor names and types (F16 embedding,
//! F32 norms, ternary projections in the chosen [`Target`]), or, with [`Flavor::LlamaCpp`], the
//! `bitnet` architecture of upstream llama.cpp with TQ2_0/TQ1_0 weights.
//!
//! Nothing is held whole: tensors are read, converted and written one at a time.
#![forbid(unsafe_code)]

mod embedding;
mod error;
pub mod hf;
pub mod spm;
pub mod ternary;
mod tokjson;

use std::io::Write;
use std::path::Path;

use bitnet_gguf::{Array, GgmlType, GgufFile, GgufWriter, Limits, Metadata, Value};
use bitnet_model::names::{LayerTensor, OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
use bitnet_model::{Activation, Config};
use safetensors::tensor::Dtype;

pub use error::ConvertError;
pub use hf::{HfConfig, HfDir};
pub use ternary::{Scale, Target, Ternary};

/// The architecture name of bitnet.cpp's 2B-4T files.
pub const ARCH_B158: &str = "bitnet-b1.58";
/// The 2B-4T architecture's name in what bitnet.cpp's converter writes.
pub const ARCH_BITNET_CPP: &str = "bitnet-25";
/// The architecture bitnet.cpp's converter writes for ternary Llama and Falcon3 checkpoints.
pub const ARCH_LLAMA: &str = "llama";
/// Upstream llama.cpp's architecture for BitNet models.
pub const ARCH_UPSTREAM: &str = "bitnet";

/// Who will read the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flavor {
    /// bitnet-rs and bitnet.cpp: architecture `bitnet-b1.58`, any layout.
    #[default]
    Native,
    /// Upstream llama.cpp and Ollama: architecture `bitnet`, TQ2_0 or TQ1_0.
    LlamaCpp,
    /// What bitnet.cpp's own converter for a `BitNetForCausalLM` checkpoint writes
    /// (`utils/convert-helper-bitnet.py`: `convert-ms-to-gguf-bitnet.py`, then `llama-quantize
    /// … I2_S 1`): architecture `bitnet-25`, its `general.name` rule, its chat template, no
    /// `tokenizer.ggml.pre`, every added token a control token with score −1000. I2_S only.
    BitnetCpp,
}

/// What to write.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The ternary layout (default: I2_S, or TQ2_0 for [`Flavor::LlamaCpp`]).
    pub to: Option<Target>,
    pub flavor: Flavor,
    /// Write a llama.cpp file even when its graph applies another FFN activation.
    pub allow_activation_mismatch: bool,
    /// `general.name` (default: the source's).
    pub name: Option<String>,
    /// Store a quantized LM head as `output.weight` (Q8_0, Q6_K or Q4_0), built from the
    /// file's head (the tied embedding, or its `output.weight`) with the quantizers
    /// `--lm-head` uses at load: loading it then costs no build time, and no F16 head is read
    /// per token.
    pub lm_head: Option<bitnet_kernels::RowType>,
}

/// Progress after each tensor.
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    pub tensor: &'a str,
    pub index: usize,
    pub count: usize,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Summary {
    pub source: &'static str,
    pub target: Target,
    pub arch: String,
    pub tensors: usize,
    pub ternary_tensors: usize,
    pub data_bytes: u64,
    pub activation: Activation,
}

/// Where a tensor's bytes come from.
#[derive(Debug, Clone)]
enum Source {
    /// A float tensor of the checkpoint, written as F16 or F32.
    HfFloat { hf: String, to: GgmlType },
    /// A projection of the checkpoint (bf16 master or packed), `[n_out, n_in]`; `permute`:
    /// the number of heads whose rows are reordered for llama.cpp's normal RoPE (Q and K of a
    /// `LlamaForCausalLM` checkpoint).
    HfTernary {
        hf: String,
        n_out: usize,
        n_in: usize,
        permute: Option<usize>,
    },
    /// A projection of a 1bitLLM checkpoint (float master weights), `[n_out, n_in]`,
    /// ternarized by bitnet.cpp's rule for it ([`ternary::absmean_1bitllm`]).
    HfTernary1bit {
        hf: String,
        n_out: usize,
        n_in: usize,
    },
    /// A norm of an embedding checkpoint as F16, with 1 added in f32 first where `plus_one`
    /// (Gemma 3's own norms).
    HfNormF16 { hf: String, plus_one: bool },
    /// A projection of an embedding checkpoint, `[n_out, n_in]`, ternarized by bitnet.cpp's
    /// embedding converter's rule ([`ternary::absmean_embedding`]).
    HfTernaryEmbed {
        hf: String,
        n_out: usize,
        n_in: usize,
    },
    /// A tensor of the input GGUF copied as it is.
    Copy { name: String },
    /// The LM head re-encoded from `from` (a tensor of the output plan) as `ty`.
    Head {
        from: Box<Source>,
        ty: bitnet_kernels::RowType,
        rows: usize,
        cols: usize,
    },
    /// A ternary tensor of the input GGUF, re-encoded.
    GgufTernary {
        name: String,
        n_out: usize,
        n_in: usize,
    },
}

/// Metadata in order, and the tensors to write.
type PlanOut = (Vec<(String, Value)>, Vec<Planned>);

#[derive(Debug, Clone)]
struct Planned {
    name: String,
    dims: Vec<u64>,
    ty: u32,
    size: u64,
    source: Source,
}

enum Input {
    Hf(Box<HfDir>),
    Gguf(Box<GgufFile>),
}

fn u64_of(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// `a · b · c` bytes, or an error naming the tensor when it overflows.
fn bytes_of(name: &str, a: usize, b: usize, c: usize) -> Result<u64, ConvertError> {
    a.checked_mul(b)
        .and_then(|x| x.checked_mul(c))
        .map(u64_of)
        .ok_or_else(|| ConvertError::Unsupported {
            name: name.to_string(),
            what: "size overflows".into(),
        })
}

fn usize_of(name: &str, n: u64) -> Result<usize, ConvertError> {
    usize::try_from(n).map_err(|_| ConvertError::Unsupported {
        name: name.to_string(),
        what: format!("dimension {n} does not fit in memory"),
    })
}

/// Convert `input` (a GGUF file or a Hugging Face directory) and write GGUF to `out`.
/// `progress` is called after every tensor; returning `false` cancels with
/// [`ConvertError::Cancelled`].
pub fn convert<W: Write>(
    input: &Path,
    opts: &Options,
    out: W,
    progress: &mut dyn FnMut(&Progress<'_>) -> bool,
) -> Result<(W, Summary), ConvertError> {
    if opts.flavor == Flavor::LlamaCpp && opts.lm_head.is_some() {
        // Upstream's `bitnet` graph uses token_embd as its head and loads no output.weight:
        // a file with one fails there with "wrong number of tensors".
        return Err(ConvertError::Options(
            "upstream llama.cpp's `bitnet` architecture takes no separate LM head: drop --lm-head with --for llama.cpp"
                .into(),
        ));
    }
    let src = open_input(input)?;
    if opts.flavor == Flavor::BitnetCpp {
        let is_b158 = matches!(&src, Input::Hf(d)
            if !embedding::is_embedding(&d.raw_config)
                && matches!(d.config.architectures.first().map(String::as_str),
                            None | Some("BitNetForCausalLM")));
        if !is_b158 || !matches!(opts.to, None | Some(Target::I2S)) || opts.lm_head.is_some() {
            return Err(ConvertError::Options(
                "--for bitnet.cpp writes what bitnet.cpp's converter writes for a BitNetForCausalLM checkpoint: an I2_S file without a separate LM head"
                    .into(),
            ));
        }
    }
    let target = match (opts.flavor, opts.to) {
        (Flavor::LlamaCpp, Some(Target::I2S)) => {
            return Err(ConvertError::Options(
                "upstream llama.cpp cannot read I2_S (type 36): use --to tq2_0 or tq1_0 with --for llama.cpp"
                    .into(),
            ))
        }
        (Flavor::LlamaCpp, None) => Target::Tq2_0,
        (_, Some(t)) => t,
        (Flavor::BitnetCpp, None) => Target::I2S,
        // A GGUF keeps its layout; a checkpoint becomes the official file's I2_S.
        (Flavor::Native, None) => match &src {
            Input::Gguf(f) => layout_of(f),
            Input::Hf(_) => Target::I2S,
        },
    };
    let (mut kv, plan, source_name) = match &src {
        Input::Hf(d) => {
            let (kv, plan) = plan_hf(d, target)?;
            (kv, plan, "Hugging Face checkpoint")
        }
        Input::Gguf(f) => {
            let (kv, plan) = plan_gguf(f, target)?;
            (kv, plan, "GGUF")
        }
    };
    if let Some(name) = &opts.name {
        set_kv(&mut kv, "general.name", Value::String(name.clone()));
    }
    let mut plan = plan;
    if let Some(ty) = opts.lm_head {
        plan_lm_head(&mut plan, ty)?;
    }
    if let (Flavor::BitnetCpp, Input::Hf(d)) = (opts.flavor, &src) {
        bitnet_cpp_order(&mut plan, d);
    }

    // Validate the hyperparameters as the loader will.
    let n_vocab = plan
        .iter()
        .find(|p| p.name == TOKEN_EMBD)
        .and_then(|p| p.dims.get(1).copied());
    let md = Metadata::from_entries(kv.clone())?;
    let config = Config::from_metadata(&md, n_vocab)?;
    if opts.flavor == Flavor::LlamaCpp {
        kv = to_upstream(kv, &config, &md, opts.allow_activation_mismatch)?;
    }
    if let (Flavor::BitnetCpp, Input::Hf(d)) = (opts.flavor, &src) {
        kv = to_bitnet_cpp(kv, config.n_ctx_train, &d.dir, opts.name.is_some());
    }
    let arch = kv
        .iter()
        .find(|(k, _)| k == "general.architecture")
        .and_then(|(_, v)| v.as_str())
        .unwrap_or_default()
        .to_string();

    let mut gw = GgufWriter::new(out, 32)?;
    for (k, v) in &kv {
        gw.add_kv(k, v.clone())?;
    }
    let mut total = 0u64;
    for p in &plan {
        gw.add_tensor(&p.name, &p.dims, p.ty, p.size)?;
        total = total.saturating_add(p.size);
    }
    gw.write_header()?;
    let mut done = 0u64;
    let count = plan.len();
    for (index, p) in plan.iter().enumerate() {
        let bytes = produce(&src, p, target)?;
        if u64_of(bytes.len()) != p.size {
            return Err(ConvertError::Unsupported {
                name: p.name.clone(),
                what: format!("produced {} bytes, planned {}", bytes.len(), p.size),
            });
        }
        gw.write_tensor_data(&p.name, &bytes)?;
        done += p.size;
        let go_on = progress(&Progress {
            tensor: &p.name,
            index,
            count,
            bytes_done: done,
            bytes_total: total,
        });
        if !go_on {
            return Err(ConvertError::Cancelled);
        }
    }
    let w = gw.finish()?;
    Ok((
        w,
        Summary {
            source: source_name,
            target,
            arch,
            tensors: plan.len(),
            ternary_tensors: plan
                .iter()
                .filter(|p| {
                    matches!(
                        p.source,
                        Source::HfTernary { .. }
                            | Source::HfTernary1bit { .. }
                            | Source::HfTernaryEmbed { .. }
                            | Source::GgufTernary { .. }
                    )
                })
                .count(),
            data_bytes: total,
            activation: config.activation,
        },
    ))
}

fn open_input(input: &Path) -> Result<Input, ConvertError> {
    if hf::is_hf_dir(input) {
        return Ok(Input::Hf(Box::new(HfDir::open(input)?)));
    }
    if input.is_dir() {
        return Err(ConvertError::UnknownInput {
            path: input.to_path_buf(),
        });
    }
    if bitnet_qsf::is_qsf(input) {
        return Ok(Input::Gguf(Box::new(
            bitnet_qsf::QsfFile::open(input)?.to_gguf()?,
        )));
    }
    let f = GgufFile::open(input, &Limits::default()).map_err(|e| match e {
        bitnet_gguf::GgufError::Io(source) => ConvertError::Io {
            path: input.to_path_buf(),
            source,
        },
        other => ConvertError::Gguf(other),
    })?;
    Ok(Input::Gguf(Box::new(f)))
}

/// The layout of a GGUF's first ternary projection (I2_S when it has none we write).
fn layout_of(f: &GgufFile) -> Target {
    f.tensors()
        .iter()
        .find_map(|t| match t.ggml_type {
            GgmlType::TQ2_0 => Some(Target::Tq2_0),
            GgmlType::TQ1_0 => Some(Target::Tq1_0),
            GgmlType::I2S => Some(Target::I2S),
            _ => None,
        })
        .unwrap_or(Target::I2S)
}

/// Write `input` as QSF ([`bitnet_qsf`]): a GGUF or QSF input keeps its tensors unless
/// `opts` asks for a change; a Hugging Face checkpoint is converted first (in memory).
/// `importance` is asked for the layers' scores (`None`: not measured, NaN in the index).
pub fn convert_to_qsf<W: Write>(
    input: &Path,
    opts: &Options,
    compression: bitnet_qsf::Compression,
    importance: &mut dyn FnMut(&std::sync::Arc<GgufFile>) -> Option<Vec<f32>>,
    out: W,
    progress: &mut dyn FnMut(&Progress<'_>) -> bool,
) -> Result<W, ConvertError> {
    let plain = opts.to.is_none()
        && opts.flavor == Flavor::Native
        && opts.name.is_none()
        && opts.lm_head.is_none();
    let gguf = match open_input(input)? {
        Input::Gguf(f) if plain => *f,
        _ => {
            let (bytes, _) = convert(input, opts, Vec::new(), progress)?;
            GgufFile::from_bytes(bytes, &Limits::default())?
        }
    };
    let gguf = std::sync::Arc::new(gguf);
    let scores = importance(&gguf);
    let name = "layers";
    let out = bitnet_qsf::write_from_gguf(
        &gguf,
        compression,
        scores.as_deref(),
        out,
        &mut |done, total| {
            progress(&Progress {
                tensor: name,
                index: done,
                count: total,
                bytes_done: u64_of(done),
                bytes_total: u64_of(total),
            })
        },
    )
    .map_err(|e| match e {
        bitnet_qsf::QsfError::Cancelled => ConvertError::Cancelled,
        other => ConvertError::Qsf(other),
    })?;
    Ok(out)
}

fn set_kv(kv: &mut Vec<(String, Value)>, key: &str, v: Value) {
    match kv.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = v,
        None => kv.push((key.to_string(), v)),
    }
}

/// The bytes of one planned tensor.
fn produce(src: &Input, p: &Planned, target: Target) -> Result<Vec<u8>, ConvertError> {
    produce_from(src, &p.source, &p.name, target)
}

fn produce_from(
    src: &Input,
    source: &Source,
    name: &str,
    target: Target,
) -> Result<Vec<u8>, ConvertError> {
    use bitnet_kernels::{Pool, RowMatrix, RowType};
    if let Source::Head {
        from,
        ty,
        rows,
        cols,
    } = source
    {
        // The source head as rows: the file's own type, or f32 from a checkpoint.
        let (row_ty, bytes) = match (&**from, src) {
            (Source::Copy { name }, Input::Gguf(f)) => {
                let t = f
                    .tensor(name)
                    .ok_or_else(|| ConvertError::MissingTensor(name.clone()))?;
                let ty = bitnet_model::model::row_type_of(t.ggml_type).ok_or_else(|| {
                    ConvertError::Unsupported {
                        name: name.clone(),
                        what: format!("an LM head of type {}", t.ggml_type.name()),
                    }
                })?;
                (ty, std::borrow::Cow::Borrowed(f.tensor_data(t)?))
            }
            // From the F16 values the file stores, so the head equals one built at load.
            (Source::HfFloat { hf, .. }, Input::Hf(d)) => {
                let v = d.floats(hf, &[*rows, *cols])?;
                let b: Vec<u8> = v
                    .iter()
                    .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                    .collect();
                (RowType::F16, std::borrow::Cow::Owned(b))
            }
            _ => {
                return Err(ConvertError::Unsupported {
                    name: name.to_string(),
                    what: "LM head source".into(),
                })
            }
        };
        let head = RowMatrix::new(row_ty, *rows, *cols, bytes)?;
        let pool = Pool::new(std::thread::available_parallelism().map_or(1, |n| n.get()));
        let q = RowMatrix::quantize_from(&head, *ty, &pool)?;
        return Ok(q.data().to_vec());
    }
    match (source, src) {
        (Source::HfFloat { hf, to }, Input::Hf(d)) => {
            let t = d.require(hf)?;
            let v = d.floats(hf, &t.shape.clone())?;
            Ok(match to {
                GgmlType::F16 => v
                    .iter()
                    .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                    .collect(),
                _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            })
        }
        (
            Source::HfTernary {
                hf,
                n_out,
                n_in,
                permute,
            },
            Input::Hf(d),
        ) => {
            let mut t = hf_ternary(d, hf, *n_out, *n_in)?;
            if let Some(heads) = permute {
                t.permute_for_normal_rope(name, *n_in, *heads)?;
            }
            ternary::encode(name, &t, target)
        }
        (Source::HfTernary1bit { hf, n_out, n_in }, Input::Hf(d)) => {
            let t = d.require(hf)?;
            let w = d.floats(hf, &[*n_out, *n_in])?;
            let t = ternary::absmean_1bitllm(&w, t.dtype == Dtype::F16);
            ternary::encode(name, &t, target)
        }
        (Source::HfNormF16 { hf, plus_one }, Input::Hf(d)) => {
            let t = d.require(hf)?;
            let v = d.floats(hf, &t.shape.clone())?;
            Ok(v.iter()
                .flat_map(|&x| {
                    let x = if *plus_one { x + 1.0 } else { x };
                    half::f16::from_f32(x).to_le_bytes()
                })
                .collect())
        }
        (Source::HfTernaryEmbed { hf, n_out, n_in }, Input::Hf(d)) => {
            let w = d.floats(hf, &[*n_out, *n_in])?;
            ternary::encode(name, &ternary::absmean_embedding(&w), target)
        }
        (Source::Copy { name }, Input::Gguf(f)) => {
            let t = f
                .tensor(name)
                .ok_or_else(|| ConvertError::MissingTensor(name.clone()))?;
            let data = f.tensor_data(t)?;
            check_finite_floats(name, t.ggml_type, data)?;
            Ok(data.to_vec())
        }
        (Source::GgufTernary { name, n_out, n_in }, Input::Gguf(f)) => {
            let t = gguf_ternary(f, name, *n_out, *n_in)?;
            ternary::encode(name, &t, target)
        }
        _ => Err(ConvertError::Unsupported {
            name: name.to_string(),
            what: "source and plan disagree".into(),
        }),
    }
}

/// A copied F32, F16 or BF16 tensor holds no NaN or infinity, nor a Q8_0, Q4_0 or Q6_K one a
/// NaN or infinite block scale (other types pass as they are).
fn check_finite_floats(name: &str, ty: GgmlType, data: &[u8]) -> Result<(), ConvertError> {
    let bad = bitnet_model::model::row_type_of(ty)
        .and_then(|rt| bitnet_kernels::rows::first_non_finite_value(rt, data));
    match bad {
        Some(index) => Err(ConvertError::NonFinite {
            name: name.to_string(),
            index,
        }),
        None => Ok(()),
    }
}

/// A projection of a Hugging Face checkpoint as ternary values.
fn hf_ternary(d: &HfDir, hf: &str, n_out: usize, n_in: usize) -> Result<Ternary, ConvertError> {
    let t = d.require(hf)?;
    if t.dtype == Dtype::U8 {
        hf::check_shape(hf, &t.shape, &[n_out / 4, n_in])?;
        let stem = hf.strip_suffix(".weight").unwrap_or(hf);
        let scale_name = format!("{stem}.weight_scale");
        let s = d.require(&scale_name)?;
        let n: usize = s.shape.iter().product();
        if n != 1 {
            return Err(ConvertError::Shape {
                name: scale_name,
                expected: vec![1],
                found: s.shape.clone(),
            });
        }
        let ws = d.floats(&scale_name, &s.shape.clone())?;
        ternary::unpack_hf(hf, d.data(hf)?, n_out, n_in, ws[0])
    } else {
        let w = d.floats(hf, &[n_out, n_in])?;
        Ok(ternary::absmean(&w))
    }
}

/// A ternary tensor of a GGUF file (I2_S, TQ2_0, TQ1_0) as values.
fn gguf_ternary(
    f: &GgufFile,
    name: &str,
    n_out: usize,
    n_in: usize,
) -> Result<Ternary, ConvertError> {
    use bitnet_kernels::{TernaryLayout, TernaryMatrix};
    let t = f
        .tensor(name)
        .ok_or_else(|| ConvertError::MissingTensor(name.to_string()))?;
    let n = n_out
        .checked_mul(n_in)
        .ok_or_else(|| ConvertError::Unsupported {
            name: name.to_string(),
            what: "element count overflows".into(),
        })?;
    match t.ggml_type {
        GgmlType::I2S => {
            let align = usize::try_from(f.alignment()).unwrap_or(32);
            let m =
                TernaryMatrix::detect_type36(name, n_out, n_in, f.tensor_bytes(t)?, align, None)?;
            if m.layout() != TernaryLayout::I2S {
                return Err(ConvertError::Unsupported {
                    name: name.to_string(),
                    what: format!(
                        "type-36 flavor {:?}: the converter reads bitnet.cpp's I2_S, TQ2_0 and TQ1_0",
                        m.layout()
                    ),
                });
            }
            let exact = TernaryLayout::I2S.tensor_bytes(n_out, n_in)?;
            let bytes = f.tensor_bytes(t)?;
            let data = bytes
                .get(..exact)
                .ok_or_else(|| ConvertError::Unsupported {
                    name: name.to_string(),
                    what: "I2_S tensor shorter than its size".into(),
                })?;
            ternary::decode(name, TernaryLayout::I2S, data, n)
        }
        GgmlType::TQ2_0 | GgmlType::TQ1_0 => {
            let layout = if t.ggml_type == GgmlType::TQ2_0 {
                TernaryLayout::Tq2_0
            } else {
                TernaryLayout::Tq1_0
            };
            layout.check_k(n_in)?;
            ternary::decode(name, layout, f.tensor_data(t)?, n)
        }
        other => Err(ConvertError::Unsupported {
            name: name.to_string(),
            what: format!("type {}: not a ternary layout", other.name()),
        }),
    }
}

/// Make `output.weight` a `ty` copy of the head: of `output.weight` when the plan has one,
/// else of the tied embedding (added after the other tensors).
fn plan_lm_head(plan: &mut Vec<Planned>, ty: bitnet_kernels::RowType) -> Result<(), ConvertError> {
    let from = plan
        .iter()
        .position(|p| p.name == OUTPUT)
        .or_else(|| plan.iter().position(|p| p.name == TOKEN_EMBD))
        .ok_or_else(|| ConvertError::MissingTensor(TOKEN_EMBD.into()))?;
    let src = plan[from].clone();
    let (cols, rows) = match src.dims.as_slice() {
        [c, r] => (usize_of(&src.name, *c)?, usize_of(&src.name, *r)?),
        _ => {
            return Err(ConvertError::Unsupported {
                name: src.name.clone(),
                what: format!("dims {:?}", src.dims),
            })
        }
    };
    let row_bytes = ty.row_bytes(cols)?;
    let entry = Planned {
        name: OUTPUT.into(),
        dims: src.dims.clone(),
        ty: match ty {
            bitnet_kernels::RowType::Q8_0 => GgmlType::Q8_0.id(),
            bitnet_kernels::RowType::Q6K => GgmlType::Q6K.id(),
            bitnet_kernels::RowType::Q4_0 => GgmlType::Q4_0.id(),
            other => {
                return Err(ConvertError::Options(format!(
                    "--lm-head takes q8_0, q6_k or q4_0, not {other:?}"
                )))
            }
        },
        size: bytes_of(OUTPUT, rows, row_bytes, 1)?,
        source: Source::Head {
            from: Box::new(src.source.clone()),
            ty,
            rows,
            cols,
        },
    };
    if src.name == OUTPUT {
        plan[from] = entry;
    } else {
        plan.push(entry);
    }
    Ok(())
}

/// An F16 `[rows × cols]` entry converted from a checkpoint tensor (an embedding or a head).
fn f16_rows(name: &str, hf: &str, rows: usize, cols: usize) -> Result<Planned, ConvertError> {
    Ok(Planned {
        name: name.into(),
        dims: vec![u64_of(cols), u64_of(rows)],
        ty: GgmlType::F16.id(),
        size: bytes_of(name, rows, cols, 2)?,
        source: Source::HfFloat {
            hf: hf.into(),
            to: GgmlType::F16,
        },
    })
}

/// The F32 output norm of `n` weights, converted from the checkpoint's `model.norm.weight`,
/// its shape checked.
fn output_norm(d: &HfDir, n: usize) -> Result<Planned, ConvertError> {
    let norm_hf = "model.norm.weight";
    hf::check_shape(norm_hf, &d.require(norm_hf)?.shape, &[n])?;
    Ok(Planned {
        name: OUTPUT_NORM.into(),
        dims: vec![u64_of(n)],
        ty: GgmlType::F32.id(),
        size: bytes_of(OUTPUT_NORM, n, 1, 4)?,
        source: Source::HfFloat {
            hf: norm_hf.into(),
            to: GgmlType::F32,
        },
    })
}

/// A ternary output tensor's entry.
fn ternary_entry(
    name: String,
    n_out: usize,
    n_in: usize,
    target: Target,
    source: Source,
) -> Result<Planned, ConvertError> {
    let size = target.layout().tensor_bytes(n_out, n_in)?;
    Ok(Planned {
        name,
        dims: vec![u64_of(n_in), u64_of(n_out)],
        ty: target.type_id(),
        size: u64_of(size),
        source,
    })
}

/// A layer's tensors in the official file's order.
const FILE_ORDER: [LayerTensor; 11] = [
    LayerTensor::AttnNorm,
    LayerTensor::AttnQ,
    LayerTensor::AttnK,
    LayerTensor::AttnV,
    LayerTensor::AttnOutput,
    LayerTensor::AttnSubNorm,
    LayerTensor::FfnNorm,
    LayerTensor::FfnGate,
    LayerTensor::FfnUp,
    LayerTensor::FfnDown,
    LayerTensor::FfnSubNorm,
];

/// Hugging Face name of a layer tensor (`BitNetForCausalLM`).
fn hf_layer_name(role: LayerTensor, il: usize) -> String {
    let stem = match role {
        LayerTensor::AttnNorm => "input_layernorm",
        LayerTensor::AttnQ => "self_attn.q_proj",
        LayerTensor::AttnK => "self_attn.k_proj",
        LayerTensor::AttnV => "self_attn.v_proj",
        LayerTensor::AttnOutput => "self_attn.o_proj",
        LayerTensor::AttnSubNorm => "self_attn.attn_sub_norm",
        LayerTensor::FfnNorm => "post_attention_layernorm",
        LayerTensor::FfnGate => "mlp.gate_proj",
        LayerTensor::FfnUp => "mlp.up_proj",
        LayerTensor::FfnDown => "mlp.down_proj",
        LayerTensor::FfnSubNorm => "mlp.ffn_sub_norm",
    };
    format!("model.layers.{il}.{stem}.weight")
}

fn cfg_err(key: &str, why: impl Into<String>) -> ConvertError {
    ConvertError::Config {
        key: key.to_string(),
        why: why.into(),
    }
}

fn cfg_usize(key: &str, v: u64) -> Result<usize, ConvertError> {
    let n = usize::try_from(v).map_err(|_| cfg_err(key, format!("{v} is too large")))?;
    if n == 0 {
        return Err(cfg_err(key, "must be at least 1"));
    }
    Ok(n)
}

/// A config float as the f32 GGUF stores, finite and above zero after the narrowing.
fn positive_f32(key: &str, v: f64) -> Result<f32, ConvertError> {
    // f64 → f32 has no checked conversion; the result is checked instead.
    #[allow(clippy::cast_possible_truncation)]
    let x = v as f32;
    if !(x.is_finite() && x > 0.0) {
        return Err(cfg_err(
            key,
            format!("{v} must be finite and > 0 as an f32"),
        ));
    }
    Ok(x)
}

fn cfg_u32(key: &str, v: usize) -> Result<Value, ConvertError> {
    u32::try_from(v)
        .map(Value::U32)
        .map_err(|_| cfg_err(key, format!("{v} does not fit in 32 bits")))
}

/// The dimensions of a Hugging Face `config.json`, checked against the supported maxima.
#[derive(Clone, Copy)]
struct HfDims {
    n_embd: usize,
    n_ff: usize,
    n_layer: usize,
    n_head: usize,
    n_head_kv: usize,
    n_ctx: usize,
    n_vocab: usize,
    head_dim: usize,
}

fn hf_dims(c: &hf::HfConfig) -> Result<HfDims, ConvertError> {
    let n_embd = cfg_usize("hidden_size", c.hidden_size)?;
    let n_ff = cfg_usize("intermediate_size", c.intermediate_size)?;
    let n_layer = cfg_usize("num_hidden_layers", c.num_hidden_layers)?;
    let n_head = cfg_usize("num_attention_heads", c.num_attention_heads)?;
    let n_head_kv = cfg_usize(
        "num_key_value_heads",
        c.num_key_value_heads.unwrap_or(c.num_attention_heads),
    )?;
    let n_ctx = cfg_usize("max_position_embeddings", c.max_position_embeddings)?;
    let n_vocab = cfg_usize("vocab_size", c.vocab_size)?;
    if n_layer > bitnet_model::config::MAX_LAYERS
        || n_embd > bitnet_model::config::MAX_EMBD
        || n_ff > bitnet_model::config::MAX_FF
        || n_head > bitnet_model::config::MAX_HEADS
        || n_vocab > bitnet_model::config::MAX_VOCAB
        || n_ctx > bitnet_model::config::MAX_CTX
    {
        return Err(cfg_err(
            "config",
            "a dimension exceeds the supported maximum",
        ));
    }
    if n_embd % n_head != 0 || n_head % n_head_kv != 0 {
        return Err(cfg_err(
            "num_attention_heads",
            "hidden_size must be a multiple of the heads, and the heads of the KV heads",
        ));
    }
    Ok(HfDims {
        n_embd,
        n_ff,
        n_layer,
        n_head,
        n_head_kv,
        n_ctx,
        n_vocab,
        head_dim: n_embd / n_head,
    })
}

/// The checkpoint families [`plan_blocks`] reads.
#[derive(Clone, Copy, PartialEq)]
enum HfFamily {
    /// `BitNetForCausalLM` (2B-4T): packed or bf16 projections, sub-norms.
    B158,
    /// A ternary `LlamaForCausalLM`: no sub-norms, Q and K rows permuted.
    Llama,
    /// 1bitLLM's `BitnetForCausalLM`: float master weights, its own sub-norm names.
    OneBit,
}

/// The block tensors of a Hugging Face checkpoint, in the official file's order.
fn plan_blocks(
    d: &HfDir,
    dims: &HfDims,
    family: HfFamily,
    target: Target,
    plan: &mut Vec<Planned>,
) -> Result<(), ConvertError> {
    let HfDims {
        n_embd,
        n_ff,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        ..
    } = *dims;
    let n_kv = n_head_kv * head_dim;
    let llama = family == HfFamily::Llama;
    for il in 0..n_layer {
        // llama's blocks have no sub-norms.
        let roles = FILE_ORDER.iter().copied().filter(|r| {
            !(llama && matches!(r, LayerTensor::AttnSubNorm | LayerTensor::FfnSubNorm))
        });
        for role in roles {
            let hf = match (family, role) {
                (HfFamily::OneBit, LayerTensor::AttnSubNorm) => {
                    format!("model.layers.{il}.self_attn.inner_attn_ln.weight")
                }
                (HfFamily::OneBit, LayerTensor::FfnSubNorm) => {
                    format!("model.layers.{il}.mlp.ffn_layernorm.weight")
                }
                _ => hf_layer_name(role, il),
            };
            let name = role.name(il);
            let (n_in, n_out) = match role {
                LayerTensor::AttnQ | LayerTensor::AttnOutput => (n_embd, n_embd),
                LayerTensor::AttnK | LayerTensor::AttnV => (n_embd, n_kv),
                LayerTensor::FfnGate | LayerTensor::FfnUp => (n_embd, n_ff),
                LayerTensor::FfnDown => (n_ff, n_embd),
                LayerTensor::FfnSubNorm => (n_ff, 1),
                _ => (n_embd, 1),
            };
            if role.is_projection() {
                target.layout().check_k(n_in)?;
                let t = d.require(&hf)?;
                let source = if family == HfFamily::OneBit {
                    if t.dtype == Dtype::U8 {
                        return Err(cfg_err(
                            "architectures",
                            "1bitLLM checkpoints hold float master weights, not packed ones",
                        ));
                    }
                    Source::HfTernary1bit { hf, n_out, n_in }
                } else {
                    if n_out % 4 != 0 && t.dtype == Dtype::U8 {
                        return Err(ConvertError::Shape {
                            name: hf.clone(),
                            expected: vec![n_out, n_in],
                            found: t.shape.clone(),
                        });
                    }
                    // bitnet.cpp's converter permutes Q's rows by the query heads and K's by
                    // the KV heads, so that llama.cpp's normal RoPE pairs the dimensions the
                    // checkpoint's NEOX-style rotation paired.
                    let permute = match role {
                        LayerTensor::AttnQ if llama => Some(n_head),
                        LayerTensor::AttnK if llama => Some(n_head_kv),
                        _ => None,
                    };
                    Source::HfTernary {
                        hf,
                        n_out,
                        n_in,
                        permute,
                    }
                };
                plan.push(ternary_entry(name, n_out, n_in, target, source)?);
            } else {
                hf::check_shape(&hf, &d.require(&hf)?.shape, &[n_in])?;
                plan.push(Planned {
                    name,
                    dims: vec![u64_of(n_in)],
                    ty: GgmlType::F32.id(),
                    size: u64_of(n_in * 4),
                    source: Source::HfFloat {
                        hf,
                        to: GgmlType::F32,
                    },
                });
            }
        }
    }
    Ok(())
}

/// Metadata and tensor plan for a Hugging Face checkpoint: `BitNetForCausalLM` (2B-4T,
/// architecture `bitnet-b1.58`) or a ternary `LlamaForCausalLM` (Llama3-8B-1.58, Falcon3:
/// architecture `llama` as bitnet.cpp's converter writes it: no sub-norms, Q and K rows
/// permuted for normal RoPE).
fn plan_hf(d: &HfDir, target: Target) -> Result<PlanOut, ConvertError> {
    if embedding::is_embedding(&d.raw_config) {
        return embedding::plan(d, target);
    }
    let c = &d.config;
    // 1bitLLM's `BitnetForCausalLM` (lower-case n, bitnet_b1_58-large and -3B) is another
    // model than 2B-4T's `BitNetForCausalLM`: bitnet.cpp converts it as architecture `bitnet`.
    let (llama, onebit) = match c.architectures.first().map(String::as_str) {
        None | Some("BitNetForCausalLM") => (false, false),
        Some("BitnetForCausalLM") => (false, true),
        Some("LlamaForCausalLM") => (true, false),
        Some(a) => {
            return Err(cfg_err(
                "architectures",
                format!(
                    "{a:?}: the converter reads BitNetForCausalLM, 1bitLLM's BitnetForCausalLM \
                     and ternary LlamaForCausalLM checkpoints"
                ),
            ))
        }
    };
    if onebit {
        return plan_1bitllm(d, target);
    }
    let arch = if llama { ARCH_LLAMA } else { ARCH_B158 };
    if c.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(cfg_err("rope_scaling", "RoPE scaling is not supported"));
    }
    let dims = hf_dims(c)?;
    let HfDims {
        n_embd,
        n_ff,
        n_layer,
        n_head,
        n_head_kv,
        n_ctx,
        n_vocab,
        head_dim,
    } = dims;
    if let Some(h) = c.head_dim {
        if u64_of(head_dim) != h {
            return Err(cfg_err(
                "head_dim",
                format!("{h}, but hidden_size / heads is {head_dim}"),
            ));
        }
    }
    let activation = match c
        .hidden_act
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None if llama => Activation::Silu,
        None | Some("relu2" | "relu_squared" | "squared_relu") => Activation::Relu2,
        Some("silu" | "swish") => Activation::Silu,
        Some(other) => return Err(cfg_err("hidden_act", format!("{other:?} is not supported"))),
    };
    if llama && activation != Activation::Silu {
        return Err(cfg_err(
            "hidden_act",
            "a LlamaForCausalLM checkpoint's FFN is SiLU-gated",
        ));
    }
    let eps = positive_f32("rms_norm_eps", c.rms_norm_eps)?;
    let theta = positive_f32("rope_theta", c.rope_theta.unwrap_or(10_000.0))?;
    let k = |s: &str| format!("{arch}.{s}");
    let name = c
        .name_or_path
        .clone()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            d.dir
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "bitnet".into());
    let mut tok = tokjson::tokenizer_kv(&d.dir, c, n_vocab)?;
    if llama {
        // bitnet.cpp's converter writes no scores for a BPE vocabulary of a Llama checkpoint.
        tok.retain(|(key, _)| key != "tokenizer.ggml.scores");
    }
    let tok_get = |key: &str| tok.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());

    // Key order of the official 2B-4T file.
    let mut kv: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.name".into(), Value::String(name)),
        (k("vocab_size"), cfg_u32("vocab_size", n_vocab)?),
        (
            k("context_length"),
            cfg_u32("max_position_embeddings", n_ctx)?,
        ),
        (k("embedding_length"), cfg_u32("hidden_size", n_embd)?),
        (k("block_count"), cfg_u32("num_hidden_layers", n_layer)?),
        (
            k("feed_forward_length"),
            cfg_u32("intermediate_size", n_ff)?,
        ),
        (k("rope.dimension_count"), cfg_u32("head_dim", head_dim)?),
        (
            k("attention.head_count"),
            cfg_u32("num_attention_heads", n_head)?,
        ),
        (
            k("attention.head_count_kv"),
            cfg_u32("num_key_value_heads", n_head_kv)?,
        ),
        (
            "tokenizer.ggml.add_bos_token".into(),
            tok_get("tokenizer.ggml.add_bos_token").unwrap_or(Value::Bool(true)),
        ),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(eps)),
        (k("rope.freq_base"), Value::F32(theta)),
        ("general.file_type".into(), Value::U32(target.file_type())),
    ];
    if activation == Activation::Silu && !llama {
        // The 2B-4T default (ReLU²) needs no key; bitnet-rs honours this one.
        kv.push((k("hidden_act"), Value::String("silu".into())));
    }
    kv.extend(
        tok.into_iter()
            .filter(|(k, _)| k != "tokenizer.ggml.add_bos_token"),
    );
    kv.push(("general.quantization_version".into(), Value::U32(2)));

    // Tensors, in the official file's order.
    let embd_hf = "model.embed_tokens.weight";
    let e = d.require(embd_hf)?;
    hf::check_shape(embd_hf, &e.shape, &[n_vocab, n_embd])?;
    let mut plan = vec![f16_rows(TOKEN_EMBD, embd_hf, n_vocab, n_embd)?];
    let family = if llama {
        HfFamily::Llama
    } else {
        HfFamily::B158
    };
    plan_blocks(d, &dims, family, target, &mut plan)?;
    plan.push(output_norm(d, n_embd)?);
    // An untied head of its own (tie_word_embeddings false; Llama's default).
    if !c.tie_word_embeddings.unwrap_or(!llama) {
        let head = "lm_head.weight";
        hf::check_shape(head, &d.require(head)?.shape, &[n_vocab, n_embd])?;
        plan.push(f16_rows(OUTPUT, head, n_vocab, n_embd)?);
    }
    Ok((kv, plan))
}

/// Metadata and tensor plan for 1bitLLM's `BitnetForCausalLM` (bitnet_b1_58-large, -3B):
/// architecture `bitnet` with the keys bitnet.cpp's converter writes for it (no RoPE dimension
/// count; a linear RoPE scaling of factor 1; the SentencePiece vocabulary of
/// [`spm::tokenizer_kv`]), the sub-norms `inner_attn_ln` and `ffn_layernorm`, a tied head and
/// float master weights ternarized by the converter's rule ([`ternary::absmean_1bitllm`]).
fn plan_1bitllm(d: &HfDir, target: Target) -> Result<PlanOut, ConvertError> {
    let c = &d.config;
    if c.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(cfg_err("rope_scaling", "RoPE scaling is not supported"));
    }
    if c.tie_word_embeddings == Some(false) {
        return Err(cfg_err(
            "tie_word_embeddings",
            "false: bitnet.cpp's `bitnet` architecture has no output tensor of its own",
        ));
    }
    let dims = hf_dims(c)?;
    let HfDims {
        n_embd,
        n_ff,
        n_layer,
        n_head,
        n_head_kv,
        n_ctx,
        n_vocab,
        ..
    } = dims;
    match c
        .hidden_act
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("silu" | "swish") => {}
        Some(other) => {
            return Err(cfg_err(
                "hidden_act",
                format!("{other:?}: bitnet.cpp's `bitnet` graph gates its FFN with SiLU"),
            ))
        }
    }
    let eps = positive_f32("rms_norm_eps", c.rms_norm_eps)?;
    let k = |s: &str| format!("{ARCH_UPSTREAM}.{s}");
    // bitnet.cpp's converter names the model after its folder.
    let name = d
        .dir
        .file_name()
        .and_then(|n| n.to_str())
        .map_or_else(|| "bitnet".to_string(), str::to_string);
    let mut kv: Vec<(String, Value)> = vec![
        (
            "general.architecture".into(),
            Value::String(ARCH_UPSTREAM.into()),
        ),
        ("general.name".into(), Value::String(name)),
        (k("block_count"), cfg_u32("num_hidden_layers", n_layer)?),
        (
            k("context_length"),
            cfg_u32("max_position_embeddings", n_ctx)?,
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
    ];
    if c.num_key_value_heads.is_some() {
        kv.push((
            k("attention.head_count_kv"),
            cfg_u32("num_key_value_heads", n_head_kv)?,
        ));
    }
    if let Some(theta) = c.rope_theta {
        kv.push((
            k("rope.freq_base"),
            Value::F32(positive_f32("rope_theta", theta)?),
        ));
    }
    kv.extend([
        (k("attention.layer_norm_rms_epsilon"), Value::F32(eps)),
        ("general.file_type".into(), Value::U32(target.file_type())),
        (k("vocab_size"), cfg_u32("vocab_size", n_vocab)?),
        (k("rope.scaling.type"), Value::String("linear".into())),
        (k("rope.scaling.factor"), Value::F32(1.0)),
    ]);
    kv.extend(spm::tokenizer_kv(&d.dir, &d.raw_config, n_vocab)?);
    kv.push(("general.quantization_version".into(), Value::U32(2)));

    let embd_hf = "model.embed_tokens.weight";
    hf::check_shape(embd_hf, &d.require(embd_hf)?.shape, &[n_vocab, n_embd])?;
    let mut plan = vec![f16_rows(TOKEN_EMBD, embd_hf, n_vocab, n_embd)?];
    plan_blocks(d, &dims, HfFamily::OneBit, target, &mut plan)?;
    plan.push(output_norm(d, n_embd)?);
    Ok((kv, plan))
}

/// Metadata and tensor plan for a GGUF input: every tensor is kept in place, projections are
/// re-encoded, `general.file_type` follows the target.
fn plan_gguf(f: &GgufFile, target: Target) -> Result<PlanOut, ConvertError> {
    let mut kv: Vec<(String, Value)> = f
        .metadata()
        .iter()
        .filter(|(k, _)| *k != bitnet_gguf::KEY_ALIGNMENT)
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    set_kv(&mut kv, "general.file_type", Value::U32(target.file_type()));
    let projection = |name: &str| {
        name.strip_prefix("blk.").is_some_and(|rest| {
            LayerTensor::ALL
                .iter()
                .filter(|r| r.is_projection())
                .any(|r| rest.ends_with(&format!(".{}.weight", r.stem())))
        })
    };
    let mut plan = Vec::with_capacity(f.tensors().len());
    for t in f.tensors() {
        if projection(&t.name) && t.dims.len() == 2 {
            let n_in = usize_of(&t.name, t.dims[0])?;
            let n_out = usize_of(&t.name, t.dims[1])?;
            target.layout().check_k(n_in)?;
            plan.push(ternary_entry(
                t.name.clone(),
                n_out,
                n_in,
                target,
                Source::GgufTernary {
                    name: t.name.clone(),
                    n_out,
                    n_in,
                },
            )?);
        } else {
            let size = u64_of(f.tensor_data(t)?.len());
            plan.push(Planned {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty: t.ggml_type.id(),
                size,
                source: Source::Copy {
                    name: t.name.clone(),
                },
            });
        }
    }
    Ok((kv, plan))
}

/// The tensor order of [`Flavor::BitnetCpp`]: bitnet.cpp's converter writes the tensors in the
/// order of the checkpoint its preprocessing step saves with safetensors, which sorts by dtype
/// (widest first) and then by name: the projections, ternarized to F32, before the other
/// tensors in their stored dtype.
fn bitnet_cpp_order(plan: &mut [Planned], d: &HfDir) {
    plan.sort_by_cached_key(|p| match &p.source {
        Source::HfFloat { hf, .. } => (
            std::cmp::Reverse(d.get(hf).map_or(Dtype::F32, |t| t.dtype)),
            hf.clone(),
        ),
        Source::HfTernary { hf, .. } | Source::HfTernary1bit { hf, .. } => {
            (std::cmp::Reverse(Dtype::F32), hf.clone())
        }
        _ => (std::cmp::Reverse(Dtype::F32), p.name.clone()),
    });
}

/// bitnet.cpp's converter's chat template, which it writes into every `bitnet` file.
const BITNET_CPP_TEMPLATE: &str = "{% for message in messages %}{% if loop.first %}{{ bos_token }}{% endif %}{% if message['role'] == 'user' %}{{ 'Human: ' + message['content'] + '\\n\\nBITNETAssistant: ' + eos_token }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}";

/// The metadata of [`Flavor::BitnetCpp`] from the official file's (same keys, same order):
/// architecture `bitnet-25`; `general.name` as that converter names it (`bitnet2b_2501` for a
/// context of 4096, else the name of the folder holding the checkpoint's folder), unless the
/// caller named it; its chat template in place of the checkpoint's; no `tokenizer.ggml.pre`
/// (it writes none); every added token (types 3 and 4) a control token with score −1000.
fn to_bitnet_cpp(
    kv: Vec<(String, Value)>,
    n_ctx: usize,
    dir: &Path,
    named: bool,
) -> Vec<(String, Value)> {
    let old = format!("{ARCH_B158}.");
    let mut out: Vec<(String, Value)> = Vec::with_capacity(kv.len() + 1);
    let mut added: Vec<bool> = Vec::new();
    for (k, v) in kv {
        let k = match k.strip_prefix(&old) {
            Some(rest) => format!("{ARCH_BITNET_CPP}.{rest}"),
            None => k,
        };
        let v = match (k.as_str(), v) {
            ("general.architecture", _) => Value::String(ARCH_BITNET_CPP.into()),
            ("general.name", v) if named => v,
            ("general.name", _) => Value::String(if n_ctx == 4096 {
                "bitnet2b_2501".into()
            } else {
                std::fs::canonicalize(dir)
                    .ok()
                    .as_deref()
                    .and_then(Path::parent)
                    .and_then(Path::file_name)
                    .and_then(|n| n.to_str())
                    .unwrap_or("bitnet")
                    .to_string()
            }),
            ("tokenizer.ggml.token_type", Value::Array(Array::I32(types))) => {
                added = types.iter().map(|&t| t == 3 || t == 4).collect();
                Value::Array(Array::I32(
                    types.iter().map(|&t| if t == 4 { 3 } else { t }).collect(),
                ))
            }
            (_, v) => v,
        };
        if k == "tokenizer.ggml.pre" || k == "tokenizer.chat_template" {
            continue;
        }
        out.push((k, v));
    }
    // Scores come before types in the file: set them once the types are known.
    for (k, v) in &mut out {
        if let ("tokenizer.ggml.scores", Value::Array(Array::F32(scores))) = (k.as_str(), v) {
            for (s, &a) in scores.iter_mut().zip(&added) {
                if a {
                    *s = -1000.0;
                }
            }
        }
    }
    let template = (
        "tokenizer.chat_template".to_string(),
        Value::String(BITNET_CPP_TEMPLATE.into()),
    );
    match out
        .iter()
        .position(|(k, _)| k == "general.quantization_version")
    {
        Some(i) => out.insert(i, template),
        None => out.push(template),
    }
    out
}

/// Rename the architecture to upstream llama.cpp's `bitnet`, refusing (unless allowed) when
/// its graph would apply another FFN activation than the model's. A `llama` file keeps its
/// architecture: upstream's `llama` graph is the same block (SiLU, no sub-norms, normal RoPE).
/// Both get `tokenizer.ggml.pre = llama-bpe` for a LLaMA-3 vocabulary without a name.
fn to_upstream(
    kv: Vec<(String, Value)>,
    config: &Config,
    md: &Metadata,
    allow_mismatch: bool,
) -> Result<Vec<(String, Value)>, ConvertError> {
    // Upstream's `bitnet` graph (src/models/bitnet.cpp) builds its FFN with LLM_FFN_SILU.
    if config.activation != Activation::Silu && !allow_mismatch {
        return Err(ConvertError::ActivationMismatch {
            model: "ReLU²",
            upstream: "SiLU",
        });
    }
    let old = format!("{}.", config.arch);
    let mut out: Vec<(String, Value)> = if config.arch == ARCH_LLAMA {
        kv
    } else {
        rename_to_upstream(kv, config, &old)
    };
    // Upstream warns and falls back to a generic split without a pre-tokenizer name.
    if md.get("tokenizer.ggml.pre").is_none() {
        let tok = bitnet_tokenizer::Tokenizer::from_gguf(md, None)?;
        if tok.is_llama3_vocab() {
            out.push((
                "tokenizer.ggml.pre".into(),
                Value::String("llama-bpe".into()),
            ));
        }
    }
    Ok(out)
}

/// The `bitnet*` keys as upstream's `bitnet` architecture's (the activation key rewritten).
fn rename_to_upstream(
    kv: Vec<(String, Value)>,
    config: &Config,
    old: &str,
) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = kv
        .into_iter()
        .filter(|(k, _)| {
            // The old activation key is replaced below.
            !(k.starts_with(old)
                && (k.ends_with(".hidden_act") || k.ends_with(".feed_forward_activation")))
        })
        .map(|(k, v)| match k.strip_prefix(old) {
            Some(rest) => (format!("{ARCH_UPSTREAM}.{rest}"), v),
            None if k == "general.architecture" => (k, Value::String(ARCH_UPSTREAM.into())),
            None => (k, v),
        })
        .collect();
    if config.activation == Activation::Relu2 {
        // Upstream ignores this key; bitnet-rs reads it and keeps computing ReLU².
        out.push((
            format!("{ARCH_UPSTREAM}.hidden_act"),
            Value::String("relu2".into()),
        ));
    }
    out
}
