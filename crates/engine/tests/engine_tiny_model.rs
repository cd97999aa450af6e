//! The engine on a tiny random-weight model built in memory (`model::testing`, no download):
//! the scheduling guarantees — output independent of batching, chunking, caching, preemption and
//! forking — and a seeded random drive with submit, cancel, preemption and failing tiers that
//! checks the cache's invariants after every step. The real-model tests keep the end-to-end
//! guarantees; these run in seconds and exercise the scheduler's corners.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use engine::{EngineConfig, EngineCore, EngineEvent, FinishReason, RequestId, RequestSpec};
use model::testing::{tiny_model, TinyArch, TinyModelSpec};
use model::{Model, SamplingParams};
use rand::{Rng, SeedableRng};
use tier::{Compression, FaultStore, RamConfig, RamStore, TierStore};
use tokio::sync::mpsc;

fn model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| Arc::new(tiny_model(&TinyModelSpec::default()).unwrap()))
        .clone()
}

/// Prompts over the byte tokens; `shared` leading tokens are common to all.
fn prompts(n: usize, shared: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let common: Vec<u32> = (0..shared).map(|_| rng.gen_range(3..259)).collect();
    (0..n)
        .map(|_| {
            let extra = rng.gen_range(1..40);
            let mut p = common.clone();
            p.extend((0..extra).map(|_| rng.gen_range(3..259u32)));
            p
        })
        .collect()
}

/// A greedy request that always generates `max_tokens` (the tiny model's end-of-turn token
/// would end some early).
fn greedy(prompt: Vec<u32>, max_tokens: usize) -> RequestSpec {
    RequestSpec {
        ignore_eos: true,
        ..RequestSpec::greedy(prompt, max_tokens)
    }
}

fn cfg(num_blocks: usize, max_batch_tokens: usize) -> EngineConfig {
    EngineConfig {
        num_blocks,
        block_size: 4,
        max_batch_tokens,
        threads: 1,
        // Prompts of 64+ tokens in llama.cpp's prefill arithmetic (off by default): every
        // guarantee below holds with it.
        llama_cpp_prefill: true,
        ..Default::default()
    }
}

/// Token ids (and logprob bits) of one finished choice.
type Output = Vec<(u32, u32)>;

/// Submits every spec at once and steps to completion; outputs by (request, choice).
fn run(core: &mut EngineCore, specs: Vec<RequestSpec>) -> HashMap<(usize, u32), Output> {
    let mut rxs = Vec::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let (tx, rx) = mpsc::unbounded_channel();
        core.submit(RequestId(i as u64), spec, tx).unwrap();
        rxs.push(rx);
    }
    while core.has_work() {
        core.step().unwrap();
        core.cache().check_invariants().unwrap();
    }
    let mut outs = HashMap::new();
    for (i, mut rx) in rxs.into_iter().enumerate() {
        while let Ok(ev) = rx.try_recv() {
            match ev {
                EngineEvent::Token(t) => outs
                    .entry((i, t.choice))
                    .or_insert_with(Vec::new)
                    .push((t.id, t.logprob.to_bits())),
                EngineEvent::Error(e) => panic!("request {i}: {e}"),
                _ => {}
            }
        }
    }
    outs
}

fn alone(p: &[u32], max_tokens: usize) -> Output {
    alone_on(model(), p, max_tokens)
}

fn alone_on(m: Arc<Model>, p: &[u32], max_tokens: usize) -> Output {
    alone_kv(m, p, max_tokens, model::KvDtype::F16)
}

fn alone_kv(m: Arc<Model>, p: &[u32], max_tokens: usize, kv_dtype: model::KvDtype) -> Output {
    let mut core = EngineCore::new(
        m,
        EngineConfig {
            kv_dtype,
            ..cfg(256, 512)
        },
    )
    .unwrap();
    run(&mut core, vec![greedy(p.to_vec(), max_tokens)])
        .remove(&(0, 0))
        .unwrap()
}

/// Each prompt alone vs all of them together with prefix caching (whole and chunked prefills)
/// and without it: bitwise equal tokens and logprobs.
fn check_batching_chunking_caching(m: Arc<Model>, ps: &[Vec<u32>], max_tokens: usize) {
    check_batching_chunking_caching_kv(m, ps, max_tokens, model::KvDtype::F16);
}

fn check_batching_chunking_caching_kv(
    m: Arc<Model>,
    ps: &[Vec<u32>],
    max_tokens: usize,
    kv_dtype: model::KvDtype,
) -> Vec<Output> {
    let want: Vec<Output> = ps
        .iter()
        .map(|p| alone_kv(m.clone(), p, max_tokens, kv_dtype))
        .collect();
    for (caching, batch) in [(true, 512), (true, 7), (false, 16), (true, 3)] {
        let mut c = cfg(256, batch);
        c.prefix_caching = caching;
        c.kv_dtype = kv_dtype;
        let mut core = EngineCore::new(m.clone(), c).unwrap();
        let specs = ps.iter().map(|p| greedy(p.clone(), max_tokens)).collect();
        let got = run(&mut core, specs);
        for (i, w) in want.iter().enumerate() {
            assert_eq!(
                &got[&(i, 0)],
                w,
                "prompt {i}, caching {caching}, batch {batch}, {kv_dtype}"
            );
        }
    }
    want
}

#[test]
fn outputs_are_identical_alone_batched_chunked_and_with_the_cache_off() {
    check_batching_chunking_caching(model(), &prompts(6, 24, 1), 6);
}

