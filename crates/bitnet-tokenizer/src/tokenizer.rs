//! The tokenizer: vocabulary validation, encoding and decoding.

use std::collections::{HashMap, HashSet};

use aho_corasick::{AhoCorasick, MatchKind};
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::Model;

use crate::bytelevel::{self, BYTE_TO_CHAR};
use crate::pretok::{truncate, PreTokenizer, Splitter};
use crate::vocab::{keys, TokenKind, VocabData};
use crate::TokenizerError;

/// Texts of LLaMA-3 control tokens whose presence identifies the LLaMA-3 vocabulary.
const LLAMA3_MARKERS: [&str; 5] = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
];

/// Text of the end-of-turn token, looked up when there is no `eot_token_id` key.
pub const EOT_TEXT: &str = "<|eot_id|>";
/// Text of the end-of-message token (tool calls), a stop token when present.
pub const EOM_TEXT: &str = "<|eom_id|>";

/// Where the active pre-tokenizer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerSource {
    /// Chosen by the caller.
    Override,
    /// Named by `tokenizer.ggml.pre`.
    Metadata,
    /// No key; the vocabulary is LLaMA-3's, so its own pre-tokenizer is used.
    Llama3Vocab,
    /// No key and not a LLaMA-3 vocabulary: llama.cpp's default.
    Fallback,
}

/// Special-token matcher: an automaton over token texts, and the id of each pattern.
#[derive(Debug, Clone)]
struct SpecialMatcher {
    automaton: AhoCorasick,
    /// `ids[pattern index]` is the token id of that pattern.
    ids: Vec<u32>,
}

impl SpecialMatcher {
    /// Builds a matcher over the tokens `pick` selects (first id wins for duplicate
    /// texts; empty texts are skipped). `None` when no token qualifies.
    fn build(
        tokens: &[String],
        kinds: &[TokenKind],
        pick: impl Fn(TokenKind) -> bool,
    ) -> Result<Option<Self>, TokenizerError> {
        let mut seen = HashSet::new();
        let mut texts = Vec::new();
        let mut ids = Vec::new();
        for ((text, &kind), id) in tokens.iter().zip(kinds).zip(0u32..) {
            if pick(kind) && !text.is_empty() && seen.insert(text.as_str()) {
                texts.push(text.as_str());
                ids.push(id);
            }
        }
        if texts.is_empty() {
            return Ok(None);
        }
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&texts)
            .map_err(|e| TokenizerError::Bpe(format!("special-token matcher: {e}")))?;
        Ok(Some(Self { automaton, ids }))
    }
}

/// A byte-level BPE tokenizer built from a GGUF vocabulary.
///
/// * Encoding: optional BOS; the text is cut at special tokens (control tokens only
///   when `parse_special`; user-defined tokens always, as llama.cpp and HF do); each
///   remaining fragment is pre-tokenized ([`PreTokenizer`]), each piece is mapped to
///   the byte-level alphabet and merged by the HF `tokenizers` BPE model.
/// * Decoding: each id maps to fixed bytes ([`Tokenizer::token_bytes`]); control and
///   user-defined tokens decode to their text. [`Tokenizer::decode`] is lossy for
///   invalid UTF-8; [`crate::StreamDecoder`] holds back incomplete characters.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    pre: PreTokenizer,
    pre_source: PreTokenizerSource,
    splitter: Splitter,
    /// The byte-level BPE model (`tokenizer.ggml.model = gpt2`).
    bpe: Option<BPE>,
    /// The SentencePiece model (`tokenizer.ggml.model = llama`).
    spm: Option<crate::spm::Spm>,
    /// Raw vocabulary texts, indexed by id.
    tokens: Vec<String>,
    /// Token types, indexed by id.
    kinds: Vec<TokenKind>,
    /// Decoded bytes of every token, concatenated: token `i` is
    /// `bytes[offsets[i]..offsets[i + 1]]` (`offsets.len() == n_vocab + 1`).
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    /// Text -> lowest id with that text, over all tokens.
    by_text: HashMap<String, u32>,
    /// Control, unknown and user-defined tokens (for `parse_special = true`).
    specials_all: Option<SpecialMatcher>,
    /// User-defined tokens only (for `parse_special = false`).
    specials_user: Option<SpecialMatcher>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// End-of-generation ids, sorted, no duplicates.
    eog: Vec<u32>,
    llama3_vocab: bool,
    chat_format: crate::ChatFormat,
}

