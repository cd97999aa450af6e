//! The engine side of the storage tiers: which blocks are written where (on eviction, or on
//! publish), which tier hits are worth loading (the cost model), fetching and validating tier
//! objects, prefetch bookkeeping per request, and the engine's tier counters.
//!
//! Owns the tier stores (opened from `EngineConfig::tiers`) and the namespace root of every
//! published block (tier keys need it; cache events only carry the chain key). Never touches the
//! block table or the K/V memory itself: `core.rs` allocates blocks and writes the bytes this
//! module returns, and hands it the bytes of blocks to write. All tier I/O is off the engine
//! thread: writes on the demotion thread (`demoter.rs`), lookups and reads on the loader thread
//! (`loader.rs`), which first waits for the writes issued before the lookup, so what a lookup
//! finds never depends on the writer's timing.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cache::{BlockId, BlockKey, NamespaceKey};
use tier::{TierKey, TierStore};

use crate::demoter::Demoter;
use crate::loader::{JobId, LoadJob, Loaded, Loader, ProbeCounts, ProbeJob};
use crate::sequence::SeqKey;
use crate::tier_codec::TierCodec;

pub use tier::{TierKind, TierStats, LOAD_LATENCY_BUCKETS_US};

#[cfg(test)]
use crate::config::TierLoadPolicy;
use crate::config::TieringConfig;
pub use crate::tier_cost::TierCounters;
#[cfg(test)]
use crate::tier_cost::{load_is_faster, PROBE_EVERY};
use crate::tier_cost::{CostState, Ewma, TierShared, MIN_PREFILL_SAMPLE_TOKENS};

/// One tier as exported: its kind, the store's own counters and the engine's.
#[derive(Debug, Clone, PartialEq)]
pub struct TierSnapshot {
    pub kind: TierKind,
    /// Codec id the tier stores blocks in (the pool's, or its `codec:` setting).
    pub codec: String,
    /// Blocks loaded back may differ from those stored (the tier keeps another codec than the
    /// pool's; the cache namespace says so).
    pub lossy: bool,
    pub stats: TierStats,
    pub engine: TierCounters,
}

/// Everything the engine exports about its tiers (empty `tiers` when none are configured).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TieringSnapshot {
    pub tiers: Vec<TierSnapshot>,
    /// Demotions go to every tier (`true`) or only the first (`false`, write-back).
    pub write_through: bool,
    /// Measured prefill speed (EWMA, tokens/s), once measured.
    pub prefill_tokens_per_s: Option<f64>,
    /// Evicted blocks not demoted because their namespace was unknown (published outside the
    /// engine's bookkeeping; expected 0).
    pub unknown_namespace: u64,
    /// Blocks are written to the tiers when first computed (`true`), not only on eviction.
    pub write_on_publish: bool,
    /// Tier lookups started for requests (on submission, or on admission when none was usable).
    pub prefetches: u64,
    /// Prefetches started again because the active pool lost blocks while one was in flight.
    pub refetches: u64,
    /// Engine steps that found nothing to run but a prefetch in flight (and waited for it).
    pub prefetch_wait_steps: u64,
    /// Tier lookups abandoned after the lookup timeout (their requests recomputed).
    pub lookup_timeouts: u64,
    /// Blocks not written to the tiers because the write queue was full.
    pub dropped_writes: u64,
}

/// A request's tier lookup: in flight, or done and waiting for the request's admission.
enum Prefetch {
    Pending {
        job: JobId,
        reserved_bytes: usize,
        since: Instant,
    },
    Ready(Loaded),
}

/// What admission finds in the tiers for a request, beyond the active pool's match.
pub(crate) enum TierExtension {
    /// No lookup result (none started, or its result was used already).
    None,
    /// A lookup is in flight: admit the request later.
    Pending,
    /// Done: blocks `first_block..first_block + payloads.len()` of the prompt's chain.
    Ready(Loaded),
    /// The lookup took longer than the lookup timeout and was abandoned: admit the request
    /// with what the active pool holds (and start no new lookup for it).
    TimedOut,
}

