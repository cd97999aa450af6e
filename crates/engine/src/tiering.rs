//! The engine side of the storage tiers: which evicted blocks are demoted where, which tier
//! hits are worth loading (the cost model), fetching and validating tier objects, and the
//! engine's tier counters.
//!
//! Owns the tier stores (opened from `EngineConfig::tiers`) and the namespace root of every
//! published block (tier keys need it; cache events only carry the chain key). Never touches the
//! block table or the K/V memory itself: `core.rs` allocates blocks and writes the bytes this
//! module returns, and hands it the bytes of evicted blocks. Demotion writes run on a background
//! thread (`demoter.rs`); lookups and loads are synchronous on the engine thread and first wait
//! for queued demotions, so what a lookup finds never depends on the writer's timing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cache::{BlockId, BlockKey, NamespaceKey};
use tier::{TierKey, TierStore};

use crate::demoter::Demoter;
use std::sync::atomic::Ordering;

pub use tier::{TierKind, TierStats, LOAD_LATENCY_BUCKETS_US};

/// When a tier hit is loaded instead of recomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TierLoadPolicy {
    /// Load only when the measured load bandwidth predicts it is faster than recomputing at the
    /// measured prefill speed (optimistic until both are measured; a declining tier is re-probed
    /// every [`PROBE_EVERY`] declines so its estimate cannot go stale).
    #[default]
    CostModel,
    /// Always load hits (deterministic; tests and benchmarks).
    Always,
}

/// A tier that keeps losing the cost comparison is loaded anyway once per this many declines.
pub const PROBE_EVERY: u32 = 32;
/// Weight of a new observation in the exponentially weighted moving averages.
const EWMA_ALPHA: f64 = 0.2;
/// Forward passes with fewer prefill tokens than this do not update the prefill-speed estimate.
const MIN_PREFILL_SAMPLE_TOKENS: usize = 32;

/// The engine's counters for one tier (the store keeps its own [`TierStats`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TierCounters {
    /// Prompt tokens served from this tier (loaded into the active pool).
    pub hit_tokens: u64,
    /// Blocks loaded from this tier.
    pub loaded_blocks: u64,
    /// `get_prefix` calls made on admission.
    pub load_calls: u64,
    /// Hits the cost model chose to load (probes included).
    pub load_decisions: u64,
    /// Hits the cost model chose to recompute instead.
    pub recompute_decisions: u64,
    /// Loads made although the cost model declined, to re-measure the tier.
    pub probe_loads: u64,
    /// Calls that failed (tier skipped, request recomputes).
    pub errors: u64,
    /// Verified objects the engine still rejected (wrong codec, token count or byte length).
    pub rejected: u64,
    /// Blocks written to this tier on eviction from the active pool.
    pub demoted_blocks: u64,
    /// `put_many` calls that failed (those blocks are dropped).
    pub demote_errors: u64,
    /// Measured load bandwidth (EWMA, bytes/s), once measured.
    pub load_bytes_per_s: Option<f64>,
}

/// One tier as exported: its kind, the store's own counters and the engine's.
#[derive(Debug, Clone, PartialEq)]
pub struct TierSnapshot {
    pub kind: TierKind,
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
}

/// Which blocks of a prompt to fetch from which tier: consecutive segments of the chain.
#[derive(Debug, Default)]
pub(crate) struct TierPlan {
    segments: Vec<(usize, Vec<TierKey>)>,
}

impl TierPlan {
    pub fn num_blocks(&self) -> usize {
        self.segments.iter().map(|(_, k)| k.len()).sum()
    }
}

/// Exponentially weighted moving average.
#[derive(Debug, Clone, Copy, Default)]
struct Ewma(Option<f64>);

impl Ewma {
    fn observe(&mut self, x: f64) {
        if !x.is_finite() || x <= 0.0 {
            return;
        }
        self.0 = Some(match self.0 {
            None => x,
            Some(old) => old + EWMA_ALPHA * (x - old),
        });
    }
}

/// The cost model: is loading `num_blocks` blocks at `load_bytes_per_s` faster than recomputing
/// their tokens at `prefill_tokens_per_s`? Unmeasured rates answer `true` (measure by loading).
pub fn load_is_faster(
    num_blocks: usize,
    block_bytes: usize,
    block_size: usize,
    load_bytes_per_s: Option<f64>,
    prefill_tokens_per_s: Option<f64>,
) -> bool {
    match (load_bytes_per_s, prefill_tokens_per_s) {
        (Some(bw), Some(tps)) => {
            let load_s = (num_blocks * block_bytes) as f64 / bw;
            let recompute_s = (num_blocks * block_size) as f64 / tps;
            load_s < recompute_s
        }
        _ => true,
    }
}

pub(crate) struct Tiering {
    stores: Vec<Arc<dyn TierStore>>,
    counters: Vec<TierCounters>,
    bandwidth: Vec<Ewma>,
    declines_in_row: Vec<u32>,
    prefill: Ewma,
    write_through: bool,
    policy: TierLoadPolicy,
    block_size: usize,
    block_bytes: usize,
    codec_id: String,
    /// Namespace root of each published block, by block index (`None`: not published by us).
    block_ns: Vec<Option<[u8; 32]>>,
    unknown_namespace: u64,
    demoter: Demoter,
}