fn check_id(
    key: &'static str,
    id: Option<i64>,
    n_vocab: usize,
) -> Result<Option<u32>, TokenizerError> {
    let Some(id) = id else {
        return Ok(None);
    };
    match u32::try_from(id) {
        Ok(v) if usize::try_from(v).is_ok_and(|v| v < n_vocab) => Ok(Some(v)),
        _ => Err(TokenizerError::SpecialIdOutOfRange { key, id, n_vocab }),
    }
}

fn bad_merge(index: usize, merge: &str, reason: &'static str) -> TokenizerError {
    TokenizerError::BadMerge {
        index,
        merge: truncate(merge, 64),
        reason,
    }
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF metadata. `pre` overrides the pre-tokenizer;
    /// otherwise `tokenizer.ggml.pre` decides, and when it is absent the LLaMA-3
    /// pre-tokenizer is used for a LLaMA-3 vocabulary and llama.cpp's default for others.
    pub fn from_gguf(
        md: &bitnet_gguf::Metadata,
        pre: Option<PreTokenizer>,
    ) -> Result<Self, TokenizerError> {
        let mut t = Self::from_vocab(VocabData::from_metadata(md)?, pre)?;
        let text = |key: &str| md.get(key).and_then(|_| md.get_str(key).ok());
        t.chat_format = crate::ChatFormat::detect(
            text("general.architecture"),
            text("tokenizer.chat_template"),
            |s| t.token_id(s).is_some(),
        );
        Ok(t)
    }

    /// How [`Tokenizer::encode_chat`] lays out a conversation (from the file's
    /// architecture and chat template, see [`crate::ChatFormat::detect`]).
    pub fn chat_format(&self) -> crate::ChatFormat {
        self.chat_format
    }

    /// Choose the chat format (overrides what the file implied).
    pub fn set_chat_format(&mut self, f: crate::ChatFormat) {
        self.chat_format = f;
    }

    /// Builds the tokenizer from plain vocabulary data (see [`Tokenizer::from_gguf`]).
    pub fn from_vocab(v: VocabData, pre: Option<PreTokenizer>) -> Result<Self, TokenizerError> {
        let spm_model = match v.model.as_str() {
            "gpt2" => false,
            "llama" => true,
            _ => return Err(TokenizerError::UnsupportedModel(truncate(&v.model, 64))),
        };
        let n = v.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if u32::try_from(n).is_err() {
            return Err(TokenizerError::VocabTooLarge(n));
        }
        let kinds: Vec<TokenKind> = match &v.token_types {
            None => vec![TokenKind::Normal; n],
            Some(types) => {
                if types.len() != n {
                    return Err(TokenizerError::LengthMismatch {
                        key: keys::TOKEN_TYPE,
                        expected: n,
                        got: types.len(),
                    });
                }
                types
                    .iter()
                    .zip(0u32..)
                    .map(|(&ty, id)| {
                        TokenKind::from_i32(ty).ok_or(TokenizerError::BadTokenType { id, ty })
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        if let Some(len) = v.scores_len {
            if len != n {
                return Err(TokenizerError::LengthMismatch {
                    key: keys::SCORES,
                    expected: n,
                    got: len,
                });
            }
        }
        let bos = check_id(keys::BOS_ID, v.bos, n)?;
        let eos = check_id(keys::EOS_ID, v.eos, n)?;
        let eot_key = check_id(keys::EOT_ID, v.eot, n)?;
        let eom_key = check_id(keys::EOM_ID, v.eom, n)?;
        let pad = check_id(keys::PAD_ID, v.pad, n)?;

        let mut by_text: HashMap<String, u32> = HashMap::with_capacity(n);
        for (t, id) in v.tokens.iter().zip(0u32..) {
            by_text.entry(t.clone()).or_insert(id);
        }
        let is_control = |text: &str| {
            by_text
                .get(text)
                .and_then(|&id| kinds.get(usize::try_from(id).ok()?))
                .is_some_and(|k| *k == TokenKind::Control)
        };
        let llama3_vocab = LLAMA3_MARKERS.iter().all(|m| is_control(m));

        // An empty name counts as absent, as in llama.cpp.
        let pre_key = v.pre.as_deref().filter(|name| !name.is_empty());
        let (pre, pre_source) = match (pre, pre_key) {
            (Some(p), _) => (p, PreTokenizerSource::Override),
            (None, Some(name)) => (
                PreTokenizer::from_gguf_name(name)?,
                PreTokenizerSource::Metadata,
            ),
            (None, None) if llama3_vocab => (PreTokenizer::Llama3, PreTokenizerSource::Llama3Vocab),
            (None, None) => (PreTokenizer::Default, PreTokenizerSource::Fallback),
        };

        // Decoded bytes of every token.
        let mut bytes = Vec::with_capacity(v.tokens.iter().map(String::len).sum());
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for (t, k) in v.tokens.iter().zip(&kinds) {
            match (k, spm_model) {
                (TokenKind::Control | TokenKind::UserDefined, _) => {
                    bytes.extend_from_slice(t.as_bytes());
                }
                (TokenKind::Byte, true) => match crate::spm::byte_token(t) {
                    Some(b) => bytes.push(b),
                    None => bytes.extend_from_slice(t.as_bytes()),
                },
                (_, true) => bytes.extend_from_slice(crate::spm::Spm::piece_text(t).as_bytes()),
                (_, false) => bytelevel::decode_into(t, &mut bytes),
            }
            offsets.push(bytes.len());
        }

        let (bpe, spm) = if spm_model {
            let scores = v.scores.clone().unwrap_or_else(|| vec![0.0; n]);
            if scores.len() != n {
                return Err(TokenizerError::LengthMismatch {
                    key: keys::SCORES,
                    expected: n,
                    got: scores.len(),
                });
            }
            let prefix = v.add_space_prefix.unwrap_or(true);
            (None, Some(crate::spm::Spm::new(&v.tokens, scores, prefix)))
        } else {
            let bpe = build_bpe(&v.tokens, &kinds, &v.merges, pre.ignore_merges())?;
            (Some(bpe), None)
        };
        let specials_all = SpecialMatcher::build(&v.tokens, &kinds, |k| k.is_special())?;
        let specials_user =
            SpecialMatcher::build(&v.tokens, &kinds, |k| k == TokenKind::UserDefined)?;

        let eot = eot_key.or_else(|| by_text.get(crate::tokenizer::EOT_TEXT).copied());
        let eom = eom_key.or_else(|| by_text.get(EOM_TEXT).copied());
        let mut eog: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
        eog.sort_unstable();
        eog.dedup();

        // Without `add_bos_token`, llama.cpp adds BOS for a SentencePiece vocabulary and for the
        // LLaMA-3 pre-tokenizer (named in the file; here also a LLaMA-3 vocabulary naming none).
        let llama3_pre = match pre_key {
            Some(name) => matches!(PreTokenizer::from_gguf_name(name), Ok(PreTokenizer::Llama3)),
            None => llama3_vocab,
        };
        let add_bos = v.add_bos.unwrap_or(spm_model || llama3_pre) && bos.is_some();
        let add_eos = v.add_eos.unwrap_or(false) && eos.is_some();
        Ok(Self {
            splitter: Splitter::new(pre)?,
            pre,
            pre_source,
            bpe,
            spm,
            tokens: v.tokens,
            kinds,
            bytes,
            offsets,
            by_text,
            specials_all,
            specials_user,
            bos,
            eos,
            eot,
            eom,
            pad,
            add_bos,
            add_eos,
            eog,
            llama3_vocab,
            chat_format: crate::ChatFormat::Bitnet,
        })
    }

    /// Number of token ids.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// The BOS id, if the vocabulary defines one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The EOS id, if the vocabulary defines one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The end-of-turn id (`eot_token_id`, else the `<|eot_id|>` token), if any.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// The end-of-message id (`eom_token_id`, else the `<|eom_id|>` token), if any.
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }

    /// The padding id, if the vocabulary defines one.
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// Whether prompts should start with BOS: `tokenizer.ggml.add_bos_token`, or, when
    /// absent, true for a SentencePiece vocabulary and for the LLaMA-3 pre-tokenizer (as
    /// llama.cpp decides); always false without a BOS id.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether an input ends with EOS (`tokenizer.ggml.add_eos_token`; false without an EOS
    /// id). Embedding models that pool the last position ask for it (Qwen 3's); llama.cpp
    /// appends it wherever it adds special tokens, this crate where a caller asks (embeddings).
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// The active pre-tokenizer.
    pub fn pre(&self) -> PreTokenizer {
        self.pre
    }

    /// Where the active pre-tokenizer came from.
    pub fn pre_source(&self) -> PreTokenizerSource {
        self.pre_source
    }

    /// Whether the vocabulary was recognised as LLaMA-3's (gpt2 model whose
    /// `<|begin_of_text|>`, `<|end_of_text|>`, `<|start_header_id|>`,
    /// `<|end_header_id|>` and `<|eot_id|>` are control tokens).
    pub fn is_llama3_vocab(&self) -> bool {
        self.llama3_vocab
    }

    /// The type of a token, or `None` for an out-of-range id.
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(usize::try_from(id).ok()?).copied()
    }

    /// Whether `id` ends generation (EOS, end-of-turn, end-of-message).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation ids, sorted.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// The lowest id whose raw vocabulary text is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.by_text.get(text).copied()
    }

    fn index(&self, id: u32) -> Result<usize, TokenizerError> {
        usize::try_from(id)
            .ok()
            .filter(|&i| i < self.tokens.len())
            .ok_or(TokenizerError::TokenOutOfRange {
                id,
                n_vocab: self.tokens.len(),
            })
    }

    /// The raw vocabulary text of a token (byte-level alphabet for BPE tokens).
    pub fn piece(&self, id: u32) -> Result<&str, TokenizerError> {
        let i = self.index(id)?;
        Ok(&self.tokens[i])
    }

    /// The bytes a token decodes to: the byte-level alphabet undone for BPE tokens,
    /// the text itself for control and user-defined tokens. May be part of a UTF-8
    /// character.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        let i = self.index(id)?;
        Ok(&self.bytes[self.offsets[i]..self.offsets[i + 1]])
    }

    /// The concatenated bytes of `ids` (see [`Tokenizer::token_bytes`]). A SentencePiece
    /// vocabulary that puts a space before its input loses that space again here, from the
    /// first token, as llama.cpp's detokenizer removes it.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let b = self.token_bytes(id)?;
            let strip = i == 0 && self.spm.as_ref().is_some_and(|s| s.add_space_prefix);
            out.extend_from_slice(match b.split_first() {
                Some((b' ', rest)) if strip => rest,
                _ => b,
            });
        }
        Ok(out)
    }

    /// Decodes ids to text; invalid UTF-8 (e.g. a character cut off at the end)
    /// becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let bytes = self.decode_bytes(ids)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// Encodes text. `add_bos` prepends BOS (an error if the vocabulary has none);
    /// `parse_special` makes control-token texts such as `<|eot_id|>` in `text` encode
    /// as those tokens rather than as plain text.
    ///
    /// With `parse_special` and a text that already starts with `<|begin_of_text|>`,
    /// pass `add_bos = false` (otherwise BOS appears twice, as in llama.cpp).
    pub fn encode(
        &self,
        text: &str,
        add_bos: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            ids.push(self.bos.ok_or(TokenizerError::NoBosToken)?);
        }
        self.encode_into(text, parse_special, &mut ids)?;
        Ok(ids)
    }

    /// Appends the ids of `text` (no BOS) to `ids`.
    pub(crate) fn encode_into(
        &self,
        text: &str,
        parse_special: bool,
        ids: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let matcher = if parse_special {
            &self.specials_all
        } else {
            &self.specials_user
        };
        let mut scratch = String::new();
        let Some(m) = matcher else {
            return self.encode_fragment(text, true, ids, &mut scratch);
        };
        let (mut prev, mut first) = (0, true);
        for hit in m.automaton.find_iter(text) {
            let gap = &text[prev..hit.start()];
            if !gap.is_empty() {
                self.encode_fragment(gap, first, ids, &mut scratch)?;
            }
            ids.push(m.ids[hit.pattern().as_usize()]);
            (prev, first) = (hit.end(), true);
        }
        self.encode_fragment(&text[prev..], first, ids, &mut scratch)
    }

    /// Encodes the concatenation of `segments` as one text, parsing special-token text only
    /// inside the segments marked `true` (user-defined tokens everywhere, as
    /// [`Tokenizer::encode_into`] without parsing): the text between two special tokens is
    /// pre-tokenized whole, across segment boundaries, as if the text were tokenized at once.
    pub(crate) fn encode_segments(
        &self,
        segments: &[(&str, bool)],
        ids: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let mut text = String::new();
        let mut hits: Vec<(usize, usize, u32)> = Vec::new();
        for &(seg, parse_special) in segments {
            let base = text.len();
            text.push_str(seg);
            let matcher = if parse_special {
                &self.specials_all
            } else {
                &self.specials_user
            };
            if let Some(m) = matcher {
                for hit in m.automaton.find_iter(seg) {
                    let id = m.ids[hit.pattern().as_usize()];
                    hits.push((base + hit.start(), base + hit.end(), id));
                }
            }
        }
        let mut scratch = String::new();
        let (mut prev, mut first) = (0, true);
        for (start, end, id) in hits {
            if start > prev {
                self.encode_fragment(&text[prev..start], first, ids, &mut scratch)?;
            }
            ids.push(id);
            (prev, first) = (end, true);
        }
        self.encode_fragment(&text[prev..], first, ids, &mut scratch)
    }

    /// Pre-tokenizes and BPE-encodes text that contains no special tokens (SentencePiece:
    /// `first` = it starts the input or follows a special token, see [`crate::spm`]).
    fn encode_fragment(
        &self,
        text: &str,
        first: bool,
        ids: &mut Vec<u32>,
        scratch: &mut String,
    ) -> Result<(), TokenizerError> {
        if text.is_empty() {
            return Ok(());
        }
        if let Some(spm) = &self.spm {
            return spm.encode(text, first, &self.by_text, ids);
        }
        let Some(bpe) = &self.bpe else {
            return Ok(());
        };
        for piece in self.splitter.split(text)? {
            bytelevel::encode_into(piece, scratch);
            let toks = bpe
                .tokenize(scratch)
                .map_err(|e| TokenizerError::Bpe(e.to_string()))?;
            ids.extend(toks.iter().map(|t| t.id));
        }
        Ok(())
    }

    /// Splits text into the pieces the pre-tokenizer gives BPE (for inspection).
    pub fn pre_tokenize<'t>(&self, text: &'t str) -> Result<Vec<&'t str>, TokenizerError> {
        self.splitter.split(text)
    }
}

