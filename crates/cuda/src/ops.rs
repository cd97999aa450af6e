//! [`Ops`]: the operations a forward pass runs on a device, one per kernel of
//! `kernels/*.cu` plus the linear product, over buffers the device owns. Two implementations:
//! [`CudaOps`] launches the kernels and cuBLAS on a GPU; [`HostOps`] computes each kernel's
//! definition on the CPU (plain loops, sums in f64 where the kernel sums), so a forward pass
//! written against `Ops` runs — and is tested against the CPU backend — on a machine without a
//! GPU, and on a GPU differs only in the kernels, which `agentkv gpu-check` holds to the same
//! definitions.
//!
//! Owns the argument checks (every length a kernel would read or write is checked here, once,
//! for both implementations) and the launch shapes. It never knows a model: the layer loop is
//! its caller's.

use std::sync::Mutex;

use half::f16;

use crate::cublas::Cublas;
use crate::driver::{Arg, DeviceBuffer, DeviceScalar, Gpu};
use crate::error::CudaError;

/// The gated activation of an FFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// `silu(gate) · up`.
    Silu,
    /// `gelu_tanh(gate) · up`.
    GeluTanh,
}

/// How a linear layer's input is rounded first, as the CPU's kernels round activations for a
/// weight type (so the device sees the operands the CPU multiplies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActRound {
    /// f32 as is (f32, f16 and bf16 weights).
    None,
    /// Blocks of 32: `q = rint(x · 127 / amax)`, `x' = f16(amax / 127) · q` (ggml's Q8_0 and
    /// Q8_1, for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights).
    Q8Blocks32,
    /// Blocks of 256: ggml's Q8_K (K-quant weights).
    Q8K,
}

impl ActRound {
    /// Elements per block (the row length must be a multiple).
    pub fn block(self) -> usize {
        match self {
            ActRound::None => 1,
            ActRound::Q8Blocks32 => 32,
            ActRound::Q8K => 256,
        }
    }
}

/// Geometry of a paged K (or V) pool: `layers` runs of f16 rows ordered `[kv_head, block, row
/// in block, head_dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub num_blocks: usize,
    pub block_size: usize,
}

impl KvLayout {
    /// Elements of one layer's pool.
    pub fn layer_elems(&self) -> usize {
        self.kv_heads * self.num_blocks * self.block_size * self.head_dim
    }

    /// Elements of the whole pool (K or V).
    pub fn pool_elems(&self) -> usize {
        self.layers * self.layer_elems()
    }
}

/// Which positions attention reads: each token's table row, position and the tables.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub tokens: usize,
    pub heads: usize,
    /// Blocks per table row.
    pub max_blocks: usize,
    /// Attend the last `window` positions only (0: all).
    pub window: usize,
    pub scale: f32,
    /// Scores capped by `softcap · tanh(s / softcap)` when positive.
    pub softcap: f32,
}

fn need(what: &str, have: usize, want: usize) -> Result<(), CudaError> {
    if have < want {
        return Err(CudaError::Invalid(format!(
            "{what}: a buffer of {have} elements where {want} are needed"
        )));
    }
    Ok(())
}

fn to_i32(v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::Invalid(format!("{v} does not fit a kernel's int")))
}

