//! `bench`: the agent-workload benchmark for any OpenAI-compatible endpoint (workload generator,
//! streaming HTTP driver, statistics, JSON/text/HTML reports, request traces) and the pure maths of
//! the KV-memory calculator (`kvsize`).
//!
//! Talks HTTP only: never links the engine, the model runtime or the cache. Measures latency,
//! never asserts on it.
#![forbid(unsafe_code)]

pub mod client;
pub mod corpus;
pub mod driver;
pub mod error;
pub mod kvsize;
pub mod open_loop;
pub mod replay;
pub mod report;
pub mod sse;
pub mod stats;
pub mod trace;
pub mod workload;

pub use error::BenchError;
