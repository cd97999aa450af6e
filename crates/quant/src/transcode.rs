//! Transcoding serialised runs of KV rows from one codec pair to another — what a storage tier
//! uses to keep an f16 pool's blocks in a smaller codec (int8, `k=int4c,v=int4`, …) and to turn
//! them back into the pool's codec when they are loaded.
//!
//! The serialised layout is the one the KV stores write for the tiers (`model::kv_rows`): all K
//! rows, then all V rows, each row in its codec's bytes (`KvCodecKind` documents them); a block
//! codec (`int4c`) stores K as consecutive groups of `tokens` rows. Rows are decoded to f32 and
//! encoded again, so the result is exactly what a store of the target codec would hold for the
//! decoded values. Transcoding to a narrower codec is lossy; the caller says so (the cache
//! namespace commits to it). Owns only the byte conversion; never knows blocks, layers or tiers.

use crate::channel::{decode_group, encode_group};
use crate::codecs::KvCodecs;
use crate::error::QuantError;
use crate::kind::KvCodecKind;
use crate::row::{decode_row, encode_row};

/// Bytes of `num_rows` serialised rows (K then V) under `codecs`. Fails when a codec does not fit
/// `head_dim`, or when a block codec's groups do not divide `num_rows`.
pub fn serialized_len(
    codecs: KvCodecs,
    head_dim: usize,
    num_rows: usize,
) -> Result<usize, QuantError> {
    codecs.validate(head_dim)?;
    if let Some(tokens) = codecs.k.block_tokens() {
        if !num_rows.is_multiple_of(tokens) {
            return Err(QuantError::LengthMismatch {
                what: "rows (whole groups of the block codec)",
                expected: num_rows.next_multiple_of(tokens),
                got: num_rows,
            });
        }
    }
    Ok(num_rows * (codecs.k.bytes_per_row(head_dim) + codecs.v.bytes_per_row(head_dim)))
}

/// Rows decoded and re-encoded per pass (16 rows of 64 values: a 4 KiB f32 buffer).
const CHUNK_ROWS: usize = 16;

/// f32, f16, bf16: rows are plain values, so any number of rows is one "row" of the codec.
fn is_plain_float(kind: KvCodecKind) -> bool {
    matches!(
        kind,
        KvCodecKind::F32 | KvCodecKind::F16 | KvCodecKind::Bf16
    )
}

/// `num_rows` rows of one side (K or V) under `kind`, decoded into `out` (`num_rows · head_dim`).
fn decode_side(
    kind: KvCodecKind,
    head_dim: usize,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    match (kind.block_tokens(), kind.bytes_per_group(head_dim)) {
        (Some(tokens), Some(group_bytes)) => {
            for (g, o) in bytes
                .chunks_exact(group_bytes)
                .zip(out.chunks_exact_mut(tokens * head_dim))
            {
                decode_group(kind, g, head_dim, o)?;
            }
        }
        // Float codecs have no per-row parameters: the whole side is one run of values.
        _ if is_plain_float(kind) => decode_row(kind, bytes, out)?,
        _ => {
            let row_bytes = kind.bytes_per_row(head_dim);
            for (r, o) in bytes
                .chunks_exact(row_bytes)
                .zip(out.chunks_exact_mut(head_dim))
            {
                decode_row(kind, r, o)?;
            }
        }
    }
    Ok(())
}

/// `values` (`num_rows · head_dim`) encoded under `kind` into `dst` (`num_rows` rows' bytes).
fn encode_side(
    kind: KvCodecKind,
    head_dim: usize,
    values: &[f32],
    dst: &mut [u8],
) -> Result<(), QuantError> {
    match (kind.block_tokens(), kind.bytes_per_group(head_dim)) {
        (Some(tokens), Some(group_bytes)) => {
            for (x, o) in values
                .chunks_exact(tokens * head_dim)
                .zip(dst.chunks_exact_mut(group_bytes))
            {
                encode_group(kind, x, head_dim, o)?;
            }
        }
        _ if is_plain_float(kind) => encode_row(kind, values, dst)?,
        _ => {
            let row_bytes = kind.bytes_per_row(head_dim);
            for (x, o) in values
                .chunks_exact(head_dim)
                .zip(dst.chunks_exact_mut(row_bytes))
            {
                encode_row(kind, x, o)?;
            }
        }
    }
    Ok(())
}

