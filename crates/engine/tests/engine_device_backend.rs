//! The engine over a device backend (`model::GpuBackend`) whose K/V pool lives in the device's
//! memory — here `HostOps`, each CUDA kernel's definition on the CPU, so the engine's GPU path
//! (block tables handed to the device's attention, copy-on-write, tier demotion and loading
//! through device memory) runs in every test run; on a GPU only the kernels differ, and
//! `agentkv gpu-check` holds those to the same definitions. Tiny random models (F32 weights),
//! so the device and the CPU compute nearly the same numbers.

use std::collections::HashMap;
use std::sync::Arc;

use cuda::ops::HostOps;
use engine::{EngineConfig, EngineCore, EngineEvent, RequestId, RequestSpec};
use model::testing::{tiny_model, TinyArch, TinyModelSpec};
use model::{GpuBackend, Model};
use rand::{Rng, SeedableRng};
use tier::{Compression, RamConfig, RamStore, TierStore};
use tokio::sync::mpsc;

fn llama() -> Arc<Model> {
    Arc::new(tiny_model(&TinyModelSpec::default()).unwrap())
}

fn gemma3() -> Arc<Model> {
    Arc::new(
        tiny_model(&TinyModelSpec {
            num_layers: 4,
            arch: TinyArch::Gemma3 {
                window: 8,
                pattern: 3,
            },
            ..TinyModelSpec::default()
        })
        .unwrap(),
    )
}

fn prompts(n: usize, shared: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let common: Vec<u32> = (0..shared).map(|_| rng.gen_range(3..259)).collect();
    (0..n)
        .map(|_| {
            let mut p = common.clone();
            p.extend((0..rng.gen_range(1..30)).map(|_| rng.gen_range(3..259u32)));
            p
        })
        .collect()
}

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
        ..Default::default()
    }
}

fn device_core(m: &Model, c: EngineConfig, stores: Vec<Arc<dyn TierStore>>) -> EngineCore {
    let backend = GpuBackend::new(Arc::new(HostOps), m).unwrap();
    EngineCore::with_backend(Box::new(backend), c, stores).unwrap()
}

/// (token id, logprob) of every choice, by (request, choice).
type Outputs = HashMap<(usize, u32), Vec<(u32, f32)>>;

fn run(core: &mut EngineCore, specs: Vec<RequestSpec>) -> Outputs {
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
                    .push((t.id, t.logprob)),
                EngineEvent::Error(e) => panic!("request {i}: {e}"),
                _ => {}
            }
        }
    }
    outs
}

fn ids(out: &[(u32, f32)]) -> Vec<u32> {
    out.iter().map(|t| t.0).collect()
}

/// Each prompt alone on the device engine and on the CPU engine: the same greedy tokens,
/// log-probabilities within float rounding.
fn check_against_cpu(m: Arc<Model>) {
    for (i, p) in prompts(5, 10, 3).into_iter().enumerate() {
        let mut dev = device_core(&m, cfg(128, 256), Vec::new());
        let got = run(&mut dev, vec![greedy(p.clone(), 12)])
            .remove(&(0, 0))
            .unwrap();
        let mut cpu = EngineCore::new(m.clone(), cfg(128, 256)).unwrap();
        let want = run(&mut cpu, vec![greedy(p, 12)]).remove(&(0, 0)).unwrap();
        assert_eq!(ids(&got), ids(&want), "prompt {i}");
        for (g, w) in got.iter().zip(&want) {
            assert!((g.1 - w.1).abs() < 1e-3, "prompt {i}: {} vs {}", g.1, w.1);
        }
    }
}

#[test]
fn the_device_engine_follows_the_cpu_engine_on_a_tiny_llama() {
    check_against_cpu(llama());
}

#[test]
fn the_device_engine_follows_the_cpu_engine_with_sliding_windows() {
    check_against_cpu(gemma3());
}

