//! `check_invariants()`: a full O(blocks + table entries) recount of every structure against the
//! others. Owns no state; never repairs anything. Tests call it after every step.

use std::collections::{BTreeMap, HashMap};

use crate::cache::KvCache;
use crate::config::EvictionPolicy;
use crate::error::InvariantViolation;
use crate::evict::slru::ProtectedSegment;
use crate::evict::{order_key, BlockStats};
use crate::ids::BlockId;
use crate::pool::{Block, Published};
use crate::retention::Holder;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(InvariantViolation(format!($($fmt)+)));
        }
    };
}

impl KvCache {
    /// The protected capacity, its gauge and the ghost lists.
    fn check_adaptive(&self) -> Result<(), InvariantViolation> {
        let capacity = self.protected.capacity;
        ensure!(
            self.counters.slru_protected_capacity_blocks == u64::from(capacity),
            "protected capacity gauge {} but capacity {capacity}",
            self.counters.slru_protected_capacity_blocks
        );
        let (initial, min, max) = self.config.protected_capacity_bounds();
        let Some(a) = &self.adaptive else {
            ensure!(
                !matches!(
                    self.config.policy,
                    EvictionPolicy::AdaptiveSegmentedLru { .. }
                ),
                "adaptive policy without its state"
            );
            ensure!(
                capacity == initial,
                "fixed protected capacity {capacity} moved from {initial}"
            );
            return Ok(());
        };
        ensure!(
            (a.min_capacity, a.max_capacity) == (min, max) && (min..=max).contains(&capacity),
            "protected capacity {capacity} outside [{min}, {max}]"
        );
        for (name, ghost, other) in [
            ("probation", &a.probation, &a.protected),
            ("protected", &a.protected, &a.probation),
        ] {
            ensure!(
                ghost.cap() == self.pool.blocks.len(),
                "{name} ghost cap {} is not num_blocks",
                ghost.cap()
            );
            if let Err(e) = ghost.check() {
                return Err(InvariantViolation(format!("{name} ghost: {e}")));
            }
            for key in ghost.keys() {
                ensure!(
                    self.index.get(key).is_none(),
                    "{key:?} both resident and in the {name} ghost"
                );
                ensure!(!other.contains(key), "{key:?} in both ghost lists");
            }
        }
        Ok(())
    }

    /// Verify every structural invariant:
    /// - free + in use + cached = total, and each figure matches a recount;
    /// - no block twice in the free list; free blocks are unreferenced, unpublished, unretained;
    /// - a referenced block is never an eviction candidate; candidates are exactly the unreferenced
    ///   published chain tails, each under its current order key (global and per tenant);
    /// - every indexed key maps to a block holding that key, and every published block is indexed;
    /// - a child is published only if its parent is (same namespace, depth − 1), child counts match;
    /// - a referenced published block has a referenced parent (so cached blocks are reclaimable);
    /// - ref counts equal the references from block tables and outstanding prefix matches;
    /// - block tables: `ceil(tokens / block_size)` blocks, a partial last block is not shared,
    ///   the published prefix of an unsealed sequence is published under the sequence's keys;
    /// - the protected segment, retention records and gauges, tenant gauges, the watermark and the
    ///   fragmentation counter match a recount;
    /// - the protected capacity (and its gauge) is the configured one, or for the adaptive policy
    ///   within its bounds; ghost lists are within their cap, consistent, disjoint, and hold no
    ///   resident key.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let n = self.pool.blocks.len();
        let bs = self.block_size;

        // Miss diagnostics mirror the published set.
        self.divergence
            .check(|id| self.pool.get(id).published.is_some())
            .map_err(|e| InvariantViolation(format!("miss diagnostics: {e}")))?;

        let seen = self.check_free_list()?;
        let refs = self.check_tables_and_count_refs()?;

