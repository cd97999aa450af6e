//! Fused matmuls: several weight matrices applied to the same activations in one pool dispatch,
//! `ys[i][t, r] = dot(W_i[r, :], x[t, :])` (e.g. the Q, K and V projections, or FFN gate and up).
//!
//! Owns only the fusing: the activations are quantised once, and the row ranges of all matrices
//! become the tasks of a single [`ThreadPool::for_each`], so one decode step pays one dispatch
//! and one barrier instead of one per matrix. Every output element is computed by the same tile
//! code as [`super::matmul`], so results are bit-identical to separate `matmul` calls. Groups
//! that are all 32-element block types or all K-quants fuse (one activation quantisation each);
//! mixed or float groups, or more than [`MAX_FUSED`] matrices, fall back to separate calls. It
//! never allocates.

use super::act_quant::ActQ8;
use super::cpu::{cpu_features, CpuFeatures};
use super::kquant::{is_kquant, with_act_k_scratch, ActQ8K};
use super::matmul::{is_block32, matmul_impl, prepare, with_act_scratch, Job, MatmulArith};
use super::out_ptr::OutPtr;
use super::packed32;
use super::packed32_run;
use super::pool::ThreadPool;
use super::{KernelError, QMatrix};

/// Most matrices one fused dispatch takes.
pub const MAX_FUSED: usize = 4;

/// `ys[i] = W_i · x` for every `i`, in one dispatch where possible. `x` is `[num_tokens,
/// row_len]`; `ys[i]` is `[num_tokens, ws[i].num_rows]`. Bit-identical to calling
/// [`super::matmul`] once per matrix.
pub fn matmul_many(
    pool: &ThreadPool,
    ws: &[QMatrix],
    x: &[f32],
    num_tokens: usize,
    ys: &mut [&mut [f32]],
) -> Result<(), KernelError> {
    matmul_many_with_features(pool, ws, x, num_tokens, ys, cpu_features())
}

/// [`matmul_many`] on an explicit path (`features` is clamped to what the CPU has).
pub fn matmul_many_with_features(
    pool: &ThreadPool,
    ws: &[QMatrix],
    x: &[f32],
    num_tokens: usize,
    ys: &mut [&mut [f32]],
    features: CpuFeatures,
) -> Result<(), KernelError> {
    matmul_many_impl(
        pool,
        ws,
        x,
        num_tokens,
        ys,
        features,
        MatmulArith::Invariant,
    )
}

/// [`matmul_many`] in the arithmetic `arith` selects.
pub fn matmul_many_with_arith(
    pool: &ThreadPool,
    ws: &[QMatrix],
    x: &[f32],
    num_tokens: usize,
    ys: &mut [&mut [f32]],
    arith: MatmulArith,
) -> Result<(), KernelError> {
    matmul_many_impl(pool, ws, x, num_tokens, ys, cpu_features(), arith)
}

