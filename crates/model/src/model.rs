//! [`Model`]: a loaded GGUF model — config, weights, tokenizer, chat template, RoPE tables — and
//! the entry point of the forward pass.
//!
//! Owns loading and validation of a model file as a whole. It never holds K/V or request state.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{ConfigError, ModelConfig};
use crate::forward::{forward, ForwardBatch, ForwardError, Scratch};
use crate::kv::{KvDtype, KvError, KvStore};
use crate::kv_contiguous::ContiguousKv;
use crate::ops::Rope;
use crate::weights::{Weights, WeightsError};
use frontend::chat::{ChatError, ChatTemplate};
use frontend::tokenizer::{Tokenizer, TokenizerError};
use frontend::Frontend;
use gguf::{GgufError, GgufFile};
use kernels::ThreadPool;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("model file {path} not found. Fetch the default model with `agentkv fetch-model` (or pass --model PATH to a GGUF file)")]
    NotFound { path: PathBuf },
    #[error("{path}: {source}")]
    Gguf { path: PathBuf, source: GgufError },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Chat(#[from] ChatError),
}

/// A loaded model. Its parts are read through accessors; only this crate changes them.
pub struct Model {
    pub(crate) path: PathBuf,
    pub(crate) config: ModelConfig,
    pub(crate) weights: Weights,
    /// Tokenizer, chat template and context length, shared with whoever serves the model.
    pub(crate) frontend: Arc<Frontend>,
    pub(crate) rope: Rope,
    /// RoPE of the sliding-window layers (their own base, no frequency factors), if any.
    pub(crate) rope_local: Option<Rope>,
}

impl Model {
    /// The GGUF file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Architecture hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The tensors (for inspection: `agentkv info`, tests).
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Tokenizer, chat template and context length.
    pub fn frontend(&self) -> &Arc<Frontend> {
        &self.frontend
    }

    /// The frontend to change before the model is shared (a test swapping the chat template);
    /// `None` once it is.
    pub fn frontend_mut(&mut self) -> Option<&mut Frontend> {
        Arc::get_mut(&mut self.frontend)
    }

    /// RoPE of the global layers.
    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    /// RoPE of the sliding-window layers, if any.
    pub fn rope_local(&self) -> Option<&Rope> {
        self.rope_local.as_ref()
    }

    pub fn load(path: &Path) -> Result<Model, LoadError> {
        if !path.exists() {
            return Err(LoadError::NotFound {
                path: path.to_path_buf(),
            });
        }
        let file = GgufFile::open(path).map_err(|source| LoadError::Gguf {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_gguf(file, path)
    }

    /// A model from an already opened (or in-memory) GGUF file; `path` is what it reports.
    pub fn from_gguf(file: GgufFile, path: &Path) -> Result<Model, LoadError> {
        let file = Arc::new(file);
        let config = ModelConfig::from_metadata(file.metadata())?;
        let weights = Weights::load(file.clone(), &config)?;
        let tokenizer = Tokenizer::from_gguf(file.metadata())?;
        let chat_template = ChatTemplate::from_gguf(file.metadata(), &tokenizer)?;
        let frontend = Arc::new(Frontend::new(
            tokenizer,
            chat_template,
            config.context_length,
        ));
        // Per-pair frequency factors as llama.cpp picks them (`llama_model::get_rope_factors`):
        // `rope_freqs` (Llama 3), else Phi 3's long factors when the context served (the file's
        // context length: agentkv serves the whole of it) exceeds the original one, else its
        // short ones.
        let freq_factors = weights.rope_freqs.clone().or_else(|| {
            weights.rope_long_short.as_ref().map(|(long, short)| {
                if config.context_length > config.rope_orig_context {
                    long.clone()
                } else {
                    short.clone()
                }
            })
        });
        let rope = Rope {
            rope_dim: config.rope_dim,
            head_dim: config.head_dim,
            base: config.rope_base,
            style: config.rope_style,
            scaling: config.rope_scaling,
            freq_factors,
        };
        // Sliding-window layers: their own base, no factors, no position scaling (llama.cpp's
        // `rope_freq_scale_train_swa` is 1: Gemma 3's linear factor applies to global layers only).
        let rope_local = config.sliding_window.as_ref().map(|sw| Rope {
            base: sw.rope_base,
            freq_factors: None,
            scaling: config.rope_scaling.unscaled(),
            ..rope.clone()
        });
        Ok(Model {
            path: path.to_path_buf(),
            config,
            weights,
            frontend,
            rope,
            rope_local,
        })
    }

    pub fn gguf(&self) -> &GgufFile {
        &self.weights.file
    }

    /// BLAKE3 of the model file's bytes: the identity of the weights in every cache key.
    pub fn fingerprint(&self) -> [u8; 32] {
        *blake3::hash(self.gguf().file_bytes()).as_bytes()
    }

    /// Sets the context served per sequence (llama.cpp's `n_ctx_seq`), which picks Phi 3 128K's
    /// long RoPE factors beyond the original context and its short ones within it, as llama.cpp
    /// does; a model starts at its file's context length (all that agentkv's engine serves).
    /// Perplexity over windows of `ctx` tokens sets `ctx`, as `llama-perplexity -c ctx` runs.
    pub fn set_context_length(&mut self, n_ctx: usize) {
        if self.weights.rope_freqs.is_some() {
            return; // `rope_freqs` take precedence in llama.cpp too
        }
        if let Some((long, short)) = &self.weights.rope_long_short {
            let chosen = if n_ctx > self.config.rope_orig_context {
                long
            } else {
                short
            };
            self.rope.freq_factors = Some(chosen.clone());
        }
    }

    /// Runs one forward step; see [`forward`].
    pub fn forward(
        &self,
        pool: &ThreadPool,
        batch: &ForwardBatch<'_>,
        kv: &mut dyn KvStore,
        scratch: &mut Scratch,
    ) -> Result<Vec<f32>, ForwardError> {
        forward(
            &self.config,
            &self.weights,
            &self.rope,
            self.rope_local.as_ref(),
            pool,
            batch,
            kv,
            scratch,
        )
    }

    /// A contiguous K/V cache for `num_slots` sequences of up to `capacity` tokens.
    pub fn contiguous_kv(
        &self,
        num_slots: usize,
        capacity: usize,
        dtype: KvDtype,
    ) -> Result<ContiguousKv, KvError> {
        let c = &self.config;
        ContiguousKv::new(
            num_slots,
            c.num_layers,
            c.num_kv_heads,
            c.head_dim,
            capacity,
            dtype,
        )
    }

    /// The tokenizer (of [`Model::frontend`]).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.frontend.tokenizer
    }

    /// The chat template of the file, or the plain fallback (of [`Model::frontend`]).
    pub fn chat_template_or_fallback(&self) -> &ChatTemplate {
        self.frontend.chat_template_or_fallback()
    }

    /// See [`Frontend::encode_chat`].
    pub fn encode_chat(
        &self,
        messages: &[frontend::chat::ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, frontend::chat_prompt::ChatPromptError> {
        self.frontend
            .encode_chat(messages, tools, add_generation_prompt)
    }
}
