//! Redis store (one server or a Redis Cluster): one Redis string per object, value = the
//! stored-object format (full key + checksum, or a keyed-BLAKE3 MAC with a server secret),
//! optional TTL. Every call is bounded by connect/IO timeouts — connection set-up included, so a
//! frozen (SIGSTOPped) server fails the call within them instead of hanging it — and after a
//! connection failure
//! the store answers `Unavailable` instantly for a back-off period, so a down server never
//! stalls the caller. Owns client connections; never configures the server (budget = the
//! server's `maxmemory` + eviction policy).

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConnection};
use redis::{Client, Connection, RedisError, Value};

use crate::dropped::TtlWatch;
use crate::object::{self, Compression, MacKey};
use crate::store::RawObjectAccess;
use crate::{
    BlockRef, StoredBlock, TierError, TierKey, TierKind, TierMetrics, TierStats, TierStore,
};

/// Retries of one cluster command (redirections and a dead node's errors), and the range of the
/// wait before each in milliseconds.
const CLUSTER_RETRIES: u32 = 2;
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (10, 100);

/// Configuration of a [`RedisStore`].
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// `redis://host:port[/db]` URLs. One URL and `cluster == false`: a single server.
    /// With `cluster == true`: seed nodes of a Redis Cluster.
    pub urls: Vec<String>,
    /// Talk the cluster protocol (slot routing, MOVED/ASK).
    pub cluster: bool,
    /// Prefix of every Redis key (default `"akv1"`); keys are `<prefix>:<TierKey::name_hex>`.
    pub key_prefix: String,
    /// Expire objects this long after their last write (`None`: no TTL).
    pub ttl: Option<Duration>,
    /// Limit on establishing a connection.
    pub connect_timeout: Duration,
    /// Limit on each read and write of a command.
    pub io_timeout: Duration,
    /// After a connection-level failure, answer `Unavailable` without trying for this long.
    pub retry_backoff: Duration,
    /// Operator secret: objects carry a keyed-BLAKE3 MAC; objects without it are rejected.
    /// Every server sharing the Redis must use the same secret.
    pub secret: Option<Vec<u8>>,
    /// Payload compression applied on put.
    pub compression: Compression,
    /// Idle connections kept for reuse.
    pub max_idle_connections: usize,
}

impl RedisConfig {
    /// Single-server config with defaults: prefix `akv1`, no TTL, 250 ms connect, 1 s IO,
    /// 2 s back-off, no secret, no compression, 4 idle connections.
    pub fn single(url: impl Into<String>) -> RedisConfig {
        RedisConfig {
            urls: vec![url.into()],
            cluster: false,
            key_prefix: "akv1".to_owned(),
            ttl: None,
            connect_timeout: Duration::from_millis(250),
            io_timeout: Duration::from_secs(1),
            retry_backoff: Duration::from_secs(2),
            secret: None,
            compression: Compression::None,
            max_idle_connections: 4,
        }
    }
}

enum Conn {
    Single(Connection),
    Cluster(ClusterConnection),
}

