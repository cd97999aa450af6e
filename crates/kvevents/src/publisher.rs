//! The ZMQ side, as vLLM's `ZmqEventPublisher` does it: a PUB socket sends each batch as the
//! three frames `[topic, seq: 8-byte big-endian, payload]` (seq counts from 0); an optional
//! ROUTER socket answers replay requests `[identity, "", start_seq: 8-byte big-endian]` with
//! every buffered batch from `start_seq` on (`[identity, "", seq, payload]` each) and the end
//! marker `[identity, "", -1 as 8-byte signed big-endian, ""]`.
//!
//! Runs on its own thread with a single-threaded tokio runtime (pure-Rust `zeromq`, so no system
//! libzmq): it drains the engine's [`engine::KvEventSink`] receiver and stops when every sender
//! is gone. Never blocks the engine (the sink is unbounded; a subscriber that cannot keep up
//! loses messages, as with any PUB socket, and may replay).

use std::collections::VecDeque;
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use engine::KvEvent;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::wire::{encode_batch, WireFormat};

/// Where and how to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherConfig {
    /// PUB endpoint to bind, e.g. `tcp://*:5557` (port 0 picks a free one).
    pub endpoint: String,
    /// ROUTER endpoint for replay requests, e.g. `tcp://*:5558` (`None`: no replay).
    pub replay_endpoint: Option<String>,
    /// First frame of every message (vLLM's default: empty).
    pub topic: String,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// Sent in every batch (vLLM's data-parallel rank; 0 for one engine).
    pub data_parallel_rank: u32,
    /// Layout of batches and events (default: what vllm-router 0.1.17 decodes).
    pub format: WireFormat,
    /// Bind addresses other than loopback. Off by default: events carry every tenant's prompt
    /// token ids, so `tcp://*:P` binds 127.0.0.1 and a non-loopback address is refused.
    pub allow_remote: bool,
    /// Send the blocks' token ids in `BlockStored` (else an empty list; hashes, parents and
    /// block sizes are unchanged).
    pub token_ids: bool,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        PublisherConfig {
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            topic: String::new(),
            buffer_steps: 10_000,
            data_parallel_rank: 0,
            format: WireFormat::ArrayOfMaps,
            allow_remote: false,
            token_ids: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("binding KV-event socket {endpoint}: {source}")]
    Bind {
        endpoint: String,
        source: zeromq::ZmqError,
    },
    /// A non-loopback address without [`PublisherConfig::allow_remote`].
    #[error(
        "KV-event socket {endpoint} would publish every tenant's prompt token ids off this host; \
         bind a loopback address, or allow remote subscribers explicitly \
         (kv_events.allow_remote_subscribers: true, docs/security.md)"
    )]
    Remote { endpoint: String },
    #[error("starting the KV-event publisher: {0}")]
    Start(String),
}

