//! The one place that chooses between the portable and the AVX2 kernels.
//!
//! `pick!(isa, kernel(args…))` calls `avx2::kernel` when `isa` is AVX2 and the CPU has it,
//! otherwise `scalar::kernel`. Owns nothing else (the group loops both kernel modules expand are
//! `row_drivers.rs`'s).

macro_rules! pick {
    ($isa:expr, $f:ident($($arg:expr),* $(,)?)) => {{
        #[cfg(target_arch = "x86_64")]
        let r = if $isa.use_avx2() {
            // SAFETY: `use_avx2` is true only when AVX2, FMA and F16C were detected at runtime,
            // which is all `avx2::*` requires; slice bounds are asserted inside the kernel.
            unsafe { $crate::avx2::$f($($arg),*) }
        } else {
            $crate::scalar::$f($($arg),*)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let r = {
            let _ = $isa;
            $crate::scalar::$f($($arg),*)
        };
        r
    }};
}

pub(crate) use pick;
