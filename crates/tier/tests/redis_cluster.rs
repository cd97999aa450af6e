//! The Redis store on a real three-master Redis Cluster (three `redis-server --cluster-enabled
//! yes` on loopback, joined with `redis-cli --cluster create`): objects spread over the masters
//! (one key per block, so no operation spans slots), two stores share them, and when one master
//! dies the store answers within its timeouts — blocks on the live masters are still found, a
//! lookup stops at the first block it cannot read (the engine recomputes from there), nothing
//! hangs and nothing wrong is returned.

use std::time::{Duration, Instant};

use tier::testing::{hash32, payload};
use tier::testing_cluster::RedisCluster;
use tier::{BlockRef, RedisConfig, RedisStore, TierKey, TierStore};

fn key(i: u64) -> TierKey {
    TierKey::new(hash32("cluster-ns", 0), hash32("cluster-chain", i))
}

fn store(cluster: &RedisCluster) -> RedisStore {
    let mut cfg = RedisConfig::single(cluster.nodes[0].url());
    cfg.urls = cluster.urls();
    cfg.cluster = true;
    cfg.retry_backoff = Duration::from_millis(200);
    RedisStore::open(cfg).unwrap()
}

#[test]
fn a_three_master_cluster_shares_blocks_and_survives_a_dead_master() {
    let mut cluster = RedisCluster::start().expect("redis-server (CI installs it with apt)");
    let writer = store(&cluster);
    let n = 60u64;
    let payloads: Vec<Vec<u8>> = (0..n).map(|i| payload(i, 2048)).collect();
    let blocks: Vec<BlockRef<'_>> = (0..n)
        .map(|i| BlockRef {
            key: key(i),
            num_tokens: 16,
            codec_id: "f16",
            payload: &payloads[i as usize],
        })
        .collect();
    writer.put_many(&blocks).unwrap();
    let sizes: Vec<u64> = (0..3).map(|i| cluster.dbsize(i)).collect();
    assert_eq!(sizes.iter().sum::<u64>(), n, "one key per block: {sizes:?}");
    assert!(
        sizes.iter().all(|&s| s > 0),
        "spread over masters: {sizes:?}"
    );

    // A second store (another agentkv server) finds every block, bytes intact.
    let reader = store(&cluster);
    let keys: Vec<TierKey> = (0..n).map(key).collect();
    assert_eq!(reader.contains_prefix(&keys).unwrap(), n as usize);
    let got = reader.get_many(&keys).unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.as_ref().unwrap().payload, payloads[i], "block {i}");
    }

    // One master dies: calls return within the timeouts, never a wrong block.
    cluster.nodes[1].stop();
    std::thread::sleep(Duration::from_millis(1500)); // past cluster-node-timeout
    let start = Instant::now();
    let mut found = 0;
    for i in 0..n {
        if let Ok(v) = reader.get_many(&[key(i)]) {
            if let Some(b) = &v[0] {
                assert_eq!(b.payload, payloads[i as usize]);
                found += 1;
            }
        }
    }
    let prefix = reader.contains_prefix(&keys).unwrap_or(0);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "a dead master stalled the store: {:?}",
        start.elapsed()
    );
    assert!(found > 0, "blocks on the live masters are still served");
    assert!((found as u64) < n, "the dead master's blocks are gone");
    assert!(
        prefix < n as usize,
        "a lookup stops at the first lost block"
    );
}