/// `num_rows` serialised rows under `from` rewritten under `to` (the same bytes when the codecs
/// are equal). Checks both layouts and the input length.
pub fn transcode_rows(
    from: KvCodecs,
    to: KvCodecs,
    head_dim: usize,
    num_rows: usize,
    bytes: &[u8],
) -> Result<Vec<u8>, QuantError> {
    let expected = serialized_len(from, head_dim, num_rows)?;
    let out_len = serialized_len(to, head_dim, num_rows)?;
    if bytes.len() != expected {
        return Err(QuantError::LengthMismatch {
            what: "serialised rows",
            expected,
            got: bytes.len(),
        });
    }
    if from == to {
        return Ok(bytes.to_vec());
    }
    let (k_bytes, v_bytes) = bytes.split_at(num_rows * from.k.bytes_per_row(head_dim));
    let mut out = vec![0u8; out_len];
    let (k_out, v_out) = out.split_at_mut(num_rows * to.k.bytes_per_row(head_dim));
    let mut values = Vec::new();
    for (side_from, side_to, src, dst) in [
        (from.k, to.k, k_bytes, k_out),
        (from.v, to.v, v_bytes, v_out),
    ] {
        if side_from == side_to {
            dst.copy_from_slice(src);
            continue;
        }
        // A few rows at a time through an f32 buffer that stays in L1, instead of the whole
        // side through one the size of the block (which costs a pass through L2 and, for a
        // fresh allocation, page faults).
        let rows = chunk_rows(side_from, side_to);
        values.resize(rows * head_dim, 0.0);
        let (from_row, to_row) = (
            side_from.bytes_per_row(head_dim),
            side_to.bytes_per_row(head_dim),
        );
        for (src, dst) in src
            .chunks(rows * from_row)
            .zip(dst.chunks_mut(rows * to_row))
        {
            let values = &mut values[..src.len() / from_row * head_dim];
            decode_side(side_from, head_dim, src, values)?;
            encode_side(side_to, head_dim, values, dst)?;
        }
    }
    Ok(out)
}

