//! Pure KV-cache bookkeeping for agentkv: a paged block pool, per-sequence block tables, a
//! hash-chained prefix index, LRU / LFU / segmented-LRU eviction (fixed or adaptive protected
//! segment: ghost lists of recently evicted keys move its capacity, ARC-style), pins and session
//! retention, tenants, counters and events — plus a cache simulator and agent-trace generators on
//! top.
//!
//! Absences (architecture invariants): no async, no I/O, no threads, no tensors, no wall clock
//! (time is a logical [`Tick`] passed in), no `unsafe`. Running out of blocks is a value
//! ([`AllocError`]); a failed allocation changes nothing.
//!
//! Lifecycle as the engine drives it:
//! 1. `let m = cache.lookup(&ns, &prompt, tick)` — the longest cached prefix (referenced);
//! 2. `let seq = cache.create_sequence(m)?` — a block table starting with those blocks;
//! 3. `cache.append_tokens(seq, &rest, tick)?` — allocates a block per boundary crossed;
//! 4. after writing K/V: `cache.mark_written(seq, num_written_tokens, tick)?` publishes full blocks;
//! 5. `cache.fork(seq, tick)?` for n > 1 / beams; `cache.free(seq, tick)?` at the end;
//! 6. optionally `retain_session` before `free`, `pin_prefix` after a warm-up prefill, `expire`.
//!
//! See `docs/kv-cache.md` for the eviction order, key derivation and invariants.

#![forbid(unsafe_code)]

mod cache;
pub mod config;
mod conversation;
pub mod counters;
mod duel;
pub mod error;
pub mod events;
mod evict;
pub mod ids;
mod index;
mod inferred;
mod invariants;
pub mod key;
mod pool;
mod replay;
mod retention;
mod return_model;
pub mod sim;
mod table;
pub mod tenant;

pub use cache::{
    BlockCopy, BlockReplacement, Fork, KvCache, MissReason, PinOutcome, PrefixMatch, PrefixMiss,
    PublishReport, RetainOutcome, SessionRetention,
};
pub use config::{CacheConfig, EvictionPolicy};
pub use conversation::{ConversationConfig, Conversations, FinishedRequest, Turn, TurnKind};
pub use counters::{BlockUsage, Counters, EvictionCause, EvictionCounts, Fragmentation};
pub use duel::{DuelConfig, PolicyChoice, PolicyDuel};
pub use error::{AllocError, ConfigError, InvariantViolation, RetainError, SeqError};
pub use events::CacheEvent;
pub use ids::{BlockId, ConversationId, PinId, SeqId, SessionId, TenantId, Tick};
pub use inferred::{
    inferred_session, InferredConfig, InferredCounters, InferredRetainer, InferredTurn,
};
pub use key::{BlockKey, Namespace, NamespaceKey};
pub use return_model::{ReturnModel, ReturnModelConfig};
pub use tenant::TenantCounters;
