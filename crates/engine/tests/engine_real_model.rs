//! The engine on the real default model: output identical with the prefix cache on or off, alone
//! or batched, chunked or not, preempted or not; cached-token accounting; cancellation; errors.

use std::sync::mpsc;
use std::sync::{Arc, OnceLock};

use engine::{
    EngineConfig, EngineCore, EngineError, EngineEvent, FinishReason, RequestId, RequestSpec,
};
use model::chat::ChatMessage;
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
    let t = m.chat_template.as_ref().unwrap();
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
        m.tokenizer
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
    let mut rxs: Vec<Option<mpsc::Receiver<EngineEvent>>> =
        (0..prompts.len()).map(|_| None).collect();
    let mut pending = order.to_vec();
    pending.reverse();
    loop {
        for _ in 0..per_step {
            if let Some(i) = pending.pop() {
                let (tx, rx) = mpsc::channel();
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
            for ev in rx.unwrap().try_iter() {
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
    let (tx, rx) = mpsc::channel();
    core.submit(RequestId(1), RequestSpec::greedy(p[0].clone(), 50), tx)
        .unwrap();
    core.step().unwrap();
    assert!(core.cache().usage().in_use > 0);
    core.cancel(RequestId(1));
    assert_eq!(core.cache().usage().in_use, 0);
    assert!(!core.has_work());
    drop(rx);
    // A dropped receiver (client gone) cancels at the next token.
    let (tx, rx) = mpsc::channel();
    core.submit(RequestId(2), RequestSpec::greedy(p[1].clone(), 50), tx)
        .unwrap();
    drop(rx);
    core.step().unwrap();
    assert!(!core.has_work());
    assert_eq!(core.cache().usage().in_use, 0);

    let (tx, _rx) = mpsc::channel();
    assert_eq!(
        core.submit(RequestId(3), RequestSpec::greedy(vec![], 5), tx.clone()),
        Err(EngineError::EmptyPrompt)
    );
    assert!(matches!(
        core.submit(
            RequestId(4),
            RequestSpec::greedy(vec![1; 9000], 5),
            tx.clone()
        ),
        Err(EngineError::ContextTooLong { .. })
    ));
    assert!(matches!(
        core.submit(
            RequestId(5),
            RequestSpec::greedy(vec![60_000], 5),
            tx.clone()
        ),
        Err(EngineError::BadToken(60_000))
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
        Err(EngineError::NeverFits { .. })
    ));
}

#[test]
fn second_call_of_an_agent_reuses_the_first_calls_blocks() {
    let p = prompts();
    let mut core = EngineCore::new(model(), cfg(true)).unwrap();
    let mut cached = Vec::new();
    for (i, prompt) in [p[0].clone(), p[1].clone()].into_iter().enumerate() {
        let (tx, rx) = mpsc::channel();
        core.submit(RequestId(i as u64), RequestSpec::greedy(prompt, 4), tx)
            .unwrap();
        while core.has_work() {
            core.step().unwrap();
        }
        for ev in rx.try_iter() {
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
