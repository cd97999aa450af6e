//! Causal grouped-query attention for one query token and one query head over K/V read from a
//! [`KvStore`].
//!
//! Owns the score / softmax / weighted-sum arithmetic. Scores are computed one position at a
//! time with a fixed-order dot product and the softmax is summed in position order, so the result
//! depends only on the query and the stored K/V — never on how the store splits positions into
//! chunks (blocks) or which other tokens share the batch. It never writes K/V.
//!
//! With f16 K/V the arithmetic is that of llama.cpp's (our correctness reference) CPU flash
//! attention, `ggml_compute_forward_flash_attn_ext_f16_one_chunk`, which llama.cpp uses by default
//! (`-fa auto` resolves to on for the CPU): the query rounded to f16, f16·f16 scores, an online
//! softmax (running maximum `M`, sum `S = S·ms + vs`, `expf`) and an f16 accumulator for the
//! weighted values, divided by `S` at the end. Positions are visited in order, so the result is
//! still independent of chunking. llama.cpp runs that kernel over the whole range only while the
//! (256-padded) cache is under 512 cells for a one-token decode; beyond
//! 256 (`attention_split::PAD_CELLS`) positions it cuts the cells into one chunk per thread, runs the
//! kernel on each and merges them (`attention_split`): [`AttnArith::Row`] does the same for
//! the thread count it is given (`kv_split`).
//!
//! Hadamard-rotated codecs (`int4h`, `int8h`): the query is rotated once per call (when it is
//! prepared) and dotted with the stored, rotated keys; rotated values are summed as stored and
//! the sum is rotated back once at the end. Every reader of K/V goes through this function.

use half::f16;

use kernels::flash_f16::{accumulate_rows, OnlineSoftmax};
use kernels::{axpy_f32, dot_f32};

/// Up to this many positions llama.cpp's one-token step is one chunk of
/// `flash_attn_ext_f16_one_chunk` (a cache of 256 padded cells); above it, its split-KV path
/// (`attention_split`).
#[cfg(test)]
pub(crate) const F16_ACC_MAX_POSITIONS: usize = crate::attention_split::PAD_CELLS;
use crate::kv::{KvChunk, KvStore, SeqSlot};
use quant::PreparedQuery;

/// Reusable per-task buffers.
#[derive(Default)]
pub struct AttnScratch {
    scores: Vec<f32>, // [num_positions]
    q16: Vec<f32>,    // [head_dim] — the query as the f16 kernel reads it (rounded to f16 or not)
    /// The query prepared for dot products with quantized keys (per-group sums of q).
    prepared: Option<PreparedQuery>,
    /// The query prepared for one group of a per-channel K codec (`int4c`).
    channel: quant::ChannelQuery,
    /// The merged chunks of llama.cpp's split-KV decode.
    split: crate::attention_split::SplitMerge,
}

/// `out = softmax(q·Kᵀ · scale) · V` over positions `0..num_positions` of `kv_head`.
/// Shapes: `q`, `out` are `[head_dim]`.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_one(
    kv: &dyn KvStore,
    layer: usize,
    slot: SeqSlot,
    kv_head: usize,
    num_positions: usize,
    q: &[f32],
    scale: f32,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    attend_window(
        kv,
        layer,
        slot,
        kv_head,
        0,
        num_positions,
        q,
        scale,
        scratch,
        out,
    )
}

/// [`attend_one`] over positions `first..num_positions` only (a sliding-window layer's query
/// attends the last `window` positions): the same arithmetic over the attended positions, so
/// `first = 0` is `attend_one`.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_window(
    kv: &dyn KvStore,
    layer: usize,
    slot: SeqSlot,
    kv_head: usize,
    first: usize,
    num_positions: usize,
    q: &[f32],
    scale: f32,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    attend_window_with(
        AttnArith::Row,
        1,
        kv,
        layer,
        slot,
        kv_head,
        first,
        num_positions,
        q,
        scale,
        scratch,
        out,
    )
}

