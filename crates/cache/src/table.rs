//! Per-sequence block tables. Owns each sequence's tokens, blocks and published-prefix keys; never
//! changes ref counts (the cache module does, so counts and tables change together).

use std::collections::BTreeMap;

use crate::ids::{BlockId, SeqId};
use crate::key::{BlockKey, NamespaceKey};

/// One sequence's block table.
#[derive(Clone, Debug)]
pub(crate) struct Sequence {
    pub ns: NamespaceKey,
    pub tokens: Vec<u32>,
    /// `ceil(tokens.len() / block_size)` blocks.
    pub blocks: Vec<BlockId>,
    /// Keys of `blocks[..keys.len()]`: the published prefix (or, once sealed, the prefix that was).
    pub keys: Vec<BlockKey>,
    /// Tokens whose K/V the caller marked written.
    pub written_tokens: usize,
    /// No further publishing (after a flush of its namespace or a quota refusal).
    pub sealed: bool,
}

impl Sequence {
    /// Unused token slots in this sequence's blocks.
    pub fn unused_slots(&self, block_size: usize) -> u64 {
        (self.blocks.len() * block_size - self.tokens.len()) as u64
    }
}

/// All live sequences.
#[derive(Debug, Default)]
pub(crate) struct Sequences {
    pub map: BTreeMap<SeqId, Sequence>,
    pub next: u64,
}

impl Sequences {
    pub fn insert(&mut self, seq: Sequence) -> SeqId {
        let id = SeqId(self.next);
        self.next += 1;
        self.map.insert(id, seq);
        id
    }
}
