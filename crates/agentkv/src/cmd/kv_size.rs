//! `agentkv kv-size`: how much KV memory a context takes, for a GGUF file (metadata read with
//! `gguf`), a Hugging Face `config.json` or a preset. Argument parsing and the GGUF
//! lookup only; the maths is `bench::kvsize`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use bench::kvsize::{self, KvDtype, KvShape, KvSizeParams};

/// Print KV-cache bytes per token, per layer and in total.
#[derive(clap::Args, Debug)]
pub struct KvSizeArgs {
    /// GGUF model file.
    #[arg(long, short = 'm', conflicts_with_all = ["hf_config", "preset"])]
    pub model: Option<PathBuf>,
    /// Hugging Face config.json.
    #[arg(long, conflicts_with = "preset")]
    pub hf_config: Option<PathBuf>,
    /// llama-3-8b, llama-3.1-8b, llama-3.1-70b, llama-3.2-1b, qwen2.5-0.5b, qwen2.5-7b,
    /// qwen2.5-72b, mistral-7b, smollm2-135m, smollm2-360m, smollm2-1.7b.
    #[arg(long)]
    pub preset: Option<String>,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 8192)]
    pub tokens: u64,
    /// Sequences held at once.
    #[arg(long, default_value_t = 1)]
    pub batch: u64,
    /// Any KV codec the engine accepts: f32, f16, bf16, fp8, int8, int4, int8-g32, int4h,
    /// int8h, `k=int8,v=int4`, `k=int4c,v=int4` (per-channel 4-bit K), …
    #[arg(long, default_value = "f16", value_parser = parse_dtype)]
    pub dtype: KvDtype,
    /// Tokens per KV block (sequences occupy whole blocks).
    #[arg(long, default_value_t = 16)]
    pub block_size: u64,
    /// Elements per int8/int4 scale+offset group (default: the codec's own, 64 for int8 and 32
    /// for int4; the same as naming `int8-g32`).
    #[arg(long)]
    pub group_size: Option<u64>,
    /// Also print the articles' formula (query heads instead of KV heads).
    #[arg(long)]
    pub naive: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn parse_dtype(s: &str) -> Result<KvDtype, String> {
    quant::KvCodecs::parse(s)
        .map(KvDtype)
        .map_err(|e| e.to_string())
}

pub fn run(args: KvSizeArgs) -> anyhow::Result<()> {
    let shape = if let Some(p) = &args.model {
        gguf_shape(p)?
    } else if let Some(p) = &args.hf_config {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        kvsize::from_hf_config(&text).with_context(|| p.display().to_string())?
    } else if let Some(name) = &args.preset {
        kvsize::preset(name)?
    } else {
        gguf_shape(&model::default_model_path())?
    };
    let report = kvsize::compute(
        &shape,
        KvSizeParams {
            num_tokens: args.tokens,
            batch: args.batch,
            dtype: match args.group_size {
                Some(g) => args.dtype.with_group(g),
                None => args.dtype,
            },
            block_size: args.block_size,
        },
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", kvsize::render_table(&report, args.naive));
    }
    Ok(())
}

/// Shape from GGUF metadata (`{arch}.block_count`, `.attention.head_count[_kv]`,
/// `.attention.key_length`/`value_length`, else `embedding_length / head_count`; sliding-window
/// layers as `model::ModelConfig` reads them, for the architectures it supports).
fn gguf_shape(path: &Path) -> anyhow::Result<KvShape> {
    let file = gguf::GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
    let meta = file.metadata();
    let Some(arch) = meta.get_str("general.architecture") else {
        bail!("{}: no general.architecture", path.display());
    };
    let get = |k: &str| meta.get_u64(&format!("{arch}.{k}"));
    let need = |k: &str| get(k).with_context(|| format!("{}: missing {arch}.{k}", path.display()));
    let num_layers = need("block_count")?;
    let num_query_heads = need("attention.head_count")?;
    if num_query_heads == 0 {
        bail!("{}: zero attention heads", path.display());
    }
    let num_kv_heads = get("attention.head_count_kv").unwrap_or(num_query_heads);
    let key_head_dim = match get("attention.key_length") {
        Some(d) => d,
        None => need("embedding_length")? / num_query_heads,
    };
    let value_head_dim = get("attention.value_length").unwrap_or(key_head_dim);
    // Sliding-window layers as the model crate reads them (Gemma 3's pattern).
    let sliding_window = model::ModelConfig::from_metadata(meta)
        .ok()
        .and_then(|c| c.sliding_window)
        .map(|sw| kvsize::SlidingWindowShape {
            window: sw.size as u64,
            local_layers: sw.num_local() as u64,
        });
    let name = meta
        .get_str("general.name")
        .map_or_else(|| path.display().to_string(), str::to_string);
    Ok(KvShape {
        name,
        num_layers,
        num_query_heads,
        num_kv_heads,
        key_head_dim,
        value_head_dim,
        sliding_window,
    })
}