/// On the device, every prompt computes the same bits alone and together with the others, with
/// shared prefixes served from the cache and prefills cut into chunks.
#[test]
fn device_outputs_do_not_depend_on_batching_chunking_or_caching() {
    let m = llama();
    let ps = prompts(6, 17, 9);
    let alone: Vec<_> = ps
        .iter()
        .map(|p| {
            let mut core = device_core(&m, cfg(128, 256), Vec::new());
            run(&mut core, vec![greedy(p.clone(), 8)])
                .remove(&(0, 0))
                .unwrap()
        })
        .collect();
    for max_batch_tokens in [256, 7] {
        let mut core = device_core(&m, cfg(128, max_batch_tokens), Vec::new());
        assert_eq!(core.memory().place(), "device");
        // The second round finds every prompt's blocks in the cache.
        for round in 0..2 {
            let specs = ps.iter().map(|p| greedy(p.clone(), 8)).collect();
            let together = run(&mut core, specs);
            for (i, want) in alone.iter().enumerate() {
                let got = &together[&(i, 0)];
                let at = format!("prompt {i}, batch {max_batch_tokens}, round {round}");
                assert_eq!(ids(got), ids(want), "{at}");
                let bits = |o: &[(u32, f32)]| o.iter().map(|t| t.1.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(want), "{at}");
            }
        }
        assert!(
            core.snapshot().cache.lookup_hit_tokens > 0,
            "the prefixes were reused"
        );
    }
}

/// Blocks evicted from the device pool go to a RAM tier as the host pool's bytes and come back
/// into device memory: the second round loads them and decodes the same tokens; greedy forks
/// (copy-on-write of the partial last block on the device) decode what a single request does.
#[test]
fn device_blocks_round_trip_through_a_tier_and_fork() {
    let m = llama();
    let ps = prompts(6, 24, 5);
    let want: Vec<_> = ps
        .iter()
        .map(|p| {
            let mut core = device_core(&m, cfg(128, 256), Vec::new());
            run(&mut core, vec![greedy(p.clone(), 4)])
                .remove(&(0, 0))
                .unwrap()
        })
        .collect();
    let store = Arc::new(RamStore::new(RamConfig {
        max_bytes: 64 << 20,
        compression: Compression::None,
    }));
    let mut c = cfg(24, 64);
    c.tiers.load_policy = engine::TierLoadPolicy::Always;
    c.tiers.admission_wait = std::time::Duration::from_secs(600);
    let mut core = device_core(&m, c, vec![store as Arc<dyn TierStore>]);
    for round in 0..2 {
        let specs = ps.iter().map(|p| greedy(p.clone(), 4)).collect();
        let got = run(&mut core, specs);
        for (i, w) in want.iter().enumerate() {
            assert_eq!(ids(&got[&(i, 0)]), ids(w), "round {round}, prompt {i}");
        }
        core.wait_for_demotions();
    }
    assert!(
        core.snapshot().tiers.tiers[0].stats.hit_tokens > 0,
        "loaded from the tier"
    );
    let mut core = device_core(&m, cfg(128, 256), Vec::new());
    let mut spec = greedy(ps[0].clone(), 12);
    spec.n = 3;
    let forked = run(&mut core, vec![spec]);
    let mut single_core = device_core(&m, cfg(128, 256), Vec::new());
    let single = run(&mut single_core, vec![greedy(ps[0].clone(), 12)])
        .remove(&(0, 0))
        .unwrap();
    for choice in 0..3u32 {
        assert_eq!(ids(&forked[&(0, choice)]), ids(&single), "choice {choice}");
    }
}

#[test]
fn a_device_pool_in_another_codec_is_refused_at_start() {
    let m = llama();
    let backend = GpuBackend::new(Arc::new(HostOps), &m).unwrap();
    let c = EngineConfig {
        kv_dtype: model::KvDtype::parse("int8").unwrap(),
        ..cfg(32, 64)
    };
    let err = EngineCore::with_backend(Box::new(backend), c, Vec::new())
        .err()
        .expect("refused");
    assert!(err.to_string().contains("f16 only"), "{err}");
}
