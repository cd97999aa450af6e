//! Tier I/O benchmark: demote (put) 256 blocks and restore a 4K-token prefix (get_prefix of 256
//! blocks of 16 tokens, 92 KiB each) from every store, with 1000 blocks resident. Also prints the
//! compression ratio of synthetic f16 KV data (Gaussian values, log-normal per-channel scales,
//! a few outlier channels) under LZ4 and byte-shuffled LZ4.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tier::object::{encode, BlockRef};
use tier::testing::{hash32, RedisServer};
use tier::{
    Compression, DiskConfig, DiskStore, RamConfig, RamStore, RedisConfig, RedisStore, TierKey,
    TierStore,
};

const BLOCK_PAYLOAD_BYTES: usize = 92 * 1024;
const RESIDENT_BLOCKS: u64 = 1000;
const PREFIX_BLOCKS: u64 = 256; // 4096 tokens / 16 tokens per block

/// One block of f16 K/V values: [values] with per-channel scale (64 channels, head_dim).
fn f16_kv_block(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let head_dim = 64;
    let scales: Vec<f32> = (0..head_dim)
        .map(|c| {
            let outlier = if c % 29 == 0 { 8.0 } else { 1.0 };
            outlier * (rng.gen_range(-1.0f32..1.0)).exp()
        })
        .collect();
    let mut out = Vec::with_capacity(BLOCK_PAYLOAD_BYTES);
    let mut channel = 0;
    while out.len() < BLOCK_PAYLOAD_BYTES {
        // Box–Muller standard normal.
        let (u1, u2): (f32, f32) = (rng.gen_range(1e-7..1.0), rng.gen_range(0.0..1.0));
        let z = (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos();
        let value = half::f16::from_f32(z * scales[channel]);
        out.extend_from_slice(&value.to_le_bytes());
        channel = (channel + 1) % head_dim;
    }
    out
}

fn key(i: u64) -> TierKey {
    TierKey::new(hash32("bench-ns", 0), hash32("bench-chain", i))
}

fn report_compression(blocks: &[Vec<u8>]) {
    for compression in [Compression::Lz4, Compression::Lz4Shuffle16] {
        let (mut raw, mut stored) = (0usize, 0usize);
        for (i, payload) in blocks.iter().enumerate().take(64) {
            let block = BlockRef {
                key: key(i as u64),
                num_tokens: 16,
                codec_id: "f16",
                payload,
            };
            raw += payload.len();
            stored += encode(&block, compression, None).expect("encode").len();
        }
        eprintln!(
            "compression {compression:?} on synthetic f16 KV: {:.3} (stored/raw)",
            stored as f64 / raw as f64
        );
    }
}

fn bench_store(c: &mut Criterion, name: &str, store: &dyn TierStore, blocks: &[Vec<u8>]) {
    let refs: Vec<BlockRef<'_>> = blocks
        .iter()
        .enumerate()
        .map(|(i, payload)| BlockRef {
            key: key(i as u64),
            num_tokens: 16,
            codec_id: "f16",
            payload,
        })
        .collect();
    for chunk in refs.chunks(64) {
        store.put_many(chunk).expect("populate");
    }
    let prefix: Vec<TierKey> = (0..PREFIX_BLOCKS).map(key).collect();
    let mut group = c.benchmark_group(name);
    group.sample_size(10);
    group.throughput(Throughput::Bytes(
        PREFIX_BLOCKS * BLOCK_PAYLOAD_BYTES as u64,
    ));
    group.bench_function("restore_4k_prefix_256_blocks", |b| {
        b.iter(|| {
            let got = store.get_prefix(&prefix).expect("get");
            assert_eq!(got.len(), PREFIX_BLOCKS as usize);
            got
        })
    });
    let demote = &refs[RESIDENT_BLOCKS as usize - PREFIX_BLOCKS as usize..];
    group.bench_function("demote_256_blocks", |b| {
        b.iter_batched(
            || (),
            |()| store.put_many(demote).expect("put"),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn tiers(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let blocks: Vec<Vec<u8>> = (0..RESIDENT_BLOCKS)
        .map(|_| f16_kv_block(&mut rng))
        .collect();
    report_compression(&blocks);
    let budget = 2 * RESIDENT_BLOCKS * BLOCK_PAYLOAD_BYTES as u64;

    for compression in [Compression::None, Compression::Lz4Shuffle16] {
        let ram = RamStore::new(RamConfig {
            max_bytes: budget,
            compression,
        });
        bench_store(c, &format!("ram_{compression:?}"), &ram, &blocks);
    }
    for fsync in [true, false] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = DiskConfig::new(dir.path(), budget);
        config.fsync = fsync;
        let disk = DiskStore::open(config).expect("disk");
        bench_store(c, &format!("disk_fsync_{fsync}"), &disk, &blocks);
    }
    match RedisServer::start() {
        Ok(server) => {
            let redis = RedisStore::open(RedisConfig::single(server.url())).expect("redis");
            bench_store(c, "redis", &redis, &blocks);
        }
        Err(e) => eprintln!("skipping redis bench: {e}"),
    }
}

criterion_group!(benches, tiers);
criterion_main!(benches);
