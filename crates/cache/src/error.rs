//! Error types, one enum per operation boundary. Expected conditions (out of blocks, unknown
//! handles) are values here; nothing in this crate panics on caller input.

use crate::ids::{PinId, SeqId, SessionId};
use thiserror::Error;

/// Invalid [`crate::CacheConfig`].
#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error("num_blocks must be at least 1")]
    ZeroBlocks,
    #[error("block_size must be at least 1")]
    ZeroBlockSize,
    #[error("{name} = {value} is outside [0, 1]")]
    FractionOutOfRange { name: &'static str, value: f64 },
    #[error(
        "adaptive protected fractions must satisfy min {min} <= initial {initial} <= max {max}"
    )]
    ProtectedBoundsOrder { min: f64, initial: f64, max: f64 },
    #[error("tenant reservations total {reserved} blocks, more than half the pool ({num_blocks} blocks)")]
    ReservationsTooLarge { reserved: u64, num_blocks: u32 },
    #[error("tenant {tenant}: reserved {reserved} blocks is more than its quota of {quota}")]
    ReservationAboveQuota {
        tenant: u32,
        reserved: u32,
        quota: u32,
    },
}

/// An allocation could not be satisfied. Nothing was changed.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum AllocError {
    #[error("out of KV blocks: needed {needed}, available {available} (free + evictable)")]
    OutOfBlocks { needed: u32, available: u32 },
}

/// An operation on a sequence failed. Nothing was changed.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum SeqError {
    #[error("unknown sequence {0}")]
    UnknownSequence(SeqId),
    #[error("unknown or already used prefix match")]
    UnknownPrefixMatch,
    #[error(transparent)]
    Alloc(#[from] AllocError),
    #[error("sequence {seq}: {written} tokens marked written but only {len} appended")]
    WrittenBeyondEnd {
        seq: SeqId,
        written: usize,
        len: usize,
    },
}

/// A retention operation failed. Nothing was changed.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum RetainError {
    #[error("unknown sequence {0}")]
    UnknownSequence(SeqId),
    #[error("unknown pin {0:?}")]
    UnknownPin(PinId),
    #[error("unknown session {0:?}")]
    UnknownSession(SessionId),
}

/// A broken internal invariant, reported by [`crate::KvCache::check_invariants`]. Seeing one is a
/// bug in this crate.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("cache invariant violated: {0}")]
pub struct InvariantViolation(pub String);
