//! Which instruction set the row kernels use: the portable scalar path, AVX2+FMA+F16C, or
//! AVX-512 F+BW on top of it (the tile decoders; every other kernel runs its AVX2 path there).
//!
//! Owns runtime detection (done once, cached). Both paths perform the same operations in the
//! same order, so they give bit-identical results; the choice changes only speed. It reads no
//! environment: callers that want to force the portable path pass [`Isa::Portable`] to the
//! `*_with` functions.

use std::sync::OnceLock;

/// An instruction-set path of the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust, valid on every CPU.
    Portable,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 + FMA + F16C and AVX-512 F + BW.
    Avx512,
}

impl Isa {
    /// The best path this CPU supports (detected once per process).
    pub fn detect() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(detect_uncached)
    }

    /// `self`, downgraded to [`Isa::Portable`] if the CPU lacks it (guards explicit choices).
    pub fn clamp(self) -> Isa {
        match (self, Isa::detect()) {
            (Isa::Avx512, Isa::Avx512) => Isa::Avx512,
            (Isa::Avx2 | Isa::Avx512, Isa::Avx2 | Isa::Avx512) => Isa::Avx2,
            _ => Isa::Portable,
        }
    }

    /// True when this path includes AVX2 *and* the CPU has it.
    pub(crate) fn use_avx2(self) -> bool {
        self.clamp() != Isa::Portable
    }

    /// True when this path is AVX-512 *and* the CPU has it.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn use_avx512(self) -> bool {
        self.clamp() == Isa::Avx512
    }
}

fn detect_uncached() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
                return Isa::Avx512;
            }
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamp_never_adds_features() {
        assert_eq!(Isa::Portable.clamp(), Isa::Portable);
        let avx2 = if Isa::detect() == Isa::Portable {
            Isa::Portable
        } else {
            Isa::Avx2
        };
        assert_eq!(Isa::Avx2.clamp(), avx2);
        assert_eq!(Isa::Avx512.clamp(), Isa::detect());
        assert!(!Isa::Portable.use_avx2());
        assert!(!Isa::Avx2.use_avx512());
    }
}
