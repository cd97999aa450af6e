//! Kernel timings at SmolLM2-135M's shapes (9 query heads, 3 K/V heads, head size 64, hidden
//! 576, FFN 1536; 16-token blocks): one layer's paged attention for decode (1 and 64 sequences)
//! and prefill (512 tokens) at a depth of 4,096, and the linear product for one and 512 rows
//! (the batch-invariant kernel beside cuBLAS), with the bytes or operations each moves. Printed by `agentkv gpu-check` beside the
//! checks, so a run on a GPU also says how far each kernel is from the device's limits.
//!
//! Owns those measurements only (wall time around synchronised launches, median of repeats).

use std::time::Instant;

use crate::driver::{Arg, Gpu};
use crate::error::CudaError;
use crate::ops::{CudaOps, Ops};

const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const BLOCK_TOKENS: usize = 16;
const DEPTH: usize = 4096;
const REPEATS: usize = 20;

/// One measurement.
#[derive(Debug, Clone)]
pub struct Timing {
    pub name: String,
    pub micros: f64,
    /// What the run moved or computed per second, e.g. "812 GB/s".
    pub rate: String,
}

impl std::fmt::Display for Timing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<56} {:>10.1} µs  {}",
            self.name, self.micros, self.rate
        )
    }
}

fn median_micros(
    gpu: &Gpu,
    mut run: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    run()?; // warm-up
    gpu.synchronize()?;
    let mut times = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        let t = Instant::now();
        run()?;
        gpu.synchronize()?;
        times.push(t.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[REPEATS / 2])
}

/// Every timing, in order.
pub fn run_all(ops: &CudaOps) -> Result<Vec<Timing>, CudaError> {
    let gpu = ops.gpu();
    let mut out = Vec::new();
    for (seqs, tokens_per_seq) in [(1usize, 1usize), (64, 1), (1, 512)] {
        out.push(attention(gpu, seqs, tokens_per_seq)?);
    }
    for rows in [1usize, 512] {
        out.push(linear(ops, rows, 576, 1536, false)?);
        out.push(linear(ops, rows, 576, 1536, true)?);
    }
    Ok(out)
}

fn attention(gpu: &Gpu, seqs: usize, tokens_per_seq: usize) -> Result<Timing, CudaError> {
    let len = DEPTH + tokens_per_seq;
    let max_blocks = len.div_ceil(BLOCK_TOKENS);
    let num_blocks = seqs * max_blocks;
    let pool_len = KV_HEADS * num_blocks * BLOCK_TOKENS * HEAD_DIM;
    let pattern: Vec<u16> = (0..pool_len).map(|i| 0x3000 + (i % 977) as u16).collect();
    let (k, v) = (gpu.upload(&pattern)?, gpu.upload(&pattern)?);
    let tables: Vec<i32> = (0..num_blocks as i32).collect();
    let mut seq = Vec::new();
    let mut pos = Vec::new();
    for s in 0..seqs {
        for t in 0..tokens_per_seq {
            seq.push(s as i32);
            pos.push((DEPTH + t) as i32);
        }
    }
    let tokens = seq.len();
    let q: Vec<f32> = (0..tokens * HEADS * HEAD_DIM)
        .map(|i| ((i % 13) as f32 - 6.0) * 0.05)
        .collect();
    let (qb, tb, sb, pb) = (
        gpu.upload(&q)?,
        gpu.upload(&tables)?,
        gpu.upload(&seq)?,
        gpu.upload(&pos)?,
    );
    let out = gpu.alloc::<f32>(q.len())?;
    let threads = 128u32;
    let args = [
        qb.arg(),
        k.arg(),
        v.arg(),
        tb.arg(),
        sb.arg(),
        pb.arg(),
        out.arg(),
        Arg::I32(HEADS as i32),
        Arg::I32(KV_HEADS as i32),
        Arg::I32(HEAD_DIM as i32),
        Arg::I32(num_blocks as i32),
        Arg::I32(BLOCK_TOKENS as i32),
        Arg::I32(max_blocks as i32),
        Arg::I32(0),
        Arg::F32(0.125),
        Arg::F32(0.0),
    ];
    let grid = ((tokens * HEADS) as u32, 1, 1);
    let shared = threads / 32 * HEAD_DIM as u32 * 4;
    let micros = median_micros(gpu, || {
        gpu.launch("attention_paged_f16", grid, (threads, 1, 1), shared, &args)
    })?;
    // Bytes of K and V each sequence's positions hold (read once per query head group at best).
    let bytes = (seqs * len * KV_HEADS * HEAD_DIM * 2 * 2) as f64;
    let flops =
        (tokens * HEADS * 4 * HEAD_DIM) as f64 * (DEPTH as f64 + tokens_per_seq as f64 / 2.0);
    Ok(Timing {
        name: format!(
            "attention_paged_f16: {seqs} seq × {tokens_per_seq} tok at depth {DEPTH} (1 layer)"
        ),
        micros,
        rate: format!(
            "{:.0} GB/s of K/V, {:.2} TFLOP/s",
            bytes / micros / 1e3,
            flops / micros / 1e6
        ),
    })
}

fn linear(
    ops: &CudaOps,
    rows: usize,
    in_dim: usize,
    out_dim: usize,
    cublas: bool,
) -> Result<Timing, CudaError> {
    let x: Vec<f32> = (0..rows * in_dim).map(|i| (i % 7) as f32 * 0.1).collect();
    let w: Vec<f32> = (0..out_dim * in_dim)
        .map(|i| (i % 5) as f32 * 0.01)
        .collect();
    let gpu = ops.gpu();
    let (xb, wb, mut yb) = (
        gpu.upload(&x)?,
        gpu.upload(&w)?,
        gpu.alloc::<f32>(rows * out_dim)?,
    );
    let micros = median_micros(gpu, || ops.linear(&xb, &wb, &mut yb, rows, in_dim, out_dim))?;
    let flops = 2.0 * (rows * in_dim * out_dim) as f64;
    let bytes = (out_dim * in_dim * 4) as f64;
    Ok(Timing {
        name: format!(
            "{}: {rows} × {in_dim} → {out_dim}",
            if cublas {
                "cublasSgemm (reference)"
            } else {
                "linear_f32"
            }
        ),
        micros,
        rate: format!(
            "{:.2} TFLOP/s, {:.0} GB/s of weights",
            flops / micros / 1e6,
            bytes / micros / 1e3
        ),
    })
}
