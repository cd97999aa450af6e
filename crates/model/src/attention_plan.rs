//! Which attention tasks one forward step runs, and which kernels each runs: pure data computed
//! from the batch's slots and positions, the K/V codecs and the CPU, testable without a model or
//! a KV store.
//!
//! Owns the split of a step's attention into parallel tasks, the arithmetic regime of each query
//! row and the table of tile kernels a tiled task takes. It never touches K/V bytes and never runs
//! anything (`forward_attention` dispatches the tasks, `attention_tiled` runs a tiled one).
//!
//! Regimes (a function of the row's own position count `n = pos + 1`, the head size, the K/V
//! encoding and the step's [`AttnArith`], which the caller chooses — never of the batch's
//! contents, so a sequence's output does not depend on what shares its step):
//! - **exact** (f16 K/V in a step of [`AttnArith::Row`], or f32 K/V, or `head_dim % 8 != 0`):
//!   one task per (token, query head) through `attention::attend_window_with`, llama.cpp's
//!   decode arithmetic (its split-KV decode beyond
//!   256 (`attention_split::PAD_CELLS`) positions);
//! - **tiled** (otherwise, so every f16 row of an [`AttnArith::Prefill`] or [`AttnArith::Tiled`]
//!   step and every row over encoded K/V): the query rows of all heads of a GQA group and up to
//!   [`QUERY_TILE_TOKENS`] ([`ENCODED_QUERY_TILE_TOKENS`] over encoded K/V) consecutive tokens of
//!   one sequence share each K/V tile (a run of consecutive tokens is cut into tiles of equal
//!   lengths, [`run_tiles`])
//!   (`attention_tiled`); positions are split into segments of [`SEGMENT_POSITIONS`] whose
//!   partial states are merged in order. A one-token tile (a decode) gets one task per
//!   segment (split-K, flash-decoding style), or per run of up to
//!   [`MAX_DECODE_TASK_SEGMENTS`] consecutive segments when the step has tasks enough for the
//!   pool's threads ([`AttnShape::threads`]); a longer tile runs its segments in one task. The
//!   segment split is part of the arithmetic (always applied), only the task grouping differs:
//!   decodes whose sequences hold the same blocks over a segment (a shared prompt prefix) read
//!   it in one [`AttnTask::Shared`] task.
//!
//! # Which kernels a tiled task runs
//!
//! Which tile kernels attend a tiled task's query rows, chosen by one function per level: [`TaskPath::choose`] once per task (K/V codecs × CPU features × head size × query
//! tokens per task × attention arithmetic) and [`TaskPath::pass`] per pass of rows that share a
//! tile. `attention_tiled.rs` runs what they say; the golden test below enumerates the table,
//! so "which kernel runs for this row, and why" is answered here.
//!
//! Every choice changes speed only: all the kernels a row can take give the same bits (their
//! own tests pin that).

use kernels::flash_tile_codes::{values_from_codes, KeyCodes};
use kernels::CpuFeatures;
use quant::KvCodecKind;

use crate::attention::AttnArith;
use crate::kv::{KvDtype, SeqSlot};

/// Positions per segment of the tiled regime (a multiple of the softmax tile).
pub const SEGMENT_POSITIONS: usize = 512;
/// Tokens of one sequence whose query rows share a K/V tile (with a GQA group of three, 96
/// rows per transposed or decoded tile). On an AVX-512 Xeon at depth 4096 (f16 K/V;
/// docs/history/benchmarks-log.md), 16 rather than 8 prefilled a median 7% faster and 32 rather than 16
/// another 2–6% (64: no faster than 32): each tile is transposed or decoded half as often.
pub const QUERY_TILE_TOKENS: usize = 32;
/// [`QUERY_TILE_TOKENS`] over encoded (quantized) K/V, whose tiles cost more to decode than f16
/// tiles to widen: 64 prefilled `k=int4c,v=int4` 1–3% faster than 32 at depth 4096 (int8 the
/// same; f16 at 64 no faster than at 32). Larger tiles once made the engine's capped steps
/// slower (session 20): the thread pool took a worker computing a long tile beside the caller's
/// short decode tasks for a preempted one and ran the next calls on one thread (fixed in
/// `kernels::pool`), and a 60-token chunk in one 64-token tile gave three tasks to two threads
/// (fixed by [`run_tiles`]).
pub const ENCODED_QUERY_TILE_TOKENS: usize = 64;
/// A short run is cut into up to this many tiles ([`run_tiles`])…
pub const MIN_TILES_PER_RUN: usize = 4;
/// …of at least this many tokens.
pub const MIN_TILE_TOKENS: usize = 16;

const _: () = assert!(SEGMENT_POSITIONS.is_multiple_of(kernels::flash_tile::TILE_POSITIONS));
const _: () =
    assert!(SEGMENT_POSITIONS.is_multiple_of(kernels::flash_tile_pairs::PAIR_TILE_POSITIONS));

/// One parallel attention task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnTask {
    /// Exact regime: token `token` (index into the batch), query head `head`.
    Row { token: u32, head: u32 },
    /// Tiled regime: batch tokens `tokens.0..tokens.1` (one sequence, consecutive positions),
    /// all query heads of `kv_head`, segments `segments.0..segments.1`. The tasks of one
    /// (tile, kv_head) share `group`; the last of them to finish merges the group's segments
    /// into output rows.
    Tile {
        tokens: (u32, u32),
        kv_head: u32,
        segments: (u32, u32),
        group: u32,
    },
    /// Tiled regime, one segment shared by decodes: the one-token tiles
    /// `AttnPlan::shared_tokens[list.0..list.1]` (each the only query of its sequence in the
    /// step), all query heads of `kv_head`, segment `segment` — a segment each of them attends
    /// whole (never its last) over the same K/V blocks (a shared prompt prefix). The K/V of
    /// the segment is read once for all of them; each token's partial rows are its own, and
    /// each token's group (`AttnPlan::token_group`) counts this task as one of its tasks.
    Shared {
        list: (u32, u32),
        kv_head: u32,
        segment: u32,
    },
}

