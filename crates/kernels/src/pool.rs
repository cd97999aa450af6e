//! A persistent thread pool for data-parallel kernel loops.
//!
//! Owns `num_threads - 1` worker threads; the calling thread is the remaining one and always
//! takes part. [`ThreadPool::for_each`] publishes one job (a borrowed closure and a task count),
//! every participant claims task indices from one shared ticket until none are left, and the call
//! returns once every task has finished. Dispatch allocates nothing (only the stall watch below,
//! once a wait already looks long, keeps a small list); idle workers spin for a short while
//! (kernel calls come in quick succession during a forward pass), then park on a condvar.
//!
//! Which thread runs which task is not deterministic, so callers must make each task's result
//! independent of the executing thread (the matmul does: tasks are disjoint row ranges).
//!
//! Panics: a panic inside a task never deadlocks. Every task still gets claimed and counted, the
//! call waits for all of them, then re-raises the panic on the calling thread (the caller's own
//! panic payload if it had one, otherwise a generic message). The pool stays usable afterwards.
//! Re-entrant or concurrent calls on the same pool (a task calling `for_each`, two threads sharing
//! a pool) do not deadlock either: a call that finds the pool busy runs its tasks inline.
//! It never spawns threads after construction.
//!
//! Oversubscription: on a machine shared with other busy processes, a worker can lose its core
//! while it holds a claimed task, and the caller then waits a whole scheduler time slice
//! (milliseconds) for a microsecond task. When a call waits for workers longer than
//! `STALL_THRESHOLD` plus twice the caller's own average task duration, the caller starts
//! watching the CPU clocks of the workers still running a task ([`super::thread_cpu`]); a
//! worker whose clock advanced less than half the wall time until it finished lost its core. A
//! long task is not a stall: a step that mixes many short tasks (decodes) with a few long ones
//! (a prefill tile) makes the caller wait for a worker that is computing, and running the next
//! calls inline for that would halve the pool for nothing. Where no CPU clock can be read, the
//! wait alone decides, as before. After a stall, the pool runs the calls of a backoff period
//! inline on the caller, then tries the workers again. The period starts at
//! `STALL_BACKOFF_MIN` and doubles with every stall that follows the previous one within
//! `STALL_STREAK` (a worker that keeps losing its core), up to `STALL_BACKOFF`; an isolated stall
//! (a hypervisor hiccup on an otherwise idle machine) so costs about a millisecond of
//! single-threaded work instead of a tenth of a second. This only changes which thread runs a
//! task, never a result.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::thread_cpu::CpuClock;

/// How long an idle worker spins before parking.
const SPIN_BEFORE_PARK: Duration = Duration::from_micros(300);
/// A caller that waits this long (plus twice its own average task duration) for workers to
/// finish their claimed tasks concludes that a worker was preempted (decode tasks take
/// microseconds; a lost time slice takes milliseconds).
const STALL_THRESHOLD: Duration = Duration::from_micros(100);
/// After an isolated stall, calls run on the caller alone for this long, then try the workers
/// again.
const STALL_BACKOFF_MIN: Duration = Duration::from_millis(1);
/// The longest backoff (reached after repeated stalls).
const STALL_BACKOFF: Duration = Duration::from_millis(100);
/// A stall within this long of the previous one doubles the backoff.
const STALL_STREAK: Duration = Duration::from_millis(200);
/// Largest task count one published job may carry (the ticket keeps the index in 32 bits).
const MAX_TASKS_PER_JOB: usize = 1 << 31;
/// Ticket index meaning "generation announced, job fields being written: do not claim yet".
const CLOSED: u64 = 0xFFFF_FFFF;

type TaskFn<'a> = &'a (dyn Fn(usize) + Sync);

/// State shared between the caller and the workers.
struct Shared {
    /// `generation << 32 | next_task_index`. Claiming a task is a CAS on this word, so a claim
    /// can only succeed for the generation whose job is currently published.
    ticket: AtomicU64,
    /// Task count of the published generation (written before the ticket is published).
    num_tasks: AtomicUsize,
    /// Points at a `TaskFn` living on the dispatching caller's stack for the current generation.
    job: AtomicPtr<()>,
    /// Tasks of the current generation that have finished (successfully or by panicking).
    completed: AtomicUsize,
    /// A task of the current generation panicked on a worker.
    worker_panicked: AtomicBool,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    park_lock: Mutex<()>,
    wake: Condvar,
    /// Per worker: whether it is running a claimed task (the stall check watches only those).
    in_task: Box<[InTask]>,
}

