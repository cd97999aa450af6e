//! Storage tiers on the real default model: a prefix evicted from a small active pool is served
//! from host RAM, disk or Redis with output identical (token ids and logprob bits) to a
//! recompute with caching off; corrupt objects and a stopped Redis fall back to recomputing;
//! tenants never see each other's objects (positive control included); two engines share one
//! Redis; write-through fills every tier.

use std::sync::{Arc, OnceLock};

use cache::{NamespaceKey, TenantId};
use engine::{
    EngineConfig, EngineCore, EngineEvent, RequestId, RequestSpec, TierLoadPolicy, TieringConfig,
};
use model::Model;
use tier::testing::RedisServer;
use tier::{
    Compression, DiskConfig, DiskStore, FaultStore, RamConfig, RamStore, RawObjectAccess,
    RedisConfig, RedisStore, TierKey, TierStore,
};
use tokio::sync::mpsc;

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

const BLOCK_SIZE: usize = 16;
const PROMPT_TOKENS: usize = 100;
/// Full blocks a 100-token prompt can take from a cache (one token is always computed).
const CACHEABLE_TOKENS: usize = (PROMPT_TOKENS - 1) / BLOCK_SIZE * BLOCK_SIZE;
const MAX_TOKENS: usize = 6;
const A: u32 = 0;

/// A deterministic 100-token prompt; different `i` share no leading block.
fn prompt(i: u32) -> Vec<u32> {
    (0..PROMPT_TOKENS as u32)
        .map(|j| 1000 + (i * 7919 + j * 131 + j * j * 7) % 40_000)
        .collect()
}

/// Greedy ids with logprob bits, and the reported cached prompt tokens.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    tokens: Vec<(u32, u32)>,
    cached_tokens: usize,
}

