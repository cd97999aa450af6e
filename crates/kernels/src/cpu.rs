//! Runtime CPU feature detection and the switch that forces the portable path.
//!
//! Owns one process-wide decision: may kernels use the AVX2+FMA+F16C code paths, and within them
//! AVX-512 VNNI's 256-bit integer dot product (`vpdpbusd`), or else AVX-VNNI's, and AVX-512 VL's
//! 32 registers?
//! Detection runs
//! once; `AGENTKV_NO_SIMD=1` (read once, at first use) or [`set_force_portable`] forces the scalar
//! path, and `AGENTKV_ISA=avx2` caps the paths at AVX2+FMA+F16C (no VNNI, no AVX-512), so a
//! newer machine can run and measure what an AVX2-only one runs. It never selects kernels itself
//! (callers branch on [`CpuFeatures::avx2`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The instruction-set extensions the kernels can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AVX2, FMA and F16C are all present (the x86-64 fast path).
    pub avx2: bool,
    /// On top of `avx2`: AVX-512 VNNI with VL (256-bit `vpdpbusd`, one instruction for the
    /// four-product integer lane sums of the quantized matmul; same integers, same results).
    pub vnni: bool,
    /// On top of `avx2`: AVX-VNNI (the VEX-encoded 256-bit `vpdpbusd` of Intel CPUs without
    /// AVX-512 VNNI; same integers, same results). Used only when `vnni` is absent.
    pub avxvnni: bool,
    /// On top of `avx2`: AVX-512 F+VL (32 vector registers for the 256-bit tile kernels of
    /// `flash_tile`, and the 512-bit transposed tile step of `flash_tile_wide`; same
    /// operations lane by lane, same results).
    pub avx512: bool,
    /// On top of `avx512`: AVX-512 BF16 with BW (`vdpbf16ps`, two bf16 products per f32 lane
    /// an instruction, for `flash_tile_pairs`; its portable form performs the same IEEE
    /// operations, so the results are the same).
    pub bf16: bool,
}

impl CpuFeatures {
    /// The portable scalar path only; always valid on every CPU.
    pub const PORTABLE: CpuFeatures = CpuFeatures {
        avx2: false,
        vnni: false,
        avxvnni: false,
        avx512: false,
        bf16: false,
    };
    /// AVX2 without the VNNI dot product (valid wherever `avx2` is detected).
    pub const AVX2: CpuFeatures = CpuFeatures {
        avx2: true,
        vnni: false,
        avxvnni: false,
        avx512: false,
        bf16: false,
    };

    /// What this CPU supports, ignoring any override.
    pub fn detect() -> CpuFeatures {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            let avx512 =
                avx2 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl");
            CpuFeatures {
                avx2,
                vnni: avx2
                    && is_x86_feature_detected!("avx512vnni")
                    && is_x86_feature_detected!("avx512vl"),
                avxvnni: avx2 && is_x86_feature_detected!("avxvnni"),
                avx512,
                bf16: avx512
                    && is_x86_feature_detected!("avx512bf16")
                    && is_x86_feature_detected!("avx512bw"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            CpuFeatures::PORTABLE
        }
    }

    /// The paths these features select, as one word for logs: `portable`, `avx2`,
    /// `avx2+avxvnni`, `avx512`, `avx512+vnni` (the kernels' outputs are the same on all of them:
    /// the arithmetic *definition*, `packed32::PackedDef`, does not depend on the CPU).
    pub fn name(self) -> &'static str {
        match (self.avx2, self.avx512, self.vnni, self.avxvnni) {
            (false, ..) => "portable",
            (true, true, true, _) => "avx512+vnni",
            (true, true, false, _) => "avx512",
            (true, false, true, _) => "avx2+vnni",
            (true, false, false, true) => "avx2+avxvnni",
            (true, false, false, false) => "avx2",
        }
    }

    /// `self` restricted to what the CPU really has (guards explicitly passed feature sets).
    #[inline]
    pub fn clamp_to_detected(self) -> CpuFeatures {
        let d = detected();
        let avx2 = self.avx2 && d.avx2;
        CpuFeatures {
            avx2,
            vnni: avx2 && self.vnni && d.vnni,
            avxvnni: avx2 && self.avxvnni && d.avxvnni,
            avx512: avx2 && self.avx512 && d.avx512,
            bf16: avx2 && self.avx512 && d.avx512 && self.bf16 && d.bf16,
        }
    }
}

static FORCE_PORTABLE: AtomicBool = AtomicBool::new(false);

fn detected() -> CpuFeatures {
    static DETECTED: OnceLock<CpuFeatures> = OnceLock::new();
    *DETECTED.get_or_init(CpuFeatures::detect)
}