        let (mut free, mut in_use, mut cached) = (0u32, 0u32, 0u32);
        let mut children = vec![0u32; n];
        let mut tenant_cached: BTreeMap<_, u32> = BTreeMap::new();
        let (mut retained, mut pinned) = (0u32, 0u32);
        let mut unused_slots = 0u64;
        for s in self.seqs.map.values() {
            unused_slots += s.unused_slots(bs);
        }
        for (i, b) in self.pool.blocks.iter().enumerate() {
            let id = BlockId(i as u32);
            ensure!(
                b.ref_count == refs[i],
                "{id}: ref count {} but {} references",
                b.ref_count,
                refs[i]
            );
            if b.is_free {
                ensure!(seen[i], "{id} marked free but not in the free list");
                free += 1;
                continue;
            }
            ensure!(!seen[i], "{id} in the free list but not marked free");
            if b.ref_count > 0 {
                in_use += 1;
            } else {
                ensure!(
                    b.published.is_some(),
                    "{id}: unreferenced, unpublished, not free (leaked)"
                );
                cached += 1;
            }
            if !b.holders.is_empty() {
                retained += 1;
                ensure!(b.published.is_some(), "{id}: retained but unpublished");
            }
            if b.holders.iter().any(|h| matches!(h, Holder::Pin(_))) {
                pinned += 1;
            }
            for h in &b.holders {
                let rec = self.registry.records.get(h);
                ensure!(
                    rec.is_some_and(|r| r.blocks.contains(&id)),
                    "{id}: holder {h:?} does not list it"
                );
            }
            let Some(p) = b.published else {
                ensure!(
                    b.candidate.is_none() && !b.protected,
                    "{id}: unpublished but ranked"
                );
                continue;
            };
            *tenant_cached.entry(p.ns.tenant()).or_default() += 1;
            self.check_published(id, b, &p, &mut children)?;
        }
        for (i, b) in self.pool.blocks.iter().enumerate() {
            ensure!(
                b.num_children == children[i],
                "b{i}: child count {} but {} children",
                b.num_children,
                children[i]
            );
        }
        ensure!(
            free + in_use + cached == self.config.num_blocks,
            "free {free} + in use {in_use} + cached {cached} != total"
        );
        ensure!(
            free == self.pool.num_free() && in_use == self.num_in_use && cached == self.num_cached,
            "usage gauges drifted"
        );
        ensure!(
            cached <= self.max_cached_blocks,
            "cached {cached} over the watermark {}",
            self.max_cached_blocks
        );
        ensure!(
            self.index.len()
                == self
                    .pool
                    .blocks
                    .iter()
                    .filter(|b| b.published.is_some())
                    .count(),
            "index holds unpublished keys"
        );
        self.check_candidate_sets()?;
        self.check_adaptive()?;
        ensure!(
            retained == self.registry.num_retained_blocks
                && pinned == self.registry.num_pinned_blocks,
            "retention gauges drifted"
        );
        ensure!(
            retained <= self.max_retained_blocks,
            "retained {retained} over the cap"
        );
        self.check_retention_records()?;
        for (t, c) in &self.tenants.counters {
            let expect = tenant_cached.get(t).copied().unwrap_or(0);
            ensure!(
                c.cached_blocks == expect,
                "{t}: cached gauge {} but {expect}",
                c.cached_blocks
            );
        }
        ensure!(
            unused_slots == self.unused_slots,
            "fragmentation counter drifted"
        );
        Ok(())
    }

    /// The checks of one published block `id`: indexed under its key, its parent published in
    /// the chain (counted in `children`), its candidacy and protected flag current.
    fn check_published(
        &self,
        id: BlockId,
        b: &Block,
        p: &Published,
        children: &mut [u32],
    ) -> Result<(), InvariantViolation> {
        ensure!(
            self.index.get(&p.key) == Some(id),
            "{id}: published key not indexed to it"
        );
        match p.parent {
            None => ensure!(p.depth == 0, "{id}: root block at depth {}", p.depth),
            Some(parent) => {
                let pb = self.pool.get(parent);
                let pp = pb.published;
                ensure!(
                    pp.is_some_and(|pp| pp.ns == p.ns && pp.depth + 1 == p.depth),
                    "{id}: parent {parent} not published in the chain"
                );
                children[parent.index()] += 1;
                if b.ref_count > 0 {
                    ensure!(
                        pb.ref_count > 0,
                        "{id}: referenced but its parent {parent} is not"
                    );
                }
            }
        }
        let eligible = b.ref_count == 0 && b.num_children == 0;
        let stats = BlockStats {
            last_use: b.last_use,
            hits: b.hits,
            protected: b.protected,
            depth: p.depth,
            reuse_bonus_ms: b.reuse_bonus_ms,
        };
        ensure!(
            b.reuse_bonus_ms == 0 || self.reuse.is_some(),
            "{id}: a reuse bonus under a policy without one"
        );
        if eligible {
            let key = order_key(
                self.config.policy,
                self.registry.rank_of(&b.holders),
                &stats,
            );
            ensure!(
                b.candidate == Some(key),
                "{id}: candidate key stale or missing"
            );
            ensure!(
                self.candidates.global.contains(&(key, id)),
                "{id}: missing from the candidate set"
            );
            let tenant_set = self.candidates.by_tenant.get(&p.ns.tenant());
            ensure!(
                tenant_set.is_some_and(|s| s.contains(&(key, id))),
                "{id}: missing from its tenant's candidates"
            );
        } else {
            ensure!(
                b.candidate.is_none(),
                "{id}: referenced or has children but is a candidate"
            );
        }
        ensure!(
            b.protected
                == self
                    .protected
                    .set
                    .contains(&ProtectedSegment::entry(&stats, id)),
            "{id}: protected flag and segment disagree"
        );
        Ok(())
    }

    /// The candidate sets (global, per tenant, flagged blocks) and the protected segment agree.
    fn check_candidate_sets(&self) -> Result<(), InvariantViolation> {
        let n_cands = self.candidates.global.len();
        let n_tenant: usize = self.candidates.by_tenant.values().map(|s| s.len()).sum();
        let n_flagged = self
            .pool
            .blocks
            .iter()
            .filter(|b| b.candidate.is_some())
            .count();
        ensure!(
            n_cands == n_tenant && n_cands == n_flagged,
            "candidate sets disagree"
        );
        let n_protected = self.pool.blocks.iter().filter(|b| b.protected).count();
        ensure!(
            n_protected == self.protected.set.len(),
            "protected segment holds stale entries"
        );
        ensure!(
            self.protected.set.len() <= self.protected.capacity as usize,
            "protected segment over capacity"
        );
        Ok(())
    }

    /// Retention gauges per tenant and the registry's records match the blocks' holders.
    fn check_retention_records(&self) -> Result<(), InvariantViolation> {
        let mut retained_by_tenant: std::collections::BTreeMap<crate::ids::TenantId, u32> =
            Default::default();
        for b in &self.pool.blocks {
            if let (Some(p), false) = (b.published, b.holders.is_empty()) {
                *retained_by_tenant.entry(p.ns.tenant()).or_default() += 1;
            }
        }
        for (t, c) in &self.tenants.counters {
            let counted = retained_by_tenant.get(t).copied().unwrap_or(0);
            ensure!(
                c.retained_blocks == counted,
                "tenant {t:?} retained gauge {} but {counted} blocks carry retention",
                c.retained_blocks
            );
        }
        let mut listed: HashMap<Holder, usize> = HashMap::new();
        for (h, r) in &self.registry.records {
            for id in &r.blocks {
                ensure!(
                    self.pool.get(*id).holders.contains(h),
                    "{h:?} lists {id} which does not hold it"
                );
            }
            listed.insert(*h, r.blocks.len());
        }
        Ok(())
    }

    /// The free list: in range, no block twice, every listed block free and stateless. Returns
    /// which blocks it lists.
    fn check_free_list(&self) -> Result<Vec<bool>, InvariantViolation> {
        let n = self.pool.blocks.len();
        // Free list.
        let mut seen = vec![false; n];
        for &id in &self.pool.free {
            ensure!(id.index() < n, "{id} out of range in free list");
            ensure!(!seen[id.index()], "{id} twice in the free list");
            seen[id.index()] = true;
            let b = self.pool.get(id);
            ensure!(b.is_free, "{id} in free list but not marked free");
            ensure!(
                b.ref_count == 0 && b.published.is_none() && b.holders.is_empty(),
                "free {id} has state"
            );
        }
        Ok(seen)
    }

    /// Block tables (block and key counts, unshared partial blocks, published prefixes) and
    /// the references they and outstanding prefix matches hold, per block.
    fn check_tables_and_count_refs(&self) -> Result<Vec<u32>, InvariantViolation> {
        let (n, bs) = (self.pool.blocks.len(), self.block_size);
        // Ref counts from tables and matches.
        let mut refs = vec![0u32; n];
        for (sid, s) in &self.seqs.map {
            ensure!(
                s.blocks.len() == s.tokens.len().div_ceil(bs),
                "{sid}: {} blocks for {} tokens",
                s.blocks.len(),
                s.tokens.len()
            );
            ensure!(
                s.keys.len() <= s.tokens.len() / bs,
                "{sid}: more keys than full blocks"
            );
            for &id in &s.blocks {
                refs[id.index()] += 1;
            }
            if s.tokens.len() % bs != 0 {
                let last = *s.blocks.last().expect("non-empty");
                ensure!(
                    self.pool.get(last).ref_count == 1,
                    "{sid}: partial last block {last} is shared"
                );
            }
            if !s.sealed {
                for (i, key) in s.keys.iter().enumerate() {
                    let b = self.pool.get(s.blocks[i]);
                    ensure!(
                        b.published.is_some_and(|p| p.key == *key && p.ns == s.ns),
                        "{sid}: block {i} not published under its key"
                    );
                }
            }
        }
        for m in self.matches.values() {
            for &id in &m.blocks {
                refs[id.index()] += 1;
            }
        }
        Ok(refs)
    }
}