/// A 24-block pool (five 7-block requests overflow it), tiers always loaded, admission waiting
/// for every tier lookup (scheduling independent of tier timing: deterministic).
/// A 24-block pool in which other prompts evict a prefix (to the tiers): no inferred
/// conversations, which would keep the first prompt's blocks retained in the pool instead.
fn cfg() -> EngineConfig {
    EngineConfig {
        num_blocks: 24,
        block_size: BLOCK_SIZE,
        threads: 2,
        inferred_conversations: None,
        tiers: TieringConfig {
            load_policy: TierLoadPolicy::Always,
            admission_wait: std::time::Duration::from_secs(600),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn request(core: &mut EngineCore, p: &[u32], tenant: u32) -> Outcome {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut spec = RequestSpec::greedy(p.to_vec(), MAX_TOKENS);
    spec.ignore_eos = true;
    spec.tenant = TenantId(tenant);
    spec.cache_salt = format!("salt-{tenant}").into_bytes();
    core.submit(RequestId(id), spec, tx).unwrap();
    while core.has_work() {
        core.step().unwrap();
        core.cache().check_invariants().unwrap();
    }
    let mut out = Outcome {
        tokens: Vec::new(),
        cached_tokens: usize::MAX,
    };
    while let Ok(ev) = rx.try_recv() {
        match ev {
            EngineEvent::Token(t) => out.tokens.push((t.id, t.logprob.to_bits())),
            EngineEvent::Finished { usage, .. } => out.cached_tokens = usage.cached_tokens,
            EngineEvent::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
    assert_eq!(out.tokens.len(), MAX_TOKENS);
    out
}

/// Output of prompt `i` computed from scratch (caching off, no tiers).
fn reference(i: u32) -> Vec<(u32, u32)> {
    let mut core = EngineCore::new(
        model(),
        EngineConfig {
            prefix_caching: false,
            ..cfg()
        },
    )
    .unwrap();
    request(&mut core, &prompt(i), 1).tokens
}

fn reference_a() -> Vec<(u32, u32)> {
    static R: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    R.get_or_init(|| reference(A)).clone()
}

/// Runs five other prompts so every block of the earlier ones leaves the 24-block pool.
fn flood(core: &mut EngineCore, first: u32) {
    for i in first..first + 5 {
        request(core, &prompt(i), 1);
    }
    // Demotion is asynchronous: tests that inspect or share the stores wait for it.
    core.wait_for_demotions();
}

/// The namespace of this file's 100-token prompts (which prefill like llama.cpp by default).
fn ns(core: &EngineCore, tenant: u32) -> NamespaceKey {
    core.namespace_for(
        TenantId(tenant),
        format!("salt-{tenant}").as_bytes(),
        PROMPT_TOKENS,
    )
}

/// Tier keys of the cacheable blocks of `p` for `tenant`.
fn tier_keys(core: &EngineCore, p: &[u32], tenant: u32) -> Vec<TierKey> {
    let ns = ns(core, tenant);
    cache::key::chain_keys(&ns, p, BLOCK_SIZE, CACHEABLE_TOKENS / BLOCK_SIZE)
        .iter()
        .map(|k| TierKey::new(ns.root().0, k.0))
        .collect()
}

/// Tokens the engine loaded from tier `i` so far.
fn tier_hit_tokens(core: &EngineCore, i: usize) -> u64 {
    core.snapshot().tiers.tiers[i].engine.hit_tokens
}

fn ram() -> Arc<RamStore> {
    Arc::new(RamStore::new(RamConfig {
        max_bytes: 256 << 20,
        compression: Compression::None,
    }))
}

fn disk(dir: &tempfile::TempDir) -> Arc<DiskStore> {
    let mut c = DiskConfig::new(dir.path(), 256 << 20);
    c.fsync = false;
    Arc::new(DiskStore::open(c).unwrap())
}

fn redis(server: &RedisServer) -> Arc<RedisStore> {
    Arc::new(RedisStore::open(RedisConfig::single(server.url())).unwrap())
}

/// The core scenario on one tier: A is computed, evicted by a flood, and re-requested by another
/// tenant (miss: isolation) and by its own tenant (served from the tier, identical output).
fn evicted_prefix_is_served_from(store: Arc<dyn TierStore>) {
    let mut core = EngineCore::with_tier_stores(model(), cfg(), vec![store.clone()]).unwrap();
    let a = prompt(A);
    let first = request(&mut core, &a, 1);
    assert_eq!(first.tokens, reference_a());
    assert_eq!(first.cached_tokens, 0);
    flood(&mut core, 100);
    assert_eq!(
        core.cache().peek_prefix(&ns(&core, 1), &a),
        0,
        "the flood evicted A from the active pool"
    );
    core.wait_for_demotions();
    let snap = core.snapshot();
    assert!(snap.tiers.tiers[0].engine.demoted_blocks >= 6);
    assert_eq!(
        store.contains_prefix(&tier_keys(&core, &a, 1)).unwrap(),
        6,
        "A's blocks were demoted"
    );

    // Another tenant: same tokens, different namespace → nothing from the tier.
    let other = request(&mut core, &a, 2);
    assert_eq!(
        other.cached_tokens, 0,
        "tenant 2 must not hit tenant 1's tier objects"
    );
    assert_eq!(tier_hit_tokens(&core, 0), 0);
    assert_eq!(
        other.tokens,
        reference_a(),
        "the model's output is tenant-independent"
    );

    // Positive control: the owner hits every cacheable block in the tier.
    let again = request(&mut core, &a, 1);
    assert_eq!(again.cached_tokens, CACHEABLE_TOKENS);
    assert_eq!(tier_hit_tokens(&core, 0), CACHEABLE_TOKENS as u64);
    assert_eq!(
        again.tokens,
        reference_a(),
        "loaded K/V gives identical output"
    );
    let snap = core.snapshot();
    assert!(snap.tiers.tiers[0].stats.hits >= 6);
    assert_eq!(snap.tiers.tiers[0].engine.loaded_blocks, 6);
    assert_eq!(snap.tiers.tiers[0].engine.errors, 0);
}

#[test]
fn ram_tier_serves_an_evicted_prefix_with_identical_output_per_tenant() {
    evicted_prefix_is_served_from(ram());
}

#[test]
fn disk_tier_serves_an_evicted_prefix_with_identical_output_per_tenant() {
    let dir = tempfile::tempdir().unwrap();
    evicted_prefix_is_served_from(disk(&dir));
}

#[test]
fn redis_tier_serves_an_evicted_prefix_with_identical_output_per_tenant() {
    let server = RedisServer::start().unwrap();
    evicted_prefix_is_served_from(redis(&server));
}

/// A is demoted, then every one of its objects gets one flipped byte at rest: the re-request
/// rejects them (counted corrupt), recomputes, and still matches the reference.
fn corrupt_objects_are_recomputed<S: TierStore + RawObjectAccess + 'static>(store: Arc<S>) {
    let mut core = EngineCore::with_tier_stores(model(), cfg(), vec![store.clone()]).unwrap();
    let a = prompt(A);
    request(&mut core, &a, 1);
    flood(&mut core, 200);
    let keys = tier_keys(&core, &a, 1);
    for key in &keys {
        let mut raw = store.read_raw(key).unwrap().expect("demoted object");
        let mid = raw.len() / 2;
        raw[mid] ^= 0x10;
        store.write_raw(key, &raw).unwrap();
    }
    let again = request(&mut core, &a, 1);
    assert_eq!(again.tokens, reference_a(), "recomputed output is correct");
    assert_eq!(again.cached_tokens, 0, "no corrupt block is used");
    assert_eq!(tier_hit_tokens(&core, 0), 0);
    assert!(core.snapshot().tiers.tiers[0].stats.corrupt >= 1);
}

#[test]
fn corrupt_objects_on_disk_are_recomputed_with_identical_output() {
    let dir = tempfile::tempdir().unwrap();
    corrupt_objects_are_recomputed(disk(&dir));
}

#[test]
fn corrupt_objects_in_redis_are_recomputed_with_identical_output() {
    let server = RedisServer::start().unwrap();
    corrupt_objects_are_recomputed(redis(&server));
}

#[test]
fn redis_stopped_mid_run_the_engine_keeps_serving() {
    let mut server = RedisServer::start().unwrap();
    let store = redis(&server);
    let mut core = EngineCore::with_tier_stores(model(), cfg(), vec![store]).unwrap();
    let a = prompt(A);
    request(&mut core, &a, 1);
    flood(&mut core, 300);
    server.stop();
    // Prefix lookups and demotions fail; requests are recomputed and keep being served.
    let again = request(&mut core, &a, 1);
    assert_eq!(again.tokens, reference_a());
    assert_eq!(again.cached_tokens, 0);
    flood(&mut core, 400);
    core.wait_for_demotions();
    let snap = core.snapshot();
    let t = &snap.tiers.tiers[0];
    assert!(t.engine.errors >= 1, "{t:?}");
    assert!(t.engine.demote_errors >= 1, "{t:?}");
    assert_eq!(core.cache().usage().in_use, 0);
}

#[test]
fn two_engines_sharing_one_redis_the_second_hits_the_first_prefix() {
    let server = RedisServer::start().unwrap();
    let mut first = EngineCore::with_tier_stores(model(), cfg(), vec![redis(&server)]).unwrap();
    let a = prompt(A);
    request(&mut first, &a, 1);
    flood(&mut first, 500);
    // A fresh engine (own pool, own connection) over the same Redis.
    let mut second = EngineCore::with_tier_stores(model(), cfg(), vec![redis(&server)]).unwrap();
    let other_tenant = request(&mut second, &a, 2);
    assert_eq!(
        other_tenant.cached_tokens, 0,
        "isolation holds across engines"
    );
    let hit = request(&mut second, &a, 1);
    assert_eq!(hit.cached_tokens, CACHEABLE_TOKENS);
    assert_eq!(tier_hit_tokens(&second, 0), CACHEABLE_TOKENS as u64);
    assert_eq!(hit.tokens, reference_a());
}

#[test]
fn write_through_fills_every_tier_and_a_lower_tier_serves_what_the_first_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (r, d) = (ram(), disk(&dir));
    let stores: Vec<Arc<dyn TierStore>> = vec![r.clone(), d.clone()];
    let mut core = EngineCore::with_tier_stores(
        model(),
        {
            let mut c = cfg();
            c.tiers.write_through = true;
            c
        },
        stores,
    )
    .unwrap();
    let a = prompt(A);
    request(&mut core, &a, 1);
    flood(&mut core, 600);
    let keys = tier_keys(&core, &a, 1);
    assert_eq!(r.contains_prefix(&keys).unwrap(), 6);
    assert_eq!(d.contains_prefix(&keys).unwrap(), 6);
    // The RAM tier loses A's last three blocks: the chain continues in the disk tier.
    r.remove(&keys[3..]).unwrap();
    let again = request(&mut core, &a, 1);
    assert_eq!(again.cached_tokens, CACHEABLE_TOKENS);
    assert_eq!(tier_hit_tokens(&core, 0), 3 * BLOCK_SIZE as u64);
    assert_eq!(tier_hit_tokens(&core, 1), 3 * BLOCK_SIZE as u64);
    assert_eq!(again.tokens, reference_a());
}

#[test]
fn the_cost_model_decides_and_counts_and_output_is_identical_either_way() {
    let mut core = EngineCore::with_tier_stores(
        model(),
        {
            let mut c = cfg();
            c.tiers.load_policy = TierLoadPolicy::CostModel;
            c
        },
        vec![ram() as Arc<dyn TierStore>],
    )
    .unwrap();
    let a = prompt(A);
    request(&mut core, &a, 1);
    flood(&mut core, 700);
    let again = request(&mut core, &a, 1);
    assert_eq!(again.tokens, reference_a());
    let snap = core.snapshot();
    let e = &snap.tiers.tiers[0].engine;
    assert_eq!(e.load_decisions + e.recompute_decisions, 1, "{e:?}");
    assert!(
        snap.tiers.prefill_tokens_per_s.is_some(),
        "prefill speed measured"
    );
    let want = if e.load_decisions == 1 {
        CACHEABLE_TOKENS
    } else {
        0
    };
    assert_eq!(again.cached_tokens, want);
}

#[test]
fn tiers_without_prefix_caching_are_a_config_error() {
    let err = EngineCore::with_tier_stores(
        model(),
        EngineConfig {
            prefix_caching: false,
            ..cfg()
        },
        vec![ram() as Arc<dyn TierStore>],
    );
    assert!(matches!(err, Err(engine::EngineBuildError::Config(_))));
}

#[test]
fn written_on_publish_a_second_engine_hits_a_prefix_the_first_still_holds() {
    let server = RedisServer::start().unwrap();
    let publish = || {
        let mut c = cfg();
        c.tiers.write_on_publish = true;
        c
    };
    let mut first = EngineCore::with_tier_stores(model(), publish(), vec![redis(&server)]).unwrap();
    let a = prompt(A);
    request(&mut first, &a, 1);
    first.wait_for_demotions();
    assert_eq!(
        first.cache().peek_prefix(&ns(&first, 1), &a),
        CACHEABLE_TOKENS,
        "the first engine still holds A (nothing was evicted)"
    );
    first.wait_for_demotions();
    let written = first.snapshot().tiers.tiers[0].engine.demoted_blocks;
    assert_eq!(written, (CACHEABLE_TOKENS / BLOCK_SIZE) as u64);
    let mut second =
        EngineCore::with_tier_stores(model(), publish(), vec![redis(&server)]).unwrap();
    let hit = request(&mut second, &a, 1);
    assert_eq!(hit.cached_tokens, CACHEABLE_TOKENS);
    assert_eq!(hit.tokens, reference_a());
    // Blocks loaded from the tier are not written back; evictions write nothing more.
    flood(&mut second, 800);
    second.wait_for_demotions();
    let snap = second.snapshot();
    let t = &snap.tiers.tiers[0].engine;
    assert_eq!(t.hit_tokens, CACHEABLE_TOKENS as u64);
    assert_eq!(
        t.demoted_blocks,
        5 * (CACHEABLE_TOKENS / BLOCK_SIZE) as u64,
        "only the flood's own blocks were written, once each"
    );
}

#[test]
fn a_slow_tier_load_never_stalls_other_requests() {
    let slow = Arc::new(FaultStore::new(RamStore::new(RamConfig {
        max_bytes: 256 << 20,
        compression: Compression::None,
    })));
    // The default admission wait (2 ms): a slow lookup defers its request, not the batch.
    let mut async_cfg = cfg();
    async_cfg.tiers.admission_wait = engine::DEFAULT_ADMISSION_WAIT;
    let mut core =
        EngineCore::with_tier_stores(model(), async_cfg, vec![slow.clone() as Arc<dyn TierStore>])
            .unwrap();
    let a = prompt(A);
    request(&mut core, &a, 1);
    flood(&mut core, 900);
    // B decodes 40 tokens; A's tier load takes 400 ms per store call meanwhile.
    let (btx, mut brx) = mpsc::unbounded_channel();
    let mut spec_b = RequestSpec::greedy(prompt(950), 40);
    spec_b.ignore_eos = true;
    core.submit(RequestId(9_000_001), spec_b, btx).unwrap();
    while core.num_running() == 0 {
        core.step().unwrap();
    }
    slow.set_delay(std::time::Duration::from_millis(400));
    let (atx, mut arx) = mpsc::unbounded_channel();
    let mut spec_a = RequestSpec::greedy(a.clone(), MAX_TOKENS);
    spec_a.ignore_eos = true;
    spec_a.tenant = TenantId(1);
    spec_a.cache_salt = b"salt-1".to_vec();
    core.submit(RequestId(9_000_002), spec_a, atx).unwrap();
    let mut b_tokens_before_a_admitted = 0;
    let mut a_admitted = false;
    let mut a_out = Vec::new();
    let mut a_cached = None;
    while core.has_work() {
        core.step().unwrap();
        while let Ok(ev) = brx.try_recv() {
            if matches!(ev, EngineEvent::Token(_)) && !a_admitted {
                b_tokens_before_a_admitted += 1;
            }
        }
        while let Ok(ev) = arx.try_recv() {
            match ev {
                EngineEvent::Admitted { .. } => a_admitted = true,
                EngineEvent::Token(t) => a_out.push((t.id, t.logprob.to_bits())),
                EngineEvent::Finished { usage, .. } => a_cached = Some(usage.cached_tokens),
                EngineEvent::Error(e) => panic!("{e}"),
                _ => {}
            }
        }
    }
    slow.set_delay(std::time::Duration::ZERO);
    assert!(
        b_tokens_before_a_admitted >= 1,
        "B kept decoding while A's blocks were loading"
    );
    assert_eq!(
        a_cached,
        Some(CACHEABLE_TOKENS),
        "A was served from the tier"
    );
    assert_eq!(a_out, reference_a());
    assert!(core.snapshot().tiers.prefetches >= 1);
}

#[test]
fn preempted_requests_come_back_from_the_tier_with_identical_output() {
    // Six 100-token prompts generating 40 tokens each (9 blocks apiece) in a 24-block pool: three
    // are admitted and outgrow it, so the engine preempts; a preempted request's blocks are evicted and demoted while it waits, and
    // its re-admission loads them from the RAM tier instead of recomputing (swap to a tier).
    // Requests that prefill like llama.cpp (`llama_cpp_prefill` on, as for these 100-token
    // prompts) publish their prompt blocks only, so their generated blocks are recomputed, not
    // swapped: the swap is checked in the per-row arithmetic, identical output in both.
    let run = |stores: Vec<Arc<dyn TierStore>>, prefix_caching: bool, llama_cpp_prefill: bool| {
        let mut core = EngineCore::with_tier_stores(
            model(),
            EngineConfig {
                prefix_caching,
                llama_cpp_prefill,
                ..cfg()
            },
            stores,
        )
        .unwrap();
        let mut rxs = Vec::new();
        for i in 0..6u32 {
            let (tx, rx) = mpsc::unbounded_channel();
            let mut spec = RequestSpec::greedy(prompt(1000 + i), 40);
            spec.ignore_eos = true;
            core.submit(RequestId(u64::from(i) + 1), spec, tx).unwrap();
            rxs.push(rx);
        }
        while core.has_work() {
            core.step().unwrap();
            core.cache().check_invariants().unwrap();
        }
        let outs: Vec<Vec<(u32, u32)>> = rxs
            .iter_mut()
            .map(|rx| {
                let mut toks = Vec::new();
                while let Ok(ev) = rx.try_recv() {
                    if let EngineEvent::Token(t) = ev {
                        toks.push((t.id, t.logprob.to_bits()));
                    }
                }
                toks
            })
            .collect();
        (outs, core)
    };
    let (reference, _) = run(Vec::new(), false, true);
    let (outs, core) = run(vec![ram() as Arc<dyn TierStore>], true, true);
    assert!(core.stats().preemptions > 0);
    assert_eq!(outs, reference, "identical output after preemption");
    let (reference, _) = run(Vec::new(), false, false);
    let (outs, core) = run(vec![ram() as Arc<dyn TierStore>], true, false);
    assert!(
        core.stats().preemptions > 0,
        "the pool is too small: preemption"
    );
    assert_eq!(
        outs, reference,
        "identical output after preemption and tier loads"
    );
    let snap = core.snapshot();
    assert!(
        snap.tiers.tiers[0].engine.hit_tokens > 0,
        "re-admitted requests loaded their blocks from the tier: {:?}",
        snap.tiers
    );
    assert_eq!(core.cache().usage().in_use, 0);
}
