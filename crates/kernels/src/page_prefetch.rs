//! Software prefetch of the page a memory stream enters next.
//!
//! The hardware prefetchers follow a stream of cache lines inside one 4 KiB page and stop at its
//! end; the next page's stream starts cold (its first lines are demand misses until the
//! prefetcher has seen a few). One request for the first line of each page a stream is about to
//! enter starts that page early, at a cost of one instruction a page. A request for every line
//! instead competes with the hardware's own stream for the core's miss buffers: measured on the
//! AVX-512 decode matmul on Zen 4 (`examples/packed_stream.rs`), a request per line 4 KiB ahead
//! streamed at 0.68–0.81× the plain read's rate, one request a page at 0.87–0.89×.
//!
//! Owns where those requests go; it never reads memory and changes no result (a prefetch has no
//! architectural effect and never faults, whatever the address).

/// How far ahead of the tile it reads a run of attention tiles starts the next pages: about one
/// tile (a 32-position `k=int8,v=bf16` tile of head size 64 is 6,272 bytes). Measured on Zen 4
/// (`examples/attn_depth`, 30 layers at depth 4,096 on 2 threads, five interleaved rounds): a
/// decode's layer 81.3 µs (median) without, 77.8 / 76.7 / 76.6 µs at 4 / 8 / 16 KiB.
pub const TILE_PAGES_AHEAD: usize = 8192;

/// Bytes of the smallest page: the hardware prefetchers follow a stream inside one, never across.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const PAGE_BYTES: usize = 4096;

/// The offset (from `base`) of the last page start among the `len` bytes at offset `at`, if one
/// lies there and before `end` (the x86-64 matmul kernels' bounded form).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
pub(crate) fn page_start_within(base: usize, at: usize, len: usize, end: usize) -> Option<usize> {
    let last = base.checked_add(at)?.checked_add(len.checked_sub(1)?)?;
    let page = (last & !(PAGE_BYTES - 1)).checked_sub(base)?;
    (page >= at && page < end).then_some(page)
}

/// Asks the CPU to bring (to L2) the first line of every page that starts among the `len` bytes
/// `ahead` bytes past `start`: a stream that reads `start..start + len` now enters those pages
/// next. The addresses may lie outside any allocation (a prefetch never faults); no-op off
/// x86-64.
#[inline(always)]
pub fn prefetch_page_starts(start: *const u8, len: usize, ahead: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let first = (start as usize).wrapping_add(ahead);
        let mut page = first.wrapping_add(PAGE_BYTES - 1) & !(PAGE_BYTES - 1);
        let end = first.wrapping_add(len);
        while page >= first && page < end {
            // SAFETY: a prefetch has no architectural effect and never faults, so any address
            // is allowed (SSE, always present on x86-64); no reference is formed.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(page as *const i8) };
            page = page.wrapping_add(PAGE_BYTES);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, len, ahead);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_start_among_a_blocks_bytes_ahead() {
        // A matrix at 0x10_0040: page 0x10_1000 lies 4032 bytes in.
        let base = 0x10_0040;
        // Bytes 4000..4320 hold it.
        assert_eq!(page_start_within(base, 4000, 320, 1 << 20), Some(4032));
        // Bytes 3712..4032 end just before it; 4032..4352 start on it.
        assert_eq!(page_start_within(base, 3712, 320, 1 << 20), None);
        assert_eq!(page_start_within(base, 4032, 320, 1 << 20), Some(4032));
        // Past the matrix's end: nothing.
        assert_eq!(page_start_within(base, 4000, 320, 4032), None);
        assert_eq!(page_start_within(base, 4000, 320, 4033), Some(4032));
        // No bytes, or an address past the end of the address space: nothing.
        assert_eq!(page_start_within(base, 4000, 0, 1 << 20), None);
        assert_eq!(page_start_within(usize::MAX - 10, 4000, 320, 1 << 20), None);
        // A page-aligned matrix: every 4 KiB.
        assert_eq!(page_start_within(0x20_0000, 8192, 576, 1 << 20), Some(8192));
        assert_eq!(
            page_start_within(0x20_0000, 8192 - 575, 576, 1 << 20),
            Some(8192)
        );
        assert_eq!(page_start_within(0x20_0000, 8192 - 576, 576, 1 << 20), None);
    }

    #[test]
    fn prefetches_of_any_address_run_and_change_nothing() {
        let data: Vec<u8> = (0..3 * PAGE_BYTES).map(|i| i as u8).collect();
        // Inside, across the end, far past it, around the end of the address space, no bytes.
        prefetch_page_starts(data.as_ptr(), data.len(), 0);
        prefetch_page_starts(data.as_ptr(), 3 * PAGE_BYTES, 2 * PAGE_BYTES);
        prefetch_page_starts(data.as_ptr(), 6272, 1 << 40);
        prefetch_page_starts(usize::MAX as *const u8, 4 * PAGE_BYTES, 8192);
        prefetch_page_starts(data.as_ptr(), 0, 4096);
        assert!(data.iter().enumerate().all(|(i, &b)| b == i as u8));
    }
}
