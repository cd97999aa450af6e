//! [`OutPtr`]: the output matrix of a matmul shared by its parallel tasks, each writing only its
//! own rows. Owns that one `unsafe` sharing rule; it never decides which task writes what.

use std::ops::Range;

/// The output matrix shared by all tasks; each task writes only its own rows.
pub(super) struct OutPtr {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: `OutPtr` is only created from a `&mut [f32]` that outlives the `for_each` using it, and
// tasks write disjoint row ranges (each element by exactly one task), so sharing is race-free.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Tasks' shared view of `out` (which must outlive every task using the view).
    pub(super) fn new(out: &mut [f32]) -> OutPtr {
        OutPtr {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        }
    }

    #[inline(always)]
    pub(super) fn write(&self, index: usize, value: f32) {
        assert!(index < self.len, "output index in range");
        // SAFETY: in bounds (checked above); no other task writes this index (see `Sync` impl).
        unsafe { self.ptr.add(index).write(value) };
    }

    /// Elements `range` as a slice, for a task that writes all of them.
    ///
    /// # Safety
    /// No other task reads or writes any element of `range` while the slice lives (tasks own
    /// disjoint ranges, see the `Sync` impl).
    #[inline(always)]
    #[allow(clippy::mut_from_ref)] // disjoint ranges per task, the caller's contract above
    pub(super) unsafe fn slice_mut(&self, range: Range<usize>) -> &mut [f32] {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "output range in bounds"
        );
        // SAFETY: in bounds (checked above); exclusive for its lifetime (the caller's contract);
        // `ptr` comes from a `&mut [f32]` that outlives every task.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }
}
