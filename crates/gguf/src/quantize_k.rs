//! Reference quantization into the K-quant super-block formats (Q4_K, Q5_K, Q6_K).
//!
//! Owns a scalar port of ggml's `quantize_row_q{4,5,6}_K_ref` and its helpers
//! (`make_qkx2_quants`, `make_qx_quants`, `nearest_int`), without importance matrices. Used
//! through `quantize::quantize_row` by tests and the writer; never on an inference path and never
//! reads files.

use half::f16;

use super::dequant::{scale_min_k4, QK_K};

const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even via the 1.5·2^23 trick (valid for |f| < 2^22).
fn nearest_int(f: f32) -> i32 {
    let val = f + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

fn f16_round_trip(x: f32) -> (u16, f32) {
    let h = f16::from_f32(x);
    (h.to_bits(), h.to_f32())
}

/// Fits `x ≈ scale * L + min` (L in 0..=nmax) by a weighted search; returns (scale, -min).
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = if x[i] < min { x[i] } else { min };
        max = if x[i] > max { x[i] } else { max };
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.iter_mut().for_each(|l| *l = 0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * diff * diff;
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * diff * diff;
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Fits `x ≈ scale * (L - nmax)` (symmetric, x²-weighted, `rmse_type` 1); L in 0..2·nmax.
fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let mut iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let l = quant(iscale, v);
        l_out[i] = (l + nmax) as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * (l * l) as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (mut slx, mut sl2) = (0.0f32, 0.0f32);
        for &v in x {
            let l = quant(iscale, v);
            let w = v * v;
            slx += w * v * l as f32;
            sl2 += w * (l * l) as f32;
        }
        if sl2 > 0.0 && slx * slx > best * sl2 {
            for (i, &v) in x.iter().enumerate() {
                l_out[i] = (nmax + quant(iscale, v)) as i8;
            }
            scale = slx / sl2;
            best = scale * slx;
        }
    }
    scale
}

/// Packs 8 six-bit scales and mins into the 12-byte K-quant layout.
fn pack_scales(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0x0F) | ((lm[j] & 0x0F) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// Shared Q4_K/Q5_K front half: per-32 scale/min fit, 6-bit packing, requantization.
/// Returns (d bits, dmin bits, packed scales, levels 0..=nmax).
fn quantize_scale_min_block(x: &[f32], nmax: i32) -> (u16, u16, [u8; 12], [u8; QK_K]) {
    let (rmin, rdelta, nstep) = if nmax == 15 {
        (-1.0, 0.1, 20)
    } else {
        (-0.5, 0.1, 15)
    };
    let mut levels = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().fold(0.0, |s, v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0f32; 32];
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let lv = &mut levels[32 * j..32 * j + 32];
        (scales[j], mins[j]) = make_qkx2_quants(nmax, xs, &weights, lv, rmin, rdelta, nstep);
        max_scale = max_scale.max(scales[j]);
        max_min = max_min.max(mins[j]);
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let packed = pack_scales(&ls, &lm);
    let (d_bits, d) = f16_round_trip(max_scale / 63.0);
    let (dmin_bits, dmin) = f16_round_trip(max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for i in 32 * j..32 * j + 32 {
            levels[i] = nearest_int((x[i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (d_bits, dmin_bits, packed, levels)
}

/// One Q4_K super-block of 256 elements (ggml `quantize_row_q4_K_ref`).
pub(crate) fn block_q4_k(x: &[f32], dst: &mut Vec<u8>) {
    let (d, dmin, scales, l) = quantize_scale_min_block(x, 15);
    dst.extend_from_slice(&d.to_le_bytes());
    dst.extend_from_slice(&dmin.to_le_bytes());
    dst.extend_from_slice(&scales);
    for j in (0..QK_K).step_by(64) {
        dst.extend((0..32).map(|i| l[j + i] | (l[j + i + 32] << 4)));
    }
}

/// One Q5_K super-block of 256 elements (ggml `quantize_row_q5_K_ref`).
pub(crate) fn block_q5_k(x: &[f32], dst: &mut Vec<u8>) {
    let (d, dmin, scales, l) = quantize_scale_min_block(x, 31);
    dst.extend_from_slice(&d.to_le_bytes());
    dst.extend_from_slice(&dmin.to_le_bytes());
    dst.extend_from_slice(&scales);
    let mut qh = [0u8; 32];
    let mut ql = [0u8; 128];
    for (n, j0) in (0..QK_K).step_by(64).enumerate() {
        let (m1, m2) = (1u8 << (2 * n), 2u8 << (2 * n));
        for j in 0..32 {
            let (mut l1, mut l2) = (l[j0 + j], l[j0 + j + 32]);
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[32 * n + j] = l1 | (l2 << 4);
        }
    }
    dst.extend_from_slice(&qh);
    dst.extend_from_slice(&ql);
}

/// One Q6_K super-block of 256 elements (ggml `quantize_row_q6_K_ref`).
pub(crate) fn block_q6_k(x: &[f32], dst: &mut Vec<u8>) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        let s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        dst.extend_from_slice(&[0u8; 210]);
        return;
    }
    let iscale = -128.0 / max_scale;
    let (d_bits, d) = f16_round_trip(1.0 / iscale);
    let mut sc = [0i8; 16];
    for ib in 0..16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
    }
    for (j, &scale) in sc.iter().enumerate() {
        let dj = d * scale as f32;
        if dj == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / dj).clamp(-32, 31) + 32) as i8;
        }
    }
    let l = l.map(|v| v as u8);
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for (n, j) in (0..QK_K).step_by(128).enumerate() {
        for i in 0..32 {
            let (q1, q2, q3, q4) = (l[j + i], l[j + i + 32], l[j + i + 64], l[j + i + 96]);
            ql[64 * n + i] = (q1 & 0x0F) | ((q3 & 0x0F) << 4);
            ql[64 * n + i + 32] = (q2 & 0x0F) | ((q4 & 0x0F) << 4);
            qh[32 * n + i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    dst.extend_from_slice(&ql);
    dst.extend_from_slice(&qh);
    dst.extend(sc.iter().map(|&s| s as u8));
    dst.extend_from_slice(&d_bits.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-0.4), 0);
        assert_eq!(nearest_int(100.6), 101);
    }

    #[test]
    fn pack_scales_inverts_scale_min_k4() {
        let ls = [1, 63, 17, 32, 60, 5, 48, 33];
        let lm = [0, 7, 63, 31, 16, 62, 1, 47];
        let packed = pack_scales(&ls, &lm);
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &packed), (ls[j], lm[j]));
        }
    }
}
