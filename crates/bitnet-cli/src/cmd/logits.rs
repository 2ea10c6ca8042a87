//! `bitnet logits`: raw little-endian f32 logits, the parity tool.
//!
//! Three shapes of output, each `[rows][n_vocab]` f32:
//! - default: the last prompt position (the prompt evaluated in batches of `n_batch`);
//! - `--all`: every prompt position;
//! - `--then IDS` (step mode): the prompt as one batch, then each id of IDS fed alone, in
//!   order; row 0 is the prompt's last position and row i the logits after the i-th fed id.
//!   This is the layout of bitnet.cpp's `step_logits` files (teacher forcing), and since exact
//!   numerics depend on the batch shape it is the computation those files hold.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use bitnet_model::Outputs;

use super::common::{load_engine, ModelArgs};
use crate::output::{write_f32s, AtomicFile};

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
    #[arg(long, conflicts_with = "then")]
    all: bool,
    /// Step mode: after the prompt, feed these ids (comma separated) one at a time and write
    /// one row per step (bitnet.cpp's `step_logits` layout).
    #[arg(long, value_delimiter = ',')]
    then: Option<Vec<u32>>,
    /// Output file: f32 little-endian, `[rows][n_vocab]`, written atomically. Without it (or
    /// with `-`), the bytes go to stdout, which must not be a terminal.
    #[arg(short, long)]
    out: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    let to_stdout = a.out.as_deref().is_none_or(|p| p.as_os_str() == "-");
    if to_stdout && std::io::stdout().is_terminal() {
        bail!("logits are binary: give --out FILE or redirect stdout");
    }
    a.model.refuse_screen_head("logits")?;
    let engine = load_engine(&a.model)?;
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
    let then = a.then.unwrap_or_default();
    let n_vocab = engine.config().n_vocab;
    let n_ctx = ids.len() + then.len();
    if n_ctx > engine.config().n_ctx_train {
        bail!(
            "{} prompt and {} step tokens need {n_ctx} positions; the model's context is {}",
            ids.len(),
            then.len(),
            engine.config().n_ctx_train
        );
    }
    if let Some(&bad) = then
        .iter()
        .find(|&&t| usize::try_from(t).map_or(true, |t| t >= n_vocab))
    {
        bail!("--then id {bad} is outside the vocabulary (0..{n_vocab})");
    }
    if let Some(p) = engine.plan() {
        if n_ctx > p.n_ctx {
            anyhow::bail!(
                "{n_ctx} positions do not fit the context the RAM budget allows ({})",
                p.n_ctx
            );
        }
    }
    let mut session = engine.new_session(n_ctx)?;
    let outputs = if a.all { Outputs::All } else { Outputs::Last };
    let mut logits = engine.eval(&mut session, &ids, outputs)?;
    for &t in &then {
        logits.extend(engine.eval(&mut session, &[t], Outputs::Last)?);
    }
    let rows = logits.len() / n_vocab;
    match a.out.filter(|_| !to_stdout) {
        Some(out) => {
            let f = AtomicFile::create(&out)?;
            {
                let mut w = f.writer();
                write_f32s(&mut w, &logits)?;
                w.flush()
                    .with_context(|| format!("cannot write {}", out.display()))?;
            }
            f.commit()?;
            eprintln!(
                "wrote {rows} rows x {n_vocab} logits ({} prompt tokens, {} steps) to {}",
                ids.len(),
                then.len(),
                out.display()
            );
        }
        None => {
            let stdout = std::io::stdout();
            let mut w = std::io::BufWriter::new(stdout.lock());
            write_f32s(&mut w, &logits)?;
            w.flush()?;
        }
    }
    Ok(())
}
