//! Lifecycle behaviour: visibility only after write, failed allocation changes nothing, fork with
//! copy-on-write, duplicates, flush while referenced, quotas, watermark, fragmentation, events.

mod common;

use cache::{
    AllocError, BlockCopy, CacheConfig, CacheEvent, EvictionCause, EvictionPolicy, KvCache,
    SeqError, SessionId, TenantId, Tick,
};
use common::*;

#[test]
fn block_is_invisible_until_marked_written() {
    let mut cache = KvCache::new(config(8, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    let prompt = toks(0, 9);
    let s = cache.create_empty_sequence(&ns);
    cache.append_tokens(s, &prompt, Tick(1)).unwrap();
    assert_eq!(
        cache.peek_prefix(&ns, &prompt),
        0,
        "appended but not written"
    );
    cache.mark_written(s, 7, Tick(1)).unwrap();
    assert_eq!(
        cache.peek_prefix(&ns, &prompt),
        4,
        "only the first full written block"
    );
    cache.mark_written(s, 8, Tick(1)).unwrap();
    assert_eq!(cache.peek_prefix(&ns, &prompt), 8);
    assert_eq!(
        cache.mark_written(s, 10, Tick(1)),
        Err(SeqError::WrittenBeyondEnd {
            seq: s,
            written: 10,
            len: 9
        })
    );
    cache.check_invariants().unwrap();
}

#[test]
fn failed_allocation_changes_nothing() {
    let mut cache = KvCache::new(config(4, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    call(&mut cache, &ns, &toks(0, 8), 1); // 2 cached
    let (s, _) = start(&mut cache, &ns, &toks(50, 6), 2); // 2 in use
    let usage = cache.usage();
    let order = cache.eviction_order();
    let table = cache.block_table(s).unwrap().to_vec();
    // 6 + 15 = 21 tokens = 6 blocks: 4 more needed, 2 available.
    let err = cache.append_tokens(s, &toks(90, 15), Tick(3)).unwrap_err();
    assert_eq!(
        err,
        SeqError::Alloc(AllocError::OutOfBlocks {
            needed: 4,
            available: 2
        })
    );
    assert_eq!(cache.usage(), usage);
    assert_eq!(cache.eviction_order(), order);
    assert_eq!(cache.block_table(s).unwrap(), table.as_slice());
    assert_eq!(cache.num_tokens(s).unwrap(), 6);
    assert_eq!(
        cache.peek_prefix(&ns, &toks(0, 9)),
        8,
        "nothing was evicted"
    );
    assert!(!cache.can_allocate(3) && cache.can_allocate(2));
    // Fork needs one block for the partial last block: succeeds with 2 available.
    cache.check_invariants().unwrap();
}

#[test]
fn fork_shares_full_blocks_and_copies_the_partial_one() {
    let mut cache = KvCache::new(config(8, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    let (s, _) = start(&mut cache, &ns, &toks(0, 10), 1); // b0 b1 full, b2 partial (2 tokens)
    let f = cache.fork(s, Tick(2)).unwrap();
    assert_eq!(
        f.copy,
        Some(BlockCopy {
            src: cache::BlockId(2),
            dst: cache::BlockId(3),
            num_tokens: 2
        })
    );
    assert_eq!(
        cache.block_table(f.child).unwrap(),
        ids(&[0, 1, 3]).as_slice()
    );
    assert_eq!(cache.ref_count(cache::BlockId(0)), Some(2));
    assert_eq!(cache.ref_count(cache::BlockId(2)), Some(1));
    // Diverge: both complete their third block differently and publish it.
    cache.append_tokens(s, &[1, 1], Tick(3)).unwrap();
    cache.append_tokens(f.child, &[2, 2], Tick(3)).unwrap();
    cache.mark_written(s, 12, Tick(3)).unwrap();
    cache.mark_written(f.child, 12, Tick(3)).unwrap();
    let mut a = toks(0, 10);
    a.extend([1, 1, 0]);
    let mut b = toks(0, 10);
    b.extend([2, 2, 0]);
    assert_eq!(cache.peek_prefix(&ns, &a), 12);
    assert_eq!(cache.peek_prefix(&ns, &b), 12);
    cache.check_invariants().unwrap();
    cache.free(s, Tick(4)).unwrap();
    cache.free(f.child, Tick(4)).unwrap();
    assert_eq!(cache.usage().cached, 4);
    cache.check_invariants().unwrap();
}

#[test]
fn fork_fails_cleanly_when_no_block_for_the_copy() {
    let mut cache = KvCache::new(config(2, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    let (s, _) = start(&mut cache, &ns, &toks(0, 6), 1);
    let usage = cache.usage();
    assert!(matches!(cache.fork(s, Tick(2)), Err(SeqError::Alloc(_))));
    assert_eq!(cache.usage(), usage);
    assert_eq!(cache.num_sequences(), 1);
    cache.check_invariants().unwrap();
}

#[test]
fn duplicate_publish_switches_to_the_cached_block() {
    let mut cache = KvCache::new(config(8, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    let prompt = toks(0, 8);
    // Two sequences compute the same prompt concurrently.
    let s1 = cache.create_empty_sequence(&ns);
    let s2 = cache.create_empty_sequence(&ns);
    cache.append_tokens(s1, &prompt, Tick(1)).unwrap(); // b0 b1
    cache.append_tokens(s2, &prompt, Tick(1)).unwrap(); // b2 b3
    assert_eq!(cache.mark_written(s1, 8, Tick(1)).unwrap().num_published, 2);
    let r = cache.mark_written(s2, 8, Tick(2)).unwrap();
    assert_eq!(r.num_published, 0);
    assert_eq!(r.replaced.len(), 2);
    assert_eq!(cache.block_table(s2).unwrap(), ids(&[0, 1]).as_slice());
    assert_eq!(
        cache.usage().free,
        6,
        "the duplicates went back to the pool"
    );
    assert_eq!(cache.counters().publish_duplicates, 2);
    cache.check_invariants().unwrap();
}

#[test]
fn flush_while_referenced_unpublishes_and_seals() {
    let mut cache = KvCache::new(config(8, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    let (s, _) = start(&mut cache, &ns, &toks(0, 6), 1);
    let m = cache.lookup(&ns, &toks(0, 6), Tick(2)); // holds b0
    assert_eq!(cache.flush_all(), 1);
    assert_eq!(cache.peek_prefix(&ns, &toks(0, 9)), 0);
    cache.append_tokens(s, &[9, 9], Tick(3)).unwrap();
    cache.mark_written(s, 8, Tick(3)).unwrap();
    assert_eq!(
        cache.peek_prefix(&ns, &toks(0, 9)),
        0,
        "a sealed sequence never publishes"
    );
    let s2 = cache.create_sequence(m).unwrap();
    assert_eq!(cache.num_published_blocks(s2).unwrap(), 0);
    cache.check_invariants().unwrap();
    cache.free(s, Tick(4)).unwrap();
    cache.free(s2, Tick(4)).unwrap();
    assert_eq!(cache.usage().free, 8);
    cache.check_invariants().unwrap();
}

#[test]
fn tenant_quota_evicts_own_blocks_first_then_refuses() {
    let mut cfg = config(16, 4, EvictionPolicy::Lru);
    cfg.tenant_quota_blocks.insert(TenantId(1), 2);
    let mut cache = KvCache::new(cfg).unwrap();
    let (a, b) = (ns(1), ns(2));
    call(&mut cache, &b, &toks(500, 8), 1); // tenant 2: 2 blocks, no quota
    call(&mut cache, &a, &toks(0, 8), 2); // tenant 1: at quota
    call(&mut cache, &a, &toks(100, 8), 3); // evicts tenant 1's own blocks, never tenant 2's
    assert_eq!(cache.counters().evictions.quota, 2);
    assert_eq!(cache.peek_prefix(&b, &toks(500, 9)), 8);
    assert_eq!(cache.peek_prefix(&a, &toks(100, 9)), 8);
    // Now hold both quota blocks in use: the next publish is refused, not forced.
    let (s, _) = start(&mut cache, &a, &toks(100, 9), 4);
    let s2 = cache.create_empty_sequence(&a);
    cache.append_tokens(s2, &toks(900, 4), Tick(5)).unwrap();
    let r = cache.mark_written(s2, 4, Tick(5)).unwrap();
    assert!(r.refused_by_quota);
    assert_eq!(cache.tenant_counters(TenantId(1)).quota_refusals, 1);
    assert_eq!(cache.tenant_counters(TenantId(1)).cached_blocks, 2);
    cache.check_invariants().unwrap();
    cache.free(s, Tick(6)).unwrap();
    cache.free(s2, Tick(6)).unwrap();
    cache.check_invariants().unwrap();
}

#[test]
fn watermark_caps_cached_blocks() {
    let mut cfg = config(10, 4, EvictionPolicy::Lru);
    cfg.max_cached_fraction = 0.3; // 3 blocks
    let mut cache = KvCache::new(cfg).unwrap();
    let ns = ns(1);
    call(&mut cache, &ns, &toks(0, 8), 1);
    call(&mut cache, &ns, &toks(50, 8), 2);
    assert_eq!(cache.usage().cached, 3);
    assert_eq!(cache.counters().evictions.watermark, 1);
    assert_eq!(
        cache.peek_prefix(&ns, &toks(0, 9)),
        4,
        "A's tail went first"
    );
}

#[test]
fn retention_cap_refuses_beyond_the_budget() {
    let mut cfg = config(10, 4, EvictionPolicy::Lru);
    cfg.max_retained_fraction = 0.2; // 2 blocks
    let mut cache = KvCache::new(cfg).unwrap();
    let ns = ns(1);
    let (s, _) = start(&mut cache, &ns, &toks(0, 12), 1);
    let out = cache
        .retain_session(SessionId(1), s, Tick(9), 1, Tick(1))
        .unwrap();
    assert_eq!((out.retained_blocks, out.refused_blocks), (2, 1));
    assert_eq!(out.new_blocks, 2);
    assert_eq!(cache.counters().retention_refused_blocks, 1);
    // Re-retaining replaces the old record (no double counting) and adds nothing new.
    let out = cache
        .retain_session(SessionId(1), s, Tick(20), 1, Tick(1))
        .unwrap();
    assert_eq!((out.retained_blocks, out.new_blocks), (2, 0));
    assert_eq!(cache.usage().retained, 2);
    let info = cache.session(SessionId(1)).unwrap();
    assert_eq!((info.blocks, info.tokens, info.until), (2, 8, Tick(20)));
    cache.release_session(SessionId(1)).unwrap();
    assert_eq!(cache.usage().retained, 0);
    assert_eq!(cache.session(SessionId(1)), None);
    assert!(cache.release_session(SessionId(1)).is_err());
    cache.check_invariants().unwrap();
}

#[test]
fn a_session_turn_reports_only_the_blocks_it_newly_retains() {
    let mut cache = KvCache::new(config(10, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    let (s, _) = start(&mut cache, &ns, &toks(0, 8), 1);
    let out = cache
        .retain_session(SessionId(3), s, Tick(50), 0, Tick(1))
        .unwrap();
    assert_eq!((out.retained_blocks, out.new_blocks), (2, 2));
    cache.free(s, Tick(1)).unwrap();
    // The next turn extends the first by one block: only that block is new.
    let (s, cached) = start(&mut cache, &ns, &toks(0, 13), 2);
    assert_eq!(cached, 8);
    let out = cache
        .retain_session(SessionId(3), s, Tick(60), 0, Tick(2))
        .unwrap();
    assert_eq!((out.retained_blocks, out.new_blocks), (3, 1));
    cache.free(s, Tick(2)).unwrap();
    // Another session over the same blocks newly retains all of them for itself.
    let (s, _) = start(&mut cache, &ns, &toks(0, 8), 3);
    let out = cache
        .retain_session(SessionId(4), s, Tick(60), 0, Tick(3))
        .unwrap();
    assert_eq!((out.retained_blocks, out.new_blocks), (2, 2));
    cache.free(s, Tick(3)).unwrap();
    assert_eq!(cache.usage().retained, 3);
    assert_eq!(cache.expire(Tick(60)), 2);
    assert_eq!(cache.session(SessionId(3)), None);
    cache.check_invariants().unwrap();
}

#[test]
fn fragmentation_counts_unused_slots_of_held_blocks() {
    let mut cache = KvCache::new(config(8, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    let (s, _) = start(&mut cache, &ns, &toks(0, 5), 1); // 2 blocks, 3 unused slots
    let f = cache.fragmentation();
    assert_eq!((f.allocated_slots, f.unused_slots), (8, 3));
    assert!((f.ratio() - 0.375).abs() < 1e-12);
    cache.free(s, Tick(2)).unwrap();
    assert_eq!(cache.fragmentation().ratio(), 0.0);
}

#[test]
fn events_carry_keys_and_parent_keys() {
    let mut cfg = CacheConfig::new(2);
    cfg.block_size = 4;
    cfg.record_events = true;
    let mut cache = KvCache::new(cfg).unwrap();
    let ns = ns(1);
    call(&mut cache, &ns, &toks(0, 8), 1);
    let ev = cache.drain_events();
    let (k0, k1) = (
        cache.block_key(cache::BlockId(0)).unwrap(),
        cache.block_key(cache::BlockId(1)).unwrap(),
    );
    assert!(
        matches!(ev[0], CacheEvent::BlockStored { key, parent: None, depth: 0, .. } if key == k0)
    );
    assert!(
        matches!(ev[1], CacheEvent::BlockStored { key, parent: Some(p), depth: 1, .. } if key == k1 && p == k0)
    );
    call(&mut cache, &ns, &toks(50, 4), 2);
    let ev = cache.drain_events();
    assert!(
        matches!(ev[0], CacheEvent::BlockEvicted { key, cause: EvictionCause::Capacity, .. } if key == k1)
    );
    assert!(cache.drain_events().is_empty());
}

#[test]
fn unknown_handles_are_errors_not_panics() {
    let mut cache = KvCache::new(config(2, 4, EvictionPolicy::Lru)).unwrap();
    let bogus = cache::SeqId(42);
    assert!(cache.free(bogus, Tick(1)).is_err());
    assert!(cache.append_tokens(bogus, &[1], Tick(1)).is_err());
    assert!(cache.fork(bogus, Tick(1)).is_err());
    assert!(cache.unpin(cache::PinId(3)).is_err());
    assert!(cache
        .retain_session(SessionId(1), bogus, Tick(2), 0, Tick(1))
        .is_err());
    assert!(KvCache::new(CacheConfig::new(0)).is_err());
    let mut bad = CacheConfig::new(4);
    bad.policy = EvictionPolicy::SegmentedLru {
        protected_fraction: 1.5,
    };
    assert!(KvCache::new(bad).is_err());
}

#[test]
fn a_released_match_is_not_counted_as_a_lookup() {
    let mut cache = KvCache::new(config(8, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    call(&mut cache, &ns, &toks(0, 9), 1);
    let before = *cache.counters();
    let tenant_before = cache.tenant_counters(ns.tenant());
    // A request retried while it waits for blocks: looked up and given back, several times.
    for t in 2..5 {
        let m = cache.lookup(&ns, &toks(0, 9), Tick(t));
        assert_eq!(m.num_cached_tokens(), 8);
        cache.release_match(m, Tick(t)).unwrap();
    }
    assert_eq!(*cache.counters(), before);
    assert_eq!(cache.tenant_counters(ns.tenant()), tenant_before);
    // Admitted: counted once.
    let m = cache.lookup(&ns, &toks(0, 9), Tick(6));
    let s = cache.create_sequence(m).unwrap();
    let c = cache.counters();
    assert_eq!(c.lookups, before.lookups + 1);
    assert_eq!(c.lookup_hit_tokens, before.lookup_hit_tokens + 8);
    assert_eq!(c.lookup_miss_tokens, before.lookup_miss_tokens + 1);
    cache.free(s, Tick(7)).unwrap();
    cache.check_invariants().unwrap();
}

#[test]
fn a_session_remembers_the_keys_of_its_evicted_blocks_until_it_retains_again() {
    let mut cache = KvCache::new(config(4, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    let (s, _) = start(&mut cache, &ns, &toks(0, 12), 1);
    cache
        .retain_session(SessionId(5), s, Tick(1000), 0, Tick(1))
        .unwrap();
    cache.free(s, Tick(1)).unwrap();
    assert!(cache.session_evicted(SessionId(5)).is_empty());
    // Another prompt needs 3 of the 4 blocks: the retained chain loses its tail first.
    let (s, _) = start(&mut cache, &ns, &toks(100, 12), 2);
    let evicted = cache.session_evicted(SessionId(5)).to_vec();
    assert_eq!(evicted.len(), 2);
    assert_eq!(cache.session(SessionId(5)).unwrap().blocks, 1);
    let chain = cache::key::chain_keys(&ns, &toks(0, 12), 4, 3);
    assert_eq!(evicted[0], (ns, chain[2]), "the tail goes first");
    assert_eq!(evicted[1], (ns, chain[1]));
    assert!(!cache.is_cached(&chain[1]) && cache.is_cached(&chain[0]));
    cache.free(s, Tick(2)).unwrap();
    // Computed again (unretained): cached, still listed until the session retains again.
    let (s, _) = start(&mut cache, &ns, &toks(0, 12), 3);
    assert!(cache.is_cached(&chain[2]));
    assert_eq!(cache.session_evicted(SessionId(5)).len(), 2);
    cache
        .retain_session(SessionId(5), s, Tick(1000), 0, Tick(3))
        .unwrap();
    assert!(cache.session_evicted(SessionId(5)).is_empty());
    assert_eq!(cache.session(SessionId(5)).unwrap().blocks, 3);
    cache.free(s, Tick(3)).unwrap();
    // A flush is not an eviction under pressure: nothing to report in a tier.
    cache.flush_all();
    assert!(
        cache.session(SessionId(5)).is_none() || cache.session_evicted(SessionId(5)).is_empty()
    );
    cache.check_invariants().unwrap();
}
