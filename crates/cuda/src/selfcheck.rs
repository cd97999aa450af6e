//! The device check: every kernel of [`crate::kernels::KERNELS`] and the cuBLAS product run on
//! seeded random inputs on the GPU and compared with a plain CPU computation of the same
//! definition (f64 where the kernel sums). What `agentkv gpu-check` prints.
//!
//! Owns those checks and their references only; the model-level comparison (greedy tokens and
//! logprobs against the CPU backend) belongs to the backend that uses these kernels.

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::driver::{Arg, Gpu};
use crate::error::CudaError;
use crate::ops::{ActRound, CudaOps, HostOps, Ops};

/// One check's outcome.
#[derive(Debug, Clone)]
pub struct CheckResult {
    pub name: String,
    /// Largest |gpu − cpu| over the outputs (0 for bit-exact checks that pass).
    pub max_abs_err: f64,
    pub tolerance: f64,
    pub passed: bool,
}

impl std::fmt::Display for CheckResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<44} max|Δ| {:.3e} (tolerance {:.0e})  {}",
            self.name,
            self.max_abs_err,
            self.tolerance,
            if self.passed { "ok" } else { "FAILED" }
        )
    }
}

fn result(name: impl Into<String>, gpu: &[f32], cpu: &[f64], tolerance: f64) -> CheckResult {
    let mut err = if gpu.len() == cpu.len() {
        0.0
    } else {
        f64::INFINITY
    };
    for (g, c) in gpu.iter().zip(cpu) {
        let d = (f64::from(*g) - c).abs();
        err = if d.is_nan() {
            f64::INFINITY
        } else {
            err.max(d)
        };
    }
    CheckResult {
        name: name.into(),
        max_abs_err: err,
        tolerance,
        passed: err <= tolerance,
    }
}

fn randn(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
        .collect()
}

const BLOCK: (u32, u32, u32) = (128, 1, 1);

fn grid(n: usize) -> (u32, u32, u32) {
    (n.clamp(1, 65_535) as u32, 1, 1)
}

/// Runs every check with `seed`; an `Err` is a failure of the device itself (a launch or copy
/// refused), not a wrong answer.
pub fn run_all(ops: &CudaOps, seed: u64) -> Result<Vec<CheckResult>, CudaError> {
    let gpu = ops.gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = vec![
        check_embed(gpu, &mut rng)?,
        check_rms_norm(gpu, &mut rng, 0.0)?,
        check_rms_norm(gpu, &mut rng, 1.0)?,
        check_rope(gpu, &mut rng, true)?,
        check_rope(gpu, &mut rng, false)?,
    ];
    out.extend(check_elementwise(gpu, &mut rng)?);
    out.push(check_gather_argmax(gpu, &mut rng)?);
    out.push(check_f16(gpu, &mut rng)?);
    for (hd, window, softcap) in [(64, 0, 0.0), (256, 0, 50.0), (80, 37, 0.0), (64, 300, 0.0)] {
        out.push(check_attention(gpu, &mut rng, hd, window, softcap)?);
    }
    out.extend(check_linear(ops, &mut rng)?);
    out.push(check_linear_batch_invariance(ops, &mut rng)?);
    out.extend(check_rounding(ops, &mut rng)?);
    Ok(out)
}

fn check_embed(gpu: &Gpu, rng: &mut ChaCha8Rng) -> Result<CheckResult, CudaError> {
    let (vocab, dim) = (300, 96);
    let table = randn(rng, vocab * dim, 1.0);
    let ids: Vec<i32> = (0..11).map(|_| rng.gen_range(0..vocab as i32)).collect();
    let (t, i) = (gpu.upload(&table)?, gpu.upload(&ids)?);
    let o = gpu.alloc::<f32>(ids.len() * dim)?;
    let scale = 24.0f32.sqrt();
    let args = [
        t.arg(),
        i.arg(),
        o.arg(),
        Arg::I32(dim as i32),
        Arg::F32(scale),
    ];
    gpu.launch("embed_rows_f32", grid(ids.len()), BLOCK, 0, &args)?;
    let cpu: Vec<f64> = ids
        .iter()
        .flat_map(|&id| {
            table[id as usize * dim..][..dim]
                .iter()
                .map(|&x| f64::from(x * scale))
        })
        .collect();
    Ok(result("embed_rows_f32", &o.read()?, &cpu, 0.0))
}