/// Prompts of 64+ tokens take llama.cpp's tiled prefill arithmetic for their prompt rows
/// (`EngineConfig::llama_cpp_prefill`, on in this file) and the per-row one for generated rows:
/// still the same bits alone, batched, chunked (chunks of 3 and 7 cut prompts anywhere) and
/// with the cache off, mixed with short prompts — and different bits from the engine's default
/// arithmetic for 64+ token prompts, and for short ones where that default is
/// `AttnArith::Tiled` (the setting is in effect).
#[test]
fn llama_cpp_prefill_rows_keep_outputs_independent_of_batching_chunking_and_cache() {
    let mut ps = prompts(4, 70, 5);
    ps.extend(prompts(2, 20, 6));
    let want = check_batching_chunking_caching_kv(model(), &ps, 6, model::KvDtype::F16);
    let mut c = cfg(256, 512);
    c.llama_cpp_prefill = false;
    let mut core = EngineCore::new(model(), c).unwrap();
    let per_row = run(&mut core, vec![greedy(ps[0].clone(), 6)])
        .remove(&(0, 0))
        .unwrap();
    assert_ne!(
        per_row, want[0],
        "a 71+ token prompt's logprobs change with the setting"
    );
    let short = run(&mut core, vec![greedy(ps[4].clone(), 6)])
        .remove(&(0, 0))
        .unwrap();
    assert_eq!(
        short != want[4],
        model::AttnArith::invariant() == model::AttnArith::Tiled,
        "a prompt under 64 tokens: llama.cpp's per-row arithmetic with the setting, the engine's \
         default without"
    );
}

/// A later turn whose prompt holds an earlier turn's prompt and generated tokens (a long one
/// and a short one, which prefill in different arithmetics) gives the same bits with the
/// earlier turn in the cache as alone: the cache never hands it rows computed in another
/// arithmetic than a fresh prefill would use.
#[test]
fn a_later_turn_over_cached_earlier_turns_matches_a_fresh_run() {
    for (first, extra) in [
        (prompts(1, 80, 7).remove(0), 9),
        (prompts(1, 20, 8).remove(0), 40),
    ] {
        let mut core = EngineCore::new(model(), cfg(256, 512)).unwrap();
        let out = run(&mut core, vec![greedy(first.clone(), 8)])
            .remove(&(0, 0))
            .unwrap();
        let mut next = first.clone();
        next.extend(out.iter().map(|t| t.0));
        next.extend((0..extra).map(|i| 3 + (i * 37) % 250));
        assert!(next.len() >= 64, "the later turn prefills like llama.cpp");
        let cached = run(&mut core, vec![greedy(next.clone(), 6)])
            .remove(&(0, 0))
            .unwrap();
        assert_eq!(cached, alone(&next, 6), "prompt {} + {extra}", first.len());
        let mut c = cfg(256, 7);
        c.prefix_caching = false;
        let mut core = EngineCore::new(model(), c).unwrap();
        let off = run(&mut core, vec![greedy(next.clone(), 6)])
            .remove(&(0, 0))
            .unwrap();
        assert_eq!(cached, off);
    }
}

/// A Gemma-3-like model whose local layers attend 8 positions: prompts that share 24 tokens
/// (cached blocks, most of them outside the local window) and run 12 more tokens give the same
/// bits alone, batched, chunked and with the cache off.
#[test]
fn sliding_window_layers_stay_exact_with_prefix_caching_and_chunking() {
    let spec = TinyModelSpec {
        num_layers: 3,
        arch: TinyArch::Gemma3 {
            window: 8,
            pattern: 3,
        },
        ..TinyModelSpec::default()
    };
    let m = Arc::new(tiny_model(&spec).unwrap());
    assert_eq!(m.config().window_of(0), Some(8));
    assert_eq!(m.config().window_of(2), None);
    check_batching_chunking_caching(m, &prompts(5, 24, 3), 12);
}

/// Per-channel 4-bit K (`int4c`, one group per block of one KV head) seals a block when its last
/// row is written and a query reads its own block in f16, earlier blocks sealed: tokens and
/// logprobs stay bitwise independent of batching, chunking (chunks of 3 and 7 tokens end inside
/// blocks of 4), prefix caching and preemption — and differ from f16 (the codec is in use).
#[test]
fn per_channel_k_sealed_per_block_keeps_outputs_independent_of_batching_chunking_and_cache() {
    let kv = model::KvDtype::parse("k=int4c-t4,v=int4-g16").unwrap();
    let ps = prompts(6, 24, 1);
    let got = check_batching_chunking_caching_kv(model(), &ps, 6, kv);
    let f16: Vec<Output> = ps.iter().map(|p| alone(p, 6)).collect();
    assert_ne!(got, f16, "int4c K changes logprobs");
    // Preemption: the pool cannot hold every running sequence to the end.
    let ps = prompts(5, 0, 2);
    let want: Vec<Output> = ps.iter().map(|p| alone_kv(model(), p, 40, kv)).collect();
    let mut core = EngineCore::new(
        model(),
        EngineConfig {
            kv_dtype: kv,
            ..cfg(24, 64)
        },
    )
    .unwrap();
    let got = run(
        &mut core,
        ps.iter().map(|p| greedy(p.clone(), 40)).collect(),
    );
    assert!(core.stats().preemptions > 0);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&got[&(i, 0)], w, "prompt {i}");
    }
    // A block size the codec does not seal is refused when the engine is built.
    let bad = EngineConfig {
        kv_dtype: model::KvDtype::parse("k=int4c-t16,v=int4-g16").unwrap(),
        ..cfg(24, 64)
    };
    assert!(EngineCore::new(model(), bad).is_err());
}