/// One worker's "running a task" flag, on its own cache line (workers write it per task).
#[repr(align(64))]
#[derive(Default)]
struct InTask(AtomicBool);

/// A fixed set of threads (the caller included) that runs `Fn(task_index)` loops.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    num_threads: usize,
    /// Set while a `for_each` owns the published job slot.
    busy: AtomicBool,
    /// Generation counter, only touched by the dispatching caller while `busy`.
    generation: UnsafeCell<u32>,
    /// Oversubscription fallback: while `Instant::now() < epoch + inline_until_ns`, calls run
    /// inline on the caller (see [`ThreadPool::for_each`]).
    epoch: Instant,
    inline_until_ns: AtomicU64,
    /// When the last stall was detected (ns since `epoch`, 0: never) and the backoff it started;
    /// only touched by the `busy` holder.
    last_stall_ns: AtomicU64,
    backoff_ns: AtomicU64,
    stall_threshold: Duration,
    stall_backoff_min: Duration,
    stall_backoff: Duration,
    /// Per worker (same order as `workers`): its CPU-time clock, where the platform has one.
    cpu_clocks: Vec<Option<CpuClock>>,
}

// SAFETY: `generation` is only read/written by the thread that won the `busy` flag (an acquire
// compare-exchange paired with a release store), so accesses never race; all other fields are
// `Sync` already.
unsafe impl Sync for ThreadPool {}

