//! Pre-tokenizers: regexes that cut text into pieces before BPE runs on each piece.
//!
//! A pre-tokenizer is a list of regexes applied in sequence. Each regex cuts every
//! current piece into its matches *and* the gaps between them (HF `Split` with
//! `Isolated` behaviour; llama.cpp `unicode_regex_split`), so no text is ever dropped.

use fancy_regex::Regex;

use crate::TokenizerError;

/// Which pre-tokenizer splits text before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PreTokenizer {
    /// The LLaMA-3 split regex (HF `tokenizer.json` of Meta-Llama-3; llama.cpp
    /// `llama-bpe`). Whole pieces found in the vocabulary are emitted without merging
    /// (HF `ignore_merges`), as the LLaMA-3 tokenizer does.
    Llama3,
    /// llama.cpp's fallback for `LLAMA_VOCAB_PRE_TYPE_DEFAULT`, used by bitnet.cpp when
    /// the GGUF has no `tokenizer.ggml.pre`: punctuation runs, then the GPT-2 regex,
    /// then digit runs, then groups of three ASCII digits.
    Default,
    /// The plain GPT-2 regex (llama.cpp `gpt-2`).
    Gpt2,
}

/// The LLaMA-3 split regex (MODEL.md).
pub const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The GPT-2 split regex.
pub const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// llama.cpp's default BPE pre-tokenizer regexes, applied in this order.
pub const DEFAULT_REGEXES: [&str; 4] = [
    r"[\p{P}\$\+<=>\^~\|]+",
    GPT2_REGEX,
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

impl PreTokenizer {
    /// Maps a `tokenizer.ggml.pre` value to a pre-tokenizer; unknown names are an error
    /// (guessing would silently change token ids).
    pub fn from_gguf_name(name: &str) -> Result<Self, TokenizerError> {
        match name {
            "llama-bpe" | "llama3" | "llama-v3" => Ok(Self::Llama3),
            "default" => Ok(Self::Default),
            "gpt-2" | "gpt2" => Ok(Self::Gpt2),
            other => Err(TokenizerError::UnknownPreTokenizer(truncate(other, 64))),
        }
    }

    /// The regexes this pre-tokenizer applies, in order.
    pub fn regexes(&self) -> &'static [&'static str] {
        match self {
            Self::Llama3 => std::slice::from_ref(&LLAMA3_REGEX),
            Self::Default => &DEFAULT_REGEXES,
            Self::Gpt2 => std::slice::from_ref(&GPT2_REGEX),
        }
    }

    /// Whether a piece found whole in the vocabulary is emitted without merging.
    pub(crate) fn ignore_merges(&self) -> bool {
        matches!(self, Self::Llama3)
    }
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Backtracking budget per regex search. The patterns above backtrack at most a few
/// steps per match; this only bounds pathological engine behaviour.
const BACKTRACK_LIMIT: usize = 10_000_000;

/// A compiled pre-tokenizer.
#[derive(Debug, Clone)]
pub(crate) struct Splitter {
    regexes: Vec<Regex>,
}

impl Splitter {
    pub(crate) fn new(pre: PreTokenizer) -> Result<Self, TokenizerError> {
        let regexes = pre
            .regexes()
            .iter()
            .map(|r| {
                fancy_regex::RegexBuilder::new(r)
                    .backtrack_limit(BACKTRACK_LIMIT)
                    .build()
                    .map_err(|e| TokenizerError::Regex(e.to_string()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { regexes })
    }

    /// Cuts `text` into pieces (matches and gaps of every regex in turn), in order.
    /// The pieces concatenate to `text`.
    pub(crate) fn split<'t>(&self, text: &'t str) -> Result<Vec<&'t str>, TokenizerError> {
        let mut pieces = vec![text];
        let mut next = Vec::new();
        for re in &self.regexes {
            next.clear();
            for &piece in &pieces {
                split_one(re, piece, &mut next)?;
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        pieces.retain(|p| !p.is_empty());
        Ok(pieces)
    }
}

fn split_one<'t>(re: &Regex, text: &'t str, out: &mut Vec<&'t str>) -> Result<(), TokenizerError> {
    let mut prev = 0;
    for m in re.find_iter(text) {
        let m = m.map_err(|e| TokenizerError::Regex(e.to_string()))?;
        if m.start() > prev {
            out.push(&text[prev..m.start()]);
        }
        if m.end() > m.start() {
            out.push(m.as_str());
        }
        prev = m.end();
    }
    if prev < text.len() {
        out.push(&text[prev..]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: PreTokenizer, text: &str) -> Vec<&str> {
        Splitter::new(pre).unwrap().split(text).unwrap()
    }

    #[test]
    fn names() {
        assert_eq!(
            PreTokenizer::from_gguf_name("llama-bpe").unwrap(),
            PreTokenizer::Llama3
        );
        assert_eq!(
            PreTokenizer::from_gguf_name("default").unwrap(),
            PreTokenizer::Default
        );
        assert_eq!(
            PreTokenizer::from_gguf_name("gpt-2").unwrap(),
            PreTokenizer::Gpt2
        );
        assert!(matches!(
            PreTokenizer::from_gguf_name("qwen2"),
            Err(TokenizerError::UnknownPreTokenizer(_))
        ));
    }

    #[test]
    fn llama3_examples() {
        // Hand-derived from the regex: contractions split off, digits in threes,
        // a newline run attaches to the punctuation before it, trailing spaces split.
        assert_eq!(
            split(PreTokenizer::Llama3, "I'm 12345 ok.\n\n  x  "),
            vec!["I", "'m", " ", "123", "45", " ok", ".\n\n", " ", " x", "  "]
        );
    }

    #[test]
    fn default_examples() {
        // Punctuation runs are cut first, so contractions never form; digits split
        // into threes from the left.
        assert_eq!(
            split(PreTokenizer::Default, "I'm 12345 ok."),
            vec!["I", "'", "m", " ", "123", "45", " ok", "."]
        );
    }

    #[test]
    fn pieces_concatenate_to_input() {
        let text = "Tabs\tand\nnewlines\r\n\n\nand    spaces ¿Qué? 👨\u{200d}👩 1e10 --- ";
        for pre in [
            PreTokenizer::Llama3,
            PreTokenizer::Default,
            PreTokenizer::Gpt2,
        ] {
            assert_eq!(split(pre, text).concat(), text);
        }
    }
}
