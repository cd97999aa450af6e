//! Unicode helpers for pre-tokenisation: per-codepoint classes (`\p{L}`, `\p{N}`, `\p{P}`, `\s`)
//! exactly as llama.cpp's pre-tokenizer regexes see them, and GPT-2's byte <-> printable-char
//! mapping used by byte-level BPE vocabularies. Pure functions; never allocates per call.

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

/// Class bits of one codepoint. `DEFINED` is set for every codepoint inside the text being
/// split, so `Flags::default()` (all zero) marks "past the end of the chunk", like llama.cpp.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags(u8);

const LETTER: u8 = 1;
const NUMBER: u8 = 2;
const WHITESPACE: u8 = 4;
const PUNCT: u8 = 8;
const DEFINED: u8 = 16;

impl Flags {
    pub(crate) fn is_letter(self) -> bool {
        self.0 & LETTER != 0
    }
    pub(crate) fn is_number(self) -> bool {
        self.0 & NUMBER != 0
    }
    pub(crate) fn is_whitespace(self) -> bool {
        self.0 & WHITESPACE != 0
    }
    pub(crate) fn is_punct(self) -> bool {
        self.0 & PUNCT != 0
    }
    pub(crate) fn is_defined(self) -> bool {
        self.0 & DEFINED != 0
    }
}

const fn ascii_flags() -> [u8; 128] {
    let mut t = [DEFINED; 128];
    let mut c = 0;
    while c < 128 {
        let b = c as u8;
        if b.is_ascii_alphabetic() {
            t[c] |= LETTER;
        } else if b.is_ascii_digit() {
            t[c] |= NUMBER;
        } else if (b >= 0x09 && b <= 0x0D) || b == b' ' {
            t[c] |= WHITESPACE;
        } else if matches!(
            b,
            b'!' | b'"'
                | b'#'
                | b'%'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b','
                | b'-'
                | b'.'
                | b'/'
                | b':'
                | b';'
                | b'?'
                | b'@'
                | b'['
                | b'\\'
                | b']'
                | b'_'
                | b'{'
                | b'}'
        ) {
            t[c] |= PUNCT;
        }
        c += 1;
    }
    t
}

static ASCII_FLAGS: [u8; 128] = ascii_flags();

/// Classes of `c`: letter = general category L*, number = N*, punctuation = P*, whitespace =
/// the Unicode `White_Space` property (the same set llama.cpp uses).
pub(crate) fn flags(c: char) -> Flags {
    let cp = c as u32;
    if cp < 128 {
        return Flags(ASCII_FLAGS[cp as usize]);
    }
    let mut f = DEFINED;
    f |= match get_general_category(c) {
        Gc::UppercaseLetter
        | Gc::LowercaseLetter
        | Gc::TitlecaseLetter
        | Gc::ModifierLetter
        | Gc::OtherLetter => LETTER,
        Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber => NUMBER,
        Gc::ConnectorPunctuation
        | Gc::DashPunctuation
        | Gc::OpenPunctuation
        | Gc::ClosePunctuation
        | Gc::InitialPunctuation
        | Gc::FinalPunctuation
        | Gc::OtherPunctuation => PUNCT,
        _ => 0,
    };
    if c.is_whitespace() {
        f |= WHITESPACE;
    }
    Flags(f)
}

/// GPT-2 byte -> codepoint table: printable bytes map to themselves, the other 68 bytes to
/// U+0100.. in byte order.
const fn byte_to_cp_table() -> [u16; 256] {
    let mut t = [0u16; 256];
    let mut n = 0u16;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if printable {
            t[b] = b as u16;
        } else {
            t[b] = 256 + n;
            n += 1;
        }
        b += 1;
    }
    t
}

static BYTE_TO_CP: [u16; 256] = byte_to_cp_table();

/// Highest codepoint the byte-level mapping produces, plus one.
const CP_LIMIT: usize = 256 + 68;

const fn cp_to_byte_table() -> [i16; CP_LIMIT] {
    let fwd = byte_to_cp_table();
    let mut t = [-1i16; CP_LIMIT];
    let mut b = 0usize;
    while b < 256 {
        t[fwd[b] as usize] = b as i16;
        b += 1;
    }
    t
}

static CP_TO_BYTE: [i16; CP_LIMIT] = cp_to_byte_table();

/// The printable character GPT-2's byte-level BPE uses for byte `b`.
pub fn byte_to_char(b: u8) -> char {
    // Every table entry is below U+0144, a valid scalar value.
    char::from_u32(u32::from(BYTE_TO_CP[b as usize])).unwrap_or('\u{FFFD}')
}

/// Inverse of [`byte_to_char`]; `None` for characters outside the byte-level alphabet.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as usize;
    if cp < CP_LIMIT {
        let b = CP_TO_BYTE[cp];
        if b >= 0 {
            return Some(b as u8);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_mapping_is_a_bijection() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(char_to_byte('€'), None);
    }

    #[test]
    fn classes_match_unicode_categories() {
        assert!(flags('a').is_letter() && flags('é').is_letter() && flags('中').is_letter());
        assert!(flags('7').is_number() && flags('٣').is_number() && flags('Ⅻ').is_number());
        assert!(!flags('Ⅻ').is_letter(), "Nl is a number, not a letter");
        assert!(flags('\u{3000}').is_whitespace() && flags('\t').is_whitespace());
        assert!(!flags('\u{1C}').is_whitespace());
        assert!(flags('!').is_punct() && flags('«').is_punct() && !flags('$').is_punct());
        let e = flags('😊');
        assert!(e.is_defined() && !e.is_letter() && !e.is_number() && !e.is_whitespace());
        assert!(!Flags::default().is_defined());
    }
}
