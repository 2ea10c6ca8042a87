//! SentencePiece-style BPE over scored pieces (`tokenizer.ggml.model = llama`, the LLaMA-2
//! vocabulary of 1bitLLM's models), as llama.cpp's `llm_tokenizer_spm` encodes:
//!
//! the text (a space put before it when it starts the input or follows a special token and
//! `add_space_prefix` is set, every space written U+2581) is cut into UTF-8 characters; every
//! adjacent pair whose concatenation is a piece enters a queue ordered by the piece's score
//! (highest first, then leftmost); the best pair still current merges and its new neighbours
//! enter the queue, until it is empty. Each final symbol is its piece, or, when its text is no
//! piece, the two symbols the last merge of that text joined (recursively), or its bytes as
//! `<0xXX>` tokens.

use std::collections::{BinaryHeap, HashMap};

use crate::TokenizerError;

/// The piece scores and byte tokens of a SentencePiece vocabulary.
#[derive(Debug, Clone)]
pub(crate) struct Spm {
    scores: Vec<f32>,
    byte_ids: Vec<Option<u32>>,
    pub(crate) add_space_prefix: bool,
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    n: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge: higher score first, then the smaller left index (llama.cpp's order).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Spm {
    /// `scores` (one per token; zeros when the file has none) and the `<0xXX>` byte tokens.
    pub(crate) fn new(tokens: &[String], scores: Vec<f32>, add_space_prefix: bool) -> Self {
        let mut byte_ids = vec![None; 256];
        for (t, id) in tokens.iter().zip(0u32..) {
            if let Some(b) = byte_token(t) {
                let slot = &mut byte_ids[usize::from(b)];
                if slot.is_none() {
                    *slot = Some(id);
                }
            }
        }
        Spm {
            scores,
            byte_ids,
            add_space_prefix,
        }
    }

    /// The text a piece stands for: U+2581 as a space.
    pub(crate) fn piece_text(piece: &str) -> String {
        piece.replace('\u{2581}', " ")
    }

    /// Appends the ids of `raw` (no special tokens in it); `first`: it starts the input or
    /// follows a special token.
    pub(crate) fn encode(
        &self,
        raw: &str,
        first: bool,
        by_text: &HashMap<String, u32>,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let mut text = String::with_capacity(raw.len() + 3);
        if self.add_space_prefix && first {
            text.push('\u{2581}');
        }
        for c in raw.chars() {
            if c == ' ' {
                text.push('\u{2581}');
            } else {
                text.push(c);
            }
        }
        let mut syms: Vec<Symbol> = Vec::new();
        for (i, (start, c)) in text.char_indices().enumerate() {
            let end = start + c.len_utf8();
            syms.push(Symbol {
                start,
                n: c.len_utf8(),
                prev: i.checked_sub(1),
                next: (end < text.len()).then_some(i + 1),
            });
        }
        let mut queue = BinaryHeap::new();
        let mut rev: HashMap<String, (usize, usize)> = HashMap::new();
        let add = |l: Option<usize>,
                   r: Option<usize>,
                   syms: &[Symbol],
                   queue: &mut BinaryHeap<Bigram>,
                   rev: &mut HashMap<String, (usize, usize)>| {
            let (Some(l), Some(r)) = (l, r) else { return };
            let s = syms[l].start;
            let piece = &text[s..s + syms[l].n + syms[r].n];
            let Some(&id) = by_text.get(piece) else {
                return;
            };
            let Some(&score) = usize::try_from(id).ok().and_then(|i| self.scores.get(i)) else {
                return;
            };
            queue.push(Bigram {
                score,
                left: l,
                right: r,
                size: piece.len(),
            });
            rev.insert(piece.to_string(), (l, r));
        };
        for i in 1..syms.len() {
            add(Some(i - 1), Some(i), &syms, &mut queue, &mut rev);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (syms[b.left], syms[b.right]);
            if l.n == 0 || r.n == 0 || l.n + r.n != b.size {
                continue;
            }
            syms[b.left].n += r.n;
            syms[b.right].n = 0;
            syms[b.left].next = r.next;
            if let Some(nx) = r.next {
                syms[nx].prev = Some(b.left);
            }
            let left = syms[b.left];
            add(left.prev, Some(b.left), &syms, &mut queue, &mut rev);
            add(Some(b.left), left.next, &syms, &mut queue, &mut rev);
        }
        let mut i = if syms.is_empty() { None } else { Some(0) };
        while let Some(k) = i {
            self.resegment(&text, &syms, k, by_text, &rev, out, 0)?;
            i = syms[k].next;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn resegment(
        &self,
        text: &str,
        syms: &[Symbol],
        k: usize,
        by_text: &HashMap<String, u32>,
        rev: &HashMap<String, (usize, usize)>,
        out: &mut Vec<u32>,
        depth: usize,
    ) -> Result<(), TokenizerError> {
        let s = syms[k];
        let piece = &text[s.start..s.start + s.n];
        if let Some(&id) = by_text.get(piece) {
            out.push(id);
            return Ok(());
        }
        // A merge chain is at most as deep as the text is long.
        if let Some(&(l, r)) = rev.get(piece).filter(|_| depth < text.len()) {
            self.resegment(text, syms, l, by_text, rev, out, depth + 1)?;
            return self.resegment(text, syms, r, by_text, rev, out, depth + 1);
        }
        for &b in piece.as_bytes() {
            out.push(self.byte_ids[usize::from(b)].ok_or(TokenizerError::MissingByteToken(b))?);
        }
        Ok(())
    }
}

/// The byte of a `<0xXX>` token text.
pub(crate) fn byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
