//! Tier writes (demoted or newly published blocks) off the engine thread.
//!
//! Owns one background thread that performs `put_many` on the tier stores for blocks the engine
//! hands over, so disk fsyncs and Redis round trips overlap the forward passes instead of
//! stalling them. The engine copies a block's bytes before handing them over (the block may be
//! reused at once). Jobs are numbered (tickets) and finish in order; every tier lookup waits for
//! the ticket current when it was issued ([`DemoteProgress::wait_until`]), so a lookup always
//! sees every write issued before it — results never depend on the writer's timing. A RAM or
//! disk tier that already holds a block (one loaded from it and evicted again: tier keys name
//! content) is not written again; Redis is, which refreshes the block's TTL. A block transcoded
//! for a lossy tier waits its turn at the [`EncodeGate`] first (encodes yield to the forward
//! pass, up to a deadline). Never decides what to write.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tier::{BlockRef, TierKey, TierKind, TierStore};

use crate::encode_gate::{EncodeGate, Turn};
use crate::tier_codec::TierCodec;

/// One batch of evicted blocks for the first `targets` stores.
struct Job {
    blocks: Vec<(TierKey, Vec<u8>)>,
    targets: usize,
    /// Lossy encodes of this job run next to the forward pass from then on.
    encode_deadline: Instant,
}

/// Per-store results of the writes, read by snapshots.
#[derive(Default)]
pub struct DemoteCounts {
    pub demoted_blocks: AtomicU64,
    pub demote_errors: AtomicU64,
    /// Blocks not written because the store already held them.
    pub already_held_blocks: AtomicU64,
    /// Blocks transcoded for this (lossy) store while the engine computed: their deferral ran
    /// out or the write queue was past half its cap.
    pub busy_encoded_blocks: AtomicU64,
}

/// Bytes queued for writing and blocks dropped because the queue was full (a store that stopped
/// answering must not make the engine hold every evicted block in memory).
#[derive(Default)]
pub struct QueueCounts {
    pub queued_bytes: AtomicUsize,
    pub dropped_blocks: AtomicU64,
}

/// How far the demotion thread has got: jobs are numbered from 1 in submission order and run in
/// that order, so "job `t` is done" means every job up to `t` is. Shared with the tier loader,
/// whose lookups wait for the demotions issued before them.
#[derive(Default)]
pub struct DemoteProgress {
    /// Jobs finished (written or failed), with a condvar signalled on each.
    completed: (Mutex<u64>, Condvar),
    /// Told while someone waits here, so deferred encodes run at once.
    gate: Arc<EncodeGate>,
}

