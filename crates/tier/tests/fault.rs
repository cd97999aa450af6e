//! The fault-injecting wrapper does what the engine's tests will rely on: injected errors are
//! typed and counted, one-shot failures expire, delays apply, and corrupt-at-rest reads go
//! through the inner store's real verification (miss + `corrupt`).

use std::time::{Duration, Instant};

use tier::testing::{hash32, payload};
use tier::{BlockRef, FaultStore, RamConfig, RamStore, TierError, TierKey, TierStore};

fn key(i: u64) -> TierKey {
    TierKey::new(hash32("fault-ns", 0), hash32("fault-chain", i))
}

fn store() -> FaultStore<RamStore> {
    let s = FaultStore::new(RamStore::new(RamConfig {
        max_bytes: 1 << 20,
        compression: tier::Compression::None,
    }));
    let bytes = payload(1, 1000);
    s.put_many(&[BlockRef {
        key: key(1),
        num_tokens: 16,
        codec_id: "f16",
        payload: &bytes,
    }])
    .unwrap();
    s
}

#[test]
fn injected_failures_are_typed_counted_and_expire() {
    let s = store();
    s.fail_next(2);
    assert!(matches!(
        s.get_many(&[key(1)]),
        Err(TierError::Injected { op: "get_many" })
    ));
    assert!(matches!(
        s.contains_prefix(&[key(1)]),
        Err(TierError::Injected { .. })
    ));
    assert_eq!(s.contains_prefix(&[key(1)]).unwrap(), 1);
    s.set_failing(true);
    assert!(s.remove(&[key(1)]).is_err());
    s.set_failing(false);
    assert_eq!(s.injected_failures(), 3);
    assert_eq!(s.stats().errors, 3);
    assert!(s.get_many(&[key(1)]).unwrap()[0].is_some());
}

#[test]
fn delay_applies_to_every_call() {
    let s = store();
    s.set_delay(Duration::from_millis(50));
    let start = Instant::now();
    s.contains_prefix(&[key(1)]).unwrap();
    s.get_many(&[key(1)]).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(100));
}

#[test]
fn corrupt_reads_go_through_real_verification() {
    let s = store();
    s.set_corrupt_reads(true);
    assert_eq!(s.get_many(&[key(1), key(2)]).unwrap(), vec![None, None]);
    assert_eq!(s.stats().corrupt, 1);
    assert_eq!(s.inner().stats().corrupt, 1);
}
