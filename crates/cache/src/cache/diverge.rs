//! Why a lookup's cached prefix ended where it did (requirement R24): for the first prompt block
//! the cache does not hold, the cached blocks that continue the same prefix (its *siblings*: same
//! parent key, so same namespace) are compared token by token with the prompt, and a bounded
//! record of recently evicted keys tells an eviction from a block never cached.
//!
//! Owns the sibling index (parent key → published children) and the evicted-key record; the
//! prefix index itself stays in `index.rs`. Never changes what a lookup returns or any eviction
//! order: this is diagnostics only.

use std::collections::{HashMap, VecDeque};

use super::KvCache;
use crate::ids::BlockId;
use crate::key::{BlockKey, NamespaceKey};

/// At most this many cached continuations are compared with a prompt's first missed block.
const MAX_SIBLINGS_COMPARED: usize = 64;

/// Why the cached prefix of a prompt ended at [`PrefixMiss::at_token`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MissReason {
    /// A cached block continues the same prefix with different tokens: the prompt changed at
    /// `at_token` (e.g. a timestamp or reordered tool output), compared with the best such block.
    Diverged,
    /// The next block of this exact prefix was cached and has been evicted since (pressure, not a
    /// flush): more KV memory, retention or a tier would have kept it.
    Evicted,
    /// Nothing cached continues this prefix: first time seen (or evicted too long ago to know).
    Uncached,
}

impl MissReason {
    pub fn as_str(self) -> &'static str {
        match self {
            MissReason::Diverged => "diverged",
            MissReason::Evicted => "evicted",
            MissReason::Uncached => "uncached",
        }
    }
}

/// Where and why a lookup stopped before the prompt's last full block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PrefixMiss {
    /// The first prompt token not covered by the best cached entry (for `Diverged`, inside the
    /// first missed block; otherwise its first token).
    pub at_token: usize,
    pub reason: MissReason,
}

/// Diagnostic state: which published blocks continue each parent key, and recently evicted keys.
#[derive(Debug, Default)]
pub(crate) struct Divergence {
    /// Parent key (the namespace root for a chain's first block) → published children.
    children: HashMap<BlockKey, Vec<BlockId>>,
    /// Per block index: the parent key and tokens of a published block (`None` otherwise).
    published: Vec<Option<(BlockKey, Box<[u32]>)>>,
    /// Keys evicted under pressure, oldest first, with their namespace (for flushes).
    evicted: HashMap<BlockKey, NamespaceKey>,
    evicted_order: VecDeque<BlockKey>,
    /// At most this many evicted keys are remembered (the pool size).
    cap: usize,
}

impl Divergence {
    /// For a pool of `num_blocks` (also the number of evicted keys remembered).
    pub fn new(num_blocks: usize) -> Divergence {
        Divergence {
            published: vec![None; num_blocks],
            cap: num_blocks,
            ..Divergence::default()
        }
    }

    /// Block `id` was published under `key`, continuing `parent`, holding `tokens`.
    pub fn on_publish(&mut self, parent: BlockKey, key: &BlockKey, id: BlockId, tokens: &[u32]) {
        self.children.entry(parent).or_default().push(id);
        self.published[id.index()] = Some((parent, tokens.into()));
        self.evicted.remove(key);
    }

    /// Block `id` was unpublished (evicted or flushed).
    pub fn on_unpublish(&mut self, id: BlockId) {
        let Some((parent, _)) = self.published[id.index()].take() else {
            return;
        };
        if let Some(kids) = self.children.get_mut(&parent) {
            kids.retain(|k| *k != id);
            if kids.is_empty() {
                self.children.remove(&parent);
            }
        }
    }

    /// Checks that every published block is listed once under its parent and nothing else is
    /// listed (called from `check_invariants`).
    pub fn check(&self, is_published: impl Fn(BlockId) -> bool) -> Result<(), String> {
        let mut listed = 0;
        for (parent, kids) in &self.children {
            for &id in kids {
                match &self.published[id.index()] {
                    Some((p, _)) if p == parent && is_published(id) => listed += 1,
                    _ => return Err(format!("{id}: listed as a child but not published there")),
                }
            }
        }
        let published = self.published.iter().filter(|p| p.is_some()).count();
        if listed != published {
            return Err(format!(
                "{published} blocks with diagnostics, {listed} listed as children"
            ));
        }
        if self.evicted.len() > self.cap {
            return Err(format!(
                "{} evicted keys remembered, cap {}",
                self.evicted.len(),
                self.cap
            ));
        }
        Ok(())
    }

    pub fn on_evict(&mut self, key: BlockKey, ns: NamespaceKey) {
        if self.cap == 0 {
            return;
        }
        if self.evicted.insert(key, ns).is_none() {
            self.evicted_order.push_back(key);
        }
        while self.evicted.len() > self.cap {
            let Some(old) = self.evicted_order.pop_front() else {
                break;
            };
            self.evicted.remove(&old);
        }
        // Keys forgotten on publish or flush leave stale entries in the order: compact it.
        if self.evicted_order.len() > 2 * self.cap {
            let evicted = &self.evicted;
            self.evicted_order.retain(|k| evicted.contains_key(k));
        }
    }

    pub fn on_flush(&mut self, in_scope: impl Fn(&NamespaceKey) -> bool) {
        self.evicted.retain(|_, ns| !in_scope(ns));
        let evicted = &self.evicted;
        self.evicted_order.retain(|k| evicted.contains_key(k));
    }

    /// Keys remembered as evicted (tests).
    pub fn num_evicted(&self) -> usize {
        self.evicted.len()
    }
}

impl KvCache {
    /// Why a lookup of `tokens` in `ns` that matched `matched_blocks` full blocks (chained up to
    /// `parent`, the last matched key or the namespace root) stopped there; `None` when it
    /// covered every block a lookup may match. `missed` is the key of the first unmatched block.
    pub(crate) fn explain_miss(
        &self,
        tokens: &[u32],
        matched_blocks: usize,
        parent: &BlockKey,
        missed: Option<&BlockKey>,
    ) -> Option<PrefixMiss> {
        let bs = self.block_size;
        if matched_blocks >= self.max_lookup_blocks(tokens.len()) {
            return None;
        }
        let start = matched_blocks * bs;
        let want = &tokens[start..start + bs];
        let best = self
            .divergence
            .children
            .get(parent)
            .into_iter()
            .flatten()
            // Bounded work per lookup, however many conversations share this prefix.
            .take(MAX_SIBLINGS_COMPARED)
            .filter_map(|&id| {
                let (_, toks) = self.divergence.published[id.index()].as_ref()?;
                Some(toks.iter().zip(want).take_while(|(a, b)| a == b).count())
            })
            .max();
        // The exact next block was cached and evicted: that is the reason, whatever else
        // continues the prefix.
        let evicted = missed.is_some_and(|k| self.divergence.evicted.contains_key(k));
        let (at_token, reason) = match best {
            _ if evicted => (start, MissReason::Evicted),
            Some(common) => (start + common, MissReason::Diverged),
            None => (start, MissReason::Uncached),
        };
        Some(PrefixMiss { at_token, reason })
    }

    /// Evicted keys remembered for miss diagnostics (at most the pool size).
    pub fn num_remembered_evictions(&self) -> usize {
        self.divergence.num_evicted()
    }
}
