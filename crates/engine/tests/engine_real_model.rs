//! The engine on the real default model: output identical with the prefix cache on or off, alone
//! or batched, chunked or not, preempted or not; cached-token accounting; cancellation; errors.

use std::sync::{Arc, OnceLock};
use tokio::sync::mpsc;

use engine::{
    EngineConfig, EngineCore, EngineError, EngineEvent, FinishReason, RequestError, RequestId,
    RequestSpec,
};
use frontend::chat::ChatMessage;
use model::Model;

fn model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| {
        let p = model::default_model_path();
        Arc::new(
            Model::load(&p)
                .unwrap_or_else(|e| panic!("{e}: run `cargo run -p agentkv -- fetch-model`")),
        )
    })
    .clone()
}

const SYSTEM: &str = "You are a careful research agent. You answer questions by thinking step by step, \
calling tools when you need facts, and citing what the tools returned. Tools: search(query) returns \
web snippets; lookup(term) returns the sentence containing term in the last page. Always end with \
'Final Answer:' followed by a short answer.";

fn prompts() -> Vec<Vec<u32>> {
    let m = model();
    let t = m.frontend().chat_template.as_ref().unwrap();
    [
        "What is the capital of France?",
        "Which river flows through Paris?",
        "Name three primary colors.",
        "How many legs does a spider have?",
        "What is 12 times 12?",
        "Who wrote Hamlet?",
    ]
    .iter()
    .map(|q| {
        let msgs = vec![
            ChatMessage::new("system", SYSTEM),
            ChatMessage::new("user", *q),
        ];
        m.tokenizer()
            .encode(&t.render(&msgs, None, true).unwrap(), false, true)
            .unwrap()
    })
    .collect()
}

/// Greedy ids and logprob bits of one finished request, plus its cached-token count.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    tokens: Vec<(u32, u32)>,
    cached_tokens: usize,
    reason: FinishReason,
}

fn cfg(prefix_caching: bool) -> EngineConfig {
    EngineConfig {
        num_blocks: 256,
        prefix_caching,
        threads: 2,
        ..Default::default()
    }
}

/// Submits `prompts` in the given order, `per_step` new requests per step, runs to completion.
fn run(
    cfg: EngineConfig,
    prompts: &[Vec<u32>],
    order: &[usize],
    per_step: usize,
    max_tokens: usize,
) -> (Vec<Outcome>, EngineCore) {
    let mut core = EngineCore::new(model(), cfg).unwrap();
    let mut rxs: Vec<Option<mpsc::UnboundedReceiver<EngineEvent>>> =
        (0..prompts.len()).map(|_| None).collect();
    let mut pending = order.to_vec();
    pending.reverse();
    loop {
        for _ in 0..per_step {
            if let Some(i) = pending.pop() {
                let (tx, rx) = mpsc::unbounded_channel();
                core.submit(
                    RequestId(i as u64),
                    RequestSpec::greedy(prompts[i].clone(), max_tokens),
                    tx,
                )
                .unwrap();
                rxs[i] = Some(rx);
            }
        }
        if !core.has_work() && pending.is_empty() {
            break;
        }
        core.step().unwrap();
        core.cache().check_invariants().unwrap();
    }
    let outs = rxs
        .into_iter()
        .map(|rx| {
            let mut o = Outcome {
                tokens: vec![],
                cached_tokens: usize::MAX,
                reason: FinishReason::Cancelled,
            };
            let mut rx = rx.unwrap();
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    EngineEvent::Token(t) => o.tokens.push((t.id, t.logprob.to_bits())),
                    EngineEvent::Finished { reason, usage, .. } => {
                        o.reason = reason;
                        o.cached_tokens = usage.cached_tokens;
                    }
                    EngineEvent::Error(e) => panic!("{e}"),
                    _ => {}
                }
            }
            o
        })
        .collect();
    (outs, core)
}

fn tokens_only(o: &[Outcome]) -> Vec<Vec<(u32, u32)>> {
    o.iter().map(|x| x.tokens.clone()).collect()
}

