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
}
