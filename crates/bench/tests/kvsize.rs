//! KV-size figures checked against hand computation.

use bench::kvsize::{
    compute, from_hf_config, preset, render_table, KvDtype, KvSizeParams, PRESETS,
};

fn d(name: &str) -> KvDtype {
    KvDtype::parse(name).unwrap()
}

fn params(dtype: KvDtype, tokens: u64, batch: u64, block: u64) -> KvSizeParams {
    KvSizeParams {
        num_tokens: tokens,
        batch,
        dtype,
        block_size: block,
    }
}

#[test]
fn llama3_8b_f16_matches_hand_figures() {
    let s = preset("llama-3-8b").unwrap();
    let r = compute(&s, params(KvDtype::F16, 8192, 1, 16)).unwrap();
    // 32 layers × 8 KV heads × 128 × 2 (K, V) × 2 bytes.
    assert_eq!(r.bytes_per_token, 131_072);
    assert_eq!(r.bytes_per_token_per_layer, 4096);
    // The articles' formula with 32 query heads.
    assert_eq!(r.naive_bytes_per_token, 524_288);
    assert_eq!(r.total_bytes, 131_072 * 8192); // 1 GiB
    assert_eq!(r.bytes_per_layer_total, 4096 * 8192);
}

#[test]
fn dtypes_and_overheads() {
    let s = preset("llama-3-8b").unwrap();
    let per_token = |d| compute(&s, params(d, 1, 1, 1)).unwrap().bytes_per_token;
    assert_eq!(per_token(KvDtype::F32), 262_144);
    assert_eq!(per_token(d("bf16")), 131_072);
    // fp8: 128 bytes + one f32 scale per head vector = 132; × 8 heads × 2 × 32 layers.
    assert_eq!(per_token(d("fp8")), 132 * 8 * 2 * 32);
    // int8: 128 + 4 groups × (2 + 2) = 144.
    assert_eq!(per_token(d("int8-g32")), 144 * 8 * 2 * 32);
    // int4: 64 + 16 = 80.
    assert_eq!(per_token(d("int4")), 80 * 8 * 2 * 32);
    // Per-channel int4 K over blocks of 16 tokens: 64 code bytes + 128 channels × 4 bytes / 16
    // rows = 96; int4 V 80. Every codec the engine accepts is accepted, mixed pairs included.
    assert_eq!(per_token(d("k=int4c,v=int4")), (96 + 80) * 8 * 32);
    assert_eq!(per_token(d("k=int8,v=int4")), (136 + 80) * 8 * 32);
    assert_eq!(per_token(d("int4h")), 80 * 8 * 2 * 32);
    // A group that does not divide the head is an error, not a wrong figure.
    assert!(compute(&s, params(d("int8").with_group(48), 1, 1, 1)).is_err());
    let g64 = params(d("int4").with_group(64), 1, 1, 1);
    assert_eq!(d("int4").with_group(64), d("int4-g64"));
    assert_eq!(
        compute(&s, g64).unwrap().bytes_per_token,
        (64 + 8) * 8 * 2 * 32
    );
    // Naive formula ignores overhead: int4 naive = 32 × 32 × 256 × 4 bits.
    assert_eq!(
        compute(&s, params(d("int4"), 1, 1, 1))
            .unwrap()
            .naive_bytes_per_token,
        131_072
    );
}

#[test]
fn block_rounding_and_batch() {
    let s = preset("smollm2-135m").unwrap();
    // 30 layers × 3 KV heads × 64 × 2 × 2 bytes = 23,040 B/token (the default model).
    let r = compute(&s, params(KvDtype::F16, 1000, 4, 16)).unwrap();
    assert_eq!(r.bytes_per_token, 23_040);
    assert_eq!(r.tokens_allocated_per_sequence, 1008);
    assert_eq!(r.total_bytes, 23_040 * 1008 * 4);
    assert_eq!(r.naive_total_bytes, 30 * 9 * 64 * 2 * 2 * 1000 * 4);
    assert!(compute(&s, params(KvDtype::F16, 1, 1, 0)).is_err());
}

#[test]
fn presets_and_hf_config() {
    for (name, _) in PRESETS {
        assert!(preset(name).is_ok());
    }
    assert!(preset("gpt-9").is_err());
    // Llama-3.1-70B: 80 × 8 × 128 × 2 × 2 = 327,680 B/token.
    let r = compute(
        &preset("llama-3.1-70b").unwrap(),
        params(KvDtype::F16, 1, 1, 1),
    )
    .unwrap();
    assert_eq!(r.bytes_per_token, 327_680);
    let hf = r#"{"model_type":"qwen2","hidden_size":3584,"num_attention_heads":28,
                 "num_hidden_layers":28,"num_key_value_heads":4}"#;
    let s = from_hf_config(hf).unwrap();
    assert_eq!(
        s,
        bench::kvsize::KvShape {
            name: "qwen2".into(),
            ..preset("qwen2.5-7b").unwrap()
        }
    );
    let no_kv = r#"{"hidden_size":2048,"num_attention_heads":32,"num_hidden_layers":24}"#;
    assert_eq!(from_hf_config(no_kv).unwrap().num_kv_heads, 32);
    let explicit =
        r#"{"hidden_size":2048,"num_attention_heads":16,"num_hidden_layers":2,"head_dim":256}"#;
    assert_eq!(from_hf_config(explicit).unwrap().key_head_dim, 256);
    assert!(from_hf_config(r#"{"hidden_size":1}"#).is_err());
    assert!(from_hf_config("not json").is_err());
}

#[test]
fn sliding_window_layers_get_the_window_bounded_figure() {
    // Gemma 3 270M: 18 layers, 4 query heads, 1 KV head of 256, window 512, 5 of every 6 local.
    let hf = r#"{"model_type":"gemma3_text","hidden_size":640,"num_attention_heads":4,
                 "num_hidden_layers":18,"num_key_value_heads":1,"head_dim":256,
                 "sliding_window":512,"sliding_window_pattern":6}"#;
    let s = from_hf_config(hf).unwrap();
    let sw = s.sliding_window.unwrap();
    assert_eq!((sw.window, sw.local_layers), (512, 15));
    let params = KvSizeParams {
        num_tokens: 8192,
        batch: 1,
        dtype: KvDtype::F16,
        block_size: 16,
    };
    let r = compute(&s, params).unwrap();
    // f16: 2 × 256 × 2 bytes per layer per token = 1024.
    assert_eq!(r.bytes_per_token_per_layer, 1024);
    assert_eq!(r.total_bytes, 18 * 8192 * 1024);
    assert_eq!(
        r.window_bounded_total_bytes,
        Some((3 * 8192 + 15 * 512) * 1024)
    );
    assert!(render_table(&r, false).contains("15 of 18 attend the last 512 positions"));
    // layer_types names the local layers instead.
    let typed = r#"{"hidden_size":64,"num_attention_heads":4,"num_hidden_layers":3,
                    "sliding_window":8,
                    "layer_types":["sliding_attention","full_attention","sliding_attention"]}"#;
    assert_eq!(
        from_hf_config(typed).unwrap().sliding_window,
        Some(bench::kvsize::SlidingWindowShape {
            window: 8,
            local_layers: 2
        })
    );
    // A window without a layer pattern (e.g. Mistral's config) is not counted.
    let plain =
        r#"{"hidden_size":64,"num_attention_heads":4,"num_hidden_layers":3,"sliding_window":4096}"#;
    assert_eq!(from_hf_config(plain).unwrap().sliding_window, None);
}
