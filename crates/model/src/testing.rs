//! Tiny random-weight models for the tests of the crates above this one (behind the `testing`
//! feature): a complete [`Model`] — config, F32 weights, a byte-level BPE tokenizer with ChatML
//! control tokens, a chat template — built in memory in milliseconds, as a `llama` or a
//! Gemma-3-like `gemma3` (QK-norm, post-norms, sliding-window and global layers), so scheduler, engine and
//! server tests need no download. Its outputs are meaningless but deterministic, which is all
//! those tests compare. Never used by the product.

use std::path::Path;

use rand::SeedableRng;

use crate::model::{LoadError, Model};
use gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};

/// Which architecture a tiny model has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TinyArch {
    /// `llama`: tied output embedding, interleaved RoPE.
    Llama,
    /// `gemma3`: every `pattern`-th layer global, the others attend the last `window` positions.
    Gemma3 { window: usize, pattern: usize },
}

/// Shape of a tiny model.
#[derive(Debug, Clone, Copy)]
pub struct TinyModelSpec {
    pub seed: u64,
    pub num_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub context_length: usize,
    pub arch: TinyArch,
}

impl Default for TinyModelSpec {
    fn default() -> Self {
        TinyModelSpec {
            seed: 1,
            num_layers: 2,
            hidden: 64,
            ffn: 96,
            num_heads: 4,
            num_kv_heads: 2,
            context_length: 1024,
            arch: TinyArch::Llama,
        }
    }
}

/// Token ids of the tiny vocabulary: three control tokens, one token per byte, then one merged
/// token (`" t"`).
pub const TINY_ENDOFTEXT: u32 = 0;
pub const TINY_IM_START: u32 = 1;
pub const TINY_IM_END: u32 = 2;
/// The token of byte `b` is `TINY_FIRST_BYTE + b`.
pub const TINY_FIRST_BYTE: u32 = 3;
/// Vocabulary size of every tiny model.
pub const TINY_VOCAB: usize = 3 + 256 + 1;

/// The GGUF bytes of a tiny model (tied output embedding).
pub fn tiny_model_gguf(spec: &TinyModelSpec) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let mut w = GgufWriter::new();
    let arch = match spec.arch {
        TinyArch::Llama => "llama",
        TinyArch::Gemma3 { .. } => "gemma3",
    };
    let a = |k: &str| format!("{arch}.{k}");
    w.add_metadata("general.architecture", MetaValue::String(arch.into()));
    crate::synthetic::add_shape(
        &mut w,
        arch,
        [
            spec.num_layers,
            spec.hidden,
            spec.ffn,
            spec.num_heads,
            spec.num_kv_heads,
            spec.context_length,
            TINY_VOCAB,
        ],
    );
    w.add_metadata(a("rope.freq_base"), MetaValue::F32(10000.0));
    if let TinyArch::Gemma3 { window, pattern } = spec.arch {
        w.add_metadata(a("attention.sliding_window"), MetaValue::U32(window as u32));
        w.add_metadata(
            a("attention.sliding_window_pattern"),
            MetaValue::U32(pattern as u32),
        );
        w.add_metadata(a("rope.freq_base_swa"), MetaValue::F32(100.0));
    }
    w.add_metadata(a("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-5));
    // The synthetic models' tokenizer at the tiny vocabulary: no placeholders.
    crate::synthetic::add_tokenizer(&mut w, TINY_VOCAB);
    let head_dim = spec.hidden / spec.num_heads;
    let kv_dim = spec.num_kv_heads * head_dim;
    let (h, f) = (spec.hidden, spec.ffn);
    let mut tensors: Vec<(String, usize, usize, f32)> = vec![
        ("token_embd.weight".into(), TINY_VOCAB, h, 1.0),
        ("output_norm.weight".into(), 1, h, 1.0),
    ];
    for l in 0..spec.num_layers {
        let n = |s: &str| format!("blk.{l}.{s}");
        tensors.extend([
            (n("attn_norm.weight"), 1, h, 1.0),
            (n("ffn_norm.weight"), 1, h, 1.0),
            (n("attn_q.weight"), h, h, 0.3),
            (n("attn_k.weight"), kv_dim, h, 0.3),
            (n("attn_v.weight"), kv_dim, h, 0.3),
            (n("attn_output.weight"), h, h, 0.2),
            (n("ffn_gate.weight"), f, h, 0.2),
            (n("ffn_up.weight"), f, h, 0.2),
            (n("ffn_down.weight"), h, f, 0.2),
        ]);
        if let TinyArch::Gemma3 { .. } = spec.arch {
            tensors.extend([
                (n("attn_q_norm.weight"), 1, head_dim, 1.0),
                (n("attn_k_norm.weight"), 1, head_dim, 1.0),
                (n("post_attention_norm.weight"), 1, h, 1.0),
                (n("post_ffw_norm.weight"), 1, h, 1.0),
            ]);
        }
    }
    let tensors = tensors
        .into_iter()
        .map(|(name, rows, cols, scale)| (name, rows, cols, scale, GgmlType::F32))
        .collect();
    crate::synthetic::add_random_tensors(&mut w, &mut rng, tensors)
        .expect("tensor shapes are consistent");
    w.to_bytes().expect("a well-formed tiny model")
}

/// A tiny model built in memory (see [`tiny_model_gguf`]).
pub fn tiny_model(spec: &TinyModelSpec) -> Result<Model, LoadError> {
    let path = Path::new("tiny-model.gguf");
    let file = GgufFile::from_bytes(tiny_model_gguf(spec)).map_err(|source| LoadError::Gguf {
        path: path.to_path_buf(),
        source,
    })?;
    Model::from_gguf(file, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_model_loads_tokenizes_renders_chat_and_runs() {
        let m = tiny_model(&TinyModelSpec::default()).unwrap();
        assert_eq!(m.config.vocab_size, TINY_VOCAB);
        let ids = m.tokenizer().encode("hi", false, false).unwrap();
        assert_eq!(
            ids,
            [TINY_FIRST_BYTE + b'h' as u32, TINY_FIRST_BYTE + b'i' as u32]
        );
        let msgs = [frontend::chat::ChatMessage::new("user", "hi")];
        let text = m
            .chat_template_or_fallback()
            .render(&msgs, None, true)
            .unwrap();
        assert_eq!(
            text,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = greedy(&m, &ids, 4);
        assert_eq!(out.len(), 4);
        assert_eq!(out, greedy(&m, &ids, 4), "deterministic");
        let other = tiny_model(&TinyModelSpec {
            seed: 2,
            ..Default::default()
        })
        .unwrap();
        assert_ne!(
            greedy(&other, &ids, 8),
            greedy(&m, &ids, 8),
            "another seed is another model"
        );
    }

    fn greedy(m: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
        let opts = crate::generate::GenerateOptions {
            max_tokens: n,
            ..Default::default()
        };
        let pool = crate::ThreadPool::new(1);
        let (toks, _) = crate::generate::generate(m, &pool, prompt, &opts, |_| true).unwrap();
        toks.iter().map(|t| t.id).collect()
    }
}
