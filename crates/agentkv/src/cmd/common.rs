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

/// Parses `f32`, `f16` into a KV dtype.
pub fn parse_kv_dtype(s: &str) -> Result<model::KvDtype, String> {
    match s {
        "f32" => Ok(model::KvDtype::F32),
        "f16" => Ok(model::KvDtype::F16),
        other => Err(format!(
            "unsupported KV dtype {other:?} (supported: f32, f16)"
        )),
    }
}
