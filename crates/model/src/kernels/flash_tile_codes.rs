//! Attention scores of a K/V tile straight from integer K codes: the query quantised to i8,
//! dotted with the stored u8 codes in integers (AVX-512 VNNI `vpdpbusd` over the tile's codes
//! transposed so that one vector holds the 16 positions; AVX2 `vpmaddwd`, three query rows
//! sharing each code word), and the codec's scales applied to the integer sums. Steps 2–4
//! (softmax, `p·V`) are `flash_tile`'s, with V either decoded or read as codes and decoded in
//! registers (the same values). Also the AVX2 f32 step over a sealed `int4c` K tile read in
//! registers ([`tile_update_channel_codes`]: the values, so the bits, of the decoded tile).
//!
//! Which K codecs: `int8` with one group per row ([`KeyCodes::Rows`]) and the per-channel
//! `int4c` groups of a multiple of 16 rows, so that a tile lies in one group
//! ([`KeyCodes::Channels`]); `head_dim` a multiple of 16, at most
//! [`MAX_CODED_HEAD_DIM`] (integer sums stay below 2^24, so exact in f32).
//!
//! The arithmetic (every path performs exactly these operations, so results are bit-identical;
//! a row's result depends only on its query, its position count and the stored K/V):
//! - **Query quantisation** of a vector `x` (`head_dim` f32): `a = max_c |x_c|`; when `a` is 0
//!   or not finite every code is 0 and `s = 0`; else `q8_c = clamp(round_ties_even(x_c ·
//!   (127/a)), −127, 127)`, `s = a / 127`, and `Σq8` is the exact integer sum.
//! - **`Rows`** (per-token scale `k_s`, offset `k_o` per position): `x = q` (once per row and
//!   attention call); `dot_t = Σ_c q8_c·code_{t,c}` (exact), and
//!   `score_t = ((fma(k_s[t], dot_t, k_o[t] · Σq8)) · s) · softmax_scale`.
//! - **`Channels`** (per-channel scale `σ_c`, offset `ω_c` of the group): per group (tile) and
//!   row, `x_c = q_c · σ_c`, `bias = Σ_c q_c·ω_c` (16 lane chains of fused multiply-adds over
//!   `c ≡ l mod 16` in order, reduced `l + (l+8)`, then `+4`, `+2`, `+1`), and
//!   `score_t = fma(s, dot_t, bias) · softmax_scale`.
//!
//! Owns the transposed code tile, the query quantisation and the score step; it never reads a
//! KV store and never allocates on the kernel path (buffers grow once per shape).

use half::f16;
use quant::{EncodedRows, KvCodecKind};

use super::cpu::CpuFeatures;
use super::flash_tile::{tile_update_scored, widen_f16, TileSoftmax, TILE_POSITIONS};

/// Widest head scored from codes (`head_dim · 255 · 127 < 2^24`: integer sums exact in f32).
pub const MAX_CODED_HEAD_DIM: usize = 512;

/// How K codes are scaled: per position (one group per row) or per channel (a sealed group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyCodes {
    /// `int8` with one `(scale, offset)` per row.
    Rows,
    /// `int4c`: one `(scale, offset)` per channel for the group's rows.
    Channels,
}

impl KeyCodes {
    /// How rows of `kind` are scored from codes with `head_dim`, or `None` (decoded to f32).
    pub fn of(kind: KvCodecKind, head_dim: usize) -> Option<KeyCodes> {
        if head_dim == 0 || !head_dim.is_multiple_of(16) || head_dim > MAX_CODED_HEAD_DIM {
            return None;
        }
        match kind {
            KvCodecKind::Int8 { group } if group == head_dim => Some(KeyCodes::Rows),
            // A tile must lie inside one group (one set of channel parameters).
            KvCodecKind::Int4Channel { tokens } if tokens.is_multiple_of(TILE_POSITIONS) => {
                Some(KeyCodes::Channels)
            }
            _ => None,
        }
    }
}

/// One K tile as codes, transposed by 4-byte columns: `kt[j · 16 + t]` holds channels
/// `4j..4j + 4` of position `t` (byte `i` = channel `4j + i`), with the per-position scale and
/// offset of `Rows` codecs. Positions not loaded keep stale bytes (the kernels mask them).
#[derive(Default)]
pub struct CodedTile {
    hd: usize,
    kt: Vec<u32>,
    k_scale: [f32; TILE_POSITIONS],
    k_offset: [f32; TILE_POSITIONS],
    /// Unpacked 4-bit codes of a run of rows, `[16, hd]` bytes.
    unpacked: Vec<u8>,
    /// The per-channel `(scale, offset)` of the current `Channels` group, `[2, hd]`.
    channel: Vec<f32>,
    /// The group header's f16 values and their widening, `[hd, 2]` interleaved.
    halves: Vec<f16>,
    pairs: Vec<f32>,
}

impl CodedTile {
    /// Sizes the tile for `hd` (grows its buffers once).
    pub fn reset(&mut self, hd: usize) {
        self.hd = hd;
        self.kt.resize(hd / 4 * TILE_POSITIONS, 0);
        self.unpacked.resize(TILE_POSITIONS * hd, 0);
        self.channel.resize(2 * hd, 0.0);
        self.halves.resize(2 * hd, f16::ZERO);
        self.pairs.resize(2 * hd, 0.0);
    }

    /// The current group's per-channel scales and offsets (`Channels`).
    pub fn channel_params(&self) -> (&[f32], &[f32]) {
        self.channel.split_at(self.hd)
    }

    /// Loads `rows` (`int8`, one group per row) at tile positions `at..at + n`.
    pub fn load_rows(&mut self, features: CpuFeatures, rows: &EncodedRows<'_>, at: usize) {
        let (hd, n, rb) = (self.hd, rows.num_rows(), rows.row_bytes());
        assert!(
            rows.head_dim() == hd && rb == hd + 4 && at + n <= TILE_POSITIONS,
            "int8 rows do not fit the tile"
        );
        let bytes = rows.bytes();
        let mut halves = [f16::ZERO; 2 * TILE_POSITIONS];
        for (t, row) in bytes.chunks_exact(rb).enumerate() {
            halves[t] = f16::from_bits(u16::from_le_bytes([row[0], row[1]]));
            halves[TILE_POSITIONS + t] = f16::from_bits(u16::from_le_bytes([row[2], row[3]]));
        }
        // Widening is exact on every path.
        let mut wide = [0f32; 2 * TILE_POSITIONS];
        widen_f16(&halves, &mut wide);
        self.k_scale[at..at + n].copy_from_slice(&wide[..n]);
        self.k_offset[at..at + n].copy_from_slice(&wide[TILE_POSITIONS..TILE_POSITIONS + n]);
        transpose_codes(
            features,
            &bytes[4.min(bytes.len())..],
            rb,
            n,
            hd,
            &mut self.kt,
            at,
        );
    }

    /// Loads `rows` (a sealed `int4c` group's rows, its header in `rows.params()`) at tile
    /// positions `at..at + n`, and the group's per-channel parameters.
    pub fn load_channels(&mut self, features: CpuFeatures, rows: &EncodedRows<'_>, at: usize) {
        let (hd, n) = (self.hd, rows.num_rows());
        assert!(
            rows.head_dim() == hd
                && rows.row_bytes() == hd / 2
                && rows.params().len() == 4 * hd
                && at + n <= TILE_POSITIONS,
            "int4c rows do not fit the tile"
        );
        self.load_channel_params(rows);
        unpack_nibbles(features, rows.bytes(), &mut self.unpacked[..n * hd]);
        transpose_codes(features, &self.unpacked, hd, n, hd, &mut self.kt, at);
    }

    /// Loads the per-channel parameters of `rows`' sealed `int4c` group only (its header,
    /// `rows.params()`), for [`tile_update_channel_codes`].
    pub fn load_channel_params(&mut self, rows: &EncodedRows<'_>) {
        let hd = self.hd;
        assert!(
            rows.head_dim() == hd && rows.params().len() == 4 * hd,
            "int4c header does not fit the tile"
        );
        let params = rows.params();
        for (h, b) in self.halves.iter_mut().zip(params.chunks_exact(2)) {
            *h = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
        }
        // Widening is exact on every path.
        widen_f16(&self.halves, &mut self.pairs);
        let (scales, offsets) = self.channel.split_at_mut(hd);
        for ((s, o), pair) in scales
            .iter_mut()
            .zip(offsets)
            .zip(self.pairs.chunks_exact(2))
        {
            (*s, *o) = (pair[0], pair[1]);
        }
    }
}

impl CodedTile {
    /// The loaded `Channels` tile decoded into K transposed (`flash_tile_wide`'s layout):
    /// `kt32[c · 16 + t] = fma(code_{t,c}, σ_c, ω_c)` for every position of the tile (what
    /// `quant::decode_rows` gives for the row, so the f32 tile step's bits are unchanged).
    /// Panics unless `kt32` holds `hd · 16` floats.
    pub fn widen_channels(&self, features: CpuFeatures, kt32: &mut [f32]) {
        let hd = self.hd;
        assert!(
            kt32.len() >= hd * TILE_POSITIONS,
            "transposed K tile too short"
        );
        let (scales, offsets) = self.channel_params();
        #[cfg(target_arch = "x86_64")]
        if features.clamp_to_detected().avx512 {
            // SAFETY: AVX-512 F presence was checked at runtime; lengths asserted above and by
            // `reset` (`kt` holds `hd / 4 · 16` words, the parameters `hd` each).
            unsafe { x86::widen_channels(&self.kt, scales, offsets, kt32) };
            return;
        }
        let _ = features;
        for (j, words) in self.kt.chunks_exact(TILE_POSITIONS).enumerate() {
            for (t, w) in words.iter().enumerate() {
                for (i, b) in w.to_le_bytes().into_iter().enumerate() {
                    let c = 4 * j + i;
                    kt32[c * TILE_POSITIONS + t] = (b as f32).mul_add(scales[c], offsets[c]);
                }
            }
        }
    }
}