/// The operations of a forward pass, checked; see the module doc. Every method checks the
/// lengths it touches and then calls the implementation's `*_raw` twin.
pub trait Ops: Send + Sync + 'static {
    type Buf<T: DeviceScalar>: Send + Sync;

    fn upload<T: DeviceScalar>(&self, host: &[T]) -> Result<Self::Buf<T>, CudaError>;
    /// A buffer of `len` elements (contents unspecified until written).
    fn alloc<T: DeviceScalar>(&self, len: usize) -> Result<Self::Buf<T>, CudaError>;
    fn read<T: DeviceScalar>(&self, buf: &Self::Buf<T>) -> Result<Vec<T>, CudaError>;
    fn len<T: DeviceScalar>(buf: &Self::Buf<T>) -> usize;
    /// Short lowercase name for logs (`"cuda"`, `"host"`).
    fn name(&self) -> &'static str;
    /// Elements `at..at + len` of `buf`.
    fn read_range<T: DeviceScalar>(
        &self,
        buf: &Self::Buf<T>,
        at: usize,
        len: usize,
    ) -> Result<Vec<T>, CudaError>;
    /// `host` written at `at` into `buf`.
    fn write_range<T: DeviceScalar>(
        &self,
        buf: &mut Self::Buf<T>,
        at: usize,
        host: &[T],
    ) -> Result<(), CudaError>;
    /// `len` elements of `buf` from `src_at` copied to `dst_at` (the ranges must not overlap).
    fn copy_range<T: DeviceScalar>(
        &self,
        buf: &mut Self::Buf<T>,
        src_at: usize,
        dst_at: usize,
        len: usize,
    ) -> Result<(), CudaError>;

    /// `out[r] = table[ids[r]] · scale` for `rows` rows of `dim`. Every id must be a row of
    /// `table` (the caller checks tokens against the vocabulary).
    fn embed(
        &self,
        table: &Self::Buf<f32>,
        ids: &Self::Buf<i32>,
        out: &mut Self::Buf<f32>,
        rows: usize,
        dim: usize,
        scale: f32,
    ) -> Result<(), CudaError> {
        need("embed ids", Self::len(ids), rows)?;
        need("embed out", Self::len(out), rows * dim)?;
        need("embed table", Self::len(table), dim)?;
        self.embed_raw(table, ids, out, rows, dim, scale)
    }

    /// `y[r] = x[r] / rms(x[r]) · w` over `rows` rows of `dim`.
    fn rms_norm(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        y: &mut Self::Buf<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        need("rms_norm x", Self::len(x), rows * dim)?;
        need("rms_norm w", Self::len(w), dim)?;
        need("rms_norm y", Self::len(y), rows * dim)?;
        self.rms_norm_raw(x, w, y, rows, dim, eps)
    }

    /// Rotates the first `rot_dims` of each of `heads` heads of `rows` rows in place by
    /// `cos_sin [rows, rot_dims / 2, 2]`; `neox` pairs (i, i + rot_dims/2), else (2i, 2i+1).
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        x: &mut Self::Buf<f32>,
        cos_sin: &Self::Buf<f32>,
        rows: usize,
        heads: usize,
        head_dim: usize,
        rot_dims: usize,
        neox: bool,
    ) -> Result<(), CudaError> {
        if rot_dims > head_dim || !rot_dims.is_multiple_of(2) {
            return Err(CudaError::Invalid(format!(
                "rope of {rot_dims} dimensions in heads of {head_dim}"
            )));
        }
        need("rope x", Self::len(x), rows * heads * head_dim)?;
        need("rope cos_sin", Self::len(cos_sin), rows * rot_dims)?;
        self.rope_raw(x, cos_sin, rows, heads, head_dim, rot_dims, neox)
    }

    /// `y = x` rounded per `kind` over `rows` rows of `dim` (a multiple of the kind's block).
    fn round_activations(
        &self,
        x: &Self::Buf<f32>,
        y: &mut Self::Buf<f32>,
        rows: usize,
        dim: usize,
        kind: ActRound,
    ) -> Result<(), CudaError> {
        if !dim.is_multiple_of(kind.block()) {
            return Err(CudaError::Invalid(format!(
                "rows of {dim} cannot be rounded in blocks of {}",
                kind.block()
            )));
        }
        need("round x", Self::len(x), rows * dim)?;
        need("round y", Self::len(y), rows * dim)?;
        self.round_activations_raw(x, y, rows * dim, kind)
    }

    /// `c[b]` for each block of 32 of `x` (`rows · dim`, `dim` a multiple of 32):
    /// `f16(d · Σq) − f16(d) · Σq` of the block rounded as [`ActRound::Q8Blocks32`] — the part
    /// of the CPU's sum term that `x'` lacks, which a zero-point weight type's block minimum
    /// multiplies.
    fn q8_sum_correction(
        &self,
        x: &Self::Buf<f32>,
        c: &mut Self::Buf<f32>,
        rows: usize,
        dim: usize,
    ) -> Result<(), CudaError> {
        if !dim.is_multiple_of(32) {
            return Err(CudaError::Invalid(format!("rows of {dim} in blocks of 32")));
        }
        need("q8_sum_correction x", Self::len(x), rows * dim)?;
        need("q8_sum_correction c", Self::len(c), rows * dim / 32)?;
        self.q8_sum_correction_raw(x, c, rows * dim)
    }

    /// `x[i] += y[i]` for `i < n`.
    fn add(&self, x: &mut Self::Buf<f32>, y: &Self::Buf<f32>, n: usize) -> Result<(), CudaError> {
        need("add x", Self::len(x), n)?;
        need("add y", Self::len(y), n)?;
        self.add_raw(x, y, n)
    }

    /// `x[r, i] += b[i]`.
    fn add_bias(
        &self,
        x: &mut Self::Buf<f32>,
        b: &Self::Buf<f32>,
        rows: usize,
        dim: usize,
    ) -> Result<(), CudaError> {
        need("add_bias x", Self::len(x), rows * dim)?;
        need("add_bias b", Self::len(b), dim)?;
        self.add_bias_raw(x, b, rows, dim)
    }

    /// `out[i] = act(gate[i]) · up[i]` for `i < n`.
    fn gated(
        &self,
        gate_kind: Gate,
        gate: &Self::Buf<f32>,
        up: &Self::Buf<f32>,
        out: &mut Self::Buf<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        need("gated gate", Self::len(gate), n)?;
        need("gated up", Self::len(up), n)?;
        need("gated out", Self::len(out), n)?;
        self.gated_raw(gate_kind, gate, up, out, n)
    }

    /// `x[i] = cap · tanh(x[i] / cap)` for `i < n`.
    fn softcap(&self, x: &mut Self::Buf<f32>, n: usize, cap: f32) -> Result<(), CudaError> {
        need("softcap x", Self::len(x), n)?;
        self.softcap_raw(x, n, cap)
    }

    /// `out[r] = x[idx[r]]` for `count` rows of `dim`; every index must be a row of `x`.
    fn gather_rows(
        &self,
        x: &Self::Buf<f32>,
        idx: &Self::Buf<i32>,
        out: &mut Self::Buf<f32>,
        count: usize,
        dim: usize,
    ) -> Result<(), CudaError> {
        need("gather idx", Self::len(idx), count)?;
        need("gather out", Self::len(out), count * dim)?;
        self.gather_rows_raw(x, idx, out, count, dim)
    }

    /// `out[r]` = the first index of the largest of `logits[r]` (NaN never wins).
    fn argmax_rows(
        &self,
        logits: &Self::Buf<f32>,
        out: &mut Self::Buf<i32>,
        rows: usize,
        vocab: usize,
    ) -> Result<(), CudaError> {
        need("argmax logits", Self::len(logits), rows * vocab)?;
        need("argmax out", Self::len(out), rows)?;
        self.argmax_rows_raw(logits, out, rows, vocab)
    }

    /// Writes `tokens` rows of K and V (`[tokens, kv_heads · head_dim]`, rounded to f16) of
    /// `layer` at (dst_block[t], dst_row[t]); every block must be `< num_blocks` and every row
    /// `< block_size` (the caller's block tables guarantee it).
    #[allow(clippy::too_many_arguments)]
    fn kv_write(
        &self,
        k: &Self::Buf<f32>,
        v: &Self::Buf<f32>,
        k_pool: &mut Self::Buf<u16>,
        v_pool: &mut Self::Buf<u16>,
        layout: KvLayout,
        layer: usize,
        dst_block: &Self::Buf<i32>,
        dst_row: &Self::Buf<i32>,
        tokens: usize,
    ) -> Result<(), CudaError> {
        let kvd = layout.kv_heads * layout.head_dim;
        need("kv_write k", Self::len(k), tokens * kvd)?;
        need("kv_write v", Self::len(v), tokens * kvd)?;
        need("kv_write k_pool", Self::len(k_pool), layout.pool_elems())?;
        need("kv_write v_pool", Self::len(v_pool), layout.pool_elems())?;
        need("kv_write dst_block", Self::len(dst_block), tokens)?;
        need("kv_write dst_row", Self::len(dst_row), tokens)?;
        if layer >= layout.layers {
            return Err(CudaError::Invalid(format!("kv_write of layer {layer}")));
        }
        self.kv_write_raw(
            k, v, k_pool, v_pool, layout, layer, dst_block, dst_row, tokens,
        )
    }

    /// Causal grouped-query attention of `shape.tokens` query rows (`q [tokens, heads,
    /// head_dim]`) of `layer` over the pools: token t of table row `seq[t]` at `pos[t]`; see
    /// `attention_paged_f16`. Every table entry a token reads must be a block of the pool.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Buf<f32>,
        k_pool: &Self::Buf<u16>,
        v_pool: &Self::Buf<u16>,
        layout: KvLayout,
        layer: usize,
        tables: &Self::Buf<i32>,
        seq: &Self::Buf<i32>,
        pos: &Self::Buf<i32>,
        out: &mut Self::Buf<f32>,
        shape: AttnShape,
    ) -> Result<(), CudaError> {
        let hd = layout.head_dim;
        if hd > 256 || layout.kv_heads == 0 || !shape.heads.is_multiple_of(layout.kv_heads) {
            return Err(CudaError::Invalid(format!(
                "attention of {} heads over {} K/V heads of {hd}",
                shape.heads, layout.kv_heads
            )));
        }
        need("attention q", Self::len(q), shape.tokens * shape.heads * hd)?;
        need(
            "attention out",
            Self::len(out),
            shape.tokens * shape.heads * hd,
        )?;
        need("attention seq", Self::len(seq), shape.tokens)?;
        need("attention pos", Self::len(pos), shape.tokens)?;
        need("attention k_pool", Self::len(k_pool), layout.pool_elems())?;
        need("attention v_pool", Self::len(v_pool), layout.pool_elems())?;
        need("attention tables", Self::len(tables), shape.max_blocks)?;
        if layer >= layout.layers {
            return Err(CudaError::Invalid(format!("attention of layer {layer}")));
        }
        self.attention_raw(
            q, k_pool, v_pool, layout, layer, tables, seq, pos, out, shape,
        )
    }

    /// `y[rows, out] = x[rows, in] · w[out, in]ᵀ`.
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        y: &mut Self::Buf<f32>,
        rows: usize,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<(), CudaError> {
        need("linear x", Self::len(x), rows * in_dim)?;
        need("linear y", Self::len(y), rows * out_dim)?;
        if Self::len(w) != in_dim * out_dim {
            return Err(CudaError::Invalid(format!(
                "linear: a weight of {} elements for {out_dim}×{in_dim}",
                Self::len(w)
            )));
        }
        self.linear_raw(x, w, y, rows, in_dim, out_dim)
    }

    fn embed_raw(
        &self,
        table: &Self::Buf<f32>,
        ids: &Self::Buf<i32>,
        out: &mut Self::Buf<f32>,
        rows: usize,
        dim: usize,
        scale: f32,
    ) -> Result<(), CudaError>;
    fn rms_norm_raw(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        y: &mut Self::Buf<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), CudaError>;
    #[allow(clippy::too_many_arguments)]
    fn rope_raw(
        &self,
        x: &mut Self::Buf<f32>,
        cos_sin: &Self::Buf<f32>,
        rows: usize,
        heads: usize,
        head_dim: usize,
        rot_dims: usize,
        neox: bool,
    ) -> Result<(), CudaError>;
    fn add_raw(
        &self,
        x: &mut Self::Buf<f32>,
        y: &Self::Buf<f32>,
        n: usize,
    ) -> Result<(), CudaError>;
    fn round_activations_raw(
        &self,
        x: &Self::Buf<f32>,
        y: &mut Self::Buf<f32>,
        n: usize,
        kind: ActRound,
    ) -> Result<(), CudaError>;
    fn q8_sum_correction_raw(
        &self,
        x: &Self::Buf<f32>,
        c: &mut Self::Buf<f32>,
        n: usize,
    ) -> Result<(), CudaError>;
    fn add_bias_raw(
        &self,
        x: &mut Self::Buf<f32>,
        b: &Self::Buf<f32>,
        rows: usize,
        dim: usize,
    ) -> Result<(), CudaError>;
    fn gated_raw(
        &self,
        gate_kind: Gate,
        gate: &Self::Buf<f32>,
        up: &Self::Buf<f32>,
        out: &mut Self::Buf<f32>,
        n: usize,
    ) -> Result<(), CudaError>;
    fn softcap_raw(&self, x: &mut Self::Buf<f32>, n: usize, cap: f32) -> Result<(), CudaError>;
    fn gather_rows_raw(
        &self,
        x: &Self::Buf<f32>,
        idx: &Self::Buf<i32>,
        out: &mut Self::Buf<f32>,
        count: usize,
        dim: usize,
    ) -> Result<(), CudaError>;
    fn argmax_rows_raw(
        &self,
        logits: &Self::Buf<f32>,
        out: &mut Self::Buf<i32>,
        rows: usize,
        vocab: usize,
    ) -> Result<(), CudaError>;
    #[allow(clippy::too_many_arguments)]
    fn kv_write_raw(
        &self,
        k: &Self::Buf<f32>,
        v: &Self::Buf<f32>,
        k_pool: &mut Self::Buf<u16>,
        v_pool: &mut Self::Buf<u16>,
        layout: KvLayout,
        layer: usize,
        dst_block: &Self::Buf<i32>,
        dst_row: &Self::Buf<i32>,
        tokens: usize,
    ) -> Result<(), CudaError>;
    #[allow(clippy::too_many_arguments)]
    fn attention_raw(
        &self,
        q: &Self::Buf<f32>,
        k_pool: &Self::Buf<u16>,
        v_pool: &Self::Buf<u16>,
        layout: KvLayout,
        layer: usize,
        tables: &Self::Buf<i32>,
        seq: &Self::Buf<i32>,
        pos: &Self::Buf<i32>,
        out: &mut Self::Buf<f32>,
        shape: AttnShape,
    ) -> Result<(), CudaError>;
    #[allow(clippy::too_many_arguments)]
    fn linear_raw(
        &self,
        x: &Self::Buf<f32>,
        w: &Self::Buf<f32>,
        y: &mut Self::Buf<f32>,
        rows: usize,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<(), CudaError>;
}