/// `int4c` blocks demoted to a RAM tier and loaded back give the recomputed output (sealed bytes
/// are a function of the block's rows), and greedy forks, which copy the partial last block's f16
/// rows, decode what a single request does.
#[test]
fn per_channel_k_blocks_restore_from_a_tier_and_fork_exactly() {
    let kv = model::KvDtype::parse("k=int4c-t4,v=int4-g16").unwrap();
    let ps = prompts(6, 24, 5);
    let want: Vec<Output> = ps.iter().map(|p| alone_kv(model(), p, 4, kv)).collect();
    let store = Arc::new(RamStore::new(RamConfig {
        max_bytes: 64 << 20,
        compression: Compression::None,
    }));
    let mut c = cfg(24, 64);
    c.kv_dtype = kv;
    c.tiers.load_policy = engine::TierLoadPolicy::Always;
    c.tiers.admission_wait = std::time::Duration::from_secs(600);
    let mut core =
        EngineCore::with_tier_stores(model(), c, vec![store as Arc<dyn TierStore>]).unwrap();
    for round in 0..2 {
        let specs = ps.iter().map(|p| greedy(p.clone(), 4)).collect();
        let got = run(&mut core, specs);
        for (i, w) in want.iter().enumerate() {
            assert_eq!(&got[&(i, 0)], w, "round {round}, prompt {i}");
        }
        core.wait_for_demotions();
    }
    assert!(
        core.snapshot().tiers.tiers[0].stats.hit_tokens > 0,
        "loaded from the tier"
    );
    let mut core = EngineCore::new(
        model(),
        EngineConfig {
            kv_dtype: kv,
            ..cfg(256, 512)
        },
    )
    .unwrap();
    let mut spec = greedy(ps[0].clone(), 12);
    spec.n = 3;
    let forked = run(&mut core, vec![spec]);
    let single = alone_kv(model(), &ps[0], 12, kv);
    for choice in 0..3u32 {
        let ids: Vec<u32> = forked[&(0, choice)].iter().map(|t| t.0).collect();
        let want_ids: Vec<u32> = single.iter().map(|t| t.0).collect();
        assert_eq!(ids, want_ids, "choice {choice}");
    }
}

/// A tier storing another codec than the f16 pool (`codec:`, lossy): it holds the tier codec's
/// bytes (named in every object, fewer bytes than f16), restores from them, and keys its blocks
/// apart — an exact engine sharing the store never loads them and computes the exact output;
/// and the lossy engine never serves the exact engine's blocks either.
#[test]
fn a_lossy_tier_stores_its_codec_and_is_never_served_as_exact() {
    let tier_codec = model::KvDtype::parse("k=int4c-t4,v=int8-g16").unwrap();
    let ps = prompts(4, 24, 9);
    let want: Vec<Output> = ps.iter().map(|p| alone(p, 4)).collect();
    let store = Arc::new(RamStore::new(RamConfig {
        max_bytes: 64 << 20,
        compression: Compression::None,
    }));
    // `blocks` in the pool; `write_on_publish`: every block reaches the store when computed
    // (so the shared prefix is there too), else only evicted ones do.
    let engine_with = |codec: Option<model::KvDtype>, blocks: usize, write_on_publish: bool| {
        let mut c = cfg(blocks, 64);
        c.tiers.load_policy = engine::TierLoadPolicy::Always;
        c.tiers.admission_wait = std::time::Duration::from_secs(600);
        c.tiers.codecs = vec![codec];
        c.tiers.write_on_publish = write_on_publish;
        EngineCore::with_tier_stores(model(), c, vec![store.clone() as Arc<dyn TierStore>]).unwrap()
    };
    let engine = |codec: Option<model::KvDtype>| engine_with(codec, 24, true);
    let mut lossy = engine(Some(tier_codec));
    let tier = &lossy.snapshot().tiers.tiers[0];
    assert_eq!(
        (tier.codec.as_str(), tier.lossy),
        ("k=int4c-t4,v=int8-g16", true)
    );
    // Round 0 computes everything (exact) and writes every block; the pool of 24 blocks cannot
    // keep them all, so round 1 loads some back through the codec.
    for round in 0..2 {
        let specs = ps.iter().map(|p| greedy(p.clone(), 4)).collect();
        let got = run(&mut lossy, specs);
        if round == 0 {
            for (i, w) in want.iter().enumerate() {
                assert_eq!(&got[&(i, 0)], w, "prompt {i}");
            }
        }
        lossy.wait_for_demotions();
    }
    let snap = lossy.snapshot();
    let t = &snap.tiers.tiers[0];
    assert!(t.engine.loaded_blocks > 0, "{:?}", t.engine);
    assert_eq!(t.engine.rejected, 0);
    // Each object: the 128-byte header, the codec id and 2 layers × 2 heads × 4 rows of
    // K (int4c-t4 at head_dim 16: 16 parameter bytes per row + 8 code bytes) and V (int8-g16:
    // 4 + 16) — 704 payload bytes where f16 stores 1,024.
    let object = 128 + "k=int4c-t4,v=int8-g16".len() as u64 + 16 * (24 + 20);
    assert!(t.stats.puts > 0);
    assert_eq!(t.stats.bytes_written, t.stats.puts * object);
    // An exact engine on the same store finds none of the lossy blocks: exact outputs, no loads.
    // Its pool holds every prompt and it writes nothing meanwhile, so the store holds only the
    // lossy engine's blocks whenever it looks (a smaller pool would preempt, look up again and
    // rightly load its own exact blocks back).
    let mut exact = engine_with(None, 64, false);
    assert!(!exact.snapshot().tiers.tiers[0].lossy);
    let specs = ps.iter().map(|p| greedy(p.clone(), 4)).collect();
    let got = run(&mut exact, specs);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&got[&(i, 0)], w, "prompt {i}");
    }
    // Not even found (a different namespace), rather than found and rejected by codec id.
    let ex = exact.snapshot().tiers.tiers[0].engine.clone();
    assert_eq!(
        (ex.loaded_blocks, ex.load_decisions, ex.rejected),
        (0, 0, 0)
    );
    // An exact engine that writes its blocks: the store holds both kinds now; a fresh lossy
    // engine loads only its own kind.
    let mut exact = engine(None);
    let specs = ps.iter().map(|p| greedy(p.clone(), 4)).collect();
    run(&mut exact, specs);
    exact.wait_for_demotions();
    assert!(exact.snapshot().tiers.tiers[0].engine.demoted_blocks > 0);
    let mut lossy2 = engine(Some(tier_codec));
    let specs = ps.iter().map(|p| greedy(p.clone(), 4)).collect();
    run(&mut lossy2, specs);
    let t2 = &lossy2.snapshot().tiers.tiers[0].engine;
    assert_eq!(t2.rejected, 0, "never handed an exact (f16) object");
    assert!(
        t2.loaded_blocks > 0,
        "finds the lossy blocks of the first engine"
    );
}

