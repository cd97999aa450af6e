//! Seeded random state machine: random operations on the real cache and on the naive reference
//! model (`common/reference.rs`), compared after every step (results, usage, eviction order, block
//! tables, lookups) with `check_invariants()` after every step. A 2-token vocabulary and 2-token
//! blocks make shared prefixes, duplicates and evictions frequent.

mod common;

use std::collections::BTreeMap;

use cache::{
    AllocError, BlockId, CacheConfig, EvictionPolicy, KvCache, Namespace, NamespaceKey, PinId,
    SeqError, SeqId, SessionId, TenantId, Tick,
};
use common::reference::Model;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const NUM_BLOCKS: u32 = 32;
const BLOCK_SIZE: usize = 2;

struct Harness {
    rng: ChaCha8Rng,
    cache: KvCache,
    model: Model,
    /// real seq id -> model seq id
    seqs: BTreeMap<SeqId, u64>,
    pins: Vec<(PinId, u64)>,
    namespaces: Vec<NamespaceKey>,
    tick: u64,
}

fn policy_for(seed: u64) -> EvictionPolicy {
    match seed % 5 {
        0 => EvictionPolicy::Lru,
        4 => EvictionPolicy::ReuseAwareLru { reuse_bonus_ms: 7 },
        1 => EvictionPolicy::Lfu,
        2 => EvictionPolicy::SegmentedLru {
            protected_fraction: 0.125,
        },
        // 8 of 32 blocks to start, within [2, 24]; one ghost hit moves at most 2.
        _ => EvictionPolicy::AdaptiveSegmentedLru {
            initial_protected_fraction: 0.25,
            min_protected_fraction: 0.0625,
            max_protected_fraction: 0.75,
        },
    }
}

impl Harness {
    fn new(seed: u64) -> Harness {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let policy = policy_for(seed);
        let max_cached = if rng.gen_bool(0.5) { 1.0 } else { 0.6 };
        let max_retained = if rng.gen_bool(0.5) { 1.0 } else { 0.25 };
        let mut config = CacheConfig::new(NUM_BLOCKS);
        config.block_size = BLOCK_SIZE as u32;
        config.policy = policy;
        config.max_cached_fraction = max_cached;
        config.max_retained_fraction = max_retained;
        Harness {
            rng,
            cache: KvCache::new(config).unwrap(),
            model: Model::new(
                NUM_BLOCKS as usize,
                BLOCK_SIZE,
                policy,
                max_cached,
                max_retained,
            ),
            seqs: BTreeMap::new(),
            pins: Vec::new(),
            namespaces: (0..2)
                .map(|t| Namespace::for_tenant(TenantId(t)).key())
                .collect(),
            tick: 1,
        }
    }

    fn tokens(&mut self, max_len: usize) -> Vec<u32> {
        let len = self.rng.gen_range(1..=max_len);
        (0..len).map(|_| self.rng.gen_range(0..2)).collect()
    }

    fn pick_seq(&mut self) -> Option<(SeqId, u64)> {
        if self.seqs.is_empty() {
            return None;
        }
        let i = self.rng.gen_range(0..self.seqs.len());
        self.seqs.iter().nth(i).map(|(a, b)| (*a, *b))
    }

