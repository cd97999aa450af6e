//! Host-RAM store: encoded objects in a byte-budgeted LRU, optionally LZ4-compressed. Objects
//! are verified on every read exactly like disk/Redis ones (memory corruption or a bug is a miss,
//! never garbage). Owns nothing outside the process.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::dropped::DroppedKeys;
use crate::lru::ByteLru;
use crate::object::{self, Compression};
use crate::store::RawObjectAccess;
use crate::{
    BlockRef, StoredBlock, TierError, TierKey, TierKind, TierMetrics, TierStats, TierStore,
};

/// Configuration of a [`RamStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamConfig {
    /// Byte budget over stored-object bytes (header + codec id + possibly compressed payload).
    pub max_bytes: u64,
    /// Payload compression applied on put.
    pub compression: Compression,
}

/// Byte-budgeted, LRU, in-process store.
pub struct RamStore {
    lru: Mutex<ByteLru<Arc<Vec<u8>>>>,
    compression: Compression,
    metrics: TierMetrics,
    dropped: DroppedKeys,
}

impl RamStore {
    /// Empty store with `config`'s budget and compression.
    pub fn new(config: RamConfig) -> RamStore {
        RamStore {
            lru: Mutex::new(ByteLru::new(config.max_bytes)),
            compression: config.compression,
            metrics: TierMetrics::default(),
            dropped: DroppedKeys::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ByteLru<Arc<Vec<u8>>>> {
        // A panic while holding the lock cannot leave the LRU half-updated in a way that breaks
        // memory safety; keep serving.
        self.lru
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl TierStore for RamStore {
    fn kind(&self) -> TierKind {
        TierKind::Ram
    }

    fn contains_prefix(&self, chain: &[TierKey]) -> Result<usize, TierError> {
        let lru = self.lock();
        Ok(chain.iter().take_while(|key| lru.contains(key)).count())
    }

    fn get_many(&self, keys: &[TierKey]) -> Result<Vec<Option<StoredBlock>>, TierError> {
        let start = Instant::now();
        let objects: Vec<Option<Arc<Vec<u8>>>> = {
            let mut lru = self.lock();
            keys.iter().map(|key| lru.get(key).cloned()).collect()
        };
        let mut out = Vec::with_capacity(keys.len());
        let mut misses = 0;
        for (key, object) in keys.iter().zip(objects) {
            let block = object.and_then(|bytes| {
                self.metrics.read(bytes.len());
                match object::decode(key, &bytes, None) {
                    Ok(block) => Some(block),
                    Err(_) => {
                        self.metrics.corrupted();
                        self.lock().remove(key);
                        None
                    }
                }
            });
            match &block {
                Some(b) => self.metrics.hit(b.num_tokens, b.payload.len()),
                None => misses += 1,
            }
            out.push(block);
        }
        self.metrics.misses(misses);
        self.metrics.load_latency(start.elapsed());
        Ok(out)
    }

    fn put_many(&self, blocks: &[BlockRef<'_>]) -> Result<(), TierError> {
        let mut encoded = Vec::with_capacity(blocks.len());
        for block in blocks {
            let bytes = object::encode(block, self.compression, None)?;
            encoded.push((block.key, bytes));
        }
        let budget = self.lock().budget_bytes();
        if let Some((key, bytes)) = encoded.iter().find(|(_, b)| b.len() as u64 > budget) {
            return Err(TierError::InvalidBlock(format!(
                "{key:?}: object of {} bytes exceeds the RAM budget of {budget} bytes",
                bytes.len()
            )));
        }
        for (key, bytes) in encoded {
            let len = bytes.len();
            let evicted = self.lock().insert(key, Arc::new(bytes), len as u64);
            self.metrics.written(len);
            self.metrics.evicted(evicted.len());
            self.dropped.push(evicted.into_iter().map(|(key, _)| key));
        }
        Ok(())
    }

    fn remove(&self, keys: &[TierKey]) -> Result<(), TierError> {
        let mut lru = self.lock();
        for key in keys {
            lru.remove(key);
        }
        Ok(())
    }

    fn stats(&self) -> TierStats {
        let (objects, bytes) = {
            let lru = self.lock();
            (lru.len() as u64, lru.total_bytes())
        };
        self.metrics.snapshot(Some(objects), Some(bytes))
    }

    fn take_dropped(&self) -> Vec<TierKey> {
        self.dropped.take()
    }
}

impl RawObjectAccess for RamStore {
    fn read_raw(&self, key: &TierKey) -> Result<Option<Vec<u8>>, TierError> {
        let mut lru = self.lock();
        Ok(lru.peek_mut(key).map(|bytes| bytes.as_ref().clone()))
    }

    fn write_raw(&self, key: &TierKey, bytes: &[u8]) -> Result<(), TierError> {
        let mut lru = self.lock();
        if let Some(stored) = lru.peek_mut(key) {
            *stored = Arc::new(bytes.to_vec());
            lru.resize(key, bytes.len() as u64);
        } else {
            lru.insert(*key, Arc::new(bytes.to_vec()), bytes.len() as u64);
        }
        Ok(())
    }
}
