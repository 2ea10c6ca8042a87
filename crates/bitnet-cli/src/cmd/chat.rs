//! `bitnet chat`: interactive chat; the KV cache is kept across turns.
//!
//! Line editing and history come from rustyline. Ctrl-C during a reply stops the reply and
//! returns to the prompt; Ctrl-C at the prompt clears the line; Ctrl-D (or /exit) leaves.
//! When the context fills, the reply ends and `/reset` starts over (the cache is never
//! silently truncated).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Result;
use bitnet_engine::{Event, FinishReason, GenParams};
use bitnet_tokenizer::{ChatMessage, ChatRole};
use rustyline::error::ReadlineError;

use super::common::{load_engine_at, ModelArgs, SamplingArgs, WindowArgs};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    window: WindowArgs,
    /// System message.
    #[arg(long, default_value = "You are a helpful assistant.")]
    system: String,
    /// Maximum tokens per reply.
    #[arg(short = 'n', long, default_value_t = 512)]
    n_predict: usize,
}

pub fn run(a: Args) -> Result<()> {
    let path = a.model.path()?;
    let engine = load_engine_at(&path, &a.model)?;
    let tok = &engine.tokenizer;
    let (n_ctx, context_policy) = a.window.context(&a.model, &engine)?;
    let mut session = engine.new_session(n_ctx)?;
    let params = GenParams {
        max_tokens: a.n_predict,
        sampler: a.sampling.params()?,
        stop: Vec::new(),
        context_policy,
        constraint: None,
    };
    let stop_flag = Arc::new(AtomicBool::new(false));
    {
        let f = stop_flag.clone();
        ctrlc::set_handler(move || f.store(true, Ordering::SeqCst))?;
    }
    let eot = tok.token_id("<|eot_id|>");
    let mut rl = rustyline::DefaultEditor::new()?;
    eprintln!("chat with {} (context {} tokens). Ctrl-C stops a reply, Ctrl-D or /exit leaves, /reset forgets.",
        path.display(), session.n_ctx());
    let mut first = true;
    let mut ended_with_eog = true;
    loop {
        let line = match rl.readline("> ") {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let _ = rl.add_history_entry(text);
        match text {
            "/exit" | "/quit" => break,
            "/reset" => {
                session.reset();
                first = true;
                ended_with_eog = true;
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        // This turn's tokens: per-message encoding concatenates, so the conversation so far
        // stays in the cache and only the new turn is evaluated.
        let mut msgs = Vec::new();
        if first {
            msgs.push(ChatMessage::new(ChatRole::System, a.system.clone()));
        }
        msgs.push(ChatMessage::new(ChatRole::User, text.to_string()));
        let mut ids = tok.encode_chat(&msgs, true)?;
        if !first {
            ids.remove(0); // BOS only once
        }
        if !ended_with_eog {
            // The previous reply was cut short: close its turn.
            if let Some(e) = eot {
                ids.insert(0, e);
            }
        }
        stop_flag.store(false, Ordering::SeqCst);
        let mut out = std::io::stdout().lock();
        let res = engine.generate(&mut session, &ids, true, &params, &mut |ev| match ev {
            Event::Text(t) => {
                let _ = write!(out, "{t}");
                let _ = out.flush();
                !stop_flag.load(Ordering::SeqCst)
            }
            Event::Token(_) => !stop_flag.load(Ordering::SeqCst),
        });
        let _ = writeln!(out);
        match res {
            Ok(stats) => {
                first = false;
                ended_with_eog = stats.finish == FinishReason::Eog;
                if stats.finish == FinishReason::Length && session.tokens().len() >= session.n_ctx()
                {
                    eprintln!("(context full: /reset to start over)");
                }
            }
            Err(e) => eprintln!("error: {e}"),
        }
    }
    Ok(())
}
