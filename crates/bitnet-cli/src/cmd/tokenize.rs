//! `bitnet tokenize`: token ids and pieces of a text (a model or a vocab-only GGUF).

use std::path::PathBuf;

use anyhow::Result;
use bitnet_tokenizer::{PreTokenizer, Tokenizer};

use super::common::open_gguf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Model or vocab-only GGUF.
    #[arg(short, long)]
    model: PathBuf,
    /// Print `{"ids": [...], "pieces": [...]}`.
    #[arg(long)]
    json: bool,
    /// Do not add BOS.
    #[arg(long)]
    no_bos: bool,
    /// Treat special-token text such as <|eot_id|> as plain text (by default it is parsed
    /// as the special token, as llama-tokenize does).
    #[arg(long)]
    no_parse_special: bool,
    /// Pre-tokenizer: llama3 or default (bitnet.cpp's fallback).
    #[arg(long)]
    pre: Option<String>,
    /// The text.
    text: String,
}

pub fn run(a: Args) -> Result<()> {
    let file = open_gguf(&a.model, false)?;
    let pre = a
        .pre
        .as_deref()
        .map(PreTokenizer::from_gguf_name)
        .transpose()?;
    let tok = Tokenizer::from_gguf(file.metadata(), pre)?;
    let ids = tok.encode(&a.text, tok.add_bos() && !a.no_bos, !a.no_parse_special)?;
    let pieces: Vec<String> = ids
        .iter()
        .map(|&id| String::from_utf8_lossy(tok.token_bytes(id).unwrap_or_default()).into_owned())
        .collect();
    if a.json {
        println!("{}", serde_json::json!({"ids": ids, "pieces": pieces}));
    } else {
        for (id, p) in ids.iter().zip(&pieces) {
            println!("{id:>7} {p:?}");
        }
    }
    Ok(())
}