impl ThreadPool {
    /// A pool of `num_threads` threads in total, the calling thread included (`0` is treated as
    /// `1`: everything runs on the caller). Spawns `num_threads - 1` workers.
    pub fn new(num_threads: usize) -> ThreadPool {
        let num_threads = num_threads.max(1);
        let shared = Arc::new(Shared {
            ticket: AtomicU64::new(0),
            num_tasks: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            completed: AtomicUsize::new(0),
            worker_panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            park_lock: Mutex::new(()),
            wake: Condvar::new(),
            in_task: (1..num_threads).map(|_| InTask::default()).collect(),
        });
        let workers: Vec<JoinHandle<()>> = (1..num_threads)
            .map(|i| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("agentkv-kernel-{i}"))
                    .spawn(move || worker_loop(&shared, i - 1))
                    .expect("spawning a kernel worker thread failed (out of OS resources)")
            })
            .collect();
        let cpu_clocks = workers.iter().map(CpuClock::of).collect();
        ThreadPool {
            shared,
            workers,
            num_threads,
            busy: AtomicBool::new(false),
            generation: UnsafeCell::new(0),
            epoch: Instant::now(),
            inline_until_ns: AtomicU64::new(0),
            last_stall_ns: AtomicU64::new(0),
            backoff_ns: AtomicU64::new(0),
            stall_threshold: STALL_THRESHOLD,
            stall_backoff_min: STALL_BACKOFF_MIN,
            stall_backoff: STALL_BACKOFF,
            cpu_clocks,
        }
    }

    /// Threads that run tasks, the caller included.
    pub fn num_threads(&self) -> usize {
        self.num_threads
    }

    /// Whether calls currently run inline because a recent call stalled on a preempted worker.
    pub fn backing_off(&self) -> bool {
        let until = self.inline_until_ns.load(Ordering::Relaxed);
        until != 0 && (self.epoch.elapsed().as_nanos() as u64) < until
    }

    /// Runs `f(i)` for every `i` in `0..num_tasks`, spread over the pool, and returns when all
    /// calls have finished. Re-raises a task panic after all tasks are done (see module doc).
    pub fn for_each(&self, num_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if num_tasks == 0 {
            return;
        }
        if self.workers.is_empty() || num_tasks == 1 || self.backing_off() {
            (0..num_tasks).for_each(f);
            return;
        }
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            // Nested or concurrent use: run inline rather than wait for ourselves.
            (0..num_tasks).for_each(f);
            return;
        }
        let mut start = 0;
        while start < num_tasks {
            let count = (num_tasks - start).min(MAX_TASKS_PER_JOB);
            let offset_f = |i: usize| f(start + i);
            self.run_job(count, &offset_f);
            start += count;
        }
        self.busy.store(false, Ordering::Release);
    }

    /// A stall was detected: run calls inline for the next backoff period (see module doc).
    fn start_backoff(&self) {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let last = self.last_stall_ns.load(Ordering::Relaxed);
        let (min, max) = (
            self.stall_backoff_min.as_nanos() as u64,
            self.stall_backoff.as_nanos() as u64,
        );
        let backoff = if last != 0 && now - last < STALL_STREAK.as_nanos() as u64 {
            self.backoff_ns
                .load(Ordering::Relaxed)
                .saturating_mul(2)
                .clamp(min, max.max(min))
        } else {
            min
        };
        self.backoff_ns.store(backoff, Ordering::Relaxed);
        self.last_stall_ns.store(now.max(1), Ordering::Relaxed);
        self.inline_until_ns
            .store(now.saturating_add(backoff), Ordering::Relaxed);
    }

    /// Waits until the workers finished every claimed task of the current job (the caller ran
    /// `own_tasks` of them since `own_start`), and starts a backoff if one of them lost its core
    /// meanwhile (see the module doc).
    fn wait_for_workers(&self, num_tasks: usize, own_start: Instant, own_tasks: u32) {
        let s = &*self.shared;
        let start = Instant::now();
        // A running worker finishes within about one task duration of the caller running out
        // of tasks; a wait much longer than that is suspect.
        let suspect_after = self.stall_threshold + 2 * ((start - own_start) / own_tasks.max(1));
        let mut watch = StallWatch::default();
        let mut spins = 0u32;
        while s.completed.load(Ordering::Acquire) < num_tasks {
            spins += 1;
            if spins < 1 << 14 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            if spins.is_multiple_of(64) {
                if !watch.started && start.elapsed() >= suspect_after {
                    watch.start(&s.in_task, &self.cpu_clocks);
                }
                watch.poll(&s.in_task, self.stall_threshold);
            }
        }
        if !watch.started {
            return;
        }
        watch.finish(self.stall_threshold);
        if watch.stalled {
            self.start_backoff();
        }
    }

    /// Publishes one generation and participates until all `num_tasks` tasks completed.
    fn run_job(&self, num_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        // SAFETY: only the holder of `busy` touches `generation` (see the `Sync` impl).
        let generation = unsafe {
            let g = &mut *self.generation.get();
            *g = g.wrapping_add(1);
            *g
        };
        let task_fn: TaskFn<'_> = f;
        // Close the ticket under the new generation first: a worker that later reads any of the
        // fields written below then cannot win a claim on an older generation (see `claim`).
        s.ticket
            .store(u64::from(generation) << 32 | CLOSED, Ordering::SeqCst);
        s.completed.store(0, Ordering::Relaxed);
        s.worker_panicked.store(false, Ordering::Relaxed);
        s.num_tasks.store(num_tasks, Ordering::Release);
        s.job
            .store(&task_fn as *const TaskFn<'_> as *mut (), Ordering::Release);
        // Release: workers that observe the new ticket also observe the job fields above.
        s.ticket
            .store(u64::from(generation) << 32, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = s.park_lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }

        let own_start = Instant::now();
        let mut own_tasks = 0u32;
        let own = catch_unwind(AssertUnwindSafe(|| {
            while let Some(i) = claim(s, generation, num_tasks) {
                f(i);
                s.completed.fetch_add(1, Ordering::Release);
                own_tasks += 1;
            }
        }));
        if own.is_err() {
            // The panicking task was claimed but not counted; count it and drain the rest so
            // workers can never be left holding a claim on a job whose closure is gone.
            s.completed.fetch_add(1, Ordering::Release);
            while claim(s, generation, num_tasks).is_some() {
                s.completed.fetch_add(1, Ordering::Release);
            }
        }
        if s.completed.load(Ordering::Acquire) < num_tasks {
            self.wait_for_workers(num_tasks, own_start, own_tasks);
        }
        // Every task is claimed and finished: no worker can run `f` again (claims for this
        // generation fail), so `task_fn` may go out of scope.
        if let Err(payload) = own {
            self.busy.store(false, Ordering::Release);
            resume_unwind(payload);
        }
        if s.worker_panicked.load(Ordering::Acquire) {
            self.busy.store(false, Ordering::Release);
            panic!("a ThreadPool task panicked on a worker thread");
        }
    }
}

