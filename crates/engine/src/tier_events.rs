//! The cache's block events on their way to the tiers, and the only door to writing K/V bytes.
//!
//! Owns the rule the storage tiers rest on: *an evicted block is copied for demotion before
//! anything overwrites it*. Cache events are recorded here as soon as the code that caused them
//! knows their namespace ([`TierEvents::record`]); [`KvStorage::writer`] hands every recorded
//! event to the tiers (copying evicted blocks' bytes) before it returns the only handle that can
//! write K/V bytes, so the rule holds by construction rather than by call-site discipline.
//! The same events feed the router announcements ([`KvEventLog`]) when they are published.
//! Never decides what is evicted, written or loaded.

use crate::paged_kv::BlockBytesError;
use cache::{BlockId, BlockKey, CacheEvent, EvictionCause, KvCache, NamespaceKey};
use model::kv::{KvError, KvStore};

use crate::kv_events::KvEventLog;
use crate::kv_memory::KvMemory;
use crate::tiering::Tiering;

/// Who published the blocks of a recorded `BlockStored` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Publisher {
    /// Namespace root of the publishing sequence (tier keys need it).
    pub root: BlockKey,
    /// The block may be written to the tiers on publish (`false` for blocks just loaded from a
    /// tier).
    pub write: bool,
}

impl Publisher {
    pub fn computed(ns: &NamespaceKey) -> Self {
        Publisher {
            root: ns.root(),
            write: true,
        }
    }

    pub fn loaded(ns: &NamespaceKey) -> Self {
        Publisher {
            root: ns.root(),
            write: false,
        }
    }
}

/// Cache events recorded but not yet handed to the tiers, in the order they happened.
#[derive(Debug, Default)]
pub(crate) struct TierEvents {
    events: Vec<(CacheEvent, Option<Publisher>)>,
}

impl TierEvents {
    /// Records the cache's pending events; `publisher` attributes the `BlockStored` ones
    /// (`None`: no block can have been published since the last record).
    pub fn record(&mut self, cache: &mut KvCache, publisher: Option<Publisher>) {
        self.events
            .extend(cache.drain_events().into_iter().map(|e| (e, publisher)));
    }
}

/// The paged K/V memory together with the events that must reach the tiers before it is
/// written.
pub(crate) struct KvStorage {
    mem: KvMemory,
    events: TierEvents,
    /// Announcements for routers (`None`: not published).
    log: Option<KvEventLog>,
}

impl KvStorage {
    pub fn new(mem: KvMemory, log: Option<KvEventLog>) -> Self {
        KvStorage {
            mem,
            events: TierEvents::default(),
            log,
        }
    }

    /// Read access (sizes, serialised blocks).
    pub fn memory(&self) -> &KvMemory {
        &self.mem
    }

    pub fn events(&mut self) -> &mut TierEvents {
        &mut self.events
    }

    /// Records the cache's pending events (see [`TierEvents::record`]) and hands every recorded
    /// event to the tiers: evicted blocks are copied and queued for demotion, published ones
    /// remembered (and written when writing on publish). With a [`KvEventLog`] the same events
    /// are announced (pool stores and removals, tier stores for queued writes).
    pub fn sync(
        &mut self,
        cache: &mut KvCache,
        mut tiers: Option<&mut Tiering>,
        publisher: Option<Publisher>,
    ) {
        self.events.record(cache, publisher);
        let events = std::mem::take(&mut self.events.events);
        if tiers.is_none() && self.log.is_none() {
            return;
        }
        let targets = tiers
            .as_ref()
            .map(|t| t.write_target_kinds())
            .unwrap_or_default();
        let mut writes = Vec::new();
        for (event, publisher) in events {
            match event {
                CacheEvent::BlockStored {
                    key,
                    parent,
                    block,
                    tokens,
                    ..
                } => {
                    let to_write = match (&mut tiers, publisher) {
                        (Some(t), Some(p)) => t.published(key, block, p.root, p.write),
                        (Some(t), None) => {
                            t.forget(block);
                            None
                        }
                        (None, _) => None,
                    };
                    if let (Some(log), Some(_)) = (&mut self.log, publisher) {
                        log.stored(&key, parent.as_ref(), block, &tokens);
                        if to_write.is_some() {
                            log.written(block, &targets);
                        }
                    }
                    if let Some(tier_key) = to_write {
                        match self.mem.block_bytes(block) {
                            Ok(bytes) => writes.push((tier_key, bytes)),
                            Err(e) => tracing::warn!(error = %e, "block not written to the tiers"),
                        }
                    }
                }
                CacheEvent::BlockEvicted {
                    key, block, cause, ..
                } => {
                    let to_write = match (&mut tiers, cause) {
                        (Some(t), EvictionCause::Flush) => {
                            t.forget(block);
                            None
                        }
                        (Some(t), _) => t.evicted(key, block),
                        (None, _) => None,
                    };
                    if let Some(log) = &mut self.log {
                        let demoted: &[tier::TierKind] =
                            if to_write.is_some() { &targets } else { &[] };
                        log.removed(&key, block, demoted);
                    }
                    if let Some(tier_key) = to_write {
                        // Copied now: an evicted block's bytes are intact only until its next
                        // write.
                        match self.mem.block_bytes(block) {
                            Ok(bytes) => writes.push((tier_key, bytes)),
                            Err(e) => tracing::warn!(error = %e, "evicted block not demoted"),
                        }
                    }
                }
            }
        }
        if let Some(t) = &tiers {
            // Taken even when nothing is announced, so the stores' lists stay short.
            for (kind, keys) in t.take_dropped() {
                if let Some(log) = &mut self.log {
                    for key in &keys {
                        log.tier_dropped(&key.chain_key, kind);
                    }
                }
            }
        }
        if let Some(log) = &mut self.log {
            log.flush();
        }
        if let Some(t) = tiers {
            t.write(writes);
        }
    }

    /// The handle that writes K/V bytes, after [`KvStorage::sync`]: every block evicted so far
    /// is copied for demotion before the handle exists.
    pub fn writer(&mut self, cache: &mut KvCache, tiers: Option<&mut Tiering>) -> KvWriter<'_> {
        self.sync(cache, tiers, None);
        KvWriter { mem: &mut self.mem }
    }
}

/// Write access to the K/V bytes, only obtainable from [`KvStorage::writer`].
pub(crate) struct KvWriter<'a> {
    mem: &'a mut KvMemory,
}

impl KvWriter<'_> {
    /// The forward pass's view over the block tables of one batch.
    pub fn view<'t>(&'t mut self, tables: &'t [&'t [BlockId]]) -> Box<dyn KvStore + 't> {
        self.mem.view(tables)
    }

    /// Copies the first `num_rows` token rows of `src` into `dst` (fork of a partial block).
    pub fn copy_block(
        &mut self,
        src: BlockId,
        dst: BlockId,
        num_rows: usize,
    ) -> Result<(), KvError> {
        self.mem.copy_block(src, dst, num_rows)
    }

    /// Overwrites `block` with a tier payload.
    pub fn load_block_bytes(
        &mut self,
        block: BlockId,
        bytes: &[u8],
    ) -> Result<(), BlockBytesError> {
        self.mem.load_block_bytes(block, bytes)
    }
}