/// The attention work of one step.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AttnPlan {
    pub tasks: Vec<AttnTask>,
    /// Per batch token: index of its first partial row (tiled tokens), else `None`. Token `t`'s
    /// partial row for query head `h` and segment `j` is `first + h * segments[t] + j`.
    pub partial_base: Vec<Option<u32>>,
    /// Per batch token: its number of segments (0 for exact-regime tokens).
    pub segments: Vec<u32>,
    /// Total partial rows (`[hd + 2]` floats each: acc, max, sum).
    pub partial_rows: usize,
    /// Per (tile, kv_head) group: how many tasks it has.
    pub group_tasks: Vec<u32>,
    /// The tokens of the [`AttnTask::Shared`] tasks (each task's `list` is a range of it).
    pub shared_tokens: Vec<u32>,
    /// Per batch token: the group of its tile's KV head 0 (a tile's groups follow one another
    /// by KV head), for tiled tokens; else `None`.
    pub token_group: Vec<Option<u32>>,
}

/// At most this many decodes share one [`AttnTask::Shared`] task (more share in several), so a
/// step of many agents still has tasks enough for the pool.
pub const MAX_SHARED_TOKENS: usize = 16;

/// Shapes the plan depends on.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Whether K/V are stored as f16 (the tiled regime's input).
    pub kv_is_f16: bool,
    /// Whether K/V are stored as encoded rows (a quantized codec): the tiled regime decodes
    /// each K/V tile once for all its query rows, and takes every such row at every depth
    /// (f32 queries, whatever the step's [`AttnArith`]).
    pub kv_encoded: bool,
    /// The step's arithmetic: with [`AttnArith::Prefill`] every f16 row takes the tiled regime
    /// (f32 accumulation at every depth, like llama.cpp's tiled prefill kernel).
    pub arith: AttnArith,
    /// The pool's threads: how many tasks keep it busy. Only the grouping of a decode's
    /// segments into tasks depends on it ([`group_decode_segments`]), never a result.
    pub threads: usize,
}

impl AttnShape {
    /// Whether the step's rows take the tiled regime (at every depth: the regime never depends on
    /// a row's position count).
    pub fn tiled(&self) -> bool {
        self.head_dim.is_multiple_of(8)
            && (self.kv_encoded || (self.kv_is_f16 && self.arith != AttnArith::Row))
    }
}

/// Number of segments covering `n` positions.
pub fn num_segments(n: usize) -> usize {
    n.div_ceil(SEGMENT_POSITIONS)
}

/// Plans one step. `slots` and `positions` are `[num_tokens]`.
#[cfg(test)]
pub(crate) fn plan(shape: &AttnShape, slots: &[SeqSlot], positions: &[u32]) -> AttnPlan {
    plan_without(shape, slots, positions, &[], &|_, _, _| false)
}

/// [`plan`] with no task for the tokens `without` marks (empty: none), which the caller
/// attends by other means (llama.cpp's tiled prefill rows); a tile never spans one of them.
/// `shares(a, b, j)`: whether the sequences of batch tokens `a` and `b` hold the same K/V
/// blocks over segment `j` (the store knows; `|_, _, _| false` shares nothing): decodes that
/// do, over a segment each attends whole, attend it in one [`AttnTask::Shared`] task. Which
/// task reads a segment never changes a row's bits (every row's arithmetic is its own).
pub fn plan_without(
    shape: &AttnShape,
    slots: &[SeqSlot],
    positions: &[u32],
    without: &[bool],
    shares: &dyn Fn(usize, usize, usize) -> bool,
) -> AttnPlan {
    let n = slots.len();
    let skipped = |t: usize| without.get(t).copied().unwrap_or(false);
    let mut p = AttnPlan {
        tasks: Vec::new(),
        partial_base: vec![None; n],
        segments: vec![0; n],
        partial_rows: 0,
        group_tasks: Vec::new(),
        shared_tokens: Vec::new(),
        token_group: vec![None; n],
    };
    let mut decodes = Vec::new();
    let tile_tokens = if shape.kv_encoded {
        ENCODED_QUERY_TILE_TOKENS
    } else {
        QUERY_TILE_TOKENS
    };
    let mut t = 0;
    while t < n {
        if skipped(t) {
            t += 1;
            continue;
        }
        if !shape.tiled() {
            for head in 0..shape.num_heads {
                p.tasks.push(AttnTask::Row {
                    token: t as u32,
                    head: head as u32,
                });
            }
            t += 1;
            continue;
        }
        // A run: following tokens of the same sequence at the next positions, cut into
        // tiles of balanced lengths (see [`run_tiles`]).
        let mut run_end = t + 1;
        while run_end < n
            && slots[run_end] == slots[t]
            && positions[run_end] == positions[run_end - 1] + 1
            && !skipped(run_end)
        {
            run_end += 1;
        }
        let tiles = run_tiles(run_end - t, tile_tokens);
        for i in 0..tiles {
            let (start, end) = (
                t + (run_end - t) * i / tiles,
                t + (run_end - t) * (i + 1) / tiles,
            );
            push_tile(&mut p, shape, positions, start, end);
            if end - start == 1 {
                decodes.push(start);
            }
        }
        t = run_end;
    }
    share_segments(&mut p, shape, positions, &decodes, shares);
    group_decode_segments(&mut p, shape.threads);
    p
}

/// Segments a decode's task reads at most ([`group_decode_segments`]).
pub const MAX_DECODE_TASK_SEGMENTS: u32 = 4;
/// Tasks per thread the step's decode tasks keep at least when segments are grouped.
pub const DECODE_TASKS_PER_THREAD: usize = 3;

