//! Byte-level BPE merging (GPT-2 style, `tokenizer.ggml.model = "gpt2"`): turns one
//! pre-tokenised word into token ids by repeatedly merging the adjacent pair with the lowest
//! merge rank (leftmost first on ties), exactly like llama.cpp's `llm_tokenizer_bpe_session`.
//! Works on token ids instead of strings (a pair is looked up as `(left_id, right_id)`), which is
//! equivalent because token texts are unique. Never splits text; never handles special tokens.

use super::unicode::byte_to_char;
use super::TokenizerError;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplicative hasher for the `u64` pair keys (FxHash's constant); SipHash would dominate the
/// merge loop.
#[derive(Default)]
pub(crate) struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type PairMap = HashMap<u64, Merge, BuildHasherDefault<PairHasher>>;

#[derive(Clone, Copy, Debug)]
struct Merge {
    rank: u32,
    merged_id: u32,
}

fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// Marks a byte whose byte-level character is not a token (llama.cpp drops such bytes).
const NO_TOKEN: u32 = u32::MAX;

/// The merge table of a byte-level BPE vocabulary.
#[derive(Clone, Debug)]
pub(crate) struct BpeModel {
    /// Token id of the single byte-level character of each byte.
    byte_token: [u32; 256],
    merges: PairMap,
}

/// A candidate merge in the priority queue: lowest rank first, then leftmost.
#[derive(PartialEq, Eq)]
struct Candidate {
    rank: u32,
    left: u32,
    right: u32,
    left_id: u32,
    right_id: u32,
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: the "greatest" candidate is the lowest rank, then leftmost.
        other.rank.cmp(&self.rank).then(other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: u32,
    next: u32,
    alive: bool,
}

const NONE: u32 = u32::MAX;

/// Reusable buffers for [`BpeModel::encode_word`].
#[derive(Default)]
pub(crate) struct BpeScratch {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Candidate>,
}

impl BpeModel {
    /// Builds the merge table. `merges[i]` is `"left right"` with rank `i`; merges whose parts or
    /// result are not tokens can never fire on token ids and are skipped.
    pub(crate) fn new(
        token_to_id: &HashMap<String, u32>,
        merges: &[&str],
    ) -> Result<Self, TokenizerError> {
        let mut byte_token = [NO_TOKEN; 256];
        for (b, slot) in byte_token.iter_mut().enumerate() {
            let s = byte_to_char(b as u8).to_string();
            if let Some(&id) = token_to_id.get(&s) {
                *slot = id;
            }
        }
        let mut map = PairMap::with_capacity_and_hasher(merges.len(), Default::default());
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let Some(sp) = m
                .as_bytes()
                .iter()
                .skip(1)
                .position(|&b| b == b' ')
                .map(|i| i + 1)
            else {
                return Err(TokenizerError::InvalidVocab(format!(
                    "merge {rank} `{m}` has no space"
                )));
            };
            let (left, right) = (&m[..sp], &m[sp + 1..]);
            let (Some(&l), Some(&r)) = (token_to_id.get(left), token_to_id.get(right)) else {
                continue;
            };
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let Some(&merged_id) = token_to_id.get(joined.as_str()) else {
                continue;
            };
            let rank = u32::try_from(rank)
                .map_err(|_| TokenizerError::InvalidVocab("too many merges".into()))?;
            // First (lowest) rank wins for duplicated pairs, as in llama.cpp's map insert.
            map.entry(pair_key(l, r))
                .or_insert(Merge { rank, merged_id });
        }
        Ok(Self {
            byte_token,
            merges: map,
        })
    }

    fn lookup(&self, left: u32, right: u32) -> Option<Merge> {
        if left == NO_TOKEN || right == NO_TOKEN {
            return None;
        }
        self.merges.get(&pair_key(left, right)).copied()
    }

    fn push_candidate(&self, s: &mut BpeScratch, left: u32, right: u32) {
        if left == NONE || right == NONE {
            return;
        }
        let (l, r) = (s.symbols[left as usize].id, s.symbols[right as usize].id);
        if let Some(m) = self.lookup(l, r) {
            s.queue.push(Candidate {
                rank: m.rank,
                left,
                right,
                left_id: l,
                right_id: r,
            });
        }
    }

    /// Appends the tokens of one word (raw UTF-8 bytes; byte-level mapping applied here).
    pub(crate) fn encode_word(&self, word: &[u8], out: &mut Vec<u32>, s: &mut BpeScratch) {
        if word.len() == 1 {
            let id = self.byte_token[word[0] as usize];
            if id != NO_TOKEN {
                out.push(id);
            }
            return;
        }
        s.symbols.clear();
        s.queue.clear();
        let n = word.len() as u32;
        for (i, &b) in word.iter().enumerate() {
            let i = i as u32;
            s.symbols.push(Symbol {
                id: self.byte_token[b as usize],
                prev: if i == 0 { NONE } else { i - 1 },
                next: if i + 1 == n { NONE } else { i + 1 },
                alive: true,
            });
        }
        for i in 1..n {
            self.push_candidate(s, i - 1, i);
        }
        while let Some(c) = s.queue.pop() {
            let (li, ri) = (c.left as usize, c.right as usize);
            let (l, r) = (s.symbols[li], s.symbols[ri]);
            if !l.alive || !r.alive || l.id != c.left_id || r.id != c.right_id || l.next != c.right
            {
                continue; // stale
            }
            let Some(m) = self.lookup(l.id, r.id) else {
                continue;
            };
            s.symbols[li].id = m.merged_id;
            s.symbols[li].next = r.next;
            s.symbols[ri].alive = false;
            if r.next != NONE {
                s.symbols[r.next as usize].prev = c.left;
            }
            self.push_candidate(s, l.prev, c.left);
            self.push_candidate(s, c.left, r.next);
        }
        let mut i = 0u32;
        while i != NONE {
            let sym = s.symbols[i as usize];
            if sym.id != NO_TOKEN {
                out.push(sym.id);
            }
            i = sym.next;
        }
    }
}
