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

/// `$body` with `$rows` the [`x86::CodedRows`] of the coded V rows `$v` (its codec's width and
/// whether a row is one group chosen at compile time).
#[cfg(target_arch = "x86_64")]
macro_rules! coded_rows {
    ($v:expr, |$rows:ident| $body:expr) => {{
        let v = &$v;
        let four_bit = matches!(v.kind(), KvCodecKind::Int4 { .. });
        match (four_bit, x86::one_group(v)) {
            (true, true) => {
                let $rows = x86::CodedRows::<true, true>::new(v);
                $body
            }
            (true, false) => {
                let $rows = x86::CodedRows::<true, false>::new(v);
                $body
            }
            (false, true) => {
                let $rows = x86::CodedRows::<false, true>::new(v);
                $body
            }
            (false, false) => {
                let $rows = x86::CodedRows::<false, false>::new(v);
                $body
            }
        }
    }};
}

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
    #[inline]
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
    /// The same scales, then offsets, as stored (f16): what `flash_tile_pairs_coded` reads.
    k_params: [f16; 2 * TILE_POSITIONS],
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
    #[inline]
    pub fn reset(&mut self, hd: usize) {
        self.hd = hd;
        self.kt.resize(hd / 4 * TILE_POSITIONS, 0);
        self.unpacked.resize(TILE_POSITIONS * hd, 0);
        self.channel.resize(2 * hd, 0.0);
        self.halves.resize(2 * hd, f16::ZERO);
        self.pairs.resize(2 * hd, 0.0);
    }

    /// The tile's code words and its positions' f16 scales, then offsets, as
    /// [`CodedTile::load_rows`] left them (what `flash_tile_pairs_coded::CodedHalf::of` views as
    /// half a pair tile).
    #[inline]
    pub fn rows_codes(&self) -> (&[u32], &[f16; 2 * TILE_POSITIONS]) {
        (&self.kt, &self.k_params)
    }

    /// The current group's per-channel scales and offsets (`Channels`).
    #[inline]
    pub fn channel_params(&self) -> (&[f32], &[f32]) {
        self.channel.split_at(self.hd)
    }

    /// Loads `rows` (`int8`, one group per row) at tile positions `at..at + n`.
    #[inline]
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
        self.k_params[at..at + n].copy_from_slice(&halves[..n]);
        self.k_params[TILE_POSITIONS + at..TILE_POSITIONS + at + n]
            .copy_from_slice(&halves[TILE_POSITIONS..TILE_POSITIONS + n]);
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
    #[inline]
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
    #[inline]
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
    #[inline]
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

    /// Loads the per-channel parameters of `rows` (a run of a sealed `int4c` group's rows, its
    /// header in `rows.params()`) and decodes the run straight into K transposed at tile
    /// positions `at..at + n`: `kt32[c · 16 + at + t] = fma(code_{t,c}, σ_c, ω_c)`, the values
    /// [`Self::widen_channels`] gives after [`Self::load_channels`] (so the bits of
    /// `quant::decode_rows`), without the byte tile in between. The AVX2 prefill path: eight
    /// rows of packed codes are transposed as words and widened in registers. Panics unless
    /// the rows fit the tile and `kt32` holds `hd · 16` floats.
    #[inline]
    pub fn widen_channel_rows(
        &mut self,
        features: CpuFeatures,
        rows: &EncodedRows<'_>,
        at: usize,
        kt32: &mut [f32],
    ) {
        let (hd, n) = (self.hd, rows.num_rows());
        assert!(
            rows.head_dim() == hd
                && rows.row_bytes() == hd / 2
                && at + n <= TILE_POSITIONS
                && kt32.len() >= hd * TILE_POSITIONS,
            "int4c rows do not fit the tile"
        );
        self.load_channel_params(rows);
        let (scales, offsets) = self.channel.split_at(hd);
        let (codes, stride) = (rows.bytes(), hd / 2);
        let mut t0 = 0;
        #[cfg(target_arch = "x86_64")]
        if features.clamp_to_detected().avx2 && hd.is_multiple_of(64) {
            while t0 + 8 <= n {
                // SAFETY: AVX2 and FMA presence was checked at runtime; rows `t0..t0 + 8 <= n`
                // each hold `hd / 2` bytes of `codes`, `hd` is a multiple of 64, `kt32` holds
                // `hd · 16` floats and `at + t0 + 8 <= 16` (all asserted above).
                unsafe {
                    x86::widen_packed8(
                        codes.as_ptr().add(t0 * stride),
                        stride,
                        scales,
                        offsets,
                        kt32,
                        at + t0,
                    )
                };
                t0 += 8;
            }
        }
        let _ = features;
        for t in t0..n {
            let row = &codes[t * stride..(t + 1) * stride];
            for (c, (&s, &o)) in scales.iter().zip(offsets).enumerate() {
                let code = (row[c / 2] >> (4 * (c % 2))) & 0x0F;
                kt32[c * TILE_POSITIONS + at + t] = f32::from(code).mul_add(s, o);
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
    /// Per word of `q8`, its bytes 0, 2 and then 1, 3 sign-extended to 16-bit halves
    /// ([`query_pairs`]): AVX2's `vpmaddwd` operands, broadcast from memory as they are.
    pairs: Vec<u32>,
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
    /// `2 · q8.len()` words: [`QueryCodes`]' `pairs` of this row.
    pub pairs: &'a [u32],
    pub s: f32,
    pub sum8: f32,
    pub bias: f32,
}

impl QueryRef<'_> {
    /// A placeholder (no codes).
    pub const EMPTY: QueryRef<'static> = QueryRef {
        q8: &[],
        pairs: &[],
        s: 0.0,
        sum8: 0.0,
        bias: 0.0,
    };
}