fn matmul_many_impl(
    pool: &ThreadPool,
    ws: &[QMatrix],
    x: &[f32],
    num_tokens: usize,
    ys: &mut [&mut [f32]],
    features: CpuFeatures,
    arith: MatmulArith,
) -> Result<(), KernelError> {
    if ws.len() != ys.len() {
        return Err(KernelError::FusedCount {
            matrices: ws.len(),
            outputs: ys.len(),
        });
    }
    let all_kquant = ws.iter().all(|w| is_kquant(w.ty));
    let all_packed = ws.iter().all(|w| w.packed.is_some());
    let all_block32 = ws.iter().all(|w| is_block32(w.ty) && w.packed.is_none());
    let fusable = ws.len() <= MAX_FUSED && (all_kquant || all_packed || all_block32);
    if !fusable {
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            matmul_impl(pool, w, x, num_tokens, y, features, arith)?;
        }
        return Ok(());
    }
    // Validate everything before computing anything.
    let mut jobs: [Option<(Job, OutPtr)>; MAX_FUSED] = [None, None, None, None];
    for ((slot, w), y) in jobs.iter_mut().zip(ws).zip(ys.iter_mut()) {
        *slot = prepare(w, x, num_tokens, y, features, arith)?;
    }
    // `prepare` checked `x.len() == num_tokens * row_len` for every matrix, so with
    // `num_tokens > 0` all row lengths agree.
    let Some(first) = jobs.iter().flatten().next() else {
        return Ok(());
    };
    let (row_len, features) = (first.0.row_len(), first.0.features());
    if all_packed {
        run_packed_fused(pool, ws, &jobs, x, num_tokens, row_len, features);
        return Ok(());
    }
    // Task ranges: matrix `i` owns tasks `task_start[i]..task_start[i] + splits[i].0`.
    let mut splits = [(0usize, 0usize); MAX_FUSED];
    let mut task_start = [0usize; MAX_FUSED];
    let mut total_tasks = 0;
    for (i, job) in jobs.iter().enumerate() {
        if let Some((job, _)) = job {
            splits[i] = job.split(pool);
            task_start[i] = total_tasks;
            total_tasks += splits[i].0;
        }
    }
    // One task of the fused dispatch: the matrix owning `task` (the last one whose range starts
    // at or before it) computes its share of rows with `rows_of`.
    let run_task = |task: usize, rows_of: &dyn Fn(&Job, std::ops::Range<usize>, &OutPtr)| {
        let i = (0..MAX_FUSED)
            .rev()
            .find(|&i| jobs[i].is_some() && task_start[i] <= task)
            .expect("task indices lie in some matrix's range");
        let (job, out) = jobs[i].as_ref().expect("checked is_some above");
        let (_, rows_per_task) = splits[i];
        let start = (task - task_start[i]) * rows_per_task;
        rows_of(job, start..(start + rows_per_task).min(job.num_rows()), out);
    };
    if all_kquant {
        with_act_k_scratch(|act: &mut ActQ8K| {
            act.quantize_on(pool, x, num_tokens, row_len);
            let act = &*act;
            pool.for_each(total_tasks, &|task| {
                run_task(task, &|job, rows, out| job.rows_kquant_any(act, rows, out))
            });
        });
    } else {
        with_act_scratch(|act: &mut ActQ8| {
            act.quantize_on(pool, features, x, num_tokens, row_len);
            let act = &*act;
            pool.for_each(total_tasks, &|task| {
                run_task(task, &|job, rows, out| job.rows_block32_any(act, rows, out))
            });
        });
    }
    Ok(())
}

/// The fused dispatch of packed matrices: one activation quantisation, the groups of all
/// matrices as the tasks of one `for_each`.
fn run_packed_fused(
    pool: &ThreadPool,
    ws: &[QMatrix],
    jobs: &[Option<(Job, OutPtr)>; MAX_FUSED],
    x: &[f32],
    num_tokens: usize,
    row_len: usize,
    features: CpuFeatures,
) {
    if packed32::claims_from_both_ends(num_tokens) {
        // A decode: the matrices' groups in a row, claimed from both ends.
        let mut unit_start = [0usize; MAX_FUSED];
        let mut units = 0;
        for (i, w) in ws.iter().enumerate() {
            if let (Some(p), Some(_)) = (w.packed, &jobs[i]) {
                unit_start[i] = units;
                units += p.num_groups();
            }
        }
        with_act_scratch(|act: &mut ActQ8| {
            act.quantize_on(pool, features, x, num_tokens, row_len);
            let act = &*act;
            super::both_ends::for_each_chunk(pool, units, &|chunk| {
                for (i, w) in ws.iter().enumerate() {
                    let (Some(p), Some((job, out))) = (w.packed, &jobs[i]) else {
                        continue;
                    };
                    let own = unit_start[i]..unit_start[i] + p.num_groups();
                    let (lo, hi) = (chunk.start.max(own.start), chunk.end.min(own.end));
                    if lo < hi {
                        let groups = lo - own.start..hi - own.start;
                        packed32_run::run_groups(p, features, job.packed_def, act, groups, out);
                    }
                }
            });
        });
        return;
    }
    let mut splits = [(0usize, 0usize); MAX_FUSED];
    let mut task_start = [0usize; MAX_FUSED];
    let mut total_tasks = 0;
    for (i, w) in ws.iter().enumerate() {
        if let (Some(p), Some(_)) = (w.packed, &jobs[i]) {
            splits[i] = packed32::split(p, pool, num_tokens);
            task_start[i] = total_tasks;
            total_tasks += splits[i].0;
        }
    }
    with_act_scratch(|act: &mut ActQ8| {
        act.quantize_on(pool, features, x, num_tokens, row_len);
        let act = &*act;
        pool.for_each(total_tasks, &|task| {
            let i = (0..ws.len())
                .rev()
                .find(|&i| jobs[i].is_some() && task_start[i] <= task)
                .expect("task indices lie in some matrix's range");
            let (job, out) = jobs[i].as_ref().expect("checked is_some above");
            let p = ws[i].packed.expect("all matrices are packed");
            let start = (task - task_start[i]) * splits[i].1;
            let groups = start..(start + splits[i].1).min(p.num_groups());
            packed32_run::run_groups(p, features, job.packed_def, act, groups, out);
        });
    });
}
