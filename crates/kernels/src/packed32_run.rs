//! The packed matmul's dispatch: which kernel computes a range of groups, given the definition
//! ([`PackedDef`]), the CPU's features and the number of tokens — the one place that knows every
//! packed kernel (`packed32_x86`, `packed32_blocksum`, `packed32_prefill`,
//! `packed32_prefill_avx2`, the portable `group_scalar`). Owns no arithmetic and no layout
//! (`packed32.rs`).

use std::ops::Range;

use super::act_quant::ActQ8;
use super::cpu::CpuFeatures;
use super::out_ptr::OutPtr;
use super::packed32::{assert_shapes, group_scalar, Packed32, PackedDef, GROUP_ROWS, TILE_TOKENS};
#[cfg(target_arch = "x86_64")]
use super::packed32::{Q4_0, Q4_1, Q5_0, Q8_0};
use super::packed32_blocksum::token_scalar;
#[cfg(target_arch = "x86_64")]
use super::packed32_blocksum::{
    few_tokens512_any, few_tokens_avx2_any, one_token, one_token512, passes_of,
    FEW_TOKENS_AVX2_MAX, FEW_TOKENS_AVX2_PASSES_MAX, FEW_TOKENS_MAX, FEW_TOKENS_PASSES_MAX,
};
use gguf::GgmlType;