/// Which of llama.cpp's two CPU flash-attention kernels a forward step reproduces over f16 K/V
/// (other encodings are unaffected).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttnArith {
    /// `flash_attn_ext_f16_one_chunk`, which llama.cpp runs for steps of fewer than
    /// [`PREFILL_MIN_TOKENS`] query tokens (decode, short prompts): query rounded to f16, f16
    /// accumulator; beyond 256 (`attention_split::PAD_CELLS`) positions over one chunk of cells per
    /// thread, merged (its split-KV decode, `attention_split`).
    #[default]
    Row,
    /// `flash_attn_ext_tiled`, which llama.cpp runs for steps of at least
    /// [`PREFILL_MIN_TOKENS`] query tokens (prompt prefill, perplexity): f32 query, f16 K/V
    /// widened to f32, f32 accumulator at every depth.
    Prefill,
    /// Not one of llama.cpp's: the query rounded to f16 (as in [`AttnArith::Row`]), an f32
    /// accumulator, the tiled regime of `attention_plan` at every depth (segments of 512
    /// positions merged in order), so a row over a short context shares its K/V tiles with
    /// the other heads of its GQA group and runs the multi-row tile kernels instead of
    /// llama.cpp's one-position-at-a-time f16 accumulation (its rows then differ from
    /// llama.cpp's by the f16 rounding of the accumulator and, beyond 256 positions, by its
    /// split-KV chunks). Rows that stay
    /// in the exact regime (f32 K/V, head sizes the tile kernels do not take, sliding-window
    /// layers) keep `Row`'s per-position arithmetic with an f32 accumulator. The engine's
    /// default where [`AttnArith::invariant`] says so.
    Tiled,
}

/// llama.cpp takes its tiled prefill kernel from this many query tokens in one step on
/// (`GGML_FA_TILE_Q`).
pub const PREFILL_MIN_TOKENS: usize = 64;

impl AttnArith {
    /// The engine's default: [`AttnArith::Tiled`], the regime that goes with its packed
    /// matmuls' block-sum order (`PackedDef::invariant()`), which already leaves llama.cpp's
    /// float order; llama.cpp's own arithmetic is [`AttnArith::Row`] (the engine's
    /// `llama_cpp_prefill`).
    pub fn invariant() -> AttnArith {
        AttnArith::Tiled
    }

    /// How logs and reports name it.
    pub fn name(self) -> &'static str {
        match self {
            AttnArith::Row => "llama.cpp-row",
            AttnArith::Prefill => "llama.cpp-tiled",
            AttnArith::Tiled => "tiled",
        }
    }

    /// The kernel llama.cpp uses for a step of `num_tokens` query tokens.
    pub fn for_step(num_tokens: usize) -> AttnArith {
        if num_tokens >= PREFILL_MIN_TOKENS {
            AttnArith::Prefill
        } else {
            AttnArith::Row
        }
    }
}