/// A pool mapped at start (`EngineConfig::prefault_kv`, what `agentkv serve` sets; the pool
/// made large enough to pass the huge-page threshold) serves the same bits as the lazily
/// mapped one.
#[test]
fn a_pool_mapped_at_start_serves_the_same_outputs() {
    // f32 rows are allocated lazily (f16 ones are written at construction).
    let f32kv = model::KvDtype::parse("f32").unwrap();
    let ps = prompts(4, 12, 9);
    let want: Vec<Output> = ps.iter().map(|p| alone_kv(model(), p, 12, f32kv)).collect();
    let mut core = EngineCore::new(
        model(),
        EngineConfig {
            prefault_kv: true,
            kv_dtype: f32kv,
            ..cfg(1 << 15, 64)
        },
    )
    .unwrap();
    // Past twice the 4 MiB below which buffers are left alone.
    let bytes = core.memory().bytes_per_token() * 4 * (1 << 15);
    assert!(bytes >= 8 << 20, "{bytes} bytes");
    let specs = ps.iter().map(|p| greedy(p.clone(), 12)).collect();
    let got = run(&mut core, specs);
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&got[&(i, 0)], w, "prompt {i}");
    }
}

#[test]
fn a_small_pool_preempts_and_outputs_stay_identical() {
    let ps = prompts(5, 0, 2);
    let want: Vec<Output> = ps.iter().map(|p| alone(p, 40)).collect();
    // Requests admitted with their prompts (up to 39 tokens) each grow by 40 tokens: a pool of
    // 24 blocks of 4 tokens cannot hold the running ones to the end.
    let mut core = EngineCore::new(model(), cfg(24, 64)).unwrap();
    let specs = ps.iter().map(|p| greedy(p.clone(), 40)).collect();
    let got = run(&mut core, specs);
    assert!(core.stats().preemptions > 0, "{:?}", core.stats());
    for (i, w) in want.iter().enumerate() {
        assert_eq!(&got[&(i, 0)], w, "prompt {i}");
    }
    assert_eq!(core.cache().usage().in_use, 0);
}

#[test]
fn a_more_important_request_preempts_a_running_one_and_both_outputs_stay_identical() {
    // One slot: a long request of priority 5 is decoding when one of priority -1 arrives; the
    // newcomer takes the slot (the first is recomputed afterwards) and finishes first.
    let ps = prompts(2, 0, 11);
    let want: Vec<Output> = vec![alone(&ps[0], 48), alone(&ps[1], 4)];
    let mut core = EngineCore::new(
        model(),
        EngineConfig {
            max_seqs: 1,
            ..cfg(256, 512)
        },
    )
    .unwrap();
    let (tx0, mut rx0) = mpsc::unbounded_channel();
    let low = RequestSpec {
        priority: 5,
        ..greedy(ps[0].clone(), 48)
    };
    core.submit(RequestId(0), low, tx0).unwrap();
    for _ in 0..4 {
        core.step().unwrap();
    }
    let (tx1, mut rx1) = mpsc::unbounded_channel();
    let high = RequestSpec {
        priority: -1,
        ..greedy(ps[1].clone(), 4)
    };
    core.submit(RequestId(1), high, tx1).unwrap();
    let mut order = Vec::new();
    let (mut out0, mut out1) = (Vec::new(), Vec::new());
    while core.has_work() {
        core.step().unwrap();
        core.cache().check_invariants().unwrap();
        for (i, rx, out) in [(0, &mut rx0, &mut out0), (1, &mut rx1, &mut out1)] {
            while let Ok(ev) = rx.try_recv() {
                match ev {
                    EngineEvent::Token(t) => out.push((t.id, t.logprob.to_bits())),
                    EngineEvent::Finished { .. } => order.push(i),
                    EngineEvent::Error(e) => panic!("request {i}: {e}"),
                    _ => {}
                }
            }
        }
    }
    assert_eq!(order, [1, 0], "the more important request finishes first");
    assert!(core.stats().preemptions > 0, "{:?}", core.stats());
    assert_eq!(out0, want[0]);
    assert_eq!(out1, want[1]);
}

#[test]
fn choices_fork_after_the_prompt_and_sample_as_separate_seeded_requests() {
    let p = prompts(1, 0, 3).remove(0);
    let sampled = |n: usize, seed: u64| {
        let mut spec = greedy(p.clone(), 8);
        spec.sampling = SamplingParams {
            temperature: 1.0,
            seed: Some(seed),
            logprobs: true,
            ..Default::default()
        };
        spec.n = n;
        spec
    };
    let mut core = EngineCore::new(model(), cfg(256, 512)).unwrap();
    let forked = run(&mut core, vec![sampled(3, 100)]);
    assert_eq!(
        core.stats().prefill_tokens,
        p.len() as u64,
        "the prompt is computed once"
    );
    for choice in 0..3u32 {
        let mut alone_core = EngineCore::new(model(), cfg(256, 512)).unwrap();
        let single = run(&mut alone_core, vec![sampled(1, 100 + choice as u64)]);
        assert_eq!(forked[&(0, choice)], single[&(0, 0)], "choice {choice}");
    }
}

