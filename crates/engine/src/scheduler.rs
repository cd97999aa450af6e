//! [`Scheduler`]: the waiting and running queues, and the decision of what one step computes.
//!
//! Owns the queues, the step-time cost model and the rules: decodes first (oldest first), then
//! prefill chunks of running requests, then admissions in priority order (vLLM's convention:
//! lower first; FIFO among equals) with cache-aware grouping (a request whose prompt shares a
//! block with a prompt being prefilled waits for it); preemption by recompute of the least
//! important running request (the newest among equals) when a decode finds no block, or when a
//! strictly more important request waits for a slot or blocks; chunks capped by
//! the token budget and the step-time target. It turns the cache's bookkeeping into a
//! [`StepPlan`], extending block tables, looking up prefixes and taking finished tier lookups
//! as it goes. It never touches the model or K/V bytes and never starts tier I/O: tier payloads
//! and new tier lookups travel in the plan for the executor. Testable with a bare [`KvCache`].

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use cache::{KvCache, MissReason, PrefixMiss, SeqError, Tick};

use crate::error::{internal, EngineError};
use crate::plan::{PrefetchStart, StepPlan, TierLoad, Work};
use crate::sequence::{SeqKey, Sequence};
use crate::step_budget::{StepBudget, StepCostModel, StepLoad};
use crate::tier_events::{Publisher, TierEvents};
use crate::tiering::{TierExtension, TierMatch};

/// The scheduler's limits (from `EngineConfig`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SchedulerConfig {
    pub max_batch_tokens: usize,
    pub max_seqs: usize,
    pub block_size: usize,
    pub prefix_caching: bool,
    pub budget: StepBudget,
}

/// Everything one scheduling decision reads and updates besides the queues.
pub(crate) struct SchedContext<'a> {
    pub cache: &'a mut KvCache,
    pub seqs: &'a mut HashMap<SeqKey, Sequence>,
    pub tiers: Option<&'a mut dyn TierMatch>,
    pub events: &'a mut TierEvents,
    pub tick: Tick,
}

/// What admission did with a waiting request.
enum Admission {
    Run(Work),
    /// Not enough free blocks now: stop admitting.
    NoBlocks,
    /// Its tier blocks are still loading: try the next request.
    Later,
}

pub(crate) struct Scheduler {
    cfg: SchedulerConfig,
    /// By priority, then arrival (a preempted request goes first among its equals).
    waiting: VecDeque<SeqKey>,
    /// Admission order: the newest is last (preempted first among equal priorities).
    running: Vec<SeqKey>,
    /// Priority of every waiting and running request (lower is more important).
    priority: HashMap<SeqKey, i32>,
    /// The head of the queue when the last step's admissions stopped for want of a slot or of
    /// blocks (not of token budget): it may preempt a less important running request.
    blocked_head: Option<SeqKey>,
    /// Online model of step time, for the prefill cap of steps that carry decodes.
    cost: StepCostModel,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Self {
        Scheduler {
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            priority: HashMap::new(),
            blocked_head: None,
            cost: StepCostModel::default(),
        }
    }

    /// Predicted seconds to prefill `tokens` tokens from an empty context (one step's worth of
    /// the online cost model), `None` until the model has seen enough steps.
    pub fn predict_prefill_seconds(&self, tokens: usize) -> Option<f64> {
        let mut load = StepLoad::default();
        load.add(0, tokens);
        self.cost.predict(load)
    }

    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Queues a submitted request of `priority` after every waiting request at least as
    /// important.
    pub fn enqueue(&mut self, id: SeqKey, priority: i32) {
        self.priority.insert(id, priority);
        let pos = self
            .waiting
            .iter()
            .position(|w| self.priority_of(*w) > priority)
            .unwrap_or(self.waiting.len());
        self.waiting.insert(pos, id);
    }

