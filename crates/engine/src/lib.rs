//! The engine: the model over paged KV with continuous batching, chunked prefill, prefix reuse and
//! preemption by recompute.
//!
//! [`EngineCore`] is the synchronous step loop (testable directly); [`Engine`] runs it as an actor
//! on its own thread and hands out per-request event streams. The engine owns all request state;
//! callers only submit, cancel and read events.

mod actor;
mod config;
mod core;
mod demoter;
mod encode_gate;
mod error;
pub mod kv_events;
mod kv_memory;
mod loader;
mod paged_kv;
mod plan;
mod request;
mod scheduler;
mod sequence;
mod snapshot;
mod stats;
mod step_budget;
mod text;
mod tier_codec;
mod tier_cost;
mod tier_events;
mod tiering;
mod tool_pause;

pub use actor::{Engine, EngineHandle};
pub use config::{
    EngineConfig, TenantShare, TierLoadPolicy, TieringConfig, DEFAULT_ADMISSION_WAIT,
    DEFAULT_PREFETCH_MAX_BYTES,
};
pub use core::{EngineCore, SnapshotCell, ToolPauseInfo, LONG_PREFILL_TOKENS};
pub use error::{EngineBuildError, EngineError, RequestError, MAX_CHOICES};
pub use kv_events::{KvEvent, KvEventSink, KvMedium};
pub use kv_memory::KvMemory;
pub use paged_kv::PagedKvMemory;
pub use request::{
    priority_of_rank, retention_rank, Breakpoint, EngineEvent, EventReceiver, EventSender,
    EvictedBlocks, FinishReason, ReadProgress, RequestId, RequestSpec, Retention, SessionInfo,
    SessionQuery, Timings, TokenEvent, Usage, MAX_PRIORITY, MIN_PRIORITY, STALL_TOKENS,
};
pub use snapshot::{EngineSnapshot, PinnedPrompt};
pub use stats::EngineStats;
pub use tiering::{TierCounters, TierKind, TierSnapshot, TieringSnapshot, LOAD_LATENCY_BUCKETS_US};
pub use tool_pause::{pause_ttl, ToolPauseConfig};