/// Random submissions, cancellations (by dropping the receiver and by `cancel`), a pool small
/// enough to preempt, and a RAM tier that fails and corrupts at random: the cache's invariants
/// hold after every step, every request ends exactly once, and no block stays in use.
#[test]
fn random_submit_cancel_preempt_and_tier_faults_keep_the_invariants() {
    let (mut preemptions, mut tier_loads, mut tier_faults) = (0, 0, 0);
    for seed in 0..6u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let store = Arc::new(FaultStore::new(RamStore::new(RamConfig {
            max_bytes: 1 << 22,
            compression: Compression::None,
        })));
        let stores: Vec<Arc<dyn TierStore>> = vec![store.clone()];
        let mut core = EngineCore::with_tier_stores(model(), cfg(24, 32), stores).unwrap();
        let ps = prompts(40, 12, seed);
        let mut live: HashMap<u64, mpsc::UnboundedReceiver<EngineEvent>> = HashMap::new();
        let mut ended: HashMap<u64, FinishReason> = HashMap::new();
        let mut next = 0u64;
        for _ in 0..600 {
            if next < ps.len() as u64 && rng.gen_bool(0.3) {
                let (tx, rx) = mpsc::unbounded_channel();
                let p = ps[next as usize].clone();
                let spec = greedy(p, rng.gen_range(1..30));
                core.submit(RequestId(next), spec, tx).unwrap();
                live.insert(next, rx);
                next += 1;
            }
            match rng.gen_range(0..40) {
                0 => {
                    // The client went away: the engine notices at its next token.
                    if let Some(&id) = live.keys().next() {
                        live.remove(&id);
                        ended.insert(id, FinishReason::Cancelled);
                    }
                }
                1 => {
                    if let Some(&id) = live.keys().next() {
                        core.cancel(RequestId(id));
                        live.remove(&id);
                        ended.insert(id, FinishReason::Cancelled);
                    }
                }
                2 => store.set_failing(rng.gen_bool(0.5)),
                3 => store.set_corrupt_reads(rng.gen_bool(0.5)),
                _ => {}
            }
            if core.has_work() {
                core.step().unwrap();
            }
            core.cache().check_invariants().unwrap();
            for (&id, rx) in live.iter_mut() {
                while let Ok(ev) = rx.try_recv() {
                    match ev {
                        EngineEvent::Finished { reason, .. } => {
                            assert!(
                                ended.insert(id, reason).is_none(),
                                "request {id} ended twice"
                            );
                        }
                        EngineEvent::Error(e) => panic!("request {id}: {e}"),
                        _ => {}
                    }
                }
            }
            live.retain(|id, _| !ended.contains_key(id));
        }
        store.set_failing(false);
        store.set_corrupt_reads(false);
        while core.has_work() {
            core.step().unwrap();
            core.cache().check_invariants().unwrap();
        }
        for (id, mut rx) in live {
            let mut finished = false;
            while let Ok(ev) = rx.try_recv() {
                finished |= matches!(ev, EngineEvent::Finished { .. });
            }
            assert!(finished, "seed {seed}: request {id} never finished");
        }
        assert_eq!(core.cache().usage().in_use, 0, "seed {seed}");
        assert_eq!(core.num_waiting() + core.num_running(), 0);
        preemptions += core.stats().preemptions;
        let t = &core.snapshot().tiers.tiers[0].engine;
        tier_loads += t.loaded_blocks;
        tier_faults += t.errors + t.rejected;
    }
    // The drive reached what it is meant to exercise.
    assert!(preemptions > 0, "no preemption");
    assert!(tier_loads > 0, "no tier load");
    assert!(tier_faults > 0, "no tier fault");
}

/// A store whose every call blocks until [`FrozenStore::thaw`] (a redis-server stopped with
/// SIGSTOP); its counters still answer.
#[derive(Default)]
struct FrozenStore {
    thawed: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

impl FrozenStore {
    fn block(&self) {
        let mut thawed = self.thawed.lock().unwrap();
        while !*thawed {
            thawed = self.cv.wait(thawed).unwrap();
        }
    }

