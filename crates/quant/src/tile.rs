//! Decoding a run of encoded rows at once: what a tiled attention kernel does with one K/V tile
//! (decode it once into an f32 scratch, then let every query row of the tile read it).
//!
//! Owns the shape check per call (not per row) and the per-codec row loop; every row decodes to
//! exactly what [`crate::decode_row`] (row codecs) or [`crate::channel::decode_group`] (block
//! codecs) give, on every instruction-set path (AVX-512 F+BW decodes integer codes 16 at a
//! time where present, AVX2 8 at a time, else portable). Never allocates, never scores.

use crate::dispatch::pick;
use crate::hadamard;
use crate::isa::Isa;
use crate::kind::KvCodecKind;
use crate::layout::{group_params, split_fp8, split_int};
use crate::rows::EncodedRows;

/// Widest head the block-codec decoder keeps its per-channel parameters on the stack for.
const STACK_CHANNELS: usize = 256;

/// Decodes every row of `rows` into `out` (`[rows.num_rows(), head_dim]`, row-major), on the
/// detected instruction-set path. Rotated codecs are rotated back (the values as written).
///
/// # Panics
/// If `out` is not `rows.num_rows() · head_dim` long (a caller bug).
pub fn decode_rows(rows: &EncodedRows<'_>, out: &mut [f32]) {
    decode_rows_with(Isa::detect(), rows, out)
}

/// [`decode_rows`] on an explicit instruction-set path (bit-identical on every path).
pub fn decode_rows_with(isa: Isa, rows: &EncodedRows<'_>, out: &mut [f32]) {
    let hd = rows.head_dim();
    assert_eq!(
        out.len(),
        rows.num_rows() * hd,
        "decode_rows: output is not num_rows × head_dim"
    );
    let kind = rows.kind();
    let outs = out.chunks_exact_mut(hd);
    match kind.storage() {
        KvCodecKind::F32 => {
            for (o, r) in outs.zip(rows.rows()) {
                pick!(isa, decode_f32(r, o));
            }
        }
        KvCodecKind::F16 => {
            for (o, r) in outs.zip(rows.rows()) {
                pick!(isa, decode_f16(r, o));
            }
        }
        KvCodecKind::Bf16 => {
            for (o, r) in outs.zip(rows.rows()) {
                pick!(isa, decode_bf16(r, o));
            }
        }
        KvCodecKind::Fp8E4m3 => {
            for (o, r) in outs.zip(rows.rows()) {
                let (scale, codes) = split_fp8(r);
                pick!(isa, decode_e4m3(scale, codes, o));
            }
        }
        KvCodecKind::Int8 { group } | KvCodecKind::Int4 { group } => {
            let four_bit = matches!(kind.storage(), KvCodecKind::Int4 { .. });
            #[cfg(target_arch = "x86_64")]
            if isa.use_avx512() && four_bit && !kind.is_rotated() && group.is_multiple_of(16) {
                // SAFETY: `use_avx512` is true only when AVX-512 F+BW and AVX2+FMA+F16C were
                // detected at runtime; the kernel asserts its shapes (whole rows, checked above).
                unsafe { crate::avx512::decode_u4_rows(rows.bytes(), hd, group, out) };
                return;
            }
            #[cfg(target_arch = "x86_64")]
            // (`int8` rows on AVX-512 keep its per-row 512-bit decode below.)
            if isa.use_avx2()
                && !kind.is_rotated()
                && group.is_multiple_of(8)
                && (four_bit || !isa.use_avx512())
            {
                // SAFETY: `use_avx2` is true only when AVX2+FMA+F16C were detected at runtime;
                // the kernel asserts its shapes (whole rows, checked above).
                unsafe {
                    if four_bit {
                        crate::avx2::decode_int_rows::<true>(rows.bytes(), hd, group, out)
                    } else {
                        crate::avx2::decode_int_rows::<false>(rows.bytes(), hd, group, out)
                    }
                };
                return;
            }
            for (o, r) in outs.zip(rows.rows()) {
                let (params, codes) = split_int(r, hd, group);
                #[cfg(target_arch = "x86_64")]
                if isa.use_avx512() {
                    // SAFETY: `use_avx512` is true only when AVX-512 F+BW and AVX2+FMA+F16C
                    // were detected at runtime; the kernels assert their slice lengths.
                    unsafe { decode_int_row_avx512(params, codes, group, four_bit, o) };
                    if kind.is_rotated() {
                        hadamard::fwht(o);
                    }
                    continue;
                }
                pick!(isa, decode_int_row(params, codes, group, four_bit, o));
                if kind.is_rotated() {
                    hadamard::fwht(o);
                }
            }
        }
        KvCodecKind::Int4Channel { .. } => {
            let params = rows.params();
            let mut stack = [[0f32; STACK_CHANNELS]; 2];
            let mut heap: [Vec<f32>; 2] = Default::default();
            let [scales, offsets] = if hd <= STACK_CHANNELS {
                let [s, o] = &mut stack;
                [&mut s[..hd], &mut o[..hd]]
            } else {
                heap.iter_mut().for_each(|v| v.resize(hd, 0.0));
                let [s, o] = &mut heap;
                [&mut s[..], &mut o[..]]
            };
            // The header's (scale, offset) f16 pairs widened at once (exact on every path),
            // then split.
            let mut pairs = [0f32; 2 * STACK_CHANNELS];
            if hd <= STACK_CHANNELS {
                pick!(isa, decode_f16(params, &mut pairs[..2 * hd]));
                let channels = scales.iter_mut().zip(offsets.iter_mut());
                for ((s, o), pair) in channels.zip(pairs.chunks_exact(2)) {
                    (*s, *o) = (pair[0], pair[1]);
                }
            } else {
                let channels = scales.iter_mut().zip(offsets.iter_mut());
                for (c, (s, o)) in channels.enumerate() {
                    (*s, *o) = group_params(params, c);
                }
            }
            let (scales, offsets): (&[f32], &[f32]) = (scales, offsets);
            for (o, r) in outs.zip(rows.rows()) {
                #[cfg(target_arch = "x86_64")]
                if isa.use_avx512() {
                    // SAFETY: AVX-512 F+BW (and AVX2) detected at runtime (`use_avx512`).
                    unsafe { crate::avx512::decode_u4_channels(scales, offsets, r, o) };
                    continue;
                }
                pick!(isa, decode_u4_channels(scales, offsets, r, o));
            }
        }
        KvCodecKind::Int8Hadamard { .. } | KvCodecKind::Int4Hadamard { .. } => {
            unreachable!("storage() is never a rotated codec")
        }
    }
}