impl QueryCodes {
    /// Room for `rows` rows of `hd`.
    #[inline]
    pub fn reset(&mut self, rows: usize, hd: usize) {
        self.hd = hd;
        self.q8.resize(rows * hd / 4, 0);
        self.pairs.resize(rows * hd / 2, 0);
        for v in [&mut self.s, &mut self.sum8, &mut self.bias] {
            v.resize(rows, 0.0);
        }
        self.scaled.resize(hd, 0.0);
    }

    /// Row `r` of a `Rows` codec: the query quantised as it is.
    #[inline]
    pub fn prepare_rows(&mut self, features: CpuFeatures, r: usize, q: &[f32]) {
        let hd = self.hd;
        assert_eq!(q.len(), hd, "query row length");
        let (s, sum8) = quantize(features, q, &mut self.q8[r * hd / 4..(r + 1) * hd / 4]);
        (self.s[r], self.sum8[r], self.bias[r]) = (s, sum8, 0.0);
        self.prepare_pairs(r);
    }

    /// Row `r`'s [`query_pairs`] from its quantised words.
    fn prepare_pairs(&mut self, r: usize) {
        let words = self.hd / 4;
        let q8 = &self.q8[r * words..(r + 1) * words];
        let pairs = &mut self.pairs[2 * r * words..2 * (r + 1) * words];
        for (&w, out) in q8.iter().zip(pairs.chunks_exact_mut(2)) {
            (out[0], out[1]) = query_pairs(w);
        }
    }

    /// Row `r` of a `Channels` group: `q ∘ scales` quantised, and the offsets' bias.
    #[inline]
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
        self.prepare_pairs(r);
    }

    /// Row `r` as the kernels read it.
    #[inline]
    pub fn row(&self, r: usize) -> QueryRef<'_> {
        let hd = self.hd;
        QueryRef {
            q8: &self.q8[r * hd / 4..(r + 1) * hd / 4],
            pairs: &self.pairs[r * hd / 2..(r + 1) * hd / 2],
            s: self.s[r],
            sum8: self.sum8[r],
            bias: self.bias[r],
        }
    }
}

/// A word of four i8 query codes as two words of two i16 halves: bytes 0 and 2 (low, high),
/// then bytes 1 and 3, each sign-extended.
pub(crate) fn query_pairs(word: u32) -> (u32, u32) {
    let b = word.to_le_bytes().map(|x| x as i8 as i16 as u16 as u32);
    (b[0] | b[2] << 16, b[1] | b[3] << 16)
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
pub(crate) fn dot_codes(q8: &[u32], kt: &[u32], t: usize) -> i32 {
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
#[inline]
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
#[inline]
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
            && qs
                .iter()
                .all(|q| q.q8.len() * 4 == hd && q.pairs.len() * 2 == hd)
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
            TileValues::Codes(v) => coded_rows!(v, |rows| avx2_blocks(args, rows)),
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
#[inline]
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
    coded_rows!(vals, |rows| channel_blocks(args, k, rows));
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

/// `flash_tile_transposed::tile_update_transposed` at 512 bits (f32 queries, K transposed in `kt`) for rows sharing
/// `valid`, reading V as codes (decoded in registers: the same values, so the same bits as
/// with the decoded tile). Panics on a shape mismatch or a V codec [`values_from_codes`]
/// rejects.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[inline]
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
mod x86;

#[cfg(test)]
mod tests;
