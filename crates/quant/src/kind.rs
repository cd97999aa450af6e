//! [`KvCodecKind`]: which codec a K or V row is stored with, its stable id/version for the cache
//! namespace, and its exact byte size per row.
//!
//! Owns the naming and the byte accounting of every codec. It never encodes or decodes values
//! (see `row`, `dot`, `axpy`).

use crate::error::QuantError;
use std::fmt;
use std::str::FromStr;

/// Default channel group of `int8` (the whole head at head_dim 64: one scale/offset per token per
/// head). int8 is accurate enough that finer groups buy little.
pub const DEFAULT_INT8_GROUP: usize = 64;
/// Default channel group of `int4`: 4-bit codes need finer groups to stay within +1% perplexity.
pub const DEFAULT_INT4_GROUP: usize = 32;
/// Default token group of `int4c` (per-channel K): the engine's default block size, so one
/// sealed block of one KV head is one group.
pub const DEFAULT_CHANNEL_TOKENS: usize = 16;

/// How one row (one token × one KV head, `head_dim` values) is stored.
///
/// Row layouts (all multi-byte values little-endian):
/// - `F32`: `head_dim` × f32.
/// - `F16` / `Bf16`: `head_dim` × u16 (IEEE binary16 / bfloat16 bits).
/// - `Fp8E4m3`: `[scale: f32][head_dim × e4m3 code]`, `scale = amax / 448`.
/// - `Int8 { group }`: `[(scale: f16, offset: f16) × head_dim/group][head_dim × u8 code]`.
/// - `Int4 { group }`: `[(scale: f16, offset: f16) × head_dim/group][head_dim/2 bytes]`, element
///   `2j` in the low nibble of byte `j`, element `2j+1` in the high nibble.
///
/// Integer codecs dequantise as `x̂ = code·scale + offset` (asymmetric, unsigned codes).
///
/// `Int8Hadamard` / `Int4Hadamard` (ids `int8h-g64`, `int4h-g32`) store `H·x` — the row rotated
/// by the normalised Walsh–Hadamard matrix (see `hadamard`) — with exactly the layout of
/// `Int8` / `Int4`. Outlier channels of K are spread over the whole row before the per-group
/// range is chosen. Scores read them as `(Hq)·dequant(row)` (the query is rotated once, when it
/// is prepared); decoding returns the unrotated values. `head_dim` must be a power of two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvCodecKind {
    F32,
    F16,
    Bf16,
    Fp8E4m3,
    /// 8-bit codes, one f16 scale and f16 offset per `group` channels.
    Int8 {
        group: usize,
    },
    /// 4-bit codes packed two per byte, one f16 scale and f16 offset per `group` channels.
    Int4 {
        group: usize,
    },
    /// `Int8` of the Hadamard-rotated row.
    Int8Hadamard {
        group: usize,
    },
    /// `Int4` of the Hadamard-rotated row.
    Int4Hadamard {
        group: usize,
    },
    /// KIVI-style per-channel 4-bit K: one f16 scale and f16 offset per *channel* over a group
    /// of `tokens` consecutive rows (one KV head's rows of one block), 4-bit codes per value.
    /// A *block codec*: it is encoded a whole group at a time when the group is complete
    /// (`crate::channel`), never row by row; the row functions reject it. Layout of one group:
    /// `[(scale: f16, offset: f16) × head_dim][tokens × head_dim/2 bytes]` (nibbles as `Int4`).
    /// K only (`KvCodecs::validate` rejects it for V).
    Int4Channel {
        tokens: usize,
    },
}

/// Bytes of one group's parameters (f16 scale + f16 offset) in the integer codecs.
pub const INT_PARAM_BYTES_PER_GROUP: usize = 4;
/// Bytes of the fp8 row scale (f32).
pub const FP8_SCALE_BYTES: usize = 4;

impl KvCodecKind {
    /// Every codec at its default settings, in order of decreasing bytes per row.
    pub const ALL_DEFAULTS: [KvCodecKind; 6] = [
        KvCodecKind::F32,
        KvCodecKind::F16,
        KvCodecKind::Bf16,
        KvCodecKind::Fp8E4m3,
        KvCodecKind::Int8 {
            group: DEFAULT_INT8_GROUP,
        },
        KvCodecKind::Int4 {
            group: DEFAULT_INT4_GROUP,
        },
    ];