/// Each kernel's definition on the CPU, over `Vec`s.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostOps;

fn index(v: i32, len: usize, what: &str) -> Result<usize, CudaError> {
    usize::try_from(v)
        .ok()
        .filter(|&i| i < len)
        .ok_or_else(|| CudaError::Invalid(format!("{what} {v} out of range (< {len})")))
}

/// `Σ a[i]·b[i]` in 16 f32 lanes (the order a vectorised loop takes; CPU reference speed).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

impl Ops for HostOps {
    type Buf<T: DeviceScalar> = Vec<T>;

    fn upload<T: DeviceScalar>(&self, host: &[T]) -> Result<Vec<T>, CudaError> {
        Ok(host.to_vec())
    }

    fn alloc<T: DeviceScalar>(&self, len: usize) -> Result<Vec<T>, CudaError> {
        Ok(vec![T::default(); len])
    }

    fn read<T: DeviceScalar>(&self, buf: &Vec<T>) -> Result<Vec<T>, CudaError> {
        Ok(buf.clone())
    }

    fn len<T: DeviceScalar>(buf: &Vec<T>) -> usize {
        buf.len()
    }

    fn name(&self) -> &'static str {
        "host"
    }

    fn read_range<T: DeviceScalar>(
        &self,
        buf: &Vec<T>,
        at: usize,
        len: usize,
    ) -> Result<Vec<T>, CudaError> {
        buf.get(at..at + len)
            .map(<[T]>::to_vec)
            .ok_or_else(|| CudaError::Invalid(format!("read of {len} at {at} from {}", buf.len())))
    }

    fn write_range<T: DeviceScalar>(
        &self,
        buf: &mut Vec<T>,
        at: usize,
        host: &[T],
    ) -> Result<(), CudaError> {
        let n = buf.len();
        buf.get_mut(at..at + host.len())
            .ok_or_else(|| CudaError::Invalid(format!("write of {} at {at} into {n}", host.len())))?
            .copy_from_slice(host);
        Ok(())
    }

    fn copy_range<T: DeviceScalar>(
        &self,
        buf: &mut Vec<T>,
        src_at: usize,
        dst_at: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let n = buf.len();
        let disjoint = src_at + len <= dst_at || dst_at + len <= src_at;
        if src_at + len > n || dst_at + len > n || !disjoint {
            return Err(CudaError::Invalid(format!(
                "copy of {len} from {src_at} to {dst_at} in {n}"
            )));
        }
        buf.copy_within(src_at..src_at + len, dst_at);
        Ok(())
    }

    fn embed_raw(
        &self,
        table: &Vec<f32>,
        ids: &Vec<i32>,
        out: &mut Vec<f32>,
        rows: usize,
        dim: usize,
        scale: f32,
    ) -> Result<(), CudaError> {
        let vocab = table.len() / dim;
        for r in 0..rows {
            let id = index(ids[r], vocab, "embed id")?;
            for (o, &t) in out[r * dim..][..dim]
                .iter_mut()
                .zip(&table[id * dim..][..dim])
            {
                *o = t * scale;
            }
        }
        Ok(())
    }

    fn rms_norm_raw(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        y: &mut Vec<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        for r in 0..rows {
            let xr = &x[r * dim..][..dim];
            let ss: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let scale = (1.0 / (ss / dim as f64 + f64::from(eps)).sqrt()) as f32;
            for ((o, &v), &wi) in y[r * dim..][..dim].iter_mut().zip(xr).zip(w) {
                *o = v * scale * wi;
            }
        }
        Ok(())
    }

    fn rope_raw(
        &self,
        x: &mut Vec<f32>,
        cos_sin: &Vec<f32>,
        rows: usize,
        heads: usize,
        head_dim: usize,
        rot_dims: usize,
        neox: bool,
    ) -> Result<(), CudaError> {
        let half = rot_dims / 2;
        for r in 0..rows {
            let cs = &cos_sin[r * rot_dims..][..rot_dims];
            for h in 0..heads {
                let head = &mut x[(r * heads + h) * head_dim..][..head_dim];
                for i in 0..half {
                    let (a, b) = if neox {
                        (i, i + half)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (c, s) = (cs[2 * i], cs[2 * i + 1]);
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0.mul_add(c, -(x1 * s));
                    head[b] = x0.mul_add(s, x1 * c);
                }
            }
        }
        Ok(())
    }

    fn add_raw(&self, x: &mut Vec<f32>, y: &Vec<f32>, n: usize) -> Result<(), CudaError> {
        x[..n].iter_mut().zip(&y[..n]).for_each(|(a, &b)| *a += b);
        Ok(())
    }

    fn q8_sum_correction_raw(
        &self,
        x: &Vec<f32>,
        c: &mut Vec<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        for (xb, cb) in x[..n].chunks_exact(32).zip(c.iter_mut()) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let sum: f32 = xb.iter().map(|&v| (v * id).round_ties_even()).sum();
            let d = amax / 127.0;
            let f16r = |v: f32| f16::from_f32(v).to_f32();
            *cb = f16r(d * sum) - f16r(d) * sum;
        }
        Ok(())
    }

    fn round_activations_raw(
        &self,
        x: &Vec<f32>,
        y: &mut Vec<f32>,
        n: usize,
        kind: ActRound,
    ) -> Result<(), CudaError> {
        let blocks = x[..n]
            .chunks_exact(kind.block())
            .zip(y[..n].chunks_exact_mut(kind.block()));
        for (xb, yb) in blocks {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            match kind {
                ActRound::None => yb.copy_from_slice(xb),
                ActRound::Q8Blocks32 => {
                    let d = f16::from_f32(amax / 127.0).to_f32();
                    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
                    for (o, &v) in yb.iter_mut().zip(xb) {
                        *o = d * (v * id).round_ties_even();
                    }
                }
                ActRound::Q8K => {
                    if amax == 0.0 || !amax.is_finite() {
                        yb.fill(0.0);
                        continue;
                    }
                    let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
                    let iscale = -127.0 / max;
                    for (o, &v) in yb.iter_mut().zip(xb) {
                        *o = (iscale * v).round_ties_even().clamp(-128.0, 127.0) * (1.0 / iscale);
                    }
                }
            }
        }
        Ok(())
    }

    fn add_bias_raw(
        &self,
        x: &mut Vec<f32>,
        b: &Vec<f32>,
        rows: usize,
        dim: usize,
    ) -> Result<(), CudaError> {
        for row in x[..rows * dim].chunks_exact_mut(dim) {
            row.iter_mut().zip(&b[..dim]).for_each(|(a, &c)| *a += c);
        }
        Ok(())
    }

    fn gated_raw(
        &self,
        gate_kind: Gate,
        gate: &Vec<f32>,
        up: &Vec<f32>,
        out: &mut Vec<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        for i in 0..n {
            let g = gate[i];
            let act = match gate_kind {
                Gate::Silu => g / (1.0 + (-g).exp()),
                Gate::GeluTanh => {
                    0.5 * g * (1.0 + (0.797_884_6 * (g + 0.044_715 * g * g * g)).tanh())
                }
            };
            out[i] = act * up[i];
        }
        Ok(())
    }

    fn softcap_raw(&self, x: &mut Vec<f32>, n: usize, cap: f32) -> Result<(), CudaError> {
        x[..n].iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        Ok(())
    }

    fn gather_rows_raw(
        &self,
        x: &Vec<f32>,
        idx: &Vec<i32>,
        out: &mut Vec<f32>,
        count: usize,
        dim: usize,
    ) -> Result<(), CudaError> {
        for r in 0..count {
            let src = index(idx[r], x.len() / dim, "gathered row")?;
            out[r * dim..][..dim].copy_from_slice(&x[src * dim..][..dim]);
        }
        Ok(())
    }

    fn argmax_rows_raw(
        &self,
        logits: &Vec<f32>,
        out: &mut Vec<i32>,
        rows: usize,
        vocab: usize,
    ) -> Result<(), CudaError> {
        for r in 0..rows {
            let row = &logits[r * vocab..][..vocab];
            let mut best: Option<usize> = None;
            for (i, &v) in row.iter().enumerate() {
                if !v.is_nan() && best.is_none_or(|b| v > row[b]) {
                    best = Some(i);
                }
            }
            out[r] = best.unwrap_or(0) as i32;
        }
        Ok(())
    }

    fn kv_write_raw(
        &self,
        k: &Vec<f32>,
        v: &Vec<f32>,
        k_pool: &mut Vec<u16>,
        v_pool: &mut Vec<u16>,
        layout: KvLayout,
        layer: usize,
        dst_block: &Vec<i32>,
        dst_row: &Vec<i32>,
        tokens: usize,
    ) -> Result<(), CudaError> {
        let (hd, kvh) = (layout.head_dim, layout.kv_heads);
        let base = layer * layout.layer_elems();
        for t in 0..tokens {
            let block = index(dst_block[t], layout.num_blocks, "K/V block")?;
            let row = index(dst_row[t], layout.block_size, "K/V row")?;
            for h in 0..kvh {
                let at = base + ((h * layout.num_blocks + block) * layout.block_size + row) * hd;
                for d in 0..hd {
                    let src = (t * kvh + h) * hd + d;
                    k_pool[at + d] = f16::from_f32(k[src]).to_bits();
                    v_pool[at + d] = f16::from_f32(v[src]).to_bits();
                }
            }
        }
        Ok(())
    }

    fn attention_raw(
        &self,
        q: &Vec<f32>,
        k_pool: &Vec<u16>,
        v_pool: &Vec<u16>,
        layout: KvLayout,
        layer: usize,
        tables: &Vec<i32>,
        seq: &Vec<i32>,
        pos: &Vec<i32>,
        out: &mut Vec<f32>,
        shape: AttnShape,
    ) -> Result<(), CudaError> {
        let (hd, kvh, bs) = (layout.head_dim, layout.kv_heads, layout.block_size);
        let base = layer * layout.layer_elems();
        let group = shape.heads / kvh;
        let num_tables = tables.len() / shape.max_blocks.max(1);
        let mut scores = Vec::new();
        for t in 0..shape.tokens {
            let s = index(seq[t], num_tables, "table row")?;
            let p = index(pos[t], shape.max_blocks * bs, "position")?;
            let lo = if shape.window > 0 {
                (p + 1).saturating_sub(shape.window)
            } else {
                0
            };
            let mut rows = Vec::with_capacity(p + 1 - lo);
            for j in lo..=p {
                let block = index(
                    tables[s * shape.max_blocks + j / bs],
                    layout.num_blocks,
                    "block",
                )?;
                rows.push((block * bs + j % bs) * hd);
            }
            for h in 0..shape.heads {
                let head_base = base + (h / group) * layout.num_blocks * bs * hd;
                let qh = &q[(t * shape.heads + h) * hd..][..hd];
                scores.clear();
                for &r in &rows {
                    let k = &k_pool[head_base + r..][..hd];
                    let dot: f64 = qh
                        .iter()
                        .zip(k)
                        .map(|(&a, &b)| {
                            f64::from(a * shape.scale) * f64::from(f16::from_bits(b).to_f32())
                        })
                        .sum();
                    let c = f64::from(shape.softcap);
                    scores.push(if c > 0.0 { c * (dot / c).tanh() } else { dot });
                }
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut total = 0.0;
                let mut acc = vec![0f64; hd];
                for (&r, &sc) in rows.iter().zip(&scores) {
                    let w = (sc - m).exp();
                    total += w;
                    for (a, &b) in acc.iter_mut().zip(&v_pool[head_base + r..][..hd]) {
                        *a += w * f64::from(f16::from_bits(b).to_f32());
                    }
                }
                for (o, a) in out[(t * shape.heads + h) * hd..][..hd].iter_mut().zip(acc) {
                    *o = if total > 0.0 { (a / total) as f32 } else { 0.0 };
                }
            }
        }
        Ok(())
    }

    fn linear_raw(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        y: &mut Vec<f32>,
        rows: usize,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<(), CudaError> {
        for r in 0..rows {
            let xr = &x[r * in_dim..][..in_dim];
            for (o, wr) in y[r * out_dim..][..out_dim]
                .iter_mut()
                .zip(w.chunks_exact(in_dim))
            {
                *o = dot(xr, wr);
            }
        }
        Ok(())
    }
}

