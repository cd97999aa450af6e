//! llama.cpp's tiled CPU flash attention (`ggml_compute_forward_flash_attn_ext_tiled` in
//! `ggml-cpu/ops.cpp`, which it runs for every row of a step of at least 64 query tokens: prompt
//! prefill, `llama-perplexity`) for one query row over f16 K/V, operation for operation as its
//! x86 AVX2 build performs it — the build whose outputs our references come from (the AVX-512
//! build sums some of these in another order, see docs/history/benchmarks-log.md "Fidelity").
//!
//! The arithmetic for a row with f32 query `q` attending positions `first..end`: K/V positions
//! are visited in tiles of [`KV_TILE`] aligned to position 0 (one sequence's cache cells); tiles
//! without an attended position are skipped. Per tile:
//! 1. `s[t] = Σ_dk fma(k[t][dk], q[dk], ·)` — one fused multiply-add chain in `dk` order from 0
//!    (its `simd_gemm`, lanes = positions), then `s[t] *= scale`; unattended slots are `-inf`;
//! 2. `M' = max(M, max_t s[t])`; when `M' > M`: `ms = expf(M − M')` (libm), `acc *= ms`,
//!    `S *= ms`;
//! 3. `p[t] = ggml_v_expf(s[t] − M')` (its AVX2 polynomial, reproduced lane for lane by
//!    [`ggml_expf`]); `S = f32(f64(S) + Σ_g f64(hsum8(p[8g..8g+8])))` with its 8-lane horizontal
//!    sum `((p0+p4)+(p2+p6)) + ((p1+p5)+(p3+p7))`;
//! 4. `acc[e] = fma(v[t][e], p[t], acc[e])` for `t` in order (unattended slots add `0·v`, a no-op).
//!
//! At the end `out = acc · (1/S)`. A row's result depends only on its query, its K/V and its
//! position range, never on the other rows of the step ([`attend_rows`] runs many rows of one
//! KV head together, widening each K/V tile once, with each row's result unchanged; [`attend_row`]
//! is it for one row). It never reads a KV store and never parallelises. With AVX-512 it runs
//! an AVX-512-compiled copy of the portable code (bit-identical: `mul_add` is always fused and
//! every operation is per lane); with AVX2+FMA (and `head_dim % 8 == 0`) the explicit kernel
//! of [`avx2`](self::avx2), which blocks rows in registers and keeps each row's operations and
//! their order (bit-identical, tested against the portable code); an AVX2+FMA-compiled copy of
//! the portable code for other head sizes; the portable code otherwise.

use half::f16;

use crate::CpuFeatures;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Positions per K/V tile (`GGML_FA_TILE_KV`).
pub const KV_TILE: usize = 64;

/// Reusable buffers of one worker for [`attend_row`].
#[derive(Debug, Default)]
pub struct TiledScratch(RowsScratch);

/// `out = softmax(q·Kᵀ·scale)·V` over positions `first..end` in llama.cpp's tiled arithmetic.
/// `k`, `v`: f16 rows of positions `first..end` (`[end − first, head_dim]`); `q`, `out`:
/// `[head_dim]`. [`attend_rows`] with one row. Panics on inconsistent shapes (a caller bug).
#[allow(clippy::too_many_arguments)]
pub fn attend_row(
    features: CpuFeatures,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    first: usize,
    end: usize,
    scale: f32,
    scratch: &mut TiledScratch,
    out: &mut [f32],
) {
    let hd = q.len();
    assert!(first < end, "a query attends at least itself");
    assert!(k.len() == (end - first) * hd && v.len() == k.len() && out.len() == hd);
    attend_rows(
        features,
        q,
        k,
        v,
        first,
        &[(first, end)],
        scale,
        &mut scratch.0,
        out,
    );
}

/// Reusable buffers of [`attend_rows`].
#[derive(Debug, Default)]
pub struct RowsScratch {
    /// K of one tile, transposed and widened: `[head_dim, KV_TILE]`.
    kt: Vec<f32>,
    /// V of one tile, widened: `[KV_TILE, head_dim]`.
    vt: Vec<f32>,
    /// Scores, then softmax weights, of one row and tile: `[KV_TILE]`.
    s: Vec<f32>,
    /// Per row: the f32 accumulator `[rows, head_dim]`, running maximum and sum.
    acc: Vec<f32>,
    m: Vec<f32>,
    sum: Vec<f32>,
}

