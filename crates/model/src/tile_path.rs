//! Which tile kernels attend a tiled task's query rows, as plain data chosen by one function per
//! level: [`TaskPath::choose`] once per task (K/V codecs × CPU features × head size × query
//! tokens per task × attention arithmetic) and [`TaskPath::pass`] per pass of rows that share a
//! tile. `attention_tiled.rs` runs what they say; the golden test below enumerates the table,
//! so "which kernel runs for this row, and why" is answered here.
//!
//! Every choice changes speed only: all the kernels a row can take give the same bits (their
//! own tests pin that). Owns the decision only; it never touches K/V or runs a kernel.

use kernels::flash_tile_codes::{values_from_codes, KeyCodes};
use kernels::CpuFeatures;
use quant::KvCodecKind;

use crate::attention::AttnArith;
use crate::kv::KvDtype;

/// From this many query rows sharing a tile on, the tile is widened to f32 once instead of
/// widening each element on load for every row.
pub const WIDEN_MIN_ROWS: usize = 8;

/// Query tokens per task below which a task is a decode's (few rows per tile): V is read from
/// its codes inside the tile step rather than decoded to a scratch first.
pub const FUSE_MAX_TOKENS: usize = 3;

/// Encoded K/V that the row kernels read directly in tiles of few rows (the others widen).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowCodec {
    /// bf16 K and V, widened on load like f16.
    Bf16,
    /// fp8 K and V (each row scaled), decoded to f32 first.
    Fp8,
}

/// The transposed tile step a widened tile goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transposed {
    /// AVX-512: 16 positions per vector (`kernels::flash_tile_wide`).
    Wide,
    /// AVX2, for tiles shared by many rows (`kernels::flash_tile_narrow`).
    Narrow,
}

/// What a task decides once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskPath {
    /// The 512-bit transposed step is available for widened tiles.
    pub wide: bool,
    /// The AVX2 transposed step is available (only where `wide` is not).
    pub narrow: bool,
    /// Query rows are rounded to f16 once (llama.cpp's per-row kernel and the tiled regime over
    /// f16 K/V); otherwise f32.
    pub q_f16: bool,
    /// K/V are stored encoded (anything but f16).
    pub encoded: bool,
    /// Encoded K/V whose tiles of few rows the row kernels read.
    pub row_codec: Option<RowCodec>,
    /// How K would be scored from its codes, whatever the ISA (`None`: decoded to f32).
    pub key_codes_any: Option<KeyCodes>,
    /// K scored from its codes in sealed tiles: `int8` rows everywhere, `int4c` channels only
    /// with the 512-bit step.
    pub key_codes: Option<KeyCodes>,
    /// A decode's tiles: V read from its codes in registers (AVX-512 VNNI, else AVX2).
    pub fuse_values: bool,
    /// A decode's sealed `int4c` tiles without the 512-bit step: K and V read from their codes
    /// by the AVX2 tile step.
    pub fuse_channels: bool,
    /// Sealed `int4c` K goes straight into the AVX2 transposed step's tile.
    pub stage_channels_narrow: bool,
}

/// What a pass of rows sharing each tile decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassPath {
    /// Tiles are widened to f32 once (encoded K/V the row kernels do not read, or many rows).
    pub widen: bool,
    /// The transposed step widened tiles take, if any.
    pub transposed: Option<Transposed>,
    /// Sealed `int4c` K is decoded straight into the AVX2 transposed tile.
    pub narrow_channels: bool,
}

impl TaskPath {
    /// The task-level choice for K/V in `codecs` with heads of `head_dim`, `task_tokens` query
    /// tokens per task, on `features` (taken as given: callers pass what the CPU has) in
    /// `arith`.
    pub fn choose(
        codecs: KvDtype,
        head_dim: usize,
        task_tokens: usize,
        features: CpuFeatures,
        arith: AttnArith,
    ) -> TaskPath {
        let wide = features.avx512 && head_dim.is_multiple_of(16);
        let narrow = !wide && features.avx2 && head_dim.is_multiple_of(8);
        let f16 = codecs == KvDtype::F16;
        let q_f16 = f16 && matches!(arith, AttnArith::Row | AttnArith::Tiled);
        let row_codec = if codecs == KvDtype::uniform(KvCodecKind::Bf16) {
            Some(RowCodec::Bf16)
        } else if codecs == KvDtype::uniform(KvCodecKind::Fp8E4m3) {
            Some(RowCodec::Fp8)
        } else {
            None
        };
        let key_codes_any = KeyCodes::of(codecs.k, head_dim);
        let fuse_values = values_from_codes(codecs.v, head_dim)
            && task_tokens < FUSE_MAX_TOKENS
            && if features.avx512 {
                features.vnni
            } else {
                features.avx2
            };
        let channels = key_codes_any == Some(KeyCodes::Channels);
        TaskPath {
            wide,
            narrow,
            q_f16,
            encoded: !f16,
            row_codec,
            key_codes_any,
            key_codes: key_codes_any.filter(|&k| k == KeyCodes::Rows || wide),
            fuse_values,
            fuse_channels: cfg!(target_arch = "x86_64") && fuse_values && !wide && channels,
            stage_channels_narrow: channels && narrow,
        }
    }

