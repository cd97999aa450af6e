//! `agentkv serve`: loads the YAML config (flags override it), sizes the KV pool from
//! `kv_cache_config.max_size`, starts the engine, prefills and pins the warm-up prompts (with a
//! progress bar), prints `listening on http://ADDR` on stdout and serves until Ctrl-C / SIGTERM.
//! Owns the wiring only: routes live in the `server` crate, scheduling in `engine`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use engine::{Engine, EngineConfig, EngineCore};
use server::{AppState, Limits, ServerSettings, TenantSpec};

use crate::config::{parse_size, FileConfig, PromptDef};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// YAML config: server, model, kv_cache_config, prompts, tenants, limits (see README,
    /// "Serving"). Flags below override it.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Address to bind (default 127.0.0.1).
    #[arg(long)]
    pub host: Option<String>,
    /// Port to bind; 0 picks a free one (default 8000).
    #[arg(long)]
    pub port: Option<u16>,
    /// GGUF model file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf, or $AGENTKV_MODEL).
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Compute threads (default: all cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// What runs the forward pass: cpu, cuda (GPU 0; fails at start without one) or auto
    /// (overrides model.device; default auto).
    #[arg(long, value_enum)]
    pub device: Option<super::device::Device>,
    /// Turn prefix reuse off (for comparisons): every prompt is computed in full.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// KV memory, e.g. 2GB or 512MiB (overrides kv_cache_config.max_size; default 2048 blocks).
    #[arg(long)]
    pub max_size: Option<String>,
    /// Publish KV events (vLLM's ZMQ format) on this PUB endpoint, e.g. tcp://*:5557
    /// (overrides kv_events.endpoint; off by default).
    #[arg(long)]
    pub kv_events_endpoint: Option<String>,
    /// Answer KV-event replay requests on this ROUTER endpoint, e.g. tcp://*:5558.
    #[arg(long)]
    pub kv_events_replay_endpoint: Option<String>,
    /// Let the KV-event endpoints bind non-loopback addresses (`tcp://*:P` then binds every
    /// interface). Events carry prompt token ids only with --kv-events-publish-token-ids.
    #[arg(long)]
    pub kv_events_allow_remote: bool,
    /// Send prompt token ids in KV events even to remote subscribers.
    #[arg(long)]
    pub kv_events_publish_token_ids: bool,
    /// Log lines as text (default) or JSON, to stderr; filter with RUST_LOG (default info).
    #[arg(long, value_enum)]
    pub log_format: Option<super::logging::LogFormat>,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let file = match &args.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    let device = args.device.or(file.model.device).unwrap_or_default();
    let chosen = super::device::choose(device)?;
    tracing::info!(device = chosen.name(), "forward pass");
    let model_path = args
        .model
        .clone()
        .or_else(|| file.model.path.clone())
        .unwrap_or_else(model::default_model_path);
    let model = Arc::new(
        model::Model::load(&model_path)
            .with_context(|| format!("loading model {}", model_path.display()))?,
    );
    let auto_kv = crate::config::auto_kv_dtype(
        matches!(chosen, super::device::Chosen::Cpu),
        kernels::cpu_features(),
        model.config().head_dim,
        model.config().sliding_window.is_some(),
        file.model.llama_cpp_prefill.unwrap_or(false),
    );
    let mut engine_cfg = engine_config(&args, &file, &model, auto_kv)?;
    let settings = server_settings(&file, &model_path);
    settings.validate().context("config")?;
    let summary = Summary::new(&model, &model_path, &engine_cfg, &settings, &file);
    let publisher = match kv_events_config(&args, &file) {
        Some(cfg) => {
            let (sink, events) = engine::KvEventSink::channel();
            engine_cfg.kv_events = Some(sink);
            let p = kvevents::Publisher::start(cfg, events).context("kv_events")?;
            tracing::info!(
                endpoint = %p.endpoint,
                replay = p.replay_endpoint.as_deref().unwrap_or("-"),
                "publishing KV events"
            );
            Some(p)
        }
        None => None,
    };
    let core = match &chosen {
        super::device::Chosen::Cpu => EngineCore::new(Arc::clone(&model), engine_cfg)?,
        super::device::Chosen::Cuda(ops) => {
            let backend =
                model::GpuBackend::new(ops.clone(), &model).context("the model on the GPU")?;
            EngineCore::open(Box::new(backend), engine_cfg)?
        }
    };
    let engine = Engine::start(core);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let host = args
        .host
        .clone()
        .or_else(|| file.server.host.clone())
        .unwrap_or_else(|| "127.0.0.1".into());
    let port = args.port.or(file.server.port).unwrap_or(8000);
    let result = runtime.block_on(async {
        warm_up(&engine, &model, &file, &settings).await?;
        let state = AppState::new(engine.handle(), Arc::clone(model.frontend()), settings)?;
        let listener = server::transport::bind(&host, port)
            .await
            .with_context(|| format!("binding {host}:{port}"))?;
        let addr: SocketAddr = listener.local_addr()?;
        summary.log(addr);
        println!("listening on http://{addr}");
        std::io::stdout().flush()?;
        server::serve(listener, state, shutdown_signal()).await?;
        tracing::info!("shut down");
        anyhow::Ok(())
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    drop(engine);
    drop(publisher);
    result
}

/// The KV-event publisher's settings, when an endpoint is given (flag or `kv_events:`).
fn kv_events_config(args: &ServeArgs, file: &FileConfig) -> Option<kvevents::PublisherConfig> {
    let k = &file.kv_events;
    let endpoint = args.kv_events_endpoint.clone().or(k.endpoint.clone())?;
    let d = kvevents::PublisherConfig::default();
    let allow_remote = args.kv_events_allow_remote || k.allow_remote_subscribers.unwrap_or(false);
    // Token ids stay on the host unless the operator opts in to sending them off it.
    let token_ids =
        args.kv_events_publish_token_ids || k.publish_token_ids.unwrap_or(!allow_remote);
    Some(kvevents::PublisherConfig {
        endpoint,
        replay_endpoint: args
            .kv_events_replay_endpoint
            .clone()
            .or(k.replay_endpoint.clone()),
        topic: k.topic.clone().unwrap_or(d.topic),
        buffer_steps: k.buffer_steps.unwrap_or(d.buffer_steps),
        data_parallel_rank: 0,
        allow_remote,
        token_ids,
        format: match k.format {
            Some(crate::config::KvEventsFormat::Array) => kvevents::WireFormat::Array,
            Some(crate::config::KvEventsFormat::Map) => kvevents::WireFormat::Map,
            Some(crate::config::KvEventsFormat::ArrayOfMaps) | None => {
                kvevents::WireFormat::ArrayOfMaps
            }
        },
    })
}

/// The start-up summary: one log line with what is served and how.
struct Summary {
    model: String,
    served_name: String,
    aliases: Vec<String>,
    codec: String,
    policy: String,
    prefix_cache: bool,
    blocks: usize,
    block_size: usize,
    pool_bytes: u64,
    tiers: String,
    threads: usize,
    /// Step-time target in ms (0 = off).
    step_target_ms: u64,
    tenants: usize,
    /// The float order of packed matmuls (`ggml` or `block-sum`).
    matmul: &'static str,
    /// The attention arithmetic of generated and short-prompt rows (`tiled` or `llama.cpp-row`).
    attention: &'static str,
    /// The kernel paths this CPU runs (`avx2`, `avx512+vnni`, …).
    isa: &'static str,
    /// Whether `quantization: auto` (the default) chose the codec.
    codec_auto: bool,
    /// bf16 K/V on a CPU without AVX-512 BF16: their attention arithmetic is emulated there
    /// (`kernels::flash_tile_pairs`, 2-5x slower than f16).
    bf16_kv_emulated: bool,
}

impl Summary {
    fn new(
        model: &model::Model,
        path: &std::path::Path,
        cfg: &EngineConfig,
        settings: &ServerSettings,
        file: &FileConfig,
    ) -> Summary {
        let bytes_per_token = cfg.kv_dtype.bytes_per_token(
            model.config().num_layers,
            model.config().num_kv_heads,
            model.config().head_dim,
        );
        Summary {
            model: path.display().to_string(),
            served_name: settings.model_name.clone(),
            aliases: settings.model_aliases.clone(),
            // The codec's own name (`f16`, `int8`, `k=int8,v=int4`, …).
            codec: cfg.kv_dtype.to_string(),
            codec_auto: file
                .kv_cache_config
                .quantization
                .as_ref()
                .is_none_or(|q| q.0 == "auto"),
            policy: format!("{:?}", cfg.policy),
            prefix_cache: cfg.prefix_caching,
            blocks: cfg.num_blocks,
            block_size: cfg.block_size,
            pool_bytes: bytes_per_token as u64 * (cfg.num_blocks * cfg.block_size) as u64,
            tiers: if file.tiers.is_empty() {
                "none".into()
            } else {
                file.tiers
                    .iter()
                    .map(tier_name)
                    .collect::<Vec<_>>()
                    .join(" > ")
            },
            threads: cfg.threads,
            step_target_ms: cfg.step_time_target.map_or(0, |t| t.as_millis() as u64),
            tenants: settings.tenants.len(),
            matmul: cfg.numerics().matmul().packed_def().name(),
            attention: cfg.numerics().attention().name(),
            isa: kernels::cpu_features().name(),
            bf16_kv_emulated: {
                let (f, hd) = (kernels::cpu_features(), model.config().head_dim);
                (model::pairs_arithmetic(cfg.kv_dtype) && !f.bf16)
                    || (model::coded_pairs_arithmetic(cfg.kv_dtype, hd) && !(f.bf16 && f.vnni))
            },
        }
    }

    fn log(&self, addr: SocketAddr) {
        tracing::info!(
            model = %self.model,
            served_name = %self.served_name,
            aliases = ?self.aliases,
            kv_codec = %self.codec,
            kv_codec_auto = self.codec_auto,
            policy = %self.policy,
            prefix_cache = self.prefix_cache,
            pool_blocks = self.blocks,
            block_tokens = self.block_size,
            pool_tokens = self.blocks * self.block_size,
            pool_bytes = self.pool_bytes,
            tiers = %self.tiers,
            threads = self.threads,
            step_target_ms = self.step_target_ms,
            tenants = self.tenants,
            matmul = self.matmul,
            attention = self.attention,
            isa = self.isa,
            listen = %format!("http://{addr}"),
            "agentkv serving"
        );
        if self.bf16_kv_emulated {
            tracing::warn!(
                kv_codec = %self.codec,
                isa = self.isa,
                "bf16 V (with bf16 or int8 K) is attended in the bf16-pair arithmetic, which \
                 this CPU (no AVX-512 BF16, or for int8 K no AVX-512 VNNI) emulates with flushed \
                 FMAs: attention at depth is 2-5x slower than with f16 K/V (the same size); \
                 choose f16 here (docs/quantization.md)"
            );
        }
    }
}

/// `ram(4000000000)`, `disk(/var/cache/agentkv)`, `redis(redis://…)`, with `, codec int8 (lossy)`
/// when the tier stores another codec than the pool's.
fn tier_name(t: &tier::TierConfig) -> String {
    let name = tier_place(t);
    match t.codec() {
        Some(codec) => format!("{name} codec {codec}"),
        None => name,
    }
}

fn tier_place(t: &tier::TierConfig) -> String {
    use tier::TierConfig;
    match t {
        TierConfig::Ram { max_size, .. } => format!("ram({} bytes)", max_size.0),
        TierConfig::Disk { path, max_size, .. } => {
            format!("disk({}, {} bytes)", path.display(), max_size.0)
        }
        TierConfig::Redis { url, urls, .. } => {
            let u = url
                .clone()
                .or_else(|| urls.first().cloned())
                .unwrap_or_default();
            // Never log credentials.
            let shown = match u.split_once('@') {
                Some((_, host)) => format!("redis://…@{host}"),
                None => u,
            };
            format!("redis({shown})")
        }
    }
}

/// Each tenant's default cap on retained blocks: an equal share of the retention budget
/// (`fraction` of `num_blocks`) with two or more tenants, none with one.
fn fair_retained_blocks(fraction: f64, num_blocks: usize, tenants: usize) -> Option<u32> {
    (tenants > 1).then(|| {
        let budget = (fraction * num_blocks as f64).floor();
        (budget / tenants as f64).floor().max(1.0) as u32
    })
}

/// The engine's settings from the flags and the file; `auto_kv` is what `quantization: auto`
/// (the default) means on this machine (`config::auto_kv_dtype`).
fn engine_config(
    args: &ServeArgs,
    file: &FileConfig,
    model: &Arc<model::Model>,
    auto_kv: model::KvDtype,
) -> Result<EngineConfig> {
    let kv = &file.kv_cache_config;
    // A server maps its K/V pool before the first request (`max_size` is committed at start).
    let mut cfg = EngineConfig {
        prefault_kv: true,
        ..EngineConfig::default()
    };
    if let Some(on) = file.model.llama_cpp_prefill {
        cfg.llama_cpp_prefill = on;
    }
    if let Some(t) = args.threads.or(file.model.threads) {
        cfg.threads = t.max(1);
    }
    if let Some(b) = kv.block_size {
        cfg.block_size = b;
    }
    cfg.kv_dtype = match &kv.quantization {
        Some(q) => q.to_dtype(auto_kv)?,
        None => auto_kv,
    };
    if let Some(p) = kv.replacement_policy {
        cfg.policy = p.to_cache();
    }
    cfg.prefix_caching = kv.prefix_caching.unwrap_or(true) && !args.no_prefix_cache;
    if let Some(n) = file.limits.max_running_requests {
        cfg.max_seqs = n;
    }
    if let Some(n) = file.limits.max_batch_tokens {
        cfg.max_batch_tokens = n;
    }
    cfg.step_time_target = file.limits.step_time_target();
    if let Some(n) = file.limits.min_prefill_tokens_per_step {
        cfg.min_prefill_tokens_per_step = n;
    }
    let max_size = match &args.max_size {
        Some(s) => Some(
            parse_size(s)
                .map_err(anyhow::Error::msg)
                .context("--max-size")?,
        ),
        None => kv.max_size.map(|b| b.0),
    };
    // The engine's own figure: a one-block probe of this model and KV codec.
    let block_bytes = |cfg: &EngineConfig| -> Result<usize> {
        let probe = EngineCore::new(
            Arc::clone(model),
            EngineConfig {
                num_blocks: 1,
                ..cfg.clone()
            },
        )?;
        Ok(probe.memory().bytes_per_token() * cfg.block_size)
    };
    if let Some(bytes) = max_size {
        let block_bytes = block_bytes(&cfg)?;
        cfg.num_blocks = (bytes / block_bytes as u64) as usize;
        if cfg.num_blocks == 0 {
            bail!("kv_cache_config.max_size: {bytes} bytes is less than one KV block ({block_bytes} bytes)");
        }
    }
    if let Some(on) = kv.tool_pause_retention {
        cfg.tool_pause.enabled = on;
    }
    if let Some(f) = kv.max_retained_fraction {
        cfg.max_retained_fraction = f; // checked by `FileConfig::parse`
    }
    if let Some(r) = kv.tool_pause_ttl_per_saved_second {
        if !(r.is_finite() && r >= 0.0) {
            bail!("kv_cache_config.tool_pause_ttl_per_saved_second: must be a number >= 0");
        }
        cfg.tool_pause.ttl_per_saved_second = r;
    }
    let max_ttl = kv.tool_pause_max_ttl_s.unwrap_or(300);
    let max_ttl = max_ttl.min(file.limits.max_cache_ttl_secs.unwrap_or(max_ttl));
    cfg.tool_pause.max_ttl = std::time::Duration::from_secs(max_ttl);
    cfg.tool_pause.enabled &= max_ttl > 0;
    cfg.tool_pause.min_ttl = cfg.tool_pause.min_ttl.min(cfg.tool_pause.max_ttl);
    cfg.tool_pause.unmeasured_ttl = cfg.tool_pause.unmeasured_ttl.min(cfg.tool_pause.max_ttl);
    if kv.infer_conversations == Some(false) {
        cfg.inferred_conversations = None;
    }
    if kv.policy_duel == Some(false) {
        cfg.policy_duel = None;
    }
    if let Some(inferred) = cfg.inferred_conversations.as_mut() {
        let m = &mut inferred.return_model;
        let max_ttl = kv.conversation_max_ttl_s.unwrap_or(m.max_ttl_ms / 1000);
        let max_ttl = max_ttl.min(file.limits.max_cache_ttl_secs.unwrap_or(max_ttl));
        m.max_ttl_ms = max_ttl.saturating_mul(1000);
        m.min_ttl_ms = m.min_ttl_ms.min(m.max_ttl_ms);
        m.default_ttl_ms = m.default_ttl_ms.min(m.max_ttl_ms);
        if max_ttl == 0 {
            cfg.inferred_conversations = None;
        }
    }
    // Tenant ids follow the order of `tenants` (as the server assigns them): 1, 2, …
    let retained_caps = file
        .tenants
        .iter()
        .any(|t| t.kv_max_retained_size.is_some());
    let bytes_per_block = if retained_caps { block_bytes(&cfg)? } else { 1 } as u64;
    // With several tenants, each may retain at most its fair share of the retention budget
    // unless its `kv_max_retained_size` says otherwise: one tenant's sessions cannot use up what
    // every other tenant's sessions need (issue #44, N6).
    let fair_retained = fair_retained_blocks(
        cfg.max_retained_fraction,
        cfg.num_blocks,
        file.tenants.len(),
    );
    for (i, t) in file.tenants.iter().enumerate() {
        let blocks = |share: f64| (share * cfg.num_blocks as f64).floor() as u32;
        let block_bytes = bytes_per_block.max(1);
        let share = engine::TenantShare {
            reserved_blocks: t.kv_reserved_share.map(blocks),
            max_blocks: t.kv_max_share.map(blocks),
            max_retained_blocks: t
                .kv_max_retained_size
                .map(|b| u32::try_from(b.0 / block_bytes).unwrap_or(u32::MAX))
                .or(fair_retained),
        };
        if share != engine::TenantShare::default() {
            cfg.tenant_shares
                .insert(cache::TenantId(i as u32 + 1), share);
        }
    }
    // Set after the probe above, which must not open the tiers.
    cfg.tiers.stores = file.tiers.clone();
    cfg.tiers.write_through = kv.tier_write_through.unwrap_or(false);
    cfg.tiers.write_on_publish = kv.tier_write_on_publish.unwrap_or(false);
    if let Some(b) = kv.tier_prefetch_max_size {
        cfg.tiers.prefetch_max_bytes = usize::try_from(b.0).unwrap_or(usize::MAX);
    }
    if let Some(ms) = kv.tier_lookup_timeout_ms {
        cfg.tiers.lookup_timeout = std::time::Duration::from_millis(ms);
    }
    if let Some(b) = kv.tier_write_queue_max_size {
        cfg.tiers.max_queued_write_bytes = usize::try_from(b.0).unwrap_or(usize::MAX);
    }
    if let Some(ms) = kv.tier_encode_deferral_ms {
        cfg.tiers.encode_deferral = std::time::Duration::from_millis(ms);
    }
    Ok(cfg)
}

/// One tenant serves every request: none is configured and no trusted proxy names them.
fn single_tenant(file: &FileConfig) -> bool {
    file.tenants.is_empty() && file.server.trusted_tenant_header.is_none()
}

fn server_settings(file: &FileConfig, model_path: &std::path::Path) -> ServerSettings {
    let l = &file.limits;
    let d = Limits::default();
    let max_requests = l.max_requests.unwrap_or(d.max_requests);
    let max_tokens = l.max_tokens.unwrap_or(d.max_tokens);
    // A tenant's bounds keep one tenant from filling the queue that others share; with a single
    // tenant there is no other, so they default to the server's own bounds (a single-tenant
    // server with 64 agents is otherwise refused past 64 requests or 256K tokens in flight,
    // while the server's queue has room for 256 and 1M).
    let (tenant_requests, tenant_tokens) = if single_tenant(file) {
        (max_requests, max_tokens)
    } else {
        (d.max_requests_per_tenant, d.max_tokens_per_tenant)
    };
    ServerSettings {
        model_name: file.server.model_name.clone().unwrap_or_else(|| {
            model_path
                .file_stem()
                .map_or_else(|| "agentkv".into(), |s| s.to_string_lossy().into_owned())
        }),
        model_aliases: file.server.model_aliases.clone(),
        unknown_fields: file
            .server
            .unknown_fields
            .map_or(server::UnknownFields::Reject, |p| p.to_server()),
        tenants: file
            .tenants
            .iter()
            .map(|t| TenantSpec {
                name: t.name.clone(),
                api_keys: t.api_keys.clone(),
                salt: t.salt.clone(),
                priority: t.priority.unwrap_or(0),
            })
            .collect(),
        admin_api_keys: file.server.admin_api_keys.clone(),
        trusted_tenant_header: file.server.trusted_tenant_header.clone(),
        trusted_proxy_api_keys: file.server.trusted_proxy_api_keys.clone(),
        metrics_api_keys: file.server.metrics_api_keys.clone(),
        metrics_per_tenant: file.server.metrics_per_tenant.unwrap_or(true),
        limits: Limits {
            max_body_bytes: l.max_body_bytes.unwrap_or(d.max_body_bytes),
            max_requests,
            max_tokens,
            max_requests_per_tenant: l.max_requests_per_tenant.unwrap_or(tenant_requests),
            max_tokens_per_tenant: l.max_tokens_per_tenant.unwrap_or(tenant_tokens),
            default_max_tokens: l.default_max_tokens.unwrap_or(d.default_max_tokens),
            retry_after_secs: l.retry_after_s.unwrap_or(d.retry_after_secs),
            max_stored_responses_per_tenant: l
                .max_stored_responses_per_tenant
                .unwrap_or(d.max_stored_responses_per_tenant),
            max_stored_response_bytes_per_tenant: l
                .max_stored_response_bytes_per_tenant
                .unwrap_or(d.max_stored_response_bytes_per_tenant),
            max_connections: l.max_connections.unwrap_or(d.max_connections),
            max_connections_per_source: l.max_connections_per_source,
            header_timeout: l
                .header_timeout_s
                .map_or(d.header_timeout, Duration::from_secs_f64),
            body_timeout: l
                .body_timeout_s
                .map_or(d.body_timeout, Duration::from_secs_f64),
            max_cache_ttl_secs: l.max_cache_ttl_secs.unwrap_or(d.max_cache_ttl_secs),
            max_tool_calls_per_turn: l
                .max_tool_calls_per_turn
                .unwrap_or(d.max_tool_calls_per_turn)
                .max(1),
        },
        shutdown_timeout: Duration::from_secs(file.server.shutdown_timeout_s.unwrap_or(30)),
    }
}

/// Token ids of a warm-up prompt, rendered exactly as a request that starts with it would be.
fn prompt_tokens(model: &model::Model, p: &PromptDef) -> Result<Vec<u32>> {
    Ok(match (&p.system, &p.text) {
        // The same path as a request's messages (client text never parsed as special tokens).
        (Some(s), _) => model.encode_chat(
            &[frontend::chat::ChatMessage::new("system", s)],
            None,
            false,
        )?,
        (None, Some(t)) => model.tokenizer().encode(t, true, false)?,
        (None, None) => Vec::new(),
    })
}

/// Prefills and pins each warm-up prompt for its tenant(s), with a progress bar.
async fn warm_up(
    engine: &Engine,
    model: &model::Model,
    file: &FileConfig,
    settings: &ServerSettings,
) -> Result<()> {
    let names = &file.kv_cache_config.warmup_prompts;
    if names.is_empty() {
        return Ok(());
    }
    let tenants = server::tenants::Tenants::new(settings);
    let mut jobs = Vec::new();
    for name in names {
        let def = &file.prompts[name];
        let tokens = prompt_tokens(model, def)?;
        for t in tenants.serving() {
            if def.tenant.as_ref().is_none_or(|want| *want == t.name) {
                jobs.push((name.clone(), tokens.clone(), t.clone()));
            }
        }
    }
    let bar = indicatif::ProgressBar::new(jobs.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("warm-up {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    for (name, tokens, tenant) in jobs {
        bar.set_message(format!("{name} ({}, {} tokens)", tenant.name, tokens.len()));
        let pinned = engine
            .handle()
            .warmup(&name, tokens, tenant.id, tenant.request_salt(None))?
            .await
            .context("engine stopped during warm-up")?
            .with_context(|| format!("warm-up prompt {name:?}"))?;
        bar.inc(1);
        bar.println(format!(
            "pinned {pinned} tokens of {name:?} for tenant {}",
            tenant.name
        ));
    }
    bar.finish_and_clear();
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down: no new requests; running requests may finish");
}

#[cfg(test)]
mod tests {
    use super::{fair_retained_blocks, server_settings};
    use crate::config::FileConfig;

    #[test]
    fn a_single_tenant_server_bounds_its_tenant_by_the_servers_queue() {
        let limits = |yaml: &str| {
            let file = FileConfig::parse(yaml).unwrap();
            let l = server_settings(&file, std::path::Path::new("m.gguf")).limits;
            (
                l.max_requests_per_tenant,
                l.max_tokens_per_tenant,
                l.max_requests,
                l.max_tokens,
            )
        };
        // No tenants: the one tenant may use the whole queue, as configured.
        assert_eq!(limits("{}\n"), (256, 1 << 20, 256, 1 << 20));
        assert_eq!(
            limits("limits: {max_requests: 100, max_tokens: 5000}\n"),
            (100, 5000, 100, 5000)
        );
        // Tenants (configured, or named by a trusted proxy): a share of it.
        let two = "tenants: [{name: a, api_keys: [ka]}, {name: b, api_keys: [kb]}]\n";
        assert_eq!(limits(two), (64, 256 << 10, 256, 1 << 20));
        let proxied = "server: {trusted_tenant_header: x-t, trusted_proxy_api_keys: [p]}\n";
        assert_eq!(limits(proxied), (64, 256 << 10, 256, 1 << 20));
        // An explicit bound always holds.
        assert_eq!(
            limits("limits: {max_requests_per_tenant: 8, max_tokens_per_tenant: 900}\n").0,
            8
        );
    }

    #[test]
    fn tenants_share_the_retention_budget_equally_by_default() {
        assert_eq!(fair_retained_blocks(0.5, 2048, 0), None);
        assert_eq!(fair_retained_blocks(0.5, 2048, 1), None);
        assert_eq!(fair_retained_blocks(0.5, 2048, 2), Some(512));
        assert_eq!(fair_retained_blocks(0.5, 2048, 3), Some(341));
        assert_eq!(fair_retained_blocks(0.01, 10, 4), Some(1));
    }
}
