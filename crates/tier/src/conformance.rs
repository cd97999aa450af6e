//! The conformance suite every store passes: round trip, prefix semantics, budget eviction,
//! corruption and foreign objects (miss + `corrupt`), tenant isolation, two-thread access.
//! Each check is a function over any `TierStore + RawObjectAccess`; the
//! [`conformance_suite!`](crate::conformance_suite) macro turns them into `#[test]`s.
//! Test support only: checks panic (assert) on a contract violation.

use std::any::Any;

use crate::testing::{hash32, payload};
use crate::{BlockRef, RawObjectAccess, StoredBlock, TierKey, TierStore};

/// A store under test plus whatever must outlive it (temp dir, Redis server).
pub struct Subject<S> {
    /// The store (dropped before `guard`).
    pub store: S,
    /// The store's own byte budget, or `None` if it has none (Redis: the server evicts).
    pub budget_bytes: Option<u64>,
    /// Kept alive for the test's duration.
    pub guard: Box<dyn Any>,
}

/// Smallest budget the suite needs: the largest object it writes (92 KiB payload + header)
/// must fit several times.
pub const MIN_BUDGET_BYTES: u64 = 1 << 20;

const CODEC: &str = "f16";

fn key(ns: u64, chain: u64) -> TierKey {
    TierKey::new(hash32("ns", ns), hash32("chain", chain))
}

fn put(store: &dyn TierStore, key: TierKey, seed: u64, len: usize) -> Vec<u8> {
    let bytes = payload(seed, len);
    store
        .put_many(&[BlockRef {
            key,
            num_tokens: 16,
            codec_id: CODEC,
            payload: &bytes,
        }])
        .expect("put_many");
    bytes
}

fn get1(store: &dyn TierStore, key: TierKey) -> Option<StoredBlock> {
    store.get_many(&[key]).expect("get_many").pop().flatten()
}

/// Put blocks of several sizes (empty to one real 92 KiB block), read them back exactly, miss
/// an absent key, overwrite one, and check the counters.
pub fn round_trip<S: TierStore + RawObjectAccess>(s: &Subject<S>) {
    let store = &s.store;
    let sizes = [0usize, 1, 4096, 92 * 1024];
    let payloads: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| payload(i as u64, len))
        .collect();
    let blocks: Vec<BlockRef<'_>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| BlockRef {
            key: key(1, i as u64),
            num_tokens: i as u32 + 1,
            codec_id: CODEC,
            payload: p,
        })
        .collect();
    store.put_many(&blocks).expect("put_many");
    let mut keys: Vec<TierKey> = blocks.iter().map(|b| b.key).collect();
    keys.insert(2, key(1, 999));
    let got = store.get_many(&keys).expect("get_many");
    assert_eq!(got.len(), keys.len());
    assert!(got[2].is_none(), "absent key must miss");
    let hits: Vec<&StoredBlock> = got.iter().flatten().collect();
    assert_eq!(hits.len(), 4);
    for (i, hit) in hits.iter().enumerate() {
        assert_eq!(hit.payload, payloads[i], "payload {i} differs");
        assert_eq!(hit.num_tokens, i as u32 + 1);
        assert_eq!(hit.codec_id, CODEC);
    }
    let stats = store.stats();
    assert_eq!((stats.hits, stats.misses, stats.puts), (4, 1, 4));
    assert_eq!(stats.hit_tokens, 1 + 2 + 3 + 4);
    assert_eq!(stats.hit_bytes, sizes.iter().sum::<usize>() as u64);
    assert!(stats.bytes_written >= stats.hit_bytes && stats.bytes_read > 0);
    assert_eq!((stats.corrupt, stats.errors), (0, 0));
    assert_eq!(stats.load_count, 1);
    let fresh = put(store, key(1, 1), 77, 100);
    assert_eq!(get1(store, key(1, 1)).expect("overwritten").payload, fresh);
    assert!(store.get_many(&[]).expect("empty get").is_empty());
}