/// A running publisher: the endpoints it bound (with the ports chosen for port 0).
#[derive(Debug)]
pub struct Publisher {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    thread: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Binds the sockets and starts publishing what `events` delivers.
    pub fn start(
        cfg: PublisherConfig,
        events: Receiver<Vec<KvEvent>>,
    ) -> Result<Publisher, PublishError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("kv-events".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(PublishError::Start(e.to_string())));
                        return;
                    }
                };
                rt.block_on(run(cfg, events, ready_tx));
            })
            .map_err(|e| PublishError::Start(e.to_string()))?;
        match ready_rx.recv() {
            Ok(Ok((endpoint, replay_endpoint))) => Ok(Publisher {
                endpoint,
                replay_endpoint,
                thread: Some(thread),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(PublishError::Start("publisher thread ended".into())),
        }
    }

    /// Waits until the publisher has sent everything (after every sink is dropped).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The address to bind (`zeromq` wants an address): `tcp://*:P` is every interface with
/// `allow_remote`, else loopback only; another TCP host must be loopback unless `allow_remote`.
fn bind_address(endpoint: &str, allow_remote: bool) -> Result<String, PublishError> {
    if let Some(port) = endpoint.strip_prefix("tcp://*:") {
        let host = if allow_remote { "0.0.0.0" } else { "127.0.0.1" };
        return Ok(format!("tcp://{host}:{port}"));
    }
    if let Some(rest) = endpoint.strip_prefix("tcp://") {
        let host = match rest.rsplit_once(':') {
            Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
            None => rest,
        };
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback && !allow_remote {
            return Err(PublishError::Remote {
                endpoint: endpoint.to_string(),
            });
        }
    }
    Ok(endpoint.to_string())
}

type Ready = Result<(String, Option<String>), PublishError>;

async fn bind<S: Socket>(
    socket: &mut S,
    endpoint: &str,
    allow_remote: bool,
) -> Result<String, PublishError> {
    socket
        .bind(&bind_address(endpoint, allow_remote)?)
        .await
        .map(|e| e.to_string())
        .map_err(|source| PublishError::Bind {
            endpoint: endpoint.to_string(),
            source,
        })
}

async fn run(
    cfg: PublisherConfig,
    events: Receiver<Vec<KvEvent>>,
    ready: std::sync::mpsc::Sender<Ready>,
) {
    let mut publisher = zeromq::PubSocket::new();
    let bound = match bind(&mut publisher, &cfg.endpoint, cfg.allow_remote).await {
        Ok(e) => e,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut replay = None;
    let mut replay_bound = None;
    if let Some(ep) = &cfg.replay_endpoint {
        let mut r = zeromq::RouterSocket::new();
        match bind(&mut r, ep, cfg.allow_remote).await {
            Ok(e) => replay_bound = Some(e),
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        }
        replay = Some(r);
    }
    // The engine's receiver is blocking: a forwarding thread hands its batches over.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let forwarder = std::thread::Builder::new()
        .name("kv-events-in".into())
        .spawn(move || {
            while let Ok(batch) = events.recv() {
                if tx.send(batch).is_err() {
                    break;
                }
            }
        });
    if let Err(e) = forwarder {
        let _ = ready.send(Err(PublishError::Start(e.to_string())));
        return;
    }
    let _ = ready.send(Ok((bound, replay_bound)));
    let topic = Bytes::from(cfg.topic.into_bytes());
    let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::new();
    let mut seq = 0u64;
    loop {
        tokio::select! {
            batch = rx.recv() => {
                let Some(mut batch) = batch else { break };
                if !cfg.token_ids {
                    for ev in &mut batch {
                        if let KvEvent::Stored { tokens, .. } = ev {
                            tokens.clear();
                        }
                    }
                }
                let ts = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                let payload = Bytes::from(encode_batch(
                    ts,
                    &batch,
                    cfg.data_parallel_rank,
                    cfg.format,
                ));
                let frames = vec![
                    topic.clone(),
                    Bytes::copy_from_slice(&seq.to_be_bytes()),
                    payload.clone(),
                ];
                if let Ok(msg) = ZmqMessage::try_from(frames) {
                    if let Err(e) = publisher.send(msg).await {
                        tracing::warn!(error = %e, "KV-event publish failed");
                    }
                }
                if cfg.buffer_steps > 0 {
                    if buffer.len() == cfg.buffer_steps {
                        buffer.pop_front();
                    }
                    buffer.push_back((seq, payload));
                }
                seq += 1;
            }
            req = async {
                match replay.as_mut() {
                    Some(r) => r.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                let (Ok(req), Some(r)) = (req, replay.as_mut()) else { continue };
                serve_replay(r, req, &buffer).await;
            }
        }
    }
}

/// Answers one replay request (malformed ones are logged and dropped, as vLLM does).
async fn serve_replay(
    router: &mut zeromq::RouterSocket,
    req: ZmqMessage,
    buffer: &VecDeque<(u64, Bytes)>,
) {
    let frames = req.into_vec();
    let [identity, _, start] = frames.as_slice() else {
        tracing::warn!(frames = frames.len(), "invalid KV-event replay request");
        return;
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
        tracing::warn!("invalid KV-event replay start sequence");
        return;
    };
    let start = u64::from_be_bytes(start);
    let reply = |seq: Bytes, payload: Bytes| {
        ZmqMessage::try_from(vec![identity.clone(), Bytes::new(), seq, payload])
    };
    for (seq, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
        if let Ok(m) = reply(Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()) {
            if router.send(m).await.is_err() {
                return;
            }
        }
    }
    if let Ok(m) = reply(Bytes::copy_from_slice(&(-1i64).to_be_bytes()), Bytes::new()) {
        let _ = router.send(m).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_binds_loopback_unless_remote_subscribers_are_allowed() {
        let b = |e: &str, remote| bind_address(e, remote).map_err(|e| e.to_string());
        assert_eq!(b("tcp://*:5557", false).unwrap(), "tcp://127.0.0.1:5557");
        assert_eq!(b("tcp://*:5557", true).unwrap(), "tcp://0.0.0.0:5557");
        assert_eq!(b("tcp://127.0.0.1:0", false).unwrap(), "tcp://127.0.0.1:0");
        assert_eq!(b("tcp://[::1]:7", false).unwrap(), "tcp://[::1]:7");
        assert_eq!(b("tcp://localhost:7", false).unwrap(), "tcp://localhost:7");
        for remote in [
            "tcp://0.0.0.0:5557",
            "tcp://10.1.2.3:5557",
            "tcp://[::]:5557",
        ] {
            assert!(
                b(remote, false).unwrap_err().contains("off this host"),
                "{remote}"
            );
            assert_eq!(b(remote, true).unwrap(), remote);
        }
    }
}
