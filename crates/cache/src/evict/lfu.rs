//! LFU: the policy primary key is the hit count (1 on publish, +1 per lookup hit or duplicate
//! publish), so the fewest hits go first; ties by least recent `last_use`, deeper position, lower
//! `BlockId`. Counts never decay. Never reads anything but the block stats.

use super::BlockStats;

pub(crate) fn primary_key(stats: &BlockStats) -> u64 {
    u64::from(stats.hits)
}
