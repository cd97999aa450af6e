//! Random-weight models of a real model's exact shape, written by agentkv itself
//! ([`SyntheticSpec::smollm2_135m`]): what a machine that cannot receive the real file (a device
//! machine takes at most 64 MiB per call; SmolLM2's file is 98 MB) runs to check and time the
//! forward pass at the real shapes. A `llama` GGUF with the given sizes and weight type, a
//! byte-level BPE tokenizer padded with placeholder tokens to the vocabulary size, and ChatML.
//! Its outputs are meaningless but deterministic (seeded), and every comparison between two
//! implementations of the forward pass holds on it as on the real weights.
//!
//! Owns the file's construction only; it never reads a real model.

use gguf::{GgmlType, GgufError, GgufFile, GgufWriter, MetaValue};
use rand::{Rng, SeedableRng};

use crate::model::{LoadError, Model};
use frontend::tokenizer::byte_to_char;

/// The shape and weight type of a synthetic model.
#[derive(Debug, Clone, Copy)]
pub struct SyntheticSpec {
    pub seed: u64,
    pub num_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub vocab: usize,
    pub context_length: usize,
    /// Type of the layers' matrices (norms stay f32).
    pub weight_type: GgmlType,
    /// Type of the (tied) embedding.
    pub embed_type: GgmlType,
}

impl SyntheticSpec {
    /// SmolLM2-135M-Instruct's shape and types: 30 layers, hidden 576, FFN 1536, 9 query and 3
    /// K/V heads of 64, vocabulary 49,152, Q4_1 matrices and a Q8_0 tied embedding.
    pub fn smollm2_135m() -> Self {
        SyntheticSpec {
            seed: 135,
            num_layers: 30,
            hidden: 576,
            ffn: 1536,
            num_heads: 9,
            num_kv_heads: 3,
            vocab: 49_152,
            context_length: 8192,
            weight_type: GgmlType::Q4_1,
            embed_type: GgmlType::Q8_0,
        }
    }
}

const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + \
message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}\
{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The GGUF bytes of a synthetic model.
pub fn synthetic_gguf(spec: &SyntheticSpec) -> Result<Vec<u8>, GgufError> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetaValue::String("llama".into()));
    w.add_metadata(
        "general.name",
        MetaValue::String("agentkv synthetic (random weights)".into()),
    );
    add_shape(
        &mut w,
        "llama",
        [
            spec.num_layers,
            spec.hidden,
            spec.ffn,
            spec.num_heads,
            spec.num_kv_heads,
            spec.context_length,
            spec.vocab,
        ],
    );
    w.add_metadata("llama.rope.freq_base", MetaValue::F32(100_000.0));
    w.add_metadata(
        "llama.attention.layer_norm_rms_epsilon",
        MetaValue::F32(1e-5),
    );
    add_tokenizer(&mut w, spec.vocab);
    let head_dim = spec.hidden / spec.num_heads.max(1);
    let kv_dim = spec.num_kv_heads * head_dim;
    let (h, f) = (spec.hidden, spec.ffn);
    let mut tensors: Vec<(String, usize, usize, f32, GgmlType)> = vec![
        (
            "token_embd.weight".into(),
            spec.vocab,
            h,
            1.0,
            spec.embed_type,
        ),
        ("output_norm.weight".into(), 1, h, 1.0, GgmlType::F32),
    ];
    let wt = spec.weight_type;
    for l in 0..spec.num_layers {
        let n = |s: &str| format!("blk.{l}.{s}");
        tensors.extend([
            (n("attn_norm.weight"), 1, h, 1.0, GgmlType::F32),
            (n("ffn_norm.weight"), 1, h, 1.0, GgmlType::F32),
            (n("attn_q.weight"), h, h, 0.1, wt),
            (n("attn_k.weight"), kv_dim, h, 0.1, wt),
            (n("attn_v.weight"), kv_dim, h, 0.1, wt),
            (n("attn_output.weight"), h, h, 0.05, wt),
            (n("ffn_gate.weight"), f, h, 0.05, wt),
            (n("ffn_up.weight"), f, h, 0.05, wt),
            (n("ffn_down.weight"), h, f, 0.05, wt),
        ]);
    }
    add_random_tensors(&mut w, &mut rng, tensors)?;
    w.to_bytes()
}

/// The shape keys of a llama-family GGUF under `{arch}.`: block count, embedding length, FFN
/// length, query heads, K/V heads, context length and vocabulary size, in that order.
pub(crate) fn add_shape(w: &mut GgufWriter, arch: &str, values: [usize; 7]) {
    let keys = [
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "context_length",
        "vocab_size",
    ];
    for (k, v) in keys.into_iter().zip(values) {
        w.add_metadata(format!("{arch}.{k}"), MetaValue::U32(v as u32));
    }
}