#[test]
fn same_output_with_cache_on_or_off_in_any_arrival_order() {
    let p = prompts();
    let n = p.len();
    let seq: Vec<usize> = (0..n).collect();
    let (off, _) = run(cfg(false), &p, &seq, 1, 10);
    assert!(
        off.iter().all(|o| o.cached_tokens == 0),
        "no reuse with caching off"
    );
    for (order, per_step) in [
        (seq.clone(), 1),
        (seq.iter().rev().copied().collect::<Vec<_>>(), 1),
        (vec![3, 0, 5, 1, 4, 2], 6),
    ] {
        let (on, core) = run(cfg(true), &p, &order, per_step, 10);
        assert_eq!(
            tokens_only(&on),
            tokens_only(&off),
            "order {order:?}, {per_step} per step"
        );
        let reused: usize = on.iter().map(|o| o.cached_tokens).sum();
        assert!(
            reused > 0,
            "the shared system prompt is reused (order {order:?})"
        );
        assert!(core.cache().counters().lookup_hit_tokens > 0);
    }
}

#[test]
fn same_output_alone_or_batched_and_with_small_prefill_chunks() {
    let p = prompts();
    let alone: Vec<Vec<(u32, u32)>> = (0..p.len())
        .map(|i| tokens_only(&run(cfg(false), &p[i..=i], &[0], 1, 8).0).remove(0))
        .collect();
    // Batched with 1, 3 and 15 others (prompts repeated to reach 16 sequences).
    for others in [1usize, 3, 15] {
        let many: Vec<Vec<u32>> = (0..=others).map(|k| p[k % p.len()].clone()).collect();
        let order: Vec<usize> = (0..many.len()).collect();
        let (out, _) = run(cfg(false), &many, &order, many.len(), 8);
        for (k, o) in out.iter().enumerate() {
            assert_eq!(
                o.tokens,
                alone[k % p.len()],
                "sequence {k} batched with {others} others"
            );
        }
    }
    // Chunked prefill: a 7-token budget per step splits every prompt into many chunks.
    let small = EngineConfig {
        max_batch_tokens: 7,
        ..cfg(true)
    };
    let order: Vec<usize> = (0..p.len()).collect();
    let (out, _) = run(small, &p, &order, 2, 8);
    assert_eq!(tokens_only(&out), alone);
}

#[test]
fn preemption_by_recompute_keeps_output_identical() {
    let p = prompts();
    let order: Vec<usize> = (0..p.len()).collect();
    let (reference, _) = run(cfg(false), &p, &order, 1, 24);
    // Each request needs ~7 blocks; 14 blocks for six concurrent requests forces preemption.
    let tight = EngineConfig {
        num_blocks: 14,
        ..cfg(true)
    };
    let (out, core) = run(tight, &p, &order, 6, 24);
    assert!(core.stats().preemptions > 0, "the tight pool must preempt");
    assert_eq!(tokens_only(&out), tokens_only(&reference));
    assert_eq!(core.cache().usage().in_use, 0, "every block returned");
}

