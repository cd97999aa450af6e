//! The narrow interface through which the forward pass stores and reads K/V.
//!
//! The forward pass writes each token's K and V (after RoPE) through [`KvStore::write`] and then
//! reads them back — including the tokens it computed in the same step — through
//! [`KvStore::for_each_chunk`], so a token's result never depends on whether its prefix was
//! computed now or earlier. The engine's paged cache implements this trait; `kv_contiguous.rs` holds
//! the simple one-sequence-per-slot cache used by the CLI and tests. Nothing here schedules or
//! evicts.

use half::f16;
use kernels::coded_pair_layout::CodedPairHalf;
use kernels::pair_layout::PairHalf;
use quant::EncodedRows;

use kernels::ThreadPool;

/// Which sequence of the batch a token belongs to, as the KV store knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqSlot(pub u32);

/// A run of consecutive positions of one KV head: `k` and `v` are `[num_positions, head_dim]`
/// (or that many encoded rows).
#[derive(Debug, Clone, Copy)]
pub enum KvChunk<'a> {
    F32 {
        k: &'a [f32],
        v: &'a [f32],
    },
    F16 {
        k: &'a [f16],
        v: &'a [f16],
    },
    /// Quantized rows (any `quant` codec; K and V may differ), read without dequantising a block.
    Encoded {
        k: EncodedRows<'a>,
        v: EncodedRows<'a>,
    },
}

impl KvChunk<'_> {
    pub fn num_positions(&self, head_dim: usize) -> usize {
        match self {
            KvChunk::F32 { k, .. } => k.len() / head_dim,
            KvChunk::F16 { k, .. } => k.len() / head_dim,
            KvChunk::Encoded { k, .. } => k.num_rows(),
        }
    }

    /// The chunk without its first `n` positions (empty when `n` covers it all).
    pub fn skip_positions(self, n: usize, head_dim: usize) -> Self {
        let at = |len: usize| (n * head_dim).min(len);
        match self {
            KvChunk::F32 { k, v } => KvChunk::F32 {
                k: &k[at(k.len())..],
                v: &v[at(v.len())..],
            },
            KvChunk::F16 { k, v } => KvChunk::F16 {
                k: &k[at(k.len())..],
                v: &v[at(v.len())..],
            },
            KvChunk::Encoded { k, v } => KvChunk::Encoded {
                k: k.skip_rows(n),
                v: v.skip_rows(n),
            },
        }
    }
}

/// The K/V element encodings: `quant::KvCodecs` (K and V separately). `KvDtype::F16` and
/// `KvDtype::F32` use plain typed storage; every other codec stores encoded rows.
pub type KvDtype = quant::KvCodecs;

/// How a store lays out one codec's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    F32,
    F16,
    /// Encoded rows of `k_row_bytes` / `v_row_bytes` bytes.
    Encoded {
        k_row_bytes: usize,
        v_row_bytes: usize,
    },
}

impl KvLayout {
    /// The layout for `codecs` at `head_dim` (validating the codecs for that head size).
    pub fn of(codecs: KvDtype, head_dim: usize) -> Result<KvLayout, KvError> {
        codecs
            .validate(head_dim)
            .map_err(|e| KvError::Codec(e.to_string()))?;
        Ok(if codecs == KvDtype::F32 {
            KvLayout::F32
        } else if codecs == KvDtype::F16 {
            KvLayout::F16
        } else {
            KvLayout::Encoded {
                k_row_bytes: codecs.k.bytes_per_row(head_dim),
                v_row_bytes: codecs.v.bytes_per_row(head_dim),
            }
        })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("position {pos} is beyond the KV capacity {capacity} of slot {slot}")]
    OutOfCapacity {
        slot: u32,
        pos: usize,
        capacity: usize,
    },
    #[error("unknown KV slot {0}")]
    UnknownSlot(u32),
    #[error("KV codec: {0}")]
    Codec(String),
    #[error("K/V on the device: {0}")]
    Device(String),
}

