//! `tier`: the only crate that moves KV-block bytes to storage. One synchronous, batched,
//! prefix-aware trait ([`TierStore`]) with three stores — host RAM ([`RamStore`]), a local
//! directory ([`DiskStore`]) and Redis / Redis Cluster ([`RedisStore`]) — sharing one verified
//! object format ([`object`], spec in `docs/design/disk-format.md`), plus a conformance suite
//! ([`conformance`]) every store passes and a fault-injecting wrapper ([`FaultStore`]).
//!
//! Never knows tokens, tensors or the engine: keys are raw 32-byte hashes ([`TierKey`]) and
//! payloads are opaque bytes. No async: callers run it on a dedicated I/O thread.

pub mod config;
pub mod conformance;
mod disk;
mod dropped;
mod error;
mod fault;
mod key;
mod lru;
mod metrics;
pub mod object;
mod ram;
mod redis_store;
mod store;
pub mod testing;
pub mod testing_cluster;

pub use config::{open_tiers, ByteSize, TierConfig};
pub use disk::{DiskConfig, DiskStore, ScanReport, LAYOUT_DIR};
pub use dropped::MAX_PENDING_DROPPED;
pub use error::TierError;
pub use fault::FaultStore;
pub use key::TierKey;
pub use metrics::{TierMetrics, TierStats, LOAD_LATENCY_BUCKETS_US};
pub use object::{BlockRef, Compression, MacKey, StoredBlock};
pub use ram::{RamConfig, RamStore};
pub use redis_store::{RedisConfig, RedisStore};
pub use store::{RawObjectAccess, TierKind, TierStore};
