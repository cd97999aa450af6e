//! Counters of the engine's own work (the cache and the tiers keep their own).

/// Counters of the engine's own work (the cache keeps its own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub steps: u64,
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
    pub preemptions: u64,
    pub finished: u64,
    pub cancelled: u64,
    /// Requests ended because their output constraint allowed no next token (or failed).
    pub constraint_dead_ends: u64,
    /// Blocks put under session retention when requests finished.
    pub retained_blocks: u64,
    /// Requests that ended in tool calls whose blocks were retained for the next call.
    pub tool_pauses: u64,
    /// Tool pauses released because a later pause extended them.
    pub tool_pauses_superseded: u64,
    /// Finished requests without a named session placed in inferred conversations, and of
    /// those the ones that continued a conversation's latest turn or branched from an earlier
    /// one (`cache::Conversations`).
    pub inferred_turns: u64,
    pub inferred_continuations: u64,
    pub inferred_branches: u64,
    /// Inferred retentions released early to make room for named sessions or breakpoints.
    pub inferred_released_for_explicit: u64,
    /// The TTL an inferred conversation's latest turn gets now (ms; learned return gaps).
    pub inferred_ttl_ms: u64,
    /// Inferred turns not retained because the shadow caches said retention did not pay.
    pub inferred_unretained: u64,
    /// Reuse-aware LRU's bonus in force (ms; 0 while not learned or not paying).
    pub reuse_bonus_ms: u64,
}