/// The scheduler's narrow view of the storage tiers: finished lookups, nothing else.
pub(crate) trait TierMatch {
    /// A new step (resets how long admissions may wait for lookups in flight).
    fn begin_step(&mut self);
    /// Takes the finished lookup of `id`, if any (may wait briefly for one in flight).
    fn extend_match(&mut self, id: SeqKey) -> TierExtension;
    /// Gives a taken result back (the request could not be admitted now after all).
    fn put_back(&mut self, id: SeqKey, loaded: Loaded);
}

impl TierMatch for Tiering {
    fn begin_step(&mut self) {
        Tiering::begin_step(self);
    }

    fn extend_match(&mut self, id: SeqKey) -> TierExtension {
        self.take_prefetch(id)
    }

    fn put_back(&mut self, id: SeqKey, loaded: Loaded) {
        Tiering::put_back(self, id, loaded);
    }
}

/// How long a step with nothing to run waits for an in-flight prefetch before returning.
const PREFETCH_WAIT: Duration = Duration::from_millis(20);

pub(crate) struct Tiering {
    shared: Arc<TierShared>,
    write_through: bool,
    write_on_publish: bool,
    /// Namespace root of each published block, by block index (`None`: not published by us).
    block_ns: Vec<Option<[u8; 32]>>,
    unknown_namespace: u64,
    demoter: Demoter,
    loader: Loader,
    prefetches: HashMap<SeqKey, Prefetch>,
    /// Upper bound of the bytes held by pending and ready prefetches.
    reserved_bytes: usize,
    prefetch_max_bytes: usize,
    num_prefetches: u64,
    num_refetches: u64,
    prefetch_wait_steps: u64,
    /// How long one step's admissions may wait in all for prefetches in flight.
    admission_wait: Duration,
    /// What is left of this step's `admission_wait`.
    grace_left: Duration,
    /// A lookup pending longer than this is abandoned: its request recomputes.
    lookup_timeout: Duration,
    /// Requests whose lookup was abandoned (no new lookup is started for them).
    timed_out: HashSet<SeqKey>,
    lookup_timeouts: u64,
}

impl Tiering {
    /// Tiers over `stores` (in lookup order) for a pool of `num_blocks` blocks of `block_size`
    /// tokens, `block_bytes` each, `codecs[i]` saying how `stores[i]` holds them.
    pub fn new(
        stores: Vec<Arc<dyn TierStore>>,
        cfg: &TieringConfig,
        num_blocks: usize,
        block_size: usize,
        block_bytes: usize,
        codecs: Vec<TierCodec>,
    ) -> Tiering {
        let policy = cfg.load_policy;
        let n = stores.len();
        let demoter = Demoter::new(
            stores.clone(),
            block_size,
            codecs.clone(),
            cfg.max_queued_write_bytes,
            cfg.encode_deferral,
        );
        let shared = Arc::new(TierShared {
            stores,
            policy,
            block_size,
            block_bytes,
            codecs,
            state: Mutex::new(CostState {
                counters: vec![TierCounters::default(); n],
                bandwidth: vec![Ewma::default(); n],
                declines_in_row: vec![0; n],
                prefill: Ewma::default(),
            }),
        });
        let loader = Loader::new(shared.clone(), demoter.progress());
        Tiering {
            shared,
            write_through: cfg.write_through,
            write_on_publish: cfg.write_on_publish,
            block_ns: vec![None; num_blocks],
            unknown_namespace: 0,
            demoter,
            loader,
            prefetches: HashMap::new(),
            reserved_bytes: 0,
            prefetch_max_bytes: cfg.prefetch_max_bytes,
            num_prefetches: 0,
            num_refetches: 0,
            prefetch_wait_steps: 0,
            admission_wait: cfg.admission_wait,
            grace_left: cfg.admission_wait,
            lookup_timeout: cfg.lookup_timeout,
            timed_out: HashSet::new(),
            lookup_timeouts: 0,
        }
    }

