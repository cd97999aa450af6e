//! Where the engine's per-token logprobs part from llama.cpp's on the held-out prompts
//! (`tests/data/heldout_greedy.jsonl`): greedy generation through the model API with the
//! attention arithmetic chosen per step by a rule, and a layer-by-layer comparison of the K/V
//! two rules write for one prompt.
//!
//! `cargo run --release -p model --example fidelity_probe -- RULE [EVERY] [ID…]` with RULE:
//! - `row`: every step in the per-row arithmetic (what the engine does);
//! - `llama`: prompt steps of 64+ tokens in llama.cpp's tiled prefill arithmetic, decode per-row
//!   (what llama-server does; the model API's `llama_cpp_prefill`);
//! - `prefill-all`: every step, decode included, in the tiled prefill arithmetic;
//! - `layers`: for each given ID, K/V after the prompt under `row` vs `llama`, per layer.
//!
//! Prints per-prompt mean |Δ logprob| against llama.cpp's reference (positions compared while the
//! tokens agree) and the overall mean; `EVERY` = 3 takes the server test's subset.

use model::kv::KvChunk;
use model::sampler::{Sampler, SamplingParams};
use model::ContiguousKv;
use model::{AttnArith, ForwardBatch, MatmulArith, Scratch};
use model::{KvDtype, KvStore, Model, SeqSlot, ThreadPool};
use model::{Numerics, RowKind};

#[derive(serde::Deserialize)]
struct Reference {
    id: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    top_logprobs: Vec<Position>,
    stable_len: usize,
}

#[derive(serde::Deserialize)]
struct Position {
    logprob: Option<f32>,
}

#[derive(Clone, Copy, PartialEq)]
enum Rule {
    Row,
    Llama,
    PrefillAll,
}

impl Rule {
    fn prompt_arith(self, len: usize) -> AttnArith {
        match self {
            Rule::Row => AttnArith::Row,
            Rule::Llama => AttnArith::for_step(len),
            Rule::PrefillAll => AttnArith::Prefill,
        }
    }
    fn decode_arith(self) -> AttnArith {
        match self {
            Rule::PrefillAll => AttnArith::Prefill,
            _ => AttnArith::Row,
        }
    }
}

fn step(
    m: &Model,
    pool: &ThreadPool,
    kv: &mut dyn KvStore,
    scratch: &mut Scratch,
    tokens: &[u32],
    start: usize,
    arith: AttnArith,
) -> Vec<f32> {
    let positions: Vec<u32> = (start..start + tokens.len()).map(|p| p as u32).collect();
    let slots = vec![SeqSlot(0); tokens.len()];
    let batch = ForwardBatch {
        tokens,
        positions: &positions,
        slots: &slots,
        logits_for: &[tokens.len() - 1],
        // Only Q4_K matrices differ between the two matmul orders (the default model has none).
        numerics: Numerics::Explicit {
            attention: arith,
            matmul: MatmulArith::Invariant,
        },
        rows: &RowKind::by_step(&slots),
    };
    m.forward(pool, &batch, kv, scratch).expect("forward")
}

/// Greedy generation of `n` tokens; returns (id, logprob) per token.
fn run(m: &Model, pool: &ThreadPool, r: &Reference, rule: Rule) -> Vec<(u32, f32)> {
    let n = r.greedy_ids.len();
    let mut kv = m
        .contiguous_kv(1, r.prompt_ids.len() + n, KvDtype::F16)
        .expect("kv");
    let mut scratch = Scratch::default();
    let mut logits = Vec::new();
    for (c, piece) in r.prompt_ids.chunks(512).enumerate() {
        logits = step(
            m,
            pool,
            &mut kv,
            &mut scratch,
            piece,
            c * 512,
            rule.prompt_arith(piece.len()),
        );
    }
    let mut sampler = Sampler::new(SamplingParams {
        logprobs: true,
        ..Default::default()
    });
    let mut out = Vec::new();
    let mut pos = r.prompt_ids.len();
    while out.len() < n {
        let t = sampler
            .sample(&logits, &r.prompt_ids)
            .expect("an unconstrained sampler always samples");
        sampler.observe(t.id);
        out.push((t.id, t.logprob));
        if out.len() == n {
            break;
        }
        logits = step(
            m,
            pool,
            &mut kv,
            &mut scratch,
            &[t.id],
            pos,
            rule.decode_arith(),
        );
        pos += 1;
    }
    out
}

fn prefill_kv(m: &Model, pool: &ThreadPool, r: &Reference, rule: Rule) -> ContiguousKv {
    let mut kv = m
        .contiguous_kv(1, r.prompt_ids.len(), KvDtype::F16)
        .expect("kv");
    let mut scratch = Scratch::default();
    for (c, piece) in r.prompt_ids.chunks(512).enumerate() {
        step(
            m,
            pool,
            &mut kv,
            &mut scratch,
            piece,
            c * 512,
            rule.prompt_arith(piece.len()),
        );
    }
    kv
}