/// Groups the one-segment tasks of decodes (those left after [`share_segments`]) into tasks of
/// up to [`MAX_DECODE_TASK_SEGMENTS`] consecutive segments of the same token and KV head, as far
/// as the step keeps [`DECODE_TASKS_PER_THREAD`] decode tasks per thread: a task then streams
/// one longer run of a head's K/V, which the hardware prefetcher follows (a decode at depth
/// 4,096 on two threads, K/V from memory: 0.85× the attention time of one task per segment).
/// Each segment keeps its own partial state, so no result changes; the groups' task counts
/// shrink by the tasks merged.
fn group_decode_segments(p: &mut AttnPlan, threads: usize) {
    let single = |task: &AttnTask| {
        matches!(*task, AttnTask::Tile { tokens, segments, .. }
            if tokens.1 - tokens.0 == 1 && segments.1 - segments.0 == 1)
    };
    let units = p.tasks.iter().filter(|t| single(t)).count();
    let split = (units / (threads.max(1) * DECODE_TASKS_PER_THREAD))
        .clamp(1, MAX_DECODE_TASK_SEGMENTS as usize) as u32;
    if split == 1 {
        return;
    }
    let mut tasks: Vec<AttnTask> = Vec::with_capacity(p.tasks.len());
    for task in p.tasks.drain(..) {
        if let (
            AttnTask::Tile {
                tokens,
                kv_head,
                segments,
                group,
            },
            Some(AttnTask::Tile {
                tokens: prev_tokens,
                kv_head: prev_head,
                segments: prev_segments,
                group: prev_group,
            }),
        ) = (task, tasks.last_mut())
        {
            let mergeable = tokens.1 - tokens.0 == 1
                && segments.1 - segments.0 == 1
                && *prev_tokens == tokens
                && *prev_head == kv_head
                && *prev_group == group
                && prev_segments.1 == segments.0
                && prev_segments.1 - prev_segments.0 < split;
            if mergeable {
                prev_segments.1 = segments.1;
                p.group_tasks[group as usize] -= 1;
                continue;
            }
        }
        tasks.push(task);
    }
    p.tasks = tasks;
}

/// Moves the segments that decodes share (`shares`, see [`plan_without`]) from their one-token
/// tiles' tasks into [`AttnTask::Shared`] tasks (placed first: the longest tasks should not
/// be the last handed out). Only a segment a decode attends whole and not its last (so no
/// row's own block-codec group lies in it) is shared; each (token, segment) still has
/// exactly one task, so the groups' task counts stay as they are.
///
/// Segment `j > 0` is looked for only among decodes that shared segment `j − 1` with each
/// other (a shared prompt is a prefix): the comparisons are quadratic in the decodes for
/// segment 0 only (each cut short by the first differing block), linear after it.
fn share_segments(
    p: &mut AttnPlan,
    shape: &AttnShape,
    positions: &[u32],
    decodes: &[usize],
    shares: &dyn Fn(usize, usize, usize) -> bool,
) {
    if decodes.len() < 2 {
        return;
    }
    let max_segs = decodes.iter().map(|&t| p.segments[t]).max().unwrap_or(0);
    // (token, segment) pairs now read by a shared task.
    let mut moved = std::collections::HashSet::new();
    let mut shared_tasks = Vec::new();
    // The decodes that shared the previous segment, by class (segment 0: all of them).
    let mut classes: Vec<Vec<usize>> = vec![decodes.to_vec()];
    for j in 0..max_segs {
        let mut next_classes = Vec::new();
        for class in classes {
            let mut left: Vec<usize> = class
                .into_iter()
                .filter(|&t| j + 1 < p.segments[t])
                .collect();
            while left.len() >= 2 {
                let first = left[0];
                let (mut same, rest): (Vec<usize>, Vec<usize>) = left[1..]
                    .iter()
                    .partition(|&&u| shares(first, u, j as usize));
                left = rest;
                if same.is_empty() {
                    continue;
                }
                same.insert(0, first);
                next_classes.push(same);
            }
        }
        classes = next_classes;
        for same in &mut classes {
            // Rows in position order, as a tile task's (`attention_tiled::segment_passes`).
            same.sort_by_key(|&t| positions[t]);
            for members in same.chunks(MAX_SHARED_TOKENS) {
                if members.len() < 2 {
                    continue;
                }
                let list = (
                    p.shared_tokens.len() as u32,
                    (p.shared_tokens.len() + members.len()) as u32,
                );
                p.shared_tokens.extend(members.iter().map(|&t| t as u32));
                for kv_head in 0..shape.num_kv_heads as u32 {
                    shared_tasks.push(AttnTask::Shared {
                        list,
                        kv_head,
                        segment: j,
                    });
                }
                moved.extend(members.iter().map(|&t| (t as u32, j)));
            }
        }
    }
    if shared_tasks.is_empty() {
        return;
    }
    p.tasks.retain(|task| match *task {
        AttnTask::Tile {
            tokens, segments, ..
        } if tokens.1 - tokens.0 == 1 => !moved.contains(&(tokens.0, segments.0)),
        _ => true,
    });
    shared_tasks.append(&mut p.tasks);
    p.tasks = shared_tasks;
}

/// How many tiles a run of `len` tokens is cut into: enough that none exceeds `tile_tokens`,
/// and, for a short run, up to [`MIN_TILES_PER_RUN`] of at least [`MIN_TILE_TOKENS`] so that a
/// prefill chunk beside decodes (tens of tokens, one sequence) still makes tasks enough for the
/// pool (with three KV heads and two threads, one 64-token tile of a 60-token chunk left one
/// thread a third idle). The tiles are then of equal lengths (within one token).
pub fn run_tiles(len: usize, tile_tokens: usize) -> usize {
    len.div_ceil(tile_tokens)
        .max((len / MIN_TILE_TOKENS).min(MIN_TILES_PER_RUN))
}

/// Plans the tile of batch tokens `start..end` (one sequence, consecutive positions).
fn push_tile(p: &mut AttnPlan, shape: &AttnShape, positions: &[u32], start: usize, end: usize) {
    for (u, &pos) in positions.iter().enumerate().take(end).skip(start) {
        let segs = num_segments(pos as usize + 1);
        p.segments[u] = segs as u32;
        p.partial_base[u] = Some(p.partial_rows as u32);
        p.partial_rows += shape.num_heads * segs;
    }
    let max_segs = p.segments[end - 1];
    for g in &mut p.token_group[start..end] {
        *g = Some(p.group_tasks.len() as u32);
    }
    for kv_head in 0..shape.num_kv_heads as u32 {
        let group = p.group_tasks.len() as u32;
        let split = if end - start == 1 { 1 } else { max_segs };
        let mut j = 0;
        while j < max_segs {
            p.tasks.push(AttnTask::Tile {
                tokens: (start as u32, end as u32),
                kv_head,
                segments: (j, (j + split).min(max_segs)),
                group,
            });
            j += split;
        }
        p.group_tasks.push(max_segs.div_ceil(split));
    }
}

