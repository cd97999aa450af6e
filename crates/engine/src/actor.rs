//! The engine actor: [`EngineCore`] on its own thread, driven by a command channel.
//!
//! Callers hold an [`EngineHandle`] (cheap to clone): `submit` returns the request id and a
//! receiver of its events at once; dropping that receiver cancels the request at the next step.
//! The thread blocks on the command channel when idle and never sleeps while work is queued.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::core::{EngineCore, EngineStats};
use crate::error::EngineError;
use crate::request::{EngineEvent, RequestId, RequestSpec};

enum Command {
    Submit(RequestId, Box<RequestSpec>, Sender<EngineEvent>),
    Cancel(RequestId),
    Stats(Sender<EngineStats>),
    Shutdown,
}

/// Owns the engine thread; shuts it down on drop.
pub struct Engine {
    handle: EngineHandle,
    thread: Option<JoinHandle<()>>,
}

/// A cloneable way to talk to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    next_id: Arc<AtomicU64>,
}

impl Engine {
    pub fn start(core: EngineCore) -> Engine {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("agentkv-engine".into())
            .spawn(move || run(core, rx))
            .expect("spawning the engine thread");
        Engine {
            handle: EngineHandle {
                tx,
                next_id: Arc::new(AtomicU64::new(1)),
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
    /// Queues a request. Validation errors arrive as the first event.
    pub fn submit(
        &self,
        spec: RequestSpec,
    ) -> Result<(RequestId, Receiver<EngineEvent>), EngineError> {
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = mpsc::channel();
        self.tx
            .send(Command::Submit(id, Box::new(spec), tx))
            .map_err(|_| EngineError::ShutDown)?;
        Ok((id, rx))
    }

    pub fn cancel(&self, id: RequestId) {
        let _ = self.tx.send(Command::Cancel(id));
    }

    pub fn stats(&self) -> Result<EngineStats, EngineError> {
        let (tx, rx) = mpsc::channel();
        self.tx
            .send(Command::Stats(tx))
            .map_err(|_| EngineError::ShutDown)?;
        rx.recv().map_err(|_| EngineError::ShutDown)
    }
}

fn run(mut core: EngineCore, rx: Receiver<Command>) {
    loop {
        // Block when idle; otherwise drain what arrived and step.
        let first = if core.has_work() {
            match rx.try_recv() {
                Ok(c) => Some(c),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        } else {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        };
        let mut next = first;
        while let Some(cmd) = next {
            match cmd {
                Command::Submit(id, spec, tx) => {
                    if let Err(e) = core.submit(id, *spec, tx.clone()) {
                        let _ = tx.send(EngineEvent::Error(e));
                    }
                }
                Command::Cancel(id) => core.cancel(id),
                Command::Stats(tx) => {
                    let _ = tx.send(core.stats().clone());
                }
                Command::Shutdown => return,
            }
            next = rx.try_recv().ok();
        }
        if core.has_work() {
            if let Err(e) = core.step() {
                // A step error is an engine bug: fail every request loudly rather than hang them.
                core.fail_all(e);
            }
        }
    }
}
