//! The transformer forward pass over a flattened batch of tokens from many sequences.
//!
//! Owns the layer loop (norm → QKV → [QK-norm] → RoPE → K/V write → attention → output →
//! [post-norm] → gated FFN → [post-norm]) and the final logits. Sliding-window layers attend the
//! last `window` positions of their sequence only (always in the exact regime: a window bounds
//! the positions a row reads), with their own RoPE base. Every token is processed with the same float operations whatever batch it is in
//! and however its prompt was chunked: matrix products are batch-invariant (see `kernels`; a
//! batch may instead ask for llama.cpp's step-dependent K-quant orders, [`MatmulArith`]) and
//! attention always reads K/V back from the [`KvStore`]. The last layer's output projection is
//! followed by the FFN of the rows whose logits are wanted only. It never decides what to batch.

pub use crate::attention::AttnArith;
use crate::attention_plan::{self, AttnPlan, AttnShape};
use crate::config::ModelConfig;
use crate::forward_attention::StepAttention;
use crate::forward_rows as rows;
use crate::kv::{KvDtype, KvError, KvStore, SeqSlot};
use crate::numerics::{Numerics, RowKind};
use crate::ops::{rms_norm, softcap, Rope};
use crate::weights::{Weights, WeightsError};
pub use kernels::MatmulArith;
use kernels::{
    matmul_many_with_arith as matmul_many, matmul_with_arith as matmul, KernelError, ThreadPool,
};

/// One step's tokens. All slices are `[num_tokens]` except `logits_for`.
#[derive(Debug, Clone, Copy)]
pub struct ForwardBatch<'a> {
    pub tokens: &'a [u32],
    pub positions: &'a [u32],
    pub slots: &'a [SeqSlot],
    /// Indices into `tokens` whose logits are wanted, in the order they are returned.
    pub logits_for: &'a [usize],
    /// How every row computes (chosen once by the caller: [`Numerics`]).
    pub numerics: Numerics,
    /// What each row is (`[num_tokens]`): with the numerics, it decides the row's attention
    /// kernel (a choice per row, so a row's arithmetic never depends on its batch or chunk).
    pub rows: &'a [RowKind],
}

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("token id {token} is outside the vocabulary of {vocab_size}")]
    BadToken { token: u32, vocab_size: usize },
    #[error("malformed batch: {0}")]
    BadBatch(String),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error("device: {0}")]
    Device(String),
}

/// Activation buffers, grown on demand and reused across steps.
#[derive(Default)]
pub struct Scratch {
    x: Vec<f32>,    // [num_tokens, hidden] residual stream
    xn: Vec<f32>,   // [num_tokens, hidden] normed
    q: Vec<f32>,    // [num_tokens, q_dim]
    k: Vec<f32>,    // [num_tokens, kv_dim]
    v: Vec<f32>,    // [num_tokens, kv_dim]
    att: Vec<f32>,  // [num_tokens, q_dim]
    proj: Vec<f32>, // [num_tokens, hidden]
    gate: Vec<f32>, // [num_tokens, ffn]
    up: Vec<f32>,   // [num_tokens, ffn]
    /// `[partial_rows, head_dim + 2]`: tiled attention's per-segment states.
    partials: Vec<f32>,
    /// The rows the last layer keeps, gathered before they are moved to the front.
    keep: Vec<f32>,
}

/// At most this many tokens of one sequence at consecutive positions share one task of
/// llama.cpp's tiled prefill arithmetic (their query rows of all heads of one KV head).
const GGML_TASK_TOKENS: usize = 32;

/// At least this many tokens per such task, when a step has few marked tokens (each task
/// gathers and widens its sequence's K/V once for all its rows).
const GGML_TASK_MIN_TOKENS: usize = 8;

