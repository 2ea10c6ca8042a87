//! `bitnet embed`: one embedding per input (llama.cpp's `llama-embedding`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use bitnet_engine::EmbedOptions;
use bitnet_model::Pooling;

use super::common::{load_engine, ModelArgs};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Read the inputs from this file, one per line (empty lines skipped).
    #[arg(short = 'f', long, conflicts_with = "text")]
    file: Option<PathBuf>,
    /// Print the OpenAI embeddings response (`{"object": "list", "data": [...], "usage": ...}`)
    /// instead of one line of numbers per input.
    #[arg(long)]
    json: bool,
    /// Pooling: none, mean, cls or last (default: the file's `pooling_type`, else last).
    #[arg(long)]
    pooling: Option<Pooling>,
    /// Print the pooled vectors as they are (default: each L2-normalized, as llama.cpp's
    /// `--embd-normalize 2`).
    #[arg(long)]
    no_normalize: bool,
    /// Quantize each vector to 8, 4, 2 or 1 bits per value (docs/MODEL.md, "Embedding
    /// quantization"): print its integer codes (with --json also `bits` and `scale`, what one
    /// step is worth).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["8", "4", "2", "1"]))]
    bits: Option<String>,
    /// The inputs (each one text).
    text: Vec<String>,
}

pub fn run(a: Args) -> Result<()> {
    let texts: Vec<String> = match &a.file {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("cannot read {}", p.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
        None => a.text.clone(),
    };
    if texts.is_empty() {
        bail!("give the inputs as arguments or with -f FILE");
    }
    if let Some(i) = texts.iter().position(String::is_empty) {
        bail!("input {} is an empty string", i + 1);
    }
    let bits: Option<u32> = a.bits.as_deref().map(str::parse).transpose()?;
    a.model.refuse_screen_head("embed")?;
    let engine = load_engine(&a.model)?;
    let opts = EmbedOptions {
        pooling: a.pooling,
        raw: a.no_normalize,
    };
    let inputs = texts
        .iter()
        .map(|t| engine.embed_tokens(t))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(i) = inputs.iter().position(Vec::is_empty) {
        bail!("input {} has no tokens", i + 1);
    }
    let start = std::time::Instant::now();
    let vectors = engine.embed(&inputs, &opts)?;
    let secs = start.elapsed().as_secs_f64();
    let quantized = match bits {
        Some(b) => Some(
            vectors
                .iter()
                .map(|v| bitnet_engine::quantize_embedding(v, b))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        None => None,
    };
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if a.json {
        let data: Vec<serde_json::Value> = vectors
            .iter()
            .enumerate()
            .map(|(i, v)| match &quantized {
                Some(q) => serde_json::json!({"object": "embedding", "index": i,
                    "embedding": q[i].codes, "bits": q[i].bits, "scale": q[i].scale}),
                None => serde_json::json!({"object": "embedding", "index": i, "embedding": v}),
            })
            .collect();
        let name = a
            .model
            .path()?
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let body = serde_json::json!({
            "object": "list",
            "data": data,
            "model": name,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        });
        writeln!(out, "{body}")?;
    } else if let Some(q) = &quantized {
        for qv in q {
            let line: Vec<String> = qv.codes.iter().map(i8::to_string).collect();
            writeln!(out, "{}", line.join(" "))?;
        }
    } else {
        for v in &vectors {
            let line: Vec<String> = v.iter().map(f32::to_string).collect();
            writeln!(out, "{}", line.join(" "))?;
        }
    }
    out.flush()?;
    #[allow(clippy::cast_precision_loss)]
    let tok_s = n_tokens as f64 / secs.max(1e-9);
    eprintln!(
        "{} inputs, {n_tokens} tokens in {secs:.3} s ({tok_s:.1} tok/s) | pooling {} | {} | dimension {}{}",
        vectors.len(),
        engine.pooling(&opts).name(),
        if a.no_normalize { "raw" } else { "L2-normalized" },
        engine.config().n_embd,
        bits.map(|b| format!(" | {b}-bit codes")).unwrap_or_default(),
    );
    Ok(())
}