/// `contains_prefix` counts leading present keys only; `get_prefix` stops at the first miss;
/// `remove` deletes.
pub fn prefix_semantics<S: TierStore + RawObjectAccess>(s: &Subject<S>) {
    let store = &s.store;
    let chain: Vec<TierKey> = (0..6).map(|i| key(2, i)).collect();
    let mut stored = Vec::new();
    for (i, k) in chain.iter().enumerate() {
        if i != 3 {
            stored.push(put(store, *k, 100 + i as u64, 2048));
        }
    }
    assert_eq!(store.contains_prefix(&chain).expect("contains"), 3);
    assert_eq!(store.contains_prefix(&[]).expect("contains"), 0);
    assert_eq!(store.contains_prefix(&chain[4..]).expect("contains"), 2);
    assert_eq!(store.contains_prefix(&chain[3..]).expect("contains"), 0);
    let prefix = store.get_prefix(&chain).expect("get_prefix");
    assert_eq!(prefix.len(), 3);
    for (i, block) in prefix.iter().enumerate() {
        assert_eq!(block.payload, stored[i]);
    }
    store.remove(&[chain[1], key(2, 1234)]).expect("remove");
    assert_eq!(store.contains_prefix(&chain).expect("contains"), 1);
    assert!(get1(store, chain[1]).is_none());
    assert!(
        get1(store, chain[2]).is_some(),
        "remove touches only its keys"
    );
}

/// Writing 3× the budget keeps the store within budget, keeps the newest and a recently read
/// object, and drops the oldest unread one. Skipped for stores without their own budget.
pub fn budget_eviction<S: TierStore + RawObjectAccess>(s: &Subject<S>) {
    let Some(budget) = s.budget_bytes else {
        return;
    };
    let store = &s.store;
    let object_payload = 16 * 1024;
    let count = 3 * budget / object_payload as u64 + 1;
    let hot = key(3, 0);
    let cold = key(3, 1);
    let hot_payload = put(store, hot, 0, object_payload);
    put(store, cold, 1, object_payload);
    let mut last = Vec::new();
    for i in 2..count {
        last = put(store, key(3, i), i, object_payload);
        if i % 4 == 0 {
            assert!(
                get1(store, hot).is_some(),
                "recently used object evicted at {i}"
            );
        }
    }
    let stats = store.stats();
    let stored = stats.stored_bytes.expect("budgeted stores know their size");
    assert!(stored <= budget, "{stored} bytes stored > budget {budget}");
    assert!(stats.evictions > 0);
    assert_eq!(
        get1(store, key(3, count - 1)).expect("newest").payload,
        last
    );
    assert_eq!(get1(store, hot).expect("hot").payload, hot_payload);
    assert!(get1(store, cold).is_none(), "least recently used survived");
}

/// Each kind of damage at rest → `None`, `corrupt` + 1, object deleted; neighbours intact.
pub fn corruption_is_a_miss<S: TierStore + RawObjectAccess>(s: &Subject<S>) {
    let store = &s.store;
    let neighbour = key(4, 10_000);
    let neighbour_payload = put(store, neighbour, 5, 4096);
    type Damage = fn(&mut Vec<u8>);
    let damages: [(&str, Damage); 9] = [
        ("flip magic", |b| b[0] ^= 1),
        ("flip version", |b| b[8] ^= 1),
        ("flip key byte", |b| b[20] ^= 1),
        ("flip checksum", |b| b[100] ^= 1),
        ("flip codec id", |b| b[128] ^= 1),
        ("flip last payload byte", |b| {
            *b.last_mut().expect("non-empty") ^= 0x80
        }),
        ("truncate by one", |b| {
            b.pop();
        }),
        ("truncate to 64", |b| b.truncate(64)),
        ("append a byte", |b| b.push(0)),
    ];
    for (i, (name, damage)) in damages.iter().enumerate() {
        let k = key(4, i as u64);
        put(store, k, i as u64, 4096);
        let mut raw = store
            .read_raw(&k)
            .expect("read_raw")
            .expect("object stored");
        damage(&mut raw);
        store.write_raw(&k, &raw).expect("write_raw");
        let before = store.stats().corrupt;
        assert!(get1(store, k).is_none(), "{name}: damaged object returned");
        assert_eq!(store.stats().corrupt, before + 1, "{name}: not counted");
        assert!(get1(store, k).is_none(), "{name}: second read");
        assert_eq!(store.stats().corrupt, before + 1, "{name}: not deleted");
        assert_eq!(store.contains_prefix(&[k]).expect("contains"), 0, "{name}");
    }
    assert_eq!(
        get1(store, neighbour).expect("neighbour").payload,
        neighbour_payload
    );
    assert_eq!(store.stats().errors, 0);
}

