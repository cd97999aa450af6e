//! The engine actor: [`EngineCore`] on its own thread, driven by a command channel.
//!
//! Callers hold an [`EngineHandle`] (cheap to clone, usable from async code and from plain
//! threads): `submit` returns the request id and the receiver of its events at once; dropping
//! that receiver cancels the request at its next token. Snapshots are read from what the engine
//! publishes after each step and command batch, never waiting for a step. Replies to queries come on oneshot
//! channels (`.await` them, or `blocking_recv()` off-runtime). The thread blocks on the command
//! channel when idle and never sleeps while work is queued. Cancel-safety: every method only
//! sends a command, so dropping a future that awaits a reply loses the reply, not the command.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use cache::{SessionId, TenantId};
use tokio::sync::oneshot;

use crate::core::{EngineCore, SnapshotCell};
use crate::error::EngineError;
use crate::request::{
    EngineEvent, EventReceiver, EventSender, RequestId, RequestSpec, SessionInfo,
};
use crate::snapshot::EngineSnapshot;

enum Command {
    Submit(RequestId, Box<RequestSpec>, EventSender),
    Cancel(RequestId),
    Flush(Option<TenantId>, oneshot::Sender<u32>),
    Warmup(Box<Warmup>, oneshot::Sender<Result<usize, EngineError>>),
    /// Query (`false`) or release (`true`) a session's retention.
    Session(SessionId, bool, oneshot::Sender<Option<SessionInfo>>),
    /// A finished request ended in tool calls: (tenant, salt, prompt + output tokens).
    ToolPause(TenantId, Vec<u8>, Vec<u32>, i32),
    Shutdown,
}

struct Warmup {
    name: String,
    tokens: Vec<u32>,
    tenant: TenantId,
    salt: Vec<u8>,
}

/// Owns the engine thread; shuts it down on drop (waiting requests are dropped, their receivers
/// see the channel close).
pub struct Engine {
    handle: EngineHandle,
    thread: Option<JoinHandle<()>>,
}

/// A cloneable way to talk to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    next_id: Arc<AtomicU64>,
    published: SnapshotCell,
    /// Cleared when the engine thread ends.
    alive: Arc<AtomicBool>,
}

impl Engine {
    pub fn start(core: EngineCore) -> Engine {
        let (tx, rx) = mpsc::channel();
        let published = core.snapshot_cell();
        let alive = Arc::new(AtomicBool::new(true));
        let thread_alive = alive.clone();
        let thread = std::thread::Builder::new()
            .name("agentkv-engine".into())
            .spawn(move || {
                run(core, rx);
                thread_alive.store(false, Ordering::Release);
            })
            .expect("spawning the engine thread");
        Engine {
            handle: EngineHandle {
                tx,
                next_id: Arc::new(AtomicU64::new(1)),
                published,
                alive,
            },
            thread: Some(thread),
        }
    }

    pub fn handle(&self) -> EngineHandle {
        self.handle.clone()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.handle.tx.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl EngineHandle {
    /// Queues a request. Validation errors arrive as its first (and only) event.
    pub fn submit(&self, spec: RequestSpec) -> Result<(RequestId, EventReceiver), EngineError> {
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.tx
            .send(Command::Submit(id, Box::new(spec), tx))
            .map_err(|_| EngineError::ShutDown)?;
        Ok((id, rx))
    }

    /// Cancels a request; its blocks are freed before the next step.
    pub fn cancel(&self, id: RequestId) {
        let _ = self.tx.send(Command::Cancel(id));
    }

    /// The snapshot the engine published after its last step or command (never waits for a
    /// step; the receiver is ready at once).
    pub fn snapshot(&self) -> Result<oneshot::Receiver<EngineSnapshot>, EngineError> {
        if !self.alive.load(Ordering::Acquire) {
            return Err(EngineError::ShutDown);
        }
        let (tx, rx) = oneshot::channel();
        let _ = tx.send((*self.published.get()).clone());
        Ok(rx)
    }

    /// Flushes cached blocks of one tenant, or all; replies with the number of blocks dropped.
    pub fn flush(&self, tenant: Option<TenantId>) -> Result<oneshot::Receiver<u32>, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Flush(tenant, tx))
            .map_err(|_| EngineError::ShutDown)?;
        Ok(rx)
    }