#[test]
fn cancellation_frees_blocks_in_the_same_step_and_errors_are_clear() {
    let p = prompts();
    let mut core = EngineCore::new(model(), cfg(true)).unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    core.submit(RequestId(1), RequestSpec::greedy(p[0].clone(), 50), tx)
        .unwrap();
    core.step().unwrap();
    assert!(core.cache().usage().in_use > 0);
    core.cancel(RequestId(1));
    assert_eq!(core.cache().usage().in_use, 0);
    assert!(!core.has_work());
    drop(rx);
    // A dropped receiver (client gone) cancels at the next token.
    let (tx, rx) = mpsc::unbounded_channel();
    core.submit(RequestId(2), RequestSpec::greedy(p[1].clone(), 50), tx)
        .unwrap();
    drop(rx);
    core.step().unwrap();
    assert!(!core.has_work());
    assert_eq!(core.cache().usage().in_use, 0);

    let (tx, _rx) = mpsc::unbounded_channel();
    assert_eq!(
        core.submit(RequestId(3), RequestSpec::greedy(vec![], 5), tx.clone()),
        Err(EngineError::Request(RequestError::EmptyPrompt))
    );
    assert!(matches!(
        core.submit(
            RequestId(4),
            RequestSpec::greedy(vec![1; 9000], 5),
            tx.clone()
        ),
        Err(EngineError::Request(RequestError::ContextTooLong { .. }))
    ));
    assert!(matches!(
        core.submit(
            RequestId(5),
            RequestSpec::greedy(vec![60_000], 5),
            tx.clone()
        ),
        Err(EngineError::Request(RequestError::BadToken(60_000)))
    ));
    let tiny = EngineCore::new(
        model(),
        EngineConfig {
            num_blocks: 2,
            ..cfg(true)
        },
    );
    let mut tiny = tiny.unwrap();
    assert!(matches!(
        tiny.submit(RequestId(6), RequestSpec::greedy(p[0].clone(), 5), tx),
        Err(EngineError::Request(RequestError::NeverFits { .. }))
    ));
}

#[test]
fn second_call_of_an_agent_reuses_the_first_calls_blocks() {
    let p = prompts();
    let mut core = EngineCore::new(model(), cfg(true)).unwrap();
    let mut cached = Vec::new();
    for (i, prompt) in [p[0].clone(), p[1].clone()].into_iter().enumerate() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        core.submit(RequestId(i as u64), RequestSpec::greedy(prompt, 4), tx)
            .unwrap();
        while core.has_work() {
            core.step().unwrap();
        }
        while let Ok(ev) = rx.try_recv() {
            if let EngineEvent::Finished { usage, .. } = ev {
                cached.push(usage.cached_tokens);
            }
        }
    }
    assert_eq!(cached[0], 0);
    let common = p[0].iter().zip(&p[1]).take_while(|(a, b)| a == b).count();
    assert_eq!(
        cached[1],
        common / 16 * 16,
        "every full block of the shared prefix is reused"
    );
}

fn collect(
    rx: &mut mpsc::UnboundedReceiver<EngineEvent>,
) -> (Vec<u32>, String, Option<(FinishReason, engine::Usage)>) {
    let (mut ids, mut text, mut fin) = (Vec::new(), String::new(), None);
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            EngineEvent::Token(t) => {
                ids.push(t.id);
                text.push_str(&t.text);
            }
            EngineEvent::Text { text: t, .. } => text.push_str(&t),
            EngineEvent::Finished { reason, usage, .. } => {
                fin = Some((reason, usage));
                break;
            }
            EngineEvent::Error(e) => panic!("{e}"),
            EngineEvent::Admitted { .. } => {}
        }
    }
    (ids, text, fin)
}