/// The kernels on a GPU. The linear layers run `linear_f32` (a fixed order of operations per
/// output, whatever the batch); cuBLAS is kept beside it as the speed reference of
/// `agentkv gpu-check` ([`CudaOps::cublas_linear`]).
pub struct CudaOps {
    gpu: Gpu,
    cublas: Mutex<Cublas>,
}

impl CudaOps {
    pub fn new(gpu: Gpu, cublas: Cublas) -> CudaOps {
        CudaOps {
            gpu,
            cublas: Mutex::new(cublas),
        }
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// `y = x · wᵀ` by cuBLAS (`Sgemm`, no TF32): the reference the kernel is timed against.
    #[allow(clippy::too_many_arguments)]
    pub fn cublas_linear(
        &self,
        x: &DeviceBuffer<f32>,
        w: &DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        rows: usize,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<(), CudaError> {
        let mut cublas = self.cublas.lock().unwrap_or_else(|p| p.into_inner());
        cublas.linear(x, 0, w, y, 0, rows, in_dim, out_dim)
    }
}

const THREADS: (u32, u32, u32) = (128, 1, 1);

fn blocks(n: usize) -> (u32, u32, u32) {
    (n.clamp(1, 65_535) as u32, 1, 1)
}

fn rows_grid(rows: usize) -> Result<(u32, u32, u32), CudaError> {
    if rows > i32::MAX as usize {
        return Err(CudaError::Invalid(format!("{rows} rows in one launch")));
    }
    Ok((rows.max(1) as u32, 1, 1))
}

impl Ops for CudaOps {
    type Buf<T: DeviceScalar> = DeviceBuffer<T>;

    fn upload<T: DeviceScalar>(&self, host: &[T]) -> Result<DeviceBuffer<T>, CudaError> {
        self.gpu.upload(host)
    }

    fn alloc<T: DeviceScalar>(&self, len: usize) -> Result<DeviceBuffer<T>, CudaError> {
        self.gpu.alloc(len)
    }

    fn read<T: DeviceScalar>(&self, buf: &DeviceBuffer<T>) -> Result<Vec<T>, CudaError> {
        buf.read()
    }

    fn len<T: DeviceScalar>(buf: &DeviceBuffer<T>) -> usize {
        buf.len()
    }

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn read_range<T: DeviceScalar>(
        &self,
        buf: &DeviceBuffer<T>,
        at: usize,
        len: usize,
    ) -> Result<Vec<T>, CudaError> {
        buf.read_range(at, len)
    }

    fn write_range<T: DeviceScalar>(
        &self,
        buf: &mut DeviceBuffer<T>,
        at: usize,
        host: &[T],
    ) -> Result<(), CudaError> {
        buf.write_range(at, host)
    }

    fn copy_range<T: DeviceScalar>(
        &self,
        buf: &mut DeviceBuffer<T>,
        src_at: usize,
        dst_at: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        if !(src_at + len <= dst_at || dst_at + len <= src_at) {
            return Err(CudaError::Invalid(format!(
                "overlapping device copy of {len} from {src_at} to {dst_at}"
            )));
        }
        buf.copy_from(dst_at, buf, src_at, len)
    }

    fn embed_raw(
        &self,
        table: &DeviceBuffer<f32>,
        ids: &DeviceBuffer<i32>,
        out: &mut DeviceBuffer<f32>,
        rows: usize,
        dim: usize,
        scale: f32,
    ) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        let args = [
            table.arg(),
            ids.arg(),
            out.arg(),
            Arg::I32(to_i32(dim)?),
            Arg::F32(scale),
        ];
        self.gpu
            .launch("embed_rows_f32", rows_grid(rows)?, THREADS, 0, &args)
    }

    fn rms_norm_raw(
        &self,
        x: &DeviceBuffer<f32>,
        w: &DeviceBuffer<f32>,
        y: &mut DeviceBuffer<f32>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        let args = [
            x.arg(),
            w.arg(),
            y.arg(),
            Arg::I32(to_i32(dim)?),
            Arg::F32(eps),
            Arg::F32(0.0),
        ];
        self.gpu
            .launch("rms_norm_f32", rows_grid(rows)?, (256, 1, 1), 0, &args)
    }

    fn rope_raw(
        &self,
        x: &mut DeviceBuffer<f32>,
        cos_sin: &DeviceBuffer<f32>,
        rows: usize,
        heads: usize,
        head_dim: usize,
        rot_dims: usize,
        neox: bool,
    ) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        let args = [
            x.arg(),
            cos_sin.arg(),
            Arg::I32(to_i32(heads)?),
            Arg::I32(to_i32(head_dim)?),
            Arg::I32(to_i32(rot_dims)?),
            Arg::I32(neox as i32),
        ];
        self.gpu
            .launch("rope_f32", rows_grid(rows * heads)?, (64, 1, 1), 0, &args)
    }

