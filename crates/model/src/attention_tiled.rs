//! Attention at depth, tiled: runs one [`AttnTask::Tile`] (or [`AttnTask::Shared`]: one
//! segment of several decodes' shared blocks, read once for all of them) of an [`AttnPlan`]
//! and merges the resulting per-segment partial states into output rows.
//!
//! The query rows are rounded to f16 first (llama.cpp's per-row CPU flash attention converts Q to
//! the K type; [`AttnArith::Tiled`] keeps that), except in a step of [`AttnArith::Prefill`]
//! arithmetic (its tiled prefill kernel keeps Q in f32) and over encoded (quantized) K/V, whose
//! queries stay f32. Owns streaming K/V
//! from a [`KvStore`] into tiles (each f16 K/V row widened once, each encoded row decoded once by
//! `quant::decode_rows` — fp8 tiles of few rows decoded but read by the row kernels, not
//! transposed; bf16 tiles staged once into `kernels::flash_tile_pairs`' layouts and attended in
//! its own arithmetic, products two at a time in bf16; `int8` K with bf16 V likewise in the
//! int8-scored pair arithmetic, K kept as codes —
//! then used by every query row of the task: all query heads of the GQA
//! group and up to `QUERY_TILE_TOKENS` tokens, `ENCODED_QUERY_TILE_TOKENS` over encoded K/V) and
//! the causal limits per row. The arithmetic is that of `kernels::flash_tile`; a tile shared by many rows (a prefill run) is widened once — with
//! AVX-512, K straight into the transposed `[head_dim, 16]` layout of `kernels::flash_tile_wide`,
//! whose 512-bit step gives the same bits as the row-major kernels a decode uses (with AVX2 only,
//! the same layout feeds the 256-bit step of `kernels::flash_tile_narrow`). It never
//! writes K/V and never decides the task split (see `attention_plan`).

use std::sync::atomic::{AtomicU32, Ordering};

use half::{bf16, f16};

use crate::attention::AttnArith;
use crate::attention_plan::{AttnPlan, AttnTask, SEGMENT_POSITIONS};
use crate::attention_plan::{RowCodec, TaskPath, Transposed};
use crate::kv::{KvChunk, KvStore, SeqSlot};
use kernels::coded_pair_layout::{self, coded_pair_tile, CodedPairHalf, CodedPairStage};
use kernels::cpu::{cpu_features, CpuFeatures};
use kernels::flash_tile::{
    merge_segments, prefetch_l1, tile_update, tile_update_rows, widen_f16, TileElem, TileSoftmax,
    TILE_POSITIONS, TILE_ROWS,
};
#[cfg(target_arch = "x86_64")]
use kernels::flash_tile_codes::{tile_update_channel_codes, tile_update_wide_codes};
use kernels::flash_tile_codes::{
    tile_update_codes, CodedTile, KeyCodes, QueryCodes, QueryRef, TileValues,
};
use kernels::flash_tile_narrow::NarrowTiles;
use kernels::flash_tile_pairs::{
    query_pairs, tile_update_pairs, tiles_update_pairs, PairHalf, PairTile, PairTileRef,
    PAIR_HALF_POSITIONS, PAIR_TILE_POSITIONS,
};
use kernels::flash_tile_pairs_coded::{
    tile_update_pairs_coded, tiles_update_pairs_coded, CodedPairTile,
};
use kernels::flash_tile_transposed::{
    tile_update_transposed, TransposedTiles, TRIPLE_ROWS as WIDE_ROWS,
};
use kernels::flash_tile_wide::{transpose_keys, WideTiles};
use kernels::par::DisjointRows;
use quant::decode_rows;

/// Reusable per-thread buffers: one K and one V tile as stored (f16) and widened (f32).
#[derive(Default)]
pub struct TileScratch {
    keys16: Vec<f16>, // [TILE_POSITIONS, head_dim]
    vals16: Vec<f16>, // [TILE_POSITIONS, head_dim]
    /// A bf16 K and V tile as stored, gathered from pieces in two chunks.
    keys_bf16: Vec<bf16>, // [PAIR_TILE_POSITIONS, head_dim]
    vals_bf16: Vec<bf16>, // [PAIR_TILE_POSITIONS, head_dim]
    /// A bf16 tile staged for the bf16-pair step (`kernels::flash_tile_pairs`).
    pair_tile: PairTile,
    /// The task's query rows rounded to bf16 pairs, `[rows, head_dim / 2]` (bf16 K/V).
    qpairs: Vec<u32>,
    /// Halves of an `int8`-K / bf16-V tile staged for the int8-scored pair step
    /// (`kernels::flash_tile_pairs_coded`) where the store does not hold them whole.
    coded_stage: CodedPairStage,
    keys32: Vec<f32>, // [TILE_POSITIONS, head_dim]
    vals32: Vec<f32>, // [TILE_POSITIONS, head_dim]
    /// The widened K tile transposed, `[head_dim, TILE_POSITIONS]` (the 512-bit kernel's input).
    keys_t: Vec<f32>,
    /// The task's query rows rounded to f16 (as llama.cpp's CPU flash attention converts the
    /// query to the K type), `[rows, head_dim]`.
    q16: Vec<f32>,
    /// A K tile kept as integer codes (K codecs scored from codes, `flash_tile_codes`).
    coded: CodedTile,
    /// The task's query rows quantised for those codes.
    qcodes: QueryCodes,
    /// The position counts of a segment's rows and its passes (`segment_passes`).
    ns: Vec<usize>,
    passes: Vec<SegmentPass>,
}

impl TileScratch {
    /// Sizes the tile buffers for heads of `hd` (grown once, reused by every task).
    fn size_tiles(&mut self, hd: usize) {
        for buf in [&mut self.keys16, &mut self.vals16] {
            buf.resize(TILE_POSITIONS * hd, f16::ZERO);
        }
        for buf in [&mut self.keys_bf16, &mut self.vals_bf16] {
            buf.resize(PAIR_TILE_POSITIONS * hd, bf16::ZERO);
        }
        for buf in [&mut self.keys32, &mut self.vals32, &mut self.keys_t] {
            buf.resize(TILE_POSITIONS * hd, 0.0);
        }
        if self.pair_tile.head_dim() != hd && hd.is_multiple_of(2) {
            self.pair_tile = PairTile::new(hd);
        }
        if self.coded_stage.head_dim() != hd && coded_pair_layout::fits(hd) {
            self.coded_stage = CodedPairStage::new(hd);
        }
    }
}

/// What a tile task reads: one layer's queries and the step's token positions.
#[derive(Clone, Copy)]
pub struct TileInputs<'a> {
    pub kv: &'a dyn KvStore,
    pub layer: usize,
    /// `[num_tokens, num_heads * head_dim]`, after RoPE.
    pub q: &'a [f32],
    pub slots: &'a [SeqSlot],
    pub positions: &'a [u32],
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// [`AttnArith::Row`] and [`AttnArith::Tiled`]: queries rounded to f16 (llama.cpp's per-row
    /// kernel converts Q to the K type); [`AttnArith::Prefill`]: f32 queries (its tiled prefill
    /// kernel).
    pub arith: AttnArith,
}

/// One participating query row of a segment: its query, causal position count and partial row
/// (`[head_dim]` accumulator, then max and sum).
struct Row<'a> {
    /// The row's index in the task (its quantised query in `TileScratch::qcodes`).
    idx: usize,
    q: &'a [f32],
    n: usize,
    partial: &'a mut [f32],
}

impl Row<'_> {
    fn update<E: TileElem>(
        &mut self,
        hd: usize,
        keys: &[E],
        vals: &[E],
        tile_start: usize,
        tile_end: usize,
        scale: f32,
    ) {
        let end = self.n.min(tile_end);
        if end <= tile_start {
            return;
        }
        let (acc, st) = self.partial.split_at_mut(hd);
        let mut sm = TileSoftmax {
            max: st[0],
            sum: st[1],
        };
        tile_update(&mut sm, acc, self.q, keys, vals, end - tile_start, scale);
        st[0] = sm.max;
        st[1] = sm.sum;
    }
}

/// `bytes` (little-endian bf16 values) as bf16, where they are 2-aligned (rows of the pool
/// always are) on a little-endian target; `None` otherwise (the caller copies them).
fn as_bf16(bytes: &[u8]) -> Option<&[bf16]> {
    if cfg!(target_endian = "big") {
        return None;
    }
    // SAFETY: `bf16` is `repr(transparent)` over `u16`, so every 2-byte pattern is a valid
    // value, and `align_to` hands out only the suitably aligned middle part.
    let (pre, mid, post) = unsafe { bytes.align_to::<bf16>() };
    (pre.is_empty() && post.is_empty()).then_some(mid)
}

