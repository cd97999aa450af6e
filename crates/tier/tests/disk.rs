//! Disk-store specifics: survives a restart (index rebuilt from headers, LRU by mtime), removes
//! leftover temp files and invalid files on open, shrinks to a smaller budget, and a kill -9 at
//! any moment during writes never yields a corrupt read.

use std::process::{Command, Stdio};
use std::time::Duration;

use tier::testing::{hash32, payload};
use tier::{BlockRef, DiskConfig, DiskStore, TierKey, TierStore, LAYOUT_DIR};

fn key(i: u64) -> TierKey {
    TierKey::new(hash32("disk-ns", 0), hash32("disk-chain", i))
}

fn put(store: &DiskStore, i: u64, len: usize) {
    let bytes = payload(i, len);
    store
        .put_many(&[BlockRef {
            key: key(i),
            num_tokens: i as u32,
            codec_id: "f16",
            payload: &bytes,
        }])
        .expect("put");
}

#[test]
fn objects_survive_reopen_in_lru_order() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 1 << 20;
    {
        let store = DiskStore::open(DiskConfig::new(dir.path(), budget)).unwrap();
        for i in 0..5 {
            put(&store, i, 10_000);
            // Distinct mtimes so the rebuilt LRU order is the write order.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let store = DiskStore::open(DiskConfig::new(dir.path(), budget)).unwrap();
    assert_eq!(store.scan_report().indexed, 5);
    let keys: Vec<TierKey> = (0..5).map(key).collect();
    let got = store.get_prefix(&keys).unwrap();
    assert_eq!(got.len(), 5);
    for (i, block) in got.iter().enumerate() {
        assert_eq!(block.payload, payload(i as u64, 10_000));
        assert_eq!(block.num_tokens, i as u32);
    }
    drop(store);
    // Reopen with room for 2 objects: the 3 oldest by mtime go.
    let object_bytes = std::fs::metadata(
        DiskStore::open(DiskConfig::new(dir.path(), budget))
            .unwrap()
            .object_path(&key(0)),
    )
    .unwrap()
    .len();
    let small = DiskStore::open(DiskConfig::new(dir.path(), 2 * object_bytes)).unwrap();
    assert_eq!(small.scan_report().evicted, 3);
    assert_eq!(small.contains_prefix(&keys[3..]).unwrap(), 2);
    assert_eq!(small.contains_prefix(&keys).unwrap(), 0);
    assert!(!small.object_path(&key(0)).exists(), "evicted file deleted");
}

#[test]
fn open_removes_temp_files_and_invalid_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(DiskConfig::new(dir.path(), 1 << 20)).unwrap();
    put(&store, 1, 1000);
    put(&store, 2, 1000);
    let good = store.object_path(&key(1));
    let shard = good.parent().unwrap().to_path_buf();
    drop(store);
    // An interrupted write, garbage with an object name, and a valid object under a wrong name.
    std::fs::write(shard.join("abc.123.0.tmp"), b"partial").unwrap();
    std::fs::write(shard.join(format!("{}.kvb", "0".repeat(64))), b"garbage").unwrap();
    let bytes = std::fs::read(&good).unwrap();
    std::fs::write(shard.join(format!("{}.kvb", "f".repeat(64))), &bytes).unwrap();
    let store = DiskStore::open(DiskConfig::new(dir.path(), 1 << 20)).unwrap();
    let report = store.scan_report();
    assert_eq!(report.removed_tmp, 1);
    assert_eq!(report.removed_invalid, 2);
    assert_eq!(report.indexed, 2);
    assert_eq!(store.stats().corrupt, 2);
    let names: Vec<_> = std::fs::read_dir(dir.path().join(LAYOUT_DIR))
        .unwrap()
        .flat_map(|shard| std::fs::read_dir(shard.unwrap().path()).unwrap())
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names.len(),
        2,
        "only the two genuine objects remain: {names:?}"
    );
    assert_eq!(store.contains_prefix(&[key(1), key(2)]).unwrap(), 2);
}

#[test]
fn file_edited_on_disk_is_a_miss_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(DiskConfig::new(dir.path(), 1 << 20)).unwrap();
    put(&store, 1, 5000);
    let path = store.object_path(&key(1));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[3000] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(store.get_many(&[key(1)]).unwrap(), vec![None]);
    assert_eq!(store.stats().corrupt, 1);
    assert!(!path.exists());
}

const CHILD_ENV: &str = "AGENTKV_TIER_CRASH_CHILD_DIR";
const CRASH_PAYLOAD_BYTES: usize = 92 * 1024;

