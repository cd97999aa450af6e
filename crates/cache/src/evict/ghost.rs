//! A bounded ghost list: the keys (and namespaces) of recently evicted blocks, oldest dropped first
//! once it holds `cap` keys. Owns only keys and their insertion order; never holds a block, never
//! decides anything (the adaptive policy reads it). Insert, remove and contains are O(log n).

use std::collections::{BTreeMap, HashMap};

use crate::key::{BlockKey, NamespaceKey};

#[derive(Debug)]
pub(crate) struct GhostList {
    cap: usize,
    next_seq: u64,
    /// key -> (insertion sequence number, namespace)
    by_key: HashMap<BlockKey, (u64, NamespaceKey)>,
    /// insertion sequence number -> key; the first entry is the oldest.
    order: BTreeMap<u64, BlockKey>,
}

impl GhostList {
    pub fn new(cap: usize) -> GhostList {
        GhostList {
            cap,
            next_seq: 0,
            by_key: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    pub fn contains(&self, key: &BlockKey) -> bool {
        self.by_key.contains_key(key)
    }

    /// Record `key` as the newest entry (moving it if present); drop the oldest beyond `cap`.
    pub fn insert(&mut self, key: BlockKey, ns: NamespaceKey) {
        self.remove(&key);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.by_key.insert(key, (seq, ns));
        self.order.insert(seq, key);
        while self.by_key.len() > self.cap {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.by_key.remove(&oldest);
        }
    }

    /// Remove `key`; returns whether it was there.
    pub fn remove(&mut self, key: &BlockKey) -> bool {
        match self.by_key.remove(key) {
            Some((seq, _)) => {
                self.order.remove(&seq);
                true
            }
            None => false,
        }
    }

    /// Keep only the keys whose namespace satisfies `keep` (flushes). O(n log n).
    pub fn retain_namespaces(&mut self, keep: impl Fn(&NamespaceKey) -> bool) {
        let order = &mut self.order;
        self.by_key.retain(|_, (seq, ns)| {
            let kept = keep(ns);
            if !kept {
                order.remove(seq);
            }
            kept
        });
    }

    /// The keys, oldest first.
    pub fn keys(&self) -> impl Iterator<Item = &BlockKey> {
        self.order.values()
    }

    /// Structural check for `check_invariants`: within the cap, the two maps agree.
    pub fn check(&self) -> Result<(), String> {
        if self.by_key.len() > self.cap {
            return Err(format!(
                "{} keys over the cap {}",
                self.by_key.len(),
                self.cap
            ));
        }
        if self.order.len() != self.by_key.len() {
            return Err("order and key map differ in size".into());
        }
        for (seq, key) in &self.order {
            if self.by_key.get(key).map(|e| e.0) != Some(*seq) {
                return Err(format!("{key:?} out of order"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TenantId;
    use crate::key::Namespace;

    fn key(i: u8) -> BlockKey {
        BlockKey([i; 32])
    }

    fn ns(t: u32) -> NamespaceKey {
        Namespace::for_tenant(TenantId(t)).key()
    }

    #[test]
    fn oldest_dropped_at_cap_and_reinsert_refreshes() {
        let mut g = GhostList::new(3);
        for i in 1..=3 {
            g.insert(key(i), ns(0));
        }
        g.insert(key(1), ns(0)); // 1 becomes the newest
        g.insert(key(4), ns(0)); // drops 2, the oldest
        let keys: Vec<_> = g.keys().copied().collect();
        assert_eq!(keys, vec![key(3), key(1), key(4)]);
        assert!(!g.contains(&key(2)) && g.contains(&key(1)));
        assert!(g.remove(&key(3)));
        assert!(!g.remove(&key(3)));
        assert_eq!(g.len(), 2);
        g.check().unwrap();
    }

    #[test]
    fn retain_namespaces_drops_a_tenant() {
        let mut g = GhostList::new(10);
        g.insert(key(1), ns(0));
        g.insert(key(2), ns(1));
        g.insert(key(3), ns(0));
        g.retain_namespaces(|n| n.tenant() != TenantId(0));
        assert_eq!(g.keys().copied().collect::<Vec<_>>(), vec![key(2)]);
        g.check().unwrap();
        g.retain_namespaces(|_| false);
        assert_eq!(g.len(), 0);
        g.check().unwrap();
    }
}
