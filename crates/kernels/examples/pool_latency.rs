//! What one [`kernels::ThreadPool::for_each`] call costs beyond its tasks: calls of `TASKS`
//! (default 2) tasks that each spin for `WORK_NS` nanoseconds (default 0), back to back, on
//! `THREADS` (default 2) threads; prints nanoseconds per call against the work alone on one
//! thread. Measures only.
//!
//! `cargo run --release -p kernels --example pool_latency [CALLS]`

use std::time::Instant;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn spin_for(ns: u64) {
    let t = Instant::now();
    while (t.elapsed().as_nanos() as u64) < ns {
        std::hint::spin_loop();
    }
}

fn main() {
    let calls: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let (tasks, work_ns, threads) = (env("TASKS", 2), env("WORK_NS", 0), env("THREADS", 2));
    let pool = kernels::ThreadPool::new(threads as usize);
    for round in 0..3 {
        let t = Instant::now();
        for _ in 0..calls {
            pool.for_each(tasks as usize, &|_| spin_for(work_ns));
        }
        let per_call = t.elapsed().as_nanos() as f64 / calls as f64;
        let ideal = (tasks * work_ns) as f64 / threads as f64;
        println!(
            "round {round}: {threads} threads, {tasks} tasks of {work_ns} ns: {per_call:.0} ns a call \
             ({ideal:.0} ns of work per thread; overhead {:.0} ns)",
            per_call - ideal
        );
    }
}
