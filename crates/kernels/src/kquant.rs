//! Integer dot products for the K-quant super-block types (Q4_K, Q5_K, Q6_K) against
//! activations quantised to 8-bit blocks of 256 ([`ActQ8K`], ggml's `Q8_K`), and the matmul
//! driver for them.
//!
//! Owns the activation format, the portable (scalar) kernels and the canonical per-output
//! operation order; the AVX2 / AVX-512 VNNI tiles live in `kquant_avx2.rs` and follow the
//! same order bit for bit. The order is the one of llama.cpp's x86 AVX2 kernels (the build our
//! references come from). For weight row `W[r]` and token `t`, over super-blocks `b` in order:
//! ```text
//! lane[l] = Σ_{e : (e mod 32) / 4 == l} sc16[e / 16] * q[e] * x_q[e]
//!           - OFFSET * (sc16[2l] * bs16_x[2l] + sc16[2l+1] * bs16_x[2l+1])        (exact i32, l = 0..8)
//! msum    = Σ_j m[j] * bs32_x[j]                                                   (exact i32)
//! lanes:  acc[l] = fma(lane[l] as f32, d_w[b] * d_x[b], acc[l]);   y = hsum8(acc) - mins
//! flat:   acc    = fma(Σ_l lane[l] as f32, d_w[b] * d_x[b], acc);  y = acc - mins
//! ```
//! where `q` are the unsigned stored values (0..16, 0..32 or 0..64), `sc16` the integer scale of
//! each 16-element group (Q4_K/Q5_K repeat their per-32 scale), `m` the per-32 integer mins,
//! `bs16_x` / `bs32_x` the sums of 16 / 32 quantised activations and `OFFSET` 32 for Q6_K (its
//! stored values are `q - 32`), 0 otherwise. The mins (types that have them) accumulate as
//! `accm = fma(msum as f32, dmin_w[b] * d_x[b], accm)` (`mins = accm`), except in Q4_K's lane
//! order where they take four lanes, `mlane[i] = m[2i] * bs32_x[2i] + m[2i+1] * bs32_x[2i+1]`,
//! `accm[i] = fma(mlane[i] as f32, dmin_w[b] * d_x[b], accm[i])`, `mins = (accm[0] + accm[2]) +
//! (accm[1] + accm[3])`.
//!
//! Which order: Q5_K and Q6_K always use the lanes (ggml's `ggml_vec_dot_q5_K_q8_K` /
//! `_q6_K_q8_K`, Q6_K's offset subtracted through the activation sums as they do); Q4_K uses the
//! flat order when the matrix has a multiple of 8 rows (llama.cpp repacks such Q4_K matrices
//! into 8-row interleaved blocks on AVX2 CPUs, and its `ggml_gemv/gemm_q4_K_8x8_q8_K` convert one
//! exact integer per super-block), the lanes otherwise (`ggml_vec_dot_q4_K_q8_K`). The integer
//! lanes are exactly what AVX2's `maddubs` + `madd` (or VNNI's `vpdpwssd`) produce, so every
//! path gives identical results. It never allocates once its scratch has grown, and never
//! decides what a layer is.

use std::cell::RefCell;

use super::act_quant::PAR_QUANTIZE_MIN_TOKENS;
use super::vec_f32::hsum8;
use gguf::dequant::scale_min_k4;
use gguf::GgmlType;

/// Elements per K-quant super-block and per activation block.
pub const QK_K: usize = 256;

/// Activations quantised like ggml's `Q8_K`: per token and 256-element block, an f32 scale
/// `d = 1 / (-127 / max)` (`max` the signed value of largest magnitude), 256 signed bytes
/// `q = min(127, round_half_even(x * (-127 / max)))` and the sixteen sums of 16 consecutive `q`.
/// Layouts: `d`: `[num_tokens, num_blocks]`; `qs`: `[num_tokens, row_len]`; `bs16`:
/// `[num_tokens, num_blocks, 16]`.
#[derive(Debug, Default, Clone)]
pub struct ActQ8K {
    pub num_tokens: usize,
    pub num_blocks: usize,
    pub d: Vec<f32>,
    pub qs: Vec<i8>,
    pub bs16: Vec<i16>,
}

