//! Incremental detokenisation for streaming: [`StreamDecoder`] turns ids pushed one at a time
//! into text, never emitting a partial UTF-8 character. The concatenation of everything it emits
//! (plus [`StreamDecoder::finish`]) equals [`Tokenizer::decode`] of all ids. Never tokenises.

use super::{Tokenizer, TokenizerError};
use std::borrow::Borrow;
use std::sync::Arc;

/// Streaming decoder over a borrowed (`&Tokenizer`) or shared (`Arc<Tokenizer>`) tokenizer.
pub struct StreamDecoder<T: Borrow<Tokenizer> = Arc<Tokenizer>> {
    tokenizer: T,
    skip_special: bool,
    /// Bytes of an incomplete UTF-8 character waiting for the next token.
    pending: Vec<u8>,
    /// Whether a token with visible text has been seen (SentencePiece strips the space prefix
    /// of the first one).
    seen_text: bool,
}

impl<T: Borrow<Tokenizer>> StreamDecoder<T> {
    /// A decoder that hides control and unknown tokens (like `decode(ids, true)`), which is what
    /// streamed generations want.
    pub fn new(tokenizer: T) -> Self {
        Self::with_skip_special(tokenizer, true)
    }

    /// A decoder with an explicit `skip_special`, as in [`Tokenizer::decode`].
    pub fn with_skip_special(tokenizer: T, skip_special: bool) -> Self {
        Self {
            tokenizer,
            skip_special,
            pending: Vec::new(),
            seen_text: false,
        }
    }

    /// Adds one token; returns the text it completes (possibly empty). An id outside the
    /// vocabulary yields U+FFFD (use [`StreamDecoder::try_push`] to get the error instead).
    pub fn push(&mut self, id: u32) -> String {
        self.try_push(id).unwrap_or_else(|_| '\u{FFFD}'.to_string())
    }

    /// Like [`StreamDecoder::push`], but an id outside the vocabulary is an error (and changes
    /// nothing).
    pub fn try_push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let tok: &Tokenizer = self.tokenizer.borrow();
        tok.append_piece(
            id,
            self.skip_special,
            &mut self.seen_text,
            &mut self.pending,
        )?;
        Ok(drain_complete_utf8(&mut self.pending))
    }

    /// Flushes what is left; an invalid or truncated tail becomes U+FFFD, as in `decode`.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// Bytes held back because they do not yet form a complete character.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }
}

/// Removes and returns the longest decodable prefix of `buf`, replacing invalid sequences with
/// U+FFFD exactly as `String::from_utf8_lossy` would, and keeping a truncated final character.
fn drain_complete_utf8(buf: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < buf.len() {
        match std::str::from_utf8(&buf[i..]) {
            Ok(s) => {
                out.push_str(s);
                i = buf.len();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(&String::from_utf8_lossy(&buf[i..i + valid]));
                match e.error_len() {
                    Some(bad) => {
                        out.push('\u{FFFD}');
                        i += valid + bad;
                    }
                    None => {
                        i += valid;
                        break;
                    }
                }
            }
        }
    }
    buf.drain(..i);
    out
}

#[cfg(test)]
mod tests {
    use super::drain_complete_utf8;

    #[test]
    fn holds_back_truncated_characters_and_matches_lossy() {
        let mut bytes = "a😊b中\u{FF}c".as_bytes().to_vec();
        bytes.insert(6, 0xFF); // an invalid byte in the middle
        let mut buf = Vec::new();
        let mut out = String::new();
        for &b in &bytes {
            buf.push(b);
            out.push_str(&drain_complete_utf8(&mut buf));
        }
        out.push_str(&String::from_utf8_lossy(&buf));
        assert_eq!(out, String::from_utf8_lossy(&bytes));
    }
}
