//! Per-tenant counters, quotas (maximum) and reservations (minimum) of cached blocks. Owns the
//! per-tenant figures; never decides which block to evict (the cache module uses the per-tenant
//! candidate sets for that).

use std::collections::BTreeMap;

use crate::ids::TenantId;

/// Figures kept per tenant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantCounters {
    /// Lookups issued in this tenant's namespaces.
    pub lookups: u64,
    /// Prompt tokens served from cache.
    pub hit_tokens: u64,
    /// Prompt tokens that had to be computed.
    pub miss_tokens: u64,
    /// Published blocks (referenced or not) currently held in this tenant's namespaces (gauge).
    pub cached_blocks: u32,
    /// This tenant's blocks evicted, any cause.
    pub evicted_blocks: u64,
    /// Blocks not cached because this tenant was at its quota with nothing of its own to evict.
    pub quota_refusals: u64,
    /// This tenant's blocks evicted while it held no more than its reservation (only when no
    /// other tenant had an unreserved candidate: running sequences needed the blocks).
    pub reserved_evictions: u64,
    /// Blocks of this tenant carrying retention (sessions or pins) now (gauge).
    pub retained_blocks: u32,
    /// Blocks a session of this tenant could not retain because of its retained-block cap.
    pub retention_refused_blocks: u64,
}

/// Counters and quotas of all tenants.
#[derive(Debug, Default)]
pub(crate) struct Tenants {
    pub counters: BTreeMap<TenantId, TenantCounters>,
    pub quotas: BTreeMap<TenantId, u32>,
    pub reserved: BTreeMap<TenantId, u32>,
    pub retained_quotas: BTreeMap<TenantId, u32>,
}

impl Tenants {
    pub fn get_mut(&mut self, tenant: TenantId) -> &mut TenantCounters {
        self.counters.entry(tenant).or_default()
    }

    pub fn cached_blocks(&self, tenant: TenantId) -> u32 {
        self.counters.get(&tenant).map_or(0, |c| c.cached_blocks)
    }

    /// Whether publishing one more block would exceed the tenant's quota.
    pub fn at_quota(&self, tenant: TenantId) -> bool {
        self.quotas
            .get(&tenant)
            .is_some_and(|quota| self.cached_blocks(tenant) >= *quota)
    }

    /// Whether one more retained block would exceed the tenant's retained-block cap.
    pub fn at_retained_quota(&self, tenant: TenantId) -> bool {
        self.retained_quotas
            .get(&tenant)
            .is_some_and(|q| self.counters.get(&tenant).map_or(0, |c| c.retained_blocks) >= *q)
    }

    /// Whether the tenant holds no more than its reservation (its blocks go last).
    pub fn within_reservation(&self, tenant: TenantId) -> bool {
        self.reserved
            .get(&tenant)
            .is_some_and(|r| self.cached_blocks(tenant) <= *r)
    }
}
