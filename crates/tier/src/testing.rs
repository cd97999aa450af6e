//! Test support shared with other crates' tests: a throw-away `redis-server` on a free loopback
//! port (killed on drop), a three-master Redis Cluster of them (`testing_cluster.rs`) and
//! deterministic block payloads. Never used by production code.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why a test Redis server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RedisServerError {
    /// `redis-server` is not installed or failed to spawn.
    #[error("cannot spawn redis-server (install it: apt-get install -y redis-server): {0}")]
    Spawn(std::io::Error),
    /// No free port could be found.
    #[error("no free loopback port: {0}")]
    Port(std::io::Error),
    /// The server did not answer PING in time.
    #[error("redis-server on port {port} did not answer within {waited:?}")]
    NotReady {
        /// Port it was started on.
        port: u16,
        /// Time waited.
        waited: Duration,
    },
}

/// A `redis-server --save '' --appendonly no` child on 127.0.0.1; killed (SIGKILL) on drop.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    extra_args: Vec<String>,
    /// The server binary (`redis-server`, or `valkey-server`: same protocol and flags).
    binary: String,
}

fn free_port() -> Result<u16, RedisServerError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(RedisServerError::Port)?;
    let port = listener
        .local_addr()
        .map_err(RedisServerError::Port)?
        .port();
    Ok(port)
}

impl RedisServer {
    /// Start a server on a free port and wait until it answers PING.
    pub fn start() -> Result<RedisServer, RedisServerError> {
        Self::start_with_args(&[])
    }

    /// Like [`RedisServer::start`] with extra `redis-server` arguments (e.g. `--maxmemory 2mb`).
    pub fn start_with_args(extra_args: &[&str]) -> Result<RedisServer, RedisServerError> {
        Self::start_binary("redis-server", extra_args)
    }

    /// Like [`RedisServer::start_with_args`] with another server binary that takes Redis's flags
    /// (`valkey-server`).
    pub fn start_binary(
        binary: &str,
        extra_args: &[&str],
    ) -> Result<RedisServer, RedisServerError> {
        let mut server = RedisServer {
            child: None,
            port: free_port()?,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            binary: binary.to_owned(),
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> Result<(), RedisServerError> {
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(RedisServerError::Spawn)?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(10))
    }

    fn wait_ready(&self, limit: Duration) -> Result<(), RedisServerError> {
        let start = Instant::now();
        let client =
            redis::Client::open(self.url().as_str()).map_err(|_| RedisServerError::NotReady {
                port: self.port,
                waited: Duration::ZERO,
            })?;
        while start.elapsed() < limit {
            if let Ok(mut con) = client.get_connection_with_timeout(Duration::from_millis(200)) {
                if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(RedisServerError::NotReady {
            port: self.port,
            waited: limit,
        })
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Loopback port of the server.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kill the server (SIGKILL; it works on a frozen one too) and wait for it; the port becomes
    /// free.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freeze the server (SIGSTOP): it keeps its socket, the kernel still accepts connections,
    /// and nothing answers — a hung Redis.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Thaw a frozen server (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        if let Some(child) = &self.child {
            let ok = Command::new("kill")
                .args([sig, &child.id().to_string()])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kill {sig} redis-server failed");
        }
    }

    /// Start it again on the same port (empty: nothing is persisted).
    pub fn restart(&mut self) -> Result<(), RedisServerError> {
        self.stop();
        self.spawn()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Deterministic pseudo-random bytes (BLAKE3 XOF of `seed`): test payloads that do not compress.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    blake3::Hasher::new()
        .update(b"agentkv tier test payload")
        .update(&seed.to_le_bytes())
        .finalize_xof()
        .fill(&mut out);
    out
}

/// Deterministic 32-byte test hash for `(domain, index)`.
pub fn hash32(domain: &str, index: u64) -> [u8; 32] {
    *blake3::Hasher::new()
        .update(domain.as_bytes())
        .update(&index.to_le_bytes())
        .finalize()
        .as_bytes()
}
