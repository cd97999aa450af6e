//! Sequence operations: append (allocate on block boundaries), mark written (publish full blocks
//! in order), fork (share full blocks, copy the partial last block), free.

use super::KvCache;
use crate::error::SeqError;
use crate::events::CacheEvent;
use crate::ids::{BlockId, SeqId, Tick};
use crate::key::BlockKey;
use crate::pool::Published;

/// The engine must copy the first `num_tokens` slots of `src` into `dst` (copy-on-write of a
/// forked sequence's partial last block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopy {
    pub src: BlockId,
    pub dst: BlockId,
    pub num_tokens: usize,
}

/// Result of [`KvCache::fork`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fork {
    pub child: SeqId,
    pub copy: Option<BlockCopy>,
}

/// A written block whose key was already cached: the sequence's table now points at the cached
/// block (identical K/V by key) and the dropped block went back to the pool. Forks that shared
/// the dropped block switch too (same position, same tokens), so callers should re-read block
/// tables after `mark_written` rather than keep copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockReplacement {
    pub block_index: usize,
    pub dropped: BlockId,
    pub cached: BlockId,
}

/// Result of [`KvCache::mark_written`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishReport {
    /// Blocks newly published by this call.
    pub num_published: usize,
    /// Table entries replaced by an already cached block.
    pub replaced: Vec<BlockReplacement>,
    /// The tenant was at its quota with nothing of its own to evict: this block and every later
    /// block of the sequence stay private.
    pub refused_by_quota: bool,
}

impl KvCache {
    /// Append tokens to a sequence, allocating a block for every block boundary crossed.
    /// All or nothing: on [`SeqError::Alloc`] the sequence and the pool are unchanged.
    /// Returns the newly allocated blocks.
    pub fn append_tokens(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        tick: Tick,
    ) -> Result<Vec<BlockId>, SeqError> {
        self.advance(tick);
        let s = self.sequence(seq)?;
        let new_len = s.tokens.len() + tokens.len();
        let needed = new_len.div_ceil(self.block_size) - s.blocks.len();
        let new_blocks = self.allocate(needed as u32)?;
        let bs = self.block_size;
        let s = self.seqs.map.get_mut(&seq).expect("checked above");
        let before = s.unused_slots(bs);
        s.tokens.extend_from_slice(tokens);
        s.blocks.extend_from_slice(&new_blocks);
        let after = s.unused_slots(bs);
        self.unused_slots = self.unused_slots + after - before;
        Ok(new_blocks)
    }

    /// The caller has written K/V for the first `num_written_tokens` tokens: publish every full
    /// block they cover, in order (a block is visible to lookups only from here on).
    pub fn mark_written(
        &mut self,
        seq: SeqId,
        num_written_tokens: usize,
        tick: Tick,
    ) -> Result<PublishReport, SeqError> {
        let now = self.advance(tick);
        let s = self.sequence(seq)?;
        if num_written_tokens > s.tokens.len() {
            return Err(SeqError::WrittenBeyondEnd {
                seq,
                written: num_written_tokens,
                len: s.tokens.len(),
            });
        }
        let s = self.seqs.map.get_mut(&seq).expect("checked above");
        s.written_tokens = s.written_tokens.max(num_written_tokens);
        let target = s.written_tokens / self.block_size;
        let mut report = PublishReport::default();
        loop {
            let s = &self.seqs.map[&seq];
            if s.sealed || s.keys.len() >= target {
                break;
            }
            self.publish_next(seq, now, &mut report);
        }
        self.enforce_watermark();
        Ok(report)
    }

