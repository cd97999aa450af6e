//! Golden eviction orders: scripted steps, exact block ids, one script per policy. Block size 4,
//! 8 blocks. Free blocks are handed out b0, b1, … and a returned block is handed out next.

mod common;

use cache::{EvictionPolicy, KvCache, SessionId, Tick};
use common::*;

/// A = 8 tokens (2 blocks) called three times, B = 8 tokens, then C = 20 tokens (5 blocks) needs
/// one eviction.
fn script(cache: &mut KvCache) -> Vec<cache::BlockId> {
    let ns = ns(1);
    let a = toks(100, 8);
    let mut a_plus = a.clone();
    a_plus.push(7);
    assert_eq!(call(cache, &ns, &a, 1), (0, ids(&[0, 1])));
    // Lookup leaves one token to compute: 9 tokens match both blocks; the partial block b2 is freed.
    assert_eq!(call(cache, &ns, &a_plus, 2), (8, ids(&[0, 1, 2])));
    assert_eq!(call(cache, &ns, &a_plus, 3), (8, ids(&[0, 1, 2])));
    assert_eq!(call(cache, &ns, &toks(200, 8), 4), (0, ids(&[2, 3])));
    let (_, c_table) = call(cache, &ns, &toks(300, 20), 5);
    c_table
}

#[test]
fn lru_golden_order() {
    let mut cache = KvCache::new(config(8, 4, EvictionPolicy::Lru)).unwrap();
    let ns1 = ns(1);
    // Before C: candidates are the chain tails b1 (A, used at 3) and b3 (B, used at 4).
    // C takes the free b4..b7 and evicts b1 (least recent); b0 becomes A's tail.
    assert_eq!(script(&mut cache), ids(&[4, 5, 6, 7, 1]));
    assert_eq!(cache.eviction_order(), ids(&[0, 3, 1]));
    assert_eq!(cache.counters().evictions.capacity, 1);
    assert_eq!(
        cache.peek_prefix(&ns1, &toks(100, 9)),
        4,
        "A lost its tail, kept its head"
    );
}

#[test]
fn lfu_golden_order() {
    let mut cache = KvCache::new(config(8, 4, EvictionPolicy::Lfu)).unwrap();
    // A's blocks have 3 hits, B's one: C evicts B's tail b3 although A is older.
    assert_eq!(script(&mut cache), ids(&[4, 5, 6, 7, 3]));
    // Candidates: b2 (1 hit, used 4), b3 (C's tail, 1 hit, used 5), b1 (3 hits).
    assert_eq!(cache.eviction_order(), ids(&[2, 3, 1]));
}

#[test]
fn slru_golden_order_with_promotion_and_demotion() {
    let policy = EvictionPolicy::SegmentedLru {
        protected_fraction: 0.25, // 2 of 8 blocks
    };
    let mut cache = KvCache::new(config(8, 4, policy)).unwrap();
    // A's blocks are promoted on their second hit (call 2); C evicts from probation: B's tail b3.
    assert_eq!(script(&mut cache), ids(&[4, 5, 6, 7, 3]));
    assert_eq!(cache.counters().slru_promotions, 2);
    assert_eq!(cache.counters().slru_demotions, 0);
    // Probation first (b2 used 4, then C's tail b3 used 5), protected b1 last.
    assert_eq!(cache.eviction_order(), ids(&[2, 3, 1]));

    // B again (9 tokens): b2's second hit promotes it, overflowing the protected segment; the
    // least recent protected block, A's deeper b1 (tie on last use with b0), is demoted.
    let ns = ns(1);
    let mut b_plus = toks(200, 8);
    b_plus.push(9);
    let (cached, table) = call(&mut cache, &ns, &b_plus, 6);
    assert_eq!(cached, 4, "B's second block was evicted by C");
    assert_eq!(cache.counters().slru_demotions, 1);
    // Two blocks needed, none free: evict probation b1 (used 3), then C's tail b3 (used 5).
    assert_eq!(table, ids(&[2, 1, 3]));
    // Probation: C's new tail b7 (used 5), B's b1 (used 6); protected: b0. b2 has a child.
    assert_eq!(cache.eviction_order(), ids(&[7, 1, 0]));
}