    /// Block `block` was published under chain key `key` in namespace `root`: remembers the
    /// namespace; returns the tier key to write the block under when blocks are written on
    /// publish and `write` is set (not for blocks just loaded from a tier).
    pub fn published(
        &mut self,
        key: BlockKey,
        block: BlockId,
        root: BlockKey,
        write: bool,
    ) -> Option<TierKey> {
        if let Some(slot) = self.block_ns.get_mut(block.index()) {
            *slot = Some(root.0);
        }
        (write && self.write_on_publish).then(|| TierKey::new(root.0, key.0))
    }

    /// A block was unpublished without demotion (flush), or published outside any namespace.
    pub fn forget(&mut self, block: BlockId) {
        if let Some(slot) = self.block_ns.get_mut(block.index()) {
            *slot = None;
        }
    }

    /// Block `block` (chain key `key`) was evicted from the active pool: returns the tier key
    /// to demote it under (`None` when it was written on publish already, or its namespace is
    /// unknown).
    pub fn evicted(&mut self, key: BlockKey, block: BlockId) -> Option<TierKey> {
        match self.block_ns.get_mut(block.index()).and_then(Option::take) {
            Some(_) if self.write_on_publish => None,
            Some(root) => Some(TierKey::new(root, key.0)),
            None => {
                self.unknown_namespace += 1;
                None
            }
        }
    }

    /// Queues blocks (their bytes copied already: the blocks may be reused at once) for the
    /// first tier, or every tier with write-through. The writes happen on the demotion thread;
    /// errors are counted.
    pub fn write(&mut self, blocks: Vec<(TierKey, Vec<u8>)>) {
        let targets = if self.write_through {
            self.shared.stores.len()
        } else {
            1
        };
        self.demoter.submit(blocks, targets);
    }

    /// Seconds to load `bytes` from the fastest tier at its measured bandwidth (`None` before
    /// any load was measured).
    pub fn best_load_seconds(&self, bytes: usize) -> Option<f64> {
        let st = self.shared.lock();
        st.bandwidth
            .iter()
            .filter_map(|b| b.0)
            .max_by(f64::total_cmp)
            .map(|bw| bytes as f64 / bw)
    }

    /// The kinds of the tiers [`Tiering::write`] sends blocks to (the first, or all with
    /// write-through).
    pub fn write_target_kinds(&self) -> Vec<tier::TierKind> {
        let n = if self.write_through {
            self.shared.stores.len()
        } else {
            1
        };
        self.shared
            .stores
            .iter()
            .take(n)
            .map(|s| s.kind())
            .collect()
    }

    /// Keys each tier dropped on its own since the last call (evicted for its byte budget,
    /// expired by its TTL), with the tier's kind, for the router announcements.
    pub fn take_dropped(&self) -> Vec<(tier::TierKind, Vec<TierKey>)> {
        self.shared
            .stores
            .iter()
            .map(|s| (s.kind(), s.take_dropped()))
            .filter(|(_, keys)| !keys.is_empty())
            .collect()
    }

    /// A forward pass computed `num_tokens` tokens, `num_prefill` of them prefill, in `elapsed`.
    pub fn observe_forward(&mut self, num_tokens: usize, num_prefill: usize, elapsed: Duration) {
        if num_prefill >= MIN_PREFILL_SAMPLE_TOKENS {
            self.shared
                .lock()
                .prefill
                .observe(num_tokens as f64 / elapsed.as_secs_f64().max(1e-9));
        }
    }

    /// Starts the tier lookup of request `id`: blocks `first_block..max_blocks` of `tokens`'
    /// chain in `ns`, loaded in the background. Unless `force`, declines (returns `false`) when
    /// the prefetches already held would exceed the byte cap; admission then forces it.
    pub fn prefetch(
        &mut self,
        id: SeqKey,
        ns: NamespaceKey,
        tokens: &[u32],
        first_block: usize,
        max_blocks: usize,
        force: bool,
    ) -> bool {
        if first_block >= max_blocks {
            return false;
        }
        let bytes_per_block = self.shared.block_bytes.max(1);
        let mut max_load_blocks = max_blocks - first_block;
        let room = self.prefetch_max_bytes.saturating_sub(self.reserved_bytes) / bytes_per_block;
        if !force {
            if room == 0 {
                return false;
            }
            max_load_blocks = max_load_blocks.min(room);
        }
        self.cancel_prefetch(id);
        let reserved_bytes = max_load_blocks * bytes_per_block;
        let job = self.loader.submit(LoadJob {
            ns,
            tokens: tokens[..max_blocks * self.shared.block_size].to_vec(),
            first_block,
            max_blocks: first_block + max_load_blocks,
            demote_ticket: self.demoter.ticket(),
        });
        self.reserved_bytes += reserved_bytes;
        self.num_prefetches += 1;
        self.prefetches.insert(
            id,
            Prefetch::Pending {
                job,
                reserved_bytes,
                since: Instant::now(),
            },
        );
        true
    }

