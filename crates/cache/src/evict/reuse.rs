//! Reuse-aware LRU: LRU in which a block read at least twice ranks as if it had been used
//! `reuse_bonus` later. Reads are counted per block key in a bounded count sketch that outlives
//! residency (a block evicted and computed again remembers its earlier reads), so "read twice"
//! means twice within the sketch's memory, not twice since it was last cached.
//!
//! Why: in production traces most blocks are read once and never again; a block read twice —
//! a conversation's history on its second turn, a document several requests share — is read
//! again far more often (Mooncake's conversation trace: 26% after one read, 42% after two; its
//! synthetic trace: 45% and 85%). Plain LRU lets the one-off blocks of the newest requests push
//! those out; a frequency class alone (segmented LRU) keeps old reused blocks forever. The bonus
//! is a time, so a reused block still ages out behind fresh ones once it is `reuse_bonus` older
//! than them; the engine sets it to the learned time until a conversation returns.
//!
//! The counts: an exact map from block key (its first 8 bytes: keys are BLAKE3 outputs) to a
//! read count saturating at 15, holding at most `max(8 × the pool's blocks, 1024)` keys; when a
//! new key finds it full, every count is halved and the keys left at 0 are dropped (TinyLFU's
//! reset), so old popularity fades and memory stays bounded (~0.3 KiB per pool block; a block's
//! K/V is hundreds of KiB). A block's bonus is decided whenever it is ranked; a reset or a new
//! bonus re-ranks every block, so the order is always the one the current counts and bonus
//! say. Owns the counts; never evicts.

use crate::key::BlockKey;

const MAX_COUNT: u8 = 15;

/// Reads a block needs (within the counts' memory) to earn the bonus.
pub(crate) const REUSED_READS: u8 = 2;

/// Bounded per-key read counts.
#[derive(Debug, Clone)]
pub(crate) struct ReuseSketch {
    counts: std::collections::HashMap<u64, u8>,
    capacity: usize,
}

fn short(key: &BlockKey) -> u64 {
    u64::from_le_bytes(key.0[..8].try_into().expect("8 bytes"))
}

impl ReuseSketch {
    pub fn new(num_blocks: u32) -> ReuseSketch {
        ReuseSketch {
            counts: Default::default(),
            capacity: (num_blocks as usize * 8).max(1024),
        }
    }

    /// Reads of `key` remembered.
    pub fn estimate(&self, key: &BlockKey) -> u8 {
        self.counts.get(&short(key)).copied().unwrap_or(0)
    }

    /// Counts one read of `key`; true when it first had to halve every count to make room (the
    /// caller re-ranks the blocks).
    pub fn record(&mut self, key: &BlockKey) -> bool {
        let k = short(key);
        let mut reset = false;
        while !self.counts.contains_key(&k) && self.counts.len() >= self.capacity {
            reset = true;
            self.counts.retain(|_, c| {
                *c /= 2;
                *c > 0
            });
        }
        let c = self.counts.entry(k).or_insert(0);
        *c = (*c + 1).min(MAX_COUNT);
        reset
    }

    /// Keys remembered at most.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TenantId;
    use crate::key::Namespace;

    fn key(i: u32) -> BlockKey {
        BlockKey::chain(&Namespace::for_tenant(TenantId(0)).key().root(), &[i])
    }

    #[test]
    fn counts_reads_saturates_and_fades_when_full() {
        let mut s = ReuseSketch::new(16);
        assert_eq!(s.capacity(), 1024);
        assert_eq!(s.estimate(&key(1)), 0);
        assert!(!s.record(&key(1)));
        s.record(&key(1));
        assert_eq!(s.estimate(&key(1)), 2);
        assert_eq!(s.estimate(&key(2)), 0, "another key is not counted");
        for _ in 0..100 {
            s.record(&key(3));
        }
        assert_eq!(s.estimate(&key(3)), MAX_COUNT);
        // Fill the map with keys read once; the next new key halves everything.
        for i in 0..1022 {
            assert!(!s.record(&key(1000 + i)));
        }
        assert!(s.record(&key(9999)), "full: reset");
        assert_eq!(s.estimate(&key(1)), 1);
        assert_eq!(s.estimate(&key(3)), MAX_COUNT / 2);
        assert_eq!(s.estimate(&key(1000)), 0, "read once: forgotten");
        assert_eq!(s.estimate(&key(9999)), 1);
    }
}