impl Tiering {
    pub fn new(
        stores: Vec<Arc<dyn TierStore>>,
        write_through: bool,
        policy: TierLoadPolicy,
        num_blocks: usize,
        block_size: usize,
        block_bytes: usize,
        codec_id: String,
    ) -> Tiering {
        let n = stores.len();
        let demoter = Demoter::new(stores.clone(), block_size, codec_id.clone());
        Tiering {
            demoter,
            stores,
            counters: vec![TierCounters::default(); n],
            bandwidth: vec![Ewma::default(); n],
            declines_in_row: vec![0; n],
            prefill: Ewma::default(),
            write_through,
            policy,
            block_size,
            block_bytes,
            codec_id,
            block_ns: vec![None; num_blocks],
            unknown_namespace: 0,
        }
    }

    /// A block was published in namespace `root`.
    pub fn record_published(&mut self, block: BlockId, root: BlockKey) {
        if let Some(slot) = self.block_ns.get_mut(block.index()) {
            *slot = Some(root.0);
        }
    }

    /// A block was unpublished without demotion (flush).
    pub fn forget(&mut self, block: BlockId) {
        if let Some(slot) = self.block_ns.get_mut(block.index()) {
            *slot = None;
        }
    }

    /// Demotes evicted blocks: `bytes_of(block)` must still return the block's published bytes.
    /// Write-back puts to the first tier, write-through to every tier. Errors are counted.
    pub fn demote(
        &mut self,
        evicted: &[(BlockKey, BlockId)],
        bytes_of: impl Fn(BlockId) -> Vec<u8>,
    ) {
        let mut keyed = Vec::with_capacity(evicted.len());
        for &(key, block) in evicted {
            match self.block_ns.get_mut(block.index()).and_then(Option::take) {
                Some(root) => keyed.push((TierKey::new(root, key.0), bytes_of(block))),
                None => self.unknown_namespace += 1,
            }
        }
        let targets = if self.write_through {
            self.stores.len()
        } else {
            1
        };
        // The bytes are copied already; the writes happen on the demotion thread.
        self.demoter.submit(keyed, targets);
    }

    /// A forward pass computed `num_tokens` tokens, `num_prefill` of them prefill, in `elapsed`.
    pub fn observe_forward(&mut self, num_tokens: usize, num_prefill: usize, elapsed: Duration) {
        if num_prefill >= MIN_PREFILL_SAMPLE_TOKENS {
            self.prefill
                .observe(num_tokens as f64 / elapsed.as_secs_f64().max(1e-9));
        }
    }

    /// Plans which of the full blocks `first_block..max_blocks` of `tokens` (in `ns`) to load:
    /// tiers in order, each continuing the chain where the previous stopped. Asks only
    /// `contains_prefix` (no payload); a failing tier is skipped, a declined one ends the plan.
    pub fn plan(
        &mut self,
        ns: &NamespaceKey,
        tokens: &[u32],
        first_block: usize,
        max_blocks: usize,
    ) -> TierPlan {
        // A lookup must see every demotion issued before it.
        self.demoter.barrier();
        let mut plan = TierPlan::default();
        if first_block >= max_blocks || self.stores.is_empty() {
            return plan;
        }
        let root = ns.root().0;
        let keys: Vec<TierKey> = cache::key::chain_keys(ns, tokens, self.block_size, max_blocks)
            [first_block..]
            .iter()
            .map(|k| TierKey::new(root, k.0))
            .collect();
        let mut pos = 0;
        for tier in 0..self.stores.len() {
            if pos == keys.len() {
                break;
            }
            let present = match self.stores[tier].contains_prefix(&keys[pos..]) {
                Ok(n) => n.min(keys.len() - pos),
                Err(_) => {
                    self.counters[tier].errors += 1;
                    continue;
                }
            };
            if present == 0 {
                continue;
            }
            if !self.decide(tier, present) {
                break;
            }
            plan.segments
                .push((tier, keys[pos..pos + present].to_vec()));
            pos += present;
        }
        plan
    }

    fn decide(&mut self, tier: usize, num_blocks: usize) -> bool {
        let c = &mut self.counters[tier];
        if self.policy == TierLoadPolicy::Always
            || load_is_faster(
                num_blocks,
                self.block_bytes,
                self.block_size,
                self.bandwidth[tier].0,
                self.prefill.0,
            )
        {
            self.declines_in_row[tier] = 0;
            c.load_decisions += 1;
            return true;
        }
        self.declines_in_row[tier] += 1;
        if self.declines_in_row[tier] >= PROBE_EVERY {
            self.declines_in_row[tier] = 0;
            c.load_decisions += 1;
            c.probe_loads += 1;
            return true;
        }
        c.recompute_decisions += 1;
        false
    }

