//! Model hyper-parameters read from GGUF metadata.
//!
//! Owns the translation from `<arch>.*` metadata keys to a [`ModelConfig`] and its validation.
//! It never touches tensor data.

use crate::gguf::Metadata;

/// Architectures the forward pass implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1/2/3, Mistral, SmolLM2: no attention biases, interleaved ("normal") RoPE.
    Llama,
    /// Qwen2: Q/K/V biases, NEOX-style RoPE.
    Qwen2,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
        }
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
    /// Linear RoPE scaling factor (positions are divided by it); 1.0 when unset.
    pub rope_linear_scale: f32,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("GGUF has no general.architecture")]
    NoArchitecture,
    #[error("unsupported architecture {0:?} (supported: llama, qwen2)")]
    UnsupportedArch(String),
    #[error("missing metadata key {0}")]
    Missing(String),
    #[error("invalid model config: {0}")]
    Invalid(String),
}

impl ModelConfig {
    pub fn from_metadata(meta: &Metadata) -> Result<Self, ConfigError> {
        let arch_name = meta.architecture().ok_or(ConfigError::NoArchitecture)?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            other => return Err(ConfigError::UnsupportedArch(other.to_string())),
        };
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
        let rope_linear_scale = match meta.get_str(&key("rope.scaling.type")) {
            Some("linear") => meta.get_f32(&key("rope.scaling.factor")).unwrap_or(1.0),
            _ => 1.0,
        };
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
                Arch::Qwen2 => RopeStyle::Neox,
            },
            rope_linear_scale,
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
        if self.rope_linear_scale.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return bad("rope scaling factor must be positive".into());
        }
        Ok(())
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