    fn add_raw(
        &self,
        x: &mut DeviceBuffer<f32>,
        y: &DeviceBuffer<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let args = [x.arg(), y.arg(), Arg::I32(to_i32(n)?)];
        self.gpu
            .launch("add_f32", blocks(n.div_ceil(256)), (256, 1, 1), 0, &args)
    }

    fn q8_sum_correction_raw(
        &self,
        x: &DeviceBuffer<f32>,
        c: &mut DeviceBuffer<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let args = [x.arg(), c.arg(), Arg::I32(to_i32(n)?)];
        self.gpu.launch(
            "q8_sum_correction_f32",
            blocks((n / 32).div_ceil(4)),
            THREADS,
            0,
            &args,
        )
    }

    fn round_activations_raw(
        &self,
        x: &DeviceBuffer<f32>,
        y: &mut DeviceBuffer<f32>,
        n: usize,
        kind: ActRound,
    ) -> Result<(), CudaError> {
        let (name, block) = match kind {
            ActRound::None => return y.copy_from(0, x, 0, n),
            ActRound::Q8Blocks32 => ("round_q8_32_f32", 32),
            ActRound::Q8K => ("round_q8k_f32", 256),
        };
        let args = [x.arg(), y.arg(), Arg::I32(to_i32(n)?)];
        self.gpu
            .launch(name, blocks((n / block).div_ceil(4)), THREADS, 0, &args)
    }

