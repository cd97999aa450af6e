//! [`EngineCore`]: the synchronous step loop. One call to [`EngineCore::step`] is
//! schedule → execute → commit: the [`Scheduler`] turns the queues and the cache's bookkeeping
//! into a [`StepPlan`] (pure data); the executor loads tier payloads, starts the tier lookups the
//! plan asks for and runs one forward pass over the plan's flattened batch; the commit publishes
//! the written blocks and samples, emits and finishes requests (`core/lifecycle.rs`).
//!
//! Owns the [`Backend`] (what computes the forward pass), the `cache` bookkeeping, the paged K/V memory (written only through
//! [`KvStorage::writer`], which hands evicted blocks to the tiers first) and every request's
//! state. It never talks to clients except through each request's event channel; the actor in
//! `actor.rs` drives it from its own thread. Tier I/O runs on the demotion and loader threads
//! (`tiering.rs`).

mod lifecycle;
mod pause;

pub use pause::ToolPauseInfo;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cache::{CacheConfig, KvCache, Namespace, NamespaceKey, TenantId, Tick};
use model::kv::SeqSlot;
use model::ForwardBatch;
use model::{Backend, CpuBackend, Model, ModelShape, Numerics, RowKind};

use crate::config::EngineConfig;
use crate::error::{internal, EngineBuildError, EngineError, RequestError, MAX_CHOICES};
use crate::kv_events::KvEventLog;
use crate::kv_memory::KvMemory;
use crate::paged_kv::{KvGeometry, PagedKvMemory};
use crate::plan::{PrefetchStart, StepPlan};
use crate::request::{
    EngineEvent, EventSender, EvictedBlocks, FinishReason, RequestId, RequestSpec, SessionInfo,
    SessionQuery,
};
use crate::scheduler::{SchedContext, Scheduler, SchedulerConfig};
use crate::sequence::{SeqKey, Sequence};
use crate::snapshot::{EngineSnapshot, PinnedPrompt};
use crate::stats::EngineStats;
use crate::step_budget::StepBudget;
use crate::tier_codec::{self, TierCodec};
use crate::tier_events::{KvStorage, Publisher};
use crate::tiering::{TierMatch, Tiering};

/// Prompts at least this long log a progress line after each prefill chunk.
pub const LONG_PREFILL_TOKENS: usize = 2048;

pub struct EngineCore {
    /// What computes the forward pass (the CPU today); the model's shape is read once.
    backend: Box<dyn Backend>,
    shape: ModelShape,
    cfg: EngineConfig,
    cache: KvCache,
    kv: KvStorage,
    model_fingerprint: [u8; 32],
    /// The namespace's `kv_settings`: which lossy codecs the tiers store blocks in (empty when
    /// every tier is lossless).
    tier_settings: Vec<u8>,
    seqs: HashMap<SeqKey, Sequence>,
    scheduler: Scheduler,
    tick: u64,
    started: Instant,
    stats: EngineStats,
    pinned: Vec<PinnedPrompt>,
    /// Storage tiers (`None` when none are configured: no cache events are recorded).
    tiers: Option<Tiering>,
    /// The snapshot readers see without waiting for a step: replaced after every step.
    published: SnapshotCell,
    /// Tier writes finished when `published` was taken (an idle engine republishes once the
    /// demotion thread has finished more: see [`EngineCore::publish_tier_writes`]).
    published_tier_writes: u64,
    /// Requests that ended in tool calls, retained for their next call.
    tool_pauses: crate::tool_pause::ToolPauses,
    /// Conversations inferred for requests that name no session, and their retention.
    inferred: Option<cache::InferredRetainer>,
    /// Shadow caches choosing whether inferred retention and the reuse bonus pay.
    duel: Option<cache::PolicyDuel>,
    /// `Finished` events of this step, sent after the snapshot that counts them is published
    /// (a client that saw its request finish never reads counters from before it).
    outbox: Vec<(EventSender, EngineEvent)>,
}

