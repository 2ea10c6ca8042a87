//! `bitnet run`: generate text for a prompt, streamed to stdout.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Result};
use bitnet_engine::{Event, GenParams};

use super::common::{
    ctx_size, human_bytes, load_engine, peak_rss_bytes, ConstraintArgs, ModelArgs, SamplingArgs,
    WindowArgs,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt text.
    #[arg(short, long)]
    prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    n_predict: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    window: WindowArgs,
    #[command(flatten)]
    constraint: ConstraintArgs,
    /// Wrap the prompt in the model's chat format (User/Assistant turns).
    #[arg(long)]
    chat: bool,
    /// System message for --chat.
    #[arg(long)]
    system: Option<String>,
    /// Stop at this text (repeatable); it is not printed.
    #[arg(long)]
    stop: Vec<String>,
    /// Do not echo the prompt before the generated text.
    #[arg(long)]
    no_echo: bool,
}

pub fn run(a: Args) -> Result<()> {
    let t_load = Instant::now();
    let engine = load_engine(&a.model)?;
    let load_time = t_load.elapsed();
    let (window_ctx, context_policy) = a.window.context(&a.model, &engine)?;
    let params = GenParams {
        max_tokens: a.n_predict,
        sampler: a.sampling.params()?,
        stop: a.stop.clone(),
        context_policy,
        constraint: a.constraint.constraint()?,
    };
    let tok = &engine.tokenizer;
    let ids = if a.chat {
        use bitnet_tokenizer::{ChatMessage, ChatRole};
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(ChatMessage::new(ChatRole::System, s.clone()));
        }
        msgs.push(ChatMessage::new(ChatRole::User, a.prompt.clone()));
        tok.encode_chat(&msgs, true)?
    } else {
        tok.encode(&a.prompt, tok.add_bos(), false)?
    };
    if ids.is_empty() {
        bail!("the prompt has no tokens");
    }
    let n_ctx = match engine.plan() {
        // A sliding window: its size, whatever the prompt (which must fit in it).
        _ if a.window.kv_window.is_some() => {
            if ids.len() >= window_ctx {
                bail!(
                    "the prompt has {} tokens; the window holds {window_ctx}",
                    ids.len()
                );
            }
            window_ctx
        }
        // Under a RAM budget the context is what the plan fitted.
        Some(p) if ids.len() >= p.n_ctx => bail!(
            "the prompt has {} tokens; the context the RAM budget allows holds {}",
            ids.len(),
            p.n_ctx
        ),
        Some(p) => p.n_ctx,
        None => ctx_size(&a.model, &engine).max(ids.len() + 1),
    };
    let mut session = engine.new_session(n_ctx)?;
    let mut out = std::io::stdout().lock();
    if !a.no_echo && !a.chat {
        write!(out, "{}", a.prompt)?;
        out.flush()?;
    }
    let mut write_err = None;
    let stats = engine.generate(&mut session, &ids, false, &params, &mut |ev| match ev {
        Event::Text(t) => match write!(out, "{t}").and_then(|()| out.flush()) {
            Ok(()) => true,
            Err(e) => {
                write_err = Some(e);
                false
            }
        },
        Event::Token(_) => true,
    })?;
    writeln!(out)?;
    if let Some(e) = write_err {
        return Err(e.into());
    }
    eprintln!(
        "\nload {:.2} s | prompt {} tokens, {:.2} tok/s | generated {} tokens, {:.2} tok/s | finish: {:?} | {} | seed {} | peak RSS {}",
        load_time.as_secs_f64(),
        stats.prompt_tokens,
        stats.prompt_tok_s(),
        stats.generated_tokens,
        stats.generation_tok_s(),
        stats.finish,
        match engine.gpu() {
            Some(_) => engine.device_name(),
            None => format!("threads {}", engine.pool().n_threads()),
        },
        params.sampler.seed,
        peak_rss_bytes().map_or_else(|| "?".into(), human_bytes),
    );
    if let Some(c) = engine.screen_counts() {
        eprintln!(
            "screened head: {} steps chosen from {:.1} candidates on average (at most {}) of {} tokens; {} left to the full head",
            c.decided,
            c.mean_candidates(),
            c.max_candidates,
            engine.config().n_vocab,
            c.declined,
        );
    }
    Ok(())
}
