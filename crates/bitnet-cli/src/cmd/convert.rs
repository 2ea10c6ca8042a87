//! `bitnet convert`: a Hugging Face checkpoint to GGUF, or a GGUF file to another ternary
//! layout or to upstream llama.cpp's `bitnet` architecture.

use std::io::BufWriter;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use bitnet_convert::{Flavor, Options, Target};

use super::common::{bytes_bar, human_bytes};
use crate::output::AtomicFile;

/// Who reads the output.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum For {
    /// bitnet-rs and bitnet.cpp (architecture bitnet-b1.58).
    #[value(name = "bitnet")]
    Bitnet,
    /// Upstream llama.cpp, Ollama and LM Studio (architecture bitnet, TQ2_0/TQ1_0).
    #[value(name = "llama.cpp")]
    LlamaCpp,
    /// What bitnet.cpp's own converter writes from a BitNetForCausalLM checkpoint
    /// (architecture bitnet-25, its name rule and chat template; I2_S).
    #[value(name = "bitnet.cpp")]
    BitnetCpp,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A GGUF file, or a Hugging Face model directory (config.json, model.safetensors or
    /// shards, tokenizer.json, tokenizer_config.json).
    input: PathBuf,
    /// Output GGUF file (written to a temporary file and renamed when complete).
    #[arg(short, long)]
    out: PathBuf,
    /// Ternary layout: i2_s (bitnet.cpp's; the default for a checkpoint), tq2_0 or tq1_0
    /// (upstream llama.cpp's); or qsf, the layer-streaming container (the layout is kept).
    /// A GGUF input keeps its layout unless told.
    #[arg(long, value_parser = parse_to)]
    to: Option<To>,
    /// With --to qsf: compress each layer with LZ4 (none, the default, or lz4).
    #[arg(long, default_value = "none", value_parser = ["none", "lz4"])]
    compress: String,
    /// Who will read the file: bitnet (default), llama.cpp (upstream's `bitnet`
    /// architecture; TQ2_0 unless --to tq1_0), or bitnet.cpp (a checkpoint written as
    /// bitnet.cpp's own converter writes it).
    #[arg(long = "for", value_enum, default_value = "bitnet")]
    target_for: For,
    /// With --for llama.cpp: write the file even though upstream's graph applies SiLU where
    /// the model was trained with ReLU² (it loads there and computes another function).
    #[arg(long)]
    allow_activation_mismatch: bool,
    /// general.name of the output (default: the input's).
    #[arg(long)]
    name: Option<String>,
    /// Store a quantized LM head as output.weight (q8_0, q6_k or q4_0), the same one
    /// `run --lm-head` builds at load: no build at load, less to read per token.
    #[arg(long, value_parser = ["q8_0", "q6_k", "q4_0"])]
    lm_head: Option<String>,
    /// Hide the progress bar.
    #[arg(long)]
    quiet: bool,
}

/// Each block's importance for the QSF index: `1 − cos` of its input and output over the
/// built-in calibration text (`--skip-layers auto`'s measure). `None`, with a note, when the
/// model cannot be run here.
fn layer_importance(file: &std::sync::Arc<bitnet_gguf::GgufFile>) -> Option<Vec<f32>> {
    let measure = || -> Result<Vec<f32>> {
        // No repacked copy: the model runs a few calibration prompts once.
        let opts = bitnet_engine::LoadOptions {
            threads: super::common::default_threads(),
            repack: false,
            ..bitnet_engine::LoadOptions::default()
        };
        let engine = bitnet_engine::load_file(std::sync::Arc::clone(file), &opts, &mut |_| {})?;
        #[allow(clippy::cast_possible_truncation)]
        Ok(bitnet_engine::skip::importance(&engine)?
            .into_iter()
            .map(|x| x as f32)
            .collect())
    };
    match measure() {
        Ok(v) => Some(v),
        Err(e) => {
            eprintln!("note: layer importance not measured ({e:#}); the index holds NaN");
            None
        }
    }
}

/// `--to`: a ternary layout, or the QSF container.
#[derive(Debug, Clone, Copy)]
enum To {
    Layout(Target),
    Qsf,
}

fn parse_to(s: &str) -> Result<To, String> {
    if s.eq_ignore_ascii_case("qsf") {
        Ok(To::Qsf)
    } else {
        s.parse::<Target>()
            .map(To::Layout)
            .map_err(|e| format!("{e}, or qsf"))
    }
}

pub fn run(a: Args) -> Result<()> {
    let opts = Options {
        to: match a.to {
            Some(To::Layout(t)) => Some(t),
            _ => None,
        },
        flavor: match a.target_for {
            For::Bitnet => Flavor::Native,
            For::LlamaCpp => Flavor::LlamaCpp,
            For::BitnetCpp => Flavor::BitnetCpp,
        },
        allow_activation_mismatch: a.allow_activation_mismatch,
        name: a.name.clone(),
        lm_head: a.lm_head.as_deref().map(|h| match h {
            "q6_k" => bitnet_kernels::RowType::Q6K,
            "q4_0" => bitnet_kernels::RowType::Q4_0,
            _ => bitnet_kernels::RowType::Q8_0,
        }),
    };
    if a.out == a.input {
        anyhow::bail!("the output would replace the input: choose another -o");
    }
    // Ctrl-C stops after the tensor being written; the temporary file is then removed.
    let stop = Arc::new(AtomicBool::new(false));
    {
        let s = Arc::clone(&stop);
        ctrlc::set_handler(move || s.store(true, Ordering::SeqCst))?;
    }
    let out = AtomicFile::create(&a.out)?;
    let bar = bytes_bar(a.quiet, "{msg:28!}")?;
    // The bar follows the bytes written; returning false stops the conversion (Ctrl-C).
    let mut report = |p: &bitnet_convert::Progress<'_>| {
        bar.set_length(p.bytes_total);
        bar.set_position(p.bytes_done);
        bar.set_message(p.tensor.to_string());
        !stop.load(Ordering::SeqCst)
    };
    let start = std::time::Instant::now();
    let writer = BufWriter::with_capacity(1 << 22, out.file());
    let (w, what) = match a.to {
        Some(To::Qsf) => {
            let compression = if a.compress == "lz4" {
                bitnet_qsf::Compression::Lz4
            } else {
                bitnet_qsf::Compression::None
            };
            let w = bitnet_convert::convert_to_qsf(
                &a.input,
                &opts,
                compression,
                &mut layer_importance,
                writer,
                &mut report,
            )
            .with_context(|| format!("cannot convert {}", a.input.display()))?;
            (w, format!("QSF, layers {}", a.compress))
        }
        _ => {
            let (w, summary) = bitnet_convert::convert(&a.input, &opts, writer, &mut report)
                .with_context(|| format!("cannot convert {}", a.input.display()))?;
            let what = format!(
                "{} → {} ({} tensors, {} ternary in {}), FFN {:?}",
                summary.source,
                summary.arch,
                summary.tensors,
                summary.ternary_tensors,
                summary.target.name(),
                summary.activation,
            );
            (w, what)
        }
    };
    w.into_inner().map_err(|e| e.into_error())?;
    out.commit()?;
    bar.finish_and_clear();
    let size = std::fs::metadata(&a.out)?.len();
    eprintln!(
        "wrote {} ({}) in {:.1} s: {what}",
        a.out.display(),
        human_bytes(size),
        start.elapsed().as_secs_f64(),
    );
    Ok(())
}
