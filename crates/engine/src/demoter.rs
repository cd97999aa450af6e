//! Tier writes (demoted or newly published blocks) off the engine thread.
//!
//! Owns one background thread that performs `put_many` on the tier stores for blocks the engine
//! hands over, so disk fsyncs and Redis round trips overlap the forward passes instead of
//! stalling them. The engine copies a block's bytes before handing them over (the block may be
//! reused at once). Jobs are numbered (tickets) and finish in order; every tier lookup waits for
//! the ticket current when it was issued ([`DemoteProgress::wait_until`]), so a lookup always
//! sees every write issued before it — results never depend on the writer's timing. A RAM or
//! disk tier that already holds a block (one loaded from it and evicted again: tier keys name
//! content) is not written again; Redis is, which refreshes the block's TTL. Never decides
//! what to write.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use tier::{BlockRef, TierKey, TierKind, TierStore};

use crate::tier_codec::TierCodec;

/// One batch of evicted blocks for the first `targets` stores.
struct Job {
    blocks: Vec<(TierKey, Vec<u8>)>,
    targets: usize,
}

/// Per-store results of the writes, read by snapshots.
#[derive(Default)]
pub struct DemoteCounts {
    pub demoted_blocks: AtomicU64,
    pub demote_errors: AtomicU64,
    /// Blocks not written because the store already held them.
    pub already_held_blocks: AtomicU64,
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
}

impl DemoteProgress {
    /// Waits until the first `ticket` jobs are finished.
    pub fn wait_until(&self, ticket: u64) {
        let (lock, cv) = &self.completed;
        let mut done = lock.lock().unwrap_or_else(|e| e.into_inner());
        while *done < ticket {
            done = cv.wait(done).unwrap_or_else(|e| e.into_inner());
        }
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
}

impl Demoter {
    /// A demoter writing to `stores`, each in its codec (`codecs[i]` for `stores[i]`: blocks
    /// are transcoded here, on the demotion thread, when a tier stores another codec).
    pub fn new(
        stores: Vec<Arc<dyn TierStore>>,
        block_size: usize,
        codecs: Vec<TierCodec>,
        max_queued_bytes: usize,
    ) -> Demoter {
        assert_eq!(stores.len(), codecs.len(), "one codec per store");
        let counts: Arc<Vec<DemoteCounts>> =
            Arc::new((0..stores.len()).map(|_| DemoteCounts::default()).collect());
        let progress = Arc::new(DemoteProgress::default());
        let queue = Arc::new(QueueCounts::default());
        let (tx, rx) = mpsc::channel::<Job>();
        let (c, p, q) = (counts.clone(), progress.clone(), queue.clone());
        let thread = std::thread::Builder::new()
            .name("agentkv-demote".into())
            .spawn(move || run(rx, stores, block_size, codecs, c, p, q))
            .expect("spawning the demotion thread");
        Demoter {
            tx: Some(tx),
            thread: Some(thread),
            submitted: 0,
            progress,
            counts,
            queue,
            max_queued_bytes,
        }
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
        self.submitted += 1;
        if let Some(tx) = &self.tx {
            if tx.send(Job { blocks, targets }).is_err() {
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

fn run(
    rx: Receiver<Job>,
    stores: Vec<Arc<dyn TierStore>>,
    block_size: usize,
    codecs: Vec<TierCodec>,
    counts: Arc<Vec<DemoteCounts>>,
    progress: Arc<DemoteProgress>,
    queue: Arc<QueueCounts>,
) {
    for job in rx {
        let bytes: usize = job.blocks.iter().map(|(_, b)| b.len()).sum();
        for ((store, c), codec) in stores
            .iter()
            .zip(counts.iter())
            .zip(&codecs)
            .take(job.targets)
        {
            // A store that panics (or a block its codec cannot encode) counts as a failed
            // write: the job still finishes, so lookups waiting for its ticket never hang.
            let put = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let todo = not_held(store.as_ref(), &job.blocks);
                let held = job.blocks.len() - todo.len();
                let encoded = todo
                    .iter()
                    .map(|(_, payload)| codec.encode(payload))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| tier::TierError::InvalidBlock(e.to_string()))?;
                let refs: Vec<BlockRef<'_>> = todo
                    .iter()
                    .zip(&encoded)
                    .map(|((key, _), payload)| BlockRef {
                        key: *key,
                        num_tokens: block_size as u32,
                        codec_id: &codec.id,
                        payload,
                    })
                    .collect();
                if !refs.is_empty() {
                    store.put_many(&refs)?;
                }
                Ok::<_, tier::TierError>((refs.len(), held))
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
        queue.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
        progress.finish_one();
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
        // Closing the channel ends the thread after it has written what was queued.
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
        );
        d.submit(vec![(key(1), vec![1; 64])], 1);
        d.barrier();
        assert_eq!(d.counts[0].demote_errors.load(Ordering::Relaxed), 1);
        drop(d); // joins the thread
    }
}
