//! The model's tensors, located inside the memory-mapped GGUF file.
//!
//! Owns the name → tensor lookup for every supported layout (llama, qwen2/3, gemma3, phi3's fused
//! matrices, seen as row ranges of one tensor) and shape checks. Quantized matrices
//! stay in the mapping (zero copy), except that Q4_0 / Q4_1 / Q5_0 / Q8_0 matrices are also repacked
//! row-interleaved at load ([`Packed32`], the fast kernels' layout; `AGENTKV_NO_PACK=1` turns
//! that off, for A/B measurements); only small vectors (norms, biases) are dequantised to f32 at
//! load. It never computes anything.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{Arch, ModelConfig};
use gguf::{dequant::dequantize_row, GgmlType, GgufError, GgufFile, TensorInfo};
use kernels::{KernelError, Packed32, QMatrix};

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("tensor {0} is missing from the model file")]
    Missing(String),
    #[error("tensor {name} has shape {got:?}, expected {want:?}")]
    Shape {
        name: String,
        got: Vec<u64>,
        want: Vec<u64>,
    },
    #[error("{0} is not supported")]
    Unsupported(&'static str),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("repacking {name}: {source}")]
    Pack {
        name: String,
        #[source]
        source: KernelError,
    },
}

/// A 2-D weight `[num_rows, row_len]` (GGUF dims `[row_len, num_rows]`) inside the file: rows
/// `first_row..first_row + num_rows` of the tensor (a fused tensor holds several matrices).
#[derive(Debug, Clone)]
pub struct MatRef {
    pub info: TensorInfo,
    pub first_row: usize,
    pub num_rows: usize,
    pub row_len: usize,
}

impl MatRef {
    /// Rows `first..first + rows` of this matrix.
    fn rows(&self, first: usize, rows: usize) -> MatRef {
        MatRef {
            info: self.info.clone(),
            first_row: self.first_row + first,
            num_rows: rows,
            row_len: self.row_len,
        }
    }
}

pub struct LayerWeights {
    pub attn_norm: Vec<f32>, // [hidden]
    /// Per-head RMSNorm weights of queries and keys (Qwen3, Gemma 3): `[head_dim]`.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Norms of the attention and FFN outputs before the residual add (Gemma 3): `[hidden]`.
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
    pub wq: MatRef,           // [q_dim, hidden]
    pub wk: MatRef,           // [kv_dim, hidden]
    pub wv: MatRef,           // [kv_dim, hidden]
    pub wo: MatRef,           // [hidden, q_dim]
    pub bq: Option<Vec<f32>>, // [q_dim]
    pub bk: Option<Vec<f32>>, // [kv_dim]
    pub bv: Option<Vec<f32>>, // [kv_dim]
    pub ffn_norm: Vec<f32>,   // [hidden]
    pub w_gate: MatRef,       // [ffn, hidden]
    pub w_up: MatRef,         // [ffn, hidden]
    pub w_down: MatRef,       // [hidden, ffn]
}

pub struct Weights {
    pub file: Arc<GgufFile>,
    pub token_embd: MatRef, // [vocab, hidden]
    pub output_norm: Vec<f32>,
    pub output: MatRef, // [vocab, hidden] (token_embd when tied)
    pub rope_freqs: Option<Vec<f32>>,
    /// Phi 3 128K's per-pair RoPE factors beyond / within the original context
    /// (`rope_factors_long` / `rope_factors_short`, both or neither): `[rope_dim / 2]` each.
    pub rope_long_short: Option<(Vec<f32>, Vec<f32>)>,
    pub layers: Vec<LayerWeights>,
    /// Row-interleaved copies of the packable matrices, by (tensor data offset, first row).
    packed: HashMap<(u64, usize), Packed32>,
}