/// `kt[j · 16 + at + t] = u32(codes[t · stride + 4j .. + 4])` for `t < n`, `j < hd / 4`.
fn transpose_codes(
    features: CpuFeatures,
    codes: &[u8],
    stride: usize,
    n: usize,
    hd: usize,
    kt: &mut [u32],
    at: usize,
) {
    assert!(
        n == 0 || codes.len() >= (n - 1) * stride + hd,
        "code rows too short"
    );
    #[cfg(target_arch = "x86_64")]
    if n == TILE_POSITIONS
        && at == 0
        && hd.is_multiple_of(64)
        && features.clamp_to_detected().avx512
    {
        for b in 0..hd / 64 {
            // SAFETY: AVX-512 F presence was checked at runtime; rows `0..16` hold bytes
            // `64b..64b + 64 <= hd` (assertion above) and `kt` holds `hd / 4 · 16` dwords.
            unsafe { x86::transpose16(codes.as_ptr().add(64 * b), stride, kt, 16 * b) };
        }
        return;
    }
    let mut t0 = 0;
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 && hd.is_multiple_of(32) {
        assert!(kt.len() >= hd / 4 * TILE_POSITIONS && at + n <= TILE_POSITIONS);
        while t0 + 8 <= n {
            for j0 in (0..hd / 4).step_by(8) {
                // SAFETY: AVX2 presence was checked at runtime; rows `t0..t0 + 8 <= n` hold
                // bytes `4j0..4j0 + 32 <= hd` (assertion above), and the destination words
                // `(j0 + j) · 16 + at + t0 + 8 <= (hd / 4) · 16` lie inside `kt`.
                unsafe {
                    x86::transpose8(
                        codes.as_ptr().add(t0 * stride + 4 * j0),
                        stride,
                        kt,
                        j0,
                        at + t0,
                    )
                };
            }
            t0 += 8;
        }
    }
    let _ = features;
    for t in t0..n {
        let row = &codes[t * stride..t * stride + hd];
        for (j, w) in row.chunks_exact(4).enumerate() {
            kt[j * TILE_POSITIONS + at + t] = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        }
    }
}

/// Rows of packed nibbles (element `2j` low, `2j + 1` high) to one byte per element.
fn unpack_nibbles(features: CpuFeatures, packed: &[u8], out: &mut [u8]) {
    assert_eq!(2 * packed.len(), out.len(), "nibble unpack lengths");
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 {
        // SAFETY: AVX2 presence was checked at runtime; lengths asserted above.
        unsafe { x86::unpack_nibbles(packed, out) };
        return;
    }
    let _ = features;
    for (o, &b) in out.chunks_exact_mut(2).zip(packed) {
        o[0] = b & 0x0F;
        o[1] = b >> 4;
    }
}

/// Quantised query rows: codes packed four per `u32` (`[rows, hd / 4]`), and per row the
/// scale `s`, `Σq8` (as f32) and the `Channels` bias.
#[derive(Default)]
pub struct QueryCodes {
    hd: usize,
    q8: Vec<u32>,
    s: Vec<f32>,
    sum8: Vec<f32>,
    bias: Vec<f32>,
    /// `q ∘ σ` of the row being prepared (`Channels`).
    scaled: Vec<f32>,
}

/// One prepared row as the kernels read it.
#[derive(Clone, Copy)]
pub struct QueryRef<'a> {
    pub q8: &'a [u32],
    pub s: f32,
    pub sum8: f32,
    pub bias: f32,
}

impl QueryRef<'_> {
    /// A placeholder (no codes).
    pub const EMPTY: QueryRef<'static> = QueryRef {
        q8: &[],
        s: 0.0,
        sum8: 0.0,
        bias: 0.0,
    };
}

impl QueryCodes {
    /// Room for `rows` rows of `hd`.
    pub fn reset(&mut self, rows: usize, hd: usize) {
        self.hd = hd;
        self.q8.resize(rows * hd / 4, 0);
        for v in [&mut self.s, &mut self.sum8, &mut self.bias] {
            v.resize(rows, 0.0);
        }
        self.scaled.resize(hd, 0.0);
    }

    /// Row `r` of a `Rows` codec: the query quantised as it is.
    pub fn prepare_rows(&mut self, features: CpuFeatures, r: usize, q: &[f32]) {
        let hd = self.hd;
        assert_eq!(q.len(), hd, "query row length");
        let (s, sum8) = quantize(features, q, &mut self.q8[r * hd / 4..(r + 1) * hd / 4]);
        (self.s[r], self.sum8[r], self.bias[r]) = (s, sum8, 0.0);
    }

    /// Row `r` of a `Channels` group: `q ∘ scales` quantised, and the offsets' bias.
    pub fn prepare_channels(
        &mut self,
        features: CpuFeatures,
        r: usize,
        q: &[f32],
        scales: &[f32],
        offsets: &[f32],
    ) {
        let hd = self.hd;
        assert!(
            q.len() == hd && scales.len() == hd && offsets.len() == hd,
            "query row length"
        );
        for ((x, &qc), &sc) in self.scaled.iter_mut().zip(q).zip(scales) {
            *x = qc * sc;
        }
        let (s, sum8) = quantize(
            features,
            &self.scaled,
            &mut self.q8[r * hd / 4..(r + 1) * hd / 4],
        );
        (self.s[r], self.sum8[r]) = (s, sum8);
        self.bias[r] = channel_bias(features, q, offsets);
    }

    /// Row `r` as the kernels read it.
    pub fn row(&self, r: usize) -> QueryRef<'_> {
        let hd = self.hd;
        QueryRef {
            q8: &self.q8[r * hd / 4..(r + 1) * hd / 4],
            s: self.s[r],
            sum8: self.sum8[r],
            bias: self.bias[r],
        }
    }
}

/// The module doc's query quantisation of `x` into `out` (`x.len() / 4` packed words); returns
/// `(s, Σq8)`. One definition, compiled for the AVX-512 target where present (same bits).
fn quantize(features: CpuFeatures, x: &[f32], out: &mut [u32]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx512 {
        // SAFETY: AVX-512 F+VL (with AVX2, FMA) presence was checked at runtime.
        return unsafe { x86::quantize(x, out) };
    }
    let _ = features;
    quantize_def(x, out)
}

#[inline(always)]
fn quantize_def(x: &[f32], out: &mut [u32]) -> (f32, f32) {
    assert!(x.len().is_multiple_of(16) && out.len() * 4 == x.len());
    let mut lanes = [0f32; 16];
    for chunk in x.chunks_exact(16) {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = m.max(v.abs());
        }
    }
    let a = lanes.iter().copied().fold(0f32, f32::max);
    if !(a > 0.0 && a.is_finite()) {
        out.fill(0);
        return (0.0, 0.0);
    }
    let iq = 127.0 / a;
    let mut sum = 0i32;
    for (w, c) in out.iter_mut().zip(x.chunks_exact(4)) {
        let mut b = [0u8; 4];
        for (bi, &v) in b.iter_mut().zip(c) {
            let q = (v * iq).round_ties_even().clamp(-127.0, 127.0) as i32;
            sum += q;
            *bi = q as i8 as u8;
        }
        *w = u32::from_le_bytes(b);
    }
    (a / 127.0, sum as f32)
}

/// `Σ_c q_c·ω_c` in the module doc's order.
fn channel_bias(features: CpuFeatures, q: &[f32], offsets: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx512 {
        // SAFETY: AVX-512 F+VL (with AVX2, FMA) presence was checked at runtime.
        return unsafe { x86::channel_bias(q, offsets) };
    }
    let _ = features;
    channel_bias_def(q, offsets)
}

#[inline(always)]
fn channel_bias_def(q: &[f32], offsets: &[f32]) -> f32 {
    let mut l = [0f32; 16];
    for (qc, oc) in q.chunks_exact(16).zip(offsets.chunks_exact(16)) {
        for i in 0..16 {
            l[i] = qc[i].mul_add(oc[i], l[i]);
        }
    }
    let h8: [f32; 8] = std::array::from_fn(|i| l[i] + l[i + 8]);
    let h4: [f32; 4] = std::array::from_fn(|i| h8[i] + h8[i + 4]);
    let h2: [f32; 2] = std::array::from_fn(|i| h4[i] + h4[i + 2]);
    h2[0] + h2[1]
}

/// Integer `dot_t` of one query row with tile position `t` (portable definition).
fn dot_codes(q8: &[u32], kt: &[u32], t: usize) -> i32 {
    let mut sum = 0i32;
    for (j, &qw) in q8.iter().enumerate() {
        let (k, q) = (kt[j * TILE_POSITIONS + t].to_le_bytes(), qw.to_le_bytes());
        for i in 0..4 {
            sum += k[i] as i32 * q[i] as i8 as i32;
        }
    }
    sum
}