/// The bf16 values of whole bf16 rows (`dst`: their `num_rows × head_dim` values).
fn bf16_rows_into(rows: &quant::EncodedRows<'_>, dst: &mut [bf16]) {
    let bytes = rows.bytes();
    assert_eq!(
        bytes.len(),
        2 * dst.len(),
        "bf16 rows and their tile differ"
    );
    for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
        *d = bf16::from_bits(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// Runs one tile for every row: runs of [`TILE_ROWS`] consecutive rows that see the same
/// positions of the tile (the heads of a GQA group, every row of a tile below the causal
/// diagonal) share their K/V loads in one kernel call; each row's arithmetic is that of
/// [`Row::update`] either way, so grouping never changes a bit.
fn update_rows<E: TileElem>(
    rows: &mut [Row<'_>],
    hd: usize,
    keys: &[E],
    vals: &[E],
    tile_start: usize,
    tile_end: usize,
    scale: f32,
) {
    let mut i = 0;
    while i < rows.len() {
        if let [a, b, c, ..] = &mut rows[i..] {
            let end = a.n.min(tile_end);
            if end > tile_start && b.n.min(tile_end) == end && c.n.min(tile_end) == end {
                let qs = [a.q, b.q, c.q];
                let (acc_a, st_a) = a.partial.split_at_mut(hd);
                let (acc_b, st_b) = b.partial.split_at_mut(hd);
                let (acc_c, st_c) = c.partial.split_at_mut(hd);
                let mut sts = [&*st_a, &*st_b, &*st_c].map(|st| TileSoftmax {
                    max: st[0],
                    sum: st[1],
                });
                let mut accs = [acc_a, acc_b, acc_c];
                tile_update_rows(
                    &mut sts,
                    &mut accs,
                    &qs,
                    keys,
                    vals,
                    end - tile_start,
                    scale,
                );
                for (st, sm) in [st_a, st_b, st_c].into_iter().zip(sts) {
                    st[0] = sm.max;
                    st[1] = sm.sum;
                }
                i += TILE_ROWS;
                continue;
            }
        }
        rows[i].update(hd, keys, vals, tile_start, tile_end, scale);
        i += 1;
    }
}

/// Calls `kernel` once per block of `BLOCK` rows with the rows that reach into the tile
/// (`tile_start..tile_end`): their softmax states (loaded from and stored back into
/// `Row::partial`), accumulators, queries (`query` of each row) and valid positions.
fn for_live_blocks<'r, const BLOCK: usize, Q: Copy>(
    rows: &mut [Row<'r>],
    hd: usize,
    tile_start: usize,
    tile_end: usize,
    empty: Q,
    query: impl Fn(&Row<'r>) -> Q,
    mut kernel: impl FnMut(&mut [TileSoftmax], &mut [&mut [f32]], &[Q], &[usize]),
) {
    for block in rows.chunks_mut(BLOCK) {
        let mut sts = [TileSoftmax::default(); BLOCK];
        let mut valids = [0usize; BLOCK];
        let mut qs = [empty; BLOCK];
        let mut accs: [&mut [f32]; BLOCK] = std::array::from_fn(|_| <&mut [f32]>::default());
        let mut states: [&mut [f32]; BLOCK] = std::array::from_fn(|_| <&mut [f32]>::default());
        let mut live = 0;
        for row in block.iter_mut() {
            let end = row.n.min(tile_end);
            if end <= tile_start {
                continue;
            }
            qs[live] = query(row);
            let (acc, st) = row.partial.split_at_mut(hd);
            sts[live] = TileSoftmax {
                max: st[0],
                sum: st[1],
            };
            valids[live] = end - tile_start;
            accs[live] = acc;
            states[live] = st;
            live += 1;
        }
        if live == 0 {
            continue;
        }
        kernel(
            &mut sts[..live],
            &mut accs[..live],
            &qs[..live],
            &valids[..live],
        );
        for (st, sm) in states.iter_mut().zip(&sts).take(live) {
            st[0] = sm.max;
            st[1] = sm.sum;
        }
    }
}

/// Rows handed to one call of the 512-bit kernel: several triples, so it can overlap one
/// triple's softmax with the next triple's scores (`flash_tile_wide::x86::triples`).
const WIDE_BLOCK_ROWS: usize = 8 * WIDE_ROWS;

/// [`update_rows`] through a transposed tile step (`kernels::flash_tile_transposed`): `kt` is the tile's K transposed, `vals` its
/// widened V; rows go in blocks of [`WIDE_BLOCK_ROWS`].
#[allow(clippy::too_many_arguments)]
fn update_rows_transposed(
    step: TransposedTiles,
    rows: &mut [Row<'_>],
    hd: usize,
    kt: &[f32],
    vals: &[f32],
    tile_start: usize,
    tile_end: usize,
    scale: f32,
) {
    let empty: &[f32] = &[];
    for_live_blocks::<WIDE_BLOCK_ROWS, _>(
        rows,
        hd,
        tile_start,
        tile_end,
        empty,
        |row| row.q,
        |sts, accs, qs, valids| {
            tile_update_transposed(step, sts, accs, qs, valids, kt, vals, scale)
        },
    );
}

/// [`update_rows`] for a tile whose K is kept as codes (`flash_tile_codes`): scores from the
/// rows' quantised queries, `vals` the tile's decoded V; rows go in blocks of
/// [`WIDE_BLOCK_ROWS`] (the kernel takes them three at a time).
#[allow(clippy::too_many_arguments)]
fn update_rows_coded(
    features: CpuFeatures,
    keys: KeyCodes,
    rows: &mut [Row<'_>],
    hd: usize,
    tile: &CodedTile,
    qcodes: &QueryCodes,
    vals: TileValues<'_>,
    tile_start: usize,
    tile_end: usize,
    scale: f32,
) {
    for_live_blocks::<WIDE_BLOCK_ROWS, _>(
        rows,
        hd,
        tile_start,
        tile_end,
        QueryRef::EMPTY,
        |row| qcodes.row(row.idx),
        |sts, accs, qs, valids| {
            tile_update_codes(features, keys, sts, accs, qs, valids, tile, vals, scale)
        },
    );
}

/// [`update_rows`] for a sealed `int4c` K tile and coded V rows read in registers by the
/// AVX2 tile step (`flash_tile_codes::tile_update_channel_codes`, same bits); `tile` holds the
/// group's channel parameters.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn update_rows_channel_codes(
    features: CpuFeatures,
    rows: &mut [Row<'_>],
    hd: usize,
    tile: &CodedTile,
    keys: &quant::EncodedRows<'_>,
    vals: &quant::EncodedRows<'_>,
    tile_start: usize,
    tile_end: usize,
    scale: f32,
) {
    let empty: &[f32] = &[];
    for_live_blocks::<TILE_ROWS, _>(
        rows,
        hd,
        tile_start,
        tile_end,
        empty,
        |row| row.q,
        |sts, accs, qs, valids| {
            tile_update_channel_codes(features, sts, accs, qs, valids, tile, keys, vals, scale)
        },
    );
}

/// [`update_rows_wide`] with the tile's V read as codes (`flash_tile_codes`, same bits): a
/// decode's rows (one or two tokens), so rows sharing `valid` go three at a time.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn update_rows_wide_codes(
    proof: WideTiles,
    rows: &mut [Row<'_>],
    hd: usize,
    kt: &[f32],
    vals: &quant::EncodedRows<'_>,
    tile_start: usize,
    tile_end: usize,
    scale: f32,
) {
    for block in rows.chunks_mut(WIDE_ROWS) {
        let valid_of = |r: &Row<'_>| r.n.min(tile_end).saturating_sub(tile_start);
        let valid = valid_of(&block[0]);
        if valid == 0 || block.iter().any(|r| valid_of(r) != valid) {
            // Rows of differing reach: one at a time.
            for row in block.iter_mut() {
                let v = valid_of(row);
                if v > 0 {
                    update_rows_wide_codes_one(proof, row, hd, kt, vals, v, scale);
                }
            }
            continue;
        }
        let mut sts = [TileSoftmax::default(); WIDE_ROWS];
        let mut qs: [&[f32]; WIDE_ROWS] = [&[]; WIDE_ROWS];
        let mut accs: [&mut [f32]; WIDE_ROWS] = std::array::from_fn(|_| <&mut [f32]>::default());
        let mut states: [&mut [f32]; WIDE_ROWS] = std::array::from_fn(|_| <&mut [f32]>::default());
        let live = block.len();
        for (i, row) in block.iter_mut().enumerate() {
            let (acc, st) = row.partial.split_at_mut(hd);
            sts[i] = TileSoftmax {
                max: st[0],
                sum: st[1],
            };
            qs[i] = row.q;
            accs[i] = acc;
            states[i] = st;
        }
        tile_update_wide_codes(
            proof,
            &mut sts[..live],
            &mut accs[..live],
            &qs[..live],
            valid,
            kt,
            vals,
            scale,
        );
        for (st, sm) in states.iter_mut().zip(&sts).take(live) {
            st[0] = sm.max;
            st[1] = sm.sum;
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn update_rows_wide_codes_one(
    proof: WideTiles,
    row: &mut Row<'_>,
    hd: usize,
    kt: &[f32],
    vals: &quant::EncodedRows<'_>,
    valid: usize,
    scale: f32,
) {
    let (acc, st) = row.partial.split_at_mut(hd);
    let mut sts = [TileSoftmax {
        max: st[0],
        sum: st[1],
    }];
    tile_update_wide_codes(
        proof,
        &mut sts,
        &mut [acc],
        &[row.q],
        valid,
        kt,
        vals,
        scale,
    );
    st[0] = sts[0].max;
    st[1] = sts[0].sum;
}

/// Where tile tasks write: per-segment partial rows, the output rows (`[num_tokens *
/// num_heads, head_dim]`) and one countdown per (tile, kv_head) group (`plan.group_tasks`).
pub struct TileOutputs<'a> {
    pub partials: DisjointRows<'a>,
    pub out: &'a DisjointRows<'a>,
    pub pending: Vec<AtomicU32>,
}

impl<'a> TileOutputs<'a> {
    pub fn new(
        plan: &AttnPlan,
        partials: &'a mut [f32],
        head_dim: usize,
        out: &'a DisjointRows<'a>,
    ) -> Self {
        TileOutputs {
            partials: DisjointRows::new(partials, head_dim + 2),
            out,
            pending: plan
                .group_tasks
                .iter()
                .map(|&n| AtomicU32::new(n))
                .collect(),
        }
    }
}

/// One read of a segment's positions `from..end` for the rows `rows` of a tile task.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SegmentPass {
    /// Indices into the segment's rows (in position order).
    rows: std::ops::Range<usize>,
    from: usize,
    end: usize,
    /// `num_positions` for the store: its last chunk is read as the rows' own group.
    store_end: usize,
    /// First position of the rows' own group (block K codecs), else `usize::MAX`: tiles from
    /// there on are read as f16 rows, every earlier one as sealed codes.
    own_start: usize,
}

/// How a tile task reads segment `seg_start..` for rows attending `ns[r]` positions each (in
/// position order): one pass, or with a block K codec of `block` tokens, where a row reads its
/// own group's f16 rows and every earlier group's codes, one pass over the positions before
/// the first row's own group for every row, then one per own group over the rest. Every row
/// still reads each position once, in order, as it would alone (so the split changes no bit).
/// Written into `passes` (cleared first): a task reuses one buffer for every segment.
fn segment_passes(
    ns: &[usize],
    seg_start: usize,
    block: Option<usize>,
    passes: &mut Vec<SegmentPass>,
) {
    passes.clear();
    let limit = seg_start + SEGMENT_POSITIONS;
    let end_of = |rows: &[usize]| rows.iter().map(|&n| n.min(limit)).max();
    let Some(seg_end) = end_of(ns) else {
        return;
    };
    let Some(t) = block else {
        passes.push(SegmentPass {
            rows: 0..ns.len(),
            from: seg_start,
            end: seg_end,
            store_end: seg_end,
            own_start: usize::MAX,
        });
        return;
    };
    debug_assert!(
        ns.windows(2).all(|w| w[0] <= w[1]),
        "rows in position order"
    );
    // A store reads the last chunk it visits as the rows' own group: a pass that ends at a
    // group boundary before its queries reads one position more (the next group, not used).
    let store_end = |end: usize, query_end: usize| {
        if end < query_end && end.is_multiple_of(t) {
            end + 1
        } else {
            query_end
        }
    };
    let own = |n: usize| (n - 1) / t * t;
    let first_own = own(ns[0]);
    // Passes part at a tile start, so every row's tiles are those it reads alone (groups
    // smaller than a tile share one).
    let split = (first_own / TILE_POSITIONS * TILE_POSITIONS).max(seg_start);
    let shared_end = seg_end.min(split);
    if shared_end > seg_start {
        passes.push(SegmentPass {
            rows: 0..ns.len(),
            from: seg_start,
            end: shared_end,
            store_end: store_end(shared_end, ns[ns.len() - 1]),
            own_start: first_own,
        });
    }
    let mut i = 0;
    while first_own < seg_end && i < ns.len() {
        let g = own(ns[i]);
        let j = i + ns[i..].iter().take_while(|&&n| own(n) == g).count();
        let end = end_of(&ns[i..j]).expect("a non-empty run");
        passes.push(SegmentPass {
            rows: i..j,
            from: split,
            end,
            store_end: store_end(end, ns[j - 1]),
            own_start: g,
        });
        i = j;
    }
}

/// Runs `task` (a `Tile` or a `Shared`): writes its partial rows and, when it is the last task
/// of a group to finish, merges the group's segments into the output rows (in segment order,
/// so the result does not depend on which task merges). A `Tile` belongs to one group; a
/// `Shared` task to each of its tokens' groups.
///
/// # Safety
/// The partial rows and output rows this task owns must not be accessed by any other running
/// task: the plan gives every (token, head, segment) partial row to exactly one task and every
/// tiled (token, head) output row to exactly one group (tested in `attention_plan`), and the
/// group's countdown lets exactly one task merge, after all others have released their writes.
pub unsafe fn run_tile_task(
    inp: &TileInputs<'_>,
    plan: &AttnPlan,
    task: AttnTask,
    outputs: &TileOutputs<'_>,
    scratch: &mut TileScratch,
) {
    match task {
        AttnTask::Tile {
            tokens,
            kv_head,
            segments,
            group,
        } => {
            let toks = TaskTokens::Run(tokens.0, tokens.1);
            // SAFETY: forwarded caller's contract.
            unsafe { attend_task(inp, plan, toks, kv_head, segments, outputs, scratch) };
            // The last task of the group merges (AcqRel: every other task's partial rows,
            // released by its decrement, are visible here).
            if outputs.pending[group as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
                // SAFETY: the countdown reached 0: the group's rows are this task's now.
                unsafe { merge_group(inp, plan, outputs, toks, kv_head) };
            }
        }
        AttnTask::Shared {
            list,
            kv_head,
            segment,
        } => {
            let listed = &plan.shared_tokens[list.0 as usize..list.1 as usize];
            let toks = TaskTokens::Listed(listed);
            let segments = (segment, segment + 1);
            // SAFETY: forwarded caller's contract.
            unsafe { attend_task(inp, plan, toks, kv_head, segments, outputs, scratch) };
            for &t in listed {
                let group =
                    plan.token_group[t as usize].expect("a shared token is tiled") + kv_head;
                if outputs.pending[group as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
                    // SAFETY: as above, for this token's group (its tile is this token alone).
                    unsafe { merge_group(inp, plan, outputs, TaskTokens::Run(t, t + 1), kv_head) };
                }
            }
        }
        AttnTask::Row { .. } => unreachable!("run_tile_task takes tiled tasks"),
    }
}

/// The batch tokens of a tiled task: a run (one sequence's consecutive tokens) or the listed
/// decodes of a shared segment.
#[derive(Clone, Copy)]
enum TaskTokens<'p> {
    Run(u32, u32),
    Listed(&'p [u32]),
}

impl<'p> TaskTokens<'p> {
    /// The tokens, in task order.
    fn iter(self) -> impl Iterator<Item = usize> + Clone + 'p {
        let (run, listed): (std::ops::Range<u32>, &'p [u32]) = match self {
            TaskTokens::Run(a, b) => (a..b, &[]),
            TaskTokens::Listed(l) => (0..0, l),
        };
        run.chain(listed.iter().copied()).map(|t| t as usize)
    }

    fn len(self) -> usize {
        match self {
            TaskTokens::Run(a, b) => (b - a) as usize,
            TaskTokens::Listed(l) => l.len(),
        }
    }

    fn first(self) -> usize {
        self.iter().next().expect("a task has tokens")
    }
}

/// Attends segments `segments.0..segments.1` for every query row of `toks` × the query heads
/// of `kv_head`, writing their partial rows. The K/V are read through the first token's
/// sequence (a shared segment's blocks are every listed sequence's).
///
/// # Safety
/// As [`run_tile_task`]: those partial rows are this task's alone.
#[allow(clippy::too_many_arguments)]
unsafe fn attend_task(
    inp: &TileInputs<'_>,
    plan: &AttnPlan,
    toks: TaskTokens<'_>,
    kv_head: u32,
    segments: (u32, u32),
    outputs: &TileOutputs<'_>,
    scratch: &mut TileScratch,
) {
    let hd = inp.head_dim;
    let slot = inp.slots[toks.first()];
    scratch.size_tiles(hd);
    let TileScratch {
        keys16,
        vals16,
        keys_bf16,
        vals_bf16,
        pair_tile,
        qpairs,
        coded_stage,
        keys32,
        vals32,
        keys_t,
        q16,
        coded,
        qcodes,
        ns,
        passes,
    } = scratch;
    // What runs (`attention_plan`: one choice per task, one per pass), and the kernels' proofs of
    // the features it counts on.
    let features = cpu_features();
    let task_tokens = toks.len();
    let path = TaskPath::choose(inp.kv.codecs(), hd, task_tokens, features, inp.arith);
    let steps = TileSteps {
        path,
        wide: WideTiles::with(features).filter(|_| path.wide),
        narrow: NarrowTiles::with(features).filter(|_| path.narrow),
        features,
        hd,
        scale: inp.scale,
    };
    task_queries(inp, toks, kv_head, path.q_f16, q16);
    let q16: &[f32] = q16;
    prepare_codes(&path, features, hd, q16, coded, qcodes);
    if path.pairs {
        qpairs.resize(q16.len() / 2, 0);
        for (q, out) in q16.chunks_exact(hd).zip(qpairs.chunks_exact_mut(hd / 2)) {
            query_pairs(q, out);
        }
    }
    let mut bufs = TileBuffers {
        keys16,
        vals16,
        keys_bf16,
        vals_bf16,
        pair_tile,
        qpairs,
        coded_stage,
        keys32,
        vals32,
        keys_t,
        coded,
        qcodes,
    };
    // SAFETY: the task's partial rows are its alone (caller's contract); none is borrowed yet.
    unsafe { init_partials(inp, plan, outputs, toks, kv_head, segments) };
    for j in segments.0..segments.1 {
        let seg_start = j as usize * SEGMENT_POSITIONS;
        // SAFETY: the rows of segment `j` of this task's tokens and heads are this task's
        // alone (caller's contract).
        let mut rows = unsafe { segment_rows(inp, plan, outputs, toks, kv_head, j, q16) };
        ns.clear();
        ns.extend(rows.iter().map(|r| r.n));
        segment_passes(ns, seg_start, inp.kv.codecs().k.block_tokens(), passes);
        for pass in passes.iter().cloned() {
            let SegmentPass {
                rows: pass_rows,
                from,
                end: seg_end,
                store_end,
                own_start,
            } = pass;
            let rows = &mut rows[pass_rows];
            let span = PassSpan {
                seg_start,
                seg_end,
                from,
                own_start,
            };
            if steps.path.pairs
                && attend_pairs_in_place(&steps, span, &mut bufs, rows, inp, slot, kv_head as usize)
            {
                continue;
            }
            if steps.path.coded_pairs
                && attend_coded_pairs_in_place(
                    &steps,
                    span,
                    &mut bufs,
                    rows,
                    inp,
                    slot,
                    kv_head as usize,
                )
            {
                continue;
            }
            inp.kv.for_each_chunk_from(
                inp.layer,
                slot,
                kv_head as usize,
                from,
                store_end,
                &mut |start, chunk| attend_chunk(&steps, span, &mut bufs, rows, start, chunk),
            );
        }
    }
}

/// What a task's tiles are attended with: its path (`attention_plan`) and the kernels' proofs of the
/// features that path counts on.
struct TileSteps {
    path: TaskPath,
    wide: Option<WideTiles>,
    narrow: Option<NarrowTiles>,
    features: CpuFeatures,
    hd: usize,
    scale: f32,
}

/// Where a pass reads: positions `from..end` of the segment starting at `seg_start`; tiles that
/// end at or before `own_start` are sealed (before the pass's own block-codec group).
#[derive(Clone, Copy)]
struct PassSpan {
    seg_start: usize,
    seg_end: usize,
    from: usize,
    own_start: usize,
}

/// The task's tile buffers (split from [`TileScratch`], whose query rows the pass's rows borrow).
struct TileBuffers<'s> {
    keys16: &'s mut [f16],
    vals16: &'s mut [f16],
    keys_bf16: &'s mut [bf16],
    vals_bf16: &'s mut [bf16],
    pair_tile: &'s mut PairTile,
    qpairs: &'s [u32],
    coded_stage: &'s mut CodedPairStage,
    keys32: &'s mut [f32],
    vals32: &'s mut [f32],
    keys_t: &'s mut [f32],
    coded: &'s mut CodedTile,
    qcodes: &'s mut QueryCodes,
}

/// One chunk of K/V (`start..`) for a pass's `rows`: every tile piece it holds is read (in
/// place, copied, widened, transposed or kept as codes, as the path says) and each tile it
/// completes runs its tile step.
// Inlined into the task's chunk loop, as the closure it was (it runs per chunk, piece and tile).
#[inline(always)]
fn attend_chunk(
    steps: &TileSteps,
    span: PassSpan,
    bufs: &mut TileBuffers<'_>,
    rows: &mut [Row<'_>],
    start: usize,
    chunk: KvChunk<'_>,
) {
    let (hd, scale, features, path) = (steps.hd, steps.scale, steps.features, &steps.path);
    let PassSpan {
        seg_start,
        seg_end,
        from,
        own_start,
    } = span;
    let (k, v, coded_kv) = match chunk {
        KvChunk::F16 { k, v } => (k, v, None),
        KvChunk::Encoded { k: ek, v: ev } => (&[][..], &[][..], Some((ek, ev))),
        KvChunk::F32 { .. } => unreachable!("the plan never tiles f32 K/V stores"),
    };
    let chunk_end = start + chunk.num_positions(hd);
    if let (true, Some(kv)) = (path.pairs, coded_kv) {
        attend_pairs(steps, span, bufs, rows, start, chunk_end, kv);
        return;
    }
    if let (true, Some(kv)) = (path.coded_pairs, coded_kv) {
        attend_coded_pairs(steps, span, bufs, rows, start, chunk_end, kv);
        return;
    }
    // The pass's choice (`attention_plan::TaskPath::pass`): widen the tile or not, and which transposed step.
    let pass = path.pass(rows.len(), hd);
    let widen = pass.widen;
    let transposed = match pass.transposed {
        Some(Transposed::Wide) => steps.wide.map(TransposedTiles::Wide),
        Some(Transposed::Narrow) => steps.narrow.map(TransposedTiles::Narrow),
        None => None,
    };
    let narrow_channels = pass.narrow_channels;
    let mut a = start.max(from);
    while a < chunk_end.min(seg_end) {
        let tile_start = seg_start + (a - seg_start) / TILE_POSITIONS * TILE_POSITIONS;
        let tile_end = (tile_start + TILE_POSITIONS).min(seg_end);
        // The kernel reads whole groups of 8 key rows (the extra ones masked).
        let read_end = tile_start + (tile_end - tile_start).div_ceil(8) * 8;
        if !widen && coded_kv.is_none() && a == tile_start && read_end <= chunk_end {
            // The whole tile lies in this chunk: read it in place.
            let (ks, vs) = (&k[(a - start) * hd..], &v[(a - start) * hd..]);
            update_rows(&mut *rows, hd, ks, vs, tile_start, tile_end, scale);
            a = tile_end;
            continue;
        }
        let b = chunk_end.min(tile_end);
        let (src, dst) = (
            (a - start) * hd..(b - start) * hd,
            (a - tile_start) * hd..(b - tile_start) * hd,
        );
        let (first, n) = (a - start, b - a);
        #[cfg(target_arch = "x86_64")]
        if let (true, Some((ek, ev))) = (path.fuse_channels, coded_kv) {
            let sealed = tile_start + TILE_POSITIONS <= own_start;
            if sealed && a == tile_start && n == TILE_POSITIONS {
                let k_run = ek.skip_rows(first).take_rows(n);
                debug_assert_eq!(KeyCodes::of(ek.kind(), hd), path.key_codes_any);
                bufs.coded.load_channel_params(&k_run);
                let v_run = ev.skip_rows(first).take_rows(n);
                // The next tile's V codes, fetched while this one is scored (its
                // sealed K group is the next block's, elsewhere in the pool).
                let vb = v_run.bytes();
                prefetch_l1(vb.as_ptr().wrapping_add(vb.len()), vb.len());
                update_rows_channel_codes(
                    features, &mut *rows, hd, bufs.coded, &k_run, &v_run, tile_start, tile_end,
                    scale,
                );
                a = b;
                continue;
            }
        }
        if let (false, Some(RowCodec::Fp8), Some((ek, ev))) = (widen, path.row_codec, coded_kv) {
            decode_rows(
                &ek.skip_rows(first).take_rows(n),
                &mut bufs.keys32[dst.clone()],
            );
            decode_rows(&ev.skip_rows(first).take_rows(n), &mut bufs.vals32[dst]);
            a = b;
            if a == tile_end {
                let (ks, vs) = (&*bufs.keys32, &*bufs.vals32);
                update_rows(&mut *rows, hd, ks, vs, tile_start, tile_end, scale);
            }
            continue;
        }
        let coded_tile = path
            .key_codes
            .filter(|_| tile_start + TILE_POSITIONS <= own_start);
        let piece = Piece {
            first,
            n,
            at: a - tile_start,
            whole: a == tile_start && b == tile_end,
            src,
            dst,
        };
        let v_codes = load_piece(
            steps,
            bufs,
            &piece,
            coded_tile,
            coded_kv,
            (k, v),
            (widen, transposed.is_some(), narrow_channels),
        );
        a = b;
        if a == tile_end {
            tile_step(
                steps, bufs, rows, coded_tile, v_codes, widen, transposed, tile_start, tile_end,
            );
        }
    }
}

/// [`attend_chunk`] for bf16 K/V (`kv`), in the bf16-pair arithmetic: each tile's rows are
/// read as stored (in place when the chunk holds the whole tile, else gathered from the chunks
/// that hold its pieces), staged once into the pair layouts and attended by every row of the
/// pass, in blocks.
fn attend_pairs(
    steps: &TileSteps,
    span: PassSpan,
    bufs: &mut TileBuffers<'_>,
    rows: &mut [Row<'_>],
    start: usize,
    chunk_end: usize,
    (ek, ev): (quant::EncodedRows<'_>, quant::EncodedRows<'_>),
) {
    let hd = steps.hd;
    let mut a = start.max(span.from);
    while a < chunk_end.min(span.seg_end) {
        let tile_start =
            span.seg_start + (a - span.seg_start) / PAIR_TILE_POSITIONS * PAIR_TILE_POSITIONS;
        let tile_end = (tile_start + PAIR_TILE_POSITIONS).min(span.seg_end);
        let half = (a - tile_start) / PAIR_HALF_POSITIONS;
        let half_start = tile_start + half * PAIR_HALF_POSITIONS;
        let half_end = (half_start + PAIR_HALF_POSITIONS).min(tile_end);
        let b = chunk_end.min(half_end);
        let (first, n) = (a - start, b - a);
        let (ks, vs) = (
            ek.skip_rows(first).take_rows(n),
            ev.skip_rows(first).take_rows(n),
        );
        let in_place = if a == half_start && b == half_end {
            as_bf16(ks.bytes()).zip(as_bf16(vs.bytes()))
        } else {
            None
        };
        if let Some((k, v)) = in_place {
            bufs.pair_tile.stage_half(half, k, v, n);
        } else {
            let dst = (a - tile_start) * hd..(b - tile_start) * hd;
            bf16_rows_into(&ks, &mut bufs.keys_bf16[dst.clone()]);
            bf16_rows_into(&vs, &mut bufs.vals_bf16[dst]);
            if b == half_end {
                let m = half_end - half_start;
                let rows_of = (half_start - tile_start) * hd..(half_end - tile_start) * hd;
                bufs.pair_tile.stage_half(
                    half,
                    &bufs.keys_bf16[rows_of.clone()],
                    &bufs.vals_bf16[rows_of],
                    m,
                );
            }
        }
        a = b;
        if a == tile_end {
            if half == 0 {
                // A last tile of at most 16 positions: its second half holds zeros.
                bufs.pair_tile.stage_half(1, &[], &[], 0);
            }
            pairs_step(
                steps,
                bufs.qpairs,
                bufs.pair_tile.view(),
                rows,
                tile_start,
                tile_end,
            );
        }
    }
}

/// Groups of the pair layout a segment pass reads at most (one per 16 positions).
const PASS_GROUPS: usize = SEGMENT_POSITIONS / PAIR_HALF_POSITIONS;

/// A store's group of 16 positions read in place, in either pair layout.
trait InPlaceGroup: Copy {
    /// Whether its words lie right after `prev`'s (a stream the hardware prefetcher follows).
    fn follows(&self, prev: &Self) -> bool;
    /// Asks the CPU to bring its words into cache; no effect on any result.
    fn prefetch(&self);
}

impl InPlaceGroup for PairHalf<'_> {
    fn follows(&self, prev: &Self) -> bool {
        PairHalf::follows(self, prev)
    }
    fn prefetch(&self) {
        PairHalf::prefetch(self)
    }
}

impl InPlaceGroup for CodedPairHalf<'_> {
    fn follows(&self, prev: &Self) -> bool {
        CodedPairHalf::follows(self, prev)
    }
    fn prefetch(&self) {
        CodedPairHalf::prefetch(self)
    }
}

/// The groups a segment pass (`from..seg_end`, `from` a tile's start) reads, every one held in
/// place by the store.
struct PassGroups<G> {
    from: usize,
    count: usize,
    groups: [Option<G>; PASS_GROUPS],
}

impl<G: InPlaceGroup> PassGroups<G> {
    /// The pass's groups, `fill(from, out)` the store's groups from `from` on
    /// (`KvStore::pair_groups`: one call per pass); `None` where the pass does not start at a
    /// tile or the store does not hold every group in place.
    fn of(
        span: PassSpan,
        fill: impl FnOnce(usize, &mut [Option<G>]) -> bool,
    ) -> Option<PassGroups<G>> {
        let PassSpan { from, seg_end, .. } = span;
        if !from.is_multiple_of(PAIR_TILE_POSITIONS) || seg_end <= from {
            return None;
        }
        let count = (seg_end - from).div_ceil(PAIR_HALF_POSITIONS);
        if count > PASS_GROUPS {
            return None;
        }
        let mut groups = [None; PASS_GROUPS];
        if !fill(from, &mut groups[..count]) {
            return None;
        }
        Some(PassGroups {
            from,
            count,
            groups,
        })
    }

    /// The pass's tiles `(start, end)` up to `seg_end`.
    fn tiles(&self, seg_end: usize) -> impl Iterator<Item = (usize, usize)> {
        (self.from..seg_end)
            .step_by(PAIR_TILE_POSITIONS)
            .map(move |t| (t, (t + PAIR_TILE_POSITIONS).min(seg_end)))
    }

    /// Half `h` of the tile `tile_start..tile_end`: its group (`None` past the pass) and the
    /// positions the pass reads from it.
    fn half(&self, tile_start: usize, tile_end: usize, h: usize) -> (Option<G>, usize) {
        let half_start = tile_start + h * PAIR_HALF_POSITIONS;
        let n = tile_end.saturating_sub(half_start).min(PAIR_HALF_POSITIONS);
        (
            self.groups[(half_start - self.from) / PAIR_HALF_POSITIONS],
            n,
        )
    }

    /// The pass's first tiles every row sees whole (rows attending `fewest` positions or more),
    /// each `make(first half, second half)` — both groups in place — in a stack array with
    /// their count; `None` when there is none.
    fn whole_tiles<T: Copy>(
        &self,
        fewest: usize,
        seg_end: usize,
        make: impl Fn(G, G) -> T,
    ) -> Option<([T; PASS_GROUPS / 2], usize)> {
        let count = fewest.min(seg_end).saturating_sub(self.from) / PAIR_TILE_POSITIONS;
        let tile = |i: usize| match (self.groups[2 * i], self.groups[2 * i + 1]) {
            (Some(a), Some(b)) => make(a, b),
            _ => unreachable!("a whole tile's groups are the pass's"),
        };
        if count == 0 {
            return None;
        }
        let mut tiles = [tile(0); PASS_GROUPS / 2];
        for (i, t) in tiles.iter_mut().enumerate().take(count).skip(1) {
            *t = tile(i);
        }
        Some((tiles, count))
    }

    /// Requests the next tile's groups where they jump away from the ones before them (blocks
    /// spread over the pool), as the chunk reader does for blocks.
    fn prefetch_after(&self, tile_start: usize) {
        let next = (tile_start + PAIR_TILE_POSITIONS - self.from) / PAIR_HALF_POSITIONS;
        for g in next..(next + 2).min(self.count) {
            if let (Some(prev), Some(group)) = (self.groups[g - 1], self.groups[g]) {
                if !group.follows(&prev) {
                    group.prefetch();
                }
            }
        }
    }
}

/// A pass over bf16 K/V kept in the pair layout (`KvStore::pair_group`): every whole group of
/// 16 positions is attended in place — no copy, no transpose — and a group the pass reads in
/// part (the sequence's last positions) is staged from its rows. The same words, so the same
/// bits, as staging every tile ([`attend_pairs`]). `false` (nothing done) where the store
/// does not keep every group of the pass in that layout.
#[allow(clippy::too_many_arguments)]
fn attend_pairs_in_place(
    steps: &TileSteps,
    span: PassSpan,
    bufs: &mut TileBuffers<'_>,
    rows: &mut [Row<'_>],
    inp: &TileInputs<'_>,
    slot: SeqSlot,
    kv_head: usize,
) -> bool {
    let Some(groups) = PassGroups::of(span, |from, out| {
        inp.kv.pair_groups(inp.layer, slot, kv_head, from, out)
    }) else {
        return false;
    };
    let (hd, features, scale) = (steps.hd, steps.features, steps.scale);
    let qpairs = bufs.qpairs;
    let half = hd / 2;
    let mut pass_rows = PairPassRows::new(rows, hd, |idx| &qpairs[idx * half..(idx + 1) * half]);
    // As the coded pass: whole tiles in one pipelined call, the rest one at a time.
    let mut whole = 0;
    let fewest = pass_rows.fewest_positions();
    if let Some((tiles, count)) =
        groups.whole_tiles(fewest, span.seg_end, |a, b| PairTileRef::new(hd, a, b))
    {
        pass_rows.step_whole(|sts, accs, qs| {
            tiles_update_pairs(features, sts, accs, qs, &tiles[..count], scale)
        });
        whole = count;
    }
    for (tile_start, tile_end) in groups.tiles(span.seg_end).skip(whole) {
        // Per half: read in place (a whole group), or staged (part of one, or past the pass).
        let mut in_place: [Option<PairHalf<'_>>; 2] = [None; 2];
        for (h, view) in in_place.iter_mut().enumerate() {
            match groups.half(tile_start, tile_end, h) {
                (Some(g), PAIR_HALF_POSITIONS) => *view = Some(g),
                (Some(g), n) if n > 0 => bufs.pair_tile.stage_half_from_group(h, g, n),
                _ => bufs.pair_tile.stage_half(h, &[], &[], 0),
            }
        }
        groups.prefetch_after(tile_start);
        let staged = &*bufs.pair_tile;
        let [h0, h1] = [0, 1].map(|h| in_place[h].unwrap_or_else(|| staged.half(h)));
        let tile = PairTileRef::new(hd, h0, h1);
        pass_rows.step(tile_start, tile_end, |sts, accs, qs, valids| {
            tile_update_pairs(features, sts, accs, qs, valids, tile, scale)
        });
    }
    pass_rows.finish();
    true
}

/// [`attend_pairs_in_place`] for `int8` K with bf16 V kept in the coded pair layout
/// (`KvStore::coded_pair_group`), in the int8-scored pair arithmetic: whole groups read in
/// place, a group the pass reads in part staged from its positions. The same words as
/// staging every tile from the codecs' rows ([`attend_coded_pairs`]), so the same bits.
/// `false` (nothing done) where the store does not keep every group of the pass in that layout.
#[allow(clippy::too_many_arguments)]
fn attend_coded_pairs_in_place(
    steps: &TileSteps,
    span: PassSpan,
    bufs: &mut TileBuffers<'_>,
    rows: &mut [Row<'_>],
    inp: &TileInputs<'_>,
    slot: SeqSlot,
    kv_head: usize,
) -> bool {
    let Some(groups) = PassGroups::of(span, |from, out| {
        inp.kv
            .coded_pair_groups(inp.layer, slot, kv_head, from, out)
    }) else {
        return false;
    };
    let (hd, features, scale) = (steps.hd, steps.features, steps.scale);
    let qcodes = &*bufs.qcodes;
    let mut pass_rows = PairPassRows::new(rows, hd, |idx| qcodes.row(idx));
    // The tiles every row sees whole (a decode's all but its last, a prefill's before its
    // diagonal) run in one pipelined call; the rest one tile at a time.
    let mut whole = 0;
    let fewest = pass_rows.fewest_positions();
    if let Some((tiles, count)) =
        groups.whole_tiles(fewest, span.seg_end, |a, b| coded_pair_tile(hd, [a, b]))
    {
        pass_rows.step_whole(|sts, accs, qs| {
            tiles_update_pairs_coded(features, sts, accs, qs, &tiles[..count], scale)
        });
        whole = count;
    }
    for (tile_start, tile_end) in groups.tiles(span.seg_end).skip(whole) {
        // Per half: read in place (a whole group), or staged (part of one, or past the pass).
        let mut in_place: [Option<CodedPairHalf<'_>>; 2] = [None; 2];
        for (h, view) in in_place.iter_mut().enumerate() {
            match groups.half(tile_start, tile_end, h) {
                (Some(g), PAIR_HALF_POSITIONS) => *view = Some(g),
                (Some(g), n) if n > 0 => bufs.coded_stage.stage_from_group(h, g, n),
                _ => bufs.coded_stage.clear_half(h),
            }
        }
        groups.prefetch_after(tile_start);
        let staged = &*bufs.coded_stage;
        let halves = [0, 1].map(|h| in_place[h].unwrap_or_else(|| staged.half(h)));
        let tile = coded_pair_tile(hd, halves);
        pass_rows.step(tile_start, tile_end, |sts, accs, qs, valids| {
            tile_update_pairs_coded(features, sts, accs, qs, valids, tile, scale)
        });
    }
    pass_rows.finish();
    true
}

/// [`attend_chunk`] for `int8` K with bf16 V (`kv`) in the int8-scored pair arithmetic: each
/// half tile is staged from the codecs' rows (a half starts zeroed, so positions past the
/// pass's hold zeros, as staged partial groups do) and every tile is attended by the pass's
/// rows, in blocks.
fn attend_coded_pairs(
    steps: &TileSteps,
    span: PassSpan,
    bufs: &mut TileBuffers<'_>,
    rows: &mut [Row<'_>],
    start: usize,
    chunk_end: usize,
    (ek, ev): (quant::EncodedRows<'_>, quant::EncodedRows<'_>),
) {
    let hd = steps.hd;
    let (kr, vr) = (ek.row_bytes(), ev.row_bytes());
    let mut v_row = [bf16::ZERO; coded_pair_layout::MAX_HEAD_DIM];
    let v = &mut v_row[..hd];
    let mut a = start.max(span.from);
    while a < chunk_end.min(span.seg_end) {
        let tile_start =
            span.seg_start + (a - span.seg_start) / PAIR_TILE_POSITIONS * PAIR_TILE_POSITIONS;
        let tile_end = (tile_start + PAIR_TILE_POSITIONS).min(span.seg_end);
        let half = (a - tile_start) / PAIR_HALF_POSITIONS;
        let half_start = tile_start + half * PAIR_HALF_POSITIONS;
        let half_end = (half_start + PAIR_HALF_POSITIONS).min(tile_end);
        if a == half_start {
            bufs.coded_stage.clear_half(half);
        }
        let b = chunk_end.min(half_end);
        let (kb, vb) = (ek.bytes(), ev.bytes());
        for p in a..b {
            let r = p - start;
            for (x, pair) in v.iter_mut().zip(vb[r * vr..(r + 1) * vr].chunks_exact(2)) {
                *x = bf16::from_le_bytes([pair[0], pair[1]]);
            }
            let k_row = &kb[r * kr..(r + 1) * kr];
            bufs.coded_stage.write_row(half, p - half_start, k_row, v);
        }
        a = b;
        if a == tile_end {
            if half == 0 {
                // A last tile of at most 16 positions: its second half holds zeros.
                bufs.coded_stage.clear_half(1);
            }
            let staged = &*bufs.coded_stage;
            let tile = coded_pair_tile(hd, [staged.half(0), staged.half(1)]);
            coded_pairs_step(steps, bufs.qcodes, tile, rows, tile_start, tile_end);
        }
    }
}

/// The int8-scored pair step of a staged tile (`tile_start..tile_end`) for the rows that
/// reach into it, in blocks.
fn coded_pairs_step(
    steps: &TileSteps,
    qcodes: &QueryCodes,
    tile: CodedPairTile<'_>,
    rows: &mut [Row<'_>],
    tile_start: usize,
    tile_end: usize,
) {
    let (hd, features, scale) = (steps.hd, steps.features, steps.scale);
    let query = |row: &Row<'_>| qcodes.row(row.idx);
    let step = |sts: &mut [TileSoftmax],
                accs: &mut [&mut [f32]],
                qs: &[QueryRef<'_>],
                valids: &[usize]| {
        tile_update_pairs_coded(features, sts, accs, qs, valids, tile, scale)
    };
    let empty = QueryRef::EMPTY;
    if rows.len() <= FEW_PAIR_ROWS {
        for_live_blocks::<FEW_PAIR_ROWS, _>(rows, hd, tile_start, tile_end, empty, query, step);
    } else {
        for_live_blocks::<WIDE_BLOCK_ROWS, _>(rows, hd, tile_start, tile_end, empty, query, step);
    }
}

/// A pass's rows as the bf16-pair step takes them, gathered once per pass rather than per
/// tile: softmax states, accumulators and queries, ordered by position count, most first, so
/// the rows that reach into any tile are a prefix (the order of rows in a step changes no
/// bit: each row's arithmetic is its own). [`PairPassRows::finish`] writes the states back.
struct PairPassRows<'r, Q> {
    sts: Vec<TileSoftmax>,
    accs: Vec<&'r mut [f32]>,
    /// Each row's `[max, sum]` in its partial row.
    states: Vec<&'r mut [f32]>,
    qs: Vec<Q>,
    /// Position counts, most first.
    ns: Vec<usize>,
    valids: Vec<usize>,
}

impl<'r, Q: Copy> PairPassRows<'r, Q> {
    /// The pass's `rows` (heads of `hd`), each with the query `query(row index)`.
    fn new(rows: &'r mut [Row<'_>], hd: usize, query: impl Fn(usize) -> Q) -> PairPassRows<'r, Q> {
        // A run's rows come in position order: taken backwards they are already sorted (the
        // stable sort then only checks), a shared segment's decodes in any order.
        let mut order: Vec<&'r mut Row<'_>> = rows.iter_mut().rev().collect();
        order.sort_by_key(|row| std::cmp::Reverse(row.n));
        let count = order.len();
        let mut out = PairPassRows {
            sts: Vec::with_capacity(count),
            accs: Vec::with_capacity(count),
            states: Vec::with_capacity(count),
            qs: Vec::with_capacity(count),
            ns: Vec::with_capacity(count),
            valids: Vec::with_capacity(count),
        };
        for row in order {
            out.qs.push(query(row.idx));
            out.ns.push(row.n);
            let (acc, st) = row.partial.split_at_mut(hd);
            out.sts.push(TileSoftmax {
                max: st[0],
                sum: st[1],
            });
            out.accs.push(acc);
            out.states.push(st);
        }
        out
    }

    /// The tile step `kernel` (states, accumulators, queries, valid positions) of a tile
    /// (`tile_start..tile_end`) for every row that reaches into it, in one call.
    fn step(
        &mut self,
        tile_start: usize,
        tile_end: usize,
        kernel: impl FnOnce(&mut [TileSoftmax], &mut [&mut [f32]], &[Q], &[usize]),
    ) {
        let live = self.ns.partition_point(|&n| n > tile_start);
        if live == 0 {
            return;
        }
        self.valids.clear();
        self.valids.extend(
            self.ns[..live]
                .iter()
                .map(|&n| n.min(tile_end) - tile_start),
        );
        kernel(
            &mut self.sts[..live],
            &mut self.accs[..live],
            &self.qs[..live],
            &self.valids,
        );
    }

    /// The fewest positions a row of the pass attends (every row sees every tile up to there).
    fn fewest_positions(&self) -> usize {
        self.ns.last().copied().unwrap_or(0)
    }

    /// `kernel` (states, accumulators, queries) over tiles every row sees whole.
    fn step_whole(&mut self, kernel: impl FnOnce(&mut [TileSoftmax], &mut [&mut [f32]], &[Q])) {
        kernel(&mut self.sts, &mut self.accs, &self.qs);
    }

    /// Writes every row's softmax state back into its partial row.
    fn finish(self) {
        for (st, sm) in self.states.into_iter().zip(self.sts) {
            st[0] = sm.max;
            st[1] = sm.sum;
        }
    }
}

/// The bf16-pair step of a tile (`tile_start..tile_end`: staged, or groups read in place) for
/// the rows that reach into it, in blocks of [`WIDE_BLOCK_ROWS`].
fn pairs_step(
    steps: &TileSteps,
    qpairs: &[u32],
    tile: PairTileRef<'_>,
    rows: &mut [Row<'_>],
    tile_start: usize,
    tile_end: usize,
) {
    let (hd, features, scale) = (steps.hd, steps.features, steps.scale);
    let half = hd / 2;
    let empty: &[u32] = &[];
    let query = |row: &Row<'_>| &qpairs[row.idx * half..(row.idx + 1) * half];
    let step =
        |sts: &mut [TileSoftmax], accs: &mut [&mut [f32]], qs: &[&[u32]], valids: &[usize]| {
            tile_update_pairs(features, sts, accs, qs, valids, tile, scale)
        };
    // A decode's few rows: one small block (its per-tile bookkeeping arrays, zeroed per
    // tile, a quarter of the size); the grouping changes no bit.
    if rows.len() <= FEW_PAIR_ROWS {
        for_live_blocks::<FEW_PAIR_ROWS, _>(rows, hd, tile_start, tile_end, empty, query, step);
    } else {
        for_live_blocks::<WIDE_BLOCK_ROWS, _>(rows, hd, tile_start, tile_end, empty, query, step);
    }
}

/// Rows up to which [`pairs_step`] hands a tile's rows over in one small block (a decode's
/// GQA group, or two).
const FEW_PAIR_ROWS: usize = 6;

/// A piece of a tile held by one K/V chunk: rows `first..first + n` of the chunk, landing at
/// tile position `at` (`whole`: the piece is the whole tile); `src` / `dst` are its element
/// ranges in the chunk and in the tile buffers.
struct Piece {
    first: usize,
    n: usize,
    at: usize,
    whole: bool,
    src: std::ops::Range<usize>,
    dst: std::ops::Range<usize>,
}

/// Reads a piece into the tile buffers as the pass's path says — K as codes (sealed tiles of a
/// codec scored from codes), sealed `int4c` K straight into the AVX2 transposed tile, decoded,
/// transposed, widened, or f16 as stored — and returns V's codes when a whole tile of few rows
/// reads them in registers. `(widen, transposed, narrow_channels)` is the pass's choice.
#[inline(always)]
fn load_piece<'c>(
    steps: &TileSteps,
    bufs: &mut TileBuffers<'_>,
    piece: &Piece,
    coded_tile: Option<KeyCodes>,
    coded_kv: Option<(quant::EncodedRows<'c>, quant::EncodedRows<'c>)>,
    (k, v): (&[f16], &[f16]),
    (widen, transposed, narrow_channels): (bool, bool, bool),
) -> Option<quant::EncodedRows<'c>> {
    let (hd, features, path) = (steps.hd, steps.features, &steps.path);
    let Piece {
        first,
        n,
        at,
        whole,
        ref src,
        ref dst,
    } = *piece;
    let (src, dst) = (src.clone(), dst.clone());
    if let (Some(keys), Some((ek, ev))) = (coded_tile, coded_kv) {
        debug_assert_eq!(KeyCodes::of(ek.kind(), hd), Some(keys));
        let run = ek.skip_rows(first).take_rows(n);
        match keys {
            KeyCodes::Rows => bufs.coded.load_rows(features, &run, at),
            KeyCodes::Channels => bufs.coded.load_channels(features, &run, at),
        }
        let v_run = ev.skip_rows(first).take_rows(n);
        if path.fuse_values && whole {
            // A decode streams the run once: the next tile's codes (K and
            // V rows are runs of whole rows) are fetched while this one is
            // scored.
            for rows in [&run, &v_run] {
                let bytes = rows.bytes();
                prefetch_l1(bytes.as_ptr().wrapping_add(bytes.len()), bytes.len());
            }
            // A whole tile of few rows: V decoded in registers (same values).
            return Some(v_run);
        } else {
            decode_rows(&v_run, &mut bufs.vals32[dst]);
        }
    } else if let Some((ek, ev)) = coded_kv.filter(|(ek, _)| {
        narrow_channels
            && n.is_multiple_of(8)
            && KeyCodes::of(ek.kind(), hd) == Some(KeyCodes::Channels)
    }) {
        // Sealed `int4c` rows for the AVX2 transposed step: decoded straight
        // into the transposed K tile (the values, so the bits, of decoding
        // then transposing them).
        let run = ek.skip_rows(first).take_rows(n);
        bufs.coded
            .widen_channel_rows(features, &run, at, bufs.keys_t);
        decode_rows(&ev.skip_rows(first).take_rows(n), &mut bufs.vals32[dst]);
    } else if let Some((ek, ev)) = coded_kv {
        decode_rows(
            &ek.skip_rows(first).take_rows(n),
            &mut bufs.keys32[dst.clone()],
        );
        decode_rows(
            &ev.skip_rows(first).take_rows(n),
            &mut bufs.vals32[dst.clone()],
        );
        if transposed {
            transpose_keys(&bufs.keys32[dst], n, hd, bufs.keys_t, at);
        }
    } else if widen && transposed {
        // K straight from f16 into the transposed tile; V widened.
        transpose_keys(&k[src.clone()], n, hd, bufs.keys_t, at);
        widen_f16(&v[src], &mut bufs.vals32[dst]);
    } else if widen {
        widen_f16(&k[src.clone()], &mut bufs.keys32[dst.clone()]);
        widen_f16(&v[src], &mut bufs.vals32[dst]);
    } else {
        bufs.keys16[dst.clone()].copy_from_slice(&k[src.clone()]);
        bufs.vals16[dst].copy_from_slice(&v[src]);
    }
    None
}

/// The tile step of a completed tile (`tile_start..tile_end`) for a pass's rows: the last rung
/// of the path (`TaskPath::tile_step` names each) — K scored from its codes, the transposed
/// step, or the row kernels over widened or f16 tiles.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tile_step(
    steps: &TileSteps,
    bufs: &mut TileBuffers<'_>,
    rows: &mut [Row<'_>],
    coded_tile: Option<KeyCodes>,
    v_codes: Option<quant::EncodedRows<'_>>,
    widen: bool,
    transposed: Option<TransposedTiles>,
    tile_start: usize,
    tile_end: usize,
) {
    let (hd, scale, features) = (steps.hd, steps.scale, steps.features);
    if let (Some(KeyCodes::Channels), Some(proof)) = (coded_tile, steps.wide) {
        bufs.coded.widen_channels(features, bufs.keys_t);
        match v_codes {
            #[cfg(target_arch = "x86_64")]
            Some(v) => update_rows_wide_codes(
                proof,
                &mut *rows,
                hd,
                bufs.keys_t,
                &v,
                tile_start,
                tile_end,
                scale,
            ),
            _ => update_rows_transposed(
                TransposedTiles::Wide(proof),
                &mut *rows,
                hd,
                bufs.keys_t,
                bufs.vals32,
                tile_start,
                tile_end,
                scale,
            ),
        }
    } else if let Some(keys) = coded_tile {
        let vals = match v_codes {
            Some(v) => TileValues::Codes(v),
            None => TileValues::Decoded(bufs.vals32),
        };
        update_rows_coded(
            features,
            keys,
            &mut *rows,
            hd,
            bufs.coded,
            bufs.qcodes,
            vals,
            tile_start,
            tile_end,
            scale,
        );
    } else if let (true, Some(step)) = (widen, transposed) {
        update_rows_transposed(
            step,
            &mut *rows,
            hd,
            bufs.keys_t,
            bufs.vals32,
            tile_start,
            tile_end,
            scale,
        );
    } else if widen {
        update_rows(
            &mut *rows,
            hd,
            bufs.keys32,
            bufs.vals32,
            tile_start,
            tile_end,
            scale,
        );
    } else {
        update_rows(
            &mut *rows,
            hd,
            bufs.keys16,
            bufs.vals16,
            tile_start,
            tile_end,
            scale,
        );
    }
}

/// The task's query rows (`[tokens, group heads, head_dim]`), rounded to f16 once when `q_f16`.
fn task_queries(
    inp: &TileInputs<'_>,
    toks: TaskTokens<'_>,
    kv_head: u32,
    q_f16: bool,
    q16: &mut Vec<f32>,
) {
    let hd = inp.head_dim;
    let group = inp.num_heads / inp.num_kv_heads;
    let qd = inp.num_heads * hd;
    q16.clear();
    for t in toks.iter() {
        let first = t * qd + kv_head as usize * group * hd;
        let rows = &inp.q[first..first + group * hd];
        if q_f16 {
            q16.extend(rows.iter().map(|&x| f16::from_f32(x).to_f32()));
        } else {
            q16.extend_from_slice(rows);
        }
    }
}

/// Readies the code buffers the path uses: the coded K tile and, for `int8` K scored from its
/// codes, every query row quantised once.
fn prepare_codes(
    path: &TaskPath,
    features: CpuFeatures,
    hd: usize,
    q16: &[f32],
    coded: &mut CodedTile,
    qcodes: &mut QueryCodes,
) {
    if path.fuse_channels || path.stage_channels_narrow {
        coded.reset(hd);
    }
    if let Some(keys) = path.key_codes {
        coded.reset(hd);
        if keys == KeyCodes::Rows {
            qcodes.reset(q16.len() / hd, hd);
            for (r, q) in q16.chunks_exact(hd).enumerate() {
                qcodes.prepare_rows(features, r, q);
            }
        }
    }
}

/// The rows of segment `j` for the task's tokens and the heads of `kv_head`'s group, over
/// their partial rows (set to the empty state by [`init_partials`] at the task's start).
///
/// # Safety
/// Those partial rows belong to the calling task alone while the returned rows live.
unsafe fn segment_rows<'a>(
    inp: &TileInputs<'_>,
    plan: &AttnPlan,
    outputs: &'a TileOutputs<'_>,
    toks: TaskTokens<'_>,
    kv_head: u32,
    j: u32,
    q16: &'a [f32],
) -> Vec<Row<'a>> {
    let hd = inp.head_dim;
    let group = inp.num_heads / inp.num_kv_heads;
    let partials = &outputs.partials;
    let mut rows: Vec<Row<'a>> = Vec::with_capacity(toks.len() * group);
    for (i, t) in toks.iter().enumerate() {
        let segs = plan.segments[t];
        if j >= segs {
            continue;
        }
        let base = plan.partial_base[t].expect("tiled token has partial rows") as usize;
        for g in 0..group {
            let head = kv_head as usize * group + g;
            // SAFETY: row (t, head, j) belongs to this task alone (caller's contract); its
            // state was set by `init_partials`.
            let partial = unsafe { partials.row_mut(base + head * segs as usize + j as usize) };
            let at = (i * group + g) * hd;
            rows.push(Row {
                idx: at / hd,
                q: &q16[at..at + hd],
                n: inp.positions[t] as usize + 1,
                partial,
            });
        }
    }
    rows
}

/// Sets every partial row of the task (its tokens × the query heads of `kv_head` × its
/// segments that each token has) to the empty state — accumulator zero, maximum −∞, sum zero —
/// a token's rows of one head at once (they are consecutive: row `base + head · segs + j`):
/// one fill for a head's segments rather than one per row.
///
/// # Safety
/// As [`segment_rows`]: those rows are this task's alone, and no reference to them is live.
unsafe fn init_partials(
    inp: &TileInputs<'_>,
    plan: &AttnPlan,
    outputs: &TileOutputs<'_>,
    toks: TaskTokens<'_>,
    kv_head: u32,
    segments: (u32, u32),
) {
    let hd = inp.head_dim;
    let group = inp.num_heads / inp.num_kv_heads;
    for t in toks.iter() {
        let segs = plan.segments[t];
        let (j0, j1) = (segments.0.min(segs) as usize, segments.1.min(segs) as usize);
        if j0 == j1 {
            continue;
        }
        let base = plan.partial_base[t].expect("tiled token has partial rows") as usize;
        for g in 0..group {
            let first = base + (kv_head as usize * group + g) * segs as usize;
            // SAFETY: rows (t, head, j0..j1) belong to this task alone (caller's contract).
            let rows = unsafe { outputs.partials.rows_mut(first + j0..first + j1) };
            rows.fill(0.0);
            for state in rows.chunks_exact_mut(hd + 2) {
                state[hd] = f32::NEG_INFINITY;
            }
        }
    }
}

/// Merges the group's segment rows into its outputs, in segment order.
///
/// # Safety
/// Every task of the group has finished (its countdown reached 0): the rows are the caller's.
unsafe fn merge_group(
    inp: &TileInputs<'_>,
    plan: &AttnPlan,
    outputs: &TileOutputs<'_>,
    toks: TaskTokens<'_>,
    kv_head: u32,
) {
    let hd = inp.head_dim;
    let group = inp.num_heads / inp.num_kv_heads;
    let partials = &outputs.partials;
    for t in toks.iter() {
        let segs = plan.segments[t] as usize;
        let base = plan.partial_base[t].expect("tiled token has partial rows") as usize;
        for g in 0..group {
            let head = kv_head as usize * group + g;
            // SAFETY: this group's rows are owned by this task now (countdown reached 0).
            let out = unsafe { outputs.out.row_mut(t * inp.num_heads + head) };
            let states = (0..segs).map(|j| {
                // SAFETY: as above; no task writes these rows any more.
                let row = unsafe { partials.row(base + head * segs + j) };
                (
                    TileSoftmax {
                        max: row[hd],
                        sum: row[hd + 1],
                    },
                    &row[..hd],
                )
            });
            merge_segments(states, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{attend_one, AttnScratch};
    use crate::attention_plan::{plan, AttnShape};
    use crate::kv::KvDtype;
    use crate::kv_contiguous::ContiguousKv;
    use rand::{Rng, SeedableRng};

    /// Runs every task of `plan` (serially) and returns `[tokens · heads, hd]` outputs.
    fn run_plan(inp: &TileInputs<'_>, plan: &AttnPlan) -> Vec<f32> {
        let hd = inp.head_dim;
        let mut att = vec![f32::NAN; inp.positions.len() * inp.num_heads * hd];
        let mut partials = vec![0f32; plan.partial_rows * (hd + 2)];
        {
            let rows = DisjointRows::new(&mut att, hd);
            let outputs = TileOutputs::new(plan, &mut partials, hd, &rows);
            let mut scratch = TileScratch::default();
            for &task in &plan.tasks {
                // SAFETY: tasks run one after the other, so no row has two concurrent writers.
                unsafe { run_tile_task(inp, plan, task, &outputs, &mut scratch) };
            }
        }
        att
    }

    /// The plan shape and tile inputs of a one-layer test: `heads` query heads over `kv_heads`
    /// of size `hd`, scale 1/8, in `arith`; the shape's codec flags from the store's codecs.
    fn test_inputs<'a>(
        kv: &'a dyn KvStore,
        q: &'a [f32],
        slots: &'a [SeqSlot],
        positions: &'a [u32],
        (heads, kv_heads, hd): (usize, usize, usize),
        arith: AttnArith,
    ) -> (AttnShape, TileInputs<'a>) {
        let codecs = kv.codecs();
        let shape = AttnShape {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: hd,
            kv_is_f16: codecs == KvDtype::F16,
            kv_encoded: codecs != KvDtype::F16 && codecs != KvDtype::F32,
            arith,
            // One thread: decodes' segments grouped into tasks as far as they go (the tests
            // below compare results, which never depend on the grouping).
            threads: 1,
        };
        let inp = TileInputs {
            kv,
            layer: 0,
            q,
            slots,
            positions,
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim: hd,
            scale: 0.125,
            arith,
        };
        (shape, inp)
    }

    /// A one-layer store of `n` positions in `codecs` whose K and V rows are uniform in
    /// `±k_spread` / `±v_spread` (K then V per position, drawn from `rng` in that order).
    fn random_store(
        rng: &mut impl Rng,
        codecs: KvDtype,
        (kv_heads, hd, n): (usize, usize, usize),
        (k_spread, v_spread): (f32, f32),
    ) -> ContiguousKv {
        let mut kv = ContiguousKv::new(1, 1, kv_heads, hd, n, codecs).unwrap();
        for p in 0..n {
            let k: Vec<f32> = (0..kv_heads * hd)
                .map(|_| rng.gen_range(-k_spread..k_spread))
                .collect();
            let v: Vec<f32> = (0..kv_heads * hd)
                .map(|_| rng.gen_range(-v_spread..v_spread))
                .collect();
            kv.write(0, SeqSlot(0), p, &k, &v).unwrap();
        }
        kv
    }

    /// A store that hands out another store's chunks in pieces of `piece` positions (a paged
    /// pool of small blocks: tiles assembled from several chunks; `usize::MAX`: whole chunks)
    /// and says its slots share positions `0..shared` (a paged pool's shared prefix blocks:
    /// the test fills them alike).
    struct Pieces<'a> {
        inner: &'a ContiguousKv,
        head_dim: usize,
        piece: usize,
        shared: usize,
    }

    impl KvStore for Pieces<'_> {
        fn write(
            &mut self,
            _: usize,
            _: SeqSlot,
            _: usize,
            _: &[f32],
            _: &[f32],
        ) -> Result<(), crate::kv::KvError> {
            unreachable!("read-only test store")
        }
        fn codecs(&self) -> KvDtype {
            self.inner.codecs()
        }
        fn for_each_chunk(
            &self,
            layer: usize,
            slot: SeqSlot,
            kv_head: usize,
            num_positions: usize,
            f: &mut dyn FnMut(usize, KvChunk<'_>),
        ) {
            let hd = self.head_dim;
            self.inner
                .for_each_chunk(layer, slot, kv_head, num_positions, &mut |start, chunk| {
                    let n = chunk.num_positions(hd);
                    if self.piece >= n {
                        f(start, chunk);
                        return;
                    }
                    for at in (0..n).step_by(self.piece) {
                        let m = self.piece.min(n - at);
                        let piece = match chunk.skip_positions(at, hd) {
                            KvChunk::Encoded { k, v } => KvChunk::Encoded {
                                k: k.take_rows(m),
                                v: v.take_rows(m),
                            },
                            KvChunk::F16 { k, v } => KvChunk::F16 {
                                k: &k[..m * hd],
                                v: &v[..m * hd],
                            },
                            KvChunk::F32 { k, v } => KvChunk::F32 {
                                k: &k[..m * hd],
                                v: &v[..m * hd],
                            },
                        };
                        f(start + at, piece);
                    }
                });
        }
        fn shares_positions(
            &self,
            _: SeqSlot,
            _: SeqSlot,
            positions: std::ops::Range<usize>,
        ) -> bool {
            positions.end <= self.shared
        }
    }

    /// Decodes whose segments run grouped into tasks (few threads) get the bits of one task
    /// per segment (many threads), for every arithmetic: the grouping moves work between tasks,
    /// never into another order.
    #[test]
    fn grouping_a_decodes_segments_changes_no_bit() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(31);
        let (heads, kv_heads, hd, n) = (6, 2, 64, 2600);
        for spec in ["f16", "bf16", "k=int8,v=bf16", "int8", "k=int4c,v=int4"] {
            let kv = random_store(
                &mut rng,
                KvDtype::parse(spec).unwrap(),
                (kv_heads, hd, n),
                (2.0, 1.0),
            );
            // Three decodes of one sequence's cache at different depths, as one step.
            let positions: Vec<u32> = vec![2599, 1800, 700];
            let slots = vec![SeqSlot(0); positions.len()];
            let q: Vec<f32> = (0..positions.len() * heads * hd)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            let (shape, inp) = test_inputs(
                &kv,
                &q,
                &slots,
                &positions,
                (heads, kv_heads, hd),
                AttnArith::Tiled,
            );
            let grouped = plan(&shape, &slots, &positions);
            let apart = plan(
                &AttnShape {
                    threads: 64,
                    ..shape
                },
                &slots,
                &positions,
            );
            assert!(
                grouped.tasks.len() < apart.tasks.len(),
                "{spec}: segments grouped"
            );
            let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(run_plan(&inp, &grouped)),
                bits(run_plan(&inp, &apart)),
                "{spec}"
            );
        }
    }

    /// bf16 K/V (the bf16-pair arithmetic) and `int8` K with bf16 V (the int8-scored one) read
    /// from a store whose chunks cut tiles into pieces (staged from rows) give the bits of the
    /// same store read whole (its groups in place), for a prefill run and for each token alone.
    #[test]
    fn pair_tiles_from_pieces_equal_whole_tiles_bitwise() {
        for spec in ["bf16", "k=int8,v=bf16"] {
            pair_tiles_from_pieces(spec);
        }
    }

    fn pair_tiles_from_pieces(spec: &str) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
        let (heads, kv_heads, hd, n) = (6, 2, 64, 560);
        let codecs = KvDtype::parse(spec).unwrap();
        let kv = random_store(&mut rng, codecs, (kv_heads, hd, n), (2.0, 1.0));
        // The whole store is read in place.
        assert!(
            kv.pair_group(0, SeqSlot(0), 1, 32).is_some()
                || kv.coded_pair_group(0, SeqSlot(0), 1, 32).is_some()
        );
        let positions: Vec<u32> = (505..n as u32).collect();
        let slots = vec![SeqSlot(0); positions.len()];
        let q: Vec<f32> = (0..positions.len() * heads * hd)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let (shape, whole) = test_inputs(
            &kv,
            &q,
            &slots,
            &positions,
            (heads, kv_heads, hd),
            AttnArith::Tiled,
        );
        let want = run_plan(&whole, &plan(&shape, &slots, &positions));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let qd = heads * hd;
        for piece in [5, 16, 7] {
            let store = Pieces {
                inner: &kv,
                head_dim: hd,
                piece,
                shared: 0,
            };
            let inp = TileInputs {
                kv: &store,
                ..whole
            };
            let got = run_plan(&inp, &plan(&shape, &slots, &positions));
            assert_eq!(
                bits(&got),
                bits(&want),
                "{spec}, pieces of {piece}: a prefill run"
            );
            for t in [0, 11, positions.len() - 1] {
                let alone = TileInputs {
                    q: &q[t * qd..(t + 1) * qd],
                    slots: &slots[t..t + 1],
                    positions: &positions[t..t + 1],
                    ..inp
                };
                let got = run_plan(&alone, &plan(&shape, &slots[..1], &positions[t..t + 1]));
                assert_eq!(
                    bits(&got),
                    bits(&want[t * qd..(t + 1) * qd]),
                    "{spec}, pieces of {piece}: position {} alone",
                    positions[t]
                );
            }
        }
    }

    /// Decodes of sequences that share a prompt prefix read its segments in shared tasks
    /// (one read for all of them) and get the bits of each decode planned alone, for every
    /// codec family (bf16 pairs, f16 tiles, int8 rows, the per-channel block codec).
    #[test]
    fn shared_prefix_segments_change_no_bit() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(31);
        let (heads, kv_heads, hd, shared) = (6, 2, 64, 1100);
        let lens = [1700usize, 1000, 1600, 1300, 2100];
        let cap = *lens.iter().max().unwrap();
        for codec in ["bf16", "k=int8,v=bf16", "f16", "int8", "k=int4c,v=int4"] {
            let codecs = KvDtype::parse(codec).unwrap();
            let mut kv = ContiguousKv::new(lens.len(), 1, kv_heads, hd, cap, codecs).unwrap();
            let row = |rng: &mut rand_chacha::ChaCha8Rng, spread: f32| -> Vec<f32> {
                (0..kv_heads * hd)
                    .map(|_| rng.gen_range(-spread..spread))
                    .collect()
            };
            for p in 0..cap {
                let (k, v) = (row(&mut rng, 2.0), row(&mut rng, 1.0));
                for (s, &len) in lens.iter().enumerate() {
                    if p < len {
                        let (k, v) = if p < shared {
                            (k.clone(), v.clone())
                        } else {
                            (row(&mut rng, 2.0), row(&mut rng, 1.0))
                        };
                        kv.write(0, SeqSlot(s as u32), p, &k, &v).unwrap();
                    }
                }
            }
            let store = Pieces {
                inner: &kv,
                head_dim: hd,
                piece: usize::MAX,
                shared,
            };
            let slots: Vec<SeqSlot> = (0..lens.len() as u32).map(SeqSlot).collect();
            let positions: Vec<u32> = lens.iter().map(|&n| n as u32 - 1).collect();
            let q: Vec<f32> = (0..lens.len() * heads * hd)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            let (shape, inp) = test_inputs(
                &store,
                &q,
                &slots,
                &positions,
                (heads, kv_heads, hd),
                AttnArith::Tiled,
            );
            let alone = plan(&shape, &slots, &positions);
            let shares = |a: usize, b: usize, j: usize| {
                store.shares_positions(slots[a], slots[b], j * 512..(j + 1) * 512)
            };
            let together =
                crate::attention_plan::plan_without(&shape, &slots, &positions, &[], &shares);
            // Segments 0 and 1 lie in the shared prefix; the 1,000-position decode's last
            // segment is its second (never shared): five decodes share segment 0, four 1.
            let shared_tasks: Vec<_> = together
                .tasks
                .iter()
                .filter_map(|t| match *t {
                    AttnTask::Shared { list, segment, .. } => Some((list.1 - list.0, segment)),
                    _ => None,
                })
                .collect();
            assert_eq!(
                shared_tasks,
                vec![(5, 0), (5, 0), (4, 1), (4, 1)],
                "{codec}: shared tasks (tokens, segment) per KV head"
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&run_plan(&inp, &together)),
                bits(&run_plan(&inp, &alone)),
                "{codec}: shared segments"
            );
        }
    }

    fn segment_passes(ns: &[usize], seg_start: usize, block: Option<usize>) -> Vec<SegmentPass> {
        let mut passes = Vec::new();
        super::segment_passes(ns, seg_start, block, &mut passes);
        passes
    }

    /// The passes of a tile's rows over a segment: one for row codecs; with groups of 16, the
    /// positions before the first row's own group once for every row, then each own group's
    /// rows from there (each row reads every position below its count once, in order, with
    /// its own group last).
    #[test]
    fn segment_passes_split_rows_where_their_own_groups_differ() {
        let pass = |rows, from, end, store_end, own_start| SegmentPass {
            rows,
            from,
            end,
            store_end,
            own_start,
        };
        // Rows attending 501..=531 positions (queries at 500..=530), two heads each.
        let ns: Vec<usize> = (501..=531).flat_map(|n| [n, n]).collect();
        assert_eq!(
            segment_passes(&ns, 0, None),
            vec![pass(0..62, 0, 512, 512, usize::MAX)]
        );
        assert_eq!(
            segment_passes(&ns, 0, Some(16)),
            vec![
                pass(0..62, 0, 496, 497, 496),
                // Own group 496..512: queries 500..=511.
                pass(0..24, 496, 512, 512, 496),
                // Own groups past the segment: 496..512 read as codes, the rest next segment.
                pass(24..56, 496, 512, 513, 512),
                pass(56..62, 496, 512, 513, 528),
            ]
        );
        let tail: Vec<usize> = ns.iter().copied().filter(|&n| n > 512).collect();
        assert_eq!(
            segment_passes(&tail, 512, Some(16)),
            vec![
                pass(0..32, 512, 528, 528, 512),
                pass(32..38, 512, 531, 531, 528)
            ]
        );
        // Every row's own group past the segment: one shared pass that reads no own group.
        assert_eq!(
            segment_passes(&[700, 701, 720], 0, Some(16)),
            vec![pass(0..3, 0, 512, 513, 688)]
        );
        // Groups of 4: the rows part at the tile holding the first row's own group.
        let fours = segment_passes(&ns, 0, Some(4));
        assert_eq!(fours[0], pass(0..62, 0, 496, 497, 500));
        assert_eq!(fours[1], pass(0..8, 496, 504, 504, 500));
        assert_eq!(fours[3], pass(16..24, 496, 512, 512, 508));
        assert_eq!(fours[4], pass(24..32, 496, 512, 513, 512));
        assert!(segment_passes(&[], 0, Some(16)).is_empty());
    }

    #[test]
    fn bf16_bytes_are_read_in_place_when_aligned_and_never_misread() {
        let values: Vec<bf16> = [
            1.5f32,
            -2.0,
            3.25e-3,
            f32::INFINITY,
            -0.0,
            65504.0,
            1e30,
            7.0,
        ]
        .into_iter()
        .map(bf16::from_f32)
        .collect();
        let words: Vec<u16> = values.iter().map(|v| v.to_bits()).collect();
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        // The bytes at the buffer's 2-aligned offset; the view one byte off is misaligned.
        let mut buf = vec![0u8; bytes.len() + 1];
        let at = buf.as_ptr() as usize % 2;
        buf[at..at + bytes.len()].copy_from_slice(&bytes);
        let got = as_bf16(&buf[at..at + bytes.len()]).expect("2-aligned bytes are read in place");
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            words,
            "the values as written"
        );
        let off = 1 - at;
        assert!(
            as_bf16(&buf[off..off + bytes.len()]).is_none(),
            "misaligned: copied instead"
        );
        let mut copied = vec![bf16::ZERO; values.len()];
        for (d, c) in copied.iter_mut().zip(bytes.chunks_exact(2)) {
            *d = bf16::from_bits(u16::from_le_bytes([c[0], c[1]]));
        }
        assert_eq!(copied, got);
    }

    /// Tiles over encoded K/V (every codec family, K and V codecs differing, block K codecs
    /// whose queries read their own group in f16, groups of a tile and smaller) against the
    /// exact per-row regime over the same store: equal to float rounding; and each row's bits
    /// do not depend on the query tile it shares (one token per step vs a run of tokens,
    /// decode split into segments).
    #[test]
    fn encoded_tiles_match_the_exact_regime_and_do_not_depend_on_the_query_tile() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let (heads, kv_heads, hd, n) = (4, 2, 64, 530);
        for spec in [
            "bf16",
            "k=int8,v=bf16",
            "int8",
            "int4",
            "k=int4c,v=int4",
            "k=int4c-t4,v=int8",
            "int4h",
            "fp8",
            "k=int8h,v=int4-g64",
        ] {
            let codecs = KvDtype::parse(spec).unwrap();
            let mut kv = ContiguousKv::new(1, 1, kv_heads, hd, n, codecs).unwrap();
            for p in 0..n {
                let mut k: Vec<f32> = (0..kv_heads * hd)
                    .map(|_| rng.gen_range(-1.0f32..1.0))
                    .collect();
                k[5] += 6.0; // an outlier channel
                let v: Vec<f32> = (0..kv_heads * hd)
                    .map(|_| rng.gen_range(-2.0f32..2.0))
                    .collect();
                kv.write(0, SeqSlot(0), p, &k, &v).unwrap();
            }
            // The queries of positions 500..530 (the last spans 2 segments).
            let positions: Vec<u32> = (500..n as u32).collect();
            let slots = vec![SeqSlot(0); positions.len()];
            let q: Vec<f32> = (0..positions.len() * heads * hd)
                .map(|_| rng.gen_range(-1.0f32..1.0))
                .collect();
            let (shape, inp) = test_inputs(
                &kv,
                &q,
                &slots,
                &positions,
                (heads, kv_heads, hd),
                AttnArith::Row,
            );
            let together = run_plan(&inp, &plan(&shape, &slots, &positions));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            kernels::set_force_portable(true);
            let portable = run_plan(&inp, &plan(&shape, &slots, &positions));
            kernels::set_force_portable(false);
            assert_eq!(
                bits(&together),
                bits(&portable),
                "{spec}: native vs portable"
            );
            let qd = heads * hd;
            for (t, &pos) in positions.iter().enumerate() {
                // Alone: one token per step (a decode, segments split into tasks).
                let alone_inp = TileInputs {
                    q: &q[t * qd..(t + 1) * qd],
                    slots: &slots[t..t + 1],
                    positions: &positions[t..t + 1],
                    ..inp
                };
                let alone = run_plan(&alone_inp, &plan(&shape, &slots[..1], &[pos]));
                assert_eq!(
                    bits(&alone),
                    bits(&together[t * qd..(t + 1) * qd]),
                    "{spec} position {pos}: alone vs tiled with its neighbours"
                );
                for h in 0..heads {
                    let mut want = vec![0f32; hd];
                    attend_one(
                        &kv,
                        0,
                        SeqSlot(0),
                        h / (heads / kv_heads),
                        pos as usize + 1,
                        &q[t * qd + h * hd..t * qd + (h + 1) * hd],
                        0.125,
                        &mut AttnScratch::default(),
                        &mut want,
                    );
                    let got = &together[t * qd + h * hd..t * qd + (h + 1) * hd];
                    // K scored from codes quantises the query to i8 (`flash_tile_codes`), the
                    // bf16-pair arithmetic rounds the query and the weights to bf16
                    // (`flash_tile_pairs`): equal to the exact regime up to that rounding;
                    // other codecs to f32 rounding.
                    let tol = if KeyCodes::of(codecs.k, hd) == Some(KeyCodes::Rows) {
                        2e-2
                    } else if crate::attention_plan::pairs_arithmetic(codecs) {
                        1e-2
                    } else {
                        1e-5
                    };
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - w).abs() <= tol * (1.0 + w.abs()),
                            "{spec} position {pos} head {h} [{i}]: tiled {g} vs exact {w}"
                        );
                    }
                }
            }
        }
    }

    /// f16 K/V at depth: a run of tokens sharing each tile (24 rows: the widened tile and, where
    /// the CPU has AVX-512, the 512-bit transposed kernel of `flash_tile_wide`) gives every row
    /// the bits it gets alone (a decode: three rows, row-major kernel) and on the portable path.
    #[test]
    fn f16_prefill_tiles_equal_decodes_and_the_portable_path_bitwise() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(31);
        let (heads, kv_heads, hd, n) = (6, 2, 64, 1100);
        let kv = random_store(&mut rng, KvDtype::F16, (kv_heads, hd, n), (2.0, 2.0));
        // 20 queries ending at n - 1 (several query tiles, the last crossing a segment end).
        let positions: Vec<u32> = (n as u32 - 20..n as u32).collect();
        let slots = vec![SeqSlot(0); positions.len()];
        let q: Vec<f32> = (0..positions.len() * heads * hd)
            .map(|_| rng.gen_range(-1.0f32..1.0))
            .collect();
        let (shape, inp) = test_inputs(
            &kv,
            &q,
            &slots,
            &positions,
            (heads, kv_heads, hd),
            AttnArith::Tiled,
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let together = run_plan(&inp, &plan(&shape, &slots, &positions));
        kernels::set_force_portable(true);
        let portable = run_plan(&inp, &plan(&shape, &slots, &positions));
        kernels::set_force_portable(false);
        assert_eq!(bits(&together), bits(&portable), "native vs portable");
        let qd = heads * hd;
        for (t, &pos) in positions.iter().enumerate() {
            let alone_inp = TileInputs {
                q: &q[t * qd..(t + 1) * qd],
                slots: &slots[t..t + 1],
                positions: &positions[t..t + 1],
                ..inp
            };
            let alone = run_plan(&alone_inp, &plan(&shape, &slots[..1], &[pos]));
            assert_eq!(
                bits(&alone),
                bits(&together[t * qd..(t + 1) * qd]),
                "position {pos}: alone vs tiled with its neighbours"
            );
        }
    }
}
