//! Encoding and decoding of one row (one token × one KV head, `head_dim` values).
//!
//! Owns the per-codec encoders (scales and offsets are computed online from the row itself) and
//! the row-level decode. Error bounds, per codec, for finite input (`x̂` = decoded value):
//!
//! - `f32`: exact.
//! - `f16`: IEEE round-to-nearest-even: `|x − x̂| ≤ 2^-11·|x|` for `2^-14 ≤ |x| ≤ 65504`,
//!   `≤ 2^-25` below; `|x| ≥ 65520` becomes ±inf.
//! - `bf16`: round-to-nearest-even: `|x − x̂| ≤ 2^-8·|x|` (f32 normal range); values within
//!   half an ulp of `f32::MAX` become ±inf.
//! - `fp8` (E4M3, `scale = amax/448` in f32): `|x − x̂| ≤ 2^-4·|x| + 2^-10·scale` (plus f32
//!   rounding, `≤ 2^-22·|x|`), for rows whose `scale` is a normal f32 (`amax ≥ 448·2^-126`);
//!   smaller rows lose everything below `2^-149` (absolute error `≤ amax`).
//! - `int8`/`int4` (per group: `x̂ = code·scale + offset`, f16 parameters): `|x − x̂| ≤ scale/2
//!   + 2^-24·|x̂|`, where the stored `scale ≥ (max − min)/qmax` is at most one f16 ulp above
//!   it plus the offset's downward rounding (`≤ 2^-11·|min|/qmax`); a constant, f16-exact group
//!   has `scale = 0` and is exact. Inputs beyond ±65504 saturate to ±65504 first.
//! - `int4` additionally clips: its encoder tries the ranges `[min + a·r, max − b·r]`
//!   (`r = max − min`, `(a, b)` from `affine::CLIP_CANDIDATES`, all `≤ 0.15`, the full range
//!   first) and keeps the one with the smallest squared error of the group, so the group's
//!   squared error never exceeds the min/max encoding's (up to f32 rounding of the ranking).
//!   Per element: `|x − x̂| ≤ max(scale/2, d) + 2^-24·|x̂|`, where `d` is the distance from `x`
//!   to the stored range `[offset, offset + 15·scale]` (clipped values err by `d ≤ 0.15·r`,
//!   which can exceed `scale/2`); `scale` is tight for the chosen range as above.
//!
//! Non-finite input never panics: NaN encodes as 0 (f32/f16/bf16 keep NaN; fp8 → +0; int → code
//! 0, i.e. the group offset) and is ignored when choosing scales; ±inf stays ±inf in
//! f32/f16/bf16, saturates to ±448·scale (of the finite values) in fp8 and to ±65504 in int.
//!
//! Rotated codecs (`int8h`, `int4h`) encode `H·x` (NaN → 0 and ±65504 clamping applied *before*
//! the rotation, so one bad channel never spreads) with their storage codec, and decode by
//! rotating the decoded values back (`H` is its own inverse): the stored values obey the integer
//! bound above, and since `H` is orthogonal the decoded row's error has the same Euclidean norm.

use crate::affine;
use crate::dispatch::pick;
use crate::error::QuantError;
use crate::hadamard;
use crate::isa::Isa;
use crate::kind::KvCodecKind;
use crate::layout::{check_row, split_fp8, split_int};

/// Encodes `x` (`[head_dim]`) into `out` (`[kind.bytes_per_row(head_dim)]` bytes).
pub fn encode_row(kind: KvCodecKind, x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    encode_row_with(Isa::detect(), kind, x, out)
}

