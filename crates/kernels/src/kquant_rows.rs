//! The K-quant matmul driver: which canonical order ([`super::kquant`]'s module doc) each token
//! of a step gets, and the row ranges in register tiles (AVX2 / VNNI in
//! [`super::kquant_avx2`], scalar otherwise). Owns no arithmetic of its own and never allocates
//! once the activation scratch has grown.

use std::ops::Range;

use super::cpu::CpuFeatures;
#[cfg(not(target_arch = "x86_64"))]
use super::kquant::KQuant;
use super::kquant::{dot_row_scalar, flat_order, order, with_act_k_scratch, ActQ8K};
use super::kquant::{Q4K, Q5K, Q6K, TILED_MIN_TOKENS};
use super::matmul::{matmul_with_features, prepare, Job, MatmulArith};
use super::out_ptr::OutPtr;
use super::pool::ThreadPool;
use super::{KernelError, QMatrix};
use gguf::GgmlType;

/// [`matmul_with_features`] with K-quant weights through the dequantise-to-f32 path (other
/// types as usual): the reference the integer kernels (`kquant.rs`, llama.cpp's AVX2
/// arithmetic; what every matmul takes) are compared with.
pub fn matmul_kquant_f32(
    pool: &ThreadPool,
    w: &QMatrix,
    x: &[f32],
    num_tokens: usize,
    y: &mut [f32],
    features: CpuFeatures,
) -> Result<(), KernelError> {
    if !super::kquant::is_kquant(w.ty) {
        return matmul_with_features(pool, w, x, num_tokens, y, features);
    }
    let arith = MatmulArith::Invariant;
    if let Some((job, out)) = prepare(w, x, num_tokens, y, features, arith)? {
        job.run_float_rows(pool, x, &out);
    }
    Ok(())
}

/// Kernel set of one K-quant type on this architecture.
#[cfg(target_arch = "x86_64")]
trait Kernel: super::kquant_tile512::KQuant512 {}
#[cfg(target_arch = "x86_64")]
impl<K: super::kquant_tile512::KQuant512> Kernel for K {}
#[cfg(not(target_arch = "x86_64"))]
trait Kernel: KQuant {}
#[cfg(not(target_arch = "x86_64"))]
impl<K: KQuant> Kernel for K {}

