//! [`GpuForward`]: the model's forward pass over a device's operations ([`cuda::ops::Ops`]) —
//! on a GPU with `CudaOps`, or with `HostOps` on the CPU, where it is tested against the CPU
//! forward pass (`gpu_compare`). Weights are dequantized to f32 once, at construction, and
//! stay on the device; K/V lives in a paged f16 pool on the device (blocks handed to sequence
//! slots on demand), in the host pool's row order.
//!
//! Owns the layer loop as [`crate::forward`] runs it (norm → QKV → biases → QK-norm → RoPE →
//! K/V write → attention → output → post-norm → residual → gated FFN → post-norm → residual →
//! final norm → logits → softcap), each step one device operation. It never schedules, never
//! shares blocks between slots and never samples: the engine's paged cache is not wired to it
//! yet (issue #47).

use std::sync::Arc;

use cuda::ops::{ActRound, AttnShape, Gate, KvLayout, Ops};
use cuda::CudaError;
use gguf::GgmlType;

use crate::config::{FfnAct, ModelConfig, RopeStyle};
use crate::gpu_kv::DevicePool;
use crate::model::Model;
use crate::ops::Rope;
use crate::weights::{MatRef, Weights, WeightsError};

#[derive(Debug, thiserror::Error)]
pub enum GpuForwardError {
    #[error("device: {0}")]
    Device(#[from] CudaError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error("malformed batch: {0}")]
    BadBatch(String),
    #[error("the K/V pool of {0} blocks is full")]
    PoolFull(usize),
}

/// A weight matrix on the device: f32 `[rows, row_len]`, how its input is rounded and, for
/// zero-point types (Q4_1, Q5_1), each block's minimum `[rows, row_len / 32]`, which the CPU
/// multiplies by the activations' f16 sum term (see `Ops::q8_sum_correction`).
struct DeviceMat<O: Ops> {
    data: O::Buf<f32>,
    round: ActRound,
    mins: Option<O::Buf<f32>>,
}

/// The block minimums of a Q4_1 or Q5_1 matrix (the f16 at byte 2 of each 32-element block).
fn block_mins(w: &Weights, m: &MatRef) -> Option<Vec<f32>> {
    if !matches!(m.info.ty, GgmlType::Q4_1 | GgmlType::Q5_1) || !m.row_len.is_multiple_of(32) {
        return None;
    }
    let row_bytes = m.info.ty.row_bytes(m.row_len)?;
    let blocks = m.row_len / 32;
    let block_bytes = row_bytes / blocks;
    let data = w.file.tensor_data(&m.info);
    let mut out = Vec::with_capacity(m.num_rows * blocks);
    for r in m.first_row..m.first_row + m.num_rows {
        for b in 0..blocks {
            let at = r * row_bytes + b * block_bytes + 2;
            out.push(half::f16::from_le_bytes([data[at], data[at + 1]]).to_f32());
        }
    }
    Some(out)
}

/// The activation rounding the CPU's kernels apply for weights of type `ty` (float types
/// multiply f32 activations as they are).
fn act_round(ty: GgmlType) -> ActRound {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => ActRound::None,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
            ActRound::Q8Blocks32
        }
        _ => ActRound::Q8K,
    }
}

struct DeviceLayer<O: Ops> {
    attn_norm: O::Buf<f32>,
    q_norm: Option<O::Buf<f32>>,
    k_norm: Option<O::Buf<f32>>,
    post_attn_norm: Option<O::Buf<f32>>,
    post_ffn_norm: Option<O::Buf<f32>>,
    wq: DeviceMat<O>,
    wk: DeviceMat<O>,
    wv: DeviceMat<O>,
    wo: DeviceMat<O>,
    bq: Option<O::Buf<f32>>,
    bk: Option<O::Buf<f32>>,
    bv: Option<O::Buf<f32>>,
    ffn_norm: O::Buf<f32>,
    w_gate: DeviceMat<O>,
    w_up: DeviceMat<O>,
    w_down: DeviceMat<O>,
}

