//! The per-channel 4-bit K codec (`int4c`, KIVI-style): a *group* is `tokens` consecutive rows
//! of one KV head (one block), quantised per channel — each of the `head_dim` channels gets its
//! own f16 scale and offset over the group's `tokens` values, 4-bit codes per value.
//!
//! Why per channel: post-RoPE keys have a few outlier *channels* (large in every token), so a
//! per-token range is set by the outliers and the other channels get two or three levels; per
//! channel, every channel's range is its own. The parameters come from the affine rules of the
//! row codecs ([`affine::choose_clipped`], offset rounded down, scale up to f16).
//!
//! Owns encoding and decoding a group and scoring its rows from the codes:
//! `q·x̂ = Σ_c (q_c·scale_c)·code_c + Σ_c q_c·offset_c`, so [`ChannelQuery::prepare`] folds the
//! scales into the query once per group and each row costs one 4-bit dot product (the same
//! `dot_u4` kernel as `int4`, on the ISA dispatch, bit-identical across paths). Never decides
//! *when* a group is encoded — the KV store seals a group once its last row is written (see
//! `model::kv_rows`), so a group's bytes are a function of its rows only.

use crate::affine;
use crate::dispatch::pick;
use crate::error::QuantError;
use crate::isa::Isa;
use crate::kind::{KvCodecKind, INT_PARAM_BYTES_PER_GROUP};
use crate::layout::group_params;

fn check_group(kind: KvCodecKind, head_dim: usize, len: usize) -> Result<usize, QuantError> {
    kind.validate(head_dim)?;
    let (Some(tokens), Some(bytes)) = (kind.block_tokens(), kind.bytes_per_group(head_dim)) else {
        return Err(QuantError::UnknownCodec(format!(
            "{kind} is not a block codec"
        )));
    };
    if len != bytes {
        return Err(QuantError::LengthMismatch {
            what: "encoded group bytes",
            expected: bytes,
            got: len,
        });
    }
    Ok(tokens)
}

/// A group's bytes split into the per-channel `(scale, offset)` header and the codes
/// (`tokens` rows of `head_dim / 2` bytes).
pub fn split_group(bytes: &[u8], head_dim: usize) -> (&[u8], &[u8]) {
    bytes.split_at(INT_PARAM_BYTES_PER_GROUP * head_dim)
}

/// Encodes `rows` (`[tokens, head_dim]`, row-major) into `out`
/// (`kind.bytes_per_group(head_dim)` bytes). Non-finite values follow the integer codecs' rules.
pub fn encode_group(
    kind: KvCodecKind,
    rows: &[f32],
    head_dim: usize,
    out: &mut [u8],
) -> Result<(), QuantError> {
    let tokens = check_group(kind, head_dim, out.len())?;
    if rows.len() != tokens * head_dim {
        return Err(QuantError::LengthMismatch {
            what: "group values (tokens × head_dim)",
            expected: tokens * head_dim,
            got: rows.len(),
        });
    }
    encode_group_with(Isa::detect(), rows, tokens, head_dim, out);
    Ok(())
}

/// [`encode_group`] on an explicit instruction-set path (bit-identical bytes on every path),
/// shapes already checked: on AVX2, 8 channels at a time with the channels in the lanes
/// (`clip_avx2::encode_channels8`); the rest (and channels holding NaN or values beyond
/// ±65504) one channel at a time.
fn encode_group_with(isa: Isa, rows: &[f32], tokens: usize, head_dim: usize, out: &mut [u8]) {
    let (params, codes) = out.split_at_mut(INT_PARAM_BYTES_PER_GROUP * head_dim);
    codes.fill(0);
    let mut column = vec![0f32; tokens];
    let mut column_codes = vec![0u8; tokens];
    let mut c = 0;
    while c < head_dim {
        #[cfg(target_arch = "x86_64")]
        if isa.use_avx2() && c + 8 <= head_dim {
            // SAFETY: `use_avx2` is true only when AVX2, FMA and F16C were detected at runtime;
            // the shapes were checked by the caller (and are asserted inside).
            if unsafe {
                crate::affine::clip_avx2::encode_channels8(rows, tokens, head_dim, c, params, codes)
            } {
                c += 8;
                continue;
            }
            for j in c..c + 8 {
                encode_channel(
                    isa,
                    rows,
                    head_dim,
                    j,
                    params,
                    codes,
                    &mut column,
                    &mut column_codes,
                );
            }
            c += 8;
            continue;
        }
        encode_channel(
            isa,
            rows,
            head_dim,
            c,
            params,
            codes,
            &mut column,
            &mut column_codes,
        );
        c += 1;
    }
}