/// The latest published [`EngineSnapshot`], readable from any thread without waiting for the
/// engine (cheap to clone).
#[derive(Clone)]
pub struct SnapshotCell(Arc<Mutex<Option<Arc<EngineSnapshot>>>>);

impl SnapshotCell {
    pub fn get(&self) -> Arc<EngineSnapshot> {
        let cell = self.0.lock().unwrap_or_else(|e| e.into_inner());
        cell.clone()
            .expect("the engine publishes a snapshot when it is built")
    }

    fn set(&self, snap: EngineSnapshot) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(snap));
    }
}

impl EngineCore {
    /// An engine over `model`; opens the stores of `cfg.tiers` (a disk tier scans its
    /// directory; Redis connects lazily).
    pub fn new(model: Arc<Model>, cfg: EngineConfig) -> Result<Self, EngineBuildError> {
        let backend = Box::new(CpuBackend::new(model, cfg.threads));
        Self::open(backend, cfg)
    }

    /// Like [`EngineCore::new`] over any [`Backend`] (a device backend keeps the K/V pool in
    /// its memory: [`Backend::device_kv_memory`]).
    pub fn open(
        backend: Box<dyn Backend>,
        mut cfg: EngineConfig,
    ) -> Result<Self, EngineBuildError> {
        for (i, store) in cfg.tiers.stores.iter().enumerate() {
            if let Some(name) = store.codec() {
                let codec =
                    model::kv::KvDtype::parse(name).map_err(|e| EngineBuildError::TierCodec {
                        tier: i,
                        reason: e.to_string(),
                    })?;
                let codecs = &mut cfg.tiers.codecs;
                codecs.resize(codecs.len().max(i + 1), None);
                codecs[i] = Some(codec);
            }
        }
        let stores = tier::open_tiers(&cfg.tiers.stores)?
            .into_iter()
            .map(Arc::from)
            .collect();
        Self::with_backend(backend, cfg, stores)
    }

    /// Like [`EngineCore::new`] with already opened tier stores, in lookup order
    /// (`cfg.tiers.stores` is ignored). Lets callers keep handles to the stores (tests, shared
    /// stores).
    pub fn with_tier_stores(
        model: Arc<Model>,
        cfg: EngineConfig,
        stores: Vec<Arc<dyn tier::TierStore>>,
    ) -> Result<Self, EngineBuildError> {
        let backend = Box::new(CpuBackend::new(model, cfg.threads));
        Self::with_backend(backend, cfg, stores)
    }