    /// Puts a request taken from the queue (not admitted now, or preempted) back ahead of
    /// every waiting request of its priority.
    fn requeue_front(&mut self, id: SeqKey) {
        let p = self.priority_of(id);
        let pos = self
            .waiting
            .iter()
            .position(|w| self.priority_of(*w) >= p)
            .unwrap_or(self.waiting.len());
        self.waiting.insert(pos, id);
    }

    fn priority_of(&self, id: SeqKey) -> i32 {
        self.priority.get(&id).copied().unwrap_or(0)
    }

    /// The running request to preempt: one whose reader stalled first, then the least
    /// important, the newest among equals, skipping those `skip` says are planned already.
    fn victim(
        &self,
        seqs: &HashMap<SeqKey, Sequence>,
        skip: impl Fn(SeqKey) -> bool,
    ) -> Option<SeqKey> {
        let stalled = |r: &SeqKey| seqs.get(r).is_some_and(Sequence::is_stalled);
        self.running
            .iter()
            .enumerate()
            .filter(|(_, r)| !skip(**r))
            .max_by_key(|(i, r)| (stalled(r), self.priority_of(**r), *i))
            .map(|(_, r)| *r)
    }

    /// vLLM's priority policy: when the last step could not admit the head of the queue (no
    /// slot or no blocks), the least important running request is preempted (recomputed later)
    /// if it is strictly less important than that head, which is then admitted as soon as what
    /// it freed suffices (one victim per step). Equal priorities never preempt each other, so
    /// with every request at the default priority nothing changes.
    /// Returns the request it preempted.
    fn preempt_for_priority(
        &mut self,
        cx: &mut SchedContext<'_>,
        plan: &mut StepPlan,
    ) -> Option<SeqKey> {
        let head = self.blocked_head.take()?;
        if self.waiting.front() != Some(&head) {
            return None;
        }
        let v = self.victim(cx.seqs, |_| false)?;
        // A request whose reader stalled gives way to anyone waiting.
        if !cx.seqs[&v].is_stalled() && self.priority_of(v) <= self.priority_of(head) {
            return None;
        }
        self.preempt(cx, v, plan);
        Some(v)
    }

    /// Forgets a finished or cancelled request.
    pub fn remove(&mut self, id: SeqKey) {
        self.running.retain(|r| *r != id);
        self.waiting.retain(|r| *r != id);
        self.priority.remove(&id);
    }

    /// Places forked choices right after their parent in the running order.
    pub fn insert_forks(&mut self, parent: SeqKey, children: &[SeqKey]) {
        let pos = self
            .running
            .iter()
            .position(|r| *r == parent)
            .map_or(self.running.len(), |p| p + 1);
        let p = self.priority_of(parent);
        for (i, c) in children.iter().enumerate() {
            self.running.insert(pos + i, *c);
            self.priority.insert(*c, p);
        }
    }

    /// Feeds the measured duration of an executed plan to the step-time model.
    pub fn observe(&mut self, plan: &StepPlan, took: Duration) {
        let mut load = StepLoad::default();
        for w in &plan.work {
            load.add(w.start, w.len);
        }
        self.cost.observe(load, took);
    }

