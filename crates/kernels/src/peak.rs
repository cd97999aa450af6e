//! The compute side of a roofline: how many multiply-adds per second this CPU's vector units
//! sustain in registers — f32 fused multiply-adds (what attention over f16 K/V and the
//! activations run on), 8-bit integer dot products (`vpdpbusd`, what the quantized matmuls run
//! on) and bf16 pair dot products (`vdpbf16ps`, what attention over bf16 K/V runs on) — with
//! every thread of a pool at once (the forward pass's threads).
//!
//! Each task runs [`CHAINS`] independent accumulator chains (more than the latency × ports of
//! any FMA unit, so the throughput, not the latency, binds) for a fixed number of iterations,
//! at the widest width the CPU has. Owns these measurements only; it never runs a model and
//! never changes which kernel the forward pass takes.

use std::time::Instant;

use crate::cpu::cpu_features;
use crate::ThreadPool;

/// Independent accumulators per task.
pub const CHAINS: usize = 12;
/// Iterations of every chain per task (a task is ~1 ms on a 3 GHz core).
const ITERS: u32 = 200_000;

/// Which operation [`measure_peak`] times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeakOp {
    /// f32 fused multiply-add; one counts as 2 floating-point operations.
    F32Fma,
    /// u8 × i8 products summed four to an i32 lane (`vpdpbusd`); one product and its add count
    /// as 2 operations.
    Int8Dot,
    /// bf16 × bf16 products summed two to an f32 lane (`vdpbf16ps`, AVX-512 BF16); one product
    /// and its add count as 2 floating-point operations.
    Bf16Dot,
}

/// The result of [`measure_peak`].
#[derive(Debug, Clone, PartialEq)]
pub struct Peak {
    pub op: PeakOp,
    pub threads: usize,
    /// Register width of the instructions timed, bits.
    pub width_bits: u32,
    /// Operations per second of every pass, in order.
    pub passes: Vec<f64>,
}

impl Peak {
    /// The fastest pass (the units sustained at least this).
    pub fn best(&self) -> f64 {
        self.passes.iter().copied().fold(0.0, f64::max)
    }
}

/// The widest register width this CPU runs `op` at, in bits (`None`: no vector path for it).
pub fn peak_width_bits(op: PeakOp) -> Option<u32> {
    let f = cpu_features();
    match op {
        PeakOp::F32Fma if f.avx512 => Some(512),
        PeakOp::F32Fma if f.avx2 => Some(256),
        PeakOp::Int8Dot if f.vnni && f.avx512 && avx512_vnni_512() => Some(512),
        PeakOp::Int8Dot if f.vnni || f.avxvnni => Some(256),
        PeakOp::Bf16Dot if f.bf16 => Some(512),
        _ => None,
    }
}

/// Whether the 512-bit `vpdpbusd` may run (AVX-512 F + VNNI detected).
fn avx512_vnni_512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Operations one task performs at `width_bits`.
fn ops_per_task(op: PeakOp, width_bits: u32) -> f64 {
    let per_instruction = match op {
        PeakOp::F32Fma => 2.0 * (width_bits / 32) as f64,
        PeakOp::Int8Dot => 2.0 * (width_bits / 8) as f64,
        PeakOp::Bf16Dot => 4.0 * (width_bits / 32) as f64,
    };
    per_instruction * (CHAINS as f64) * ITERS as f64
}

/// Times `passes` passes (after one untimed pass) of `8 × threads` tasks of `op` over `pool`;
/// `None` when the CPU has no vector path for `op`.
pub fn measure_peak(pool: &ThreadPool, op: PeakOp, passes: usize) -> Option<Peak> {
    let width_bits = peak_width_bits(op)?;
    let tasks = 8 * pool.num_threads();
    let sink = std::sync::atomic::AtomicU64::new(0);
    let run = || {
        pool.for_each(tasks, &|_| {
            let lanes = run_task(op, width_bits);
            sink.fetch_add(lanes, std::sync::atomic::Ordering::Relaxed);
        })
    };
    run();
    let per_pass = ops_per_task(op, width_bits) * tasks as f64;
    let passes = (0..passes.max(1))
        .map(|_| {
            let t0 = Instant::now();
            run();
            per_pass / t0.elapsed().as_secs_f64()
        })
        .collect();
    std::hint::black_box(sink.into_inner());
    Some(Peak {
        op,
        threads: pool.num_threads(),
        width_bits,
        passes,
    })
}

