//! The per-token element-wise stages of the forward pass, spread over the thread pool by rows:
//! the embedding lookup, RMS norms (input, post-attention, post-FFN, QK-norm), biases, RoPE, the
//! query scale, the residual adds and the gated FFN activation.
//!
//! Every stage runs the same float operations on a token's row as the serial loop did, in the
//! same order, and a row never reads another row: which task (and thread) runs a row, and how
//! the rows are split into tasks, cannot change a bit of the result (the engine's guarantee that
//! a sequence's output does not depend on batching or chunking). Steps of fewer than
//! [`MIN_POOL_ROWS`] tokens (decode) run on the caller, where a pool dispatch would cost more
//! than the work. It owns no matrix product, attention or K/V write, and never decides what to
//! batch.

use crate::config::{FfnAct, ModelConfig};
use crate::ops::{geglu, rms_norm, swiglu, Rope, RopeAngles};
use crate::weights::{LayerWeights, Weights, WeightsError};
use kernels::par::DisjointRows;
use kernels::ThreadPool;

/// Steps with fewer tokens than this run their element-wise stages on the caller.
pub(crate) const MIN_POOL_ROWS: usize = 4;
/// Tasks per thread a stage is split into (the pool balances them dynamically).
const TASKS_PER_THREAD: usize = 4;

/// Calls `f(t)` for every row `t < n`: inline for small `n` or a one-thread pool, otherwise in
/// tasks of consecutive rows spread over `pool`.
pub(crate) fn for_rows(pool: &ThreadPool, n: usize, f: &(dyn Fn(usize) + Sync)) {
    let threads = pool.num_threads();
    if threads == 1 || n < MIN_POOL_ROWS {
        (0..n).for_each(f);
        return;
    }
    let per_task = n.div_ceil(threads * TASKS_PER_THREAD).max(2);
    pool.for_each(n.div_ceil(per_task), &|task| {
        (task * per_task..((task + 1) * per_task).min(n)).for_each(f)
    });
}

/// `out = rms_norm(x)` for a row of `x` that is written in place (the arithmetic of
/// [`rms_norm`]: the sum of squares is taken before any element changes).
pub(crate) fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let sum_sq: f64 = x.iter().map(|&v| f64::from(v * v)).sum();
    let mean = (sum_sq / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (o, &w) in x.iter_mut().zip(weight) {
        *o = *o * scale * w;
    }
}