/// Tokens per task of llama.cpp's tiled prefill arithmetic for a step with `marked` such tokens:
/// [`GGML_TASK_TOKENS`], or fewer (down to [`GGML_TASK_MIN_TOKENS`]) so that a step with few
/// of them still has about 4 tasks per thread to balance (a row's result never depends on the
/// rows that share its task).
fn ggml_task_tokens(marked: usize, num_kv_heads: usize, threads: usize) -> usize {
    (marked * num_kv_heads / (4 * threads.max(1))).clamp(GGML_TASK_MIN_TOKENS, GGML_TASK_TOKENS)
}

fn grow(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

/// Runs the model on `batch`, writing K/V into `kv`; returns logits `[logits_for.len(), vocab]`.
/// `rope_local` is the RoPE of sliding-window layers (required when the config has them).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    cfg: &ModelConfig,
    w: &Weights,
    rope: &Rope,
    rope_local: Option<&Rope>,
    pool: &ThreadPool,
    batch: &ForwardBatch<'_>,
    kv: &mut dyn KvStore,
    s: &mut Scratch,
) -> Result<Vec<f32>, ForwardError> {
    let n = batch.tokens.len();
    check_batch(cfg, batch)?;
    kv.begin_step();
    let (hd, qd, kvd) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim());
    let head_dim = cfg.head_dim;
    let x = grow(&mut s.x, n * hd);
    rows::embed(pool, cfg, w, batch.tokens, x)?;
    let angles = rows::angles(pool, rope, batch.positions);
    let local_angles: Vec<_> = match (&cfg.sliding_window, rope_local) {
        (None, _) => Vec::new(),
        (Some(_), Some(r)) => rows::angles(pool, r, batch.positions),
        (Some(_), None) => {
            return Err(ForwardError::BadBatch(
                "sliding-window layers need their RoPE".into(),
            ))
        }
    };
    let plans = plan_step(cfg, batch, &*kv, pool.num_threads());

    // Whether the last layer keeps only the rows of `logits_for` (always, unless every token's
    // logits are wanted in order, when it would change nothing).
    let compact = !batch.logits_for.iter().copied().eq(0..n);
    // The first layer's input norm; every later one is fused into the previous layer's last
    // residual step.
    if let Some(lw) = w.layers.first() {
        rows::norm(
            pool,
            &s.x,
            &lw.attn_norm,
            cfg.rms_eps,
            grow(&mut s.xn, n * hd),
        );
    }
    let step_attention = plans.attention(cfg, batch);
    for (l, lw) in w.layers.iter().enumerate() {
        let window = cfg.window_of(l);
        let plan = plans.of_layer(window);
        let angles = if plans.local_plan.is_some() && window.is_some() {
            &local_angles
        } else {
            &angles
        };
        // Attention block (`xn` holds the normed input).
        let xn = &s.xn[..n * hd];
        let q = grow(&mut s.q, n * qd);
        let k = grow(&mut s.k, n * kvd);
        let v = grow(&mut s.v, n * kvd);
        // One dispatch for Q, K and V (bit-identical to three `matmul` calls).
        let qkv = [w.qmatrix(&lw.wq), w.qmatrix(&lw.wk), w.qmatrix(&lw.wv)];
        matmul_many(
            pool,
            &qkv,
            xn,
            n,
            &mut [&mut *q, &mut *k, &mut *v],
            batch.numerics.matmul(),
        )?;
        let r = if window.is_some() {
            rope_local.unwrap_or(rope)
        } else {
            rope
        };
        rows::qkv(pool, cfg, lw, r, angles, q, k, v);
        kv.write_step(pool, l, batch.slots, batch.positions, k, v)?;
        let att = grow(&mut s.att, n * qd);
        let partials = grow(&mut s.partials, plan.partial_rows * (head_dim + 2));
        step_attention.run(pool, plan, l, window, &*kv, q, att, partials);
        let proj = grow(&mut s.proj, n * hd);
        matmul(
            pool,
            &w.qmatrix(&lw.wo),
            att,
            n,
            proj,
            batch.numerics.matmul(),
        )?;
        // After the last layer's attention output projection only the tokens whose logits are
        // wanted matter: keep those rows (in `logits_for` order) and drop the others, where
        // llama.cpp does (`inp_out_ids`). Every row's arithmetic stays the same (for
        // `MatmulArith::LlamaCpp`, the step size of the FFN is then llama.cpp's too).
        let n = if l + 1 == w.layers.len() && compact {
            let m = batch.logits_for.len();
            for (buf, width) in [(&mut s.proj, hd), (&mut s.x, hd)] {
                s.keep.clear();
                for &t in batch.logits_for {
                    s.keep.extend_from_slice(&buf[t * width..(t + 1) * width]);
                }
                buf[..m * width].copy_from_slice(&s.keep);
            }
            m
        } else {
            n
        };
        // Post-norm, residual add and the FFN's input norm.
        let xn = grow(&mut s.xn, n * hd);
        rows::residual(
            pool,
            &mut s.proj[..n * hd],
            &mut s.x,
            lw.post_attn_norm.as_deref(),
            Some((&lw.ffn_norm, xn)),
            cfg.rms_eps,
            hd,
        );

        feed_forward(pool, cfg, w, l, s, n, batch.numerics.matmul())?;
    }

    final_logits(pool, cfg, w, s, batch, compact)
}