    fn step(&mut self) {
        // Sometimes pass a stale tick: the cache's clock must not go backwards.
        self.tick += self.rng.gen_range(0..3);
        let tick = if self.rng.gen_bool(0.05) {
            self.tick.saturating_sub(5)
        } else {
            self.tick
        };
        let t = Tick(tick);
        let op = self.rng.gen_range(0..100);
        match op {
            0..=24 => {
                if self.seqs.len() >= 4 {
                    return self.free_one(t);
                }
                let ns = self.namespaces[self.rng.gen_range(0..2)];
                let prompt = self.tokens(14);
                let m = self.cache.lookup(&ns, &prompt, t);
                let (mseq, mcached) = self.model.start(ns, &prompt, tick);
                assert_eq!(m.num_cached_tokens(), mcached);
                assert_eq!(m.blocks(), ids(&self.model.seqs[&mseq].blocks).as_slice());
                if self.rng.gen_bool(0.1) {
                    self.cache.release_match(m, t).unwrap();
                    self.model.free_seq(mseq, tick);
                    return;
                }
                let seq = self.cache.create_sequence(m).unwrap();
                self.seqs.insert(seq, mseq);
                let rest = prompt[mcached..].to_vec();
                self.append(seq, mseq, &rest, t);
            }
            25..=39 => {
                let Some((seq, mseq)) = self.pick_seq() else {
                    return;
                };
                let extra = self.tokens(5);
                self.append(seq, mseq, &extra, t);
            }
            40..=54 => {
                let Some((seq, mseq)) = self.pick_seq() else {
                    return;
                };
                let len = self.cache.num_tokens(seq).unwrap();
                let n = self.rng.gen_range(0..=len);
                let r = self.cache.mark_written(seq, n, t).unwrap();
                let (p, d) = self.model.mark_written(mseq, n, tick);
                assert_eq!((r.num_published, r.replaced.len()), (p, d));
            }
            55..=61 => {
                let Some((seq, mseq)) = self.pick_seq() else {
                    return;
                };
                match (self.cache.fork(seq, t), self.model.fork(mseq, tick)) {
                    (Ok(f), Ok((mchild, copy))) => {
                        assert_eq!(f.copy.map(|c| (c.src.index(), c.dst.index())), copy);
                        self.seqs.insert(f.child, mchild);
                    }
                    (
                        Err(SeqError::Alloc(AllocError::OutOfBlocks { needed, available })),
                        Err(e),
                    ) => {
                        assert_eq!((needed, available), e)
                    }
                    (a, b) => panic!("fork diverged: {a:?} vs {b:?}"),
                }
            }
            62..=74 => self.free_one(t),
            75..=80 => {
                let Some((seq, mseq)) = self.pick_seq() else {
                    return;
                };
                let session = self.rng.gen_range(0..4u64);
                let until = tick + self.rng.gen_range(0..20);
                let prio = self.rng.gen_range(0..3u8);
                let r = self
                    .cache
                    .retain_session(SessionId(session), seq, Tick(until), prio, t)
                    .unwrap();
                let m = self.model.retain(session, mseq, until, prio, tick);
                assert_eq!((r.retained_blocks, r.refused_blocks), m);
            }
            81..=84 => {
                assert_eq!(self.cache.expire(t), self.model.expire(tick));
            }
            85..=87 => {
                let session = self.rng.gen_range(0..4u64);
                assert_eq!(
                    self.cache.release_session(SessionId(session)).is_ok(),
                    self.model.release_session(session)
                );
            }
            88..=91 => {
                let ns_i = self.rng.gen_range(0..2);
                let prompt = self.tokens(10);
                let p = self.cache.pin_prefix(&self.namespaces[ns_i], &prompt, t);
                let (mpin, n, r) = self.model.pin(self.namespaces[ns_i], &prompt, tick);
                assert_eq!((p.num_blocks, p.refused_blocks), (n, r));
                self.pins.push((p.pin, mpin));
            }
            92..=95 => {
                if self.pins.is_empty() {
                    return;
                }
                let i = self.rng.gen_range(0..self.pins.len());
                let (pin, mpin) = self.pins.swap_remove(i);
                assert_eq!(self.cache.unpin(pin).is_ok(), self.model.unpin(mpin));
            }
            96..=97 => {
                let ns_i = self.rng.gen_range(0..2);
                let prompt = self.tokens(14);
                assert_eq!(
                    self.cache.peek_prefix(&self.namespaces[ns_i], &prompt),
                    self.model.peek(self.namespaces[ns_i], &prompt)
                );
            }
            _ => {
                if self.rng.gen_bool(0.2) {
                    let tenant = TenantId(self.rng.gen_range(0..2));
                    assert_eq!(
                        self.cache.flush_tenant(tenant) as usize,
                        self.model.flush_tenant(tenant)
                    );
                }
            }
        }
    }

    fn append(&mut self, seq: SeqId, mseq: u64, tokens: &[u32], t: Tick) {
        match (
            self.cache.append_tokens(seq, tokens, t),
            self.model.append(mseq, tokens, t.0),
        ) {
            (Ok(a), Ok(b)) => assert_eq!(a, ids(&b)),
            (Err(SeqError::Alloc(AllocError::OutOfBlocks { needed, available })), Err(e)) => {
                assert_eq!((needed, available), e)
            }
            (a, b) => panic!("append diverged: {a:?} vs {b:?}"),
        }
    }

