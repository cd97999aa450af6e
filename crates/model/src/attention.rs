//! Causal grouped-query attention for one query token and one query head over K/V read from a
//! [`KvStore`].
//!
//! Owns the score / softmax / weighted-sum arithmetic. Scores are computed one position at a
//! time with a fixed-order dot product and the softmax is summed in position order, so the result
//! depends only on the query and the stored K/V — never on how the store splits positions into
//! chunks (blocks) or which other tokens share the batch. It never writes K/V.
//!
//! With f16 K/V the arithmetic follows ggml's `mul_mat` path (llama.cpp, our correctness
//! reference): the query is rounded to f16 before the K dot products and the softmax weights are
//! rounded to f16 before they weight V, as ggml converts the f32 operand to the f16 type.

use crate::kernels::vec_f16::{accumulate_rows_f16, push_scores_f16, round_through_f16};
use crate::kernels::{axpy_f32, dot_f32};
use crate::kv::{KvChunk, KvStore, SeqSlot};
use quant::PreparedQuery;

/// Reusable per-task buffers.
#[derive(Default)]
pub struct AttnScratch {
    scores: Vec<f32>, // [num_positions]
    q16: Vec<f32>,    // [head_dim] — the query rounded to f16
    /// The query prepared for dot products with quantized keys (per-group sums of q).
    prepared: Option<PreparedQuery>,
}

/// `out = softmax(q·Kᵀ · scale) · V` over positions `0..num_positions` of `kv_head`.
/// Shapes: `q`, `out` are `[head_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn attend_one(
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
    let head_dim = q.len();
    scratch.scores.clear();
    scratch.q16.clear();
    scratch.q16.extend_from_slice(q);
    round_through_f16(&mut scratch.q16);
    let (scores, q16, prepared) = (&mut scratch.scores, &scratch.q16, &mut scratch.prepared);
    kv.for_each_chunk(
        layer,
        slot,
        kv_head,
        num_positions,
        &mut |_, chunk| match chunk {
            KvChunk::F32 { k, .. } => {
                for key in k.chunks_exact(head_dim) {
                    scores.push(dot_f32(q, key) * scale);
                }
            }
            KvChunk::F16 { k, .. } => push_scores_f16(q16, k, scale, scores),
            KvChunk::Encoded { k, .. } => {
                // Scores straight from the encoded bytes: q·x̂ = scale·(q·codes) + offset·Σq.
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
    debug_assert_eq!(
        scores.len(),
        num_positions,
        "KV store returned the wrong number of positions"
    );
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s as f64;
    }
    let inv = (1.0 / sum) as f32;
    out.fill(0.0);
    let mut pos = 0usize;
    kv.for_each_chunk(
        layer,
        slot,
        kv_head,
        num_positions,
        &mut |_, chunk| match chunk {
            KvChunk::F32 { v, .. } => {
                for val in v.chunks_exact(head_dim) {
                    axpy_f32(scores[pos] * inv, val, out);
                    pos += 1;
                }
            }
            KvChunk::F16 { v, .. } => {
                let n = v.len() / head_dim;
                accumulate_rows_f16(&scores[pos..pos + n], inv, v, out);
                pos += n;
            }
            KvChunk::Encoded { v, .. } => {
                for row in v.rows() {
                    quant::axpy_row(v.kind(), scores[pos] * inv, row, out);
                    pos += 1;
                }
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{ContiguousKv, KvDtype};

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
}
