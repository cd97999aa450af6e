//! Test support: a throw-away three-master Redis Cluster on loopback (three `redis-server
//! --cluster-enabled yes` joined by `redis-cli --cluster create`, no replicas), each node a
//! [`RedisServer`] killed on drop. Never used by production code.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::testing::{RedisServer, RedisServerError};

/// A three-master cluster; its nodes' files live in a temporary directory removed on drop.
pub struct RedisCluster {
    /// The masters (slots split evenly by `redis-cli --cluster create`).
    pub nodes: Vec<RedisServer>,
    dir: PathBuf,
    cli: String,
}

impl RedisCluster {
    /// Starts three masters with a 1 s node timeout that keep serving their own slots while
    /// another is down (`cluster-require-full-coverage no`), creates the cluster and waits until
    /// every node reports it up. Panics with the tool's output when `redis-cli` fails.
    pub fn start() -> Result<RedisCluster, RedisServerError> {
        Self::start_binary("redis-server", "redis-cli")
    }

    /// Like [`RedisCluster::start`] with other binaries that take Redis's flags
    /// (`valkey-server`, `valkey-cli`).
    pub fn start_binary(server: &str, cli: &str) -> Result<RedisCluster, RedisServerError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("agentkv-redis-cluster-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(RedisServerError::Spawn)?;
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            dir,
            cli: cli.to_owned(),
        };
        let dir_arg = cluster.dir.to_str().expect("utf-8 temp dir").to_owned();
        for i in 0..3 {
            let conf = format!("{dir_arg}/nodes-{i}.conf");
            cluster.nodes.push(RedisServer::start_binary(
                server,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf,
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-require-full-coverage",
                    "no",
                    "--dir",
                    &dir_arg,
                ],
            )?);
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new(cli)
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .map_err(RedisServerError::Spawn)?;
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &cluster.nodes {
            loop {
                let info = Command::new(cli)
                    .args(["-p", &node.port().to_string(), "cluster", "info"])
                    .output()
                    .map_err(RedisServerError::Spawn)?;
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "the cluster never became ok");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(cluster)
    }

    /// The nodes' `redis://` URLs (seed nodes for a cluster client).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Keys held by `node` (`DBSIZE`).
    pub fn dbsize(&self, node: usize) -> u64 {
        let out = Command::new(&self.cli)
            .args(["-p", &self.nodes[node].port().to_string(), "dbsize"])
            .output()
            .expect("the cluster's cli");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(0)
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
