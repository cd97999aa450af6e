//! Tenants' shares of the pool. Reservations (a reserved minimum of cached blocks per tenant):
//! another tenant's flood cannot evict a tenant's reserved working set; the reservation yields
//! only when nothing else can go (running sequences need the blocks), and that is counted.
//! Retained-block caps: a tenant's sessions retain at most its cap (chain from the root).

mod common;

use cache::{ConfigError, EvictionPolicy, KvCache, SessionId, TenantId, Tick};
use common::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const POOL: u32 = 32;
const BS: u32 = 4;

fn cache_with(reserved: &[(u32, u32)]) -> KvCache {
    let mut c = config(POOL, BS, EvictionPolicy::Lru);
    for (t, r) in reserved {
        c.tenant_reserved_blocks.insert(TenantId(*t), *r);
    }
    KvCache::new(c).unwrap()
}

/// Tenant 1 caches a 33-token prompt (8 full blocks); tenant 2 floods ten pools' worth of distinct
/// prompts; then tenant 1 asks again. Returns tenant 1's cached tokens on the second call.
fn warm_prefix_after_flood(cache: &mut KvCache) -> usize {
    let prompt = toks(1, 33);
    call(cache, &ns(1), &prompt, 1);
    for i in 0..40u64 {
        call(cache, &ns(2), &toks(10_000 + i as u32 * 100, 32), 2 + i);
    }
    cache.peek_prefix(&ns(1), &prompt)
}

#[test]
fn a_flood_of_another_tenant_never_evicts_a_reserved_working_set() {
    let mut reserved = cache_with(&[(1, 8)]);
    assert_eq!(warm_prefix_after_flood(&mut reserved), 32);
    assert_eq!(reserved.counters().evictions.reserved, 0);
    assert_eq!(reserved.tenant_counters(TenantId(1)).cached_blocks, 8);
    // Positive control: without the reservation the flood evicts it.
    let mut plain = cache_with(&[]);
    assert_eq!(warm_prefix_after_flood(&mut plain), 0);
}

#[test]
fn only_the_part_above_the_reservation_is_evicted() {
    let mut cache = cache_with(&[(1, 4)]);
    // 8 blocks cached, 4 of them reserved: the flood takes the 4 deepest.
    assert_eq!(warm_prefix_after_flood(&mut cache), 16);
    assert_eq!(cache.tenant_counters(TenantId(1)).cached_blocks, 4);
    assert_eq!(cache.counters().evictions.reserved, 0);
}

#[test]
fn the_reservation_yields_when_running_sequences_need_the_blocks() {
    let mut cache = cache_with(&[(1, 16)]);
    call(&mut cache, &ns(1), &toks(1, 64), 1); // 16 blocks, all reserved
                                               // Tenant 2 runs a 28-block sequence: 16 free + 12 taken from tenant 1's reservation.
    let (seq, _) = start(&mut cache, &ns(2), &toks(5_000, 112), 2);
    assert_eq!(cache.counters().evictions.reserved, 12);
    assert_eq!(cache.tenant_counters(TenantId(1)).reserved_evictions, 12);
    assert_eq!(cache.tenant_counters(TenantId(1)).cached_blocks, 4);
    cache.free(seq, Tick(3)).unwrap();
    cache.check_invariants().unwrap();
}

#[test]
fn reservations_are_validated() {
    let mut c = config(POOL, BS, EvictionPolicy::Lru);
    c.tenant_reserved_blocks.insert(TenantId(1), 10);
    c.tenant_reserved_blocks.insert(TenantId(2), 7);
    assert!(matches!(
        KvCache::new(c.clone()),
        Err(ConfigError::ReservationsTooLarge { reserved: 17, .. })
    ));
    c.tenant_reserved_blocks.insert(TenantId(2), 6);
    c.tenant_quota_blocks.insert(TenantId(1), 8);
    assert!(matches!(
        KvCache::new(c.clone()),
        Err(ConfigError::ReservationAboveQuota { tenant: 1, .. })
    ));
    c.tenant_quota_blocks.insert(TenantId(1), 12);
    let mut cache = KvCache::new(c).unwrap();
    assert!(cache.set_tenant_reservation(TenantId(3), Some(1)).is_err());
    cache.set_tenant_reservation(TenantId(2), None).unwrap();
    cache.set_tenant_reservation(TenantId(3), Some(6)).unwrap();
}