// The tiled tasks' kernel paths (the table).

/// From this many query rows sharing a tile on, the tile is widened to f32 once instead of
/// widening each element on load for every row.
pub const WIDEN_MIN_ROWS: usize = 8;

/// Query tokens per task below which a task is a decode's (few rows per tile): V is read from
/// its codes inside the tile step rather than decoded to a scratch first.
pub const FUSE_MAX_TOKENS: usize = 3;

/// Encoded K/V that the row kernels read directly in tiles of few rows (the others widen).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowCodec {
    /// fp8 K and V (each row scaled), decoded to f32 first.
    Fp8,
}

/// The transposed tile step a widened tile goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transposed {
    /// AVX-512: 16 positions per vector (`kernels::flash_tile_wide`).
    Wide,
    /// AVX2, for tiles shared by many rows (`kernels::flash_tile_narrow`).
    Narrow,
}

/// Whether K/V in `codecs` are attended in the bf16-pair arithmetic (`kernels::flash_tile_pairs`):
/// bf16 K and V. A property of the codecs alone, so of the cache namespace ([`arith_tag`]).
pub fn pairs_arithmetic(codecs: KvDtype) -> bool {
    codecs == KvDtype::uniform(KvCodecKind::Bf16)
}

/// Whether K/V in `codecs` with heads of `head_dim` are attended in the int8-scored pair
/// arithmetic (`kernels::flash_tile_pairs_coded`): `int8` K with one group per row, its scores
/// taken from the codes (as the `int8` codec's), and bf16 V in the bf16-pair step's `p·V`.
pub fn coded_pairs_arithmetic(codecs: KvDtype, head_dim: usize) -> bool {
    codecs.v == KvCodecKind::Bf16 && KeyCodes::of(codecs.k, head_dim) == Some(KeyCodes::Rows)
}

/// What the tiled attention over `codecs` with heads of `head_dim` adds to the cache
/// namespace's arithmetic tag: blocks computed in the bf16-pair arithmetic, or the int8-scored
/// one, never share keys with blocks computed before it (bf16 K/V were once attended in f32,
/// `int8` K with bf16 V in f32 after decoding both).
pub fn arith_tag(codecs: KvDtype, head_dim: usize) -> &'static [u8] {
    if pairs_arithmetic(codecs) {
        b";attention=bf16-pairs"
    } else if coded_pairs_arithmetic(codecs, head_dim) {
        b";attention=int8-bf16-pairs"
    } else {
        b""
    }
}

/// What a task decides once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskPath {
    /// The 512-bit transposed step is available for widened tiles.
    pub wide: bool,
    /// The AVX2 transposed step is available (only where `wide` is not).
    pub narrow: bool,
    /// AVX-512 BF16 runs the bf16-pair step (`pairs`) in its own instruction.
    pub bf16: bool,
    /// Query rows are rounded to f16 once (llama.cpp's per-row kernel and the tiled regime over
    /// f16 K/V); otherwise f32.
    pub q_f16: bool,
    /// K/V are stored encoded (anything but f16).
    pub encoded: bool,
    /// Encoded K/V whose tiles of few rows the row kernels read.
    pub row_codec: Option<RowCodec>,
    /// bf16 K and V: every tile takes the bf16-pair step (`kernels::flash_tile_pairs`, its own
    /// arithmetic: products two at a time in bf16, AVX-512 BF16's `vdpbf16ps`), whatever the
    /// rows, tokens or CPU (without AVX-512 BF16 its portable form: the same bits, slower).
    pub pairs: bool,
    /// `int8` K (one group per row) and bf16 V: every tile takes the int8-scored pair step
    /// (`kernels::flash_tile_pairs_coded`: scores from K's codes, `p·V` in bf16 pairs), whatever
    /// the rows, tokens or CPU (without AVX-512 VNNI and BF16 its portable form).
    pub coded_pairs: bool,
    /// AVX-512 VNNI and BF16 run the int8-scored pair step (`coded_pairs`) in their own
    /// instructions.
    pub vnni_bf16: bool,
    /// How K would be scored from its codes, whatever the ISA (`None`: decoded to f32).
    pub key_codes_any: Option<KeyCodes>,
    /// K scored from its codes in sealed tiles: `int8` rows everywhere, `int4c` channels only
    /// with the 512-bit step.
    pub key_codes: Option<KeyCodes>,
    /// A decode's tiles: V read from its codes in registers (AVX-512 VNNI, else AVX2).
    pub fuse_values: bool,
    /// A decode's sealed `int4c` tiles without the 512-bit step: K and V read from their codes
    /// by the AVX2 tile step.
    pub fuse_channels: bool,
    /// Sealed `int4c` K goes straight into the AVX2 transposed step's tile.
    pub stage_channels_narrow: bool,
}

/// What a pass of rows sharing each tile decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassPath {
    /// Tiles are widened to f32 once (encoded K/V the row kernels do not read, or many rows).
    pub widen: bool,
    /// The transposed step widened tiles take, if any.
    pub transposed: Option<Transposed>,
    /// Sealed `int4c` K is decoded straight into the AVX2 transposed tile.
    pub narrow_channels: bool,
}

