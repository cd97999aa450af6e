//! The narrow interface through which the forward pass stores and reads K/V.
//!
//! The forward pass writes each token's K and V (after RoPE) through [`KvStore::write`] and then
//! reads them back — including the tokens it computed in the same step — through
//! [`KvStore::for_each_chunk`], so a token's result never depends on whether its prefix was
//! computed now or earlier. The engine's paged cache implements this trait; [`ContiguousKv`] is
//! the simple one-sequence-per-slot cache used by the CLI and tests. Nothing here schedules or
//! evicts.

use half::f16;

/// Which sequence of the batch a token belongs to, as the KV store knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqSlot(pub u32);

/// A run of consecutive positions of one KV head: `k` and `v` are `[num_positions, head_dim]`.
#[derive(Debug, Clone, Copy)]
pub enum KvChunk<'a> {
    F32 { k: &'a [f32], v: &'a [f32] },
    F16 { k: &'a [f16], v: &'a [f16] },
}

impl KvChunk<'_> {
    pub fn num_positions(&self, head_dim: usize) -> usize {
        match self {
            KvChunk::F32 { k, .. } => k.len() / head_dim,
            KvChunk::F16 { k, .. } => k.len() / head_dim,
        }
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
}

/// Element type of a [`ContiguousKv`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
}

/// One contiguous buffer per slot: `[num_layers, num_kv_heads, capacity, head_dim]` for K and V.
pub struct ContiguousKv {
    num_layers: usize,
    num_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    slots: Vec<SlotBuf>,
}

enum SlotBuf {
    F32 { k: Vec<f32>, v: Vec<f32> },
    F16 { k: Vec<f16>, v: Vec<f16> },
}

impl ContiguousKv {
    pub fn new(
        num_slots: usize,
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        dtype: KvDtype,
    ) -> Self {
        let n = num_layers * num_kv_heads * capacity * head_dim;
        let slots = (0..num_slots)
            .map(|_| match dtype {
                KvDtype::F32 => SlotBuf::F32 {
                    k: vec![0.0; n],
                    v: vec![0.0; n],
                },
                KvDtype::F16 => SlotBuf::F16 {
                    k: vec![f16::ZERO; n],
                    v: vec![f16::ZERO; n],
                },
            })
            .collect();
        ContiguousKv {
            num_layers,
            num_kv_heads,
            head_dim,
            capacity,
            slots,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn offset(&self, layer: usize, kv_head: usize, pos: usize) -> usize {
        ((layer * self.num_kv_heads + kv_head) * self.capacity + pos) * self.head_dim
    }
}

impl KvStore for ContiguousKv {
    fn write(
        &mut self,
        layer: usize,
        slot: SeqSlot,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KvError> {
        if pos >= self.capacity {
            return Err(KvError::OutOfCapacity {
                slot: slot.0,
                pos,
                capacity: self.capacity,
            });
        }
        assert!(layer < self.num_layers, "layer {layer} out of range");
        let hd = self.head_dim;
        let offsets: Vec<usize> = (0..self.num_kv_heads)
            .map(|h| self.offset(layer, h, pos))
            .collect();
        let buf = self
            .slots
            .get_mut(slot.0 as usize)
            .ok_or(KvError::UnknownSlot(slot.0))?;
        for (h, &off) in offsets.iter().enumerate() {
            let (ks, vs) = (&k[h * hd..(h + 1) * hd], &v[h * hd..(h + 1) * hd]);
            match buf {
                SlotBuf::F32 { k: kb, v: vb } => {
                    kb[off..off + hd].copy_from_slice(ks);
                    vb[off..off + hd].copy_from_slice(vs);
                }
                SlotBuf::F16 { k: kb, v: vb } => {
                    for i in 0..hd {
                        kb[off + i] = f16::from_f32(ks[i]);
                        vb[off + i] = f16::from_f32(vs[i]);
                    }
                }
            }
        }
        Ok(())
    }

    fn for_each_chunk(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        num_positions: usize,
        f: &mut dyn FnMut(usize, KvChunk<'_>),
    ) {
        let n = num_positions.min(self.capacity);
        let start = self.offset(layer, kv_head, 0);
        let end = start + n * self.head_dim;
        match &self.slots[slot.0 as usize] {
            SlotBuf::F32 { k, v } => f(
                0,
                KvChunk::F32 {
                    k: &k[start..end],
                    v: &v[start..end],
                },
            ),
            SlotBuf::F16 { k, v } => f(
                0,
                KvChunk::F16 {
                    k: &k[start..end],
                    v: &v[start..end],
                },
            ),
        }
    }
}
