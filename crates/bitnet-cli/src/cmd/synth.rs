//! `bitnet synth`: write a seeded synthetic BitNet model.

use std::io::BufWriter;
use std::path::PathBuf;

use anyhow::Result;
use bitnet_testkit::{synth, Preset, SynthArch, SynthSpec, WeightLayout};

use super::common::{bytes_bar, human_bytes, open_gguf};
use crate::output::{AtomicDir, AtomicFile};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output file (a directory with --hf).
    #[arg(short, long)]
    out: PathBuf,
    /// Write a Hugging Face model directory instead of a GGUF (for `bitnet convert`): bf16
    /// master weights, or the packed release's U8 weights with a weight_scale
    /// (BitNetForCausalLM, or LlamaForCausalLM with --arch llama); f16 with --arch bitnet:
    /// 1bitLLM's BitnetForCausalLM (f16 master weights, SentencePiece tokenizer.model).
    #[arg(long, value_parser = ["bf16", "packed", "f16"])]
    hf: Option<String>,
    /// Architecture: bitnet-b1.58 (2B-4T's graph), llama (ternary Llama/Falcon3 as bitnet.cpp
    /// converts them: SiLU, no sub-norms, normal RoPE, untied LM head) or bitnet (1bitLLM's
    /// bitnet_b1_58: SiLU, sub-norms, NEOX RoPE, tied head), qwen3 or gemma3 (bitnet.cpp's
    /// embedding models: an input norm per projection, per-head Q/K norms, last-token pooling).
    /// (Default: llama for the 8b and falcon3-* presets, qwen3 for embed-0.6b, gemma3 for
    /// embed-270m, else bitnet-b1.58.)
    #[arg(long)]
    arch: Option<SynthArch>,
    /// FFN activation of bitnet-b1.58: relu2 (2B-4T) or silu (written as `<arch>.hidden_act`).
    /// (llama: silu only). Default relu2 for bitnet-b1.58.
    #[arg(long, value_parser = ["relu2", "silu"])]
    activation: Option<String>,
    /// Shape preset: tiny, small, 2b (the full 2B-4T shapes), 8b (Llama3-8B-1.58's shapes),
    /// falcon3-1b or falcon3-7b (Falcon3-*-1.58bit's shapes, RoPE base, ε and pre-tokenizer),
    /// embed-0.6b or embed-270m (bitnet-embedding-0.6b's and -270m's shapes).
    #[arg(long, default_value = "tiny")]
    preset: Preset,
    /// Name this pre-tokenizer (`tokenizer.ggml.pre`, e.g. falcon3 or llama-bpe) in the file.
    #[arg(long)]
    pre: Option<String>,
    /// Take the tokenizer metadata from this GGUF (e.g. a vocab-only LLaMA-3 file).
    /// Default: the tiny golden model's 4256-token vocabulary, built in.
    #[arg(long)]
    vocab: Option<PathBuf>,
    /// Ternary weight layout: i2_s, tq2_0, tq1_0, bitnet32f16, split32, qk256, or f32 (plain
    /// F32 values, the input of bitnet.cpp's llama-quantize; not runnable here).
    #[arg(long, default_value = "i2_s")]
    layout: WeightLayout,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Override the preset's shapes.
    #[arg(long)]
    n_embd: Option<usize>,
    #[arg(long)]
    n_layer: Option<usize>,
    #[arg(long)]
    n_ff: Option<usize>,
    #[arg(long)]
    n_head: Option<usize>,
    #[arg(long)]
    n_head_kv: Option<usize>,
    #[arg(long)]
    n_ctx: Option<usize>,
    /// Elements per attention head, when not n_embd / n_head (qwen3, gemma3: written as
    /// `key_length` and `value_length`).
    #[arg(long)]
    head_dim: Option<usize>,
    /// Hide the progress bar.
    #[arg(long)]
    quiet: bool,
}

pub fn run(a: Args) -> Result<()> {
    let mut spec = SynthSpec::preset(a.preset);
    spec.layout = a.layout;
    spec.seed = a.seed;
    spec.silu = a.activation.as_deref() == Some("silu");
    if let Some(arch) = a.arch {
        spec.arch = arch;
    }
    if a.pre.is_some() {
        spec.pre = a.pre.clone();
    }
    if a.head_dim.is_some() {
        spec.head_dim = a.head_dim;
    }
    if a.arch == Some(SynthArch::Qwen3) && a.pre.is_none() && spec.pre.is_none() {
        spec.pre = Some("qwen2".into());
    }
    if spec.arch != SynthArch::BitnetB158 && a.activation.as_deref() == Some("relu2") {
        anyhow::bail!(
            "this architecture's FFN is SiLU-gated: --activation relu2 is for bitnet-b1.58"
        );
    }
    for (dst, src) in [
        (&mut spec.n_embd, a.n_embd),
        (&mut spec.n_layer, a.n_layer),
        (&mut spec.n_ff, a.n_ff),
        (&mut spec.n_head, a.n_head),
        (&mut spec.n_head_kv, a.n_head_kv),
        (&mut spec.n_ctx, a.n_ctx),
    ] {
        if let Some(v) = src {
            *dst = v;
        }
    }
    let vocab = match &a.vocab {
        Some(p) => synth::vocab_from_gguf(&open_gguf(p, false)?)?,
        None => synth::vocab_from_gguf_bytes(bitnet_testkit::TINY_VOCAB_GGUF)?,
    };
    if let Some(kind) = &a.hf {
        if spec.arch.is_embedding() {
            anyhow::bail!("--hf does not write the embedding architectures (qwen3, gemma3)");
        }
        if a.layout != WeightLayout::I2S || (spec.arch == SynthArch::Bitnet) != (kind == "f16") {
            anyhow::bail!(
                "--hf writes bitnet-b1.58 (BitNetForCausalLM) and llama (LlamaForCausalLM) \
                 checkpoints as bf16 or packed, and bitnet (1bitLLM's BitnetForCausalLM) as \
                 f16, with the i2_s layout"
            );
        }
        let weights = match kind.as_str() {
            "packed" => bitnet_testkit::hf::HfWeights::Packed,
            "f16" => bitnet_testkit::hf::HfWeights::F16,
            _ => bitnet_testkit::hf::HfWeights::Bf16,
        };
        let start = std::time::Instant::now();
        let out = AtomicDir::create(&a.out)?;
        bitnet_testkit::hf::write_dir(&spec, &vocab, weights, 1, out.path())?;
        out.commit()?;
        eprintln!(
            "wrote {} ({kind} Hugging Face checkpoint) in {:.1} s",
            a.out.display(),
            start.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let out = AtomicFile::create(&a.out)?;
    let bar = bytes_bar(a.quiet, "{msg}")?;
    bar.set_message(format!("writing {}", a.out.display()));
    let start = std::time::Instant::now();
    let w = synth::write(
        &spec,
        &vocab,
        BufWriter::with_capacity(1 << 22, out.file()),
        &mut |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        },
    )?;
    w.into_inner().map_err(|e| e.into_error())?;
    out.commit()?;
    bar.finish_and_clear();
    let size = std::fs::metadata(&a.out)?.len();
    eprintln!(
        "wrote {} ({} bytes, {}) in {:.1} s: {:?} layout, {} layers, n_embd {}, seed {}",
        a.out.display(),
        size,
        human_bytes(size),
        start.elapsed().as_secs_f64(),
        spec.layout,
        spec.n_layer,
        spec.n_embd,
        spec.seed
    );
    Ok(())
}