#[test]
fn actor_serves_requests_with_stop_strings_min_tokens_seeds_and_warmup() {
    let p = prompts();
    let core = EngineCore::new(model(), cfg(true)).unwrap();
    let engine = engine::Engine::start(core);
    let h = engine.handle();

    // Warm-up pins the system prompt's blocks; the next request reports them as cached.
    let pinned = h
        .warmup("system", p[0].clone(), Default::default(), vec![])
        .unwrap()
        .blocking_recv()
        .unwrap()
        .unwrap();
    assert!(pinned >= 16 && pinned.is_multiple_of(16), "pinned {pinned}");
    let (_, mut rx) = h.submit(RequestSpec::greedy(p[0].clone(), 6)).unwrap();
    let (ids, text, fin) = collect(&mut rx);
    let (reason, usage) = fin.unwrap();
    assert_eq!(usage.cached_tokens, (p[0].len() - 1) / 16 * 16);
    assert_eq!(usage.completion_tokens, ids.len());
    assert_eq!(reason, FinishReason::Length);
    let snap = h.snapshot().unwrap().blocking_recv().unwrap();
    assert_eq!(snap.pinned.len(), 1);
    assert!(snap.cache.lookup_hit_tokens >= usage.cached_tokens as u64);

    // A stop string cuts the text before it and ends with reason Stop.
    let needle: String = text.chars().skip(3).take(4).collect();
    let mut spec = RequestSpec::greedy(p[0].clone(), 6);
    spec.stop_strings = vec![needle.clone()];
    let (_, mut rx) = h.submit(spec).unwrap();
    let (_, stopped_text, fin) = collect(&mut rx);
    assert_eq!(fin.unwrap().0, FinishReason::Stop);
    assert_eq!(stopped_text, text[..text.find(&needle).unwrap()]);

    // min_tokens suppresses end-of-turn; ignore_eos runs to max_tokens.
    let mut spec = RequestSpec::greedy(p[2].clone(), 40);
    spec.min_tokens = 40;
    let (_, mut rx) = h.submit(spec).unwrap();
    assert_eq!(collect(&mut rx).0.len(), 40);

    // Seeded sampling is reproducible whatever runs beside it.
    let seeded = |seed| {
        let mut spec = RequestSpec::greedy(p[3].clone(), 12);
        spec.sampling.temperature = 1.0;
        spec.sampling.seed = Some(seed);
        spec
    };
    let (_, mut a) = h.submit(seeded(5)).unwrap();
    let (_, mut noise) = h.submit(RequestSpec::greedy(p[4].clone(), 12)).unwrap();
    let (_, mut b) = h.submit(seeded(5)).unwrap();
    let (ia, ib) = (collect(&mut a).0, collect(&mut b).0);
    collect(&mut noise);
    assert_eq!(ia, ib);

    // Flush drops the pinned blocks too: the same prompt then reports nothing cached.
    let dropped = h.flush(None).unwrap().blocking_recv().unwrap();
    assert!(dropped > 0);
    let (_, mut rx) = h.submit(RequestSpec::greedy(p[0].clone(), 2)).unwrap();
    assert_eq!(collect(&mut rx).2.unwrap().1.cached_tokens, 0);

    // n = 3: one prompt computed once and forked; greedy choices are identical to each other
    // and to n = 1, each choice finishes once.
    let mut spec = RequestSpec::greedy(p[5].clone(), 5);
    spec.n = 3;
    let (_, mut rx) = h.submit(spec).unwrap();
    let mut per_choice = vec![Vec::new(); 3];
    let mut finished = 0;
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            EngineEvent::Token(t) => per_choice[t.choice as usize].push(t.id),
            EngineEvent::Finished { .. } => {
                finished += 1;
                if finished == 3 {
                    break;
                }
            }
            EngineEvent::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
    let (_, mut rx) = h.submit(RequestSpec::greedy(p[5].clone(), 5)).unwrap();
    let single = collect(&mut rx).0;
    assert!(
        per_choice.iter().all(|c| *c == single),
        "{per_choice:?} vs {single:?}"
    );
    let snap = h.snapshot().unwrap().blocking_recv().unwrap();
    assert_eq!(snap.usage.in_use, 0, "forked choices returned every block");

    // Validation errors come back as an event.
    let (_, mut rx) = h.submit(RequestSpec::greedy(vec![], 2)).unwrap();
    assert!(matches!(
        rx.blocking_recv(),
        Some(EngineEvent::Error(EngineError::Request(
            RequestError::EmptyPrompt
        )))
    ));
}

#[test]
fn engine_output_matches_the_single_sequence_runtime() {
    // The engine (paged KV, f16) and model::generate (contiguous KV, f16) agree bit for bit.
    let m = model();
    let pool = model::ThreadPool::new(2);
    for prompt in prompts().into_iter().take(3) {
        let opts = model::GenerateOptions {
            max_tokens: 12,
            // The engine stops at end-of-turn too (the token is reported).
            stop_ids: m.tokenizer().eot_ids().to_vec(),
            ..Default::default()
        };
        let (want, _) = model::generate(&m, &pool, &prompt, &opts, |_| true).unwrap();
        let want: Vec<(u32, u32)> = want.iter().map(|t| (t.id, t.logprob.to_bits())).collect();
        let (got, _) = run(cfg(true), &[prompt], &[0], 1, 12);
        assert_eq!(got[0].tokens, want);
    }
}

