//! Quantised matrix × activations: `y[t, r] = dot(W[r, :], x[t, :])`.
//!
//! Shapes: `W` is `[num_rows (out features), row_len (in features)]` in its GGUF encoding,
//! `x` is `[num_tokens, row_len]` f32, `y` is `[num_tokens, num_rows]` f32.
//!
//! Owns the driver: shape checks, quantising the activations once per call (into a reused
//! thread-local [`ActQ8`]), splitting rows into contiguous ranges (one pool task each, so every
//! thread streams its own slice of the weights), and walking each range in register tiles
//! (1 token × 4 rows for decode, with software prefetch of the weight stream; 4 tokens × 2 rows
//! for batches, so a weight block is decoded once per 4 tokens). The K-quants go to
//! [`super::kquant`] (same driver shape, 256-element activation blocks); float types take the
//! "convert row to f32, then `dot_f32`" path. Every output element follows one fixed
//! operation sequence, whatever the batch, tile or thread split (see the `kernels` module doc).
//! It never allocates per task.

use std::cell::RefCell;
use std::ops::Range;

use super::act_quant::ActQ8;
use super::block32::{dot_row_scalar, Block32, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::cpu::{cpu_features, CpuFeatures};
use super::out_ptr::OutPtr;
use super::packed32::{self, Packed32, PackedDef};
use super::packed32_run;
use super::pool::ThreadPool;
use super::row_f32::row_to_f32;
use super::vec_f32::dot_f32_with;
use super::KernelError;
use gguf::GgmlType;

/// A weight matrix borrowed in its on-disk encoding (rows contiguous, `row_len` elements each).
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    /// Output features.
    pub num_rows: usize,
    /// Input features (elements per row).
    pub row_len: usize,
    /// `num_rows * ty.row_bytes(row_len)` bytes.
    pub data: &'a [u8],
    /// The same matrix repacked row-interleaved ([`Packed32`]); when present the kernels use it
    /// (and its canonical operation sequence) instead of `data`.
    pub packed: Option<&'a Packed32>,
}

impl QMatrix<'_> {
    /// Bytes per row, after checking the whole shape against `data`.
    pub fn checked_row_bytes(&self) -> Result<usize, KernelError> {
        let row_bytes =
            self.ty
                .row_bytes(self.row_len)
                .ok_or(KernelError::RowLenNotBlockMultiple {
                    ty: self.ty,
                    row_len: self.row_len,
                    block_elems: self.ty.block_elems(),
                })?;
        let expected = row_bytes
            .checked_mul(self.num_rows)
            .ok_or(KernelError::Overflow)?;
        if self.data.len() != expected {
            return Err(KernelError::WeightBytes {
                ty: self.ty,
                num_rows: self.num_rows,
                expected,
                actual: self.data.len(),
            });
        }
        Ok(row_bytes)
    }
}

/// Which float order the products follow: for K-quant matrices, where llama.cpp's own order
/// depends on the token's place in the step (Q4_K matrices with a multiple of 8 rows, which
/// llama.cpp repacks: see [`super::kquant`]); for packed Q4_0 / Q4_1 / Q5_0 / Q8_0 matrices,
/// which [`PackedDef`] they take. Every other product is the same whatever the choice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MatmulArith {
    /// Every token in one order whatever the batch (the batch invariance the engine relies
    /// on): K-quants in the order llama.cpp gives a step of one token (decode), packed matrices
    /// in [`PackedDef::invariant`] (`BlockSum`, the same on every CPU).
    #[default]
    Invariant,
    /// As `Invariant`, but packed matrices in ggml's order ([`PackedDef::Ggml`]) on every
    /// machine: llama.cpp's decode arithmetic for every token (the engine's and `generate`'s
    /// llama.cpp-fidelity mode).
    InvariantGgml,
    /// llama.cpp's: K-quant tokens `0..n - n % 4` of an `n`-token step in the order of its
    /// 4-token groups, the rest as `InvariantGgml` (for reproductions of llama.cpp: perplexity,
    /// reference tests; results then depend on how tokens are batched).
    LlamaCpp,
}

