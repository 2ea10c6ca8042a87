//! Pre-tokenizers: regexes that cut text into pieces before BPE runs on each piece.
//!
//! A pre-tokenizer is a list of regexes applied in sequence. Each regex cuts every
//! current piece into its matches *and* the gaps between them (HF `Split` with
//! `Isolated` behaviour; llama.cpp `unicode_regex_split`), so no text is ever dropped.
//!
//! # Linear time without look-ahead
//! The LLaMA-3 and GPT-2 patterns contain `\s+(?!\S)`, a look-ahead that needs a
//! backtracking engine; backtracking engines (fancy-regex, Oniguruma) run out of stack
//! on long runs of one letter (fancy-regex gives up on 1.6 million `a`s). Here each
//! pattern runs on the `regex` crate (finite automata, linear time, no stack) with that
//! branch rewritten to `\s+`, and the look-ahead is applied afterwards: a whitespace
//! run matched by that branch and followed by more text gives back its last character,
//! which is exactly what `\s+(?!\S)` does (the run is maximal, so it is followed by
//! a non-space or the end; at the end it is kept whole; a single character falls
//! through to the plain `\s+` alternative, or to an unmatched gap in GPT-2's
//! pattern, which becomes the same one-character piece). A differential test checks
//! the rewrite against the original patterns on fancy-regex.

use regex::Regex;

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
    /// Falcon3's (and Falcon-E's; llama.cpp `falcon3`, `falcon_e`): punctuation runs (with
    /// the backtick), then the GPT-2 regex, then every digit alone.
    Falcon3,
    /// Qwen 2's and Qwen 3's (llama.cpp `qwen2`): the LLaMA-3 regex with every digit alone.
    Qwen2,
}