impl ActQ8K {
    /// Quantises `x` (`[num_tokens, row_len]`, `row_len` a multiple of 256, checked by the
    /// caller) into `self`, reusing its buffers.
    pub fn quantize(&mut self, x: &[f32], num_tokens: usize, row_len: usize) {
        assert!(
            row_len.is_multiple_of(QK_K) && x.len() == num_tokens * row_len,
            "caller checks shapes"
        );
        let num_blocks = row_len / QK_K;
        self.num_tokens = num_tokens;
        self.num_blocks = num_blocks;
        let total = num_tokens * num_blocks;
        self.d.resize(total, 0.0);
        self.bs16.resize(total * 16, 0);
        self.qs.resize(num_tokens * row_len, 0);
        let blocks = x.chunks_exact(QK_K).zip(self.qs.chunks_exact_mut(QK_K));
        let scales = self.d.iter_mut().zip(self.bs16.chunks_exact_mut(16));
        for ((xb, qb), (d, bs)) in blocks.zip(scales) {
            *d = quantize_block(xb, qb, bs);
        }
    }

    /// [`Self::quantize`] spread over `pool` by token ranges for steps of at least
    /// [`PAR_QUANTIZE_MIN_TOKENS`] tokens (the same blocks, each quantised by the same code, so
    /// the same result; in a prefill the quantisation otherwise runs on one thread while the
    /// others wait).
    pub(super) fn quantize_on(
        &mut self,
        pool: &super::pool::ThreadPool,
        x: &[f32],
        num_tokens: usize,
        row_len: usize,
    ) {
        if pool.num_threads() == 1 || num_tokens < PAR_QUANTIZE_MIN_TOKENS {
            return self.quantize(x, num_tokens, row_len);
        }
        assert!(
            row_len.is_multiple_of(QK_K) && x.len() == num_tokens * row_len,
            "caller checks shapes"
        );
        let nb = row_len / QK_K;
        self.num_tokens = num_tokens;
        self.num_blocks = nb;
        self.d.resize(num_tokens * nb, 0.0);
        self.bs16.resize(num_tokens * nb * 16, 0);
        self.qs.resize(num_tokens * row_len, 0);
        /// The three buffers, shared by the tasks; each task writes only its own tokens.
        struct Bufs(*mut f32, *mut i8, *mut i16);
        // SAFETY: the pointers come from `&mut` borrows of `self`'s buffers that outlive the
        // `for_each` below, and tasks write disjoint token ranges.
        unsafe impl Sync for Bufs {}
        let bufs = Bufs(
            self.d.as_mut_ptr(),
            self.qs.as_mut_ptr(),
            self.bs16.as_mut_ptr(),
        );
        let per = num_tokens.div_ceil(2 * pool.num_threads());
        pool.for_each(num_tokens.div_ceil(per), &|task| {
            let (t0, t1) = (task * per, ((task + 1) * per).min(num_tokens));
            let blocks = (t1 - t0) * nb;
            // SAFETY: tokens `t0..t1` (`t1 <= num_tokens`) lie inside the buffers resized above
            // (`nb` scales, `row_len` bytes and `16 nb` sums per token) and belong to this task
            // alone (the ranges of distinct tasks are disjoint).
            let (d, qs, bs16) = unsafe {
                let b = &bufs;
                (
                    std::slice::from_raw_parts_mut(b.0.add(t0 * nb), blocks),
                    std::slice::from_raw_parts_mut(b.1.add(t0 * row_len), blocks * QK_K),
                    std::slice::from_raw_parts_mut(b.2.add(t0 * nb * 16), blocks * 16),
                )
            };
            let xs = &x[t0 * row_len..t1 * row_len];
            let quants = xs.chunks_exact(QK_K).zip(qs.chunks_exact_mut(QK_K));
            for ((xb, qb), (db, bs)) in quants.zip(d.iter_mut().zip(bs16.chunks_exact_mut(16))) {
                *db = quantize_block(xb, qb, bs);
            }
        });
    }
}

