//! The bounded queue: requests and tokens in flight (queued or running), per tenant and overall.
//! A request over its tenant's bound gets 429, over the server's 503, both with `Retry-After`.
//! A [`Permit`] holds the request's share until dropped. Never schedules: the engine does that.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cache::TenantId;

use crate::error::ApiError;
use crate::settings::Limits;

#[derive(Debug, Default, Clone, Copy)]
struct Load {
    requests: usize,
    tokens: usize,
}

#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    state: Mutex<(Load, HashMap<TenantId, Load>)>,
}

/// A request's share of the queue; released on drop.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    tenant: TenantId,
    tokens: usize,
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            state: Mutex::new((Load::default(), HashMap::new())),
        })
    }

    /// Admits a request of `tokens` (prompt + max_tokens) for `tenant`, or says why not.
    pub fn try_admit(
        self: &Arc<Self>,
        tenant: TenantId,
        tokens: usize,
    ) -> Result<Permit, ApiError> {
        let l = &self.limits;
        let retry_after_secs = l.retry_after_secs;
        // A request larger than a bound on its own could never be admitted: the client's error
        // (400), not a reason to retry (429 / 503).
        let bound = l.max_tokens_per_tenant.min(l.max_tokens);
        if tokens > bound {
            return Err(ApiError::NeverAdmissible {
                tokens,
                limit: bound,
            });
        }
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (total, per_tenant) = &mut *guard;
        let mine = per_tenant.entry(tenant).or_default();
        if mine.requests + 1 > l.max_requests_per_tenant {
            return Err(ApiError::TenantOverloaded {
                reason: format!(
                    "{} requests in flight, limit {}",
                    mine.requests, l.max_requests_per_tenant
                ),
                retry_after_secs,
            });
        }
        if mine.tokens + tokens > l.max_tokens_per_tenant {
            return Err(ApiError::TenantOverloaded {
                reason: format!(
                    "{} tokens in flight plus {tokens} asked, limit {}",
                    mine.tokens, l.max_tokens_per_tenant
                ),
                retry_after_secs,
            });
        }
        if total.requests + 1 > l.max_requests {
            return Err(ApiError::ServerOverloaded {
                reason: format!(
                    "{} requests in flight, limit {}",
                    total.requests, l.max_requests
                ),
                retry_after_secs,
            });
        }
        if total.tokens + tokens > l.max_tokens {
            return Err(ApiError::ServerOverloaded {
                reason: format!(
                    "{} tokens in flight plus {tokens} asked, limit {}",
                    total.tokens, l.max_tokens
                ),
                retry_after_secs,
            });
        }
        mine.requests += 1;
        mine.tokens += tokens;
        total.requests += 1;
        total.tokens += tokens;
        Ok(Permit {
            admission: Arc::clone(self),
            tenant,
            tokens,
        })
    }

    /// (requests, tokens) in flight overall.
    pub fn load(&self) -> (usize, usize) {
        let g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (g.0.requests, g.0.tokens)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut g = self
            .admission
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (total, per_tenant) = &mut *g;
        total.requests -= 1;
        total.tokens -= self.tokens;
        if let Some(m) = per_tenant.get_mut(&self.tenant) {
            m.requests -= 1;
            m.tokens -= self.tokens;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_requests: 3,
            max_tokens: 100,
            max_requests_per_tenant: 2,
            max_tokens_per_tenant: 60,
            retry_after_secs: 7,
            ..Limits::default()
        }
    }

    #[test]
    fn tenant_bound_gives_429_and_server_bound_503() {
        let a = Admission::new(limits());
        let p1 = a.try_admit(TenantId(1), 10).unwrap();
        let _p2 = a.try_admit(TenantId(1), 10).unwrap();
        let e = a.try_admit(TenantId(1), 10).unwrap_err();
        assert!(
            matches!(
                e,
                ApiError::TenantOverloaded {
                    retry_after_secs: 7,
                    ..
                }
            ),
            "{e:?}"
        );
        let _p3 = a.try_admit(TenantId(2), 10).unwrap();
        let e = a.try_admit(TenantId(3), 10).unwrap_err();
        assert!(matches!(e, ApiError::ServerOverloaded { .. }), "{e:?}");
        drop(p1);
        assert_eq!(a.load(), (2, 20));
        a.try_admit(TenantId(3), 10).unwrap();
    }

    #[test]
    fn token_bounds() {
        let a = Admission::new(limits());
        // Over a bound on its own: it could never be admitted (400, not 429; issue #13 F3).
        let e = a.try_admit(TenantId(1), 61).unwrap_err();
        assert!(
            matches!(
                e,
                ApiError::NeverAdmissible {
                    tokens: 61,
                    limit: 60
                }
            ),
            "{e:?}"
        );
        let _a = a.try_admit(TenantId(1), 60).unwrap();
        let e = a.try_admit(TenantId(1), 1).unwrap_err();
        assert!(matches!(e, ApiError::TenantOverloaded { .. }));
        let e = a.try_admit(TenantId(2), 41).unwrap_err();
        assert!(matches!(e, ApiError::ServerOverloaded { .. }));
        assert_eq!(a.load(), (1, 60));
    }
}
