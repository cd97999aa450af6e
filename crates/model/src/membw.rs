//! The memory-bandwidth bound of decoding: how many bytes one decoded token reads, and how fast
//! this machine can read them.
//!
//! Owns two measurements used by `agentkv bench-model --membw`: [`DecodeTraffic`], the bytes a
//! batch-1 decode step at depth `D` must read at least once (every weight matrix, the norms, one
//! embedding row, and the K/V of positions `0..=D` over all layers and KV heads), and
//! [`measure_read_bandwidth`], a streaming read of a buffer by every thread of the kernel pool at
//! once (the same threads the forward pass uses): much larger than the last-level cache, or the
//! size of one token's traffic. Their quotient is the upper bound on batch-1 decode speed when
//! weights and K/V come from memory, or from a cache large enough to hold them. Beside them,
//! [`measure_pool_call_ns`]: what the pool's threads' hand-off costs per call. It never runs the
//! model and never changes kernel behaviour.

use std::time::Instant;

use crate::kv::KvDtype;
use crate::model::Model;
use kernels::ThreadPool;

/// Bytes a batch-1 decode step reads at least once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeTraffic {
    /// Every weight matrix in full (the output projection included), the f32 norm vectors and
    /// one row of the token embedding.
    pub weight_bytes: u64,
    /// K and V of one position over all layers and KV heads, as stored (`codecs`).
    pub kv_bytes_per_position: u64,
}

impl DecodeTraffic {
    /// The traffic of `model` with K/V stored as `codecs`.
    pub fn of(model: &Model, codecs: KvDtype) -> DecodeTraffic {
        let w = &model.weights;
        let c = &model.config;
        let mut weight_bytes = 0u64;
        for l in &w.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                weight_bytes += m.info.num_bytes as u64;
            }
            let vecs = l.attn_norm.len()
                + l.ffn_norm.len()
                + [&l.bq, &l.bk, &l.bv]
                    .iter()
                    .map(|b| b.as_ref().map_or(0, Vec::len))
                    .sum::<usize>();
            weight_bytes += 4 * vecs as u64;
        }
        weight_bytes += w.output.info.num_bytes as u64 + 4 * w.output_norm.len() as u64;
        let e = &w.token_embd;
        weight_bytes += (e.info.num_bytes / e.num_rows.max(1)) as u64;
        DecodeTraffic {
            weight_bytes,
            kv_bytes_per_position: codecs.bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim)
                as u64,
        }
    }

    /// Bytes read to decode the token at position `depth` (attention reads positions `0..=depth`).
    pub fn bytes_at_depth(&self, depth: usize) -> u64 {
        self.weight_bytes + self.kv_bytes_per_position * (depth as u64 + 1)
    }
}

/// The result of [`measure_read_bandwidth`].
#[derive(Debug, Clone, PartialEq)]
pub struct Bandwidth {
    pub threads: usize,
    pub buffer_bytes: usize,
    /// Bytes per second of every pass, in order.
    pub passes: Vec<f64>,
}

impl Bandwidth {
    /// The fastest pass (the bound: the memory system sustained at least this).
    pub fn best(&self) -> f64 {
        self.passes.iter().copied().fold(0.0, f64::max)
    }

    /// The median pass.
    pub fn median(&self) -> f64 {
        let mut v = self.passes.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }
}

/// Bytes each pool task reads per pass (many more tasks than threads, so a preempted thread
/// does not leave the others idle).
const TASK_BYTES: usize = 1 << 20;