    /// Like [`Tiering::prefetch`] (forced) for a prefetch that became stale: the active pool
    /// lost blocks while it was in flight.
    pub fn refetch(
        &mut self,
        id: SeqKey,
        ns: NamespaceKey,
        tokens: &[u32],
        first_block: usize,
        max_blocks: usize,
    ) {
        self.num_refetches += 1;
        self.prefetch(id, ns, tokens, first_block, max_blocks, true);
    }

    /// A new engine step: resets the time admission may wait for nearly finished prefetches.
    pub fn begin_step(&mut self) {
        self.grace_left = self.admission_wait;
    }

    /// Takes the prefetch of `id` if it is done; a pending one is waited for while this step's
    /// grace lasts (a RAM-tier lookup takes microseconds: deferring the request a whole step for
    /// it would cost more), and otherwise stays pending.
    pub fn take_prefetch(&mut self, id: SeqKey) -> TierExtension {
        if self.timed_out.contains(&id) {
            return TierExtension::TimedOut;
        }
        if let Some(Prefetch::Pending { job, since, .. }) = self.prefetches.get(&id) {
            if since.elapsed() >= self.lookup_timeout && !self.loader.is_done(*job) {
                // The tiers stopped answering: recompute rather than wait for them.
                self.cancel_prefetch(id);
                self.timed_out.insert(id);
                self.lookup_timeouts += 1;
                return TierExtension::TimedOut;
            }
        }
        let job = match self.prefetches.get(&id) {
            Some(Prefetch::Pending { job, .. }) if !self.grace_left.is_zero() => *job,
            _ => return self.try_take_prefetch(id),
        };
        if self.loader.is_done(job) {
            return self.try_take_prefetch(id);
        }
        let start = Instant::now();
        self.loader.wait_any(&[job], self.grace_left);
        self.grace_left = self.grace_left.saturating_sub(start.elapsed());
        self.try_take_prefetch(id)
    }

    /// Takes the prefetch of `id` if it is done (a pending one stays pending).
    fn try_take_prefetch(&mut self, id: SeqKey) -> TierExtension {
        let job = match self.prefetches.get(&id) {
            None => return TierExtension::None,
            Some(Prefetch::Ready(_)) => None,
            Some(Prefetch::Pending { job, .. }) => Some(*job),
        };
        if let Some(job) = job {
            let Some(loaded) = self.loader.take(job) else {
                return TierExtension::Pending;
            };
            if let Some(Prefetch::Pending { reserved_bytes, .. }) = self.prefetches.remove(&id) {
                self.reserved_bytes -= reserved_bytes;
            }
            return TierExtension::Ready(loaded);
        }
        match self.prefetches.remove(&id) {
            Some(Prefetch::Ready(l)) => {
                self.reserved_bytes -= l.num_bytes();
                TierExtension::Ready(l)
            }
            _ => unreachable!("checked above"),
        }
    }

    /// Gives a taken result back (the request could not be admitted now after all).
    pub fn put_back(&mut self, id: SeqKey, loaded: Loaded) {
        self.reserved_bytes += loaded.num_bytes();
        self.prefetches.insert(id, Prefetch::Ready(loaded));
    }

    /// Drops the prefetch of `id` (replaced, or its lookup abandoned).
    pub fn cancel_prefetch(&mut self, id: SeqKey) {
        match self.prefetches.remove(&id) {
            Some(Prefetch::Pending {
                job,
                reserved_bytes,
                ..
            }) => {
                self.loader.discard(job);
                self.reserved_bytes -= reserved_bytes;
            }
            Some(Prefetch::Ready(l)) => self.reserved_bytes -= l.num_bytes(),
            None => {}
        }
    }