impl Weights {
    pub fn load(file: Arc<GgufFile>, cfg: &ModelConfig) -> Result<Self, WeightsError> {
        let mat = |name: &str, rows: usize, cols: usize| -> Result<MatRef, WeightsError> {
            let info = file
                .tensor(name)
                .ok_or_else(|| WeightsError::Missing(name.into()))?;
            let want = vec![cols as u64, rows as u64];
            if info.dims != want {
                return Err(WeightsError::Shape {
                    name: name.into(),
                    got: info.dims.clone(),
                    want,
                });
            }
            Ok(MatRef {
                info: info.clone(),
                first_row: 0,
                num_rows: rows,
                row_len: cols,
            })
        };
        let vec_f32 = |name: &str, len: usize| -> Result<Vec<f32>, WeightsError> {
            let info = file
                .tensor(name)
                .ok_or_else(|| WeightsError::Missing(name.into()))?;
            if info.dims != [len as u64] {
                return Err(WeightsError::Shape {
                    name: name.into(),
                    got: info.dims.clone(),
                    want: vec![len as u64],
                });
            }
            let mut out = vec![0.0f32; len];
            dequantize_row(info.ty, file.tensor_data(info), &mut out)?;
            Ok(out)
        };
        let opt_vec = |name: &str, len: usize| -> Result<Option<Vec<f32>>, WeightsError> {
            if file.tensor(name).is_some() {
                vec_f32(name, len).map(Some)
            } else {
                Ok(None)
            }
        };
        let (hd, qd, kvd, ffn, vocab) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.ffn_size,
            cfg.vocab_size,
        );
        let token_embd = mat("token_embd.weight", vocab, hd)?;
        let output = if file.tensor("output.weight").is_some() {
            mat("output.weight", vocab, hd)?
        } else {
            token_embd.clone()
        };
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for l in 0..cfg.num_layers {
            let n = |s: &str| format!("blk.{l}.{s}");
            let biases = cfg.arch == Arch::Qwen2;
            let qk_norm = matches!(cfg.arch, Arch::Qwen3 | Arch::Gemma3);
            let post_norms = cfg.arch == Arch::Gemma3;
            let (wq, wk, wv) = if file.tensor(&n("attn_qkv.weight")).is_some() {
                // Phi 3: one [q; k; v] matrix.
                let qkv = mat(&n("attn_qkv.weight"), qd + 2 * kvd, hd)?;
                (qkv.rows(0, qd), qkv.rows(qd, kvd), qkv.rows(qd + kvd, kvd))
            } else {
                (
                    mat(&n("attn_q.weight"), qd, hd)?,
                    mat(&n("attn_k.weight"), kvd, hd)?,
                    mat(&n("attn_v.weight"), kvd, hd)?,
                )
            };
            let (w_gate, w_up) = if cfg.arch == Arch::Phi3 {
                // Phi 3: `ffn_up` is [gate; up] (the first half goes through the activation).
                let gate_up = mat(&n("ffn_up.weight"), 2 * ffn, hd)?;
                (gate_up.rows(0, ffn), gate_up.rows(ffn, ffn))
            } else {
                (
                    mat(&n("ffn_gate.weight"), ffn, hd)?,
                    mat(&n("ffn_up.weight"), ffn, hd)?,
                )
            };
            let req_if = |cond: bool, name: &str, len: usize| -> Result<_, WeightsError> {
                if cond {
                    vec_f32(&n(name), len).map(Some)
                } else {
                    Ok(None)
                }
            };
            layers.push(LayerWeights {
                attn_norm: vec_f32(&n("attn_norm.weight"), hd)?,
                q_norm: req_if(qk_norm, "attn_q_norm.weight", cfg.head_dim)?,
                k_norm: req_if(qk_norm, "attn_k_norm.weight", cfg.head_dim)?,
                post_attn_norm: req_if(post_norms, "post_attention_norm.weight", hd)?,
                post_ffn_norm: req_if(post_norms, "post_ffw_norm.weight", hd)?,
                wq,
                wk,
                wv,
                wo: mat(&n("attn_output.weight"), hd, qd)?,
                bq: if biases {
                    opt_vec(&n("attn_q.bias"), qd)?
                } else {
                    None
                },
                bk: if biases {
                    opt_vec(&n("attn_k.bias"), kvd)?
                } else {
                    None
                },
                bv: if biases {
                    opt_vec(&n("attn_v.bias"), kvd)?
                } else {
                    None
                },
                ffn_norm: vec_f32(&n("ffn_norm.weight"), hd)?,
                w_gate,
                w_up,
                w_down: mat(&n("ffn_down.weight"), hd, ffn)?,
            });
        }
        let mut weights = Weights {
            packed: HashMap::new(),
            output_norm: vec_f32("output_norm.weight", hd)?,
            rope_freqs: opt_vec("rope_freqs.weight", cfg.rope_dim / 2)?,
            rope_long_short: match (
                opt_vec("rope_factors_long.weight", cfg.rope_dim / 2)?,
                opt_vec("rope_factors_short.weight", cfg.rope_dim / 2)?,
            ) {
                (Some(long), Some(short)) => Some((long, short)),
                (None, None) => None,
                _ => {
                    return Err(WeightsError::Unsupported(
                        "one of rope_factors_long / rope_factors_short without the other",
                    ))
                }
            },
            token_embd,
            output,
            layers,
            file,
        };
        if !std::env::var("AGENTKV_NO_PACK").is_ok_and(|v| v == "1") {
            weights.pack_matrices()?;
        }
        Ok(weights)
    }

    /// Repacks every Q4_0 / Q4_1 / Q5_0 / Q8_0 matrix (each row range once) into [`Packed32`].
    fn pack_matrices(&mut self) -> Result<(), WeightsError> {
        let mut mats: Vec<MatRef> = vec![self.output.clone()];
        for l in &self.layers {
            mats.extend(
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down].map(Clone::clone),
            );
        }
        for m in mats {
            let key = (m.info.offset, m.first_row);
            if !kernels::packed32::packable(m.info.ty) || self.packed.contains_key(&key) {
                continue;
            }
            let q = self.qmatrix(&m);
            let p = Packed32::pack(q.ty, q.num_rows, q.row_len, q.data).map_err(|source| {
                WeightsError::Pack {
                    name: m.info.name.clone(),
                    source,
                }
            })?;
            self.packed.insert(key, p);
        }
        Ok(())
    }

    /// Bytes of the repacked copies (held in addition to the file mapping).
    pub fn packed_bytes(&self) -> usize {
        self.packed.values().map(Packed32::num_bytes).sum()
    }

    /// The matrix view used by the kernels.
    pub fn qmatrix(&self, m: &MatRef) -> QMatrix<'_> {
        let row_bytes = m.info.ty.row_bytes(m.row_len).expect("validated at load");
        let data = self.file.tensor_data(&m.info);
        QMatrix {
            ty: m.info.ty,
            num_rows: m.num_rows,
            row_len: m.row_len,
            data: &data[m.first_row * row_bytes..(m.first_row + m.num_rows) * row_bytes],
            packed: self
                .packed
                .get(&(m.info.offset, m.first_row))
                .filter(|p| p.num_rows() == m.num_rows),
        }
    }

    /// Dequantises embedding row `token` into `out` (`[hidden]`).
    pub fn embed(&self, token: u32, out: &mut [f32]) -> Result<(), WeightsError> {
        let m = &self.token_embd;
        let ty: GgmlType = m.info.ty;
        let row_bytes = ty.row_bytes(m.row_len).expect("validated at load");
        let data = self.file.tensor_data(&m.info);
        let start = token as usize * row_bytes;
        dequantize_row(ty, &data[start..start + row_bytes], out)?;
        Ok(())
    }

    /// Matrix `m` dequantized to f32, row-major `[num_rows, row_len]` (what a backend that
    /// computes in f32 uploads).
    pub fn dequantize(&self, m: &MatRef) -> Result<Vec<f32>, WeightsError> {
        let ty: GgmlType = m.info.ty;
        let row_bytes = ty.row_bytes(m.row_len).expect("validated at load");
        let data = self.file.tensor_data(&m.info);
        let mut out = vec![0.0f32; m.num_rows * m.row_len];
        for (r, row) in out.chunks_exact_mut(m.row_len).enumerate() {
            let start = (m.first_row + r) * row_bytes;
            dequantize_row(ty, &data[start..start + row_bytes], row)?;
        }
        Ok(out)
    }

    /// Bytes of all weight tensors.
    pub fn total_bytes(&self) -> usize {
        self.file.tensors().iter().map(|t| t.num_bytes).sum()
    }
}
