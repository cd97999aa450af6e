//! Options shared by the commands that load a model.

use std::path::PathBuf;

use anyhow::Result;
use model::{Model, ThreadPool};

#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf, or $AGENTKV_MODEL).
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Compute threads (default: all cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
}

impl ModelArgs {
    pub fn path(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(model::default_model_path)
    }

    pub fn load(&self) -> Result<Model> {
        Ok(Model::load(&self.path())?)
    }

    pub fn pool(&self) -> ThreadPool {
        let n = self
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        ThreadPool::new(n.max(1))
    }
}

/// Parses a KV codec spec: `f16`, `f32`, `bf16`, `fp8`, `int8`, `int4`, `int8-g32`, or separate
/// K and V codecs as `k=int8,v=int4`.
pub fn parse_kv_dtype(s: &str) -> Result<model::KvDtype, String> {
    model::KvDtype::parse(s).map_err(|e| e.to_string())
}

/// KV codec flags shared by the commands that run the model.
#[derive(clap::Args, Debug, Clone)]
pub struct KvArgs {
    /// KV codec for K and V: f16 (default), f32, bf16, fp8, int8, int4, int8-g32, the
    /// Hadamard-rotated int4h / int8h, … or `k=int8,v=int4`.
    #[arg(long, default_value = "f16", value_parser = parse_kv_dtype)]
    pub kv_dtype: model::KvDtype,
    /// Codec for K only (overrides --kv-dtype for K).
    #[arg(long, value_parser = quant::KvCodecKind::parse_str)]
    pub k_dtype: Option<quant::KvCodecKind>,
    /// Codec for V only (overrides --kv-dtype for V).
    #[arg(long, value_parser = quant::KvCodecKind::parse_str)]
    pub v_dtype: Option<quant::KvCodecKind>,
}

impl KvArgs {
    pub fn codecs(&self) -> Result<model::KvDtype> {
        let mut c = self.kv_dtype;
        if let Some(k) = self.k_dtype {
            c.k = k;
        }
        if let Some(v) = self.v_dtype {
            c.v = v;
        }
        Ok(c)
    }
}
