//! Isolation: the same namespace hits (positive control); another tenant, salt, model, codec,
//! codec version, KV settings or adapter never hits the same tokens.

mod common;

use cache::{EvictionPolicy, KvCache, Namespace, TenantId};
use common::*;

fn cached_in(ns_store: &Namespace, ns_query: &Namespace) -> usize {
    let mut cache = KvCache::new(config(16, 4, EvictionPolicy::Lru)).unwrap();
    let prompt = toks(1, 17);
    call(&mut cache, &ns_store.key(), &prompt, 1);
    cache.peek_prefix(&ns_query.key(), &prompt)
}

#[test]
fn same_namespace_hits() {
    let ns = Namespace::for_tenant(TenantId(3));
    assert_eq!(cached_in(&ns, &ns.clone()), 16);
}

#[test]
fn any_differing_field_never_hits() {
    let base = Namespace::for_tenant(TenantId(3));
    let mut variants: Vec<(&str, Namespace)> = Vec::new();
    let mut v = base.clone();
    v.tenant = TenantId(4);
    variants.push(("tenant", v));
    let mut v = base.clone();
    v.tenant_salt = vec![9; 32];
    variants.push(("salt", v));
    let mut v = base.clone();
    v.model_fingerprint[0] = 1;
    variants.push(("model", v));
    let mut v = base.clone();
    v.codec_id = "int8".into();
    variants.push(("codec", v));
    let mut v = base.clone();
    v.codec_version += 1;
    variants.push(("codec version", v));
    let mut v = base.clone();
    v.kv_settings = b"rope-scale=2".to_vec();
    variants.push(("kv settings", v));
    let mut v = base.clone();
    v.adapter_id = Some("lora-a".into());
    variants.push(("adapter", v));
    for (what, v) in &variants {
        assert_eq!(cached_in(&base, v), 0, "{what} differs but hit");
        assert_eq!(cached_in(v, v), 16, "{what}: positive control");
    }
}

#[test]
fn unset_adapter_never_hits_a_set_one_and_back() {
    let unset = Namespace::for_tenant(TenantId(1));
    let mut set = unset.clone();
    set.adapter_id = Some(String::new());
    assert_eq!(cached_in(&set, &unset), 0);
    assert_eq!(cached_in(&unset, &set), 0);
}

#[test]
fn lookup_counts_per_tenant() {
    let mut cache = KvCache::new(config(16, 4, EvictionPolicy::Lru)).unwrap();
    let (a, b) = (ns(1), ns(2));
    let prompt = toks(1, 9);
    call(&mut cache, &a, &prompt, 1);
    call(&mut cache, &a, &prompt, 2);
    call(&mut cache, &b, &prompt, 3);
    let ta = cache.tenant_counters(TenantId(1));
    let tb = cache.tenant_counters(TenantId(2));
    assert_eq!(
        (ta.lookups, ta.hit_tokens, ta.miss_tokens, ta.cached_blocks),
        (2, 8, 10, 2)
    );
    assert_eq!(
        (tb.lookups, tb.hit_tokens, tb.miss_tokens, tb.cached_blocks),
        (1, 0, 9, 2)
    );
}

#[test]
fn flush_tenant_leaves_other_tenants() {
    let mut cache = KvCache::new(config(16, 4, EvictionPolicy::Lru)).unwrap();
    let (a, b) = (ns(1), ns(2));
    let prompt = toks(1, 9);
    call(&mut cache, &a, &prompt, 1);
    call(&mut cache, &b, &prompt, 2);
    assert_eq!(cache.flush_tenant(TenantId(1)), 2);
    assert_eq!(cache.peek_prefix(&a, &prompt), 0);
    assert_eq!(cache.peek_prefix(&b, &prompt), 8);
    assert_eq!(cache.flush_namespace(&b), 2);
    assert_eq!(cache.peek_prefix(&b, &prompt), 0);
    assert_eq!(cache.usage().free, 16);
    cache.check_invariants().unwrap();
}
