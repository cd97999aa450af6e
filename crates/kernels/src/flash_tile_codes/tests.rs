//! Tests of `flash_tile_codes`: every ISA path against the portable definition (bit for bit),
//! and the definition against scores of the decoded K tile.

use super::*;
use rand::{Rng, SeedableRng};

/// A random `int4c` group of 16 tokens (values in ±3): its encoded bytes (header, then code
/// rows) and its decoding, `[16, hd]`.
fn int4c_group(rng: &mut impl Rng, hd: usize) -> (Vec<u8>, Vec<f32>) {
    let kind = KvCodecKind::Int4Channel { tokens: 16 };
    let x: Vec<f32> = (0..16 * hd).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
    let mut group = vec![0u8; kind.bytes_per_group(hd).unwrap()];
    quant::channel::encode_group(kind, &x, hd, &mut group).unwrap();
    let mut decoded = vec![0f32; 16 * hd];
    quant::channel::decode_group(kind, &group, hd, &mut decoded).unwrap();
    (group, decoded)
}

fn feature_sets() -> Vec<CpuFeatures> {
    let d = CpuFeatures::detect();
    let mut v = vec![CpuFeatures::PORTABLE, CpuFeatures::AVX2];
    if d.avxvnni {
        v.push(CpuFeatures {
            avxvnni: true,
            ..CpuFeatures::AVX2
        });
    }
    if d.vnni {
        v.push(CpuFeatures {
            vnni: true,
            ..CpuFeatures::AVX2
        });
    }
    v.push(d);
    v
}

/// Every path (portable, AVX2 `vpmaddwd`, AVX-VNNI, AVX-512 VNNI 256- and 512-bit) gives the
/// portable bits for both code kinds, rows of three and single rows with differing `valid`,
/// over several tiles, with V decoded or read as `int8` / `int4` codes (the same bits as the
/// decoded values on every path); and the scores are close to f32 attention over the
/// decoded keys.
#[test]
#[allow(clippy::needless_range_loop)]
fn code_tiles_match_the_portable_definition_on_every_path() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(41);
    for (hd, keys, v_kind) in [
        (64usize, KeyCodes::Rows, None),
        (64, KeyCodes::Channels, None),
        (128, KeyCodes::Rows, None),
        (16, KeyCodes::Channels, None),
        (80, KeyCodes::Rows, None),
        (64, KeyCodes::Rows, Some(KvCodecKind::Int8 { group: 64 })),
        (64, KeyCodes::Rows, Some(KvCodecKind::Int4 { group: 32 })),
        (
            96,
            KeyCodes::Channels,
            Some(KvCodecKind::Int4 { group: 16 }),
        ),
        (80, KeyCodes::Rows, Some(KvCodecKind::Int8 { group: 16 })),
    ] {
        let modes: &[bool] = if v_kind.is_some() {
            &[false, true]
        } else {
            &[false]
        };
        let rows = 5;
        let qs: Vec<Vec<f32>> = (0..rows)
            .map(|_| (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect())
            .collect();
        let valids_per_tile: Vec<[usize; 5]> = vec![
            [16; 5],
            [9, 9, 9, 3, 16],
            [16, 16, 16, 1, 1],
            [2, 2, 2, 2, 2],
        ];
        let mut results: Vec<Vec<Vec<u32>>> = Vec::new();
        let runs = feature_sets()
            .into_iter()
            .flat_map(|f| modes.iter().map(move |&coded_v| (f, coded_v)));
        for (features, coded_v) in runs {
            let mut sts = vec![TileSoftmax::default(); rows];
            let mut accs = vec![vec![0f32; hd]; rows];
            let mut tile = CodedTile::default();
            tile.reset(hd);
            let mut qc = QueryCodes::default();
            qc.reset(rows, hd);
            let mut trng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
            for valids in &valids_per_tile {
                let n = *valids.iter().max().unwrap();
                let mut vals: Vec<f32> =
                    (0..n * hd).map(|_| trng.gen_range(-1.0f32..1.0)).collect();
                // V rows as codes, `vals` their decoded values.
                let mut v_bytes = Vec::new();
                if let Some(kind) = v_kind {
                    for row in vals.chunks_exact(hd) {
                        v_bytes.extend(quant::encode_row_to_vec(kind, row).unwrap());
                    }
                    let er = EncodedRows::new(kind, hd, &v_bytes).unwrap();
                    quant::decode_rows(&er, &mut vals);
                }
                match keys {
                    KeyCodes::Rows => {
                        let mut bytes = Vec::new();
                        for _ in 0..n {
                            let x: Vec<f32> =
                                (0..hd).map(|_| trng.gen_range(-3.0f32..3.0)).collect();
                            let kind = KvCodecKind::Int8 { group: hd };
                            bytes.extend(quant::encode_row_to_vec(kind, &x).unwrap());
                        }
                        let kind = KvCodecKind::Int8 { group: hd };
                        let er = EncodedRows::new(kind, hd, &bytes).unwrap();
                        // Two runs (as a tile split over two blocks would be).
                        let first = n / 2;
                        tile.load_rows(features, &er.take_rows(first), 0);
                        tile.load_rows(features, &er.skip_rows(first), first);
                        for r in 0..rows {
                            qc.prepare_rows(features, r, &qs[r]);
                        }
                    }
                    KeyCodes::Channels => {
                        let kind = KvCodecKind::Int4Channel { tokens: 16 };
                        let (group, _) = int4c_group(&mut trng, hd);
                        let (params, codes) = quant::channel::split_group(&group, hd);
                        let er = EncodedRows::new_group(kind, hd, params, codes).unwrap();
                        tile.load_channels(features, &er.take_rows(n), 0);
                        let (sc, of) = tile.channel_params();
                        let (sc, of) = (sc.to_vec(), of.to_vec());
                        for r in 0..rows {
                            qc.prepare_channels(features, r, &qs[r], &sc, &of);
                        }
                    }
                }
                let qrefs: Vec<QueryRef<'_>> = (0..rows).map(|r| qc.row(r)).collect();
                let mut acc_refs: Vec<&mut [f32]> = accs.iter_mut().map(|a| &mut a[..]).collect();
                tile_update_codes(
                    features,
                    keys,
                    &mut sts,
                    &mut acc_refs,
                    &qrefs,
                    valids,
                    &tile,
                    match v_kind {
                        Some(kind) if coded_v => {
                            TileValues::Codes(EncodedRows::new(kind, hd, &v_bytes).unwrap())
                        }
                        _ => TileValues::Decoded(&vals),
                    },
                    0.125,
                );
            }
            let mut bits: Vec<Vec<u32>> = accs
                .iter()
                .map(|a| a.iter().map(|x| x.to_bits()).collect())
                .collect();
            bits.push(
                sts.iter()
                    .flat_map(|s| [s.max.to_bits(), s.sum.to_bits()])
                    .collect(),
            );
            results.push(bits);
        }
        for (i, r) in results.iter().enumerate().skip(1) {
            assert_eq!(
                r, &results[0],
                "hd={hd} {keys:?} {v_kind:?}: path {i} vs portable"
            );
        }
    }
}