impl MatmulArith {
    /// The definition packed matrices take in this arithmetic.
    pub fn packed_def(self) -> PackedDef {
        match self {
            MatmulArith::Invariant => PackedDef::invariant(),
            MatmulArith::InvariantGgml | MatmulArith::LlamaCpp => PackedDef::Ggml,
        }
    }

    /// The definition a packed matrix of type `ty` with `num_rows` rows takes: [`Self::packed_def`],
    /// except that in llama.cpp's arithmetic a Q4_0 matrix of a multiple of 8 rows takes
    /// `BlockSum` — llama.cpp repacks those on AVX2 CPUs (`q4_0_8x8`), and its kernels for them
    /// (`ggml_gemv/gemm_q4_0_8x8_q8_0`, every batch size) sum each block's products exactly and
    /// take one fused multiply-add per block with the scale `d_w · d_x`: that definition.
    pub fn packed_def_for(self, ty: GgmlType, num_rows: usize) -> PackedDef {
        match self {
            MatmulArith::InvariantGgml | MatmulArith::LlamaCpp
                if ty == GgmlType::Q4_0 && num_rows.is_multiple_of(8) =>
            {
                PackedDef::BlockSum
            }
            _ => self.packed_def(),
        }
    }
}

/// `y[t, r] = dot(W[r, :], x[t, :])` on the pool, with the process-wide CPU features.
pub fn matmul(
    pool: &ThreadPool,
    w: &QMatrix,
    x: &[f32],
    num_tokens: usize,
    y: &mut [f32],
) -> Result<(), KernelError> {
    matmul_with_features(pool, w, x, num_tokens, y, cpu_features())
}

/// [`matmul`] on an explicit path (`features` is clamped to what the CPU has). Both paths give
/// bit-identical results.
pub fn matmul_with_features(
    pool: &ThreadPool,
    w: &QMatrix,
    x: &[f32],
    num_tokens: usize,
    y: &mut [f32],
    features: CpuFeatures,
) -> Result<(), KernelError> {
    matmul_impl(pool, w, x, num_tokens, y, features, MatmulArith::Invariant)
}

/// [`matmul`] in the arithmetic `arith` selects.
pub fn matmul_with_arith(
    pool: &ThreadPool,
    w: &QMatrix,
    x: &[f32],
    num_tokens: usize,
    y: &mut [f32],
    arith: MatmulArith,
) -> Result<(), KernelError> {
    matmul_impl(pool, w, x, num_tokens, y, cpu_features(), arith)
}

/// [`matmul_with_features`] with packed matrices in the definition `def` (tests of both
/// definitions on any machine).
#[cfg(test)]
pub(super) fn matmul_with_def(
    pool: &ThreadPool,
    w: &QMatrix,
    x: &[f32],
    num_tokens: usize,
    y: &mut [f32],
    features: CpuFeatures,
    def: PackedDef,
) -> Result<(), KernelError> {
    let arith = MatmulArith::Invariant;
    let Some((mut job, out)) = prepare(w, x, num_tokens, y, features, arith)? else {
        return Ok(());
    };
    job.packed_def = def;
    job.run(pool, x, &out);
    Ok(())
}

pub(super) fn matmul_impl(
    pool: &ThreadPool,
    w: &QMatrix,
    x: &[f32],
    num_tokens: usize,
    y: &mut [f32],
    features: CpuFeatures,
    arith: MatmulArith,
) -> Result<(), KernelError> {
    if let Some((job, out)) = prepare(w, x, num_tokens, y, features, arith)? {
        job.run(pool, x, &out);
    }
    Ok(())
}

impl Job<'_> {
    /// Runs a prepared job on its kernel family.
    fn run(&self, pool: &ThreadPool, x: &[f32], out: &OutPtr) {
        let (job, w, out) = (self, &self.w, out);
        if let Some(p) = w.packed {
            job.run_packed(pool, p, x, out);
            return;
        }
        match w.ty {
            GgmlType::Q4_0 => job.run_quantized::<Q4_0>(pool, x, out),
            GgmlType::Q4_1 => job.run_quantized::<Q4_1>(pool, x, out),
            GgmlType::Q5_0 => job.run_quantized::<Q5_0>(pool, x, out),
            GgmlType::Q5_1 => job.run_quantized::<Q5_1>(pool, x, out),
            GgmlType::Q8_0 => job.run_quantized::<Q8_0>(pool, x, out),
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => job.run_kquant(pool, x, out),
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => job.run_float_rows(pool, x, out),
        }
    }
}

