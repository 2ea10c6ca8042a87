//! `bitnet perplexity`: llama-perplexity's measure over a text file, and the KL divergence
//! of one configuration against a saved base (see `bitnet_engine::quality`).

use std::io::{BufReader, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use bitnet_engine::quality::{self, Divergence, KlHeader, Nll};

use super::common::{load_engine, ModelArgs};
use crate::output::AtomicFile;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The text to score (UTF-8). Chunks of -c tokens (default 512), each evaluated alone;
    /// the second half of each is scored.
    #[arg(short = 'f', long)]
    file: Option<PathBuf>,
    /// Score at most this many chunks.
    #[arg(long)]
    chunks: Option<usize>,
    /// Save this configuration's scored log-probabilities (f32, `n_vocab` per scored token:
    /// 0.5 MiB per token for a 128K vocabulary) to FILE, written atomically; with
    /// --kl-divergence, read the base from FILE instead.
    #[arg(long, value_name = "FILE")]
    kl_divergence_base: Option<PathBuf>,
    /// Compare this configuration with the base in --kl-divergence-base (its text and
    /// chunking; -f is not needed): mean KL divergence, top-1 agreement, the largest change
    /// in the probability of the actual next token, and both perplexities.
    #[arg(long, requires = "kl_divergence_base")]
    kl_divergence: bool,
}

pub fn run(a: Args) -> Result<()> {
    if a.model.ram_budget.is_some() {
        bail!(
            "perplexity keeps the logits of whole chunks and is not planned for a RAM budget; \
             the low-memory mode's logits are the normal mode's, so measure without it"
        );
    }
    if a.chunks == Some(0) {
        bail!("--chunks must be at least 1");
    }
    a.model.refuse_screen_head("perplexity")?;
    let engine = load_engine(&a.model)?;
    let n_vocab = engine.config().n_vocab;
    if a.kl_divergence {
        let base = a
            .kl_divergence_base
            .as_ref()
            .context("--kl-divergence-base")?;
        return compare(&engine, base, a.chunks);
    }
    let path = a.file.as_ref().context("give the text with -f FILE")?;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {} as UTF-8 text", path.display()))?;
    let tok = &engine.tokenizer;
    let tokens = tok.encode(&text, tok.add_bos(), false)?;
    let n_ctx = a.model.ctx_size.unwrap_or(512);
    if n_ctx < 4 {
        bail!("-c must be at least 4 for perplexity");
    }
    let chunks = quality::chunks(&tokens, n_ctx, tok.bos(), a.chunks);
    if chunks.is_empty() {
        bail!(
            "the text has {} tokens; chunks of -c {n_ctx} need at least {n_ctx}",
            tokens.len()
        );
    }
    eprintln!(
        "perplexity: {} tokens, {} chunks of {n_ctx} ({} scored each)",
        tokens.len(),
        chunks.len(),
        n_ctx - quality::first_scored(n_ctx) - 1
    );
    let mut base = match &a.kl_divergence_base {
        Some(p) => {
            let f = AtomicFile::create(p)?;
            let mut w = f.writer();
            KlHeader::new(n_vocab, n_ctx, chunks.len())?.write(&mut w)?;
            drop(w);
            Some(f)
        }
        None => None,
    };
    let mut nll = Nll::default();
    let mut out = std::io::stdout().lock();
    for (i, c) in chunks.iter().enumerate() {
        let lp = quality::chunk_log_probs(&engine, c)?;
        nll.add(c, &lp, n_vocab);
        if let Some(f) = &mut base {
            let mut w = f.writer();
            quality::write_chunk(&mut w, c, &lp)?;
            w.flush()?;
        }
        write!(out, "[{}]{:.4},", i + 1, nll.perplexity())?;
        out.flush()?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "Final estimate: PPL = {:.4} +/- {:.5} ({} tokens scored)",
        nll.perplexity(),
        nll.perplexity_error(),
        nll.count()
    )?;
    if let (Some(f), Some(p)) = (base, &a.kl_divergence_base) {
        f.commit()?;
        eprintln!("saved the scored log-probabilities to {}", p.display());
    }
    Ok(())
}

fn compare(
    engine: &bitnet_engine::Engine,
    base: &std::path::Path,
    max: Option<usize>,
) -> Result<()> {
    let n_vocab = engine.config().n_vocab;
    let f = std::fs::File::open(base).with_context(|| format!("cannot open {}", base.display()))?;
    let mut r = BufReader::with_capacity(1 << 22, f);
    let h = KlHeader::read(&mut r)?;
    if h.n_vocab != n_vocab {
        bail!(
            "the base was made with a vocabulary of {} tokens; this model has {n_vocab}",
            h.n_vocab
        );
    }
    let n_chunks = h.n_chunks.min(max.unwrap_or(usize::MAX));
    eprintln!(
        "kl-divergence: {n_chunks} chunks of {} against {}",
        h.n_ctx,
        base.display()
    );
    let (mut nll_base, mut nll_this) = (Nll::default(), Nll::default());
    let mut d = Divergence::default();
    for _ in 0..n_chunks {
        let (tokens, base_lp) = quality::read_chunk(&mut r, &h)?;
        let lp = quality::chunk_log_probs(engine, &tokens)?;
        nll_base.add(&tokens, &base_lp, n_vocab);
        nll_this.add(&tokens, &lp, n_vocab);
        d.add_chunk(&tokens, &base_lp, &lp, n_vocab);
    }
    println!(
        "PPL base {:.4}, this {:.4} (ratio {:.5})",
        nll_base.perplexity(),
        nll_this.perplexity(),
        nll_this.perplexity() / nll_base.perplexity()
    );
    println!(
        "mean KL divergence {:.6} +/- {:.6}, top-1 agreement {:.3}%, max |dp| {:.5} ({} tokens)",
        d.mean_kl(),
        d.kl_error(),
        100.0 * d.top1_agreement(),
        d.max_dp,
        nll_this.count()
    );
    Ok(())
}
