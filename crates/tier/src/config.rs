//! The `tiers:` configuration list (serde) and [`open_tiers`], which builds the stores in order.
//! Owns size parsing (`"4GB"`, `"512MiB"`, integers); never reads files.

use std::path::PathBuf;
use std::time::Duration;

use crate::{
    Compression, DiskConfig, DiskStore, RamConfig, RamStore, RedisConfig, RedisStore, TierError,
    TierStore,
};

/// A byte count written as an integer or a string with a unit: `B`, `KB`/`MB`/`GB`/`TB`
/// (powers of 1000) or `KiB`/`MiB`/`GiB`/`TiB` (powers of 1024).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parse `"4GB"`, `"50 GiB"`, `"1024"`.
    pub fn parse(text: &str) -> Result<ByteSize, TierError> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let number: f64 = number
            .parse()
            .map_err(|_| TierError::Config(format!("bad size {text:?}")))?;
        let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kb" | "k" => 1_000,
            "mb" | "m" => 1_000_000,
            "gb" | "g" => 1_000_000_000,
            "tb" | "t" => 1_000_000_000_000,
            "kib" => 1 << 10,
            "mib" => 1 << 20,
            "gib" => 1 << 30,
            "tib" => 1 << 40,
            other => {
                return Err(TierError::Config(format!(
                    "bad size unit {other:?} in {text:?}"
                )))
            }
        };
        let bytes = number * multiplier as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(TierError::Config(format!("size out of range: {text:?}")));
        }
        Ok(ByteSize(bytes as u64))
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(t) => ByteSize::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

fn default_true() -> bool {
    true
}

/// One entry of the `tiers:` list, tried in order after the active pool.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TierConfig {
    /// `{kind: ram, max_size: 4GB, compression: lz4}`
    Ram {
        /// Byte budget.
        max_size: ByteSize,
        /// `none` (default), `lz4` or `lz4_shuffle16`.
        #[serde(default)]
        compression: Compression,
        /// KV codec the tier stores blocks in (`--kv-dtype` names: `int8`, `k=int4c,v=int4`, …);
        /// default: the active pool's, stored as is. The engine transcodes on demotion and back on
        /// load; a codec other than the pool's is lossy and enters the cache namespace.
        #[serde(default)]
        codec: Option<String>,
    },
    /// `{kind: disk, path: /var/cache/agentkv, max_size: 50GB}`
    Disk {
        /// Directory owned by this tier.
        path: PathBuf,
        /// Byte budget.
        max_size: ByteSize,
        /// fsync before rename (default true).
        #[serde(default = "default_true")]
        fsync: bool,
        /// Payload compression.
        #[serde(default)]
        compression: Compression,
        /// KV codec the tier stores blocks in (`--kv-dtype` names: `int8`, `k=int4c,v=int4`, …);
        /// default: the active pool's, stored as is. The engine transcodes on demotion and back on
        /// load; a codec other than the pool's is lossy and enters the cache namespace.
        #[serde(default)]
        codec: Option<String>,
    },
    /// `{kind: redis, url: redis://127.0.0.1:6379, ttl_secs: 3600}`. The byte budget is the
    /// server's `maxmemory` with an `allkeys-lru` policy.
    Redis {
        /// Server URL (or one seed URL of a cluster).
        #[serde(default)]
        url: Option<String>,
        /// Cluster seed URLs (implies `cluster: true`).
        #[serde(default)]
        urls: Vec<String>,
        /// Use the cluster protocol.
        #[serde(default)]
        cluster: bool,
        /// Object TTL in seconds.
        #[serde(default)]
        ttl_secs: Option<u64>,
        /// Connect timeout in milliseconds (default 250).
        #[serde(default)]
        connect_timeout_ms: Option<u64>,
        /// Per-command IO timeout in milliseconds (default 1000).
        #[serde(default)]
        io_timeout_ms: Option<u64>,
        /// Name of an environment variable holding the MAC secret (never the secret itself).
        #[serde(default)]
        secret_env: Option<String>,
        /// Redis key prefix (default `akv1`).
        #[serde(default)]
        key_prefix: Option<String>,
        /// KV codec the tier stores blocks in (`--kv-dtype` names: `int8`, `k=int4c,v=int4`, …);
        /// default: the active pool's, stored as is. The engine transcodes on demotion and back on
        /// load; a codec other than the pool's is lossy and enters the cache namespace.
        #[serde(default)]
        codec: Option<String>,
    },
}