/// A sealed `int4c` K tile and coded V rows read in registers give the bits of the f32 tile
/// step over the decoded tile (`flash_tile::tile_update`, row by row), for rows of three
/// and single rows with differing `valid`, over several tiles.
#[cfg(target_arch = "x86_64")]
#[test]
fn channel_code_tiles_equal_the_decoded_tile_step() {
    use super::super::flash_tile::tile_update;
    if !CpuFeatures::detect().avx2 {
        return;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(49);
    for (hd, v_kind) in [
        (64usize, KvCodecKind::Int4 { group: 32 }),
        (64, KvCodecKind::Int8 { group: 64 }),
        (96, KvCodecKind::Int4 { group: 16 }),
        (16, KvCodecKind::Int8 { group: 16 }),
    ] {
        let rows = 5;
        let qs: Vec<Vec<f32>> = (0..rows)
            .map(|_| (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect())
            .collect();
        let mut want_st = vec![TileSoftmax::default(); rows];
        let mut want_acc = vec![vec![0f32; hd]; rows];
        let mut got_st = want_st.clone();
        let mut got_acc = want_acc.clone();
        let mut tile = CodedTile::default();
        tile.reset(hd);
        for valids in [[16usize; 5], [9, 9, 9, 3, 16], [16, 16, 16, 1, 8], [2; 5]] {
            let kind = KvCodecKind::Int4Channel { tokens: 16 };
            let (group, k_dec) = int4c_group(&mut rng, hd);
            let (params, codes) = quant::channel::split_group(&group, hd);
            let k_rows = EncodedRows::new_group(kind, hd, params, codes).unwrap();
            let mut v_bytes = Vec::new();
            for _ in 0..16 {
                let v: Vec<f32> = (0..hd).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                v_bytes.extend(quant::encode_row_to_vec(v_kind, &v).unwrap());
            }
            let v_rows = EncodedRows::new(v_kind, hd, &v_bytes).unwrap();
            let mut v_dec = vec![0f32; 16 * hd];
            quant::decode_rows(&v_rows, &mut v_dec);
            for r in 0..rows {
                tile_update(
                    &mut want_st[r],
                    &mut want_acc[r],
                    &qs[r],
                    &k_dec,
                    &v_dec,
                    valids[r],
                    0.125,
                );
            }
            tile.load_channel_params(&k_rows);
            let q_refs: Vec<&[f32]> = qs.iter().map(|q| &q[..]).collect();
            let mut acc_refs: Vec<&mut [f32]> = got_acc.iter_mut().map(|a| &mut a[..]).collect();
            tile_update_channel_codes(
                CpuFeatures::detect(),
                &mut got_st,
                &mut acc_refs,
                &q_refs,
                &valids,
                &tile,
                &k_rows,
                &v_rows,
                0.125,
            );
        }
        for r in 0..rows {
            let bits = |a: &[f32]| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got_acc[r]),
                bits(&want_acc[r]),
                "hd={hd} {v_kind:?} row {r}"
            );
            assert_eq!(got_st[r].max.to_bits(), want_st[r].max.to_bits());
            assert_eq!(got_st[r].sum.to_bits(), want_st[r].sum.to_bits());
        }
    }
}

