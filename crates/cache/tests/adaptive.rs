//! Adaptive segmented LRU through the public API: a scripted run with the exact protected capacity
//! after every step (ghost-protected hits grow it, ghost-probation hits shrink it and demote down
//! to it), flushes clearing ghosts per tenant, and config errors. Block size 2, 32 blocks; an item
//! `x` is the 3-token prompt `[x, x, 0]`: one full block (published) and a partial one (freed).

mod common;

use cache::{CacheConfig, ConfigError, EvictionPolicy, KvCache};
use common::*;

fn adaptive_cache() -> KvCache {
    let policy = EvictionPolicy::AdaptiveSegmentedLru {
        initial_protected_fraction: 0.25, // 8 blocks
        min_protected_fraction: 0.0625,   // 2
        max_protected_fraction: 0.5,      // 16
    };
    KvCache::new(config(32, 2, policy)).unwrap()
}

fn item(x: u32) -> Vec<u32> {
    vec![x, x, 0]
}

/// (capacity, ghost lens, ghost probation hits, ghost protected hits, up, down, demotions)
fn state(cache: &KvCache) -> (u32, (usize, usize), [u64; 5]) {
    let c = cache.counters();
    assert_eq!(
        c.slru_protected_capacity_blocks,
        u64::from(cache.protected_capacity())
    );
    (
        cache.protected_capacity(),
        cache.ghost_lens().unwrap(),
        [
            c.slru_ghost_probation_hits,
            c.slru_ghost_protected_hits,
            c.slru_adaptations_up,
            c.slru_adaptations_down,
            c.slru_demotions,
        ],
    )
}

#[test]
fn scripted_ghost_hits_move_the_protected_capacity() {
    let mut cache = adaptive_cache();
    let ns = ns(0);
    let mut tick = 0;
    let mut run = |cache: &mut KvCache, x: u32| {
        tick += 1;
        call(cache, &ns, &item(x), tick).0
    };
    // f0..f8 twice each: promoted on the second call; f8's promotion overflows the capacity of 8
    // and demotes the least recent protected block, f0.
    for f in 100..109 {
        assert_eq!(run(&mut cache, f), 0);
        assert_eq!(run(&mut cache, f), 2);
    }
    assert_eq!(state(&cache), (8, (0, 0), [0, 0, 0, 0, 1]));
    // 30 one-off items o0..o29: 9 + 30 blocks do not fit in 32 (one more is the partial block).
    // Probation goes first, least recent first: the demoted f0 (protected ghost), then o0, o1, …
    for o in 0..30 {
        run(&mut cache, o);
    }
    assert_eq!(cache.counters().evictions.capacity, 8);
    // Evicted: f0 (demoted, hit twice: protected ghost), then o0..o6 (probation ghost).
    assert_eq!(state(&cache), (8, (7, 1), [0, 0, 0, 0, 1]));

    // From here every missing item evicts one block (one block is free: the partial one).
    // f0 again: a protected-ghost hit grows the capacity by min(max(1, 7 / 1), 32 / 16) = 2. The
    // call itself evicts o7 (f0 comes back in probation, hit once).
    assert_eq!(run(&mut cache, 100), 0);
    assert_eq!(state(&cache), (10, (8, 0), [0, 1, 1, 0, 1]));
    // o0 again: a probation-ghost hit shrinks it by max(1, 0 / 8) = 1; evicts o8.
    assert_eq!(run(&mut cache, 0), 0);
    assert_eq!(state(&cache), (9, (8, 0), [1, 1, 1, 1, 1]));
    // o1: down to 8 = the protected blocks f1..f8, nothing to demote; evicts o9.
    run(&mut cache, 1);
    assert_eq!(state(&cache), (8, (8, 0), [2, 1, 1, 2, 1]));
    // o2: down to 7, so the least recent protected block f1 is demoted; the call then evicts it
    // (least recent in probation) into the protected ghost.
    run(&mut cache, 2);
    assert_eq!(state(&cache), (7, (7, 1), [3, 1, 1, 3, 2]));
    // f1: protected-ghost hit, step min(7 / 1, 2) = 2; evicts o10.
    assert_eq!(run(&mut cache, 101), 0);
    assert_eq!(state(&cache), (9, (8, 0), [3, 2, 2, 3, 2]));
    // Still-cached items hit as usual: f2 is protected, o29 in probation.
    assert_eq!(run(&mut cache, 102), 2);
    assert_eq!(run(&mut cache, 29), 2);
    cache.check_invariants().unwrap();
}