impl Conn {
    fn run<T: redis::FromRedisValue>(
        &mut self,
        build: impl Fn(&mut Batch<'_>),
    ) -> Result<T, RedisError> {
        match self {
            Conn::Single(con) => {
                let mut pipe = redis::pipe();
                build(&mut Batch::Single(&mut pipe));
                pipe.query(con)
            }
            Conn::Cluster(con) => {
                let mut pipe = redis::cluster::cluster_pipe();
                build(&mut Batch::Cluster(&mut pipe));
                pipe.query(con)
            }
        }
    }
}

/// A pipeline of either flavour (commands are added through [`Batch::cmd`]).
enum Batch<'a> {
    Single(&'a mut redis::Pipeline),
    Cluster(&'a mut redis::cluster::ClusterPipeline),
}

impl Batch<'_> {
    fn cmd(&mut self, cmd: redis::Cmd) {
        match self {
            Batch::Single(p) => {
                p.add_command(cmd);
            }
            Batch::Cluster(p) => {
                p.add_command(cmd);
            }
        }
    }
}

enum Backend {
    Single(Client),
    Cluster(ClusterClient),
}

/// Store backed by a Redis server or cluster.
pub struct RedisStore {
    backend: Backend,
    config: RedisConfig,
    mac: Option<MacKey>,
    idle: Mutex<Vec<Conn>>,
    down_until: Mutex<Option<Instant>>,
    metrics: TierMetrics,
    /// When the objects this process wrote expire (`None` without a TTL).
    expiry: Option<TtlWatch>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded values (idle connections, a deadline) stay valid after any panic.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RedisStore {
    /// Build the client (parses URLs; connects lazily, so a down server does not fail here).
    pub fn open(config: RedisConfig) -> Result<RedisStore, TierError> {
        if config.urls.is_empty() {
            return Err(TierError::Config(
                "redis tier needs at least one url".into(),
            ));
        }
        if config.io_timeout.is_zero() || config.connect_timeout.is_zero() {
            return Err(TierError::Config("redis timeouts must be non-zero".into()));
        }
        if !config.cluster && config.urls.len() > 1 {
            return Err(TierError::Config(
                "several redis urls need `cluster: true`".into(),
            ));
        }
        let backend = if config.cluster {
            // The client's own retries default to 16 with sleeps of 1.28 s and more between them
            // (a command for a dead master's slots then stalls for minutes); a tier miss is
            // cheap, so retry little and briefly and let the caller recompute.
            let client = ClusterClientBuilder::new(config.urls.clone())
                .connection_timeout(config.connect_timeout)
                .response_timeout(config.io_timeout)
                .retries(CLUSTER_RETRIES)
                .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
                .max_retry_wait(CLUSTER_RETRY_WAIT_MS.1)
                .build()
                .map_err(|e| TierError::Config(format!("redis cluster: {e}")))?;
            Backend::Cluster(client)
        } else {
            let client = Client::open(config.urls[0].as_str())
                .map_err(|e| TierError::Config(format!("redis url: {e}")))?;
            Backend::Single(client)
        };
        Ok(RedisStore {
            backend,
            expiry: config.ttl.map(TtlWatch::new),
            mac: config.secret.as_deref().map(MacKey::from_secret),
            config,
            idle: Mutex::new(Vec::new()),
            down_until: Mutex::new(None),
            metrics: TierMetrics::default(),
        })
    }

    /// The Redis key holding `key`'s object.
    pub fn redis_key(&self, key: &TierKey) -> String {
        format!("{}:{}", self.config.key_prefix, key.name_hex())
    }

    /// A new connection whose every round trip is bounded by the timeouts. The redis crate
    /// sends its set-up commands (AUTH, SELECT, HELLO, CLIENT SETINFO) right after the TCP
    /// connect and waits for their answers before a read timeout can be set: a server that
    /// accepts connections but never answers (SIGSTOPped; a full accept queue of a hung process)
    /// would block the caller there forever. So the TCP connection is made bare (CLIENT SETINFO
    /// is compiled out, credentials and db stripped), the timeouts are set, and then AUTH and
    /// SELECT are sent by us, under them.
    fn connect(&self) -> Result<Conn, RedisError> {
        let io = Some(self.config.io_timeout);
        match &self.backend {
            Backend::Single(client) => {
                let info = client.get_connection_info();
                let mut bare = info.clone();
                bare.redis = redis::RedisConnectionInfo::default();
                let mut con =
                    Client::open(bare)?.get_connection_with_timeout(self.config.connect_timeout)?;
                con.set_read_timeout(io)?;
                con.set_write_timeout(io)?;
                let r = &info.redis;
                if let Some(password) = &r.password {
                    let mut auth = redis::cmd("AUTH");
                    if let Some(user) = &r.username {
                        auth.arg(user);
                    }
                    auth.arg(password).query::<()>(&mut con)?;
                }
                if r.db != 0 {
                    redis::cmd("SELECT").arg(r.db).query::<()>(&mut con)?;
                }
                Ok(Conn::Single(con))
            }
            Backend::Cluster(client) => {
                let con = client.get_connection()?;
                con.set_read_timeout(io)?;
                con.set_write_timeout(io)?;
                Ok(Conn::Cluster(con))
            }
        }
    }

    /// Run one pipeline on a pooled connection, with back-off bookkeeping and error counting.
    fn with_conn<T: redis::FromRedisValue>(
        &self,
        build: impl Fn(&mut Batch<'_>),
    ) -> Result<T, TierError> {
        if let Some(until) = *lock(&self.down_until) {
            let now = Instant::now();
            if now < until {
                self.metrics.error();
                return Err(TierError::Unavailable {
                    retry_in: until - now,
                });
            }
        }
        let pooled = lock(&self.idle).pop();
        let mut con = match pooled.map(Ok).unwrap_or_else(|| self.connect()) {
            Ok(con) => con,
            Err(e) => return Err(self.failed(e)),
        };
        match con.run::<T>(build) {
            Ok(value) => {
                *lock(&self.down_until) = None;
                let mut idle = lock(&self.idle);
                if idle.len() < self.config.max_idle_connections {
                    idle.push(con);
                }
                Ok(value)
            }
            // The connection is dropped: after an error its state is unknown.
            Err(e) => Err(self.failed(e)),
        }
    }

    fn failed(&self, e: RedisError) -> TierError {
        self.metrics.error();
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
        {
            *lock(&self.down_until) = Some(Instant::now() + self.config.retry_backoff);
            lock(&self.idle).clear();
        }
        if e.is_timeout() {
            return TierError::Timeout {
                store: "redis",
                after: self.config.io_timeout.max(self.config.connect_timeout),
            };
        }
        TierError::Redis(e)
    }

    fn set_cmd(&self, key: &TierKey, bytes: &[u8]) -> redis::Cmd {
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.redis_key(key)).arg(bytes);
        if let Some(ttl) = self.config.ttl {
            cmd.arg("PX").arg(ttl.as_millis().max(1) as u64);
        }
        cmd
    }
}

impl TierStore for RedisStore {
    fn kind(&self) -> TierKind {
        TierKind::Redis
    }

