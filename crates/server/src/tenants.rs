//! API key → tenant. Keys are compared in constant time (every configured key is compared on
//! every call, no early exit); the tenant's server-side salt is what enters its cache namespace.
//! Never trusts a request body for the tenant. The tenant comes from the API key alone; the
//! configured tenant header is read only on calls made with a trusted proxy's key (with any other
//! key it is refused, so a tenant cannot pose as another by sending it).

use axum::http::HeaderMap;
use cache::TenantId;
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::settings::ServerSettings;

/// A resolved tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
    /// Server-side salt; a request's `cache_salt` is appended after it (narrowing only).
    pub salt: Vec<u8>,
    /// Priority of the tenant's requests (vLLM's convention; a request's own is added).
    pub priority: i32,
}

impl Tenant {
    /// The cache salt of one request: the tenant's salt, then the request's (if any).
    pub fn request_salt(&self, request_salt: Option<&str>) -> Vec<u8> {
        let mut salt = self.salt.clone();
        if let Some(s) = request_salt.filter(|s| !s.is_empty()) {
            salt.push(0);
            salt.extend_from_slice(s.as_bytes());
        }
        salt
    }
}

/// The tenants of this server and their keys.
#[derive(Debug)]
pub struct Tenants {
    tenants: Vec<Tenant>,
    /// (key bytes, index into `tenants`).
    keys: Vec<(Vec<u8>, usize)>,
    admin_keys: Vec<Vec<u8>>,
    metrics_keys: Vec<Vec<u8>>,
    proxy_keys: Vec<Vec<u8>>,
    proxy_header: Option<String>,
}

/// Name of the tenant of an open server (no keys configured).
pub const DEFAULT_TENANT: &str = "default";

impl Tenants {
    /// Tenant ids: 0 is the open server's `default`; configured tenants get 1, 2, … in order.
    pub fn new(settings: &ServerSettings) -> Tenants {
        let mut tenants = vec![Tenant {
            id: TenantId(0),
            name: DEFAULT_TENANT.into(),
            salt: Vec::new(),
            priority: 0,
        }];
        let mut keys = Vec::new();
        for (i, t) in settings.tenants.iter().enumerate() {
            tenants.push(Tenant {
                id: TenantId(i as u32 + 1),
                name: t.name.clone(),
                salt: t.salt.clone().unwrap_or_default().into_bytes(),
                priority: t.priority,
            });
            for k in &t.api_keys {
                keys.push((k.as_bytes().to_vec(), i + 1));
            }
        }
        Tenants {
            tenants,
            keys,
            admin_keys: settings
                .admin_api_keys
                .iter()
                .map(|k| k.as_bytes().to_vec())
                .collect(),
            metrics_keys: settings
                .metrics_api_keys
                .iter()
                .map(|k| k.as_bytes().to_vec())
                .collect(),
            proxy_keys: settings
                .trusted_proxy_api_keys
                .iter()
                .map(|k| k.as_bytes().to_vec())
                .collect(),
            proxy_header: settings.trusted_tenant_header.clone(),
        }
    }

    /// True when no tenant or proxy key is configured: every call is the `default` tenant.
    pub fn is_open(&self) -> bool {
        self.keys.is_empty() && self.proxy_keys.is_empty()
    }

    pub fn all(&self) -> &[Tenant] {
        &self.tenants
    }

    /// The configured tenants (the `default` tenant too when the server is open).
    pub fn serving(&self) -> &[Tenant] {
        if self.is_open() {
            &self.tenants[..1]
        } else {
            &self.tenants[1..]
        }
    }

    pub fn by_name(&self, name: &str) -> Option<&Tenant> {
        self.tenants.iter().find(|t| t.name == name)
    }

    pub fn name_of(&self, id: TenantId) -> String {
        self.tenants
            .iter()
            .find(|t| t.id == id)
            .map_or_else(|| format!("tenant-{}", id.0), |t| t.name.clone())
    }