impl TaskPath {
    /// The task-level choice for K/V in `codecs` with heads of `head_dim`, `task_tokens` query
    /// tokens per task, on `features` (taken as given: callers pass what the CPU has) in
    /// `arith`.
    pub fn choose(
        codecs: KvDtype,
        head_dim: usize,
        task_tokens: usize,
        features: CpuFeatures,
        arith: AttnArith,
    ) -> TaskPath {
        let wide = features.avx512 && head_dim.is_multiple_of(16);
        let narrow = !wide && features.avx2 && head_dim.is_multiple_of(8);
        let f16 = codecs == KvDtype::F16;
        let q_f16 = f16 && matches!(arith, AttnArith::Row | AttnArith::Tiled);
        let pairs = pairs_arithmetic(codecs);
        let row_codec = if codecs == KvDtype::uniform(KvCodecKind::Fp8E4m3) {
            Some(RowCodec::Fp8)
        } else {
            None
        };
        let key_codes_any = KeyCodes::of(codecs.k, head_dim);
        let fuse_values = values_from_codes(codecs.v, head_dim)
            && task_tokens < FUSE_MAX_TOKENS
            && if features.avx512 {
                features.vnni
            } else {
                features.avx2
            };
        let channels = key_codes_any == Some(KeyCodes::Channels);
        TaskPath {
            wide,
            narrow,
            bf16: features.bf16 && head_dim.is_multiple_of(16),
            q_f16,
            encoded: !f16,
            row_codec,
            pairs,
            coded_pairs: coded_pairs_arithmetic(codecs, head_dim),
            vnni_bf16: features.bf16 && features.vnni && head_dim.is_multiple_of(16),
            key_codes_any,
            key_codes: key_codes_any.filter(|&k| k == KeyCodes::Rows || wide),
            fuse_values,
            fuse_channels: cfg!(target_arch = "x86_64") && fuse_values && !wide && channels,
            stage_channels_narrow: channels && narrow,
        }
    }

    /// The choice for a pass of `rows` query rows sharing each tile.
    pub fn pass(&self, rows: usize, head_dim: usize) -> PassPath {
        let widen = (self.encoded && self.row_codec.is_none()) || rows >= WIDEN_MIN_ROWS;
        let transposed = if self.wide {
            Some(Transposed::Wide)
        } else if self.narrow && rows >= WIDEN_MIN_ROWS {
            Some(Transposed::Narrow)
        } else {
            None
        };
        PassPath {
            widen,
            transposed,
            narrow_channels: transposed == Some(Transposed::Narrow) && head_dim.is_multiple_of(64),
        }
    }