/// [`encode_row`] on an explicit instruction-set path (bit-identical bytes on every path).
pub fn encode_row_with(
    isa: Isa,
    kind: KvCodecKind,
    x: &[f32],
    out: &mut [u8],
) -> Result<(), QuantError> {
    check_row(kind, x.len(), out.len())?;
    match kind {
        KvCodecKind::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        KvCodecKind::F16 => pick!(isa, encode_f16(x, out)),
        KvCodecKind::Bf16 => pick!(isa, encode_bf16(x, out)),
        KvCodecKind::Fp8E4m3 => pick!(isa, encode_fp8(x, out)),
        KvCodecKind::Int8 { group } => encode_int(isa, x, out, group, 255),
        KvCodecKind::Int4 { group } => encode_int(isa, x, out, group, 15),
        KvCodecKind::Int4Channel { .. } => unreachable!("check_row rejects block codecs"),
        KvCodecKind::Int8Hadamard { .. } | KvCodecKind::Int4Hadamard { .. } => {
            hadamard::with_scratch(x.len(), |rotated| {
                hadamard::rotate_sanitised(x, rotated);
                encode_row_with(isa, kind.storage(), rotated, out)
            })?
        }
    }
    Ok(())
}

fn encode_int(isa: Isa, x: &[f32], out: &mut [u8], group: usize, qmax: u32) {
    let num_groups = x.len() / group;
    let (params, codes) = out.split_at_mut(crate::kind::INT_PARAM_BYTES_PER_GROUP * num_groups);
    if qmax == 15 {
        codes.fill(0);
    }
    for (g, (xg, pg)) in x
        .chunks_exact(group)
        .zip(params.chunks_exact_mut(4))
        .enumerate()
    {
        let p = if qmax == 15 {
            affine::choose_clipped_with(isa, xg, qmax)
        } else {
            affine::choose_with(isa, xg, qmax)
        };
        let wide = affine::widen(p);
        pg[..2].copy_from_slice(&p.scale.to_bits().to_le_bytes());
        pg[2..].copy_from_slice(&p.offset.to_bits().to_le_bytes());
        if qmax == 15 {
            // Codes of up to 64 values at a time in a stack buffer, then packed in nibbles.
            let mut buf = [0u8; 64];
            for (j, xs) in xg.chunks(64).enumerate() {
                pick!(isa, encode_codes(xs, wide, qmax, &mut buf[..xs.len()]));
                let base = g * group + 64 * j;
                for (k, &c) in buf[..xs.len()].iter().enumerate() {
                    let i = base + k;
                    codes[i / 2] |= c << (4 * (i % 2));
                }
            }
        } else {
            pick!(
                isa,
                encode_codes(xg, wide, qmax, &mut codes[g * group..(g + 1) * group])
            );
        }
    }
}

/// Decodes `bytes` (one encoded row) into `out` (`[head_dim]`).
pub fn decode_row(kind: KvCodecKind, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    decode_row_with(Isa::detect(), kind, bytes, out)
}

/// [`decode_row`] on an explicit instruction-set path (bit-identical results on every path).
pub fn decode_row_with(
    isa: Isa,
    kind: KvCodecKind,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    check_row(kind, out.len(), bytes.len())?;
    let head_dim = out.len();
    match kind {
        KvCodecKind::F32 => pick!(isa, decode_f32(bytes, out)),
        KvCodecKind::F16 => pick!(isa, decode_f16(bytes, out)),
        KvCodecKind::Bf16 => pick!(isa, decode_bf16(bytes, out)),
        KvCodecKind::Fp8E4m3 => {
            let (scale, codes) = split_fp8(bytes);
            pick!(isa, decode_e4m3(scale, codes, out))
        }
        KvCodecKind::Int8 { group } | KvCodecKind::Int4 { group } => {
            let four_bit = matches!(kind, KvCodecKind::Int4 { .. });
            let (params, codes) = split_int(bytes, head_dim, group);
            pick!(isa, decode_int_row(params, codes, group, four_bit, out))
        }
        KvCodecKind::Int4Channel { .. } => unreachable!("check_row rejects block codecs"),
        KvCodecKind::Int8Hadamard { .. } | KvCodecKind::Int4Hadamard { .. } => {
            decode_row_with(isa, kind.storage(), bytes, out)?;
            hadamard::fwht(out);
        }
    }
    Ok(())
}

/// Convenience: encodes a row into a fresh `Vec` (tests, tools; the hot path writes in place).
pub fn encode_row_to_vec(kind: KvCodecKind, x: &[f32]) -> Result<Vec<u8>, QuantError> {
    let mut out = vec![0u8; kind.bytes_per_row(x.len())];
    encode_row(kind, x, &mut out)?;
    Ok(out)
}
