//! `bitnet`: run, inspect and make BitNet b1.58 models.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

mod cmd;
mod download;
mod output;

#[derive(Debug, Parser)]
#[command(
    name = "bitnet",
    version,
    about = "Fast, exact BitNet b1.58 inference on any CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show a GGUF file's metadata and tensor table without reading tensor data.
    Inspect(cmd::inspect::Args),
    /// Write a seeded synthetic BitNet model with the official file's layout.
    Synth(cmd::synth::Args),
    /// Write raw little-endian f32 logits for a prompt (the parity tool).
    Logits(cmd::logits::Args),
    /// Generate text for a prompt, streamed to stdout.
    Run(cmd::run::Args),
    /// Chat interactively (line editing, history; the KV cache is kept across turns).
    Chat(cmd::chat::Args),
    /// Measure prompt processing and generation speed (llama-bench style).
    Bench(cmd::bench::Args),
    /// Perplexity of a text (llama-perplexity's method), and KL divergence against a saved base.
    Perplexity(cmd::perplexity::Args),
    /// Embeddings of texts (an embedding model's vectors; llama-embedding style).
    Embed(cmd::embed::Args),
    /// Show the token ids and pieces of a text.
    Tokenize(cmd::tokenize::Args),
    /// Serve an OpenAI-compatible HTTP API.
    Serve(cmd::serve::Args),
    /// Convert a Hugging Face checkpoint to GGUF, or a GGUF to another ternary layout.
    Convert(cmd::convert::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(a) => cmd::inspect::run(a),
        Command::Synth(a) => cmd::synth::run(a),
        Command::Logits(a) => cmd::logits::run(a),
        Command::Run(a) => cmd::run::run(a),
        Command::Chat(a) => cmd::chat::run(a),
        Command::Embed(a) => cmd::embed::run(a),
        Command::Tokenize(a) => cmd::tokenize::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Convert(a) => cmd::convert::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // A closed stdout (e.g. `bitnet inspect FILE | head`) ends the output, not an error.
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