/// Storage of K/V for the sequences of a batch.
pub trait KvStore: Sync {
    /// Stores K and V of one token: `k`, `v` are `[num_kv_heads * head_dim]`.
    fn write(
        &mut self,
        layer: usize,
        slot: SeqSlot,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KvError>;

    /// Stores K and V of a step's tokens in `layer`: token `t` (`k`, `v` rows `[num_tokens,
    /// num_kv_heads * head_dim]`) of `slots[t]` at `positions[t]`. The bytes of
    /// [`KvStore::write`] per token in order; stores spread the encoding over `pool` where
    /// they can (a sequence's positions come in increasing order, as a step writes them).
    fn write_step(
        &mut self,
        pool: &ThreadPool,
        layer: usize,
        slots: &[SeqSlot],
        positions: &[u32],
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KvError> {
        let _ = pool;
        let kvd = k.len() / slots.len().max(1);
        for (t, (&slot, &pos)) in slots.iter().zip(positions).enumerate() {
            let rows = t * kvd..(t + 1) * kvd;
            self.write(layer, slot, pos as usize, &k[rows.clone()], &v[rows])?;
        }
        Ok(())
    }

    /// The K and V encodings of every row (the attention plan tiles f16 stores).
    fn codecs(&self) -> KvDtype;

    /// Called by the forward pass before it writes anything: stores with a block K codec
    /// (`int4c`) drop the f16 rows of groups sealed by earlier steps. Never changes a result.
    fn begin_step(&mut self) {}

    /// Calls `f(first_pos, chunk)` for consecutive chunks covering positions `0..num_positions`
    /// of `kv_head` in `layer`, in increasing position order.
    fn for_each_chunk(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        num_positions: usize,
        f: &mut dyn FnMut(usize, KvChunk<'_>),
    );

    /// Like [`KvStore::for_each_chunk`] for readers that need positions `from..num_positions`
    /// only: chunks that end at or before `from` may be left out (the first chunk may still
    /// start before `from`). Stores with many chunks skip them and may prefetch ahead.
    fn for_each_chunk_from(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        from: usize,
        num_positions: usize,
        f: &mut dyn FnMut(usize, KvChunk<'_>),
    ) {
        let _ = from;
        self.for_each_chunk(layer, slot, kv_head, num_positions, f)
    }

    /// The 16 positions `pos..pos + 16` (`pos` a multiple of 16) of `kv_head` in `layer` as one
    /// group of bf16 K/V in the pair layout (`kernels::pair_layout`), read in place — what the
    /// bf16-pair attention reads without transposing a tile. Positions of the group past those
    /// written hold zeros or stale words (readers stage only the valid ones). `None` (the
    /// default) where the store does not keep that layout there: other codecs, blocks that
    /// are not whole groups, memory off the host.
    fn pair_group(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        pos: usize,
    ) -> Option<PairHalf<'_>> {
        let _ = (layer, slot, kv_head, pos);
        None
    }

    /// [`KvStore::pair_group`] for `int8` K (one group per row) with bf16 V, kept in the coded
    /// pair layout (`kernels::coded_pair_layout`): what the int8-scored pair attention reads in
    /// place. `None` (the default) where the store does not keep that layout there.
    fn coded_pair_group(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        pos: usize,
    ) -> Option<CodedPairHalf<'_>> {
        let _ = (layer, slot, kv_head, pos);
        None
    }

    /// [`KvStore::pair_group`] for the groups at `from`, `from + 16`, … (`out.len()` of them),
    /// written into `out`: one call for a pass's groups. Whether every one is held in place
    /// (when one is not, `out`'s entries past it are unspecified). The default asks
    /// [`KvStore::pair_group`] for each.
    fn pair_groups<'s>(
        &'s self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        from: usize,
        out: &mut [Option<PairHalf<'s>>],
    ) -> bool {
        fill_groups(out, from, |pos| self.pair_group(layer, slot, kv_head, pos))
    }

    /// [`KvStore::pair_groups`] for [`KvStore::coded_pair_group`].
    fn coded_pair_groups<'s>(
        &'s self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        from: usize,
        out: &mut [Option<CodedPairHalf<'s>>],
    ) -> bool {
        fill_groups(out, from, |pos| {
            self.coded_pair_group(layer, slot, kv_head, pos)
        })
    }

    /// Whether sequences `a` and `b` hold the same K/V over `positions` — the same memory (a
    /// paged store's shared prefix blocks), so reading either gives the same bytes. Lets the
    /// attention plan read a shared prefix once for several decodes. `false` (the default)
    /// when the store cannot tell.
    fn shares_positions(&self, a: SeqSlot, b: SeqSlot, positions: std::ops::Range<usize>) -> bool {
        let _ = (a, b, positions);
        false
    }

    /// The block tables of the step's slots (`[slot]` → block indices) when the K/V lives in a
    /// device's memory ([`DeviceKvMemory`]): what a device backend's forward pass reads instead
    /// of calling the methods above. `None` for host stores.
    fn device_tables(&self) -> Option<&[Vec<u32>]> {
        None
    }
}

/// Writes `group_at(from + 16 i)` into `out[i]` until one is `None`; whether none was (the
/// groups of [`KvStore::pair_groups`] and [`KvStore::coded_pair_groups`]).
#[inline]
pub fn fill_groups<G>(
    out: &mut [Option<G>],
    from: usize,
    group_at: impl Fn(usize) -> Option<G>,
) -> bool {
    for (i, g) in out.iter_mut().enumerate() {
        *g = group_at(from + i * kernels::pair_layout::PAIR_GROUP_ROWS);
        if g.is_none() {
            return false;
        }
    }
    true
}

/// The engine's paged K/V pool in a device's memory, provided by a backend whose forward pass
/// runs there ([`crate::Backend::device_kv_memory`]): blocks named by index, each serialised
/// as the host pool serialises it (every layer's and K/V head's run of K rows, then of V
/// rows), so tier payloads and cache keys are the same whichever memory wrote them.
pub trait DeviceKvMemory: Send {
    /// The codecs of the rows.
    fn codecs(&self) -> KvDtype;
    /// Bytes of K and V per token over all layers.
    fn bytes_per_token(&self) -> usize;
    /// Bytes the pool holds on the device.
    fn allocated_bytes(&self) -> usize;
    /// Bytes of one serialised block.
    fn block_num_bytes(&self) -> usize;
    /// One block serialised (read back from the device).
    fn block_bytes(&self, block: usize) -> Result<Vec<u8>, KvError>;
    /// Overwrites one block with serialised bytes of the same geometry and codecs.
    fn load_block_bytes(&mut self, block: usize, bytes: &[u8]) -> Result<(), KvError>;
    /// Copies the first `num_rows` token rows of `src` into `dst` (copy-on-write).
    fn copy_block(&mut self, src: usize, dst: usize, num_rows: usize) -> Result<(), KvError>;
    /// The step's view: `tables[slot]` is the block table of `SeqSlot(slot)`.
    fn view(&mut self, tables: Vec<Vec<u32>>) -> Box<dyn KvStore + '_>;
}
