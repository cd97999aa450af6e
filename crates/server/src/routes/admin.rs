//! Admin routes (admin key): `POST /v1/cache/flush` (all, or one tenant) and
//! `GET /v1/cache/stats`.

use api::admin::{
    BlockUsage, CacheStats, FlushRequest, FlushResponse, PinnedPromptStats, TenantCacheStats,
    TierCacheStats,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;

use crate::error::ApiError;
use crate::params::parse_json;
use crate::routes::{body_bytes, snapshot};
use crate::state::AppState;

pub async fn flush(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<FlushResponse>, ApiError> {
    state.tenants.authenticate_admin(&headers)?;
    let body = body_bytes(&state, body)?;
    let req: FlushRequest = if body.iter().all(u8::is_ascii_whitespace) {
        FlushRequest::default()
    } else {
        parse_json(&body)?
    };
    let tenant = match &req.tenant {
        None => None,
        // Only a tenant this server serves (a server with named tenants has no `default`).
        Some(name) => Some(
            (state.tenants.serving().iter())
                .find(|t| &t.name == name)
                .ok_or_else(|| ApiError::NotFound(format!("no tenant named {name:?}")))?
                .id,
        ),
    };
    let rx = state.engine.flush(tenant).map_err(ApiError::from_engine)?;
    let flushed = rx.await.map_err(|_| ApiError::ShuttingDown)?;
    Ok(Json(FlushResponse {
        flushed_blocks: u64::from(flushed),
    }))
}

pub async fn stats(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<CacheStats>, ApiError> {
    state.tenants.authenticate_admin(&headers)?;
    let s = snapshot(&state).await?;
    let c = &s.cache;
    Ok(Json(CacheStats {
        prefix_caching: s.prefix_caching,
        kv_codec: s.kv_codec.clone(),
        block_size: s.block_size as u64,
        kv_bytes_per_token: s.kv_bytes_per_token as u64,
        blocks: BlockUsage {
            total: u64::from(s.usage.total),
            free: u64::from(s.usage.free),
            in_use: u64::from(s.usage.in_use),
            cached: u64::from(s.usage.cached),
            pinned: u64::from(s.usage.pinned),
        },
        fragmentation: s.fragmentation,
        num_running: s.num_running as u64,
        num_waiting: s.num_waiting as u64,
        lookups: c.lookups,
        hit_tokens: c.lookup_hit_tokens,
        miss_tokens: c.lookup_miss_tokens,
        evicted_blocks: c.evictions.total_pressure() + c.evictions.flush,
        preemptions: s.stats.preemptions,
        tenants: s
            .tenants
            .iter()
            .map(|(id, t)| TenantCacheStats {
                tenant: state.tenants.name_of(*id),
                lookups: t.lookups,
                hit_tokens: t.hit_tokens,
                miss_tokens: t.miss_tokens,
                cached_blocks: u64::from(t.cached_blocks),
                evicted_blocks: t.evicted_blocks,
            })
            .collect(),
        pinned_prompts: s
            .pinned
            .iter()
            .map(|p| PinnedPromptStats {
                name: p.name.clone(),
                tenant: state.tenants.name_of(p.tenant),
                num_tokens: p.num_tokens as u64,
                pinned_tokens: p.pinned_tokens as u64,
            })
            .collect(),
        tiers: s
            .tiers
            .tiers
            .iter()
            .map(|t| TierCacheStats {
                kind: t.kind.as_str().to_string(),
                hit_tokens: t.engine.hit_tokens,
                hits: t.stats.hits,
                misses: t.stats.misses,
                bytes_read: t.stats.bytes_read,
                bytes_written: t.stats.bytes_written,
                evictions: t.stats.evictions,
                errors: t.stats.errors,
                corrupt: t.stats.corrupt + t.engine.rejected,
                stored_objects: t.stats.stored_objects,
                stored_bytes: t.stats.stored_bytes,
                demoted_blocks: t.engine.demoted_blocks,
                already_held_blocks: t.engine.already_held_blocks,
                busy_encoded_blocks: t.engine.busy_encoded_blocks,
                load_decisions: t.engine.load_decisions,
                recompute_decisions: t.engine.recompute_decisions,
                mean_load_us: t
                    .stats
                    .load_sum_us
                    .checked_div(t.stats.load_count)
                    .unwrap_or(0),
                load_bytes_per_s: t.engine.load_bytes_per_s,
            })
            .collect(),
    }))
}
