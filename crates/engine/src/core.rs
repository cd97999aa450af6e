//! [`EngineCore`]: the synchronous step loop — admission with prefix lookup, continuous batching
//! with chunked prefill (decodes first), preemption by recompute, sampling, stop handling.
//!
//! Owns the model, the `cache` bookkeeping, the paged K/V memory and every request's state. One
//! call to [`EngineCore::step`] runs one forward over a flattened batch. It never talks to
//! clients except through each request's event channel; the actor in `actor.rs` drives it from
//! its own thread. With storage tiers configured it also hands evicted (or newly published)
//! blocks to the tiers, starts each request's tier lookup when it is submitted, and admits the
//! request once its tier blocks are in host memory, copying them into fresh blocks
//! (`tiering.rs` decides; the I/O runs on the demotion and loader threads).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use cache::{
    CacheConfig, CacheEvent, EvictionCause, KvCache, MissReason, Namespace, NamespaceKey,
    PrefixMiss, SeqError, TenantId, Tick,
};
use model::forward::{ForwardBatch, Scratch};
use model::kv::SeqSlot;
use model::{Model, ThreadPool};

use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::paged_kv::{KvGeometry, PagedKvMemory};
use crate::request::{
    EngineEvent, EventSender, FinishReason, RequestId, RequestSpec, Timings, TokenEvent, Usage,
};
use crate::sequence::Sequence;
use crate::snapshot::{EngineSnapshot, PinnedPrompt};
use crate::step_budget::{StepBudget, StepCostModel, StepLoad};
use crate::tiering::{PrefetchState, Tiering, WritePolicy};

/// Counters of the engine's own work (the cache keeps its own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub steps: u64,
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
    pub preemptions: u64,
    pub finished: u64,
    pub cancelled: u64,
    /// Blocks put under session retention when requests finished.
    pub retained_blocks: u64,
}

/// One choice of one request: requests with `n > 1` fork into choices `1..n` after the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SeqKey(pub RequestId, pub u32);

/// One scheduled piece of work: `len` tokens of `id` starting at `start`.
struct Work {
    id: SeqKey,
    start: usize,
    len: usize,
}

/// What admission did with a waiting request.
enum Admission {
    Run(Work),
    /// Not enough free blocks now: stop admitting.
    NoBlocks,
    /// Its tier blocks are still loading: try the next request.
    Later,
}

pub struct EngineCore {
    model: Arc<Model>,
    pool: ThreadPool,
    cfg: EngineConfig,
    cache: KvCache,
    mem: PagedKvMemory,
    scratch: Scratch,
    model_fingerprint: [u8; 32],
    seqs: HashMap<SeqKey, Sequence>,
    waiting: VecDeque<SeqKey>,
    /// Admission order: the newest is last (preempted first).
    running: Vec<SeqKey>,
    tick: u64,
    started: Instant,
    stats: EngineStats,
    pinned: Vec<PinnedPrompt>,
    /// Storage tiers (`None` when none are configured: no cache events are recorded).
    tiers: Option<Tiering>,
    /// Online model of step time, for the prefill cap of steps that carry decodes.
    cost: StepCostModel,
}

impl EngineCore {
    /// An engine over `model`; opens the stores of `cfg.tiers` (a disk tier scans its
    /// directory; Redis connects lazily).
    pub fn new(model: Arc<Model>, cfg: EngineConfig) -> Result<Self, EngineError> {
        let stores = tier::open_tiers(&cfg.tiers)
            .map_err(|e| EngineError::Config(format!("tiers: {e}")))?
            .into_iter()
            .map(Arc::from)
            .collect();
        Self::with_tier_stores(model, cfg, stores)
    }