/// The AVX2 transposition (blocks of 8 positions × 8 words, scalar remainders) equals the
/// scalar one for runs at any tile position and widths with and without 32-byte blocks.
#[test]
fn code_transpositions_agree_for_partial_runs() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(47);
    for hd in [64usize, 96, 80, 16] {
        let kind = KvCodecKind::Int8 { group: hd };
        let mut bytes = Vec::new();
        for _ in 0..16 {
            let x: Vec<f32> = (0..hd).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
            bytes.extend(quant::encode_row_to_vec(kind, &x).unwrap());
        }
        let er = EncodedRows::new(kind, hd, &bytes).unwrap();
        for (at, n) in [(0usize, 16usize), (0, 9), (3, 13), (7, 8), (5, 2)] {
            let run = er.skip_rows(16 - n).take_rows(n);
            let tiles = [CpuFeatures::PORTABLE, CpuFeatures::detect()].map(|f| {
                let mut tile = CodedTile::default();
                tile.reset(hd);
                tile.load_rows(f, &run, at);
                tile
            });
            let [slow, fast] = &tiles;
            assert_eq!(fast.kt, slow.kt, "hd={hd} at={at} n={n}");
            assert_eq!(fast.k_scale, slow.k_scale);
            assert_eq!(fast.k_offset, slow.k_offset);
        }
    }
}

/// A `Channels` tile widened into the transposed layout holds exactly the decoded group
/// (`quant::channel::decode_group`), on the portable and the detected path.
#[test]
fn widened_channel_tiles_equal_decoded_groups() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(45);
    for hd in [64usize, 128, 16] {
        let kind = KvCodecKind::Int4Channel { tokens: 16 };
        let (group, want) = int4c_group(&mut rng, hd);
        let (params, codes) = quant::channel::split_group(&group, hd);
        let er = EncodedRows::new_group(kind, hd, params, codes).unwrap();
        for features in [CpuFeatures::PORTABLE, CpuFeatures::detect()] {
            let mut tile = CodedTile::default();
            tile.reset(hd);
            tile.load_channels(features, &er, 0);
            let mut kt32 = vec![0f32; hd * 16];
            tile.widen_channels(features, &mut kt32);
            for t in 0..16 {
                for c in 0..hd {
                    assert_eq!(
                        kt32[c * 16 + t].to_bits(),
                        want[t * hd + c].to_bits(),
                        "hd={hd} t={t} c={c} {features:?}"
                    );
                }
            }
        }
    }
}

