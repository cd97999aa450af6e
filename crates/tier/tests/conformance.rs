//! Runs the conformance suite against every store and configuration: RAM (plain, LZ4), disk
//! (fsync on), Redis (plain, with MAC secret + TTL, through the fault wrapper with no faults).

use tier::conformance::{Subject, MIN_BUDGET_BYTES};
use tier::testing::RedisServer;
use tier::{Compression, DiskConfig, DiskStore, FaultStore, RamConfig, RamStore};
use tier::{RedisConfig, RedisStore};

fn ram(compression: Compression) -> Subject<RamStore> {
    Subject {
        store: RamStore::new(RamConfig {
            max_bytes: MIN_BUDGET_BYTES,
            compression,
        }),
        budget_bytes: Some(MIN_BUDGET_BYTES),
        guard: Box::new(()),
    }
}

fn disk() -> Subject<DiskStore> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = DiskStore::open(DiskConfig::new(dir.path(), MIN_BUDGET_BYTES)).expect("open");
    Subject {
        store,
        budget_bytes: Some(MIN_BUDGET_BYTES),
        guard: Box::new(dir),
    }
}

fn redis_with(edit: impl FnOnce(&mut RedisConfig)) -> Subject<RedisStore> {
    let server = RedisServer::start().expect("redis-server");
    let mut config = RedisConfig::single(server.url());
    edit(&mut config);
    Subject {
        store: RedisStore::open(config).expect("open"),
        budget_bytes: None,
        guard: Box::new(server),
    }
}

mod ram_plain {
    use super::*;
    tier::conformance_suite!(|| ram(Compression::None));
}

mod ram_lz4_shuffle {
    use super::*;
    tier::conformance_suite!(|| ram(Compression::Lz4Shuffle16));
}

mod disk_store {
    use super::*;
    tier::conformance_suite!(disk);
}

mod redis_plain {
    use super::*;
    tier::conformance_suite!(|| redis_with(|_| {}));
}

mod redis_mac_ttl {
    use super::*;
    tier::conformance_suite!(|| redis_with(|c| {
        c.secret = Some(b"server secret".to_vec());
        c.ttl = Some(std::time::Duration::from_secs(600));
        c.compression = Compression::Lz4;
    }));
}

mod fault_wrapper_without_faults {
    use super::*;
    tier::conformance_suite!(|| {
        let inner = ram(Compression::None);
        Subject {
            store: FaultStore::new(inner.store),
            budget_bytes: inner.budget_bytes,
            guard: inner.guard,
        }
    });
}
