//! The K/V tensor memory of the paged cache and its [`KvStore`] view for one step.
//!
//! Owns the bytes: `num_blocks` blocks, each `[num_layers, num_kv_heads, block_size, head_dim]`
//! (rows of f32, f16 or `quant`-encoded bytes) so one block is contiguous (a unit for
//! copy-on-write and for tiers) and one head's rows inside a block are contiguous (one attention
//! chunk). Which block belongs to whom is the
//! `cache` crate's business; this module only reads and writes the blocks a table names.

use cache::BlockId;
use half::f16;
use model::kv::{KvChunk, KvDtype, KvError, KvLayout, KvStore, SeqSlot};
use quant::EncodedRows;

/// Geometry of the K/V memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvGeometry {
    /// Elements of K (or V) in one block.
    pub fn block_elems(&self) -> usize {
        self.num_layers * self.num_kv_heads * self.block_size * self.head_dim
    }
}

enum Buf {
    F32 {
        k: Vec<f32>,
        v: Vec<f32>,
    },
    F16 {
        k: Vec<f16>,
        v: Vec<f16>,
    },
    /// Encoded rows (`quant` codecs): `k_row_bytes` / `v_row_bytes` per row.
    Encoded {
        k: Vec<u8>,
        v: Vec<u8>,
        k_row_bytes: usize,
        v_row_bytes: usize,
    },
}

/// All K/V memory of the pool.
pub struct PagedKvMemory {
    geo: KvGeometry,
    dtype: KvDtype,
    buf: Buf,
}

impl PagedKvMemory {
    /// Allocates the pool; fails when the codecs do not fit the head size.
    pub fn new(geo: KvGeometry, dtype: KvDtype) -> Result<Self, KvError> {
        let rows = geo.num_blocks * geo.num_layers * geo.num_kv_heads * geo.block_size;
        let n = rows * geo.head_dim;
        let buf = match KvLayout::of(dtype, geo.head_dim)? {
            KvLayout::F32 => Buf::F32 {
                k: vec![0.0; n],
                v: vec![0.0; n],
            },
            KvLayout::F16 => Buf::F16 {
                k: vec![f16::ZERO; n],
                v: vec![f16::ZERO; n],
            },
            KvLayout::Encoded {
                k_row_bytes,
                v_row_bytes,
            } => Buf::Encoded {
                k: vec![0; rows * k_row_bytes],
                v: vec![0; rows * v_row_bytes],
                k_row_bytes,
                v_row_bytes,
            },
        };
        Ok(PagedKvMemory { geo, dtype, buf })
    }

    pub fn geometry(&self) -> KvGeometry {
        self.geo
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Bytes of K and V per token over all layers, scales and offsets included.
    pub fn bytes_per_token(&self) -> usize {
        let g = &self.geo;
        self.dtype
            .bytes_per_token(g.num_layers, g.num_kv_heads, g.head_dim)
    }

    /// Bytes of the whole pool.
    pub fn total_bytes(&self) -> usize {
        self.bytes_per_token() * self.geo.block_size * self.geo.num_blocks
    }

    /// Bytes actually allocated for K and V (equals `total_bytes`; kept to prove the accounting).
    pub fn allocated_bytes(&self) -> usize {
        match &self.buf {
            Buf::F32 { k, v } => (k.len() + v.len()) * 4,
            Buf::F16 { k, v } => (k.len() + v.len()) * 2,
            Buf::Encoded { k, v, .. } => k.len() + v.len(),
        }
    }

    /// Index of the row of (block, layer, kv_head, row within the block).
    fn row(&self, block: BlockId, layer: usize, kv_head: usize, row: usize) -> usize {
        let g = &self.geo;
        ((block.index() * g.num_layers + layer) * g.num_kv_heads + kv_head) * g.block_size + row
    }

    /// Copies the first `num_rows` token rows of `src` into `dst` (copy-on-write of a partial block).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId, num_rows: usize) {
        let g = self.geo;
        for layer in 0..g.num_layers {
            for h in 0..g.num_kv_heads {
                let (s, d) = (self.row(src, layer, h, 0), self.row(dst, layer, h, 0));
                let hd = g.head_dim;
                match &mut self.buf {
                    Buf::F32 { k, v } => {
                        k.copy_within(s * hd..(s + num_rows) * hd, d * hd);
                        v.copy_within(s * hd..(s + num_rows) * hd, d * hd);
                    }
                    Buf::F16 { k, v } => {
                        k.copy_within(s * hd..(s + num_rows) * hd, d * hd);
                        v.copy_within(s * hd..(s + num_rows) * hd, d * hd);
                    }
                    Buf::Encoded {
                        k,
                        v,
                        k_row_bytes: kr,
                        v_row_bytes: vr,
                    } => {
                        k.copy_within(s * *kr..(s + num_rows) * *kr, d * *kr);
                        v.copy_within(s * *vr..(s + num_rows) * *vr, d * *vr);
                    }
                }
            }
        }
    }

