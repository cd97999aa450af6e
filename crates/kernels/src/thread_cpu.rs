//! How much CPU time another thread of this process has run: the thread pool's evidence that a
//! worker it waits for lost its core (its CPU clock stands still while the wall clock runs)
//! rather than running a long task.
//!
//! Owns the two POSIX calls behind it (`pthread_getcpuclockid`, `clock_gettime`). It never
//! schedules, never changes a thread and never blocks; where the platform has no per-thread CPU
//! clock every function answers `None` and the pool falls back to wall-clock timing alone.

use std::thread::JoinHandle;
use std::time::Duration;

/// The CPU-time clock of one thread, valid while that thread has not been joined.
#[derive(Debug, Clone, Copy)]
pub struct CpuClock {
    #[cfg(target_os = "linux")]
    id: libc::clockid_t,
}

impl CpuClock {
    /// The clock of the thread behind `handle`, `None` where the platform cannot say.
    pub fn of<T>(handle: &JoinHandle<T>) -> Option<CpuClock> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::thread::JoinHandleExt;
            let mut id: libc::clockid_t = 0;
            // SAFETY: `as_pthread_t` names a thread that is alive or not yet joined (the handle
            // is borrowed, so it cannot be joined meanwhile), which is what
            // `pthread_getcpuclockid` requires; `id` is a valid place for it to write.
            let rc = unsafe { libc::pthread_getcpuclockid(handle.as_pthread_t(), &mut id) };
            (rc == 0).then_some(CpuClock { id })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = handle;
            None
        }
    }

    /// CPU time the thread has run so far, `None` if the clock cannot be read (the thread has
    /// ended and been joined, say).
    pub fn now(&self) -> Option<Duration> {
        #[cfg(target_os = "linux")]
        {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid, writable `timespec`; an id of a thread that has gone
            // makes the call fail with an error code, never touch other memory.
            let rc = unsafe { libc::clock_gettime(self.id, &mut ts) };
            (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    /// A thread that computes accumulates CPU time about as fast as the wall clock runs; one
    /// that sleeps does not.
    #[test]
    fn a_busy_thread_runs_its_clock_and_a_sleeping_one_does_not() {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_busy = Arc::clone(&stop);
        let busy = std::thread::spawn(move || {
            let mut x = 0u64;
            while !stop_busy.load(Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            x
        });
        let stop_sleep = Arc::clone(&stop);
        let sleeper = std::thread::spawn(move || {
            while !stop_sleep.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let (b, s) = (
            CpuClock::of(&busy).unwrap(),
            CpuClock::of(&sleeper).unwrap(),
        );
        let (b0, s0, t0) = (b.now().unwrap(), s.now().unwrap(), Instant::now());
        std::thread::sleep(Duration::from_millis(200));
        let (b1, s1, wall) = (b.now().unwrap(), s.now().unwrap(), t0.elapsed());
        stop.store(true, Ordering::Relaxed);
        busy.join().unwrap();
        sleeper.join().unwrap();
        // The busy thread shares at most the machine's cores with this test's other threads:
        // it runs at least a fifth of the time even on a loaded machine.
        assert!(b1 - b0 >= wall / 5, "busy: {:?} of {wall:?}", b1 - b0);
        assert!(s1 - s0 < wall / 10, "sleeping: {:?} of {wall:?}", s1 - s0);
    }
}
