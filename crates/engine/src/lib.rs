//! The engine: the model over paged KV with continuous batching, chunked prefill, prefix reuse and
//! preemption by recompute.
//!
//! [`EngineCore`] is the synchronous step loop (testable directly); [`Engine`] runs it as an actor
//! on its own thread and hands out per-request event streams. The engine owns all request state;
//! callers only submit, cancel and read events.

mod actor;
pub mod config;
mod core;
mod demoter;
pub mod error;
mod loader;
pub mod paged_kv;
mod plan;
pub mod request;
mod scheduler;
mod sequence;
pub mod snapshot;
mod stats;
pub mod step_budget;
pub mod text;
mod tier_cost;
mod tier_events;
pub mod tiering;

/// The storage-tier crate (its `TierConfig` is part of [`EngineConfig`]).
pub use tier;

pub use actor::{Engine, EngineHandle};
pub use config::{EngineConfig, TieringConfig};
pub use core::{EngineCore, SnapshotCell};
pub use error::EngineError;
pub use request::{
    EngineEvent, EventReceiver, EventSender, FinishReason, RequestId, RequestSpec, Retention,
    Timings, TokenEvent, Usage,
};
pub use snapshot::{EngineSnapshot, PinnedPrompt};
pub use stats::EngineStats;
pub use tiering::{TierCounters, TierLoadPolicy, TierSnapshot, TieringSnapshot};