    /// Like [`EngineCore::new`] with already opened tier stores, in lookup order (`cfg.tiers`
    /// is ignored). Lets callers keep handles to the stores (tests, shared stores).
    pub fn with_tier_stores(
        model: Arc<Model>,
        cfg: EngineConfig,
        stores: Vec<Arc<dyn tier::TierStore>>,
    ) -> Result<Self, EngineError> {
        if !stores.is_empty() && !cfg.prefix_caching {
            return Err(EngineError::Config(
                "storage tiers need prefix_caching (blocks are found by their prefix keys)".into(),
            ));
        }
        if cfg.max_batch_tokens == 0
            || cfg.max_seqs == 0
            || cfg.block_size == 0
            || cfg.num_blocks == 0
        {
            return Err(EngineError::Config(
                "num_blocks, block_size, max_batch_tokens and max_seqs must be > 0".into(),
            ));
        }
        let mut cache_cfg = CacheConfig::new(cfg.num_blocks as u32);
        cache_cfg.block_size = cfg.block_size as u32;
        cache_cfg.policy = cfg.policy;
        cache_cfg.record_events = !stores.is_empty();
        let cache = KvCache::new(cache_cfg).map_err(|e| EngineError::Config(e.to_string()))?;
        let c = &model.config;
        let geo = KvGeometry {
            num_blocks: cfg.num_blocks,
            block_size: cfg.block_size,
            num_layers: c.num_layers,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };
        let mem = PagedKvMemory::new(geo, cfg.kv_dtype)
            .map_err(|e| EngineError::Config(e.to_string()))?;
        let model_fingerprint = *blake3::hash(model.gguf().file_bytes()).as_bytes();
        let tiers = (!stores.is_empty()).then(|| {
            Tiering::new(
                stores,
                WritePolicy {
                    write_through: cfg.tier_write_through,
                    on_publish: cfg.tier_write_on_publish,
                },
                cfg.tier_load_policy,
                cfg.num_blocks,
                cfg.block_size,
                mem.block_num_bytes(),
                cfg.kv_dtype.id(),
                cfg.tier_prefetch_max_bytes,
                cfg.tier_admission_wait,
            )
        });
        Ok(EngineCore {
            pool: ThreadPool::new(cfg.threads.max(1)),
            model,
            cfg,
            cache,
            mem,
            scratch: Scratch::default(),
            model_fingerprint,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            tick: 0,
            started: Instant::now(),
            stats: EngineStats::default(),
            pinned: Vec::new(),
            cost: StepCostModel::default(),
            tiers,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    pub fn memory(&self) -> &PagedKvMemory {
        &self.mem
    }

    /// True while any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// The KV codec id (`f16`, `int8-g64`, `k=int8-g64,v=int4-g32`, …) as it enters the namespace.
    fn codec_name(&self) -> String {
        self.cfg.kv_dtype.id()
    }

    /// The cache namespace of a tenant (with its salt) under this model and KV codec.
    pub fn namespace(&self, tenant: TenantId, salt: &[u8]) -> NamespaceKey {
        Namespace {
            model_fingerprint: self.model_fingerprint,
            codec_id: self.codec_name(),
            codec_version: self.cfg.kv_dtype.version(),
            kv_settings: Vec::new(),
            tenant,
            tenant_salt: salt.to_vec(),
            adapter_id: None,
        }
        .key()
    }

    /// Waits until every block demoted so far is written to the tiers (demotion runs on a
    /// background thread; this engine's own lookups already wait, other engines sharing a store
    /// or a shutdown may need it).
    pub fn wait_for_demotions(&self) {
        if let Some(t) = &self.tiers {
            t.wait_for_demotions();
        }
    }

    /// Everything the server exports, now.
    pub fn snapshot(&self) -> EngineSnapshot {
        EngineSnapshot {
            stats: self.stats.clone(),
            cache: *self.cache.counters(),
            usage: self.cache.usage(),
            fragmentation: self.cache.fragmentation().ratio(),
            tenants: self
                .cache
                .all_tenant_counters()
                .map(|(t, c)| (t, *c))
                .collect(),
            num_waiting: self.waiting.len(),
            num_running: self.running.len(),
            block_size: self.cfg.block_size,
            num_blocks: self.cfg.num_blocks,
            kv_bytes_per_token: self.mem.bytes_per_token(),
            kv_codec: self.codec_name(),
            prefix_caching: self.cfg.prefix_caching,
            pinned: self.pinned.clone(),
            tiers: self
                .tiers
                .as_ref()
                .map(Tiering::snapshot)
                .unwrap_or_default(),
        }
    }

    /// Drops cached blocks (all, or one tenant's); blocks in use stay with their requests.
    pub fn flush(&mut self, tenant: Option<TenantId>) -> u32 {
        let n = match tenant {
            Some(t) => self.cache.flush_tenant(t),
            None => self.cache.flush_all(),
        };
        self.sync_tiers(None);
        n
    }

    /// Handles the cache's events: records the namespace of blocks just published (`ns`: the
    /// sequence whose `mark_written` published them) and demotes evicted blocks to the tiers.
    /// Must run before anything overwrites an evicted block (forward pass, fork copy, tier load):
    /// an evicted block's bytes are intact only until its next write.
    fn sync_tiers(&mut self, ns: Option<NamespaceKey>) {
        sync_tiers(&mut self.cache, &mut self.tiers, &self.mem, ns, true);
    }

    /// Prefills `tokens` in the tenant's namespace and pins every full block (warm-up of a
    /// system prompt or template). Returns the number of pinned tokens.
    pub fn warmup(
        &mut self,
        name: &str,
        tokens: &[u32],
        tenant: TenantId,
        salt: &[u8],
    ) -> Result<usize, EngineError> {
        if !self.cfg.prefix_caching || tokens.is_empty() {
            return Ok(0);
        }
        if tokens.len() > self.cfg.num_blocks * self.cfg.block_size {
            return Err(EngineError::NeverFits {
                needed_blocks: tokens.len().div_ceil(self.cfg.block_size),
                total_blocks: self.cfg.num_blocks,
            });
        }
        let tick = self.next_tick();
        let ns = self.namespace(tenant, salt);
        // One token beyond the prompt is never needed: only full blocks are pinned.
        let m = self.cache.lookup(&ns, tokens, tick);
        let cached = m.num_cached_tokens();
        let cs = self.cache.create_sequence(m).map_err(internal)?;
        let mut done = cached;
        let result = (|| {
            while done < tokens.len() {
                let len = (tokens.len() - done).min(self.cfg.max_batch_tokens);
                self.cache
                    .append_tokens(cs, &tokens[done..done + len], tick)
                    .map_err(internal)?;
                let table = self.cache.block_table(cs).map_err(internal)?.to_vec();
                let tables = [table.as_slice()];
                let positions: Vec<u32> = (done as u32..(done + len) as u32).collect();
                let slots = vec![SeqSlot(0); len];
                let batch = ForwardBatch {
                    tokens: &tokens[done..done + len],
                    positions: &positions,
                    slots: &slots,
                    logits_for: &[],
                };
                sync_tiers(&mut self.cache, &mut self.tiers, &self.mem, None, true);
                let mut kv = self.mem.view(&tables);
                self.model
                    .forward(&self.pool, &batch, &mut kv, &mut self.scratch)
                    .map_err(|e| EngineError::Internal(e.to_string()))?;
                done += len;
                self.cache.mark_written(cs, done, tick).map_err(internal)?;
                sync_tiers(&mut self.cache, &mut self.tiers, &self.mem, Some(ns), true);
                self.stats.prefill_tokens += len as u64;
            }
            Ok(())
        })();
        let _ = self.cache.free(cs, tick);
        result?;
        let pin = self.cache.pin_prefix(&ns, tokens, tick);
        self.pinned.push(PinnedPrompt {
            name: name.to_string(),
            tenant,
            num_tokens: tokens.len(),
            pinned_tokens: pin.num_tokens,
        });
        Ok(pin.num_tokens)
    }

    /// The cache's logical clock: milliseconds since the engine started, strictly increasing per
    /// call (so session TTLs are in milliseconds and every step is a distinct tick).
    fn next_tick(&mut self) -> Tick {
        let ms = self.started.elapsed().as_millis() as u64;
        self.tick = ms.max(self.tick + 1);
        Tick(self.tick)
    }

    /// Validates and queues a request; its events go to `sink`.
    pub fn submit(
        &mut self,
        id: RequestId,
        spec: RequestSpec,
        sink: EventSender,
    ) -> Result<(), EngineError> {
        let c = &self.model.config;
        if spec.prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if let Some(&t) = spec.prompt.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(EngineError::BadToken(t));
        }
        spec.sampling
            .validate()
            .map_err(|e| EngineError::Sampling(e.to_string()))?;
        let total = spec.prompt.len() + spec.max_tokens;
        if total > c.context_length {
            return Err(EngineError::ContextTooLong {
                prompt_tokens: spec.prompt.len(),
                max_tokens: spec.max_tokens,
                context_length: c.context_length,
            });
        }
        if spec.n == 0 || spec.n > 16 {
            return Err(EngineError::Sampling(format!(
                "n must be between 1 and 16, got {}",
                spec.n
            )));
        }
        // Choices share the prompt's full blocks; each needs its own blocks for its output.
        let needed_blocks = total.div_ceil(self.cfg.block_size)
            + (spec.n - 1) * (spec.max_tokens.div_ceil(self.cfg.block_size) + 1);
        if needed_blocks > self.cfg.num_blocks {
            return Err(EngineError::NeverFits {
                needed_blocks,
                total_blocks: self.cfg.num_blocks,
            });
        }
        let ns = self.namespace(spec.tenant, &spec.cache_salt);
        let key = SeqKey(id, 0);
        if self.seqs.contains_key(&key) {
            return Err(EngineError::Internal(format!(
                "duplicate request id {}",
                id.0
            )));
        }
        self.seqs.insert(key, Sequence::new(spec, ns, sink));
        self.waiting.push_back(key);
        self.start_prefetch(key, false);
        Ok(())
    }

    /// Starts the tier lookup of `id`'s full prompt blocks beyond what the active pool holds
    /// now (at least one token is always computed). `force` ignores the prefetch byte cap.
    fn start_prefetch(&mut self, id: SeqKey, force: bool) -> bool {
        if self.tiers.is_none() {
            return false;
        }
        // Pending evictions are queued for demotion first: the lookup must see them.
        self.sync_tiers(None);
        let Some(t) = self.tiers.as_mut() else {
            return false;
        };
        let s = &self.seqs[&id];
        let bs = self.cfg.block_size;
        let first_block = self.cache.peek_prefix(&s.ns, &s.tokens) / bs;
        let max_blocks = (s.tokens.len() - 1) / bs;
        t.prefetch(id, s.ns, &s.tokens, first_block, max_blocks, force)
    }

    /// Cancels a request (every choice): its blocks are freed now, before the next step.
    pub fn cancel(&mut self, id: RequestId) {
        let keys: Vec<SeqKey> = self.seqs.keys().copied().filter(|k| k.0 == id).collect();
        for k in keys {
            self.finish(k, FinishReason::Cancelled);
        }
    }

    /// Forks choices `1..n` of a request whose prompt was just computed: they share its blocks
    /// (the partial last block is copied) and sample from the same logits with their own seeds.
    fn fork_choices(&mut self, key: SeqKey, logits: &[f32]) -> Result<(), EngineError> {
        let tick = Tick(self.tick);
        let parent = &self.seqs[&key];
        let n = parent.spec.n;
        let cs = parent.cache_seq.expect("sampling sequences hold blocks");
        let mut children = Vec::new();
        for choice in 1..n as u32 {
            let fork = self.cache.fork(cs, tick).map_err(internal)?;
            self.sync_tiers(None);
            if let Some(copy) = fork.copy {
                self.mem.copy_block(copy.src, copy.dst, copy.num_tokens);
            }
            let parent = &self.seqs[&key];
            let mut spec = parent.spec.clone();
            spec.sampling.seed = spec.sampling.seed.map(|s| s.wrapping_add(choice as u64));
            let mut child = Sequence::new(spec, parent.ns, parent.sink.clone());
            child.cache_seq = Some(fork.child);
            child.num_computed = parent.num_computed;
            child.arrival = parent.arrival;
            child.admitted_at = parent.admitted_at;
            child.cached_tokens = parent.cached_tokens;
            child.cache_miss = parent.cache_miss;
            children.push(SeqKey(key.0, choice));
            self.seqs.insert(SeqKey(key.0, choice), child);
        }
        let pos = self
            .running
            .iter()
            .position(|r| *r == key)
            .map_or(self.running.len(), |p| p + 1);
        for (i, c) in children.iter().enumerate() {
            self.running.insert(pos + i, *c);
        }
        for c in children {
            let mut l = logits.to_vec();
            self.sample_and_emit(c, &mut l);
        }
        Ok(())
    }

    /// Runs one scheduling decision and one forward pass. Returns the number of tokens computed.
    pub fn step(&mut self) -> Result<usize, EngineError> {
        let tick = self.next_tick();
        self.cache.expire(tick);
        let plan = self.schedule(tick)?;
        if plan.is_empty() {
            if let Some(t) = self.tiers.as_mut() {
                // Only tier loads are outstanding: wait for one instead of spinning.
                t.wait_for_prefetch();
            }
            return Ok(0);
        }
        self.stats.steps += 1;
        let prefill_before = self.stats.prefill_tokens;
        let started = Instant::now();
        let logits = self.run_forward(&plan)?;
        let mut load = StepLoad::default();
        for w in &plan {
            load.add(w.start, w.len);
        }
        if let Some(t) = self.tiers.as_mut() {
            let num_prefill = (self.stats.prefill_tokens - prefill_before) as usize;
            let num_tokens = plan.iter().map(|w| w.len).sum();
            t.observe_forward(num_tokens, num_prefill, started.elapsed());
        }
        let vocab = self.model.config.vocab_size;
        let mut to_sample = Vec::new();
        for w in &plan {
            let s = self.seqs.get_mut(&w.id).expect("planned sequences exist");
            s.num_computed = w.start + w.len;
            let cs = s.cache_seq.expect("planned sequences hold blocks");
            if self.cfg.prefix_caching {
                // Publishes every full block now written (visible to lookups from here on).
                let ns = s.ns;
                self.cache
                    .mark_written(cs, s.num_computed, tick)
                    .map_err(internal)?;
                sync_tiers(&mut self.cache, &mut self.tiers, &self.mem, Some(ns), true);
            }
            if s.num_computed == s.tokens.len() {
                to_sample.push(w.id);
            }
        }
        for (row, id) in to_sample.into_iter().enumerate() {
            let mut l = logits[row * vocab..(row + 1) * vocab].to_vec();
            let s = &self.seqs[&id];
            if id.1 == 0 && s.spec.n > 1 && s.num_generated == 0 {
                self.fork_choices(id, &l)?;
            }
            self.sample_and_emit(id, &mut l);
        }
        self.cost.observe(load, started.elapsed());
        Ok(plan.iter().map(|w| w.len).sum())
    }

    fn schedule(&mut self, tick: Tick) -> Result<Vec<Work>, EngineError> {
        if let Some(t) = self.tiers.as_mut() {
            t.begin_step();
        }
        let mut plan: Vec<Work> = Vec::new();
        let mut budget = self.cfg.max_batch_tokens;
        // What the step holds so far, for the prefill cap (`step_budget`).
        let mut load = StepLoad::default();
        // 1. Decodes first, oldest first, so inter-token latency stays flat under long prefills.
        let mut i = 0;
        while i < self.running.len() && budget > 0 && plan.len() < self.cfg.max_seqs {
            let id = self.running[i];
            if !self.seqs[&id].is_decoding() {
                i += 1;
                continue;
            }
            match self.append(id, 1, tick)? {
                true => {
                    let s = &self.seqs[&id];
                    load.add(s.num_computed, 1);
                    plan.push(Work {
                        id,
                        start: s.num_computed,
                        len: 1,
                    });
                    budget -= 1;
                    i += 1;
                }
                false => {
                    // Out of blocks: preempt the newest running request not yet planned.
                    let victim = self
                        .running
                        .iter()
                        .rev()
                        .copied()
                        .find(|v| !plan.iter().any(|w| w.id == *v));
                    match victim {
                        Some(v) => {
                            self.preempt(v, tick);
                            if let Some(p) = self.running.iter().position(|r| *r == id) {
                                i = p;
                            }
                        }
                        None => {
                            return Err(EngineError::Internal(
                                "no block for a decode and nothing to preempt".into(),
                            ))
                        }
                    }
                }
            }
        }
        let has_decodes = !plan.is_empty();
        let mut prefill_in_step = 0;
        // 2. Prefill chunks of running requests.
        for idx in 0..self.running.len() {
            if budget == 0 || plan.len() >= self.cfg.max_seqs {
                break;
            }
            let id = self.running[idx];
            let s = &self.seqs[&id];
            if s.is_decoding() || s.num_pending() == 0 {
                continue;
            }
            let start = s.num_computed;
            let want = s.num_pending().min(budget);
            let len = self.prefill_cap(&load, has_decodes, prefill_in_step, start, want);
            if len == 0 {
                break; // no more prefill fits in this step
            }
            if self.append(id, len, tick)? {
                load.add(start, len);
                prefill_in_step += len;
                plan.push(Work { id, start, len });
                budget -= len;
            }
        }
        // 3. Admit waiting requests (FIFO, cache-aware grouping).
        let mut skipped = VecDeque::new();
        while budget > 0 && self.running.len() < self.cfg.max_seqs && plan.len() < self.cfg.max_seqs
        {
            if self.prefill_cap(&load, has_decodes, prefill_in_step, 0, 1) == 0 {
                break; // not even one more prompt token fits in this step
            }
            let Some(id) = self.waiting.pop_front() else {
                break;
            };
            if self.shares_prefix_in_flight(id) {
                skipped.push_back(id);
                continue;
            }
            match self.admit(id, budget, &load, (has_decodes, prefill_in_step), tick)? {
                Admission::Run(w) => {
                    budget -= w.len;
                    prefill_in_step += w.len;
                    load.add(w.start, w.len);
                    plan.push(w);
                }
                Admission::NoBlocks => {
                    self.waiting.push_front(id);
                    break;
                }
                Admission::Later => skipped.push_back(id),
            }
        }
        while let Some(id) = skipped.pop_back() {
            self.waiting.push_front(id);
        }
        // Nothing could run although requests hold blocks: free the newest to make progress.
        if plan.is_empty() && !self.running.is_empty() && !self.waiting.is_empty() {
            let v = *self.running.last().expect("non-empty");
            self.preempt(v, tick);
        }
        Ok(plan)
    }

    /// A waiting request whose prompt shares at least one full block with a prompt being
    /// prefilled right now (same namespace) waits, so the shared prefix is computed once.
    fn shares_prefix_in_flight(&self, id: SeqKey) -> bool {
        if !self.cfg.prefix_caching {
            return false;
        }
        let w = &self.seqs[&id];
        let bs = self.cfg.block_size;
        let cached = self.cache.peek_prefix(&w.ns, &w.tokens);
        self.running.iter().any(|r| {
            let r = &self.seqs[r];
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
    /// pool and then from its tier prefetch; waits (`Later`) while the prefetch is in flight.
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
        let budget = StepBudget {
            target: self.cfg.step_time_target,
            min_prefill_tokens: self.cfg.min_prefill_tokens_per_step,
        };
        budget.cap(&self.cost, load, has_decodes, prefill_in_step, start, want)
    }

    fn admit(
        &mut self,
        id: SeqKey,
        budget: usize,
        load: &StepLoad,
        (has_decodes, prefill_in_step): (bool, usize),
        tick: Tick,
    ) -> Result<Admission, EngineError> {
        let bs = self.cfg.block_size;
        // Blocks evicted earlier in this step go to the demotion queue first, so a tier lookup
        // started now sees them (a preempted request re-admitted in the step that evicted its
        // blocks must find them in the tier).
        self.sync_tiers(None);
        let (cs, cached, miss) = if self.cfg.prefix_caching {
            let s = &self.seqs[&id];
            let (ns, num_tokens) = (s.ns, s.tokens.len());
            let m = self.cache.lookup(&ns, &s.tokens, tick);
            let active = m.num_cached_tokens();
            let active_miss = m.miss();
            let active_blocks = m.blocks().len();
            let max_blocks = (num_tokens - 1) / bs;
            // Continue the match with the request's tier prefetch (full blocks, adjacent).
            let mut loaded = None;
            if let Some(t) = self.tiers.as_mut() {
                let later = match t.take_prefetch(id) {
                    PrefetchState::Pending => true,
                    PrefetchState::None => {
                        active_blocks < max_blocks
                            && t.prefetch(id, ns, &s.tokens, active_blocks, max_blocks, true)
                    }
                    PrefetchState::Ready(l) if l.first_block > active_blocks => {
                        // The active pool lost blocks since the lookup: look again from here.
                        t.refetch(id, ns, &s.tokens, active_blocks, max_blocks);
                        true
                    }
                    PrefetchState::Ready(l) => {
                        loaded = Some(l);
                        false
                    }
                };
                if later {
                    self.cache.release_match(m, tick).map_err(internal)?;
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
            if !self.cache.can_allocate(needed as u32) {
                self.cache.release_match(m, tick).map_err(internal)?;
                if let (Some(t), Some(l)) = (self.tiers.as_mut(), loaded) {
                    t.put_back(id, l);
                }
                return Ok(Admission::NoBlocks);
            }
            let cs = self.cache.create_sequence(m).map_err(internal)?;
            let mut cached = active;
            if num_loaded > 0 {
                let payloads = &loaded.as_ref().expect("num_loaded > 0").payloads[skip..];
                let toks = &self.seqs[&id].tokens[active..active + num_loaded * bs];
                let new_blocks = self.cache.append_tokens(cs, toks, tick).map_err(internal)?;
                // The new blocks may have been evicted just now: demote before overwriting.
                sync_tiers(&mut self.cache, &mut self.tiers, &self.mem, None, true);
                for (block, bytes) in new_blocks.iter().zip(payloads) {
                    // Lengths were checked by the fetch: a failure here is an engine bug.
                    self.mem.load_block_bytes(*block, bytes).map_err(internal)?;
                }
                cached += num_loaded * bs;
                self.cache
                    .mark_written(cs, cached, tick)
                    .map_err(internal)?;
                // Loaded blocks came from a tier: publish them without writing them back.
                sync_tiers(&mut self.cache, &mut self.tiers, &self.mem, Some(ns), false);
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
            let s = &self.seqs[&id];
            let len = s.tokens.len().min(budget);
            if !self.cache.can_allocate(len.div_ceil(bs) as u32) {
                return Ok(Admission::NoBlocks);
            }
            (self.cache.create_empty_sequence(&s.ns), 0, None)
        };
        let s = self.seqs.get_mut(&id).expect("waiting sequences exist");
        s.cache_seq = Some(cs);
        s.num_computed = cached;
        if s.cached_tokens.is_none() {
            s.cached_tokens = Some(cached);
            s.cache_miss = miss;
            s.admitted_at = Some(Instant::now());
            let _ = s.send(EngineEvent::Admitted {
                cached_tokens: cached,
            });
        }
        let want = (s.tokens.len() - cached).min(budget);
        // At least one token: admission already checked that the step has room for more prefill.
        let len = self
            .prefill_cap(load, has_decodes, prefill_in_step, cached, want)
            .max(1)
            .min(want);
        self.running.push(id);
        if !self.append(id, len, tick)? {
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

    /// Appends the next `len` pending tokens of `id` to its block table. `false` = out of blocks.
    fn append(&mut self, id: SeqKey, len: usize, tick: Tick) -> Result<bool, EngineError> {
        let s = &self.seqs[&id];
        let cs = s.cache_seq.expect("running sequences hold blocks");
        let have = self.cache.num_tokens(cs).map_err(internal)?;
        debug_assert_eq!(
            have, s.num_computed,
            "cache and engine agree on computed tokens"
        );
        let toks = &s.tokens[have..have + len];
        match self.cache.append_tokens(cs, toks, tick) {
            Ok(_) => Ok(true),
            Err(SeqError::Alloc(_)) => Ok(false),
            Err(e) => Err(internal(e)),
        }
    }

    fn preempt(&mut self, id: SeqKey, tick: Tick) {
        let s = self.seqs.get_mut(&id).expect("running sequences exist");
        if let Some(cs) = s.cache_seq.take() {
            let _ = self.cache.free(cs, tick);
        }
        s.num_computed = 0;
        s.num_preemptions += 1;
        self.running.retain(|r| *r != id);
        self.waiting.push_front(id);
        self.stats.preemptions += 1;
    }

    fn run_forward(&mut self, plan: &[Work]) -> Result<Vec<f32>, EngineError> {
        // Evicted blocks may be rewritten by this pass: demote them first.
        self.sync_tiers(None);
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        let mut slots = Vec::new();
        let mut logits_for = Vec::new();
        let mut tables = Vec::with_capacity(plan.len());
        for (slot, w) in plan.iter().enumerate() {
            let s = &self.seqs[&w.id];
            for p in w.start..w.start + w.len {
                tokens.push(s.tokens[p]);
                positions.push(p as u32);
                slots.push(SeqSlot(slot as u32));
            }
            if w.start + w.len == s.tokens.len() {
                logits_for.push(tokens.len() - 1);
            }
            if s.is_decoding() {
                self.stats.decode_tokens += 1;
            } else {
                self.stats.prefill_tokens += w.len as u64;
            }
            let cs = s.cache_seq.expect("planned sequences hold blocks");
            tables.push(self.cache.block_table(cs).map_err(internal)?.to_vec());
        }
        let table_refs: Vec<&[cache::BlockId]> = tables.iter().map(|t| t.as_slice()).collect();
        let batch = ForwardBatch {
            tokens: &tokens,
            positions: &positions,
            slots: &slots,
            logits_for: &logits_for,
        };
        let mut kv = self.mem.view(&table_refs);
        self.model
            .forward(&self.pool, &batch, &mut kv, &mut self.scratch)
            .map_err(|e| EngineError::Internal(e.to_string()))
    }

    fn sample_and_emit(&mut self, id: SeqKey, logits: &mut [f32]) {
        let eot: Vec<u32> = self.model.tokenizer.eot_ids().to_vec();
        let s = self.seqs.get_mut(&id).expect("exists");
        if s.num_generated < s.spec.min_tokens {
            for &t in eot.iter().chain(&s.spec.stop_token_ids) {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        let prompt_len = s.spec.prompt.len();
        let tok = s.sampler.sample(logits, &s.tokens[..prompt_len]);
        s.sampler.observe(tok.id);
        s.tokens.push(tok.id);
        s.num_generated += 1;
        if s.first_token_at.is_none() {
            s.first_token_at = Some(Instant::now());
        }
        let is_stop_id = (!s.spec.ignore_eos && eot.contains(&tok.id))
            || s.spec.stop_token_ids.contains(&tok.id);
        let mut stopped = is_stop_id;
        let mut text = String::new();
        if !is_stop_id && !self.model.tokenizer.is_special(tok.id) {
            let bytes = self.model.tokenizer.token_bytes(tok.id).unwrap_or_default();
            let pushed = s.text.push(&bytes);
            text = pushed.text;
            stopped |= pushed.stopped;
        }
        let alive = s.send(EngineEvent::Token(TokenEvent {
            choice: id.1,
            id: tok.id,
            text,
            logprob: tok.logprob,
            top_logprobs: tok.top,
        }));
        let at_length = s.num_generated >= s.spec.max_tokens
            || s.tokens.len() >= self.model.config.context_length;
        if !alive {
            self.finish(id, FinishReason::Cancelled);
        } else if stopped {
            self.finish(id, FinishReason::Stop);
        } else if at_length {
            self.finish(id, FinishReason::Length);
        }
    }

    /// Ends every request with `err` (after an internal failure), freeing their blocks.
    pub fn fail_all(&mut self, err: EngineError) {
        let ids: Vec<SeqKey> = self.seqs.keys().copied().collect();
        for id in ids {
            if let Some(s) = self.seqs.get(&id) {
                let _ = s.send(EngineEvent::Error(err.clone()));
            }
            self.finish(id, FinishReason::Cancelled);
        }
    }

    fn finish(&mut self, id: SeqKey, reason: FinishReason) {
        let Some(mut s) = self.seqs.remove(&id) else {
            return;
        };
        if let Some(t) = self.tiers.as_mut() {
            t.cancel_prefetch(id);
        }
        if let Some(cs) = s.cache_seq.take() {
            let tick = Tick(self.tick);
            if let (Some(r), true) = (&s.spec.retention, reason != FinishReason::Cancelled) {
                // Keep this agent's KV through its tool call: soft, budget-capped retention.
                let until = Tick(self.tick + r.ttl.as_millis() as u64);
                if let Ok(out) = self
                    .cache
                    .retain_session(r.session, cs, until, r.priority, tick)
                {
                    self.stats.retained_blocks += out.retained_blocks as u64;
                }
            }
            let _ = self.cache.free(cs, tick);
        }
        self.running.retain(|r| *r != id);
        self.waiting.retain(|r| *r != id);
        if reason == FinishReason::Cancelled {
            self.stats.cancelled += 1;
            return;
        }
        self.stats.finished += 1;
        let tail = s.text.finish();
        if !tail.is_empty() && reason != FinishReason::Stop {
            let _ = s.send(EngineEvent::Text {
                choice: id.1,
                text: tail,
            });
        }
        let now = Instant::now();
        let timings = Timings {
            ttft: s
                .first_token_at
                .map_or_else(Default::default, |t| t - s.arrival),
            queue: s
                .admitted_at
                .map_or_else(Default::default, |t| t - s.arrival),
            total: now - s.arrival,
        };
        let usage = Usage {
            prompt_tokens: s.spec.prompt.len(),
            completion_tokens: s.num_generated,
            cached_tokens: s.cached_tokens.unwrap_or(0),
            cache_miss: s.cache_miss,
        };
        let _ = s.send(EngineEvent::Finished {
            choice: id.1,
            reason,
            usage,
            timings,
            num_preemptions: s.num_preemptions,
        });
    }
}

/// See [`EngineCore::sync_tiers`] (a free function so callers can hold other field borrows).
/// `write`: blocks published now may be written to the tiers (when writing on publish); `false`
/// for blocks just loaded from a tier.
fn sync_tiers(
    cache: &mut KvCache,
    tiers: &mut Option<Tiering>,
    mem: &PagedKvMemory,
    ns: Option<NamespaceKey>,
    write: bool,
) {
    let Some(t) = tiers.as_mut() else {
        return;
    };
    let mut writes = Vec::new();
    for event in cache.drain_events() {
        let to_write = match event {
            CacheEvent::BlockStored { key, block, .. } => match ns {
                Some(ns) => t
                    .published(key, block, ns.root(), write)
                    .map(|k| (k, block)),
                None => {
                    t.forget(block);
                    None
                }
            },
            CacheEvent::BlockEvicted {
                key, block, cause, ..
            } => match cause {
                EvictionCause::Flush => {
                    t.forget(block);
                    None
                }
                _ => t.evicted(key, block).map(|k| (k, block)),
            },
        };
        if let Some((tier_key, block)) = to_write {
            // Copied now: an evicted block's bytes are intact only until its next write.
            writes.push((tier_key, mem.block_bytes(block)));
        }
    }
    t.write(writes);
}

fn internal(e: impl std::fmt::Display) -> EngineError {
    EngineError::Internal(e.to_string())
}
