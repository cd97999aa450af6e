//! [`KvRows`]: K and V rows of one codec pair in flat buffers — the storage both the contiguous
//! cache (`kv.rs`) and the engine's paged memory are built on.
//!
//! A row is one token × one KV head (`head_dim` values). f32 and f16 codecs are stored as typed
//! values; bf16 K with bf16 V in groups of 16 rows laid out as the bf16-pair tile step reads
//! them (`kernels::pair_layout`: a decode attends them in place, never transposing a tile);
//! `int8` K (one group per row) with bf16 V likewise as the int8-scored pair step reads them
//! (`kernels::coded_pair_layout`); every other `quant` codec as encoded bytes (scales
//! included). Owns writing a row,
//! handing out runs of rows as a [`KvChunk`] (buffers on huge pages where the OS allows,
//! `hugepages`) and whole groups of the pair layout, copying rows, and serialising runs of rows
//! (for the storage tiers; rows serialise as the codecs' row-major rows in every layout).
//! Never decides which rows belong to whom.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use kernels::coded_pair_layout::{self, coded_key_words, CodedPairHalf, CODED_PARAMS};
use kernels::flash_tile_codes::KeyCodes;
use kernels::pair_layout::{self, group_words, PairHalf, PAIR_GROUP_ROWS};
use kernels::pair_layout_groups::{group_from_le_bytes, group_to_le_bytes};
use quant::EncodedRows;
use quant::KvCodecKind;

use crate::kv::{KvChunk, KvDtype, KvError, KvLayout};
use crate::kv_sealed::SealedK;
use kernels::hugepages::{advise_huge_pages, prefault_pages, zeroed_vec};
use kernels::par::{try_spread, DisjointRows};
use kernels::ThreadPool;

enum RowBuf {
    F32 {
        k: Vec<f32>,
        v: Vec<f32>,
    },
    F16 {
        k: Vec<f16>,
        v: Vec<f16>,
    },
    Encoded {
        k: Vec<u8>,
        v: Vec<u8>,
        k_row_bytes: usize,
        v_row_bytes: usize,
    },
    /// K in a block codec (`int4c`: sealed groups + f16 staging), V encoded per row.
    Sealed {
        k: SealedK,
        v: Vec<u8>,
        v_row_bytes: usize,
    },
    /// bf16 K and V (each value `quant`'s bf16 encoding) in groups of [`PAIR_GROUP_ROWS`] rows
    /// in the pair layout: row `r` is row `r % 16` of group `r / 16`, whose K and V words are
    /// `[group_words · (r / 16)..]` of `k` and `v`.
    Bf16Pairs {
        k: Vec<u32>,
        v: Vec<u32>,
    },
    /// `int8` K (one group per row) with bf16 V in groups of [`PAIR_GROUP_ROWS`] rows in
    /// `kernels::coded_pair_layout`: group `g`'s K code words are `[coded_key_words · g..]` of
    /// `k`, its f16 scales and offsets `[CODED_PARAMS · g..]` of `k_params`, its V words
    /// `[group_words · g..]` of `v`.
    Int8Pairs {
        k: Vec<u32>,
        k_params: Vec<f16>,
        v: Vec<u32>,
    },
}

/// Whether `codecs` are stored in the pair layout (bf16 K and bf16 V).
pub fn pair_layout_codecs(codecs: KvDtype) -> bool {
    codecs.k == KvCodecKind::Bf16 && codecs.v == KvCodecKind::Bf16
}

/// Whether `codecs` with heads of `head_dim` are stored in the coded pair layout (`int8` K with
/// one group per row, bf16 V: `kernels::coded_pair_layout`).
pub fn coded_pair_layout_codecs(codecs: KvDtype, head_dim: usize) -> bool {
    codecs.v == KvCodecKind::Bf16
        && KeyCodes::of(codecs.k, head_dim) == Some(KeyCodes::Rows)
        && coded_pair_layout::fits(head_dim)
}

/// Whether rows of `codecs` with heads of `head_dim` are kept in groups of
/// [`PAIR_GROUP_ROWS`] (either pair layout): stores then round their rows to whole groups.
pub fn grouped_layout(codecs: KvDtype, head_dim: usize) -> bool {
    (pair_layout_codecs(codecs) && head_dim <= PAIR_MAX_HEAD_DIM)
        || coded_pair_layout_codecs(codecs, head_dim)
}

/// The largest head size whose rows [`KvRows`] encodes on the stack in the pair layout.
const PAIR_MAX_HEAD_DIM: usize = 512;

/// The largest `int8` row (one group: f16 scale and offset, then `head_dim` codes) the coded
/// pair layout encodes on the stack.
const CODED_ROW_MAX_BYTES: usize = coded_pair_layout::INT8_PARAM_BYTES + PAIR_MAX_HEAD_DIM;

/// Fewest rows [`KvRows::write_many`] encodes over the pool (a decode step's few rows are
/// encoded by the caller: a dispatch would cost more).
const PAR_WRITE_MIN_ROWS: usize = 32;
/// Rows per run of that spread, at least.
const ENCODE_RUN_ROWS: usize = 8;

/// `num_rows` K rows and V rows of `head_dim` values under `codecs`.
pub struct KvRows {
    codecs: KvDtype,
    head_dim: usize,
    num_rows: usize,
    buf: RowBuf,
}

/// `n` zeroes the allocator maps lazily (`vec![0; n]`), backed by huge pages when first touched
/// (or when [`KvRows::prefault`] maps them).
fn lazy_zeroes<T: Copy + Default>(n: usize) -> Vec<T> {
    let mut v = vec![T::default(); n];
    advise_huge_pages(&mut v);
    v
}

impl KvRows {
    /// Maps every page of the store's lazily allocated buffers now
    /// (`kernels::hugepages::prefault_pages`), so no later write stops to fault one in and zero
    /// it — what a long-running server wants of its pool, paid once at start. Contents never
    /// change. Returns the bytes mapped (0 where the system does not support it).
    pub fn prefault(&mut self) -> usize {
        fn one<T>(buf: &mut [T]) -> usize {
            if prefault_pages(buf) {
                std::mem::size_of_val(buf)
            } else {
                0
            }
        }
        match &mut self.buf {
            RowBuf::F32 { k, v } => one(k) + one(v),
            RowBuf::F16 { .. } => 0, // written at construction: already mapped
            RowBuf::Encoded { k, v, .. } => one(k) + one(v),
            RowBuf::Sealed { k, v, .. } => k.prefault() + one(v),
            RowBuf::Bf16Pairs { k, v } => one(k) + one(v),
            RowBuf::Int8Pairs { k, v, .. } => one(k) + one(v),
        }
    }

