//! Retention bookkeeping: pins (warm-up prefixes) and soft session retention with a TTL and a
//! priority in logical time. Owns the holder records and the expiry order; never evicts or moves
//! blocks (the cache module re-ranks candidates when holders change).
//!
//! Retention is a bias, not a lock: a retained unreferenced block stays an eviction candidate but
//! ranks after every unretained one. Rank order (evicted first → last): unretained; session-retained
//! by lower priority, then later expiry (the most recently paused session first); pinned. The number of blocks carrying any retention is
//! capped at `floor(max_retained_fraction · num_blocks)`; a retain request beyond the cap retains
//! the chain from its root as far as the cap allows and reports the rest as refused.

use std::collections::{BTreeSet, HashMap};

use crate::ids::{BlockId, PinId, SessionId, Tick};
use crate::key::{BlockKey, NamespaceKey};

/// Who retains a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Holder {
    Pin(PinId),
    Session(SessionId),
}

/// Retention strength of a block (max over its holders); smaller is evicted first. Ordered by
/// tier, then priority, then **later expiry first**: among sessions of one priority the one
/// retained last (paused most recently) goes first — with tool latencies bounded, the session
/// paused longest is the one closest to coming back, so evicting it first (as earliest-expiry
/// order would) throws away the context needed soonest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct RetentionRank {
    /// 0 = none, 1 = session, 2 = pin.
    pub tier: u8,
    pub priority: u8,
    pub until: Tick,
}

impl Ord for RetentionRank {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.tier, self.priority, std::cmp::Reverse(self.until)).cmp(&(
            other.tier,
            other.priority,
            std::cmp::Reverse(other.until),
        ))
    }
}

impl PartialOrd for RetentionRank {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl RetentionRank {
    pub const NONE: RetentionRank = RetentionRank {
        tier: 0,
        priority: 0,
        until: Tick(0),
    };
    pub const PIN: RetentionRank = RetentionRank {
        tier: 2,
        priority: u8::MAX,
        until: Tick(u64::MAX),
    };
    pub fn session(priority: u8, until: Tick) -> RetentionRank {
        RetentionRank {
            tier: 1,
            priority,
            until,
        }
    }
}

/// One holder's retained blocks (chain order, root first).
#[derive(Clone, Debug)]
pub(crate) struct HolderRecord {
    pub rank: RetentionRank,
    pub blocks: Vec<BlockId>,
    /// Keys of blocks this holder retained that were evicted under pressure since (eviction
    /// order: a chain's tail first), so the engine can say which storage tier holds them now.
    /// A flush forgets nothing here: the keys are only a report, never looked up by the cache.
    pub evicted: Vec<(NamespaceKey, BlockKey)>,
}

/// All holders.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub records: HashMap<Holder, HolderRecord>,
    /// Sessions by expiry tick.
    pub expiry: BTreeSet<(Tick, SessionId)>,
    pub next_pin: u64,
    /// Blocks with at least one holder.
    pub num_retained_blocks: u32,
    /// Blocks with at least one pin holder.
    pub num_pinned_blocks: u32,
}

impl Registry {
    /// Effective rank of a block with these holders.
    pub fn rank_of(&self, holders: &[Holder]) -> RetentionRank {
        holders
            .iter()
            .filter_map(|h| self.records.get(h).map(|r| r.rank))
            .max()
            .unwrap_or(RetentionRank::NONE)
    }

    pub fn new_pin(&mut self) -> PinId {
        let pin = PinId(self.next_pin);
        self.next_pin += 1;
        pin
    }

    /// Sessions whose retention ends at or before `now`.
    pub fn expired_sessions(&self, now: Tick) -> Vec<SessionId> {
        self.expiry
            .range(..=(now, SessionId(u64::MAX)))
            .map(|(_, s)| *s)
            .collect()
    }
}
