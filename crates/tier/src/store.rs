//! The [`TierStore`] trait: a synchronous, batched, prefix-aware KV-block store. Implemented by
//! RAM, disk, Redis and the fault-injecting wrapper. Owns the contract, not any storage.

use crate::{BlockRef, StoredBlock, TierError, TierKey, TierStats};

/// Which kind of store this is (label for metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TierKind {
    /// Host RAM.
    Ram,
    /// Local directory.
    Disk,
    /// Redis server or cluster.
    Redis,
}

impl TierKind {
    /// Lower-case label (`"ram"`, `"disk"`, `"redis"`).
    pub fn as_str(self) -> &'static str {
        match self {
            TierKind::Ram => "ram",
            TierKind::Disk => "disk",
            TierKind::Redis => "redis",
        }
    }
}

/// A store of KV blocks addressed by [`TierKey`].
///
/// Contract (checked by [`crate::conformance`] for every store):
/// - Synchronous and blocking; callers use a dedicated I/O thread. All methods take `&self` and
///   are safe to call from several threads at once.
/// - `get_many` returns only verified blocks: a corrupt, truncated or foreign object is `None`
///   (and counted in `corrupt`, and deleted), never an error and never garbage.
/// - An `Err` means the tier could not answer (I/O, connection, timeout, back-off); the caller
///   treats it as "all missing" and proceeds. Errors are counted in `errors`.
/// - `contains_prefix` is a cheap hint (no payload read, no verification): a later `get_many`
///   may still miss (evicted or corrupt in between).
pub trait TierStore: Send + Sync {
    /// Kind label.
    fn kind(&self) -> TierKind;

    /// How many LEADING keys of `chain` are present (stops at the first absent key).
    fn contains_prefix(&self, chain: &[TierKey]) -> Result<usize, TierError>;

    /// Fetch and verify every key; the result has one entry per key, in order.
    fn get_many(&self, keys: &[TierKey]) -> Result<Vec<Option<StoredBlock>>, TierError>;

    /// Store every block (overwriting same keys). Stores with a byte budget evict their least
    /// recently used objects to make room.
    fn put_many(&self, blocks: &[BlockRef<'_>]) -> Result<(), TierError>;

    /// Delete the keys (absent keys are ignored).
    fn remove(&self, keys: &[TierKey]) -> Result<(), TierError>;

    /// Snapshot of the store's counters.
    fn stats(&self) -> TierStats;

    /// Keys the store dropped on its own since the last call — evicted for its byte budget, or
    /// expired by its TTL — so the caller can announce them gone (router `BlockRemoved`
    /// events). Not the keys the caller removed. At most [`crate::MAX_PENDING_DROPPED`] are
    /// kept between calls. Default: none (a store that never drops by itself).
    fn take_dropped(&self) -> Vec<TierKey> {
        Vec::new()
    }

    /// The leading run of verified blocks of `chain`: `get_many` cut at the first `None`.
    fn get_prefix(&self, chain: &[TierKey]) -> Result<Vec<StoredBlock>, TierError> {
        Ok(self
            .get_many(chain)?
            .into_iter()
            .map_while(|block| block)
            .collect())
    }
}

/// Test hook implemented by every store: read or overwrite an object's bytes exactly as they
/// are at rest, bypassing verification (to inject corruption and foreign objects).
pub trait RawObjectAccess {
    /// The stored bytes of `key`, if present.
    fn read_raw(&self, key: &TierKey) -> Result<Option<Vec<u8>>, TierError>;
    /// Replace (or create) the stored bytes of `key` with `bytes`, unverified.
    fn write_raw(&self, key: &TierKey, bytes: &[u8]) -> Result<(), TierError>;
}
