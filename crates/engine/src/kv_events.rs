//! The engine's announcements of which KV blocks it holds where, for cache-aware routers: a
//! block stored in or removed from the active pool or a storage tier, or everything cleared.
//! Plain data handed to a [`KvEventSink`] after each cache change (the binary wires the sink to
//! the `kvevents` crate's ZMQ publisher, which speaks vLLM's wire format).
//!
//! Identity: a block's published hash is the first 8 bytes (big-endian) of its namespaced chain
//! key (`cache::BlockKey`: model, codec, tenant, tenant salt and adapter are in the chain's
//! root), so two tenants' identical prompts never announce the same hash.
//!
//! Owns the event types and the per-block memory of what was announced (so a removal or a
//! demotion names the same hash and tokens as the store); never does I/O and never blocks the
//! step loop (the sink is an unbounded channel; a closed sink drops events).

use cache::{BlockId, BlockKey};
use tier::TierKind;

/// Where a block is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvMedium {
    /// The active pool the forward pass reads (vLLM's "GPU" medium).
    Active,
    /// A storage tier after the pool.
    Tier(TierKind),
}

/// One change of what the engine holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Full blocks now held in `medium`, in chain order: `hashes[0]` follows `parent`.
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        /// The blocks' tokens, `block_size` per hash.
        tokens: Vec<u32>,
        block_size: u32,
        medium: KvMedium,
    },
    /// Blocks no longer held in `medium`.
    Removed { hashes: Vec<u64>, medium: KvMedium },
    /// Nothing is held any more (sent once when a sink is attached, so a router forgets what
    /// an earlier process with the same address announced).
    AllCleared,
}

/// Where the engine sends its events (cloneable; dropping the receiver disables publishing).
#[derive(Debug, Clone)]
pub struct KvEventSink(pub std::sync::mpsc::Sender<Vec<KvEvent>>);

impl KvEventSink {
    /// A sink and the receiver the publisher drains.
    pub fn channel() -> (KvEventSink, std::sync::mpsc::Receiver<Vec<KvEvent>>) {
        let (tx, rx) = std::sync::mpsc::channel();
        (KvEventSink(tx), rx)
    }
}

/// The published 64-bit hash of a block key.
pub fn external_hash(key: &BlockKey) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&key.0[..8]);
    u64::from_be_bytes(b)
}

/// What was announced for a block of the active pool.
#[derive(Debug, Clone)]
struct Announced {
    hash: u64,
    parent: Option<u64>,
    tokens: Vec<u32>,
}

/// Collects one sync's events and remembers each pool block's announcement.
#[derive(Debug)]
pub(crate) struct KvEventLog {
    sink: KvEventSink,
    block_size: u32,
    blocks: Vec<Option<Announced>>,
    pending: Vec<KvEvent>,
}

impl KvEventLog {
    pub fn new(sink: KvEventSink, num_blocks: usize, block_size: usize) -> Self {
        let _ = sink.0.send(vec![KvEvent::AllCleared]);
        KvEventLog {
            sink,
            block_size: block_size as u32,
            blocks: vec![None; num_blocks],
            pending: Vec::new(),
        }
    }

    /// `block` was published in the pool under `key` (chained on `parent`).
    pub fn stored(
        &mut self,
        key: &BlockKey,
        parent: Option<&BlockKey>,
        block: BlockId,
        tokens: &[u32],
    ) {
        let a = Announced {
            hash: external_hash(key),
            parent: parent.map(external_hash),
            tokens: tokens.to_vec(),
        };
        self.push_stored(&a, KvMedium::Active);
        if let Some(slot) = self.blocks.get_mut(block.index()) {
            *slot = Some(a);
        }
    }

    /// `block` left the pool; `demoted_to` are the tiers it is being written to.
    pub fn removed(&mut self, key: &BlockKey, block: BlockId, demoted_to: &[TierKind]) {
        let announced = self.blocks.get_mut(block.index()).and_then(Option::take);
        let hash = announced.as_ref().map_or(external_hash(key), |a| a.hash);
        self.push_removed(hash, KvMedium::Active);
        if let Some(a) = announced {
            for &kind in demoted_to {
                self.push_stored(&a, KvMedium::Tier(kind));
            }
        }
    }