impl DemoteProgress {
    /// Waits until the first `ticket` jobs are finished (deferred encodes among them run now).
    pub fn wait_until(&self, ticket: u64) {
        let (lock, cv) = &self.completed;
        if *lock.lock().unwrap_or_else(|e| e.into_inner()) >= ticket {
            return;
        }
        let _urgent = self.gate.urgent();
        let mut done = lock.lock().unwrap_or_else(|e| e.into_inner());
        while *done < ticket {
            done = cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Jobs finished so far.
    pub fn done(&self) -> u64 {
        *self.completed.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finish_one(&self) {
        let (lock, cv) = &self.completed;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        cv.notify_all();
    }
}

pub struct Demoter {
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    /// Jobs submitted so far (the ticket of the latest).
    submitted: u64,
    progress: Arc<DemoteProgress>,
    pub counts: Arc<Vec<DemoteCounts>>,
    pub queue: Arc<QueueCounts>,
    /// Past this many queued bytes new jobs are dropped (counted in `queue.dropped_blocks`).
    max_queued_bytes: usize,
    /// How long a lossy encode may wait for the engine to idle.
    encode_deferral: Duration,
    gate: Arc<EncodeGate>,
}

impl Demoter {
    /// A demoter writing to `stores`, each in its codec (`codecs[i]` for `stores[i]`: blocks
    /// are transcoded here, on the demotion thread, when a tier stores another codec, at most
    /// `encode_deferral` after their submission while the engine is busy).
    pub fn new(
        stores: Vec<Arc<dyn TierStore>>,
        block_size: usize,
        codecs: Vec<TierCodec>,
        max_queued_bytes: usize,
        encode_deferral: Duration,
    ) -> Demoter {
        assert_eq!(stores.len(), codecs.len(), "one codec per store");
        let counts: Arc<Vec<DemoteCounts>> =
            Arc::new((0..stores.len()).map(|_| DemoteCounts::default()).collect());
        let progress = Arc::new(DemoteProgress::default());
        let queue = Arc::new(QueueCounts::default());
        let (tx, rx) = mpsc::channel::<Job>();
        let gate = progress.gate.clone();
        let writer = Writer {
            stores,
            block_size,
            codecs,
            counts: counts.clone(),
            progress: progress.clone(),
            queue: queue.clone(),
            gate: gate.clone(),
            max_queued_bytes,
        };
        let thread = std::thread::Builder::new()
            .name("agentkv-demote".into())
            .spawn(move || writer.run(rx))
            .expect("spawning the demotion thread");
        Demoter {
            tx: Some(tx),
            thread: Some(thread),
            submitted: 0,
            progress,
            counts,
            queue,
            max_queued_bytes,
            encode_deferral,
            gate,
        }
    }

    /// The gate the engine tells when it is busy (lossy encodes wait for it to idle).
    pub fn gate(&self) -> &EncodeGate {
        &self.gate
    }

    /// Queues `blocks` for the first `targets` stores; drops them (counted) when the queue
    /// already holds `max_queued_bytes` (never blocks the caller).
    pub fn submit(&mut self, blocks: Vec<(TierKey, Vec<u8>)>, targets: usize) {
        if blocks.is_empty() {
            return;
        }
        let bytes: usize = blocks.iter().map(|(_, b)| b.len()).sum();
        let queued = self.queue.queued_bytes.load(Ordering::Acquire);
        if queued + bytes > self.max_queued_bytes {
            let n = blocks.len() as u64;
            self.queue.dropped_blocks.fetch_add(n, Ordering::Relaxed);
            return;
        }
        self.queue.queued_bytes.fetch_add(bytes, Ordering::AcqRel);
        self.gate
            .set_pressed(|| pressed(&self.queue, self.max_queued_bytes));
        self.submitted += 1;
        if let Some(tx) = &self.tx {
            let job = Job {
                blocks,
                targets,
                encode_deadline: Instant::now() + self.encode_deferral,
            };
            if tx.send(job).is_err() {
                self.progress.finish_one();
            }
        }
    }

    /// The ticket of the latest submitted job: `progress().wait_until(ticket())` waits for
    /// every demotion issued so far.
    pub fn ticket(&self) -> u64 {
        self.submitted
    }

    pub fn progress(&self) -> Arc<DemoteProgress> {
        self.progress.clone()
    }

    /// Waits until every queued demotion has been written (or failed).
    pub fn barrier(&self) {
        self.progress.wait_until(self.submitted);
    }
}

/// Whether the write queue is past half its cap (lossy encodes then stop waiting for an idle
/// engine).
fn pressed(queue: &QueueCounts, max_queued_bytes: usize) -> bool {
    queue.queued_bytes.load(Ordering::Acquire) > max_queued_bytes / 2
}

/// The demotion thread's side: the stores, their codecs and the shared counters.
struct Writer {
    stores: Vec<Arc<dyn TierStore>>,
    block_size: usize,
    codecs: Vec<TierCodec>,
    counts: Arc<Vec<DemoteCounts>>,
    progress: Arc<DemoteProgress>,
    queue: Arc<QueueCounts>,
    gate: Arc<EncodeGate>,
    max_queued_bytes: usize,
}

impl Writer {
    fn run(self, rx: Receiver<Job>) {
        for job in rx {
            let bytes: usize = job.blocks.iter().map(|(_, b)| b.len()).sum();
            for ((store, c), codec) in self
                .stores
                .iter()
                .zip(self.counts.iter())
                .zip(&self.codecs)
                .take(job.targets)
            {
                // A store that panics (or a block its codec cannot encode) counts as a failed
                // write: the job still finishes, so lookups waiting for its ticket never hang.
                let put = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    self.write(store.as_ref(), codec, &job, c)
                }));
                match put {
                    Ok(Ok((n, held))) => {
                        c.demoted_blocks.fetch_add(n as u64, Ordering::Relaxed);
                        c.already_held_blocks
                            .fetch_add(held as u64, Ordering::Relaxed);
                    }
                    Ok(Err(_)) | Err(_) => {
                        c.demote_errors.fetch_add(1, Ordering::Relaxed);
                    }
                };
            }
            self.queue.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.gate
                .set_pressed(|| pressed(&self.queue, self.max_queued_bytes));
            self.progress.finish_one();
        }
    }

