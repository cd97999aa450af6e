//! Shared test helpers: building caches and running whole calls the way the simulator does.
#![allow(dead_code)]

pub mod reference;

use cache::{
    BlockId, CacheConfig, EvictionPolicy, KvCache, Namespace, NamespaceKey, SeqId, TenantId, Tick,
};

pub fn config(num_blocks: u32, block_size: u32, policy: EvictionPolicy) -> CacheConfig {
    let mut c = CacheConfig::new(num_blocks);
    c.block_size = block_size;
    c.policy = policy;
    c.max_retained_fraction = 1.0;
    c
}

pub fn ns(tenant: u32) -> NamespaceKey {
    Namespace::for_tenant(TenantId(tenant)).key()
}

/// Token sequence `base, base+1, …` of `len` tokens.
pub fn toks(base: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| base + i).collect()
}

/// Look up, create a sequence, append the rest, mark all written. Returns the sequence and the
/// number of cached tokens.
pub fn start(cache: &mut KvCache, ns: &NamespaceKey, tokens: &[u32], tick: u64) -> (SeqId, usize) {
    let m = cache.lookup(ns, tokens, Tick(tick));
    let cached = m.num_cached_tokens();
    let seq = cache.create_sequence(m).unwrap();
    cache
        .append_tokens(seq, &tokens[cached..], Tick(tick))
        .unwrap();
    cache.mark_written(seq, tokens.len(), Tick(tick)).unwrap();
    cache.check_invariants().unwrap();
    (seq, cached)
}

/// One simulator call: start, then free. Returns (cached tokens, final block table).
pub fn call(
    cache: &mut KvCache,
    ns: &NamespaceKey,
    tokens: &[u32],
    tick: u64,
) -> (usize, Vec<BlockId>) {
    let (seq, cached) = start(cache, ns, tokens, tick);
    let table = cache.block_table(seq).unwrap().to_vec();
    cache.free(seq, Tick(tick)).unwrap();
    cache.check_invariants().unwrap();
    (cached, table)
}

pub fn ids(v: &[u32]) -> Vec<BlockId> {
    v.iter().map(|&i| BlockId(i)).collect()
}
