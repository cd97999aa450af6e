//! The KV-memory calculator's maths: model shapes (presets, HF `config.json`), KV element types
//! with their quantisation overhead, block rounding, and the articles' naive formula for
//! comparison. Pure; reading GGUF files is the caller's job (it fills a [`KvShape`]).
//!
//! Bytes per token per layer = Σ over K and V of `num_kv_heads × bytes_per_row(head_dim)`, taken
//! from the engine's codecs themselves (`quant::KvCodecKind::bytes_per_row`: f16 scale + offset
//! per group for int8/int4, one f32 scale per row for fp8, per-channel parameters amortised over
//! a block for `int4c`) — one source of truth; `crates/agentkv/tests/kv_size_agrees.rs` checks
//! every codec against what an engine allocates. Grouped-query attention is counted: KV heads, not
//! query heads. Models with sliding-window layers (Gemma 3) also get the window-bounded figure:
//! local layers need only their last `window` positions (what a cache that frees out-of-window
//! K/V would hold); agentkv keeps every layer's K/V of a block (global layers need it all), so
//! the allocated figure is the full one.

use serde::{Deserialize, Serialize};

use crate::BenchError;

/// The attention shape that decides KV size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvShape {
    pub name: String,
    pub num_layers: u64,
    pub num_query_heads: u64,
    pub num_kv_heads: u64,
    /// Elements per key head vector.
    pub key_head_dim: u64,
    /// Elements per value head vector.
    pub value_head_dim: u64,
    /// Sliding-window layers, when the model has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<SlidingWindowShape>,
}

/// `local_layers` of the model's layers attend only the last `window` positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlidingWindowShape {
    pub window: u64,
    pub local_layers: u64,
}

/// Presets: name → `[layers, query heads, KV heads, head dim]` (from each model's config.json).
pub const PRESETS: [(&str, [u64; 4]); 11] = [
    ("llama-3-8b", [32, 32, 8, 128]),
    ("llama-3.1-8b", [32, 32, 8, 128]),
    ("llama-3.1-70b", [80, 64, 8, 128]),
    ("llama-3.2-1b", [16, 32, 8, 64]),
    ("qwen2.5-0.5b", [24, 14, 2, 64]),
    ("qwen2.5-7b", [28, 28, 4, 128]),
    ("qwen2.5-72b", [80, 64, 8, 128]),
    ("mistral-7b", [32, 32, 8, 128]),
    ("smollm2-135m", [30, 9, 3, 64]),
    ("smollm2-360m", [32, 15, 5, 64]),
    ("smollm2-1.7b", [24, 32, 32, 64]),
];

/// The preset called `name`.
pub fn preset(name: &str) -> Result<KvShape, BenchError> {
    let (n, [l, q, kv, d]) = PRESETS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            let known: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
            BenchError::UnknownPreset(name.to_string(), known.join(", "))
        })?;
    Ok(KvShape {
        name: n.to_string(),
        num_layers: *l,
        num_query_heads: *q,
        num_kv_heads: *kv,
        key_head_dim: *d,
        value_head_dim: *d,
        sliding_window: None,
    })
}

/// Shape from a Hugging Face `config.json` (`num_hidden_layers`, `num_attention_heads`,
/// `num_key_value_heads` defaulting to the query heads, `head_dim` defaulting to
/// `hidden_size / num_attention_heads`).
pub fn from_hf_config(json: &str) -> Result<KvShape, BenchError> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| BenchError::HfConfig(e.to_string()))?;
    // Multimodal configs nest the language model under `text_config`.
    let v = v.get("text_config").unwrap_or(&v);
    let get = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
    let need = |k: &str| {
        get(k).ok_or_else(|| BenchError::HfConfig(format!("missing or non-integer {k:?}")))
    };
    let num_layers = need("num_hidden_layers")?;
    let num_query_heads = need("num_attention_heads")?;
    if num_query_heads == 0 || num_layers == 0 {
        return Err(BenchError::HfConfig("zero layers or heads".into()));
    }
    let num_kv_heads = get("num_key_value_heads").unwrap_or(num_query_heads);
    let head_dim = match get("head_dim") {
        Some(d) => d,
        None => need("hidden_size")? / num_query_heads,
    };
    let name = v
        .get("model_type")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("hf-config")
        .to_string();
    // Sliding-window layers: `layer_types` names them ("sliding_attention"), else every
    // `sliding_window_pattern`-th layer is global. A window with neither applies to all layers
    // only for Gemma-style configs that say so; otherwise it is not counted.
    let local_layers = match v.get("layer_types").and_then(serde_json::Value::as_array) {
        Some(types) => Some(
            types
                .iter()
                .filter(|t| t.as_str() == Some("sliding_attention"))
                .count() as u64,
        ),
        None => get("sliding_window_pattern")
            .filter(|&p| p > 0)
            .map(|p| (0..num_layers).filter(|l| l % p < p - 1).count() as u64),
    };
    let sliding_window = match (get("sliding_window"), local_layers) {
        (Some(window), Some(local_layers)) if window > 0 && local_layers > 0 => {
            Some(SlidingWindowShape {
                window,
                local_layers,
            })
        }
        _ => None,
    };
    Ok(KvShape {
        name,
        num_layers,
        num_query_heads,
        num_kv_heads,
        key_head_dim: head_dim,
        value_head_dim: head_dim,
        sliding_window,
    })
}