/// A step's activation buffers, kept across steps and grown when a step has more tokens
/// (allocating device memory every step would cost more than a decode step computes).
struct StepBufs<O: Ops> {
    x: O::Buf<f32>,
    xn: O::Buf<f32>,
    q: O::Buf<f32>,
    q2: O::Buf<f32>,
    k: O::Buf<f32>,
    k2: O::Buf<f32>,
    v: O::Buf<f32>,
    att: O::Buf<f32>,
    proj: O::Buf<f32>,
    proj2: O::Buf<f32>,
    gate: O::Buf<f32>,
    up: O::Buf<f32>,
    act: O::Buf<f32>,
    lin: LinScratch<O>,
}

impl<O: Ops> StepBufs<O> {
    fn new(o: &O) -> Result<Self, CudaError> {
        Ok(StepBufs {
            x: o.alloc(0)?,
            xn: o.alloc(0)?,
            q: o.alloc(0)?,
            q2: o.alloc(0)?,
            k: o.alloc(0)?,
            k2: o.alloc(0)?,
            v: o.alloc(0)?,
            att: o.alloc(0)?,
            proj: o.alloc(0)?,
            proj2: o.alloc(0)?,
            gate: o.alloc(0)?,
            up: o.alloc(0)?,
            act: o.alloc(0)?,
            lin: LinScratch::new(o)?,
        })
    }

    /// Room for `n` tokens of a model with these widths.
    fn ensure(&mut self, o: &O, n: usize, cfg: &ModelConfig) -> Result<(), CudaError> {
        let (hd, qd, kvd, ffn) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.ffn_size);
        for (buf, width) in [
            (&mut self.x, hd),
            (&mut self.xn, hd),
            (&mut self.q, qd),
            (&mut self.q2, qd),
            (&mut self.k, kvd),
            (&mut self.k2, kvd),
            (&mut self.v, kvd),
            (&mut self.att, qd),
            (&mut self.proj, hd),
            (&mut self.proj2, hd),
            (&mut self.gate, ffn),
            (&mut self.up, ffn),
            (&mut self.act, ffn),
        ] {
            grow(o, buf, n.next_power_of_two() * width)?;
        }
        Ok(())
    }
}

/// A model's weights on a device and the step's buffers: the forward pass over a K/V pool
/// and block tables that its caller owns ([`GpuForward`] standalone, [`crate::GpuBackend`] for
/// the engine).
pub struct GpuModel<O: Ops> {
    ops: Arc<O>,
    cfg: ModelConfig,
    rope: Rope,
    rope_local: Option<Rope>,
    embed: O::Buf<f32>,
    /// `None` when the output matrix is the embedding (tied; rounded as `output_round`).
    output: Option<DeviceMat<O>>,
    output_round: ActRound,
    embed_mins: Option<O::Buf<f32>>,
    output_norm: O::Buf<f32>,
    layers: Vec<DeviceLayer<O>>,
    /// `None` only while a step runs.
    bufs: Option<StepBufs<O>>,
}

/// A model on a device with a K/V pool of its own for `num_slots` sequences, blocks handed to
/// slots on demand: the forward pass on its own, for comparisons and benchmarks.
pub struct GpuForward<O: Ops> {
    model: GpuModel<O>,
    pool: DevicePool<O>,
    max_blocks: usize,
    /// Each slot's blocks, position p in `tables[slot][p / block_size]`.
    tables: Vec<Vec<u32>>,
    free: Vec<u32>,
}

fn upload_opt<O: Ops>(ops: &O, v: &Option<Vec<f32>>) -> Result<Option<O::Buf<f32>>, CudaError> {
    v.as_deref().map(|v| ops.upload(v)).transpose()
}

fn upload_mat<O: Ops>(ops: &O, w: &Weights, m: &MatRef) -> Result<DeviceMat<O>, GpuForwardError> {
    Ok(DeviceMat {
        data: ops.upload(&w.dequantize(m)?)?,
        round: act_round(m.info.ty),
        mins: block_mins(w, m).map(|v| ops.upload(&v)).transpose()?,
    })
}

/// The buffers a linear layer needs beside its input and output, grown on demand.
struct LinScratch<O: Ops> {
    rounded: O::Buf<f32>,
    corr: O::Buf<f32>,
    extra: O::Buf<f32>,
}

