//! Typed identifiers and the logical clock. Owns nothing but newtypes; never allocates ids itself
//! (the pool, the sequence table and the retention registry hand them out).

use std::fmt;

/// Index of one KV block in the pool arena (`0..num_blocks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId(pub u32);

/// Handle of one sequence (one block table). Handed out by [`crate::KvCache::create_sequence`]
/// and [`crate::KvCache::fork`]; never reused within one cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u64);

/// A tenant (an API key maps to one server-side). Enters the namespace key of every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TenantId(pub u32);

/// An agent session named by a request; used for soft retention across tool-call pauses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

/// A conversation inferred from prefix continuation ([`crate::Conversations`]); handed out by
/// the index, never reused within one index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConversationId(pub u64);

/// Handle of one pinned prefix (warm-up template), returned by [`crate::KvCache::pin_prefix`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PinId(pub u64);

/// Logical time passed in by the caller (the cache never reads a wall clock). The cache keeps its
/// own monotonic clock `max(every tick seen)`, so a tick older than one already seen acts as "now".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Tick(pub u64);

impl BlockId {
    /// The arena index of this block.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}