    /// Zeroed rows; fails when the codecs do not fit `head_dim`.
    pub fn new(codecs: KvDtype, head_dim: usize, num_rows: usize) -> Result<Self, KvError> {
        let n = num_rows * head_dim;
        let layout = KvLayout::of(codecs, head_dim)?;
        if pair_layout_codecs(codecs) && head_dim <= PAIR_MAX_HEAD_DIM {
            let words = num_rows.div_ceil(PAIR_GROUP_ROWS) * group_words(head_dim);
            return Ok(KvRows {
                codecs,
                head_dim,
                num_rows,
                buf: RowBuf::Bf16Pairs {
                    k: lazy_zeroes(words),
                    v: lazy_zeroes(words),
                },
            });
        }
        if coded_pair_layout_codecs(codecs, head_dim) {
            let groups = num_rows.div_ceil(PAIR_GROUP_ROWS);
            return Ok(KvRows {
                codecs,
                head_dim,
                num_rows,
                buf: RowBuf::Int8Pairs {
                    k: lazy_zeroes(groups * coded_key_words(head_dim)),
                    k_params: zeroed_vec(groups * CODED_PARAMS, f16::ZERO),
                    v: lazy_zeroes(groups * group_words(head_dim)),
                },
            });
        }
        if codecs.k.is_block() {
            let v_row_bytes = codecs.v.bytes_per_row(head_dim);
            return Ok(KvRows {
                codecs,
                head_dim,
                num_rows,
                buf: RowBuf::Sealed {
                    k: SealedK::new(codecs.k, head_dim, num_rows)?,
                    v: lazy_zeroes(num_rows * v_row_bytes),
                    v_row_bytes,
                },
            });
        }
        let buf = match layout {
            KvLayout::F32 => RowBuf::F32 {
                k: lazy_zeroes(n),
                v: lazy_zeroes(n),
            },
            KvLayout::F16 => RowBuf::F16 {
                k: zeroed_vec(n, f16::ZERO),
                v: zeroed_vec(n, f16::ZERO),
            },
            KvLayout::Encoded {
                k_row_bytes,
                v_row_bytes,
            } => RowBuf::Encoded {
                k: lazy_zeroes(num_rows * k_row_bytes),
                v: lazy_zeroes(num_rows * v_row_bytes),
                k_row_bytes,
                v_row_bytes,
            },
        };
        Ok(KvRows {
            codecs,
            head_dim,
            num_rows,
            buf,
        })
    }

    pub fn codecs(&self) -> KvDtype {
        self.codecs
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    pub fn num_rows(&self) -> usize {
        self.num_rows
    }

    /// Rows per sealed group when K uses a block codec (`int4c`): chunks must then stay inside
    /// one group, and the store says which group holds the query (see [`KvRows::chunk_for`]).
    pub fn group_rows(&self) -> Option<usize> {
        match &self.buf {
            RowBuf::Sealed { k, .. } => Some(k.tokens()),
            _ => None,
        }
    }

    /// Bytes of f16 staging held for K groups being filled (block codecs; 0 otherwise). Transient
    /// and not part of [`KvRows::allocated_bytes`].
    pub fn staged_bytes(&self) -> usize {
        match &self.buf {
            RowBuf::Sealed { k, .. } => k.staged_bytes(),
            _ => 0,
        }
    }

    /// Drops the f16 staging of K groups sealed since the last call; call at the start of a
    /// step (block codecs; a no-op otherwise).
    pub fn release_sealed(&mut self) {
        if let RowBuf::Sealed { k, .. } = &mut self.buf {
            k.release_sealed();
        }
    }

    /// Bytes of one K row plus one V row.
    pub fn row_pair_bytes(&self) -> usize {
        self.codecs.k.bytes_per_row(self.head_dim) + self.codecs.v.bytes_per_row(self.head_dim)
    }

    /// Bytes held by the buffers (`num_rows · row_pair_bytes()`; the pair layouts round the
    /// rows up to whole groups of 16).
    pub fn allocated_bytes(&self) -> usize {
        match &self.buf {
            RowBuf::F32 { k, v } => (k.len() + v.len()) * 4,
            RowBuf::F16 { k, v } => (k.len() + v.len()) * 2,
            RowBuf::Encoded { k, v, .. } => k.len() + v.len(),
            RowBuf::Sealed { k, v, .. } => k.sealed_bytes() + v.len(),
            RowBuf::Bf16Pairs { k, v } => (k.len() + v.len()) * 4,
            RowBuf::Int8Pairs { k, k_params, v } => (k.len() + v.len()) * 4 + k_params.len() * 2,
        }
    }

    /// Whether rows are kept in groups of 16 (either pair layout): then whole groups from a
    /// multiple of 16 are read in place ([`KvRows::pair_group`], [`KvRows::coded_pair_group`]).
    pub fn is_pair_layout(&self) -> bool {
        matches!(
            self.buf,
            RowBuf::Bf16Pairs { .. } | RowBuf::Int8Pairs { .. }
        )
    }

    /// The group of the coded pair layout holding rows `first..first + 16` (`first` a multiple
    /// of 16, the group inside the buffer), read in place; `None` in other layouts or for
    /// another `first`. Rows of the group never written hold zeros or stale words.
    #[inline(always)]
    pub fn coded_pair_group(&self, first: usize) -> Option<CodedPairHalf<'_>> {
        let RowBuf::Int8Pairs { k, k_params, v } = &self.buf else {
            return None;
        };
        let (kw, vw) = (coded_key_words(self.head_dim), group_words(self.head_dim));
        let g = first / PAIR_GROUP_ROWS;
        if !first.is_multiple_of(PAIR_GROUP_ROWS) || (g + 1) * kw > k.len() {
            return None;
        }
        Some(CodedPairHalf::new(
            self.head_dim,
            &k[g * kw..(g + 1) * kw],
            &k_params[g * CODED_PARAMS..(g + 1) * CODED_PARAMS],
            &v[g * vw..(g + 1) * vw],
        ))
    }

