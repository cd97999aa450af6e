//! [`Numerics`]: how the forward pass computes, chosen once (by the engine at start, by a CLI
//! command, by a test) and carried by every batch; and [`RowKind`], what each row of a batch is.
//! Together they decide each row's matmul order and attention kernel, and [`Numerics::tag`]
//! names the arithmetic in the cache namespace, so blocks computed differently are never
//! shared.
//!
//! Owns that decision only: it never computes anything. No environment variable changes it.

use std::collections::HashMap;

use kernels::{MatmulArith, PackedDef};

use crate::attention::AttnArith;
use crate::kv::SeqSlot;

/// How the forward pass computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numerics {
    /// The engine's default: batch-invariant matmuls (block-sum order for packed matrices, the
    /// same on every CPU) and the tiled attention at every depth. Every row computes the same
    /// whatever its kind, batch or chunking.
    Engine,
    /// llama-server's arithmetic with `threads` threads: ggml's matmul orders (batch-invariant),
    /// llama.cpp's tiled prefill kernel for [`RowKind::LongPrompt`] rows, its per-row kernel
    /// for the others, and its split-KV decode (one chunk per thread) for
    /// [`RowKind::Generated`] rows beyond 256 positions. A row's arithmetic is a property of
    /// the row, never of the batch or the chunking.
    LlamaServer { threads: usize },
    /// An explicit pair, for reproductions of llama.cpp's tools (perplexity, whose step order
    /// changes K-quant products) and for measurements; the engine never uses it. The attention
    /// kernel applies to every row except [`RowKind::LongPrompt`] ones (llama.cpp's tiled
    /// prefill over f16 K/V); in [`AttnArith::Row`] a [`RowKind::Generated`] row takes the
    /// split-KV decode with one chunk per pool thread.
    Explicit {
        attention: AttnArith,
        matmul: MatmulArith,
    },
}

/// What a row of a batch is, as llama.cpp would have computed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// A prompt row of a prompt llama.cpp prefills in one step of at least
    /// [`crate::attention::PREFILL_MIN_TOKENS`] tokens (its tiled prefill kernel).
    LongPrompt,
    /// Any other prompt row (a short prompt; a prompt the engine computed before).
    Prompt,
    /// A generated token (in llama.cpp a one-token step).
    Generated,
}

impl RowKind {
    /// The kinds llama.cpp gives the rows of one step over `slots`: a token that is its
    /// sequence's only one in the step is [`RowKind::Generated`] (a one-token step), the rest
    /// [`RowKind::Prompt`]. For callers that compute as llama.cpp's tools do, step by step.
    pub fn by_step(slots: &[SeqSlot]) -> Vec<RowKind> {
        let mut per_seq: HashMap<SeqSlot, usize> = HashMap::new();
        for &s in slots {
            *per_seq.entry(s).or_default() += 1;
        }
        slots
            .iter()
            .map(|s| {
                if per_seq[s] == 1 {
                    RowKind::Generated
                } else {
                    RowKind::Prompt
                }
            })
            .collect()
    }
}

impl Numerics {
    /// The engine's numerics: [`Numerics::LlamaServer`] with the pool's `threads` when it
    /// reproduces llama.cpp, else [`Numerics::Engine`].
    pub fn for_engine(llama_cpp: bool, threads: usize) -> Numerics {
        if llama_cpp {
            Numerics::LlamaServer {
                threads: threads.max(1),
            }
        } else {
            Numerics::Engine
        }
    }

    /// The matmul order of every row.
    pub fn matmul(self) -> MatmulArith {
        match self {
            Numerics::Engine => MatmulArith::Invariant,
            Numerics::LlamaServer { .. } => MatmulArith::InvariantGgml,
            Numerics::Explicit { matmul, .. } => matmul,
        }
    }

    /// The attention kernel of rows that are not [`RowKind::LongPrompt`] over f16 K/V.
    pub fn attention(self) -> AttnArith {
        match self {
            Numerics::Engine => AttnArith::invariant(),
            Numerics::LlamaServer { .. } => AttnArith::Row,
            Numerics::Explicit { attention, .. } => attention,
        }
    }

