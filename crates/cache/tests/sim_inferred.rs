//! The simulator without session names: inferred-conversation retention on hand-made and
//! generated traces, the offline optimum against every online policy, Mooncake's format, and
//! the retainer making room for named sessions.

use cache::key::{chain_keys, Namespace};
use cache::sim::{
    generate, label_conversations, mooncake_calls, optimum, simulate, InferredRetention,
    MooncakeRequest, SessionRetention, SimConfig, TraceCall, TraceKind, TraceParams,
};
use cache::{
    CacheConfig, EvictionPolicy, FinishedRequest, InferredConfig, InferredRetainer, KvCache,
    SessionId, TenantId, Tick, TurnKind,
};

fn config(capacity_blocks: u32, policy: EvictionPolicy, inferred: bool) -> SimConfig {
    SimConfig {
        block_size: 16,
        capacity_blocks,
        policy,
        session_retention: None,
        inferred: inferred.then(|| InferredRetention {
            max_retained_fraction: 0.5,
            ..InferredRetention::default()
        }),
    }
}

fn unnamed(mut calls: Vec<TraceCall>) -> Vec<TraceCall> {
    for c in &mut calls {
        c.session.clear();
    }
    calls
}

/// The hand-made pause of `sim.rs`, with no session named: the inferred conversation keeps a's
/// context through b's traffic, as a named session would.
#[test]
fn an_inferred_conversation_survives_another_ones_traffic() {
    let at = |t: f64, tokens: Vec<u32>| TraceCall {
        t,
        session: String::new(),
        tenant: "a".into(),
        tokens,
    };
    let a: Vec<u32> = (0..64).collect();
    let mut a2 = a.clone();
    a2.extend(500..516);
    let calls = vec![
        at(0.0, a),
        at(4.0, (1000..1064).collect()),
        at(4.5, (2000..2080).collect()),
        at(5.0, a2),
    ];
    let lru = simulate(&calls, config(9, EvictionPolicy::Lru, false)).unwrap();
    let inferred = simulate(&calls, config(9, EvictionPolicy::Lru, true)).unwrap();
    assert_eq!(lru.hit_tokens, 0);
    // a's first call's 3 readable blocks (the 4th is its last: a lookup leaves a token).
    assert_eq!(inferred.hit_tokens, 64);
    assert_eq!(inferred.inferred_continuations, 1);
}

#[test]
fn the_optimum_bounds_every_policy_and_the_unbounded_pool_bounds_it() {
    for (kind, seed) in [
        (TraceKind::React, 1),
        (TraceKind::Webshop, 2),
        (TraceKind::Swarm, 3),
    ] {
        let calls = unnamed(generate(TraceParams {
            kind,
            agents: 8,
            tasks: 2,
            seed,
        }));
        for capacity in [2500, 5000] {
            let best = optimum(&calls, 16, capacity);
            assert!(best.hit_rate <= best.unbounded_hit_rate + 1e-12);
            for policy in [
                EvictionPolicy::Lru,
                EvictionPolicy::Lfu,
                EvictionPolicy::ADAPTIVE_SEGMENTED_LRU,
            ] {
                for inferred in [false, true] {
                    let r = simulate(&calls, config(capacity, policy, inferred)).unwrap();
                    assert!(
                        r.hit_tokens <= best.hit_tokens,
                        "{kind:?} {capacity} {policy:?} {inferred}: {} > optimum {}",
                        r.hit_tokens,
                        best.hit_tokens
                    );
                }
            }
            // With room for everything, LRU is the optimum and the optimum is the ceiling.
            let all = simulate(&calls, config(1_000_000, EvictionPolicy::Lru, false)).unwrap();
            let unbounded = optimum(&calls, 16, 1_000_000);
            assert_eq!(all.hit_tokens, unbounded.hit_tokens);
            assert!((unbounded.hit_rate - unbounded.unbounded_hit_rate).abs() < 1e-12);
        }
    }
}

/// Belady on a cyclic pattern LRU cannot serve: A B C A B C ... with room for two of three.
#[test]
fn the_optimum_keeps_what_is_used_soonest() {
    let block = |id: u32| -> Vec<u32> { (0..17).map(|t| id * 100 + t).collect() };
    let calls: Vec<TraceCall> = (0..9)
        .map(|i| TraceCall {
            t: i as f64,
            session: String::new(),
            tenant: "a".into(),
            tokens: block(i % 3),
        })
        .collect();
    let lru = simulate(&calls, config(2, EvictionPolicy::Lru, false)).unwrap();
    assert_eq!(lru.hit_tokens, 0, "LRU always evicts the next one needed");
    // Belady: calls 4..9 hit on every call whose block it kept (the farthest is evicted):
    // hits at calls 3, 4, 6, 7 (one miss per cycle after the first) = 4 blocks of 16 tokens.
    assert_eq!(optimum(&calls, 16, 2).hit_tokens, 4 * 16);
}