    fn thaw(&self) {
        *self.thawed.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

impl TierStore for FrozenStore {
    fn kind(&self) -> tier::TierKind {
        tier::TierKind::Redis
    }
    fn contains_prefix(&self, _: &[tier::TierKey]) -> Result<usize, tier::TierError> {
        self.block();
        Ok(0)
    }
    fn get_many(
        &self,
        keys: &[tier::TierKey],
    ) -> Result<Vec<Option<tier::StoredBlock>>, tier::TierError> {
        self.block();
        Ok(vec![None; keys.len()])
    }
    fn put_many(&self, _: &[tier::BlockRef<'_>]) -> Result<(), tier::TierError> {
        self.block();
        Ok(())
    }
    fn remove(&self, _: &[tier::TierKey]) -> Result<(), tier::TierError> {
        self.block();
        Ok(())
    }
    fn stats(&self) -> tier::TierStats {
        tier::TierStats::default()
    }
}

/// F1 (frozen Redis froze the server): a tier that never answers delays each request by the
/// lookup timeout at most, the write queue stays bounded, and outputs are unchanged.
#[test]
fn f1_a_tier_that_never_answers_never_stalls_requests() {
    /// Thaws the store however the test ends, so the engine's tier threads can finish.
    struct Thaw(Arc<FrozenStore>);
    impl Drop for Thaw {
        fn drop(&mut self) {
            self.0.thaw();
        }
    }
    let store = Arc::new(FrozenStore::default());
    let mut c = cfg(256, 512);
    c.tiers.write_on_publish = true;
    c.tiers.lookup_timeout = std::time::Duration::from_millis(100);
    c.tiers.max_queued_write_bytes = 8 << 10;
    let stores: Vec<Arc<dyn TierStore>> = vec![store.clone()];
    let mut core = EngineCore::with_tier_stores(model(), c, stores).unwrap();
    let _thaw = Thaw(store.clone());
    let started = std::time::Instant::now();
    for (i, p) in prompts(4, 20, 5).iter().enumerate() {
        let got = run(&mut core, vec![greedy(p.clone(), 4)]);
        assert_eq!(got[&(0, 0)], alone(p, 4), "prompt {i}");
    }
    // A hang detector, not a performance bound: four lookups of 100 ms each fit easily.
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    let t = core.snapshot().tiers;
    assert!(t.lookup_timeouts >= 1, "{t:?}");
    assert!(t.dropped_writes > 0, "the write queue is bounded: {t:?}");
}

/// Allows only the tokens of lowercase ASCII letters; counts masks prepared ahead of sampling
/// and masks applied.
struct LettersOnly {
    prepared: Option<Vec<bool>>,
    counts: Arc<MaskCounts>,
}

#[derive(Default)]
struct MaskCounts {
    prepared_on_another_thread: std::sync::atomic::AtomicUsize,
    applied_prepared: std::sync::atomic::AtomicUsize,
    applied: std::sync::atomic::AtomicUsize,
}

fn allowed_letters() -> Vec<bool> {
    (0..model::testing::TINY_VOCAB as u32)
        .map(|id| (u32::from(b'a') + 3..=u32::from(b'z') + 3).contains(&id))
        .collect()
}

impl model::TokenConstraint for LettersOnly {
    fn prepare(&mut self) {
        if std::thread::current().name() != Some("agentkv-engine-test") {
            self.counts
                .prepared_on_another_thread
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.prepared = Some(allowed_letters());
    }

    fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), model::ConstraintError> {
        use std::sync::atomic::Ordering::Relaxed;
        self.counts.applied.fetch_add(1, Relaxed);
        let mask = match self.prepared.take() {
            Some(m) => {
                self.counts.applied_prepared.fetch_add(1, Relaxed);
                m
            }
            None => allowed_letters(),
        };
        for (l, ok) in logits.iter_mut().zip(mask) {
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn accept(&mut self, _: u32) {
        self.prepared = None;
    }
}

struct LettersFactory(Arc<MaskCounts>);

impl model::ConstraintFactory for LettersFactory {
    fn start(&self) -> Box<dyn model::TokenConstraint> {
        Box::new(LettersOnly {
            prepared: None,
            counts: self.0.clone(),
        })
    }
    fn describe(&self) -> String {
        "lowercase letters".into()
    }
}

/// Token masks of constrained requests are computed on another thread while the forward pass
/// runs, and used at sampling: every sampled token of a constrained request had its mask
/// prepared ahead, outputs obey the constraint, and unconstrained requests in the same batch are
/// unaffected.
#[test]
fn constraint_masks_are_computed_alongside_the_forward_pass() {
    let counts = Arc::new(MaskCounts::default());
    let spec = model::ConstraintSpec(Arc::new(LettersFactory(counts.clone())));
    let ps = prompts(3, 8, 9);
    let mut constrained = greedy(ps[0].clone(), 12);
    constrained.sampling.constraint = Some(spec);
    let specs = vec![
        constrained,
        greedy(ps[1].clone(), 12),
        greedy(ps[2].clone(), 12),
    ];
    let got = std::thread::Builder::new()
        .name("agentkv-engine-test".into())
        .spawn(move || {
            let mut core = EngineCore::new(model(), cfg(256, 16)).unwrap();
            run(&mut core, specs)
        })
        .unwrap()
        .join()
        .unwrap();
    let letters = allowed_letters();
    assert_eq!(got[&(0, 0)].len(), 12);
    assert!(got[&(0, 0)].iter().all(|(id, _)| letters[*id as usize]));
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(counts.applied.load(Relaxed), 12);
    assert_eq!(
        counts.applied_prepared.load(Relaxed),
        12,
        "every mask was prepared ahead"
    );
    assert_eq!(counts.prepared_on_another_thread.load(Relaxed), 12);
    for i in 1..3 {
        assert_eq!(got[&(i, 0)], alone(&ps[i], 12), "unconstrained request {i}");
    }
}

/// Runs one request to completion; returns its usage.
fn usage_of(core: &mut EngineCore, id: u64, spec: RequestSpec) -> engine::Usage {
    let (tx, mut rx) = mpsc::unbounded_channel();
    core.submit(RequestId(id), spec, tx).unwrap();
    while core.has_work() {
        core.step().unwrap();
        core.cache().check_invariants().unwrap();
    }
    let mut usage = None;
    while let Ok(ev) = rx.try_recv() {
        match ev {
            EngineEvent::Finished { usage: u, .. } => usage = Some(u),
            EngineEvent::Error(e) => panic!("request {id}: {e}"),
            _ => {}
        }
    }
    usage.expect("finished")
}

#[test]
fn a_retained_session_survives_a_flood_that_evicts_an_unretained_prefix() {
    // 32 blocks of 4 tokens; each prompt is 40 tokens (10 blocks), the flood 10× the pool.
    // Unnamed requests are plain LRU here (no inferred conversations).
    let mut c = cfg(32, 512);
    c.inferred_conversations = None;
    let mut core = EngineCore::new(model(), c).unwrap();
    let ps = prompts(44, 0, 7)
        .into_iter()
        .enumerate()
        .map(|(i, mut p)| {
            p.resize(40, 3 + i as u32);
            p
        })
        .collect::<Vec<_>>();
    let session = engine::Retention {
        session: cache::SessionId(42),
        ttl: std::time::Duration::from_secs(3600),
        priority: 0,
    };
    let retained = |p: &[u32]| RequestSpec {
        retention: Some(session.clone()),
        ..greedy(p.to_vec(), 4)
    };
    let first = usage_of(&mut core, 0, retained(&ps[0]));
    // 40 prompt + 3 written generated tokens: 10 full blocks, all new to the session.
    assert_eq!(first.retained_tokens, 40);
    let plain = usage_of(&mut core, 1, greedy(ps[1].clone(), 4));
    assert_eq!(plain.retained_tokens, 0);
    let info = core.session(cache::SessionId(42), false).unwrap().info;
    assert_eq!((info.tokens, info.blocks), (40, 10));
    assert_eq!(info.evicted.total(), 0);
    assert!(info.ttl_left > std::time::Duration::from_secs(3500));
    for (i, p) in ps[2..].iter().enumerate() {
        usage_of(&mut core, 10 + i as u64, greedy(p.clone(), 4));
    }
    let again = usage_of(&mut core, 100, retained(&ps[0]));
    assert_eq!(
        again.cached_tokens, 36,
        "the retained prefix is still cached"
    );
    assert_eq!(again.retained_tokens, 0, "nothing new to retain");
    let evicted = usage_of(&mut core, 101, greedy(ps[1].clone(), 4));
    assert_eq!(
        evicted.cached_tokens, 0,
        "the unretained prefix was evicted"
    );
    // Released: the session holds nothing and the flood now evicts its blocks too.
    let released = core.session(cache::SessionId(42), true).unwrap().info;
    assert_eq!(released.blocks, 10);
    assert!(core.session(cache::SessionId(42), false).is_none());
    assert_eq!(core.cache().usage().retained, 0);
    for (i, p) in ps[2..].iter().enumerate() {
        usage_of(&mut core, 200 + i as u64, greedy(p.clone(), 4));
    }
    let gone = usage_of(&mut core, 300, greedy(ps[0].clone(), 4));
    assert_eq!(gone.cached_tokens, 0);
}

#[test]
fn an_unnamed_conversation_survives_a_flood_and_yields_to_a_named_session() {
    // 32 blocks of 4 tokens, at most 16 retained; prompts of 40 tokens (10 blocks).
    let mut core = EngineCore::new(model(), cfg(32, 512)).unwrap();
    let ps = prompts(12, 0, 9)
        .into_iter()
        .enumerate()
        .map(|(i, mut p)| {
            p.resize(40, 3 + i as u32);
            p
        })
        .collect::<Vec<_>>();
    let (tx, mut rx) = mpsc::unbounded_channel();
    core.submit(RequestId(1), greedy(ps[0].clone(), 4), tx)
        .unwrap();
    while core.has_work() {
        core.step().unwrap();
    }
    let mut out = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        if let EngineEvent::Token(t) = ev {
            out.push(t.id);
        }
    }
    assert_eq!(core.stats().inferred_turns, 1);
    // A flood of other unnamed requests, 10× the pool: LRU alone would evict the first one.
    for (i, p) in ps[1..11].iter().enumerate() {
        usage_of(&mut core, 10 + i as u64, greedy(p.clone(), 4));
        core.cache().check_invariants().unwrap();
    }
    // The first agent's next call: its prompt and reply, then a tool result.
    let mut next = ps[0].clone();
    next.extend(&out);
    next.extend([77u32; 9]);
    let second = usage_of(&mut core, 100, greedy(next, 4));
    assert_eq!(
        second.cached_tokens, 40,
        "its retained prompt and reply blocks"
    );
    let stats = core.stats();
    assert_eq!(stats.inferred_continuations, 1, "{stats:?}");
    assert_eq!(stats.inferred_turns, 12);
    // A named session takes precedence over inferred retention when the cap is full.
    let retained = RequestSpec {
        retention: Some(engine::Retention {
            session: cache::SessionId(5),
            ttl: std::time::Duration::from_secs(3600),
            priority: 0,
        }),
        ..greedy(ps[11].clone(), 4)
    };
    let named = usage_of(&mut core, 200, retained);
    assert_eq!(named.retained_tokens, 40);
    assert!(core.stats().inferred_released_for_explicit >= 1);
    core.cache().check_invariants().unwrap();
}

/// A writer that keeps what the log subscriber writes.
#[derive(Clone, Default)]
struct LogBuffer(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Long prefills log their progress: a prompt of at least `LONG_PREFILL_TOKENS` computed in
/// chunks logs one line per chunk before the last; short prompts log nothing.
#[test]
fn long_prefills_log_progress_after_each_chunk() {
    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let long: Vec<u32> = (0..engine::LONG_PREFILL_TOKENS as u32 + 100)
        .map(|i| 3 + i % 256)
        .collect();
    tracing::subscriber::with_default(subscriber, || {
        let spec = TinyModelSpec {
            context_length: 4096,
            ..TinyModelSpec::default()
        };
        let m = Arc::new(tiny_model(&spec).unwrap());
        let mut core = EngineCore::new(m, cfg(1024, 512)).unwrap();
        run(&mut core, vec![greedy(long.clone(), 1)]);
        run(&mut core, vec![greedy(vec![3, 4, 5], 1)]);
    });
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("prefill progress"))
        .collect();
    // 2148 tokens in chunks of 512: four chunks end before the prompt does.
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[0].contains("computed=512") && lines[0].contains("prompt_tokens=2148"));
    assert!(lines[3].contains("computed=2048"), "{text}");
}

/// Where a session's blocks are now, tiers included (the loader thread answers).
fn located(core: &mut EngineCore, session: u64) -> engine::SessionInfo {
    let q = core
        .session(cache::SessionId(session), false)
        .expect("session retains something");
    let (tx, rx) = std::sync::mpsc::channel();
    core.locate_session(q, move |info| {
        let _ = tx.send(info);
    });
    rx.recv_timeout(std::time::Duration::from_secs(30))
        .expect("located")
}

/// Every kind of retention — a keyed session, a `cache_control` breakpoint inside the prompt and
/// a tool pause — loses its blocks to preemption under a flood of long generations in a small
/// pool, they are demoted to a RAM tier (the session reports them there), and each agent's next
/// call is looked up in the tier on submission (before admission), loads them back and
/// generates exactly (tokens and logprob bits) what a cold engine computes from scratch.
#[test]
fn all_retention_survives_preemption_and_comes_back_from_a_tier_identically() {
    let store = Arc::new(RamStore::new(RamConfig {
        max_bytes: 1 << 24,
        compression: Compression::None,
    }));
    let stores: Vec<Arc<dyn TierStore>> = vec![store];
    let mut c = cfg(32, 64);
    c.tiers.load_policy = engine::TierLoadPolicy::Always;
    c.tool_pause.min_ttl = std::time::Duration::from_secs(600);
    c.tool_pause.max_ttl = std::time::Duration::from_secs(600);
    let mut core = EngineCore::with_tier_stores(model(), c, stores).unwrap();
    let retain = |session: u64| engine::Retention {
        session: cache::SessionId(session),
        ttl: std::time::Duration::from_secs(3600),
        priority: 1,
    };
    let agents: Vec<Vec<u32>> = prompts(3, 0, 11)
        .into_iter()
        .enumerate()
        .map(|(i, mut p)| {
            p.resize(20, 7 + i as u32);
            p
        })
        .collect();
    // Call 1 of each agent: A keyed (session 1), B a breakpoint after 16 tokens (session 2),
    // C a tool pause on its prompt and output.
    let mut specs: Vec<RequestSpec> = agents.iter().map(|p| greedy(p.clone(), 4)).collect();
    specs[0].retention = Some(retain(1));
    specs[1].breakpoints = vec![engine::Breakpoint {
        retention: retain(2),
        prefix_tokens: 16,
    }];
    let first = run(&mut core, specs);
    let out = |i: usize| first[&(i, 0)].iter().map(|t| t.0).collect::<Vec<u32>>();
    let mut c_tokens = agents[2].clone();
    c_tokens.extend(out(2));
    let pause = core
        .tool_pause(Default::default(), &[], &c_tokens, 0)
        .expect("tool pause retained");
    let sessions = [1u64, 2, pause.session.0];
    let before: Vec<u32> = sessions
        .iter()
        .map(|&s| {
            core.session(cache::SessionId(s), false)
                .unwrap()
                .info
                .blocks
        })
        .collect();
    assert_eq!(
        before[..2],
        [5, 4],
        "A: 23 written tokens, B: its 16-token prefix"
    );
    assert_eq!(before[2], 5, "C: 24 tokens, the last one never written");

    // A flood of long generations that cannot all fit: preemption, and retained blocks go.
    let flood = prompts(4, 0, 12);
    let flood_out = run(
        &mut core,
        flood.iter().map(|p| greedy(p.clone(), 40)).collect(),
    );
    assert!(core.stats().preemptions > 0, "{:?}", core.stats());
    for (i, p) in flood.iter().enumerate() {
        assert_eq!(flood_out[&(i, 0)], alone(p, 40), "flood prompt {i}");
    }
    core.wait_for_demotions();
    for (&s, &had) in sessions.iter().zip(&before) {
        let info = located(&mut core, s);
        let in_ram: u32 = info.evicted.in_tiers.iter().map(|(_, n)| n).sum();
        assert!(in_ram > 0, "session {s}: {info:?}");
        assert_eq!(info.evicted.in_tiers[0].0, engine::TierKind::Ram);
        assert_eq!(info.evicted.lost, 0, "session {s}: {info:?}");
        assert_eq!(info.blocks + info.evicted.total(), had, "session {s}");
    }

    // Each agent's next call extends its last one.
    let loaded_before = core.snapshot().tiers.tiers[0].engine.loaded_blocks;
    for (i, p) in agents.iter().enumerate() {
        let mut next = p.clone();
        next.extend(out(i));
        next.extend([40 + i as u32; 6]);
        let prefetches = core.snapshot().tiers.prefetches;
        let (tx, mut rx) = mpsc::unbounded_channel();
        core.submit(RequestId(1000 + i as u64), greedy(next.clone(), 8), tx)
            .unwrap();
        assert_eq!(
            core.snapshot().tiers.prefetches,
            prefetches + 1,
            "agent {i}: the tier lookup starts on submission, ahead of admission"
        );
        while core.has_work() {
            core.step().unwrap();
            core.cache().check_invariants().unwrap();
        }
        let mut got = Vec::new();
        let mut cached = 0;
        while let Ok(ev) = rx.try_recv() {
            match ev {
                EngineEvent::Token(t) => got.push((t.id, t.logprob.to_bits())),
                EngineEvent::Finished { usage, .. } => cached = usage.cached_tokens,
                EngineEvent::Error(e) => panic!("agent {i}: {e}"),
                _ => {}
            }
        }
        assert_eq!(
            got,
            alone(&next, 8),
            "agent {i}: restored KV computes what recomputing does"
        );
        assert!(cached >= 16, "agent {i}: {cached} cached tokens");
    }
    assert!(
        core.snapshot().tiers.tiers[0].engine.loaded_blocks > loaded_before,
        "blocks came back from the tier"
    );
}

/// Blocks computed in the engine's default arithmetic (the
/// block-sum matmul order and the tiled attention at every depth) are keyed apart from blocks of
/// an engine that reproduces llama.cpp (`llama_cpp_prefill`: ggml's order, its per-row
/// attention), also for short prompts.
#[test]
fn the_arithmetic_is_part_of_the_cache_namespace() {
    let default_cfg = EngineConfig {
        llama_cpp_prefill: false,
        ..cfg(64, 64)
    };
    let default = EngineCore::new(model(), default_cfg).unwrap();
    let ggml = EngineCore::new(model(), cfg(64, 64)).unwrap();
    assert_eq!(ggml.numerics().matmul(), model::MatmulArith::InvariantGgml);
    let tenant = cache::TenantId(0);
    let short = 10;
    let own = model::PackedDef::invariant() == model::PackedDef::BlockSum;
    assert_eq!(
        own,
        model::AttnArith::invariant() == model::AttnArith::Tiled
    );
    assert_eq!(
        default.namespace_for(tenant, b"", short) != ggml.namespace_for(tenant, b"", short),
        own
    );
    assert_eq!(
        default.namespace_for(tenant, b"", short),
        default.namespace(tenant, b"")
    );
}