    /// Fetches a plan: the payloads of the leading run of blocks that arrived verified and fit
    /// this engine (codec, token count, byte length), in chain order. Stops at the first miss,
    /// error or rejection (the rest is recomputed); measures each tier's load bandwidth.
    pub fn fetch(&mut self, plan: TierPlan) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for (tier, keys) in plan.segments {
            let c = &mut self.counters[tier];
            c.load_calls += 1;
            let start = Instant::now();
            let got = match self.stores[tier].get_prefix(&keys) {
                Ok(got) => got,
                Err(_) => {
                    c.errors += 1;
                    return out;
                }
            };
            let elapsed = start.elapsed();
            let mut num_ok = 0;
            let mut bytes = 0;
            for block in got {
                if block.num_tokens as usize != self.block_size
                    || block.codec_id != self.codec_id
                    || block.payload.len() != self.block_bytes
                {
                    c.rejected += 1;
                    break;
                }
                bytes += block.payload.len();
                out.push(block.payload);
                num_ok += 1;
            }
            if bytes > 0 {
                self.bandwidth[tier].observe(bytes as f64 / elapsed.as_secs_f64().max(1e-9));
            }
            c.loaded_blocks += num_ok as u64;
            c.hit_tokens += (num_ok * self.block_size) as u64;
            if num_ok < keys.len() {
                break;
            }
        }
        out
    }

    /// Waits until every queued demotion is written (or failed).
    pub fn wait_for_demotions(&self) {
        self.demoter.barrier();
    }

    pub fn snapshot(&self) -> TieringSnapshot {
        // Report what has been written, not what is still queued.
        self.demoter.barrier();
        TieringSnapshot {
            tiers: self
                .stores
                .iter()
                .zip(&self.counters)
                .zip(&self.bandwidth)
                .zip(self.demoter.counts.iter())
                .map(|(((store, counters), bw), d)| TierSnapshot {
                    kind: store.kind(),
                    stats: store.stats(),
                    engine: TierCounters {
                        load_bytes_per_s: bw.0,
                        demoted_blocks: d.demoted_blocks.load(Ordering::Relaxed),
                        demote_errors: d.demote_errors.load(Ordering::Relaxed),
                        ..counters.clone()
                    },
                })
                .collect(),
            write_through: self.write_through,
            prefill_tokens_per_s: self.prefill.0,
            unknown_namespace: self.unknown_namespace,
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

    fn tiering(stores: Vec<Arc<dyn TierStore>>, policy: TierLoadPolicy) -> Tiering {
        Tiering::new(stores, false, policy, 8, 2, 4, "f16".into())
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
            t.record_published(BlockId(i as u32), ns.root());
            t.demote(&[(*key, BlockId(i as u32))], |blk| vec![blk.0 as u8; 4]);
        }
        let mut t1 = tiering(vec![b.clone()], TierLoadPolicy::Always);
        t1.record_published(BlockId(2), ns.root());
        t1.demote(&[(keys[2], BlockId(2))], |_| vec![9; 4]);
        // Another engine's writes: `t`'s lookups only wait for its own demotions.
        t1.wait_for_demotions();
        let plan = t.plan(&ns, &tokens, 0, 4);
        assert_eq!(plan.num_blocks(), 3);
        let got = t.fetch(plan);
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
        assert_eq!(t.plan(&other, &tokens, 0, 4).num_blocks(), 0);
        // Starting past the demoted blocks plans nothing more.
        assert_eq!(t.plan(&ns, &tokens, 3, 4).num_blocks(), 0);
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
        t.record_published(BlockId(0), ns.root());
        t.record_published(BlockId(1), ns.root());
        // Block 1 has the wrong length for this engine.
        t.demote(&[(keys[0], BlockId(0)), (keys[1], BlockId(1))], |b| {
            vec![1; 4 + b.index()]
        });
        let plan = t.plan(&ns, &tokens, 0, 2);
        assert_eq!(plan.num_blocks(), 2);
        assert_eq!(t.fetch(plan), vec![vec![1; 4]]);
        assert_eq!(t.snapshot().tiers[0].engine.rejected, 1);
        faulty.set_failing(true);
        assert_eq!(t.plan(&ns, &tokens, 0, 2).num_blocks(), 0);
        assert!(t.snapshot().tiers[0].engine.errors >= 1);
    }

    #[test]
    fn declining_tier_is_probed_periodically() {
        let mut t = tiering(vec![ram()], TierLoadPolicy::CostModel);
        t.bandwidth[0].observe(1.0); // 1 byte/s: hopeless
        t.prefill.observe(1e6);
        let decisions: Vec<bool> = (0..PROBE_EVERY).map(|_| t.decide(0, 1)).collect();
        assert!(decisions[..PROBE_EVERY as usize - 1].iter().all(|d| !d));
        assert!(decisions[PROBE_EVERY as usize - 1]);
        let c = &t.counters[0];
        assert_eq!(c.recompute_decisions, u64::from(PROBE_EVERY) - 1);
        assert_eq!((c.load_decisions, c.probe_loads), (1, 1));
    }
}