    /// Decides one step. Block tables are extended for every planned chunk; requests admitted
    /// now hold their blocks; preempted ones are back at the head of the queue.
    pub fn schedule(&mut self, cx: &mut SchedContext<'_>) -> Result<StepPlan, EngineError> {
        if let Some(t) = cx.tiers.as_deref_mut() {
            t.begin_step();
        }
        let mut plan = StepPlan::default();
        let priority_victim = self.preempt_for_priority(cx, &mut plan);
        let mut budget = self.cfg.max_batch_tokens;
        // What the step holds so far, for the prefill cap (`step_budget`).
        let mut load = StepLoad::default();
        // 1. Decodes first, oldest first, so inter-token latency stays flat under long prefills.
        let mut i = 0;
        while i < self.running.len() && budget > 0 && plan.work.len() < self.cfg.max_seqs {
            let id = self.running[i];
            // A request whose reader stopped reading waits for it without computing.
            if !cx.seqs[&id].is_decoding() || cx.seqs[&id].is_stalled() {
                i += 1;
                continue;
            }
            if append(cx, id, 1)? {
                let start = cx.seqs[&id].num_computed;
                load.add(start, 1);
                plan.work.push(Work { id, start, len: 1 });
                budget -= 1;
                i += 1;
                continue;
            }
            // Out of blocks: preempt the least important running request not yet planned.
            let victim = self.victim(cx.seqs, |v| plan.work.iter().any(|w| w.id == v));
            let Some(v) = victim else {
                return Err(EngineError::Internal(
                    "no block for a decode and nothing to preempt".into(),
                ));
            };
            self.preempt(cx, v, &mut plan);
            if let Some(p) = self.running.iter().position(|r| *r == id) {
                i = p;
            }
        }
        let has_decodes = !plan.work.is_empty();
        let mut prefill_in_step = 0;
        // 2. Prefill chunks of running requests.
        for idx in 0..self.running.len() {
            if budget == 0 || plan.work.len() >= self.cfg.max_seqs {
                break;
            }
            let id = self.running[idx];
            let s = &cx.seqs[&id];
            if s.is_decoding() || s.num_pending() == 0 {
                continue;
            }
            let start = s.num_computed;
            let want = s.num_pending().min(budget);
            let len = self.prefill_cap(&load, has_decodes, prefill_in_step, start, want);
            if len == 0 {
                break; // no more prefill fits in this step
            }
            if append(cx, id, len)? {
                load.add(start, len);
                prefill_in_step += len;
                plan.work.push(Work { id, start, len });
                budget -= len;
            }
        }
        // 3. Admit waiting requests (FIFO, cache-aware grouping).
        let mut skipped = VecDeque::new();
        while budget > 0
            && self.running.len() < self.cfg.max_seqs
            && plan.work.len() < self.cfg.max_seqs
        {
            if self.prefill_cap(&load, has_decodes, prefill_in_step, 0, 1) == 0 {
                break; // not even one more prompt token fits in this step
            }
            let Some(id) = self.waiting.pop_front() else {
                break;
            };
            // A request preempted for priority comes back in a later step at the earliest; one
            // whose reader stalled, once the reader catches up.
            if Some(id) == priority_victim
                || cx.seqs[&id].is_stalled()
                || self.shares_prefix_in_flight(cx, id)
            {
                skipped.push_back(id);
                continue;
            }
            let step = (has_decodes, prefill_in_step);
            match self.admit(cx, id, budget, &load, step, &mut plan)? {
                Admission::Run(w) => {
                    budget -= w.len;
                    prefill_in_step += w.len;
                    load.add(w.start, w.len);
                    plan.work.push(w);
                }
                Admission::NoBlocks => {
                    self.requeue_front(id);
                    self.blocked_head = Some(id);
                    break;
                }
                Admission::Later => skipped.push_back(id),
            }
        }
        while let Some(id) = skipped.pop_back() {
            self.requeue_front(id);
        }
        if self.running.len() >= self.cfg.max_seqs {
            self.blocked_head = self.waiting.front().copied();
        }
        // Nothing could run although requests hold blocks: free the least important (newest)
        // to make progress.
        let ready = |w: &SeqKey| cx.seqs.get(w).is_some_and(|s| !s.is_stalled());
        if plan.work.is_empty() && self.waiting.iter().any(ready) {
            if let Some(v) = self.victim(cx.seqs, |_| false) {
                self.preempt(cx, v, &mut plan);
            }
        }
        cx.events.record(cx.cache, None);
        Ok(plan)
    }