    fn free_one(&mut self, t: Tick) {
        let Some((seq, mseq)) = self.pick_seq() else {
            return;
        };
        self.cache.free(seq, t).unwrap();
        self.model.free_seq(mseq, t.0);
        self.seqs.remove(&seq);
    }

    fn compare(&self, step: usize) {
        if let Err(e) = self.cache.check_invariants() {
            panic!("step {step}: {e}");
        }
        let u = self.cache.usage();
        assert_eq!(
            (u.free, u.in_use, u.cached, u.retained, u.pinned),
            self.model.usage(),
            "step {step}: usage"
        );
        assert_eq!(
            self.cache.eviction_order(),
            ids(&self.model.eviction_order()),
            "step {step}: eviction order"
        );
        assert_eq!(
            (
                self.cache.protected_capacity() as usize,
                self.cache.ghost_lens()
            ),
            (self.model.protected_cap, self.model.ghost_lens()),
            "step {step}: protected capacity and ghost lists"
        );
        if let Some(a) = &self.model.adaptive {
            let c = self.cache.counters();
            assert_eq!(
                [
                    c.slru_ghost_probation_hits,
                    c.slru_ghost_protected_hits,
                    c.slru_adaptations_up,
                    c.slru_adaptations_down
                ],
                a.counts,
                "step {step}: adaptation counters"
            );
        }
        for (seq, mseq) in &self.seqs {
            assert_eq!(
                self.cache.block_table(*seq).unwrap(),
                ids(&self.model.seqs[mseq].blocks).as_slice(),
                "step {step}: table"
            );
        }
    }
}

fn ids(v: &[usize]) -> Vec<BlockId> {
    v.iter().map(|&i| BlockId(i as u32)).collect()
}

fn run(seed: u64, steps: usize) -> cache::Counters {
    let mut h = Harness::new(seed);
    for step in 0..steps {
        h.step();
        h.compare(step);
    }
    // Drain: free everything; every block must end free or cached.
    let seqs: Vec<_> = h.seqs.keys().copied().collect();
    for s in seqs {
        h.cache.free(s, Tick(h.tick)).unwrap();
    }
    let u = h.cache.usage();
    assert_eq!(u.in_use, 0);
    assert_eq!(u.free + u.cached, u.total);
    h.cache.check_invariants().unwrap();
    *h.cache.counters()
}

/// The run must actually exercise what it claims to check.
fn assert_coverage(all: &[cache::Counters]) {
    let sum = |f: fn(&cache::Counters) -> u64| all.iter().map(f).sum::<u64>();
    assert!(sum(|c| c.evictions.capacity) > 5000);
    assert!(sum(|c| c.evictions.watermark) > 300);
    assert!(sum(|c| c.evictions.retained) > 200);
    assert!(sum(|c| c.evictions.flush) > 1000);
    assert!(sum(|c| c.alloc_failures) > 50);
    assert!(sum(|c| c.publish_duplicates) > 300);
    assert!(sum(|c| c.copy_on_write_blocks) > 1000);
    assert!(sum(|c| c.lookup_hit_tokens) > 10_000);
    assert!(sum(|c| c.slru_demotions) > 500);
    assert!(sum(|c| c.retention_refused_blocks) > 300);
    assert!(sum(|c| c.retention_expiries) > 1000);
    assert!(sum(|c| c.slru_ghost_probation_hits) > 600);
    assert!(sum(|c| c.slru_ghost_protected_hits) > 350);
    assert!(sum(|c| c.slru_adaptations_up) > 300);
    assert!(sum(|c| c.slru_adaptations_down) > 600);
}

#[test]
fn random_ops_match_reference_model_400k_steps() {
    // 40 seeds × 10k steps: every policy (adaptive SLRU included), with and without watermark /
    // retention cap.
    let counters: Vec<_> = (0..40).map(|seed| run(seed, 10_000)).collect();
    assert_coverage(&counters);
}

#[test]
#[ignore = "long run: cargo test -p cache --test state_machine -- --ignored"]
fn random_ops_match_reference_model_long() {
    let counters: Vec<_> = (100..400).map(|seed| run(seed, 20_000)).collect();
    assert_coverage(&counters);
}
