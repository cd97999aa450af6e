//! Segmented LRU: probation segment (primary key 0) before protected segment (primary key 1);
//! within a segment, LRU order. Owns the protected segment's membership order; never evicts.
//!
//! A block enters the protected segment on its second hit (a lookup hit or duplicate publish after
//! the publish that created it). The protected segment holds at most
//! `floor(protected_fraction · num_blocks)` published blocks (referenced or not); when a promotion
//! overflows it, the protected block with the least recent `last_use` (ties: deeper, then lower
//! `BlockId`) is demoted back to probation.
//!
//! With the adaptive policy the capacity moves at run time (`adaptive.rs`); a capacity that shrinks
//! below the segment's size demotes the same way, least recent first.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::BlockStats;
use crate::ids::{BlockId, Tick};

pub(crate) fn primary_key(stats: &BlockStats) -> u64 {
    u64::from(stats.protected)
}

/// Hits needed to enter the protected segment.
pub(crate) const PROMOTION_HITS: u32 = 2;

/// Membership of the protected segment in demotion order.
#[derive(Debug, Default)]
pub(crate) struct ProtectedSegment {
    /// Current capacity in blocks (fixed for segmented LRU, moved by the adaptive policy).
    pub capacity: u32,
    pub set: BTreeSet<(Tick, Reverse<u32>, BlockId)>,
}

impl ProtectedSegment {
    pub fn entry(stats: &BlockStats, id: BlockId) -> (Tick, Reverse<u32>, BlockId) {
        (stats.last_use, Reverse(stats.depth), id)
    }

    /// The block to demote if the segment is over capacity.
    pub fn overflow(&self) -> Option<BlockId> {
        if self.set.len() > self.capacity as usize {
            self.set.first().map(|e| e.2)
        } else {
            None
        }
    }
}