/// Writes each `(name, rows, cols, scale, type)` in order with values drawn uniformly from
/// `±scale` by `rng`, row by row (a tensor of one row is a vector).
pub(crate) fn add_random_tensors(
    w: &mut GgufWriter,
    rng: &mut impl Rng,
    tensors: Vec<(String, usize, usize, f32, GgmlType)>,
) -> Result<(), GgufError> {
    for (name, rows, cols, scale, ty) in tensors {
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
            .collect();
        let dims: Vec<u64> = if rows == 1 {
            vec![cols as u64]
        } else {
            vec![cols as u64, rows as u64]
        };
        w.add_tensor_f32(name, &dims, &data, ty)?;
    }
    Ok(())
}

/// Three control tokens (`<|endoftext|>` 0, `<|im_start|>` 1, `<|im_end|>` 2), the 256 byte
/// tokens, one merge (a BPE tokenizer needs a table) and placeholders up to `vocab`; ChatML.
/// Also the tiny test models' tokenizer (`testing`, at 260 tokens).
pub(crate) fn add_tokenizer(w: &mut GgufWriter, vocab: usize) {
    let mut tokens = vec![
        "<|endoftext|>".to_string(),
        "<|im_start|>".to_string(),
        "<|im_end|>".to_string(),
    ];
    let mut types = vec![3i32, 3, 3];
    for b in 0..=255u8 {
        tokens.push(byte_to_char(b).to_string());
        types.push(1);
    }
    tokens.push("Ġt".into());
    types.push(1);
    while tokens.len() < vocab {
        tokens.push(format!("<placeholder_{}>", tokens.len()));
        types.push(4);
    }
    let strings = tokens.into_iter().map(MetaValue::String).collect();
    w.add_metadata("tokenizer.ggml.model", MetaValue::String("gpt2".into()));
    w.add_metadata("tokenizer.ggml.pre", MetaValue::String("default".into()));
    w.add_metadata("tokenizer.ggml.tokens", MetaValue::Array(strings));
    w.add_metadata(
        "tokenizer.ggml.token_type",
        MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
    );
    w.add_metadata(
        "tokenizer.ggml.merges",
        MetaValue::Array(vec![MetaValue::String("Ġ t".into())]),
    );
    w.add_metadata("tokenizer.ggml.bos_token_id", MetaValue::U32(0));
    w.add_metadata("tokenizer.ggml.eos_token_id", MetaValue::U32(2));
    w.add_metadata("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    w.add_metadata("tokenizer.chat_template", MetaValue::String(CHATML.into()));
}

/// A synthetic model built in memory.
pub fn synthetic_model(spec: &SyntheticSpec) -> Result<Model, LoadError> {
    let path = std::path::Path::new("synthetic.gguf");
    let gguf = |source| LoadError::Gguf {
        path: path.to_path_buf(),
        source,
    };
    let file = GgufFile::from_bytes(synthetic_gguf(spec).map_err(gguf)?).map_err(gguf)?;
    Model::from_gguf(file, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda::ops::HostOps;

    /// The synthetic SmolLM2 has the real file's configuration, in every size the forward pass
    /// reads.
    #[test]
    fn synthetic_smollm2_has_the_real_models_shape() {
        let real = Model::load(&crate::default_model_path()).unwrap();
        let spec = SyntheticSpec {
            num_layers: 2,
            ..SyntheticSpec::smollm2_135m()
        };
        let fake = synthetic_model(&spec).unwrap();
        let (r, f) = (real.config(), fake.config());
        assert_eq!(
            (
                r.hidden_size,
                r.ffn_size,
                r.num_heads,
                r.num_kv_heads,
                r.head_dim,
                r.vocab_size
            ),
            (
                f.hidden_size,
                f.ffn_size,
                f.num_heads,
                f.num_kv_heads,
                f.head_dim,
                f.vocab_size
            )
        );
        assert_eq!(r.num_layers, SyntheticSpec::smollm2_135m().num_layers);
        assert_eq!(real.weights().layers[0].wq.info.ty, spec.weight_type);
        assert_eq!(real.weights().token_embd.info.ty, spec.embed_type);
    }

    /// Its forward pass runs on the CPU and over the device operations alike.
    #[test]
    fn a_synthetic_model_runs_on_both_forward_passes() {
        let spec = SyntheticSpec {
            num_layers: 2,
            vocab: 1024,
            ..SyntheticSpec::smollm2_135m()
        };
        let model = synthetic_model(&spec).unwrap();
        let prompt = model
            .frontend()
            .tokenizer
            .encode("hello there", false, false)
            .unwrap();
        let mut device =
            crate::GpuForward::new(std::sync::Arc::new(HostOps), &model, 1, 64, 16).unwrap();
        let cmp = crate::compare_with_cpu(&model, &mut device, &[prompt], 8, 1).unwrap();
        assert!(cmp.mean_abs_dlogprob < 0.05, "{cmp}");
    }
}