fn check_rms_norm(
    gpu: &Gpu,
    rng: &mut ChaCha8Rng,
    w_offset: f32,
) -> Result<CheckResult, CudaError> {
    let (rows, dim, eps) = (7, 576, 1e-5f32);
    let x = randn(rng, rows * dim, 3.0);
    let w = randn(rng, dim, 1.0);
    let (xb, wb, yb) = (
        gpu.upload(&x)?,
        gpu.upload(&w)?,
        gpu.alloc::<f32>(rows * dim)?,
    );
    let args = [
        xb.arg(),
        wb.arg(),
        yb.arg(),
        Arg::I32(dim as i32),
        Arg::F32(eps),
        Arg::F32(w_offset),
    ];
    gpu.launch("rms_norm_f32", grid(rows), BLOCK, 0, &args)?;
    let mut cpu = Vec::new();
    for r in x.chunks(dim) {
        let ms = r.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / dim as f64;
        let s = 1.0 / (ms + f64::from(eps)).sqrt();
        cpu.extend(
            r.iter()
                .zip(&w)
                .map(|(&v, &w)| f64::from(v) * s * f64::from(w + w_offset)),
        );
    }
    Ok(result(
        format!("rms_norm_f32 (w_offset {w_offset})"),
        &yb.read()?,
        &cpu,
        2e-5,
    ))
}

fn check_rope(gpu: &Gpu, rng: &mut ChaCha8Rng, neox: bool) -> Result<CheckResult, CudaError> {
    let (rows, heads, hd, rot) = (5, 9, 64, 48);
    let x = randn(rng, rows * heads * hd, 2.0);
    let cs: Vec<f32> = (0..rows * rot / 2)
        .flat_map(|i| {
            let a = (i as f32) * 0.37;
            [a.cos(), a.sin()]
        })
        .collect();
    let (xb, cb) = (gpu.upload(&x)?, gpu.upload(&cs)?);
    let args = [
        xb.arg(),
        cb.arg(),
        Arg::I32(heads as i32),
        Arg::I32(hd as i32),
        Arg::I32(rot as i32),
        Arg::I32(neox as i32),
    ];
    gpu.launch("rope_f32", grid(rows * heads), BLOCK, 0, &args)?;
    let mut cpu: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    for r in 0..rows {
        for h in 0..heads {
            let base = (r * heads + h) * hd;
            for i in 0..rot / 2 {
                let (a, b) = if neox {
                    (i, i + rot / 2)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (c, s) = (
                    f64::from(cs[(r * rot / 2 + i) * 2]),
                    f64::from(cs[(r * rot / 2 + i) * 2 + 1]),
                );
                let (x0, x1) = (f64::from(x[base + a]), f64::from(x[base + b]));
                cpu[base + a] = x0 * c - x1 * s;
                cpu[base + b] = x0 * s + x1 * c;
            }
        }
    }
    Ok(result(
        format!("rope_f32 (neox {neox})"),
        &xb.read()?,
        &cpu,
        2e-6,
    ))
}

fn check_elementwise(gpu: &Gpu, rng: &mut ChaCha8Rng) -> Result<Vec<CheckResult>, CudaError> {
    let (rows, dim) = (6, 1536);
    let n = rows * dim;
    let a = randn(rng, n, 4.0);
    let b = randn(rng, n, 4.0);
    let bias = randn(rng, dim, 1.0);
    let d = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let g = (grid(n.div_ceil(128)), BLOCK);
    let mut out = Vec::new();

    let x = gpu.upload(&a)?;
    gpu.launch(
        "add_f32",
        g.0,
        g.1,
        0,
        &[x.arg(), gpu.upload(&b)?.arg(), Arg::I32(n as i32)],
    )?;
    let cpu: Vec<f64> = a.iter().zip(&b).map(|(&p, &q)| f64::from(p + q)).collect();
    out.push(result("add_f32", &x.read()?, &cpu, 0.0));

    let x = gpu.upload(&a)?;
    let args = [
        x.arg(),
        gpu.upload(&bias)?.arg(),
        Arg::I32(rows as i32),
        Arg::I32(dim as i32),
    ];
    gpu.launch("add_bias_f32", g.0, g.1, 0, &args)?;
    let cpu: Vec<f64> = a
        .iter()
        .enumerate()
        .map(|(i, &p)| f64::from(p + bias[i % dim]))
        .collect();
    out.push(result("add_bias_f32", &x.read()?, &cpu, 0.0));

    for (name, gelu) in [("swiglu_f32", false), ("geglu_f32", true)] {
        let (ga, ub, ob) = (gpu.upload(&a)?, gpu.upload(&b)?, gpu.alloc::<f32>(n)?);
        gpu.launch(
            name,
            g.0,
            g.1,
            0,
            &[ga.arg(), ub.arg(), ob.arg(), Arg::I32(n as i32)],
        )?;
        let cpu: Vec<f64> = d(&a)
            .iter()
            .zip(d(&b))
            .map(|(&x, u)| {
                let act = if gelu {
                    0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh())
                } else {
                    x / (1.0 + (-x).exp())
                };
                act * u
            })
            .collect();
        out.push(result(name, &ob.read()?, &cpu, 1e-5));
    }

    let x = gpu.upload(&a)?;
    gpu.launch(
        "softcap_f32",
        g.0,
        g.1,
        0,
        &[x.arg(), Arg::I32(n as i32), Arg::F32(3.0)],
    )?;
    let cpu: Vec<f64> = d(&a).iter().map(|&v| 3.0 * (v / 3.0).tanh()).collect();
    out.push(result("softcap_f32", &x.read()?, &cpu, 2e-6));
    Ok(out)
}