/// One layer's attention for `batch` alone, over K/V already in `kv`: `q` holds the batch's
/// queries (`[num_tokens, q_dim]`, roped, and scaled where the model scales queries) and `att`
/// gets the attention rows (`[num_tokens, q_dim]`). Exactly what [`forward`] runs between a
/// layer's QKV and output projections — the step's plan, its tasks and the numerics' kernel per
/// row — for benchmarks and tests of attention on its own (it never writes K/V).
#[allow(clippy::too_many_arguments)]
pub fn attention_layer(
    cfg: &ModelConfig,
    pool: &ThreadPool,
    batch: &ForwardBatch<'_>,
    kv: &dyn KvStore,
    layer: usize,
    q: &[f32],
    att: &mut [f32],
    s: &mut Scratch,
) -> Result<(), ForwardError> {
    check_batch(cfg, batch)?;
    let (n, qd) = (batch.tokens.len(), cfg.q_dim());
    if layer >= cfg.num_layers || q.len() != n * qd || att.len() != n * qd {
        return Err(ForwardError::BadBatch(format!(
            "attention of layer {layer} (of {}): q holds {} floats and att {}, want {}",
            cfg.num_layers,
            q.len(),
            att.len(),
            n * qd
        )));
    }
    let plans = plan_step(cfg, batch, kv, pool.num_threads());
    let window = cfg.window_of(layer);
    let plan = plans.of_layer(window);
    let partials = grow(&mut s.partials, plan.partial_rows * (cfg.head_dim + 2));
    plans
        .attention(cfg, batch)
        .run(pool, plan, layer, window, kv, q, att, partials);
    Ok(())
}

/// Checks the batch's slices against each other and the vocabulary.
fn check_batch(cfg: &ModelConfig, batch: &ForwardBatch<'_>) -> Result<(), ForwardError> {
    let n = batch.tokens.len();
    if batch.positions.len() != n || batch.slots.len() != n {
        return Err(ForwardError::BadBatch(
            "tokens, positions and slots differ in length".into(),
        ));
    }
    if let Some(&i) = batch.logits_for.iter().find(|&&i| i >= n) {
        return Err(ForwardError::BadBatch(format!(
            "logits requested for token {i} of {n}"
        )));
    }
    if let Some(&t) = batch.tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
        return Err(ForwardError::BadToken {
            token: t,
            vocab_size: cfg.vocab_size,
        });
    }
    if batch.rows.len() != n {
        return Err(ForwardError::BadBatch(
            "rows must give one kind per token".into(),
        ));
    }
    Ok(())
}

/// The step's attention plans: the plan of the full-attention layers and, with sliding-window
/// layers, theirs; llama.cpp's tiled prefill runs; each row's split-KV chunks.
struct StepPlans {
    plan: AttnPlan,
    local_plan: Option<AttnPlan>,
    ggml_tasks: Vec<(usize, usize, usize)>,
    kv_split: Vec<usize>,
}