fn read(kv: &dyn KvStore, layer: usize, head: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut k, mut v) = (Vec::new(), Vec::new());
    kv.for_each_chunk(layer, SeqSlot(0), head, n, &mut |_, c| match c {
        KvChunk::F16 { k: ck, v: cv } => {
            k.extend(ck.iter().map(|x| x.to_f32()));
            v.extend(cv.iter().map(|x| x.to_f32()));
        }
        _ => unreachable!("f16 cache"),
    });
    (k, v)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rule = args.first().map(String::as_str).unwrap_or("row");
    let every: usize = args.get(1).map_or(1, |s| s.parse().expect("EVERY"));
    let ids: Vec<&str> = args.iter().skip(2).map(String::as_str).collect();
    let m = Model::load(&model::default_model_path()).expect("model");
    let pool = ThreadPool::new(2);
    let refs: Vec<Reference> = include_str!("../tests/data/heldout_greedy.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("reference"))
        .collect();
    let picked: Vec<&Reference> = refs
        .iter()
        .step_by(every)
        .filter(|r| ids.is_empty() || ids.contains(&r.id.as_str()))
        .collect();
    if rule == "layers" {
        let c = m.config();
        for r in picked {
            let n = r.prompt_ids.len();
            let a = prefill_kv(&m, &pool, r, Rule::Row);
            let b = prefill_kv(&m, &pool, r, Rule::Llama);
            println!(
                "{} ({n} prompt tokens): max |ΔK|, max |ΔV| (rel. to max |K|, |V|), mean |ΔV|",
                r.id
            );
            for l in 0..c.num_layers {
                let (mut dk, mut dv, mut mk, mut mv, mut sv) = (0f32, 0f32, 0f32, 0f32, 0f64);
                let mut cnt = 0usize;
                for h in 0..c.num_kv_heads {
                    let (ka, va) = read(&a, l, h, n);
                    let (kb, vb) = read(&b, l, h, n);
                    for (x, y) in ka.iter().zip(&kb) {
                        dk = dk.max((x - y).abs());
                        mk = mk.max(x.abs());
                    }
                    for (x, y) in va.iter().zip(&vb) {
                        dv = dv.max((x - y).abs());
                        mv = mv.max(x.abs());
                        sv += f64::from((x - y).abs());
                        cnt += 1;
                    }
                }
                println!(
                    "  layer {l:>2}: ΔK {dk:.5} ({:.2e})  ΔV {dv:.5} ({:.2e})  mean|ΔV| {:.2e}",
                    dk / mk.max(1e-9),
                    dv / mv.max(1e-9),
                    sv / cnt.max(1) as f64
                );
            }
            // Logits of the last prompt row.
            let la = {
                let mut kv = m.contiguous_kv(1, n, KvDtype::F16).expect("kv");
                let mut s = Scratch::default();
                let mut l = Vec::new();
                for (ci, piece) in r.prompt_ids.chunks(512).enumerate() {
                    l = step(&m, &pool, &mut kv, &mut s, piece, ci * 512, AttnArith::Row);
                }
                l
            };
            let lb = {
                let mut kv = m.contiguous_kv(1, n, KvDtype::F16).expect("kv");
                let mut s = Scratch::default();
                let mut l = Vec::new();
                for (ci, piece) in r.prompt_ids.chunks(512).enumerate() {
                    let ar = AttnArith::for_step(piece.len());
                    l = step(&m, &pool, &mut kv, &mut s, piece, ci * 512, ar);
                }
                l
            };
            let d = la
                .iter()
                .zip(&lb)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            println!("  last prompt row: max |Δ logit| {d:.5}");
        }
        return;
    }
    let rule = match rule {
        "row" => Rule::Row,
        "llama" => Rule::Llama,
        "prefill-all" => Rule::PrefillAll,
        other => panic!("unknown rule {other}"),
    };
    let (mut total, mut count, mut equal) = (0f64, 0usize, 0usize);
    for r in &picked {
        let out = run(&m, &pool, r, rule);
        let (mut err, mut k) = (0f64, 0usize);
        for (j, ((id, lp), want)) in out.iter().zip(&r.top_logprobs).enumerate() {
            if let Some(w) = want.logprob {
                err += f64::from((lp - w).abs());
                k += 1;
            }
            if *id != r.greedy_ids[j] {
                break;
            }
        }
        let stable = out
            .iter()
            .zip(&r.greedy_ids)
            .take(r.stable_len)
            .all(|(a, b)| a.0 == *b);
        equal += usize::from(stable);
        total += err;
        count += k;
        println!(
            "{:<12} prompt {:>4}  stable {:>2} {}  mean |Δ logprob| {:.5} over {k}",
            r.id,
            r.prompt_ids.len(),
            r.stable_len,
            if stable { "eq " } else { "DIF" },
            err / k.max(1) as f64
        );
    }
    println!(
        "overall: stable equal {equal}/{}; mean |Δ logprob| {:.5} over {count}",
        picked.len(),
        total / count.max(1) as f64
    );
}
