//! Large zeroed buffers backed by transparent huge pages where the OS allows it, and mapped
//! before their first use where the caller asks.
//!
//! Owns two decisions. First, a K/V buffer of many MiB asks Linux for 2 MiB pages (`madvise(
//! MADV_HUGEPAGE)`, which takes effect under the common `transparent_hugepage=madvise` setting)
//! before its pages are first touched. Attention reads a sequence's K/V in runs of a few KiB
//! spread over the whole pool (paged blocks), so with 4 KiB pages nearly every run costs a TLB
//! miss; with 2 MiB pages the whole pool fits the TLB. Contents and results never change; on
//! other systems, or when the kernel refuses, the buffer simply keeps 4 KiB pages. Second,
//! [`prefault_pages`] maps a buffer's pages at once (`madvise(MADV_POPULATE_WRITE)`, Linux 5.14
//! on): a fresh allocation is mapped lazily, so otherwise the first write to each page stops the
//! writer while the kernel (and, in a virtual machine, the hypervisor) finds and zeroes a page —
//! for the engine's K/V pool, in the middle of the first requests' steps (in a virtual machine
//! whose host has not backed that memory yet, a large part of a second per few hundred MB). It
//! never frees or moves memory itself (the buffer is an ordinary `Vec`).

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

/// Maps every page under `buf` now, writable, without changing a byte of it (the pages of a
/// fresh zeroed allocation stay zero): the cost of the first touch is paid here rather than by
/// the first writer. Returns whether the kernel did it; `false` (an older kernel, another
/// system, `AGENTKV_NO_PREFAULT` set, or a buffer under [`HUGE_MIN_BYTES`]) leaves the pages to
/// be mapped on first touch as before. Call it after [`advise_huge_pages`], so the pages mapped
/// are huge ones where the system allows.
pub fn prefault_pages<T>(buf: &mut [T]) -> bool {
    let bytes = std::mem::size_of_val(buf);
    bytes >= HUGE_MIN_BYTES
        && std::env::var_os("AGENTKV_NO_PREFAULT").is_none()
        && populate_write(buf.as_mut_ptr().cast(), bytes)
}

/// `madvise(MADV_POPULATE_WRITE)` over the whole pages inside `[ptr, ptr + bytes)`.
#[cfg(target_os = "linux")]
fn populate_write(ptr: *mut u8, bytes: usize) -> bool {
    const PAGE: usize = 4096;
    let start = (ptr as usize).next_multiple_of(PAGE);
    let end = (ptr as usize + bytes) / PAGE * PAGE;
    if end <= start {
        return false;
    }
    // SAFETY: `[start, end)` lies inside the allocation of `bytes` bytes at `ptr`, which the
    // caller holds mutably (no other access can race with it). MADV_POPULATE_WRITE only faults
    // those pages in as a write would, without writing: contents and accessibility are
    // unchanged. A failure (EINVAL before Linux 5.14, ENOMEM, …) changes nothing.
    let rc = unsafe {
        libc::madvise(
            start as *mut libc::c_void,
            end - start,
            libc::MADV_POPULATE_WRITE,
        )
    };
    rc == 0
}

#[cfg(not(target_os = "linux"))]
fn populate_write(_ptr: *mut u8, _bytes: usize) -> bool {
    false
}

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

    /// Prefaulting keeps every byte (zeroes of a fresh buffer, values already written) and
    /// refuses small buffers; on Linux 5.14+ it maps the pages (the resident size grows by at
    /// least the buffer's size, read from `/proc/self/statm` around the call).
    #[test]
    fn prefault_keeps_contents_and_maps_the_pages() {
        let mut small = vec![0u8; HUGE_MIN_BYTES - 1];
        assert!(!prefault_pages(&mut small));
        let n = 8 * HUGE_MIN_BYTES;
        let mut v = vec![0u8; n];
        advise_huge_pages(&mut v);
        v[12_345] = 9;
        let before = resident_bytes();
        let mapped = prefault_pages(&mut v);
        let after = resident_bytes();
        assert!(v
            .iter()
            .enumerate()
            .all(|(i, &x)| x == if i == 12_345 { 9 } else { 0 }));
        if let (true, Some(b), Some(a)) = (mapped, before, after) {
            // Other tests allocate concurrently; the buffer alone adds ~32 MiB.
            assert!(a >= b + (n as u64) / 2, "resident {b} -> {a} bytes");
        }
        v[n - 1] = 3;
        assert_eq!(v.iter().map(|&x| u64::from(x)).sum::<u64>(), 12);
    }

    fn resident_bytes() -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * 4096)
    }
}