#[test]
fn chain_tail_goes_before_parent_even_when_parent_is_older() {
    // A 3-block chain used at 1 and a single block used at 2: only chain tails are candidates, so
    // the chain goes b2, then b1 (now its tail), before anything reaches its head b0.
    let mut cache = KvCache::new(config(4, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    call(&mut cache, &ns, &toks(0, 12), 1); // b0 b1 b2
    call(&mut cache, &ns, &toks(50, 4), 2); // b3
    assert_eq!(cache.eviction_order(), ids(&[2, 3]));
    let s = cache.create_empty_sequence(&ns);
    assert_eq!(
        cache.append_tokens(s, &toks(90, 8), Tick(3)).unwrap(),
        ids(&[2, 1])
    );
    assert_eq!(cache.eviction_order(), ids(&[0, 3]));
    cache.check_invariants().unwrap();
}

#[test]
fn retained_session_is_passed_over_until_it_expires() {
    let mut cache = KvCache::new(config(6, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    let (a, _) = start(&mut cache, &ns, &toks(0, 8), 1); // b0 b1
    let out = cache
        .retain_session(SessionId(7), a, Tick(100), 5, Tick(1))
        .unwrap();
    assert_eq!((out.retained_blocks, out.refused_blocks), (2, 0));
    cache.free(a, Tick(1)).unwrap();
    call(&mut cache, &ns, &toks(50, 8), 2); // b2 b3, more recent but not retained
    assert_eq!(cache.eviction_order(), ids(&[3, 1]));
    assert_eq!(cache.usage().retained, 2);
    // Not yet expired at 99.
    assert_eq!(cache.expire(Tick(99)), 0);
    assert_eq!(cache.expire(Tick(100)), 1);
    assert_eq!(
        cache.eviction_order(),
        ids(&[1, 3]),
        "back to plain LRU order"
    );
    assert_eq!(cache.usage().retained, 0);
    cache.check_invariants().unwrap();
}

#[test]
fn among_sessions_of_one_priority_the_most_recently_paused_goes_first() {
    let mut cache = KvCache::new(config(8, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    // Session 1 paused at tick 1 (until 101), session 2 at tick 2 (until 102): same TTL.
    let (a, _) = start(&mut cache, &ns, &toks(0, 8), 1); // b0 b1
    cache
        .retain_session(SessionId(1), a, Tick(101), 0, Tick(1))
        .unwrap();
    cache.free(a, Tick(1)).unwrap();
    let (b, _) = start(&mut cache, &ns, &toks(50, 8), 2); // b2 b3
    cache
        .retain_session(SessionId(2), b, Tick(102), 0, Tick(2))
        .unwrap();
    cache.free(b, Tick(2)).unwrap();
    // Session 1 has waited longest for its tool: it is the one coming back first, so session
    // 2's tail goes first (earliest-expiry order would take session 1's).
    assert_eq!(cache.eviction_order(), ids(&[3, 1]));
    // A higher priority still wins over recency.
    let (b, _) = start(&mut cache, &ns, &toks(50, 8), 3);
    cache
        .retain_session(SessionId(2), b, Tick(103), 1, Tick(3))
        .unwrap();
    cache.free(b, Tick(3)).unwrap();
    assert_eq!(cache.eviction_order(), ids(&[1, 3]));
    cache.check_invariants().unwrap();
}

#[test]
fn pins_rank_after_sessions_and_are_evicted_only_as_a_last_resort() {
    let mut cache = KvCache::new(config(4, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    call(&mut cache, &ns, &toks(0, 4), 1); // b0: pinned template
    let pin = cache.pin_prefix(&ns, &toks(0, 4), Tick(1));
    assert_eq!((pin.num_blocks, pin.num_tokens), (1, 4));
    let (s, _) = start(&mut cache, &ns, &toks(10, 4), 2); // b1: session-retained
    cache
        .retain_session(SessionId(1), s, Tick(50), 0, Tick(2))
        .unwrap();
    cache.free(s, Tick(2)).unwrap();
    call(&mut cache, &ns, &toks(20, 4), 3); // b2: plain
    assert_eq!(cache.eviction_order(), ids(&[2, 1, 0]));
    // Allocating all 4 blocks evicts everything: retention is a bias, not a lock.
    let s = cache.create_empty_sequence(&ns);
    assert_eq!(
        cache.append_tokens(s, &toks(90, 16), Tick(4)).unwrap(),
        ids(&[3, 2, 1, 0])
    );
    assert_eq!(cache.counters().evictions.retained, 2);
    assert_eq!(cache.usage().pinned, 0);
    cache.check_invariants().unwrap();
    cache.free(s, Tick(5)).unwrap();
    assert!(
        cache.unpin(pin.pin).is_ok(),
        "the pin record outlives its evicted blocks"
    );
    cache.check_invariants().unwrap();
}