    fn add_bias_raw(
        &self,
        x: &mut DeviceBuffer<f32>,
        b: &DeviceBuffer<f32>,
        rows: usize,
        dim: usize,
    ) -> Result<(), CudaError> {
        let args = [
            x.arg(),
            b.arg(),
            Arg::I32(to_i32(rows)?),
            Arg::I32(to_i32(dim)?),
        ];
        let n = rows * dim;
        self.gpu.launch(
            "add_bias_f32",
            blocks(n.div_ceil(256)),
            (256, 1, 1),
            0,
            &args,
        )
    }

    fn gated_raw(
        &self,
        gate_kind: Gate,
        gate: &DeviceBuffer<f32>,
        up: &DeviceBuffer<f32>,
        out: &mut DeviceBuffer<f32>,
        n: usize,
    ) -> Result<(), CudaError> {
        let name = match gate_kind {
            Gate::Silu => "swiglu_f32",
            Gate::GeluTanh => "geglu_f32",
        };
        let args = [gate.arg(), up.arg(), out.arg(), Arg::I32(to_i32(n)?)];
        self.gpu
            .launch(name, blocks(n.div_ceil(256)), (256, 1, 1), 0, &args)
    }

    fn softcap_raw(&self, x: &mut DeviceBuffer<f32>, n: usize, cap: f32) -> Result<(), CudaError> {
        let args = [x.arg(), Arg::I32(to_i32(n)?), Arg::F32(cap)];
        self.gpu.launch(
            "softcap_f32",
            blocks(n.div_ceil(256)),
            (256, 1, 1),
            0,
            &args,
        )
    }

