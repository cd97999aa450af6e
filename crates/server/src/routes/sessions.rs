//! `GET /v1/sessions/{id}` (what the caller's session retains now) and `DELETE /v1/sessions/{id}`
//! (end its retention now). `{id}` is the client's key (`session_id`, `x-session-id` or
//! `prompt_cache_key`); it names a session of the caller's tenant only, so another tenant's
//! session with the same key is neither visible nor releasable. 404 when the session retains
//! nothing (never retained, released or expired).

use api::{SessionBlocksByTier, SessionDeleted, SessionObject};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;
use engine::{SessionInfo, TierKind};

use crate::error::ApiError;
use crate::sessions::{session_id, MAX_KEY_BYTES};
use crate::state::AppState;

async fn ask(
    state: &AppState,
    headers: &HeaderMap,
    id: &str,
    release: bool,
) -> Result<SessionInfo, ApiError> {
    let tenant = state.tenants.authenticate(headers)?;
    if id.is_empty() || id.len() > MAX_KEY_BYTES {
        return Err(ApiError::NotFound(format!("no session {id:?}")));
    }
    let rx = state
        .engine
        .session(session_id(tenant, id), release)
        .map_err(ApiError::from_engine)?;
    rx.await
        .map_err(|_| ApiError::ShuttingDown)?
        .ok_or_else(|| ApiError::NotFound(format!("session {id:?} retains nothing")))
}

pub async fn get(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<SessionObject>, ApiError> {
    let info = ask(&state, &headers, &id, false).await?;
    Ok(Json(SessionObject {
        id,
        object: "session".into(),
        retained_tokens: info.tokens as u64,
        retained_blocks: u64::from(info.blocks),
        ttl_left_s: info.ttl_left.as_secs_f64(),
        priority: engine::priority_of_rank(info.priority),
        blocks_by_tier: by_tier(&info),
    }))
}

fn by_tier(info: &SessionInfo) -> SessionBlocksByTier {
    let e = &info.evicted;
    let mut out = SessionBlocksByTier {
        active: u64::from(info.blocks + e.in_pool),
        none: u64::from(e.lost),
        ..SessionBlocksByTier::default()
    };
    for &(kind, n) in &e.in_tiers {
        let slot = match kind {
            TierKind::Ram => &mut out.ram,
            TierKind::Disk => &mut out.disk,
            TierKind::Redis => &mut out.redis,
        };
        *slot += u64::from(n);
    }
    out
}

pub async fn delete(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<SessionDeleted>, ApiError> {
    let info = ask(&state, &headers, &id, true).await?;
    Ok(Json(SessionDeleted {
        id,
        object: "session.deleted".into(),
        deleted: true,
        released_tokens: info.tokens as u64,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::EvictedBlocks;

    #[test]
    fn blocks_by_tier_count_each_place_once() {
        let info = SessionInfo {
            tokens: 64,
            blocks: 4,
            ttl_left: std::time::Duration::from_secs(9),
            priority: 0,
            evicted: EvictedBlocks {
                in_pool: 1,
                in_tiers: vec![
                    (TierKind::Ram, 2),
                    (TierKind::Disk, 3),
                    (TierKind::Redis, 0),
                ],
                lost: 5,
            },
        };
        assert_eq!(
            by_tier(&info),
            SessionBlocksByTier {
                active: 5,
                ram: 2,
                disk: 3,
                redis: 0,
                none: 5
            }
        );
    }
}