fn env_forces_portable() -> bool {
    static ENV: OnceLock<bool> = OnceLock::new();
    *ENV.get_or_init(|| std::env::var("AGENTKV_NO_SIMD").is_ok_and(|v| v == "1"))
}

/// The cap `AGENTKV_ISA` puts on the detected features (read once): `avx2` or `portable`;
/// unset, empty or `native` caps nothing.
fn env_isa_cap() -> Option<CpuFeatures> {
    static ENV: OnceLock<Option<CpuFeatures>> = OnceLock::new();
    *ENV.get_or_init(
        || match parse_isa_cap(std::env::var("AGENTKV_ISA").ok().as_deref()) {
            Ok(cap) => cap,
            Err(bad) => {
                // Read inside a kernel, where there is no caller to return an error to: say it
                // once and run the detected paths (the results are the same on every path).
                eprintln!(
                    "agentkv: AGENTKV_ISA={bad:?} is not one of native, avx2, portable; ignored"
                );
                None
            }
        },
    )
}

/// `AGENTKV_ISA`'s value as a cap; `Err` with the value when it names no path.
fn parse_isa_cap(value: Option<&str>) -> Result<Option<CpuFeatures>, String> {
    match value.map(str::trim) {
        None | Some("") | Some("native") => Ok(None),
        Some("avx2") => Ok(Some(CpuFeatures::AVX2)),
        Some("portable") => Ok(Some(CpuFeatures::PORTABLE)),
        Some(other) => Err(other.to_string()),
    }
}

/// Features the kernels use now: detected ones, minus anything disabled by `AGENTKV_NO_SIMD=1`,
/// [`set_force_portable`] or `AGENTKV_ISA`.
pub fn cpu_features() -> CpuFeatures {
    if env_forces_portable() || FORCE_PORTABLE.load(Ordering::Relaxed) {
        CpuFeatures::PORTABLE
    } else {
        match env_isa_cap() {
            Some(cap) => cap.clamp_to_detected(),
            None => detected(),
        }
    }
}

/// Forces (or stops forcing) the portable scalar path process-wide. Both paths give bit-identical
/// results, so flipping this never changes outputs, only speed. Tests that compare paths should
/// prefer passing explicit features (`matmul_with_features`) to avoid racing on this global.
pub fn set_force_portable(force: bool) {
    FORCE_PORTABLE.store(force, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn portable_is_always_allowed_and_clamp_never_adds_features() {
        assert_eq!(
            CpuFeatures::PORTABLE.clamp_to_detected(),
            CpuFeatures::PORTABLE
        );
        let all = CpuFeatures {
            avx2: true,
            vnni: true,
            avxvnni: true,
            avx512: true,
            bf16: true,
        }
        .clamp_to_detected();
        assert_eq!(all, CpuFeatures::detect());
    }

    #[test]
    fn the_isa_cap_parses_and_never_adds_features() {
        assert_eq!(parse_isa_cap(None), Ok(None));
        assert_eq!(parse_isa_cap(Some("native")), Ok(None));
        assert_eq!(parse_isa_cap(Some(" avx2 ")), Ok(Some(CpuFeatures::AVX2)));
        assert_eq!(
            parse_isa_cap(Some("portable")),
            Ok(Some(CpuFeatures::PORTABLE))
        );
        assert_eq!(parse_isa_cap(Some("avx512")), Err("avx512".to_string()));
        let capped = CpuFeatures::AVX2.clamp_to_detected();
        assert!(!capped.vnni && !capped.avxvnni && !capped.avx512 && !capped.bf16);
        assert_eq!(capped.avx2, CpuFeatures::detect().avx2);
    }

    #[test]
    fn names_say_the_widest_path() {
        assert_eq!(CpuFeatures::PORTABLE.name(), "portable");
        assert_eq!(CpuFeatures::AVX2.name(), "avx2");
        let all = CpuFeatures {
            avx2: true,
            vnni: true,
            avxvnni: true,
            avx512: true,
            bf16: true,
        };
        assert_eq!(all.name(), "avx512+vnni");
        let avxvnni = CpuFeatures {
            avxvnni: true,
            ..CpuFeatures::AVX2
        };
        assert_eq!(avxvnni.name(), "avx2+avxvnni");
    }

    #[test]
    fn force_portable_switch_round_trips() {
        set_force_portable(true);
        assert_eq!(cpu_features(), CpuFeatures::PORTABLE);
        set_force_portable(false);
        if !env_forces_portable() && env_isa_cap().is_none() {
            assert_eq!(cpu_features(), CpuFeatures::detect());
        }
    }
}
