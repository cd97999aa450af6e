//! [`ContiguousKv`]: the simple [`KvStore`] — one contiguous buffer of rows per sequence slot —
//! used by the CLI (`generate`, `perplexity`) and the tests. Owns nothing but those buffers; it
//! never evicts or shares (the engine's paged store does).

use kernels::coded_pair_layout::CodedPairHalf;
use kernels::pair_layout::{PairHalf, PAIR_GROUP_ROWS};
use kernels::ThreadPool;

use crate::kv::{KvChunk, KvDtype, KvError, KvStore, SeqSlot};
use crate::kv_rows::KvRows;

/// One contiguous buffer per slot: rows ordered `[num_layers, num_kv_heads, stride]`, where
/// `stride` is the capacity rounded up to whole groups of a block K codec (`int4c`) or of the
/// bf16 pair layout (16 rows, so every (layer, head) run starts a group). With a block
/// codec, positions are read in groups and the group holding the query reads its f16 rows (see
/// `KvRows::chunk_for`); the f16 staging of sealed groups is released by `KvStore::begin_step`.
pub struct ContiguousKv {
    codecs: KvDtype,
    num_layers: usize,
    num_kv_heads: usize,
    capacity: usize,
    stride: usize,
    slots: Vec<KvRows>,
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
        let stride = match dtype.k.block_tokens() {
            Some(t) if t > 0 => capacity.div_ceil(t) * t,
            _ if crate::kv_rows::grouped_layout(dtype, head_dim) => {
                capacity.div_ceil(PAIR_GROUP_ROWS) * PAIR_GROUP_ROWS
            }
            _ => capacity,
        };
        let rows = num_layers * num_kv_heads * stride;
        let slots = (0..num_slots)
            .map(|_| KvRows::new(dtype, head_dim, rows))
            .collect::<Result<_, _>>()?;
        Ok(ContiguousKv {
            codecs: dtype,
            num_layers,
            num_kv_heads,
            capacity,
            stride,
            slots,
        })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Row index of (layer, head, pos).
    #[inline]
    fn row(&self, layer: usize, kv_head: usize, pos: usize) -> usize {
        (layer * self.num_kv_heads + kv_head) * self.stride + pos
    }

    /// Replaces the K/V of positions `0..num_positions` of `slot` by what a storage tier keeping
    /// them in `through` gives back (encoded to `through`, decoded to this cache's codecs): what
    /// a prefix restored from a lossy tier holds. A no-op when `through` is this cache's codec.
    /// Used to measure lossy tiers (perplexity, greedy agreement); a block codec needs whole
    /// groups.
    pub fn round_trip(
        &mut self,
        slot: SeqSlot,
        num_positions: usize,
        through: KvDtype,
    ) -> Result<(), KvError> {
        let n = num_positions.min(self.capacity);
        let (codecs, hd) = (self.codecs, self.head_dim());
        let codec_err = |e: quant::QuantError| KvError::Codec(e.to_string());
        if let Some(t) = codecs.k.block_tokens() {
            if !n.is_multiple_of(t) {
                return Err(KvError::Codec(format!(
                    "{n} positions are not whole groups of {t} rows"
                )));
            }
        }
        for layer in 0..self.num_layers {
            for h in 0..self.num_kv_heads {
                let base = self.row(layer, h, 0);
                let rows = self
                    .slots
                    .get_mut(slot.0 as usize)
                    .ok_or(KvError::UnknownSlot(slot.0))?;
                let bytes = rows.rows_bytes(base, n);
                let stored =
                    quant::transcode_rows(codecs, through, hd, n, &bytes).map_err(codec_err)?;
                let back =
                    quant::transcode_rows(through, codecs, hd, n, &stored).map_err(codec_err)?;
                rows.load_rows_bytes(base, n, &back);
            }
        }
        Ok(())
    }