    /// Forgets request `id` (finished or cancelled): drops its prefetch.
    pub fn forget_request(&mut self, id: SeqKey) {
        self.cancel_prefetch(id);
        self.timed_out.remove(&id);
    }

    /// A step found nothing to run: waits (briefly) until an in-flight lookup completes.
    pub fn wait_for_prefetch(&mut self) {
        let jobs: Vec<JobId> = self
            .prefetches
            .values()
            .filter_map(|p| match p {
                Prefetch::Pending { job, .. } => Some(*job),
                Prefetch::Ready(_) => None,
            })
            .collect();
        if !jobs.is_empty() {
            self.prefetch_wait_steps += 1;
            self.loader.wait_any(&jobs, PREFETCH_WAIT);
        }
    }

    /// Plans and fetches blocks `first_block..max_blocks` of `tokens`' chain now, on the calling
    /// thread, after the queued writes (unit tests; the engine prefetches).
    #[cfg(test)]
    pub fn load_now(
        &mut self,
        ns: &NamespaceKey,
        tokens: &[u32],
        first_block: usize,
        max_blocks: usize,
    ) -> Vec<Vec<u8>> {
        self.demoter.barrier();
        let keys =
            crate::loader::tier_keys(ns, tokens, self.shared.block_size, first_block, max_blocks);
        let plan = self.shared.plan(&keys);
        self.shared.fetch(plan)
    }

    /// Finds, on the loader thread after the writes queued so far, the first tier holding each
    /// of `keys`; `reply` gets the counts per tier kind (lookup order) and the keys no tier
    /// holds. Reads no payload.
    pub fn locate(
        &mut self,
        keys: Vec<TierKey>,
        reply: impl FnOnce(Vec<(TierKind, u32)>, u32) + Send + 'static,
    ) {
        let kinds: Vec<TierKind> = self.shared.stores.iter().map(|s| s.kind()).collect();
        self.loader.probe(ProbeJob {
            keys,
            demote_ticket: self.demoter.ticket(),
            reply: Box::new(move |c: ProbeCounts| {
                let per_tier = kinds
                    .into_iter()
                    .zip(c.per_store.into_iter().chain(std::iter::repeat(0)))
                    .collect();
                reply(per_tier, c.missing)
            }),
        });
    }

    /// The engine has work (`true`: lossy tier encodes wait, see [`crate::encode_gate`]) or
    /// has gone idle.
    pub fn set_busy(&self, busy: bool) {
        self.demoter.gate().set_busy(busy);
    }

    /// Write jobs finished so far (written or failed).
    pub fn writes_done(&self) -> u64 {
        self.demoter.progress().done()
    }

    /// Waits until every queued write is done (or failed).
    pub fn wait_for_demotions(&self) {
        self.demoter.barrier();
    }