/// [`attend_window`] in the arithmetic `arith` selects. `kv_split` is the thread count whose
/// split-KV decode [`AttnArith::Row`] reproduces beyond 256 (`attention_split::PAD_CELLS`) positions
/// (llama.cpp's `-t`; 0 for a row of a multi-token step, which llama.cpp does not split;
/// ignored by the other arithmetics).
#[allow(clippy::too_many_arguments)]
pub fn attend_window_with(
    arith: AttnArith,
    kv_split: usize,
    kv: &dyn KvStore,
    layer: usize,
    slot: SeqSlot,
    kv_head: usize,
    first: usize,
    num_positions: usize,
    q: &[f32],
    scale: f32,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let head_dim = q.len();
    debug_assert!(first < num_positions, "a query attends at least itself");
    scratch.scores.clear();
    scratch.q16.clear();
    match arith {
        AttnArith::Row | AttnArith::Tiled => scratch
            .q16
            .extend(q.iter().map(|&x| f16::from_f32(x).to_f32())),
        AttnArith::Prefill => scratch.q16.extend_from_slice(q),
    }
    let (scores, q16, prepared, channel, merged) = (
        &mut scratch.scores,
        &scratch.q16,
        &mut scratch.prepared,
        &mut scratch.channel,
        &mut scratch.split,
    );
    out.fill(0.0);
    let mut online = OnlineSoftmax::default();
    let round_f16 = arith == AttnArith::Row;
    // llama.cpp's split-KV decode: cells per chunk, and the chunk in progress.
    let split = match arith {
        AttnArith::Row => crate::attention_split::chunk_cells(num_positions, kv_split),
        _ => None,
    };
    if split.is_some() {
        merged.reset(head_dim);
    }
    let mut chunk_at = first / split.unwrap_or(usize::MAX);
    let mut is_f16 = false;
    kv.for_each_chunk_from(
        layer,
        slot,
        kv_head,
        first,
        num_positions,
        &mut |start, chunk| match chunk.skip_positions(first.saturating_sub(start), head_dim) {
            KvChunk::F32 { k, .. } => {
                for key in k.chunks_exact(head_dim) {
                    scores.push(dot_f32(q, key) * scale);
                }
            }
            KvChunk::F16 { k, v } => {
                is_f16 = true;
                let Some(cells) = split else {
                    accumulate_rows(&mut online, out, q16, k, v, scale, round_f16);
                    return;
                };
                // Cut at chunk boundaries; a finished chunk is merged and the next starts afresh.
                let (mut k, mut v, mut pos) = (k, v, start.max(first));
                while !k.is_empty() {
                    if pos / cells != chunk_at {
                        merged.merge(&online, out);
                        (online, chunk_at) = (OnlineSoftmax::default(), pos / cells);
                        out.fill(0.0);
                    }
                    let take = ((chunk_at + 1) * cells - pos).min(k.len() / head_dim) * head_dim;
                    accumulate_rows(&mut online, out, q16, &k[..take], &v[..take], scale, true);
                    (k, v, pos) = (&k[take..], &v[take..], pos + take / head_dim);
                }
            }
            KvChunk::Encoded { k, .. } if k.kind().is_block() => {
                // Per-channel K: scales folded into the query once per group (block).
                channel.prepare(q, k.params());
                for row in k.rows() {
                    scores.push(channel.score(row) * scale);
                }
            }
            KvChunk::Encoded { k, .. } => {
                // Scores straight from the encoded bytes: q·x̂ = scale·(q·codes) + offset·Σq
                // (for rotated codecs the prepared query is Hq, rotated once here).
                let prep = match prepared {
                    Some(p) if p.kind() == k.kind() && p.head_dim() == head_dim => {
                        p.reset(k.kind(), q)
                            .expect("codec validated for this head_dim");
                        p
                    }
                    _ => prepared.insert(
                        PreparedQuery::new(k.kind(), q).expect("codec validated for this head_dim"),
                    ),
                };
                for row in k.rows() {
                    scores.push(prep.dot(row) * scale);
                }
            }
        },
    );
    if is_f16 && split.is_some() {
        merged.merge(&online, out);
        merged.finish(out);
        return;
    }
    if is_f16 {
        let inv = if online.sum == 0.0 {
            0.0
        } else {
            1.0 / online.sum
        };
        for o in out.iter_mut() {
            *o *= inv;
        }
        return;
    }
    debug_assert_eq!(
        scores.len(),
        num_positions - first,
        "KV store returned the wrong number of positions"
    );
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s as f64;
    }
    let inv = (1.0 / sum) as f32;
    weighted_values(
        kv,
        (layer, slot, kv_head),
        first..num_positions,
        scores,
        inv,
        out,
    );
}

