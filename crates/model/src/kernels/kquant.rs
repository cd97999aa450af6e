//! Integer dot products for the K-quant super-block types (Q4_K, Q5_K, Q6_K) against
//! activations quantised to 8-bit blocks of 256 ([`ActQ8K`], ggml's `Q8_K`), and the matmul
//! driver for them.
//!
//! Owns the activation format, the portable (scalar) kernels and the canonical per-output
//! operation order; the AVX2 / AVX-512 VNNI tiles live in [`super::kquant_avx2`] and follow the
//! same order bit for bit. For weight row `W[r]` and token `t`, over super-blocks `b` in order:
//! ```text
//! lane[l]  = Σ_{e : (e mod 32) / 4 == l} sc16[e / 16] * (q[e] - OFFSET) * x_q[e]   (exact i32, l = 0..8)
//! acc[l]   = fma(lane[l] as f32, d_w[b] * d_x[b], acc[l])
//! mlane[i] = m[2i] * bs32_x[2i] + m[2i+1] * bs32_x[2i+1]                          (exact i32, i = 0..4)
//! accm[i]  = fma(mlane[i] as f32, dmin_w[b] * d_x[b], accm[i])                   (types with mins)
//! y[t, r]  = hsum8(acc) - ((accm[0] + accm[2]) + (accm[1] + accm[3]))
//! ```
//! where `q` are the unsigned stored values (0..16, 0..32 or 0..64), `sc16` the integer scale of
//! each 16-element group (Q4_K/Q5_K repeat their per-32 scale), `m` the per-32 integer mins and
//! `bs32_x` the sums of 32 quantised activations. The integer lanes are exactly what AVX2's
//! `maddubs` + `madd` (or VNNI's `vpdpwssd`) produce, so every path gives identical results.
//! It never allocates once its scratch has grown, and never decides what a layer is.

use std::cell::RefCell;
use std::ops::Range;

use super::matmul::{Job, OutPtr};
use super::pool::ThreadPool;
use super::vec_f32::hsum8;
use crate::gguf::dequant::scale_min_k4;
use crate::gguf::GgmlType;

/// Elements per K-quant super-block and per activation block.
pub const QK_K: usize = 256;

/// Activations quantised like ggml's `Q8_K`: per token and 256-element block, an f32 scale
/// `d = 1 / (-127 / max)` (`max` the signed value of largest magnitude), 256 signed bytes
/// `q = min(127, round_half_even(x * (-127 / max)))` and the eight sums of 32 consecutive `q`.
/// Layouts: `d`: `[num_tokens, num_blocks]`; `qs`: `[num_tokens, row_len]`; `bs32`:
/// `[num_tokens, num_blocks, 8]`.
#[derive(Debug, Default, Clone)]
pub struct ActQ8K {
    pub num_tokens: usize,
    pub num_blocks: usize,
    pub d: Vec<f32>,
    pub qs: Vec<i8>,
    pub bs32: Vec<i16>,
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
        self.bs32.resize(total * 8, 0);
        self.qs.resize(num_tokens * row_len, 0);
        let blocks = x.chunks_exact(QK_K).zip(self.qs.chunks_exact_mut(QK_K));
        let scales = self.d.iter_mut().zip(self.bs32.chunks_exact_mut(8));
        for ((xb, qb), (d, bs)) in blocks.zip(scales) {
            *d = quantize_block(xb, qb, bs);
        }
    }
}

