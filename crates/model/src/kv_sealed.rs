//! [`SealedK`]: K rows under a block codec (`int4c`, per-channel 4-bit) — groups of `tokens`
//! rows (one KV head's rows of one block) that are *sealed* (quantised per channel) when their
//! last row is written, with the rows of groups still being filled kept in full precision (f16).
//!
//! Why staging: per-channel parameters need the whole group, and a sequence's output must not
//! depend on batching, chunking or the cache. So a group's sealed bytes are a function of its
//! rows only (sealed once, from the f16 rows, when row `tokens − 1` is written), and what a
//! query reads is a function of its position only: the group holding the query reads f16 rows
//! (its *own* block, see `chunk`), every earlier group reads sealed codes. The f16 rows of a
//! group sealed during a step stay until [`SealedK::release_sealed`] (the start of the next
//! step), because queries of that step inside the group still read them.
//!
//! Owns the sealed bytes, the staging and the sealed flags. Never decides which rows belong to
//! whom, and never holds V (per token, in `KvRows`).

use std::collections::HashMap;

use quant::{EncodedRows, KvCodecKind};

use crate::kv::KvError;
use kernels::par::{try_spread, DisjointRows};
use kernels::ThreadPool;

/// Encodes one group (`out`, its sealed bytes) from its staged f16 rows, through `scratch`.
fn seal_group(
    kind: KvCodecKind,
    hd: usize,
    stage: &[u8],
    scratch: &mut Vec<f32>,
    out: &mut [u8],
) -> Result<(), KvError> {
    scratch.resize(stage.len() / 2, 0.0);
    for (row, bytes) in scratch.chunks_exact_mut(hd).zip(stage.chunks_exact(hd * 2)) {
        quant::decode_row(KvCodecKind::F16, bytes, row)
            .map_err(|e| KvError::Codec(e.to_string()))?;
    }
    quant::channel::encode_group(kind, scratch, hd, out).map_err(|e| KvError::Codec(e.to_string()))
}

/// Sealed K groups plus f16 staging (see the module doc).
pub(crate) struct SealedK {
    kind: KvCodecKind,
    head_dim: usize,
    tokens: usize,
    group_bytes: usize,
    /// `num_groups × group_bytes` sealed bytes.
    sealed: Vec<u8>,
    /// Whether each group's sealed bytes are those of its current rows.
    is_sealed: Vec<bool>,
    /// F16-codec bytes (`tokens × head_dim × 2`) of groups being filled or sealed this step.
    staged: HashMap<usize, Vec<u8>>,
    /// Groups sealed since the last `release_sealed` whose staging is still kept.
    sealed_this_step: Vec<usize>,
    scratch: Vec<f32>,
}

impl SealedK {
    /// `num_rows` rows (a multiple of the codec's group).
    pub(crate) fn new(
        kind: KvCodecKind,
        head_dim: usize,
        num_rows: usize,
    ) -> Result<Self, KvError> {
        let tokens = kind
            .block_tokens()
            .ok_or_else(|| KvError::Codec(format!("{kind} is not a block codec")))?;
        if !num_rows.is_multiple_of(tokens) {
            return Err(KvError::Codec(format!(
                "{kind} stores whole groups of {tokens} rows; {num_rows} rows is not a multiple \
                 (the KV block size must be {tokens})"
            )));
        }
        let group_bytes = kind.bytes_per_group(head_dim).expect("block codec");
        let num_groups = num_rows / tokens;
        let mut sealed = vec![0u8; num_groups * group_bytes];
        kernels::hugepages::advise_huge_pages(&mut sealed);
        Ok(SealedK {
            kind,
            head_dim,
            tokens,
            group_bytes,
            sealed,
            is_sealed: vec![false; num_groups],
            staged: HashMap::new(),
            sealed_this_step: Vec::new(),
            scratch: Vec::new(),
        })
    }

    /// Maps the sealed bytes' pages now ([`crate::KvRows::prefault`]); the bytes mapped.
    pub(crate) fn prefault(&mut self) -> usize {
        if kernels::hugepages::prefault_pages(&mut self.sealed) {
            self.sealed.len()
        } else {
            0
        }
    }

    pub(crate) fn tokens(&self) -> usize {
        self.tokens
    }

    /// Bytes of the sealed store (the pool's accounted K memory).
    pub(crate) fn sealed_bytes(&self) -> usize {
        self.sealed.len()
    }

    /// Bytes held by f16 staging right now (transient; not part of the pool's accounting).
    pub(crate) fn staged_bytes(&self) -> usize {
        self.staged.values().map(Vec::len).sum()
    }

    fn stage_len(&self) -> usize {
        self.tokens * self.head_dim * 2
    }

    /// Stores K of `row`; seals its group when `row` is the group's last.
    pub(crate) fn write(&mut self, row: usize, k: &[f32]) -> Result<(), KvError> {
        if let Some(g) = self.stage(row, k)? {
            let stage = &self.staged[&g];
            let out = &mut self.sealed[g * self.group_bytes..(g + 1) * self.group_bytes];
            seal_group(self.kind, self.head_dim, stage, &mut self.scratch, out)?;
            self.is_sealed[g] = true;
            self.sealed_this_step.push(g);
        }
        Ok(())
    }

