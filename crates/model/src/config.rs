//! Model hyper-parameters read from GGUF metadata.
//!
//! Owns the translation from `<arch>.*` metadata keys to a [`ModelConfig`] and its validation.
//! It never touches tensor data.

use crate::rope_scaling::{RopeScaling, ScalingKind};
use gguf::Metadata;

/// Architectures the forward pass implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1/2/3, Mistral, SmolLM2: no attention biases, interleaved ("normal") RoPE; Llama 3's
    /// RoPE frequency factors come as the `rope_freqs.weight` tensor.
    Llama,
    /// Qwen2 / Qwen2.5: Q/K/V biases, NEOX-style RoPE.
    Qwen2,
    /// Qwen3: no biases, RMSNorm of each query and key head (QK-norm), NEOX RoPE.
    Qwen3,
    /// Gemma 3: embeddings scaled by √hidden, QK-norm, post-attention and post-FFN norms,
    /// GELU(tanh)-gated FFN, interleaved sliding-window (local) and global layers with their own
    /// RoPE bases, NEOX RoPE, queries scaled before attention.
    Gemma3,
    /// Phi 3: fused QKV (`attn_qkv`) and gate/up (`ffn_up` = [gate; up]) matrices, NEOX RoPE,
    /// queries scaled before attention.
    Phi3,
}

/// Every architecture name this crate loads (`general.architecture`).
pub const SUPPORTED_ARCHS: &[&str] = &["llama", "qwen2", "qwen3", "gemma3", "phi3"];

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
        }
    }

    /// The architecture named `name` (a `general.architecture` value).
    pub fn from_name(name: &str) -> Option<Arch> {
        Some(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3" => Arch::Gemma3,
            "phi3" => Arch::Phi3,
            _ => return None,
        })
    }
}

/// The FFN's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnAct {
    /// `silu(gate) * up` (SwiGLU).
    Silu,
    /// `gelu_tanh(gate) * up` (GeGLU, Gemma).
    GeluTanh,
}

/// Which layers attend only a sliding window of recent positions.
#[derive(Debug, Clone, PartialEq)]
pub struct SlidingWindow {
    /// A local layer's query at position `p` attends positions `p + 1 - size ..= p`.
    pub size: usize,
    /// Per layer: `true` for a sliding-window (local) layer.
    pub local: Vec<bool>,
    /// RoPE base of the local layers (the global ones use [`ModelConfig::rope_base`]).
    pub rope_base: f32,
}

impl SlidingWindow {
    /// Number of local layers.
    pub fn num_local(&self) -> usize {
        self.local.iter().filter(|&&l| l).count()
    }
}

/// How RoPE pairs dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1) — GGUF llama tensors are permuted for this.
    Interleaved,
    /// Pairs (i, i + rot_dim/2) — GPT-NeoX / Qwen2.
    Neox,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub num_layers: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_size: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// Number of leading dimensions of each head that RoPE rotates.
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    /// RoPE frequency scaling of the global layers (linear, YaRN, longrope's magnitude), as
    /// llama.cpp derives it from `rope.scaling.*`.
    pub rope_scaling: RopeScaling,
    /// `rope.scaling.original_context_length` (the context length when absent): Phi 3's long
    /// RoPE factors apply when the context served exceeds it.
    pub rope_orig_context: usize,
    pub ffn_act: FfnAct,
    /// Embedding rows are multiplied by this (Gemma: √hidden).
    pub embed_scale: Option<f32>,
    /// The attention scale (`1/√head_dim`, or Gemma's `query_pre_attn_scalar`).
    pub attn_scale: f32,
    /// Whether the queries are multiplied by `attn_scale` before attention (as llama.cpp does for
    /// Gemma and Phi 3) rather than the scores after the dot product.
    pub scale_queries: bool,
    /// Sliding-window attention layers, if any.
    pub sliding_window: Option<SlidingWindow>,
    /// Final logits become `cap * tanh(logits / cap)` (Gemma 2 style), when set.
    pub final_logit_softcap: Option<f32>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("GGUF has no general.architecture")]
    NoArchitecture,
    #[error("unsupported architecture {0:?} (supported: llama, qwen2, qwen3, gemma3, phi3)")]
    UnsupportedArch(String),
    #[error("missing metadata key {0}")]
    Missing(String),
    #[error("invalid model config: {0}")]
    Invalid(String),
}