    /// Like [`EngineCore::with_tier_stores`] over any [`Backend`] (the engine needs nothing
    /// else of the model).
    pub fn with_backend(
        mut backend: Box<dyn Backend>,
        cfg: EngineConfig,
        stores: Vec<Arc<dyn tier::TierStore>>,
    ) -> Result<Self, EngineBuildError> {
        if !stores.is_empty() && !cfg.prefix_caching {
            return Err(EngineBuildError::Config(
                "storage tiers need prefix_caching (blocks are found by their prefix keys)",
            ));
        }
        if cfg.max_batch_tokens == 0
            || cfg.max_seqs == 0
            || cfg.block_size == 0
            || cfg.num_blocks == 0
        {
            return Err(EngineBuildError::Config(
                "num_blocks, block_size, max_batch_tokens and max_seqs must be > 0",
            ));
        }
        let mut cache_cfg = CacheConfig::new(cfg.num_blocks as u32);
        cache_cfg.block_size = cfg.block_size as u32;
        cache_cfg.policy = cfg.policy;
        cache_cfg.max_retained_fraction = cfg.max_retained_fraction;
        cache_cfg.record_events = !stores.is_empty() || cfg.kv_events.is_some();
        for (tenant, share) in &cfg.tenant_shares {
            if let Some(r) = share.reserved_blocks {
                cache_cfg.tenant_reserved_blocks.insert(*tenant, r);
            }
            if let Some(m) = share.max_blocks {
                cache_cfg.tenant_quota_blocks.insert(*tenant, m);
            }
            if let Some(m) = share.max_retained_blocks {
                cache_cfg.tenant_max_retained_blocks.insert(*tenant, m);
            }
        }
        // Inferred conversations need the prefix cache's keys; the duel's arms are shaped like
        // the pool (bookkeeping only, no K/V), without events.
        let inferred = (cfg.inferred_conversations)
            .filter(|_| cfg.prefix_caching)
            .map(cache::InferredRetainer::new);
        let duel = match (cfg.inferred_conversations, cfg.policy_duel) {
            (Some(i), Some(d)) if cfg.prefix_caching => {
                let mut shadow = cache_cfg.clone();
                shadow.record_events = false;
                Some(cache::PolicyDuel::new(&shadow, i, d)?)
            }
            _ => None,
        };
        let mut cache = KvCache::new(cache_cfg)?;
        // Reuse-aware LRU starts as plain LRU: its bonus is the learned return time.
        cache.set_reuse_bonus(0);
        let c = backend.shape();
        let geo = KvGeometry {
            num_blocks: cfg.num_blocks,
            block_size: cfg.block_size,
            num_layers: c.num_layers,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };
        let mem = match backend.device_kv_memory(cfg.num_blocks, cfg.block_size, cfg.kv_dtype) {
            Some(device) => KvMemory::Device(device?),
            None => {
                let mut host = PagedKvMemory::new(geo, cfg.kv_dtype)?;
                if cfg.prefault_kv {
                    host.prefault();
                }
                KvMemory::Host(host)
            }
        };
        let kv_log = cfg
            .kv_events
            .clone()
            .map(|sink| KvEventLog::new(sink, cfg.num_blocks, cfg.block_size));
        let model_fingerprint = backend.weights_fingerprint();
        let rows_per_block = c.num_layers * c.num_kv_heads * cfg.block_size;
        let mut codecs = Vec::with_capacity(stores.len());
        for i in 0..stores.len() {
            let stored = cfg.tiers.codecs.get(i).copied().flatten();
            let codec = TierCodec::new(
                cfg.kv_dtype,
                stored.unwrap_or(cfg.kv_dtype),
                c.head_dim,
                cfg.block_size,
                rows_per_block,
            )
            .map_err(|e| EngineBuildError::TierCodec {
                tier: i,
                reason: e.to_string(),
            })?;
            debug_assert!(codec.is_lossy() || codec.block_bytes == mem.block_num_bytes());
            codecs.push(codec);
        }
        let tier_settings = tier_codec::namespace_settings(
            &codecs
                .iter()
                .enumerate()
                .map(|(i, tc)| {
                    let stored = cfg.tiers.codecs.get(i).copied().flatten();
                    (stored.unwrap_or(cfg.kv_dtype), tc.is_lossy())
                })
                .collect::<Vec<_>>(),
        );
        if !tier_settings.is_empty() {
            tracing::info!(
                settings = %String::from_utf8_lossy(&tier_settings),
                "lossy tier codecs: restored blocks are approximate, keyed apart from exact ones"
            );
        }
        let tiers = (!stores.is_empty()).then(|| {
            Tiering::new(
                stores,
                &cfg.tiers,
                cfg.num_blocks,
                cfg.block_size,
                mem.block_num_bytes(),
                codecs,
            )
        });
        let scheduler = Scheduler::new(SchedulerConfig {
            max_batch_tokens: cfg.max_batch_tokens,
            max_seqs: cfg.max_seqs,
            block_size: cfg.block_size,
            prefix_caching: cfg.prefix_caching,
            budget: StepBudget {
                target: cfg.step_time_target,
                min_prefill_tokens: cfg.min_prefill_tokens_per_step,
            },
        });
        let mut core = EngineCore {
            shape: backend.shape(),
            backend,
            cfg,
            cache,
            kv: KvStorage::new(mem, kv_log),
            model_fingerprint,
            tier_settings,
            seqs: HashMap::new(),
            scheduler,
            tick: 0,
            started: Instant::now(),
            stats: EngineStats::default(),
            tool_pauses: Default::default(),
            inferred,
            duel,
            pinned: Vec::new(),
            tiers,
            published: SnapshotCell(Arc::default()),
            published_tier_writes: 0,
            outbox: Vec::new(),
        };
        core.publish();
        Ok(core)
    }