    /// The Hadamard-rotated codecs at their default groups.
    pub const ROTATED_DEFAULTS: [KvCodecKind; 2] = [
        KvCodecKind::Int8Hadamard {
            group: DEFAULT_INT8_GROUP,
        },
        KvCodecKind::Int4Hadamard {
            group: DEFAULT_INT4_GROUP,
        },
    ];

    /// Short family name: `f32`, `f16`, `bf16`, `fp8`, `int8`, `int4`, `int8h`, `int4h`.
    pub fn name(&self) -> &'static str {
        match self {
            KvCodecKind::F32 => "f32",
            KvCodecKind::F16 => "f16",
            KvCodecKind::Bf16 => "bf16",
            KvCodecKind::Fp8E4m3 => "fp8",
            KvCodecKind::Int8 { .. } => "int8",
            KvCodecKind::Int4 { .. } => "int4",
            KvCodecKind::Int8Hadamard { .. } => "int8h",
            KvCodecKind::Int4Hadamard { .. } => "int4h",
            KvCodecKind::Int4Channel { .. } => "int4c",
        }
    }

    /// Stable identifier that fully determines the byte layout together with [`Self::version`]:
    /// `f32`, `f16`, `bf16`, `fp8-e4m3`, `int8-g64`, `int4-g32`, `int4h-g32`, … Goes into the
    /// cache namespace (a rotated codec never shares an id with its unrotated layout).
    pub fn id(&self) -> String {
        match self {
            KvCodecKind::Fp8E4m3 => "fp8-e4m3".to_string(),
            KvCodecKind::Int8 { group } => format!("int8-g{group}"),
            KvCodecKind::Int4 { group } => format!("int4-g{group}"),
            KvCodecKind::Int8Hadamard { group } => format!("int8h-g{group}"),
            KvCodecKind::Int4Hadamard { group } => format!("int4h-g{group}"),
            KvCodecKind::Int4Channel { tokens } => format!("int4c-t{tokens}"),
            other => other.name().to_string(),
        }
    }

    /// Version of the byte layout and rounding rules; bumped whenever encoded bytes of the same
    /// input could change, so cached blocks of an older version are never read as the new one.
    /// `int4` / `int4h` are at 2: their encoder searches clipped ranges (same layout, same
    /// decoder, different bytes); every other codec (`int4c` included) is at 1.
    pub fn version(&self) -> u32 {
        match self {
            KvCodecKind::Int4 { .. } | KvCodecKind::Int4Hadamard { .. } => 2,
            _ => 1,
        }
    }

    /// The channel group of an integer codec (rotated or not).
    #[inline]
    pub fn group(&self) -> Option<usize> {
        match self {
            KvCodecKind::Int8 { group }
            | KvCodecKind::Int4 { group }
            | KvCodecKind::Int8Hadamard { group }
            | KvCodecKind::Int4Hadamard { group } => Some(*group),
            _ => None,
        }
    }

    /// Whether the codec stores whole groups of rows (`int4c`) rather than independent rows.
    #[inline]
    pub fn is_block(&self) -> bool {
        matches!(self, KvCodecKind::Int4Channel { .. })
    }

    /// Rows per group of a block codec.
    #[inline]
    pub fn block_tokens(&self) -> Option<usize> {
        match self {
            KvCodecKind::Int4Channel { tokens } => Some(*tokens),
            _ => None,
        }
    }

    /// Bytes of one encoded group of a block codec (`tokens · bytes_per_row`).
    pub fn bytes_per_group(&self, head_dim: usize) -> Option<usize> {
        match self {
            KvCodecKind::Int4Channel { tokens } => {
                Some(INT_PARAM_BYTES_PER_GROUP * head_dim + tokens * head_dim / 2)
            }
            _ => None,
        }
    }

    /// Whether rows are Hadamard-rotated before they are stored.
    #[inline]
    pub fn is_rotated(&self) -> bool {
        matches!(
            self,
            KvCodecKind::Int8Hadamard { .. } | KvCodecKind::Int4Hadamard { .. }
        )
    }

    /// The codec that stores the (rotated) values: `Int4 { group }` for `Int4Hadamard { group }`,
    /// `Int8 { group }` for `Int8Hadamard { group }`, the codec itself otherwise.
    #[inline]
    pub fn storage(&self) -> KvCodecKind {
        match *self {
            KvCodecKind::Int8Hadamard { group } => KvCodecKind::Int8 { group },
            KvCodecKind::Int4Hadamard { group } => KvCodecKind::Int4 { group },
            other => other,
        }
    }

    /// Parses a family name (`int8` → default group) or a full id (`int8-g32`, `fp8-e4m3`).
    /// Case-insensitive; `fp8`, `e4m3`, `fp8-e4m3` and `q8`/`q4` aliases are accepted. The
    /// Hadamard-rotated codecs are `int8h` / `int4h` (`int4h-g64`, …).
    pub fn parse(s: &str) -> Result<KvCodecKind, QuantError> {
        let lower = s.trim().to_ascii_lowercase();
        let unknown = || QuantError::UnknownCodec(s.to_string());
        if let Some(rest) = lower.strip_prefix("int4c") {
            let tokens = match rest.strip_prefix("-t") {
                None if rest.is_empty() => DEFAULT_CHANNEL_TOKENS,
                Some(d) if !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) => {
                    d.parse::<usize>().map_err(|_| unknown())?
                }
                _ => return Err(unknown()),
            };
            return Ok(KvCodecKind::Int4Channel { tokens });
        }
        let (family, group) = match lower.rsplit_once("-g") {
            Some((family, digits))
                if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) =>
            {
                (
                    family,
                    Some(digits.parse::<usize>().map_err(|_| unknown())?),
                )
            }
            _ => (lower.as_str(), None),
        };
        let kind = match (family, group) {
            ("f32" | "fp32", None) => KvCodecKind::F32,
            ("f16" | "fp16", None) => KvCodecKind::F16,
            ("bf16", None) => KvCodecKind::Bf16,
            ("fp8" | "e4m3" | "fp8-e4m3", None) => KvCodecKind::Fp8E4m3,
            ("int8" | "q8", g) => KvCodecKind::Int8 {
                group: g.unwrap_or(DEFAULT_INT8_GROUP),
            },
            ("int4" | "q4", g) => KvCodecKind::Int4 {
                group: g.unwrap_or(DEFAULT_INT4_GROUP),
            },
            ("int8h" | "q8h", g) => KvCodecKind::Int8Hadamard {
                group: g.unwrap_or(DEFAULT_INT8_GROUP),
            },
            ("int4h" | "q4h", g) => KvCodecKind::Int4Hadamard {
                group: g.unwrap_or(DEFAULT_INT4_GROUP),
            },
            _ => return Err(unknown()),
        };
        Ok(kind)
    }

    /// [`KvCodecKind::parse`] with a `String` error (for command-line parsers).
    pub fn parse_str(s: &str) -> Result<KvCodecKind, String> {
        KvCodecKind::parse(s).map_err(|e| e.to_string())
    }

    /// Checks that rows of `head_dim` values can use this codec: integer groups must be positive
    /// multiples of 8 dividing `head_dim`; rotated codecs need a power-of-two `head_dim`.
    #[inline]
    pub fn validate(&self, head_dim: usize) -> Result<(), QuantError> {
        if head_dim == 0 {
            return Err(QuantError::ZeroHeadDim);
        }
        if let Some(group) = self.group() {
            if group == 0 || !group.is_multiple_of(8) || !head_dim.is_multiple_of(group) {
                return Err(QuantError::BadGroup { group, head_dim });
            }
        }
        if self.is_rotated() && !head_dim.is_power_of_two() {
            return Err(QuantError::RotationNeedsPowerOfTwo { head_dim });
        }
        if let Some(tokens) = self.block_tokens() {
            // Whole bytes per row: the group's parameters amortised over its rows.
            if tokens == 0
                || !head_dim.is_multiple_of(2)
                || !(INT_PARAM_BYTES_PER_GROUP * head_dim).is_multiple_of(tokens)
            {
                return Err(QuantError::BadChannelTokens { tokens, head_dim });
            }
        }
        Ok(())
    }

    /// Exact bytes of one encoded row of `head_dim` values, scales and offsets included
    /// (meaningful only when [`Self::validate`] accepts `head_dim`).
    #[inline]
    pub fn bytes_per_row(&self, head_dim: usize) -> usize {
        match self {
            KvCodecKind::F32 => 4 * head_dim,
            KvCodecKind::F16 | KvCodecKind::Bf16 => 2 * head_dim,
            KvCodecKind::Fp8E4m3 => FP8_SCALE_BYTES + head_dim,
            KvCodecKind::Int8 { group } => {
                INT_PARAM_BYTES_PER_GROUP * num_groups(head_dim, *group) + head_dim
            }
            KvCodecKind::Int4 { group } => {
                INT_PARAM_BYTES_PER_GROUP * num_groups(head_dim, *group) + head_dim.div_ceil(2)
            }
            KvCodecKind::Int8Hadamard { .. } | KvCodecKind::Int4Hadamard { .. } => {
                self.storage().bytes_per_row(head_dim)
            }
            // The group's per-channel parameters amortised over its rows (exact when `validate`
            // accepts the shape): head_dim 64, 16 tokens → 16 + 32 = 48 bytes.
            KvCodecKind::Int4Channel { tokens } => {
                INT_PARAM_BYTES_PER_GROUP * head_dim / tokens.max(&1) + head_dim.div_ceil(2)
            }
        }
    }
}