    fn gather_rows_raw(
        &self,
        x: &DeviceBuffer<f32>,
        idx: &DeviceBuffer<i32>,
        out: &mut DeviceBuffer<f32>,
        count: usize,
        dim: usize,
    ) -> Result<(), CudaError> {
        if count == 0 {
            return Ok(());
        }
        let args = [x.arg(), idx.arg(), out.arg(), Arg::I32(to_i32(dim)?)];
        self.gpu
            .launch("gather_rows_f32", rows_grid(count)?, THREADS, 0, &args)
    }

    fn argmax_rows_raw(
        &self,
        logits: &DeviceBuffer<f32>,
        out: &mut DeviceBuffer<i32>,
        rows: usize,
        vocab: usize,
    ) -> Result<(), CudaError> {
        if rows == 0 {
            return Ok(());
        }
        let args = [logits.arg(), Arg::I32(to_i32(vocab)?), out.arg()];
        self.gpu
            .launch("argmax_rows_f32", rows_grid(rows)?, (1024, 1, 1), 0, &args)
    }

    fn kv_write_raw(
        &self,
        k: &DeviceBuffer<f32>,
        v: &DeviceBuffer<f32>,
        k_pool: &mut DeviceBuffer<u16>,
        v_pool: &mut DeviceBuffer<u16>,
        layout: KvLayout,
        layer: usize,
        dst_block: &DeviceBuffer<i32>,
        dst_row: &DeviceBuffer<i32>,
        tokens: usize,
    ) -> Result<(), CudaError> {
        if tokens == 0 {
            return Ok(());
        }
        let base = layer * layout.layer_elems();
        let args = [
            k.arg(),
            v.arg(),
            k_pool.arg_at(base)?,
            v_pool.arg_at(base)?,
            dst_block.arg(),
            dst_row.arg(),
            Arg::I32(to_i32(layout.kv_heads)?),
            Arg::I32(to_i32(layout.head_dim)?),
            Arg::I32(to_i32(layout.num_blocks)?),
            Arg::I32(to_i32(layout.block_size)?),
        ];
        self.gpu
            .launch("kv_write_f16", rows_grid(tokens)?, THREADS, 0, &args)
    }