impl StepPlans {
    /// The plan of a layer with sliding window `window` (or none).
    fn of_layer(&self, window: Option<usize>) -> &AttnPlan {
        match (window, &self.local_plan) {
            (Some(_), Some(p)) => p,
            _ => &self.plan,
        }
    }

    /// What every layer's attention of the step shares.
    fn attention<'a>(
        &'a self,
        cfg: &'a ModelConfig,
        batch: &ForwardBatch<'a>,
    ) -> StepAttention<'a> {
        StepAttention {
            cfg,
            slots: batch.slots,
            positions: batch.positions,
            arith: batch.numerics.attention(),
            ggml_tasks: &self.ggml_tasks,
            kv_split: &self.kv_split,
            // Queries scaled before attention (then scores are not), or scores after the dot
            // product.
            scale: if cfg.scale_queries {
                1.0
            } else {
                cfg.attn_scale
            },
        }
    }
}

/// Plans the step's attention for K/V in `codecs` on a pool of `threads` threads.
fn plan_step(
    cfg: &ModelConfig,
    batch: &ForwardBatch<'_>,
    kv: &dyn KvStore,
    threads: usize,
) -> StepPlans {
    let codecs = kv.codecs();
    // Decodes whose sequences hold the same blocks over a segment (a shared prompt prefix)
    // read it once (`attention_plan::plan_without`).
    let shares = |a: usize, b: usize, j: usize| {
        let seg =
            j * attention_plan::SEGMENT_POSITIONS..(j + 1) * attention_plan::SEGMENT_POSITIONS;
        kv.shares_positions(batch.slots[a], batch.slots[b], seg)
    };
    // Rows in llama.cpp's tiled prefill arithmetic over f16 K/V (every row of an
    // `AttnArith::Prefill` step, and the rows the batch marks) are reproduced by `ggml_tiled`,
    // in tasks of their own (a run of one sequence's tokens × one KV head); the plan leaves them out.
    let f16_kv = codecs == KvDtype::F16;
    let ggml_rows: Vec<bool> = batch
        .rows
        .iter()
        .map(|&kind| f16_kv && batch.numerics.tiled_prefill(kind))
        .collect();
    let per_task = ggml_task_tokens(
        ggml_rows.iter().filter(|&&m| m).count(),
        cfg.num_kv_heads,
        threads,
    );
    let ggml_tasks = ggml_task_runs(
        &ggml_rows,
        batch.slots,
        batch.positions,
        cfg.num_kv_heads,
        per_task,
    );
    let shape = AttnShape {
        num_heads: cfg.num_heads,
        num_kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        kv_is_f16: f16_kv,
        kv_encoded: codecs != KvDtype::F16 && codecs != KvDtype::F32,
        arith: batch.numerics.attention(),
        threads,
    };
    let plan =
        attention_plan::plan_without(&shape, batch.slots, batch.positions, &ggml_rows, &shares);
    // llama.cpp takes its split-KV decode for a one-token step only: in its per-row
    // arithmetic the generated rows do, in as many chunks as the numerics say (0: one chunk).
    let kv_split: Vec<usize> = if batch.numerics.attention() == AttnArith::Row {
        batch
            .rows
            .iter()
            .map(|&kind| batch.numerics.split_chunks(kind, threads))
            .collect()
    } else {
        Vec::new()
    };
    // Sliding-window layers: one exact-regime task per (token, head) (the window bounds what a
    // row reads; the tiled regime's segments are absolute positions).
    let local_plan = cfg.sliding_window.as_ref().map(|_| {
        attention_plan::plan_without(
            &AttnShape {
                kv_is_f16: false,
                kv_encoded: false,
                ..shape
            },
            batch.slots,
            batch.positions,
            &ggml_rows,
            &|_, _, _| false,
        )
    });
    StepPlans {
        plan,
        local_plan,
        ggml_tasks,
        kv_split,
    }
}

