//! One layer's attention for a step: every task of the step's plan — tiled tasks
//! (`attention_tiled`), exact-regime rows (`attention`) — and the runs of llama.cpp's tiled
//! prefill arithmetic (`kernels::ggml_tiled`), spread over the pool and written into the
//! attention output rows `[num_tokens, num_heads, head_dim]`.
//!
//! Owns the dispatch of those tasks and their per-thread buffers only; which row takes which
//! regime is the plan's (`attention_plan`) and the numerics'.

use crate::attention::AttnArith;
use crate::attention::{attend_window_with, AttnScratch};
use crate::attention_plan::{AttnPlan, AttnTask};
use crate::attention_tiled::{run_tile_task, TileInputs, TileOutputs, TileScratch};
use crate::config::ModelConfig;
use crate::kv::{KvChunk, KvStore, SeqSlot};
use kernels::ggml_tiled::{self, RowsScratch};
use kernels::par::DisjointRows;
use kernels::{cpu_features, ThreadPool};

thread_local! {
    /// Per-thread attention buffers (the pool's workers are persistent, so these are reused).
    static ATTN_SCRATCH: std::cell::RefCell<AttnScratch> = std::cell::RefCell::new(AttnScratch::default());
    static TILE_SCRATCH: std::cell::RefCell<TileScratch> = std::cell::RefCell::new(TileScratch::default());
    /// Per-thread buffers of llama.cpp's tiled prefill arithmetic: the kernel's, one position
    /// range of K and of V, and the task's query rows, row ranges and outputs.
    static GGML_TILED_SCRATCH: std::cell::RefCell<GgmlTaskScratch> =
        std::cell::RefCell::new(Default::default());
}

#[derive(Default)]
struct GgmlTaskScratch {
    kernel: RowsScratch,
    k: Vec<half::f16>,
    v: Vec<half::f16>,
    q: Vec<f32>,
    ranges: Vec<(usize, usize)>,
    out: Vec<f32>,
}

/// What every layer's attention of one step shares: the batch's slots and positions, the
/// attention kernel of its rows (`Numerics::attention`), the runs of llama.cpp's tiled prefill
/// arithmetic (`(first token, end token, kv_head)`), each row's split-KV chunks and the score
/// scale.
pub(crate) struct StepAttention<'a> {
    pub cfg: &'a ModelConfig,
    pub slots: &'a [SeqSlot],
    pub positions: &'a [u32],
    pub arith: AttnArith,
    pub ggml_tasks: &'a [(usize, usize, usize)],
    pub kv_split: &'a [usize],
    pub scale: f32,
}