impl Job<'_> {
    /// The whole matmul for a K-quant weight: quantise `x` once, then one pool task per row range.
    pub(super) fn run_kquant(&self, pool: &ThreadPool, x: &[f32], out: &OutPtr) {
        with_act_k_scratch(|act| {
            act.quantize_on(pool, x, self.num_tokens, self.w.row_len);
            let act = &*act;
            let (num_tasks, rows_per_task) = self.split(pool);
            pool.for_each(num_tasks, &|task| {
                let start = task * rows_per_task;
                let rows = start..(start + rows_per_task).min(self.w.num_rows);
                self.rows_kquant_any(act, rows, out);
            });
        });
    }

    /// `rows` of the output for the job's weight type, which must be [`is_kquant`].
    pub(super) fn rows_kquant_any(&self, act: &ActQ8K, rows: Range<usize>, out: &OutPtr) {
        match self.w.ty {
            GgmlType::Q4K => self.rows_kquant::<Q4K>(act, rows, out),
            GgmlType::Q5K => self.rows_kquant::<Q5K>(act, rows, out),
            GgmlType::Q6K => self.rows_kquant::<Q6K>(act, rows, out),
            other => unreachable!("rows_kquant_any called for {other:?}, not a K-quant"),
        }
    }

    fn rows_kquant<K: Kernel>(&self, act: &ActQ8K, rows: Range<usize>, out: &OutPtr) {
        use order::{FLAT, FLAT64, LANES, TILED};
        if !flat_order::<K>(self.w.num_rows) {
            if self.ggml_groups && self.num_tokens >= TILED_MIN_TOKENS {
                self.rows_kquant_order::<K, TILED, TILED>(act, rows, out)
            } else {
                self.rows_kquant_order::<K, LANES, LANES>(act, rows, out)
            }
        } else if self.ggml_groups {
            self.rows_kquant_order::<K, FLAT64, FLAT>(act, rows, out)
        } else {
            self.rows_kquant_order::<K, FLAT, FLAT>(act, rows, out)
        }
    }

    /// `rows` with tokens `0..n - n % 4` in order `BULK` and the rest in order `TAIL`.
    fn rows_kquant_order<K: Kernel, const BULK: u8, const TAIL: u8>(
        &self,
        act: &ActQ8K,
        rows: Range<usize>,
        out: &OutPtr,
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.features.avx2 {
            // SAFETY: `features` was clamped to the detected CPU features, so AVX2+FMA+F16C (and
            // AVX-512 VNNI+VL when `vnni`) exist.
            unsafe {
                if self.features.vnni {
                    self.rows_kquant_avx2::<K, BULK, TAIL, true>(act, rows, out)
                } else {
                    self.rows_kquant_avx2::<K, BULK, TAIL, false>(act, rows, out)
                }
            };
            return;
        }
        let num_rows = self.w.num_rows;
        let bulk = self.num_tokens - self.num_tokens % 4;
        for r in rows {
            let w_row = &self.w.data[r * self.row_bytes..(r + 1) * self.row_bytes];
            for t in 0..self.num_tokens {
                let y = if t < bulk {
                    dot_row_scalar::<K, BULK>(w_row, act, t)
                } else {
                    dot_row_scalar::<K, TAIL>(w_row, act, t)
                };
                out.write(t * num_rows + r, y);
            }
        }
    }

    /// Row range in register tiles: 1 token × 4 rows with prefetch for decode, 4 tokens × 2 rows
    /// for batches (each weight super-block decoded once per 4 tokens; these are the tokens of
    /// order `BULK`, the 1-token tiles those of order `TAIL`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn rows_kquant_avx2<K: Kernel, const BULK: u8, const TAIL: u8, const VNNI: bool>(
        &self,
        act: &ActQ8K,
        rows: Range<usize>,
        out: &OutPtr,
    ) {
        /// One tile on the path `VNNI` selects (same results either way).
        #[inline(always)]
        fn tile<
            K: Kernel,
            const T: usize,
            const R: usize,
            const PF: bool,
            const ORDER: u8,
            const VNNI: bool,
        >(
            w: &[u8],
            row_bytes: usize,
            row0: usize,
            act: &ActQ8K,
            tok0: usize,
            out: &mut [[f32; R]; T],
        ) {
            use super::kquant_tile as k;
            // SAFETY: only reached from `rows_kquant`, which checked AVX2+FMA+F16C and, for
            // `VNNI`, AVX-512 VNNI+VL on this CPU.
            unsafe {
                if VNNI {
                    k::tile_vnni::<K, T, R, PF, ORDER>(w, row_bytes, row0, act, tok0, out)
                } else {
                    k::tile::<K, T, R, PF, ORDER>(w, row_bytes, row0, act, tok0, out)
                }
            }
        }
        let (w, rb, n) = (self.w.data, self.row_bytes, self.w.num_rows);
        let num_tokens = self.num_tokens;
        let mut r = rows.start;
        if num_tokens == 1 {
            let mut o = [[0f32; 4]; 1];
            while r + 4 <= rows.end {
                tile::<K, 1, 4, true, TAIL, VNNI>(w, rb, r, act, 0, &mut o);
                (0..4).for_each(|i| out.write(r + i, o[0][i]));
                r += 4;
            }
            let mut o = [[0f32; 1]; 1];
            while r < rows.end {
                tile::<K, 1, 1, true, TAIL, VNNI>(w, rb, r, act, 0, &mut o);
                out.write(r, o[0][0]);
                r += 1;
            }
            return;
        }
        // The engine's orders (every token alike) on AVX-512 BW + VNNI: the 512-bit tiles
        // (same results, half the integer instructions).
        let wide = VNNI
            && BULK == TAIL
            && (BULK == order::LANES || BULK == order::FLAT)
            && super::kquant_tile512::available();
        while r + 2 <= rows.end {
            let mut t = 0;
            let mut o4 = [[0f32; 2]; 4];
            while t + 4 <= num_tokens {
                if wide {
                    // SAFETY: `available()` checked AVX-512 F+BW+VL+VNNI; `rows_kquant` checked
                    // AVX2+FMA+F16C.
                    unsafe {
                        super::kquant_tile512::tile512::<K, 4, 2, BULK>(w, rb, r, act, t, &mut o4)
                    };
                } else {
                    tile::<K, 4, 2, false, BULK, VNNI>(w, rb, r, act, t, &mut o4);
                }
                for (dt, row) in o4.iter().enumerate() {
                    out.write((t + dt) * n + r, row[0]);
                    out.write((t + dt) * n + r + 1, row[1]);
                }
                t += 4;
            }
            let mut o1 = [[0f32; 2]; 1];
            while t < num_tokens {
                tile::<K, 1, 2, false, TAIL, VNNI>(w, rb, r, act, t, &mut o1);
                out.write(t * n + r, o1[0][0]);
                out.write(t * n + r + 1, o1[0][1]);
                t += 1;
            }
            r += 2;
        }
        if r < rows.end {
            let mut o = [[0f32; 1]; 1];
            for t in 0..num_tokens {
                tile::<K, 1, 1, false, TAIL, VNNI>(w, rb, r, act, t, &mut o);
                out.write(t * n + r, o[0][0]);
            }
        }
    }
}