    /// A [`KvStore`] over this memory for one step: `tables[slot]` is the block table of the
    /// sequence the forward pass calls `SeqSlot(slot)`.
    pub fn view<'a>(&'a mut self, tables: &'a [&'a [BlockId]]) -> StepKv<'a> {
        StepKv { mem: self, tables }
    }
}

/// The paged memory seen through the block tables of one step's sequences.
pub struct StepKv<'a> {
    mem: &'a mut PagedKvMemory,
    tables: &'a [&'a [BlockId]],
}

impl StepKv<'_> {
    fn block_of(&self, slot: SeqSlot, pos: usize) -> Result<BlockId, KvError> {
        let table = self
            .tables
            .get(slot.0 as usize)
            .ok_or(KvError::UnknownSlot(slot.0))?;
        let bs = self.mem.geo.block_size;
        table.get(pos / bs).copied().ok_or(KvError::OutOfCapacity {
            slot: slot.0,
            pos,
            capacity: table.len() * bs,
        })
    }
}

impl KvStore for StepKv<'_> {
    fn write(
        &mut self,
        layer: usize,
        slot: SeqSlot,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KvError> {
        let block = self.block_of(slot, pos)?;
        let g = self.mem.geo;
        let hd = g.head_dim;
        let codecs = self.mem.dtype;
        for h in 0..g.num_kv_heads {
            let row = self.mem.row(block, layer, h, pos % g.block_size);
            let (ks, vs) = (&k[h * hd..(h + 1) * hd], &v[h * hd..(h + 1) * hd]);
            match &mut self.mem.buf {
                Buf::F32 { k: kb, v: vb } => {
                    kb[row * hd..(row + 1) * hd].copy_from_slice(ks);
                    vb[row * hd..(row + 1) * hd].copy_from_slice(vs);
                }
                Buf::F16 { k: kb, v: vb } => {
                    for i in 0..hd {
                        kb[row * hd + i] = f16::from_f32(ks[i]);
                        vb[row * hd + i] = f16::from_f32(vs[i]);
                    }
                }
                Buf::Encoded {
                    k: kb,
                    v: vb,
                    k_row_bytes: kr,
                    v_row_bytes: vr,
                } => {
                    let (kr, vr) = (*kr, *vr);
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
        let g = self.mem.geo;
        let hd = g.head_dim;
        let table = self.tables[slot.0 as usize];
        let mut pos = 0;
        for &block in table {
            if pos >= num_positions {
                break;
            }
            let rows = (num_positions - pos).min(g.block_size);
            let r0 = self.mem.row(block, layer, kv_head, 0);
            match &self.mem.buf {
                Buf::F32 { k, v } => f(
                    pos,
                    KvChunk::F32 {
                        k: &k[r0 * hd..(r0 + rows) * hd],
                        v: &v[r0 * hd..(r0 + rows) * hd],
                    },
                ),
                Buf::F16 { k, v } => f(
                    pos,
                    KvChunk::F16 {
                        k: &k[r0 * hd..(r0 + rows) * hd],
                        v: &v[r0 * hd..(r0 + rows) * hd],
                    },
                ),
                Buf::Encoded {
                    k,
                    v,
                    k_row_bytes: kr,
                    v_row_bytes: vr,
                } => {
                    let kb = &k[r0 * kr..(r0 + rows) * kr];
                    let vb = &v[r0 * vr..(r0 + rows) * vr];
                    let codecs = self.mem.dtype;
                    f(
                        pos,
                        KvChunk::Encoded {
                            k: EncodedRows::new(codecs.k, hd, kb)
                                .expect("whole rows of a validated codec"),
                            v: EncodedRows::new(codecs.v, hd, vb)
                                .expect("whole rows of a validated codec"),
                        },
                    )
                }
            }
            pos += rows;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> KvGeometry {
        KvGeometry {
            num_blocks: 4,
            block_size: 2,
            num_layers: 2,
            num_kv_heads: 2,
            head_dim: 3,
        }
    }

    #[test]
    fn writes_land_in_the_named_blocks_and_read_back_in_order() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut mem = PagedKvMemory::new(geo(), dtype).unwrap();
            let table: &[BlockId] = &[BlockId(3), BlockId(1)];
            let tables = [table];
            let mut kv = mem.view(&tables);
            for pos in 0..3 {
                let k: Vec<f32> = (0..6).map(|i| (pos * 10 + i) as f32).collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                kv.write(1, SeqSlot(0), pos, &k, &v).unwrap();
            }
            let mut seen = Vec::new();
            kv.for_each_chunk(1, SeqSlot(0), 1, 3, &mut |start, chunk| {
                let ks: Vec<f32> = match chunk {
                    KvChunk::F32 { k, .. } => k.to_vec(),
                    KvChunk::F16 { k, .. } => k.iter().map(|x| x.to_f32()).collect(),
                    KvChunk::Encoded { .. } => unreachable!("f32/f16 memory"),
                };
                seen.push((start, ks));
            });
            assert_eq!(seen.len(), 2);
            assert_eq!(seen[0], (0, vec![3.0, 4.0, 5.0, 13.0, 14.0, 15.0]));
            assert_eq!(seen[1], (2, vec![23.0, 24.0, 25.0]));
            assert!(
                kv.write(0, SeqSlot(0), 4, &[0.0; 6], &[0.0; 6]).is_err(),
                "beyond the table"
            );
        }
    }

    #[test]
    fn quantized_rows_round_trip_within_the_codec_bound_and_account_bytes_exactly() {
        let geo = KvGeometry {
            num_blocks: 3,
            block_size: 4,
            num_layers: 2,
            num_kv_heads: 2,
            head_dim: 64,
        };
        for spec in ["int8", "int4", "fp8", "bf16", "k=int8,v=int4"] {
            let codecs = KvDtype::parse(spec).unwrap();
            let mut mem = PagedKvMemory::new(geo, codecs).unwrap();
            assert_eq!(
                mem.allocated_bytes(),
                mem.total_bytes(),
                "{spec}: bytes per token × tokens"
            );
            let table: &[BlockId] = &[BlockId(2), BlockId(0)];
            let tables = [table];
            let mut kv = mem.view(&tables);
            let row = |pos: usize| -> Vec<f32> {
                (0..128)
                    .map(|i| ((pos * 131 + i * 17) % 23) as f32 / 7.0 - 1.5)
                    .collect()
            };
            for pos in 0..6 {
                kv.write(1, SeqSlot(0), pos, &row(pos), &row(pos + 100))
                    .unwrap();
            }
            let mut n = 0;
            kv.for_each_chunk(1, SeqSlot(0), 1, 6, &mut |start, chunk| {
                let KvChunk::Encoded { k, .. } = chunk else {
                    panic!("{spec}: encoded chunks")
                };
                for (j, bytes) in k.rows().enumerate() {
                    let mut out = vec![0.0; 64];
                    quant::decode_row(k.kind(), bytes, &mut out).unwrap();
                    let want = &row(start + j)[64..];
                    let err = out
                        .iter()
                        .zip(want)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0.0f32, f32::max);
                    assert!(err < 0.25, "{spec}: row {} err {err}", start + j);
                    n += 1;
                }
            });
            assert_eq!(n, 6);
        }
    }

    #[test]
    fn copy_block_copies_rows_of_every_layer_and_head() {
        let mut mem = PagedKvMemory::new(geo(), KvDtype::F32).unwrap();
        let t0: &[BlockId] = &[BlockId(0)];
        {
            let tables = [t0];
            let mut kv = mem.view(&tables);
            kv.write(0, SeqSlot(0), 0, &[1.0; 6], &[2.0; 6]).unwrap();
            kv.write(1, SeqSlot(0), 0, &[3.0; 6], &[4.0; 6]).unwrap();
        }
        mem.copy_block(BlockId(0), BlockId(2), 1);
        let t2: &[BlockId] = &[BlockId(2)];
        let tables = [t2];
        let kv = mem.view(&tables);
        let mut got = Vec::new();
        kv.for_each_chunk(1, SeqSlot(0), 1, 1, &mut |_, c| {
            if let KvChunk::F32 { k, v } = c {
                got.push((k.to_vec(), v.to_vec()));
            }
        });
        assert_eq!(got, vec![(vec![3.0; 3], vec![4.0; 3])]);
    }
}

/// Why serialised block bytes cannot be loaded into a block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockBytesError {
    /// The byte count differs from one block's K and V in this memory's element type.
    #[error("block bytes have length {got}, expected {expected}")]
    WrongLength { got: usize, expected: usize },
    /// The block id is outside the pool.
    #[error("block {block} is outside the pool of {num_blocks} blocks")]
    NoSuchBlock { block: usize, num_blocks: usize },
}

// Block serialisation for the storage tiers: one block's K then V, little-endian elements of the
// memory's own type (the cache namespace commits to the codec, so bytes never cross codecs).
impl PagedKvMemory {
    /// Serialised bytes of one block (K then V, exactly what [`PagedKvMemory::block_bytes`]
    /// returns).
    pub fn block_num_bytes(&self) -> usize {
        let n = self.geo.block_elems();
        match &self.buf {
            Buf::F32 { .. } => 2 * n * 4,
            Buf::F16 { .. } => 2 * n * 2,
            Buf::Encoded {
                k_row_bytes,
                v_row_bytes,
                ..
            } => n / self.geo.head_dim * (k_row_bytes + v_row_bytes),
        }
    }

    /// One block's K then V as little-endian bytes (every layer, head and row).
    pub fn block_bytes(&self, block: BlockId) -> Vec<u8> {
        let n = self.geo.block_elems();
        let start = block.index() * n;
        let mut out = Vec::with_capacity(self.block_num_bytes());
        match &self.buf {
            Buf::F32 { k, v } => {
                for x in k[start..start + n].iter().chain(&v[start..start + n]) {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            Buf::F16 { k, v } => {
                for x in k[start..start + n].iter().chain(&v[start..start + n]) {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            Buf::Encoded {
                k,
                v,
                k_row_bytes: kr,
                v_row_bytes: vr,
            } => {
                let rows = n / self.geo.head_dim;
                let r0 = block.index() * rows;
                out.extend_from_slice(&k[r0 * kr..(r0 + rows) * kr]);
                out.extend_from_slice(&v[r0 * vr..(r0 + rows) * vr]);
            }
        }
        out
    }

    /// Overwrites one block with bytes from [`PagedKvMemory::block_bytes`] of the same geometry
    /// and element type. Checks length and block id; nothing is written on error.
    pub fn load_block_bytes(
        &mut self,
        block: BlockId,
        bytes: &[u8],
    ) -> Result<(), BlockBytesError> {
        if block.index() >= self.geo.num_blocks {
            return Err(BlockBytesError::NoSuchBlock {
                block: block.index(),
                num_blocks: self.geo.num_blocks,
            });
        }
        let expected = self.block_num_bytes();
        if bytes.len() != expected {
            return Err(BlockBytesError::WrongLength {
                got: bytes.len(),
                expected,
            });
        }
        let n = self.geo.block_elems();
        let start = block.index() * n;
        match &mut self.buf {
            Buf::F32 { k, v } => {
                let (kb, vb) = bytes.split_at(n * 4);
                for (dst, src) in k[start..start + n].iter_mut().zip(kb.chunks_exact(4)) {
                    *dst = f32::from_le_bytes([src[0], src[1], src[2], src[3]]);
                }
                for (dst, src) in v[start..start + n].iter_mut().zip(vb.chunks_exact(4)) {
                    *dst = f32::from_le_bytes([src[0], src[1], src[2], src[3]]);
                }
            }
            Buf::Encoded {
                k,
                v,
                k_row_bytes: kr,
                v_row_bytes: vr,
            } => {
                let rows = n / self.geo.head_dim;
                let r0 = block.index() * rows;
                let (kb, vb) = bytes.split_at(rows * *kr);
                k[r0 * *kr..(r0 + rows) * *kr].copy_from_slice(kb);
                v[r0 * *vr..(r0 + rows) * *vr].copy_from_slice(vb);
            }
            Buf::F16 { k, v } => {
                let (kb, vb) = bytes.split_at(n * 2);
                for (dst, src) in k[start..start + n].iter_mut().zip(kb.chunks_exact(2)) {
                    *dst = f16::from_le_bytes([src[0], src[1]]);
                }
                for (dst, src) in v[start..start + n].iter_mut().zip(vb.chunks_exact(2)) {
                    *dst = f16::from_le_bytes([src[0], src[1]]);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod block_bytes_tests {
    use super::*;

    #[test]
    fn block_bytes_round_trip_into_another_block_and_reject_bad_input() {
        let geo = KvGeometry {
            num_blocks: 3,
            block_size: 2,
            num_layers: 2,
            num_kv_heads: 2,
            head_dim: 3,
        };
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut mem = PagedKvMemory::new(geo, dtype).unwrap();
            let t0: &[BlockId] = &[BlockId(0)];
            {
                let tables = [t0];
                let mut kv = mem.view(&tables);
                for layer in 0..2 {
                    for pos in 0..2 {
                        let k: Vec<f32> = (0..6)
                            .map(|i| (layer * 100 + pos * 10 + i) as f32)
                            .collect();
                        let v: Vec<f32> = k.iter().map(|x| -x - 0.5).collect();
                        kv.write(layer, SeqSlot(0), pos, &k, &v).unwrap();
                    }
                }
            }
            let bytes = mem.block_bytes(BlockId(0));
            assert_eq!(bytes.len(), mem.block_num_bytes());
            assert_ne!(bytes, mem.block_bytes(BlockId(2)), "block 2 is still zero");
            mem.load_block_bytes(BlockId(2), &bytes).unwrap();
            assert_eq!(mem.block_bytes(BlockId(2)), bytes);
            assert_eq!(
                mem.load_block_bytes(BlockId(1), &bytes[1..]),
                Err(BlockBytesError::WrongLength {
                    got: bytes.len() - 1,
                    expected: bytes.len()
                })
            );
            assert!(mem.load_block_bytes(BlockId(3), &bytes).is_err());
            assert!(
                mem.block_bytes(BlockId(1)).iter().all(|&b| b == 0),
                "nothing written on error"
            );
        }
    }
}
