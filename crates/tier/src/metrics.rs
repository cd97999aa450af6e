//! Per-store counters (lock-free atomics) and their serialisable snapshot [`TierStats`], with a
//! fixed-bucket load-latency histogram. Owns counting only; never renders Prometheus text.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (inclusive, microseconds) of the load-latency histogram buckets; a final
/// overflow bucket follows. One observation per `get_many` call that touched storage.
pub const LOAD_LATENCY_BUCKETS_US: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
];
const NUM_BUCKETS: usize = LOAD_LATENCY_BUCKETS_US.len() + 1;

/// Live counters of one store.
#[derive(Debug, Default)]
pub struct TierMetrics {
    hits: AtomicU64,
    misses: AtomicU64,
    hit_tokens: AtomicU64,
    hit_bytes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    puts: AtomicU64,
    evictions: AtomicU64,
    errors: AtomicU64,
    corrupt: AtomicU64,
    load_count: AtomicU64,
    load_sum_us: AtomicU64,
    load_buckets: [AtomicU64; NUM_BUCKETS],
}

/// Snapshot of a store's counters (all monotonic except `stored_*`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TierStats {
    /// Keys found and verified by `get_many`.
    pub hits: u64,
    /// Keys requested by `get_many` and not returned (absent, corrupt or errored).
    pub misses: u64,
    /// Tokens in hit blocks.
    pub hit_tokens: u64,
    /// Payload bytes returned to callers.
    pub hit_bytes: u64,
    /// Stored-object bytes read from storage (including rejected ones).
    pub bytes_read: u64,
    /// Stored-object bytes written to storage.
    pub bytes_written: u64,
    /// Objects written.
    pub puts: u64,
    /// Objects dropped by the store's own budget (Redis: 0, the server evicts).
    pub evictions: u64,
    /// Operations that failed (I/O, connection, timeout, back-off).
    pub errors: u64,
    /// Objects rejected by verification (bad checksum/MAC, truncated, foreign key, bad header).
    pub corrupt: u64,
    /// Objects currently stored, where the store knows (`None` for Redis).
    pub stored_objects: Option<u64>,
    /// Stored-object bytes currently held, where the store knows (`None` for Redis).
    pub stored_bytes: Option<u64>,
    /// Number of load observations.
    pub load_count: u64,
    /// Sum of load latencies in microseconds.
    pub load_sum_us: u64,
    /// Per-bucket counts (not cumulative); bounds in [`LOAD_LATENCY_BUCKETS_US`], then overflow.
    pub load_buckets: Vec<u64>,
}

impl TierMetrics {
    pub(crate) fn hit(&self, num_tokens: u32, payload_bytes: usize) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.hit_tokens
            .fetch_add(u64::from(num_tokens), Ordering::Relaxed);
        self.hit_bytes
            .fetch_add(payload_bytes as u64, Ordering::Relaxed);
    }
    pub(crate) fn misses(&self, n: usize) {
        self.misses.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub(crate) fn read(&self, bytes: usize) {
        self.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    pub(crate) fn written(&self, bytes: usize) {
        self.puts.fetch_add(1, Ordering::Relaxed);
        self.bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }
    pub(crate) fn evicted(&self, n: usize) {
        self.evictions.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub(crate) fn error(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn corrupted(&self) {
        self.corrupt.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn load_latency(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = LOAD_LATENCY_BUCKETS_US
            .iter()
            .position(|&bound| us <= bound)
            .unwrap_or(NUM_BUCKETS - 1);
        self.load_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.load_count.fetch_add(1, Ordering::Relaxed);
        self.load_sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Snapshot with the store's current occupancy (if it knows it).
    pub fn snapshot(&self, stored_objects: Option<u64>, stored_bytes: Option<u64>) -> TierStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        TierStats {
            hits: get(&self.hits),
            misses: get(&self.misses),
            hit_tokens: get(&self.hit_tokens),
            hit_bytes: get(&self.hit_bytes),
            bytes_read: get(&self.bytes_read),
            bytes_written: get(&self.bytes_written),
            puts: get(&self.puts),
            evictions: get(&self.evictions),
            errors: get(&self.errors),
            corrupt: get(&self.corrupt),
            stored_objects,
            stored_bytes,
            load_count: get(&self.load_count),
            load_sum_us: get(&self.load_sum_us),
            load_buckets: self.load_buckets.iter().map(get).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_lands_in_the_right_bucket() {
        let m = TierMetrics::default();
        m.load_latency(Duration::from_micros(50));
        m.load_latency(Duration::from_micros(51));
        m.load_latency(Duration::from_secs(5));
        let s = m.snapshot(None, None);
        assert_eq!(s.load_buckets[0], 1);
        assert_eq!(s.load_buckets[1], 1);
        assert_eq!(s.load_buckets[NUM_BUCKETS - 1], 1);
        assert_eq!(s.load_count, 3);
        assert_eq!(s.load_sum_us, 50 + 51 + 5_000_000);
    }
}