#[test]
fn session_retention_keeps_an_agents_prefix_through_a_flood_of_other_requests() {
    // Positive and negative runs differ only in the retention hint of the agent's first call.
    let agent = prompts()[0].clone();
    let flood: Vec<Vec<u32>> = (0..5u32)
        .map(|i| (0..160).map(|j| 1000 + i * 997 + j * 31 % 5000).collect())
        .collect();
    let run_agent = |retain: bool| {
        // No inferred conversations: the control is plain LRU (inferred retention would keep
        // the unnamed agent's blocks too; `engine_tiny_model.rs` tests that).
        let mut core = EngineCore::new(
            model(),
            EngineConfig {
                num_blocks: 40,
                inferred_conversations: None,
                ..cfg(true)
            },
        )
        .unwrap();
        let mut go = |spec: RequestSpec| {
            let (tx, mut rx) = mpsc::unbounded_channel();
            core.submit(RequestId(0), spec, tx).unwrap();
            while core.has_work() {
                core.step().unwrap();
            }
            let mut cached = None;
            while let Ok(ev) = rx.try_recv() {
                if let EngineEvent::Finished { usage, .. } = ev {
                    cached = Some(usage.cached_tokens);
                }
            }
            cached.unwrap()
        };
        let mut first = RequestSpec::greedy(agent.clone(), 2);
        if retain {
            first.retention = Some(engine::Retention {
                session: cache::SessionId(9),
                ttl: std::time::Duration::from_secs(600),
                priority: 1,
            });
        }
        go(first);
        for f in &flood {
            go(RequestSpec::greedy(f.clone(), 2));
        }
        go(RequestSpec::greedy(agent.clone(), 2))
    };
    let full = (agent.len() - 1) / 16 * 16;
    assert_eq!(
        run_agent(true),
        full,
        "retained session keeps every full block"
    );
    assert_eq!(
        run_agent(false),
        0,
        "control: without retention LRU evicts the agent's blocks"
    );
}

#[test]
fn concurrent_requests_sharing_a_prefix_compute_it_once() {
    let p = prompts();
    let order: Vec<usize> = (0..p.len()).collect();
    let total: usize = p.iter().map(|x| x.len()).sum();
    let (_, off) = run(cfg(false), &p, &order, p.len(), 1);
    assert_eq!(off.stats().prefill_tokens as usize, total);
    let (out, on) = run(cfg(true), &p, &order, p.len(), 1);
    // The first request computes the shared system prompt; the others wait for its blocks and
    // compute only what follows the last shared full block.
    let shared = p[0].iter().zip(&p[1]).take_while(|(a, b)| a == b).count() / 16 * 16;
    let reused: usize = out.iter().map(|o| o.cached_tokens).sum();
    assert_eq!(
        reused,
        shared * (p.len() - 1),
        "every later request reuses the shared blocks"
    );
    assert_eq!(on.stats().prefill_tokens as usize, total - reused);
}

