//! The tier cost model and what the engine thread shares with the loader thread: the stores,
//! the measured load bandwidth and prefill speed, the decision to load or recompute a tier hit,
//! and the engine's per-tier counters. Never touches the block table or the K/V memory; the lock
//! is never held across tier I/O.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tier::{TierKey, TierStore};

use crate::config::TierLoadPolicy;
#[allow(unused_imports)] // the doc links
use tier::TierStats;

/// A tier that keeps losing the cost comparison is loaded anyway once per this many declines.
pub const PROBE_EVERY: u32 = 32;
/// Weight of a new observation in the exponentially weighted moving averages.
const EWMA_ALPHA: f64 = 0.2;
/// Forward passes with fewer prefill tokens than this do not update the prefill-speed estimate.
pub(crate) const MIN_PREFILL_SAMPLE_TOKENS: usize = 32;

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
    /// Evicted blocks not written because this (RAM or disk) tier already held them: blocks
    /// loaded from it and evicted again.
    pub already_held_blocks: u64,
    /// Blocks transcoded for this lossy tier while the engine computed (their wait for an idle
    /// engine ran out, or the write queue was past half its cap).
    pub busy_encoded_blocks: u64,
    /// Measured load bandwidth (EWMA, bytes/s), once measured.
    pub load_bytes_per_s: Option<f64>,
}

/// Which blocks of a prompt to fetch from which tier: consecutive segments of the chain.
#[derive(Debug, Default)]
pub struct TierPlan {
    segments: Vec<(usize, Vec<TierKey>)>,
}

impl TierPlan {
    pub fn num_blocks(&self) -> usize {
        self.segments.iter().map(|(_, k)| k.len()).sum()
    }
}

/// Exponentially weighted moving average.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ewma(pub Option<f64>);

impl Ewma {
    pub fn observe(&mut self, x: f64) {
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

/// What the engine and the loader thread share: the stores, the cost model's measurements and the
/// engine's per-tier counters. The lock is never held across tier I/O.
pub(crate) struct TierShared {
    pub stores: Vec<Arc<dyn TierStore>>,
    pub policy: TierLoadPolicy,
    pub block_size: usize,
    /// Bytes of one block in the pool.
    pub block_bytes: usize,
    /// How each store holds blocks (`codecs[i]` for `stores[i]`).
    pub codecs: Vec<crate::tier_codec::TierCodec>,
    pub state: Mutex<CostState>,
}

#[derive(Default)]
pub(crate) struct CostState {
    pub counters: Vec<TierCounters>,
    pub bandwidth: Vec<Ewma>,
    pub declines_in_row: Vec<u32>,
    pub prefill: Ewma,
}

impl TierShared {
    pub fn lock(&self) -> MutexGuard<'_, CostState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Plans which of `keys` (consecutive chain keys) to load: tiers in order, each continuing
    /// the chain where the previous stopped. Asks only `contains_prefix` (no payload); a failing
    /// tier is skipped, a declined one ends the plan.
    pub fn plan(&self, keys: &[TierKey]) -> TierPlan {
        let mut plan = TierPlan::default();
        let mut pos = 0;
        for tier in 0..self.stores.len() {
            if pos == keys.len() {
                break;
            }
            let present = match self.stores[tier].contains_prefix(&keys[pos..]) {
                Ok(n) => n.min(keys.len() - pos),
                Err(_) => {
                    self.lock().counters[tier].errors += 1;
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

    pub(crate) fn decide(&self, tier: usize, num_blocks: usize) -> bool {
        let mut st = self.lock();
        let st = &mut *st;
        if self.policy == TierLoadPolicy::Always
            || load_is_faster(
                num_blocks,
                self.codecs[tier].block_bytes,
                self.block_size,
                st.bandwidth[tier].0,
                st.prefill.0,
            )
        {
            st.declines_in_row[tier] = 0;
            st.counters[tier].load_decisions += 1;
            return true;
        }
        st.declines_in_row[tier] += 1;
        if st.declines_in_row[tier] >= PROBE_EVERY {
            st.declines_in_row[tier] = 0;
            st.counters[tier].load_decisions += 1;
            st.counters[tier].probe_loads += 1;
            return true;
        }
        st.counters[tier].recompute_decisions += 1;
        false
    }

    /// Fetches a plan: the payloads of the leading run of blocks that arrived verified and fit
    /// this engine (the tier's codec, token count, byte length), decoded into the pool's codec,
    /// in chain order. Stops at the first miss, error or rejection (the rest is recomputed);
    /// measures each tier's load bandwidth (stored bytes per second, decoding included).
    pub fn fetch(&self, plan: TierPlan) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for (tier, keys) in plan.segments {
            self.lock().counters[tier].load_calls += 1;
            let codec = &self.codecs[tier];
            let start = Instant::now();
            let got = match self.stores[tier].get_prefix(&keys) {
                Ok(got) => got,
                Err(_) => {
                    self.lock().counters[tier].errors += 1;
                    return out;
                }
            };
            let (mut num_ok, mut bytes, mut rejected) = (0, 0, 0);
            for block in got {
                if block.num_tokens as usize != self.block_size
                    || block.codec_id != codec.id
                    || block.payload.len() != codec.block_bytes
                {
                    rejected += 1;
                    break;
                }
                bytes += block.payload.len();
                match codec.decode(block.payload) {
                    Ok(payload) if payload.len() == self.block_bytes => out.push(payload),
                    _ => {
                        rejected += 1;
                        break;
                    }
                }
                num_ok += 1;
            }
            let elapsed = start.elapsed();
            let mut st = self.lock();
            if bytes > 0 {
                st.bandwidth[tier].observe(bytes as f64 / elapsed.as_secs_f64().max(1e-9));
            }
            let c = &mut st.counters[tier];
            c.rejected += rejected;
            c.loaded_blocks += num_ok as u64;
            c.hit_tokens += (num_ok * self.block_size) as u64;
            if num_ok < keys.len() {
                break;
            }
        }
        out
    }
}
