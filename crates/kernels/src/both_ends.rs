//! The work of a decode-step matmul claimed from both ends of its range of units (groups of
//! packed rows). With one token, each thread streams its share of the weights from memory, and
//! two equal static halves leave one thread waiting for the other whenever their streams run at
//! different speeds (measured on AMD Zen 3: 6% of a decoded token spent waiting). Here the
//! threads of a pair claim chunks from opposite ends until the ends meet: each first chunk is
//! most of a half (so a call costs a handful of claims and the front thread's stream never
//! restarts), later chunks a third of what is left. Which thread computes which unit never
//! changes a result (units are disjoint rows, each computed whole by one thread).
//!
//! Owns the claim protocol and the pairing of tasks to spans; it never runs a kernel and never
//! decides what a unit is.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use super::pool::ThreadPool;

/// A pair's first chunk from each end, as a fraction of its span: `FIRST_SHARE / 16`.
const FIRST_SHARE: usize = 7;

/// Which end of a span a task claims from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Front,
    Back,
}

/// Unclaimed units `front..back` of a span `start..end`, claimed from both ends.
pub(crate) struct BothEnds {
    /// `back << 32 | front`, offsets from `start`.
    ends: AtomicU64,
    start: usize,
    len: u32,
    first: u32,
}

impl BothEnds {
    /// The span `units`, nothing claimed yet. Panics past `u32::MAX` units.
    pub(crate) fn new(units: Range<usize>) -> BothEnds {
        let len = u32::try_from(units.len()).expect("a span holds at most u32::MAX units");
        let first = (units.len() * FIRST_SHARE / 16).max(1) as u32;
        BothEnds {
            ends: AtomicU64::new(u64::from(len) << 32),
            start: units.start,
            len,
            first,
        }
    }

    /// The next chunk from `end`, or `None` once the ends have met. Every unit of the span is
    /// returned exactly once over all calls, from either end.
    pub(crate) fn claim(&self, end: End) -> Option<Range<usize>> {
        let mut cur = self.ends.load(Ordering::Relaxed);
        loop {
            let (front, back) = (cur as u32, (cur >> 32) as u32);
            if front >= back {
                return None;
            }
            let left = back - front;
            let untouched = match end {
                End::Front => front == 0,
                End::Back => back == self.len,
            };
            let size = if untouched {
                self.first
            } else {
                (left / 3).max(1)
            }
            .min(left);
            let (next, got) = match end {
                End::Front => (
                    u64::from(back) << 32 | u64::from(front + size),
                    front..front + size,
                ),
                End::Back => (
                    u64::from(back - size) << 32 | u64::from(front),
                    back - size..back,
                ),
            };
            match self
                .ends
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Some(self.start + got.start as usize..self.start + got.end as usize)
                }
                Err(now) => cur = now,
            }
        }
    }
}

/// Runs `run` over chunks of `0..units` on every thread of `pool`: the units split into one span
/// per pair of threads, the pair's two tasks claiming that span from its two ends (an odd last
/// task claims its span alone). Returns when every unit ran exactly once.
pub(crate) fn for_each_chunk(pool: &ThreadPool, units: usize, run: &(dyn Fn(Range<usize>) + Sync)) {
    let threads = pool.num_threads();
    if threads == 1 || units < 2 {
        if units > 0 {
            run(0..units);
        }
        return;
    }
    let spans = threads.div_ceil(2);
    let bounds = |s: usize| s * units / spans;
    let claims: Vec<BothEnds> = (0..spans)
        .map(|s| BothEnds::new(bounds(s)..bounds(s + 1)))
        .collect();
    pool.for_each(threads, &|task| {
        let (span, end) = (
            &claims[task / 2],
            if task % 2 == 0 { End::Front } else { End::Back },
        );
        while let Some(chunk) = span.claim(end) {
            run(chunk);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::AtomicU32;

    /// Golden order: one span of 36 units (a 576-row matrix in groups of 16), the two ends
    /// claiming in turn.
    #[test]
    fn first_chunks_are_most_of_a_half_then_thirds_of_what_is_left() {
        let s = BothEnds::new(100..136);
        let mut got = Vec::new();
        for end in [End::Front, End::Back].into_iter().cycle().take(8) {
            got.push(s.claim(end));
        }
        assert_eq!(
            got,
            vec![
                Some(100..115),
                Some(121..136),
                Some(115..117),
                Some(120..121),
                Some(117..118),
                Some(119..120),
                Some(118..119),
                None
            ]
        );
    }

    /// Seeded random interleavings against a naive model: every unit exactly once, chunks
    /// contiguous from each end (the front ascending, the back descending).
    #[test]
    fn random_interleavings_claim_every_unit_once() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for _ in 0..500 {
            let (start, len) = (rng.gen_range(0..50), rng.gen_range(0..300));
            let s = BothEnds::new(start..start + len);
            let mut seen = vec![0u8; len];
            let (mut front, mut back) = (start, start + len);
            loop {
                let end = if rng.gen_bool(0.5) {
                    End::Front
                } else {
                    End::Back
                };
                let Some(r) = s.claim(end) else {
                    assert!(s.claim(End::Front).is_none() && s.claim(End::Back).is_none());
                    break;
                };
                assert!(!r.is_empty());
                match end {
                    End::Front => {
                        assert_eq!(r.start, front);
                        front = r.end;
                    }
                    End::Back => {
                        assert_eq!(r.end, back);
                        back = r.start;
                    }
                }
                r.for_each(|u| seen[u - start] += 1);
            }
            assert!(seen.iter().all(|&n| n == 1), "len {len}: {seen:?}");
        }
    }

    /// On real pools of 1–5 threads (pairs, an odd last task, one thread), every unit runs once.
    #[test]
    fn every_unit_runs_once_on_any_pool() {
        for threads in 1..=5 {
            let pool = ThreadPool::new(threads);
            for units in [0usize, 1, 2, 3, 17, 36, 3072] {
                let counts: Vec<AtomicU32> = (0..units).map(|_| AtomicU32::new(0)).collect();
                for_each_chunk(&pool, units, &|r| {
                    for u in r {
                        counts[u].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(
                    counts.iter().all(|c| c.load(Ordering::Relaxed) == 1),
                    "{threads} threads, {units} units"
                );
            }
        }
    }
}