    /// The prefill chunk allowed at `start` (at most `want` tokens) in a step holding `load`
    /// (with `prefill_in_step` prefill tokens so far); 0 when no more prefill fits.
    fn prefill_cap(
        &self,
        load: &StepLoad,
        has_decodes: bool,
        prefill_in_step: usize,
        start: usize,
        want: usize,
    ) -> usize {
        self.cfg
            .budget
            .cap(&self.cost, load, has_decodes, prefill_in_step, start, want)
    }

    /// A waiting request whose prompt shares at least one full block with a prompt being
    /// prefilled right now (same namespace) waits, so the shared prefix is computed once.
    fn shares_prefix_in_flight(&self, cx: &SchedContext<'_>, id: SeqKey) -> bool {
        if !self.cfg.prefix_caching {
            return false;
        }
        let w = &cx.seqs[&id];
        let bs = self.cfg.block_size;
        let cached = cx.cache.peek_prefix(&w.ns, &w.tokens);
        self.running.iter().any(|r| {
            let r = &cx.seqs[r];
            if r.ns != w.ns || r.num_generated > 0 {
                return false;
            }
            let common = r
                .tokens
                .iter()
                .zip(&w.tokens)
                .take_while(|(a, b)| a == b)
                .count();
            let common_blocks = common.min(w.tokens.len() - 1) / bs * bs;
            common_blocks > cached && r.num_computed < common_blocks
        })
    }

    /// Gives `id` blocks and its first chunk, with its prompt's cached prefix from the active
    /// pool and then from its finished tier lookup; `Later` while a lookup is in flight (or was
    /// just requested in the plan).
    fn admit(
        &mut self,
        cx: &mut SchedContext<'_>,
        id: SeqKey,
        budget: usize,
        load: &StepLoad,
        (has_decodes, prefill_in_step): (bool, usize),
        plan: &mut StepPlan,
    ) -> Result<Admission, EngineError> {
        let bs = self.cfg.block_size;
        let tick = cx.tick;
        let (cs, cached, miss) = if self.cfg.prefix_caching {
            let s = &cx.seqs[&id];
            let (ns, num_tokens) = (s.ns, s.tokens.len());
            let m = cx.cache.lookup(&ns, &s.tokens, tick);
            let active = m.num_cached_tokens();
            let active_miss = m.miss();
            let active_blocks = m.blocks().len();
            let max_blocks = (num_tokens - 1) / bs;
            // Continue the match with the request's tier lookup (full blocks, adjacent).
            let mut loaded = None;
            if let Some(t) = cx.tiers.as_deref_mut() {
                let start = |refetch| PrefetchStart {
                    id,
                    first_block: active_blocks,
                    max_blocks,
                    refetch,
                };
                let later = match t.extend_match(id) {
                    TierExtension::Pending => true,
                    TierExtension::None if active_blocks < max_blocks => {
                        plan.prefetches.push(start(false));
                        true
                    }
                    TierExtension::None | TierExtension::TimedOut => false,
                    TierExtension::Ready(l) if l.first_block > active_blocks => {
                        // The active pool lost blocks since the lookup: look again from here.
                        plan.prefetches.push(start(true));
                        true
                    }
                    TierExtension::Ready(l) => {
                        loaded = Some(l);
                        false
                    }
                };
                if later {
                    cx.cache.release_match(m, tick).map_err(internal)?;
                    return Ok(Admission::Later);
                }
            }
            // Blocks the active pool already holds are skipped; the rest continue the chain.
            let skip = loaded.as_ref().map_or(0, |l| active_blocks - l.first_block);
            let num_loaded = loaded
                .as_ref()
                .map_or(0, |l| l.payloads.len().saturating_sub(skip));
            let planned = active + num_loaded * bs;
            let len = (num_tokens - planned).min(budget);
            let needed = (planned + len).div_ceil(bs) - active_blocks;
            if !cx.cache.can_allocate(needed as u32) {
                cx.cache.release_match(m, tick).map_err(internal)?;
                if let (Some(t), Some(l)) = (cx.tiers.as_deref_mut(), loaded) {
                    t.put_back(id, l);
                }
                return Ok(Admission::NoBlocks);
            }
            let cs = cx.cache.create_sequence(m).map_err(internal)?;
            let mut cached = active;
            if let Some(mut l) = loaded.filter(|_| num_loaded > 0) {
                let toks = &cx.seqs[&id].tokens[active..active + num_loaded * bs];
                let blocks = cx.cache.append_tokens(cs, toks, tick).map_err(internal)?;
                // Evictions made room for them: recorded before the loaded blocks' publish.
                cx.events.record(cx.cache, None);
                let payloads: Vec<Vec<u8>> = l.payloads.drain(skip..skip + num_loaded).collect();
                plan.tier_loads.push(TierLoad {
                    id,
                    blocks,
                    payloads,
                });
                cached += num_loaded * bs;
                cx.cache.mark_written(cs, cached, tick).map_err(internal)?;
                // Loaded blocks came from a tier: published without writing them back.
                cx.events.record(cx.cache, Some(Publisher::loaded(&ns)));
            }
            // With tier blocks loaded, the prefix ends where the tiers' chain ended.
            let miss = match active_miss {
                Some(_) if num_loaded > 0 => (cached < max_blocks * bs).then_some(PrefixMiss {
                    at_token: cached,
                    reason: MissReason::Uncached,
                }),
                m => m,
            };
            (cs, cached, miss)
        } else {
            let s = &cx.seqs[&id];
            let len = s.tokens.len().min(budget);
            if !cx.cache.can_allocate(len.div_ceil(bs) as u32) {
                return Ok(Admission::NoBlocks);
            }
            (cx.cache.create_empty_sequence(&s.ns), 0, None)
        };
        let s = cx.seqs.get_mut(&id).expect("waiting sequences exist");
        s.cache_seq = Some(cs);
        s.num_computed = cached;
        if s.cached_tokens.is_none() {
            s.cached_tokens = Some(cached);
            s.cache_miss = miss;
            s.admitted_at = Some(Instant::now());
            plan.first_admissions.push(id);
        }
        let want = (s.tokens.len() - cached).min(budget);
        // At least one token: admission already checked that the step has room for more prefill.
        let len = self
            .prefill_cap(load, has_decodes, prefill_in_step, cached, want)
            .max(1)
            .min(want);
        self.running.push(id);
        if !append(cx, id, len)? {
            return Err(EngineError::Internal(
                "allocation failed after can_allocate".into(),
            ));
        }
        Ok(Admission::Run(Work {
            id,
            start: cached,
            len,
        }))
    }