/// Reads a buffer of `buffer_bytes` (rounded up to whole 1 MiB tasks) `passes` times with every
/// thread of `pool`, after one untimed pass: far larger than the last-level cache, it measures
/// memory; the size of a decode's traffic, what that working set gets from the cache hierarchy.
/// The buffer is filled with non-zero data first, so every page is backed by its own memory.
pub fn measure_read_bandwidth(pool: &ThreadPool, buffer_bytes: usize, passes: usize) -> Bandwidth {
    let tasks = buffer_bytes.div_ceil(TASK_BYTES).max(1);
    let words = TASK_BYTES / 8;
    let buf: Vec<u64> = (0..tasks * words)
        .map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        .collect();
    let sinks: Vec<std::sync::atomic::AtomicU64> = (0..tasks)
        .map(|_| std::sync::atomic::AtomicU64::new(0))
        .collect();
    let pass = || {
        pool.for_each(tasks, &|t| {
            let x = read_words(&buf[t * words..(t + 1) * words]);
            sinks[t].store(x, std::sync::atomic::Ordering::Relaxed);
        });
    };
    pass();
    let bytes = (tasks * TASK_BYTES) as f64;
    let passes = (0..passes.max(1))
        .map(|_| {
            let t0 = Instant::now();
            pass();
            bytes / t0.elapsed().as_secs_f64()
        })
        .collect();
    Bandwidth {
        threads: pool.num_threads(),
        buffer_bytes: tasks * TASK_BYTES,
        passes,
    }
}

/// What one empty call of the kernel pool costs, in nanoseconds: `rounds` rounds of `calls`
/// back-to-back [`ThreadPool::for_each`] calls of one empty task per thread, each round's mean.
/// The threads' hand-off alone (publishing the job, claiming the tasks, counting them done): a
/// decoded token pays it about five times a layer, so where the pool's threads sit far apart
/// (a host that places two vCPUs on distant cores) it can bound decode more than bandwidth does.
pub fn measure_pool_call_ns(pool: &ThreadPool, calls: usize, rounds: usize) -> Vec<f64> {
    let tasks = pool.num_threads();
    (0..rounds.max(1))
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..calls.max(1) {
                pool.for_each(tasks, &|_| {});
            }
            t0.elapsed().as_nanos() as f64 / calls.max(1) as f64
        })
        .collect()
}

/// Xor of all words, eight independent lanes (vectorised by the compiler; xor never limits a
/// streaming read).
fn read_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a ^= x;
        }
    }
    let tail = chunks.remainder().iter().fold(0, |a, &x| a ^ x);
    acc.iter().fold(tail, |a, &x| a ^ x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_words_xors_every_word() {
        let v: Vec<u64> = (1..=21).collect();
        let want = v.iter().fold(0, |a, &x| a ^ x);
        assert_eq!(read_words(&v), want);
    }

    #[test]
    fn bandwidth_reports_every_pass_and_the_whole_buffer() {
        let pool = ThreadPool::new(2);
        let bw = measure_read_bandwidth(&pool, 3 * TASK_BYTES + 1, 3);
        assert_eq!(bw.buffer_bytes, 4 * TASK_BYTES);
        assert_eq!(bw.passes.len(), 3);
        assert!(bw.passes.iter().all(|&p| p > 0.0 && p.is_finite()));
        assert!(bw.best() >= bw.median());
    }

    #[test]
    fn pool_calls_report_every_round() {
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let ns = measure_pool_call_ns(&pool, 100, 3);
            assert_eq!(ns.len(), 3);
            assert!(ns.iter().all(|&n| n > 0.0 && n.is_finite()));
        }
        assert_eq!(measure_pool_call_ns(&ThreadPool::new(2), 0, 0).len(), 1);
    }

    #[test]
    fn traffic_counts_weights_and_kv_per_position() {
        let model = crate::testing::tiny_model(&crate::testing::TinyModelSpec::default())
            .expect("tiny model");
        let t = DecodeTraffic::of(&model, KvDtype::F16);
        let c = &model.config;
        let kv = (c.num_layers * c.num_kv_heads * c.head_dim * 2 * 2) as u64;
        assert_eq!(t.kv_bytes_per_position, kv);
        // The tiny model ties its output to the embedding and has only f32 norms besides its
        // matrices: every tensor is read in full, plus one embedding row for the token.
        let all: u64 = model
            .gguf()
            .tensors()
            .iter()
            .map(|i| i.num_bytes as u64)
            .sum();
        let row = (c.hidden_size * 4) as u64;
        assert_eq!(t.weight_bytes, all + row);
        assert_eq!(t.bytes_at_depth(9), t.weight_bytes + 10 * kv);
    }
}
