//! SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`): merges adjacent pieces by the
//! highest vocabulary score (leftmost first on ties) as llama.cpp's `llm_tokenizer_spm_session`
//! does, with `<0xNN>` byte fallback for characters that are not tokens. The caller has already
//! added the space prefix and replaced spaces with `▁`. Never handles special tokens.

use super::TokenizerError;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

const NONE: usize = usize::MAX;

struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate {}
impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap: highest score first, then leftmost.
        self.score
            .total_cmp(&other.score)
            .then(other.left.cmp(&self.left))
    }
}
impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// What the SentencePiece merger needs from the vocabulary.
pub(crate) struct SpmVocab<'a> {
    pub(crate) token_to_id: &'a HashMap<String, u32>,
    pub(crate) scores: &'a [f32],
    /// Token id of `<0xNN>` for each byte, if present.
    pub(crate) byte_tokens: &'a [Option<u32>; 256],
    pub(crate) unk_id: Option<u32>,
}

impl SpmVocab<'_> {
    fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    /// Appends the tokens of `text` (already escaped) to `out`.
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (i, c) in text.char_indices() {
            let idx = symbols.len();
            symbols.push(Symbol {
                start: i,
                len: c.len_utf8(),
                prev: idx.wrapping_sub(1),
                next: idx + 1,
            });
        }
        if let Some(last) = symbols.last_mut() {
            last.next = NONE;
        }
        if let Some(first) = symbols.first_mut() {
            first.prev = NONE;
        }
        let mut queue = BinaryHeap::new();
        let try_add =
            |symbols: &[Symbol], queue: &mut BinaryHeap<Candidate>, left: usize, right: usize| {
                if left == NONE || right == NONE {
                    return;
                }
                let (l, r) = (symbols[left], symbols[right]);
                let piece = &text[l.start..r.start + r.len];
                if let Some(&id) = self.token_to_id.get(piece) {
                    queue.push(Candidate {
                        score: self.score(id),
                        left,
                        right,
                        len: piece.len(),
                    });
                }
            };
        for i in 1..symbols.len() {
            try_add(&symbols, &mut queue, i - 1, i);
        }
        while let Some(c) = queue.pop() {
            let (l, r) = (symbols[c.left], symbols[c.right]);
            if l.len == 0 || r.len == 0 || l.len + r.len != c.len {
                continue;
            }
            symbols[c.left].len += r.len;
            symbols[c.right].len = 0;
            symbols[c.left].next = r.next;
            if r.next != NONE {
                symbols[r.next].prev = c.left;
            }
            try_add(&symbols, &mut queue, l.prev, c.left);
            try_add(&symbols, &mut queue, c.left, r.next);
        }
        let mut i = if symbols.is_empty() { NONE } else { 0 };
        while i != NONE {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            if let Some(&id) = self.token_to_id.get(piece) {
                out.push(id);
            } else {
                for &b in piece.as_bytes() {
                    match self.byte_tokens[b as usize].or(self.unk_id) {
                        Some(id) => out.push(id),
                        None => return Err(TokenizerError::NoByteToken(b)),
                    }
                }
            }
            i = s.next;
        }
        Ok(())
    }
}
