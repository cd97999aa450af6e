//! A naive reference model of the cache: flat vectors and linear scans, every order recomputed from
//! scratch. It implements the documented semantics independently of the real data structures
//! (no candidate sets, no protected-set index, no child counters, no incremental gauges).
//! The adaptive segmented LRU's ghost lists are plain vectors (oldest first) scanned linearly.
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::BTreeMap;

use cache::{BlockKey, EvictionPolicy, NamespaceKey, TenantId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Holder {
    Pin(u64),
    Session(u64),
}

#[derive(Clone, Debug, Default)]
pub struct RBlock {
    pub refs: u32,
    pub key: Option<BlockKey>,
    pub parent: Option<usize>,
    pub ns: Option<NamespaceKey>,
    pub depth: u32,
    pub last_use: u64,
    pub hits: u32,
    pub protected: bool,
    pub holders: Vec<Holder>,
}

#[derive(Clone, Debug)]
pub struct RSeq {
    pub ns: NamespaceKey,
    pub tokens: Vec<u32>,
    pub blocks: Vec<usize>,
    pub keys: Vec<BlockKey>,
    pub written: usize,
    pub sealed: bool,
}

pub struct Model {
    pub bs: usize,
    pub policy: EvictionPolicy,
    pub protected_cap: usize,
    /// Adaptive segmented LRU: (min, max) capacity, largest step, and the ghost lists (key,
    /// tenant), oldest first; `None` for the other policies.
    pub adaptive: Option<AdaptiveModel>,
    pub max_cached: usize,
    pub max_retained: usize,
    pub blocks: Vec<RBlock>,
    pub free: Vec<usize>,
    pub seqs: BTreeMap<u64, RSeq>,
    pub next_seq: u64,
    /// holder -> (tier, priority, until, blocks)
    pub records: BTreeMap<Holder, (Rank, Vec<usize>)>,
    pub next_pin: u64,
    pub clock: u64,
    /// Reuse-aware LRU: reads per key, bounded as the cache bounds them.
    pub reads: std::collections::HashMap<BlockKey, u32>,
}

#[derive(Clone, Debug, Default)]
pub struct AdaptiveModel {
    pub min_cap: usize,
    pub max_cap: usize,
    pub max_step: usize,
    pub ghost_cap: usize,
    pub probation: Vec<(BlockKey, TenantId)>,
    pub protected: Vec<(BlockKey, TenantId)>,
    /// (probation ghost hits, protected ghost hits, adaptations up, adaptations down)
    pub counts: [u64; 4],
}

pub type AllocResult = Result<Vec<usize>, (u32, u32)>;
/// A block's retention rank as ordered: (tier, priority, expiry reversed).
type OrderRank = (u8, u8, Reverse<u64>);

/// (tier, priority, until)
pub type Rank = (u8, u8, u64);
/// (child, copy (src, dst)) or (needed, available).
pub type ForkResult = Result<(u64, Option<(usize, usize)>), (u32, u32)>;

impl Model {
    pub fn new(
        n: usize,
        bs: usize,
        policy: EvictionPolicy,
        max_cached_fraction: f64,
        max_retained_fraction: f64,
    ) -> Model {
        let blocks_of = |f: f64| (f * n as f64).floor() as usize;
        let mut adaptive = None;
        let protected_cap = match policy {
            EvictionPolicy::SegmentedLru { protected_fraction } => blocks_of(protected_fraction),
            EvictionPolicy::AdaptiveSegmentedLru {
                initial_protected_fraction,
                min_protected_fraction,
                max_protected_fraction,
            } => {
                adaptive = Some(AdaptiveModel {
                    min_cap: blocks_of(min_protected_fraction),
                    max_cap: blocks_of(max_protected_fraction),
                    max_step: (n / 16).max(1),
                    ghost_cap: n,
                    ..AdaptiveModel::default()
                });
                blocks_of(initial_protected_fraction)
            }
            _ => 0,
        };
        Model {
            bs,
            policy,
            protected_cap,
            adaptive,
            max_cached: (max_cached_fraction * n as f64).floor() as usize,
            max_retained: (max_retained_fraction * n as f64).floor() as usize,
            blocks: vec![RBlock::default(); n],
            free: (0..n).rev().collect(),
            seqs: BTreeMap::new(),
            next_seq: 0,
            reads: Default::default(),
            records: BTreeMap::new(),
            next_pin: 0,
            clock: 0,
        }
    }

    fn now(&mut self, tick: u64) -> u64 {
        self.clock = self.clock.max(tick);
        self.clock
    }

    fn find(&self, key: &BlockKey) -> Option<usize> {
        self.blocks.iter().position(|b| b.key.as_ref() == Some(key))
    }

    /// Later expiry ranks lower (evicted first) among equal tiers and priorities.
    fn rank(&self, id: usize) -> OrderRank {
        self.blocks[id]
            .holders
            .iter()
            .map(|h| {
                let (t, p, u) = self.records[h].0;
                (t, p, Reverse(u))
            })
            .max()
            .unwrap_or((0, 0, Reverse(0)))
    }

    fn is_candidate(&self, id: usize) -> bool {
        let b = &self.blocks[id];
        b.key.is_some()
            && b.refs == 0
            && !self
                .blocks
                .iter()
                .any(|c| c.key.is_some() && c.parent == Some(id))
    }

    fn order_key(&self, id: usize) -> (OrderRank, u64, u64, Reverse<u32>, usize) {
        let b = &self.blocks[id];
        let (primary, bonus) = match self.policy {
            EvictionPolicy::Lru => (0, 0),
            EvictionPolicy::Lfu => (u64::from(b.hits), 0),
            EvictionPolicy::SegmentedLru { .. } | EvictionPolicy::AdaptiveSegmentedLru { .. } => {
                (u64::from(b.protected), 0)
            }
            EvictionPolicy::ReuseAwareLru { reuse_bonus_ms } => {
                let reads = b.key.and_then(|k| self.reads.get(&k)).copied().unwrap_or(0);
                (0, if reads >= 2 { reuse_bonus_ms } else { 0 })
            }
        };
        (
            self.rank(id),
            primary,
            b.last_use + bonus,
            Reverse(b.depth),
            id,
        )
    }

    pub fn eviction_order(&self) -> Vec<usize> {
        let mut c: Vec<_> = (0..self.blocks.len())
            .filter(|&i| self.is_candidate(i))
            .map(|i| self.order_key(i))
            .collect();
        c.sort();
        c.into_iter().map(|k| k.4).collect()
    }

    /// Reuse-aware LRU's read count: saturating at 15; a new key finding `max(8 · blocks,
    /// 1024)` keys remembered first halves every count and forgets the zeros.
    fn read(&mut self, key: BlockKey) {
        if !matches!(self.policy, EvictionPolicy::ReuseAwareLru { .. }) {
            return;
        }
        let cap = (self.blocks.len() * 8).max(1024);
        while !self.reads.contains_key(&key) && self.reads.len() >= cap {
            self.reads.retain(|_, c| {
                *c /= 2;
                *c > 0
            });
        }
        let c = self.reads.entry(key).or_default();
        *c = (*c + 1).min(15);
    }

    fn touch(&mut self, id: usize, now: u64, hit: bool) {
        let slru = self.policy.is_segmented();
        if let (true, Some(k)) = (hit, self.blocks[id].key) {
            self.read(k);
        }
        let b = &mut self.blocks[id];
        b.last_use = b.last_use.max(now);
        if hit {
            b.hits += 1;
            if slru && !b.protected && b.hits >= 2 && b.key.is_some() {
                b.protected = true;
                self.demote_to_cap();
            }
        }
    }

    /// Demote the least recent protected block while the segment is over its capacity.
    fn demote_to_cap(&mut self) {
        loop {
            let prot: Vec<usize> = (0..self.blocks.len())
                .filter(|&i| self.blocks[i].protected)
                .collect();
            if prot.len() <= self.protected_cap {
                break;
            }
            let victim = *prot
                .iter()
                .min_by_key(|&&i| (self.blocks[i].last_use, Reverse(self.blocks[i].depth), i))
                .unwrap();
            self.blocks[victim].protected = false;
        }
    }

    /// A lookup stopped at `key`: ARC's rule on the protected capacity if it is a ghost.
    fn ghost_hit(&mut self, key: &BlockKey) {
        let cap = self.protected_cap;
        let Some(a) = &mut self.adaptive else { return };
        let (np, nq) = (a.probation.len(), a.protected.len());
        let new_cap = if let Some(i) = a.probation.iter().position(|g| g.0 == *key) {
            a.probation.remove(i);
            a.counts[0] += 1;
            let step = (nq / np).max(1).min(a.max_step);
            cap.saturating_sub(step).max(a.min_cap)
        } else if let Some(i) = a.protected.iter().position(|g| g.0 == *key) {
            a.protected.remove(i);
            a.counts[1] += 1;
            let step = (np / nq).max(1).min(a.max_step);
            (cap + step).min(a.max_cap)
        } else {
            return;
        };
        if new_cap > cap {
            a.counts[2] += 1;
        } else if new_cap < cap {
            a.counts[3] += 1;
        }
        self.protected_cap = new_cap;
        self.demote_to_cap();
    }

    /// (probation, protected) ghost lengths, if adaptive.
    pub fn ghost_lens(&self) -> Option<(usize, usize)> {
        self.adaptive
            .as_ref()
            .map(|a| (a.probation.len(), a.protected.len()))
    }

    fn release(&mut self, id: usize, now: u64) {
        let b = &mut self.blocks[id];
        b.refs -= 1;
        if b.refs == 0 {
            if b.key.is_some() {
                b.last_use = b.last_use.max(now);
            } else {
                *b = RBlock::default();
                self.free.push(id);
            }
        }
    }

    fn unpublish(&mut self, id: usize, pressure: bool) {
        if pressure {
            let b = &self.blocks[id];
            if let (Some(a), Some(key), Some(ns)) = (&mut self.adaptive, b.key, b.ns) {
                let list = if b.protected || b.hits >= 2 {
                    &mut a.protected
                } else {
                    &mut a.probation
                };
                list.push((key, ns.tenant()));
                if list.len() > a.ghost_cap {
                    list.remove(0);
                }
            }
        }
        let holders = std::mem::take(&mut self.blocks[id].holders);
        for h in holders {
            if let Some(r) = self.records.get_mut(&h) {
                r.1.retain(|&b| b != id);
            }
        }
        let b = &mut self.blocks[id];
        b.key = None;
        b.parent = None;
        b.ns = None;
        b.protected = false;
        b.hits = 0;
        if b.refs == 0 {
            *b = RBlock::default();
            self.free.push(id);
        }
    }

    fn evict_one(&mut self) {
        let victim = self.eviction_order()[0];
        self.unpublish(victim, true);
    }

    pub fn cached(&self) -> usize {
        self.blocks
            .iter()
            .filter(|b| b.refs == 0 && b.key.is_some())
            .count()
    }

    fn watermark(&mut self) {
        while self.cached() > self.max_cached {
            self.evict_one();
        }
    }

    fn allocate(&mut self, n: usize) -> AllocResult {
        let available = self.free.len() + self.cached();
        if n > available {
            return Err((n as u32, available as u32));
        }
        let mut out = Vec::new();
        for _ in 0..n {
            if self.free.is_empty() {
                self.evict_one();
            }
            let id = self.free.pop().unwrap();
            self.blocks[id].refs = 1;
            out.push(id);
        }
        Ok(out)
    }

    /// lookup + create_sequence. Returns (seq, cached tokens).
    pub fn start(&mut self, ns: NamespaceKey, tokens: &[u32], tick: u64) -> (u64, usize) {
        let now = self.now(tick);
        let max_blocks = tokens.len().saturating_sub(1) / self.bs;
        let mut parent = ns.root();
        let mut blocks = Vec::new();
        let mut keys = Vec::new();
        let mut missed = None;
        for chunk in tokens.chunks_exact(self.bs).take(max_blocks) {
            let key = BlockKey::chain(&parent, chunk);
            let Some(id) = self.find(&key) else {
                missed = Some(key);
                break;
            };
            blocks.push(id);
            keys.push(key);
            parent = key;
        }
        for &id in &blocks {
            self.blocks[id].refs += 1;
            self.touch(id, now, true);
        }
        if let Some(key) = missed {
            self.ghost_hit(&key);
        }
        let cached = blocks.len() * self.bs;
        let id = self.next_seq;
        self.next_seq += 1;
        self.seqs.insert(
            id,
            RSeq {
                ns,
                tokens: tokens[..cached].to_vec(),
                blocks,
                keys,
                written: cached,
                sealed: false,
            },
        );
        (id, cached)
    }

    pub fn peek(&self, ns: NamespaceKey, tokens: &[u32]) -> usize {
        let max_blocks = tokens.len().saturating_sub(1) / self.bs;
        let mut parent = ns.root();
        let mut n = 0;
        for chunk in tokens.chunks_exact(self.bs).take(max_blocks) {
            let key = BlockKey::chain(&parent, chunk);
            if self.find(&key).is_none() {
                break;
            }
            n += 1;
            parent = key;
        }
        n * self.bs
    }

    pub fn append(&mut self, seq: u64, tokens: &[u32], tick: u64) -> AllocResult {
        self.now(tick);
        let s = &self.seqs[&seq];
        let needed = (s.tokens.len() + tokens.len()).div_ceil(self.bs) - s.blocks.len();
        let new = self.allocate(needed)?;
        let s = self.seqs.get_mut(&seq).unwrap();
        s.tokens.extend_from_slice(tokens);
        s.blocks.extend_from_slice(&new);
        Ok(new)
    }

    /// Returns (published, replaced count).
    pub fn mark_written(&mut self, seq: u64, n: usize, tick: u64) -> (usize, usize) {
        let now = self.now(tick);
        let bs = self.bs;
        let s = self.seqs.get_mut(&seq).unwrap();
        s.written = s.written.max(n);
        let target = s.written / bs;
        let (mut published, mut replaced) = (0, 0);
        loop {
            let s = &self.seqs[&seq];
            if s.sealed || s.keys.len() >= target {
                break;
            }
            let i = s.keys.len();
            let parent_key = if i == 0 { s.ns.root() } else { s.keys[i - 1] };
            let key = BlockKey::chain(&parent_key, &s.tokens[i * bs..(i + 1) * bs]);
            let own = s.blocks[i];
            let ns = s.ns;
            let parent = (i > 0).then(|| s.blocks[i - 1]);
            if self.blocks[own].key.is_some() {
                assert_eq!(self.blocks[own].key, Some(key));
            } else if let Some(x) = self.find(&key) {
                self.touch(x, now, true);
                let holders: Vec<u64> = self
                    .seqs
                    .iter()
                    .filter(|(_, s)| s.blocks.get(i) == Some(&own))
                    .map(|(id, _)| *id)
                    .collect();
                for h in holders {
                    self.blocks[x].refs += 1;
                    self.release(own, now);
                    self.seqs.get_mut(&h).unwrap().blocks[i] = x;
                }
                replaced += 1;
            } else {
                let last_use = parent.map_or(now, |p| self.blocks[p].last_use);
                self.read(key);
                let b = &mut self.blocks[own];
                b.key = Some(key);
                b.parent = parent;
                b.ns = Some(ns);
                b.depth = i as u32;
                b.last_use = last_use;
                b.hits = 1;
                published += 1;
                if let Some(a) = &mut self.adaptive {
                    a.probation.retain(|g| g.0 != key);
                    a.protected.retain(|g| g.0 != key);
                }
            }
            self.seqs.get_mut(&seq).unwrap().keys.push(key);
        }
        (published, replaced)
    }

    /// Returns (child, copy (src, dst)) or the allocation error.
    pub fn fork(&mut self, seq: u64, tick: u64) -> ForkResult {
        self.now(tick);
        let s = &self.seqs[&seq];
        let partial = !s.tokens.len().is_multiple_of(self.bs);
        let copy = if partial {
            let src = *s.blocks.last().unwrap();
            let dst = self.allocate(1)?[0];
            Some((src, dst))
        } else {
            None
        };
        let mut child = self.seqs[&seq].clone();
        let shared = child.blocks.len() - usize::from(copy.is_some());
        for &b in &child.blocks[..shared] {
            self.blocks[b].refs += 1;
        }
        if let Some((_, dst)) = copy {
            *child.blocks.last_mut().unwrap() = dst;
        }
        let id = self.next_seq;
        self.next_seq += 1;
        self.seqs.insert(id, child);
        Ok((id, copy))
    }

    pub fn free_seq(&mut self, seq: u64, tick: u64) {
        let now = self.now(tick);
        let s = self.seqs.remove(&seq).unwrap();
        for &b in s.blocks.iter().rev() {
            self.release(b, now);
        }
        self.watermark();
    }

    fn retained_count(&self) -> usize {
        self.blocks.iter().filter(|b| !b.holders.is_empty()).count()
    }

    fn remove_holder(&mut self, h: Holder) -> bool {
        let Some((_, blocks)) = self.records.remove(&h) else {
            return false;
        };
        for b in blocks {
            self.blocks[b].holders.retain(|x| *x != h);
        }
        true
    }

    fn add_holder(&mut self, h: Holder, rank: (u8, u8, u64), blocks: &[usize]) -> (u32, u32) {
        self.records.insert(h, (rank, Vec::new()));
        let mut kept = Vec::new();
        let mut refused = 0;
        for (n, &b) in blocks.iter().enumerate() {
            if self.blocks[b].holders.contains(&h) {
                continue;
            }
            if self.blocks[b].holders.is_empty() && self.retained_count() >= self.max_retained {
                refused = (blocks.len() - n) as u32;
                break;
            }
            self.blocks[b].holders.push(h);
            kept.push(b);
        }
        let n = kept.len() as u32;
        self.records.get_mut(&h).unwrap().1 = kept;
        (n, refused)
    }

    pub fn retain(
        &mut self,
        session: u64,
        seq: u64,
        until: u64,
        prio: u8,
        tick: u64,
    ) -> (u32, u32) {
        self.now(tick);
        let s = &self.seqs[&seq];
        let blocks: Vec<usize> = s.blocks[..s.keys.len()]
            .iter()
            .copied()
            .take_while(|&b| self.blocks[b].key.is_some())
            .collect();
        self.remove_holder(Holder::Session(session));
        self.add_holder(Holder::Session(session), (1, prio, until), &blocks)
    }

    pub fn release_session(&mut self, session: u64) -> bool {
        self.remove_holder(Holder::Session(session))
    }

    pub fn pin(&mut self, ns: NamespaceKey, tokens: &[u32], tick: u64) -> (u64, u32, u32) {
        self.now(tick);
        let mut parent = ns.root();
        let mut blocks = Vec::new();
        for chunk in tokens.chunks_exact(self.bs) {
            let key = BlockKey::chain(&parent, chunk);
            let Some(id) = self.find(&key) else { break };
            blocks.push(id);
            parent = key;
        }
        let pin = self.next_pin;
        self.next_pin += 1;
        let (n, r) = self.add_holder(Holder::Pin(pin), (2, u8::MAX, u64::MAX), &blocks);
        (pin, n, r)
    }

    pub fn unpin(&mut self, pin: u64) -> bool {
        self.remove_holder(Holder::Pin(pin))
    }

    pub fn expire(&mut self, tick: u64) -> usize {
        let now = self.now(tick);
        let expired: Vec<Holder> = self
            .records
            .iter()
            .filter(|(h, (rank, _))| matches!(h, Holder::Session(_)) && rank.2 <= now)
            .map(|(h, _)| *h)
            .collect();
        for h in &expired {
            self.remove_holder(*h);
        }
        expired.len()
    }

    pub fn flush_tenant(&mut self, tenant: TenantId) -> usize {
        let mut victims: Vec<(u32, usize)> = (0..self.blocks.len())
            .filter(|&i| self.blocks[i].ns.is_some_and(|ns| ns.tenant() == tenant))
            .map(|i| (self.blocks[i].depth, i))
            .collect();
        victims.sort_by(|a, b| b.cmp(a));
        for &(_, id) in &victims {
            self.unpublish(id, false);
        }
        if let Some(a) = &mut self.adaptive {
            a.probation.retain(|g| g.1 != tenant);
            a.protected.retain(|g| g.1 != tenant);
        }
        for s in self.seqs.values_mut() {
            if s.ns.tenant() == tenant {
                s.sealed = true;
            }
        }
        victims.len()
    }

    /// (free, in_use, cached, retained, pinned)
    pub fn usage(&self) -> (u32, u32, u32, u32, u32) {
        let in_use = self.blocks.iter().filter(|b| b.refs > 0).count() as u32;
        let pinned = self
            .blocks
            .iter()
            .filter(|b| b.holders.iter().any(|h| matches!(h, Holder::Pin(_))))
            .count();
        (
            self.free.len() as u32,
            in_use,
            self.cached() as u32,
            self.retained_count() as u32,
            pinned as u32,
        )
    }
}