impl StepAttention<'_> {
    /// Layer `layer`'s attention (sliding window `window`) over `plan`: `att` gets every row;
    /// `partials` holds the tiled tasks' segment states (`[plan.partial_rows, head_dim + 2]`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &self,
        pool: &ThreadPool,
        plan: &AttnPlan,
        l: usize,
        window: Option<usize>,
        kv: &dyn KvStore,
        q: &[f32],
        att: &mut [f32],
        partials: &mut [f32],
    ) {
        let (cfg, batch) = (self.cfg, self);
        let head_dim = cfg.head_dim;
        let rows = DisjointRows::new(att, head_dim);
        let outputs = TileOutputs::new(plan, partials, head_dim, &rows);
        let inputs = TileInputs {
            kv,
            layer: l,
            q,
            slots: batch.slots,
            positions: batch.positions,
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim,
            scale: self.scale,
            arith: self.arith,
        };
        let num_plan = plan.tasks.len();
        let ggml_tasks = self.ggml_tasks;
        pool.for_each(num_plan + ggml_tasks.len(), &|i| {
            if i >= num_plan {
                // Last runs first: a causal prompt's later runs attend more positions, and the
                // longest tasks should not be the last ones handed out.
                let task = ggml_tasks[ggml_tasks.len() - 1 - (i - num_plan)];
                // SAFETY: `ggml_task_runs` gives each marked token to exactly one run, whose
                // tasks (one per KV head) write its rows of their heads only; the plan has no
                // task for marked tokens.
                unsafe { self.ggml_run(task, l, window, kv, q, &rows) };
                return;
            }
            match plan.tasks[i] {
                AttnTask::Row { token, head } => {
                    // SAFETY: the plan holds one `Row` task per (token, head) of the exact
                    // regime and those rows are written by no other task.
                    unsafe { self.exact_row(token, head, l, window, kv, q, &rows) }
                }
                task @ (AttnTask::Tile { .. } | AttnTask::Shared { .. }) => TILE_SCRATCH
                    .with_borrow_mut(|scratch| {
                        // SAFETY: the plan gives every (token, head, segment) partial row to exactly
                        // one task and every tiled output row to one group, merged by its last task
                        // (tested in `attention_plan`); `Row` tasks write only exact-regime rows.
                        unsafe { run_tile_task(&inputs, plan, task, &outputs, scratch) }
                    }),
            }
        });
    }

    /// One run of llama.cpp's tiled prefill arithmetic: tokens `t0..t1` of one sequence × the
    /// query heads of `kv_head`.
    ///
    /// # Safety
    /// Those rows of `rows` are written by this call alone.
    #[allow(clippy::too_many_arguments)]
    unsafe fn ggml_run(
        &self,
        (t0, t1, kv_head): (usize, usize, usize),
        l: usize,
        window: Option<usize>,
        kv_ro: &dyn KvStore,
        q_ro: &[f32],
        rows: &DisjointRows<'_, f32>,
    ) {
        let (cfg, batch, attn_scale) = (self.cfg, self, self.scale);
        let head_dim = cfg.head_dim;
        let group = cfg.num_heads / cfg.num_kv_heads;
        let qd = cfg.num_heads * head_dim;
        GGML_TILED_SCRATCH.with_borrow_mut(|g| {
            g.q.clear();
            g.ranges.clear();
            let (mut lo, mut hi) = (usize::MAX, 0);
            for t in t0..t1 {
                let end = batch.positions[t] as usize + 1;
                let first = window.map_or(0, |size| end.saturating_sub(size));
                (lo, hi) = (lo.min(first), hi.max(end));
                for head in kv_head * group..(kv_head + 1) * group {
                    let at = t * qd + head * head_dim;
                    g.q.extend_from_slice(&q_ro[at..at + head_dim]);
                    g.ranges.push((first, end));
                }
            }
            let slot = batch.slots[t0];
            gather_f16(
                kv_ro, l, slot, kv_head, lo, hi, head_dim, &mut g.k, &mut g.v,
            );
            g.out.resize(g.q.len(), 0.0);
            ggml_tiled::attend_rows(
                cpu_features(),
                &g.q,
                &g.k,
                &g.v,
                lo,
                &g.ranges,
                attn_scale,
                &mut g.kernel,
                &mut g.out,
            );
            let mut r = 0;
            for t in t0..t1 {
                for head in kv_head * group..(kv_head + 1) * group {
                    // SAFETY: `ggml_task_runs` gives each marked token to exactly
                    // one run, whose tasks (one per KV head) write its rows of
                    // their heads only; the plan has no task for marked tokens.
                    let out = unsafe { rows.row_mut(t * cfg.num_heads + head) };
                    out.copy_from_slice(&g.out[r * head_dim..(r + 1) * head_dim]);
                    r += 1;
                }
            }
        });
    }

    /// One exact-regime row: query head `head` of token `token`.
    ///
    /// # Safety
    /// That row of `rows` is written by this call alone.
    #[allow(clippy::too_many_arguments)]
    unsafe fn exact_row(
        &self,
        token: u32,
        head: u32,
        l: usize,
        window: Option<usize>,
        kv_ro: &dyn KvStore,
        q_ro: &[f32],
        rows: &DisjointRows<'_, f32>,
    ) {
        let (cfg, batch, attn_scale) = (self.cfg, self, self.scale);
        let (head_dim, group) = (cfg.head_dim, cfg.num_heads / cfg.num_kv_heads);
        let qd = cfg.num_heads * head_dim;
        let kv_split = self.kv_split;
        let (t, head) = (token as usize, head as usize);
        // SAFETY: the plan holds one `Row` task per (token, head) of the exact
        // regime and those rows are written by no other task, so each row of `att`
        // has exactly one writer.
        let out = unsafe { rows.row_mut(t * cfg.num_heads + head) };
        let qh = &q_ro[t * qd + head * head_dim..t * qd + (head + 1) * head_dim];
        let end = batch.positions[t] as usize + 1;
        let first = window.map_or(0, |size| end.saturating_sub(size));
        ATTN_SCRATCH.with_borrow_mut(|scratch| {
            attend_window_with(
                self.arith,
                kv_split.get(t).copied().unwrap_or(0),
                kv_ro,
                l,
                batch.slots[t],
                head / group,
                first,
                end,
                qh,
                attn_scale,
                scratch,
                out,
            )
        });
    }
}

/// The f16 K and V rows of positions `first..end` of one KV head, copied into `k` and `v`.
#[allow(clippy::too_many_arguments)]
fn gather_f16(
    kv: &dyn KvStore,
    layer: usize,
    slot: SeqSlot,
    kv_head: usize,
    first: usize,
    end: usize,
    head_dim: usize,
    k: &mut Vec<half::f16>,
    v: &mut Vec<half::f16>,
) {
    k.clear();
    v.clear();
    kv.for_each_chunk_from(
        layer,
        slot,
        kv_head,
        first,
        end,
        &mut |start, chunk| match chunk.skip_positions(first.saturating_sub(start), head_dim) {
            KvChunk::F16 { k: ck, v: cv } => {
                k.extend_from_slice(ck);
                v.extend_from_slice(cv);
            }
            _ => unreachable!("an f16 store yields f16 chunks"),
        },
    );
    debug_assert_eq!(
        k.len(),
        (end - first) * head_dim,
        "wrong number of positions"
    );
}