/// Checks `w`, `x` and `y` against each other; `None` when there is nothing to compute.
pub(super) fn prepare<'a>(
    w: &QMatrix<'a>,
    x: &[f32],
    num_tokens: usize,
    y: &mut [f32],
    features: CpuFeatures,
    arith: MatmulArith,
) -> Result<Option<(Job<'a>, OutPtr)>, KernelError> {
    let row_bytes = w.checked_row_bytes()?;
    if let Some(p) = w.packed {
        if p.ty() != w.ty || p.num_rows() != w.num_rows || p.row_len() != w.row_len {
            return Err(KernelError::PackedMismatch {
                ty: w.ty,
                num_rows: w.num_rows,
                row_len: w.row_len,
            });
        }
    }
    let x_len = num_tokens
        .checked_mul(w.row_len)
        .ok_or(KernelError::Overflow)?;
    if x.len() != x_len {
        return Err(KernelError::ActivationLen {
            expected: x_len,
            actual: x.len(),
        });
    }
    let y_len = num_tokens
        .checked_mul(w.num_rows)
        .ok_or(KernelError::Overflow)?;
    if y.len() != y_len {
        return Err(KernelError::OutputLen {
            expected: y_len,
            actual: y.len(),
        });
    }
    if num_tokens == 0 || w.num_rows == 0 {
        return Ok(None);
    }
    let job = Job {
        w: *w,
        row_bytes,
        num_tokens,
        features: features.clamp_to_detected(),
        ggml_groups: arith == MatmulArith::LlamaCpp,
        packed_def: arith.packed_def_for(w.ty, w.num_rows),
    };
    let out = OutPtr::new(y);
    Ok(Some((job, out)))
}

/// Whether `ty` has an integer block kernel (and so uses quantised activations).
pub(super) fn is_block32(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
    )
}

/// Kernel set of one 32-element block type on this architecture.
#[cfg(target_arch = "x86_64")]
trait Kernel: super::block32::avx2::Block32Avx2 {}
#[cfg(target_arch = "x86_64")]
impl<B: super::block32::avx2::Block32Avx2> Kernel for B {}
#[cfg(not(target_arch = "x86_64"))]
trait Kernel: Block32 {}
#[cfg(not(target_arch = "x86_64"))]
impl<B: Block32> Kernel for B {}

thread_local! {
    /// Per-calling-thread activation scratch, reused across calls.
    static ACT_SCRATCH: RefCell<ActQ8> = RefCell::new(ActQ8::default());
    /// Per-thread f32 row buffer for the conversion path.
    static ROW_SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's reusable activation scratch (a fresh one on re-entrant use, e.g. a
/// matmul inside a pool task).
pub(super) fn with_act_scratch(f: impl FnOnce(&mut ActQ8)) {
    ACT_SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut act) => f(&mut act),
        Err(_) => f(&mut ActQ8::default()),
    });
}

pub(super) struct Job<'a> {
    pub(super) w: QMatrix<'a>,
    pub(super) row_bytes: usize,
    pub(super) num_tokens: usize,
    pub(super) features: CpuFeatures,
    /// K-quant matrices that llama.cpp repacks take its 4-token-group order for tokens
    /// `0..n - n % 4` (see `kquant`'s module doc).
    pub(super) ggml_groups: bool,
    /// The definition a packed matrix's outputs take.
    pub(super) packed_def: PackedDef,
}