    fn attention_raw(
        &self,
        q: &DeviceBuffer<f32>,
        k_pool: &DeviceBuffer<u16>,
        v_pool: &DeviceBuffer<u16>,
        layout: KvLayout,
        layer: usize,
        tables: &DeviceBuffer<i32>,
        seq: &DeviceBuffer<i32>,
        pos: &DeviceBuffer<i32>,
        out: &mut DeviceBuffer<f32>,
        shape: AttnShape,
    ) -> Result<(), CudaError> {
        if shape.tokens == 0 {
            return Ok(());
        }
        let base = layer * layout.layer_elems();
        let args = [
            q.arg(),
            k_pool.arg_at(base)?,
            v_pool.arg_at(base)?,
            tables.arg(),
            seq.arg(),
            pos.arg(),
            out.arg(),
            Arg::I32(to_i32(shape.heads)?),
            Arg::I32(to_i32(layout.kv_heads)?),
            Arg::I32(to_i32(layout.head_dim)?),
            Arg::I32(to_i32(layout.num_blocks)?),
            Arg::I32(to_i32(layout.block_size)?),
            Arg::I32(to_i32(shape.max_blocks)?),
            Arg::I32(to_i32(shape.window)?),
            Arg::F32(shape.scale),
            Arg::F32(shape.softcap),
        ];
        let shared = THREADS.0 / 32 * layout.head_dim as u32 * 4;
        let grid = rows_grid(shape.tokens * shape.heads)?;
        self.gpu
            .launch("attention_paged_f16", grid, THREADS, shared, &args)
    }

    fn linear_raw(
        &self,
        x: &DeviceBuffer<f32>,
        w: &DeviceBuffer<f32>,
        y: &mut DeviceBuffer<f32>,
        rows: usize,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<(), CudaError> {
        if rows == 0 || out_dim == 0 {
            return Ok(());
        }
        let args = [
            x.arg(),
            w.arg(),
            y.arg(),
            Arg::I32(to_i32(rows)?),
            Arg::I32(to_i32(in_dim)?),
            Arg::I32(to_i32(out_dim)?),
        ];
        let grid = (
            out_dim.div_ceil(64) as u32,
            to_i32(rows.div_ceil(64))? as u32,
            1,
        );
        self.gpu.launch("linear_f32", grid, (256, 1, 1), 0, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_buffer_is_refused_before_any_kernel_runs() {
        let o = HostOps;
        let x = vec![0f32; 10];
        let mut y = vec![0f32; 9];
        let w = vec![1f32; 5];
        let e = o.rms_norm(&x, &w, &mut y, 2, 5, 1e-5).unwrap_err();
        assert!(e.to_string().contains("rms_norm y"), "{e}");
        let e = o.linear(&x, &w, &mut y, 2, 5, 2).unwrap_err();
        assert!(
            e.to_string().contains("a weight of 5 elements for 2×5"),
            "{e}"
        );
        let e = o
            .round_activations(&x, &mut y, 1, 10, ActRound::Q8Blocks32)
            .unwrap_err();
        assert!(e.to_string().contains("blocks of 32"), "{e}");
    }

    #[test]
    fn host_attention_reads_only_its_window_and_its_own_sequence() {
        // Two sequences in one pool; a window of 2: the output is the softmax mix
        // of the last two V rows of its own sequence only.
        let layout = KvLayout {
            layers: 1,
            kv_heads: 1,
            head_dim: 2,
            num_blocks: 2,
            block_size: 4,
        };
        let o = HostOps;
        let (mut kp, mut vp) = (vec![0u16; 16], vec![0u16; 16]);
        let k = [0f32; 8];
        let v: Vec<f32> = (0..8).map(|i| i as f32).collect();
        // Sequence 0 in block 1, sequence 1 in block 0, four positions each.
        let blocks = vec![1, 1, 1, 1, 0, 0, 0, 0];
        let rows = vec![0, 1, 2, 3, 0, 1, 2, 3];
        let kv = (0..8).flat_map(|t| [v[t], v[t]]).collect::<Vec<_>>();
        o.kv_write(
            &k.repeat(2),
            &kv,
            &mut kp,
            &mut vp,
            layout,
            0,
            &blocks,
            &rows,
            8,
        )
        .unwrap();
        let tables = vec![1, 0];
        let q = vec![0f32; 2];
        let mut out = vec![0f32; 2];
        let shape = AttnShape {
            tokens: 1,
            heads: 1,
            max_blocks: 1,
            window: 2,
            scale: 1.0,
            softcap: 0.0,
        };
        o.attention(
            &q,
            &kp,
            &vp,
            layout,
            0,
            &tables,
            &vec![1],
            &vec![3],
            &mut out,
            shape,
        )
        .unwrap();
        // Scores are all zero: equal weights over positions 2 and 3 of sequence 1 (V 6, 7).
        assert_eq!(out, vec![6.5, 6.5]);
    }
}