#[test]
fn mooncake_lines_replay_as_one_token_per_block() {
    let text = include_str!("data/mooncake_conversation_head400.jsonl");
    let requests: Vec<MooncakeRequest> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(requests.len(), 400);
    let calls = mooncake_calls(&requests).unwrap();
    assert_eq!(calls[0].tokens.len(), requests[0].hash_ids.len());
    assert_eq!(calls[399].t, requests[399].timestamp as f64 / 1000.0);
    let sim = |capacity, inferred| {
        let mut c = config(capacity, EvictionPolicy::Lru, inferred);
        c.block_size = 1;
        simulate(&calls, c).unwrap()
    };
    let small = optimum(&calls, 1, 300);
    let lru = sim(300, false);
    let inferred = sim(300, true);
    assert!(lru.hit_tokens <= small.hit_tokens && inferred.hit_tokens <= small.hit_tokens);
    assert!(
        small.hit_rate > lru.hit_rate,
        "room above LRU at a small pool"
    );
    assert!(inferred.inferred_continuations > 10, "{inferred:?}");
    // The trace's every request shares block 0: a shared prefix, never a conversation.
    let labelled = label_conversations(&calls, 1);
    let sessions: std::collections::HashSet<&str> =
        labelled.iter().map(|c| c.session.as_str()).collect();
    assert!(sessions.len() > 200, "{} conversations", sessions.len());
    // A hash id beyond 32 bits is a clear error, not a wrap.
    let mut bad = requests[0].clone();
    bad.hash_ids.push(1 << 40);
    assert!(mooncake_calls(&[bad]).is_err());
    assert!(serde_json::from_str::<MooncakeRequest>(
        r#"{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[1],"x":1}"#
    )
    .is_err());
}

/// The oracle reference (conversations labelled over the whole trace, released at their last
/// call) replays through the named-session policy.
#[test]
fn labelled_conversations_replay_as_named_sessions() {
    let calls = unnamed(generate(TraceParams {
        kind: TraceKind::React,
        agents: 6,
        tasks: 2,
        seed: 9,
    }));
    let labelled = label_conversations(&calls, 16);
    let mut c = config(2500, EvictionPolicy::Lru, false);
    c.session_retention = Some(SessionRetention {
        ttl_s: 60.0,
        max_retained_fraction: 0.9,
    });
    let r = simulate(&labelled, c).unwrap();
    assert!(r.hit_tokens <= optimum(&labelled, 16, 2500).hit_tokens);
    assert!(r.hit_rate > 0.0);
}

/// Named sessions take precedence: the retainer releases inferred conversations, oldest first,
/// when an explicit retention needs the cap's room.
#[test]
fn inferred_retention_makes_room_for_named_sessions() {
    let mut cfg = CacheConfig::new(40);
    cfg.block_size = 4;
    cfg.max_retained_fraction = 0.25; // 10 blocks
    let mut cache = KvCache::new(cfg).unwrap();
    let ns = Namespace::for_tenant(TenantId(0)).key();
    let mut retainer = InferredRetainer::new(InferredConfig::default());
    for (i, base) in [0u32, 1000, 2000].into_iter().enumerate() {
        let tokens: Vec<u32> = (base..base + 16).collect();
        let m = cache.lookup(&ns, &tokens, Tick(i as u64));
        let seq = cache.create_sequence(m).unwrap();
        cache.append_tokens(seq, &tokens, Tick(i as u64)).unwrap();
        cache.mark_written(seq, 16, Tick(i as u64)).unwrap();
        let chain = chain_keys(&ns, &tokens, 4, 4);
        let placed = retainer
            .on_finish(
                &mut cache,
                FinishedRequest {
                    tenant: TenantId(0),
                    chain: &chain,
                    prompt_blocks: 4,
                    first_own_block: 0,
                    now: Tick(i as u64),
                },
                seq,
                0,
            )
            .unwrap();
        cache.free(seq, Tick(i as u64)).unwrap();
        // 4 + 4 fit under the cap of 10; the third gets the 2 left.
        assert_eq!(placed.retained_blocks, [4, 4, 2][i]);
        retainer.check_invariants().unwrap();
    }
    assert_eq!(cache.retention_headroom(), 0);
    assert_eq!(retainer.make_room(&mut cache, 5), 2, "the two oldest go");
    assert_eq!(cache.retention_headroom(), 8);
    assert_eq!(retainer.counters().released_for_explicit, 2);
    let tokens: Vec<u32> = (5000..5020).collect();
    let m = cache.lookup(&ns, &tokens, Tick(9));
    let seq = cache.create_sequence(m).unwrap();
    cache.append_tokens(seq, &tokens, Tick(9)).unwrap();
    cache.mark_written(seq, 20, Tick(9)).unwrap();
    let out = cache
        .retain_session(SessionId(7), seq, Tick(1000), 9, Tick(9))
        .unwrap();
    assert_eq!(out.retained_blocks, 5);
    retainer.prune(&cache);
    retainer.check_invariants().unwrap();
    cache.check_invariants().unwrap();
}