    /// A pool block still held was also written to `tiers` (write on publish).
    pub fn written(&mut self, block: BlockId, tiers: &[TierKind]) {
        if let Some(Some(a)) = self.blocks.get(block.index()).cloned() {
            for &kind in tiers {
                self.push_stored(&a, KvMedium::Tier(kind));
            }
        }
    }

    /// A tier dropped the block with chain key `chain_key` by itself (byte budget, TTL).
    pub fn tier_dropped(&mut self, chain_key: &[u8; 32], kind: TierKind) {
        self.push_removed(external_hash(&BlockKey(*chain_key)), KvMedium::Tier(kind));
    }

    /// Appends to the last event when it continues its chain in the same medium (one
    /// `Stored` per published run, as vLLM sends them).
    fn push_stored(&mut self, a: &Announced, medium: KvMedium) {
        if let Some(KvEvent::Stored {
            hashes,
            tokens,
            medium: m,
            ..
        }) = self.pending.last_mut()
        {
            if *m == medium && hashes.last().copied() == a.parent {
                hashes.push(a.hash);
                tokens.extend_from_slice(&a.tokens);
                return;
            }
        }
        self.pending.push(KvEvent::Stored {
            hashes: vec![a.hash],
            parent: a.parent,
            tokens: a.tokens.clone(),
            block_size: self.block_size,
            medium,
        });
    }

    fn push_removed(&mut self, hash: u64, medium: KvMedium) {
        if let Some(KvEvent::Removed { hashes, medium: m }) = self.pending.last_mut() {
            if *m == medium {
                hashes.push(hash);
                return;
            }
        }
        self.pending.push(KvEvent::Removed {
            hashes: vec![hash],
            medium,
        });
    }

    /// Sends what was collected since the last flush.
    pub fn flush(&mut self) {
        if !self.pending.is_empty() {
            let _ = self.sink.0.send(std::mem::take(&mut self.pending));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> BlockKey {
        BlockKey([n; 32])
    }

    #[test]
    fn chains_merge_and_removals_name_what_was_stored() {
        let (sink, rx) = KvEventSink::channel();
        let mut log = KvEventLog::new(sink, 4, 2);
        assert_eq!(rx.recv().unwrap(), vec![KvEvent::AllCleared]);
        log.stored(&key(1), None, BlockId(0), &[1, 2]);
        log.stored(&key(2), Some(&key(1)), BlockId(1), &[3, 4]);
        log.stored(&key(9), None, BlockId(2), &[5, 6]);
        log.flush();
        let h = |n| external_hash(&key(n));
        assert_eq!(
            rx.recv().unwrap(),
            vec![
                KvEvent::Stored {
                    hashes: vec![h(1), h(2)],
                    parent: None,
                    tokens: vec![1, 2, 3, 4],
                    block_size: 2,
                    medium: KvMedium::Active,
                },
                KvEvent::Stored {
                    hashes: vec![h(9)],
                    parent: None,
                    tokens: vec![5, 6],
                    block_size: 2,
                    medium: KvMedium::Active,
                },
            ]
        );
        log.removed(&key(2), BlockId(1), &[TierKind::Ram]);
        log.removed(&key(9), BlockId(2), &[]);
        log.flush();
        assert_eq!(
            rx.recv().unwrap(),
            vec![
                KvEvent::Removed {
                    hashes: vec![h(2)],
                    medium: KvMedium::Active
                },
                KvEvent::Stored {
                    hashes: vec![h(2)],
                    parent: Some(h(1)),
                    tokens: vec![3, 4],
                    block_size: 2,
                    medium: KvMedium::Tier(TierKind::Ram),
                },
                KvEvent::Removed {
                    hashes: vec![h(9)],
                    medium: KvMedium::Active
                },
            ]
        );
        log.flush();
        assert!(rx.try_recv().is_err(), "nothing pending, nothing sent");
    }

    #[test]
    fn the_hash_is_the_keys_first_eight_bytes() {
        let mut k = [0u8; 32];
        k[..8].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        assert_eq!(external_hash(&BlockKey(k)), 0x0102_0304_0506_0708);
    }
}