/// Claims the next task index of `generation`, `None` when its tasks are exhausted or a newer
/// generation is published.
fn claim(s: &Shared, generation: u32, num_tasks: usize) -> Option<usize> {
    let mut cur = s.ticket.load(Ordering::Acquire);
    loop {
        if (cur >> 32) as u32 != generation {
            return None;
        }
        let index = (cur & 0xFFFF_FFFF) as usize;
        if index >= num_tasks {
            return None;
        }
        match s
            .ticket
            .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Some(index),
            Err(now) => cur = now,
        }
    }
}

fn worker_loop(s: &Shared, me: usize) {
    let mut seen_generation = 0u32;
    loop {
        // Wait for a generation we have not worked on yet.
        let generation = match wait_for_new_generation(s, seen_generation) {
            Some(g) => g,
            None => return,
        };
        seen_generation = generation;
        // Acquire on the ticket (inside `wait_for_new_generation`) made these visible. If a newer
        // generation has replaced them already, our claims fail and we never call the job.
        let num_tasks = s.num_tasks.load(Ordering::Acquire);
        let job = s.job.load(Ordering::Acquire) as *const TaskFn<'_>;
        while let Some(i) = claim(s, generation, num_tasks) {
            // SAFETY: a successful claim of `generation` means the caller that published it is
            // still inside `run_job`, waiting for this task to be counted, so the `TaskFn` it
            // points at is alive. `num_tasks` and `job` belong to `generation`: we read them after
            // acquiring its open ticket, so they are that generation's values or newer; newer
            // values are only written after the ticket moved to a newer (closed) generation, which
            // then happens-before our claim's CAS and makes it fail.
            let f: TaskFn<'_> = unsafe { *job };
            s.in_task[me].0.store(true, Ordering::Relaxed);
            if catch_unwind(AssertUnwindSafe(|| f(i))).is_err() {
                s.worker_panicked.store(true, Ordering::Release);
            }
            s.in_task[me].0.store(false, Ordering::Relaxed);
            s.completed.fetch_add(1, Ordering::Release);
        }
    }
}

/// Spins, then parks, until the ticket carries a generation other than `seen`. `None` on shutdown.
fn wait_for_new_generation(s: &Shared, seen: u32) -> Option<u32> {
    // A generation is ready once its ticket is open (index != CLOSED).
    let ready = |t: u64| -> Option<u32> {
        let g = (t >> 32) as u32;
        (g != seen && t & 0xFFFF_FFFF != CLOSED).then_some(g)
    };
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if s.shutdown.load(Ordering::Acquire) {
            return None;
        }
        if let Some(g) = ready(s.ticket.load(Ordering::Acquire)) {
            return Some(g);
        }
        spins = spins.wrapping_add(1);
        std::hint::spin_loop();
        if spins.is_multiple_of(64) {
            if start.elapsed() > SPIN_BEFORE_PARK {
                break;
            }
            // Give the core away if anything else wants it (on an oversubscribed machine that
            // may be our own caller); returns at once on an idle one.
            std::thread::yield_now();
        }
    }
    let mut guard = s.park_lock.lock().unwrap_or_else(|e| e.into_inner());
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    loop {
        if s.shutdown.load(Ordering::SeqCst) {
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        if let Some(g) = ready(s.ticket.load(Ordering::SeqCst)) {
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            return Some(g);
        }
        guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
    }
}

/// The caller's watch over the workers it waits for, once the wait looks long: per worker that
/// was running a task then, its CPU clock and the time at the start of the watch, until that
/// worker finished its task.
#[derive(Default)]
struct StallWatch {
    started: bool,
    /// (worker, its clock, CPU time and wall time at the start), for workers not yet finished.
    open: Vec<(usize, Option<CpuClock>, Option<Duration>, Instant)>,
    stalled: bool,
}

