//! Miss diagnostics (R24): where a lookup's cached prefix ended and why — the prompt diverged from
//! a cached continuation (at the exact token), the next block was evicted, or nothing was ever
//! cached there; none when the whole cacheable prompt hit.

mod common;

use cache::{EvictionPolicy, KvCache, MissReason, PrefixMiss, Tick};
use common::*;

fn miss_of(
    cache: &mut KvCache,
    ns: &cache::NamespaceKey,
    tokens: &[u32],
    t: u64,
) -> Option<PrefixMiss> {
    let m = cache.lookup(ns, tokens, Tick(t));
    let miss = m.miss();
    cache.release_match(m, Tick(t)).unwrap();
    miss
}

#[test]
fn a_cold_cache_reports_uncached_at_token_zero() {
    let mut cache = KvCache::new(config(8, 4, EvictionPolicy::Lru)).unwrap();
    let got = miss_of(&mut cache, &ns(1), &toks(0, 9), 1);
    assert_eq!(
        got,
        Some(PrefixMiss {
            at_token: 0,
            reason: MissReason::Uncached
        })
    );
}

#[test]
fn a_changed_prompt_reports_the_exact_token_where_it_diverged() {
    let mut cache = KvCache::new(config(8, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    call(&mut cache, &ns, &toks(0, 9), 1); // blocks [0..4) [4..8) cached
                                           // Same first block; second block differs from its third token on (a timestamp, say).
    let mut changed = toks(0, 9);
    changed[6] = 999;
    assert_eq!(
        miss_of(&mut cache, &ns, &changed, 2),
        Some(PrefixMiss {
            at_token: 6,
            reason: MissReason::Diverged
        })
    );
    // The whole cacheable prompt hits: nothing to explain (the last token is always computed).
    assert_eq!(miss_of(&mut cache, &ns, &toks(0, 9), 3), None);
    // A longer prompt that extends the cached one: nothing continues it yet.
    assert_eq!(
        miss_of(&mut cache, &ns, &toks(0, 13), 4),
        Some(PrefixMiss {
            at_token: 8,
            reason: MissReason::Uncached
        })
    );
    // Another tenant never sees tenant 1's blocks as siblings.
    assert_eq!(
        miss_of(&mut cache, &common::ns(2), &changed, 5),
        Some(PrefixMiss {
            at_token: 0,
            reason: MissReason::Uncached
        })
    );
    cache.check_invariants().unwrap();
}

#[test]
fn an_evicted_prefix_is_reported_as_evicted_until_flushed() {
    let mut cache = KvCache::new(config(4, 4, EvictionPolicy::Lru)).unwrap();
    let ns = ns(1);
    call(&mut cache, &ns, &toks(0, 9), 1); // 2 blocks cached
    call(&mut cache, &ns, &toks(100, 9), 2); // 2 more: the pool is full
    call(&mut cache, &ns, &toks(200, 9), 3); // evicts the first prompt's blocks
    assert_eq!(cache.peek_prefix(&ns, &toks(0, 9)), 0);
    assert_eq!(
        miss_of(&mut cache, &ns, &toks(0, 9), 4),
        Some(PrefixMiss {
            at_token: 0,
            reason: MissReason::Evicted
        }),
        "evicted beats the cached siblings at the root"
    );
    assert!(cache.num_remembered_evictions() >= 2);
    cache.check_invariants().unwrap();
    // A flush forgets the tenant's evictions (and drops its blocks): now simply uncached.
    cache.flush_tenant(ns.tenant());
    assert_eq!(cache.num_remembered_evictions(), 0);
    assert_eq!(
        miss_of(&mut cache, &ns, &toks(0, 9), 5),
        Some(PrefixMiss {
            at_token: 0,
            reason: MissReason::Uncached
        })
    );
    cache.check_invariants().unwrap();
}