    /// Frees `id`'s blocks and puts it back at the head of the queue (recomputed from scratch).
    fn preempt(&mut self, cx: &mut SchedContext<'_>, id: SeqKey, plan: &mut StepPlan) {
        let s = cx.seqs.get_mut(&id).expect("running sequences exist");
        if let Some(cs) = s.cache_seq.take() {
            let _ = cx.cache.free(cs, cx.tick);
        }
        s.num_computed = 0;
        s.num_preemptions += 1;
        self.running.retain(|r| *r != id);
        self.requeue_front(id);
        plan.preempted.push(id);
    }
}

/// Appends the next `len` pending tokens of `id` to its block table. `false` = out of blocks.
fn append(cx: &mut SchedContext<'_>, id: SeqKey, len: usize) -> Result<bool, EngineError> {
    let s = &cx.seqs[&id];
    let cs = s.cache_seq.expect("running sequences hold blocks");
    let have = cx.cache.num_tokens(cs).map_err(internal)?;
    debug_assert_eq!(
        have, s.num_computed,
        "cache and engine agree on computed tokens"
    );
    let toks = &s.tokens[have..have + len];
    match cx.cache.append_tokens(cs, toks, cx.tick) {
        Ok(_) => Ok(true),
        Err(SeqError::Alloc(_)) => Ok(false),
        Err(e) => Err(internal(e)),
    }
}

#[cfg(test)]
mod tests;
