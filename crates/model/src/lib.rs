//! The model runtime: weights loaded from GGUF (`gguf` crate), CPU kernels, the forward pass and
//! the sampler. Text ↔ token ids (tokenizer, chat templates, [`Frontend`]) live in the `frontend`
//! crate.
//!
//! This crate owns everything that turns token ids into logits and logits into tokens. It never
//! schedules requests, never owns a paged cache (the forward pass reads and writes K/V through the
//! [`kv::KvStore`] trait that the engine implements) and never touches the network.

mod attention;
mod attention_plan;
mod attention_split;
mod attention_tiled;
mod backend;
pub mod config;
mod forward;
mod forward_attention;
mod forward_rows;
mod generate;
mod gpu_backend;
mod gpu_compare;
mod gpu_forward;
mod gpu_kv;
pub mod kv;
mod kv_contiguous;
mod kv_rows;
mod kv_sealed;
mod membw;
mod model;
mod numerics;
mod ops;
mod perplexity;
mod rope_scaling;
mod sample_temperature;
pub mod sampler;
mod step_ops;
pub mod synthetic;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod weights;

pub use attention::PREFILL_MIN_TOKENS;
pub use attention_plan::{arith_tag, coded_pairs_arithmetic, pairs_arithmetic};
pub use backend::{Backend, CpuBackend, ModelShape};
pub use config::ModelConfig;
pub use forward::{
    attention_layer, forward, AttnArith, ForwardBatch, ForwardError, MatmulArith, Scratch,
};
pub use frontend::Frontend;
pub use generate::{generate, GenerateError, GenerateOptions, GenerateStats};
pub use gpu_backend::GpuBackend;
pub use gpu_compare::{compare_with_cpu, Comparison, CpuSteps, GpuCompareError, StepFn};
pub use gpu_forward::{GpuForward, GpuForwardError, GpuModel};
pub use gpu_kv::{DeviceBlocks, DevicePool};
pub use kernels::coded_pair_layout::CodedPairHalf;
pub use kernels::pair_layout::{PairHalf, PAIR_GROUP_ROWS};
pub use kernels::{PackedDef, ThreadPool};
pub use kv::{DeviceKvMemory, KvDtype, KvStore, SeqSlot};
pub use kv_contiguous::ContiguousKv;
pub use kv_rows::KvRows;
pub use membw::{measure_pool_call_ns, measure_read_bandwidth, Bandwidth, DecodeTraffic};
pub use model::{LoadError, Model};
pub use numerics::{Numerics, RowKind};
pub use ops::{log_softmax_at, Rope};
pub use perplexity::{
    kl_divergence, perplexity, PerplexityError, PerplexityOptions, PerplexityReport,
};
pub use rope_scaling::RopeScaling;
pub use sampler::{
    ConstraintError, ConstraintFactory, ConstraintSpec, SampledToken, Sampler, SamplingParams,
    TokenConstraint,
};
pub use step_ops::StepOps;
pub use weights::Weights;

use std::path::PathBuf;

/// File name of the default model inside `models/`.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// File name of the second model in the tests, Gemma 3 270M (base, Q4_K_M; `agentkv fetch-model
/// --name gemma3-270m`), inside `models/`.
pub const GEMMA3_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// Where `file` lives in the source tree's `models/` (when run from it), else `./models/<file>`.
pub fn models_dir_path(file: &str) -> PathBuf {
    let in_tree = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(file);
    if in_tree.exists() {
        return in_tree;
    }
    PathBuf::from("models").join(file)
}

/// Where the default model lives: `$AGENTKV_MODEL` if set, else `<workspace>/models/<file>` when
/// run from the source tree, else `./models/<file>`.
pub fn default_model_path() -> PathBuf {
    if let Some(p) = std::env::var_os("AGENTKV_MODEL") {
        return PathBuf::from(p);
    }
    models_dir_path(DEFAULT_MODEL_FILE)
}