    /// Publish block `keys.len()` of a sequence (its predecessor is published).
    fn publish_next(&mut self, seq: SeqId, now: Tick, report: &mut PublishReport) {
        let bs = self.block_size;
        let s = &self.seqs.map[&seq];
        let i = s.keys.len();
        let parent_key = if i == 0 { s.ns.root() } else { s.keys[i - 1] };
        let key = BlockKey::chain(&parent_key, &s.tokens[i * bs..(i + 1) * bs]);
        let own = s.blocks[i];
        let parent_block = if i == 0 { None } else { Some(s.blocks[i - 1]) };
        let ns = s.ns;

        if let Some(p) = self.pool.get(own).published {
            // Shared with a fork that published it first.
            assert!(
                p.key == key,
                "a block's tokens changed after it was published"
            );
            self.seqs.map.get_mut(&seq).expect("live").keys.push(key);
            return;
        }
        if let Some(cached) = self.index.get(&key) {
            // Every table holding the duplicate (forks share unpublished full blocks at the same
            // position) switches to the cached block, so a referenced published block always has
            // its parent referenced by the same tables.
            let holders: Vec<SeqId> = self
                .seqs
                .map
                .iter()
                .filter(|(_, s)| s.blocks.get(i) == Some(&own))
                .map(|(id, _)| *id)
                .collect();
            self.touch(cached, now, true);
            for holder in holders {
                self.acquire(cached);
                self.release(own, now);
                self.seqs.map.get_mut(&holder).expect("live").blocks[i] = cached;
            }
            let s = self.seqs.map.get_mut(&seq).expect("live");
            s.keys.push(key);
            self.counters.publish_duplicates += 1;
            report.replaced.push(BlockReplacement {
                block_index: i,
                dropped: own,
                cached,
            });
            return;
        }
        let tenant = ns.tenant();
        if self.tenants.at_quota(tenant) {
            match self.candidates.first_of_tenant(tenant) {
                Some(victim) => self.unpublish(victim, crate::counters::EvictionCause::Quota),
                None => {
                    self.seqs.map.get_mut(&seq).expect("live").sealed = true;
                    self.tenants.get_mut(tenant).quota_refusals += 1;
                    report.refused_by_quota = true;
                    return;
                }
            }
        }
        let last_use = parent_block.map_or(now, |p| self.pool.get(p).last_use);
        if self.reuse.as_mut().is_some_and(|r| r.sketch.record(&key)) {
            self.rerank_all();
        }
        self.detach(own);
        let b = self.pool.get_mut(own);
        b.published = Some(Published {
            key,
            parent: parent_block,
            ns,
            depth: i as u32,
        });
        b.last_use = last_use;
        b.hits = 1;
        self.attach(own);
        if let Some(p) = parent_block {
            self.detach(p);
            self.pool.get_mut(p).num_children += 1;
            self.attach(p);
        }
        self.index.insert(key, own);
        self.ghost_on_publish(&key);
        let s = &self.seqs.map[&seq];
        let block_tokens = &s.tokens[i * bs..(i + 1) * bs];
        self.divergence
            .on_publish(parent_key, &key, own, block_tokens);
        self.tenants.get_mut(tenant).cached_blocks += 1;
        self.counters.blocks_published += 1;
        report.num_published += 1;
        self.seqs.map.get_mut(&seq).expect("live").keys.push(key);
        if self.config.record_events {
            self.events.push(CacheEvent::BlockStored {
                key,
                parent: (i > 0).then_some(parent_key),
                block: own,
                tenant,
                depth: i as u32,
                num_tokens: bs as u32,
                tokens: self.seqs.map[&seq].tokens[i * bs..(i + 1) * bs].to_vec(),
            });
        }
    }

    /// Fork a sequence (n > 1, beam search): full blocks are shared by reference; a partial last
    /// block is copied into a fresh block the caller must fill (see [`BlockCopy`]).
    /// All or nothing on allocation failure.
    pub fn fork(&mut self, seq: SeqId, tick: Tick) -> Result<Fork, SeqError> {
        self.advance(tick);
        let s = self.sequence(seq)?;
        let partial_tokens = s.tokens.len() % self.block_size;
        let last = s.blocks.last().copied();
        let copy = match (partial_tokens, last) {
            (0, _) | (_, None) => None,
            (n, Some(src)) => {
                let dst = self.allocate(1)?[0];
                Some(BlockCopy {
                    src,
                    dst,
                    num_tokens: n,
                })
            }
        };
        let mut child = self.seqs.map[&seq].clone();
        let num_shared = child.blocks.len() - usize::from(copy.is_some());
        for &id in &child.blocks[..num_shared] {
            self.acquire(id);
        }
        if let Some(c) = copy {
            *child.blocks.last_mut().expect("partial block exists") = c.dst;
            self.counters.copy_on_write_blocks += 1;
        }
        self.unused_slots += child.unused_slots(self.block_size);
        self.counters.forks += 1;
        let child = self.seqs.insert(child);
        Ok(Fork { child, copy })
    }

    /// Free a sequence: published blocks it held alone become cached (used at `tick`), others free.
    pub fn free(&mut self, seq: SeqId, tick: Tick) -> Result<(), SeqError> {
        let now = self.advance(tick);
        let s = self
            .seqs
            .map
            .remove(&seq)
            .ok_or(SeqError::UnknownSequence(seq))?;
        self.unused_slots -= s.unused_slots(self.block_size);
        for &id in s.blocks.iter().rev() {
            self.release(id, now);
        }
        self.enforce_watermark();
        Ok(())
    }
}
