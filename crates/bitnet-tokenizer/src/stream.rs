//! Incremental detokenization that never emits part of a UTF-8 character.

use crate::{Tokenizer, TokenizerError};

/// Turns a stream of token ids into text pieces. Bytes of a character that is split
/// across tokens are held back until the character is complete; bytes that can never
/// form a character become U+FFFD at once. [`StreamDecoder::finish`] flushes what is
/// left (an incomplete character at the end becomes U+FFFD).
///
/// The concatenation of every `push` result and `finish` equals
/// [`Tokenizer::decode`] of the same ids.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    /// Bytes not yet emitted: at most the start of one incomplete character (< 4 bytes)
    /// between calls.
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token and returns the text that became complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        let bytes = tok.token_bytes(id)?;
        Ok(self.push_bytes(bytes))
    }

    /// Adds raw bytes and returns the text that became complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is valid UTF-8 by construction of `valid_up_to`.
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        // An invalid sequence: replace it and go on.
                        Some(len) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[len.min(after.len())..];
                        }
                        // An incomplete character at the end: hold it back.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
        out
    }

    /// Whether bytes of an incomplete character are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Flushes the held-back bytes (lossy) and resets the decoder.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_split_characters() {
        let mut d = StreamDecoder::new();
        let s = "é🙂";
        let b = s.as_bytes();
        assert_eq!(d.push_bytes(&b[..1]), "");
        assert!(d.has_pending());
        assert_eq!(d.push_bytes(&b[1..3]), "é");
        assert_eq!(d.push_bytes(&b[3..5]), "");
        assert_eq!(d.push_bytes(&b[5..]), "🙂");
        assert_eq!(d.finish(), "");
    }

    #[test]
    fn invalid_bytes_are_replaced_not_held() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push_bytes(&[b'a', 0xFF, b'b']), "a\u{FFFD}b");
        // A lead byte followed by a non-continuation byte.
        assert_eq!(d.push_bytes(&[0xE6]), "");
        assert_eq!(d.push_bytes(b"x"), "\u{FFFD}x");
        // Truncated at the end: flushed lossy.
        assert_eq!(d.push_bytes(&[0xF0, 0x9F]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
        assert!(!d.has_pending());
    }
}
