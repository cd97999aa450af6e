//! Longest-prefix lookup and the hand-off from a lookup to a sequence. Walks the hash chain from
//! the namespace root, one index probe per full block: O(prefix length).

use super::{KvCache, OutstandingMatch, PrefixMiss};
use crate::error::SeqError;
use crate::ids::{BlockId, SeqId, Tick};
use crate::key::{BlockKey, NamespaceKey};
use crate::table::Sequence;

/// The cached prefix found by [`KvCache::lookup`]. Its blocks hold one reference each until the
/// match is turned into a sequence ([`KvCache::create_sequence`]) or released
/// ([`KvCache::release_match`]).
#[must_use = "a prefix match holds block references until create_sequence or release_match"]
#[derive(Debug)]
pub struct PrefixMatch {
    pub(crate) id: u64,
    pub(crate) ns: NamespaceKey,
    pub(crate) blocks: Vec<BlockId>,
    pub(crate) keys: Vec<BlockKey>,
    /// The matched tokens (`blocks.len() · block_size`).
    pub(crate) tokens: Vec<u32>,
    /// Why the match ended before the prompt's last full block (`None`: it did not).
    pub(crate) miss: Option<PrefixMiss>,
}

impl PrefixMatch {
    /// The cached blocks, in chain order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }
    /// Prompt tokens whose K/V is cached (a whole number of blocks, always < the prompt length).
    pub fn num_cached_tokens(&self) -> usize {
        self.tokens.len()
    }
    /// The namespace looked up.
    pub fn namespace(&self) -> NamespaceKey {
        self.ns
    }
    /// Why the cached prefix ended where it did, if it ended before the prompt's last full block.
    pub fn miss(&self) -> Option<PrefixMiss> {
        self.miss
    }
}

/// Result of walking a prompt's hash chain through the index.
#[derive(Debug, Default)]
struct Walk {
    blocks: Vec<BlockId>,
    keys: Vec<BlockKey>,
    /// Key of the first block (within the lookup limit) that is not cached.
    missed: Option<BlockKey>,
}

impl KvCache {
    /// Walk the chain of `tokens` in `ns`; return the cached blocks of the longest prefix of at most
    /// `max_blocks` full blocks, with their keys, and the key of the first block within
    /// `max_blocks` that is not cached (already computed by the walk, so free).
    fn walk(&self, ns: &NamespaceKey, tokens: &[u32], max_blocks: usize) -> Walk {
        let mut walk = Walk::default();
        let mut parent = ns.root();
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let key = BlockKey::chain(&parent, chunk);
            match self.index.get(&key) {
                Some(id) => {
                    walk.blocks.push(id);
                    walk.keys.push(key);
                    parent = key;
                }
                None => {
                    walk.missed = Some(key);
                    break;
                }
            }
        }
        walk
    }

    /// Full blocks a lookup may match: whole blocks only, and at least one prompt token left to
    /// compute (a fully cached prompt still recomputes its last token for logits).
    pub(crate) fn max_lookup_blocks(&self, num_tokens: usize) -> usize {
        num_tokens.saturating_sub(1) / self.block_size
    }

    /// Cached prompt tokens `lookup` would return, without referencing or touching anything.
    pub fn peek_prefix(&self, ns: &NamespaceKey, tokens: &[u32]) -> usize {
        let walk = self.walk(ns, tokens, self.max_lookup_blocks(tokens.len()));
        walk.blocks.len() * self.block_size
    }

    /// Find the longest cached prefix of `tokens` in `ns`, reference its blocks and count a hit on
    /// each. Counts the lookup in the global and tenant counters (until it is released: a match
    /// given back with [`KvCache::release_match`] is not counted, so a request retried while it
    /// waits for blocks counts once, when it is admitted).
    pub fn lookup(&mut self, ns: &NamespaceKey, tokens: &[u32], tick: Tick) -> PrefixMatch {
        let now = self.advance(tick);
        let Walk {
            blocks,
            keys,
            missed,
        } = self.walk(ns, tokens, self.max_lookup_blocks(tokens.len()));
        let parent = keys.last().copied().unwrap_or_else(|| ns.root());
        let miss = self.explain_miss(tokens, blocks.len(), &parent, missed.as_ref());
        for &id in &blocks {
            self.acquire(id);
            self.touch(id, now, true);
        }
        if let Some(key) = missed {
            // Adaptive segmented LRU: stopping at a recently evicted key adapts the segment.
            self.ghost_on_miss(&key);
        }
        let hit_tokens = blocks.len() * self.block_size;
        let miss_tokens = tokens.len() - hit_tokens;
        self.counters.lookups += 1;
        self.counters.lookup_hit_tokens += hit_tokens as u64;
        self.counters.lookup_miss_tokens += miss_tokens as u64;
        let t = self.tenants.get_mut(ns.tenant());
        t.lookups += 1;
        t.hit_tokens += hit_tokens as u64;
        t.miss_tokens += miss_tokens as u64;
        let id = self.next_match;
        self.next_match += 1;
        self.matches.insert(
            id,
            OutstandingMatch {
                ns: *ns,
                blocks: blocks.clone(),
                sealed: false,
                hit_tokens,
                miss_tokens,
            },
        );
        PrefixMatch {
            id,
            ns: *ns,
            blocks,
            keys,
            tokens: tokens[..hit_tokens].to_vec(),
            miss,
        }
    }

    /// Turn a prefix match into a sequence whose block table starts with the matched blocks (the
    /// references move to the sequence). Append the rest of the prompt with
    /// [`KvCache::append_tokens`].
    pub fn create_sequence(&mut self, m: PrefixMatch) -> Result<SeqId, SeqError> {
        let outstanding = self
            .matches
            .remove(&m.id)
            .ok_or(SeqError::UnknownPrefixMatch)?;
        let seq = Sequence {
            ns: m.ns,
            written_tokens: m.tokens.len(),
            tokens: m.tokens,
            blocks: m.blocks,
            keys: m.keys,
            sealed: outstanding.sealed,
        };
        Ok(self.seqs.insert(seq))
    }

    /// An empty sequence in `ns` (no cached prefix).
    pub fn create_empty_sequence(&mut self, ns: &NamespaceKey) -> SeqId {
        self.seqs.insert(Sequence {
            ns: *ns,
            tokens: Vec::new(),
            blocks: Vec::new(),
            keys: Vec::new(),
            written_tokens: 0,
            sealed: false,
        })
    }

    /// Give back the references of a match that will not become a sequence.
    pub fn release_match(&mut self, m: PrefixMatch, tick: Tick) -> Result<(), SeqError> {
        let now = self.advance(tick);
        let outstanding = self
            .matches
            .remove(&m.id)
            .ok_or(SeqError::UnknownPrefixMatch)?;
        for &id in outstanding.blocks.iter().rev() {
            self.release(id, now);
        }
        // Not used: take back what `lookup` counted (same step, so no scrape sees the difference).
        let (hit, miss) = (
            outstanding.hit_tokens as u64,
            outstanding.miss_tokens as u64,
        );
        let c = &mut self.counters;
        c.lookups = c.lookups.saturating_sub(1);
        c.lookup_hit_tokens = c.lookup_hit_tokens.saturating_sub(hit);
        c.lookup_miss_tokens = c.lookup_miss_tokens.saturating_sub(miss);
        let t = self.tenants.get_mut(outstanding.ns.tenant());
        t.lookups = t.lookups.saturating_sub(1);
        t.hit_tokens = t.hit_tokens.saturating_sub(hit);
        t.miss_tokens = t.miss_tokens.saturating_sub(miss);
        self.enforce_watermark();
        Ok(())
    }
}