    fn head_dim(&self) -> usize {
        self.slots.first().map_or(0, KvRows::head_dim)
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
        let hd = k.len() / self.num_kv_heads;
        let rows: Vec<usize> = (0..self.num_kv_heads)
            .map(|h| self.row(layer, h, pos))
            .collect();
        let buf = self
            .slots
            .get_mut(slot.0 as usize)
            .ok_or(KvError::UnknownSlot(slot.0))?;
        for (h, &row) in rows.iter().enumerate() {
            buf.write(row, &k[h * hd..(h + 1) * hd], &v[h * hd..(h + 1) * hd])?;
        }
        Ok(())
    }

    fn write_step(
        &mut self,
        pool: &ThreadPool,
        layer: usize,
        slots: &[SeqSlot],
        positions: &[u32],
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KvError> {
        assert!(layer < self.num_layers, "layer {layer} out of range");
        let heads = self.num_kv_heads;
        // Each sequence's rows (token-major, then head) in one spread write.
        let mut done = vec![false; slots.len()];
        for first in 0..slots.len() {
            if done[first] {
                continue;
            }
            let slot = slots[first];
            let mut items = Vec::new();
            for t in first..slots.len() {
                if slots[t] != slot {
                    continue;
                }
                done[t] = true;
                let pos = positions[t] as usize;
                if pos >= self.capacity {
                    return Err(KvError::OutOfCapacity {
                        slot: slot.0,
                        pos,
                        capacity: self.capacity,
                    });
                }
                items.extend((0..heads).map(|h| (self.row(layer, h, pos), t * heads + h)));
            }
            self.slots
                .get_mut(slot.0 as usize)
                .ok_or(KvError::UnknownSlot(slot.0))?
                .write_many(pool, &items, k, v)?;
        }
        Ok(())
    }

    fn codecs(&self) -> KvDtype {
        self.codecs
    }

    fn begin_step(&mut self) {
        self.slots.iter_mut().for_each(KvRows::release_sealed);
    }

    fn for_each_chunk(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        num_positions: usize,
        f: &mut dyn FnMut(usize, KvChunk<'_>),
    ) {
        self.for_each_chunk_from(layer, slot, kv_head, 0, num_positions, f)
    }

    /// With a block K codec, starts at the group holding `from` (a tiled reader's segment
    /// would otherwise visit every earlier group's chunk again, to skip it).
    fn for_each_chunk_from(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        from: usize,
        num_positions: usize,
        f: &mut dyn FnMut(usize, KvChunk<'_>),
    ) {
        let n = num_positions.min(self.capacity);
        let rows = &self.slots[slot.0 as usize];
        let base = self.row(layer, kv_head, 0);
        match rows.group_rows() {
            None => rows.with_chunk(base, n, false, |c| f(0, c)),
            Some(t) => {
                let mut pos = from.min(n) / t * t;
                while pos < n {
                    let len = (n - pos).min(t);
                    rows.with_chunk(base + pos, len, pos + len == n, |c| f(pos, c));
                    pos += len;
                }
            }
        }
    }

    #[inline(always)]
    fn pair_group(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        pos: usize,
    ) -> Option<PairHalf<'_>> {
        if pos >= self.stride || layer >= self.num_layers || kv_head >= self.num_kv_heads {
            return None;
        }
        self.slots
            .get(slot.0 as usize)?
            .pair_group(self.row(layer, kv_head, pos))
    }

    #[inline(always)]
    fn coded_pair_group(
        &self,
        layer: usize,
        slot: SeqSlot,
        kv_head: usize,
        pos: usize,
    ) -> Option<CodedPairHalf<'_>> {
        if pos >= self.stride || layer >= self.num_layers || kv_head >= self.num_kv_heads {
            return None;
        }
        self.slots
            .get(slot.0 as usize)?
            .coded_pair_group(self.row(layer, kv_head, pos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(first_pos, positions, own-group f16?)` of every chunk `for_each_chunk_from` visits.
    fn visits(kv: &ContiguousKv, from: usize, n: usize) -> Vec<(usize, usize, bool)> {
        let mut out = Vec::new();
        kv.for_each_chunk_from(0, SeqSlot(0), 1, from, n, &mut |pos, chunk| {
            let f16_k =
                matches!(chunk, KvChunk::Encoded { k, .. } if k.kind() == quant::KvCodecKind::F16);
            out.push((pos, chunk.num_positions(32), f16_k));
        });
        out
    }

    #[test]
    fn chunks_from_a_position_are_the_tail_of_all_chunks() {
        let (heads, hd, n) = (2, 32, 70);
        let mut kv = ContiguousKv::new(
            1,
            1,
            heads,
            hd,
            80,
            KvDtype::parse("k=int4c,v=int4").unwrap(),
        )
        .unwrap();
        for p in 0..n {
            let x: Vec<f32> = (0..heads * hd)
                .map(|i| (i * 7 + p * 3) as f32 % 5.0 - 2.0)
                .collect();
            kv.write(0, SeqSlot(0), p, &x, &x).unwrap();
        }
        let all = visits(&kv, 0, n);
        assert_eq!(all.len(), n.div_ceil(16));
        assert_eq!(
            all.last(),
            Some(&(64, 6, true)),
            "the query's own group reads f16 rows"
        );
        for from in [0, 1, 15, 16, 17, 40, 64, 69, 70, 500] {
            let tail = visits(&kv, from, n);
            let first = from.min(n) / 16;
            assert_eq!(tail, all[first..], "from {from}");
        }
        // Fewer positions: the last chunk visited is the own group (shorter), skipping still holds.
        let short = visits(&kv, 20, 37);
        assert_eq!(short, vec![(16, 16, false), (32, 5, true)]);
    }

    /// A pass's groups in one call are the groups asked for one by one, and the call says
    /// `false` as soon as one is not held (past the store, another layout).
    #[test]
    fn groups_in_one_call_are_the_groups_one_by_one() {
        let (layers, heads, hd, cap) = (2, 2, 64, 80);
        for spec in ["bf16", "k=int8,v=bf16", "f16"] {
            let codecs = KvDtype::parse(spec).unwrap();
            let mut kv = ContiguousKv::new(1, layers, heads, hd, cap, codecs).unwrap();
            for (l, p) in (0..layers).flat_map(|l| (0..cap).map(move |p| (l, p))) {
                let x: Vec<f32> = (0..heads * hd)
                    .map(|i| ((i * 7 + p * 3 + l * 5) % 11) as f32 - 5.0)
                    .collect();
                kv.write(l, SeqSlot(0), p, &x, &x).unwrap();
            }
            let held = spec != "f16";
            for (layer, head, from) in [(0, 0, 0), (1, 1, 16), (1, 0, 48)] {
                let n = (cap.div_ceil(16) * 16 - from) / 16;
                let mut pairs = vec![None; n];
                let mut coded = vec![None; n];
                let ok_pairs = kv.pair_groups(layer, SeqSlot(0), head, from, &mut pairs);
                let ok_coded = kv.coded_pair_groups(layer, SeqSlot(0), head, from, &mut coded);
                assert_eq!(ok_pairs || ok_coded, held, "{spec}");
                for i in 0..n {
                    let pos = from + 16 * i;
                    let one = kv.pair_group(layer, SeqSlot(0), head, pos);
                    if ok_pairs {
                        let (a, b) = (one.unwrap(), pairs[i].unwrap());
                        assert!(std::ptr::eq(a.values(), b.values()), "{spec} {pos}");
                    }
                    let one = kv.coded_pair_group(layer, SeqSlot(0), head, pos);
                    if ok_coded {
                        let (a, b) = (one.unwrap(), coded[i].unwrap());
                        let rows = |g: CodedPairHalf<'_>| {
                            let (mut k, mut v) = (vec![0u8; 16 * (hd + 4)], vec![0u8; 32 * hd]);
                            g.rows(&mut k, &mut v);
                            (k, v)
                        };
                        assert_eq!(rows(a), rows(b), "{spec} {pos}");
                        assert!(i == 0 || b.follows(&coded[i - 1].unwrap()));
                    }
                }
                // One group past the store: not every group is held.
                let mut over = vec![None; n + 1];
                assert!(!kv.pair_groups(layer, SeqSlot(0), head, from, &mut over));
                let mut over = vec![None; n + 1];
                assert!(!kv.coded_pair_groups(layer, SeqSlot(0), head, from, &mut over));
            }
        }
    }
}