impl Job<'_> {
    pub(super) fn num_rows(&self) -> usize {
        self.w.num_rows
    }

    pub(super) fn row_len(&self) -> usize {
        self.w.row_len
    }

    pub(super) fn features(&self) -> CpuFeatures {
        self.features
    }

    /// [`Self::rows_block32`] for the job's weight type, which must be [`is_block32`].
    pub(super) fn rows_block32_any(&self, act: &ActQ8, rows: Range<usize>, out: &OutPtr) {
        match self.w.ty {
            GgmlType::Q4_0 => self.rows_block32::<Q4_0>(act, rows, out),
            GgmlType::Q4_1 => self.rows_block32::<Q4_1>(act, rows, out),
            GgmlType::Q5_0 => self.rows_block32::<Q5_0>(act, rows, out),
            GgmlType::Q5_1 => self.rows_block32::<Q5_1>(act, rows, out),
            GgmlType::Q8_0 => self.rows_block32::<Q8_0>(act, rows, out),
            other => {
                unreachable!("rows_block32_any called for {other:?}, which has no block kernel")
            }
        }
    }

    /// Contiguous row ranges, about 4 per thread (rows rounded to the tile height):
    /// `(num_tasks, rows_per_task)`.
    pub(super) fn split(&self, pool: &ThreadPool) -> (usize, usize) {
        let num_rows = self.w.num_rows;
        if pool.num_threads() == 1 {
            return (1, num_rows);
        }
        let target_tasks = pool.num_threads() * 4;
        let rows_per_task = num_rows.div_ceil(target_tasks).next_multiple_of(4).max(4);
        (num_rows.div_ceil(rows_per_task), rows_per_task)
    }

    /// A packed matrix: activations quantised once, groups of 16 rows split over the pool.
    fn run_packed(&self, pool: &ThreadPool, p: &Packed32, x: &[f32], out: &OutPtr) {
        with_act_scratch(|act: &mut ActQ8| {
            act.quantize_on(pool, self.features, x, self.num_tokens, self.w.row_len);
            let act = &*act;
            if packed32::claims_from_both_ends(self.num_tokens) {
                super::both_ends::for_each_chunk(pool, p.num_groups(), &|groups| {
                    packed32_run::run_groups(p, self.features, self.packed_def, act, groups, out)
                });
                return;
            }
            let (num_tasks, per) = packed32::split(p, pool, self.num_tokens);
            pool.for_each(num_tasks, &|task| {
                let start = task * per;
                let groups = start..(start + per).min(p.num_groups());
                packed32_run::run_groups(p, self.features, self.packed_def, act, groups, out);
            });
        });
    }

    fn run_quantized<B: Kernel>(&self, pool: &ThreadPool, x: &[f32], out: &OutPtr) {
        let run = |act: &mut ActQ8| {
            act.quantize_on(pool, self.features, x, self.num_tokens, self.w.row_len);
            let act = &*act;
            let (num_tasks, rows_per_task) = self.split(pool);
            pool.for_each(num_tasks, &|task| {
                let start = task * rows_per_task;
                let rows = start..(start + rows_per_task).min(self.w.num_rows);
                self.rows_block32::<B>(act, rows, out);
            });
        };
        with_act_scratch(run);
    }

    fn rows_block32<B: Kernel>(&self, act: &ActQ8, rows: Range<usize>, out: &OutPtr) {
        #[cfg(target_arch = "x86_64")]
        if self.features.avx2 {
            // SAFETY: `features` was clamped to the detected CPU features, so AVX2+FMA+F16C (and
            // AVX-512 VNNI+VL when `vnni`, AVX-VNNI when `avxvnni`) exist.
            unsafe {
                if self.features.vnni {
                    self.rows_block32_avx2::<B, DOT_VNNI512>(act, rows, out)
                } else if self.features.avxvnni {
                    self.rows_block32_avx2::<B, DOT_AVXVNNI>(act, rows, out)
                } else {
                    self.rows_block32_avx2::<B, DOT_MADD>(act, rows, out)
                }
            };
            return;
        }
        let num_rows = self.w.num_rows;
        for r in rows {
            let w_row = &self.w.data[r * self.row_bytes..(r + 1) * self.row_bytes];
            for t in 0..self.num_tokens {
                out.write(t * num_rows + r, dot_row_scalar::<B>(w_row, act, t));
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn rows_block32_avx2<B: Kernel, const DOT: u8>(
        &self,
        act: &ActQ8,
        rows: Range<usize>,
        out: &OutPtr,
    ) {
        /// One tile on the integer-dot path `DOT` selects (same results on every path).
        #[inline(always)]
        fn tile<B: Kernel, const T: usize, const R: usize, const PF: bool, const DOT: u8>(
            w: &[u8],
            row_bytes: usize,
            row0: usize,
            act: &ActQ8,
            tok0: usize,
            out: &mut [[f32; R]; T],
        ) {
            use super::block32::avx2;
            // SAFETY: only reached from `rows_block32`, which checked AVX2+FMA+F16C and, for
            // `DOT_VNNI512`, AVX-512 VNNI+VL, for `DOT_AVXVNNI`, AVX-VNNI, on this CPU.
            unsafe {
                match DOT {
                    DOT_VNNI512 => {
                        avx2::tile_vnni::<B, T, R, PF>(w, row_bytes, row0, act, tok0, out)
                    }
                    DOT_AVXVNNI => {
                        avx2::tile_avxvnni::<B, T, R, PF>(w, row_bytes, row0, act, tok0, out)
                    }
                    _ => avx2::tile::<B, T, R, PF>(w, row_bytes, row0, act, tok0, out),
                }
            }
        }
        let (w, rb, n) = (self.w.data, self.row_bytes, self.w.num_rows);
        let num_tokens = self.num_tokens;
        let mut r = rows.start;
        if num_tokens == 1 {
            let mut o = [[0f32; 4]; 1];
            while r + 4 <= rows.end {
                tile::<B, 1, 4, true, DOT>(w, rb, r, act, 0, &mut o);
                (0..4).for_each(|i| out.write(r + i, o[0][i]));
                r += 4;
            }
            let mut o = [[0f32; 1]; 1];
            while r < rows.end {
                tile::<B, 1, 1, true, DOT>(w, rb, r, act, 0, &mut o);
                out.write(r, o[0][0]);
                r += 1;
            }
            return;
        }
        while r + 2 <= rows.end {
            let mut t = 0;
            let mut o4 = [[0f32; 2]; 4];
            while t + 4 <= num_tokens {
                tile::<B, 4, 2, false, DOT>(w, rb, r, act, t, &mut o4);
                for (dt, row) in o4.iter().enumerate() {
                    out.write((t + dt) * n + r, row[0]);
                    out.write((t + dt) * n + r + 1, row[1]);
                }
                t += 4;
            }
            let mut o1 = [[0f32; 2]; 1];
            while t < num_tokens {
                tile::<B, 1, 2, false, DOT>(w, rb, r, act, t, &mut o1);
                out.write(t * n + r, o1[0][0]);
                out.write(t * n + r + 1, o1[0][1]);
                t += 1;
            }
            r += 2;
        }
        if r < rows.end {
            let mut o = [[0f32; 1]; 1];
            for t in 0..num_tokens {
                tile::<B, 1, 1, false, DOT>(w, rb, r, act, t, &mut o);
                out.write(t * n + r, o[0][0]);
            }
        }
    }

    pub(super) fn run_float_rows(&self, pool: &ThreadPool, x: &[f32], out: &OutPtr) {
        let (num_tasks, rows_per_task) = self.split(pool);
        let (row_len, num_rows) = (self.w.row_len, self.w.num_rows);
        pool.for_each(num_tasks, &|task| {
            let start = task * rows_per_task;
            let rows = start..(start + rows_per_task).min(num_rows);
            let work = |buf: &mut Vec<f32>| {
                buf.resize(row_len, 0.0);
                for r in rows.clone() {
                    let src = &self.w.data[r * self.row_bytes..(r + 1) * self.row_bytes];
                    row_to_f32(self.features, self.w.ty, src, buf);
                    for t in 0..self.num_tokens {
                        let xt = &x[t * row_len..(t + 1) * row_len];
                        out.write(t * num_rows + r, dot_f32_with(self.features, buf, xt));
                    }
                }
            };
            ROW_SCRATCH.with(|cell| match cell.try_borrow_mut() {
                Ok(mut buf) => work(&mut buf),
                Err(_) => work(&mut Vec::new()),
            });
        });
    }
}

// Silences "unused" for the scalar-only trait bound on non-x86 targets.
#[allow(dead_code)]
fn _assert_block32<B: Block32>() {}

/// The integer dot products of the AVX2 block kernels (`rows_block32_avx2`'s `DOT`): AVX2's
/// `maddubs`+`madd`, AVX-512 VNNI's or AVX-VNNI's `vpdpbusd` (all give the same sums).
const DOT_MADD: u8 = 0;
const DOT_VNNI512: u8 = 1;
const DOT_AVXVNNI: u8 = 2;
