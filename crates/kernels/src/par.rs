//! Disjoint mutable access to one output buffer from parallel tasks.
//!
//! Owns [`DisjointRows`]: a view that lets task `i` of a thread-pool call write row `i` of a
//! buffer while other tasks write other rows, and [`try_spread`], fallible per-item work cut
//! into runs over a pool. It never decides what runs where beyond that cut.

use std::marker::PhantomData;
use std::sync::Mutex;

use crate::ThreadPool;

/// Runs `f(i)` for every `i` in `0..n` over `pool`, in runs of consecutive items (at least
/// `min_run`, about four per thread), and returns the error of the lowest failing item, if any
/// (every item runs either way).
pub fn try_spread<E: Send>(
    pool: &ThreadPool,
    n: usize,
    min_run: usize,
    f: &(dyn Fn(usize) -> Result<(), E> + Sync),
) -> Result<(), E> {
    let run = n.div_ceil(4 * pool.num_threads()).max(min_run.max(1));
    let first_error: Mutex<Option<(usize, E)>> = Mutex::new(None);
    pool.for_each(n.div_ceil(run), &|task| {
        for i in task * run..((task + 1) * run).min(n) {
            if let Err(e) = f(i) {
                let mut slot = first_error.lock().unwrap_or_else(|p| p.into_inner());
                if slot.as_ref().is_none_or(|(j, _)| i < *j) {
                    *slot = Some((i, e));
                }
            }
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

/// A `[num_rows, row_len]` buffer whose rows may be written concurrently, one writer per row
/// (f32 activations by default; K/V bytes for encoders).
pub struct DisjointRows<'a, T = f32> {
    ptr: *mut T,
    num_rows: usize,
    row_len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: the only access is `row_mut`, whose contract makes callers touch disjoint rows; the
// underlying `&mut [T]` borrow is held for 'a, so no other access exists meanwhile.
unsafe impl<T: Send> Send for DisjointRows<'_, T> {}
// SAFETY: as above — shared references only hand out disjoint rows under `row_mut`'s contract
// (`T: Send`: a row written from one thread may be read from another afterwards).
unsafe impl<T: Send> Sync for DisjointRows<'_, T> {}

impl<'a, T> DisjointRows<'a, T> {
    pub fn new(buf: &'a mut [T], row_len: usize) -> Self {
        assert!(
            row_len > 0 && buf.len().is_multiple_of(row_len),
            "buffer is not whole rows"
        );
        DisjointRows {
            ptr: buf.as_mut_ptr(),
            num_rows: buf.len() / row_len,
            row_len,
            _borrow: PhantomData,
        }
    }

    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    /// Shared access to row `row`.
    ///
    /// # Safety
    /// No live reference from [`DisjointRows::row_mut`] may refer to the same row meanwhile.
    pub unsafe fn row(&self, row: usize) -> &[T] {
        assert!(row < self.num_rows, "row {row} out of {}", self.num_rows);
        // SAFETY: in bounds as in `row_mut`; no writer of this row exists (caller's contract).
        unsafe { std::slice::from_raw_parts(self.ptr.add(row * self.row_len), self.row_len) }
    }

    /// Mutable access to row `row`.
    ///
    /// # Safety
    /// No two live references returned by this function may refer to the same row: each row
    /// has at most one writer at a time (e.g. one parallel task per row index).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn row_mut(&self, row: usize) -> &mut [T] {
        assert!(row < self.num_rows, "row {row} out of {}", self.num_rows);
        // SAFETY: `row < num_rows`, so the range lies inside the borrowed buffer; exclusivity of
        // the row is the caller's obligation (documented above).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(row * self.row_len), self.row_len) }
    }

    /// Mutable access to the consecutive rows `rows`, as one slice (`rows.len()` rows).
    ///
    /// # Safety
    /// As [`DisjointRows::row_mut`], for every row of the range: no other live reference from
    /// this function or `row_mut` may refer to any of them meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn rows_mut(&self, rows: std::ops::Range<usize>) -> &mut [T] {
        assert!(
            rows.start <= rows.end && rows.end <= self.num_rows,
            "rows {rows:?} out of {}",
            self.num_rows
        );
        // SAFETY: `start <= end <= num_rows`, so the range lies inside the borrowed buffer;
        // exclusivity of the rows is the caller's obligation (documented above).
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr.add(rows.start * self.row_len),
                rows.len() * self.row_len,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_work_runs_every_item_once_and_reports_the_first_error() {
        for threads in 1..=3 {
            let pool = ThreadPool::new(threads);
            for n in [0usize, 1, 7, 100] {
                let mut buf = vec![0u8; n * 2];
                {
                    let rows = DisjointRows::new(&mut buf, 2);
                    let r: Result<(), usize> = try_spread(&pool, n, 4, &|i| {
                        // SAFETY: item `i` writes only row `i`.
                        unsafe { rows.row_mut(i) }.iter_mut().for_each(|b| *b += 1);
                        if i % 30 == 29 {
                            Err(i)
                        } else {
                            Ok(())
                        }
                    });
                    assert_eq!(r, if n > 29 { Err(29) } else { Ok(()) });
                }
                assert!(buf.iter().all(|&b| b == 1), "{threads} threads, {n} items");
            }
        }
    }

    /// Ranges of rows written from threads, each its own range, land where their rows lie.
    #[test]
    fn row_ranges_written_from_threads_are_disjoint() {
        let mut buf = vec![0u32; 10 * 2];
        {
            let rows = DisjointRows::new(&mut buf, 2);
            std::thread::scope(|s| {
                for (i, range) in [0..3, 3..3, 3..7, 7..10].into_iter().enumerate() {
                    let rows = &rows;
                    s.spawn(move || {
                        // SAFETY: the threads' ranges do not overlap.
                        let part = unsafe { rows.rows_mut(range.clone()) };
                        assert_eq!(part.len(), 2 * range.len());
                        part.fill(i as u32 + 1);
                    });
                }
            });
        }
        assert_eq!(
            buf,
            [1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4]
        );
    }

    #[test]
    fn rows_written_from_threads_are_disjoint() {
        let mut buf = vec![0.0f32; 8 * 3];
        {
            let rows = DisjointRows::new(&mut buf, 3);
            std::thread::scope(|s| {
                for r in 0..8 {
                    let rows = &rows;
                    s.spawn(move || {
                        // SAFETY: each thread writes only its own row index `r`.
                        let row = unsafe { rows.row_mut(r) };
                        row.fill(r as f32);
                    });
                }
            });
        }
        for r in 0..8 {
            assert!(buf[r * 3..r * 3 + 3].iter().all(|&x| x == r as f32));
        }
    }

    #[test]
    #[should_panic(expected = "out of")]
    fn out_of_range_row_panics() {
        let mut buf = vec![0.0f32; 4];
        let rows = DisjointRows::new(&mut buf, 2);
        // SAFETY: single access; the call panics before creating a reference.
        let _ = unsafe { rows.row_mut(2) };
    }
}