fn check_gather_argmax(gpu: &Gpu, rng: &mut ChaCha8Rng) -> Result<CheckResult, CudaError> {
    let (rows, vocab) = (9, 49_152);
    let mut logits = randn(rng, rows * vocab, 10.0);
    // A tie in row 3 (the first index must win) and a NaN in row 5 (it must never win).
    logits[3 * vocab + 7] = 20.0;
    logits[3 * vocab + 40_000] = 20.0;
    logits[5 * vocab + 11] = f32::NAN;
    let pick: Vec<i32> = vec![8, 3, 5, 0];
    let (lb, pb) = (gpu.upload(&logits)?, gpu.upload(&pick)?);
    let gathered = gpu.alloc::<f32>(pick.len() * vocab)?;
    gpu.launch(
        "gather_rows_f32",
        grid(pick.len()),
        BLOCK,
        0,
        &[lb.arg(), pb.arg(), gathered.arg(), Arg::I32(vocab as i32)],
    )?;
    let ids = gpu.alloc::<i32>(pick.len())?;
    gpu.launch(
        "argmax_rows_f32",
        grid(pick.len()),
        (1024, 1, 1),
        0,
        &[gathered.arg(), Arg::I32(vocab as i32), ids.arg()],
    )?;
    let gpu_ids: Vec<f32> = ids.read()?.iter().map(|&i| i as f32).collect();
    let cpu: Vec<f64> = pick
        .iter()
        .map(|&r| {
            let row = &logits[r as usize * vocab..][..vocab];
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] || row[best].is_nan() && !v.is_nan() {
                    best = i;
                }
            }
            best as f64
        })
        .collect();
    Ok(result(
        "gather_rows_f32 + argmax_rows_f32",
        &gpu_ids,
        &cpu,
        0.0,
    ))
}