/// Runs of a sealed `int4c` group decoded straight into K transposed
/// (`CodedTile::widen_channel_rows`) hold exactly the decoded rows at their tile positions and
/// leave the others alone, on every path: AVX2 blocks of 8 rows with scalar remainders, widths
/// with and without 64-channel blocks, runs at any tile position.
#[test]
fn channel_rows_widened_in_place_equal_decoded_groups() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(48);
    for hd in [64usize, 128, 96, 16] {
        let kind = KvCodecKind::Int4Channel { tokens: 16 };
        let (group, want) = int4c_group(&mut rng, hd);
        let (params, codes) = quant::channel::split_group(&group, hd);
        let er = EncodedRows::new_group(kind, hd, params, codes).unwrap();
        for (at, n) in [
            (0usize, 16usize),
            (0, 8),
            (8, 8),
            (3, 13),
            (5, 2),
            (0, 9),
            (7, 9),
        ] {
            let first = 16 - n;
            let run = er.skip_rows(first).take_rows(n);
            for features in feature_sets() {
                let mut tile = CodedTile::default();
                tile.reset(hd);
                let mut kt32 = vec![f32::NAN; hd * 16];
                tile.widen_channel_rows(features, &run, at, &mut kt32);
                for p in 0..16 {
                    for c in 0..hd {
                        let got = kt32[c * 16 + p];
                        if (at..at + n).contains(&p) {
                            let t = first + p - at;
                            assert_eq!(
                                got.to_bits(),
                                want[t * hd + c].to_bits(),
                                "hd={hd} at={at} n={n} p={p} c={c} {features:?}"
                            );
                        } else {
                            assert!(got.is_nan(), "hd={hd} at={at} n={n} p={p} wrote outside");
                        }
                    }
                }
            }
        }
    }
}

/// The integer score is the f32 dot product with the decoded key up to the query's
/// quantisation (relative error well under 2% of ‖q‖·‖k̂‖), and the fast transposition
/// equals the scalar one.
#[test]
fn scores_approximate_decoded_keys_and_transpositions_agree() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(43);
    let hd = 128;
    let kind = KvCodecKind::Int8 { group: hd };
    let mut bytes = Vec::new();
    let mut dec = Vec::new();
    for _ in 0..16 {
        let x: Vec<f32> = (0..hd).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
        let e = quant::encode_row_to_vec(kind, &x).unwrap();
        let mut d = vec![0f32; hd];
        quant::decode_row(kind, &e, &mut d).unwrap();
        bytes.extend(e);
        dec.push(d);
    }
    let er = EncodedRows::new(kind, hd, &bytes).unwrap();
    let mut fast = CodedTile::default();
    fast.reset(hd);
    fast.load_rows(CpuFeatures::detect(), &er, 0);
    let mut slow = CodedTile::default();
    slow.reset(hd);
    slow.load_rows(CpuFeatures::PORTABLE, &er, 0);
    assert_eq!(fast.kt, slow.kt);
    let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
    let mut qc = QueryCodes::default();
    qc.reset(1, hd);
    qc.prepare_rows(CpuFeatures::PORTABLE, 0, &q);
    let qr = qc.row(0);
    let qn = q.iter().map(|x| x * x).sum::<f32>().sqrt();
    for (t, k) in dec.iter().enumerate() {
        let got = score_of(
            KeyCodes::Rows,
            &slow,
            &qr,
            t,
            dot_codes(qr.q8, &slow.kt, t),
            1.0,
        );
        let want: f32 = q.iter().zip(k).map(|(a, b)| a * b).sum();
        let kn = k.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!(
            (got - want).abs() < 0.02 * qn * kn,
            "t={t}: {got} vs {want}"
        );
    }
}

/// The query's `vpmaddwd` operands: bytes 0, 2 then 1, 3 of a word, sign-extended to 16 bits
/// (golden words), and every prepared row's pairs are those of its words.
#[test]
fn query_pairs_sign_extend_alternate_bytes() {
    // Bytes (little-endian) 0x01, 0xFF (−1), 0x80 (−128), 0x7F (127).
    assert_eq!(query_pairs(0x7F80_FF01), (0xFF80_0001, 0x007F_FFFF));
    assert_eq!(query_pairs(0), (0, 0));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let hd = 64;
    let mut qc = QueryCodes::default();
    qc.reset(2, hd);
    for r in 0..2 {
        let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
        qc.prepare_rows(CpuFeatures::detect(), r, &q);
    }
    for r in 0..2 {
        let row = qc.row(r);
        assert_eq!(row.pairs.len(), 2 * row.q8.len());
        for (j, &w) in row.q8.iter().enumerate() {
            let b = w.to_le_bytes().map(|x| x as i8 as i32);
            let half = |x: u32, h: u32| (x >> (16 * h)) as u16 as i16 as i32;
            let (e, o) = (row.pairs[2 * j], row.pairs[2 * j + 1]);
            assert_eq!(
                [half(e, 0), half(e, 1), half(o, 0), half(o, 1)],
                [b[0], b[2], b[1], b[3]]
            );
        }
    }
}