/// Computes groups `groups` for every token of `act` into `out` (`[num_tokens, num_rows]`) in
/// the definition `def`.
pub(super) fn run_groups(
    p: &Packed32,
    features: CpuFeatures,
    def: PackedDef,
    act: &ActQ8,
    groups: std::ops::Range<usize>,
    out: &OutPtr,
) {
    #[cfg(target_arch = "x86_64")]
    if act.num_tokens <= TILE_TOKENS && groups.start < p.num_groups() {
        // A decode chunk's first bytes, before the kernel's own look-ahead covers the stream (a
        // chunk claimed from the back end starts cold).
        super::packed32_x86::prefetch_first(p, groups.start);
    }
    if def == PackedDef::BlockSum {
        run_groups_blocksum(p, features, act, groups, out);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::packed32_prefill::run_groups(p, features, def, act, groups.clone(), out)
        || super::packed32_prefill_avx2::run_groups(p, features, act, groups.clone(), out)
    {
        return;
    }
    let n = p.num_rows();
    let num_tokens = act.num_tokens;
    #[cfg(target_arch = "x86_64")]
    if num_tokens == 1 && !groups.is_empty() {
        // A decode: the whole range in one call (features and shapes checked once), the rows of
        // the range written in place.
        let rows = groups.start * GROUP_ROWS..(groups.end * GROUP_ROWS).min(n);
        // SAFETY: for one token the rows of `groups` are outputs `rows`, which only this task
        // writes (tasks own disjoint group ranges).
        let o = unsafe { out.slice_mut(rows) };
        if super::packed32_x86::groups_one_token(p, features, groups.clone(), act, o) {
            return;
        }
    }
    let mut tile = [[0f32; 16]; TILE_TOKENS];
    for g in groups {
        let rows = (n - g * GROUP_ROWS).min(GROUP_ROWS);
        let mut t = 0;
        while t < num_tokens {
            let tt = (num_tokens - t).min(TILE_TOKENS);
            let o = &mut tile[..tt];
            #[cfg(target_arch = "x86_64")]
            let done = super::packed32_x86::group(p, features, g, act, t, o);
            #[cfg(not(target_arch = "x86_64"))]
            let done = false;
            if !done {
                group_scalar(p, g, act, t, o);
            }
            for (dt, row) in o.iter().enumerate() {
                for (lane, v) in row.iter().take(rows).enumerate() {
                    out.write((t + dt) * n + g * GROUP_ROWS + lane, *v);
                }
            }
            t += tt;
        }
    }
    let _ = features;
}

/// Computes groups `groups` of `p` for every token of `act` into `out` (`[num_tokens,
/// num_rows]`) in the `BlockSum` definition, on the best path `features` allows.
pub(super) fn run_groups_blocksum(
    p: &Packed32,
    features: CpuFeatures,
    act: &ActQ8,
    groups: Range<usize>,
    out: &OutPtr,
) {
    assert_shapes(p, act, &groups);
    let n = p.num_rows();
    #[cfg(target_arch = "x86_64")]
    if features.clamp_to_detected().avx2 && !groups.is_empty() {
        let f = features.clamp_to_detected();
        if act.num_tokens == 1 {
            let rows = groups.start * GROUP_ROWS..(groups.end * GROUP_ROWS).min(n);
            // SAFETY: for one token the rows of `groups` are outputs `rows`, which only this task
            // writes (tasks own disjoint group ranges).
            let o = unsafe { out.slice_mut(rows) };
            if f.avx512 && f.vnni {
                // SAFETY: AVX-512 F+VL+VNNI on top of AVX2+FMA+F16C were detected; the shapes
                // were checked above and the output is exactly the groups' rows.
                unsafe {
                    match p.ty() {
                        GgmlType::Q4_0 => one_token512::<Q4_0>(p, groups, act, o),
                        GgmlType::Q4_1 => one_token512::<Q4_1>(p, groups, act, o),
                        GgmlType::Q5_0 => one_token512::<Q5_0>(p, groups, act, o),
                        _ => one_token512::<Q8_0>(p, groups, act, o),
                    }
                }
                return;
            }
            // SAFETY: AVX2+FMA+F16C were detected; the shapes were checked above and the
            // output is exactly the groups' rows.
            unsafe {
                match p.ty() {
                    GgmlType::Q4_0 => one_token::<Q4_0>(p, groups, act, o),
                    GgmlType::Q4_1 => one_token::<Q4_1>(p, groups, act, o),
                    GgmlType::Q5_0 => one_token::<Q5_0>(p, groups, act, o),
                    _ => one_token::<Q8_0>(p, groups, act, o),
                }
            }
        } else if f.avx512 && f.vnni && act.num_tokens <= FEW_TOKENS_PASSES_MAX {
            for pass in passes_of(act.num_tokens, FEW_TOKENS_MAX) {
                let g = groups.clone();
                // SAFETY: AVX-512 F+VL+VNNI and AVX2+FMA+F16C detected (`clamp_to_detected`);
                // the shapes were checked (`assert_shapes`); each pass is 2 to
                // `FEW_TOKENS_MAX` tokens inside the call's; this task owns its groups' rows of
                // every token's output.
                unsafe {
                    match p.ty() {
                        GgmlType::Q4_0 => few_tokens512_any::<Q4_0>(p, g, act, pass, out),
                        GgmlType::Q4_1 => few_tokens512_any::<Q4_1>(p, g, act, pass, out),
                        GgmlType::Q5_0 => few_tokens512_any::<Q5_0>(p, g, act, pass, out),
                        _ => few_tokens512_any::<Q8_0>(p, g, act, pass, out),
                    }
                }
            }
        } else if act.num_tokens <= FEW_TOKENS_AVX2_PASSES_MAX {
            // (Without AVX-512 VNNI: the branch above took every such count.)
            for pass in passes_of(act.num_tokens, FEW_TOKENS_AVX2_MAX) {
                let g = groups.clone();
                // SAFETY: AVX2+FMA+F16C detected (`clamp_to_detected`); the shapes were checked
                // (`assert_shapes`); each pass is 2 to `FEW_TOKENS_AVX2_MAX` tokens inside the
                // call's; this task owns its groups' rows of every token's output.
                unsafe {
                    match p.ty() {
                        GgmlType::Q4_0 => few_tokens_avx2_any::<Q4_0>(p, g, act, pass, out),
                        GgmlType::Q4_1 => few_tokens_avx2_any::<Q4_1>(p, g, act, pass, out),
                        GgmlType::Q5_0 => few_tokens_avx2_any::<Q5_0>(p, g, act, pass, out),
                        _ => few_tokens_avx2_any::<Q8_0>(p, g, act, pass, out),
                    }
                }
            }
        } else if !super::packed32_prefill::run_groups(
            p,
            features,
            PackedDef::BlockSum,
            act,
            groups.clone(),
            out,
        ) {
            super::packed32_prefill_avx2::run_groups_blocksum(p, act, groups, out);
        }
        return;
    }
    let _ = features;
    for g in groups {
        let rows = (n - g * GROUP_ROWS).min(GROUP_ROWS);
        for t in 0..act.num_tokens {
            let y = token_scalar(p, g, act, t);
            for (lane, v) in y.iter().take(rows).enumerate() {
                out.write(t * n + g * GROUP_ROWS + lane, *v);
            }
        }
    }
}