    /// The tenant of a call, from its bearer key only: a tenant key is that tenant (`default` when
    /// the server is open); a trusted proxy key is the tenant named by the trusted tenant header,
    /// which must be present. The header on a call with any other key is a 403: it never changes
    /// the tenant of a tenant key.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<&Tenant, ApiError> {
        let header = self
            .proxy_header
            .as_deref()
            .and_then(|h| headers.get(h).map(|v| (h, v)));
        if self.is_open() {
            // No proxy keys means no configured header either (settings validation).
            return Ok(&self.tenants[0]);
        }
        let key = bearer(headers).ok_or(ApiError::Unauthorized)?;
        let mut found = usize::MAX;
        for (k, idx) in &self.keys {
            // No early exit: the time does not depend on which key matched.
            if bool::from(k.as_slice().ct_eq(key)) {
                found = *idx;
            }
        }
        let mut proxy = false;
        for k in &self.proxy_keys {
            proxy |= bool::from(k.as_slice().ct_eq(key));
        }
        if !proxy {
            let tenant = self.tenants.get(found).ok_or(ApiError::Unauthorized)?;
            if let Some((h, _)) = header {
                return Err(ApiError::Forbidden(format!(
                    "header {h} is accepted only from a trusted proxy key; this key belongs to a \
                     tenant"
                )));
            }
            return Ok(tenant);
        }
        if let Some(h) = self.proxy_header.as_deref() {
            if headers.get_all(h).iter().count() > 1 {
                // Which one a proxy meant is unknowable: never serve the last one silently.
                return Err(ApiError::invalid(
                    format!("header {h} is given more than once"),
                    h,
                ));
            }
        }
        let Some((h, v)) = header else {
            let h = self.proxy_header.as_deref().unwrap_or("tenant header");
            return Err(ApiError::invalid(
                format!("a trusted proxy key needs header {h} naming the tenant"),
                h,
            ));
        };
        let name = v
            .to_str()
            .map_err(|_| ApiError::invalid(format!("header {h} is not text"), h))?;
        self.serving()
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| {
                ApiError::invalid(format!("header {h} names unknown tenant {name:?}"), h)
            })
    }

    /// `GET /metrics`: open unless metrics keys are configured; then one of them or an admin key.
    /// Returns whether the caller may see tenant-labelled series: with metrics or admin keys
    /// presented, or on an open server (no tenants); an anonymous scrape of a server with
    /// tenants sees totals only.
    pub fn authenticate_metrics(&self, headers: &HeaderMap) -> Result<bool, ApiError> {
        let key = bearer(headers);
        let mut ok = false;
        if let Some(key) = key {
            for k in self.metrics_keys.iter().chain(&self.admin_keys) {
                ok |= bool::from(k.as_slice().ct_eq(key));
            }
        }
        if self.metrics_keys.is_empty() {
            return Ok(ok || self.is_open());
        }
        if ok {
            Ok(true)
        } else {
            Err(ApiError::Unauthorized)
        }
    }

    /// Admin routes: an admin key, or nothing when neither admin nor tenant keys are configured.
    pub fn authenticate_admin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.admin_keys.is_empty() {
            return if self.is_open() {
                Ok(())
            } else {
                Err(ApiError::Forbidden(
                    "admin routes need an admin API key and none is configured".into(),
                ))
            };
        }
        let key = bearer(headers).ok_or(ApiError::Unauthorized)?;
        let mut ok = false;
        for k in &self.admin_keys {
            ok |= bool::from(k.as_slice().ct_eq(key));
        }
        if ok {
            Ok(())
        } else {
            Err(ApiError::Unauthorized)
        }
    }
}

/// The key of `Authorization: Bearer <key>`.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let v = headers.get(axum::http::header::AUTHORIZATION)?.as_bytes();
    let rest = v
        .strip_prefix(b"Bearer ")
        .or_else(|| v.strip_prefix(b"bearer "))?;
    Some(rest.trim_ascii())
}