    /// The group of the pair layout holding rows `first..first + 16` (`first` a multiple of
    /// 16, the group inside the buffer), read in place; `None` in other layouts or for another
    /// `first`. Rows of the group never written hold zeros or stale words.
    #[inline(always)]
    pub fn pair_group(&self, first: usize) -> Option<PairHalf<'_>> {
        let RowBuf::Bf16Pairs { k, v } = &self.buf else {
            return None;
        };
        let w = group_words(self.head_dim);
        let g = first / PAIR_GROUP_ROWS;
        if !first.is_multiple_of(PAIR_GROUP_ROWS) || (g + 1) * w > k.len() {
            return None;
        }
        Some(PairHalf::new(
            self.head_dim,
            &k[g * w..(g + 1) * w],
            &v[g * w..(g + 1) * w],
        ))
    }

    /// Stores one token's K and V (`[head_dim]` each) at `row`.
    pub fn write(&mut self, row: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
        assert!(row < self.num_rows, "row {row} out of {}", self.num_rows);
        let hd = self.head_dim;
        let codecs = self.codecs;
        match &mut self.buf {
            RowBuf::F32 { k: kb, v: vb } => {
                kb[row * hd..(row + 1) * hd].copy_from_slice(k);
                vb[row * hd..(row + 1) * hd].copy_from_slice(v);
            }
            RowBuf::F16 { k: kb, v: vb } => {
                // `f16::from_f32` per element, eight at a time with F16C where present.
                kb[row * hd..(row + 1) * hd].convert_from_f32_slice(&k[..hd]);
                vb[row * hd..(row + 1) * hd].convert_from_f32_slice(&v[..hd]);
            }
            RowBuf::Encoded {
                k: kb,
                v: vb,
                k_row_bytes: kr,
                v_row_bytes: vr,
            } => {
                let (kr, vr) = (*kr, *vr);
                quant::encode_row(codecs.k, k, &mut kb[row * kr..(row + 1) * kr])
                    .map_err(|e| KvError::Codec(e.to_string()))?;
                quant::encode_row(codecs.v, v, &mut vb[row * vr..(row + 1) * vr])
                    .map_err(|e| KvError::Codec(e.to_string()))?;
            }
            RowBuf::Sealed {
                k: kb,
                v: vb,
                v_row_bytes: vr,
            } => {
                let vr = *vr;
                quant::encode_row(codecs.v, v, &mut vb[row * vr..(row + 1) * vr])
                    .map_err(|e| KvError::Codec(e.to_string()))?;
                kb.write(row, k)?;
            }
            RowBuf::Bf16Pairs { k: kb, v: vb } => {
                let mut ks = [bf16::ZERO; PAIR_MAX_HEAD_DIM];
                let mut vs = [bf16::ZERO; PAIR_MAX_HEAD_DIM];
                encode_bf16(&k[..hd], &mut ks[..hd])?;
                encode_bf16(&v[..hd], &mut vs[..hd])?;
                write_pair_row(kb, vb, row, &ks[..hd], &vs[..hd]);
            }
            RowBuf::Int8Pairs { .. } => {
                let mut k_row = [0u8; CODED_ROW_MAX_BYTES];
                let k_row = &mut k_row[..codecs.k.bytes_per_row(hd)];
                let mut vs = [bf16::ZERO; PAIR_MAX_HEAD_DIM];
                quant::encode_row(codecs.k, k, k_row).map_err(|e| KvError::Codec(e.to_string()))?;
                encode_bf16(&v[..hd], &mut vs[..hd])?;
                self.write_coded_row(row, k_row, &vs[..hd]);
            }
        }
        Ok(())
    }

    /// Writes row `row` of the coded pair layout from its `int8` codec bytes and bf16 V.
    fn write_coded_row(&mut self, row: usize, k_row: &[u8], v: &[bf16]) {
        let hd = self.head_dim;
        let RowBuf::Int8Pairs { k, k_params, v: vb } = &mut self.buf else {
            unreachable!("the coded pair layout");
        };
        let (g, kw, vw) = (row / PAIR_GROUP_ROWS, coded_key_words(hd), group_words(hd));
        coded_pair_layout::write_row(
            &mut k[g * kw..(g + 1) * kw],
            &mut k_params[g * CODED_PARAMS..(g + 1) * CODED_PARAMS],
            &mut vb[g * vw..(g + 1) * vw],
            row % PAIR_GROUP_ROWS,
            k_row,
            v,
        );
    }

    /// Rows `first..first + n` of the coded pair layout as the codecs' row bytes: all K rows
    /// (`int8`), then all V rows (bf16).
    fn coded_rows_bytes(&self, first: usize, n: usize, out: &mut Vec<u8>) {
        let hd = self.head_dim;
        let kr = self.codecs.k.bytes_per_row(hd);
        let at = out.len();
        out.resize(at + n * (kr + 2 * hd), 0);
        let (ko, vo) = out[at..].split_at_mut(n * kr);
        let mut v = [bf16::ZERO; PAIR_MAX_HEAD_DIM];
        let mut r = 0;
        while r < n {
            let row = first + r;
            let group = self
                .coded_pair_group(row / PAIR_GROUP_ROWS * PAIR_GROUP_ROWS)
                .expect("the coded pair layout");
            if row.is_multiple_of(PAIR_GROUP_ROWS) && n - r >= PAIR_GROUP_ROWS {
                // A whole group at once (`coded_pair_layout::group_to_rows`).
                let m = PAIR_GROUP_ROWS;
                group.rows(
                    &mut ko[r * kr..(r + m) * kr],
                    &mut vo[r * 2 * hd..(r + m) * 2 * hd],
                );
                r += m;
                continue;
            }
            group.row(
                row % PAIR_GROUP_ROWS,
                &mut ko[r * kr..(r + 1) * kr],
                &mut v[..hd],
            );
            plain_to_le_bytes(&v[..hd], &mut vo[r * 2 * hd..(r + 1) * 2 * hd], |x| {
                x.to_le_bytes()
            });
            r += 1;
        }
    }

    /// Overwrites rows `first..first + n` of the coded pair layout from the codecs' row bytes
    /// ([`KvRows::coded_rows_bytes`]).
    fn load_coded_rows_bytes(&mut self, first: usize, n: usize, bytes: &[u8]) {
        let hd = self.head_dim;
        let kr = self.codecs.k.bytes_per_row(hd);
        let (kb, vb) = bytes.split_at(n * kr);
        let mut v = [bf16::ZERO; PAIR_MAX_HEAD_DIM];
        let (kw, vw) = (coded_key_words(hd), group_words(hd));
        let mut r = 0;
        while r < n {
            let row = first + r;
            if row.is_multiple_of(PAIR_GROUP_ROWS) && n - r >= PAIR_GROUP_ROWS {
                // A whole group at once (`coded_pair_layout::group_from_rows`).
                let (m, g) = (PAIR_GROUP_ROWS, row / PAIR_GROUP_ROWS);
                let RowBuf::Int8Pairs {
                    k,
                    k_params,
                    v: words,
                } = &mut self.buf
                else {
                    unreachable!("the coded pair layout");
                };
                coded_pair_layout::group_from_rows(
                    &kb[r * kr..(r + m) * kr],
                    &vb[r * 2 * hd..(r + m) * 2 * hd],
                    &mut k[g * kw..(g + 1) * kw],
                    &mut k_params[g * CODED_PARAMS..(g + 1) * CODED_PARAMS],
                    &mut words[g * vw..(g + 1) * vw],
                    hd,
                );
                r += m;
                continue;
            }
            plain_from_le_bytes(
                &vb[r * 2 * hd..(r + 1) * 2 * hd],
                &mut v[..hd],
                bf16::from_le_bytes,
            );
            self.write_coded_row(row, &kb[r * kr..(r + 1) * kr], &v[..hd]);
            r += 1;
        }
    }

    /// Row `row`'s K and V as bf16 (the pair layout; `None` in another).
    fn pair_row(&self, row: usize, k: &mut [bf16], v: &mut [bf16]) -> Option<()> {
        let RowBuf::Bf16Pairs { k: kb, v: vb } = &self.buf else {
            return None;
        };
        let (g, w) = (row / PAIR_GROUP_ROWS, group_words(k.len()));
        let group = g * w..(g + 1) * w;
        pair_layout::read_row(&kb[group.clone()], &vb[group], row % PAIR_GROUP_ROWS, k, v);
        Some(())
    }

    /// Rows `first..first + n` of the pair layout as row-major bf16 bytes: all K rows, then
    /// all V rows (`quant`'s bf16 rows).
    fn pair_rows_bytes(&self, first: usize, n: usize, out: &mut Vec<u8>) {
        let hd = self.head_dim;
        let (mut k, mut v) = (
            [bf16::ZERO; PAIR_MAX_HEAD_DIM],
            [bf16::ZERO; PAIR_MAX_HEAD_DIM],
        );
        let at = out.len();
        out.resize(at + 4 * n * hd, 0);
        let (ko, vo) = out[at..].split_at_mut(2 * n * hd);
        let mut r = 0;
        while r < n {
            if let Some(rows) = self.whole_group_at(first + r, n - r) {
                // A whole group at once (`pair_layout_groups`: transposes, not a row at a time).
                let RowBuf::Bf16Pairs { k: kb, v: vb } = &self.buf else {
                    unreachable!("the pair layout");
                };
                let span = r * 2 * hd..(r + PAIR_GROUP_ROWS) * 2 * hd;
                group_to_le_bytes(
                    &kb[rows.clone()],
                    &vb[rows],
                    &mut ko[span.clone()],
                    &mut vo[span],
                    hd,
                );
                r += PAIR_GROUP_ROWS;
                continue;
            }
            self.pair_row(first + r, &mut k[..hd], &mut v[..hd])
                .expect("the pair layout");
            for (src, dst) in [(&k, &mut *ko), (&v, &mut *vo)] {
                plain_to_le_bytes(&src[..hd], &mut dst[r * 2 * hd..(r + 1) * 2 * hd], |x| {
                    x.to_le_bytes()
                });
            }
            r += 1;
        }
    }

    /// The words of the pair-layout group that starts at `row`, when a group starts there and
    /// its 16 rows lie within the `left` rows to convert (a tier's whole block); `None` else.
    fn whole_group_at(&self, row: usize, left: usize) -> Option<std::ops::Range<usize>> {
        let w = group_words(self.head_dim);
        let g = row / PAIR_GROUP_ROWS;
        (row.is_multiple_of(PAIR_GROUP_ROWS)
            && left >= PAIR_GROUP_ROWS
            && (g + 1) * w <= self.num_groups_words())
        .then(|| g * w..(g + 1) * w)
    }

    /// Words of K (as of V) the pair layout's buffers hold; 0 in another layout.
    fn num_groups_words(&self) -> usize {
        match &self.buf {
            RowBuf::Bf16Pairs { k, .. } => k.len(),
            _ => 0,
        }
    }

    /// [`KvRows::write`] of every `(row, src)` of `items` in order — K and V of source row `src`
    /// of `k` and `v` (`[*, head_dim]`) into `row` — the same bytes, with the encoding spread
    /// over `pool` for encoded codecs (rows encoded in parallel; groups of a block K codec
    /// staged in order, then the groups they complete sealed in parallel). A group's rows
    /// come in increasing order (as a step writes positions). Few items, repeated rows or
    /// typed (f32, f16) rows are written one after the other.
    pub fn write_many(
        &mut self,
        pool: &ThreadPool,
        items: &[(usize, usize)],
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KvError> {
        let hd = self.head_dim;
        // Typed rows, and bf16 rows in the pair layout (groups interleave rows: encoded one
        // after the other; bf16 encoding is a rounding per value).
        let typed = matches!(
            self.buf,
            RowBuf::F32 { .. }
                | RowBuf::F16 { .. }
                | RowBuf::Bf16Pairs { .. }
                | RowBuf::Int8Pairs { .. }
        );
        let distinct = || {
            let mut rows: Vec<usize> = items.iter().map(|&(r, _)| r).collect();
            rows.sort_unstable();
            rows.windows(2).all(|w| w[0] != w[1])
        };
        if typed || items.len() < PAR_WRITE_MIN_ROWS || pool.num_threads() < 2 || !distinct() {
            for &(row, src) in items {
                self.write(
                    row,
                    &k[src * hd..(src + 1) * hd],
                    &v[src * hd..(src + 1) * hd],
                )?;
            }
            return Ok(());
        }
        for &(row, src) in items {
            assert!(row < self.num_rows, "row {row} out of {}", self.num_rows);
            assert!(
                (src + 1) * hd <= k.len().min(v.len()),
                "source row {src} out of K/V"
            );
        }
        let codecs = self.codecs;
        let codec_err = |e: quant::QuantError| KvError::Codec(e.to_string());
        match &mut self.buf {
            RowBuf::Encoded {
                k: kb,
                v: vb,
                k_row_bytes,
                v_row_bytes,
            } => {
                let (kd, vd) = (
                    DisjointRows::new(kb, *k_row_bytes),
                    DisjointRows::new(vb, *v_row_bytes),
                );
                try_spread(pool, items.len(), ENCODE_RUN_ROWS, &|i| {
                    let (row, src) = items[i];
                    // SAFETY: the rows are distinct (checked above): one task per row.
                    let (ko, vo) = unsafe { (kd.row_mut(row), vd.row_mut(row)) };
                    quant::encode_row(codecs.k, &k[src * hd..(src + 1) * hd], ko)
                        .and_then(|()| {
                            quant::encode_row(codecs.v, &v[src * hd..(src + 1) * hd], vo)
                        })
                        .map_err(codec_err)
                })
            }
            RowBuf::Sealed {
                k: kb,
                v: vb,
                v_row_bytes,
            } => {
                let vd = DisjointRows::new(vb, *v_row_bytes);
                try_spread(pool, items.len(), ENCODE_RUN_ROWS, &|i| {
                    let (row, src) = items[i];
                    // SAFETY: the rows are distinct (checked above): one task per row.
                    let vo = unsafe { vd.row_mut(row) };
                    quant::encode_row(codecs.v, &v[src * hd..(src + 1) * hd], vo).map_err(codec_err)
                })?;
                kb.write_many(pool, items, k)
            }
            RowBuf::F32 { .. }
            | RowBuf::F16 { .. }
            | RowBuf::Bf16Pairs { .. }
            | RowBuf::Int8Pairs { .. } => {
                unreachable!("typed and pair-layout rows are written above")
            }
        }
    }

    /// Asks the CPU to bring rows `first..first + n` (K and V) into cache ahead of a read; no
    /// effect on any result. A no-op off x86-64.
    pub fn prefetch(&self, first: usize, n: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let hd = self.head_dim;
            let bytes_of = |x: &[u8]| (x.as_ptr(), x.len());
            let ((k, k_bytes), (v, v_bytes)): ((*const u8, usize), (*const u8, usize)) =
                match &self.buf {
                    RowBuf::F32 { k, v } => {
                        let r = first * hd..(first + n) * hd;
                        (
                            (k[r.clone()].as_ptr().cast(), n * hd * 4),
                            (v[r].as_ptr().cast(), n * hd * 4),
                        )
                    }
                    RowBuf::F16 { k, v } => {
                        let r = first * hd..(first + n) * hd;
                        (
                            (k[r.clone()].as_ptr().cast(), n * hd * 2),
                            (v[r].as_ptr().cast(), n * hd * 2),
                        )
                    }
                    // Encoded rows too (bf16's are f16's size; a jump to another block
                    // stalls their reads as much).
                    RowBuf::Encoded {
                        k,
                        v,
                        k_row_bytes,
                        v_row_bytes,
                    } => (
                        bytes_of(&k[first * k_row_bytes..(first + n) * k_row_bytes]),
                        bytes_of(&v[first * v_row_bytes..(first + n) * v_row_bytes]),
                    ),
                    RowBuf::Sealed { v, v_row_bytes, .. } => (
                        (std::ptr::null(), 0),
                        bytes_of(&v[first * v_row_bytes..(first + n) * v_row_bytes]),
                    ),
                    // The groups holding the rows.
                    RowBuf::Bf16Pairs { k, v } => {
                        let w = group_words(hd);
                        let groups = first / PAIR_GROUP_ROWS * w
                            ..((first + n).div_ceil(PAIR_GROUP_ROWS) * w).min(k.len());
                        let words = |x: &[u32]| (x.as_ptr().cast::<u8>(), x.len() * 4);
                        (words(&k[groups.clone()]), words(&v[groups]))
                    }
                    RowBuf::Int8Pairs { k, v, .. } => {
                        let (g0, g1) = (
                            first / PAIR_GROUP_ROWS,
                            (first + n).div_ceil(PAIR_GROUP_ROWS),
                        );
                        let (kw, vw) = (coded_key_words(hd), group_words(hd));
                        let words = |x: &[u32], w: usize| {
                            let x = &x[g0 * w..(g1 * w).min(x.len())];
                            (x.as_ptr().cast::<u8>(), x.len() * 4)
                        };
                        (words(k, kw), words(v, vw))
                    }
                };
            for (at, bytes) in [(k, k_bytes), (v, v_bytes)] {
                for off in (0..bytes).step_by(64) {
                    // SAFETY: `off < bytes`, the length of the borrowed (bounds-checked) row
                    // range above, so the address lies inside a live buffer; a prefetch never
                    // faults and has no architectural effect.
                    unsafe { _mm_prefetch::<_MM_HINT_T0>(at.add(off).cast()) };
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (first, n);
    }

    /// Runs `f` on rows `first..first + n` as one attention chunk (inside one group for block
    /// codecs; the sealed codes then, see `own`), for a query that lies in this chunk's group
    /// when `own`: with a block K codec the group's full-precision (f16) rows are read then, its
    /// sealed codes otherwise, so what a query reads depends on its position only. Other
    /// codecs ignore `own`. Rows in the pair layout are handed over as encoded bf16 rows,
    /// gathered first (readers that attend them read the groups in place instead:
    /// [`KvRows::pair_group`]).
    #[inline]
    pub fn with_chunk<R>(
        &self,
        first: usize,
        n: usize,
        own: bool,
        f: impl FnOnce(KvChunk<'_>) -> R,
    ) -> R {
        let hd = self.head_dim;
        let buf = match &self.buf {
            RowBuf::Bf16Pairs { .. } => {
                let mut bytes = Vec::with_capacity(4 * n * hd);
                self.pair_rows_bytes(first, n, &mut bytes);
                let (k, v) = bytes.split_at(2 * n * hd);
                let rows = |b| EncodedRows::new(self.codecs.k, hd, b).expect("whole bf16 rows");
                return f(KvChunk::Encoded {
                    k: rows(k),
                    v: rows(v),
                });
            }
            RowBuf::Int8Pairs { .. } => {
                let mut bytes = Vec::with_capacity(n * self.row_pair_bytes());
                self.coded_rows_bytes(first, n, &mut bytes);
                let (k, v) = bytes.split_at(n * self.codecs.k.bytes_per_row(hd));
                return f(KvChunk::Encoded {
                    k: EncodedRows::new(self.codecs.k, hd, k).expect("whole int8 rows"),
                    v: EncodedRows::new(self.codecs.v, hd, v).expect("whole bf16 rows"),
                });
            }
            buf => buf,
        };
        f(match buf {
            RowBuf::Sealed {
                k,
                v,
                v_row_bytes: vr,
            } => KvChunk::Encoded {
                k: k.chunk(first, n, own),
                v: EncodedRows::new(self.codecs.v, hd, &v[first * vr..(first + n) * vr])
                    .expect("whole rows of a validated codec"),
            },
            RowBuf::F32 { k, v } => KvChunk::F32 {
                k: &k[first * hd..(first + n) * hd],
                v: &v[first * hd..(first + n) * hd],
            },
            RowBuf::F16 { k, v } => KvChunk::F16 {
                k: &k[first * hd..(first + n) * hd],
                v: &v[first * hd..(first + n) * hd],
            },
            RowBuf::Encoded {
                k,
                v,
                k_row_bytes: kr,
                v_row_bytes: vr,
            } => KvChunk::Encoded {
                k: EncodedRows::new(self.codecs.k, hd, &k[first * kr..(first + n) * kr])
                    .expect("whole rows of a validated codec"),
                v: EncodedRows::new(self.codecs.v, hd, &v[first * vr..(first + n) * vr])
                    .expect("whole rows of a validated codec"),
            },
            RowBuf::Bf16Pairs { .. } | RowBuf::Int8Pairs { .. } => {
                unreachable!("handed over above")
            }
        })
    }

    /// Copies rows `src..src + n` over rows `dst..dst + n`.
    pub fn copy_rows(&mut self, src: usize, dst: usize, n: usize) {
        let hd = self.head_dim;
        match &mut self.buf {
            RowBuf::F32 { k, v } => {
                k.copy_within(src * hd..(src + n) * hd, dst * hd);
                v.copy_within(src * hd..(src + n) * hd, dst * hd);
            }
            RowBuf::F16 { k, v } => {
                k.copy_within(src * hd..(src + n) * hd, dst * hd);
                v.copy_within(src * hd..(src + n) * hd, dst * hd);
            }
            RowBuf::Encoded {
                k,
                v,
                k_row_bytes: kr,
                v_row_bytes: vr,
            } => {
                k.copy_within(src * *kr..(src + n) * *kr, dst * *kr);
                v.copy_within(src * *vr..(src + n) * *vr, dst * *vr);
            }
            RowBuf::Sealed {
                k,
                v,
                v_row_bytes: vr,
            } => {
                k.copy_rows(src, dst, n);
                v.copy_within(src * *vr..(src + n) * *vr, dst * *vr);
            }
            RowBuf::Bf16Pairs { .. } | RowBuf::Int8Pairs { .. } => {
                let bytes = self.rows_bytes(src, n);
                self.load_rows_bytes(dst, n, &bytes);
            }
        }
    }

    /// Rows `first..first + n` serialised: all K rows, then all V rows, little-endian values (or
    /// the encoded bytes as stored). Exactly `n · row_pair_bytes()` bytes.
    pub fn rows_bytes(&self, first: usize, n: usize) -> Vec<u8> {
        let hd = self.head_dim;
        let (a, b) = (first * hd, (first + n) * hd);
        let mut out = Vec::with_capacity(n * self.row_pair_bytes());
        match &self.buf {
            RowBuf::F32 { k, v } => {
                out.resize(2 * (b - a) * 4, 0);
                let (ko, vo) = out.split_at_mut((b - a) * 4);
                plain_to_le_bytes(&k[a..b], ko, |x: &f32| x.to_le_bytes());
                plain_to_le_bytes(&v[a..b], vo, |x: &f32| x.to_le_bytes());
            }
            RowBuf::F16 { k, v } => {
                out.resize(2 * (b - a) * 2, 0);
                let (ko, vo) = out.split_at_mut((b - a) * 2);
                plain_to_le_bytes(&k[a..b], ko, |x: &f16| x.to_le_bytes());
                plain_to_le_bytes(&v[a..b], vo, |x: &f16| x.to_le_bytes());
            }
            RowBuf::Encoded {
                k,
                v,
                k_row_bytes: kr,
                v_row_bytes: vr,
            } => {
                out.extend_from_slice(&k[first * kr..(first + n) * kr]);
                out.extend_from_slice(&v[first * vr..(first + n) * vr]);
            }
            RowBuf::Sealed {
                k,
                v,
                v_row_bytes: vr,
            } => {
                let t = k.tokens();
                assert!(
                    first.is_multiple_of(t) && n.is_multiple_of(t),
                    "whole groups"
                );
                k.groups_bytes(first / t, n / t, &mut out);
                out.extend_from_slice(&v[first * vr..(first + n) * vr]);
            }
            RowBuf::Bf16Pairs { .. } => self.pair_rows_bytes(first, n, &mut out),
            RowBuf::Int8Pairs { .. } => self.coded_rows_bytes(first, n, &mut out),
        }
        out
    }

    /// Overwrites rows `first..first + n` from [`KvRows::rows_bytes`] output of the same codecs.
    /// `bytes.len()` must be `n · row_pair_bytes()` (the caller checks; panics otherwise).
    pub fn load_rows_bytes(&mut self, first: usize, n: usize, bytes: &[u8]) {
        assert_eq!(
            bytes.len(),
            n * self.row_pair_bytes(),
            "caller checks the length"
        );
        let hd = self.head_dim;
        let (a, b) = (first * hd, (first + n) * hd);
        match &mut self.buf {
            RowBuf::F32 { k, v } => {
                let (kb, vb) = bytes.split_at(n * hd * 4);
                plain_from_le_bytes(kb, &mut k[a..b], f32::from_le_bytes);
                plain_from_le_bytes(vb, &mut v[a..b], f32::from_le_bytes);
            }
            RowBuf::F16 { k, v } => {
                let (kb, vb) = bytes.split_at(n * hd * 2);
                plain_from_le_bytes(kb, &mut k[a..b], f16::from_le_bytes);
                plain_from_le_bytes(vb, &mut v[a..b], f16::from_le_bytes);
            }
            RowBuf::Encoded {
                k,
                v,
                k_row_bytes: kr,
                v_row_bytes: vr,
            } => {
                let (kb, vb) = bytes.split_at(n * *kr);
                k[first * *kr..(first + n) * *kr].copy_from_slice(kb);
                v[first * *vr..(first + n) * *vr].copy_from_slice(vb);
            }
            RowBuf::Sealed {
                k,
                v,
                v_row_bytes: vr,
            } => {
                let t = k.tokens();
                assert!(
                    first.is_multiple_of(t) && n.is_multiple_of(t),
                    "whole groups"
                );
                let (kb, vb) = bytes.split_at(n * self.codecs.k.bytes_per_row(hd));
                k.load_groups_bytes(first / t, kb);
                v[first * *vr..(first + n) * *vr].copy_from_slice(vb);
            }
            RowBuf::Int8Pairs { .. } => self.load_coded_rows_bytes(first, n, bytes),
            RowBuf::Bf16Pairs { .. } => {
                let (kb, vb) = bytes.split_at(2 * n * hd);
                let (mut ks, mut vs) = (
                    [bf16::ZERO; PAIR_MAX_HEAD_DIM],
                    [bf16::ZERO; PAIR_MAX_HEAD_DIM],
                );
                let mut r = 0;
                while r < n {
                    let whole = self.whole_group_at(first + r, n - r);
                    let RowBuf::Bf16Pairs { k, v } = &mut self.buf else {
                        unreachable!("the pair layout");
                    };
                    if let Some(rows) = whole {
                        // A whole group at once (`pair_layout_groups`).
                        let span = r * 2 * hd..(r + PAIR_GROUP_ROWS) * 2 * hd;
                        group_from_le_bytes(
                            &kb[span.clone()],
                            &vb[span],
                            &mut k[rows.clone()],
                            &mut v[rows],
                            hd,
                        );
                        r += PAIR_GROUP_ROWS;
                        continue;
                    }
                    let row = 2 * hd * r..2 * hd * (r + 1);
                    plain_from_le_bytes(&kb[row.clone()], &mut ks[..hd], bf16::from_le_bytes);
                    plain_from_le_bytes(&vb[row], &mut vs[..hd], bf16::from_le_bytes);
                    write_pair_row(k, v, first + r, &ks[..hd], &vs[..hd]);
                    r += 1;
                }
            }
        }
    }
}

/// Writes row `row` (`k`, `v`: `[head_dim]` bf16) into its group of the pair-layout buffers
/// `kb` / `vb`.
fn write_pair_row(kb: &mut [u32], vb: &mut [u32], row: usize, k: &[bf16], v: &[bf16]) {
    let (g, w) = (row / PAIR_GROUP_ROWS, group_words(k.len()));
    let group = g * w..(g + 1) * w;
    pair_layout::write_row(
        &mut kb[group.clone()],
        &mut vb[group],
        row % PAIR_GROUP_ROWS,
        k,
        v,
    );
}

/// `x` in `quant`'s bf16 encoding (the bytes `encode_row` writes for a bf16 row).
fn encode_bf16(x: &[f32], out: &mut [bf16]) -> Result<(), KvError> {
    let mut bytes = [0u8; 2 * PAIR_MAX_HEAD_DIM];
    let bytes = &mut bytes[..2 * x.len()];
    quant::encode_row(KvCodecKind::Bf16, x, bytes).map_err(|e| KvError::Codec(e.to_string()))?;
    plain_from_le_bytes(bytes, out, bf16::from_le_bytes);
    Ok(())
}

/// `src` written as little-endian bytes into `out` (`N` bytes per value). One loop per slice (no
/// chained iterators), so the compiler turns it into wide copies: a tier save or load of an
/// f16 block copies at memory speed instead of a value at a time.
fn plain_to_le_bytes<T, const N: usize>(src: &[T], out: &mut [u8], to: impl Fn(&T) -> [u8; N]) {
    for (o, x) in out.chunks_exact_mut(N).zip(src) {
        o.copy_from_slice(&to(x));
    }
}

/// `dst` read from the little-endian bytes `src` (`N` bytes per value): the inverse of
/// [`plain_to_le_bytes`].
fn plain_from_le_bytes<T, const N: usize>(src: &[u8], dst: &mut [T], from: impl Fn([u8; N]) -> T) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(N)) {
        *d = from(s.try_into().expect("chunks of N bytes"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The bytes a reader sees of rows `first..first + n` (`own`: as the query's own group).
    fn seen(rows: &KvRows, first: usize, n: usize, own: bool) -> Vec<u8> {
        rows.with_chunk(first, n, own, |c| match c {
            KvChunk::F32 { k, v } => k.iter().chain(v).flat_map(|x| x.to_le_bytes()).collect(),
            KvChunk::F16 { k, v } => k.iter().chain(v).flat_map(|x| x.to_le_bytes()).collect(),
            KvChunk::Encoded { k, v } => [k.params(), k.bytes(), v.params(), v.bytes()].concat(),
        })
    }

    /// A step's rows written at once over a pool (encoders spread, block-codec groups sealed in
    /// parallel) hold the bytes of writing them one by one, on 1–3 threads and for every
    /// layout: sealed groups, a group left partly filled, and rows from permuted sources.
    #[test]
    fn rows_written_at_once_equal_rows_written_one_by_one() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let (hd, num_rows, src_rows) = (64, 96, 90);
        let k: Vec<f32> = (0..src_rows * hd)
            .map(|_| rng.gen_range(-3.0f32..3.0))
            .collect();
        let v: Vec<f32> = (0..src_rows * hd)
            .map(|_| rng.gen_range(-3.0f32..3.0))
            .collect();
        let mut srcs: Vec<usize> = (0..src_rows).collect();
        for i in (1..src_rows).rev() {
            srcs.swap(i, rng.gen_range(0..=i));
        }
        // Rows 0..80 in one call (five groups of 16 sealed), then 80..90 (a group left open).
        let calls: [Vec<(usize, usize)>; 2] = [
            (0..80).map(|r| (r, srcs[r])).collect(),
            (80..90).map(|r| (r, srcs[r])).collect(),
        ];
        for spec in [
            "f16",
            "int8",
            "k=int8,v=int4",
            "int4h",
            "fp8",
            "k=int4c,v=int4",
            "k=int4c-t4,v=int8",
            "bf16",
            "k=bf16,v=f16",
            "k=int8,v=bf16",
        ] {
            let codecs = KvDtype::parse(spec).unwrap();
            let mut want = KvRows::new(codecs, hd, num_rows).unwrap();
            for call in &calls {
                for &(r, src) in call {
                    want.write(
                        r,
                        &k[src * hd..(src + 1) * hd],
                        &v[src * hd..(src + 1) * hd],
                    )
                    .unwrap();
                }
            }
            for threads in 1..=3 {
                let pool = ThreadPool::new(threads);
                let mut got = KvRows::new(codecs, hd, num_rows).unwrap();
                for call in &calls {
                    got.write_many(&pool, call, &k, &v).unwrap();
                }
                assert_eq!(
                    got.rows_bytes(0, 80),
                    want.rows_bytes(0, 80),
                    "{spec}, {threads}"
                );
                for own in [false, true] {
                    // Runs of four rows: inside one group of every block codec here.
                    for first in (0..92).step_by(4) {
                        let n = if first == 88 { 2 } else { 4 };
                        assert_eq!(
                            seen(&got, first, n, own),
                            seen(&want, first, n, own),
                            "{spec}, {threads} threads, rows {first}.., own {own}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn rows_round_trip_through_bytes_for_every_layout() {
        for spec in [
            "f32",
            "f16",
            "int8",
            "k=int8,v=int4",
            "int4h",
            "k=int4h,v=int8",
            "bf16",
            "k=int8,v=bf16",
        ] {
            let codecs = KvDtype::parse(spec).unwrap();
            let mut a = KvRows::new(codecs, 64, 6).unwrap();
            if a.is_pair_layout() {
                assert_eq!(
                    a.allocated_bytes(),
                    16 * a.row_pair_bytes(),
                    "{spec}: one group"
                );
            } else {
                assert_eq!(a.allocated_bytes(), 6 * a.row_pair_bytes(), "{spec}");
            }
            for r in 0..6 {
                let k: Vec<f32> = (0..64).map(|i| (r * 64 + i) as f32 / 97.0 - 1.0).collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                a.write(r, &k, &v).unwrap();
            }
            let bytes = a.rows_bytes(1, 3);
            assert_eq!(bytes.len(), 3 * a.row_pair_bytes());
            // Plain floats: rows 1..4 of K, then of V, each value little-endian (the naive
            // layout, value by value).
            let value = |r: usize, i: usize| (r * 64 + i) as f32 / 97.0 - 1.0;
            let naive = |to: &dyn Fn(f32) -> Vec<u8>| {
                let k = (1..4).flat_map(|r| (0..64).map(move |i| value(r, i)));
                let v = (1..4).flat_map(|r| (0..64).map(move |i| -value(r, i)));
                k.chain(v).flat_map(to).collect::<Vec<u8>>()
            };
            match spec {
                "f32" => assert_eq!(bytes, naive(&|x| x.to_le_bytes().to_vec())),
                "f16" => assert_eq!(bytes, naive(&|x| f16::from_f32(x).to_le_bytes().to_vec())),
                "bf16" => assert_eq!(bytes, naive(&|x| bf16::from_f32(x).to_le_bytes().to_vec())),
                _ => {}
            }
            let mut b = KvRows::new(codecs, 64, 6).unwrap();
            b.load_rows_bytes(2, 3, &bytes);
            assert_eq!(b.rows_bytes(2, 3), bytes, "{spec}");
            a.copy_rows(1, 3, 3);
            assert_eq!(a.rows_bytes(3, 3), bytes, "{spec}");
            assert_eq!(a.with_chunk(0, 4, false, |c| c.num_positions(64)), 4);
        }
    }

    /// Prefaulting a store of every layout (buffers past the huge-page threshold) keeps every
    /// row it held, maps at most what the store allocated, and leaves it writable.
    #[test]
    fn prefault_keeps_every_layouts_rows() {
        let (hd, n) = (64, 1 << 16);
        for spec in [
            "f32",
            "f16",
            "int8",
            "int4h",
            "bf16",
            "k=int8,v=bf16",
            "k=int4c,v=int8",
        ] {
            let codecs = KvDtype::parse(spec).unwrap();
            let mut a = KvRows::new(codecs, hd, n).unwrap();
            let row = |r: usize| -> Vec<f32> {
                (0..hd)
                    .map(|i| ((r * 31 + i * 7) % 97) as f32 / 48.0 - 1.0)
                    .collect()
            };
            // Whole 16-row groups, every row written (a block codec serialises sealed groups).
            let spans = [0, 16, n / 2, n - 16];
            for r in spans.iter().flat_map(|&s| s..s + 16) {
                let k = row(r);
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                a.write(r, &k, &v).unwrap();
            }
            let read = |a: &KvRows| -> Vec<Vec<u8>> {
                spans.iter().map(|&r| a.rows_bytes(r, 16)).collect()
            };
            let before = read(&a);
            let mapped = a.prefault();
            assert!(
                mapped <= a.allocated_bytes(),
                "{spec}: {mapped} bytes mapped"
            );
            assert_eq!(read(&a), before, "{spec}");
            let k = row(5);
            a.write(n / 2 + 40, &k, &k).unwrap();
            assert_eq!(read(&a), before, "{spec}");
        }
    }

    /// `int8` K with bf16 V in the coded pair layout: every span — whole groups (converted at
    /// once), a group's part, both — serialises as the codecs' rows encoded one by one and
    /// loads back to them, at the same rows and shifted.
    #[test]
    fn coded_pair_layout_spans_serialise_as_codec_rows() {
        let codecs = KvDtype::parse("k=int8,v=bf16").unwrap();
        let (hd, rows) = (64, 64);
        let value = |r: usize, i: usize| ((r * 131 + i * 7) % 509) as f32 / 64.0 - 4.0;
        let mut a = KvRows::new(codecs, hd, rows).unwrap();
        assert!(a.is_pair_layout() && a.coded_pair_group(16).is_some());
        let kr = codecs.k.bytes_per_row(hd);
        let mut naive_k = vec![0u8; rows * kr];
        for r in 0..rows {
            let k: Vec<f32> = (0..hd).map(|i| value(r, i)).collect();
            let v: Vec<f32> = k.iter().map(|x| -0.5 * x).collect();
            a.write(r, &k, &v).unwrap();
            quant::encode_row(codecs.k, &k, &mut naive_k[r * kr..(r + 1) * kr]).unwrap();
        }
        for (first, n) in [(16, 32), (5, 40), (16, 16), (0, 64), (17, 15), (3, 10)] {
            let bytes = a.rows_bytes(first, n);
            let v = (first..first + n).flat_map(|r| (0..hd).map(move |i| -0.5 * value(r, i)));
            let mut naive = naive_k[first * kr..(first + n) * kr].to_vec();
            naive.extend(v.flat_map(|x| bf16::from_f32(x).to_le_bytes()));
            assert_eq!(bytes, naive, "rows {first}..+{n}");
            for at in [first, (first + 3) % 8]
                .into_iter()
                .filter(|&at| at + n <= rows)
            {
                let mut b = KvRows::new(codecs, hd, rows).unwrap();
                b.load_rows_bytes(at, n, &bytes);
                assert_eq!(b.rows_bytes(at, n), bytes, "rows {first}..+{n} at {at}");
            }
        }
    }

    /// bf16 rows in the pair layout serialise and load whole groups at once
    /// (`pair_layout_groups`) and the rows around them one by one: every span — whole groups,
    /// a group's part, both — gives the naive row-major bytes and loads back to them, at the
    /// same rows (whole groups) and shifted (rows only).
    #[test]
    fn pair_layout_spans_of_whole_and_partial_groups_serialise_as_rows() {
        let codecs = KvDtype::parse("bf16").unwrap();
        let (hd, rows) = (64, 64);
        let value = |r: usize, i: usize| ((r * 131 + i * 7) % 509) as f32 / 64.0 - 4.0;
        let mut a = KvRows::new(codecs, hd, rows).unwrap();
        assert!(a.is_pair_layout());
        for r in 0..rows {
            let k: Vec<f32> = (0..hd).map(|i| value(r, i)).collect();
            let v: Vec<f32> = k.iter().map(|x| -0.5 * x).collect();
            a.write(r, &k, &v).unwrap();
        }
        for (first, n) in [(16, 32), (5, 40), (16, 16), (0, 64), (17, 15), (3, 10)] {
            let bytes = a.rows_bytes(first, n);
            let k = (first..first + n).flat_map(|r| (0..hd).map(move |i| value(r, i)));
            let v = (first..first + n).flat_map(|r| (0..hd).map(move |i| -0.5 * value(r, i)));
            let naive: Vec<u8> = k
                .chain(v)
                .flat_map(|x| bf16::from_f32(x).to_le_bytes())
                .collect();
            assert_eq!(bytes, naive, "rows {first}..+{n}");
            for at in [first, (first + 3) % 8]
                .into_iter()
                .filter(|&at| at + n <= rows)
            {
                let mut b = KvRows::new(codecs, hd, rows).unwrap();
                b.load_rows_bytes(at, n, &bytes);
                assert_eq!(
                    b.rows_bytes(at, n),
                    bytes,
                    "rows {first}..+{n} loaded at {at}"
                );
                if at == first && at.is_multiple_of(PAIR_GROUP_ROWS) && n >= PAIR_GROUP_ROWS {
                    // The loaded group reads in place as the written one does.
                    let (ga, gb) = (a.pair_group(first).unwrap(), b.pair_group(at).unwrap());
                    let (mut ka, mut va, mut kb, mut vb) = (
                        vec![bf16::ZERO; hd],
                        vec![bf16::ZERO; hd],
                        vec![bf16::ZERO; hd],
                        vec![bf16::ZERO; hd],
                    );
                    for t in 0..PAIR_GROUP_ROWS {
                        ga.row(t, &mut ka, &mut va);
                        gb.row(t, &mut kb, &mut vb);
                        assert_eq!((&ka, &va), (&kb, &vb), "row {t} of the group");
                    }
                }
            }
        }
    }
}