/// One task's chains; returns lane 0 of the first chain (bits, so nothing is optimised away).
fn run_task(op: PeakOp, width_bits: u32) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `width_bits` came from `peak_width_bits`, which checked the features each
        // body enables (AVX-512 F for the 512-bit FMA; AVX2+FMA for the 256-bit one; AVX-512
        // F + VNNI for the 512-bit dot product; AVX-512 VNNI+VL or AVX-VNNI for the 256-bit;
        // AVX-512 BF16 for the bf16 pairs).
        unsafe {
            match (op, width_bits) {
                (PeakOp::F32Fma, 512) => x86::fma512(ITERS)[0].to_bits() as u64,
                (PeakOp::F32Fma, _) => x86::fma256(ITERS)[0].to_bits() as u64,
                (PeakOp::Int8Dot, 512) => x86::dot512(ITERS)[0] as u64,
                (PeakOp::Int8Dot, _) if cpu_features().vnni => x86::dot256_vl(ITERS)[0] as u64,
                (PeakOp::Int8Dot, _) => x86::dot256_vex(ITERS)[0] as u64,
                (PeakOp::Bf16Dot, _) => x86::bf16x2_512(ITERS)[0].to_bits() as u64,
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (op, width_bits);
        unreachable!("peak_width_bits gives no width off x86-64")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The chains: `acc = acc · 1 + 1` (f32), `acc += Σ 1 · 1` (int8) and `acc += 1 · 1 + 1 · 1`
    //! (bf16 pairs), so a chain's lanes end at exactly `iters` (f32, exact below 2^24),
    //! `4 · iters` (i32) or `2 · iters` (f32): the tests check them.
    use super::CHAINS;
    use std::arch::x86_64::*;

    /// `$name(iters)`: the lane values of the first of [`CHAINS`] chains of `$step(acc, one,
    /// one)` after `iters` iterations, with `$features` enabled.
    macro_rules! chains {
        ($(#[$doc:meta])* $name:ident, $features:literal, $lane:ty, $lanes:literal,
         $one:expr, $zero:expr, $step:ident, $store:ident) => {
            $(#[$doc])*
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name(iters: u32) -> [$lane; $lanes] {
                let one = std::hint::black_box($one);
                let mut acc = [$zero; CHAINS];
                for _ in 0..iters {
                    for a in &mut acc {
                        *a = $step(*a, one, one);
                    }
                }
                let mut out = [<$lane>::default(); $lanes];
                // SAFETY: `out` holds one register's worth of writable lanes; unaligned store.
                unsafe { $store(out.as_mut_ptr().cast(), std::hint::black_box(acc)[0]) };
                out
            }
        };
    }

    chains!(
        /// # Safety
        /// AVX-512 F present.
        fma512, "avx512f", f32, 16, _mm512_set1_ps(1.0), _mm512_setzero_ps(),
        _mm512_fmadd_ps, _mm512_storeu_ps
    );
    chains!(
        /// # Safety
        /// AVX2 and FMA present.
        fma256, "avx2,fma", f32, 8, _mm256_set1_ps(1.0), _mm256_setzero_ps(),
        _mm256_fmadd_ps, _mm256_storeu_ps
    );
    chains!(
        /// # Safety
        /// AVX-512 F and VNNI present.
        dot512, "avx512f,avx512vnni", i32, 16, _mm512_set1_epi8(1), _mm512_setzero_si512(),
        _mm512_dpbusd_epi32, _mm512_storeu_si512
    );
    chains!(
        /// # Safety
        /// AVX-512 VNNI and VL present.
        dot256_vl, "avx2,avx512vnni,avx512vl", i32, 8, _mm256_set1_epi8(1),
        _mm256_setzero_si256(), _mm256_dpbusd_epi32, _mm256_storeu_si256
    );
    /// Two bf16 ones in each 32-bit lane, as the pair instruction's operand type.
    #[target_feature(enable = "avx512f,avx512bf16")]
    fn bf16_ones() -> __m512bh {
        // SAFETY: both are 64-byte plain vector types; every bit pattern is a valid value.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(0x3F80_3F80)) }
    }
    chains!(
        /// # Safety
        /// AVX-512 F and BF16 present.
        bf16x2_512, "avx512f,avx512bf16", f32, 16, bf16_ones(), _mm512_setzero_ps(),
        _mm512_dpbf16_ps, _mm512_storeu_ps
    );
    chains!(
        /// # Safety
        /// AVX-VNNI present.
        dot256_vex, "avx2,avxvnni", i32, 8, _mm256_set1_epi8(1), _mm256_setzero_si256(),
        _mm256_dpbusd_avx_epi32, _mm256_storeu_si256
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every chain this CPU runs computes what it claims: after `n` iterations each f32 lane is
    /// `n` and each i32 lane `4n` (so the operations counted were performed).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_chains_compute_what_is_counted() {
        let f = cpu_features();
        // SAFETY: each body runs only where its features were detected.
        unsafe {
            if f.avx512 {
                assert_eq!(x86::fma512(1000), [1000.0; 16]);
            }
            if f.avx2 {
                assert_eq!(x86::fma256(1000), [1000.0; 8]);
            }
            if avx512_vnni_512() {
                assert_eq!(x86::dot512(1000), [4000; 16]);
            }
            if f.vnni {
                assert_eq!(x86::dot256_vl(1000), [4000; 8]);
            }
            if f.avxvnni {
                assert_eq!(x86::dot256_vex(1000), [4000; 8]);
            }
            if f.bf16 {
                assert_eq!(x86::bf16x2_512(1000), [2000.0; 16]);
            }
        }
    }

    /// The measurement reports positive, finite rates at the width it names, one per pass.
    #[test]
    fn a_measurement_reports_every_pass() {
        let pool = ThreadPool::new(2);
        for op in [PeakOp::F32Fma, PeakOp::Int8Dot, PeakOp::Bf16Dot] {
            let Some(p) = measure_peak(&pool, op, 3) else {
                assert_eq!(peak_width_bits(op), None);
                continue;
            };
            assert_eq!((p.threads, p.passes.len()), (2, 3));
            assert_eq!(Some(p.width_bits), peak_width_bits(op));
            assert!(p.passes.iter().all(|r| r.is_finite() && *r > 0.0));
            assert!(p.best() >= p.passes[0]);
        }
    }
}