impl TierConfig {
    /// The KV codec this tier stores blocks in, when it is not the active pool's (opaque here:
    /// the engine parses and applies it).
    pub fn codec(&self) -> Option<&str> {
        match self {
            TierConfig::Ram { codec, .. }
            | TierConfig::Disk { codec, .. }
            | TierConfig::Redis { codec, .. } => codec.as_deref(),
        }
    }

    /// Build the store this entry describes (opens/scans a disk directory; Redis connects
    /// lazily).
    pub fn open(&self) -> Result<Box<dyn TierStore>, TierError> {
        match self {
            TierConfig::Ram {
                max_size,
                compression,
                ..
            } => Ok(Box::new(RamStore::new(RamConfig {
                max_bytes: max_size.0,
                compression: *compression,
            }))),
            TierConfig::Disk {
                path,
                max_size,
                fsync,
                compression,
                ..
            } => Ok(Box::new(DiskStore::open(DiskConfig {
                path: path.clone(),
                max_bytes: max_size.0,
                fsync: *fsync,
                compression: *compression,
            })?)),
            TierConfig::Redis {
                url,
                urls,
                cluster,
                ttl_secs,
                connect_timeout_ms,
                io_timeout_ms,
                secret_env,
                key_prefix,
                ..
            } => {
                let mut all: Vec<String> = url.iter().cloned().collect();
                all.extend(urls.iter().cloned());
                let first = all
                    .first()
                    .cloned()
                    .ok_or_else(|| TierError::Config("redis tier needs `url` or `urls`".into()))?;
                let mut config = RedisConfig::single(first);
                config.urls = all;
                config.cluster = *cluster || !urls.is_empty();
                config.ttl = ttl_secs.map(Duration::from_secs);
                if let Some(ms) = connect_timeout_ms {
                    config.connect_timeout = Duration::from_millis(*ms);
                }
                if let Some(ms) = io_timeout_ms {
                    config.io_timeout = Duration::from_millis(*ms);
                }
                if let Some(prefix) = key_prefix {
                    config.key_prefix = prefix.clone();
                }
                if let Some(var) = secret_env {
                    let secret = std::env::var(var).map_err(|_| {
                        TierError::Config(format!("redis secret_env {var} is not set"))
                    })?;
                    config.secret = Some(secret.into_bytes());
                }
                Ok(Box::new(RedisStore::open(config)?))
            }
        }
    }
}

/// Open every configured tier, in order (index 0 is consulted first).
pub fn open_tiers(configs: &[TierConfig]) -> Result<Vec<Box<dyn TierStore>>, TierError> {
    configs.iter().map(TierConfig::open).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(ByteSize::parse("4GB").unwrap().0, 4_000_000_000);
        assert_eq!(ByteSize::parse("50 GiB").unwrap().0, 50 << 30);
        assert_eq!(ByteSize::parse("1024").unwrap().0, 1024);
        assert_eq!(ByteSize::parse("1.5kb").unwrap().0, 1500);
        assert!(ByteSize::parse("4XB").is_err());
        assert!(ByteSize::parse("GB").is_err());
    }

    #[test]
    fn tier_list_deserialises_from_json() {
        let json = r#"[{"kind":"ram","max_size":"4GB"},
            {"kind":"disk","path":"/tmp/x","max_size":"50GB"},
            {"kind":"redis","url":"redis://127.0.0.1:6379","ttl_secs":60}]"#;
        let tiers: Vec<TierConfig> = serde_json::from_str(json).unwrap();
        assert_eq!(
            tiers[0],
            TierConfig::Ram {
                max_size: ByteSize(4_000_000_000),
                compression: Compression::None,
                codec: None,
            }
        );
        assert!(matches!(&tiers[1], TierConfig::Disk { fsync: true, .. }));
        assert!(matches!(
            &tiers[2],
            TierConfig::Redis {
                ttl_secs: Some(60),
                ..
            }
        ));
        let coded: TierConfig =
            serde_json::from_str(r#"{"kind":"disk","path":"/x","max_size":1,"codec":"int8"}"#)
                .unwrap();
        assert_eq!(coded.codec(), Some("int8"));
        assert_eq!(tiers[2].codec(), None);
        let typo = r#"[{"kind":"ram","max_sise":"4GB"}]"#;
        assert!(serde_json::from_str::<Vec<TierConfig>>(typo).is_err());
    }

    #[test]
    fn redis_without_url_is_a_config_error() {
        let c: TierConfig = serde_json::from_str(r#"{"kind":"redis"}"#).unwrap();
        assert!(matches!(c.open(), Err(TierError::Config(_))));
    }
}