impl StallWatch {
    fn start(&mut self, in_task: &[InTask], clocks: &[Option<CpuClock>]) {
        self.started = true;
        for (w, flag) in in_task.iter().enumerate() {
            if flag.0.load(Ordering::Relaxed) {
                let clock = clocks.get(w).copied().flatten();
                let cpu = clock.and_then(|c| c.now());
                self.open.push((w, clock, cpu, Instant::now()));
            }
        }
        if self.open.is_empty() {
            // Every worker finished its task while the counter had not caught up yet: nothing
            // to watch, and nothing lost a core long enough to matter.
            self.started = false;
        }
    }

    /// Closes the watch of every worker that finished its task.
    fn poll(&mut self, in_task: &[InTask], threshold: Duration) {
        let mut i = 0;
        while i < self.open.len() {
            if in_task[self.open[i].0].0.load(Ordering::Relaxed) {
                i += 1;
            } else {
                let entry = self.open.swap_remove(i);
                self.close(entry, threshold);
            }
        }
    }

    /// Closes what is still open (the job is complete).
    fn finish(&mut self, threshold: Duration) {
        for entry in std::mem::take(&mut self.open) {
            self.close(entry, threshold);
        }
    }

    /// A worker lost its core if, over a watch longer than `threshold`, its CPU clock advanced
    /// less than half the wall time; without a readable clock, the long wait alone says so.
    fn close(
        &mut self,
        (_, clock, cpu0, wall0): (usize, Option<CpuClock>, Option<Duration>, Instant),
        threshold: Duration,
    ) {
        let wall = wall0.elapsed();
        let cpu = match (clock.and_then(|c| c.now()), cpu0) {
            (Some(c1), Some(c0)) => Some(c1.saturating_sub(c0)),
            _ => None,
        };
        self.stalled |= match cpu {
            Some(cpu) => wall >= threshold && cpu < wall / 2,
            None => true,
        };
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _guard = self
                .shared
                .park_lock
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            // A worker only ends by returning (task panics are caught), so join cannot fail
            // except on a bug; ignore it rather than panic in drop.
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_exactly_once() {
        for threads in 1..=4 {
            let pool = ThreadPool::new(threads);
            assert_eq!(pool.num_threads(), threads);
            for num_tasks in [0usize, 1, 2, 3, 7, 64, 1000] {
                let hits: Vec<AtomicU32> = (0..num_tasks).map(|_| AtomicU32::new(0)).collect();
                pool.for_each(num_tasks, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn many_tiny_calls_complete() {
        let pool = ThreadPool::new(3);
        let total = AtomicUsize::new(0);
        for call in 0..20_000usize {
            pool.for_each(1 + call % 5, &|i| {
                total.fetch_add(i + 1, Ordering::Relaxed);
            });
        }
        let expected: usize = (0..20_000usize)
            .map(|c| (1..=1 + c % 5).sum::<usize>())
            .sum();
        assert_eq!(total.load(Ordering::Relaxed), expected);
    }

    #[test]
    fn works_after_workers_parked() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        for _ in 0..3 {
            std::thread::sleep(SPIN_BEFORE_PARK * 4);
            pool.for_each(16, &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 48);
    }

    #[test]
    fn task_panic_is_reraised_without_deadlock_and_pool_survives() {
        let pool = ThreadPool::new(2);
        for victim in [0usize, 5, 31] {
            let ran = AtomicUsize::new(0);
            let r = catch_unwind(AssertUnwindSafe(|| {
                pool.for_each(32, &|i| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    if i == victim {
                        panic!("boom {i}");
                    }
                });
            }));
            assert!(r.is_err());
            // All tasks are accounted for (claimed), even if some were skipped after a caller panic.
            assert!(ran.load(Ordering::Relaxed) >= 1);
        }
        let total = AtomicUsize::new(0);
        pool.for_each(10, &|_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(total.load(Ordering::Relaxed), 10);
    }

    /// Two threads; a wait past 2 ms looks long, and a stall backs off for an hour (the tests
    /// end a backoff themselves).
    fn stall_test_pool() -> ThreadPool {
        let mut pool = ThreadPool::new(2);
        pool.stall_threshold = Duration::from_millis(2);
        pool.stall_backoff_min = Duration::from_secs(3600);
        pool.stall_backoff = Duration::from_secs(3600);
        pool
    }

    #[test]
    fn a_stalled_worker_makes_later_calls_run_inline_until_the_backoff_ends() {
        let pool = stall_test_pool();
        let caller = std::thread::current().id();
        // Task bodies sleep; whichever task the worker claims outlasts the threshold. The worker
        // may not get a core in time on a loaded machine, so retry until it claimed one.
        let mut stalled = false;
        for _ in 0..200 {
            pool.for_each(2, &|_| {
                if std::thread::current().id() == caller {
                    std::thread::sleep(Duration::from_millis(1));
                } else {
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
            if pool.backing_off() {
                stalled = true;
                break;
            }
        }
        assert!(stalled, "the worker never claimed a task in 200 calls");
        let ran: Vec<AtomicU32> = (0..64).map(|_| AtomicU32::new(0)).collect();
        let off_caller = AtomicUsize::new(0);
        pool.for_each(64, &|i| {
            ran[i].fetch_add(1, Ordering::Relaxed);
            if std::thread::current().id() != caller {
                off_caller.fetch_add(1, Ordering::Relaxed);
            }
        });
        assert!(ran.iter().all(|r| r.load(Ordering::Relaxed) == 1));
        assert_eq!(
            off_caller.load(Ordering::Relaxed),
            0,
            "backing off runs inline"
        );
        // Once the backoff is over, workers take part again.
        pool.inline_until_ns.store(0, Ordering::Relaxed);
        assert!(!pool.backing_off());
    }

    /// A worker computing a long task while the caller ran short ones is not a stall: its CPU
    /// clock runs, so later calls keep the workers (the wall-clock rule alone backed off here,
    /// and made mixed decode-and-prefill steps run on one thread).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_worker_computing_a_long_task_is_no_stall() {
        let pool = stall_test_pool();
        let caller = std::thread::current().id();
        // On a loaded machine the worker may also really lose its core during the long task,
        // or claim no task at all; one clean call in 50 is what this needs.
        let mut clean = 0;
        for _ in 0..50 {
            pool.inline_until_ns.store(0, Ordering::Relaxed);
            pool.last_stall_ns.store(0, Ordering::Relaxed);
            let worker_long = AtomicBool::new(false);
            let spin = |d: Duration| {
                let t0 = Instant::now();
                let mut x = 0u64;
                while t0.elapsed() < d {
                    for _ in 0..100 {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                }
            };
            // The caller's tasks take 50 µs, long enough for a parked worker to wake and claim.
            pool.for_each(64, &|_| {
                if std::thread::current().id() != caller
                    && !worker_long.swap(true, Ordering::Relaxed)
                {
                    spin(Duration::from_millis(30));
                } else {
                    spin(Duration::from_micros(50));
                }
            });
            if worker_long.load(Ordering::Relaxed) && !pool.backing_off() {
                clean += 1;
                break;
            }
        }
        assert_eq!(
            clean, 1,
            "every long task on the worker was taken for a stall"
        );
    }

    #[test]
    fn repeated_stalls_double_the_backoff_up_to_the_maximum_and_isolated_ones_stay_short() {
        let mut pool = ThreadPool::new(2);
        pool.stall_backoff_min = Duration::from_millis(1);
        pool.stall_backoff = Duration::from_millis(8);
        let backoff = |p: &ThreadPool| Duration::from_nanos(p.backoff_ns.load(Ordering::Relaxed));
        pool.start_backoff();
        assert_eq!(
            backoff(&pool),
            Duration::from_millis(1),
            "a first stall backs off briefly"
        );
        assert!(pool.backing_off());
        for want in [2, 4, 8, 8] {
            pool.start_backoff();
            assert_eq!(
                backoff(&pool),
                Duration::from_millis(want),
                "stalls in a row double it"
            );
        }
        // A stall long after the previous one starts over at the minimum.
        pool.last_stall_ns.store(1, Ordering::Relaxed);
        std::thread::sleep(STALL_STREAK + Duration::from_millis(5));
        pool.start_backoff();
        assert_eq!(backoff(&pool), Duration::from_millis(1));
        // Whatever the backoff, every task still runs exactly once.
        let ran: Vec<AtomicU32> = (0..16).map(|_| AtomicU32::new(0)).collect();
        pool.for_each(16, &|i| {
            ran[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(ran.iter().all(|r| r.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn nested_calls_run_inline() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        pool.for_each(4, &|_| {
            pool.for_each(3, &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 12);
    }
}