/// A tile's values as the tile step reads them.
#[derive(Clone, Copy)]
pub enum TileValues<'a> {
    /// Decoded rows, `[≥ valid, hd]` f32.
    Decoded(&'a [f32]),
    /// The tile's rows as stored, in a codec [`values_from_codes`] accepts: each value is
    /// decoded in a register (`fma(code, scale, offset)`, what `quant::decode_rows` gives),
    /// so the result is the `Decoded` one bit for bit.
    Codes(EncodedRows<'a>),
}

/// Whether V rows of `kind` can be read by the tile step as [`TileValues::Codes`]: `int8` /
/// `int4` (not rotated) with groups of a multiple of 16 channels.
pub fn values_from_codes(kind: KvCodecKind, hd: usize) -> bool {
    hd.is_multiple_of(16)
        && matches!(kind, KvCodecKind::Int8 { group } | KvCodecKind::Int4 { group }
            if group.is_multiple_of(16) && hd.is_multiple_of(group))
}

/// The score of position `t` from its integer dot product (module doc).
#[inline(always)]
fn score_of(
    keys: KeyCodes,
    tile: &CodedTile,
    q: &QueryRef<'_>,
    t: usize,
    dot: i32,
    scale: f32,
) -> f32 {
    let d = dot as f32;
    match keys {
        KeyCodes::Rows => (tile.k_scale[t].mul_add(d, tile.k_offset[t] * q.sum8) * q.s) * scale,
        KeyCodes::Channels => q.s.mul_add(d, q.bias) * scale,
    }
}

/// The tile step (scores from codes, then `flash_tile`'s steps 2–4) for each row `r`: state
/// `sts[r]`, accumulator `accs[r]`, prepared query `qs[r]`, `valids[r]` positions (1..=16) of
/// `tile`, values `vals` (`[≥ max valid, hd]` f32). Rows `r..r+3` with equal `valid` share
/// every load on the AVX-512 VNNI path. Panics on a shape mismatch.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub fn tile_update_codes(
    features: CpuFeatures,
    keys: KeyCodes,
    sts: &mut [TileSoftmax],
    accs: &mut [&mut [f32]],
    qs: &[QueryRef<'_>],
    valids: &[usize],
    tile: &CodedTile,
    vals: TileValues<'_>,
    scale: f32,
) {
    let rows = qs.len();
    let hd = tile.hd;
    let max_valid = valids.iter().copied().max().unwrap_or(0);
    let features = features.clamp_to_detected();
    let fast = features.avx512 && features.vnni;
    let vals = match vals {
        TileValues::Codes(v) => {
            assert!(
                values_from_codes(v.kind(), hd) && v.head_dim() == hd && v.num_rows() >= max_valid,
                "coded values do not fit the tile"
            );
            TileValues::Codes(v.take_rows(max_valid))
        }
        d => d,
    };
    let vals_len = match vals {
        TileValues::Decoded(v) => v.len(),
        TileValues::Codes(v) => v.num_rows() * hd,
    };
    assert!(
        rows == sts.len()
            && rows == accs.len()
            && rows == valids.len()
            && qs.iter().all(|q| q.q8.len() * 4 == hd)
            && accs.iter().all(|a| a.len() == hd)
            && valids.iter().all(|v| (1..=TILE_POSITIONS).contains(v))
            && tile.kt.len() >= hd / 4 * TILE_POSITIONS
            && vals_len >= max_valid * hd,
        "coded tile shapes: hd={hd} vals={vals_len} valids={valids:?}"
    );
    #[cfg(target_arch = "x86_64")]
    if fast {
        let mut r = 0;
        while r < rows {
            if r + 3 <= rows && valids[r + 1] == valids[r] && valids[r + 2] == valids[r] {
                let (s3, _) = sts[r..].split_first_chunk_mut::<3>().expect("3 rows");
                let (a3, _) = accs[r..].split_first_chunk_mut::<3>().expect("3 rows");
                let q3: &[QueryRef<'_>; 3] = qs[r..r + 3].try_into().expect("3 rows");
                // SAFETY: AVX-512 F+VL+VNNI (with AVX2, FMA, F16C) detected at runtime
                // (`clamp_to_detected`); shapes checked by the assertion above.
                unsafe { x86::rows::<3>(keys, s3, a3, q3, valids[r], tile, vals, scale) };
                r += 3;
            } else {
                let (s1, _) = sts[r..].split_first_chunk_mut::<1>().expect("1 row");
                let (a1, _) = accs[r..].split_first_chunk_mut::<1>().expect("1 row");
                let q1: &[QueryRef<'_>; 1] = qs[r..r + 1].try_into().expect("1 row");
                // SAFETY: as above.
                unsafe { x86::rows::<1>(keys, s1, a1, q1, valids[r], tile, vals, scale) };
                r += 1;
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if features.avx2 {
        use super::flash_tile::avx2::ElemRows;
        let args = (features, keys, sts, accs, qs, valids, tile, scale);
        match vals {
            TileValues::Decoded(v) => avx2_blocks(args, ElemRows { p: v.as_ptr(), hd }),
            TileValues::Codes(v) if matches!(v.kind(), KvCodecKind::Int4 { .. }) => {
                avx2_blocks(args, x86::CodedRows::<true>::new(&v))
            }
            TileValues::Codes(v) => avx2_blocks(args, x86::CodedRows::<false>::new(&v)),
        }
        return;
    }
    match vals {
        TileValues::Decoded(v) => portable_rows(keys, sts, accs, qs, valids, tile, v, scale),
        TileValues::Codes(v) => DECODED.with_borrow_mut(|buf| {
            // The portable path decodes the rows into this thread's scratch (same values).
            buf.resize(v.num_rows() * hd, 0.0);
            quant::decode_rows(&v, buf);
            portable_rows(keys, sts, accs, qs, valids, tile, buf, scale)
        }),
    }
}

thread_local! {
    /// The portable path's decoded V tile (grown once per thread).
    static DECODED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The portable tile step, one row at a time (the module doc's definition).
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
fn portable_rows(
    keys: KeyCodes,
    sts: &mut [TileSoftmax],
    accs: &mut [&mut [f32]],
    qs: &[QueryRef<'_>],
    valids: &[usize],
    tile: &CodedTile,
    vals: &[f32],
    scale: f32,
) {
    for r in 0..qs.len() {
        let mut scores = [f32::NEG_INFINITY; TILE_POSITIONS];
        for t in 0..valids[r] {
            let dot = dot_codes(qs[r].q8, &tile.kt, t);
            scores[t] = score_of(keys, tile, &qs[r], t, dot, scale);
        }
        tile_update_scored(
            CpuFeatures::PORTABLE,
            &mut sts[r],
            accs[r],
            &scores,
            vals,
            valids[r],
        );
    }
}

/// The arguments of [`tile_update_codes`] that [`avx2_blocks`] forwards.
#[cfg(target_arch = "x86_64")]
type Avx2Args<'a, 'b, 'q> = (
    CpuFeatures,
    KeyCodes,
    &'a mut [TileSoftmax],
    &'a mut [&'b mut [f32]],
    &'a [QueryRef<'q>],
    &'a [usize],
    &'a CodedTile,
    f32,
);

/// The AVX2 tile step: rows `r..r+3` with equal `valid` share every K and V load
/// ([`x86::rows_avx2`]), other rows go one at a time. Shapes were checked by the caller
/// (`vals` holds `max valid` rows of `hd`).
#[cfg(target_arch = "x86_64")]
fn avx2_blocks<V: super::flash_tile::avx2::ValueRows>(args: Avx2Args<'_, '_, '_>, vals: V) {
    let (features, keys, sts, accs, qs, valids, tile, scale) = args;
    let rows = qs.len();
    let mut r = 0;
    while r < rows {
        if r + 3 <= rows && valids[r + 1] == valids[r] && valids[r + 2] == valids[r] {
            let (s3, _) = sts[r..].split_first_chunk_mut::<3>().expect("3 rows");
            let (a3, _) = accs[r..].split_first_chunk_mut::<3>().expect("3 rows");
            let q3: &[QueryRef<'_>; 3] = qs[r..r + 3].try_into().expect("3 rows");
            // SAFETY: AVX2+FMA+F16C detected at runtime (`clamp_to_detected` by the caller);
            // shapes checked by `tile_update_codes`' assertion.
            unsafe {
                x86::rows_avx2::<V, 3, 4>(features, keys, s3, a3, q3, valids[r], tile, vals, scale)
            };
            r += 3;
        } else {
            let (s1, _) = sts[r..].split_first_chunk_mut::<1>().expect("1 row");
            let (a1, _) = accs[r..].split_first_chunk_mut::<1>().expect("1 row");
            let q1: &[QueryRef<'_>; 1] = qs[r..r + 1].try_into().expect("1 row");
            // SAFETY: as above.
            unsafe {
                x86::rows_avx2::<V, 1, 8>(features, keys, s1, a1, q1, valids[r], tile, vals, scale)
            };
            r += 1;
        }
    }
}

/// `flash_tile::tile_update_rows`' step (f32 queries; scores, softmax, `p·V`) for rows of a
/// sealed `int4c` K tile (`keys`, its group's parameters loaded into `tile` by
/// [`CodedTile::load_channel_params`]) and V rows `vals` as codes, both decoded in registers
/// (`fma(code, σ_c, ω_c)` and `fma(code, scale_g, offset_g)`: the values `quant::decode_rows`
/// gives, so the bits of decoding the tile first). Rows `r..r+3` with equal `valid` share
/// every load (AVX2; a decode's few rows, where decoding a whole tile first costs more than the
/// step). Panics on a shape mismatch or without AVX2.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub fn tile_update_channel_codes(
    features: CpuFeatures,
    sts: &mut [TileSoftmax],
    accs: &mut [&mut [f32]],
    qs: &[&[f32]],
    valids: &[usize],
    tile: &CodedTile,
    keys: &EncodedRows<'_>,
    vals: &EncodedRows<'_>,
    scale: f32,
) {
    let rows = qs.len();
    let hd = tile.hd;
    let max_valid = valids.iter().copied().max().unwrap_or(0);
    assert!(
        features.clamp_to_detected().avx2
            && rows == sts.len()
            && rows == accs.len()
            && rows == valids.len()
            && hd.is_multiple_of(16)
            && qs.iter().all(|q| q.len() == hd)
            && accs.iter().all(|a| a.len() == hd)
            && valids.iter().all(|v| (1..=TILE_POSITIONS).contains(v))
            && matches!(keys.kind(), KvCodecKind::Int4Channel { .. })
            && keys.head_dim() == hd
            && keys.row_bytes() == hd / 2
            && keys.num_rows() >= max_valid.div_ceil(8) * 8
            && values_from_codes(vals.kind(), hd)
            && vals.head_dim() == hd
            && vals.num_rows() >= max_valid,
        "int4c coded tile shapes: hd={hd} valids={valids:?}"
    );
    let (scales, offsets) = tile.channel_params();
    let k = x86::ChannelRows {
        codes: keys.bytes().as_ptr(),
        row_bytes: hd / 2,
        scales: scales.as_ptr(),
        offsets: offsets.as_ptr(),
    };
    let args = (sts, accs, qs, valids, scale);
    if matches!(vals.kind(), KvCodecKind::Int4 { .. }) {
        channel_blocks(args, k, x86::CodedRows::<true>::new(vals));
    } else {
        channel_blocks(args, k, x86::CodedRows::<false>::new(vals));
    }
}

/// [`tile_update_channel_codes`]' rows in blocks of three sharing `valid`, else one at a time.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::type_complexity)]
fn channel_blocks<V: super::flash_tile::avx2::ValueRows>(
    args: (
        &mut [TileSoftmax],
        &mut [&mut [f32]],
        &[&[f32]],
        &[usize],
        f32,
    ),
    keys: x86::ChannelRows,
    vals: V,
) {
    use super::flash_tile::avx2::tile_rows_values;
    let (sts, accs, qs, valids, scale) = args;
    let mut r = 0;
    while r < qs.len() {
        if r + 3 <= qs.len() && valids[r + 1] == valids[r] && valids[r + 2] == valids[r] {
            let (s3, _) = sts[r..].split_first_chunk_mut::<3>().expect("3 rows");
            let (a3, _) = accs[r..].split_first_chunk_mut::<3>().expect("3 rows");
            let q3: &[&[f32]; 3] = qs[r..r + 3].try_into().expect("3 rows");
            // SAFETY: AVX2+FMA+F16C detected (asserted by the caller); K holds
            // `ceil(valid/8)·8` rows and V `valid` rows of `hd` (asserted by the caller).
            unsafe { tile_rows_values::<_, _, 3, 4>(s3, a3, q3, keys, vals, valids[r], scale) };
            r += 3;
        } else {
            let (s1, _) = sts[r..].split_first_chunk_mut::<1>().expect("1 row");
            let (a1, _) = accs[r..].split_first_chunk_mut::<1>().expect("1 row");
            let q1: &[&[f32]; 1] = qs[r..r + 1].try_into().expect("1 row");
            // SAFETY: as above.
            unsafe { tile_rows_values::<_, _, 1, 8>(s1, a1, q1, keys, vals, valids[r], scale) };
            r += 1;
        }
    }
}

/// `flash_tile_wide::tile_update_wide` (f32 queries, K transposed in `kt`) for rows sharing
/// `valid`, reading V as codes (decoded in registers: the same values, so the same bits as
/// with the decoded tile). Panics on a shape mismatch or a V codec [`values_from_codes`]
/// rejects.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub fn tile_update_wide_codes(
    proof: super::flash_tile_wide::WideTiles,
    sts: &mut [TileSoftmax],
    accs: &mut [&mut [f32]],
    qs: &[&[f32]],
    valid: usize,
    kt: &[f32],
    vals: &EncodedRows<'_>,
    scale: f32,
) {
    let _ = proof;
    let rows = qs.len();
    let hd = vals.head_dim();
    assert!(
        rows == sts.len()
            && rows == accs.len()
            && hd.is_multiple_of(16)
            && qs.iter().all(|q| q.len() == hd)
            && accs.iter().all(|a| a.len() == hd)
            && (1..=TILE_POSITIONS).contains(&valid)
            && kt.len() >= hd * TILE_POSITIONS
            && values_from_codes(vals.kind(), hd)
            && vals.num_rows() >= valid,
        "wide coded-V tile shapes: hd={hd} valid={valid}"
    );
    let mut r = 0;
    while r < rows {
        if r + 3 <= rows {
            let (s3, _) = sts[r..].split_first_chunk_mut::<3>().expect("3 rows");
            let (a3, _) = accs[r..].split_first_chunk_mut::<3>().expect("3 rows");
            let q3: &[&[f32]; 3] = qs[r..r + 3].try_into().expect("3 rows");
            // SAFETY: AVX-512 F (with AVX2, FMA, F16C) is proven by the `WideTiles` token;
            // shapes checked above.
            unsafe { x86::wide_rows::<3>(s3, a3, q3, valid, kt, vals, scale) };
            r += 3;
        } else {
            let (s1, _) = sts[r..].split_first_chunk_mut::<1>().expect("1 row");
            let (a1, _) = accs[r..].split_first_chunk_mut::<1>().expect("1 row");
            let q1: &[&[f32]; 1] = qs[r..r + 1].try_into().expect("1 row");
            // SAFETY: as above.
            unsafe { x86::wide_rows::<1>(s1, a1, q1, valid, kt, vals, scale) };
            r += 1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX2 / AVX-VNNI / AVX-512 VNNI bodies; callers check the features at runtime.
    use super::super::flash_tile::avx2::{finish_rows, ValueRows};
    use super::super::flash_tile_wide::x86::{finish, scores16, softmax16};

    /// `flash_tile_wide`'s step for `R` rows with V read as codes.
    ///
    /// # Safety
    /// AVX-512 F, AVX2, FMA, F16C present; shapes as [`tile_update_wide_codes`] asserts.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn wide_rows<const R: usize>(
        sts: &mut [TileSoftmax; R],
        accs: &mut [&mut [f32]; R],
        qs: &[&[f32]; R],
        valid: usize,
        kt: &[f32],
        vals: &EncodedRows<'_>,
        scale: f32,
    ) {
        // SAFETY: forwarded caller's contract.
        let s = unsafe { scores16::<R>(qs, kt, scale) };
        // SAFETY: as above; `softmax16` masks positions past `valid`.
        let p = unsafe { softmax16::<R>(sts, accs, s, valid) };
        let aps: [*mut f32; R] = std::array::from_fn(|r| accs[r].as_mut_ptr());
        // SAFETY: every accumulator holds `hd` floats; `vals` holds `valid` rows of an
        // accepted codec (asserted by the caller).
        unsafe { pv_codes::<R>(&aps, vals, &p, valid) };
    }
    use super::*;
    use std::arch::x86_64::*;

    /// 16 rows of 16 dwords at `src + t · stride` transposed into `kt[(j0 + j) · 16 + t]`.
    ///
    /// # Safety
    /// AVX-512 F present; `src + t·stride` readable for 64 bytes for `t < 16`; `kt` holds
    /// `(j0 + 16) · 16` words.
    #[target_feature(enable = "avx512f,avx2")]
    pub(super) unsafe fn transpose16(src: *const u8, stride: usize, kt: &mut [u32], j0: usize) {
        assert!(kt.len() >= (j0 + 16) * TILE_POSITIONS);
        // SAFETY: caller's contract (16 readable rows of 64 bytes).
        let r: [__m512i; 16] =
            std::array::from_fn(|t| unsafe { _mm512_loadu_si512(src.add(t * stride).cast()) });
        let t: [__m512i; 16] = std::array::from_fn(|i| {
            let (a, b) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_epi32(a, b)
            } else {
                _mm512_unpackhi_epi32(a, b)
            }
        });
        // u[4g + k]: within each 128-bit lane L, dword 4L + k of rows 4g..4g + 4.
        let u: [__m512i; 16] = std::array::from_fn(|i| {
            let (g, k) = (i / 4, i % 4);
            let (a, b) = (t[4 * g + (k / 2)], t[4 * g + 2 + (k / 2)]);
            if k % 2 == 0 {
                _mm512_unpacklo_epi64(a, b)
            } else {
                _mm512_unpackhi_epi64(a, b)
            }
        });
        let dp = kt.as_mut_ptr();
        for k in 0..4 {
            let v0 = _mm512_shuffle_i32x4::<0x44>(u[k], u[4 + k]);
            let v1 = _mm512_shuffle_i32x4::<0xEE>(u[k], u[4 + k]);
            let v2 = _mm512_shuffle_i32x4::<0x44>(u[8 + k], u[12 + k]);
            let v3 = _mm512_shuffle_i32x4::<0xEE>(u[8 + k], u[12 + k]);
            let outs = [
                (k, _mm512_shuffle_i32x4::<0x88>(v0, v2)),
                (4 + k, _mm512_shuffle_i32x4::<0xDD>(v0, v2)),
                (8 + k, _mm512_shuffle_i32x4::<0x88>(v1, v3)),
                (12 + k, _mm512_shuffle_i32x4::<0xDD>(v1, v3)),
            ];
            for (c, o) in outs {
                // SAFETY: row `j0 + c < j0 + 16` of `kt` (asserted above).
                unsafe { _mm512_storeu_si512(dp.add((j0 + c) * TILE_POSITIONS).cast(), o) };
            }
        }
    }

    /// [`CodedTile::widen_channels`] 16 positions at a time.
    ///
    /// # Safety
    /// AVX-512 F present; `kt` holds `scales.len() / 4 · 16` words, `kt32` `scales.len() · 16`
    /// floats, `offsets` as many as `scales`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn widen_channels(
        kt: &[u32],
        scales: &[f32],
        offsets: &[f32],
        kt32: &mut [f32],
    ) {
        let hd = scales.len();
        assert!(kt.len() >= hd / 4 * 16 && kt32.len() >= hd * 16 && offsets.len() >= hd);
        let low = _mm512_set1_epi32(0xFF);
        let dp = kt32.as_mut_ptr();
        for j in 0..hd / 4 {
            // SAFETY: row `j < hd / 4` of `kt` holds 16 words.
            let w = unsafe { _mm512_loadu_si512(kt.as_ptr().add(16 * j).cast()) };
            let bytes = [
                _mm512_and_si512(w, low),
                _mm512_and_si512(_mm512_srli_epi32::<8>(w), low),
                _mm512_and_si512(_mm512_srli_epi32::<16>(w), low),
                _mm512_srli_epi32::<24>(w),
            ];
            for (i, b) in bytes.into_iter().enumerate() {
                let c = 4 * j + i;
                let x = _mm512_fmadd_ps(
                    _mm512_cvtepi32_ps(b),
                    _mm512_set1_ps(scales[c]),
                    _mm512_set1_ps(offsets[c]),
                );
                // SAFETY: row `c < hd` of `kt32` holds 16 floats.
                unsafe { _mm512_storeu_ps(dp.add(16 * c), x) };
            }
        }
    }

    /// [`unpack_nibbles`](super::unpack_nibbles) 16 bytes at a time.
    ///
    /// # Safety
    /// AVX2 present; `out.len() == 2 · packed.len()`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn unpack_nibbles(packed: &[u8], out: &mut [u8]) {
        let mask = _mm_set1_epi8(0x0F);
        let mut i = 0;
        while i + 16 <= packed.len() {
            // SAFETY: bytes `i..i + 16` of `packed`, `2i..2i + 32` of `out`.
            unsafe {
                let v = _mm_loadu_si128(packed.as_ptr().add(i).cast());
                let lo = _mm_and_si128(v, mask);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), mask);
                let op = out.as_mut_ptr().add(2 * i);
                _mm_storeu_si128(op.cast(), _mm_unpacklo_epi8(lo, hi));
                _mm_storeu_si128(op.add(16).cast(), _mm_unpackhi_epi8(lo, hi));
            }
            i += 16;
        }
        for j in i..packed.len() {
            out[2 * j] = packed[j] & 0x0F;
            out[2 * j + 1] = packed[j] >> 4;
        }
    }

    /// [`quantize_def`] in 512-bit lanes: the same maximum (order-free), product, rounding
    /// and clamp per element (NaN elements to 0, as Rust's saturating cast does), exact sums.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn quantize(x: &[f32], out: &mut [u32]) -> (f32, f32) {
        let n = x.len();
        assert!(n.is_multiple_of(16) && out.len() * 4 == n);
        let xp = x.as_ptr();
        let mut m = _mm512_setzero_ps();
        for i in (0..n).step_by(16) {
            // SAFETY: `i + 16 <= n`.
            let v = unsafe { _mm512_loadu_ps(xp.add(i)) };
            // `max(|v|, m)` returns `m` for a NaN `v` (f32::max ignores NaN too).
            m = _mm512_max_ps(_mm512_abs_ps(v), m);
        }
        let a = _mm512_reduce_max_ps(m);
        if !(a > 0.0 && a.is_finite()) {
            out.fill(0);
            return (0.0, 0.0);
        }
        let viq = _mm512_set1_ps(127.0 / a);
        let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        let mut sum = _mm512_setzero_si512();
        let op = out.as_mut_ptr();
        for i in (0..n).step_by(16) {
            // SAFETY: `i + 16 <= n`.
            let v = unsafe { _mm512_loadu_ps(xp.add(i)) };
            let y = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(v, viq),
            );
            let y = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
            let finite = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v);
            let q = _mm512_maskz_mov_epi32(finite, _mm512_cvttps_epi32(y));
            sum = _mm512_add_epi32(sum, q);
            // SAFETY: words `i/4..i/4 + 4` of `out` (16 bytes).
            unsafe { _mm_storeu_si128(op.add(i / 4).cast(), _mm512_cvtepi32_epi8(q)) };
        }
        (a / 127.0, _mm512_reduce_add_epi32(sum) as f32)
    }

    /// [`channel_bias_def`] compiled for AVX-512 (same operations).
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    pub(super) unsafe fn channel_bias(q: &[f32], offsets: &[f32]) -> f32 {
        channel_bias_def(q, offsets)
    }

    /// The 16 positions' integer dot products of `q8` with the tile, in 256-bit registers:
    /// `vpdpbusd` (AVX-512 VNNI VL or AVX-VNNI) or AVX2's exact `vpmaddwd` on bytes split into
    /// 16-bit halves.
    ///
    /// # Safety
    /// AVX2 present (and the VNNI form used only when `features` says so, clamped);
    /// `kt.len() >= q8.len() · 16`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dots16(features: CpuFeatures, q8: &[u32], kt: &[u32]) -> [i32; 16] {
        assert!(kt.len() >= q8.len() * TILE_POSITIONS);
        let mut out = [0i32; 16];
        let kp = kt.as_ptr();
        for h in 0..2 {
            // SAFETY: words `16j + 8h .. + 8` of `kt` for `j < q8.len()` (asserted above).
            let acc = unsafe {
                if features.vnni {
                    dots8_vnni(q8, kp.add(8 * h))
                } else if features.avxvnni {
                    dots8_avxvnni(q8, kp.add(8 * h))
                } else {
                    dots8_madd(q8, kp.add(8 * h))
                }
            };
            // SAFETY: `out` holds 16 i32.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(8 * h).cast(), acc) };
        }
        out
    }

    /// # Safety
    /// AVX-512 VNNI+VL present; `kp + 16j` readable for 8 words, `j < q8.len()`.
    #[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
    unsafe fn dots8_vnni(q8: &[u32], kp: *const u32) -> __m256i {
        let mut acc = _mm256_setzero_si256();
        for (j, &w) in q8.iter().enumerate() {
            // SAFETY: caller's contract.
            let k = unsafe { _mm256_loadu_si256(kp.add(16 * j).cast()) };
            acc = _mm256_dpbusd_epi32(acc, k, _mm256_set1_epi32(w as i32));
        }
        acc
    }

    /// # Safety
    /// AVX-VNNI present; `kp + 16j` readable for 8 words, `j < q8.len()`.
    #[target_feature(enable = "avx2,avxvnni")]
    unsafe fn dots8_avxvnni(q8: &[u32], kp: *const u32) -> __m256i {
        let mut acc = _mm256_setzero_si256();
        for (j, &w) in q8.iter().enumerate() {
            // SAFETY: caller's contract.
            let k = unsafe { _mm256_loadu_si256(kp.add(16 * j).cast()) };
            acc = _mm256_dpbusd_avx_epi32(acc, k, _mm256_set1_epi32(w as i32));
        }
        acc
    }

    /// # Safety
    /// AVX2 present; `kp + 16j` readable for 8 words, `j < q8.len()`.
    #[target_feature(enable = "avx2")]
    unsafe fn dots8_madd(q8: &[u32], kp: *const u32) -> __m256i {
        let low = _mm256_set1_epi16(0x00FF);
        let mut acc = _mm256_setzero_si256();
        for (j, &w) in q8.iter().enumerate() {
            let b = w.to_le_bytes().map(|x| x as i8 as i16 as u16 as u32);
            let q_even = _mm256_set1_epi32((b[0] | (b[2] << 16)) as i32);
            let q_odd = _mm256_set1_epi32((b[1] | (b[3] << 16)) as i32);
            // SAFETY: caller's contract.
            let k = unsafe { _mm256_loadu_si256(kp.add(16 * j).cast()) };
            let even = _mm256_and_si256(k, low);
            let odd = _mm256_srli_epi16::<8>(k);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(even, q_even));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(odd, q_odd));
        }
        acc
    }

    /// 8 rows of 8 dwords at `src + t · stride` transposed into `kt[(j0 + j) · 16 + p0 + t]`.
    ///
    /// # Safety
    /// AVX2 present; `src + t·stride` readable for 32 bytes for `t < 8`; `kt` holds
    /// `(j0 + 7) · 16 + p0 + 8` words.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn transpose8(
        src: *const u8,
        stride: usize,
        kt: &mut [u32],
        j0: usize,
        p0: usize,
    ) {
        assert!(kt.len() >= (j0 + 7) * TILE_POSITIONS + p0 + 8);
        // SAFETY: caller's contract (8 readable rows of 32 bytes).
        let r: [__m256i; 8] =
            std::array::from_fn(|t| unsafe { _mm256_loadu_si256(src.add(t * stride).cast()) });
        // t[2i], t[2i + 1]: dwords of rows 2i, 2i + 1 interleaved (low, high pairs per lane).
        let t: [__m256i; 8] = std::array::from_fn(|i| {
            let (a, b) = (r[2 * (i / 2)], r[2 * (i / 2) + 1]);
            if i % 2 == 0 {
                _mm256_unpacklo_epi32(a, b)
            } else {
                _mm256_unpackhi_epi32(a, b)
            }
        });
        // u[4g + k]: columns k (low lane) and k + 4 (high lane) of rows 4g..4g + 4.
        let u: [__m256i; 8] = std::array::from_fn(|i| {
            let (g, k) = (i / 4, i % 4);
            let (a, b) = (t[4 * g + k / 2], t[4 * g + 2 + k / 2]);
            if k % 2 == 0 {
                _mm256_unpacklo_epi64(a, b)
            } else {
                _mm256_unpackhi_epi64(a, b)
            }
        });
        let dp = kt.as_mut_ptr();
        for k in 0..4 {
            let lo = _mm256_permute2x128_si256::<0x20>(u[k], u[4 + k]);
            let hi = _mm256_permute2x128_si256::<0x31>(u[k], u[4 + k]);
            // SAFETY: words `(j0 + c) · 16 + p0 .. + 8` for `c < 8` (asserted above).
            unsafe {
                _mm256_storeu_si256(dp.add((j0 + k) * TILE_POSITIONS + p0).cast(), lo);
                _mm256_storeu_si256(dp.add((j0 + 4 + k) * TILE_POSITIONS + p0).cast(), hi);
            }
        }
    }

    /// The eight nibbles of the 4 bytes at `p` (element `2k` low, `2k + 1` high in byte `k`)
    /// as 32-bit lanes in element order: the word broadcast, lane `i` shifted right by `4i`.
    ///
    /// # Safety
    /// AVX2 present; `p` readable for 4 bytes.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn nibbles8(p: *const u8) -> __m256i {
        // SAFETY: caller's contract; `read_unaligned` has no alignment need.
        let w = _mm256_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() });
        let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        _mm256_and_si256(_mm256_srlv_epi32(w, shifts), _mm256_set1_epi32(0x0F))
    }

    /// V rows kept as `int8` / `int4` codes, decoded in the register on load:
    /// `fma(code, scale_g, offset_g)` (what `quant::decode_rows` gives, bit for bit).
    #[derive(Clone, Copy)]
    pub(super) struct CodedRows<const FOUR_BIT: bool> {
        base: *const u8,
        row_bytes: usize,
        /// Byte offset of the codes in a row (after the `(scale, offset)` f16 pairs).
        codes_at: usize,
        /// Per 8-element chunk `c`, the byte offset `4 · (8c / group)` of its group's pair.
        pair_at: [u8; MAX_CODED_HEAD_DIM / 8],
    }

    impl<const FOUR_BIT: bool> CodedRows<FOUR_BIT> {
        /// The rows of `v` (a codec [`values_from_codes`] accepts, `int4` iff `FOUR_BIT`).
        pub(super) fn new(v: &EncodedRows<'_>) -> Self {
            let hd = v.head_dim();
            let group = match v.kind() {
                KvCodecKind::Int8 { group } if !FOUR_BIT => group,
                KvCodecKind::Int4 { group } if FOUR_BIT => group,
                k => unreachable!("coded values of {k:?}"),
            };
            assert!(values_from_codes(v.kind(), hd) && hd <= MAX_CODED_HEAD_DIM);
            let mut pair_at = [0u8; MAX_CODED_HEAD_DIM / 8];
            for (c, p) in pair_at.iter_mut().enumerate().take(hd / 8) {
                // `hd / group <= 32` pairs (groups of at least 16), so `4g < 128`.
                *p = (4 * (8 * c / group)) as u8;
            }
            CodedRows {
                base: v.bytes().as_ptr(),
                row_bytes: v.row_bytes(),
                codes_at: 4 * (hd / group),
                pair_at,
            }
        }
    }

    impl<const FOUR_BIT: bool> ValueRows for CodedRows<FOUR_BIT> {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(self, t: usize, e: usize) -> __m256 {
            // SAFETY: AVX2+FMA+F16C present and row `t` holds elements
            // `e..e + 8` (caller's contract): its group's pair and codes lie inside the row.
            unsafe {
                let row = self.base.add(t * self.row_bytes);
                let pair = _mm_cvtph_ps(_mm_cvtsi32_si128(
                    row.add(self.pair_at[e / 8] as usize)
                        .cast::<i32>()
                        .read_unaligned(),
                ));
                let sc = _mm256_broadcastss_ps(pair);
                let of = _mm256_broadcastss_ps(_mm_movehdup_ps(pair));
                let codes = row.add(self.codes_at);
                let c = if FOUR_BIT {
                    nibbles8(codes.add(e / 2))
                } else {
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes.add(e).cast()))
                };
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), sc, of)
            }
        }
    }

    /// K rows of a sealed `int4c` group as nibble codes, decoded in the register on load:
    /// `fma(code, σ_c, ω_c)` (what `quant::decode_rows` gives, bit for bit).
    #[derive(Clone, Copy)]
    pub(super) struct ChannelRows {
        pub(super) codes: *const u8,
        pub(super) row_bytes: usize,
        pub(super) scales: *const f32,
        pub(super) offsets: *const f32,
    }

    impl ValueRows for ChannelRows {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn load8(self, t: usize, e: usize) -> __m256 {
            // SAFETY: AVX2+FMA+F16C present; row `t` holds elements `e..e + 8`
            // (bytes `e/2..e/2 + 4`) and the parameters `hd >= e + 8` channels (caller's
            // contract).
            unsafe {
                let c = nibbles8(self.codes.add(t * self.row_bytes + e / 2));
                _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(c),
                    _mm256_loadu_ps(self.scales.add(e)),
                    _mm256_loadu_ps(self.offsets.add(e)),
                )
            }
        }
    }

    /// The integer dot products of `R` query rows with the tile's first `8H` positions, every
    /// K load shared: AVX2's exact `vpmaddwd` on the codes split into even and odd bytes
    /// (zero-extended) against the query bytes sign-extended to 16 bits.
    ///
    /// # Safety
    /// AVX2 present; `kt.len() >= words · 16` with `words = qs[r].q8.len()` for every row.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn dots_madd<const R: usize, const H: usize>(
        qs: &[QueryRef<'_>; R],
        kt: &[u32],
        out: &mut [[i32; TILE_POSITIONS]; R],
    ) {
        let words = qs[0].q8.len();
        let kp = kt.as_ptr();
        let low = _mm256_set1_epi16(0x00FF);
        let mut acc = [[_mm256_setzero_si256(); H]; R];
        for j in 0..words {
            let mut even = [_mm256_setzero_si256(); H];
            let mut odd = [_mm256_setzero_si256(); H];
            for h in 0..H {
                // SAFETY: words `16j + 8h .. + 8` of `kt` (caller's contract).
                let k = unsafe { _mm256_loadu_si256(kp.add(16 * j + 8 * h).cast()) };
                even[h] = _mm256_and_si256(k, low);
                odd[h] = _mm256_srli_epi16::<8>(k);
            }
            for r in 0..R {
                let w = _mm256_set1_epi32(qs[r].q8[j] as i32);
                // Bytes 0, 2 (even) and 1, 3 (odd) of the word as signed 16-bit lanes.
                let q_even = _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(w));
                let q_odd = _mm256_srai_epi16::<8>(w);
                for h in 0..H {
                    let x = _mm256_add_epi32(
                        _mm256_madd_epi16(even[h], q_even),
                        _mm256_madd_epi16(odd[h], q_odd),
                    );
                    acc[r][h] = _mm256_add_epi32(acc[r][h], x);
                }
            }
        }
        for r in 0..R {
            for h in 0..H {
                // SAFETY: `8h + 8 <= 16` integers of `out[r]`.
                unsafe { _mm256_storeu_si256(out[r].as_mut_ptr().add(8 * h).cast(), acc[r][h]) };
            }
        }
    }

    /// `R` rows sharing `valid` on AVX2: integer dot products ([`dots_madd`], every K load
    /// shared; or [`dots16`] per row where a VNNI form is present — the same integers), the
    /// module doc's scores eight positions at a time, then `flash_tile`'s shared steps 2–4
    /// (`W` accumulator chunks per row in registers).
    ///
    /// # Safety
    /// AVX2, FMA, F16C present (VNNI forms used only when `features` says so, clamped); shapes
    /// as [`tile_update_codes`] asserts, `vals` holding `valid` rows of `hd`.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_avx2<V: ValueRows, const R: usize, const W: usize>(
        features: CpuFeatures,
        keys: KeyCodes,
        sts: &mut [TileSoftmax; R],
        accs: &mut [&mut [f32]; R],
        qs: &[QueryRef<'_>; R],
        valid: usize,
        tile: &CodedTile,
        vals: V,
        scale: f32,
    ) {
        let halves = valid.div_ceil(8);
        let mut dots = [[0i32; TILE_POSITIONS]; R];
        if features.vnni || features.avxvnni {
            for r in 0..R {
                // SAFETY: forwarded caller's contract.
                dots[r] = unsafe { dots16(features, qs[r].q8, &tile.kt) };
            }
        } else if halves == 1 {
            // SAFETY: the tile holds `hd / 4 · 16` words (caller's contract).
            unsafe { dots_madd::<R, 1>(qs, &tile.kt, &mut dots) };
        } else {
            // SAFETY: as above.
            unsafe { dots_madd::<R, 2>(qs, &tile.kt, &mut dots) };
        }
        let vscale = _mm256_set1_ps(scale);
        let lane_ids = _mm256_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
        let mut scores = [[f32::NEG_INFINITY; TILE_POSITIONS]; R];
        let mut vmax = [_mm256_set1_ps(f32::NEG_INFINITY); R];
        for h in 0..halves {
            // SAFETY: `8h + 8 <= 16` floats of each array.
            let (ks, ko) = unsafe {
                (
                    _mm256_loadu_ps(tile.k_scale.as_ptr().add(8 * h)),
                    _mm256_loadu_ps(tile.k_offset.as_ptr().add(8 * h)),
                )
            };
            // Lanes at or past `valid` become −∞ (weight exactly 0, never the maximum).
            let limit = _mm256_set1_ps((valid - 8 * h) as f32);
            let live = _mm256_cmp_ps::<_CMP_LT_OQ>(lane_ids, limit);
            for r in 0..R {
                let q = &qs[r];
                // SAFETY: `8h + 8 <= 16` integers of `dots[r]`.
                let d = _mm256_cvtepi32_ps(unsafe {
                    _mm256_loadu_si256(dots[r].as_ptr().add(8 * h).cast())
                });
                let s = match keys {
                    KeyCodes::Rows => {
                        let off = _mm256_mul_ps(ko, _mm256_set1_ps(q.sum8));
                        let x = _mm256_fmadd_ps(ks, d, off);
                        _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(q.s)), vscale)
                    }
                    KeyCodes::Channels => _mm256_mul_ps(
                        _mm256_fmadd_ps(_mm256_set1_ps(q.s), d, _mm256_set1_ps(q.bias)),
                        vscale,
                    ),
                };
                let s = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), s, live);
                // SAFETY: `8h + 8 <= 16` floats of `scores[r]`.
                unsafe { _mm256_storeu_ps(scores[r].as_mut_ptr().add(8 * h), s) };
                vmax[r] = _mm256_max_ps(vmax[r], s);
            }
        }
        // SAFETY: forwarded caller's contract.
        unsafe { finish_rows::<V, R, W>(sts, accs, &scores, &vmax, vals, valid) };
    }

    /// `R` rows sharing `valid`: scores of 16 positions from `vpdpbusd` (two chains per row),
    /// scaled as the module doc says, then `flash_tile_wide`'s steps 2–4.
    ///
    /// # Safety
    /// AVX-512 F+VL+VNNI, AVX2, FMA, F16C present; shapes as [`tile_update_codes`] asserts.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn rows<const R: usize>(
        keys: KeyCodes,
        sts: &mut [TileSoftmax; R],
        accs: &mut [&mut [f32]; R],
        qs: &[QueryRef<'_>; R],
        valid: usize,
        tile: &CodedTile,
        vals: TileValues<'_>,
        scale: f32,
    ) {
        let words = tile.hd / 4;
        let kp = tile.kt.as_ptr();
        let mut a = [[_mm512_setzero_si512(); 2]; R];
        let mut j = 0;
        while j + 2 <= words {
            for h in 0..2 {
                // SAFETY: row `j + h < words` of the tile holds 16 words.
                let k = unsafe { _mm512_loadu_si512(kp.add((j + h) * TILE_POSITIONS).cast()) };
                for r in 0..R {
                    let q = _mm512_set1_epi32(qs[r].q8[j + h] as i32);
                    a[r][h] = _mm512_dpbusd_epi32(a[r][h], k, q);
                }
            }
            j += 2;
        }
        if j < words {
            // SAFETY: row `j < words` of the tile holds 16 words.
            let k = unsafe { _mm512_loadu_si512(kp.add(j * TILE_POSITIONS).cast()) };
            for r in 0..R {
                let q = _mm512_set1_epi32(qs[r].q8[j] as i32);
                a[r][0] = _mm512_dpbusd_epi32(a[r][0], k, q);
            }
        }
        let vscale = _mm512_set1_ps(scale);
        // SAFETY: the arrays hold 16 floats.
        let (ks, ko) = unsafe {
            (
                _mm512_loadu_ps(tile.k_scale.as_ptr()),
                _mm512_loadu_ps(tile.k_offset.as_ptr()),
            )
        };
        let s: [__m512; R] = std::array::from_fn(|r| {
            let d = _mm512_cvtepi32_ps(_mm512_add_epi32(a[r][0], a[r][1]));
            let q = &qs[r];
            match keys {
                KeyCodes::Rows => {
                    let off = _mm512_mul_ps(ko, _mm512_set1_ps(q.sum8));
                    let x = _mm512_fmadd_ps(ks, d, off);
                    _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(q.s)), vscale)
                }
                KeyCodes::Channels => _mm512_mul_ps(
                    _mm512_fmadd_ps(_mm512_set1_ps(q.s), d, _mm512_set1_ps(q.bias)),
                    vscale,
                ),
            }
        });
        match vals {
            // SAFETY: forwarded caller's contract (`finish` masks positions past `valid`).
            TileValues::Decoded(v) => unsafe { finish::<R>(sts, accs, s, valid, v) },
            TileValues::Codes(v) => {
                // SAFETY: as above; `softmax16` masks positions past `valid`.
                let p = unsafe { softmax16::<R>(sts, accs, s, valid) };
                let aps: [*mut f32; R] = std::array::from_fn(|r| accs[r].as_mut_ptr());
                // SAFETY: every accumulator holds `hd` floats; `v` holds `valid` rows of an
                // accepted codec (asserted by `tile_update_codes`).
                unsafe { pv_codes::<R>(&aps, &v, &p, valid) };
            }
        }
    }

    /// Sixteen values of an integer row decoded in a register: `fma(code, scale, offset)` for
    /// elements `e0..e0 + 16` (one group).
    ///
    /// # Safety
    /// AVX-512 F present; `row` is one row of an accepted codec of `hd` values, `e0 + 16 <= hd`.
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn value16(
        row: *const u8,
        hd: usize,
        group: usize,
        four_bit: bool,
        e0: usize,
    ) -> __m512 {
        let g = e0 / group;
        // SAFETY: the header holds `hd / group` (scale, offset) f16 pairs (caller's contract).
        let (sc, of) = unsafe {
            let pair = _mm_cvtph_ps(_mm_cvtsi32_si128(
                row.add(4 * g).cast::<i32>().read_unaligned(),
            ));
            (
                _mm512_broadcastss_ps(pair),
                _mm512_broadcastss_ps(_mm_movehdup_ps(pair)),
            )
        };
        let codes = row.wrapping_add(4 * (hd / group));
        let c = if four_bit {
            // SAFETY: bytes `e0/2..e0/2 + 8` of the codes (caller's contract).
            let v = unsafe { _mm_loadl_epi64(codes.add(e0 / 2).cast()) };
            let mask = _mm_set1_epi8(0x0F);
            let lo = _mm_and_si128(v, mask);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), mask);
            _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi))
        } else {
            // SAFETY: bytes `e0..e0 + 16` of the codes (caller's contract).
            _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(codes.add(e0).cast()) })
        };
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), sc, of)
    }

    /// Step 4 over coded values: `acc_r += p[r][t]·v̂[t]` in position order, `v̂` decoded in
    /// registers, four vectors per row held at a time.
    ///
    /// # Safety
    /// AVX-512 F present; every `aps[r]` holds `hd` floats; `v` holds `valid` rows of a codec
    /// [`values_from_codes`] accepts.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    unsafe fn pv_codes<const R: usize>(
        aps: &[*mut f32; R],
        v: &EncodedRows<'_>,
        p: &[[f32; TILE_POSITIONS]; R],
        valid: usize,
    ) {
        let hd = v.head_dim();
        let (group, four_bit) = match v.kind() {
            KvCodecKind::Int8 { group } => (group, false),
            KvCodecKind::Int4 { group } => (group, true),
            _ => unreachable!("checked by values_from_codes"),
        };
        let (base, rb) = (v.bytes().as_ptr(), v.row_bytes());
        let mut e0 = 0;
        while e0 + 64 <= hd {
            // SAFETY: elements `e0..e0 + 64 <= hd` (caller's contract).
            unsafe { pv_block::<R, 4>(aps, base, rb, hd, group, four_bit, e0, p, valid) };
            e0 += 64;
        }
        while e0 < hd {
            // SAFETY: elements `e0..e0 + 16 <= hd` (`hd` is a multiple of 16).
            unsafe { pv_block::<R, 1>(aps, base, rb, hd, group, four_bit, e0, p, valid) };
            e0 += 16;
        }
    }

    /// [`pv_codes`] for elements `e0..e0 + 16W`, the `W` accumulators of every row held in
    /// registers (a constant width, so they never leave them).
    ///
    /// # Safety
    /// As [`pv_codes`]; `e0 + 16W <= hd`; `base + t·rb` is row `t < valid`.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn pv_block<const R: usize, const W: usize>(
        aps: &[*mut f32; R],
        base: *const u8,
        rb: usize,
        hd: usize,
        group: usize,
        four_bit: bool,
        e0: usize,
        p: &[[f32; TILE_POSITIONS]; R],
        valid: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); W]; R];
        for r in 0..R {
            for i in 0..W {
                // SAFETY: elements `e0 + 16i + 16 <= hd` of the accumulator.
                acc[r][i] = unsafe { _mm512_loadu_ps(aps[r].add(e0 + 16 * i)) };
            }
        }
        for t in 0..valid {
            let bp: [__m512; R] = std::array::from_fn(|r| _mm512_set1_ps(p[r][t]));
            for i in 0..W {
                // SAFETY: row `t < valid`, elements `e0 + 16i + 16 <= hd` (caller's contract).
                let x = unsafe { value16(base.add(t * rb), hd, group, four_bit, e0 + 16 * i) };
                for r in 0..R {
                    acc[r][i] = _mm512_fmadd_ps(bp[r], x, acc[r][i]);
                }
            }
        }
        for r in 0..R {
            for i in 0..W {
                // SAFETY: as above.
                unsafe { _mm512_storeu_ps(aps[r].add(e0 + 16 * i), acc[r][i]) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn feature_sets() -> Vec<CpuFeatures> {
        let d = CpuFeatures::detect();
        let mut v = vec![CpuFeatures::PORTABLE, CpuFeatures::AVX2];
        if d.avxvnni {
            v.push(CpuFeatures {
                avxvnni: true,
                ..CpuFeatures::AVX2
            });
        }
        if d.vnni {
            v.push(CpuFeatures {
                vnni: true,
                ..CpuFeatures::AVX2
            });
        }
        v.push(d);
        v
    }

    /// Every path (portable, AVX2 `vpmaddwd`, AVX-VNNI, AVX-512 VNNI 256- and 512-bit) gives the
    /// portable bits for both code kinds, rows of three and single rows with differing `valid`,
    /// over several tiles, with V decoded or read as `int8` / `int4` codes (the same bits as the
    /// decoded values on every path); and the scores are close to f32 attention over the
    /// decoded keys.
    #[test]
    #[allow(clippy::needless_range_loop)]
    fn code_tiles_match_the_portable_definition_on_every_path() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(41);
        for (hd, keys, v_kind) in [
            (64usize, KeyCodes::Rows, None),
            (64, KeyCodes::Channels, None),
            (128, KeyCodes::Rows, None),
            (16, KeyCodes::Channels, None),
            (80, KeyCodes::Rows, None),
            (64, KeyCodes::Rows, Some(KvCodecKind::Int8 { group: 64 })),
            (64, KeyCodes::Rows, Some(KvCodecKind::Int4 { group: 32 })),
            (
                96,
                KeyCodes::Channels,
                Some(KvCodecKind::Int4 { group: 16 }),
            ),
            (80, KeyCodes::Rows, Some(KvCodecKind::Int8 { group: 16 })),
        ] {
            let modes: &[bool] = if v_kind.is_some() {
                &[false, true]
            } else {
                &[false]
            };
            let rows = 5;
            let qs: Vec<Vec<f32>> = (0..rows)
                .map(|_| (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect())
                .collect();
            let valids_per_tile: Vec<[usize; 5]> = vec![
                [16; 5],
                [9, 9, 9, 3, 16],
                [16, 16, 16, 1, 1],
                [2, 2, 2, 2, 2],
            ];
            let mut results: Vec<Vec<Vec<u32>>> = Vec::new();
            let runs = feature_sets()
                .into_iter()
                .flat_map(|f| modes.iter().map(move |&coded_v| (f, coded_v)));
            for (features, coded_v) in runs {
                let mut sts = vec![TileSoftmax::default(); rows];
                let mut accs = vec![vec![0f32; hd]; rows];
                let mut tile = CodedTile::default();
                tile.reset(hd);
                let mut qc = QueryCodes::default();
                qc.reset(rows, hd);
                let mut trng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
                for valids in &valids_per_tile {
                    let n = *valids.iter().max().unwrap();
                    let mut vals: Vec<f32> =
                        (0..n * hd).map(|_| trng.gen_range(-1.0f32..1.0)).collect();
                    // V rows as codes, `vals` their decoded values.
                    let mut v_bytes = Vec::new();
                    if let Some(kind) = v_kind {
                        for row in vals.chunks_exact(hd) {
                            v_bytes.extend(quant::encode_row_to_vec(kind, row).unwrap());
                        }
                        let er = EncodedRows::new(kind, hd, &v_bytes).unwrap();
                        quant::decode_rows(&er, &mut vals);
                    }
                    match keys {
                        KeyCodes::Rows => {
                            let mut bytes = Vec::new();
                            for _ in 0..n {
                                let x: Vec<f32> =
                                    (0..hd).map(|_| trng.gen_range(-3.0f32..3.0)).collect();
                                let kind = KvCodecKind::Int8 { group: hd };
                                bytes.extend(quant::encode_row_to_vec(kind, &x).unwrap());
                            }
                            let kind = KvCodecKind::Int8 { group: hd };
                            let er = EncodedRows::new(kind, hd, &bytes).unwrap();
                            // Two runs (as a tile split over two blocks would be).
                            let first = n / 2;
                            tile.load_rows(features, &er.take_rows(first), 0);
                            tile.load_rows(features, &er.skip_rows(first), first);
                            for r in 0..rows {
                                qc.prepare_rows(features, r, &qs[r]);
                            }
                        }
                        KeyCodes::Channels => {
                            let kind = KvCodecKind::Int4Channel { tokens: 16 };
                            let x: Vec<f32> =
                                (0..16 * hd).map(|_| trng.gen_range(-3.0f32..3.0)).collect();
                            let mut group = vec![0u8; kind.bytes_per_group(hd).unwrap()];
                            quant::channel::encode_group(kind, &x, hd, &mut group).unwrap();
                            let (params, codes) = quant::channel::split_group(&group, hd);
                            let er = EncodedRows::new_group(kind, hd, params, codes).unwrap();
                            tile.load_channels(features, &er.take_rows(n), 0);
                            let (sc, of) = tile.channel_params();
                            let (sc, of) = (sc.to_vec(), of.to_vec());
                            for r in 0..rows {
                                qc.prepare_channels(features, r, &qs[r], &sc, &of);
                            }
                        }
                    }
                    let qrefs: Vec<QueryRef<'_>> = (0..rows).map(|r| qc.row(r)).collect();
                    let mut acc_refs: Vec<&mut [f32]> =
                        accs.iter_mut().map(|a| &mut a[..]).collect();
                    tile_update_codes(
                        features,
                        keys,
                        &mut sts,
                        &mut acc_refs,
                        &qrefs,
                        valids,
                        &tile,
                        match v_kind {
                            Some(kind) if coded_v => {
                                TileValues::Codes(EncodedRows::new(kind, hd, &v_bytes).unwrap())
                            }
                            _ => TileValues::Decoded(&vals),
                        },
                        0.125,
                    );
                }
                let mut bits: Vec<Vec<u32>> = accs
                    .iter()
                    .map(|a| a.iter().map(|x| x.to_bits()).collect())
                    .collect();
                bits.push(
                    sts.iter()
                        .flat_map(|s| [s.max.to_bits(), s.sum.to_bits()])
                        .collect(),
                );
                results.push(bits);
            }
            for (i, r) in results.iter().enumerate().skip(1) {
                assert_eq!(
                    r, &results[0],
                    "hd={hd} {keys:?} {v_kind:?}: path {i} vs portable"
                );
            }
        }
    }

    /// A sealed `int4c` K tile and coded V rows read in registers give the bits of the f32 tile
    /// step over the decoded tile (`flash_tile::tile_update`, row by row), for rows of three
    /// and single rows with differing `valid`, over several tiles.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn channel_code_tiles_equal_the_decoded_tile_step() {
        use super::super::flash_tile::tile_update;
        if !CpuFeatures::detect().avx2 {
            return;
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(49);
        for (hd, v_kind) in [
            (64usize, KvCodecKind::Int4 { group: 32 }),
            (64, KvCodecKind::Int8 { group: 64 }),
            (96, KvCodecKind::Int4 { group: 16 }),
            (16, KvCodecKind::Int8 { group: 16 }),
        ] {
            let rows = 5;
            let qs: Vec<Vec<f32>> = (0..rows)
                .map(|_| (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect())
                .collect();
            let mut want_st = vec![TileSoftmax::default(); rows];
            let mut want_acc = vec![vec![0f32; hd]; rows];
            let mut got_st = want_st.clone();
            let mut got_acc = want_acc.clone();
            let mut tile = CodedTile::default();
            tile.reset(hd);
            for valids in [[16usize; 5], [9, 9, 9, 3, 16], [16, 16, 16, 1, 8], [2; 5]] {
                let kind = KvCodecKind::Int4Channel { tokens: 16 };
                let x: Vec<f32> = (0..16 * hd).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
                let mut group = vec![0u8; kind.bytes_per_group(hd).unwrap()];
                quant::channel::encode_group(kind, &x, hd, &mut group).unwrap();
                let mut k_dec = vec![0f32; 16 * hd];
                quant::channel::decode_group(kind, &group, hd, &mut k_dec).unwrap();
                let (params, codes) = quant::channel::split_group(&group, hd);
                let k_rows = EncodedRows::new_group(kind, hd, params, codes).unwrap();
                let mut v_bytes = Vec::new();
                for _ in 0..16 {
                    let v: Vec<f32> = (0..hd).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
                    v_bytes.extend(quant::encode_row_to_vec(v_kind, &v).unwrap());
                }
                let v_rows = EncodedRows::new(v_kind, hd, &v_bytes).unwrap();
                let mut v_dec = vec![0f32; 16 * hd];
                quant::decode_rows(&v_rows, &mut v_dec);
                for r in 0..rows {
                    tile_update(
                        &mut want_st[r],
                        &mut want_acc[r],
                        &qs[r],
                        &k_dec,
                        &v_dec,
                        valids[r],
                        0.125,
                    );
                }
                tile.load_channel_params(&k_rows);
                let q_refs: Vec<&[f32]> = qs.iter().map(|q| &q[..]).collect();
                let mut acc_refs: Vec<&mut [f32]> =
                    got_acc.iter_mut().map(|a| &mut a[..]).collect();
                tile_update_channel_codes(
                    CpuFeatures::detect(),
                    &mut got_st,
                    &mut acc_refs,
                    &q_refs,
                    &valids,
                    &tile,
                    &k_rows,
                    &v_rows,
                    0.125,
                );
            }
            for r in 0..rows {
                let bits = |a: &[f32]| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got_acc[r]),
                    bits(&want_acc[r]),
                    "hd={hd} {v_kind:?} row {r}"
                );
                assert_eq!(got_st[r].max.to_bits(), want_st[r].max.to_bits());
                assert_eq!(got_st[r].sum.to_bits(), want_st[r].sum.to_bits());
            }
        }
    }

    /// The AVX2 transposition (blocks of 8 positions × 8 words, scalar remainders) equals the
    /// scalar one for runs at any tile position and widths with and without 32-byte blocks.
    #[test]
    fn code_transpositions_agree_for_partial_runs() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(47);
        for hd in [64usize, 96, 80, 16] {
            let kind = KvCodecKind::Int8 { group: hd };
            let mut bytes = Vec::new();
            for _ in 0..16 {
                let x: Vec<f32> = (0..hd).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
                bytes.extend(quant::encode_row_to_vec(kind, &x).unwrap());
            }
            let er = EncodedRows::new(kind, hd, &bytes).unwrap();
            for (at, n) in [(0usize, 16usize), (0, 9), (3, 13), (7, 8), (5, 2)] {
                let run = er.skip_rows(16 - n).take_rows(n);
                let tiles = [CpuFeatures::PORTABLE, CpuFeatures::detect()].map(|f| {
                    let mut tile = CodedTile::default();
                    tile.reset(hd);
                    tile.load_rows(f, &run, at);
                    tile
                });
                let [slow, fast] = &tiles;
                assert_eq!(fast.kt, slow.kt, "hd={hd} at={at} n={n}");
                assert_eq!(fast.k_scale, slow.k_scale);
                assert_eq!(fast.k_offset, slow.k_offset);
            }
        }
    }

    /// A `Channels` tile widened into the transposed layout holds exactly the decoded group
    /// (`quant::channel::decode_group`), on the portable and the detected path.
    #[test]
    fn widened_channel_tiles_equal_decoded_groups() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(45);
        for hd in [64usize, 128, 16] {
            let kind = KvCodecKind::Int4Channel { tokens: 16 };
            let x: Vec<f32> = (0..16 * hd).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
            let mut group = vec![0u8; kind.bytes_per_group(hd).unwrap()];
            quant::channel::encode_group(kind, &x, hd, &mut group).unwrap();
            let mut want = vec![0f32; 16 * hd];
            quant::channel::decode_group(kind, &group, hd, &mut want).unwrap();
            let (params, codes) = quant::channel::split_group(&group, hd);
            let er = EncodedRows::new_group(kind, hd, params, codes).unwrap();
            for features in [CpuFeatures::PORTABLE, CpuFeatures::detect()] {
                let mut tile = CodedTile::default();
                tile.reset(hd);
                tile.load_channels(features, &er, 0);
                let mut kt32 = vec![0f32; hd * 16];
                tile.widen_channels(features, &mut kt32);
                for t in 0..16 {
                    for c in 0..hd {
                        assert_eq!(
                            kt32[c * 16 + t].to_bits(),
                            want[t * hd + c].to_bits(),
                            "hd={hd} t={t} c={c} {features:?}"
                        );
                    }
                }
            }
        }
    }

    /// The integer score is the f32 dot product with the decoded key up to the query's
    /// quantisation (relative error well under 2% of ‖q‖·‖k̂‖), and the fast transposition
    /// equals the scalar one.
    #[test]
    fn scores_approximate_decoded_keys_and_transpositions_agree() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(43);
        let hd = 128;
        let kind = KvCodecKind::Int8 { group: hd };
        let mut bytes = Vec::new();
        let mut dec = Vec::new();
        for _ in 0..16 {
            let x: Vec<f32> = (0..hd).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
            let e = quant::encode_row_to_vec(kind, &x).unwrap();
            let mut d = vec![0f32; hd];
            quant::decode_row(kind, &e, &mut d).unwrap();
            bytes.extend(e);
            dec.push(d);
        }
        let er = EncodedRows::new(kind, hd, &bytes).unwrap();
        let mut fast = CodedTile::default();
        fast.reset(hd);
        fast.load_rows(CpuFeatures::detect(), &er, 0);
        let mut slow = CodedTile::default();
        slow.reset(hd);
        slow.load_rows(CpuFeatures::PORTABLE, &er, 0);
        assert_eq!(fast.kt, slow.kt);
        let q: Vec<f32> = (0..hd).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
        let mut qc = QueryCodes::default();
        qc.reset(1, hd);
        qc.prepare_rows(CpuFeatures::PORTABLE, 0, &q);
        let qr = qc.row(0);
        let qn = q.iter().map(|x| x * x).sum::<f32>().sqrt();
        for (t, k) in dec.iter().enumerate() {
            let got = score_of(
                KeyCodes::Rows,
                &slow,
                &qr,
                t,
                dot_codes(qr.q8, &slow.kt, t),
                1.0,
            );
            let want: f32 = q.iter().zip(k).map(|(a, b)| a * b).sum();
            let kn = k.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!(
                (got - want).abs() < 0.02 * qn * kn,
                "t={t}: {got} vs {want}"
            );
        }
    }
}
