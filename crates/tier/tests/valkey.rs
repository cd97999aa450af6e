//! The shared tier on Valkey (the Linux Foundation's fork of Redis; `valkey-server` 8 from
//! Debian bookworm-backports, installed by `scripts/test.sh`): the Redis store passes the
//! conformance suite against a real `valkey-server`, reports its TTL expiries, and works on a
//! three-master Valkey cluster (`valkey-cli --cluster create`) — a second store finds the first
//! one's blocks, and with one master killed lookups return within the timeouts and never return
//! a wrong block. Where `valkey-server` is not installed the test says SKIPPED and passes.

use std::process::Command;
use std::time::{Duration, Instant};

use tier::conformance::{self, Subject};
use tier::testing::{hash32, payload, RedisServer};
use tier::testing_cluster::RedisCluster;
use tier::{BlockRef, Compression, RedisConfig, RedisStore, TierKey, TierStore};

fn valkey_installed() -> bool {
    let found = Command::new("valkey-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!(
            "SKIPPED: valkey-server is not installed (scripts/test.sh installs it on Debian)"
        );
    }
    found
}

fn subject(edit: impl FnOnce(&mut RedisConfig)) -> Subject<RedisStore> {
    let server = RedisServer::start_binary("valkey-server", &[]).expect("valkey-server");
    let mut config = RedisConfig::single(server.url());
    edit(&mut config);
    Subject {
        store: RedisStore::open(config).expect("open"),
        budget_bytes: None,
        guard: Box::new(server),
    }
}

fn key(i: u64) -> TierKey {
    TierKey::new(hash32("valkey-ns", 0), hash32("valkey-chain", i))
}

#[test]
fn valkey_server_passes_the_conformance_suite_and_reports_ttl_expiry() {
    if !valkey_installed() {
        return;
    }
    type Check = fn(&Subject<RedisStore>);
    let checks: [Check; 6] = [
        conformance::round_trip,
        conformance::prefix_semantics,
        conformance::corruption_is_a_miss,
        conformance::foreign_object_is_a_miss,
        conformance::tenant_isolation,
        conformance::concurrent_access,
    ];
    // A fresh server per check, plain and with a MAC secret + TTL + LZ4, as for Redis.
    for check in checks {
        check(&subject(|_| {}));
        check(&subject(|c| {
            c.secret = Some(b"server secret".to_vec());
            c.ttl = Some(Duration::from_secs(600));
            c.compression = Compression::Lz4;
        }));
    }
    let s = subject(|c| c.ttl = Some(Duration::from_millis(200)));
    let bytes = payload(1, 4096);
    let block = BlockRef {
        key: key(1),
        num_tokens: 16,
        codec_id: "f16",
        payload: &bytes,
    };
    s.store.put_many(&[block]).unwrap();
    assert_eq!(s.store.contains_prefix(&[key(1)]).unwrap(), 1);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(s.store.take_dropped(), vec![key(1)]);
    assert_eq!(
        s.store.contains_prefix(&[key(1)]).unwrap(),
        0,
        "Valkey expired it"
    );
}

#[test]
fn a_three_master_valkey_cluster_shares_blocks_and_survives_a_dead_master() {
    if !valkey_installed() {
        return;
    }
    let mut cluster =
        RedisCluster::start_binary("valkey-server", "valkey-cli").expect("valkey cluster");
    let store = || {
        let mut cfg = RedisConfig::single(cluster.nodes[0].url());
        cfg.urls = cluster.urls();
        cfg.cluster = true;
        cfg.retry_backoff = Duration::from_millis(200);
        RedisStore::open(cfg).unwrap()
    };
    let n = 30u64;
    let payloads: Vec<Vec<u8>> = (0..n).map(|i| payload(i, 2048)).collect();
    let blocks: Vec<BlockRef<'_>> = (0..n)
        .map(|i| BlockRef {
            key: key(i),
            num_tokens: 16,
            codec_id: "f16",
            payload: &payloads[i as usize],
        })
        .collect();
    store().put_many(&blocks).unwrap();
    let sizes: Vec<u64> = (0..3).map(|i| cluster.dbsize(i)).collect();
    assert_eq!(sizes.iter().sum::<u64>(), n, "one key per block: {sizes:?}");
    assert!(
        sizes.iter().all(|&s| s > 0),
        "spread over masters: {sizes:?}"
    );
    let reader = store();
    let keys: Vec<TierKey> = (0..n).map(key).collect();
    let got = reader.get_many(&keys).unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.as_ref().unwrap().payload, payloads[i], "block {i}");
    }

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
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "a dead master stalled the store: {:?}",
        start.elapsed()
    );
    assert!(found > 0, "blocks on the live masters are still served");
    assert!(found < n, "the dead master's blocks are gone");
}