/// Validates the merges and builds the HF BPE model over the non-special tokens.
fn build_bpe(
    tokens: &[String],
    kinds: &[TokenKind],
    merges: &[String],
    ignore_merges: bool,
) -> Result<BPE, TokenizerError> {
    // BPE vocabulary: every token that BPE may produce (not control / user-defined /
    // unknown, which are matched by text). The lowest id wins for duplicate texts.
    let mut vocab: Vocab = Vocab::default();
    for ((text, kind), id) in tokens.iter().zip(kinds).zip(0u32..) {
        if !kind.is_special() {
            vocab.entry(text.clone()).or_insert(id);
        }
    }
    // Every byte must have a token, or BPE would silently drop input bytes.
    for (b, c) in (0u8..=255).zip(BYTE_TO_CHAR) {
        let mut buf = [0u8; 4];
        if !vocab.contains_key(&*c.encode_utf8(&mut buf)) {
            return Err(TokenizerError::MissingByteToken(b));
        }
    }
    let mut seen: HashSet<(u32, u32)> = HashSet::with_capacity(merges.len());
    let mut pairs = Vec::with_capacity(merges.len());
    let mut joined = String::new();
    for (index, m) in merges.iter().enumerate() {
        let Some((left, right)) = m.split_once(' ') else {
            return Err(bad_merge(index, m, "no space separating the two tokens"));
        };
        if left.is_empty() || right.is_empty() {
            return Err(bad_merge(index, m, "an empty side"));
        }
        let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) else {
            return Err(bad_merge(index, m, "a side is not a BPE token"));
        };
        joined.clear();
        joined.push_str(left);
        joined.push_str(right);
        if !vocab.contains_key(joined.as_str()) {
            return Err(bad_merge(
                index,
                m,
                "the merged token is not in the vocabulary",
            ));
        }
        // A repeated pair keeps its first (highest) priority, as in llama.cpp.
        if seen.insert((l, r)) {
            pairs.push((left.to_owned(), right.to_owned()));
        }
    }
    BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| TokenizerError::Bpe(e.to_string()))
}
