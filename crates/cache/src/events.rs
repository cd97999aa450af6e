//! Events for the storage tiers and the router: a block became visible, a block left the cache.
//! Owns only the event type; never buffers (the cache does, when `record_events` is on).

use crate::counters::EvictionCause;
use crate::ids::{BlockId, TenantId};
use crate::key::BlockKey;

/// A change of what the cache holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheEvent {
    /// A full, written block was published under `key`.
    BlockStored {
        key: BlockKey,
        /// Key of the previous block of the chain (`None`: chained on the namespace root).
        parent: Option<BlockKey>,
        block: BlockId,
        tenant: TenantId,
        /// Chain position (0 = first block).
        depth: u32,
        num_tokens: u32,
        /// The block's token ids (routers that index tokens need them).
        tokens: Vec<u32>,
    },
    /// A block was unpublished (evicted or flushed); its key is no longer served.
    BlockEvicted {
        key: BlockKey,
        block: BlockId,
        tenant: TenantId,
        cause: EvictionCause,
    },
}