/// Seeded random traffic of three tenants (two with reservations): every step keeps the cache's
/// invariants, and a reserved tenant's cached blocks drop below min(reservation, what it held)
/// only through counted reserved evictions.
#[test]
fn random_traffic_keeps_reservations_and_invariants() {
    for seed in 0..20u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut cache = cache_with(&[(1, 6), (2, 4)]);
        let mut live = Vec::new();
        for tick in 1..400u64 {
            let before: Vec<u32> = (1..=2)
                .map(|t| cache.tenant_counters(TenantId(t)).cached_blocks)
                .collect();
            let reserved_before = cache.counters().evictions.reserved;
            let tenant = rng.gen_range(1..=3u32);
            if rng.gen_bool(0.3) && !live.is_empty() {
                let i = rng.gen_range(0..live.len());
                let seq = live.swap_remove(i);
                cache.free(seq, Tick(tick)).unwrap();
            } else {
                // Prompts share a per-tenant root so prefixes repeat.
                let len = rng.gen_range(1..40usize);
                let base = tenant * 1_000_000 + rng.gen_range(0..4u32) * 1000;
                let prompt = toks(base, len);
                let m = cache.lookup(&ns(tenant), &prompt, Tick(tick));
                let cached = m.num_cached_tokens();
                if let Ok(seq) = cache.create_sequence(m) {
                    if cache
                        .append_tokens(seq, &prompt[cached..], Tick(tick))
                        .is_ok()
                    {
                        cache.mark_written(seq, prompt.len(), Tick(tick)).unwrap();
                    }
                    if live.len() < 3 {
                        live.push(seq);
                    } else {
                        cache.free(seq, Tick(tick)).unwrap();
                    }
                }
            }
            cache.check_invariants().unwrap();
            if cache.counters().evictions.reserved == reserved_before {
                for (i, r) in [6u32, 4].iter().enumerate() {
                    let now = cache.tenant_counters(TenantId(i as u32 + 1)).cached_blocks;
                    assert!(
                        now >= before[i].min(*r),
                        "seed {seed} tick {tick}: tenant {} fell from {} to {now} (reserved {r})",
                        i + 1,
                        before[i]
                    );
                }
            }
        }
    }
}

#[test]
fn a_tenants_sessions_retain_at_most_its_cap() {
    let mut c = config(POOL, BS, EvictionPolicy::Lru);
    c.tenant_max_retained_blocks.insert(TenantId(1), 6);
    let mut cache = KvCache::new(c).unwrap();
    let retain = |cache: &mut KvCache, tenant: u32, session: u64, base: u32, tick: u64| {
        let (seq, _) = start(cache, &ns(tenant), &toks(base, 17), tick);
        let out = cache
            .retain_session(SessionId(session), seq, Tick(1000), 0, Tick(tick))
            .unwrap();
        cache.free(seq, Tick(tick)).unwrap();
        cache.check_invariants().unwrap();
        out
    };
    // 4 full blocks each: the first session retains 4, the second only 2 (cap 6), from the root.
    let a = retain(&mut cache, 1, 1, 100, 1);
    assert_eq!((a.retained_blocks, a.refused_blocks), (4, 0));
    let b = retain(&mut cache, 1, 2, 200, 2);
    assert_eq!((b.retained_blocks, b.refused_blocks), (2, 2));
    let t1 = cache.tenant_counters(TenantId(1));
    assert_eq!((t1.retained_blocks, t1.retention_refused_blocks), (6, 2));
    // Another tenant is not limited by tenant 1's cap.
    let c = retain(&mut cache, 2, 3, 300, 3);
    assert_eq!((c.retained_blocks, c.refused_blocks), (4, 0));
    // Releasing frees room under the cap; expiry too.
    cache.release_session(SessionId(1)).unwrap();
    assert_eq!(cache.tenant_counters(TenantId(1)).retained_blocks, 2);
    let d = retain(&mut cache, 1, 4, 400, 4);
    assert_eq!((d.retained_blocks, d.refused_blocks), (4, 0));
    cache.expire(Tick(2000));
    assert_eq!(cache.tenant_counters(TenantId(1)).retained_blocks, 0);
    cache.check_invariants().unwrap();
}

/// A breakpoint retains only the first blocks of a sequence; `session_blocks` lists them.
#[test]
fn a_prefix_retention_holds_only_the_blocks_up_to_the_breakpoint() {
    let mut cache = cache_with(&[]);
    let (seq, _) = start(&mut cache, &ns(1), &toks(1, 33), 1);
    let out = cache
        .retain_session_prefix(SessionId(7), seq, 3, Tick(100), 1, Tick(1))
        .unwrap();
    assert_eq!((out.retained_blocks, out.new_blocks), (3, 3));
    let table = cache.block_table(seq).unwrap().to_vec();
    assert_eq!(cache.session_blocks(SessionId(7)), &table[..3]);
    cache.free(seq, Tick(1)).unwrap();
    // A flood of another tenant keeps the three retained blocks and takes the rest.
    for i in 0..40u32 {
        call(
            &mut cache,
            &ns(2),
            &toks(50_000 + i * 100, 33),
            2 + u64::from(i),
        );
    }
    assert_eq!(cache.peek_prefix(&ns(1), &toks(1, 33)), 12);
    assert!(cache.session_blocks(SessionId(8)).is_empty());
    cache.check_invariants().unwrap();
}