/// `out = Σ scores[i]·inv·v[first + i]` over positions `range` of one KV head of `slot` in
/// `layer` (the exact regime's second pass over f32 and encoded V).
fn weighted_values(
    kv: &dyn KvStore,
    (layer, slot, kv_head): (usize, SeqSlot, usize),
    range: std::ops::Range<usize>,
    scores: &[f32],
    inv: f32,
    out: &mut [f32],
) {
    let (first, num_positions, head_dim) = (range.start, range.end, out.len());
    let mut pos = 0usize;
    let mut v_kind = None;
    kv.for_each_chunk_from(
        layer,
        slot,
        kv_head,
        first,
        num_positions,
        &mut |start, chunk| match chunk.skip_positions(first.saturating_sub(start), head_dim) {
            KvChunk::F32 { v, .. } => {
                for val in v.chunks_exact(head_dim) {
                    axpy_f32(scores[pos] * inv, val, out);
                    pos += 1;
                }
            }
            KvChunk::F16 { .. } => unreachable!("f16 chunks are handled by the online pass"),
            KvChunk::Encoded { v, .. } => {
                // Rows as stored (rotated for rotated codecs), rotated back once below.
                v_kind = Some(v.kind());
                for row in v.rows() {
                    quant::axpy_row_stored(v.kind(), scores[pos] * inv, row, out);
                    pos += 1;
                }
            }
        },
    );
    if let Some(kind) = v_kind {
        quant::unrotate_stored_sum(kind, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvDtype;
    use crate::kv_contiguous::ContiguousKv;

    #[test]
    fn single_position_returns_its_value() {
        let mut kv = ContiguousKv::new(1, 1, 1, 4, 8, KvDtype::F32).unwrap();
        kv.write(
            0,
            SeqSlot(0),
            0,
            &[1.0, 0.0, 0.0, 0.0],
            &[5.0, 6.0, 7.0, 8.0],
        )
        .unwrap();
        let mut out = [0.0; 4];
        attend_one(
            &kv,
            0,
            SeqSlot(0),
            0,
            1,
            &[1.0, 1.0, 1.0, 1.0],
            0.5,
            &mut AttnScratch::default(),
            &mut out,
        );
        assert_eq!(out, [5.0, 6.0, 7.0, 8.0]);
    }

    #[test]
    fn matches_naive_softmax_attention() {
        let (hd, n) = (8, 5);
        let mut kv = ContiguousKv::new(1, 1, 1, hd, n, KvDtype::F32).unwrap();
        let ks: Vec<Vec<f32>> = (0..n)
            .map(|p| {
                (0..hd)
                    .map(|i| ((p * 7 + i * 3) % 11) as f32 * 0.1 - 0.5)
                    .collect()
            })
            .collect();
        let vs: Vec<Vec<f32>> = (0..n)
            .map(|p| {
                (0..hd)
                    .map(|i| ((p * 5 + i) % 13) as f32 * 0.2 - 1.0)
                    .collect()
            })
            .collect();
        for p in 0..n {
            kv.write(0, SeqSlot(0), p, &ks[p], &vs[p]).unwrap();
        }
        let q: Vec<f32> = (0..hd).map(|i| i as f32 * 0.3 - 1.0).collect();
        let scale = 1.0 / (hd as f32).sqrt();
        let s: Vec<f32> = ks
            .iter()
            .map(|k| k.iter().zip(&q).map(|(a, b)| a * b).sum::<f32>() * scale)
            .collect();
        let z: f32 = s.iter().map(|x| x.exp()).sum();
        let mut want = vec![0.0f32; hd];
        for p in 0..n {
            for i in 0..hd {
                want[i] += s[p].exp() / z * vs[p][i];
            }
        }
        let mut out = vec![0.0; hd];
        attend_one(
            &kv,
            0,
            SeqSlot(0),
            0,
            n,
            &q,
            scale,
            &mut AttnScratch::default(),
            &mut out,
        );
        for i in 0..hd {
            assert!(
                (out[i] - want[i]).abs() < 1e-5,
                "{i}: {} vs {}",
                out[i],
                want[i]
            );
        }
    }

    /// Softmax attention of `q` over rows `ks` / `vs` in f64: `[head_dim]` output.
    fn exact_attention(ks: &[Vec<f64>], vs: &[Vec<f64>], q: &[f32], scale: f64) -> Vec<f64> {
        let s: Vec<f64> = ks
            .iter()
            .map(|k| k.iter().zip(q).map(|(a, &b)| a * b as f64).sum::<f64>() * scale)
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        (0..q.len())
            .map(|i| (0..s.len()).map(|p| (s[p] - m).exp() / z * vs[p][i]).sum())
            .collect()
    }

    /// Encoded K/V (rotated or not, K and V codecs differing) against exact softmax attention
    /// over the rows as they decode: the rotated query and the once-rotated-back value sum must
    /// give what attention over the unrotated decoded rows gives.
    #[test]
    fn encoded_and_rotated_codecs_match_attention_over_decoded_rows() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(43);
        let (hd, n) = (64, 29);
        for spec in [
            "int4",
            "int4h",
            "int8h",
            "k=int4h,v=int4",
            "k=int8,v=int4h-g64",
        ] {
            let codecs = KvDtype::parse(spec).unwrap();
            let mut kv = ContiguousKv::new(1, 1, 1, hd, n, codecs).unwrap();
            let (mut ks, mut vs) = (Vec::new(), Vec::new());
            for p in 0..n {
                // K rows with an outlier channel, as the real model has.
                let mut k: Vec<f32> = (0..hd).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                k[7] += 12.0;
                let v: Vec<f32> = (0..hd).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
                kv.write(0, SeqSlot(0), p, &k, &v).unwrap();
                let decoded = |kind, x: &[f32]| -> Vec<f64> {
                    let bytes = quant::encode_row_to_vec(kind, x).unwrap();
                    let mut out = vec![0f32; hd];
                    quant::decode_row(kind, &bytes, &mut out).unwrap();
                    out.into_iter().map(f64::from).collect()
                };
                ks.push(decoded(codecs.k, &k));
                vs.push(decoded(codecs.v, &v));
            }
            let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            let want = exact_attention(&ks, &vs, &q, 0.125);
            let mut out = vec![0.0f32; hd];
            attend_one(
                &kv,
                0,
                SeqSlot(0),
                0,
                n,
                &q,
                0.125,
                &mut AttnScratch::default(),
                &mut out,
            );
            for i in 0..hd {
                assert!(
                    (out[i] as f64 - want[i]).abs() < 1e-4,
                    "{spec} i={i}: {} vs {}",
                    out[i],
                    want[i]
                );
            }
        }
    }

    /// The f16 online path (both the f16-accumulator and the f32-accumulator regimes) against
    /// exact softmax attention over the same f16-stored K/V.
    #[test]
    fn f16_online_softmax_matches_naive_attention() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(41);
        let hd = 64;
        for n in [
            1usize,
            37,
            F16_ACC_MAX_POSITIONS,
            F16_ACC_MAX_POSITIONS + 45,
        ] {
            let mut kv = ContiguousKv::new(1, 1, 1, hd, n, KvDtype::F16).unwrap();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for p in 0..n {
                let k: Vec<f32> = (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
                let v: Vec<f32> = (0..hd).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
                kv.write(0, SeqSlot(0), p, &k, &v).unwrap();
                let r16 = |x: &[f32]| -> Vec<f64> {
                    x.iter()
                        .map(|&a| f16::from_f32(a).to_f32() as f64)
                        .collect()
                };
                ks.push(r16(&k));
                vs.push(r16(&v));
            }
            let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let scale = 0.125f32;
            let want = exact_attention(&ks, &vs, &q, 0.125);
            let mut out = vec![0.0f32; hd];
            attend_one(
                &kv,
                0,
                SeqSlot(0),
                0,
                n,
                &q,
                scale,
                &mut AttnScratch::default(),
                &mut out,
            );
            for i in 0..hd {
                // f16 query and (for short runs) an f16 accumulator: a few f16 ulps of 3.0.
                assert!(
                    (out[i] as f64 - want[i]).abs() < 1e-2,
                    "n={n} i={i}: {} vs {}",
                    out[i],
                    want[i]
                );
            }
        }
    }
}