    /// A session's retention (`release`: ended now, replying with what it held); `None` when it
    /// retains nothing.
    pub fn session(
        &self,
        session: SessionId,
        release: bool,
    ) -> Result<oneshot::Receiver<Option<SessionInfo>>, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Session(session, release, tx))
            .map_err(|_| EngineError::ShutDown)?;
        Ok(rx)
    }

    /// A finished request (`tokens`: its prompt and output, `tenant`, `salt` and `priority` as
    /// submitted)
    /// ended in tool calls: keep its blocks for the agent's next call (`tool_pause.rs`).
    /// Fire and forget.
    pub fn tool_pause(
        &self,
        tenant: TenantId,
        salt: Vec<u8>,
        tokens: Vec<u32>,
        priority: i32,
    ) -> Result<(), EngineError> {
        self.tx
            .send(Command::ToolPause(tenant, salt, tokens, priority))
            .map_err(|_| EngineError::ShutDown)
    }

    /// Prefills and pins a prompt; replies with the pinned token count.
    pub fn warmup(
        &self,
        name: &str,
        tokens: Vec<u32>,
        tenant: TenantId,
        salt: Vec<u8>,
    ) -> Result<oneshot::Receiver<Result<usize, EngineError>>, EngineError> {
        let (tx, rx) = oneshot::channel();
        let w = Warmup {
            name: name.to_string(),
            tokens,
            tenant,
            salt,
        };
        self.tx
            .send(Command::Warmup(Box::new(w), tx))
            .map_err(|_| EngineError::ShutDown)?;
        Ok(rx)
    }
}

/// How often an idle engine checks for tier writes to publish.
const IDLE_PUBLISH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// How long the engine waits for a command after a step that had nothing to compute although
/// requests are held (every one waits for a stalled reader or a tier load): it re-plans then.
const STALLED_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(5);

fn run(mut core: EngineCore, rx: Receiver<Command>) {
    let mut idle_step = false;
    loop {
        // Block when idle; otherwise drain what arrived and step.
        let first = if core.has_work() && idle_step {
            // Nothing could compute last step: wait a little instead of spinning.
            match rx.recv_timeout(STALLED_POLL_INTERVAL) {
                Ok(c) => Some(c),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        } else if core.has_work() {
            match rx.try_recv() {
                Ok(c) => Some(c),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        } else {
            // Idle: wake now and then to publish tier writes that finished meanwhile.
            match rx.recv_timeout(IDLE_PUBLISH_INTERVAL) {
                Ok(c) => Some(c),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    core.publish_tier_writes();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        };
        let first_was_command = first.is_some();
        let mut next = first;
        while let Some(cmd) = next {
            match cmd {
                Command::Submit(id, spec, tx) => {
                    if let Err(e) = core.submit(id, *spec, tx.clone()) {
                        let _ = tx.send(EngineEvent::Error(e));
                    }
                }
                Command::Cancel(id) => core.cancel(id),
                // Replies go out after the snapshot shows their effect.
                Command::Flush(tenant, tx) => {
                    let flushed = core.flush(tenant);
                    core.publish();
                    let _ = tx.send(flushed);
                }
                Command::Warmup(w, tx) => {
                    let pinned = core.warmup(&w.name, &w.tokens, w.tenant, &w.salt);
                    core.publish();
                    let _ = tx.send(pinned);
                }
                Command::ToolPause(tenant, salt, tokens, priority) => {
                    core.tool_pause(tenant, &salt, &tokens, priority);
                }
                Command::Session(session, release, tx) => {
                    let found = core.session(session, release);
                    core.publish();
                    match found {
                        Some(q) => core.locate_session(q, move |info| {
                            let _ = tx.send(Some(info));
                        }),
                        None => {
                            let _ = tx.send(None);
                        }
                    }
                }
                Command::Shutdown => return,
            }
            next = rx.try_recv().ok();
        }
        if first_was_command {
            core.publish();
        }
        idle_step = false;
        if core.has_work() {
            match core.step() {
                Ok(tokens) => idle_step = tokens == 0,
                // A step error is an engine bug: fail every request loudly rather than hang them.
                Err(e) => core.fail_all(e),
            }
        }
    }
}
