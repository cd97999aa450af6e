//! Tier lookups and reads off the engine thread.
//!
//! Owns one background thread that, for each [`LoadJob`], waits for the demotions issued before
//! the job (so a lookup sees every block the engine wrote before asking), computes the chain's
//! tier keys, plans with the cost model and fetches the payloads into host memory. The engine
//! polls for results ([`Loader::take`]) and copies them into fresh blocks on admission, so a
//! request waits for its tier blocks while other requests keep computing. It also answers
//! [`ProbeJob`]s (which tier holds each of some keys: a session's blocks by tier) without
//! reading payloads. Never touches the block table or the K/V memory, and never decides what
//! to prefetch.

use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cache::NamespaceKey;
use tier::TierKey;

use crate::demoter::DemoteProgress;
use crate::tier_cost::TierShared;

/// Identifies one submitted lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JobId(u64);

/// Load blocks `first_block..max_blocks` of the chain of `tokens` in `ns` (at least
/// `max_blocks * block_size` tokens), after demotion ticket `demote_ticket` is written.
pub(crate) struct LoadJob {
    pub ns: NamespaceKey,
    pub tokens: Vec<u32>,
    pub first_block: usize,
    pub max_blocks: usize,
    pub demote_ticket: u64,
}

/// Where blocks are now: for each key, the first store (in lookup order) that holds it, after
/// demotion ticket `demote_ticket` is written; `reply` gets one count per store and the number
/// of keys no store holds. Used to report a session's blocks by tier; reads no payload.
pub(crate) struct ProbeJob {
    pub keys: Vec<TierKey>,
    pub demote_ticket: u64,
    pub reply: Box<dyn FnOnce(ProbeCounts) + Send>,
}

/// The answer of a [`ProbeJob`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ProbeCounts {
    /// Keys found per store, in lookup order (each key counted in the first store holding it).
    pub per_store: Vec<u32>,
    /// Keys no store holds (or whose store could not answer).
    pub missing: u32,
}

enum Job {
    Load(JobId, LoadJob),
    Probe(ProbeJob),
}

/// The verified payloads of blocks `first_block..first_block + payloads.len()` of a chain (the
/// leading run the tiers had and the cost model chose to load; empty when none).
#[derive(Debug)]
pub(crate) struct Loaded {
    pub first_block: usize,
    pub payloads: Vec<Vec<u8>>,
}

impl Loaded {
    pub fn num_bytes(&self) -> usize {
        self.payloads.iter().map(Vec::len).sum()
    }
}

/// The tier keys of blocks `first_block..max_blocks` of `tokens`' chain in `ns`.
pub(crate) fn tier_keys(
    ns: &NamespaceKey,
    tokens: &[u32],
    block_size: usize,
    first_block: usize,
    max_blocks: usize,
) -> Vec<TierKey> {
    let root = ns.root().0;
    cache::key::chain_keys(ns, tokens, block_size, max_blocks)
        .get(first_block..)
        .unwrap_or_default()
        .iter()
        .map(|k| TierKey::new(root, k.0))
        .collect()
}

#[derive(Default)]
struct Results {
    done: HashMap<JobId, Loaded>,
    /// Jobs whose result nobody wants any more (dropped on arrival).
    discarded: HashSet<JobId>,
}

pub(crate) struct Loader {
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    results: Arc<(Mutex<Results>, Condvar)>,
    next: u64,
}

