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

/// Every call against a hung server fails within `limit` with a typed error.
fn fails_fast<T: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    op: impl FnOnce() -> Result<T, TierError>,
) -> TierError {
    let start = Instant::now();
    let r = op();
    let took = start.elapsed();
    assert!(took < limit, "{what}: took {took:?} against a hung server");
    match r {
        Ok(v) => panic!("{what}: a hung server answered {v:?}"),
        Err(e @ (TierError::Timeout { .. } | TierError::Unavailable { .. })) => e,
        Err(e) => panic!("{what}: expected Timeout or Unavailable, got {e:?}"),
    }
}

fn quick_config(url: String) -> RedisConfig {
    let mut c = RedisConfig::single(url);
    c.connect_timeout = Duration::from_millis(300);
    c.io_timeout = Duration::from_millis(300);
    c.retry_backoff = Duration::from_millis(400);
    c
}

#[test]
fn f1_frozen_redis_server_fails_fast_with_a_typed_error() {
    let server = RedisServer::start().unwrap();
    // db 3 in the URL: the SELECT is ours, under the timeouts.
    let url = format!("{}/3", server.url());
    let store = RedisStore::open(quick_config(url.clone())).unwrap();
    put(&store, 1).unwrap();
    assert_eq!(store.contains_prefix(&[key(1)]).unwrap(), 1);
    let limit = Duration::from_secs(2);

    server.freeze();
    // A pooled connection: the read times out.
    let e = fails_fast("pooled get", limit, || store.get_many(&[key(1)]));
    assert!(
        matches!(e, TierError::Timeout { store: "redis", .. }),
        "{e:?}"
    );
    // Backed off: answered at once without I/O.
    fails_fast("backed off", Duration::from_millis(50), || {
        store.contains_prefix(&[key(1)])
    });
    // After the back-off, a new connection: the kernel accepts it, nothing answers.
    std::thread::sleep(Duration::from_millis(450));
    let e = fails_fast("fresh connection", limit, || put(&store, 2));
    assert!(matches!(e, TierError::Timeout { .. }), "{e:?}");
    // A store that never talked to it before, with and without a db to select.
    for u in [url.clone(), server.url()] {
        let fresh = RedisStore::open(quick_config(u)).unwrap();
        fails_fast("new store", limit, || fresh.contains_prefix(&[key(1)]));
        fails_fast("new store remove", limit, || fresh.remove(&[key(1)]));
    }
    assert!(store.stats().errors >= 3);

    server.thaw();
    std::thread::sleep(Duration::from_millis(450));
    assert_eq!(store.contains_prefix(&[key(1)]).unwrap(), 1);
    put(&store, 3).unwrap();
    assert_eq!(store.get_many(&[key(3)]).unwrap().len(), 1);
}

#[test]
fn f1_a_store_that_never_answers_fails_fast() {
    // A listener nobody serves: connections complete in the kernel's backlog, then silence.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://127.0.0.1:{}", silent.local_addr().unwrap().port());
    let limit = Duration::from_secs(2);
    for u in [url.clone(), format!("{url}/2")] {
        let store = RedisStore::open(quick_config(u)).unwrap();
        let e = fails_fast("contains_prefix", limit, || {
            store.contains_prefix(&[key(1)])
        });
        assert!(matches!(e, TierError::Timeout { .. }), "{e:?}");
        fails_fast("get_many", limit, || store.get_many(&[key(1)]));
        std::thread::sleep(Duration::from_millis(450));
        fails_fast("put_many", limit, || put(&store, 1));
    }
    drop(silent);
}