    /// Where this engine publishes its snapshot (after every step and [`EngineCore::publish`]).
    pub fn snapshot_cell(&self) -> SnapshotCell {
        self.published.clone()
    }

    /// Publishes the current snapshot to [`EngineCore::snapshot_cell`].
    pub fn publish(&mut self) {
        self.published_tier_writes = self.tiers.as_ref().map_or(0, |t| t.writes_done());
        self.published.set(self.snapshot());
    }

    /// Publishes again when tier writes finished since the last snapshot: an idle engine takes
    /// no steps, and the writes it deferred to its idle time (lossy encodes) would otherwise
    /// show in the counters only after the next request. Returns whether it published.
    pub fn publish_tier_writes(&mut self) -> bool {
        let done = self.tiers.as_ref().map_or(0, |t| t.writes_done());
        let moved = done != self.published_tier_writes;
        if moved {
            self.publish();
        }
        moved
    }

    /// What computes the forward pass.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    pub fn memory(&self) -> &KvMemory {
        self.kv.memory()
    }

    /// True while any request is waiting or running.
    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    pub fn num_waiting(&self) -> usize {
        self.scheduler.num_waiting()
    }

    pub fn num_running(&self) -> usize {
        self.scheduler.num_running()
    }

    /// The KV codec id (`f16`, `int8-g64`, `k=int8-g64,v=int4-g32`, …) as it enters the namespace.
    fn codec_name(&self) -> String {
        self.cfg.kv_dtype.id()
    }

    /// The cache namespace of a tenant (with its salt) under this model and KV codec, for
    /// requests whose rows are all in the engine's attention arithmetic (no marked llama.cpp
    /// prefill rows).
    pub fn namespace(&self, tenant: TenantId, salt: &[u8]) -> NamespaceKey {
        self.namespace_for(tenant, salt, 0)
    }

    /// How every forward step computes (`EngineConfig::numerics`).
    pub fn numerics(&self) -> Numerics {
        self.cfg.numerics()
    }

    /// Whether a request with a prompt of `prompt_len` tokens computes its prompt rows in
    /// llama.cpp's tiled prefill arithmetic (`EngineConfig::llama_cpp_prefill`).
    pub fn prefills_like_llama_cpp(&self, prompt_len: usize) -> bool {
        self.cfg.llama_cpp_prefill && prompt_len >= model::PREFILL_MIN_TOKENS
    }

    /// The cache namespace of a request of a tenant with a prompt of `prompt_len` tokens: the
    /// blocks of requests that prefill like llama.cpp (their prompt rows in another arithmetic)
    /// are shared only among themselves.
    pub fn namespace_for(&self, tenant: TenantId, salt: &[u8], prompt_len: usize) -> NamespaceKey {
        let mut kv_settings = self.tier_settings.clone();
        if self.prefills_like_llama_cpp(prompt_len) {
            kv_settings.extend_from_slice(b";prompt-attention=llama.cpp-tiled");
        }
        // The arithmetic (attention regime, matmul order, split-KV chunks) ...
        kv_settings.extend_from_slice(&self.numerics().tag());
        // ... with what the K/V codec adds to it (bf16 K/V: the bf16-pair arithmetic) ...
        kv_settings.extend_from_slice(model::arith_tag(
            self.cfg.kv_dtype,
            self.backend.shape().head_dim,
        ));
        // ... and the backend's own settings (scaled RoPE computed as llama.cpp does, ...).
        kv_settings.extend_from_slice(&self.backend.kv_settings());
        Namespace {
            model_fingerprint: self.model_fingerprint,
            codec_id: self.codec_name(),
            codec_version: self.cfg.kv_dtype.version(),
            kv_settings,
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
            num_waiting: self.scheduler.num_waiting(),
            num_running: self.scheduler.num_running(),
            block_size: self.cfg.block_size,
            num_blocks: self.cfg.num_blocks,
            kv_bytes_per_token: self.kv.memory().bytes_per_token(),
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
        self.kv.sync(&mut self.cache, self.tiers.as_mut(), None);
        n
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
            return Err(RequestError::NeverFits {
                needed_blocks: tokens.len().div_ceil(self.cfg.block_size),
                total_blocks: self.cfg.num_blocks,
            }
            .into());
        }
        let tick = self.next_tick();
        // Pinned tokens are a prompt prefix: computed as a prompt of their own length would
        // be, and only requests in the same arithmetic (namespace) hit them.
        let ns = self.namespace_for(tenant, salt, tokens.len());
        let kind = if self.prefills_like_llama_cpp(tokens.len()) {
            RowKind::LongPrompt
        } else {
            RowKind::Prompt
        };
        let kinds = vec![kind; tokens.len()];
        // One token beyond the prompt is never needed: only full blocks are pinned.
        let m = self.cache.lookup(&ns, tokens, tick);
        let cached = m.num_cached_tokens();
        let cs = self.cache.create_sequence(m).map_err(internal)?;
        let mut done = cached;
        let result: Result<(), EngineError> = (|| {
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
                    numerics: self.numerics(),
                    rows: &kinds[done..done + len],
                };
                let mut writer = self.kv.writer(&mut self.cache, self.tiers.as_mut());
                let mut kv = writer.view(&tables);
                self.backend
                    .forward(&batch, &mut *kv)
                    .map_err(|e| EngineError::Internal(e.to_string()))?;
                drop(kv);
                done += len;
                self.cache.mark_written(cs, done, tick).map_err(internal)?;
                let publisher = Some(Publisher::computed(&ns));
                self.kv
                    .sync(&mut self.cache, self.tiers.as_mut(), publisher);
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

    /// The retention `session` holds now (expired retention is ended first); `release` ends it
    /// too. `None` when the session retains nothing. Its evicted blocks are located in the pool
    /// here; [`EngineCore::locate_session`] finds the rest in the tiers (not for a release).
    pub fn session(&mut self, session: cache::SessionId, release: bool) -> Option<SessionQuery> {
        let tick = self.next_tick();
        self.cache.expire(tick);
        let r = self.cache.session(session)?;
        let mut evicted = EvictedBlocks::default();
        let mut to_locate = Vec::new();
        for (ns, key) in self.cache.session_evicted(session) {
            if self.cache.is_cached(key) {
                evicted.in_pool += 1;
            } else if release || self.tiers.is_none() {
                evicted.lost += 1;
            } else {
                to_locate.push(tier::TierKey::new(ns.root().0, key.0));
            }
        }
        if release {
            // Found just above, so this cannot fail.
            let _ = self.cache.release_session(session);
        }
        // Evictions not yet handed to the demoter are queued first: the tiers must see them.
        self.kv.sync(&mut self.cache, self.tiers.as_mut(), None);
        Some(SessionQuery {
            info: SessionInfo {
                tokens: r.tokens,
                blocks: r.blocks,
                ttl_left: std::time::Duration::from_millis(r.until.0.saturating_sub(tick.0)),
                priority: r.priority,
                evicted,
            },
            to_locate,
        })
    }

    /// Completes `query` with the tiers holding its evicted blocks and hands it to `reply`: at
    /// once when there is nothing to locate, otherwise from the tier loader thread (after the
    /// demotions queued so far are written).
    pub fn locate_session(
        &mut self,
        query: SessionQuery,
        reply: impl FnOnce(SessionInfo) + Send + 'static,
    ) {
        let SessionQuery {
            mut info,
            to_locate,
        } = query;
        match self.tiers.as_mut() {
            Some(t) if !to_locate.is_empty() => t.locate(to_locate, move |in_tiers, lost| {
                info.evicted.in_tiers = in_tiers;
                info.evicted.lost += lost;
                reply(info)
            }),
            _ => {
                info.evicted.lost += to_locate.len() as u32;
                reply(info)
            }
        }
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
        self.check_request(&spec)?;
        let ns = self.namespace_for(spec.tenant, &spec.cache_salt, spec.prompt.len());
        let key = SeqKey(id, 0);
        if self.seqs.contains_key(&key) {
            return Err(EngineError::Internal(format!(
                "duplicate request id {}",
                id.0
            )));
        }
        let priority = spec.priority;
        self.seqs.insert(key, Sequence::new(spec, ns, sink));
        self.scheduler.enqueue(key, priority);
        self.start_prefetch(key, false);
        Ok(())
    }

    /// Checks a request against the model and this engine's size.
    fn check_request(&self, spec: &RequestSpec) -> Result<(), RequestError> {
        let c = self.shape;
        if spec.prompt.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        if let Some(&t) = spec.prompt.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(RequestError::BadToken(t));
        }
        spec.sampling.validate()?;
        let total = spec.prompt.len() + spec.max_tokens;
        if total > c.context_length {
            return Err(RequestError::ContextTooLong {
                prompt_tokens: spec.prompt.len(),
                max_tokens: spec.max_tokens,
                context_length: c.context_length,
            });
        }
        if spec.n == 0 || spec.n > MAX_CHOICES {
            return Err(RequestError::Choices(spec.n));
        }
        // Choices share the prompt's full blocks; each needs its own blocks for its output.
        let needed_blocks = total.div_ceil(self.cfg.block_size)
            + (spec.n - 1) * (spec.max_tokens.div_ceil(self.cfg.block_size) + 1);
        if needed_blocks > self.cfg.num_blocks {
            return Err(RequestError::NeverFits {
                needed_blocks,
                total_blocks: self.cfg.num_blocks,
            });
        }
        Ok(())
    }

    /// Starts the tier lookup of `id`'s full prompt blocks beyond what the active pool holds
    /// now (at least one token is always computed). `force` ignores the prefetch byte cap.
    fn start_prefetch(&mut self, id: SeqKey, force: bool) -> bool {
        if self.tiers.is_none() {
            return false;
        }
        // Pending evictions are queued for demotion first: the lookup must see them.
        self.kv.sync(&mut self.cache, self.tiers.as_mut(), None);
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

    /// Runs one step — schedule, execute, commit — then publishes the snapshot and sends the
    /// step's `Finished` events. Returns the number of tokens computed.
    pub fn step(&mut self) -> Result<usize, EngineError> {
        if let Some(t) = &self.tiers {
            t.set_busy(true);
        }
        let result = self.run_step();
        if let Some(t) = &self.tiers {
            t.set_busy(self.has_work());
        }
        self.publish();
        for (sink, event) in self.outbox.drain(..) {
            let _ = sink.send(event);
        }
        result
    }

    fn run_step(&mut self) -> Result<usize, EngineError> {
        // A stalled request never sends again, so it would never learn that its reader left:
        // look, and end those whose channel is closed.
        let gone: Vec<SeqKey> = (self.seqs.iter())
            .filter(|(_, s)| s.is_stalled() && s.sink.is_closed())
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            self.finish(k, FinishReason::Cancelled);
        }
        let tick = self.next_tick();
        self.cache.expire(tick);
        let plan = self.scheduler.schedule(&mut SchedContext {
            cache: &mut self.cache,
            seqs: &mut self.seqs,
            tiers: self.tiers.as_mut().map(|t| t as &mut dyn TierMatch),
            events: self.kv.events(),
            tick,
        })?;
        self.stats.preemptions += plan.preempted.len() as u64;
        for id in &plan.first_admissions {
            let s = &self.seqs[id];
            let cached_tokens = s.cached_tokens.unwrap_or(0);
            let _ = s.send(EngineEvent::Admitted { cached_tokens });
        }
        self.start_prefetches(&plan.prefetches);
        if plan.is_idle() {
            if let Some(t) = self.tiers.as_mut() {
                // Only tier loads are outstanding: wait for one instead of spinning.
                t.wait_for_prefetch();
            }
            return Ok(0);
        }
        self.stats.steps += 1;
        let started = Instant::now();
        let logits = self.execute(&plan)?;
        let num_prefill = self.count_tokens(&plan);
        if let Some(t) = self.tiers.as_mut() {
            t.observe_forward(plan.num_tokens(), num_prefill, started.elapsed());
        }
        self.commit(&plan, &logits, tick)?;
        let took = started.elapsed();
        tracing::trace!(
            target: "agentkv::step",
            rows = plan.num_tokens(),
            decodes = plan.num_tokens() - num_prefill,
            prefill_tokens = num_prefill,
            max_depth = plan.work.iter().map(|w| w.start + w.len).max().unwrap_or(0),
            took_us = took.as_micros() as u64,
            "step"
        );
        self.scheduler.observe(&plan, took);
        Ok(plan.num_tokens())
    }

    /// Starts the tier lookups a plan asks for (after the evictions of the plan reached the
    /// demotion queue, so the lookups see them).
    fn start_prefetches(&mut self, starts: &[PrefetchStart]) {
        if starts.is_empty() {
            return;
        }
        self.kv.sync(&mut self.cache, self.tiers.as_mut(), None);
        let Some(t) = self.tiers.as_mut() else {
            return;
        };
        for p in starts {
            let s = &self.seqs[&p.id];
            if p.refetch {
                t.refetch(p.id, s.ns, &s.tokens, p.first_block, p.max_blocks);
            } else {
                t.prefetch(p.id, s.ns, &s.tokens, p.first_block, p.max_blocks, true);
            }
        }
    }

    /// Counts the plan's decode and prefill tokens in the stats; returns the prefill tokens.
    fn count_tokens(&mut self, plan: &StepPlan) -> usize {
        let mut num_prefill = 0;
        for w in &plan.work {
            if self.seqs[&w.id].is_decoding() {
                self.stats.decode_tokens += 1;
            } else {
                num_prefill += w.len;
            }
        }
        self.stats.prefill_tokens += num_prefill as u64;
        num_prefill
    }

    /// Loads the plan's tier payloads into their blocks and runs the forward pass; returns the
    /// logits of the rows that end a sequence's pending tokens, in plan order.
    fn execute(&mut self, plan: &StepPlan) -> Result<Vec<f32>, EngineError> {
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        let mut slots = Vec::new();
        let mut logits_for = Vec::new();
        // What each row is — a property of its request and position, never of this batch: the
        // prompt rows of requests that prefill like llama.cpp, other prompt rows, generated
        // tokens (which llama-server feeds one per step).
        let mut kinds = Vec::new();
        // Sequences that sample after this pass.
        let mut samples = Vec::new();
        let mut tables = Vec::with_capacity(plan.work.len());
        for (slot, w) in plan.work.iter().enumerate() {
            let s = &self.seqs[&w.id];
            let prompt_len = s.spec.prompt.len();
            let llama = self.prefills_like_llama_cpp(prompt_len);
            for p in w.start..w.start + w.len {
                tokens.push(s.tokens[p]);
                positions.push(p as u32);
                slots.push(SeqSlot(slot as u32));
                kinds.push(if p >= prompt_len {
                    RowKind::Generated
                } else if llama {
                    RowKind::LongPrompt
                } else {
                    RowKind::Prompt
                });
            }
            if w.start + w.len == s.tokens.len() {
                logits_for.push(tokens.len() - 1);
                samples.push(w.id);
            }
            let cs = s.cache_seq.expect("planned sequences hold blocks");
            tables.push(self.cache.block_table(cs).map_err(internal)?.to_vec());
        }
        let numerics = self.numerics();
        // Evicted blocks may be rewritten below: the writer demotes them first.
        let mut writer = self.kv.writer(&mut self.cache, self.tiers.as_mut());
        for load in &plan.tier_loads {
            debug_assert!(
                self.seqs.contains_key(&load.id),
                "loads go to planned sequences"
            );
            for (block, bytes) in load.blocks.iter().zip(&load.payloads) {
                // Lengths were checked by the fetch: a failure here is an engine bug.
                writer.load_block_bytes(*block, bytes).map_err(internal)?;
            }
        }
        let table_refs: Vec<&[cache::BlockId]> = tables.iter().map(|t| t.as_slice()).collect();
        let batch = ForwardBatch {
            tokens: &tokens,
            positions: &positions,
            slots: &slots,
            logits_for: &logits_for,
            numerics,
            rows: &kinds,
        };
        let mut kv = writer.view(&table_refs);
        // Constrained sequences that sample after this pass get their token masks computed now,
        // on another thread, while the forward pass computes the logits (a mask depends only on
        // the tokens accepted so far).
        let masks: Vec<&mut model::Sampler> = self
            .seqs
            .iter_mut()
            .filter(|(k, s)| samples.contains(k) && s.sampler.is_constrained())
            .map(|(_, s)| &mut s.sampler)
            .collect();
        let backend = &mut self.backend;
        let logits = if masks.is_empty() {
            backend.forward(&batch, &mut *kv)
        } else {
            std::thread::scope(|scope| {
                let prepared =
                    scope.spawn(move || masks.into_iter().for_each(|s| s.prepare_constraint()));
                let logits = backend.forward(&batch, &mut *kv);
                // A constraint that panicked computes its mask again when sampling.
                let _ = prepared.join();
                logits
            })
        };
        logits.map_err(|e| EngineError::Internal(e.to_string()))
    }

    /// Publishes every full block the plan wrote, then samples for each sequence whose pending
    /// tokens are all computed (forking `n > 1` choices after the prompt).
    fn commit(&mut self, plan: &StepPlan, logits: &[f32], tick: Tick) -> Result<(), EngineError> {
        let vocab = self.shape.vocab_size;
        let mut to_sample = Vec::new();
        for w in &plan.work {
            let s = self.seqs.get_mut(&w.id).expect("planned sequences exist");
            s.num_computed = w.start + w.len;
            let cs = s.cache_seq.expect("planned sequences hold blocks");
            if self.cfg.prefix_caching {
                // Publishes every full block now written (visible to lookups from here on) —
                // of a request that prefills like llama.cpp, its prompt blocks only: a fresh
                // request would compute the generated rows as prompt rows, in the other
                // arithmetic.
                let ns = s.ns;
                let prompt_len = s.spec.prompt.len();
                let publish =
                    if self.cfg.llama_cpp_prefill && prompt_len >= model::PREFILL_MIN_TOKENS {
                        s.num_computed.min(prompt_len)
                    } else {
                        s.num_computed
                    };
                self.cache
                    .mark_written(cs, publish, tick)
                    .map_err(internal)?;
                let publisher = Some(Publisher::computed(&ns));
                self.kv
                    .sync(&mut self.cache, self.tiers.as_mut(), publisher);
            }
            if s.num_computed == s.tokens.len() {
                to_sample.push(w.id);
            } else if s.tokens.len() >= LONG_PREFILL_TOKENS {
                tracing::info!(
                    request = w.id.0 .0,
                    computed = s.num_computed,
                    prompt_tokens = s.tokens.len(),
                    "prefill progress"
                );
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
        Ok(())
    }
}