/// Row `t` of `x` (`[n, hidden]`) = the embedding of `tokens[t]`, times the embedding scale.
pub(crate) fn embed(
    pool: &ThreadPool,
    cfg: &ModelConfig,
    w: &Weights,
    tokens: &[u32],
    x: &mut [f32],
) -> Result<(), WeightsError> {
    let hd = cfg.hidden_size;
    let rows = DisjointRows::new(x, hd);
    let first_error = std::sync::Mutex::new(None);
    for_rows(pool, tokens.len(), &|t| {
        // SAFETY: `for_rows` calls every row index exactly once, so row `t` has one writer.
        let row = unsafe { rows.row_mut(t) };
        if let Err(e) = w.embed(tokens[t], row) {
            first_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
            return;
        }
        if let Some(scale) = cfg.embed_scale {
            row.iter_mut().for_each(|v| *v *= scale);
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Row `t` of `xn` = `rms_norm(row t of x)` for the first `xn.len() / hidden` rows.
pub(crate) fn norm(pool: &ThreadPool, x: &[f32], weight: &[f32], eps: f32, xn: &mut [f32]) {
    let hd = weight.len();
    let n = xn.len() / hd;
    let out = DisjointRows::new(xn, hd);
    for_rows(pool, n, &|t| {
        // SAFETY: `for_rows` calls every row index exactly once, so row `t` has one writer.
        let o = unsafe { out.row_mut(t) };
        rms_norm(&x[t * hd..(t + 1) * hd], weight, eps, o);
    });
}

/// The residual step after a block's output projection, per row `t`: `proj[t]` through the
/// block's post-norm (Gemma 3) in place, `x[t] += proj[t]`, then, when `next` is given,
/// `xn[t] = rms_norm(x[t])` with the next block's input norm (fused: one pass over the row).
pub(crate) fn residual(
    pool: &ThreadPool,
    proj: &mut [f32],
    x: &mut [f32],
    post_norm: Option<&[f32]>,
    next: Option<(&[f32], &mut [f32])>,
    eps: f32,
    hidden: usize,
) {
    let n = proj.len() / hidden;
    let proj = DisjointRows::new(proj, hidden);
    let x = DisjointRows::new(&mut x[..n * hidden], hidden);
    let (next_w, xn) = match next {
        Some((w, xn)) => (
            Some(w),
            Some(DisjointRows::new(&mut xn[..n * hidden], hidden)),
        ),
        None => (None, None),
    };
    for_rows(pool, n, &|t| {
        // SAFETY: `for_rows` calls every row index exactly once, so row `t` of each buffer has
        // one writer.
        let (p, xt) = unsafe { (proj.row_mut(t), x.row_mut(t)) };
        if let Some(wn) = post_norm {
            rms_norm_in_place(p, wn, eps);
        }
        for (a, &b) in xt.iter_mut().zip(&*p) {
            *a += b;
        }
        if let (Some(wn), Some(xn)) = (next_w, &xn) {
            // SAFETY: as above.
            rms_norm(xt, wn, eps, unsafe { xn.row_mut(t) });
        }
    });
}

/// After the Q/K/V projections, per row: biases, QK-norm, RoPE of queries and keys, and the
/// query scale when the model scales queries (`q` is `[n, q_dim]`, `k` and `v` `[n, kv_dim]`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn qkv(
    pool: &ThreadPool,
    cfg: &ModelConfig,
    lw: &LayerWeights,
    rope: &Rope,
    angles: &[RopeAngles],
    q: &mut [f32],
    k: &mut [f32],
    v: &mut [f32],
) {
    let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
    let n = q.len() / qd;
    let (q, k, v) = (
        DisjointRows::new(q, qd),
        DisjointRows::new(k, kvd),
        DisjointRows::new(v, kvd),
    );
    for_rows(pool, n, &|t| {
        // SAFETY: `for_rows` calls every row index exactly once, so row `t` of each buffer has
        // one writer.
        let (qt, kt, vt) = unsafe { (q.row_mut(t), k.row_mut(t), v.row_mut(t)) };
        add_bias(qt, lw.bq.as_deref());
        add_bias(kt, lw.bk.as_deref());
        add_bias(vt, lw.bv.as_deref());
        if let Some(wn) = &lw.q_norm {
            head_norm(qt, wn, cfg.rms_eps);
        }
        if let Some(wn) = &lw.k_norm {
            head_norm(kt, wn, cfg.rms_eps);
        }
        rope.apply(qt, &angles[t]);
        rope.apply(kt, &angles[t]);
        if cfg.scale_queries {
            qt.iter_mut().for_each(|v| *v *= cfg.attn_scale);
        }
    });
}

/// `gate = act(gate) * up` row by row (`[n, ffn]` each).
pub(crate) fn gated_act(pool: &ThreadPool, act: FfnAct, gate: &mut [f32], up: &[f32], ffn: usize) {
    let n = gate.len() / ffn;
    let gate = DisjointRows::new(gate, ffn);
    for_rows(pool, n, &|t| {
        // SAFETY: `for_rows` calls every row index exactly once, so row `t` has one writer.
        let g = unsafe { gate.row_mut(t) };
        let u = &up[t * ffn..(t + 1) * ffn];
        match act {
            FfnAct::Silu => swiglu(g, u),
            FfnAct::GeluTanh => geglu(g, u),
        }
    });
}

/// The RoPE angles of every position of a step (the positions spread over the pool).
pub(crate) fn angles(pool: &ThreadPool, rope: &Rope, positions: &[u32]) -> Vec<RopeAngles> {
    let slots: Vec<std::sync::OnceLock<RopeAngles>> = positions
        .iter()
        .map(|_| std::sync::OnceLock::new())
        .collect();
    for_rows(pool, positions.len(), &|t| {
        let _ = slots[t].set(rope.angles(positions[t]));
    });
    slots
        .into_iter()
        .map(|s| {
            s.into_inner()
                .expect("every position's angles were computed")
        })
        .collect()
}

/// RMSNorm of each `weight.len()`-wide head of `x`, in place (QK-norm).
fn head_norm(x: &mut [f32], weight: &[f32], eps: f32) {
    for head in x.chunks_exact_mut(weight.len()) {
        rms_norm_in_place(head, weight, eps);
    }
}

fn add_bias(x: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        for (v, &bb) in x.iter_mut().zip(b) {
            *v += bb;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_norm_equals_rms_norm_bitwise() {
        let x: Vec<f32> = (0..640)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173)
            .collect();
        let w: Vec<f32> = (0..640).map(|i| 0.5 + (i % 7) as f32 * 0.31).collect();
        let mut want = vec![0.0; 640];
        rms_norm(&x, &w, 1e-6, &mut want);
        let mut got = x.clone();
        rms_norm_in_place(&mut got, &w, 1e-6);
        assert_eq!(
            want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn every_row_is_visited_once_whatever_the_pool() {
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for n in [0, 1, 3, 4, 5, 17, 64, 513] {
                let mut buf = vec![0.0f32; n];
                let rows = DisjointRows::new(&mut buf, 1);
                for_rows(&pool, n, &|t| {
                    // SAFETY: each row index is visited once (what this test checks).
                    unsafe { rows.row_mut(t)[0] += 1.0 + t as f32 };
                });
                assert!(buf.iter().enumerate().all(|(t, &v)| v == 1.0 + t as f32));
            }
        }
    }

    #[test]
    fn residual_stage_is_split_invariant() {
        let hd = 8;
        let n = 37;
        let proj0: Vec<f32> = (0..n * hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let x0: Vec<f32> = (0..n * hd).map(|i| (i as f32 * 0.11).cos()).collect();
        let wp: Vec<f32> = (0..hd).map(|i| 1.0 + i as f32 * 0.1).collect();
        let wn: Vec<f32> = (0..hd).map(|i| 0.9 - i as f32 * 0.05).collect();
        let run = |threads: usize| {
            let pool = ThreadPool::new(threads);
            let (mut p, mut x, mut xn) = (proj0.clone(), x0.clone(), vec![0.0; n * hd]);
            residual(
                &pool,
                &mut p,
                &mut x,
                Some(&wp),
                Some((&wn, &mut xn)),
                1e-6,
                hd,
            );
            (p, x, xn)
        };
        // The serial reference: the loop this stage replaced.
        let (mut p, mut x, mut xn) = (proj0.clone(), x0.clone(), vec![0.0; n * hd]);
        for t in 0..n {
            let mut tmp = vec![0.0; hd];
            rms_norm(&p[t * hd..(t + 1) * hd], &wp, 1e-6, &mut tmp);
            p[t * hd..(t + 1) * hd].copy_from_slice(&tmp);
        }
        x.iter_mut().zip(&p).for_each(|(a, &b)| *a += b);
        for t in 0..n {
            rms_norm(
                &x[t * hd..(t + 1) * hd],
                &wn,
                1e-6,
                &mut xn[t * hd..(t + 1) * hd],
            );
        }
        for threads in [1, 2, 4] {
            assert_eq!(run(threads), (p.clone(), x.clone(), xn.clone()));
        }
    }
}
