//! The paged K/V pool in a device's memory ([`DevicePool`]) and the engine's handle on it
//! ([`DeviceBlocks`], a [`DeviceKvMemory`]): f16 rows ordered `[layer, kv_head, block, row in
//! block, head_dim]` — the host pool's order — so a block serialises to the host pool's bytes
//! (each (layer, head) run of K rows, then of V rows) and tier payloads are the same whichever
//! memory wrote them.
//!
//! Owns the pool's bytes and their moves (serialise, load, copy-on-write). Which block belongs
//! to whom is the engine's; the forward pass that writes and reads the pool is `gpu_forward`.

use std::sync::{Arc, Mutex, MutexGuard};

use cuda::ops::{KvLayout, Ops};
use half::f16;

use crate::kv::{DeviceKvMemory, KvChunk, KvDtype, KvError, KvStore, SeqSlot};

/// K and V pools of `layout`.
pub struct DevicePool<O: Ops> {
    pub(crate) layout: KvLayout,
    pub(crate) k: O::Buf<u16>,
    pub(crate) v: O::Buf<u16>,
}

fn device(e: cuda::CudaError) -> KvError {
    KvError::Device(e.to_string())
}

impl<O: Ops> DevicePool<O> {
    pub(crate) fn new(ops: &O, layout: KvLayout) -> Result<Self, KvError> {
        Ok(DevicePool {
            layout,
            k: ops.alloc(layout.pool_elems()).map_err(device)?,
            v: ops.alloc(layout.pool_elems()).map_err(device)?,
        })
    }

    /// First element of (layer, kv_head, block, row).
    fn at(&self, layer: usize, head: usize, block: usize, row: usize) -> usize {
        let l = &self.layout;
        (((layer * l.kv_heads + head) * l.num_blocks + block) * l.block_size + row) * l.head_dim
    }

    /// Elements of one (layer, head) run of a block.
    fn run(&self) -> usize {
        self.layout.block_size * self.layout.head_dim
    }

    fn check_block(&self, block: usize) -> Result<(), KvError> {
        if block >= self.layout.num_blocks {
            return Err(KvError::Device(format!(
                "block {block} of a pool of {}",
                self.layout.num_blocks
            )));
        }
        Ok(())
    }
}

/// The engine's handle on a device pool shared with the backend that computes into it.
pub struct DeviceBlocks<O: Ops> {
    ops: Arc<O>,
    pool: Arc<Mutex<DevicePool<O>>>,
}

impl<O: Ops> DeviceBlocks<O> {
    pub(crate) fn new(ops: Arc<O>, pool: Arc<Mutex<DevicePool<O>>>) -> Self {
        DeviceBlocks { ops, pool }
    }

    fn lock(&self) -> MutexGuard<'_, DevicePool<O>> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<O: Ops> DeviceKvMemory for DeviceBlocks<O> {
    fn codecs(&self) -> KvDtype {
        KvDtype::F16
    }

    fn bytes_per_token(&self) -> usize {
        let l = self.lock().layout;
        2 * l.layers * l.kv_heads * l.head_dim * 2
    }

    fn allocated_bytes(&self) -> usize {
        2 * self.lock().layout.pool_elems() * 2
    }

    fn block_num_bytes(&self) -> usize {
        self.bytes_per_token() * self.lock().layout.block_size
    }

    fn block_bytes(&self, block: usize) -> Result<Vec<u8>, KvError> {
        let pool = self.lock();
        pool.check_block(block)?;
        let l = pool.layout;
        let mut k = Vec::with_capacity(self.block_num_bytes_of(&pool));
        let mut v = Vec::with_capacity(k.capacity() / 2);
        for layer in 0..l.layers {
            for head in 0..l.kv_heads {
                let at = pool.at(layer, head, block, 0);
                let kr = self
                    .ops
                    .read_range(&pool.k, at, pool.run())
                    .map_err(device)?;
                let vr = self
                    .ops
                    .read_range(&pool.v, at, pool.run())
                    .map_err(device)?;
                k.extend(kr.iter().flat_map(|x| x.to_le_bytes()));
                v.extend(vr.iter().flat_map(|x| x.to_le_bytes()));
            }
        }
        k.extend_from_slice(&v);
        Ok(k)
    }