impl ModelConfig {
    pub fn from_metadata(meta: &Metadata) -> Result<Self, ConfigError> {
        let arch_name = meta.architecture().ok_or(ConfigError::NoArchitecture)?;
        let arch = Arch::from_name(arch_name)
            .ok_or_else(|| ConfigError::UnsupportedArch(arch_name.to_string()))?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize, ConfigError> {
            meta.get_u64(&key(k))
                .map(|v| v as usize)
                .ok_or_else(|| ConfigError::Missing(key(k)))
        };
        let num_layers = req("block_count")?;
        let hidden_size = req("embedding_length")?;
        let num_heads = req("attention.head_count")?;
        let num_kv_heads = meta
            .get_u64(&key("attention.head_count_kv"))
            .map(|v| v as usize)
            .unwrap_or(num_heads);
        let ffn_size = req("feed_forward_length")?;
        let context_length = req("context_length")?;
        if num_heads == 0 || num_kv_heads == 0 || hidden_size == 0 || num_layers == 0 {
            return Err(ConfigError::Invalid("zero-sized dimension".into()));
        }
        let head_dim = meta
            .get_u64(&key("attention.key_length"))
            .map(|v| v as usize)
            .unwrap_or(hidden_size / num_heads);
        let vocab_size = match meta.get_u64(&key("vocab_size")) {
            Some(v) => v as usize,
            None => meta
                .get_str_array("tokenizer.ggml.tokens")
                .map(|t| t.len())
                .ok_or_else(|| ConfigError::Missing(key("vocab_size")))?,
        };
        let rms_eps = meta
            .get_f32(&key("attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-5);
        let rope_base = meta.get_f32(&key("rope.freq_base")).unwrap_or(10_000.0);
        let rope_dim = meta
            .get_u64(&key("rope.dimension_count"))
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        // llama.cpp assumes "linear" when a file names no type (a factor alone scales linearly)
        // and refuses types it does not know; so do we, rather than ignore them.
        let scaling_kind = match meta.get_str(&key("rope.scaling.type")) {
            None => ScalingKind::Linear,
            Some(name) => ScalingKind::from_name(name).ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "rope.scaling.type {name:?} is not one of none, linear, yarn, longrope"
                ))
            })?,
        };
        let scaling_factor = meta
            .get_f32(&key("rope.scaling.factor"))
            .or_else(|| meta.get_f32(&key("rope.scale_linear")))
            .unwrap_or(0.0);
        if !(scaling_factor >= 0.0 && scaling_factor.is_finite()) {
            return Err(ConfigError::Invalid(format!(
                "rope.scaling.factor {scaling_factor} is not a finite non-negative number"
            )));
        }
        let rope_orig_context = meta
            .get_u64(&key("rope.scaling.original_context_length"))
            .map_or(context_length, |v| v as usize);
        let rope_scaling = RopeScaling::from_file(
            scaling_kind,
            scaling_factor,
            rope_orig_context,
            rope_dim,
            rope_base,
            meta.get_f32(&key("rope.scaling.attn_factor"))
                .unwrap_or(1.0),
        );
        let sliding_window = match arch {
            Arch::Gemma3 => match meta.get_u64(&key("attention.sliding_window")) {
                Some(size) if size > 0 => {
                    // `sliding_window_pattern`: per layer (an array of bools, `true` = local),
                    // or every `pattern`-th layer global and the others local (llama.cpp's
                    // default for Gemma 3 is 6: five local layers, then one global).
                    let pattern_key = key("attention.sliding_window_pattern");
                    let local: Vec<bool> = match meta.get(&pattern_key).and_then(|v| v.as_array()) {
                        Some(per_layer) => per_layer
                            .iter()
                            .map(|v| matches!(v, gguf::MetaValue::Bool(true)))
                            .collect(),
                        None => {
                            let pattern = meta.get_u64(&pattern_key).unwrap_or(6) as usize;
                            (0..num_layers)
                                .map(|l| pattern == 0 || l % pattern < pattern - 1)
                                .collect()
                        }
                    };
                    Some(SlidingWindow {
                        size: size as usize,
                        local,
                        rope_base: meta.get_f32(&key("rope.freq_base_swa")).unwrap_or(10_000.0),
                    })
                }
                _ => None,
            },
            // Phi 3 files may name a window, but llama.cpp runs them without one (its
            // conversion does not say which layers use it): so do we.
            _ => None,
        };
        let attn_scale = match arch {
            // Gemma 3 scales queries by `query_pre_attn_scalar^-1/2`: the head size except
            // for the 27B model (62 layers), where it is hidden / heads.
            Arch::Gemma3 if num_layers == 62 => 1.0 / ((hidden_size / num_heads) as f32).sqrt(),
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let final_logit_softcap = meta
            .get_f32(&key("final_logit_softcapping"))
            .filter(|&c| c > 0.0);
        let cfg = ModelConfig {
            arch,
            num_layers,
            hidden_size,
            num_heads,
            num_kv_heads,
            head_dim,
            ffn_size,
            vocab_size,
            context_length,
            rms_eps,
            rope_base,
            rope_dim,
            rope_style: match arch {
                Arch::Llama => RopeStyle::Interleaved,
                Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 | Arch::Phi3 => RopeStyle::Neox,
            },
            rope_scaling,
            rope_orig_context,
            ffn_act: match arch {
                Arch::Gemma3 => FfnAct::GeluTanh,
                _ => FfnAct::Silu,
            },
            embed_scale: (arch == Arch::Gemma3).then(|| (hidden_size as f32).sqrt()),
            attn_scale,
            scale_queries: matches!(arch, Arch::Gemma3 | Arch::Phi3),
            sliding_window,
            final_logit_softcap,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "head_count {} is not a multiple of head_count_kv {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.rope_dim > self.head_dim || !self.rope_dim.is_multiple_of(2) {
            return bad(format!(
                "rope dimension {} vs head dim {}",
                self.rope_dim, self.head_dim
            ));
        }
        if self.num_layers > 1024 || self.hidden_size > 1 << 16 || self.vocab_size > 1 << 22 {
            return bad("dimensions out of the supported range".into());
        }
        let s = &self.rope_scaling;
        if !(s.freq_scale > 0.0 && s.freq_scale.is_finite() && s.attn_factor.is_finite()) {
            return bad("rope scaling must be a positive finite factor".into());
        }
        if let Some(sw) = &self.sliding_window {
            if sw.size == 0 || sw.local.len() != self.num_layers {
                return bad("sliding window of size 0 or of the wrong layer count".into());
            }
            if sw.rope_base.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
                return bad("sliding-window rope base must be positive".into());
            }
        }
        Ok(())
    }

    /// The sliding window of `layer` (`None` for a global layer).
    pub fn window_of(&self, layer: usize) -> Option<usize> {
        self.sliding_window
            .as_ref()
            .filter(|sw| sw.local[layer])
            .map(|sw| sw.size)
    }

    /// Width of the concatenated K (or V) of one token in one layer.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Width of the concatenated query heads.
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// KV elements per token over all layers (K and V).
    pub fn kv_elems_per_token(&self) -> usize {
        2 * self.num_layers * self.kv_dim()
    }
}