    /// The tile step a whole, sealed (`sealed`: before the pass's own `int4c` group) or
    /// unsealed tile of the pass takes: the last rung of `attention_tiled.rs`'s ladder, named.
    #[cfg(test)]
    pub(crate) fn tile_step(&self, pass: &PassPath, sealed: bool) -> &'static str {
        if self.fuse_channels && sealed {
            return "int4c codes, AVX2 step (K and V in registers)";
        }
        if self.coded_pairs {
            return if self.vnni_bf16 {
                "int8 key codes, bf16 pairs, AVX-512 VNNI/BF16 step"
            } else {
                "int8 key codes, bf16 pairs, portable step"
            };
        }
        if self.pairs {
            return if self.bf16 {
                "bf16 pairs, AVX-512 BF16 step"
            } else {
                "bf16 pairs, portable step"
            };
        }
        if !pass.widen && self.row_codec == Some(RowCodec::Fp8) {
            return "fp8 decoded, row kernel";
        }
        let coded = self.key_codes.filter(|_| sealed);
        match coded {
            Some(KeyCodes::Channels) if self.fuse_values => {
                return "int4c codes widened, 512-bit step, V codes in registers"
            }
            Some(KeyCodes::Channels) => return "int4c codes widened, 512-bit transposed step",
            Some(KeyCodes::Rows) if self.fuse_values => {
                return "int8 key codes, integer scores, V codes in registers"
            }
            Some(KeyCodes::Rows) => return "int8 key codes, integer scores",
            None => {}
        }
        match (pass.widen, pass.transposed) {
            (true, Some(Transposed::Wide)) => "widened, 512-bit transposed step",
            (true, Some(Transposed::Narrow)) => "widened, AVX2 transposed step",
            (true, None) => "widened f32, row kernel",
            (false, _) => "f16, row kernel",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine's arithmetic: f16 rows tiled at every depth.
    const SHAPE: AttnShape = AttnShape {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 64,
        kv_is_f16: true,
        kv_encoded: false,
        arith: AttnArith::Tiled,
        // Threads enough that every decode segment keeps its own task.
        threads: 64,
    };
    /// llama.cpp's per-row decode arithmetic.
    const ROW: AttnShape = AttnShape {
        arith: AttnArith::Row,
        ..SHAPE
    };

    #[test]
    fn llama_cpp_row_arithmetic_is_exact_at_every_depth() {
        // Its split-KV decode beyond 256 positions is per row too (`attention_split`).
        let p = plan(
            &ROW,
            &[SeqSlot(0), SeqSlot(1), SeqSlot(2)],
            &[10, 255, 4000],
        );
        assert_eq!(p.tasks.len(), 12);
        assert_eq!(p.tasks[5], AttnTask::Row { token: 1, head: 1 });
        assert_eq!(p.tasks[11], AttnTask::Row { token: 2, head: 3 });
        assert_eq!(p.partial_rows, 0);
        assert_eq!(p.partial_base, vec![None, None, None]);
    }

    #[test]
    fn the_engine_arithmetic_tiles_short_contexts_too() {
        // `Tiled`: positions 10 and 255 of two sequences, one tile per sequence and KV head.
        let shape = SHAPE;
        assert!(SHAPE.tiled() && !ROW.tiled());
        let p = plan(&shape, &[SeqSlot(0), SeqSlot(1)], &[10, 255]);
        let want: Vec<AttnTask> = (0..2u32)
            .flat_map(|t| {
                (0..2).map(move |kv_head| AttnTask::Tile {
                    tokens: (t, t + 1),
                    kv_head,
                    segments: (0, 1),
                    group: 2 * t + kv_head,
                })
            })
            .collect();
        assert_eq!(p.tasks, want);
        assert_eq!(p.partial_rows, 2 * 4);
        // Head sizes the tile kernels do not take stay exact.
        let odd = AttnShape {
            head_dim: 60,
            ..shape
        };
        assert!(!odd.tiled());
    }

    #[test]
    fn a_decode_at_depth_splits_into_segments_per_kv_head() {
        // Position 1100 attends 1101 positions: 3 segments.
        let p = plan(&SHAPE, &[SeqSlot(3)], &[1100]);
        assert_eq!(p.segments, vec![3]);
        assert_eq!(p.partial_rows, 4 * 3);
        let want: Vec<AttnTask> = (0..2)
            .flat_map(|kv_head| {
                (0..3).map(move |j| AttnTask::Tile {
                    tokens: (0, 1),
                    kv_head,
                    segments: (j, j + 1),
                    group: kv_head,
                })
            })
            .collect();
        assert_eq!(p.tasks, want);
        assert_eq!(p.group_tasks, vec![3, 3]);
    }

    /// With few threads a decode's consecutive segments share tasks (up to four each, keeping
    /// three tasks per thread), its prefix segments shared with another decode stay in their
    /// shared tasks, and every group counts the tasks it has; with threads enough every
    /// segment keeps its own task.
    #[test]
    fn a_decodes_segments_are_grouped_into_tasks_for_few_threads() {
        let tiles = |p: &AttnPlan| -> Vec<(u32, u32, (u32, u32))> {
            p.tasks
                .iter()
                .filter_map(|t| match *t {
                    AttnTask::Tile {
                        tokens,
                        kv_head,
                        segments,
                        ..
                    } => Some((tokens.0, kv_head, segments)),
                    _ => None,
                })
                .collect()
        };
        // Position 4095: 8 segments, 2 KV heads: 16 one-segment tasks; 2 threads: groups of
        // two (16 / 6 = 2), 8 tasks.
        let two = AttnShape {
            threads: 2,
            ..SHAPE
        };
        let p = plan(&two, &[SeqSlot(0)], &[4095]);
        let want: Vec<_> = (0..2)
            .flat_map(|h| (0..4).map(move |i| (0, h, (2 * i, 2 * i + 2))))
            .collect();
        assert_eq!(tiles(&p), want);
        assert_eq!(p.group_tasks, vec![4, 4]);
        // One thread: four segments a task (at most), the last task shorter where they end.
        let one = AttnShape {
            threads: 1,
            ..SHAPE
        };
        let p = plan(&one, &[SeqSlot(0)], &[2600]);
        assert_eq!(p.segments, vec![6]);
        assert_eq!(
            tiles(&p),
            vec![
                (0, 0, (0, 4)),
                (0, 0, (4, 6)),
                (0, 1, (0, 4)),
                (0, 1, (4, 6))
            ]
        );
        assert_eq!(p.group_tasks, vec![2, 2]);
        // Threads enough: one task per segment, as before.
        let p = plan(&SHAPE, &[SeqSlot(0)], &[4095]);
        assert_eq!(tiles(&p).len(), 16);
        assert_eq!(p.group_tasks, vec![8, 8]);
        // Two decodes sharing their first two segments: those stay shared (one task per
        // segment and head for both), the rest of each is grouped; every group's count is the
        // number of tasks that carry its token.
        let shares = |_: usize, _: usize, j: usize| j < 2;
        let p = plan_without(&one, &[SeqSlot(0), SeqSlot(1)], &[3000, 3500], &[], &shares);
        let shared = p
            .tasks
            .iter()
            .filter(|t| matches!(t, AttnTask::Shared { .. }))
            .count();
        assert_eq!(shared, 2 * 2);
        assert_eq!(
            tiles(&p),
            vec![
                (0, 0, (2, 6)),
                (0, 1, (2, 6)),
                (1, 0, (2, 6)),
                (1, 0, (6, 7)),
                (1, 1, (2, 6)),
                (1, 1, (6, 7)),
            ]
        );
        for (t, groups) in [(0u32, [0usize, 1]), (1, [2, 3])] {
            for (kv_head, &g) in groups.iter().enumerate() {
                let own = tiles(&p)
                    .iter()
                    .filter(|&&(tok, h, _)| tok == t && h == kv_head as u32)
                    .count();
                assert_eq!(
                    p.group_tasks[g] as usize,
                    own + 2,
                    "token {t} head {kv_head}"
                );
            }
        }
    }

    #[test]
    fn a_prefill_run_is_cut_into_query_tiles_at_sequence_boundaries() {
        // Sequence 0: positions 250..=295 (46 tokens: two tiles of 23); sequence 1: positions
        // 600, 601.
        assert_eq!(QUERY_TILE_TOKENS, 32);
        let mut slots = vec![SeqSlot(0); 46];
        let mut positions: Vec<u32> = (250..296).collect();
        slots.extend([SeqSlot(1), SeqSlot(1)]);
        positions.extend([600, 601]);
        let p = plan(&SHAPE, &slots, &positions);
        assert!(p.tasks.iter().all(|t| matches!(t, AttnTask::Tile { .. })));
        let tiles: Vec<_> = p
            .tasks
            .iter()
            .filter_map(|t| match *t {
                AttnTask::Tile {
                    tokens, segments, ..
                } => Some((tokens, segments)),
                _ => None,
            })
            .collect();
        assert_eq!(
            tiles,
            vec![
                ((0, 23), (0, 1)),
                ((0, 23), (0, 1)),
                ((23, 46), (0, 1)),
                ((23, 46), (0, 1)),
                ((46, 48), (0, 2)),
                ((46, 48), (0, 2)),
            ]
        );
        assert_eq!(p.partial_base[0], Some(0));
        assert_eq!(p.partial_base[1], Some(4));
        assert_eq!(p.partial_base[46], Some(46 * 4));
        assert_eq!(p.partial_base[47], Some(46 * 4 + 8));
        assert_eq!(p.partial_rows, 46 * 4 + 2 * 8);
        assert_eq!(p.group_tasks, vec![1; 6]);
    }

    #[test]
    fn encoded_kv_is_tiled_at_every_depth() {
        let shape = AttnShape {
            kv_is_f16: false,
            kv_encoded: true,
            ..SHAPE
        };
        // Positions 10..80: shallow, but encoded rows always take the tiled regime (a block K
        // codec's group starts do not cut tiles: `attention_tiled::segment_passes` splits the
        // rows of a tile where their own groups differ).
        let positions: Vec<u32> = (10..80).collect();
        let p = plan(&shape, &[SeqSlot(0); 70], &positions);
        assert!(p.tasks.iter().all(|t| matches!(t, AttnTask::Tile { .. })));
        let tiles: Vec<(u32, u32)> = p
            .tasks
            .iter()
            .filter_map(|t| match *t {
                AttnTask::Tile {
                    tokens, kv_head: 0, ..
                } => Some(tokens),
                _ => None,
            })
            .collect();
        assert_eq!(ENCODED_QUERY_TILE_TOKENS, 64);
        // 70 tokens: at most 64 per tile, and a short run is cut into 4 (balanced).
        assert_eq!(tiles, vec![(0, 17), (17, 35), (35, 52), (52, 70)]);
    }

    /// Golden: how many tiles a run is cut into (the plan makes them equal within a token).
    #[test]
    fn runs_are_cut_into_enough_balanced_tiles() {
        assert_eq!((MIN_TILES_PER_RUN, MIN_TILE_TOKENS), (4, 16));
        let cases = [
            // (run length, tile tokens, tiles)
            (1, 32, 1),
            (15, 32, 1),
            (31, 32, 1),
            (32, 32, 2),
            (40, 32, 2),
            (63, 32, 3),
            (64, 32, 4),
            (128, 32, 4),
            (129, 32, 5),
            (512, 32, 16),
            (70, 64, 4),
            (256, 64, 4),
            (300, 64, 5),
            (512, 64, 8),
        ];
        for (len, tile, want) in cases {
            assert_eq!(run_tiles(len, tile), want, "run of {len}, tiles of {tile}");
        }
    }

    #[test]
    fn tokens_left_out_get_no_task_and_split_tiles() {
        let positions: Vec<u32> = (300..310).collect();
        let mut without = vec![false; 10];
        without[0] = true;
        without[4] = true;
        let p = plan_without(
            &SHAPE,
            &[SeqSlot(0); 10],
            &positions,
            &without,
            &|_, _, _| false,
        );
        let tiles: Vec<(u32, u32)> = p
            .tasks
            .iter()
            .filter_map(|t| match *t {
                AttnTask::Tile {
                    tokens, kv_head: 0, ..
                } => Some(tokens),
                _ => None,
            })
            .collect();
        assert_eq!(tiles, vec![(1, 4), (5, 10)]);
        assert_eq!(p.partial_base[0], None);
        assert_eq!(p.partial_base[4], None);
        assert_eq!(p.partial_rows, 8 * 4);
        assert_eq!(
            plan_without(&SHAPE, &[SeqSlot(0); 10], &positions, &[], &|_, _, _| false),
            plan(&SHAPE, &[SeqSlot(0); 10], &positions)
        );
    }

    #[test]
    fn f32_kv_or_odd_head_sizes_stay_exact() {
        for shape in [
            AttnShape {
                kv_is_f16: false,
                ..SHAPE
            },
            AttnShape {
                kv_is_f16: false,
                kv_encoded: true,
                head_dim: 60,
                ..SHAPE
            },
            AttnShape {
                head_dim: 60,
                ..SHAPE
            },
        ] {
            let p = plan(&shape, &[SeqSlot(0)], &[4000]);
            assert!(p.tasks.iter().all(|t| matches!(t, AttnTask::Row { .. })));
        }
    }

    /// The store is asked about segment 0 for every pair of decodes at most, and about a later
    /// segment only within the classes that shared the one before: 64 unrelated decodes at
    /// depth cost one question per pair, 64 behind one prompt one per decode and segment.
    #[test]
    fn sharing_questions_stay_within_classes() {
        let slots: Vec<SeqSlot> = (0..64).map(SeqSlot).collect();
        let positions = vec![3000u32; 64];
        let asked = std::cell::Cell::new(0usize);
        let asked = &asked;
        let count = |answer: bool| {
            move |_: usize, _: usize, _: usize| {
                asked.set(asked.get() + 1);
                answer
            }
        };
        let p = plan_without(&SHAPE, &slots, &positions, &[], &count(false));
        assert_eq!(asked.get(), 64 * 63 / 2);
        assert!(!p.tasks.iter().any(|t| matches!(t, AttnTask::Shared { .. })));
        asked.set(0);
        let p = plan_without(&SHAPE, &slots, &positions, &[], &count(true));
        // 3,001 positions: six segments, the last never shared.
        assert_eq!(asked.get(), 63 * 5);
        let shared = p
            .tasks
            .iter()
            .filter(|t| matches!(t, AttnTask::Shared { .. }))
            .count();
        assert_eq!(shared, 5 * (64 / MAX_SHARED_TOKENS) * SHAPE.num_kv_heads);
    }

    /// Seeded random batches (prefill runs and decodes; sequences in classes that share a
    /// prefix of random length): every (token, head) is covered exactly once — by a `Row` task
    /// or by exactly one task per segment of its tile, or a shared task for a segment that its
    /// sequence shares and attends whole, not its last.
    #[test]
    fn random_batches_cover_every_row_and_segment_exactly_once() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut shared_seen = 0;
        for _ in 0..300 {
            let mut slots = Vec::new();
            let mut positions = Vec::new();
            let num_seqs = rng.gen_range(1..8u32);
            let class: Vec<u32> = (0..num_seqs).map(|_| rng.gen_range(0..3)).collect();
            let prefix: Vec<usize> = (0..3).map(|_| rng.gen_range(0..3000)).collect();
            for s in 0..num_seqs {
                let start = rng.gen_range(0..3000u32);
                let len = if rng.gen_bool(0.6) {
                    1
                } else {
                    rng.gen_range(1..20u32)
                };
                for i in 0..len {
                    slots.push(SeqSlot(s));
                    positions.push(start + i);
                }
            }
            let shares = |a: usize, b: usize, j: usize| {
                let (ca, cb) = (class[slots[a].0 as usize], class[slots[b].0 as usize]);
                ca == cb && (j + 1) * SEGMENT_POSITIONS <= prefix[ca as usize]
            };
            // Few threads group decodes' segments into tasks; many keep one per segment.
            let threads = [1, 2, 64][rng.gen_range(0..3)];
            let shape = AttnShape { threads, ..SHAPE };
            let p = plan_without(&shape, &slots, &positions, &[], &shares);
            let group = SHAPE.num_heads / SHAPE.num_kv_heads;
            let mut seen = std::collections::HashMap::new();
            let mut tasks_of_group = std::collections::HashMap::new();
            for task in &p.tasks {
                match *task {
                    AttnTask::Row { token, head } => {
                        *seen.entry((token, head, u32::MAX)).or_insert(0) += 1;
                    }
                    AttnTask::Tile {
                        tokens,
                        kv_head,
                        segments,
                        group: g,
                    } => {
                        *tasks_of_group.entry(g).or_insert(0u32) += 1;
                        assert!(tokens.1 - tokens.0 <= QUERY_TILE_TOKENS as u32);
                        if tokens.1 - tokens.0 == 1 {
                            assert!(segments.1 - segments.0 <= MAX_DECODE_TASK_SEGMENTS);
                            assert!(threads < 64 || segments.1 - segments.0 == 1);
                        }
                        for t in tokens.0..tokens.1 {
                            assert_eq!(slots[t as usize], slots[tokens.0 as usize]);
                            for j in segments.0..segments.1.min(p.segments[t as usize]) {
                                for g in 0..group as u32 {
                                    let head = kv_head * group as u32 + g;
                                    *seen.entry((t, head, j)).or_insert(0) += 1;
                                }
                            }
                        }
                    }
                    AttnTask::Shared {
                        list,
                        kv_head,
                        segment: j,
                    } => {
                        shared_seen += 1;
                        let listed = &p.shared_tokens[list.0 as usize..list.1 as usize];
                        assert!((2..=MAX_SHARED_TOKENS).contains(&listed.len()));
                        for &t in listed {
                            let t0 = listed[0] as usize;
                            assert!(shares(t0, t as usize, j as usize), "shared segment {j}");
                            assert!(j + 1 < p.segments[t as usize], "a decode's last segment");
                            let g = p.token_group[t as usize].unwrap() + kv_head;
                            *tasks_of_group.entry(g).or_insert(0u32) += 1;
                            for g in 0..group as u32 {
                                let head = kv_head * group as u32 + g;
                                *seen.entry((t, head, j)).or_insert(0) += 1;
                            }
                        }
                    }
                }
            }
            for (g, &n) in p.group_tasks.iter().enumerate() {
                assert_eq!(tasks_of_group.get(&(g as u32)), Some(&n), "group {g}");
            }
            for (t, &pos) in positions.iter().enumerate() {
                let npos = pos as usize + 1;
                for h in 0..SHAPE.num_heads as u32 {
                    if SHAPE.tiled() {
                        for j in 0..num_segments(npos) as u32 {
                            assert_eq!(seen.get(&(t as u32, h, j)), Some(&1));
                        }
                    } else {
                        assert_eq!(seen.get(&(t as u32, h, u32::MAX)), Some(&1));
                    }
                }
            }
        }
        assert!(
            shared_seen > 50,
            "the batches share segments ({shared_seen} tasks)"
        );
    }
}

