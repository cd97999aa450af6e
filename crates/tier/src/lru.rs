//! Byte-budgeted LRU index over [`TierKey`]s shared by the RAM and disk stores: a hash map plus
//! a `BTreeMap<tick, key>` so eviction is `pop_first()`. Owns ordering and accounting only;
//! never touches bytes on disk.

use std::collections::{BTreeMap, HashMap};

use crate::TierKey;

struct Entry<V> {
    value: V,
    bytes: u64,
    tick: u64,
}

/// LRU map whose entries have a byte size; the total never exceeds the budget after `insert`.
pub(crate) struct ByteLru<V> {
    map: HashMap<TierKey, Entry<V>>,
    order: BTreeMap<u64, TierKey>,
    next_tick: u64,
    total_bytes: u64,
    budget_bytes: u64,
}

impl<V> ByteLru<V> {
    pub(crate) fn new(budget_bytes: u64) -> Self {
        ByteLru {
            map: HashMap::new(),
            order: BTreeMap::new(),
            next_tick: 0,
            total_bytes: 0,
            budget_bytes,
        }
    }

    pub(crate) fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
    pub(crate) fn total_bytes(&self) -> u64 {
        self.total_bytes
    }
    pub(crate) fn contains(&self, key: &TierKey) -> bool {
        self.map.contains_key(key)
    }

    fn tick(&mut self) -> u64 {
        self.next_tick += 1;
        self.next_tick
    }

    /// Value of `key`, marking it most recently used.
    pub(crate) fn get(&mut self, key: &TierKey) -> Option<&V> {
        let tick = self.tick();
        let entry = self.map.get_mut(key)?;
        self.order.remove(&entry.tick);
        entry.tick = tick;
        self.order.insert(tick, *key);
        Some(&entry.value)
    }

    /// Mutable value of `key` without changing its recency.
    pub(crate) fn peek_mut(&mut self, key: &TierKey) -> Option<&mut V> {
        self.map.get_mut(key).map(|e| &mut e.value)
    }

    /// Update the byte size of a present entry (no eviction).
    pub(crate) fn resize(&mut self, key: &TierKey, bytes: u64) {
        if let Some(entry) = self.map.get_mut(key) {
            self.total_bytes = self.total_bytes - entry.bytes + bytes;
            entry.bytes = bytes;
        }
    }

    /// Insert or replace `key` as most recently used, then evict least recently used entries
    /// (never the one just inserted) until the total fits the budget. Returns the evicted
    /// entries. The caller ensures `bytes <= budget`.
    pub(crate) fn insert(&mut self, key: TierKey, value: V, bytes: u64) -> Vec<(TierKey, V)> {
        self.remove(&key);
        let tick = self.tick();
        self.map.insert(key, Entry { value, bytes, tick });
        self.order.insert(tick, key);
        self.total_bytes += bytes;
        let mut evicted = Vec::new();
        while self.total_bytes > self.budget_bytes {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if oldest == key {
                // Only reachable if bytes > budget, which callers rule out; keep it stored.
                self.order.insert(tick, key);
                break;
            }
            let entry = self
                .map
                .remove(&oldest)
                .expect("order and map hold the same keys");
            self.total_bytes -= entry.bytes;
            evicted.push((oldest, entry.value));
        }
        evicted
    }

    /// Remove `key`; returns its value if it was present.
    pub(crate) fn remove(&mut self, key: &TierKey) -> Option<V> {
        let entry = self.map.remove(key)?;
        self.order.remove(&entry.tick);
        self.total_bytes -= entry.bytes;
        Some(entry.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u8) -> TierKey {
        TierKey::new([0; 32], [i; 32])
    }

    #[test]
    fn evicts_least_recently_used_in_exact_order() {
        let mut lru = ByteLru::new(30);
        assert!(lru.insert(k(1), (), 10).is_empty());
        assert!(lru.insert(k(2), (), 10).is_empty());
        assert!(lru.insert(k(3), (), 10).is_empty());
        assert!(lru.get(&k(1)).is_some()); // order now 2, 3, 1
        let evicted: Vec<_> = lru.insert(k(4), (), 15).into_iter().map(|e| e.0).collect();
        assert_eq!(evicted, vec![k(2), k(3)]);
        assert_eq!(lru.total_bytes(), 25);
        assert_eq!(lru.len(), 2);
        assert!(lru.contains(&k(1)) && lru.contains(&k(4)));
    }

    #[test]
    fn replace_and_remove_keep_accounting_exact() {
        let mut lru = ByteLru::new(100);
        lru.insert(k(1), 1, 40);
        lru.insert(k(1), 2, 30);
        assert_eq!(lru.total_bytes(), 30);
        assert_eq!(lru.get(&k(1)), Some(&2));
        lru.resize(&k(1), 35);
        assert_eq!(lru.total_bytes(), 35);
        assert_eq!(lru.remove(&k(1)), Some(2));
        assert_eq!(lru.total_bytes(), 0);
        assert_eq!(lru.remove(&k(1)), None);
    }
}