fn check_f16(gpu: &Gpu, rng: &mut ChaCha8Rng) -> Result<CheckResult, CudaError> {
    let n = 4096;
    let mut x = randn(rng, n, 70_000.0);
    x[0] = 1e-7; // subnormal in f16
    x[1] = 65_520.0; // rounds to infinity
    let (xb, hb, back) = (gpu.upload(&x)?, gpu.alloc::<u16>(n)?, gpu.alloc::<f32>(n)?);
    let g = grid(n.div_ceil(128));
    gpu.launch(
        "f32_to_f16",
        g,
        BLOCK,
        0,
        &[xb.arg(), hb.arg(), Arg::I32(n as i32)],
    )?;
    gpu.launch(
        "f16_to_f32",
        g,
        BLOCK,
        0,
        &[hb.arg(), back.arg(), Arg::I32(n as i32)],
    )?;
    let bits = hb.read()?;
    let cpu: Vec<f64> = x
        .iter()
        .map(|&v| f64::from(f16::from_f32(v).to_f32()))
        .collect();
    let mut r = result(
        "f32_to_f16 + f16_to_f32 (round trip)",
        &back.read()?,
        &cpu,
        0.0,
    );
    let same_bits = bits
        .iter()
        .zip(&x)
        .all(|(&b, &v)| b == f16::from_f32(v).to_bits());
    r.passed &= same_bits;
    Ok(r)
}

