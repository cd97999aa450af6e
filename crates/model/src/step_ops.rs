//! The operations a step must perform at least: multiply-adds of the weight matrices (on the
//! quantized weights, 8-bit integer dot products in the engine's kernels) and of attention (QKᵀ
//! and P·V over every attended position, f32), for a run of tokens at a cached depth — the
//! compute side of `agentkv bench-model --roofline`, divided by `kernels::peak`'s measured rates.
//!
//! Owns the counting only (norms, RoPE, softmax and activations are left out: a few operations
//! per element, against hundreds per weight row); it never runs the model.

use crate::model::Model;

/// Multiply-adds of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepOps {
    /// Every layer's weight matrices for every token, and the output projection for the rows
    /// whose logits are computed.
    pub matmul_macs: u64,
    /// QKᵀ and P·V of every query head of every layer over the positions each token attends.
    pub attention_macs: u64,
}

impl StepOps {
    /// A step of `tokens` tokens following `depth` cached ones, logits for `logit_rows` of them.
    pub fn of(model: &Model, tokens: usize, depth: usize, logit_rows: usize) -> StepOps {
        let (c, w) = (model.config(), model.weights());
        let mut per_token = 0u64;
        for l in &w.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                per_token += (m.num_rows * m.row_len) as u64;
            }
        }
        let output = (w.output.num_rows * w.output.row_len) as u64;
        let mut attention_macs = 0u64;
        for layer in 0..c.num_layers {
            let window = c.window_of(layer);
            let attended: u64 = (0..tokens)
                .map(|t| {
                    let positions = depth + t + 1;
                    window.map_or(positions, |w| positions.min(w)) as u64
                })
                .sum();
            attention_macs += 2 * attended * (c.num_heads * c.head_dim) as u64;
        }
        StepOps {
            matmul_macs: per_token * tokens as u64 + output * logit_rows as u64,
            attention_macs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{tiny_model, TinyModelSpec, TINY_VOCAB};

    /// Counted by hand for the default tiny model (2 layers, hidden 64, FFN 96, 4 heads of 16,
    /// 2 KV heads): per token and layer Q 64·64, K and V 32·64 each, O 64·64, gate, up and down
    /// 96·64 each; the output projection `TINY_VOCAB`·64 per logit row.
    #[test]
    fn a_step_counts_every_matrix_and_every_attended_position() {
        let m = tiny_model(&TinyModelSpec::default()).unwrap();
        let per_layer_token = (64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 96 * 64) as u64;
        // Three tokens after five cached: they attend 6, 7 and 8 positions.
        let ops = StepOps::of(&m, 3, 5, 1);
        assert_eq!(
            ops.matmul_macs,
            3 * 2 * per_layer_token + (TINY_VOCAB * 64) as u64
        );
        assert_eq!(ops.attention_macs, 2 * 2 * (6 + 7 + 8) * 4 * 16);
        let decode = StepOps::of(&m, 1, 100, 1);
        assert_eq!(decode.attention_macs, 2 * 2 * 101 * 64);
    }
}
