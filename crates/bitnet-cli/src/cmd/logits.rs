//! `bitnet logits`: raw little-endian f32 logits, the parity tool.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use bitnet_model::Outputs;

use super::common::{load_engine, open_gguf, ModelArgs};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
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
}

pub fn run(a: Args) -> Result<()> {
    let path = a.model.path()?;
    let file = open_gguf(&path, a.model.in_memory)?;
    let engine = load_engine(&file, &a.model)?;
    let ids = match (&a.prompt, a.ids) {
        (Some(p), _) => engine
            .tokenizer
            .encode(p, engine.tokenizer.add_bos(), true)?,
        (None, Some(ids)) => ids,
        (None, None) => bail!("give --prompt TEXT or --ids 1,2,3"),
    };
    if ids.is_empty() {
        bail!("the prompt has no tokens");
    }
    let mut session = engine.new_session(ids.len())?;
    let outputs = if a.all { Outputs::All } else { Outputs::Last };
    let logits = engine.eval(&mut session, &ids, outputs)?;
    let mut w = std::io::BufWriter::new(
        std::fs::File::create(&a.out)
            .with_context(|| format!("cannot create {}", a.out.display()))?,
    );
    for x in &logits {
        w.write_all(&x.to_le_bytes())?;
    }
    w.flush()?;
    let n_vocab = engine.model.config.n_vocab;
    eprintln!(
        "wrote {} rows x {n_vocab} logits for {} tokens to {}",
        logits.len() / n_vocab,
        ids.len(),
        a.out.display()
    );
    Ok(())
}