    fn load_block_bytes(&mut self, block: usize, bytes: &[u8]) -> Result<(), KvError> {
        let mut pool = self.lock();
        pool.check_block(block)?;
        let expected = self.block_num_bytes_of(&pool);
        if bytes.len() != expected {
            return Err(KvError::Device(format!(
                "a block payload of {} bytes, expected {expected}",
                bytes.len()
            )));
        }
        let l = pool.layout;
        let run = pool.run();
        let words: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        let (k, v) = words.split_at(words.len() / 2);
        let pool = &mut *pool;
        for layer in 0..l.layers {
            for head in 0..l.kv_heads {
                let i = layer * l.kv_heads + head;
                let at = pool.at(layer, head, block, 0);
                let src = i * run..(i + 1) * run;
                self.ops
                    .write_range(&mut pool.k, at, &k[src.clone()])
                    .map_err(device)?;
                self.ops
                    .write_range(&mut pool.v, at, &v[src])
                    .map_err(device)?;
            }
        }
        Ok(())
    }

    fn copy_block(&mut self, src: usize, dst: usize, num_rows: usize) -> Result<(), KvError> {
        let mut pool = self.lock();
        pool.check_block(src)?;
        pool.check_block(dst)?;
        let l = pool.layout;
        let len = num_rows.min(l.block_size) * l.head_dim;
        let pool = &mut *pool;
        for layer in 0..l.layers {
            for head in 0..l.kv_heads {
                let (s, d) = (pool.at(layer, head, src, 0), pool.at(layer, head, dst, 0));
                self.ops
                    .copy_range(&mut pool.k, s, d, len)
                    .map_err(device)?;
                self.ops
                    .copy_range(&mut pool.v, s, d, len)
                    .map_err(device)?;
            }
        }
        Ok(())
    }

    fn view(&mut self, tables: Vec<Vec<u32>>) -> Box<dyn KvStore + '_> {
        Box::new(DeviceView { mem: self, tables })
    }
}

impl<O: Ops> DeviceBlocks<O> {
    fn block_num_bytes_of(&self, pool: &DevicePool<O>) -> usize {
        let l = pool.layout;
        2 * l.layers * l.kv_heads * l.block_size * l.head_dim * 2
    }
}

/// One step's view of a device pool. A device backend reads only [`KvStore::device_tables`];
/// the other methods read and write through host copies (correct, slow: for callers that are
/// not the device's forward pass).
struct DeviceView<'a, O: Ops> {
    mem: &'a DeviceBlocks<O>,
    tables: Vec<Vec<u32>>,
}

impl<O: Ops> DeviceView<'_, O> {
    fn block_of(&self, slot: SeqSlot, pos: usize, bs: usize) -> Result<usize, KvError> {
        let table = self
            .tables
            .get(slot.0 as usize)
            .ok_or(KvError::UnknownSlot(slot.0))?;
        table
            .get(pos / bs)
            .map(|&b| b as usize)
            .ok_or(KvError::OutOfCapacity {
                slot: slot.0,
                pos,
                capacity: table.len() * bs,
            })
    }
}

impl<O: Ops> KvStore for DeviceView<'_, O> {
    fn write(
        &mut self,
        layer: usize,
        slot: SeqSlot,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KvError> {
        let mut pool = self.mem.lock();
        let l = pool.layout;
        let block = self.block_of(slot, pos, l.block_size)?;
        pool.check_block(block)?;
        let hd = l.head_dim;
        let pool = &mut *pool;
        for head in 0..l.kv_heads {
            let at = pool.at(layer, head, block, pos % l.block_size);
            let row = |x: &[f32]| -> Vec<u16> {
                x[head * hd..(head + 1) * hd]
                    .iter()
                    .map(|&f| f16::from_f32(f).to_bits())
                    .collect()
            };
            let ops = &self.mem.ops;
            ops.write_range(&mut pool.k, at, &row(k)).map_err(device)?;
            ops.write_range(&mut pool.v, at, &row(v)).map_err(device)?;
        }
        Ok(())
    }

    fn codecs(&self) -> KvDtype {
        KvDtype::F16
    }

    fn for_each_chunk(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        num_positions: usize,
        f: &mut dyn FnMut(usize, KvChunk<'_>),
    ) {
        let pool = self.mem.lock();
        let l = pool.layout;
        let mut first = 0;
        while first < num_positions {
            let Ok(block) = self.block_of(slot, first, l.block_size) else {
                return;
            };
            let n = (num_positions - first).min(l.block_size);
            let at = pool.at(layer, kv_head, block, 0);
            let (Ok(k), Ok(v)) = (
                self.mem.ops.read_range(&pool.k, at, n * l.head_dim),
                self.mem.ops.read_range(&pool.v, at, n * l.head_dim),
            ) else {
                return;
            };
            let k: Vec<f16> = k.into_iter().map(f16::from_bits).collect();
            let v: Vec<f16> = v.into_iter().map(f16::from_bits).collect();
            f(first, KvChunk::F16 { k: &k, v: &v });
            first += n;
        }
    }

    fn device_tables(&self) -> Option<&[Vec<u32>]> {
        Some(&self.tables)
    }
}
