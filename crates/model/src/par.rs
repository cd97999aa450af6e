//! Disjoint mutable access to one output buffer from parallel tasks.
//!
//! Owns only [`DisjointRows`]: a view that lets task `i` of a thread-pool call write row `i` of a
//! buffer while other tasks write other rows. It never schedules work itself.

use std::marker::PhantomData;

/// A `[num_rows, row_len]` buffer whose rows may be written concurrently, one writer per row.
pub struct DisjointRows<'a> {
    ptr: *mut f32,
    num_rows: usize,
    row_len: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: the only access is `row_mut`, whose contract makes callers touch disjoint rows; the
// underlying `&mut [f32]` borrow is held for 'a, so no other access exists meanwhile.
unsafe impl Send for DisjointRows<'_> {}
// SAFETY: as above — shared references only hand out disjoint rows under `row_mut`'s contract.
unsafe impl Sync for DisjointRows<'_> {}

impl<'a> DisjointRows<'a> {
    pub fn new(buf: &'a mut [f32], row_len: usize) -> Self {
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
    pub unsafe fn row(&self, row: usize) -> &[f32] {
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
    pub unsafe fn row_mut(&self, row: usize) -> &mut [f32] {
        assert!(row < self.num_rows, "row {row} out of {}", self.num_rows);
        // SAFETY: `row < num_rows`, so the range lies inside the borrowed buffer; exclusivity of
        // the row is the caller's obligation (documented above).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(row * self.row_len), self.row_len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
