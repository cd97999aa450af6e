//! The offline optimum a policy is measured against: Belady's rule (evict the block whose next
//! use is farthest in the future; deeper first among equals, so a chain is evicted tail first
//! and the cache stays prefix-contiguous), with the simulator's rules for what a call reads and
//! writes — a call hits its longest cached prefix of at most `(len - 1) / block_size` blocks and
//! then holds all of its full blocks. It knows the whole trace; no online policy can beat it on
//! these rules. Also the ceiling with an unbounded pool (every block seen before hits).
//!
//! Pure: over an in-memory trace, keys chained per tenant exactly as the simulator's.

use std::collections::{BinaryHeap, HashMap};

use serde::Serialize;

use super::trace::TraceCall;
use crate::ids::TenantId;
use crate::key::{chain_keys, BlockKey, Namespace};

/// Hit rates no policy can exceed on a trace.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Optimum {
    /// Belady's hit rate (prompt tokens) with the given pool.
    pub hit_rate: f64,
    pub hit_tokens: u64,
    /// With an unbounded pool.
    pub unbounded_hit_rate: f64,
}

/// A call's blocks as dense ids, and how many of them a lookup may read.
struct CallBlocks {
    ids: Vec<u32>,
    readable: usize,
}

fn dense_chains(calls: &[TraceCall], block_size: usize) -> Vec<CallBlocks> {
    let mut tenants: HashMap<&str, crate::key::NamespaceKey> = HashMap::new();
    let mut ids: HashMap<BlockKey, u32> = HashMap::new();
    calls
        .iter()
        .map(|c| {
            let next = TenantId(tenants.len() as u32);
            let ns = *tenants
                .entry(c.tenant.as_str())
                .or_insert_with(|| Namespace::for_tenant(next).key());
            let full = c.tokens.len() / block_size;
            let keys = chain_keys(&ns, &c.tokens, block_size, full);
            let next_id = |ids: &HashMap<BlockKey, u32>| ids.len() as u32;
            CallBlocks {
                ids: keys
                    .into_iter()
                    .map(|k| {
                        let n = next_id(&ids);
                        *ids.entry(k).or_insert(n)
                    })
                    .collect(),
                readable: c.tokens.len().saturating_sub(1) / block_size,
            }
        })
        .collect()
}

/// Belady's hit rate on `calls` with a pool of `capacity_blocks`, and the unbounded ceiling.
pub fn optimum(calls: &[TraceCall], block_size: u32, capacity_blocks: u32) -> Optimum {
    let bs = block_size.max(1) as usize;
    let chains = dense_chains(calls, bs);
    // next_use[i][j]: the next call after i whose lookup may read block j of call i.
    const NEVER: u32 = u32::MAX;
    let mut next_read: HashMap<u32, u32> = HashMap::new();
    let mut next_use: Vec<Vec<u32>> = vec![Vec::new(); chains.len()];
    for (i, c) in chains.iter().enumerate().rev() {
        next_use[i] = c
            .ids
            .iter()
            .map(|id| next_read.get(id).copied().unwrap_or(NEVER))
            .collect();
        for id in &c.ids[..c.readable.min(c.ids.len())] {
            next_read.insert(*id, i as u32);
        }
    }
    let mut cached: HashMap<u32, u32> = HashMap::new();
    let mut heap: BinaryHeap<(u32, u32, u32)> = BinaryHeap::new();
    let mut seen: std::collections::HashSet<u32> = Default::default();
    let (mut prompt, mut hit, mut unbounded) = (0u64, 0u64, 0u64);
    for (i, c) in chains.iter().enumerate() {
        let readable = &c.ids[..c.readable.min(c.ids.len())];
        let hits = readable
            .iter()
            .take_while(|id| cached.contains_key(id))
            .count();
        let ever = readable.iter().take_while(|id| seen.contains(id)).count();
        prompt += calls[i].tokens.len() as u64;
        hit += (hits * bs) as u64;
        unbounded += (ever * bs) as u64;
        for (j, id) in c.ids.iter().enumerate() {
            seen.insert(*id);
            let nu = next_use[i][j];
            cached.insert(*id, nu);
            heap.push((nu, j as u32, *id));
        }
        while cached.len() > capacity_blocks as usize {
            let Some((nu, _, id)) = heap.pop() else { break };
            if cached.get(&id) == Some(&nu) {
                cached.remove(&id);
            }
        }
        // Entries made stale by a later insertion of the same block are dropped as they surface.
        if heap.len() > 4 * cached.len() + 1024 {
            heap.retain(|(nu, _, id)| cached.get(id) == Some(nu));
        }
    }
    let rate = |t: u64| {
        if prompt == 0 {
            0.0
        } else {
            t as f64 / prompt as f64
        }
    };
    Optimum {
        hit_rate: rate(hit),
        hit_tokens: hit,
        unbounded_hit_rate: rate(unbounded),
    }
}
