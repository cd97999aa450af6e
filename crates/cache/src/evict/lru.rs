//! LRU: the policy primary key is constant, so candidates are ordered by least recent `last_use`,
//! then deeper chain position, then lower `BlockId`. Never reads anything but the block stats.
//!
//! `last_use` is the tick of the latest lookup hit, publish (a new block inherits its parent's
//! `last_use`, so a chain never has a child more recent than its parent) or release by a sequence.

use super::BlockStats;

pub(crate) fn primary_key(_stats: &BlockStats) -> u64 {
    0
}