impl Loader {
    pub fn new(shared: Arc<TierShared>, demotions: Arc<DemoteProgress>) -> Loader {
        let results: Arc<(Mutex<Results>, Condvar)> = Arc::default();
        let (tx, rx) = mpsc::channel();
        let r = results.clone();
        let thread = std::thread::Builder::new()
            .name("agentkv-tier-load".into())
            .spawn(move || run(rx, shared, demotions, r))
            .expect("spawning the tier loader thread");
        Loader {
            tx: Some(tx),
            thread: Some(thread),
            results,
            next: 0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Results> {
        self.results.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn submit(&mut self, job: LoadJob) -> JobId {
        self.next += 1;
        let id = JobId(self.next);
        let sent = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.send(Job::Load(id, job)).is_ok());
        if !sent {
            // The thread is gone (only at shutdown): an empty result, the request recomputes.
            self.lock().done.insert(
                id,
                Loaded {
                    first_block: 0,
                    payloads: Vec::new(),
                },
            );
        }
        id
    }

    /// Queues a probe; its reply runs on the loader thread (or here, with every key missing,
    /// when the thread is gone at shutdown).
    pub fn probe(&mut self, job: ProbeJob) {
        let Some(tx) = self.tx.as_ref() else {
            let missing = job.keys.len() as u32;
            (job.reply)(ProbeCounts {
                per_store: Vec::new(),
                missing,
            });
            return;
        };
        if let Err(mpsc::SendError(Job::Probe(job))) = tx.send(Job::Probe(job)) {
            let missing = job.keys.len() as u32;
            (job.reply)(ProbeCounts {
                per_store: Vec::new(),
                missing,
            });
        }
    }

    /// Whether `job` is done (its result waits to be taken).
    pub fn is_done(&self, job: JobId) -> bool {
        self.lock().done.contains_key(&job)
    }

    /// The result of `job` once it is done.
    pub fn take(&self, job: JobId) -> Option<Loaded> {
        self.lock().done.remove(&job)
    }

    /// Forgets `job`: its result is dropped now or when it arrives.
    pub fn discard(&self, job: JobId) {
        let mut r = self.lock();
        if r.done.remove(&job).is_none() {
            r.discarded.insert(job);
        }
    }

    /// Waits until one of `jobs` is done, at most `timeout`.
    pub fn wait_any(&self, jobs: &[JobId], timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut r = self.lock();
        while !jobs.iter().any(|j| r.done.contains_key(j)) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            r = self
                .results
                .1
                .wait_timeout(r, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

fn run(
    rx: Receiver<Job>,
    shared: Arc<TierShared>,
    demotions: Arc<DemoteProgress>,
    results: Arc<(Mutex<Results>, Condvar)>,
) {
    for job in rx {
        let (id, job) = match job {
            Job::Load(id, job) => (id, job),
            Job::Probe(p) => {
                demotions.wait_until(p.demote_ticket);
                let counts = std::panic::catch_unwind(AssertUnwindSafe(|| probe(&shared, &p.keys)))
                    .unwrap_or_else(|_| ProbeCounts {
                        per_store: vec![0; shared.stores.len()],
                        missing: p.keys.len() as u32,
                    });
                (p.reply)(counts);
                continue;
            }
        };
        if results
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .discarded
            .remove(&id)
        {
            continue;
        }
        demotions.wait_until(job.demote_ticket);
        // A store that panics yields an empty result (the request recomputes), never a request
        // waiting forever for its prefetch.
        let payloads = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let keys = tier_keys(
                &job.ns,
                &job.tokens,
                shared.block_size,
                job.first_block,
                job.max_blocks,
            );
            let plan = shared.plan(&keys);
            if plan.num_blocks() > 0 {
                shared.fetch(plan)
            } else {
                Vec::new()
            }
        }))
        .unwrap_or_default();
        let mut r = results.0.lock().unwrap_or_else(|e| e.into_inner());
        if !r.discarded.remove(&id) {
            r.done.insert(
                id,
                Loaded {
                    first_block: job.first_block,
                    payloads,
                },
            );
            results.1.notify_all();
        }
    }
}

/// Counts `keys` by the first store holding each (a store that errs holds nothing).
fn probe(shared: &TierShared, keys: &[TierKey]) -> ProbeCounts {
    let mut counts = ProbeCounts {
        per_store: vec![0; shared.stores.len()],
        missing: 0,
    };
    for key in keys {
        let chain = std::slice::from_ref(key);
        match shared
            .stores
            .iter()
            .position(|s| s.contains_prefix(chain).unwrap_or(0) > 0)
        {
            Some(i) => counts.per_store[i] += 1,
            None => counts.missing += 1,
        }
    }
    counts
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Closing the channel ends the thread after the job in hand.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
