//! `bitnet logits`: raw little-endian f32 logits, the parity tool.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use bitnet_kernels::Pool;
use bitnet_model::{Exec, KvType, Model, Numerics, Outputs};
use bitnet_tokenizer::Tokenizer;

use super::common::{default_threads, open_gguf};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model file (GGUF).
    #[arg(short, long)]
    model: PathBuf,
    /// Prompt text (tokenized with BOS, special tokens parsed).
    #[arg(short, long, conflicts_with = "ids")]
    prompt: Option<String>,
    /// Token ids, comma separated, used as given (no BOS added).
    #[arg(long, value_delimiter = ',')]
    ids: Option<Vec<u32>>,
    /// Write logits of every position instead of the last one.
    #[arg(long)]
    all: bool,
    /// Output file: f32 little-endian, `[rows][n_vocab]`.
    #[arg(short, long)]
    out: PathBuf,
    /// fast (default) or exact (bit-identical to bitnet.cpp).
    #[arg(long, default_value = "fast")]
    numerics: Numerics,
    /// KV cache element type: f16 (default) or f32.
    #[arg(long, default_value = "f16")]
    kv_cache: KvType,
    /// Threads (default: physical cores).
    #[arg(short, long)]
    threads: Option<usize>,
}

pub fn run(a: Args) -> Result<()> {
    let file = open_gguf(&a.model, false)?;
    let model = Model::load(&file).context("cannot load model")?;
    let ids = match (&a.prompt, a.ids) {
        (Some(p), _) => {
            let tok = Tokenizer::from_gguf(file.metadata(), None)?;
            tok.encode(p, tok.add_bos(), true)?
        }
        (None, Some(ids)) => ids,
        (None, None) => bail!("give --prompt TEXT or --ids 1,2,3"),
    };
    if ids.is_empty() {
        bail!("the prompt has no tokens");
    }
    let pool = Pool::new(a.threads.unwrap_or_else(default_threads));
    if a.numerics == Numerics::Exact && a.kv_cache != KvType::F16 {
        bail!("--numerics exact needs --kv-cache f16 (bitnet.cpp stores K and V as f16)");
    }
    let mut cache = model.new_cache(ids.len(), a.kv_cache, u64::MAX)?;
    let mut exec = Exec {
        pool: &pool,
        numerics: a.numerics,
        trace: None,
    };
    let outputs = if a.all { Outputs::All } else { Outputs::Last };
    let logits = model.forward(&ids, &mut cache, outputs, &mut exec)?;
    let mut w = std::io::BufWriter::new(
        std::fs::File::create(&a.out)
            .with_context(|| format!("cannot create {}", a.out.display()))?,
    );
    for x in &logits {
        w.write_all(&x.to_le_bytes())?;
    }
    w.flush()?;
    eprintln!(
        "wrote {} rows x {} logits for {} tokens to {}",
        logits.len() / model.config.n_vocab,
        model.config.n_vocab,
        ids.len(),
        a.out.display()
    );
    Ok(())
}