/// Decodes whose sequences share a long prompt prefix (the same blocks, by the prefix cache)
/// read its whole segments once for all of them (`attention_plan`'s shared tasks); their
/// tokens and logprob bits are those of each request alone with the cache off, for f16 and
/// bf16 K/V.
#[test]
fn decodes_over_a_shared_long_prefix_give_the_bits_of_each_alone() {
    let m = model();
    let t = m.frontend().chat_template.as_ref().unwrap();
    // A system prompt past two 512-position segments.
    let system = (0..16)
        .map(|i| format!("Rule {i}: {SYSTEM}"))
        .collect::<Vec<_>>()
        .join(" ");
    let p: Vec<Vec<u32>> = [
        "Who wrote Hamlet?",
        "What is 12 times 12?",
        "Name a river.",
        "Why?",
    ]
    .iter()
    .map(|q| {
        let msgs = vec![
            ChatMessage::new("system", &system),
            ChatMessage::new("user", *q),
        ];
        m.tokenizer()
            .encode(&t.render(&msgs, None, true).unwrap(), false, true)
            .unwrap()
    })
    .collect();
    assert!(p.iter().all(|x| x.len() > 1100), "{}", p[0].len());
    for kv in ["f16", "bf16"] {
        let with = |prefix_caching: bool| EngineConfig {
            kv_dtype: model::KvDtype::parse(kv).unwrap(),
            ..cfg(prefix_caching)
        };
        let alone: Vec<_> = (0..p.len())
            .map(|i| tokens_only(&run(with(false), &p[i..=i], &[0], 1, 6).0).remove(0))
            .collect();
        let order: Vec<usize> = (0..p.len()).collect();
        let (together, _) = run(with(true), &p, &order, p.len(), 6);
        assert!(
            together[1..].iter().all(|o| o.cached_tokens >= 1024),
            "{kv}: shared blocks"
        );
        assert_eq!(tokens_only(&together), alone, "{kv}");
    }
}

#[test]
fn quantized_kv_gives_identical_output_with_the_cache_on_or_off() {
    let p = prompts();
    let order: Vec<usize> = (0..3).collect();
    for spec in [
        "int8",
        "int4",
        "k=int8,v=int4",
        "k=int4h,v=int4",
        "int8h",
        "fp8",
        "bf16",
        "k=int8,v=bf16",
        "f32",
    ] {
        let kv_dtype = model::KvDtype::parse(spec).unwrap();
        let (off, _) = run(
            EngineConfig {
                kv_dtype,
                ..cfg(false)
            },
            &p[..3],
            &order,
            1,
            6,
        );
        let (on, core) = run(
            EngineConfig {
                kv_dtype,
                ..cfg(true)
            },
            &p[..3],
            &order,
            1,
            6,
        );
        assert_eq!(tokens_only(&on), tokens_only(&off), "{spec}");
        assert!(
            on.iter().map(|o| o.cached_tokens).sum::<usize>() > 0,
            "{spec}: prefix reused"
        );
        assert_eq!(core.snapshot().kv_codec, kv_dtype.id());
        assert_eq!(
            core.memory().allocated_bytes(),
            core.memory().bytes_per_token() * 16 * 256
        );
    }
}

#[test]
fn every_eviction_policy_gives_identical_output_under_pressure() {
    // Six agents with their own system prompts (~6 blocks each), twice, through a 20-block
    // pool: blocks are evicted and re-requested under each policy, including the adaptive one.
    let m = model();
    let t = m.frontend().chat_template.as_ref().unwrap();
    let own: Vec<Vec<u32>> = (0..6)
        .map(|i| {
            let msgs = vec![
                ChatMessage::new("system", format!("You are agent number {i}. {SYSTEM}")),
                ChatMessage::new("user", "What should I do next?"),
            ];
            m.tokenizer()
                .encode(&t.render(&msgs, None, true).unwrap(), false, true)
                .unwrap()
        })
        .collect();
    let p: Vec<Vec<u32>> = own.iter().cycle().take(12).cloned().collect();
    let order: Vec<usize> = (0..p.len()).collect();
    let small = |policy, prefix_caching| EngineConfig {
        num_blocks: 20,
        policy,
        ..cfg(prefix_caching)
    };
    let (off, _) = run(small(cache::EvictionPolicy::Lru, false), &p, &order, 1, 6);
    for policy in [
        cache::EvictionPolicy::Lru,
        cache::EvictionPolicy::Lfu,
        cache::EvictionPolicy::SegmentedLru {
            protected_fraction: 0.2,
        },
        cache::EvictionPolicy::ADAPTIVE_SEGMENTED_LRU,
    ] {
        let (on, core) = run(small(policy, true), &p, &order, 1, 6);
        assert_eq!(tokens_only(&on), tokens_only(&off), "{policy:?}");
        let c = core.cache().counters();
        assert!(c.evictions.capacity > 0, "{policy:?}: the pool overflowed");
        assert!(
            c.lookup_hit_tokens > 0,
            "{policy:?}: the system prompt is reused"
        );
        if policy.is_segmented() {
            assert!(c.slru_protected_capacity_blocks <= 20);
        }
    }
}

