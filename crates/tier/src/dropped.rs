//! What a store dropped on its own — a byte-budget eviction, or an object whose TTL ran out —
//! kept until the caller takes it ([`crate::TierStore::take_dropped`]), so the engine can
//! announce the removal to routers (vLLM's `BlockRemoved` in the tier's medium).
//!
//! Owns two small bookkeeping structures: [`DroppedKeys`] (a capped queue of keys a store
//! evicted) and [`TtlWatch`] (when each object written with a TTL expires, for stores such as
//! Redis that expire objects server-side without telling anyone). Never does I/O and never
//! decides what is dropped.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::TierKey;

/// Keys kept at most before the oldest are forgotten (a caller that never takes them must not
/// make the store grow without bound; a forgotten key only costs a router a stale credit).
pub const MAX_PENDING_DROPPED: usize = 1 << 16;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Capped queue of keys a store dropped.
#[derive(Default)]
pub(crate) struct DroppedKeys {
    keys: Mutex<VecDeque<TierKey>>,
}

impl DroppedKeys {
    /// Records `keys` as dropped (the oldest pending ones go past [`MAX_PENDING_DROPPED`]).
    pub(crate) fn push(&self, keys: impl IntoIterator<Item = TierKey>) {
        let mut q = lock(&self.keys);
        q.extend(keys);
        let excess = q.len().saturating_sub(MAX_PENDING_DROPPED);
        q.drain(..excess);
    }

    /// Everything recorded since the last call, oldest first.
    pub(crate) fn take(&self) -> Vec<TierKey> {
        lock(&self.keys).drain(..).collect()
    }
}

#[derive(Default)]
struct Deadlines {
    /// Key → its current (deadline, sequence) entry in `by_time` (a rewrite moves it later).
    by_key: HashMap<TierKey, (Instant, u64)>,
    /// (deadline, sequence) → key, for taking the expired ones in order.
    by_time: BTreeMap<(Instant, u64), TierKey>,
    seq: u64,
}

/// When each object this process wrote with a TTL expires. The store's TTL runs from an
/// object's last write, so a rewrite (by this process) moves the deadline; a rewrite by another
/// process sharing the store is not seen, so a key may be reported expired while another writer
/// kept it alive — a lost router credit, never a wrong one.
pub(crate) struct TtlWatch {
    ttl: Duration,
    state: Mutex<Deadlines>,
}

impl TtlWatch {
    pub(crate) fn new(ttl: Duration) -> TtlWatch {
        TtlWatch {
            ttl,
            state: Mutex::new(Deadlines::default()),
        }
    }

    /// `keys` were written at `now`: each expires at `now + ttl`.
    pub(crate) fn written(&self, keys: impl IntoIterator<Item = TierKey>, now: Instant) {
        let deadline = now + self.ttl;
        let mut s = lock(&self.state);
        for key in keys {
            let seq = s.seq;
            s.seq += 1;
            if let Some(old) = s.by_key.insert(key, (deadline, seq)) {
                s.by_time.remove(&old);
            }
            s.by_time.insert((deadline, seq), key);
        }
        // Bound the bookkeeping like DroppedKeys: forget the earliest deadlines past the cap.
        while s.by_key.len() > MAX_PENDING_DROPPED {
            let Some((_, key)) = s.by_time.pop_first() else {
                break;
            };
            s.by_key.remove(&key);
        }
    }

    /// `keys` were deleted by this process: they no longer expire.
    pub(crate) fn removed(&self, keys: &[TierKey]) {
        let mut s = lock(&self.state);
        for key in keys {
            if let Some(old) = s.by_key.remove(key) {
                s.by_time.remove(&old);
            }
        }
    }

    /// Keys whose deadline is at or before `now`, earliest first; they are forgotten.
    pub(crate) fn expired(&self, now: Instant) -> Vec<TierKey> {
        let mut s = lock(&self.state);
        let mut out = Vec::new();
        while let Some((&(t, _), _)) = s.by_time.first_key_value() {
            if t > now {
                break;
            }
            let (_, key) = s.by_time.pop_first().expect("checked non-empty");
            s.by_key.remove(&key);
            out.push(key);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u8) -> TierKey {
        TierKey::new([1; 32], [i; 32])
    }

    #[test]
    fn dropped_keys_are_taken_once_in_order_and_capped() {
        let d = DroppedKeys::default();
        d.push([k(1), k(2)]);
        d.push([k(3)]);
        assert_eq!(d.take(), vec![k(1), k(2), k(3)]);
        assert!(d.take().is_empty());
        d.push((0..MAX_PENDING_DROPPED + 3).map(|i| TierKey::new([0; 32], [(i % 251) as u8; 32])));
        let taken = d.take();
        assert_eq!(taken.len(), MAX_PENDING_DROPPED);
        assert_eq!(taken[0], TierKey::new([0; 32], [3; 32]));
    }

    #[test]
    fn ttl_watch_reports_each_key_once_at_its_latest_deadline() {
        let w = TtlWatch::new(Duration::from_secs(10));
        let t0 = Instant::now();
        w.written([k(1), k(2), k(3)], t0);
        w.written([k(2)], t0 + Duration::from_secs(5)); // rewrite: expires at 15 s
        w.removed(&[k(3)]); // deleted by us: never reported
        assert!(w.expired(t0 + Duration::from_secs(9)).is_empty());
        assert_eq!(w.expired(t0 + Duration::from_secs(10)), vec![k(1)]);
        assert!(w.expired(t0 + Duration::from_secs(14)).is_empty());
        assert_eq!(w.expired(t0 + Duration::from_secs(20)), vec![k(2)]);
        assert!(w.expired(t0 + Duration::from_secs(100)).is_empty());
    }
}