/// [`attend_row`] for many rows over the same K/V (one KV head of one sequence), each tile of
/// K/V widened once for all of them: row `r` (query `q[r·hd..]`) attends positions
/// `ranges[r].0..ranges[r].1`; `k`, `v` hold positions `base..` (`[*, head_dim]` f16 rows,
/// covering every range). Row `r`'s result, written to `out[r·hd..]`, is bit-identical to
/// `attend_row` on that row alone (widening f16 is exact and each row's operations and their
/// order are unchanged). Panics on inconsistent shapes (a caller bug).
#[allow(clippy::too_many_arguments)]
pub fn attend_rows(
    features: CpuFeatures,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    base: usize,
    ranges: &[(usize, usize)],
    scale: f32,
    scratch: &mut RowsScratch,
    out: &mut [f32],
) {
    let rows = ranges.len();
    if rows == 0 {
        return;
    }
    let hd = q.len() / rows;
    assert!(q.len() == rows * hd && out.len() == q.len() && hd > 0);
    assert!(k.len() == v.len() && k.len().is_multiple_of(hd));
    let avail = base + k.len() / hd;
    for &(first, end) in ranges {
        assert!(
            base <= first && first < end && end <= avail,
            "range {first}..{end} outside {base}..{avail}"
        );
    }
    scratch.kt.resize(hd * KV_TILE, 0.0);
    scratch.vt.resize(KV_TILE * hd, 0.0);
    scratch.s.resize(KV_TILE, 0.0);
    scratch.acc.resize(rows * hd, 0.0);
    scratch.m.resize(rows, 0.0);
    scratch.sum.resize(rows, 0.0);
    #[cfg(target_arch = "x86_64")]
    {
        let features = features.clamp_to_detected();
        if features.avx512 {
            // SAFETY: AVX-512 F+VL on top of AVX2+FMA+F16C was checked at runtime just above.
            unsafe { attend_rows_avx512(q, k, v, base, ranges, scale, scratch, out) };
            return;
        }
        if features.avx2 && hd.is_multiple_of(8) {
            // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above; the shapes
            // were checked and the scratch sized above.
            unsafe { avx2::attend_rows(q, k, v, base, ranges, scale, scratch, out) };
            return;
        }
        if features.avx2 {
            // SAFETY: AVX2+FMA+F16C presence was checked at runtime just above.
            unsafe { attend_rows_fma(q, k, v, base, ranges, scale, scratch, out) };
            return;
        }
    }
    let _ = features;
    attend_rows_body(q, k, v, base, ranges, scale, scratch, out);
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
fn attend_rows_fma(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    base: usize,
    ranges: &[(usize, usize)],
    scale: f32,
    scratch: &mut RowsScratch,
    out: &mut [f32],
) {
    attend_rows_body(q, k, v, base, ranges, scale, scratch, out)
}

/// The same code with 512-bit vectors available: every operation is per lane (a score per
/// position, an accumulator element per dimension) or an explicit scalar sum, so the width
/// changes no result.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
fn attend_rows_avx512(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    base: usize,
    ranges: &[(usize, usize)],
    scale: f32,
    scratch: &mut RowsScratch,
    out: &mut [f32],
) {
    attend_rows_body(q, k, v, base, ranges, scale, scratch, out)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_rows_body(
    q: &[f32],
    k: &[f16],
    v: &[f16],
    base: usize,
    ranges: &[(usize, usize)],
    scale: f32,
    scratch: &mut RowsScratch,
    out: &mut [f32],
) {
    let rows = ranges.len();
    let hd = q.len() / rows;
    let RowsScratch {
        kt,
        vt,
        s,
        acc,
        m,
        sum,
    } = scratch;
    let (kt, vt, s) = (
        &mut kt[..hd * KV_TILE],
        &mut vt[..KV_TILE * hd],
        &mut s[..KV_TILE],
    );
    let (acc, m, sum) = (&mut acc[..rows * hd], &mut m[..rows], &mut sum[..rows]);
    acc.fill(0.0);
    m.fill(f32::NEG_INFINITY);
    sum.fill(0.0);
    let lo_all = ranges.iter().map(|r| r.0).min().expect("rows");
    let hi_all = ranges.iter().map(|r| r.1).max().expect("rows");
    let mut tile = lo_all / KV_TILE * KV_TILE;
    while tile < hi_all {
        // The tile's K (transposed) and V, widened once for every row.
        let (tlo, thi) = (lo_all.max(tile), hi_all.min(tile + KV_TILE));
        for p in tlo..thi {
            let krow = &k[(p - base) * hd..(p - base + 1) * hd];
            for (dk, &x) in krow.iter().enumerate() {
                kt[dk * KV_TILE + (p - tile)] = x.to_f32();
            }
            let vrow = &v[(p - base) * hd..(p - base + 1) * hd];
            for (o, &x) in vt[(p - tile) * hd..(p - tile + 1) * hd]
                .iter_mut()
                .zip(vrow)
            {
                *o = x.to_f32();
            }
        }
        for (r, &(first, end)) in ranges.iter().enumerate() {
            let (lo, hi) = (first.max(tile), end.min(tile + KV_TILE));
            if lo >= hi {
                // `attend_row` never visits a tile without an attended position.
                continue;
            }
            let qr = &q[r * hd..(r + 1) * hd];
            let accr = &mut acc[r * hd..(r + 1) * hd];
            // 1. Scores.
            s.fill(f32::NEG_INFINITY);
            let (a, b) = (lo - tile, hi - tile);
            for x in &mut s[a..b] {
                *x = 0.0;
            }
            for (dk, &qd) in qr.iter().enumerate() {
                let col = &kt[dk * KV_TILE + a..dk * KV_TILE + b];
                for (x, &kv) in s[a..b].iter_mut().zip(col) {
                    *x = kv.mul_add(qd, *x);
                }
            }
            for x in &mut s[a..b] {
                *x *= scale;
            }
            // 2. Running maximum.
            let tile_max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let m_new = m[r].max(tile_max);
            if m_new > m[r] {
                let ms = (m[r] - m_new).exp();
                for x in accr.iter_mut() {
                    *x *= ms;
                }
                sum[r] *= ms;
            }
            m[r] = m_new;
            // 3. Weights and their sum.
            let mut tile_sum = 0.0f64;
            for g in s.chunks_exact_mut(8) {
                for x in g.iter_mut() {
                    *x = ggml_expf(*x - m_new);
                }
                tile_sum +=
                    f64::from(((g[0] + g[4]) + (g[2] + g[6])) + ((g[1] + g[5]) + (g[3] + g[7])));
            }
            sum[r] = (f64::from(sum[r]) + tile_sum) as f32;
            // 4. Weighted values.
            for p in lo..hi {
                let w = s[p - tile];
                let row = &vt[(p - tile) * hd..(p - tile + 1) * hd];
                for (o, &x) in accr.iter_mut().zip(row) {
                    *o = x.mul_add(w, *o);
                }
            }
        }
        tile += KV_TILE;
    }
    for r in 0..rows {
        let inv = if sum[r] == 0.0 { 0.0 } else { 1.0 / sum[r] };
        for (o, &x) in out[r * hd..(r + 1) * hd]
            .iter_mut()
            .zip(&acc[r * hd..(r + 1) * hd])
        {
            *o = x * inv;
        }
    }
}

/// One lane of ggml's AVX2 `ggml_v_expf` (`ggml-cpu/vec.h`), bit-identical to it: the SwiGLU
/// kernel's [`expf_ggml`](crate::swiglu::expf_ggml), the one copy of that arithmetic.
/// `ggml_expf(-inf) == 0`.
#[inline(always)]
pub fn ggml_expf(x: f32) -> f32 {
    crate::swiglu::expf_ggml(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// `0x1.xxxxp±e` hex-float literals as C writes them.
    fn hexf(lit: &str) -> f32 {
        let (m, e) = lit.trim_start_matches("0x").split_once('p').unwrap();
        let (int, frac) = m.split_once('.').unwrap();
        let mut v = u64::from_str_radix(int, 16).unwrap() as f64;
        for (i, c) in frac.chars().enumerate() {
            v += c.to_digit(16).unwrap() as f64 / 16f64.powi(i as i32 + 1);
        }
        (v * 2f64.powi(e.parse().unwrap())) as f32
    }

    #[test]
    fn expf_constants_are_ggmls_hex_floats() {
        for (bits, lit) in [
            (0x4b40_0000u32, "0x1.8p23"),
            (0x3fb8_aa3b, "0x1.715476p+0"),
            (0x35bf_be8e, "0x1.7f7d1cp-20"),
            (0x3f31_7200, "0x1.62e4p-1"),
            (0x3c07_2010, "0x1.0e4020p-7"),
            (0x3d2b_9f17, "0x1.573e2ep-5"),
            (0x3e2a_af33, "0x1.555e66p-3"),
            (0x3eff_fedb, "0x1.fffdb6p-2"),
            (0x3f7f_fff6, "0x1.ffffecp-1"),
        ] {
            assert_eq!(f32::from_bits(bits), hexf(lit), "{lit}");
        }
    }

    #[test]
    fn expf_is_close_to_exp_and_zero_at_minus_infinity() {
        assert_eq!(ggml_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(ggml_expf(0.0), 1.0);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for _ in 0..10_000 {
            let x: f32 = rng.gen_range(-80.0..0.0);
            let want = (x as f64).exp();
            let got = ggml_expf(x) as f64;
            assert!((got - want).abs() <= 4e-7 * want, "{x}: {got} vs {want}");
        }
        // The far range (|n| > 126) takes the rescaled branch; far below it underflows to 0.
        assert_eq!(ggml_expf(-200.0), 0.0);
        let x = -90.0f32;
        assert!((ggml_expf(x) as f64 / (x as f64).exp() - 1.0).abs() < 1e-5);
    }

    fn naive(q: &[f32], k: &[f16], v: &[f16], scale: f32) -> Vec<f64> {
        let hd = q.len();
        let n = k.len() / hd;
        let s: Vec<f64> = (0..n)
            .map(|p| {
                (0..hd)
                    .map(|d| q[d] as f64 * k[p * hd + d].to_f64())
                    .sum::<f64>()
                    * scale as f64
            })
            .collect();
        let m = s.iter().copied().fold(f64::MIN, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        (0..hd)
            .map(|d| {
                (0..n)
                    .map(|p| (s[p] - m).exp() / z * v[p * hd + d].to_f64())
                    .sum()
            })
            .collect()
    }

    #[test]
    fn paths_are_bit_identical_and_close_to_the_exact_result() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let mut scratch = TiledScratch::default();
        for &(hd, first, end) in &[
            (64usize, 0usize, 1usize),
            (64, 0, 64),
            (64, 0, 65),
            (256, 100, 612),
            (64, 63, 200),
            (32, 5, 7),
        ] {
            let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            let n = end - first;
            let k: Vec<f16> = (0..n * hd)
                .map(|_| f16::from_f32(rng.gen_range(-2.0f32..2.0)))
                .collect();
            let v: Vec<f16> = (0..n * hd)
                .map(|_| f16::from_f32(rng.gen_range(-2.0f32..2.0)))
                .collect();
            let scale = 0.3;
            let mut a = vec![0f32; hd];
            let mut b = vec![0f32; hd];
            attend_row(
                CpuFeatures::PORTABLE,
                &q,
                &k,
                &v,
                first,
                end,
                scale,
                &mut scratch,
                &mut a,
            );
            attend_row(
                CpuFeatures::detect(),
                &q,
                &k,
                &v,
                first,
                end,
                scale,
                &mut scratch,
                &mut b,
            );
            assert_eq!(
                a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "hd {hd}, {first}..{end}"
            );
            let want = naive(&q, &k, &v, scale);
            for (x, w) in a.iter().zip(&want) {
                assert!((*x as f64 - w).abs() < 1e-5, "{x} vs {w}");
            }
        }
    }

    #[test]
    fn a_window_straddling_a_tile_boundary_is_a_weighted_average() {
        // Positions 60..70 straddle the tile boundary at 64 (two tiles, two rescalings).
        let hd = 8;
        let q = vec![0.5f32; hd];
        let k: Vec<f16> = (0..10 * hd)
            .map(|i| f16::from_f32((i % 7) as f32 * 0.1))
            .collect();
        let v: Vec<f16> = (0..10 * hd).map(|_| f16::from_f32(1.0)).collect();
        let mut out = vec![0f32; hd];
        attend_row(
            CpuFeatures::detect(),
            &q,
            &k,
            &v,
            60,
            70,
            1.0,
            &mut TiledScratch::default(),
            &mut out,
        );
        for x in out {
            assert!((x - 1.0).abs() < 1e-6);
        }
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|f| f.to_bits()).collect()
    }

    fn f16s(rng: &mut impl Rng, n: usize, amp: f32) -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f32(rng.gen_range(-amp..amp)))
            .collect()
    }

    /// Every path this CPU has: portable, AVX2+FMA (the explicit kernel, or the compiled copy
    /// for head sizes that are not a multiple of 8) and, where present, AVX-512.
    fn all_paths() -> [CpuFeatures; 3] {
        let avx2_only = CpuFeatures {
            avx512: false,
            ..CpuFeatures::detect()
        };
        [CpuFeatures::PORTABLE, avx2_only, CpuFeatures::detect()]
    }

    #[test]
    fn many_rows_at_once_are_bit_identical_to_one_row_at_a_time() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
        let mut one = TiledScratch::default();
        let mut many = RowsScratch::default();
        for &(hd, base, len) in &[
            (64usize, 0usize, 300usize),
            (32, 40, 90),
            (64, 0, 1),
            (128, 0, 200),
            (256, 70, 150),
            (64, 5, 131),
        ] {
            let k = f16s(&mut rng, len * hd, 2.0);
            let v = f16s(&mut rng, len * hd, 2.0);
            // Causal rows at the end, a window, and rows repeated (several heads per position).
            let mut ranges = Vec::new();
            for i in 0..len.min(20) {
                let end = base + len - i;
                ranges.push((base, end));
                ranges.push((base, end));
                ranges.push((end.saturating_sub(70).max(base), end));
            }
            // An odd number of rows (the kernel blocks rows in pairs).
            ranges.pop();
            let q: Vec<f32> = (0..ranges.len() * hd)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            for features in all_paths() {
                let mut got = vec![0f32; q.len()];
                attend_rows(
                    features, &q, &k, &v, base, &ranges, 0.3, &mut many, &mut got,
                );
                for (r, &(first, end)) in ranges.iter().enumerate() {
                    let mut want = vec![0f32; hd];
                    let (a, b) = ((first - base) * hd, (end - base) * hd);
                    attend_row(
                        CpuFeatures::PORTABLE,
                        &q[r * hd..(r + 1) * hd],
                        &k[a..b],
                        &v[a..b],
                        first,
                        end,
                        0.3,
                        &mut one,
                        &mut want,
                    );
                    assert_eq!(
                        bits(&got[r * hd..(r + 1) * hd]),
                        bits(&want),
                        "hd {hd}, row {r}: {first}..{end}, {features:?}"
                    );
                }
            }
        }
    }

    /// The explicit AVX2 kernel (and every other path) against the portable body over random
    /// shapes: head sizes 8–256 (and some not a multiple of 8), K/V starting off a tile
    /// boundary, 1–13 rows with random ranges (straddling tiles, inside one tile, disjoint,
    /// nested: the kernel's common spans, leading and trailing positions), scales from mild to
    /// ones where weights underflow (ggml's far `expf` branches) and the maximum rises
    /// mid-range (rescaling).
    #[test]
    fn explicit_kernels_are_bit_identical_to_the_portable_body_over_many_shapes() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
        let mut scratch = RowsScratch::default();
        for case in 0..400 {
            let hd = [8usize, 16, 24, 40, 64, 64, 128, 256, 12, 36][case % 10];
            let base = [0usize, 1, 63, 64, 100, 200][rng.gen_range(0..6)];
            let len = rng.gen_range(1..=[70usize, 200, 400][case % 3]);
            let amp = [0.5f32, 2.0, 8.0][rng.gen_range(0..3)];
            let scale = [0.125f32, 0.3, 1.0, 5.0][rng.gen_range(0..4)];
            let k = f16s(&mut rng, len * hd, amp);
            let v = f16s(&mut rng, len * hd, 2.0);
            let rows = rng.gen_range(1..=13);
            let ranges: Vec<(usize, usize)> = (0..rows)
                .map(|_| match rng.gen_range(0..4) {
                    // Causal (from the start), a window, a repeat of the previous shape, any.
                    0 => (base, base + rng.gen_range(1..=len)),
                    1 => {
                        let end = base + rng.gen_range(1..=len);
                        (end - rng.gen_range(1..=(end - base).min(90)), end)
                    }
                    2 => (base, base + len),
                    _ => {
                        let a = base + rng.gen_range(0..len);
                        (a, rng.gen_range(a + 1..=base + len))
                    }
                })
                .collect();
            let q: Vec<f32> = (0..rows * hd)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            let mut want = vec![0f32; q.len()];
            attend_rows(
                CpuFeatures::PORTABLE,
                &q,
                &k,
                &v,
                base,
                &ranges,
                scale,
                &mut scratch,
                &mut want,
            );
            assert!(want.iter().all(|x| x.is_finite()), "case {case}");
            for features in all_paths() {
                let mut got = vec![0f32; q.len()];
                attend_rows(
                    features,
                    &q,
                    &k,
                    &v,
                    base,
                    &ranges,
                    scale,
                    &mut scratch,
                    &mut got,
                );
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "case {case}: hd {hd}, base {base}, len {len}, scale {scale}, {ranges:?}, {features:?}"
                );
            }
        }
    }
}