/// Element type of the cache: the engine's own codec pair (`quant::KvCodecs`, any name the
/// engine accepts — `int8`, `int4h`, `k=int8,v=int4`, `k=int4c,v=int4`, …). Bytes come from the
/// codecs' row layout (`quant::KvCodecKind::bytes_per_row`): the calculator has no formula of
/// its own, so it cannot disagree with what the engine allocates. Serialised as the codec id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvDtype(pub quant::KvCodecs);

impl KvDtype {
    pub const F32: KvDtype = KvDtype(quant::KvCodecs::F32);
    pub const F16: KvDtype = KvDtype(quant::KvCodecs::F16);

    /// Any codec name the engine accepts (`--kv-dtype`).
    pub fn parse(s: &str) -> Option<KvDtype> {
        quant::KvCodecs::parse(s).ok().map(KvDtype)
    }

    /// This codec pair with every integer codec's channel group set to `group`
    /// (`--group-size`; float codecs and per-channel `int4c` are unchanged).
    pub fn with_group(self, group: u64) -> KvDtype {
        use quant::KvCodecKind as K;
        let g = group as usize;
        let regroup = |k: K| match k {
            K::Int8 { .. } => K::Int8 { group: g },
            K::Int4 { .. } => K::Int4 { group: g },
            K::Int8Hadamard { .. } => K::Int8Hadamard { group: g },
            K::Int4Hadamard { .. } => K::Int4Hadamard { group: g },
            other => other,
        };
        KvDtype(quant::KvCodecs {
            k: regroup(self.0.k),
            v: regroup(self.0.v),
        })
    }

    /// Bits per stored value of one codec, parameters excluded (the naive formula's figure).
    fn kind_bits(kind: quant::KvCodecKind) -> u64 {
        use quant::KvCodecKind as K;
        match kind {
            K::F32 => 32,
            K::F16 | K::Bf16 => 16,
            K::Fp8E4m3 | K::Int8 { .. } | K::Int8Hadamard { .. } => 8,
            K::Int4 { .. } | K::Int4Hadamard { .. } | K::Int4Channel { .. } => 4,
        }
    }

    /// Bits per K value and per V value, parameters excluded.
    pub fn bits(self) -> (u64, u64) {
        (Self::kind_bits(self.0.k), Self::kind_bits(self.0.v))
    }

    /// Bytes of one K head vector and one V head vector of `key_dim` / `value_dim` values,
    /// scales and offsets included (exactly the engine's rows); `Err` when a codec does not fit
    /// the head size (e.g. a group that does not divide it).
    pub fn vector_bytes(self, key_dim: u64, value_dim: u64) -> Result<(u64, u64), BenchError> {
        let (k, v) = (self.0.k, self.0.v);
        k.validate(key_dim as usize)
            .and_then(|()| v.validate(value_dim as usize))
            .map_err(|e| BenchError::Config(format!("{}: {e}", self.0)))?;
        Ok((
            k.bytes_per_row(key_dim as usize) as u64,
            v.bytes_per_row(value_dim as usize) as u64,
        ))
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for KvDtype {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.id())
    }
}

impl<'de> Deserialize<'de> for KvDtype {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        KvDtype::parse(&s)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown KV codec {s:?}")))
    }
}

/// What to size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvSizeParams {
    /// Tokens per sequence.
    pub num_tokens: u64,
    /// Sequences held at once.
    pub batch: u64,
    pub dtype: KvDtype,
    /// Tokens per KV block; each sequence occupies whole blocks (1 = no rounding).
    pub block_size: u64,
}

/// The figures, all in bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KvSizeReport {
    pub shape: KvShape,
    pub params: KvSizeParams,
    pub bytes_per_token_per_layer: u64,
    pub bytes_per_token: u64,
    /// Tokens each sequence occupies after rounding up to whole blocks.
    pub tokens_allocated_per_sequence: u64,
    pub bytes_per_sequence: u64,
    pub bytes_per_layer_total: u64,
    pub total_bytes: u64,
    /// The articles' formula: layers × query heads × head dim × 2 × element bytes, no overhead.
    pub naive_bytes_per_token: u64,
    pub naive_total_bytes: u64,
    /// With sliding-window layers: the total if local layers held only their window (rounded to
    /// whole blocks) and global layers every token. agentkv allocates `total_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_bounded_total_bytes: Option<u64>,
}