impl<O: Ops> LinScratch<O> {
    fn new(o: &O) -> Result<Self, CudaError> {
        Ok(LinScratch {
            rounded: o.alloc(0)?,
            corr: o.alloc(0)?,
            extra: o.alloc(0)?,
        })
    }
}

/// `buf` replaced by a larger one when it holds fewer than `len` elements (contents dropped).
fn grow<O: Ops>(o: &O, buf: &mut O::Buf<f32>, len: usize) -> Result<(), CudaError> {
    if O::len(buf) < len {
        *buf = o.alloc(len)?;
    }
    Ok(())
}

/// One product of [`linear_shared`]: `y[rows, out_dim] = round(x) · dataᵀ`, plus the block
/// minimums' correction for a zero-point matrix.
struct Product<'a, O: Ops> {
    data: &'a O::Buf<f32>,
    round: ActRound,
    mins: Option<&'a O::Buf<f32>>,
    y: &'a mut O::Buf<f32>,
    out_dim: usize,
}

impl<'a, O: Ops> Product<'a, O> {
    fn of(m: &'a DeviceMat<O>, y: &'a mut O::Buf<f32>, out_dim: usize) -> Self {
        Product {
            data: &m.data,
            round: m.round,
            mins: m.mins.as_ref(),
            y,
            out_dim,
        }
    }
}

