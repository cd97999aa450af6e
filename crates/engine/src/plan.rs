//! [`StepPlan`]: what one engine step does, as plain data — the scheduler's output and the
//! executor's input.
//!
//! Owns nothing but the plan's shape. A plan is decided entirely by the scheduler from the
//! cache's bookkeeping (block tables are already extended when a plan exists); the executor
//! loads tier payloads into the planned blocks, starts the requested tier lookups and runs the
//! forward pass over `work`; the commit publishes what was written and samples. Never holds
//! K/V bytes except tier payloads in transit.

use cache::BlockId;

use crate::sequence::SeqKey;

/// One scheduled piece of work: `len` tokens of `id` starting at position `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Work {
    pub id: SeqKey,
    pub start: usize,
    pub len: usize,
}

/// Tier payloads to copy into freshly allocated blocks before the forward pass (the cache
/// already lists the blocks as written: nothing reads them before the executor has loaded them).
#[derive(Debug)]
pub(crate) struct TierLoad {
    pub id: SeqKey,
    /// `blocks[i]` receives `payloads[i]`.
    pub blocks: Vec<BlockId>,
    pub payloads: Vec<Vec<u8>>,
}

/// A tier lookup of prompt blocks `first_block..max_blocks` of `id` to start now (forced: past
/// the prefetch byte cap), because admission found none usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PrefetchStart {
    pub id: SeqKey,
    pub first_block: usize,
    pub max_blocks: usize,
    /// The earlier lookup became stale (the active pool lost blocks while it was in flight).
    pub refetch: bool,
}

/// What one step does. `work` is in batch order: decodes (oldest first), prefill chunks of
/// running requests, then the first chunks of requests admitted in this step.
#[derive(Debug, Default)]
pub(crate) struct StepPlan {
    pub work: Vec<Work>,
    /// Requests preempted by recompute in this step, in the order chosen.
    pub preempted: Vec<SeqKey>,
    /// Requests admitted for the first time in this step (their `Admitted` event is due).
    pub first_admissions: Vec<SeqKey>,
    pub tier_loads: Vec<TierLoad>,
    pub prefetches: Vec<PrefetchStart>,
}

impl StepPlan {
    /// Tokens computed by the forward pass.
    pub fn num_tokens(&self) -> usize {
        self.work.iter().map(|w| w.len).sum()
    }

    /// Nothing to compute (tier lookups may still have been requested).
    pub fn is_idle(&self) -> bool {
        self.work.is_empty()
    }
}