/// Pools of one layer `[kv_heads, num_blocks, block_size, head_dim]` f16, block tables of
/// shuffled blocks, tokens of several sequences at several depths; the kernel's output beside
/// a per-position f64 softmax over the same f16 values.
fn check_attention(
    gpu: &Gpu,
    rng: &mut ChaCha8Rng,
    hd: usize,
    window: usize,
    softcap: f32,
) -> Result<CheckResult, CudaError> {
    let (heads, kvh, bs) = (9, 3, 16);
    let seq_lens = [1usize, 17, 300, 1000];
    let max_blocks = 1000usize.div_ceil(bs);
    let num_blocks = seq_lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 5;
    let mut free: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..free.len()).rev() {
        free.swap(i, rng.gen_range(0..=i));
    }
    let mut tables = vec![0i32; seq_lens.len() * max_blocks];
    for (s, &len) in seq_lens.iter().enumerate() {
        for b in 0..len.div_ceil(bs) {
            tables[s * max_blocks + b] = free.pop().expect("enough blocks");
        }
    }
    // Every position's K/V written through kv_write_f16 (a sequence's tokens in one launch).
    let pool_len = kvh * num_blocks * bs * hd;
    let (kp, vp) = (gpu.alloc::<u16>(pool_len)?, gpu.alloc::<u16>(pool_len)?);
    let mut k_host = vec![0f32; pool_len];
    let mut v_host = vec![0f32; pool_len];
    for (s, &len) in seq_lens.iter().enumerate() {
        let k = randn(rng, len * kvh * hd, 1.5);
        let v = randn(rng, len * kvh * hd, 1.5);
        let blocks: Vec<i32> = (0..len).map(|p| tables[s * max_blocks + p / bs]).collect();
        let rows: Vec<i32> = (0..len).map(|p| (p % bs) as i32).collect();
        let (kb, vb, bb, rb) = (
            gpu.upload(&k)?,
            gpu.upload(&v)?,
            gpu.upload(&blocks)?,
            gpu.upload(&rows)?,
        );
        let args = [
            kb.arg(),
            vb.arg(),
            kp.arg(),
            vp.arg(),
            bb.arg(),
            rb.arg(),
            Arg::I32(kvh as i32),
            Arg::I32(hd as i32),
            Arg::I32(num_blocks as i32),
            Arg::I32(bs as i32),
        ];
        gpu.launch("kv_write_f16", grid(len), BLOCK, 0, &args)?;
        for (p, &block) in blocks.iter().enumerate() {
            for h in 0..kvh {
                let at = ((h * num_blocks + block as usize) * bs + p % bs) * hd;
                for d in 0..hd {
                    let src = (p * kvh + h) * hd + d;
                    k_host[at + d] = f16::from_f32(k[src]).to_f32();
                    v_host[at + d] = f16::from_f32(v[src]).to_f32();
                }
            }
        }
    }
    // Query tokens: the last position of each sequence and a few inner ones.
    let mut seq = Vec::new();
    let mut pos = Vec::new();
    for (s, &len) in seq_lens.iter().enumerate() {
        for p in [len - 1, len / 2, len / 3] {
            seq.push(s as i32);
            pos.push(p as i32);
        }
    }
    let q = randn(rng, seq.len() * heads * hd, 1.0);
    let scale = 1.0 / (hd as f32).sqrt();
    let out = gpu.alloc::<f32>(q.len())?;
    let (qb, tb, sb, pb) = (
        gpu.upload(&q)?,
        gpu.upload(&tables)?,
        gpu.upload(&seq)?,
        gpu.upload(&pos)?,
    );
    let args = [
        qb.arg(),
        kp.arg(),
        vp.arg(),
        tb.arg(),
        sb.arg(),
        pb.arg(),
        out.arg(),
        Arg::I32(heads as i32),
        Arg::I32(kvh as i32),
        Arg::I32(hd as i32),
        Arg::I32(num_blocks as i32),
        Arg::I32(bs as i32),
        Arg::I32(max_blocks as i32),
        Arg::I32(window as i32),
        Arg::F32(scale),
        Arg::F32(softcap),
    ];
    let warps = BLOCK.0 / 32;
    gpu.launch(
        "attention_paged_f16",
        grid(seq.len() * heads),
        BLOCK,
        warps * hd as u32 * 4,
        &args,
    )?;
    let mut cpu = Vec::with_capacity(q.len());
    for (t, (&s, &p)) in seq.iter().zip(&pos).enumerate() {
        let p = p as usize;
        let lo = if window > 0 {
            (p + 1).saturating_sub(window)
        } else {
            0
        };
        for h in 0..heads {
            let kv = h / (heads / kvh);
            let qh = &q[(t * heads + h) * hd..][..hd];
            let row = |j: usize| {
                let blk = tables[s as usize * max_blocks + j / bs] as usize;
                ((kv * num_blocks + blk) * bs + j % bs) * hd
            };
            let scores: Vec<f64> = (lo..=p)
                .map(|j| {
                    let r = row(j);
                    let dot: f64 = (0..hd)
                        .map(|d| f64::from(qh[d] * scale) * f64::from(k_host[r + d]))
                        .sum();
                    if softcap > 0.0 {
                        f64::from(softcap) * (dot / f64::from(softcap)).tanh()
                    } else {
                        dot
                    }
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let total: f64 = w.iter().sum();
            for d in 0..hd {
                let o: f64 = (lo..=p)
                    .zip(&w)
                    .map(|(j, w)| w * f64::from(v_host[row(j) + d]))
                    .sum();
                cpu.push(o / total);
            }
        }
    }
    let name =
        format!("kv_write_f16 + attention_paged_f16 (hd {hd}, window {window}, softcap {softcap})");
    Ok(result(name, &out.read()?, &cpu, 2e-5))
}

fn check_linear(ops: &CudaOps, rng: &mut ChaCha8Rng) -> Result<Vec<CheckResult>, CudaError> {
    let gpu = ops.gpu();
    let (rows, in_dim, out_dim) = (13, 576, 1536);
    let x = randn(rng, rows * in_dim, 1.0);
    let w = randn(rng, out_dim * in_dim, 0.1);
    let (xb, wb, yb) = (
        gpu.upload(&x)?,
        gpu.upload(&w)?,
        gpu.alloc::<f32>(rows * out_dim)?,
    );
    let mut yb = yb;
    ops.linear(&xb, &wb, &mut yb, rows, in_dim, out_dim)?;
    let mut cpu = Vec::with_capacity(rows * out_dim);
    for r in 0..rows {
        for o in 0..out_dim {
            let s: f64 = (0..in_dim)
                .map(|i| f64::from(x[r * in_dim + i]) * f64::from(w[o * in_dim + i]))
                .sum();
            cpu.push(s);
        }
    }
    let kernel = result("linear_f32 (13×576 · 1536×576ᵀ)", &yb.read()?, &cpu, 1e-4);
    let reference = gpu.alloc::<f32>(rows * out_dim)?;
    ops.cublas_linear(&xb, &wb, &reference, rows, in_dim, out_dim)?;
    let cublas = result(
        "cublasSgemm (13×576 · 1536×576ᵀ)",
        &reference.read()?,
        &cpu,
        1e-4,
    );
    Ok(vec![kernel, cublas])
}

/// The activation rounding kernels against [`HostOps`]' definitions: rows with outliers, a
/// zero block and blocks whose largest magnitude is negative (Q8_K keeps its sign).
fn check_rounding(ops: &CudaOps, rng: &mut ChaCha8Rng) -> Result<Vec<CheckResult>, CudaError> {
    let (rows, dim) = (5, 1536);
    let mut x = randn(rng, rows * dim, 3.0);
    for (i, v) in x.iter_mut().enumerate() {
        if i % 211 == 0 {
            *v *= -40.0;
        }
    }
    x[256..512].fill(0.0);
    let host = HostOps;
    let xd = ops.upload(&x)?;
    let mut out = Vec::new();
    for (kind, name) in [
        (ActRound::Q8Blocks32, "round_q8_32_f32"),
        (ActRound::Q8K, "round_q8k_f32"),
    ] {
        let mut want = host.alloc::<f32>(x.len())?;
        host.round_activations(&x, &mut want, rows, dim, kind)?;
        let mut got = ops.alloc::<f32>(x.len())?;
        ops.round_activations(&xd, &mut got, rows, dim, kind)?;
        let want: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
        out.push(result(name, &got.read()?, &want, 0.0));
    }
    let mut want = host.alloc::<f32>(x.len() / 32)?;
    host.q8_sum_correction(&x, &mut want, rows, dim)?;
    let mut got = ops.alloc::<f32>(x.len() / 32)?;
    ops.q8_sum_correction(&xd, &mut got, rows, dim)?;
    let want: Vec<f64> = want.iter().map(|&v| f64::from(v)).collect();
    out.push(result("q8_sum_correction_f32", &got.read()?, &want, 0.0));
    Ok(out)
}

/// A row's linear product alone and inside batches of other sizes, at other tile positions:
/// the same bits (the kernel's order of operations depends on the row only).
fn check_linear_batch_invariance(
    ops: &CudaOps,
    rng: &mut ChaCha8Rng,
) -> Result<CheckResult, CudaError> {
    let (in_dim, out_dim) = (576, 1536);
    let w = ops.upload(&randn(rng, out_dim * in_dim, 0.1))?;
    let row = randn(rng, in_dim, 1.0);
    let mut alone = ops.alloc::<f32>(out_dim)?;
    ops.linear(&ops.upload(&row)?, &w, &mut alone, 1, in_dim, out_dim)?;
    let alone = alone.read()?;
    let mut same = true;
    for (rows, at) in [(37usize, 5usize), (130, 100), (512, 511)] {
        let mut x = randn(rng, rows * in_dim, 1.0);
        x[at * in_dim..(at + 1) * in_dim].copy_from_slice(&row);
        let mut y = ops.alloc::<f32>(rows * out_dim)?;
        ops.linear(&ops.upload(&x)?, &w, &mut y, rows, in_dim, out_dim)?;
        let got = ops.read_range(&y, at * out_dim, out_dim)?;
        same &= got
            .iter()
            .zip(&alone)
            .all(|(a, b)| a.to_bits() == b.to_bits());
    }
    Ok(CheckResult {
        name: "linear_f32 batch invariance (1 row vs 37/130/512)".into(),
        max_abs_err: if same { 0.0 } else { f64::INFINITY },
        tolerance: 0.0,
        passed: same,
    })
}
