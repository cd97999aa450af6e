//! Explicit flushes: everything, one namespace, one tenant. Unpublishes every block in scope
//! (deepest first); referenced ones stay with their sequences as private blocks and those
//! sequences never publish again. The flushed namespaces' keys also leave the adaptive policy's
//! ghost lists (a flush is never a ghost: it says nothing about segment sizes).

use super::KvCache;
use crate::counters::EvictionCause;
use crate::ids::{BlockId, TenantId};
use crate::key::NamespaceKey;

impl KvCache {
    fn flush_where(&mut self, in_scope: impl Fn(&NamespaceKey) -> bool) -> u32 {
        let mut victims: Vec<(u32, BlockId)> = self
            .pool
            .blocks
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let p = b.published.as_ref()?;
                in_scope(&p.ns).then_some((p.depth, BlockId(i as u32)))
            })
            .collect();
        victims.sort_by(|a, b| b.cmp(a));
        for &(_, id) in &victims {
            self.unpublish(id, EvictionCause::Flush);
        }
        for s in self.seqs.map.values_mut() {
            if in_scope(&s.ns) {
                s.sealed = true;
            }
        }
        for m in self.matches.values_mut() {
            if in_scope(&m.ns) {
                m.sealed = true;
            }
        }
        self.ghost_on_flush(&in_scope);
        self.divergence.on_flush(&in_scope);
        victims.len() as u32
    }

    /// Unpublish every block. Returns the number of blocks unpublished.
    pub fn flush_all(&mut self) -> u32 {
        self.flush_where(|_| true)
    }

    /// Unpublish every block of one namespace.
    pub fn flush_namespace(&mut self, ns: &NamespaceKey) -> u32 {
        self.flush_where(|n| n == ns)
    }

    /// Unpublish every block of one tenant (all its namespaces).
    pub fn flush_tenant(&mut self, tenant: TenantId) -> u32 {
        self.flush_where(|n| n.tenant() == tenant)
    }
}
