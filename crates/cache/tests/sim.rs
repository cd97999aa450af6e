//! The simulator: exact figures on hand-made traces, tenant isolation, errors, determinism.

use cache::sim::{generate, simulate, SimConfig, SimError, TraceCall, TraceKind, TraceParams};
use cache::EvictionPolicy;

fn call(tenant: &str, tokens: Vec<u32>) -> TraceCall {
    TraceCall {
        t: 0.0,
        session: "s".into(),
        tenant: tenant.into(),
        tokens,
    }
}

fn sim(calls: &[TraceCall], capacity_blocks: u32, policy: EvictionPolicy) -> cache::sim::SimReport {
    simulate(
        calls,
        SimConfig {
            block_size: 16,
            capacity_blocks,
            policy,
        },
    )
    .unwrap()
}

#[test]
fn agent_loop_reuses_whole_blocks_of_the_previous_call() {
    let first: Vec<u32> = (0..100).collect();
    let mut second = first.clone();
    second.extend(1000..1050);
    let calls = vec![
        call("a", first.clone()),
        call("a", second),
        call("a", first),
    ];
    let r = sim(&calls, 64, EvictionPolicy::Lru);
    // Call 2 hits the 6 full blocks of call 1 (96 tokens); call 3 (100 tokens) hits 96 again.
    assert_eq!(
        (r.calls, r.prompt_tokens, r.hit_tokens, r.evictions),
        (3, 350, 192, 0)
    );
    assert!((r.hit_rate - 192.0 / 350.0).abs() < 1e-12);
}

#[test]
fn fully_cached_prompt_still_computes_one_token() {
    let p: Vec<u32> = (0..64).collect();
    let r = sim(
        &[call("a", p.clone()), call("a", p)],
        64,
        EvictionPolicy::Lru,
    );
    assert_eq!(
        r.hit_tokens, 48,
        "4 full blocks, but the last one is recomputed"
    );
}

#[test]
fn tenants_never_share() {
    let p: Vec<u32> = (0..64).collect();
    let r = sim(
        &[call("a", p.clone()), call("b", p.clone())],
        64,
        EvictionPolicy::Lru,
    );
    assert_eq!(r.hit_tokens, 0);
    let r = sim(
        &[call("a", p.clone()), call("a", p)],
        64,
        EvictionPolicy::Lru,
    );
    assert_eq!(r.hit_tokens, 48, "positive control");
}

#[test]
fn small_capacity_evicts_and_prompt_larger_than_pool_is_an_error() {
    let a: Vec<u32> = (0..64).collect();
    let b: Vec<u32> = (100..164).collect();
    let r = sim(
        &[call("a", a.clone()), call("a", b), call("a", a.clone())],
        4,
        EvictionPolicy::Lru,
    );
    assert_eq!((r.hit_tokens, r.evictions), (0, 8));
    let err = simulate(
        &[call("a", (0..100).collect())],
        SimConfig {
            block_size: 16,
            capacity_blocks: 4,
            policy: EvictionPolicy::Lru,
        },
    )
    .unwrap_err();
    assert!(matches!(err, SimError::Call { call: 0, .. }));
}

#[test]
fn generated_traces_hit_more_with_more_capacity() {
    for kind in [TraceKind::React, TraceKind::Webshop, TraceKind::Swarm] {
        let trace = generate(TraceParams {
            kind,
            agents: 6,
            tasks: 2,
            seed: 11,
        });
        let small_blocks = if kind == TraceKind::Swarm { 256 } else { 2048 };
        let small = sim(&trace, small_blocks, EvictionPolicy::Lru);
        let large = sim(&trace, 65_536, EvictionPolicy::Lru);
        assert_eq!(large.evictions, 0, "{kind:?}");
        assert!(
            large.hit_rate > small.hit_rate,
            "{kind:?}: {small:?} vs {large:?}"
        );
        assert!(
            large.hit_rate > 0.5,
            "{kind:?}: agent traces are mostly shared prefixes"
        );
        assert_eq!(
            sim(&trace, small_blocks, EvictionPolicy::Lru),
            small,
            "deterministic"
        );
    }
}
