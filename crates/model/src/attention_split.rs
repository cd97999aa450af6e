//! llama.cpp's split-KV decode: how its CPU flash attention (`ggml_compute_forward_flash_attn_ext_f16`
//! in `ggml-cpu/ops.cpp`) computes a one-token step once the KV cache view reaches 512 cells.
//!
//! llama.cpp pads the cells a step attends to a multiple of 256 (`llama_kv_cache::get_n_kv`, at
//! least 256). A one-token step over 512 or more cells takes its split-KV path: the cells are cut
//! into one chunk per thread (`ceil(cells / threads)` cells each, from cell 0), each chunk runs
//! the per-row kernel (`flash_attn_ext_f16_one_chunk`: f16 query, f16 accumulator, online
//! softmax) from a fresh state, and the chunks' states `(M, S, acc)` are merged in chunk order
//! (`ggml_flash_attn_ext_reduce_partials`): `M' = max(M, M_c)`, `acc = acc·e^(M−M') + acc_c·e^(M_c−M')`,
//! `S` likewise, chunks with `S_c = 0` (every cell masked) skipped; then `out = acc · (1/S)`.
//! Below 512 cells the whole range is one chunk of the per-row kernel, divided by `S` directly.
//!
//! Only a one-token step takes that path (a step of several query tokens runs the per-row kernel
//! over the whole range). The result depends on llama.cpp's thread count, so reproducing
//! llama-server run with `-t N` takes `threads = N`. A single sequence's cells are its positions (a fresh cache fills cells in
//! order), so chunk boundaries are positions. This module owns the chunk arithmetic; it never
//! reads a KV store (the caller feeds it rows in position order) and never parallelises.

use kernels::flash_f16::OnlineSoftmax;

/// llama.cpp pads a step's KV cells to a multiple of this.
pub const PAD_CELLS: usize = 256;
/// From this many (padded) cells on, a one-token step takes the split-KV path.
pub const SPLIT_MIN_CELLS: usize = 512;

/// Cells per chunk of llama.cpp's split-KV decode over `num_positions` positions with
/// `threads` threads, or `None` when it runs one chunk (fewer than [`SPLIT_MIN_CELLS`] padded
/// cells, or `threads == 0`: a step of several query tokens, which llama.cpp never splits).
pub fn chunk_cells(num_positions: usize, threads: usize) -> Option<usize> {
    let cells = num_positions.div_ceil(PAD_CELLS).max(1) * PAD_CELLS;
    (cells >= SPLIT_MIN_CELLS && threads > 0).then(|| cells.div_ceil(threads))
}

/// The merged state of the chunks finished so far.
#[derive(Debug, Clone)]
pub struct SplitMerge {
    max: f32,
    sum: f32,
    /// `[head_dim]`.
    acc: Vec<f32>,
}

impl Default for SplitMerge {
    fn default() -> Self {
        SplitMerge {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            acc: Vec::new(),
        }
    }
}

impl SplitMerge {
    /// Starts a row of `head_dim` values.
    pub fn reset(&mut self, head_dim: usize) {
        self.max = f32::NEG_INFINITY;
        self.sum = 0.0;
        self.acc.clear();
        self.acc.resize(head_dim, 0.0);
    }

    /// Merges one finished chunk (its online-softmax state and unnormalised accumulator, as
    /// f32) in ggml's order; a chunk with no attended position (`sum == 0`) is skipped.
    pub fn merge(&mut self, chunk: &OnlineSoftmax, chunk_acc: &[f32]) {
        if chunk.sum == 0.0 {
            return;
        }
        let max = self.max.max(chunk.max);
        let scale_old = (self.max - max).exp();
        let scale_new = (chunk.max - max).exp();
        // `a·so + b·sn` as GCC compiles it for ggml (contracted: the first product fused).
        for (a, &b) in self.acc.iter_mut().zip(chunk_acc) {
            *a = a.mul_add(scale_old, b * scale_new);
        }
        self.sum = self.sum.mul_add(scale_old, chunk.sum * scale_new);
        self.max = max;
    }

    /// `out = acc · (1/S)` (zeros when nothing was attended).
    pub fn finish(&self, out: &mut [f32]) {
        out.copy_from_slice(&self.acc);
        if self.sum != 0.0 {
            let inv = 1.0 / self.sum;
            out.iter_mut().for_each(|o| *o *= inv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_follow_padded_cells_and_threads() {
        assert_eq!(chunk_cells(1, 2), None);
        assert_eq!(chunk_cells(256, 2), None, "256 cells: one chunk");
        assert_eq!(chunk_cells(257, 2), Some(256), "padded to 512, two threads");
        assert_eq!(chunk_cells(257, 1), Some(512));
        assert_eq!(chunk_cells(513, 2), Some(384), "768 cells");
        assert_eq!(chunk_cells(700, 3), Some(256));
        assert_eq!(chunk_cells(4096, 4), Some(1024));
        assert_eq!(chunk_cells(300, 0), None, "a multi-token step: one chunk");
    }

    #[test]
    fn merging_chunks_equals_one_softmax_up_to_rounding() {
        // Two chunks of two scores each over one-dimensional values.
        let chunk = |scores: &[f32], vals: &[f32]| {
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let acc: f32 = w.iter().zip(vals).map(|(w, v)| w * v).sum();
            (
                OnlineSoftmax {
                    max,
                    sum: w.iter().sum(),
                },
                vec![acc],
            )
        };
        let (a, acc_a) = chunk(&[0.5, 2.0], &[1.0, 3.0]);
        let (b, acc_b) = chunk(&[1.0, -1.0], &[5.0, 7.0]);
        let mut m = SplitMerge::default();
        m.reset(1);
        m.merge(&a, &acc_a);
        m.merge(&OnlineSoftmax::default(), &[123.0]); // masked: skipped
        m.merge(&b, &acc_b);
        let mut out = [0.0];
        m.finish(&mut out);
        let (s, v) = ([0.5f32, 2.0, 1.0, -1.0], [1.0f32, 3.0, 5.0, 7.0]);
        let w: Vec<f32> = s.iter().map(|x| (x - 2.0).exp()).collect();
        let want = w.iter().zip(v).map(|(w, v)| w * v).sum::<f32>() / w.iter().sum::<f32>();
        assert!((out[0] - want).abs() < 1e-6, "{} vs {want}", out[0]);
    }

    #[test]
    fn nothing_attended_gives_zeros() {
        let mut m = SplitMerge::default();
        m.reset(3);
        m.merge(&OnlineSoftmax::default(), &[1.0, 2.0, 3.0]);
        let mut out = [9.0; 3];
        m.finish(&mut out);
        assert_eq!(out, [0.0; 3]);
    }
}
