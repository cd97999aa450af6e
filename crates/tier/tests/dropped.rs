//! `TierStore::take_dropped`: what a store dropped on its own — RAM and disk objects evicted for
//! the byte budget, Redis objects whose TTL ran out — is reported once, in order, and never
//! what the caller removed itself (the engine announces these as router `BlockRemoved` events).

use std::time::Duration;

use tier::testing::{hash32, payload, RedisServer};
use tier::{
    BlockRef, Compression, DiskConfig, DiskStore, RamConfig, RamStore, RedisConfig, RedisStore,
    TierKey, TierStore,
};

fn key(i: u64) -> TierKey {
    TierKey::new(hash32("dropped-ns", 0), hash32("dropped-chain", i))
}

fn put(store: &dyn TierStore, i: u64) {
    let bytes = payload(i, 4096);
    store
        .put_many(&[BlockRef {
            key: key(i),
            num_tokens: 16,
            codec_id: "f16",
            payload: &bytes,
        }])
        .unwrap();
}

/// Puts 0..6 into a store holding about three objects, then removes the newest itself.
fn budget_evictions_are_reported(store: &dyn TierStore) {
    for i in 0..6 {
        put(store, i);
    }
    store.remove(&[key(5)]).unwrap();
    let dropped = store.take_dropped();
    assert_eq!(dropped, vec![key(0), key(1), key(2)], "{:?}", store.kind());
    for k in &dropped {
        assert_eq!(store.contains_prefix(&[*k]).unwrap(), 0);
    }
    assert!(store.take_dropped().is_empty(), "reported once");
}

#[test]
fn ram_and_disk_report_their_budget_evictions() {
    // An object is 4096 payload bytes plus a header: three fit in 14,000 bytes, four do not.
    budget_evictions_are_reported(&RamStore::new(RamConfig {
        max_bytes: 14_000,
        compression: Compression::None,
    }));
    let dir = tempfile::tempdir().unwrap();
    let mut config = DiskConfig::new(dir.path(), 14_000);
    config.fsync = false;
    budget_evictions_are_reported(&DiskStore::open(config).unwrap());
}

#[test]
fn redis_reports_objects_once_their_ttl_ran_out() {
    let server = RedisServer::start().unwrap();
    let mut config = RedisConfig::single(server.url());
    config.ttl = Some(Duration::from_millis(300));
    let store = RedisStore::open(config).unwrap();
    put(&store, 1);
    put(&store, 2);
    put(&store, 3);
    store.remove(&[key(3)]).unwrap();
    assert!(store.take_dropped().is_empty(), "nothing expired yet");
    std::thread::sleep(Duration::from_millis(150));
    put(&store, 2); // rewritten: its TTL starts again
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(store.take_dropped(), vec![key(1)]);
    assert_eq!(
        store.contains_prefix(&[key(1)]).unwrap(),
        0,
        "Redis expired it"
    );
    assert_eq!(store.contains_prefix(&[key(2)]).unwrap(), 1, "still alive");
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(store.take_dropped(), vec![key(2)]);
    assert_eq!(store.contains_prefix(&[key(2)]).unwrap(), 0);
    assert!(store.take_dropped().is_empty());
}
