//! Fault-injecting wrapper for tests: makes any store fail (all calls, or the next N), slow
//! (a fixed delay per call), or corrupt at rest (each object is damaged just before it is read,
//! so the store's real verification path runs). Never used in production paths.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::store::RawObjectAccess;
use crate::{BlockRef, StoredBlock, TierError, TierKey, TierKind, TierStats, TierStore};

/// Wraps `S` and injects faults controlled at run time through `&self` setters.
pub struct FaultStore<S> {
    inner: S,
    fail_all: AtomicBool,
    fail_next: AtomicU64,
    delay: Mutex<Duration>,
    corrupt_reads: AtomicBool,
    injected: AtomicU64,
}

impl<S: TierStore + RawObjectAccess> FaultStore<S> {
    /// No faults until a setter enables them.
    pub fn new(inner: S) -> FaultStore<S> {
        FaultStore {
            inner,
            fail_all: AtomicBool::new(false),
            fail_next: AtomicU64::new(0),
            delay: Mutex::new(Duration::ZERO),
            corrupt_reads: AtomicBool::new(false),
            injected: AtomicU64::new(0),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }
    /// Every call fails with [`TierError::Injected`] while `on`.
    pub fn set_failing(&self, on: bool) {
        self.fail_all.store(on, Ordering::SeqCst);
    }
    /// The next `n` calls fail.
    pub fn fail_next(&self, n: u64) {
        self.fail_next.store(n, Ordering::SeqCst);
    }
    /// Sleep this long at the start of every call.
    pub fn set_delay(&self, delay: Duration) {
        *self.delay.lock().unwrap_or_else(|p| p.into_inner()) = delay;
    }
    /// While `on`, flip one payload byte of each requested object at rest before reading it.
    pub fn set_corrupt_reads(&self, on: bool) {
        self.corrupt_reads.store(on, Ordering::SeqCst);
    }
    /// Calls failed by injection so far.
    pub fn injected_failures(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    fn before(&self, op: &'static str) -> Result<(), TierError> {
        let delay = *self.delay.lock().unwrap_or_else(|p| p.into_inner());
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        let one_shot = self
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if one_shot || self.fail_all.load(Ordering::SeqCst) {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(TierError::Injected { op });
        }
        Ok(())
    }
}

impl<S: TierStore + RawObjectAccess> TierStore for FaultStore<S> {
    fn kind(&self) -> TierKind {
        self.inner.kind()
    }
    fn contains_prefix(&self, chain: &[TierKey]) -> Result<usize, TierError> {
        self.before("contains_prefix")?;
        self.inner.contains_prefix(chain)
    }
    fn get_many(&self, keys: &[TierKey]) -> Result<Vec<Option<StoredBlock>>, TierError> {
        self.before("get_many")?;
        if self.corrupt_reads.load(Ordering::SeqCst) {
            for key in keys {
                if let Some(mut bytes) = self.inner.read_raw(key)? {
                    if let Some(last) = bytes.last_mut() {
                        *last ^= 0x5a;
                        self.inner.write_raw(key, &bytes)?;
                    }
                }
            }
        }
        self.inner.get_many(keys)
    }
    fn put_many(&self, blocks: &[BlockRef<'_>]) -> Result<(), TierError> {
        self.before("put_many")?;
        self.inner.put_many(blocks)
    }
    fn remove(&self, keys: &[TierKey]) -> Result<(), TierError> {
        self.before("remove")?;
        self.inner.remove(keys)
    }
    fn stats(&self) -> TierStats {
        let mut stats = self.inner.stats();
        stats.errors += self.injected.load(Ordering::SeqCst);
        stats
    }

    fn take_dropped(&self) -> Vec<TierKey> {
        self.inner.take_dropped()
    }
}

impl<S: RawObjectAccess> RawObjectAccess for FaultStore<S> {
    fn read_raw(&self, key: &TierKey) -> Result<Option<Vec<u8>>, TierError> {
        self.inner.read_raw(key)
    }
    fn write_raw(&self, key: &TierKey, bytes: &[u8]) -> Result<(), TierError> {
        self.inner.write_raw(key, bytes)
    }
}