/// With `displace` on, a new turn whose return is likely takes the room of a retained
/// conversation whose learned return time has long passed; with it off (the default), the new
/// turn's blocks beyond the cap are refused.
#[test]
fn a_likely_turn_displaces_a_conversation_past_its_return_time_when_asked() {
    for displace in [false, true] {
        let mut cfg = CacheConfig::new(40);
        cfg.block_size = 4;
        cfg.max_retained_fraction = 0.25; // 10 blocks
        let mut cache = KvCache::new(cfg).unwrap();
        let ns = Namespace::for_tenant(TenantId(0)).key();
        let mut retainer = InferredRetainer::new(InferredConfig {
            displace,
            ..InferredConfig::default()
        });
        let mut finish = |cache: &mut KvCache, tokens: Vec<u32>, now: u64| {
            let m = cache.lookup(&ns, &tokens, Tick(now));
            let first_own_block = m.num_cached_tokens() / 4;
            let seq = cache.create_sequence(m).unwrap();
            cache.append_tokens(seq, &tokens, Tick(now)).unwrap();
            cache.mark_written(seq, tokens.len(), Tick(now)).unwrap();
            let blocks = tokens.len() / 4;
            let chain = chain_keys(&ns, &tokens, 4, blocks);
            let placed = retainer
                .on_finish(
                    cache,
                    FinishedRequest {
                        tenant: TenantId(0),
                        chain: &chain,
                        prompt_blocks: blocks,
                        first_own_block,
                        now: Tick(now),
                    },
                    seq,
                    0,
                )
                .unwrap();
            cache.free(seq, Tick(now)).unwrap();
            retainer.check_invariants().unwrap();
            placed
        };
        // Conversation A: two turns 1 s apart (the one gap learned), 8 blocks retained.
        finish(&mut cache, (0..16).collect(), 0);
        let a = finish(&mut cache, (0..32).collect(), 1_000);
        assert!(matches!(a.turn.kind, TurnKind::Continue { gap_ms: 1_000 }));
        assert_eq!(a.retained_blocks, 8);
        // 100 s later (A's return time long past), conversation B starts: 4 blocks, room for 2.
        let b = finish(&mut cache, (5000..5016).collect(), 100_000);
        if displace {
            assert_eq!((b.retained_blocks, b.refused_blocks), (4, 0));
            assert_eq!(cache.session(a.session), None, "A was displaced");
        } else {
            assert_eq!((b.retained_blocks, b.refused_blocks), (2, 2));
            assert!(cache.session(a.session).is_some());
        }
        cache.check_invariants().unwrap();
    }
}

/// A live replay's prompts: one block of ids per hash id, equal ids equal blocks, the last block
/// cut in proportion to the partial 512-token block.
#[test]
fn mooncake_prompts_share_blocks_exactly_where_hash_ids_are_equal() {
    let req = |ids: Vec<u64>, input_length| MooncakeRequest {
        timestamp: 0,
        input_length,
        output_length: 1,
        hash_ids: ids,
    };
    let a = cache::sim::mooncake_prompt(&req(vec![0, 1, 2], 2 * 512 + 256), 16);
    let b = cache::sim::mooncake_prompt(&req(vec![0, 1, 7, 8], 3 * 512 + 512), 16);
    assert_eq!(a.len(), 16 + 16 + 8, "half of the last block");
    assert_eq!(b.len(), 64, "a full last block");
    assert_eq!(a[..32], b[..32], "shared hash ids, shared tokens");
    assert_ne!(a[32..40], b[32..40]);
    assert!(a.iter().all(|t| (1000..40000).contains(t)));
    let tiny = cache::sim::mooncake_prompt(&req(vec![5], 1), 16);
    assert_eq!(tiny.len(), 1, "at least one token");
}

/// The server's default (reuse-aware LRU, inferred conversations, the duel) on generated agent
/// traces at a pool of about an eighth of the working set: better than LRU where conversations
/// come back (ReAct), and where both options always on lose to LRU (a swarm, whose reuse is
/// across agents), the duel turns them off and stays within half a point of it.
#[test]
fn the_duel_keeps_the_default_at_or_above_lru() {
    let run = |kind, capacity, policy, duel: bool, inferred: bool| {
        let calls = unnamed(generate(TraceParams {
            kind,
            agents: 16,
            tasks: 4,
            seed: 5,
        }));
        let mut c = config(capacity, policy, false);
        c.inferred = inferred.then(|| InferredRetention {
            duel: duel.then(cache::DuelConfig::default),
            ..InferredRetention::default()
        });
        simulate(&calls, c).unwrap().hit_rate
    };
    let reuse = EvictionPolicy::REUSE_AWARE_LRU;
    let lru = run(TraceKind::React, 4786, EvictionPolicy::Lru, false, false);
    let default = run(TraceKind::React, 4786, reuse, true, true);
    assert!(default > lru + 0.01, "react: {default} vs LRU {lru}");
    let lru = run(TraceKind::Swarm, 1970, EvictionPolicy::Lru, false, false);
    let default = run(TraceKind::Swarm, 1970, reuse, true, true);
    let always = run(TraceKind::Swarm, 1970, reuse, false, true);
    assert!(
        always < lru - 0.01,
        "swarm, both always on: {always} vs LRU {lru}"
    );
    assert!(
        default > lru - 0.005,
        "swarm, the duel: {default} vs LRU {lru}"
    );
}