    /// [`SealedK::write`] of `items` (`(row, source row of k)`, `k` being `[*, head_dim]`) in
    /// order, the groups they complete sealed over `pool` once every row is staged (the same
    /// bytes: a group's rows come in increasing order, so its last row is written last). Rows
    /// must be distinct.
    pub(crate) fn write_many(
        &mut self,
        pool: &ThreadPool,
        items: &[(usize, usize)],
        k: &[f32],
    ) -> Result<(), KvError> {
        let hd = self.head_dim;
        let mut full = Vec::new();
        for &(row, src) in items {
            full.extend(self.stage(row, &k[src * hd..(src + 1) * hd])?);
        }
        {
            let (kind, staged) = (self.kind, &self.staged);
            let sealed = DisjointRows::new(&mut self.sealed, self.group_bytes);
            let full = &full;
            try_spread(pool, full.len(), 1, &|i| {
                let g = full[i];
                // SAFETY: a group's last row is written once (rows are distinct), so `full`
                // holds each group once and each task writes its own groups' bytes.
                let out = unsafe { sealed.row_mut(g) };
                seal_group(kind, hd, &staged[&g], &mut Vec::new(), out)
            })?;
        }
        for g in full {
            self.is_sealed[g] = true;
            self.sealed_this_step.push(g);
        }
        Ok(())
    }

    /// Writes K of `row` into its group's f16 staging; returns the group when `row` is its
    /// last (to be sealed).
    fn stage(&mut self, row: usize, k: &[f32]) -> Result<Option<usize>, KvError> {
        let (g, r) = (row / self.tokens, row % self.tokens);
        let (hd, len) = (self.head_dim, self.stage_len());
        let stage = self.staged.entry(g).or_insert_with(|| vec![0u8; len]);
        quant::encode_row(
            KvCodecKind::F16,
            k,
            &mut stage[r * hd * 2..(r + 1) * hd * 2],
        )
        .map_err(|e| KvError::Codec(e.to_string()))?;
        self.is_sealed[g] = false;
        Ok((r + 1 == self.tokens).then_some(g))
    }

    /// Drops the f16 rows of groups sealed since the last call (no query of a later step reads
    /// a sealed group's own rows: later positions lie in later groups).
    pub(crate) fn release_sealed(&mut self) {
        for g in self.sealed_this_step.drain(..) {
            if self.is_sealed[g] {
                self.staged.remove(&g);
            }
        }
    }

    /// Rows `first..first + n` (inside one group) for attention: the f16 rows when `own` (the
    /// group holding the query) and they are staged, else the sealed codes.
    #[inline]
    pub(crate) fn chunk(&self, first: usize, n: usize, own: bool) -> EncodedRows<'_> {
        let (g, r) = (first / self.tokens, first % self.tokens);
        assert!(r + n <= self.tokens, "a chunk stays inside one group");
        let hd = self.head_dim;
        // The staging is only looked up when it may be read (a sealed earlier group, the
        // common case at depth, skips the hash lookup).
        if own || !self.is_sealed[g] {
            if let Some(stage) = self.staged.get(&g) {
                return EncodedRows::new(
                    KvCodecKind::F16,
                    hd,
                    &stage[r * hd * 2..(r + n) * hd * 2],
                )
                .expect("f16 rows");
            }
        }
        let bytes = &self.sealed[g * self.group_bytes..(g + 1) * self.group_bytes];
        let (params, codes) = quant::channel::split_group(bytes, hd);
        EncodedRows::new_group(self.kind, hd, params, &codes[r * hd / 2..(r + n) * hd / 2])
            .expect("a validated block codec")
    }

    /// Copies rows `src..src + n` of one group over rows `dst..dst + n` of another (both group
    /// starts): staging and, for a whole sealed group, its sealed bytes.
    pub(crate) fn copy_rows(&mut self, src: usize, dst: usize, n: usize) {
        let t = self.tokens;
        assert!(src.is_multiple_of(t) && dst.is_multiple_of(t) && n <= t);
        let (gs, gd) = (src / t, dst / t);
        let len = self.stage_len();
        match self
            .staged
            .get(&gs)
            .map(|s| s[..n * self.head_dim * 2].to_vec())
        {
            Some(rows) => {
                let d = self.staged.entry(gd).or_insert_with(|| vec![0u8; len]);
                d[..rows.len()].copy_from_slice(&rows);
            }
            None => {
                self.staged.remove(&gd);
            }
        }
        let gb = self.group_bytes;
        self.sealed.copy_within(gs * gb..(gs + 1) * gb, gd * gb);
        self.is_sealed[gd] = self.is_sealed[gs] && n == t;
    }

    /// Sealed bytes of groups `first_group..first_group + n` (whole blocks; tiers store only
    /// full blocks, whose groups are sealed).
    pub(crate) fn groups_bytes(&self, first_group: usize, n: usize, out: &mut Vec<u8>) {
        debug_assert!(
            self.is_sealed[first_group..first_group + n]
                .iter()
                .all(|&s| s),
            "serialising a group that is still being filled"
        );
        let gb = self.group_bytes;
        out.extend_from_slice(&self.sealed[first_group * gb..(first_group + n) * gb]);
    }

    /// Overwrites groups from [`SealedK::groups_bytes`] output: they are sealed, not staged.
    pub(crate) fn load_groups_bytes(&mut self, first_group: usize, bytes: &[u8]) {
        let gb = self.group_bytes;
        let n = bytes.len() / gb;
        self.sealed[first_group * gb..(first_group + n) * gb].copy_from_slice(bytes);
        for g in first_group..first_group + n {
            self.is_sealed[g] = true;
            self.staged.remove(&g);
        }
    }
}