/// Rows transcoded per pass: [`CHUNK_ROWS`], or a multiple of every block codec's group that is
/// at least that (so a pass holds whole groups; `serialized_len` checked that the rows are whole
/// groups).
fn chunk_rows(a: KvCodecKind, b: KvCodecKind) -> usize {
    let lcm = |x: usize, y: usize| {
        let (mut p, mut q) = (x, y);
        while q != 0 {
            (p, q) = (q, p % q);
        }
        x / p * y
    };
    let group = lcm(a.block_tokens().unwrap_or(1), b.block_tokens().unwrap_or(1));
    CHUNK_ROWS.next_multiple_of(group)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn serialise_f32(k: &[f32], v: &[f32]) -> Vec<u8> {
        k.iter()
            .chain(v)
            .flat_map(|x| x.to_le_bytes())
            .collect::<Vec<u8>>()
    }

    fn decode_all(codecs: KvCodecs, hd: usize, n: usize, bytes: &[u8]) -> Vec<f32> {
        let back = transcode_rows(codecs, KvCodecs::F32, hd, n, bytes).unwrap();
        back.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    #[test]
    fn transcoding_equals_encoding_each_row_and_group_directly() {
        // Naive model: every K row / group and V row encoded on its own from the f32 values.
        // Row counts that fill passes of `CHUNK_ROWS` exactly, end in a partial pass (40 rows,
        // groups of 8), or take passes of a group larger than `CHUNK_ROWS` (64 rows, groups of 32).
        for (name, n) in [
            ("f16", 32),
            ("int8", 40),
            ("k=int4c,v=int4", 32),
            ("k=int4c-t8,v=int4", 40),
            ("k=int4c-t32,v=int8", 64),
            ("k=int8,v=int4", 40),
            ("fp8", 32),
            ("int4h", 40),
        ] {
            let hd = 64;
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(18);
            let k: Vec<f32> = (0..n * hd).map(|_| rng.gen_range(-4.0..4.0)).collect();
            let v: Vec<f32> = (0..n * hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let src = serialise_f32(&k, &v);
            let to = KvCodecs::parse(name).unwrap();
            let got = transcode_rows(KvCodecs::F32, to, hd, n, &src).unwrap();
            let mut want = Vec::new();
            match to.k.bytes_per_group(hd) {
                Some(gb) => {
                    let tokens = to.k.block_tokens().unwrap();
                    for x in k.chunks_exact(tokens * hd) {
                        let mut o = vec![0u8; gb];
                        encode_group(to.k, x, hd, &mut o).unwrap();
                        want.extend(o);
                    }
                }
                None => k.chunks_exact(hd).for_each(|x| {
                    want.extend(crate::row::encode_row_to_vec(to.k, x).unwrap());
                }),
            }
            v.chunks_exact(hd).for_each(|x| {
                want.extend(crate::row::encode_row_to_vec(to.v, x).unwrap());
            });
            assert_eq!(got, want, "{name}");
            assert_eq!(got.len(), serialized_len(to, hd, n).unwrap());
            // Decoding back is what each codec's decoder returns, within its error bound.
            let back = decode_all(to, hd, n, &got);
            let worst = k
                .iter()
                .chain(&v)
                .zip(&back)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            // Half a step of each codec over the ±4 range (4-bit clipping and rotation: more).
            let bound = match name {
                "f16" => 0.01,
                "int8" => 0.05,
                "fp8" => 0.3,
                _ => 1.0,
            };
            assert!(worst < bound, "{name}: {worst}");
        }
    }

    #[test]
    fn lossless_pairs_round_trip_bit_exactly_and_equal_codecs_copy() {
        let (hd, n) = (64, 16);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let k: Vec<f32> = (0..n * hd).map(|_| rng.gen_range(-8.0..8.0)).collect();
        let v: Vec<f32> = (0..n * hd).map(|_| rng.gen_range(-8.0..8.0)).collect();
        let f16 =
            transcode_rows(KvCodecs::F32, KvCodecs::F16, hd, n, &serialise_f32(&k, &v)).unwrap();
        // f16 -> f32 -> f16 is exact, and a codec to itself is a copy.
        let wide = transcode_rows(KvCodecs::F16, KvCodecs::F32, hd, n, &f16).unwrap();
        assert_eq!(
            transcode_rows(KvCodecs::F32, KvCodecs::F16, hd, n, &wide).unwrap(),
            f16
        );
        assert_eq!(
            transcode_rows(KvCodecs::F16, KvCodecs::F16, hd, n, &f16).unwrap(),
            f16
        );
    }

    #[test]
    fn bad_lengths_and_partial_groups_are_rejected() {
        let int4c = KvCodecs::parse("k=int4c,v=int4").unwrap();
        assert!(serialized_len(int4c, 64, 17).is_err());
        assert!(transcode_rows(KvCodecs::F16, int4c, 64, 8, &[0u8; 8 * 256]).is_err());
        let f16_16 = vec![0u8; 16 * 256];
        assert!(transcode_rows(KvCodecs::F16, int4c, 64, 16, &f16_16[1..]).is_err());
        let out = transcode_rows(KvCodecs::F16, int4c, 64, 16, &f16_16).unwrap();
        assert_eq!(out.len(), 16 * (48 + 40));
        // V may never use a block codec.
        let bad = KvCodecs {
            k: KvCodecKind::F16,
            v: KvCodecKind::Int4Channel { tokens: 16 },
        };
        assert!(transcode_rows(KvCodecs::F16, bad, 64, 16, &f16_16).is_err());
    }
}
