//! When the demotion thread may transcode a block for a lossy tier.
//!
//! Encoding a block into a 4-bit tier codec costs ≈ 0.3–0.8 ms of CPU (the clipped-range
//! search); on a small machine every slice of it is taken from the forward pass, whose threads
//! all wait for the slowest one. So lossy encodes yield to the engine: the engine marks itself
//! busy while it has work, and an encode runs only once the engine is idle (agents' tool
//! pauses), a tier lookup waits for the demotions (they are urgent then), the write queue is
//! past half its cap, or the job's deferral deadline has passed (an engine that never idles
//! still gets its blocks written, later). Owns that state only; never decides what is written,
//! and never delays a write that does not transcode.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Why an encode may run now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// The engine has no work.
    Idle,
    /// A tier lookup (or a barrier) waits for the demotions.
    Urgent,
    /// The write queue is past half its cap.
    Pressed,
    /// The job waited its longest; it runs next to the forward pass.
    Deadline,
    /// The gate was opened for good (the engine is shutting down).
    Open,
}

#[derive(Default)]
struct GateState {
    busy: bool,
    /// Threads waiting for demotions to finish.
    urgent: usize,
    pressed: bool,
    open: bool,
}

/// Shared by the engine (busy), the demotion thread (waits its turn) and demotion waiters
/// (urgent).
#[derive(Default)]
pub struct EncodeGate {
    state: Mutex<GateState>,
    cv: Condvar,
}

impl EncodeGate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut GateState)) {
        f(&mut self.lock());
        self.cv.notify_all();
    }

    /// The engine has work (`true`) or has gone idle (`false`).
    pub fn set_busy(&self, busy: bool) {
        let mut s = self.lock();
        if s.busy != busy {
            s.busy = busy;
            drop(s);
            self.cv.notify_all();
        }
    }

    /// Whether the write queue is past half its cap: `pressed` is evaluated under the gate's
    /// lock, so of two threads that changed the queue and then call this, the later one reads
    /// both changes (the flag never keeps a stale answer).
    pub fn set_pressed(&self, pressed: impl FnOnce() -> bool) {
        let mut s = self.lock();
        let pressed = pressed();
        if s.pressed != pressed {
            s.pressed = pressed;
            drop(s);
            self.cv.notify_all();
        }
    }

    /// Never wait again (the demoter is draining its queue before the engine goes away).
    pub fn open_for_good(&self) {
        self.update(|s| s.open = true);
    }

    /// Marks the caller as waiting for demotions until the guard drops: encodes run at once.
    pub fn urgent(&self) -> UrgentGuard<'_> {
        self.update(|s| s.urgent += 1);
        UrgentGuard(self)
    }

    /// Waits until an encode may run, at the latest until `deadline`; says why it may.
    pub fn wait_turn(&self, deadline: Instant) -> Turn {
        let mut s = self.lock();
        loop {
            if s.open {
                return Turn::Open;
            }
            if s.urgent > 0 {
                return Turn::Urgent;
            }
            if !s.busy {
                return Turn::Idle;
            }
            if s.pressed {
                return Turn::Pressed;
            }
            let now = Instant::now();
            if now >= deadline {
                return Turn::Deadline;
            }
            s = self
                .cv
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// Holds the gate open while a thread waits for demotions (see [`EncodeGate::urgent`]).
pub struct UrgentGuard<'a>(&'a EncodeGate);

impl Drop for UrgentGuard<'_> {
    fn drop(&mut self) {
        self.0.update(|s| s.urgent -= 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    const LONG: Duration = Duration::from_secs(60);

    /// Runs `wait_turn` on another thread; returns its answer once it has one.
    fn waiter(gate: &Arc<EncodeGate>, deadline: Instant) -> std::thread::JoinHandle<Turn> {
        let g = gate.clone();
        std::thread::spawn(move || g.wait_turn(deadline))
    }

    #[test]
    fn an_idle_engine_lets_encodes_run_at_once() {
        let gate = EncodeGate::default();
        assert_eq!(gate.wait_turn(Instant::now() + LONG), Turn::Idle);
        gate.set_busy(true);
        gate.set_busy(false);
        assert_eq!(gate.wait_turn(Instant::now() + LONG), Turn::Idle);
    }

    #[test]
    fn a_busy_engine_holds_encodes_until_it_idles() {
        let gate = Arc::new(EncodeGate::default());
        gate.set_busy(true);
        let w = waiter(&gate, Instant::now() + LONG);
        std::thread::sleep(Duration::from_millis(30));
        assert!(!w.is_finished(), "an encode ran while the engine was busy");
        gate.set_busy(false);
        assert_eq!(w.join().unwrap(), Turn::Idle);
    }

    #[test]
    fn a_waiting_lookup_or_a_full_queue_lets_encodes_run_next_to_the_engine() {
        let gate = Arc::new(EncodeGate::default());
        gate.set_busy(true);
        let w = waiter(&gate, Instant::now() + LONG);
        std::thread::sleep(Duration::from_millis(20));
        assert!(!w.is_finished());
        {
            let _g = gate.urgent();
            assert_eq!(w.join().unwrap(), Turn::Urgent);
        }
        // The guard dropped: busy holds encodes again, until the queue fills.
        let w = waiter(&gate, Instant::now() + LONG);
        std::thread::sleep(Duration::from_millis(20));
        assert!(!w.is_finished());
        gate.set_pressed(|| true);
        assert_eq!(w.join().unwrap(), Turn::Pressed);
        gate.set_pressed(|| false);
        gate.open_for_good();
        assert_eq!(gate.wait_turn(Instant::now() + LONG), Turn::Open);
    }

    #[test]
    fn an_engine_that_never_idles_delays_encodes_by_the_deadline_only() {
        let gate = EncodeGate::default();
        gate.set_busy(true);
        let start = Instant::now();
        let deadline = start + Duration::from_millis(40);
        assert_eq!(gate.wait_turn(deadline), Turn::Deadline);
        assert!(Instant::now() >= deadline);
        // A deadline already passed answers at once.
        assert_eq!(gate.wait_turn(start), Turn::Deadline);
    }
}