/// Layer `l`'s feed-forward block over `n` rows (`s.xn` holds the normed input): the gated FFN,
/// its post-norm, the residual add and the next layer's input norm.
fn feed_forward(
    pool: &ThreadPool,
    cfg: &ModelConfig,
    w: &Weights,
    l: usize,
    s: &mut Scratch,
    n: usize,
    arith: MatmulArith,
) -> Result<(), ForwardError> {
    let (hd, ffn) = (cfg.hidden_size, cfg.ffn_size);
    let lw = &w.layers[l];
    // Feed-forward block.
    let xn = &s.xn[..n * hd];
    let gate = grow(&mut s.gate, n * ffn);
    let up = grow(&mut s.up, n * ffn);
    let gate_up = [w.qmatrix(&lw.w_gate), w.qmatrix(&lw.w_up)];
    matmul_many(pool, &gate_up, xn, n, &mut [&mut *gate, &mut *up], arith)?;
    rows::gated_act(pool, cfg.ffn_act, gate, up, ffn);
    let proj = grow(&mut s.proj, n * hd);
    matmul(pool, &w.qmatrix(&lw.w_down), gate, n, proj, arith)?;
    // Post-norm, residual add and the next layer's input norm.
    let next = w.layers.get(l + 1).map(|nl| &nl.attn_norm[..]);
    let xn = grow(&mut s.xn, n * hd);
    rows::residual(
        pool,
        proj,
        &mut s.x,
        lw.post_ffn_norm.as_deref(),
        next.map(|wn| (wn, xn)),
        cfg.rms_eps,
        hd,
    );
    Ok(())
}

/// The final norm and the logits of the tokens `batch.logits_for` names (after the last
/// layer's compaction, row `j` holds token `logits_for[j]`).
fn final_logits(
    pool: &ThreadPool,
    cfg: &ModelConfig,
    w: &Weights,
    s: &mut Scratch,
    batch: &ForwardBatch<'_>,
    compact: bool,
) -> Result<Vec<f32>, ForwardError> {
    let hd = cfg.hidden_size;
    // Final norm and logits for the requested tokens only.
    let m = batch.logits_for.len();
    let xn = grow(&mut s.xn, m.max(1) * hd);
    for (j, &t) in batch.logits_for.iter().enumerate() {
        // After the last layer's compaction, row `j` holds token `logits_for[j]`.
        let t = if compact { j } else { t };
        rms_norm(
            &s.x[t * hd..(t + 1) * hd],
            &w.output_norm,
            cfg.rms_eps,
            &mut xn[j * hd..(j + 1) * hd],
        );
    }
    let mut logits = vec![0.0f32; m * cfg.vocab_size];
    if m > 0 {
        matmul(
            pool,
            &w.qmatrix(&w.output),
            &xn[..m * hd],
            m,
            &mut logits,
            batch.numerics.matmul(),
        )?;
    }
    if let Some(cap) = cfg.final_logit_softcap {
        softcap(&mut logits, cap);
    }
    Ok(logits)
}

/// The tasks of llama.cpp's tiled prefill arithmetic: runs of up to `per_task`
/// marked tokens of one sequence at consecutive positions, × every KV head, as
/// `(first token, end token, kv_head)`. Each marked token is in exactly one run.
fn ggml_task_runs(
    marked: &[bool],
    slots: &[SeqSlot],
    positions: &[u32],
    num_kv_heads: usize,
    per_task: usize,
) -> Vec<(usize, usize, usize)> {
    let mut tasks = Vec::new();
    let mut t = 0;
    while t < marked.len() {
        if !marked[t] {
            t += 1;
            continue;
        }
        let mut end = t + 1;
        while end < marked.len()
            && end - t < per_task
            && marked[end]
            && slots[end] == slots[t]
            && positions[end] == positions[end - 1] + 1
        {
            end += 1;
        }
        tasks.extend((0..num_kv_heads).map(|h| (t, end, h)));
        t = end;
    }
    tasks
}
