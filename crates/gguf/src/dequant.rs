//! Reference dequantization of GGML tensor data to `f32`.
//!
//! Owns the block layouts of the 11 supported types and their scalar decoding, bit-for-bit the
//! arithmetic of ggml's `dequantize_row_*` (same operation order, so results are identical). It
//! never quantizes (see `quantize.rs`) and is not the hot path: fused kernels live in `kernels`.

use half::{bf16, f16};

use super::error::GgufError;
use super::types::GgmlType;

/// Elements per super-block of the K-quants.
pub const QK_K: usize = 256;

#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Checks that `src` holds exactly the blocks of `num_elems` elements of `ty`.
pub(crate) fn check_sizes(ty: GgmlType, src_len: usize, num_elems: usize) -> Result<(), GgufError> {
    let expected_bytes = ty.row_bytes(num_elems).ok_or(GgufError::PartialBlock {
        ty,
        num_elems,
        block_elems: ty.block_elems(),
    })?;
    if src_len != expected_bytes {
        return Err(GgufError::SizeMismatch {
            ty,
            num_elems,
            expected_bytes,
            actual_bytes: src_len,
        });
    }
    Ok(())
}

/// Decodes `dst.len()` elements of type `ty` from `src`, which must be exactly their blocks.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), GgufError> {
    check_sizes(ty, src.len(), dst.len())?;
    let bs = ty.block_bytes();
    let be = ty.block_elems();
    let blocks = src.chunks_exact(bs).zip(dst.chunks_exact_mut(be));
    match ty {
        GgmlType::F32 => {
            for (s, d) in blocks {
                d[0] = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        GgmlType::F16 => blocks.for_each(|(s, d)| d[0] = f16_at(s, 0)),
        GgmlType::BF16 => {
            blocks.for_each(|(s, d)| d[0] = bf16::from_le_bytes([s[0], s[1]]).to_f32())
        }
        GgmlType::Q4_0 => blocks.for_each(|(s, d)| block_q4_0(s, d)),
        GgmlType::Q4_1 => blocks.for_each(|(s, d)| block_q4_1(s, d)),
        GgmlType::Q5_0 => blocks.for_each(|(s, d)| block_q5_0(s, d)),
        GgmlType::Q5_1 => blocks.for_each(|(s, d)| block_q5_1(s, d)),
        GgmlType::Q8_0 => blocks.for_each(|(s, d)| block_q8_0(s, d)),
        GgmlType::Q4K => blocks.for_each(|(s, d)| block_q4_k(s, d)),
        GgmlType::Q5K => blocks.for_each(|(s, d)| block_q5_k(s, d)),
        GgmlType::Q6K => blocks.for_each(|(s, d)| block_q6_k(s, d)),
    }
    Ok(())
}

/// `{d: f16, qs[16]}`: x = (q - 8) * d; low nibbles are elements 0..16, high nibbles 16..32.
fn block_q4_0(s: &[u8], y: &mut [f32]) {
    let d = f16_at(s, 0);
    let qs = &s[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// `{d: f16, m: f16, qs[16]}`: x = q * d + m.
fn block_q4_1(s: &[u8], y: &mut [f32]) {
    let d = f16_at(s, 0);
    let m = f16_at(s, 2);
    let qs = &s[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0F) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// `{d: f16, qh: u32, qs[16]}`: 5-bit q = nibble | bit j of qh << 4; x = (q - 16) * d.
fn block_q5_0(s: &[u8], y: &mut [f32]) {
    let d = f16_at(s, 0);
    let qh = u32::from_le_bytes([s[2], s[3], s[4], s[5]]);
    let qs = &s[6..22];
    for j in 0..16 {
        let xh0 = (((qh >> j) << 4) & 0x10) as i32;
        let xh1 = ((qh >> (j + 12)) & 0x10) as i32;
        y[j] = (((qs[j] & 0x0F) as i32 | xh0) - 16) as f32 * d;
        y[j + 16] = (((qs[j] >> 4) as i32 | xh1) - 16) as f32 * d;
    }
}

/// `{d: f16, m: f16, qh: u32, qs[16]}`: x = q * d + m with 5-bit q.
fn block_q5_1(s: &[u8], y: &mut [f32]) {
    let d = f16_at(s, 0);
    let m = f16_at(s, 2);
    let qh = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let qs = &s[8..24];
    for j in 0..16 {
        let xh0 = ((qh >> j) << 4) & 0x10;
        let xh1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((qs[j] & 0x0F) as u32 | xh0) as f32 * d + m;
        y[j + 16] = ((qs[j] >> 4) as u32 | xh1) as f32 * d + m;
    }
}

/// `{d: f16, qs: i8[32]}`: x = q * d.
fn block_q8_0(s: &[u8], y: &mut [f32]) {
    let d = f16_at(s, 0);
    for (yj, &q) in y.iter_mut().zip(&s[2..34]) {
        *yj = (q as i8) as f32 * d;
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) packed in the 12 `scales` bytes of
/// Q4_K/Q5_K (ggml's `get_scale_min_k4`).
#[inline]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `{d: f16, dmin: f16, scales[12], qs[128]}`, 256 elements in 8 sub-blocks of 32:
/// x = d * sc * q - dmin * m.
fn block_q4_k(s: &[u8], y: &mut [f32]) {
    let d = f16_at(s, 0);
    let min = f16_at(s, 2);
    let scales = &s[4..16];
    let qs = &s[16..144];
    for (n, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * n, scales);
        let (sc2, m2) = scale_min_k4(2 * n + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `{d: f16, dmin: f16, scales[12], qh[32], qs[128]}`: as Q4_K with a fifth bit from `qh`.
fn block_q5_k(s: &[u8], y: &mut [f32]) {
    let d = f16_at(s, 0);
    let min = f16_at(s, 2);
    let scales = &s[4..16];
    let qh = &s[16..48];
    let ql = &s[48..176];
    for (n, (q, y)) in ql.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * n, scales);
        let (sc2, m2) = scale_min_k4(2 * n + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let u1 = 1u8 << (2 * n);
        let u2 = 2u8 << (2 * n);
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((q[l] & 0x0F) + h1) as f32 - m1;
            y[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// `{ql[128], qh[64], scales: i8[16], d: f16}`: 6-bit q - 32, 16 sub-blocks of 16 with i8 scales.
fn block_q6_k(s: &[u8], y: &mut [f32]) {
    let ql_all = &s[0..128];
    let qh_all = &s[128..192];
    let sc_all = &s[192..208];
    let d = f16_at(s, 208);
    for n in 0..2 {
        let ql = &ql_all[64 * n..64 * n + 64];
        let qh = &qh_all[32 * n..32 * n + 32];
        let sc = &sc_all[8 * n..8 * n + 8];
        let y = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_nibble_order() {
        // d = 1.0; qs[0] = 0x9A → element 0 = 0xA - 8 = 2, element 16 = 0x9 - 8 = 1.
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        b[2] = 0x9A;
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q4_0, &b, &mut y).unwrap();
        assert_eq!((y[0], y[16], y[1], y[17]), (2.0, 1.0, -8.0, -8.0));
    }

    #[test]
    fn size_errors() {
        let mut y = [0f32; 32];
        assert!(matches!(
            dequantize_row(GgmlType::Q8_0, &[0u8; 33], &mut y),
            Err(GgufError::SizeMismatch {
                expected_bytes: 34,
                ..
            })
        ));
        assert!(matches!(
            dequantize_row(GgmlType::Q8_0, &[0u8; 34], &mut y[..31]),
            Err(GgufError::PartialBlock { .. })
        ));
    }
}
