//! Large zeroed buffers backed by transparent huge pages where the OS allows it.
//!
//! Owns one decision: a K/V buffer of many MiB asks Linux for 2 MiB pages (`madvise(
//! MADV_HUGEPAGE)`, which takes effect under the common `transparent_hugepage=madvise` setting)
//! before its pages are first touched. Attention reads a sequence's K/V in runs of a few KiB
//! spread over the whole pool (paged blocks), so with 4 KiB pages nearly every run costs a TLB
//! miss; with 2 MiB pages the whole pool fits the TLB. Contents and results never change; on
//! other systems, or when the kernel refuses, the buffer simply keeps 4 KiB pages. It never
//! frees or moves memory itself (the buffer is an ordinary `Vec`).

/// Buffers at least this large ask for huge pages.
pub const HUGE_MIN_BYTES: usize = 4 << 20;

const HUGE_PAGE: usize = 2 << 20;

/// `n` copies of `zero` in a `Vec` whose allocation asked for huge pages when it is at least
/// [`HUGE_MIN_BYTES`] long (the advice is given before the elements are written, so the first
/// touch of each 2 MiB range can map a huge page). Every element is written here; for primitive
/// zeros prefer `vec![0; n]` and [`advise_huge_pages`] (pages stay untouched until used).
pub fn zeroed_vec<T: Copy>(n: usize, zero: T) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(n);
    let bytes = n * std::mem::size_of::<T>();
    if bytes >= HUGE_MIN_BYTES {
        advise_huge(v.as_mut_ptr().cast(), bytes);
    }
    v.resize(n, zero);
    v
}

/// Asks for huge pages under `buf` if it is at least [`HUGE_MIN_BYTES`] long. Only pages not
/// touched yet are affected (as those of a freshly allocated `vec![0; n]`, which the allocator
/// maps lazily).
pub fn advise_huge_pages<T>(buf: &mut [T]) {
    let bytes = std::mem::size_of_val(buf);
    if bytes >= HUGE_MIN_BYTES {
        advise_huge(buf.as_mut_ptr().cast(), bytes);
    }
}

/// Advises huge pages for the whole 2 MiB-aligned ranges inside `[ptr, ptr + bytes)`.
#[cfg(target_os = "linux")]
fn advise_huge(ptr: *mut u8, bytes: usize) {
    if std::env::var_os("AGENTKV_NO_HUGEPAGES").is_some() {
        return;
    }
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize + bytes) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: `[start, end)` lies inside the allocation of `bytes` bytes at `ptr`, which the
        // caller owns; MADV_HUGEPAGE changes only how the kernel backs those (not yet touched)
        // pages, never their contents or accessibility. A failure leaves 4 KiB pages.
        let rc =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        let _ = rc;
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_ptr: *mut u8, _bytes: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_vec_is_zeroed_at_every_size() {
        for n in [
            0usize,
            1,
            1000,
            HUGE_MIN_BYTES / 2 + 3,
            3 * HUGE_MIN_BYTES / 2,
        ] {
            let v = zeroed_vec(n, 0u16);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&x| x == 0));
        }
        let v = zeroed_vec(HUGE_MIN_BYTES, 7u8);
        assert!(v.iter().all(|&x| x == 7));
        let mut w = vec![0f32; HUGE_MIN_BYTES];
        advise_huge_pages(&mut w);
        w[HUGE_MIN_BYTES - 1] = 1.0;
        assert_eq!(w.iter().sum::<f32>(), 1.0);
    }
}