/// Long prompts (tiled attention over paged K/V, several 512-position segments) arriving while
/// others decode: with a step-time target so small that every step with decodes carries only
/// `min_prefill_tokens_per_step` prompt tokens, the prompts are cut into many small chunks —
/// and every request's tokens and logprob bits equal those of the uncapped run.
#[test]
fn a_step_time_target_chunks_prefills_without_changing_outputs() {
    let m = model();
    let t = m.frontend().chat_template.as_ref().unwrap();
    let long: Vec<Vec<u32>> = (0..3)
        .map(|i| {
            let msgs = vec![
                ChatMessage::new("system", SYSTEM.repeat(10 + 2 * i)),
                ChatMessage::new("user", format!("Question {i}: what is {i} plus {i}?")),
            ];
            m.tokenizer()
                .encode(&t.render(&msgs, None, true).unwrap(), false, true)
                .unwrap()
        })
        .collect();
    let lens: Vec<usize> = long.iter().map(Vec::len).collect();
    assert!(
        lens.iter().all(|&n| n > 600),
        "prompts reach the tiled regime: {lens:?}"
    );
    let base = EngineConfig {
        num_blocks: 512,
        ..cfg(true)
    };
    // A short request decodes for a while (the cost model learns from its steps), then the
    // long prompts arrive while it is still decoding.
    let short = prompts()[0].clone();
    // Returns every request's tokens and the largest prefill chunk of any step after arrival.
    let drive = |cfg: EngineConfig| -> (Vec<Vec<(u32, u32)>>, u64) {
        let mut core = EngineCore::new(model(), cfg).unwrap();
        let mut rxs = Vec::new();
        let submit = |core: &mut EngineCore, id: u64, p: &[u32], max: usize| {
            let (tx, rx) = mpsc::unbounded_channel();
            let mut spec = RequestSpec::greedy(p.to_vec(), max);
            spec.ignore_eos = true;
            core.submit(RequestId(id), spec, tx).unwrap();
            rx
        };
        rxs.push(submit(&mut core, 0, &short, 160));
        for _ in 0..12 {
            core.step().unwrap();
        }
        for (i, p) in long.iter().enumerate() {
            rxs.push(submit(&mut core, 1 + i as u64, p, 8));
        }
        let mut largest = 0;
        while core.has_work() {
            let before = core.stats().prefill_tokens;
            core.step().unwrap();
            largest = largest.max(core.stats().prefill_tokens - before);
            core.cache().check_invariants().unwrap();
        }
        let outs = rxs
            .into_iter()
            .map(|mut rx| {
                let mut toks = Vec::new();
                while let Ok(ev) = rx.try_recv() {
                    match ev {
                        EngineEvent::Token(t) => toks.push((t.id, t.logprob.to_bits())),
                        EngineEvent::Error(e) => panic!("{e}"),
                        _ => {}
                    }
                }
                toks
            })
            .collect();
        (outs, largest)
    };
    let (uncapped, uncapped_chunk) = drive(base.clone());
    let capped_cfg = EngineConfig {
        step_time_target: Some(std::time::Duration::from_micros(1)),
        min_prefill_tokens_per_step: 16,
        ..base
    };
    let (capped, capped_chunk) = drive(capped_cfg);
    assert_eq!(capped, uncapped);
    assert!(capped.iter().all(|t| !t.is_empty()));
    // ≈2,000 prompt tokens in 16-token chunks while the short request decodes.
    assert_eq!(capped_chunk, 16, "prefill chunks under the cap");
    assert!(uncapped_chunk > 400, "uncapped chunk {uncapped_chunk}");
}