    fn contains_prefix(&self, chain: &[TierKey]) -> Result<usize, TierError> {
        if chain.is_empty() {
            return Ok(0);
        }
        let present: Vec<bool> = self.with_conn(|batch| {
            for key in chain {
                let mut cmd = redis::cmd("EXISTS");
                cmd.arg(self.redis_key(key));
                batch.cmd(cmd);
            }
        })?;
        Ok(present.iter().take_while(|p| **p).count())
    }

    fn get_many(&self, keys: &[TierKey]) -> Result<Vec<Option<StoredBlock>>, TierError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let start = Instant::now();
        let values: Vec<Value> = match self.with_conn(|batch| {
            for key in keys {
                let mut cmd = redis::cmd("GET");
                cmd.arg(self.redis_key(key));
                batch.cmd(cmd);
            }
        }) {
            Ok(values) => values,
            Err(e) => {
                self.metrics.misses(keys.len());
                return Err(e);
            }
        };
        let mut out = Vec::with_capacity(keys.len());
        let mut rejected = Vec::new();
        let mut misses = 0;
        for (key, value) in keys.iter().zip(values) {
            let block = match value {
                Value::BulkString(bytes) => {
                    self.metrics.read(bytes.len());
                    match object::decode(key, &bytes, self.mac.as_ref()) {
                        Ok(block) => Some(block),
                        Err(_) => {
                            self.metrics.corrupted();
                            rejected.push(*key);
                            None
                        }
                    }
                }
                _ => None,
            };
            match &block {
                Some(b) => self.metrics.hit(b.num_tokens, b.payload.len()),
                None => misses += 1,
            }
            out.push(block);
        }
        self.metrics.misses(misses);
        self.metrics.load_latency(start.elapsed());
        if !rejected.is_empty() {
            // Best effort: a failed clean-up only means the next read rejects it again.
            let _ = self.remove(&rejected);
        }
        Ok(out)
    }

    fn put_many(&self, blocks: &[BlockRef<'_>]) -> Result<(), TierError> {
        if blocks.is_empty() {
            return Ok(());
        }
        let mut encoded = Vec::with_capacity(blocks.len());
        for block in blocks {
            encoded.push(object::encode(
                block,
                self.config.compression,
                self.mac.as_ref(),
            )?);
        }
        let () = self.with_conn(|batch| {
            for (block, bytes) in blocks.iter().zip(&encoded) {
                batch.cmd(self.set_cmd(&block.key, bytes));
            }
        })?;
        if let Some(expiry) = &self.expiry {
            // Timed after the SETs were answered, so an object is never reported before Redis
            // expires it (at most one round trip late).
            expiry.written(blocks.iter().map(|b| b.key), Instant::now());
        }
        for bytes in &encoded {
            self.metrics.written(bytes.len());
        }
        Ok(())
    }

    fn remove(&self, keys: &[TierKey]) -> Result<(), TierError> {
        if keys.is_empty() {
            return Ok(());
        }
        if let Some(expiry) = &self.expiry {
            expiry.removed(keys);
        }
        let () = self.with_conn(|batch| {
            for key in keys {
                let mut cmd = redis::cmd("DEL");
                cmd.arg(self.redis_key(key));
                batch.cmd(cmd);
            }
        })?;
        Ok(())
    }

    fn stats(&self) -> TierStats {
        self.metrics.snapshot(None, None)
    }

    /// Objects whose TTL has run out since this process last wrote them (Redis expires them
    /// itself and tells no one). Evictions by the server's own `maxmemory` policy are not seen.
    fn take_dropped(&self) -> Vec<TierKey> {
        self.expiry
            .as_ref()
            .map_or_else(Vec::new, |e| e.expired(Instant::now()))
    }
}

impl RawObjectAccess for RedisStore {
    fn read_raw(&self, key: &TierKey) -> Result<Option<Vec<u8>>, TierError> {
        let values: Vec<Option<Vec<u8>>> = self.with_conn(|batch| {
            let mut cmd = redis::cmd("GET");
            cmd.arg(self.redis_key(key));
            batch.cmd(cmd);
        })?;
        Ok(values.into_iter().next().flatten())
    }

    fn write_raw(&self, key: &TierKey, bytes: &[u8]) -> Result<(), TierError> {
        let () = self.with_conn(|batch| {
            let mut cmd = redis::cmd("SET");
            cmd.arg(self.redis_key(key)).arg(bytes);
            batch.cmd(cmd);
        })?;
        Ok(())
    }
}