    /// Writes `job`'s blocks that `store` lacks, encoded by `codec` (each lossy encode after
    /// its turn at the gate, counted in `counts`); returns the blocks written and those
    /// already held.
    fn write(
        &self,
        store: &dyn TierStore,
        codec: &TierCodec,
        job: &Job,
        counts: &DemoteCounts,
    ) -> Result<(usize, usize), tier::TierError> {
        let todo = not_held(store, &job.blocks);
        let held = job.blocks.len() - todo.len();
        let encoded = todo
            .iter()
            .map(|(_, payload)| {
                if codec.is_lossy()
                    && matches!(
                        self.gate.wait_turn(job.encode_deadline),
                        Turn::Deadline | Turn::Pressed
                    )
                {
                    counts.busy_encoded_blocks.fetch_add(1, Ordering::Relaxed);
                }
                codec.encode(payload)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tier::TierError::InvalidBlock(e.to_string()))?;
        let refs: Vec<BlockRef<'_>> = todo
            .iter()
            .zip(&encoded)
            .map(|((key, _), payload)| BlockRef {
                key: *key,
                num_tokens: self.block_size as u32,
                codec_id: &codec.id,
                payload,
            })
            .collect();
        if !refs.is_empty() {
            store.put_many(&refs)?;
        }
        Ok((refs.len(), held))
    }
}

/// The blocks `store` must be written: all of them for Redis (a write refreshes the TTL), the
/// ones it does not hold yet for RAM and disk tiers, whose `contains_prefix` is an in-memory
/// index lookup. A tier key names its content (namespace and token chain), so a held block is
/// the same block; an index entry whose object turns out corrupt is deleted on its next read
/// and written again on the next eviction.
fn not_held<'a>(
    store: &dyn TierStore,
    blocks: &'a [(TierKey, Vec<u8>)],
) -> Vec<&'a (TierKey, Vec<u8>)> {
    let check = matches!(store.kind(), TierKind::Ram | TierKind::Disk);
    blocks
        .iter()
        .filter(|(key, _)| {
            !check || store.contains_prefix(std::slice::from_ref(key)).ok() != Some(1)
        })
        .collect()
}