/// Sizes the cache; `Err` for a zero block size or codecs that do not fit the head size.
pub fn compute(shape: &KvShape, params: KvSizeParams) -> Result<KvSizeReport, BenchError> {
    if params.block_size == 0 {
        return Err(BenchError::Config("block size must be ≥ 1".into()));
    }
    let d = params.dtype;
    let (k_bytes, v_bytes) = d.vector_bytes(shape.key_head_dim, shape.value_head_dim)?;
    let per_layer = shape.num_kv_heads * (k_bytes + v_bytes);
    let per_token = per_layer * shape.num_layers;
    let allocated = params.num_tokens.div_ceil(params.block_size) * params.block_size;
    let per_seq = allocated * per_token;
    let window_bounded_total_bytes = shape.sliding_window.map(|sw| {
        let local = sw.local_layers.min(shape.num_layers);
        let local_tokens = allocated.min(sw.window.div_ceil(params.block_size) * params.block_size);
        ((shape.num_layers - local) * allocated + local * local_tokens) * per_layer * params.batch
    });
    let (k_bits, v_bits) = d.bits();
    let naive_per_token = (shape.num_layers
        * shape.num_query_heads
        * (shape.key_head_dim * k_bits + shape.value_head_dim * v_bits))
        .div_ceil(8);
    Ok(KvSizeReport {
        shape: shape.clone(),
        params,
        bytes_per_token_per_layer: per_layer,
        bytes_per_token: per_token,
        tokens_allocated_per_sequence: allocated,
        bytes_per_sequence: per_seq,
        bytes_per_layer_total: per_layer * allocated * params.batch,
        total_bytes: per_seq * params.batch,
        naive_bytes_per_token: naive_per_token,
        naive_total_bytes: naive_per_token * params.num_tokens * params.batch,
        window_bounded_total_bytes,
    })
}

/// `1536 B`, `1.50 KiB`, `8.00 GiB`, …
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut x = bytes as f64 / 1024.0;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    format!("{x:.2} {}", UNITS[u])
}

/// The report as a text table.
pub fn render_table(r: &KvSizeReport, naive: bool) -> String {
    let s = &r.shape;
    let p = &r.params;
    let mut rows = vec![
        ("model".to_string(), s.name.clone()),
        (
            "shape".into(),
            format!(
                "{} layers, {} query heads, {} KV heads, head dim {}/{}",
                s.num_layers, s.num_query_heads, s.num_kv_heads, s.key_head_dim, s.value_head_dim
            ),
        ),
        (
            "dtype".into(),
            format!("{}, block {} tokens", p.dtype, p.block_size),
        ),
        (
            "bytes per token per layer".into(),
            r.bytes_per_token_per_layer.to_string(),
        ),
        (
            "bytes per token".into(),
            format!("{} ({})", r.bytes_per_token, human_bytes(r.bytes_per_token)),
        ),
        (
            "tokens per sequence".into(),
            format!(
                "{} ({} allocated)",
                p.num_tokens, r.tokens_allocated_per_sequence
            ),
        ),
        ("per sequence".into(), human_bytes(r.bytes_per_sequence)),
        (
            format!("per layer (batch {})", p.batch),
            human_bytes(r.bytes_per_layer_total),
        ),
        (
            format!("total (batch {})", p.batch),
            format!("{} ({} B)", human_bytes(r.total_bytes), r.total_bytes),
        ),
    ];
    if let (Some(sw), Some(bounded)) = (s.sliding_window, r.window_bounded_total_bytes) {
        rows.push((
            "sliding-window layers".into(),
            format!(
                "{} of {} attend the last {} positions only",
                sw.local_layers, s.num_layers, sw.window
            ),
        ));
        rows.push((
            "window-bounded total".into(),
            format!(
                "{} ({:.2}× the full figure; agentkv keeps all layers' K/V, global layers need it)",
                human_bytes(bounded),
                ratio(bounded, r.total_bytes)
            ),
        ));
    }
    if naive {
        rows.push((
            "naive bytes per token (query heads)".into(),
            format!(
                "{} ({:.2}× the true figure)",
                r.naive_bytes_per_token,
                ratio(r.naive_bytes_per_token, r.bytes_per_token)
            ),
        ));
        rows.push(("naive total".into(), human_bytes(r.naive_total_bytes)));
    }
    let w = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{k:<w$}  {v}\n"))
        .collect()
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}