fn num_groups(head_dim: usize, group: usize) -> usize {
    head_dim.div_ceil(group.max(1))
}

impl fmt::Display for KvCodecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id())
    }
}

impl FromStr for KvCodecKind {
    type Err = QuantError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KvCodecKind::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_parse() {
        for kind in KvCodecKind::ALL_DEFAULTS
            .into_iter()
            .chain(KvCodecKind::ROTATED_DEFAULTS)
            .chain([
                KvCodecKind::Int8 { group: 32 },
                KvCodecKind::Int4 { group: 64 },
                KvCodecKind::Int4Hadamard { group: 64 },
            ])
        {
            assert_eq!(KvCodecKind::parse(&kind.id()), Ok(kind));
            assert_eq!(kind.to_string().parse::<KvCodecKind>(), Ok(kind));
            let clipped = matches!(
                kind,
                KvCodecKind::Int4 { .. } | KvCodecKind::Int4Hadamard { .. }
            );
            assert_eq!(kind.version(), if clipped { 2 } else { 1 });
        }
        assert_eq!(
            KvCodecKind::parse("INT8"),
            Ok(KvCodecKind::Int8 { group: 64 })
        );
        assert_eq!(
            KvCodecKind::parse("int4"),
            Ok(KvCodecKind::Int4 { group: 32 })
        );
        assert_eq!(KvCodecKind::parse("fp8"), Ok(KvCodecKind::Fp8E4m3));
        let rotated = KvCodecKind::parse("int4h").unwrap();
        assert_eq!(rotated, KvCodecKind::Int4Hadamard { group: 32 });
        assert_eq!(rotated.id(), "int4h-g32");
        assert_ne!(rotated.id(), rotated.storage().id());
        assert_eq!(rotated.storage(), KvCodecKind::Int4 { group: 32 });
        assert_eq!(
            KvCodecKind::parse("INT8H-g32"),
            Ok(KvCodecKind::Int8Hadamard { group: 32 })
        );
        for bad in [
            "",
            "int3",
            "f16-g32",
            "int8-g",
            "int8-gx",
            "int8-g99999999999999999999999",
            "int4hh",
            "f16h",
        ] {
            assert!(KvCodecKind::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bytes_per_row_counts_scales_and_offsets() {
        let d = 64;
        let expect = [
            (KvCodecKind::F32, 256),
            (KvCodecKind::F16, 128),
            (KvCodecKind::Bf16, 128),
            (KvCodecKind::Fp8E4m3, 68),
            (KvCodecKind::Int8 { group: 64 }, 68),
            (KvCodecKind::Int8 { group: 32 }, 72),
            (KvCodecKind::Int4 { group: 64 }, 36),
            (KvCodecKind::Int4 { group: 32 }, 40),
            (KvCodecKind::Int8Hadamard { group: 64 }, 68),
            (KvCodecKind::Int4Hadamard { group: 32 }, 40),
        ];
        for (kind, bytes) in expect {
            assert_eq!(kind.bytes_per_row(d), bytes, "{kind}");
        }
    }

    #[test]
    fn validate_rejects_bad_groups() {
        assert!(KvCodecKind::Int8 { group: 32 }.validate(64).is_ok());
        assert!(KvCodecKind::F16.validate(5).is_ok());
        assert_eq!(KvCodecKind::F16.validate(0), Err(QuantError::ZeroHeadDim));
        for group in [0, 12, 48, 128] {
            assert_eq!(
                KvCodecKind::Int4 { group }.validate(64),
                Err(QuantError::BadGroup {
                    group,
                    head_dim: 64
                })
            );
        }
        let rotated = KvCodecKind::Int4Hadamard { group: 8 };
        assert!(rotated.validate(64).is_ok());
        assert!(rotated.storage().validate(48).is_ok());
        assert_eq!(
            rotated.validate(48),
            Err(QuantError::RotationNeedsPowerOfTwo { head_dim: 48 })
        );
    }
}