/// The LLaMA-3 split regex (docs/MODEL.md).
pub const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's split regex (its `tokenizer.json`; llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`).
pub const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The GPT-2 split regex.
pub const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Falcon3's pre-tokenizer regexes (bitnet.cpp's fork, `LLAMA_VOCAB_PRE_TYPE_FALCON_3`).
pub const FALCON3_REGEXES: [&str; 3] = [r"[\p{P}\$\+<=>\^~\|`]+", GPT2_REGEX, r"[0-9]"];

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
            "falcon3" | "falcon_e" => Ok(Self::Falcon3),
            "qwen2" => Ok(Self::Qwen2),
            other => Err(TokenizerError::UnknownPreTokenizer(truncate(other, 64))),
        }
    }

    /// The regexes this pre-tokenizer applies, in order.
    pub fn regexes(&self) -> &'static [&'static str] {
        match self {
            Self::Llama3 => std::slice::from_ref(&LLAMA3_REGEX),
            Self::Default => &DEFAULT_REGEXES,
            Self::Gpt2 => std::slice::from_ref(&GPT2_REGEX),
            Self::Falcon3 => &FALCON3_REGEXES,
            Self::Qwen2 => std::slice::from_ref(&QWEN2_REGEX),
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

/// How a compiled pattern's last alternative must be post-processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// Plain pattern: matches are used as found.
    Plain,
    /// The pattern ended in `\s+(?!\S)` (rewritten to `\s+`). `newline_branch`: an
    /// earlier alternative (`\s*[\r\n]+`) matches whitespace runs containing a line
    /// break, so only runs without one can come from the rewritten branch.
    WsLookahead { newline_branch: bool },
}

/// The look-ahead-free form of each pattern (see the module docs).
fn rewrite(pattern: &str) -> (String, Tail) {
    if let Some(head) = pattern.strip_suffix(r"|\s+(?!\S)|\s+") {
        let newline_branch = head.ends_with(r"|\s*[\r\n]+");
        return (format!(r"{head}|\s+"), Tail::WsLookahead { newline_branch });
    }
    if let Some(head) = pattern.strip_suffix(r"|\s+(?!\S)") {
        return (
            format!(r"{head}|\s+"),
            Tail::WsLookahead {
                newline_branch: false,
            },
        );
    }
    (pattern.to_owned(), Tail::Plain)
}

#[derive(Debug, Clone)]
struct Rule {
    re: Regex,
    tail: Tail,
}

/// A compiled pre-tokenizer.
#[derive(Debug, Clone)]
pub(crate) struct Splitter {
    rules: Vec<Rule>,
    /// `\A\s+\z`: whitespace exactly as the patterns' `\s` defines it.
    ws_only: Regex,
}

fn compile(pattern: &str) -> Result<Regex, TokenizerError> {
    Regex::new(pattern).map_err(|e| TokenizerError::Regex(e.to_string()))
}

impl Splitter {
    pub(crate) fn new(pre: PreTokenizer) -> Result<Self, TokenizerError> {
        let rules = pre
            .regexes()
            .iter()
            .map(|p| {
                let (pattern, tail) = rewrite(p);
                Ok(Rule {
                    re: compile(&pattern)?,
                    tail,
                })
            })
            .collect::<Result<_, TokenizerError>>()?;
        Ok(Self {
            rules,
            ws_only: compile(r"\A\s+\z")?,
        })
    }

    /// Cuts `text` into pieces (matches and gaps of every regex in turn), in order.
    /// The pieces concatenate to `text`.
    pub(crate) fn split<'t>(&self, text: &'t str) -> Result<Vec<&'t str>, TokenizerError> {
        let mut pieces = vec![text];
        let mut next = Vec::new();
        for rule in &self.rules {
            next.clear();
            for &piece in &pieces {
                self.split_one(rule, piece, &mut next);
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        pieces.retain(|p| !p.is_empty());
        Ok(pieces)
    }

    /// Whether a match is a whitespace run from the rewritten `\s+(?!\S)` branch.
    fn is_lookahead_ws_run(&self, m: &str, newline_branch: bool) -> bool {
        self.ws_only.is_match(m) && !(newline_branch && m.contains(['\r', '\n']))
    }

    fn split_one<'t>(&self, rule: &Rule, text: &'t str, out: &mut Vec<&'t str>) {
        let mut pos = 0; // where the next search starts
        let mut emitted = 0; // end of the last piece pushed
        while pos < text.len() {
            let Some(m) = rule.re.find_at(text, pos) else {
                break;
            };
            let (start, mut end) = (m.start(), m.end());
            if end == start {
                // No pattern here matches the empty string; skip a character if one did.
                pos = text[start..]
                    .chars()
                    .next()
                    .map_or(text.len(), |c| start + c.len_utf8());
                continue;
            }
            if let Tail::WsLookahead { newline_branch } = rule.tail {
                if end < text.len() && self.is_lookahead_ws_run(m.as_str(), newline_branch) {
                    // `\s+(?!\S)`: leave the run's last character to the next piece,
                    // unless the run is a single character.
                    let last = m.as_str().chars().next_back().map_or(0, char::len_utf8);
                    if end - start > last {
                        end -= last;
                    }
                }
            }
            if start > emitted {
                out.push(&text[emitted..start]);
            }
            out.push(&text[start..end]);
            emitted = end;
            pos = end;
        }
        if emitted < text.len() {
            out.push(&text[emitted..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::Strategy;
    use proptest::prelude::*;

    const ALL: [PreTokenizer; 5] = [
        PreTokenizer::Llama3,
        PreTokenizer::Default,
        PreTokenizer::Gpt2,
        PreTokenizer::Falcon3,
        PreTokenizer::Qwen2,
    ];

    fn index(pre: PreTokenizer) -> usize {
        ALL.iter().position(|&p| p == pre).unwrap()
    }

    /// Compiled once per test binary: the Unicode classes make compilation slow.
    fn splitter(pre: PreTokenizer) -> &'static Splitter {
        static CELLS: [std::sync::OnceLock<Splitter>; 5] =
            [const { std::sync::OnceLock::new() }; 5];
        CELLS[index(pre)].get_or_init(|| Splitter::new(pre).unwrap())
    }

    fn split(pre: PreTokenizer, text: &str) -> Vec<&str> {
        splitter(pre).split(text).unwrap()
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
        assert_eq!(
            PreTokenizer::from_gguf_name("qwen2").unwrap(),
            PreTokenizer::Qwen2
        );
        assert!(matches!(
            PreTokenizer::from_gguf_name("deepseek-llm"),
            Err(TokenizerError::UnknownPreTokenizer(_))
        ));
    }

    #[test]
    fn qwen2_examples() {
        // Hand-derived from the regex: LLaMA-3's, with every digit a piece of its own.
        assert_eq!(
            split(PreTokenizer::Qwen2, "I'm 12345 ok.\n\n  x  "),
            vec!["I", "'m", " ", "1", "2", "3", "4", "5", " ok", ".\n\n", " ", " x", "  "]
        );
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
    fn rewrite_only_touches_the_lookahead() {
        let (l3, tail) = rewrite(LLAMA3_REGEX);
        assert_eq!(
            tail,
            Tail::WsLookahead {
                newline_branch: true
            }
        );
        assert_eq!(
            l3.replace(r"|\s*[\r\n]+|\s+", r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
            LLAMA3_REGEX
        );
        let (g2, tail) = rewrite(GPT2_REGEX);
        assert_eq!(
            tail,
            Tail::WsLookahead {
                newline_branch: false
            }
        );
        assert_eq!(format!("{}(?!\\S)", g2), GPT2_REGEX);
        for r in [
            DEFAULT_REGEXES[0],
            DEFAULT_REGEXES[2],
            DEFAULT_REGEXES[3],
            FALCON3_REGEXES[0],
            FALCON3_REGEXES[2],
        ] {
            assert_eq!(rewrite(r), (r.to_owned(), Tail::Plain));
        }
    }

    /// The original patterns on a backtracking engine, with HF `Split`/`Isolated`
    /// semantics: the oracle for the rewrite.
    fn oracle(pre: PreTokenizer, text: &str) -> Vec<String> {
        static CELLS: [std::sync::OnceLock<Vec<fancy_regex::Regex>>; 5] =
            [const { std::sync::OnceLock::new() }; 5];
        let regexes = CELLS[index(pre)].get_or_init(|| {
            pre.regexes()
                .iter()
                .map(|r| fancy_regex::Regex::new(r).unwrap())
                .collect()
        });
        let mut pieces = vec![text.to_owned()];
        for re in regexes {
            let mut next = Vec::new();
            for p in &pieces {
                let mut prev = 0;
                for m in re.find_iter(p) {
                    let m = m.unwrap();
                    if m.start() > prev {
                        next.push(p[prev..m.start()].to_owned());
                    }
                    next.push(m.as_str().to_owned());
                    prev = m.end();
                }
                if prev < p.len() {
                    next.push(p[prev..].to_owned());
                }
            }
            pieces = next;
        }
        pieces
    }

    fn ws_heavy_text() -> impl Strategy<Value = String> {
        let frag = prop_oneof![
            "[ \t\r\n\u{a0}\u{3000}\u{2028}\u{85}\u{b}\u{c}]{1,5}",
            "[a-zA-Z\u{e9}\u{65e5}]{1,3}",
            "[0-9\u{663}]{1,5}",
            "[!-/:-@\\[-`{-~\u{bf}\u{2014}]{1,3}",
            "'[sStTmMdD]|'[rRvVlL][eElL]",
            any::<char>().prop_map(String::from),
        ];
        prop::collection::vec(frag, 0..30).prop_map(|v| v.concat())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 400, ..Default::default() })]

        #[test]
        fn rewrite_matches_lookahead_patterns(text in ws_heavy_text()) {
            for pre in ALL {
                let got: Vec<String> = split(pre, &text).into_iter().map(str::to_owned).collect();
                proptest::prop_assert_eq!(got, oracle(pre, &text), "{:?} on {:?}", pre, text);
            }
        }
    }

    #[test]
    fn long_runs_do_not_fail() {
        for unit in ["a", " ", "\n", " a", "1", "!"] {
            let text = unit.repeat(2_000_000);
            for pre in [PreTokenizer::Llama3, PreTokenizer::Default] {
                assert_eq!(split(pre, &text).concat(), text);
            }
        }
    }

    #[test]
    fn pieces_concatenate_to_input() {
        let text = "Tabs\tand\nnewlines\r\n\n\nand    spaces ¿Qué? 👨\u{200d}👩 1e10 --- ";
        for pre in ALL {
            assert_eq!(split(pre, text).concat(), text);
        }
    }
}
