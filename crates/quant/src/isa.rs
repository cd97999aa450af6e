//! Which instruction set the row kernels use: the portable scalar path, AVX2+FMA+F16C, or
//! AVX-512 F+BW on top of it (the tile decoders; every other kernel runs its AVX2 path there).
//!
//! Owns runtime detection (done once, cached). Both paths perform the same operations in the
//! same order, so they give bit-identical results; the choice changes only speed. The process
//! environment caps the detected path as it caps the model kernels' (`kernels::cpu`):
//! `AGENTKV_NO_SIMD=1` or `AGENTKV_ISA=portable` → portable, `AGENTKV_ISA=avx2` → at most AVX2
//! (what an AVX2-only machine runs, for measurements); other values cap nothing (the model
//! reports them). Callers that want a given path pass it to the `*_with` functions.

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
    /// The best path this CPU supports, within the environment's cap (once per process).
    pub fn detect() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            let cap = env_cap(
                std::env::var("AGENTKV_NO_SIMD").ok().as_deref(),
                std::env::var("AGENTKV_ISA").ok().as_deref(),
            );
            capped(detect_uncached(), cap)
        })
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

/// The cap the environment puts on the path: `no_simd` = `AGENTKV_NO_SIMD`, `isa` =
/// `AGENTKV_ISA` (`None`: no cap).
fn env_cap(no_simd: Option<&str>, isa: Option<&str>) -> Option<Isa> {
    if no_simd == Some("1") {
        return Some(Isa::Portable);
    }
    match isa.map(str::trim) {
        Some("avx2") => Some(Isa::Avx2),
        Some("portable") => Some(Isa::Portable),
        _ => None,
    }
}

/// `hardware` lowered to `cap`.
fn capped(hardware: Isa, cap: Option<Isa>) -> Isa {
    let rank = |i: Isa| match i {
        Isa::Portable => 0,
        Isa::Avx2 => 1,
        Isa::Avx512 => 2,
    };
    match cap {
        Some(c) if rank(c) < rank(hardware) => c,
        _ => hardware,
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
    fn the_environment_caps_the_path_and_never_raises_it() {
        use Isa::*;
        assert_eq!(env_cap(None, None), None);
        assert_eq!(env_cap(Some("1"), Some("avx2")), Some(Portable));
        assert_eq!(env_cap(Some("0"), Some(" avx2 ")), Some(Avx2));
        assert_eq!(env_cap(None, Some("portable")), Some(Portable));
        assert_eq!(env_cap(None, Some("native")), None);
        assert_eq!(env_cap(None, Some("avx512")), None);
        assert_eq!(capped(Avx512, Some(Avx2)), Avx2);
        assert_eq!(capped(Avx512, Some(Portable)), Portable);
        assert_eq!(capped(Avx2, Some(Avx2)), Avx2);
        assert_eq!(capped(Portable, Some(Avx2)), Portable);
        assert_eq!(capped(Avx2, None), Avx2);
    }

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
