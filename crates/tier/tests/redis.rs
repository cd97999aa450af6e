//! Redis-store specifics against a real `redis-server`: a down server errors quickly, is
//! counted and backed off, and the store recovers when it returns; two stores (two agentkv
//! servers) share objects; MAC secrets must match; TTL expires objects.

use std::time::{Duration, Instant};

use tier::testing::{hash32, payload, RedisServer};
use tier::{BlockRef, RedisConfig, RedisStore, TierError, TierKey, TierStore};

fn key(i: u64) -> TierKey {
    TierKey::new(hash32("redis-ns", 0), hash32("redis-chain", i))
}

fn put(store: &RedisStore, i: u64) -> Result<(), TierError> {
    let bytes = payload(i, 4096);
    store.put_many(&[BlockRef {
        key: key(i),
        num_tokens: 16,
        codec_id: "f16",
        payload: &bytes,
    }])
}

#[test]
fn down_server_fails_fast_backs_off_and_recovers() {
    let mut server = RedisServer::start().unwrap();
    let mut config = RedisConfig::single(server.url());
    config.retry_backoff = Duration::from_millis(300);
    let store = RedisStore::open(config).unwrap();
    put(&store, 1).unwrap();
    assert_eq!(store.contains_prefix(&[key(1)]).unwrap(), 1);

    server.stop();
    let start = Instant::now();
    assert!(
        store.get_many(&[key(1)]).is_err(),
        "pooled connection to a dead server"
    );
    assert!(matches!(
        store.get_many(&[key(1)]),
        Err(TierError::Unavailable { .. })
    ));
    assert!(put(&store, 2).is_err());
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "a down server must not stall the caller: {:?}",
        start.elapsed()
    );
    let stats = store.stats();
    assert_eq!(stats.errors, 3);
    assert_eq!(stats.misses, 2);

    server.restart().unwrap(); // empty: nothing persisted
    std::thread::sleep(Duration::from_millis(350));
    assert_eq!(store.get_many(&[key(1)]).unwrap(), vec![None]);
    put(&store, 3).unwrap();
    assert_eq!(store.contains_prefix(&[key(3)]).unwrap(), 1);
}

#[test]
fn never_started_server_is_an_error_not_a_hang() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    drop(server);
    let store = RedisStore::open(RedisConfig::single(url)).unwrap();
    let start = Instant::now();
    assert!(store.contains_prefix(&[key(1)]).is_err());
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(store.stats().errors, 1);
}

#[test]
fn two_stores_share_one_redis() {
    let server = RedisServer::start().unwrap();
    let a = RedisStore::open(RedisConfig::single(server.url())).unwrap();
    let b = RedisStore::open(RedisConfig::single(server.url())).unwrap();
    put(&a, 7).unwrap();
    let got = b.get_prefix(&[key(7)]).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, payload(7, 4096));
    assert_eq!((b.stats().hits, a.stats().puts), (1, 1));
}

#[test]
fn objects_need_the_same_secret() {
    let server = RedisServer::start().unwrap();
    let with = |secret: Option<&[u8]>| {
        let mut c = RedisConfig::single(server.url());
        c.secret = secret.map(<[u8]>::to_vec);
        RedisStore::open(c).unwrap()
    };
    let signed = with(Some(b"secret one"));
    put(&signed, 1).unwrap();
    // Positive control: the same secret reads it.
    assert!(with(Some(b"secret one")).get_many(&[key(1)]).unwrap()[0].is_some());
    let other = with(Some(b"secret two"));
    assert!(other.get_many(&[key(1)]).unwrap()[0].is_none());
    assert_eq!(other.stats().corrupt, 1);
    // An unauthenticated writer cannot inject into a secret-protected cache.
    let plain = with(None);
    put(&plain, 2).unwrap();
    assert!(signed.get_many(&[key(2)]).unwrap()[0].is_none());
    assert_eq!(signed.stats().corrupt, 1);
}

#[test]
fn ttl_expires_objects() {
    let server = RedisServer::start().unwrap();
    let mut config = RedisConfig::single(server.url());
    config.ttl = Some(Duration::from_millis(200));
    let store = RedisStore::open(config).unwrap();
    put(&store, 1).unwrap();
    assert_eq!(store.contains_prefix(&[key(1)]).unwrap(), 1);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(store.contains_prefix(&[key(1)]).unwrap(), 0);
}

#[test]
fn server_side_maxmemory_bounds_the_tier() {
    let server =
        RedisServer::start_with_args(&["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"])
            .unwrap();
    let store = RedisStore::open(RedisConfig::single(server.url())).unwrap();
    for i in 0..2000 {
        put(&store, i).unwrap(); // 8 MB of objects into 4 MB
    }
    // Newest first, alone: a large pipelined reply itself uses server memory and can evict.
    assert!(
        store.get_many(&[key(1999)]).unwrap()[0].is_some(),
        "newest object evicted"
    );
    let mut present = 0;
    for chunk in (0..2000).map(key).collect::<Vec<_>>().chunks(20) {
        present += store.get_many(chunk).unwrap().iter().flatten().count();
    }
    assert!(present < 2000, "server evicted nothing");
    assert_eq!(store.stats().corrupt, 0);
}

#[test]
fn bad_config_is_rejected() {
    let mut c = RedisConfig::single("redis://127.0.0.1:1");
    c.urls.push("redis://127.0.0.1:2".into());
    assert!(matches!(RedisStore::open(c), Err(TierError::Config(_))));
    assert!(matches!(
        RedisStore::open(RedisConfig::single("not a url")),
        Err(TierError::Config(_))
    ));
}