    /// What the tiers report now: writes still queued are not counted yet (never waits for
    /// them; [`Tiering::wait_for_demotions`] does).
    pub fn snapshot(&self) -> TieringSnapshot {
        let st = self.shared.lock();
        TieringSnapshot {
            tiers: self
                .shared
                .stores
                .iter()
                .zip(&st.counters)
                .zip(&st.bandwidth)
                .zip(self.demoter.counts.iter())
                .zip(&self.shared.codecs)
                .map(|((((store, counters), bw), d), codec)| TierSnapshot {
                    kind: store.kind(),
                    codec: codec.id.clone(),
                    lossy: codec.is_lossy(),
                    stats: store.stats(),
                    engine: TierCounters {
                        load_bytes_per_s: bw.0,
                        demoted_blocks: d.demoted_blocks.load(Ordering::Relaxed),
                        demote_errors: d.demote_errors.load(Ordering::Relaxed),
                        already_held_blocks: d.already_held_blocks.load(Ordering::Relaxed),
                        busy_encoded_blocks: d.busy_encoded_blocks.load(Ordering::Relaxed),
                        ..counters.clone()
                    },
                })
                .collect(),
            write_through: self.write_through,
            prefill_tokens_per_s: st.prefill.0,
            unknown_namespace: self.unknown_namespace,
            write_on_publish: self.write_on_publish,
            prefetches: self.num_prefetches,
            refetches: self.num_refetches,
            prefetch_wait_steps: self.prefetch_wait_steps,
            lookup_timeouts: self.lookup_timeouts,
            dropped_writes: self.demoter.queue.dropped_blocks.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache::{Namespace, TenantId};
    use tier::{FaultStore, RamConfig, RamStore};

    fn ram() -> Arc<dyn TierStore> {
        Arc::new(RamStore::new(RamConfig {
            max_bytes: 1 << 20,
            compression: tier::Compression::None,
        }))
    }

    /// 8 blocks of 2 tokens, 4 bytes each, f16.
    fn tiering_with(
        stores: Vec<Arc<dyn TierStore>>,
        policy: TierLoadPolicy,
        on_publish: bool,
        prefetch_max_bytes: usize,
    ) -> Tiering {
        let cfg = TieringConfig {
            load_policy: policy,
            write_on_publish: on_publish,
            prefetch_max_bytes,
            ..TieringConfig::default()
        };
        let codecs = vec![TierCodec::as_is("f16".into(), 4); stores.len()];
        Tiering::new(stores, &cfg, 8, 2, 4, codecs)
    }

    fn tiering(stores: Vec<Arc<dyn TierStore>>, policy: TierLoadPolicy) -> Tiering {
        tiering_with(stores, policy, false, 1 << 20)
    }

    /// Publishes `block` under `key` in `root`, evicts it and demotes it with `bytes`.
    fn demote(t: &mut Tiering, key: BlockKey, block: BlockId, root: BlockKey, bytes: Vec<u8>) {
        assert_eq!(t.published(key, block, root, true), None, "write-back");
        let tier_key = t.evicted(key, block).expect("a published block is demoted");
        t.write(vec![(tier_key, bytes)]);
    }

    #[test]
    fn cost_model_compares_load_and_recompute_time() {
        // 1 block = 1000 bytes, 16 tokens. 1 MB/s: 1 ms; 1000 tok/s: 16 ms → load.
        assert!(load_is_faster(1, 1000, 16, Some(1e6), Some(1e3)));
        // 1 kB/s: 1 s vs 16 ms → recompute.
        assert!(!load_is_faster(1, 1000, 16, Some(1e3), Some(1e3)));
        assert!(
            load_is_faster(1, 1000, 16, None, Some(1e3)),
            "unmeasured: load"
        );
        assert!(
            load_is_faster(1, 1000, 16, Some(1e3), None),
            "unmeasured: load"
        );
    }

    #[test]
    fn demoted_blocks_are_planned_and_fetched_in_chain_order_across_tiers() {
        let (a, b) = (ram(), ram());
        let mut t = tiering(vec![a.clone(), b.clone()], TierLoadPolicy::Always);
        let ns = Namespace::for_tenant(TenantId(1)).key();
        let tokens: Vec<u32> = (0..9).collect();
        let keys = cache::key::chain_keys(&ns, &tokens, 2, 4);
        // Blocks 0 and 1 in tier 0; block 2 only in tier 1 (write-back into tier 0 first).
        for (i, key) in keys.iter().take(2).enumerate() {
            demote(&mut t, *key, BlockId(i as u32), ns.root(), vec![i as u8; 4]);
        }
        let mut t1 = tiering(vec![b.clone()], TierLoadPolicy::Always);
        demote(&mut t1, keys[2], BlockId(2), ns.root(), vec![9; 4]);
        // Another engine's writes: `t`'s lookups only wait for its own demotions.
        t1.wait_for_demotions();
        let got = t.load_now(&ns, &tokens, 0, 4);
        assert_eq!(got, vec![vec![0; 4], vec![1; 4], vec![9; 4]]);
        let snap = t.snapshot();
        assert_eq!(snap.tiers[0].engine.hit_tokens, 4);
        assert_eq!(snap.tiers[1].engine.hit_tokens, 2);
        assert_eq!(snap.tiers[0].engine.demoted_blocks, 2);
        assert_eq!(
            snap.tiers[1].engine.demoted_blocks, 0,
            "write-back: first tier only"
        );
        // Another tenant's namespace finds nothing (positive control above).
        let other = Namespace::for_tenant(TenantId(2)).key();
        assert!(t.load_now(&other, &tokens, 0, 4).is_empty());
        // Starting past the demoted blocks finds nothing more.
        assert!(t.load_now(&ns, &tokens, 3, 4).is_empty());
    }

    #[test]
    fn write_on_publish_writes_once_and_never_on_eviction() {
        let store = ram();
        let mut t = tiering_with(vec![store.clone()], TierLoadPolicy::Always, true, 1 << 20);
        let ns = Namespace::for_tenant(TenantId(1)).key();
        let tokens: Vec<u32> = (0..5).collect();
        let keys = cache::key::chain_keys(&ns, &tokens, 2, 2);
        let k0 = t.published(keys[0], BlockId(0), ns.root(), true).unwrap();
        // A block loaded from a tier is not written back.
        assert_eq!(t.published(keys[1], BlockId(1), ns.root(), false), None);
        t.write(vec![(k0, vec![5; 4])]);
        assert_eq!(t.evicted(keys[0], BlockId(0)), None, "written already");
        assert_eq!(t.load_now(&ns, &tokens, 0, 2), vec![vec![5; 4]]);
        assert_eq!(t.snapshot().tiers[0].engine.demoted_blocks, 1);
    }

    #[test]
    fn prefetch_runs_in_the_background_and_is_taken_once() {
        let mut t = tiering(vec![ram()], TierLoadPolicy::Always);
        let ns = Namespace::for_tenant(TenantId(1)).key();
        let tokens: Vec<u32> = (0..9).collect();
        let keys = cache::key::chain_keys(&ns, &tokens, 2, 4);
        for (i, key) in keys.iter().take(3).enumerate() {
            demote(&mut t, *key, BlockId(i as u32), ns.root(), vec![i as u8; 4]);
        }
        let id = SeqKey(crate::RequestId(7), 0);
        assert!(t.prefetch(id, ns, &tokens, 1, 4, false));
        let loaded = loop {
            match t.take_prefetch(id) {
                TierExtension::Ready(l) => break l,
                TierExtension::Pending => t.wait_for_prefetch(),
                TierExtension::None | TierExtension::TimedOut => panic!("the prefetch was lost"),
            }
        };
        // Blocks 1 and 2 (block 0 is assumed in the active pool; block 3 was never written).
        assert_eq!(loaded.first_block, 1);
        assert_eq!(loaded.payloads, vec![vec![1; 4], vec![2; 4]]);
        assert!(matches!(t.take_prefetch(id), TierExtension::None));
        // Put back (admission failed) and cancelled: the reservation returns to zero.
        t.put_back(id, loaded);
        assert_eq!(t.reserved_bytes, 8);
        t.cancel_prefetch(id);
        assert_eq!(t.reserved_bytes, 0);
        assert_eq!(t.snapshot().prefetches, 1);
    }

    #[test]
    fn prefetches_beyond_the_byte_cap_wait_for_admission() {
        // Room for two blocks of 4 bytes.
        let mut t = tiering_with(vec![ram()], TierLoadPolicy::Always, false, 8);
        let ns = Namespace::for_tenant(TenantId(1)).key();
        let tokens: Vec<u32> = (0..9).collect();
        let (a, b) = (
            SeqKey(crate::RequestId(1), 0),
            SeqKey(crate::RequestId(2), 0),
        );
        assert!(t.prefetch(a, ns, &tokens, 0, 2, false));
        assert!(!t.prefetch(b, ns, &tokens, 0, 2, false), "over the cap");
        assert!(
            t.prefetch(b, ns, &tokens, 0, 2, true),
            "admission forces it"
        );
        t.cancel_prefetch(a);
        t.cancel_prefetch(b);
        assert_eq!(t.reserved_bytes, 0);
    }

    #[test]
    fn failing_tiers_and_wrong_payloads_become_misses() {
        let inner = RamStore::new(RamConfig {
            max_bytes: 1 << 20,
            compression: tier::Compression::None,
        });
        let faulty = Arc::new(FaultStore::new(inner));
        let mut t = tiering(
            vec![faulty.clone() as Arc<dyn TierStore>],
            TierLoadPolicy::Always,
        );
        let ns = Namespace::for_tenant(TenantId(1)).key();
        let tokens: Vec<u32> = (0..5).collect();
        let keys = cache::key::chain_keys(&ns, &tokens, 2, 2);
        // Block 1 has the wrong length for this engine.
        demote(&mut t, keys[0], BlockId(0), ns.root(), vec![1; 4]);
        demote(&mut t, keys[1], BlockId(1), ns.root(), vec![1; 5]);
        assert_eq!(t.load_now(&ns, &tokens, 0, 2), vec![vec![1; 4]]);
        assert_eq!(t.snapshot().tiers[0].engine.rejected, 1);
        faulty.set_failing(true);
        assert!(t.load_now(&ns, &tokens, 0, 2).is_empty());
        assert!(t.snapshot().tiers[0].engine.errors >= 1);
    }

    /// A store whose every call panics (a bug in a store must not hang requests).
    struct PanickingStore;

    impl TierStore for PanickingStore {
        fn kind(&self) -> TierKind {
            TierKind::Ram
        }
        fn contains_prefix(&self, _: &[TierKey]) -> Result<usize, tier::TierError> {
            panic!("injected: contains_prefix")
        }
        fn get_many(
            &self,
            _: &[TierKey],
        ) -> Result<Vec<Option<tier::StoredBlock>>, tier::TierError> {
            panic!("injected: get_many")
        }
        fn put_many(&self, _: &[tier::BlockRef<'_>]) -> Result<(), tier::TierError> {
            panic!("injected: put_many")
        }
        fn remove(&self, _: &[TierKey]) -> Result<(), tier::TierError> {
            panic!("injected: remove")
        }
        fn stats(&self) -> TierStats {
            TierStats::default()
        }
    }

    #[test]
    fn a_panicking_store_fails_writes_and_prefetches_but_never_hangs() {
        let mut t = tiering(vec![Arc::new(PanickingStore)], TierLoadPolicy::Always);
        let ns = Namespace::for_tenant(TenantId(1)).key();
        let tokens: Vec<u32> = (0..9).collect();
        let keys = cache::key::chain_keys(&ns, &tokens, 2, 4);
        demote(&mut t, keys[0], BlockId(0), ns.root(), vec![1; 4]);
        t.wait_for_demotions();
        assert_eq!(t.snapshot().tiers[0].engine.demote_errors, 1);
        let id = SeqKey(crate::RequestId(3), 0);
        assert!(t.prefetch(id, ns, &tokens, 0, 4, true));
        let loaded = loop {
            match t.take_prefetch(id) {
                TierExtension::Ready(l) => break l,
                TierExtension::Pending => t.wait_for_prefetch(),
                TierExtension::None | TierExtension::TimedOut => panic!("the prefetch was lost"),
            }
        };
        assert!(loaded.payloads.is_empty(), "nothing loaded: recompute");
    }

    #[test]
    fn declining_tier_is_probed_periodically() {
        let t = tiering(vec![ram()], TierLoadPolicy::CostModel);
        {
            let mut st = t.shared.lock();
            st.bandwidth[0].observe(1.0); // 1 byte/s: hopeless
            st.prefill.observe(1e6);
        }
        let decisions: Vec<bool> = (0..PROBE_EVERY).map(|_| t.shared.decide(0, 1)).collect();
        assert!(decisions[..PROBE_EVERY as usize - 1].iter().all(|d| !d));
        assert!(decisions[PROBE_EVERY as usize - 1]);
        let st = t.shared.lock();
        let c = &st.counters[0];
        assert_eq!(c.recompute_decisions, u64::from(PROBE_EVERY) - 1);
        assert_eq!((c.load_decisions, c.probe_loads), (1, 1));
    }
}
