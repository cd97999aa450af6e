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
            session_retention: None,
            inferred: None,
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
            session_retention: None,
            inferred: None,
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

/// Session-aware retention: a session's context survives another session's traffic during its
/// tool pause (exact figures on a hand-made trace), expires after its TTL, and is released after
/// the session's last call.
#[test]
fn session_retention_keeps_a_paused_sessions_context_until_its_ttl() {
    let at = |t: f64, session: &str, tokens: Vec<u32>| TraceCall {
        t,
        session: session.into(),
        tenant: "a".into(),
        tokens,
    };
    let a: Vec<u32> = (0..64).collect(); // 4 blocks
    let mut a2 = a.clone();
    a2.extend(500..516);
    let flood = |base: u32, len: u32| (base..base + len).collect::<Vec<u32>>();
    // A 9-block pool: session b's prompts (4 and 5 blocks) during a's pause evict a under LRU.
    let trace = |pause: f64| {
        vec![
            at(0.0, "a", a.clone()),
            at(pause - 1.0, "b", flood(1000, 64)),
            at(pause - 0.5, "b", flood(2000, 80)),
            at(pause, "a", a2.clone()),
        ]
    };
    let run = |calls: &[TraceCall], ttl_s: Option<f64>| {
        simulate(
            calls,
            SimConfig {
                block_size: 16,
                capacity_blocks: 9,
                policy: EvictionPolicy::Lru,
                session_retention: ttl_s.map(|ttl_s| cache::sim::SessionRetention {
                    ttl_s,
                    max_retained_fraction: 0.5,
                }),
                inferred: None,
            },
        )
        .unwrap()
        .hit_tokens
    };
    assert_eq!(run(&trace(5.0), None), 0, "LRU: b's traffic evicted a");
    assert_eq!(
        run(&trace(5.0), Some(10.0)),
        64,
        "retained through the pause"
    );
    assert_eq!(run(&trace(20.0), Some(10.0)), 0, "the TTL ran out first");
}

/// Without pressure the session-aware policy changes nothing; under pressure it does not lose
/// to LRU on a generated ReAct trace (seeded).
#[test]
fn session_retention_costs_nothing_without_pressure_and_helps_under_it() {
    let trace = generate(TraceParams {
        kind: TraceKind::React,
        agents: 8,
        tasks: 2,
        seed: 3,
    });
    let run = |capacity_blocks, retention| {
        simulate(
            &trace,
            SimConfig {
                block_size: 16,
                capacity_blocks,
                policy: EvictionPolicy::Lru,
                session_retention: retention,
                inferred: None,
            },
        )
        .unwrap()
        .hit_rate
    };
    let session = Some(cache::sim::SessionRetention {
        ttl_s: 30.0,
        max_retained_fraction: 0.9,
    });
    let big = 1_000_000;
    assert_eq!(run(big, None), run(big, session));
    let tight = 2_000;
    assert!(
        run(tight, session) > run(tight, None),
        "{} vs {}",
        run(tight, session),
        run(tight, None)
    );
}