/// ggml's `nearest_int`: round half to even via the 1.5·2^23 trick (valid for |f| < 2^22).
#[inline(always)]
fn nearest_int(f: f32) -> i32 {
    let val = f + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// One 256-element block; returns its scale `d`.
fn quantize_block(x: &[f32], q: &mut [i8], bs16: &mut [i16]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    // `f32::max` skips NaN, so a block of NaNs has `amax == 0`.
    if amax == 0.0 || !amax.is_finite() {
        q.fill(0);
        bs16.fill(0);
        return 0.0;
    }
    // ggml keeps the sign of the first element of largest magnitude.
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
    let iscale = -127.0 / max;
    for (qi, xi) in q.iter_mut().zip(x) {
        *qi = nearest_int(iscale * xi).clamp(-128, 127) as i8;
    }
    for (s, qb) in bs16.iter_mut().zip(q.chunks_exact(16)) {
        *s = qb.iter().map(|&v| i16::from(v)).sum();
    }
    1.0 / iscale
}

#[inline(always)]
fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// One K-quant super-block format (256 elements).
pub(crate) trait KQuant {
    /// Bytes per super-block.
    const BYTES: usize;
    /// Types with per-32 mins (`x = d * sc * q - dmin * m`).
    const HAS_MIN: bool;
    /// Subtracted from every stored value (32 for Q6_K, else 0).
    const OFFSET: i32;
    /// Whether the order of a matrix of this type depends on its row count (Q4_K: flat with a
    /// multiple of 8 rows, see the module doc); the other types always use the lanes.
    const FLAT_WITH_8_ROWS: bool;
    /// Whether the lane order keeps one mins accumulator (Q5_K) rather than four (Q4_K).
    const ONE_MIN_LANE: bool;
    /// `(d, dmin)` (dmin is 0 for types without mins).
    fn scales(b: &[u8]) -> (f32, f32);
    /// The 256 unsigned stored values, the 16 integer scales (one per 16 elements) and the 8
    /// integer mins (one per 32 elements; zeros for types without mins).
    fn decode(b: &[u8]) -> ([u8; QK_K], [i16; 16], [i16; 8]);
}

pub(crate) struct Q4K;
pub(crate) struct Q5K;
pub(crate) struct Q6K;

/// Q4_K/Q5_K per-32 scales repeated per 16, and mins.
fn scales_mins_k4(scales: &[u8]) -> ([i16; 16], [i16; 8]) {
    let mut sc = [0i16; 16];
    let mut m = [0i16; 8];
    for j in 0..8 {
        let (s, mj) = scale_min_k4(j, scales);
        sc[2 * j] = i16::from(s);
        sc[2 * j + 1] = i16::from(s);
        m[j] = i16::from(mj);
    }
    (sc, m)
}

impl KQuant for Q4K {
    const BYTES: usize = 144;
    const HAS_MIN: bool = true;
    const OFFSET: i32 = 0;
    const FLAT_WITH_8_ROWS: bool = true;
    const ONE_MIN_LANE: bool = false;
    fn scales(b: &[u8]) -> (f32, f32) {
        (f16_at(b, 0), f16_at(b, 2))
    }
    fn decode(b: &[u8]) -> ([u8; QK_K], [i16; 16], [i16; 8]) {
        let (sc, m) = scales_mins_k4(&b[4..16]);
        let mut v = [0u8; QK_K];
        for (n, q) in b[16..144].chunks_exact(32).enumerate() {
            for (l, &byte) in q.iter().enumerate() {
                v[64 * n + l] = byte & 0x0F;
                v[64 * n + 32 + l] = byte >> 4;
            }
        }
        (v, sc, m)
    }
}

impl KQuant for Q5K {
    const BYTES: usize = 176;
    const HAS_MIN: bool = true;
    const OFFSET: i32 = 0;
    const FLAT_WITH_8_ROWS: bool = false;
    const ONE_MIN_LANE: bool = true;
    fn scales(b: &[u8]) -> (f32, f32) {
        (f16_at(b, 0), f16_at(b, 2))
    }
    fn decode(b: &[u8]) -> ([u8; QK_K], [i16; 16], [i16; 8]) {
        let (sc, m) = scales_mins_k4(&b[4..16]);
        let qh = &b[16..48];
        let mut v = [0u8; QK_K];
        for (n, q) in b[48..176].chunks_exact(32).enumerate() {
            for (l, &byte) in q.iter().enumerate() {
                let h1 = ((qh[l] >> (2 * n)) & 1) << 4;
                let h2 = ((qh[l] >> (2 * n + 1)) & 1) << 4;
                v[64 * n + l] = (byte & 0x0F) | h1;
                v[64 * n + 32 + l] = (byte >> 4) | h2;
            }
        }
        (v, sc, m)
    }
}

impl KQuant for Q6K {
    const BYTES: usize = 210;
    const HAS_MIN: bool = false;
    const OFFSET: i32 = 32;
    const FLAT_WITH_8_ROWS: bool = false;
    const ONE_MIN_LANE: bool = false;
    fn scales(b: &[u8]) -> (f32, f32) {
        (f16_at(b, 208), 0.0)
    }
    fn decode(b: &[u8]) -> ([u8; QK_K], [i16; 16], [i16; 8]) {
        let mut v = [0u8; QK_K];
        for n in 0..2 {
            let ql = &b[64 * n..64 * n + 64];
            let qh = &b[128 + 32 * n..128 + 32 * n + 32];
            let y = &mut v[128 * n..128 * n + 128];
            for l in 0..32 {
                y[l] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
                y[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
                y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        let mut sc = [0i16; 16];
        for (s, &byte) in sc.iter_mut().zip(&b[192..208]) {
            *s = i16::from(byte as i8);
        }
        (v, sc, [0; 8])
    }
}

/// Whether a `K` matrix of `num_rows` rows takes the flat order (module doc).
pub(crate) fn flat_order<K: KQuant>(num_rows: usize) -> bool {
    K::FLAT_WITH_8_ROWS && num_rows.is_multiple_of(8)
}

/// The per-output float orders of the module doc.
pub(crate) mod order {
    /// Eight lanes (`ggml_vec_dot_*_q8_K`).
    pub const LANES: u8 = 0;
    /// One fused multiply-add per super-block (`ggml_gemv_q4_K_8x8_q8_K`).
    pub const FLAT: u8 = 1;
    /// One per 64 elements (`ggml_gemm_q4_K_8x8_q8_K`, llama.cpp's 4-token groups).
    pub const FLAT64: u8 = 2;
    /// llama.cpp's tiled K-quant matmul (`ggml-cpu/tiled`, steps of 8+ tokens over matrices it
    /// does not repack): per super-block `res = d_w · f32(Σ lanes)`, minus `dmin_w · msum`
    /// fused, then `acc = fma(res, d_x, acc)`.
    pub const TILED: u8 = 3;
}

/// llama.cpp takes its tiled K-quant matmul from this many tokens in one step on
/// (`ggml_tiled_min_batch`).
pub(crate) const TILED_MIN_TOKENS: usize = 8;

/// Scalar dot of one weight row with token `tok` of `act`, in the canonical order `ORDER` (one
/// of [`order`]) of the module doc.
pub(crate) fn dot_row_scalar<K: KQuant, const ORDER: u8>(
    w_row: &[u8],
    act: &ActQ8K,
    tok: usize,
) -> f32 {
    let nb = act.num_blocks;
    let mut acc = [0f32; 8];
    let mut accm = [0f32; 4];
    let (mut acc1, mut accm1) = (0f32, 0f32);
    for (b, blk) in w_row.chunks_exact(K::BYTES).take(nb).enumerate() {
        let ab = tok * nb + b;
        let (dw, mw) = K::scales(blk);
        let (v, sc, mins) = K::decode(blk);
        let x = &act.qs[ab * QK_K..(ab + 1) * QK_K];
        let bs16 = &act.bs16[ab * 16..ab * 16 + 16];
        let mut lanes = [0i32; 8];
        for e in 0..QK_K {
            let p = i32::from(v[e]) * i32::from(x[e]);
            lanes[(e % 32) / 4] += i32::from(sc[e / 16]) * p;
        }
        for (l, lane) in lanes.iter_mut().enumerate() {
            let s = i32::from(sc[2 * l]) * i32::from(bs16[2 * l])
                + i32::from(sc[2 * l + 1]) * i32::from(bs16[2 * l + 1]);
            *lane -= K::OFFSET * s;
        }
        let dx = act.d[ab];
        let d = dw * dx;
        let dm = mw * dx;
        let bs32 = |j: usize| i32::from(bs16[2 * j]) + i32::from(bs16[2 * j + 1]);
        let ml = |j: usize| i32::from(mins[j]) * bs32(j);
        if ORDER == order::FLAT64 {
            for c in 0..4 {
                let mut sb = 0i32;
                for e in 64 * c..64 * c + 64 {
                    sb += i32::from(sc[e / 16]) * i32::from(v[e]) * i32::from(x[e]);
                }
                acc1 = (sb as f32).mul_add(d, acc1);
                if K::HAS_MIN {
                    accm1 = ((ml(2 * c) + ml(2 * c + 1)) as f32).mul_add(dm, accm1);
                }
            }
            continue;
        }
        if ORDER == order::TILED {
            let mut res = dw * lanes.iter().sum::<i32>() as f32;
            if K::HAS_MIN {
                res = (-mw).mul_add((0..8).map(ml).sum::<i32>() as f32, res);
            }
            acc1 = res.mul_add(dx, acc1);
            continue;
        }
        if ORDER == order::FLAT {
            acc1 = (lanes.iter().sum::<i32>() as f32).mul_add(d, acc1);
        } else {
            for (a, l) in acc.iter_mut().zip(lanes) {
                *a = (l as f32).mul_add(d, *a);
            }
        }
        if K::HAS_MIN {
            if ORDER == order::FLAT || K::ONE_MIN_LANE {
                accm1 = ((0..8).map(ml).sum::<i32>() as f32).mul_add(dm, accm1);
            } else {
                for (i, a) in accm.iter_mut().enumerate() {
                    *a = ((ml(2 * i) + ml(2 * i + 1)) as f32).mul_add(dm, *a);
                }
            }
        }
    }
    if ORDER == order::TILED {
        return acc1;
    }
    let flat = ORDER != order::LANES;
    let s = if flat { acc1 } else { hsum8(&acc) };
    if !K::HAS_MIN {
        s
    } else if flat || K::ONE_MIN_LANE {
        s - accm1
    } else {
        s - ((accm[0] + accm[2]) + (accm[1] + accm[3]))
    }
}

/// Whether `ty` has a K-quant integer kernel (and so uses [`ActQ8K`] activations).
pub(super) fn is_kquant(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K)
}

thread_local! {
    /// Per-calling-thread activation scratch, reused across calls.
    static ACT_SCRATCH: RefCell<ActQ8K> = RefCell::new(ActQ8K::default());
}

/// Runs `f` with this thread's reusable activation scratch (a fresh one on re-entrant use).
pub(super) fn with_act_k_scratch(f: impl FnOnce(&mut ActQ8K)) {
    ACT_SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut act) => f(&mut act),
        Err(_) => f(&mut ActQ8K::default()),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf::{dequantize_row, quantize_row};
    use rand::{Rng, SeedableRng};

    /// Quantising over a pool gives the same buffers as on one thread.
    #[test]
    fn pooled_activation_quantisation_equals_serial() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let pool = super::super::pool::ThreadPool::new(2);
        for toks in [PAR_QUANTIZE_MIN_TOKENS, 37] {
            let row_len = 512;
            let x: Vec<f32> = (0..toks * row_len)
                .map(|_| rng.gen_range(-4.0f32..4.0))
                .collect();
            let (mut a, mut b) = (ActQ8K::default(), ActQ8K::default());
            a.quantize(&x, toks, row_len);
            b.quantize_on(&pool, &x, toks, row_len);
            assert_eq!((a.num_tokens, a.num_blocks), (b.num_tokens, b.num_blocks));
            assert_eq!(a.qs, b.qs);
            assert_eq!(a.bs16, b.bs16);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.d), bits(&b.d));
        }
    }

    #[test]
    fn activations_follow_ggml_q8_k() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let row_len = 512;
        let mut x: Vec<f32> = (0..2 * row_len)
            .map(|_| rng.gen_range(-4.0f32..4.0))
            .collect();
        x[300] = -9.0; // block 1 of token 0: the largest magnitude is negative
        x[512..768].iter_mut().for_each(|v| *v = 0.0); // an all-zero block
        let mut a = ActQ8K::default();
        a.quantize(&x, 2, row_len);
        assert_eq!((a.num_tokens, a.num_blocks), (2, 2));
        assert_eq!(a.d[1], 1.0 / (-127.0 / -9.0f32));
        assert_eq!(a.qs[300], -127);
        assert_eq!(a.d[2], 0.0);
        assert!(a.qs[512..768].iter().all(|&q| q == 0));
        for blk in 0..4 {
            let d = a.d[blk];
            for k in 0..QK_K {
                let i = blk * QK_K + k;
                let err = (f32::from(a.qs[i]) * d - x[i]).abs();
                assert!(err <= 0.5 * d.abs() * 1.0001 + 1e-7, "elem {i}");
            }
            for j in 0..16 {
                let s: i32 = a.qs[blk * QK_K + 16 * j..blk * QK_K + 16 * j + 16]
                    .iter()
                    .map(|&q| i32::from(q))
                    .sum();
                assert_eq!(i32::from(a.bs16[blk * 16 + j]), s);
            }
        }
    }

    /// The portable decode reproduces the reference dequantisation exactly:
    /// `d * sc * (q - OFFSET) - dmin * m` with ggml's float order.
    #[test]
    fn decode_matches_reference_dequantisation() {
        fn check<K: KQuant>(ty: GgmlType) {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
            let x: Vec<f32> = (0..QK_K).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let mut bytes = Vec::new();
            quantize_row(ty, &x, &mut bytes).expect("whole block");
            let mut want = vec![0f32; QK_K];
            dequantize_row(ty, &bytes, &mut want).expect("whole block");
            let (d, dmin) = K::scales(&bytes);
            let (v, sc, m) = K::decode(&bytes);
            for e in 0..QK_K {
                let q = i32::from(v[e]) - K::OFFSET;
                let got = if K::HAS_MIN {
                    (d * f32::from(sc[e / 16])) * q as f32 - dmin * f32::from(m[e / 32])
                } else {
                    d * f32::from(sc[e / 16]) * q as f32
                };
                assert_eq!(got, want[e], "{ty:?} element {e}");
            }
        }
        check::<Q4K>(GgmlType::Q4K);
        check::<Q5K>(GgmlType::Q5K);
        check::<Q6K>(GgmlType::Q6K);
    }
}