/// The products of one input `x` (`rows` rows of `in_dim`): `x` is rounded once per rounding
/// kind (into `scratch`) and the sum terms' correction computed once, however many matrices
/// read them (Q, K and V; gate and up).
fn linear_shared<O: Ops>(
    o: &O,
    x: &O::Buf<f32>,
    products: &mut [Product<'_, O>],
    scratch: &mut LinScratch<O>,
    rows: usize,
    in_dim: usize,
) -> Result<(), CudaError> {
    let s = scratch;
    let mut rounded: Option<ActRound> = None;
    let mut corrected = false;
    for p in products.iter_mut() {
        if p.round == ActRound::None {
            o.linear(x, p.data, p.y, rows, in_dim, p.out_dim)?;
            continue;
        }
        if rounded != Some(p.round) {
            grow(o, &mut s.rounded, rows * in_dim)?;
            o.round_activations(x, &mut s.rounded, rows, in_dim, p.round)?;
            rounded = Some(p.round);
        }
        o.linear(&s.rounded, p.data, p.y, rows, in_dim, p.out_dim)?;
        if let Some(mins) = p.mins {
            let blocks = in_dim / 32;
            if !corrected {
                grow(o, &mut s.corr, rows * blocks)?;
                o.q8_sum_correction(x, &mut s.corr, rows, in_dim)?;
                corrected = true;
            }
            grow(o, &mut s.extra, rows * p.out_dim)?;
            o.linear(&s.corr, mins, &mut s.extra, rows, blocks, p.out_dim)?;
            o.add(p.y, &s.extra, rows * p.out_dim)?;
        }
    }
    Ok(())
}

/// `y = round(x) · mᵀ` for `rows` rows (see [`linear_shared`]).
#[allow(clippy::too_many_arguments)]
fn linear<O: Ops>(
    o: &O,
    x: &O::Buf<f32>,
    m: &DeviceMat<O>,
    scratch: &mut LinScratch<O>,
    y: &mut O::Buf<f32>,
    rows: usize,
    in_dim: usize,
    out_dim: usize,
) -> Result<(), CudaError> {
    linear_shared(
        o,
        x,
        &mut [Product::of(m, y, out_dim)],
        scratch,
        rows,
        in_dim,
    )
}

impl<O: Ops> GpuModel<O> {
    /// `model`'s weights on `ops`' device (dequantized to f32).
    pub fn new(ops: Arc<O>, model: &Model) -> Result<Self, GpuForwardError> {
        let cfg = model.config().clone();
        let w = model.weights();
        if cfg.sliding_window.is_some() && model.rope_local().is_none() {
            return Err(GpuForwardError::BadBatch(
                "sliding-window layers need their RoPE".into(),
            ));
        }
        let o = &*ops;
        let mut layers = Vec::with_capacity(w.layers.len());
        for lw in &w.layers {
            layers.push(DeviceLayer {
                attn_norm: o.upload(&lw.attn_norm)?,
                q_norm: upload_opt(o, &lw.q_norm)?,
                k_norm: upload_opt(o, &lw.k_norm)?,
                post_attn_norm: upload_opt(o, &lw.post_attn_norm)?,
                post_ffn_norm: upload_opt(o, &lw.post_ffn_norm)?,
                wq: upload_mat(o, w, &lw.wq)?,
                wk: upload_mat(o, w, &lw.wk)?,
                wv: upload_mat(o, w, &lw.wv)?,
                wo: upload_mat(o, w, &lw.wo)?,
                bq: upload_opt(o, &lw.bq)?,
                bk: upload_opt(o, &lw.bk)?,
                bv: upload_opt(o, &lw.bv)?,
                ffn_norm: o.upload(&lw.ffn_norm)?,
                w_gate: upload_mat(o, w, &lw.w_gate)?,
                w_up: upload_mat(o, w, &lw.w_up)?,
                w_down: upload_mat(o, w, &lw.w_down)?,
            });
        }
        let embed = o.upload(&w.dequantize(&w.token_embd)?)?;
        let tied = w.output.info.name == w.token_embd.info.name
            && w.output.first_row == w.token_embd.first_row;
        let output = if tied {
            None
        } else {
            Some(upload_mat(o, w, &w.output)?)
        };
        let embed_mins = block_mins(w, &w.token_embd)
            .map(|v| o.upload(&v))
            .transpose()?;
        Ok(GpuModel {
            bufs: Some(StepBufs::new(o)?),
            output_norm: o.upload(&w.output_norm)?,
            rope: model.rope().clone(),
            rope_local: model.rope_local().cloned(),
            cfg,
            embed,
            output,
            output_round: act_round(w.output.info.ty),
            embed_mins,
            layers,
            ops,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn ops(&self) -> &Arc<O> {
        &self.ops
    }

    /// The layout of a pool of `num_blocks` blocks of `block_size` positions for this model.
    pub fn kv_layout(&self, num_blocks: usize, block_size: usize) -> KvLayout {
        KvLayout {
            layers: self.cfg.num_layers,
            kv_heads: self.cfg.num_kv_heads,
            head_dim: self.cfg.head_dim,
            num_blocks,
            block_size,
        }
    }

    /// Checks the batch against the vocabulary and the tables; returns each token's (block,
    /// row in block).
    fn check(
        &self,
        layout: KvLayout,
        tables: &[Vec<u32>],
        tokens: &[u32],
        positions: &[u32],
        slots: &[usize],
        logits_for: &[usize],
    ) -> Result<(Vec<i32>, Vec<i32>), GpuForwardError> {
        let n = tokens.len();
        let bad = |m: String| Err(GpuForwardError::BadBatch(m));
        if positions.len() != n || slots.len() != n {
            return bad("tokens, positions and slots differ in length".into());
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return bad(format!(
                "token {t} outside the vocabulary of {}",
                self.cfg.vocab_size
            ));
        }
        if let Some(&i) = logits_for.iter().find(|&&i| i >= n) {
            return bad(format!("logits requested for token {i} of {n}"));
        }
        let bs = layout.block_size;
        let (mut blocks, mut rows) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for (&slot, &pos) in slots.iter().zip(positions) {
            let pos = pos as usize;
            let Some(&block) = tables.get(slot).and_then(|t| t.get(pos / bs)) else {
                return bad(format!("slot {slot} has no block for position {pos}"));
            };
            if block as usize >= layout.num_blocks {
                return bad(format!(
                    "block {block} outside a pool of {}",
                    layout.num_blocks
                ));
            }
            blocks.push(block as i32);
            rows.push((pos % bs) as i32);
        }
        Ok((blocks, rows))
    }

    /// Each token's RoPE angles for `rope`, `[n, rope_dim / 2, 2]` (cos, sin).
    fn cos_sin(rope: &Rope, positions: &[u32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(positions.len() * rope.rope_dim);
        for &p in positions {
            let a = rope.angles(p);
            for (c, s) in a.cos.iter().zip(&a.sin) {
                out.extend([*c, *s]);
            }
        }
        out
    }

    /// Runs one step over `pool`: token t of slot `slots[t]` at `positions[t]`, whose block is
    /// `tables[slots[t]][positions[t] / block_size]` (a slot's positions written in order,
    /// earlier ones already in the pool); returns the logits of the tokens `logits_for` names,
    /// `[logits_for.len(), vocab]`.
    pub fn step(
        &mut self,
        pool: &mut DevicePool<O>,
        tables: &[Vec<u32>],
        tokens: &[u32],
        positions: &[u32],
        slots: &[usize],
        logits_for: &[usize],
    ) -> Result<Vec<f32>, GpuForwardError> {
        let (blocks, rows) =
            self.check(pool.layout, tables, tokens, positions, slots, logits_for)?;
        let max_blocks = tables.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let n = tokens.len();
        let c = &self.cfg;
        let (hd, qd, kvd, ffn) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.ffn_size);
        let o = &*self.ops;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let table_host: Vec<i32> = tables
            .iter()
            .flat_map(|t| (0..max_blocks).map(move |i| t.get(i).map_or(0, |&b| b as i32)))
            .collect();
        let seq: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
        let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
        let (ids, tables, seq, pos) = (
            o.upload(&ids)?,
            o.upload(&table_host)?,
            o.upload(&seq)?,
            o.upload(&pos)?,
        );
        let (blocks, rows) = (o.upload(&blocks)?, o.upload(&rows)?);
        let cs_global = o.upload(&Self::cos_sin(&self.rope, positions))?;
        let cs_local = match &self.rope_local {
            Some(r) if c.sliding_window.is_some() => Some(o.upload(&Self::cos_sin(r, positions))?),
            _ => None,
        };

        let mut bufs = match self.bufs.take() {
            Some(b) => b,
            None => StepBufs::new(o)?,
        };
        bufs.ensure(o, n, c)?;
        let StepBufs {
            mut x,
            mut xn,
            mut q,
            mut q2,
            mut k,
            mut k2,
            mut v,
            mut att,
            mut proj,
            mut proj2,
            mut gate,
            mut up,
            mut act,
            mut lin,
        } = bufs;
        o.embed(
            &self.embed,
            &ids,
            &mut x,
            n,
            hd,
            c.embed_scale.unwrap_or(1.0),
        )?;
        if let Some(first) = self.layers.first() {
            o.rms_norm(&x, &first.attn_norm, &mut xn, n, hd, c.rms_eps)?;
        }
        for (l, lw) in self.layers.iter().enumerate() {
            let window = c.window_of(l);
            let qkv = &mut [
                Product::of(&lw.wq, &mut q, qd),
                Product::of(&lw.wk, &mut k, kvd),
                Product::of(&lw.wv, &mut v, kvd),
            ];
            linear_shared(o, &xn, qkv, &mut lin, n, hd)?;
            for (buf, bias, width) in [
                (&mut q, &lw.bq, qd),
                (&mut k, &lw.bk, kvd),
                (&mut v, &lw.bv, kvd),
            ] {
                if let Some(b) = bias {
                    o.add_bias(buf, b, n, width)?;
                }
            }
            if let Some(wn) = &lw.q_norm {
                o.rms_norm(&q, wn, &mut q2, n * c.num_heads, c.head_dim, c.rms_eps)?;
                std::mem::swap(&mut q, &mut q2);
            }
            if let Some(wn) = &lw.k_norm {
                o.rms_norm(&k, wn, &mut k2, n * c.num_kv_heads, c.head_dim, c.rms_eps)?;
                std::mem::swap(&mut k, &mut k2);
            }
            let (rope, cs) = match (window, &self.rope_local, &cs_local) {
                (Some(_), Some(r), Some(cs)) => (r, cs),
                _ => (&self.rope, &cs_global),
            };
            let neox = rope.style == RopeStyle::Neox;
            o.rope(&mut q, cs, n, c.num_heads, c.head_dim, rope.rope_dim, neox)?;
            o.rope(
                &mut k,
                cs,
                n,
                c.num_kv_heads,
                c.head_dim,
                rope.rope_dim,
                neox,
            )?;
            o.kv_write(
                &k,
                &v,
                &mut pool.k,
                &mut pool.v,
                pool.layout,
                l,
                &blocks,
                &rows,
                n,
            )?;
            let shape = AttnShape {
                tokens: n,
                heads: c.num_heads,
                max_blocks,
                window: window.unwrap_or(0),
                scale: c.attn_scale,
                softcap: 0.0,
            };
            o.attention(
                &q,
                &pool.k,
                &pool.v,
                pool.layout,
                l,
                &tables,
                &seq,
                &pos,
                &mut att,
                shape,
            )?;
            linear(o, &att, &lw.wo, &mut lin, &mut proj, n, qd, hd)?;
            if let Some(wn) = &lw.post_attn_norm {
                o.rms_norm(&proj, wn, &mut proj2, n, hd, c.rms_eps)?;
                std::mem::swap(&mut proj, &mut proj2);
            }
            o.add(&mut x, &proj, n * hd)?;
            o.rms_norm(&x, &lw.ffn_norm, &mut xn, n, hd, c.rms_eps)?;
            let gate_up = &mut [
                Product::of(&lw.w_gate, &mut gate, ffn),
                Product::of(&lw.w_up, &mut up, ffn),
            ];
            linear_shared(o, &xn, gate_up, &mut lin, n, hd)?;
            let kind = match c.ffn_act {
                FfnAct::Silu => Gate::Silu,
                FfnAct::GeluTanh => Gate::GeluTanh,
            };
            o.gated(kind, &gate, &up, &mut act, n * ffn)?;
            linear(o, &act, &lw.w_down, &mut lin, &mut proj, n, ffn, hd)?;
            if let Some(wn) = &lw.post_ffn_norm {
                o.rms_norm(&proj, wn, &mut proj2, n, hd, c.rms_eps)?;
                std::mem::swap(&mut proj, &mut proj2);
            }
            o.add(&mut x, &proj, n * hd)?;
            if let Some(next) = self.layers.get(l + 1) {
                o.rms_norm(&x, &next.attn_norm, &mut xn, n, hd, c.rms_eps)?;
            }
        }
        let m = logits_for.len();
        let mut out = Vec::new();
        if m > 0 {
            let idx: Vec<i32> = logits_for.iter().map(|&i| i as i32).collect();
            let idx = o.upload(&idx)?;
            let mut picked = o.alloc::<f32>(m * hd)?;
            o.gather_rows(&x, &idx, &mut picked, m, hd)?;
            let mut normed = o.alloc::<f32>(m * hd)?;
            o.rms_norm(&picked, &self.output_norm, &mut normed, m, hd, c.rms_eps)?;
            let vocab = c.vocab_size;
            let mut logits = o.alloc::<f32>(m * vocab)?;
            match &self.output {
                Some(w) => linear(o, &normed, w, &mut lin, &mut logits, m, hd, vocab)?,
                None => {
                    let tied = Product {
                        data: &self.embed,
                        round: self.output_round,
                        mins: self.embed_mins.as_ref(),
                        y: &mut logits,
                        out_dim: vocab,
                    };
                    linear_shared(o, &normed, &mut [tied], &mut lin, m, hd)?
                }
            }
            if let Some(cap) = c.final_logit_softcap {
                o.softcap(&mut logits, m * vocab, cap)?;
            }
            out = o.read(&logits)?;
        }
        self.bufs = Some(StepBufs {
            x,
            xn,
            q,
            q2,
            k,
            k2,
            v,
            att,
            proj,
            proj2,
            gate,
            up,
            act,
            lin,
        });
        Ok(out)
    }
}

impl<O: Ops> GpuForward<O> {
    /// `model`'s weights on `ops`' device and a pool of `num_slots · ⌈max_tokens / block_size⌉`
    /// blocks of `block_size` positions.
    pub fn new(
        ops: Arc<O>,
        model: &Model,
        num_slots: usize,
        max_tokens: usize,
        block_size: usize,
    ) -> Result<Self, GpuForwardError> {
        if block_size == 0 || num_slots == 0 || max_tokens == 0 {
            return Err(GpuForwardError::BadBatch(
                "a K/V pool needs slots, tokens and a block size".into(),
            ));
        }
        let model = GpuModel::new(ops, model)?;
        let max_blocks = max_tokens.div_ceil(block_size);
        let layout = model.kv_layout(num_slots * max_blocks, block_size);
        let pool = DevicePool::new(&**model.ops(), layout)
            .map_err(|e| GpuForwardError::BadBatch(e.to_string()))?;
        Ok(GpuForward {
            model,
            pool,
            max_blocks,
            tables: vec![Vec::new(); num_slots],
            free: (0..layout.num_blocks as u32).rev().collect(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    /// Forgets slot `slot`'s positions (its blocks return to the pool).
    pub fn clear_slot(&mut self, slot: usize) {
        if let Some(t) = self.tables.get_mut(slot) {
            self.free.append(t);
        }
    }

    /// Runs one step: token t of slot `slots[t]` at `positions[t]` (a slot's positions
    /// written in order, earlier positions already in the pool; blocks handed out as needed);
    /// returns the logits of the tokens `logits_for` names, `[logits_for.len(), vocab]`.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[u32],
        slots: &[usize],
        logits_for: &[usize],
    ) -> Result<Vec<f32>, GpuForwardError> {
        let bs = self.pool.layout.block_size;
        for (&slot, &pos) in slots.iter().zip(positions) {
            let pos = pos as usize;
            if slot >= self.tables.len() || pos / bs >= self.max_blocks {
                return Err(GpuForwardError::BadBatch(format!(
                    "slot {slot} position {pos} outside the pool ({} slots of {} positions)",
                    self.tables.len(),
                    self.max_blocks * bs
                )));
            }
            let table = &mut self.tables[slot];
            while table.len() <= pos / bs {
                let b = self
                    .free
                    .pop()
                    .ok_or(GpuForwardError::PoolFull(self.pool.layout.num_blocks))?;
                table.push(b);
            }
        }
        self.model.step(
            &mut self.pool,
            &self.tables,
            tokens,
            positions,
            slots,
            logits_for,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda::ops::HostOps;

    /// The device's linear layer (input rounded, f32 weights, block minimums' correction)
    /// against the CPU's quantized matmul on SmolLM2's Q4_1 and Q8_0 matrices, inputs with
    /// outliers: equal to float rounding (the CPU multiplies the same operands).
    #[test]
    fn a_rounded_linear_layer_is_the_cpus_quantized_matmul() {
        let model = Model::load(&crate::default_model_path()).unwrap();
        let w = model.weights();
        let lw = &w.layers[0];
        let pool = kernels::ThreadPool::new(2);
        let o = HostOps;
        for m in [&lw.wq, &lw.w_down, &w.output] {
            let dm = upload_mat(&o, w, m).unwrap();
            let (in_dim, out_dim) = (m.row_len, m.num_rows);
            for rows in [1usize, 20] {
                let x: Vec<f32> = (0..rows * in_dim)
                    .map(|i| {
                        let big = if i % 97 == 0 { 80.0 } else { 2.0 };
                        ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * big
                    })
                    .collect();
                let mut cpu = vec![0f32; rows * out_dim];
                let q = w.qmatrix(m);
                kernels::matmul_with_arith(&pool, &q, &x, rows, &mut cpu, Default::default())
                    .unwrap();
                let xb = o.upload(&x).unwrap();
                let mut scratch = LinScratch::new(&o).unwrap();
                let mut y = o.alloc::<f32>(rows * out_dim).unwrap();
                linear(&o, &xb, &dm, &mut scratch, &mut y, rows, in_dim, out_dim).unwrap();
                let scale = cpu.iter().fold(0f32, |a, v| a.max(v.abs()));
                let err = y
                    .iter()
                    .zip(&cpu)
                    .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
                assert!(
                    err <= 2e-6 * scale,
                    "{:?} × {rows}: {err} of {scale}",
                    m.info.ty
                );
            }
        }
    }
}