/// ggml's `nearest_int`: round half to even via the 1.5·2^23 trick (valid for |f| < 2^22).
#[inline(always)]
fn nearest_int(f: f32) -> i32 {
    let val = f + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// One 256-element block; returns its scale `d`.
fn quantize_block(x: &[f32], q: &mut [i8], bs32: &mut [i16]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    // `f32::max` skips NaN, so a block of NaNs has `amax == 0`.
    if amax == 0.0 || !amax.is_finite() {
        q.fill(0);
        bs32.fill(0);
        return 0.0;
    }
    // ggml keeps the sign of the first element of largest magnitude.
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
    let iscale = -127.0 / max;
    for (qi, xi) in q.iter_mut().zip(x) {
        *qi = nearest_int(iscale * xi).clamp(-128, 127) as i8;
    }
    for (s, qb) in bs32.iter_mut().zip(q.chunks_exact(32)) {
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

/// Scalar dot of one weight row with token `tok` of `act`, in the canonical order of the module
/// doc.
pub(crate) fn dot_row_scalar<K: KQuant>(w_row: &[u8], act: &ActQ8K, tok: usize) -> f32 {
    let nb = act.num_blocks;
    let mut acc = [0f32; 8];
    let mut accm = [0f32; 4];
    for (b, blk) in w_row.chunks_exact(K::BYTES).take(nb).enumerate() {
        let ab = tok * nb + b;
        let (dw, mw) = K::scales(blk);
        let (v, sc, mins) = K::decode(blk);
        let x = &act.qs[ab * QK_K..(ab + 1) * QK_K];
        let mut lanes = [0i32; 8];
        for e in 0..QK_K {
            let p = (i32::from(v[e]) - K::OFFSET) * i32::from(x[e]);
            lanes[(e % 32) / 4] += i32::from(sc[e / 16]) * p;
        }
        let dx = act.d[ab];
        let d = dw * dx;
        for (a, l) in acc.iter_mut().zip(lanes) {
            *a = (l as f32).mul_add(d, *a);
        }
        if K::HAS_MIN {
            let dm = mw * dx;
            let bs = &act.bs32[ab * 8..ab * 8 + 8];
            for (i, a) in accm.iter_mut().enumerate() {
                let ml = i32::from(mins[2 * i]) * i32::from(bs[2 * i])
                    + i32::from(mins[2 * i + 1]) * i32::from(bs[2 * i + 1]);
                *a = (ml as f32).mul_add(dm, *a);
            }
        }
    }
    let s = hsum8(&acc);
    if K::HAS_MIN {
        s - ((accm[0] + accm[2]) + (accm[1] + accm[3]))
    } else {
        s
    }
}

/// Whether `ty` has a K-quant integer kernel (and so uses [`ActQ8K`] activations).
pub(super) fn is_kquant(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K)
}

/// Kernel set of one K-quant type on this architecture.
#[cfg(target_arch = "x86_64")]
trait Kernel: super::kquant_avx2::KQuantAvx2 {}
#[cfg(target_arch = "x86_64")]
impl<K: super::kquant_avx2::KQuantAvx2> Kernel for K {}
#[cfg(not(target_arch = "x86_64"))]
trait Kernel: KQuant {}
#[cfg(not(target_arch = "x86_64"))]
impl<K: KQuant> Kernel for K {}

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

impl Job<'_> {
    /// The whole matmul for a K-quant weight: quantise `x` once, then one pool task per row range.
    pub(super) fn run_kquant(&self, pool: &ThreadPool, x: &[f32], out: &OutPtr) {
        with_act_k_scratch(|act| {
            act.quantize(x, self.num_tokens, self.w.row_len);
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
        #[cfg(target_arch = "x86_64")]
        if self.features.avx2 {
            // SAFETY: `features` was clamped to the detected CPU features, so AVX2+FMA+F16C (and
            // AVX-512 VNNI+VL when `vnni`) exist.
            unsafe {
                if self.features.vnni {
                    self.rows_kquant_avx2::<K, true>(act, rows, out)
                } else {
                    self.rows_kquant_avx2::<K, false>(act, rows, out)
                }
            };
            return;
        }
        let num_rows = self.w.num_rows;
        for r in rows {
            let w_row = &self.w.data[r * self.row_bytes..(r + 1) * self.row_bytes];
            for t in 0..self.num_tokens {
                out.write(t * num_rows + r, dot_row_scalar::<K>(w_row, act, t));
            }
        }
    }

    /// Row range in register tiles: 1 token × 4 rows with prefetch for decode, 4 tokens × 2 rows
    /// for batches (each weight super-block decoded once per 4 tokens).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn rows_kquant_avx2<K: Kernel, const VNNI: bool>(
        &self,
        act: &ActQ8K,
        rows: Range<usize>,
        out: &OutPtr,
    ) {
        /// One tile on the path `VNNI` selects (same results either way).
        #[inline(always)]
        fn tile<K: Kernel, const T: usize, const R: usize, const PF: bool, const VNNI: bool>(
            w: &[u8],
            row_bytes: usize,
            row0: usize,
            act: &ActQ8K,
            tok0: usize,
            out: &mut [[f32; R]; T],
        ) {
            use super::kquant_avx2 as k;
            // SAFETY: only reached from `rows_kquant`, which checked AVX2+FMA+F16C and, for
            // `VNNI`, AVX-512 VNNI+VL on this CPU.
            unsafe {
                if VNNI {
                    k::tile_vnni::<K, T, R, PF>(w, row_bytes, row0, act, tok0, out)
                } else {
                    k::tile::<K, T, R, PF>(w, row_bytes, row0, act, tok0, out)
                }
            }
        }
        let (w, rb, n) = (self.w.data, self.row_bytes, self.w.num_rows);
        let num_tokens = self.num_tokens;
        let mut r = rows.start;
        if num_tokens == 1 {
            let mut o = [[0f32; 4]; 1];
            while r + 4 <= rows.end {
                tile::<K, 1, 4, true, VNNI>(w, rb, r, act, 0, &mut o);
                (0..4).for_each(|i| out.write(r + i, o[0][i]));
                r += 4;
            }
            let mut o = [[0f32; 1]; 1];
            while r < rows.end {
                tile::<K, 1, 1, true, VNNI>(w, rb, r, act, 0, &mut o);
                out.write(r, o[0][0]);
                r += 1;
            }
            return;
        }
        while r + 2 <= rows.end {
            let mut t = 0;
            let mut o4 = [[0f32; 2]; 4];
            while t + 4 <= num_tokens {
                tile::<K, 4, 2, false, VNNI>(w, rb, r, act, t, &mut o4);
                for (dt, row) in o4.iter().enumerate() {
                    out.write((t + dt) * n + r, row[0]);
                    out.write((t + dt) * n + r + 1, row[1]);
                }
                t += 4;
            }
            let mut o1 = [[0f32; 2]; 1];
            while t < num_tokens {
                tile::<K, 1, 2, false, VNNI>(w, rb, r, act, t, &mut o1);
                out.write(t * n + r, o1[0][0]);
                out.write(t * n + r + 1, o1[0][1]);
                t += 1;
            }
            r += 2;
        }
        if r < rows.end {
            let mut o = [[0f32; 1]; 1];
            for t in 0..num_tokens {
                tile::<K, 1, 1, false, VNNI>(w, rb, r, act, t, &mut o);
                out.write(t * n + r, o[0][0]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{dequantize_row, quantize_row};
    use rand::{Rng, SeedableRng};

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
            for j in 0..8 {
                let s: i32 = a.qs[blk * QK_K + 32 * j..blk * QK_K + 32 * j + 32]
                    .iter()
                    .map(|&q| i32::from(q))
                    .sum();
                assert_eq!(i32::from(a.bs32[blk * 8 + j]), s);
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
