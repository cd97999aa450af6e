//! `agentkv bench-model --roofline`: the compute bound of the measured steps. The vector units'
//! peak rates with the forward pass's threads (`kernels::peak`: f32 fused multiply-adds, 8-bit
//! integer dot products and bf16 pair dot products, in registers) and the operations a step must
//! perform (`model::StepOps`: the weight matrices as integer dot products on the quantized
//! weights, attention's QKᵀ and P·V in f32 — or, over bf16 K/V on a CPU with AVX-512 BF16, in
//! bf16 pairs), so `time ≥ 2·matmul MACs / int8 rate + 2·attention MACs / attention's rate`,
//! beside the measured rate. Glue and the printed report only.

use kernels::peak::{measure_peak, Peak, PeakOp};
use model::{Model, StepOps, ThreadPool};

/// Passes of each peak measurement (the best counts).
const PEAK_PASSES: usize = 10;

/// One step kind's bound.
struct Bound {
    ops: StepOps,
    tokens: usize,
    /// Tokens per second the peaks allow.
    tok_s: f64,
}

fn bound(ops: StepOps, tokens: usize, int8: &Peak, attention: &Peak) -> Bound {
    let seconds = 2.0 * ops.matmul_macs as f64 / int8.best()
        + 2.0 * ops.attention_macs as f64 / attention.best();
    Bound {
        ops,
        tokens,
        tok_s: tokens as f64 / seconds,
    }
}

/// Measures the peaks and returns the JSON of the bounds of a prefill of `prompt_tokens` after
/// `depth` cached ones and of decoding `gen_tokens` from `depth` with K/V in `codecs`, beside
/// the measured rates; prints them. `None` (and a line saying why) where the CPU has no vector
/// path to time.
pub fn roofline(
    model: &Model,
    pool: &ThreadPool,
    codecs: model::KvDtype,
    (prompt_tokens, gen_tokens, depth): (usize, usize, usize),
    (prefill_tok_s, decode_tok_s): (f64, f64),
) -> Option<serde_json::Value> {
    let (Some(f32), Some(int8)) = (
        measure_peak(pool, PeakOp::F32Fma, PEAK_PASSES),
        measure_peak(pool, PeakOp::Int8Dot, PEAK_PASSES),
    ) else {
        eprintln!("roofline: this CPU has no f32 FMA or 8-bit dot-product vector path to time");
        return None;
    };
    // bf16 K/V are attended in bf16 pairs where the CPU has the instruction
    // (`kernels::flash_tile_pairs`); everything else in f32.
    let pairs = (!model::arith_tag(codecs, model.config().head_dim).is_empty())
        .then(|| measure_peak(pool, PeakOp::Bf16Dot, PEAK_PASSES))
        .flatten();
    let attention = pairs.as_ref().unwrap_or(&f32);
    let prefill = bound(
        StepOps::of(model, prompt_tokens, depth, 1),
        prompt_tokens,
        &int8,
        attention,
    );
    let decode = bound(
        StepOps::of(model, 1, depth + gen_tokens / 2, 1),
        1,
        &int8,
        attention,
    );
    if let Some(p) = &pairs {
        eprintln!(
            "attention over {codecs} K/V: bf16 pair dot {:.1} GFLOP/s ({}-bit)",
            p.best() / 1e9,
            p.width_bits
        );
    }
    eprintln!(
        "peaks ({} threads): f32 FMA {:.1} GFLOP/s ({}-bit), 8-bit dot {:.1} GOP/s ({}-bit)",
        f32.threads,
        f32.best() / 1e9,
        f32.width_bits,
        int8.best() / 1e9,
        int8.width_bits
    );
    let step_json = |name: &str, b: &Bound, measured: f64| {
        eprintln!(
            "{name}: {:.2} G integer ops + {:.2} GFLOP attention for {} token(s): compute bound {:.1} tok/s, measured {:.1} tok/s = {:.0}% of it",
            2.0 * b.ops.matmul_macs as f64 / 1e9,
            2.0 * b.ops.attention_macs as f64 / 1e9,
            b.tokens,
            b.tok_s,
            measured,
            100.0 * measured / b.tok_s
        );
        serde_json::json!({
            "matmul_macs": b.ops.matmul_macs, "attention_macs": b.ops.attention_macs,
            "tokens": b.tokens, "bound_tok_s": b.tok_s, "measured_tok_s": measured,
            "share_of_bound": measured / b.tok_s,
        })
    };
    Some(serde_json::json!({
        "attention_peak": if pairs.is_some() { "bf16_dot" } else { "f32_fma" },
        "bf16_dot_flop_s": pairs.as_ref().map(|p| p.best()),
        "f32_fma_flop_s": f32.best(), "f32_width_bits": f32.width_bits, "f32_passes": f32.passes,
        "int8_dot_op_s": int8.best(), "int8_width_bits": int8.width_bits, "int8_passes": int8.passes,
        "prefill": step_json("prefill", &prefill, prefill_tok_s),
        "decode": step_json("decode (per token, mean depth)", &decode, decode_tok_s),
    }))
}