impl Drop for Demoter {
    fn drop(&mut self) {
        // Closing the channel ends the thread after it has written what was queued, without
        // waiting for the engine to idle.
        self.gate.open_for_good();
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tier::{Compression, FaultStore, RamConfig, RamStore};

    fn key(i: u8) -> TierKey {
        TierKey::new([7; 32], [i; 32])
    }

    #[test]
    fn barrier_makes_queued_writes_visible_and_counts_them() {
        let slow = Arc::new(FaultStore::new(RamStore::new(RamConfig {
            max_bytes: 1 << 20,
            compression: Compression::None,
        })));
        slow.set_delay(Duration::from_millis(50));
        let stores: Vec<Arc<dyn TierStore>> = vec![slow.clone()];
        let mut d = Demoter::new(
            stores,
            16,
            vec![TierCodec::as_is("f16".into(), 64)],
            usize::MAX,
            Duration::from_secs(60),
        );
        for i in 0..3u8 {
            d.submit(vec![(key(i), vec![i; 64])], 1);
        }
        d.barrier();
        slow.set_delay(Duration::ZERO);
        let keys: Vec<TierKey> = (0..3).map(key).collect();
        // All three writes landed before the barrier returned.
        let present = (0..3)
            .filter(|&i| slow.contains_prefix(&keys[i..i + 1]).unwrap() == 1)
            .count();
        assert_eq!(present, 3);
        assert_eq!(d.counts[0].demoted_blocks.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_block_the_store_already_holds_is_not_written_again() {
        let ram = Arc::new(RamStore::new(RamConfig {
            max_bytes: 1 << 20,
            compression: Compression::None,
        }));
        let stores: Vec<Arc<dyn TierStore>> = vec![ram.clone()];
        let mut d = Demoter::new(
            stores,
            16,
            vec![TierCodec::as_is("f16".into(), 64)],
            usize::MAX,
            Duration::from_secs(60),
        );
        d.submit(vec![(key(1), vec![1; 64])], 1);
        // Evicted again after a reload (same key, same content), next to a new block.
        d.submit(vec![(key(1), vec![1; 64]), (key(2), vec![2; 64])], 1);
        d.barrier();
        assert_eq!(d.counts[0].demoted_blocks.load(Ordering::Relaxed), 2);
        assert_eq!(d.counts[0].already_held_blocks.load(Ordering::Relaxed), 1);
        assert_eq!(
            ram.stats().puts,
            2,
            "the store saw one write per distinct block"
        );
        // Once the store dropped it, the block is written again.
        ram.remove(&[key(1)]).unwrap();
        d.submit(vec![(key(1), vec![1; 64])], 1);
        d.barrier();
        assert_eq!(d.counts[0].demoted_blocks.load(Ordering::Relaxed), 3);
        assert_eq!(ram.stats().puts, 3);
    }

    /// A demoter over one RAM store holding `codec`, its encodes deferred up to 60 s.
    fn ram_demoter(codec: TierCodec) -> (Arc<RamStore>, Demoter) {
        ram_demoter_with(codec, usize::MAX, Duration::from_secs(60))
    }

    /// The same with a write-queue cap and a deferral.
    fn ram_demoter_with(
        codec: TierCodec,
        max_queued_bytes: usize,
        deferral: Duration,
    ) -> (Arc<RamStore>, Demoter) {
        let ram = Arc::new(RamStore::new(RamConfig {
            max_bytes: 1 << 20,
            compression: Compression::None,
        }));
        let stores: Vec<Arc<dyn TierStore>> = vec![ram.clone()];
        let d = Demoter::new(stores, 16, vec![codec], max_queued_bytes, deferral);
        (ram, d)
    }

    /// One block of one layer and KV head: 16 K rows and 16 V rows of 64 f16 values.
    fn f16_block() -> Vec<u8> {
        (0..2 * 16 * 64)
            .flat_map(|i| half::f16::from_f32(i as f32 * 0.01 - 1.0).to_le_bytes())
            .collect()
    }

    fn lossy_int8() -> TierCodec {
        let int8 = model::KvDtype::parse("int8").unwrap();
        TierCodec::new(model::KvDtype::F16, int8, 64, 16, 16).unwrap()
    }

    fn written(ram: &RamStore) -> u64 {
        ram.stats().puts
    }

    #[test]
    fn lossy_encodes_wait_for_an_idle_engine_and_lossless_writes_never_do() {
        let (ram, mut d) = ram_demoter(lossy_int8());
        d.gate().set_busy(true);
        d.submit(vec![(key(1), f16_block())], 1);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(written(&ram), 0, "encoded while the engine was busy");
        d.gate().set_busy(false);
        d.barrier();
        assert_eq!(written(&ram), 1);
        assert_eq!(d.counts[0].busy_encoded_blocks.load(Ordering::Relaxed), 0);

        let (ram, mut d) = ram_demoter(TierCodec::as_is("f16".into(), 4096));
        d.gate().set_busy(true);
        d.submit(vec![(key(1), f16_block())], 1);
        let start = std::time::Instant::now();
        while written(&ram) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "an as-is write waited"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_barrier_or_a_lookup_gets_deferred_encodes_written_while_the_engine_is_busy() {
        let (ram, mut d) = ram_demoter(lossy_int8());
        d.gate().set_busy(true);
        d.submit(vec![(key(1), f16_block())], 1);
        d.submit(vec![(key(2), f16_block())], 1);
        // A lookup waiting for the first job (the loader's wait).
        d.progress().wait_until(1);
        assert!(written(&ram) >= 1);
        d.barrier();
        assert_eq!(written(&ram), 2);
        assert_eq!(d.counts[0].demoted_blocks.load(Ordering::Relaxed), 2);
        // Dropping a demoter with deferred encodes writes them without waiting for the engine.
        d.submit(vec![(key(3), f16_block())], 1);
        let start = std::time::Instant::now();
        drop(d);
        assert!(start.elapsed() < Duration::from_secs(30));
        assert_eq!(written(&ram), 3);
    }

    #[test]
    fn an_engine_that_never_idles_gets_its_blocks_encoded_after_the_deferral() {
        let (ram, mut d) = ram_demoter_with(lossy_int8(), usize::MAX, Duration::from_millis(30));
        d.gate().set_busy(true);
        d.submit(vec![(key(1), f16_block())], 1);
        let start = std::time::Instant::now();
        while written(&ram) == 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "never written");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(start.elapsed() >= Duration::from_millis(25));
        assert_eq!(d.counts[0].busy_encoded_blocks.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_write_queue_past_half_its_cap_encodes_until_it_is_back_under() {
        let block = f16_block();
        // Three blocks fit under the cap; the second passes half of it.
        let (ram, mut d) = ram_demoter_with(lossy_int8(), 3 * block.len(), Duration::from_secs(60));
        d.gate().set_busy(true);
        d.submit(vec![(key(1), block.clone())], 1);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(written(&ram), 0);
        d.submit(vec![(key(2), block)], 1);
        let start = std::time::Instant::now();
        while written(&ram) == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "a queue past half waited"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // One block written, one left: the queue is back under half, the second waits.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(written(&ram), 1);
        d.gate().set_busy(false);
        d.barrier();
        assert_eq!(written(&ram), 2);
        assert_eq!(d.queue.dropped_blocks.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn failed_writes_are_counted_and_never_block_the_barrier() {
        let failing = Arc::new(FaultStore::new(RamStore::new(RamConfig {
            max_bytes: 1 << 20,
            compression: Compression::None,
        })));
        failing.set_failing(true);
        let stores: Vec<Arc<dyn TierStore>> = vec![failing];
        let mut d = Demoter::new(
            stores,
            16,
            vec![TierCodec::as_is("f16".into(), 64)],
            usize::MAX,
            Duration::from_secs(60),
        );
        d.submit(vec![(key(1), vec![1; 64])], 1);
        d.barrier();
        assert_eq!(d.counts[0].demote_errors.load(Ordering::Relaxed), 1);
        drop(d); // joins the thread
    }
}
