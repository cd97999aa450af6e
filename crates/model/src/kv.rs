//! The narrow interface through which the forward pass stores and reads K/V.
//!
//! The forward pass writes each token's K and V (after RoPE) through [`KvStore::write`] and then
//! reads them back — including the tokens it computed in the same step — through
//! [`KvStore::for_each_chunk`], so a token's result never depends on whether its prefix was
//! computed now or earlier. The engine's paged cache implements this trait; [`ContiguousKv`] is
//! the simple one-sequence-per-slot cache used by the CLI and tests. Nothing here schedules or
//! evicts.

use half::f16;
use quant::EncodedRows;

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

/// One contiguous buffer per slot: `[num_layers, num_kv_heads, capacity, head_dim]` for K and V.
pub struct ContiguousKv {
    num_layers: usize,
    num_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    codecs: KvDtype,
    layout: KvLayout,
    slots: Vec<SlotBuf>,
}

enum SlotBuf {
    F32 {
        k: Vec<f32>,
        v: Vec<f32>,
    },
    F16 {
        k: Vec<f16>,
        v: Vec<f16>,
    },
    /// `[num_layers, num_kv_heads, capacity]` rows of the codecs' row sizes.
    Encoded {
        k: Vec<u8>,
        v: Vec<u8>,
    },
}

impl ContiguousKv {
    /// A cache of `num_slots` sequences of up to `capacity` tokens; fails when `dtype`'s codecs
    /// do not fit `head_dim` (e.g. a group size that does not divide it).
    pub fn new(
        num_slots: usize,
        num_layers: usize,
        num_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        dtype: KvDtype,
    ) -> Result<Self, KvError> {
        let layout = KvLayout::of(dtype, head_dim)?;
        let rows = num_layers * num_kv_heads * capacity;
        let n = rows * head_dim;
        let slots = (0..num_slots)
            .map(|_| match layout {
                KvLayout::F32 => SlotBuf::F32 {
                    k: vec![0.0; n],
                    v: vec![0.0; n],
                },
                KvLayout::F16 => SlotBuf::F16 {
                    k: vec![f16::ZERO; n],
                    v: vec![f16::ZERO; n],
                },
                KvLayout::Encoded {
                    k_row_bytes,
                    v_row_bytes,
                } => SlotBuf::Encoded {
                    k: vec![0; rows * k_row_bytes],
                    v: vec![0; rows * v_row_bytes],
                },
            })
            .collect();
        Ok(ContiguousKv {
            num_layers,
            num_kv_heads,
            head_dim,
            capacity,
            codecs: dtype,
            layout,
            slots,
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Row index of (layer, head, pos).
    fn row(&self, layer: usize, kv_head: usize, pos: usize) -> usize {
        (layer * self.num_kv_heads + kv_head) * self.capacity + pos
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
        let rows: Vec<usize> = (0..self.num_kv_heads)
            .map(|h| self.row(layer, h, pos))
            .collect();
        let (codecs, layout) = (self.codecs, self.layout);
        let buf = self
            .slots
            .get_mut(slot.0 as usize)
            .ok_or(KvError::UnknownSlot(slot.0))?;
        for (h, &row) in rows.iter().enumerate() {
            let (ks, vs) = (&k[h * hd..(h + 1) * hd], &v[h * hd..(h + 1) * hd]);
            let off = row * hd;
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
                SlotBuf::Encoded { k: kb, v: vb } => {
                    let KvLayout::Encoded {
                        k_row_bytes: kr,
                        v_row_bytes: vr,
                    } = layout
                    else {
                        unreachable!("encoded buffers have an encoded layout")
                    };
                    quant::encode_row(codecs.k, ks, &mut kb[row * kr..(row + 1) * kr])
                        .map_err(|e| KvError::Codec(e.to_string()))?;
                    quant::encode_row(codecs.v, vs, &mut vb[row * vr..(row + 1) * vr])
                        .map_err(|e| KvError::Codec(e.to_string()))?;
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
        let first = self.row(layer, kv_head, 0);
        let hd = self.head_dim;
        match &self.slots[slot.0 as usize] {
            SlotBuf::F32 { k, v } => f(
                0,
                KvChunk::F32 {
                    k: &k[first * hd..(first + n) * hd],
                    v: &v[first * hd..(first + n) * hd],
                },
            ),
            SlotBuf::F16 { k, v } => f(
                0,
                KvChunk::F16 {
                    k: &k[first * hd..(first + n) * hd],
                    v: &v[first * hd..(first + n) * hd],
                },
            ),
            SlotBuf::Encoded { k, v } => {
                let KvLayout::Encoded {
                    k_row_bytes: kr,
                    v_row_bytes: vr,
                } = self.layout
                else {
                    unreachable!("encoded buffers have an encoded layout")
                };
                let kr_rows = EncodedRows::new(self.codecs.k, hd, &k[first * kr..(first + n) * kr])
                    .expect("whole rows");
                let vr_rows = EncodedRows::new(self.codecs.v, hd, &v[first * vr..(first + n) * vr])
                    .expect("whole rows");
                f(
                    0,
                    KvChunk::Encoded {
                        k: kr_rows,
                        v: vr_rows,
                    },
                )
            }
        }
    }
}