/// Channel `c` of a group on the per-column path (`column` and `column_codes`: `tokens` long).
#[allow(clippy::too_many_arguments)]
fn encode_channel(
    isa: Isa,
    rows: &[f32],
    head_dim: usize,
    c: usize,
    params: &mut [u8],
    codes: &mut [u8],
    column: &mut [f32],
    column_codes: &mut [u8],
) {
    let row_bytes = head_dim / 2;
    for (t, v) in column.iter_mut().enumerate() {
        *v = rows[t * head_dim + c];
    }
    let p = affine::choose_clipped(column, 15);
    params[4 * c..4 * c + 2].copy_from_slice(&p.scale.to_bits().to_le_bytes());
    params[4 * c + 2..4 * c + 4].copy_from_slice(&p.offset.to_bits().to_le_bytes());
    let wide = affine::widen(p);
    pick!(isa, encode_codes(column, wide, 15, column_codes));
    for (t, &code) in column_codes.iter().enumerate() {
        codes[t * row_bytes + c / 2] |= code << (4 * (c % 2));
    }
}

/// Decodes a group into `out` (`[tokens, head_dim]`): `x̂ = code·scale_c + offset_c`.
pub fn decode_group(
    kind: KvCodecKind,
    bytes: &[u8],
    head_dim: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let tokens = check_group(kind, head_dim, bytes.len())?;
    if out.len() != tokens * head_dim {
        return Err(QuantError::LengthMismatch {
            what: "decoded group (tokens × head_dim)",
            expected: tokens * head_dim,
            got: out.len(),
        });
    }
    decode_group_with(Isa::detect(), split_group(bytes, head_dim), head_dim, out);
    Ok(())
}

/// [`decode_group`] on an explicit instruction-set path (bit-identical on every path): the
/// per-channel parameters are widened once, then each row is one fused multiply-add per value.
fn decode_group_with(isa: Isa, group: (&[u8], &[u8]), head_dim: usize, out: &mut [f32]) {
    let (params, codes) = group;
    let (scales, offsets): (Vec<f32>, Vec<f32>) =
        (0..head_dim).map(|c| group_params(params, c)).unzip();
    let row_bytes = head_dim / 2;
    for (row, row_codes) in out
        .chunks_exact_mut(head_dim)
        .zip(codes.chunks_exact(row_bytes))
    {
        pick!(isa, decode_u4_channels(&scales, &offsets, row_codes, row));
    }
}

/// A query prepared for the rows of one group: `q_c·scale_c` per channel and `Σ q_c·offset_c`.
/// Reuse one per attention task (`prepare` keeps its buffer).
#[derive(Debug, Clone)]
pub struct ChannelQuery {
    isa: Isa,
    scaled: Vec<f32>,
    bias: f32,
}

impl Default for ChannelQuery {
    fn default() -> Self {
        ChannelQuery::new_with(Isa::detect())
    }
}

impl ChannelQuery {
    /// An empty query on an explicit instruction-set path.
    pub fn new_with(isa: Isa) -> Self {
        ChannelQuery {
            isa,
            scaled: Vec::new(),
            bias: 0.0,
        }
    }

    /// Prepares `q` (`[head_dim]`) for the group whose header is `params`
    /// (`4 · head_dim` bytes, the first part of [`split_group`]).
    ///
    /// # Panics
    /// If `params` is not `4 · q.len()` bytes (a caller bug).
    pub fn prepare(&mut self, q: &[f32], params: &[u8]) {
        assert_eq!(params.len(), INT_PARAM_BYTES_PER_GROUP * q.len());
        self.scaled.clear();
        let mut bias = 0f32;
        for (c, &qc) in q.iter().enumerate() {
            let (s, o) = group_params(params, c);
            self.scaled.push(qc * s);
            bias = qc.mul_add(o, bias);
        }
        self.bias = bias;
    }

    /// `q · x̂` of one row of the prepared group (`head_dim / 2` code bytes).
    ///
    /// # Panics
    /// If `codes` is not `head_dim / 2` bytes.
    pub fn score(&self, codes: &[u8]) -> f32 {
        assert_eq!(2 * codes.len(), self.scaled.len());
        let isa = self.isa;
        pick!(isa, dot_u4(&self.scaled, codes)) + self.bias
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn k_like(tokens: usize, hd: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..tokens * hd)
            .map(|i| {
                let c = i % hd;
                let x: f32 = rng.gen_range(-1.0..1.0);
                // Outlier channels: large and shifted in every token.
                if c % 16 == 3 {
                    8.0 * x + 6.0
                } else {
                    x
                }
            })
            .collect()
    }