/// Child side of `kill_9_during_writes_never_yields_a_corrupt_read`: writes objects forever
/// until killed. Does nothing when run normally.
#[test]
fn crash_child_writer() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let store = DiskStore::open(DiskConfig::new(&dir, 8 << 20)).unwrap();
    for i in 0.. {
        // Keys repeat so overwrites of existing objects are interrupted too.
        put(&store, i % 150, CRASH_PAYLOAD_BYTES);
    }
}

#[test]
fn kill_9_during_writes_never_yields_a_corrupt_read() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    for round in 0..6u64 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child_writer",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(150 + 70 * round));
        child.kill().unwrap(); // SIGKILL on Unix
        child.wait().unwrap();

        let store = DiskStore::open(DiskConfig::new(dir.path(), 8 << 20)).unwrap();
        let keys: Vec<TierKey> = (0..150).map(key).collect();
        let got = store.get_many(&keys).unwrap();
        for (i, block) in got.iter().enumerate() {
            if let Some(block) = block {
                assert_eq!(block.payload, payload(i as u64, CRASH_PAYLOAD_BYTES));
            }
        }
        let stats = store.stats();
        assert_eq!(
            stats.corrupt, 0,
            "round {round}: a kill produced a corrupt object"
        );
        assert!(stats.hits > 0, "round {round}: the child wrote nothing");
    }
}

#[test]
fn f5_a_directory_named_like_an_object_does_not_stop_start_up_or_cost_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(DiskConfig::new(dir.path(), 1 << 20)).unwrap();
    for i in 1..=4 {
        put(&store, i, 1000);
    }
    let shard = store.object_path(&key(1)).parent().unwrap().to_path_buf();
    drop(store);
    // Directories named like an object and like a temp file, in a shard that holds objects,
    // with something inside so that they cannot be removed as files.
    let fake = shard.join(format!("{}.kvb", "a".repeat(64)));
    std::fs::create_dir(&fake).unwrap();
    std::fs::write(fake.join("inner"), b"x").unwrap();
    std::fs::create_dir(shard.join("x.1.2.tmp")).unwrap();
    // And a genuine leftover temp file plus a corrupt object, which are cleaned up.
    std::fs::write(shard.join("y.1.2.tmp"), b"partial").unwrap();
    std::fs::write(shard.join(format!("{}.kvb", "0".repeat(64))), b"garbage").unwrap();
    let store = DiskStore::open(DiskConfig::new(dir.path(), 1 << 20)).unwrap();
    let report = store.scan_report();
    assert_eq!(report.indexed, 4, "{report:?}");
    assert_eq!(report.skipped, 2, "{report:?}");
    assert_eq!(report.removed_tmp, 1, "{report:?}");
    assert_eq!(report.removed_invalid, 1, "{report:?}");
    assert_eq!(report.remove_failed, 0, "{report:?}");
    // Every valid object is still there and served; the directories are untouched.
    let keys: Vec<TierKey> = (1..=4).map(key).collect();
    assert_eq!(store.contains_prefix(&keys).unwrap(), 4);
    let got = store.get_many(&keys).unwrap();
    assert!(got.iter().all(Option::is_some));
    assert!(fake.join("inner").exists() && shard.join("x.1.2.tmp").is_dir());
    // Reopening again is just as calm.
    drop(store);
    let store = DiskStore::open(DiskConfig::new(dir.path(), 1 << 20)).unwrap();
    assert_eq!(store.scan_report().indexed, 4);
}

#[test]
fn f5_a_scan_that_fails_has_deleted_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = DiskStore::open(DiskConfig::new(dir.path(), 1 << 20)).unwrap();
    put(&store, 1, 1000);
    put(&store, 2, 1000);
    let shard = store.object_path(&key(1)).parent().unwrap().to_path_buf();
    drop(store);
    let tmp = shard.join("z.1.2.tmp");
    std::fs::write(&tmp, b"partial").unwrap();
    // A shard directory that cannot be listed (mode 000) makes the scan fail…
    let locked = dir.path().join(LAYOUT_DIR).join("zz");
    std::fs::create_dir(&locked).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    let listable = std::fs::read_dir(&locked).is_ok(); // root can list it anyway
    let r = DiskStore::open(DiskConfig::new(dir.path(), 1 << 20));
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
    if !listable {
        assert!(r.is_err());
        // …before it deleted anything: the leftover temp file is still there.
        assert!(tmp.exists());
    }
    // Objects are all intact for the next (successful) open.
    let store = DiskStore::open(DiskConfig::new(dir.path(), 1 << 20)).unwrap();
    assert_eq!(store.contains_prefix(&[key(1), key(2)]).unwrap(), 2);
    assert!(!tmp.exists());
}
