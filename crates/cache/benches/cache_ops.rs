//! Criterion benchmarks of the cache hot paths: longest-prefix lookup of an 8K-token prompt with
//! 100K cached blocks, and allocate/free throughput. Never asserts timings.

use std::hint::black_box;

use cache::{CacheConfig, KvCache, Namespace, TenantId, Tick};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const BLOCK_SIZE: usize = 16;
const PROMPT_TOKENS: usize = 8192;
const CACHED_BLOCKS: u32 = 100_000;

fn tokens(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed) % 49_152)
        .collect()
}

/// A cache whose 100K blocks are all published: many 8K-token chains (512 blocks each).
fn filled_cache() -> (KvCache, cache::NamespaceKey, Vec<u32>) {
    let ns = Namespace::for_tenant(TenantId(1)).key();
    let mut cache = KvCache::new(CacheConfig::new(CACHED_BLOCKS)).expect("valid config");
    let chains = CACHED_BLOCKS as usize / (PROMPT_TOKENS / BLOCK_SIZE);
    let mut target = Vec::new();
    for c in 0..chains {
        let prompt = tokens(c as u32, PROMPT_TOKENS);
        let seq = cache.create_empty_sequence(&ns);
        cache
            .append_tokens(seq, &prompt, Tick(c as u64))
            .expect("fits");
        cache
            .mark_written(seq, prompt.len(), Tick(c as u64))
            .expect("written");
        cache.free(seq, Tick(c as u64)).expect("live");
        if c == chains / 2 {
            target = prompt;
        }
    }
    (cache, ns, target)
}

fn lookup_8k(c: &mut Criterion) {
    let (mut cache, ns, prompt) = filled_cache();
    let mut group = c.benchmark_group("lookup");
    group.throughput(Throughput::Elements(PROMPT_TOKENS as u64));
    group.bench_function("peek_prefix_8k_tokens_100k_blocks", |b| {
        b.iter(|| black_box(cache.peek_prefix(&ns, black_box(&prompt))))
    });
    let mut tick = 1_000_000u64;
    group.bench_function("lookup_and_release_8k_tokens_100k_blocks", |b| {
        b.iter(|| {
            tick += 1;
            let m = cache.lookup(&ns, black_box(&prompt), Tick(tick));
            assert_eq!(m.num_cached_tokens(), PROMPT_TOKENS - BLOCK_SIZE);
            cache.release_match(m, Tick(tick)).expect("own match");
        })
    });
    group.finish();
}

fn alloc_free(c: &mut Criterion) {
    let ns = Namespace::for_tenant(TenantId(1)).key();
    let mut group = c.benchmark_group("alloc_free");
    // 64 sequences of 1024 tokens (64 blocks each) appended and freed, unpublished.
    group.throughput(Throughput::Elements(64 * 64));
    group.bench_function("append_free_4096_blocks_free_pool", |b| {
        let prompt = tokens(9, 1024);
        b.iter_batched(
            || KvCache::new(CacheConfig::new(8192)).expect("valid"),
            |mut cache| {
                let seqs: Vec<_> = (0..64)
                    .map(|_| {
                        let s = cache.create_empty_sequence(&ns);
                        cache.append_tokens(s, &prompt, Tick(1)).expect("fits");
                        s
                    })
                    .collect();
                for s in seqs {
                    cache.free(s, Tick(2)).expect("live");
                }
                cache
            },
            BatchSize::SmallInput,
        )
    });
    // Allocation that must evict: a full cache of published blocks, allocate 4096 by eviction.
    group.bench_function("allocate_4096_blocks_by_lru_eviction", |b| {
        b.iter_batched(
            || {
                let mut cache = KvCache::new(CacheConfig::new(8192)).expect("valid");
                for c in 0..8u32 {
                    let p = tokens(c, 1024 * 16);
                    let s = cache.create_empty_sequence(&ns);
                    cache
                        .append_tokens(s, &p, Tick(u64::from(c)))
                        .expect("fits");
                    cache
                        .mark_written(s, p.len(), Tick(u64::from(c)))
                        .expect("ok");
                    cache.free(s, Tick(u64::from(c))).expect("live");
                }
                cache
            },
            |mut cache| {
                let s = cache.create_empty_sequence(&ns);
                cache
                    .append_tokens(s, &tokens(99, 4096 * 16), Tick(100))
                    .expect("evicts");
                cache
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, lookup_8k, alloc_free);
criterion_main!(benches);