    /// The choice for a pass of `rows` query rows sharing each tile.
    pub fn pass(&self, rows: usize, head_dim: usize) -> PassPath {
        let widen = (self.encoded && self.row_codec.is_none()) || rows >= WIDEN_MIN_ROWS;
        let transposed = if self.wide {
            Some(Transposed::Wide)
        } else if self.narrow && rows >= WIDEN_MIN_ROWS {
            Some(Transposed::Narrow)
        } else {
            None
        };
        PassPath {
            widen,
            transposed,
            narrow_channels: transposed == Some(Transposed::Narrow) && head_dim.is_multiple_of(64),
        }
    }

    /// The tile step a whole, sealed (`sealed`: before the pass's own `int4c` group) or
    /// unsealed tile of the pass takes: the last rung of `attention_tiled.rs`'s ladder, named.
    #[cfg(test)]
    pub(crate) fn tile_step(&self, pass: &PassPath, sealed: bool) -> &'static str {
        if self.fuse_channels && sealed {
            return "int4c codes, AVX2 step (K and V in registers)";
        }
        if !pass.widen {
            match self.row_codec {
                Some(RowCodec::Fp8) => return "fp8 decoded, row kernel",
                Some(RowCodec::Bf16) => return "bf16, row kernel",
                None => {}
            }
        }
        let coded = self.key_codes.filter(|_| sealed);
        match coded {
            Some(KeyCodes::Channels) if self.fuse_values => {
                return "int4c codes widened, 512-bit step, V codes in registers"
            }
            Some(KeyCodes::Channels) => return "int4c codes widened, 512-bit transposed step",
            Some(KeyCodes::Rows) if self.fuse_values => {
                return "int8 key codes, integer scores, V codes in registers"
            }
            Some(KeyCodes::Rows) => return "int8 key codes, integer scores",
            None => {}
        }
        match (pass.widen, pass.transposed) {
            (true, Some(Transposed::Wide)) => "widened, 512-bit transposed step",
            (true, Some(Transposed::Narrow)) => "widened, AVX2 transposed step",
            (true, None) => "widened f32, row kernel",
            (false, _) => "f16, row kernel",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HD: usize = 64;

    fn isas() -> [(&'static str, CpuFeatures); 4] {
        let avx512 = CpuFeatures {
            avx512: true,
            vnni: true,
            ..CpuFeatures::AVX2
        };
        let avx512_no_vnni = CpuFeatures {
            avx512: true,
            ..CpuFeatures::AVX2
        };
        [
            ("portable", CpuFeatures::PORTABLE),
            ("avx2", CpuFeatures::AVX2),
            ("avx512", avx512_no_vnni),
            ("avx512-vnni", avx512),
        ]
    }

    fn codecs() -> Vec<(&'static str, KvDtype)> {
        [
            "f16",
            "bf16",
            "fp8",
            "int8",
            "int4",
            "k=int4c,v=int4",
            "k=int8,v=int4",
        ]
        .into_iter()
        .map(|name| (name, KvDtype::parse(name).unwrap()))
        .collect()
    }

    /// The whole table for SmolLM2's head size: codec × ISA × (tokens per task, rows per pass)
    /// × sealed tile → the step, in the tiled arithmetic (the engine's). Exact order; a change
    /// of any choice shows here.
    #[test]
    fn golden_table_of_tile_steps() {
        let mut table = String::new();
        for (codec, kv) in codecs() {
            for (isa, f) in isas() {
                // A decode (1 token, 3 rows: one GQA group) and a prefill chunk (32 tokens).
                for (tokens, rows) in [(1, 3), (32, 96)] {
                    let task = TaskPath::choose(kv, HD, tokens, f, AttnArith::Tiled);
                    let pass = task.pass(rows, HD);
                    let sealed = task.tile_step(&pass, true);
                    let own = task.tile_step(&pass, false);
                    table.push_str(&format!("{codec} {isa} {tokens}: {sealed}"));
                    // Only a block K codec has an own (unsealed) group in a pass.
                    if kv.k.block_tokens().is_some() && own != sealed {
                        table.push_str(&format!(" | own group: {own}"));
                    }
                    table.push('\n');
                }
            }
        }
        let golden = include_str!("tile_path_golden.txt");
        assert_eq!(
            table, golden,
            "the tile-step table changed; if on purpose, update src/tile_path_golden.txt:\n{table}"
        );
    }

    #[test]
    fn the_arithmetic_decides_only_the_query_rounding() {
        for (_, kv) in codecs() {
            for (_, f) in isas() {
                let tiled = TaskPath::choose(kv, HD, 1, f, AttnArith::Tiled);
                let prefill = TaskPath::choose(kv, HD, 1, f, AttnArith::Prefill);
                assert_eq!(
                    TaskPath {
                        q_f16: tiled.q_f16,
                        ..prefill
                    },
                    tiled
                );
                assert!(
                    !prefill.q_f16,
                    "llama.cpp's tiled prefill keeps f32 queries"
                );
                assert_eq!(tiled.q_f16, kv == KvDtype::F16);
            }
        }
    }

    #[test]
    fn odd_head_sizes_fall_back_to_the_row_kernels() {
        let avx512 = isas()[3].1;
        let task = TaskPath::choose(KvDtype::F16, 40, 32, avx512, AttnArith::Tiled);
        assert!(
            !task.wide && task.narrow,
            "40 is a multiple of 8, not of 16"
        );
        let task = TaskPath::choose(
            KvDtype::parse("int8").unwrap(),
            36,
            1,
            avx512,
            AttnArith::Tiled,
        );
        assert_eq!(
            (task.wide, task.narrow, task.key_codes),
            (false, false, None)
        );
    }
}