#[test]
fn capacity_is_clamped_to_its_bounds() {
    let mut cache = adaptive_cache();
    let ns = ns(0);
    // 40 one-off items: evicted ones pile up in the probation ghost.
    for o in 0..40 {
        call(&mut cache, &ns, &item(o), u64::from(o) + 1);
    }
    let evicted = cache.counters().evictions.capacity;
    assert_eq!(cache.ghost_lens(), Some((evicted as usize, 0)));
    // Every evicted item comes back: each is a probation-ghost hit, down by 1 until the minimum 2.
    for o in 0..evicted as u32 {
        call(&mut cache, &ns, &item(o), 100 + u64::from(o));
        assert!(cache.protected_capacity() >= 2);
    }
    assert_eq!(cache.protected_capacity(), 2);
    let c = cache.counters();
    assert_eq!(c.slru_adaptations_down, 6, "8 -> 2");
    assert!(
        c.slru_ghost_probation_hits > 6,
        "hits at the minimum adapt nothing"
    );
}

#[test]
fn flushes_drop_ghosts_of_the_flushed_tenant_only() {
    let mut cache = adaptive_cache();
    let (a, b) = (ns(1), ns(2));
    for o in 0..20 {
        call(&mut cache, &a, &item(o), u64::from(o) + 1);
        call(&mut cache, &b, &item(o), u64::from(o) + 1);
    }
    let (probation, protected) = cache.ghost_lens().unwrap();
    assert_eq!(protected, 0);
    assert_eq!(probation as u64, cache.counters().evictions.capacity);
    assert!(probation >= 8);
    cache.flush_tenant(a.tenant());
    cache.check_invariants().unwrap();
    let (left, _) = cache.ghost_lens().unwrap();
    assert!(left > 0 && left < probation, "{left} of {probation}");
    // b's evicted items still adapt; a's no longer do (its keys were dropped with the flush).
    let before = *cache.counters();
    call(&mut cache, &a, &item(0), 100);
    assert_eq!(
        cache.counters().slru_ghost_probation_hits,
        before.slru_ghost_probation_hits
    );
    call(&mut cache, &b, &item(0), 101);
    assert_eq!(
        cache.counters().slru_ghost_probation_hits,
        before.slru_ghost_probation_hits + 1
    );
    cache.flush_all();
    assert_eq!(cache.ghost_lens(), Some((0, 0)));
    cache.check_invariants().unwrap();
}

#[test]
fn other_policies_keep_no_ghosts_and_report_their_capacity() {
    let lru = KvCache::new(config(32, 2, EvictionPolicy::Lru)).unwrap();
    assert_eq!((lru.protected_capacity(), lru.ghost_lens()), (0, None));
    let slru = KvCache::new(config(
        32,
        2,
        EvictionPolicy::SegmentedLru {
            protected_fraction: 0.5,
        },
    ))
    .unwrap();
    assert_eq!((slru.protected_capacity(), slru.ghost_lens()), (16, None));
    assert_eq!(slru.counters().slru_protected_capacity_blocks, 16);
}

#[test]
fn bad_bounds_are_config_errors() {
    let mut c = CacheConfig::new(32);
    c.policy = EvictionPolicy::AdaptiveSegmentedLru {
        initial_protected_fraction: 0.9,
        min_protected_fraction: 0.1,
        max_protected_fraction: 0.5,
    };
    assert_eq!(
        KvCache::new(c).unwrap_err(),
        ConfigError::ProtectedBoundsOrder {
            min: 0.1,
            initial: 0.9,
            max: 0.5
        }
    );
}
