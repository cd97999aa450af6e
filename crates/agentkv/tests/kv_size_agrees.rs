//! The memory calculator (`agentkv kv-size`, `bench::kvsize`) and the engine agree on every
//! codec's bytes per token: the calculator with its default group sizes equals the codecs' own
//! row layout (`quant::KvCodecs::bytes_per_token`) for every preset shape, and that equals what
//! an engine actually allocates per token (a tiny model, so it runs in milliseconds).

use std::sync::Arc;

use bench::kvsize::{self, KvDtype, KvSizeParams, PRESETS};
use engine::{EngineConfig, EngineCore};
use model::testing::{tiny_model, TinyModelSpec};

/// Every codec family, rotated and mixed pairs, and per-channel K.
const DTYPES: [&str; 13] = [
    "f32",
    "f16",
    "bf16",
    "fp8",
    "int8",
    "int4",
    "int8-g32",
    "int4h",
    "int8h",
    "k=int8,v=int4",
    "k=int8,v=bf16",
    "k=int4c,v=int4",
    "k=int4c,v=int8",
];

fn calculator(shape: &kvsize::KvShape, dtype: KvDtype) -> u64 {
    let params = KvSizeParams {
        num_tokens: 1,
        batch: 1,
        dtype,
        block_size: 1,
    };
    kvsize::compute(shape, params).unwrap().bytes_per_token
}

#[test]
fn the_calculator_counts_every_codec_as_the_codecs_store_it() {
    for (preset, _) in PRESETS {
        let shape = kvsize::preset(preset).unwrap();
        for name in DTYPES {
            let dtype = KvDtype::parse(name).unwrap();
            let codecs = quant::KvCodecs::parse(name).unwrap();
            let engine_bytes = codecs.bytes_per_token(
                shape.num_layers as usize,
                shape.num_kv_heads as usize,
                shape.key_head_dim as usize,
            ) as u64;
            assert_eq!(calculator(&shape, dtype), engine_bytes, "{preset} {name}");
        }
    }
}

#[test]
fn the_engine_allocates_what_the_calculator_says() {
    // Head size 64, as the presets have (int8 groups of 64 must divide it).
    let spec = TinyModelSpec {
        hidden: 128,
        num_heads: 2,
        num_kv_heads: 1,
        ..TinyModelSpec::default()
    };
    let m = Arc::new(tiny_model(&spec).unwrap());
    let shape = kvsize::KvShape {
        name: "tiny".into(),
        num_layers: spec.num_layers as u64,
        num_query_heads: spec.num_heads as u64,
        num_kv_heads: spec.num_kv_heads as u64,
        key_head_dim: (spec.hidden / spec.num_heads) as u64,
        value_head_dim: (spec.hidden / spec.num_heads) as u64,
        sliding_window: None,
    };
    for name in DTYPES {
        let dtype = KvDtype::parse(name).unwrap();
        let cfg = EngineConfig {
            num_blocks: 4,
            kv_dtype: model::KvDtype::parse(name).unwrap(),
            threads: 1,
            ..Default::default()
        };
        let core = EngineCore::new(m.clone(), cfg).unwrap();
        assert_eq!(
            core.memory().bytes_per_token() as u64,
            calculator(&shape, dtype),
            "{name}"
        );
        // What the buffers hold, not only what the accounting says.
        assert_eq!(
            core.memory().allocated_bytes(),
            core.memory().bytes_per_token() * 16 * 4,
            "{name}"
        );
    }
}