    /// Whether a row of `kind` takes llama.cpp's tiled prefill arithmetic (over f16 K/V).
    pub fn tiled_prefill(self, kind: RowKind) -> bool {
        match self {
            Numerics::Engine => false,
            Numerics::LlamaServer { .. } | Numerics::Explicit { .. } => {
                self.attention() == AttnArith::Prefill || kind == RowKind::LongPrompt
            }
        }
    }

    /// The split-KV chunks a row of `kind` is attended in (0: one), with `pool_threads` threads
    /// in the pool.
    pub fn split_chunks(self, kind: RowKind, pool_threads: usize) -> usize {
        if self.attention() != AttnArith::Row || kind != RowKind::Generated {
            return 0;
        }
        match self {
            Numerics::LlamaServer { threads } => threads,
            _ => pool_threads,
        }
    }

    /// The namespace's arithmetic settings (`;key=value` pairs; empty for the pre-namespace
    /// default of ggml's order with llama.cpp's attention): what makes this arithmetic's K/V
    /// bytes differ from another's.
    pub fn tag(self) -> Vec<u8> {
        let mut tag = Vec::new();
        if self.attention() == AttnArith::Tiled {
            tag.extend_from_slice(b";attention=tiled");
        }
        if let Numerics::LlamaServer { threads } = self {
            // llama.cpp's per-row attention at every depth, its split-KV decode in `threads`
            // chunks for generated rows.
            tag.extend_from_slice(format!(";attention=llama.cpp-row-2;split={threads}").as_bytes());
        } else if self.attention() == AttnArith::Row {
            tag.extend_from_slice(b";attention=llama.cpp-row-2");
        }
        if self.matmul().packed_def() == PackedDef::BlockSum {
            tag.extend_from_slice(b";matmul=block-sum");
        }
        tag
    }

    /// How logs and reports name it.
    pub fn name(self) -> String {
        match self {
            Numerics::Engine => "engine".into(),
            Numerics::LlamaServer { threads } => format!("llama.cpp ({threads} threads)"),
            Numerics::Explicit { attention, matmul } => {
                format!("{} attention, {matmul:?} matmul", attention.name())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_numerics_decides_every_kind_of_row() {
        let server = Numerics::LlamaServer { threads: 2 };
        let kinds = [RowKind::LongPrompt, RowKind::Prompt, RowKind::Generated];
        let table: Vec<_> = [Numerics::Engine, server]
            .into_iter()
            .flat_map(|n| kinds.map(|k| (n.name(), k, n.tiled_prefill(k), n.split_chunks(k, 8))))
            .collect();
        let s = |x: &str| x.to_string();
        assert_eq!(
            table,
            [
                (s("engine"), RowKind::LongPrompt, false, 0),
                (s("engine"), RowKind::Prompt, false, 0),
                (s("engine"), RowKind::Generated, false, 0),
                (s("llama.cpp (2 threads)"), RowKind::LongPrompt, true, 0),
                (s("llama.cpp (2 threads)"), RowKind::Prompt, false, 0),
                // The numerics' own thread count, not the pool's.
                (s("llama.cpp (2 threads)"), RowKind::Generated, false, 2),
            ]
        );
    }

    #[test]
    fn the_tag_names_what_changes_the_bytes() {
        assert_eq!(
            Numerics::Engine.tag(),
            b";attention=tiled;matmul=block-sum".to_vec()
        );
        assert_eq!(
            Numerics::LlamaServer { threads: 4 }.tag(),
            b";attention=llama.cpp-row-2;split=4".to_vec()
        );
        assert_ne!(
            Numerics::LlamaServer { threads: 2 }.tag(),
            Numerics::LlamaServer { threads: 4 }.tag(),
            "split-KV chunks change the bits of generated rows"
        );
        let explicit = Numerics::Explicit {
            attention: AttnArith::Row,
            matmul: MatmulArith::InvariantGgml,
        };
        assert_eq!(explicit.tag(), b";attention=llama.cpp-row-2".to_vec());
    }
}