    #[test]
    fn per_channel_groups_beat_per_token_int4_on_outlier_channels() {
        let (t, hd) = (16, 64);
        let kind = KvCodecKind::Int4Channel { tokens: t };
        let x = k_like(t, hd, 7);
        let mut bytes = vec![0u8; kind.bytes_per_group(hd).unwrap()];
        encode_group(kind, &x, hd, &mut bytes).unwrap();
        let mut back = vec![0f32; t * hd];
        decode_group(kind, &bytes, hd, &mut back).unwrap();
        let err_c: f64 = x
            .iter()
            .zip(&back)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum();
        let row_kind = KvCodecKind::Int4 { group: 32 };
        let mut err_t = 0f64;
        for row in x.chunks_exact(hd) {
            let enc = crate::encode_row_to_vec(row_kind, row).unwrap();
            let mut dec = vec![0f32; hd];
            crate::decode_row(row_kind, &enc, &mut dec).unwrap();
            err_t += row
                .iter()
                .zip(&dec)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum::<f64>();
        }
        assert!(
            err_c < 0.5 * err_t,
            "per-channel {err_c} vs per-token {err_t}"
        );
        // Every value within half a step of its channel (the stored parameters cover the range
        // unless clipped; clipping only ever lowers the channel's squared error).
        assert_eq!(bytes.len(), t * kind.bytes_per_row(hd));
    }

    #[test]
    fn scores_match_decoded_rows_and_every_isa_path() {
        let (t, hd) = (16, 64);
        let kind = KvCodecKind::Int4Channel { tokens: t };
        let x = k_like(t, hd, 11);
        let mut bytes = vec![0u8; kind.bytes_per_group(hd).unwrap()];
        encode_group(kind, &x, hd, &mut bytes).unwrap();
        let mut back = vec![0f32; t * hd];
        decode_group(kind, &bytes, hd, &mut back).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
        // Decoding: the dispatched path is bit-identical to the portable one, and both to the
        // per-value definition `code·scale_c + offset_c`.
        let (params, codes) = split_group(&bytes, hd);
        let mut portable_rows = vec![0f32; t * hd];
        decode_group_with(Isa::Portable, (params, codes), hd, &mut portable_rows);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&portable_rows), bits(&back));
        for (i, x) in back.iter().enumerate() {
            let (s, o) = group_params(params, i % hd);
            let code = crate::layout::u4_at(&codes[(i / hd) * hd / 2..], i % hd);
            assert_eq!(x.to_bits(), affine::dequant(code, s, o).to_bits());
        }
        let mut portable = ChannelQuery::new_with(Isa::Portable);
        portable.prepare(&q, params);
        let mut best = ChannelQuery::default();
        best.prepare(&q, params);
        for (r, row) in back.chunks_exact(hd).enumerate() {
            let row_codes = &codes[r * hd / 2..(r + 1) * hd / 2];
            let s = portable.score(row_codes);
            assert_eq!(s.to_bits(), best.score(row_codes).to_bits());
            let exact: f64 = q
                .iter()
                .zip(row)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            assert!(
                (f64::from(s) - exact).abs() < 1e-3 * (1.0 + exact.abs()),
                "{s} {exact}"
            );
        }
    }

    #[test]
    fn simd_group_encoder_matches_the_portable_one_bit_for_bit() {
        if Isa::detect() == Isa::Portable {
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(6);
        for case in 0..600 {
            let (tokens, hd) = [(16, 64), (32, 64), (16, 68), (8, 32), (16, 128)][case % 5];
            let kind = KvCodecKind::Int4Channel { tokens };
            // Each channel its own shape (outliers, constants, signed zeros, NaN, …).
            let columns: Vec<Vec<f32>> = (0..hd)
                .map(|_| crate::affine::clip_avx2::tests::group(&mut rng, tokens, case % 3 == 0))
                .collect();
            let rows: Vec<f32> = (0..tokens * hd).map(|i| columns[i % hd][i / hd]).collect();
            let bytes = kind.bytes_per_group(hd).unwrap();
            let (mut want, mut got) = (vec![0u8; bytes], vec![0xAAu8; bytes]);
            encode_group_with(Isa::Portable, &rows, tokens, hd, &mut want);
            encode_group_with(Isa::detect(), &rows, tokens, hd, &mut got);
            assert_eq!(want, got, "case {case}");
        }
    }

    #[test]
    fn shapes_and_row_functions_are_checked() {
        let kind = KvCodecKind::Int4Channel { tokens: 16 };
        assert_eq!(kind.bytes_per_row(64), 48);
        assert!(encode_group(kind, &[0.0; 16 * 64], 64, &mut [0u8; 10]).is_err());
        assert!(crate::encode_row_to_vec(kind, &[0.0; 64]).is_err());
        assert!(kind.validate(62).is_err(), "4·62 is not a multiple of 16");
        assert!(crate::KvCodecs { k: kind, v: kind }.validate(64).is_err());
        assert!(crate::KvCodecs::parse("k=int4c,v=int4")
            .unwrap()
            .validate(64)
            .is_ok());
        assert_eq!(
            KvCodecKind::parse("int4c-t32"),
            Ok(KvCodecKind::Int4Channel { tokens: 32 })
        );
        assert_eq!(KvCodecKind::parse(&kind.id()), Ok(kind));
        assert!(KvCodecKind::parse("int4c-t").is_err());
        assert!(KvCodecKind::parse("int4cx").is_err());
    }
}