/// One integer row on the AVX-512 kernels: groups in order, each `fma(code, scale, offset)`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
fn decode_int_row_avx512(
    params: &[u8],
    codes: &[u8],
    group: usize,
    four_bit: bool,
    out: &mut [f32],
) {
    for (g, og) in out.chunks_exact_mut(group).enumerate() {
        // F16C inline: the exact widening of `group_params` without `half`'s out-of-line call.
        let (scale, offset) = crate::avx512::group_params_f16c(params, g);
        if four_bit {
            crate::avx512::decode_u4(
                scale,
                offset,
                &codes[g * group / 2..(g + 1) * group / 2],
                og,
            );
        } else {
            crate::avx512::decode_u8(scale, offset, &codes[g * group..(g + 1) * group], og);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Every codec: rows decoded together equal rows decoded one at a time (or the group
    /// decoded whole), on the portable and the detected path, bit for bit.
    #[test]
    fn decoded_runs_equal_single_rows_on_every_path() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let hd = 64;
        for spec in [
            "f32", "f16", "bf16", "fp8", "int8", "int8-g32", "int8-g16", "int4", "int8h", "int4h",
            "int4-g64",
        ] {
            let kind = KvCodecKind::parse(spec).unwrap();
            let n = 11;
            let mut bytes = Vec::new();
            let mut want = Vec::new();
            for _ in 0..n {
                let x: Vec<f32> = (0..hd).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
                let enc = crate::encode_row_to_vec(kind, &x).unwrap();
                let mut dec = vec![0f32; hd];
                crate::decode_row(kind, &enc, &mut dec).unwrap();
                bytes.extend_from_slice(&enc);
                want.extend(dec.iter().map(|v| v.to_bits()));
            }
            let rows = EncodedRows::new(kind, hd, &bytes).unwrap();
            for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
                let mut out = vec![0f32; n * hd];
                decode_rows_with(isa, &rows, &mut out);
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{spec} {isa:?}");
                // A sub-run (skip 3, take 5) is the matching slice.
                let sub = rows.skip_rows(3).take_rows(5);
                let mut out = vec![0f32; 5 * hd];
                decode_rows_with(isa, &sub, &mut out);
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want[3 * hd..8 * hd], "{spec} {isa:?} sub-run");
            }
        }
        // Block codec: a group's rows (any sub-run) equal the whole group decoded.
        let kind = KvCodecKind::parse("int4c").unwrap();
        let t = kind.block_tokens().unwrap();
        let x: Vec<f32> = (0..t * hd).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
        let mut group = vec![0u8; kind.bytes_per_group(hd).unwrap()];
        crate::channel::encode_group(kind, &x, hd, &mut group).unwrap();
        let mut whole = vec![0f32; t * hd];
        crate::channel::decode_group(kind, &group, hd, &mut whole).unwrap();
        let (params, codes) = crate::channel::split_group(&group, hd);
        let rows = EncodedRows::new_group(kind, hd, params, codes).unwrap();
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
            let sub = rows.skip_rows(2).take_rows(9);
            let mut out = vec![0f32; 9 * hd];
            decode_rows_with(isa, &sub, &mut out);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out), bits(&whole[2 * hd..11 * hd]), "int4c {isa:?}");
        }
    }
}