/// A valid object of another key (other chain, or same chain in another namespace) stored under
/// a key → miss + `corrupt`; the genuine owner still reads fine.
pub fn foreign_object_is_a_miss<S: TierStore + RawObjectAccess>(s: &Subject<S>) {
    let store = &s.store;
    for (victim, owner) in [(key(5, 1), key(5, 2)), (key(5, 3), key(6, 3))] {
        put(store, victim, 1, 1024);
        let owner_payload = put(store, owner, 2, 1024);
        let foreign = store
            .read_raw(&owner)
            .expect("read_raw")
            .expect("owner stored");
        store.write_raw(&victim, &foreign).expect("write_raw");
        let before = store.stats().corrupt;
        assert!(get1(store, victim).is_none(), "foreign object served");
        assert_eq!(store.stats().corrupt, before + 1);
        assert_eq!(get1(store, owner).expect("owner").payload, owner_payload);
    }
}

/// Same chain key under two namespace roots: never visible across; each sees its own
/// (positive control), and removing one leaves the other.
pub fn tenant_isolation<S: TierStore + RawObjectAccess>(s: &Subject<S>) {
    let store = &s.store;
    let chain: Vec<u64> = (0..4).collect();
    let a: Vec<TierKey> = chain.iter().map(|&c| key(7, c)).collect();
    let b: Vec<TierKey> = chain.iter().map(|&c| key(8, c)).collect();
    let pa: Vec<Vec<u8>> = a
        .iter()
        .zip(0..)
        .map(|(k, i)| put(store, *k, i, 512))
        .collect();
    assert_eq!(
        store.contains_prefix(&b).expect("contains"),
        0,
        "tenant b sees a"
    );
    assert!(store.get_many(&b).expect("get").iter().all(Option::is_none));
    assert_eq!(
        store.contains_prefix(&a).expect("contains"),
        4,
        "positive control"
    );
    let pb: Vec<Vec<u8>> = b
        .iter()
        .zip(100..)
        .map(|(k, i)| put(store, *k, i, 512))
        .collect();
    let got_a = store.get_prefix(&a).expect("get a");
    let got_b = store.get_prefix(&b).expect("get b");
    assert_eq!(
        got_a.iter().map(|x| &x.payload).collect::<Vec<_>>(),
        pa.iter().collect::<Vec<_>>()
    );
    assert_eq!(
        got_b.iter().map(|x| &x.payload).collect::<Vec<_>>(),
        pb.iter().collect::<Vec<_>>()
    );
    store.remove(&a).expect("remove a");
    assert_eq!(store.contains_prefix(&b).expect("contains"), 4);
    assert_eq!(store.contains_prefix(&a).expect("contains"), 0);
}

/// Two threads put and read their own keys and the other's at the same time: every read is
/// either absent or exact.
pub fn concurrent_access<S: TierStore + RawObjectAccess>(s: &Subject<S>) {
    let store = &s.store;
    let rounds = 40u64;
    std::thread::scope(|scope| {
        for thread in 0..2u64 {
            scope.spawn(move || {
                let other = 1 - thread;
                for i in 0..rounds {
                    let seed = thread * 1000 + i;
                    let mine = put(store, key(9, seed), seed, 8192);
                    assert_eq!(get1(store, key(9, seed)).expect("own write").payload, mine);
                    let theirs = other * 1000 + i;
                    if let Some(block) = get1(store, key(9, theirs)) {
                        assert_eq!(block.payload, payload(theirs, 8192));
                    }
                }
            });
        }
    });
    let all: Vec<TierKey> = (0..2)
        .flat_map(|t| (0..rounds).map(move |i| key(9, t * 1000 + i)))
        .collect();
    assert!(store
        .get_many(&all)
        .expect("get")
        .iter()
        .all(Option::is_some));
    assert_eq!(store.stats().corrupt, 0);
}

/// Generate one `#[test]` per conformance check; `$make` is an expression of type
/// `fn() -> Subject<S>` (a closure or a function path) building a fresh store.
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        #[test]
        fn round_trip() {
            $crate::conformance::round_trip(&($make)());
        }
        #[test]
        fn prefix_semantics() {
            $crate::conformance::prefix_semantics(&($make)());
        }
        #[test]
        fn budget_eviction() {
            $crate::conformance::budget_eviction(&($make)());
        }
        #[test]
        fn corruption_is_a_miss() {
            $crate::conformance::corruption_is_a_miss(&($make)());
        }
        #[test]
        fn foreign_object_is_a_miss() {
            $crate::conformance::foreign_object_is_a_miss(&($make)());
        }
        #[test]
        fn tenant_isolation() {
            $crate::conformance::tenant_isolation(&($make)());
        }
        #[test]
        fn concurrent_access() {
            $crate::conformance::concurrent_access(&($make)());
        }
    };
}
