//! GPT-2 byte-level alphabet: every byte is written as one printable character, so BPE
//! vocabularies can be stored as text. Bytes `!..=~`, `¡..=¬` and `®..=ÿ` stand for
//! themselves; the other 68 bytes map, in order, to U+0100..=U+0143 (space 0x20 is
//! `Ġ` U+0120, newline 0x0A is `Ċ` U+010A).

/// `BYTE_TO_CHAR[b]` is the character that stands for byte `b`.
pub(crate) const BYTE_TO_CHAR: [char; 256] = build_byte_to_char();

/// One past the largest code point in the alphabet (U+0143).
const ALPHABET_END: usize = 0x144;

/// `CHAR_TO_BYTE[c]` is the byte for code point `c` (< `ALPHABET_END`), or -1.
const CHAR_TO_BYTE: [i16; ALPHABET_END] = build_char_to_byte();

const fn stands_for_itself(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
}

const fn build_byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 0x100u32;
    let mut b = 0u32;
    while b < 256 {
        let cp = if stands_for_itself(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        table[b as usize] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    table
}

#[allow(clippy::cast_possible_truncation)] // b < 256 and code points < ALPHABET_END
const fn build_char_to_byte() -> [i16; ALPHABET_END] {
    let mut table = [-1i16; ALPHABET_END];
    let mut b = 0usize;
    while b < 256 {
        table[BYTE_TO_CHAR[b] as u32 as usize] = b as i16;
        b += 1;
    }
    table
}

/// The byte a byte-level character stands for, or `None` for characters outside the
/// alphabet.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let i = usize::try_from(u32::from(c)).ok()?;
    let v = *CHAR_TO_BYTE.get(i)?;
    u8::try_from(v).ok()
}

/// Writes `text`'s bytes as byte-level characters into `out` (cleared first).
pub(crate) fn encode_into(text: &str, out: &mut String) {
    out.clear();
    out.reserve(text.len() * 2);
    out.extend(text.bytes().map(|b| BYTE_TO_CHAR[usize::from(b)]));
}

/// Appends the bytes a byte-level token text stands for. Characters outside the
/// alphabet (only in malformed vocabularies) are kept as their own UTF-8 bytes.
pub(crate) fn decode_into(token: &str, out: &mut Vec<u8>) {
    for c in token.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_matches_gpt2() {
        // Worked examples from GPT-2's bytes_to_unicode.
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ');
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ');
        assert_eq!(BYTE_TO_CHAR[b'\t' as usize], 'ĉ');
        assert_eq!(BYTE_TO_CHAR[0], 'Ā');
        assert_eq!(BYTE_TO_CHAR[b'A' as usize], 'A');
        assert_eq!(BYTE_TO_CHAR[0xAD], 'Ń');
        assert_eq!(BYTE_TO_CHAR[0xA0], 'ł');
        assert_eq!(BYTE_TO_CHAR[0x7F], 'ġ');
        assert_eq!(BYTE_TO_CHAR[0xFF], 'ÿ');
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = BYTE_TO_CHAR[usize::from(b)];
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte(' '), None);
        assert_eq!(char_to_byte('日'), None);
    }

    #[test]
    fn round_trip() {
        let text = "Grüße\n\t 日本 🙂\u{0}";
        let mut s = String::new();
        encode_into(text, &mut s);
        assert!(!s.contains(' '));
        let mut bytes = Vec::new();
        decode_into(&s, &mut bytes);
        assert_eq!(bytes, text.as_bytes());
    }
}
