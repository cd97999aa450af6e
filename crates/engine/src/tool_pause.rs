//! Tool pauses: a request that ended in tool calls (the server says so after parsing the reply)
//! keeps its blocks for the agent's next call, for a TTL from a cost model, and a later pause
//! that extends an earlier one supersedes it. Owns the TTL rule and the supersession index;
//! never touches K/V bytes and never decides eviction (retention is the cache's soft bias, and
//! blocks evicted anyway under pressure are demoted to the tiers like any other).
//!
//! The TTL is sized by what a return within it saves (Continuum's rule): the seconds the context
//! would cost to get back — recomputing it at the measured prefill speed, or loading it from the
//! fastest tier at its measured bandwidth when that is cheaper — times
//! `ttl_per_saved_second`, clamped to `[min_ttl, max_ttl]`. A long context that is slow to
//! recompute is kept long; a short one, or one a tier reloads quickly, briefly.

use std::collections::HashMap;
use std::time::Duration;

use cache::{BlockId, SessionId};

/// How tool pauses are retained.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToolPauseConfig {
    /// Retain a request's blocks when the server reports it ended in tool calls.
    pub enabled: bool,
    /// TTL seconds per second that a return within the TTL saves.
    pub ttl_per_saved_second: f64,
    pub min_ttl: Duration,
    pub max_ttl: Duration,
    /// TTL while the cost model has not measured a prefill speed yet.
    pub unmeasured_ttl: Duration,
}

impl Default for ToolPauseConfig {
    fn default() -> Self {
        ToolPauseConfig {
            enabled: true,
            ttl_per_saved_second: 30.0,
            min_ttl: Duration::from_secs(5),
            max_ttl: Duration::from_secs(300),
            unmeasured_ttl: Duration::from_secs(30),
        }
    }
}

/// The TTL of a pause whose context costs `recompute_s` to recompute and `reload_s` to load from
/// the fastest tier (`None`: not measured / no tier).
pub fn pause_ttl(
    cfg: &ToolPauseConfig,
    recompute_s: Option<f64>,
    reload_s: Option<f64>,
) -> Duration {
    let saved = match (recompute_s, reload_s) {
        (Some(r), Some(l)) => r.min(l),
        (Some(r), None) => r,
        (None, _) => return cfg.unmeasured_ttl.clamp(cfg.min_ttl, cfg.max_ttl),
    };
    let ttl = Duration::from_secs_f64((saved * cfg.ttl_per_saved_second).clamp(0.0, 1e9));
    ttl.clamp(cfg.min_ttl, cfg.max_ttl)
}

/// The live pauses, by the last block each retains: a new pause whose chain passes through that
/// block extends it, so the old one is released (the part of the old call that the new one no
/// longer uses stops being retained; the shared part is retained by the new pause).
#[derive(Debug, Default)]
pub(crate) struct ToolPauses {
    by_last_block: HashMap<BlockId, SessionId>,
}

impl ToolPauses {
    /// Records a pause retaining `blocks` (chain order) under `session`; returns the sessions it
    /// supersedes (to release).
    pub fn record(&mut self, session: SessionId, blocks: &[BlockId]) -> Vec<SessionId> {
        let superseded: Vec<SessionId> = blocks
            .iter()
            .filter_map(|b| self.by_last_block.remove(b))
            .filter(|s| *s != session)
            .collect();
        if let Some(last) = blocks.last() {
            self.by_last_block.insert(*last, session);
        }
        superseded
    }

    /// Number of pauses tracked (some may have expired in the cache since).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_last_block.len()
    }

    /// Forgets pauses whose session no longer retains anything.
    pub fn retain_live(&mut self, live: impl Fn(SessionId) -> bool) {
        self.by_last_block.retain(|_, s| live(*s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ttl_follows_what_a_return_saves() {
        let cfg = ToolPauseConfig::default();
        // 4 s to recompute → 120 s; a tier reloading in 0.5 s → 15 s; tiny contexts → min.
        assert_eq!(pause_ttl(&cfg, Some(4.0), None), Duration::from_secs(120));
        assert_eq!(
            pause_ttl(&cfg, Some(4.0), Some(0.5)),
            Duration::from_secs(15)
        );
        assert_eq!(pause_ttl(&cfg, Some(0.01), None), cfg.min_ttl);
        assert_eq!(pause_ttl(&cfg, Some(100.0), None), cfg.max_ttl);
        assert_eq!(pause_ttl(&cfg, None, Some(1.0)), cfg.unmeasured_ttl);
    }

    #[test]
    fn a_pause_that_extends_another_supersedes_it() {
        let mut p = ToolPauses::default();
        let b = |i: u32| BlockId(i);
        assert!(p.record(SessionId(1), &[b(0), b(1), b(2)]).is_empty());
        // Another agent's pause on a different branch supersedes nothing.
        assert!(p.record(SessionId(2), &[b(0), b(7)]).is_empty());
        // Call N+1 of agent 1 passes through N's last block.
        assert_eq!(
            p.record(SessionId(3), &[b(0), b(1), b(2), b(3)]),
            vec![SessionId(1)]
        );
        assert_eq!(p.len(), 2);
        p.retain_live(|s| s != SessionId(2));
        assert_eq!(p.len(), 1);
    }
}