#[cfg(test)]
mod path_tests {
    use super::*;

    const HD: usize = 64;

    fn isas() -> [(&'static str, CpuFeatures); 5] {
        let avx512 = CpuFeatures {
            avx512: true,
            vnni: true,
            ..CpuFeatures::AVX2
        };
        let avx512_no_vnni = CpuFeatures {
            avx512: true,
            ..CpuFeatures::AVX2
        };
        let avx512_bf16 = CpuFeatures {
            bf16: true,
            ..avx512
        };
        [
            ("portable", CpuFeatures::PORTABLE),
            ("avx2", CpuFeatures::AVX2),
            ("avx512", avx512_no_vnni),
            ("avx512-vnni", avx512),
            ("avx512-vnni-bf16", avx512_bf16),
        ]
    }

    fn codecs() -> Vec<(&'static str, KvDtype)> {
        [
            "f16",
            "bf16",
            "fp8",
            "int8",
            "int4",
            "k=int4c,v=int4",
            "k=int8,v=int4",
            "k=int8,v=bf16",
        ]
        .into_iter()
        .map(|name| (name, KvDtype::parse(name).unwrap()))
        .collect()
    }

    /// The whole table for SmolLM2's head size: codec × ISA × (tokens per task, rows per pass)
    /// × sealed tile → the step, in the tiled arithmetic (the engine's). Exact order; a change
    /// of any choice shows here.
    #[test]
    fn golden_table_of_tile_steps() {
        let mut table = String::new();
        for (codec, kv) in codecs() {
            for (isa, f) in isas() {
                // A decode (1 token, 3 rows: one GQA group) and a prefill chunk (32 tokens).
                for (tokens, rows) in [(1, 3), (32, 96)] {
                    let task = TaskPath::choose(kv, HD, tokens, f, AttnArith::Tiled);
                    let pass = task.pass(rows, HD);
                    let sealed = task.tile_step(&pass, true);
                    let own = task.tile_step(&pass, false);
                    table.push_str(&format!("{codec} {isa} {tokens}: {sealed}"));
                    // Only a block K codec has an own (unsealed) group in a pass.
                    if kv.k.block_tokens().is_some() && own != sealed {
                        table.push_str(&format!(" | own group: {own}"));
                    }
                    table.push('\n');
                }
            }
        }
        let golden = include_str!("attention_path_golden.txt");
        assert_eq!(
            table, golden,
            "the tile-step table changed; if on purpose, update src/attention_path_golden.txt:\n{table}"
        );
    }

    #[test]
    fn the_arithmetic_decides_only_the_query_rounding() {
        for (_, kv) in codecs() {
            for (_, f) in isas() {
                let tiled = TaskPath::choose(kv, HD, 1, f, AttnArith::Tiled);
                let prefill = TaskPath::choose(kv, HD, 1, f, AttnArith::Prefill);
                assert_eq!(
                    TaskPath {
                        q_f16: tiled.q_f16,
                        ..prefill
                    },
                    tiled
                );
                assert!(
                    !prefill.q_f16,
                    "llama.cpp's tiled prefill keeps f32 queries"
                );
                assert_eq!(tiled.q_f16, kv == KvDtype::F16);
            }
        }
    }

    #[test]
    fn odd_head_sizes_fall_back_to_the_row_kernels() {
        let avx512 = isas()[3].1;
        let task = TaskPath::choose(KvDtype::F16, 40, 32, avx512, AttnArith::Tiled);
        assert!(
            !task.wide && task.narrow,
            "40 is a multiple of 8, not of 16"
        );
        let task = TaskPath::choose(
            KvDtype::parse("int8").unwrap(),
            36,
            1,
            avx512,
            AttnArith::Tiled,
        );
        assert_eq!(
            (task.wide, task.narrow, task.key_codes),
            (false, false, None)
        );
    }
}
